// The sm80 mainloop (A100, RTX 30xx/40xx, L4; also runs on sm_90): tensor
// cores through mma.sync.m16n8k16, fragments through ldmatrix, a multi-stage
// cp.async pipeline and XOR-swizzled shared memory.
//
// A CTA computes a BM x BN tile of C with (BM/WM) x (BN/WN) warps, each owning
// a WM x WN sub-tile held in registers as (WM/16) x (WN/8) m16n8 accumulator
// fragments. K advances BK at a time through `Stages` shared-memory buffers:
// while the tensor cores work on tile kt, the copies of tiles kt+1 ..
// kt+Stages-1 are in flight. Loads are 16 bytes per thread and predicated:
// chunks outside A or B are zero-filled, so any M works; N and K must be
// multiples of 8 so that a 16-byte chunk is wholly inside or outside.
//
// Its instructions (swizzle, cp.async, ldmatrix, mma) are in primitives.cuh;
// what happens to the accumulators after the K loop, in
// collective_epilogue.cuh.
#pragma once

#include <stdint.h>

#include "../numeric.cuh"
#include "../problem.cuh"
#include "../warp_tiled.cuh"
#include "collective_epilogue.cuh"
#include "primitives.cuh"

namespace fusion {
namespace sm80 {

// How the K loop feeds the tensor cores.
//  - PerStage: after each stage's barrier, every k16 step loads its A and B
//    fragments and then issues its mma's; the first ldmatrix of a stage waits
//    for the barrier and the first mma for that ldmatrix.
//  - Pipelined: fragments are double-buffered in registers. The ldmatrix of
//    k16 step s+1 is issued before the mma's of step s, and the stage barrier
//    sits inside the last k16 step of a stage, before its mma's, so the
//    tensor cores work through the barrier and the next stage's first loads.
//    Costs 2 x (WM/16*4 + WN/8*2) fragment registers instead of 1 x.
enum class KLoop { PerStage, Pipelined };

// How the accumulators reach C.
//  - Direct: each thread applies the epilogue chain to a pair of columns and
//    stores those 4 bytes, fragment by fragment. The chain's loads (bias[n])
//    come after earlier stores to C that might alias them, so every pair
//    reloads its operands, and each warp store writes 8 rows x 16 bytes.
//  - Staged: after the K loop the chain runs on every fragment in registers
//    (no global store in between, so its loads are issued together and
//    reused across rows); the results go to the now idle pipeline buffers
//    (rows padded by 16 bytes: conflict-free fragment writes), and C is
//    written from there with 16-byte stores, a warp covering whole rows.
enum class Store { Direct, Staged };

// A CTA tile shape. The defaults below were chosen from the public
// Ampere-class results (128x128 and 128x256 CTA tiles, 64x64 warp tiles, 3-4
// stages reach cuBLAS on A100 and RTX 4090); the code generator's tuned
// configs replace them per device. Shared memory is Stages * (BM + BN) * BK
// * 2 bytes; configs above 99 KB run only where the device allows it (sm_80
// and sm_90: up to 163 and 227 KB per CTA; sm_86/89: 99 KB).
//
// The knobs after KLoop are tuning candidates with defaults that keep the
// measured v1/v2 behaviour: kStore (above); kGroupRows, the tile rows per
// group of the grouped launch order (gemm.cuh); kL2PrefetchBytes, 0 or the
// L2 prefetch size (64, 128 or 256) that the pipelined loop's cp.async
// requests with each global read.
template <int BM_, int BN_, int BK_, int WM_, int WN_, int kStages_, int kMinBlocksPerSm_,
          KLoop kKLoop_ = KLoop::PerStage, Store kStore_ = Store::Direct, int kGroupRows_ = 8,
          int kL2PrefetchBytes_ = 0>
struct TileConfig : WarpTiledRules<BM_, BN_, BK_, WM_, WN_, kMinBlocksPerSm_> {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_;
  static constexpr int kStages = kStages_;
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  static constexpr KLoop kKLoop = kKLoop_;
  static constexpr Store kStore = kStore_;
  static constexpr int kGroupRows = kGroupRows_;
  static constexpr int kL2PrefetchBytes = kL2PrefetchBytes_;
  using Rules = WarpTiledRules<BM_, BN_, BK_, WM_, WN_, kMinBlocksPerSm_>;
  static constexpr bool kStagesOk = kStages >= 2;
  static_assert(kStagesOk, "the pipeline needs at least two stages");
  static constexpr bool kKLoopOk = kKLoop != KLoop::Pipelined || (BK / 16) % 2 == 0;
  static_assert(kKLoopOk,
                "the pipelined K loop alternates two fragment buffers over an even number of k16 steps per stage");
  static constexpr bool kGroupRowsOk = kGroupRows >= 1;
  static_assert(kGroupRowsOk, "a tile group has at least one tile row");
  static constexpr bool kPrefetchOk =
      kL2PrefetchBytes == 0 || kL2PrefetchBytes == 64 || kL2PrefetchBytes == 128 || kL2PrefetchBytes == 256;
  static_assert(kPrefetchOk, "cp.async prefetches 64, 128 or 256 bytes into L2");
  static constexpr bool kValid = Rules::kValid && kStagesOk && kKLoopOk && kGroupRowsOk && kPrefetchOk;
};

// 8 warps of 64x64: 128 f32 accumulators per thread (ptxas, sm_90a: 227-236
// registers, no spills), 96 KB of shared memory, one CTA per SM.
using Tile128x256 = TileConfig<128, 256, 32, 64, 64, 4, 1>;
// 8 warps of 64x32, for grids that a 128x256 tile would leave short of SMs.
// Two CTAs per SM: capped at 128 registers (ptxas, sm_90a: 128, no spills)
// and 2 x 64 KB of shared memory.
using Tile128x128 = TileConfig<128, 128, 32, 64, 32, 4, 2>;

// Shared memory a block may have on every GPU the sm80 variant runs on:
// 99 KB on sm_86 and sm_89 (sm_80 allows 163 KB).
constexpr int kSmemPerBlock = 99 * 1024;

// Whether `Tile` is one this mainloop takes for B stored as `kLayout`: its
// own rules, and swizzled rows for A's and B's shared-memory tiles.
template <LayoutB kLayout, typename Tile>
constexpr bool tile_valid = Tile::kValid && swizzle_fits(Tile::BK) &&
                            swizzle_fits(kLayout == LayoutB::KN ? Tile::BN : Tile::BK);

template <typename T, LayoutB kLayoutB, typename Tile>
struct Mainloop {
  using Element = T;
  static constexpr LayoutB kLayout = kLayoutB;
  using Config = Tile;
  static constexpr int BM = Tile::BM, BN = Tile::BN, BK = Tile::BK, WM = Tile::WM, WN = Tile::WN;
  static constexpr int kStages = Tile::kStages, kThreads = Tile::kThreads;
  static constexpr int kMinBlocksPerSm = Tile::kMinBlocksPerSm;
  static constexpr int kGroupRows = Tile::kGroupRows;  // read by fused_gemm_kernel
  static constexpr int kFragsM = WM / 16, kFragsN = WN / 8;

  // Shared-memory tiles per stage: A is [BM][BK]; B is [BK][BN] for KN and
  // [BN][BK] for NK, i.e. always stored the way it lies in device memory.
  static constexpr bool kBIsKN = kLayoutB == LayoutB::KN;
  static constexpr int kBRows = kBIsKN ? BK : BN, kBCols = kBIsKN ? BN : BK;
  using SwizzleA = Swizzle<BK>;
  using SwizzleB = Swizzle<kBCols>;
  static constexpr int kAStageElems = BM * BK, kBStageElems = BN * BK;
  static constexpr int kAChunksPerThread = kAStageElems / 8 / kThreads;
  static constexpr int kBChunksPerThread = kBStageElems / 8 / kThreads;
  static constexpr size_t kSmemBytes = size_t(kStages) * (kAStageElems + kBStageElems) * sizeof(T);

  struct Accumulators {
    float c[kFragsM][kFragsN][4];

    __device__ __forceinline__ void zero() {
#pragma unroll
      for (int i = 0; i < kFragsM; ++i)
#pragma unroll
        for (int j = 0; j < kFragsN; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) c[i][j][e] = 0.0f;
    }
  };

  // Issues the copies of K tile `kt` into stage buffers (sa, sb).
  static __device__ __forceinline__ void load_stage(const GemmArgs<T>& p, TileCoord tile, int kt, T* sa, T* sb) {
    const int64_t k0 = int64_t(kt) * BK;
#pragma unroll
    for (int i = 0; i < kAChunksPerThread; ++i) {
      const int chunk_id = threadIdx.x + i * kThreads;
      const int row = chunk_id / SwizzleA::kChunks, chunk = chunk_id % SwizzleA::kChunks;
      const int64_t m = tile.m0 + row, k = k0 + chunk * 8;
      const bool valid = m < p.m && k < p.k;
      cp_async16(sa + SwizzleA::offset(row, chunk), valid ? p.a + m * p.k + k : p.a, valid);
    }
#pragma unroll
    for (int i = 0; i < kBChunksPerThread; ++i) {
      const int chunk_id = threadIdx.x + i * kThreads;
      const int row = chunk_id / SwizzleB::kChunks, chunk = chunk_id % SwizzleB::kChunks;
      if constexpr (kBIsKN) {
        const int64_t k = k0 + row, n = tile.n0 + chunk * 8;
        const bool valid = k < p.k && n < p.n;
        cp_async16(sb + SwizzleB::offset(row, chunk), valid ? p.b + k * p.ldb + n : p.b, valid);
      } else {
        const int64_t n = tile.n0 + row, k = k0 + chunk * 8;
        const bool valid = n < p.n && k < p.k;
        cp_async16(sb + SwizzleB::offset(row, chunk), valid ? p.b + n * p.ldb + k : p.b, valid);
      }
    }
  }

  // The copies of the pipelined K loop, with the per-thread address work
  // done once: each thread owns the same chunk column of rows row0, row0 +
  // step, ... of each operand tile, so one 64-bit pointer per operand, which
  // advances by a K tile, and a bit mask of in-bounds rows replace load_stage's
  // per-chunk 64-bit index arithmetic (and the registers it holds); the
  // row strides come from the kernel parameters, which need no registers.
  struct Loader {
    static constexpr int kAChunksPerRow = BK / 8;
    static constexpr int kBChunksPerRow = kBCols / 8;
    static constexpr int kARowStep = kThreads / kAChunksPerRow;
    static constexpr int kBRowStep = kThreads / kBChunksPerRow;
    static_assert(kThreads % kAChunksPerRow == 0 && kThreads % kBChunksPerRow == 0 && kARowStep % 8 == 0 &&
                      kBRowStep % 8 == 0,
                  "a thread's chunks must sit in one swizzle column, 8-row multiples apart");
    const T* a;  // this thread's first A chunk of the next K tile
    const T* b;  // the same for B
    uint32_t a_rows_in, b_rows_in;       // bit i: chunk i's row (A: m; B NK: n) or column (B KN: n) is inside
    int a_k, b_k;                        // K index of this thread's chunk (B KN: of its first row) in the next tile
    uint32_t a_dst, b_dst;               // element offsets in a stage buffer

    __device__ __forceinline__ Loader(const GemmArgs<T>& p, TileCoord tile) {
      const int a_row = threadIdx.x / kAChunksPerRow, a_chunk = threadIdx.x % kAChunksPerRow;
      const int b_row = threadIdx.x / kBChunksPerRow, b_chunk = threadIdx.x % kBChunksPerRow;
      a = p.a + (tile.m0 + a_row) * p.k + a_chunk * 8;
      a_k = a_chunk * 8;
      a_dst = uint32_t(SwizzleA::offset(a_row, a_chunk));
      a_rows_in = 0;
#pragma unroll
      for (int i = 0; i < kAChunksPerThread; ++i)
        a_rows_in |= uint32_t(tile.m0 + a_row + i * kARowStep < p.m) << i;
      b_dst = uint32_t(SwizzleB::offset(b_row, b_chunk));
      b_rows_in = 0;
      if constexpr (kBIsKN) {
        const int64_t n = tile.n0 + b_chunk * 8;
        b = p.b + int64_t(b_row) * p.ldb + n;
        b_k = b_row;
        b_rows_in = n < p.n ? ~0u : 0u;
      } else {
        b = p.b + (tile.n0 + b_row) * p.ldb + b_chunk * 8;
        b_k = b_chunk * 8;
#pragma unroll
        for (int i = 0; i < kBChunksPerThread; ++i)
          b_rows_in |= uint32_t(tile.n0 + b_row + i * kBRowStep < p.n) << i;
      }
    }

    // Issues the copies of the next K tile into stage buffers (sa, sb) and
    // moves on to the tile after it.
    __device__ __forceinline__ void load(const GemmArgs<T>& p, T* sa, T* sb) {
      const bool a_k_in = a_k < p.k;
#pragma unroll
      for (int i = 0; i < kAChunksPerThread; ++i) {
        const bool valid = a_k_in && ((a_rows_in >> i) & 1u);
        cp_async16_prefetch<Tile::kL2PrefetchBytes>(sa + a_dst + i * kARowStep * BK,
                                                    valid ? a + int64_t(i * kARowStep) * p.k : p.a, valid);
      }
#pragma unroll
      for (int i = 0; i < kBChunksPerThread; ++i) {
        bool valid;
        if constexpr (kBIsKN)
          valid = b_rows_in != 0 && b_k + i * kBRowStep < p.k;
        else
          valid = b_k < p.k && ((b_rows_in >> i) & 1u);
        cp_async16_prefetch<Tile::kL2PrefetchBytes>(
            sb + b_dst + i * kBRowStep * kBCols, valid ? b + int64_t(i * kBRowStep) * p.ldb : p.b,
            valid);
      }
      a += BK;
      a_k += BK;
      if constexpr (kBIsKN)
        b += int64_t(BK) * p.ldb;
      else
        b += BK;
      b_k += BK;
    }
  };

  // The A and B fragments of one k16 step for this warp's WM x WN sub-tile.
  struct Fragments {
    uint32_t a[kFragsM][4];
    uint32_t b[kFragsN][2];
  };
  static constexpr int kSteps = BK / 16;

  // Loads k16 step `ks` of the stage held in shared memory at byte
  // addresses (sa, sb) into `f`. 32-bit shared addresses rather than generic
  // pointers: half the registers per address, which the pipelined K loop
  // needs to stay under 255 with two fragment buffers live.
  static __device__ __forceinline__ void load_fragments(Fragments& f, uint32_t sa, uint32_t sb, int ks, int warp_m,
                                                        int warp_n) {
    const int lane = threadIdx.x & 31;
    // A, row-major 16x16 per fragment: lanes 0-15 address rows 0-15 of the
    // low 8 columns, lanes 16-31 the same rows of the high 8 columns.
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
      const int row = warp_m * WM + i * 16 + (lane & 15);
      ldmatrix_x4(f.a[i], sa + uint32_t(SwizzleA::offset(row, ks * 2 + (lane >> 4)) * sizeof(T)));
    }
    // B, two n8 fragments per ldmatrix.x4; matrices in the order
    // (n0-7,k0-7), (n0-7,k8-15), (n8-15,k0-7), (n8-15,k8-15).
#pragma unroll
    for (int j = 0; j < kFragsN; j += 2) {
      uint32_t r[4];
      if constexpr (kBIsKN) {
        const int k_row = ks * 16 + (lane & 15);
        ldmatrix_x4_trans(
            r, sb + uint32_t(SwizzleB::offset(k_row, (warp_n * WN + j * 8) / 8 + (lane >> 4)) * sizeof(T)));
      } else {
        const int n_row = warp_n * WN + j * 8 + (lane & 7) + ((lane >> 4) << 3);
        ldmatrix_x4(r, sb + uint32_t(SwizzleB::offset(n_row, ks * 2 + ((lane >> 3) & 1)) * sizeof(T)));
      }
      f.b[j][0] = r[0];
      f.b[j][1] = r[1];
      f.b[j + 1][0] = r[2];
      f.b[j + 1][1] = r[3];
    }
  }

  // acc += the WM x WN x 16 product held in `f`. The n index runs back and
  // forth, so that the mma's on either side of a row change share their B
  // operand registers.
  static __device__ __forceinline__ void mma_fragments(Accumulators& acc, const Fragments& f) {
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
      for (int jj = 0; jj < kFragsN; ++jj) {
        const int j = i % 2 == 1 ? kFragsN - 1 - jj : jj;
        mma_16816<T>(acc.c[i][j], f.a[i], f.b[j]);
      }
    }
  }

  // All BK/16 k-steps of one stage for this warp's WM x WN sub-tile
  // (KLoop::PerStage). Kept as it was measured in v1, generic pointers and
  // all: the 128-register configs sit at the cap, and a different address
  // computation made ptxas spill in some of them.
  static __device__ __forceinline__ void compute_stage(Accumulators& acc, const T* sa, const T* sb, int warp_m,
                                                       int warp_n) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int ks = 0; ks < BK / 16; ++ks) {
      uint32_t a[kFragsM][4];
      uint32_t b[kFragsN][2];
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) {
        const int row = warp_m * WM + i * 16 + (lane & 15);
        ldmatrix_x4(a[i], smem_addr(sa + SwizzleA::offset(row, ks * 2 + (lane >> 4))));
      }
#pragma unroll
      for (int j = 0; j < kFragsN; j += 2) {
        uint32_t r[4];
        if constexpr (kBIsKN) {
          const int k_row = ks * 16 + (lane & 15);
          ldmatrix_x4_trans(r, smem_addr(sb + SwizzleB::offset(k_row, (warp_n * WN + j * 8) / 8 + (lane >> 4))));
        } else {
          const int n_row = warp_n * WN + j * 8 + (lane & 7) + ((lane >> 4) << 3);
          ldmatrix_x4(r, smem_addr(sb + SwizzleB::offset(n_row, ks * 2 + ((lane >> 3) & 1))));
        }
        b[j][0] = r[0];
        b[j][1] = r[1];
        b[j + 1][0] = r[2];
        b[j + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) mma_16816<T>(acc.c[i][j], a[i], b[j]);
      }
    }
  }

  // The whole K loop: acc = A tile rows @ B tile columns.
  static __device__ __forceinline__ void run(Accumulators& acc, const GemmArgs<T>& p, TileCoord tile,
                                             unsigned char* smem) {
    acc.zero();
    if constexpr (Tile::kKLoop == KLoop::Pipelined)
      run_pipelined(acc, p, tile, smem);
    else
      run_per_stage(acc, p, tile, smem);
  }

  static __device__ __forceinline__ void run_per_stage(Accumulators& acc, const GemmArgs<T>& p, TileCoord tile,
                                                       unsigned char* smem) {
    T* smem_a = reinterpret_cast<T*>(smem);
    T* smem_b = smem_a + kStages * kAStageElems;
    const int warp = threadIdx.x / 32;
    const int warp_m = warp / Tile::kWarpsN, warp_n = warp % Tile::kWarpsN;
    const int k_tiles = int((p.k + BK - 1) / BK);
    // Fill all but one stage. Every iteration commits a group, empty or not,
    // so that "groups still pending" counts the same everywhere.
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_tiles) load_stage(p, tile, s, smem_a + s * kAStageElems, smem_b + s * kBStageElems);
      cp_async_commit();
    }
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int stage = kt % kStages;
      cp_async_wait<kStages - 2>();  // this thread's copies of tile kt have landed
      __syncthreads();  // everyone's copies of tile kt visible; tile kt-1's buffer free
      const int next = kt + kStages - 1;
      if (next < k_tiles) {
        const int next_stage = next % kStages;
        load_stage(p, tile, next, smem_a + next_stage * kAStageElems, smem_b + next_stage * kBStageElems);
      }
      cp_async_commit();
      compute_stage(acc, smem_a + stage * kAStageElems, smem_b + stage * kBStageElems, warp_m, warp_n);
    }
    cp_async_wait<0>();
  }

  // KLoop::Pipelined. Stage buffers rotate as in run_per_stage; what moves
  // is where each step's ldmatrix and the barrier sit:
  //
  //   step s of tile kt:  [s == last: wait for tile kt+1, barrier]
  //                       ldmatrix step s+1 (of tile kt+1 when s is last)
  //                       [s == 0: issue the copies of tile kt+Stages-1]
  //                       mma step s
  //
  // Every ldmatrix of tile kt-1 was issued before the barrier in the last
  // step of tile kt-1, so the copies into its buffer at step 0 of tile kt are
  // safe; a barrier orders the shared-memory reads before it.
  static __device__ __forceinline__ void run_pipelined(Accumulators& acc, const GemmArgs<T>& p, TileCoord tile,
                                                       unsigned char* smem) {
    T* smem_a = reinterpret_cast<T*>(smem);
    T* smem_b = smem_a + kStages * kAStageElems;
    const int warp = threadIdx.x / 32;
    const int warp_m = warp / Tile::kWarpsN, warp_n = warp % Tile::kWarpsN;
    const int k_tiles = int((p.k + BK - 1) / BK);
    Loader loader(p, tile);
#pragma unroll
    for (int s = 0; s < kStages - 1; ++s) {
      if (s < k_tiles) loader.load(p, smem_a + s * kAStageElems, smem_b + s * kBStageElems);
      cp_async_commit();
    }
    cp_async_wait<kStages - 2>();
    __syncthreads();

    const uint32_t a_base = smem_addr(smem_a), b_base = smem_addr(smem_b);
    constexpr uint32_t kAStageBytes = kAStageElems * sizeof(T), kBStageBytes = kBStageElems * sizeof(T);
    Fragments frag[2];
    load_fragments(frag[0], a_base, b_base, 0, warp_m, warp_n);
    int read_stage = 0, write_stage = kStages - 1;
    for (int kt = 0; kt < k_tiles; ++kt) {
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        if (ks == kSteps - 1) {
          cp_async_wait<kStages - 2>();  // this thread's copies of tile kt+1 have landed
          read_stage = read_stage + 1 == kStages ? 0 : read_stage + 1;
          __syncthreads();
        }
        // After the last tile this reads a stale buffer into registers that
        // nothing uses; cheaper than a branch in the steady state.
        load_fragments(frag[(ks + 1) % 2], a_base + read_stage * kAStageBytes, b_base + read_stage * kBStageBytes,
                       (ks + 1) % kSteps, warp_m, warp_n);
        if (ks == 0) {
          if (kt + kStages - 1 < k_tiles)
            loader.load(p, smem_a + write_stage * kAStageElems, smem_b + write_stage * kBStageElems);
          cp_async_commit();
          write_stage = write_stage + 1 == kStages ? 0 : write_stage + 1;
        }
        mma_fragments(acc, frag[ks % 2]);
      }
    }
    cp_async_wait<0>();
  }
  using TileStore = CollectiveEpilogue<T, Tile>;
  static_assert(Tile::kStore != Store::Staged || TileStore::kStagedBytes <= kSmemBytes,
                "the staged C tile must fit in the pipeline's shared memory");

  // Entry point used by fused_gemm_kernel.
  template <typename Epilogue>
  static __device__ __forceinline__ void operator_body(const GemmArgs<T>& p, TileCoord tile, unsigned char* smem) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800
    __trap();  // cp.async, ldmatrix and m16n8k16 need sm_80 or newer
#else
    Accumulators acc;
    run(acc, p, tile, smem);
    if constexpr (Tile::kStore == Store::Staged)
      TileStore::template store_staged<Epilogue>(acc, p, tile, smem);
    else
      TileStore::template store<Epilogue>(acc, p, tile);
#endif
  }
};

}  // namespace sm80
}  // namespace fusion