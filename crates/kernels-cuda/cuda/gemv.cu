// Skinny GEMMs for decode at small batch: y[n, out] = x[n, in] · w[out, in]ᵀ
// for n <= 8. One warp streams one weight row with 16-byte loads (4 in
// flight per lane) and applies it to every x row; at this shape the
// weights are read exactly once and the kernel runs at memory speed.
//   MODE 0: y bf16;  MODE 1: y f32;  MODE 2: y f32 += (residual stream).
//   SILU: x is the [n, 2 * in] gate/up output and the input is
//         silu(gate) * up, computed in f32 on the fly (fuses the MLP's
//         activation into down_proj).
#include "common.cuh"

constexpr int GEMV_WARPS = 8;

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

// silu(gate) * up for 8 consecutive elements, as bf16 pairs for dot8.
__device__ __forceinline__ uint4 silu_mul8(const uint4& g, const uint4& u) {
  uint4 r;
  const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&g);
  const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&u);
  __nv_bfloat162* r2 = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(g2[i]);
    const float2 b = __bfloat1622float2(u2[i]);
    r2[i] = __floats2bfloat162_rn(a.x / (1.f + __expf(-a.x)) * b.x, a.y / (1.f + __expf(-a.y)) * b.y);
  }
  return r;
}

template <int N, int MODE, bool SILU, int UNROLL>
__device__ __forceinline__ void gemv(const bf16* __restrict__ x, const bf16* __restrict__ w, void* __restrict__ y,
                                     int in, int out) {
  const int lane = threadIdx.x & 31;
  const int row = min(blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5), out - 1);
  const int vecs = in / 8;
  const uint4* wr = reinterpret_cast<const uint4*>(w + (size_t)row * in);
  const uint4* xr = reinterpret_cast<const uint4*>(x);
  const int xstride = SILU ? 2 * vecs : vecs;
  // Weights do not depend on the previous kernel: the first loads go out
  // before waiting for it (with PDL this overlaps the previous kernel's tail).
  uint4 wv[UNROLL];
#pragma unroll
  for (int u = 0; u < UNROLL; ++u) {
    const int i = lane + u * 32;
    wv[u] = i < vecs ? __ldcs(wr + i) : make_uint4(0, 0, 0, 0);
  }
  pdl_wait();
  pdl_launch_dependents();
  float acc[N];
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n] = 0.f;
  for (int base = lane; base < vecs; base += 32 * UNROLL) {
    // Software pipeline: the next batch of weights is in flight while this
    // one is used.
    uint4 next[UNROLL];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + 32 * UNROLL + u * 32;
      next[u] = i < vecs ? __ldcs(wr + i) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const int i = base + u * 32;
      if (i >= vecs) break;
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const uint4* xn = xr + (size_t)n * xstride + i;
        dot8(wv[u], SILU ? silu_mul8(__ldg(xn), __ldg(xn + vecs)) : __ldg(xn), acc[n]);
      }
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) wv[u] = next[u];
  }
#pragma unroll
  for (int n = 0; n < N; ++n) acc[n] = warp_sum(acc[n]);
  if (lane == 0 && blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5) < out) {
#pragma unroll
    for (int n = 0; n < N; ++n) {
      const size_t o = (size_t)n * out + row;
      if (MODE == 0) reinterpret_cast<bf16*>(y)[o] = to_bf16(acc[n]);
      else if (MODE == 1) reinterpret_cast<float*>(y)[o] = acc[n];
      else reinterpret_cast<float*>(y)[o] += acc[n];
    }
  }
}

#define GEMV_KERNEL(N, MODE, NAME)                                                                     \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                        \
      gemv_n##N##_##NAME(const bf16* x, const bf16* w, void* y, int in, int out) {                     \
    gemv<N, MODE, false, 4>(x, w, y, in, out);                                                         \
  }                                                                                                    \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                        \
      gemv8_n##N##_##NAME(const bf16* x, const bf16* w, void* y, int in, int out) {                    \
    gemv<N, MODE, false, 8>(x, w, y, in, out);                                                         \
  }
#define GEMV_MODES(N)                                                                          \
  GEMV_KERNEL(N, 0, bf16)                                                                      \
  GEMV_KERNEL(N, 1, f32)                                                                       \
  GEMV_KERNEL(N, 2, add_f32)                                                                   \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                \
      gemv_n##N##_silu_add_f32(const bf16* gate_up, const bf16* w, void* y, int in, int out) { \
    gemv<N, 2, true, 4>(gate_up, w, y, in, out);                                               \
  }                                                                                            \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                \
      gemv8_n##N##_silu_add_f32(const bf16* gate_up, const bf16* w, void* y, int in, int out) { \
    gemv<N, 2, true, 8>(gate_up, w, y, in, out);                                               \
  }
GEMV_MODES(1)
GEMV_MODES(2)
GEMV_MODES(3)
GEMV_MODES(4)
GEMV_MODES(5)
GEMV_MODES(6)
GEMV_MODES(7)
GEMV_MODES(8)
