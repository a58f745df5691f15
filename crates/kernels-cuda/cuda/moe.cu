// Mixture-of-experts MLP blocks (Mixtral, Qwen3-MoE): the routing of each
// token (softmax over the router's logits, top k, optional renormalisation),
// the chosen experts' gate/up GEMVs with the gated activation, and their
// down GEMVs summed into the residual stream. The expert choice never leaves
// the device, so a step replays as a CUDA graph.
//
// Expert weights are stacked: gate and up `[experts, width, hidden]`, down
// `[experts, hidden, width]`, bf16. Slot `s = t * k + j` is token t's j-th
// expert, in ascending expert order; a token's expert outputs are summed in
// that order, and every slot's products are computed alone, so a token's
// result does not depend on the batch.
//
// FP8 experts (`--quantization fp8`, the *_e4m3 kernels): the gate and up
// stacks are one e4m3 matrix of 2 * experts * width rows (gate's, then
// up's) and down's one of experts * hidden rows, each followed by its f32
// row scales (fp8.cu's layout); the kernels take the bytes' and the scales'
// bases of each stack and apply a row's scale once to its sum.
#include "e4m3.cuh"
#include "mma.cuh"

#define MOE_MAX_TOP_K 16
#define MOE_MAX_EXPERTS 256
#define MOE_WARPS 8
// 16-byte e4m3 loads a lane issues before using them (expert GEMVs).
#define MOE_E4M3_BATCH 4

// logits[t, e] = (x[t] / rms(x[t]) ⊙ norm) · router[e] in f32, from the f32
// residual: the expert choice is made before any bf16 rounding of the normed
// row (as the CPU's exact path makes it), so near-ties are decided as there.
// With xn, the first block of each token also writes the normed row in bf16
// (`bf16(x * inv * norm)`, add_rms_norm's formula), the experts' input: no
// norm kernel of its own before them. A warp's lanes cover the whole row, so
// each warp sums its squares itself in the one pass over x that also makes
// its logit; its router row does not depend on the kernel before, so it is
// loaded before the wait (MOE_ROUTER_PRE chunks a lane: all of a row of up
// to 2,048; H200, Qwen3-30B-A3B batch 1, 312.0 -> 315.7 tok/s in the
// experiment build, against a block reduction and a second pass after the
// wait). (Routing here too, by
// the last of a token's blocks, measured slower than moe_route after it;
// and a thread-block cluster whose first block routes the logits gathered
// in its shared memory measured the same as the two kernels, 316.1.)
// Grid: (tokens, ceil(experts / MOE_WARPS)); MOE_WARPS warps, an expert
// each. hidden must be a multiple of 8.
#define MOE_ROUTER_PRE 8

__device__ __forceinline__ void moe_router_chunk(const float* xr, const float* norm, uint4 wv, int i, float& ss,
                                                 float& acc) {
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&wv);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const float4 xv = *reinterpret_cast<const float4*>(xr + i + 4 * h);
    const float4 g = *reinterpret_cast<const float4*>(norm + i + 4 * h);
    const float2 a = __bfloat1622float2(w2[2 * h]), b = __bfloat1622float2(w2[2 * h + 1]);
    ss += xv.x * xv.x + xv.y * xv.y + xv.z * xv.z + xv.w * xv.w;
    acc = fmaf(xv.x * g.x, a.x, acc);
    acc = fmaf(xv.y * g.y, a.y, acc);
    acc = fmaf(xv.z * g.z, b.x, acc);
    acc = fmaf(xv.w * g.w, b.y, acc);
  }
}

extern "C" __global__ void moe_router(const float* __restrict__ x, const float* __restrict__ norm,
                                      const bf16* __restrict__ router, int hidden, float eps, int experts,
                                      float* __restrict__ logits, bf16* __restrict__ xn) {
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int e = blockIdx.y * MOE_WARPS + warp;
  const bf16* w = router + (size_t)min(e, experts - 1) * hidden;
  uint4 wv[MOE_ROUTER_PRE];
#pragma unroll
  for (int p = 0; p < MOE_ROUTER_PRE; ++p) {
    const int i = 8 * lane + 256 * p;
    if (i < hidden) wv[p] = *reinterpret_cast<const uint4*>(w + i);
  }
  pdl_begin();
  const float* xr = x + (size_t)t * hidden;
  float ss = 0.f, acc = 0.f;
#pragma unroll
  for (int p = 0; p < MOE_ROUTER_PRE; ++p) {
    const int i = 8 * lane + 256 * p;
    if (i < hidden) moe_router_chunk(xr, norm, wv[p], i, ss, acc);
  }
  for (int i = 8 * lane + 256 * MOE_ROUTER_PRE; i < hidden; i += 256)
    moe_router_chunk(xr, norm, *reinterpret_cast<const uint4*>(w + i), i, ss, acc);
  const float inv = rsqrtf(warp_sum(ss) / hidden + eps);
  acc = warp_sum(acc);
  if (lane == 0 && e < experts) logits[(size_t)t * experts + e] = acc * inv;
  if (xn && blockIdx.y == 0)
    for (int i = 4 * threadIdx.x; i < hidden; i += 4 * blockDim.x) {
      const float4 v = *reinterpret_cast<const float4*>(xr + i);
      const float4 g = *reinterpret_cast<const float4*>(norm + i);
      __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(xn + (size_t)t * hidden + i);
      o[0] = __floats2bfloat162_rn(v.x * inv * g.x, v.y * inv * g.y);
      o[1] = __floats2bfloat162_rn(v.z * inv * g.z, v.w * inv * g.w);
    }
}

// A warp per token: `ids[t * k + j]` and `weights[t * k + j]` for its k
// experts (the largest logits, ties to the lower index), weighted by their
// softmax probabilities over all `experts` logits (divided by their sum when
// `normalize`), written in ascending expert order. Every lane holds experts
// lane, lane + 32, ...; the reductions run in a fixed order.
// Grid: ceil(tokens / (blockDim.x / 32)). experts <= MOE_MAX_EXPERTS,
// k <= MOE_MAX_TOP_K.
extern "C" __global__ void moe_route(const float* __restrict__ logits, int tokens, int experts, int k, int normalize,
                                     int* __restrict__ ids, float* __restrict__ weights) {
  pdl_begin();
  constexpr int PER_LANE = MOE_MAX_EXPERTS / 32;
  const int lane = threadIdx.x & 31;
  const int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (t >= tokens) return;
  const float* l = logits + (size_t)t * experts;
  float v[PER_LANE];
  float max = -INFINITY;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    const int e = lane + 32 * i;
    v[i] = e < experts ? l[e] : -INFINITY;
    max = fmaxf(max, v[i]);
  }
  max = warp_max(max);
  float total = 0.f;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i)
    if (lane + 32 * i < experts) total += expf(v[i] - max);
  total = warp_sum(total);
  unsigned taken = 0;
  int mine = 0;
  float my_weight = 0.f, chosen = 0.f;
  for (int j = 0; j < k; ++j) {
    float best = -INFINITY;
    int at = 0x7fffffff;
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) {
      const int e = lane + 32 * i;
      if (e < experts && !((taken >> i) & 1) && (at == 0x7fffffff || v[i] > best)) {
        best = v[i];
        at = e;
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      const float ob = __shfl_xor_sync(0xffffffffu, best, o);
      const int oa = __shfl_xor_sync(0xffffffffu, at, o);
      if (ob > best || (ob == best && oa < at)) {
        best = ob;
        at = oa;
      }
    }
    if ((at & 31) == lane) taken |= 1u << (at >> 5);
    const float w = expf(best - max) / total;
    chosen += w;
    if (lane == j) {
      mine = at;
      my_weight = w;
    }
  }
  // Lane j < k holds the j-th pick; its place in ascending expert order.
  int rank = 0;
  for (int j = 0; j < k; ++j) rank += __shfl_sync(0xffffffffu, mine, j) < mine;
  if (lane < k) {
    ids[t * k + rank] = mine;
    weights[t * k + rank] = normalize ? my_weight / chosen : my_weight;
  }
}

// The dot product of 8 bf16 pairs (16-byte chunks), alone.
__device__ __forceinline__ float moe_dot8(uint4 a, uint4 b) {
  float acc = 0.f;
  dot8(a, b, acc);
  return acc;
}

// One-token steps (batch-1 decode; the runner's `_b1` kernels): act[s, r] =
// act(gate_e[r] · x[t]) * (up_e[r] · x[t]) for slot s = t * k + j and
// e = ids[s]; x is the normed `[tokens, hidden]` bf16 input, staged in
// shared memory (hidden bf16: the launch's dynamic shared memory). A lane
// loads GROUP chunks of its gate row and of its up row at once, right
// after the expert id, then uses them: the loads cannot start before the
// wait (the id comes from the kernel before), so what matters is how many
// are in flight. Against x loaded beside the weights, a chunk pair at a
// time (H200, Qwen3-30B-A3B batch 1, the experiment build that chose
// kernels by a switch; docs/perf/moe-cuda.md): bf16 GROUP 2 at six blocks
// an SM 329.2 -> 343.9 tok/s (GROUP 4 and 8, fewer blocks: 334.6, 334.9);
// e4m3 (16 weights a chunk) GROUP 4, four blocks an SM, 426.7 -> 439.9;
// with streaming loads (below) GROUP 2 at six blocks, as bf16, 454.9 ->
// 464.0 (GROUP 8 at two: 442.3; bf16 GROUP 1 at eight blocks 357.8, 2 at
// eight 355.3, 2 at four 354.6, 4 at four 347.1, against 358.8). A
// lane's chunks are summed in ascending order, as before: the same bits.
// Grid: (tokens * k, ceil(width / MOE_WARPS)); MOE_WARPS warps, a row each.
// hidden must be a multiple of 8 (16 for e4m3).
template <bool GELU, bool E4M3, int GROUP>
__device__ __forceinline__ void moe_gate_up(const bf16* __restrict__ x, const void* __restrict__ gate,
                                            const void* __restrict__ up, const float* __restrict__ gate_scales,
                                            const float* __restrict__ up_scales, const int* __restrict__ ids,
                                            int k, int hidden, int width, bf16* __restrict__ act) {
  extern __shared__ __align__(16) unsigned char moe_x_smem[];
  uint4* s_x = reinterpret_cast<uint4*>(moe_x_smem);
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
  const int s = blockIdx.x;
  constexpr int PER = E4M3 ? 16 : 8;  // weights a 16-byte chunk
  const int nc = hidden / PER;
  // Rows past the width load their expert's last row and store nothing:
  // every warp reaches the barrier.
  const size_t row = (size_t)ids[s] * width + min(r, width - 1);
  const uint4* g = reinterpret_cast<const uint4*>(gate) + row * nc;
  const uint4* u = reinterpret_cast<const uint4*>(up) + row * nc;
  uint4 gv[GROUP], uv[GROUP];
  // Streaming loads (see moe_down_chunks).
  auto load_group = [&](int base) {
#pragma unroll
    for (int b = 0; b < GROUP; ++b) {
      const int i = base + lane + 32 * b;
      if (i < nc) {
        gv[b] = __ldcs(g + i);
        uv[b] = __ldcs(u + i);
      }
    }
  };
  load_group(0);
  const float sg = E4M3 ? gate_scales[row] : 1.f, su = E4M3 ? up_scales[row] : 1.f;
  const uint4* xr = reinterpret_cast<const uint4*>(x + (size_t)(s / k) * hidden);
  for (int i = threadIdx.x; i < hidden / 8; i += blockDim.x) s_x[i] = xr[i];
  __syncthreads();
  float ag = 0.f, au = 0.f;
  for (int base = 0;;) {
#pragma unroll
    for (int b = 0; b < GROUP; ++b) {
      const int i = base + lane + 32 * b;
      if (i >= nc) break;
      if (E4M3) {
        dot16_e4m3(gv[b], s_x[2 * i], s_x[2 * i + 1], ag);
        dot16_e4m3(uv[b], s_x[2 * i], s_x[2 * i + 1], au);
      } else {
        ag += moe_dot8(gv[b], s_x[i]);
        au += moe_dot8(uv[b], s_x[i]);
      }
    }
    base += 32 * GROUP;
    if (base >= nc) break;
    load_group(base);
  }
  ag = warp_sum(ag) * sg;
  au = warp_sum(au) * su;
  if (lane == 0 && r < width) {
    const float a = GELU ? gelu_tanh(ag) : ag / (1.f + expf(-ag));
    act[(size_t)s * width + r] = to_bf16(a * au);
  }
}

#define MOE_GATE_UP_BF16(NAME, GELU)                                                                               \
  extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS, 6)                                               \
      NAME(const bf16* x, const bf16* gate, const bf16* up, const int* ids, int k, int hidden, int width,       \
           bf16* act) {                                                                                          \
    moe_gate_up<GELU, false, 2>(x, gate, up, nullptr, nullptr, ids, k, hidden, width, act);                     \
  }
#define MOE_GATE_UP_E4M3(NAME, GELU)                                                                               \
  extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS, 6)                                               \
      NAME(const bf16* x, const uint8_t* gate, const uint8_t* up, const float* gate_scales,                     \
           const float* up_scales, const int* ids, int k, int hidden, int width, bf16* act) {                   \
    moe_gate_up<GELU, true, 2>(x, gate, up, gate_scales, up_scales, ids, k, hidden, width, act);                \
  }
MOE_GATE_UP_BF16(moe_gate_up_silu_b1, false)
MOE_GATE_UP_BF16(moe_gate_up_gelu_tanh_b1, true)
MOE_GATE_UP_E4M3(moe_gate_up_silu_e4m3_b1, false)
MOE_GATE_UP_E4M3(moe_gate_up_gelu_tanh_e4m3_b1, true)

// Steps of several tokens (2 to moe_grouped_min_tokens - 1): act[s, r] =
// act(gate_e[r] · x[t]) * (up_e[r] · x[t]) for slot s = t * k + j and
// e = ids[s]; x is the normed `[tokens, hidden]` bf16 input, read from
// global memory beside the weights: with several tokens' slots there are
// warps enough in flight (the one-token kernels above measured 9-15 %
// slower at 8-32 tokens, bench_moe.py, H200).
// Grid: (tokens * k, ceil(width / MOE_WARPS)); MOE_WARPS warps, a row each.
// hidden must be a multiple of 8.
template <bool GELU>
__device__ __forceinline__ void moe_gate_up_rows(const bf16* __restrict__ x, const bf16* __restrict__ gate,
                                                 const bf16* __restrict__ up, const int* __restrict__ ids, int k,
                                                 int hidden, int width, bf16* __restrict__ act) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
  const int s = blockIdx.x;
  if (r >= width) return;
  const size_t row = ((size_t)ids[s] * width + r) * hidden;
  const uint4* g = reinterpret_cast<const uint4*>(gate + row);
  const uint4* u = reinterpret_cast<const uint4*>(up + row);
  const uint4* xr = reinterpret_cast<const uint4*>(x + (size_t)(s / k) * hidden);
  float ag = 0.f, au = 0.f;
#pragma unroll 8
  for (int i = lane; i < hidden / 8; i += 32) {
    const uint4 xv = xr[i];
    ag += moe_dot8(g[i], xv);
    au += moe_dot8(u[i], xv);
  }
  ag = warp_sum(ag);
  au = warp_sum(au);
  if (lane == 0) {
    const float a = GELU ? gelu_tanh(ag) : ag / (1.f + expf(-ag));
    act[(size_t)s * width + r] = to_bf16(a * au);
  }
}

// moe_gate_up over e4m3 rows (16 weights a load); hidden % 16 == 0.
template <bool GELU>
__device__ __forceinline__ void moe_gate_up_e4m3(const bf16* __restrict__ x, const uint8_t* __restrict__ gate,
                                                 const uint8_t* __restrict__ up, const float* __restrict__ gate_scales,
                                                 const float* __restrict__ up_scales, const int* __restrict__ ids,
                                                 int k, int hidden, int width, bf16* __restrict__ act) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
  const int s = blockIdx.x;
  if (r >= width) return;
  const size_t row = (size_t)ids[s] * width + r;
  const uint4* g = reinterpret_cast<const uint4*>(gate + row * hidden);
  const uint4* u = reinterpret_cast<const uint4*>(up + row * hidden);
  const uint4* xr = reinterpret_cast<const uint4*>(x + (size_t)(s / k) * hidden);
  const int n16 = hidden / 16;
  // The row scales load with the first weights (not after the sums).
  const float sg = gate_scales[row], su = up_scales[row];
  float ag = 0.f, au = 0.f;
  // MOE_E4M3_BATCH loads of each row, and their inputs, in flight before
  // any arithmetic: at batch 1 the kernel waits on memory, not math.
  for (int i0 = lane; i0 < n16; i0 += 32 * MOE_E4M3_BATCH) {
    uint4 gv[MOE_E4M3_BATCH], uv[MOE_E4M3_BATCH], xv[MOE_E4M3_BATCH][2];
#pragma unroll
    for (int b = 0; b < MOE_E4M3_BATCH; ++b) {
      const int i = i0 + 32 * b;
      if (i < n16) {
        gv[b] = g[i];
        uv[b] = u[i];
        xv[b][0] = xr[2 * i];
        xv[b][1] = xr[2 * i + 1];
      }
    }
#pragma unroll
    for (int b = 0; b < MOE_E4M3_BATCH; ++b) {
      if (i0 + 32 * b >= n16) break;
      dot16_e4m3(gv[b], xv[b][0], xv[b][1], ag);
      dot16_e4m3(uv[b], xv[b][0], xv[b][1], au);
    }
  }
  ag = warp_sum(ag) * sg;
  au = warp_sum(au) * su;
  if (lane == 0) {
    const float a = GELU ? gelu_tanh(ag) : ag / (1.f + expf(-ag));
    act[(size_t)s * width + r] = to_bf16(a * au);
  }
}

extern "C" __global__ void moe_gate_up_silu_e4m3(const bf16* x, const uint8_t* gate, const uint8_t* up,
                                                 const float* gate_scales, const float* up_scales, const int* ids,
                                                 int k, int hidden, int width, bf16* act) {
  moe_gate_up_e4m3<false>(x, gate, up, gate_scales, up_scales, ids, k, hidden, width, act);
}

extern "C" __global__ void moe_gate_up_gelu_tanh_e4m3(const bf16* x, const uint8_t* gate, const uint8_t* up,
                                                      const float* gate_scales, const float* up_scales,
                                                      const int* ids, int k, int hidden, int width, bf16* act) {
  moe_gate_up_e4m3<true>(x, gate, up, gate_scales, up_scales, ids, k, hidden, width, act);
}

extern "C" __global__ void moe_gate_up_silu(const bf16* x, const bf16* gate, const bf16* up, const int* ids, int k,
                                            int hidden, int width, bf16* act) {
  moe_gate_up_rows<false>(x, gate, up, ids, k, hidden, width, act);
}

extern "C" __global__ void moe_gate_up_gelu_tanh(const bf16* x, const bf16* gate, const bf16* up, const int* ids,
                                                 int k, int hidden, int width, bf16* act) {
  moe_gate_up_rows<true>(x, gate, up, ids, k, hidden, width, act);
}

// A down sum's last step: residual[t, r] += out (lane 0 of row r's warp).
// With sumsq (decode, tokens <= SUMSQ_ROWS) the block also leaves its part
// of the updated row's sum of squares for the next RMSNorm, fused into the
// GEMV that consumes it (as gemv_sumsq: partial[t][blockIdx.y], fixed
// order), and with next_norm the norm's pre-scaled input xg = bf16(v ⊙ g).
// Every thread of the block calls it.
__device__ __forceinline__ void moe_add_residual(float out, int t, int r, int hidden, float* __restrict__ residual,
                                                 SumSq* __restrict__ sumsq, const float* __restrict__ next_norm,
                                                 bf16* __restrict__ xg) {
  __shared__ float s_sq[MOE_WARPS];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  float sq = 0.f;
  if (lane == 0 && r < hidden) {
    const size_t o = (size_t)t * hidden + r;
    const float v = residual[o] + out;
    residual[o] = v;
    sq = v * v;
    if (next_norm) xg[o] = to_bf16(v * next_norm[r]);
  }
  if (!sumsq) return;
  if (lane == 0) s_sq[warp] = sq;
  __syncthreads();
  if (threadIdx.x == 0) {
    float total = 0.f;
#pragma unroll
    for (int w = 0; w < MOE_WARPS; ++w) total += s_sq[w];
    sumsq->partial[t][blockIdx.y] = total;
    if (t == 0 && blockIdx.y == 0) sumsq->blocks = gridDim.y;
  }
}

// A lane's weight chunks base + lane + 32 b (b < G) of row r of its token's
// slots' experts, in the down sums' one list of k slots' nc chunks each
// (slot j's expert by shuffle from lane j): every lane must call it.
// Streaming loads (ld.global.cs, as the dense GEMVs' weights), in the
// one-token expert kernels as here: the read-only path they compiled to
// before (ld.global.nc, from the const __restrict__ pointers) measured
// slower end to end (H200, Qwen3-30B-A3B batch 1, alternated twice in one
// call: the bf16 down sum 336.5 -> 344.4 tok/s, gate/up -> 341.5, with the
// whole-row o_proj 359.2; FP8 433.5 -> 453.5; plain ld.global and
// .L1::no_allocate as .cs in the down sum, plain ld.global as .nc in gate/up).
template <int G>
__device__ __forceinline__ void moe_down_chunks(const uint4* w, int my_e, int k, int hidden, int r, int nc, int base,
                                                uint4 (&dst)[G]) {
  const int total = k * nc;
#pragma unroll
  for (int b = 0; b < G; ++b) {
    const int f = base + (int)(threadIdx.x & 31) + 32 * b, j = min(f / nc, k - 1);
    const int e = __shfl_sync(0xffffffffu, my_e, j);
    if (f < total && r < hidden) dst[b] = __ldcs(w + ((size_t)e * hidden + r) * nc + (f - j * nc));
  }
}

// One round of an e4m3 down sum: out += slot scale x (16 weights · their
// activations) for a lane's chunks base + lane + 32 b in flight (every lane
// calls it: the scales come by shuffle from lane j of slot j).
__device__ __forceinline__ void moe_e4m3_round(const uint4 (&wv)[MOE_E4M3_BATCH],
                                               const uint4 (&av)[MOE_E4M3_BATCH][2], float my_scale, int base,
                                               int total, int n16, int k, bool row, float& out) {
#pragma unroll
  for (int b = 0; b < MOE_E4M3_BATCH; ++b) {
    const int f = base + (int)(threadIdx.x & 31) + 32 * b;
    const float sc = __shfl_sync(0xffffffffu, my_scale, min(f / n16, k - 1));
    if (f >= total || !row) continue;
    float dot = 0.f;
    dot16_e4m3(wv[b], av[b][0], av[b][1], dot);
    out = fmaf(sc, dot, out);
  }
}

// One-token steps (the `_b1` kernels; moe_down_sum below for more):
// residual[t, r] += Σ_j weights[t * k + j] · (down_e[r] · act[t * k + j]),
// e = ids[t * k + j]: each expert's down projection and the weighted sum,
// added to the f32 residual stream. The k rows' chunks form one list, slot
// after slot, and a lane takes every 32nd; it sums its chunks weighted, in
// slot (ascending expert) order, then the warp sums the lanes: the order is
// fixed whatever the batch. The slots' experts and weights come from
// moe_route, two kernels back: it completed before moe_gate_up's wait
// returned, hence before this kernel's blocks could start, so they are read
// (from L2) before the wait, and so are a lane's first weight chunks; only
// the activations come from the kernel before. sumsq, next_norm, xg: see
// moe_add_residual (null: none).
// Grid: (tokens, ceil(hidden / MOE_WARPS)); MOE_WARPS warps, a row each.
// width must be a multiple of 8 (16 for e4m3).
//
// bf16: the token's k activation rows are staged in shared memory (k *
// width bf16, the launch's dynamic shared memory) and a lane loads
// MOE_DOWN_GROUP weight chunks at once: at batch 1 the kernel's warps are
// 15.5 an SM, too few to cover DRAM latency with the two or three loads
// each that registers allowed when the activations were loaded beside the
// weights (H200, Qwen3-30B-A3B batch 1: in the decode graph the down sum
// took 11.7 µs a layer for its 25 MB; 316.5 -> 329.2 tok/s in the
// experiment build).
#define MOE_DOWN_GROUP 24
extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS, 2)
    moe_down_sum_b1(const bf16* __restrict__ act, const bf16* __restrict__ down, const int* __restrict__ ids,
                    const float* __restrict__ weights, int k, int hidden, int width, float* __restrict__ residual,
                    SumSq* sumsq, const float* next_norm, bf16* xg) {
  extern __shared__ __align__(16) unsigned char moe_act_smem[];
  uint4* s_act = reinterpret_cast<uint4*>(moe_act_smem);
  const int t = blockIdx.x, lane = threadIdx.x & 31;
  const int r = blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
  const int n8 = width / 8, total = k * n8;
  const uint4* w = reinterpret_cast<const uint4*>(down);
  const int my_e = lane < k ? __ldcg(ids + t * k + lane) : 0;
  const float my_w = lane < k ? __ldcg(weights + t * k + lane) : 0.f;
  uint4 wv[MOE_DOWN_GROUP];
  moe_down_chunks(w, my_e, k, hidden, r, n8, 0, wv);
  pdl_begin();
  const uint4* a = reinterpret_cast<const uint4*>(act + (size_t)t * k * width);
  for (int i = threadIdx.x; i < total; i += blockDim.x) s_act[i] = a[i];
  __syncthreads();
  float out = 0.f;
  for (int base = 0;;) {
#pragma unroll
    for (int b = 0; b < MOE_DOWN_GROUP; ++b) {
      const int f = base + lane + 32 * b;
      const float wj = __shfl_sync(0xffffffffu, my_w, min(f / n8, k - 1));
      if (f < total && r < hidden) out = fmaf(wj, moe_dot8(wv[b], s_act[f]), out);
    }
    base += 32 * MOE_DOWN_GROUP;
    if (base >= total) break;
    moe_down_chunks(w, my_e, k, hidden, r, n8, base, wv);
  }
  out = warp_sum(out);
  moe_add_residual(out, t, r, hidden, residual, sumsq, next_norm, xg);
}

// e4m3 (16 weights a chunk), each slot's weight folded into its expert's
// row scale: the first MOE_E4M3_BATCH chunks of weights load before the
// wait, then rounds of MOE_E4M3_BATCH weights and their activations (from
// global memory: staging them in shared memory with 12 chunks in flight
// measured slower here, 419.3 against 426.8 tok/s). The first round apart
// from the rest, as written here, measured 1.2 % faster end to end than
// one loop loading each round's weights after the last round's math.
extern "C" __global__ void __launch_bounds__(32 * MOE_WARPS, 2)
    moe_down_sum_e4m3_b1(const bf16* __restrict__ act, const uint8_t* __restrict__ down,
                         const float* __restrict__ down_scales, const int* __restrict__ ids,
                         const float* __restrict__ weights, int k, int hidden, int width,
                         float* __restrict__ residual, SumSq* sumsq, const float* next_norm, bf16* xg) {
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int r = blockIdx.y * MOE_WARPS + warp;
  const int my_e = lane < k ? __ldcg(ids + t * k + lane) : 0;
  float my_scale = 0.f;
  if (lane < k && r < hidden) my_scale = __ldcg(weights + t * k + lane) * down_scales[(size_t)my_e * hidden + r];
  const int n16 = width / 16, total = k * n16;
  const uint4* w = reinterpret_cast<const uint4*>(down);
  uint4 wv[MOE_E4M3_BATCH];
  moe_down_chunks(w, my_e, k, hidden, r, n16, 0, wv);
  pdl_begin();
  const uint4* a = reinterpret_cast<const uint4*>(act + (size_t)t * k * width);
  float out = 0.f;
  // The first round (its weights loaded before the wait), then rounds of
  // weights and activations in flight together; warps past the last row
  // stop after the first (the shuffles need every lane).
  {
    uint4 av[MOE_E4M3_BATCH][2];
#pragma unroll
    for (int b = 0; b < MOE_E4M3_BATCH; ++b) {
      const int f = lane + 32 * b;
      if (f < total && r < hidden) {
        av[b][0] = a[2 * f];
        av[b][1] = a[2 * f + 1];
      }
    }
    moe_e4m3_round(wv, av, my_scale, 0, total, n16, k, r < hidden, out);
  }
  for (int base = 32 * MOE_E4M3_BATCH; r < hidden && base < total; base += 32 * MOE_E4M3_BATCH) {
    uint4 wb[MOE_E4M3_BATCH], ab[MOE_E4M3_BATCH][2];
#pragma unroll
    for (int b = 0; b < MOE_E4M3_BATCH; ++b) {
      const int f = base + lane + 32 * b, j = min(f / n16, k - 1);
      const int e = __shfl_sync(0xffffffffu, my_e, j);
      if (f < total) {
        wb[b] = __ldcs(w + ((size_t)e * hidden + r) * n16 + (f - j * n16));
        ab[b][0] = a[2 * f];
        ab[b][1] = a[2 * f + 1];
      }
    }
    moe_e4m3_round(wb, ab, my_scale, base, total, n16, k, true, out);
  }
  out = warp_sum(out);
  moe_add_residual(out, t, r, hidden, residual, sumsq, next_norm, xg);
}

// Steps of several tokens (2 to moe_grouped_min_tokens - 1): the sum of
// moe_down_sum_b1 above, in the same order (the same bits), with the
// activations read from global memory beside the weights and everything
// after the wait: with several tokens there are warps enough in flight.
// sumsq, next_norm, xg: see moe_add_residual (null: none).
// Grid: (tokens, ceil(hidden / MOE_WARPS)); MOE_WARPS warps, a row each.
// width must be a multiple of 8.
extern "C" __global__ void moe_down_sum(const bf16* __restrict__ act, const bf16* __restrict__ down,
                                        const int* __restrict__ ids, const float* __restrict__ weights, int k,
                                        int hidden, int width, float* __restrict__ residual, SumSq* sumsq,
                                        const float* next_norm, bf16* xg) {
  pdl_begin();
  __shared__ int expert[MOE_MAX_TOP_K];
  __shared__ float weight[MOE_MAX_TOP_K];
  const int t = blockIdx.x;
  if (threadIdx.x < k) {
    expert[threadIdx.x] = ids[t * k + threadIdx.x];
    weight[threadIdx.x] = weights[t * k + threadIdx.x];
  }
  __syncthreads();
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
  const int n8 = width / 8;
  const uint4* a = reinterpret_cast<const uint4*>(act + (size_t)t * k * width);
  const uint4* w = reinterpret_cast<const uint4*>(down);
  float out = 0.f;
  if (r < hidden) {
#pragma unroll 8
    for (int f = lane; f < k * n8; f += 32) {
      const int j = f / n8;
      const size_t row = (size_t)expert[j] * hidden + r;
      out = fmaf(weight[j], moe_dot8(w[row * n8 + (f - j * n8)], a[f]), out);
    }
  }
  out = warp_sum(out);
  moe_add_residual(out, t, r, hidden, residual, sumsq, next_norm, xg);
}

// moe_down_sum over e4m3 rows (16 weights a chunk), each slot's weight
// folded into its expert's row scale. width % 16 == 0.
extern "C" __global__ void moe_down_sum_e4m3(const bf16* __restrict__ act, const uint8_t* __restrict__ down,
                                             const float* __restrict__ down_scales, const int* __restrict__ ids,
                                             const float* __restrict__ weights, int k, int hidden, int width,
                                             float* __restrict__ residual, SumSq* sumsq, const float* next_norm,
                                             bf16* xg) {
  pdl_begin();
  __shared__ int expert[MOE_MAX_TOP_K];
  const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (threadIdx.x < k) expert[threadIdx.x] = ids[t * k + threadIdx.x];
  __syncthreads();
  const int r = blockIdx.y * MOE_WARPS + warp;
  // Lane j < k folds slot j's weight into its expert's row scale; the
  // lanes take it by shuffle after the first weights' loads are issued.
  float my_scale = 0.f;
  if (lane < k && r < hidden) my_scale = weights[t * k + lane] * down_scales[(size_t)expert[lane] * hidden + r];
  const int n16 = width / 16, total = k * n16;
  const uint4* a = reinterpret_cast<const uint4*>(act + (size_t)t * k * width);
  const uint4* w = reinterpret_cast<const uint4*>(down);
  float out = 0.f;
  // Warp-uniform rounds (the shuffles need every lane): the weights and
  // their activations, MOE_E4M3_BATCH of each, in flight before any math.
  for (int base = 0; r < hidden && base < total; base += 32 * MOE_E4M3_BATCH) {
    uint4 wv[MOE_E4M3_BATCH], av[MOE_E4M3_BATCH][2];
#pragma unroll
    for (int b = 0; b < MOE_E4M3_BATCH; ++b) {
      const int f = base + lane + 32 * b;
      if (f < total) {
        const int j = f / n16;
        wv[b] = w[((size_t)expert[j] * hidden + r) * n16 + (f - j * n16)];
        av[b][0] = a[2 * f];
        av[b][1] = a[2 * f + 1];
      }
    }
    moe_e4m3_round(wv, av, my_scale, base, total, n16, k, true, out);
  }
  out = warp_sum(out);
  moe_add_residual(out, t, r, hidden, residual, sumsq, next_norm, xg);
}

// ---------------------------------------------------------------------------
// Grouped expert GEMMs for prefill and large batches. The GEMVs above read
// an expert's rows once per slot routed to it; here the step's slots are
// sorted by expert (moe_align) into tiles of MOE_TILE_M slots of one expert,
// and each tile multiplies its gathered rows by the expert's weights on the
// tensor cores, so an expert is read once per tile. Every output element is
// one row's dot product over K, whatever the tile's other rows: the order
// of slots inside an expert's tiles does not change any bits.
// ---------------------------------------------------------------------------

#define MOE_TILE_M 64   // slots per tile
#define MOE_TILE_N 128  // weight rows per tile (gate/up: 64 of each)
#define MOE_TILE_K 32
#define MOE_STAGES 3
#define MOE_LD (MOE_TILE_K + 8)  // bf16 row stride: conflict-free ldmatrix
#define MOE_GEMM_THREADS 128     // 4 warps, 2 (M) x 2 (N), 32 x 64 each

// One block (1024 threads): `sorted[tiles * MOE_TILE_M]` lists the slots of
// expert 0, padded with -1 to a whole tile, then expert 1's, ...; the rest
// is -1. `tile_expert[i]` is tile i's expert, -1 for tiles past the last.
// tiles >= ceil(slots / MOE_TILE_M) + min(experts, slots).
extern "C" __global__ void moe_align(const int* __restrict__ ids, int slots, int experts, int tiles,
                                     int* __restrict__ sorted, int* __restrict__ tile_expert) {
  pdl_begin();
  __shared__ int count[MOE_MAX_EXPERTS], start[MOE_MAX_EXPERTS + 1];
  for (int e = threadIdx.x; e < experts; e += blockDim.x) count[e] = 0;
  for (int i = threadIdx.x; i < tiles * MOE_TILE_M; i += blockDim.x) sorted[i] = -1;
  __syncthreads();
  for (int s = threadIdx.x; s < slots; s += blockDim.x) atomicAdd(&count[ids[s]], 1);
  __syncthreads();
  if (threadIdx.x == 0) {
    int at = 0;
    for (int e = 0; e < experts; ++e) {
      start[e] = at;
      at += (count[e] + MOE_TILE_M - 1) / MOE_TILE_M * MOE_TILE_M;
    }
    start[experts] = at;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < tiles; i += blockDim.x) {
    // The expert whose padded range holds tile i (the last start <= it).
    const int at = i * MOE_TILE_M;
    int lo = 0, hi = experts;  // start[lo] <= at < start[hi]
    if (at >= start[experts]) {
      tile_expert[i] = -1;
      continue;
    }
    while (hi - lo > 1) {
      const int mid = (lo + hi) / 2;
      if (start[mid] <= at) lo = mid; else hi = mid;
    }
    tile_expert[i] = lo;
  }
  for (int e = threadIdx.x; e < experts; e += blockDim.x) count[e] = 0;
  __syncthreads();
  for (int s = threadIdx.x; s < slots; s += blockDim.x) {
    const int e = ids[s];
    sorted[start[e] + atomicAdd(&count[e], 1)] = s;
  }
}

// The grouped GEMM of one (tile, column block): rows are the tile's slots
// (A row = `a[(slot / a_per_row) * K]`, zeros for padding), columns are
// weight rows of expert e (`w[e]` is `[n, K]`, K contiguous).
//   GATED: act[slot, c] = act(gate_e[c] · a) * (up_e[c] · a) in bf16, for
//     the 64 columns c of the block (64 gate rows and 64 up rows staged).
//   else:  out[slot, c] = w_e[c] · a in f32, for 128 columns.
// FP8: the weights are e4m3 bytes (`w0`/`w1` then point at bytes), staged
// as they are and converted to bf16 pairs (exactly) as the B fragments are
// read; each column's sum is multiplied by its row scale (`s0`/`s1`,
// `[experts * n]`) in the epilogue.
// Grid: (n / (GATED ? 64 : 128), tiles). K must be a multiple of 32.
template <bool GATED, bool GELU, bool FP8>
__device__ __forceinline__ void moe_grouped(const bf16* __restrict__ a, int a_per_row, const void* __restrict__ w0,
                                            const void* __restrict__ w1, const float* __restrict__ s0,
                                            const float* __restrict__ s1, int n, int K,
                                            const int* __restrict__ sorted, const int* __restrict__ tile_expert,
                                            bf16* __restrict__ act, float* __restrict__ out) {
  pdl_begin();
  constexpr int BLOCK_N = GATED ? MOE_TILE_N / 2 : MOE_TILE_N;
  // A staged weight row: 32 bf16 (+8 pad), or 32 e4m3 bytes (+16 pad: the
  // 8 rows a fragment read touches fall in distinct banks).
  constexpr int W_LD = FP8 ? MOE_TILE_K + 16 : MOE_LD * 2;  // bytes
  constexpr int W_CHUNKS = MOE_TILE_N * MOE_TILE_K * (FP8 ? 1 : 2) / 16 / MOE_GEMM_THREADS;
  __shared__ alignas(16) bf16 sa[MOE_STAGES][MOE_TILE_M * MOE_LD];
  __shared__ alignas(16) unsigned char sw[MOE_STAGES][MOE_TILE_N * W_LD];
  __shared__ int rows[MOE_TILE_M];
  const int tile = blockIdx.y, e = tile_expert[tile];
  if (e < 0) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp & 1, wn = warp >> 1;
  const int c0 = blockIdx.x * BLOCK_N;
  if (tid < MOE_TILE_M) rows[tid] = sorted[tile * MOE_TILE_M + tid];
  __syncthreads();

  // This thread's pieces of every stage: 2 A rows and W_CHUNKS weight
  // chunks, 16 bytes each (a 32-wide row is 4 bf16 chunks or 2 e4m3 ones).
  const bf16* a_src[2];
  int a_bytes[2];
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    const int slot = rows[(tid + j * MOE_GEMM_THREADS) >> 2];
    a_bytes[j] = slot < 0 ? 0 : 16;
    a_src[j] = a + (slot < 0 ? 0 : (size_t)(slot / a_per_row) * K) + ((tid + j * MOE_GEMM_THREADS) & 3) * 8;
  }
  constexpr int ROW_CHUNKS = FP8 ? 2 : 4;
  constexpr int ELEM = FP8 ? 1 : 2;
  const unsigned char* w_src[W_CHUNKS];
  int w_dst[W_CHUNKS];
#pragma unroll
  for (int j = 0; j < W_CHUNKS; ++j) {
    const int idx = tid + j * MOE_GEMM_THREADS;
    const int r = idx / ROW_CHUNKS, part = idx % ROW_CHUNKS;
    const void* base = GATED && r >= BLOCK_N ? w1 : w0;
    const int c = c0 + (GATED && r >= BLOCK_N ? r - BLOCK_N : r);
    w_src[j] = static_cast<const unsigned char*>(base) + (((size_t)e * n + c) * K + part * (16 / ELEM)) * ELEM;
    w_dst[j] = r * W_LD + part * 16;
  }
  auto stage = [&](int st, int k0) {
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int idx = tid + j * MOE_GEMM_THREADS;
      cp_async_cg16_fill(&sa[st][(idx >> 2) * MOE_LD + (idx & 3) * 8], a_src[j] + k0, a_bytes[j]);
    }
#pragma unroll
    for (int j = 0; j < W_CHUNKS; ++j) cp_async_cg16(&sw[st][w_dst[j]], w_src[j] + k0 * ELEM);
  };

  // The warp's 8 column tiles of 8: GATED, 4 gate then the same 4 of up.
  auto col_tile = [&](int j) {
    return GATED ? (j < 4 ? 0 : BLOCK_N) + wn * 32 + 8 * (j & 3) : wn * 64 + 8 * j;
  };
  float acc[2][8][4] = {};
  const int k_tiles = K / MOE_TILE_K;
#pragma unroll
  for (int s = 0; s < MOE_STAGES - 1; ++s) {
    if (s < k_tiles) stage(s, s * MOE_TILE_K);
    cp_async_commit();
  }
  for (int kt = 0; kt < k_tiles; ++kt) {
    cp_async_wait<MOE_STAGES - 2>();
    __syncthreads();
    const int next = kt + MOE_STAGES - 1;
    if (next < k_tiles) stage(next % MOE_STAGES, next * MOE_TILE_K);
    cp_async_commit();
    const bf16* ta = sa[kt % MOE_STAGES];
    const unsigned char* tw = sw[kt % MOE_STAGES];
#pragma unroll
    for (int kk = 0; kk < MOE_TILE_K; kk += 16) {
      unsigned fa[2][4], fw[8][2];
#pragma unroll
      for (int i = 0; i < 2; ++i)
        ldmatrix_x4(fa[i], ta + (wm * 32 + i * 16 + (lane & 15)) * MOE_LD + kk + (lane >> 4) * 8);
      if constexpr (FP8) {
        // B fragment: column lane / 4, k pairs 2 * (lane % 4) and + 8.
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const unsigned char* p = tw + (col_tile(j) + (lane >> 2)) * W_LD + kk + 2 * (lane & 3);
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const float2 f = e4m3x2_to_float2(*reinterpret_cast<const __nv_fp8x2_storage_t*>(p + 8 * h));
            fw[j][h] = pack_bf16(f.x, f.y);
          }
        }
      } else {
#pragma unroll
        for (int p = 0; p < 4; ++p) {
          unsigned r[4];
          ldmatrix_x4(r, tw + ((col_tile(2 * p) + (lane >> 4) * 8 + (lane & 7)) * MOE_LD + kk + ((lane >> 3) & 1) * 8) * 2);
          fw[2 * p][0] = r[0];
          fw[2 * p][1] = r[1];
          fw[2 * p + 1][0] = r[2];
          fw[2 * p + 1][1] = r[3];
        }
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) mma_bf16(acc[i][j], fa[i], fw[j][0], fw[j][1]);
    }
  }
  cp_async_wait<0>();

  // A column's row scale (1 for bf16 weights).
  auto scale = [&](const float* sc, int c) { return FP8 ? sc[(size_t)e * n + c] : 1.f; };
  // C fragment: rows lane / 4 and + 8, columns 2 * (lane % 4) and + 1.
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int slot = rows[wm * 32 + i * 16 + (lane >> 2) + 8 * h];
      if (slot < 0) continue;
      if constexpr (GATED) {
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          const int c = c0 + wn * 32 + 8 * j + 2 * (lane & 3);
          const float g0 = acc[i][j][2 * h] * scale(s0, c), g1 = acc[i][j][2 * h + 1] * scale(s0, c + 1);
          const float u0 = acc[i][j + 4][2 * h] * scale(s1, c), u1 = acc[i][j + 4][2 * h + 1] * scale(s1, c + 1);
          const float a0 = GELU ? gelu_tanh(g0) : g0 / (1.f + expf(-g0));
          const float a1 = GELU ? gelu_tanh(g1) : g1 / (1.f + expf(-g1));
          *reinterpret_cast<__nv_bfloat162*>(act + (size_t)slot * n + c) = __floats2bfloat162_rn(a0 * u0, a1 * u1);
        }
      } else {
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          const int c = c0 + wn * 64 + 8 * j + 2 * (lane & 3);
          *reinterpret_cast<float2*>(out + (size_t)slot * n + c) =
              make_float2(acc[i][j][2 * h] * scale(s0, c), acc[i][j][2 * h + 1] * scale(s0, c + 1));
        }
      }
    }
}

// act[slot, :] for every slot (x: the normed `[tokens, hidden]` bf16 rows;
// slot s reads token s / k). width % 64 == 0, hidden % 32 == 0.
extern "C" __global__ void __launch_bounds__(MOE_GEMM_THREADS)
    moe_grouped_gate_up_silu(const bf16* x, int k, const bf16* gate, const bf16* up, int width, int hidden,
                             const int* sorted, const int* tile_expert, bf16* act) {
  moe_grouped<true, false, false>(x, k, gate, up, nullptr, nullptr, width, hidden, sorted, tile_expert, act, nullptr);
}

extern "C" __global__ void __launch_bounds__(MOE_GEMM_THREADS)
    moe_grouped_gate_up_gelu_tanh(const bf16* x, int k, const bf16* gate, const bf16* up, int width, int hidden,
                                  const int* sorted, const int* tile_expert, bf16* act) {
  moe_grouped<true, true, false>(x, k, gate, up, nullptr, nullptr, width, hidden, sorted, tile_expert, act, nullptr);
}

// out[slot, :] = down_e · act[slot] in f32 (per slot, unweighted).
// hidden % 128 == 0, width % 32 == 0.
extern "C" __global__ void __launch_bounds__(MOE_GEMM_THREADS)
    moe_grouped_down(const bf16* act, const bf16* down, int hidden, int width, const int* sorted,
                     const int* tile_expert, float* out) {
  moe_grouped<false, false, false>(act, 1, down, nullptr, nullptr, nullptr, hidden, width, sorted, tile_expert,
                                   nullptr, out);
}

// The same three over e4m3 experts, with their row scales.
extern "C" __global__ void __launch_bounds__(MOE_GEMM_THREADS)
    moe_grouped_gate_up_silu_e4m3(const bf16* x, int k, const uint8_t* gate, const uint8_t* up,
                                  const float* gate_scales, const float* up_scales, int width, int hidden,
                                  const int* sorted, const int* tile_expert, bf16* act) {
  moe_grouped<true, false, true>(x, k, gate, up, gate_scales, up_scales, width, hidden, sorted, tile_expert, act,
                                 nullptr);
}

extern "C" __global__ void __launch_bounds__(MOE_GEMM_THREADS)
    moe_grouped_gate_up_gelu_tanh_e4m3(const bf16* x, int k, const uint8_t* gate, const uint8_t* up,
                                       const float* gate_scales, const float* up_scales, int width, int hidden,
                                       const int* sorted, const int* tile_expert, bf16* act) {
  moe_grouped<true, true, true>(x, k, gate, up, gate_scales, up_scales, width, hidden, sorted, tile_expert, act,
                                nullptr);
}

extern "C" __global__ void __launch_bounds__(MOE_GEMM_THREADS)
    moe_grouped_down_e4m3(const bf16* act, const uint8_t* down, const float* down_scales, int hidden, int width,
                          const int* sorted, const int* tile_expert, float* out) {
  moe_grouped<false, false, true>(act, 1, down, nullptr, down_scales, nullptr, hidden, width, sorted, tile_expert,
                                  nullptr, out);
}

// residual[t, :] += Σ_j weights[t * k + j] · out[t * k + j, :], j ascending.
// Grid: tokens; hidden % 4 == 0.
extern "C" __global__ void moe_weighted_sum(const float* __restrict__ out, const float* __restrict__ weights, int k,
                                            int hidden, float* __restrict__ residual) {
  pdl_begin();
  const int t = blockIdx.x;
  float* r = residual + (size_t)t * hidden;
  for (int c = 4 * threadIdx.x; c < hidden; c += 4 * blockDim.x) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int j = 0; j < k; ++j) {
      const float w = weights[t * k + j];
      const float4 v = *reinterpret_cast<const float4*>(out + ((size_t)t * k + j) * hidden + c);
      sum.x = fmaf(w, v.x, sum.x);
      sum.y = fmaf(w, v.y, sum.y);
      sum.z = fmaf(w, v.z, sum.z);
      sum.w = fmaf(w, v.w, sum.w);
    }
    float4 cur = *reinterpret_cast<const float4*>(r + c);
    cur.x += sum.x;
    cur.y += sum.y;
    cur.z += sum.z;
    cur.w += sum.w;
    *reinterpret_cast<float4*>(r + c) = cur;
  }
}
