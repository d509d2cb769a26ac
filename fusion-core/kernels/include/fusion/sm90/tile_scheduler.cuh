// The sm90 kernel's tile scheduler: which output tiles, and which of their
// k-blocks, each persistent CTA computes, and in what order.
//
// At most one CTA per SM walks output tiles in grouped order (gemm.cuh),
// every other wave through K backwards (walks_backwards). Where the tiles do
// not fill the SMs evenly, several CTAs may share a tile's k-blocks (split-K
// with fewer tiles than SMs, stream-K over the last wave otherwise; see
// StreamK and plan_stream_k) and the last of them sums their partial tiles
// (publish, gather); where that does not pay, the grid shrinks to the fewest
// CTAs that need no more waves (balanced_grid). Not here: loading and
// multiplying a tile (collective_mainloop.cuh) and storing it
// (collective_epilogue.cuh).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "../gemm.cuh"
#include "../problem.cuh"
#include "../workspace.cuh"
#include "primitives.cuh"
#include "tile_config.cuh"

namespace fusion {
namespace sm90 {

template <typename T, typename Config>
struct TileScheduler {
  static constexpr int BM = Config::BM, BN = Config::BN;
  static constexpr int kClusterM = Config::kClusterM;
  static constexpr int kGroupRows = Config::kGroupRows;
  static constexpr bool kPingPong = Config::kPingPong;
  static constexpr int kConsumers = Config::kConsumers;
  static constexpr int kMmaM = Config::kMmaM;
  static constexpr int kAccumulators = Config::kAccumulators;

  // Stream-K pieces (see StreamK).
  enum class Piece { Whole, Partial, Finish };

  // One piece of a CTA's work: k-blocks [k_begin, k_begin + k_count) of
  // unit `unit`; for a Finish piece, `first` is the lowest CTA holding
  // k-blocks of the same tile.
  struct WorkPiece {
    int unit, k_begin, k_count;
    Piece piece;
    int first;
  };

  // This CTA's stream-K pieces and their counts, written by thread 0 at the
  // start. Split-K gives a CTA one piece; a stream-K split whose CTA shares
  // are under two tiles would give at most three (a Partial, a whole tile,
  // a Finish): plan_stream_k must keep any split it allows within that.
  static constexpr int kMaxStreamKPieces = 4;
  // The list lives in shared memory (see plan_pieces).
  struct Plan {
    int piece_count[4];                   // 3 used: listed pieces, whole tiles, 1 if there is a Finish piece
    WorkPiece pieces[kMaxStreamKPieces];  // listed ones from 0, the Finish one last
  };

  // The work units of the launch and this CTA's share of them. A unit is
  // kClusterM vertically adjacent tiles, one per CTA of a cluster; clusters
  // walk the units in grouped order (gemm.cuh), each every num_clusters-th.
  // Counts are 32-bit: FusedGemm::check refuses more than INT32_MAX tiles.
  struct TileWalk {
    int units_m, tiles_n, units;
    int first, stride;
    int rank;
    __device__ __forceinline__ explicit TileWalk(const GemmArgs<T>& args) {
      const int64_t tiles_m = (args.m + BM - 1) / BM;
      units_m = int((tiles_m + kClusterM - 1) / kClusterM);
      tiles_n = int((args.n + BN - 1) / BN);
      units = units_m * tiles_n;
      first = int(blockIdx.x) / kClusterM;
      stride = int(gridDim.x) / kClusterM;
      rank = kClusterM > 1 ? int(cluster_rank()) : 0;
    }
    __device__ __forceinline__ TileCoord tile(int64_t unit) const {
      TileCoord c = grouped_tile_order<kGroupRows>(unit, units_m, tiles_n, kClusterM * BM, BN);
      c.m0 += int64_t(rank) * BM;
      return c;
    }
  };

  // Stream-K (cooperative schedule, one CTA per cluster; plan_stream_k
  // decides when): tiles [0, dp_tiles) run whole, the same number on every
  // CTA; tiles [dp_tiles, tiles) in grouped order are split by k-blocks,
  // evenly over the grid. CTA b takes k-blocks [b U / grid, (b + 1) U / grid)
  // of those tiles laid end to end, after its whole tiles. A tile it covers
  // only in part is either
  //  - a Partial piece (the range ends inside the tile): its f32
  //    accumulators go to the CTA's slot of `partials` and its flag is
  //    raised; every CTA has at most one, and runs it before its other
  //    stream-K pieces, or
  //  - a Finish piece (the range starts inside the tile and reaches its
  //    end): it waits for the flags of the lower CTAs that hold the tile's
  //    earlier k-blocks, adds their partials, lowers the flags again and
  //    runs the epilogue.
  // Finish pieces wait only on lower CTAs, which run their Partial piece
  // before anything that waits, and every CTA of the grid is resident at
  // once (one per SM), so the grid always makes progress as long
  // as CTAs are dispatched in index order (what CUDA does in practice and
  // stream-K implementations rely on; the programming model does not
  // promise it). Flags are
  // 0 at rest: each launch raises and lowers the ones it uses. With fewer
  // tiles than SMs this is split-K (dp_tiles 0, every tile split alike).
  struct StreamK {
    int dp_tiles = 0;  // tiles [0, dp_tiles) run whole: CTA b takes b, b + grid, ...
    int units = 0;     // k-blocks of tiles [dp_tiles, tiles); 0: no stream-K (units * grid < 2^31)
    float* partials = nullptr;  // [grid][kConsumers][kMmaM * kAccumulators / 4][128 threads] float4s
    uint32_t* flags = nullptr;  // [grid][kConsumers]
  };


  // Thread 0 writes this CTA's stream-K pieces to shared memory before the
  // first barrier, in the order they run (after the data-parallel tiles,
  // see piece): the Partial one, the tiles its range covers whole, and last
  // the Finish one, so that the lower CTAs it waits on have had all that
  // time to publish. (Run right after the Partial piece, a Finish piece
  // waited for up to a tile's k-blocks on an H200.) The
  // producer and the consumers read the list from there, which keeps the
  // bookkeeping out of the registers (the producer runs in 40, the
  // consumers hold 128 accumulators). 32-bit: plan_stream_k keeps
  // units * grid below 2^31.
  static __device__ __forceinline__ void plan_pieces(Plan& plan, const TileWalk& walk, int kb,
                                                    const StreamK& sk) {
    int count = 0;
    WorkPiece finish{0, 0, 0, Piece::Whole, -1};
    if (sk.units > 0) {
      const int grid = int(gridDim.x);
      const int begin = int(blockIdx.x) * sk.units / grid, end = (int(blockIdx.x) + 1) * sk.units / grid;
      if (begin < end && end % kb != 0) {
        const int tile = end / kb, from = begin > tile * kb ? begin : tile * kb;
        plan.pieces[count++] = {sk.dp_tiles + tile, from - tile * kb, end - from, Piece::Partial, 0};
      }
      for (int tile = begin / kb; begin < end && (tile + 1) * kb <= end; ++tile) {
        if (begin <= tile * kb) {
          plan.pieces[count++] = {sk.dp_tiles + tile, 0, kb, Piece::Whole, 0};
        } else {
          // The CTA holding k-block tile * kb: the largest c with
          // c U / grid <= tile * kb.
          const int first = ((tile * kb + 1) * grid - 1) / sk.units;
          finish = {sk.dp_tiles + tile, begin - tile * kb, (tile + 1) * kb - begin, Piece::Finish, first};
        }
      }
    }
    const int whole = sk.units > 0 ? sk.dp_tiles : walk.units;
    plan.piece_count[0] = count;
    plan.piece_count[1] = whole > walk.first ? (whole - walk.first + walk.stride - 1) / walk.stride : 0;
    plan.piece_count[2] = finish.piece == Piece::Finish ? 1 : 0;
    plan.pieces[kMaxStreamKPieces - 1] = finish;
  }

  // Piece i of this CTA's work, false past the last: its whole
  // data-parallel tiles, then the listed stream-K pieces, then the Finish
  // piece if there is one. The data-parallel tiles come first so that every
  // CTA runs its waves in step with the others (each wave reads the same
  // k-slices of A and B at about the same time, which L2 serves once), and
  // the stream-K pieces, which differ in length, only after the last wave.
  // A function of i alone, so that only i stays in registers.
  static __device__ __forceinline__ bool piece(const Plan& plan, const TileWalk& walk, int kb, int i, WorkPiece& w) {
    const int whole = plan.piece_count[1], listed = plan.piece_count[0];
    if (i < whole) {
      w = {walk.first + i * walk.stride, 0, kb, Piece::Whole, 0};
      return true;
    }
    if (i < whole + listed) {
      w = plan.pieces[i - whole];
      return true;
    }
    if (i == whole + listed && plan.piece_count[2] != 0) {
      w = plan.pieces[kMaxStreamKPieces - 1];
      return true;
    }
    return false;
  }

  // Whether piece i loads its k-blocks from the last to the first. The
  // data-parallel waves alternate: a wave reads more of A and B than L2
  // keeps (40 MB at 4096^3 with 128x256 tiles), so a wave that starts at
  // k-block 0 finds none of it left by the wave before, while one that starts
  // at the far end finds that wave's last k-slices of B (and of A where the
  // two waves share tile rows) still there. At 4096^3 on an H200 this cut
  // the DRAM reads of gemm_bias_gelu from 185 to 126 MB (ncu) and gained
  // ~1% (BENCHMARKS.md). Stream-K pieces keep the forward order: reversed,
  // they read more from DRAM (1425 -> 1552 MB at (8192, 4096, 14336)).
  // Ping-pong keeps it too (not measured): its consumers take alternate
  // tiles, not waves. The consumers do not care: they accumulate whatever each
  // stage holds. A tile's sum order thus depends on its wave, so on the SM
  // count: results stay deterministic on one GPU model, and may differ in
  // the last bits between models (as stream-K's already did).
  static __device__ __forceinline__ bool walks_backwards(const Plan& plan, int i) {
    return !kPingPong && (i & 1) != 0 && i < plan.piece_count[1];
  }

  // A slot of `partials` holds one consumer's accumulators as float4s,
  // [kMmaM * kAccumulators / 4][128 threads], so that each warp reads and
  // writes 512 contiguous bytes per instruction.
  static constexpr int kPartialVectors = kMmaM * kAccumulators / 4;
  static_assert(kAccumulators % 4 == 0, "partials move as float4s");

  // Stores a Partial piece's accumulators to this CTA's slot and raises its
  // flag (per consumer warp group).
  static __device__ __forceinline__ void publish(const StreamK& sk, int consumer,
                                                 const float (&acc)[kMmaM][kAccumulators]) {
    const int thread = threadIdx.x % 128;
    const int64_t slot = int64_t(blockIdx.x) * kConsumers + consumer;
    float4* out = reinterpret_cast<float4*>(sk.partials) + slot * (kPartialVectors * 128) + thread;
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
      for (int j = 0; j < kAccumulators; j += 4)
        __stcg(out + (mi * kAccumulators + j) / 4 * 128,
               make_float4(acc[mi][j], acc[mi][j + 1], acc[mi][j + 2], acc[mi][j + 3]));
    named_barrier_sync(1 + consumer, 128);
    if (thread == 0) {
      __threadfence();
      flag_store_release(&sk.flags[slot], 1);
    }
  }

  // Adds the partials of CTAs [first, blockIdx.x) to a Finish piece's
  // accumulators, lowering their flags.
  static __device__ __forceinline__ void gather(const StreamK& sk, int consumer, int first,
                                                float (&acc)[kMmaM][kAccumulators]) {
    const int thread = threadIdx.x % 128;
    for (int cta = first; cta < int(blockIdx.x); ++cta) {
      const int64_t slot = int64_t(cta) * kConsumers + consumer;
      if (thread == 0) {
        while (flag_load_acquire(&sk.flags[slot]) != 1) __nanosleep(64);
        sk.flags[slot] = 0;
        __threadfence();
      }
      named_barrier_sync(1 + consumer, 128);
      const float4* in = reinterpret_cast<const float4*>(sk.partials) + slot * (kPartialVectors * 128) + thread;
#pragma unroll
      for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
        for (int j = 0; j < kAccumulators; j += 4) {
          const float4 v = __ldcg(in + (mi * kAccumulators + j) / 4 * 128);
          acc[mi][j] += v.x;
          acc[mi][j + 1] += v.y;
          acc[mi][j + 2] += v.z;
          acc[mi][j + 3] += v.w;
        }
    }
  }

  // The grid of a launch that runs every unit whole: one CTA per unit up to
  // one per SM, and past that the fewest CTAs that need no more rounds of
  // units than one per SM would (at 4096^3, 512 tiles of 128x256: 128 CTAs
  // of 4 tiles each, not 132 of which 16 idle through the last). The
  // launch takes as many rounds either way; with fewer SMs busy it ran
  // ~1 us faster on an H200 at 4096^3 (BENCHMARKS.md v11).
  static int64_t balanced_grid(int64_t units, int64_t sms) {
    if (units <= sms) return units;
    const int64_t rounds = (units + sms - 1) / sms;
    return (units + rounds - 1) / rounds;
  }

  // The stream-K split for `tiles` tiles of `k_blocks` k-blocks on `sms`
  // SMs (StreamK::units 0: every tile whole) and, when it splits, the grid
  // it needs in *grid (left alone otherwise).
  static StreamK plan_stream_k(int64_t tiles, int64_t k_blocks, int64_t sms, int64_t* grid);
};

// How a launch's k-blocks are spread over the SMs (s: SMs, t: tiles).
//  - t < s: split-K. Each tile goes to s / t CTAs (grid t * (s / t)),
//    whose equal shares of its k-blocks run side by side. At
//    (128, 4096, 14336) with 64x128 tiles (64 tiles of 224 k-blocks on 132
//    SMs) every CTA runs half a tile.
//  - t >= s, t not a multiple of s: stream-K for the last wave. Every CTA
//    runs t / s tiles whole, then an equal share of the k-blocks of the
//    remaining t % s tiles, which would otherwise leave s - t % s SMs idle
//    for a whole tile. When the remainder is under half a wave, the last
//    full wave joins it, so that a tile is shared by at most three CTAs
//    and no CTA's share is a sliver (each partial a finisher gathers costs
//    as much as a few k-blocks).
// Either is used only when it cuts the busiest CTA's k-blocks by more than
// its fixups cost (publishing and gathering partial tiles, counted as
// kFixupBlocks k-blocks each) and leaves each CTA at least kMinBlocks. On an
// H200 at 4096^3 (64 k-blocks of ~0.68 us per 128x256 tile), publishing a
// partial tile took ~3.7 us and gathering one added ~2.2 us to the
// finishing CTA's epilogue (kernels/selftest --trace, with scalar moves;
// BENCHMARKS.md), about 9 k-blocks for the pair. There the remainder's
// share, 57 k-blocks against 64, gains less than that: stream-K measured
// 0.967-0.969 of cuBLASLt against 0.975 without, and is refused. At 8192^3
// and (8192, 14336, 4096) it gained 1-2%, at (8192, 4096, 14336) nothing
// measurable.
// The launcher asks for neither when its caller says FUSION_GEMM_NO_STREAM_K
// (the run time does for FUSION_STREAM_K=0 and while capturing a graph).
template <typename T, typename Config>
typename TileScheduler<T, Config>::StreamK TileScheduler<T, Config>::plan_stream_k(int64_t tiles,
                                                                                           int64_t k_blocks,
                                                                                           int64_t sms,
                                                                                           int64_t* grid) {
  constexpr int64_t kFixupBlocks = 4, kMinBlocks = 4;
  StreamK sk;
  if (kPingPong || kClusterM > 1 || sms * kConsumers * 4 > int64_t(kStreamKFlagBytes)) return sk;
  if (tiles <= 0 || sms <= 0) return sk;
  int64_t split_tiles = tiles, ctas = tiles * (sms / tiles);
  if (tiles >= sms) {
    split_tiles = tiles % sms;
    if (split_tiles == 0) return sk;
    if (2 * split_tiles < sms) split_tiles += sms;
    ctas = sms;
  }
  if (ctas == split_tiles) return sk;
  const int64_t per_cta = (split_tiles * k_blocks + ctas - 1) / ctas;
  const int64_t whole = (split_tiles + ctas - 1) / ctas * k_blocks;  // the busiest CTA's k-blocks without it
  if (per_cta < kMinBlocks || per_cta + 2 * kFixupBlocks >= whole ||
      (split_tiles * k_blocks + 1) * ctas >= INT32_MAX)
    return sk;
  sk.dp_tiles = int(tiles - split_tiles);
  sk.units = int(split_tiles * k_blocks);
  *grid = ctas;
  return sk;
}

}  // namespace sm90
}  // namespace fusion
