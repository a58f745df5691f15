#!/usr/bin/env bash
# Weight loading on the GPU machine (issue 13): the old loader (f32 round
# trip, a sync per tensor) against the streaming one, on BF16 GGUFs with
# random weights written here (write_gguf.py; numpy only).
#   1. correctness: 2-layer Llama-3-8B-shaped GGUFs in bf16 and f16, logits
#      of old vs new binary (expected identical) and new CUDA vs CPU bf16
#   2. timing: process start to /ready of `ingot serve` on the full 8B BF16
#      GGUF, old and new alternated, page cache warm
# Bundle (.gpu/, carried): ingot-old.gz, ingot-new.gz,
# tokenizers/llama3/tokenizer.json.gz. Usage: tests/gpu/load_bench.sh [RUNS]
# (The device tool sends the session's main checkout, not a worktree: from a
# worktree, copy this script, load_bench.py, write_gguf.py,
# configs/llama-3.1-8b/ and the bundle into an ignored folder of the main
# checkout, e.g. .gpu-load/{tests/gpu,.gpu}, carry it and run it from there.)
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1 INGOT_LOG=info
B=${GPU_BUNDLE:-.gpu}; W=${GPU_WORK:-/root/ingot-load}; O=${OUT:-/tmp/ingot-out}
RUNS=${1:-2}
mkdir -p "$W/tok" "$O"
for b in old new; do gunzip -c "$B/ingot-$b.gz" > "$W/$b"; chmod +x "$W/$b"; done
gunzip -c "$B/tokenizers/llama3/tokenizer.json.gz" > "$W/tok/tokenizer.json"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
nproc; free -g | head -2
CFG=tests/gpu/configs/llama-3.1-8b/config.json
IDS=128000,791,6864,315,9822,374,12366,13,578,6864
fail=0
echo "=== correctness (2 layers of the 8B shape)"
for dt in bf16 f16; do
  M="$W/small-$dt.gguf"
  python3 tests/gpu/write_gguf.py --config "$CFG" --tokenizer "$W/tok" --layers 2 --dtype $dt --out "$M" || fail=1
  for b in old new; do
    "$W/$b" logits --model "$M" --device cuda --prompt-ids $IDS --out "$W/$dt.$b.bin" 2>&1 | tail -3
  done
  "$W/new" logits --model "$M" --device cpu --dtype bf16 --prompt-ids $IDS --out "$W/$dt.cpu.bin" 2>&1 | tail -1
  python3 - "$W" $dt <<'PY' || fail=1
import sys, numpy as np
w, dt = sys.argv[1:]
old, new, cpu = (np.fromfile(f"{w}/{dt}.{k}.bin", dtype="<f4") for k in ("old", "new", "cpu"))
d_on = float(np.abs(old - new).max()); d_nc = float(np.abs(new - cpu).max())
print(f"{dt}: max|old-new| {d_on:.3g}  max|new-cpu| {d_nc:.3g} (logit scale {np.abs(cpu).max():.3g})  "
      f"argmax old/new/cpu {old.argmax()}/{new.argmax()}/{cpu.argmax()}")
sys.exit(0 if d_on == 0.0 and d_nc < 2e-2 * max(1.0, float(np.abs(cpu).max())) else 1)
PY
  rm -f "$M"
done
echo "=== timing (8B BF16 GGUF, serve to /ready)"
M="$W/llama-3.1-8b-bf16.gguf"
t=$(date +%s%N)
python3 tests/gpu/write_gguf.py --config "$CFG" --tokenizer "$W/tok" --out "$M" || exit 1
echo "written in $(( ($(date +%s%N) - t) / 1000000 )) ms"; ls -l "$M"
t=$(date +%s%N); cat "$M" > /dev/null; echo "page-cache read (cat) in $(( ($(date +%s%N) - t) / 1000000 )) ms"
python3 tests/gpu/load_bench.py --model "$M" --runs "$RUNS" old="$W/old" new="$W/new" | tee "$O/load.jsonl" || fail=1
echo "load_bench fail=$fail"
exit $fail
