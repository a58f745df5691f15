#!/usr/bin/env bash
# Per-kernel time and DRAM traffic of the non-GEMM kernels of one 1024-token
# prefill (8B dummy, eager), each kernel isolated by ncu, summed by name.
#   ncu_prefill.sh INGOT MODEL_DIR OUT_CSV
set -uo pipefail
ING=$1; M=$2; CSV=$3
timeout -k 5 240 ncu --kernel-name regex:'add_rms_norm|silu_mul|rope_qkv|embed|prefill_attention' --launch-count 200 \
  --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
  "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 1024 --output-len 1 \
  --max-num-batched-tokens 1024 --num-iters 1 --enforce-eager > "$CSV" 2>/dev/null
python3 tests/gpu/ncu_summary.py "$CSV"
