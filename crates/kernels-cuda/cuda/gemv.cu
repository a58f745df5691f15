// The GEMV kernels for bf16, e4m3 and Q8_0 weights (templates in gemv.cuh;
// the 4- to 6-bit GGUF types' in gemv_kq.cu, compiled beside this file).
#include "gemv.cuh"

// GEMV_NO_INSTANCES: the templates alone (experiments, tests/gpu/bench_gemv.py).
#ifndef GEMV_NO_INSTANCES
EACH_N_1_TO_8(GEMV_KERNELS, Bf16W, , 0)
EACH_N_1_TO_8(GEMV_KERNELS, Fp8W, _fp8, 0)
EACH_N_1_TO_8(GEMV_KERNELS, Q8W, _q8_0, 0)
// Rows of at most 2,048 bf16 inputs (see SHORT_ROW_LOADS, StagedX).
EACH_N_1_TO_8(GEMV_KERNELS, Bf16W, _short, SHORT_ROW_LOADS)

// Batch 1, f32 accumulate, bf16 rows of SHORT_ROW_INPUTS to 4,096 inputs,
// for matrices of few rows (the runner: at most 16 a SM), where a warp a row
// leaves too few warps to cover DRAM latency a batch of loads at a time: a
// lane's whole row (16 loads) goes out before the PDL wait and x is staged
// in shared memory, as the short kernels do. Qwen3-30B-A3B's o_proj (4,096
// inputs, 2,048 rows), H200 batch 1: 336.7 -> 342.5 tok/s; the dense 8B's
// (4,096 rows) measured 233.6 -> 232.3 with it, so it keeps the plain one.
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_whole4k_n1_add_f32(const bf16* x, const bf16* w, void* y, int in, int out, SumSq* sumsq,
                            const float* next_norm, bf16* xg) {
  gemv_plain<1, 2, false, Bf16W, Bf16W::ROW_UNROLL, 16, 4096>(x, w, y, in, out, sumsq, next_norm, xg);
}
#endif
