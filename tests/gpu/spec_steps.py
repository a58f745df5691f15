"""Where a speculative decode step's time goes on CUDA: `ingot serve` with
n-gram speculation and the engine's debug log, the committed input-grounded
prompts at batch 1 with speculation on and then off (`"speculative": false`);
from the log's `step` / `speculative step` lines: per kind of step (a plain
`step` of more than one token is a prompt's prefill step), its count,
the mean forward time (launch to ids on the host), step time (forward plus
verification and delivery) and the interval from the step before (the rest
is the engine loop between steps: proposals, schedule, staging).

The server is speculative.py's (`Server`: CUDA, `--max-num-seqs 64`).

Usage: spec_steps.py --ingot BIN --model GGUF --prompts JSON [--max-tokens 128] [--n 12]"""

import argparse
import json
import re
import statistics
from datetime import datetime

from speculative import Server

LINE = re.compile(r"^(\S+Z)\s+DEBUG\s+\S+: (speculative step|step) (.*)$")


def parse(log):
    """(kind, seconds since epoch, fields) of every step line."""
    steps = []
    for line in log.splitlines():
        m = LINE.match(line)
        if not m:
            continue
        ts = datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
        fields = dict(kv.split("=", 1) for kv in m.group(3).split() if "=" in kv)
        steps.append((m.group(2), ts, fields))
    return steps


def summary(steps, label):
    rows = {}
    for (kind, ts, f), prev in zip(steps[1:], steps):
        gap = (ts - prev[1]) * 1e3
        if int(f.get("seqs", "0")) != 1 or gap > 50:  # another request's first step
            continue
        if kind == "step" and int(f["tokens"]) > 1:
            kind = "prefill step"
        r = rows.setdefault(kind, {"n": 0, "forward": [], "step": [], "gap": [], "tokens": []})
        r["n"] += 1
        r["step"].append(float(f["step_ms"]))
        r["forward"].append(float(f.get("forward_ms", "nan")))
        r["gap"].append(gap)
        r["tokens"].append(int(f["tokens"]))
    for kind, r in rows.items():
        mean = lambda v: statistics.fmean(v) if v else float("nan")  # noqa: E731
        print(f"{label:8s} {kind:17s} {r['n']:6d} {mean(r['tokens']):7.2f} {mean(r['forward']):9.3f} "
              f"{mean(r['step']):8.3f} {mean(r['gap']):8.3f}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ingot", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--prompts", required=True)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--n", type=int, default=12)
    a = ap.parse_args()
    prompts = [p for p in json.load(open(a.prompts))["prompts"] if p["kind"] == "grounded"][: a.n]
    # speculative.py's server (n-gram, 7 tokens), with the engine's debug log.
    srv = Server(a.ingot, a.model, "--log-level", "info,ingot_engine=debug")
    try:
        for p in prompts[:3]:  # warm-up
            srv.chat(p["prompt"], True, 16)
        print(f"{'':8s} {'kind':17s} {'steps':>6s} {'tokens':>7s} {'fwd ms':>9s} {'step ms':>8s} {'gap ms':>8s}")
        for on in (True, False):
            start = len(open(srv.log.name).read())
            for p in prompts:
                srv.chat(p["prompt"], on, a.max_tokens)
            summary(parse(open(srv.log.name).read()[start:]), "spec on" if on else "spec off")
    finally:
        srv.stop()


if __name__ == "__main__":
    main()
