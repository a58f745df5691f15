// After the fused q/k/v projection: bias (Qwen2), per-head RMSNorm of q and k
// (Qwen3), rotary embedding in the rotate-half layout, and the write of k and
// v into their paged KV-cache slots, in one pass.
#include "common.cuh"
#include "kv_types.cuh"

// Grid: (tokens, ceil((num_heads + 2 * num_kv_heads) / ROPE_WARPS)); block:
// 32 * ROPE_WARPS. Warp w owns head blockIdx.y * ROPE_WARPS + w, lane l the
// rotated pairs (i, i + head_dim / 2) for i = l, l + 32, ... (head_dim <=
// 256). One block per token and 8 heads, not per head: a prompt's tokens
// are many, and 64-thread blocks left the kernel bound by block launches.
//   qkv:      [tokens, (H + 2 KVH) * hd] bf16, the projection output
//   bias:     [(H + 2 KVH) * hd] f32 or null
//   q_norm/k_norm: [hd] f32 or null
//   cos/sin:  [max_position, hd / 2] f32 (all rope scalings are baked in)
//   slots:    [tokens] cache slot (block * block_size + offset)
//   q_out:    [tokens, H * hd] bf16
//   k/v cache: [blocks, KVH, block_size, hd] of KV: bf16 (rope_qkv) or FP8
//             e4m3 (rope_qkv_fp8; kv_types.cuh), see kv_index
constexpr int ROPE_WARPS = 8;
constexpr int ROPE_PAIRS = 4;  // per lane: head_dim / 2 / 32 at most

template <typename KV>
__device__ __forceinline__ void rope_qkv_into(const bf16* __restrict__ qkv, const float* __restrict__ bias,
                                              const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                              const int* __restrict__ positions, const long long* __restrict__ slots,
                                              const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                              bf16* __restrict__ q_out, KV* __restrict__ k_cache,
                                              KV* __restrict__ v_cache, int num_heads, int num_kv_heads, int hd,
                                              float eps, int block_size) {
  pdl_begin();
  const int t = blockIdx.x, lane = threadIdx.x & 31, half = hd / 2;
  const int h = blockIdx.y * ROPE_WARPS + (threadIdx.x >> 5);
  if (h >= num_heads + 2 * num_kv_heads) return;  // whole warps; no block-wide sync below
  const int qd = num_heads * hd, kvd = num_kv_heads * hd;
  const bf16* row = qkv + (size_t)t * (qd + 2 * kvd);
  int kind, col;  // 0: q, 1: k, 2: v
  if (h < num_heads) {
    kind = 0;
    col = h * hd;
  } else if (h < num_heads + num_kv_heads) {
    kind = 1;
    col = qd + (h - num_heads) * hd;
  } else {
    kind = 2;
    col = qd + kvd + (h - num_heads - num_kv_heads) * hd;
  }
  float a[ROPE_PAIRS], b[ROPE_PAIRS];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < ROPE_PAIRS; ++k) {
    const int i = lane + 32 * k;
    a[k] = b[k] = 0.f;
    if (i >= half) continue;
    a[k] = to_f32(row[col + i]);
    b[k] = to_f32(row[col + i + half]);
    if (bias) {
      a[k] += bias[col + i];
      b[k] += bias[col + i + half];
    }
    ss += a[k] * a[k] + b[k] * b[k];
  }
  const long long slot = slots[t];
  const long long block = slot / block_size;
  const int offset = (int)(slot % block_size);
  if (kind == 2) {
    KV* v = v_cache + kv_index(block, (col - qd - kvd) / hd, offset, num_kv_heads, block_size, hd);
#pragma unroll
    for (int k = 0; k < ROPE_PAIRS; ++k) {
      const int i = lane + 32 * k;
      if (i >= half) continue;
      store_kv(v + i, a[k]);
      store_kv(v + i + half, b[k]);
    }
    return;
  }
  float inv = 1.f;
  const float* w = kind == 0 ? q_norm : k_norm;
  if (q_norm) inv = rsqrtf(warp_sum(ss) / hd + eps);
  bf16* q_dst = q_out + (size_t)t * qd + col;
  KV* k_dst = kind == 1 ? k_cache + kv_index(block, (col - qd) / hd, offset, num_kv_heads, block_size, hd) : nullptr;
  const float* cs = cos_t + (size_t)positions[t] * half;
  const float* sn = sin_t + (size_t)positions[t] * half;
#pragma unroll
  for (int k = 0; k < ROPE_PAIRS; ++k) {
    const int i = lane + 32 * k;
    if (i >= half) continue;
    float x = a[k], y = b[k];
    if (q_norm) {
      x *= inv * w[i];
      y *= inv * w[i + half];
    }
    const float c = cs[i], s = sn[i];
    const float lo = x * c - y * s, hi = y * c + x * s;
    if (kind == 0) {
      q_dst[i] = to_bf16(lo);
      q_dst[i + half] = to_bf16(hi);
    } else {
      store_kv(k_dst + i, lo);
      store_kv(k_dst + i + half, hi);
    }
  }
}

#define ROPE_QKV_KERNEL(NAME, KV)                                                                                 \
  extern "C" __global__ void __launch_bounds__(ROPE_WARPS * 32)                                                   \
      NAME(const bf16* qkv, const float* bias, const float* q_norm, const float* k_norm, const int* positions,    \
           const long long* slots, const float* cos_t, const float* sin_t, bf16* q_out, KV* k_cache, KV* v_cache, \
           int num_heads, int num_kv_heads, int hd, float eps, int block_size) {                                  \
    rope_qkv_into<KV>(qkv, bias, q_norm, k_norm, positions, slots, cos_t, sin_t, q_out, k_cache, v_cache,         \
                      num_heads, num_kv_heads, hd, eps, block_size);                                              \
  }
ROPE_QKV_KERNEL(rope_qkv, bf16)
ROPE_QKV_KERNEL(rope_qkv_fp8, fp8)
