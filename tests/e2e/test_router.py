"""`ingot route` in front of real `ingot serve` workers (the SmolLM2 test
model): proxying and streaming through the official `openai` client,
retries of 503s, SIGKILL under load, a SIGSTOPped worker, drain and rolling
restart under load. Two or three workers with small KV caches: CI has two
cores."""

from __future__ import annotations

import http.server
import json
import os
import signal
import time

import pytest

from fleet_load import FleetLoad
from fleet_load import ok as fleet_ok
from ingot_e2e import Router, Server, assert_error, default_model_name, model_path, wait_for

SERVE_ARGS = ("--kv-cache-tokens", "2048", "--max-num-seqs", "8")


@pytest.fixture
def routers(tmp_path):
    started: list[Router] = []

    def start(config: str, *args: str, wait_workers: int | None = None) -> Router:
        model_path()  # fetch outside the startup deadline
        r = Router(tmp_path, config, *args, serve_args=SERVE_ARGS, wait_workers=wait_workers)
        started.append(r)
        return r

    yield start
    for r in started:
        pids = [w["pid"] for w in r.workers() if w["pid"]] if r.proc.poll() is None else []
        rc = r.stop()
        assert rc == 0, f"ingot route exited with {rc}\n{r.log_tail()}"
        wait_for(lambda: not _pids_alive(pids), 30, what="local workers exiting with the router")


def _pids_alive(pids: list[int]) -> list[int]:
    alive = []
    for pid in pids:
        try:
            os.kill(pid, 0)
            alive.append(pid)
        except ProcessLookupError:
            pass
    return alive


def chat(n_tokens: int = 8, stream: bool = False, content: str = "Say hello.") -> dict:
    return {
        "model": default_model_name(),
        "messages": [{"role": "user", "content": content}],
        "max_tokens": n_tokens,
        "temperature": 0,
        "stream": stream,
    }


def Load(url: str, concurrency: int, n_tokens: int = 24) -> FleetLoad:
    """Streaming requests at a fixed concurrency on a background thread until
    stopped; every result is kept."""
    return FleetLoad(url, concurrency, n_tokens=n_tokens, content=lambda i, k: f"Count to ten. ({i}.{k})")


def ok(res: dict) -> bool:
    return fleet_ok(res) and res["chunks"] > 0


def test_proxies_and_streams_through_the_openai_client(routers):
    r = routers('policy = "round_robin"\n[workers]\nlocal = 2\n', wait_workers=2)
    client = r.openai()
    models = client.models.list()
    assert [m.id for m in models.data] == [default_model_name()]

    out = client.chat.completions.create(**{k: v for k, v in chat(8).items() if k != "stream"})
    assert out.choices[0].message.content
    assert out.usage.completion_tokens > 0

    pieces = []
    for chunk in client.chat.completions.create(**{**chat(16), "stream": True}):
        if chunk.choices and chunk.choices[0].delta.content:
            pieces.append(chunk.choices[0].delta.content)
    assert len(pieces) > 1, "a stream arrives in several chunks"

    done = client.completions.create(model=default_model_name(), prompt="Hello", max_tokens=4)
    assert done.choices[0].text is not None

    # The Responses API: a stored response lives on one worker; continuing
    # it and retrieving it find that worker whatever round robin says.
    first = client.responses.create(model=default_model_name(), input="Say hello.", max_output_tokens=4, temperature=0)
    for _ in range(2):
        more = client.responses.create(model=default_model_name(), previous_response_id=first.id, input="Again.",
                                       max_output_tokens=2, temperature=0, store=False)
        assert more.previous_response_id == first.id
    assert client.responses.retrieve(first.id).output_text == first.output_text

    # Round-robin spreads requests over both workers (the header names them).
    with r.http() as h:
        seen = {h.post("/v1/chat/completions", json=chat(2)).headers["x-ingot-worker"] for _ in range(4)}
        assert seen == {"local-0", "local-1"}
        assert_error(h.post("/v1/chat/completions", json={**chat(2), "model": "nope"}), 404,
                     code="model_not_found")
        assert_error(h.post("/v1/chat/completions", content=b"{not json"), 400)
        assert h.get("/health").status_code == 200
        assert h.get("/ready").status_code == 200
    m = r.metrics()
    total = sum(m.get("ingot_router_requests_total", 0, worker=w, policy="round_robin", status="200")
                for w in ("local-0", "local-1"))
    assert total >= 7


class _Always503(http.server.BaseHTTPRequestHandler):
    """A worker that is "ready" and lists the model, but refuses every request."""

    def do_GET(self):
        if self.path == "/ready":
            self._send(200, b'{"status":"ready"}')
        elif self.path == "/v1/models":
            body = {"object": "list", "data": [{"id": default_model_name(), "object": "model"}]}
            self._send(200, json.dumps(body).encode())
        else:
            self._send(404, b"{}")

    def do_POST(self):
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.server.posts += 1
        self._send(503, b'{"error":{"message":"overloaded","type":"server_error","param":null,"code":null}}')

    def _send(self, status, body):
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a):
        pass


def test_sigkill_under_load_fails_only_streams_already_started(routers):
    """Acceptance 1: three local workers under 16 concurrent streams; one is
    SIGKILLed mid-stream. Bounded: everything after the workers are up must
    finish within 60 s on a loaded 2-core machine (short streams)."""
    cfg = ('[workers]\nlocal = 3\nrestart_backoff = "200ms"\n'
           '[breaker]\nfailure_threshold = 2\ncooldown = "1s"\n'
           '[health]\ninterval = "250ms"\ntimeout = "1s"\n')
    r = routers(cfg, wait_workers=3)
    victim = r.workers()[0]
    t0 = time.monotonic()
    left = lambda: max(1.0, 60.0 - (time.monotonic() - t0))  # noqa: E731
    load = Load(r.url, concurrency=16, n_tokens=24)
    try:
        # Kill while streams are in flight on the victim.
        wait_for(lambda: len(load.results) >= 16 and r.workers()[0]["outstanding"] > 0, left(),
                 interval=0.05, what="load on worker 0")
        os.kill(victim["pid"], signal.SIGKILL)
        wait_for(lambda: r.workers()[0]["breaker"] != "closed" or r.workers()[0]["restarts"] > 0, left(),
                 what="the router noticing the kill")
        n_at_kill = len(load.results)
        wait_for(lambda: len(load.results) >= n_at_kill + 32, left(), what="load after the kill")
    finally:
        results = load.stop(timeout=left())
    failed = [x for x in results if not ok(x)]
    # Every failure is a stream that had started, ended by an error event and [DONE].
    for x in failed:
        assert x["status"] == 200 and x["chunks"] > 0, f"a request failed before streaming: {x}"
        assert x["done"] and x["error"]["code"] == "worker_failed_mid_stream", x
    assert len(results) - len(failed) >= 32
    m = r.metrics()
    # The kill came while streams were running on the victim: at least one
    # was cut mid-stream (and counted), none of them silently retried.
    assert m.get("ingot_router_streams_interrupted_total", 0, worker="local-0") >= 1
    assert len(failed) == m.get("ingot_router_streams_interrupted_total", 0, worker="local-0")
    assert m.get("ingot_router_breaker_opens_total", worker="local-0") >= 1
    # The supervisor restarts it; a probe closes the breaker again.
    ws = r.wait_workers(3, timeout=left())
    assert ws[0]["pid"] != victim["pid"] and ws[0]["restarts"] >= 1 and ws[0]["breaker"] == "closed"
    with r.http() as h:
        for _ in range(3):
            assert h.post("/v1/chat/completions", json=chat(2)).status_code == 200
    assert time.monotonic() - t0 < 60.0


def test_rolling_restart_under_load_fails_nothing(routers):
    r = routers('[workers]\nlocal = 2\n', wait_workers=2)
    before = {w["label"]: w["pid"] for w in r.workers()}
    load = Load(r.url, concurrency=4, n_tokens=16)
    try:
        wait_for(lambda: len(load.results) >= 4, 120, what="load")
        with r.http(timeout=600) as h:
            resp = h.post("/admin/restart")
        assert resp.status_code == 200, resp.text
        n = len(load.results)
        wait_for(lambda: len(load.results) >= n + 4, 120, what="load after the restart")
    finally:
        results = load.stop()
    failed = [x for x in results if not ok(x)]
    assert not failed, f"{len(failed)} of {len(results)} failed: {failed[:3]}"
    after = {w["label"]: w["pid"] for w in r.workers()}
    assert all(after[k] != before[k] for k in before), (before, after)


def test_route_refuses_a_bad_config(tmp_path):
    from ingot_e2e import BIN
    import subprocess

    cfg = tmp_path / "router.toml"
    cfg.write_text("[workers]\nurls = [\"http://127.0.0.1:1\"]\nbogus = 1\n")
    out = subprocess.run([str(BIN), "route", "--config", str(cfg), "--check"], capture_output=True, text=True)
    assert out.returncode == 1 and "unknown field `bogus`" in out.stderr, out.stderr
    cfg.write_text("[workers]\nurls = [\"http://127.0.0.1:1\"]\n[retry]\nbudget_ratio = 2.0\n")
    out = subprocess.run([str(BIN), "route", "--config", str(cfg), "--check"], capture_output=True, text=True)
    assert out.returncode == 1 and "retry.budget_ratio" in out.stderr, out.stderr
    cfg.write_text("[workers]\nurls = [\"http://127.0.0.1:1\"]\n")
    out = subprocess.run([str(BIN), "route", "--config", str(cfg), "--check"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_worker_load_is_scraped_from_its_metrics(routers):
    r = routers('[workers]\nlocal = 2\n[health]\ninterval = "200ms"\n', wait_workers=2)
    idle = {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0, "others": 0.0}
    assert all(w["load"] == idle for w in r.workers())
    load = Load(r.url, concurrency=4, n_tokens=64)
    try:
        busy = wait_for(lambda: [w for w in r.workers() if w["load"]["running"] > 0], 60,
                        what="a worker reporting running requests")
        assert busy[0]["load"]["kv_usage"] > 0, busy
        # This router is the workers' only client: what it scraped is its
        # own requests, so the others' share stays near 0 (a scrape can
        # lag its own count by the requests that finished meanwhile).
        assert all(w["load"]["others"] <= 4 for w in r.workers()), r.workers()
    finally:
        results = load.stop()
    assert all(ok(x) for x in results)
    ws = r.workers()
    assert all(w["ttft_ewma_s"] and w["ttft_ewma_s"] > 0 for w in ws), ws


def _selections(r: Router, label: str) -> float:
    return r.metrics().get("ingot_router_selections_total", 0, worker=label)


def test_file_discovery_adds_and_drains_workers(routers, tmp_path):
    """`workers.file`: a worker URL added to the file while the router runs
    enters rotation; one removed is drained (its in-flight streams finish,
    no new request goes to it)."""
    a, b = Server(*SERVE_ARGS), Server(*SERVE_ARGS)
    try:
        urls = tmp_path / "workers.txt"
        urls.write_text(f"# discovered workers\n{a.url}\n")
        r = routers(f'[workers]\nfile = "{urls}"\n[discovery]\ninterval = "200ms"\n'
                    '[health]\ninterval = "250ms"\n', wait_workers=1)
        assert [w["url"] for w in r.workers()] == [a.url]
        urls.write_text(f"{a.url}\n{b.url}\n")
        r.wait_workers(2, timeout=30)
        load = Load(r.url, concurrency=4, n_tokens=32)
        try:
            wait_for(lambda: _selections(r, a.url) >= 2 and _selections(r, b.url) >= 2, 60,
                     what="load on both workers")
            wait_for(lambda: r.workers()[0]["outstanding"] > 0, 30, interval=0.02, what="a stream on worker a")
            urls.write_text(f"{b.url}\n")
            wait_for(lambda: r.workers()[0]["removed"], 10, interval=0.05, what="worker a removed")
            wait_for(lambda: r.workers()[0]["outstanding"] == 0, 60, what="worker a drained")
            after = _selections(r, a.url)
            n = len(load.results)
            wait_for(lambda: len(load.results) >= n + 8, 60, what="load after the removal")
        finally:
            results = load.stop()
        assert [x for x in results if not ok(x)] == [], "a drained worker's streams must finish"
        assert _selections(r, a.url) == after, "no new request goes to a removed worker"
        ws = {w["url"]: w for w in r.workers()}
        assert ws[a.url]["removed"] and not ws[b.url]["removed"]
        # Listed again, it comes back (same id: ids are stable).
        urls.write_text(f"{a.url}\n{b.url}\n")
        wait_for(lambda: not r.workers()[0]["removed"], 10, what="worker a back")
    finally:
        a.stop()
        b.stop()


def test_dns_discovery_resolves_each_address_to_a_worker(routers):
    """`workers.dns = ["localhost:PORT"]`: the name resolves (127.0.0.1, and
    ::1 where the resolver lists it: that address has no listener and stays
    out of rotation) and requests are served by the resolved worker."""
    a = Server(*SERVE_ARGS)
    try:
        r = routers(f'[workers]\ndns = ["localhost:{a.port}"]\n[discovery]\ninterval = "200ms"\n'
                    '[health]\ninterval = "250ms"\n', wait_workers=1)
        ws = r.workers()
        assert f"http://127.0.0.1:{a.port}" in [w["url"] for w in ws]
        assert all(w["discovered"] for w in ws)
        healthy = [w["url"] for w in ws if w["healthy"]]
        assert healthy == [f"http://127.0.0.1:{a.port}"], ws
        with r.http() as h:
            resp = h.post("/v1/chat/completions", json=chat(2))
            assert resp.status_code == 200, resp.text
            assert resp.headers["x-ingot-worker"] == f"http://127.0.0.1:{a.port}"
    finally:
        a.stop()
