// The sm90 mainloop (H100, H200; built as sm_90a): a persistent,
// warp-specialized GEMM on wgmma and TMA.
//
// At most one CTA per SM walks output tiles in grouped order (gemm.cuh),
// every other wave through K backwards (walks_backwards). Where the
// tiles do not fill the SMs evenly, several CTAs may share a tile's k-blocks
// (split-K with fewer tiles than SMs, stream-K over the last wave
// otherwise; see StreamK and plan_stream_k) and the last of them sums their
// partial tiles; where that does not pay, the grid shrinks to the fewest
// CTAs that need no more waves (balanced_grid). A CTA's threads
// form a producer warp group and one or two consumer warp groups, and
// setmaxnreg moves registers from the first (40) to the others (232):
//  - the producer (one elected thread) issues TMA loads of A and B tiles
//    (BK = 64, 128-byte swizzle) into a ring of kStages shared-memory
//    stages, each guarded by a "full" and an "empty" mbarrier, and runs
//    ahead across tile boundaries;
//  - the consumers hold f32 accumulators in registers and per stage issue
//    wgmma m64nBNk16 straight from shared memory, keeping one stage's wgmmas
//    in flight and freeing the stage before it. Cooperative consumers split
//    each tile by rows (64 each); ping-pong ones take alternate tiles, so
//    that one's epilogue overlaps the other's K loop (see Schedule).
// With a norm prologue (LayerNorm, RMSNorm), the launcher first computes
// every row's statistics into a pool buffer, and the consumers normalize
// their rows of each A stage in shared memory before its wgmmas
// (normalize_stage).
// After the K loop each consumer runs the epilogue chain on its accumulators
// in registers, writes the results into a 128-byte swizzled staging tile
// (stmatrix, 16 bytes per lane) and stores C from there with TMA, while the
// producer already loads the next tile's stages.
//
// B [N, K] (nn.Linear) is K-major like A; B [K, N] is MN-major, loaded as
// 64-column boxes and read by wgmma with its transpose bit. TMA zero-fills
// everything outside A and B and drops what falls outside C, so any M works
// and N and K need only be multiples of 8 (TMA's 16-byte stride rule).
//
// Clusters of two CTAs sharing B through TMA multicast (kClusterM = 2) are
// correct, but on an H200 they measured a little slower than one CTA per
// tile (BENCHMARKS.md), so no tuned config uses them yet.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <utility>

#include "../epilogue.cuh"
#include "../gemm.cuh"
#include "../numeric.cuh"
#include "../problem.cuh"
#include "primitives.cuh"

namespace fusion {
namespace sm90 {

namespace trace {
// The cycle counters of a piece (see below).
enum class Counter { KLoop, FullWait, EmptyWait };
}  // namespace trace

#ifdef FUSION_SM90_TRACE
// Development only (kernels/selftest --trace): kSlots values per CTA.
//  - %globaltimer stamps in slots [0, kCounters): slot 0, the kernel
//    starts; for piece i, slots 1 + 5i to 5 + 5i: consumer 0 starts its
//    K loop, ends it, ends the epilogue chain, has written the staging
//    tile, ends the epilogue.
//  - SM-cycle counters of pieces i < kCountedPieces, from slot kCounters:
//    Counter::KLoop (consumer 0's K loop), Counter::FullWait (consumer 0
//    waiting on full barriers) and Counter::EmptyWait (the producer
//    waiting on empty barriers), each kCountedPieces slots.
namespace trace {
constexpr int kPerPiece = 5, kCounters = 96, kCountedPieces = 16;
constexpr int kSlots = kCounters + 3 * kCountedPieces;
__device__ uint64_t* buffer = nullptr;
__device__ __forceinline__ void put(int slot, uint64_t value) {
  if (buffer != nullptr) buffer[int64_t(blockIdx.x) * kSlots + slot] = value;
}
__device__ __forceinline__ void stamp(int slot) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (slot < kCounters) put(slot, t);
}
__host__ __device__ constexpr int counter_slot(Counter c, int piece) {
  return kCounters + int(c) * kCountedPieces + piece;
}
__device__ __forceinline__ void count(Counter c, int piece, uint64_t cycles) {
  if (piece < kCountedPieces) put(counter_slot(c, piece), cycles);
}
// SM cycles between start() and stop(), summed.
struct Timer {
  uint64_t total = 0, started = 0;
  __device__ __forceinline__ void start() { started = clock64(); }
  __device__ __forceinline__ void stop() { total += clock64() - started; }
};
}  // namespace trace
#define FUSION_SM90_STAMP(piece, phase) \
  ::fusion::sm90::trace::stamp(1 + ::fusion::sm90::trace::kPerPiece * (piece) + (phase))
#define FUSION_SM90_STAMP_START() ::fusion::sm90::trace::stamp(0)
#else
// Without FUSION_SM90_TRACE the counters compile to nothing.
namespace trace {
__device__ __forceinline__ void count(Counter, int, uint64_t) {}
struct Timer {
  static constexpr uint64_t total = 0;
  __device__ __forceinline__ void start() {}
  __device__ __forceinline__ void stop() {}
};
}  // namespace trace
#define FUSION_SM90_STAMP(piece, phase) ((void)0)
#define FUSION_SM90_STAMP_START() ((void)0)
#endif

// How the consumer warp groups share the work.
//  - Cooperative: BM/64 consumers split every tile by rows, 64 each.
//  - PingPong: two consumers take alternate tiles, each a whole BM x BN
//    tile; the ring hands them their tiles' stages in turn, so one's
//    epilogue runs while the other's wgmmas keep the tensor cores busy.
enum class Schedule { Cooperative, PingPong };

// A CTA tile: BM rows by BN columns, K in steps of 64, kStages
// shared-memory stages. Shared memory is 1024 (alignment) + kStages *
// (BM + BN) * 128 bytes for the pipeline, BM * BN * 2 bytes of epilogue
// staging (twice that for PingPong: one tile per consumer; half of it when
// the whole does not fit, see kStagingParts) and 16 * kStages + 16 bytes of
// barriers and 96 of stream-K bookkeeping; at most 227 KB.
//
// kClusterM = 2 launches CTAs in clusters of two that own vertically
// adjacent tiles: they share each B tile, each loading half of it and
// multicasting it to both, which halves the B traffic from L2. A stage is
// then refilled only when the consumers of both CTAs have released it.
template <int BM_, int BN_, int kStages_, Schedule kSchedule_ = Schedule::Cooperative, int kClusterM_ = 1,
          int kGroupRows_ = 8>
struct TileConfig {
  static constexpr int BM = BM_, BN = BN_, BK = 64;
  static constexpr int kStages = kStages_;
  static constexpr Schedule kSchedule = kSchedule_;
  static constexpr int kClusterM = kClusterM_;
  static constexpr int kGroupRows = kGroupRows_;
  static_assert(kClusterM == 1 || kClusterM == 2, "clusters of one or two CTAs along M");
  // What the selftest prints as the warp tile: one consumer's share.
  static constexpr int WM = kSchedule == Schedule::PingPong ? BM : 64, WN = BN;
  static_assert(BM == 64 || BM == 128, "BM is one or two wgmma row blocks of 64");
  static_assert(BN == 128 || BN == 256, "wgmma is instantiated for n = 128 and 256");
  static_assert(kStages >= 2, "the pipeline needs at least two stages");
  static_assert(kSchedule == Schedule::Cooperative || BM == 128,
                "ping-pong consumers hold a 128 x BN tile each; BN = 128 keeps that at 128 registers");
  static_assert(WM * BN / 128 <= 128, "a consumer thread holds at most 128 accumulators");
};

template <typename T, LayoutB kLayout, typename Config_>
struct Mainloop {
  using Element = T;
  using Config = Config_;
  static constexpr int BM = Config::BM, BN = Config::BN, BK = Config::BK;
  static constexpr int kStages = Config::kStages;
  static constexpr int kGroupRows = Config::kGroupRows;
  static constexpr int kClusterM = Config::kClusterM;
  static constexpr bool kPingPong = Config::kSchedule == Schedule::PingPong;
  static constexpr int kConsumers = kPingPong ? 2 : BM / 64;
  // Rows of a tile one consumer computes, as kMmaM wgmma row blocks of 64.
  static constexpr int kRows = Config::WM;
  static constexpr int kMmaM = kRows / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kMinBlocksPerSm = 1;
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  // gemm.cuh's FusedGemm hands the launch to this mainloop.
  static constexpr bool kOwnsKernel = true;

  static constexpr int kABytes = BM * BK * 2;
  static constexpr int kBBytes = BN * BK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // full[kStages], empty[kStages] and the ping-pong order barriers.
  static constexpr int kBarrierBytes = 2 * kStages * 8 + 2 * 8;
  // This CTA's stream-K pieces and their counts, written by thread 0 at the
  // start. Split-K gives a CTA one piece; a stream-K split whose CTA shares
  // are under two tiles would give at most three (a Partial, a whole tile,
  // a Finish): plan_stream_k must keep any split it allows within that.
  static constexpr int kMaxStreamKPieces = 4;
  static constexpr int kStreamKBytes = 96;
  // Epilogue staging: each consumer's share of C, as 64 x 64 boxes of
  // 128-byte rows with the TMA's 128-byte swizzle (16-byte chunk c of row r
  // sits at c ^ (r % 8)), which also keeps the fragment writes free of bank
  // conflicts. The whole share when it fits beside the stages; else half of
  // its columns at a time (kStagingParts = 2: the second half waits until
  // the first half's stores have read the staging tile).
  static constexpr int kBoxBytes = 64 * 64 * 2;
  static constexpr int kSmemLimit = 227 * 1024;
  // 1024 bytes of slack to align the stages for the 128-byte swizzle.
  static constexpr int kSmemWithoutStaging = 1024 + kStages * kStageBytes + kBarrierBytes + kStreamKBytes;
  static constexpr int kStagingParts = kSmemWithoutStaging + kConsumers * kRows * BN * 2 <= kSmemLimit ? 1 : 2;
  static constexpr int kStagingCols = BN / kStagingParts;
  static constexpr int kStagingBytes = kConsumers * kRows * kStagingCols * 2;
  static constexpr int kSmemBytes = kSmemWithoutStaging + kStagingBytes;
  static_assert(kSmemBytes <= kSmemLimit, "the tile needs more shared memory than an sm_90 block may have");
  // Consumer warps that read each stage and arrive on its empty barrier, in
  // every CTA of the cluster (a stage is refilled in all of them at once).
  static constexpr int kReadersPerStage = (kPingPong ? 4 : 4 * kConsumers) * kClusterM;
  static constexpr int kBRowsPerCta = BN / kClusterM;  // B rows (NK) each CTA of a cluster loads
  static constexpr int kTransB = kLayout == LayoutB::KN ? 1 : 0;
  static constexpr int kAccumulators = BN / 2;  // per wgmma row block

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

  struct Smem {
    unsigned char* a;  // [kStages][BM][64]
    unsigned char* b;  // [kStages][BN][64] (NK) or [kStages][BN/64][64][64] (KN)
    unsigned char* staging;  // [kConsumers][kRows / 64][kStagingCols / 64] boxes of kBoxBytes
    uint64_t* full;    // [kStages]
    uint64_t* empty;   // [kStages]
    uint64_t* order;   // [2]: consumer c may start its next K loop once order[c] completes
    WorkPiece* pieces;  // [kMaxStreamKPieces]: listed ones from 0, the Finish one last
    int* piece_count;   // [3]: listed pieces, whole tiles, 1 if there is a Finish piece
  };

  static __device__ __forceinline__ Smem carve(unsigned char* raw) {
    const uint32_t base = smem_u32(raw);
    unsigned char* aligned = raw + ((1024 - (base & 1023)) & 1023);
    Smem s;
    s.a = aligned;
    s.b = aligned + kStages * kABytes;
    s.staging = aligned + kStages * kStageBytes;
    s.full = reinterpret_cast<uint64_t*>(aligned + kStages * kStageBytes + kStagingBytes);
    s.empty = s.full + kStages;
    s.order = s.empty + kStages;
    s.piece_count = reinterpret_cast<int*>(s.order + 2);
    s.pieces = reinterpret_cast<WorkPiece*>(s.piece_count + 4);
    return s;
  }

  // A position in the ring of stages.
  struct RingPosition {
    int stage = 0;
    uint32_t phase = 0;
    __device__ __forceinline__ void advance() {
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    __device__ __forceinline__ void skip(int steps) {
      const int next = stage + steps;
      phase ^= uint32_t(next / kStages) & 1;
      stage = next % kStages;
    }
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

  static_assert(kMaxStreamKPieces * sizeof(WorkPiece) + 16 <= kStreamKBytes,
                "the stream-K piece list outgrew its bytes");

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
  static __device__ __forceinline__ void plan_pieces(const Smem& s, const TileWalk& walk, int kb,
                                                    const StreamK& sk) {
    int count = 0;
    WorkPiece finish{0, 0, 0, Piece::Whole, -1};
    if (sk.units > 0) {
      const int grid = int(gridDim.x);
      const int begin = int(blockIdx.x) * sk.units / grid, end = (int(blockIdx.x) + 1) * sk.units / grid;
      if (begin < end && end % kb != 0) {
        const int tile = end / kb, from = begin > tile * kb ? begin : tile * kb;
        s.pieces[count++] = {sk.dp_tiles + tile, from - tile * kb, end - from, Piece::Partial, 0};
      }
      for (int tile = begin / kb; begin < end && (tile + 1) * kb <= end; ++tile) {
        if (begin <= tile * kb) {
          s.pieces[count++] = {sk.dp_tiles + tile, 0, kb, Piece::Whole, 0};
        } else {
          // The CTA holding k-block tile * kb: the largest c with
          // c U / grid <= tile * kb.
          const int first = ((tile * kb + 1) * grid - 1) / sk.units;
          finish = {sk.dp_tiles + tile, begin - tile * kb, (tile + 1) * kb - begin, Piece::Finish, first};
        }
      }
    }
    const int whole = sk.units > 0 ? sk.dp_tiles : walk.units;
    s.piece_count[0] = count;
    s.piece_count[1] = whole > walk.first ? (whole - walk.first + walk.stride - 1) / walk.stride : 0;
    s.piece_count[2] = finish.piece == Piece::Finish ? 1 : 0;
    s.pieces[kMaxStreamKPieces - 1] = finish;
  }

  // Piece i of this CTA's work, false past the last: its whole
  // data-parallel tiles, then the listed stream-K pieces, then the Finish
  // piece if there is one. The data-parallel tiles come first so that every
  // CTA runs its waves in step with the others (each wave reads the same
  // k-slices of A and B at about the same time, which L2 serves once), and
  // the stream-K pieces, which differ in length, only after the last wave.
  // A function of i alone, so that only i stays in registers.
  static __device__ __forceinline__ bool piece(const Smem& s, const TileWalk& walk, int kb, int i, WorkPiece& w) {
    const int whole = s.piece_count[1], listed = s.piece_count[0];
    if (i < whole) {
      w = {walk.first + i * walk.stride, 0, kb, Piece::Whole, 0};
      return true;
    }
    if (i < whole + listed) {
      w = s.pieces[i - whole];
      return true;
    }
    if (i == whole + listed && s.piece_count[2] != 0) {
      w = s.pieces[kMaxStreamKPieces - 1];
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
  static __device__ __forceinline__ bool walks_backwards(const Smem& s, int i) {
    return !kPingPong && (i & 1) != 0 && i < s.piece_count[1];
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

  // The producer: one thread keeps every stage loaded, across tiles.
  static __device__ __forceinline__ void produce(const Smem& s, const CUtensorMap* map_a, const CUtensorMap* map_b,
                                                 const GemmArgs<T>& args, const StreamK& sk) {
    const TileWalk walk(args);
    const int k_blocks = int((args.k + BK - 1) / BK);
    RingPosition ring;
    WorkPiece w;
    for (int i = 0; piece(s, walk, k_blocks, i, w); ++i) {
      const TileCoord tile = walk.tile(w.unit);
      trace::Timer waited;
      const bool backwards = walks_backwards(s, i);
      for (int j = 0; j < w.k_count; ++j) {
        const int kb = backwards ? w.k_begin + w.k_count - 1 - j : w.k_begin + j;
        waited.start();
        mbarrier_wait(&s.empty[ring.stage], ring.phase ^ 1);
        waited.stop();
        uint64_t* full = &s.full[ring.stage];
        // Counts this CTA's A and the whole B tile, whichever CTA loads it.
        mbarrier_arrive_expect_tx(full, kStageBytes);
        const int32_t k0 = kb * BK;
        tma_load_2d(s.a + ring.stage * kABytes, map_a, full, k0, int32_t(tile.m0));
        unsigned char* b = s.b + ring.stage * kBBytes;
        if constexpr (kClusterM == 1) {
          if constexpr (kLayout == LayoutB::NK) {
            tma_load_2d(b, map_b, full, k0, int32_t(tile.n0));
          } else {
#pragma unroll
            for (int j = 0; j < BN / 64; ++j)
              tma_load_2d(b + j * 64 * BK * 2, map_b, full, int32_t(tile.n0) + 64 * j, k0);
          }
        } else {
          // This CTA's part of B, to both CTAs of the cluster.
          const uint16_t both = (1u << kClusterM) - 1;
          if constexpr (kLayout == LayoutB::NK) {
            tma_load_2d_multicast(b + walk.rank * kBRowsPerCta * 128, map_b, full, k0,
                                  int32_t(tile.n0) + walk.rank * kBRowsPerCta, both);
          } else {
            constexpr int kBoxes = BN / 64 / kClusterM;
#pragma unroll
            for (int i = 0; i < kBoxes; ++i) {
              const int j = walk.rank * kBoxes + i;
              tma_load_2d_multicast(b + j * 64 * BK * 2, map_b, full, int32_t(tile.n0) + 64 * j, k0, both);
            }
          }
        }
        ring.advance();
      }
      trace::count(trace::Counter::EmptyWait, i, waited.total);
    }
  }

  // The first row of a consumer's share of its tile: cooperative consumers
  // split a tile by rows, ping-pong ones take whole tiles.
  static __device__ __forceinline__ int share_row0(int consumer) { return kPingPong ? 0 : consumer * 64; }

  // The norm prologue's view of one tile for one consumer thread: the
  // statistics of the A rows it normalizes (see normalize_stage) and the
  // k-block of stage j, k_first + k_step * j (the producer may walk a tile
  // backwards).
  static constexpr int kNormRows = kRows / 16;  // rows per thread: one 16-byte column of every 16th row
  struct NormTile {
    RowStats rows[kNormRows];
    int k_first = 0, k_step = 1;
  };

  // Thread t of a consumer normalizes 16-byte chunk t % 8 of its rows
  // t / 8 + 16 j: one column chunk, so gamma and beta are loaded once per
  // stage for all its rows, and the 8 threads of a row read and write
  // 8 different bank groups.
  static __device__ __forceinline__ NormTile norm_tile(const RowStats* stats, int64_t m_base, int64_t M, int k_begin,
                                                       int k_count, bool backwards) {
    NormTile t;
    const int thread = threadIdx.x % 128;
#pragma unroll
    for (int j = 0; j < kNormRows; ++j) {
      const int64_t m = m_base + thread / 8 + 16 * j;
      t.rows[j] = (stats != nullptr && m < M) ? stats[m] : RowStats{0.0f, 0.0f};
    }
    t.k_first = backwards ? k_begin + k_count - 1 : k_begin;
    t.k_step = backwards ? -1 : 1;
    return t;
  }

  // Waits for a stage (wait_full) and normalizes this consumer's rows of A
  // in it in place, 16 bytes at a time (the 128-byte swizzle keeps each
  // chunk whole: chunk c of row r sits at c ^ (r % 8)); the chunk's gamma
  // and beta are loaded before the wait. Then makes the writes visible to
  // the wgmmas (the async proxy) of the whole warp group. Chunks past K,
  // which TMA zero-filled, stay zero; rows past M get mean = rstd = 0 and
  // feed only rows of C that are never stored. (Skipping those rows measured
  // slower on full tiles: BENCHMARKS.md v9.)
  template <typename Prologue, typename WaitFull>
  static __device__ __forceinline__ void normalize_stage(const Smem& s, int stage, int consumer, int kb,
                                                         const NormTile& norm, const GemmArgs<T>& args,
                                                         WaitFull wait_full) {
    const int thread = threadIdx.x % 128;
    const int chunk = thread % 8;
    const int64_t k0 = int64_t(kb) * BK + chunk * 8;
    const bool inside = k0 < args.k;
    NormColumns columns{};
    if (inside) columns = Prologue::template columns<T>(k0, args.norm);
    wait_full();
    if (inside) {
#pragma unroll
      for (int j = 0; j < kNormRows; ++j) {
        const int row = share_row0(consumer) + thread / 8 + 16 * j;
        uint4* p = reinterpret_cast<uint4*>(s.a + stage * kABytes + row * 128 + ((chunk ^ (row % 8)) << 4));
        Vec8<T> v;
        v.bits = *p;
        Prologue::template apply<T>(v, norm.rows[j], columns);
        *p = v.bits;
      }
    }
    fence_proxy_async();
    named_barrier_sync(1 + consumer, 128);
  }

  // One consumer warp group's K loop over one tile.
  //
  // Ping-pong consumers run their K loops in turn: a consumer waits on a
  // stage's full barrier by parity, which cannot tell its own fill from one
  // two laps earlier, so it must not wait on stages of its next tile before
  // the other consumer has waited on every stage before them.
  //
  // With a norm prologue, each stage's A rows of this consumer are
  // normalized in place first (normalize_stage); `norm` says which k-block
  // the tile's first stage holds and in which direction they go.
  template <typename Prologue = NoPrologue>
  static __device__ __forceinline__ void mma_tile(const Smem& s, int consumer, int k_blocks, RingPosition& ring,
                                                  float (&acc)[kMmaM][kAccumulators], int trace_piece = 0,
                                                  const NormTile& norm = {}, const GemmArgs<T>* args = nullptr) {
    const int lane = threadIdx.x % 32;
    const int row0 = share_row0(consumer);
    const uint64_t a_desc = smem_descriptor(s.a + row0 * 128, 16, 1024);
    const uint64_t b_desc = kLayout == LayoutB::NK ? smem_descriptor(s.b, 16, 1024)
                                                   : smem_descriptor(s.b, 64 * BK * 2, 1024);
    int previous = -1;
    trace::Timer loop, waited;  // the K loop, and its waits on full barriers
    loop.start();
    for (int kb = 0; kb < k_blocks; ++kb) {
      const auto wait_full = [&] {
        waited.start();
        mbarrier_wait(&s.full[ring.stage], ring.phase);
        waited.stop();
      };
      if constexpr (Prologue::kEnabled)
        normalize_stage<Prologue>(s, ring.stage, consumer, norm.k_first + norm.k_step * kb, norm, *args, wait_full);
      else
        wait_full();
      // Descriptors by addition: the first stage's plus the offset in
      // 16-byte units (the address field never carries, as shared memory
      // ends below 256 KB). Rebuilding them from addresses cost ~45 more
      // instructions per k-block and warp, and ~1% at 4096^3 on an H200
      // (BENCHMARKS.md v10).
      const uint64_t a_stage = a_desc + uint64_t(ring.stage) * (kABytes >> 4);
      const uint64_t b_stage = b_desc + uint64_t(ring.stage) * (kBBytes >> 4);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        const uint64_t db = b_stage + uint64_t(kk) * (kLayout == LayoutB::NK ? 32 >> 4 : (16 * 128) >> 4);
#pragma unroll
        for (int mi = 0; mi < kMmaM; ++mi) {
          const uint64_t da = a_stage + uint64_t((mi * 64 * 128 + kk * 32) >> 4);
          Wgmma<T, BN, kTransB>::mma(acc[mi], da, db, (kb > 0 || kk > 0) ? 1 : 0);
        }
      }
      wgmma_commit();
      // The stage before this one is now read: hand it back.
      wgmma_wait<1>();
      if (previous >= 0 && lane == 0) release(s, previous);
      previous = ring.stage;
      ring.advance();
    }
    if (kPingPong && threadIdx.x % 128 == 0) mbarrier_arrive(&s.order[1 - consumer]);
    wgmma_wait<0>();
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi) fence_registers(acc[mi]);
    loop.stop();
    if (consumer == 0 && threadIdx.x % 128 == 0) {
      trace::count(trace::Counter::FullWait, trace_piece, waited.total);
      trace::count(trace::Counter::KLoop, trace_piece, loop.total);
    }
    if (previous >= 0 && lane == 0) release(s, previous);
  }

  // Hands a stage back to the producers of every CTA in the cluster.
  static __device__ __forceinline__ void release(const Smem& s, int stage) {
    if constexpr (kClusterM == 1) {
      mbarrier_arrive(&s.empty[stage]);
    } else {
#pragma unroll
      for (int rank = 0; rank < kClusterM; ++rank) mbarrier_arrive_cluster(&s.empty[stage], rank);
    }
  }

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
  static __device__ __forceinline__ void store_tile(const Smem& s, int consumer, TileCoord tile,
                                                    float (&acc)[kMmaM][kAccumulators], const CUtensorMap* map_c,
                                                    const GemmArgs<T>& args, [[maybe_unused]] int trace_piece = 0) {
    const int thread = threadIdx.x % 128;
    const int warp = thread / 32, lane = thread % 32;
    const int64_t m_base = tile.m0 + share_row0(consumer);
    // Rows and columns of this consumer's part of the tile that lie inside C.
    const int rows = int(args.m - m_base < kRows ? args.m - m_base : kRows);
    const int cols = int(args.n - tile.n0 < BN ? args.n - tile.n0 : BN);
    if (!Epilogue::kReadsTile && cols == BN)
      apply_chain<Epilogue, false>(acc, m_base, tile.n0, rows, cols, args);
    else
      apply_chain<Epilogue, true>(acc, m_base, tile.n0, rows, cols, args);
    [[maybe_unused]] const bool tracer = consumer == 0 && thread == 0;
    if (tracer) FUSION_SM90_STAMP(trace_piece, 2);
    unsigned char* staging = s.staging + consumer * (kRows * kStagingCols * 2);
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

  template <typename Prologue, typename Epilogue>
  static __device__ __forceinline__ void consume(const Smem& s, int consumer, const CUtensorMap* map_c,
                                                 const GemmArgs<T>& args, const StreamK& sk,
                                                 const RowStats* row_stats) {
    const TileWalk walk(args);
    const int k_blocks = int((args.k + BK - 1) / BK);
    RingPosition ring;
    float acc[kMmaM][kAccumulators];
    if constexpr (kPingPong) {
      // Each consumer takes every other unit of this CTA, skipping the other
      // consumer's stages in the ring (no stream-K).
      if (consumer == 1) ring.skip(k_blocks);
      uint32_t turn = 0;  // K loops this consumer has run
      for (int64_t u = walk.first + consumer * walk.stride; u < walk.units; u += 2 * walk.stride) {
        // Consumer 0's first K loop goes first; every other waits for the
        // other consumer's previous one (see mma_tile).
        if (consumer == 1 || turn > 0) mbarrier_wait(&s.order[consumer], consumer == 1 ? (turn & 1) : ((turn - 1) & 1));
        ++turn;
        NormTile norm;
        if constexpr (Prologue::kEnabled)
          norm = norm_tile(row_stats, walk.tile(u).m0 + share_row0(consumer), args.m, 0, k_blocks, false);
        mma_tile<Prologue>(s, consumer, k_blocks, ring, acc, 0, norm, &args);
        store_tile<Epilogue>(s, consumer, walk.tile(u), acc, map_c, args);
        ring.skip(k_blocks);
      }
    } else {
      WorkPiece w;
      [[maybe_unused]] const bool tracer = consumer == 0 && threadIdx.x % 128 == 0;
      for (int i = 0; piece(s, walk, k_blocks, i, w); ++i) {
        if (tracer) FUSION_SM90_STAMP(i, 0);
        NormTile norm;
        if constexpr (Prologue::kEnabled)
          norm = norm_tile(row_stats, walk.tile(w.unit).m0 + share_row0(consumer), args.m, w.k_begin, w.k_count,
                           walks_backwards(s, i));
        mma_tile<Prologue>(s, consumer, w.k_count, ring, acc, i, norm, &args);
        if (tracer) FUSION_SM90_STAMP(i, 1);
        if (w.piece == Piece::Partial) {
          publish(sk, consumer, acc);
        } else {
          if (w.piece == Piece::Finish) gather(sk, consumer, w.first, acc);
          store_tile<Epilogue>(s, consumer, walk.tile(w.unit), acc, map_c, args, i);
        }
        if (tracer) FUSION_SM90_STAMP(i, 4);
      }
    }
    // Shared memory must outlive the last stores' reads of it.
    if (threadIdx.x % 128 == 0) bulk_wait_read();
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

  // Host side: the tensor maps of A, B and C for one launch.
  static cudaError_t encode_maps(const GemmArgs<T>& p, CUtensorMap* map_a, CUtensorMap* map_b, CUtensorMap* map_c);
  // The stream-K split for `tiles` tiles of `k_blocks` k-blocks on `sms`
  // SMs (StreamK::units 0: every tile whole) and, when it splits, the grid
  // it needs in *grid (left alone otherwise).
  static StreamK plan_stream_k(int64_t tiles, int64_t k_blocks, int64_t sms, int64_t* grid);
  template <typename Prologue, typename Epilogue>
  static cudaError_t launch(const GemmArgs<T>& p, cudaStream_t stream);
  template <typename Prologue, typename Epilogue>
  static cudaError_t launch_gemm(const GemmArgs<T>& p, const RowStats* row_stats, cudaStream_t stream);
};

// row_stats: the norm prologue's [M] row statistics (null without one).
template <typename ML, typename Prologue, typename Epilogue>
__global__ void __launch_bounds__(ML::kThreads, 1)
    persistent_gemm_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                           const __grid_constant__ CUtensorMap map_c, const GemmArgs<typename ML::Element> args,
                           const typename ML::StreamK stream_k, const RowStats* row_stats) {
#if FUSION_SM90_ENABLED
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const typename ML::Smem s = ML::carve(smem_raw);
  const int group = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    FUSION_SM90_STAMP_START();
    prefetch_tensor_map(&map_a);
    prefetch_tensor_map(&map_b);
    prefetch_tensor_map(&map_c);
    for (int i = 0; i < ML::kStages; ++i) {
      mbarrier_init(&s.full[i], 1);
      mbarrier_init(&s.empty[i], ML::kReadersPerStage);
    }
    mbarrier_init(&s.order[0], 1);
    mbarrier_init(&s.order[1], 1);
    fence_barrier_init();
    ML::plan_pieces(s, typename ML::TileWalk(args), int((args.k + ML::BK - 1) / ML::BK), stream_k);
  }
  // The cluster's other CTA multicasts into this one's stages and arrives on
  // its barriers: both must be initialised first.
  if constexpr (ML::kClusterM > 1)
    cluster_sync();
  else
    __syncthreads();
  if (group == 0) {
    setmaxnreg_dec<ML::kProducerRegisters>();
    if (threadIdx.x == 0) ML::produce(s, &map_a, &map_b, args, stream_k);
  } else {
    setmaxnreg_inc<ML::kConsumerRegisters>();
    // The same in every lane, said so (a shuffle from lane 0) that what
    // derives from it can live in uniform registers.
    const int consumer = __shfl_sync(0xffffffffu, group - 1, 0);
    ML::template consume<Prologue, Epilogue>(s, consumer, &map_c, args, stream_k, row_stats);
  }
  // ... and may still arrive on this CTA's barriers until it is done.
  if constexpr (ML::kClusterM > 1) cluster_sync();
#endif
}

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

// A row-major [rows, cols] matrix of 16-bit elements, read in boxes of
// box_rows x 64 columns with 128-byte swizzle.
template <typename T>
cudaError_t encode_matrix(CUtensorMap* map, const T* base, int64_t rows, int64_t cols, uint32_t box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = tensor_map_encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  const CUtensorMapDataType type =
      std::is_same_v<T, __half> ? CU_TENSOR_MAP_DATA_TYPE_FLOAT16 : CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * sizeof(T)};
  const cuuint32_t box[2] = {64, box_rows};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r = encode(map, type, 2, const_cast<T*>(base), dims, strides, box, element_strides,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                            CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// False when FUSION_STREAM_K=0 is set: every tile then runs whole on one
// CTA, and no scratch is allocated. Read once per process.
inline bool stream_k_allowed() {
  static const bool allowed = [] {
    const char* value = std::getenv("FUSION_STREAM_K");
    return value == nullptr || std::strcmp(value, "0") != 0;
  }();
  return allowed;
}

// Stream-K scratch of one (device, stream): the flags (zeroed when
// allocated; each launch leaves the ones it uses at 0) and the partial
// tiles. Launches on one stream run one after another and share it; other
// streams get their own. Streams are told apart by cudaStreamGetId, unique
// for the life of the program (also for each thread's per-thread default
// stream, and for a new stream that reuses a destroyed one's handle).
// Allocated stream-ordered, grown on demand and kept for the life of the
// process (sms * BM * BN * 4 bytes per stream that ever split: 17 MB for
// 128x256 tiles on 132 SMs).
//
// `lock` comes back held: the caller queues its kernel before releasing
// it, so that another thread growing the same stream's scratch queues the
// free after that kernel. The pointers stay null (no stream-K for this
// launch) while the stream is being captured into a graph: the graph could
// be replayed on another stream, or twice at once, beside launches on this
// one, and they would share the scratch.
constexpr size_t kStreamKFlagBytes = 4096;
struct StreamKScratch {
  std::unique_lock<std::mutex> lock;
  uint32_t* flags = nullptr;
  float* partials = nullptr;
};
inline cudaError_t stream_k_scratch(int device, cudaStream_t stream, size_t partial_bytes, StreamKScratch* out) {
  struct Scratch {
    void* base = nullptr;
    size_t bytes = 0;
  };
  static std::mutex mutex;
  static std::map<std::pair<int, unsigned long long>, Scratch> by_stream;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  if (err != cudaSuccess || capture != cudaStreamCaptureStatusNone) return err;
  unsigned long long id = 0;
  err = cudaStreamGetId(stream, &id);
  if (err != cudaSuccess) return err;
  std::unique_lock<std::mutex> lock(mutex);
  Scratch& scratch = by_stream[{device, id}];
  const size_t bytes = kStreamKFlagBytes + partial_bytes;
  if (scratch.bytes < bytes) {
    if (scratch.base != nullptr) {
      err = cudaFreeAsync(scratch.base, stream);
      if (err != cudaSuccess) return err;
      scratch = Scratch{};
    }
    void* base = nullptr;
    err = cudaMallocAsync(&base, bytes, stream);
    if (err != cudaSuccess) return err;
    err = cudaMemsetAsync(base, 0, kStreamKFlagBytes, stream);
    if (err != cudaSuccess) {
      (void)cudaFreeAsync(base, stream);
      return err;
    }
    scratch = Scratch{base, bytes};
  }
  out->flags = static_cast<uint32_t*>(scratch.base);
  out->partials = reinterpret_cast<float*>(static_cast<unsigned char*>(scratch.base) + kStreamKFlagBytes);
  out->lock = std::move(lock);
  return cudaSuccess;
}

}  // namespace detail

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
// FUSION_STREAM_K=0 in the environment turns both off.
template <typename T, LayoutB kLayout, typename Config>
typename Mainloop<T, kLayout, Config>::StreamK Mainloop<T, kLayout, Config>::plan_stream_k(int64_t tiles,
                                                                                           int64_t k_blocks,
                                                                                           int64_t sms,
                                                                                           int64_t* grid) {
  constexpr int64_t kFixupBlocks = 4, kMinBlocks = 4;
  StreamK sk;
  if (kPingPong || kClusterM > 1 || sms * kConsumers * 4 > int64_t(detail::kStreamKFlagBytes)) return sk;
  if (!detail::stream_k_allowed() || tiles <= 0 || sms <= 0) return sk;
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

template <typename T, LayoutB kLayout, typename Config>
cudaError_t Mainloop<T, kLayout, Config>::encode_maps(const GemmArgs<T>& p, CUtensorMap* map_a, CUtensorMap* map_b,
                                                      CUtensorMap* map_c) {
  cudaError_t err = detail::encode_matrix(map_a, p.a, p.m, p.k, BM);
  if (err != cudaSuccess) return err;
  err = detail::encode_matrix(map_c, p.c, p.m, p.n, 64);
  if (err != cudaSuccess) return err;
  if constexpr (kLayout == LayoutB::NK)
    return detail::encode_matrix(map_b, p.b, p.n, p.k, kBRowsPerCta);
  else
    return detail::encode_matrix(map_b, p.b, p.k, p.n, BK);
}

// With a norm prologue: first the statistics of A's rows, into a buffer
// from the device's current memory pool, allocated and freed on the stream
// around the two kernels (so launches on other streams each have their
// own, and a captured launch becomes a graph allocation, whose replays run
// one after another), then the GEMM, which normalizes each stage of A in
// shared memory (normalize_stage).
template <typename T, LayoutB kLayout, typename Config>
template <typename Prologue, typename Epilogue>
cudaError_t Mainloop<T, kLayout, Config>::launch(const GemmArgs<T>& p, cudaStream_t stream) {
  if constexpr (!Prologue::kEnabled) {
    return launch_gemm<Prologue, Epilogue>(p, nullptr, stream);
  } else {
    void* stats = nullptr;
    cudaError_t err = cudaMallocAsync(&stats, size_t(p.m) * sizeof(RowStats), stream);
    if (err != cudaSuccess) return err;
    RowStats* row_stats = static_cast<RowStats*>(stats);
    err = Prologue::launch_row_stats(p.a, row_stats, p.m, p.k, p.norm, stream);
    if (err == cudaSuccess) err = launch_gemm<Prologue, Epilogue>(p, row_stats, stream);
    const cudaError_t freed = cudaFreeAsync(stats, stream);
    return err != cudaSuccess ? err : freed;
  }
}

template <typename T, LayoutB kLayout, typename Config>
template <typename Prologue, typename Epilogue>
cudaError_t Mainloop<T, kLayout, Config>::launch_gemm(const GemmArgs<T>& p, const RowStats* row_stats,
                                                      cudaStream_t stream) {
  using Self = Mainloop<T, kLayout, Config>;
  static std::atomic<int> configured[64];
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  err = fusion::detail::raise_smem_limit(configured, device, persistent_gemm_kernel<Self, Prologue, Epilogue>, kSmemBytes);
  if (err != cudaSuccess) return err;
  CUtensorMap map_a, map_b, map_c;
  err = encode_maps(p, &map_a, &map_b, &map_c);
  if (err != cudaSuccess) return err;
  // At most one CTA per SM (one cluster per pair of SMs that can hold one
  // at once) and per unit of work; without stream-K, balanced_grid.
  const int64_t units = ((p.m + BM * kClusterM - 1) / (BM * kClusterM)) * ((p.n + BN - 1) / BN);
  StreamK sk;
  if constexpr (kClusterM == 1) {
    const int64_t ctas = fusion::detail::sm_count(device);
    int64_t grid = balanced_grid(units, ctas), split_grid = grid;
    sk = plan_stream_k(units, (p.k + BK - 1) / BK, ctas, &split_grid);
    // Held until the kernel is queued (see stream_k_scratch).
    detail::StreamKScratch scratch;
    // Without scratch (a stream being captured, a failed allocation) every
    // tile runs whole. A failure's error is cleared only when no earlier
    // one was pending, so that this launch never swallows the caller's.
    if (sk.units > 0 && cudaPeekAtLastError() == cudaSuccess) {
      if (detail::stream_k_scratch(device, stream, size_t(ctas) * BM * BN * sizeof(float), &scratch) !=
          cudaSuccess)
        (void)cudaGetLastError();
    }
    if (scratch.flags != nullptr) {
      sk.flags = scratch.flags;
      sk.partials = scratch.partials;
      grid = split_grid;
    } else {
      sk = StreamK{};
    }
    persistent_gemm_kernel<Self, Prologue, Epilogue>
        <<<unsigned(grid), kThreads, kSmemBytes, stream>>>(map_a, map_b, map_c, p, sk, row_stats);
  } else {
    cudaLaunchConfig_t config{};
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmemBytes;
    config.stream = stream;
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = kClusterM;
    cluster.val.clusterDim.y = 1;
    cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    // Clusters must fit inside a GPC, so fewer than SMs / kClusterM may be
    // resident at once; a persistent grid larger than that would run its
    // last clusters after the others finish.
    static std::atomic<int> resident_by_device[64];
    const int resident = fusion::detail::once_per_device(resident_by_device, device, [&] {
      int clusters = 0;
      config.gridDim = dim3(unsigned(fusion::detail::sm_count(device)));
      err = cudaOccupancyMaxActiveClusters(&clusters, persistent_gemm_kernel<Self, Prologue, Epilogue>, &config);
      return err == cudaSuccess ? clusters : 0;
    });
    if (err != cudaSuccess) return err;
    if (resident <= 0) return cudaErrorInvalidConfiguration;
    config.gridDim = dim3(unsigned((units < resident ? units : resident) * kClusterM));
    err = cudaLaunchKernelEx(&config, persistent_gemm_kernel<Self, Prologue, Epilogue>, map_a, map_b, map_c, p, sk,
                             row_stats);
    if (err != cudaSuccess) return err;
  }
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace fusion
