//! The guard: for each M bucket of a GEMM, whether the fused kernel or the
//! unfused vendor path (fusion's norm kernel where the GEMM has a norm
//! prologue, then cuBLASLt with its epilogue) runs, so that a fusion never
//! runs where it is predicted to lose.
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
//! Where N and K are static the build decides each bucket ([`route`]);
//! where N or K is dynamic it writes what the verdict needs into the plan
//! table ([`call_route`]: the two models' costs, what the vendor path runs,
//! the unit's tiers) and the run time decides per call with the same code
//! ([`crate::guard_model::GuardCosts::vendor_in`]).
//!
//! The guard is a build option (`FUSION_GUARD`, [`GUARD_ENV`]), off unless
//! it is asked for.
//!
//! Not here: the verdict's arithmetic and the vendor model's formula
//! ([`crate::guard_model`], which the run time shares), running the vendor
//! path (the run time's `fusion::vendor`) and rendering the plan table's
//! routes (codegen).

use super::model::{self, Calibration, Provenance, SM90_SMS, TileShape, UnitTiers};
use super::{Arch, CacheKey, KernelConfig, KernelKind, MBucket, TierChoice, TunedCache};
use crate::fuse::{EpilogueStep, GemmComposition, NormKind};
pub use crate::guard_model::{GuardCosts, MARGIN, VENDOR_UNKNOWNS, VendorCosts, VendorWork};
use crate::ir::{Activation, DType};
use serde::{Deserialize, Serialize};
use std::fmt;

/// The environment variable that turns the guard on for a build: `on`
/// routes the buckets where the fused kernel is predicted to lose to the
/// vendor path; unset, empty or `off` leaves every bucket fused.
pub const GUARD_ENV: &str = "FUSION_GUARD";

/// Whether `value`, `FUSION_GUARD`'s, turns the guard on; the error names
/// the values it takes.
pub fn parse_guard(value: Option<&str>) -> Result<bool, String> {
    match value {
        Some("on") => Ok(true),
        None | Some("" | "off") => Ok(false),
        Some(other) => Err(format!(
            "{GUARD_ENV}={other:?}: it takes `on` (M buckets where a fused GEMM is predicted to lose run cuBLASLt instead, after a norm kernel where the GEMM has a norm prologue) or `off` (the default)"
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
    /// The norm whose standalone kernel runs before the GEMM, if any.
    pub norm: Option<NormKind>,
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
            norm: gemm.prologue.map(|p| p.kind),
            gated,
        }
    }

    /// What it runs, as the vendor model counts it.
    pub fn work(&self) -> VendorWork {
        let tiles = self.remainder.iter().filter(|s| s.reads_tile()).count();
        VendorWork {
            norm: self.norm.is_some(),
            gated: self.gated,
            beta_residual: self.beta_residual,
            elementwise_tiles: (self.gated || !self.remainder.is_empty())
                .then(|| u32::try_from(tiles).unwrap_or(u32::MAX)),
        }
    }

    /// Why the run time cannot take this path yet, if it cannot: it runs
    /// cuBLASLt, after fusion's norm kernel where the GEMM has a norm
    /// prologue, so a gated pair or an elementwise kernel after it keeps the
    /// fused kernel.
    pub fn unsupported(&self) -> Option<String> {
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

/// The fitted costs of the vendor path on one GPU ([`VendorCosts`]) with
/// where they come from: `kernels/tuned/sm90.vendor.json` is the shipped
/// one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VendorCalibration {
    /// What the model is, for a reader of the file.
    pub note: String,
    /// The measurements.
    pub provenance: Provenance,
    /// The costs, and the SMs of the GPU measured.
    #[serde(flatten)]
    pub costs: VendorCosts,
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

    /// The predicted time of `path` for `m` rows of C's `n` columns over
    /// `k`, in microseconds ([`VendorCosts::predict`]).
    pub fn predict(&self, path: &VendorPath, m: u64, n: u64, k: u64) -> f64 {
        self.costs.predict(&path.work(), m, n, k)
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
        .map(|s| (s.path.work().counts(s.m, s.n, s.k, sms), s.us))
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
        costs: VendorCosts {
            sms,
            launch_us: x[0],
            wave_gflop_us: x[1],
            memory_us_per_mb: x[2],
            extra_kernel_us: x[3],
            extra_memory_us_per_mb: x[4],
        },
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
    /// where the fused kernel is slower by more than [`MARGIN`]
    /// ([`crate::guard_model::vendor_wins`]).
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
            vendor: crate::guard_model::vendor_wins(fused_us, vendor_us),
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
    /// N or K is dynamic, so the build does not know the problem: the run
    /// time decides per call ([`call_route`]).
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
            Unguarded::Dynamic => f.write_str(
                "decided per call (N or K is dynamic): the run time weighs the two models at each call's (M, N, K)",
            ),
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

    /// The two models' costs, as the run time weighs them per call.
    pub fn costs(&self) -> GuardCosts {
        GuardCosts {
            fused: self.fused.costs,
            vendor: self.vendor.costs,
        }
    }

    /// The verdict on every M bucket of the GEMM `gemm` in `dtype` on
    /// `arch`, with C's static `n` columns over static `k` (`None`:
    /// dynamic, as [`crate::fuse::FusedKernel::static_n_and_k`] says), rendered with
    /// `config`, whose launcher runs a tile per M by `rule`
    /// ([`super::tier_choice`]); entries of `cache` for the kernel's
    /// buckets that timed both sides override the models.
    #[allow(clippy::too_many_arguments)]
    pub fn verdicts(
        &self,
        cache: &TunedCache,
        arch: Arch,
        gemm: &GemmComposition,
        dtype: DType,
        (n, k): (Option<u64>, Option<u64>),
        config: &KernelConfig,
        rule: TierChoice,
    ) -> Result<Vec<BucketVerdict>, Unguarded> {
        let (n, k) = static_and_served(arch, gemm, dtype, (n, k))?;
        let path = VendorPath::of(gemm);
        let kind = KernelKind::of(gemm, dtype);
        let gemm_n = if kind.gated { 2 * n } else { n };
        let decode = config.decode_for(kind.layout).is_some();
        let (costs, work) = (self.costs(), path.work());
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
                let times = costs.bucket_times(&work, kind.source_tile, bucket, (n, k), |m| {
                    config
                        .launched_tile(m, gemm_n, k, SM90_SMS, decode, rule)
                        .map(|tile| TileShape::of(&tile))
                });
                BucketVerdict::decide(bucket, times.fused_us, times.vendor_us, Evidence::Model)
            })
            .collect();
        Ok(verdicts)
    }
}

/// The static N and K of the GEMM `gemm` in `dtype` on `arch` where the
/// guard serves it (sm90, f16 or bf16, a vendor path cuBLASLt computes),
/// else why not: [`Unguarded::Dynamic`] when it would but N or K is
/// dynamic.
fn static_and_served(
    arch: Arch,
    gemm: &GemmComposition,
    dtype: DType,
    (n, k): (Option<u64>, Option<u64>),
) -> Result<(u64, u64), Unguarded> {
    if arch != Arch::Sm90 {
        return Err(Unguarded::Arch(arch));
    }
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return Err(Unguarded::DType(dtype));
    }
    if let Some(reason) = VendorPath::of(gemm).unsupported() {
        return Err(Unguarded::Path(reason));
    }
    match (n, k) {
        (Some(n), Some(k)) => Ok((n, k)),
        _ => Err(Unguarded::Dynamic),
    }
}

/// The M ranges of the buckets that run the vendor path, neighbours merged:
/// `(smallest M, largest M)`, `None` for every M above.
pub fn vendor_ranges(verdicts: &[BucketVerdict]) -> Vec<(u32, Option<u32>)> {
    let buckets: Vec<MBucket> = verdicts.iter().filter(|v| v.vendor).map(|v| v.bucket).collect();
    bucket_ranges(&buckets)
}

/// What the path runs: cuBLASLt's name for its epilogue, as `fusion bench`
/// names its baselines (`cuBLASLt GELU_BIAS + beta·C`), after the norm
/// kernel where there is one (`rmsnorm kernel + cuBLASLt BIAS`).
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
    let norm = path
        .norm
        .map(|kind| format!("{} kernel + ", kind.name()))
        .unwrap_or_default();
    format!("{norm}cuBLASLt{epilogue}{beta}")
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
        let rule = super::tier_choice(arch, selected.tuned_for.is_some());
        match guard.verdicts(cache, arch, gemm, dtype, (n, k), &selected.config, rule) {
            Err(Unguarded::Dynamic) => {
                let _ = writeln!(
                    out,
                    "{} where the fused kernel is predicted more than {:.0}% slower, {}",
                    vendor_name(&VendorPath::of(gemm)),
                    MARGIN * 100.0,
                    Unguarded::Dynamic
                );
            }
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
/// `config` (whose launcher chooses its tiles by `rule`), that run the
/// vendor path, and cuBLASLt's epilogue there:
/// `None` where the cache carries no guard ([`TunedCache::guard`]), the
/// kernel is not a GEMM the guard serves, or every bucket stays fused.
pub fn route(
    cache: &TunedCache,
    arch: Arch,
    kernel: &crate::fuse::FusedKernel,
    graph: &crate::ir::Graph,
    dtype: DType,
    config: &KernelConfig,
    rule: TierChoice,
) -> Option<Route> {
    let guard = cache.guard.as_ref()?;
    let crate::fuse::Composition::Gemm(gemm) = &kernel.composition else {
        return None;
    };
    let verdicts = guard
        .verdicts(
            cache,
            arch,
            gemm,
            dtype,
            kernel.static_n_and_k(graph),
            config,
            rule,
        )
        .ok()?;
    let buckets: Vec<MBucket> = verdicts.iter().filter(|v| v.vendor).map(|v| v.bucket).collect();
    (!buckets.is_empty()).then(|| Route {
        arch,
        buckets,
        epilogue: VendorPath::of(gemm).epilogue,
    })
}

/// What the run time weighs per call for a kernel whose N or K is dynamic,
/// besides the two models' costs ([`Guard::costs`]) and the unit's tiers.
#[derive(Clone, Debug, PartialEq)]
pub struct CallRoute {
    /// The generation the models describe.
    pub arch: Arch,
    /// cuBLASLt's epilogue.
    pub epilogue: VendorEpilogue,
    /// What the vendor path runs, as its model counts it.
    pub work: VendorWork,
}

/// Where the build leaves the verdict on `kernel`'s GEMM in `dtype` on
/// `arch`, rendered with `config`, to the call: its N or K is dynamic, and
/// the guard would serve it otherwise. The route and the unit's tiers
/// ([`KernelConfig::unit_tiers`]), which the run time weighs per call with
/// [`crate::guard_model::GuardCosts::vendor_in`]; `None` where the cache
/// carries no guard, the guard does not serve the kernel ([`Unguarded`]),
/// or its N and K are static (the build decides: [`route`]).
pub fn call_route(
    cache: &TunedCache,
    arch: Arch,
    kernel: &crate::fuse::FusedKernel,
    graph: &crate::ir::Graph,
    dtype: DType,
    config: &KernelConfig,
) -> Option<(CallRoute, UnitTiers)> {
    cache.guard.as_ref()?;
    let crate::fuse::Composition::Gemm(gemm) = &kernel.composition else {
        return None;
    };
    let served = static_and_served(arch, gemm, dtype, kernel.static_n_and_k(graph));
    if !matches!(served, Err(Unguarded::Dynamic)) {
        return None;
    }
    let path = VendorPath::of(gemm);
    let route = CallRoute {
        arch,
        epilogue: path.epilogue,
        work: path.work(),
    };
    Some((route, config.unit_tiers(&KernelKind::of(gemm, dtype))))
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
