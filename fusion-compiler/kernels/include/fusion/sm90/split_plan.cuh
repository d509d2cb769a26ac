// Host side of the sm90 kernel's split of K: how a launch spreads its tiles'
// k-blocks over the SMs (plan_stream_k: whole tiles, split-K or stream-K)
// and the grid it runs on (balanced_grid), which the launcher plans before
// it launches (Mainloop::plan_launch) and the tile scheduler
// (tile_scheduler.cuh) walks on the device. fusion-compiler's
// gemm_model::work repeats these rules for the model of the kernel's time.
#pragma once

#include <stdint.h>

#include "../workspace.cuh"

namespace fusion {
namespace sm90 {

// How a launch's tiles are split (tile_scheduler.cuh's StreamK walk says
// how the CTAs run it).
struct StreamK {
  int dp_tiles = 0;  // tiles [0, dp_tiles) run whole: CTA b takes b, b + grid, ...
  int units = 0;     // k-blocks of tiles [dp_tiles, tiles); 0: no stream-K (units * grid < 2^31)
  // Rows of split tiles shared out side by side (`fill`): split tile
  // c * rows + r is column c of row r, CTA b runs row b % rows, and the
  // grid / rows CTAs of each row share its columns' k-blocks alike, so
  // that the CTAs of one column read the same k-slices of B together. 1:
  // the split tiles laid end to end over every CTA.
  int rows = 1;
  // [grid + split tiles - 1][kConsumers][kMmaM * kAccumulators / 4][128 threads]
  // float4s: one slot per (tile, CTA) pair, see partial_slot.
  float* partials = nullptr;
  // Arrival counters, [split tiles][kConsumers], in the workspace's flags
  // region after the tile counters.
  uint32_t* flags = nullptr;
};

// The grid of a launch that runs every unit whole: one CTA per unit up to
// one per SM, and past that the fewest CTAs that need no more rounds of
// units than one per SM would (at 4096^3, 512 tiles of 128x256: 128 CTAs
// of 4 tiles each, not 132 of which 16 idle through the last). The
// launch takes as many rounds either way; with fewer SMs busy it ran
// ~1 us faster on an H200 at 4096^3 (benchmarks/HISTORY.md v11).
inline int64_t balanced_grid(int64_t units, int64_t sms) {
  if (units <= sms) return units;
  const int64_t rounds = (units + sms - 1) / sms;
  return (units + rounds - 1) / rounds;
}

// How a launch's k-blocks are spread over the SMs (s: SMs, t: tiles).
//  - t < s: split-K. Each tile goes to s / t CTAs (grid t * (s / t)),
//    whose equal shares of its k-blocks run side by side. At
//    (128, 4096, 14336) with 64x128 tiles (64 tiles of 224 k-blocks on 132
//    SMs) every CTA runs half a tile. With s / 2 < t < s and `fill` asked
//    for (FUSION_GEMM_STREAM_K_FILL), the tiles are shared out over all s
//    CTAs instead, as stream-K shares a last wave; without it they run
//    whole on t CTAs. The CTAs are then rows x groups: each of the r rows
//    of tiles (r <= kGroupRows, so that tile c * r + i in grouped order is
//    column c of row i) gets s / r CTAs that share its columns' k-blocks
//    alike (StreamK::rows): at (512, 2560, 10240), 4 rows of 20 tiles of
//    128x128 on 132 SMs, 33 CTAs a row each run 97 of a tile's 160
//    k-blocks, and the 4 CTAs of one column read the same k-slices of B at
//    the same time, which L2 serves once. Laid end to end over all CTAs
//    instead, each CTA started at another k-block, and ncu read 1.4-1.55x
//    the DRAM bytes of whole tiles at (128, 6144, 24576),
//    (512, 2560, 9728) and (512, 2560, 10240) on an H100
//    (benchmarks/HISTORY.md v32).
//  - t >= s, t not a multiple of s, and tiles deep enough that it pays
//    (kMinTailBlocks), or the caller asks for it everywhere
//    (FUSION_GEMM_STREAM_K_TAIL): stream-K for the last wave. Every CTA
//    runs t / s tiles whole, then an equal share of the k-blocks of the
//    remaining t % s tiles, which would otherwise leave s - t % s SMs idle
//    for a whole tile. When the remainder is under half a wave, the last
//    full wave joins it, so that a tile is shared by at most three CTAs
//    and no CTA's share is a sliver (each partial a finisher gathers costs
//    as much as a few k-blocks).
// Either is used only when it cuts the busiest CTA's k-blocks by more than
// its fixups cost (publishing and gathering partial tiles, counted as
// kFixupBlocks k-blocks each) and leaves each CTA at least kMinBlocks. On an
// H200 at 4096^3 (64 k-blocks of ~0.68 us per 128x256 tile), publishing a
// partial tile took ~3.7 us and gathering one added ~2.2 us to the
// finishing CTA's epilogue (kernels/selftest --trace, with scalar moves;
// benchmarks/HISTORY.md), about 9 k-blocks for the pair. There the remainder's
// share, 57 k-blocks against 64, gains less than that: stream-K measured
// 0.967-0.969 of cuBLASLt against 0.975 without, and is refused. At 8192^3
// and (8192, 14336, 4096) it gained 1-2%, at (8192, 4096, 14336) nothing
// measurable. (Measured when only the CTAs that did not finish a tile
// published theirs and the finisher waited; fix_up also stores the
// finisher's share, and rereads it unless it holds the tile's first
// k-blocks.)
// Measured again over the layer corpus's GEMMs on an H200 (benchmarks/HISTORY.md
// v29), stream-K for the last wave took 1.025x the time of whole last
// waves on the 46 rows it ran (geometric mean; 0.95x to 1.15x row by row,
// the largest losses where K is short: 1.13x at (1000, 4800, 1600)),
// while split-K took 0.874x the time of no split on the 32 rows it ran (29
// of them at M = 128): the tail runs by default only on tiles of at
// least kMinTailBlocks k-blocks where it saves a quarter of a tile.
// The launcher asks for neither when its caller says FUSION_GEMM_NO_STREAM_K
// (the run time does for FUSION_STREAM_K=0 and while capturing a graph),
// and walks the whole tiles statically (no counter) when it says
// FUSION_GEMM_STATIC_TILES (the run time's default, unless FUSION_TILE_COUNTER=1,
// and always while capturing).
//
// plan_stream_k: the split for `tiles` tiles (`tile_rows` rows of them) of
// `k_blocks` k-blocks on `sms` SMs of a Config's kernel (StreamK::units 0:
// every tile whole) and,
// when it splits, the grid it needs in *grid (left alone otherwise). Split-K where the caller
// allows any split; `tail`: stream-K over the last wave too
// (FUSION_GEMM_STREAM_K_TAIL); `fill`: over a lone wave of more than half
// the SMs' tiles too (FUSION_GEMM_STREAM_K_FILL).
template <typename Config>
StreamK plan_stream_k(int64_t tiles, int64_t tile_rows, int64_t k_blocks, int64_t sms, bool tail, bool fill,
                      int64_t* grid) {
  constexpr int64_t kFixupBlocks = 4, kMinBlocks = 4;
  // With fewer tiles than SMs a split needs tiles of at least this many
  // k-blocks, unless the caller asks for the tail (FUSION_STREAM_K=tail
  // keeps the plan as it was before this bound): over the layer corpus on
  // an H200 (benchmarks/HISTORY.md v29)
  // split-K took 0.62x-1.00x the time of whole tiles at 48 k-blocks and
  // more, and 1.006x-1.090x at 25-40 (e.g. 1.083x at (128, 1600, 1600),
  // 26 tiles of 64x128 split 5 ways).
  constexpr int64_t kMinSplitTileBlocks = 48;
  // With more tiles than SMs, the last wave is shared out without `tail`
  // only where its tiles have at least this many k-blocks and the share
  // saves the busiest CTA at least a quarter of a tile: over the same rows
  // the tail took 0.950x-0.970x the time of whole waves at 224-320 k-blocks
  // where it saved 0.30-0.54 of a tile, and 0.990x-1.035x at 384-448 where
  // the last wave was 124 of 132 tiles (saving 0.06); below 192 k-blocks it
  // lost as often as it won (0.958x-1.154x).
  constexpr int64_t kMinTailBlocks = 192;
  StreamK sk;
  if (Config::kPingPong || Config::kClusterM > 1) return sk;
  if (tiles <= 0 || sms <= 0) return sk;
  if (!tail && tiles < sms && k_blocks < kMinSplitTileBlocks) return sk;
  int64_t split_tiles = tiles, ctas = tiles * (sms / tiles), rows = 1;
  // With `fill`, a lone wave of more than half the SMs' tiles is shared out
  // over every CTA, a row of tiles at a time where the rows fit a group of
  // the tile order.
  if (fill && 2 * tiles > sms && tiles < sms) {
    rows = tile_rows <= Config::kGroupRows ? tile_rows : 1;
    ctas = sms / rows * rows;
    if (ctas / rows <= tiles / rows) return sk;
  }
  if (tiles >= sms) {
    split_tiles = tiles % sms;
    if (split_tiles == 0) return sk;
    if (2 * split_tiles < sms) split_tiles += sms;
    ctas = sms;
  }
  if (ctas == split_tiles) return sk;
  // An arrival counter per split tile and consumer (fix_up).
  if (split_tiles * Config::kConsumers * int64_t(sizeof(uint32_t)) >
      int64_t(kStreamKFlagBytes - kTileCounterBytes))
    return sk;
  // Each of the `rows` rows' CTAs share its split tiles' k-blocks.
  const int64_t per_cta = (split_tiles / rows * k_blocks + ctas / rows - 1) / (ctas / rows);
  const int64_t whole = (split_tiles + ctas - 1) / ctas * k_blocks;  // the busiest CTA's k-blocks without it
  if (per_cta < kMinBlocks || per_cta + 2 * kFixupBlocks >= whole ||
      (split_tiles * k_blocks + 1) * ctas >= INT32_MAX)
    return sk;
  // Without `tail`, a last wave is shared out only on deep tiles, where it
  // saves the busiest CTA at least a quarter of a tile.
  if (!tail && tiles >= sms && (k_blocks < kMinTailBlocks || 4 * (whole - per_cta) < k_blocks)) return sk;
  sk.dp_tiles = int(tiles - split_tiles);
  sk.units = int(split_tiles * k_blocks);
  sk.rows = int(rows);
  *grid = ctas;
  return sk;
}

}  // namespace sm90
}  // namespace fusion
