"""Load shapes for the SLO remediation tests and scripts/bench-slo: a
low-priority overload of long prompts, a high-priority TTFT prober,
streaming clients whose inter-token gaps are measured, and an open-loop
(paced) prefill load. Real HTTP clients (httpx) against a real
`ingot serve`."""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import threading
import time

import httpx

# About 300 tokens: its prefill fills most of a step's token budget.
LONG_PROMPT = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog." for i in range(24))
# About 60 tokens: one fills a step of a 64-token budget (the CPU's prefill
# costs a large share of a decode step per token, so short steps keep the
# adaptive-batching run short).
PREFILL_PROMPT = " ".join(f"Item {i}: the quick brown fox jumps over the lazy dog." for i in range(4))


# Numbers every prompt sent, across loads: a repeated prompt would be served
# from the prefix cache instead of prefilled.
_PROMPT_IDS = itertools.count(1)


def quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile (the server's definition)."""
    assert values, "no samples (the machine may be too loaded for this window)"
    s = sorted(values)
    rank = max(1, min(len(s), int(-(-q * len(s) // 1))))
    return s[rank - 1]


class Background:
    """Threads looping one kind of request until stopped; counts answers."""

    def __init__(self, url: str, clients: int, body: dict, stream: bool = False):
        self.url, self.body, self.stream = url, body, stream
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.statuses: list[tuple[float, int]] = []
        self.errors: list[dict] = []
        self.retry_after: list[str] = []
        self.gaps: list[tuple[float, float]] = []  # (time, inter-token gap)
        self.threads = [threading.Thread(target=self._loop, args=(i,), daemon=True) for i in range(clients)]

    def __enter__(self) -> "Background":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=60)

    def _loop(self, i: int) -> None:
        with httpx.Client(base_url=self.url, timeout=120) as c:
            while not self.stop_flag.is_set():
                body = {**self.body, "prompt": f"[{i}.{next(_PROMPT_IDS)}] {self.body['prompt']}"}
                try:
                    if self.stream:
                        self._one_stream(c, body)
                    else:
                        self._one(c, body)
                except httpx.HTTPError:
                    time.sleep(0.05)

    def _one(self, c: httpx.Client, body: dict) -> None:
        r = c.post("/v1/completions", json=body)
        with self.lock:
            self.statuses.append((time.monotonic(), r.status_code))
            if r.status_code != 200:
                self.errors.append({"status": r.status_code, "body": r.json(),
                                    "content_type": r.headers.get("content-type", "")})
                self.retry_after.append(r.headers.get("retry-after", ""))
        if r.status_code == 503:
            time.sleep(0.2)

    def _one_stream(self, c: httpx.Client, body: dict) -> None:
        last = None
        with c.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            for line in r.iter_lines():
                if self.stop_flag.is_set():
                    break  # leaving the block closes the stream: the server aborts it
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                now = time.monotonic()
                if last is not None:
                    with self.lock:
                        self.gaps.append((now, now - last))
                last = now
        with self.lock:
            self.statuses.append((time.monotonic(), r.status_code))

    def gaps_since(self, t0: float) -> list[float]:
        with self.lock:
            return [g for t, g in self.gaps if t >= t0]

    def codes_since(self, t0: float) -> list[int]:
        with self.lock:
            return [s for t, s in self.statuses if t >= t0]


def ttft(url: str, priority: str = "high", max_tokens: int = 2) -> float:
    """Client-side time to the first streamed token of one request."""
    body = {"prompt": "Say hello.", "max_tokens": max_tokens, "priority": priority, "stream": True,
            "temperature": 0}
    t0 = time.monotonic()
    with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                chunk = json.loads(line[6:])
                if chunk["choices"] and chunk["choices"][0].get("text") is not None:
                    return time.monotonic() - t0
    raise AssertionError("no token streamed")


def probe(url: str, seconds: float, every: float = 0.2, priority: str = "high") -> list[float]:
    """TTFTs of one request at a time for `seconds`."""
    out = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        out.append(ttft(url, priority))
        time.sleep(every)
    return out


class Prober:
    """Threads each sending one high-tier streamed request at a time,
    keeping (time, TTFT) of each."""

    def __init__(self, url: str, every: float = 0.15, threads: int = 3):
        self.url, self.every = url, every
        self.samples: list[tuple[float, float]] = []
        self.stop_flag = threading.Event()
        self.threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(threads)]

    def __enter__(self) -> "Prober":
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_flag.set()
        for t in self.threads:
            t.join(timeout=60)

    def _loop(self) -> None:
        while not self.stop_flag.is_set():
            t = ttft(self.url)
            self.samples.append((time.monotonic(), t))
            time.sleep(self.every)

    def since(self, t0: float) -> list[float]:
        return [v for t, v in list(self.samples) if t >= t0]


def low_overload(url: str, clients: int) -> Background:
    """Long low/background prompts, enough to keep every step full."""
    return Background(url, clients, {"prompt": LONG_PROMPT, "max_tokens": 16, "priority": "low",
                                     "temperature": 0})


def prefill_load(url: str, clients: int, prompt: str = PREFILL_PROMPT) -> Background:
    """Closed loop: each client sends a prompt (one output token) as soon as
    its last is answered, so prefill work always waits and every step is
    full."""
    return Background(url, clients, {"prompt": prompt, "max_tokens": 1, "temperature": 0})


def long_streams(url: str, clients: int) -> Background:
    """Streaming high-tier clients that run for the whole measurement (no
    end of text, many tokens), so every step holds their decodes and none
    waits behind the prefill backlog to restart; their gaps are kept."""
    return Background(url, clients, {"prompt": "Count slowly:", "max_tokens": 512, "ignore_eos": True,
                                     "temperature": 0, "priority": "high"}, stream=True)


class PacedPrefill:
    """Open-loop prefill load: long prompts (one output token each) sent at
    `rate` per second on a fixed schedule, whatever the server's speed. (A
    closed loop slows down with the server and keeps work waiting at any
    client count, so every step is full at any load.) At most `cap` are in
    flight: an arrival over it is skipped and counted, so an overload's
    backlog stays bounded. Stopping cancels what is in flight (the server
    aborts those requests)."""

    def __init__(self, url: str, rate: float, cap: int, prompt: str = PREFILL_PROMPT):
        self.url, self.rate, self.cap, self.prompt = url, rate, cap, prompt
        self.stop_flag = threading.Event()
        self.lock = threading.Lock()
        self.done: list[tuple[float, int]] = []  # (time, status)
        self.skipped = 0
        self.thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def __enter__(self) -> "PacedPrefill":
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_flag.set()
        self.thread.join(timeout=60)

    async def _main(self) -> None:
        limits = httpx.Limits(max_connections=self.cap + 2)
        async with httpx.AsyncClient(base_url=self.url, timeout=120, limits=limits) as c:
            tasks: set[asyncio.Task] = set()
            due = time.monotonic()
            while not self.stop_flag.is_set():
                wait = due - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(min(wait, 0.05))
                    continue
                due += 1 / self.rate
                tasks = {t for t in tasks if not t.done()}
                if len(tasks) >= self.cap:
                    self.skipped += 1
                    continue
                tasks.add(asyncio.create_task(self._one(c, next(_PROMPT_IDS))))
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _one(self, c: httpx.AsyncClient, n: int) -> None:
        body = {"prompt": f"[paced {n}] {self.prompt}", "max_tokens": 1, "temperature": 0, "stream": True}
        try:
            async with c.stream("POST", "/v1/completions", json=body) as r:
                async for _ in r.aiter_lines():
                    pass
                status = r.status_code
        except httpx.HTTPError:
            status = 0
        with self.lock:
            self.done.append((time.monotonic(), status))

    def completed_since(self, t0: float) -> int:
        with self.lock:
            return sum(1 for t, s in self.done if t >= t0 and s == 200)

    def codes(self) -> list[int]:
        with self.lock:
            return [s for _, s in self.done]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")
