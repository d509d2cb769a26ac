// The tile rules the sm75 and sm80 mainloops share: both split a block's
// tile into warp tiles, run one warp per warp tile, copy A and B in 16-byte
// chunks shared equally by the threads, and cap registers through the
// blocks per SM of __launch_bounds__. Each rule is named once: asserted
// here, and gathered into kValid, which a rendered unit asserts with a
// message naming the tuned table entry its config came from.
#pragma once

namespace fusion {

template <int BM, int BN, int BK, int WM, int WN, int kMinBlocksPerSm>
struct WarpTiledRules {
  static constexpr int kWarpsM = BM / WM, kWarpsN = BN / WN;
  static constexpr int kThreads = 32 * kWarpsM * kWarpsN;

  static constexpr bool kWarpsDivide = kThreads > 0 && BM % WM == 0 && BN % WN == 0;
  static_assert(kWarpsDivide, "warp tiles must divide the CTA tile");
  static constexpr bool kTensorCoreTiles = WM % 16 == 0 && WN % 16 == 0 && BK % 16 == 0;
  static_assert(kTensorCoreTiles, "warp tiles and BK are made of 16 x 16 x 16 tensor-core tiles");
  // The CUDA programming guide's limit, the same on every generation.
  static constexpr bool kThreadsFit = kThreads <= 1024;
  static_assert(kThreadsFit, "a block has at most 1024 threads");
  static constexpr bool kChunksShared = kThreads > 0 && (BM * BK / 8) % kThreads == 0 && (BN * BK / 8) % kThreads == 0;
  static_assert(kChunksShared, "every thread copies the same number of 16-byte chunks of A and of B per stage");

  // Registers a thread needs: its WM x WN / 32 f32 accumulators and about 64
  // for addresses, A/B fragments and loop indices. ptxas puts the 128x128
  // tile (64 accumulators, two blocks per SM) at exactly 128 registers
  // without spills on sm_90a, and the 128x256 tile (128 accumulators) at
  // 227-236.
  static constexpr int kRegistersEstimate = WM * WN / 32 + 64;
  // What __launch_bounds__(kThreads, kMinBlocksPerSm) leaves a thread of an
  // SM's 64K registers; a thread may have 255 at most.
  static constexpr int kRegisterShare = kThreads * kMinBlocksPerSm > 0 ? 65536 / (kThreads * kMinBlocksPerSm) : 0;
  static constexpr int kRegisterCap = kRegisterShare < 255 ? kRegisterShare : 255;
  static constexpr bool kRegistersFit = kRegistersEstimate <= kRegisterCap;
  static_assert(kRegistersFit,
                "the warp tile's accumulators need more registers than the threads and blocks per SM leave");

  static constexpr bool kValid = kWarpsDivide && kTensorCoreTiles && kThreadsFit && kChunksShared && kRegistersFit;
};

}  // namespace fusion
