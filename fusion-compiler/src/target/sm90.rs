//! Hopper (sm_90a): the persistent, warp-specialized wgmma + TMA mainloop
//! (`kernels/include/fusion/sm90/`).

use super::{Arch, Fields as AnyFields, Target, TierChoice, TileConfig};
use crate::ir::DType;

pub(super) static TARGET: Target = Target {
    arch: Arch::Sm90,
    // wgmma and TMA are sm_90a features: its code runs on nothing else, so
    // there is no PTX to carry.
    gencode: "-gencode=arch=compute_90a,code=sm_90a",
    sass_gencode: "-gencode=arch=compute_90a,code=sm_90a",
    // e4m3 only for the FP8 GEMM (A and B e4m3, C bf16), which a build
    // generates with FUSION_FP8=experimental.
    dtypes: &[DType::F16, DType::BF16, DType::F8E4M3],
    mainloop_type: "fusion::sm90::Mainloop",
    mainloop_header: "fusion/sm90/mainloop.cuh",
    tile_space,
    decode: true,
    tier_choice: TierChoice::LeastLoads,
    tuned_json: include_str!("../../kernels/tuned/sm90.json"),
};

/// How the sm90 mainloop's consumer warp groups share the work: its
/// `fusion::sm90::Schedule`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// `BM / 64` consumers split every tile by rows, 64 rows each.
    #[default]
    Cooperative,
    /// Two consumers take alternate whole tiles, so one's epilogue overlaps
    /// the other's K loop.
    PingPong,
}

impl Schedule {
    /// `cooperative`, as the tuned tables spell it.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Cooperative => "cooperative",
            Schedule::PingPong => "pingpong",
        }
    }
}

/// What an sm90 tile config gives beyond its shape: the mainloop fixes its
/// warp groups and runs one block per SM, so it takes no warp tile and no
/// blocks per SM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct Fields {
    /// The schedule; absent means cooperative.
    pub schedule: Option<Schedule>,
    /// CTAs per cluster along M (`kClusterM`: 2 CTAs that own vertically
    /// adjacent tiles share each B tile, each loading half of it by TMA
    /// multicast); 0 when left out, one CTA.
    pub cluster_m: u32,
}

impl TileConfig {
    /// An sm90 entry: `bm` x `bn` with a k-block of 64 (the sm90
    /// mainloop's), `stages` deep, in `schedule` (cooperative where `None`),
    /// one CTA per cluster.
    pub const fn sm90(bm: u32, bn: u32, stages: u32, schedule: Option<Schedule>) -> TileConfig {
        TileConfig {
            bm,
            bn,
            bk: 64,
            stages,
            fields: AnyFields::Sm90(Fields {
                schedule,
                cluster_m: 0,
            }),
        }
    }
}

/// The k-block of the sm90 template's `TileConfig` unless given: 64
/// 16-bit elements, one 128-byte row of A and B.
const BK_16_BIT: u32 = 64;
/// The k-block of an FP8 tile: 128 e4m3 elements, the same 128 bytes.
const BK_FP8: u32 = 128;

impl TileConfig {
    /// This sm90 tile for FP8 operands: k-blocks of 128 elements, the same
    /// bytes a row of A and B as its 64 16-bit ones, so the same shared
    /// memory per stage.
    pub const fn with_fp8_block(self) -> TileConfig {
        TileConfig { bk: BK_FP8, ..self }
    }
}

/// An sm90 tile config as the tuned tables and caches spell it.
#[derive(serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct Spelled {
    bm: u32,
    bn: u32,
    bk: u32,
    stages: u32,
    /// `pipelined` and `staged_store`, options of the sm80 mainloop, were
    /// written `false` into every tile config when one type served every
    /// generation; configs still carry them so that tuned caches read and
    /// write as before. Only `false` is accepted.
    #[serde(default)]
    pipelined: bool,
    #[serde(default)]
    staged_store: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    schedule: Option<Schedule>,
    #[serde(default, skip_serializing_if = "is_zero")]
    cluster_m: u32,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// Reads an sm90 tile config ([`TileConfig::read_for`]).
pub(super) fn read<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<TileConfig, D::Error> {
    let s = <Spelled as serde::Deserialize>::deserialize(deserializer)?;
    if let Some(field) = [("pipelined", s.pipelined), ("staged_store", s.staged_store)]
        .iter()
        .find_map(|(field, set)| set.then_some(field))
    {
        return Err(serde::de::Error::custom(format!(
            "`{field}` does not apply to the sm90 mainloop, which fixes its warp groups and runs one block per SM; leave it out"
        )));
    }
    Ok(TileConfig {
        bm: s.bm,
        bn: s.bn,
        bk: s.bk,
        stages: s.stages,
        fields: AnyFields::Sm90(Fields {
            schedule: s.schedule,
            cluster_m: s.cluster_m,
        }),
    })
}

impl Fields {
    /// The schedule, cooperative when the config names none.
    pub fn schedule(&self) -> Schedule {
        self.schedule.unwrap_or_default()
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
                stages: c.stages,
                pipelined: false,
                staged_store: false,
                schedule: self.schedule,
                cluster_m: self.cluster_m,
            },
            serializer,
        )
    }

    pub(super) fn summary(&self, c: &TileConfig) -> String {
        format!(
            "{}x{}x{} ({} stages, {}, persistent{})",
            c.bm,
            c.bn,
            c.bk,
            c.stages,
            self.schedule().name(),
            if self.cluster_m > 1 {
                format!(", {}-CTA clusters", self.cluster_m)
            } else {
                String::new()
            }
        )
    }

    /// BK is the template's default (64) for 16-bit tiles, so it is not an
    /// argument; an FP8 tile's 128 is the last one, after the cluster and
    /// the default grouping (`fusion::kGroupRows`, gemm.cuh). Each unit asserts that the entry's
    /// `bk` is the type's.
    pub(super) fn cpp_type(&self, c: &TileConfig) -> String {
        let schedule = match self.schedule() {
            Schedule::Cooperative => "Cooperative",
            Schedule::PingPong => "PingPong",
        };
        let cluster = if c.bk != BK_16_BIT {
            format!(", {}, fusion::kGroupRows, {}", self.cluster_m.max(1), c.bk)
        } else if self.cluster_m > 1 {
            format!(", {}", self.cluster_m)
        } else {
            String::new()
        };
        format!(
            "fusion::sm90::TileConfig<{}, {}, {}, fusion::sm90::Schedule::{schedule}{cluster}>",
            c.bm, c.bn, c.stages
        )
    }

    /// What a tile must be is `TileConfig`'s rules in
    /// `kernels/include/fusion/sm90/tile_config.cuh`, and its shared memory is
    /// `sizeof(SharedStorage)`: each unit asserts both with a message naming the
    /// tuned table entry. Registers are fixed by the kernel (producer 40,
    /// consumers 232), so there is no estimate to check. What is checked
    /// here is what the epilogue needs of a gated GEMM's tile.
    pub(super) fn check(&self, c: &TileConfig, gated: bool) -> Result<(), String> {
        // CollectiveEpilogue::fits, asked before any compile.
        if gated && !(c.bn / 2).is_multiple_of(64) {
            return Err(format!(
                "a gated GEMM's tile writes bn / 2 = {} columns of C, which the sm90 epilogue stores as whole 64-column boxes: bn 128 or 256",
                c.bn / 2
            ));
        }
        Ok(())
    }
}

/// Tile rows and columns (the kernel takes any width that is a multiple of
/// 16 from 64 to 256; the space keeps the three the shipped tables use), K in the template's
/// steps of 64, 2 to 8 stages (the shipped tiles use 3 to 8), both
/// schedules, one CTA or 2-CTA clusters along M (which measured faster only
/// at short K: BENCHMARKS.md v21). The grouping of the template's
/// TileConfig keeps its default: the tables do not give it.
const SPACE_BM: &[u32] = &[64, 128];
const SPACE_BN: &[u32] = &[128, 192, 256];
const SPACE_BK: &[u32] = &[64];
const SPACE_STAGES: &[u32] = &[2, 3, 4, 5, 6, 7, 8];
const SPACE_SCHEDULE: &[Option<Schedule>] = &[Some(Schedule::Cooperative), Some(Schedule::PingPong)];
const SPACE_CLUSTER_M: &[u32] = &[0, 2];

/// Every combination of the values above, the schedule varying fastest and
/// `cluster_m` slowest: the space without clusters first.
fn tile_space() -> Vec<TileConfig> {
    let mut tiles = Vec::new();
    for &cluster_m in SPACE_CLUSTER_M {
        for &bm in SPACE_BM {
            for &bn in SPACE_BN {
                for &bk in SPACE_BK {
                    for &stages in SPACE_STAGES {
                        for &schedule in SPACE_SCHEDULE {
                            let fields = AnyFields::Sm90(Fields { schedule, cluster_m });
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
    tiles
}
