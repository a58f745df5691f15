"""/metrics checked with real Prometheus tooling (Debian's `prometheus`
package, which scripts/test installs): `promtool check metrics` lints a
scrape, and a real Prometheus on loopback scrapes the server and answers
PromQL over ingot's and the vLLM-named series. Also: HTTP answers by route
and status class, rejections by reason, the model labels, and the
`metrics.vllm_names` switch."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import httpx2 as httpx
import pytest

from ingot_e2e import running, wait_for

PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
NEEDS_PROMETHEUS = pytest.mark.needs("prometheus", "promtool", reason="Debian's prometheus package; scripts/test installs it")


def _serve_a_few(srv, model_name: str, n: int = 3, headers: dict[str, str] | None = None) -> None:
    """n completions (one streamed), a chat, and a few refusals."""
    with srv.http(headers=headers or {}) as http:
        for i in range(n):
            body = {"model": model_name, "prompt": f"Count to {i + 3}:", "max_tokens": 6, "temperature": 0}
            r = http.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
        with http.stream("POST", "/v1/completions", json={**body, "stream": True, "prompt": "Hi"}) as r:
            assert r.status_code == 200
            r.read()
        chat = {"model": model_name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
        assert http.post("/v1/chat/completions", json=chat).status_code == 200
        assert http.post("/v1/completions", json={**body, "model": "nope"}).status_code == 404
        assert http.post("/v1/completions", json={**body, "max_tokens": -1}).status_code == 400
        assert http.get("/no/such/route").status_code == 404


@pytest.fixture(scope="module")
def srv():
    """One default server for the module: the tests count what they add
    (deltas between two scrapes)."""
    with running() as s:
        yield s


def _delta(before, after, name: str, **labels: str) -> float:
    return after.get(name, 0.0, **labels) - before.get(name, 0.0, **labels)


def test_http_answers_and_rejections_counted(srv, model_name):
    before = srv.metrics()
    _serve_a_few(srv, model_name)
    m = srv.metrics()
    http = "ingot_http_requests_total"
    assert _delta(before, m, http, route="/v1/completions", status="2xx") == 4
    assert _delta(before, m, http, route="/v1/chat/completions", status="2xx") == 1
    assert _delta(before, m, http, route="/v1/completions", status="4xx") == 2
    # Unmatched paths share one label value: clients cannot grow the series.
    assert _delta(before, m, http, route="other", status="4xx") == 1
    assert not any(lab.get("route") == "/no/such/route" for _, lab, _ in m.samples)
    # The unknown model only: a path no endpoint serves concerns no model.
    assert _delta(before, m, "ingot_rejections_total", reason="not_found") == 1
    assert _delta(before, m, "ingot_rejections_total", reason="validation") == 1
    # Every series carries the served model's name.
    unlabelled = sorted({n for n, lab, _ in m.samples if lab.get("model") != model_name})
    assert not unlabelled, f"series without model={model_name!r}: {unlabelled}"


def test_vllm_names(srv, server_factory, model_name):
    _serve_a_few(srv, model_name, n=2)
    m = srv.metrics()
    vllm = {"model_name": model_name, "engine": "0"}
    assert m.get("vllm:request_success_total", finished_reason="length", **vllm) == m.get(
        "ingot_request_success_total", finish_reason="length")
    assert m.get("vllm:prompt_tokens_total", **vllm) == m.get("ingot_prompt_tokens_total") > 0
    assert m.get("vllm:generation_tokens_total", **vllm) == m.get("ingot_generation_tokens_total") > 0
    assert m.get("vllm:time_to_first_token_seconds_count", **vllm) == m.get("ingot_time_to_first_token_seconds_count")
    assert m.get("vllm:inter_token_latency_seconds_count", **vllm) == m.get("ingot_inter_token_latency_seconds_count")
    assert m.get("vllm:e2e_request_latency_seconds_count", **vllm) >= 4
    assert m.get("vllm:request_queue_time_seconds_count", **vllm) >= 4
    for g in ("vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"):
        assert m.types.get(g) == "gauge", g
        assert m.get(g, **vllm) == 0
    for c in ("vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:num_preemptions_total"):
        assert m.types.get(c) == "counter", c
        assert m.has(c)
    assert m.types.get("vllm:time_to_first_token_seconds") == "histogram"
    # Per-request lengths and phases, as vLLM's dashboard reads them.
    assert m.get("vllm:request_prompt_tokens_sum", **vllm) == m.get("vllm:prompt_tokens_total", **vllm)
    assert m.get("vllm:request_generation_tokens_sum", **vllm) == m.get("vllm:generation_tokens_total", **vllm)
    finished = m.get("vllm:e2e_request_latency_seconds_count", **vllm)
    for h in ("vllm:request_prompt_tokens", "vllm:request_generation_tokens", "vllm:request_max_num_generation_tokens",
              "vllm:request_prefill_time_seconds", "vllm:request_decode_time_seconds"):
        assert m.types.get(h) == "histogram", h
        assert m.get(h + "_count", **vllm) == finished, h
        ingot = h.replace("vllm:", "ingot_").replace("max_num_generation_tokens", "max_tokens")
        assert m.get(ingot + "_count") == finished, ingot

    off = server_factory(env={"INGOT_METRICS_VLLM_NAMES": "false"})
    _serve_a_few(off, model_name, n=1)
    names = off.metrics().names()
    assert not [n for n in names if n.startswith("vllm:")], names
    assert "ingot_request_success_total" in names


@NEEDS_PROMETHEUS
def test_promtool_check_metrics(srv, model_name):
    """promtool lints a scrape of a server that has answered requests;
    the only complaint allowed is the colon of vLLM's own names."""
    _serve_a_few(srv, model_name)
    text = srv.metrics().text
    assert "# HELP ingot_http_requests_total" in text
    p = subprocess.run([PROMTOOL, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    problems = [line for line in (p.stdout + p.stderr).splitlines() if line.strip()]
    other = [line for line in problems if not (line.startswith("vllm:") and line.endswith("should not contain ':'"))]
    assert not other, "promtool check metrics:\n" + "\n".join(problems)
    assert any(line.startswith("vllm:") for line in problems), "expected promtool to note the vllm: colons"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Prometheus:
    """A real Prometheus on loopback scraping one target every second."""

    def __init__(self, target: str, tmp: Path):
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            f"scrape_configs:\n  - job_name: ingot\n    static_configs:\n      - targets: ['{target}']\n"
        )
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.log = open(tmp / "prometheus.log", "w")
        self.proc = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}",
             f"--web.listen-address={self.url.removeprefix('http://')}"],
            stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
        )
        self.tmp = tmp

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        self.log.close()

    def log_tail(self) -> str:
        return (self.tmp / "prometheus.log").read_text()[-3000:]

    def query(self, promql: str) -> list[dict]:
        r = httpx.get(f"{self.url}/api/v1/query", params={"query": promql}, timeout=5)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    def scalar(self, promql: str) -> float | None:
        """The single value of an instant query, None while it has none."""
        try:
            result = self.query(promql)
        except httpx.HTTPError:
            return None
        if len(result) != 1:
            return None
        return float(result[0]["value"][1])


@NEEDS_PROMETHEUS
def test_real_prometheus_scrapes(srv, model_name):
    target = srv.url.removeprefix("http://")
    with tempfile.TemporaryDirectory(prefix="ingot-prom-") as tmp:
        prom = _Prometheus(target, Path(tmp))
        try:
            wait_for(lambda: prom.scalar('up{job="ingot"}') == 1, 60, 0.25,
                     what=f"Prometheus scraping {target}; its log: {prom.log_tail()}")
            before = srv.metrics()
            _serve_a_few(srv, model_name, n=5)
            after = srv.metrics()
            served = after.get("ingot_request_success_total")
            assert _delta(before, after, "ingot_request_success_total") == 7  # 5 + the stream + the chat
            # Wait for a scrape that saw them all (bounded: 1s interval).
            wait_for(lambda: prom.scalar("sum(ingot_request_success_total)") == served, 30, 0.25,
                     what="Prometheus seeing every request")
            wait_for(lambda: prom.scalar("sum(vllm:request_success_total)") == served, 10, 0.25,
                     what="Prometheus seeing the vLLM-named count")
            checks = {
                "ingot p50 TTFT": "histogram_quantile(0.5, sum by (le) (ingot_time_to_first_token_seconds_bucket))",
                "vllm p50 TTFT": "histogram_quantile(0.5, sum by (le) (vllm:time_to_first_token_seconds_bucket))",
            }
            for what, q in checks.items():
                v = prom.scalar(q)
                assert v is not None and 0 < v < 60, f"{what}: {q} = {v}"
            for q in (f'ingot_kv_cache_usage_perc{{model="{model_name}"}}',
                      f'vllm:kv_cache_usage_perc{{model_name="{model_name}"}}'):
                v = prom.scalar(q)
                assert v is not None and 0 <= v <= 1, f"{q} = {v}"
            # What Prometheus holds is what the server counts (the module's
            # earlier tests included), and this test's share is exact.
            # The refusals came after the last answer: wait (bounded) for a
            # scrape taken after them too.
            ok = after.get("ingot_http_requests_total", route="/v1/completions", status="2xx")
            wait_for(lambda: prom.scalar('sum(ingot_http_requests_total{route="/v1/completions",status="2xx"})')
                     == ok, 10, 0.25, what="Prometheus seeing every 2xx completion")
            assert _delta(before, after, "ingot_http_requests_total", route="/v1/completions", status="2xx") == 6
            rejected = after.get("ingot_rejections_total", reason="validation")
            wait_for(lambda: prom.scalar('sum by (reason) (ingot_rejections_total{reason="validation"})') == rejected,
                     10, 0.25, what="Prometheus seeing every validation refusal")
            assert _delta(before, after, "ingot_rejections_total", reason="validation") == 1
            meta = httpx.get(f"{prom.url}/api/v1/metadata", params={"metric": "ingot_request_success_total"},
                             timeout=5).json()
            assert meta["data"]["ingot_request_success_total"][0]["type"] == "counter", json.dumps(meta)
        finally:
            prom.stop()
