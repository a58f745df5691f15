"""Shared state in Redis (docs/fleet.md), acceptance 1 of issue 17: two
`ingot serve` workers and an `ingot route` router sharing a real
`redis-server` (Debian's package, installed by scripts/test; the module
skips when it is absent, and fails under CI=true). The tests start their own Redis on a free
loopback port without persistence, and stop it.

- a deterministic answer computed through one server is a hit on the other;
- a key's rate limit holds across the two servers;
- a worker SIGKILLed (registered through Redis, never deregistered) leaves
  the router's rotation within its TTL, and no request goes to it after;
- killing Redis under a small concurrent load fails no request (local-only
  mode, `ingot_redis_up` 0) and restarting it restores sharing.
"""

from __future__ import annotations

import hashlib
import signal
import socket
import subprocess
import threading
import time
import uuid

import httpx2 as httpx
import pytest

from ingot_e2e import Router, Server, default_model_name, model_path, wait_for

pytestmark = pytest.mark.needs("redis-server", "redis-cli", reason="scripts/test installs Debian's package")

SERVE_ARGS = ("--kv-cache-tokens", "2048", "--max-num-seqs", "8")
OPEN_KEY = "sk-fleet-open-1111"
LIMITED_KEY = "sk-fleet-limited-2222"
TTL_S = 1.0


def sha(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Redis:
    """A `redis-server` on loopback, no persistence."""

    def __init__(self):
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for(lambda: self.cli("PING") == "PONG", 10, what="redis-server answering PING")

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def cli(self, *args: str) -> str | None:
        r = subprocess.run(["redis-cli", "-p", str(self.port), *args], capture_output=True, text=True, timeout=5)
        return r.stdout.strip() if r.returncode == 0 else None


def config(redis: Redis, namespace: str) -> str:
    return f"""
[redis]
url = "{redis.url}"
namespace = "{namespace}"
heartbeat_interval = "200ms"
heartbeat_ttl = "{TTL_S}s"
retry_after = "300ms"

[flags.response_cache]
enabled = true

[auth]
# The router learns each worker's models from /v1/models.
open_paths = ["/health", "/ready", "/metrics", "/v1/models"]

[[auth.api_keys]]
id = "open"
sha256 = "{sha(OPEN_KEY)}"

[[auth.api_keys]]
id = "limited"
sha256 = "{sha(LIMITED_KEY)}"
requests_per_minute = 10
"""


@pytest.fixture(scope="module")
def fleet(tmp_path_factory):
    model_path()  # fetch outside the startup deadlines
    redis = Redis()
    d = tmp_path_factory.mktemp("fleet")
    namespace = "e2e-" + uuid.uuid4().hex[:8]
    cfg = d / "serve.toml"
    cfg.write_text(config(redis, namespace))
    servers = [Server("--config", str(cfg), *SERVE_ARGS) for _ in range(2)]
    router = Router(
        d,
        f"""
[workers]
redis = true
[discovery]
interval = "200ms"
[health]
interval = "200ms"
[redis]
url = "{redis.url}"
namespace = "{namespace}"
heartbeat_interval = "200ms"
heartbeat_ttl = "{TTL_S}s"
""",
        wait_workers=2,
    )
    try:
        yield {"redis": redis, "servers": servers, "router": router, "config": cfg, "namespace": namespace}
    finally:
        rc = router.stop()
        for s in servers:
            if s.returncode is None:
                s.stop_and_check()
        redis.stop()
        assert rc == 0, router.log_tail()


def chat(content: str, max_tokens: int = 6) -> dict:
    return {
        "model": default_model_name(),
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }


def post(url: str, body: dict, key: str = OPEN_KEY, timeout: float = 120) -> httpx.Response:
    return httpx.post(
        url + "/v1/chat/completions",
        json=body,
        headers={"Authorization": f"Bearer {key}"},
        timeout=timeout,
    )


def metric(server: Server, name: str, **labels: str) -> float:
    return server.metrics().get(name, 0.0, **labels)


def test_a_deterministic_answer_from_one_server_is_a_hit_on_the_other(fleet):
    a, b = fleet["servers"]
    body = chat(f"Name a colour. ({uuid.uuid4().hex[:6]})")
    first = post(a.url, body)
    assert first.status_code == 200, first.text
    assert first.headers["x-ingot-cache"] == "miss"
    before = metric(b, "ingot_response_cache_shared_total", result="hit")
    second = post(b.url, body)
    assert second.status_code == 200, second.text
    assert second.headers["x-ingot-cache"] == "hit", "B replays A's answer from Redis"
    assert second.json()["choices"] == first.json()["choices"]
    assert metric(b, "ingot_response_cache_shared_total", result="hit") == before + 1
    # The entry is namespaced and versioned (format byte 1 then JSON).
    keys = fleet["redis"].cli("--scan", "--pattern", f"{fleet['namespace']}:cache:*") or ""
    assert keys.strip(), "the answer is stored under {ns}:cache:"
    # Through the router (either worker) it is a hit too.
    r = post(fleet["router"].url, body)
    assert r.status_code == 200 and r.headers["x-ingot-cache"] == "hit", r.headers


def test_a_keys_rate_limit_holds_across_two_servers(fleet):
    a, b = fleet["servers"]
    codes = []
    for i in range(12):
        r = post((a if i % 2 == 0 else b).url, chat("Hi.", max_tokens=1), key=LIMITED_KEY)
        codes.append(r.status_code)
        assert "x-ratelimit-limit-requests" in r.headers, r.headers
        if r.status_code == 429:
            assert r.json()["error"]["code"] == "rate_limit_exceeded", r.text
            assert int(r.headers["retry-after"]) >= 1
    assert codes.count(200) == 10, codes
    assert codes.count(429) == 2, codes
    assert codes[-1] == 429, "the fleet's 11th and 12th requests are refused"


def test_a_sigkilled_worker_leaves_routing_within_its_ttl(fleet, tmp_path):
    router = fleet["router"]
    victim = Server("--config", str(fleet["config"]), *SERVE_ARGS)
    try:
        wait_for(
            lambda: any(w["url"] == victim.url and w["healthy"] and not w["removed"] for w in router.workers()),
            30,
            interval=0.1,
            what="the third worker discovered through Redis",
        )
        victim.proc.send_signal(signal.SIGKILL)
        victim.wait()
        killed_at = time.monotonic()
        wait_for(
            lambda: any(w["url"] == victim.url and w["removed"] for w in router.workers()),
            TTL_S + 3.0,
            interval=0.05,
            what="the killed worker removed from the router",
        )
        gone_after = time.monotonic() - killed_at
        # TTL + one discovery tick (200 ms) + scheduling slack.
        assert gone_after <= TTL_S + 1.0, gone_after
        sent_before = router.metrics().get("ingot_router_selections_total", 0.0, worker=victim.url)
        for i in range(6):
            r = post(router.url, chat(f"Count to {i}."))
            assert r.status_code == 200, r.text
        after = router.metrics().get("ingot_router_selections_total", 0.0, worker=victim.url)
        assert after == sent_before, "no request is routed to the removed worker"
    finally:
        victim.kill()


def test_redis_outage_loses_no_request_and_sharing_resumes(fleet):
    redis, (a, b) = fleet["redis"], fleet["servers"]
    failures: list[str] = []
    done = 0
    stop = threading.Event()
    lock = threading.Lock()

    def load(worker: int):
        nonlocal done
        i = 0
        while not stop.is_set():
            target = (a, b)[(worker + i) % 2]
            try:
                # A few prompts repeat, so hits, misses and stores all run.
                r = post(target.url, chat(f"Outage test {worker}-{i % 5}."), timeout=60)
                if r.status_code != 200:
                    failures.append(f"{r.status_code} {r.text[:200]}")
            except Exception as e:  # noqa: BLE001 - any failure counts
                failures.append(repr(e))
            with lock:
                done += 1
            i += 1

    threads = [threading.Thread(target=load, args=(w,)) for w in range(4)]
    for t in threads:
        t.start()
    try:
        # The load is running (and sharing through Redis) before the outage.
        wait_for(lambda: done >= 4, 60, interval=0.05, what="4 requests served before the outage")
        redis.stop()
        wait_for(
            lambda: metric(a, "ingot_redis_up") == 0 and metric(b, "ingot_redis_up") == 0,
            10,
            interval=0.1,
            what="ingot_redis_up 0 on both servers",
        )
        ops = ("cache_get", "cache_set", "heartbeat")
        # The up gauge and the error counter are two updates: poll for both.
        wait_for(
            lambda: sum(metric(a, "ingot_redis_errors_total", op=op) for op in ops) >= 1,
            10,
            interval=0.1,
            what="a Redis error counted on A",
        )
        during = done
        # Bounded: requests that waited out Redis timeouts one by one would not make it.
        wait_for(lambda: done >= during + 4, 15, interval=0.05,
                 what="requests kept being served while Redis was down")
        redis.start()
        wait_for(
            lambda: metric(a, "ingot_redis_up") == 1 and metric(b, "ingot_redis_up") == 1,
            15,
            interval=0.1,
            what="ingot_redis_up back to 1",
        )
        after = done
        wait_for(lambda: done >= after + 4, 60, interval=0.05, what="requests served after Redis came back")
    finally:
        stop.set()
        for t in threads:
            t.join(120)
    assert failures == [], failures[:5]
    assert done >= 8, done
    # Sharing is back: a new answer from A is a hit on B.
    body = chat(f"After the outage ({uuid.uuid4().hex[:6]}).")
    assert post(a.url, body).headers["x-ingot-cache"] == "miss"
    assert post(b.url, body).headers["x-ingot-cache"] == "hit"
    # The router still sees both workers (they re-registered by themselves).
    fleet["router"].wait_workers(2, timeout=10)


def routed(router: Router, system: str, question: str) -> str:
    """Sends a chat with `system` as its prefix through `router`; the worker
    that answered."""
    body = chat(question, max_tokens=2)
    body["messages"].insert(0, {"role": "system", "content": system})
    r = post(router.url, body)
    assert r.status_code == 200, r.text
    return r.headers["x-ingot-worker"]


def test_two_routers_agree_through_the_shared_prefix_index(fleet, tmp_path):
    """Section 1's shared prefix index: routers A and B (policy
    prefix_cache) list the same two workers in opposite orders, so for a
    prefix neither has seen, each would pick its own first worker. A long
    prefix sent through A lands on A's first worker W; through B it goes to
    W as well (B's fallback would have been the other one, as a new prefix
    through B shows), and W's prefix cache serves it. With the index's
    Redis stopped, B routes from its local index and fails nothing."""
    a, b = fleet["servers"]
    index = Redis()  # the routers' own: stopping it leaves the fixture's alone
    namespace = "prefix-" + uuid.uuid4().hex[:8]

    def start(name: str, order: list[Server]) -> Router:
        d = tmp_path / name
        d.mkdir()
        urls = ", ".join(f'"{s.url}"' for s in order)
        return Router(d, f"""
policy = "prefix_cache"
[workers]
urls = [{urls}]
[health]
interval = "200ms"
[redis]
url = "{index.url}"
namespace = "{namespace}"
share_prefix_index = true
retry_after = "300ms"
""", wait_workers=2)

    routers: list[Router] = []
    try:
        ra = start("a", [a, b])
        routers.append(ra)
        rb = start("b", [b, a])
        routers.append(rb)
        tag = uuid.uuid4().hex[:6]
        prefix = f"You are the support assistant of tenant {tag}. Answer in one word. " * 12
        other = f"You are the billing assistant of tenant {tag}. Be brief and polite. " * 12
        w = routed(ra, prefix, "Question one.")
        assert w == a.url, f"A's fallback for a new prefix is its first worker: {w}"
        wait_for(lambda: index.cli("--scan", "--pattern", f"{namespace}:prefix:*"), 5, interval=0.05,
                 what="router A recording the prefix in Redis")
        hits = metric(a, "ingot_prefix_cache_hits_total")
        for q in ("Question two.", "Question three."):
            assert routed(rb, prefix, q) == w, "B follows A's placement from the shared index"
        assert metric(a, "ingot_prefix_cache_hits_total") > hits, "W's prefix cache served B's requests"
        # B on its own (a prefix nobody placed) picks its first worker: the
        # agreement above came from the index, not from B's order.
        assert routed(rb, other, "Question one.") == b.url
        index.stop()
        answered = [routed(rb, prefix, "Question four."), routed(rb, other, "Question two."),
                    routed(rb, f"A third tenant {tag} with a prompt of its own. " * 12, "Hi.")]
        assert answered[:2] == [w, b.url], f"B's local index still places both prefixes: {answered}"
        m = rb.metrics()
        assert m.get("ingot_redis_up") == 0.0
        assert m.get("ingot_redis_errors_total", 0.0) >= 1, "the outage was noticed (and logged)"
        assert routed(ra, prefix, "Question five.") == w
    finally:
        rcs = [r.stop() for r in routers]
        index.stop()
    assert rcs == [0] * len(routers), [r.log_tail() for r in routers]
