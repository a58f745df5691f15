#!/usr/bin/env bash
# What `ingot route` costs on the GPU (docs/benchmarks.md, issue 16
# acceptance 6): one `ingot serve` worker, and `ingot route` in front of it;
# `ingot bench serve` (random prompts, --ignore-eos, concurrency 64) against
# the worker directly and through the router, alternated for ROUNDS rounds,
# then a table and the router/direct throughput ratio.
# Usage: router_smoke.sh INGOT_BINARY MODEL [extra serve flags...]
# Env: ROUNDS (3), PROMPTS (256), INPUT_LEN (256), OUTPUT_LEN (128), CONC (64).
set -uo pipefail
ING=$1; MODEL=$2; shift 2
ROUNDS=${ROUNDS:-3}; PROMPTS=${PROMPTS:-256}; INPUT_LEN=${INPUT_LEN:-256}
OUTPUT_LEN=${OUTPUT_LEN:-128}; CONC=${CONC:-64}
. "$(dirname "$0")/server.sh"
start_server "$ING" serve --model "$MODEL" --port 0 "$@"
WORKER=$URL
RLOG=$(mktemp)
"$ING" route --port 0 --worker "$WORKER" >"$RLOG" 2>&1 &
RPID=$!
trap 'kill $PID $RPID 2>/dev/null' EXIT
ROUTER=
for _ in $(seq 1 300); do
  ROUTER=$(sed -n 's/^listening on \(http:[0-9.:/]*\).*/\1/p' "$RLOG" | head -1)
  [ -n "$ROUTER" ] && curl -sf "$ROUTER/ready" >/dev/null && break
  kill -0 $RPID 2>/dev/null || { echo "router did not start"; cat "$RLOG"; exit 1; }
  sleep 0.1
done
curl -sf "$ROUTER/ready" >/dev/null || { echo "router not ready"; cat "$RLOG"; exit 1; }
OUT=$(mktemp -d)
# Every run has prompts of its own (seed 2 x round + its place in the
# round): with a shared seed the second run of a round would find the
# first's prompts in the worker's prefix cache.
run() {  # label url round place -> a table row; the summary in $OUT/label.round.json
  "$ING" bench serve --base-url "$2" --tokenizer "$MODEL" --dataset random \
    --input-len "$INPUT_LEN" --output-len "$OUTPUT_LEN" --ignore-eos --num-prompts "$PROMPTS" \
    --max-concurrency "$CONC" --seed $(($3 * 2 + $4)) --out "$OUT/$1.$3.json" >/dev/null 2>"$OUT/err" \
    || { echo "bench against $1 failed"; cat "$OUT/err"; exit 1; }
  python3 - "$OUT/$1.$3.json" "$1" "$3" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))["summary"]
print(f"| {sys.argv[3]} | {sys.argv[2]} | {s['completed']} | {s['output_tok_s']:.1f} | "
      f"{s['ttft']['median']:.1f} | {s['ttft']['p99']:.1f} | {s['tpot']['median']:.2f} |")
PY
}
echo "| round | path | completed | out tok/s | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms |"
echo "|---|---|---|---|---|---|---|"
for r in $(seq 0 $((ROUNDS - 1))); do
  if [ $((r % 2)) = 0 ]; then run direct "$WORKER" "$r" 0; run router "$ROUTER" "$r" 1
  else run router "$ROUTER" "$r" 0; run direct "$WORKER" "$r" 1; fi
done
python3 - "$OUT" <<'PY'
import glob, json, statistics, sys
def mean(label, key):
    return statistics.mean(json.load(open(f))["summary"][key]
                           for f in glob.glob(f"{sys.argv[1]}/{label}.*.json"))
d, r = mean("direct", "output_tok_s"), mean("router", "output_tok_s")
ttft = lambda label: statistics.mean(json.load(open(f))["summary"]["ttft"]["median"]
                                     for f in glob.glob(f"{sys.argv[1]}/{label}.*.json"))
print(f"\nthroughput router/direct = {r / d:.3f}; TTFT p50 router-direct = {ttft('router') - ttft('direct'):+.2f} ms")
PY
kill $RPID 2>/dev/null; wait $RPID 2>/dev/null
stop_server
