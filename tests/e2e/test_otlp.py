"""OpenTelemetry export, checked with a real OTLP/HTTP receiver.

The receiver decodes POST /v1/traces bodies with the official OTLP protobuf
definitions (`opentelemetry-proto`) and keeps every span. The server, with
`[tracing] otlp_endpoint` pointing at it, must export a `request` span per
request (a child of an incoming W3C `traceparent`, in its trace) with child
spans for tokenization, submission, generation and streaming, and the
engine's phases (queue, prefill, decode) in order within it.
"""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


class Receiver:
    def __init__(self):
        self.spans: list[dict] = []
        self.resources: list[dict] = []
        self.lock = threading.Lock()
        spans, resources, lock = self.spans, self.resources, self.lock

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", "0")))
                if self.path != "/v1/traces":
                    self.send_response(404)
                    self.end_headers()
                    return
                req = ExportTraceServiceRequest()
                req.ParseFromString(body)
                with lock:
                    for rs in req.resource_spans:
                        resources.append({a.key: a.value.string_value for a in rs.resource.attributes})
                        for ss in rs.scope_spans:
                            for s in ss.spans:
                                spans.append({
                                    "name": s.name,
                                    "trace_id": s.trace_id.hex(),
                                    "span_id": s.span_id.hex(),
                                    "parent": s.parent_span_id.hex(),
                                    "start": s.start_time_unix_nano,
                                    "end": s.end_time_unix_nano,
                                    "attrs": {a.key: a.value.string_value or a.value.int_value
                                              for a in s.attributes},
                                })
                out = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("content-type", "application/x-protobuf")
                self.send_header("content-length", str(len(out)))
                self.end_headers()
                self.wfile.write(out)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def receiver():
    r = Receiver()
    yield r
    r.close()


def request_span(spans, request_id):
    found = [s for s in spans if s["name"] == "request" and s["attrs"].get("request_id") == request_id]
    assert len(found) == 1, spans
    return found[0]


def children(spans, parent):
    return {s["name"]: s for s in spans if s["parent"] == parent["span_id"]}


def test_request_spans_follow_traceparent(server_factory, receiver):
    srv = server_factory(env={"INGOT_TRACING_OTLP_ENDPOINT": receiver.url,
                              "INGOT_TRACING_SERVICE_NAME": "ingot-test"})
    with srv.http() as c:
        r = c.post("/v1/completions",
                   json={"prompt": "Hello", "max_tokens": 3, "temperature": 0},
                   headers={"x-request-id": "otlp-1",
                            "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"})
        assert r.status_code == 200, r.text
        with c.stream("POST", "/v1/chat/completions", headers={"x-request-id": "otlp-2"},
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                            "stream": True}) as s:
            assert s.status_code == 200
            assert "[DONE]" in "".join(s.iter_text())
    srv.stop_and_check()  # flushes the exporter
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and len(receiver.spans) < 2:
        time.sleep(0.05)
    spans = list(receiver.spans)
    assert any(r.get("service.name") == "ingot-test" for r in receiver.resources), receiver.resources

    first = request_span(spans, "otlp-1")
    assert first["trace_id"] == TRACE_ID
    assert first["parent"] == PARENT_ID
    kids = children(spans, first)
    for name in ("tokenize", "submit", "generate", "queue", "prefill", "decode"):
        assert name in kids, (name, spans)
        assert kids[name]["trace_id"] == TRACE_ID
    assert_engine_phases(first, kids)

    second = request_span(spans, "otlp-2")
    assert second["trace_id"] != TRACE_ID and second["parent"] == ""
    kids = children(spans, second)
    for name in ("tokenize", "submit", "stream", "queue", "prefill", "decode"):
        assert name in kids, (name, spans)
        assert kids[name]["trace_id"] == second["trace_id"]
    assert_engine_phases(second, kids)


def assert_engine_phases(request, kids):
    """queue, prefill and decode follow each other inside the request."""
    q, p, d = kids["queue"], kids["prefill"], kids["decode"]
    slack = 2_000_000  # 2 ms: the phases' clock is read apart from the span's
    assert request["start"] - slack <= q["start"] <= q["end"] <= p["start"] + slack, (request, q, p)
    assert p["start"] <= p["end"] <= d["start"] + slack and d["start"] <= d["end"], (p, d)
    assert d["end"] <= request["end"] + slack, (d, request)


def test_sample_ratio_zero_exports_nothing_new(server_factory, receiver):
    srv = server_factory(env={"INGOT_TRACING_OTLP_ENDPOINT": receiver.url,
                              "INGOT_TRACING_SAMPLE_RATIO": "0"})
    with srv.http() as c:
        assert c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1},
                      headers={"x-request-id": "unsampled"}).status_code == 200
        # a sampled parent is followed whatever the ratio
        assert c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 1},
                      headers={"x-request-id": "sampled-parent",
                               "traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}).status_code == 200
    srv.stop_and_check()
    names = {(s["name"], s["attrs"].get("request_id")) for s in receiver.spans}
    assert ("request", "unsampled") not in names
    assert ("request", "sampled-parent") in names


def test_an_unreachable_receiver_costs_no_request(server_factory):
    """The OTLP receiver down (nothing listens on its port): every request
    is still answered, and the server still stops cleanly on SIGTERM."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    srv = server_factory(env={"INGOT_TRACING_OTLP_ENDPOINT": dead})
    with srv.http() as c:
        for i in range(5):
            r = c.post("/v1/completions", json={"prompt": f"Count {i}", "max_tokens": 3, "temperature": 0})
            assert r.status_code == 200, r.text
            assert r.json()["choices"][0]["finish_reason"] in ("length", "stop")
    t0 = time.monotonic()
    srv.stop_and_check()
    assert time.monotonic() - t0 < 20, "shutdown waited too long on the dead exporter"
