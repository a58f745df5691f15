#!/usr/bin/env python3
"""Embeddings beside decode, on one `ingot serve` (issue 14, acceptance 3).

Serves the default generative model (SmolLM2) and all-MiniLM-L6-v2 from one
process, then:
1. decode alone: 8 concurrent chat streams; every stream's inter-token
   latencies (ITL) recorded;
2. decode with embeddings: the same 8 streams while 64 concurrent embedding
   requests run (each of 8 sentences, resubmitted until the streams end;
   sent by a separate client process at nice 19, so the client's own JSON
   work does not delay the loop that times the streams);
3. embeddings alone: throughput in sentences/s (64 concurrent requests of
   8 sentences each, 1024 sentences).
Phases 1 and 2 alternate for `--rounds` rounds. Prints each stream's ITL
p99 in phases 1 and 2 per round, then per stream the median over rounds,
alone and beside the embeddings, and its growth; then the throughput.
With `--st-python PY` (a Python with sentence-transformers, e.g. a
throwaway venv) it also times `SentenceTransformer.encode` on the same
1024 sentences in the same run. Run it under the exclusive lock so nothing
else competes:

    flock -x /tmp/ingot-quiet.lock scripts/bench-embeddings.py --bin target/debug/ingot
"""
from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests" / "e2e"))

STREAMS = 8
EMBED_CONCURRENCY = 64
SENTENCES_PER_REQUEST = 8
MAX_TOKENS = 384  # p99 of ~383 gaps; at 96 it was the single largest gap
WORDS = ("the model server token cache batch river mountain quickly bright engine learning vector "
         "sentence meaning language window garden music theory coffee tomorrow because paris").split()


def sentence(rng: random.Random) -> str:
    return " ".join(rng.choices(WORDS, k=rng.randint(8, 30))) + "."


async def stream_itls(client, model: str, prompt: str) -> list[float]:
    """One chat stream's gaps between content chunks, in seconds."""
    gaps, last = [], None
    stream = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": prompt}], max_tokens=MAX_TOKENS,
        temperature=0, stream=True, extra_body={"ignore_eos": True},
    )
    async for chunk in stream:
        if not chunk.choices or not chunk.choices[0].delta.content:
            continue
        now = time.perf_counter()
        if last is not None:
            gaps.append(now - last)
        last = now
    return gaps


def p99(xs: list[float]) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(0.99 * len(xs)))]


def embedding_load(url: str, embed: str, stop, done) -> None:
    """64 concurrent embedding requests, resubmitted until `stop` is set.
    Its own process at nice 19: the load generator shares the server's two
    cores, and its JSON work must not delay the loop that times the
    streams (the server's threads keep their priorities)."""
    os.nice(19)
    import openai

    async def go():
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="EMPTY", max_retries=0, timeout=600)

        async def one(seed: int):
            rng = random.Random(seed)
            while not stop.is_set():
                batch = [sentence(rng) for _ in range(SENTENCES_PER_REQUEST)]
                await client.embeddings.create(model=embed, input=batch, encoding_format="base64")
                with done.get_lock():
                    done.value += len(batch)

        await asyncio.gather(*(one(i) for i in range(EMBED_CONCURRENCY)))
        await client.close()

    asyncio.run(go())


async def decode_phase(client, url: str, model: str, embed: str | None) -> tuple[list[float], int]:
    ctx = multiprocessing.get_context("spawn")
    stop, done = ctx.Event(), ctx.Value("i", 0)
    load = ctx.Process(target=embedding_load, args=(url, embed, stop, done)) if embed else None
    if load:
        load.start()
        # The embedding load is running before the streams start.
        while done.value < EMBED_CONCURRENCY:
            await asyncio.sleep(0.1)
    prompts = [f"Write a long story about {w}." for w in WORDS[:STREAMS]]
    itls = await asyncio.gather(*(stream_itls(client, model, p) for p in prompts))
    n = done.value
    if load:
        stop.set()
        load.join()
    return [p99(g) for g in itls], n


async def throughput(client, embed: str, total: int) -> float:
    rng = random.Random(7)
    batches = [[sentence(rng) for _ in range(SENTENCES_PER_REQUEST)] for _ in range(total // SENTENCES_PER_REQUEST)]
    sem = asyncio.Semaphore(EMBED_CONCURRENCY)

    async def one(b):
        async with sem:
            await client.embeddings.create(model=embed, input=b, encoding_format="base64")

    await one(batches[0])  # warm
    start = time.perf_counter()
    await asyncio.gather(*(one(b) for b in batches))
    return total / (time.perf_counter() - start)


ST_BENCH = """
import random, sys, time
import torch
from sentence_transformers import SentenceTransformer
WORDS = {words!r}
rng = random.Random(7)
s = [" ".join(rng.choices(WORDS, k=rng.randint(8, 30))) + "." for _ in range({total})]
m = SentenceTransformer(sys.argv[1], device="cpu")
m.encode(s[:64], batch_size=32)
t = time.perf_counter()
m.encode(s, batch_size=32)
e = time.perf_counter() - t
print(f"sentence-transformers: {{len(s) / e:.1f}} sentences/s (encode batch 32, torch {{torch.__version__}}, {{torch.get_num_threads()}} threads)")
"""


def sentence_transformers_throughput(python: str, model_dir: str, total: int) -> None:
    """sentence-transformers on the same sentences (the same generator and seed)."""
    code = ST_BENCH.format(words=WORDS, total=total)
    out = subprocess.run([python, "-c", code, model_dir], check=True, capture_output=True, text=True)
    print(out.stdout.strip())


async def run(server, rounds: int, decode: bool) -> None:
    client = server.async_openai(timeout=600)
    alone, mixed = [], []
    for r in range(rounds if decode else 0):
        a, _ = await decode_phase(client, server.url, "smol", None)
        m, n = await decode_phase(client, server.url, "smol", "minilm")
        alone.append(a)
        mixed.append(m)
        print(f"round {r}: ITL p99 alone {['%.1f' % (x * 1e3) for x in a]} ms")
        print(f"round {r}: ITL p99 with embeddings {['%.1f' % (x * 1e3) for x in m]} ms ({n} sentences embedded meanwhile)")
    if decode:
        # Per stream: the median over rounds of its p99.
        med = lambda xs: sorted(xs)[len(xs) // 2]  # noqa: E731
        a = [med([r[i] for r in alone]) for i in range(STREAMS)]
        m = [med([r[i] for r in mixed]) for i in range(STREAMS)]
        growths = [mi / ai - 1 for ai, mi in zip(a, m)]
        print(f"ITL p99 per stream (median of {rounds} rounds), alone: {['%.1f' % (x * 1e3) for x in a]} ms")
        print(f"ITL p99 per stream (median of {rounds} rounds), with 64 concurrent embedding requests: "
              f"{['%.1f' % (x * 1e3) for x in m]} ms")
        print(f"growth per stream: {['%+.1f%%' % (g * 100) for g in growths]}")
        print(f"worst p99 growth: {max(growths) * 100:+.1f}%")
    tput = await throughput(client, "minilm", 1024)
    print(f"embeddings alone: {tput:.1f} sentences/s ({EMBED_CONCURRENCY} concurrent requests of {SENTENCES_PER_REQUEST})")
    await client.close()


def main() -> None:
    global MAX_TOKENS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--bin", default=str(REPO / "target" / "debug" / "ingot"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS,
                    help="tokens per chat stream (p99 over about this many gaps)")
    ap.add_argument("--throughput-only", action="store_true", help="skip the decode phases")
    ap.add_argument("--st-python", help="a Python with sentence-transformers: time it on the same sentences")
    a = ap.parse_args()
    MAX_TOKENS = a.max_tokens
    import ingot_e2e

    minilm, why = ingot_e2e.minilm_model()
    if minilm is None:
        raise SystemExit(why)
    with tempfile.TemporaryDirectory() as d:
        cfg = ingot_e2e.models_config(Path(d) / "ingot.toml", {"smol": ingot_e2e.model_path(), "minilm": minilm})
        with ingot_e2e.running("--config", str(cfg), binary=a.bin) as server:
            asyncio.run(run(server, a.rounds, not a.throughput_only))
    if a.st_python:
        sentence_transformers_throughput(a.st_python, minilm, 1024)


if __name__ == "__main__":
    main()
