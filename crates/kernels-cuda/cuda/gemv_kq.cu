// The GEMV kernels for GGUF Q4_0/Q4_1/Q4_K/Q5_K/Q6_K weights (gemv.cuh,
// kquant.cuh): a file of their own so that nvcc compiles them beside
// gemv.cu. A check-only build takes one kernel per code path (the q/k/v
// mode is the same template gemv.cu's families check).
#include "gemv.cuh"

// Batch 1's gated GEMVs built for one 4-bit type each, two columns a warp
// (see gemv_swiglu): gemv_kq_{type}_n1_{swiglu,geglu}[_norm], for matrices
// of that one type (the host's choice; others take the kernels of every
// type). Not for Q5_K and Q6_K: two columns took them to 184 and 164
// registers (one block an SM), and the 8B's gate/up from 36.6 to 36.1 us
// (Q5_K) and 35.7 to 44.3 (Q6_K) (tests/gpu/bench_gemv.py).
// Their gate/up columns a warp (the host's KQ_ONE_TYPE_GATED_COLS, gemm/quant.rs).
constexpr int KQ_ONE_TYPE_GATED_COLS = 2;
#define KQ_GATED_ONE_TYPE(TYPE, NAME, ACT, GELU)                                                              \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                               \
      gemv_kq_##NAME##_n1_##ACT(const bf16* x, const KqMatrix* w, void* y, int in, int out) {                  \
    gemv_swiglu<1, false, GELU, KqWOf<1u << TYPE>, 1, KQ_ONE_TYPE_GATED_COLS>(x, w, reinterpret_cast<bf16*>(y), \
                                                                              in, out);                          \
  }                                                                                                            \
  extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                                               \
      gemv_kq_##NAME##_n1_##ACT##_norm(const bf16* xg, float eps, const SumSq* sumsq, const KqMatrix* w,      \
                                       void* y, int in, int out) {                                             \
    gemv_swiglu<1, true, GELU, KqWOf<1u << TYPE>, 1, KQ_ONE_TYPE_GATED_COLS>(                                 \
        xg, w, reinterpret_cast<bf16*>(y), in, out, NormIn{eps, sumsq});                                        \
  }

#ifndef GEMV_NO_INSTANCES
#ifdef INGOT_CHECK_ONLY
// One kernel per path: one row and two, with and without the fused norm,
// and a one-type gated kernel.
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
KQ_GATED_ONE_TYPE(KQ_Q4_K, q4_k, swiglu, false)
#else
EACH_N_1_TO_8(GEMV_KERNELS, KqW, _kq, 0)
#define KQ_GATED_KERNELS(TYPE, NAME) KQ_GATED_ONE_TYPE(TYPE, NAME, swiglu, false) KQ_GATED_ONE_TYPE(TYPE, NAME, geglu, true)
KQ_GATED_KERNELS(KQ_Q4_0, q4_0)
KQ_GATED_KERNELS(KQ_Q4_1, q4_1)
KQ_GATED_KERNELS(KQ_Q4_K, q4_k)
#endif
#endif
