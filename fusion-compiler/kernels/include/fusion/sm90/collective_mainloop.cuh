// The sm90 collective mainloop: a ring of kStages shared-memory stages that
// one producer thread fills with TMA loads of A and B tiles (k-blocks of
// one 128-byte row: BK = 64 16-bit or 128 FP8 elements, 128-byte swizzle)
// and the consumer warp groups multiply with wgmma straight from shared
// memory, each stage guarded by a "full" and an "empty" mbarrier.
//
// The producer runs ahead across tile boundaries; the consumers hold f32
// accumulators in registers and per stage issue four wgmmas of 32 bytes of
// K each (m64nBNk16 for f16 and bf16, m64nBNk32 for e4m3), keeping one
// stage's wgmmas in flight and freeing the stage before it (FP8: waiting
// for each stage's, to add its sums into the f32 accumulators; see
// kPromote). The bytes a stage holds, and so its descriptors and TMA
// boxes, are the same for either element size.
// Cooperative consumers split each tile by rows (64 each); ping-pong ones
// take alternate tiles, so that one's epilogue overlaps the other's K loop
// (see Schedule).
//
// B [N, K] (nn.Linear) is K-major like A; B [K, N] is MN-major, loaded as
// 64-column boxes and read by wgmma with its transpose bit, which 8-bit
// wgmma does not have: an FP8 B is [N, K]. TMA zero-fills everything
// outside A and B, so any M works and N and K need only fill whole 16-byte
// units (TMA's stride rule: multiples of 8, or of 16 for FP8).
//
// With kClusterM = 2 the CTAs of a cluster share each B tile: each loads
// half of it and multicasts it to both, and a stage is refilled only when
// the consumers of both CTAs have released it.
//
// Which tiles and k-blocks come next is the scheduler's (tile_scheduler.cuh);
// what happens to the accumulators, the epilogue's (collective_epilogue.cuh).
#pragma once

#include <cuda.h>
#include <stdint.h>

#include "../numeric.cuh"
#include "../problem.cuh"
#include "../prologue.cuh"
#include "primitives.cuh"
#include "tile_config.cuh"
#include "trace.cuh"

namespace fusion {
namespace sm90 {

template <typename T, LayoutB kLayout, typename Config>
struct CollectiveMainloop {
  static constexpr int BM = Config::BM, BN = Config::BN, BK = Config::BK;
  static constexpr int kStages = Config::kStages;
  static constexpr int kClusterM = Config::kClusterM;
  static constexpr bool kPingPong = Config::kPingPong;
  static constexpr int kConsumers = Config::kConsumers;
  static constexpr int kRows = Config::WM;
  static constexpr int kMmaM = Config::kMmaM;
  static constexpr int kAccumulators = Config::kAccumulators;

  static_assert(BK * int(sizeof(T)) == Config::kBlockBytes,
                "a k-block is one 128-byte row: the tile's BK is 64 for 16-bit operands, 128 for FP8 ones");
  static_assert(sizeof(T) == 2 || kLayout == LayoutB::NK,
                "8-bit wgmma reads both operands K-major: an FP8 weight is [N, K]");
  static constexpr int kABytes = BM * Config::kBlockBytes;
  static constexpr int kBBytes = BN * Config::kBlockBytes;
  // Each wgmma reads 32 bytes of every K-major row (k16 of 16-bit, k32 of
  // FP8 elements): four to a k-block.
  static constexpr int kMmaBytes = 32;
  static constexpr int kMmasPerBlock = Config::kBlockBytes / kMmaBytes;
  // 8-bit wgmma keeps fewer bits than f32 in its sums (about 14 on Hopper,
  // as DeepSeek-V3's report measured), which over a long K loop costs far
  // more than a bf16 output's rounding. An FP8 tile therefore sums each
  // k-block (128 elements) in block_sums and adds that into its f32
  // accumulators with ordinary adds once the block's wgmmas are done
  // (CUTLASS's "promotion"; cuBLASLt's default, its fast accumulation off).
  // Both sets live in registers: BN 128 at most for one row block.
  static constexpr bool kPromote = sizeof(T) == 1;
  static_assert(!kPromote || kMmaM * kAccumulators <= 64,
                "an FP8 consumer holds its accumulators twice (per k-block and in total): a 64 x 128 share at most");
  static constexpr int kStageBytes = kABytes + kBBytes;
  // Consumer warps that read each stage and arrive on its empty barrier, in
  // every CTA of the cluster (a stage is refilled in all of them at once).
  static constexpr int kReadersPerStage = (kPingPong ? 4 : 4 * kConsumers) * kClusterM;
  static constexpr int kBRowsPerCta = BN / kClusterM;  // B rows (NK) each CTA of a cluster loads
  static_assert(b_boxes_fit<kLayout, Config>(), "B stored [K, N] loads in 64-column boxes: BN a multiple of 64");
  static_assert(cluster_splits_b<kLayout, Config>(),
                "a cluster's CTAs split B's tile evenly: whole 8-row swizzle groups ([N, K]) or 64-column boxes ([K, N])");
  static constexpr int kTransB = kLayout == LayoutB::KN ? 1 : 0;

  // The ring in shared memory: its stages, which the kernel places at a
  // 1024-byte aligned address (the 128-byte swizzle repeats every 8 rows of
  // 128 bytes, and TMA and wgmma agree on it only from such a boundary), and
  // their barriers. Two structs, as the kernel's SharedStorage keeps the
  // epilogue's staging tile, also swizzled, between them.
  struct StageTiles {
    unsigned char a[kStages][kABytes];  // each [BM][BK]
    unsigned char b[kStages][kBBytes];  // each [BN][BK] (NK) or [BN/64][BK][64] (KN)
  };
  static_assert(kABytes % 1024 == 0 && kBBytes % 1024 == 0, "every stage starts 1024-byte aligned");
  struct Barriers {
    uint64_t full[kStages];
    uint64_t empty[kStages];
    uint64_t order[2];  // consumer c may start its next K loop once order[c] completes
  };

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

  // The producer's part for one tile: loads its k-blocks [k_begin, k_begin
  // + k_count), the last first when `backwards`, into the next stages of
  // the ring, each once the consumers have released it. `rank` is this
  // CTA's in its cluster; `waited` sums the waits on empty barriers;
  // `first(stage)` runs once the first of them is free, before its full
  // barrier is arrived on (the scheduler posts the piece there).
  template <typename First>
  static __device__ __forceinline__ void load_tile(StageTiles& tiles, Barriers& barriers, RingPosition& ring,
                                                   const CUtensorMap* map_a, const CUtensorMap* map_b, TileCoord tile,
                                                   int rank, int k_begin, int k_count, bool backwards,
                                                   trace::Timer& waited, First&& first) {
    for (int j = 0; j < k_count; ++j) {
      const int kb = backwards ? k_begin + k_count - 1 - j : k_begin + j;
      waited.start();
      mbarrier_wait(&barriers.empty[ring.stage], ring.phase ^ 1);
      waited.stop();
      if (j == 0) first(ring.stage);
      uint64_t* full = &barriers.full[ring.stage];
      // Counts this CTA's A and the whole B tile, whichever CTA loads it.
      mbarrier_arrive_expect_tx(full, kStageBytes);
      const int32_t k0 = kb * BK;
      tma_load_2d(tiles.a[ring.stage], map_a, full, k0, int32_t(tile.m0));
      unsigned char* b = tiles.b[ring.stage];
      if constexpr (kClusterM == 1) {
        if constexpr (kLayout == LayoutB::NK) {
          tma_load_2d(b, map_b, full, k0, int32_t(tile.n0));
        } else {
#pragma unroll
          for (int j = 0; j < BN / 64; ++j)
            tma_load_2d(b + j * 64 * Config::kBlockBytes, map_b, full, int32_t(tile.n0) + 64 * j, k0);
        }
      } else {
        // This CTA's part of B, to both CTAs of the cluster.
        const uint16_t both = (1u << kClusterM) - 1;
        if constexpr (kLayout == LayoutB::NK) {
          tma_load_2d_multicast(b + rank * kBRowsPerCta * 128, map_b, full, k0,
                                int32_t(tile.n0) + rank * kBRowsPerCta, both);
        } else {
          constexpr int kBoxes = BN / 64 / kClusterM;
#pragma unroll
          for (int i = 0; i < kBoxes; ++i) {
            const int j = rank * kBoxes + i;
            tma_load_2d_multicast(b + j * 64 * Config::kBlockBytes, map_b, full, int32_t(tile.n0) + 64 * j, k0,
                                  both);
          }
        }
      }
      ring.advance();
    }
  }

  // The producer's last word: the next stage, once free, filled with
  // nothing but what `post(stage)` writes beside it, and its full barrier
  // completed by a plain arrival, so that consumers waiting for another
  // piece there find none (its stage then stays taken: nothing follows).
  template <typename Post>
  static __device__ __forceinline__ void signal_end(Barriers& barriers, RingPosition& ring, Post&& post) {
    mbarrier_wait(&barriers.empty[ring.stage], ring.phase ^ 1);
    post(ring.stage);
    mbarrier_arrive(&barriers.full[ring.stage]);
    ring.advance();
  }

  // One consumer warp group's K loop over one tile. `issued(kb)` runs
  // after k-block kb's wgmmas are issued, while they run (the epilogue
  // starts its source tile's loads there).
  //
  // Ping-pong consumers run their K loops in turn: a consumer waits on a
  // stage's full barrier by parity, which cannot tell its own fill from one
  // two laps earlier, so it must not wait on stages of its next tile before
  // the other consumer has waited on every stage before them.
  template <typename Issued>
  static __device__ __forceinline__ void mma_tile(StageTiles& tiles, Barriers& barriers, int consumer, int k_blocks,
                                                  RingPosition& ring, float (&acc)[kMmaM][kAccumulators],
                                                  int trace_piece, Issued&& issued) {
    const int lane = threadIdx.x % 32;
    const int row0 = Config::share_row0(consumer);
    const uint64_t a_desc = smem_descriptor(&tiles.a[0][row0 * 128], 16, 1024);
    const uint64_t b_desc = kLayout == LayoutB::NK ? smem_descriptor(tiles.b[0], 16, 1024)
                                                   : smem_descriptor(tiles.b[0], 64 * Config::kBlockBytes, 1024);
    int previous = -1;
    // kPromote: the current k-block's sums, added into acc after each block.
    [[maybe_unused]] float block_sums[kMmaM][kAccumulators];
    if constexpr (kPromote) {
#pragma unroll
      for (int mi = 0; mi < kMmaM; ++mi)
#pragma unroll
        for (int i = 0; i < kAccumulators; ++i) acc[mi][i] = block_sums[mi][i] = 0.0f;
    }
    trace::Timer loop, waited;  // the K loop, and its waits on full barriers
    loop.start();
    for (int kb = 0; kb < k_blocks; ++kb) {
      waited.start();
      mbarrier_wait(&barriers.full[ring.stage], ring.phase);
      waited.stop();
      // Descriptors by addition: the first stage's plus the offset in
      // 16-byte units (the address field never carries, as shared memory
      // ends below 256 KB). Rebuilding them from addresses cost ~45 more
      // instructions per k-block and warp, and ~1% at 4096^3 on an H200
      // (benchmarks/HISTORY.md v10).
      const uint64_t a_stage = a_desc + uint64_t(ring.stage) * (kABytes >> 4);
      const uint64_t b_stage = b_desc + uint64_t(ring.stage) * (kBBytes >> 4);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kMmasPerBlock; ++kk) {
        const uint64_t db = b_stage + uint64_t(kk) * (kLayout == LayoutB::NK ? kMmaBytes >> 4 : (16 * 128) >> 4);
#pragma unroll
        for (int mi = 0; mi < kMmaM; ++mi) {
          const uint64_t da = a_stage + uint64_t((mi * 64 * 128 + kk * kMmaBytes) >> 4);
          if constexpr (kPromote)
            Wgmma<T, BN, kTransB>::mma(block_sums[mi], da, db, kk > 0 ? 1 : 0);
          else
            Wgmma<T, BN, kTransB>::mma(acc[mi], da, db, (kb > 0 || kk > 0) ? 1 : 0);
        }
      }
      wgmma_commit();
      issued(kb);
      if constexpr (kPromote) {
        // This block's sums are in and its stage is read: add them to the
        // tile's and hand the stage back.
        wgmma_wait<0>();
#pragma unroll
        for (int mi = 0; mi < kMmaM; ++mi) {
          fence_registers(block_sums[mi]);
#pragma unroll
          for (int i = 0; i < kAccumulators; ++i) acc[mi][i] += block_sums[mi][i];
        }
        if (lane == 0) release(barriers, ring.stage);
      } else {
        // The stage before this one is now read: hand it back.
        wgmma_wait<1>();
        if (previous >= 0 && lane == 0) release(barriers, previous);
        previous = ring.stage;
      }
      ring.advance();
    }
    if (kPingPong && threadIdx.x % 128 == 0) mbarrier_arrive(&barriers.order[1 - consumer]);
    wgmma_wait<0>();
#pragma unroll
    for (int mi = 0; mi < kMmaM; ++mi) fence_registers(acc[mi]);
    loop.stop();
    if (consumer == 0 && threadIdx.x % 128 == 0) {
      trace::count(trace::Counter::FullWait, trace_piece, waited.total);
      trace::count(trace::Counter::KLoop, trace_piece, loop.total);
    }
    if (previous >= 0 && lane == 0) release(barriers, previous);
  }

  // Hands a stage back to the producers of every CTA in the cluster.
  static __device__ __forceinline__ void release(Barriers& barriers, int stage) {
    if constexpr (kClusterM == 1) {
      mbarrier_arrive(&barriers.empty[stage]);
    } else {
#pragma unroll
      for (int rank = 0; rank < kClusterM; ++rank) mbarrier_arrive_cluster(&barriers.empty[stage], rank);
    }
  }
};

}  // namespace sm90
}  // namespace fusion
