#!/usr/bin/env bash
# A/B of batch-1 decode between two ingot binaries in one call: `bench latency`
# (128 in, 256 out, 3 iterations) on the 8B dummy, bf16 and FP8 weights, the
# two binaries alternated ROUNDS times so drift hits both alike; then the
# median decode tok/s of each (binary, weights). Rows go to OUT_JSONL.
#   ab_b1.sh A_BIN B_BIN MODEL_DIR ROUNDS OUT_JSONL [ENGINE ARGS...]
set -uo pipefail
A=$1; B=$2; M=$3; ROUNDS=$4; J=$5; shift 5
for r in $(seq "$ROUNDS"); do
  for q in none fp8; do
    for side in A B; do
      bin=$A; [ $side = B ] && bin=$B
      row=$(timeout -k 5 120 "$bin" bench latency --model "$M" --load-format dummy --max-model-len 4096 \
        --input-len 128 --output-len 256 --num-iters 3 --quantization $q --json "$@" 2>/dev/null | tail -1)
      echo "{\"side\":\"$side\",\"quant\":\"$q\",\"round\":$r,\"row\":${row:-null}}" | tee -a "$J"
    done
  done
done
python3 - "$J" <<'EOF'
import json, statistics, sys
runs = {}
for line in open(sys.argv[1]):
    d = json.loads(line)
    if d["row"]:
        runs.setdefault((d["quant"], d["side"]), []).append(d["row"]["decode_tok_s"])
for (q, side), v in sorted(runs.items()):
    print(f"{q:5} {side}: median {statistics.median(v):7.1f} tok/s  runs {' '.join(f'{x:.1f}' for x in v)}")
EOF
