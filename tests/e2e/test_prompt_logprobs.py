"""`/v1/completions` with `echo` and `logprobs`: the prompt's own token
logprobs in OpenAI's legacy shape, computed in the prefill pass."""

from __future__ import annotations

import json
import subprocess

from ingot_e2e import BIN, iter_sse_data, model_path

CONTEXT = "The capital of France is"
CONTINUATION = " Paris, a city on the Seine."


def scored(http, model_name, prompt, **kw) -> dict:
    body = {"model": model_name, "prompt": prompt, "echo": True, "logprobs": 2,
            "max_tokens": 0, "temperature": 0, **kw}
    r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def reference() -> dict:
    done = subprocess.run(
        [str(BIN), "generate", "--model", model_path(), "--prompt", CONTEXT, "--score", CONTINUATION],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_prompt_only_answer_has_the_legacy_shape(http, model_name):
    out = scored(http, model_name, CONTEXT + CONTINUATION)
    choice = out["choices"][0]
    assert choice["text"] == CONTEXT + CONTINUATION
    assert choice["finish_reason"] == "length"
    assert out["usage"]["completion_tokens"] == 0
    lp = choice["logprobs"]
    n = out["usage"]["prompt_tokens"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == len(lp["text_offset"]) == n
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert "".join(lp["tokens"]) == choice["text"]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(n)]
    for logprob, top in zip(lp["token_logprobs"][1:], lp["top_logprobs"][1:]):
        assert logprob <= 0 and len(top) == 2
        assert max(top.values()) >= logprob - 1e-6


def test_prompt_logprobs_equal_the_decode_path(http, model_name):
    want = reference()
    out = scored(http, model_name, want["context_ids"] + want["continuation_ids"])
    got = out["choices"][0]["logprobs"]["token_logprobs"][len(want["context_ids"]):]
    assert len(got) == len(want["logprobs"])
    for g, w in zip(got, want["logprobs"]):
        assert abs(g - w) < 1e-4, (got, want["logprobs"])


def test_cached_prefix_does_not_change_the_scores(http, model_name):
    prompt = "A long shared preamble. " * 20 + "Then a question?"
    first = scored(http, model_name, prompt)["choices"][0]["logprobs"]["token_logprobs"]
    # Plain requests fill the prefix cache with this prompt's blocks.
    r = http.post("/v1/completions", json={"model": model_name, "prompt": prompt, "max_tokens": 1})
    assert r.status_code == 200
    again = scored(http, model_name, prompt)
    assert again["choices"][0]["logprobs"]["token_logprobs"] == first
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] == 0


def test_echo_logprobs_with_generation_and_streaming_agree(server, http, model_name):
    body = {"model": model_name, "prompt": CONTEXT, "echo": True, "logprobs": 1,
            "max_tokens": 3, "temperature": 0}
    whole = http.post("/v1/completions", json=body).json()["choices"][0]
    lp = whole["logprobs"]
    n_prompt = len(lp["tokens"]) - 3
    assert lp["token_logprobs"][0] is None
    assert all(isinstance(x, float) for x in lp["token_logprobs"][1:])
    assert lp["text_offset"][n_prompt] == len(CONTEXT), "generated text follows the echo"
    text, tokens, logprobs = "", [], []
    with server.http() as c, c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        for data in iter_sse_data(r):
            if data == "[DONE]":
                break
            choice = json.loads(data)["choices"][0]
            text += choice["text"]
            if choice["logprobs"]:
                tokens += choice["logprobs"]["tokens"]
                logprobs += choice["logprobs"]["token_logprobs"]
    assert text == whole["text"]
    assert tokens == lp["tokens"]
    assert logprobs == lp["token_logprobs"]
