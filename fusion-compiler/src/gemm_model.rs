//! The model of the sm90 GEMM kernel's time, and the tile tier it chooses
//! for a call: the one piece of code that both the build's choice per M
//! bucket (`select::model`, for a GEMM whose N and K are static) and the run
//! time's choice per call (fusion's `plan`, where N or K is dynamic) run, so
//! that the two agree on every shape.
//!
//! The kernel is persistent: one CTA per SM walks whole tiles, and where the
//! tiles do not fill the SMs evenly several CTAs share a tile's k-blocks
//! (split-K below one wave; stream-K over the last one on deep tiles or where
//! asked for), which `kernels/include/fusion/sm90/split_plan.cuh` plans at
//! launch. [`work`]
//! repeats that plan, so the model sees what the launch does: how many
//! k-blocks the busiest CTA runs, how many tiles it finishes and how many
//! partial tiles are summed. The time is linear in those counts:
//!
//! `launch + k_block[tile] · k-blocks + tile[tile] · tiles + partial · partials · area + memory · megabytes`
//!
//! (`area` in units of a 128x256 tile; `megabytes` the bytes of A, B and C
//! and of a residual read, each once: where the weight's bytes dominate, at
//! small M, the time follows them more than the tile's flops). [`Costs`]
//! holds the fitted cost of each count.
//!
//! Always built, without the feature `compiler`: it needs nothing but
//! integer and float arithmetic, and the run time links it. Not here: the
//! calibration file, the fit and the choice of candidates at build time
//! (`select::model`).

use serde::{Deserialize, Serialize};
use std::fmt;

/// The bytes at the start of every non-empty GEMM workspace that hold the
/// kernels' counters (`kStreamKFlagBytes` in workspace.cuh): zero when a
/// launch is handed the workspace, zero again when it ends. Nothing else
/// that shares a workspace may write them (the guard's vendor path takes
/// its scratch after them).
pub const WORKSPACE_FLAG_BYTES: u64 = 4096;

/// The sm90 GPUs the model is calibrated for have this many SMs (H100 SXM,
/// H200). The launch plans for the device it runs on; the model's choice,
/// at build time and at run time alike, assumes the calibration's count.
pub const SM90_SMS: u64 = 132;

/// The sm90 mainloop's k-block: 64 elements of K.
const K_BLOCK: u64 = 64;

/// Tile rows a group of the grouped tile order walks down
/// (`fusion::kGroupRows` in gemm.cuh; no shipped tile sets its own).
const GROUP_ROWS: u64 = 8;

/// The most rows of its tiles a unit's `few_m` tile runs ([`few_m_runs`]).
pub const FEW_M_MAX_ROWS: u64 = 2;

/// The deepest K at which a unit's `few_m` tile runs [`FEW_M_MAX_ROWS`]
/// rows of its tiles; deeper, one (`kFewMDeepK` in gemm.cuh,
/// [`few_m_runs`]).
pub const FEW_M_DEEP_K: u64 = 8192;

/// Whether a launch of an `m` x `n` output (GEMM columns) over `k` on `sms`
/// SMs runs the unit's `few_m` tile, ahead of its tiers, as gemm.cuh's
/// `few_m_runs` decides: where the tile's rows of tiles, one, or two where
/// K is at most [`FEW_M_DEEP_K`], make one wave.
pub fn few_m_runs(tile: TileShape, m: u64, n: u64, k: u64, sms: u64) -> bool {
    let rows = m.div_ceil(u64::from(tile.bm));
    if rows > FEW_M_MAX_ROWS || (rows == FEW_M_MAX_ROWS && k > FEW_M_DEEP_K) {
        return false;
    }
    rows * n.div_ceil(u64::from(tile.bn)) <= sms
}

/// The upper bounds of the M buckets, inclusive: a bucket holds the Ms above
/// the previous bound up to its own, and one more bucket holds every M above
/// the last. The tuner measures each bucket at its bound (the last at twice
/// the last bound).
pub const M_BUCKET_BOUNDS: [u32; 8] = [16, 64, 128, 256, 512, 1024, 2048, 4096];

/// One range of M that a tile is chosen for: `m<=16`, ..., `m<=4096`,
/// `m>4096`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MBucket {
    /// Index into [`M_BUCKET_BOUNDS`]; its length for the unbounded bucket.
    index: usize,
}

impl MBucket {
    /// How many buckets there are: one per bound and one above the last.
    pub const COUNT: usize = M_BUCKET_BOUNDS.len() + 1;

    /// Its place among [`MBucket::all`], from 0.
    pub fn index(self) -> usize {
        self.index
    }

    /// Every bucket, smallest M first.
    pub fn all() -> impl Iterator<Item = MBucket> {
        (0..=M_BUCKET_BOUNDS.len()).map(|index| MBucket { index })
    }

    /// The bucket that holds `m`.
    pub fn of(m: u32) -> MBucket {
        MBucket {
            index: M_BUCKET_BOUNDS.partition_point(|&bound| bound < m),
        }
    }

    /// The smallest M it holds.
    pub fn min_m(self) -> u32 {
        match self.index {
            0 => 1,
            i => M_BUCKET_BOUNDS[i - 1] + 1,
        }
    }

    /// The largest M it holds; `None` for the unbounded bucket.
    pub fn max_m(self) -> Option<u32> {
        M_BUCKET_BOUNDS.get(self.index).copied()
    }

    /// The bucket spelled `m<=128` or `m>4096`.
    pub fn parse(name: &str) -> Option<MBucket> {
        MBucket::all().find(|bucket| bucket.to_string() == name)
    }

    /// The Ms its time is weighed at: its smallest, middle and largest (the
    /// unbounded bucket's largest taken as twice its bound).
    pub fn weighed_ms(self) -> [u64; 3] {
        let low = u64::from(self.min_m());
        let high = self.max_m().map_or(
            2 * u64::from(M_BUCKET_BOUNDS[M_BUCKET_BOUNDS.len() - 1]),
            u64::from,
        );
        [low, (low + high) / 2, high]
    }
}

impl fmt::Display for MBucket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.max_m() {
            Some(max) => write!(f, "m<={max}"),
            None => write!(f, "m>{}", M_BUCKET_BOUNDS[M_BUCKET_BOUNDS.len() - 1]),
        }
    }
}

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

/// How a launch spreads its k-blocks over the SMs (split_plan.cuh,
/// `plan_stream_k`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Split {
    /// Every tile whole, in rounds over a balanced grid.
    Whole,
    /// Fewer tiles than half the SMs (or than all, without [`Splits::Fill`]):
    /// each tile's k-blocks shared by this many CTAs.
    SplitK {
        /// CTAs that share one tile.
        ctas_per_tile: u64,
    },
    /// The last wave's tiles (with the full wave before it, when the last
    /// is under half a wave; by default only on deep tiles), or a lone wave
    /// of more than half the SMs' tiles ([`Splits::Fill`]), shared out over
    /// every CTA.
    StreamK,
}

/// Which splits a launch may plan (`fusion_gemm_params::flags`, which the
/// run time sets from `FUSION_STREAM_K`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Splits {
    /// `FUSION_STREAM_K=0`, and every launch captured into a graph: every
    /// tile whole on one CTA (`FUSION_GEMM_NO_STREAM_K`).
    Off,
    /// The default: split-K where the tiles are fewer than the SMs and have
    /// at least 48 k-blocks each, and stream-K over the last wave where
    /// they are more, have at least 192 k-blocks each, and the share saves
    /// the busiest CTA at least a quarter of a tile.
    #[default]
    SplitK,
    /// `FUSION_STREAM_K=tail`: the plan before the corpus measured it
    /// (benchmarks/HISTORY.md v29), and so of every bench file that does not
    /// name its splits: split-K also on tiles of fewer than 48 k-blocks, and
    /// stream-K over the last wave where the tiles are more than the SMs
    /// (`FUSION_GEMM_STREAM_K_TAIL`).
    Tail,
    /// `FUSION_STREAM_K=fill` (slower on the corpus before it kept rows of
    /// tiles side by side: benchmarks/HISTORY.md v31, v32): as the default,
    /// and stream-K over the lone wave where the tiles are more than half
    /// the SMs but fewer (`FUSION_GEMM_STREAM_K_FILL`), which the others
    /// run whole on fewer CTAs than SMs, each row of tiles (up to 8) on its
    /// own CTAs.
    Fill,
}

impl Splits {
    /// `FUSION_STREAM_K`'s value as splits: unset, empty or `split-k` the
    /// default, `0` off, `tail` with stream-K over the last wave, `fill`
    /// over a lone wave; none for any other value.
    pub fn from_setting(value: Option<&str>) -> Option<Splits> {
        match value {
            None | Some("") => Some(Splits::default()),
            Some("0") => Some(Splits::Off),
            Some(name) => Splits::from_name(name).filter(|&s| s != Splits::Off),
        }
    }

    /// The name a bench file records (`splits`), which
    /// [`Splits::from_name`] reads back.
    pub fn name(self) -> &'static str {
        match self {
            Splits::Off => "off",
            Splits::SplitK => "split-k",
            Splits::Tail => "tail",
            Splits::Fill => "fill",
        }
    }

    /// [`Splits::name`]'s inverse.
    pub fn from_name(name: &str) -> Option<Splits> {
        [Splits::Off, Splits::SplitK, Splits::Tail, Splits::Fill]
            .into_iter()
            .find(|s| s.name() == name)
    }
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
/// warp groups on `sms` SMs, as split_plan.cuh plans it with the
/// `splits` its caller allows.
pub fn work(bm: u64, bn: u64, consumers: u64, shape: GemmShape, sms: u64, splits: Splits) -> Work {
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
    if splits == Splits::Off || tiles == 0 || sms == 0 {
        return whole;
    }
    // plan_stream_k, step by step.
    const FIXUP_BLOCKS: u64 = 4;
    const MIN_BLOCKS: u64 = 4;
    const MIN_SPLIT_TILE_BLOCKS: u64 = 48;
    const MIN_TAIL_BLOCKS: u64 = 192;
    if splits != Splits::Tail && tiles < sms && k_blocks < MIN_SPLIT_TILE_BLOCKS {
        return whole;
    }
    const FLAG_BYTES: u64 = WORKSPACE_FLAG_BYTES - 128; // less kTileCounterBytes
    let (mut split_tiles, mut ctas, mut rows) = (tiles, tiles * (sms / tiles.max(1)), 1);
    // A lone wave of more than half the SMs' tiles, shared out with `fill`
    // a row of tiles at a time where the rows fit a group of the tile order
    // (`fusion::kGroupRows`, 8): the CTAs are rows x groups.
    let lone_wave = splits == Splits::Fill && 2 * tiles > sms && tiles < sms;
    if lone_wave {
        let tile_rows = shape.m.div_ceil(bm);
        rows = if (1..=GROUP_ROWS).contains(&tile_rows) {
            tile_rows
        } else {
            1
        };
        ctas = sms / rows * rows;
        if ctas / rows <= tiles / rows {
            return whole;
        }
    }
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
    let per_cta = (split_tiles / rows * k_blocks).div_ceil(ctas / rows);
    let busiest_without = split_tiles.div_ceil(ctas) * k_blocks;
    if per_cta < MIN_BLOCKS
        || per_cta + 2 * FIXUP_BLOCKS >= busiest_without
        || (split_tiles * k_blocks + 1) * ctas >= i32::MAX as u64
        || (splits != Splits::Tail
            && tiles >= sms
            && (k_blocks < MIN_TAIL_BLOCKS || 4 * (busiest_without - per_cta) < k_blocks))
    {
        return whole;
    }
    let whole_rounds = (tiles - split_tiles) / ctas;
    let (split, partials) = if tiles < sms && !lone_wave {
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

/// split_plan.cuh's `balanced_grid`: one CTA per tile up to one per
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

    /// The operand elements per k-block step that the busiest of `sms`
    /// CTAs loads for an `m` x `n` output: its waves (whole tiles, one per
    /// SM at a time) times `bm + bn`. A k-block's time follows what it
    /// loads more than its flops: over the corpus's layers in every tier
    /// (an H100, benchmarks/HISTORY.md v28) the tiles' MMAs ran at about
    /// `bm * bn / (bm + bn)` of the 128x256 tile's rate.
    pub fn busiest_loads(self, m: u64, n: u64, sms: u64) -> u64 {
        self.tiles(m, n).div_ceil(sms.max(1)) * u64::from(self.bm + self.bn)
    }

    /// The loads per k-block step that the SMs left without a tile in the
    /// last wave would have made: `(waves * sms - tiles) * (bm + bn)`.
    pub fn idle_loads(self, m: u64, n: u64, sms: u64) -> u64 {
        let (tiles, sms) = (self.tiles(m, n), sms.max(1));
        (tiles.div_ceil(sms) * sms - tiles) * u64::from(self.bm + self.bn)
    }

    /// Its tiles for an `m` x `n` output.
    fn tiles(self, m: u64, n: u64) -> u64 {
        m.div_ceil(u64::from(self.bm)) * n.div_ceil(u64::from(self.bn))
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

/// The costs the model fits.
pub const UNKNOWNS: usize = 7;

/// The fitted costs of one GPU's sm90 kernel, in microseconds. A tile's
/// costs follow from its shape: a k-block's from its area (the MMAs) and
/// its edge (the bytes TMA loads), a tile's start and finish from its area
/// (the epilogue's stores) and a fixed part, so that one set of costs
/// serves every tile, measured or not. Fields in the order of the
/// calibration file (`kernels/tuned/sm90.model.json`), whose values a build
/// with the model writes into each plan table that chooses per call.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Costs {
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
}

impl Costs {
    /// The costs, in the order [`counts`] gives the counts.
    pub fn as_array(&self) -> [f64; UNKNOWNS] {
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

    /// The predicted time of `tile` on `shape`, in microseconds, with the
    /// splits the launch plans by default ([`Splits::default`]).
    pub fn predict(&self, tile: TileShape, shape: GemmShape, source_tile: bool) -> f64 {
        self.predict_with(tile, shape, source_tile, Splits::default())
    }

    /// [`Costs::predict`] for a launch allowed `splits`.
    pub fn predict_with(&self, tile: TileShape, shape: GemmShape, source_tile: bool, splits: Splits) -> f64 {
        let counts = counts(tile, shape, source_tile, self.sms, splits);
        self.as_array()
            .iter()
            .zip(counts)
            .map(|(cost, count)| cost * count)
            .sum()
    }

    /// `tile`'s time over the Ms of `bucket`: the geometric mean of its
    /// times at the bucket's [`MBucket::weighed_ms`], on `n` GEMM columns
    /// and depth `k`.
    pub fn bucket_time(&self, tile: TileShape, bucket: MBucket, n: u64, k: u64, source_tile: bool) -> f64 {
        let ms = bucket.weighed_ms();
        let log_sum: f64 = ms
            .iter()
            .map(|&m| self.predict(tile, GemmShape { m, n, k }, source_tile).ln())
            .sum();
        (log_sum / ms.len() as f64).exp()
    }
}

/// The model's counts for one launch with `splits`, each the multiplier of
/// one cost of [`Costs::as_array`].
pub fn counts(
    tile: TileShape,
    shape: GemmShape,
    source_tile: bool,
    sms: u64,
    splits: Splits,
) -> [f64; UNKNOWNS] {
    let work = work(
        u64::from(tile.bm),
        u64::from(tile.bn),
        tile.consumers(),
        shape,
        sms,
        splits,
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

/// How a unit's launcher chooses among its tile tiers (gemm.cu.hbs's
/// `with_kernel`) where it has several: a generation's rule
/// (`Target::tier_choice`), except that a tuned cache's tiles keep
/// [`TierChoice::WaveArea`], the rule the tuner's mapping of its buckets
/// onto tiers assumes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TierChoice {
    /// Up to `small_m_max` the small-M tile, or its alternative where that
    /// needs no more waves of tile area (`fewer_waves` in gemm.cuh); above,
    /// the large tile, or its alternative where that needs at most 9/10 of
    /// its waves of tile area (`clearly_fewer_waves`).
    WaveArea,
    /// Every tier in range of M (the small-M ones up to `small_m_max`)
    /// competes; the one whose busiest CTA loads the fewest operand
    /// elements per k-block step, waves x (BM + BN), runs
    /// (`LightestTier` in gemm.cuh).
    LeastLoads,
}

/// A GEMM unit's tile tiers, in the order of the tuned tables' names
/// (`large`, `large_alt`, `small_m`, `small_m_alt`, as `FUSION_GEMM_TILE`
/// and the launch flags `FUSION_GEMM_TILE_*` name them).
pub const TIERS: usize = 4;

/// What the model needs of one compiled GEMM unit to choose its tile: the
/// tiles it was compiled with and what its kind changes in the time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct UnitTiers {
    /// Each tier's tile ([`TIERS`]' order); `None` where the unit has no
    /// such tier.
    pub tiles: [Option<TileShape>; TIERS],
    /// The largest M its decode kernel runs, ahead of every tile; `None`:
    /// it has none.
    pub decode_max_m: Option<u32>,
    /// The largest M its launcher offers the small-M tiers for by itself
    /// (with no tier named in the flags); `None`: the large tiers serve
    /// every M.
    pub small_m_max: Option<u32>,
    /// A gated GEMM: two GEMM columns per column of C.
    pub gated: bool,
    /// Its epilogue reads an [M, N] source tile (a residual or a
    /// multiplier).
    pub source_tile: bool,
    /// Its `few_m` tile, which the launcher runs by itself ahead of the
    /// tiers where [`few_m_runs`] says so; `None`: it has none.
    pub few_m: Option<TileShape>,
}

impl UnitTiers {
    /// The tier (an index into [`UnitTiers::tiles`]) the model predicts
    /// fastest over the Ms of `bucket` for `n` columns of C and depth `k`:
    /// the first of the least [`Costs::bucket_time`], so that tiers of one
    /// shape go to the first of them; `None` when the unit has no tile.
    pub fn fastest_in(&self, costs: &Costs, bucket: MBucket, n: u64, k: u64) -> Option<usize> {
        let gemm_n = if self.gated { n.saturating_mul(2) } else { n };
        let mut best: Option<(usize, f64)> = None;
        for (tier, tile) in self.tiles.iter().enumerate() {
            let Some(tile) = *tile else { continue };
            let time = costs.bucket_time(tile, bucket, gemm_n, k, self.source_tile);
            if best.is_none_or(|(_, least)| time.total_cmp(&least).is_lt()) {
                best = Some((tier, time));
            }
        }
        best.map(|(tier, _)| tier)
    }

    /// Whether its decode kernel runs a call of `m` rows, ahead of every
    /// tile: the launcher's own choice, which a named tier would skip.
    pub fn decodes(&self, m: u64) -> bool {
        self.decode_max_m.is_some_and(|max| m <= u64::from(max))
    }

    /// The tier a call of `m` rows runs: [`UnitTiers::fastest_in`] `m`'s
    /// bucket ([`bucket_of`]), or `None` where the decode kernel takes `m`
    /// ([`UnitTiers::decodes`]).
    pub fn choose(&self, costs: &Costs, m: u64, n: u64, k: u64) -> Option<usize> {
        if self.decodes(m) {
            return None;
        }
        self.fastest_in(costs, bucket_of(m), n, k)
    }

    /// The tier the unit's launcher runs by itself for `m` rows of `gemm_n`
    /// GEMM columns on `sms` SMs, with no tier named in the flags, as
    /// gemm.cu.hbs's `with_kernel` chooses it by `rule`.
    /// [`TierChoice::LeastLoads`] (`LightestTier` in gemm.cuh): among the
    /// large tiers and, up to [`UnitTiers::small_m_max`], the small-M ones,
    /// the one whose busiest CTA loads the fewest operand elements per
    /// k-block step ([`TileShape::busiest_loads`]); on a tie the one whose
    /// last wave leaves the fewest loads idle ([`TileShape::idle_loads`]),
    /// then the first in the order large, large_alt, small_m_alt, small_m.
    /// [`TierChoice::WaveArea`] (`fewer_waves`, `clearly_fewer_waves`): up
    /// to `small_m_max` the small-M tier, or its alternative where that
    /// needs no more waves of tile area; above, the large tier, or its
    /// alternative where that needs at most 9/10 of its waves of tile
    /// area. `None` where the decode kernel takes `m`.
    pub fn launcher_tier(&self, m: u64, gemm_n: u64, sms: u64, rule: TierChoice) -> Option<usize> {
        const LARGE: usize = 0;
        const LARGE_ALT: usize = 1;
        const SMALL_M: usize = 2;
        const SMALL_M_ALT: usize = 3;
        if self.decodes(m) {
            return None;
        }
        let small_in_range = self.small_m_max.is_some_and(|max_m| m <= u64::from(max_m));
        if rule == TierChoice::WaveArea {
            let wave_area =
                |tile: TileShape| tile.tiles(m, gemm_n).div_ceil(sms.max(1)) * u64::from(tile.bm * tile.bn);
            if let (Some(small), true) = (self.tiles[SMALL_M], small_in_range) {
                return Some(match self.tiles[SMALL_M_ALT] {
                    Some(alt) if wave_area(alt) <= wave_area(small) => SMALL_M_ALT,
                    _ => SMALL_M,
                });
            }
            let large = self.tiles[LARGE]?;
            return Some(match self.tiles[LARGE_ALT] {
                Some(alt) if 10 * wave_area(alt) <= 9 * wave_area(large) => LARGE_ALT,
                _ => LARGE,
            });
        }
        let offered: &[usize] = if small_in_range {
            &[LARGE, LARGE_ALT, SMALL_M_ALT, SMALL_M]
        } else {
            &[LARGE, LARGE_ALT]
        };
        let mut lightest: Option<(usize, (u64, u64))> = None;
        for &tier in offered {
            let Some(tile) = self.tiles[tier] else { continue };
            let key = (
                tile.busiest_loads(m, gemm_n, sms),
                tile.idle_loads(m, gemm_n, sms),
            );
            if lightest.is_none_or(|(_, least)| key < least) {
                lightest = Some((tier, key));
            }
        }
        lightest.map(|(tier, _)| tier)
    }

    /// The tile a call of `m` rows of C's `n` columns over `k` runs: its
    /// `few_m` tile where that runs ([`UnitTiers::few_m_run`]); else, where
    /// the plan names the model's tier per call (`tiers_by`, the model's
    /// costs), [`UnitTiers::choose`]'s; else the launcher's own
    /// ([`UnitTiers::launcher_tier`], on the calibration's [`SM90_SMS`],
    /// by [`TierChoice::LeastLoads`]: a plan table carries tiers only for a
    /// unit whose N or K is dynamic, never one of a tuned cache, which
    /// needs both static). `None` where the decode kernel takes `m`.
    pub fn tile_run(&self, tiers_by: Option<&Costs>, m: u64, n: u64, k: u64) -> Option<TileShape> {
        if let Some(few_m) = self.few_m_run(m, n, k) {
            return Some(few_m);
        }
        let tier = match tiers_by {
            Some(costs) => self.choose(costs, m, n, k)?,
            None => {
                let gemm_n = if self.gated { n.saturating_mul(2) } else { n };
                self.launcher_tier(m, gemm_n, SM90_SMS, TierChoice::LeastLoads)?
            }
        };
        self.tiles[tier]
    }

    /// Its `few_m` tile where a call of `m` rows of C's `n` columns over
    /// `k` runs it: where the decode kernel does not take `m` and
    /// [`few_m_runs`] holds on the calibration's [`SM90_SMS`] (the launcher
    /// counts the device's SMs). A plan that names the model's tier per
    /// call names none for these calls, so that the launcher runs it.
    pub fn few_m_run(&self, m: u64, n: u64, k: u64) -> Option<TileShape> {
        let gemm_n = if self.gated { n.saturating_mul(2) } else { n };
        self.few_m
            .filter(|&tile| !self.decodes(m) && few_m_runs(tile, m, gemm_n, k, SM90_SMS))
    }
}

/// The M bucket of a call of `m` rows, every M past `u32::MAX` in the last.
pub fn bucket_of(m: u64) -> MBucket {
    MBucket::of(u32::try_from(m).unwrap_or(u32::MAX))
}

#[cfg(test)]
mod tests {
    /// workspace.cuh, as the kernels compile it, lays out the flags region
    /// [`super::WORKSPACE_FLAG_BYTES`] names.
    #[test]
    fn workspace_cuh_declares_the_flags_region() {
        let header = include_str!("../kernels/include/fusion/workspace.cuh");
        let line = format!(
            "constexpr size_t kStreamKFlagBytes = {};\n",
            super::WORKSPACE_FLAG_BYTES
        );
        assert!(header.contains(&line), "workspace.cuh lacks `{}`", line.trim());
    }

    /// gemm.cuh's few-M tile runs two rows up to [`super::FEW_M_DEEP_K`],
    /// by the rule [`super::few_m_runs`] repeats.
    #[test]
    fn gemm_cuh_declares_the_few_m_rule() {
        let header = include_str!("../kernels/include/fusion/gemm.cuh");
        for line in [
            format!("constexpr int64_t kFewMDeepK = {};\n", super::FEW_M_DEEP_K),
            "  const int64_t rows = (m + Tile::BM - 1) / Tile::BM;\n".to_owned(),
            format!(
                "  if (rows > {0} || (rows == {0} && k > kFewMDeepK)) return false;\n",
                super::FEW_M_MAX_ROWS
            ),
            "  return rows * ((n + Tile::BN - 1) / Tile::BN) <= detail::current_sm_count();\n".to_owned(),
        ] {
            assert!(header.contains(&line), "gemm.cuh lacks `{}`", line.trim());
        }
    }

    /// A unit's few-M tile runs after the decode kernel, ahead of the
    /// model's tier and the launcher's, on a gated GEMM's doubled columns.
    #[test]
    fn the_few_m_tile_runs_ahead_of_the_tiers() {
        use super::{SM90_SMS, TIERS, TileShape, UnitTiers};
        let few = TileShape { bm: 64, bn: 64 };
        let large = TileShape { bm: 128, bn: 256 };
        let unit = UnitTiers {
            tiles: [Some(large); TIERS],
            decode_max_m: Some(16),
            small_m_max: None,
            gated: false,
            source_tile: false,
            few_m: Some(few),
        };
        assert_eq!(unit.tile_run(None, 16, 4096, 4096), None, "the decode kernel");
        assert_eq!(unit.tile_run(None, 17, 4096, 4096), Some(few));
        assert_eq!(unit.tile_run(None, 129, 4096, 4096), Some(large));
        // One row of 132 tiles; a gated GEMM's 2N columns need two waves.
        let n = 66 * 64;
        assert_eq!(unit.tile_run(None, 64, n, 4096), Some(few));
        let gated = UnitTiers { gated: true, ..unit };
        assert_eq!(gated.tile_run(None, 64, n, 4096), Some(few));
        assert_eq!(gated.tile_run(None, 64, n + 8, 4096), Some(large));
        assert!(super::few_m_runs(few, 64, 2 * n, 4096, SM90_SMS));
        // Without one, the tiers.
        let plain = UnitTiers { few_m: None, ..unit };
        assert_eq!(plain.tile_run(None, 64, 4096, 4096), Some(large));
    }

    /// gemm.cuh's grouped tile order walks down [`super::GROUP_ROWS`] rows.
    #[test]
    fn gemm_cuh_declares_the_group_rows() {
        let header = include_str!("../kernels/include/fusion/gemm.cuh");
        let line = format!("constexpr int kGroupRows = {};\n", super::GROUP_ROWS);
        assert!(header.contains(&line), "gemm.cuh lacks `{}`", line.trim());
    }
}
