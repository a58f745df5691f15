"""Speculative decoding on CUDA (docs/speculative.md) with the real SmolLM2:
batch-1 decode rate of the committed prompt set with and without n-gram
speculation (the request field `speculative: false`, alternated in one run on
one server), answers compared; the same under --deterministic, where every
answer must be equal; and 64 concurrent requests with speculation allowed
and not (the policy must make it cost nothing there).

With --llama-server PATH instead: ingot beside llama.cpp's own n-gram
speculation on the same file and prompts, engines alternated per round:
ingot's server (speculation on, the requests without it sent with
`speculative: false`) against llama-server with `--spec-type ngram-simple
--spec-draft-n-max 16` (its documented n-gram mode) and a second
llama-server without it.

Usage: speculative.py --ingot BIN --model GGUF --prompts JSON [--max-tokens 128]
                      [--spec '{"rate_by_match": true}'] [--llama-server PATH]"""

import argparse
import concurrent.futures as cf
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.request


class Server:
    def __init__(self, ingot, model, *extra, spec=json.dumps({"method": "ngram", "num_speculative_tokens": 7})):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        spec_args = ["--speculative-config", spec] if spec else []
        self.proc = subprocess.Popen(
            [ingot, "serve", "--model", model, "--device", "cuda", "--port", "0", "--max-num-seqs", "64",
             *spec_args, *extra],
            stdout=self.log, stderr=subprocess.STDOUT,
            # cuda.* settings given as INGOT_CUDA_* reach the server (A/B runs of one knob).
            env={"INGOT_FLAG_COALESCING": "off", "PATH": "/usr/bin:/bin",
                 **{k: v for k, v in os.environ.items() if k.startswith("INGOT_CUDA_")}})
        deadline = time.time() + 300
        self.url = None
        while time.time() < deadline and self.url is None:
            time.sleep(0.5)
            m = re.search(r"listening on (http://\S+)", open(self.log.name).read())
            if m:
                self.url = m.group(1)
        assert self.url, open(self.log.name).read()[-3000:]
        while time.time() < deadline:
            try:
                models = json.load(urllib.request.urlopen(self.url + "/v1/models", timeout=5))
                if models["data"][0].get("state", "loaded") == "loaded":
                    return
            except Exception:
                pass
            time.sleep(0.5)
        raise SystemExit("server never ready:\n" + open(self.log.name).read()[-3000:])

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)

    def metric(self, name):
        text = urllib.request.urlopen(self.url + "/metrics", timeout=30).read().decode()
        return sum(float(v) for v in re.findall(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M))

    def chat(self, prompt, speculative, max_tokens):
        """(answer, tokens after the first, seconds after the first token)."""
        extra = {} if speculative else {"speculative": False}
        return stream_chat(self.url, prompt, max_tokens, extra)


def stream_chat(url, prompt, max_tokens, extra=None):
    """One greedy streamed chat request: (answer, tokens after the first,
    seconds after the first token); tokens from the usage chunk, else one a
    content chunk."""
    body = {"messages": [{"role": "user", "content": prompt}], "temperature": 0, "max_tokens": max_tokens,
            "stream": True, "stream_options": {"include_usage": True}, **(extra or {})}
    req = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"content-type": "application/json"})
    text, first, tokens, chunks = "", None, 0, 0
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for c in chunk.get("choices", []):
                if c.get("delta", {}).get("content"):
                    first = first or time.perf_counter()
                    text += c["delta"]["content"]
                    chunks += 1
    return text, (tokens or chunks) - 1, time.perf_counter() - (first or time.perf_counter())


class LlamaServer:
    """llama-server on the GPU (every layer offloaded), one slot."""

    def __init__(self, path, model, port, *extra):
        self.log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([path, "-m", model, "-ngl", "99", "--port", str(port), "-np", "1",
                                      "--cache-ram", "0", *extra], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            try:
                if urllib.request.urlopen(self.url + "/health", timeout=5).status == 200:
                    return
            except Exception:
                pass
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise SystemExit("llama-server never ready:\n" + open(self.log.name).read()[-3000:])

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)


def side_by_side(a, prompts, spec_config):
    """ingot and llama.cpp, each with and without its n-gram speculation,
    the engines alternated per round; one table row per engine and kind."""
    ingot = Server(a.ingot, a.model, spec=spec_config)
    spec = LlamaServer(a.llama_server, a.model, 8792, "--spec-type", "ngram-simple", "--spec-draft-n-max", "16")
    plain = LlamaServer(a.llama_server, a.model, 8793)
    try:
        for p in prompts[:4]:  # warm-up (graphs, allocator)
            ingot.chat(p["prompt"], True, 16)
            ingot.chat(p["prompt"], False, 16)
            stream_chat(spec.url, p["prompt"], 16)
            stream_chat(plain.url, p["prompt"], 16)
        print(f"## side by side: ingot --speculative-config {spec_config}; llama-server --spec-type "
              f"ngram-simple --spec-draft-n-max 16; {len(prompts)} prompts, max_tokens {a.max_tokens}")
        print(f"{'round':5s} {'engine':6s} {'kind':9s} {'off tok/s':>10s} {'on tok/s':>10s} {'speedup':>8s} differ")
        for rnd in range(a.rounds):
            for who in (("ingot", "llama") if rnd % 2 == 0 else ("llama", "ingot")):
                if who == "ingot":
                    rates, differ = batch1(ingot, prompts, a.max_tokens, 1)
                else:
                    rates, differ = {(k, s): [0, 0.0] for k in ("grounded", "free") for s in (False, True)}, []
                    for i, p in enumerate(prompts):
                        answers = {}
                        for on in ((False, True) if (i + rnd) % 2 == 0 else (True, False)):
                            text, tokens, secs = stream_chat((spec if on else plain).url, p["prompt"], a.max_tokens)
                            answers[on] = text
                            rates[(p["kind"], on)][0] += tokens
                            rates[(p["kind"], on)][1] += secs
                        if answers[True] != answers[False]:
                            differ.append(p["name"])
                for kind in ("grounded", "free"):
                    off, on = rates[(kind, False)], rates[(kind, True)]
                    print(f"{rnd + 1:5d} {who:6s} {kind:9s} {off[0] / off[1]:10.1f} {on[0] / on[1]:10.1f} "
                          f"{(on[0] / on[1]) / (off[0] / off[1]):7.2f}x {len(differ)}")
    finally:
        for srv in (ingot, spec, plain):
            srv.stop()


def batch1(srv, prompts, max_tokens, rounds):
    rates = {(k, s): [0, 0.0] for k in ("grounded", "free") for s in (False, True)}
    differ = []
    for rnd in range(rounds):
        for i, p in enumerate(prompts):
            answers = {}
            for spec in ((False, True) if (i + rnd) % 2 == 0 else (True, False)):
                text, tokens, secs = srv.chat(p["prompt"], spec, max_tokens)
                answers[spec] = text
                rates[(p["kind"], spec)][0] += tokens
                rates[(p["kind"], spec)][1] += secs
            if answers[True] != answers[False] and p["name"] not in differ:
                differ.append(p["name"])
    return rates, differ


def concurrent(srv, prompts, max_tokens, speculative, n=64):
    jobs = [prompts[i % len(prompts)]["prompt"] for i in range(n)]
    t0 = time.perf_counter()
    with cf.ThreadPoolExecutor(n) as ex:
        outs = list(ex.map(lambda p: srv.chat(p, speculative, max_tokens), jobs))
    wall = time.perf_counter() - t0
    return sum(o[1] + 1 for o in outs) / wall


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--spec", default="{}", help="JSON merged into the speculating servers' --speculative-config")
    ap.add_argument("--llama-server", help="run ingot beside this llama-server instead (see above)")
    ap.add_argument("--default-only", action="store_true",
                    help="only the default path's batch-1 rows (to compare --spec variants in one call)")
    a = ap.parse_args()
    spec_config = json.dumps({"method": "ngram", "num_speculative_tokens": 7, **json.loads(a.spec)})
    print(f"## --speculative-config {spec_config}")
    prompts = json.load(open(a.prompts))["prompts"]
    if a.llama_server:
        return side_by_side(a, prompts, spec_config)
    if a.default_only:
        return speculating(a, prompts, spec_config, "default", (), concurrency=False)
    # The baseline the way users run it: a server without speculation.
    plain = Server(a.ingot, a.model, spec=None)
    try:
        for p in prompts[:4]:
            plain.chat(p["prompt"], False, 16)
        rates, _ = batch1(plain, prompts, a.max_tokens, 1)
        for kind in ("grounded", "free"):
            # Both halves ran without speculation here.
            n = rates[(kind, False)][0] + rates[(kind, True)][0]
            t = rates[(kind, False)][1] + rates[(kind, True)][1]
            print(f"## no speculation configured: {kind} {n / t:.1f} tok/s")
        conc = [concurrent(plain, prompts, a.max_tokens, False) for _ in range(2)]
        print(f"## no speculation configured: 64 concurrent, output tok/s {conc}")
    finally:
        plain.stop()
    for label, extra in (("default", ()), ("deterministic", ("--deterministic",))):
        speculating(a, prompts, spec_config, label, extra, concurrency=label == "default")


def speculating(a, prompts, spec_config, label, extra, concurrency):
    """Batch-1 rates with and without proposals on one speculating server
    (and, with `concurrency`, 64 concurrent requests allowed and not)."""
    srv = Server(a.ingot, a.model, *extra, spec=spec_config)
    try:
        for p in prompts[:4]:  # warm-up (graphs, allocator)
            srv.chat(p["prompt"], True, 16)
            srv.chat(p["prompt"], False, 16)
        d0, k0 = srv.metric("ingot_spec_decode_num_draft_tokens_total"), srv.metric(
            "ingot_spec_decode_num_accepted_tokens_total")
        rates, differ = batch1(srv, prompts, a.max_tokens, a.rounds if label == "default" else 1)
        d1, k1 = srv.metric("ingot_spec_decode_num_draft_tokens_total"), srv.metric(
            "ingot_spec_decode_num_accepted_tokens_total")
        print(f"## {label}: {len(prompts)} prompts, max_tokens {a.max_tokens}, greedy, batch 1; "
              f"kept {k1 - k0:.0f} of {d1 - d0:.0f} proposed")
        print(f"{'kind':9s} {'tokens':>7s} {'off tok/s':>10s} {'on tok/s':>10s} {'speedup':>8s}")
        for kind in ("grounded", "free"):
            off, on = rates[(kind, False)], rates[(kind, True)]
            print(f"{kind:9s} {on[0]:7d} {off[0] / off[1]:10.1f} {on[0] / on[1]:10.1f} "
                  f"{(on[0] / on[1]) / (off[0] / off[1]):7.2f}x")
        print(f"answers that differ ({len(differ)} of {len(prompts)}):", ", ".join(differ) or "none")
        if concurrency:
            rows = []
            for rnd in range(2):
                for spec in ((True, False) if rnd % 2 == 0 else (False, True)):
                    rows.append((spec, concurrent(srv, prompts, a.max_tokens, spec)))
            on = [r for s, r in rows if s]
            off = [r for s, r in rows if not s]
            print(f"64 concurrent, output tok/s: speculation allowed {on}, off {off}, "
                  f"ratio {sum(on) / sum(off):.3f}")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
