"""KV tiers on CUDA (docs/kv-cache.md, "Tiers"): an 8B-shaped dummy whose
KV pool holds one 16k-token prefix; a second prefix evicts the first to the
host tier, and the first comes back from there. Prints TTFT cold (prefill),
from the device prefix cache, and from host memory; the copy bandwidth
(engine metrics) against the pinned-copy floor (PyTorch); and, with
--deterministic, that restored pages give the same tokens as computing them.

Usage: kv_tiers.py --ingot BIN --model DIR [--tokens 16384]"""

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
import urllib.request


def post(url, body, timeout=600):
    req = urllib.request.Request(url + "/v1/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    t0 = time.perf_counter()
    out = json.load(urllib.request.urlopen(req, timeout=timeout))
    return time.perf_counter() - t0, out


def metric(url, name, **labels):
    text = urllib.request.urlopen(url + "/metrics", timeout=30).read().decode()
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


class Server:
    def __init__(self, ingot, model, tokens, extra):
        cfg = tempfile.NamedTemporaryFile("w", suffix=".toml", delete=False)
        cfg.write('[kv_tiers]\nhost_bytes = "24GiB"\n')
        cfg.close()
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        # The pool holds one prefix (and its answer), not two.
        kv = tokens + tokens // 2
        self.proc = subprocess.Popen(
            [ingot, "serve", "--model", model, "--load-format", "dummy", "--port", "0", "--config", cfg.name,
             "--max-model-len", str(2 * tokens), "--kv-cache-tokens", str(kv), *extra],
            stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        self.url = None
        while time.time() < deadline:
            if self.proc.poll() is not None:
                sys.exit("server exited:\n" + open(self.log.name).read()[-3000:])
            m = re.search(r"http://[0-9.:]+", open(self.log.name).read())
            if m:
                try:
                    urllib.request.urlopen(m.group(0) + "/ready", timeout=2)
                    self.url = m.group(0)
                    return
                except Exception:
                    pass
            time.sleep(0.2)
        sys.exit("server not ready:\n" + open(self.log.name).read()[-3000:])

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)


def prompt(seed, n):
    rng = random.Random(seed)
    return [rng.randrange(1000, 120000) for _ in range(n)]


def pinned_floor(gib=2):
    import torch
    n = gib << 30
    host = torch.empty(n, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    rates = {}
    for name, (dst, src) in {"h2d": (dev, host), "d2h": (host, dev)}.items():
        dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(3):
            dst.copy_(src, non_blocking=True)
        torch.cuda.synchronize()
        rates[name] = 3 * n / (time.perf_counter() - t0) / 1e9
    del host, dev
    torch.cuda.empty_cache()
    return rates


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--tokens", type=int, default=16384)
    args = ap.parse_args()
    n = args.tokens
    floor = pinned_floor()
    print(f"pinned-copy floor (PyTorch, 2 GiB): H2D {floor['h2d']:.1f} GB/s, D2H {floor['d2h']:.1f} GB/s")

    # Correctness: restored pages give the tokens computing them gave.
    srv = Server(args.ingot, args.model, 4096, ["--deterministic"])
    try:
        a, b = prompt(1, 4000), prompt(2, 4000)
        greedy = {"max_tokens": 16, "temperature": 0, "ignore_eos": True}
        _, cold = post(srv.url, {"prompt": a, **greedy})
        post(srv.url, {"prompt": b, **greedy})
        _, back = post(srv.url, {"prompt": a, **greedy})
        cached = back["usage"]["prompt_tokens_details"]["cached_tokens"]
        same = cold["choices"][0]["text"] == back["choices"][0]["text"]
        hits = metric(srv.url, "ingot_kv_tier_hits_total", tier="host")
        print(f"deterministic, 4000-token prompt: restored {cached} cached tokens ({hits:.0f} host pages), "
              f"same 16 tokens as computed: {'yes' if same else 'NO'}")
    finally:
        srv.stop()

    srv = Server(args.ingot, args.model, n, [])
    try:
        a, b = prompt(11, n), prompt(12, n)
        one = {"max_tokens": 1, "temperature": 0}
        post(srv.url, {"prompt": prompt(10, 512), **one})  # warm-up
        rows = []
        t_cold, _ = post(srv.url, {"prompt": a, **one})
        t_dev, r = post(srv.url, {"prompt": a, **one})
        rows.append(("cold (prefill)", t_cold, 0))
        rows.append(("device prefix cache", t_dev, r["usage"]["prompt_tokens_details"]["cached_tokens"]))
        for i in range(3):
            post(srv.url, {"prompt": b, **one})  # evicts a to the host tier
            t, r = post(srv.url, {"prompt": a, **one})
            rows.append((f"host tier #{i + 1}", t, r["usage"]["prompt_tokens_details"]["cached_tokens"]))
        # With think time between requests the idle engine copies the pages
        # it will evict next ahead of time: the next burst copies nothing.
        for i in range(2):
            time.sleep(2)
            post(srv.url, {"prompt": b, **one})
            time.sleep(2)
            t, r = post(srv.url, {"prompt": a, **one})
            rows.append((f"host tier, 2 s idle #{i + 1}", t, r["usage"]["prompt_tokens_details"]["cached_tokens"]))
        t_cold_b, _ = post(srv.url, {"prompt": prompt(13, n), **one})
        rows.append(("cold again (prefill)", t_cold_b, 0))
        for name, t, cached in rows:
            print(f"{n}-token prefix, {name:26} TTFT {t * 1000:8.1f} ms  cached {cached}")
        for d in ("out", "in"):
            by = metric(srv.url, "ingot_kv_tier_copy_bytes_total", direction=d)
            s = metric(srv.url, "ingot_kv_tier_copy_seconds_sum", direction=d)
            floor_d = floor["d2h" if d == "out" else "h2d"]
            if s > 0:
                print(f"copy {d:3}: {by / 1e9:.2f} GB in {s:.3f} s = {by / s / 1e9:.1f} GB/s "
                      f"({by / s / 1e9 / floor_d * 100:.0f} % of the pinned {('D2H' if d == 'out' else 'H2D')} floor)")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
