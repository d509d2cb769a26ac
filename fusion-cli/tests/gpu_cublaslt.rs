//! The cuBLASLt baseline of `fusion bench` on a real device: it refuses
//! buffers that do not match its plan with a `fusion::Error`, runs each
//! candidate algorithm it was given, and its stacked form writes one
//! product per weight.
//!
//! Run on a machine with a GPU: `cargo test --release -p fusion-cli --test
//! gpu_cublaslt -- --ignored`.

#[path = "../../tests/support/mod.rs"]
mod support;

use fusion::Error;
use fusion::cudarc::driver::{CudaSlice, CudaStream};
use fusion::half::f16;
use std::sync::Arc;
use support::stream;

fn filled(s: &Arc<CudaStream>, n: usize, value: f32) -> CudaSlice<f16> {
    s.clone_htod(&vec![f16::from_f32(value); n]).unwrap()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_cublaslt_baseline_checks_its_buffers() {
    use fusion::ir::{DType, WeightLayout};
    use fusion_cli::bench::cublaslt::{LtEpilogue, LtGemm};
    let s = stream();
    let (m, n, k) = (16, 8, 32);
    let mut lt = LtGemm::new(&s, DType::F16, WeightLayout::NK, (m, n, k), LtEpilogue::Bias, 1).unwrap();
    let (x, w, b) = (
        filled(&s, m * k, 0.5),
        filled(&s, n * k, 0.25),
        filled(&s, n, 1.0),
    );
    let mut y = filled(&s, m * n, -7.0);
    lt.run(&s, &x, &w, Some(&b), None, &mut y).unwrap();
    let short = filled(&s, m * k - 1, 0.5);
    let err = lt.run(&s, &short, &w, Some(&b), None, &mut y).unwrap_err();
    assert!(
        matches!(
            err,
            Error::BufferLength {
                expected: 512,
                actual: 511,
                ..
            }
        ),
        "{err}"
    );
    let mut small_y = filled(&s, m * n / 2, 0.0);
    let err = lt.run(&s, &x, &w, Some(&b), None, &mut small_y).unwrap_err();
    assert!(matches!(err, Error::BufferLength { .. }), "{err}");
    let err = lt.run(&s, &x, &w, None, None, &mut y).unwrap_err();
    assert!(
        matches!(err, Error::Shape { .. }),
        "a bias epilogue without a bias: {err}"
    );
    let as_bf16 = |n: usize| s.clone_htod(&vec![fusion::half::bf16::ZERO; n]).unwrap();
    let (xb, wb, bb, mut yb) = (as_bf16(m * k), as_bf16(n * k), as_bf16(n), as_bf16(m * n));
    let err = lt.run(&s, &xb, &wb, Some(&bb), None, &mut yb).unwrap_err();
    assert!(matches!(err, Error::ElementType { .. }), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_cublaslt_baseline_runs_each_candidate_and_names_it() {
    use fusion::ir::{DType, WeightLayout};
    use fusion_cli::bench::cublaslt::{ChosenConfig, LtEpilogue, LtGemm, version};
    let s = stream();
    let (m, n, k) = (256, 512, 1024);
    let mut lt = LtGemm::new(&s, DType::F16, WeightLayout::NK, (m, n, k), LtEpilogue::None, 16).unwrap();
    assert!((1..=16).contains(&lt.candidates()), "{}", lt.candidates());
    let first = lt.chosen_config().unwrap();
    assert_eq!((lt.chosen(), first.heuristic_rank), (0, 0));
    let (x, w) = (filled(&s, m * k, 0.5), filled(&s, n * k, 0.25));
    let mut y = filled(&s, m * n, -7.0);
    for rank in 0..lt.candidates() {
        lt.choose(rank);
        assert_eq!(lt.chosen_config().unwrap().heuristic_rank, rank);
        // A candidate cuBLASLt refuses is an error, not a crash; one that
        // runs computes 0.5 · 0.25 · K everywhere.
        if lt.run(&s, &x, &w, None, None, &mut y).is_ok() {
            let host = s.clone_dtoh(&y).unwrap();
            assert!(host.iter().all(|v| v.to_f32() == 128.0), "candidate {rank}");
        }
    }
    // Asked for one algorithm, as PyTorch asks: one candidate.
    let one = LtGemm::new(&s, DType::F16, WeightLayout::NK, (m, n, k), LtEpilogue::None, 1).unwrap();
    assert_eq!(one.candidates(), 1);
    assert!(version() >= 110_000, "cuBLASLt {}", version());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_stacked_cublaslt_baseline_writes_one_product_per_weight() {
    use fusion::ir::{DType, WeightLayout};
    use fusion_cli::bench::cublaslt::LtGemm;
    let s = stream();
    let (m, n, k) = (16, 8, 32);
    let mut lt = LtGemm::new_stacked(&s, DType::F16, WeightLayout::NK, (m, n, k), 2, 1).unwrap();
    // Weight 0 all 0.25, weight 1 all 1.0, stacked [2N, K].
    let mut stacked = vec![f16::from_f32(0.25); n * k];
    stacked.extend(vec![f16::from_f32(1.0); n * k]);
    let (x, w) = (filled(&s, m * k, 0.5), s.clone_htod(&stacked).unwrap());
    let mut y = filled(&s, 2 * m * n, -7.0);
    lt.run(&s, &x, &w, None, None, &mut y).unwrap();
    let host = s.clone_dtoh(&y).unwrap();
    // 0.5 · 0.25 · 32 and 0.5 · 1 · 32: x is shared, each weight its own.
    assert!(host[..m * n].iter().all(|v| v.to_f32() == 4.0), "{host:?}");
    assert!(host[m * n..].iter().all(|v| v.to_f32() == 16.0), "{host:?}");
    // One weight's worth is too short for two products.
    let one = filled(&s, n * k, 0.25);
    let err = lt.run(&s, &x, &one, None, None, &mut y).unwrap_err();
    assert!(matches!(err, Error::BufferLength { .. }), "{err}");
}
