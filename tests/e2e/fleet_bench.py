"""Latency of the shared response cache (docs/fleet.md), for
docs/benchmarks.md: two `ingot serve` workers sharing a `redis-server`.

For N fresh deterministic prompts: the miss on server A, the first answer
on B (a hit from the Redis tier), the second on B (a local hit); then
local-hit latency with Redis up, in the first second after killing it, and
after (breaker open). Run from tests/e2e:

    INGOT_BIN=... python fleet_bench.py [N]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from ingot_e2e import Server, model_path
from test_fleet import SERVE_ARGS, Redis, chat, config, post


def timed(url: str, body: dict) -> tuple[float, str]:
    t = time.perf_counter()
    r = post(url, body)
    elapsed = (time.perf_counter() - t) * 1000
    assert r.status_code == 200, r.text
    return elapsed, r.headers["x-ingot-cache"]


def summary(name: str, xs: list[float]) -> None:
    xs = sorted(xs)
    p95 = xs[min(len(xs) - 1, int(0.95 * len(xs)))]
    print(f"{name:32s} n={len(xs):3d} median {statistics.median(xs):7.2f} ms  p95 {p95:7.2f} ms  max {xs[-1]:7.2f} ms")


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 30
    model_path()
    redis = Redis()
    d = Path(tempfile.mkdtemp())
    cfg = d / "serve.toml"
    cfg.write_text(config(redis, "bench-" + uuid.uuid4().hex[:6]))
    a, b = (Server("--config", str(cfg), *SERVE_ARGS) for _ in range(2))
    try:
        miss, shared, local = [], [], []
        bodies = [chat(f"Bench prompt {i} {uuid.uuid4().hex[:6]}.", max_tokens=16) for i in range(n)]
        for body in bodies:
            t, s = timed(a.url, body)
            assert s == "miss", s
            miss.append(t)
            t, s = timed(b.url, body)
            assert s == "hit", s
            shared.append(t)
            t, s = timed(b.url, body)
            assert s == "hit", s
            local.append(t)
        summary("miss (A, 16 tokens)", miss)
        summary("hit from Redis (B, first)", shared)
        summary("hit from local tier (B, again)", local)
        # Redis-tier lookups on a local miss: a prompt nobody computed.
        lookup = []
        for i in range(n):
            body = chat(f"Never computed {uuid.uuid4().hex}.", max_tokens=1)
            t, _ = timed(b.url, body)
            lookup.append(t)
        summary("miss on B (1 token, Redis asked)", lookup)
        up = [timed(b.url, bodies[i % n])[0] for i in range(n)]
        summary("local hit, Redis up", up)
        redis.stop()
        killed = time.perf_counter()
        first_s, later = [], []
        while time.perf_counter() - killed < 3.0:
            t, s = timed(b.url, bodies[len(first_s) % n])
            (first_s if time.perf_counter() - killed < 1.0 else later).append(t)
        summary("local hit, first 1 s after kill", first_s)
        summary("local hit, 1-3 s after kill", later)
        fresh = [timed(b.url, chat(f"Outage miss {uuid.uuid4().hex}.", max_tokens=1))[0] for _ in range(n)]
        summary("miss on B (1 token, Redis down)", fresh)
    finally:
        for s in (a, b):
            s.stop()
        redis.stop()


if __name__ == "__main__":
    main()
