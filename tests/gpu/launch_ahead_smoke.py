#!/usr/bin/env python3
"""Launch-ahead decode steps when rows finish at different times (CUDA).

The CUDA runner launches decode step N+1 before step N returns; when some
rows finish (a stop string, end of sequence) the next batch is the
launched one less those rows, and the runner keeps the launch-ahead step for
the rest (a partial hit) instead of discarding it. This starts `ingot serve`
on the given model, runs greedy requests that stop at different points one
at a time, then all at once, counting the concurrent answers that equal
their lone ones; then the same with `--enforce-eager` (no graphs, so no
launch-ahead steps), which shows what batching alone changes (the GPU path is not
batch-invariant). It fails when launching ahead leaves more than 2 answers
fewer equal than eager; the runner's hit / partial hit / miss counts come
from its log at shutdown. Usage: launch_ahead_smoke.py INGOT MODEL [serve flags, e.g. --device cuda]
Only the standard library: it runs on the GPU machine.
"""

import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

ING, MODEL, EXTRA = sys.argv[1], sys.argv[2], sys.argv[3:]
TOPICS = ["the sea", "a mountain", "bread", "a train", "winter", "a library", "music", "a garden",
          "the moon", "a market", "rain", "a bridge", "coffee", "a river", "chess", "a lighthouse"]
# Stop strings that end answers after different numbers of tokens.
STOPS = [["."], [","], ["\n"], [" and"], [" the"], ["!"], [" a "], ["ing"]]


def post(url, body):
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.load(r)["choices"][0]["message"]["content"]


def body(i):
    ask = f"Write a few sentences about {TOPICS[i % len(TOPICS)]}."
    return {"model": "m", "messages": [{"role": "user", "content": ask}],
            "max_tokens": 96, "temperature": 0, "stop": STOPS[i % len(STOPS)]}


def start(flags):
    """Starts `ingot serve` with `flags`; (process, base URL, log path)."""
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    env = dict(os.environ, INGOT_LOG="warn,ingot_runner_cuda=debug", NO_COLOR="1")
    srv = subprocess.Popen([ING, "serve", "--model", MODEL, "--served-model-name", "m", "--port", "0",
                            *flags], stdout=log, stderr=subprocess.STDOUT, env=env)
    deadline = time.time() + 300
    while time.time() < deadline and srv.poll() is None:
        m = re.search(r"listening on (http://[0-9.:]+)", open(log.name).read())
        if m:
            try:
                urllib.request.urlopen(m.group(1) + "/ready", timeout=2)
                return srv, m.group(1), log.name
            except Exception:  # noqa: BLE001 (not ready yet)
                pass
        time.sleep(0.2)
    print(open(log.name).read()[-3000:])
    sys.exit("server did not start")


def equal_answers(flags, n=32):
    """How many of n answers run all at once equal the same request alone."""
    srv, url, log = start(flags)
    alone = [post(url, body(i)) for i in range(n)]
    with ThreadPoolExecutor(n) as pool:
        together = list(pool.map(lambda i: post(url, body(i)), range(n)))
    same = sum(a == t for a, t in zip(alone, together))
    lengths = sorted(len(a) for a in alone)
    srv.terminate()
    srv.wait(60)
    stats = re.findall(r".*launch-ahead steps.*", open(log).read())
    print(f"{' '.join(flags)}: answers {n}, lengths (chars) {lengths[0]}..{lengths[-1]}; "
          f"concurrent == alone: {same}/{n}")
    for a, t in zip(alone, together):
        if a != t:
            at = next(i for i, (x, y) in enumerate(zip(a + "\0", t + "\0")) if x != y)
            print(f"  differs at char {at}: ...{a[max(0, at - 40):at + 20]!r} vs ...{t[max(0, at - 40):at + 20]!r}")
    print("  runner:", stats[-1] if stats else "no launch-ahead line in the log")
    return same


def main():
    # The GPU path is not batch-invariant, so some answers differ from their
    # lone runs anyway; the eager run (no graphs, so no launch-ahead steps)
    # shows how many. Launching ahead must not make it worse beyond
    # run-to-run noise.
    launching = equal_answers(EXTRA)
    eager = equal_answers([*EXTRA, "--enforce-eager"])
    ok = launching >= eager - 2
    print(f"equal answers: {launching} launching ahead vs {eager} eager:", "ok" if ok else "FAILED")
    sys.exit(0 if ok else 1)


main()
