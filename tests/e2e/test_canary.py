"""Canary releases and A/B experiments in `ingot route`, against real
`ingot serve` workers (the SmolLM2 test model) in two worker groups.

"Measurably worse" is a real knob, not a fake: the worse worker runs with
`--max-num-seqs 1`, so under concurrent load its requests queue behind one
another and its TTFT is a multiple of the stable worker's (which batches
up to 8); the failing one also has `--max-waiting 0`, a waiting queue with
no room, so it refuses its requests (429) and the router retries each on
the stable group: a canary failing its requests, yet no client request
fails.
(`--max-num-batched-tokens 16` was tried first: on the CPU backend chunked
prefill costs about the same compute, so it was not measurably slower.)
Loads are bounded: a few streams at a time, each test under a minute or
two on CI's two cores."""

from __future__ import annotations

import time

import httpx2 as httpx
import pytest

from fleet_load import FleetLoad, arms_by_user, chat_body, ok
from ingot_e2e import Router, model_path, wait_for

KV = ("--kv-cache-tokens", "4096")
SERVE_ARGS = (*KV, "--max-num-seqs", "8")
SLOW_ARGS = (*KV, "--max-num-seqs", "1")
FAILING_ARGS = (*SLOW_ARGS, "--max-waiting", "0")


@pytest.fixture
def fleet(tmp_path, server_factory):
    """`fleet(stable_args, canary_args, extra_config)`: a stable and a
    canary worker and a router grouping them."""
    started: list[Router] = []

    def start(stable_args, canary_args, extra: str) -> Router:
        model_path()
        stable = server_factory(*stable_args)
        canary = server_factory(*canary_args)
        cfg = (
            '[[workers.groups]]\nname = "stable"\n'
            f'urls = ["{stable.url}"]\n'
            '[[workers.groups]]\nname = "canary"\n'
            f'urls = ["{canary.url}"]\n' + extra
        )
        r = Router(tmp_path, cfg, wait_workers=2)
        started.append(r)
        return r

    yield start
    for r in started:
        rc = r.stop()
        assert rc == 0, f"ingot route exited with {rc}\n{r.log_tail()}"


def canary_status(r: Router, name: str = "smol") -> dict:
    resp = httpx.get(f"{r.url}/admin/canaries/{name}", timeout=10.0)
    assert resp.status_code == 200, resp.text
    return resp.json()


CANARY = """
[[canary]]
name = "smol"
stable_group = "stable"
canary_group = "canary"
steps = {steps}
step_duration = "{step}"
window = "{window}"
eval_interval = "250ms"
min_samples = {min_samples}
significance = 0.01
max_ttft_ratio = 1.5
"""


def test_a_slow_canary_is_rolled_back_under_load_with_no_failed_request(fleet):
    window_s = 40
    r = fleet(SERVE_ARGS, FAILING_ARGS,
              CANARY.format(steps="[25, 50, 100]", step="90s", window=f"{window_s}s", min_samples=6))
    assert canary_status(r)["share"] == 25.0
    load = FleetLoad(r.url, concurrency=4)
    try:
        s = wait_for(lambda: (st := canary_status(r))["phase"] == "rolled_back" and st,
                     window_s, interval=0.25, what="an automatic rollback")
        rolled_at = time.monotonic()
        # Keep the load on after the rollback: every request still served.
        time.sleep(3)
    finally:
        results = load.stop()
    failed = [x for x in results if not ok(x)]
    assert not failed, failed[:3]
    rollback = s["events"][-1]
    assert rollback["kind"] == "rollback" and rollback["reason"] in ("error_rate", "ttft"), s["events"]
    reason = rollback["reason"]
    assert rolled_at - load.started < window_s, "rolled back within one evaluation window"
    assert [e["kind"] for e in s["events"]] == ["start", "rollback"]
    assert s["share"] == 0.0
    if reason == "error_rate":
        assert s["canary"]["error_rate"] - s["stable"]["error_rate"] > 0.05, s
    else:
        assert s["canary"]["ttft_ms"]["p95"] > 1.5 * s["stable"]["ttft_ms"]["p95"], s
    # Stickiness: the header names the arm that answered; a unit never goes
    # from stable back to canary (the share only went down). (The canary's
    # units were answered by stable after each refusal, so the header shows
    # stable for them; the arm counters below show they were sent to it.)
    for user, arms in arms_by_user(results).items():
        first_stable = arms.index("stable") if "stable" in arms else len(arms)
        assert all(a == "stable" for a in arms[first_stable:]), (user, arms)
    # Requests that started after the rollback all went to the stable group.
    late = [x for x in results if x["start"] > rolled_at + 0.5]
    assert late and all(x["arm"] == "canary:smol:stable" for x in late)
    m = r.metrics()
    assert m.get("ingot_canary_share", canary="smol") == 0.0
    assert m.get("ingot_canary_rollbacks_total", canary="smol", reason=reason) == 1.0
    if reason == "error_rate":
        assert m.get("ingot_router_arm_requests_total", experiment="canary:smol", arm="canary",
                     group="canary", outcome="error") > 0


def test_a_healthy_canary_is_promoted_through_every_step(fleet):
    r = fleet(SERVE_ARGS, SERVE_ARGS,
              CANARY.format(steps="[25, 50, 100]", step="4s", window="20s", min_samples=5))
    load = FleetLoad(r.url, concurrency=3)
    try:
        s = wait_for(lambda: (st := canary_status(r))["phase"] in ("promoted", "rolled_back") and st,
                     90, interval=0.25, what="the canary finishing")
        promoted_at = time.monotonic()
        time.sleep(2)
    finally:
        results = load.stop()
    assert s["phase"] == "promoted", s["events"]
    kinds = [(e["kind"], e["share"]) for e in s["events"]]
    assert kinds == [("start", 25.0), ("step", 50.0), ("step", 100.0), ("promote", 100.0)], kinds
    assert s["stable_group"] == "canary"
    assert all(ok(x) for x in results), [x for x in results if not ok(x)][:3]
    # The share only grew: a unit once in the canary stays in.
    for user, arms in arms_by_user(results).items():
        first_canary = arms.index("canary") if "canary" in arms else len(arms)
        assert all(a == "canary" for a in arms[first_canary:]), (user, arms)
    late = [x for x in results if x["start"] > promoted_at + 0.5]
    assert late and all(x["worker"] == x["worker"] and x["arm"] == "canary:smol:canary" for x in late)
    m = r.metrics()
    assert m.get("ingot_canary_share", canary="smol") == 100.0
    assert m.get("ingot_canary_promotions_total", canary="smol") == 1.0
    # Operators cannot roll back a finished canary; unknown names are 404.
    with r.http() as h:
        assert h.post("/admin/canaries/smol/rollback").status_code == 409
        assert h.post("/admin/canaries/nope/rollback").status_code == 404


def test_ab_experiment_reports_welch_and_keeps_units_on_their_arm(fleet):
    cfg = """
[[experiments]]
id = "batching"
split_percent = 50
significance = 0.01
min_samples = 10
arms = [{name = "default", group = "stable"}, {name = "small_budget", group = "canary"}]
"""
    r = fleet(SERVE_ARGS, SLOW_ARGS, cfg)
    load = FleetLoad(r.url, concurrency=4, users_per_loop=6, n_tokens=4)
    try:
        wait_for(lambda: len(load.results) >= 60, 120, interval=0.25, what="60 requests")
    finally:
        results = load.stop()
    n = len(results)
    seen: dict[str, set[str]] = {}
    for x in results:
        seen.setdefault(x["user"], set()).add(x["arm"])
    with httpx.Client(base_url=r.url, timeout=30.0) as h:
        report = h.get("/admin/experiments/batching").json()
        assert h.get("/admin/experiments/nope").status_code == 404
    assert all(ok(x) for x in results)
    assert all(len(arms) == 1 for arms in seen.values()), seen
    a, b = report["arms"]
    assert (a["name"], b["name"]) == ("default", "small_budget")
    assert a["requests"] + b["requests"] == n and a["errors"] == b["errors"] == 0
    ttft = report["ttft_ms"]
    assert ttft["a"]["n"] == a["requests"] and ttft["b"]["n"] == b["requests"]
    assert ttft["b"]["mean"] > ttft["a"]["mean"]
    assert ttft["welch"]["p"] < 0.01, ttft
    assert ttft["verdict"] == "b_higher"
    for key in ("t", "df", "p"):
        assert key in ttft["welch"]
    for key in ("p50", "p95", "p99", "mean", "variance", "n"):
        assert key in ttft["a"]
    assert report["e2e_ms"]["a"]["n"] == a["requests"]
    m = r.metrics()
    assert m.get("ingot_router_arm_requests_total", experiment="batching", arm="small_budget",
                 group="canary", outcome="ok") == b["requests"]
    assert m.get("ingot_router_group_requests_total", group="stable", status="200") == a["requests"]
