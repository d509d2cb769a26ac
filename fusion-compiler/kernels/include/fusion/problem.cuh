// What one fused GEMM launch computes: the operands, shapes and the extra
// tensors its prologue and epilogue read. Shared by every mainloop, the
// kernel template and the host launcher.
#pragma once

#include <stdint.h>

#include "epilogue.cuh"
#include "norm.cuh"
#include "numeric.cuh"

namespace fusion {

// How B is stored. A is always [M, K] row-major and C [M, N] row-major.
enum class LayoutB {
  KN,  // [K, N] row-major
  NK,  // [N, K] row-major, the way nn.Linear stores its weight
};

template <typename T>
struct GemmArgs {
  const T* a;  // [M, K]
  const T* b;  // [K, N] or [N, K], see LayoutB
  // A gated GEMM's up weight when the call passes gate (b) and up apart:
  // the launch interleaves them first (gated.cuh); null otherwise.
  const T* b_up;
  // [M, N], or [M, N / 2] for a gated GEMM (EpilogueChain::kGemmColsPerOutput);
  // bf16 for FP8 operands (OutputOf).
  OutputOf<T>* c;
  int64_t m, n, k;  // the GEMM's: a gated GEMM's n is twice C's columns
  // B's row stride in elements, never 0 here (the launcher fills in the
  // dense one, dense_ldb): at least a row's length, a multiple of 8.
  int64_t ldb;
  EpilogueArgs epilogue;
  NormArgs norm;  // read only by a norm prologue
};

// The length of B's rows: K for [N, K], N for [K, N].
template <LayoutB kLayout, typename T>
__host__ __device__ inline int64_t b_row_length(const GemmArgs<T>& p) {
  return kLayout == LayoutB::NK ? p.k : p.n;
}

// The row stride a launch's caller gives for a matrix whose rows hold
// `row_length` elements: 0 for dense rows (row_length), else at least
// row_length and a multiple of 8 (16-byte aligned rows). Writes it to
// `stride`; false for one that is neither.
inline bool row_stride_of(int64_t given, int64_t row_length, int64_t* stride) {
  *stride = given != 0 ? given : row_length;
  return *stride >= row_length && *stride % 8 == 0;
}

// The output tile a CTA computes: rows [m0, m0 + BM), columns [n0, n0 + BN).
struct TileCoord {
  int64_t m0, n0;
};

}  // namespace fusion
