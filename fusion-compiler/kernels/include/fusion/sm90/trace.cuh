// The sm90 kernel's development timeline: with FUSION_SM90_TRACE defined
// (the self-test's `make UNIT_FLAGS=-DFUSION_SM90_TRACE`; a library build
// never sets it), %globaltimer stamps and SM-cycle counters per CTA; without
// it, every counter compiles to nothing.
#pragma once

#include <cuda_runtime.h>
#include <stdint.h>

namespace fusion {
namespace sm90 {

namespace trace {
// The cycle counters of a piece (see below).
enum class Counter { KLoop, FullWait, EmptyWait };
}  // namespace trace

#ifdef FUSION_SM90_TRACE
// Development only: kSlots values per CTA, in the array `buffer` points at.
//  - %globaltimer stamps in slots [0, kCounters): slot 0, the kernel
//    starts; for piece i, slots 1 + 5i to 5 + 5i: consumer 0 starts its
//    K loop, ends it, ends the epilogue chain, has written the staging
//    tile, ends the epilogue.
//  - SM-cycle counters of pieces i < kCountedPieces, from slot kCounters:
//    Counter::KLoop (consumer 0's K loop), Counter::FullWait (consumer 0
//    waiting on full barriers) and Counter::EmptyWait (the producer
//    waiting on empty barriers), each kCountedPieces slots.
namespace trace {
constexpr int kPerPiece = 5, kCounters = 96, kCountedPieces = 16;
constexpr int kSlots = kCounters + 3 * kCountedPieces;
__device__ uint64_t* buffer = nullptr;
__device__ __forceinline__ void put(int slot, uint64_t value) {
  if (buffer != nullptr) buffer[int64_t(blockIdx.x) * kSlots + slot] = value;
}
__device__ __forceinline__ void stamp(int slot) {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  if (slot < kCounters) put(slot, t);
}
__host__ __device__ constexpr int counter_slot(Counter c, int piece) {
  return kCounters + int(c) * kCountedPieces + piece;
}
__device__ __forceinline__ void count(Counter c, int piece, uint64_t cycles) {
  if (piece < kCountedPieces) put(counter_slot(c, piece), cycles);
}
// SM cycles between start() and stop(), summed.
struct Timer {
  uint64_t total = 0, started = 0;
  __device__ __forceinline__ void start() { started = clock64(); }
  __device__ __forceinline__ void stop() { total += clock64() - started; }
};
}  // namespace trace
#define FUSION_SM90_STAMP(piece, phase) \
  ::fusion::sm90::trace::stamp(1 + ::fusion::sm90::trace::kPerPiece * (piece) + (phase))
#define FUSION_SM90_STAMP_START() ::fusion::sm90::trace::stamp(0)
#else
// Without FUSION_SM90_TRACE the counters compile to nothing.
namespace trace {
__device__ __forceinline__ void count(Counter, int, uint64_t) {}
struct Timer {
  static constexpr uint64_t total = 0;
  __device__ __forceinline__ void start() {}
  __device__ __forceinline__ void stop() {}
};
}  // namespace trace
#define FUSION_SM90_STAMP(piece, phase) ((void)0)
#define FUSION_SM90_STAMP_START() ((void)0)
#endif

}  // namespace sm90
}  // namespace fusion
