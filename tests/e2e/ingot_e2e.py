"""Helpers for the `ingot serve` end-to-end suite: the server process, a tiny
Prometheus text parser, SSE parsing and OpenAI error-shape assertions.

Shared with scripts/ and tests/gpu/ (put tests/e2e on sys.path): importing
it needs only the standard library (httpx2, openai and pytest are imported
where they are used).

Environment:
  INGOT_BIN         the binary (default: target/debug/ingot)
  INGOT_TEST_MODEL  the model (default: the path printed by scripts/fetch-test-model)
  CI                "true" makes every real part required: `require` fails
                    where it would skip elsewhere (see `require`)
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import math
import os
import re
import signal
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("INGOT_BIN") or REPO / "target" / "debug" / "ingot")

# Deadlines (seconds). Generous: they bound a hang, they are not expectations.
LISTEN_DEADLINE = 60.0
READY_DEADLINE = 120.0
EXIT_DEADLINE = 30.0
HTTP_TIMEOUT = 120.0

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_LISTENING = re.compile(r"listening on (http://127\.0\.0\.1:(\d+))")


def in_ci() -> bool:
    """Under CI (`CI=true`), every real part a test needs must be there."""
    return os.environ.get("CI") == "true"


def require(cond, reason: str) -> None:
    """The one rule for a real part a test needs (redis-server, Prometheus,
    lm-eval, a fetched model, a linter): when `cond` is falsy the test fails
    with `reason` under CI=true (a CI run that silently skips proves
    nothing) and skips with `reason` elsewhere. Works at module level too
    (a module-level failure is a collection error naming the reason).

    Test data that is absent from CI by design (../shared) is not a real
    part: skip for it with pytest.skip, not with this."""
    if cond:
        return
    import pytest

    if in_ci():
        pytest.fail(f"{reason} (CI=true: required, not skipped)", pytrace=False)
    pytest.skip(reason, allow_module_level=True)


def require_module(name: str, reason: str):
    """`import name`, under the `require` rule; returns the module."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as e:
        require(False, f"{reason} ({e})")


@functools.lru_cache(maxsize=None)
def model_path() -> str:
    env = os.environ.get("INGOT_TEST_MODEL")
    if env:
        return env
    out = subprocess.run(
        [str(REPO / "scripts" / "fetch-test-model")],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


@functools.lru_cache(maxsize=None)
def minilm_model() -> tuple[str | None, str]:
    """all-MiniLM-L6-v2 (INGOT_TEST_EMBEDDING_MODEL, else scripts/fetch-minilm):
    (its directory, "") or (None, why not)."""
    env = os.environ.get("INGOT_TEST_EMBEDDING_MODEL")
    if env:
        return env, ""
    out = subprocess.run([str(REPO / "scripts" / "fetch-minilm")], capture_output=True, text=True)
    if out.returncode != 0:
        return None, f"scripts/fetch-minilm failed: {out.stderr.strip()[-300:]}"
    return out.stdout.strip(), ""


def get(url: str, timeout: float = 10.0) -> tuple[int, str]:
    """GET with the standard library: (status, body); raises OSError when
    nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def default_model_name() -> str:
    """The served model name when --served-model-name is not given: the file stem."""
    return Path(model_path()).stem


class Server:
    """One `ingot serve` child process on an ephemeral port."""

    # The line that gives the address; a subclass may anchor it.
    listening = _LISTENING
    # Processes started (all classes), for conftest's summary line: each
    # start-up costs the suite seconds on two cores.
    starts = 0

    def __init__(self, *extra_args: str, wait_ready: bool = True, env: dict[str, str] | None = None,
                 binary: str | Path | None = None, ready_poll: float = 0.02):
        """`binary` overrides INGOT_BIN; `ready_poll` is the /ready polling
        interval (`ready_s` is the time from spawn to the first 200)."""
        self.bin = Path(binary or BIN)
        self.ready_poll = ready_poll
        if not self.bin.exists():
            raise AssertionError(f"ingot binary not found at {self.bin} (set INGOT_BIN or run cargo build -p ingot)")
        self.started = time.monotonic()
        self.args = self.command(*extra_args)
        self.log: collections.deque[str] = collections.deque(maxlen=400)
        self._listening = threading.Event()
        self.url: str | None = None
        self.returncode: int | None = None
        Server.starts += 1
        self.proc = subprocess.Popen(
            self.args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "NO_COLOR": "1", **(env or {})},
        )
        # Drain both pipes for the whole life of the process so it never blocks.
        self._threads = [
            threading.Thread(target=self._drain, args=(self.proc.stderr, "err"), daemon=True),
            threading.Thread(target=self._drain, args=(self.proc.stdout, "out"), daemon=True),
        ]
        for t in self._threads:
            t.start()
        try:
            self._wait_listening()
            if wait_ready:
                self.wait_ready()
        except BaseException:
            self.kill()
            raise

    def command(self, *extra_args: str) -> list[str]:
        return [
            str(self.bin),
            "serve",
            "--model",
            model_path(),
            "--host",
            "127.0.0.1",
            "--port",
            "0",
            *extra_args,
        ]

    # -- process ---------------------------------------------------------

    def _drain(self, pipe, tag: str) -> None:
        for raw in iter(pipe.readline, b""):
            line = _ANSI.sub("", raw.decode("utf-8", "replace")).rstrip("\n")
            self.log.append(f"[{tag}] {line}")
            if tag == "err" and self.url is None:
                m = self.listening.search(line)
                if m:
                    self.url = m.group(1)
                    self._listening.set()
        pipe.close()

    def log_tail(self, n: int = 60) -> str:
        return "\n".join(list(self.log)[-n:])

    def _wait_listening(self) -> None:
        deadline = time.monotonic() + LISTEN_DEADLINE
        while not self._listening.wait(0.05):
            if self.proc.poll() is not None:
                raise AssertionError(
                    f"ingot serve exited with {self.proc.returncode} before listening\n"
                    f"cmd: {' '.join(self.args)}\n{self.log_tail()}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"no 'listening on http://127.0.0.1:PORT' line on stderr within {LISTEN_DEADLINE}s\n{self.log_tail()}"
                )

    def wait_ready(self) -> None:
        deadline = time.monotonic() + READY_DEADLINE
        while True:
            if self.proc.poll() is not None:
                raise AssertionError(f"ingot serve exited with {self.proc.returncode} before ready\n{self.log_tail()}")
            try:
                status, body = get(self.url + "/ready", timeout=5.0)
                assert status in (200, 503), f"/ready returned {status}: {body!r}"
                if status == 200:
                    self.ready_s = time.monotonic() - self.started
                    return
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise AssertionError(f"/ready not 200 within {READY_DEADLINE}s\n{self.log_tail()}")
            time.sleep(self.ready_poll)

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def send_signal(self, sig: int = signal.SIGTERM) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait(self, timeout: float = EXIT_DEADLINE) -> int:
        """Waits for exit; returns the exit code (raises on timeout)."""
        try:
            self.returncode = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"ingot serve did not exit within {timeout}s\n{self.log_tail()}")
        for t in self._threads:
            t.join(timeout=5)
        return self.returncode

    def stop(self, sig: int = signal.SIGTERM, timeout: float = EXIT_DEADLINE) -> int:
        """SIGTERM (or `sig`) and wait; returns the exit code."""
        if self.proc.poll() is None:
            self.send_signal(sig)
        try:
            return self.wait(timeout)
        except AssertionError:
            self.kill()
            raise

    def stop_and_check(self) -> None:
        rc = self.stop()
        assert rc == 0, f"ingot serve exited with {rc} after SIGTERM (expected 0)\n{self.log_tail()}"

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    # -- clients ---------------------------------------------------------

    def openai(self, **kw):
        import openai

        return openai.OpenAI(
            base_url=self.url + "/v1",
            api_key="EMPTY",
            max_retries=0,
            timeout=kw.pop("timeout", HTTP_TIMEOUT),
            **kw,
        )

    def async_openai(self, **kw):
        import openai

        return openai.AsyncOpenAI(
            base_url=self.url + "/v1",
            api_key="EMPTY",
            max_retries=0,
            timeout=kw.pop("timeout", HTTP_TIMEOUT),
            **kw,
        )

    def http(self, **kw):
        """An httpx2 client on this server."""
        import httpx2 as httpx

        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", HTTP_TIMEOUT), **kw)

    def metrics(self) -> "Metrics":
        status, text = get(self.url + "/metrics")
        assert status == 200, f"/metrics returned {status}: {text[:500]!r}"
        return Metrics(text)


class Ingot(Server):
    """Any `ingot` subcommand that listens, given its whole argument list
    (`Ingot("route", "--port", "0", "--worker", url)`)."""

    listening = re.compile(r"^listening on (http://127\.0\.0\.1:(\d+))")

    def __init__(self, *argv: str, **kw):
        self._argv = list(argv)
        super().__init__(**kw)

    def command(self, *extra_args: str) -> list[str]:
        return [str(self.bin), *self._argv]


@contextlib.contextmanager
def running(*extra_args: str, **kw):
    """A `Server` for a `with` block (a module fixture's body): stopped with
    SIGTERM at the end, and it must exit 0."""
    srv = Server(*extra_args, **kw)
    try:
        yield srv
    finally:
        srv.stop_and_check()


def models_config(path: Path, models: dict[str, str]) -> Path:
    """Writes an ingot.toml at `path` serving `models` (id -> model path),
    each preloaded; returns `path`."""
    path = Path(path)
    path.write_text("".join(f'\n[[models]]\nid = "{i}"\npath = "{p}"\npreload = true\n' for i, p in models.items()))
    return path


class Router(Server):
    """`ingot route` on an ephemeral port. `config` is the text of its
    router.toml (written next to nothing else in `tmp_dir`); local workers
    get the test model plus `serve_args`."""

    # Only the router's own line: its workers' lines come prefixed.
    listening = re.compile(r"^listening on (http://127\.0\.0\.1:(\d+))")

    def __init__(self, tmp_dir: Path, config: str = "", *extra_args: str, serve_args: tuple[str, ...] = (),
                 wait_workers: int | None = None, binary: str | Path | None = None):
        cfg = Path(tmp_dir) / "router.toml"
        cfg.write_text(config)
        self._router_args = ["--config", str(cfg), *extra_args, "--", "--model", model_path(), *serve_args]
        super().__init__(wait_ready=True, binary=binary)
        if wait_workers:
            self.wait_workers(wait_workers)

    def command(self, *extra_args: str) -> list[str]:
        return [str(self.bin), "route", "--host", "127.0.0.1", "--port", "0", *self._router_args]

    def workers(self) -> list[dict]:
        return workers(self.url)

    def wait_workers(self, n: int, timeout: float = READY_DEADLINE) -> list[dict]:
        """Waits until `n` workers are healthy with closed breakers."""
        def ok():
            ws = self.workers()
            good = [w for w in ws if w["healthy"] and w["breaker"] == "closed"]
            return ws if len(good) >= n else None
        try:
            return wait_for(ok, timeout, interval=0.1, what=f"{n} healthy workers")
        except AssertionError as e:
            raise AssertionError(f"{e}\n{self.log_tail(120)}")


def workers(router_url: str) -> list[dict]:
    """A router's /admin/workers list."""
    status, body = get(router_url + "/admin/workers")
    assert status == 200, body
    return json.loads(body)["workers"]


# -- Prometheus text format ----------------------------------------------

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\S+)?\s*$")
_LABEL = re.compile(r'\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*=\s*"((?:[^"\\]|\\.)*)"\s*,?')


def _parse_value(s: str) -> float:
    if s in ("+Inf", "Inf"):
        return math.inf
    if s == "-Inf":
        return -math.inf
    return float(s)


class Metrics:
    """Samples of one /metrics scrape."""

    def __init__(self, text: str):
        self.text = text
        self.samples: list[tuple[str, dict[str, str], float]] = []
        self.types: dict[str, str] = {}
        for line in text.splitlines():
            line = line.strip()
            if not line:
                continue
            if line.startswith("#"):
                parts = line.split(None, 3)
                if len(parts) >= 4 and parts[1] == "TYPE":
                    self.types[parts[2]] = parts[3].strip()
                continue
            m = _SAMPLE.match(line)
            if not m:
                raise AssertionError(f"unparseable /metrics line: {line!r}")
            name, labels_s, value = m.groups()
            labels = {}
            if labels_s:
                for lm in _LABEL.finditer(labels_s):
                    labels[lm.group(1)] = lm.group(2).replace('\\"', '"').replace("\\n", "\n").replace("\\\\", "\\")
            self.samples.append((name, labels, _parse_value(value)))

    def names(self) -> list[str]:
        return sorted({n for n, _, _ in self.samples})

    def has(self, name: str) -> bool:
        return any(n == name for n, _, _ in self.samples)

    def get(self, name: str, default: float | None = None, **labels: str) -> float:
        """Sum of the samples named `name` whose labels include `labels`.
        Raises when no sample has that name, unless a default is given."""
        if not self.has(name):
            if default is not None:
                return default
            ingot = [n for n in self.names() if n.startswith("ingot_")]
            raise AssertionError(f"metric {name!r} not in /metrics; ingot metrics present: {ingot}")
        return sum(v for n, lab, v in self.samples if n == name and all(lab.get(k) == w for k, w in labels.items()))


# -- SSE -----------------------------------------------------------------


def iter_sse_data(response):
    """Yields the payload of each `data: ...` line of a streaming response
    (SSE comments, i.e. lines starting with ':', are skipped). Fails on any
    other non-empty line."""
    for line in response.iter_lines():
        if not line or line.startswith(":"):
            continue
        assert line.startswith("data: "), f"SSE line does not start with 'data: ': {line!r}"
        yield line[len("data: ") :]


def split_sse_events(raw: bytes) -> list[str]:
    """Strictly splits a complete SSE body into events (blank-line separated)."""
    text = raw.decode("utf-8")
    text = text.replace("\r\n", "\n")
    assert text.endswith("\n\n"), f"SSE body does not end with a blank line: {text[-80:]!r}"
    events = text[:-2].split("\n\n")
    return events


# -- errors --------------------------------------------------------------

_MISSING = object()


def assert_error(
    resp,
    status: int,
    type_: str | None = None,
    param=_MISSING,
    code=_MISSING,
    message_contains: tuple[str, ...] = (),
) -> dict:
    """Asserts an OpenAI-shaped error: status, `{"error": {message, type,
    param, code}}` and the given field values. Returns the error object."""
    desc = f"{resp.request.method} {resp.request.url.path} -> {resp.status_code} {resp.text[:600]!r}"
    assert resp.status_code == status, f"expected HTTP {status}: {desc}"
    ctype = resp.headers.get("content-type", "")
    assert ctype.startswith("application/json"), f"error content-type {ctype!r}: {desc}"
    try:
        body = resp.json()
    except json.JSONDecodeError:
        raise AssertionError(f"error body is not JSON: {desc}")
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), f"no error object: {desc}"
    err = body["error"]
    for key in ("message", "type", "param", "code"):
        assert key in err, f"error object lacks {key!r}: {desc}"
    assert isinstance(err["message"], str) and err["message"], desc
    assert isinstance(err["type"], str) and err["type"], desc
    assert err["param"] is None or isinstance(err["param"], str), desc
    assert err["code"] is None or isinstance(err["code"], str), desc
    if type_ is not None:
        assert err["type"] == type_, f"expected type {type_!r}: {desc}"
    if param is not _MISSING:
        assert err["param"] == param, f"expected param {param!r}: {desc}"
    if code is not _MISSING:
        assert err["code"] == code, f"expected code {code!r}: {desc}"
    for s in message_contains:
        assert s in err["message"], f"expected {s!r} in the message: {desc}"
    return err


def wait_for(pred, timeout: float, interval: float = 0.02, what: str = "condition"):
    """Polls pred() until it returns a truthy value; returns it. On timeout
    raises with the last value."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = pred()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} not reached within {timeout}s (last: {last!r})")
        time.sleep(interval)


class PeakGauge:
    """Samples gauge `name` of `srv` every `interval` seconds on a thread
    while the `with` block runs; `peak` is the largest value seen (to prove
    that requests really ran at once)."""

    def __init__(self, srv: Server, name: str, interval: float):
        self.srv, self.name, self.interval = srv, name, interval
        self.peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self):
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, self.srv.metrics().get(self.name))
            except Exception:
                pass  # a scrape that races the server's work: the next one counts
            time.sleep(self.interval)

    def __enter__(self) -> PeakGauge:
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


# -- the CLI on the CPU (scripts/compare-*) -------------------------------

# The five prompts the CPU comparison scripts share.
COMPARE_PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Water boils at a temperature of",
    "List three primary colors:",
    "Once upon a time, in a small village,",
]


def read_f32(path: str | Path) -> tuple[float, ...]:
    """A little-endian f32 file (what `ingot logits --out` writes)."""
    b = Path(path).read_bytes()
    return struct.unpack(f"<{len(b) // 4}f", b)


def rel_l2(a, ref) -> float:
    """||a - ref|| / ||ref||."""
    return math.sqrt(sum((x - y) ** 2 for x, y in zip(a, ref))) / math.sqrt(sum(y * y for y in ref))


def max_abs_diff(a, b) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


def same_prefix(a, b) -> int:
    """How many leading tokens two id lists share."""
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


class Cli:
    """`ingot` subcommands on one model on the CPU with 2 threads; a failed
    command ends the script with its stderr."""

    def __init__(self, binary: str | Path, model: str):
        self.bin, self.model = str(binary), model
        self.tmp = tempfile.mkdtemp()

    def run(self, *args: str) -> subprocess.CompletedProcess:
        r = subprocess.run([self.bin, *args, "--model", self.model, "--device", "cpu", "--threads", "2"],
                           capture_output=True, text=True)
        if r.returncode:
            sys.exit(r.stderr)
        return r

    def greedy(self, prompt: str, *flags: str, max_tokens: int = 32) -> dict:
        """`ingot generate --print-ids`: {"prompt_ids": [...], "output_ids": [...]}."""
        r = self.run("generate", *flags, "--prompt", prompt, "--max-tokens", str(max_tokens),
                     "--ignore-eos", "--print-ids")
        return json.loads(r.stderr.strip().splitlines()[-1])

    def logits(self, ids, *flags: str) -> tuple[float, ...]:
        """First-step logits of the prompt `ids` (`ingot logits`)."""
        out = os.path.join(self.tmp, "logits.f32")
        self.run("logits", *flags, "--prompt-ids", ",".join(map(str, ids)), "--out", out)
        return read_f32(out)
