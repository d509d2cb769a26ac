// The sm80 collective epilogue: the epilogue chain (epilogue.cuh) on a CTA
// tile's mma accumulators, and C stored either straight from registers
// (Store::Direct) or through the idle pipeline buffers (Store::Staged); see
// Store in mainloop.cuh for why each.
#pragma once

#include <stdint.h>
#include <string.h>

#include "../numeric.cuh"
#include "../problem.cuh"
#include "primitives.cuh"

namespace fusion {
namespace sm80 {

// Accumulators: the mainloop's, c[WM / 16][WN / 8][4] per thread.
template <typename T, typename Tile>
struct CollectiveEpilogue {
  static constexpr int BM = Tile::BM, BN = Tile::BN, WM = Tile::WM, WN = Tile::WN;
  static constexpr int kThreads = Tile::kThreads;
  static constexpr int kFragsM = WM / 16, kFragsN = WN / 8;

  // Applies the epilogue chain to the accumulators and stores C. In an m16n8
  // fragment, lane l holds columns 2*(l%4), +1 of rows l/4 and l/4 + 8.
  template <typename Epilogue, typename Accumulators>
  static __device__ __forceinline__ void store(const Accumulators& acc, const GemmArgs<T>& p, TileCoord tile) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int warp_m = warp / Tile::kWarpsN, warp_n = warp % Tile::kWarpsN;
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
      const int64_t m = tile.m0 + warp_m * WM + i * 16 + lane / 4;
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
        const int64_t n = tile.n0 + warp_n * WN + j * 8 + (lane % 4) * 2;
        const float(&c)[4] = acc.c[i][j];
        Epilogue::template store_pair_checked<T>(p.c, make_float2(c[0], c[1]), m, n, p.m, p.n, p.epilogue);
        Epilogue::template store_pair_checked<T>(p.c, make_float2(c[2], c[3]), m + 8, n, p.m, p.n, p.epilogue);
      }
    }
  }

  // Store::Staged. The C tile passes through shared memory as T, BM rows of
  // BN + 8 elements: with the 16-byte pad, the 8 rows of a fragment store
  // start 4 banks apart, so a warp's 4-byte writes hit 32 distinct banks.
  static constexpr int kStagedRowElems = BN + 8;
  static constexpr size_t kStagedBytes = size_t(BM) * kStagedRowElems * sizeof(T);

  template <typename Epilogue, typename Accumulators>
  static __device__ __forceinline__ void store_staged(Accumulators& acc, const GemmArgs<T>& p, TileCoord tile,
                                                      unsigned char* smem) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int warp_m = warp / Tile::kWarpsN, warp_n = warp % Tile::kWarpsN;
    T* staged = reinterpret_cast<T*>(smem);
    // The chain, in registers. Rows and columns outside C are clamped to the
    // last ones inside: the chain reads only valid memory and runs without
    // branches, so an operand of column n (bias) is loaded once for all of
    // the thread's rows; values computed for clamped pairs are never stored.
    const int64_t m_last = p.m - 1, n_last = p.n - 2;
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
      const int64_t m = tile.m0 + warp_m * WM + i * 16 + lane / 4;
      const int64_t m_lo = m < m_last ? m : m_last, m_hi = m + 8 < m_last ? m + 8 : m_last;
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
        const int64_t n_raw = tile.n0 + warp_n * WN + j * 8 + (lane % 4) * 2;
        const int64_t n = n_raw < n_last ? n_raw : n_last;
        float(&c)[4] = acc.c[i][j];
        const float2 lo = Epilogue::template apply<T>(make_float2(c[0], c[1]), m_lo, n, p.n, p.epilogue);
        const float2 hi = Epilogue::template apply<T>(make_float2(c[2], c[3]), m_hi, n, p.n, p.epilogue);
        c[0] = lo.x;
        c[1] = lo.y;
        c[2] = hi.x;
        c[3] = hi.y;
      }
    }
    // Every warp's last ldmatrix of the K loop (which reads a stale stage
    // after the last tile) is done before the stage buffers are overwritten.
    __syncthreads();
    const uint32_t staged_base = smem_addr(staged);
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
      const int row = warp_m * WM + i * 16 + lane / 4;
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
        const int col = warp_n * WN + j * 8 + (lane % 4) * 2;
        const float(&c)[4] = acc.c[i][j];
        st_shared_pair(staged_base + uint32_t((row * kStagedRowElems + col) * sizeof(T)), c[0], c[1]);
        st_shared_pair(staged_base + uint32_t(((row + 8) * kStagedRowElems + col) * sizeof(T)), c[2], c[3]);
      }
    }
    __syncthreads();
    // C from shared memory: thread t always copies 16-byte chunk t % (BN/8)
    // of rows t / (BN/8), + kRowsPerPass, ...
    constexpr int kChunksPerRow = BN / 8;
    constexpr int kRowsPerPass = kThreads / kChunksPerRow;
    static_assert(kThreads % kChunksPerRow == 0 && BM % kRowsPerPass == 0,
                  "the CTA's threads cover whole rows of the staged tile");
    const int chunk = threadIdx.x % kChunksPerRow, row0 = threadIdx.x / kChunksPerRow;
    const int64_t n = tile.n0 + chunk * 8;
    if (n >= p.n) return;
    T* out = p.c + (tile.m0 + row0) * p.n + n;
    const int64_t rows_left = p.m - tile.m0 - row0;
#pragma unroll
    for (int r = 0; r < BM / kRowsPerPass; ++r) {
      if (r * kRowsPerPass < rows_left) {
        const uint4 v = ld_shared_vec(
            staged_base + uint32_t(((row0 + r * kRowsPerPass) * kStagedRowElems + chunk * 8) * sizeof(T)));
        st_global_vec(out + int64_t(r * kRowsPerPass) * p.n, v);
      }
    }
  }

  // Shared-memory accesses by 32-bit address, as the fragment loads.
  static __device__ __forceinline__ void st_shared_pair(uint32_t addr, float x, float y) {
    const typename Numeric<T>::Pair v = Numeric<T>::float2_to_pair(make_float2(x, y));
    uint32_t bits;
    memcpy(&bits, &v, 4);
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(bits) : "memory");
  }
  // One 16-byte store. Spelled out because a uint4 assignment built from
  // an asm's four outputs was split into four 4-byte stores (nvcc 13.0).
  static __device__ __forceinline__ void st_global_vec(T* ptr, uint4 v) {
    asm volatile("st.global.v4.b32 [%0], {%1,%2,%3,%4};\n" ::"l"(ptr), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
  }
  static __device__ __forceinline__ uint4 ld_shared_vec(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
  }
};

}  // namespace sm80
}  // namespace fusion
