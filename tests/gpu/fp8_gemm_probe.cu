// FP8 GEMM probe (issue 19): on the 8B's four layer shapes at 64..8192 tokens,
// times each part of ingot's FP8 linear layer (quantize_rows_e4m3, the
// cuBLASLt e4m3 GEMM, fp8_scale_out) beside the bf16 GEMM, and asks this
// GPU's cuBLASLt which scaling modes it takes for e4m3 x e4m3:
//   f32raw   unscaled f32 sums (ingot's epilogue path; fp8_scale_out follows)
//   outer    CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F for A and B, bf16 out
//   outerAdd the same, f32 out, beta = 1 (the residual)
//   scalar   per-tensor A and B scale pointers, bf16 out
//   avec     per-row alpha vector (weight scales) + per-tensor B scale, bf16 out
//   avecAdd  the same, f32 out, beta = 1
// Each GEMM is the fastest of cuBLASLt's top 8 heuristic candidates (as
// ingot tunes), in microseconds; "-" where cuBLASLt refuses the mode.
// First, `check` compares the modes ingot runs with a float64 reference
// (exit status 1 if one is off).
// Build and run on the GPU machine:
//   nvcc -O2 -std=c++17 -arch=sm_90a -I crates/kernels-cuda/cuda tests/gpu/fp8_gemm_probe.cu -lcublasLt -o probe && ./probe
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "fp8.cu"

#define CK(x)                                                                              \
  do {                                                                                     \
    cudaError_t e_ = (x);                                                                  \
    if (e_ != cudaSuccess) {                                                               \
      std::printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e_), __FILE__, __LINE__); \
      std::exit(1);                                                                        \
    }                                                                                      \
  } while (0)

__global__ void fill_bf16(bf16* p, size_t n, unsigned seed, float amp) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    unsigned h = (unsigned)i * 2654435761u ^ seed;
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    p[i] = to_bf16(amp * ((h & 0xffff) / 32768.f - 1.f));
  }
}

__global__ void fill_f32(float* p, size_t n, float v) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) p[i] = v;
}

enum Mode { BF16, F32RAW, OUTER, OUTER_ADD, SCALAR, AVEC, AVEC_ADD, NMODES };
static const char* kModeNames[NMODES] = {"bf16", "f32raw", "outer", "outerAdd", "scalar", "avec", "avecAdd"};

struct Bufs {
  void *w16, *w8, *x16, *x8, *y, *ws;
  float *wscale, *xscale, *one;
  size_t ws_bytes;
};

static float time_ms(cudaEvent_t a, cudaEvent_t b) {
  float ms = 0.f;
  cudaEventElapsedTime(&ms, a, b);
  return ms;
}

// Fastest time (us) of `mode` at m outputs, n tokens, k inputs; -1 if refused.
// With `once`, runs the first candidate that cuBLASLt accepts one time (0 if any).
static float gemm_us(cublasLtHandle_t lt, Bufs& b, Mode mode, int m, int n, int k, cudaStream_t st,
                     bool once = false) {
  const bool fp8 = mode != BF16;
  const bool add = mode == OUTER_ADD || mode == AVEC_ADD;
  const bool f32out = mode == F32RAW || add;
  cudaDataType_t in = fp8 ? CUDA_R_8F_E4M3 : CUDA_R_16BF;
  cudaDataType_t out = f32out ? CUDA_R_32F : CUDA_R_16BF;
  cublasLtMatmulDesc_t desc;
  cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F);
  cublasOperation_t t = CUBLAS_OP_T;
  cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &t, sizeof(t));
  const void* ws = b.wscale;
  const void* xs = b.xscale;
  if (mode == OUTER || mode == OUTER_ADD) {
    int32_t vec = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &vec, sizeof(vec));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &vec, sizeof(vec));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof(ws));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof(xs));
  } else if (mode == SCALAR) {
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &ws, sizeof(ws));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof(xs));
  } else if (mode == AVEC || mode == AVEC_ADD) {
    int32_t pm = CUBLASLT_POINTER_MODE_ALPHA_DEVICE_VECTOR_BETA_HOST;
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_POINTER_MODE, &pm, sizeof(pm));
    cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &xs, sizeof(xs));
  }
  cublasLtMatrixLayout_t lw, lx, ly;
  cublasLtMatrixLayoutCreate(&lw, in, k, m, k);
  cublasLtMatrixLayoutCreate(&lx, in, k, n, k);
  cublasLtMatrixLayoutCreate(&ly, out, m, n, m);
  cublasLtMatmulPreference_t pref;
  cublasLtMatmulPreferenceCreate(&pref);
  cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &b.ws_bytes,
                                       sizeof(b.ws_bytes));
  cublasLtMatmulHeuristicResult_t found[8];
  int count = 0;
  cublasStatus_t hs = cublasLtMatmulAlgoGetHeuristic(lt, desc, lw, lx, ly, ly, pref, 8, found, &count);
  float best = -1.f;
  const float one = 1.f, zero = 0.f;
  const void* alpha = (mode == AVEC || mode == AVEC_ADD) ? (const void*)b.wscale : (const void*)&one;
  const void* beta = add ? &one : &zero;
  const void* w = fp8 ? b.w8 : b.w16;
  const void* x = fp8 ? b.x8 : b.x16;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int i = 0; hs == CUBLAS_STATUS_SUCCESS && i < count; ++i) {
    auto run = [&] {
      return cublasLtMatmul(lt, desc, alpha, w, lw, x, lx, beta, b.y, ly, b.y, ly, &found[i].algo, b.ws, b.ws_bytes,
                            st);
    };
    if (run() != CUBLAS_STATUS_SUCCESS) continue;
    if (once) {
      best = 0.f;
      break;
    }
    const int reps = 10;
    cudaEventRecord(e0, st);
    for (int r = 0; r < reps; ++r) run();
    cudaEventRecord(e1, st);
    cudaEventSynchronize(e1);
    float us = time_ms(e0, e1) * 1e3f / reps;
    if (best < 0 || us < best) best = us;
  }
  if (cudaGetLastError() != cudaSuccess || cudaStreamSynchronize(st) != cudaSuccess) best = -2.f;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(lw);
  cublasLtMatrixLayoutDestroy(lx);
  cublasLtMatrixLayoutDestroy(ly);
  cublasLtMatmulDescDestroy(desc);
  return best;
}

template <typename F>
static float kernel_us(F launch, cudaStream_t st) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  launch();
  const int reps = 20;
  cudaEventRecord(e0, st);
  for (int r = 0; r < reps; ++r) launch();
  cudaEventRecord(e1, st);
  cudaEventSynchronize(e1);
  float us = time_ms(e0, e1) * 1e3f / reps;
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return us;
}

// Correctness of the modes ingot runs (outer-vector scales into bf16 and
// into f32 with beta = 1; unscaled f32 sums + fp8_scale_out) against a
// float64 product of the dequantized operands, on n = 37 tokens of the
// first m = 512 weight rows (k = 4096). Returns whether all are within
// tolerance (relative to the largest |reference|).
static bool check(cublasLtHandle_t lt, Bufs& b, cudaStream_t st) {
  const int m = 512, n = 37, k = 4096;
  std::vector<unsigned char> w8((size_t)m * k), x8((size_t)n * k);
  std::vector<float> sw(m), sx(n);
  // The x8 rows were quantized from 14336-wide rows: requantize 37 rows at k.
  quantize_rows_e4m3<<<n, 256, 0, st>>>((const bf16*)b.x16, (__nv_fp8_storage_t*)b.x8, b.xscale, k);
  CK(cudaStreamSynchronize(st));
  CK(cudaMemcpy(w8.data(), b.w8, w8.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(x8.data(), b.x8, x8.size(), cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(sw.data(), b.wscale, m * 4, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(sx.data(), b.xscale, n * 4, cudaMemcpyDeviceToHost));
  auto dq = [](unsigned char byte) {
    __nv_fp8_e4m3 v;
    v.__x = byte;
    return (double)float(v);
  };
  std::vector<double> ref((size_t)n * m);
  double peak = 0.0;
  for (int t = 0; t < n; ++t)
    for (int o = 0; o < m; ++o) {
      double acc = 0.0;
      for (int i = 0; i < k; ++i) acc += dq(w8[(size_t)o * k + i]) * dq(x8[(size_t)t * k + i]);
      ref[(size_t)t * m + o] = acc * sw[o] * sx[t];
      peak = std::max(peak, std::fabs(ref[(size_t)t * m + o]));
    }
  bool ok = true;
  for (Mode mode : {OUTER, OUTER_ADD, F32RAW}) {
    // y starts at 1.0 (f32) so beta = 1 shows; bf16 outputs overwrite it.
    fill_f32<<<64, 256, 0, st>>>((float*)b.y, (size_t)n * m, 1.f);
    if (gemm_us(lt, b, mode, m, n, k, st, true) < 0) {
      std::printf("check %-8s refused\n", kModeNames[mode]);
      ok = false;
      continue;
    }
    std::vector<float> got((size_t)n * m);
    if (mode == F32RAW) {
      void* scaled = (char*)b.y + (size_t)n * m * 4;
      fp8_scale_out<<<(n * m + 255) / 256, 256, 0, st>>>((const float*)b.y, b.xscale, b.wscale, scaled, n, m, 1);
      CK(cudaMemcpy(got.data(), scaled, got.size() * 4, cudaMemcpyDeviceToHost));
    } else if (mode == OUTER) {
      std::vector<bf16> h(got.size());
      CK(cudaMemcpy(h.data(), b.y, h.size() * 2, cudaMemcpyDeviceToHost));
      for (size_t i = 0; i < h.size(); ++i) got[i] = __bfloat162float(h[i]);
    } else {
      CK(cudaMemcpy(got.data(), b.y, got.size() * 4, cudaMemcpyDeviceToHost));
    }
    // bf16 out: its rounding. f32 out: the order of the f32 sums (Hopper's
    // FP8 MMA adds in its own order; 9.4e-5 measured on an H100).
    const double tol = mode == OUTER ? 8e-3 : 5e-4;
    double worst = 0.0;
    for (size_t i = 0; i < got.size(); ++i) {
      double want = ref[i] + (mode == OUTER_ADD ? 1.0 : 0.0);
      worst = std::max(worst, std::fabs(got[i] - want) / peak);
    }
    const bool pass = worst <= tol;
    ok = ok && pass;
    std::printf("check %-8s max |err| / max |ref| = %.2e (tol %.0e) %s\n", kModeNames[mode], worst, tol,
                pass ? "ok" : "FAIL");
  }
  return ok;
}

int main() {
  struct Shape {
    const char* name;
    int out, in;
  } shapes[] = {{"qkv", 6144, 4096}, {"o", 4096, 4096}, {"gate_up", 28672, 4096}, {"down", 4096, 14336}};
  const int ns[] = {64, 128, 256, 512, 1024, 8192};
  const size_t max_w = 28672ull * 4096, max_x = 8192ull * 14336, max_y = 8192ull * 28672;
  Bufs b{};
  b.ws_bytes = 32 << 20;
  CK(cudaMalloc(&b.w16, max_w * 2));
  CK(cudaMalloc(&b.w8, max_w + 28672 * 4));
  CK(cudaMalloc(&b.x16, max_x * 2));
  CK(cudaMalloc(&b.x8, max_x));
  CK(cudaMalloc(&b.y, max_y * 4));
  CK(cudaMalloc(&b.ws, b.ws_bytes));
  CK(cudaMalloc(&b.wscale, 28672 * 4));
  CK(cudaMalloc(&b.xscale, 8192 * 4));
  cudaStream_t st;
  CK(cudaStreamCreate(&st));
  fill_bf16<<<1024, 256, 0, st>>>((bf16*)b.w16, max_w, 1u, 0.05f);
  fill_bf16<<<1024, 256, 0, st>>>((bf16*)b.x16, max_x, 7u, 2.f);
  fill_f32<<<64, 256, 0, st>>>((float*)b.y, max_y, 0.f);
  // Weights: rows of the largest shape quantized once (smaller shapes use a prefix).
  quantize_rows_e4m3<<<28672, 256, 0, st>>>((const bf16*)b.w16, (__nv_fp8_storage_t*)b.w8, b.wscale, 4096);
  quantize_rows_e4m3<<<8192, 256, 0, st>>>((const bf16*)b.x16, (__nv_fp8_storage_t*)b.x8, b.xscale, 14336);
  CK(cudaStreamSynchronize(st));
  cublasLtHandle_t lt;
  cublasLtCreate(&lt);
  std::printf("cublasLt version %zu, cudart %d\n", cublasLtGetVersion(), CUDART_VERSION);
  const bool checked = check(lt, b, st);
  std::printf("%-8s %5s %8s", "shape", "n", "quant");
  for (int m = 0; m < NMODES; ++m) std::printf(" %9s", kModeNames[m]);
  std::printf(" %9s %9s %7s\n", "scaleOut", "fp8now", "now/bf16");
  for (const auto& s : shapes) {
    for (int n : ns) {
      float q = kernel_us(
          [&] {
            quantize_rows_e4m3<<<n, 256, 0, st>>>((const bf16*)b.x16, (__nv_fp8_storage_t*)b.x8, b.xscale, s.in);
          },
          st);
      float g[NMODES];
      for (int m = 0; m < NMODES; ++m) g[m] = gemm_us(lt, b, (Mode)m, s.out, n, s.in, st);
      float so = kernel_us(
          [&] {
            const size_t elems = (size_t)n * s.out;
            fp8_scale_out<<<(unsigned)((elems + 255) / 256), 256, 0, st>>>((const float*)b.y, b.xscale, b.wscale,
                                                                             (char*)b.y + max_y * 2, n, s.out, 0);
          },
          st);
      float now = q + g[F32RAW] + so;
      std::printf("%-8s %5d %8.1f", s.name, n, q);
      for (int m = 0; m < NMODES; ++m) {
        if (g[m] < 0) std::printf(" %9s", "-");
        else std::printf(" %9.1f", g[m]);
      }
      std::printf(" %9.1f %9.1f %7.2f\n", so, now, now / g[BF16]);
      std::fflush(stdout);
    }
  }
  CK(cudaGetLastError());
  return checked ? 0 : 1;
}
