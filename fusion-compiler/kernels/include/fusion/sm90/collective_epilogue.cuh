// The sm90 collective epilogue: after a consumer's K loop, the epilogue
// chain (epilogue.cuh) on its f32 accumulators in registers, then C through
// a swizzled staging tile in shared memory (stmatrix, 16 bytes per lane)
// and TMA stores, which drop what falls outside C. The staging tile is
// boxes of 64 rows by 64, 32 or 16 columns, the widest that divides the
// tile's width, each with the TMA swizzle of its row's bytes (128, 64 or
// 32), so that a tile may be any multiple of 16 columns wide. The producer
// meanwhile already loads the next tile's stages (collective_mainloop.cuh).
//
// A chain with one step that reads an [M, N] tile (residual, multiplier:
// EpilogueChain::kSourceTile) gets that tile by TMA into the staging tile
// while the K loop still runs (load_source, which the consumer issues after
// its first k-blocks), and reads it back in the accumulators' fragment
// layout with ldmatrix just before writing C over it with stmatrix: the
// source costs no global-load latency after the K loop, where element-wise
// loads of it had cost gemm_bias_residual 5-12% against cuBLASLt's
// beta·C (benchmarks/HISTORY.md v13).
//
// A gated chain (epilogue.cuh, GatedChain) combines each thread's gate and
// up fragments in registers into a tile of half the width, which then goes
// out the same way through the same staging tile.
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

// The tile of C a gated GEMM's tile of BN GEMM columns writes: BN / 2
// columns, from half the accumulators (store_gated_tile).
template <typename Config>
struct GatedOutput : Config {
  static constexpr int BN = Config::BN / 2;
  static constexpr int kAccumulators = Config::kAccumulators / 2;
};

// kStagingParts: 1 when a consumer's whole share of C fits in the staging
// tile, 2 when only half of its columns do (the kernel decides, from what
// is left beside the stages; see Mainloop::kStagingParts). T is the GEMM's
// operand type; C, the steps' operands and the staging tile are Output's
// (bf16 for FP8 operands).
template <typename T, typename Config, int kStagingParts_>
struct CollectiveEpilogue {
  using Output = OutputOf<T>;
  static_assert(sizeof(Output) == 2, "C is stored as 16-bit elements: 64 to a 128-byte row");
  static constexpr int BN = Config::BN;
  static constexpr int kConsumers = Config::kConsumers;
  static constexpr int kRows = Config::WM;
  static constexpr int kMmaM = Config::kMmaM;
  static constexpr int kAccumulators = Config::kAccumulators;
  // Epilogue staging: each consumer's share of C, as boxes of 64 rows by
  // kBoxCols columns (64, 32 or 16: the widest that divides the staged
  // columns), rows of kBoxCols * 2 bytes with the TMA swizzle of that many
  // bytes: 16-byte chunk c of row r sits at c ^ ((r >> kSwizzleShift) %
  // kChunks), which is how TMA's 128-, 64- and 32-byte swizzles place it
  // (address bits 4.. XOR bits 7..) and keeps the stmatrix writes of eight
  // rows free of bank conflicts in all three. The whole share when it fits
  // beside the stages; else half of its columns at a time (kStagingParts =
  // 2: the second half waits until the first half's stores have read the
  // staging tile).
  static constexpr int kStagingParts = kStagingParts_;
  static constexpr int kStagingCols = BN / kStagingParts;
  static constexpr int kBoxCols = kStagingCols % 64 == 0 ? 64 : kStagingCols % 32 == 0 ? 32 : 16;
  static constexpr int kBoxRowBytes = kBoxCols * 2;
  static constexpr int kBoxBytes = 64 * kBoxRowBytes;
  static constexpr int kChunks = kBoxCols / 8;
  static constexpr int kSwizzleShift = kChunks == 8 ? 0 : kChunks == 4 ? 1 : 2;
  // [kConsumers][kRows / 64][kBoxesPerRow] boxes of kBoxBytes, each
  // consumer's at a 1024-byte aligned address for the swizzle (the kernel's
  // SharedStorage places it right after the ring's stages).
  // `source_full[c]` completes when consumer c's source tile has landed in
  // its boxes (kSourceTile chains only).
  struct Staging {
    unsigned char boxes[kConsumers][kRows * kStagingCols * 2];
    uint64_t source_full[kConsumers];
  };
  static_assert(kRows * kStagingCols * 2 % 1024 == 0, "every consumer's boxes start 1024-byte aligned");
  static_assert(kStagingCols % 16 == 0,
                "the staging tile is whole boxes of 16 or more columns: a tile whose halves are not must stage whole "
                "(fewer stages)");
  static constexpr int kBoxesPerRow = kStagingCols / kBoxCols, kPartFrags = kStagingCols / 8;

  // The staging address of 16-byte chunk `frag` (columns 8 frag on) of row
  // r of row block mi: its box, its row there and its swizzled place in it.
  static __device__ __forceinline__ unsigned char* staged_chunk(unsigned char* staging, int mi, int frag, int r) {
    return staging + (mi * kBoxesPerRow + frag / kChunks) * kBoxBytes + r * kBoxRowBytes +
           (((frag % kChunks) ^ ((r >> kSwizzleShift) % kChunks)) << 4);
  }

  // Whether this epilogue can run a chain: one that reads a source tile
  // brings all of it into the staging tile, which must then hold the
  // consumer's whole share of C; a gated one writes BN / 2 columns of C,
  // which must be whole 64-column boxes (not so for BN = 192).
  template <typename Epilogue>
  static __host__ __device__ constexpr bool fits() {
    return (!Epilogue::kSourceTile || kStagingParts == 1) && (!Epilogue::kGated || (BN / 2) % 64 == 0);
  }

  // The columns of C's boxes, which its tensor map and the source's are
  // encoded with (Mainloop::encode_maps): a gated chain's are its output
  // tile's (store_gated_tile).
  template <typename Epilogue>
  static constexpr int c_box_cols() {
    if constexpr (Epilogue::kGated)
      return CollectiveEpilogue<T, GatedOutput<Config>, 1>::kBoxCols;
    else
      return kBoxCols;
  }

  static __device__ __forceinline__ void init_source_barriers(Staging& shared) {
#pragma unroll
    for (int c = 0; c < kConsumers; ++c) mbarrier_init(&shared.source_full[c], 1);
  }

  // Issued by one thread of the consumer while its K loop runs: waits until
  // the previous tile's TMA stores (this thread's bulk groups) have read
  // the staging tile, then loads the source's part of this consumer's share
  // of `tile` into it by TMA, counted on source_full[consumer]. Boxes wholly
  // outside the tensor are not loaded (their rows or columns of C are
  // dropped by the store); the rest are zero-filled past its edges.
  static __device__ __forceinline__ void load_source(Staging& shared, int consumer, TileCoord tile,
                                                     const CUtensorMap* map_src, int64_t m, int64_t n) {
    const int64_t m_base = tile.m0 + Config::share_row0(consumer);
    const auto inside = [&](int mi, int nb) { return m_base + 64 * mi < m && tile.n0 + kBoxCols * nb < n; };
    uint32_t bytes = 0;
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
      for (int nb = 0; nb < kBoxesPerRow; ++nb)
        if (inside(mi, nb)) bytes += kBoxBytes;
    bulk_wait_read();
    uint64_t* full = &shared.source_full[consumer];
    mbarrier_arrive_expect_tx(full, bytes);
    unsigned char* staging = shared.boxes[consumer];
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
      for (int nb = 0; nb < kBoxesPerRow; ++nb)
        if (inside(mi, nb))
          tma_load_2d(staging + (mi * kBoxesPerRow + nb) * kBoxBytes, map_src, full, int32_t(tile.n0) + kBoxCols * nb,
                      int32_t(m_base) + 64 * mi);
  }

  // `step(v, m, n)` on every accumulator pair of this consumer's part of
  // the tile, at row m and columns n, n + 1 of C. kChecked skips the pairs
  // whose loads would fall outside their tensors: columns past N, and with
  // kRowsChecked (a chain that loads an [M, N] tensor element by element)
  // also rows past M. Rows past M need no check otherwise: the TMA store
  // drops them. A chain of activations and bias on a tile with every
  // column inside C runs unchecked, so nothing is predicated and the
  // compiler issues the bias loads together, once per column pair. With a
  // check on every pair (rows too), the H200 measured bias + GELU at
  // 4096^3 ~11 us over the bare GEMM (benchmarks/HISTORY.md): each bias load was
  // issued twice, under each row's predicate, a few at a time between the
  // GELU math. Chains that load [M, N] tensors keep the checked form:
  // unpredicated, their loads are all hoisted together and spill.
  template <bool kChecked, bool kRowsChecked, typename Step>
  static __device__ __forceinline__ void for_each_pair(float (&acc)[kMmaM][kAccumulators], int64_t m_base,
                                                       int64_t n0, int rows, int cols, Step&& step) {
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
          if (!kChecked || (n < cols && (!kRowsChecked || r < rows))) {
            const float2 v = step(make_float2(x, y), m_base + r, n0 + n);
            x = v.x;
            y = v.y;
          }
        }
      }
    }
  }

  // The epilogue chain and the store of this consumer's share of C: a
  // gated chain's, or any other's.
  template <typename Epilogue>
  static __device__ __forceinline__ void store_tile(Staging& shared, int consumer, TileCoord tile,
                                                    float (&acc)[kMmaM][kAccumulators], const CUtensorMap* map_c,
                                                    const GemmArgs<T>& args, uint32_t source_phase,
                                                    int trace_piece = 0) {
    if constexpr (Epilogue::kGated)
      store_gated_tile<Epilogue>(shared, consumer, tile, acc, map_c, args, trace_piece);
    else
      store_chain_tile<Epilogue>(shared, consumer, tile, acc, map_c, args, source_phase, trace_piece);
  }

  // A gated chain: fragments 2j (gate) and 2j + 1 (up) of the GEMM tile
  // become fragment j of C's tile, in registers, which is then stored with
  // no further steps by the epilogue of half the width; its staging tile,
  // whole, fits in this one's (which holds at least half of BN columns).
  // kChecked and kRowsChecked as in for_each_pair, on C's columns.
  template <typename Epilogue>
  static __device__ __forceinline__ void store_gated_tile(Staging& shared, int consumer, TileCoord tile,
                                                          float (&acc)[kMmaM][kAccumulators],
                                                          const CUtensorMap* map_c, const GemmArgs<T>& args,
                                                          int trace_piece) {
    using Out = CollectiveEpilogue<T, GatedOutput<Config>, 1>;
    static_assert(sizeof(typename Out::Staging) <= sizeof(Staging), "C's staging tile fits in the GEMM's");
    static_assert(Out::BN % 64 == 0, "C's tile is whole 64-column boxes");
    const int64_t m_base = tile.m0 + Config::share_row0(consumer);
    GemmArgs<T> out_args = args;
    out_args.n = args.n / 2;
    const TileCoord out_tile{tile.m0, tile.n0 / 2};
    const int rows = int(args.m - m_base < kRows ? args.m - m_base : kRows);
    const int cols = int(out_args.n - out_tile.n0 < Out::BN ? out_args.n - out_tile.n0 : Out::BN);
    float out[kMmaM][Out::kAccumulators];
    if (!Epilogue::kReadsTile && cols == Out::BN)
      gate_pairs<false, false, Epilogue>(acc, out, m_base, out_tile.n0, rows, cols, out_args);
    else
      gate_pairs<true, true, Epilogue>(acc, out, m_base, out_tile.n0, rows, cols, out_args);
    Out::template store_chain_tile<EpilogueChain<>>(reinterpret_cast<typename Out::Staging&>(shared), consumer,
                                                    out_tile, out, map_c, out_args, 0, trace_piece);
  }

  template <bool kChecked, bool kRowsChecked, typename Epilogue, int kOutAccumulators>
  static __device__ __forceinline__ void gate_pairs(const float (&acc)[kMmaM][kAccumulators],
                                                    float (&out)[kMmaM][kOutAccumulators], int64_t m_base,
                                                    int64_t n0, int rows, int cols, const GemmArgs<T>& args) {
    const int thread = threadIdx.x % 128;
    const int row_in_block = (thread / 32) * 16 + (thread % 32) / 4;  // and row_in_block + 8
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi) {
#pragma unroll
      for (int frag = 0; frag < BN / 16; ++frag) {
        const int n = frag * 8 + 2 * (thread % 4);
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = mi * 64 + row_in_block + 8 * half;
          const int g = 4 * (2 * frag) + 2 * half, u = g + 4, o = 4 * frag + 2 * half;
          float2 v = make_float2(0.0f, 0.0f);
          if (!kChecked || (n < cols && (!kRowsChecked || r < rows)))
            v = Epilogue::template apply<Output>(make_float2(acc[mi][g], acc[mi][g + 1]),
                                            make_float2(acc[mi][u], acc[mi][u + 1]), m_base + r, n0 + n, args.n,
                                            args.epilogue);
          out[mi][o] = v.x;
          out[mi][o + 1] = v.y;
        }
      }
    }
  }

  // Epilogue chain on the accumulators, then C through the staging tile and
  // TMA stores. The chain runs on every accumulator first and the staging
  // writes come after, so the chain's loads (bias, residual, multiplier) are
  // not held up behind stores the compiler cannot prove they do not alias.
  // With a source tile, `source_phase` is the parity of the
  // source_full[consumer] phase that load_source filled for this tile.
  template <typename Epilogue>
  static __device__ __forceinline__ void store_chain_tile(Staging& shared, int consumer, TileCoord tile,
                                                          float (&acc)[kMmaM][kAccumulators],
                                                          const CUtensorMap* map_c, const GemmArgs<T>& args,
                                                          uint32_t source_phase, [[maybe_unused]] int trace_piece) {
    static_assert(fits<Epilogue>(), "a chain that reads a source tile needs the whole staging tile");
    const int thread = threadIdx.x % 128;
    const int warp = thread / 32, lane = thread % 32;
    const int64_t m_base = tile.m0 + Config::share_row0(consumer);
    // Rows and columns of this consumer's part of the tile that lie inside C.
    const int rows = int(args.m - m_base < kRows ? args.m - m_base : kRows);
    const int cols = int(args.n - tile.n0 < BN ? args.n - tile.n0 : BN);
    const auto chain = [&](float2 v, int64_t m, int64_t n) {
      return Epilogue::template apply<Output>(v, m, n, args.n, args.epilogue);
    };
    // With a source tile: here only the steps before its step (bias, a
    // folded norm's correction, activations), whose loads are per column or
    // row; the rest below, on the source's values.
    const auto head = [&](float2 v, int64_t m, int64_t n) {
      return Epilogue::template apply_head<Output>(v, m, n, args.n, args.epilogue);
    };
    if constexpr (Epilogue::kSourceTile) {
      if (cols == BN)
        for_each_pair<false, false>(acc, m_base, tile.n0, rows, cols, head);
      else
        for_each_pair<true, false>(acc, m_base, tile.n0, rows, cols, head);
    } else if (!Epilogue::kReadsTile && cols == BN) {
      for_each_pair<false, false>(acc, m_base, tile.n0, rows, cols, chain);
    } else {
      for_each_pair<true, true>(acc, m_base, tile.n0, rows, cols, chain);
    }
    [[maybe_unused]] const bool tracer = consumer == 0 && thread == 0;
    if (tracer) FUSION_SM90_STAMP(trace_piece, 2);
    unsigned char* staging = shared.boxes[consumer];
    // One stmatrix per two 8-column fragments: matrix j is fragment
    // frag + j / 2, rows 8 (j % 2) on of the warp's 16; lane t addresses
    // row t % 8 of matrix t / 8, whose 16 bytes are one swizzled chunk.
    const int j = lane / 8;
    const int r = warp * 16 + 8 * (j % 2) + lane % 8;
    const int row_in_block = warp * 16 + lane / 4;  // of the pairs this lane holds (and + 8)
#pragma unroll
    for (int part = 0; part < kStagingParts; ++part) {
      // The previous stores (the previous tile's, or this tile's previous
      // part) must have read the staging tile (with a source tile,
      // load_source already waited for them).
      if (thread == 0) bulk_wait_read();
      if constexpr (Epilogue::kSourceTile)
        mbarrier_wait(&shared.source_full[consumer], source_phase);
      else
        named_barrier_sync(1 + consumer, 128);
#pragma unroll
      for (int mi = 0; mi < kMmaM; ++mi) {
#pragma unroll
        for (int frag = 0; frag < kPartFrags; frag += 2) {
          const int f = frag + j / 2;
          unsigned char* row = staged_chunk(staging, mi, f, r);
          // Register q: fragment frag + q / 2, rows 8 (q % 2) on.
          uint32_t packed[4];
          if constexpr (Epilogue::kSourceTile) ldmatrix_x4(row, packed[0], packed[1], packed[2], packed[3]);
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int a = 4 * (part * kPartFrags + frag + q / 2) + 2 * (q % 2);
            float2 v = make_float2(acc[mi][a], acc[mi][a + 1]);
            if constexpr (Epilogue::kSourceTile) {
              const int n = (part * kPartFrags + frag + q / 2) * 8 + 2 * (lane % 4);
              const int64_t m = m_base + mi * 64 + row_in_block + 8 * (q % 2);
              typename Numeric<Output>::Pair src;
              memcpy(&src, &packed[q], 4);
              if (cols == BN || n < cols)
                v = Epilogue::template apply_tail<Output>(v, Numeric<Output>::pair_to_float2(src), m, tile.n0 + n, args.n,
                                                     args.epilogue);
            }
            const typename Numeric<Output>::Pair p = Numeric<Output>::float2_to_pair(v);
            memcpy(&packed[q], &p, 4);
          }
          stmatrix_x4(row, packed[0], packed[1], packed[2], packed[3]);
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
                         int32_t(tile.n0) + part * kStagingCols + kBoxCols * nb, int32_t(m_base) + 64 * mi);
        bulk_commit();
      }
    }
  }

};

}  // namespace sm90
}  // namespace fusion
