// The norm prologue of a fused GEMM: C = epilogue(norm(A) @ B) where norm is
// LayerNorm or RMSNorm over A's rows, without norm(A) ever reaching device
// memory.
//
// Design. At kernel start each CTA computes (mean, rstd) for its BM rows of A
// into shared memory (one warp per row at a time, f32, 16-byte loads). Then,
// whenever a BM x BK tile of A reaches shared memory, the threads that copied
// it normalize their own 16-byte chunks in place, (x - mean) * rstd * gamma[k]
// (+ beta[k]), before the barrier that precedes the tensor-core reads. Why
// this and not the alternatives:
//  - The mainloop is unchanged for kernels without a norm: the hook is one
//    `if constexpr (Prologue::kNormalizesA)` on a type that is `NoPrologue`.
//  - No weight preprocessing, for norms whose gamma and beta come with
//    every call (weights bound once are folded instead: FoldedNorm below).
//  - Cost: each CTA re-reads its BM rows of A once for the statistics (from
//    L2 after the first CTA of a tile row), plus one pass over each A tile in
//    shared memory. The normalized values are rounded to the element type
//    before the multiply, as an unfused norm kernel would store them.
// Chunks past K (zero-filled by the predicated loads) stay zero: gamma and
// beta are not read there. Rows past M get mean = rstd = 0; they feed only
// output rows that are never stored.
//
// When gamma and beta are weights, bound once, the norm need not touch A at
// all: FoldedNorm below runs the mainloop on the raw rows against weights
// folded when they were bound (fold.cuh) and corrects the accumulators in
// the epilogue (epilogue.cuh, FoldedNormStep). NormPrologue stays for norms
// whose gamma and beta come with every call.
//
// The sm90 mainloop is persistent: a CTA walks many tiles, and recomputing
// each tile's statistics would read its BM rows of A once per tile column.
// So its launcher runs a first pass (`launch_row_stats`) that writes every
// row's statistics to a buffer of the stream's memory pool, and its
// consumers normalize their rows of each A stage in shared memory before
// they issue the stage's wgmmas (sm90/collective_mainloop.cuh, normalize_stage).
#pragma once

#include "epilogue.cuh"
#include "norm.cuh"
#include "problem.cuh"

namespace fusion {

// The mainloop hook when the kernel has no norm: compiles to nothing.
struct NoPrologue {
  static constexpr bool kEnabled = false;  // no row statistics
  static constexpr bool kNormalizesA = false;
  static constexpr const char* name = "";
  static bool args_valid(const NormArgs&) { return true; }
};

template <NormKind kKind_>
struct NormPrologue {
  static constexpr NormKind kKind = kKind_;
  static constexpr bool kEnabled = true;  // row statistics, computed before the K loop
  static constexpr bool kNormalizesA = true;
  static constexpr const char* name = kKind == NormKind::LayerNorm ? "layernorm" : "rmsnorm";
  static bool args_valid(const NormArgs& a) { return norm_args_valid<kKind>(a); }

  // Statistics of all M rows into stats[M] on `stream` (the sm90 mainloop's
  // first pass; its CTAs walk many tiles and read them from there).
  template <typename T>
  static cudaError_t launch_row_stats(const T* a, RowStats* stats, int64_t M, int64_t K, const NormArgs& args,
                                      cudaStream_t stream) {
    return fusion::launch_row_stats<kKind, T>(a, stats, args.eps, M, K, stream);
  }

  // Statistics of rows [m0, m0 + kRows) into `stats`; all threads of the CTA
  // call this, and the caller synchronizes before the first use.
  template <typename T, int kRows, int kThreads>
  static __device__ __forceinline__ void compute_row_stats(const T* a, int64_t m0, int64_t M, int64_t K,
                                                           const NormArgs& args, RowStats* stats) {
    constexpr int kWarps = kThreads / 32;
    for (int r = threadIdx.x / 32; r < kRows; r += kWarps) {
      const int64_t m = m0 + r;
      RowStats s{0.0f, 0.0f};
      if (m < M) s = warp_row_stats<kKind>(a + m * K, K, args.eps);
      if ((threadIdx.x & 31) == 0) stats[r] = s;
    }
  }

  // The same for a chunk whose columns' gamma and beta are already loaded
  // (load_norm_columns): the sm90 mainloop loads them once for the chunks of
  // several rows, before it waits for the stage.
  template <typename T>
  static __device__ __forceinline__ void apply(Vec8<T>& chunk, RowStats stats, const NormColumns& columns) {
    float x[8];
    vec8_to_float(chunk, x);
    normalize8<kKind>(x, stats, columns);
    chunk = float_to_vec8<T>(x);
  }

  template <typename T>
  static __device__ __forceinline__ NormColumns columns(int64_t k0, const NormArgs& args) {
    return load_norm_columns<kKind, T>(k0, args);
  }

  // Normalizes one 16-byte chunk of row `local_row` of the CTA's A tile,
  // holding columns [k0, k0 + 8).
  template <typename T>
  static __device__ __forceinline__ void apply(Vec8<T>& chunk, int local_row, int64_t k0, int64_t K,
                                               const NormArgs& args, const RowStats* stats) {
    if (k0 < K) apply<T>(chunk, stats[local_row], columns<T>(k0, args));
  }
};

using LayerNormPrologue = NormPrologue<NormKind::LayerNorm>;
using RmsNormPrologue = NormPrologue<NormKind::RmsNorm>;

// The norm folded into B: LN(x)·Wᵀ = rstd ⊙ (x·W′ᵀ − mean·u) + c with
// W′ = W·diag(gamma), u = rowsum(W′), c = W·beta (RMSNorm: rstd ⊙ x·W′ᵀ).
// The kernel's B is W′ (fold.cuh folds it once, when the weights are
// bound), the mainloop multiplies the raw A at full speed, and the row
// statistics, computed as for the prologue, reach the epilogue, whose first
// step applies them (FusedGemm puts FoldedNormStep in front of the chain).
// gamma and beta are not read at run time.
template <NormKind kKind_>
struct FoldedNorm : NormPrologue<kKind_> {
  static constexpr bool kNormalizesA = false;
  static constexpr const char* name = kKind_ == NormKind::LayerNorm ? "folded_layernorm" : "folded_rmsnorm";
  static bool args_valid(const NormArgs& a) { return a.eps >= 0.0f; }
};

using FoldedLayerNorm = FoldedNorm<NormKind::LayerNorm>;
using FoldedRmsNorm = FoldedNorm<NormKind::RmsNorm>;

// The epilogue chain a kernel runs: Epilogue, behind a folded norm's
// correction when the prologue is one.
template <typename Prologue, typename Epilogue>
struct WithFoldedNorm {
  using type = Epilogue;
};
template <NormKind kKind, typename... Steps>
struct WithFoldedNorm<FoldedNorm<kKind>, EpilogueChain<Steps...>> {
  using type = EpilogueChain<FoldedNormStep<kKind == NormKind::LayerNorm>, Steps...>;
};

// Bytes of the row statistics of an m-row A in a workspace: rounded up to
// whole 256-row tiles, so that an epilogue may read the statistics of a
// tile's rows past M (whose results are never stored) without a check.
inline size_t row_stats_bytes(int64_t m) { return size_t((m + 255) / 256 * 256) * sizeof(RowStats); }

}  // namespace fusion
