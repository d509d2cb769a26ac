// The sm90 kernel's compile-time shape: the consumer schedule and the tile
// config (tile size, stages, cluster, grouping) that every part of the
// kernel (tile_scheduler.cuh, collective_mainloop.cuh,
// collective_epilogue.cuh, mainloop.cuh) is instantiated with.
#pragma once

#include "../gemm.cuh"
#include "../problem.cuh"

namespace fusion {
namespace sm90 {

// How the consumer warp groups share the work.
//  - Cooperative: BM/64 consumers split every tile by rows, 64 each.
//  - PingPong: two consumers take alternate tiles, each a whole BM x BN
//    tile; the ring hands them their tiles' stages in turn, so one's
//    epilogue runs while the other's wgmmas keep the tensor cores busy.
enum class Schedule { Cooperative, PingPong };

// Dynamic shared memory an sm_90 block may have.
constexpr int kSmemPerBlock = 227 * 1024;

// A CTA tile: BM rows by BN columns, K in steps of BK elements, kStages
// shared-memory stages. A k-block is one 128-byte swizzled row of A and B:
// BK = 64 for 16-bit operands, 128 for FP8 ones (the mainloop asserts it
// for its element type). Shared memory is 1024 (alignment) + kStages *
// (BM + BN) * 128 bytes for the pipeline, BM * BN * 2 bytes of epilogue
// staging (twice that for PingPong: one tile per consumer; half of it when
// the whole does not fit, which needs halves of whole 16-column boxes: not
// so for 208 or 240 columns) and 16 * kStages + 16 bytes of barriers and 80 of
// stream-K bookkeeping; at most kSmemPerBlock (Mainloop::SharedStorage in
// mainloop.cuh).
//
// kClusterM = 2 launches CTAs in clusters of two that own vertically
// adjacent tiles: they share each B tile, each loading half of it and
// multicasting it to both, which halves the B traffic from L2. A stage is
// then refilled only when the consumers of both CTAs have released it.
template <int BM_, int BN_, int kStages_, Schedule kSchedule_ = Schedule::Cooperative, int kClusterM_ = 1,
          int kGroupRows_ = fusion::kGroupRows, int BK_ = 64>
struct TileConfig {
  static constexpr int BM = BM_, BN = BN_, BK = BK_;
  // The bytes of a k-block's row of A or B, whatever the element type.
  static constexpr int kBlockBytes = 128;
  static constexpr int kStages = kStages_;
  static constexpr Schedule kSchedule = kSchedule_;
  static constexpr int kClusterM = kClusterM_;
  static constexpr int kGroupRows = kGroupRows_;
  // What the selftest prints as the warp tile: one consumer's share.
  static constexpr int WM = kSchedule == Schedule::PingPong ? BM : 64, WN = BN;
  // Each rule is named once: asserted here, and gathered into kValid, which
  // a rendered unit asserts with a message naming its tuned table entry.
  static constexpr bool kClusterOk = kClusterM == 1 || kClusterM == 2;
  static_assert(kClusterOk, "clusters of one or two CTAs along M");
  static constexpr bool kRowsOk = BM == 64 || BM == 128;
  static_assert(kRowsOk, "BM is one or two wgmma row blocks of 64");
  // Any multiple of 16 columns from 64 to 256: wgmma takes them all
  // (primitives.cuh), and the epilogue stores C in boxes of 64, 32 or 16
  // columns, the widest that divides the tile (collective_epilogue.cuh), so
  // that a width can be chosen to fill the SMs' waves: at M = 512, 128 x 80
  // tiles make 2560 columns 128 tiles on 132 SMs where 128 x 128 makes 80.
  static constexpr bool kColumnsOk = BN % 16 == 0 && BN >= 64 && BN <= 256;
  static_assert(kColumnsOk, "a tile is 64 to 256 columns wide, in steps of 16");
  static constexpr bool kBlockOk = BK == 64 || BK == 128;
  static_assert(kBlockOk, "a k-block is a 128-byte row: 64 16-bit or 128 FP8 elements");
  static constexpr bool kStagesOk = kStages >= 2;
  static_assert(kStagesOk, "the pipeline needs at least two stages");
  static constexpr bool kScheduleOk = kSchedule == Schedule::Cooperative || BM == 128;
  static_assert(kScheduleOk, "ping-pong consumers hold a 128 x BN tile each; BN = 128 keeps that at 128 registers");
  // Consumers run with 232 registers (setmaxnreg), which leaves room for 128
  // accumulators besides addresses and the epilogue's values.
  static constexpr bool kAccumulatorsOk = WM * BN / 128 <= 128;
  static_assert(kAccumulatorsOk, "a consumer thread holds at most 128 accumulators");
  static constexpr bool kValid =
      kClusterOk && kRowsOk && kColumnsOk && kBlockOk && kStagesOk && kScheduleOk && kAccumulatorsOk;
  static constexpr bool kPingPong = kSchedule == Schedule::PingPong;
  // The consumer warp groups, and the rows of a tile each computes as kMmaM
  // wgmma row blocks of 64.
  static constexpr int kConsumers = kPingPong ? 2 : BM / 64;
  static constexpr int kMmaM = WM / 64;
  // The first row of a consumer's share of its tile: cooperative consumers
  // split a tile by rows, ping-pong ones take whole tiles.
  static __host__ __device__ constexpr int share_row0(int consumer) {
    return kPingPong ? 0 : consumer * 64;
  }
  // f32 accumulators per wgmma row block and consumer thread.
  static constexpr int kAccumulators = BN / 2;
};

// Whether a cluster's CTAs can share B's tile in `kLayout`: each loads
// BN / kClusterM of its rows in whole 8-row swizzle groups ([N, K]) or an
// equal number of its 64-column boxes ([K, N]).
template <LayoutB kLayout, typename Tile>
constexpr bool cluster_splits_b() {
  return Tile::kClusterM == 1 || (kLayout == LayoutB::KN ? (Tile::BN / 64) % Tile::kClusterM == 0
                                                         : (Tile::BN / Tile::kClusterM) % 8 == 0);
}

// Whether B's tile loads whole in `kLayout`: [N, K] in BN rows of one
// 128-byte k-block each, any width; [K, N] in 64-column boxes.
template <LayoutB kLayout, typename Tile>
constexpr bool b_boxes_fit() {
  return kLayout == LayoutB::NK || Tile::BN % 64 == 0;
}

// Whether `Tile` is one this mainloop takes for B in `kLayout`.
template <LayoutB kLayout, typename Tile>
constexpr bool tile_valid = Tile::kValid && b_boxes_fit<kLayout, Tile>() && cluster_splits_b<kLayout, Tile>();

}  // namespace sm90
}  // namespace fusion
