// The sm90 kernel's tile scheduler: which output tiles, and which of their
// k-blocks, each persistent CTA computes, and in what order.
//
// At most one CTA per SM walks output tiles in grouped order (gemm.cuh),
// every other wave through K backwards (walks_backwards). Unless the caller
// says FUSION_GEMM_STATIC_TILES, cooperative
// CTAs take their whole tiles from a counter in the workspace as they get
// to them (Walker), so that a CTA that starts late, its SM held by another
// stream's kernel, takes fewer; their producer hands each piece to the
// consumers with the ring's first stage of it (Plan::posted). Where the tiles do
// not fill the SMs evenly, several CTAs may share a tile's k-blocks (split-K
// with fewer tiles than half the SMs; stream-K over the last wave on deep
// tiles, and wherever it pays or over a lone wave of more than half where
// the caller asks for it; split_plan.cuh plans which) and whichever of them
// arrives last sums their partial tiles (fix_up); where that does not pay,
// the grid shrinks to the fewest CTAs that need no more waves. Not here:
// planning the split and the grid (split_plan.cuh), loading and
// multiplying a tile (collective_mainloop.cuh) and storing it
// (collective_epilogue.cuh).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "../gemm.cuh"
#include "../problem.cuh"
#include "../workspace.cuh"
#include "primitives.cuh"
#include "split_plan.cuh"
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

  // Stream-K pieces (see StreamK): a whole tile, or a share of a tile's
  // k-blocks that other CTAs hold the rest of.
  enum class Piece { Whole, Split };

  // One piece of a CTA's work: k-blocks [k_begin, k_begin + k_count) of
  // unit `unit`. (Which CTAs share a split tile, fix_up works out when it
  // needs them, which keeps them out of the registers over the K loop.)
  struct WorkPiece {
    int unit, k_begin, k_count;
    Piece piece;
  };

  // This CTA's stream-K pieces and their counts, written by thread 0 at the
  // start. Split-K gives a CTA one piece; a stream-K split whose CTA shares
  // are under two tiles would give at most three (a whole tile, a Split
  // piece where its range ends, a Split piece where it starts, in the order
  // plan_pieces lists them): plan_stream_k
  // must keep any split it allows within that.
  static constexpr int kMaxStreamKPieces = 4;
  // The list lives in shared memory (see plan_pieces), beside the pieces
  // the producer posts for the consumers: posted[s] is the piece whose
  // first k-block the ring's stage s holds (k_count 0: no more pieces),
  // written before the stage's full barrier is arrived on and read once it
  // completes, so that only the producer runs the walk.
  struct Plan {
    int piece_count[4];                   // 3 used: listed pieces, whole tiles, 1 if there is a last piece
    int whole_units;                      // whole tiles of the launch, units [0, whole_units)
    WorkPiece pieces[kMaxStreamKPieces];  // listed ones from 0, the last one last
    WorkPiece posted[Config::kStages];
  };
  // Whether this config's CTAs may take whole tiles from the workspace's
  // counter: cooperative ones of one CTA per cluster. Ping-pong consumers
  // take every other unit by themselves, and a cluster's CTAs would have to
  // agree on each unit.
  static constexpr bool kDynamicTiles = !kPingPong && kClusterM == 1;
  static constexpr WorkPiece kNoMorePieces{0, 0, 0, Piece::Whole};

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
  // of those tiles laid end to end, after its whole tiles; or, where the
  // split keeps rows of tiles side by side (StreamK::rows = r: a lone wave
  // shared out with `fill`), CTA b = g r + i takes the g-th of grid / r
  // equal shares of row i's tiles laid end to end. A tile it covers
  // only in part is a Split piece: at most one where its range ends inside
  // a tile and one where it starts inside one. Each consumer of each CTA
  // sharing a tile stores its f32 accumulators to its slot of `partials`
  // and counts itself in at the tile's arrival counter; the one whose
  // arrival completes the count adds up every share and runs the
  // epilogue, and the others go on with their next piece (fix_up).
  //
  // No CTA ever waits for another, so the grid finishes whatever the order
  // in which CTAs are dispatched and however many are resident at once:
  // another kernel may hold SMs (another stream, or MPS), and a CTA may
  // start only after the others are done. An earlier scheme had the CTA
  // holding a tile's last k-blocks spin until the lower CTAs had published,
  // which made progress only while those were resident or already done
  // (dispatch in index order, which the programming model does not
  // promise), and stalled SMs whenever another stream's kernel delayed a
  // lower CTA. Counters are 0 at rest: the CTA that arrives last resets
  // its tile's. With fewer tiles than half the SMs this is split-K
  // (dp_tiles 0, every tile split alike); with a lone wave of more than
  // half shared out (FUSION_GEMM_STREAM_K_FILL) dp_tiles is 0 and each
  // CTA's range is shorter than a tile, one or two Split pieces.
  using StreamK = sm90::StreamK;

  // Thread 0 writes this CTA's stream-K pieces to shared memory before the
  // first barrier, in the order they run (after the data-parallel tiles,
  // see piece): the tiles its range covers whole, the Split piece where its
  // range ends (its tile's first k-blocks), and last the Split piece where
  // its range starts, which holds the last k-blocks of its tile. The CTAs
  // sharing that tile run their share of it first, so this CTA is the
  // likely last arriver, and its fix-up finds the other partials stored
  // rather than making another CTA add up the tile while this one still
  // computes. (Any order is correct: nothing waits.) Where every CTA's
  // range is at least a tile long (L >= kb k-blocks: a last wave joined by
  // the full wave before it), in this order every CTA runs k-block t mod kb
  // of some tile at time t (counted in k-blocks) until it reaches its last
  // piece, and from there about k-block t + kb - L (L is the same for all
  // CTAs to within one k-block): two phases of K, as the data-parallel
  // waves run in one, so that the CTAs of one phase on tiles of one column
  // of tiles read the same k-slices of B at about the same time, which L2
  // serves once. With the Split piece where the range ends run first, the
  // whole tiles after it started at a different k-block on every CTA. At
  // (1000, 4544, 18176), 192 tiles of 128x192 of 284 k-blocks shared out
  // over 132 CTAs, a count of B's k-slices fetched again after more than 4
  // k-blocks, with the CTAs in lockstep, gives about 3.9 times B (655 MB)
  // in the old order and 2.1 times (358 MB) in this one
  // (benchmarks/HISTORY.md v30; not measured). Where ranges are shorter
  // than a tile, some lie inside one tile and the lists of both orders are
  // the same. The
  // producer and the consumers read the list from there, which keeps the
  // bookkeeping out of the registers (the producer runs in 40, the
  // consumers hold 128 accumulators). 32-bit: plan_stream_k keeps
  // (units + 1) * grid below 2^31.
  static __device__ __forceinline__ void plan_pieces(Plan& plan, const TileWalk& walk, int kb,
                                                    const StreamK& sk) {
    int count = 0;
    WorkPiece last{0, 0, 0, Piece::Whole};
    bool has_last = false;
    if (sk.units > 0) {
      // This CTA's share of its row's columns laid end to end (one row, the
      // split tiles themselves, unless the split keeps rows side by side:
      // StreamK::rows); column c of row r is split tile c * rows + r.
      const int rows = sk.rows, row = int(blockIdx.x) % rows, group = int(blockIdx.x) / rows;
      const int groups = int(gridDim.x) / rows, row_units = sk.units / rows;
      const int begin = group * row_units / groups, end = (group + 1) * row_units / groups;
      const auto unit = [&](int column) { return sk.dp_tiles + column * rows + row; };
      for (int column = begin / kb; begin < end && (column + 1) * kb <= end; ++column) {
        if (begin <= column * kb) {
          plan.pieces[count++] = {unit(column), 0, kb, Piece::Whole};
        } else {
          last = {unit(column), begin - column * kb, (column + 1) * kb - begin, Piece::Split};
          has_last = true;
        }
      }
      if (begin < end && end % kb != 0) {
        const int column = end / kb, from = begin > column * kb ? begin : column * kb;
        plan.pieces[count++] = {unit(column), from - column * kb, end - from, Piece::Split};
      }
    }
    const int whole = sk.units > 0 ? sk.dp_tiles : walk.units;
    plan.whole_units = whole;
    plan.piece_count[0] = count;
    plan.piece_count[1] = whole > walk.first ? (whole - walk.first + walk.stride - 1) / walk.stride : 0;
    plan.piece_count[2] = has_last ? 1 : 0;
    plan.pieces[kMaxStreamKPieces - 1] = last;
  }

  // Piece i of this CTA's work, false past the last: its whole
  // data-parallel tiles, then the listed stream-K pieces, then the Split
  // piece where its range starts, if there is one. The data-parallel tiles come first so that every
  // CTA runs its waves in step with the others (each wave reads the same
  // k-slices of A and B at about the same time, which L2 serves once), and
  // the stream-K pieces, which differ in length, only after the last wave.
  // A function of i alone, so that only i stays in registers.
  static __device__ __forceinline__ bool piece(const Plan& plan, const TileWalk& walk, int kb, int i, WorkPiece& w) {
    const int whole = plan.piece_count[1], listed = plan.piece_count[0];
    if (i < whole) {
      w = {walk.first + i * walk.stride, 0, kb, Piece::Whole};
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

  // The producer's walk over this CTA's pieces, in piece's order. With
  // `counters` (kDynamicTiles; null: the static walk) the whole tiles are
  // not every stride-th unit from this CTA's first but, after its first
  // (unit blockIdx.x, as in the static walk, taken without an atomic so
  // that no CTA waits on one before its first loads), the next unit past
  // the grid's first wave that counters[0] hands out, fetched one piece
  // ahead so that the atomic's round trip overlaps a tile's loads. A CTA
  // takes units until it is handed one past whole_units; the last CTA to
  // get there (counters[1] counts them) sets both counters back to 0 for
  // the next launch on the workspace: every other CTA has fetched its last
  // unit by then (each fences between that fetch and its count). The
  // stream-K pieces after the whole tiles stay this CTA's own, as
  // plan_pieces listed them.
  struct Walker {
    const Plan& plan;
    const TileWalk& walk;
    int k_blocks;
    uint32_t* counters;
    int index;  // the next piece's in piece()'s numbering, once no whole tile is taken
    uint32_t fetched = 0;
    bool taking;

    __device__ __forceinline__ Walker(const Plan& p, const TileWalk& w, int kb, uint32_t* c)
        : plan(p), walk(w), k_blocks(kb), counters(c), index(c != nullptr ? p.piece_count[1] : 0), taking(c != nullptr) {
      if (taking) fetched = blockIdx.x;
    }

    // The next piece and whether it walks K backwards (walks_backwards);
    // false past the last.
    __device__ __forceinline__ bool next(WorkPiece& w, bool& backwards) {
      if (taking) {
        const uint32_t unit = fetched;
        if (unit < uint32_t(plan.whole_units)) {
          fetched = gridDim.x + atomicAdd(&counters[0], 1u);
          w = {int(unit), 0, k_blocks, Piece::Whole};
          // The unit's wave, which is the static walk's piece index.
          backwards = !kPingPong && ((unit / gridDim.x) & 1u) != 0;
          return true;
        }
        taking = false;
        __threadfence();
        if (atomicAdd(&counters[1], 1u) == gridDim.x - 1) {
          __threadfence();
          atomicExch(&counters[0], 0u);
          atomicExch(&counters[1], 0u);
        }
      }
      backwards = walks_backwards(plan, index);
      return piece(plan, walk, k_blocks, index++, w);
    }
  };

  // Whether piece i loads its k-blocks from the last to the first. The
  // data-parallel waves alternate: a wave reads more of A and B than L2
  // keeps (40 MB at 4096^3 with 128x256 tiles), so a wave that starts at
  // k-block 0 finds none of it left by the wave before, while one that starts
  // at the far end finds that wave's last k-slices of B (and of A where the
  // two waves share tile rows) still there. At 4096^3 on an H200 this cut
  // the DRAM reads of gemm_bias_gelu from 185 to 126 MB (ncu) and gained
  // ~1% (benchmarks/HISTORY.md). Stream-K pieces keep the forward order: reversed,
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

  // The group of CTAs (CTA group * rows + row, StreamK::rows) holding
  // k-block x of a row's split tiles laid end to end: the largest g with
  // g U / groups <= x, U the row's k-blocks (plan_stream_k keeps
  // (x + 1) * grid below 2^31). With one row, the CTA holding k-block x.
  static __device__ __forceinline__ int holder(const StreamK& sk, int x) {
    return ((x + 1) * (int(gridDim.x) / sk.rows) - 1) / (sk.units / sk.rows);
  }

  // This thread's part of the slot of CTA group `group`'s share of split
  // tile `tile` (counted from dp_tiles; column tile / rows of row
  // tile % rows), for one consumer, with `kb` k-blocks a tile. Within a row
  // slot group + column: one per (column, group) pair, without collisions,
  // since a group's k-blocks come after a lower group's, so a higher group
  // never holds a lower column than a lower group does (the pairs' sums rise
  // strictly); the rows' slots follow each other. Hence at most grid + split
  // tiles - 1 slots (partial_bytes), against two per CTA for the two Split
  // pieces a CTA may have. With one row, slot cta + tile.
  static __device__ __forceinline__ float4* partial_slot(const StreamK& sk, int kb, int tile, int group,
                                                         int consumer) {
    const int rows = sk.rows, row = tile % rows, column = tile / rows;
    const int row_slots = int(gridDim.x) / rows + sk.units / kb / rows - 1;
    const int64_t slot = (int64_t(row) * row_slots + group + column) * kConsumers + consumer;
    return reinterpret_cast<float4*>(sk.partials) + slot * (kPartialVectors * 128) + threadIdx.x % 128;
  }

  // The fix-up of a Split piece of unit `unit` (tiles of `kb` k-blocks), on
  // one consumer's rows: stores its partial sums to its slot and counts
  // itself in at the tile's arrival counter. The consumer whose arrival
  // completes the count (one per tile and consumer, not necessarily of the
  // same CTA for both consumers) adds up the shares of the CTAs holding the
  // tile's k-blocks, first..last, in that order from their slots, its
  // own reread too unless it is the first, so that the sum does not depend
  // on which CTA came last (a run's result is the same every time); resets
  // the counter for the next launch on this workspace; and returns true:
  // it runs the epilogue. The others return false at once.
  //
  // Ordering: every thread's stores, then bar.sync, then thread 0's
  // gpu-scope fence and the atomic (a release pattern: the fence is
  // cumulative over the stores the barrier ordered before it); the last
  // arriver's atomic reads the count the others' made, and its fence
  // after the atomic and the barrier that hands the outcome to the warp
  // group order its loads (__ldcg, from L2, where the stores went) after
  // all of them.
  static __device__ __forceinline__ bool fix_up(const StreamK& sk, int consumer, int unit, int kb,
                                                float (&acc)[kMmaM][kAccumulators]) {
    const int tile = unit - sk.dp_tiles, rows = sk.rows, self = int(blockIdx.x) / rows;
    const int column = tile / rows;
    float4* out = partial_slot(sk, kb, tile, self, consumer);
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
      for (int j = 0; j < kAccumulators; j += 4)
        __stcg(out + (mi * kAccumulators + j) / 4 * 128,
               make_float4(acc[mi][j], acc[mi][j + 1], acc[mi][j + 2], acc[mi][j + 3]));
    named_barrier_sync(1 + consumer, 128);
    // The groups of this tile's row that hold its k-blocks.
    const int first = holder(sk, column * kb), last_group = holder(sk, (column + 1) * kb - 1);
    bool last = false;
    if (threadIdx.x % 128 == 0) {
      uint32_t* arrivals = &sk.flags[tile * kConsumers + consumer];
      __threadfence();
      last = atomicAdd(arrivals, 1u) + 1 == uint32_t(last_group - first + 1);
      if (last) {
        __threadfence();
        *arrivals = 0;
      }
    }
    // The same in every lane, said so (a shuffle from lane 0): a branch on
    // the barrier's result as it comes made the compiler treat the piece
    // loop as divergent, moving the K loop's descriptors and barrier
    // addresses out of uniform registers (~35% more instructions per
    // k-block; 3% slower at 4096^3 on an H200, benchmarks/HISTORY.md v14).
    const int finishes = __shfl_sync(0xffffffffu, int(named_barrier_any(1 + consumer, 128, last)), 0);
    if (finishes == 0) return false;
    if (self != first) read_partial<false>(partial_slot(sk, kb, tile, first, consumer), acc);
    for (int group = first + 1; group <= last_group; ++group)
      read_partial<true>(partial_slot(sk, kb, tile, group, consumer), acc);
    return true;
  }

  // This thread's part of a slot into acc (kAdd false) or added to it.
  template <bool kAdd>
  static __device__ __forceinline__ void read_partial(const float4* in, float (&acc)[kMmaM][kAccumulators]) {
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
      for (int j = 0; j < kAccumulators; j += 4) {
        const float4 v = __ldcg(in + (mi * kAccumulators + j) / 4 * 128);
        const float parts[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[mi][j + e] = kAdd ? acc[mi][j + e] + parts[e] : parts[e];
      }
  }

  // Bytes of `partials` a split on `grid` CTAs of tiles of `k_blocks`
  // k-blocks needs: a slot per consumer for each (tile, CTA) index of
  // partial_slot.
  static size_t partial_bytes(const StreamK& sk, int64_t grid, int64_t k_blocks) {
    const int64_t split_tiles = sk.units / k_blocks;
    return size_t(grid + split_tiles - 1) * kConsumers * kPartialVectors * 128 * sizeof(float4);
  }
};

}  // namespace sm90
}  // namespace fusion
