// Tensor parallel across the GPUs of one process (see runner-cuda's
// runner/parallel.rs): the one-shot all-reduce of small messages over peer
// memory, and the LM head's vocabulary gather.
#include "common.cuh"

// Wrap-safe "a is before b" for the epoch counters.
__device__ __forceinline__ bool before(unsigned a, unsigned b) { return (int)(a - b) < 0; }

__device__ __forceinline__ void store_release(unsigned* p, unsigned v) {
  asm volatile("st.release.sys.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ unsigned load_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// In-place sum over `ranks` GPUs of `rows` rows of `d` f32 at `x` (d a
// multiple of 4), the same bits on every rank. Every rank launches it with
// the same grid (blocks per row, rows) at the same point of its stream.
// Block b of rank r copies its piece of a row into its own exchange buffer
// (one of two, alternating per call), tells block b of every rank so
// (flags[p][b * ranks + r] = epoch, in p's memory, written over NVLink),
// waits for every rank's word, then sums that piece of every rank's
// exchange buffer, rank 0 first, into x. Reusing a buffer two calls later
// is safe: a rank that signalled the call in between has finished reading
// this one (its stream is in order). `exchange[r]` and `flags[r]` are rank
// r's buffers (peer access enabled); `epochs` holds this rank's per-block
// call counter.
//
// With norm_w, the summed rows are the residual's next writer's output for
// a fused RMSNorm (as the accumulating GEMVs leave it, gemv.cu): xg =
// bf16(x ⊙ norm_w) and, for rows < SUMSQ_ROWS, each block's partial sum
// of squares of its piece.
extern "C" __global__ void __launch_bounds__(256) all_reduce_oneshot_f32(
    float* __restrict__ x, int d, const unsigned long long* __restrict__ exchange,
    const unsigned long long* __restrict__ flags, unsigned* __restrict__ epochs, int rank, int ranks,
    long long half_floats, const float* __restrict__ norm_w, bf16* __restrict__ xg, SumSq* __restrict__ sumsq) {
  pdl_wait();
  // The next kernel may start now: it reads weights before its own wait
  // (which holds it until this grid is done), so its loads overlap the
  // wait for the other ranks below.
  pdl_launch_dependents();
  __shared__ unsigned epoch;
  const int row = blockIdx.y, b = row * gridDim.x + blockIdx.x;
  if (threadIdx.x == 0) epoch = epochs[b] + 1;
  __syncthreads();
  const unsigned e = epoch;
  const int piece = ((d + gridDim.x - 1) / gridDim.x + 3) & ~3;
  const long long start = (long long)row * d + blockIdx.x * piece;
  const long long end = (long long)row * d + min(d, (int)(blockIdx.x + 1) * piece);
  const long long parity = (e & 1) * half_floats;
  float* mine = reinterpret_cast<float*>(exchange[rank]) + parity;
  for (long long i = start + threadIdx.x * 4; i < end; i += blockDim.x * 4)
    *reinterpret_cast<float4*>(mine + i) = *reinterpret_cast<const float4*>(x + i);
  __syncthreads();
  if (threadIdx.x < ranks) {
    __threadfence_system();
    unsigned* peer = reinterpret_cast<unsigned*>(flags[threadIdx.x]);
    store_release(peer + b * ranks + rank, e);
    const unsigned* own = reinterpret_cast<const unsigned*>(flags[rank]) + b * ranks + threadIdx.x;
    while (before(load_acquire(own), e)) {
    }
  }
  __syncthreads();
  float ss = 0.f;
  for (long long i = start + threadIdx.x * 4; i < end; i += blockDim.x * 4) {
    float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
    for (int r = 0; r < ranks; ++r) {
      const float4 v = __ldcv(reinterpret_cast<const float4*>(reinterpret_cast<const float*>(exchange[r]) + parity + i));
      sum.x += v.x;
      sum.y += v.y;
      sum.z += v.z;
      sum.w += v.w;
    }
    *reinterpret_cast<float4*>(x + i) = sum;
    if (norm_w) {
      ss += sum.x * sum.x + sum.y * sum.y + sum.z * sum.z + sum.w * sum.w;
      const float4 g = *reinterpret_cast<const float4*>(norm_w + (i - (long long)row * d));
      __nv_bfloat162 o[2] = {__floats2bfloat162_rn(sum.x * g.x, sum.y * g.y),
                             __floats2bfloat162_rn(sum.z * g.z, sum.w * g.w)};
      *reinterpret_cast<uint2*>(xg + i) = *reinterpret_cast<const uint2*>(o);
    }
  }
  if (norm_w && sumsq && row < SUMSQ_ROWS) {
    ss = block_sum(ss);
    if (threadIdx.x == 0) {
      sumsq->partial[row][blockIdx.x] = ss;
      if (b == 0) sumsq->blocks = gridDim.x;
    }
  }
  if (threadIdx.x == 0) epochs[b] = e;
}

// Each rank's LM-head logits [rows, vocab_rows] gathered rank-major
// ([ranks, rows, vocab_rows]) into [rows, vocab] (the last rank's padding
// columns dropped). Grid: (ceil(vocab / 256), rows).
extern "C" __global__ void gather_vocab_shards(const float* __restrict__ gathered, float* __restrict__ logits,
                                               int rows, int vocab, int vocab_rows) {
  pdl_begin();
  const int r = blockIdx.y, v = blockIdx.x * blockDim.x + threadIdx.x;
  if (v >= vocab) return;
  const int rank = v / vocab_rows, col = v - rank * vocab_rows;
  logits[(long long)r * vocab + v] = gathered[((long long)rank * rows + r) * vocab_rows + col];
}
