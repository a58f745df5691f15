#!/usr/bin/env bash
# Several models on one GPU: two SmolLM2-shaped dummy models under a device
# budget that holds one, requests alternating between them (each one a
# switch: unload one engine, load the other). Prints the time to first token
# of every request and /admin/models. Usage:
#   models_smoke.sh INGOT_BINARY MODEL_DIR
set -uo pipefail
ING=$1; MODEL=$2
CFG=$(mktemp --suffix=.toml)
cat >"$CFG" <<TOML
[registry]
device_budget = "600MB"
[[models]]
id = "one"
path = "$MODEL"
load_format = "dummy"
kv_cache_tokens = 4096
preload = true
[[models]]
id = "two"
path = "$MODEL"
load_format = "dummy"
kv_cache_tokens = 4096
TOML
. "$(dirname "$0")/server.sh"
start_server "$ING" serve --config "$CFG" --port 0 --device cuda
fail=0
ttft() {  # model -> seconds to the first byte of a one-token stream
  curl -s -o /dev/null -w '%{http_code} %{time_starttransfer}' -H 'content-type: application/json' \
    "$URL/v1/completions" -d "{\"model\":\"$1\",\"prompt\":\"Hello\",\"max_tokens\":1,\"stream\":true}"
}
for m in one one one; do echo "loaded   $m $(ttft $m)"; done
for i in $(seq 1 10); do
  m=$([ $((i % 2)) = 1 ] && echo two || echo one)
  out=$(ttft $m); echo "switch   $m $out"
  [ "${out%% *}" = 200 ] || fail=1
done
curl -s "$URL/admin/models"; echo
curl -s "$URL/metrics" | grep -E '^ingot_model_(loads_total|evictions_total|load_seconds_(sum|count))' | head -12
[ $fail = 0 ] && echo "models smoke: ok" || { echo "models smoke: FAILED"; tail -20 "$LOG"; }
exit $fail
