// Decode-kernel experiments, run 1: the library's decode kernel at other
// configs, a pure read of the weight (the ceiling), a split of K over a
// cluster with a DSMEM reduction, and W prefetched a step ahead in registers.
// See README.md beside this file.
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

// ---- decode2: split-K over a cluster of kSplit CTAs, optional register prefetch
template <int kWarps, int kTiles, int kChunks, int kMinBlocks, int kSplit, bool kPrefetch>
__global__ void __launch_bounds__(32 * kWarps, kMinBlocks) decode2(const GemmArgs<T> args) {
  constexpr int BN = 8 * kTiles, kPairs = BN / 2, kChunkK = 32, kStepK = kChunkK * kChunks;
  __shared__ float2 partial[kWarps][kDecodeMaxM][kPairs];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t M = args.m, N = args.n, K = args.k;
  const int64_t n0 = int64_t(blockIdx.x) * BN;
  const int rank = kSplit > 1 ? int(cg::this_cluster().block_rank()) : 0;
  // this CTA's K range: whole steps
  const int64_t steps = (K + kStepK - 1) / kStepK;
  const int64_t s_lo = steps * rank / kSplit, s_hi = steps * (rank + 1) / kSplit;
  const T* w_row[kTiles];
#pragma unroll
  for (int r = 0; r < kTiles; ++r) w_row[r] = n0 + 8 * r < N ? args.b + (n0 + 8 * r + g) * K : nullptr;
  const T* x_lo = g < M ? args.a + g * K : nullptr;
  const T* x_hi = g + 8 < M ? args.a + (g + 8) * K : nullptr;
  float acc[kTiles][4] = {};
  uint4 w[kChunks][kTiles], lo[kChunks], hi[kChunks];
  auto load = [&](int64_t s) {
    const int64_t k0 = s * kStepK;
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const int64_t k = k0 + c * kChunkK + 8 * t;
      const bool in_k = s < s_hi && k < K;
#pragma unroll
      for (int r = 0; r < kTiles; ++r) w[c][r] = in_k && w_row[r] ? detail::load_streamed(w_row[r] + k) : uint4{};
      lo[c] = in_k && x_lo ? detail::load_cached(x_lo + k) : uint4{};
      hi[c] = in_k && x_hi ? detail::load_cached(x_hi + k) : uint4{};
    }
  };
  auto compute = [&](const uint4 (&ww)[kChunks][kTiles], const uint4 (&l)[kChunks], const uint4 (&h)[kChunks]) {
#pragma unroll
    for (int c = 0; c < kChunks; ++c) {
      const uint32_t a0[4] = {l[c].x, h[c].x, l[c].y, h[c].y};
      const uint32_t a1[4] = {l[c].z, h[c].z, l[c].w, h[c].w};
#pragma unroll
      for (int r = 0; r < kTiles; ++r) {
        const uint32_t b0[2] = {ww[c][r].x, ww[c][r].y};
        const uint32_t b1[2] = {ww[c][r].z, ww[c][r].w};
        sm80::mma_16816<T>(acc[r], a0, b0);
        sm80::mma_16816<T>(acc[r], a1, b1);
      }
    }
  };
  if constexpr (kPrefetch) {
    // W of the next step in flight while this step's mma run; x loaded late (L1).
    auto load_w = [&](int64_t s, uint4 (&ww)[kChunks][kTiles]) {
      const int64_t k0 = s * kStepK;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int64_t k = k0 + c * kChunkK + 8 * t;
        const bool in_k = s < s_hi && k < K;
#pragma unroll
        for (int r = 0; r < kTiles; ++r) ww[c][r] = in_k && w_row[r] ? detail::load_streamed(w_row[r] + k) : uint4{};
      }
    };
    int64_t s = s_lo + warp;
    load_w(s, w);
    for (; s < s_hi; s += kWarps) {
      uint4 cw[kChunks][kTiles];
#pragma unroll
      for (int c = 0; c < kChunks; ++c)
#pragma unroll
        for (int r = 0; r < kTiles; ++r) cw[c][r] = w[c][r];
      load_w(s + kWarps, w);
      const int64_t k0 = s * kStepK;
#pragma unroll
      for (int c = 0; c < kChunks; ++c) {
        const int64_t k = k0 + c * kChunkK + 8 * t;
        const bool in_k = k < K;
        lo[c] = in_k && x_lo ? detail::load_cached(x_lo + k) : uint4{};
        hi[c] = in_k && x_hi ? detail::load_cached(x_hi + k) : uint4{};
      }
      compute(cw, lo, hi);
    }
  } else {
    for (int64_t s = s_lo + warp; s < s_hi; s += kWarps) { load(s); compute(w, lo, hi); }
  }
#pragma unroll
  for (int r = 0; r < kTiles; ++r) {
    partial[warp][g][4 * r + t] = make_float2(acc[r][0], acc[r][1]);
    partial[warp][g + 8][4 * r + t] = make_float2(acc[r][2], acc[r][3]);
  }
  __syncthreads();
  // warp-sum into partial[0]
  for (int i = threadIdx.x; i < kDecodeMaxM * kPairs; i += 32 * kWarps) {
    const int m = i / kPairs, q = i % kPairs;
    float2 sum = partial[0][m][q];
#pragma unroll
    for (int w2 = 1; w2 < kWarps; ++w2) { sum.x += partial[w2][m][q].x; sum.y += partial[w2][m][q].y; }
    partial[0][m][q] = sum;
  }
  if constexpr (kSplit > 1) {
    cg::cluster_group cluster = cg::this_cluster();
    cluster.sync();
    for (int i = rank * 32 * kWarps + threadIdx.x; i < M * kPairs; i += kSplit * 32 * kWarps) {
      const int m = i / kPairs, q = i % kPairs;
      const int64_t n = n0 + 2 * q;
      float2 sum = make_float2(0.f, 0.f);
#pragma unroll
      for (int r = 0; r < kSplit; ++r) {
        const float2* p = cluster.map_shared_rank(&partial[0][m][q], r);
        float2 v = *p; sum.x += v.x; sum.y += v.y;
      }
      if (n < N) store_pair(args.c + m * N + n, Chain::template apply<T>(sum, m, n, N, args.epilogue));
    }
    cluster.sync();
  } else {
    __syncthreads();
    for (int i = threadIdx.x; i < M * kPairs; i += 32 * kWarps) {
      const int m = i / kPairs, q = i % kPairs;
      const int64_t n = n0 + 2 * q;
      if (n < N) store_pair(args.c + m * N + n, Chain::template apply<T>(partial[0][m][q], m, n, N, args.epilogue));
    }
  }
}

template <int kWarps, int kTiles, int kChunks, int kMinBlocks, int kSplit, bool kPrefetch>
void launch2(const GemmArgs<T>& a, cudaStream_t s) {
  constexpr int BN = 8 * kTiles;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned((a.n + BN - 1) / BN) * 1, kSplit, 1);
  // cluster along y
  cfg.blockDim = dim3(32 * kWarps);
  cfg.stream = s;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = 1; attr[0].val.clusterDim.y = kSplit; attr[0].val.clusterDim.z = 1;
  cfg.attrs = attr; cfg.numAttrs = kSplit > 1 ? 1 : 0;
  CK(cudaLaunchKernelEx(&cfg, decode2<kWarps, kTiles, kChunks, kMinBlocks, kSplit, kPrefetch>, a));
}

// ---- harness

struct Problem { int m, n, k; };

int main(int argc, char** argv) {
  const int kRot = 4;
  cudaStream_t st; CK(cudaStreamCreate(&st));
  std::vector<Problem> probs = {{1, 14336, 4096}, {16, 14336, 4096}, {1, 4096, 14336}, {16, 4096, 14336}, {8, 14336, 4096}, {1, 28672, 4096}, {16, 28672, 4096}};
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
    // reference = current default
    timeit("cur <8,2,4,2>", [&](int r) { decode_gemm_kernel<T, DecodeConfig<8,2,4,2>, Chain><<<(p.n+15)/16, 256, 0, st>>>(args(r)); }, true);
    const size_t n16 = size_t(p.n) * p.k * 2 / 16;
    timeit("readbw U4 x4/SM", [&](int r) { readbw<4><<<sms*4, 256, 0, st>>>((const uint4*)W[r], n16, sink); }, false);
    timeit("readbw U8 x4/SM", [&](int r) { readbw<8><<<sms*4, 256, 0, st>>>((const uint4*)W[r], n16, sink); }, false);
    timeit("readbw U8 x8/SM", [&](int r) { readbw<8><<<sms*8, 256, 0, st>>>((const uint4*)W[r], n16, sink); }, false);
    timeit("readbw U16 x4/SM", [&](int r) { readbw<16><<<sms*4, 256, 0, st>>>((const uint4*)W[r], n16, sink); }, false);
    timeit("cur <8,2,8,2>", [&](int r) { decode_gemm_kernel<T, DecodeConfig<8,2,8,2>, Chain><<<(p.n+15)/16, 256, 0, st>>>(args(r)); }, true);
    timeit("cur <4,2,4,4>", [&](int r) { decode_gemm_kernel<T, DecodeConfig<4,2,4,4>, Chain><<<(p.n+15)/16, 128, 0, st>>>(args(r)); }, true);
    timeit("cur <8,4,4,2>", [&](int r) { decode_gemm_kernel<T, DecodeConfig<8,4,4,2>, Chain><<<(p.n+31)/32, 256, 0, st>>>(args(r)); }, true);
    timeit("cur <4,4,4,3>", [&](int r) { decode_gemm_kernel<T, DecodeConfig<4,4,4,3>, Chain><<<(p.n+31)/32, 128, 0, st>>>(args(r)); }, true);
    timeit("cur <8,1,8,2>", [&](int r) { decode_gemm_kernel<T, DecodeConfig<8,1,8,2>, Chain><<<(p.n+7)/8, 256, 0, st>>>(args(r)); }, true);
    timeit("d2 <8,2,4,2> s1 pf", [&](int r) { launch2<8,2,4,2,1,true>(args(r), st); }, true);
    timeit("d2 <8,2,4,3> s1 pf", [&](int r) { launch2<8,2,4,3,1,true>(args(r), st); }, true);
    timeit("d2 <4,2,4,4> s1 pf", [&](int r) { launch2<4,2,4,4,1,true>(args(r), st); }, true);
    timeit("d2 <8,2,2,3> s1 pf", [&](int r) { launch2<8,2,2,3,1,true>(args(r), st); }, true);
    timeit("d2 <8,2,4,2> s2", [&](int r) { launch2<8,2,4,2,2,false>(args(r), st); }, true);
    timeit("d2 <8,2,4,2> s2 pf", [&](int r) { launch2<8,2,4,2,2,true>(args(r), st); }, true);
    timeit("d2 <8,2,4,2> s4 pf", [&](int r) { launch2<8,2,4,2,4,true>(args(r), st); }, true);
    timeit("d2 <8,4,4,2> s2 pf", [&](int r) { launch2<8,4,4,2,2,true>(args(r), st); }, true);
    timeit("d2 <8,4,2,2> s4 pf", [&](int r) { launch2<8,4,2,2,4,true>(args(r), st); }, true);
    timeit("d2 <4,4,4,4> s2 pf", [&](int r) { launch2<4,4,4,4,2,true>(args(r), st); }, true);
    timeit("d2 <8,2,8,2> s1", [&](int r) { launch2<8,2,8,2,1,false>(args(r), st); }, true);
    timeit("memcpy dtod W", [&](int r) { cudaMemcpyAsync(W[(r + 1) % kRot], W[r], size_t(p.n) * p.k, cudaMemcpyDeviceToDevice, st); }, false);
  }
  printf("done\n");
}
