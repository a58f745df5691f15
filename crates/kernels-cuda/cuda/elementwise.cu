// Row-wise kernels: embedding gather, residual add + RMSNorm, post-norm
// add, gated activations (SiLU, GELU-tanh), logit soft-capping,
// and the random fill behind `--load-format dummy`.
#include "common.cuh"
#include "kquant.cuh"

// x[t] = table[ids[t]] (f32 residual stream); with sumsq, also the row's
// sum of squares (as its single partial) for the first fused RMSNorm
// (t < SUMSQ_ROWS), and with norm_w that norm's pre-scaled input
// xg[t] = bf16(x[t] ⊙ norm_w) (see gemv.cu). Grid: tokens.
// embed_rows_scaled multiplies the rows by `scale` (Gemma: sqrt(hidden));
// embed_kq reads a table kept in GGUF blocks (kquant.cuh).

// Elements i..i+8 of token t's row, `v` (already scaled): their writes,
// and their squares into ss.
__device__ __forceinline__ void embed_emit8(const float (&v)[8], int t, int i, float* __restrict__ x, int d,
                                            const float* __restrict__ norm_w, bf16* __restrict__ xg, float& ss) {
  float* out = x + (size_t)t * d;
#pragma unroll
  for (int e = 0; e < 8; ++e) ss += v[e] * v[e];
  reinterpret_cast<float4*>(out + i)[0] = make_float4(v[0], v[1], v[2], v[3]);
  reinterpret_cast<float4*>(out + i)[1] = make_float4(v[4], v[5], v[6], v[7]);
  if (norm_w) {
    const float4 g0 = reinterpret_cast<const float4*>(norm_w + i)[0];
    const float4 g1 = reinterpret_cast<const float4*>(norm_w + i)[1];
    const float g[8] = {g0.x, g0.y, g0.z, g0.w, g1.x, g1.y, g1.z, g1.w};
    __nv_bfloat162 o[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) o[e] = __floats2bfloat162_rn(v[2 * e] * g[2 * e], v[2 * e + 1] * g[2 * e + 1]);
    *reinterpret_cast<uint4*>(xg + (size_t)t * d + i) = *reinterpret_cast<const uint4*>(o);
  }
}

// The row's sum of squares, after every thread's emit8 calls.
__device__ __forceinline__ void embed_sumsq(int t, float ss, SumSq* __restrict__ sumsq) {
  if (sumsq && t < SUMSQ_ROWS) {
    ss = block_sum(ss);
    if (threadIdx.x == 0) {
      sumsq->partial[t][0] = ss;
      if (t == 0) sumsq->blocks = 1;
    }
  }
}

template <bool SCALED>
__device__ __forceinline__ void embed(const int* __restrict__ ids, const bf16* __restrict__ table,
                                      float* __restrict__ x, int d, SumSq* __restrict__ sumsq,
                                      const float* __restrict__ norm_w, bf16* __restrict__ xg, float scale) {
  pdl_begin();
  const int t = blockIdx.x;
  const bf16* row = table + (size_t)ids[t] * d;
  float ss = 0.f;
  // 8 elements per 16-byte load (d is a multiple of 8).
  for (int i = threadIdx.x * 8; i < d; i += blockDim.x * 8) {
    const uint4 raw = *reinterpret_cast<const uint4*>(row + i);
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
    float v[8];
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 f = __bfloat1622float2(h[e]);
      v[2 * e] = SCALED ? f.x * scale : f.x;
      v[2 * e + 1] = SCALED ? f.y * scale : f.y;
    }
    embed_emit8(v, t, i, x, d, norm_w, xg, ss);
  }
  embed_sumsq(t, ss, sumsq);
}

extern "C" __global__ void embed_rows(const int* ids, const bf16* table, float* x, int d, SumSq* sumsq,
                                      const float* norm_w, bf16* xg) {
  embed<false>(ids, table, x, d, sumsq, norm_w, xg, 1.f);
}

extern "C" __global__ void embed_rows_scaled(const int* ids, const bf16* table, float* x, int d, SumSq* sumsq,
                                             const float* norm_w, bf16* xg, float scale) {
  embed<true>(ids, table, x, d, sumsq, norm_w, xg, scale);
}

// A thread a vector of 32 weights: two runs of 16, four emits of 8.
extern "C" __global__ void embed_kq(const int* ids, const KqMatrix* table, float* x, int d, SumSq* sumsq,
                                    const float* norm_w, bf16* xg, float scale) {
  pdl_begin();
  const int t = blockIdx.x;
  const size_t row = (size_t)ids[t];
  const KqSegment& s = kq_segment(table, row);
  float ss = 0.f;
  kq_dispatch(s.type, [&](auto type) {
    using T = decltype(type);
    for (int v = threadIdx.x; v < d / 32; v += blockDim.x) {
      float w[2][16];
      kq_vector_weights<T>(s, row, d, v, w[0], w[1]);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float part[8];
#pragma unroll
        for (int k = 0; k < 8; ++k) part[k] = scale * w[e >> 1][8 * (e & 1) + k];
        embed_emit8(part, t, (e < 2 ? T::lo_in(v) : T::hi_in(v)) + 8 * (e & 1), x, d, norm_w, xg, ss);
      }
    }
  });
  embed_sumsq(t, ss, sumsq);
}

// Post-norm blocks (Gemma): x[t] += RMSNorm(y[t]) · post_w, y the block's
// f32 output. Then, with next_w, the next pre-norm: with sumsq, as the
// accumulating GEMVs leave it (the row's sum of squares as its single
// partial, t < SUMSQ_ROWS, and xn = bf16(x ⊙ next_w), the pre-scaled input
// of the fused-norm GEMVs); without, xn = bf16(RMSNorm(x) · next_w).
// Grid: tokens; block: 256.
extern "C" __global__ void post_norm_add(float* __restrict__ x, const float* __restrict__ y,
                                         const float* __restrict__ post_w, int d, float eps,
                                         const float* __restrict__ next_w, SumSq* __restrict__ sumsq,
                                         bf16* __restrict__ xn) {
  pdl_begin();
  const size_t t = blockIdx.x;
  float* xr = x + t * d;
  const float* yr = y + t * d;
  float ss = 0.f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) ss += yr[i] * yr[i];
  const float inv = rsqrtf(block_sum(ss) / d + eps);
  float sx = 0.f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const float v = xr[i] + yr[i] * inv * post_w[i];
    xr[i] = v;  // each thread rereads only its own elements below
    sx += v * v;
  }
  if (!next_w) return;
  sx = block_sum(sx);
  bf16* o = xn + t * d;
  if (sumsq) {
    for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = to_bf16(xr[i] * next_w[i]);
    if (t < SUMSQ_ROWS && threadIdx.x == 0) {
      sumsq->partial[t][0] = sx;
      if (t == 0) sumsq->blocks = 1;
    }
    return;
  }
  const float inv_x = rsqrtf(sx / d + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = to_bf16(xr[i] * inv_x * next_w[i]);
}

// logits = cap · tanh(logits / cap) (final logit soft-capping).
extern "C" __global__ void softcap_rows(float* __restrict__ logits, long long n, float cap) {
  pdl_begin();
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    logits[i] = cap * tanhf(logits[i] / cap);
}

// Fused residual add and RMSNorm. Grid: output rows; block: 256..1024 threads.
//   delta != null: x[r] += delta[r] (written back), then out[r] = norm(x[r]).
//   rows  != null: reads (and adds into) row rows[r] instead of r: gathers the
//                  last token of each sequence before the LM head.
// Rows of a multiple of 4 up to 16 per thread stay in registers between
// the sum of squares and the scaling (16-byte loads, one pass over x).
extern "C" __global__ void add_rms_norm(float* __restrict__ x, const bf16* __restrict__ delta,
                                        const int* __restrict__ rows, const float* __restrict__ weight,
                                        bf16* __restrict__ out, int d, float eps) {
  pdl_begin();
  const int r = blockIdx.x, src = rows ? rows[r] : r;
  float* xr = x + (size_t)src * d;
  const bf16* dr = delta ? delta + (size_t)src * d : nullptr;
  bf16* o = out + (size_t)r * d;
  float ss = 0.f;
  if ((d & 3) == 0 && d <= 4 * NORM_VECS * (int)blockDim.x) {
    __nv_bfloat162 h[NORM_VECS][2];
    rms_norm_row_regs(xr, dr, xr, weight, d, eps, h);
#pragma unroll
    for (int k = 0; k < NORM_VECS; ++k) {
      const int i = 4 * (threadIdx.x + k * blockDim.x);
      if (i >= d) continue;
      uint2 packed;
      packed.x = *reinterpret_cast<const unsigned*>(&h[k][0]);
      packed.y = *reinterpret_cast<const unsigned*>(&h[k][1]);
      *reinterpret_cast<uint2*>(o + i) = packed;
    }
    return;
  }
  if (dr) {
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      float v = xr[i] + to_f32(dr[i]);
      xr[i] = v;
      ss += v * v;
    }
  } else {
    for (int i = threadIdx.x; i < d; i += blockDim.x) ss += xr[i] * xr[i];
  }
  const float inv = rsqrtf(block_sum(ss) / d + eps);
  for (int i = threadIdx.x; i < d; i += blockDim.x) o[i] = to_bf16(xr[i] * inv * weight[i]);
}

// out[t, j] = act(gate[t, j]) * up[t, j], with gate_up = [gate | up] per
// row; act: SiLU (silu_mul) or GELU-tanh (gelu_tanh_mul).
// Grid: (tokens, ceil(ff / (8 * blockDim.x))); 8 elements (16 bytes) per
// thread; ff must be a multiple of 8.
template <bool GELU>
__device__ __forceinline__ void gated_mul(const bf16* __restrict__ gate_up, bf16* __restrict__ out, int ff) {
  pdl_begin();
  const int t = blockIdx.x;
  const int j = 8 * (blockIdx.y * blockDim.x + threadIdx.x);
  if (j >= ff) return;
  const bf16* g = gate_up + (size_t)t * 2 * ff;
  const uint4 gv = *reinterpret_cast<const uint4*>(g + j);
  const uint4 uv = *reinterpret_cast<const uint4*>(g + ff + j);
  *reinterpret_cast<uint4*>(out + (size_t)t * ff + j) = gated_chunk<GELU>(gv, uv);
}

extern "C" __global__ void silu_mul(const bf16* gate_up, bf16* out, int ff) { gated_mul<false>(gate_up, out, ff); }

extern "C" __global__ void gelu_tanh_mul(const bf16* gate_up, bf16* out, int ff) { gated_mul<true>(gate_up, out, ff); }

// out[i] = offset + scale * u_j with u_j uniform in [-0.5, 0.5), a pure
// function of (seed, j): dummy weights made on the device, no host traffic.
// bf16 for weights, f32 for norm weights. j is i's index in the whole
// tensor when `out` is one rank's slice of it (tensor parallel): the slice
// holds `len` of the `full` indices of one dimension from `start`, each a
// slab of `inner` elements (a whole tensor: inner = n, len = full = 1).
template <typename T>
__device__ __forceinline__ void fill_uniform(T* __restrict__ out, long long n, unsigned long long seed, float scale,
                                             float offset, long long inner, long long len, long long full,
                                             long long start) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
       i += (long long)gridDim.x * blockDim.x) {
    const long long slab = i / inner;
    const long long j = ((slab / len) * full + start + slab % len) * inner + i % inner;
    const float u = (float)hash24(seed, (uint64_t)j) * (1.0f / 16777216.0f) - 0.5f;
    out[i] = static_cast<T>(offset + scale * u);
  }
}

extern "C" __global__ void fill_uniform_bf16(bf16* __restrict__ out, long long n, unsigned long long seed,
                                             float scale, float offset, long long inner, long long len,
                                             long long full, long long start) {
  fill_uniform(out, n, seed, scale, offset, inner, len, full, start);
}

extern "C" __global__ void fill_uniform_f32(float* __restrict__ out, long long n, unsigned long long seed,
                                            float scale, float offset, long long inner, long long len,
                                            long long full, long long start) {
  fill_uniform(out, n, seed, scale, offset, inner, len, full, start);
}

// KV tiers: pages of the paged KV cache to and from a packed staging
// buffer. `pieces` lists the K and V buffers of every page slice (K0, V0,
// K1, V1, ...); page p of a buffer is the `piece_bytes` at p * piece_bytes
// (layout [pages, kv_heads, block_size, head_dim]). Staging holds, per
// listed page, its pieces in that order. Grid: (pages, pieces); 16-byte
// moves (piece_bytes is a multiple of 16).
extern "C" __global__ void kv_pages_gather(const unsigned int* __restrict__ pages,
                                           const unsigned long long* __restrict__ pieces, int npieces,
                                           long long piece_bytes, unsigned char* __restrict__ staging) {
  pdl_begin();
  const int i = blockIdx.x, piece = blockIdx.y;
  const uint4* src = reinterpret_cast<const uint4*>(pieces[piece] + (unsigned long long)pages[i] * piece_bytes);
  uint4* dst = reinterpret_cast<uint4*>(staging + ((long long)i * npieces + piece) * piece_bytes);
  for (long long j = threadIdx.x; j < piece_bytes / 16; j += blockDim.x) dst[j] = src[j];
}

extern "C" __global__ void kv_pages_scatter(const unsigned int* __restrict__ pages,
                                            const unsigned long long* __restrict__ pieces, int npieces,
                                            long long piece_bytes, const unsigned char* __restrict__ staging) {
  pdl_begin();
  const int i = blockIdx.x, piece = blockIdx.y;
  const uint4* src = reinterpret_cast<const uint4*>(staging + ((long long)i * npieces + piece) * piece_bytes);
  uint4* dst = reinterpret_cast<uint4*>(pieces[piece] + (unsigned long long)pages[i] * piece_bytes);
  for (long long j = threadIdx.x; j < piece_bytes / 16; j += blockDim.x) dst[j] = src[j];
}
