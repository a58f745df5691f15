// GGUF block-quantized weights kept as they are on the device
// (`model.cuda_weights = "native"`). A Q8_0 matrix of `rows` x `in` is
// stored as its int8 quants, row-major (one byte a weight, the blocks'
// `qs` in order), then, at the next 256-byte boundary, one f16 scale per
// block of 32 (the blocks' `d`, row-major): the file's 34 bytes a block,
// split so that 16-byte loads of quants stay aligned. The GEMV kernels
// (gemv.cu, gemv_q8_0_*) read it at decode sizes; larger products expand
// the matrix to bf16 scratch here and run cuBLASLt.
//
//   dequant_q8_0_bf16: y[r, i] = bf16(d[r, i / 32] * q[r, i])
//   dequant_kq_bf16:   the same for the 4- to 6-bit types (kquant.cuh)
#include <cuda_fp16.h>

#include "common.cuh"
#include "kquant.cuh"

// Rows [row0, row0 + rows) of a `total_rows` x `in` matrix into y
// (`rows` x `in` bf16): the whole matrix, or a chunk of a larger one.
// 16 weights a thread per step: one 16-byte load of quants, two of output.
extern "C" __global__ void dequant_q8_0_bf16(const int8_t* __restrict__ q, bf16* __restrict__ y, long long total_rows,
                                             int in, long long row0, long long rows) {
  pdl_begin();
  const __half* d = scales_after<__half>(q, total_rows, in);
  const size_t first = (size_t)row0 * in / 16, vecs = (size_t)rows * in / 16;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < vecs; i += (size_t)gridDim.x * blockDim.x) {
    // A row is whole blocks, so vector v lies in block v / 2 of the matrix.
    const size_t v = first + i;
    const float s = __half2float(d[v >> 1]);
    const uint4 w = reinterpret_cast<const uint4*>(q)[v];
    const int8_t* b = reinterpret_cast<const int8_t*>(&w);
    uint4 out[2];
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out);
#pragma unroll
    for (int k = 0; k < 8; ++k) o[k] = __floats2bfloat162_rn(s * (float)b[2 * k], s * (float)b[2 * k + 1]);
    reinterpret_cast<uint4*>(y)[2 * i] = out[0];
    reinterpret_cast<uint4*>(y)[2 * i + 1] = out[1];
  }
}

// The same for the 4- to 6-bit types: one 16-byte vector of quants (32
// weights) a thread per step.
extern "C" __global__ void dequant_kq_bf16(const KqMatrix* __restrict__ m, bf16* __restrict__ y, long long,
                                           int in, long long row0, long long rows) {
  pdl_begin();
  const int row_vecs = in / 32;
  const size_t vecs = (size_t)rows * row_vecs;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < vecs; i += (size_t)gridDim.x * blockDim.x) {
    const size_t out_row = i / row_vecs, row = (size_t)row0 + out_row;
    const int v = (int)(i % row_vecs);
    const KqSegment& s = kq_segment(m, row);
    kq_dispatch(s.type, [&](auto t) {
      using T = decltype(t);
      float lo[16], hi[16];
      kq_vector_weights<T>(s, row, in, v, lo, hi);
      bf16* out = y + out_row * in;
      uint4 o[4];
      __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(o);
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        o2[k] = __floats2bfloat162_rn(lo[2 * k], lo[2 * k + 1]);
        o2[8 + k] = __floats2bfloat162_rn(hi[2 * k], hi[2 * k + 1]);
      }
      uint4* lo_out = reinterpret_cast<uint4*>(out + T::lo_in(v));
      uint4* hi_out = reinterpret_cast<uint4*>(out + T::hi_in(v));
      lo_out[0] = o[0];
      lo_out[1] = o[1];
      hi_out[0] = o[2];
      hi_out[1] = o[3];
    });
  }
}
