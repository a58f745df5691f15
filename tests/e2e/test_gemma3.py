"""Gemma 3 270M (the second architecture: sliding-window attention, SPM
vocabulary, no chat template) served by the real binary on the CPU.

- With `--cpu-weights f32` (the exact path), greedy /v1/completions through
  the official `openai` client give the numpy reference's continuations
  (tests/fixtures/gemma3/expected.json, from tests/reference/
  gemma3_reference.py), token for token, for two short prompts and the one
  longer than the 512-token window, and count the prompt's tokens (BOS
  included) as the reference tokenizer does.
- The long prompt sent twice reads its KV from the prefix cache the second
  time and still gives the reference's tokens.
- The default (native quantized) server answers completions, streams, and
  refuses chat with a 400 that says the model has no chat template.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from ingot_e2e import REPO, Server, assert_error

FIXTURES = REPO / "tests" / "fixtures" / "gemma3" / "expected.json"
NAME = "gemma3"


def gemma_path() -> str:
    out = subprocess.run([str(REPO / "scripts" / "fetch-gemma3-gguf")], check=True, capture_output=True, text=True)
    return out.stdout.strip().splitlines()[-1]


class GemmaServer(Server):
    def command(self, *extra_args: str) -> list[str]:
        cmd = super().command("--served-model-name", NAME, "--device", "cpu", *extra_args)
        cmd[cmd.index("--model") + 1] = gemma_path()
        return cmd


def cases() -> list[dict]:
    return json.loads(FIXTURES.read_text())


@pytest.fixture(scope="module")
def exact():
    gemma_path()  # fetch outside the server's startup deadline
    srv = GemmaServer("--cpu-weights", "f32")
    try:
        yield srv
    finally:
        srv.stop_and_check()


@pytest.fixture(scope="module")
def native():
    gemma_path()
    srv = GemmaServer()
    try:
        yield srv
    finally:
        srv.stop_and_check()


@pytest.mark.parametrize("name", ["capitals_list", "multilingual", "long_bicycle"])
def test_f32_completions_match_the_reference(exact, name):
    case = next(c for c in cases() if c["name"] == name)
    with exact.openai() as client:
        r = client.completions.create(
            model=NAME,
            prompt=case["prompt"],
            max_tokens=len(case["greedy_ids"]),
            temperature=0,
            extra_body={"ignore_eos": True},
        )
    assert r.usage.prompt_tokens == len(case["prompt_ids"]), "prompt tokens (BOS included) as the reference counts"
    assert r.usage.completion_tokens == len(case["greedy_ids"])
    assert r.choices[0].text == case["greedy_text"]


def test_long_prompt_from_the_prefix_cache_gives_the_same_tokens(exact):
    """The 965-token prompt again: its blocks now come from the prefix cache
    (K/V of all layers, sliding and global), and the continuation is still
    the reference's."""
    case = next(c for c in cases() if c["name"] == "long_bicycle")
    body = {"model": NAME, "prompt": case["prompt"], "max_tokens": len(case["greedy_ids"]), "temperature": 0,
            "ignore_eos": True}
    with exact.http() as http:
        first = http.post("/v1/completions", json=body, headers={"Cache-Control": "no-cache"})
        again = http.post("/v1/completions", json=body, headers={"Cache-Control": "no-cache"})
    for r in (first, again):
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == case["greedy_text"]
    cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 512, f"the second request reads most of the prompt from the cache ({cached} tokens)"


def test_native_server_completes_and_streams(native):
    with native.openai() as client:
        r = client.completions.create(
            model=NAME, prompt="The capital of France is Paris. The capital of Germany is", max_tokens=4, temperature=0
        )
        assert "Berlin" in r.choices[0].text
        chunks = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=8, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        streamed = "".join(c.choices[0].text for c in chunks if c.choices)
        again = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=8, temperature=0,
                                          extra_body={"ignore_eos": True})
        assert streamed and streamed == again.choices[0].text


def test_chat_without_a_template_is_a_clear_400(native):
    with native.http() as http:
        resp = http.post("/v1/chat/completions", json={"model": NAME, "messages": [{"role": "user", "content": "hi"}]})
        assert_error(resp, 400, message_contains=("no chat template",))
        # The server keeps serving.
        ok = http.post("/v1/completions", json={"model": NAME, "prompt": "Hello", "max_tokens": 2})
        assert ok.status_code == 200, ok.text
