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
#define MOE_WARPS 8

// One thread per token: `ids[t * k + j]` and `weights[t * k + j]` for its k
// experts (the largest logits, ties to the lower index), weighted by their
// softmax probabilities over all `experts` logits (divided by their sum when
// `normalize`), written in ascending expert order.
extern "C" __global__ void moe_route(const float* __restrict__ logits, int tokens, int experts, int k, int normalize,
                                     int* __restrict__ ids, float* __restrict__ weights) {
  pdl_begin();
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= tokens) return;
  const float* l = logits + (size_t)t * experts;
  float max = l[0];
  for (int e = 1; e < experts; ++e) max = fmaxf(max, l[e]);
  float total = 0.f;
  for (int e = 0; e < experts; ++e) total += expf(l[e] - max);
  int top[MOE_MAX_TOP_K];
  float w[MOE_MAX_TOP_K];
  float sum = 0.f;
  for (int j = 0; j < k; ++j) {
    int best = -1;
    float value = 0.f;
    for (int e = 0; e < experts; ++e) {
      bool taken = false;
      for (int i = 0; i < j; ++i) taken |= top[i] == e;
      if (!taken && (best < 0 || l[e] > value)) {
        best = e;
        value = l[e];
      }
    }
    top[j] = best;
    w[j] = expf(value - max) / total;
    sum += w[j];
  }
  // Ascending expert order (insertion sort of k pairs).
  for (int j = 1; j < k; ++j) {
    const int id = top[j];
    const float wj = w[j];
    int i = j - 1;
    for (; i >= 0 && top[i] > id; --i) {
      top[i + 1] = top[i];
      w[i + 1] = w[i];
    }
    top[i + 1] = id;
    w[i + 1] = wj;
  }
  for (int j = 0; j < k; ++j) {
    ids[t * k + j] = top[j];
    weights[t * k + j] = normalize ? w[j] / sum : w[j];
  }
}

// Dot products of 8 bf16 pairs (16-byte chunks), accumulated in f32.
__device__ __forceinline__ float moe_dot8(uint4 a, uint4 b) {
  const __nv_bfloat162* a2 = reinterpret_cast<const __nv_bfloat162*>(&a);
  const __nv_bfloat162* b2 = reinterpret_cast<const __nv_bfloat162*>(&b);
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 x = __bfloat1622float2(a2[i]);
    const float2 y = __bfloat1622float2(b2[i]);
    acc = fmaf(x.x, y.x, acc);
    acc = fmaf(x.y, y.y, acc);
  }
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
// j ascending (e = ids[t * k + j]): each expert's down projection and the
// weighted sum, added to the f32 residual stream.
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
    float acc = 0.f;
    for (int i = lane; i < width / 8; i += 32) acc += moe_dot8(w[i], a[i]);
    out += weights[s] * warp_sum(acc);
  }
  if (lane == 0) residual[(size_t)t * hidden + r] += out;
}
