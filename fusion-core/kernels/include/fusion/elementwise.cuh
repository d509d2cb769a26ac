// Standalone elementwise kernels over a row-major [M, N] tensor, for the ops
// the planner leaves unfused: y = Chain(x), where Chain is an EpilogueChain
// of the same steps the GEMM epilogues use (Residual is "add", Mul is "mul",
// Bias is "bias add", and the activations). 16-byte loads and stores,
// grid-stride, 64-bit indices.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "epilogue.cuh"
#include "numeric.cuh"

namespace fusion {

template <typename Chain, typename T>
__global__ void elementwise_kernel(const T* x, T* y, EpilogueArgs args, int64_t M,
                                   int64_t N) {
  const int64_t chunks = M * N / kVecElems;
  for (int64_t c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; c < chunks;
       c += int64_t(gridDim.x) * blockDim.x) {
    const int64_t first = c * kVecElems;
    // N is a multiple of 8, so a chunk never crosses a row.
    const int64_t m = first / N, n = first % N;
    const Vec8<T> in = load_vec8(x + first);
    Vec8<T> out;
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float2 v = Numeric<T>::pair_to_float2(in.pair(q));
      out.set_pair(q, Numeric<T>::float2_to_pair(Chain::template apply<T>(v, m, n + 2 * q, N, args)));
    }
    store_vec8(y + first, out);
  }
}

// cudaErrorInvalidValue for N not a multiple of 8, or null or misaligned
// pointers. `y` may alias `x`.
template <typename Chain, typename T>
cudaError_t launch_elementwise(const T* x, T* y, const EpilogueArgs& args, int64_t M, int64_t N,
                               cudaStream_t stream) {
  if (M < 0 || N < 0 || N % kVecElems != 0) return cudaErrorInvalidValue;
  if (x == nullptr || y == nullptr || !is_aligned16(x) || !is_aligned16(y)) return cudaErrorInvalidValue;
  if (!Chain::args_valid(args)) return cudaErrorInvalidValue;
  const void* extra[] = {args.bias, args.residual, args.multiplier};
  for (const void* ptr : extra)
    if (ptr != nullptr && !is_aligned16(ptr)) return cudaErrorInvalidValue;
  if (M == 0 || N == 0) return cudaSuccess;
  int device = 0, sms = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err == cudaSuccess) err = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  if (err != cudaSuccess) return err;
  constexpr int kThreads = 256;
  const int64_t chunks = M * N / kVecElems;
  const int64_t blocks_needed = (chunks + kThreads - 1) / kThreads;
  // Enough CTAs to fill every SM several times over; the grid-stride loop
  // covers the rest.
  const int64_t max_blocks = int64_t(sms) * 32;
  const int64_t blocks = blocks_needed < max_blocks ? blocks_needed : max_blocks;
  elementwise_kernel<Chain, T><<<unsigned(blocks), kThreads, 0, stream>>>(x, y, args, M, N);
  return cudaGetLastError();
}

}  // namespace fusion
