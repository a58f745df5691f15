#!/usr/bin/env bash
# Per-kernel time and DRAM traffic of one batch-1 decode step (8B dummy),
# each kernel isolated by ncu (no overlap between kernels), summed by name.
#   ncu_decode.sh INGOT MODEL_DIR OUT_CSV [ENGINE ARGS...] (e.g. --quantization fp8)
set -uo pipefail
ING=$1; M=$2; CSV=$3; shift 3
timeout -k 5 240 ncu --kernel-name regex:'gemv|paged|combine|argmax|embed' --launch-skip 200 --launch-count 197 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
  "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 128 --output-len 16 \
  --num-iters 1 --enforce-eager "$@" > "$CSV" 2>/dev/null
python3 tests/gpu/ncu_summary.py "$CSV"
