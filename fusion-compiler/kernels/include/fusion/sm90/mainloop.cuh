// The sm90 GEMM (H100, H200; built as sm_90a): a persistent,
// warp-specialized kernel on wgmma and TMA, composed of three parts:
//  - the tile scheduler (tile_scheduler.cuh; the split it walks is planned
//    on the host in split_plan.cuh): at most one CTA per SM walks output
//    tiles in grouped order, every other wave through K backwards,
//    cooperative CTAs taking whole tiles from a counter as they get to them;
//    split-K (and stream-K over a last wave of deep tiles, or where the
//    caller asks for it) share a tile's k-blocks among CTAs where the
//    tiles do not fill the SMs evenly;
//  - the collective mainloop (collective_mainloop.cuh): a producer warp
//    group keeps a ring of shared-memory stages loaded by TMA, and one or
//    two consumer warp groups multiply them with wgmma;
//  - the collective epilogue (collective_epilogue.cuh): the epilogue chain
//    on the accumulators, then C through a swizzled staging tile and TMA
//    stores; a residual or multiplier tile comes into the staging tile by
//    TMA while the K loop runs.
// Mainloop below owns the shared memory, runs the producer's and the
// consumers' loops over the scheduler's pieces, and launches the kernel;
// setmaxnreg moves registers from the producer (40) to the consumers (232).
// Before the kernel, the launcher computes a folded norm's row statistics,
// or a per-call norm's normalized A, into the caller's workspace
// (workspace.cuh, prologue.cuh), which also holds the tile counters and
// stream-K's partial tiles and flags.
//
// TMA zero-fills everything outside A and B and drops what falls outside C,
// so any M works and N and K need only be multiples of 8 (TMA's 16-byte
// stride rule; K a multiple of 16 for FP8).
//
// T is the operands' element type: f16 or bf16, or e4m3 for an FP8 GEMM
// (A [M, K] and B [N, K] e4m3, f32 accumulators, C bf16), whose tiles take
// the same bytes per stage (a k-block of 128 elements, tile_config.cuh) and
// whose K loop adds each k-block's sums into its f32 accumulators
// (collective_mainloop.cuh, kPromote) and whose epilogue chain starts with
// its scales (epilogue.cuh, Dequantize). Its tiles are not tuned yet.
//
// Clusters of two CTAs sharing B through TMA multicast (kClusterM = 2, a
// tuned entry's `cluster_m`) are correct; on an H200 they measured a little
// slower than one CTA per tile at 4096^3 and 7-17% faster at
// (1000, 3000, 1000) and (2000, 3000, 1000), where the K loop is short
// (benchmarks/HISTORY.md v21), so no shipped entry uses them and the tuner's space
// has them.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "../epilogue.cuh"
#include "../gemm.cuh"
#include "../numeric.cuh"
#include "../problem.cuh"
#include "../workspace.cuh"
#include "collective_epilogue.cuh"
#include "collective_mainloop.cuh"
#include "primitives.cuh"
#include "tensor_map.cuh"
#include "tile_config.cuh"
#include "tile_scheduler.cuh"
#include "trace.cuh"

namespace fusion {
namespace sm90 {

template <typename T, LayoutB kLayout_, typename Config_>
struct Mainloop {
  using Element = T;
  static constexpr LayoutB kLayout = kLayout_;
  using Config = Config_;
  using Scheduler = TileScheduler<T, Config>;
  using Loop = CollectiveMainloop<T, kLayout, Config>;
  static constexpr int BM = Config::BM, BN = Config::BN, BK = Config::BK;
  static constexpr int kStages = Config::kStages;
  static constexpr int kGroupRows = Config::kGroupRows;
  static constexpr int kClusterM = Config::kClusterM;
  static constexpr int kThreads = 128 * (1 + Config::kConsumers);
  static constexpr int kMinBlocksPerSm = 1;
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  // gemm.cuh's FusedGemm hands the launch to this mainloop.
  static constexpr bool kOwnsKernel = true;

  // A CTA's dynamic shared memory, whose sizeof is what the launch asks
  // for: the ring's stages, the epilogue's staging tile (kStagingParts 1:
  // each consumer's whole share of C; 2: half of its columns at a time),
  // the ring's barriers and the scheduler's piece list, laid out from the
  // first 1024-byte aligned address of the buffer (see carve), which
  // dynamic shared memory is not promised to start at; hence the slack.
  template <int kStagingParts_>
  struct SharedStorageWith {
    struct Layout {
      typename Loop::StageTiles stages;
      typename CollectiveEpilogue<T, Config, kStagingParts_>::Staging staging;
      typename Loop::Barriers barriers;
      typename Scheduler::Plan plan;
    } layout;
    unsigned char alignment_slack[1024];
  };
  // The whole staging tile where it fits beside the rest, else half of it.
  static constexpr int kStagingParts = sizeof(SharedStorageWith<1>) <= kSmemPerBlock ? 1 : 2;
  using TileStore = CollectiveEpilogue<T, Config, kStagingParts>;
  using SharedStorage = SharedStorageWith<kStagingParts>;
  // Whether the epilogue chain can run on this tile config (FusedGemm
  // asserts it, naming the tuned entry): one that reads a source tile needs
  // the whole staging tile.
  template <typename Epilogue>
  static constexpr bool epilogue_fits() {
    return TileStore::template fits<Epilogue>();
  }
  using SharedLayout = typename SharedStorage::Layout;
  static constexpr int kSmemBytes = int(sizeof(SharedStorage));
  static_assert(kSmemBytes <= kSmemPerBlock, "the tile needs more shared memory than an sm_90 block may have");

  using StreamK = typename Scheduler::StreamK;
  using TileWalk = typename Scheduler::TileWalk;
  using WorkPiece = typename Scheduler::WorkPiece;
  using Piece = typename Scheduler::Piece;
  using RingPosition = typename Loop::RingPosition;

  // The layout at the first 1024-byte aligned address of the buffer.
  static __device__ __forceinline__ SharedLayout& carve(unsigned char* raw) {
    const uint32_t base = smem_u32(raw);
    return *reinterpret_cast<SharedLayout*>(raw + ((1024 - (base & 1023)) & 1023));
  }

  // The producer: one thread walks this CTA's pieces (Scheduler::Walker;
  // `tile_counters` null: the static walk) and keeps every stage loaded,
  // across tiles. For cooperative consumers it posts each piece beside its
  // first stage and, after the last, an end (Plan::posted).
  static __device__ __forceinline__ void produce(SharedLayout& s, const CUtensorMap* map_a, const CUtensorMap* map_b,
                                                 const GemmArgs<T>& args, uint32_t* tile_counters) {
    const TileWalk walk(args);
    const int k_blocks = int((args.k + BK - 1) / BK);
    RingPosition ring;
    typename Scheduler::Walker walker(s.plan, walk, k_blocks, tile_counters);
    WorkPiece w;
    bool backwards = false;
    for (int i = 0; walker.next(w, backwards); ++i) {
      const TileCoord tile = walk.tile(w.unit);
      trace::Timer waited;
      Loop::load_tile(s.stages, s.barriers, ring, map_a, map_b, tile, walk.rank, w.k_begin, w.k_count, backwards,
                      waited, [&s, &w](int stage) {
                        if constexpr (!Config::kPingPong) s.plan.posted[stage] = w;
                      });
      trace::count(trace::Counter::EmptyWait, i, waited.total);
    }
    if constexpr (!Config::kPingPong)
      Loop::signal_end(s.barriers, ring, [&s](int stage) { s.plan.posted[stage] = Scheduler::kNoMorePieces; });
  }

  // The piece the producer posted beside the ring's next stage, once that
  // stage is full (Plan::posted). Every lane waits on the barrier and reads
  // it, an address the same for all of them, which keeps the piece (and
  // the K loop's bounds and ring positions after it) in uniform registers
  // (with a shuffle from lane 0 instead, ptxas moved the K loop's ring
  // positions and descriptors into ordinary registers). The warp then
  // syncs, so that every lane's read comes before lane 0 releases a stage
  // (its arrival on the empty barrier, which the producer waits on before
  // it posts in that stage again): without it the order rested on the
  // read's value steering the loop, and compute-sanitizer's racecheck
  // reported the producer's next post there as a race once a CTA's pieces
  // wrap the ring (stream-K, benchmarks/HISTORY.md v21).
  static __device__ __forceinline__ WorkPiece posted_piece(SharedLayout& s, const RingPosition& ring) {
    mbarrier_wait(&s.barriers.full[ring.stage], ring.phase);
    const WorkPiece w = s.plan.posted[ring.stage];
    __syncwarp();
    return w;
  }

  // With a source tile (EpilogueChain::kSourceTile), each tile (each share
  // of a split tile) has its source tile loaded once the K loop has issued
  // its second k-block (its first when it has one): by then the previous
  // tile's stores, issued just before the K loop, have had a k-block's
  // wgmmas to read the staging tile, so the wait for them costs nothing.
  template <typename Prologue, typename Epilogue>
  static __device__ __forceinline__ void consume(SharedLayout& s, int consumer, const CUtensorMap* map_c,
                                                 const CUtensorMap* map_src, const GemmArgs<T>& args,
                                                 const StreamK& sk) {
    const TileWalk walk(args);
    const int k_blocks = int((args.k + BK - 1) / BK);
    RingPosition ring;
    float acc[Config::kMmaM][Config::kAccumulators];
    uint32_t source_phase = 0;  // of s.staging.source_full[consumer]
    const auto load_source_at = [&](TileCoord tile, int k_count) {
      const int issue_kb = k_count > 1 ? 1 : 0;
      return [&s, &args, map_src, consumer, tile, issue_kb](int kb) {
        if constexpr (Epilogue::kSourceTile) {
          if (kb == issue_kb && threadIdx.x % 128 == 0)
            TileStore::load_source(s.staging, consumer, tile, map_src, args.m, args.n);
        }
      };
    };
    if constexpr (Config::kPingPong) {
      // Each consumer takes every other unit of this CTA, skipping the other
      // consumer's stages in the ring (no stream-K).
      if (consumer == 1) ring.skip(k_blocks);
      uint32_t turn = 0;  // K loops this consumer has run
      for (int64_t u = walk.first + consumer * walk.stride; u < walk.units; u += 2 * walk.stride) {
        // Consumer 0's first K loop goes first; every other waits for the
        // other consumer's previous one (see mma_tile).
        if (consumer == 1 || turn > 0)
          mbarrier_wait(&s.barriers.order[consumer], consumer == 1 ? (turn & 1) : ((turn - 1) & 1));
        ++turn;
        const TileCoord tile = walk.tile(u);
        Loop::mma_tile(s.stages, s.barriers, consumer, k_blocks, ring, acc, 0, load_source_at(tile, k_blocks));
        if constexpr (Prologue::kRowStats) grid_dependency_wait();
        TileStore::template store_tile<Epilogue>(s.staging, consumer, tile, acc, map_c, args, source_phase);
        source_phase ^= 1;
        ring.skip(k_blocks);
      }
    } else {
      [[maybe_unused]] const bool tracer = consumer == 0 && threadIdx.x % 128 == 0;
      for (int i = 0;; ++i) {
        const WorkPiece w = posted_piece(s, ring);
        if (w.k_count == 0) break;
        if (tracer) FUSION_SM90_STAMP(i, 0);
        const TileCoord tile = walk.tile(w.unit);
        // Which CTA sums a split tile is known only once its share is in
        // (fix_up), so every share loads the source tile; one that does not
        // finish the tile waits for it all the same, keeping the barrier's
        // phases in step.
        Loop::mma_tile(s.stages, s.barriers, consumer, w.k_count, ring, acc, i,
                       load_source_at(tile, w.k_count));
        if (tracer) FUSION_SM90_STAMP(i, 1);
        // A split tile's epilogue runs on whichever of its CTAs arrives last.
        if (w.piece == Piece::Whole || Scheduler::fix_up(sk, consumer, w.unit, k_blocks, acc)) {
          if constexpr (Prologue::kRowStats) grid_dependency_wait();
          TileStore::template store_tile<Epilogue>(s.staging, consumer, tile, acc, map_c, args, source_phase, i);
        } else if constexpr (Epilogue::kSourceTile) {
          mbarrier_wait(&s.staging.source_full[consumer], source_phase);
        }
        source_phase ^= 1;
        if (tracer) FUSION_SM90_STAMP(i, 4);
      }
    }
    // Shared memory must outlive the last stores' reads of it.
    if (threadIdx.x % 128 == 0) bulk_wait_read();
  }

  // Host side: the tensor maps of A, B and C for one launch, and of the
  // epilogue's source tile (zeros when it reads none).
  template <typename Epilogue>
  static cudaError_t encode_maps(const GemmArgs<T>& p, CUtensorMap* map_a, CUtensorMap* map_b, CUtensorMap* map_c,
                                 CUtensorMap* map_src);
  // A launch's grid (units for clusters, capped at launch by what is
  // resident), its stream-K split (units 0: none), whether its CTAs take
  // whole tiles from the workspace's counter (Scheduler::Walker) and its
  // workspace.
  struct LaunchPlan {
    int64_t grid = 0;
    StreamK stream_k;
    bool tile_counters = false;
    WorkspaceLayout layout;
  };
  template <typename Prologue, typename Epilogue>
  static LaunchPlan plan_launch(const GemmArgs<T>& p, uint32_t flags, int device);
  template <typename Prologue, typename Epilogue>
  static cudaError_t workspace_layout(const GemmArgs<T>& p, uint32_t flags, WorkspaceLayout* layout);
  template <typename Prologue, typename Epilogue>
  static cudaError_t launch(const GemmArgs<T>& p, const Workspace& workspace, cudaStream_t stream);
  template <typename Prologue, typename Epilogue>
  static cudaError_t launch_gemm(const GemmArgs<T>& p, const LaunchPlan& plan, uint32_t* tile_counters, int device,
                                 cudaStream_t stream);
};

template <typename ML, typename Prologue, typename Epilogue>
__global__ void __launch_bounds__(ML::kThreads, 1)
    persistent_gemm_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                           const __grid_constant__ CUtensorMap map_c, const __grid_constant__ CUtensorMap map_src,
                           const GemmArgs<typename ML::Element> args,
                           const typename ML::StreamK stream_k, uint32_t* const tile_counters) {
#if FUSION_SM90_ENABLED
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  typename ML::SharedLayout& s = ML::carve(smem_raw);
  const int group = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    FUSION_SM90_STAMP_START();
    prefetch_tensor_map(&map_a);
    prefetch_tensor_map(&map_b);
    prefetch_tensor_map(&map_c);
    if constexpr (Epilogue::kSourceTile) {
      prefetch_tensor_map(&map_src);
      ML::TileStore::init_source_barriers(s.staging);
    }
    for (int i = 0; i < ML::kStages; ++i) {
      mbarrier_init(&s.barriers.full[i], 1);
      mbarrier_init(&s.barriers.empty[i], ML::Loop::kReadersPerStage);
    }
    mbarrier_init(&s.barriers.order[0], 1);
    mbarrier_init(&s.barriers.order[1], 1);
    fence_barrier_init();
    ML::Scheduler::plan_pieces(s.plan, typename ML::TileWalk(args), int((args.k + ML::BK - 1) / ML::BK), stream_k);
  }
  // The cluster's other CTA multicasts into this one's stages and arrives on
  // its barriers: both must be initialised first.
  if constexpr (ML::kClusterM > 1)
    cluster_sync();
  else
    __syncthreads();
  if (group == 0) {
    setmaxnreg_dec<ML::kProducerRegisters>();
    if (threadIdx.x == 0) ML::produce(s, &map_a, &map_b, args, tile_counters);
  } else {
    setmaxnreg_inc<ML::kConsumerRegisters>();
    // The same in every lane, said so (a shuffle from lane 0) that what
    // derives from it can live in uniform registers.
    const int consumer = __shfl_sync(0xffffffffu, group - 1, 0);
    ML::template consume<Prologue, Epilogue>(s, consumer, &map_c, &map_src, args, stream_k);
  }
  // ... and may still arrive on this CTA's barriers until it is done.
  if constexpr (ML::kClusterM > 1) cluster_sync();
#endif
}

template <typename T, LayoutB kLayout, typename Config>
template <typename Epilogue>
cudaError_t Mainloop<T, kLayout, Config>::encode_maps(const GemmArgs<T>& p, CUtensorMap* map_a, CUtensorMap* map_b,
                                                      CUtensorMap* map_c, CUtensorMap* map_src) {
  cudaError_t err = detail::encode_matrix(map_a, p.a, p.m, p.k, BM, p.k);
  if (err != cudaSuccess) return err;
  // C's and the source's boxes are those of the staging tile.
  constexpr uint32_t kCBoxBytes = TileStore::template c_box_cols<Epilogue>() * sizeof(OutputOf<T>);
  err = detail::encode_matrix(map_c, p.c, p.m, p.n / Epilogue::kGemmColsPerOutput, 64,
                              p.n / Epilogue::kGemmColsPerOutput, kCBoxBytes);
  if (err != cudaSuccess) return err;
  // The source tile is read in C's boxes, into C's staging tile.
  *map_src = CUtensorMap{};
  if constexpr (Epilogue::kSourceTile) {
    err = detail::encode_matrix(map_src, static_cast<const OutputOf<T>*>(Epilogue::source(p.epilogue)), p.m, p.n,
                                64, p.n, kCBoxBytes);
    if (err != cudaSuccess) return err;
  }
  if constexpr (kLayout == LayoutB::NK)
    return detail::encode_matrix(map_b, p.b, p.n, p.k, Loop::kBRowsPerCta, p.ldb);
  else
    return detail::encode_matrix(map_b, p.b, p.k, p.n, BK, p.ldb);
}

// The grid and stream-K split of a launch for p with `flags` on `device`,
// and the workspace they need (workspace.cuh): the partial tiles of a
// split, room for kStreamKFlagBytes of flags (the tile counters' and a
// split's), with a folded norm the
// statistics of every row of A, and what prepare_operands writes (gemm.cuh:
// a per-call norm's normalized A, a gated GEMM's interleaved B). What
// workspace_layout reports and what launch uses, so that the caller's bytes
// and the launch agree.
template <typename T, LayoutB kLayout, typename Config>
template <typename Prologue, typename Epilogue>
typename Mainloop<T, kLayout, Config>::LaunchPlan Mainloop<T, kLayout, Config>::plan_launch(const GemmArgs<T>& p,
                                                                                            uint32_t flags,
                                                                                            int device) {
  LaunchPlan plan;
  const size_t row_stat_bytes = Prologue::kRowStats ? row_stats_bytes(p.m) : 0;
  size_t partial_bytes = 0;
  // At most one CTA per SM (one cluster per pair of SMs that can hold one
  // at once, decided at launch) and per unit of work; without stream-K,
  // balanced_grid.
  const int64_t units_m = (p.m + BM * kClusterM - 1) / (BM * kClusterM);
  const int64_t units = units_m * ((p.n + BN - 1) / BN);
  if constexpr (kClusterM == 1) {
    const int64_t ctas = fusion::detail::sm_count(device);
    plan.grid = balanced_grid(units, ctas);
    if ((flags & FUSION_GEMM_NO_STREAM_K) == 0) {
      int64_t split_grid = plan.grid;
      const StreamK sk = plan_stream_k<Config>(units, units_m, (p.k + BK - 1) / BK, ctas,
                                               (flags & FUSION_GEMM_STREAM_K_TAIL) != 0,
                                               (flags & FUSION_GEMM_STREAM_K_FILL) != 0, &split_grid);
      if (sk.units > 0) {
        plan.stream_k = sk;
        plan.grid = split_grid;
        partial_bytes = Scheduler::partial_bytes(sk, split_grid, (p.k + BK - 1) / BK);
      }
    }
  } else {
    plan.grid = units;
  }
  plan.tile_counters = Scheduler::kDynamicTiles && (flags & FUSION_GEMM_STATIC_TILES) == 0;
  plan.layout = WorkspaceLayout::of(partial_bytes, row_stat_bytes, normalized_bytes_of<Prologue>(p),
                                    interleaved_bytes_of<Epilogue>(p), plan.tile_counters);
  return plan;
}

template <typename T, LayoutB kLayout, typename Config>
template <typename Prologue, typename Epilogue>
cudaError_t Mainloop<T, kLayout, Config>::workspace_layout(const GemmArgs<T>& p, uint32_t flags,
                                                          WorkspaceLayout* layout) {
  int device = 0;
  const cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  *layout = plan_launch<Prologue, Epilogue>(p, flags, device).layout;
  return cudaSuccess;
}

// With a folded norm: first the statistics of A's rows, into the
// workspace, then the GEMM, whose epilogue reads them. With a per-call
// norm: A's rows normalized into the workspace, then the plain GEMM on
// them; with a gated GEMM's two weights, B interleaved there first. A
// workspace too small for the split the shape would get runs every tile
// whole, and one too small for the tile counters walks the tiles
// statically; one too small for the rest is refused.
template <typename T, LayoutB kLayout, typename Config>
template <typename Prologue, typename Epilogue>
cudaError_t Mainloop<T, kLayout, Config>::launch(const GemmArgs<T>& p, const Workspace& workspace,
                                                 cudaStream_t stream) {
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  LaunchPlan plan = plan_launch<Prologue, Epilogue>(p, workspace.flags, device);
  if (!workspace.holds(plan.layout) && plan.stream_k.units > 0)
    plan = plan_launch<Prologue, Epilogue>(p, workspace.flags | FUSION_GEMM_NO_STREAM_K, device);
  if (!workspace.holds(plan.layout) && plan.tile_counters)
    plan = plan_launch<Prologue, Epilogue>(p, workspace.flags | FUSION_GEMM_NO_STREAM_K | FUSION_GEMM_STATIC_TILES,
                                           device);
  if (!workspace.holds(plan.layout)) return cudaErrorInvalidValue;
  if (plan.stream_k.units > 0) {
    plan.stream_k.flags = workspace.at<uint32_t>(kTileCounterBytes);
    plan.stream_k.partials = workspace.at<float>(plan.layout.partials);
  }
  uint32_t* const tile_counters = plan.tile_counters ? workspace.at<uint32_t>(0) : nullptr;
  GemmArgs<T> args;
  err = prepare_operands<Prologue, Epilogue, kLayout>(p, workspace, plan.layout, stream, &args);
  if (err != cudaSuccess) return err;
  err = prepare_row_stats<Prologue>(p, workspace, plan.layout, stream, &args);
  if (err != cudaSuccess) return err;
  return launch_gemm<PreparedPrologue<Prologue>, Epilogue>(args, plan, tile_counters, device, stream);
}

template <typename T, LayoutB kLayout, typename Config>
template <typename Prologue, typename Epilogue>
cudaError_t Mainloop<T, kLayout, Config>::launch_gemm(const GemmArgs<T>& p, const LaunchPlan& plan,
                                                      uint32_t* tile_counters, int device, cudaStream_t stream) {
  using Self = Mainloop<T, kLayout, Config>;
  cudaError_t err = fusion::detail::raise_smem_limit(persistent_gemm_kernel<Self, Prologue, Epilogue>, kSmemBytes);
  if (err != cudaSuccess) return err;
  CUtensorMap map_a, map_b, map_c, map_src;
  err = encode_maps<Epilogue>(p, &map_a, &map_b, &map_c, &map_src);
  if (err != cudaSuccess) return err;
  const StreamK& sk = plan.stream_k;
  if constexpr (kClusterM == 1 && !Prologue::kRowStats) {
    persistent_gemm_kernel<Self, Prologue, Epilogue>
        <<<unsigned(plan.grid), kThreads, kSmemBytes, stream>>>(map_a, map_b, map_c, map_src, p, sk, tile_counters);
  } else {
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(unsigned(plan.grid));
    config.blockDim = dim3(kThreads);
    config.dynamicSmemBytes = kSmemBytes;
    config.stream = stream;
    cudaLaunchAttribute attrs[2]{};
    config.attrs = attrs;
    if constexpr (kClusterM > 1) {
      attrs[config.numAttrs].id = cudaLaunchAttributeClusterDimension;
      attrs[config.numAttrs].val.clusterDim.x = kClusterM;
      attrs[config.numAttrs].val.clusterDim.y = 1;
      attrs[config.numAttrs].val.clusterDim.z = 1;
      ++config.numAttrs;
      // Clusters must fit inside a GPC, so fewer than SMs / kClusterM may be
      // resident at once; a persistent grid larger than that would run its
      // last clusters after the others finish.
      int resident = 0;
      config.gridDim = dim3(unsigned(fusion::detail::sm_count(device)));
      err = cudaOccupancyMaxActiveClusters(&resident, persistent_gemm_kernel<Self, Prologue, Epilogue>, &config);
      if (err != cudaSuccess) return err;
      if (resident <= 0) return cudaErrorInvalidConfiguration;
      config.gridDim = dim3(unsigned((plan.grid < resident ? plan.grid : resident) * kClusterM));
    }
    if constexpr (Prologue::kRowStats) {
      // Launched as the row statistics' programmatic dependent: its CTAs
      // start while the statistics pass runs and wait for it
      // (grid_dependency_wait) only before their first epilogue, the
      // statistics' one reader.
      attrs[config.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attrs[config.numAttrs].val.programmaticStreamSerializationAllowed = 1;
      ++config.numAttrs;
    }
    err = cudaLaunchKernelEx(&config, persistent_gemm_kernel<Self, Prologue, Epilogue>, map_a, map_b, map_c, map_src,
                             p, sk, tile_counters);
    if (err != cudaSuccess) return err;
  }
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace fusion