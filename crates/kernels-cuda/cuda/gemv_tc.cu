// GEMVs of 2 to 8 rows on tensor cores: y[n, out] = x[n, in] · w[out, in]ᵀ
// for bf16 w (`cuda.tc_gemv`). On CUDA cores (gemv.cuh) every weight costs
// a conversion and an FMA per batch row, which bounds the 8B's GEMVs of
// several rows (4 rows: 1.38x one row's time); here a warp's mma.sync
// m16n8k16 takes 16 weight rows against all 8 batch columns at once and
// the kernel streams weights at memory speed whatever the row count.
//
// A block owns 16 output rows; its 8 warps split the inputs in chunks of
// 32 (chunk c to warp c mod 8) and sum their partial tiles in shared
// memory in warp order (a fixed order). Lane (g, t) = (lane / 4, lane % 4)
// loads 8 contiguous weights of rows g and g + 8 and 8 inputs of batch
// row g at offset 8t of a chunk, 16 bytes each: no layout change of w.
// The mma's k order is permuted the same way for both operands (its
// logical k 2t, 2t+1, 2t+8, 2t+9 of step s are the lane's elements 4s to
// 4s+3), so each lane's 16-byte loads are its fragments as they come.
// Batch rows past n are zero columns. Modes: bf16 out, f32 out, f32
// accumulate (y += x·wᵀ).
#include "mma.cuh"

constexpr int TC_WARPS = 8;
constexpr int TC_UNROLL = 4;

template <int N, int MODE>
__device__ __forceinline__ void gemv_tc(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                        void* __restrict__ y, int in, int out) {
  __shared__ float part[TC_WARPS][16][8];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, t = lane & 3;
  const int row0 = blockIdx.x * 16, chunks = in / 32;
  // A chunk is 4 vectors of 8 a row; the lane's is vector t.
  const uint4* wa = reinterpret_cast<const uint4*>(w + (size_t)(row0 + g) * in) + t;
  const uint4* wb = reinterpret_cast<const uint4*>(w + (size_t)(row0 + g + 8) * in) + t;
  const bool has_x = g < N;
  const uint4* xr = reinterpret_cast<const uint4*>(x + (size_t)(has_x ? g : 0) * in) + t;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint4 a0[TC_UNROLL], a1[TC_UNROLL];
  // The weights do not depend on the kernel before: the first loads go
  // out before the PDL wait.
#pragma unroll
  for (int u = 0; u < TC_UNROLL; ++u) {
    const int c = warp + u * TC_WARPS;
    a0[u] = c < chunks ? __ldcs(wa + 4 * (size_t)c) : zero;
    a1[u] = c < chunks ? __ldcs(wb + 4 * (size_t)c) : zero;
  }
  pdl_begin();
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  for (int base = warp; base < chunks; base += TC_WARPS * TC_UNROLL) {
    uint4 xb[TC_UNROLL], n0[TC_UNROLL], n1[TC_UNROLL];
#pragma unroll
    for (int u = 0; u < TC_UNROLL; ++u) {
      const int c = base + u * TC_WARPS;
      xb[u] = has_x && c < chunks ? __ldg(xr + 4 * (size_t)c) : zero;
    }
#pragma unroll
    for (int u = 0; u < TC_UNROLL; ++u) {
      const int c = base + (TC_UNROLL + u) * TC_WARPS;
      n0[u] = c < chunks ? __ldcs(wa + 4 * (size_t)c) : zero;
      n1[u] = c < chunks ? __ldcs(wb + 4 * (size_t)c) : zero;
    }
#pragma unroll
    for (int u = 0; u < TC_UNROLL; ++u) {
      const unsigned s0[4] = {a0[u].x, a1[u].x, a0[u].y, a1[u].y};
      const unsigned s1[4] = {a0[u].z, a1[u].z, a0[u].w, a1[u].w};
      mma_bf16(acc, s0, xb[u].x, xb[u].y);
      mma_bf16(acc, s1, xb[u].z, xb[u].w);
      a0[u] = n0[u];
      a1[u] = n1[u];
    }
  }
  // acc: rows g and g + 8, batch columns 2t and 2t + 1.
  part[warp][g][2 * t] = acc[0];
  part[warp][g][2 * t + 1] = acc[1];
  part[warp][g + 8][2 * t] = acc[2];
  part[warp][g + 8][2 * t + 1] = acc[3];
  __syncthreads();
  const int j = threadIdx.x, n = j >> 4, r = j & 15;
  if (n >= N) return;
  float v = 0.f;
#pragma unroll
  for (int k = 0; k < TC_WARPS; ++k) v += part[k][r][n];
  const size_t at = (size_t)n * out + row0 + r;
  if constexpr (MODE == 0) reinterpret_cast<bf16*>(y)[at] = __float2bfloat16(v);
  else if constexpr (MODE == 1) reinterpret_cast<float*>(y)[at] = v;
  else reinterpret_cast<float*>(y)[at] += v;
}

#define GEMV_TC(N)                                                                                        \
  extern "C" __global__ void __launch_bounds__(256) gemv_tc_n##N##_bf16(const bf16* x, const bf16* w,     \
                                                                        void* y, int in, int out) {       \
    gemv_tc<N, 0>(x, w, y, in, out);                                                                      \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(256) gemv_tc_n##N##_f32(const bf16* x, const bf16* w,      \
                                                                       void* y, int in, int out) {        \
    gemv_tc<N, 1>(x, w, y, in, out);                                                                      \
  }                                                                                                       \
  extern "C" __global__ void __launch_bounds__(256) gemv_tc_n##N##_add_f32(const bf16* x, const bf16* w,  \
                                                                           void* y, int in, int out) {    \
    gemv_tc<N, 2>(x, w, y, in, out);                                                                      \
  }

GEMV_TC(2)
GEMV_TC(3)
GEMV_TC(4)
GEMV_TC(5)
GEMV_TC(6)
GEMV_TC(7)
GEMV_TC(8)
