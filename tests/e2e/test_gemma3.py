"""Gemma 3 270M (the second architecture: sliding-window attention, SPM
vocabulary, no chat template) served by the real binary on the CPU. The
runner's exactness on every fixture prompt (logits, greedy tokens, chunked
prefill) is crates/runner-cpu's gemma3_reference test; here is what needs
the server.

- Sliding-window KV freeing through the scheduler, with `--cpu-weights f32`
  (the exact path): a prompt several windows long (1,670 tokens,
  tests/fixtures/gemma3/long.json, from tests/reference/gemma3_reference.py)
  prefilled in 256-token chunks and decoded across further window edges
  gives the reference's text through the official `openai` client, sent
  twice (the second time from the prefix cache in both groups); while it
  first decodes, the KV usage gauge shows the sliding layers holding about a
  window of blocks, well under what one shared table would hold.
- The server tokenizes every fixture prompt (BOS included) as the reference
  tokenizer does (tests/fixtures/gemma3/expected.json).
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
def native():
    gemma_path()
    srv = GemmaServer()
    try:
        yield srv
    finally:
        srv.stop_and_check()


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


def test_several_windows_long_prompt_matches_the_reference_holding_a_window_of_sliding_blocks(windowed):
    """The prompt several windows long, streamed, gives the reference's
    tokens while the KV usage gauge shows the 3 global layers holding every
    block and the 15 sliding ones about a window's; sent again, it resumes
    from the prefix cache in both groups and still gives the reference's
    tokens."""
    case = json.loads(LONG.read_text())[0]
    assert len(case["prompt_ids"]) > 3 * WINDOW
    steps = len(case["greedy_ids"])
    text, usages = [], []
    with windowed.openai() as client:
        stream = client.completions.create(model=NAME, prompt=case["prompt"], max_tokens=steps, temperature=0,
                                           stream=True, extra_body={"ignore_eos": True})
        for i, chunk in enumerate(stream):
            text.append(chunk.choices[0].text if chunk.choices else "")
            if i in (2, steps // 2, steps - 2):
                usages.append(windowed.metrics().get("ingot_kv_cache_usage_perc"))
    assert "".join(text) == case["greedy_text"]
    assert len(usages) == 3
    positions = len(case["prompt_ids"]) + steps
    blocks = positions // BLOCK + 1
    windowed_pages = blocks + (WINDOW // BLOCK + 2) * 5
    shared_pages = (len(case["prompt_ids"]) // BLOCK) * 6
    for u in usages:
        held = u * PAGES
        assert held <= windowed_pages, f"{held:.0f} pages held, at most {windowed_pages} expected"
        assert held < shared_pages * 0.6, f"{held:.0f} pages: one shared table would hold {shared_pages}"
    body = {"model": NAME, "prompt": case["prompt"], "max_tokens": steps, "temperature": 0, "ignore_eos": True}
    with windowed.http() as http:
        again = http.post("/v1/completions", json=body)
    assert again.status_code == 200, again.text
    assert again.json()["choices"][0]["text"] == case["greedy_text"]
    cached = again.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached == (len(case["prompt_ids"]) - 1) // BLOCK * BLOCK, "resumed from the cache in both groups"


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


def test_prompts_are_tokenized_as_the_reference_tokenizer_does(native):
    """/tokenize gives the prompt tokens a completion counts (BOS included),
    for every fixture prompt."""
    with native.http() as http:
        for case in cases():
            r = http.post("/tokenize", json={"model": NAME, "prompt": case["prompt"]})
            assert r.status_code == 200, r.text
            assert r.json()["tokens"] == case["prompt_ids"], case["name"]


def test_chat_without_a_template_is_a_clear_400(native):
    with native.http() as http:
        resp = http.post("/v1/chat/completions", json={"model": NAME, "messages": [{"role": "user", "content": "hi"}]})
        assert_error(resp, 400, message_contains=("no chat template",))
        # The server keeps serving.
        ok = http.post("/v1/completions", json={"model": NAME, "prompt": "Hello", "max_tokens": 2})
        assert ok.status_code == 200, ok.text
