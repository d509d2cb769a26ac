// Folding a norm into the weights of the GEMM after it, once, when the
// weights are bound (prologue.cuh, FoldedNorm, says why):
//   W'[n, k]   = W[n, k] · gamma[k], rounded to the element type
//   u[n]       = Σ_k W'[n, k], in f32 over the rounded W' the GEMM will read
//   c[n]       = Σ_k W[n, k] · beta[k], in f32 (LayerNorm; 0 for RMSNorm)
// col_terms[n] = (u[n], c[n]). W is [N, K] (nn.Linear) or [K, N] as the
// kernel's LayoutB says, and W' has the same layout. A gated GEMM's W is
// its gate and up weights interleaved (gated.cuh), read in place: the
// fold writes the interleaved W' and its 2F column terms.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "gated.cuh"
#include "norm.cuh"
#include "numeric.cuh"
#include "problem.cuh"

namespace fusion {

// [N, K]: one warp per row n of W, 16-byte chunks along K; W''s rows
// ld_out elements apart.
template <NormKind kKind, typename T, typename Weight>
__global__ void fold_rows_kernel(const Weight w, const T* __restrict__ gamma, const T* __restrict__ beta,
                                 T* __restrict__ w_folded, float2* __restrict__ col_terms, int64_t N, int64_t K,
                                 int64_t ld_out) {
  const int warps_per_block = blockDim.x / 32;
  const int lane = threadIdx.x & 31;
  for (int64_t n = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / 32; n < N;
       n += int64_t(gridDim.x) * warps_per_block) {
    float u = 0.0f, c = 0.0f;
    for (int64_t k = int64_t(lane) * kVecElems; k < K; k += 32 * kVecElems) {
      float x[8], g[8], folded[8];
      vec8_to_float(load_vec8(w.row(n, K) + k), x);
      vec8_to_float(load_vec8(gamma + k), g);
#pragma unroll
      for (int i = 0; i < 8; ++i) folded[i] = x[i] * g[i];
      const Vec8<T> rounded = float_to_vec8<T>(folded);
      store_vec8(w_folded + n * ld_out + k, rounded);
      vec8_to_float(rounded, folded);
#pragma unroll
      for (int i = 0; i < 8; ++i) u += folded[i];
      if constexpr (kKind == NormKind::LayerNorm) {
        float b[8];
        vec8_to_float(load_vec8(beta + k), b);
#pragma unroll
        for (int i = 0; i < 8; ++i) c = fmaf(x[i], b[i], c);
      }
    }
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) {
      u += __shfl_xor_sync(0xffffffffu, u, offset);
      c += __shfl_xor_sync(0xffffffffu, c, offset);
    }
    if (lane == 0) col_terms[n] = make_float2(u, c);
  }
}

// [K, N]: one thread per 8 consecutive columns n, down all of K (adjacent
// threads read adjacent 16 bytes of each row); W''s rows ld_out elements
// apart.
template <NormKind kKind, typename T, typename Weight>
__global__ void fold_columns_kernel(const Weight w, const T* __restrict__ gamma, const T* __restrict__ beta,
                                    T* __restrict__ w_folded, float2* __restrict__ col_terms, int64_t N, int64_t K,
                                    int64_t ld_out) {
  const int64_t n0 = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) * kVecElems;
  if (n0 >= N) return;
  float u[8] = {}, c[8] = {};
#pragma unroll 4
  for (int64_t k = 0; k < K; ++k) {
    float x[8], folded[8];
    vec8_to_float(load_vec8(w.columns(k, n0, N)), x);
    const float g = Numeric<T>::to_float(gamma[k]);
#pragma unroll
    for (int i = 0; i < 8; ++i) folded[i] = x[i] * g;
    const Vec8<T> rounded = float_to_vec8<T>(folded);
    store_vec8(w_folded + k * ld_out + n0, rounded);
    vec8_to_float(rounded, folded);
#pragma unroll
    for (int i = 0; i < 8; ++i) u[i] += folded[i];
    if constexpr (kKind == NormKind::LayerNorm) {
      const float b = Numeric<T>::to_float(beta[k]);
#pragma unroll
      for (int i = 0; i < 8; ++i) c[i] = fmaf(x[i], b, c[i]);
    }
  }
#pragma unroll
  for (int i = 0; i < 8; ++i) col_terms[n0 + i] = make_float2(u[i], c[i]);
}

// Host launcher: nothing for N = 0; cudaErrorInvalidValue for N or K not a
// multiple of 8, K = 0, a row stride of W' row_stride_of refuses (0 is
// dense: W''s rows as long as W's), a null or misaligned pointer, or a
// LayerNorm without beta. kGated: W is `w` and `w_up` (a gated GEMM's up
// weight, the shape of `w`) interleaved, and W' has 2N columns and so many
// terms; else `w_up` must be null.
template <NormKind kKind, typename T, LayoutB kLayout, bool kGated = false>
cudaError_t launch_fold_weights(const T* w, const T* w_up, const T* gamma, const T* beta, T* w_folded,
                                float2* col_terms, int64_t N, int64_t K, int64_t ld_folded, cudaStream_t stream) {
  if (N == 0) return cudaSuccess;  // a weight with no output columns: nothing to fold
  if (N < 0 || K <= 0 || N % kVecElems != 0 || K % kVecElems != 0) return cudaErrorInvalidValue;
  if (kGated != (w_up != nullptr)) return cudaErrorInvalidValue;
  const int64_t columns = kGated ? 2 * N : N;
  if (!row_stride_of(ld_folded, kLayout == LayoutB::NK ? K : columns, &ld_folded)) return cudaErrorInvalidValue;
  const void* pointers[] = {w, gamma, w_folded, col_terms, kKind == NormKind::LayerNorm ? beta : gamma,
                            kGated ? w_up : w};
  for (const void* p : pointers)
    if (p == nullptr || !is_aligned16(p)) return cudaErrorInvalidValue;
  using Weight = std::conditional_t<kGated, GatedWeights<T>, PlainWeight<T>>;
  const Weight weight = [&] {
    if constexpr (kGated)
      return GatedWeights<T>{w, w_up};
    else
      return PlainWeight<T>{w};
  }();
  if constexpr (kLayout == LayoutB::NK) {
    int64_t blocks = 0;
    const cudaError_t err = rows_grid(columns, &blocks);
    if (err != cudaSuccess) return err;
    fold_rows_kernel<kKind, T><<<unsigned(blocks), 256, 0, stream>>>(weight, gamma, beta, w_folded, col_terms, columns, K, ld_folded);
  } else {
    const int64_t threads = columns / kVecElems;
    fold_columns_kernel<kKind, T>
        <<<unsigned((threads + 127) / 128), 128, 0, stream>>>(weight, gamma, beta, w_folded, col_terms, columns, K, ld_folded);
  }
  return cudaGetLastError();
}

}  // namespace fusion
