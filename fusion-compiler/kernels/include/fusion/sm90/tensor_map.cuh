// Host side of the sm90 kernel: the TMA tensor maps of its operands,
// encoded through the driver entry point that the CUDA run time loaded.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include <type_traits>

#include "../numeric.cuh"

namespace fusion {
namespace sm90 {
namespace detail {

// cuTensorMapEncodeTiled from the driver the runtime loaded (no -lcuda).
inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &found) !=
            cudaSuccess ||
        found != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

// A row-major [rows, cols] matrix of 16-bit or FP8 elements whose rows
// start `row_stride` elements apart (cols for dense rows), moved in boxes of
// box_rows rows of box_bytes bytes each (128: one k-block of A or B, 64 or
// 128 columns; 128, 64 or 32: a box of C's staging tile,
// collective_epilogue.cuh) with the swizzle of as many bytes. Rows whose stride is 16
// bytes but not 32 bytes aligned (cols an odd multiple of 8) are promoted
// into L2 128 bytes at a time, the others 256: on an H200 such rows made
// the GEMM 1.4-1.6x slower than rows a few elements longer, and 128-byte
// promotion takes back 12-17% of that time ((2000, 3000, 1000): 36.2 to 31.8 us),
// while on aligned rows 256 bytes was level or up to 2% faster
// (benchmarks/HISTORY.md v22).
template <typename T>
cudaError_t encode_matrix(CUtensorMap* map, const T* base, int64_t rows, int64_t cols, uint32_t box_rows,
                          int64_t row_stride, uint32_t box_bytes = 128) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  // TMA moves FP8 codes as bytes.
  const CUtensorMapDataType type = std::is_same_v<T, __half>           ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16
                                   : std::is_same_v<T, __nv_fp8_e4m3> ? CU_TENSOR_MAP_DATA_TYPE_UINT8
                                                                        : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(row_stride) * sizeof(T)};
  const CUtensorMapL2promotion promotion =
      strides[0] % 32 == 0 ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  const cuuint32_t box[2] = {cuuint32_t(box_bytes / sizeof(T)), box_rows};
  const CUtensorMapSwizzle swizzle = box_bytes == 128  ? CU_TENSOR_MAP_SWIZZLE_128B
                                     : box_bytes == 64 ? CU_TENSOR_MAP_SWIZZLE_64B
                                                       : CU_TENSOR_MAP_SWIZZLE_32B;
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(map, type, 2, const_cast<T*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle,
                            promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}
}  // namespace detail
}  // namespace sm90
}  // namespace fusion
