// The epilogue chain: what a fused GEMM does to its f32 accumulators between
// the last multiply-add and the single store of C.
//
// A step is a struct with a `name`, a host-side `args_valid` (does the kernel
// have the pointers this step reads?), `kReadsTile` (does it read an [M, N]
// tensor, one value per element, rather than nothing or one per column?) and
// a device-side `apply` that maps one pair of adjacent accumulator columns
// (m, n) and (m, n + 1) to new values. A step that reads a tile also names
// it (`tile`) and says how its values enter (`combine`), so that a mainloop
// which brings the tile into shared memory ahead of the epilogue (sm90's, by
// TMA) can hand the values over instead of the step loading them.
// An activation derives these from `Activation<Self>` and gives only its
// `name` and `f`, the function of one value.
// Pairs, because the mma.sync C fragment hands each thread two consecutive
// columns, and a pair of 16-bit elements is one aligned 4-byte load or store.
// `EpilogueChain<Steps...>` applies its steps in order; adding an activation
// means adding one step struct here and one row in the compiler's op table
// (fusion-compiler/src/ir/ops.rs), which names the struct and gives the CPU
// reference's formula. The standalone elementwise kernels reuse the same steps.
#pragma once

#include <stdint.h>

#include <tuple>
#include <utility>

#include "norm.cuh"
#include "numeric.cuh"

namespace fusion {

// The tensors an epilogue may read. All are row-major and contiguous; the
// [M, N] tensors have the same shape as C. Unused pointers may be null.
struct EpilogueArgs {
  const void* bias;        // [N]
  const void* residual;    // [M, N], added
  const void* multiplier;  // [M, N], multiplied
  // A folded norm's terms (prologue.cuh, FoldedNorm): the statistics of
  // rows [row_stats_m0, ...) of A, which the launch computes (in the
  // caller's workspace, or in shared memory for the CTA's own rows), and
  // the bound weights' per-column (rowsum of W', W·beta).
  const RowStats* row_stats;
  int64_t row_stats_m0;
  const float2* col_terms;  // [N]
  // An FP8 GEMM's scales (Dequantize): A's, f32 [1], and B's, f32 [1] or
  // [N] (one per output channel).
  const float* scale_a;
  const float* scale_b;
};

// What every activation step shares: it is a function `Derived::f` of each
// accumulator alone, reads no operand, and so accepts any arguments.
template <typename Derived>
struct Activation {
  static constexpr bool kReadsTile = false;
  static bool args_valid(const EpilogueArgs&) { return true; }
  template <typename T>
  static __device__ __forceinline__ float2 apply(float2 v, int64_t, int64_t, int64_t, const EpilogueArgs&) {
    return make_float2(Derived::f(v.x), Derived::f(v.y));
  }
};

// x + bias[n]
struct Bias {
  static constexpr bool kReadsTile = false;
  static constexpr const char* name = "bias";
  static bool args_valid(const EpilogueArgs& a) { return a.bias != nullptr; }
  template <typename T>
  static __device__ __forceinline__ float2 apply(float2 v, int64_t, int64_t n, int64_t, const EpilogueArgs& a) {
    const float2 b = load_pair(static_cast<const T*>(a.bias) + n);
    return make_float2(v.x + b.x, v.y + b.y);
  }
};

// GELU, tanh approximation (PyTorch's approximate="tanh"):
// 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), with tanh from the
// hardware's tanh.approx.f32 (sm_75 and newer; relative error about 2^-11,
// far below what f16 and bf16 outputs keep). One special-function op per
// element: the earlier sigmoid form x / (1 + 2^(-2u log2 e)) took two (ex2
// and the reciprocal), and on the sm90 mainloop, whose epilogue does not
// overlap its tensor-core work, those ops made GELU cost ~9% over a bias-only
// epilogue at (8192, 14336, 4096) on an H200 (benchmarks/HISTORY.md).
struct Gelu : Activation<Gelu> {
  static constexpr const char* name = "gelu";
  static __device__ __forceinline__ float f(float x) {
    // sqrt(2/pi), and the same times 0.044715.
    const float u = x * fmaf(0.035677408f, x * x, 0.7978845608f);
    const float half_x = 0.5f * x;
    return fmaf(half_x, tanh_approx(u), half_x);
  }
};

// GELU, exact form with erf (PyTorch's default).
struct GeluErf : Activation<GeluErf> {
  static constexpr const char* name = "gelu_erf";
  static __device__ __forceinline__ float f(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067812f)); }
};

// SiLU (swish): x * sigmoid(x), written as 0.5 x (1 + tanh(x / 2)) so that
// it costs one special-function op (see Gelu) instead of exp and a divide.
struct Silu : Activation<Silu> {
  static constexpr const char* name = "silu";
  static __device__ __forceinline__ float f(float x) {
    const float half_x = 0.5f * x;
    return fmaf(half_x, tanh_approx(half_x), half_x);
  }
};

struct Relu : Activation<Relu> {
  static constexpr const char* name = "relu";
  // Not fmaxf, which returns 0 for NaN: PyTorch's relu(NaN) is NaN. From
  // sm_80 on, max.NaN keeps NaN in one instruction (FMNMX.NAN on sm_90a,
  // folded into the f16 conversion as F2FP.RELU on sm_80), as fmaxf did;
  // the compare and select below cost two (FSETP, FSEL) per value: 128 more
  // per thread and tile in the sm90 128x256 epilogue (cuobjdump). max.NaN
  // gives +0 for -0, where the select keeps -0.
  static __device__ __forceinline__ float f(float x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    float y;
    asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(y) : "f"(x));
    return y;
#else
    return x < 0.0f ? 0.0f : x;
#endif
  }
};

// The logistic sigmoid, 1 / (1 + e^-x), written 0.5 + 0.5 tanh(x / 2) so that
// it costs one special-function op (see Gelu). tanh.approx gives +-1 at
// +-inf and NaN for NaN, so sigmoid(+inf) = 1, sigmoid(-inf) = 0 and NaN
// stays NaN, as in PyTorch.
struct Sigmoid : Activation<Sigmoid> {
  static constexpr const char* name = "sigmoid";
  static __device__ __forceinline__ float f(float x) { return fmaf(0.5f, tanh_approx(0.5f * x), 0.5f); }
};

// CLIP's "quick GELU", x * sigmoid(1.702 x), written 0.5 x (1 + tanh(0.851 x))
// like Silu: one special-function op. At -inf it is -inf * 0 = NaN, as in
// PyTorch's x * torch.sigmoid(1.702 * x).
struct GeluQuick : Activation<GeluQuick> {
  static constexpr const char* name = "gelu_quick";
  static __device__ __forceinline__ float f(float x) {
    const float half_x = 0.5f * x;
    return fmaf(half_x, tanh_approx(0.851f * x), half_x);
  }
};

// What every step that reads an [M, N] tile shares: `Derived::tile` names
// the tensor and `Derived::combine` merges a pair of its values into the
// accumulators; `apply` loads the pair itself.
template <typename Derived>
struct TileStep {
  static constexpr bool kReadsTile = true;
  static bool args_valid(const EpilogueArgs& a) { return Derived::tile(a) != nullptr; }
  template <typename T>
  static __device__ __forceinline__ float2 apply(float2 v, int64_t m, int64_t n, int64_t ld, const EpilogueArgs& a) {
    return Derived::combine(v, load_pair(static_cast<const T*>(Derived::tile(a)) + m * ld + n));
  }
};

// x + residual[m, n]
struct Residual : TileStep<Residual> {
  static constexpr const char* name = "residual";
  static __host__ __device__ __forceinline__ const void* tile(const EpilogueArgs& a) { return a.residual; }
  static __device__ __forceinline__ float2 combine(float2 v, float2 r) { return make_float2(v.x + r.x, v.y + r.y); }
};

// x * multiplier[m, n] (SwiGLU's gate times up projection).
struct Mul : TileStep<Mul> {
  static constexpr const char* name = "mul";
  static __host__ __device__ __forceinline__ const void* tile(const EpilogueArgs& a) { return a.multiplier; }
  static __device__ __forceinline__ float2 combine(float2 v, float2 p) { return make_float2(v.x * p.x, v.y * p.y); }
};

// The folded norm's correction, the first step of a chain whose GEMM ran on
// the raw rows x against W' = W·diag(gamma) (prologue.cuh, FoldedNorm):
//   LayerNorm: rstd[m] · (acc − mean[m] · u[n]) + c[n], u = rowsum(W'), c = W·beta
//   RMSNorm:   rstd[m] · acc
// u is summed in f32 from the rounded W' the GEMM multiplies, so acc −
// mean·u is Σ (x − mean)·W' up to f32 rounding: a row mean large against
// the row's spread cancels there and nowhere else.
template <bool kCentered>
struct FoldedNormStep {
  static constexpr bool kReadsTile = false;
  static constexpr const char* name = kCentered ? "folded_layernorm" : "folded_rmsnorm";
  // The row statistics are the launch's own, set after this check.
  static bool args_valid(const EpilogueArgs& a) { return !kCentered || a.col_terms != nullptr; }
  template <typename T>
  static __device__ __forceinline__ float2 apply(float2 v, int64_t m, int64_t n, int64_t, const EpilogueArgs& a) {
    const RowStats s = a.row_stats[m - a.row_stats_m0];
    if constexpr (kCentered) {
      const float4 t = *reinterpret_cast<const float4*>(a.col_terms + n);  // (u, c) of n and n + 1
      return make_float2(fmaf(s.rstd, fmaf(-s.mean, t.x, v.x), t.y), fmaf(s.rstd, fmaf(-s.mean, t.z, v.y), t.w));
    } else {
      return make_float2(s.rstd * v.x, s.rstd * v.y);
    }
  }
};

// An FP8 GEMM's first step: the accumulator of e4m3 codes times A's scale
// and B's, B's one per tensor or (kPerColumn) one per output channel n, so
// that the steps after it see the product of the dequantized operands.
template <bool kPerColumn>
struct Dequantize {
  static constexpr bool kReadsTile = false;
  static constexpr const char* name = kPerColumn ? "dequantize_per_column" : "dequantize";
  static bool args_valid(const EpilogueArgs& a) { return a.scale_a != nullptr && a.scale_b != nullptr; }
  template <typename T>
  static __device__ __forceinline__ float2 apply(float2 v, int64_t, int64_t n, int64_t, const EpilogueArgs& a) {
    const float scale_a = *a.scale_a;
    if constexpr (kPerColumn) {
      const float2 b = *reinterpret_cast<const float2*>(a.scale_b + n);  // n is even
      return make_float2(v.x * (scale_a * b.x), v.y * (scale_a * b.y));
    } else {
      const float scale = scale_a * *a.scale_b;
      return make_float2(v.x * scale, v.y * scale);
    }
  }
};

// Applies Steps... in order. With no steps it is the plain store of C.
template <typename... Steps>
struct EpilogueChain {
  static_assert(sizeof...(Steps) <= 5,
                "an epilogue chain has at most 4 steps and a folded norm's correction or an FP8 GEMM's Dequantize");

  static bool args_valid(const EpilogueArgs& a) { return (true && ... && Steps::args_valid(a)); }
  static constexpr bool kReadsTile = (false || ... || Steps::kReadsTile);
  // One column of C per column of the GEMM (GatedChain has two).
  static constexpr bool kGated = false;
  static constexpr int kGemmColsPerOutput = 1;
  // How many steps read an [M, N] tile. Where there is one (kSourceTile),
  // a mainloop may bring its tile (`source`) ahead of the epilogue and run
  // the chain as apply_head and apply_tail around it.
  static constexpr int kTileSteps = (0 + ... + int(Steps::kReadsTile));
  static constexpr bool kSourceTile = kTileSteps == 1;

  // The tensor of the chain's one tile-reading step (kSourceTile).
  static const void* source(const EpilogueArgs& a) {
    static_assert(kSourceTile, "a chain with one tile-reading step");
    return std::tuple_element_t<kFirstTileStep, std::tuple<Steps...>>::tile(a);
  }

  // Values of C at (m, n) and (m, n + 1) given the accumulators there; `ld` is
  // N, the row stride of C and of the [M, N] operands.
  template <typename T>
  static __device__ __forceinline__ float2 apply(float2 acc, int64_t m, int64_t n, int64_t ld,
                                                 const EpilogueArgs& a) {
    ((acc = Steps::template apply<T>(acc, m, n, ld, a)), ...);
    return acc;
  }

  // The chain in two parts around its tile-reading step (kSourceTile),
  // for a mainloop that brings that tile ahead: apply_head applies the
  // steps before it, apply_tail that step, with `src` the tile's values at
  // (m, n) and (m, n + 1), and the steps after it.
  template <typename T>
  static __device__ __forceinline__ float2 apply_head(float2 acc, int64_t m, int64_t n, int64_t ld,
                                                      const EpilogueArgs& a) {
    return apply_range<0, kFirstTileStep, T>(acc, make_float2(0.0f, 0.0f), m, n, ld, a,
                                             std::index_sequence_for<Steps...>{});
  }
  template <typename T>
  static __device__ __forceinline__ float2 apply_tail(float2 acc, float2 src, int64_t m, int64_t n, int64_t ld,
                                                      const EpilogueArgs& a) {
    static_assert(kSourceTile, "a chain with one tile-reading step");
    return apply_range<kFirstTileStep, int(sizeof...(Steps)), T>(acc, src, m, n, ld, a,
                                                                 std::index_sequence_for<Steps...>{});
  }

 private:
  // The index of the first tile-reading step (the number of steps if none).
  static constexpr int first_tile_step() {
    constexpr bool reads[] = {Steps::kReadsTile..., false};
    int i = 0;
    while (i < int(sizeof...(Steps)) && !reads[i]) ++i;
    return i;
  }
  static constexpr int kFirstTileStep = first_tile_step();

  // Steps [kBegin, kEnd) in order; a tile-reading one among them combines
  // `src` rather than loading its values.
  template <int kBegin, int kEnd, typename T, size_t... I>
  static __device__ __forceinline__ float2 apply_range(float2 acc, float2 src, int64_t m, int64_t n, int64_t ld,
                                                       const EpilogueArgs& a, std::index_sequence<I...>) {
    ((acc = step_in_range<I, kBegin, kEnd, T>(acc, src, m, n, ld, a)), ...);
    return acc;
  }
  template <size_t I, int kBegin, int kEnd, typename T>
  static __device__ __forceinline__ float2 step_in_range(float2 acc, float2 src, int64_t m, int64_t n, int64_t ld,
                                                         const EpilogueArgs& a) {
    using Step = std::tuple_element_t<I, std::tuple<Steps...>>;
    if constexpr (int(I) < kBegin || int(I) >= kEnd)
      return acc;
    else if constexpr (Step::kReadsTile)
      return Step::combine(acc, src);
    else
      return Step::template apply<T>(acc, m, n, ld, a);
  }
};

// A gated (GLU) GEMM's epilogue: the GEMM multiplies A by gate and up
// weights interleaved in blocks of 8 output columns (gated.cuh), so GEMM
// columns 16j .. 16j + 7 are the gate projection of output columns
// 8j .. 8j + 7 and GEMM columns 16j + 8 .. 16j + 15 their up projection.
// Every mma fragment is 8 columns wide and a thread holds the same lanes
// of adjacent fragments, so each thread finds gate and up of the same
// output pair in its own registers:
//   C[m, 8j + c] = Chain(Act(Pre(gate)) * Pre(up))
// with Pre the steps on GEMM columns (a folded norm's correction) and Chain
// those on C's columns. C has half the GEMM's columns: a mainloop stores
// kGemmColsPerOutput = 2 GEMM columns per column of C.
template <typename Act, typename Chain, typename Pre = EpilogueChain<>>
struct GatedChain {
  static_assert(!Pre::kReadsTile, "the steps before the gate read no [M, N] tile");
  static bool args_valid(const EpilogueArgs& a) { return Pre::args_valid(a) && Chain::args_valid(a); }
  static constexpr bool kReadsTile = Chain::kReadsTile;
  // A gated chain reads any tile of C element by element: the source-tile
  // path (sm90's) stages the GEMM's columns, not C's.
  static constexpr bool kSourceTile = false;
  static constexpr bool kGated = true;
  static constexpr int kGemmColsPerOutput = 2;

  // The GEMM column of the gate value of C's column n; up's is 8 further.
  static __host__ __device__ __forceinline__ int64_t gate_column(int64_t n) { return n + (n & ~int64_t(7)); }

  // C at (m, n), (m, n + 1) from the gate and up accumulators of those
  // columns; `ld` is C's row stride (half the GEMM's N).
  template <typename T>
  static __device__ __forceinline__ float2 apply(float2 gate, float2 up, int64_t m, int64_t n, int64_t ld,
                                                 const EpilogueArgs& a) {
    const int64_t g = gate_column(n);
    gate = Pre::template apply<T>(gate, m, g, 2 * ld, a);
    up = Pre::template apply<T>(up, m, g + 8, 2 * ld, a);
    const float2 h = make_float2(Act::f(gate.x) * up.x, Act::f(gate.y) * up.y);
    return Chain::template apply<T>(h, m, n, ld, a);
  }
};

}  // namespace fusion
