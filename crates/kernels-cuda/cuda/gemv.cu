// Skinny GEMMs for decode at small batch: y[n, out] = x[n, in] · w[out, in]ᵀ
// for n <= 8. One warp streams one weight row (two for SwiGLU) with 16-byte
// loads, software-pipelined so the next loads are in flight while the
// current ones are used, and applies it to every x row. At this shape the
// weights are read exactly once and the kernel runs at memory speed.
//   MODE 0: y bf16;  MODE 1: y f32;  MODE 2: y f32 += (residual stream);
//   MODE 3 (SwiGLU): w is the fused [2 * out, in] gate/up matrix; the warp
//     for column i reads gate row i and up row out + i and writes
//     y[n, i] = silu(gate) * up in bf16: the MLP activation costs no kernel.
#include "common.cuh"

constexpr int GEMV_WARPS = 8;
constexpr int GEMV_UNROLL = 4;

__device__ __forceinline__ void dot8(const uint4& wv, const uint4& xv, float& acc) {
  const __nv_bfloat162* w2 = reinterpret_cast<const __nv_bfloat162*>(&wv);
  const __nv_bfloat162* x2 = reinterpret_cast<const __nv_bfloat162*>(&xv);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(w2[i]);
    const float2 b = __bfloat1622float2(x2[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
}

template <int ROWS>
__device__ __forceinline__ void load_batch(const uint4* const (&wr)[ROWS], int base, int vecs,
                                           uint4 (&dst)[ROWS][GEMV_UNROLL]) {
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; ++u) {
      const int i = base + u * 32;
      dst[r][u] = i < vecs ? __ldcs(wr[r] + i) : make_uint4(0, 0, 0, 0);
    }
}

template <int N, int MODE>
__device__ __forceinline__ void gemv(const bf16* __restrict__ x, const bf16* __restrict__ w, void* __restrict__ y,
                                     int in, int out) {
  constexpr int ROWS = MODE == 3 ? 2 : 1;
  const int lane = threadIdx.x & 31;
  const int col = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
  const int row = min(col, out - 1);
  const int vecs = in / 8;
  const uint4* wr[ROWS];
#pragma unroll
  for (int r = 0; r < ROWS; ++r) wr[r] = reinterpret_cast<const uint4*>(w + ((size_t)row + r * out) * in);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  // Weights do not depend on the previous kernel: the first loads go out
  // before waiting for it (with PDL this overlaps the previous kernel's tail).
  uint4 cur[ROWS][GEMV_UNROLL];
  load_batch<ROWS>(wr, lane, vecs, cur);
  pdl_wait();
  pdl_launch_dependents();
  float acc[ROWS][N];
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int n = 0; n < N; ++n) acc[r][n] = 0.f;
  for (int base = lane; base < vecs; base += 32 * GEMV_UNROLL) {
    uint4 next[ROWS][GEMV_UNROLL];
    load_batch<ROWS>(wr, base + 32 * GEMV_UNROLL, vecs, next);
#pragma unroll
    for (int u = 0; u < GEMV_UNROLL; ++u) {
      const int i = base + u * 32;
      if (i >= vecs) break;
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const uint4 xv = __ldg(xr + (size_t)n * vecs + i);
#pragma unroll
        for (int r = 0; r < ROWS; ++r) dot8(cur[r][u], xv, acc[r][n]);
      }
    }
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
#pragma unroll
      for (int u = 0; u < GEMV_UNROLL; ++u) cur[r][u] = next[r][u];
  }
#pragma unroll
  for (int r = 0; r < ROWS; ++r)
#pragma unroll
    for (int n = 0; n < N; ++n) acc[r][n] = warp_sum(acc[r][n]);
  if (lane != 0 || col >= out) return;
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const size_t o = (size_t)n * out + row;
    if (MODE == 0) {
      reinterpret_cast<bf16*>(y)[o] = to_bf16(acc[0][n]);
    } else if (MODE == 1) {
      reinterpret_cast<float*>(y)[o] = acc[0][n];
    } else if (MODE == 2) {
      reinterpret_cast<float*>(y)[o] += acc[0][n];
    } else {
      const float g = acc[0][n];
      reinterpret_cast<bf16*>(y)[o] = to_bf16(g / (1.f + __expf(-g)) * acc[ROWS - 1][n]);
    }
  }
}

#define GEMV_KERNEL(N, MODE, NAME)                                                 \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                    \
      gemv_n##N##_##NAME(const bf16* x, const bf16* w, void* y, int in, int out) { \
    gemv<N, MODE>(x, w, y, in, out);                                               \
  }
#define GEMV_MODES(N)         \
  GEMV_KERNEL(N, 0, bf16)     \
  GEMV_KERNEL(N, 1, f32)      \
  GEMV_KERNEL(N, 2, add_f32)  \
  GEMV_KERNEL(N, 3, swiglu)
GEMV_MODES(1)
GEMV_MODES(2)
GEMV_MODES(3)
GEMV_MODES(4)
GEMV_MODES(5)
GEMV_MODES(6)
GEMV_MODES(7)
GEMV_MODES(8)
