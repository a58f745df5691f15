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
- Sliding-window KV freeing: a prompt several windows long (1,670 tokens,
  tests/fixtures/gemma3/long.json) prefilled in 256-token chunks and decoded
  across further window edges gives the reference's tokens, sent twice (the
  second time from the prefix cache); while it decodes, the KV usage gauge
  shows the sliding layers holding about a window of blocks, well under what
  one shared table would hold.
- The default (native quantized) server answers completions, streams, and
  refuses chat with a 400 that says the model has no chat template.
"""

from __future__ import annotations

import json
import subprocess

import pytest

from ingot_e2e import REPO, Server, assert_error

FIXTURES = REPO / "tests" / "fixtures" / "gemma3" / "expected.json"
LONG = REPO / "tests" / "fixtures" / "gemma3" / "long.json"
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


# The long prompt (965 tokens, past the window) is test_long_prompt_...'s.
@pytest.mark.parametrize("name", ["capitals_list", "multilingual"])
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
    """The 965-token prompt, longer than the window, gives the reference's
    continuation and counts its tokens as the reference does; sent again,
    its blocks come from the prefix cache (K/V of all layers, sliding and
    global), and the continuation is still the reference's."""
    case = next(c for c in cases() if c["name"] == "long_bicycle")
    body = {"model": NAME, "prompt": case["prompt"], "max_tokens": len(case["greedy_ids"]), "temperature": 0,
            "ignore_eos": True}
    with exact.http() as http:
        first = http.post("/v1/completions", json=body, headers={"Cache-Control": "no-cache"})
        again = http.post("/v1/completions", json=body, headers={"Cache-Control": "no-cache"})
    for r in (first, again):
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == case["greedy_text"]
    assert first.json()["usage"]["prompt_tokens"] == len(case["prompt_ids"])
    cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 512, f"the second request reads most of the prompt from the cache ({cached} tokens)"


# The windowed server's KV: 4,096 tokens of all 18 layers = 256 blocks, as
# 1,536 pages of 3 layers (Gemma 3 270M: 3 global layers, 15 sliding in 5
# pages per block; docs/kv-cache.md).
KV_TOKENS, BLOCK, WINDOW = 4096, 16, 512
PAGES = KV_TOKENS // BLOCK * 18 // 3


@pytest.fixture(scope="module")
def windowed():
    gemma_path()
    srv = GemmaServer("--cpu-weights", "f32", "--kv-cache-tokens", str(KV_TOKENS), "--max-num-batched-tokens", "256")
    try:
        yield srv
    finally:
        srv.stop_and_check()


def test_several_windows_long_prompt_matches_the_reference_with_freeing_and_the_prefix_cache(windowed):
    case = json.loads(LONG.read_text())[0]
    assert len(case["prompt_ids"]) > 3 * WINDOW
    body = {"model": NAME, "prompt": case["prompt"], "max_tokens": len(case["greedy_ids"]), "temperature": 0,
            "ignore_eos": True}
    with windowed.http() as http:
        first = http.post("/v1/completions", json=body)
        again = http.post("/v1/completions", json=body)
    for r in (first, again):
        assert r.status_code == 200, r.text
        assert r.json()["choices"][0]["text"] == case["greedy_text"]
    cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (len(case["prompt_ids"]) - 1) // BLOCK * BLOCK, "resumed from the cache in both groups"


def test_a_long_sequence_holds_about_a_window_of_sliding_blocks(windowed):
    """Reads the KV usage gauge while a long prompt decodes: the 3 global
    layers hold every block, the 15 sliding ones about a window's."""
    case = json.loads(LONG.read_text())[0]
    # A distinct prompt (no cache hit) of the same length.
    prompt = "Notes. " + case["prompt"]
    usages = []
    with windowed.openai() as client:
        # 101 tokens: the last gauge reading is after the 100th.
        stream = client.completions.create(model=NAME, prompt=prompt, max_tokens=101, temperature=0, stream=True,
                                           extra_body={"ignore_eos": True})
        for i, _ in enumerate(stream):
            if i in (5, 50, 100):
                usages.append(windowed.metrics().get("ingot_kv_cache_usage_perc"))
    assert len(usages) == 3
    positions = len(case["prompt_ids"]) + 200  # an upper bound with the prefix and decode
    blocks = positions // BLOCK + 1
    windowed_pages = blocks + (WINDOW // BLOCK + 2) * 5
    shared_pages = (len(case["prompt_ids"]) // BLOCK) * 6
    for u in usages:
        held = u * PAGES
        assert held <= windowed_pages, f"{held:.0f} pages held, at most {windowed_pages} expected"
        assert held < shared_pages * 0.6, f"{held:.0f} pages: one shared table would hold {shared_pages}"


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
