// Element types of the paged KV cache: bf16 (the model's dtype), or FP8
// e4m3 (`model.kv_cache_dtype = fp8`: half the bytes per token, so twice the
// tokens in the same memory and half the bytes decode attention streams).
// FP8 values are stored with a per-tensor scale of 1.0, saturated to
// +-448: e4m3's relative precision (3 mantissa bits) does not depend on a
// scale inside its normal range [2^-6, 448], where K (after RoPE) and V of
// the Llama-family models lie; docs/kv-cache.md has the measured accuracy.
#pragma once
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include "common.cuh"

typedef __nv_fp8_e4m3 fp8;

__device__ __forceinline__ void store_kv(bf16* p, float v) { *p = to_bf16(v); }
__device__ __forceinline__ void store_kv(fp8* p, float v) {
  p->__x = __nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}

// Loads N consecutive cache elements (N even, 2 * sizeof(KV)-byte aligned)
// as floats.
template <int N>
__device__ __forceinline__ void load_kv(const bf16* p, float* out) {
  load_bf16<N>(p, out);
}
template <int N>
__device__ __forceinline__ void load_kv(const fp8* p, float* out) {
  const __nv_fp8x2_storage_t* p2 = reinterpret_cast<const __nv_fp8x2_storage_t*>(p);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(p2[i], __NV_E4M3)));
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// Eight FP8 values (8 bytes, aligned) as eight bf16 (16 bytes): prefill
// attention stages cached FP8 rows as bf16 tiles for its tensor cores.
__device__ __forceinline__ uint4 fp8x8_to_bf16x8(uint2 raw) {
  const __nv_fp8x2_storage_t* p2 = reinterpret_cast<const __nv_fp8x2_storage_t*>(&raw);
  uint4 r;
  unsigned* w = reinterpret_cast<unsigned*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(p2[i], __NV_E4M3)));
    const __nv_bfloat162 b = __floats2bfloat162_rn(f.x, f.y);
    w[i] = *reinterpret_cast<const unsigned*>(&b);
  }
  return r;
}
