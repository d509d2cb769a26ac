//! Turing (sm_75): the WMMA mainloop (`kernels/include/fusion/sm75/`), f16
//! only, double-buffered through registers.

use super::warp_tiled::{Spelled, WarpTile};
use super::{Arch, Fields as AnyFields, Target, TierChoice, TileConfig};
use crate::ir::DType;

pub(super) static TARGET: Target = Target {
    arch: Arch::Sm75,
    // PTX too, so later GPUs can JIT it.
    gencode: "-gencode=arch=compute_75,code=[sm_75,compute_75]",
    sass_gencode: "-gencode=arch=compute_75,code=sm_75",
    // Turing tensor cores have no bf16.
    dtypes: &[DType::F16],
    mainloop_type: "fusion::sm75::Mainloop",
    mainloop_header: "fusion/sm75/mainloop.cuh",
    tile_space,
    decode: false,
    tier_choice: TierChoice::WaveArea,
    tuned_json: include_str!("../../kernels/tuned/sm75.json"),
};

/// What an sm75 tile config gives beyond its shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Fields {
    /// Rows of C one warp computes.
    pub warp_m: u32,
    /// Columns of C one warp computes.
    pub warp_n: u32,
    /// `__launch_bounds__`' second argument: caps registers so this many
    /// blocks fit on one SM.
    pub min_blocks_per_sm: u32,
}

/// Reads an sm75 tile config ([`TileConfig::read_for`]).
pub(super) fn read<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<TileConfig, D::Error> {
    let s = <Spelled as serde::Deserialize>::deserialize(deserializer)?;
    if let Some(field) = [("pipelined", s.pipelined), ("staged_store", s.staged_store)]
        .iter()
        .find_map(|(field, set)| set.then_some(field))
    {
        return Err(serde::de::Error::custom(format!(
            "`{field}` does not apply to the sm75 mainloop; leave it out"
        )));
    }
    Ok(TileConfig {
        bm: s.bm,
        bn: s.bn,
        bk: s.bk,
        stages: s.stages,
        fields: AnyFields::Sm75(Fields {
            warp_m: s.warp_m,
            warp_n: s.warp_n,
            min_blocks_per_sm: s.min_blocks_per_sm,
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
                pipelined: false,
                staged_store: false,
            },
            serializer,
        )
    }

    pub(super) fn summary(&self, c: &TileConfig) -> String {
        self.warp_tile().summary(c)
    }

    pub(super) fn cpp_type(&self, c: &TileConfig) -> String {
        format!(
            "fusion::sm75::TileConfig<{}, {}, {}, {}, {}, {}>",
            c.bm, c.bn, c.bk, self.warp_m, self.warp_n, self.min_blocks_per_sm
        )
    }

    /// The fields; the tile rules (and stages = 2: the mainloop is
    /// double-buffered) are its header's, asserted by each unit.
    pub(super) fn check(&self, c: &TileConfig) -> Result<(), String> {
        self.warp_tile().check(c, Arch::Sm75)
    }
}

/// The shipped 128x128 tile and its halves, warp tiles of 32 and 64 and one
/// or two blocks per SM; stages are the template's 2 (it is double-buffered
/// through registers), BK the WMMA loads' 32. Every combination, the last
/// field varying fastest.
fn tile_space() -> Vec<TileConfig> {
    let mut tiles = Vec::new();
    for bm in [64, 128] {
        for bn in [64, 128] {
            for bk in [32] {
                for warp_m in [32, 64] {
                    for warp_n in [32, 64] {
                        for stages in [2] {
                            for min_blocks_per_sm in [1, 2] {
                                let fields = AnyFields::Sm75(Fields {
                                    warp_m,
                                    warp_n,
                                    min_blocks_per_sm,
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
    tiles
}
