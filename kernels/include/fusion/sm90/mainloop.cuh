// The sm90 mainloop (H100, H200; built as sm_90a): a persistent,
// warp-specialized GEMM on wgmma and TMA.
//
// One CTA per SM walks output tiles in grouped order (gemm.cuh). Its threads
// form 1 + BM/64 warp groups:
//  - the producer (warp group 0, one elected thread, 40 registers) issues TMA
//    loads of A and B tiles (BK = 64, 128-byte swizzle) into a ring of
//    kStages shared-memory stages, each guarded by a "full" and an "empty"
//    mbarrier, and runs ahead across tile boundaries;
//  - each consumer (warp groups 1.., 232 registers) owns 64 rows of the
//    tile and a 64 x BN f32 accumulator in registers; per stage it issues
//    BK/16 wgmma m64nBNk16 straight from shared memory, keeps one stage's
//    wgmmas in flight and frees the stage before it.
// After the K loop each consumer runs the epilogue chain on its accumulators
// in registers, writes the results to a padded staging buffer 64 columns at
// a time and stores C with 16-byte coalesced stores, while the producer
// already loads the next tile's stages.
//
// B [N, K] (nn.Linear) is K-major like A; B [K, N] is MN-major, loaded as
// 64-column boxes and read by wgmma with its transpose bit. TMA zero-fills
// everything outside A and B, so any M works and N and K need only be
// multiples of 8 (TMA's 16-byte stride rule).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>
#include <stdint.h>

#include <atomic>

#include "../epilogue.cuh"
#include "../gemm.cuh"
#include "../numeric.cuh"
#include "../problem.cuh"
#include "primitives.cuh"

namespace fusion {
namespace sm90 {

// How the consumer warp groups share the work.
//  - Cooperative: BM/64 consumers split every tile by rows, 64 each.
//  - PingPong: two consumers take alternate tiles, each a whole BM x BN
//    tile; the ring hands them their tiles' stages in turn, so one's
//    epilogue runs while the other's wgmmas keep the tensor cores busy.
enum class Schedule { Cooperative, PingPong };

// A CTA tile: BM rows by BN columns, K in steps of 64, kStages
// shared-memory stages. Shared memory is 1024 (alignment) + kStages *
// (BM + BN) * 128 bytes for the pipeline, (rows staged at once) * 144 bytes
// of epilogue staging (BM for Cooperative, 2 * BM for PingPong) and
// 16 * kStages bytes of barriers.
template <int BM_, int BN_, int kStages_, Schedule kSchedule_ = Schedule::Cooperative, int kGroupRows_ = 8>
struct TileConfig {
  static constexpr int BM = BM_, BN = BN_, BK = 64;
  static constexpr int kStages = kStages_;
  static constexpr Schedule kSchedule = kSchedule_;
  static constexpr int kGroupRows = kGroupRows_;
  // What the selftest prints as the warp tile: one consumer's share.
  static constexpr int WM = 64, WN = BN;
  static_assert(BM == 64 || BM == 128, "one or two consumer warp groups of 64 rows");
  static_assert(BN == 128 || BN == 256, "wgmma is instantiated for n = 128 and 256");
  static_assert(kStages >= 2, "the pipeline needs at least two stages");
};

template <typename T, LayoutB kLayout, typename Config_>
struct Mainloop {
  using Element = T;
  using Config = Config_;
  static constexpr int BM = Config::BM, BN = Config::BN, BK = Config::BK;
  static constexpr int kStages = Config::kStages;
  static constexpr int kGroupRows = Config::kGroupRows;
  static constexpr int kConsumers = BM / 64;
  static constexpr int kThreads = 128 * (1 + kConsumers);
  static constexpr int kMinBlocksPerSm = 1;
  static constexpr int kProducerRegisters = 40;
  static constexpr int kConsumerRegisters = 232;
  // gemm.cuh's FusedGemm hands the launch to this mainloop.
  static constexpr bool kOwnsKernel = true;

  static constexpr int kABytes = BM * BK * 2;
  static constexpr int kBBytes = BN * BK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  // Epilogue staging: 64 columns per pass, rows padded by 16 bytes so that
  // fragment writes and row reads are free of bank conflicts.
  static constexpr int kChunkCols = 64;
  static constexpr int kStagingPitch = kChunkCols + 8;
  static constexpr int kStagingBytes = kConsumers * 64 * kStagingPitch * 2;
  static constexpr int kBarrierBytes = 2 * kStages * 8;
  // 1024 bytes of slack to align the stages for the 128-byte swizzle.
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + kStagingBytes + kBarrierBytes;
  static constexpr int kTransB = kLayout == LayoutB::KN ? 1 : 0;
  static constexpr int kAccumulators = BN / 2;

  struct Smem {
    unsigned char* a;  // [kStages][BM][64]
    unsigned char* b;  // [kStages][BN][64] (NK) or [kStages][BN/64][64][64] (KN)
    T* staging;        // [kConsumers][64][kStagingPitch]
    uint64_t* full;    // [kStages]
    uint64_t* empty;   // [kStages]
  };

  static __device__ __forceinline__ Smem carve(unsigned char* raw) {
    const uint32_t base = smem_u32(raw);
    unsigned char* aligned = raw + ((1024 - (base & 1023)) & 1023);
    Smem s;
    s.a = aligned;
    s.b = aligned + kStages * kABytes;
    s.staging = reinterpret_cast<T*>(aligned + kStages * kStageBytes);
    s.full = reinterpret_cast<uint64_t*>(aligned + kStages * kStageBytes + kStagingBytes);
    s.empty = s.full + kStages;
    return s;
  }

  // The producer: one thread keeps every stage loaded, across tiles.
  static __device__ __forceinline__ void produce(const Smem& s, const CUtensorMap* map_a, const CUtensorMap* map_b,
                                                 const GemmArgs<T>& args) {
    const int64_t tiles_m = (args.m + BM - 1) / BM, tiles_n = (args.n + BN - 1) / BN;
    const int64_t tiles = tiles_m * tiles_n;
    const int k_blocks = int((args.k + BK - 1) / BK);
    int stage = 0;
    uint32_t phase = 0;
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
      const TileCoord tile = grouped_tile_order<kGroupRows>(t, tiles_m, tiles_n, BM, BN);
      for (int kb = 0; kb < k_blocks; ++kb) {
        mbarrier_wait(&s.empty[stage], phase ^ 1);
        mbarrier_arrive_expect_tx(&s.full[stage], kStageBytes);
        const int32_t k0 = kb * BK;
        tma_load_2d(s.a + stage * kABytes, map_a, &s.full[stage], k0, int32_t(tile.m0));
        unsigned char* b = s.b + stage * kBBytes;
        if constexpr (kLayout == LayoutB::NK) {
          tma_load_2d(b, map_b, &s.full[stage], k0, int32_t(tile.n0));
        } else {
#pragma unroll
          for (int j = 0; j < BN / 64; ++j)
            tma_load_2d(b + j * 64 * BK * 2, map_b, &s.full[stage], int32_t(tile.n0) + 64 * j, k0);
        }
        if (++stage == kStages) {
          stage = 0;
          phase ^= 1;
        }
      }
    }
  }

  // One consumer warp group's K loop over one tile.
  static __device__ __forceinline__ void mma_tile(const Smem& s, int consumer, int k_blocks, int& stage,
                                                  uint32_t& phase, float (&acc)[kAccumulators]) {
    const int lane = threadIdx.x % 32;
    int previous = -1;
    for (int kb = 0; kb < k_blocks; ++kb) {
      mbarrier_wait(&s.full[stage], phase);
      const unsigned char* a = s.a + stage * kABytes + consumer * 64 * 128;
      const unsigned char* b = s.b + stage * kBBytes;
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < BK / 16; ++kk) {
        const uint64_t da = smem_descriptor(a + kk * 32, 16, 1024);
        const uint64_t db = kLayout == LayoutB::NK ? smem_descriptor(b + kk * 32, 16, 1024)
                                                   : smem_descriptor(b + kk * 16 * 128, 64 * BK * 2, 1024);
        Wgmma<T, BN, kTransB>::mma(acc, da, db, (kb > 0 || kk > 0) ? 1 : 0);
      }
      wgmma_commit();
      // The stage before this one is now read: hand it back.
      wgmma_wait<1>();
      if (previous >= 0 && lane == 0) mbarrier_arrive(&s.empty[previous]);
      previous = stage;
      if (++stage == kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    wgmma_wait<0>();
    fence_registers(acc);
    if (previous >= 0 && lane == 0) mbarrier_arrive(&s.empty[previous]);
  }

  // Epilogue chain on the accumulators, then C through the staging buffer.
  template <typename Epilogue>
  static __device__ __forceinline__ void store_tile(const Smem& s, int consumer, TileCoord tile,
                                                    const float (&acc)[kAccumulators], const GemmArgs<T>& args) {
    const int thread = threadIdx.x % 128;
    const int warp = thread / 32, lane = thread % 32;
    const int row_in_tile = warp * 16 + lane / 4;  // and row_in_tile + 8
    const int64_t m_base = tile.m0 + consumer * 64;
    T* staging = s.staging + consumer * 64 * kStagingPitch;
#pragma unroll
    for (int chunk = 0; chunk < BN / kChunkCols; ++chunk) {
#pragma unroll
      for (int j = 0; j < kChunkCols / 8; ++j) {
        const int frag = chunk * (kChunkCols / 8) + j;
        const int col = j * 8 + 2 * (lane % 4);
        const int64_t n = tile.n0 + chunk * kChunkCols + col;
#pragma unroll
        for (int half = 0; half < 2; ++half) {
          const int r = row_in_tile + 8 * half;
          const int64_t m = m_base + r;
          float2 v = make_float2(acc[4 * frag + 2 * half], acc[4 * frag + 2 * half + 1]);
          if (m < args.m && n < args.n) v = Epilogue::template apply<T>(v, m, n, args.n, args.epilogue);
          *reinterpret_cast<typename Numeric<T>::Pair*>(staging + r * kStagingPitch + col) =
              Numeric<T>::float2_to_pair(v);
        }
      }
      named_barrier_sync(1 + consumer, 128);
      constexpr int kVecsPerRow = kChunkCols / kVecElems;
#pragma unroll
      for (int i = 0; i < 64 * kVecsPerRow / 128; ++i) {
        const int idx = i * 128 + thread;
        const int r = idx / kVecsPerRow, v = idx % kVecsPerRow;
        const int64_t m = m_base + r;
        const int64_t n = tile.n0 + chunk * kChunkCols + v * kVecElems;
        if (m < args.m && n < args.n) {
          const uint4 bits = *reinterpret_cast<const uint4*>(staging + r * kStagingPitch + v * kVecElems);
          *reinterpret_cast<uint4*>(args.c + m * args.n + n) = bits;
        }
      }
      named_barrier_sync(1 + consumer, 128);
    }
  }

  template <typename Epilogue>
  static __device__ __forceinline__ void consume(const Smem& s, int consumer, const GemmArgs<T>& args) {
    const int64_t tiles_m = (args.m + BM - 1) / BM, tiles_n = (args.n + BN - 1) / BN;
    const int64_t tiles = tiles_m * tiles_n;
    const int k_blocks = int((args.k + BK - 1) / BK);
    int stage = 0;
    uint32_t phase = 0;
    float acc[kAccumulators];
    for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
      const TileCoord tile = grouped_tile_order<kGroupRows>(t, tiles_m, tiles_n, BM, BN);
      mma_tile(s, consumer, k_blocks, stage, phase, acc);
      store_tile<Epilogue>(s, consumer, tile, acc, args);
    }
  }

  // Host side: the tensor maps of A and B for one launch.
  static cudaError_t encode_maps(const GemmArgs<T>& p, CUtensorMap* map_a, CUtensorMap* map_b);
  template <typename Prologue, typename Epilogue>
  static cudaError_t launch(const GemmArgs<T>& p, cudaStream_t stream);
};

template <typename ML, typename Epilogue>
__global__ void __launch_bounds__(ML::kThreads, 1)
    persistent_gemm_kernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                           const GemmArgs<typename ML::Element> args) {
#if FUSION_SM90_ENABLED
  extern __shared__ __align__(1024) unsigned char smem_raw[];
  const typename ML::Smem s = ML::carve(smem_raw);
  const int group = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    prefetch_tensor_map(&map_a);
    prefetch_tensor_map(&map_b);
    for (int i = 0; i < ML::kStages; ++i) {
      mbarrier_init(&s.full[i], 1);
      mbarrier_init(&s.empty[i], ML::kConsumers * 4);  // one arrival per consumer warp
    }
    fence_barrier_init();
  }
  __syncthreads();
  if (group == 0) {
    setmaxnreg_dec<ML::kProducerRegisters>();
    if (threadIdx.x == 0) ML::produce(s, &map_a, &map_b, args);
  } else {
    setmaxnreg_inc<ML::kConsumerRegisters>();
    ML::template consume<Epilogue>(s, group - 1, args);
  }
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

// SMs of the current device, read once per device.
inline int sm_count() {
  static std::atomic<int> counts[64];
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return 1;
  if (device < 64) {
    const int cached = counts[device].load(std::memory_order_relaxed);
    if (cached > 0) return cached;
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || sms <= 0) sms = 1;
  if (device < 64) counts[device].store(sms, std::memory_order_relaxed);
  return sms;
}

}  // namespace detail

template <typename T, LayoutB kLayout, typename Config>
cudaError_t Mainloop<T, kLayout, Config>::encode_maps(const GemmArgs<T>& p, CUtensorMap* map_a,
                                                      CUtensorMap* map_b) {
  cudaError_t err = detail::encode_matrix(map_a, p.a, p.m, p.k, BM);
  if (err != cudaSuccess) return err;
  if constexpr (kLayout == LayoutB::NK)
    return detail::encode_matrix(map_b, p.b, p.n, p.k, BN);
  else
    return detail::encode_matrix(map_b, p.b, p.k, p.n, BK);
}

template <typename T, LayoutB kLayout, typename Config>
template <typename Prologue, typename Epilogue>
cudaError_t Mainloop<T, kLayout, Config>::launch(const GemmArgs<T>& p, cudaStream_t stream) {
  static_assert(!Prologue::kEnabled, "the sm90 mainloop has no norm prologue; those compositions use sm80's");
  using Self = Mainloop<T, kLayout, Config>;
  static std::atomic<uint64_t> configured_devices{0};
  int device = 0;
  cudaError_t err = cudaGetDevice(&device);
  if (err != cudaSuccess) return err;
  const uint64_t bit = device < 64 ? uint64_t(1) << device : 0;
  if (bit == 0 || !(configured_devices.load(std::memory_order_acquire) & bit)) {
    err = cudaFuncSetAttribute(persistent_gemm_kernel<Self, Epilogue>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                               kSmemBytes);
    if (err != cudaSuccess) return err;
    configured_devices.fetch_or(bit, std::memory_order_acq_rel);
  }
  CUtensorMap map_a, map_b;
  err = encode_maps(p, &map_a, &map_b);
  if (err != cudaSuccess) return err;
  const int64_t tiles = ((p.m + BM - 1) / BM) * ((p.n + BN - 1) / BN);
  const int64_t sms = detail::sm_count();
  const unsigned grid = unsigned(tiles < sms ? tiles : sms);
  persistent_gemm_kernel<Self, Epilogue><<<grid, kThreads, kSmemBytes, stream>>>(map_a, map_b, p);
  return cudaGetLastError();
}

}  // namespace sm90
}  // namespace fusion
