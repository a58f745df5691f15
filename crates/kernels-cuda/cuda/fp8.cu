// FP8 (e4m3) weights, `--quantization fp8`. A quantized matrix is stored as
// its rows of e4m3 bytes, then, at the next 256-byte boundary, one f32
// scale per row (absmax / 448, e4m3's largest finite value): the GEMV
// kernels (gemv.cu, fp8_row_scales) and cuBLASLt's per-channel scaling
// read it in that layout.
//
//   quantize_rows_e4m3: q[r, :] = e4m3(x[r, :] / s[r]), s[r] = max|x[r, :]| / 448
//                       for bf16 rows x; one block per row. Weights at load
//                       (written as above) and activations before an FP8
//                       GEMM (per-token scales).
//   fp8_scale_out:      y (=, or += for the residual) acc[t, o] * sx[t] * sw[o] after an FP8
//                       GEMM run without cuBLASLt's outer-vector scales
#include <cuda_fp8.h>

#include "common.cuh"

constexpr float E4M3_MAX = 448.f;

// 16-byte chunks (8 bf16) a thread holds in registers in the vectorized
// path: rows up to 8 * 8 * blockDim wide (16,384 at 256 threads) are read
// from memory once.
constexpr int QUANT_CHUNKS = 8;

// The row's bytes, given its scale: `q = e4m3(x / s)` (round to nearest, saturating).
__device__ __forceinline__ uint2 e4m3_chunk(uint4 chunk, float s) {
  const bf16* e = reinterpret_cast<const bf16*>(&chunk);
  alignas(8) __nv_fp8_storage_t b[8];
#pragma unroll
  for (int k = 0; k < 8; ++k) b[k] = __nv_cvt_float_to_fp8(to_f32(e[k]) / s, __NV_SATFINITE, __NV_E4M3);
  return *reinterpret_cast<const uint2*>(b);
}

__device__ __forceinline__ float chunk_absmax(uint4 chunk, float m) {
  const bf16* e = reinterpret_cast<const bf16*>(&chunk);
#pragma unroll
  for (int k = 0; k < 8; ++k) m = fmaxf(m, fabsf(to_f32(e[k])));
  return m;
}

extern "C" __global__ void quantize_rows_e4m3(const bf16* __restrict__ x, __nv_fp8_storage_t* __restrict__ q,
                                              float* __restrict__ scales, int cols) {
  pdl_begin();
  const size_t row = blockIdx.x;
  const bf16* xr = x + row * cols;
  __nv_fp8_storage_t* qr = q + row * cols;
  const int chunks = cols / 8;
  // Activations before every FP8 GEMM take this path: 16-byte loads, each
  // element read once (the byte-wise loops below read the row twice).
  const bool vectorized = cols % 8 == 0 && chunks <= QUANT_CHUNKS * (int)blockDim.x &&
                          (reinterpret_cast<uintptr_t>(xr) & 15) == 0 && (reinterpret_cast<uintptr_t>(qr) & 7) == 0;
  float m = 0.f;
  uint4 held[QUANT_CHUNKS];
  if (vectorized) {
#pragma unroll
    for (int c = 0; c < QUANT_CHUNKS; ++c) {
      const int i = threadIdx.x + c * blockDim.x;
      if (i < chunks) {
        held[c] = reinterpret_cast<const uint4*>(xr)[i];
        m = chunk_absmax(held[c], m);
      }
    }
  } else {
    for (int i = threadIdx.x; i < cols; i += blockDim.x) m = fmaxf(m, fabsf(to_f32(xr[i])));
  }
  m = block_max(m);
  // An all-zero row keeps scale 1 (its bytes are zeros either way).
  const float s = m > 0.f ? m / E4M3_MAX : 1.f;
  if (vectorized) {
#pragma unroll
    for (int c = 0; c < QUANT_CHUNKS; ++c) {
      const int i = threadIdx.x + c * blockDim.x;
      if (i < chunks) reinterpret_cast<uint2*>(qr)[i] = e4m3_chunk(held[c], s);
    }
  } else {
    for (int i = threadIdx.x; i < cols; i += blockDim.x)
      qr[i] = __nv_cvt_float_to_fp8(to_f32(xr[i]) / s, __NV_SATFINITE, __NV_E4M3);
  }
  if (threadIdx.x == 0) scales[row] = s;
}

// After an FP8 GEMM whose cuBLASLt takes no outer-vector scales: the
// unscaled f32 sums acc[t, o] times the token's and the weight row's
// scales. MODE 0: bf16 y, 1: f32 y, 2: added to f32 y (the residual).
extern "C" __global__ void fp8_scale_out(const float* __restrict__ acc, const float* __restrict__ x_scales,
                                         const float* __restrict__ w_scales, void* __restrict__ y, int tokens,
                                         int outputs, int mode) {
  pdl_begin();
  const size_t total = (size_t)tokens * outputs;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total; i += (size_t)gridDim.x * blockDim.x) {
    const float v = acc[i] * x_scales[i / outputs] * w_scales[i % outputs];
    if (mode == 0) reinterpret_cast<bf16*>(y)[i] = to_bf16(v);
    else if (mode == 1) reinterpret_cast<float*>(y)[i] = v;
    else reinterpret_cast<float*>(y)[i] += v;
  }
}
