// A launch's workspace: device memory its caller owns, sizes and passes in
// (fusion_gemm_params::workspace, see abi.h), laid out here and nowhere else.
// Launchers never allocate: they use what they are given, and what they
// are not given they do without (stream-K) or refuse (a norm prologue's
// row statistics).
//
//   [0, kStreamKFlagBytes)   counters: the sm90 tile scheduler's two (the
//                            next whole tile to hand out, CTAs done taking
//                            them) then stream-K's arrival counters; zero
//                            when handed over (the caller zeroes the buffer
//                            when it allocates it), zero again when each
//                            launch ends
//   partials                 stream-K partial tiles, if the launch splits
//   row_stats                a folded norm's per-row statistics, if any
//   normalized               a per-call norm's normalized A, if any
//   interleaved              a gated GEMM's interleaved B, when the call
//                            passes its two weights (gated.cuh)
//
// Every region starts at a multiple of kWorkspaceAlign. The flags region
// comes first in every non-empty layout, whatever the launch needs, so
// that the row statistics or partials of one launch never overwrite the
// counters a later launch on the same buffer expects to find at zero.
#pragma once

#include <stddef.h>
#include <stdint.h>

#include "abi.h"  // FUSION_GEMM_NO_STREAM_K
#include "numeric.cuh"

namespace fusion {

// Room for the tile scheduler's counters (kTileCounterBytes, first) and
// one arrival counter per consumer warp group of each split tile of a
// stream-K launch (fewer than 1.5 tiles per SM are split: on 132 SMs at
// most 197 x 2 consumers x 4 bytes, 1576); the scheduler refuses a split
// whose counters would not fit.
constexpr size_t kStreamKFlagBytes = 4096;
// The tile scheduler's counters, at the start of the flags region (two
// 32-bit counters, padded to their own 128-byte line).
constexpr size_t kTileCounterBytes = 128;
// Each region starts a multiple of 256 bytes from the workspace's start,
// which must be 16-byte aligned (Workspace::holds), so that the partials'
// float4 and the statistics' 8-byte accesses are aligned.
constexpr size_t kWorkspaceAlign = 256;

// Where each region of a workspace lies; `bytes` 0 means none is needed.
struct WorkspaceLayout {
  size_t partials = 0;    // offset of the stream-K partial tiles
  size_t row_stats = 0;   // offset of the row statistics
  size_t normalized = 0;   // offset of the normalized A
  size_t interleaved = 0;  // offset of the interleaved B
  size_t bytes = 0;        // the whole workspace

  static constexpr size_t align_up(size_t n) { return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

  // The layout for `partial_bytes` of stream-K partials (0: no split),
  // `row_stat_bytes` of row statistics (0: no folded norm) and
  // `normalized_bytes` of normalized A (0: no per-call norm) and
  // `interleaved_bytes` of interleaved B (0: none); `counters`: the flags
  // region even when nothing else is needed (the tile scheduler's).
  static constexpr WorkspaceLayout of(size_t partial_bytes, size_t row_stat_bytes, size_t normalized_bytes = 0,
                                      size_t interleaved_bytes = 0, bool counters = false) {
    WorkspaceLayout l;
    if (!counters && partial_bytes == 0 && row_stat_bytes == 0 && normalized_bytes == 0 && interleaved_bytes == 0)
      return l;
    l.partials = kStreamKFlagBytes;
    l.row_stats = l.partials + align_up(partial_bytes);
    l.normalized = l.row_stats + align_up(row_stat_bytes);
    l.interleaved = l.normalized + align_up(normalized_bytes);
    l.bytes = l.interleaved + align_up(interleaved_bytes);
    return l;
  }
};

// What the layout promises, checked where it is written.
static_assert(WorkspaceLayout::of(0, 0).bytes == 0, "a launch that needs nothing is given nothing");
static_assert(WorkspaceLayout::of(0, 0, 0, 0, true).bytes == kStreamKFlagBytes, "counters alone: the flags region");
static_assert(WorkspaceLayout::of(0, 8).row_stats >= kStreamKFlagBytes &&
                  WorkspaceLayout::of(8, 0).partials >= kStreamKFlagBytes,
              "nothing overlaps the flags");
static_assert(WorkspaceLayout::of(1000, 8).row_stats >= WorkspaceLayout::of(1000, 8).partials + 1000 &&
                  WorkspaceLayout::of(1000, 8).bytes >= WorkspaceLayout::of(1000, 8).row_stats + 8,
              "the regions are disjoint and inside the workspace");
static_assert(WorkspaceLayout::of(0, 8, 16).normalized >= WorkspaceLayout::of(0, 8, 16).row_stats + 8 &&
                  WorkspaceLayout::of(0, 0, 16).normalized >= kStreamKFlagBytes &&
                  WorkspaceLayout::of(0, 0, 16).bytes >= WorkspaceLayout::of(0, 0, 16).normalized + 16,
              "the normalized A lies after the flags and statistics, inside the workspace");
static_assert(WorkspaceLayout::of(0, 0, 16, 32).interleaved >= WorkspaceLayout::of(0, 0, 16, 32).normalized + 16 &&
                  WorkspaceLayout::of(0, 0, 0, 32).interleaved >= kStreamKFlagBytes &&
                  WorkspaceLayout::of(0, 0, 0, 32).bytes >= WorkspaceLayout::of(0, 0, 0, 32).interleaved + 32,
              "the interleaved B lies after the normalized A, inside the workspace");
static_assert(WorkspaceLayout::of(1000, 8).partials % kWorkspaceAlign == 0 &&
                  WorkspaceLayout::of(1000, 8).row_stats % kWorkspaceAlign == 0,
              "every region is aligned");

// What the caller gave one launch: the buffer (null when none), its size,
// and the launch's FUSION_GEMM_* flags (abi.h).
struct Workspace {
  void* base = nullptr;
  size_t bytes = 0;
  uint32_t flags = 0;

  bool holds(const WorkspaceLayout& layout) const {
    return layout.bytes == 0 || (base != nullptr && is_aligned16(base) && bytes >= layout.bytes);
  }
  template <typename T>
  T* at(size_t offset) const {
    return reinterpret_cast<T*>(static_cast<unsigned char*>(base) + offset);
  }
};

}  // namespace fusion
