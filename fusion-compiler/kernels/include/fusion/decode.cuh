// The decode kernel: C = Epilogue(Prologue(A) @ Bᵀ) for small M (at most
// kDecodeMaxM rows), where the GEMM is a read of the weight and nothing
// else. A rendered unit runs it instead of FusedGemm for m <= the tuned
// table's `decode_max_m` (kernels/gemm.cu.hbs, `with_kernel`); B must be
// [N, K] (LayoutB::NK, nn.Linear's layout). For [K, N] the regular GEMM runs
// at every M: this kernel's loads rely on each output column's weights being
// contiguous (below), and a [K, N] variant would need its fragments
// transposed through shared memory.
//
// Why this shape of kernel. At (1, 14336, 4096) f16 the GEMM reads 117 MB of
// W and 8 KB of x; the floor is 117 MB / 4.25 TB/s = 27.6 us. On an H200
// (132 SMs, ~1.98 GHz) that is 16 B of W per SM per clock, so everything
// per weight byte has to stay far below what an SM issues per clock:
//
//  - The multiply runs on the tensor cores: mma.sync m16n8k16 (sm_80 PTX,
//    which sm_90 runs too) with A = the M rows of x padded to 16 and B = 8
//    rows of W. Per 16 B of W a lane issues 1 LDG.128 and 2 HMMA (and at
//    most 1 LDG.128 of x, below); the padded flops are 16 rows x 2 per
//    weight element, 16 flop/B, 68 TFLOP/s at the floor: a few percent of
//    the tensor cores' rate. The CUDA-core alternative costs 1 conversion and
//    M FMAs per weight element, 8 elements per SM per clock: at M = 16 that
//    is 128 FMA/clock, the SM's whole FP32 rate, so it cannot keep up there;
//    with mma the instruction count is the same at M = 1 and M = 16.
//  - The weights go straight from global memory into the B fragments, with
//    no shared memory. mma's B fragment gives lane (g = lane / 4,
//    t = lane % 4) row g of the n8 tile and k = 2t, 2t + 1 (b0) and
//    8 + 2t, 8 + 2t + 1 (b1). Which physical k a logical k of the mma stands
//    for does not change the dot product as long as A uses the same map, so
//    lane (g, t) loads 16 contiguous bytes, k = 8t .. 8t + 7 of a 32-wide
//    chunk, and feeds pairs 0, 1 to the chunk's first mma and 2, 3 to its
//    second; its x loads (rows g and g + 8, the same 16 bytes of k) feed the
//    A fragment with the same pairs. One LDG.128 per 16 B of W, every byte
//    of it used once.
//  - x is tiny and read through L1 (ld.global.nc; W bypasses L1 so it does
//    not evict x). Per 32-k chunk a lane loads kTilesPerWarp x 16 B of W and
//    16 B of x per x row it holds (rows g < M, g + 8 < M), so x through L1 is
//    at most 2 / kTilesPerWarp of W (1x with the default 2 tiles; 0.5x at
//    M <= 8), against 128 B/clock of L1 for 16 B/clock of W. x comes from L2
//    once per SM while its M x K x 2 B fit in L1 (128 KB at (16, ., 4096)); at
//    (16, ., 14336) it does not, and more tiles per warp would halve the
//    re-reads (a Config parameter).
//  - Bytes in flight: each warp issues all its loads of kChunksInFlight
//    chunks before the first mma of them: 32 lanes x 2 tiles x 4 chunks x
//    16 B = 4 KB; 8 warps per CTA and at least 2 CTAs per SM (the register
//    cap of __launch_bounds__) give 64 KB per SM. Little's law wants 4.25 TB/s
//    x ~0.8 us of loaded DRAM latency = 3.4 MB in flight, 26 KB per SM.
//    W's loads also ask L2 for the whole 256 B around them (.L2::256B): a
//    warp's 4 chunks are 256 contiguous bytes of each of its rows.
//  - Work split: a CTA owns BN = 8 x kTilesPerWarp output columns over all of
//    K, its warps take interleaved K steps of kChunksInFlight x 32 elements,
//    and one shared-memory reduction adds the warps' partial sums before the
//    epilogue. N / 16 CTAs: 896 at N = 14336 and 256 at N = 4096, enough for
//    132 SMs without splitting K across CTAs (so no second launch, no
//    atomics, and the chain runs once per output pair). Below N = 16 x SMs
//    (2112 on an H200) SMs go idle; a cluster split of K (sm90 DSMEM) would
//    fill them. Measured, a split of K over a cluster of 2 or 4 CTAs with a
//    DSMEM reduction was slower at every shape tried (at (1, 4096, 14336)
//    34.9 and 43.4 us against 33.6 unsplit).
//  - Two shapes of CTA (decode_runs_wide): the deep one, 8 warps on K and 2
//    CTAs an SM, and the wide one, 4 warps on K and 4 CTAs an SM, whose
//    x loads are spread over twice the CTAs in flight. The wide one wins
//    once M passes 8 (x's loads grow with M) where its CTAs fill the SMs;
//    the deep one where N leaves few CTAs (N = 4096: 256).
//  - The ceiling is below the floor of a 512 MB copy: on an H200 a kernel
//    that only streams the 117 MB of W (16-byte loads, 4 in flight a
//    thread) takes 31.5-32 us a call against the 27.6 us floor: the
//    ramp-up and drain of one launch. This kernel runs at 0.92-0.94 of that
//    at M = 1 (34.2 us at (1, 14336, 4096); benchmarks/decode-lab).
//  - The epilogue chain runs once per pair of adjacent columns
//    (Epilogue::apply on a float2), after the reduction: one thread per
//    pair, M x BN / 2 pairs per CTA.
//
// Norm prologues as in FusedGemm: a per-call norm's A is normalized into the
// workspace first (NormPrologue); a folded norm's row statistics are
// computed into the workspace by the light row pass first (FoldedNorm), and
// the correction step reads them. Both are a second, small launch before
// this one.
//
// Not here: choosing when it runs (the tuned table's `decode_max_m`,
// fusion-compiler's select), the regular GEMM (gemm.cuh).
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include "epilogue.cuh"
#include "gemm.cuh"
#include "numeric.cuh"
#include "problem.cuh"
#include "prologue.cuh"
#include "sm80/primitives.cuh"  // mma_16816
#include "workspace.cuh"

namespace fusion {

// The most rows the kernel takes: the M of one m16n8k16 mma.
constexpr int kDecodeMaxM = 16;

// kWarps per CTA split K; each warp computes kTilesPerWarp n8 tiles and
// keeps kChunksInFlight 32-k chunks of loads outstanding; kMinBlocksPerSm
// caps registers through __launch_bounds__. The two a call runs are
// DecodeDeep and DecodeWide (below).
template <int kWarps_, int kTilesPerWarp_, int kChunksInFlight_, int kMinBlocksPerSm_>
struct DecodeConfig {
  static constexpr int kWarps = kWarps_;
  static constexpr int kTilesPerWarp = kTilesPerWarp_;
  static constexpr int kChunksInFlight = kChunksInFlight_;
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int BN = 8 * kTilesPerWarp;  // output columns per CTA
  static constexpr int kChunkK = 32;            // k per lane group of 4 x 16 B
  static constexpr int kStepK = kChunkK * kChunksInFlight;
  static_assert(kThreads <= 1024, "a block has at most 1024 threads");
};

namespace detail {

// 16 bytes of W, read once: not kept in L1, and L2 fetches the 256 bytes
// around it (the rest of this warp's step of the row).
__device__ __forceinline__ uint4 load_streamed(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// 16 bytes of x, which every CTA reads: through L1.
__device__ __forceinline__ uint4 load_cached(const void* p) { return __ldg(static_cast<const uint4*>(p)); }

}  // namespace detail

template <typename T, typename Config, typename Epilogue>
__global__ void __launch_bounds__(Config::kThreads, Config::kMinBlocksPerSm)
    decode_gemm_kernel(const GemmArgs<T> args) {
  constexpr int kTiles = Config::kTilesPerWarp, kChunks = Config::kChunksInFlight;
  constexpr int kPairs = Config::BN / 2;  // output pairs per row of the CTA
  // Each warp's sums, [warp][row][pair], for the reduction across K.
  __shared__ float2 partial[Config::kWarps][kDecodeMaxM][kPairs];

  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;  // mma fragment row and k quad
  const int64_t M = args.m, N = args.n, K = args.k;
  const int64_t n0 = int64_t(blockIdx.x) * Config::BN;

  // This lane's row of W in each n8 tile (null past N, N being a multiple of
  // 8), and its rows g and g + 8 of x (null past M).
  const T* w_row[kTiles];
#pragma unroll
  for (int r = 0; r < kTiles; ++r) w_row[r] = n0 + 8 * r < N ? args.b + (n0 + 8 * r + g) * args.ldb : nullptr;
  const T* x_lo = g < M ? args.a + g * K : nullptr;
  const T* x_hi = g + 8 < M ? args.a + (g + 8) * K : nullptr;

  float acc[kTiles][4] = {};
  for (int64_t k0 = int64_t(warp) * Config::kStepK; k0 < K; k0 += int64_t(Config::kWarps) * Config::kStepK) {
    // Every load of the step first, then the mma's (vectors past K, a
    // multiple of 8, are zero).
    uint4 w[kChunks][kTiles], lo[kChunks], hi[kChunks];
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t k = k0 + c * Config::kChunkK + 8 * t;
      const bool in_k = k < K;
#pragma unroll
      for (int r = 0; r < kTiles; ++r) w[c][r] = in_k && w_row[r] ? detail::load_streamed(w_row[r] + k) : uint4{};
      lo[c] = in_k && x_lo ? detail::load_cached(x_lo + k) : uint4{};
      hi[c] = in_k && x_hi ? detail::load_cached(x_hi + k) : uint4{};
    }
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      // Pairs 0, 1 of each 16-byte vector are the first mma's k, 2, 3 the second's.
      const uint32_t a0[4] = {lo[c].x, hi[c].x, lo[c].y, hi[c].y};
      const uint32_t a1[4] = {lo[c].z, hi[c].z, lo[c].w, hi[c].w};
#pragma unroll
      for (int r = 0; r < kTiles; ++r) {
        const uint32_t b0[2] = {w[c][r].x, w[c][r].y};
        const uint32_t b1[2] = {w[c][r].z, w[c][r].w};
        sm80::mma_16816<T>(acc[r], a0, b0);
        sm80::mma_16816<T>(acc[r], a1, b1);
      }
    }
  }

  // The C fragment: (row g, columns 2t, 2t + 1) and (row g + 8, the same) of
  // each n8 tile.
#pragma unroll
  for (int r = 0; r < kTiles; ++r) {
    partial[warp][g][4 * r + t] = make_float2(acc[r][0], acc[r][1]);
    partial[warp][g + 8][4 * r + t] = make_float2(acc[r][2], acc[r][3]);
  }
  __syncthreads();
  // C's pairs: one per GEMM pair, or for a gated chain one per gate pair
  // (pairs 8j + t of tile 2j; up's are 4 further, in tile 2j + 1).
  constexpr int kCols = Epilogue::kGemmColsPerOutput;
  static_assert(kCols == 1 || kTiles % 2 == 0, "a CTA holds whole gate and up tiles");
  constexpr int kOutPairs = kPairs / kCols;
  const int64_t N_out = N / kCols;
  const auto reduced = [&](int m, int pair) {
    float2 sum = partial[0][m][pair];
#pragma unroll
    for (int w = 1; w < Config::kWarps; ++w) {
      sum.x += partial[w][m][pair].x;
      sum.y += partial[w][m][pair].y;
    }
    return sum;
  };
  for (int i = threadIdx.x; i < M * kOutPairs; i += Config::kThreads) {
    const int m = i / kOutPairs, q = i % kOutPairs;
    const int64_t n = n0 / kCols + 2 * q;
    if (n >= N_out) continue;
    if constexpr (Epilogue::kGated) {
      const int gate = 8 * (q / 4) + q % 4;
      store_pair(args.c + m * N_out + n,
                 Epilogue::template apply<T>(reduced(m, gate), reduced(m, gate + 4), m, n, N_out, args.epilogue));
    } else {
      store_pair(args.c + m * N_out + n, Epilogue::template apply<T>(reduced(m, q), m, n, N_out, args.epilogue));
    }
  }
}

// The two CTA shapes a call runs (decode_runs_wide).
using DecodeDeep = DecodeConfig<8, 2, 4, 2>;
using DecodeWide = DecodeConfig<4, 2, 4, 4>;

// Whether an m-row GEMM over n columns runs DecodeWide rather than
// DecodeDeep on `sms` SMs: when m > 8 and its CTAs (one per 16 columns)
// fill every SM at least 2.5 times. Measured on an H200 (f16, plain GEMM,
// us a call, wide against deep): (16, 14336, 4096) 35.3 vs 38.1,
// (16, 28672, 4096) 63.8 vs 66.1, (16, 6144, 4096) 19.1 vs 20.6, with the
// deep one ahead where N = 4096 gives 256 CTAs: (16, 4096, 14336) 39.3 vs
// 36.3, (16, 4096, 4096) 16.2 vs 14.9. At m <= 8 they are level at
// N = 14336 and the deep one is 1.7% ahead at (1, 28672, 4096).
inline bool decode_runs_wide(int64_t m, int64_t n, int sms) {
  const int64_t ctas = (n + DecodeWide::BN - 1) / DecodeWide::BN;
  return m > 8 && 2 * ctas >= 5 * int64_t(sms);
}

// The launch interface of FusedGemm (check, workspace_bytes, launch) for
// the decode kernel. Epilogue_ is the graph's chain; a folded norm adds its
// correction in front of it.
template <typename T, LayoutB kLayout, typename Prologue, typename Epilogue_>
struct DecodeGemm {
  static_assert(kLayout == LayoutB::NK, "the decode kernel streams W as [N, K] rows (see the top of decode.cuh)");
  static_assert(DecodeDeep::BN == DecodeWide::BN, "both CTA shapes own the same columns");
  using Element = T;
  using Epilogue = typename WithFoldedNorm<Prologue, Epilogue_>::type;
  static constexpr size_t kSmemBytes = 0;  // dynamic; the partial sums are static
  // The most threads a block asks for, of the two shapes.
  static constexpr int kThreads =
      DecodeDeep::kThreads > DecodeWide::kThreads ? DecodeDeep::kThreads : DecodeWide::kThreads;

  // check_gemm_args, at most kDecodeMaxM rows, and a grid that fits.
  static cudaError_t check(const GemmArgs<T>& p) {
    const cudaError_t err = check_gemm_args<Prologue, Epilogue, kLayout>(p);
    if (err != cudaSuccess) return err;
    if (p.m > kDecodeMaxM || (p.n + DecodeDeep::BN - 1) / DecodeDeep::BN > int64_t(INT32_MAX))
      return cudaErrorInvalidValue;
    return cudaSuccess;
  }

  // A folded norm's row statistics, and what prepare_operands writes
  // (gemm.cuh: a per-call norm's normalized A, a gated GEMM's interleaved B).
  static WorkspaceLayout workspace_layout(const GemmArgs<T>& p) {
    return WorkspaceLayout::of(0, Prologue::kRowStats ? row_stats_bytes(p.m) : 0, normalized_bytes_of<Prologue>(p),
                               interleaved_bytes_of<Epilogue>(p));
  }

  static cudaError_t workspace_bytes(const GemmArgs<T>& p, uint32_t /*flags*/, size_t* bytes) {
    *bytes = 0;
    // A call the launch refuses, or one with nothing to compute, needs none.
    if (check(p) != cudaSuccess || p.m == 0 || p.n == 0) return cudaSuccess;
    *bytes = workspace_layout(p).bytes;
    return cudaSuccess;
  }

  static cudaError_t launch(const GemmArgs<T>& p, const Workspace& workspace, cudaStream_t stream) {
    cudaError_t err = check(p);
    if (err != cudaSuccess) return err;
    if (p.m == 0 || p.n == 0) return cudaSuccess;
    const WorkspaceLayout layout = workspace_layout(p);
    if (!workspace.holds(layout)) return cudaErrorInvalidValue;
    GemmArgs<T> args;
    err = prepare_operands<Prologue, Epilogue, kLayout>(p, workspace, layout, stream, &args);
    if (err != cudaSuccess) return err;
    err = prepare_row_stats<Prologue>(p, workspace, layout, stream, &args);
    if (err != cudaSuccess) return err;
    const int sms = detail::current_sm_count();
    const unsigned blocks = unsigned((p.n + DecodeDeep::BN - 1) / DecodeDeep::BN);
    if (decode_runs_wide(p.m, p.n, sms)) {
      decode_gemm_kernel<T, DecodeWide, Epilogue><<<blocks, DecodeWide::kThreads, 0, stream>>>(args);
    } else {
      decode_gemm_kernel<T, DecodeDeep, Epilogue><<<blocks, DecodeDeep::kThreads, 0, stream>>>(args);
    }
    return cudaGetLastError();
  }
};

// The decode kernel of the same element type, B layout, prologue and chain
// as a FusedGemm, for a unit's `with_kernel`.
template <typename Gemm>
struct DecodeOfGemm;
template <template <typename, LayoutB, typename> class Mainloop, typename T, LayoutB kLayout, typename Tile,
          typename Prologue, typename Epilogue>
struct DecodeOfGemm<FusedGemm<Mainloop<T, kLayout, Tile>, Prologue, Epilogue>> {
  using type = DecodeGemm<T, kLayout, Prologue, Epilogue>;
};
template <typename Gemm>
using DecodeFor = typename DecodeOfGemm<Gemm>::type;

}  // namespace fusion
