"""Clients that go away mid-stream: their requests are aborted and their KV
blocks freed promptly."""

from __future__ import annotations

import contextlib
import time

from ingot_e2e import iter_sse_data


def test_client_disconnect_frees_everything(server_factory, model_name):
    srv = server_factory()
    body_for = lambda i: {  # noqa: E731
        "model": model_name,
        "messages": [{"role": "user", "content": f"Tell me a long story about dragon number {i}."}],
        "max_tokens": 200,
        "temperature": 0,
        "stream": True,
        "ignore_eos": True,
    }
    with srv.http() as http, contextlib.ExitStack() as stack:
        streams = []
        for i in range(8):
            r = stack.enter_context(http.stream("POST", "/v1/chat/completions", json=body_for(i)))
            assert r.status_code == 200
            streams.append((r, iter_sse_data(r)))
        # read a few chunks from each: all 8 are generating
        for r, it in streams:
            for _ in range(3):
                data = next(it)
                assert data != "[DONE]"
        m = srv.metrics()
        running = m.get("ingot:num_requests_running") + m.get("ingot:num_requests_waiting")
        assert running == 8, f"expected 8 live requests, metrics say running+waiting={running}"
        assert m.get("ingot:kv_cache_usage_perc") > 0
        # hang up
        for r, _ in streams:
            r.close()
    t_closed = time.monotonic()

    last = None
    while True:
        m = srv.metrics()
        last = (m.get("ingot:num_requests_running"), m.get("ingot:num_requests_waiting"),
                m.get("ingot:kv_cache_usage_perc"))
        if last == (0, 0, 0):
            break
        if time.monotonic() - t_closed > 1.0:
            raise AssertionError(
                f"1 s after 8 clients disconnected: running={last[0]} waiting={last[1]} kv_cache_usage_perc={last[2]} "
                "(expected all 0)"
            )
        time.sleep(0.02)
    # and the server is fine
    c = srv.openai()
    r = c.chat.completions.create(model=model_name, messages=[{"role": "user", "content": "What is the capital of France?"}],
                                  max_tokens=16, temperature=0)
    assert "Paris" in r.choices[0].message.content
