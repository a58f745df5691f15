#!/usr/bin/env bash
# Two models on one GPU with no budget and no kv_cache_tokens: the budget
# defaults to model.gpu_memory_utilization of the GPU, and each model's KV
# cache is sized from an equal share of it, so both stay loaded together
# (before, the first engine took 90% of free memory and the second could
# not load). Usage: models_share.sh INGOT_BINARY DUMMY_DIR
set -uo pipefail
ING=$1; MODEL=$2
CFG=$(mktemp --suffix=.toml)
cat >"$CFG" <<TOML
[[models]]
id = "one"
path = "$MODEL"
load_format = "dummy"
preload = true
[[models]]
id = "two"
path = "$MODEL"
load_format = "dummy"
TOML
. "$(dirname "$0")/server.sh"
start_server "$ING" serve --config "$CFG" --port 0 --device cuda
fail=0
for m in one two one two; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H 'content-type: application/json' "$URL/v1/completions" \
    -d "{\"model\":\"$m\",\"prompt\":\"Hello\",\"max_tokens\":4}")
  echo "request $m: $code"; [ "$code" = 200 ] || fail=1
done
used=$(nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader,nounits | head -1)
echo "GPU memory used, total (MiB): $used"
curl -s "$URL/admin/models" | python3 -c '
import json,sys; a=json.load(sys.stdin)
print("registry: device used", a["device_bytes_used"] >> 20, "MiB of", a["device_budget_bytes"] >> 20, "MiB budget")
for m in a["data"]: print("  ", m["id"], m["state"], "device", m["device_bytes"] >> 20, "MiB")
sys.exit(0 if all(m["state"] == "loaded" for m in a["data"]) else 1)' || fail=1
curl -s "$URL/metrics" | grep -E '^ingot_model_evictions_total' | grep -v ' 0$'
grep -E "GPU memory reserved|GPU load breakdown" "$LOG" | sed 's/\x1b\[[0-9;]*m//g' | head -4
[ $fail = 0 ] && echo "models share: ok" || { echo "models share: FAILED"; tail -20 "$LOG"; }
stop_server
exit $fail
