// The kernel self-test: checks and times the GEMM units that `fusion render`
// wrote (the same units a build renders, with the tile configs of a
// candidate list), calling each only through the C ABI of fusion/abi.h:
// `<symbol>`, `<symbol>_workspace_bytes` and `<symbol>_resources`. Their
// table, units.inc, is written beside the units; see README.md here for how
// to build and run it.
//
// For every unit whose code runs on this GPU:
// - resources: what each of its tile configs asks for per block;
// - argument checks: calls the launcher must refuse with
//   cudaErrorInvalidValue before launching anything;
// - correctness: fresh random inputs, the output poisoned with NaN, against
//   an f32 GPU reference, within bounds from the dtype's precision (as the
//   Rust GPU tests set theirs, src/testing.rs);
// - with --bench: the median time of the unit and of cuBLASLt with the
//   nearest fused epilogue, called alternately on rotating input sets.

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fusion/abi.h"
#include "fusion/epilogue.cuh"
#include "harness.cuh"

namespace {

using harness::DeviceBuffer;
using harness::Shape;

enum class DType { F16, BF16 };
enum class Layout { KN, NK };
enum class Norm { None, LayerNorm, RmsNorm };

// The compute capabilities a unit's code runs on (the target's RunsOn).
struct RunsOn {
  int major, minor;
  bool exactly;
  bool includes(int ma, int mi) const {
    return exactly ? (ma == major && mi == minor) : (ma > major || (ma == major && mi >= minor));
  }
};

using Launch = int (*)(const fusion_gemm_params*, void*);
using WorkspaceBytes = int (*)(const fusion_gemm_params*, void*, uint64_t*);
using Resources = int (*)(fusion_tile_resources*, int);

// One rendered unit, as units.inc lists it.
struct Unit {
  const char* symbol;
  const char* composition;  // gemm_bias_gelu
  int candidate;            // its index in the candidate list
  const char* arch;         // sm90
  RunsOn runs_on;
  DType dtype;
  Layout layout;
  Norm norm;
  float eps;
  const char* const* steps;  // the epilogue steps' names, in order
  int step_count;
  const char* tile;  // the large tile, as the tuned tables' summaries print it
  Launch launch;
  WorkspaceBytes workspace_bytes;
  Resources resources;
};

}  // namespace

#include "units.inc"

namespace {

// ---------------------------------------------------------------------------
// Options
// ---------------------------------------------------------------------------
struct Options {
  bool quick = false;
  bool bench = false;
  bool check = true;
  bool pad_b = false;  // --pad-b: the timed launches read B's rows padded (Inputs)
  int reps = 50;
  uint64_t seed = 0x5eed;
  std::string filter;
  std::vector<std::string> symbols;  // --unit: only these units, by symbol
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

const char* dtype_name(DType d) { return d == DType::F16 ? "f16" : "bf16"; }
const char* layout_name(Layout l) { return l == Layout::KN ? "KN" : "NK"; }

// `sm90 f16 NK gemm_bias_gelu [128x256x64 (...)] #3`: what a result line names.
std::string unit_label(const Unit& u) {
  return std::string(u.arch) + " " + dtype_name(u.dtype) + " " + layout_name(u.layout) + " " + u.composition +
         " [" + u.tile + "] #" + std::to_string(u.candidate);
}

std::string shape_label(Shape s) { return "(" + harness::shape_str(s) + ")"; }

// ---------------------------------------------------------------------------
// Inputs
// ---------------------------------------------------------------------------
// An epilogue step: one of the three that read an operand, which the
// harness fills, or an activation of the op table, by its index in
// FUSION_ACTIVATIONS (units.inc, written by `fusion render` from the op
// table), whose reference is the CUDA step's own `f` in f32. The Rust GPU
// tests check the kernels built on that `f` against the op table's f64
// formula; here it lets a new activation reach the self-test with no change
// to this file.
enum class Step : int { Bias = -3, Residual = -2, Mul = -1 };

constexpr const char* kActivationNames[] = {
#define FUSION_ACTIVATION_NAME(name, type) name,
    FUSION_ACTIVATIONS(FUSION_ACTIVATION_NAME)
#undef FUSION_ACTIVATION_NAME
};

// The step named as the op table names it (`EpilogueStep::name`), or false
// for a step the reference does not know.
bool step_named(const char* name, Step& step) {
  static const struct {
    const char* name;
    Step step;
  } operands[] = {{"bias", Step::Bias}, {"residual", Step::Residual}, {"mul", Step::Mul}};
  for (const auto& o : operands)
    if (std::strcmp(o.name, name) == 0) {
      step = o.step;
      return true;
    }
  for (int i = 0; i < int(sizeof(kActivationNames) / sizeof(kActivationNames[0])); ++i)
    if (std::strcmp(kActivationNames[i], name) == 0) {
      step = Step(i);
      return true;
    }
  return false;
}

// The activation named `name`, which the op table has.
Step activation(const char* name) {
  Step step;
  if (!step_named(name, step) || int(step) < 0) {
    std::fprintf(stderr, "the op table has no activation `%s`\n", name);
    std::exit(2);
  }
  return step;
}

struct Epilogue {
  std::vector<Step> steps;
  bool uses(Step s) const { return std::find(steps.begin(), steps.end(), s) != steps.end(); }
};

// `offset` + U(-scale, scale); with `row_len`, each row of that length gets
// its own offset in [-offset, offset] instead.
template <typename T>
__global__ void fill_kernel(T* p, size_t n, uint64_t seed, float scale, float offset, int64_t row_len) {
  for (size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    auto hash = [&](uint64_t z) {
      z = seed + 0x9e3779b97f4a7c15ull * (z + 1);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      return float((z ^ (z >> 31)) >> 40) * (1.0f / 16777216.0f);
    };
    const float base = row_len > 0 ? offset * (2.0f * hash(~uint64_t(i / size_t(row_len))) - 1.0f) : offset;
    p[i] = fusion::Numeric<T>::from_float(base + scale * (2.0f * hash(i) - 1.0f));
  }
}

DeviceBuffer<uint16_t> filled(DType d, size_t n, uint64_t seed, float scale, float offset, int64_t row_len) {
  DeviceBuffer<uint16_t> buf(n);
  if (d == DType::F16)
    fill_kernel<<<1024, 256>>>(reinterpret_cast<__half*>(buf.ptr), n, seed, scale, offset, row_len);
  else
    fill_kernel<<<1024, 256>>>(reinterpret_cast<__nv_bfloat16*>(buf.ptr), n, seed, scale, offset, row_len);
  CHECK_CUDA(cudaGetLastError());
  return buf;
}

// One input set of a unit at one shape, in the unit's element type (stored
// as 16-bit words; the kernels below reinterpret them). A ~U(-1, 1) plus a
// per-row offset for a norm prologue (so that the mean matters), B scaled
// by 1/sqrt(K), C poisoned with NaN. With `pad_b`, the launch reads B from
// a copy whose rows are `ldb` elements apart (rounded up to 64 as a graph
// struct pads a bound weight, or 8 more where they already are), the
// padding NaN, so that reading it fails the comparison; `b` stays dense
// for cuBLASLt.
struct Inputs {
  DeviceBuffer<uint16_t> a, b, b_padded, bias, residual, multiplier, gamma, beta, c;
  int64_t ldb = 0;

  Inputs(const Unit& u, const Epilogue& epi, Shape s, uint64_t& seed, bool pad_b = false) {
    a = filled(u.dtype, size_t(s.m * s.k), ++seed, 1.0f, u.norm != Norm::None ? 2.0f : 0.0f, s.k);
    b = filled(u.dtype, size_t(s.n * s.k), ++seed, 1.0f / std::sqrt(float(s.k)), 0.0f, 0);
    if (pad_b) {
      const int64_t row = u.layout == Layout::KN ? s.n : s.k, rows = u.layout == Layout::KN ? s.k : s.n;
      ldb = row % 64 != 0 ? (row + 63) / 64 * 64 : row + 8;
      b_padded = DeviceBuffer<uint16_t>(size_t(rows * ldb));
      b_padded.poison();
      CHECK_CUDA(cudaMemcpy2D(b_padded.ptr, size_t(ldb) * 2, b.ptr, size_t(row) * 2, size_t(row) * 2, size_t(rows),
                              cudaMemcpyDeviceToDevice));
    }
    if (u.norm != Norm::None) {
      gamma = filled(u.dtype, size_t(s.k), ++seed, 0.5f, 1.0f, 0);
      beta = filled(u.dtype, size_t(s.k), ++seed, 0.5f, 0.0f, 0);
    }
    if (epi.uses(Step::Bias)) bias = filled(u.dtype, size_t(s.n), ++seed, 1.0f, 0.0f, 0);
    if (epi.uses(Step::Residual)) residual = filled(u.dtype, size_t(s.m * s.n), ++seed, 1.0f, 0.0f, 0);
    if (epi.uses(Step::Mul)) multiplier = filled(u.dtype, size_t(s.m * s.n), ++seed, 1.0f, 0.0f, 0);
    c = DeviceBuffer<uint16_t>(size_t(s.m * s.n));
    c.poison();
  }

  // No workspace yet: `launch` asks the unit for its size. Members this
  // harness does not know (a folded norm's col_terms) stay null.
  fusion_gemm_params params(const Unit& u, Shape s) const {
    fusion_gemm_params p{};
    p.a = a.ptr, p.b = b.ptr, p.c = c.ptr;
    p.bias = bias.ptr, p.residual = residual.ptr, p.multiplier = multiplier.ptr;
    p.gamma = gamma.ptr, p.beta = beta.ptr;
    p.m = s.m, p.n = s.n, p.k = s.k, p.eps = u.eps;
    if (b_padded.ptr != nullptr) p.b = b_padded.ptr, p.ldb = ldb;
    return p;
  }
};

// ---------------------------------------------------------------------------
// The reference: the same composition, written the obvious way, in f32.
// ---------------------------------------------------------------------------
template <typename T>
__device__ float load(const void* p, int64_t i) {
  return fusion::Numeric<T>::to_float(static_cast<const T*>(p)[i]);
}

// The activation at `index` of FUSION_ACTIVATIONS.
__device__ float apply_activation(int index, float x) {
  int i = 0;
#define FUSION_ACTIVATION_CASE(name, type) \
  if (index == i++) return type::f(x);
  FUSION_ACTIVATIONS(FUSION_ACTIVATION_CASE)
#undef FUSION_ACTIVATION_CASE
  return __int_as_float(0x7fc00000);  // no such activation: NaN, which fails the comparison
}

template <typename T>
__device__ float apply(const Step* steps, int count, float x, int64_t m, int64_t n, int64_t N,
                       const fusion_gemm_params& p) {
  for (int i = 0; i < count; ++i) {
    switch (steps[i]) {
      case Step::Bias: x += load<T>(p.bias, n); break;
      case Step::Residual: x += load<T>(p.residual, m * N + n); break;
      case Step::Mul: x *= load<T>(p.multiplier, m * N + n); break;
      default: x = apply_activation(int(steps[i]), x); break;
    }
  }
  return x;
}

// out[m, :] = norm(a[m, :]) (or a copy), f32, one thread per row, f64 sums.
template <typename T>
__global__ void ref_rows_kernel(fusion_gemm_params p, Norm norm, float* out) {
  const int64_t m = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (m >= p.m) return;
  const int64_t K = p.k;
  double mean = 0.0, rstd = 1.0;
  if (norm != Norm::None) {
    double sum = 0.0, sum_sq = 0.0;
    for (int64_t k = 0; k < K; ++k) sum += load<T>(p.a, m * K + k);
    if (norm == Norm::LayerNorm) mean = sum / double(K);
    for (int64_t k = 0; k < K; ++k) {
      const double d = load<T>(p.a, m * K + k) - mean;
      sum_sq += d * d;
    }
    rstd = 1.0 / sqrt(sum_sq / double(K) + double(p.eps));
  }
  for (int64_t k = 0; k < K; ++k) {
    double y = load<T>(p.a, m * K + k);
    if (norm != Norm::None) {
      y = (y - mean) * rstd * load<T>(p.gamma, k);
      if (norm == Norm::LayerNorm) y += load<T>(p.beta, k);
    }
    out[m * K + k] = float(y);
  }
}

// out = epilogue(a @ B), f32 throughout, 16x16 shared-memory tiles; B in
// the unit's layout.
template <typename T>
__global__ void ref_gemm_kernel(const float* a, fusion_gemm_params p, Layout layout, const Step* steps, int count,
                                float* out) {
  __shared__ float as[16][17], bs[16][17];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t M = p.m, N = p.n, K = p.k;
  const int64_t ldb = p.ldb != 0 ? p.ldb : layout == Layout::KN ? N : K;
  const int64_t m = int64_t(blockIdx.y) * 16 + ty, n = int64_t(blockIdx.x) * 16 + tx;
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    as[ty][tx] = (m < M && k0 + tx < K) ? a[m * K + k0 + tx] : 0.0f;
    const int64_t k = k0 + ty;
    bs[ty][tx] = (k < K && n < N) ? load<T>(p.b, layout == Layout::KN ? k * ldb + n : n * ldb + k) : 0.0f;
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < 16; ++kk) acc += as[ty][kk] * bs[kk][tx];
    __syncthreads();
  }
  if (m < M && n < N) out[m * N + n] = apply<T>(steps, count, acc, m, n, N, p);
}

template <typename T>
DeviceBuffer<float> reference(const Unit& u, const Epilogue& epi, const fusion_gemm_params& p) {
  DeviceBuffer<float> rows(size_t(p.m * p.k)), out(size_t(p.m * p.n));
  DeviceBuffer<Step> steps(epi.steps.size());
  CHECK_CUDA(cudaMemcpy(steps.ptr, epi.steps.data(), epi.steps.size() * sizeof(Step), cudaMemcpyHostToDevice));
  ref_rows_kernel<T><<<unsigned((p.m + 127) / 128), 128>>>(p, u.norm, rows.ptr);
  const dim3 grid(unsigned((p.n + 15) / 16), unsigned((p.m + 15) / 16));
  ref_gemm_kernel<T><<<grid, dim3(16, 16)>>>(rows.ptr, p, u.layout, steps.ptr, int(epi.steps.size()), out.ptr);
  CHECK_CUDA(cudaGetLastError());
  CHECK_CUDA(cudaDeviceSynchronize());
  return out;
}

// ---------------------------------------------------------------------------
// Comparison, with the bounds of src/testing.rs: every element within
// 4 u (|want| + scale), the scale the row's rms but at least 1/16 of the
// whole output's, and ‖got − want‖ / ‖want‖ below 1e-3 (f16) or 8e-3
// (bf16); a non-finite output element fails.
// ---------------------------------------------------------------------------
double unit_roundoff(DType d) { return d == DType::F16 ? std::ldexp(1.0, -11) : std::ldexp(1.0, -8); }
double relative_l2_limit(DType d) { return d == DType::F16 ? 1e-3 : 8e-3; }
constexpr double kElementBound = 4.0;
constexpr double kRowScaleFloor = 1.0 / 16.0;

struct Totals {
  int passed = 0;
  int failed = 0;
  std::vector<std::string> failures;
  void record(const std::string& name, bool ok, const std::string& detail) {
    std::printf("%s %-96s %s\n", ok ? "PASS" : "FAIL", name.c_str(), detail.c_str());
    std::fflush(stdout);
    if (ok) {
      ++passed;
    } else {
      ++failed;
      failures.push_back(name);
    }
  }
};

float to_float(DType d, uint16_t bits) {
  if (d == DType::F16) {
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
  }
  __nv_bfloat16_raw raw;
  raw.x = bits;
  return __bfloat162float(__nv_bfloat16(raw));
}

// Empty when `got` is within the bounds, else what is wrong and where;
// `rel_err` gets the relative L2 error.
std::string compare(DType d, const DeviceBuffer<uint16_t>& got_d, const DeviceBuffer<float>& want_d, Shape s,
                    double& rel_err) {
  const size_t n = size_t(s.m * s.n);
  std::vector<uint16_t> got(n);
  std::vector<float> want(n);
  CHECK_CUDA(cudaMemcpy(got.data(), got_d.ptr, n * sizeof(uint16_t), cudaMemcpyDeviceToHost));
  CHECK_CUDA(cudaMemcpy(want.data(), want_d.ptr, n * sizeof(float), cudaMemcpyDeviceToHost));
  double all_sq = 0.0;
  for (float w : want) all_sq += double(w) * w;
  const double least_scale = kRowScaleFloor * std::sqrt(all_sq / double(std::max<size_t>(n, 1)));
  const double u = unit_roundoff(d);
  double diff_sq = 0.0, worst_excess = 0.0;
  std::string worst;
  char buf[200];
  for (int64_t m = 0; m < s.m; ++m) {
    double row_sq = 0.0;
    for (int64_t j = 0; j < s.n; ++j) row_sq += double(want[size_t(m * s.n + j)]) * want[size_t(m * s.n + j)];
    const double scale = std::max(std::sqrt(row_sq / double(s.n)), least_scale);
    for (int64_t j = 0; j < s.n; ++j) {
      const double g = to_float(d, got[size_t(m * s.n + j)]), w = want[size_t(m * s.n + j)];
      if (!std::isfinite(g)) {
        std::snprintf(buf, sizeof buf, "row %lld, column %lld: got %g where the reference is %g (NaN: unwritten?)",
                      (long long)m, (long long)j, g, w);
        rel_err = INFINITY;
        return buf;
      }
      const double err = std::fabs(g - w), bound = kElementBound * u * (std::fabs(w) + scale);
      diff_sq += err * err;
      if (err > bound && err / bound > worst_excess) {
        worst_excess = err / bound;
        std::snprintf(buf, sizeof buf, "row %lld, column %lld: got %g, reference %g, off by %.3g, bound %.3g",
                      (long long)m, (long long)j, g, w, err, bound);
        worst = buf;
      }
    }
  }
  rel_err = all_sq > 0.0 ? std::sqrt(diff_sq / all_sq) : std::sqrt(diff_sq);
  if (!worst.empty()) return worst;
  if (rel_err >= relative_l2_limit(d)) {
    std::snprintf(buf, sizeof buf, "relative L2 error %.3e over the limit %.0e", rel_err, relative_l2_limit(d));
    return buf;
  }
  return "";
}

// ---------------------------------------------------------------------------
// Calling a unit
// ---------------------------------------------------------------------------
// A zeroed workspace of at least `bytes`, grown on demand and reused, as the
// Rust `Workspace` does.
struct Workspace {
  DeviceBuffer<uint8_t> buffer;
  void* at_least(uint64_t bytes) {
    if (bytes == 0) return nullptr;
    if (buffer.count < bytes) {
      buffer = DeviceBuffer<uint8_t>(size_t(bytes));
      CHECK_CUDA(cudaMemset(buffer.ptr, 0, size_t(bytes)));
    }
    return buffer.ptr;
  }
};

// Fills in the workspace `p` needs and launches; the launcher's status.
int launch(const Unit& u, fusion_gemm_params& p, Workspace& ws) {
  uint64_t bytes = 0;
  const int rc = u.workspace_bytes(&p, nullptr, &bytes);
  if (rc != 0) return rc;
  p.workspace = ws.at_least(bytes);
  p.workspace_bytes = bytes;
  return u.launch(&p, nullptr);
}

std::string status_name(int rc) { return std::string("returned ") + cudaGetErrorName(cudaError_t(rc)); }

void check_one(Totals& totals, const Unit& u, const Epilogue& epi, Shape s, uint64_t& seed, Workspace& ws,
               bool pad_b = false) {
  const std::string name = unit_label(u) + " " + shape_label(s) + (pad_b ? " B rows padded" : "");
  Inputs in(u, epi, s, seed, pad_b);
  fusion_gemm_params p = in.params(u, s);
  const int rc = launch(u, p, ws);
  if (rc != 0) return totals.record(name, false, status_name(rc));
  CHECK_CUDA(cudaDeviceSynchronize());
  const DeviceBuffer<float> want = u.dtype == DType::F16 ? reference<__half>(u, epi, p)
                                                         : reference<__nv_bfloat16>(u, epi, p);
  double rel_err = 0.0;
  const std::string wrong = compare(u.dtype, in.c, want, s, rel_err);
  char detail[64];
  std::snprintf(detail, sizeof detail, "rel_err=%.3e ", rel_err);
  totals.record(name, wrong.empty(), detail + wrong);
}

// Calls each launcher must refuse with cudaErrorInvalidValue before it
// launches anything (the Rust wrappers check the same before calling, so
// only this test reaches the launchers' own checks).
// At m = 64 and m = 1, which a unit with a decode kernel runs on that kernel
// (fusion/decode.cuh), so that both launchers' checks are tested.
void check_arguments(Totals& totals, const Unit& u, const Epilogue& epi, Shape s, uint64_t& seed, Workspace& ws) {
  const std::string label = unit_label(u) + " at m = " + std::to_string(s.m);
  Inputs in(u, epi, s, seed);
  fusion_gemm_params good = in.params(u, s);
  uint64_t needed = 0;
  CHECK_CUDA(cudaError_t(u.workspace_bytes(&good, nullptr, &needed)));
  good.workspace = ws.at_least(needed);
  good.workspace_bytes = needed;
  struct Bad {
    const char* what;
    fusion_gemm_params p;
  };
  std::vector<Bad> bad;
  auto add = [&](const char* what) -> fusion_gemm_params& {
    bad.push_back({what, good});
    return bad.back().p;
  };
  add("n not a multiple of 8").n = 60;
  add("k not a multiple of 8").k = 60;
  add("k = 0").k = 0;
  add("negative m").m = -1;
  add("misaligned a").a = in.a.ptr + 1;
  add("misaligned c").c = in.c.ptr + 4;
  add("B's row stride shorter than its rows").ldb = (u.layout == Layout::KN ? s.n : s.k) - 8;
  add("B's row stride not a multiple of 8").ldb = (u.layout == Layout::KN ? s.n : s.k) + 4;
  if (epi.uses(Step::Bias)) add("null bias").bias = nullptr;
  if (epi.uses(Step::Residual)) add("null residual").residual = nullptr;
  if (epi.uses(Step::Mul)) add("null multiplier").multiplier = nullptr;
  if (u.norm != Norm::None) add("null gamma").gamma = nullptr;
  for (const Bad& b : bad) {
    const int rc = u.launch(&b.p, nullptr);
    totals.record(label + " refuses " + b.what, rc == int(cudaErrorInvalidValue), status_name(rc));
  }
  const int null_params = u.launch(nullptr, nullptr);
  totals.record(label + " refuses null params", null_params == int(cudaErrorInvalidValue),
                status_name(null_params));
  const int null_bytes = u.workspace_bytes(&good, nullptr, nullptr);
  totals.record(label + " refuses a workspace query without a result", null_bytes == int(cudaErrorInvalidValue),
                status_name(null_bytes));
  if (u.norm != Norm::None && needed > 0) {
    fusion_gemm_params no_room = good;  // no room for the row statistics
    no_room.workspace = nullptr;
    no_room.workspace_bytes = 0;
    const int rc = u.launch(&no_room, nullptr);
    totals.record(label + " refuses a norm prologue without workspace", rc == int(cudaErrorInvalidValue),
                  status_name(rc));
  }
  fusion_gemm_params empty = good;
  empty.m = 0;
  const int rc_empty = launch(u, empty, ws);
  totals.record(label + " accepts m = 0 as a no-op", rc_empty == 0, status_name(rc_empty));
  CHECK_CUDA(cudaDeviceSynchronize());
}

// ---------------------------------------------------------------------------
// Benchmark
// ---------------------------------------------------------------------------
// cuBLASLt's nearest fused epilogue: the unit's own when cuBLASLt has it,
// else the plain GEMM (so the ratio includes what fusing saves).
cublasLtEpilogue_t baseline_of(const Epilogue& e, const char*& name) {
  using Steps = std::vector<Step>;
  if (e.steps == Steps{Step::Bias}) return name = "BIAS", CUBLASLT_EPILOGUE_BIAS;
  if (e.steps == Steps{Step::Bias, activation("gelu")}) return name = "GELU_BIAS", CUBLASLT_EPILOGUE_GELU_BIAS;
  if (e.steps == Steps{Step::Bias, activation("relu")}) return name = "RELU_BIAS", CUBLASLT_EPILOGUE_RELU_BIAS;
  return name = "plain", CUBLASLT_EPILOGUE_DEFAULT;
}

void bench_one(harness::LtGemm& lt, const Unit& u, const Epilogue& epi, Shape s, int reps, bool pad_b,
               uint64_t& seed, Workspace& ws) {
  std::vector<Inputs> sets;
  for (int i = 0; i < 4; ++i) sets.emplace_back(u, epi, s, seed, pad_b);
  std::vector<fusion_gemm_params> params;
  for (const Inputs& in : sets) params.push_back(in.params(u, s));
  const char* base_name = nullptr;
  const cublasLtEpilogue_t base_epilogue = baseline_of(epi, base_name);
  const void* any_bias = sets[0].bias.ptr ? static_cast<const void*>(sets[0].bias.ptr) : sets[0].c.ptr;
  harness::LtGemm::Plan plan = lt.plan(s, u.dtype == DType::F16 ? CUDA_R_16F : CUDA_R_16BF, u.layout == Layout::NK,
                                       base_epilogue, any_bias);
  // Workspaces first, so that the timed calls are the launches alone.
  int failed = 0;
  for (fusion_gemm_params& p : params) failed |= launch(u, p, ws);
  const std::vector<double> us = harness::median_rounds_us(
      reps, {[&](int i) { failed |= u.launch(&params[size_t(i)], nullptr); },
             [&](int i) {
               const Inputs& in = sets[size_t(i)];
               lt.run(plan, in.a.ptr, in.b.ptr, in.bias.ptr, in.c.ptr);
             }});
  harness::LtGemm::destroy(plan);
  const double tflops = 2.0 * double(s.m) * double(s.n) * double(s.k) / (us[0] * 1e6);
  // A, B and C once each (2-byte elements): at small M the weight read,
  // against a copy's bandwidth (about 4.25 TB/s on an H200).
  const double gbps = 2.0 * double(s.m * s.k + s.n * s.k + s.m * s.n) / (us[0] * 1e3);
  std::printf("%-96s %-20s %9.1f %9.1f %6.3f %7.1f %7.0f %s%s\n", unit_label(u).c_str(), shape_label(s).c_str(),
              us[0], us[1], us[1] / us[0], tflops, gbps, base_name, failed ? "  (a launch failed)" : "");
  std::fflush(stdout);
}

void print_device(int& major, int& minor) {
  int device = 0, driver = 0, runtime = 0;
  CHECK_CUDA(cudaGetDevice(&device));
  cudaDeviceProp prop{};
  CHECK_CUDA(cudaGetDeviceProperties(&prop, device));
  CHECK_CUDA(cudaDriverGetVersion(&driver));
  CHECK_CUDA(cudaRuntimeGetVersion(&runtime));
  major = prop.major;
  minor = prop.minor;
  std::printf("device %d: %s, sm_%d%d, %d SMs, L2 %d KB, smem/block opt-in %zu KB, driver %d, runtime %d\n", device,
              prop.name, prop.major, prop.minor, prop.multiProcessorCount, prop.l2CacheSize / 1024,
              prop.sharedMemPerBlockOptin / 1024, driver, runtime);
}

void print_resources(const Unit& u) {
  constexpr int kMaxTiles = 8;  // large, large_alt, small_m, small_m_alt, few_m, decode, and room
  fusion_tile_resources tiles[kMaxTiles];
  const int count = u.resources(tiles, kMaxTiles);
  std::printf("  %s:", u.symbol);
  for (int i = 0; i < count && i < kMaxTiles; ++i)
    std::printf(" %s %u B smem, %u threads;", tiles[i].tile, tiles[i].smem_bytes, tiles[i].threads);
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  Options opt;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    Shape shape{};
    if (arg == "--quick") opt.quick = true;
    else if (arg == "--bench") opt.bench = true;
    else if (arg == "--no-check") opt.check = false;
    else if (arg == "--pad-b") opt.pad_b = true;
    else if (arg.rfind("--filter=", 0) == 0) opt.filter = arg.substr(9);
    else if (arg.rfind("--unit=", 0) == 0) {
      std::string list = arg.substr(7);
      for (size_t at = 0; at <= list.size();) {
        const size_t comma = std::min(list.find(',', at), list.size());
        if (comma > at) opt.symbols.push_back(list.substr(at, comma - at));
        at = comma + 1;
      }
    }
    else if (arg.rfind("--seed=", 0) == 0) opt.seed = std::strtoull(arg.c_str() + 7, nullptr, 0);
    else if (arg.rfind("--reps=", 0) == 0 && std::atoi(arg.c_str() + 7) > 0) opt.reps = std::atoi(arg.c_str() + 7);
    else if (arg.rfind("--shape=", 0) == 0 && parse_shape(arg.substr(8), shape)) opt.shapes.push_back(shape);
    else {
      std::fprintf(stderr,
                   "usage: %s [--quick] [--bench] [--no-check] [--pad-b] [--filter=SUBSTRING] [--unit=SYMBOL,...]\n"
                   "          [--seed=N] [--reps=N] [--shape=M,N,K ...]\n"
                   "  --quick      no 4096^3 checks; 20 timed runs\n"
                   "  --bench      time every unit against cuBLASLt\n"
                   "  --no-check   skip the argument and correctness checks\n"
                   "  --pad-b      time our launches on B with padded rows, as a graph struct binds a weight\n"
                   "  --filter=S   only units whose label contains S (sm90 f16 NK gemm_bias_gelu [tile] #3)\n"
                   "  --unit=A,B   only the units with these symbols (cand3_gemm_bias_gelu_nk_f16_sm90), in this order\n"
                   "  --shape=M,N,K  benchmark this shape (repeat for several); default 4096,4096,4096\n",
                   argv[0]);
      return 2;
    }
  }
  if (opt.quick) opt.reps = std::min(opt.reps, 20);
  const auto start = std::chrono::steady_clock::now();
  int major = 0, minor = 0;
  print_device(major, minor);

  std::vector<const Unit*> units;
  std::printf("units (%zu), tile resources per block:\n", sizeof(kUnits) / sizeof(kUnits[0]));
  std::vector<const Unit*> listed;  // kUnits, or the units --unit names in its order
  if (opt.symbols.empty()) {
    for (const Unit& u : kUnits) listed.push_back(&u);
  } else {
    for (const std::string& symbol : opt.symbols) {
      const Unit* found = nullptr;
      for (const Unit& u : kUnits)
        if (symbol == u.symbol) found = &u;
      if (found == nullptr) {
        std::fprintf(stderr, "no unit %s\n", symbol.c_str());
        return 2;
      }
      listed.push_back(found);
    }
  }
  for (const Unit* listed_unit : listed) {
    const Unit& u = *listed_unit;
    if (!opt.filter.empty() && unit_label(u).find(opt.filter) == std::string::npos) continue;
    if (!u.runs_on.includes(major, minor)) {
      std::printf("  %s: skipped, its code does not run on sm_%d%d\n", u.symbol, major, minor);
      continue;
    }
    print_resources(u);
    units.push_back(&u);
  }

  Totals totals;
  uint64_t seed = opt.seed;
  Workspace ws;
  std::vector<const Unit*> known;  // the units whose steps the reference knows
  std::vector<Epilogue> epilogues;
  for (const Unit* u : units) {
    Epilogue e;
    for (Step step; int(e.steps.size()) < u->step_count && step_named(u->steps[e.steps.size()], step);)
      e.steps.push_back(step);
    if (int(e.steps.size()) < u->step_count) {
      totals.record(unit_label(*u), false,
                    std::string("the reference has no step `") + u->steps[e.steps.size()] + "`");
      continue;
    }
    known.push_back(u);
    epilogues.push_back(e);
  }
  units = known;
  if (opt.check) {
    // m <= 16 runs a unit's decode kernel where it has one: single rows,
    // rows only in the first half of the mma's 16 (7) and in both (12, 16),
    // N not a multiple of its 16-column blocks (3000, 520, 8) and K not a
    // multiple of its 128-element steps (2056, 1032, 4104, 136).
    std::vector<Shape> shapes = {{77, 136, 8},     {77, 136, 136},   {512, 2048, 2048}, {1000, 3000, 1032},
                                 {1, 136, 8},      {1, 2048, 2056},  {7, 3000, 1032},   {12, 520, 4104},
                                 {16, 4096, 1032}, {16, 8, 136}};
    if (!opt.quick) shapes.push_back({4096, 4096, 4096});
    for (size_t i = 0; i < units.size(); ++i) {
      for (Shape s : {Shape{64, 64, 64}, Shape{1, 64, 64}}) check_arguments(totals, *units[i], epilogues[i], s, seed, ws);
      for (Shape s : shapes) check_one(totals, *units[i], epilogues[i], s, seed, ws);
      // B read through a row stride, as a bound weight's padded copy: the
      // regular kernel (K = 1032 and 136 are not multiples of 64; N = 3000
      // and 520 neither, for [K, N]) and the decode kernel.
      for (Shape s : {Shape{1000, 3000, 1032}, Shape{77, 520, 136}, Shape{7, 3000, 1032}, Shape{64, 64, 64}})
        check_one(totals, *units[i], epilogues[i], s, seed, ws, true);
    }
    std::printf("correctness: %d passed, %d failed\n", totals.passed, totals.failed);
    for (const std::string& f : totals.failures) std::printf("  failed: %s\n", f.c_str());
  }
  if (opt.bench) {
    if (opt.shapes.empty()) opt.shapes.push_back({4096, 4096, 4096});
    harness::LtGemm lt;
    std::printf("\nmedian of %d calls, alternating with cuBLASLt on 4 rotating input sets; ratio > 1: ours faster\n",
                opt.reps);
    std::printf("%-96s %-20s %9s %9s %6s %7s %7s %s\n", "unit", "shape", "ours us", "Lt us", "ratio", "TF/s",
                "GB/s", "Lt epilogue");
    for (Shape s : opt.shapes)
      for (size_t i = 0; i < units.size(); ++i) bench_one(lt, *units[i], epilogues[i], s, opt.reps, opt.pad_b, seed, ws);
  }
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::printf("total time %.1f s\n", secs);
  return totals.failed == 0 ? 0 : 1;
}
