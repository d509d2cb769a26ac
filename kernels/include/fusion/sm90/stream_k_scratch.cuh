// Host side of the sm90 kernel: the stream-K scratch (flags and partial
// tiles) that split launches share, allocated per (device, stream) and kept
// for the life of the process.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

#include <map>
#include <mutex>
#include <utility>

namespace fusion {
namespace sm90 {
namespace detail {

// Stream-K scratch of one (device, stream): the flags (zeroed when
// allocated; each launch leaves the ones it uses at 0) and the partial
// tiles. Launches on one stream run one after another and share it; other
// streams get their own. Streams are told apart by cudaStreamGetId, unique
// for the life of the program (also for each thread's per-thread default
// stream, and for a new stream that reuses a destroyed one's handle).
// Allocated stream-ordered, grown on demand and kept for the life of the
// process (sms * BM * BN * 4 bytes per stream that ever split: 17 MB for
// 128x256 tiles on 132 SMs).
//
// `lock` comes back held: the caller queues its kernel before releasing
// it, so that another thread growing the same stream's scratch queues the
// free after that kernel. The pointers stay null (no stream-K for this
// launch) while the stream is being captured into a graph: the graph could
// be replayed on another stream, or twice at once, beside launches on this
// one, and they would share the scratch.
constexpr size_t kStreamKFlagBytes = 4096;
struct StreamKScratch {
  std::unique_lock<std::mutex> lock;
  uint32_t* flags = nullptr;
  float* partials = nullptr;
};
inline cudaError_t stream_k_scratch(int device, cudaStream_t stream, size_t partial_bytes, StreamKScratch* out) {
  struct Scratch {
    void* base = nullptr;
    size_t bytes = 0;
  };
  static std::mutex mutex;
  static std::map<std::pair<int, unsigned long long>, Scratch> by_stream;
  cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
  cudaError_t err = cudaStreamIsCapturing(stream, &capture);
  if (err != cudaSuccess || capture != cudaStreamCaptureStatusNone) return err;
  unsigned long long id = 0;
  err = cudaStreamGetId(stream, &id);
  if (err != cudaSuccess) return err;
  std::unique_lock<std::mutex> lock(mutex);
  Scratch& scratch = by_stream[{device, id}];
  const size_t bytes = kStreamKFlagBytes + partial_bytes;
  if (scratch.bytes < bytes) {
    if (scratch.base != nullptr) {
      err = cudaFreeAsync(scratch.base, stream);
      if (err != cudaSuccess) return err;
      scratch = Scratch{};
    }
    void* base = nullptr;
    err = cudaMallocAsync(&base, bytes, stream);
    if (err != cudaSuccess) return err;
    err = cudaMemsetAsync(base, 0, kStreamKFlagBytes, stream);
    if (err != cudaSuccess) {
      (void)cudaFreeAsync(base, stream);
      return err;
    }
    scratch = Scratch{base, bytes};
  }
  out->flags = static_cast<uint32_t*>(scratch.base);
  out->partials = reinterpret_cast<float*>(static_cast<unsigned char*>(scratch.base) + kStreamKFlagBytes);
  out->lock = std::move(lock);
  return cudaSuccess;
}

}  // namespace detail
}  // namespace sm90
}  // namespace fusion
