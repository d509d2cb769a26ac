// The Hopper (sm_90a) instructions the sm90 mainloop is built from, each
// wrapped once: mbarriers, TMA tile loads, wgmma and its shared-memory
// descriptors, and setmaxnreg. Only code compiled for sm_90a may call them;
// the mainloop guards its kernel body with FUSION_SM90_ENABLED.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include <type_traits>

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ == 900) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FUSION_SM90_ENABLED 1
#else
#define FUSION_SM90_ENABLED 0
#endif

namespace fusion {
namespace sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---------------------------------------------------------------------------
// mbarriers: a full barrier per stage completes when the stage's TMA bytes
// have landed; an empty barrier completes when every consumer warp is done
// reading the stage. Waits are on the phase parity.
// ---------------------------------------------------------------------------
__device__ __forceinline__ void mbarrier_init(uint64_t* bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(arrivals) : "memory");
}

// Makes initialised barriers visible to the async proxy (TMA) and other threads.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

__device__ __forceinline__ void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}

__device__ __forceinline__ void mbarrier_arrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_u32(bar)) : "memory");
}

// Arrives on the barrier at the same shared-memory offset as `bar` in the
// cluster's CTA `rank` (which may be this one). The default release.cta
// semantics: what the arrival publishes are wgmma reads that wgmma.wait has
// already completed; a cluster-scope release made every consumer warp pay
// for a cluster-wide fence per stage.
__device__ __forceinline__ void mbarrier_arrive_cluster(uint64_t* bar, uint32_t rank) {
  asm volatile(
      "{\n"
      ".reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.shared::cluster.b64 _, [remote];\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(rank)
      : "memory");
}

__device__ __forceinline__ void mbarrier_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT;\n"
      "}\n" ::"r"(smem_u32(bar)),
      "r"(parity)
      : "memory");
}

// ---------------------------------------------------------------------------
// TMA: one 2D box of a tensor map into shared memory, counted on `bar`.
// Coordinates are elements, innermost dimension first; parts of the box
// outside the tensor are filled with zeros (and still counted).
// ---------------------------------------------------------------------------
__device__ __forceinline__ void tma_load_2d(void* dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                            int32_t c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
          smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1)
      : "memory");
}

// The same box delivered to the same shared-memory offset of every CTA in
// `cta_mask` (a bit per rank of the cluster), each counting it on its own
// barrier at `bar`'s offset.
__device__ __forceinline__ void tma_load_2d_multicast(void* dst, const void* tensor_map, uint64_t* bar, int32_t c0,
                                                      int32_t c1, uint16_t cta_mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, {%3, "
      "%4}], [%2], %5;" ::"r"(smem_u32(dst)),
      "l"(reinterpret_cast<uint64_t>(tensor_map)), "r"(smem_u32(bar)), "r"(c0), "r"(c1), "h"(cta_mask)
      : "memory");
}

// This CTA's rank in its cluster, and a barrier across the whole cluster
// that also orders shared-memory accesses (release / acquire).
__device__ __forceinline__ uint32_t cluster_rank() {
  uint32_t rank;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
  return rank;
}
__device__ __forceinline__ void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
}

// One 2D box from shared memory into a tensor map's tensor, as part of this
// thread's current bulk group; parts of the box outside the tensor are
// dropped.
__device__ __forceinline__ void tma_store_2d(const void* tensor_map, const void* src, int32_t c0, int32_t c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];" ::"l"(
                   reinterpret_cast<uint64_t>(tensor_map)),
               "r"(smem_u32(src)), "r"(c0), "r"(c1)
               : "memory");
}

__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;" ::: "memory"); }

// Waits until this thread's bulk groups have finished reading shared memory.
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory"); }

// Orders this thread's ordinary shared-memory writes before later reads by
// the async proxy (TMA stores, wgmma).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

// Programmatic dependent launch: waits until the grid this one was
// launched after (with programmatic stream serialization) has finished and
// its writes are visible; returns at once for a grid launched normally.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

__device__ __forceinline__ void prefetch_tensor_map(const void* tensor_map) {
  asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(tensor_map)) : "memory");
}

// ---------------------------------------------------------------------------
// Register reallocation between warp groups (the kernel must be launched
// with a register cap: __launch_bounds__(threads, 1)).
// ---------------------------------------------------------------------------
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(kRegisters));
}
template <int kRegisters>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(kRegisters));
}

// A barrier among the `threads` threads (whole warps) that use `id`; id 0 is
// __syncthreads's.
__device__ __forceinline__ void named_barrier_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(threads) : "memory");
}
// The same barrier, telling every thread whether any passed `pred` true
// (bar.red.popc: a count of the threads that did).
__device__ __forceinline__ bool named_barrier_any(int id, int threads, bool pred) {
  uint32_t count;
  asm volatile(
      "{\n"
      "  .reg .pred p;\n"
      "  setp.ne.u32 p, %1, 0;\n"
      "  bar.red.popc.u32 %0, %2, %3, p;\n"
      "}\n"
      : "=r"(count)
      : "r"(uint32_t(pred)), "r"(id), "r"(threads)
      : "memory");
  return count != 0;
}

// ---------------------------------------------------------------------------
// wgmma shared-memory descriptors for tiles TMA wrote with 128-byte swizzle:
// rows of 128 bytes (64 16-bit or 128 FP8 elements), 8-row groups 1024
// bytes apart (stride byte offset). For K-major operands one wgmma's K
// (k16 of 16-bit, k32 of FP8 elements) is 32 bytes along the row and the
// leading byte offset is unused; for MN-major ones (B stored
// [K, N]) a k16 step is 16 rows, and the leading byte offset is the distance
// between 64-column blocks of N. Tiles must start 1024-byte aligned.
// ---------------------------------------------------------------------------
__device__ __forceinline__ uint64_t smem_descriptor(const void* tile, uint32_t leading_bytes, uint32_t stride_bytes) {
  uint64_t d = 0;
  d |= uint64_t((smem_u32(tile) & 0x3FFFF) >> 4);
  d |= uint64_t((leading_bytes >> 4) & 0x3FFF) << 16;
  d |= uint64_t((stride_bytes >> 4) & 0x3FFF) << 32;
  d |= uint64_t(1) << 62;  // 128-byte swizzle
  return d;
}

// ---------------------------------------------------------------------------
// stmatrix: four 8x8 matrices of 16-bit elements from a warp's registers
// into shared memory. Register i of lane t holds row t / 4, columns
// 2 (t % 4) and 2 (t % 4) + 1 of matrix i (the mma accumulator layout);
// lane t gives the address of row t % 8 of matrix t / 8 (16 bytes).
// ---------------------------------------------------------------------------
__device__ __forceinline__ void stmatrix_x4(void* row, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};" ::"r"(smem_u32(row)), "r"(r0),
               "r"(r1), "r"(r2), "r"(r3)
               : "memory");
}

// ldmatrix: the inverse of stmatrix_x4, four 8x8 matrices of 16-bit
// elements from shared memory into the same register layout (lane t gives
// the address of row t % 8 of matrix t / 8). No "memory" clobber: it reads
// only what an mbarrier wait (which has one) made visible, so ordinary
// global loads (an epilogue's bias) may still be scheduled across it.
__device__ __forceinline__ void ldmatrix_x4(const void* row, uint32_t& r0, uint32_t& r1, uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(smem_u32(row)));
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
template <int kPending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(kPending) : "memory");
}

// Keeps the compiler from moving accumulator reads or writes across a wgmma
// fence, commit or wait: the registers belong to the tensor cores until the
// wait that covers them.
template <int kCount>
__device__ __forceinline__ void fence_registers(float (&acc)[kCount]) {
#pragma unroll
  for (int i = 0; i < kCount; ++i) asm volatile("" : "+f"(acc[i])::"memory");
}

// The accumulator operands of one wgmma, eight at a time, and lists of
// them: FUSION_ACC<h> names d[0] .. d[h - 1], FUSION_REGS<h> the operands
// %0 .. %h-1, for h = 32 to 128 in steps of 8 (n = 2h = 64 to 256 in steps
// of 16: every width a tile may have, tile_config.cuh).
#define FUSION_ACC8(i)                                                                                       \
  "+f"(d[i]), "+f"(d[i + 1]), "+f"(d[i + 2]), "+f"(d[i + 3]), "+f"(d[i + 4]), "+f"(d[i + 5]), "+f"(d[i + 6]), \
      "+f"(d[i + 7])
#define FUSION_ACC32 FUSION_ACC8(0), FUSION_ACC8(8), FUSION_ACC8(16), FUSION_ACC8(24)
#define FUSION_ACC40 FUSION_ACC32, FUSION_ACC8(32)
#define FUSION_ACC48 FUSION_ACC40, FUSION_ACC8(40)
#define FUSION_ACC56 FUSION_ACC48, FUSION_ACC8(48)
#define FUSION_ACC64 FUSION_ACC56, FUSION_ACC8(56)
#define FUSION_ACC72 FUSION_ACC64, FUSION_ACC8(64)
#define FUSION_ACC80 FUSION_ACC72, FUSION_ACC8(72)
#define FUSION_ACC88 FUSION_ACC80, FUSION_ACC8(80)
#define FUSION_ACC96 FUSION_ACC88, FUSION_ACC8(88)
#define FUSION_ACC104 FUSION_ACC96, FUSION_ACC8(96)
#define FUSION_ACC112 FUSION_ACC104, FUSION_ACC8(104)
#define FUSION_ACC120 FUSION_ACC112, FUSION_ACC8(112)
#define FUSION_ACC128 FUSION_ACC120, FUSION_ACC8(120)
#define FUSION_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define FUSION_REGS40 FUSION_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define FUSION_REGS48 FUSION_REGS40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define FUSION_REGS56 FUSION_REGS48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define FUSION_REGS64 FUSION_REGS56 ", %56, %57, %58, %59, %60, %61, %62, %63"
#define FUSION_REGS72 FUSION_REGS64 ", %64, %65, %66, %67, %68, %69, %70, %71"
#define FUSION_REGS80 FUSION_REGS72 ", %72, %73, %74, %75, %76, %77, %78, %79"
#define FUSION_REGS88 FUSION_REGS80 ", %80, %81, %82, %83, %84, %85, %86, %87"
#define FUSION_REGS96 FUSION_REGS88 ", %88, %89, %90, %91, %92, %93, %94, %95"
#define FUSION_REGS104 FUSION_REGS96 ", %96, %97, %98, %99, %100, %101, %102, %103"
#define FUSION_REGS112 FUSION_REGS104 ", %104, %105, %106, %107, %108, %109, %110, %111"
#define FUSION_REGS120 FUSION_REGS112 ", %112, %113, %114, %115, %116, %117, %118, %119"
#define FUSION_REGS128 FUSION_REGS120 ", %120, %121, %122, %123, %124, %125, %126, %127"

// d (+)= A @ B for one m64 x N x k16 step, A and B from shared memory, f32
// accumulators; `accumulate` 0 overwrites d. kTransB: B is MN-major.
#define FUSION_WGMMA_SS(N, TYPE, REGS, ACC, DA, DB, P, TB)                                                 \
  asm volatile(                                                                                              \
      "{\n.reg .pred acc;\nsetp.ne.b32 acc, %" #P ", 0;\n"                                                   \
      "wgmma.mma_async.sync.aligned.m64n" #N "k16.f32." TYPE "." TYPE " {" REGS "}, %" #DA ", %" #DB         \
      ", acc, 1, 1, 0, %" #TB ";\n}\n"                                                                       \
      : ACC                                                                                                  \
      : "l"(a), "l"(b), "r"(accumulate), "n"(kTransB))

// The same for e4m3 operands, m64 x N x k32: 8-bit wgmma has no transpose
// immediates (both operands are K-major).
#define FUSION_WGMMA_SS_E4M3(N, REGS, ACC, DA, DB, P)                                                      \
  asm volatile(                                                                                              \
      "{\n.reg .pred acc;\nsetp.ne.b32 acc, %" #P ", 0;\n"                                                   \
      "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32.e4m3.e4m3 {" REGS "}, %" #DA ", %" #DB ", acc, 1, 1;\n}\n" \
      : ACC                                                                                                  \
      : "l"(a), "l"(b), "r"(accumulate))

// One wgmma of width N for T's operands: its N / 2 = H accumulators a
// thread come first in the operand list, then the two descriptors, the
// accumulate flag and (16-bit types) the transpose immediate, numbered H
// on.
#define FUSION_WGMMA_ANY(N, H, DA, DB, P, TB)                                        \
  if constexpr (std::is_same_v<T, __nv_fp8_e4m3>)                                     \
    FUSION_WGMMA_SS_E4M3(N, FUSION_REGS##H, FUSION_ACC##H, DA, DB, P);                \
  else if constexpr (std::is_same_v<T, __half>)                                       \
    FUSION_WGMMA_SS(N, "f16", FUSION_REGS##H, FUSION_ACC##H, DA, DB, P, TB);          \
  else                                                                                \
    FUSION_WGMMA_SS(N, "bf16", FUSION_REGS##H, FUSION_ACC##H, DA, DB, P, TB);

// d (+)= A @ B, one m64 x N step of K (k16, or k32 for e4m3), for every
// width N a tile may have. (A macro over N alone would need the operand
// numbers computed, which the preprocessor does not do: each width is
// spelled out.)
template <typename T, int N, int kTransB>
struct Wgmma {
  static_assert(N % 16 == 0 && N >= 64 && N <= 256, "wgmma is instantiated for n = 64 to 256 in steps of 16");
  static __device__ __forceinline__ void mma(float (&d)[N / 2], uint64_t a, uint64_t b, int accumulate) {
    if constexpr (N == 64) {
      FUSION_WGMMA_ANY(64, 32, 32, 33, 34, 35)
    } else if constexpr (N == 80) {
      FUSION_WGMMA_ANY(80, 40, 40, 41, 42, 43)
    } else if constexpr (N == 96) {
      FUSION_WGMMA_ANY(96, 48, 48, 49, 50, 51)
    } else if constexpr (N == 112) {
      FUSION_WGMMA_ANY(112, 56, 56, 57, 58, 59)
    } else if constexpr (N == 128) {
      FUSION_WGMMA_ANY(128, 64, 64, 65, 66, 67)
    } else if constexpr (N == 144) {
      FUSION_WGMMA_ANY(144, 72, 72, 73, 74, 75)
    } else if constexpr (N == 160) {
      FUSION_WGMMA_ANY(160, 80, 80, 81, 82, 83)
    } else if constexpr (N == 176) {
      FUSION_WGMMA_ANY(176, 88, 88, 89, 90, 91)
    } else if constexpr (N == 192) {
      FUSION_WGMMA_ANY(192, 96, 96, 97, 98, 99)
    } else if constexpr (N == 208) {
      FUSION_WGMMA_ANY(208, 104, 104, 105, 106, 107)
    } else if constexpr (N == 224) {
      FUSION_WGMMA_ANY(224, 112, 112, 113, 114, 115)
    } else if constexpr (N == 240) {
      FUSION_WGMMA_ANY(240, 120, 120, 121, 122, 123)
    } else if constexpr (N == 256) {
      FUSION_WGMMA_ANY(256, 128, 128, 129, 130, 131)
    }
  }
};

#undef FUSION_WGMMA_ANY
#undef FUSION_WGMMA_SS
#undef FUSION_WGMMA_SS_E4M3
#undef FUSION_REGS128
#undef FUSION_REGS120
#undef FUSION_REGS112
#undef FUSION_REGS104
#undef FUSION_REGS96
#undef FUSION_REGS88
#undef FUSION_REGS80
#undef FUSION_REGS72
#undef FUSION_REGS64
#undef FUSION_REGS56
#undef FUSION_REGS48
#undef FUSION_REGS40
#undef FUSION_REGS32
#undef FUSION_ACC128
#undef FUSION_ACC120
#undef FUSION_ACC112
#undef FUSION_ACC104
#undef FUSION_ACC96
#undef FUSION_ACC88
#undef FUSION_ACC80
#undef FUSION_ACC72
#undef FUSION_ACC64
#undef FUSION_ACC56
#undef FUSION_ACC48
#undef FUSION_ACC40
#undef FUSION_ACC32
#undef FUSION_ACC8

}  // namespace sm90
}  // namespace fusion
