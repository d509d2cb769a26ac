// Decode-kernel experiments, runs 2 and 3: CTA shapes (warps on columns and
// on K, CTAs an SM) at decode shapes, programmatic dependent launch, and the
// SwiGLU block's two GEMMs back to back. See README.md beside this file.
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#include <functional>
#include <string>
#include "fusion/decode.cuh"
namespace cg = cooperative_groups;
using namespace fusion;
using T = __half;
using Chain = EpilogueChain<>;

#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("CUDA %s at %d: %s\n", #x, __LINE__, cudaGetErrorString(e)); exit(1);} } while (0)

// ---- pure read of W: the ceiling
template <int U>
__global__ void __launch_bounds__(256) readbw(const uint4* w, size_t n16, unsigned* sink) {
  unsigned acc = 0;
  size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t i = size_t(blockIdx.x) * blockDim.x + threadIdx.x;
  for (; i + (U - 1) * stride < n16; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) v[u] = detail::load_streamed(w + i + u * stride);
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) { uint4 v = detail::load_streamed(w + i); acc ^= v.x ^ v.w; }
  if (acc == 0x12345678u) *sink = acc;
}


// ---- decode3: warps = kWN column groups x kWK k groups; optional PDL
template <int kWN, int kWK, int kTiles, int kChunks, int kMinBlocks, bool kPdl = false, bool kPrefetchW = false>
__global__ void __launch_bounds__(32 * kWN * kWK, kMinBlocks) decode3(const GemmArgs<T> args) {
  constexpr int kWarps = kWN * kWK;
  constexpr int BNw = 8 * kTiles, BN = BNw * kWN, kPairsW = BNw / 2, kChunkK = 32, kStepK = kChunkK * kChunks;
  __shared__ float2 partial[kWK][kWN][kDecodeMaxM][kPairsW];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wn = warp % kWN, wk = warp / kWN;
  const int g = lane / 4, t = lane % 4;
  const int64_t M = args.m, N = args.n, K = args.k;
  const int64_t n0 = int64_t(blockIdx.x) * BN + wn * BNw;
  const T* w_row[kTiles];
#pragma unroll
  for (int r = 0; r < kTiles; ++r) w_row[r] = n0 + 8 * r < N ? args.b + (n0 + 8 * r + g) * K : nullptr;
  const T* x_lo = g < M ? args.a + g * K : nullptr;
  const T* x_hi = g + 8 < M ? args.a + (g + 8) * K : nullptr;
  float acc[kTiles][4] = {};
  uint4 w[kChunks][kTiles], lo[kChunks], hi[kChunks];
  int64_t k0 = int64_t(wk) * kStepK;
  bool first_loaded = false;
  if constexpr (kPdl) {
    if constexpr (kPrefetchW) {
      // W is a constant: the first step's weights before waiting on the previous kernel
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int64_t k = k0 + c * kChunkK + 8 * t;
#pragma unroll
        for (int r = 0; r < kTiles; ++r) w[c][r] = k < K && w_row[r] ? detail::load_streamed(w_row[r] + k) : uint4{};
      }
      first_loaded = true;
    }
    asm volatile("griddepcontrol.wait;" ::: "memory");
  }
  for (; k0 < K; k0 += int64_t(kWK) * kStepK) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t k = k0 + c * kChunkK + 8 * t;
      const bool in_k = k < K;
      if (!first_loaded) {
#pragma unroll
        for (int r = 0; r < kTiles; ++r) w[c][r] = in_k && w_row[r] ? detail::load_streamed(w_row[r] + k) : uint4{};
      }
      lo[c] = in_k && x_lo ? detail::load_cached(x_lo + k) : uint4{};
      hi[c] = in_k && x_hi ? detail::load_cached(x_hi + k) : uint4{};
    }
    first_loaded = false;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
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
  if constexpr (kPdl) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#pragma unroll
  for (int r = 0; r < kTiles; ++r) {
    partial[wk][wn][g][4 * r + t] = make_float2(acc[r][0], acc[r][1]);
    partial[wk][wn][g + 8][4 * r + t] = make_float2(acc[r][2], acc[r][3]);
  }
  __syncthreads();
  constexpr int kPairs = BN / 2;
  for (int i = threadIdx.x; i < M * kPairs; i += 32 * kWarps) {
    const int m = i / kPairs, q = i % kPairs;
    const int qn = q / kPairsW, qq = q % kPairsW;
    const int64_t n = int64_t(blockIdx.x) * BN + 2 * q;
    float2 sum = partial[0][qn][m][qq];
#pragma unroll
    for (int w2 = 1; w2 < kWK; ++w2) { sum.x += partial[w2][qn][m][qq].x; sum.y += partial[w2][qn][m][qq].y; }
    if (n < N) store_pair(args.c + m * N + n, Chain::template apply<T>(sum, m, n, N, args.epilogue));
  }
}

template <int kWN, int kWK, int kTiles, int kChunks, int kMinBlocks, bool kPdl = false, bool kPrefetchW = false>
void launch3(const GemmArgs<T>& a, cudaStream_t s) {
  constexpr int BN = 8 * kTiles * kWN;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned((a.n + BN - 1) / BN));
  cfg.blockDim = dim3(32 * kWN * kWK);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr; cfg.numAttrs = kPdl ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, decode3<kWN, kWK, kTiles, kChunks, kMinBlocks, kPdl, kPrefetchW>, a));
}

// ---- harness

struct Problem { int m, n, k; };

int main(int argc, char** argv) {
  const int kRot = 4;
  cudaStream_t st; CK(cudaStreamCreate(&st));
  std::vector<Problem> probs = {{1, 14336, 4096}, {16, 14336, 4096}, {1, 4096, 14336}, {16, 4096, 14336}, {8, 4096, 14336}, {1, 28672, 4096}, {16, 28672, 4096}, {1, 4096, 4096}, {16, 4096, 4096}, {16, 6144, 4096}};
  size_t maxw = 0, maxx = 0, maxc = 0;
  for (auto p : probs) { maxw = std::max(maxw, size_t(p.n) * p.k); maxx = std::max(maxx, size_t(p.m) * p.k); maxc = std::max(maxc, size_t(p.m) * p.n); }
  std::vector<T*> W(kRot), X(kRot); T* C; unsigned* sink; float* ref;
  std::vector<T> hw(maxw), hx(maxx);
  srand(1);
  for (auto& v : hw) v = __float2half((rand() / float(RAND_MAX) - 0.5f) * 0.1f);
  for (auto& v : hx) v = __float2half((rand() / float(RAND_MAX) - 0.5f));
  for (int r = 0; r < kRot; ++r) {
    CK(cudaMalloc(&W[r], maxw * 2)); CK(cudaMalloc(&X[r], maxx * 2));
    CK(cudaMemcpy(W[r], hw.data(), maxw * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(X[r], hx.data(), maxx * 2, cudaMemcpyHostToDevice));
  }
  CK(cudaMalloc(&C, maxc * 2)); CK(cudaMalloc(&sink, 4)); CK(cudaMalloc(&ref, maxc * 4));
  cudaEvent_t e0[60], e1[60];
  for (int i = 0; i < 60; ++i) { cudaEventCreate(&e0[i]); cudaEventCreate(&e1[i]); }
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);

  for (auto p : probs) {
    if (argc > 1) break;
    const double bytes = double(p.n) * p.k * 2 + double(p.m) * p.k * 2 + double(p.m) * p.n * 2;
    printf("== (%d, %d, %d) W %.1f MB\n", p.m, p.n, p.k, p.n * double(p.k) * 2 / 1e6);
    std::vector<T> hc(size_t(p.m) * p.n), href;
    auto check = [&](const char* name) {
      CK(cudaMemcpy(hc.data(), C, hc.size() * 2, cudaMemcpyDeviceToHost));
      if (href.empty()) { href = hc; return; }
      double maxd = 0; for (size_t i = 0; i < hc.size(); ++i) maxd = std::max(maxd, double(fabsf(__half2float(hc[i]) - __half2float(href[i]))));
      if (maxd > 2e-2) printf("   MISMATCH %s maxdiff %g\n", name, maxd);
    };
    auto timeit = [&](const char* name, std::function<void(int)> f, bool gemm) {
      if (gemm) { CK(cudaMemset(C, 0xff, size_t(p.m) * p.n * 2)); f(0); CK(cudaStreamSynchronize(st)); check(name); }
      for (int i = 0; i < 10; ++i) f(i % kRot);
      std::vector<float> ts;
      for (int i = 0; i < 50; ++i) { cudaEventRecord(e0[i], st); f(i % kRot); cudaEventRecord(e1[i], st); }
      CK(cudaStreamSynchronize(st));
      for (int i = 0; i < 50; ++i) { float ms; cudaEventElapsedTime(&ms, e0[i], e1[i]); ts.push_back(ms * 1000); }
      std::vector<float> s = ts; std::sort(s.begin(), s.end());
      float med = s[25];
      printf("  %-40s %7.2f us  [%6.2f %6.2f]  %5.0f GB/s\n", name, med, s[12], s[37], bytes / (med * 1e3));
    };
    auto args = [&](int r) { GemmArgs<T> a{}; a.a = X[r]; a.b = W[r]; a.c = C; a.m = p.m; a.n = p.n; a.k = p.k; return a; };
    timeit("cur <8,2,4,2>", [&](int r) { decode_gemm_kernel<T, DecodeConfig<8,2,4,2>, Chain><<<(p.n+15)/16, 256, 0, st>>>(args(r)); }, true);
    const size_t n16 = size_t(p.n) * p.k * 2 / 16;
    timeit("readbw U4 x4/SM", [&](int r) { readbw<4><<<sms*4, 256, 0, st>>>((const uint4*)W[r], n16, sink); }, false);
    timeit("cur <4,2,4,4>", [&](int r) { decode_gemm_kernel<T, DecodeConfig<4,2,4,4>, Chain><<<(p.n+15)/16, 128, 0, st>>>(args(r)); }, true);
    timeit("cur <8,2,8,2>", [&](int r) { decode_gemm_kernel<T, DecodeConfig<8,2,8,2>, Chain><<<(p.n+15)/16, 256, 0, st>>>(args(r)); }, true);
    timeit("d3 wn1 wk8 t2 c4 b2", [&](int r) { launch3<1,8,2,4,2>(args(r), st); }, true);
    timeit("d3 wn1 wk4 t2 c4 b4", [&](int r) { launch3<1,4,2,4,4>(args(r), st); }, true);
    timeit("d3 wn1 wk8 t2 c8 b2", [&](int r) { launch3<1,8,2,8,2>(args(r), st); }, true);
    timeit("d3 wn2 wk4 t2 c4 b2", [&](int r) { launch3<2,4,2,4,2>(args(r), st); }, true);
    timeit("d3 wn2 wk2 t2 c4 b4", [&](int r) { launch3<2,2,2,4,4>(args(r), st); }, true);
    timeit("d3 wn4 wk2 t2 c4 b2", [&](int r) { launch3<4,2,2,4,2>(args(r), st); }, true);
    timeit("d3 wn4 wk1 t2 c4 b4", [&](int r) { launch3<4,1,2,4,4>(args(r), st); }, true);
    timeit("d3 wn2 wk2 t2 c8 b3", [&](int r) { launch3<2,2,2,8,3>(args(r), st); }, true);
    timeit("d3 wn1 wk4 t2 c8 b4", [&](int r) { launch3<1,4,2,8,4>(args(r), st); }, true);
    timeit("d3 wn1 wk4 t2 c2 b6", [&](int r) { launch3<1,4,2,2,6>(args(r), st); }, true);
    timeit("d3 wn2 wk2 t1 c8 b4", [&](int r) { launch3<2,2,1,8,4>(args(r), st); }, true);
    timeit("d3 wn1 wk8 t2 c4 b2 pdl", [&](int r) { launch3<1,8,2,4,2,true>(args(r), st); }, true);
    timeit("d3 wn1 wk8 t2 c4 b2 pdl+pfw", [&](int r) { launch3<1,8,2,4,2,true,true>(args(r), st); }, true);
  }

  {
    // the block's two kernels at M = 1 and 16: gate/up (M, 28672, 4096) -> down (M, 4096, 14336) reading its output
    for (int m : {1, 16}) {
      printf("== pair m=%d: (m,28672,4096) then (m,4096,14336)\n", m);
      auto pairt = [&](const char* name, std::function<void(int)> f) {
        for (int i = 0; i < 10; ++i) f(i % kRot);
        std::vector<float> ts;
        for (int i = 0; i < 50; ++i) { cudaEventRecord(e0[i], st); f(i % kRot); cudaEventRecord(e1[i], st); }
        CK(cudaStreamSynchronize(st));
        for (int i = 0; i < 50; ++i) { float ms; cudaEventElapsedTime(&ms, e0[i], e1[i]); ts.push_back(ms * 1000); }
        std::sort(ts.begin(), ts.end());
        cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
        cudaEventRecord(a, st); for (int i = 0; i < 50; ++i) f(i % kRot); cudaEventRecord(b, st); CK(cudaStreamSynchronize(st));
        float ms; cudaEventElapsedTime(&ms, a, b);
        printf("  %-40s per-call %7.2f us [%6.2f %6.2f]  back-to-back %7.2f us\n", name, ts[25], ts[12], ts[37], ms * 1000 / 50);
      };
      T* H; CK(cudaMalloc(&H, size_t(16) * 14336 * 2 * 2));
      auto g1 = [&](int r) { GemmArgs<T> a{}; a.a = X[r]; a.b = W[r]; a.c = H; a.m = m; a.n = 28672; a.k = 4096; return a; };
      auto g2 = [&](int r) { GemmArgs<T> a{}; a.a = H; a.b = W[(r + 1) % kRot]; a.c = C; a.m = m; a.n = 4096; a.k = 14336; return a; };
      pairt("cur, cur", [&](int r) { decode_gemm_kernel<T, DecodeConfig<8,2,4,2>, Chain><<<28672/16, 256, 0, st>>>(g1(r)); decode_gemm_kernel<T, DecodeConfig<8,2,4,2>, Chain><<<4096/16, 256, 0, st>>>(g2(r)); });
      pairt("d3, d3", [&](int r) { launch3<1,8,2,4,2>(g1(r), st); launch3<1,8,2,4,2>(g2(r), st); });
      pairt("d3 pdl, d3 pdl", [&](int r) { launch3<1,8,2,4,2,true>(g1(r), st); launch3<1,8,2,4,2,true>(g2(r), st); });
      pairt("d3 pdl+pfw, d3 pdl+pfw", [&](int r) { launch3<1,8,2,4,2,true,true>(g1(r), st); launch3<1,8,2,4,2,true,true>(g2(r), st); });
      pairt("d3 b4, d3 c8", [&](int r) { launch3<1,4,2,4,4>(g1(r), st); launch3<1,8,2,8,2>(g2(r), st); });
      pairt("d3 b4 pdl+pfw, d3 c8 pdl+pfw", [&](int r) { launch3<1,4,2,4,4,true,true>(g1(r), st); launch3<1,8,2,8,2,true,true>(g2(r), st); });
      pairt("d3 b6c2, d3 wk8", [&](int r) { launch3<1,4,2,2,6>(g1(r), st); launch3<1,8,2,4,2>(g2(r), st); });
      pairt("d3 b6c2 pdl+pfw, d3 wk8 pdl+pfw", [&](int r) { launch3<1,4,2,2,6,true,true>(g1(r), st); launch3<1,8,2,4,2,true,true>(g2(r), st); });
      pairt("d3 b6c2 pdl, d3 wk8 pdl", [&](int r) { launch3<1,4,2,2,6,true>(g1(r), st); launch3<1,8,2,4,2,true>(g2(r), st); });
      pairt("readbw, readbw", [&](int r) { readbw<4><<<sms*4, 256, 0, st>>>((const uint4*)W[r], size_t(28672)*4096*2/16, sink); readbw<4><<<sms*4, 256, 0, st>>>((const uint4*)W[(r+1)%kRot], size_t(4096)*14336*2/16, sink); });
      cudaFree(H);
    }
  }
  printf("done\n");
}
