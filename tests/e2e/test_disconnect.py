"""Clients that go away mid-stream: their requests are aborted and their KV
blocks freed promptly."""

from __future__ import annotations

import contextlib
import time

from ingot_e2e import iter_sse_data


def test_client_disconnect_frees_everything(server, model_name):
    srv = server
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
        running = m.get("ingot_num_requests_running") + m.get("ingot_num_requests_waiting")
        assert running == 8, f"expected 8 live requests, metrics say running+waiting={running}"
        assert m.get("ingot_kv_cache_usage_perc") > 0
        # hang up
        for r, _ in streams:
            r.close()
    t_closed = time.monotonic()

    last = None
    while True:
        m = srv.metrics()
        last = (m.get("ingot_num_requests_running"), m.get("ingot_num_requests_waiting"),
                m.get("ingot_kv_cache_usage_perc"))
        if last == (0, 0, 0):
            print(f"\ndisconnect: all freed {time.monotonic() - t_closed:.3f}s after closing")
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


def _wait_idle(srv, since: float, what: str, limit: float = 1.0) -> None:
    while True:
        m = srv.metrics()
        g = (m.get("ingot_num_requests_running"), m.get("ingot_num_requests_waiting"), m.get("ingot_kv_cache_usage_perc"))
        if g == (0, 0, 0):
            return
        if time.monotonic() - since > limit:
            raise AssertionError(f"{limit} s after {what}: running={g[0]} waiting={g[1]} kv_cache_usage_perc={g[2]}")
        time.sleep(0.02)


def test_non_streaming_client_timeout_aborts(server, model_name):
    """A client that gives up on a non-streaming request (timeout, closed
    socket) must not leave the generation running."""
    import httpx2 as httpx

    srv = server
    body = {"model": model_name, "prompt": "Once upon a time", "max_tokens": 400, "temperature": 0, "ignore_eos": True}
    try:
        httpx.post(srv.url + "/v1/completions", json=body, timeout=0.7)
        raise AssertionError("a 400-token request finished within 0.7 s; the test needs it to be in flight")
    except httpx.TimeoutException:
        pass
    _wait_idle(srv, time.monotonic(), "a non-streaming client timed out")


def test_disconnect_while_waiting(server_factory, model_name):
    """Streams that hang up while still queued leave the waiting queue."""
    srv = server_factory("--max-num-seqs", "1")
    with srv.http() as http, contextlib.ExitStack() as stack:
        responses = []
        for i in range(4):
            body = {"model": model_name, "prompt": f"Story {i}: once upon a time", "max_tokens": 400,
                    "temperature": 0, "ignore_eos": True, "stream": True}
            r = stack.enter_context(http.stream("POST", "/v1/completions", json=body))
            assert r.status_code == 200
            responses.append(r)
        deadline = time.monotonic() + 5
        while True:
            m = srv.metrics()
            live = (m.get("ingot_num_requests_running", default=-1), m.get("ingot_num_requests_waiting", default=-1))
            if live == (1, 3):
                break
            assert time.monotonic() < deadline, f"expected 1 running + 3 waiting, got {live}"
            time.sleep(0.02)
        for r in responses:
            r.close()
    _wait_idle(srv, time.monotonic(), "1 running and 3 queued streams disconnected")
