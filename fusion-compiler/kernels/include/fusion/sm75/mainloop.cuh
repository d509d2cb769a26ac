// The sm75 mainloop (Turing: RTX 20xx, T4): WMMA 16x16x16 tensor-core tiles,
// f16 inputs and f32 accumulators. Turing has no cp.async and no bf16 mma, so
// tiles move global -> registers -> shared memory with 16-byte loads, double
// buffered: the loads of K tile kt+1 are issued before the math of tile kt and
// stored to the other buffer after it, one CTA barrier per K tile. Shared
// memory rows are padded by 16 bytes so the 8 rows an 8x8 WMMA sub-load reads
// fall in different bank groups.
//
// WMMA's accumulator layout is opaque, so the epilogue goes through shared
// memory: each warp stores a 16-row slab of its accumulators, then applies the
// chain to 16-byte chunks of it and writes them to C with 16-byte stores.
#pragma once

#include <mma.h>
#include <stdint.h>

#include <type_traits>

#include "../numeric.cuh"
#include "../problem.cuh"
#include "../warp_tiled.cuh"

namespace fusion {
namespace sm75 {

template <int BM_, int BN_, int BK_, int WM_, int WN_, int kMinBlocksPerSm_>
struct TileConfig : WarpTiledRules<BM_, BN_, BK_, WM_, WN_, kMinBlocksPerSm_> {
  static constexpr int BM = BM_, BN = BN_, BK = BK_, WM = WM_, WN = WN_;
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  // Double-buffered through registers: not a parameter.
  static constexpr int kStages = 2;
};

// 8 warps of 64x32 (8 WMMA accumulators each); two buffers use 40 KB of
// shared memory, inside Turing's 64 KB.
using Tile128x128 = TileConfig<128, 128, 32, 64, 32, 1>;

// Shared memory a Turing block may have.
constexpr int kSmemPerBlock = 64 * 1024;

// Whether `Tile` is one this mainloop takes (for either layout of B).
template <LayoutB, typename Tile>
constexpr bool tile_valid = Tile::kValid;

template <typename T, LayoutB kLayoutB, typename Tile>
struct Mainloop {
  static_assert(std::is_same<T, __half>::value,
                "the sm75 mainloop supports f16 only: Turing tensor cores have no bf16; use the sm80 mainloop");

  using Element = T;
  static constexpr LayoutB kLayout = kLayoutB;
  using Config = Tile;
  static constexpr int BM = Tile::BM, BN = Tile::BN, BK = Tile::BK, WM = Tile::WM, WN = Tile::WN;
  static constexpr int kThreads = Tile::kThreads, kMinBlocksPerSm = Tile::kMinBlocksPerSm;
  static constexpr int kFragsM = WM / 16, kFragsN = WN / 16;
  static constexpr int kPad = 8;  // elements: 16 bytes per row

  // Shared-memory tiles, stored the way the operands lie in device memory.
  static constexpr bool kBIsKN = kLayoutB == LayoutB::KN;
  static constexpr int kALd = BK + kPad;
  static constexpr int kBRows = kBIsKN ? BK : BN, kBCols = kBIsKN ? BN : BK, kBLd = kBCols + kPad;
  static constexpr int kABufElems = BM * kALd, kBBufElems = kBRows * kBLd;
  static constexpr int kAChunksPerThread = BM * BK / 8 / kThreads;
  static constexpr int kBChunksPerThread = BN * BK / 8 / kThreads;

  // Epilogue staging: per warp, 16 rows of WN floats, padded by 4 floats.
  static constexpr int kStageLd = WN + 4;
  static constexpr size_t kPipelineBytes = size_t(2) * (kABufElems + kBBufElems) * sizeof(T);
  static constexpr size_t kEpilogueBytes = size_t(Tile::kWarpsM * Tile::kWarpsN) * 16 * kStageLd * sizeof(float);
  static constexpr size_t kSmemBytes = kPipelineBytes > kEpilogueBytes ? kPipelineBytes : kEpilogueBytes;

  using FragA = nvcuda::wmma::fragment<nvcuda::wmma::matrix_a, 16, 16, 16, __half, nvcuda::wmma::row_major>;
  using FragB = nvcuda::wmma::fragment<nvcuda::wmma::matrix_b, 16, 16, 16, __half,
                                       std::conditional_t<kBIsKN, nvcuda::wmma::row_major, nvcuda::wmma::col_major>>;
  using FragC = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

  struct Accumulators {
    FragC c[kFragsM][kFragsN];
  };

  // One K tile's worth of this thread's chunks, in flight in registers.
  struct Staged {
    Vec8<T> a[kAChunksPerThread];
    Vec8<T> b[kBChunksPerThread];
  };

  static __device__ __forceinline__ void load_global(Staged& r, const GemmArgs<T>& p, TileCoord tile, int kt) {
    const int64_t k0 = int64_t(kt) * BK;
    constexpr int kAChunksPerRow = BK / 8;
#pragma unroll
    for (int i = 0; i < kAChunksPerThread; ++i) {
      const int id = threadIdx.x + i * kThreads;
      const int64_t m = tile.m0 + id / kAChunksPerRow, k = k0 + (id % kAChunksPerRow) * 8;
      r.a[i].bits = make_uint4(0, 0, 0, 0);
      if (m < p.m && k < p.k) r.a[i] = load_vec8(p.a + m * p.k + k);
    }
    constexpr int kBChunksPerRow = kBCols / 8;
#pragma unroll
    for (int i = 0; i < kBChunksPerThread; ++i) {
      const int id = threadIdx.x + i * kThreads;
      const int row = id / kBChunksPerRow, col = (id % kBChunksPerRow) * 8;
      r.b[i].bits = make_uint4(0, 0, 0, 0);
      if constexpr (kBIsKN) {
        const int64_t k = k0 + row, n = tile.n0 + col;
        if (k < p.k && n < p.n) r.b[i] = load_vec8(p.b + k * p.ldb + n);
      } else {
        const int64_t n = tile.n0 + row, k = k0 + col;
        if (n < p.n && k < p.k) r.b[i] = load_vec8(p.b + n * p.ldb + k);
      }
    }
  }

  // Writes the staged chunks to a shared buffer.
  static __device__ __forceinline__ void store_shared(Staged& r, T* sa, T* sb) {
    constexpr int kAChunksPerRow = BK / 8;
#pragma unroll
    for (int i = 0; i < kAChunksPerThread; ++i) {
      const int id = threadIdx.x + i * kThreads;
      const int row = id / kAChunksPerRow, col = (id % kAChunksPerRow) * 8;
      store_vec8(sa + row * kALd + col, r.a[i]);
    }
    constexpr int kBChunksPerRow = kBCols / 8;
#pragma unroll
    for (int i = 0; i < kBChunksPerThread; ++i) {
      const int id = threadIdx.x + i * kThreads;
      store_vec8(sb + (id / kBChunksPerRow) * kBLd + (id % kBChunksPerRow) * 8, r.b[i]);
    }
  }

  static __device__ __forceinline__ void compute(Accumulators& acc, const T* sa, const T* sb, int warp_m,
                                                 int warp_n) {
#pragma unroll
    for (int ks = 0; ks < BK; ks += 16) {
      FragA a[kFragsM];
      FragB b[kFragsN];
#pragma unroll
      for (int i = 0; i < kFragsM; ++i)
        nvcuda::wmma::load_matrix_sync(a[i], sa + (warp_m * WM + i * 16) * kALd + ks, kALd);
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) {
        const int n = warp_n * WN + j * 16;
        // KN: B(k, n) at sb[k][n], row-major. NK: B(k, n) at sb[n][k], which
        // is a column-major K x N matrix with leading dimension kBLd.
        const T* src = kBIsKN ? sb + ks * kBLd + n : sb + n * kBLd + ks;
        nvcuda::wmma::load_matrix_sync(b[j], src, kBLd);
      }
#pragma unroll
      for (int i = 0; i < kFragsM; ++i)
#pragma unroll
        for (int j = 0; j < kFragsN; ++j) nvcuda::wmma::mma_sync(acc.c[i][j], a[i], b[j], acc.c[i][j]);
    }
  }

  static __device__ __forceinline__ void run(Accumulators& acc, const GemmArgs<T>& p, TileCoord tile,
                                             unsigned char* smem) {
    T* sa = reinterpret_cast<T*>(smem);  // [2][BM][kALd]
    T* sb = sa + 2 * kABufElems;         // [2][kBRows][kBLd]
    const int warp = threadIdx.x / 32;
    const int warp_m = warp / Tile::kWarpsN, warp_n = warp % Tile::kWarpsN;
#pragma unroll
    for (int i = 0; i < kFragsM; ++i)
#pragma unroll
      for (int j = 0; j < kFragsN; ++j) nvcuda::wmma::fill_fragment(acc.c[i][j], 0.0f);

    const int k_tiles = int((p.k + BK - 1) / BK);
    Staged staged;
    load_global(staged, p, tile, 0);
    store_shared(staged, sa, sb);
    __syncthreads();
    for (int kt = 0; kt < k_tiles; ++kt) {
      const int buf = kt & 1;
      const bool has_next = kt + 1 < k_tiles;
      if (has_next) load_global(staged, p, tile, kt + 1);
      compute(acc, sa + buf * kABufElems, sb + buf * kBBufElems, warp_m, warp_n);
      // The other buffer was last read in iteration kt-1, before the barrier
      // that ended it, so it can be overwritten now.
      if (has_next) store_shared(staged, sa + (buf ^ 1) * kABufElems, sb + (buf ^ 1) * kBBufElems);
      __syncthreads();
    }
  }

  // Stages each 16-row slab of the warp's accumulators in shared memory, then
  // applies the chain to 16-byte chunks and stores them with 16-byte stores.
  // A gated chain (epilogue.cuh, GatedChain) reads each chunk's gate and up
  // values from slab columns 16c and 16c + 8 and stores 8 columns of C.
  // The last barrier of `run` has freed the pipeline buffers.
  template <typename Epilogue>
  static __device__ __forceinline__ void store(Accumulators& acc, const GemmArgs<T>& p, TileCoord tile,
                                               unsigned char* smem) {
    constexpr int kCols = Epilogue::kGemmColsPerOutput;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32;
    const int warp_m = warp / Tile::kWarpsN, warp_n = warp % Tile::kWarpsN;
    float* slab = reinterpret_cast<float*>(smem) + warp * 16 * kStageLd;
    const int64_t N = p.n / kCols;
    constexpr int kChunksPerRow = WN / 8 / kCols;  // of C
    static_assert(16 * kChunksPerRow % 32 == 0, "each lane stores the same number of chunks of a slab");
#pragma unroll
    for (int i = 0; i < kFragsM; ++i) {
#pragma unroll
      for (int j = 0; j < kFragsN; ++j)
        nvcuda::wmma::store_matrix_sync(slab + j * 16, acc.c[i][j], kStageLd, nvcuda::wmma::mem_row_major);
      __syncwarp();
#pragma unroll
      for (int t = 0; t < 16 * kChunksPerRow / 32; ++t) {
        const int id = lane + 32 * t;
        const int r = id / kChunksPerRow, col = (id % kChunksPerRow) * 8;
        const int64_t m = tile.m0 + warp_m * WM + i * 16 + r;
        const int64_t n = (tile.n0 + warp_n * WN) / kCols + col;
        if (m < p.m && n < N) {
          const float* at = slab + r * kStageLd + col * kCols;
          Vec8<T> out;
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const float2 v = make_float2(at[2 * q], at[2 * q + 1]);
            float2 c;
            if constexpr (Epilogue::kGated)
              c = Epilogue::template apply<T>(v, make_float2(at[8 + 2 * q], at[9 + 2 * q]), m, n + 2 * q, N,
                                              p.epilogue);
            else
              c = Epilogue::template apply<T>(v, m, n + 2 * q, N, p.epilogue);
            out.set_pair(q, Numeric<T>::float2_to_pair(c));
          }
          store_vec8(p.c + m * N + n, out);
        }
      }
      __syncwarp();
    }
  }

  template <typename Epilogue>
  static __device__ __forceinline__ void operator_body(const GemmArgs<T>& p, TileCoord tile, unsigned char* smem) {
    Accumulators acc;
    run(acc, p, tile, smem);
    store<Epilogue>(acc, p, tile, smem);
  }
};

}  // namespace sm75
}  // namespace fusion
