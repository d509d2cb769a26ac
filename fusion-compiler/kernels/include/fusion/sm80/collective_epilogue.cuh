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

  // The chain's value of C at (m, n), (m, n + 1), from fragment (i, j)'s
  // pair `half` (0: row l/4, 1: row l/4 + 8): a gated chain reads gate
  // there and up in fragment j + 1 (epilogue.cuh, GatedChain).
  template <typename Epilogue, typename Accumulators>
  static __device__ __forceinline__ float2 chain_pair(const Accumulators& acc, int i, int j, int half, int64_t m,
                                                      int64_t n, int64_t ld, const EpilogueArgs& a) {
    const float2 v = make_float2(acc.c[i][j][2 * half], acc.c[i][j][2 * half + 1]);
    if constexpr (Epilogue::kGated) {
      const float2 up = make_float2(acc.c[i][j + 1][2 * half], acc.c[i][j + 1][2 * half + 1]);
      return Epilogue::template apply<T>(v, up, m, n, ld, a);
    } else {
      return Epilogue::template apply<T>(v, m, n, ld, a);
    }
  }

  // C's column of GEMM fragment j's pairs in this lane (kCols GEMM columns
  // per column of C: a gated chain's fragments j, j + 1 make one of C's).
  template <int kCols>
  static __device__ __forceinline__ int64_t column_of(TileCoord tile, int warp_n, int j, int lane) {
    static_assert(kCols == 1 || kFragsN % 2 == 0, "a warp holds whole gate and up pairs of fragments");
    return (tile.n0 + warp_n * WN + j * 8) / kCols + (lane % 4) * 2;
  }

  // Applies the epilogue chain to the accumulators and stores C. In an m16n8
  // fragment, lane l holds columns 2*(l%4), +1 of rows l/4 and l/4 + 8.
  template <typename Epilogue, typename Accumulators>
  static __device__ __forceinline__ void store(const Accumulators& acc, const GemmArgs<T>& p, TileCoord tile) {
    constexpr int kCols = Epilogue::kGemmColsPerOutput;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int warp_m = warp / Tile::kWarpsN, warp_n = warp % Tile::kWarpsN;
    const int64_t N = p.n / kCols;
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
      const int64_t m = tile.m0 + warp_m * WM + i * 16 + lane / 4;
#pragma unroll
      for (int j = 0; j < kFragsN; j += kCols) {
        // N is a multiple of 8 and n is even: a pair is wholly inside C or outside.
        const int64_t n = column_of<kCols>(tile, warp_n, j, lane);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int64_t row = m + 8 * half;
          if (row < p.m && n < N) store_pair(p.c + row * N + n, chain_pair<Epilogue>(acc, i, j, half, row, n, N, p.epilogue));
        }
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
    constexpr int kCols = Epilogue::kGemmColsPerOutput;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int warp_m = warp / Tile::kWarpsN, warp_n = warp % Tile::kWarpsN;
    T* staged = reinterpret_cast<T*>(smem);
    const int64_t N = p.n / kCols;
    // The chain, in registers, into the first fragment of each of C's
    // (a gated chain's gate fragment). Rows and columns outside C are
    // clamped to the last ones inside: the chain reads only valid memory
    // and runs without branches, so an operand of column n (bias) is loaded
    // once for all of the thread's rows; values computed for clamped pairs
    // are never stored.
    const int64_t m_last = p.m - 1, n_last = N - 2;
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
      const int64_t m = tile.m0 + warp_m * WM + i * 16 + lane / 4;
      const int64_t m_lo = m < m_last ? m : m_last, m_hi = m + 8 < m_last ? m + 8 : m_last;
#pragma unroll
      for (int j = 0; j < kFragsN; j += kCols) {
        const int64_t n_raw = column_of<kCols>(tile, warp_n, j, lane);
        const int64_t n = n_raw < n_last ? n_raw : n_last;
        const float2 lo = chain_pair<Epilogue>(acc, i, j, 0, m_lo, n, N, p.epilogue);
        const float2 hi = chain_pair<Epilogue>(acc, i, j, 1, m_hi, n, N, p.epilogue);
        float(&c)[4] = acc.c[i][j];
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
      for (int j = 0; j < kFragsN; j += kCols) {
        const int col = int(column_of<kCols>(TileCoord{0, 0}, warp_n, j, lane));
        const float(&c)[4] = acc.c[i][j];
        st_shared_pair(staged_base + uint32_t((row * kStagedRowElems + col) * sizeof(T)), c[0], c[1]);
        st_shared_pair(staged_base + uint32_t(((row + 8) * kStagedRowElems + col) * sizeof(T)), c[2], c[3]);
      }
    }
    __syncthreads();
    // C from shared memory: thread t always copies 16-byte chunk t % (BN/8)
    // of rows t / (BN/8), + kRowsPerPass, ... (of C's BN / kCols columns).
    constexpr int kChunksPerRow = BN / kCols / 8;
    constexpr int kRowsPerPass = kThreads / kChunksPerRow;
    static_assert(kThreads % kChunksPerRow == 0 && BM % kRowsPerPass == 0,
                  "the CTA's threads cover whole rows of the staged tile");
    const int chunk = threadIdx.x % kChunksPerRow, row0 = threadIdx.x / kChunksPerRow;
    const int64_t n = tile.n0 / kCols + chunk * 8;
    if (n >= N) return;
    T* out = p.c + (tile.m0 + row0) * N + n;
    const int64_t rows_left = p.m - tile.m0 - row0;
#pragma unroll
    for (int r = 0; r < BM / kRowsPerPass; ++r) {
      if (r * kRowsPerPass < rows_left) {
        const uint4 v = ld_shared_vec(
            staged_base + uint32_t(((row0 + r * kRowsPerPass) * kStagedRowElems + chunk * 8) * sizeof(T)));
        st_global_vec(out + int64_t(r * kRowsPerPass) * N, v);
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
