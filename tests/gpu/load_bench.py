#!/usr/bin/env python3
"""Cold start of `ingot serve`: seconds from process start to a 200 from
/ready, for several binaries alternated (A B A B ...), page cache warm.

    python3 tests/gpu/load_bench.py --model M.gguf --runs 2 old=BIN new=BIN

Prints one JSON line per run with the server's load log lines (the weight
upload breakdown) and exits 1 if a server never got ready.
"""
import argparse
import json
import re
import subprocess
import tempfile
import time
import urllib.request


def ready_seconds(binary, model, extra, timeout):
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    t0 = time.monotonic()
    p = subprocess.Popen([binary, "serve", "--model", model, "--device", "cuda",
                          "--max-model-len", "4096", "--port", "0", *extra],
                         stdout=log, stderr=subprocess.STDOUT)
    url, ready = None, None
    try:
        while time.monotonic() - t0 < timeout and p.poll() is None:
            if url is None:
                m = re.search(r"http://[0-9.:]+", open(log.name).read())
                url = m.group(0) if m else None
            if url is not None:
                try:
                    with urllib.request.urlopen(url + "/ready", timeout=1) as r:
                        if r.status == 200:
                            ready = time.monotonic() - t0
                            break
                except Exception:
                    pass
            time.sleep(0.01)
    finally:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
    text = open(log.name).read()
    lines = [l.strip() for l in text.splitlines()
             if re.search(r"weights streamed|model loaded|error|panick", l, re.I)]
    return ready, lines, text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--runs", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=120)
    ap.add_argument("bins", nargs="+", help="name=path")
    a = ap.parse_args()
    bins = [b.split("=", 1) for b in a.bins]
    failed = False
    results = {name: [] for name, _ in bins}
    for run in range(a.runs):
        for name, path in bins:
            secs, lines, text = ready_seconds(path, a.model, [], a.timeout)
            if secs is None:
                failed = True
                print(text[-3000:])
            results[name].append(secs)
            print(json.dumps({"bin": name, "run": run, "ready_s": secs, "log": lines}), flush=True)
    for name, xs in results.items():
        ok = [x for x in xs if x is not None]
        print(f"{name}: ready in " + ", ".join(f"{x:.2f}" for x in ok) + " s"
              + (f" (min {min(ok):.2f})" if ok else ""))
    raise SystemExit(1 if failed else 0)


if __name__ == "__main__":
    main()
