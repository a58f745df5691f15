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
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from ingot_e2e import assert_error, wait_for
from slo_load import PREFILL_PROMPT, PacedPrefill, Prober, long_streams, low_overload, median, prefill_load, probe, quantile

REACTION_S = 10.0  # the reaction time allowed with the 3 s window (3 × the window when it is longer)
WINDOW = "3s"


def write_config(path: Path, target_ms: float, mode: str, extra: str = "", window: str = WINDOW) -> None:
    path.write_text(f"""
[[slo]]
name = "high_ttft"
tier = "high"
metric = "ttft"
quantile = 0.9
target = "{target_ms:.0f}ms"
window = "{window}"
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


def low_shed(http: httpx.Client) -> bool:
    """Whether remediation has applied a shed level that covers "low"."""
    return any(e["applied"] and e["action"] == "shed" and e["direction"] == "apply" and "low" in e["detail"]
               for e in report(http)["events"])


def compliance(http: httpx.Client) -> float | None:
    """1 met, 0 breached, None while the window has too few samples to judge."""
    for s in report(http)["slos"]:
        if s["slo"] == "high_ttft" and s["samples"] >= 3:
            return 1.0 if s["met"] else 0.0
    return None


# A timed test of SLO windows under sustained load (~75 s of a CI worker,
# ~100 CPU-s beside the rest): scripts/test-load runs it; CI keeps the shed
# answer's format (below).
@pytest.mark.load
def test_overload_is_shed_and_high_ttft_recovers(server_factory, model_name, tmp_path):
    cfg = tmp_path / "slo.toml"
    write_config(cfg, 10_000, "off")
    srv = server_factory("--config", str(cfg))
    http = srv.http()
    base = quantile(probe(srv.url, 2.0), 0.9)
    with low_overload(srv.url, clients=6) as low, Prober(srv.url) as prober:
        # Kept sleeps (they are the measurement): 2 s for the overload to
        # fill every step, then a 3 s window of loaded probes.
        time.sleep(2.0)
        t_loaded = time.monotonic()
        time.sleep(3.0)
        wait_for(lambda: len(prober.since(t_loaded)) >= 3, 60, 0.1, what="three loaded probes")
        # The target sits between the unloaded p90 and the loaded median: a
        # p90 of a few loaded probes can be one outlier, and a target near it
        # would let a lucky window pass while the overload still runs.
        loaded = median(prober.since(t_loaded))
        assert loaded > 3 * base, f"the overload must push high TTFT up: {base=:.3f} {loaded=:.3f}"
        target = (base * loaded) ** 0.5 * 1e3
        # The SLO window holds a few loaded probes even on a slow machine
        # (else nothing is judged); the reaction time allowed grows with it.
        window_s = max(3.0, 2 * loaded)
        window = f"{window_s*1e3:.0f}ms"
        reaction = max(REACTION_S, 3 * window_s)
        # Dry run: decided and reported, nothing refused.
        write_config(cfg, target, "dry_run", window=window)
        t_dry = time.monotonic()
        reload(http)
        events = wait_for(lambda: [e for e in report(http)["events"] if e["action"] == "shed"], reaction, 0.25,
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
        write_config(cfg, target, "on", window=window)
        t_on = time.monotonic()
        reload(http)
        # The SLO is met again once the low tier is covered (its requests in
        # flight held, new ones refused); a window judged met while only the
        # (idle) background tier is covered does not count.
        try:
            wait_for(lambda: low_shed(http) and compliance(http) == 1.0, reaction, 0.25,
                     what="the low tier shed and the high-tier SLO met again")
        except AssertionError as e:
            recent = [round(v, 3) for v in prober.since(t_on)]
            raise AssertionError(f"{e}; {target=:.0f} ms; TTFTs since on: {recent}; {report(http)}") from None
        reacted = time.monotonic() - t_on
        # Right now "low" may already be released again on a loaded machine
        # (the SLO held for exit_after), so a direct request is checked only
        # while it is still refused.
        if "low" in report(http)["remediation"][model_name]["shed"]["refused"]:
            r = http.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 2, "priority": "low"})
            assert_error(r, 503, "service_unavailable", code="slo_shed", message_contains=("low",))
            assert r.headers["retry-after"] == "1"
        t_after = time.monotonic()
        time.sleep(3.0)  # kept: the 3 s window whose probes must meet the target
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
    print(f"base p90 {base*1e3:.0f} ms, loaded median {loaded*1e3:.0f} ms, target {target:.0f} ms, "
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


STREAMS = 4  # measured streams: their decodes share every step with the prefill chunks
BUDGET = 64  # the configured step token budget: one paced prompt (~60 tokens) fills a step
RATE_SHARE = 0.65  # R as a share of the prefill rate the fixed budget sustains; 2R overloads it
TARGET_SHARE = 0.5  # the target: halfway from the decode-only gap to the fixed budget's at 2R


@dataclass
class BatchingRun:
    """One adaptive-batching experiment (the e2e test and scripts/bench-slo)."""

    decode_itl: float  # median gap, the streams alone
    full_itl: float  # median gap while prompts always wait (every step full)
    capacity: float  # prompts/s the fixed budget prefills with work always waiting
    rate: float  # R, prompts/s (paced)
    window: float  # seconds each phase is measured
    target: float  # the configured ITL target, seconds
    fixed_r: list[float]  # gaps at R, fixed budget
    fixed_2r: list[float]  # gaps at 2R, fixed budget
    adaptive_2r: list[float]  # gaps at 2R, the controller steering
    budgets: list[int]  # the step token budget in force while measuring adaptive_2r
    settled_after: float  # seconds from 2R starting until the budget stopped changing
    skipped: int  # paced arrivals over the in-flight cap (not sent)


def batching_config(target_s: float, window_s: float) -> str:
    """The controller on the streams' median gap; a decision needs three
    steps' gaps of the four streams, so the window spans several steps."""
    return f"""
[remediation.batching]
enabled = true
target_itl = "{target_s*1e3:.1f}ms"
quantile = 0.5
window = "{window_s*1e3:.0f}ms"
cooldown = "500ms"
min_samples = {3 * STREAMS}
"""


def gaps_for(streams, seconds: float) -> list[float]:
    """The streams' inter-token gaps over a window of `seconds` (a kept
    sleep: the window is the measurement)."""
    t0 = time.monotonic()
    time.sleep(seconds)
    return streams.gaps_since(t0)


def token_budget(http: httpx.Client, model: str) -> int | None:
    return report(http)["remediation"].get(model, {}).get("batching", {}).get("token_budget")


def wait_budget_settled(http: httpx.Client, model: str, quiet: float, limit: float) -> float:
    """Polls the budget in force until it has not changed for `quiet`
    seconds after a first cut under BUDGET, or `limit` passed; returns when
    it last changed (seconds from the start)."""
    t0 = last_change = time.monotonic()
    budget = BUDGET
    while time.monotonic() - t0 < limit:
        time.sleep(0.25)
        now = token_budget(http, model) or BUDGET  # None until the first evaluation
        if now != budget:
            budget, last_change = now, time.monotonic()
        if budget < BUDGET and time.monotonic() - last_change >= quiet:
            break
    return last_change - t0


def adaptive_batching_run(srv, cfg: Path, model: str, seconds: float) -> BatchingRun:
    """Calibrates on this machine (the streams' gap alone and with every step
    full; the prompt rate the fixed budget sustains), then measures the
    streams' inter-token gaps under a paced prefill load at 2R (raising R
    while its steps are not full) and R with the fixed budget, and at 2R
    with the controller steering. Phases last `seconds`, longer on a slow
    machine (enough full steps to judge)."""
    http = srv.http()
    write_config(cfg, 10_000, "off")
    reload(http)
    # The paced prompts' length (number 0 is never paced: no prefix-cache hit).
    r = http.post("/v1/completions", json={"prompt": f"[paced 0] {PREFILL_PROMPT}", "max_tokens": 1})
    assert r.status_code == 200, r.text
    prompt_tokens = r.json()["usage"]["prompt_tokens"]
    with long_streams(srv.url, STREAMS) as streams:
        wait_for(lambda: len(streams.gaps_since(0)) >= 4 * STREAMS, 60, 0.1, what="the streams decoding")
        decode = median(gaps_for(streams, seconds / 2))
        with prefill_load(srv.url, 3):
            time.sleep(seconds / 4)
            full = median(gaps_for(streams, seconds))
        # A full step prefills what the streams leave of the budget (counting
        # answers instead needs many more full steps to be as exact).
        capacity = (BUDGET - STREAMS) / prompt_tokens / full
        rate = RATE_SHARE * capacity
        cap = max(4, round(3 * rate))
        window = min(max(seconds, 8 * full), 2 * seconds)
        settle = max(seconds / 3, 2 * full)

        def paced(per_s: float) -> tuple[list[float], int]:
            with PacedPrefill(srv.url, per_s, cap) as load:
                time.sleep(settle)
                return gaps_for(streams, window), load.skipped

        fixed_2r, skipped = paced(2 * rate)
        for _ in range(2):
            if median(fixed_2r) >= 0.8 * full:
                break
            # Steps not full at 2R: the calibration caught a slow moment.
            rate *= 1.5
            fixed_2r, skipped = paced(2 * rate)
        fixed_r, _ = paced(rate)
        # Halfway between the decode-only gap and the one the fixed budget gives at 2R.
        target = decode + TARGET_SHARE * (median(fixed_2r) - decode)
        write_config(cfg, 10_000, "on", batching_config(target, max(3.0, 5 * full)))
        reload(http)
        with PacedPrefill(srv.url, 2 * rate, cap) as load:
            settled_after = wait_budget_settled(http, model, quiet=max(3.0, 4 * target), limit=3 * window)
            t0 = time.monotonic()
            budgets = []
            while time.monotonic() - t0 < window:
                budgets.append(token_budget(http, model))
                time.sleep(0.25)
            adaptive = streams.gaps_since(t0)
            skipped += load.skipped
    return BatchingRun(decode, full, capacity, rate, window, target, fixed_r, fixed_2r, adaptive, budgets,
                       settled_after, skipped)


@pytest.mark.load
def test_adaptive_batching_holds_itl_while_load_doubles(server_factory, model_name, tmp_path):
    """Open-loop prompts at R, then 2R (2R is over what the fixed budget
    sustains, so its steps fill and the gaps grow to a full step); the
    controller cuts the budget until the streams' median gap is back at the
    target. Rates, target and windows come from a calibration on this
    machine."""
    cfg = tmp_path / "batch.toml"
    write_config(cfg, 10_000, "off")
    srv = server_factory("--config", str(cfg), "--max-num-batched-tokens", str(BUDGET))
    run = adaptive_batching_run(srv, cfg, model_name, seconds=5.0)
    fixed_r, fixed_2r, steered = median(run.fixed_r), median(run.fixed_2r), median(run.adaptive_2r)
    figures = (f"target {run.target*1e3:.0f} ms (decode-only {run.decode_itl*1e3:.0f} ms, full step "
               f"{run.full_itl*1e3:.0f} ms, capacity {run.capacity:.2f}/s, R {run.rate:.2f}/s); median ITL "
               f"fixed R {fixed_r*1e3:.0f} ms, fixed 2R {fixed_2r*1e3:.0f} ms, adaptive 2R {steered*1e3:.0f} ms "
               f"({len(run.adaptive_2r)} gaps), budgets {sorted(set(run.budgets))}, settled after "
               f"{run.settled_after:.1f} s")
    assert fixed_r <= run.target, f"the fixed budget meets the target at R: {figures}"
    assert fixed_2r > 1.2 * run.target, f"the fixed budget misses the target at 2R: {figures}"
    assert abs(steered - run.target) <= 0.2 * run.target, f"adaptive batching holds the target: {figures}"
    assert max(run.budgets) < BUDGET, f"the budget was steered down: {figures}"
    m = srv.metrics()
    assert m.get("ingot_remediation_actions_total", action="batching", direction="down", mode="on") >= 1
    print(figures)
