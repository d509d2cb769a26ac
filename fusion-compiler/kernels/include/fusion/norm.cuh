// Row normalization: LayerNorm and RMSNorm over the last dimension of a
// row-major [M, K] tensor. Two users: the standalone launcher
// (`launch_norm_rows_with`: a block per row with the row in registers,
// `norm_row_blocks_kernel`, or a warp per row for longer rows), for norms
// the planner leaves unfused, a per-call norm before a GEMM and, without
// its affine (`launch_norm_rows` with gamma and beta null), the guard's
// vendor path of a GEMM whose norm is folded into its weight; and the
// GEMM norm prologue (prologue.cuh; on sm90 its statistics come from
// `row_stats_kernel`), which shares `warp_row_stats` and `normalize8` with
// the warp-per-row kernel. Every path computes the same function; the
// order of their f32 sums differs.
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

// kAffine false: the norm without its affine (gamma 1, beta 0; args'
// gamma and beta are null), which the guard's vendor path runs before
// cuBLASLt where the norm is folded into the GEMM's bound weight, which
// holds gamma and beta (fold.cuh).
template <NormKind kKind, typename T, bool kAffine = true>
__device__ __forceinline__ NormColumns load_norm_columns(int64_t k0, const NormArgs& args) {
  NormColumns c;
  if constexpr (!kAffine) {
#pragma unroll
    for (int i = 0; i < 8; ++i) c.gamma[i] = 1.0f, c.beta[i] = 0.0f;
    return c;
  }
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
template <NormKind kKind, typename T, bool kAffine = true>
__device__ __forceinline__ void normalize8(float (&x)[8], RowStats s, int64_t k0, const NormArgs& args) {
  normalize8<kKind>(x, s, load_norm_columns<kKind, T, kAffine>(k0, args));
}

template <NormKind kKind>
inline bool norm_args_valid(const NormArgs& a) {
  if (a.gamma == nullptr || !is_aligned16(a.gamma) || !(a.eps >= 0.0f)) return false;
  if (kKind == NormKind::LayerNorm) return a.beta != nullptr && is_aligned16(a.beta);
  return true;
}

// The sum of `v` over the block, in every thread (blockDim.x a multiple of
// 32), behind one barrier. `scratch` holds a float per warp; consecutive
// sums alternate between two such arrays, so no barrier is needed after the
// reads: a warp still reading one sum's array holds back the barrier of the
// next sum, which every later write of that array waits for.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  const int lane = threadIdx.x & 31;
  if (lane == 0) scratch[threadIdx.x / 32] = v;
  __syncthreads();
  v = lane < int(blockDim.x / 32) ? scratch[lane] : 0.0f;
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// The most threads of a block-per-row launch, and 16-byte chunks of a row
// per thread at most: rows of up to 512 * 8 * 8 = 32768 elements are held
// in registers (64 floats a thread).
constexpr int kRowBlockThreads = 512;
constexpr int kRowBlockMaxChunks = 8;

// y = norm(x) with one block per row (a grid of M blocks, so that the
// blocks an SM holds are at different steps of their rows and a finished
// block's place is taken at once; grid-stride beyond the grid's limit): each thread
// loads kChunks 16-byte chunks of the row into registers (chunk i of
// thread t is chunk t + i * blockDim.x), the block reduces them, and each
// thread normalizes and stores its own, so x is read once and y written
// once: a copy's traffic. LayerNorm's variance is the mean of the squared
// deviations from the mean, both from registers. Rows short enough for
// a warp are spread over more SMs this way too than by norm_rows_kernel,
// whose one warp per row leaves most SMs idle at a few hundred rows.
template <NormKind kKind, typename T, int kChunks, bool kAffine = true>
__global__ void __launch_bounds__(kRowBlockThreads) norm_row_blocks_kernel(const T* __restrict__ x, T* __restrict__ y,
                                                                           NormArgs args, int64_t M, int64_t K) {
  // Two arrays for block_sum's alternating sums: LayerNorm's mean and
  // squares, RMSNorm's rows in turn.
  constexpr int kWarps = kRowBlockThreads / 32;
  __shared__ float scratch[2 * kWarps];
  int turn = 0;  // kWarps once the next sum takes the second array
  const int64_t chunks = K / kVecElems;
  const float inv_k = 1.0f / float(K);
  for (int64_t row = blockIdx.x; row < M; row += gridDim.x) {
    const T* in = x + row * K;
    T* out = y + row * K;
    float v[kChunks][8];
    float sum = 0.0f;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int64_t c = threadIdx.x + int64_t(i) * blockDim.x;
      if (c < chunks) {
        vec8_to_float(load_vec8(in + c * kVecElems), v[i]);
      } else {
#pragma unroll
        for (int e = 0; e < 8; ++e) v[i][e] = 0.0f;
      }
#pragma unroll
      for (int e = 0; e < 8; ++e) sum += kKind == NormKind::LayerNorm ? v[i][e] : v[i][e] * v[i][e];
    }
    RowStats s{0.0f, 0.0f};
    if constexpr (kKind == NormKind::LayerNorm) {
      s.mean = block_sum(sum, scratch + turn) * inv_k;
      turn ^= kWarps;
      float squares = 0.0f;
#pragma unroll
      for (int i = 0; i < kChunks; ++i) {
        if (threadIdx.x + int64_t(i) * blockDim.x >= chunks) continue;
#pragma unroll
        for (int e = 0; e < 8; ++e) {
          const float d = v[i][e] - s.mean;
          squares += d * d;
        }
      }
      s.rstd = rsqrtf(block_sum(squares, scratch + turn) * inv_k + args.eps);
    } else {
      s.rstd = rsqrtf(block_sum(sum, scratch + turn) * inv_k + args.eps);
    }
    turn ^= kWarps;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int64_t c = threadIdx.x + int64_t(i) * blockDim.x;
      if (c >= chunks) continue;
      normalize8<kKind, T, kAffine>(v[i], s, c * kVecElems, args);
      store_vec8(out + c * kVecElems, float_to_vec8<T>(v[i]));
    }
  }
}

// y = norm(x) row by row; one warp per row, grid-stride over rows. The
// second pass re-reads the row, which the first pass left in L1/L2. For
// rows longer than norm_row_blocks_kernel holds.
template <NormKind kKind, typename T, bool kAffine = true>
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
      normalize8<kKind, T, kAffine>(v, s, k, args);
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
// null or misaligned pointers, or (kAffine) a missing gamma/beta, (not
// kAffine) a gamma or beta given.
template <NormKind kKind, typename T, bool kAffine = true>
cudaError_t launch_norm_rows_with(const T* x, T* y, const NormArgs& args, int64_t M, int64_t K,
                                  cudaStream_t stream) {
  if (M < 0 || K <= 0 || K % kVecElems != 0) return cudaErrorInvalidValue;
  if (x == nullptr || y == nullptr || !is_aligned16(x) || !is_aligned16(y)) return cudaErrorInvalidValue;
  if (kAffine ? !norm_args_valid<kKind>(args) : args.gamma != nullptr || args.beta != nullptr || !(args.eps >= 0.0f))
    return cudaErrorInvalidValue;
  if (M == 0) return cudaSuccess;
  const int64_t chunks = K / kVecElems;
  if (chunks > int64_t(kRowBlockThreads) * kRowBlockMaxChunks) {
    int64_t blocks = 0;
    const cudaError_t err = rows_grid(M, &blocks);
    if (err != cudaSuccess) return err;
    norm_rows_kernel<kKind, T, kAffine><<<unsigned(blocks), 256, 0, stream>>>(x, y, args, M, K);
    return cudaGetLastError();
  }
  // The fewest chunks per thread that a block of at most kRowBlockThreads
  // covers, and the fewest whole warps for them.
  int per_thread = 1;
  while (chunks > int64_t(kRowBlockThreads) * per_thread) per_thread *= 2;
  const int64_t threads = ((chunks + per_thread - 1) / per_thread + 31) / 32 * 32;
  // One block per row: the hardware hands out rows as blocks finish, with
  // no tail of blocks waiting for a place that a grid of exactly the
  // resident blocks would leave where registers hold fewer than the
  // threads allow.
  const unsigned grid = unsigned(M < int64_t(INT32_MAX) ? M : int64_t(INT32_MAX));
  switch (per_thread) {
    case 1: norm_row_blocks_kernel<kKind, T, 1, kAffine><<<grid, unsigned(threads), 0, stream>>>(x, y, args, M, K); break;
    case 2: norm_row_blocks_kernel<kKind, T, 2, kAffine><<<grid, unsigned(threads), 0, stream>>>(x, y, args, M, K); break;
    case 4: norm_row_blocks_kernel<kKind, T, 4, kAffine><<<grid, unsigned(threads), 0, stream>>>(x, y, args, M, K); break;
    default: norm_row_blocks_kernel<kKind, T, 8, kAffine><<<grid, unsigned(threads), 0, stream>>>(x, y, args, M, K); break;
  }
  return cudaGetLastError();
}

// The standalone norm's launcher (norm.cu.hbs): the norm with its affine,
// or, where gamma and beta are both null, without it (kAffine false).
template <NormKind kKind, typename T>
cudaError_t launch_norm_rows(const T* x, T* y, const NormArgs& args, int64_t M, int64_t K, cudaStream_t stream) {
  if (args.gamma == nullptr && args.beta == nullptr) return launch_norm_rows_with<kKind, T, false>(x, y, args, M, K, stream);
  return launch_norm_rows_with<kKind, T, true>(x, y, args, M, K, stream);
}

}  // namespace fusion
