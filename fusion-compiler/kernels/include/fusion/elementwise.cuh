// Standalone elementwise kernels over a row-major [M, N] tensor, for the ops
// the planner leaves unfused: y = Chain(x), where Chain is an
// ElementwiseChain of the same steps the GEMM epilogues use (Residual is
// "add", Mul is "mul", Bias is "bias add", and the activations), one to
// FUSION_ELEMENTWISE_MAX_STEPS of them, step i reading operand i (abi.h).
// 16-byte loads and stores, grid-stride, 64-bit indices.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <tuple>
#include <utility>

#include "abi.h"  // FUSION_ELEMENTWISE_MAX_STEPS
#include "epilogue.cuh"
#include "numeric.cuh"

namespace fusion {

// The tensors a chain reads besides x, one per step (null for a step that
// reads none), as fusion_elementwise_params holds them.
struct ElementwiseOperands {
  const void* step[FUSION_ELEMENTWISE_MAX_STEPS];
};

// The epilogue arguments of a step whose operand is `operand`. A step reads
// one field of EpilogueArgs, the one of its kind (Bias the bias, Residual
// the residual, Mul the multiplier), so every field holds it: the steps stay
// the GEMM epilogue's, and two steps of one kind read tensors of their own.
__host__ __device__ __forceinline__ EpilogueArgs step_args(const void* operand) {
  EpilogueArgs a{};
  a.bias = operand;
  a.residual = operand;
  a.multiplier = operand;
  return a;
}

// Steps... applied in order, step i with operand i.
template <typename... Steps>
struct ElementwiseChain {
  static constexpr int kSteps = int(sizeof...(Steps));
  static_assert(kSteps >= 1 && kSteps <= FUSION_ELEMENTWISE_MAX_STEPS,
                "an elementwise chain has 1 to FUSION_ELEMENTWISE_MAX_STEPS steps");

  // Whether every step has the operand it reads.
  static bool operands_valid(const ElementwiseOperands& ops) {
    return valid(ops, std::index_sequence_for<Steps...>{});
  }

  // The values of y at (m, n) and (m, n + 1) given x's there; `ld` is N.
  template <typename T>
  static __device__ __forceinline__ float2 apply(float2 v, int64_t m, int64_t n, int64_t ld,
                                                 const ElementwiseOperands& ops) {
    return apply_steps<T>(v, m, n, ld, ops, std::index_sequence_for<Steps...>{});
  }

 private:
  template <size_t I>
  using Step = std::tuple_element_t<I, std::tuple<Steps...>>;

  template <size_t... I>
  static bool valid(const ElementwiseOperands& ops, std::index_sequence<I...>) {
    return (true && ... && Step<I>::args_valid(step_args(ops.step[I])));
  }

  template <typename T, size_t... I>
  static __device__ __forceinline__ float2 apply_steps(float2 v, int64_t m, int64_t n, int64_t ld,
                                                       const ElementwiseOperands& ops, std::index_sequence<I...>) {
    ((v = Step<I>::template apply<T>(v, m, n, ld, step_args(ops.step[I]))), ...);
    return v;
  }
};

template <typename Chain, typename T>
__global__ void elementwise_kernel(const T* x, T* y, ElementwiseOperands ops, int64_t M, int64_t N) {
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
      out.set_pair(q, Numeric<T>::float2_to_pair(Chain::template apply<T>(v, m, n + 2 * q, N, ops)));
    }
    store_vec8(y + first, out);
  }
}

// cudaErrorInvalidValue for N not a multiple of 8, a null or misaligned
// pointer, or a step without its operand. `y` may alias `x`.
template <typename Chain, typename T>
cudaError_t launch_elementwise(const T* x, T* y, const ElementwiseOperands& ops, int64_t M, int64_t N,
                               cudaStream_t stream) {
  if (M < 0 || N < 0 || N % kVecElems != 0) return cudaErrorInvalidValue;
  if (x == nullptr || y == nullptr || !is_aligned16(x) || !is_aligned16(y)) return cudaErrorInvalidValue;
  if (!Chain::operands_valid(ops)) return cudaErrorInvalidValue;
  for (const void* ptr : ops.step)
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
  elementwise_kernel<Chain, T><<<unsigned(blocks), kThreads, 0, stream>>>(x, y, ops, M, N);
  return cudaGetLastError();
}

}  // namespace fusion
