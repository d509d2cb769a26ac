// What one fused GEMM launch computes: the operands, shapes and the extra
// tensors its prologue and epilogue read. Shared by every mainloop, the
// kernel template and the host launcher.
#pragma once

#include <stdint.h>

#include "epilogue.cuh"
#include "norm.cuh"

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
  T* c;  // [M, N], or [M, N / 2] for a gated GEMM (EpilogueChain::kGemmColsPerOutput)
  int64_t m, n, k;  // the GEMM's: a gated GEMM's n is twice C's columns
  EpilogueArgs epilogue;
  NormArgs norm;  // read only by a norm prologue
};

// The output tile a CTA computes: rows [m0, m0 + BM), columns [n0, n0 + BN).
struct TileCoord {
  int64_t m0, n0;
};

}  // namespace fusion
