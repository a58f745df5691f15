"""Load for the canary and A/B tests (and scripts/bench-canary): streaming
chat requests at a fixed concurrency through `ingot route`, each from a
unit (the `user` field) of a fixed pool, recording per request its unit,
start time, status, arm header and whether it completed."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
import time

import httpx2 as httpx

from ingot_e2e import default_model_name

# A short prompt (~40 tokens with the nonce and the chat template): the
# shared 2-core CI machine prefills it quickly.
LONG_PROMPT = "Read the note and answer briefly. Note: the shipment of part 7 arrived on day 5 in good order. Which day?"


_NONCE = itertools.count()


def chat_body(user: str, n_tokens: int = 12) -> dict:
    # A unique first sentence: no request reuses another's cached prefix,
    # so every request pays its prefill.
    return {
        "model": default_model_name(),
        "messages": [{"role": "user", "content": f"Request {next(_NONCE)} from {user}. {LONG_PROMPT}"}],
        "max_tokens": n_tokens,
        "temperature": 0,
        "stream": True,
        "user": user,
    }


async def stream_one(client: httpx.AsyncClient, user: str, n_tokens: int) -> dict:
    started = time.monotonic()
    res = {"user": user, "start": started, "status": None, "done": False, "error": None,
           "arm": None, "worker": None, "ttft": None}
    try:
        async with client.stream("POST", "/v1/chat/completions", json=chat_body(user, n_tokens)) as r:
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
                elif res["ttft"] is None and any(c.get("delta", {}).get("content") for c in obj.get("choices", [])):
                    # The first chunk with text (the role chunk comes first).
                    res["ttft"] = time.monotonic() - started
    except httpx.HTTPError as e:
        res["error"] = repr(e)
    res["end"] = time.monotonic()
    return res


class FleetLoad:
    """`concurrency` loops of streaming requests until stopped; loop i sends
    as users `u{i}-{k % users_per_loop}` in turn."""

    def __init__(self, url: str, concurrency: int, users_per_loop: int = 10, n_tokens: int = 12):
        self.url, self.concurrency = url, concurrency
        self.users_per_loop, self.n_tokens = users_per_loop, n_tokens
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
                    k += 1
                    self.results.append(await stream_one(c, user, self.n_tokens))
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
