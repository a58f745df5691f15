"""SLO evaluation and remediation on the real binary and model (docs/slo.md).

An overload of long low-priority prompts pushes the high tier's TTFT over
its SLO. In dry-run mode the report says what remediation would do and
nothing is refused; with remediation on, the low tier is shed (503 with
Retry-After, OpenAI error shape) and the high tier's SLO is met again within
the reaction time; once the load ends the shedding is undone. Adaptive
batching holds an ITL target within 20% while the load doubles, where the
fixed budget misses it. The SLO target is calibrated on this machine from
the unloaded and loaded TTFT (the test asserts the overload really breaches
it), then applied through a live reload."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from ingot_e2e import assert_error, wait_for
from slo_load import Prober, low_overload, median, prefill_load, probe, quantile, streamers

REACTION_S = 10.0  # the configured reaction time the SLO must be met within
WINDOW = "3s"


def write_config(path: Path, target_ms: float, mode: str, extra: str = "") -> None:
    path.write_text(f"""
[[slo]]
name = "high_ttft"
tier = "high"
metric = "ttft"
quantile = 0.9
target = "{target_ms:.0f}ms"
window = "{WINDOW}"
min_samples = 3

[remediation]
mode = "{mode}"
interval = "250ms"

[remediation.shed]
how = "shed"
tiers = ["background", "low"]
exit_after = "6s"
cooldown = "1s"
retry_after = "1s"
{extra}
""")


def reload(http: httpx.Client) -> None:
    r = http.post("/admin/reload")
    assert r.status_code == 200, r.text
    assert not r.json().get("needs_restart"), r.text


def report(http: httpx.Client) -> dict:
    r = http.get("/admin/slo")
    assert r.status_code == 200, r.text
    return r.json()


def compliance(http: httpx.Client) -> float | None:
    """1 met, 0 breached, None while the window has too few samples to judge."""
    for s in report(http)["slos"]:
        if s["slo"] == "high_ttft" and s["samples"] >= 3:
            return 1.0 if s["met"] else 0.0
    return None


def test_overload_is_shed_and_high_ttft_recovers(server_factory, model_name, tmp_path):
    cfg = tmp_path / "slo.toml"
    write_config(cfg, 10_000, "off")
    srv = server_factory("--config", str(cfg))
    http = srv.http()
    base = quantile(probe(srv.url, 2.0), 0.9)
    with low_overload(srv.url, clients=6) as low, Prober(srv.url) as prober:
        time.sleep(2.0)
        t_loaded = time.monotonic()
        time.sleep(3.0)
        loaded = quantile(prober.since(t_loaded), 0.9)
        assert loaded > 3 * base, f"the overload must push high TTFT up: {base=:.3f} {loaded=:.3f}"
        target = (base * loaded) ** 0.5 * 1e3
        # Dry run: decided and reported, nothing refused.
        write_config(cfg, target, "dry_run")
        t_dry = time.monotonic()
        reload(http)
        events = wait_for(lambda: [e for e in report(http)["events"] if e["action"] == "shed"], 10, 0.25,
                          what="a dry-run shed decision")
        assert events[0]["applied"] is False and events[0]["direction"] == "apply", events
        rep = report(http)
        assert rep["mode"] == "dry_run"
        assert rep["remediation"][model_name]["shed"]["tiers"][:1] == ["background"], rep
        assert rep["remediation"][model_name]["shed"]["refused"] == [], rep
        assert compliance(http) == 0.0, "nothing acted: the SLO stays breached"
        assert 503 not in low.codes_since(t_dry), "dry run refuses nothing"
        m = srv.metrics()
        assert m.get("ingot_remediation_actions_total", action="shed", direction="apply", mode="dry_run") >= 1
        assert m.get("ingot_slo_compliance", slo="high_ttft", tier="high") == 0
        # On: the low tier is shed and the SLO is met again in time.
        write_config(cfg, target, "on")
        t_on = time.monotonic()
        reload(http)
        try:
            wait_for(lambda: compliance(http) == 1.0, REACTION_S, 0.25, what="the high-tier SLO met again")
        except AssertionError as e:
            recent = [round(v, 3) for v in prober.since(t_on)]
            raise AssertionError(f"{e}; {target=:.0f} ms; TTFTs since on: {recent}; {report(http)}") from None
        reacted = time.monotonic() - t_on
        # The low tier was covered on the way (its requests in flight held,
        # new ones refused). Right now it may already be released again on
        # a loaded machine (the SLO held for exit_after), so a direct
        # request is checked only while "low" is still refused.
        events = report(http)["events"]
        shed_low = [e for e in events if e["applied"] and e["action"] == "shed" and e["direction"] == "apply"
                    and "low" in e["detail"]]
        assert shed_low, events
        if "low" in report(http)["remediation"][model_name]["shed"]["refused"]:
            r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "priority": "low"})
            assert_error(r, 503, "service_unavailable", code="slo_shed", message_contains=("low",))
            assert r.headers["retry-after"] == "1"
        t_after = time.monotonic()
        time.sleep(3.0)
        after = prober.since(t_after)
    assert quantile(after, 0.9) <= target / 1e3, f"high p90 {quantile(after, 0.9):.3f} s over {target:.0f} ms"
    # The held low requests finished once released: none failed.
    assert all(c in (200, 503) for c in low.codes_since(0)), low.errors[:2]
    rep = report(http)
    applied = [e for e in rep["events"] if e["applied"] and e["direction"] == "apply"]
    assert applied and applied[0]["action"] == "shed", rep["events"]
    # Load gone: the SLO holds, the shedding is undone one level at a time.
    wait_for(lambda: report(http)["remediation"][model_name]["shed"]["level"] == 0, 30, 0.25,
             what="shedding undone")
    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "priority": "low"})
    assert r.status_code == 200, r.text
    m = srv.metrics()
    assert m.get("ingot_remediation_actions_total", action="shed", direction="undo", mode="on") >= 1
    assert m.get("ingot_remediation_active", action="shed") == 0
    print(f"base p90 {base*1e3:.0f} ms, loaded p90 {loaded*1e3:.0f} ms, target {target:.0f} ms, "
          f"met again after {reacted:.1f} s, after p90 {quantile(after, 0.9)*1e3:.0f} ms")


def test_shed_answer_is_an_openai_error(server_factory, model_name, tmp_path):
    """A shed request: 503, Retry-After, the OpenAI error object."""
    cfg = tmp_path / "slo.toml"
    # A target nothing on this machine meets: the first judged window sheds.
    write_config(cfg, 1, "on")
    srv = server_factory("--config", str(cfg))
    http = srv.http()
    for _ in range(4):
        http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "priority": "high"})
    wait_for(lambda: report(http)["remediation"].get(model_name, {}).get("shed", {}).get("level", 0) >= 1,
             10, 0.1, what="shedding")
    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "priority": "background"})
    assert_error(r, 503, "service_unavailable", code="slo_shed", message_contains=("background",))
    assert r.headers["retry-after"] == "1"
    r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "priority": "high"})
    assert r.status_code == 200, "the urgent tier is never shed"


@pytest.mark.skip(reason="load shape not yet valid on the CPU: closed-loop long-prompt clients already fill "
                  "every step at the lower load (median gap 0.78 s at both loads, 2026-11-27), so the fixed "
                  "budget does not miss; needs an open-loop (paced) prefill load. The controller is covered by "
                  "the unit tests in crates/server/src/slo/batching.rs and slo/tests.rs")
def test_adaptive_batching_holds_itl_while_load_doubles(server_factory, tmp_path):
    cfg = tmp_path / "batch.toml"
    write_config(cfg, 10_000, "off")
    srv = server_factory("--config", str(cfg))
    http = srv.http()

    def itl(load: int, seconds: float = 6.0, settle: float = 3.0) -> float:
        """Median gap of two streams while `load` clients send long prompts."""
        with streamers(srv.url, 2) as s, prefill_load(srv.url, load):
            time.sleep(settle)
            t0 = time.monotonic()
            time.sleep(seconds)
            return median(s.gaps_since(t0))

    single = itl(2)
    double = itl(4)
    assert double > 1.2 * single, f"the fixed budget must miss: {single=:.4f} {double=:.4f}"
    target = single
    write_config(cfg, 10_000, "on", f"""
[remediation.batching]
enabled = true
target_itl = "{target*1e3:.1f}ms"
quantile = 0.5
window = "2s"
cooldown = "500ms"
min_tokens = 16
""")
    reload(http)
    steered = itl(4, seconds=6.0, settle=6.0)
    budget = report(http)["remediation"]
    assert abs(steered - target) <= 0.2 * target, (
        f"ITL {steered*1e3:.1f} ms vs target {target*1e3:.1f} ms (fixed: {double*1e3:.1f} ms); {budget}")
    print(f"ITL target {target*1e3:.1f} ms; fixed budget at 2x load {double*1e3:.1f} ms; "
          f"adaptive at 2x load {steered*1e3:.1f} ms; {budget}")
