"""Shared by the router tests (test_router.py, test_canary.py) and
scripts/bench-canary: streaming chat load at a fixed concurrency through
`ingot route`, and the worker flags and canary config of the canary runs.

The load sends each request from a unit (the `user` field) of a fixed
pool and records per request its unit, start time, status, arm and worker
headers, TTFT, content chunks and whether it completed."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time
from typing import Callable

import httpx2 as httpx

from ingot_e2e import default_model_name

KV = ("--kv-cache-tokens", "4096")
SERVE_ARGS = (*KV, "--max-num-seqs", "8")
# Measurably slower, never failing: the exact f32 weights (several times the
# bytes per token of the quantized path) and one sequence at a time, so
# under concurrent load its requests also queue. `--max-num-seqs 1` alone is
# not enough when both workers share two cores (see test_route_away.py).
SLOW_ARGS = (*KV, "--max-num-seqs", "1", "--cpu-weights", "f32")
# Queueing only (the A/B test's treatment: a higher TTFT at equal weights).
QUEUEING_ARGS = (*KV, "--max-num-seqs", "1")
# A waiting queue with no room: it refuses its requests (429).
FAILING_ARGS = (*QUEUEING_ARGS, "--max-waiting", "0")

CANARY_TOML = """
[[canary]]
name = "smol"
stable_group = "stable"
canary_group = "canary"
steps = {steps}
step_duration = "{step}"
window = "{window}"
eval_interval = "250ms"
min_samples = {min_samples}
significance = {significance}
max_ttft_ratio = {max_ratio}
max_itl_ratio = {max_ratio}
quantile = {quantile}
"""


# An A/B experiment over the two groups: the default arm on "stable", the
# small-budget (queueing) arm on "canary".
AB_EXPERIMENT = """
[[experiments]]
id = "batching"
split_percent = 50
significance = 0.01
min_samples = 10
arms = [{name = "default", group = "stable"}, {name = "small_budget", group = "canary"}]
"""


def canary_toml(steps: str, step: str, window: str = "40s", min_samples: int = 6,
                max_ratio: float = 1.5, quantile: float = 0.95, significance: float = 0.01) -> str:
    """The `[[canary]]` "smol" from group "stable" to group "canary"."""
    return CANARY_TOML.format(steps=steps, step=step, window=window, min_samples=min_samples,
                              max_ratio=max_ratio, quantile=quantile, significance=significance)


def groups_toml(stable_url: str, canary_url: str) -> str:
    """Worker groups "stable" and "canary" of one worker each."""
    return (f'[[workers.groups]]\nname = "stable"\nurls = ["{stable_url}"]\n'
            f'[[workers.groups]]\nname = "canary"\nurls = ["{canary_url}"]\n')


# A short prompt (~40 tokens with the nonce and the chat template): the
# shared 2-core CI machine prefills it quickly.
LONG_PROMPT = "Read the note and answer briefly. Note: the shipment of part 7 arrived on day 5 in good order. Which day?"


_NONCE = itertools.count()


def unit_content(user: str) -> str:
    # A unique first sentence: no request reuses another's cached prefix,
    # so every request pays its prefill.
    return f"Request {next(_NONCE)} from {user}. {LONG_PROMPT}"


def chat_body(user: str, n_tokens: int = 12, content: str | None = None) -> dict:
    return {
        "model": default_model_name(),
        "messages": [{"role": "user", "content": content if content is not None else unit_content(user)}],
        "max_tokens": n_tokens,
        "temperature": 0,
        "stream": True,
        "user": user,
    }


async def stream_one(client: httpx.AsyncClient, body: dict) -> dict:
    """One streaming chat request: how it ended, its arm and worker, its TTFT
    (first chunk with text) and how many chunks came before `[DONE]`."""
    started = time.monotonic()
    res = {"user": body.get("user"), "start": started, "status": None, "done": False, "error": None,
           "arm": None, "worker": None, "ttft": None, "chunks": 0}
    try:
        async with client.stream("POST", "/v1/chat/completions", json=body) as r:
            res["status"] = r.status_code
            res["arm"] = r.headers.get("x-ingot-arm")
            res["worker"] = r.headers.get("x-ingot-worker")
            if r.status_code != 200:
                res["error"] = (await r.aread()).decode()
                return res
            async for line in r.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    res["done"] = True
                    break
                obj = json.loads(data)
                if "error" in obj:
                    res["error"] = obj["error"]
                    continue
                res["chunks"] += 1
                if res["ttft"] is None and any(c.get("delta", {}).get("content") for c in obj.get("choices", [])):
                    # The first chunk with text (the role chunk comes first).
                    res["ttft"] = time.monotonic() - started
    except httpx.HTTPError as e:
        res["error"] = repr(e)
    res["end"] = time.monotonic()
    return res


class FleetLoad:
    """`concurrency` loops of streaming requests until stopped; loop i sends
    as users `u{i}-{k % users_per_loop}` in turn. `content(i, k)` overrides
    the message text (default: a unique sentence and LONG_PROMPT)."""

    def __init__(self, url: str, concurrency: int, users_per_loop: int = 10, n_tokens: int = 12,
                 content: Callable[[int, int], str] | None = None):
        self.url, self.concurrency = url, concurrency
        self.users_per_loop, self.n_tokens, self.content = users_per_loop, n_tokens, content
        self.results: list[dict] = []
        self.started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)
        self._thread.start()

    async def _run(self):
        async with httpx.AsyncClient(base_url=self.url, timeout=120.0) as c:
            async def loop(i):
                k = 0
                while not self._stop.is_set():
                    user = f"u{i}-{k % self.users_per_loop}"
                    text = self.content(i, k) if self.content else None
                    k += 1
                    self.results.append(await stream_one(c, chat_body(user, self.n_tokens, text)))
            await asyncio.gather(*(loop(i) for i in range(self.concurrency)))

    def stop(self, timeout: float = 180.0) -> list[dict]:
        self._stop.set()
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "the load did not finish: a request hangs"
        return self.results


def ok(res: dict) -> bool:
    return res["status"] == 200 and res["done"] and res["error"] is None


def arms_by_user(results: list[dict]) -> dict[str, list[str]]:
    """Each unit's arms in the order its requests started."""
    out: dict[str, list[str]] = {}
    for r in sorted(results, key=lambda r: r["start"]):
        out.setdefault(r["user"], []).append((r["arm"] or "").split(":")[-1])
    return out
