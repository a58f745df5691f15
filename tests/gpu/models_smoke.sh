#!/usr/bin/env bash
# Several models on one GPU: two models under a device budget that holds
# one, requests alternating between them, so each request is a switch: the
# other model goes to sleep (device memory back, weights kept in pinned host
# memory) and this one wakes. Prints time to first token after each switch
# (p50/p99 over SWITCHES), whether greedy answers survive sleeping, the
# loads by source, and the device memory the driver reports beside the
# registry's accounting. Usage:
#   models_smoke.sh INGOT_BINARY LABEL MODEL DEVICE_BUDGET [auto|dummy]
# MODEL is a GGUF file, or a directory with a config.json for `dummy`.
set -uo pipefail
ING=$1; LABEL=$2; MODEL=$3; BUDGET=$4; FORMAT=${5:-auto}
SWITCHES=${SWITCHES:-20}
CFG=$(mktemp --suffix=.toml)
cat >"$CFG" <<TOML
[registry]
device_budget = "$BUDGET"
host_budget = "32GB"
[[models]]
id = "one"
path = "$MODEL"
load_format = "$FORMAT"
kv_cache_tokens = 4096
preload = true
[[models]]
id = "two"
path = "$MODEL"
load_format = "$FORMAT"
kv_cache_tokens = 4096
TOML
gpu_used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1; }
echo "[$LABEL] GPU memory used before start: $(gpu_used) MiB"
. "$(dirname "$0")/server.sh"
start_server "$ING" serve --config "$CFG" --port 0 --device cuda
fail=0
ttft() {  # model -> "code seconds" for the first byte of a one-token stream
  curl -s -o /dev/null -w '%{http_code} %{time_starttransfer}' -H 'content-type: application/json' \
    "$URL/v1/completions" -d "{\"model\":\"$1\",\"prompt\":\"Hello\",\"max_tokens\":1,\"stream\":true}"
}
answer() {  # model -> greedy text of 16 tokens
  curl -s -H 'content-type: application/json' "$URL/v1/completions" \
    -d "{\"model\":\"$1\",\"prompt\":\"The capital of France is\",\"max_tokens\":16,\"temperature\":0}" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["choices"][0]["text"])'
}
before=$(answer one)
echo "[$LABEL] GPU memory used, one model loaded: $(gpu_used) MiB"
loaded=(); switched=()
for i in 1 2 3 4 5; do loaded+=("$(ttft one)"); done
# The first switch of each model loads it from the file; later ones wake it.
ttft two >/dev/null; ttft one >/dev/null
for i in $(seq 1 "$SWITCHES"); do
  m=$([ $((i % 2)) = 1 ] && echo two || echo one)
  out=$(ttft $m); switched+=("$out")
  [ "${out%% *}" = 200 ] || fail=1
done
after=$(answer one)
[ "$before" = "$after" ] || { echo "[$LABEL] greedy answer changed after sleeping: '$before' vs '$after'"; fail=1; }
python3 - "$LABEL" "${loaded[*]}" "${switched[*]}" <<'PY'
import sys
label, loaded, switched = sys.argv[1], sys.argv[2].split(), sys.argv[3].split()
def ms(pairs):
    return sorted(float(t) * 1e3 for c, t in zip(pairs[::2], pairs[1::2]))
def pct(v, q):
    return v[min(len(v) - 1, int(q * len(v)))]
a, b = ms(loaded), ms(switched)
print(f"| {label} | model loaded | {pct(a, .5):.1f} ms | {a[-1]:.1f} ms | {len(a)} |")
print(f"| {label} | after a warm switch | {pct(b, .5):.1f} ms | {pct(b, .99):.1f} ms | {len(b)} |")
PY
echo "[$LABEL] GPU memory used after switches (one loaded, one asleep): $(gpu_used) MiB"
curl -s "$URL/admin/models" | python3 -c '
import json,sys; a=json.load(sys.stdin)
print("registry: device used", a["device_bytes_used"] >> 20, "MiB of", a["device_budget_bytes"] >> 20, "MiB budget; host used", a["host_bytes_used"] >> 20, "MiB")
for m in a["data"]: print("  ", m["id"], m["state"], "device", m["device_bytes"] >> 20, "MiB host", m["host_bytes"] >> 20, "MiB")'
curl -s "$URL/metrics" | grep -E '^ingot_(model_loads_total|gpu_memory_bytes)' | grep -v ' 0$'
grep -E "weights copied to host|GPU memory reserved|CUDA graphs captured" "$LOG" | head -6
[ $fail = 0 ] && echo "[$LABEL] models smoke: ok" || { echo "[$LABEL] models smoke: FAILED"; tail -20 "$LOG"; }
stop_server
exit $fail
