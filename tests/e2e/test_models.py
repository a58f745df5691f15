"""Many models in one server (issue 13): `[[models]]` under a device budget.

Three models from the real default GGUF (two with its weights, one with
random weights of its shape) under a budget that holds two: requests
alternating between them all succeed, the least recently used idle model is
evicted and never one with a request in flight, `/v1/models` and
`/admin/models` show every state, metrics count loads and evictions, an
unknown model is a 404 listing the others, a model that cannot fit is a 503
with Retry-After while the others keep serving, idle models unload,
preloaded ones are in at `/ready`, pins hold, and switching back and forth
leaks no memory."""

from __future__ import annotations

import threading
import time

import pytest

from ingot_e2e import Server, assert_error, model_path, wait_for

KV_TOKENS = 1024


def footprint_guess() -> int:
    """SmolLM2-135M in f32 (~135M params x 4 B) plus 1024 tokens of KV."""
    return 135_000_000 * 4 + KV_TOKENS * 30 * 2 * 192 * 4


def config_text(path: str, broken: str) -> str:
    budget = int(footprint_guess() * 2.5)  # two fit, three do not
    return f"""
# f32 weights: the footprints this test sizes its budget by.
[model]
cpu_weights = "f32"

[registry]
device_budget = {budget}
load_wait = "60s"

[[models]]
id = "alpha"
aliases = ["a"]
path = "{path}"
kv_cache_tokens = {KV_TOKENS}
preload = true

[[models]]
id = "beta"
path = "{path}"
kv_cache_tokens = {KV_TOKENS}

[[models]]
id = "gamma"
path = "{path}"
load_format = "dummy"
kv_cache_tokens = {KV_TOKENS}

[[models]]
id = "idle"
path = "{path}"
kv_cache_tokens = 64
idle_timeout = "1s"

[[models]]
id = "huge"
path = "{path}"
kv_cache_tokens = 10000000

[[models]]
id = "broken"
path = "{broken}"

[[models]]
id = "missing"
path = "/nonexistent/model.gguf"
"""


@pytest.fixture(scope="module")
def srv(tmp_path_factory):
    d = tmp_path_factory.mktemp("models")
    broken = d / "broken.gguf"
    broken.write_bytes(b"GGUF" + bytes(range(256)) * 64)  # a GGUF magic, then garbage
    cfg = d / "ingot.toml"
    cfg.write_text(config_text(model_path(), str(broken)))
    s = Server("--config", str(cfg))
    try:
        yield s
    finally:
        s.stop_and_check()


def states(srv: Server) -> dict[str, str]:
    with srv.http() as http:
        r = http.get("/v1/models")
        assert r.status_code == 200, r.text
        return {m["id"]: m["state"] for m in r.json()["data"]}


def admin(srv: Server) -> dict:
    with srv.http() as http:
        r = http.get("/admin/models")
        assert r.status_code == 200, r.text
        return r.json()


def complete(srv: Server, model: str, **extra):
    with srv.http() as http:
        return http.post("/v1/completions", json={"model": model, "prompt": "The capital of France is",
                                                  "max_tokens": 4, "temperature": 0, **extra})


def test_models_are_listed_with_states_and_preload_is_in_at_ready(srv):
    s = states(srv)
    assert set(s) == {"alpha", "beta", "gamma", "idle", "huge", "broken", "missing"}
    assert s["alpha"] == "loaded"
    assert s["beta"] == "unloaded" and s["gamma"] == "unloaded"


def test_alternating_models_evict_the_least_recently_used(srv):
    evictions = lambda: srv.metrics().get("ingot_model_evictions_total", 0.0, model="alpha", reason="lru")  # noqa: E731
    before = evictions()
    for model in ["beta", "gamma", "alpha", "beta", "gamma", "alpha"]:
        r = complete(srv, model)
        assert r.status_code == 200, (model, r.text)
        assert r.json()["model"] == model
        loaded = [m for m, st in states(srv).items() if st == "loaded"]
        assert model in loaded and len(loaded) <= 2, loaded
    assert evictions() >= before + 1
    a = admin(srv)
    assert a["device_bytes_used"] <= a["device_budget_bytes"]
    m = srv.metrics()
    assert m.get("ingot_model_loads_total", model="beta", result="ok", source="file") >= 2
    assert m.get("ingot_model_state", model="alpha", state="loaded") == 1.0


def test_a_model_serving_a_stream_is_never_evicted(srv):
    assert complete(srv, "alpha").status_code == 200
    done = threading.Event()
    result: dict = {}

    def long_stream():
        with srv.http(timeout=120) as http:
            with http.stream("POST", "/v1/completions",
                             json={"model": "alpha", "prompt": "Once upon a time", "max_tokens": 300,
                                   "ignore_eos": True, "stream": True}) as s:
                result["status"] = s.status_code
                result["text"] = s.read().decode()
        done.set()

    t = threading.Thread(target=long_stream)
    t.start()
    wait_for(lambda: any(m["id"] == "alpha" and m["in_flight"] >= 1 for m in admin(srv)["data"]), 10,
             what="the stream holding alpha")
    # beta and gamma alternate: with alpha held, each evicts the other.
    for model in ["beta", "gamma", "beta", "gamma"]:
        if done.is_set():
            break
        r = complete(srv, model)
        assert r.status_code == 200, (model, r.text)
        assert states(srv)["alpha"] == "loaded"
    t.join(120)
    assert result["status"] == 200 and "[DONE]" in result["text"], result


def test_a_model_that_cannot_fit_is_503_with_retry_after(srv):
    r = complete(srv, "huge")
    assert_error(r, 503, code="model_unavailable")
    assert int(r.headers["retry-after"]) >= 1
    assert "budget" in r.json()["error"]["message"]
    assert complete(srv, "alpha").status_code == 200


def test_idle_models_unload(srv):
    assert complete(srv, "idle").status_code == 200
    assert states(srv)["idle"] == "loaded"
    wait_for(lambda: states(srv)["idle"] == "unloaded", 5, interval=0.2, what="idle unload")
    assert srv.metrics().get("ingot_model_evictions_total", model="idle", reason="idle") >= 1


def test_admin_load_unload_and_pin(srv):
    with srv.http(timeout=120) as http:
        r = http.post("/admin/models/beta/unload")
        assert r.status_code == 200, r.text
        assert states(srv)["beta"] == "unloaded"
        r = http.post("/admin/models/beta/load")
        assert r.status_code == 200 and r.json()["state"] == "loaded", r.text
        assert http.post("/admin/models/beta/pin").status_code == 200
        assert http.post("/admin/models/alpha/pin").status_code == 200
        # Both loaded models pinned: gamma has no room.
        r = complete(srv, "gamma")
        assert_error(r, 503, code="model_unavailable")
        assert "pinned" in r.json()["error"]["message"]
        for m in ("alpha", "beta"):
            assert http.post(f"/admin/models/{m}/unpin").status_code == 200
        assert complete(srv, "gamma").status_code == 200
        assert http.post("/admin/models/beta/explode").status_code == 404
        assert http.post("/admin/models/nope/load").status_code == 404


@pytest.mark.load  # sustained switching: scripts/test-load (~70 and ~30 s of CI's cores)
def test_switching_back_and_forth_leaks_nothing(srv):
    everything = ("alpha", "beta", "gamma", "idle")
    with srv.http(timeout=120) as http:
        for m in everything:
            assert http.post(f"/admin/models/{m}/unload").status_code == 200
    assert admin(srv)["device_bytes_used"] == 0
    base_rss = rss(srv)
    for i in range(30):
        model = ["alpha", "beta", "gamma"][i % 3]
        r = complete(srv, model, max_tokens=1)
        assert r.status_code == 200, r.text
    with srv.http(timeout=120) as http:
        for m in everything:
            assert http.post(f"/admin/models/{m}/unload").status_code == 200
    assert admin(srv)["device_bytes_used"] == 0
    assert not [m["id"] for m in admin(srv)["data"] if m["state"] != "unloaded"]
    # The weights really went: resident memory is back near where it was
    # (one model is ~0.6 GB; the allocator may keep a little).
    grown = rss(srv) - base_rss
    assert grown < 150 << 20, f"RSS grew by {grown >> 20} MiB over 30 switches"


def rss(srv: Server) -> int:
    with open(f"/proc/{srv.proc.pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_broken_and_missing_model_files_are_clear_503s_and_others_keep_serving(srv):
    for model, detail in (("broken", "broken.gguf"), ("missing", "/nonexistent/model.gguf")):
        r = complete(srv, model)
        assert_error(r, 503, code="model_unavailable")
        msg = r.json()["error"]["message"]
        assert f"loading '{model}' failed" in msg and detail in msg, msg
        assert int(r.headers["retry-after"]) >= 1
        assert states(srv)[model] == "unloaded"
    assert complete(srv, "alpha").status_code == 200


def test_a_key_limited_to_one_model_never_loads_another(server_factory, tmp_path):
    """A key may use only `alpha`: `beta` is a 404 for it (as if it did not
    exist) and is not loaded by the refused request; /v1/models lists only
    what the key may use."""
    import hashlib

    key = "sk-models-SECRET-1"
    cfg = tmp_path / "ingot.toml"
    cfg.write_text(
        f"""
[[models]]
id = "alpha"
path = "{model_path()}"
kv_cache_tokens = {KV_TOKENS}
preload = true

[[models]]
id = "beta"
path = "{model_path()}"
kv_cache_tokens = {KV_TOKENS}

[[auth.api_keys]]
id = "narrow"
sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"
models = ["alpha"]
"""
    )
    srv = server_factory("--config", str(cfg))
    with srv.http(headers={"authorization": f"Bearer {key}"}) as http:
        r = http.post("/v1/completions", json={"model": "beta", "prompt": "Hi", "max_tokens": 1})
        assert_error(r, 404, code="model_not_found")
        ids = [m["id"] for m in http.get("/v1/models").json()["data"]]
        assert ids == ["alpha"], ids
        r = http.post("/v1/completions", json={"model": "alpha", "prompt": "Hi", "max_tokens": 1})
        assert r.status_code == 200, r.text
    assert srv.metrics().get("ingot_model_loads_total", 0.0, model="beta", result="ok", source="file") == 0


WARM_CONFIG = """
# native quantized weights (the default path): each model is the mapped
# file (~90 MB) plus 1024 tokens of KV; the budget holds one of them.
[registry]
device_budget = "{device}"
host_budget = "{host}"
load_wait = "60s"

[[models]]
id = "left"
path = "{path}"
kv_cache_tokens = 1024
preload = true

[[models]]
id = "right"
path = "{path}"
kv_cache_tokens = 1024
"""


@pytest.fixture(scope="module")
def warm(tmp_path_factory):
    import os
    size = os.path.getsize(model_path())
    cfg = tmp_path_factory.mktemp("warm") / "ingot.toml"
    # Device: one model (file + KV, KV < 128 MB); host: one warm copy.
    cfg.write_text(WARM_CONFIG.format(device=int(size * 1.4) + (128 << 20), host=int(size * 1.2),
                                      path=model_path()))
    s = Server("--config", str(cfg))
    try:
        yield s
    finally:
        s.stop_and_check()


def first_token_seconds(srv: Server, model: str, prompt: str = "The capital of France is") -> tuple[float, str]:
    with srv.http(timeout=120) as http:
        t0 = time.perf_counter()
        r = http.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": 1,
                                               "temperature": 0})
        took = time.perf_counter() - t0
        assert r.status_code == 200, r.text
        return took, r.json()["choices"][0]["text"]


def test_evicted_models_sleep_in_host_memory_and_wake_fast_with_the_same_answers(warm):
    prompt = "Once upon a time, in a land far away, there lived a"
    _, before = first_token_seconds(warm, "left", prompt)
    loads = lambda m, src: warm.metrics().get("ingot_model_loads_total", 0.0, model=m, result="ok", source=src)
    took = []
    for i in range(20):
        model = ["right", "left"][i % 2]
        t, _ = first_token_seconds(warm, model)
        took.append(t)
        st = {m["id"]: m for m in admin(warm)["data"]}
        other = "left" if model == "right" else "right"
        assert st[model]["state"] == "loaded" and st[other]["state"] == "unloaded", st
        # the evicted one sleeps in host memory, counted against the host budget
        assert st[other]["host_bytes"] > 0, st[other]
    a = admin(warm)
    assert 0 < a["host_bytes_used"] <= a["host_budget_bytes"], a
    # every load after the first of "right" came from its warm copy
    assert loads("right", "file") == 1 and loads("right", "warm") == 9, (loads("right", "file"), loads("right", "warm"))
    assert loads("left", "warm") == 10
    assert warm.metrics().get("ingot_model_host_bytes", 0.0, model="right") > 0
    # the same greedy answer after ten sleeps (the prefix cache was emptied
    # with the KV it described)
    _, after = first_token_seconds(warm, "left", prompt)
    assert after == before
    took.sort()
    p50 = took[len(took) // 2]
    print(f"warm switch first token: p50 {p50 * 1e3:.1f} ms, max {took[-1] * 1e3:.1f} ms")
    assert p50 < 1.0, f"first token after a warm switch: p50 {p50:.3f} s"


@pytest.mark.load  # sustained switching: scripts/test-load (~70 and ~30 s of CI's cores)
def test_a_hundred_warm_switches_leak_nothing(warm):
    for i in range(10):
        first_token_seconds(warm, ["left", "right"][i % 2])
    settled, before = rss(warm), admin(warm)
    for i in range(100):
        first_token_seconds(warm, ["left", "right"][i % 2])
    grown = rss(warm) - settled
    assert grown < 64 << 20, f"RSS grew by {grown >> 20} MiB over 100 warm switches"
    a = admin(warm)
    # the same model is loaded as before, the other asleep: the same bytes
    assert (a["device_bytes_used"], a["host_bytes_used"]) == \
        (before["device_bytes_used"], before["host_bytes_used"]), (before, a)
    assert a["device_bytes_used"] == max(m["device_bytes"] for m in a["data"]), a


PREFETCH_CONFIG = """
[registry]
device_budget = "{device}"
host_budget = 0
prefetch_window = "60s"
prefetch_min_requests = 2
prefetch_max = 1

[[models]]
id = "p1"
path = "{copy}"
kv_cache_tokens = 1024

[[models]]
id = "p2"
path = "{path}"
kv_cache_tokens = 1024
"""


def resident_bytes(path) -> int | None:
    """Bytes of `path` in the page cache (util-linux fincore), None without it."""
    import shutil
    import subprocess
    if not shutil.which("fincore"):
        return None
    out = subprocess.run(["fincore", "--bytes", "--noheadings", "--output", "RES", str(path)],
                         capture_output=True, text=True, check=True).stdout
    return int(out.split()[0])


def test_a_model_in_demand_is_prefetched_into_the_page_cache_after_eviction(tmp_path):
    import os
    import shutil
    copy = tmp_path / "copy.gguf"
    shutil.copyfile(model_path(), copy)
    with open(copy, "rb+") as f:
        os.fsync(f.fileno())  # clean pages: only those can be dropped below
    size = os.path.getsize(copy)
    cfg = tmp_path / "ingot.toml"
    cfg.write_text(PREFETCH_CONFIG.format(device=int(size * 1.4) + (128 << 20), copy=copy, path=model_path()))
    s = Server("--config", str(cfg))
    try:
        prefetches = lambda: s.metrics().get("ingot_model_prefetches_total", 0.0, model="p1")
        assert prefetches() == 0
        for m in ["p1", "p2", "p1", "p2"]:  # p1: asked twice, evicted, no warm copy
            assert complete(s, m, max_tokens=1).status_code == 200
        # Out of the page cache, as a cold file would be. The registry looks
        # once a second, so its read may already be under way (or done) when
        # the drop lands: the read-back is checked only when the drop took
        # (most of the file gone, no prefetch counted yet); the count always.
        with open(copy, "rb") as f:
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_DONTNEED)
        before, dropped_first = resident_bytes(copy), prefetches() == 0
        wait_for(lambda: prefetches() == 1, 10, what="p1 prefetched")
        if before is not None and dropped_first and before < size // 2:
            wait_for(lambda: resident_bytes(copy) > size * 0.9, 10,
                     what=f"p1's file ({size} B, {before} B cached after the drop) read into the page cache")
        # Once per window: nothing to poll for (the check is that no second
        # prefetch comes), so a kept sleep over two of the registry's 1 s looks.
        time.sleep(2.5)
        assert prefetches() == 1
        assert s.metrics().get("ingot_model_prefetches_total", 0.0, model="p2") == 0
        assert complete(s, "p1", max_tokens=1).status_code == 200
    finally:
        s.stop_and_check()


def test_a_cache_hit_for_a_sleeping_model_neither_loads_nor_wakes_it(server_factory, tmp_path):
    """The response cache answers before the registry is visited: a cached
    answer for a model asleep in host memory comes back without waking it."""
    import os
    size = os.path.getsize(model_path())
    cfg = tmp_path / "ingot.toml"
    cfg.write_text(WARM_CONFIG.format(device=int(size * 1.4) + (128 << 20), host=int(size * 1.2),
                                      path=model_path()))
    srv = server_factory("--config", str(cfg), env={"INGOT_FLAG_RESPONSE_CACHE": "on"})
    loads = lambda src: srv.metrics().get("ingot_model_loads_total", 0.0, model="left", result="ok", source=src)
    body = {"model": "left", "prompt": "The capital of France is", "max_tokens": 4, "temperature": 0}
    with srv.http(timeout=120) as http:
        first = http.post("/v1/completions", json=body)
        assert first.status_code == 200, first.text
        assert first.headers["x-ingot-cache"] == "miss"
        # Loading "right" evicts "left", which goes to sleep in host memory.
        r = http.post("/v1/completions", json={**body, "model": "right"})
        assert r.status_code == 200, r.text
        left = {m["id"]: m for m in admin(srv)["data"]}["left"]
        assert left["state"] == "unloaded" and left["host_bytes"] > 0, left
        before = (loads("file"), loads("warm"))
        again = http.post("/v1/completions", json=body)
        assert again.status_code == 200, again.text
        assert again.headers["x-ingot-cache"] == "hit"
        assert again.json()["choices"][0]["text"] == first.json()["choices"][0]["text"]
    assert (loads("file"), loads("warm")) == before
    left = {m["id"]: m for m in admin(srv)["data"]}["left"]
    assert left["state"] == "unloaded" and left["host_bytes"] > 0, left
