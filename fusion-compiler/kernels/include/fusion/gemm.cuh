// The fused GEMM kernel template and its host launcher.
//
//   C = Epilogue(Prologue(A) @ B)
//
// `fused_gemm_kernel<Mainloop, Prologue, Epilogue>` picks the CTA's output
// tile (grouped order, below), computes a folded norm's row statistics for
// its rows if there is one (prologue.cuh), and hands over to the mainloop, which owns the K loop and,
// because the accumulator layout is its own, the final store through the
// epilogue chain. `FusedGemm<...>::launch` checks the problem and launches
// with the workspace its caller sized with `workspace_bytes` (workspace.cuh).
// A rendered kernel unit (kernels/gemm.cu.hbs) is a typedef of FusedGemm
// plus plain-C entry points around `launch` and `workspace_bytes`.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <type_traits>

#include "epilogue.cuh"
#include "gated.cuh"
#include "numeric.cuh"
#include "problem.cuh"
#include "prologue.cuh"
#include "workspace.cuh"

namespace fusion {

// Output tiles consecutive in launch order share B columns and A rows: they
// walk down a group of kGroupRows tile rows before moving one tile column
// right, so the ~hundred CTAs resident at once touch a compact block of C and
// re-read A and B from L2 rather than from device memory.
// A mainloop may choose its own group height with a `kGroupRows` member.
constexpr int kGroupRows = 8;

template <typename Mainloop, typename = void>
struct GroupRowsOf {
  static constexpr int value = kGroupRows;
};
template <typename Mainloop>
struct GroupRowsOf<Mainloop, decltype(void(Mainloop::kGroupRows))> {
  static constexpr int value = Mainloop::kGroupRows;
};

template <int kRows = kGroupRows>
__device__ __forceinline__ TileCoord grouped_tile_order(int64_t block, int64_t tiles_m, int64_t tiles_n, int bm,
                                                        int bn) {
  const int64_t tiles_per_group = int64_t(kRows) * tiles_n;
  const int64_t group = block / tiles_per_group;
  const int64_t first_m = group * kRows;
  const int64_t rows_in_group = tiles_m - first_m < kRows ? tiles_m - first_m : kRows;
  const int64_t in_group = block % tiles_per_group;
  const int64_t tile_m = first_m + in_group % rows_in_group;
  const int64_t tile_n = in_group / rows_in_group;
  return {tile_m * bm, tile_n * bn};
}

// A mainloop with a kernel of its own (sm90's persistent, warp-specialized
// one) says so with `kOwnsKernel`; FusedGemm then checks the problem and
// hands the launch to `Mainloop::launch<Prologue, Epilogue>`, and the
// workspace query to `Mainloop::workspace_layout<Prologue>`. The others
// (sm80, sm75) need a workspace only for a per-call norm's normalized A:
// their CTAs keep a folded norm's row statistics in shared memory.
template <typename Mainloop, typename = void>
struct OwnsKernel {
  static constexpr bool value = false;
};
template <typename Mainloop>
struct OwnsKernel<Mainloop, decltype(void(Mainloop::kOwnsKernel))> {
  static constexpr bool value = Mainloop::kOwnsKernel;
};

// Whether Mainloop's epilogue can run the chain Epilogue on its tile
// config: sm90's brings a source tile (residual, multiplier) into its
// staging tile, which must then hold the whole share of C
// (sm90::Mainloop::epilogue_fits); the others read source tiles from
// global memory and take any chain.
template <typename Mainloop, typename Epilogue, bool = OwnsKernel<Mainloop>::value>
struct EpilogueFits {
  static constexpr bool value = true;
};
template <typename Mainloop, typename Epilogue>
struct EpilogueFits<Mainloop, Epilogue, true> {
  static constexpr bool value = Mainloop::template epilogue_fits<Epilogue>();
};

template <typename Mainloop, typename Prologue, typename Epilogue>
__global__ void __launch_bounds__(Mainloop::kThreads, Mainloop::kMinBlocksPerSm)
    fused_gemm_kernel(const GemmArgs<typename Mainloop::Element> args) {
  extern __shared__ __align__(128) unsigned char smem[];
  __shared__ RowStats row_stats[Prologue::kRowStats ? Mainloop::BM : 1];
  const int64_t tiles_m = (args.m + Mainloop::BM - 1) / Mainloop::BM;
  const int64_t tiles_n = (args.n + Mainloop::BN - 1) / Mainloop::BN;
  const TileCoord tile =
      grouped_tile_order<GroupRowsOf<Mainloop>::value>(blockIdx.x, tiles_m, tiles_n, Mainloop::BM, Mainloop::BN);
  if constexpr (Prologue::kRowStats) {
    Prologue::template compute_row_stats<typename Mainloop::Element, Mainloop::BM, Mainloop::kThreads>(
        args.a, tile.m0, args.m, args.k, args.norm, row_stats);
    __syncthreads();
    // A folded norm's correction reads them in the epilogue.
    GemmArgs<typename Mainloop::Element> tile_args = args;
    tile_args.epilogue.row_stats = row_stats;
    tile_args.epilogue.row_stats_m0 = tile.m0;
    Mainloop::template operator_body<Epilogue>(tile_args, tile, smem);
  } else {
    Mainloop::template operator_body<Epilogue>(args, tile, smem);
  }
}

namespace detail {

// Host code keeps no state between launches (no caches, locks or
// allocations: the caller owns everything), so what a launch needs to know
// about the device it asks each time, as the norm and elementwise
// launchers always have.

// Raises `kernel`'s dynamic shared-memory limit to `bytes` (an attribute of
// the kernel in the current context) before each launch.
template <typename Kernel>
cudaError_t raise_smem_limit(Kernel* kernel, int bytes) {
  return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

// SMs of `device` (1 if the query fails).
inline int sm_count(int device) {
  int n = 0;
  return cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) == cudaSuccess && n > 0 ? n : 1;
}

// SMs of the current device (1 if a query fails).
inline int current_sm_count() {
  int device = 0;
  return cudaGetDevice(&device) == cudaSuccess ? sm_count(device) : 1;
}

// Waves of tile area an m x n output needs with BM x BN tiles on `sms`
// SMs, one tile per SM at a time: ceil(tiles / sms) * BM * BN.
inline int64_t wave_area(int64_t m, int64_t n, int bm, int bn, int sms) {
  const int64_t tiles = ((m + bm - 1) / bm) * ((n + bn - 1) / bn);
  return (tiles + sms - 1) / sms * bm * bn;
}

// The same for tile config Tile.
template <typename Tile>
int64_t wave_area_of(int64_t m, int64_t n, int sms) {
  return wave_area(m, n, Tile::BM, Tile::BN, sms);
}

}  // namespace detail

// Whether tile config A (with more rows) should run an m x n output rather
// than B, on the current device: A when it needs no more waves of tile
// area (a tie goes to A, whose larger tiles read fewer bytes per flop).
// At m = 128 on 132 SMs: for n = 14336 the 128x128 tile (112 tiles, one
// wave) rather than 64x128 (224 tiles, two waves of half the area); for
// n = 4096 the 64x128 tile (64 tiles) rather than 128x128 (32 tiles, one
// wave of twice the area).
template <typename TileA, typename TileB>
bool fewer_waves(int64_t m, int64_t n) {
  const int sms = detail::current_sm_count();
  return detail::wave_area_of<TileA>(m, n, sms) <= detail::wave_area_of<TileB>(m, n, sms);
}

// Whether the narrower tile config Alt should run an m x n output rather
// than Large, on the current device: Alt when it needs at most 9/10 of
// Large's waves of tile area. The margin is Large's lead per unit of area
// (more flops per byte loaded, and, where the caller asks for it, stream-K
// over its last wave, which Alt's count of waves does not see): on an H200 (f16, benchmarks/HISTORY.md v21) the
// 128x192 tile took 13.5, 31.9 and 187 us against 15.2, 36.5 and 231 for
// 128x256 at (768, 3072, 768), (4096, 768, 3072) and (1000, 18944, 3584),
// whose areas are 0.75, 0.75 and 0.90 of 128x256's, and was 3-4% slower at
// 8192^3 and (8192, 14336, 4096), at 0.98 and 0.99.
template <typename Alt, typename Large>
bool clearly_fewer_waves(int64_t m, int64_t n) {
  const int sms = detail::current_sm_count();
  return 10 * detail::wave_area_of<Alt>(m, n, sms) <= 9 * detail::wave_area_of<Large>(m, n, sms);
}

// The deepest K at which the few-M tile (gemm.cu.hbs's FewMTile) runs two
// rows of its tiles; deeper, one. fusion-compiler's select::FEW_M_DEEP_K
// copies it.
constexpr int64_t kFewMDeepK = 8192;

// Whether a launch of an `m` x `n` output over `k` runs the few-M tile, a
// 64-row tile offered ahead of the tiers: where its tiles make one wave on
// the current device's SMs in one row, or in two where K is at most
// kFewMDeepK. There K is split over fewer CTAs or none, where the 64x128
// tile's fewer tiles split it further and its partial tiles' fix-ups cost
// more than they save at M = 64 and 128; deeper, two rows of
// whole-K tiles load each k-block of B twice per column and lose to the
// 64x128 tile with K split (benchmarks/HISTORY.md v34).
template <typename Tile>
bool few_m_runs(int64_t m, int64_t n, int64_t k) {
  const int64_t rows = (m + Tile::BM - 1) / Tile::BM;
  if (rows > 2 || (rows == 2 && k > kFewMDeepK)) return false;
  return rows * ((n + Tile::BN - 1) / Tile::BN) <= detail::current_sm_count();
}

// The sm90 launchers' choice among a unit's tile configs for an m x n
// output on the current device: the one whose busiest CTA loads the fewest
// operand elements per k-block step, waves x (BM + BN), as a tile's
// k-block costs the bytes it loads more than the flops it does (its MMAs
// run at BM * BN / (BM + BN) of the 128x256 tile's rate: measured over
// the corpus's layers in every tier on an H100, benchmarks/HISTORY.md
// v28); on a tie, the one whose last wave leaves the fewest loads idle,
// (waves x SMs - tiles) x (BM + BN), then the first offered: at
// (1000, 18944, 3584) 128x192 (6 whole waves) rather than 128x256 (4.5),
// 187 us against 231 on an H200 (v21). Offer each candidate with its tier
// code (FUSION_GEMM_TILE_*) and read `tier`.
class LightestTier {
 public:
  LightestTier(int64_t m, int64_t n) : m_(m), n_(n), sms_(detail::current_sm_count()) {}

  template <typename Tile>
  void offer(int tier) {
    const int64_t tiles = ((m_ + Tile::BM - 1) / Tile::BM) * ((n_ + Tile::BN - 1) / Tile::BN);
    const int64_t waves = (tiles + sms_ - 1) / sms_;
    const int64_t loads = waves * (Tile::BM + Tile::BN);
    const int64_t idle = (waves * sms_ - tiles) * (Tile::BM + Tile::BN);
    if (tier_ < 0 || loads < loads_ || (loads == loads_ && idle < idle_)) {
      tier_ = tier;
      loads_ = loads;
      idle_ = idle;
    }
  }

  // The chosen tier's code; -1 before any offer.
  int tier() const { return tier_; }

 private:
  int64_t m_, n_;
  int sms_;
  int tier_ = -1;
  int64_t loads_ = 0, idle_ = 0;
};

// What every GEMM kernel family relies on (FusedGemm, and the decode
// kernel of decode.cuh). Returns cudaErrorInvalidValue when M is negative,
// N is not a multiple of 8 (a gated GEMM's C columns too), K is 0 or its
// rows are not whole 16-byte units (a multiple of 8, or of 16 for FP8), B's
// row stride is shorter than its rows or not whole 16-byte units, a pointer the
// composition reads is null or not 16-byte aligned, or an up weight comes
// with a chain that is not gated, with B already folded or with B's rows
// strided (the interleave reads dense ones).
template <typename Prologue, typename Epilogue, LayoutB kLayout, typename T>
cudaError_t check_gemm_args(const GemmArgs<T>& p) {
  if (p.m < 0 || p.n < 0 || p.k <= 0) return cudaErrorInvalidValue;
  if (p.n % (kVecElems * Epilogue::kGemmColsPerOutput) != 0 || !whole_16_bytes<T>(p.k)) return cudaErrorInvalidValue;
  if (p.ldb < b_row_length<kLayout>(p) || !whole_16_bytes<T>(p.ldb)) return cudaErrorInvalidValue;
  if (p.b_up != nullptr && p.ldb != b_row_length<kLayout>(p)) return cudaErrorInvalidValue;
  if (p.b_up != nullptr && (!Epilogue::kGated || Prologue::kRowStats || !is_aligned16(p.b_up)))
    return cudaErrorInvalidValue;
  if (p.a == nullptr || p.b == nullptr || p.c == nullptr) return cudaErrorInvalidValue;
  if (!is_aligned16(p.a) || !is_aligned16(p.b) || !is_aligned16(p.c)) return cudaErrorInvalidValue;
  if (!Epilogue::args_valid(p.epilogue) || !Prologue::args_valid(p.norm)) return cudaErrorInvalidValue;
  const void* extra[] = {p.epilogue.bias,      p.epilogue.residual, p.epilogue.multiplier,
                         p.epilogue.col_terms, p.epilogue.scale_a,  p.epilogue.scale_b};
  for (const void* ptr : extra)
    if (ptr != nullptr && !is_aligned16(ptr)) return cudaErrorInvalidValue;
  return cudaSuccess;
}

// What a launch computes into its workspace before the GEMM, from the
// call's own operands: a per-call norm's normalized A, and a gated GEMM's
// interleaved B when the call passes gate and up apart (b_up). Every GEMM
// launcher (FusedGemm's, sm90's, the decode kernel's) sizes its workspace
// with these and runs prepare_operands first.
template <typename Prologue, typename T>
size_t normalized_bytes_of(const GemmArgs<T>& p) {
  return Prologue::kNormalizesA ? normalized_bytes<T>(p.m, p.k) : 0;
}
template <typename Epilogue, typename T>
size_t interleaved_bytes_of(const GemmArgs<T>& p) {
  return Epilogue::kGated && p.b_up != nullptr ? interleaved_bytes<T>(p.n / 2, p.k) : 0;
}

// Writes them into the regions of `layout` and points `args` (a copy of
// p) at them; the GEMM then runs on args without a norm prologue (when
// it normalized A) and without b_up.
template <typename Prologue, typename Epilogue, LayoutB kLayout, typename T>
cudaError_t prepare_operands(const GemmArgs<T>& p, const Workspace& workspace, const WorkspaceLayout& layout,
                             cudaStream_t stream, GemmArgs<T>* args) {
  *args = p;
  if constexpr (Prologue::kNormalizesA) {
    T* normalized = workspace.at<T>(layout.normalized);
    const cudaError_t err = Prologue::launch_normalize(p.a, normalized, p.m, p.k, p.norm, stream);
    if (err != cudaSuccess) return err;
    args->a = normalized;
  }
  if constexpr (Epilogue::kGated) {
    if (p.b_up != nullptr) {
      T* interleaved = workspace.at<T>(layout.interleaved);
      const cudaError_t err = launch_interleave<T, kLayout>(p.b, p.b_up, interleaved, p.n / 2, p.k, 0, stream);
      if (err != cudaSuccess) return err;
      args->b = interleaved;
      args->b_up = nullptr;
      args->ldb = b_row_length<kLayout>(p);  // written dense
    }
  }
  return cudaSuccess;
}

// A folded norm's row statistics of all of A, into the workspace's region,
// for launchers whose CTAs do not compute their own (sm90's persistent
// ones, the decode kernel's); the correction step of `args` reads them.
template <typename Prologue, typename T>
cudaError_t prepare_row_stats(const GemmArgs<T>& p, const Workspace& workspace, const WorkspaceLayout& layout,
                              cudaStream_t stream, GemmArgs<T>* args) {
  if constexpr (Prologue::kRowStats) {
    RowStats* row_stats = workspace.at<RowStats>(layout.row_stats);
    const cudaError_t err = Prologue::launch_row_stats(p.a, row_stats, p.m, p.k, p.norm, stream);
    if (err != cudaSuccess) return err;
    args->epilogue.row_stats = row_stats;
    args->epilogue.row_stats_m0 = 0;
  }
  return cudaSuccess;
}

// The prologue the GEMM runs with after prepare_operands.
template <typename Prologue>
using PreparedPrologue = std::conditional_t<Prologue::kNormalizesA, NoPrologue, Prologue>;

// Epilogue_ is the graph's chain; a folded norm (prologue.cuh) adds its
// correction in front of it.
template <typename Mainloop, typename Prologue, typename Epilogue_>
struct FusedGemm {
  using Element = typename Mainloop::Element;
  using Epilogue = typename WithFoldedNorm<Prologue, Epilogue_>::type;
  static_assert(!Prologue::kRowStats || Mainloop::BM <= 256, "row statistics are padded to 256-row tiles");
  // What a launch asks for per block: dynamic shared memory and threads
  // (which the generated units report through their `_resources` functions).
  static constexpr size_t kSmemBytes = size_t(Mainloop::kSmemBytes);
  static constexpr int kThreads = Mainloop::kThreads;
  // All the shared memory a block uses: the dynamic part and, where
  // fused_gemm_kernel runs the mainloop, its static row statistics (which
  // the generated units check against the mainloop's kSmemPerBlock).
  static constexpr size_t kBlockSmemBytes =
      kSmemBytes + (OwnsKernel<Mainloop>::value ? 0 : sizeof(RowStats) * (Prologue::kRowStats ? Mainloop::BM : 1));
  // Whether the tile config can run the epilogue chain (the generated units
  // assert it, naming the tuned entry).
  static constexpr bool kEpilogueFits = EpilogueFits<Mainloop, Epilogue>::value;

  // Kernel-level checks of everything the kernel relies on (check_gemm_args)
  // and a grid that fits.
  static cudaError_t check(const GemmArgs<Element>& p) {
    const cudaError_t err = check_gemm_args<Prologue, Epilogue, Mainloop::kLayout>(p);
    if (err != cudaSuccess) return err;
    const int64_t tiles = ((p.m + Mainloop::BM - 1) / Mainloop::BM) * ((p.n + Mainloop::BN - 1) / Mainloop::BN);
    if (tiles > int64_t(INT32_MAX)) return cudaErrorInvalidValue;
    return cudaSuccess;
  }

  static dim3 grid(const GemmArgs<Element>& p) {
    const int64_t tiles = ((p.m + Mainloop::BM - 1) / Mainloop::BM) * ((p.n + Mainloop::BN - 1) / Mainloop::BN);
    return dim3(unsigned(tiles));
  }

  // The bytes of workspace `launch` would use for p with `flags` (abi.h's
  // FUSION_GEMM_*) on the current device; 0 when it needs none.
  static cudaError_t workspace_bytes(const GemmArgs<Element>& p, uint32_t flags, size_t* bytes) {
    *bytes = 0;
    // A call the launch refuses, or one with nothing to compute, needs none.
    if (check(p) != cudaSuccess || p.m == 0 || p.n == 0) return cudaSuccess;
    if constexpr (OwnsKernel<Mainloop>::value) {
      WorkspaceLayout layout;
      const cudaError_t err = Mainloop::template workspace_layout<Prologue, Epilogue>(p, flags, &layout);
      *bytes = layout.bytes;
      return err;
    } else {
      (void)flags;
      *bytes = prepared_layout(p).bytes;
      return cudaSuccess;
    }
  }

  static cudaError_t launch(const GemmArgs<Element>& p, const Workspace& workspace, cudaStream_t stream) {
    cudaError_t err = check(p);
    if (err != cudaSuccess) return err;
    if (p.m == 0 || p.n == 0) return cudaSuccess;
    if constexpr (OwnsKernel<Mainloop>::value) {
      return Mainloop::template launch<Prologue, Epilogue>(p, workspace, stream);
    } else {
      // A's rows normalized and B interleaved into the workspace where the
      // call asks for it (prepare_operands), then the kernel.
      const WorkspaceLayout layout = prepared_layout(p);
      if (!workspace.holds(layout)) return cudaErrorInvalidValue;
      GemmArgs<Element> args;
      err = prepare_operands<Prologue, Epilogue, Mainloop::kLayout>(p, workspace, layout, stream, &args);
      if (err != cudaSuccess) return err;
      using Run = PreparedPrologue<Prologue>;
      err = detail::raise_smem_limit(fused_gemm_kernel<Mainloop, Run, Epilogue>, int(Mainloop::kSmemBytes));
      if (err != cudaSuccess) return err;
      fused_gemm_kernel<Mainloop, Run, Epilogue><<<grid(p), Mainloop::kThreads, Mainloop::kSmemBytes, stream>>>(args);
      return cudaGetLastError();
    }
  }

 private:
  // The workspace of a mainloop without a kernel of its own: only what
  // prepare_operands writes (its CTAs keep a folded norm's row statistics
  // in shared memory).
  static WorkspaceLayout prepared_layout(const GemmArgs<Element>& p) {
    return WorkspaceLayout::of(0, 0, normalized_bytes_of<Prologue>(p), interleaved_bytes_of<Epilogue>(p));
  }
};

}  // namespace fusion
