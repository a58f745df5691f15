// The GEMV kernels for GGUF Q4_0/Q4_1/Q4_K/Q5_K/Q6_K weights (gemv.cuh,
// kquant.cuh): a file of their own so that nvcc compiles them beside
// gemv.cu. A check-only build takes one kernel per code path (the q/k/v
// mode is the same template gemv.cu's families check).
#include "gemv.cuh"

#ifndef GEMV_NO_INSTANCES
#ifdef INGOT_CHECK_ONLY
// One kernel per path: one row and two, with and without the fused norm.
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kq_n1_add_f32(const bf16* x, const KqMatrix* w, void* y, int in, int out, SumSq* sumsq,
                       const float* next_norm, bf16* xg) {
  gemv_plain<1, 2, false, KqW>(x, w, y, in, out, sumsq, next_norm, xg);
}
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kq_n2_swiglu_norm(const bf16* xg, float eps, const SumSq* sumsq, const KqMatrix* w, void* y, int in,
                           int out) {
  gemv_swiglu<2, true, false, KqW>(xg, w, reinterpret_cast<bf16*>(y), in, out, NormIn{eps, sumsq});
}
extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_kq_n8_bf16_norm(const bf16* xg, float eps, const SumSq* sumsq, const KqMatrix* w, void* y, int in,
                         int out) {
  gemv_plain<8, 0, true, KqW>(xg, w, y, in, out, nullptr, nullptr, nullptr, NormIn{eps, sumsq});
}
#else
EACH_N_1_TO_8(GEMV_KERNELS, KqW, _kq, 0)
#endif
#endif
