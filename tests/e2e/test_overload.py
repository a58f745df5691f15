"""Backpressure: a full waiting queue answers 429 with Retry-After; accepted
requests all complete; the server recovers."""

from __future__ import annotations

import asyncio

import httpx2 as httpx

from ingot_e2e import assert_error, wait_for


def settled(srv, **want):
    """The server's metrics once every gauge or counter in `want` reads its
    value: a finished request's gauges are updated just after its response
    is sent, so they are polled (2 s at most) rather than read once."""
    def check():
        m = srv.metrics()
        return m if all(m.get(name) == value for name, value in want.items()) else None
    return wait_for(check, 2.0, what=f"metrics {want}")


def test_overload_429(server_factory, model_name):
    srv = server_factory("--max-num-seqs", "2", "--max-waiting", "4")

    async def fire():
        async with httpx.AsyncClient(base_url=srv.url, timeout=120.0,
                                     limits=httpx.Limits(max_connections=64)) as c:
            async def one(i):
                body = {"model": model_name, "prompt": f"Story {i}: once upon a time", "max_tokens": 16,
                        "temperature": 0, "ignore_eos": True}
                return await c.post("/v1/completions", json=body)

            return await asyncio.gather(*(one(i) for i in range(20)))

    responses = asyncio.run(fire())
    codes = [r.status_code for r in responses]
    rejected = [r for r in responses if r.status_code == 429]
    accepted = [r for r in responses if r.status_code != 429]
    print(f"\noverload: {codes}, Retry-After {[r.headers.get('retry-after') for r in rejected]}")
    assert rejected, f"no 429 among 20 concurrent requests with 2 slots + 4 waiting: {codes}"
    assert len(accepted) >= 4, f"fewer requests accepted than the waiting queue holds: {codes}"
    for r in accepted:
        assert r.status_code == 200, f"{r.status_code} {r.text[:300]}"
        body = r.json()
        assert body["choices"][0]["finish_reason"] == "length"
        assert body["usage"]["completion_tokens"] == 16
    for r in rejected:
        assert_error(r, 429, "rate_limit_exceeded")
        ra = r.headers.get("retry-after")
        assert ra is not None, f"429 without Retry-After: {dict(r.headers)}"
        assert ra.strip().isdigit(), f"Retry-After must be delay-seconds (an integer), got {ra!r}"

    with srv.http() as http:
        assert http.get("/health").status_code == 200
        assert http.get("/ready").status_code == 200
        r = http.post("/v1/completions", json={"model": model_name, "prompt": "The capital of France is",
                                               "max_tokens": 4, "temperature": 0})
        assert r.status_code == 200, r.text
        assert "Paris" in r.json()["choices"][0]["text"]
    settled(srv, ingot_num_requests_running=0, ingot_num_requests_waiting=0,
            ingot_request_success_total=len(accepted) + 1)


def test_overload_streaming_429(server_factory, model_name):
    """A streaming request that is rejected gets a plain 429 (not a 200 SSE
    stream carrying an error)."""
    srv = server_factory("--max-num-seqs", "1", "--max-waiting", "1")

    async def fire():
        async with httpx.AsyncClient(base_url=srv.url, timeout=120.0) as c:
            async def one(i):
                body = {"model": model_name, "prompt": f"Story {i}:", "max_tokens": 16, "temperature": 0,
                        "ignore_eos": True, "stream": True}
                async with c.stream("POST", "/v1/completions", json=body) as r:
                    raw = await r.aread()
                    return r.status_code, r.headers, raw

            return await asyncio.gather(*(one(i) for i in range(8)))

    results = asyncio.run(fire())
    codes = [s for s, _, _ in results]
    assert 429 in codes, codes
    for status, headers, raw in results:
        if status == 429:
            assert "retry-after" in headers
            assert b"rate_limit_exceeded" in raw
        else:
            assert status == 200
            assert raw.rstrip().endswith(b"data: [DONE]"), raw[-200:]


def test_burst_within_queue_bound(server, model_name):
    """64 concurrent requests (half streaming) on the default server: all
    accepted and completed; the server is idle afterwards."""

    async def fire():
        async with httpx.AsyncClient(base_url=server.url, timeout=120.0,
                                     limits=httpx.Limits(max_connections=128)) as c:
            async def one(i):
                body = {"model": model_name, "prompt": f"Item {i}: the", "max_tokens": 4, "temperature": 0,
                        "ignore_eos": True, "stream": i % 2 == 0}
                r = await c.post("/v1/completions", json=body)
                if r.status_code != 200:
                    return r.status_code, r.text[:200]
                if i % 2 == 0:
                    assert r.text.rstrip().endswith("data: [DONE]"), r.text[-200:]
                    return 200, None
                return 200, r.json()["usage"]["completion_tokens"]

            return await asyncio.gather(*(one(i) for i in range(64)))

    results = asyncio.run(fire())
    bad = [(i, r) for i, r in enumerate(results) if r[0] != 200 or (i % 2 and r[1] != 4)]
    assert not bad, bad
    settled(server, ingot_num_requests_running=0, ingot_num_requests_waiting=0, ingot_kv_cache_usage_perc=0)
