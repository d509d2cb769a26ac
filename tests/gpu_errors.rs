//! The run-time checks of generated wrappers, on a real device: a bad
//! argument is refused with its own `fusion::Error` before anything is
//! launched, and the output buffer is left as it was.

mod support;

use fusion::cudarc::driver::{CudaSlice, CudaStream};
use fusion::half::f16;
use fusion::{Error, Shape, Tensor, TensorMut, kernels};
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

/// gemm_bias with x, w and b viewed with the given shapes (each buffer
/// sized to match) and y [4, 8], which must be refused: its error, once
/// checked that nothing was launched (y's poison is intact).
fn refused_gemm_bias(s: &Arc<CudaStream>, x: Shape, w: Shape, b: Shape) -> Error {
    let len = |shape: Shape| shape.len().expect("a test shape fits a usize");
    let (xb, wb, bb) = (
        filled(s, len(x), 0.5),
        filled(s, len(w), 0.25),
        filled(s, len(b), 1.0),
    );
    let mut y = filled(s, 4 * 8, -7.0);
    let err = kernels::gemm_bias(
        s,
        &Tensor::new(&xb, x).unwrap(),
        &Tensor::new(&wb, w).unwrap(),
        &Tensor::new(&bb, b).unwrap(),
        &mut TensorMut::new(&mut y, [4, 8]).unwrap(),
    )
    .unwrap_err();
    assert!(s.clone_dtoh(&y).unwrap().iter().all(|v| v.to_f32() == -7.0));
    err
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_shape_unlike_the_declaration_is_refused() {
    let s = stream();
    // w is declared [N, K]: a vector of its 128 values is the wrong rank.
    let err = refused_gemm_bias(&s, Shape::Matrix(4, 16), Shape::Vector(128), Shape::Vector(8));
    assert!(
        matches!(&err, Error::Shape { tensor, expected, actual }
            if tensor == "w" && expected == "[N, K]" && actual == "[128]"),
        "{err}"
    );
    assert_eq!(
        err.to_string(),
        "`w` has shape [128] but the graph declares [N, K]"
    );
    // b is declared [N]: a [1, 8] matrix is refused too.
    let err = refused_gemm_bias(
        &s,
        Shape::Matrix(4, 16),
        Shape::Matrix(8, 16),
        Shape::Matrix(1, 8),
    );
    assert!(
        matches!(&err, Error::Shape { tensor, .. } if tensor == "b"),
        "{err}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn shapes_must_agree_with_each_other() {
    let s = stream();
    // K is 16 in x but 24 in w.
    let err = refused_gemm_bias(&s, Shape::Matrix(4, 16), Shape::Matrix(8, 24), Shape::Vector(8));
    assert!(
        matches!(&err, Error::DimMismatch { dim, first_value: 16, second_value: 24, .. } if dim == "K"),
        "{err}"
    );
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

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_output_aliasing_an_input_is_refused() {
    use fusion::cudarc::driver::DevicePtr;
    use std::mem::ManuallyDrop;
    let s = stream();
    let (m, n, k) = (4, 16, 16);
    // One allocation holding x [m, k]; y [m, n] is a second handle on the
    // same memory. The second handle is never dropped (ManuallyDrop, then
    // leak), so the memory is freed once, by `x`; and the wrapper refuses
    // before launching, so nothing writes through it.
    let x = filled(&s, m * k, 0.5);
    let address = {
        let (ptr, _guard) = x.device_ptr(&s);
        ptr
    };
    // SAFETY: `address` is a live allocation of m * k halves (= m * n).
    let mut y = ManuallyDrop::new(unsafe { s.upgrade_device_ptr::<f16>(address, m * n) });
    let (w, b) = (filled(&s, n * k, 0.25), filled(&s, n, 1.0));
    let err = kernels::gemm_bias(
        &s,
        &Tensor::new(&x, [m, k]).unwrap(),
        &Tensor::new(&w, [n, k]).unwrap(),
        &Tensor::new(&b, [n]).unwrap(),
        &mut TensorMut::new(&mut y, [m, n]).unwrap(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::Aliasing { output, input } if output == "y" && input == "x"),
        "{err}"
    );
    assert!(err.to_string().contains("use separate buffers"), "{err}");
    // Partial overlap: y starts halfway into w.
    let w_address = {
        let (ptr, _guard) = w.device_ptr(&s);
        ptr
    };
    let halfway = w_address + (n * k / 2 * size_of::<f16>()) as u64;
    // SAFETY: the first m * n halves after `halfway` lie inside w
    // (n * k / 2 = 128 >= m * n = 64).
    let mut y2 = ManuallyDrop::new(unsafe { s.upgrade_device_ptr::<f16>(halfway, m * n) });
    let err = kernels::gemm_bias(
        &s,
        &Tensor::new(&x, [m, k]).unwrap(),
        &Tensor::new(&w, [n, k]).unwrap(),
        &Tensor::new(&b, [n]).unwrap(),
        &mut TensorMut::new(&mut y2, [m, n]).unwrap(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::Aliasing { input, .. } if input == "w"),
        "{err}"
    );
    // Nothing was written: x and w still hold their values.
    assert!(s.clone_dtoh(&x).unwrap().iter().all(|v| v.to_f32() == 0.5));
    assert!(s.clone_dtoh(&w).unwrap().iter().all(|v| v.to_f32() == 0.25));
    ManuallyDrop::into_inner(y).leak();
    ManuallyDrop::into_inner(y2).leak();
}

/// Run by the GPU suite on its own with `FUSION_FORCE_ARCH` naming a variant
/// that cannot run (see scripts/gpu-suite.sh, step `errors`); without it the
/// test fails, since it would check nothing. The choice itself is tested on the CPU
/// (`fusion::device` tests).
#[test]
#[ignore = "needs a CUDA GPU and FUSION_FORCE_ARCH set to an unusable variant"]
fn a_forced_variant_that_cannot_run_is_refused_by_the_wrapper() {
    let forced = support::forced_arch()
        .expect("run with FUSION_FORCE_ARCH set to a variant that cannot run here (the GPU suite uses sm61)");
    let s = stream();
    let err = gemm_bias(&s, 4, 8, 16).unwrap_err();
    assert!(
        matches!(err, Error::ForcedArch { ref value, .. } if *value == forced),
        "{err}"
    );
    assert!(
        err.to_string()
            .starts_with(&format!("FUSION_FORCE_ARCH={forced}: ")),
        "{err}"
    );
}

/// Needs two GPUs: a primary context is per device, so every stream and
/// allocation on one GPU shares one context, and a mismatch cannot be made
/// there.
#[test]
#[ignore = "needs two CUDA GPUs"]
fn a_tensor_from_another_device_is_refused() {
    use fusion::cudarc::driver::CudaContext;
    let devices = CudaContext::device_count().expect("the driver");
    assert!(
        devices >= 2,
        "this test needs two GPUs, found {devices}: run it on a machine with two"
    );
    let s0 = stream();
    let s1 = CudaContext::new(1).unwrap().new_stream().unwrap();
    let x1 = filled(&s1, 4 * 16, 0.5);
    let (w, b) = (filled(&s0, 8 * 16, 0.25), filled(&s0, 8, 1.0));
    let mut y = filled(&s0, 4 * 8, -7.0);
    let err = kernels::gemm_bias(
        &s0,
        &Tensor::new(&x1, [4, 16]).unwrap(),
        &Tensor::new(&w, [8, 16]).unwrap(),
        &Tensor::new(&b, [8]).unwrap(),
        &mut TensorMut::new(&mut y, [4, 8]).unwrap(),
    )
    .unwrap_err();
    assert!(
        matches!(&err, Error::WrongContext { tensor } if tensor == "x"),
        "{err}"
    );
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_shape_whose_element_count_overflows_matches_no_buffer() {
    let s = stream();
    let x = filled(&s, 8, 0.5);
    // (2^61 + 1) · 8 wraps to 8 in unchecked arithmetic.
    let err = Tensor::new(&x, [(1usize << 61) + 1, 8]).unwrap_err();
    assert!(matches!(err, Error::SizeOverflow { .. }), "{err}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn k_of_zero_is_a_named_error_not_a_launch_failure() {
    let s = stream();
    let err = gemm_bias(&s, 4, 8, 0).unwrap_err();
    assert!(
        matches!(&err, Error::EmptyReduction { tensor, dim } if tensor == "x" && dim == "K"),
        "{err}"
    );
}
