#!/usr/bin/env bash
# Runs on the GPU machine over a .gpu/ bundle (scripts/gpu-bundle): unpacks
# it, then the phases named on the command line, each printing a short table.
#   kernels   every kernel vs a float64 NumPy reference (check_kernels.py)
#   hf        CUDA vs transformers on 2-layer Llama-3-8B / Qwen3 shapes
#   smollm2   CUDA vs CPU backend on SmolLM2 (bf16 weights); batch-1 speed
#   gemma     Gemma 3 270M (GGUF bundle, `scripts/gpu-bundle gemma3 N`): CUDA vs CPU
#             and the f32 reference on 6 prompts (one past the 512-token window) and a
#             1,670-token one in a KV pool that holds it only if sliding blocks are freed, vs
#             transformers (f32, bf16) on the dequantized weights (compare_gemma.py,
#             the `gguf` wheel from the bundle's whl/); batch-1 speed
#   bench     8B-shaped dummy: batch 1, prefill 1024, 256 x 1024 decode
#   b1        only the batch-1 row of bench (for A/B runs of one knob)
#   prefill   only the 1024-token prefill row of bench
#   ttft      HTTP TTFT of a 1024-token prompt at concurrency 1 on `ingot serve` (8B dummy):
#             scripts/bench-ttft (per request: client TTFT, the engine's prefill forward time,
#             the gap and where it goes), after the engine-only prefill row; then the same
#             with main's old behaviour (chunked prompt, log records through the tracing
#             bridge) for an A/B in one call
#   tput      only the 256 x (1024 in, 128 out) row of bench
#   smolb1    batch 1 on a SmolLM2-135M-shaped dummy (no GGUF needed), graphs on and off
#   qwen3b1   batch 1 on a Qwen3-8B-shaped dummy (q/k norm)
#   profile   per-step GPU time by category (eager) and CPU gaps
#   kvfp8     FP8 KV cache (--kv-cache-dtype fp8): the 256 x (1024 in, 128 out) row, its eager
#             profile, batch 1, and logits rel_l2 / 32-token greedy agreement against the bf16
#             cache (compare_kv_dtype.py) on the 8B dummy and, with its bundle, SmolLM2
#   tcdec     tensor-core decode attention (cuda.tc_decode_min_rows) A/B against the SIMT kernel
#             in one call: the attention kernel checks, 256 / 64 x (1024 in, 128 out) with each, FP8 KV at 256, batch 1,
#             the eager per-step profile with it, and compare_hf with it forced on
#   tcfp8     the FP8-cache half of tcdec: attention kernel checks, 256 x (1024 in, 128 out) and its
#             eager profile with --kv-cache-dtype fp8, SIMT vs tensor cores
#   sampled   the bench shapes with sampling on the GPU (temperature, top-p, top-k)
#   logprobs  the same two with 5 top logprobs per token (also on the GPU)
#   serve     the HTTP server on CUDA with curl (serve_smoke.sh), 8B dummy
#   cache     response cache hit and coalescing on CUDA (cache_smoke.sh), 8B dummy
#   kvtiers   KV tiers (kv_tiers.py), 8B dummy: a 16k-token prefix evicted to host memory and back
#             (TTFT cold / device / host), copy bandwidth against the pinned floor, and with
#             --deterministic the same tokens from restored pages as from computed ones
#   eagle     EAGLE-3 heads on CUDA: capture and head vs the CPU runner (runner-cuda-tests in the
#             bundle), greedy ids equal with a forced random head on the 8B dummy, batch-1 cost
#   eaglesteps  where a step's time goes with that head forced (the engine's debug log)
#   eagleserve  64 concurrent (1024/128) with the random 8B head configured and without;
#             eagleservelog: once each with the engine's debug log, its steps summarised
#   moecarve  cuda.smem_carveout unset / 0 / 25 / 50 / 100 alternated on the Qwen3-30B-A3B dummy's batch 1
#   pdlab     batch 1 with cuda.pdl on and off alternated: the Qwen3-30B-A3B, 8B and SmolLM2-shaped dummies
#   tclmhead  (SmolLM2 bundle) the LM head of 2-8 rows on tensor cores for narrow models: its kernel check,
#             decode steps of 2-8 rows and the prompt set's speculative batch-1 rows with and without
#   tcgemv    cuda.tc_gemv_min_rows: tensor-core GEMVs of 2-8 rows vs float64, beside the CUDA-core ones
#             on the 8B dummy (forced head's verify ids, decode of 2/3/4/8 sequences, batch 1 forced)
#   spec      speculative decoding (speculative.py) on SmolLM2 (needs its bundle): batch-1 decode of
#             the prompt set with and without n-gram proposals, default and --deterministic (answers
#             compared), and 64 concurrent requests with speculation allowed and not; specrated:
#             the same with speculative.rate_by_match on; specpeer (after lcpp): ingot beside
#             llama-server's n-gram speculation (--spec-type ngram-simple) on the same file and prompts,
#             engines alternated per round; specvar: the default path's batch-1 rows for each of
#             $SPEC_VARIANTS (JSON lines merged into --speculative-config), alternated; specsteps: where a speculative step's time goes (spec_steps.py:
#             forward, step and step-to-step times from the engine's debug log, speculation on and off)
#   rowsteps  ms a decode step of 1..8 rows on SmolLM2 (`bench throughput`, graphs), beside the
#             previous build when one is carried as $GPU_BUNDLE/ingot-old.gz; rowsncu: per-kernel
#             ncu times of an eager step of 1 and 5 rows (warm caches)
#   structured  constrained answers and CUDA-vs-CPU prompt logprobs (structured_smoke.py, 1B dummy),
#             then scripts/bench-structured on the 8B dummy
#   launchahead greedy SmolLM2 answers that stop at different points, alone vs 32 at once,
#             with graphs (launch-ahead steps) and eager: equal answers, runner's hits / partial / misses
#   plogprobs   prompt logprobs (echo, max_tokens 0) on SmolLM2: CUDA vs CPU bf16 per prompt
#             (prompt_logprobs_real.sh; needs the SmolLM2 bundle)
#   models    two SmolLM2 GGUFs, then two 1B dummies, under a budget of one: warm switch times
#             (models_smoke.sh); two 1B dummies with default budget and KV shares (models_share.sh)
#   embeddings  all-MiniLM-L6-v2 on `serve --device cuda`: cosine vs the numpy reference, the CPU
#             backend and transformers / sentence-transformers on the GPU; sentences/s beside
#             sentence-transformers (embeddings_check.py; needs the MiniLM bundle)
#   moe       mixture of experts: its kernels vs float64 NumPy (routing ties included), CUDA and
#             the CPU backend vs transformers (compare_hf.py on
#             qwen3moe-2l and mixtral-2l), then the Qwen3-30B-A3B-shaped dummy: batch 1 (graphs and
#             eager), its eager per-step profile (attention, routing, experts), 16 x (128 in, 64 out)
#   moecheck  after a MoE kernel change, in one call: the moe, moe_e4m3 and gemv_whole4k kernel checks,
#             CUDA vs transformers (qwen3moe-2l, mixtral-2l), FP8 vs BF16 on the dummy, bench_moe.py,
#             batch 1 bf16 / FP8 alternated twice
#   moebound  the machine's read bandwidth (torch.sum), then batch 1 of the Qwen3-30B-A3B dummy, bf16
#             and FP8, the previous build (when carried) and this one alternated three times, and
#             this one with cuda.l2_prefetch = 0
#   moeab     the previous build (carried as ingot-old.gz in a call of its own) against this one:
#             greedy ids and logprobs of both (compare_decode), then the Qwen3-30B-A3B dummy's batch 1,
#             bf16 and FP8, alternated twice
#   moegrp    the grouped expert GEMMs (cuda.moe_grouped_min_tokens): their kernel checks, the GEMV /
#             grouped crossover (bench_moe.py), CUDA vs transformers with every step grouped
#   moegrpbench the Qwen3-30B-A3B dummy, GEMVs only and grouped from 48 tokens: a 1,024-token prefill's
#             profile, 64 x (1024, 128); 256 x (1024, 128) grouped
#   moefp8    FP8 experts: the e4m3 expert kernels vs float64, FP8 vs BF16 logits/greedy ids on the
#             Qwen3-30B-A3B dummy (GEMVs, then every step grouped), batch 1 bf16 / FP8 alternated
#             twice, 256 x (1024, 128) in FP8
#   moew      starts writing the Qwen3-30B-A3B shape as a bf16 GGUF of random weights in the background
#             (61 GB; /dev/shm when it has room): `moew lcpp moelcpp` writes it while llama.cpp builds
#   moeready  waits for that file and inspects it
#   moelcpp   (after lcpp) that GGUF: batch 1 ingot / llama-bench alternated twice, 256 x (1024, 128)
#             beside llama-batched-bench (MOE_GROUPED: the grouped threshold, default 48); moeb1 / moebatch:
#             only the first / second half. (Carry .gpu-lcpp only on the call that builds it: a carried
#             path replaces the machine's, build included.)
#   moeserve  (after lcpp) the same file served by ingot, then llama-server, under one client (64
#             concurrent, 1024 in / 128 out, PROMPTS_MOE prompts, default 128)
#   tp        tensor parallel over all the machine's GPUs: the TP kernels, TP=N vs TP=1 on the 8B and
#             Qwen3-30B-A3B dummies (compare_kv_dtype.py --ref/--test), 8B batch 1 TP=1 / TP=N
#             alternated, the Llama-3.1-70B shape at TP=N (batch 1 bf16 and FP8, 64 x (1024, 128))
#   tpquick   the TP kernels, the 8B's TP=N logits vs TP=1 and NCCL's, batch 1 TP=1 / TP=N / NCCL
#   tpla      launch-ahead under TP: Qwen3-30B-A3B TP=N vs TP=1 greedy ids over 64 tokens, batch 1
#             of the 8B (TP=1 / TP=N / NCCL) and the 70B (bf16, FP8)
#   tpb1      batch 1 of the 8B, TP=1 / TP=N alternated twice, after the TP kernel checks
#   tpsmoke   one TP=N generate and a short batch-1 run on the 8B dummy
#   w70b      starts writing the 70B Q4_K_M in the background (kq70b, tpsm and tpsmserve wait for it):
#             `w70b lcpp tpsm` writes it while llama.cpp builds
#   tpsm      (after lcpp, on a multi-GPU kind) the 70B Q4_K_M (as kq70b writes it) over all the GPUs:
#             llama-bench -sm layer / -sm row, ingot at TP=N on the same file (each rank's slices expanded
#             to bf16) and on one GPU (--cuda-weights native), batch 1; with the load times
#   tpsmserve (after tpsm, the machine still warm) the same file served: ingot TP=N, llama-server
#             -sm layer, -sm row, each under the same client (64 concurrent, 1024 in / 128 out,
#             PROMPTS_70B prompts, default 64)
#   draft     draft-model speculation on CUDA (dummy weights, Llama-3 tokenizer): the 8B as its own draft
#             (every proposal right) and the Llama-3.2-1B shape drafting for it (random: mostly
#             refused); greedy ids under --deterministic with each against none; batch 1 of each
#   tp4       the acceptance rows on nvidia-h200-x4: TP kernels; the 8B's TP=N logits vs TP=1; 8B
#             batch 1 at TP=1 / 2 / N alternated twice; the 70B bf16 at TP=N and FP8 at TP=2 and N,
#             batch 1; a 4,096-token prefill profile at TP=N; `ingot serve` on the 70B at TP=N (seconds
#             to ready, then 64 concurrent x (1024 in, 128 out) under `ingot bench serve`)
#   torch     PyTorch eager baselines for the bench shapes
#   fp8kernels  the FP8 quantize and GEMV kernels vs a float64 reference (check_fp8.py)
#   fp8acc    --quantization fp8 vs bf16 on CUDA: SmolLM2 (20 prompts; needs its bundle) and the
#             8B dummy (3 prompts): prefill logits rel_l2, 32-token greedy agreement (compare_fp8.py)
#   fp8keep   SmolLM2 (needs its bundle): FP8 recipes against one set of BF16 runs, prompts 6 at a
#             time (compare_fp8.py --recipe --jobs): plain fp8 and model.fp8_ignore lists; every
#             greedy id to $O/fp8_ids.json (for the f32 floor of tests/reference/fp8_recipes.py)
#   fp8ignore model.fp8_ignore on the 8B dummy: everything kept bf16 equals BF16 exactly; batch 1
#             with down_proj kept
#   fp8bench  8B dummy with --quantization fp8: batch 1, prefill 1024, 256 x 1024 decode
#   q8        native GGUF Q8_0 (--cuda-weights native): its GEMV modes (n = 1..8) and expansion vs
#             float64 (check_fp8.py --only q8_0); a 2-layer Llama-3.2-1B-shaped Q8_0 GGUF (write_gguf.py):
#             CUDA native and bf16-expanded vs the CPU's exact f32 path (compare_backends.py); the
#             8B-shaped Q8_0 GGUF: batch 1 native / bf16-expanded / FP8 (dummy) alternated twice,
#             prefill 1024 and 256 x (1024 in, 128 out) native
#   lcpp      builds llama.cpp for the machine (GGML_NATIVE=ON, CUDA sm_90) from the pruned source
#             in .gpu-lcpp/llama.cpp.tgz into .gpu-lcpp/build (kept between calls while the machine
#             is warm): llama-quantize, llama-bench, llama-batched-bench, llama-server (its web UI's
#             sources are in the archive; the UI itself is not built, as ../shared/peers says)
#   kq        native GGUF k-quants (--cuda-weights native, after lcpp): their kernels vs float64
#             products of gguf-py's dequantization (check_kquant.py); 2-layer Llama-3.2-1B-shaped
#             files quantized by llama-quantize (Q4_K_M, Q5_K_M, Q6_K, Q4_0, Q4_1) vs the CPU's exact
#             f32 path (compare_backends.py), native (and bf16-expanded for Q4_K_M)
#   kqsmol    SmolLM2 Q4_1 (its bundle), CUDA native vs the CPU's exact and native int8 paths
#   kq8b      the 8B-shaped Q4_K_M, made by llama-quantize from a bf16 GGUF (write_gguf.py)
#   kq70b     the Llama-3.1-70B shape as a random-block Q4_K_M (write_gguf.py --dtype q4_k_m) on one GPU:
#             batch 1 beside llama-bench (after lcpp), 64 x (1024 in, 128 out)
#   kqbench   the 8B Q4_K_M (after kq8b): batch 1 ingot native / llama-bench alternated twice (the
#             bf16 expansion once), prefill 1024, 256 x (1024 in, 128 out) beside llama-batched-bench
#   kq70bserve  `ingot serve` on the 70B Q4_K_M (as kq70b writes it) under the same client as kqserve,
#             one round (PROMPTS_70B prompts, default 128); llama-server beside it when lcpp ran in the call
#   kqserve   the 8B Q4_K_M (after kq8b, lcpp): `ingot serve --cuda-weights native` and llama-server
#             (-ngl 99 -fa on -np 64 --cache-ram 0) in turn, twice, each under the same client
#             (`ingot bench serve`, 64 concurrent, 1024 in / 128 out, 128 prompts)
#   int4      an 8B-shaped AWQ checkpoint (write_int4.py: random 4-bit weights, group 128) read as Q4_1:
#             its tensor types, batch 1 --cuda-weights native beside the bf16 dummy of the same config,
#             the native run's eager decode step profile
#   int4ckpt  AWQ and GPTQ checkpoints (write_int4.py, group 128) under --cuda-weights native: a 2-layer
#             1B-shaped one of each vs the CPU's exact f32 path (compare_backends.py), then batch 1 of the
#             8B GPTQ and AWQ beside the bf16 dummy
#   fp8ckpt   (fp8ckpt1b: only the 1B part, native; fp8ckpt8b: only the 8B part) an FP8 checkpoint (write_int4.py --method fp8: compressed-tensors, e4m3 with a scale per
#             output channel) kept as it is under --cuda-weights native: a 2-layer 1B-shaped one vs the
#             CPU's exact f32 path, native and bf16-expanded (compare_backends.py); the 8B: batch 1
#             native / --quantization fp8 (dummy) alternated twice, bf16-expanded once
#   fp8head   model.fp8_lm_head (--fp8-lm-head) against FP8 with the bf16 head: logits rel_l2 and
#             32-token greedy agreement (compare_fp8.py --ref) on the 8B dummy (untied head); 8B
#             batch 1, FP8 without / with the head alternated twice, BF16 once; the same comparison
#             on the Llama-3.2-1B dummy (tied: the FP8 head is a copy of the embeddings); with the
#             SmolLM2 bundle, SmolLM2 (tied, real weights) against BF16 with and without the head;
#             256 x (1024 in, 128 out) without / with it (the head's cuBLASLt e4m3 GEMM at 256 rows)
#   fp8gemm   the FP8 linear layer's parts (quantize, cuBLASLt e4m3 GEMM per scaling mode,
#             fp8_scale_out) beside bf16 on the 8B's four shapes at 64..8192 tokens, after a
#             float64 check of the modes ingot runs (fp8_gemm_probe.cu, built here with nvcc)
#   ncu       ncu sections of the decode attention at 256 x 1k (one launch)
#   ncu1      per-kernel time and bandwidth of one batch-1 decode step (8B)
#   ncu1fp8   the same with --quantization fp8
#   ncumoe    the same for the Qwen3-30B-A3B dummy (700 launches, ~one decode step)
#   ncustall  ncu's stall reasons, occupancy and throughputs of the batch-1 o_proj, gate/up and
#             down GEMVs (8B), bf16 and FP8 weights
#   gemvbench the batch-1 GEMVs alone on the 8B shapes, bf16 and FP8 (bench_gemv.py; the extra
#             cubins listed in $GEMV_XCUBIN too)
#   ncup      the same for the non-GEMM kernels of a 1024-token prefill (8B)
#   splits    the decode attention + split combine alone per split count and context, 1 and 8 rows,
#             SmolLM2's and the 8B's heads, bf16 and FP8 caches (bench_decode_splits.py: what the small
#             decode graphs' split counts are chosen from)
#   decbench  the decode attention kernels alone (SIMT and tensor cores, bf16 and FP8 caches) at 256 and 64
#             rows of 1,088 keys, 1/2/4/8 splits (bench_decode_attention.py; tests/gpu/att22.sh compares two
#             builds' cubins and binaries in one call)
#   prefillk  the prefill attention kernel alone, bf16 and FP8 KV, on the 8B's and SmolLM2's heads
#             (bench_prefill_attention.py; other cubin folders can be compared beside it by hand)
# Results also go to $OUT (when set) as JSON lines.
set -uo pipefail
cd "$(dirname "$0")/../.."
export PYTHONUNBUFFERED=1
B=${GPU_BUNDLE:-.gpu}
W=${GPU_WORK:-/root/ingot-gpu}
O=${OUT:-/tmp/ingot-out}
mkdir -p "$W" "$O"
if [ -f "$B/ingot.gz" ]; then gunzip -c "$B/ingot.gz" > "$W/ingot"; chmod +x "$W/ingot"; fi
# A previous build for A/B phases (rowsteps), carried in a call of its own.
if [ -f "$B/ingot-old.gz" ]; then gunzip -c "$B/ingot-old.gz" > "$W/ingot-old"; chmod +x "$W/ingot-old"; fi
for f in "$B"/tokenizers/*/*.gz; do
  [ -e "$f" ] || continue
  name=$(basename "$(dirname "$f")"); mkdir -p "$W/tokenizers/$name"
  gunzip -c "$f" > "$W/tokenizers/$name/$(basename "$f" .gz)"
done
for f in "$B"/cubins/*.cubin.gz; do [ -e "$f" ] && gunzip -c "$f" > "$W/$(basename "$f" .gz)"; done
for p in 1 2; do [ -f "$B/smollm2/part$p" ] && cp "$B/smollm2/part$p" "$W/smollm2.part$p"; done
[ -f "$B/smollm2/sha256" ] && cp "$B/smollm2/sha256" "$W/smollm2.sha256"
for f in "$B"/gemma3/part* "$B"/gemma3/sha256; do [ -e "$f" ] && cp "$f" "$W/gemma3.$(basename "$f")"; done
# all-MiniLM-L6-v2 (scripts/gpu-bundle minilm N): small files in one part,
# model.safetensors halved across two calls.
if [ -d "$B/minilm" ]; then
  mkdir -p "$W/minilm"
  for f in "$B"/minilm/*; do
    case $(basename "$f") in part1|part2) cp "$f" "$W/minilm.$(basename "$f")" ;; *) cp -r "$f" "$W/minilm/" ;; esac
  done
fi
if [ ! -f "$W/minilm/model.safetensors" ] && [ -f "$W/minilm.part1" ] && [ -f "$W/minilm.part2" ] && [ -f "$W/minilm/sha256" ]; then
  cat "$W/minilm.part1" "$W/minilm.part2" > "$W/minilm/model.safetensors"
  echo "$(cat "$W/minilm/sha256")  $W/minilm/model.safetensors" | sha256sum -c - || rm -f "$W/minilm/model.safetensors"
fi
ING="$W/ingot"
SMOL="$W/smollm2.gguf"
if [ ! -f "$SMOL" ] && [ -f "$W/smollm2.part1" ] && [ -f "$W/smollm2.part2" ]; then
  cat "$W/smollm2.part1" "$W/smollm2.part2" > "$SMOL"
  echo "$(cat "$W/smollm2.sha256")  $SMOL" | sha256sum -c - || rm -f "$SMOL"
fi
llama8b() {
  mkdir -p "$W/llama-3.1-8b"
  cp tests/gpu/configs/llama-3.1-8b/config.json "$W/llama-3.1-8b/"
  cp "$W"/tokenizers/llama3/* "$W/llama-3.1-8b/"
  echo "$W/llama-3.1-8b"
}
# The Llama-3.1-70B shape as a Q4_K_M of random Q4_K/Q6_K blocks (write_gguf.py --dtype
# q4_k_m: no bf16 copy to quantize fits the disk), written once; prints its path.
llama70b_q4km() {
  [ -n "${W70B_PID:-}" ] && wait "$W70B_PID"
  local L70="$W/llama-3.1-70b" G="$W/70b-Q4_K_M.gguf"
  mkdir -p "$L70"; cp tests/gpu/configs/llama-3.1-70b/config.json "$W"/tokenizers/llama3/* "$L70/"
  [ -f "$G" ] || python3 tests/gpu/write_gguf.py --config "$L70/config.json" --tokenizer "$L70" --out "$G" --dtype q4_k_m >&2
  echo "$G"
}
# The Qwen3-30B-A3B shape's config and Qwen3's tokenizer in one directory; prints its path.
qwen3moe_dir() {
  local M="$W/qwen3-30b-a3b"
  mkdir -p "$M"; cp tests/gpu/configs/qwen3-30b-a3b/config.json "$W"/tokenizers/qwen3/* "$M/"
  echo "$M"
}
# The same shape as one bf16 GGUF of random weights (61 GB), written once: in /dev/shm when it
# has room (the disk is 64 GB), else in $W; prints its path.
qwen3moe_gguf() {
  [ -n "${WMOE_PID:-}" ] && wait "$WMOE_PID"
  local name=qwen3-30b-a3b-bf16.gguf G M
  for G in "/dev/shm/$name" "$W/$name"; do [ -f "$G" ] && { echo "$G"; return; }; done
  G="$W/$name"
  [ "$(df --output=avail -BG /dev/shm | tail -1 | tr -dc 0-9)" -ge 66 ] && G="/dev/shm/$name"
  M=$(qwen3moe_dir)
  python3 tests/gpu/write_gguf.py --config "$M/config.json" --tokenizer "$M" --out "$G.part" >&2 &&
    mv "$G.part" "$G"
  echo "$G"
}
# A random EAGLE-3 head for the Llama-3.1-8B shape (draft vocabulary 32,000, as the published
# heads), written once; prints its path. `eagle_spec ADAPTIVE` is its speculative config, 3 tokens a step.
eagle_head_8b() {
  local H="$W/eagle3-8b"
  [ -f "$H/model.safetensors" ] || python3 tests/reference/eagle3_head.py "$H" --hidden 4096 --intermediate 14336 \
    --heads 32 --kv-heads 8 --layers 32 --vocab 128256 --draft-vocab 32000 --rope-theta 500000 > /dev/null
  echo "$H"
}
eagle_spec() { printf '{"method": "eagle3", "model": "%s", "adaptive": %s, "num_speculative_tokens": 3}' "$W/eagle3-8b" "$1"; }
# serve_bench LABEL TOKENIZER PROMPTS SEED SERVER-COMMAND...: starts the server (ingot or
# llama-server, on $PORT), prints the seconds until it is ready (ingot's /ready: 200 once the model
# is in; llama-server's /health), runs the one client (`ingot bench serve`, 64 concurrent, 1024 in
# / 128 out) and stops it.
# Batch-1 decode tok/s of BIN on MODEL's dummy weights (`bench latency`, 128 in / 256 out, three
# iterations; more flags after the model); its JSON line is kept in $O/bench.jsonl.
b1_tps() {
  local bin=$1 model=$2; shift 2
  "$bin" bench latency --model "$model" --load-format dummy --max-model-len 4096 --input-len 128 --output-len 256 \
    --num-iters 3 --json "$@" | tail -1 | tee -a "$O/bench.jsonl" \
    | python3 -c "import json, sys; print(json.load(sys.stdin)['decode_tok_s'])" 2>/dev/null
}
serve_bench() {
  local label=$1 tok=$2 prompts=$3 seed=$4; shift 4
  local ready=health; [ "$label" = llama ] || ready=ready
  local t0; t0=$(date +%s.%N)
  "$@" --port "$PORT" > "$W/serve-$label.log" 2>&1 &
  local pid=$! up=0
  for _ in $(seq 6000); do
    curl -sf "http://127.0.0.1:$PORT/$ready" > /dev/null 2>&1 && { up=1; break; }
    kill -0 $pid 2>/dev/null || break
    sleep 0.1
  done
  if [ $up = 1 ]; then
    echo "round $seed: $label ready in $(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.1f}')" "$t0" "$(date +%s.%N)") s"
    "$ING" bench serve --base-url "http://127.0.0.1:$PORT" --tokenizer "$tok" --dataset random \
      --input-len 1024 --output-len 128 --num-prompts "$prompts" --max-concurrency 64 --num-warmup 2 --ignore-eos \
      --seed "$seed" --label "$label" --out "$O/serve-$label-$seed.json" 2>&1 | grep -vE "^\s*$"
  else echo "$label did not come up"; tail -5 "$W/serve-$label.log"; fi
  kill $pid; wait $pid 2>/dev/null
}
[ -d "$W/tokenizers/llama3" ] && llama8b >/dev/null
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
# Each command is bounded (PHASE_TIMEOUT seconds) so one hang cannot eat a
# whole device call; a timeout prints "TIMEOUT" and the next phase runs.
# (Scripts that start a server in the background get the raw binary: a
# wrapper's PID would not be the server's, and the server would outlive it.)
T=${PHASE_TIMEOUT:-150}
ING_RAW=$ING
ING="$W/ingot-bounded"
printf '#!/bin/sh\ntimeout -k 5 %s "%s" "$@"; rc=$?; [ $rc = 124 ] && echo "TIMEOUT: ingot $*" >&2; exit $rc\n' "$T" "$ING_RAW" > "$ING"
chmod +x "$ING"
for phase in "$@"; do
  echo "=== $phase"
  case $phase in
    kernels) timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" ;;
    hf) python3 tests/gpu/compare_hf.py --ingot "$ING" --tokenizers "$W/tokenizers" --work "$W/hf" ;;
    smollm2)
      [ -f "$SMOL" ] || { echo "no SmolLM2 bundle"; continue; }
      python3 tests/gpu/compare_backends.py --ingot "$ING_RAW" --model "$SMOL"
      for eager in "" "--enforce-eager"; do
        "$ING" bench latency --model "$SMOL" --input-len 128 --output-len 256 --num-iters 3 $eager --json | tee -a "$O/bench.jsonl"
      done ;;
    bench)
      M=$(llama8b)
      "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --json | tee -a "$O/bench.jsonl"
      "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 1024 --output-len 2 --max-num-batched-tokens 1024 --num-iters 5 --json | tee -a "$O/bench.jsonl"
      "$ING" bench throughput --model "$M" --load-format dummy --max-model-len 4096 --num-prompts 256 --max-num-seqs 256 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 --json | tee -a "$O/bench.jsonl" ;;
    b1)
      "$ING" bench latency --model "$(llama8b)" --load-format dummy --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --json | tee -a "$O/bench.jsonl" ;;
    prefill)
      "$ING" bench latency --model "$(llama8b)" --load-format dummy --max-model-len 4096 --input-len 1024 --output-len 2 --max-num-batched-tokens 1024 --num-iters 5 --json | tee -a "$O/bench.jsonl" ;;
    fp8kernels) timeout -k 5 "$T" python3 tests/gpu/check_fp8.py --cubins "$W" ;;
    splits) timeout -k 5 $((2 * T)) python3 tests/gpu/bench_decode_splits.py --cubins "$W" | tee "$O/decode_splits.txt" ;;
    fp8gemm)
      nvcc -O2 -std=c++17 -arch=sm_90a -I crates/kernels-cuda/cuda tests/gpu/fp8_gemm_probe.cu -lcublasLt -o "$W/fp8_gemm_probe" &&
        timeout -k 5 "$T" "$W/fp8_gemm_probe" | tee "$O/fp8_gemm_probe.txt" ;;
    fp8acc)
      if [ -f "$SMOL" ]; then timeout -k 5 $((3 * T)) python3 tests/gpu/compare_fp8.py --ingot "$ING_RAW" --model "$SMOL" | tee "$O/fp8_smollm2.txt"
      else echo "no SmolLM2 bundle"; fi
      timeout -k 5 $((2 * T)) python3 tests/gpu/compare_fp8.py --ingot "$ING_RAW" --model "$(llama8b)" --dummy --prompts 3 | tee "$O/fp8_8b.txt" ;;
    fp8keep)
      if [ -f "$SMOL" ]; then timeout -k 5 $((3 * T)) python3 tests/gpu/compare_fp8.py --ingot "$ING_RAW" --model "$SMOL" --jobs 6 \
          --recipe "fp8=" --recipe "keep-down=--fp8-ignore down_proj" \
          --recipe "keep-ends=--fp8-ignore layers.0,layers.1,layers.28,layers.29" \
          --ids-out "$O/fp8_ids.json" | tee "$O/fp8_recipes.txt"
      else echo "no SmolLM2 bundle"; fi ;;
    fp8ignore)
      # model.fp8_ignore on the 8B dummy: with every matrix kept bf16 the FP8 model must give the
      # BF16 model's logits and greedy ids exactly (kept matrices take the bf16 path by pointer);
      # then batch 1 with down_proj kept.
      M=$(llama8b)
      timeout -k 5 $((2 * T)) python3 tests/gpu/compare_fp8.py --ingot "$ING_RAW" --model "$M" --dummy --prompts 3 \
        --recipe "keep-all=--fp8-ignore qkv_proj,o_proj,gate_up_proj,down_proj" --recipe "fp8=" | tee "$O/fp8_ignore_8b.txt"
      "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --quantization fp8 --fp8-ignore down_proj \
        --input-len 128 --output-len 256 --num-iters 3 --json | tee -a "$O/bench.jsonl" ;;
    fp8bench)
      M=$(llama8b); Q="--quantization fp8"
      "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 $Q --input-len 128 --output-len 256 --num-iters 3 --json | tee -a "$O/bench.jsonl"
      "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 $Q --input-len 1024 --output-len 2 --max-num-batched-tokens 1024 --num-iters 5 --json | tee -a "$O/bench.jsonl"
      "$ING" bench throughput --model "$M" --load-format dummy --max-model-len 4096 $Q --num-prompts 256 --max-num-seqs 256 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 --json | tee -a "$O/bench.jsonl" ;;
    q8)
      timeout -k 5 "$T" python3 tests/gpu/check_fp8.py --cubins "$W" --only q8_0 | grep -v "^ok"
      M=$(llama8b); S="$W/llama-3.2-1b"; mkdir -p "$S"
      cp tests/gpu/configs/llama-3.2-1b/config.json "$W"/tokenizers/llama3/* "$S/"
      python3 tests/gpu/write_gguf.py --config "$S/config.json" --tokenizer "$S" --out "$W/q8-1b-2l.gguf" --layers 2 --dtype q8_0
      for flags in "--cuda-weights native" "--cuda-weights bf16"; do
        echo "CUDA $flags vs the CPU's exact f32 path"
        timeout -k 5 "$T" python3 tests/gpu/compare_backends.py --ingot "$ING_RAW" --model "$W/q8-1b-2l.gguf" --tokens 16 \
          --cpu-flags "--cpu-weights f32" --cuda-flags "$flags" | tee -a "$O/q8_compare.txt"
      done
      python3 tests/gpu/write_gguf.py --config "$M/config.json" --tokenizer "$M" --out "$W/q8-8b.gguf" --dtype q8_0
      B1="bench latency --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --json"
      for round in 1 2; do
        echo "round $round: native"; "$ING" $B1 --model "$W/q8-8b.gguf" --cuda-weights native | tee -a "$O/bench.jsonl"
        echo "round $round: bf16-expanded"; "$ING" $B1 --model "$W/q8-8b.gguf" | tee -a "$O/bench.jsonl"
        echo "round $round: fp8 (dummy)"; "$ING" $B1 --model "$M" --load-format dummy --quantization fp8 | tee -a "$O/bench.jsonl"
      done
      "$ING" bench latency --model "$W/q8-8b.gguf" --cuda-weights native --max-model-len 4096 --input-len 1024 --output-len 2 --max-num-batched-tokens 1024 --num-iters 5 --json | tee -a "$O/bench.jsonl"
      "$ING" bench throughput --model "$W/q8-8b.gguf" --cuda-weights native --max-model-len 4096 --num-prompts 256 --max-num-seqs 256 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 --json | tee -a "$O/bench.jsonl" ;;
    lcpp)
      L=.gpu-lcpp; mkdir -p "$L/src"
      [ -d "$L/src/llama.cpp" ] || tar xzf "$L/llama.cpp.tgz" -C "$L/src"
      (cd "$L/src/llama.cpp" && cmake -B ../../build -G Ninja -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
        -DGGML_NATIVE=ON -DCMAKE_BUILD_TYPE=Release -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF \
        -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_BUILD_UI=OFF \
        -DLLAMA_OPENSSL=OFF > /dev/null &&
        cmake --build ../../build -j"$(nproc)" --target llama-bench llama-quantize llama-batched-bench llama-server 2>&1 | tail -2) ;;
    kq)
      LB=.gpu-lcpp/build/bin; Q="$LB/llama-quantize"
      [ -x "$Q" ] || { echo "no llama-quantize (run lcpp first)"; continue; }
      PYTHONPATH=.gpu-lcpp/src/llama.cpp/gguf-py timeout -k 5 "$T" python3 tests/gpu/check_kquant.py --cubins "$W" | grep -v "^ok"
      (cd tests/gpu && timeout -k 5 "$T" python3 bench_gemv.py --cubin "$W/gemv_kq.sm_90.cubin" --only kq) | tee "$O/kq_gemv.txt"
      S="$W/llama-3.2-1b"; mkdir -p "$S"
      cp tests/gpu/configs/llama-3.2-1b/config.json "$W"/tokenizers/llama3/* "$S/"
      python3 tests/gpu/write_gguf.py --config "$S/config.json" --tokenizer "$S" --out "$W/1b-2l.gguf" --layers 2 --dtype bf16
      for t in Q4_K_M Q5_K_M Q6_K Q4_0 Q4_1; do
        "$Q" "$W/1b-2l.gguf" "$W/1b-2l-$t.gguf" "$t" 4 > "$W/quantize-$t.log" 2>&1 || { tail -3 "$W/quantize-$t.log"; continue; }
        "$ING" inspect "$W/1b-2l-$t.gguf" | grep "tensor types"
        flag_sets=("--cuda-weights native"); [ "$t" = Q4_K_M ] && flag_sets+=("--cuda-weights bf16")
        for flags in "${flag_sets[@]}"; do
          echo "$t: CUDA $flags vs the CPU's exact f32 path"
          timeout -k 5 "$T" python3 tests/gpu/compare_backends.py --ingot "$ING_RAW" --model "$W/1b-2l-$t.gguf" --tokens 16 \
            --cpu-flags "--cpu-weights f32" --cuda-flags "$flags" | tee -a "$O/kq_compare.txt"
        done
      done
      ;;
    kqsmol)
      if [ -f "$SMOL" ]; then
        for cpu in "--cpu-weights f32" "--cpu-weights native"; do
          echo "SmolLM2 Q4_1: CUDA native vs CPU $cpu"
          timeout -k 5 "$T" python3 tests/gpu/compare_backends.py --ingot "$ING_RAW" --model "$SMOL" \
            --cpu-flags "$cpu" --cuda-flags "--cuda-weights native" | tee -a "$O/kq_smollm2.txt"
        done
      else echo "no SmolLM2 bundle"; fi ;;
    kq8b)
      Q=.gpu-lcpp/build/bin/llama-quantize; M=$(llama8b)
      [ -f "$W/8b-Q4_K_M.gguf" ] || {
        python3 tests/gpu/write_gguf.py --config "$M/config.json" --tokenizer "$M" --out "$W/8b-bf16.gguf" --dtype bf16 &&
          "$Q" "$W/8b-bf16.gguf" "$W/8b-Q4_K_M.gguf" Q4_K_M 16 > "$W/quantize-8b.log" 2>&1; tail -2 "$W/quantize-8b.log"
        rm -f "$W/8b-bf16.gguf"; } ;;
    kq70b)
      # Llama-3.1-70B shape, random Q4_K/Q6_K blocks laid out as Q4_K_M (write_gguf.py --dtype q4_k_m:
      # no bf16 copy to quantize fits the disk), on one GPU: batch 1 and 64 x (1024 in, 128 out).
      LB=.gpu-lcpp/build/bin; G=$(llama70b_q4km)
      "$ING" inspect "$G" | grep "tensor types"
      B1="bench latency --model $G --cuda-weights native --max-model-len 4096 --input-len 128 --output-len 128 --num-iters 2 --json"
      echo "ingot native"; INGOT_LOG=info "$ING" $B1 2>&1 | grep -E "^\{|weights streamed" | tee -a "$O/bench.jsonl"
      [ -x "$LB/llama-bench" ] && { echo "llama.cpp"; timeout -k 5 "$T" "$LB/llama-bench" -m "$G" -ngl 99 -fa 1 -p 0 -n 128 -r 2 -o jsonl | tee -a "$O/llama_bench.jsonl"; }
      "$ING" bench throughput --model "$G" --cuda-weights native --max-model-len 4096 --num-prompts 64 --max-num-seqs 64 \
        --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 --json | tee -a "$O/bench.jsonl" ;;
    kqserve|kq70bserve)
      LS=.gpu-lcpp/build/bin/llama-server; PORT=8765
      if [ $phase = kqserve ]; then
        G="$W/8b-Q4_K_M.gguf"; TOK="$W/llama-3.1-8b"; ROUNDS="1 2"; ENGINES="ingot llama"; PROMPTS=128
        [ -f "$G" ] && [ -x "$LS" ] || { echo "no 8B Q4_K_M or llama-server (run lcpp kq8b first)"; continue; }
      else
        # The 70B: llama-server beside it only when lcpp ran in this call.
        G=$(llama70b_q4km); TOK="$W/llama-3.1-70b"; ROUNDS=1; ENGINES=ingot; PROMPTS=${PROMPTS_70B:-128}
        [ -x "$LS" ] && ENGINES="ingot llama"
      fi
      for round in $ROUNDS; do
        for s in $ENGINES; do
          case $s in
            ingot) serve_bench ingot "$TOK" "$PROMPTS" "$round" "$ING_RAW" serve --model "$G" --cuda-weights native \
                     --max-model-len 4096 --max-num-seqs 64 ;;
            llama) serve_bench llama "$TOK" "$PROMPTS" "$round" "$LS" -m "$G" -ngl 99 -fa on -np 64 -c 81920 --cache-ram 0 ;;
          esac
        done
      done ;;
    kqbench)
      LB=.gpu-lcpp/build/bin; G="$W/8b-Q4_K_M.gguf"
      [ -f "$G" ] || { echo "no 8B Q4_K_M (run kq first)"; continue; }
      B1="bench latency --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --json"
      for round in 1 2; do
        echo "round $round: ingot native"; INGOT_LOG=info "$ING" $B1 --model "$G" --cuda-weights native 2>&1 | grep -E "^\{|weights streamed|memory" | tee -a "$O/bench.jsonl"
        echo "round $round: llama.cpp"; timeout -k 5 "$T" "$LB/llama-bench" -m "$G" -ngl 99 -fa 1 -p 0 -n 256 -r 3 -o jsonl | tee -a "$O/llama_bench.jsonl"
      done
      echo "ingot bf16-expanded"; "$ING" $B1 --model "$G" | tee -a "$O/bench.jsonl"
      "$ING" bench latency --model "$G" --cuda-weights native --max-model-len 4096 --input-len 1024 --output-len 2 --max-num-batched-tokens 1024 --num-iters 5 --json | tee -a "$O/bench.jsonl"
      "$ING" bench throughput --model "$G" --cuda-weights native --max-model-len 4096 --num-prompts 256 --max-num-seqs 256 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 --json | tee -a "$O/bench.jsonl"
      timeout -k 5 $((2 * T)) "$LB/llama-batched-bench" -m "$G" -ngl 99 -fa on -c 300000 -b 8192 -ub 512 -npp 1024 -ntg 128 -npl 256 --output-format jsonl | tail -3 | tee -a "$O/llama_batched.jsonl"
      INGOT_CUDA_PROFILE=1 "$ING" bench latency --model "$G" --cuda-weights native --max-model-len 4096 --input-len 128 --output-len 64 --num-iters 1 --json 2>&1 | grep -iE "profile|gemm|gemv|attention|step" | tail -12 ;;
    int4)
      M=$(llama8b); A="$W/8b-awq"
      [ -f "$A/config.json" ] || python3 tests/gpu/write_int4.py --config "$M/config.json" --tokenizer "$M" --out "$A" --method awq --group 128
      "$ING" inspect "$A" | grep "tensor types"
      B1="bench latency --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --json"
      echo "AWQ g128, native"; "$ING" $B1 --model "$A" --cuda-weights native | tee -a "$O/bench.jsonl"
      echo "bf16 (dummy)"; "$ING" $B1 --model "$M" --load-format dummy | tee -a "$O/bench.jsonl"
      echo "AWQ g128, native: decode step profile"
      INGOT_CUDA_PROFILE=1 "$ING" bench latency --model "$A" --cuda-weights native --max-model-len 4096 --input-len 128 \
        --output-len 64 --num-iters 1 --json 2>&1 | grep -iE "profile|gemm|gemv|attention|step" | tail -12 ;;
    int4ckpt)
      # AWQ and GPTQ checkpoints (write_int4.py: their published layouts, group 128) kept in blocks
      # (--cuda-weights native): a 2-layer 1B-shaped one of each vs the CPU's exact f32 path (which
      # dequantizes the same tensors), then the 8B GPTQ's batch 1 beside the AWQ's and the bf16 dummy.
      M=$(llama8b); S="$W/llama-3.2-1b"; mkdir -p "$S"
      cp tests/gpu/configs/llama-3.2-1b/config.json "$W"/tokenizers/llama3/* "$S/"
      for method in awq gptq; do
        C1="$W/$method-1b-2l"
        [ -f "$C1/config.json" ] || python3 tests/gpu/write_int4.py --config "$S/config.json" --tokenizer "$S" --out "$C1" --method $method --layers 2
        echo "$method 1B 2-layer: CUDA native vs the CPU's exact f32 path"
        timeout -k 5 "$T" python3 tests/gpu/compare_backends.py --ingot "$ING_RAW" --model "$C1" --tokens 16 \
          --cpu-flags "--cpu-weights f32" --cuda-flags "--cuda-weights native" | tee -a "$O/int4ckpt_compare.txt"
      done
      B1="bench latency --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --json"
      for method in gptq awq; do
        C8="$W/8b-$method"
        [ -f "$C8/config.json" ] || python3 tests/gpu/write_int4.py --config "$M/config.json" --tokenizer "$M" --out "$C8" --method $method --group 128
        "$ING" inspect "$C8" | grep "tensor types"
        echo "$method 8B, native"; "$ING" $B1 --model "$C8" --cuda-weights native | tee -a "$O/bench.jsonl"
      done
      echo "bf16 (dummy)"; "$ING" $B1 --model "$M" --load-format dummy | tee -a "$O/bench.jsonl" ;;
    fp8ckpt|fp8ckpt1b|fp8ckpt8b)
      M=$(llama8b); S="$W/llama-3.2-1b"; mkdir -p "$S"
      if [ "$phase" != fp8ckpt8b ]; then
        cp tests/gpu/configs/llama-3.2-1b/config.json "$W"/tokenizers/llama3/* "$S/"
        F1="$W/fp8-1b-2l"
        [ -f "$F1/config.json" ] || python3 tests/gpu/write_int4.py --config "$S/config.json" --tokenizer "$S" --out "$F1" --method fp8 --layers 2
        RUST_LOG=info "$ING" generate "$F1" --cuda-weights native --prompt "Hi" --max-tokens 2 2>&1 | grep -iE "e4m3|native" | head -3
        FLAGS=("--cuda-weights native" "--cuda-weights bf16"); [ "$phase" = fp8ckpt1b ] && FLAGS=("--cuda-weights native")
        for flags in "${FLAGS[@]}"; do
          echo "CUDA $flags vs the CPU's exact f32 path"
          timeout -k 5 "$T" python3 tests/gpu/compare_backends.py --ingot "$ING_RAW" --model "$F1" --tokens 16 \
            --cpu-flags "--cpu-weights f32" --cuda-flags "$flags" | tee -a "$O/fp8ckpt_compare.txt"
        done
      fi
      [ "$phase" = fp8ckpt1b ] && continue
      F8="$W/8b-fp8"
      [ -f "$F8/config.json" ] || python3 tests/gpu/write_int4.py --config "$M/config.json" --tokenizer "$M" --out "$F8" --method fp8
      "$ING" inspect "$F8" | grep "tensor types"
      B1="bench latency --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --json"
      for round in 1 2; do
        echo "round $round: FP8 checkpoint, native"
        "$ING" $B1 --model "$F8" --cuda-weights native 2> "$O/fp8ckpt-$round.log" | tee -a "$O/bench.jsonl"
        grep -iE "e4m3|weights" "$O/fp8ckpt-$round.log" | head -4
        echo "round $round: --quantization fp8 (dummy)"; "$ING" $B1 --model "$M" --load-format dummy --quantization fp8 | tee -a "$O/bench.jsonl"
      done
      echo "FP8 checkpoint, bf16-expanded"; "$ING" $B1 --model "$F8" | tee -a "$O/bench.jsonl" ;;
    fp8head)
      # Order: the must-haves first (8B accuracy, batch 1), so a cut-off call still has them.
      M=$(llama8b)
      HEAD=(--ref fp8= --recipe "fp8-head=--fp8-lm-head")
      timeout -k 5 $((2 * T)) python3 tests/gpu/compare_fp8.py --ingot "$ING_RAW" --model "$M" --dummy --prompts 3 "${HEAD[@]}" | tee "$O/fp8_head_8b.txt"
      B1="bench latency --model $M --load-format dummy --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --json"
      for round in 1 2; do
        echo "round $round: fp8"; "$ING" $B1 --quantization fp8 | tee -a "$O/bench.jsonl"
        echo "round $round: fp8 + fp8_lm_head"; "$ING" $B1 --quantization fp8 --fp8-lm-head | tee -a "$O/bench.jsonl"
      done
      echo "bf16"; "$ING" $B1 | tee -a "$O/bench.jsonl"
      mkdir -p "$W/llama1b-dummy"; cp tests/gpu/configs/llama-3.2-1b/config.json "$W"/tokenizers/llama3/* "$W/llama1b-dummy/"
      timeout -k 5 "$T" python3 tests/gpu/compare_fp8.py --ingot "$ING_RAW" --model "$W/llama1b-dummy" --dummy --prompts 3 "${HEAD[@]}" | tee "$O/fp8_head_1b.txt"
      if [ -f "$SMOL" ]; then timeout -k 5 $((3 * T)) python3 tests/gpu/compare_fp8.py --ingot "$ING_RAW" --model "$SMOL" --jobs 6 \
          --recipe "fp8=" --recipe "fp8-head=--fp8-lm-head" | tee "$O/fp8_head_smollm2.txt"
      else echo "no SmolLM2 bundle"; fi
      TP="bench throughput --model $M --load-format dummy --max-model-len 4096 --num-prompts 256 --max-num-seqs 256 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 --quantization fp8 --json"
      echo "256 x 1k: fp8"; "$ING" $TP | tee -a "$O/bench.jsonl"
      echo "256 x 1k: fp8 + fp8_lm_head"; "$ING" $TP --fp8-lm-head | tee -a "$O/bench.jsonl" ;;
    ttft)
      M=$(llama8b)
      "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 1024 --output-len 2 --max-num-batched-tokens 1024 --num-iters 5 --json | tee -a "$O/bench.jsonl"
      timeout -k 5 "$T" python3 scripts/bench-ttft --binary "$ING_RAW" -n 20 --warmup 3 --json "$O/ttft.json" -- \
        --model "$M" --load-format dummy --max-model-len 4096
      INGOT_LOG_LEVEL="warn,ttft_before=trace" timeout -k 5 "$T" python3 scripts/bench-ttft --binary "$ING_RAW" -n 20 --warmup 3 \
        --json "$O/ttft_before.json" -- --model "$M" --load-format dummy --max-model-len 4096 --max-prefill-only-tokens 0 ;;
    tput)
      "$ING" bench throughput --model "$(llama8b)" --load-format dummy --max-model-len 4096 --num-prompts 256 --max-num-seqs 256 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 --json | tee -a "$O/bench.jsonl" ;;
    gemma)
      G="$W/gemma3.gguf"
      if [ ! -f "$G" ] && [ -f "$W/gemma3.sha256" ]; then
        cat "$W"/gemma3.part? > "$G"
        echo "$(cat "$W/gemma3.sha256")  $G" | sha256sum -c - || rm -f "$G"
      fi
      [ -f "$G" ] || { echo "no Gemma 3 bundle"; continue; }
      if ls "$B"/whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$B"/whl/*.whl
        export PYTHONPATH=/tmp/site
      fi
      timeout -k 5 $((4 * T)) python3 tests/gpu/compare_gemma.py --ingot "$ING_RAW" --model "$G" \
        --fixture tests/fixtures/gemma3/expected.json --long tests/fixtures/gemma3/long.json \
        --hf | tee "$O/gemma.txt"
      for eager in "" "--enforce-eager"; do
        "$ING" bench latency --model "$G" --input-len 128 --output-len 256 --num-iters 3 $eager --json | tee -a "$O/bench.jsonl"
      done ;;
    moe)
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only moe
      python3 tests/gpu/compare_hf.py --ingot "$ING" --tokenizers "$W/tokenizers" --work "$W/hf" --models qwen3moe-2l mixtral-2l
      python3 tests/gpu/compare_hf.py --ingot "$ING" --tokenizers "$W/tokenizers" --work "$W/hf" --models qwen3moe-2l mixtral-2l --device cpu
      M="$W/qwen3-30b-a3b"; mkdir -p "$M"; cp tests/gpu/configs/qwen3-30b-a3b/config.json "$W"/tokenizers/qwen3/* "$M/"
      for eager in "" "--enforce-eager"; do
        "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 $eager --json | tee -a "$O/bench.jsonl"
      done
      INGOT_CUDA_PROFILE=1 "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 128 --output-len 64 --num-iters 1 --json
      "$ING" bench throughput --model "$M" --load-format dummy --max-model-len 4096 --num-prompts 16 --max-num-seqs 16 --input-len 128 --output-len 64 --json | tee -a "$O/bench.jsonl" ;;
    moecheck)
      # One call after a MoE kernel change: the per-slot and e4m3 kernels against float64, CUDA vs
      # transformers on the 2-layer Qwen3-MoE and Mixtral, FP8 vs BF16 on the dummy, the expert
      # GEMVs alone (bench_moe.py), then batch 1 in bf16 and FP8 alternated twice.
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only moe | grep -v "^ok" | tail -4
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only moe_e4m3 | grep -v "^ok" | tail -4
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only gemv_whole4k | grep -v "^ok" | tail -4
      python3 tests/gpu/compare_hf.py --ingot "$ING" --tokenizers "$W/tokenizers" --work "$W/hf" --models qwen3moe-2l mixtral-2l
      M=$(qwen3moe_dir)
      timeout -k 5 "$T" python3 tests/gpu/compare_fp8.py --ingot "$ING_RAW" --model "$M" --dummy --prompts 3 | tail -4
      timeout -k 5 "$T" python3 tests/gpu/bench_moe.py --cubins "$W" | tail -8
      for round in 1 2; do
        for q in "" "--quantization fp8"; do
          tps=$(b1_tps "$ING" "$M" $q)
          echo "moecheck round $round ${q:-bf16}: $tps tok/s"
        done
      done ;;
    moeab)
      # The previous build ($W/ingot-old, carried in a call of its own) against this one on the
      # Qwen3-30B-A3B dummy's batch 1, bf16 and FP8, alternated twice.
      [ -x "$W/ingot-old" ] || { echo "no previous build carried"; continue; }
      M=$(qwen3moe_dir)
      for q in "" "--quantization fp8"; do
        echo "compare_decode ${q:-bf16}: previous build vs this one"
        timeout -k 5 300 python3 tests/gpu/compare_decode.py --a "$W/ingot-old" --b "$ING_RAW" --model "$M" --dummy \
          --tokens 32 --prompts 2 -- $q | tail -1
      done
      for round in 1 2; do
        for q in "" "--quantization fp8"; do
          for bin in "$W/ingot-old" "$ING_RAW"; do
            tps=$(b1_tps "$bin" "$M" $q)
            echo "moeab round $round ${q:-bf16} $(basename "$bin"): $tps tok/s"
          done
        done
      done ;;
    moebound)
      # Issue 32's batch-1 bound on this machine: its read bandwidth (torch.sum over 8 GiB of f32, best
      # of 6), then the Qwen3-30B-A3B dummy's batch 1 (bf16, then FP8) with the previous build
      # ($W/ingot-old, when carried) and this one alternated three times, and this one without the
      # o_proj L2 prefetch (cuda.l2_prefetch = 0).
      python3 - <<'PY' | tee -a "$O/readbw.txt"
import time

import torch

x = torch.ones(2 << 30, dtype=torch.float32, device="cuda")
best = 1e9
for _ in range(6):
    torch.cuda.synchronize()
    t = time.perf_counter()
    x.sum().item()
    best = min(best, time.perf_counter() - t)
gbs = x.numel() * 4 / best / 1e9
print(f"read bandwidth (torch.sum, 8 GiB of f32, best of 6): {gbs:.0f} GB/s; "
      f"Qwen3-30B-A3B bf16 batch-1 bound (6.08 GB a token) {gbs / 6.08:.1f} tok/s")
PY
      M=$(qwen3moe_dir)
      bins=("$ING_RAW"); [ -x "$W/ingot-old" ] && bins=("$W/ingot-old" "$ING_RAW")
      for round in 1 2 3; do
        for q in "" "--quantization fp8"; do
          for bin in "${bins[@]}"; do
            echo "moebound round $round ${q:-bf16} $(basename "$bin"): $(b1_tps "$bin" "$M" $q) tok/s"
          done
          echo "moebound round $round ${q:-bf16} ingot l2_prefetch=0: $(INGOT_CUDA_L2_PREFETCH=0 b1_tps "$ING" "$M" $q) tok/s"
        done
      done ;;
    moegrp)
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only moe
      timeout -k 5 "$T" python3 tests/gpu/bench_moe.py --cubins "$W" | tee "$O/bench_moe.txt"
      INGOT_CUDA_MOE_GROUPED_MIN_TOKENS=1 python3 tests/gpu/compare_hf.py --ingot "$ING" --tokenizers "$W/tokenizers" \
        --work "$W/hf" --models qwen3moe-2l mixtral-2l ;;
    moefp8)
      # FP8 experts (issue 32): the e4m3 expert kernels against float64; FP8 vs BF16 logits and
      # greedy ids on the Qwen3-30B-A3B dummy with per-slot GEMVs and with every step grouped;
      # batch 1 in bf16 and FP8 alternated twice; 256 x (1024, 128) in FP8.
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only moe_e4m3
      M=$(qwen3moe_dir); D="--model $M --load-format dummy --max-model-len 4096"
      for g in 48 1; do
        echo "moe_grouped_min_tokens=$g"
        INGOT_CUDA_MOE_GROUPED_MIN_TOKENS=$g timeout -k 5 $((2 * T)) python3 tests/gpu/compare_fp8.py --ingot "$ING_RAW" \
          --model "$M" --dummy --prompts 3 | tee -a "$O/fp8_moe.txt"
      done
      for round in 1 2; do
        for q in "" "--quantization fp8"; do
          echo "round $round: ${q:-bf16}"
          "$ING" bench latency $D $q --input-len 128 --output-len 256 --num-iters 3 --json | tee -a "$O/bench.jsonl"
        done
      done
      timeout -k 5 "$T" "$ING" bench throughput $D --quantization fp8 --num-prompts 256 --max-num-seqs 256 \
        --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 --json | tee -a "$O/bench.jsonl" ;;
    moegrpbench)
      # The Qwen3-30B-A3B dummy with the per-slot GEMVs only (0) and grouped from 48 tokens a step:
      # a 1,024-token prefill's profile and 64 x (1024, 128); 256 x (1024, 128) grouped.
      D="--model $(qwen3moe_dir) --load-format dummy --max-model-len 4096"
      for g in 0 48; do
        echo "moe_grouped_min_tokens=$g"
        INGOT_CUDA_MOE_GROUPED_MIN_TOKENS=$g INGOT_CUDA_PROFILE=1 "$ING" bench latency $D --input-len 1024 --output-len 16 \
          --num-iters 1 --enforce-eager 2>&1 | grep "profile: prefill"
        INGOT_CUDA_MOE_GROUPED_MIN_TOKENS=$g timeout -k 5 "$T" "$ING" bench throughput $D --num-prompts 64 --max-num-seqs 64 \
          --input-len 1024 --output-len 128 --json | tee -a "$O/bench.jsonl"
      done
      INGOT_CUDA_MOE_GROUPED_MIN_TOKENS=48 timeout -k 5 "$T" "$ING" bench throughput $D --num-prompts 256 --max-num-seqs 256 \
        --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 --json | tee -a "$O/bench.jsonl" ;;
    tp)
      # Tensor parallel over every GPU of the machine (nvidia-h200-x2 / -x4): the TP kernels, TP=N vs
      # TP=1 logits and greedy ids on the 8B and Qwen3-30B-A3B dummies (the ranks fill their slices
      # with the whole model's values), then batch 1 TP=1 / TP=N alternated on the 8B, and the
      # Llama-3.1-70B shape at TP=N in bf16 and FP8, and 64 concurrent x (1024 in, 128 out).
      N=$(nvidia-smi -L | wc -l); echo "GPUs: $N"; nvidia-smi topo -m | head -4
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only elementwise | grep -E "fill|FAIL"
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only collective
      timeout -k 5 $((3 * T)) python3 tests/gpu/compare_hf.py --ingot "$ING_RAW" --tokenizers "$W/tokenizers" --work "$W/hf" \
        --models llama3-2l qwen3-2l qwen3moe-2l mixtral-2l --ingot-flags "--tensor-parallel-size $N" | tee "$O/tp_hf.txt"
      M=$(llama8b)
      D="--load-format dummy --max-model-len 4096"
      # The noise floor of a kernel change on this dummy: TP=1 against TP=1's batch-invariant kernels.
      timeout -k 5 $((2 * T)) python3 tests/gpu/compare_kv_dtype.py --ingot "$ING_RAW" --model "$M" --prompts 2 --threshold 1 --min-agree 0 \
        --ref "$D --tensor-parallel-size 1" --test "$D --tensor-parallel-size 1 --deterministic" | tee "$O/tp1_det_8b.txt"
      timeout -k 5 $((2 * T)) python3 tests/gpu/compare_kv_dtype.py --ingot "$ING_RAW" --model "$M" --prompts 2 --threshold 1 --min-agree 0 \
        --ref "$D --tensor-parallel-size 1" --test "$D --tensor-parallel-size $N" | tee "$O/tp_8b.txt"
      # The one-shot all-reduce (with the next norm fused into it) against NCCL's (norms unfused).
      timeout -k 5 $((2 * T)) python3 tests/gpu/compare_kv_dtype.py --ingot "$ING_RAW" --model "$M" --prompts 2 --threshold 1 --min-agree 0 \
        --ref "$D --tensor-parallel-size $N --disable-custom-all-reduce" --test "$D --tensor-parallel-size $N" | tee "$O/tp_nccl_8b.txt"
      MOE="$W/qwen3-30b-a3b"; mkdir -p "$MOE"; cp tests/gpu/configs/qwen3-30b-a3b/config.json "$W"/tokenizers/qwen3/* "$MOE/"
      timeout -k 5 $((2 * T)) python3 tests/gpu/compare_kv_dtype.py --ingot "$ING_RAW" --model "$MOE" --prompts 1 --threshold 2e-2 \
        --ref "--load-format dummy --max-model-len 4096 --tensor-parallel-size 1" \
        --test "--load-format dummy --max-model-len 4096 --tensor-parallel-size $N" | tee "$O/tp_moe.txt"
      B1="bench latency --load-format dummy --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --json"
      for round in 1 2; do
        for tp in 1 "$N"; do echo "8B batch 1, TP=$tp"; "$ING" $B1 --model "$M" --tensor-parallel-size $tp | tee -a "$O/bench.jsonl"; done
        echo "8B batch 1, TP=$N, NCCL all-reduce"; "$ING" $B1 --model "$M" --tensor-parallel-size $N --disable-custom-all-reduce | tee -a "$O/bench.jsonl"
      done
      INGOT_CUDA_PROFILE=1 "$ING" bench latency $D --input-len 128 --output-len 64 --num-iters 1 --model "$M" --tensor-parallel-size $N 2>&1 | grep "profile: decode"
      L70="$W/llama-3.1-70b"; mkdir -p "$L70"; cp tests/gpu/configs/llama-3.1-70b/config.json "$W"/tokenizers/llama3/* "$L70/"
      for q in "" "--quantization fp8"; do
        echo "70B batch 1, TP=$N $q"; "$ING" $B1 --model "$L70" --tensor-parallel-size $N $q | tee -a "$O/bench.jsonl"
      done
      echo "70B 64 x (1024, 128), TP=$N"
      "$ING" bench throughput --model "$L70" --load-format dummy --max-model-len 4096 --num-prompts 64 --max-num-seqs 64 --input-len 1024 --output-len 128 \
        --max-num-batched-tokens 8192 --tensor-parallel-size $N --json | tee -a "$O/bench.jsonl" ;;
    tpquick)
      # The TP kernels, the 8B's TP=N logits against TP=1 and NCCL's, batch 1 TP=1 / TP=N / NCCL.
      N=$(nvidia-smi -L | wc -l); M=$(llama8b); D="--load-format dummy --max-model-len 4096"
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only collective
      timeout -k 5 $((2 * T)) python3 tests/gpu/compare_kv_dtype.py --ingot "$ING_RAW" --model "$M" --prompts 1 --threshold 1 --min-agree 0 \
        --ref "$D --tensor-parallel-size 1" --test "$D --tensor-parallel-size $N"
      timeout -k 5 "$T" "$ING_RAW" logits --model "$M" $D --tensor-parallel-size $N --disable-custom-all-reduce --prompt "The capital of France is" --out "$W/tp_nccl.f32"
      timeout -k 5 "$T" "$ING_RAW" logits --model "$M" $D --tensor-parallel-size $N --prompt "The capital of France is" --out "$W/tp_oneshot.f32"
      python3 -c "import numpy as n,sys; a,b=(n.fromfile(f,'<f4') for f in sys.argv[1:]); print('one-shot vs NCCL logits rel_l2', n.linalg.norm(a-b)/n.linalg.norm(a))" "$W/tp_nccl.f32" "$W/tp_oneshot.f32"
      B1="bench latency $D --input-len 128 --output-len 256 --num-iters 3 --json"
      for tp in 1 "$N"; do echo "8B batch 1, TP=$tp"; "$ING" $B1 --model "$M" --tensor-parallel-size $tp | tee -a "$O/bench.jsonl"; done
      echo "8B batch 1, TP=$N, NCCL"; "$ING" $B1 --model "$M" --tensor-parallel-size $N --disable-custom-all-reduce | tee -a "$O/bench.jsonl"
      INGOT_CUDA_PROFILE=1 "$ING" bench latency $D --input-len 128 --output-len 64 --num-iters 1 --model "$M" --tensor-parallel-size $N 2>&1 | grep "profile: decode" ;;
    tpla)
      # Launch-ahead under TP: Qwen3-30B-A3B TP=N vs TP=1 greedy ids (launched-ahead steps on every
      # rank), then batch 1: the 8B at TP=1 / TP=N / TP=N over NCCL, the 70B at TP=N in bf16 and FP8.
      N=$(nvidia-smi -L | wc -l); M=$(llama8b); D="--load-format dummy --max-model-len 4096"
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only collective | tail -1
      MOE="$W/qwen3-30b-a3b"; mkdir -p "$MOE"; cp tests/gpu/configs/qwen3-30b-a3b/config.json "$W"/tokenizers/qwen3/* "$MOE/"
      timeout -k 5 $((2 * T)) python3 tests/gpu/compare_kv_dtype.py --ingot "$ING_RAW" --model "$MOE" --prompts 2 --threshold 1 --min-agree 0 --tokens 64 \
        --ref "$D --tensor-parallel-size 1" --test "$D --tensor-parallel-size $N" | tee "$O/tp_moe_la.txt"
      B1="bench latency $D --input-len 128 --output-len 256 --num-iters 3 --json"
      for tp in 1 "$N"; do echo "8B batch 1, TP=$tp"; "$ING" $B1 --model "$M" --tensor-parallel-size $tp | tee -a "$O/bench.jsonl"; done
      echo "8B batch 1, TP=$N, NCCL"; "$ING" $B1 --model "$M" --tensor-parallel-size $N --disable-custom-all-reduce | tee -a "$O/bench.jsonl"
      L70="$W/llama-3.1-70b"; mkdir -p "$L70"; cp tests/gpu/configs/llama-3.1-70b/config.json "$W"/tokenizers/llama3/* "$L70/"
      for q in "" "--quantization fp8"; do
        echo "70B batch 1, TP=$N $q"; "$ING" $B1 --model "$L70" --tensor-parallel-size $N $q | tee -a "$O/bench.jsonl"
      done ;;
    tpb1)
      # Batch 1 of the 8B at TP=1 / TP=N alternated twice (for A/B runs of one TP knob), after the TP kernels.
      N=$(nvidia-smi -L | wc -l); M=$(llama8b)
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only collective | tail -1
      B1="bench latency --load-format dummy --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --json"
      for round in 1 2; do
        for tp in 1 "$N"; do echo "8B batch 1, TP=$tp"; "$ING" $B1 --model "$M" --tensor-parallel-size $tp | tee -a "$O/bench.jsonl"; done
      done ;;
    w70b) llama70b_q4km > /dev/null & W70B_PID=$! ;;
    moew) qwen3moe_gguf > /dev/null & WMOE_PID=$! ;;
    moeready) G=$(qwen3moe_gguf); ls -la "$G"; "$ING" inspect "$G" | grep -E "tensor types|experts|active" ;;
    moelcpp|moeb1|moebatch)
      # Batch 1 alternated twice (llama-bench at depth 128: the positions ingot's 128-token prompt
      # leaves), then 256 x (1024 in, 128 out) beside llama-batched-bench; the grouped GEMMs from
      # MOE_GROUPED tokens a step (default 48, bench_moe.py's crossover). moeb1 / moebatch: one half.
      LB=.gpu-lcpp/build/bin; G=$(qwen3moe_gguf)
      [ -x "$LB/llama-bench" ] || { echo "no llama-bench (run lcpp first)"; continue; }
      export INGOT_CUDA_MOE_GROUPED_MIN_TOKENS=${MOE_GROUPED:-48}
      if [ $phase != moebatch ]; then
        B1="bench latency --model $G --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --json"
        for round in 1 2; do
          echo "round $round: ingot"; INGOT_LOG=info "$ING" $B1 2>&1 | grep -E "^\{|weights streamed|load" | tee -a "$O/bench.jsonl"
          echo "round $round: llama.cpp"; timeout -k 5 "$T" "$LB/llama-bench" -m "$G" -ngl 99 -fa 1 -p 0 -n 256 -d 128 -r 3 -o jsonl | tee -a "$O/llama_bench.jsonl"
        done
      fi
      if [ $phase != moeb1 ]; then
        "$ING" bench throughput --model "$G" --max-model-len 4096 --num-prompts 256 --max-num-seqs 256 --input-len 1024 \
          --output-len 128 --max-num-batched-tokens 8192 --json | tee -a "$O/bench.jsonl"
        timeout -k 5 $((2 * T)) "$LB/llama-batched-bench" -m "$G" -ngl 99 -fa on -c 300000 -b 8192 -ub 512 -npp 1024 -ntg 128 \
          -npl 256 --output-format jsonl | tail -3 | tee -a "$O/llama_batched.jsonl"
      fi
      unset INGOT_CUDA_MOE_GROUPED_MIN_TOKENS ;;
    moeserve)
      # The same file served, ingot then llama-server (its recommended flags, a slot per client),
      # under one client: 64 concurrent x (1024 in, 128 out), PROMPTS_MOE prompts (default 128).
      LS=.gpu-lcpp/build/bin/llama-server; PORT=8765; G=$(qwen3moe_gguf)
      [ -x "$LS" ] || { echo "no llama-server (run lcpp first)"; continue; }
      export INGOT_CUDA_MOE_GROUPED_MIN_TOKENS=${MOE_GROUPED:-48}
      serve_bench ingot "$(qwen3moe_dir)" "${PROMPTS_MOE:-128}" 1 "$ING_RAW" serve --model "$G" --max-model-len 4096 --max-num-seqs 64
      serve_bench llama "$(qwen3moe_dir)" "${PROMPTS_MOE:-128}" 1 "$LS" -m "$G" -ngl 99 -fa on -np 64 -c 81920 --cache-ram 0
      unset INGOT_CUDA_MOE_GROUPED_MIN_TOKENS ;;
    tpsm)
      LB=.gpu-lcpp/build/bin; G=$(llama70b_q4km); N=$(nvidia-smi -L | wc -l)
      [ -x "$LB/llama-bench" ] || { echo "no llama-bench (run lcpp first)"; continue; }
      for sm in layer row; do
        echo "llama.cpp -sm $sm over $N GPUs"
        timeout -k 5 "$T" "$LB/llama-bench" -m "$G" -ngl 99 -fa 1 -sm $sm -p 512 -n 128 -r 2 -o jsonl | tee -a "$O/llama_bench.jsonl"
      done
      B1="bench latency --model $G --max-model-len 4096 --input-len 128 --output-len 128 --num-iters 2 --json"
      for run in "--tensor-parallel-size $N" "--cuda-weights native"; do
        t0=$(date +%s); echo "ingot $run"; "$ING" $B1 $run | tee -a "$O/bench.jsonl"; echo "(load and run: $(( $(date +%s) - t0 )) s)"
      done ;;
    tpsmserve)
      LS=.gpu-lcpp/build/bin/llama-server; G=$(llama70b_q4km); N=$(nvidia-smi -L | wc -l); PORT=8765
      TOK="$W/llama-3.1-70b"; PROMPTS=${PROMPTS_70B:-64}
      # $SERVE_FLAGS: extra flags for ingot (e.g. a --config for a bundle built before start-up waited out any load).
      serve_bench ingot-tp$N "$TOK" "$PROMPTS" 1 "$ING_RAW" serve --model "$G" --tensor-parallel-size $N --max-model-len 4096 \
        --max-num-seqs 64 ${SERVE_FLAGS:-}
      for sm in layer row; do
        serve_bench llama "$TOK" "$PROMPTS" 1 "$LS" -m "$G" -ngl 99 -fa on -sm $sm -np 64 -c 81920 --cache-ram 0
        mv "$O/serve-llama-1.json" "$O/serve-llama-sm$sm.json"
      done ;;
    draft)
      M=$(llama8b); S="$W/llama-3.2-1b"; mkdir -p "$S"; cp tests/gpu/configs/llama-3.2-1b/config.json "$W"/tokenizers/llama3/* "$S/"
      D="--load-format dummy --max-model-len 4096"
      spec() { printf '{"method": "draft", "model": "%s", "adaptive": false, "num_speculative_tokens": 4}' "$1"; }
      for d in none "$M" "$S"; do
        sc=(); [ "$d" = none ] || sc=(--speculative-config "$(spec "$d")")
        echo "draft: $d"
        "$ING" generate --model "$M" $D --deterministic --prompt "The capital of France is" --max-tokens 32 --ignore-eos \
          --print-ids "${sc[@]}" 2>&1 >/dev/null | grep output_ids | tee "$W/draft-ids-$(basename "$d")"
        "$ING" bench latency --model "$M" $D --input-len 128 --output-len 128 --num-iters 1 --json "${sc[@]}" | tee -a "$O/bench.jsonl"
      done
      for d in "$M" "$S"; do
        cmp -s "$W/draft-ids-none" "$W/draft-ids-$(basename "$d")" && echo "ids equal: $d" || echo "IDS DIFFER: $d"
      done ;;
    eagle)
      # EAGLE-3 heads on CUDA: the runner-cuda test binary (scripts/gpu-bundle puts it in the bundle)
      # checks the hidden-state capture and the head against the CPU runner's; then the 8B dummy
      # with a random head (tests/reference/eagle3_head.py, draft vocabulary 32,000 as the published
      # Llama-3.1-8B heads): greedy ids with 3 forced proposals a step equal plain decoding's under
      # --deterministic, and batch 1 without a head, with it forced (no proposal holds: the cost of
      # the machinery) and with the cost model deciding, alternated twice.
      if [ -f "$B/runner-cuda-tests.gz" ]; then
        gunzip -c "$B/runner-cuda-tests.gz" > "$W/runner-cuda-tests"; chmod +x "$W/runner-cuda-tests"
        timeout -k 5 "$T" "$W/runner-cuda-tests" --ignored --nocapture eagle:: 2>&1 | grep -vE "^\s*$" | tail -8
      else echo "no runner-cuda-tests in the bundle"; fi
      M=$(llama8b); H=$(eagle_head_8b); D="--load-format dummy --max-model-len 4096"
      for s in none false; do
        sc=(); [ "$s" = none ] || sc=(--speculative-config "$(eagle_spec "$s")")
        "$ING" generate --model "$M" $D --deterministic --prompt "The capital of France is" --max-tokens 32 --ignore-eos \
          --print-ids "${sc[@]}" 2>&1 >/dev/null | grep output_ids > "$W/eagle-ids-$s"
      done
      cmp -s "$W/eagle-ids-none" "$W/eagle-ids-false" && echo "ids equal with a forced head" || echo "IDS DIFFER with a forced head"
      for round in 1 2; do
        for s in none false true; do
          sc=(); [ "$s" = none ] || sc=(--speculative-config "$(eagle_spec "$s")")
          echo "round $round, head: $s (adaptive)"
          "$ING" bench latency --model "$M" $D --input-len 128 --output-len 128 --num-iters 2 --json "${sc[@]}" | tee -a "$O/bench.jsonl"
        done
      done ;;
    tcgemv)
      # cuda.tc_gemv_min_rows: the tensor-core GEMVs of 2-8 rows against float64, then on the 8B dummy the
      # forced random head's verify steps (4 rows) with and without them (the first step where the
      # ids part, and the largest logprob difference before it), then speed alternated twice:
      # decode of 2, 3, 4 and 8 sequences, and batch 1 with the head forced.
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only gemv_tc | tail -14
      M=$(llama8b); H=$(eagle_head_8b); D="--load-format dummy --max-model-len 4096"
      timeout -k 5 $((2 * T)) python3 tests/gpu/compare_decode.py --a "$ING_RAW" --b "$ING_RAW" --b-env INGOT_CUDA_TC_GEMV_MIN_ROWS=2 \
        --model "$M" --dummy --tokens 32 --prompts 3 -- --speculative-config "$(eagle_spec false)" | tail -6
      for round in 1 2; do
        for tc in 0 2; do
          for n in 2 3 4 8; do
            echo "round $round, tc_gemv_min_rows $tc, $n sequences"
            INGOT_CUDA_TC_GEMV_MIN_ROWS=$tc "$ING" bench throughput --model "$M" $D --num-prompts $n --max-num-seqs $n \
              --input-len 128 --output-len 256 --json | tee -a "$O/bench.jsonl"
          done
          echo "round $round, tc_gemv_min_rows $tc, batch 1, head forced"
          INGOT_CUDA_TC_GEMV_MIN_ROWS=$tc "$ING" bench latency --model "$M" $D --input-len 128 --output-len 128 --num-iters 2 --json \
            --speculative-config "$(eagle_spec false)" | tee -a "$O/bench.jsonl"
        done
      done ;;
    eagleserve)
      # Serving 64 concurrent (1024 in / 128 out, 128 prompts) with the random 8B head configured
      # (the cost model deciding; above disable_by_batch_size nothing is observed or proposed, the
      # captured rows still copied) and without, alternated twice.
      M=$(llama8b); H=$(eagle_head_8b); PORT=8765
      S="serve --model $M --load-format dummy --max-model-len 4096 --max-num-seqs 64"
      for round in 1 2; do
        serve_bench plain "$M" 128 "$round" "$ING_RAW" $S
        serve_bench eagle "$M" 128 "$round" "$ING_RAW" $S --speculative-config "$(eagle_spec true)"
      done ;;
    eagleservelog)
      # eagleserve once each with the engine's debug log, summarised (eagle_steps.py): steps with
      # prompt chunks and decode steps, their count and mean ms, and what the head did.
      M=$(llama8b); H=$(eagle_head_8b); PORT=8765
      S="serve --model $M --load-format dummy --max-model-len 4096 --max-num-seqs 64"
      INGOT_LOG_LEVEL=debug serve_bench plain "$M" 128 1 "$ING_RAW" $S | grep -E "ready|output tokens|TTFT "
      python3 tests/gpu/eagle_steps.py < "$W/serve-plain.log"
      INGOT_LOG_LEVEL=debug serve_bench eagle "$M" 128 1 "$ING_RAW" $S --speculative-config "$(eagle_spec true)" \
        | grep -E "ready|output tokens|TTFT "
      python3 tests/gpu/eagle_steps.py < "$W/serve-eagle.log" ;;
    eaglesteps)
      # Where a step's time goes with the random 8B head forced to propose 3 tokens (the engine's
      # debug log: verify forward, the head's observation of the verified rows, its proposals),
      # and the same log without a head.
      M=$(llama8b); H=$(eagle_head_8b); D="--load-format dummy --max-model-len 4096"
      for s in none false; do
        sc=(); [ "$s" = none ] || sc=(--speculative-config "$(eagle_spec "$s")")
        echo "head: $s (adaptive)"
        INGOT_LOG_LEVEL=debug "$ING" generate --model "$M" $D --prompt "The capital of France is" --max-tokens 128 \
          --ignore-eos "${sc[@]}" 2>&1 >/dev/null | python3 tests/gpu/eagle_steps.py
      done ;;
    tp4)
      N=$(nvidia-smi -L | wc -l); M=$(llama8b); D="--load-format dummy --max-model-len 4096"; PORT=8765
      echo "GPUs: $N"
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only collective | tail -2
      timeout -k 5 $((2 * T)) python3 tests/gpu/compare_kv_dtype.py --ingot "$ING_RAW" --model "$M" --prompts 2 --threshold 1 --min-agree 0 \
        --ref "$D --tensor-parallel-size 1" --test "$D --tensor-parallel-size $N" | tee "$O/tp4_8b.txt"
      B1="bench latency $D --input-len 128 --output-len 256 --num-iters 3 --json"
      for round in 1 2; do
        for tp in 1 2 "$N"; do echo "8B batch 1, TP=$tp"; "$ING" $B1 --model "$M" --tensor-parallel-size $tp | tee -a "$O/bench.jsonl"; done
      done
      L70="$W/llama-3.1-70b"; mkdir -p "$L70"; cp tests/gpu/configs/llama-3.1-70b/config.json "$W"/tokenizers/llama3/* "$L70/"
      for run in "$N" "$N --quantization fp8" "2 --quantization fp8"; do
        echo "70B batch 1, TP=$run"; "$ING" $B1 --model "$L70" --tensor-parallel-size $run | tee -a "$O/bench.jsonl"
      done
      INGOT_CUDA_PROFILE=1 "$ING" bench latency --load-format dummy --max-model-len 8192 --model "$L70" --tensor-parallel-size $N \
        --input-len 4096 --output-len 2 --max-num-batched-tokens 4096 --num-iters 1 --json 2>&1 | grep -E "profile|^\{" | tail -4
      serve_bench ingot "$L70" 128 1 "$ING_RAW" serve --model "$L70" $D --tensor-parallel-size $N --max-num-seqs 64 ;;
    tpsmoke)
      N=$(nvidia-smi -L | wc -l); M=$(llama8b)
      INGOT_LOG_LEVEL=info "$ING" generate --model "$M" --load-format dummy --max-model-len 4096 --tensor-parallel-size $N --prompt "The capital of France is" --max-tokens 8 --ignore-eos --print-ids 2>&1 | tail -15
      "$ING" bench latency --load-format dummy --max-model-len 4096 --input-len 128 --output-len 64 --num-iters 1 --json --model "$M" --tensor-parallel-size $N ;;
    qwen3b1)
      mkdir -p "$W/qwen3-8b"; cp tests/gpu/configs/qwen3-8b/config.json "$W"/tokenizers/qwen3/* "$W/qwen3-8b/"
      "$ING" bench latency --model "$W/qwen3-8b" --load-format dummy --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --json | tee -a "$O/bench.jsonl" ;;
    smolb1)
      mkdir -p "$W/smollm2-dummy"; cp tests/gpu/configs/smollm2-135m/config.json "$W"/tokenizers/llama3/* "$W/smollm2-dummy/"
      for eager in "" "--enforce-eager"; do
        "$ING" bench latency --model "$W/smollm2-dummy" --load-format dummy --input-len 128 --output-len 256 --num-iters 3 $eager --json | tee -a "$O/bench.jsonl"
      done ;;
    tcdec)
      M=$(llama8b)
      TP="bench throughput --model $M --load-format dummy --max-model-len 4096 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192"
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only attention
      for n in 256 64; do
        for rows in 0 1; do
          echo "tc_decode_min_rows=$rows seqs=$n"
          INGOT_CUDA_TC_DECODE_MIN_ROWS=$rows INGOT_CUDA_TC_DECODE_FP8_MIN_ROWS=$rows "$ING" $TP --num-prompts $n --max-num-seqs $n --json | tee -a "$O/bench.jsonl"
        done
      done
      for rows in 0 1; do
        echo "tc_decode_min_rows=$rows seqs=256 kv fp8"
        INGOT_CUDA_TC_DECODE_MIN_ROWS=$rows INGOT_CUDA_TC_DECODE_FP8_MIN_ROWS=$rows "$ING" $TP --num-prompts 256 --max-num-seqs 256 --kv-cache-dtype fp8 --json | tee -a "$O/bench.jsonl"
        echo "tc_decode_min_rows=$rows batch 1"
        INGOT_CUDA_TC_DECODE_MIN_ROWS=$rows INGOT_CUDA_TC_DECODE_FP8_MIN_ROWS=$rows "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --json | tee -a "$O/bench.jsonl"
      done
      for rows in 0 1; do
        echo "tc_decode_min_rows=$rows seqs=256 eager profile"
        INGOT_CUDA_TC_DECODE_MIN_ROWS=$rows INGOT_CUDA_TC_DECODE_FP8_MIN_ROWS=$rows INGOT_CUDA_PROFILE=1 "$ING" ${TP/--output-len 128/--output-len 32} --num-prompts 256 --max-num-seqs 256 2>&1 | grep -E "cuda profile"
      done
      INGOT_CUDA_TC_DECODE_MIN_ROWS=1 timeout -k 5 "$T" python3 tests/gpu/compare_hf.py --ingot "$ING" --tokenizers "$W/tokenizers" --work "$W/hf" ;;
    tcfp8)
      M=$(llama8b)
      TP="bench throughput --model $M --load-format dummy --max-model-len 4096 --input-len 1024 --max-num-batched-tokens 8192 --num-prompts 256 --max-num-seqs 256 --kv-cache-dtype fp8"
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only attention
      for rows in 0 1; do
        echo "tc_decode_min_rows=$rows seqs=256 kv fp8"
        INGOT_CUDA_TC_DECODE_MIN_ROWS=$rows INGOT_CUDA_TC_DECODE_FP8_MIN_ROWS=$rows "$ING" $TP --output-len 128 --json | tee -a "$O/bench.jsonl"
      done
      for rows in 0 1; do
        echo "tc_decode_min_rows=$rows seqs=256 kv fp8 eager profile"
        INGOT_CUDA_TC_DECODE_MIN_ROWS=$rows INGOT_CUDA_TC_DECODE_FP8_MIN_ROWS=$rows INGOT_CUDA_PROFILE=1 "$ING" $TP --output-len 32 2>&1 | grep -E "cuda profile"
      done ;;
    sampled)
      M=$(llama8b)
      S="--temperature 0.8 --top-p 0.95 --top-k 50"
      "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 $S --json | tee -a "$O/bench.jsonl"
      "$ING" bench throughput --model "$M" --load-format dummy --max-model-len 4096 --num-prompts 256 --max-num-seqs 256 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 $S --json | tee -a "$O/bench.jsonl" ;;
    logprobs)
      M=$(llama8b)
      S="--temperature 0.8 --top-p 0.95 --top-k 50 --logprobs 5"
      "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 $S --json | tee -a "$O/bench.jsonl"
      "$ING" bench throughput --model "$M" --load-format dummy --max-model-len 4096 --num-prompts 256 --max-num-seqs 256 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 $S --json | tee -a "$O/bench.jsonl" ;;
    profile)
      M=$(llama8b)
      INGOT_CUDA_PROFILE=1 "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 128 --output-len 64 --num-iters 1 --json
      INGOT_CUDA_PROFILE=1 "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 1024 --output-len 2 --max-num-batched-tokens 1024 --num-iters 2 --json
      INGOT_CUDA_PROFILE=1 "$ING" bench throughput --model "$M" --load-format dummy --max-model-len 4096 --num-prompts 256 --max-num-seqs 256 --input-len 1024 --output-len 32 --max-num-batched-tokens 8192 --json ;;
    kvfp8)
      M=$(llama8b)
      TP="bench throughput --model $M --load-format dummy --max-model-len 4096 --num-prompts 256 --max-num-seqs 256 --input-len 1024 --output-len 128 --max-num-batched-tokens 8192 --kv-cache-dtype fp8"
      "$ING" $TP --json | tee -a "$O/bench.jsonl"
      INGOT_CUDA_PROFILE=1 "$ING" $TP 2>&1 | grep -E "cuda profile"
      "$ING" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 128 --output-len 256 --num-iters 3 --kv-cache-dtype fp8 --json | tee -a "$O/bench.jsonl"
      timeout -k 5 $((2 * T)) python3 tests/gpu/compare_kv_dtype.py --ingot "$ING_RAW" --model "$M" --prompts 2 \
        -- --load-format dummy --max-model-len 4096 --enforce-eager
      if [ -f "$SMOL" ]; then timeout -k 5 $((2 * T)) python3 tests/gpu/compare_kv_dtype.py --ingot "$ING_RAW" --model "$SMOL"; else echo "no SmolLM2 bundle"; fi ;;
    serve) bash tests/gpu/serve_smoke.sh "$ING_RAW" "$(llama8b)" --load-format dummy --max-model-len 4096 --max-num-seqs 32 ;;
    models)
      mkdir -p "$W/llama1b-dummy"; cp tests/gpu/configs/llama-3.2-1b/config.json "$W"/tokenizers/llama3/* "$W/llama1b-dummy/"
      if [ -f "$SMOL" ]; then bash tests/gpu/models_smoke.sh "$ING_RAW" SmolLM2-135M "$SMOL" 600MB; else echo "no SmolLM2 bundle"; fi
      bash tests/gpu/models_smoke.sh "$ING_RAW" "1B dummy" "$W/llama1b-dummy" 4GB dummy
      bash tests/gpu/models_share.sh "$ING_RAW" "$W/llama1b-dummy" ;;
    structured)
      M=$(llama8b)
      mkdir -p "$W/llama1b-dummy"; cp tests/gpu/configs/llama-3.2-1b/config.json "$W"/tokenizers/llama3/* "$W/llama1b-dummy/"
      python3 tests/gpu/structured_smoke.py "$ING_RAW" "$W/llama1b-dummy"
      INGOT_BIN="$ING_RAW" INGOT_TEST_MODEL="$M" python3 scripts/bench-structured --rounds 2 -- \
        --load-format dummy --device cuda --max-model-len 8192 --max-num-seqs 64 ;;
    launchahead)
      [ -f "$SMOL" ] || { echo "no SmolLM2 bundle"; continue; }
      timeout -k 5 "$T" python3 tests/gpu/launch_ahead_smoke.py "$ING_RAW" "$SMOL" --device cuda ;;
    plogprobs)
      [ -f "$SMOL" ] || { echo "no SmolLM2 bundle"; continue; }
      bash tests/gpu/prompt_logprobs_real.sh "$ING_RAW" "$SMOL" ;;
    spec|specrated)
      # specrated: the same with speculative.rate_by_match on.
      [ -f "$SMOL" ] || { echo "no SmolLM2 bundle"; continue; }
      S='{}'; [ $phase = specrated ] && S='{"rate_by_match": true}'
      timeout -k 5 540 python3 tests/gpu/speculative.py --ingot "$ING_RAW" --model "$SMOL" \
        --prompts tests/fixtures/speculative_prompts.json --spec "$S" ;;
    specvar)
      # n-gram settings side by side: the default path's batch-1 rows of the prompt set for each
      # SPEC_VARIANTS entry (one JSON object a line, merged into --speculative-config), the
      # variants alternated over two rounds, one server each.
      [ -f "$SMOL" ] || { echo "no SmolLM2 bundle"; continue; }
      V=${SPEC_VARIANTS:-$'{}\n{"prompt_lookup_min": 1}\n{"prompt_lookup_min": 1, "rate_by_match": true}'}
      for round in 1 2; do
        while IFS= read -r S; do
          [ -n "$S" ] || continue
          echo "round $round"
          timeout -k 5 240 python3 tests/gpu/speculative.py --ingot "$ING_RAW" --model "$SMOL" \
            --prompts tests/fixtures/speculative_prompts.json --spec "$S" --default-only --rounds 1
        done <<< "$V"
      done ;;
    moecarve)
      # cuda.smem_carveout on the Qwen3-30B-A3B dummy's batch 1 (unset: the driver's choice per kernel).
      M=$(qwen3moe_dir)
      for round in 1 2; do
        for cv in unset ${CARVE_SET:-0 25 50 100}; do
          tps=$([ "$cv" = unset ] || export INGOT_CUDA_SMEM_CARVEOUT=$cv; b1_tps "$ING" "$M")
          echo "moecarve round $round carveout $cv: $tps tok/s"
        done
      done ;;
    pdlab)
      # What programmatic dependent launch buys at batch 1 (cuda.pdl on / off alternated twice): the
      # Qwen3-30B-A3B dummy, the 8B dummy and the SmolLM2 shape (dummy), 128 in / 256 out, graphs.
      mkdir -p "$W/smollm2-dummy"; cp tests/gpu/configs/smollm2-135m/config.json "$W"/tokenizers/llama3/* "$W/smollm2-dummy/"
      for m in "$(qwen3moe_dir)" "$(llama8b)" "$W/smollm2-dummy"; do
        for round in 1 2; do
          for pdl in true false; do
            tps=$(export INGOT_CUDA_PDL=$pdl; b1_tps "$ING" "$m")
            echo "$(basename "$m") round $round pdl $pdl: $tps tok/s"
          done
        done
      done ;;
    tclmhead)
      # The LM head of 2-8 rows on tensor cores for models narrow enough for the short GEMVs
      # (cuda.tc_gemv_min_rows 0: never, 3: the default), SmolLM2: the kernel check at its width,
      # ms a decode step of N rows, and the prompt set's default-path batch-1 rows, alternated.
      [ -f "$SMOL" ] || { echo "no SmolLM2 bundle"; continue; }
      timeout -k 5 "$T" python3 tests/gpu/check_kernels.py --cubins "$W" --only gemv_tc | tail -16
      for n in 2 3 4 5 6 8; do
        for tc in 0 3; do
          tps=$(INGOT_CUDA_TC_GEMV_MIN_ROWS=$tc timeout -k 5 120 "$ING_RAW" bench throughput --model "$SMOL" --num-prompts $n \
            --max-num-seqs $n --input-len 128 --output-len 512 2>&1 | sed -n 's/^decode after all prefills: \([0-9.]*\).*/\1/p')
          python3 -c "import sys; n, t = int(sys.argv[1]), float(sys.argv[2] or 'nan'); print(f'tc_gemv_min_rows {sys.argv[3]}: rows {n}: {1000 * n / t:.3f} ms a decode step')" "$n" "$tps" "$tc"
        done
      done
      for round in 1 2; do
        for tc in 0 3; do
          echo "round $round, tc_gemv_min_rows $tc"
          INGOT_CUDA_TC_GEMV_MIN_ROWS=$tc timeout -k 5 240 python3 tests/gpu/speculative.py --ingot "$ING_RAW" --model "$SMOL" \
            --prompts tests/fixtures/speculative_prompts.json --default-only --rounds 1
        done
      done ;;
    specpeer)
      [ -f "$SMOL" ] || { echo "no SmolLM2 bundle"; continue; }
      LS=.gpu-lcpp/build/bin/llama-server
      [ -x "$LS" ] || { echo "no llama-server (run lcpp first)"; continue; }
      timeout -k 5 540 python3 tests/gpu/speculative.py --ingot "$ING_RAW" --model "$SMOL" \
        --prompts tests/fixtures/speculative_prompts.json --llama-server "$LS" ;;
    rowsteps)
      # ms a decode step of N rows on SmolLM2 (graphs), N = 1..8 (ROWSTEPS_N), this build and, when
      # carried ($W/ingot-old), the previous one alternated per N; ROWSTEPS_FLAGS: more bench flags
      # (--enforce-eager); ROWSTEPS_INPUT / ROWSTEPS_OUTPUT: the lengths (128 / 512).
      [ -f "$SMOL" ] || { echo "no SmolLM2 bundle"; continue; }
      bins=("$ING_RAW"); [ -x "$W/ingot-old" ] && bins=("$W/ingot-old" "$ING_RAW")
      for n in ${ROWSTEPS_N:-1 2 3 4 5 6 7 8}; do
        for b in "${bins[@]}"; do
          tps=$(timeout -k 5 120 "$b" bench throughput --model "$SMOL" --num-prompts $n --max-num-seqs $n \
            --input-len ${ROWSTEPS_INPUT:-128} --output-len ${ROWSTEPS_OUTPUT:-512} ${ROWSTEPS_FLAGS:-} 2>&1 | sed -n 's/^decode after all prefills: \([0-9.]*\).*/\1/p')
          python3 -c "import sys; n, t = int(sys.argv[1]), float(sys.argv[2] or 'nan'); print(f'{sys.argv[3]:10} rows {n}: {1000 * n / t:.3f} ms a decode step ({t:.0f} tok/s)')" \
            "$n" "$tps" "$(basename "$b")"
        done
      done ;;
    rowsncu)
      # Per-kernel time of one eager decode step of N rows on SmolLM2, each kernel isolated by
      # ncu with warm caches (--cache-control none), N = 1 and 5 (ROWS_NCU to change).
      [ -f "$SMOL" ] || { echo "no SmolLM2 bundle"; continue; }
      for n in ${ROWS_NCU:-1 5}; do
        echo "--- $n rows"
        timeout -k 5 200 ncu --clock-control none --cache-control none \
          --kernel-name regex:'gemv|paged|combine|argmax|embed|norm|advance' --launch-skip 2000 --launch-count 190 \
          --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum --csv \
          "$ING_RAW" bench throughput --model "$SMOL" --num-prompts $n --max-num-seqs $n --input-len 32 \
          --output-len 128 --enforce-eager > "$O/rowsncu-$n.csv" 2>/dev/null
        python3 tests/gpu/ncu_summary.py "$O/rowsncu-$n.csv"
      done ;;
    specsteps)
      [ -f "$SMOL" ] || { echo "no SmolLM2 bundle"; continue; }
      timeout -k 5 300 python3 tests/gpu/spec_steps.py --ingot "$ING_RAW" --model "$SMOL" \
        --prompts tests/fixtures/speculative_prompts.json ;;
    kvtiers) timeout -k 5 600 python3 tests/gpu/kv_tiers.py --ingot "$ING_RAW" --model "$(llama8b)" ;;
    cache) bash tests/gpu/cache_smoke.sh "$ING_RAW" "$(llama8b)" --load-format dummy --max-model-len 4096 --max-num-seqs 32 ;;
    embeddings)
      [ -f "$W/minilm/model.safetensors" ] || { echo "no MiniLM bundle"; continue; }
      timeout -k 5 "$T" python3 tests/gpu/embeddings_check.py --ingot "$ING_RAW" --model "$W/minilm" --out "$O/embeddings.jsonl" ;;
    torch)
      M=$(llama8b)
      python3 tests/gpu/torch_bench.py --model-dir "$M" --case latency --input-len 128 --output-len 256 | tee -a "$O/bench.jsonl"
      python3 tests/gpu/torch_bench.py --model-dir "$M" --case decode256 --batch 256 --input-len 1024 --output-len 128 | tee -a "$O/bench.jsonl" ;;
    ncu)
      M=$(llama8b)
      timeout -k 5 300 ncu --kernel-name regex:paged_attention --launch-skip 1500 --launch-count 1 \
        --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
        --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats \
        "$ING_RAW" bench throughput --model "$M" --load-format dummy --max-model-len 4096 --num-prompts 256 \
        --max-num-seqs 256 --input-len 1024 --output-len 32 --max-num-batched-tokens 8192 --enforce-eager \
        > "$O/ncu_attention.txt" 2>&1
      grep -vE '^ +-+|^$' "$O/ncu_attention.txt" | grep -E 'paged|Duration|Throughput|Busy|Stall|Issue|Occupancy|Registers|Block Size|Grid Size|Warp Cycles|Eligible|Hit Rate|Bandwidth|Executed Ipc|One or More|No Eligible|Active Warps' | head -60 ;;
    decbench) timeout -k 5 "$T" python3 tests/gpu/bench_decode_attention.py this="$W" --rows 256,64 --splits 1,2,4,8 ;;
    ncu1) bash tests/gpu/ncu_decode.sh "$ING_RAW" "$(llama8b)" "$O/ncu_decode.csv" ;;
    ncumoe)
      # The Qwen3-30B-A3B dummy's batch-1 decode: every kernel of ~one step (700 launches from well
      # inside the first request's decode), isolated by ncu, summed by name. MOE_Q: engine flags
      # (e.g. "--quantization fp8").
      timeout -k 5 300 ncu --launch-skip 4000 --launch-count 700 --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum "$ING_RAW" bench latency \
        --model "$(qwen3moe_dir)" --load-format dummy --max-model-len 4096 --input-len 128 --output-len 64 --num-iters 1 \
        --enforce-eager ${MOE_Q:-} > "$O/ncu_moe$(echo "${MOE_Q:-}" | tr -c 'a-z0-9' _).csv" 2>/dev/null
      python3 tests/gpu/ncu_summary.py "$O/ncu_moe$(echo "${MOE_Q:-}" | tr -c 'a-z0-9' _).csv" ;;
    ncu1fp8) bash tests/gpu/ncu_decode.sh "$ING_RAW" "$(llama8b)" "$O/ncu_decode_fp8.csv" --quantization fp8 ;;
    ncustall)
      M=$(llama8b)
      for q in none fp8; do
        timeout -k 5 240 ncu --kernel-name regex:'n1_(swiglu_norm|add_f32)' --launch-skip 64 --launch-count 3 \
          --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
          --section Occupancy --section LaunchStats --section InstructionStats --section ComputeWorkloadAnalysis \
          --metrics 'regex:^smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio$' \
          "$ING_RAW" bench latency --model "$M" --load-format dummy --max-model-len 4096 --input-len 128 \
          --output-len 8 --num-iters 1 --enforce-eager --quantization $q > "$O/ncu_stall_$q.txt" 2>&1
        grep -vE '^ +-+|^$' "$O/ncu_stall_$q.txt" | grep -E 'gemv|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Eligible Warps|Issue Slots Busy|stalled' \
          | awk '!/stalled/ || $NF + 0 >= 0.3' | sed -E 's/smsp__average_warps_issue_stalled_(.*)_per_issue_active.ratio/stall \1/'
      done ;;
    gemvbench)
      X=(); for c in ${GEMV_XCUBIN:-}; do X+=(--cubin "$c"); done
      timeout -k 5 "$T" python3 tests/gpu/bench_gemv.py --cubin "$W/gemv.sm_90.cubin" "${X[@]}" ;;
    ncup) bash tests/gpu/ncu_prefill.sh "$ING_RAW" "$(llama8b)" "$O/ncu_prefill.csv" ;;
    prefillk) timeout -k 5 "$T" python3 tests/gpu/bench_prefill_attention.py "this=$W:128:256" --fp8 ;;
    *) echo "unknown phase $phase" ;;
  esac
done
