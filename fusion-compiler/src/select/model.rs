//! A model of the sm90 GEMM kernel's time on a shape, for choosing a tile
//! per M bucket where N and K are known at build time.
//!
//! The kernel is persistent: one CTA per SM walks whole tiles, and where the
//! tiles do not fill the SMs evenly several CTAs share a tile's k-blocks
//! (split-K below one wave, stream-K over the last one), which
//! `kernels/include/fusion/sm90/tile_scheduler.cuh` plans at launch. [`work`]
//! repeats that plan, so the model sees what the launch does: how many
//! k-blocks the busiest CTA runs, how many tiles it finishes and how many
//! partial tiles are summed. The time is linear in those counts:
//!
//! `launch + k_block[tile] · k-blocks + tile[tile] · tiles + partial · partials · area + memory · megabytes`
//!
//! (`area` in units of a 128x256 tile; `megabytes` the bytes of A, B and C
//! and of a residual read, each once: where the weight's bytes dominate, at
//! small M, the time follows them more than the tile's flops). The costs are fitted ([`fit`]) to
//! measured times of whole kernels that are checked in: a bench JSON's rows,
//! each timed with the tile the launcher chose for it
//! ([`KernelConfig::launched_tile`]). Nothing in the model names a shape: it
//! knows tiles, k-blocks and the SM count, so a layer it never saw is
//! predicted by the same counts as one it did.
//!
//! Not here: which candidates a kernel may run (the tuned table's tiles for
//! its kind, [`super::select`]) and what the build renders from the choice.

use super::{Arch, ConfigSource, KernelConfig, KernelKind, M_BUCKET_BOUNDS, MBucket, TileConfig};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The sm90 GPUs the model is calibrated for have this many SMs (H100 SXM,
/// H200). The launch plans for the device it runs on; the build's choice
/// assumes this count.
pub const SM90_SMS: u64 = 132;

/// The sm90 mainloop's k-block: 64 elements of K.
const K_BLOCK: u64 = 64;

/// A GEMM's extent: `n` counts the GEMM's columns, twice C's for a gated
/// GEMM (gate and up interleaved).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmShape {
    /// Rows of A and C.
    pub m: u64,
    /// Columns of B.
    pub n: u64,
    /// The reduction depth.
    pub k: u64,
}

/// How a launch spreads its k-blocks over the SMs (tile_scheduler.cuh,
/// `plan_stream_k`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Every tile whole, in rounds over a balanced grid.
    Whole,
    /// Fewer tiles than SMs: each tile's k-blocks shared by this many CTAs.
    SplitK {
        /// CTAs that share one tile.
        ctas_per_tile: u64,
    },
    /// The last wave's tiles (with the full wave before it, when the last
    /// is under half a wave) shared out over every CTA.
    StreamK,
}

/// What a launch of one tile config does on one shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Work {
    /// Output tiles.
    pub tiles: u64,
    /// k-blocks per tile.
    pub k_blocks: u64,
    /// CTAs launched.
    pub grid: u64,
    /// The k-blocks the busiest CTA runs.
    pub busiest_k_blocks: u64,
    /// The tiles (whole or a share) the busiest CTA finishes or hands on.
    pub rounds: u64,
    /// Partial tiles published and summed per split tile.
    pub partials: u64,
    /// How the k-blocks are spread.
    pub split: Split,
}

/// The launch's work for a `bm` x `bn` cooperative tile with `consumers`
/// warp groups on `sms` SMs, as tile_scheduler.cuh plans it (`stream_k`:
/// whether the caller allows split-K and stream-K, as the run time does
/// unless `FUSION_STREAM_K=0` or a graph is being captured).
pub fn work(bm: u64, bn: u64, consumers: u64, shape: GemmShape, sms: u64, stream_k: bool) -> Work {
    let tiles = shape.m.div_ceil(bm) * shape.n.div_ceil(bn);
    let k_blocks = shape.k.div_ceil(K_BLOCK);
    let grid = balanced_grid(tiles, sms);
    let whole = Work {
        tiles,
        k_blocks,
        grid,
        busiest_k_blocks: tiles.div_ceil(grid.max(1)) * k_blocks,
        rounds: tiles.div_ceil(grid.max(1)),
        partials: 0,
        split: Split::Whole,
    };
    if !stream_k || tiles == 0 || sms == 0 {
        return whole;
    }
    // plan_stream_k, step by step.
    const FIXUP_BLOCKS: u64 = 4;
    const MIN_BLOCKS: u64 = 4;
    const FLAG_BYTES: u64 = 4096 - 128; // kStreamKFlagBytes - kTileCounterBytes
    let (mut split_tiles, mut ctas) = (tiles, tiles * (sms / tiles.max(1)));
    if tiles >= sms {
        split_tiles = tiles % sms;
        if split_tiles == 0 {
            return whole;
        }
        if 2 * split_tiles < sms {
            split_tiles += sms;
        }
        ctas = sms;
    }
    if ctas == split_tiles || split_tiles * consumers * 4 > FLAG_BYTES {
        return whole;
    }
    let per_cta = (split_tiles * k_blocks).div_ceil(ctas);
    let busiest_without = split_tiles.div_ceil(ctas) * k_blocks;
    if per_cta < MIN_BLOCKS || per_cta + 2 * FIXUP_BLOCKS >= busiest_without {
        return whole;
    }
    let whole_rounds = (tiles - split_tiles) / ctas;
    let (split, partials) = if tiles < sms {
        let share = sms / tiles;
        (Split::SplitK { ctas_per_tile: share }, share - 1)
    } else {
        // A split tile's k-blocks are shared by the CTAs whose ranges
        // cover it; the finisher sums the others' partials.
        (Split::StreamK, k_blocks.div_ceil(per_cta))
    };
    Work {
        tiles,
        k_blocks,
        grid: ctas,
        busiest_k_blocks: whole_rounds * k_blocks + per_cta,
        rounds: whole_rounds + per_cta.div_ceil(k_blocks).max(1),
        partials,
        split,
    }
}

/// tile_scheduler.cuh's `balanced_grid`: one CTA per tile up to one per
/// SM, past that the fewest CTAs that need no more rounds.
fn balanced_grid(tiles: u64, sms: u64) -> u64 {
    if tiles <= sms {
        return tiles;
    }
    let rounds = tiles.div_ceil(sms);
    tiles.div_ceil(rounds)
}

/// The rows and columns of a tile config.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct TileShape {
    /// Rows of C per tile.
    pub bm: u32,
    /// GEMM columns per tile.
    pub bn: u32,
}

impl TileShape {
    /// The shape of `tile`.
    pub fn of(tile: &TileConfig) -> TileShape {
        TileShape {
            bm: tile.bm,
            bn: tile.bn,
        }
    }

    /// Its area (the flops of a k-block, the bytes of its C tile) in units
    /// of a 128x256 tile's.
    fn area(self) -> f64 {
        f64::from(self.bm * self.bn) / (128.0 * 256.0)
    }

    /// Its edge, `bm + bn` (the bytes a k-block loads), in units of a
    /// 128x256 tile's.
    fn edge(self) -> f64 {
        f64::from(self.bm + self.bn) / (128.0 + 256.0)
    }

    /// The cooperative schedule's consumer warp groups: 64 rows each.
    fn consumers(self) -> u64 {
        u64::from(self.bm / 64).max(1)
    }
}

impl fmt::Display for TileShape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}x{}", self.bm, self.bn)
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

/// The fitted costs of one GPU's sm90 kernel, in microseconds. A tile's
/// costs follow from its shape: a k-block's from its area (the MMAs) and
/// its edge (the bytes TMA loads), a tile's start and finish from its area
/// (the epilogue's stores) and a fixed part, so that one set of costs
/// serves every tile, measured or not. `kernels/tuned/sm90.model.json` is
/// the shipped one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Calibration {
    /// What the model is, for a reader of the file.
    pub note: String,
    /// The measurements.
    pub provenance: Provenance,
    /// The SMs of the GPU measured.
    pub sms: u64,
    /// A launch, whatever it computes.
    pub launch_us: f64,
    /// One k-block per 128x256 tile area.
    pub k_block_area_us: f64,
    /// One k-block per 128 + 256 tile edge.
    pub k_block_edge_us: f64,
    /// Starting and finishing one tile, per 128x256 tile area.
    pub tile_area_us: f64,
    /// Starting and finishing one tile, whatever its size.
    pub tile_us: f64,
    /// Publishing and summing one partial tile, per 128x256 tile area.
    pub partial_us: f64,
    /// Each megabyte the launch reads or writes once (A, B, C and a
    /// residual, 2-byte elements).
    pub memory_us_per_mb: f64,
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
    /// The measured median, in microseconds.
    pub us: f64,
}

impl Calibration {
    /// The shipped calibration of sm90 kernels.
    pub fn shipped_sm90() -> Calibration {
        serde_json::from_str(include_str!("../../kernels/tuned/sm90.model.json"))
            .expect("kernels/tuned/sm90.model.json is a calibration")
    }

    /// The costs, in the order [`features`] gives the counts.
    fn costs(&self) -> [f64; UNKNOWNS] {
        [
            self.launch_us,
            self.k_block_area_us,
            self.k_block_edge_us,
            self.tile_area_us,
            self.tile_us,
            self.partial_us,
            self.memory_us_per_mb,
        ]
    }

    /// The predicted time of `tile` on `shape`, in microseconds, with
    /// split-K and stream-K as the launch plans them.
    pub fn predict(&self, tile: TileShape, shape: GemmShape, source_tile: bool) -> f64 {
        let counts = features(tile, shape, source_tile, self.sms);
        self.costs()
            .iter()
            .zip(counts)
            .map(|(cost, count)| cost * count)
            .sum()
    }

    /// Of `candidates`, the tile the model predicts fastest over the Ms of
    /// `bucket` (the geometric mean of its times at the bucket's smallest,
    /// middle and largest M; the unbounded bucket up to twice its bound),
    /// with that mean; `None` when there is no candidate.
    pub fn fastest(
        &self,
        candidates: &[TileConfig],
        bucket: MBucket,
        n: u64,
        k: u64,
        source_tile: bool,
    ) -> Option<(TileConfig, f64)> {
        let ms = bucket_ms(bucket);
        candidates
            .iter()
            .map(|tile| {
                let log_sum: f64 = ms
                    .iter()
                    .map(|&m| {
                        self.predict(TileShape::of(tile), GemmShape { m, n, k }, source_tile)
                            .ln()
                    })
                    .sum();
                (*tile, (log_sum / ms.len() as f64).exp())
            })
            .min_by(|a, b| a.1.total_cmp(&b.1))
    }
}

/// The Ms a bucket's time is weighed at: its smallest, middle and largest
/// (the unbounded bucket's largest taken as twice its bound).
pub(super) fn bucket_ms(bucket: MBucket) -> [u64; 3] {
    let low = u64::from(bucket.min_m());
    let high = bucket.max_m().map_or(
        2 * u64::from(M_BUCKET_BOUNDS[M_BUCKET_BOUNDS.len() - 1]),
        u64::from,
    );
    [low, (low + high) / 2, high]
}

/// The costs a calibration fits.
const UNKNOWNS: usize = 7;

/// The model's counts for one launch, each the multiplier of one cost of
/// [`Calibration::costs`].
fn features(tile: TileShape, shape: GemmShape, source_tile: bool, sms: u64) -> [f64; UNKNOWNS] {
    let work = work(
        u64::from(tile.bm),
        u64::from(tile.bn),
        tile.consumers(),
        shape,
        sms,
        true,
    );
    let (k_blocks, rounds) = (work.busiest_k_blocks as f64, work.rounds as f64);
    let (m, n, k) = (shape.m as f64, shape.n as f64, shape.k as f64);
    let c_passes = if source_tile { 2.0 } else { 1.0 };
    [
        1.0,
        k_blocks * tile.area(),
        k_blocks * tile.edge(),
        rounds * tile.area(),
        rounds,
        work.partials as f64 * tile.area(),
        (m * k + n * k + c_passes * m * n) * 2.0 / 1e6,
    ]
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
        .map(|s| (features(s.tile, s.shape, s.source_tile, sms), s.us))
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
        sms,
        launch_us: x[0],
        k_block_area_us: x[1],
        k_block_edge_us: x[2],
        tile_area_us: x[3],
        tile_us: x[4],
        partial_us: x[5],
        memory_us_per_mb: x[6],
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
const NOTE: &str = "The sm90 GEMM kernel's costs, fitted by fusion_compiler::select::model::fit to the bench rows of `provenance.files` (each timed with the tile the launcher chose for it). Regenerate: FUSION_BLESS=1 cargo test -p fusion-compiler model_calibration";

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
/// (C's columns) and `k`. The decode kernel keeps its Ms.
pub fn choose_by_m(
    model: &Calibration,
    kernel: &KernelKind,
    n: u64,
    k: u64,
    shipped: &KernelConfig,
) -> KernelConfig {
    let mut candidates: Vec<TileConfig> = Vec::new();
    for tile in shipped.tiers().into_iter().filter_map(|(_, tile)| tile) {
        if !candidates.contains(&tile) {
            candidates.push(tile);
        }
    }
    let gemm_n = if kernel.gated { 2 * n } else { n };
    let mut tiles = [shipped.large; MBucket::COUNT];
    for bucket in MBucket::all() {
        if let Some((tile, _)) = model.fastest(&candidates, bucket, gemm_n, k, kernel.source_tile) {
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

impl KernelConfig {
    /// The tile the sm90 launcher runs for an `m` x `n` output (GEMM
    /// columns) on `sms` SMs, as the unit's `with_kernel` chooses it
    /// (gemm.cu.hbs, `fewer_waves` and `clearly_fewer_waves` in gemm.cuh);
    /// `None` where the decode kernel runs (`decode` says whether the
    /// kernel has it, [`KernelConfig::decode_for`]).
    pub fn launched_tile(&self, m: u64, n: u64, sms: u64, decode: bool) -> Option<TileConfig> {
        let wave_area = |tile: &TileConfig| {
            let tiles = m.div_ceil(u64::from(tile.bm)) * n.div_ceil(u64::from(tile.bn));
            tiles.div_ceil(sms) * u64::from(tile.bm * tile.bn)
        };
        if decode && self.decode_max_m.is_some_and(|max| m <= u64::from(max)) {
            return None;
        }
        if let Some(tiles) = &self.by_m {
            return Some(tiles[MBucket::of(u32::try_from(m).unwrap_or(u32::MAX)).index()]);
        }
        if let Some((small, max_m)) = self.small()
            && m <= u64::from(max_m)
        {
            return Some(match self.small_m_alt {
                Some(alt) if wave_area(&alt) <= wave_area(&small) => alt,
                _ => small,
            });
        }
        Some(match self.large_alt {
            Some(alt) if 10 * wave_area(&alt) <= 9 * wave_area(&self.large) => alt,
            _ => self.large,
        })
    }
}

#[cfg(test)]
pub(super) mod tests;
