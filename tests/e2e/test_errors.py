"""Error responses: HTTP status and the OpenAI error body
`{"error": {"message", "type", "param", "code"}}`."""

from __future__ import annotations

from ingot_e2e import assert_error

INVALID = "invalid_request_error"
MESSAGES = [{"role": "user", "content": "What is the capital of France?"}]


def chat_body(model_name, **kw):
    return {"model": model_name, "messages": MESSAGES, "max_tokens": 4, "temperature": 0, **kw}


def test_token_id_out_of_vocabulary(http, model_name):
    r = http.post("/v1/completions", json={"model": model_name, "prompt": [1, 2, 10_000_000], "max_tokens": 2})
    assert_error(r, 400, INVALID, param="prompt", message_contains=("10000000",))


def test_context_length_exceeded_default(http, model_name):
    max_len = http.post("/tokenize", json={"prompt": "hi"}).json()["max_model_len"]
    r = http.post("/v1/chat/completions", json=chat_body(model_name, max_tokens=max_len))
    assert_error(r, 400, INVALID, code="context_length_exceeded", message_contains=(str(max_len),))


def test_still_serves_after_errors(client, model_name):
    r = client.chat.completions.create(model=model_name, messages=MESSAGES, max_tokens=16, temperature=0)
    assert "Paris" in r.choices[0].message.content


def test_context_length_small_server(server_factory, model_name):
    srv = server_factory("--max-model-len", "128")
    with srv.http() as http:
        t = http.post("/tokenize", json={"prompt": "hello " * 300}).json()
        assert t["max_model_len"] == 128, t["max_model_len"]
        ids = t["tokens"][:120]
        assert len(ids) == 120
        body = {"model": model_name, "prompt": ids, "temperature": 0}
        # prompt + max_tokens == max_model_len is allowed ...
        r = http.post("/v1/completions", json={**body, "max_tokens": 8})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["prompt_tokens"] == 120
        # ... one more is not
        r = http.post("/v1/completions", json={**body, "max_tokens": 9})
        assert_error(r, 400, INVALID, code="context_length_exceeded", message_contains=("128",))
        # a prompt longer than the context
        r = http.post("/v1/completions", json={"model": model_name, "prompt": "hello " * 300, "max_tokens": 1})
        assert_error(r, 400, INVALID, code="context_length_exceeded")
        r = http.post(
            "/v1/chat/completions",
            json={"model": model_name, "messages": [{"role": "user", "content": "hello " * 300}], "max_tokens": 1},
        )
        assert_error(r, 400, INVALID, code="context_length_exceeded")
        # without max_tokens the default fits the remaining context
        r = http.post("/v1/completions", json={"model": model_name, "prompt": ids, "temperature": 0})
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] <= 8
        # still serving
        r = http.post("/v1/completions", json={"model": model_name, "prompt": "The capital of France is", "max_tokens": 4,
                                               "temperature": 0})
        assert r.status_code == 200 and "Paris" in r.json()["choices"][0]["text"], r.text


def test_body_too_large(server_factory, model_name):
    srv = server_factory("--max-body-bytes", "1000")
    with srv.http() as http:
        big = {"model": model_name, "messages": [{"role": "user", "content": "x" * 2000}], "max_tokens": 2}
        r = http.post("/v1/chat/completions", json=big)
        assert_error(r, 413)

        # same without a Content-Length (chunked upload)
        import json

        payload = json.dumps(big).encode()

        def chunks():
            for i in range(0, len(payload), 256):
                yield payload[i : i + 256]

        r = http.post("/v1/chat/completions", content=chunks(), headers={"content-type": "application/json"})
        assert_error(r, 413)

        # a body under the limit is served, and so is the next request
        small = {"model": model_name, "messages": [{"role": "user", "content": "What is the capital of France?"}],
                 "max_tokens": 16, "temperature": 0}
        assert len(json.dumps(small)) < 1000
        r = http.post("/v1/chat/completions", json=small)
        assert r.status_code == 200, r.text
        assert "Paris" in r.json()["choices"][0]["message"]["content"]

