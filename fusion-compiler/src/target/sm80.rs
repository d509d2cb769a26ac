//! Ampere and Ada (sm_80, also run on sm_86 and sm_89): the mma.sync
//! mainloop with a cp.async multi-stage pipeline (`kernels/include/fusion/sm80/`).

use super::warp_tiled::{Spelled, WarpTile};
use super::{Arch, Fields as AnyFields, Target, TierChoice, TileConfig};
use crate::ir::DType;

pub(super) static TARGET: Target = Target {
    arch: Arch::Sm80,
    // PTX too, so later GPUs (sm_100 and on) can JIT it.
    gencode: "-gencode=arch=compute_80,code=[sm_80,compute_80]",
    sass_gencode: "-gencode=arch=compute_80,code=sm_80",
    dtypes: &[DType::F16, DType::BF16],
    mainloop_type: "fusion::sm80::Mainloop",
    mainloop_header: "fusion/sm80/mainloop.cuh",
    tile_space,
    decode: true,
    tier_choice: TierChoice::WaveArea,
    tuned_json: include_str!("../../kernels/tuned/sm80.json"),
};

/// What an sm80 tile config gives beyond its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fields {
    /// Rows of C one warp computes.
    pub warp_m: u32,
    /// Columns of C one warp computes.
    pub warp_n: u32,
    /// `__launch_bounds__`' second argument: caps registers so this many
    /// blocks fit on one SM.
    pub min_blocks_per_sm: u32,
    /// The pipelined K loop (A/B fragments double-buffered in registers,
    /// the stage barrier inside the last k16 step): 1.4-1.6x the per-stage
    /// loop on an H200 (benchmarks/HISTORY.md, sweep of 2026-11-29).
    pub pipelined: bool,
    /// The staged store: the epilogue runs on every fragment first, then C
    /// leaves through shared memory in 16-byte stores (+4-5% on the
    /// 128x256x64 tile, sweep set 2).
    pub staged_store: bool,
}

/// Reads an sm80 tile config ([`TileConfig::read_for`]).
pub(super) fn read<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<TileConfig, D::Error> {
    let s = <Spelled as serde::Deserialize>::deserialize(deserializer)?;
    Ok(TileConfig {
        bm: s.bm,
        bn: s.bn,
        bk: s.bk,
        stages: s.stages,
        fields: AnyFields::Sm80(Fields {
            warp_m: s.warp_m,
            warp_n: s.warp_n,
            min_blocks_per_sm: s.min_blocks_per_sm,
            pipelined: s.pipelined,
            staged_store: s.staged_store,
        }),
    })
}

impl Fields {
    fn warp_tile(&self) -> WarpTile {
        WarpTile {
            warp_m: self.warp_m,
            warp_n: self.warp_n,
            min_blocks_per_sm: self.min_blocks_per_sm,
        }
    }

    pub(super) fn write<S: serde::Serializer>(
        &self,
        c: &TileConfig,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serde::Serialize::serialize(
            &Spelled {
                bm: c.bm,
                bn: c.bn,
                bk: c.bk,
                warp_m: self.warp_m,
                warp_n: self.warp_n,
                stages: c.stages,
                min_blocks_per_sm: self.min_blocks_per_sm,
                pipelined: self.pipelined,
                staged_store: self.staged_store,
            },
            serializer,
        )
    }

    pub(super) fn summary(&self, c: &TileConfig) -> String {
        self.warp_tile().summary(c)
    }

    pub(super) fn cpp_type(&self, c: &TileConfig) -> String {
        // Optional trailing parameters are positional: name the K loop
        // whenever a later one is given.
        let mut extra = String::new();
        if self.pipelined || self.staged_store {
            extra += if self.pipelined {
                ", fusion::sm80::KLoop::Pipelined"
            } else {
                ", fusion::sm80::KLoop::PerStage"
            };
        }
        if self.staged_store {
            extra += ", fusion::sm80::Store::Staged";
        }
        format!(
            "fusion::sm80::TileConfig<{}, {}, {}, {}, {}, {}, {}{extra}>",
            c.bm, c.bn, c.bk, self.warp_m, self.warp_n, c.stages, self.min_blocks_per_sm
        )
    }

    /// The fields; the tile rules (and the swizzle's rows of 16, 32, 64, ...
    /// elements) are its header's, asserted by each unit.
    pub(super) fn check(&self, c: &TileConfig) -> Result<(), String> {
        self.warp_tile().check(c, Arch::Sm80)
    }
}

/// Around the shipped tiles (128x128x32, 64x128x32) and the self-test
/// sweep's (kernels/selftest/sweep.json: 128x256, BK 64, 3 stages, the
/// staged store): both K loops, both stores, one to three blocks per SM.
/// Every combination, the last field varying fastest.
fn tile_space() -> Vec<TileConfig> {
    let mut tiles = Vec::new();
    for bm in [64, 128] {
        for bn in [64, 128, 256] {
            for bk in [32, 64] {
                for warp_m in [32, 64] {
                    for warp_n in [32, 64] {
                        for stages in [3, 4] {
                            for min_blocks_per_sm in [1, 2, 3] {
                                for pipelined in [true, false] {
                                    for staged_store in [false, true] {
                                        let fields = AnyFields::Sm80(Fields {
                                            warp_m,
                                            warp_n,
                                            min_blocks_per_sm,
                                            pipelined,
                                            staged_store,
                                        });
                                        tiles.push(TileConfig {
                                            bm,
                                            bn,
                                            bk,
                                            stages,
                                            fields,
                                        });
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    tiles
}
