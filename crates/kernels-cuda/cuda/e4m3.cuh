// e4m3 (FP8) weights read in registers: pairs converted to floats, and
// 16 of them dotted with 16 bf16 activations (the GEMVs of gemv.cuh and
// the expert GEMVs of moe.cu).
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "common.cuh"

// Two e4m3 weights as floats. sm_89+ converts in hardware. Below it (the
// compute_80 PTX), cuda_fp8.h's generic conversion, unrolled through every
// GEMV of gemv.cu, took nvcc 400 s; instead each byte's sign and
// exponent-mantissa bits move into an f16 (exponent bias 15 for 7, so the
// value comes out 2^-8 too small, subnormals included) and the product
// with 256 restores it exactly. Only NaN (0x7f) differs: it reads as 480,
// which a quantised weight never is.
__device__ __forceinline__ float2 e4m3x2_to_float2(__nv_fp8x2_storage_t w) {
#if __CUDA_ARCH__ >= 890
  return __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(w, __NV_E4M3)));
#else
  const unsigned x = w;
  const unsigned bits = ((x & 0x80u) << 8) | ((x & 0x7fu) << 7) | ((x & 0x8000u) << 16) | ((x & 0x7f00u) << 15);
  const float2 f = __half22float2(*reinterpret_cast<const __half2*>(&bits));
  return make_float2(f.x * 256.f, f.y * 256.f);
#endif
}

// 16 e4m3 weights against 16 bf16 activations (two 16-byte loads).
__device__ __forceinline__ void dot16_e4m3(const uint4& wv, const uint4& x0, const uint4& x1, float& acc) {
  const __nv_fp8x2_storage_t* w2 = reinterpret_cast<const __nv_fp8x2_storage_t*>(&wv);
  const __nv_bfloat162* xa = reinterpret_cast<const __nv_bfloat162*>(&x0);
  const __nv_bfloat162* xb = reinterpret_cast<const __nv_bfloat162*>(&x1);
#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const float2 a = e4m3x2_to_float2(w2[i]);
    const float2 b = __bfloat1622float2(i < 4 ? xa[i] : xb[i - 4]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
}
