//! The build's side of the model of the sm90 GEMM kernel's time
//! ([`crate::gemm_model`], which the run time shares): its calibration file,
//! the fit of its costs, and the choice of a tile per M bucket where N and K
//! are known at build time.
//!
//! The costs are fitted ([`fit`]) to measured times of whole kernels that
//! are checked in: bench JSONs' rows, each timed with the tier its run
//! named (`FUSION_GEMM_TILE`; the shipped calibration's files name one tier
//! each) or the tile the launcher chose ([`KernelConfig::launched_tile`]). Nothing in the
//! model names a shape: it knows tiles, k-blocks and the SM count, so a
//! layer it never saw is predicted by the same counts as one it did.
//!
//! Where N or K is dynamic the build cannot choose: a build with the model
//! gives the plan table the unit's tiers ([`run_time_tiers`]) and the run
//! time chooses per call with the same [`UnitTiers::fastest_in`].
//!
//! Not here: which candidates a kernel may run (the tuned table's tiles for
//! its kind, [`super::select`]) and what the build renders from the choice.

use crate::gemm_model::few_m_runs;
pub use crate::gemm_model::{
    Costs, GemmShape, SM90_SMS, Split, Splits, TIERS, TierChoice, TileShape, UNKNOWNS, UnitTiers, Work,
    bucket_of, counts, work,
};

use super::{Arch, ConfigSource, KernelConfig, KernelKind, MBucket, TileConfig};
use serde::{Deserialize, Serialize};
use std::fmt;

impl TileShape {
    /// The shape of `tile`.
    pub fn of(tile: &TileConfig) -> TileShape {
        TileShape {
            bm: tile.bm,
            bn: tile.bn,
        }
    }
}

/// How many of a calibration's samples ran one tile.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TileSamples {
    /// The tile.
    #[serde(flatten)]
    pub tile: TileShape,
    /// Samples that ran it.
    pub samples: usize,
}

/// Where a calibration's measurements come from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provenance {
    /// The bench JSON files, relative to the repository's root.
    pub files: Vec<String>,
    /// The GPU the files were measured on.
    pub gpu: String,
    /// The GPU driver's version.
    pub driver: String,
    /// The commit whose kernels were timed.
    pub commit: String,
    /// The date of the run.
    pub date: String,
}

/// The fitted costs of one GPU's sm90 kernel ([`Costs`]) with where they
/// come from. `kernels/tuned/sm90.model.json` is the shipped one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// What the model is, for a reader of the file.
    pub note: String,
    /// The measurements.
    pub provenance: Provenance,
    /// The costs, and the SMs of the GPU measured.
    #[serde(flatten)]
    pub costs: Costs,
    /// The tiles the samples ran: the range the costs were fitted over.
    pub tiles: Vec<TileSamples>,
}

/// A kernel's time on a shape, as measured, with what the model needs to
/// know of the kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Sample {
    /// The GEMM's extent.
    pub shape: GemmShape,
    /// The tile the launch ran.
    pub tile: TileShape,
    /// Whether its epilogue reads an [M, N] source tile.
    pub source_tile: bool,
    /// The splits the launch was allowed.
    pub splits: Splits,
    /// The measured median, in microseconds.
    pub us: f64,
}

impl Calibration {
    /// The shipped calibration of sm90 kernels.
    pub fn shipped_sm90() -> Calibration {
        serde_json::from_str(include_str!("../../kernels/tuned/sm90.model.json"))
            .expect("kernels/tuned/sm90.model.json is a calibration")
    }

    /// The predicted time of `tile` on `shape`, in microseconds
    /// ([`Costs::predict`]).
    pub fn predict(&self, tile: TileShape, shape: GemmShape, source_tile: bool) -> f64 {
        self.costs.predict(tile, shape, source_tile)
    }
}

/// Why [`fit`] could not fit a calibration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FitError(pub String);

impl fmt::Display for FitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for FitError {}

/// Fits the costs to `samples` by least squares on the relative error
/// (each sample weighted by its inverse time), so that a 10 us kernel
/// counts as much as a 1 ms one.
pub fn fit(samples: &[Sample], sms: u64, provenance: Provenance) -> Result<Calibration, FitError> {
    let rows: Vec<([f64; UNKNOWNS], f64)> = samples
        .iter()
        .map(|s| (counts(s.tile, s.shape, s.source_tile, sms, s.splits), s.us))
        .collect();
    let x = least_squares(&rows).ok_or_else(|| {
        FitError(format!(
            "{} samples do not tell the model's {UNKNOWNS} costs apart: measure more tiles and shapes",
            samples.len()
        ))
    })?;
    let mut tiles: Vec<TileSamples> = Vec::new();
    for sample in samples {
        match tiles.iter_mut().find(|t| t.tile == sample.tile) {
            Some(t) => t.samples += 1,
            None => tiles.push(TileSamples {
                tile: sample.tile,
                samples: 1,
            }),
        }
    }
    tiles.sort_by_key(|t| t.tile);
    Ok(Calibration {
        note: NOTE.to_owned(),
        provenance,
        costs: Costs {
            sms,
            launch_us: x[0],
            k_block_area_us: x[1],
            k_block_edge_us: x[2],
            tile_area_us: x[3],
            tile_us: x[4],
            partial_us: x[5],
            memory_us_per_mb: x[6],
        },
        tiles,
    })
}

/// The costs that fit `rows` (each the counts of one sample and its
/// measured time) by least squares on the relative error, each row
/// weighted by its inverse time; `None` when the rows do not tell the
/// costs apart.
pub(super) fn least_squares<const N: usize>(rows: &[([f64; N], f64)]) -> Option<Vec<f64>> {
    let mut normal = vec![vec![0.0; N + 1]; N];
    for (row, us) in rows {
        let weight = 1.0 / (us * us);
        for i in 0..N {
            for j in 0..N {
                normal[i][j] += weight * row[i] * row[j];
            }
            normal[i][N] += weight * row[i] * us;
        }
    }
    solve(normal)
}

/// The note a fitted calibration carries.
const NOTE: &str = "The sm90 GEMM kernel's costs, fitted by fusion_compiler::select::model::fit to the bench rows of `provenance.files` (each timed with the tier its file names, or where it names none, the tile the launcher chose). Regenerate: FUSION_BLESS=1 cargo test -p fusion-compiler model_calibration";

/// Solves the augmented system `rows` (n rows of n + 1) by Gaussian
/// elimination with partial pivoting; `None` when it is singular.
fn solve(mut rows: Vec<Vec<f64>>) -> Option<Vec<f64>> {
    let n = rows.len();
    for column in 0..n {
        let pivot = (column..n).max_by(|&a, &b| rows[a][column].abs().total_cmp(&rows[b][column].abs()))?;
        let scale = rows.iter().map(|r| r[column].abs()).fold(0.0, f64::max);
        if rows[pivot][column].abs() <= 1e-12 * scale.max(f64::MIN_POSITIVE) {
            return None;
        }
        rows.swap(column, pivot);
        let (done, below) = rows.split_at_mut(column + 1);
        let pivot_row = &done[column];
        for row in below {
            let factor = row[column] / pivot_row[column];
            for (value, pivot_value) in row.iter_mut().zip(pivot_row).skip(column) {
                *value -= factor * pivot_value;
            }
        }
    }
    let mut x = vec![0.0; n];
    for row in (0..n).rev() {
        let known: f64 = (row + 1..n).map(|j| rows[row][j] * x[j]).sum();
        x[row] = (rows[row][n] - known) / rows[row][row];
    }
    Some(x)
}

/// The shipped calibration's file, for a config's origin.
pub const SM90_CALIBRATION_FILE: &str = "kernels/tuned/sm90.model.json";

/// `shipped` with one tile per M bucket ([`KernelConfig::by_m`]): in each
/// bucket, the one of `shipped`'s tiles (its large, large_alt, small_m and
/// small_m_alt, each a tile the kernel's kind was checked to take) that
/// `model` predicts fastest for a GEMM of `kernel`'s kind with static `n`
/// (C's columns) and `k` ([`UnitTiers::fastest_in`], which the run time
/// runs where N or K is dynamic). The decode kernel keeps its Ms.
pub fn choose_by_m(
    model: &Calibration,
    kernel: &KernelKind,
    n: u64,
    k: u64,
    shipped: &KernelConfig,
) -> KernelConfig {
    let tiers = shipped.tiers();
    let unit = shipped.unit_tiers(kernel);
    let mut tiles = [shipped.large; MBucket::COUNT];
    for bucket in MBucket::all() {
        if let Some(tile) = unit
            .fastest_in(&model.costs, bucket, n, k)
            .and_then(|tier| tiers[tier].1)
        {
            tiles[bucket.index()] = tile;
        }
    }
    KernelConfig {
        large: tiles[MBucket::COUNT - 1],
        small_m: None,
        small_m_max: None,
        small_m_alt: None,
        large_alt: None,
        decode_max_m: shipped.decode_max_m,
        by_m: Some(tiles),
        few_m: shipped.few_m,
    }
}

/// [`choose_by_m`] for a kernel on `arch` whose N and K are static, with
/// the origin a unit's messages name; `None` where the model does not
/// apply: another arch than sm90, whose mainloop it models, or a dynamic N
/// or K.
pub fn select_by_model(
    model: &Calibration,
    arch: Arch,
    kernel: &KernelKind,
    n: u64,
    k: u64,
    shipped: &KernelConfig,
) -> Option<(KernelConfig, ConfigSource)> {
    if arch != Arch::Sm90 {
        return None;
    }
    let config = choose_by_m(model, kernel, n, k, shipped);
    let origin = ConfigSource {
        file: SM90_CALIBRATION_FILE.to_owned(),
        entry: format!("{}.{}.n{n}.k{k}", kernel.name, kernel.dtype.name()),
    };
    Some((config, origin))
}

/// The tiers a unit of `kernel` on `arch`, compiled with `config`, gives
/// the run time to choose among per call by the model, where the build has
/// the model (`FUSION_SELECT=model`) but could not choose itself: sm90, and
/// N (`n`) or K (`k`) dynamic. `None` where the build chose
/// ([`select_by_model`], or a tuned cache's entries) or the model does not
/// apply (another arch, a config without tiers).
pub fn run_time_tiers(
    arch: Arch,
    kernel: &KernelKind,
    n: Option<u64>,
    k: Option<u64>,
    config: &KernelConfig,
) -> Option<UnitTiers> {
    let dynamic = n.is_none() || k.is_none();
    (arch == Arch::Sm90 && dynamic && config.by_m.is_none()).then(|| config.unit_tiers(kernel))
}

impl KernelConfig {
    /// Its tiers as the model chooses among them for a unit of `kernel`:
    /// each tier's tile, the decode kernel's Ms (for `kernel`'s layout) and
    /// what the kind changes in the time.
    pub fn unit_tiers(&self, kernel: &KernelKind) -> UnitTiers {
        UnitTiers {
            tiles: self.tiers().map(|(_, tile)| tile.as_ref().map(TileShape::of)),
            decode_max_m: self.decode_for(kernel.layout),
            small_m_max: self.small().map(|(_, max_m)| max_m),
            gated: kernel.gated,
            source_tile: kernel.source_tile,
            few_m: self.few_m.as_ref().map(TileShape::of),
        }
    }

    /// The tile the sm90 launcher runs for an `m` x `n` output (GEMM
    /// columns) over `k` on `sms` SMs, as the unit's `with_kernel` chooses
    /// it: its `few_m` tile where its tiles make one wave
    /// (`few_m_runs` in gemm.cuh), then the bucket's tile where
    /// the config has one per M bucket, else by `rule` among its tiers ([`UnitTiers::launcher_tier`];
    /// [`super::tier_choice`] says which rule a unit runs). `None` where
    /// the decode kernel runs (`decode` says whether the kernel has it,
    /// [`KernelConfig::decode_for`]).
    pub fn launched_tile(
        &self,
        m: u64,
        n: u64,
        k: u64,
        sms: u64,
        decode: bool,
        rule: TierChoice,
    ) -> Option<TileConfig> {
        if decode && self.decode_max_m.is_some_and(|max| m <= u64::from(max)) {
            return None;
        }
        if let Some(tile) = self
            .few_m
            .filter(|tile| few_m_runs(TileShape::of(tile), m, n, k, sms))
        {
            return Some(tile);
        }
        if let Some(tiles) = &self.by_m {
            return Some(tiles[bucket_of(m).index()]);
        }
        let tiers = self.tiers();
        let unit = UnitTiers {
            tiles: tiers.map(|(_, tile)| tile.as_ref().map(TileShape::of)),
            decode_max_m: None,
            small_m_max: self.small().map(|(_, max_m)| max_m),
            gated: false,
            source_tile: false,
            few_m: None,
        };
        let tier = unit.launcher_tier(m, n, sms, rule)?;
        tiers[tier].1
    }
}

#[cfg(test)]
pub(super) mod tests;
