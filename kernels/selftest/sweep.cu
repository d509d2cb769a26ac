// Mainloop sweep: candidate sm80 (mma.sync) mainloop variants and tile
// configs, each checked for correctness and then timed against cuBLASLt's
// GELU_BIAS epilogue on the same f16 inputs (B as [N, K], bias + GELU).
//
// One variant's kernel takes ptxas tens of seconds, so the program is built
// from several translation units that compile in parallel (see sweep.sh):
//   -DFUSION_SWEEP_VARIANT=i   only variant i's kernel and its launcher
//   (no define)                the harness: checks, timing, the table
// Every unit sees the same variant list below; the harness calls each
// variant through explicit specializations that the variant units define.
// -DFUSION_SWEEP_SET=2 (sweep.sh --set=2) selects the second list, variants
// of set 1's best large-shape config; every unit of one build uses one set.

#include <cuda_runtime.h>

#if !defined(FUSION_SWEEP_SET)
#define FUSION_SWEEP_SET 1
#endif

#include "fusion/gemm.cuh"
#include "fusion/sm80/mainloop.cuh"

namespace sweep {

using fusion::sm80::KLoop;
using fusion::sm80::Store;
using fusion::sm80::TileConfig;

// GELU (tanh form) written as x * sigmoid(2u) = x / (1 + 2^(-2u log2 e)),
// u = sqrt(2/pi) (x + 0.044715 x^3): the same function as fusion::Gelu with
// two fast special-function instructions (ex2, rcp) instead of tanhf's
// accurate sequence. No cancellation for negative x (unlike 1 + tanh).
// For x -> -inf the exponential is inf and the quotient -0.
struct GeluSigmoid {
  static constexpr bool kReadsTile = false;
  static constexpr const char* name = "gelu_sigmoid";
  static bool args_valid(const fusion::EpilogueArgs&) { return true; }
  template <typename T>
  static __device__ __forceinline__ float2 apply(float2 v, int64_t, int64_t, int64_t, const fusion::EpilogueArgs&) {
    return make_float2(gelu(v.x), gelu(v.y));
  }
  static __device__ __forceinline__ float gelu(float x) {
    // -2 log2(e) sqrt(2/pi) and the same times 0.044715.
    const float t = x * fmaf(-0.10294324f, x * x, -2.3022082f);
    float e;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(e) : "f"(t));
    return __fdividef(x, 1.0f + e);
  }
};

// GELU through the hardware tanh (tanh.approx.f32, one instruction; about
// 2^-11 relative error in tanh, so ~1e-3 absolute near x = -3 after 1 + tanh).
struct GeluTanhApprox {
  static constexpr bool kReadsTile = false;
  static constexpr const char* name = "gelu_tanh_approx";
  static bool args_valid(const fusion::EpilogueArgs&) { return true; }
  template <typename T>
  static __device__ __forceinline__ float2 apply(float2 v, int64_t, int64_t, int64_t, const fusion::EpilogueArgs&) {
    return make_float2(gelu(v.x), gelu(v.y));
  }
  static __device__ __forceinline__ float gelu(float x) {
    const float u = x * fmaf(0.035677408f, x * x, 0.7978845608f);
    float t;
    asm("tanh.approx.f32 %0, %1;" : "=f"(t) : "f"(u));
    const float h = 0.5f * x;
    return fmaf(h, t, h);
  }
};

using BiasGelu = fusion::EpilogueChain<fusion::Bias, fusion::Gelu>;
using BiasGeluSigmoid = fusion::EpilogueChain<fusion::Bias, GeluSigmoid>;
using BiasGeluTanhApprox = fusion::EpilogueChain<fusion::Bias, GeluTanhApprox>;
using BiasOnly = fusion::EpilogueChain<fusion::Bias>;
using Bare = fusion::EpilogueChain<>;

// What the reference applies to A @ B^T; every GELU variant is checked
// against the same f32 tanhf GELU.
enum class Ref { BiasGelu, Bias, None };

// The candidates. `name` says what differs from the v1 mainloop:
//   tile BMxBNxBK / warp tile, stages, CTAs per SM, K loop, then (set 2)
//   the store, the GELU, the tile order and the L2 prefetch.
template <int I>
struct Variant;

#define FUSION_SWEEP_VARIANT_DEF(I, NAME, EPILOGUE, REF, ...) \
  template <>                                                 \
  struct Variant<I> {                                         \
    using Tile = __VA_ARGS__;                                 \
    using Epilogue = EPILOGUE;                                \
    static constexpr Ref ref = REF;                           \
    static constexpr const char* name = NAME;                 \
  };

constexpr int kSweepSet = FUSION_SWEEP_SET;

#if FUSION_SWEEP_SET == 1
// Set 1: tile configs and K loops, all with bias + GELU (tanhf), direct store.
#define V(I, NAME, ...) FUSION_SWEEP_VARIANT_DEF(I, NAME, BiasGelu, Ref::BiasGelu, __VA_ARGS__)
// The two configs in use today (v1).
V(0, "v1 128x256x32/64x64 s4", fusion::sm80::Tile128x256)
V(1, "v1 128x128x32/64x32 s4 2cta", fusion::sm80::Tile128x128)
// (a) register double-buffered fragments, barrier inside the last k16 step.
V(2, "pipe 128x256x32/64x64 s4", TileConfig<128, 256, 32, 64, 64, 4, 1, KLoop::Pipelined>)
// (b) BK = 64: half the barriers per FLOP; 144 KB (sm_80 / sm_90 only).
V(3, "pipe 128x256x64/64x64 s3", TileConfig<128, 256, 64, 64, 64, 3, 1, KLoop::Pipelined>)
// (b) without (a), to separate the two effects.
V(4, "v1 128x256x64/64x64 s3", TileConfig<128, 256, 64, 64, 64, 3, 1>)
// (b) one stage deeper: 192 KB (sm_90 only).
V(5, "pipe 128x256x64/64x64 s4", TileConfig<128, 256, 64, 64, 64, 4, 1, KLoop::Pipelined>)
// (c)/(e) 256x128: 4x2 warps instead of 2x4; A is the wide operand.
V(6, "pipe 256x128x32/64x64 s4", TileConfig<256, 128, 32, 64, 64, 4, 1, KLoop::Pipelined>)
// (d) 4 warps of 64x64, two CTAs per SM: one CTA's barrier wait is
// covered by the other CTA's mma's. 2 x 96 KB (sm_90 only).
V(7, "pipe 128x128x64/64x64 s3 2cta", TileConfig<128, 128, 64, 64, 64, 3, 2, KLoop::Pipelined>)
// (d) with BK = 32 and 4 stages: 64 KB per CTA, inside sm_86/89's 99 KB.
V(8, "pipe 128x128x32/64x64 s4 2cta", TileConfig<128, 128, 32, 64, 64, 4, 2, KLoop::Pipelined>)
// (b) + (c): 256x128 with BK = 64, 144 KB.
V(9, "pipe 256x128x64/64x64 s3", TileConfig<256, 128, 64, 64, 64, 3, 1, KLoop::Pipelined>)
// (f) small M: 64-row tiles double the CTA count at M = 128 (224 CTAs for
// N = 14336), up to three CTAs of 4 warps per SM.
V(10, "pipe 64x128x32/32x64 s4 3cta", TileConfig<64, 128, 32, 32, 64, 4, 3, KLoop::Pipelined>)
#undef V
constexpr int kVariantCount = 11;  // sweep.sh reads this line (set 1)
#elif FUSION_SWEEP_SET == 2
// Set 2: set 1's best large-shape config (#3: pipelined 128x256x64, 3
// stages) with what happens around the K loop changed, one thing at a time,
// then combined. Names: "p3" is that config; "s4" its 4-stage twin (set 1 #5).
template <Store kStore = Store::Direct, int kGroupRows = 8, int kPrefetch = 0, int kStages = 3>
using P3 = TileConfig<128, 256, 64, 64, 64, kStages, 1, KLoop::Pipelined, kStore, kGroupRows, kPrefetch>;
// Control: set 1's #3 as it is; again as the last variant, for the spread
// between two runs of the same kernel.
FUSION_SWEEP_VARIANT_DEF(0, "p3 direct tanhf (set 1 #3)", BiasGelu, Ref::BiasGelu, P3<>)
// What the epilogue costs: no epilogue at all, then bias alone.
FUSION_SWEEP_VARIANT_DEF(1, "p3 direct bare GEMM", Bare, Ref::None, P3<>)
FUSION_SWEEP_VARIANT_DEF(2, "p3 direct bias only", BiasOnly, Ref::Bias, P3<>)
// The GELU's arithmetic: two fast special-function ops, or one.
FUSION_SWEEP_VARIANT_DEF(3, "p3 direct gelu-sigmoid", BiasGeluSigmoid, Ref::BiasGelu, P3<>)
FUSION_SWEEP_VARIANT_DEF(4, "p3 direct gelu-tanh.approx", BiasGeluTanhApprox, Ref::BiasGelu, P3<>)
// The store through shared memory, 16-byte coalesced writes of C.
FUSION_SWEEP_VARIANT_DEF(5, "p3 staged tanhf", BiasGelu, Ref::BiasGelu, P3<Store::Staged>)
FUSION_SWEEP_VARIANT_DEF(6, "p3 staged gelu-sigmoid", BiasGeluSigmoid, Ref::BiasGelu, P3<Store::Staged>)
FUSION_SWEEP_VARIANT_DEF(7, "p3 staged gelu-tanh.approx", BiasGeluTanhApprox, Ref::BiasGelu, P3<Store::Staged>)
FUSION_SWEEP_VARIANT_DEF(8, "p3 staged bare GEMM", Bare, Ref::None, P3<Store::Staged>)
// Tile order: groups of 16 or 4 tile rows instead of 8.
FUSION_SWEEP_VARIANT_DEF(9, "p3 direct tanhf group16", BiasGelu, Ref::BiasGelu, P3<Store::Direct, 16>)
FUSION_SWEEP_VARIANT_DEF(10, "p3 direct tanhf group4", BiasGelu, Ref::BiasGelu, P3<Store::Direct, 4>)
// cp.async with an L2 prefetch of the next 128 bytes of each row.
FUSION_SWEEP_VARIANT_DEF(11, "p3 direct tanhf L2::256B", BiasGelu, Ref::BiasGelu, P3<Store::Direct, 8, 256>)
// Combined: staged store, sigmoid GELU, plus the two memory-side knobs.
FUSION_SWEEP_VARIANT_DEF(12, "p3 staged sigm g16 L2::256B", BiasGeluSigmoid, Ref::BiasGelu,
                         P3<Store::Staged, 16, 256>)
// The 4-stage twin (192 KB; best at (8192,14336,4096) in set 1) with the
// staged store and the sigmoid GELU.
FUSION_SWEEP_VARIANT_DEF(13, "s4 staged gelu-sigmoid", BiasGeluSigmoid, Ref::BiasGelu,
                         P3<Store::Staged, 8, 0, 4>)
FUSION_SWEEP_VARIANT_DEF(14, "p3 direct tanhf (control again)", BiasGelu, Ref::BiasGelu, P3<>)
// Combined with the one-instruction GELU instead.
FUSION_SWEEP_VARIANT_DEF(15, "p3 staged tanh.ap g16 L2::256B", BiasGeluTanhApprox, Ref::BiasGelu,
                         P3<Store::Staged, 16, 256>)
constexpr int kVariantCount = 16;  // sweep.sh reads this line (set 2)
#else
#error "FUSION_SWEEP_SET is 1 or 2"
#endif

#undef FUSION_SWEEP_VARIANT_DEF

template <int I>
using MainloopOf = fusion::sm80::Mainloop<__half, fusion::LayoutB::NK, typename Variant<I>::Tile>;
template <int I>
using KernelOf = fusion::FusedGemm<MainloopOf<I>, fusion::NoPrologue, typename Variant<I>::Epilogue>;

struct VariantShape {
  int bm, bn, bk, threads;
  size_t smem_bytes;
  Ref ref;
};

// Defined in the variant units.
template <int I>
cudaError_t launch(const fusion::GemmArgs<__half>& p, cudaStream_t stream);
template <int I>
cudaError_t attributes(cudaFuncAttributes* attr, int* blocks_per_sm);

template <int I>
VariantShape shape_of() {
  using M = MainloopOf<I>;
  return {M::BM, M::BN, M::BK, M::kThreads, M::kSmemBytes, Variant<I>::ref};
}

}  // namespace sweep

#if defined(FUSION_SWEEP_VARIANT)
// ===========================================================================
// One variant's kernel.
// ===========================================================================
namespace sweep {

template <>
cudaError_t launch<FUSION_SWEEP_VARIANT>(const fusion::GemmArgs<__half>& p, cudaStream_t stream) {
  // sm80 variants: no workspace.
  return KernelOf<FUSION_SWEEP_VARIANT>::launch(p, fusion::Workspace{}, stream);
}

template <>
cudaError_t attributes<FUSION_SWEEP_VARIANT>(cudaFuncAttributes* attr, int* blocks_per_sm) {
  using M = MainloopOf<FUSION_SWEEP_VARIANT>;
  const void* fn = reinterpret_cast<const void*>(
      &fusion::fused_gemm_kernel<M, fusion::NoPrologue, typename Variant<FUSION_SWEEP_VARIANT>::Epilogue>);
  cudaError_t err = cudaFuncGetAttributes(attr, fn);
  if (err != cudaSuccess) return err;
  err = cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(M::kSmemBytes));
  if (err != cudaSuccess) return err;
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks_per_sm, fn, M::kThreads, M::kSmemBytes);
}

}  // namespace sweep

#else
// ===========================================================================
// The harness.
// ===========================================================================
#include <cublasLt.h>
#include <cublas_v2.h>

#include "harness.cuh"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace sweep {
namespace {

using harness::DeviceBuffer;
using harness::LtGemm;
using harness::Shape;
using harness::fill_random_kernel;
using harness::median_us;
using harness::shape_str;

// One variant as the harness sees it.
struct Entry {
  const char* name;
  VariantShape shape;
  cudaError_t (*launch)(const fusion::GemmArgs<__half>&, cudaStream_t);
  cudaError_t (*attributes)(cudaFuncAttributes*, int*);
  bool usable = true;  // fits the device and passed every check
  std::string why_not;
};

template <int... Is>
std::vector<Entry> make_entries(std::integer_sequence<int, Is...>) {
  return {Entry{Variant<Is>::name, shape_of<Is>(), &launch<Is>, &attributes<Is>}...};
}



// ref[m, n] = gelu(acc[m, n] + bias[n]) (with_gelu) or acc[m, n] + bias[n],
// f32, in place.
__global__ void ref_bias_kernel(float* acc, const __half* bias, int64_t m, int64_t n, bool with_gelu) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < m * n; i += int64_t(gridDim.x) * blockDim.x) {
    const float x = acc[i] + __half2float(bias[i % n]);
    acc[i] = with_gelu ? 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))) : x;
  }
}


struct Inputs {
  DeviceBuffer<__half> a, b, bias, c;
  Inputs(Shape s, uint64_t seed)
      : a(size_t(s.m * s.k)), b(size_t(s.n * s.k)), bias(size_t(s.n)), c(size_t(s.m * s.n)) {
    fill_random_kernel<<<1024, 256>>>(a.ptr, a.count, seed * 4 + 1, 1.0f);
    fill_random_kernel<<<1024, 256>>>(b.ptr, b.count, seed * 4 + 2, 1.0f / std::sqrt(float(s.k)));
    fill_random_kernel<<<1024, 256>>>(bias.ptr, bias.count, seed * 4 + 3, 1.0f);
    CHECK_CUDA(cudaGetLastError());
    c.poison();
  }
  fusion::GemmArgs<__half> args(Shape s) const {
    fusion::GemmArgs<__half> p{};
    p.a = a.ptr;
    p.b = b.ptr;
    p.c = c.ptr;
    p.m = s.m;
    p.n = s.n;
    p.k = s.k;
    p.epilogue.bias = bias.ptr;
    return p;
  }
};

// gelu(A @ B^T + bias) (or what `kind` says) in f32 through cuBLAS (f16
// inputs, f32 accumulate and output), then compared with `out` on the host:
// rel_err = |out - ref| / |ref|.
struct Reference {
  DeviceBuffer<float> ref;
  Reference(cublasHandle_t blas, const Inputs& in, Shape s, Ref kind) : ref(size_t(s.m * s.n)) {
    const float alpha = 1.0f, beta = 0.0f;
    CHECK_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n), int(s.m), int(s.k), &alpha, in.b.ptr,
                                    CUDA_R_16F, int(s.k), in.a.ptr, CUDA_R_16F, int(s.k), &beta, ref.ptr, CUDA_R_32F,
                                    int(s.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
    if (kind != Ref::None) {
      ref_bias_kernel<<<1024, 256>>>(ref.ptr, in.bias.ptr, s.m, s.n, kind == Ref::BiasGelu);
      CHECK_CUDA(cudaGetLastError());
    }
    CHECK_CUDA(cudaDeviceSynchronize());
  }
  // rel_err, or infinity when an element is not finite (unwritten: NaN).
  double rel_err(const __half* out) const {
    std::vector<__half> o(ref.count);
    std::vector<float> r(ref.count);
    CHECK_CUDA(cudaMemcpy(o.data(), out, o.size() * sizeof(__half), cudaMemcpyDeviceToHost));
    CHECK_CUDA(cudaMemcpy(r.data(), ref.ptr, r.size() * sizeof(float), cudaMemcpyDeviceToHost));
    double d2 = 0.0, r2 = 0.0;
    for (size_t i = 0; i < o.size(); ++i) {
      const double x = __half2float(o[i]);
      if (!std::isfinite(x)) return INFINITY;
      d2 += (x - r[i]) * (x - r[i]);
      r2 += double(r[i]) * r[i];
    }
    return std::sqrt(d2 / std::max(r2, 1e-30));
  }
};

constexpr double kTolerance = 1e-2;

// Checks every variant on each shape (fresh inputs per variant, output
// poisoned); a variant that fails anywhere is not timed.
void check_all(std::vector<Entry>& entries, cublasHandle_t blas, const std::vector<Shape>& shapes) {
  uint64_t seed = 1000;
  for (const Shape s : shapes) {
    for (Entry& e : entries) {
      if (!e.usable) continue;
      Inputs in(s, ++seed);
      const Reference ref(blas, in, s, e.shape.ref);
      const cudaError_t err = e.launch(in.args(s), nullptr);
      if (err != cudaSuccess) {
        e.usable = false;
        e.why_not = std::string("launch: ") + cudaGetErrorName(err);
        cudaGetLastError();
      } else {
        const cudaError_t sync = cudaDeviceSynchronize();
        if (sync != cudaSuccess) {
          std::fprintf(stderr, "FATAL %s (%s): %s\n", e.name, shape_str(s).c_str(), cudaGetErrorString(sync));
          std::exit(2);
        }
        const double rel = ref.rel_err(in.c.ptr);
        const bool ok = rel < kTolerance;
        std::printf("%s %-34s (%s) rel_err=%.3e\n", ok ? "PASS" : "FAIL", e.name, shape_str(s).c_str(), rel);
        if (!ok) {
          e.usable = false;
          e.why_not = "wrong result at (" + shape_str(s) + ")";
        }
      }
    }
  }
}



int run(int argc, char** argv) {
  int reps = 50;
  bool check = true;
  std::string only;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg.rfind("--reps=", 0) == 0) reps = std::max(1, std::atoi(arg.c_str() + 7));
    else if (arg == "--no-check") check = false;
    else if (arg.rfind("--only=", 0) == 0) only = arg.substr(7);
    else {
      std::fprintf(stderr,
                   "usage: %s [--reps=N] [--no-check] [--only=SUBSTRING]\n"
                   "  --reps=N     timed runs per (variant, shape); the median is reported (default 50)\n"
                   "  --no-check   time without the correctness checks\n"
                   "  --only=S     only variants whose name contains S (variant 0 always runs)\n",
                   argv[0]);
      return 2;
    }
  }
  int device = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  int clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device);
  std::printf("device: %s, sm_%d%d, %d SMs, %.0f MHz, smem/block opt-in %zu KB\n", prop.name, prop.major, prop.minor,
              prop.multiProcessorCount, clock_khz / 1000.0, prop.sharedMemPerBlockOptin / 1024);

  std::vector<Entry> entries = make_entries(std::make_integer_sequence<int, kVariantCount>{});
  std::printf("%-3s %-34s %5s %7s %7s %8s %s\n", "#", "variant", "regs", "local", "smem KB", "CTAs/SM", "");
  for (size_t i = 0; i < entries.size(); ++i) {
    Entry& e = entries[i];
    if (!only.empty() && i != 0 && std::string(e.name).find(only) == std::string::npos) {
      e.usable = false;
      e.why_not = "filtered out";
      continue;
    }
    if (e.shape.smem_bytes > prop.sharedMemPerBlockOptin) {
      e.usable = false;
      e.why_not = "needs more shared memory than the device allows";
    }
    cudaFuncAttributes attr{};
    int blocks = 0;
    const cudaError_t err = e.usable ? e.attributes(&attr, &blocks) : cudaSuccess;
    if (err != cudaSuccess) {
      e.usable = false;
      e.why_not = std::string("attributes: ") + cudaGetErrorName(err);
      cudaGetLastError();
    }
    std::printf("%-3zu %-34s %5d %7zu %7zu %8d %s\n", i, e.name, attr.numRegs, attr.localSizeBytes,
                e.shape.smem_bytes / 1024, blocks, e.usable ? "" : e.why_not.c_str());
  }

  cublasHandle_t blas = nullptr;
  CHECK_CUBLAS(cublasCreate(&blas));
  if (check) {
    // Ragged in M, N and K (no dimension a multiple of any tile), then large.
    check_all(entries, blas, {{1000, 3000, 1032}, {77, 136, 8}, {4096, 4096, 4096}});
  }

  const std::vector<Shape> shapes = {
      {4096, 4096, 4096}, {8192, 8192, 8192}, {8192, 14336, 4096}, {512, 2048, 2048}, {128, 14336, 4096}};
  // us[variant][shape]; the last row is cuBLASLt.
  std::vector<std::vector<double>> us(entries.size() + 1, std::vector<double>(shapes.size(), NAN));
  uint64_t seed = 7;
  for (size_t si = 0; si < shapes.size(); ++si) {
    const Shape s = shapes[si];
    std::printf("timing (%s) ...\n", shape_str(s).c_str());
    std::fflush(stdout);
    std::vector<Inputs> sets;
    for (int i = 0; i < 4; ++i) sets.emplace_back(s, ++seed);
    CHECK_CUDA(cudaDeviceSynchronize());
    for (size_t vi = 0; vi < entries.size(); ++vi) {
      const Entry& e = entries[vi];
      if (!e.usable) continue;
      us[vi][si] = median_us(reps, [&](int i) { CHECK_CUDA(e.launch(sets[size_t(i)].args(s), nullptr)); });
    }
    LtGemm lt;
    LtGemm::Plan plan = lt.plan(s, CUBLASLT_EPILOGUE_GELU_BIAS, sets[0].bias.ptr);
    us[entries.size()][si] = median_us(reps, [&](int i) {
      const Inputs& in = sets[size_t(i)];
      lt.run(plan, in.a.ptr, in.b.ptr, in.bias.ptr, in.c.ptr);
    });
    LtGemm::destroy(plan);
  }
  CHECK_CUBLAS(cublasDestroy(blas));

  // TF/s per cell, then its ratio to cuBLASLt (time_lt / time_ours).
  std::printf("\nsweep (set %d): f16, B as [N,K], bias+GELU unless named, median of %d, 4 rotating input sets\n",
              kSweepSet, reps);
  std::printf("TF/s (ratio to cuBLASLt GELU_BIAS)\n%-3s %-34s", "#", "variant");
  for (const Shape s : shapes) std::printf(" %20s", shape_str(s).c_str());
  std::printf("\n");
  for (size_t vi = 0; vi <= entries.size(); ++vi) {
    const bool is_lt = vi == entries.size();
    if (!is_lt && !entries[vi].usable) {
      std::printf("%-3zu %-34s  skipped: %s\n", vi, entries[vi].name, entries[vi].why_not.c_str());
      continue;
    }
    std::printf("%-3s %-34s", is_lt ? "-" : std::to_string(vi).c_str(), is_lt ? "cuBLASLt GELU_BIAS" : entries[vi].name);
    for (size_t si = 0; si < shapes.size(); ++si) {
      const Shape s = shapes[si];
      const double t = us[vi][si];
      const double tflops = 2.0 * double(s.m) * double(s.n) * double(s.k) / t * 1e-6;
      std::printf("   %6.1f (%5.3f) %4s", tflops, us[entries.size()][si] / t, "");
    }
    std::printf("\n");
  }
  std::printf("\nmicroseconds\n%-3s %-34s", "#", "variant");
  for (const Shape s : shapes) std::printf(" %20s", shape_str(s).c_str());
  std::printf("\n");
  for (size_t vi = 0; vi <= entries.size(); ++vi) {
    const bool is_lt = vi == entries.size();
    if (!is_lt && !entries[vi].usable) continue;
    std::printf("%-3s %-34s", is_lt ? "-" : std::to_string(vi).c_str(), is_lt ? "cuBLASLt GELU_BIAS" : entries[vi].name);
    for (size_t si = 0; si < shapes.size(); ++si) std::printf(" %20.1f", us[vi][si]);
    std::printf("\n");
  }
  bool all_ok = true;
  for (const Entry& e : entries) all_ok = all_ok && (e.usable || e.why_not == "filtered out");
  std::printf("%s\n", all_ok ? "all variants passed their checks" : "some variants were skipped (see above)");
  return all_ok ? 0 : 1;
}

}  // namespace
}  // namespace sweep

int main(int argc, char** argv) { return sweep::run(argc, argv); }
#endif
