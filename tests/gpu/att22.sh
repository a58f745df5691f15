#!/usr/bin/env bash
# att22's device calls (decode attention at 256 x 1k): main's binary and
# cubins against the branch's, alternated in one call. Run from the repo
# root with the two bundles (scripts/gpu-bundle) in $B/main and $B/new and
# this folder's scripts in $B/tests:
#   bash $B/tests/att22.sh [PHASE...]   (default: all phases)
# Phases: check (attention kernel checks, branch cubins), kbench (the decode
# kernels alone, split counts 1/2/4/8, bench_decode_attention.py), ncu (the
# FP8 tensor-core kernel at 256 rows, 1 and 8 splits), tput (256 x 1k FP8
# weights + FP8 KV, and bf16; the branch's bf16 also with the tensor-core
# kernel), profile (eager per-step attention, FP8), mid (64 x 1k, FP8 and
# bf16), b1 (batch 1, bf16 and FP8 KV), kbench_small (the branch's kernels at
# 32 and 16 rows), tput2 (256 x 1k at the branch's defaults, FP8 twice
# alternated), kvacc (compare_kv_dtype.py through the tensor-core kernel).
set -uo pipefail
export PYTHONUNBUFFERED=1
B=${B:-.gpu-att22}
W=/root/att22
O=${OUT:-/tmp/att22-out}
mkdir -p "$W" "$O"
for v in main new; do
  rm -rf "${W:?}/$v"; mkdir -p "$W/$v"
  gunzip -c "$B/$v/ingot.gz" > "$W/$v/ingot" && chmod +x "$W/$v/ingot"
  for f in "$B/$v"/cubins/*.cubin.gz; do gunzip -c "$f" > "$W/$v/$(basename "$f" .gz)"; done
done
M=$W/llama-3.1-8b
mkdir -p "$M"
cp tests/gpu/configs/llama-3.1-8b/config.json "$M/"
for f in "$B"/main/tokenizers/llama3/*.gz; do gunzip -c "$f" > "$M/$(basename "$f" .gz)"; done
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
T="timeout -k 5 150"
TP="bench throughput --model $M --load-format dummy --max-model-len 4096 --input-len 1024 --max-num-batched-tokens 8192 --json"
tput() {  # LABEL VERSION ARGS...: one throughput row, summarized
  local label=$1 v=$2; shift 2
  $T "$W/$v/ingot" $TP "$@" > "$O/run.json" 2> "$O/run.err"
  python3 "$B/tests/bench_row.py" "$O/run.json" "$label ($v)" || tail -3 "$O/run.err"
  cat "$O/run.json" >> "$O/bench.jsonl"
}
phases=${*:-check kbench ncu tput profile mid b1}
for phase in $phases; do
  echo "=== $phase"
  case $phase in
    check)
      $T python3 "$B/tests/check_kernels.py" --cubins "$W/new" --only attention > "$O/check.txt" 2>&1
      grep -E "^FAIL" "$O/check.txt"
      python3 -c 'import re,sys,collections
mx = collections.defaultdict(float)
for line in open(sys.argv[1]):
    m = re.match(r"\S+\s+(\S+).*max rel err (\S+)", line)
    if m: mx[m.group(1)] = max(mx[m.group(1)], float(m.group(2)))
for k, v in sorted(mx.items()): print(f"{k:32} worst max rel err {v:.2e}")' "$O/check.txt"
      tail -1 "$O/check.txt" ;;
    kbench)
      $T python3 "$B/tests/bench_decode_attention.py" main="$W/main:old" new="$W/new" --rows 256,64 --splits 1,2,4,8 \
        2>&1 | tee "$O/kbench.txt" ;;
    ncu)
      timeout -k 5 200 ncu --kernel-name regex:paged_attention_tc_fp8 --section SpeedOfLight --section Occupancy \
        --section WarpStateStats --section LaunchStats --section MemoryWorkloadAnalysis \
        python3 "$B/tests/bench_decode_attention.py" main="$W/main:old" new="$W/new" --rows 256 --splits 1,8 --kv fp8 \
        --kernel tc --once > "$O/ncu.txt" 2>&1
      grep -E 'paged_attention_tc|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Grid Size|Warp Cycles Per Issued|Issued Warp|No Eligible|Stall' "$O/ncu.txt" | grep -v '^ *-' | head -60 ;;
    kbench_order)  # an experimental cubin in $B/exp whose tensor-core grid is (kv heads, rows, splits)
      mkdir -p "$W/exp" && gunzip -c "$B/exp/attention.sm_90.cubin.gz" > "$W/exp/attention.sm_90.cubin"
      $T python3 "$B/tests/bench_decode_attention.py" new="$W/new" kvfirst="$W/exp:kvfirst" new="$W/new" \
        kvfirst="$W/exp:kvfirst" --rows 256,64 --splits 1,2 --kernel tc 2>&1 | tee "$O/kbench_order.txt" ;;
    kbench_small)
      $T python3 "$B/tests/bench_decode_attention.py" new="$W/new" --rows 32,16 --splits 1,2,3,4,5,8 \
        2>&1 | tee "$O/kbench_small.txt" ;;
    tput)
      for v in main new; do tput "256x1k fp8 w + fp8 kv" $v --num-prompts 256 --max-num-seqs 256 --output-len 128 --quantization fp8 --kv-cache-dtype fp8; done
      for v in main new; do tput "256x1k bf16" $v --num-prompts 256 --max-num-seqs 256 --output-len 128; done
      INGOT_CUDA_TC_DECODE_MIN_ROWS=192 tput "256x1k bf16, tc kernel >=192 rows" new --num-prompts 256 --max-num-seqs 256 --output-len 128 ;;
    tput2)  # the branch's defaults (tensor-core kernel from 64 rows, bf16 and FP8 caches)
      for v in main new main new; do tput "256x1k fp8 w + fp8 kv" $v --num-prompts 256 --max-num-seqs 256 --output-len 128 --quantization fp8 --kv-cache-dtype fp8; done
      for v in main new; do tput "256x1k bf16" $v --num-prompts 256 --max-num-seqs 256 --output-len 128; done ;;
    kvacc)  # FP8 vs bf16 cache through the branch's tensor-core kernel (forced on for every row count)
      INGOT_CUDA_TC_DECODE_MIN_ROWS=1 timeout -k 5 200 python3 tests/gpu/compare_kv_dtype.py --ingot "$W/new/ingot" --model "$M" \
        --prompts 2 -- --load-format dummy --max-model-len 4096 --enforce-eager 2>&1 | tail -4 ;;
    profile)
      for v in main new; do
        echo "$v"
        INGOT_CUDA_PROFILE=1 $T "$W/$v/ingot" $TP --num-prompts 256 --max-num-seqs 256 --output-len 32 --quantization fp8 \
          --kv-cache-dtype fp8 2>&1 | grep -E "cuda profile" | sed 's/^.*ingot cuda profile: //'
      done ;;
    mid)
      for v in main new; do tput "64x1k fp8 w + fp8 kv" $v --num-prompts 64 --max-num-seqs 64 --output-len 128 --quantization fp8 --kv-cache-dtype fp8; done
      INGOT_CUDA_TC_DECODE_MIN_ROWS=0 INGOT_CUDA_TC_DECODE_FP8_MIN_ROWS=0 tput "64x1k fp8 w + fp8 kv, simt" new --num-prompts 64 --max-num-seqs 64 --output-len 128 --quantization fp8 --kv-cache-dtype fp8
      for v in main new; do tput "64x1k bf16" $v --num-prompts 64 --max-num-seqs 64 --output-len 128; done
      INGOT_CUDA_TC_DECODE_MIN_ROWS=0 tput "64x1k bf16, simt" new --num-prompts 64 --max-num-seqs 64 --output-len 128 ;;
    b1)
      for v in main new; do
        for kv in bf16 fp8; do
          $T "$W/$v/ingot" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 128 \
            --output-len 256 --num-iters 3 --kv-cache-dtype $kv --json > "$O/run.json" 2>/dev/null
          python3 "$B/tests/bench_row.py" "$O/run.json" "batch 1, kv $kv ($v)"
          cat "$O/run.json" >> "$O/bench.jsonl"
        done
      done ;;
  esac
done
