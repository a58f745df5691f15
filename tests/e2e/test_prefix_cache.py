"""Automatic prefix caching: a second request sharing a long prefix reuses
its KV blocks (metrics, usage.cached_tokens) and gets its first token much
sooner; cached and uncached runs give the same greedy text."""

from __future__ import annotations

import json
import random
import statistics
import time

from ingot_e2e import wait_for

SENTENCES = [
    "The river flows quietly past the old mill at the edge of the village.",
    "Every morning the baker opens his shop before the sun rises.",
    "Children walk to school along the narrow path through the forest.",
    "The library holds thousands of books about history and science.",
    "A small boat is tied to the wooden pier near the lighthouse.",
    "Farmers bring fresh vegetables to the market every Saturday.",
    "The mountain behind the town is covered in snow for most of the year.",
    "An old clock tower stands in the middle of the main square.",
    "Musicians play in the park on warm summer evenings.",
    "The museum displays paintings from many different centuries.",
    "Trains arrive at the station every twenty minutes during the day.",
    "A family of ducks lives in the pond behind the church.",
    "The blacksmith repairs tools and horseshoes for the whole valley.",
    "Visitors often climb the hill to watch the sunset over the lake.",
    "The town council meets on the first Monday of every month.",
    "Merchants from distant cities sell silk, spices and glassware.",
    "In winter the streets are lit by lanterns hanging from the houses.",
    "The school teacher organises a play at the end of every year.",
    "A gentle wind carries the smell of pine trees into the streets.",
    "The old bridge was rebuilt after a flood many years ago.",
    "Fishermen return in the evening with baskets full of fish.",
    "The doctor visits the farms in the hills once a week.",
    "On holidays the square is filled with dancing and music.",
    "The postman knows the name of every family in the town.",
]

PREFIX_TOKENS = 320


def tokens(http, text: str) -> int:
    r = http.post("/tokenize", json={"prompt": text})
    assert r.status_code == 200, r.text
    return r.json()["count"]


def make_prefix(http, group: int) -> str:
    rng = random.Random(group)
    pool = SENTENCES[:]
    rng.shuffle(pool)
    text = f"Chronicle number {group} of the valley, written by scribe {group * 7 + 3}."
    i = 0
    while tokens(http, text) < PREFIX_TOKENS:
        text += " " + pool[i % len(pool)]
        i += 1
    return text


def stream_ttft(http, model_name, prompt: str, max_tokens: int = 1):
    """Streams a greedy completion; returns (ttft seconds, text, usage)."""
    body = {"model": model_name, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft = None
    text, usage = "", None
    with http.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line[6:]
            if data == "[DONE]":
                break
            chunk = json.loads(data)
            if chunk.get("choices"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                text += chunk["choices"][0].get("text") or ""
            if chunk.get("usage"):
                usage = chunk["usage"]
    assert ttft is not None, "no content chunk"
    return ttft, text, usage


def test_prefix_cache_hits_and_ttft(server, model_name):
    srv = server
    a_ttft, b_ttft, rows = [], [], []
    with srv.http() as http:
        for group in range(3):
            prefix = make_prefix(http, group)
            n_prefix = tokens(http, prefix)
            assert n_prefix >= 300
            before = srv.metrics()
            ta, _, ua = stream_ttft(http, model_name, prefix + " Question: who keeps the bridge?")
            mid = srv.metrics()
            tb, _, ub = stream_ttft(http, model_name, prefix + " Summary: the town in one line is")
            # The engine publishes its counters after the step that sent
            # the last token: wait (bounded) for that step's.
            cached_b = (ub or {}).get("prompt_tokens_details", {}).get("cached_tokens", 0)
            base = mid.get("ingot_prefix_cache_hits_total", default=0.0)
            wait_for(lambda: srv.metrics().get("ingot_prefix_cache_hits_total", default=0.0) - base >= cached_b,
                     5, what="the step's prefix-cache counters")
            after = srv.metrics()
            hits_a = mid.get("ingot_prefix_cache_hits_total", default=0.0) - before.get("ingot_prefix_cache_hits_total", default=0.0)
            hits_b = after.get("ingot_prefix_cache_hits_total") - mid.get("ingot_prefix_cache_hits_total", default=0.0)
            queries_b = after.get("ingot_prefix_cache_queries_total") - mid.get("ingot_prefix_cache_queries_total", default=0.0)
            rows.append((group, n_prefix, ta, tb, hits_a, hits_b, ua, ub))
            assert hits_a == 0, f"group {group}: a fresh prefix hit the cache ({hits_a} tokens)"
            assert hits_b >= 256, f"group {group}: prefix_cache_hits grew by {hits_b} (< 256) for a {n_prefix}-token shared prefix"
            assert queries_b >= hits_b
            assert ua is not None and ub is not None, "include_usage: no usage chunk"
            assert ua["prompt_tokens_details"]["cached_tokens"] == 0, ua
            assert ub["prompt_tokens_details"]["cached_tokens"] >= 256, ub
            assert ub["prompt_tokens_details"]["cached_tokens"] == hits_b, (ub, hits_b)
            a_ttft.append(ta)
            b_ttft.append(tb)
    ma, mb = statistics.median(a_ttft), statistics.median(b_ttft)
    detail = "\n".join(f"  group {g}: prefix {n} tok, TTFT A {ta*1000:.0f} ms, B {tb*1000:.0f} ms, hits A {ha:.0f} B {hb:.0f}"
                       for g, n, ta, tb, ha, hb, _, _ in rows)
    print(f"\nprefix cache:\n{detail}")
    assert mb < ma / 2, f"cached TTFT median {mb*1000:.0f} ms is not < half of uncached {ma*1000:.0f} ms\n{detail}"


def test_cached_run_matches_uncached(server, model_name):
    srv = server
    with srv.http() as http:
        prompt = make_prefix(http, 42) + " The most important building in the town is"
        _, cold, u1 = stream_ttft(http, model_name, prompt, max_tokens=12)
        _, warm, u2 = stream_ttft(http, model_name, prompt, max_tokens=12)
        assert u1["prompt_tokens_details"]["cached_tokens"] == 0
        assert u2["prompt_tokens_details"]["cached_tokens"] >= 256, u2
        assert u2["prompt_tokens_details"]["cached_tokens"] < u2["prompt_tokens"], u2  # last token is always computed
        assert warm == cold, (cold, warm)
        # and the same through the non-streaming path
        r = http.post("/v1/completions", json={"model": model_name, "prompt": prompt, "max_tokens": 12, "temperature": 0})
        assert r.json()["choices"][0]["text"] == cold
