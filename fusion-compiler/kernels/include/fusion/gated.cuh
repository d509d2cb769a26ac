// A gated (GLU) GEMM's weights. `Act(x·W_gateᵀ) * (x·W_upᵀ)` (SwiGLU with
// Act = SiLU, GeGLU with GELU) runs as one GEMM over the two weights
// interleaved in blocks of 8 output columns:
//   rows 16j .. 16j + 7 of the [2F, K] weight: W_gate rows 8j .. 8j + 7
//   rows 16j + 8 .. 16j + 15:                  W_up rows 8j .. 8j + 7
// ([K, 2F] the same way by columns for a [K, F] layout), so that the GEMM's
// accumulators hold gate and up of each output column in the same thread
// and the epilogue (epilogue.cuh, GatedChain) combines them in registers:
// A is read once and the [M, F] projections are never written.
//
// The interleaved weight is made once when the weights are bound (the
// unit's `_fold_weights`, which also folds a norm into it: fold.cuh reads
// its rows through GatedWeights), or per call into the launch's workspace
// when the call passes both weights (fusion_gemm_params::b_up).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "norm.cuh"  // rows_grid
#include "numeric.cuh"
#include "problem.cuh"

namespace fusion {

// Output columns per block of the interleave: one mma fragment's width.
constexpr int kGateBlock = 8;

// The interleaved weight, read in place from its two halves. N is the
// interleaved weight's 2F.
template <typename T>
struct GatedWeights {
  const T* gate;
  const T* up;

  // Row n of the [2F, K] weight (LayoutB::NK).
  __device__ __forceinline__ const T* row(int64_t n, int64_t K) const {
    const int64_t block = n / kGateBlock;
    return (block & 1 ? up : gate) + ((block >> 1) * kGateBlock + n % kGateBlock) * K;
  }
  // Columns n0 .. n0 + 7 (n0 a multiple of 8) of row k of the [K, 2F]
  // weight (LayoutB::KN).
  __device__ __forceinline__ const T* columns(int64_t k, int64_t n0, int64_t N) const {
    const int64_t block = n0 / kGateBlock;
    return (block & 1 ? up : gate) + k * (N / 2) + (block >> 1) * kGateBlock;
  }
};

// A plain weight through the same interface.
template <typename T>
struct PlainWeight {
  const T* w;

  __device__ __forceinline__ const T* row(int64_t n, int64_t K) const { return w + n * K; }
  __device__ __forceinline__ const T* columns(int64_t k, int64_t n0, int64_t N) const { return w + k * N + n0; }
};

// out = the interleaved weight, 16 bytes per thread and step, its rows
// ld_out elements apart.
template <typename T, LayoutB kLayout>
__global__ void interleave_kernel(GatedWeights<T> src, T* __restrict__ out, int64_t N, int64_t K, int64_t ld_out) {
  const int64_t chunks_per_row = (kLayout == LayoutB::NK ? K : N) / kVecElems;
  const int64_t rows = kLayout == LayoutB::NK ? N : K;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < rows * chunks_per_row;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / chunks_per_row, c = (i % chunks_per_row) * kVecElems;
    if constexpr (kLayout == LayoutB::NK)
      store_vec8(out + r * ld_out + c, load_vec8(src.row(r, K) + c));
    else
      store_vec8(out + r * ld_out + c, load_vec8(src.columns(r, c, N)));
  }
}

// Bytes of the interleaved weight of two [f, k] weights.
template <typename T>
inline size_t interleaved_bytes(int64_t f, int64_t k) {
  return 2 * size_t(f) * size_t(k) * sizeof(T);
}

// Host launcher: `out` = gate and up ([f, k] or [k, f] each, as kLayout
// says) interleaved, its rows `ld_out` elements apart (0: dense, k or 2f);
// nothing for f = 0. cudaErrorInvalidValue for f or k not a multiple of 8,
// k = 0, a row stride row_stride_of refuses, or a null or misaligned
// pointer.
template <typename T, LayoutB kLayout>
cudaError_t launch_interleave(const T* gate, const T* up, T* out, int64_t f, int64_t k, int64_t ld_out,
                              cudaStream_t stream) {
  if (f == 0) return cudaSuccess;
  if (f < 0 || k <= 0 || f % kGateBlock != 0 || k % kVecElems != 0) return cudaErrorInvalidValue;
  if (!row_stride_of(ld_out, kLayout == LayoutB::NK ? k : 2 * f, &ld_out)) return cudaErrorInvalidValue;
  const void* pointers[] = {gate, up, out};
  for (const void* p : pointers)
    if (p == nullptr || !is_aligned16(p)) return cudaErrorInvalidValue;
  // One 256-thread block per 256 chunks of 16 bytes, at most 16 per SM
  // (rows_grid's cap: it counts a block per 8 rows).
  const int64_t chunks = 2 * f * k / kVecElems;
  int64_t blocks = 0;
  const cudaError_t err = rows_grid(8 * ((chunks + 255) / 256), &blocks);
  if (err != cudaSuccess) return err;
  interleave_kernel<T, kLayout><<<unsigned(blocks), 256, 0, stream>>>(GatedWeights<T>{gate, up}, out, 2 * f, k, ld_out);
  return cudaGetLastError();
}

}  // namespace fusion
