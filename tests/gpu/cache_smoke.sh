#!/usr/bin/env bash
# The request pipeline on the CUDA backend with curl: a repeated greedy
# request is a cache miss then a hit with the same text, 8 identical
# concurrent requests cost one engine generation (coalescing), and a cache
# hit's latency. Usage: cache_smoke.sh INGOT_BINARY MODEL [extra serve flags...]
set -uo pipefail
ING=$1; MODEL=$2; shift 2
. "$(dirname "$0")/server.sh"
start_server env INGOT_FLAG_RESPONSE_CACHE=on "$ING" serve --model "$MODEL" --port 0 "$@"
fail=0
engine() { curl -s "$URL/metrics" | awk '/^ingot_engine_requests_total/ {s += $NF} END {print s + 0}'; }
post() {  # body -> the x-ingot-cache value; the text goes to $LOG.text
  curl -s -D "$LOG.hdr" -o "$LOG.body" -H 'content-type: application/json' "$URL/v1/completions" -d "$1"
  python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["choices"][0]["text"])' "$LOG.body" > "$LOG.text"
  tr -d '\r' < "$LOG.hdr" | awk -F': ' 'tolower($1)=="x-ingot-cache" {print $2}'
}
B='{"prompt":"The capital of France is","max_tokens":32,"temperature":0}'
s1=$(post "$B"); t1=$(cat "$LOG.text")
s2=$(post "$B"); t2=$(cat "$LOG.text")
printf '%-30s %s / %s, same text: %s\n' "repeat: first / second" "$s1" "$s2" "$([ "$t1" = "$t2" ] && echo yes || echo no)"
[ "$s1" = miss ] && [ "$s2" = hit ] && [ "$t1" = "$t2" ] || fail=1
before=$(engine)
C='{"prompt":"Write a long story about a robot","max_tokens":128,"temperature":0,"ignore_eos":true}'
for i in $(seq 1 8); do curl -s -o /dev/null -H 'content-type: application/json' "$URL/v1/completions" -d "$C" & done
for p in $(jobs -p); do [ "$p" = "$PID" ] || wait "$p"; done
after=$(engine)
printf '%-30s %s\n' "8 identical: engine requests" "$((after - before))"
[ "$((after - before))" = 1 ] || fail=1
hit_ms=$(for i in $(seq 1 20); do curl -s -o /dev/null -w '%{time_total}\n' -H 'content-type: application/json' "$URL/v1/completions" -d "$B"; done | sort -n | awk '{a[NR]=$1} END {printf "%.2f", 1000*a[int((NR+1)/2)]}')
printf '%-30s %s ms\n' "cache hit p50 (curl, 20)" "$hit_ms"
[ $fail = 0 ] || tail -20 "$LOG"
echo "cache smoke: $([ $fail = 0 ] && echo PASS || echo FAIL)"
exit $fail
