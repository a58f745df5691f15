// Shared helpers for ingot's kernels. Activations of the residual stream are
// f32; GEMM inputs/outputs, weights and the KV cache are bf16.
#pragma once
#include <cuda_bf16.h>
#include <stdint.h>

typedef __nv_bfloat16 bf16;

#define LOG2E 1.4426950408889634f

// Programmatic dependent launch (Hopper): every kernel first waits until the
// previous kernel's writes are visible, then lets the next kernel's blocks
// be scheduled, so launch latency and ramp-up overlap the previous tail.
// The host sets the launch attribute; without it (or before sm_90) these
// are no-ops.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// For short kernels: wait, then let the next one in at once.
__device__ __forceinline__ void pdl_begin() {
  pdl_wait();
  pdl_launch_dependents();
}

// Warms L2 with the first `bytes` (a multiple of 16) at `base`: weights a
// later kernel streams, fetched while a latency-bound kernel leaves DRAM
// idle. The range is split over the grid's blocks; thread 0 of each issues
// bulk prefetches (Hopper's copy engine, no registers or warps held).
// mode bit 1: evict-last hint. A no-op for base == nullptr and before sm_90.
__device__ __forceinline__ void l2_prefetch(const void* base, unsigned long long bytes, int mode) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (base == nullptr || threadIdx.x + threadIdx.y + threadIdx.z != 0) return;
  const unsigned long long blocks = (unsigned long long)gridDim.x * gridDim.y * gridDim.z;
  const unsigned long long id = blockIdx.x + (unsigned long long)gridDim.x * (blockIdx.y + (unsigned long long)gridDim.y * blockIdx.z);
  const unsigned long long chunk = ((bytes + blocks - 1) / blocks + 15) & ~15ull;
  const unsigned long long end = min(bytes, (id + 1) * chunk);
  const char* p = static_cast<const char*>(base);
  uint64_t policy = 0;
  if (mode & 2) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(policy));
  for (unsigned long long at = id * chunk; at < end; at += 65536) {
    const unsigned size = (unsigned)min(65536ull, end - at);
    if (mode & 2)
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(p + at), "r"(size), "l"(policy)
                   : "memory");
    else
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p + at), "r"(size) : "memory");
  }
#endif
}

// M(n, ...) for the batch sizes (or query groups) 1..8 a kernel family is
// instantiated for. A check-only build (CI's INGOT_CUDA_KERNELS_CHECK_ONLY=1,
// compiled to be checked and never run: the CUDA runner refuses it) takes 1,
// 2 and 8: every template path, the n = 1 special cases and the largest
// register use, at 3/8 of the compile time.
#ifdef INGOT_CHECK_ONLY
#define EACH_N_1_TO_8(M, ...) M(1, __VA_ARGS__) M(2, __VA_ARGS__) M(8, __VA_ARGS__)
#else
#define EACH_N_1_TO_8(M, ...)                                                                                    \
  M(1, __VA_ARGS__) M(2, __VA_ARGS__) M(3, __VA_ARGS__) M(4, __VA_ARGS__) M(5, __VA_ARGS__) M(6, __VA_ARGS__)  \
  M(7, __VA_ARGS__) M(8, __VA_ARGS__)
#endif

// The scales of a one-byte-per-weight matrix of `rows` x `in` (e4m3's f32
// per row, Q8_0's f16 per block): they follow its bytes at the next
// 256-byte boundary (the loader's layout, fp8.cu and quant.cu;
// `scales_offset` in runner-cuda's weights).
template <typename S>
__device__ __forceinline__ const S* scales_after(const void* w, size_t rows, int in) {
  const size_t bytes = (rows * (size_t)in + 255) & ~(size_t)255;
  return reinterpret_cast<const S*>(reinterpret_cast<const char*>(w) + bytes);
}

__device__ __forceinline__ float to_f32(bf16 v) { return __bfloat162float(v); }
__device__ __forceinline__ bf16 to_bf16(float v) { return __float2bfloat16(v); }

// GELU, tanh approximation (Gemma's gated MLP).
__device__ __forceinline__ float gelu_tanh(float x) {
  return 0.5f * x * (1.f + tanhf(0.7978845608028654f * (x + 0.044715f * x * x * x)));
}

// act(gate) * up for 8 bf16 pairs (16-byte chunks of the gate and up
// halves), rounded to bf16: the gated MLP activation (SiLU, or GELU-tanh).
template <bool GELU>
__device__ __forceinline__ uint4 gated_chunk(uint4 gv, uint4 uv) {
  const __nv_bfloat162* g2 = reinterpret_cast<const __nv_bfloat162*>(&gv);
  const __nv_bfloat162* u2 = reinterpret_cast<const __nv_bfloat162*>(&uv);
  uint4 r;
  __nv_bfloat162* r2 = reinterpret_cast<__nv_bfloat162*>(&r);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(g2[i]);
    const float2 b = __bfloat1622float2(u2[i]);
    if (GELU) r2[i] = __floats2bfloat162_rn(gelu_tanh(a.x) * b.x, gelu_tanh(a.y) * b.y);
    else r2[i] = __floats2bfloat162_rn(a.x / (1.f + __expf(-a.x)) * b.x, a.y / (1.f + __expf(-a.y)) * b.y);
  }
  return r;
}

// acc += the dot product of 8 bf16 pairs (16-byte chunks of a weight row
// and an activation row), in f32, in a fixed order.
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

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum (or maximum) over the whole block (blockDim.x a multiple of 32, at
// most 1024); every thread gets the result. Every warp reduces the warp
// partials in the same order, so all threads see the same bits.
template <bool MAX>
__device__ __forceinline__ float block_reduce(float v) {
  __shared__ float partial[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = MAX ? warp_max(v) : warp_sum(v);
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  const float identity = MAX ? -INFINITY : 0.f;
  v = lane < (int)(blockDim.x >> 5) ? partial[lane] : identity;
  v = MAX ? warp_max(v) : warp_sum(v);
  __syncthreads();  // partial may be reused by the caller's next reduction
  return v;
}

// float4s per thread on add_rms_norm's register path; rms_norm_e4m3 (fp8.cu)
// keeps the same partition so that the two give the same bits.
constexpr int NORM_VECS = 4;

__device__ __forceinline__ float block_sum(float v) { return block_reduce<false>(v); }
__device__ __forceinline__ float block_max(float v) { return block_reduce<true>(v); }

__device__ __forceinline__ float4 add_bf16x4(float4 v, const bf16* d) {
  const uint2 raw = *reinterpret_cast<const uint2*>(d);
  const float2 lo = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.x));
  const float2 hi = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(&raw.y));
  return make_float4(v.x + lo.x, v.y + lo.y, v.z + hi.x, v.w + hi.y);
}

// add_rms_norm's register path over one row xr of d floats (a multiple of
// 4, at most 4 * NORM_VECS * blockDim.x): xr (+ dr, then written to sum
// when dr is given) normed and times weight, rounded to bf16 pairs: h[k]
// holds this thread's float4 slot k. rms_norm_e4m3 (fp8.cu) shares it, so
// the two give the same bits.
__device__ __forceinline__ void rms_norm_row_regs(const float* xr, const bf16* dr, float* sum, const float* weight,
                                                  int d, float eps, __nv_bfloat162 (&h)[NORM_VECS][2]) {
  float4 v[NORM_VECS];
  float ss = 0.f;
#pragma unroll
  for (int k = 0; k < NORM_VECS; ++k) {
    const int i = 4 * (threadIdx.x + k * blockDim.x);
    if (i >= d) continue;
    v[k] = *reinterpret_cast<const float4*>(xr + i);
    if (dr) {
      v[k] = add_bf16x4(v[k], dr + i);
      *reinterpret_cast<float4*>(sum + i) = v[k];
    }
    ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
  }
  const float inv = rsqrtf(block_sum(ss) / d + eps);
#pragma unroll
  for (int k = 0; k < NORM_VECS; ++k) {
    const int i = 4 * (threadIdx.x + k * blockDim.x);
    if (i >= d) continue;
    const float4 w = *reinterpret_cast<const float4*>(weight + i);
    h[k][0] = __floats2bfloat162_rn(v[k].x * inv * w.x, v[k].y * inv * w.y);
    h[k][1] = __floats2bfloat162_rn(v[k].z * inv * w.z, v[k].w * inv * w.w);
  }
}

// 24 random bits as a pure function of (seed, index), from SplitMix64's
// finaliser: dummy weights and sampling noise, no state, no host traffic.
__device__ __forceinline__ unsigned hash24(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return (unsigned)((z ^ (z >> 31)) >> 40);
}

// Sums of squares of the residual rows, for RMSNorms fused into the GEMVs
// that consume them (decode at n <= 8). The kernels that write the residual
// (embed_rows, the accumulating GEMVs) leave one partial sum per block and
// row and their block count; each consuming block adds the partials in a
// fixed order (deterministic, and the writer has no serial tail).
constexpr int SUMSQ_ROWS = 8;
constexpr int SUMSQ_MAX_BLOCKS = 4096;
struct SumSq {
  unsigned blocks;  // partials per row
  unsigned pad[7];
  float partial[SUMSQ_ROWS][SUMSQ_MAX_BLOCKS];
};

// Loads N consecutive bf16 (N even, 4-byte aligned) as floats.
template <int N>
__device__ __forceinline__ void load_bf16(const bf16* p, float* out) {
  const __nv_bfloat162* p2 = reinterpret_cast<const __nv_bfloat162*>(p);
#pragma unroll
  for (int i = 0; i < N / 2; ++i) {
    float2 f = __bfloat1622float2(p2[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

// KV cache layout: [block][kv_head][offset in block][head_dim]. A block's
// keys of one head are contiguous (block_size * head_dim * 2 bytes), so the
// decode kernel streams whole runs instead of 256-byte pieces 2 KiB apart.
__device__ __forceinline__ size_t kv_index(long long block, int kv_head, int offset, int num_kv_heads,
                                           int block_size, int hd) {
  return (((size_t)block * num_kv_heads + kv_head) * block_size + offset) * hd;
}
