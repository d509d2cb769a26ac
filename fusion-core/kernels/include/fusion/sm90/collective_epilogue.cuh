// The sm90 collective epilogue: after a consumer's K loop, the epilogue
// chain (epilogue.cuh) on its f32 accumulators in registers, then C through
// a 128-byte swizzled staging tile in shared memory (stmatrix, 16 bytes per
// lane) and TMA stores, which drop what falls outside C. The producer
// meanwhile already loads the next tile's stages (collective_mainloop.cuh).
#pragma once

#include <cuda.h>
#include <stdint.h>

#include "../numeric.cuh"
#include "../problem.cuh"
#include "primitives.cuh"
#include "tile_config.cuh"
#include "trace.cuh"

namespace fusion {
namespace sm90 {

// kStagingParts: 1 when a consumer's whole share of C fits in the staging
// tile, 2 when only half of its columns do (the kernel decides, from what
// is left beside the stages; see Mainloop::kStagingParts).
template <typename T, typename Config, int kStagingParts_>
struct CollectiveEpilogue {
  static constexpr int BN = Config::BN;
  static constexpr int kConsumers = Config::kConsumers;
  static constexpr int kRows = Config::WM;
  static constexpr int kMmaM = Config::kMmaM;
  static constexpr int kAccumulators = Config::kAccumulators;
  // Epilogue staging: each consumer's share of C, as 64 x 64 boxes of
  // 128-byte rows with the TMA's 128-byte swizzle (16-byte chunk c of row r
  // sits at c ^ (r % 8)), which also keeps the fragment writes free of bank
  // conflicts. The whole share when it fits beside the stages; else half of
  // its columns at a time (kStagingParts = 2: the second half waits until
  // the first half's stores have read the staging tile).
  static constexpr int kBoxBytes = 64 * 64 * 2;
  static constexpr int kStagingParts = kStagingParts_;
  static constexpr int kStagingCols = BN / kStagingParts;
  // [kConsumers][kRows / 64][kStagingCols / 64] boxes of kBoxBytes, each
  // consumer's at a 1024-byte aligned address for the swizzle (the kernel's
  // SharedStorage places it right after the ring's stages).
  struct Staging {
    unsigned char boxes[kConsumers][kRows * kStagingCols * 2];
  };
  static_assert(kRows * kStagingCols * 2 % 1024 == 0, "every consumer's boxes start 1024-byte aligned");

  // The epilogue chain on every accumulator of this consumer's part of the
  // tile. kChecked skips the pairs whose loads would fall outside their
  // tensors: columns past N, and for a chain that reads an [M, N] tensor
  // (residual, multiplier) also rows past M. Rows past M need no check
  // otherwise: the TMA store drops them. A chain of activations and bias
  // on a tile with every column inside C runs unchecked, so nothing is
  // predicated and the compiler issues the bias loads together, once per
  // column pair. With a check on every pair (rows too), the H200 measured
  // bias + GELU at 4096^3 ~11 us over the bare GEMM (BENCHMARKS.md): each
  // bias load was issued twice, under each row's predicate, a few at a time
  // between the GELU math. Chains that read [M, N] tensors keep the checked
  // form: unpredicated, their loads are all hoisted together and spill.
  template <typename Epilogue, bool kChecked>
  static __device__ __forceinline__ void apply_chain(float (&acc)[kMmaM][kAccumulators], int64_t m_base, int64_t n0,
                                                     int rows, int cols, const GemmArgs<T>& args) {
    const int thread = threadIdx.x % 128;
    const int row_in_block = (thread / 32) * 16 + (thread % 32) / 4;  // and row_in_block + 8
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi) {
#pragma unroll
      for (int frag = 0; frag < BN / 8; ++frag) {
        const int n = frag * 8 + 2 * (thread % 4);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = mi * 64 + row_in_block + 8 * half;
          float& x = acc[mi][4 * frag + 2 * half];
          float& y = acc[mi][4 * frag + 2 * half + 1];
          if (!kChecked || (n < cols && (!Epilogue::kReadsTile || r < rows))) {
            const float2 v = Epilogue::template apply<T>(make_float2(x, y), m_base + r, n0 + n, args.n, args.epilogue);
            x = v.x;
            y = v.y;
          }
        }
      }
    }
  }

  // Epilogue chain on the accumulators, then C through the staging tile and
  // TMA stores. The chain runs on every accumulator first and the staging
  // writes come after, so the chain's loads (bias, residual, multiplier) are
  // not held up behind stores the compiler cannot prove they do not alias.
  template <typename Epilogue>
  static __device__ __forceinline__ void store_tile(Staging& shared, int consumer, TileCoord tile,
                                                    float (&acc)[kMmaM][kAccumulators], const CUtensorMap* map_c,
                                                    const GemmArgs<T>& args, [[maybe_unused]] int trace_piece = 0) {
    const int thread = threadIdx.x % 128;
    const int warp = thread / 32, lane = thread % 32;
    const int64_t m_base = tile.m0 + Config::share_row0(consumer);
    // Rows and columns of this consumer's part of the tile that lie inside C.
    const int rows = int(args.m - m_base < kRows ? args.m - m_base : kRows);
    const int cols = int(args.n - tile.n0 < BN ? args.n - tile.n0 : BN);
    if (!Epilogue::kReadsTile && cols == BN)
      apply_chain<Epilogue, false>(acc, m_base, tile.n0, rows, cols, args);
    else
      apply_chain<Epilogue, true>(acc, m_base, tile.n0, rows, cols, args);
    [[maybe_unused]] const bool tracer = consumer == 0 && thread == 0;
    if (tracer) FUSION_SM90_STAMP(trace_piece, 2);
    unsigned char* staging = shared.boxes[consumer];
    constexpr int kBoxesPerRow = kStagingCols / 64, kPartFrags = kStagingCols / 8;
    // One stmatrix per two 8-column fragments: matrix j is fragment
    // frag + j / 2, rows 8 (j % 2) on of the warp's 16; lane t addresses
    // row t % 8 of matrix t / 8, whose 16 bytes are one swizzled chunk.
    const int j = lane / 8;
    const int r = warp * 16 + 8 * (j % 2) + lane % 8;
#pragma unroll
    for (int part = 0; part < kStagingParts; ++part) {
      // The previous stores (the previous tile's, or this tile's previous
      // part) must have read the staging tile.
      if (thread == 0) bulk_wait_read();
      named_barrier_sync(1 + consumer, 128);
#pragma unroll
      for (int mi = 0; mi < kMmaM; ++mi) {
#pragma unroll
        for (int frag = 0; frag < kPartFrags; frag += 2) {
          uint32_t packed[4];
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int a = 4 * (part * kPartFrags + frag + q / 2) + 2 * (q % 2);
            const typename Numeric<T>::Pair p = Numeric<T>::float2_to_pair(make_float2(acc[mi][a], acc[mi][a + 1]));
            packed[q] = *reinterpret_cast<const uint32_t*>(&p);
          }
          const int f = frag + j / 2;
          unsigned char* box = staging + (mi * kBoxesPerRow + f / 8) * kBoxBytes;
          stmatrix_x4(box + r * 128 + (((f % 8) ^ (r % 8)) << 4), packed[0], packed[1], packed[2], packed[3]);
        }
      }
      fence_proxy_async();
      named_barrier_sync(1 + consumer, 128);
      if (tracer && part == kStagingParts - 1) FUSION_SM90_STAMP(trace_piece, 3);
      if (thread == 0) {
#pragma unroll
        for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
          for (int nb = 0; nb < kBoxesPerRow; ++nb)
            tma_store_2d(map_c, staging + (mi * kBoxesPerRow + nb) * kBoxBytes,
                         int32_t(tile.n0) + part * kStagingCols + 64 * nb, int32_t(m_base) + 64 * mi);
        bulk_commit();
      }
    }
  }

};

}  // namespace sm90
}  // namespace fusion
