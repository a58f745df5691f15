// After the fused q/k/v projection: bias (Qwen2), per-head RMSNorm of q and k
// (Qwen3), rotary embedding in the rotate-half layout, and the write of k and
// v into their paged KV-cache slots, in one pass.
#include "common.cuh"

// Grid: (tokens, num_heads + 2 * num_kv_heads); block: head_dim / 2 rounded up
// to a multiple of 32. Thread i owns the rotated pair (i, i + head_dim / 2).
//   qkv:      [tokens, (H + 2 KVH) * hd] bf16, the projection output
//   bias:     [(H + 2 KVH) * hd] f32 or null
//   q_norm/k_norm: [hd] f32 or null
//   cos/sin:  [max_position, hd / 2] f32 (all rope scalings are baked in)
//   slots:    [tokens] cache slot (block * block_size + offset)
//   q_out:    [tokens, H * hd] bf16
//   k/v cache: [blocks, KVH, block_size, hd] bf16 (see kv_index)
extern "C" __global__ void rope_qkv(const bf16* __restrict__ qkv, const float* __restrict__ bias,
                                    const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                    const int* __restrict__ positions, const long long* __restrict__ slots,
                                    const float* __restrict__ cos_t, const float* __restrict__ sin_t,
                                    bf16* __restrict__ q_out, bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                    int num_heads, int num_kv_heads, int hd, float eps, int block_size) {
  pdl_begin();
  const int t = blockIdx.x, h = blockIdx.y, i = threadIdx.x, half = hd / 2;
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
  const bool active = i < half;
  float a = 0.f, b = 0.f;
  if (active) {
    a = to_f32(row[col + i]);
    b = to_f32(row[col + i + half]);
    if (bias) {
      a += bias[col + i];
      b += bias[col + i + half];
    }
  }
  const long long slot = slots[t];
  const long long block = slot / block_size;
  const int offset = (int)(slot % block_size);
  if (kind == 2) {  // uniform across the block: no thread reaches block_sum below
    if (active) {
      bf16* v = v_cache + kv_index(block, (col - qd - kvd) / hd, offset, num_kv_heads, block_size, hd);
      v[i] = to_bf16(a);
      v[i + half] = to_bf16(b);
    }
    return;
  }
  if (q_norm) {
    const float* w = kind == 0 ? q_norm : k_norm;
    const float inv = rsqrtf(block_sum(a * a + b * b) / hd + eps);
    if (active) {
      a *= inv * w[i];
      b *= inv * w[i + half];
    }
  }
  if (!active) return;
  const size_t p = (size_t)positions[t] * half + i;
  const float c = cos_t[p], s = sin_t[p];
  const float ra = a * c - b * s, rb = b * c + a * s;
  bf16* dst = kind == 0 ? q_out + (size_t)t * qd + col
                        : k_cache + kv_index(block, (col - qd) / hd, offset, num_kv_heads, block_size, hd);
  dst[i] = to_bf16(ra);
  dst[i + half] = to_bf16(rb);
}
