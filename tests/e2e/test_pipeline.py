"""The request pipeline: identical in-flight deterministic requests share
one engine generation (coalescing), completed ones are replayed from the
response cache, and nothing that is not deterministic is ever shared. Engine
generations are counted by `ingot_engine_requests_total`."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx2 as httpx
import pytest

from ingot_e2e import iter_sse_data, running, wait_for

ENGINE = "ingot_engine_requests_total"
CACHE_ON = {"INGOT_FLAG_RESPONSE_CACHE": "on"}


@pytest.fixture(scope="module")
def cached():
    """One server with the response cache on for the cache tests (each
    uses its own prompts; counts are compared before and after)."""
    with running(env=CACHE_ON) as srv:
        yield srv


def engine_requests(srv) -> float:
    return srv.metrics().get(ENGINE)


def stream_text(r: httpx.Response) -> tuple[list[str], str | None, dict | None]:
    """Deltas, finish reason and usage of a chat SSE stream."""
    deltas, finish, usage = [], None, None
    for data in iter_sse_data(r):
        if data == "[DONE]":
            break
        chunk = json.loads(data)
        assert "error" not in chunk, chunk
        for ch in chunk["choices"]:
            d = ch["delta"].get("content")
            if d:
                deltas.append(d)
            finish = ch.get("finish_reason") or finish
        usage = chunk.get("usage") or usage
    return deltas, finish, usage


def chat_body(model, content, max_tokens=96, stream=True, **extra):
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, **extra}
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def test_twenty_identical_streams_share_one_generation(server, model_name):
    srv = server
    body = chat_body(model_name, "Tell me a story about a lighthouse keeper.", max_tokens=128)
    before = engine_requests(srv)
    results: list = [None] * 20
    first_half = threading.Event()

    def run(i):
        with httpx.Client(base_url=srv.url, timeout=120) as c:
            with c.stream("POST", "/v1/chat/completions", json=body) as r:
                assert r.status_code == 200, r.read()
                status = r.headers.get("x-ingot-cache")
                deltas, finish, usage = [], None, None
                for data in iter_sse_data(r):
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    for ch in chunk["choices"]:
                        if ch["delta"].get("content"):
                            deltas.append(ch["delta"]["content"])
                        finish = ch.get("finish_reason") or finish
                    usage = chunk.get("usage") or usage
                    if i == 0 and len(deltas) >= 64:
                        first_half.set()
                results[i] = (status, deltas, finish, usage)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(19)]
    for t in threads:
        t.start()
    # The 20th connects once half the tokens have been generated.
    assert first_half.wait(60), "the first stream never reached 64 tokens"
    late = threading.Thread(target=run, args=(19,))
    late.start()
    for t in [*threads, late]:
        t.join(120)
    assert all(r is not None for r in results), results
    assert engine_requests(srv) - before == 1, "20 identical requests must cost one engine generation"
    statuses = sorted(r[0] for r in results)
    assert statuses.count("miss") == 1 and statuses.count("coalesced") == 19, statuses
    text = "".join(results[0][1])
    assert len(text) > 0
    for status, deltas, finish, usage in results:
        assert "".join(deltas) == text
        assert finish == "length"
        assert usage["completion_tokens"] == 128
    assert srv.metrics().get("ingot_coalesced_requests_total") >= 19


def test_twenty_identical_non_streaming_requests(server, model_name):
    srv = server
    body = {"model": model_name, "prompt": "The history of the printing press", "max_tokens": 48,
            "temperature": 0, "ignore_eos": True}
    before = engine_requests(srv)

    async def fire():
        async with httpx.AsyncClient(base_url=srv.url, timeout=120) as c:
            return await asyncio.gather(*(c.post("/v1/completions", json=body) for _ in range(20)))

    responses = asyncio.run(fire())
    assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
    assert engine_requests(srv) - before == 1
    texts = {r.json()["choices"][0]["text"] for r in responses}
    assert len(texts) == 1
    ids = {r.json()["id"] for r in responses}
    assert len(ids) == 20, "each response has its own id"
    assert {r.headers["x-ingot-cache"] for r in responses} == {"miss", "coalesced"}


def _wait_idle(srv, within: float, what: str):
    t0 = time.monotonic()

    def idle():
        m = srv.metrics()
        g = (m.get("ingot_num_requests_running"), m.get("ingot_num_requests_waiting"), m.get("ingot_kv_cache_usage_perc"))
        return g == (0, 0, 0)

    wait_for(idle, within, what=what)
    return time.monotonic() - t0


def test_cancelling_subscribers(server, model_name):
    srv = server
    body = chat_body(model_name, "Describe the ocean in great detail.", max_tokens=160)
    before = srv.metrics()
    with httpx.Client(base_url=srv.url, timeout=120) as http:
        # 19 of 20 hang up: the last one still gets the whole answer.
        streams = []
        for _ in range(20):
            cm = http.stream("POST", "/v1/chat/completions", json=body)
            r = cm.__enter__()
            assert r.status_code == 200
            it = iter_sse_data(r)
            next(it)
            streams.append((cm, r, it))
        for cm, r, _ in streams[:19]:
            r.close()
            cm.__exit__(None, None, None)
        cm, r, it = streams[19]
        deltas, finish = [], None
        for data in it:
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            for ch in chunk["choices"]:
                deltas.append(ch["delta"].get("content") or "")
                finish = ch.get("finish_reason") or finish
        cm.__exit__(None, None, None)
        assert finish == "length", "the remaining subscriber must finish"
        m = srv.metrics()
        assert m.get(ENGINE) - before.get(ENGINE) == 1

        # All 20 hang up: the generation stops and its KV is freed at once.
        body2 = chat_body(model_name, "Describe the mountains in great detail.", max_tokens=400)
        streams = []
        for _ in range(20):
            cm = http.stream("POST", "/v1/chat/completions", json=body2)
            r = cm.__enter__()
            it = iter_sse_data(r)
            for _ in range(3):
                next(it)
            streams.append((cm, r))
        assert srv.metrics().get("ingot_num_requests_running") == 1
        for cm, r in streams:
            r.close()
            cm.__exit__(None, None, None)
        took = _wait_idle(srv, 1.0, "20 coalesced subscribers disconnected")
        print(f"\ncoalesced: KV freed {took:.3f}s after the last subscriber left")
        m = srv.metrics()
        aborted = ("ingot_request_success_total", 0.0)
        assert m.get(*aborted, finish_reason="abort") - before.get(*aborted, finish_reason="abort") == 1


def test_response_cache(cached, model_name):
    srv = cached
    base = {"model": model_name, "prompt": "The three primary colours are", "max_tokens": 20, "temperature": 0}
    with srv.http() as http:
        first = http.post("/v1/completions", json=base)
        assert first.headers["x-ingot-cache"] == "miss"
        n0 = engine_requests(srv)
        # Key order and whitespace do not matter.
        raw = json.dumps(dict(reversed(list(base.items()))), indent=3)
        hit = http.post("/v1/completions", content=raw, headers={"content-type": "application/json"})
        assert hit.headers["x-ingot-cache"] == "hit"
        assert engine_requests(srv) == n0, "a hit must not touch the engine"
        a, b = first.json(), hit.json()
        assert a["choices"] == b["choices"] and a["usage"] == b["usage"]
        assert a["id"] != b["id"]

        # Any output-relevant difference misses.
        for variant in ({"stop": ["\n"]}, {"max_tokens": 21}, {"seed": 5, "temperature": 0.7},
                        {"seed": 6, "temperature": 0.7}, {"logprobs": 2}, {"presence_penalty": 0.5}):
            r = http.post("/v1/completions", json={**base, **variant})
            assert r.status_code == 200, r.text
            assert r.headers["x-ingot-cache"] == "miss", (variant, r.headers["x-ingot-cache"])

        # A streaming hit replays as SSE, usage included.
        sbody = {**base, "stream": True, "stream_options": {"include_usage": True}}
        chunks = []
        with http.stream("POST", "/v1/completions", json=sbody) as r:
            assert r.headers["x-ingot-cache"] == "hit"
            assert r.headers["content-type"].startswith("text/event-stream")
            for data in iter_sse_data(r):
                if data == "[DONE]":
                    break
                chunks.append(json.loads(data))
        text = "".join(ch["text"] for c in chunks for ch in c["choices"])
        assert text == a["choices"][0]["text"]
        assert chunks[-1]["usage"] == a["usage"]

        # The OpenAI client sees the same answer.
        c = srv.openai()
        r = c.completions.with_raw_response.create(**base)
        assert r.headers["x-ingot-cache"] == "hit"
        assert r.parse().choices[0].text == a["choices"][0]["text"]

        # Opting out: no-cache regenerates, no-store shares nothing.
        n1 = engine_requests(srv)
        r = http.post("/v1/completions", json=base, headers={"cache-control": "no-cache"})
        assert r.headers["x-ingot-cache"] == "miss"
        r = http.post("/v1/completions", json=base, headers={"cache-control": "no-store"})
        assert r.headers["x-ingot-cache"] == "bypass"
        assert engine_requests(srv) == n1 + 2

        m = srv.metrics()
        assert m.get("ingot_response_cache_hits_total") >= 3
        assert m.get("ingot_response_cache_entries") >= 1
        assert m.get("ingot_response_cache_bytes") > 0

        # Purge by another model's name keeps entries; purge all empties.
        r = http.post("/admin/cache/purge", json={"model": "no-such-model"})
        assert r.json()["purged"] == 0
        r = http.post("/admin/cache/purge")
        assert r.status_code == 200 and r.json()["purged"] >= 1
        r = http.post("/v1/completions", json=base)
        assert r.headers["x-ingot-cache"] == "miss"


def test_flags_endpoint_and_env_override(server_factory, model_name):
    srv = server_factory(env={"INGOT_FLAG_COALESCING": "off"})
    with srv.http() as http:
        flags = {f["name"]: f for f in http.get("/admin/flags").json()["data"]}
    assert flags["coalescing"]["enabled"] is False
    assert "INGOT_FLAG_COALESCING" in flags["coalescing"]["sources"]["enabled"]
    assert flags["response_cache"]["enabled"] is False
    body = {"model": model_name, "prompt": "Rivers flow into", "max_tokens": 8, "temperature": 0}
    with srv.http() as http:
        r = http.post("/v1/completions", json=body)
    assert r.headers["x-ingot-cache"] == "bypass", "coalescing off and cache off: nothing shared"
    m = srv.metrics()
    assert m.get("ingot_flag_decisions_total", flag="coalescing", result="off") >= 1
