#!/usr/bin/env python3
"""One summary line of an `ingot bench ... --json` result (its last JSON line):
    bench_row.py FILE LABEL   (throughput: decode tok/s after prefills, end to end;
                               latency: decode tok/s)"""
import json
import sys

path, label = sys.argv[1], sys.argv[2]
lines = open(path).read().strip().splitlines()
if not lines:
    print(f"{label:40} no result")
    sys.exit(1)
r = json.loads(lines[-1])
if "decode_tok_s_after_prefill" in r:
    print(f"{label:40} decode {r['decode_tok_s_after_prefill']:8.1f} tok/s  e2e {r['elapsed_s']:.2f} s")
else:
    print(f"{label:40} decode {r['decode_tok_s']:8.1f} tok/s")
