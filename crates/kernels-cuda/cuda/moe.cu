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
#include "common.cuh"

#define MOE_MAX_TOP_K 16
#define MOE_MAX_EXPERTS 256
#define MOE_WARPS 8

// logits[t, e] = (x[t] / rms(x[t]) ⊙ norm) · router[e] in f32, from the f32
// residual: the expert choice is made before any bf16 rounding of the normed
// row (as the CPU's exact path makes it), so near-ties are decided as there.
// Grid: (tokens, ceil(experts / MOE_WARPS)); MOE_WARPS warps, an expert
// each. hidden must be a multiple of 8.
extern "C" __global__ void moe_router(const float* __restrict__ x, const float* __restrict__ norm,
                                      const bf16* __restrict__ router, int hidden, float eps, int experts,
                                      float* __restrict__ logits) {
  pdl_begin();
  const int t = blockIdx.x, lane = threadIdx.x & 31;
  const float* xr = x + (size_t)t * hidden;
  float ss = 0.f;
  for (int i = 4 * threadIdx.x; i < hidden; i += 4 * blockDim.x) {
    const float4 v = *reinterpret_cast<const float4*>(xr + i);
    ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
  }
  const float inv = rsqrtf(block_sum(ss) / hidden + eps);
  const int e = blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
  if (e >= experts) return;
  const bf16* w = router + (size_t)e * hidden;
  float acc = 0.f;
#pragma unroll 4
  for (int i = 8 * lane; i < hidden; i += 256) {
    const uint4 wv = *reinterpret_cast<const uint4*>(w + i);
    const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&wv);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const float4 xv = *reinterpret_cast<const float4*>(xr + i + 4 * h);
      const float4 g = *reinterpret_cast<const float4*>(norm + i + 4 * h);
      const float2 a = __bfloat1622float2(w2[2 * h]), b = __bfloat1622float2(w2[2 * h + 1]);
      acc = fmaf(xv.x * g.x, a.x, acc);
      acc = fmaf(xv.y * g.y, a.y, acc);
      acc = fmaf(xv.z * g.z, b.x, acc);
      acc = fmaf(xv.w * g.w, b.y, acc);
    }
  }
  acc = warp_sum(acc);
  if (lane == 0) logits[(size_t)t * experts + e] = acc * inv;
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

// act[s, r] = act(gate_e[r] · x[t]) * (up_e[r] · x[t]) for slot s = t * k + j
// and e = ids[s]; x is the normed `[tokens, hidden]` bf16 input.
// Grid: (tokens * k, ceil(width / MOE_WARPS)); MOE_WARPS warps, a row each.
// hidden must be a multiple of 8.
template <bool GELU>
__device__ __forceinline__ void moe_gate_up(const bf16* __restrict__ x, const bf16* __restrict__ gate,
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
#pragma unroll 4
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

extern "C" __global__ void moe_gate_up_silu(const bf16* x, const bf16* gate, const bf16* up, const int* ids, int k,
                                            int hidden, int width, bf16* act) {
  moe_gate_up<false>(x, gate, up, ids, k, hidden, width, act);
}

extern "C" __global__ void moe_gate_up_gelu_tanh(const bf16* x, const bf16* gate, const bf16* up, const int* ids,
                                                 int k, int hidden, int width, bf16* act) {
  moe_gate_up<true>(x, gate, up, ids, k, hidden, width, act);
}

// residual[t, r] += Σ_j weights[t * k + j] · (down_e[r] · act[t * k + j]),
// e = ids[t * k + j]: each expert's down projection and the weighted sum,
// added to the f32 residual stream. A lane sums its chunks of every slot,
// weighted, in ascending expert order, then the warp sums the lanes: the
// loads of all k experts' rows are in flight together, and the order is
// fixed whatever the batch.
// Grid: (tokens, ceil(hidden / MOE_WARPS)); MOE_WARPS warps, a row each.
// width must be a multiple of 8.
extern "C" __global__ void moe_down_sum(const bf16* __restrict__ act, const bf16* __restrict__ down,
                                        const int* __restrict__ ids, const float* __restrict__ weights, int k,
                                        int hidden, int width, float* __restrict__ residual) {
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const int r = blockIdx.y * MOE_WARPS + (threadIdx.x >> 5);
  const int t = blockIdx.x;
  if (r >= hidden) return;
  float out = 0.f;
  for (int j = 0; j < k; ++j) {
    const int s = t * k + j;
    const uint4* w = reinterpret_cast<const uint4*>(down + ((size_t)ids[s] * hidden + r) * width);
    const uint4* a = reinterpret_cast<const uint4*>(act + (size_t)s * width);
    const float weight = weights[s];
#pragma unroll 4
    for (int i = lane; i < width / 8; i += 32) out = fmaf(weight, moe_dot8(w[i], a[i]), out);
  }
  out = warp_sum(out);
  if (lane == 0) residual[(size_t)t * hidden + r] += out;
}
