//! The guard's verdict on one M bucket of a GEMM, and the model of the
//! unfused vendor path's time it weighs against the fused kernel's
//! ([`crate::gemm_model`]): the one piece of code that both the build's
//! verdict per bucket (`select::guard`, for a GEMM whose N and K are
//! static) and the run time's verdict per call (fusion's `plan`, where N or
//! K is dynamic) run, so that the two agree on every shape.
//!
//! The vendor path is cuBLASLt with its fused epilogue, with a norm kernel
//! before it or an elementwise kernel after it where the GEMM needs one
//! ([`VendorWork`]). Its time is linear in a few counts:
//!
//! `launch + wave · GFLOP of cuBLASLt's waves + memory · megabytes + extra kernels + extra · their megabytes`
//!
//! ([`VendorCosts`], fitted to the cuBLASLt times of the bench rows by
//! `select::guard::fit_vendor`). A bucket leaves the fused kernel only
//! where it is predicted slower by more than [`MARGIN`].
//!
//! Always built, without the feature `compiler`, as `gemm_model` is: the
//! run time links it. Not here: the calibration file, the fit, which
//! epilogue steps cuBLASLt takes (`select::guard::VendorPath`) and running
//! the path (fusion's `vendor`).

use crate::gemm_model::{Costs, GemmShape, MBucket, TileShape, UnitTiers};
use serde::{Deserialize, Serialize};

/// How much slower the fused kernel must be predicted (or measured) than
/// the vendor path before a bucket leaves it: 3%. The models err by
/// several percent, and a call that leaves the fused kernel pays a second
/// launch or more.
pub const MARGIN: f64 = 0.03;

/// Whether a bucket runs the vendor path where the fused kernel takes
/// `fused_us` (`None`: the decode kernel runs, which the model does not
/// cover, and the bucket stays fused) and the vendor path `vendor_us`: the
/// fused kernel slower by more than [`MARGIN`].
pub fn vendor_wins(fused_us: Option<f64>, vendor_us: f64) -> bool {
    fused_us.is_some_and(|fused| fused > vendor_us * (1.0 + MARGIN))
}

/// What the vendor path of a GEMM runs, as its time counts it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VendorWork {
    /// A norm kernel runs before the GEMM.
    pub norm: bool,
    /// The GEMM computes gate and up stacked: twice C's columns, and an
    /// elementwise kernel after it multiplies the two.
    pub gated: bool,
    /// The residual rides on cuBLASLt's `beta·C` term: C read once more.
    pub beta_residual: bool,
    /// Where an elementwise kernel runs after the GEMM for the steps
    /// cuBLASLt cannot take (or a gated pair's act·mul): the [M, N] operands
    /// it reads besides its input (a residual, a multiplier); `None`: none
    /// runs.
    pub elementwise_tiles: Option<u32>,
}

/// The costs a vendor calibration fits.
pub const VENDOR_UNKNOWNS: usize = 5;

impl VendorWork {
    /// Kernels it launches besides the GEMM.
    fn extra_kernels(&self) -> u64 {
        u64::from(self.norm) + u64::from(self.gated || self.elementwise_tiles.is_some())
    }

    /// Megabytes the GEMM moves (A, B and C, C twice with a residual
    /// through beta) and those the kernels besides it read and write, for
    /// `m` rows of C's `n` columns over `k` (2-byte elements).
    fn megabytes(&self, m: u64, n: u64, k: u64) -> (f64, f64) {
        let (m, n, k) = (m as f64, n as f64, k as f64);
        let gemm_n = if self.gated { 2.0 * n } else { n };
        let c_passes = if self.beta_residual { 2.0 } else { 1.0 };
        let gemm = (m * k + gemm_n * k + c_passes * m * gemm_n) * 2.0 / 1e6;
        let tiles = f64::from(self.elementwise_tiles.unwrap_or(0));
        let elementwise = if self.gated {
            // Gate and up read, the product written, each tile operand read.
            3.0 + tiles
        } else if self.elementwise_tiles.is_none() {
            0.0
        } else {
            2.0 + tiles
        };
        let norm = if self.norm { 2.0 * m * k } else { 0.0 };
        (gemm, (elementwise * m * n + norm) * 2.0 / 1e6)
    }

    /// The model's counts for one call of `m` rows of C's `n` columns over
    /// `k` on `sms` SMs, each the multiplier of one cost of
    /// [`VendorCosts::as_array`].
    pub fn counts(&self, m: u64, n: u64, k: u64, sms: u64) -> [f64; VENDOR_UNKNOWNS] {
        let gemm_n = if self.gated { 2 * n } else { n };
        let (gemm_mb, extra_mb) = self.megabytes(m, n, k);
        [
            1.0,
            lt_wave_gflop(GemmShape { m, n: gemm_n, k }, sms),
            gemm_mb,
            self.extra_kernels() as f64,
            extra_mb,
        ]
    }
}

/// The tiles cuBLASLt's sm90 kernels run, for the model's count of waves.
const LT_TILES: [(u64, u64); 6] = [
    (128, 256),
    (128, 128),
    (64, 128),
    (128, 192),
    (256, 128),
    (64, 64),
];

/// The split-K factors it may use where the tiles are under two waves.
const LT_SPLITS: [u64; 4] = [1, 2, 4, 8];

/// The work of the GEMM as cuBLASLt's heuristic would spread it, in GFLOP
/// of the whole GPU: of its tiles and split-K factors, the one whose
/// busiest SM runs the fewest multiply-adds, times the SMs. Where the tiles
/// fill the waves evenly this is the GEMM's own flops; where they do not it
/// is what the last wave wastes.
fn lt_wave_gflop(shape: GemmShape, sms: u64) -> f64 {
    let mut best = f64::INFINITY;
    for (bm, bn) in LT_TILES {
        let tiles = shape.m.div_ceil(bm) * shape.n.div_ceil(bn);
        for split in LT_SPLITS {
            if split > 1 && tiles * split > 2 * sms {
                continue;
            }
            let busiest = (tiles * split).div_ceil(sms) * bm * bn * shape.k.div_ceil(split);
            best = best.min((2 * busiest * sms) as f64 / 1e9);
        }
    }
    best
}

/// The fitted costs of the vendor path on one GPU, in microseconds. Fields
/// in the order of the calibration file (`kernels/tuned/sm90.vendor.json`),
/// whose values a build with the guard writes into each plan table that
/// decides per call.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VendorCosts {
    /// The SMs of the GPU measured.
    pub sms: u64,
    /// A cuBLASLt launch, whatever it computes.
    pub launch_us: f64,
    /// One GFLOP of the GEMM's waves: of the tiles and split-K factors
    /// cuBLASLt's sm90 kernels run, the one whose busiest SM does the least,
    /// its multiply-adds times the SMs.
    pub wave_gflop_us: f64,
    /// Each megabyte the GEMM reads or writes once.
    pub memory_us_per_mb: f64,
    /// Each kernel launched besides the GEMM (a norm, an elementwise one).
    pub extra_kernel_us: f64,
    /// Each megabyte those kernels read or write.
    pub extra_memory_us_per_mb: f64,
}

impl VendorCosts {
    /// The costs, in the order [`VendorWork::counts`] gives the counts.
    pub fn as_array(&self) -> [f64; VENDOR_UNKNOWNS] {
        [
            self.launch_us,
            self.wave_gflop_us,
            self.memory_us_per_mb,
            self.extra_kernel_us,
            self.extra_memory_us_per_mb,
        ]
    }

    /// The predicted time of `work` for `m` rows of C's `n` columns over
    /// `k`, in microseconds.
    pub fn predict(&self, work: &VendorWork, m: u64, n: u64, k: u64) -> f64 {
        self.as_array()
            .iter()
            .zip(work.counts(m, n, k, self.sms))
            .map(|(cost, count)| cost * count)
            .sum()
    }
}

/// The two models a verdict weighs.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GuardCosts {
    /// The fused kernel's ([`crate::gemm_model`]).
    pub fused: Costs,
    /// The vendor path's.
    pub vendor: VendorCosts,
}

/// A bucket's two predicted times, in microseconds: each the geometric
/// mean over the bucket's [`MBucket::weighed_ms`], as the tile choice
/// weighs a bucket.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketTimes {
    /// The fused kernel's; `None` where the decode kernel runs one of the
    /// Ms, which the model does not cover.
    pub fused_us: Option<f64>,
    /// The vendor path's.
    pub vendor_us: f64,
}

impl BucketTimes {
    /// Whether the bucket runs the vendor path ([`vendor_wins`]).
    pub fn vendor(&self) -> bool {
        vendor_wins(self.fused_us, self.vendor_us)
    }
}

impl GuardCosts {
    /// The times of `bucket` for a GEMM whose vendor path is `work`, with
    /// C's `n` columns over `k`, whose fused epilogue reads an [M, N] source
    /// tile where `source_tile`, and whose fused kernel runs `tile_at(m)`
    /// for a call of `m` rows (`None`: the decode kernel).
    pub fn bucket_times(
        &self,
        work: &VendorWork,
        source_tile: bool,
        bucket: MBucket,
        (n, k): (u64, u64),
        mut tile_at: impl FnMut(u64) -> Option<TileShape>,
    ) -> BucketTimes {
        let gemm_n = if work.gated { n.saturating_mul(2) } else { n };
        let ms = bucket.weighed_ms();
        let fused: Option<Vec<f64>> = ms
            .iter()
            .map(|&m| {
                let tile = tile_at(m)?;
                Some(
                    self.fused
                        .predict(tile, GemmShape { m, n: gemm_n, k }, source_tile),
                )
            })
            .collect();
        let vendor: Vec<f64> = ms.iter().map(|&m| self.vendor.predict(work, m, n, k)).collect();
        BucketTimes {
            fused_us: fused.as_deref().map(geometric_mean),
            vendor_us: geometric_mean(&vendor),
        }
    }

    /// Whether `bucket` of a unit `unit`, whose vendor path is `work`, runs
    /// the vendor path at C's `n` columns over `k`, its fused kernel running
    /// the tile [`UnitTiers::tile_run`] says (`tiers_by`: the model's costs
    /// where the plan names its tier per call). The run time's verdict per
    /// call, where the build could not decide.
    pub fn vendor_in(
        &self,
        work: &VendorWork,
        unit: &UnitTiers,
        tiers_by: Option<&Costs>,
        bucket: MBucket,
        (n, k): (u64, u64),
    ) -> bool {
        self.bucket_times(work, unit.source_tile, bucket, (n, k), |m| {
            unit.tile_run(tiers_by, m, n, k)
        })
        .vendor()
    }
}

/// The geometric mean of `values`.
pub fn geometric_mean(values: &[f64]) -> f64 {
    (values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp()
}
