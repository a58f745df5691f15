// Candidate batch-1 k-quant GEMVs for tests/gpu/bench_gemv.py: the same
// templates as gemv_kq.cu's kernels with the knobs that decide their speed
// set per kernel. Named x{mode}k_{variant}: mode a (add_f32: o_proj, down),
// f (f32: the LM head), s (swiglu_norm: gate/up), q (qkv_rope_norm);
// variant r0u1: the production kernel (KqW); r0u2: two loads a row in
// flight; t4u1/t4u2, t6u1: compiled for Q4_K (Q6_K) alone, one or two
// loads a row in flight; t4b4/t6b3: the same capped for 4 (3) resident
// blocks an SM; t4cN: Q4_K alone, N gate/up columns a warp (2N rows
// sharing each activation load; the grid divides by N); r0c2: every type,
// two columns.
//
//   nvcc -O3 -std=c++17 --use_fast_math -cubin -arch=sm_90 \
//     -I crates/kernels-cuda/cuda -o DIR/kqx.cubin tests/gpu/gemv_kq_variants.cu
#define GEMV_NO_INSTANCES
#include "gemv_kq.cu"

#define XA(NAME, W, U)                                                                                         \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                               \
      NAME(const bf16* x, const KqMatrix* w, void* y, int in, int out, SumSq* sumsq, const float* next_norm,    \
           bf16* xg) {                                                                                           \
    gemv_plain<1, 2, false, W, U>(x, w, y, in, out, sumsq, next_norm, xg);                                       \
  }
#define XF(NAME, W, U)                                                                                         \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                               \
      NAME(const bf16* x, const KqMatrix* w, void* y, int in, int out, SumSq* sumsq, const float* next_norm,    \
           bf16* xg) {                                                                                           \
    gemv_plain<1, 1, false, W, U>(x, w, y, in, out, sumsq, next_norm, xg);                                       \
  }
#define XS(NAME, W, U)                                                                                         \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                               \
      NAME(const bf16* xg, float eps, const SumSq* sumsq, const KqMatrix* w, void* y, int in, int out) {        \
    gemv_swiglu<1, true, false, W, U>(xg, w, reinterpret_cast<bf16*>(y), in, out, NormIn{eps, sumsq});          \
  }
#define XQ(NAME, W, U)                                                                                         \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) NAME(                                         \
      const bf16* xg, float eps, const SumSq* sumsq, const KqMatrix* w, int in, const float* bias,              \
      const int* positions, const long long* slots, const float* cos_t, const float* sin_t, bf16* q_out,        \
      bf16* k_cache, bf16* v_cache, int num_heads, int num_kv_heads, int hd, int block_size) {                   \
    gemv_qkv_rope<1, true, W, 0, U>(xg, w, in, bias, positions, slots, cos_t, sin_t, q_out, k_cache, v_cache,    \
                                    num_heads, num_kv_heads, hd, block_size, NormIn{eps, sumsq});                \
  }

#define XS2(NAME, W, U, COLS)                                                                                  \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                               \
      NAME(const bf16* xg, float eps, const SumSq* sumsq, const KqMatrix* w, void* y, int in, int out) {        \
    gemv_swiglu<1, true, false, W, U, COLS>(xg, w, reinterpret_cast<bf16*>(y), in, out, NormIn{eps, sumsq});    \
  }

typedef KqWOf<1u << KQ_Q4_K> KqW4;
typedef KqWOf<1u << KQ_Q6_K> KqW6;
#define XSB(NAME, W, U, B)                                                                                     \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, B)                                            \
      NAME(const bf16* xg, float eps, const SumSq* sumsq, const KqMatrix* w, void* y, int in, int out) {        \
    gemv_swiglu<1, true, false, W, U>(xg, w, reinterpret_cast<bf16*>(y), in, out, NormIn{eps, sumsq});          \
  }
#define XAB(NAME, W, U, B)                                                                                     \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32, B)                                            \
      NAME(const bf16* x, const KqMatrix* w, void* y, int in, int out, SumSq* sumsq, const float* next_norm,    \
           bf16* xg) {                                                                                           \
    gemv_plain<1, 2, false, W, U>(x, w, y, in, out, sumsq, next_norm, xg);                                       \
  }
XS(xsk_t4u1, KqW4, 1)
XSB(xsk_t4b4, KqW4, 1, 4)
XAB(xak_t4b4, KqW4, 1, 4)
XAB(xak_t6b3, KqW6, 1, 3)
XS(xsk_t4u2, KqW4, 2)
XS2(xsk_t4c2, KqW4, 1, 2)
XA(xak_t4u1, KqW4, 1)
XA(xak_t6u1, KqW6, 1)
XA(xak_t4u2, KqW4, 2)
XA(xak_t6u2, KqW6, 2)
XF(xfk_t6u1, KqW6, 1)
XQ(xqk_t4u1, KqW4, 1)

XA(xak_r0u1, KqW, 1)
XA(xak_r0u2, KqW, 2)
XF(xfk_r0u1, KqW, 1)
XF(xfk_r0u2, KqW, 2)
XS(xsk_r0u1, KqW, 1)
XS(xsk_r0u2, KqW, 2)
XQ(xqk_r0u1, KqW, 1)
XQ(xqk_r0u2, KqW, 2)
XS2(xsk_r0c2, KqW, 1, 2)
XS2(xsk_t4c3, KqW4, 1, 3)
XS2(xsk_t4c4, KqW4, 1, 4)
typedef KqWOf<(1u << KQ_Q4_K) | (1u << KQ_Q5_K) | (1u << KQ_Q4_0) | (1u << KQ_Q4_1)> KqW45;
XS2(xsk_t5c2, KqW45, 1, 2)

// Accumulating plain GEMV with SPLIT warps a pair of rows, each over its
// part of the input's vectors, the parts summed in order through shared
// memory (as gemv_qkv_rope's two warps a rotary pair): twice the warps of
// the down projection's 2,048, each with half the loads.
template <typename W, int SPLIT>
__device__ __forceinline__ void plain_add_split(const bf16* x, const KqMatrix* w, float* y, int in, int out) {
  constexpr int R = 2;
  const int task = warp_column(), pair = task / SPLIT, part = task % SPLIT;
  const int first = R * pair, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  size_t rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = (size_t)min(first + r, out - 1);
  const int per = in / 32 / SPLIT;
  float acc[R][1];
  gemv_rows<1, R, false, W, 1>(x, w, in, out, rows, acc, {}, part * per, part == SPLIT - 1 ? -1 : (part + 1) * per);
  __shared__ float s_part[GEMV_WARPS][R];
  if (lane == 0)
#pragma unroll
    for (int r = 0; r < R; ++r) s_part[warp][r] = acc[r][0];
  __syncthreads();
  if (part != 0 || lane != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (first + r >= out) continue;
    float v = 0.f;
#pragma unroll
    for (int p = 0; p < SPLIT; ++p) v += s_part[warp + p][r];
    y[first + r] += v;
  }
}
#define XAS(NAME, W, SPLIT)                                                                                    \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                               \
      NAME(const bf16* x, const KqMatrix* w, void* y, int in, int out, SumSq* sumsq, const float* next_norm,    \
           bf16* xg) {                                                                                           \
    plain_add_split<W, SPLIT>(x, w, reinterpret_cast<float*>(y), in, out);                                      \
  }
XAS(xak_r0s2, KqW, 2)
XAS(xak_t4s2, KqW4, 2)
XAS(xak_t6s2, KqW6, 2)
