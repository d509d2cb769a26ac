//! Calls captured into a CUDA graph and replayed, as inference servers run
//! them: every launch a wrapper makes must be capturable, and a replay must
//! compute what a direct call does. The sm90 norm prologue takes its row
//! statistics from the workspace the free functions keep per stream, which
//! is never grown during a capture, so each call runs once before it; the
//! launches captured leave stream-K out (its flags and partials would be
//! shared by the graph's replays and the stream's direct launches).
//!
//! A call that would have to grow its workspace during a capture is refused
//! with `Error::WorkspaceGrowsInCapture`.
//!
//! Run on a machine with a GPU: `cargo test --release --features kernels,testing --test
//! gpu_graphs -- --ignored` (see tests/support for the environment).

mod support;

use fusion::core::reference::Intermediates;
use fusion::cudarc::driver::CudaStream;
use fusion::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use fusion::half::f16;
use fusion::launch::with_stream_workspace;
use fusion::{Error, kernels};
use std::sync::Arc;
use support::{Case, stream};

/// A shape whose 128x256 tiles leave a partial last wave on 132 SMs (204
/// tiles), which a direct call on an H200 splits by stream-K with
/// `FUSION_STREAM_K=tail`; a captured one never splits.
const DIMS: [(&str, usize); 3] = [("M", 2100), ("N", 3000), ("K", 3000)];

/// A stream to capture on, with a `layernorm_gemm` and a `gemm_bias_gelu`
/// case on it. A capture may not wait on events recorded before it began,
/// which cudarc's per-buffer event tracking would do; every buffer of a
/// test here lives on its test's one stream, so the tracking (turned off
/// for the whole context) is not needed.
fn capture_cases() -> (Arc<CudaStream>, Case<f16>, Case<f16>) {
    let s = stream();
    unsafe { s.context().disable_event_tracking() };
    let norm = Case::<f16>::new(&s, "layernorm_gemm", &DIMS).with_intermediates(Intermediates::RoundedNorms);
    let gelu = Case::<f16>::new(&s, "gemm_bias_gelu", &DIMS);
    s.synchronize().expect("uploads done");
    (s, norm, gelu)
}

fn layernorm_gemm(s: &Arc<CudaStream>, case: &mut Case<f16>) -> fusion::Result<()> {
    case.launch(|r, w| kernels::layernorm_gemm(s, &r[0], &r[1], &r[2], &r[3], &mut w[0]))
}

fn gemm_bias_gelu(s: &Arc<CudaStream>, case: &mut Case<f16>) -> fusion::Result<()> {
    case.launch(|r, w| kernels::gemm_bias_gelu(s, &r[0], &r[1], &r[2], &mut w[0]))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn captured_calls_replay_to_the_reference() {
    let (s, mut norm, mut gelu) = capture_cases();
    // Sizes the stream's workspace, which a capture must not grow.
    layernorm_gemm(&s, &mut norm).expect("layernorm_gemm runs");
    gemm_bias_gelu(&s, &mut gelu).expect("gemm_bias_gelu runs");
    s.synchronize().expect("the first calls finish");
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .expect("capture begins");
    layernorm_gemm(&s, &mut norm).expect("layernorm_gemm is captured");
    gemm_bias_gelu(&s, &mut gelu).expect("gemm_bias_gelu is captured");
    let graph = s
        .end_capture(CUgraphInstantiate_flags(0))
        .expect("capture ends")
        .expect("a graph with both kernels");
    // Every replay matches the reference (on a fresh sample of rows) and,
    // bit for bit, the first replay: nothing in the graph depends on timing.
    let mut first: Option<Vec<Vec<f16>>> = None;
    for replay in 0..3 {
        norm.poison(&s);
        gelu.poison(&s);
        graph.launch().expect("the graph launches");
        let errors = (norm.verify(&s), gelu.verify(&s));
        eprintln!(
            "replay {replay}: relative error {:.2e} (layernorm_gemm), {:.2e} (gemm_bias_gelu)",
            errors.0, errors.1
        );
        let outputs: Vec<Vec<f16>> = [&norm, &gelu]
            .iter()
            .map(|case| s.clone_dtoh(&case.writes[0].1).expect("download"))
            .collect();
        match &first {
            None => first = Some(outputs),
            Some(first) => assert!(*first == outputs, "replay {replay} differs from the first"),
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_capture_that_would_grow_the_workspace_is_refused() {
    let (s, mut norm, mut gelu) = capture_cases();
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .expect("capture begins");
    // Captured launches run every tile whole: this one needs no scratch.
    gemm_bias_gelu(&s, &mut gelu).expect("gemm_bias_gelu needs no scratch while capturing");
    // The norm prologue's row statistics would need a first allocation.
    let e = layernorm_gemm(&s, &mut norm).unwrap_err();
    assert!(matches!(e, Error::WorkspaceGrowsInCapture { .. }), "{e}");
    s.end_capture(CUgraphInstantiate_flags(0)).expect("capture ends");
    let held = with_stream_workspace(&s, |w| (w.scratch_bytes(), w.allocations()));
    assert_eq!(held, (0, 0), "nothing was allocated");
}
