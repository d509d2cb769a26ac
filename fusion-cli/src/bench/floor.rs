//! The floor of a row: the bytes its computation must move, at the
//! device-to-device copy bandwidth measured in the same run. Where the
//! weight read dominates (decode: a few rows of A against a large weight)
//! no kernel can beat it, so ours as a fraction of it says how much is left
//! to gain there; where the FLOPs dominate the fraction is small and says
//! only that.
//!
//! A copy reads and writes every byte, so its bandwidth is 2 × bytes / time.
//! The copy is timed once per run, with the rows' timing helpers.
//!
//! The floor is what the bytes cost at the bandwidth of a long copy; one
//! launch that moves them also pays its ramp-up and drain, which at a
//! decode GEMM's ~117 MB is a tenth of the time (on an H200 a kernel that
//! only streams the weight takes 31.5 µs a call against a 27.6 µs floor).
//! So each row whose bytes stream from DRAM also gets its ceiling: one
//! device copy moving the same bytes (half read, half written), timed in
//! the same run with the rows' plan: what the fastest single kernel that
//! moves those bytes takes.

use super::timing::{Timing, TimingPlan, time_calls};
use super::{FfnRow, NormRow, Pattern};
use cudarc::driver::CudaStream;
use fusion::error::Result;
use serde::{Deserialize, Serialize};
use std::cell::RefCell;
use std::sync::Arc;

/// Bytes of the timed copy: far beyond any GPU's L2 (50 MB on an H200), so
/// that it streams from DRAM and back, and long (about 0.25 ms on an H200)
/// next to the gap between two queued calls.
pub const COPY_BYTES: usize = 512 << 20;

/// The device-to-device copy bandwidth of a run.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct CopyBandwidth {
    /// Bytes each timed copy moves from one buffer to another.
    pub bytes: usize,
    /// The timed copies, with the rows' plan.
    pub timing: Timing,
    /// 2 × bytes over the median copy, in GB/s (10⁹ bytes per second).
    pub gb_per_s: f64,
}

impl CopyBandwidth {
    /// Times copies of [`COPY_BYTES`] between two device buffers on
    /// `stream`: `plan.warmup` untimed, then `plan.runs` timed, queued
    /// behind a head start as the rows' calls are.
    pub fn measure(stream: &Arc<CudaStream>, plan: TimingPlan) -> Result<CopyBandwidth> {
        let timing = time_copies(stream, COPY_BYTES, plan)?;
        Ok(CopyBandwidth::from_timing(COPY_BYTES, timing))
    }

    /// The bandwidth of copies of `bytes` that took `timing`.
    pub fn from_timing(bytes: usize, timing: Timing) -> CopyBandwidth {
        CopyBandwidth {
            bytes,
            timing,
            gb_per_s: 2.0 * bytes as f64 / (timing.median_us * 1e3),
        }
    }

    /// `bytes` at this bandwidth, in µs.
    pub fn time_us(&self, bytes: f64) -> f64 {
        bytes / (self.gb_per_s * 1e3)
    }

    /// The line `fusion bench` prints under its header.
    pub fn describe(&self) -> String {
        format!(
            "device-to-device copy: {:.0} GB/s (2 x {} MiB over the median of {:.1} µs); \
             each row's floor is its bytes at that rate",
            self.gb_per_s,
            self.bytes >> 20,
            self.timing.median_us,
        )
    }
}

/// A row's floor, and ours against it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Floor {
    /// The bytes the computation reads and writes, each tensor once.
    pub bytes: f64,
    /// Those bytes at the run's copy bandwidth, in µs.
    pub floor_us: f64,
    /// floor_us over our median: 1 is ours at the copy bandwidth. Above 1
    /// only where the inputs stay in L2 between calls (shapes whose rotated
    /// input sets fit in it together).
    pub fraction: f64,
    /// One copy of the same bytes, where they stream from DRAM (absent in
    /// records before it, and for rows whose bytes fit in L2).
    #[serde(default)]
    pub ceiling: Option<Ceiling>,
}

/// One device copy moving a row's bytes, and ours against it.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ceiling {
    /// The timed copies, with the rows' plan.
    pub timing: Timing,
    /// The copy's median over ours: 1 is ours as fast as the copy.
    pub fraction: f64,
}

impl Floor {
    /// The floor of a row that moves `bytes`, at `copy`'s bandwidth, against
    /// our median `ours_us`; without its ceiling.
    pub fn new(bytes: f64, copy: &CopyBandwidth, ours_us: f64) -> Floor {
        let floor_us = copy.time_us(bytes);
        Floor {
            bytes,
            floor_us,
            fraction: floor_us / ours_us,
            ceiling: None,
        }
    }

    /// With the ceiling `timing` (see [`measure_ceiling`]), against ours.
    pub fn with_ceiling(self, timing: Option<Timing>, ours_us: f64) -> Floor {
        Floor {
            ceiling: timing.map(|timing| Ceiling {
                fraction: timing.median_us / ours_us,
                timing,
            }),
            ..self
        }
    }
}

/// The bytes of a row below which it gets no ceiling: a copy of them (half
/// read, half written) would have a source within an H200's 50 MB of L2,
/// and time L2 rather than DRAM. A decode GEMM at (1, 14336, 4096) moves
/// 117 MB.
pub const CEILING_MIN_BYTES: f64 = 100e6;

/// Times one device copy of `bytes / 2` bytes (so `bytes` read and written
/// in all) on `stream`, `plan.warmup` untimed and `plan.runs` timed, queued
/// behind a head start as the rows' calls are; none below
/// [`CEILING_MIN_BYTES`].
pub fn measure_ceiling(stream: &Arc<CudaStream>, bytes: f64, plan: TimingPlan) -> Result<Option<Timing>> {
    if bytes < CEILING_MIN_BYTES {
        return Ok(None);
    }
    Ok(Some(time_copies(stream, (bytes / 2.0) as usize, plan)?))
}

/// Times copies of `bytes` between two device buffers on `stream`:
/// `plan.warmup` untimed, then `plan.runs` timed, queued behind a head start
/// as the rows' calls are.
fn time_copies(stream: &Arc<CudaStream>, bytes: usize, plan: TimingPlan) -> Result<Timing> {
    let source = stream.alloc_zeros::<u8>(bytes)?;
    // The destination doubles as the head start's scratch: both run on
    // `stream`, in order.
    let destination = RefCell::new(stream.alloc_zeros::<u8>(bytes)?);
    time_calls(
        stream,
        plan,
        || super::head_start(stream, &mut destination.borrow_mut()),
        |_| Ok(stream.memcpy_dtod(&source, &mut *destination.borrow_mut())?),
    )
}

/// The least bytes `pattern` at (M, N, K) reads and writes with `element`
/// bytes per value: A `[M, K]`, the weight `[N, K]`, the graph's vectors (a
/// bias `[N]`; a norm's gamma, and a LayerNorm's beta, `[K]`), a residual
/// `[M, N]`, and C `[M, N]`. A folded norm reads W·diag(gamma) and two `[N]`
/// vectors in place of W, gamma and beta: the graph's own tensors are the
/// floor of either.
pub fn gemm_bytes(pattern: Pattern, (m, n, k): (usize, usize, usize), element: usize) -> f64 {
    let vectors = match pattern {
        Pattern::Gemm | Pattern::GemmGelu | Pattern::GemmSilu => 0,
        // The second weight of a gated pair.
        Pattern::GemmSiluGlu | Pattern::GemmGeluGlu => n * k,
        Pattern::GemmBias | Pattern::GemmBiasGelu | Pattern::GemmBiasRelu | Pattern::GemmBiasSilu => n,
        Pattern::GemmBiasResidual => n + m * n,
        Pattern::GemmResidual => m * n,
        Pattern::LayernormGemm | Pattern::LayernormGemmPerCall => 2 * k,
        Pattern::RmsnormGemm | Pattern::RmsnormGemmPerCall => k,
    };
    ((m * k + n * k + vectors + m * n) * element) as f64
}

/// The least bytes a standalone norm at (M, K) reads and writes: x, y and
/// its `[K]` vectors.
pub fn norm_bytes(norm: NormRow, (m, k): (usize, usize), element: usize) -> f64 {
    ((2 * m * k + norm.vectors() * k) * element) as f64
}

/// The least bytes an FFN row's block at M tokens (width D, hidden F)
/// reads and writes: the gate, up and down weights, its `[D]` vector (the
/// SwiGLU block's down bias, the sub-layer's gamma), x read (once, for the
/// projections and the residual) and y written. The sub-layer's folded
/// gate/up weight replaces two of the weights and gamma: the graph's own
/// tensors are the floor either way.
pub fn ffn_bytes(row: FfnRow, m: usize, d: usize, f: usize, element: usize) -> f64 {
    let vector = match row {
        FfnRow::SwigluFfn(_) => d,
        FfnRow::FfnSublayer => d,
    };
    ((3 * f * d + vector + 2 * m * d) * element) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::GateUp;

    #[test]
    fn a_copy_reads_and_writes_its_bytes() {
        // 512 MiB in 250 µs: 2 × 536.9 MB / 250 µs = 4295 GB/s.
        let copy = CopyBandwidth::from_timing(COPY_BYTES, Timing::every_call(250.0));
        assert!((copy.gb_per_s - 4_294.967_296).abs() < 1e-6, "{}", copy.gb_per_s);
        // Reading and writing the copy's bytes once each takes the copy's time.
        assert!((copy.time_us(2.0 * COPY_BYTES as f64) - 250.0).abs() < 1e-9);
        let line = copy.describe();
        assert!(
            line.contains("4295 GB/s") && line.contains("512 MiB") && line.contains("250.0 µs"),
            "{line}"
        );
    }

    #[test]
    fn gemm_bytes_count_each_tensor_once() {
        let shape = (1, 14336, 4096);
        // f16: 2 × (4096 + 14336·4096 + 14336) bytes, the weight ~117 MB.
        assert_eq!(
            gemm_bytes(Pattern::Gemm, shape, 2),
            2.0 * (4096.0 + 14336.0 * 4096.0 + 14336.0)
        );
        let bare = gemm_bytes(Pattern::Gemm, (4, 8, 16), 2);
        assert_eq!(bare, 2.0 * (64 + 128 + 32) as f64);
        assert_eq!(gemm_bytes(Pattern::GemmSilu, (4, 8, 16), 2), bare);
        assert_eq!(gemm_bytes(Pattern::GemmBiasGelu, (4, 8, 16), 2), bare + 16.0);
        assert_eq!(
            gemm_bytes(Pattern::GemmBiasResidual, (4, 8, 16), 2),
            bare + 16.0 + 64.0
        );
        assert_eq!(
            gemm_bytes(Pattern::LayernormGemmPerCall, (4, 8, 16), 2),
            bare + 64.0
        );
        assert_eq!(gemm_bytes(Pattern::RmsnormGemm, (4, 8, 16), 2), bare + 32.0);
        assert_eq!(gemm_bytes(Pattern::Gemm, (4, 8, 16), 4), 2.0 * bare);
    }

    #[test]
    fn ffn_bytes_are_three_weights_a_vector_x_and_y() {
        // Llama-3-8B at one token, f16: 3 × 14336 × 4096 weights, 4096 bias,
        // 4096 of x and 4096 of y, 2 bytes each: 352.4 MB.
        let swiglu = FfnRow::SwigluFfn(GateUp::StackedFused);
        let bytes = ffn_bytes(swiglu, 1, 4096, 14336, 2);
        assert_eq!(bytes, 2.0 * (3.0 * 14336.0 * 4096.0 + 3.0 * 4096.0));
        assert_eq!(
            ffn_bytes(swiglu, 8192, 4096, 14336, 2) - bytes,
            2.0 * 2.0 * 8191.0 * 4096.0
        );
        // The sub-layer reads gamma [D] where the block reads its bias [D].
        assert_eq!(ffn_bytes(FfnRow::FfnSublayer, 1, 4096, 14336, 2), bytes);
        assert_eq!(
            ffn_bytes(FfnRow::FfnSublayer, 16, 8, 32, 4),
            4.0 * (3.0 * 32.0 * 8.0 + 8.0 + 2.0 * 16.0 * 8.0)
        );
    }

    #[test]
    fn the_floor_is_the_bytes_at_the_copy_bandwidth_over_ours() {
        let copy = CopyBandwidth::from_timing(COPY_BYTES, Timing::every_call(250.0));
        // The decode GEMM's ~117 MB at 4295 GB/s: 27.35 µs; ours at 34.6 µs
        // reaches 0.79 of it.
        let bytes = gemm_bytes(Pattern::Gemm, (1, 14336, 4096), 2);
        let floor = Floor::new(bytes, &copy, 34.6);
        assert!((floor.floor_us - 27.35).abs() < 0.01, "{floor:?}");
        assert!((floor.fraction - floor.floor_us / 34.6).abs() < 1e-12);
        assert!(floor.fraction > 0.79 && floor.fraction < 0.80, "{floor:?}");
        assert_eq!(floor.bytes, bytes);
        assert_eq!(floor.ceiling, None);
        // A copy of the same bytes in 31.5 µs: ours at 34.6 µs reaches 0.91 of it.
        let with = floor.with_ceiling(Some(Timing::every_call(31.5)), 34.6);
        let ceiling = with.ceiling.expect("a ceiling");
        assert!((ceiling.fraction - 31.5 / 34.6).abs() < 1e-12, "{ceiling:?}");
        assert_eq!(with.floor_us, floor.floor_us);
        assert_eq!(floor.with_ceiling(None, 34.6).ceiling, None);
    }

    #[test]
    fn rows_whose_bytes_fit_in_l2_get_no_ceiling() {
        assert!(gemm_bytes(Pattern::Gemm, (1, 14336, 4096), 2) >= CEILING_MIN_BYTES);
        assert!(gemm_bytes(Pattern::Gemm, (512, 2048, 2048), 2) < CEILING_MIN_BYTES);
    }
}
