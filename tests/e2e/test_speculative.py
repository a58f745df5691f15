"""Speculative decoding (docs/speculative.md) through the real server on the
real SmolLM2: with n-gram proposals on, greedy answers equal the same
server's answers with speculation turned off per request
(`"speculative": false`), for the committed prompt set (repeat, edit,
summarise given text; and prompts with nothing to copy), several requests
at a time; proposals were made and kept; sampled, logprob and constrained
requests run with it; the request field is checked; a draft model keeps the
answers too. The timed comparison is
scripts/bench-speculative (docs/benchmarks.md, "Speculative decoding")."""

from __future__ import annotations

import asyncio
import json
import pathlib

import pytest

from ingot_e2e import Server

ALL = json.loads((pathlib.Path(__file__).resolve().parents[1] / "fixtures/speculative_prompts.json")
                 .read_text())["prompts"]
# CI's share: 14 prompts that copy or edit their input, 6 with nothing to
# copy (the whole set runs in scripts/bench-speculative and on the GPU).
PROMPTS = [p for p in ALL if p["kind"] == "grounded"][:14] + [p for p in ALL if p["kind"] == "free"][:6]
MAX_TOKENS = 16
CONCURRENCY = 8
# Not adaptive: every proposal is made, however little this machine's
# steps gain from it (the cost model is tested in the engine's units).
SPEC = json.dumps({"method": "ngram", "num_speculative_tokens": 5, "disable_by_batch_size": 16,
                   "adaptive": False})


@pytest.fixture(scope="module")
def spec_server():
    # Coalescing off: a request and its copy without speculation must both
    # generate.
    srv = Server("--speculative-config", SPEC, env={"INGOT_FLAG_COALESCING": "off"})
    try:
        yield srv
    finally:
        srv.stop_and_check()


def test_greedy_answers_equal_answers_without_speculation(spec_server, model_name):
    assert len(PROMPTS) >= 20

    async def run_all():
        client = spec_server.async_openai()
        gate = asyncio.Semaphore(CONCURRENCY)

        async def one(prompt: str, speculative: bool) -> str:
            async with gate:
                r = await client.chat.completions.create(
                    model=model_name, messages=[{"role": "user", "content": prompt}], temperature=0,
                    max_tokens=MAX_TOKENS, extra_body={} if speculative else {"speculative": False})
                return r.choices[0].message.content

        try:
            # Without first: the answers with speculation then find their
            # prompts in the prefix cache.
            off = await asyncio.gather(*(one(p["prompt"], False) for p in PROMPTS))
            on = await asyncio.gather(*(one(p["prompt"], True) for p in PROMPTS))
            return list(zip(on, off))
        finally:
            await client.close()

    pairs = asyncio.run(run_all())
    differ = [p["name"] for p, (on, off) in zip(PROMPTS, pairs) if on != off]
    assert not differ, f"answers differ with speculation: {differ}"
    assert len({off for _, off in pairs}) > len(PROMPTS) // 2, "the answers depend on the prompts"
    m = spec_server.metrics()
    proposed = m.get("vllm:spec_decode_num_draft_tokens_total")
    kept = m.get("vllm:spec_decode_num_accepted_tokens_total")
    assert m.get("vllm:spec_decode_num_drafts_total") > 0
    assert 0 < kept <= proposed, (kept, proposed)
    assert m.get("vllm:spec_decode_num_accepted_tokens_per_pos_total", position="0") > 0


def test_sampled_logprob_and_constrained_requests_run_with_proposals(spec_server, model_name):
    client = spec_server.openai()
    copy = next(p["prompt"] for p in ALL if p["name"] == "list-repeat")
    sampled = client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": copy}], temperature=0.7, max_tokens=24,
        logprobs=True, top_logprobs=2)
    tokens = sampled.choices[0].logprobs.content
    assert len(tokens) == sampled.usage.completion_tokens > 0
    assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in tokens)
    schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string"}}},
              "required": ["items"]}
    fmt = {"type": "json_schema", "json_schema": {"name": "list", "schema": schema}}
    prompt = "Give the items of this list as JSON: " + copy
    on, off = (client.chat.completions.create(
        model=model_name, messages=[{"role": "user", "content": prompt}], temperature=0, max_tokens=60,
        response_format=fmt, extra_body=extra).choices[0].message.content
        for extra in ({}, {"speculative": False}))
    assert on == off
    assert isinstance(json.loads(on)["items"], list)


def test_the_speculative_field_is_checked(spec_server, model_name):
    r = spec_server.http().post("/v1/chat/completions", json={
        "model": model_name, "messages": [{"role": "user", "content": "hi"}], "speculative": "yes"})
    assert r.status_code == 400, r.text
    assert "speculative" in r.json()["error"]["message"]


def answers_on_and_off(srv: Server, model_name: str) -> tuple[list[str], list[str]]:
    """Six prompts' greedy answers from `srv` with speculation, then
    without (`"speculative": false`), six at a time."""
    prompts = [p["prompt"] for p in PROMPTS[:3] + PROMPTS[-3:]]

    async def run_all():
        client = srv.async_openai()

        async def one(prompt: str, speculative: bool) -> str:
            r = await client.chat.completions.create(
                model=model_name, messages=[{"role": "user", "content": prompt}], temperature=0,
                max_tokens=MAX_TOKENS, extra_body={} if speculative else {"speculative": False})
            return r.choices[0].message.content

        try:
            off = await asyncio.gather(*(one(p, False) for p in prompts))
            on = await asyncio.gather(*(one(p, True) for p in prompts))
            return on, off
        finally:
            await client.close()

    return asyncio.run(run_all())


def test_a_draft_model_keeps_the_answers(model_name):
    """A draft model (the model itself: every proposal it makes holds),
    through `ingot serve`: greedy answers equal the same server's without
    speculation, several at once, and the metrics count its proposals."""
    from ingot_e2e import model_path

    draft = json.dumps({"method": "draft", "model": model_path(), "num_speculative_tokens": 4,
                        "adaptive": False})
    srv = Server("--speculative-config", draft, env={"INGOT_FLAG_COALESCING": "off"})
    try:
        on, off = answers_on_and_off(srv, model_name)
        assert on == off
        m = srv.metrics()
        proposed = m.get("vllm:spec_decode_num_draft_tokens_total")
        kept = m.get("vllm:spec_decode_num_accepted_tokens_total")
        assert proposed > 0 and kept == proposed, (kept, proposed)
    finally:
        srv.stop_and_check()


def write_eagle3_head(out: pathlib.Path, **overrides) -> str:
    """A random EAGLE-3 head for SmolLM2-135M (tests/reference/eagle3_head.py),
    its draft vocabulary a subset of the target's."""
    import subprocess
    import sys

    shape = {"hidden": 576, "intermediate": 1536, "heads": 9, "kv-heads": 3, "layers": 30,
             "vocab": 49152, "draft-vocab": 8192, "rope-theta": 100000}
    shape.update(overrides)
    script = pathlib.Path(__file__).resolve().parents[1] / "reference/eagle3_head.py"
    args = [f"--{k}={v}" for k, v in shape.items()]
    subprocess.run([sys.executable, str(script), str(out), *args], check=True, capture_output=True)
    return str(out)


def test_an_eagle3_head_keeps_the_answers(model_name, tmp_path):
    """An EAGLE-3 head in the published layout (random weights: its
    proposals are mostly refused), through `ingot serve`: greedy answers
    equal the same server's without speculation, several at once, and the
    metrics count its proposals."""
    head = write_eagle3_head(tmp_path / "head")
    spec = json.dumps({"method": "eagle3", "model": head, "num_speculative_tokens": 3,
                       "adaptive": False})
    srv = Server("--speculative-config", spec, env={"INGOT_FLAG_COALESCING": "off"})
    try:
        on, off = answers_on_and_off(srv, model_name)
        assert on == off
        assert srv.metrics().get("vllm:spec_decode_num_draft_tokens_total") > 0
    finally:
        srv.stop_and_check()


def test_an_eagle3_head_for_another_model_is_refused_at_start(tmp_path):
    """A head of another hidden size stops `ingot serve` before it listens,
    naming the head and what does not fit."""
    import subprocess

    from ingot_e2e import BIN, model_path

    head = write_eagle3_head(tmp_path / "head", **{"hidden": 512, "heads": 8, "kv-heads": 4})
    spec = json.dumps({"method": "eagle3", "model": head})
    r = subprocess.run([str(BIN), "serve", "--model", model_path(), "--port", "0",
                        "--speculative-config", spec], capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert "cannot load the EAGLE-3 head" in r.stderr and "hidden size 512" in r.stderr, r.stderr[-2000:]
