"""Deterministic mode (issue 19, acceptance 4) on the CPU backend: the greedy
answer of a prompt is the same alone and as 64 concurrent copies mixed with
64 different prompts. Coalescing is off and the response cache is off (its
default), so every copy is generated; the prefix cache stays on and the step
budget is small, so the copies run in different batches, prompt chunks and
from cached blocks. The CPU backend is batch-invariant with or without the
flag; the GPU run of the same check (tests/gpu/deterministic_check.py)
shows the default CUDA path failing it on the 8B dummy."""

from __future__ import annotations

import asyncio

import pytest

from ingot_e2e import PeakGauge

PROMPT = (
    "The history of the old harbour town begins in the year 1200, when fishermen from the north "
    "settled on the rocky shore and built the first stone pier. Over the next three centuries the town"
)
SAME = 64
OTHERS = 64
MAX_TOKENS = 16


def other_prompt(i: int) -> str:
    # Different lengths, so the steps mix chunk sizes and positions.
    return f"Request {i}: write about topic number {(i * 7919) % 1000}" + " and more" * (i % 13)


@pytest.mark.load  # 128 concurrent deterministic requests: ~80 s of a CI core (scripts/test-load)
def test_identical_requests_match_the_batch_1_answer(server_factory, model_name):
    srv = server_factory(
        "--deterministic",
        "--max-num-seqs", "128",
        "--max-num-batched-tokens", "256",
        env={"INGOT_FLAG_COALESCING": "off"},
    )
    assert any("in deterministic mode" in line for line in srv.log), srv.log_tail()
    sync = srv.openai()
    kw = dict(model=model_name, max_tokens=MAX_TOKENS, temperature=0, extra_body={"ignore_eos": True})
    alone = sync.completions.create(prompt=PROMPT, **kw).choices[0].text
    # The answer depends on the prompt: a comparison against it can fail.
    assert sync.completions.create(prompt=PROMPT.replace("1200", "1350"), **kw).choices[0].text != alone

    jobs = []
    for i in range(max(SAME, OTHERS)):
        if i < SAME:
            jobs.append(PROMPT)
        if i < OTHERS:
            jobs.append(other_prompt(i))

    async def run_all():
        client = srv.async_openai()
        try:
            async def one(prompt):
                raw = await client.completions.with_raw_response.create(prompt=prompt, **kw)
                return raw.parse().choices[0].text, raw.headers.get("x-ingot-cache")

            return await asyncio.gather(*(one(p) for p in jobs))
        finally:
            await client.close()

    with PeakGauge(srv, "ingot_num_requests_running", 0.02) as running:
        results = asyncio.run(run_all())

    caches = {h for _, h in results}
    assert caches <= {"bypass", "miss"}, f"answers were shared: {caches}"
    same = [text for (text, _), p in zip(results, jobs) if p == PROMPT]
    differing = [t for t in same if t != alone]
    assert not differing, f"{len(differing)} of {SAME} differ from the batch-1 answer {alone!r}: {differing[0]!r}"
    others = {text for (text, _), p in zip(results, jobs) if p != PROMPT}
    assert len(others) > 1, others
    assert running.peak >= 16, f"at most {running.peak} requests ran at once: the copies did not batch"
    m = srv.metrics()
    # Copies after the first resumed from cached blocks of the prompt.
    assert m.get("ingot_prefix_cache_hits_total", default=0.0) > 0
    # And alone again, from the prefix cache.
    assert sync.completions.create(prompt=PROMPT, **kw).choices[0].text == alone
