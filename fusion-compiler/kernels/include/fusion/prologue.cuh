// The norm before a fused GEMM: C = epilogue(norm(A) @ B) where norm is
// LayerNorm or RMSNorm over A's rows. Two ways, chosen by where gamma and
// beta come from:
//
//  - FoldedNorm, for gamma and beta bound once as weights: the norm is
//    folded into B (W' = W·diag(gamma), fold.cuh, when the weights are
//    bound), the mainloop multiplies the raw A at full speed, and the
//    epilogue's first step corrects the accumulators with each row's
//    (mean, rstd) and each column's (rowsum of W', W·beta)
//    (epilogue.cuh, FoldedNormStep). The normalized A is never written.
//    The row statistics come from a light pass over A into the workspace
//    (sm90, whose persistent CTAs walk many tiles), or from the CTA itself
//    for its BM rows into shared memory (sm80, sm75).
//  - NormPrologue, for gamma and beta that come with every call: the
//    launcher normalizes A's rows into the workspace with the standalone
//    norm kernel (norm.cuh), then runs the plain GEMM on them: the unfused
//    split, in one launcher. Normalizing each stage of A in shared memory
//    inside the mainloop, as this used to, stalled the wgmma pipeline and
//    lost to that split at every measured shape (benchmarks/HISTORY.md).
//
// Rows past M get mean = rstd = 0 (or, in the workspace, whatever the
// padding holds); they feed only output rows that are never stored.
#pragma once

#include "epilogue.cuh"
#include "norm.cuh"
#include "problem.cuh"

namespace fusion {

// No norm: the kernel's hooks compile to nothing.
struct NoPrologue {
  static constexpr bool kRowStats = false;     // the kernel reads row statistics
  static constexpr bool kNormalizesA = false;  // the launcher normalizes A first
  static constexpr const char* name = "";
  static bool args_valid(const NormArgs&) { return true; }
};

// A norm with gamma and beta per call: A normalized into the workspace by
// the launcher (launch_normalize), then the plain GEMM.
template <NormKind kKind_>
struct NormPrologue {
  static constexpr NormKind kKind = kKind_;
  static constexpr bool kRowStats = false;
  static constexpr bool kNormalizesA = true;
  static constexpr const char* name = kKind == NormKind::LayerNorm ? "layernorm" : "rmsnorm";
  static bool args_valid(const NormArgs& a) { return norm_args_valid<kKind>(a); }

  template <typename T>
  static cudaError_t launch_normalize(const T* a, T* normalized, int64_t M, int64_t K, const NormArgs& args,
                                      cudaStream_t stream) {
    return launch_norm_rows_with<kKind, T>(a, normalized, args, M, K, stream);
  }
};

using LayerNormPrologue = NormPrologue<NormKind::LayerNorm>;
using RmsNormPrologue = NormPrologue<NormKind::RmsNorm>;

// The norm folded into B: LN(x)·Wᵀ = rstd ⊙ (x·W′ᵀ − mean·u) + c with
// W′ = W·diag(gamma), u = rowsum(W′), c = W·beta (RMSNorm: rstd ⊙ x·W′ᵀ).
// The kernel's B is W′ and gamma and beta are not read at run time;
// FusedGemm puts FoldedNormStep in front of the epilogue chain.
template <NormKind kKind_>
struct FoldedNorm {
  static constexpr NormKind kKind = kKind_;
  static constexpr bool kRowStats = true;
  static constexpr bool kNormalizesA = false;
  static constexpr const char* name = kKind == NormKind::LayerNorm ? "folded_layernorm" : "folded_rmsnorm";
  static bool args_valid(const NormArgs& a) { return a.eps >= 0.0f; }

  // Statistics of all M rows into stats[M] on `stream` (sm90's first pass).
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
// A gated chain corrects the gate and the up values, on the GEMM's columns.
template <NormKind kKind, typename Act, typename Chain>
struct WithFoldedNorm<FoldedNorm<kKind>, GatedChain<Act, Chain>> {
  using type = GatedChain<Act, Chain, EpilogueChain<FoldedNormStep<kKind == NormKind::LayerNorm>>>;
};

// Bytes of the row statistics of an m-row A in a workspace: rounded up to
// whole 256-row tiles, so that an epilogue may read the statistics of a
// tile's rows past M (whose results are never stored) without a check.
inline size_t row_stats_bytes(int64_t m) { return size_t((m + 255) / 256 * 256) * sizeof(RowStats); }

// Bytes of a normalized [m, k] A of T in a workspace.
template <typename T>
inline size_t normalized_bytes(int64_t m, int64_t k) {
  return size_t(m) * size_t(k) * sizeof(T);
}

}  // namespace fusion
