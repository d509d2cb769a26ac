//! The run-time checks of generated wrappers, on a real device: a bad
//! argument is refused with its own `fusion::Error` before anything is
//! launched, and the output buffer is left as it was.

mod support;

use fusion::cudarc::driver::{CudaSlice, CudaStream};
use fusion::half::f16;
use fusion::{Error, Tensor, TensorMut, kernels};
use std::sync::Arc;
use support::stream;

fn filled(s: &Arc<CudaStream>, n: usize, value: f32) -> CudaSlice<f16> {
    s.clone_htod(&vec![f16::from_f32(value); n]).unwrap()
}

/// x [m, k], w [n, k], b [n], y [m, n] for gemm_bias.
fn gemm_bias(s: &Arc<CudaStream>, m: usize, n: usize, k: usize) -> fusion::Result<Vec<f16>> {
    let (x, w, b) = (filled(s, m * k, 0.5), filled(s, n * k, 0.25), filled(s, n, 1.0));
    let mut y = filled(s, m * n, -7.0);
    {
        let mut out = TensorMut::new(&mut y, [m, n])?;
        kernels::gemm_bias(
            s,
            &Tensor::new(&x, [m, k])?,
            &Tensor::new(&w, [n, k])?,
            &Tensor::new(&b, [n])?,
            &mut out,
        )?;
    }
    Ok(s.clone_dtoh(&y).unwrap())
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_valid_call_computes() {
    let s = stream();
    let y = gemm_bias(&s, 3, 8, 16).unwrap();
    // 16 products of 0.5 · 0.25, plus the bias 1.
    assert!(y.iter().all(|v| v.to_f32() == 3.0), "{y:?}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn k_and_n_must_be_multiples_of_8() {
    let s = stream();
    let err = gemm_bias(&s, 4, 8, 12).unwrap_err();
    assert!(matches!(err, Error::NotMultipleOf8 { value: 12, .. }), "{err}");
    let err = gemm_bias(&s, 4, 20, 16).unwrap_err();
    assert!(matches!(err, Error::NotMultipleOf8 { value: 20, .. }), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn m_of_zero_is_a_no_op() {
    let s = stream();
    assert_eq!(gemm_bias(&s, 0, 8, 16).unwrap(), Vec::<f16>::new());
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn shapes_must_agree_with_each_other() {
    let s = stream();
    let (x, w, b) = (
        filled(&s, 4 * 16, 0.5),
        filled(&s, 8 * 24, 0.25),
        filled(&s, 8, 1.0),
    );
    let mut y = filled(&s, 4 * 8, -7.0);
    let err = kernels::gemm_bias(
        &s,
        &Tensor::new(&x, [4, 16]).unwrap(),
        &Tensor::new(&w, [8, 24]).unwrap(),
        &Tensor::new(&b, [8]).unwrap(),
        &mut TensorMut::new(&mut y, [4, 8]).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::DimMismatch { .. }), "{err}");
    // Nothing was launched: the poison is intact.
    assert!(s.clone_dtoh(&y).unwrap().iter().all(|v| v.to_f32() == -7.0));
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn the_token_count_must_match_between_inputs() {
    let s = stream();
    let (x, r) = (filled(&s, 4 * 16, 0.5), filled(&s, 5 * 8, 0.5));
    let (w, b) = (filled(&s, 8 * 16, 0.25), filled(&s, 8, 1.0));
    let mut y = filled(&s, 4 * 8, -7.0);
    let err = kernels::gemm_bias_residual(
        &s,
        &Tensor::new(&x, [4, 16]).unwrap(),
        &Tensor::new(&r, [5, 8]).unwrap(),
        &Tensor::new(&w, [8, 16]).unwrap(),
        &Tensor::new(&b, [8]).unwrap(),
        &mut TensorMut::new(&mut y, [4, 8]).unwrap(),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            Error::DimMismatch {
                first_value: 4,
                second_value: 5,
                ..
            }
        ),
        "{err}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn misaligned_views_are_refused() {
    let s = stream();
    let x = filled(&s, 4 * 16 + 1, 0.5);
    let (w, b) = (filled(&s, 8 * 16, 0.25), filled(&s, 8, 1.0));
    let mut y = filled(&s, 4 * 8, -7.0);
    let err = kernels::gemm_bias(
        &s,
        &Tensor::from_view(x.slice(1..), [4, 16]).unwrap(),
        &Tensor::new(&w, [8, 16]).unwrap(),
        &Tensor::new(&b, [8]).unwrap(),
        &mut TensorMut::new(&mut y, [4, 8]).unwrap(),
    )
    .unwrap_err();
    assert!(matches!(err, Error::Misaligned { .. }), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_wrong_buffer_length_is_refused_when_the_view_is_made() {
    let s = stream();
    let x = filled(&s, 10, 0.5);
    let err = Tensor::new(&x, [4, 16]).unwrap_err();
    assert!(
        matches!(
            err,
            Error::BufferLength {
                expected: 64,
                actual: 10,
                ..
            }
        ),
        "{err}"
    );
}
