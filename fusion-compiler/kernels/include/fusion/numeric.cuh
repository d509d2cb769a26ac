// Element types of fusion's kernels: f16 (__half) and bf16 (__nv_bfloat16)
// storage, f32 arithmetic; e4m3 (__nv_fp8_e4m3) operands of sm90's FP8
// GEMM, which writes bf16 (OutputOf). Everything that converts between the two or moves
// 16-byte vectors of elements goes through here, so the mainloops, epilogues
// and standalone kernels never spell out a conversion intrinsic themselves.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

namespace fusion {

// Eight 16-bit elements: the unit of every global and shared memory access
// (16 bytes is the widest load a thread can issue and what cp.async copies).
constexpr int kVecElems = 8;

template <typename T>
struct Numeric;

// What a GEMM whose operands are T writes: T itself, and bf16 for FP8
// operands (the IR's dtype of an FP8 product), whose scales the epilogue
// applies first (epilogue.cuh, Dequantize).
template <typename T>
struct GemmOutput {
  using type = T;
};
template <>
struct GemmOutput<__nv_fp8_e4m3> {
  using type = __nv_bfloat16;
};
template <typename T>
using OutputOf = typename GemmOutput<T>::type;

// Whether `count` elements of T fill whole 16-byte units: TMA's rule for a
// row stride, and the vector width of every other loader.
template <typename T>
__host__ __device__ constexpr bool whole_16_bytes(int64_t count) {
  return count * int64_t(sizeof(T)) % 16 == 0;
}

template <>
struct Numeric<__half> {
  using Pair = __half2;
  static constexpr const char* name = "f16";
  static __host__ __device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
  static __host__ __device__ __forceinline__ __half from_float(float x) { return __float2half_rn(x); }
  static __device__ __forceinline__ float2 pair_to_float2(__half2 v) { return __half22float2(v); }
  static __device__ __forceinline__ __half2 float2_to_pair(float2 v) { return __floats2half2_rn(v.x, v.y); }
};

template <>
struct Numeric<__nv_bfloat16> {
  using Pair = __nv_bfloat162;
  static constexpr const char* name = "bf16";
  static __host__ __device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
  static __host__ __device__ __forceinline__ __nv_bfloat16 from_float(float x) { return __float2bfloat16_rn(x); }
  static __device__ __forceinline__ float2 pair_to_float2(__nv_bfloat162 v) { return __bfloat1622float2(v); }
  static __device__ __forceinline__ __nv_bfloat162 float2_to_pair(float2 v) {
    return __floats2bfloat162_rn(v.x, v.y);
  }
};

// A 16-byte vector of eight elements, kept as raw bits (what loads, stores
// and cp.async move) and read or written as four packed pairs.
template <typename T>
struct Vec8 {
  using Pair = typename Numeric<T>::Pair;
  uint4 bits;

  __device__ __forceinline__ Pair pair(int i) const {
    Pair p;
    memcpy(&p, reinterpret_cast<const char*>(&bits) + 4 * i, 4);
    return p;
  }
  __device__ __forceinline__ void set_pair(int i, Pair p) { memcpy(reinterpret_cast<char*>(&bits) + 4 * i, &p, 4); }
};

// Two adjacent elements as raw bits; loads and stores of pairs need 4-byte
// alignment, which even column indices of 16-bit types guarantee.
template <typename T>
__device__ __forceinline__ float2 load_pair(const T* p) {
  return Numeric<T>::pair_to_float2(*reinterpret_cast<const typename Numeric<T>::Pair*>(p));
}

template <typename T>
__device__ __forceinline__ void store_pair(T* p, float2 v) {
  *reinterpret_cast<typename Numeric<T>::Pair*>(p) = Numeric<T>::float2_to_pair(v);
}

template <typename T>
__device__ __forceinline__ Vec8<T> load_vec8(const T* p) {
  Vec8<T> v;
  v.bits = *reinterpret_cast<const uint4*>(p);
  return v;
}

template <typename T>
__device__ __forceinline__ void store_vec8(T* p, const Vec8<T>& v) {
  *reinterpret_cast<uint4*>(p) = v.bits;
}

// tanh from the special-function unit (sm_75 and newer): one instruction,
// relative error about 2^-11.
__device__ __forceinline__ float tanh_approx(float x) {
  float y;
  asm("tanh.approx.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Vec8 <-> eight floats, two at a time through the packed conversions.
template <typename T>
__device__ __forceinline__ void vec8_to_float(const Vec8<T>& v, float (&out)[8]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 f = Numeric<T>::pair_to_float2(v.pair(i));
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

template <typename T>
__device__ __forceinline__ Vec8<T> float_to_vec8(const float (&in)[8]) {
  Vec8<T> v;
#pragma unroll
  for (int i = 0; i < 4; ++i) v.set_pair(i, Numeric<T>::float2_to_pair(make_float2(in[2 * i], in[2 * i + 1])));
  return v;
}

__host__ __device__ __forceinline__ bool is_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

}  // namespace fusion
