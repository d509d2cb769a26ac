//! The guard: for each M bucket of a GEMM whose N and K are static, whether
//! the fused kernel or the unfused vendor path (cuBLASLt with its epilogue,
//! then fusion's elementwise kernels for what cuBLASLt lacks) runs, so that
//! a fusion never runs where it is predicted to lose.
//!
//! Both sides are predicted by models fitted to measurements checked into
//! the repository: the fused kernel's time by [`super::model`], the vendor
//! path's by [`VendorCalibration`], fitted the same way to the cuBLASLt
//! times of the same bench rows. A tuned cache entry that measured both for
//! a bucket ([`super::CacheEntry::time_us`] and [`super::CacheEntry::cublaslt_time_us`])
//! overrides the models there. The vendor path is taken only where the
//! fused kernel is predicted slower by more than [`MARGIN`]: the models err
//! by several percent, and a call that leaves the fused kernel pays a
//! second launch or more.
//!
//! The guard is a build option (`FUSION_GUARD`, [`GUARD_ENV`]), off unless
//! it is asked for.
//!
//! Not here: running the vendor path (the run time's `fusion::vendor`) and
//! rendering the plan table's routes (codegen).

use super::model::{self, Calibration, GemmShape, Provenance, SM90_SMS, TileShape};
use super::{Arch, CacheKey, KernelConfig, KernelKind, MBucket, TunedCache};
use crate::fuse::{EpilogueStep, GemmComposition};
use crate::ir::{Activation, DType};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The environment variable that turns the guard on for a build: `on`
/// routes the buckets where the fused kernel is predicted to lose to the
/// vendor path; unset, empty or `off` leaves every bucket fused.
pub const GUARD_ENV: &str = "FUSION_GUARD";

/// How much slower the fused kernel must be predicted (or measured) than
/// the vendor path before a bucket leaves it: 3%.
pub const MARGIN: f64 = 0.03;

/// Whether `value`, `FUSION_GUARD`'s, turns the guard on; the error names
/// the values it takes.
pub fn parse_guard(value: Option<&str>) -> Result<bool, String> {
    match value {
        Some("on") => Ok(true),
        None | Some("" | "off") => Ok(false),
        Some(other) => Err(format!(
            "{GUARD_ENV}={other:?}: it takes `on` (M buckets where a fused GEMM is predicted to lose run cuBLASLt and an elementwise kernel instead) or `off` (the default)"
        )),
    }
}

/// [`parse_guard`] of the environment's `FUSION_GUARD`.
pub fn guard_from_env() -> Result<bool, String> {
    match std::env::var(GUARD_ENV) {
        Ok(value) => parse_guard(Some(&value)),
        Err(std::env::VarError::NotPresent) => parse_guard(None),
        Err(std::env::VarError::NotUnicode(value)) => Err(format!(
            "{GUARD_ENV}={value:?} is not Unicode: it takes `on` or `off`"
        )),
    }
}

/// cuBLASLt's fused epilogue that the vendor path asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum VendorEpilogue {
    /// None (`CUBLASLT_EPILOGUE_DEFAULT`).
    None,
    /// `CUBLASLT_EPILOGUE_BIAS`.
    Bias,
    /// `CUBLASLT_EPILOGUE_RELU`.
    Relu,
    /// `CUBLASLT_EPILOGUE_RELU_BIAS`.
    ReluBias,
    /// `CUBLASLT_EPILOGUE_GELU` (the tanh approximation, fusion's `gelu`).
    Gelu,
    /// `CUBLASLT_EPILOGUE_GELU_BIAS`.
    GeluBias,
}

impl VendorEpilogue {
    /// Its name in the run time's plan tables (`fusion::plan::VendorEpilogue`).
    pub fn name(self) -> &'static str {
        match self {
            VendorEpilogue::None => "None",
            VendorEpilogue::Bias => "Bias",
            VendorEpilogue::Relu => "Relu",
            VendorEpilogue::ReluBias => "ReluBias",
            VendorEpilogue::Gelu => "Gelu",
            VendorEpilogue::GeluBias => "GeluBias",
        }
    }
}

/// The unfused path of a GEMM composition, as `fusion bench` measures its
/// baseline: a norm kernel first where there is a prologue; one cuBLASLt
/// GEMM (over gate and up stacked, for a gated pair) with the epilogue
/// steps cuBLASLt fuses; then one elementwise kernel for the rest (the
/// gate's act·mul and the steps after it).
#[derive(Clone, Debug, PartialEq)]
pub struct VendorPath {
    /// cuBLASLt's epilogue.
    pub epilogue: VendorEpilogue,
    /// The residual added by cuBLASLt's `beta·C` term (beta = 1).
    pub beta_residual: bool,
    /// The steps left for an elementwise kernel after the GEMM.
    pub remainder: Vec<EpilogueStep>,
    /// A norm kernel runs before the GEMM.
    pub norm: bool,
    /// The GEMM computes gate and up stacked: twice C's columns.
    pub gated: bool,
}

impl VendorPath {
    /// The unfused path of `gemm`: cuBLASLt takes a bias, a residual
    /// (bias and residual in either order) or one ReLU or GELU after the
    /// bias, and the first step it cannot take starts the remainder.
    pub fn of(gemm: &GemmComposition) -> VendorPath {
        let (mut bias, mut residual, mut activation) = (false, false, None);
        let mut remainder = Vec::new();
        let gated = gemm.gate.is_some();
        for (i, step) in gemm.epilogue.iter().enumerate() {
            let taken = !gated
                && remainder.is_empty()
                && activation.is_none()
                && match step {
                    EpilogueStep::Bias if !bias => {
                        bias = true;
                        true
                    }
                    EpilogueStep::Residual if !residual => {
                        residual = true;
                        true
                    }
                    // An activation of a sum with the residual would rest
                    // on where cuBLASLt adds beta·C, which no run has
                    // checked: it goes to the remainder.
                    EpilogueStep::Activation(act) if lt_activation(*act) && !residual => {
                        activation = Some(*act);
                        true
                    }
                    _ => false,
                };
            if !taken {
                remainder = gemm.epilogue[i..].to_vec();
                break;
            }
        }
        let epilogue = match (bias, activation.map(Activation::name)) {
            (false, None) => VendorEpilogue::None,
            (true, None) => VendorEpilogue::Bias,
            (false, Some("relu")) => VendorEpilogue::Relu,
            (true, Some("relu")) => VendorEpilogue::ReluBias,
            (false, _) => VendorEpilogue::Gelu,
            (true, _) => VendorEpilogue::GeluBias,
        };
        VendorPath {
            epilogue,
            beta_residual: residual,
            remainder,
            norm: gemm.prologue.is_some(),
            gated,
        }
    }

    /// Kernels it launches besides the GEMM.
    fn extra_kernels(&self) -> u64 {
        u64::from(self.norm) + u64::from(self.gated || !self.remainder.is_empty())
    }

    /// Megabytes the kernels besides the GEMM read and write, and the
    /// bytes of A, B and C (C twice with a residual through beta) the GEMM
    /// moves, for `m` rows of C's `n` columns over `k` (2-byte elements).
    fn megabytes(&self, m: u64, n: u64, k: u64) -> (f64, f64) {
        let (m, n, k) = (m as f64, n as f64, k as f64);
        let gemm_n = if self.gated { 2.0 * n } else { n };
        let c_passes = if self.beta_residual { 2.0 } else { 1.0 };
        let gemm = (m * k + gemm_n * k + c_passes * m * gemm_n) * 2.0 / 1e6;
        let tiles = self.remainder.iter().filter(|s| s.reads_tile()).count() as f64;
        let elementwise = if self.gated {
            // Gate and up read, the product written, each tile operand read.
            3.0 + tiles
        } else if self.remainder.is_empty() {
            0.0
        } else {
            2.0 + tiles
        };
        let norm = if self.norm { 2.0 * m * k } else { 0.0 };
        (gemm, (elementwise * m * n + norm) * 2.0 / 1e6)
    }

    /// Why the run time cannot take this path yet, if it cannot: it runs
    /// cuBLASLt alone, so a norm before it or an elementwise kernel after it
    /// keeps the fused kernel.
    pub fn unsupported(&self) -> Option<String> {
        if self.norm {
            return Some("a norm prologue: the vendor path would need a norm kernel first, which the guard does not run yet".into());
        }
        if self.gated {
            return Some("a gated pair: the vendor path would need a stacked GEMM and an act·mul kernel, which the guard does not run yet".into());
        }
        if !self.remainder.is_empty() {
            let steps: Vec<&str> = self.remainder.iter().map(|s| s.name()).collect();
            return Some(format!(
                "cuBLASLt has no epilogue for {}: the vendor path would need an elementwise kernel after it, which the guard does not run yet",
                steps.join(" then ")
            ));
        }
        None
    }
}

/// The activations cuBLASLt fuses: ReLU and GELU's tanh form.
fn lt_activation(act: Activation) -> bool {
    matches!(act.name(), "relu" | "gelu")
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

/// The fitted costs of the vendor path on one GPU, in microseconds:
/// `kernels/tuned/sm90.vendor.json` is the shipped one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VendorCalibration {
    /// What the model is, for a reader of the file.
    pub note: String,
    /// The measurements.
    pub provenance: Provenance,
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

/// The costs a vendor calibration fits.
const VENDOR_UNKNOWNS: usize = 5;

/// The vendor model's counts for one call, each the multiplier of one cost
/// of [`VendorCalibration::costs`]: `n` is C's columns.
fn vendor_features(path: &VendorPath, m: u64, n: u64, k: u64, sms: u64) -> [f64; VENDOR_UNKNOWNS] {
    let gemm_n = if path.gated { 2 * n } else { n };
    let (gemm_mb, extra_mb) = path.megabytes(m, n, k);
    [
        1.0,
        lt_wave_gflop(GemmShape { m, n: gemm_n, k }, sms),
        gemm_mb,
        path.extra_kernels() as f64,
        extra_mb,
    ]
}

/// A vendor path's time on a shape, as a bench row measured it.
#[derive(Clone, Debug, PartialEq)]
pub struct VendorSample {
    /// The path.
    pub path: VendorPath,
    /// Rows of C.
    pub m: u64,
    /// Columns of C.
    pub n: u64,
    /// The reduction depth.
    pub k: u64,
    /// The measured median, in microseconds.
    pub us: f64,
}

impl VendorCalibration {
    /// The shipped calibration of cuBLASLt on sm90.
    pub fn shipped_sm90() -> VendorCalibration {
        serde_json::from_str(include_str!("../../kernels/tuned/sm90.vendor.json"))
            .expect("kernels/tuned/sm90.vendor.json is a vendor calibration")
    }

    fn costs(&self) -> [f64; VENDOR_UNKNOWNS] {
        [
            self.launch_us,
            self.wave_gflop_us,
            self.memory_us_per_mb,
            self.extra_kernel_us,
            self.extra_memory_us_per_mb,
        ]
    }

    /// The predicted time of `path` for `m` rows of C's `n` columns over
    /// `k`, in microseconds.
    pub fn predict(&self, path: &VendorPath, m: u64, n: u64, k: u64) -> f64 {
        self.costs()
            .iter()
            .zip(vendor_features(path, m, n, k, self.sms))
            .map(|(cost, count)| cost * count)
            .sum()
    }
}

/// The note a fitted vendor calibration carries.
const VENDOR_NOTE: &str = "cuBLASLt's time on the unfused path (its fused epilogue, plus the norm or elementwise kernels around it), fitted by fusion_compiler::select::guard::fit_vendor to the cuBLASLt times of the bench rows of `provenance.files`. Regenerate: FUSION_BLESS=1 cargo test -p fusion-compiler vendor_calibration";

/// Fits the vendor costs to `samples` by least squares on the relative
/// error, as [`model::fit`] fits the fused kernel's.
pub fn fit_vendor(
    samples: &[VendorSample],
    sms: u64,
    provenance: Provenance,
) -> Result<VendorCalibration, model::FitError> {
    let rows: Vec<([f64; VENDOR_UNKNOWNS], f64)> = samples
        .iter()
        .map(|s| (vendor_features(&s.path, s.m, s.n, s.k, sms), s.us))
        .collect();
    let x = model::least_squares(&rows).ok_or_else(|| {
        model::FitError(format!(
            "{} samples do not tell the vendor model's {VENDOR_UNKNOWNS} costs apart: measure more shapes and epilogues",
            samples.len()
        ))
    })?;
    Ok(VendorCalibration {
        note: VENDOR_NOTE.to_owned(),
        provenance,
        sms,
        launch_us: x[0],
        wave_gflop_us: x[1],
        memory_us_per_mb: x[2],
        extra_kernel_us: x[3],
        extra_memory_us_per_mb: x[4],
    })
}

/// Where a bucket's two times come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Evidence {
    /// The two models' predictions.
    Model,
    /// A tuned cache entry that timed both.
    Tuned,
}

/// The guard's verdict on one M bucket of a kernel.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BucketVerdict {
    /// The bucket.
    pub bucket: MBucket,
    /// The fused kernel's time, in microseconds (the geometric mean over the
    /// bucket's smallest, middle and largest M, as the tile choice weighs
    /// it); `None` where the decode kernel runs, which the model does not
    /// cover, and the bucket stays fused.
    pub fused_us: Option<f64>,
    /// The vendor path's, likewise.
    pub vendor_us: f64,
    /// Where both come from.
    pub evidence: Evidence,
    /// Whether the bucket runs the vendor path.
    pub vendor: bool,
}

impl BucketVerdict {
    /// The verdict on times `fused_us` and `vendor_us`: the vendor path
    /// where the fused kernel is slower by more than [`MARGIN`].
    pub fn decide(
        bucket: MBucket,
        fused_us: Option<f64>,
        vendor_us: f64,
        evidence: Evidence,
    ) -> BucketVerdict {
        BucketVerdict {
            bucket,
            fused_us,
            vendor_us,
            evidence,
            vendor: fused_us.is_some_and(|fused| fused > vendor_us * (1.0 + MARGIN)),
        }
    }
}

impl fmt::Display for BucketVerdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let evidence = match self.evidence {
            Evidence::Model => "predicted",
            Evidence::Tuned => "tuned",
        };
        match self.fused_us {
            None => write!(
                f,
                "{}: fused (the decode kernel runs here, which the model does not cover; vendor {evidence} {:.1} us)",
                self.bucket, self.vendor_us
            ),
            Some(fused) => write!(
                f,
                "{}: {} (fused {fused:.1} us, vendor {:.1} us, {evidence}; fused/vendor {:.2})",
                self.bucket,
                if self.vendor { "VENDOR" } else { "fused" },
                self.vendor_us,
                fused / self.vendor_us
            ),
        }
    }
}

/// Why a kernel is not guarded: every bucket runs the fused kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Unguarded {
    /// The models describe the sm90 kernel and cuBLASLt on sm90 alone.
    Arch(Arch),
    /// N or K is dynamic, so the build does not know the problem.
    Dynamic,
    /// The kernels are not f16 or bf16.
    DType(DType),
    /// The run time cannot run its vendor path (the reason).
    Path(String),
}

impl fmt::Display for Unguarded {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unguarded::Arch(arch) => write!(f, "not guarded on {arch}: the models cover sm90"),
            Unguarded::Dynamic => f.write_str("not guarded: N or K is dynamic"),
            Unguarded::DType(dtype) => write!(f, "not guarded: cuBLASLt is not asked for {dtype}"),
            Unguarded::Path(reason) => write!(f, "not guarded: {reason}"),
        }
    }
}

/// The models the guard weighs (a tuned cache's entries override them).
#[derive(Clone, Debug, PartialEq)]
pub struct Guard {
    /// The fused kernel's model.
    pub fused: Calibration,
    /// The vendor path's model.
    pub vendor: VendorCalibration,
}

impl Guard {
    /// The shipped models.
    pub fn shipped_sm90() -> Guard {
        Guard {
            fused: Calibration::shipped_sm90(),
            vendor: VendorCalibration::shipped_sm90(),
        }
    }

    /// The verdict on every M bucket of the GEMM `gemm` in `dtype` on
    /// `arch`, with C's static `n` columns over static `k` (`None`:
    /// dynamic, as [`crate::fuse::FusedKernel::static_n_and_k`] says), rendered with
    /// `config` (the tiles its launcher runs per M); entries of `cache`
    /// for the kernel's buckets that timed both sides override the models.
    pub fn verdicts(
        &self,
        cache: &TunedCache,
        arch: Arch,
        gemm: &GemmComposition,
        dtype: DType,
        (n, k): (Option<u64>, Option<u64>),
        config: &KernelConfig,
    ) -> Result<Vec<BucketVerdict>, Unguarded> {
        if arch != Arch::Sm90 {
            return Err(Unguarded::Arch(arch));
        }
        if !matches!(dtype, DType::F16 | DType::BF16) {
            return Err(Unguarded::DType(dtype));
        }
        let (Some(n), Some(k)) = (n, k) else {
            return Err(Unguarded::Dynamic);
        };
        let path = VendorPath::of(gemm);
        if let Some(reason) = path.unsupported() {
            return Err(Unguarded::Path(reason));
        }
        let kind = KernelKind::of(gemm, dtype);
        let gemm_n = if kind.gated { 2 * n } else { n };
        let decode = config.decode_for(kind.layout).is_some();
        let verdicts = MBucket::all()
            .map(|bucket| {
                let key = CacheKey {
                    composition: kind.name.clone(),
                    dtype,
                    layout: kind.layout,
                    n,
                    k,
                    arch,
                    bucket,
                };
                if let Some(entry) = cache.entries.get(&key) {
                    return BucketVerdict::decide(
                        bucket,
                        Some(entry.time_us),
                        entry.cublaslt_time_us,
                        Evidence::Tuned,
                    );
                }
                let ms = bucket.weighed_ms();
                let fused: Option<Vec<f64>> = ms
                    .iter()
                    .map(|&m| {
                        let tile = config.launched_tile(m, gemm_n, SM90_SMS, decode)?;
                        Some(self.fused.predict(
                            TileShape::of(&tile),
                            GemmShape { m, n: gemm_n, k },
                            kind.source_tile,
                        ))
                    })
                    .collect();
                let vendor: Vec<f64> = ms.iter().map(|&m| self.vendor.predict(&path, m, n, k)).collect();
                BucketVerdict::decide(
                    bucket,
                    fused.as_deref().map(geometric_mean),
                    geometric_mean(&vendor),
                    Evidence::Model,
                )
            })
            .collect();
        Ok(verdicts)
    }
}

fn geometric_mean(values: &[f64]) -> f64 {
    (values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp()
}

/// The M ranges of the buckets that run the vendor path, neighbours merged:
/// `(smallest M, largest M)`, `None` for every M above.
pub fn vendor_ranges(verdicts: &[BucketVerdict]) -> Vec<(u32, Option<u32>)> {
    let buckets: Vec<MBucket> = verdicts.iter().filter(|v| v.vendor).map(|v| v.bucket).collect();
    bucket_ranges(&buckets)
}

/// cuBLASLt's name for the path's epilogue, as `fusion bench` names its
/// baselines: `cuBLASLt GELU_BIAS + beta·C`.
pub fn vendor_name(path: &VendorPath) -> String {
    let epilogue = match path.epilogue {
        VendorEpilogue::None => "",
        VendorEpilogue::Bias => " BIAS",
        VendorEpilogue::Relu => " RELU",
        VendorEpilogue::ReluBias => " RELU_BIAS",
        VendorEpilogue::Gelu => " GELU",
        VendorEpilogue::GeluBias => " GELU_BIAS",
    };
    let beta = if path.beta_residual { " + beta·C" } else { "" };
    format!("cuBLASLt{epilogue}{beta}")
}

/// What the guard decides for every GEMM kernel of `plan` on sm90, as a
/// build with `FUSION_GUARD=on` and `cache` (its tuned entries, its model
/// when `FUSION_SELECT=model`) decides it: per kernel, the M ranges that
/// run the vendor path and each bucket's two times, or why the kernel is
/// not guarded. `fusion plan` prints it.
pub fn report(
    plan: &crate::fuse::Plan,
    guard: &Guard,
    cache: &TunedCache,
) -> Result<String, super::SelectError> {
    use crate::fuse::Composition;
    use std::fmt::Write;
    let arch = Arch::Sm90;
    let table = super::TunedTable::shipped(arch)?;
    let mut out = format!(
        "guard on {arch}: an M bucket runs the vendor path where the fused kernel is more than {:.0}% slower, \
         as {} and {} predict or a tuned entry that timed both measured\n",
        MARGIN * 100.0,
        model::SM90_CALIBRATION_FILE,
        SM90_VENDOR_FILE,
    );
    for (index, kernel) in plan.kernels.iter().enumerate() {
        let Composition::Gemm(gemm) = &kernel.composition else {
            continue;
        };
        let graph = &plan.graph;
        let dtype = graph.tensor(kernel.output).dtype;
        let (n, k) = kernel.static_n_and_k(graph);
        let kind = KernelKind::of(gemm, dtype);
        let selected = super::select_tuned(&table, cache, arch, &kind, n, k)?;
        let shape = match (n, k) {
            (Some(n), Some(k)) => format!(", N={n} K={k}"),
            _ => String::new(),
        };
        let _ = write!(out, "kernel #{index} ({}, {dtype}{shape}): ", kind.name);
        match guard.verdicts(cache, arch, gemm, dtype, (n, k), &selected.config) {
            Err(why) => {
                let _ = writeln!(out, "{why}");
            }
            Ok(verdicts) => {
                let ranges = vendor_ranges(&verdicts);
                if ranges.is_empty() {
                    let _ = writeln!(out, "fused for every M");
                } else {
                    let ranges: Vec<String> = ranges
                        .iter()
                        .map(|&(low, high)| match high {
                            Some(high) => format!("{low}-{high}"),
                            None => format!("{low} and more"),
                        })
                        .collect();
                    let _ = writeln!(
                        out,
                        "{} for M {}",
                        vendor_name(&VendorPath::of(gemm)),
                        ranges.join(", ")
                    );
                }
                for verdict in &verdicts {
                    let _ = writeln!(out, "  {verdict}");
                }
            }
        }
    }
    Ok(out)
}

/// Where a kernel runs the vendor path: the plan table's route.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Route {
    /// The generation the verdicts were made for.
    pub arch: Arch,
    /// The M buckets, ascending.
    pub buckets: Vec<MBucket>,
    /// cuBLASLt's epilogue.
    pub epilogue: VendorEpilogue,
}

impl Route {
    /// The route of both `self` and `other` (two dtypes' verdicts on one
    /// kernel): the buckets both send to the vendor path.
    pub fn both(self, other: &Route) -> Route {
        Route {
            buckets: self
                .buckets
                .into_iter()
                .filter(|b| other.buckets.contains(b))
                .collect(),
            ..self
        }
    }
}

/// The M buckets of `kernel`'s GEMM in `dtype` on `arch`, rendered with
/// `config`, that run the vendor path, and cuBLASLt's epilogue there:
/// `None` where the cache carries no guard ([`TunedCache::guard`]), the
/// kernel is not a GEMM the guard serves, or every bucket stays fused.
pub fn route(
    cache: &TunedCache,
    arch: Arch,
    kernel: &crate::fuse::FusedKernel,
    graph: &crate::ir::Graph,
    dtype: DType,
    config: &KernelConfig,
) -> Option<Route> {
    let guard = cache.guard.as_ref()?;
    let crate::fuse::Composition::Gemm(gemm) = &kernel.composition else {
        return None;
    };
    let verdicts = guard
        .verdicts(cache, arch, gemm, dtype, kernel.static_n_and_k(graph), config)
        .ok()?;
    let buckets: Vec<MBucket> = verdicts.iter().filter(|v| v.vendor).map(|v| v.bucket).collect();
    (!buckets.is_empty()).then(|| Route {
        arch,
        buckets,
        epilogue: VendorPath::of(gemm).epilogue,
    })
}

/// `buckets` (ascending) as M ranges, neighbours merged: `(smallest M,
/// largest M)`, `None` for every M above.
pub fn bucket_ranges(buckets: &[MBucket]) -> Vec<(u32, Option<u32>)> {
    let mut ranges: Vec<(u32, Option<u32>)> = Vec::new();
    for bucket in buckets {
        let (low, high) = (bucket.min_m(), bucket.max_m());
        match ranges.last_mut() {
            Some((_, last_high)) if last_high.is_some_and(|h| h + 1 == low) => *last_high = high,
            _ => ranges.push((low, high)),
        }
    }
    ranges
}

/// The shipped vendor calibration's file.
pub const SM90_VENDOR_FILE: &str = "kernels/tuned/sm90.vendor.json";

#[cfg(test)]
mod tests;
