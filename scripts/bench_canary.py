"""scripts/bench-canary: three runs against real workers (the SmolLM2 test
model) behind `ingot route`, printed as markdown for docs/benchmarks.md.

1. Rollback: a canary group whose worker runs `--max-num-seqs 1
   --max-waiting 0` (it refuses its requests with 429; the router retries
   each on stable) at steps [25, 50, 100] under 4 concurrent streams: the
   share over time, both arms' client-side TTFT p50 and failures per 2 s
   (by the arm that answered), the router's per-arm error rates in the
   event log, the rollback. Then a slowed one (f32 weights, one sequence
   at a time: slower, never failing) at 50% under 6 streams.
2. Promotion: the same with an identical canary worker: every step, then
   promoted.
3. A/B: an experiment between a default worker (arm a) and one with
   `--max-num-seqs 1` (arm b: under 4 concurrent streams its requests
   queue), 50/50 by unit, 80 requests; the router's report (Welch on
   TTFT, ITL, E2E).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))

import httpx2 as httpx  # noqa: E402

from fleet_load import (AB_EXPERIMENT, FAILING_ARGS, QUEUEING_ARGS, SERVE_ARGS, SLOW_ARGS,  # noqa: E402
                        FleetLoad, canary_toml, groups_toml, ok)
from ingot_e2e import Router, Server, model_path  # noqa: E402


def groups(stable: Server, canary: Server) -> str:
    return groups_toml(stable.url, canary.url)


def poll(router: Router, stop: threading.Event, out: list):
    while not stop.is_set():
        s = httpx.get(f"{router.url}/admin/canaries/smol", timeout=10).json()
        out.append((time.monotonic(), s["share"], s["phase"]))
        time.sleep(0.5)


def timeline(router: Router, until: set[str], extra_s: float, limit_s: float,
             concurrency: int = 4, n_tokens: int = 12) -> tuple[list, dict, float]:
    shares: list = []
    stop = threading.Event()
    poller = threading.Thread(target=poll, args=(router, stop, shares), daemon=True)
    load = FleetLoad(router.url, concurrency=concurrency, n_tokens=n_tokens)
    poller.start()
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        if shares and shares[-1][2] in until:
            break
        time.sleep(0.25)
    time.sleep(extra_s)
    results = load.stop()
    stop.set()
    poller.join()
    status = httpx.get(f"{router.url}/admin/canaries/smol", timeout=10).json()
    return results, status | {"_shares": shares}, load.started


def table(results: list, shares: list, t0: float, events: list) -> str:
    rows = ["| t (s) | share % | phase | stable n | stable TTFT p50 ms | stable errors | canary n | canary TTFT p50 ms | canary errors |",
            "|---|---|---|---|---|---|---|---|---|"]
    end = max(r["start"] for r in results)
    t = t0
    while t < end:
        share = [s for s in shares if s[0] <= t + 2]
        share_v, phase = (share[-1][1], share[-1][2]) if share else ("", "")
        cells = []
        for arm in ("stable", "canary"):
            rs = [r for r in results if t <= r["start"] < t + 2 and (r["arm"] or "").endswith(arm)]
            tt = [r["ttft"] * 1e3 for r in rs if r["ttft"] is not None]
            p50 = f"{statistics.median(tt):.0f}" if tt else "-"
            cells += [str(len(rs)), p50, str(sum(not ok(r) for r in rs))]
        rows.append(f"| {t - t0:.0f}–{t - t0 + 2:.0f} | {share_v} | {phase} | " + " | ".join(cells) + " |")
        t += 2
    rows.append("")
    rows.append("Events (router's `GET /admin/canaries/smol`):")
    rows.append("")
    for e in events:
        rows.append(f"- {e['since_start_s']:.1f} s after the canary started: **{e['kind']}** → share "
                    f"{e['share']}%{' (' + e['reason'] + ')' if e.get('reason') else ''}: {e.get('detail')}")
    return "\n".join(rows)


def run_canary(tmp: Path, canary_args, canary: str, until: set[str], **load) -> str:
    stable, canary_worker = Server(*SERVE_ARGS), Server(*canary_args)
    try:
        router = Router(tmp, groups(stable, canary_worker) + canary, wait_workers=2)
        try:
            results, status, t0 = timeline(router, until, extra_s=4.0, limit_s=150, **load)
            failed = sum(not ok(r) for r in results)
            head = (f"{len(results)} requests, {failed} failed; final phase **{status['phase']}**, "
                    f"share {status['share']}%, stable group `{status['stable_group']}`.\n\n")
            return head + table(results, status["_shares"], t0, status["events"])
        finally:
            router.stop()
    finally:
        stable.stop()
        canary_worker.stop()


def run_ab(tmp: Path) -> str:
    stable, slow = Server(*SERVE_ARGS), Server(*QUEUEING_ARGS)
    cfg = groups(stable, slow) + AB_EXPERIMENT
    try:
        router = Router(tmp, cfg, wait_workers=2)
        try:
            load = FleetLoad(router.url, concurrency=4, users_per_loop=8, n_tokens=4)
            while len(load.results) < 80:
                time.sleep(0.25)
            load.stop()
            report = httpx.get(f"{router.url}/admin/experiments/batching", timeout=30).json()
        finally:
            router.stop()
    finally:
        stable.stop()
        slow.stop()
    lines = ["| metric | arm a n | a mean | a p50 | a p95 | a p99 | arm b n | b mean | b p50 | b p95 | b p99 | t | df | p | verdict |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in ("ttft_ms", "itl_ms", "e2e_ms"):
        c = report[key]
        w = c["welch"] or {}
        fmt = lambda s: f"{s['n']} | {s['mean']:.1f} | {s['p50']:.1f} | {s['p95']:.1f} | {s['p99']:.1f}"
        lines.append(f"| {key} | {fmt(c['a'])} | {fmt(c['b'])} | {w.get('t', 0):.2f} | {w.get('df', 0):.1f} | "
                     f"{w.get('p', 1):.2e} | {c['verdict']} |")
    arms = report["arms"]
    head = (f"arms: a = `{arms[0]['name']}` (group {arms[0]['group']}, {arms[0]['requests']} requests, "
            f"{arms[0]['errors']} errors), b = `{arms[1]['name']}` (group {arms[1]['group']}, "
            f"{arms[1]['requests']} requests, {arms[1]['errors']} errors); significance "
            f"{report['significance']}, window {report['window']}\n\n")
    return head + "\n".join(lines) + "\n\n```json\n" + json.dumps(report["ttft_ms"], indent=1) + "\n```"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=None, help="also write the markdown here")
    ap.add_argument("--only", choices=["rollback", "slowed", "promote", "ab"], default=None)
    args = ap.parse_args()
    model_path()
    parts = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.only in (None, "rollback"):
            parts.append("### Rollback of a failing canary\n\n" + run_canary(
                tmp, FAILING_ARGS, canary_toml("[25, 50, 100]", "60s"), {"rolled_back"}))
        if args.only in (None, "slowed"):
            # As tests/e2e/test_canary.py's slowed canary: the median compared.
            parts.append("### Rollback of a slowed canary\n\n" + run_canary(
                tmp, SLOW_ARGS, canary_toml("[50, 100]", "5m", "30s", min_samples=6, quantile=0.5, significance=0.05,
                                      max_ratio=1.25),
                {"rolled_back"}, concurrency=6, n_tokens=8))
        if args.only in (None, "promote"):
            parts.append("### Promotion of a healthy canary\n\n" + run_canary(
                tmp, SERVE_ARGS, canary_toml("[5, 25, 50, 100]", "6s"), {"promoted", "rolled_back"}))
        if args.only in (None, "ab"):
            parts.append("### A/B report\n\n" + run_ab(tmp))
    text = "\n\n".join(parts) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
