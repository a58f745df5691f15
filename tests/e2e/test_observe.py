"""Request ids, the access log and the log format, against the real server.

- `x-request-id`: a valid client id is echoed, an invalid or missing one is
  replaced by a fresh UUID-like id, on every answer (200, 400, 404, SSE).
- Every log line of a request carries its id (the `request` span).
- One `ingot::access` line per request at info with status, method, route,
  model, tokens, duration and the cache result.
- `log.format = "json"`: every tracing line is one JSON object.
"""

from __future__ import annotations

import json
import re
import time

import pytest

from ingot_e2e import Server

UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$")
ENV = {"INGOT_LOG": "info,ingot_server=debug"}


def completion(**extra):
    return {"prompt": "Hello", "max_tokens": 3, "temperature": 0, **extra}


def lines_with(srv: Server, needle: str, want: int = 1, timeout: float = 5.0, also: str = "") -> list[str]:
    """Log lines containing `needle` and `also` (waits for at least `want`
    of them)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in list(srv.log) if needle in line and also in line]
        if len(found) >= want or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


@pytest.fixture(scope="module")
def srv():
    s = Server(env=ENV)
    try:
        yield s
    finally:
        s.stop_and_check()


def test_client_id_is_echoed_and_logged(srv):
    rid = "client-id-42 ok~"
    with srv.http() as c:
        r = c.post("/v1/completions", json=completion(), headers={"x-request-id": rid})
    assert r.status_code == 200, r.text
    assert r.headers["x-request-id"] == rid
    # Its access line comes once the response is out: wait for that one
    # (the server's /ready polls logged access lines before it).
    access = lines_with(srv, f"request_id={rid}", want=1, also="ingot::access")
    mine = [line for line in access if "ingot::access" in line]
    assert len(mine) == 1, "\n".join(lines_with(srv, "ingot::access"))
    line = mine[0]
    for field in ("status=200", "method=POST", "route=/v1/completions", "model=",
                  "prompt_tokens=", "completion_tokens=3", "duration_ms=", "cache=", "stream=false"):
        assert field in line, f"{field} missing from {line}"
    # every line of this request carries the id, and none of another request does
    tagged = lines_with(srv, f"request_id={rid}")
    assert tagged and all("request{" in t for t in tagged)


def test_generated_ids_on_success_and_errors(srv):
    with srv.http() as c:
        ok = c.post("/v1/completions", json=completion())
        bad = c.post("/v1/completions", json={"prompt": "x", "max_tokens": -1})
        missing = c.get("/nope")
        wrong_method = c.get("/v1/completions")
        models = c.get("/v1/models")
    assert (ok.status_code, bad.status_code, missing.status_code) == (200, 400, 404)
    ids = []
    for r in (ok, bad, missing, wrong_method, models):
        rid = r.headers.get("x-request-id")
        assert rid and UUID.match(rid), (r.status_code, rid)
        ids.append(rid)
    assert len(set(ids)) == len(ids)
    for rid, status in zip(ids, (200, 400, 404, 405, 200)):
        found = lines_with(srv, f"request_id={rid}")
        access = [line for line in found if "ingot::access" in line]
        assert len(access) == 1, "\n".join(found)
        assert f"status={status}" in access[0]


def test_stream_is_logged_at_its_head(srv):
    rid = "stream-1"
    with srv.http() as c:
        with c.stream("POST", "/v1/chat/completions", headers={"x-request-id": rid},
                      json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3,
                            "stream": True}) as r:
            assert r.status_code == 200
            assert r.headers["x-request-id"] == rid
            body = "".join(r.iter_text())
    assert "[DONE]" in body
    access = [line for line in lines_with(srv, f"request_id={rid}") if "ingot::access" in line]
    assert len(access) == 1
    assert "stream=true" in access[0] and "route=/v1/chat/completions" in access[0]
    assert "prompt_tokens=" in access[0] and "completion_tokens" not in access[0]


def test_json_format(server_factory):
    srv = server_factory(env={**ENV, "INGOT_LOG_FORMAT": "json"})
    rid = "json-req-1"
    with srv.http() as c:
        r = c.post("/v1/completions", json=completion(), headers={"x-request-id": rid})
        assert r.status_code == 200
        assert r.headers["x-request-id"] == rid
        assert c.get("/missing").status_code == 404
    # The start-up /ready probes log access lines too: wait for this test's two.
    deadline = time.monotonic() + 5.0
    while time.monotonic() < deadline:
        mine = [line for line in lines_with(srv, "ingot::access") if '"/ready"' not in line]
        if len(mine) >= 2:
            break
        time.sleep(0.05)
    records = []
    for line in list(srv.log):
        assert line.startswith(("[err] ", "[out] "))
        text = line[6:]
        if text.startswith("{"):
            records.append(json.loads(text))
        else:
            # tracing writes only JSON; other stderr lines are plain prints
            assert not re.match(r"^\d{4}-\d\d-\d\dT", text), text
    access = [r for r in records
              if r.get("target") == "ingot::access" and r["fields"]["route"] != "/ready"]
    assert len(access) == 2, access
    assert {r["fields"]["status"] for r in access} == {200, 404}
    mine = [r for r in access if r.get("span", {}).get("request_id") == rid]
    assert len(mine) == 1, access
    f = mine[0]["fields"]
    assert f["status"] == 200 and f["method"] == "POST" and f["route"] == "/v1/completions"
    assert f["completion_tokens"] == 3 and f["prompt_tokens"] >= 1 and "duration_ms" in f
    assert mine[0]["level"] == "INFO"
    assert any(s.get("request_id") == rid for s in mine[0]["spans"])
