"""Greedy output does not depend on what else is in the batch: 16 different
prompts (12 completions, 4 chats) run one at a time, then all at once, give
identical text."""

from __future__ import annotations

import asyncio

import pytest

from ingot_e2e import PeakGauge, running

PROMPTS = [
    "The capital of France is",
    "1, 2, 3, 4,",
    "Once upon a time",
    "The quick brown fox",
    "def fibonacci(n):",
    "The largest planet in the solar system is",
    "In 1492, Columbus",
    "Photosynthesis is the process by which plants",
    "A haiku about the sea:\n",
    "The recipe for pancakes: first,",
    "Q: What is 2 + 2?\nA:",
    "Machine learning is a field of computer science that gives computers the ability to learn without being explicitly programmed. It",
]
CHAT = [
    "What is the capital of France?",
    "Name a fruit that is yellow.",
    "Write one sentence about cats.",
    "What is 3 times 4?",
]


@pytest.fixture(scope="module")
def no_prefix_caching():
    """`--no-prefix-caching`, shared by the tests that need only that."""
    with running("--no-prefix-caching") as srv:
        yield srv


def test_batch_invariance(no_prefix_caching, model_name):
    # No prefix caching: the second pass recomputes every prompt, so the only
    # difference between the passes is the batch composition.
    srv = no_prefix_caching
    sync = srv.openai()

    def run_one(i):
        if i < len(PROMPTS):
            r = sync.completions.create(model=model_name, prompt=PROMPTS[i], max_tokens=16, temperature=0)
            c = r.choices[0]
            return c.text, c.finish_reason, r.usage.completion_tokens
        r = sync.chat.completions.create(
            model=model_name, messages=[{"role": "user", "content": CHAT[i - len(PROMPTS)]}], max_tokens=16, temperature=0
        )
        c = r.choices[0]
        return c.message.content, c.finish_reason, r.usage.completion_tokens

    n = len(PROMPTS) + len(CHAT)
    sequential = [run_one(i) for i in range(n)]
    assert len({s[0] for s in sequential}) == n, "prompts should give distinct outputs"

    # Concurrent pass; sample the running gauge meanwhile to prove a real batch.
    async def run_all():
        client = srv.async_openai()
        try:
            async def one(i):
                if i < len(PROMPTS):
                    r = await client.completions.create(model=model_name, prompt=PROMPTS[i], max_tokens=16, temperature=0)
                    c = r.choices[0]
                    return c.text, c.finish_reason, r.usage.completion_tokens
                r = await client.chat.completions.create(
                    model=model_name,
                    messages=[{"role": "user", "content": CHAT[i - len(PROMPTS)]}],
                    max_tokens=16,
                    temperature=0,
                )
                c = r.choices[0]
                return c.message.content, c.finish_reason, r.usage.completion_tokens

            return await asyncio.gather(*(one(i) for i in range(n)))
        finally:
            await client.close()

    with PeakGauge(srv, "ingot_num_requests_running", 0.01) as running:
        concurrent = asyncio.run(run_all())

    mismatches = [(i, sequential[i], concurrent[i]) for i in range(n) if sequential[i] != concurrent[i]]
    assert not mismatches, "batched output differs from unbatched:\n" + "\n".join(
        f"  #{i}: alone={a!r}\n       batched={b!r}" for i, a, b in mismatches
    )
    assert running.peak >= 4, f"at most {running.peak} requests ran at once; the concurrent pass did not batch"
    # --no-prefix-caching: nothing was served from the cache
    assert srv.metrics().get("ingot_prefix_cache_hits_total", default=0.0) == 0


def test_preemption_invariance(server_factory, model_name):
    """A KV cache too small for the batch forces preemption (recompute); the
    greedy text is still the text of an uncontended run."""
    srv = server_factory("--kv-cache-tokens", "128")
    sync = srv.openai()
    prompts = [f"Write a list of {i + 3} animals:" for i in range(6)]
    kw = dict(model=model_name, max_tokens=32, temperature=0, extra_body={"ignore_eos": True})
    solo = [sync.completions.create(prompt=p, **kw).choices[0].text for p in prompts]
    assert srv.metrics().get("ingot_num_preemptions_total") == 0

    async def run_all():
        client = srv.async_openai()
        try:
            rs = await asyncio.gather(*(client.completions.create(prompt=p, **kw) for p in prompts))
        finally:
            await client.close()
        return [r.choices[0].text for r in rs], [r.usage.completion_tokens for r in rs]

    batched, counts = asyncio.run(run_all())
    assert counts == [32] * len(prompts)
    preemptions = srv.metrics().get("ingot_num_preemptions_total")
    assert preemptions > 0, "6 x 40 tokens in a 128-token KV cache ran without preemption?"
    mismatches = [(i, a, b) for i, (a, b) in enumerate(zip(solo, batched)) if a != b]
    assert not mismatches, f"{preemptions:.0f} preemptions changed outputs:\n" + "\n".join(
        f"  #{i}: alone={a!r}\n       batched={b!r}" for i, a, b in mismatches
    )


def test_chunked_prefill_invariance(no_prefix_caching, server_factory, model_name):
    """A 200-token prompt prefilled in one step (default budget 512) and in
    chunks of at most 32 tokens (--max-num-batched-tokens 32) gives the same
    greedy continuation."""
    prompt = " ".join(f"Line {i}: the {w} jumps over the lazy dog." for i, w in
                      enumerate(["quick", "slow", "brown", "red", "happy", "sad", "old", "young"] * 2))
    prompt += " Summary:"
    texts = []
    for args in ((), ("--max-num-batched-tokens", "32")):
        srv = server_factory("--no-prefix-caching", *args) if args else no_prefix_caching
        with srv.http() as http:
            n = http.post("/tokenize", json={"prompt": prompt}).json()["count"]
            assert n > 160, n
            r = http.post("/v1/completions", json={"model": model_name, "prompt": prompt, "max_tokens": 12, "temperature": 0})
            assert r.status_code == 200, r.text
            texts.append(r.json()["choices"][0]["text"])
        m = srv.metrics()
        if args:
            # every engine step stayed within the 32-token budget
            count = m.get("ingot_iteration_tokens_count")
            bounds = sorted(float(lab["le"]) for name, lab, _ in m.samples if name == "ingot_iteration_tokens_bucket")
            le = next(b for b in bounds if b >= 32)
            within = sum(v for name, lab, v in m.samples
                         if name == "ingot_iteration_tokens_bucket" and float(lab["le"]) == le)
            assert within == count, f"{count - within:.0f} steps had more than {le:g} tokens with --max-num-batched-tokens 32"
            assert count >= n / 32, f"{count:.0f} steps for a {n}-token prompt with a 32-token budget"
        if args:
            srv.stop_and_check()
    assert texts[0] == texts[1], texts
