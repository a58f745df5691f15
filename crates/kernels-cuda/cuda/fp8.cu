// FP8 (e4m3) weights, `--quantization fp8`. A quantized matrix is stored as
// its rows of e4m3 bytes, then, at the next 256-byte boundary, one f32
// scale per row (absmax / 448, e4m3's largest finite value): the GEMV
// kernels (gemv.cu, scales_after) and cuBLASLt's per-channel scaling
// read it in that layout.
//
//   quantize_rows_e4m3: q[r, :] = e4m3(x[r, :] / s[r]), s[r] = max|x[r, :]| / 448
//                       for bf16 rows x; one block per row. Weights at load
//                       (written as above) and activations before an FP8
//                       GEMM (per-token scales).
//   fp8_scale_out:      y (=, or += for the residual) acc[t, o] * sx[t] * sw[o] after an FP8
//                       GEMM run without cuBLASLt's outer-vector scales
//   rms_norm_e4m3,      an FP8 GEMM's input written by its producer: RMSNorm,
//   silu_mul_e4m3,      or the gated activation, then quantize_rows_e4m3's
//   gelu_tanh_mul_e4m3: rows and scales, in one kernel (the same bits as the
//                       two kernels: values rounded to bf16 first)
#include <cuda_fp8.h>

#include "common.cuh"

constexpr float E4M3_MAX = 448.f;

// A row's scale from its absmax: the largest value maps to E4M3_MAX; an
// all-zero row keeps scale 1 (its bytes are zeros either way). The fused
// producers below use it too, so their scales equal quantize_rows_e4m3's.
__device__ __forceinline__ float e4m3_scale(float absmax) { return absmax > 0.f ? absmax / E4M3_MAX : 1.f; }

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
  const float s = e4m3_scale(block_max(m));
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

// Quantizes a block's row held as bf16 pairs, h[k] for this thread's
// NORM_VECS float4 slots of add_rms_norm's partition: the row's scale from
// the block's absmax, then 4 bytes a slot.
__device__ __forceinline__ void store_e4m3_row(const __nv_bfloat162 (&h)[NORM_VECS][2], __nv_fp8_storage_t* q,
                                               float* scale, int d) {
  float m = 0.f;
#pragma unroll
  for (int k = 0; k < NORM_VECS; ++k) {
    if (4 * (threadIdx.x + k * blockDim.x) >= d) continue;
#pragma unroll
    for (int p = 0; p < 2; ++p) m = fmaxf(m, fmaxf(fabsf(__low2float(h[k][p])), fabsf(__high2float(h[k][p]))));
  }
  const float s = e4m3_scale(block_max(m));
#pragma unroll
  for (int k = 0; k < NORM_VECS; ++k) {
    const int i = 4 * (threadIdx.x + k * blockDim.x);
    if (i >= d) continue;
    alignas(4) __nv_fp8_storage_t b[4];
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      b[2 * p] = __nv_cvt_float_to_fp8(__low2float(h[k][p]) / s, __NV_SATFINITE, __NV_E4M3);
      b[2 * p + 1] = __nv_cvt_float_to_fp8(__high2float(h[k][p]) / s, __NV_SATFINITE, __NV_E4M3);
    }
    *reinterpret_cast<unsigned*>(q + i) = *reinterpret_cast<const unsigned*>(b);
  }
  if (threadIdx.x == 0) *scale = s;
}

// out = RMSNorm(x[r]) * weight as e4m3 bytes and a row scale: add_rms_norm
// (no delta, no gather) then quantize_rows_e4m3 in one pass. The norm is
// add_rms_norm's register path itself (rms_norm_row_regs; the runner
// launches both with the same block size), so the bits are the same.
// Rows of a multiple of 4, at most 4 * NORM_VECS * blockDim wide.
extern "C" __global__ void rms_norm_e4m3(const float* __restrict__ x, const float* __restrict__ weight,
                                         __nv_fp8_storage_t* __restrict__ q, float* __restrict__ scales, int d,
                                         float eps) {
  pdl_begin();
  const int r = blockIdx.x;
  __nv_bfloat162 h[NORM_VECS][2];
  rms_norm_row_regs(x + (size_t)r * d, nullptr, nullptr, weight, d, eps, h);
  store_e4m3_row(h, q + (size_t)r * d, scales + r, d);
}

// act = f(gate) * up as e4m3 bytes and a row scale: gated_mul (elementwise.cu)
// then quantize_rows_e4m3, one block per row (the same gated_chunk, so the
// same bits). Rows of a multiple of 8, at most 8 * QUANT_CHUNKS * blockDim.
template <bool GELU>
__device__ __forceinline__ void gated_mul_e4m3(const bf16* __restrict__ gate_up, __nv_fp8_storage_t* __restrict__ q,
                                               float* __restrict__ scales, int ff) {
  pdl_begin();
  const int t = blockIdx.x;
  const bf16* g = gate_up + (size_t)t * 2 * ff;
  uint4 held[QUANT_CHUNKS];
  float m = 0.f;
#pragma unroll
  for (int c = 0; c < QUANT_CHUNKS; ++c) {
    const int j = 8 * (threadIdx.x + c * blockDim.x);
    if (j >= ff) continue;
    const uint4 gv = *reinterpret_cast<const uint4*>(g + j);
    const uint4 uv = *reinterpret_cast<const uint4*>(g + ff + j);
    held[c] = gated_chunk<GELU>(gv, uv);
    m = chunk_absmax(held[c], m);
  }
  const float s = e4m3_scale(block_max(m));
  __nv_fp8_storage_t* qr = q + (size_t)t * ff;
#pragma unroll
  for (int c = 0; c < QUANT_CHUNKS; ++c) {
    const int j = 8 * (threadIdx.x + c * blockDim.x);
    if (j < ff) *reinterpret_cast<uint2*>(qr + j) = e4m3_chunk(held[c], s);
  }
  if (threadIdx.x == 0) scales[t] = s;
}

extern "C" __global__ void silu_mul_e4m3(const bf16* gate_up, __nv_fp8_storage_t* q, float* scales, int ff) {
  gated_mul_e4m3<false>(gate_up, q, scales, ff);
}

extern "C" __global__ void gelu_tanh_mul_e4m3(const bf16* gate_up, __nv_fp8_storage_t* q, float* scales, int ff) {
  gated_mul_e4m3<true>(gate_up, q, scales, ff);
}
