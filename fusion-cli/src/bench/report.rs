//! What a `fusion bench` run reports: one [`Row`] per kernel and shape, the
//! run's circumstances ([`Report`], the `--json` file), and the text table.
//!
//! The JSON keeps the fields of the first recorded runs
//! (`benchmarks/*.json`) under their names and adds the newer ones after
//! them, so that a program written for the old files reads the new.

use super::floor::{CopyBandwidth, Floor};
use super::smi::{self, ClockSummary};
use super::timing::{Timing, TimingPlan};
use super::vendor::{self, GemmChoice};
use fusion::ir::DType;
use serde::{Deserialize, Serialize};

/// One line of the table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Row {
    /// The kernel timed, as `--kernel` names it (`gemm_bias_gelu`,
    /// `swiglu_ffn`, `rmsnorm`, …).
    pub kernel: String,
    /// `M,N,K` for a GEMM row, `M=… D=… F=…` for an FFN row, `M,K` for a
    /// norm row.
    pub shape: String,
    /// The element type, `f16` or `bf16`.
    pub dtype: String,
    /// What ours is timed against, as the table labels it: the cuBLASLt
    /// epilogue and the unfused steps around it (a device copy for a norm
    /// row).
    pub baseline: String,
    /// The median of ours, in µs.
    pub ours_us: f64,
    /// The median of the baseline with cuBLASLt's first algorithm, in µs.
    pub baseline_us: f64,
    /// Baseline (first algorithm) time over ours: above 1, fusion is faster.
    pub ratio: f64,
    /// Ours in TFLOP/s at its median (0 for a norm row, counted as no
    /// FLOPs).
    pub ours_tflops: f64,
    /// The baseline with cuBLASLt's first algorithm in TFLOP/s at its
    /// median.
    pub baseline_tflops: f64,
    /// ‖ours − baseline‖ / ‖baseline‖ on the same inputs.
    pub agreement: f64,
    /// The median of the baseline with the best of cuBLASLt's top
    /// candidates, in µs.
    pub best_us: f64,
    /// The best baseline's median over ours: above 1, fusion is faster.
    pub best_ratio: f64,
    /// The best baseline in TFLOP/s at its median.
    pub best_tflops: f64,
    /// Every statistic of ours' timed calls.
    pub ours_timing: Timing,
    /// Every statistic of the timed calls of the baseline with cuBLASLt's
    /// first algorithm.
    pub baseline_timing: Timing,
    /// Every statistic of the best baseline's timed calls.
    pub best_timing: Timing,
    /// The algorithms of each cuBLASLt GEMM of the baseline.
    pub algorithms: Vec<GemmChoice>,
    /// The SM clock sampled while the row was measured; none where it was
    /// not sampled or no sample fell within the row.
    pub sm_clock: Option<ClockSummary>,
    /// With `--streams N`: ours and the baseline on N streams at once
    /// against one at a time (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrency: Option<Concurrency>,
    /// With `--host`: the host's time per call of ours against that of
    /// `cublasLtMatmul` (absent otherwise).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<HostCost>,
    /// The row's bytes at the run's copy bandwidth, and ours against that
    /// (`bench::floor`); absent in the files of earlier runs.
    #[serde(default)]
    pub floor: Option<Floor>,
}

/// A row's contenders with several streams in flight (`bench::streams`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Concurrency {
    /// Streams in flight, each with its own host thread, buffers and
    /// workspace.
    pub streams: usize,
    /// Calls per stream in each measurement.
    pub calls: usize,
    /// Measurements, which the medians are over.
    pub rounds: usize,
    /// Fusion's call (ours).
    pub ours: Slowdown,
    /// The baseline with cuBLASLt's first algorithm.
    pub baseline: Slowdown,
    /// Measurements in which the device reached the calls before the host
    /// had queued them all (their time includes launch overhead).
    pub late: usize,
}

/// A row's host cost per call (`bench::host`): wall-clock time on the
/// calling thread, with the device kept busy, in µs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct HostCost {
    /// Calls of ours per measurement.
    pub calls: usize,
    /// Measurements per contender.
    pub rounds: usize,
    /// Kernels one call of ours launches (its plan's kernels).
    pub launches: usize,
    /// Host time of one call of ours, over the measurements.
    pub ours: Timing,
    /// Host time of one `cublasLtMatmul` call with the row's first
    /// algorithm, over the measurements.
    pub cublaslt: Timing,
    /// Ours per kernel launched over one `cublasLtMatmul` (medians): below
    /// 1, ours costs the host less per launch.
    pub per_launch_ratio: f64,
    /// Measurements in which the device finished its head start before the
    /// host had made every call (their time may include a wait on it).
    pub late: usize,
}

impl HostCost {
    /// The cost from its measurements, with the per-launch ratio of their
    /// medians.
    pub fn new(
        calls: usize,
        rounds: usize,
        launches: usize,
        ours: Timing,
        cublaslt: Timing,
        late: usize,
    ) -> Self {
        HostCost {
            calls,
            rounds,
            launches,
            per_launch_ratio: ours.median_us / launches as f64 / cublaslt.median_us,
            ours,
            cublaslt,
            late,
        }
    }
}

/// One contender's time per call, in µs: with one stream at a time (the
/// span of one stream's calls over their count), with every stream at once
/// (the span from the first call's start to the last one's end over all
/// calls), medians over the rounds; and concurrent over solo.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Slowdown {
    /// Per call with one stream at a time.
    pub solo_us: f64,
    /// Per call with every stream at once.
    pub concurrent_us: f64,
    /// `concurrent_us` over `solo_us`: above 1, the streams slow each
    /// other down.
    pub slowdown: f64,
    /// The SM clock sampled while this contender ran one stream at a time
    /// (absent without `nvidia-smi`, or where no sample fell inside).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub solo_clock: Option<ClockSummary>,
    /// The SM clock sampled while this contender ran on every stream at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub concurrent_clock: Option<ClockSummary>,
}

impl Slowdown {
    /// The median SM clocks alone and at once, `1980/1755`, `-` for one
    /// without samples.
    fn clocks(&self) -> String {
        let median = |c: Option<ClockSummary>| c.map_or("-".to_string(), |c| format!("{:.0}", c.median_mhz));
        format!("{}/{}", median(self.solo_clock), median(self.concurrent_clock))
    }
}

/// What one case measured.
pub struct Measured {
    /// Fusion's call (ours).
    pub ours: Timing,
    /// The baseline with cuBLASLt's first algorithm.
    pub first: Timing,
    /// The baseline with the best of cuBLASLt's top candidates.
    pub best: Timing,
    /// ‖ours − first‖ / ‖first‖ on the same inputs.
    pub agreement: f64,
    /// The algorithms of each cuBLASLt GEMM of the baseline.
    pub algorithms: Vec<GemmChoice>,
}

impl Row {
    /// A row without its clock, which the caller samples around the case.
    pub fn new(kernel: &str, shape: String, dtype: DType, baseline: String, flop: f64, m: Measured) -> Row {
        let tflops = |t: &Timing| flop / t.median_us / 1e6;
        Row {
            kernel: kernel.to_string(),
            shape,
            dtype: dtype.to_string(),
            baseline,
            ours_us: m.ours.median_us,
            baseline_us: m.first.median_us,
            ratio: m.first.median_us / m.ours.median_us,
            ours_tflops: tflops(&m.ours),
            baseline_tflops: tflops(&m.first),
            agreement: m.agreement,
            best_us: m.best.median_us,
            best_ratio: m.best.median_us / m.ours.median_us,
            best_tflops: tflops(&m.best),
            ours_timing: m.ours,
            baseline_timing: m.first,
            best_timing: m.best,
            algorithms: m.algorithms,
            sm_clock: None,
            concurrency: None,
            host: None,
            floor: None,
        }
    }
}

#[cfg(test)]
impl Row {
    /// A row for tests of what reads rows: ours took `us` µs, its quartiles
    /// `spread` to either side, and cuBLASLt `ratio` (first) and
    /// `best_ratio` (best) times that, with the same spread.
    pub fn for_test(kernel: &str, shape: &str, us: f64, spread: f64, ratio: f64, best_ratio: f64) -> Row {
        let timing = |us: f64| Timing {
            median_us: us,
            q1_us: us - spread,
            q3_us: us + spread,
            min_us: us - 2.0 * spread,
            max_us: us + 2.0 * spread,
        };
        Row::new(
            kernel,
            shape.into(),
            DType::F16,
            "cuBLASLt".into(),
            0.0,
            Measured {
                ours: timing(us),
                first: timing(us * ratio),
                best: timing(us * best_ratio),
                agreement: 0.0,
                algorithms: Vec::new(),
            },
        )
    }
}

/// Everything `fusion bench --json` writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// The GPU's name, as the driver reports it (`unknown GPU` where it
    /// does not).
    pub device: String,
    /// The GPU's compute capability, `major.minor`.
    pub compute_capability: String,
    /// The fusion variant the run used (`sm90`, …).
    pub variant: String,
    /// The element type of every row, `f16` or `bf16`.
    pub dtype: String,
    /// Timed calls per contender (`--runs`).
    pub runs: usize,
    /// Untimed calls per contender first (`--warmup`).
    pub warmup: usize,
    /// Every row, in the order they were measured.
    pub rows: Vec<Row>,
    /// The commit the `fusion` binary was built from ("unknown" when it
    /// was not built in a git checkout).
    pub commit: String,
    /// When the run started, UTC, `yyyy-mm-ddThh:mm:ssZ`.
    pub date: String,
    /// `cublasLtGetVersion()`: major·10000 + minor·100 + patch.
    pub cublaslt_version: usize,
    /// The CUDA version the driver supports (`cuDriverGetVersion`:
    /// major·1000 + minor·10).
    pub cuda_driver_version: i32,
    /// The driver's version as `nvidia-smi` reports it; none without it.
    pub driver: Option<String>,
    /// How the numbers were made.
    pub timing: TimingDescription,
    /// The SM clock over the whole run.
    pub sm_clock: Option<ClockSummary>,
    /// The device-to-device copy bandwidth the rows' floors are at,
    /// measured once at the start of the run; absent in earlier files.
    #[serde(default)]
    pub copy: Option<CopyBandwidth>,
    /// The tile tier every GEMM launch of the run was told to take
    /// (`FUSION_GEMM_TILE`); absent: the launchers chose.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemm_tile: Option<String>,
    /// How the run's GEMM launches split a tile's k-blocks
    /// (`FUSION_STREAM_K`, as `Splits::name` says it: `off`, `split-k`,
    /// `tail` or `fill`); absent in files written before it was recorded, which ran
    /// `tail` unless `FUSION_STREAM_K=0`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub splits: Option<String>,
    /// The built-in library was built with `FUSION_SELECT=model`: its
    /// GEMMs whose N or K is dynamic (every corpus row's) ran the sm90 tile
    /// the model of the kernel's time chose per call ([`super::tiles_by_model`]);
    /// absent: the launchers chose.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub tiles_by_model: bool,
    /// The built-in library was built with `FUSION_GUARD=on` and its
    /// routes were taken: a GEMM whose N or K is dynamic (every corpus
    /// row's plain-epilogue GEMM) ran cuBLASLt where the guard's models
    /// predicted the fused kernel slower by more than 3% at the call's
    /// shape ([`super::guarded`]); absent: the fused kernels ran.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub guarded: bool,
}

/// How the numbers of a report were made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TimingDescription {
    /// For the three contenders of a row: untimed, then timed calls,
    /// alternating call by call.
    pub plan: TimingPlan,
    /// Input sets rotated between calls.
    pub rotated_sets: usize,
    /// Algorithms the best-of baseline asks the heuristic for, and the
    /// short timing of each, before the row is timed.
    pub candidates: usize,
    /// The short timing of each candidate.
    pub candidate_plan: TimingPlan,
    /// The spread printed beside each median.
    pub spread: String,
    /// How the SM clock was sampled.
    pub sm_clock: String,
}

impl TimingDescription {
    /// The description of a run that times its rows with `plan`.
    pub fn new(plan: TimingPlan) -> TimingDescription {
        TimingDescription {
            plan,
            rotated_sets: super::SETS,
            candidates: vendor::CANDIDATES,
            candidate_plan: vendor::CANDIDATE_PLAN,
            spread: "interquartile range: the 25th to the 75th percentile of the timed calls".into(),
            sm_clock: format!(
                "nvidia-smi queries {} ms apart; min, median and max over the samples within each row and within the run",
                smi::SAMPLE_MS
            ),
        }
    }
}

/// `median (q1-q3)` in µs.
fn with_spread(t: &Timing) -> String {
    format!("{:.1} ({:.1}-{:.1})", t.median_us, t.q1_us, t.q3_us)
}

/// A row's floor in µs and ours as a fraction of it, then its ceiling in µs
/// and ours as a fraction of that, or `-` for each.
///
/// The floor is printed for every row, not only where the weight read
/// dominates: a threshold on the fraction would hide the floor exactly where
/// a slow kernel leaves most of it, and a small fraction says plainly that
/// the row is bound by its FLOPs instead.
fn floor_cells(floor: Option<&Floor>) -> [String; 4] {
    let dash = || "-".to_string();
    let Some(f) = floor else {
        return [dash(), dash(), dash(), dash()];
    };
    let (ceiling_us, ceiling_fraction) = f.ceiling.as_ref().map_or_else(
        || (dash(), dash()),
        |c| (format!("{:.1}", c.timing.median_us), format!("{:.3}", c.fraction)),
    );
    [
        format!("{:.1}", f.floor_us),
        format!("{:.3}", f.fraction),
        ceiling_us,
        ceiling_fraction,
    ]
}

/// `min/median/max` in MHz, or `-`.
fn clock_text(clock: Option<&ClockSummary>) -> String {
    clock.map_or_else(
        || "-".to_string(),
        |c| format!("{:.0}/{:.0}/{:.0}", c.min_mhz, c.median_mhz, c.max_mhz),
    )
}

/// The report's rows as an aligned text table, and a footer saying what the
/// columns are.
pub fn table(report: &Report) -> String {
    let mut out = format!(
        "{:<20} {:<18} {:<5} {:<42} {:>24} {:>24} {:>24} {:>6} {:>6} {:>7} {:>9} {:>6} {:>8} {:>6} {:>14}\n",
        "kernel",
        "shape (M,N,K)",
        "dtype",
        "baseline",
        "ours µs (IQR)",
        "first µs (IQR)",
        "best µs (IQR)",
        "ratio",
        "best",
        "ours TF",
        "floor µs",
        "floor",
        "ceil µs",
        "ceil",
        "SM MHz"
    );
    for r in &report.rows {
        let [floor_us, floor_fraction, ceiling_us, ceiling_fraction] = floor_cells(r.floor.as_ref());
        out.push_str(&format!(
            "{:<20} {:<18} {:<5} {:<42} {:>24} {:>24} {:>24} {:>6.3} {:>6.3} {:>7.1} {:>9} {:>6} {:>8} {:>6} {:>14}\n",
            r.kernel,
            r.shape,
            r.dtype,
            r.baseline,
            with_spread(&r.ours_timing),
            with_spread(&r.baseline_timing),
            with_spread(&r.best_timing),
            r.ratio,
            r.best_ratio,
            r.ours_tflops,
            floor_us,
            floor_fraction,
            ceiling_us,
            ceiling_fraction,
            clock_text(r.sm_clock.as_ref()),
        ));
    }
    let timing = &report.timing;
    let run_clock = match &report.sm_clock {
        Some(clock) => format!("{} MHz", clock_text(Some(clock))),
        None => "not sampled (nvidia-smi did not run)".to_string(),
    };
    let copy = match &report.copy {
        Some(copy) => format!("{:.0} GB/s, measured in this run", copy.gb_per_s),
        None => "not measured".to_string(),
    };
    out.push_str(&format!(
        "first: the baseline with the cuBLASLt heuristic's first algorithm, as users get it; \
         best: with the fastest of its top {} that agrees with the first\n\
         ratio = first's time / ours, best = best's time / ours (above 1: fusion is faster)\n\
         µs: median of {} timed calls each, the three interleaved; IQR: interquartile range, \
         the 25th to the 75th percentile\n\
         floor µs: the row's inputs, weights and output, each read or written once, at the \
         device-to-device copy bandwidth ({copy}); floor = floor µs / ours (1: ours at the copy bandwidth)\n\
         ceil µs: one device copy moving the row's bytes (half read, half written), median of the same \
         timing, for rows of at least {:.0} MB; ceil = ceil µs / ours (1: ours as fast as that one launch)\n\
         SM MHz: min/median/max of the SM clock sampled during the row by nvidia-smi queries {} ms apart \
         (whole run: {run_clock})\n",
        timing.candidates,
        timing.plan.runs,
        super::floor::CEILING_MIN_BYTES / 1e6,
        smi::SAMPLE_MS,
    ));
    out.push_str(&concurrency_table(report));
    out.push_str(&host_table(report));
    out
}

/// The rows that have the measurement `of` picks, each with it.
fn measured<'r, M>(report: &'r Report, of: impl Fn(&'r Row) -> Option<&'r M>) -> Vec<(&'r Row, &'r M)> {
    report.rows.iter().filter_map(|r| of(r).map(|m| (r, m))).collect()
}

/// With `--host`, a table of each row's host time per call; empty
/// otherwise.
fn host_table(report: &Report) -> String {
    let rows = measured(report, |r| r.host.as_ref());
    let Some((_, first)) = rows.first() else {
        return String::new();
    };
    let mut out = format!(
        "\nHost time per call (µs), the device kept busy\n\
         {:<20} {:<18} {:<5} {:>8} {:>14} {:>9} {:>14} {:>9} {:>5}\n",
        "kernel",
        "shape (M,N,K)",
        "dtype",
        "kernels",
        "ours (IQR)",
        "ours/krn",
        "cuBLASLt (IQR)",
        "ratio",
        "late"
    );
    for (r, h) in &rows {
        out.push_str(&format!(
            "{:<20} {:<18} {:<5} {:>8} {:>14} {:>9.2} {:>14} {:>9.3} {:>5}\n",
            r.kernel,
            r.shape,
            r.dtype,
            h.launches,
            format!("{:.2} ({:.2})", h.ours.median_us, h.ours.q3_us - h.ours.q1_us),
            h.ours.median_us / h.launches as f64,
            format!(
                "{:.2} ({:.2})",
                h.cublaslt.median_us,
                h.cublaslt.q3_us - h.cublaslt.q1_us
            ),
            h.per_launch_ratio,
            h.late,
        ));
    }
    out.push_str(&format!(
        "ours: one call of the graph's struct ({calls} per measurement); cuBLASLt: one cublasLtMatmul call with the \
         first algorithm ({calls} x kernels per measurement); medians of {rounds} measurements, each contender in turn\n\
         ratio = ours per kernel launched / cuBLASLt per call; late: measurements in which the device ran out of \
         queued work before the host had made every call\n",
        calls = first.calls,
        rounds = first.rounds,
    ));
    out
}

/// With `--streams N`, a second table: each row's slowdown with N streams
/// in flight; empty otherwise.
fn concurrency_table(report: &Report) -> String {
    let rows = measured(report, |r| r.concurrency.as_ref());
    let Some((_, first)) = rows.first() else {
        return String::new();
    };
    let mut out = format!(
        "\n{} streams in flight against one at a time (µs per call)\n\
         {:<20} {:<18} {:<5} {:>10} {:>10} {:>8} {:>10} {:>10} {:>8} {:>5} {:>11} {:>11}\n",
        first.streams,
        "kernel",
        "shape (M,N,K)",
        "dtype",
        "ours 1",
        "ours N",
        "slower",
        "first 1",
        "first N",
        "slower",
        "late",
        "ours MHz",
        "first MHz"
    );
    for (r, c) in &rows {
        out.push_str(&format!(
            "{:<20} {:<18} {:<5} {:>10.1} {:>10.1} {:>8.3} {:>10.1} {:>10.1} {:>8.3} {:>5} {:>11} {:>11}\n",
            r.kernel,
            r.shape,
            r.dtype,
            c.ours.solo_us,
            c.ours.concurrent_us,
            c.ours.slowdown,
            c.baseline.solo_us,
            c.baseline.concurrent_us,
            c.baseline.slowdown,
            c.late,
            c.ours.clocks(),
            c.baseline.clocks(),
        ));
    }
    out.push_str(&format!(
        "1: one stream at a time, the span of its {calls} calls over {calls}; N: all {n} at once, each with its own \
         host thread, buffers and workspace, the span from the first start to the last end over {n} x {calls} calls; \
         medians of {rounds} rounds\n\
         slower = N / 1, for ours and for the first (the baseline with the cuBLASLt heuristic's first algorithm); \
         late: measurements in which the device reached the calls before the host had queued them all\n\
         MHz: the median SM clock sampled while the contender ran one stream at a time / all at once \
         (-: no sample fell inside)\n",
        calls = first.calls,
        n = first.streams,
        rounds = first.rounds,
    ));
    out
}

/// `yyyy-mm-ddThh:mm:ssZ` for a time in seconds since the Unix epoch.
pub fn utc_date(unix_seconds: u64) -> String {
    let (days, secs) = (unix_seconds / 86_400, unix_seconds % 86_400);
    // Days to a civil date in the proleptic Gregorian calendar (Howard
    // Hinnant's algorithm): eras of 400 years, years starting in March.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::cublaslt::LtAlgoConfig;
    use crate::bench::vendor::Trial;

    fn timing(median_us: f64) -> Timing {
        Timing {
            median_us,
            q1_us: median_us - 0.5,
            q3_us: median_us + 1.0,
            min_us: median_us - 1.0,
            max_us: median_us + 9.0,
        }
    }

    fn algo(heuristic_rank: usize, tile: u64) -> LtAlgoConfig {
        LtAlgoConfig {
            heuristic_rank,
            id: 66,
            tile,
            stages: 20,
            splitk: 1,
            reduction_scheme: 0,
            cta_swizzling: 0,
            custom_option: 0,
            inner_shape: 0,
            cluster_shape: 2,
        }
    }

    /// 512 MiB copied in 250 µs: 4295 GB/s.
    fn copy() -> CopyBandwidth {
        CopyBandwidth::from_timing(512 << 20, timing(250.0))
    }

    fn report(clock: Option<ClockSummary>) -> Report {
        // 4096³ in f16: 3 × 32 MiB, 100.7 MB, 23.4 µs at 4295 GB/s.
        let bytes = 3.0 * 2.0 * 4096f64.powi(2) + 2.0 * 4096.0;
        let row = Row {
            sm_clock: clock,
            // A copy of its bytes in 190 µs: ours at 0.95 of that.
            floor: Some(Floor::new(bytes, &copy(), 200.0).with_ceiling(Some(timing(190.0)), 200.0)),
            ..Row::new(
                "gemm_bias",
                "4096,4096,4096".into(),
                DType::F16,
                "cuBLASLt BIAS".into(),
                2.0 * 4096f64.powi(3),
                Measured {
                    ours: timing(200.0),
                    first: timing(210.0),
                    best: timing(205.0),
                    agreement: 2e-4,
                    algorithms: vec![GemmChoice {
                        gemm: "gemm".into(),
                        first: algo(0, 18),
                        best: algo(3, 24),
                        trials: vec![
                            Trial::Timed(timing(210.0)),
                            Trial::Failed("CUBLAS_STATUS_NOT_SUPPORTED".into()),
                            Trial::Disagrees(None),
                            Trial::Timed(timing(205.0)),
                        ],
                    }],
                },
            )
        };
        Report {
            device: "NVIDIA H200".into(),
            compute_capability: "9.0".into(),
            variant: "sm90".into(),
            dtype: "f16".into(),
            runs: 50,
            warmup: 10,
            rows: vec![row],
            commit: "16bb885".into(),
            date: utc_date(1_796_143_424),
            cublaslt_version: 130_100,
            cuda_driver_version: 13_000,
            driver: Some("580.159.04".into()),
            timing: TimingDescription::new(TimingPlan { warmup: 10, runs: 50 }),
            sm_clock: clock,
            copy: Some(copy()),
            gemm_tile: None,
            splits: None,
            tiles_by_model: false,
            guarded: false,
        }
    }

    const CLOCK: ClockSummary = ClockSummary {
        min_mhz: 1755.0,
        median_mhz: 1980.0,
        max_mhz: 1980.0,
        samples: 12,
    };

    #[test]
    fn ratios_are_against_the_first_and_the_best_alike() {
        let row = &report(None).rows[0];
        assert_eq!((row.ours_us, row.baseline_us, row.best_us), (200.0, 210.0, 205.0));
        assert_eq!((row.ratio, row.best_ratio), (1.05, 1.025));
        assert!((row.ours_tflops - 687.19).abs() < 0.01, "{}", row.ours_tflops);
        assert!((row.baseline_tflops - row.ours_tflops / 1.05).abs() < 1e-9);
    }

    #[test]
    fn the_json_round_trips_and_keeps_the_old_fields() {
        let report = report(Some(CLOCK));
        let text = serde_json::to_string_pretty(&report).unwrap();
        assert_eq!(serde_json::from_str::<Report>(&text).unwrap(), report);
        // What readers of the first recorded files look up.
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        for key in [
            "device",
            "compute_capability",
            "variant",
            "dtype",
            "runs",
            "warmup",
            "rows",
        ] {
            assert!(value.get(key).is_some(), "{key}");
        }
        let row = &value["rows"][0];
        for key in [
            "kernel",
            "shape",
            "dtype",
            "baseline",
            "ours_us",
            "baseline_us",
            "ratio",
            "ours_tflops",
            "baseline_tflops",
            "agreement",
        ] {
            assert!(row.get(key).is_some(), "{key}");
        }
        assert_eq!(row["algorithms"][0]["best"]["heuristic_rank"], 3);
        assert_eq!(value["timing"]["candidates"], 16);
        assert_eq!(value["commit"], "16bb885");
        // The floor's fields, added after them.
        assert_eq!(row["floor"]["bytes"], 3.0 * 2.0 * 4096f64.powi(2) + 2.0 * 4096.0);
        let fraction = row["floor"]["fraction"].as_f64().unwrap();
        let floor_us = row["floor"]["floor_us"].as_f64().unwrap();
        assert!(
            (fraction - floor_us / 200.0).abs() < 1e-12 && fraction < 1.0,
            "{row}"
        );
        assert_eq!(row["floor"]["ceiling"]["timing"]["median_us"], 190.0);
        assert_eq!(row["floor"]["ceiling"]["fraction"], 0.95);
        assert_eq!(value["copy"]["bytes"], 512 << 20);
        assert!((value["copy"]["gb_per_s"].as_f64().unwrap() - 4294.967).abs() < 1e-3);
        assert_eq!(value["copy"]["timing"]["median_us"], 250.0);
    }

    #[test]
    fn a_file_from_before_the_floor_still_reads() {
        let mut value = serde_json::to_value(report(None)).unwrap();
        value.as_object_mut().unwrap().remove("copy");
        value["rows"][0].as_object_mut().unwrap().remove("floor");
        let old: Report = serde_json::from_value(value).unwrap();
        assert_eq!((old.copy, old.rows[0].floor), (None, None));
        // Its table says so in the floor's cells and the footer.
        let text = table(&old);
        let row = text.lines().nth(1).unwrap();
        assert!(row.contains(" 687.2         -      -        -      - "), "{row}");
        assert!(text.contains("copy bandwidth (not measured)"), "{text}");
    }

    #[test]
    fn the_table_shows_both_baselines_with_their_spread() {
        let text = table(&report(Some(CLOCK)));
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].starts_with("kernel "), "{text}");
        assert!(
            lines[0].contains("first µs (IQR)") && lines[0].contains("best µs (IQR)"),
            "{text}"
        );
        let row = lines[1];
        for cell in [
            "gemm_bias",
            "200.0 (199.5-201.0)",
            "210.0 (209.5-211.0)",
            "205.0 (204.5-206.0)",
            "1.050",
            "1.025",
            "23.4",
            "0.117",
            "190.0",
            "0.950",
            "1755/1980/1980",
        ] {
            assert!(row.contains(cell), "{cell} in {row}");
        }
        assert!(
            lines[0].contains("floor µs") && lines[0].contains(" floor "),
            "{text}"
        );
        assert!(text.contains("(4295 GB/s, measured in this run)"), "{text}");
        // The header and the row line up: the numbers end in the same column.
        assert_eq!(lines[0].chars().count(), row.chars().count(), "{text}");
        assert!(text.contains("top 16"), "{text}");
        assert!(text.contains("IQR: interquartile range"), "{text}");
        assert!(text.contains("median of 50 timed calls"), "{text}");
        assert!(text.contains("whole run: 1755/1980/1980 MHz"), "{text}");
    }

    #[test]
    fn host_costs_add_a_table_and_json_fields_only_when_measured() {
        let plain = report(Some(CLOCK));
        assert!(!serde_json::to_string(&plain).unwrap().contains("\"host\""));
        assert!(!table(&plain).contains("Host time per call"));
        let mut measured = plain.clone();
        let ours = Timing {
            median_us: 24.0,
            q1_us: 23.5,
            q3_us: 25.0,
            min_us: 23.0,
            max_us: 30.0,
        };
        measured.rows[0].host = Some(HostCost::new(48, 9, 2, ours, Timing::every_call(8.0), 1));
        // Per launch: 24 / 2 over 8.
        assert_eq!(measured.rows[0].host.as_ref().unwrap().per_launch_ratio, 1.5);
        let value = serde_json::to_value(&measured).unwrap();
        assert_eq!(value["rows"][0]["host"]["launches"], 2);
        assert_eq!(value["rows"][0]["host"]["cublaslt"]["median_us"], 8.0);
        let back: Report = serde_json::from_value(value).unwrap();
        assert_eq!(back, measured);
        let text = table(&measured);
        let row = text
            .lines()
            .skip_while(|l| !l.starts_with("Host time per call"))
            .nth(2)
            .unwrap();
        for cell in ["gemm_bias", "24.00 (1.50)", "12.00", "8.00 (0.00)", "1.500"] {
            assert!(row.contains(cell), "{cell} in {row}");
        }
        assert!(text.contains("medians of 9 measurements"), "{text}");
    }

    #[test]
    fn streams_add_a_second_table_and_json_fields_only_when_measured() {
        let plain = report(Some(CLOCK));
        let text = serde_json::to_string_pretty(&plain).unwrap();
        assert!(!text.contains("concurrency"), "{text}");
        assert!(!table(&plain).contains("streams in flight"));
        let mut measured = plain.clone();
        measured.rows[0].concurrency = Some(Concurrency {
            streams: 4,
            calls: 50,
            rounds: 5,
            ours: Slowdown {
                solo_us: 200.0,
                concurrent_us: 232.0,
                slowdown: 1.16,
                solo_clock: None,
                concurrent_clock: None,
            },
            baseline: Slowdown {
                solo_us: 210.0,
                concurrent_us: 252.0,
                slowdown: 1.2,
                solo_clock: None,
                concurrent_clock: None,
            },
            late: 0,
        });
        let text = serde_json::to_string_pretty(&measured).unwrap();
        assert_eq!(serde_json::from_str::<Report>(&text).unwrap(), measured);
        let value: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(value["rows"][0]["concurrency"]["ours"]["slowdown"], 1.16);
        let text = table(&measured);
        assert!(text.starts_with(&table(&plain)), "{text}");
        let lines: Vec<&str> = text.lines().collect();
        let header = lines
            .iter()
            .position(|l| l.starts_with("kernel ") && l.contains("ours N"))
            .unwrap();
        let row = lines[header + 1];
        for cell in ["gemm_bias", "200.0", "232.0", "1.160", "210.0", "252.0", "1.200"] {
            assert!(row.contains(cell), "{cell} in {row}");
        }
        assert_eq!(lines[header].chars().count(), row.chars().count(), "{text}");
        assert!(text.contains("4 streams in flight"), "{text}");
    }

    #[test]
    fn an_unsampled_clock_says_so() {
        let text = table(&report(None));
        assert!(text.lines().nth(1).unwrap().ends_with(" -"), "{text}");
        assert!(text.contains("whole run: not sampled"), "{text}");
    }

    #[test]
    fn dates_are_utc_civil_dates() {
        assert_eq!(utc_date(0), "1970-01-01T00:00:00Z");
        assert_eq!(utc_date(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(utc_date(1_796_143_424), "2026-12-01T16:43:44Z");
        assert_eq!(utc_date(4_107_542_399), "2100-02-28T23:59:59Z");
    }
}
