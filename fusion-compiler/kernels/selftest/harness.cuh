// The kernel self-test's tools (harness.cu): error checks, device buffers,
// shapes, random device fills, event timing with a head start, and cuBLASLt
// as the baseline. Nothing here knows a fusion kernel: harness.cu calls the
// rendered units through their C ABI alone.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <string>
#include <vector>

#include "fusion/numeric.cuh"

#define CHECK_CUDA(expr)                                                                                \
  do {                                                                                                  \
    const cudaError_t err_ = (expr);                                                                    \
    if (err_ != cudaSuccess) {                                                                          \
      std::fprintf(stderr, "CUDA error at %s:%d: %s returned %s (%s)\n", __FILE__, __LINE__, #expr,     \
                   cudaGetErrorName(err_), cudaGetErrorString(err_));                                   \
      std::exit(2);                                                                                     \
    }                                                                                                   \
  } while (0)

#define CHECK_CUBLAS(expr)                                                                               \
  do {                                                                                                   \
    const cublasStatus_t st_ = (expr);                                                                   \
    if (st_ != CUBLAS_STATUS_SUCCESS) {                                                                  \
      std::fprintf(stderr, "cuBLAS error at %s:%d: %s returned %d\n", __FILE__, __LINE__, #expr, int(st_)); \
      std::exit(2);                                                                                      \
    }                                                                                                    \
  } while (0)

namespace harness {

template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t count = 0;
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t n) : count(n) { CHECK_CUDA(cudaMalloc(&ptr, std::max<size_t>(n, 1) * sizeof(T))); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr(o.ptr), count(o.count) { o.ptr = nullptr; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr, o.ptr);
    std::swap(count, o.count);
    return *this;
  }
  ~DeviceBuffer() {
    if (ptr) cudaFree(ptr);
  }
  void poison() { CHECK_CUDA(cudaMemset(ptr, 0xff, count * sizeof(T))); }  // 0xffff: NaN in f16 and bf16
};

struct Shape {
  int64_t m, n, k;
};

// "M,N,K".
inline std::string shape_str(Shape s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%lld,%lld,%lld", (long long)s.m, (long long)s.n, (long long)s.k);
  return buf;
}

// Device-side fill for inputs too large to draw on the host quickly: a hash
// of (seed, index) mapped to U(-scale, scale).
template <typename T>
__global__ void fill_random_kernel(T* p, size_t n, uint64_t seed, float scale) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    uint64_t z = seed + 0x9e3779b97f4a7c15ull * (i + 1);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    z ^= z >> 31;
    const float u = float(z >> 40) * (1.0f / 16777216.0f);
    p[i] = fusion::Numeric<T>::from_float(scale * (2.0f * u - 1.0f));
  }
}

// Keeps the GPU busy while the host queues the timed launches, so host-side
// launch overhead never shows up between a start and a stop event.
static __global__ void spin_kernel(uint64_t ns) {
  uint64_t start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < ns);
}

// Median times in microseconds of `reps` timed rounds of calls, after 3
// warm-up rounds: each round calls every contender once, in order, contender
// j of n in round r on input set (n r + j) % 4, each call between two
// events. With two contenders each reads its own two of the 4 rotating input
// sets, and both see the same clocks: on an H200 the long shapes drift
// 5-10% from one block of calls to the next, which moved a ratio of two
// separately timed blocks as much.
inline std::vector<double> median_rounds_us(int reps, const std::vector<std::function<void(int)>>& contenders) {
  const int n = int(contenders.size());
  for (int r = 0; r < 3; ++r)
    for (int j = 0; j < n; ++j) contenders[size_t(j)]((n * r + j) % 4);
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<cudaEvent_t> ev(size_t(reps * n + 1));
  for (auto& e : ev) CHECK_CUDA(cudaEventCreate(&e));
  spin_kernel<<<1, 1>>>(20ull * 1000 * 1000);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaEventRecord(ev[0]));
  for (int r = 0; r < reps; ++r)
    for (int j = 0; j < n; ++j) {
      contenders[size_t(j)]((n * r + j) % 4);
      CHECK_CUDA(cudaEventRecord(ev[size_t(n * r + j + 1)]));
    }
  CHECK_CUDA(cudaDeviceSynchronize());
  std::vector<double> medians;
  for (int j = 0; j < n; ++j) {
    std::vector<float> ms(static_cast<size_t>(reps));
    for (int r = 0; r < reps; ++r) {
      float* slot = ms.data() + r;
      CHECK_CUDA(cudaEventElapsedTime(slot, ev[size_t(n * r + j)], ev[size_t(n * r + j + 1)]));
    }
    std::sort(ms.begin(), ms.end());
    medians.push_back(1000.0 * ms[ms.size() / 2]);
  }
  for (auto& e : ev) CHECK_CUDA(cudaEventDestroy(e));
  return medians;
}

// cuBLASLt on f16 or bf16: C[M,N] = epilogue(A[M,K] @ B + bias), row-major,
// computed as column-major C^T = op(B') A^T, where B' is B seen column-major:
// [N, K] (nn.Linear) is a K x N matrix taken transposed, [K, N] an N x K one
// taken as it is. A plan per (shape, layout, epilogue).
struct LtGemm {
  cublasLtHandle_t handle = nullptr;
  void* workspace = nullptr;
  size_t workspace_bytes = size_t(64) << 20;
  LtGemm() {
    CHECK_CUBLAS(cublasLtCreate(&handle));
    CHECK_CUDA(cudaMalloc(&workspace, workspace_bytes));
  }
  ~LtGemm() {
    cudaFree(workspace);
    cublasLtDestroy(handle);
  }
  LtGemm(const LtGemm&) = delete;
  LtGemm& operator=(const LtGemm&) = delete;

  struct Plan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t w = nullptr, a = nullptr, c = nullptr;
    cublasLtMatmulHeuristicResult_t algo{};
    cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_DEFAULT;
  };

  // `b_is_nk`: B stored [N, K]; else [K, N]. `any_bias`: a valid bias
  // pointer for the heuristic; run() sets the real one.
  Plan plan(Shape s, cudaDataType_t type, bool b_is_nk, cublasLtEpilogue_t epilogue, const void* any_bias) {
    Plan p;
    p.epilogue = epilogue;
    CHECK_CUBLAS(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_w = b_is_nk ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a = CUBLAS_OP_N;
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &trans_w, sizeof trans_w));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &trans_a, sizeof trans_a));
    CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue));
    if (epilogue != CUBLASLT_EPILOGUE_DEFAULT)
      CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &any_bias, sizeof any_bias));
    if (b_is_nk)
      CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p.w, type, uint64_t(s.k), uint64_t(s.n), s.k));
    else
      CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p.w, type, uint64_t(s.n), uint64_t(s.k), s.n));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p.a, type, uint64_t(s.k), uint64_t(s.m), s.k));
    CHECK_CUBLAS(cublasLtMatrixLayoutCreate(&p.c, type, uint64_t(s.n), uint64_t(s.m), s.n));
    cublasLtMatmulPreference_t pref = nullptr;
    CHECK_CUBLAS(cublasLtMatmulPreferenceCreate(&pref));
    CHECK_CUBLAS(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                      &workspace_bytes, sizeof workspace_bytes));
    int found = 0;
    CHECK_CUBLAS(cublasLtMatmulAlgoGetHeuristic(handle, p.op, p.w, p.a, p.c, p.c, pref, 1, &p.algo, &found));
    CHECK_CUBLAS(cublasLtMatmulPreferenceDestroy(pref));
    if (found == 0) {
      std::fprintf(stderr, "cuBLASLt found no algorithm for (%s)\n", shape_str(s).c_str());
      std::exit(2);
    }
    return p;
  }

  void run(Plan& p, const void* a, const void* w, const void* bias, void* c) {
    if (p.epilogue != CUBLASLT_EPILOGUE_DEFAULT)
      CHECK_CUBLAS(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    const float alpha = 1.0f, beta = 0.0f;
    CHECK_CUBLAS(cublasLtMatmul(handle, p.op, &alpha, w, p.w, a, p.a, &beta, c, p.c, c, p.c, &p.algo.algo,
                                workspace, workspace_bytes, nullptr));
  }

  static void destroy(Plan& p) {
    cublasLtMatrixLayoutDestroy(p.w);
    cublasLtMatrixLayoutDestroy(p.a);
    cublasLtMatrixLayoutDestroy(p.c);
    cublasLtMatmulDescDestroy(p.op);
  }
};

}  // namespace harness
