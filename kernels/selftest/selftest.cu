// Self-test and benchmark of fusion's CUDA building blocks.
//
// Instantiates fused GEMM compositions the way the code generator's rendered
// units do, checks each against a simple f32 GPU reference on fresh random
// inputs, checks the standalone elementwise and norm kernels, and (with
// --bench) times the fused GEMMs against cuBLASLt's fused epilogues and plain
// cuBLAS. See README.md in this directory for how to build and run it.
//
// Which mainloops are compiled in is chosen at build time, because the sm80
// mainloop needs sm_80 instructions and a PTX-only compute_75 build must not
// contain them:
//   FUSION_SELFTEST_SM80=1/0   sm80 (mma.sync) compositions, and the benchmark
//   FUSION_SELFTEST_SM75=1/0   sm75 (WMMA) compositions
//   FUSION_SELFTEST_SM90=1/0   sm90 (wgmma + TMA) compositions, and the
//                              benchmark on that mainloop; needs an sm_90a
//                              build (default 0)

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "fusion/elementwise.cuh"
#include "fusion/gemm.cuh"
#include "fusion/norm.cuh"
#include "fusion/sm75/mainloop.cuh"
#include "fusion/sm80/mainloop.cuh"
#ifndef FUSION_SELFTEST_SM90
#define FUSION_SELFTEST_SM90 0
#endif
#if FUSION_SELFTEST_SM90
#include "fusion/sm90/mainloop.cuh"
#endif
#include "harness.cuh"

#ifndef FUSION_SELFTEST_SM80
#define FUSION_SELFTEST_SM80 1
#endif
#ifndef FUSION_SELFTEST_SM75
#define FUSION_SELFTEST_SM75 1
#endif

// ===========================================================================
// A rendered kernel unit, written by hand: the model the code generator's
// templates follow. One unit per fused kernel and arch; the template only
// picks the mainloop, prologue and epilogue types and copies the plain-C
// params into GemmArgs. The selftest calls these entry points through their C
// ABI like the Rust wrappers will.
// ===========================================================================
#if FUSION_SELFTEST_SM80
extern "C" {

typedef struct fusion_gemm_bias_gelu_params {
  const void* a;     // [m, k]
  const void* b;     // [n, k] (nn.Linear weight)
  const void* bias;  // [n]
  void* c;           // [m, n]
  int64_t m, n, k;
} fusion_gemm_bias_gelu_params;

int fusion_gemm_bias_gelu_sm80(const fusion_gemm_bias_gelu_params* p, void* stream) {
  using Kernel = fusion::FusedGemm<fusion::sm80::Mainloop<__half, fusion::LayoutB::NK, fusion::sm80::Tile128x256>,
                                   fusion::NoPrologue, fusion::EpilogueChain<fusion::Bias, fusion::Gelu>>;
  if (p == nullptr) return int(cudaErrorInvalidValue);
  fusion::GemmArgs<__half> args{};
  args.a = static_cast<const __half*>(p->a);
  args.b = static_cast<const __half*>(p->b);
  args.c = static_cast<__half*>(p->c);
  args.m = p->m;
  args.n = p->n;
  args.k = p->k;
  args.epilogue.bias = p->bias;
  return int(Kernel::launch(args, fusion::Workspace{}, static_cast<cudaStream_t>(stream)));
}

typedef struct fusion_layernorm_gemm_bias_gelu_params {
  const void* a;      // [m, k]
  const void* gamma;  // [k]
  const void* beta;   // [k]
  const void* b;      // [n, k]
  const void* bias;   // [n]
  void* c;            // [m, n]
  int64_t m, n, k;
  float eps;
} fusion_layernorm_gemm_bias_gelu_params;

int fusion_layernorm_gemm_bias_gelu_sm80(const fusion_layernorm_gemm_bias_gelu_params* p, void* stream) {
  using Kernel =
      fusion::FusedGemm<fusion::sm80::Mainloop<__nv_bfloat16, fusion::LayoutB::NK, fusion::sm80::Tile128x256>,
                        fusion::LayerNormPrologue, fusion::EpilogueChain<fusion::Bias, fusion::Gelu>>;
  if (p == nullptr) return int(cudaErrorInvalidValue);
  fusion::GemmArgs<__nv_bfloat16> args{};
  args.a = static_cast<const __nv_bfloat16*>(p->a);
  args.b = static_cast<const __nv_bfloat16*>(p->b);
  args.c = static_cast<__nv_bfloat16*>(p->c);
  args.m = p->m;
  args.n = p->n;
  args.k = p->k;
  args.epilogue.bias = p->bias;
  args.norm.gamma = p->gamma;
  args.norm.beta = p->beta;
  args.norm.eps = p->eps;
  return int(Kernel::launch(args, fusion::Workspace{}, static_cast<cudaStream_t>(stream)));
}

}  // extern "C"
#endif  // FUSION_SELFTEST_SM80

// ===========================================================================
// Harness
// ===========================================================================
namespace {

using namespace fusion;
using harness::DeviceBuffer;
using harness::LtGemm;
using harness::Shape;
using harness::fill_random_kernel;
using harness::median_pair_us;

struct Options {
  bool quick = false;
  bool bench = false;
  bool check = true;
  bool trace = false;
  uint64_t seed = 0x5eed;
  std::string filter;
  std::vector<Shape> shapes;  // --shape: the benchmark's shapes instead of its own
};

// "M,N,K" with three positive integers, or false.
bool parse_shape(const std::string& text, Shape& shape) {
  long long m = 0, n = 0, k = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%lld,%lld,%lld%c", &m, &n, &k, &tail) != 3 || m <= 0 || n <= 0 || k <= 0)
    return false;
  shape = {int64_t(m), int64_t(n), int64_t(k)};
  return true;
}

struct Totals {
  int passed = 0;
  int failed = 0;
  std::vector<std::string> failures;
};

// splitmix64: a small, seeded, reproducible host generator.
struct Rng {
  uint64_t state;
  explicit Rng(uint64_t seed) : state(seed) {}
  uint64_t next() {
    uint64_t z = (state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  }
  float uniform(float lo, float hi) { return lo + (hi - lo) * float(next() >> 40) * (1.0f / 16777216.0f); }
};

// Fresh random host values converted to T and uploaded.
template <typename T>
DeviceBuffer<T> random_device(Rng& rng, size_t n, float lo, float hi) {
  std::vector<T> host(n);
  for (size_t i = 0; i < n; ++i) host[i] = Numeric<T>::from_float(rng.uniform(lo, hi));
  DeviceBuffer<T> d(n);
  CHECK_CUDA(cudaMemcpy(d.ptr, host.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  return d;
}

// --------------------------------------------------------------------------
// The reference: the same composition, written the obvious way, in f32.
// --------------------------------------------------------------------------
enum class RefOp : int { Bias, Gelu, GeluErf, Silu, Relu, Residual, Mul };
enum class RefNorm : int { None, LayerNorm, RmsNorm };

template <typename Step>
struct RefOpOf;
template <> struct RefOpOf<Bias> { static constexpr RefOp value = RefOp::Bias; };
template <> struct RefOpOf<Gelu> { static constexpr RefOp value = RefOp::Gelu; };
template <> struct RefOpOf<GeluErf> { static constexpr RefOp value = RefOp::GeluErf; };
template <> struct RefOpOf<Silu> { static constexpr RefOp value = RefOp::Silu; };
template <> struct RefOpOf<Relu> { static constexpr RefOp value = RefOp::Relu; };
template <> struct RefOpOf<Residual> { static constexpr RefOp value = RefOp::Residual; };
template <> struct RefOpOf<Mul> { static constexpr RefOp value = RefOp::Mul; };

struct RefEpilogue {
  int count = 0;
  RefOp ops[4] = {};
  bool uses(RefOp op) const {
    for (int i = 0; i < count; ++i)
      if (ops[i] == op) return true;
    return false;
  }
};

template <typename Chain>
struct RefEpilogueOf;
template <typename... Steps>
struct RefEpilogueOf<EpilogueChain<Steps...>> {
  static RefEpilogue get() {
    RefEpilogue e;
    ((e.ops[e.count++] = RefOpOf<Steps>::value), ...);
    return e;
  }
};

template <typename Prologue>
struct RefNormOf { static constexpr RefNorm value = RefNorm::None; };
template <> struct RefNormOf<LayerNormPrologue> { static constexpr RefNorm value = RefNorm::LayerNorm; };
template <> struct RefNormOf<RmsNormPrologue> { static constexpr RefNorm value = RefNorm::RmsNorm; };

template <typename T>
__device__ float ref_apply(const RefEpilogue& e, float x, int64_t m, int64_t n, int64_t N, const EpilogueArgs& a) {
  for (int i = 0; i < e.count; ++i) {
    switch (e.ops[i]) {
      case RefOp::Bias: x += Numeric<T>::to_float(static_cast<const T*>(a.bias)[n]); break;
      case RefOp::Gelu: x = 0.5f * x * (1.0f + tanhf(0.7978845608f * (x + 0.044715f * x * x * x))); break;
      case RefOp::GeluErf: x = 0.5f * x * (1.0f + erff(x / sqrtf(2.0f))); break;
      case RefOp::Silu: x = x / (1.0f + expf(-x)); break;
      case RefOp::Relu: x = x > 0.0f ? x : 0.0f; break;
      case RefOp::Residual: x += Numeric<T>::to_float(static_cast<const T*>(a.residual)[m * N + n]); break;
      case RefOp::Mul: x *= Numeric<T>::to_float(static_cast<const T*>(a.multiplier)[m * N + n]); break;
    }
  }
  return x;
}

// out[m, :] = norm(a[m, :]) (or a copy), f32, one thread per row, f64 sums.
template <typename T>
__global__ void ref_rows_kernel(const T* a, float* out, int64_t M, int64_t K, RefNorm norm, NormArgs args) {
  const int64_t m = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (m >= M) return;
  const T* row = a + m * K;
  double mean = 0.0, rstd = 1.0;
  if (norm != RefNorm::None) {
    double sum = 0.0, sum_sq = 0.0;
    for (int64_t k = 0; k < K; ++k) {
      const double x = Numeric<T>::to_float(row[k]);
      sum += x;
      sum_sq += x * x;
    }
    if (norm == RefNorm::LayerNorm) {
      mean = sum / double(K);
      double var = 0.0;
      for (int64_t k = 0; k < K; ++k) {
        const double d = Numeric<T>::to_float(row[k]) - mean;
        var += d * d;
      }
      rstd = 1.0 / sqrt(var / double(K) + double(args.eps));
    } else {
      rstd = 1.0 / sqrt(sum_sq / double(K) + double(args.eps));
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    double y = Numeric<T>::to_float(row[k]);
    if (norm != RefNorm::None) {
      y = (y - mean) * rstd * Numeric<T>::to_float(static_cast<const T*>(args.gamma)[k]);
      if (norm == RefNorm::LayerNorm) y += Numeric<T>::to_float(static_cast<const T*>(args.beta)[k]);
    }
    out[m * K + k] = float(y);
  }
}

// out[k, n] = B(k, n) as f32 for either layout.
template <typename T>
__global__ void ref_b_kernel(const T* b, float* out, int64_t K, int64_t N, LayoutB layout) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= K * N) return;
  const int64_t k = i / N, n = i % N;
  out[i] = Numeric<T>::to_float(layout == LayoutB::KN ? b[k * N + n] : b[n * K + k]);
}

// out = epilogue(a @ b), f32 throughout, 16x16 shared-memory tiles.
template <typename T>
__global__ void ref_gemm_kernel(const float* a, const float* b, float* out, int64_t M, int64_t N, int64_t K,
                                RefEpilogue epi, EpilogueArgs args) {
  __shared__ float as[16][17], bs[16][17];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t m = int64_t(blockIdx.y) * 16 + ty, n = int64_t(blockIdx.x) * 16 + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    as[ty][tx] = (m < M && k0 + tx < K) ? a[m * K + k0 + tx] : 0.0f;
    const int64_t bm = int64_t(blockIdx.x) * 16 + tx;
    bs[ty][tx] = (k0 + ty < K && bm < N) ? b[(k0 + ty) * N + bm] : 0.0f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) acc += as[ty][kk] * bs[kk][tx];
    __syncthreads();
  }
  if (m < M && n < N) out[m * N + n] = ref_apply<T>(epi, acc, m, n, N, args);
}

template <typename T>
__global__ void ref_elementwise_kernel(const T* x, float* out, int64_t M, int64_t N, RefEpilogue epi,
                                       EpilogueArgs args) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= M * N) return;
  out[i] = ref_apply<T>(epi, Numeric<T>::to_float(x[i]), i / N, i % N, N, args);
}

struct Comparison {
  double rel_err = 0.0;
  int64_t non_finite = 0;
  int64_t first_bad = -1;
  double max_abs_err = 0.0;
  int64_t worst = -1;
};

template <typename T>
Comparison compare(const T* d_out, const float* d_ref, size_t n) {
  std::vector<T> out(n);
  std::vector<float> ref(n);
  CHECK_CUDA(cudaMemcpy(out.data(), d_out, n * sizeof(T), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(ref.data(), d_ref, n * sizeof(float), cudaMemcpyDeviceToHost));
  Comparison c;
  double diff_sq = 0.0, ref_sq = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double o = Numeric<T>::to_float(out[i]), r = ref[i];
    if (!std::isfinite(o)) {
      if (c.first_bad < 0) c.first_bad = int64_t(i);
      ++c.non_finite;
      continue;
    }
    const double d = o - r;
    diff_sq += d * d;
    ref_sq += r * r;
    if (std::fabs(d) > c.max_abs_err) {
      c.max_abs_err = std::fabs(d);
      c.worst = int64_t(i);
    }
  }
  c.rel_err = ref_sq > 0.0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
  return c;
}

constexpr double kTolerance = 1e-2;

void record(Totals& totals, const std::string& name, const Comparison& c, int64_t cols) {
  const bool ok = c.non_finite == 0 && c.rel_err < kTolerance;
  std::printf("%s %-78s rel_err=%.3e max_abs=%.3e", ok ? "PASS" : "FAIL", name.c_str(), c.rel_err, c.max_abs_err);
  if (c.non_finite > 0)
    std::printf(" non_finite=%lld first at (m=%lld, n=%lld)", (long long)c.non_finite,
                (long long)(c.first_bad / cols), (long long)(c.first_bad % cols));
  else if (!ok && c.worst >= 0)
    std::printf(" worst at (m=%lld, n=%lld)", (long long)(c.worst / cols), (long long)(c.worst % cols));
  std::printf("\n");
  std::fflush(stdout);
  if (ok) {
    ++totals.passed;
  } else {
    ++totals.failed;
    totals.failures.push_back(name);
  }
}

void expect(Totals& totals, const std::string& name, bool ok, const std::string& detail) {
  std::printf("%s %-78s %s\n", ok ? "PASS" : "FAIL", name.c_str(), detail.c_str());
  if (ok) {
    ++totals.passed;
  } else {
    ++totals.failed;
    totals.failures.push_back(name);
  }
}

// "(M,N,K)", as check names and the benchmark table print shapes.
std::string shape_label(Shape s) { return "(" + harness::shape_str(s) + ")"; }

// The inputs of one GEMM check, fresh random values per check: activations
// ~U(-1, 1) (plus a per-row offset for norm kernels, so the mean matters),
// weights ~U(-1, 1)/sqrt(K).
template <typename T>
struct GemmInputs {
  DeviceBuffer<T> a, b, bias, residual, multiplier, gamma, beta, c;
  GemmInputs(Rng& rng, Shape s, const RefEpilogue& epi, RefNorm norm) {
    const float w = 1.0f / std::sqrt(float(s.k));
    if (norm == RefNorm::None) {
      a = random_device<T>(rng, size_t(s.m * s.k), -1.0f, 1.0f);
    } else {
      std::vector<T> host(size_t(s.m * s.k));
      for (int64_t m = 0; m < s.m; ++m) {
        const float offset = rng.uniform(-2.0f, 2.0f);
        for (int64_t k = 0; k < s.k; ++k) host[size_t(m * s.k + k)] = Numeric<T>::from_float(offset + rng.uniform(-1.0f, 1.0f));
      }
      a = DeviceBuffer<T>(host.size());
      CHECK_CUDA(cudaMemcpy(a.ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
      gamma = random_device<T>(rng, size_t(s.k), 0.5f, 1.5f);
      beta = random_device<T>(rng, size_t(s.k), -0.5f, 0.5f);
    }
    b = random_device<T>(rng, size_t(s.n * s.k), -w, w);
    if (epi.uses(RefOp::Bias)) bias = random_device<T>(rng, size_t(s.n), -1.0f, 1.0f);
    if (epi.uses(RefOp::Residual)) residual = random_device<T>(rng, size_t(s.m * s.n), -1.0f, 1.0f);
    if (epi.uses(RefOp::Mul)) multiplier = random_device<T>(rng, size_t(s.m * s.n), -1.0f, 1.0f);
    c = DeviceBuffer<T>(size_t(s.m * s.n));
    c.poison();
  }
  GemmArgs<T> args(Shape s) const {
    GemmArgs<T> p{};
    p.a = a.ptr;
    p.b = b.ptr;
    p.c = c.ptr;
    p.m = s.m;
    p.n = s.n;
    p.k = s.k;
    p.epilogue.bias = bias.ptr;
    p.epilogue.residual = residual.ptr;
    p.epilogue.multiplier = multiplier.ptr;
    p.norm.gamma = gamma.ptr;
    p.norm.beta = beta.ptr;
    p.norm.eps = 1e-5f;
    return p;
  }
};

template <typename T>
DeviceBuffer<float> reference_gemm(const GemmArgs<T>& p, LayoutB layout, const RefEpilogue& epi, RefNorm norm) {
  DeviceBuffer<float> a32(size_t(p.m * p.k)), b32(size_t(p.k * p.n)), out(size_t(p.m * p.n));
  ref_rows_kernel<T><<<unsigned((p.m + 127) / 128), 128>>>(p.a, a32.ptr, p.m, p.k, norm, p.norm);
  CHECK_CUDA(cudaGetLastError());
  ref_b_kernel<T><<<unsigned((p.k * p.n + 255) / 256), 256>>>(p.b, b32.ptr, p.k, p.n, layout);
  CHECK_CUDA(cudaGetLastError());
  const dim3 grid(unsigned((p.n + 15) / 16), unsigned((p.m + 15) / 16));
  ref_gemm_kernel<T><<<grid, dim3(16, 16)>>>(a32.ptr, b32.ptr, out.ptr, p.m, p.n, p.k, epi, p.epilogue);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  return out;
}

const char* layout_name(LayoutB l) { return l == LayoutB::KN ? "KN" : "NK"; }

template <typename Tile>
std::string tile_name() {
  char buf[48];
  std::snprintf(buf, sizeof buf, "%dx%dx%d/%dx%d", Tile::BM, Tile::BN, Tile::BK, Tile::WM, Tile::WN);
  return buf;
}

// The workspace of a launch, given the way the Rust run time gives it: the
// size the launcher asks for, from one buffer grown on demand and zeroed
// when grown (stream-K's flags must start at 0; launches leave them at 0).
// FUSION_STREAM_K=0 asks for no stream-K, as it does of the run time.
fusion::Workspace grow_workspace(size_t bytes) {
  static void* base = nullptr;
  static size_t capacity = 0;
  static const uint32_t flags = [] {
    const char* value = std::getenv("FUSION_STREAM_K");
    return value != nullptr && std::strcmp(value, "0") == 0 ? FUSION_GEMM_NO_STREAM_K : 0u;
  }();
  if (bytes > capacity) {
    CHECK_CUDA(cudaDeviceSynchronize());
    CHECK_CUDA(cudaFree(base));
    CHECK_CUDA(cudaMalloc(&base, bytes));
    CHECK_CUDA(cudaMemset(base, 0, bytes));
    capacity = bytes;
  }
  return fusion::Workspace{base, capacity, flags};
}

template <typename Kernel>
fusion::Workspace workspace_for(const GemmArgs<typename Kernel::Element>& p) {
  size_t bytes = 0;
  CHECK_CUDA(Kernel::workspace_bytes(p, grow_workspace(0).flags, &bytes));
  return grow_workspace(bytes);
}

// Runs one composition on one shape and compares it with the reference.
template <typename Mainloop, typename Prologue, typename Epilogue, LayoutB kLayout>
void check_fused_gemm(Totals& totals, const char* arch, const char* composition, Shape s, Rng& rng) {
  using T = typename Mainloop::Element;
  const RefEpilogue epi = RefEpilogueOf<Epilogue>::get();
  const RefNorm norm = RefNormOf<Prologue>::value;
  GemmInputs<T> in(rng, s, epi, norm);
  const GemmArgs<T> p = in.args(s);
  const std::string name = std::string(arch) + " " + Numeric<T>::name + " " + layout_name(kLayout) + " " +
                           tile_name<typename Mainloop::Config>() + " " + composition + " " + shape_label(s);
  using Kernel = FusedGemm<Mainloop, Prologue, Epilogue>;
  const cudaError_t err = Kernel::launch(p, workspace_for<Kernel>(p), nullptr);
  if (err != cudaSuccess) {
    expect(totals, name, false, std::string("launch returned ") + cudaGetErrorName(err));
    return;
  }
  const cudaError_t sync = cudaDeviceSynchronize();
  if (sync != cudaSuccess) {
    std::fprintf(stderr, "FATAL %s: kernel failed: %s (%s)\n", name.c_str(), cudaGetErrorName(sync),
                 cudaGetErrorString(sync));
    std::exit(2);
  }
  DeviceBuffer<float> ref = reference_gemm(p, kLayout, epi, norm);
  record(totals, name, compare(p.c, ref.ptr, size_t(s.m * s.n)), s.n);
}

std::vector<Shape> check_shapes(const Options& opt, bool include_large) {
  std::vector<Shape> shapes = {{1, 8, 8}, {77, 136, 136}, {1000, 3000, 136}, {128, 8, 3000}, {512, 2048, 2048}};
  if (include_large) shapes.push_back({4096, 4096, 4096});
  (void)opt;
  return shapes;
}

bool matches(const Options& opt, const std::string& name) {
  return opt.filter.empty() || name.find(opt.filter) != std::string::npos;
}

// The compositions the self-test instantiates: name, prologue, epilogue
// (last, so that its template commas need no parentheses).
#define FUSION_FOR_EACH_COMPOSITION(X)                                  \
  X(gemm, NoPrologue, EpilogueChain<>)                                  \
  X(gemm_bias, NoPrologue, EpilogueChain<Bias>)                         \
  X(gemm_bias_gelu, NoPrologue, EpilogueChain<Bias, Gelu>)              \
  X(gemm_bias_relu, NoPrologue, EpilogueChain<Bias, Relu>)              \
  X(gemm_silu_mul, NoPrologue, EpilogueChain<Silu, Mul>)                \
  X(gemm_bias_residual, NoPrologue, EpilogueChain<Bias, Residual>)      \
  X(gemm_bias_gelu_erf_mul_residual, NoPrologue, EpilogueChain<Bias, GeluErf, Mul, Residual>) \
  X(layernorm_gemm, LayerNormPrologue, EpilogueChain<>)                 \
  X(rmsnorm_gemm, RmsNormPrologue, EpilogueChain<>)                     \
  X(layernorm_gemm_bias_gelu, LayerNormPrologue, EpilogueChain<Bias, Gelu>)

// Every composition on every shape for one (arch, mainloop) family. The
// 4096^3 shape runs for all compositions in full mode and only for
// gemm_bias_gelu in quick mode.
template <template <typename, LayoutB> class MainloopFor, typename T, LayoutB kLayout>
void check_family(Totals& totals, const Options& opt, const char* arch, bool all_compositions, Rng& rng) {
#define FUSION_CHECK_COMPOSITION(NAME, PROLOGUE, ...)                                                     \
  if (all_compositions || std::strcmp(#NAME, "gemm_bias_gelu") == 0 ||                                         \
      std::strcmp(#NAME, "layernorm_gemm_bias_gelu") == 0 || std::strcmp(#NAME, "gemm_silu_mul") == 0) {       \
    for (const Shape& s : check_shapes(opt, !opt.quick || std::strcmp(#NAME, "gemm_bias_gelu") == 0)) {        \
      const std::string key = std::string(arch) + " " + Numeric<T>::name + " " + layout_name(kLayout) + " " + \
                              tile_name<typename MainloopFor<T, kLayout>::Config>() + " " + #NAME + " " +      \
                              shape_label(s);                                                                    \
      if (matches(opt, key))                                                                                   \
          check_fused_gemm<MainloopFor<T, kLayout>, PROLOGUE, __VA_ARGS__, kLayout>(totals, arch, #NAME, s, rng); \
    }                                                                                                          \
  }
  FUSION_FOR_EACH_COMPOSITION(FUSION_CHECK_COMPOSITION)
#undef FUSION_CHECK_COMPOSITION
}

#if FUSION_SELFTEST_SM80
template <typename T, LayoutB L>
using Sm80Large = sm80::Mainloop<T, L, sm80::Tile128x256>;
template <typename T, LayoutB L>
using Sm80Small = sm80::Mainloop<T, L, sm80::Tile128x128>;

void check_sm80(Totals& totals, const Options& opt, Rng& rng) {
  check_family<Sm80Large, __half, LayoutB::NK>(totals, opt, "sm80", true, rng);
  check_family<Sm80Large, __half, LayoutB::KN>(totals, opt, "sm80", true, rng);
  check_family<Sm80Large, __nv_bfloat16, LayoutB::NK>(totals, opt, "sm80", true, rng);
  check_family<Sm80Large, __nv_bfloat16, LayoutB::KN>(totals, opt, "sm80", true, rng);
  check_family<Sm80Small, __half, LayoutB::NK>(totals, opt, "sm80", !opt.quick, rng);
  check_family<Sm80Small, __half, LayoutB::KN>(totals, opt, "sm80", !opt.quick, rng);
  check_family<Sm80Small, __nv_bfloat16, LayoutB::NK>(totals, opt, "sm80", !opt.quick, rng);
  check_family<Sm80Small, __nv_bfloat16, LayoutB::KN>(totals, opt, "sm80", !opt.quick, rng);
}

#if FUSION_SELFTEST_SM90
template <typename T, LayoutB L>
using Sm90Large = sm90::Mainloop<T, L, sm90::TileConfig<128, 256, 4>>;
template <typename T, LayoutB L>
using Sm90Small = sm90::Mainloop<T, L, sm90::TileConfig<128, 128, 6>>;
template <typename T, LayoutB L>
using Sm90PingPong = sm90::Mainloop<T, L, sm90::TileConfig<128, 128, 5, sm90::Schedule::PingPong>>;
template <typename T, LayoutB L>
using Sm90Narrow = sm90::Mainloop<T, L, sm90::TileConfig<64, 128, 8>>;
template <typename T, LayoutB L>
using Sm90Cluster = sm90::Mainloop<T, L, sm90::TileConfig<128, 256, 3, sm90::Schedule::Cooperative, 2>>;
// Four stages leave room for half the staging tile only (kStagingParts 2).
template <typename T, LayoutB L>
using Sm90FourStagesCluster = sm90::Mainloop<T, L, sm90::TileConfig<128, 256, 4, sm90::Schedule::Cooperative, 2>>;
template <typename T, LayoutB L>
using Sm90PingPongCluster = sm90::Mainloop<T, L, sm90::TileConfig<128, 128, 5, sm90::Schedule::PingPong, 2>>;

// Every composition, the norm ones included (the sm90 norm prologue).
void check_sm90(Totals& totals, const Options& opt, Rng& rng) {
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, 0));
  if (prop.major != 9 || prop.minor != 0) {
    expect(totals, "sm90 mainloop", false, "this build checks sm_90a kernels and needs a compute capability 9.0 GPU");
    return;
  }
  check_family<Sm90Large, __half, LayoutB::NK>(totals, opt, "sm90", true, rng);
  check_family<Sm90Large, __half, LayoutB::KN>(totals, opt, "sm90", true, rng);
  check_family<Sm90Large, __nv_bfloat16, LayoutB::NK>(totals, opt, "sm90", true, rng);
  check_family<Sm90Large, __nv_bfloat16, LayoutB::KN>(totals, opt, "sm90", true, rng);
  check_family<Sm90Small, __half, LayoutB::NK>(totals, opt, "sm90", !opt.quick, rng);
  check_family<Sm90Small, __half, LayoutB::KN>(totals, opt, "sm90", !opt.quick, rng);
  check_family<Sm90Small, __nv_bfloat16, LayoutB::NK>(totals, opt, "sm90", !opt.quick, rng);
  check_family<Sm90Small, __nv_bfloat16, LayoutB::KN>(totals, opt, "sm90", !opt.quick, rng);
  check_family<Sm90PingPong, __half, LayoutB::NK>(totals, opt, "sm90pp", true, rng);
  check_family<Sm90PingPong, __half, LayoutB::KN>(totals, opt, "sm90pp", true, rng);
  check_family<Sm90PingPong, __nv_bfloat16, LayoutB::NK>(totals, opt, "sm90pp", true, rng);
  check_family<Sm90PingPong, __nv_bfloat16, LayoutB::KN>(totals, opt, "sm90pp", true, rng);
  check_family<Sm90Narrow, __half, LayoutB::NK>(totals, opt, "sm90", !opt.quick, rng);
  check_family<Sm90Narrow, __nv_bfloat16, LayoutB::KN>(totals, opt, "sm90", !opt.quick, rng);
  check_family<Sm90FourStagesCluster, __half, LayoutB::KN>(totals, opt, "sm90s4c2", true, rng);
  check_family<Sm90Cluster, __half, LayoutB::NK>(totals, opt, "sm90c2", true, rng);
  check_family<Sm90Cluster, __nv_bfloat16, LayoutB::KN>(totals, opt, "sm90c2", true, rng);
  check_family<Sm90PingPongCluster, __half, LayoutB::KN>(totals, opt, "sm90ppc2", true, rng);
  check_family<Sm90PingPongCluster, __nv_bfloat16, LayoutB::NK>(totals, opt, "sm90ppc2", true, rng);
}
template <typename T, LayoutB L>
using BenchLarge = Sm90Large<T, L>;
// The tuned small-M tile of kernels/tuned/sm90.json.
template <typename T, LayoutB L>
using BenchSmall = Sm90Narrow<T, L>;
constexpr const char* kBenchArch = "sm90";
#else
template <typename T, LayoutB L>
using BenchLarge = Sm80Large<T, L>;
template <typename T, LayoutB L>
using BenchSmall = Sm80Small<T, L>;
constexpr const char* kBenchArch = "sm80";
#endif

// The hand-written rendered units, called through their C ABI, including the
// argument checks they must reject.
void check_rendered_units(Totals& totals, const Options& opt, Rng& rng) {
  if (!matches(opt, "rendered")) return;
  for (const Shape s : {Shape{77, 136, 136}, Shape{512, 2048, 2048}}) {
    const RefEpilogue epi = RefEpilogueOf<EpilogueChain<Bias, Gelu>>::get();
    GemmInputs<__half> in(rng, s, epi, RefNorm::None);
    fusion_gemm_bias_gelu_params p{in.a.ptr, in.b.ptr, in.bias.ptr, in.c.ptr, s.m, s.n, s.k};
    const int rc = fusion_gemm_bias_gelu_sm80(&p, nullptr);
    const std::string name = "rendered fusion_gemm_bias_gelu_sm80 " + shape_label(s);
    if (rc != 0) {
      expect(totals, name, false, std::string("returned ") + cudaGetErrorName(cudaError_t(rc)));
    } else {
      CHECK_CUDA(cudaDeviceSynchronize());
      DeviceBuffer<float> ref = reference_gemm(in.args(s), LayoutB::NK, epi, RefNorm::None);
      record(totals, name, compare(in.c.ptr, ref.ptr, size_t(s.m * s.n)), s.n);
    }

    GemmInputs<__nv_bfloat16> ln(rng, s, epi, RefNorm::LayerNorm);
    fusion_layernorm_gemm_bias_gelu_params q{ln.a.ptr, ln.gamma.ptr, ln.beta.ptr, ln.b.ptr, ln.bias.ptr,
                                             ln.c.ptr,  s.m,         s.n,        s.k,      1e-5f};
    const int rc2 = fusion_layernorm_gemm_bias_gelu_sm80(&q, nullptr);
    const std::string name2 = "rendered fusion_layernorm_gemm_bias_gelu_sm80 " + shape_label(s);
    if (rc2 != 0) {
      expect(totals, name2, false, std::string("returned ") + cudaGetErrorName(cudaError_t(rc2)));
    } else {
      CHECK_CUDA(cudaDeviceSynchronize());
      DeviceBuffer<float> ref = reference_gemm(ln.args(s), LayoutB::NK, epi, RefNorm::LayerNorm);
      record(totals, name2, compare(ln.c.ptr, ref.ptr, size_t(s.m * s.n)), s.n);
    }
  }
  // Argument checks: each of these must be refused with cudaErrorInvalidValue
  // before anything is launched.
  const Shape s{64, 64, 64};
  GemmInputs<__half> in(rng, s, RefEpilogueOf<EpilogueChain<Bias, Gelu>>::get(), RefNorm::None);
  struct BadCase {
    const char* what;
    fusion_gemm_bias_gelu_params p;
  };
  const fusion_gemm_bias_gelu_params good{in.a.ptr, in.b.ptr, in.bias.ptr, in.c.ptr, s.m, s.n, s.k};
  std::vector<BadCase> bad;
  bad.push_back({"n not a multiple of 8", good});
  bad.back().p.n = 60;
  bad.push_back({"k not a multiple of 8", good});
  bad.back().p.k = 60;
  bad.push_back({"k = 0", good});
  bad.back().p.k = 0;
  bad.push_back({"misaligned a", good});
  bad.back().p.a = in.a.ptr + 1;
  bad.push_back({"misaligned c", good});
  bad.back().p.c = in.c.ptr + 4;
  bad.push_back({"null bias", good});
  bad.back().p.bias = nullptr;
  bad.push_back({"negative m", good});
  bad.back().p.m = -1;
  for (const BadCase& b : bad) {
    const int rc = fusion_gemm_bias_gelu_sm80(&b.p, nullptr);
    expect(totals, std::string("rendered rejects ") + b.what, rc == int(cudaErrorInvalidValue),
           std::string("returned ") + cudaGetErrorName(cudaError_t(rc)));
  }
  const int rc_null = fusion_gemm_bias_gelu_sm80(nullptr, nullptr);
  expect(totals, "rendered rejects null params", rc_null == int(cudaErrorInvalidValue),
         std::string("returned ") + cudaGetErrorName(cudaError_t(rc_null)));
  fusion_gemm_bias_gelu_params empty = good;
  empty.m = 0;
  const int rc_empty = fusion_gemm_bias_gelu_sm80(&empty, nullptr);
  expect(totals, "rendered accepts m = 0 as a no-op", rc_empty == 0,
         std::string("returned ") + cudaGetErrorName(cudaError_t(rc_empty)));
  CHECK_CUDA(cudaDeviceSynchronize());
}
#endif

#if FUSION_SELFTEST_SM75
template <typename T, LayoutB L>
using Sm75Tile = sm75::Mainloop<T, L, sm75::Tile128x128>;

void check_sm75(Totals& totals, const Options& opt, Rng& rng) {
  check_family<Sm75Tile, __half, LayoutB::NK>(totals, opt, "sm75", true, rng);
  check_family<Sm75Tile, __half, LayoutB::KN>(totals, opt, "sm75", true, rng);
}
#endif

// --------------------------------------------------------------------------
// Standalone elementwise and norm kernels
// --------------------------------------------------------------------------
template <typename Chain, typename T>
void check_elementwise_one(Totals& totals, const Options& opt, const char* what, int64_t M, int64_t N, Rng& rng) {
  char label[160];
  std::snprintf(label, sizeof label, "elementwise %s %s (%lld,%lld)", Numeric<T>::name, what, (long long)M,
                (long long)N);
  if (!matches(opt, label)) return;
  const RefEpilogue epi = RefEpilogueOf<Chain>::get();
  DeviceBuffer<T> x = random_device<T>(rng, size_t(M * N), -3.0f, 3.0f);
  DeviceBuffer<T> bias, residual, multiplier;
  if (epi.uses(RefOp::Bias)) bias = random_device<T>(rng, size_t(N), -1.0f, 1.0f);
  if (epi.uses(RefOp::Residual)) residual = random_device<T>(rng, size_t(M * N), -1.0f, 1.0f);
  if (epi.uses(RefOp::Mul)) multiplier = random_device<T>(rng, size_t(M * N), -1.0f, 1.0f);
  DeviceBuffer<T> y(size_t(M * N));
  y.poison();
  const EpilogueArgs args{bias.ptr, residual.ptr, multiplier.ptr};
  const cudaError_t err = launch_elementwise<Chain, T>(x.ptr, y.ptr, args, M, N, nullptr);
  if (err != cudaSuccess) {
    expect(totals, label, false, std::string("launch returned ") + cudaGetErrorName(err));
    return;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  DeviceBuffer<float> ref(size_t(M * N));
  ref_elementwise_kernel<T><<<unsigned((M * N + 255) / 256), 256>>>(x.ptr, ref.ptr, M, N, epi, args);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  record(totals, label, compare(y.ptr, ref.ptr, size_t(M * N)), N);
}

template <NormKind kKind, typename T>
void check_norm_one(Totals& totals, const Options& opt, int64_t M, int64_t K, Rng& rng) {
  char label[160];
  std::snprintf(label, sizeof label, "norm %s %s (%lld,%lld)", Numeric<T>::name,
                kKind == NormKind::LayerNorm ? "layernorm" : "rmsnorm", (long long)M, (long long)K);
  if (!matches(opt, label)) return;
  std::vector<T> host(size_t(M * K));
  for (int64_t m = 0; m < M; ++m) {
    const float offset = rng.uniform(-2.0f, 2.0f);
    for (int64_t k = 0; k < K; ++k) host[size_t(m * K + k)] = Numeric<T>::from_float(offset + rng.uniform(-1.0f, 1.0f));
  }
  DeviceBuffer<T> x(host.size());
  CHECK_CUDA(cudaMemcpy(x.ptr, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice));
  DeviceBuffer<T> gamma = random_device<T>(rng, size_t(K), 0.5f, 1.5f);
  DeviceBuffer<T> beta = random_device<T>(rng, size_t(K), -0.5f, 0.5f);
  DeviceBuffer<T> y(size_t(M * K));
  y.poison();
  const NormArgs args{gamma.ptr, beta.ptr, 1e-5f};
  const cudaError_t err = launch_norm_rows<kKind, T>(x.ptr, y.ptr, args, M, K, nullptr);
  if (err != cudaSuccess) {
    expect(totals, label, false, std::string("launch returned ") + cudaGetErrorName(err));
    return;
  }
  CHECK_CUDA(cudaDeviceSynchronize());
  DeviceBuffer<float> ref(size_t(M * K));
  const RefNorm norm = kKind == NormKind::LayerNorm ? RefNorm::LayerNorm : RefNorm::RmsNorm;
  ref_rows_kernel<T><<<unsigned((M + 127) / 128), 128>>>(x.ptr, ref.ptr, M, K, norm, args);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  record(totals, label, compare(y.ptr, ref.ptr, size_t(M * K)), K);
}

template <typename T>
void check_standalone(Totals& totals, const Options& opt, Rng& rng) {
  const int64_t shapes[][2] = {{1, 8}, {77, 136}, {1000, 3000}, {4096, 4096}};
  for (const auto& s : shapes) {
    const int64_t M = s[0], N = s[1];
    check_elementwise_one<EpilogueChain<Residual>, T>(totals, opt, "add", M, N, rng);
    check_elementwise_one<EpilogueChain<Mul>, T>(totals, opt, "mul", M, N, rng);
    check_elementwise_one<EpilogueChain<Bias>, T>(totals, opt, "bias_add", M, N, rng);
    check_elementwise_one<EpilogueChain<Gelu>, T>(totals, opt, "gelu", M, N, rng);
    check_elementwise_one<EpilogueChain<GeluErf>, T>(totals, opt, "gelu_erf", M, N, rng);
    check_elementwise_one<EpilogueChain<Silu>, T>(totals, opt, "silu", M, N, rng);
    check_elementwise_one<EpilogueChain<Relu>, T>(totals, opt, "relu", M, N, rng);
    check_elementwise_one<EpilogueChain<Bias, Gelu, Residual>, T>(totals, opt, "bias_gelu_add", M, N, rng);
    check_norm_one<NormKind::LayerNorm, T>(totals, opt, M, N, rng);
    check_norm_one<NormKind::RmsNorm, T>(totals, opt, M, N, rng);
  }
}

// --------------------------------------------------------------------------
// Kernel resource report: registers, local memory (spills), shared memory
// and achievable occupancy as the driver sees them (after any PTX JIT).
// --------------------------------------------------------------------------
template <typename Mainloop, typename Prologue, typename Epilogue>
void report_kernel(const char* label) {
  const void* fn = reinterpret_cast<const void*>(&fused_gemm_kernel<Mainloop, Prologue, Epilogue>);
  cudaFuncAttributes attr{};
  CHECK_CUDA(cudaFuncGetAttributes(&attr, fn));
  CHECK_CUDA(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, int(Mainloop::kSmemBytes)));
  int blocks = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, Mainloop::kThreads, Mainloop::kSmemBytes));
  std::printf("  %-52s regs=%3d local=%5zu B static_smem=%5zu B dyn_smem=%6zu B threads=%d blocks/SM=%d ptx=%d sass=%d\n",
              label, attr.numRegs, attr.localSizeBytes, attr.sharedSizeBytes, size_t(Mainloop::kSmemBytes),
              Mainloop::kThreads, blocks, attr.ptxVersion, attr.binaryVersion);
}

void report_kernels() {
  std::printf("kernel resources (as loaded on this device):\n");
#if FUSION_SELFTEST_SM80
  report_kernel<Sm80Large<__half, LayoutB::NK>, NoPrologue, EpilogueChain<Bias, Gelu>>("sm80 f16 NK 128x256 gemm_bias_gelu");
  report_kernel<Sm80Large<__half, LayoutB::KN>, NoPrologue, EpilogueChain<Bias, Gelu>>("sm80 f16 KN 128x256 gemm_bias_gelu");
  report_kernel<Sm80Large<__nv_bfloat16, LayoutB::NK>, NoPrologue, EpilogueChain<Bias, Gelu>>("sm80 bf16 NK 128x256 gemm_bias_gelu");
  report_kernel<Sm80Large<__half, LayoutB::NK>, LayerNormPrologue, EpilogueChain<Bias, Gelu>>("sm80 f16 NK 128x256 layernorm_gemm_bias_gelu");
  report_kernel<Sm80Small<__half, LayoutB::NK>, NoPrologue, EpilogueChain<Bias, Gelu>>("sm80 f16 NK 128x128 gemm_bias_gelu");
#endif
#if FUSION_SELFTEST_SM75
  report_kernel<Sm75Tile<__half, LayoutB::NK>, NoPrologue, EpilogueChain<Bias, Gelu>>("sm75 f16 NK 128x128 gemm_bias_gelu");
  report_kernel<Sm75Tile<__half, LayoutB::KN>, LayerNormPrologue, EpilogueChain<Bias, Gelu>>("sm75 f16 KN 128x128 layernorm_gemm_bias_gelu");
#endif
}

// ===========================================================================
// Benchmark (sm80 mainloop vs cuBLASLt fused epilogues and cuBLAS)
// ===========================================================================
#if FUSION_SELFTEST_SM80

struct BenchSet {
  DeviceBuffer<__half> a, b, bias, c;
  DeviceBuffer<__half> gamma, beta, normed;  // the norm rows: [K], [K], and norm(A) for the baseline
};

// One input set for shape s: A ~U(-1, 1), B scaled by 1/sqrt(K), bias
// ~U(-1, 1), C poisoned; `seed` advances by one per tensor.
BenchSet random_bench_set(Shape s, uint64_t& seed) {
  BenchSet set;
  set.a = DeviceBuffer<__half>(size_t(s.m * s.k));
  set.b = DeviceBuffer<__half>(size_t(s.n * s.k));
  set.bias = DeviceBuffer<__half>(size_t(s.n));
  set.c = DeviceBuffer<__half>(size_t(s.m * s.n));
  set.gamma = DeviceBuffer<__half>(size_t(s.k));
  set.beta = DeviceBuffer<__half>(size_t(s.k));
  set.normed = DeviceBuffer<__half>(size_t(s.m * s.k));
  fill_random_kernel<<<1024, 256>>>(set.gamma.ptr, set.gamma.count, ++seed, 1.0f);
  fill_random_kernel<<<1024, 256>>>(set.beta.ptr, set.beta.count, ++seed, 1.0f);
  fill_random_kernel<<<1024, 256>>>(set.a.ptr, set.a.count, ++seed, 1.0f);
  fill_random_kernel<<<1024, 256>>>(set.b.ptr, set.b.count, ++seed, 1.0f / std::sqrt(float(s.k)));
  fill_random_kernel<<<1024, 256>>>(set.bias.ptr, set.bias.count, ++seed, 1.0f);
  CHECK_CUDA(cudaGetLastError());
  set.c.poison();
  return set;
}

// Our kernel on one input set with `a` as A (the set's own A, or the norm
// kernel's output for the unfused norm rows).
template <typename Mainloop, typename Epilogue, typename Prologue = NoPrologue>
void launch_ours_on(const BenchSet& set, Shape s, const __half* a) {
  GemmArgs<__half> p{};
  p.a = a;
  p.b = set.b.ptr;
  p.c = set.c.ptr;
  p.m = s.m;
  p.n = s.n;
  p.k = s.k;
  p.epilogue.bias = set.bias.ptr;
  p.norm = NormArgs{set.gamma.ptr, set.beta.ptr, 1e-5f};
  using Kernel = FusedGemm<Mainloop, Prologue, Epilogue>;
  CHECK_CUDA(Kernel::launch(p, workspace_for<Kernel>(p), nullptr));
}

template <typename Mainloop, typename Epilogue, typename Prologue = NoPrologue>
void launch_ours(const BenchSet& set, Shape s) {
  launch_ours_on<Mainloop, Epilogue, Prologue>(set, s, set.a.ptr);
}

// Relative difference between two f16 outputs on the device.
double rel_diff(const __half* x, const __half* y, size_t n) {
  std::vector<__half> hx(n), hy(n);
  CHECK_CUDA(cudaMemcpy(hx.data(), x, n * sizeof(__half), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(hy.data(), y, n * sizeof(__half), cudaMemcpyDeviceToHost));
  double d2 = 0.0, r2 = 0.0;
  for (size_t i = 0; i < n; ++i) {
    const double a = __half2float(hx[i]), b = __half2float(hy[i]);
    if (!std::isfinite(a) || !std::isfinite(b)) return INFINITY;
    d2 += (a - b) * (a - b);
    r2 += b * b;
  }
  return std::sqrt(d2 / std::max(r2, 1e-30));
}

struct BenchRow {
  std::string shape, what, ours_cfg;
  double ours_us, base_us;
  double flops;
};

// Tile configs the benchmark times side by side on gemm_bias_gelu and on
// the plain GEMM.
struct BenchVariant {
  const char* name;
  void (*gelu)(const BenchSet&, Shape);
  void (*plain)(const BenchSet&, Shape);
};

template <typename Mainloop>
BenchVariant variant(const char* name) {
  return {name, launch_ours<Mainloop, EpilogueChain<Bias, Gelu>>, launch_ours<Mainloop, EpilogueChain<>>};
}

#if FUSION_SELFTEST_SM90
template <int BM, int BN, int kStages, sm90::Schedule kSchedule, int kClusterM = 1>
using Sm90Variant = sm90::Mainloop<__half, LayoutB::NK, sm90::TileConfig<BM, BN, kStages, kSchedule, kClusterM>>;
constexpr sm90::Schedule kCoop = sm90::Schedule::Cooperative, kPingPong = sm90::Schedule::PingPong;

// How many clusters of the 2-CTA variants can be resident at once (a
// persistent grid uses that many); called after the benchmark launched them.
template <typename Mainloop>
void report_resident_clusters(const char* name, int sm_count) {
  cudaLaunchConfig_t config{};
  config.gridDim = dim3(unsigned(sm_count));
  config.blockDim = dim3(Mainloop::kThreads);
  config.dynamicSmemBytes = Mainloop::kSmemBytes;
  cudaLaunchAttribute cluster{};
  cluster.id = cudaLaunchAttributeClusterDimension;
  cluster.val.clusterDim.x = 2;
  cluster.val.clusterDim.y = 1;
  cluster.val.clusterDim.z = 1;
  config.attrs = &cluster;
  config.numAttrs = 1;
  int resident = 0;
  CHECK_CUDA(cudaOccupancyMaxActiveClusters(
      &resident, sm90::persistent_gemm_kernel<Mainloop, NoPrologue, EpilogueChain<Bias, Gelu>>, &config));
  std::printf("%s: %d clusters of 2 resident at once (%d smem bytes per CTA)\n", name, resident,
              Mainloop::kSmemBytes);
}

void report_cluster_occupancy(int sm_count) {
  report_resident_clusters<Sm90Variant<128, 256, 3, kCoop, 2>>("co128x256s3c2", sm_count);
  report_resident_clusters<Sm90Variant<128, 128, 5, kPingPong, 2>>("pp128x128s5c2", sm_count);
}

std::vector<BenchVariant> bench_variants() {
  return {variant<Sm90Variant<128, 256, 4, kCoop>>("co128x256s4"),
          variant<Sm90Variant<128, 256, 3, kCoop>>("co128x256s3"),
          variant<Sm90Variant<128, 256, 4, kCoop, 2>>("co128x256s4c2"),
          variant<Sm90Variant<128, 256, 3, kCoop, 2>>("co128x256s3c2"),
          variant<Sm90Variant<128, 128, 5, kPingPong, 2>>("pp128x128s5c2"),
          variant<Sm90Variant<128, 128, 5, kPingPong>>("pp128x128s5"),
          variant<Sm90Variant<128, 128, 6, kCoop>>("co128x128s6"),
          variant<Sm90Variant<64, 128, 8, kCoop>>("co64x128s8")};
}
#else
void report_cluster_occupancy(int) {}
std::vector<BenchVariant> bench_variants() {
  return {variant<Sm80Large<__half, LayoutB::NK>>("128x256"), variant<Sm80Small<__half, LayoutB::NK>>("128x128")};
}
#endif

void bench(const Options& opt, int sm_count) {
  std::vector<Shape> shapes = {{512, 2048, 2048}, {4096, 4096, 4096}, {8192, 8192, 8192}, {8192, 14336, 4096},
                               {8192, 4096, 14336}, {128, 14336, 4096}};
  if (opt.quick) shapes = {{512, 2048, 2048}, {4096, 4096, 4096}};
  if (!opt.shapes.empty()) shapes = opt.shapes;
  const int reps = opt.quick ? 20 : 50;
  LtGemm lt;
  cublasHandle_t blas = nullptr;
  CHECK_CUBLAS(cublasCreate(&blas));
  std::vector<BenchRow> rows;
  uint64_t seed = opt.seed * 1000003ull;
  for (const Shape s : shapes) {
    std::printf("bench %s ...\n", shape_label(s).c_str());
    std::fflush(stdout);
    std::vector<BenchSet> sets;
    for (int i = 0; i < 4; ++i) sets.push_back(random_bench_set(s, seed));
    CHECK_CUDA(cudaDeviceSynchronize());
    const double flops = 2.0 * double(s.m) * double(s.n) * double(s.k);
    // A stand-in for the tuned table's choice: the large tile unless it
    // leaves SMs idle (the table chooses by M and, on sm90, by waves; the
    // variant rows below time every tile).
    const int64_t large_tiles = ((s.m + 127) / 128) * ((s.n + 255) / 256);
    const bool use_small = large_tiles < sm_count;
    const std::string cfg = use_small ? tile_name<typename BenchSmall<__half, LayoutB::NK>::Config>()
                                      : tile_name<typename BenchLarge<__half, LayoutB::NK>::Config>();
    auto ours_with = [&](auto epilogue_tag) {
      using Epilogue = decltype(epilogue_tag);
      return [&, use_small](int i) {
        if (use_small)
          launch_ours<BenchSmall<__half, LayoutB::NK>, Epilogue>(sets[size_t(i)], s);
        else
          launch_ours<BenchLarge<__half, LayoutB::NK>, Epilogue>(sets[size_t(i)], s);
      };
    };

    struct Case {
      const char* what;
      cublasLtEpilogue_t lt_epilogue;
    };
    const Case cases[] = {{"bias_gelu vs cuBLASLt GELU_BIAS", CUBLASLT_EPILOGUE_GELU_BIAS},
                          {"bias_relu vs cuBLASLt RELU_BIAS", CUBLASLT_EPILOGUE_RELU_BIAS},
                          {"bias vs cuBLASLt BIAS", CUBLASLT_EPILOGUE_BIAS}};
    for (const Case& c : cases) {
      LtGemm::Plan plan = lt.plan(s, c.lt_epilogue, sets[0].bias.ptr);
      std::function<void(int)> ours;
      if (c.lt_epilogue == CUBLASLT_EPILOGUE_GELU_BIAS) ours = ours_with(EpilogueChain<Bias, Gelu>{});
      else if (c.lt_epilogue == CUBLASLT_EPILOGUE_RELU_BIAS) ours = ours_with(EpilogueChain<Bias, Relu>{});
      else ours = ours_with(EpilogueChain<Bias>{});
      // Same function, same inputs: our output against cuBLASLt's.
      ours(0);
      CHECK_CUDA(cudaDeviceSynchronize());
      DeviceBuffer<__half> ours_out(sets[0].c.count);
      CHECK_CUDA(cudaMemcpy(ours_out.ptr, sets[0].c.ptr, ours_out.count * sizeof(__half), cudaMemcpyDeviceToDevice));
      lt.run(plan, sets[0].a.ptr, sets[0].b.ptr, sets[0].bias.ptr, sets[0].c.ptr);
      CHECK_CUDA(cudaDeviceSynchronize());
      std::printf("  %-34s ours (%s) vs cuBLASLt output rel diff %.2e\n", c.what, cfg.c_str(),
                  rel_diff(ours_out.ptr, sets[0].c.ptr, ours_out.count));
      const auto lt_run = [&](int i) {
        const BenchSet& set = sets[size_t(i)];
        lt.run(plan, set.a.ptr, set.b.ptr, set.bias.ptr, set.c.ptr);
      };
      const auto [ours_us, lt_us] = median_pair_us(reps, ours, lt_run);
      rows.push_back({shape_label(s), c.what, cfg, ours_us, lt_us, flops});
      // Every tile config on the headline composition, to keep the
      // heuristic honest, each timed beside cuBLASLt again.
      if (c.lt_epilogue == CUBLASLT_EPILOGUE_GELU_BIAS) {
        for (const BenchVariant& v : bench_variants()) {
          const auto [us, base_us] = median_pair_us(reps, [&](int i) { v.gelu(sets[size_t(i)], s); }, lt_run);
          rows.push_back(
              {shape_label(s), std::string("bias_gelu ") + v.name + " vs LtGELU", v.name, us, base_us, flops});
        }
      }
      LtGemm::destroy(plan);
    }
    // Plain GEMM against cublasGemmEx.
    {
      const float alpha = 1.0f, beta = 0.0f;
      const auto blas_run = [&](int i) {
        const BenchSet& set = sets[size_t(i)];
        CHECK_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n), int(s.m), int(s.k), &alpha, set.b.ptr,
                                  CUDA_R_16F, int(s.k), set.a.ptr, CUDA_R_16F, int(s.k), &beta, set.c.ptr, CUDA_R_16F,
                                  int(s.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
      };
      const auto [ours_us, blas_us] = median_pair_us(reps, ours_with(EpilogueChain<>{}), blas_run);
      rows.push_back({shape_label(s), "gemm vs cublasGemmEx", cfg, ours_us, blas_us, flops});
      for (const BenchVariant& v : bench_variants()) {
        const auto [us, base_us] = median_pair_us(reps, [&](int i) { v.plain(sets[size_t(i)], s); }, blas_run);
        rows.push_back({shape_label(s), std::string("gemm ") + v.name + " vs cublas", v.name, us, base_us, flops});
      }
      // The norm GEMMs against the norm kernel into a scratch tensor, then
      // cublasGemmEx on it.
      const auto norm_case = [&](auto prologue_tag, const char* what) {
        using Prologue = decltype(prologue_tag);
        // norm(A) of a set into its `normed`.
        const auto norm_kernel = [&](const BenchSet& set) {
          const NormArgs args{set.gamma.ptr, set.beta.ptr, 1e-5f};
          CHECK_CUDA((launch_norm_rows<Prologue::kKind, __half>(set.a.ptr, set.normed.ptr, args, s.m, s.k, nullptr)));
        };
        const auto base = [&](int i) {
          const BenchSet& set = sets[size_t(i)];
          norm_kernel(set);
          CHECK_CUBLAS(cublasGemmEx(blas, CUBLAS_OP_T, CUBLAS_OP_N, int(s.n), int(s.m), int(s.k), &alpha, set.b.ptr,
                                    CUDA_R_16F, int(s.k), set.normed.ptr, CUDA_R_16F, int(s.k), &beta, set.c.ptr,
                                    CUDA_R_16F, int(s.n), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
        };
        const auto ours = [&](int i) {
          if (use_small)
            launch_ours<BenchSmall<__half, LayoutB::NK>, EpilogueChain<>, Prologue>(sets[size_t(i)], s);
          else
            launch_ours<BenchLarge<__half, LayoutB::NK>, EpilogueChain<>, Prologue>(sets[size_t(i)], s);
        };
        const auto [ours_us, base_us] = median_pair_us(reps, ours, base);
        rows.push_back({shape_label(s), what, cfg, ours_us, base_us, flops});
        // The alternative to fusing: the norm kernel, then our GEMM on its output.
        const auto unfused = [&](int i) {
          const BenchSet& set = sets[size_t(i)];
          norm_kernel(set);
          if (use_small)
            launch_ours_on<BenchSmall<__half, LayoutB::NK>, EpilogueChain<>>(set, s, set.normed.ptr);
          else
            launch_ours_on<BenchLarge<__half, LayoutB::NK>, EpilogueChain<>>(set, s, set.normed.ptr);
        };
        const auto [unfused_us, base2_us] = median_pair_us(reps, unfused, base);
        rows.push_back({shape_label(s), std::string(what) + " (norm kernel + ours)", cfg, unfused_us, base2_us, flops});
      };
      norm_case(LayerNormPrologue{}, "layernorm_gemm vs norm + cublas");
      norm_case(RmsNormPrologue{}, "rmsnorm_gemm vs norm + cublas");
    }
  }
  CHECK_CUBLAS(cublasDestroy(blas));

  std::printf("\nbenchmark (%s mainloop, f16, B as [N,K], f32 accumulate; median of %d runs, each alternating call by call with its baseline; 4 rotating input sets)\n",
              kBenchArch, reps);
  std::printf("%-22s %-38s %-8s %10s %10s %7s %9s %9s\n", "shape (M,N,K)", "composition vs baseline", "tile",
              "ours us", "base us", "ratio", "ours TF/s", "base TF/s");
  for (const BenchRow& r : rows)
    std::printf("%-22s %-38s %-8s %10.1f %10.1f %7.3f %9.1f %9.1f\n", r.shape.c_str(), r.what.c_str(),
                r.ours_cfg.c_str(), r.ours_us, r.base_us, r.base_us / r.ours_us, r.flops / r.ours_us * 1e-6,
                r.flops / r.base_us * 1e-6);
  std::printf("ratio = baseline time / ours (> 1: ours faster)\n");
  report_cluster_occupancy(sm_count);
}
#endif  // FUSION_SELFTEST_SM80

#ifdef FUSION_SM90_TRACE
// --trace (built with -DFUSION_SM90_TRACE): one launch of mainloop ML with
// Epilogue per shape, after warm-up, with the mainloop's
// per-CTA %globaltimer stamps and cycle counters (sm90/trace.cuh),
// summarised across CTAs in microseconds from the earliest CTA start (and
// in SM cycles for the counters).
template <typename ML, typename Epilogue>
void trace_one(const char* what, const BenchSet& set, Shape s) {
  constexpr int kSlots = sm90::trace::kSlots, kPer = sm90::trace::kPerPiece;
  for (int i = 0; i < 5; ++i) launch_ours<ML, Epilogue>(set, s);
  const int ctas = 1024;
  DeviceBuffer<uint64_t> stamps(size_t(ctas) * kSlots);
  CHECK_CUDA(cudaMemset(stamps.ptr, 0, stamps.count * sizeof(uint64_t)));
  CHECK_CUDA(cudaMemcpyToSymbol(sm90::trace::buffer, &stamps.ptr, sizeof(uint64_t*)));
  cudaEvent_t e0, e1;
  CHECK_CUDA(cudaEventCreate(&e0));
  CHECK_CUDA(cudaEventCreate(&e1));
  CHECK_CUDA(cudaEventRecord(e0));
  launch_ours<ML, Epilogue>(set, s);
  CHECK_CUDA(cudaEventRecord(e1));
  CHECK_CUDA(cudaDeviceSynchronize());
  float ms = 0.0f;
  CHECK_CUDA(cudaEventElapsedTime(&ms, e0, e1));
  uint64_t* none = nullptr;
  CHECK_CUDA(cudaMemcpyToSymbol(sm90::trace::buffer, &none, sizeof(uint64_t*)));
  std::vector<uint64_t> h(stamps.count);
  CHECK_CUDA(cudaMemcpy(h.data(), stamps.ptr, h.size() * sizeof(uint64_t), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaEventDestroy(e0));
  CHECK_CUDA(cudaEventDestroy(e1));
  int used = 0;
  while (used < ctas && h[size_t(used) * kSlots] != 0) ++used;
  uint64_t t0 = UINT64_MAX;
  for (int b = 0; b < used; ++b) t0 = std::min(t0, h[size_t(b) * kSlots]);
  auto summary = [&](const std::string& label, std::vector<double> v) {
    if (v.empty()) return;
    std::sort(v.begin(), v.end());
    std::printf("  %-30s n=%4zu min %8.2f  median %8.2f  max %8.2f\n", label.c_str(), v.size(), v.front(),
                v[v.size() / 2], v.back());
  };
  std::printf("trace %s %s: %d CTAs, event time %.1f us\n", what, shape_label(s).c_str(), used, 1000.0 * ms);
  auto at = [&](int b, int slot) { return h[size_t(b) * kSlots + size_t(slot)]; };
  std::vector<double> starts, ends;
  for (int b = 0; b < used; ++b) {
    starts.push_back(double(at(b, 0) - t0) * 1e-3);
    uint64_t last = 0;
    for (int slot = 1; slot < sm90::trace::kCounters; ++slot) last = std::max(last, at(b, slot));
    ends.push_back(double(last - t0) * 1e-3);
  }
  summary("CTA start", starts);
  const char* phases[] = {"K loop", "chain", "staging", "store issue"};
  for (int piece = 0; 1 + kPer * (piece + 1) <= sm90::trace::kCounters; ++piece) {
    const int base = 1 + kPer * piece;
    std::vector<double> begin, dur[4];
    for (int b = 0; b < used; ++b) {
      if (at(b, base) == 0 || at(b, base + 4) == 0) continue;
      begin.push_back(double(at(b, base) - t0) * 1e-3);
      // A Partial piece stamps only its K loop and its end (publish).
      const bool stored = at(b, base + 2) != 0;
      dur[0].push_back(double(at(b, base + 1) - at(b, base)) * 1e-3);
      if (stored) {
        dur[1].push_back(double(at(b, base + 2) - at(b, base + 1)) * 1e-3);
        dur[2].push_back(double(at(b, base + 3) - at(b, base + 2)) * 1e-3);
        dur[3].push_back(double(at(b, base + 4) - at(b, base + 3)) * 1e-3);
      } else {
        dur[3].push_back(double(at(b, base + 4) - at(b, base + 1)) * 1e-3);
      }
    }
    if (begin.empty()) break;
    summary("piece " + std::to_string(piece) + " start", begin);
    for (int ph = 0; ph < 4; ++ph) summary("piece " + std::to_string(piece) + " " + phases[ph], dur[ph]);
    // The same K loop in thousands of SM cycles (a 128x256x64 k-block
    // takes 1024 at the tensor cores' peak), the SM clock (those cycles
    // over its %globaltimer duration) and the barrier waits inside it.
    if (piece >= sm90::trace::kCountedPieces) continue;
    using sm90::trace::Counter;
    auto counter = [&](int b, Counter c) { return double(at(b, sm90::trace::counter_slot(c, piece))); };
    std::vector<double> loop_cycles, clock_ghz, full_wait, empty_wait;
    for (int b = 0; b < used; ++b) {
      if (at(b, base) == 0 || at(b, base + 1) == 0) continue;
      loop_cycles.push_back(counter(b, Counter::KLoop) * 1e-3);
      clock_ghz.push_back(counter(b, Counter::KLoop) / double(at(b, base + 1) - at(b, base)));
      full_wait.push_back(counter(b, Counter::FullWait) * 1e-3);
      empty_wait.push_back(counter(b, Counter::EmptyWait) * 1e-3);
    }
    const std::string label = "piece " + std::to_string(piece);
    summary(label + " K loop kcycles", loop_cycles);
    summary(label + " SM clock GHz", clock_ghz);
    summary(label + " full waits kcycles", full_wait);
    summary(label + " empty waits kcycles", empty_wait);
  }
  summary("CTA end", ends);
}

void trace_timelines() {
  uint64_t seed = 10;
  for (const Shape s : std::vector<Shape>{{4096, 4096, 4096}, {8192, 4096, 14336}}) {
    const BenchSet set = random_bench_set(s, seed);
    trace_one<Sm90Large<__half, LayoutB::NK>, EpilogueChain<Bias, Gelu>>("bias+gelu", set, s);
    trace_one<Sm90Large<__half, LayoutB::NK>, EpilogueChain<>>("bare", set, s);
    // The 2-CTA cluster: does sharing B cost K-loop cycles or clock?
    trace_one<Sm90Cluster<__half, LayoutB::NK>, EpilogueChain<Bias, Gelu>>("bias+gelu, 2-CTA cluster", set, s);
  }
}
#endif

void print_device(int& sm_count) {
  int device = 0, driver = 0, runtime = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  CHECK_CUDA(cudaDriverGetVersion(&driver));
  CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
  int clock_khz = 0, mem_clock_khz = 0;
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, device);
  cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, device);
  sm_count = prop.multiProcessorCount;
  std::printf("device %d: %s, sm_%d%d, %d SMs, %.0f MHz, L2 %d KB, smem/block opt-in %zu KB, driver %d, runtime %d\n",
              device, prop.name, prop.major, prop.minor, prop.multiProcessorCount, clock_khz / 1000.0,
              prop.l2CacheSize / 1024, prop.sharedMemPerBlockOptin / 1024, driver, runtime);
  std::printf("built with: sm80 path %s, sm75 path %s, __CUDACC_VER %d.%d\n", FUSION_SELFTEST_SM80 ? "yes" : "no",
              FUSION_SELFTEST_SM75 ? "yes" : "no", __CUDACC_VER_MAJOR__, __CUDACC_VER_MINOR__);
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--quick") opt.quick = true;
    else if (arg == "--bench") opt.bench = true;
    else if (arg == "--no-check") opt.check = false;
    else if (arg == "--trace") opt.trace = true;
    else if (arg.rfind("--filter=", 0) == 0) opt.filter = arg.substr(9);
    else if (arg.rfind("--seed=", 0) == 0) opt.seed = std::strtoull(arg.c_str() + 7, nullptr, 0);
    else if (Shape shape{}; arg.rfind("--shape=", 0) == 0 && parse_shape(arg.substr(8), shape))
      opt.shapes.push_back(shape);
    else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--bench] [--no-check] [--trace] [--filter=SUBSTRING] [--seed=N]\n"
                   "          [--shape=M,N,K ...]\n"
                   "  --quick      a short run: fewer compositions at 4096^3, two benchmark shapes\n"
                   "  --bench      time against cuBLASLt fused epilogues and cuBLAS (sm80 builds)\n"
                   "  --no-check   skip the correctness checks\n"
                   "  --trace      per-CTA timelines of the large sm90 tile (built with -DFUSION_SM90_TRACE)\n"
                   "  --filter=S   run only checks whose name contains S\n"
                   "  --shape=M,N,K  benchmark this shape (repeat for several) instead of the built-in ones\n",
                   argv[0]);
      return 2;
    }
  }
#ifndef FUSION_SM90_TRACE
  if (opt.trace) {
    std::fprintf(stderr, "--trace needs a build with -DFUSION_SM90_TRACE (kernels/selftest/run.sh --trace)\n");
    return 2;
  }
#endif
  const auto start = std::chrono::steady_clock::now();
  int sm_count = 0;
  print_device(sm_count);
  report_kernels();
  Totals totals;
  if (opt.check) {
    Rng rng(opt.seed);
#if FUSION_SELFTEST_SM80
    check_rendered_units(totals, opt, rng);
    check_sm80(totals, opt, rng);
#endif
#if FUSION_SELFTEST_SM90
    check_sm90(totals, opt, rng);
#endif
#if FUSION_SELFTEST_SM75
    check_sm75(totals, opt, rng);
#endif
    check_standalone<__half>(totals, opt, rng);
    check_standalone<__nv_bfloat16>(totals, opt, rng);
    std::printf("correctness: %d passed, %d failed (tolerance rel_err < %.0e, no NaN)\n", totals.passed,
                totals.failed, kTolerance);
    for (const std::string& f : totals.failures) std::printf("  failed: %s\n", f.c_str());
  }
#ifdef FUSION_SM90_TRACE
  if (opt.trace) trace_timelines();
#endif
#if FUSION_SELFTEST_SM80
  if (opt.bench) bench(opt, sm_count);
#else
  if (opt.bench) std::printf("--bench needs the sm80 path; this build has only sm75\n");
#endif
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("total time %.1f s\n", secs);
  return totals.failed == 0 ? 0 : 1;
}
