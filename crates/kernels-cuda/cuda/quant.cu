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
#include <cuda_fp16.h>

#include "common.cuh"

// 16 weights a thread per step: one 16-byte load of quants, two of output.
extern "C" __global__ void dequant_q8_0_bf16(const int8_t* __restrict__ q, bf16* __restrict__ y, long long rows,
                                             int in) {
  pdl_begin();
  const __half* d = scales_after<__half>(q, rows, in);
  const size_t vecs = (size_t)rows * in / 16;
  for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < vecs; v += (size_t)gridDim.x * blockDim.x) {
    // A row is whole blocks, so vector v lies in block v / 2 of the matrix.
    const float s = __half2float(d[v >> 1]);
    const uint4 w = reinterpret_cast<const uint4*>(q)[v];
    const int8_t* b = reinterpret_cast<const int8_t*>(&w);
    uint4 out[2];
    __nv_bfloat162* o = reinterpret_cast<__nv_bfloat162*>(out);
#pragma unroll
    for (int k = 0; k < 8; ++k) o[k] = __floats2bfloat162_rn(s * (float)b[2 * k], s * (float)b[2 * k + 1]);
    reinterpret_cast<uint4*>(y)[2 * v] = out[0];
    reinterpret_cast<uint4*>(y)[2 * v + 1] = out[1];
  }
}
