// The BERT-family encoder's kernels (runner-cuda/src/encoder.rs): f32
// activations with an f16 copy of every GEMM input (cuBLASLt f16 x f16 with
// f32 accumulation), sequences packed back to back without padding.
#include "common.cuh"
#include <cuda_fp16.h>

// out[t] = table[ids[t]] (accumulate = 0) or out[t] += table[ids[t]].
// One block per row.
extern "C" __global__ void enc_gather_add(const unsigned* __restrict__ ids, const float* __restrict__ table,
                                          float* __restrict__ out, int width, int accumulate) {
  pdl_begin();
  const size_t t = blockIdx.x;
  const float* src = table + (size_t)ids[t] * width;
  float* dst = out + t * width;
  for (int i = threadIdx.x; i < width; i += blockDim.x) dst[i] = accumulate ? dst[i] + src[i] : src[i];
}

// y[r] += bias, one block per row.
extern "C" __global__ void enc_add_bias(float* __restrict__ y, const float* __restrict__ bias, int width) {
  pdl_begin();
  float* row = y + (size_t)blockIdx.x * width;
  for (int i = threadIdx.x; i < width; i += blockDim.x) row[i] += bias[i];
}

// x[r] = LayerNorm(x[r] + residual[r]) * g + b (residual may be null), and
// xh[r] = half(x[r]) for the next GEMM. One block per row; two passes over
// the row (mean, then variance of the centred values) as torch does.
extern "C" __global__ void enc_add_layer_norm(float* __restrict__ x, const float* __restrict__ residual,
                                              const float* __restrict__ g, const float* __restrict__ b,
                                              __half* __restrict__ xh, int width, float eps) {
  pdl_begin();
  const size_t off = (size_t)blockIdx.x * width;
  float* row = x + off;
  float sum = 0.f;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    float v = row[i];
    if (residual != nullptr) v += residual[off + i];
    row[i] = v;
    sum += v;
  }
  const float mean = block_sum(sum) / width;
  float sq = 0.f;
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    const float d = row[i] - mean;
    sq += d * d;
  }
  const float inv = rsqrtf(block_sum(sq) / width + eps);
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    const float v = (row[i] - mean) * inv * g[i] + b[i];
    row[i] = v;
    xh[off + i] = __float2half_rn(v);
  }
}

// x = GELU(x) in the exact erf form, and xh = half(x).
extern "C" __global__ void enc_gelu(float* __restrict__ x, __half* __restrict__ xh, long long n) {
  pdl_begin();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const float v = x[i];
    const float y = 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    x[i] = y;
    xh[i] = __float2half_rn(y);
  }
}

// xh = half(x).
extern "C" __global__ void enc_to_half(const float* __restrict__ x, __half* __restrict__ xh, long long n) {
  pdl_begin();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    xh[i] = __float2half_rn(x[i]);
}

// Bidirectional attention of each token over its own sequence. One warp per
// (token, head): lanes take 32 keys at a time (lane j scores key j against
// the whole query, held in every lane's registers), an online softmax
// carries the running maximum and sum, and each lane accumulates HD / 32
// output dimensions. qkv rows are [q | k | v], heads * HD each; seq_start
// and seq_len give every token its sequence's first token and length.
template <int HD>
__device__ __forceinline__ void encoder_attention(const float* __restrict__ qkv, float* __restrict__ out,
                                                  __half* __restrict__ outh, const int* __restrict__ seq_start,
                                                  const int* __restrict__ seq_len, int tokens, int heads,
                                                  float scale) {
  constexpr int PER_LANE = HD / 32;
  pdl_begin();
  const int lane = threadIdx.x & 31;
  const long long w = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (w >= (long long)tokens * heads) return;
  const int t = (int)(w / heads), head = (int)(w % heads);
  const int h = heads * HD, stride = 3 * h;
  const int start = seq_start[t], len = seq_len[t];
  float q[HD];
  const float* qrow = qkv + (size_t)t * stride + head * HD;
#pragma unroll
  for (int d = 0; d < HD; d += 4) {
    const float4 v = *reinterpret_cast<const float4*>(qrow + d);
    q[d] = v.x * scale, q[d + 1] = v.y * scale, q[d + 2] = v.z * scale, q[d + 3] = v.w * scale;
  }
  float acc[PER_LANE];
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) acc[i] = 0.f;
  float running_max = -INFINITY, total = 0.f;
  for (int c = 0; c < len; c += 32) {
    const int j = c + lane;
    float s = -INFINITY;
    if (j < len) {
      const float* k = qkv + (size_t)(start + j) * stride + h + head * HD;
      s = 0.f;
#pragma unroll
      for (int d = 0; d < HD; d += 4) {
        const float4 v = *reinterpret_cast<const float4*>(k + d);
        s += q[d] * v.x + q[d + 1] * v.y + q[d + 2] * v.z + q[d + 3] * v.w;
      }
    }
    const float new_max = fmaxf(running_max, warp_max(s));
    const float p = j < len ? __expf(s - new_max) : 0.f;
    const float rescale = __expf(running_max - new_max);
    total = total * rescale + warp_sum(p);
#pragma unroll
    for (int i = 0; i < PER_LANE; ++i) acc[i] *= rescale;
    running_max = new_max;
    const int count = min(32, len - c);
    for (int jj = 0; jj < count; ++jj) {
      const float pj = __shfl_sync(0xffffffffu, p, jj);
      const float* v = qkv + (size_t)(start + c + jj) * stride + 2 * h + head * HD + lane * PER_LANE;
#pragma unroll
      for (int i = 0; i < PER_LANE; ++i) acc[i] += pj * v[i];
    }
  }
  const size_t o = (size_t)t * h + head * HD + lane * PER_LANE;
#pragma unroll
  for (int i = 0; i < PER_LANE; ++i) {
    const float y = acc[i] / total;
    out[o + i] = y;
    outh[o + i] = __float2half_rn(y);
  }
}

#define ENCODER_ATTENTION(HD)                                                                                   \
  extern "C" __global__ void enc_attention_hd##HD(const float* qkv, float* out, __half* outh,                  \
                                                  const int* seq_start, const int* seq_len, int tokens,       \
                                                  int heads, float scale) {                                    \
    encoder_attention<HD>(qkv, out, outh, seq_start, seq_len, tokens, heads, scale);                          \
  }
ENCODER_ATTENTION(32)
ENCODER_ATTENTION(64)

// One row per sequence: the mean of its token rows (cls = 0) or its first
// row (cls = 1). One block per sequence.
extern "C" __global__ void enc_pool(const float* __restrict__ x, float* __restrict__ out,
                                    const int* __restrict__ starts, const int* __restrict__ lens, int width,
                                    int cls) {
  pdl_begin();
  const int s = blockIdx.x, start = starts[s], len = cls ? 1 : lens[s];
  for (int i = threadIdx.x; i < width; i += blockDim.x) {
    float sum = 0.f;
    for (int t = 0; t < len; ++t) sum += x[(size_t)(start + t) * width + i];
    out[(size_t)s * width + i] = sum / len;
  }
}

// Every row scaled to unit L2 norm (by max(norm, 1e-12), as
// sentence-transformers' Normalize does). One block per row.
extern "C" __global__ void enc_l2_normalize(float* __restrict__ x, int width) {
  pdl_begin();
  float* row = x + (size_t)blockIdx.x * width;
  float sq = 0.f;
  for (int i = threadIdx.x; i < width; i += blockDim.x) sq += row[i] * row[i];
  const float scale = 1.f / fmaxf(sqrtf(block_sum(sq)), 1e-12f);
  for (int i = threadIdx.x; i < width; i += blockDim.x) row[i] *= scale;
}
