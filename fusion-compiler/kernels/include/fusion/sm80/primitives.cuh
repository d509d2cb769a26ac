// sm80 building blocks of the mainloop (mainloop.cuh): the XOR swizzle of
// its shared-memory tiles, cp.async copies, ldmatrix fragment loads and the
// m16n8k16 tensor-core mma.
#pragma once

#include <stdint.h>

#include "../numeric.cuh"

namespace fusion {
namespace sm80 {

// Element offset of 16-byte chunk `chunk` of row `row` in a row-major
// shared-memory tile with kCols 16-bit elements per row. The chunk index is
// XORed with a function of the row so that the 8 row addresses of one
// ldmatrix 8x8 matrix (same logical chunk, 8 consecutive rows) land in 8
// distinct 16-byte bank groups of a 128-byte line: conflict-free for rows of
// 32, 64 or more elements, and for the row-wise cp.async writes.
// Whether rows of `cols` elements can be swizzled: 2, 4, 8, ... chunks.
constexpr bool swizzle_fits(int cols) { return cols / 8 >= 2 && ((cols / 8) & (cols / 8 - 1)) == 0 && cols % 8 == 0; }

template <int kCols>
struct Swizzle {
  static constexpr int kChunks = kCols / 8;
  static_assert(swizzle_fits(kCols), "rows of 16, 32, 64, ... elements");
  static constexpr int kRowsPerLine = kChunks >= 8 ? 1 : 8 / kChunks;
  static constexpr int kMask = (kChunks >= 8 ? 8 : kChunks) - 1;
  static __device__ __forceinline__ int offset(int row, int chunk) {
    return row * kCols + ((chunk ^ ((row / kRowsPerLine) & kMask)) << 3);
  }
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte global -> shared copy; when `valid` is false nothing is read and
// the destination is zero-filled (src-size 0).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}
// The same with an L2 prefetch hint: the copy also pulls the kPrefetchBytes
// aligned block around the source into L2 (0: no hint, as cp_async16).
template <int kPrefetchBytes>
__device__ __forceinline__ void cp_async16_prefetch(void* dst, const void* src, bool valid) {
  if constexpr (kPrefetchBytes == 64)
    asm volatile("cp.async.cg.shared.global.L2::64B [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
  else if constexpr (kPrefetchBytes == 128)
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
  else if constexpr (kPrefetchBytes == 256)
    asm volatile("cp.async.cg.shared.global.L2::256B [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0)
                 : "memory");
  else
    cp_async16(dst, src, valid);
}
// The "memory" clobbers keep the compiler from moving ordinary shared-memory
// accesses (the norm prologue's in-place pass) across the copies and waits.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kPending) : "memory");
}

// ldmatrix from a shared-memory byte address (see smem_addr).
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// c += a * b for one m16n8k16 fragment, f32 accumulators.
template <typename T>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&c)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&c)[4], const uint32_t (&a)[4],
                                                         const uint32_t (&b)[2]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

}  // namespace sm80
}  // namespace fusion
