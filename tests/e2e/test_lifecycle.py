"""Process lifecycle: CLI, startup failures, graceful shutdown."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import httpx2 as httpx

from ingot_e2e import BIN, Server, iter_sse_data

SERVE_FLAGS = [
    "--model", "--host", "--port", "--served-model-name", "--max-num-seqs", "--max-num-batched-tokens",
    "--max-waiting", "--kv-cache-tokens", "--max-model-len", "--no-prefix-caching", "--stall-timeout",
    "--shutdown-timeout", "--max-body-bytes", "--threads",
]


def test_serve_help_lists_flags():
    out = subprocess.run([str(BIN), "serve", "--help"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    missing = [f for f in SERVE_FLAGS if f not in out.stdout]
    assert not missing, f"`ingot serve --help` lacks {missing}"


def test_missing_model_fails_fast():
    p = subprocess.run(
        [str(BIN), "serve", "--model", "/nonexistent/model.gguf", "--host", "127.0.0.1", "--port", "0"],
        capture_output=True, text=True, timeout=60,
    )
    assert p.returncode != 0
    assert "/nonexistent/model.gguf" in p.stderr, p.stderr[-2000:]


def test_not_ready_until_loaded(server_factory, model_name):
    """The listener is up before the model is loaded (~0.7 s here): /health
    is 200 at once, /ready and generation answer 503 until the model is in."""
    srv = server_factory(wait_ready=False)
    with httpx.Client(base_url=srv.url, timeout=10.0) as c:
        assert c.get("/health").status_code == 200
        ready = c.get("/ready").status_code
        gen = c.post("/v1/completions", json={"model": model_name, "prompt": "hi", "max_tokens": 2})
    assert ready == 503, f"/ready answered {ready} right after the listening line (model not loaded yet?)"
    assert gen.status_code == 503, f"a completion before the model is loaded got {gen.status_code}: {gen.text[:300]}"
    assert "error" in gen.json()
    srv.wait_ready()
    with srv.http() as c:
        r = c.post("/v1/completions", json={"model": model_name, "prompt": "The capital of France is", "max_tokens": 4,
                                            "temperature": 0})
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["text"], r.text


def test_sigint_idle_exits_zero(server_factory):
    srv = server_factory()
    rc = srv.stop(signal.SIGINT)
    assert rc == 0, f"exit code {rc} after SIGINT\n{srv.log_tail()}"


def test_graceful_shutdown_finishes_in_flight(server_factory, model_name):
    srv = server_factory("--shutdown-timeout", "60")
    body = {"model": model_name, "messages": [{"role": "user", "content": "Tell me a story about a lighthouse."}],
            "max_tokens": 64, "temperature": 0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}
    with httpx.Client(base_url=srv.url, timeout=120.0) as http:
        with http.stream("POST", "/v1/chat/completions", json=body) as r:
            assert r.status_code == 200
            it = iter_sse_data(r)
            first = [next(it) for _ in range(3)]
            assert "[DONE]" not in first

            srv.send_signal(signal.SIGTERM)
            t_sig = time.monotonic()

            # /ready turns 503 (or the listener is gone); new work is refused.
            with httpx.Client(base_url=srv.url, timeout=5.0) as other:
                ready = None
                while time.monotonic() - t_sig < 5.0:
                    try:
                        ready = other.get("/ready").status_code
                    except httpx.ConnectError:
                        ready = "refused"
                    if ready != 200:
                        break
                    time.sleep(0.02)
                assert ready in (503, "refused"), f"/ready still {ready} 5 s after SIGTERM"
                try:
                    nr = other.post("/v1/chat/completions",
                                    json={"model": model_name, "messages": [{"role": "user", "content": "hi"}],
                                          "max_tokens": 4})
                    new_status = nr.status_code
                    if new_status == 503:
                        json.loads(nr.text)["error"]  # OpenAI-shaped
                except httpx.ConnectError:
                    new_status = "refused"
                except httpx.TimeoutException:
                    new_status = "timeout (connection accepted but never answered)"
                assert new_status in (503, "refused"), f"new request after SIGTERM got {new_status}"

            # the in-flight stream runs to its end
            rest = list(it)
    assert rest and rest[-1] == "[DONE]", f"stream cut: last events {rest[-3:]}"
    chunks = [json.loads(d) for d in first + rest[:-1]]
    finishes = [c["finish_reason"] for ch in chunks for c in ch.get("choices") or [] if c.get("finish_reason")]
    assert finishes == ["length"], finishes
    usage = [ch["usage"] for ch in chunks if ch.get("usage")]
    assert usage and usage[-1]["completion_tokens"] == 64, usage
    rc = srv.wait(timeout=30)
    assert rc == 0, f"exit code {rc} after SIGTERM\n{srv.log_tail()}"


def test_shutdown_timeout_bounds_the_drain(model_name):
    """With --shutdown-timeout 1 a long stream does not keep the process
    alive, and it still ends well-formed: an error event `shutting_down`,
    then [DONE], then the end of the response."""
    srv = Server("--shutdown-timeout", "1")
    try:
        body = {"model": model_name, "prompt": "Once upon a time", "max_tokens": 2000, "temperature": 0,
                "ignore_eos": True, "stream": True}
        with httpx.Client(base_url=srv.url, timeout=60.0) as http:
            with http.stream("POST", "/v1/completions", json=body) as r:
                it = iter_sse_data(r)
                next(it)
                t0 = time.monotonic()
                srv.send_signal(signal.SIGTERM)
                # keep reading in the background so the server can write
                drained = threading.Event()
                payloads: list[str] = []
                failure: list[BaseException] = []

                def drain():
                    try:
                        payloads.extend(it)
                    except Exception as e:  # noqa: BLE001 (asserted below)
                        failure.append(e)
                    drained.set()

                threading.Thread(target=drain, daemon=True).start()
                rc = srv.wait(timeout=15)
                elapsed = time.monotonic() - t0
                assert drained.wait(5), "the stream never ended"
        assert rc == 0, f"exit code {rc}\n{srv.log_tail()}"
        assert elapsed < 8, f"exit took {elapsed:.1f}s with --shutdown-timeout 1"
        assert not failure, f"the stream broke off: {failure[0]!r}; last events {payloads[-2:]}"
        assert payloads[-1] == "[DONE]", payloads[-3:]
        assert json.loads(payloads[-2])["error"]["code"] == "shutting_down", payloads[-2]
    finally:
        srv.kill()


def test_shutdown_drains_queued_requests(server_factory, model_name):
    """Requests still waiting for a slot at SIGTERM are in flight too: they
    run to completion."""
    srv = server_factory("--shutdown-timeout", "60", "--max-num-seqs", "1")
    results: dict[int, object] = {}

    def run(i: int) -> None:
        body = {"model": model_name, "prompt": f"Story {i}: once upon a time", "max_tokens": 32, "temperature": 0,
                "ignore_eos": True, "stream": True}
        try:
            with httpx.Client(base_url=srv.url, timeout=120.0) as c:
                with c.stream("POST", "/v1/completions", json=body) as r:
                    data = list(iter_sse_data(r)) if r.status_code == 200 else [r.read().decode()]
                    results[i] = (r.status_code, data)
        except Exception as e:  # reported below
            results[i] = repr(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 10
    while True:
        m = srv.metrics()
        live = (m.get("ingot_num_requests_running", default=-1), m.get("ingot_num_requests_waiting", default=-1))
        if live == (1, 2):
            break
        assert time.monotonic() < deadline, f"expected 1 running + 2 waiting, got {live}"
        time.sleep(0.01)
    srv.send_signal(signal.SIGTERM)
    for t in threads:
        t.join(timeout=120)
    for i in range(3):
        res = results.get(i)
        assert isinstance(res, tuple) and res[0] == 200, f"request {i}: {res!r}"
        data = res[1]
        assert data[-1] == "[DONE]", f"request {i} cut: {data[-2:]}"
        finishes = [c["finish_reason"] for d in data[:-1] for c in json.loads(d)["choices"] if c.get("finish_reason")]
        assert finishes == ["length"], (i, finishes)
    rc = srv.wait(timeout=30)
    assert rc == 0, f"exit code {rc}\n{srv.log_tail()}"


def test_idle_keepalive_connection_does_not_delay_exit(server_factory, model_name):
    srv = server_factory("--shutdown-timeout", "60")
    with httpx.Client(base_url=srv.url, timeout=30.0) as c:  # keeps its connection open
        r = c.post("/v1/completions", json={"model": model_name, "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200
        t0 = time.monotonic()
        srv.send_signal(signal.SIGTERM)
        rc = srv.wait(timeout=30)
        elapsed = time.monotonic() - t0
    assert rc == 0
    assert elapsed < 5, f"an idle keep-alive connection held the process for {elapsed:.1f}s after SIGTERM"
