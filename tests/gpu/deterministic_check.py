#!/usr/bin/env python3
"""Deterministic mode over HTTP (issue 19, acceptance 4), standard library only.

For `--deterministic` and for the default (both servers at once, on one GPU):
start `ingot serve`, take the greedy answer of prompt P alone, then send 64
requests for P mixed with 64 different prompts at once, then P alone again
(now from the prefix cache), and count the answers equal to the first.
Coalescing is off (INGOT_FLAG_COALESCING=off) and the response cache is off
(its default), so every request is generated; the prefix cache stays on, so
the copies of P resume from cached blocks at different points.

Prints one row per mode (JSON lines also to $OUT/deterministic.jsonl); exits 1
when deterministic mode gives a different answer.

  deterministic_check.py --ingot BIN --model PATH --label NAME -- SERVE_ARGS...
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

PROMPT = (
    "The history of the old harbour town begins in the year 1200, when fishermen from the north "
    "settled on the rocky shore and built the first stone pier. Over the next three centuries the town"
)
SAME = 64
OTHERS = 64
LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:\d+)")


def other_prompt(i: int) -> str:
    # Different lengths, so the batch mixes chunk sizes and positions.
    return f"Request {i}: write about topic number {(i * 7919) % 1000}" + " and more" * (i % 13)


class Server:
    def __init__(self, binary: str, model: str, args: list[str]):
        env = {**os.environ, "NO_COLOR": "1", "INGOT_FLAG_COALESCING": "off"}
        cmd = [binary, "serve", "--model", model, "--served-model-name", "m", "--host", "127.0.0.1", "--port", "0", *args]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
        self.log: collections.deque[str] = collections.deque(maxlen=40)
        self.url: str | None = None
        self.listening = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()
        deadline = time.monotonic() + 240
        while not self.listening.wait(0.1):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("server did not start:\n" + "\n".join(self.log))
        while True:
            try:
                with urllib.request.urlopen(self.url + "/ready", timeout=5) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("server not ready:\n" + "\n".join(self.log))
            time.sleep(0.2)

    def _drain(self) -> None:
        for raw in iter(self.proc.stderr.readline, b""):
            line = raw.decode("utf-8", "replace").rstrip()
            self.log.append(line)
            m = LISTENING.search(line)
            if m and self.url is None:
                self.url = m.group(1)
                self.listening.set()

    def complete(self, prompt: str, max_tokens: int) -> tuple[str, str]:
        body = {"model": "m", "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
        req = urllib.request.Request(
            self.url + "/v1/completions",
            data=json.dumps(body).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            answer = json.load(r)
            return answer["choices"][0]["text"], r.headers.get("x-ingot-cache", "")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def check(binary: str, model: str, label: str, args: list[str], deterministic: bool, max_tokens: int) -> dict:
    mode = "deterministic" if deterministic else "default"
    started = time.monotonic()
    srv = Server(binary, model, args + (["--deterministic"] if deterministic else []))
    try:
        alone, _ = srv.complete(PROMPT, max_tokens)
        jobs = []
        for i in range(max(SAME, OTHERS)):
            if i < SAME:
                jobs.append(PROMPT)
            if i < OTHERS:
                jobs.append(other_prompt(i))
        with concurrent.futures.ThreadPoolExecutor(len(jobs)) as pool:
            results = list(pool.map(lambda p: srv.complete(p, max_tokens), jobs))
        again, _ = srv.complete(PROMPT, max_tokens)
    finally:
        srv.stop()
    same = [text for (text, _), p in zip(results, jobs) if p == PROMPT]
    others = [text for (text, _), p in zip(results, jobs) if p != PROMPT]
    caches = collections.Counter(h for _, h in results)
    row = {
        "model": label,
        "mode": mode,
        "equal_to_alone": sum(t == alone for t in same),
        "of": len(same),
        "distinct_answers_of_p": len(set(same)),
        "distinct_other_answers": len(set(others)),
        "alone_again_equal": again == alone,
        "x_ingot_cache": dict(caches),
        "max_tokens": max_tokens,
        "seconds": round(time.monotonic() - started, 1),
    }
    if row["equal_to_alone"] < len(same):
        row["first_differing"] = next(t for t in same if t != alone)[:200]
        row["alone"] = alone[:200]
    return row


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--label", required=True)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("serve_args", nargs="*")
    a = ap.parse_args()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [
            pool.submit(check, a.ingot, a.model, a.label, a.serve_args, det, a.max_tokens) for det in (True, False)
        ]
        rows = []
        for f in futures:
            try:
                rows.append(f.result())
            except Exception as e:  # report and go on: the other mode's row still counts
                rows.append({"model": a.label, "error": str(e)[-2000:]})
    out = os.environ.get("OUT")
    for row in rows:
        print(json.dumps(row), flush=True)
        if out:
            with open(os.path.join(out, "deterministic.jsonl"), "a") as f:
                f.write(json.dumps(row) + "\n")
    det = rows[0]
    ok = det.get("equal_to_alone") == det.get("of") and det.get("alone_again_equal")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
