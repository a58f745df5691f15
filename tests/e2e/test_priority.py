"""Priorities: under saturation critical requests get their first token
before the normal backlog; background requests still complete."""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import httpx2 as httpx

MAX_TOKENS = 32


async def timed_stream(c: httpx.AsyncClient, model_name: str, i: int, priority: str | None):
    body = {"model": model_name, "prompt": f"Request {i} ({priority}): write a short poem about the number {i}.",
            "max_tokens": MAX_TOKENS, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    if priority is not None:
        body["priority"] = priority
    t0 = time.perf_counter()
    ttft, finish, usage, done = None, None, None, False
    async with c.stream("POST", "/v1/completions", json=body) as r:
        if r.status_code != 200:
            return {"priority": priority, "status": r.status_code, "body": (await r.aread())[:300]}
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                done = True
                break
            chunk = json.loads(data)
            for ch in chunk.get("choices") or []:
                if ttft is None:
                    ttft = time.perf_counter() - t0
                if ch.get("finish_reason"):
                    finish = ch["finish_reason"]
            if chunk.get("usage"):
                usage = chunk["usage"]
    return {"priority": priority, "status": 200, "ttft": ttft, "finish": finish, "usage": usage, "done": done,
            "total": time.perf_counter() - t0}


def test_priority_critical_first_background_completes(server_factory, model_name):
    srv = server_factory("--max-num-seqs", "2")

    async def scenario():
        async with httpx.AsyncClient(base_url=srv.url, timeout=300.0) as c:
            normal = [asyncio.create_task(timed_stream(c, model_name, i, None if i % 2 else "normal")) for i in range(10)]
            # wait until the backlog is queued (2 running, the rest waiting)
            deadline = time.monotonic() + 10
            while True:
                m = await c.get("/metrics")
                text = m.text
                waiting = _gauge(text, "ingot_num_requests_waiting")
                if waiting >= 6:
                    break
                assert time.monotonic() < deadline, f"backlog never built up (waiting={waiting})"
                await asyncio.sleep(0.02)
            urgent = [asyncio.create_task(timed_stream(c, model_name, 100 + i, p))
                      for i, p in enumerate(["critical", "background", "critical", "background", "critical", "background"])]
            return await asyncio.gather(*normal), await asyncio.gather(*urgent)

    normal, urgent = asyncio.run(scenario())
    everything = normal + urgent
    bad = [r for r in everything if r["status"] != 200]
    assert not bad, bad
    for r in everything:
        assert r["done"] and r["finish"] == "length", r
        assert r["usage"]["completion_tokens"] == MAX_TOKENS, r
    critical = [r["ttft"] for r in urgent if r["priority"] == "critical"]
    background = [r["ttft"] for r in urgent if r["priority"] == "background"]
    normal_ttft = [r["ttft"] for r in normal]
    med = statistics.median(normal_ttft)
    summary = (f"normal TTFTs {[round(t, 2) for t in sorted(normal_ttft)]} (median {med:.2f}s), "
               f"critical {[round(t, 2) for t in critical]}, background {[round(t, 2) for t in background]}")
    print("\npriority: " + summary)
    assert all(t < med for t in critical), "a critical request waited longer than the median normal one: " + summary
    assert max(critical) < statistics.median(background), "background served before critical: " + summary
    # per-priority metrics are labelled
    m = srv.metrics()
    assert m.get("ingot_request_success_total", priority="critical") == 3, summary
    assert m.get("ingot_request_success_total", priority="background") == 3
    assert m.get("ingot_request_success_total", priority="normal") == 10


def _gauge(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(None, 1)[1])
    return 0.0
