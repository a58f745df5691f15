#!/usr/bin/env bash
# Deterministic mode on the GPU machine (issue 19, acceptance 4), over a
# bundle that tests/gpu/run.sh unpacks (binary, cubins, llama3 tokenizer,
# SmolLM2 parts). Run from the repository root:
#   bash DIR/deterministic.sh BUNDLE PHASE...
# DIR holds this script and deterministic_check.py (they travel in the
# carried bundle folder, since the device gets the main checkout).
#   http8b    64 identical + 64 different greedy requests over HTTP, 8B dummy,
#             with and without --deterministic (deterministic_check.py)
#   httpsmol  the same on SmolLM2-135M (real weights with both GGUF parts, else
#             its shape with random weights and the llama3 vocabulary)
#   b1        batch-1 decode, 8B dummy, without and with --deterministic
#   tput      256 x (1024 in, 128 out), 8B dummy, without and with
# Results also go to $OUT as JSON lines (deterministic.jsonl, bench.jsonl).
set -uo pipefail
B=$1; shift
HERE=$(cd "$(dirname "$0")" && pwd)
GPU_BUNDLE=$B bash tests/gpu/run.sh   # unpacks; no phases
W=${GPU_WORK:-/root/ingot-gpu}
O=${OUT:-/tmp/ingot-out}
mkdir -p "$O"
ING=$W/ingot
M=$W/llama-3.1-8b
SMOL=$W/smollm2.gguf
# Two servers share the GPU in the HTTP phases: fixed KV pools.
SERVE="--device cuda --max-num-seqs 128 --kv-cache-tokens 32768 --gpu-memory-utilization 0.4"
for phase in "$@"; do
  echo "=== $phase"
  case $phase in
    http8b)
      timeout -k 5 150 python3 "$HERE/deterministic_check.py" --ingot "$ING" --model "$M" --label llama-3.1-8b-dummy \
        -- $SERVE --load-format dummy --max-model-len 4096 ;;
    httpsmol)
      if [ -f "$SMOL" ]; then
        model=$SMOL label=smollm2-135m extra=""
      else
        # Without the GGUF: SmolLM2-135M's shape with random weights, its
        # vocabulary widened to the llama3 tokenizer's.
        model=$W/smollm2-dummy label=smollm2-135m-shape-dummy extra="--load-format dummy"
        mkdir -p "$model"; cp "$W"/tokenizers/llama3/* "$model/"
        sed 's/"vocab_size": *[0-9]*/"vocab_size": 128256/' tests/gpu/configs/smollm2-135m/config.json > "$model/config.json"
      fi
      timeout -k 5 150 python3 "$HERE/deterministic_check.py" --ingot "$ING" --model "$model" --label "$label" \
        -- $SERVE $extra ;;
    b1)
      for det in "" "--deterministic"; do
        timeout -k 5 100 "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 128 \
          --output-len 256 --num-iters 2 $det --json | sed "s/^{/{\"deterministic\":\"${det}\",/" | tee -a "$O/bench.jsonl"
      done ;;
    tput)
      for det in "" "--deterministic"; do
        timeout -k 5 150 "$ING" bench throughput --model "$M" --load-format dummy --max-model-len 4096 --num-prompts 256 \
          --max-num-seqs 256 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 $det --json \
          | sed "s/^{/{\"deterministic\":\"${det}\",/" | tee -a "$O/bench.jsonl"
      done ;;
    *) echo "unknown phase $phase" ;;
  esac
done
