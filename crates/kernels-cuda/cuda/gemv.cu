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
#endif
