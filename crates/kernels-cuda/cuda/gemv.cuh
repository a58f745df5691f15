// Skinny GEMMs for decode at small batch: y[n, out] = x[n, in] · w[out, in]ᵀ
// for n <= 8. One warp streams one weight row (two for the paired modes)
// with 16-byte loads, software-pipelined so the next loads are in flight
// while the current ones are used, and applies it to every x row. At this
// shape the weights are read exactly once and the kernel runs at memory
// speed. Kernels, each for n = 1..8:
//   gemv_n{n}_bf16 / _f32:  y = x·wᵀ
//   gemv_n{n}_add_f32:      y += x·wᵀ (the f32 residual stream)
//   gemv_n{n}_swiglu:       w is the fused [2·ff, in] gate/up matrix; the
//                           warp for column i reads gate row i and up row
//                           ff + i and writes silu(gate)·up (bf16)
//   gemv_n{n}_geglu:        the same with GELU (tanh) for SiLU (Gemma)
//   gemv_n{n}_qkv_rope:     w is the fused q/k/v matrix; two warps for a
//                           rotary pair read rows i and i + hd/2 of one
//                           head (half of the input each), add the bias,
//                           rotate q and k and write
//                           q and the paged K/V cache (what rope_qkv does
//                           after a plain GEMM, without the round trip)
//   gemv_n{n}_bf16_norm:    y = rmsnorm(x)·wᵀ (bf16), for q/k/v of models
//                           whose q/k norm keeps rope in its own kernel
//   ..._swiglu_norm / _geglu_norm / _qkv_rope_norm: the same with the input RMSNorm
//                           fused: x is the residual already multiplied by
//                           the norm weight (bf16, left by the residual's
//                           writer), and the dot products are scaled by
//                           1/rms from the sums of squares it left (SumSq):
//                           rmsnorm(x)·w = (1/rms)·((x ⊙ g)·w), so the
//                           inner loop is the plain GEMV's
// Each comes for bf16 weights and, as gemv_fp8_n{n}_..., for e4m3 weights
// (`--quantization fp8`): 16 weights per 16-byte load, converted in pairs
// by the hardware (cvt e4m3x2 -> f16x2 on sm_89+), with the f32 per-row
// scale that follows the matrix (see fp8.cu) applied once to each sum.
// gemv_q8_0_n{n}_... read GGUF Q8_0 matrices as they are stored
// (`model.cuda_weights = "native"`, see quant.cu for the layout): 16 int8
// weights per 16-byte load, turned into floats by integer ops (no I2F),
// each half block's dot product scaled by its block's f16 scale.
// gemv_kq_n{n}_... read GGUF Q4_0/Q4_1/Q4_K/Q5_K/Q6_K matrices as they are
// stored (kquant.cuh): 32 weights per 16-byte load of quants, their
// high bits and block scales from the type's other planes, each run of 16
// weights' dot product scaled (and its min applied) once.
// gemv_short_n{n}_...: bf16 rows of at most 2,048 inputs, each lane's
// whole part of its rows loaded before the PDL wait and x staged in shared
// memory (small models).
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#pragma once
#include "common.cuh"
#include "e4m3.cuh"
#include "kquant.cuh"

constexpr int GEMV_WARPS = 8;
constexpr int GEMV_UNROLL = 4;


// 16 int8 weights as floats: each byte, its sign bit flipped (q + 128),
// becomes the low mantissa byte of 2^23 and the subtraction leaves q exactly.
__device__ __forceinline__ void s8x16_to_float(const uint4& v, float (&f)[16]) {
  const unsigned* w = reinterpret_cast<const unsigned*>(&v);
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const unsigned u = w[k] ^ 0x80808080u;
#pragma unroll
    for (int j = 0; j < 4; ++j) f[4 * k + j] = __uint_as_float(__byte_perm(u, 0x4B000000u, 0x7540u | j)) - 8388736.f;
  }
}

// 16 float weights against 16 bf16 activations (two 16-byte loads).
__device__ __forceinline__ float dot16_f32(const float (&w)[16], const uint4& x0, const uint4& x1) {
  const __nv_bfloat162* xa = reinterpret_cast<const __nv_bfloat162*>(&x0);
  const __nv_bfloat162* xb = reinterpret_cast<const __nv_bfloat162*>(&x1);
  float acc = 0.f;
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 b = __bfloat1622float2(i < 4 ? xa[i] : xb[i - 4]);
    acc = fmaf(w[2 * i], b.x, acc);
    acc = fmaf(w[2 * i + 1], b.y, acc);
  }
  return acc;
}

// How a weight type's values are scaled: not at all, per row (e4m3), per
// block of 32 (Q8_0), or by the 4- to 6-bit GGUF types' own blocks
// (kquant.cuh: the weight pointer is a KqMatrix header).
enum class WScale { None, Row, Block32, Kq };

// Weight element types. ELEMS: weights per 16-byte load. ROW_UNROLL: the
// loads a lane keeps in flight per row and batch in the plain and q/k/v
// GEMVs; GATED_UNROLL: the same for each of the gated GEMVs' two rows.
struct Bf16W {
  typedef bf16 T;
  static constexpr int ELEMS = 8;
  static constexpr int ROW_UNROLL = GEMV_UNROLL;
  static constexpr int GATED_UNROLL = GEMV_UNROLL;
  static constexpr WScale SCALE = WScale::None;
};
// An 8B-class e4m3 row (4 KiB) is 8 loads a lane: batches of 2 finish the
// 8B's q/k/v, o_proj and down_proj 7-16% sooner than batches of 4 (fewer
// registers, more resident warps; tests/gpu/bench_gemv.py, docs/perf/fp8.md).
struct Fp8W {
  typedef __nv_fp8_storage_t T;
  static constexpr int ELEMS = 16;
  static constexpr int ROW_UNROLL = 2;
  static constexpr int GATED_UNROLL = GEMV_UNROLL;
  static constexpr WScale SCALE = WScale::Row;
};
// Q8_0 rows are as many bytes as e4m3's, with more work a load (the
// integer-to-float conversion, the block scales): at batch 1 on the 8B's
// gate/up one load a row in flight streams at 3.86 TB/s, four at 2.42
// (fewer registers, more resident warps); o_proj and down_proj are fastest
// at two (tests/gpu/bench_gemv.py, docs/benchmarks.md).
struct Q8W {
  typedef int8_t T;
  static constexpr int ELEMS = 16;
  static constexpr int ROW_UNROLL = 2;
  static constexpr int GATED_UNROLL = 1;
  static constexpr WScale SCALE = WScale::Block32;
};

// GGUF Q4_0/Q4_1/Q4_K/Q5_K/Q6_K (kquant.cuh): 32 weights per 16-byte load
// of quants, the type chosen per row segment at run time. One load a row
// in flight (58 registers, 32 resident warps); two, or more through shared
// memory (cp.async), measured slower, as did 8 or 16 lanes a row on the
// 8B's 4,096-row o_proj and down_proj (tests/gpu/bench_gemv.py,
// docs/perf/native-gguf.md). KQ_TYPES: the types compiled in (a mask of
// bits KQ_*; kernels built for one type hold fewer registers).
template <unsigned KQ_TYPES = KQ_ALL_TYPES>
struct KqWOf {
  typedef KqMatrix T;
  static constexpr int ELEMS = 32;
  static constexpr int ROW_UNROLL = 1;
  static constexpr int GATED_UNROLL = 1;
  static constexpr WScale SCALE = WScale::Kq;
  static constexpr unsigned TYPES = KQ_TYPES;
};
typedef KqWOf<> KqW;

// The block scales of the vectors a lane has in flight: nothing for
// unscaled and row-scaled types; for Q8_0 one f16 per 16-byte vector (its
// half block's), loaded with the weights.
template <typename W, int ROWS, int U>
struct VecScales {
  __device__ __forceinline__ void load(const __half* const (&)[ROWS], int, int) {}
  __device__ __forceinline__ float at(int, int) const { return 1.f; }
};
template <int ROWS, int U>
struct VecScales<Q8W, ROWS, U> {
  float s[ROWS][U];
  __device__ __forceinline__ void load(const __half* const (&sr)[ROWS], int base, int vecs) {
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const int i = base + u * 32;
        s[r][u] = i < vecs ? __half2float(__ldg(sr[r] + (i >> 1))) : 0.f;
      }
  }
  __device__ __forceinline__ float at(int r, int u) const { return s[r][u]; }
};

template <int ROWS, int U>
__device__ __forceinline__ void load_batch(const uint4* const (&wr)[ROWS], int base, int vecs, uint4 (&dst)[ROWS][U]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int i = base + u * 32;
      dst[r][u] = i < vecs ? __ldcs(wr[r] + i) : make_uint4(0, 0, 0, 0);
    }
}

// acc[r][n] = x[n] · w[rows[r]] for this warp's rows, reduced over the warp
// (every lane holds the result). With NORM, x is x ⊙ g of the f32
// residual and the results are scaled by its 1/rms (see the header).
struct NormIn {
  float eps;
  const SumSq* sumsq;  // sums of squares of the residual rows
};

// With NORM, warp n adds the residual writer's per-block partial sums of
// squares of row n (a fixed order) into s_inv[n] = 1/rms of that row; the
// block reads them after a barrier at the end, so the loads overlap the
// weights. A warp a row: one warp walking all N rows paid N dependent
// round trips to L2 (~0.5 us each), longer than the weights at N = 8.
template <int N>
__device__ __forceinline__ void norm_scales(const NormIn& norm, int in, float (&s_inv)[SUMSQ_ROWS]) {
  static_assert(N <= GEMV_WARPS, "a warp a row");
  const int lane = threadIdx.x & 31, n = threadIdx.x >> 5, blocks = (int)norm.sumsq->blocks;
  if (n >= N) return;
  float t = 0.f;
  for (int b = lane; b < blocks; b += 32) t += norm.sumsq->partial[n][b];
  t = warp_sum(t);
  if (lane == 0) s_inv[n] = rsqrtf(t / in + norm.eps);
}

// An activation vector from global memory (read-only path) or, with
// SHARED, from the block's staged copy (see StagedX).
template <bool SHARED>
__device__ __forceinline__ uint4 load_x(const uint4* p) {
  if constexpr (SHARED) return *p;
  else return __ldg(p);
}

// acc[r][n] += x[n] · w_r over the vectors base, base + 32, ... (U of them,
// those below end) whose weights are in `cur`; x in shared memory with
// SHARED_X.
template <int N, int ROWS, typename W, int U, bool SHARED_X = false>
__device__ __forceinline__ void dot_batch(const uint4 (&cur)[ROWS][U], const VecScales<W, ROWS, U>& scales,
                                          const uint4* xr, int base, int end, int xvecs, float (&acc)[ROWS][N]) {
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int i = base + u * 32;
    if (i >= end) break;
    if constexpr (W::SCALE == WScale::Block32) {
      // Each row's 16 weights converted once, for every batch row.
#pragma unroll
      for (int r = 0; r < ROWS; ++r) {
        float wf[16];
        s8x16_to_float(cur[r][u], wf);
        const float s = scales.at(r, u);
#pragma unroll
        for (int n = 0; n < N; ++n) {
          const uint4 x0 = load_x<SHARED_X>(xr + (size_t)n * xvecs + 2 * i),
                      x1 = load_x<SHARED_X>(xr + (size_t)n * xvecs + 2 * i + 1);
          acc[r][n] = fmaf(s, dot16_f32(wf, x0, x1), acc[r][n]);
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < N; ++n) {
        if constexpr (W::SCALE == WScale::Row) {
          const uint4 x0 = load_x<SHARED_X>(xr + (size_t)n * xvecs + 2 * i),
                      x1 = load_x<SHARED_X>(xr + (size_t)n * xvecs + 2 * i + 1);
#pragma unroll
          for (int r = 0; r < ROWS; ++r) dot16_e4m3(cur[r][u], x0, x1, acc[r][n]);
        } else {
          const uint4 xv = load_x<SHARED_X>(xr + (size_t)n * xvecs + i);
#pragma unroll
          for (int r = 0; r < ROWS; ++r) dot8(cur[r][u], xv, acc[r][n]);
        }
      }
    }
  }
}

// Quant byte `j` (0..3) of `word` as 0.5 + q / 256, by one byte permute:
// q becomes the top of the mantissa of 0.5 (exact for q < 128). So
// sum(q x) = 256 sum(f x) - 128 sum(x), and with the run's activation sum
// at hand (needed anyway for the types' mins) each weight costs one
// permute and one FMA: no subtraction, no int-to-float (f x is exact in
// f32; the cancellation costs ~4 of its 24 bits, far below bf16's 8).
__device__ __forceinline__ float quant_half(unsigned word, int j) {
  return __uint_as_float(__byte_perm(word, 0x3F000000u, 0x7054u | (j << 8)));
}

// Sums of each run of 16 activations of the N rows of x, computed once a
// block into shared memory at batch 1 and 2 (N x in / 16 of them, at most
// KQ_RUNSUM_CAP: the host sends wider inputs to the GEMM path); from 3
// rows up each lane sums its own runs (registers: a separate path in the
// same kernel cost the batch-1 ones 8 more).
constexpr int KQ_RUNSUM_CAP = 4096;
constexpr int KQ_BLOCK_SUMS_MAX_N = 2;

template <int N>
__device__ __forceinline__ void block_run_sums(const bf16* x, int in, float* sums) {
  const int runs = in / 16;
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  for (int i = threadIdx.x; i < N * runs; i += blockDim.x) {
    const uint4 a = __ldg(xr + 2 * (size_t)i), b = __ldg(xr + 2 * (size_t)i + 1);
    float f[16];
    bf16x16_to_float(a, b, f);
    float t = 0.f;
#pragma unroll
    for (int k = 0; k < 16; ++k) t += f[k];
    sums[i] = t;
  }
  __syncthreads();
}

// Batch 1, inputs up to KQ_INT_MAX_IN: the activations as int16, each run
// of 16 with its own scale (|x| max / 32767), quantized once a block into
// shared memory, so that the products take `dp2a` (two int16 x int8
// products and an int32 add an instruction, exact) instead of a conversion
// and an FMA a weight. The rounding is 2^-16 of the run's largest value,
// far below bf16's own 2^-9 of each; the run's sum (for the types' mins
// and offsets) stays the f32 sum of the bf16 values, as in the float path.
constexpr int KQ_INT_MAX_IN = 16384;

struct KqIntX {
  int4 q[KQ_INT_MAX_IN / 8];         // 8 int16 a 16-byte vector, in input order
  float2 run[KQ_INT_MAX_IN / 16];    // each run's (scale, sum)
};

// A block's shared view of its input: the run sums (float path, batch 1
// and 2) or, at batch 1, the int16 activations.
template <int N>
union KqInputs {
  float sums[N <= KQ_BLOCK_SUMS_MAX_N ? KQ_RUNSUM_CAP : 1];
};
template <>
union KqInputs<1> {
  float sums[KQ_RUNSUM_CAP];
  KqIntX x16;
};

__device__ __forceinline__ void block_quantize_x(const bf16* x, int in, KqIntX& s) {
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  for (int i = threadIdx.x; i < in / 16; i += blockDim.x) {
    float f[16];
    bf16x16_to_float(__ldg(xr + 2 * i), __ldg(xr + 2 * i + 1), f);
    float amax = 0.f, sum = 0.f;
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      amax = fmaxf(amax, fabsf(f[k]));
      sum += f[k];
    }
    const float inv = amax > 0.f ? 32767.f / amax : 0.f;
    int packed[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const int a = max(-32767, min(32767, __float2int_rn(f[2 * k] * inv)));
      const int b = max(-32767, min(32767, __float2int_rn(f[2 * k + 1] * inv)));
      packed[k] = (a & 0xffff) | (b << 16);
    }
    s.q[2 * i] = make_int4(packed[0], packed[1], packed[2], packed[3]);
    s.q[2 * i + 1] = make_int4(packed[4], packed[5], packed[6], packed[7]);
    s.run[i] = make_float2(amax / 32767.f, sum);
  }
  __syncthreads();
}

// Sum of quants x activations of one run of 16: the run's quants as bytes
// (words q[k]: inputs 4k..4k+3) against its int16 activations (a, b: inputs
// 0..7 and 8..15, two a word).
__device__ __forceinline__ int run_dp2a(const unsigned (&q)[4], const int4& a, const int4& b) {
  const int p[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
  int d = 0;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    d = __dp2a_lo(p[2 * k], (int)q[k], d);
    d = __dp2a_hi(p[2 * k + 1], (int)q[k], d);
  }
  return d;
}

// kq_vector_dot on the int16 activations (batch 1): per run
// s (q - OFFSET) + m summed = s xs sum(q xq) + (m - OFFSET s) sum(x).
template <typename T, int ROWS, int U>
__device__ __forceinline__ void kq_vector_dot_int(const KqRaw (&cur)[ROWS][U], int u, int v, const KqIntX& xs,
                                                  float (&acc)[ROWS][1]) {
  const int lo = T::lo_in(v) / 16, hi = T::hi_in(v) / 16;
  const int4 la = xs.q[2 * lo], lb = xs.q[2 * lo + 1], ha = xs.q[2 * hi], hb = xs.q[2 * hi + 1];
  const float2 rl = xs.run[lo], rh = xs.run[hi];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    KqRuns runs;
    T::decode(cur[r][u], v, runs);
    const float dl = (float)run_dp2a(runs.lo, la, lb), dh = (float)run_dp2a(runs.hi, ha, hb);
    const float ml = runs.m_lo - T::OFFSET * runs.s_lo, mh = runs.m_hi - T::OFFSET * runs.s_hi;
    acc[r][0] += fmaf(runs.s_lo * rl.x, dl, fmaf(runs.s_hi * rh.x, dh, fmaf(ml, rl.y, mh * rh.y)));
  }
}

// acc[r][n] += x[n] · (vector v of row r), the raw loads in cur[r][u]. In
// two halves of 8 weights a run, so that only 16 converted weights a row
// and one 16-byte load of each run's activations are live at a time (the
// whole vector at once held ~2x the registers and halved resident warps);
// each row's weights are converted once for every batch row. `sums`: the
// block's run sums (see block_run_sums) for N <= KQ_BLOCK_SUMS_MAX_N.
template <typename T, int N, int ROWS, int U>
__device__ __forceinline__ void kq_vector_dot(const KqRaw (&cur)[ROWS][U], int u, int v, const uint4* xr, int xvecs,
                                              const float* sums, float (&acc)[ROWS][N]) {
  KqRuns runs[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) T::decode(cur[r][u], v, runs[r]);
  const int lo = T::lo_in(v) / 8, hi = T::hi_in(v) / 8;
  float dl[ROWS][N], dh[ROWS][N], sl[N], sh[N];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    sl[n] = sh[n] = 0.f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r) dl[r][n] = dh[r][n] = 0.f;
  }
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    float wl[ROWS][8], wh[ROWS][8];
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int i = 0; i < 8; ++i) {
        wl[r][i] = quant_half(runs[r].lo[2 * c + (i >> 2)], i & 3);
        wh[r][i] = quant_half(runs[r].hi[2 * c + (i >> 2)], i & 3);
      }
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const uint4* xn = xr + (size_t)n * xvecs;
      const uint4 xlv = __ldg(xn + lo + c), xhv = __ldg(xn + hi + c);
      const __nv_bfloat162* xl = reinterpret_cast<const __nv_bfloat162*>(&xlv);
      const __nv_bfloat162* xh = reinterpret_cast<const __nv_bfloat162*>(&xhv);
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const float2 a = __bfloat1622float2(xl[k]), b = __bfloat1622float2(xh[k]);
        if constexpr (N > KQ_BLOCK_SUMS_MAX_N) {
          sl[n] += a.x + a.y;
          sh[n] += b.x + b.y;
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r) {
          dl[r][n] = fmaf(wl[r][2 * k], a.x, fmaf(wl[r][2 * k + 1], a.y, dl[r][n]));
          dh[r][n] = fmaf(wh[r][2 * k], b.x, fmaf(wh[r][2 * k + 1], b.y, dh[r][n]));
        }
      }
    }
  }
  if constexpr (N <= KQ_BLOCK_SUMS_MAX_N)
#pragma unroll
    for (int n = 0; n < N; ++n) {
      sl[n] = sums[n * (xvecs / 2) + lo / 2];
      sh[n] = sums[n * (xvecs / 2) + hi / 2];
    }
  // s (q - OFFSET) + m summed: 256 s sum(f x) + (m - (128 + OFFSET) s) sum(x).
  constexpr float off = 128.f + T::OFFSET;
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const float ml = runs[r].m_lo - off * runs[r].s_lo, mh = runs[r].m_hi - off * runs[r].s_hi;
    const float sl256 = 256.f * runs[r].s_lo, sh256 = 256.f * runs[r].s_hi;
#pragma unroll
    for (int n = 0; n < N; ++n)
      acc[r][n] += fmaf(sl256, dl[r][n], fmaf(sh256, dh[r][n], fmaf(ml, sl[n], mh * sh[n])));
  }
}

// The planes of each row and its first U vectors in flight, for type T
// (before the PDL wait: weights do not depend on the previous kernel).
template <typename T, int ROWS, int U>
__device__ __forceinline__ void kq_load(const unsigned char* const (&rp)[ROWS][KQ_MAX_PLANES], int base, int end,
                                        KqRaw (&dst)[ROWS][U]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const unsigned char* p[T::PLANES];
#pragma unroll
    for (int k = 0; k < T::PLANES; ++k) p[k] = rp[r][k];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = base + u * 32;
      if (v < end) T::load(p, v, dst[r][u]);
    }
  }
}

// kq_rows for one type T after the PDL wait: acc[r][n] += x[n] · row r over
// the quant vectors [base, end) of this lane, the first U of them in
// `cur`, the next U in flight while those are used.
template <typename T, int N, int ROWS, int U, bool INT = false>
__device__ __forceinline__ void kq_rows_t(const bf16* __restrict__ x, const unsigned char* const (&rp)[ROWS][KQ_MAX_PLANES],
                                          int in, int base, int end, KqRaw (&cur)[ROWS][U], const float* sums,
                                          const KqIntX* xs, float (&acc)[ROWS][N]) {
  static_assert(!INT || N == 1, "int16 activations are a batch-1 path");
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  const int xvecs = in / 8;
  for (; base < end; base += 32 * U) {
    KqRaw next[ROWS][U];
    kq_load<T, ROWS, U>(rp, base + 32 * U, end, next);
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int v = base + u * 32;
      if (v >= end) break;
      if constexpr (INT) kq_vector_dot_int<T, ROWS, U>(cur, u, v, *xs, acc);
      else kq_vector_dot<T, N, ROWS>(cur, u, v, xr, xvecs, sums, acc);
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int u = 0; u < U; ++u) cur[r][u] = next[r][u];
  }
}

// Row r's planes of a KqMatrix, for type T.
template <typename T, int ROWS>
__device__ __forceinline__ void kq_row_planes(const KqMatrix* m, int in, const size_t (&rows)[ROWS],
                                              const unsigned char* (&rp)[ROWS][KQ_MAX_PLANES]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r) {
    const KqSegment& s = kq_segment(m, rows[r]);
    const unsigned char* planes[T::PLANES];
    const unsigned char* row[T::PLANES];
    kq_planes<T>(s.base, (size_t)s.rows, in, planes);
    kq_row<T>(planes, rows[r] - (size_t)s.row_start, in, row);
#pragma unroll
    for (int k = 0; k < T::PLANES; ++k) rp[r][k] = row[k];
  }
}

// gemv_rows for KqW: finds each row's segment (a warp's rows share a type:
// the host keeps gate/up in one type and a rotary pair lies in one part),
// then runs that type's loop. The sum over the warp and the norm's scale
// follow in gemv_rows.
template <int N, int ROWS, bool NORM, int U, unsigned TYPES>
__device__ __forceinline__ void kq_rows(const bf16* x, const KqMatrix* m, int in, const size_t (&rows)[ROWS],
                                        float (&acc)[ROWS][N], const NormIn& norm, float (&s_inv)[SUMSQ_ROWS],
                                        int v0, int v1) {
  const int end = v1 < 0 ? in / 32 : v1, base = v0 + (int)(threadIdx.x & 31);
  const int type = kq_segment(m, rows[0]).type;
  const unsigned char* rp[ROWS][KQ_MAX_PLANES];
  KqRaw cur[ROWS][U];
  // Two passes through the type switch: the first loads before the PDL
  // wait; the block-wide work on the input (its run sums, the norm's
  // scale) sits between them, where every thread reaches its barrier.
  const bool known = kq_dispatch<TYPES>(type, [&](auto t) {
    using T = decltype(t);
    kq_row_planes<T, ROWS>(m, in, rows, rp);
    kq_load<T, ROWS, U>(rp, base, end, cur);
  });
  pdl_wait();
  pdl_launch_dependents();
  // Batch 1 up to KQ_INT_MAX_IN inputs: int16 activations; else the run
  // sums (batch 1 and 2) for the float path.
  __shared__ KqInputs<N> s_in;
  const KqIntX* xs = nullptr;  // set when the int16 path runs
  if constexpr (N == 1) {
    if (in <= KQ_INT_MAX_IN) {
      block_quantize_x(x, in, s_in.x16);
      xs = &s_in.x16;
    } else {
      block_run_sums<N>(x, in, s_in.sums);
    }
  } else if constexpr (N <= KQ_BLOCK_SUMS_MAX_N) {
    block_run_sums<N>(x, in, s_in.sums);
  }
  if (NORM) norm_scales<N>(norm, in, s_inv);
  if (!known) return;
  kq_dispatch<TYPES>(type, [&](auto t) {
    using T = decltype(t);
    if constexpr (N == 1) {
      if (xs) return kq_rows_t<T, N, ROWS, U, true>(x, rp, in, base, end, cur, s_in.sums, xs, acc);
    }
    kq_rows_t<T, N, ROWS, U>(x, rp, in, base, end, cur, s_in.sums, xs, acc);
  });
}

// Loads a lane holds in the `gemv_short_n{n}_*` kernels (WHOLE of
// gemv_rows, over a kernel's rows): 8 x 16 bytes, 32 registers, so rows of
// up to 2,048 bf16 inputs (q/k/v: two half rows of up to 1,024; gate/up:
// two rows of up to 1,024) are loaded whole before the PDL wait. SmolLM2
// batch 1 +6 % on an H100; the 8B's e4m3 o_proj and q/k/v measured 4 %
// slower that way, and compiling the path into the general kernels cost
// the 8B bf16 step 0.9 % (longer rows never take it), hence kernels of
// their own (docs/perf/small-models.md). They also stage x in shared
// memory (StagedX).
constexpr int SHORT_ROW_LOADS = 8;
constexpr int SHORT_ROW_INPUTS = SHORT_ROW_LOADS * 8 * 32;

// The fused norm's partial sums of squares of row n (by warp n) in the
// short kernels: the first NORM_PREFETCH a lane sums, loaded with the
// staged x before its barrier (the block count with them: loads past it
// read stale partials, masked at the sum), and summed after the dot
// products in norm_scales' order (the same bits). A chain of dependent
// loads before the barrier would hold up the whole block.
constexpr int NORM_PREFETCH = 8;

template <int N>
struct NormParts {
  float v[NORM_PREFETCH];
  unsigned blocks;
  __device__ __forceinline__ void load(const NormIn& norm) {
    const int lane = threadIdx.x & 31, n = threadIdx.x >> 5;
    if (n >= N) return;
    blocks = norm.sumsq->blocks;
#pragma unroll
    for (int j = 0; j < NORM_PREFETCH; ++j) v[j] = norm.sumsq->partial[n][lane + 32 * j];
  }
  __device__ __forceinline__ void finish(const NormIn& norm, int in, float (&s_inv)[SUMSQ_ROWS]) {
    const int lane = threadIdx.x & 31, n = threadIdx.x >> 5;
    if (n >= N) return;
    float t = 0.f;
#pragma unroll
    for (int j = 0; j < NORM_PREFETCH; ++j) t += lane + 32 * j < (int)blocks ? v[j] : 0.f;
    for (int b = lane + 32 * NORM_PREFETCH; b < (int)blocks; b += 32) t += norm.sumsq->partial[n][b];
    t = warp_sum(t);
    if (lane == 0) s_inv[n] = rsqrtf(t / in + norm.eps);
  }
};

// The short kernels' N rows of activations (at most SHORT_ROW_INPUTS wide),
// copied into shared memory by the whole block with every load in flight
// at once. x was just written by the previous kernel, so each read of it
// is an L2 round trip: the dot products otherwise wait for one per batch
// of weight vectors (a row of 576 inputs is three), now for one in all.
template <int N, int XIN = SHORT_ROW_INPUTS>
struct StagedX {
  static constexpr int PER_THREAD = N * XIN / 8 / (GEMV_WARPS * 32);
  uint4 held[PER_THREAD];
  // Issues this thread's loads (call right after the PDL wait).
  __device__ __forceinline__ void load(const uint4* xr, int vecs) {
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
      const int i = threadIdx.x + k * GEMV_WARPS * 32;
      if (i < vecs) held[k] = __ldg(xr + i);
    }
  }
  // Stores them and waits for the block: every thread must call it.
  __device__ __forceinline__ void store(uint4* dst, int vecs) {
#pragma unroll
    for (int k = 0; k < PER_THREAD; ++k) {
      const int i = threadIdx.x + k * GEMV_WARPS * 32;
      if (i < vecs) dst[i] = held[k];
    }
    __syncthreads();
  }
};

// Over the 16-byte weight vectors [v0, v1) of the rows (v1 < 0: to the
// end). `total_rows`: the matrix's rows (where e4m3 scales start).
// Weights do not depend on the previous kernel, so loads go out before
// waiting for it (with PDL this overlaps the previous kernel's tail): the
// first batch of U a row, or with WHOLE > 0, where a lane's part of its
// rows is at most WHOLE loads each, all of them (the rest of the kernel is
// then only the dot products on the input). The sums are the same either
// way: every lane adds its vectors in the same order.
template <int N, int ROWS, bool NORM = false, typename W = Bf16W, int U = GEMV_UNROLL, int WHOLE = 0,
          int XIN = SHORT_ROW_INPUTS>
__device__ __forceinline__ void gemv_rows(const bf16* __restrict__ x, const typename W::T* __restrict__ w, int in,
                                          size_t total_rows, const size_t (&rows)[ROWS], float (&acc)[ROWS][N],
                                          NormIn norm = {}, int v0 = 0, int v1 = -1) {
  __shared__ float s_inv[SUMSQ_ROWS];
  // The short kernels (WHOLE > 0) read x from shared memory, and their
  // norm's partials come in with it (see after_wait).
  constexpr bool SHARED_X = WHOLE > 0 && W::SCALE != WScale::Kq;
  NormParts<N> parts;
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int n = 0; n < N; ++n) acc[r][n] = 0.f;
  if constexpr (W::SCALE == WScale::Kq) {
    kq_rows<N, ROWS, NORM, U, W::TYPES>(x, w, in, rows, acc, norm, s_inv, v0, v1);
  } else {
  const int lane = threadIdx.x & 31;
  const int vecs = in / W::ELEMS, end = v1 < 0 ? vecs : v1, xvecs = in / 8;
  const uint4* wr[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) wr[r] = reinterpret_cast<const uint4*>(w + rows[r] * in);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  // Q8_0: each row's block scales (one f16 per 32 weights).
  const __half* sr[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
    sr[r] = W::SCALE == WScale::Block32 ? scales_after<__half>(w, total_rows, in) + rows[r] * (in / 32) : nullptr;
  __shared__ uint4 s_x[SHARED_X ? N * XIN / 8 : 1];
  const uint4* xd = SHARED_X ? s_x : xr;
  // After the weights' first loads: wait for the previous kernel, then
  // what depends on it (the staged x, the norm's scales).
  auto after_wait = [&]() {
    pdl_wait();
    pdl_launch_dependents();
    if constexpr (SHARED_X) {
      StagedX<N, XIN> staged;
      staged.load(xr, N * xvecs);
      if (NORM) parts.load(norm);
      staged.store(s_x, N * xvecs);
    } else if (NORM) {
      norm_scales<N>(norm, in, s_inv);
    }
  };
  bool done = false;
  if constexpr (WHOLE > 0) {
    if (end - v0 <= 32 * WHOLE) {
      uint4 all[ROWS][WHOLE];
      VecScales<W, ROWS, WHOLE> all_s;
      load_batch<ROWS, WHOLE>(wr, v0 + lane, end, all);
      all_s.load(sr, v0 + lane, end);
      after_wait();
      dot_batch<N, ROWS, W, WHOLE, SHARED_X>(all, all_s, xd, v0 + lane, end, xvecs, acc);
      done = true;
    }
  }
  if (!done) {
    uint4 cur[ROWS][U];
    VecScales<W, ROWS, U> cur_s;
    load_batch<ROWS, U>(wr, v0 + lane, end, cur);
    cur_s.load(sr, v0 + lane, end);
    after_wait();
    for (int base = v0 + lane; base < end; base += 32 * U) {
      uint4 next[ROWS][U];
      VecScales<W, ROWS, U> next_s;
      load_batch<ROWS, U>(wr, base + 32 * U, end, next);
      next_s.load(sr, base + 32 * U, end);
      dot_batch<N, ROWS, W, U, SHARED_X>(cur, cur_s, xd, base, end, xvecs, acc);
      cur_s = next_s;
#pragma unroll
      for (int r = 0; r < ROWS; ++r)
#pragma unroll
        for (int u = 0; u < U; ++u) cur[r][u] = next[r][u];
    }
  }
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int n = 0; n < N; ++n) acc[r][n] = warp_sum(acc[r][n]);
  if constexpr (W::SCALE == WScale::Row) {
    const float* scales = scales_after<float>(w, total_rows, in);
#pragma unroll
    for (int r = 0; r < ROWS; ++r) {
      const float s = __ldg(scales + rows[r]);
#pragma unroll
      for (int n = 0; n < N; ++n) acc[r][n] *= s;
    }
  }
  if (NORM) {
    if constexpr (SHARED_X) parts.finish(norm, in, s_inv);
    __syncthreads();
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int n = 0; n < N; ++n) acc[r][n] *= s_inv[n];
  }
}

// The warp's output column; out-of-range warps compute a duplicate and skip
// the write (they still take part in PDL and the block's barriers).
__device__ __forceinline__ int warp_column() { return blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5); }

// After an accumulating GEMV: this block's part of sum(x[n]^2) over the
// updated residual rows into sumsq (see SumSq). `sq[n]` is this warp's
// columns squared (lane 0 of each warp; 0 elsewhere). Every thread of the
// block must call it.
template <int N>
__device__ __forceinline__ void gemv_sumsq(SumSq* sumsq, const float (&sq)[N]) {
  __shared__ float s_sq[GEMV_WARPS][N];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0)
#pragma unroll
    for (int n = 0; n < N; ++n) s_sq[warp][n] = sq[n];
  __syncthreads();
  if (threadIdx.x < N) {
    float t = 0.f;
#pragma unroll
    for (int w = 0; w < GEMV_WARPS; ++w) t += s_sq[w][threadIdx.x];
    sumsq->partial[threadIdx.x][blockIdx.x] = t;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) sumsq->blocks = gridDim.x;
}

// Rows a warp of gemv_plain: two for the 4- to 6-bit types at batch 1 (the
// rows share each load and conversion of the activations: o_proj and down
// of the 8B 10-20 % faster, bench_gemv.py), else one. The host's grid
// follows (`Gemm::plain_grid` in gemm/gemv.rs). A pair never straddles two
// segments of a k-quant matrix: their first rows are even (head sizes).
template <typename W, int N>
__host__ __device__ constexpr int plain_rows() {
  return W::SCALE == WScale::Kq && N == 1 ? 2 : 1;
}

// MODE 0: bf16 out, 1: f32 out, 2: f32 accumulate (and, with sumsq, the
// updated rows' sums of squares for the next fused RMSNorm; with next_norm,
// also xg = bf16(y ⊙ next_norm), that norm's pre-scaled input).
template <int N, int MODE, bool NORM = false, typename W = Bf16W, int U = W::ROW_UNROLL, int WHOLE = 0,
          int XIN = SHORT_ROW_INPUTS>
__device__ __forceinline__ void gemv_plain(const bf16* x, const typename W::T* w, void* y, int in, int out, SumSq* sumsq,
                                           const float* next_norm, bf16* xg, NormIn norm = {}) {
  constexpr int R = plain_rows<W, N>();
  const int first = R * warp_column();
  size_t rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = (size_t)min(first + r, out - 1);
  float acc[R][N];
  gemv_rows<N, R, NORM, W, U, WHOLE, XIN>(x, w, in, out, rows, acc, norm);
  const bool writer = (threadIdx.x & 31) == 0;
  float sq[N];
#pragma unroll
  for (int n = 0; n < N; ++n) sq[n] = 0.f;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int col = first + r;
    if (!writer || col >= out) continue;
    // Accumulating: every row's residual and the norm weight loaded before
    // the first store (the compiler cannot move a load above a store that
    // may alias it: N dependent round trips otherwise).
    float old[N];
    float g = 0.f;
    if constexpr (MODE == 2) {
#pragma unroll
      for (int n = 0; n < N; ++n) old[n] = reinterpret_cast<const float*>(y)[(size_t)n * out + col];
      if (next_norm) g = next_norm[col];
    }
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const size_t o = (size_t)n * out + col;
      if (MODE == 0) reinterpret_cast<bf16*>(y)[o] = to_bf16(acc[r][n]);
      else if (MODE == 1) reinterpret_cast<float*>(y)[o] = acc[r][n];
      else {
        const float v = old[n] + acc[r][n];
        reinterpret_cast<float*>(y)[o] = v;
        sq[n] += v * v;
        if (next_norm) xg[o] = to_bf16(v * g);
      }
    }
  }
  if (MODE == 2 && sumsq) gemv_sumsq<N>(sumsq, sq);
}

// COLS: output columns a warp (its rows: gate and up of each). Two for the
// 4-bit k-quant kernels built for one type at batch 1 (gemv_kq.cu): four
// rows share each activation load, and the 8B's Q4_K gate/up took 25.2 us
// against 33.8 for the kernel of every type, one column (Q4_0 24.3 / 33.0,
// Q4_1 25.6 / 33.5; tests/gpu/bench_gemv.py, docs/perf/native-gguf.md).
// With every type compiled in, two columns took 184 registers (one block
// an SM) and 31.6 us.
template <int N, bool NORM = false, bool GELU = false, typename W = Bf16W, int U = W::GATED_UNROLL, int COLS = 1,
          int WHOLE = 0>
__device__ __forceinline__ void gemv_swiglu(const bf16* x, const typename W::T* w, bf16* y, int in, int ff,
                                            NormIn norm = {}) {
  const int first = COLS * warp_column();
  size_t rows[2 * COLS];
#pragma unroll
  for (int c = 0; c < COLS; ++c) {
    rows[2 * c] = (size_t)min(first + c, ff - 1);
    rows[2 * c + 1] = rows[2 * c] + ff;
  }
  float acc[2 * COLS][N];
  gemv_rows<N, 2 * COLS, NORM, W, U, WHOLE>(x, w, in, 2 * (size_t)ff, rows, acc, norm);
  if ((threadIdx.x & 31) != 0) return;
#pragma unroll
  for (int c = 0; c < COLS; ++c) {
    if (first + c >= ff) continue;
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const float g = acc[2 * c][n];
      y[(size_t)n * ff + first + c] = to_bf16((GELU ? gelu_tanh(g) : g / (1.f + __expf(-g))) * acc[2 * c + 1][n]);
    }
  }
}

// Columns are rotary pairs: (H + 2 KVH) heads x hd / 2. At batch 1 each
// lane keeps one load a row in flight (its two rows are already two): the
// 8B's q/k/v took 11.0 us (FP8) and 19.0 us (bf16) so against 12.8 and 21.1
// with two (tests/gpu/bench_gemv.py, docs/perf/fp8.md). WHOLE: loads over
// both rows for gemv_rows' whole-row path (0: none).
template <int N, bool NORM = false, typename W = Bf16W, int WHOLE = 0, int U = (N == 1 ? 1 : W::ROW_UNROLL)>
__device__ __forceinline__ void gemv_qkv_rope(const bf16* x, const typename W::T* w, int in, const float* bias,
                                              const int* positions, const long long* slots, const float* cos_t,
                                              const float* sin_t, bf16* q_out, bf16* k_cache, bf16* v_cache,
                                              int num_heads, int num_kv_heads, int hd, int block_size,
                                              NormIn norm = {}) {
  // Two warps per rotary pair, each over half of the input: twice the
  // warps of one per pair, so the grid divides into the resident slots
  // evenly (an 8B-class q/k/v, 3,072 pairs, filled 1.45 waves otherwise).
  const int half = hd / 2, pairs = (num_heads + 2 * num_kv_heads) * half;
  const int task = warp_column(), col = task >> 1, part = task & 1;
  const int c = min(col, pairs - 1);
  const int head = c / half, i = c % half;
  const size_t rows[2] = {(size_t)head * hd + i, (size_t)head * hd + i + half};
  float acc[2][N];
  const int mid = in / W::ELEMS / 2;
  gemv_rows<N, 2, NORM, W, U, WHOLE / 2>(x, w, in, 2 * (size_t)pairs, rows, acc, norm, part ? mid : 0,
                                          part ? -1 : mid);
  __shared__ float s_upper[GEMV_WARPS / 2][2][N];
  const int lane = threadIdx.x & 31, pair_slot = (threadIdx.x >> 5) >> 1;
  if (part && lane == 0)
#pragma unroll
    for (int n = 0; n < N; ++n) {
      s_upper[pair_slot][0][n] = acc[0][n];
      s_upper[pair_slot][1][n] = acc[1][n];
    }
  __syncthreads();
  if (part || lane != 0 || col >= pairs) return;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    acc[0][n] += s_upper[pair_slot][0][n];
    acc[1][n] += s_upper[pair_slot][1][n];
  }
  const float b0 = bias ? bias[rows[0]] : 0.f, b1 = bias ? bias[rows[1]] : 0.f;
  // Every row's slot and rotation loaded before the first store (see
  // gemv_plain: stores that may alias would serialise N round trips).
  const bool is_v = head >= num_heads + num_kv_heads;
  long long slot[N];
  float cs[N], sn[N];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    slot[n] = slots[n];
    if (!is_v) {
      const size_t p = (size_t)positions[n] * half + i;
      cs[n] = cos_t[p];
      sn[n] = sin_t[p];
    }
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const float a = acc[0][n] + b0, b = acc[1][n] + b1;
    const long long block = slot[n] / block_size;
    const int offset = (int)(slot[n] % block_size);
    if (is_v) {
      bf16* v = v_cache + kv_index(block, head - num_heads - num_kv_heads, offset, num_kv_heads, block_size, hd);
      v[i] = to_bf16(a);
      v[i + half] = to_bf16(b);
      continue;
    }
    bf16* dst = head < num_heads
                    ? q_out + (size_t)n * num_heads * hd + (size_t)head * hd
                    : k_cache + kv_index(block, head - num_heads, offset, num_kv_heads, block_size, hd);
    dst[i] = to_bf16(a * cs[n] - b * sn[n]);
    dst[i + half] = to_bf16(b * cs[n] + a * sn[n]);
  }
}

#define GEMV_KERNELS(N, W, PRE, WH)                                                                                       \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                                  \
      gemv##PRE##_n##N##_bf16(const bf16* x, const W::T* w, void* y, int in, int out, SumSq* sumsq,               \
                          const float* next_norm, bf16* xg) {                   \
    gemv_plain<N, 0, false, W, W::ROW_UNROLL, WH>(x, w, y, in, out, sumsq, next_norm, xg);                                                                   \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                                  \
      gemv##PRE##_n##N##_f32(const bf16* x, const W::T* w, void* y, int in, int out, SumSq* sumsq,               \
                          const float* next_norm, bf16* xg) {                    \
    gemv_plain<N, 1, false, W, W::ROW_UNROLL, WH>(x, w, y, in, out, sumsq, next_norm, xg);                                                                   \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                                  \
      gemv##PRE##_n##N##_add_f32(const bf16* x, const W::T* w, void* y, int in, int out, SumSq* sumsq,               \
                          const float* next_norm, bf16* xg) {                \
    gemv_plain<N, 2, false, W, W::ROW_UNROLL, WH>(x, w, y, in, out, sumsq, next_norm, xg);                                                                   \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                                  \
      gemv##PRE##_n##N##_swiglu(const bf16* x, const W::T* w, void* y, int in, int out) {                               \
    gemv_swiglu<N, false, false, W, W::GATED_UNROLL, 1, WH / 2>(x, w, reinterpret_cast<bf16*>(y), in, out);                                                   \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                                  \
      gemv##PRE##_n##N##_geglu(const bf16* x, const W::T* w, void* y, int in, int out) {                                \
    gemv_swiglu<N, false, true, W, W::GATED_UNROLL, 1, WH / 2>(x, w, reinterpret_cast<bf16*>(y), in, out);                                      \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                                  \
      gemv##PRE##_n##N##_geglu_norm(const bf16* xg, float eps, const SumSq* sumsq, const W::T* w, void* y, int in,      \
                             int out) {                                                                          \
    gemv_swiglu<N, true, true, W, W::GATED_UNROLL, 1, WH / 2>(xg, w, reinterpret_cast<bf16*>(y), in, out, NormIn{eps, sumsq});                 \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv##PRE##_n##N##_qkv_rope(                            \
      const bf16* x, const W::T* w, int in, const float* bias, const int* positions, const long long* slots,    \
      const float* cos_t, const float* sin_t, bf16* q_out, bf16* k_cache, bf16* v_cache, int num_heads,         \
      int num_kv_heads, int hd, int block_size) {                                                                \
    gemv_qkv_rope<N, false, W, WH>(x, w, in, bias, positions, slots, cos_t, sin_t, q_out, k_cache, v_cache, num_heads,        \
                     num_kv_heads, hd, block_size);                                                              \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                                  \
      gemv##PRE##_n##N##_bf16_norm(const bf16* xg, float eps, const SumSq* sumsq, const W::T* w, void* y, int in,       \
                            int out) {                                                                           \
    gemv_plain<N, 0, true, W, W::ROW_UNROLL, WH>(xg, w, y, in, out, nullptr, nullptr, nullptr, NormIn{eps, sumsq});                   \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                                  \
      gemv##PRE##_n##N##_swiglu_norm(const bf16* xg, float eps, const SumSq* sumsq, const W::T* w, void* y, int in,     \
                              int out) {                                                                         \
    gemv_swiglu<N, true, false, W, W::GATED_UNROLL, 1, WH / 2>(xg, w, reinterpret_cast<bf16*>(y), in, out, NormIn{eps, sumsq});                      \
  }                                                                                                              \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv##PRE##_n##N##_qkv_rope_norm(                       \
      const bf16* xg, float eps, const SumSq* sumsq, const W::T* w, int in, const float* bias,                   \
      const int* positions, const long long* slots, const float* cos_t, const float* sin_t, bf16* q_out,        \
      bf16* k_cache, bf16* v_cache, int num_heads, int num_kv_heads, int hd, int block_size) {                   \
    gemv_qkv_rope<N, true, W, WH>(xg, w, in, bias, positions, slots, cos_t, sin_t, q_out, k_cache, v_cache, num_heads,  \
                           num_kv_heads, hd, block_size, NormIn{eps, sumsq});                                    \
  }
