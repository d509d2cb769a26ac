// Row normalization: LayerNorm and RMSNorm over the last dimension of a
// row-major [M, K] tensor. Two users: the standalone `norm_rows_kernel` for
// norms the planner leaves unfused, and the GEMM norm prologue
// (prologue.cuh; on sm90 its statistics come from `row_stats_kernel`), which
// shares `warp_row_stats` and `normalize8` so the paths compute the same
// function.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "numeric.cuh"

namespace fusion {

enum class NormKind { LayerNorm, RmsNorm };

// Learned parameters of a norm. `beta` is LayerNorm's shift; RMSNorm has none
// and ignores it.
struct NormArgs {
  const void* gamma;  // [K]
  const void* beta;   // [K], LayerNorm only
  float eps;
};

struct RowStats {
  float mean;  // 0 for RMSNorm
  float rstd;  // 1 / sqrt(variance + eps), or 1 / sqrt(mean(x^2) + eps)
};

// Mean and reciprocal standard deviation of one row, computed by a whole
// warp with 16-byte loads; every lane gets the result. K is a multiple of 8
// and the row is 16-byte aligned. One pass over the row: LayerNorm
// accumulates around the row's first element instead of zero, so a large
// common offset does not cancel catastrophically in E[x^2] - E[x]^2.
template <NormKind kKind, typename T>
__device__ __forceinline__ RowStats warp_row_stats(const T* row, int64_t K, float eps) {
  const int lane = threadIdx.x & 31;
  const float shift = kKind == NormKind::LayerNorm ? Numeric<T>::to_float(row[0]) : 0.0f;
  float sum = 0.0f, sum_sq = 0.0f;
#pragma unroll 4
  for (int64_t k = int64_t(lane) * kVecElems; k < K; k += 32 * kVecElems) {
    float x[8];
    vec8_to_float(load_vec8(row + k), x);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const float d = x[i] - shift;
      sum += d;
      sum_sq += d * d;
    }
  }
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    sum_sq += __shfl_xor_sync(0xffffffffu, sum_sq, offset);
  }
  const float inv_k = 1.0f / float(K);
  if constexpr (kKind == NormKind::LayerNorm) {
    const float mean_shifted = sum * inv_k;
    const float var = fmaxf(sum_sq * inv_k - mean_shifted * mean_shifted, 0.0f);
    return {shift + mean_shifted, rsqrtf(var + eps)};
  } else {
    return {0.0f, rsqrtf(sum_sq * inv_k + eps)};
  }
}

// gamma and (LayerNorm) beta of eight consecutive columns, as floats.
struct NormColumns {
  float gamma[8], beta[8];
};

template <NormKind kKind, typename T>
__device__ __forceinline__ NormColumns load_norm_columns(int64_t k0, const NormArgs& args) {
  NormColumns c;
  vec8_to_float(load_vec8(static_cast<const T*>(args.gamma) + k0), c.gamma);
  if constexpr (kKind == NormKind::LayerNorm) vec8_to_float(load_vec8(static_cast<const T*>(args.beta) + k0), c.beta);
  return c;
}

// Normalizes eight consecutive elements of a row in place, given their
// columns' gamma and beta.
template <NormKind kKind>
__device__ __forceinline__ void normalize8(float (&x)[8], RowStats s, const NormColumns& c) {
  if constexpr (kKind == NormKind::LayerNorm) {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = (x[i] - s.mean) * s.rstd * c.gamma[i] + c.beta[i];
  } else {
#pragma unroll
    for (int i = 0; i < 8; ++i) x[i] = x[i] * s.rstd * c.gamma[i];
  }
}

// Normalizes eight consecutive elements x[k0 .. k0+8) of a row in place.
template <NormKind kKind, typename T>
__device__ __forceinline__ void normalize8(float (&x)[8], RowStats s, int64_t k0, const NormArgs& args) {
  normalize8<kKind>(x, s, load_norm_columns<kKind, T>(k0, args));
}

template <NormKind kKind>
inline bool norm_args_valid(const NormArgs& a) {
  if (a.gamma == nullptr || !is_aligned16(a.gamma) || !(a.eps >= 0.0f)) return false;
  if (kKind == NormKind::LayerNorm) return a.beta != nullptr && is_aligned16(a.beta);
  return true;
}

// y = norm(x) row by row; one warp per row, grid-stride over rows. The
// second pass re-reads the row, which the first pass left in L1/L2.
template <NormKind kKind, typename T>
__global__ void norm_rows_kernel(const T* __restrict__ x, T* __restrict__ y, NormArgs args, int64_t M, int64_t K) {
  const int warps_per_block = blockDim.x / 32;
  const int lane = threadIdx.x & 31;
  for (int64_t row = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / 32; row < M;
       row += int64_t(gridDim.x) * warps_per_block) {
    const T* in = x + row * K;
    T* out = y + row * K;
    const RowStats s = warp_row_stats<kKind>(in, K, args.eps);
    for (int64_t k = int64_t(lane) * kVecElems; k < K; k += 32 * kVecElems) {
      float v[8];
      vec8_to_float(load_vec8(in + k), v);
      normalize8<kKind, T>(v, s, k, args);
      store_vec8(out + k, float_to_vec8<T>(v));
    }
  }
}

// The statistics of every row into `stats` ([M]); one warp per row,
// grid-stride over rows. The sm90 folded norm's first pass.
template <NormKind kKind, typename T>
__global__ void row_stats_kernel(const T* __restrict__ x, RowStats* __restrict__ stats, float eps, int64_t M,
                                 int64_t K) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The GEMM after it may start now (sm90's launcher makes it this grid's
  // programmatic dependent); it waits for this grid before reading stats.
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
  const int warps_per_block = blockDim.x / 32;
  for (int64_t row = int64_t(blockIdx.x) * warps_per_block + threadIdx.x / 32; row < M;
       row += int64_t(gridDim.x) * warps_per_block) {
    const RowStats s = warp_row_stats<kKind>(x + row * K, K, eps);
    if ((threadIdx.x & 31) == 0) stats[row] = s;
  }
}

// Blocks of 256 threads (8 rows at a time) for a one-warp-per-row kernel
// over M rows: enough to fill the device 16 times over, no more.
inline cudaError_t rows_grid(int64_t M, int64_t* blocks) {
  constexpr int kRowsPerBlock = 256 / 32;
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  const int64_t needed = (M + kRowsPerBlock - 1) / kRowsPerBlock;
  *blocks = needed < int64_t(sms) * 16 ? needed : int64_t(sms) * 16;
  return cudaSuccess;
}

template <NormKind kKind, typename T>
cudaError_t launch_row_stats(const T* x, RowStats* stats, float eps, int64_t M, int64_t K, cudaStream_t stream) {
  if (M <= 0) return cudaSuccess;
  int64_t blocks = 0;
  const cudaError_t err = rows_grid(M, &blocks);
  if (err != cudaSuccess) return err;
  row_stats_kernel<kKind, T><<<unsigned(blocks), 256, 0, stream>>>(x, stats, eps, M, K);
  return cudaGetLastError();
}

// Host launcher: cudaErrorInvalidValue for K not a positive multiple of 8,
// null or misaligned pointers, or a missing gamma/beta.
template <NormKind kKind, typename T>
cudaError_t launch_norm_rows(const T* x, T* y, const NormArgs& args, int64_t M, int64_t K, cudaStream_t stream) {
  if (M < 0 || K <= 0 || K % kVecElems != 0) return cudaErrorInvalidValue;
  if (x == nullptr || y == nullptr || !is_aligned16(x) || !is_aligned16(y)) return cudaErrorInvalidValue;
  if (!norm_args_valid<kKind>(args)) return cudaErrorInvalidValue;
  if (M == 0) return cudaSuccess;
  int64_t blocks = 0;
  const cudaError_t err = rows_grid(M, &blocks);
  if (err != cudaSuccess) return err;
  norm_rows_kernel<kKind, T><<<unsigned(blocks), 256, 0, stream>>>(x, y, args, M, K);
  return cudaGetLastError();
}

}  // namespace fusion
