//! Comparing a computed tensor with the reference. A NaN or an infinity in
//! either, or a shape mismatch, gives an infinite error, so a test with any
//! finite tolerance fails on it.

use super::tensor::HostTensor;

/// True when the two tensors can be compared value by value at all.
fn comparable(got: &HostTensor, want: &HostTensor) -> bool {
    got.shape == want.shape
        && got.data.len() == want.data.len()
        && got.data.iter().chain(&want.data).all(|v| v.is_finite())
}

/// ‖got − want‖₂ / ‖want‖₂. Infinite when the shapes differ or any value
/// is NaN or infinite; when `want` is all zeros, 0 if `got` is too and
/// infinite otherwise.
pub fn relative_error(got: &HostTensor, want: &HostTensor) -> f64 {
    if !comparable(got, want) {
        return f64::INFINITY;
    }
    let (diff_sq, want_sq) = got
        .data
        .iter()
        .zip(&want.data)
        .fold((0.0, 0.0), |(d, w), (&g, &t)| (d + (g - t) * (g - t), w + t * t));
    if want_sq == 0.0 {
        return if diff_sq == 0.0 { 0.0 } else { f64::INFINITY };
    }
    (diff_sq / want_sq).sqrt()
}

/// max |got − want| over all elements. Infinite when the shapes differ or
/// any value is NaN or infinite; 0 for empty tensors.
pub fn max_abs_error(got: &HostTensor, want: &HostTensor) -> f64 {
    if !comparable(got, want) {
        return f64::INFINITY;
    }
    got.data
        .iter()
        .zip(&want.data)
        .map(|(g, t)| (g - t).abs())
        .fold(0.0, f64::max)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(data: &[f64]) -> HostTensor {
        HostTensor::new(&[data.len()], data.to_vec()).unwrap()
    }

    #[test]
    fn relative_error_is_the_norm_ratio() {
        // diff = [0, 0, 1], ‖diff‖ = 1; want = [3, 4, 0], ‖want‖ = 5.
        assert_eq!(relative_error(&t(&[3.0, 4.0, 1.0]), &t(&[3.0, 4.0, 0.0])), 0.2);
        assert_eq!(max_abs_error(&t(&[3.0, 4.5, 1.0]), &t(&[3.0, 4.0, 0.0])), 1.0);
        assert_eq!(relative_error(&t(&[1.0, 2.0]), &t(&[1.0, 2.0])), 0.0);
    }

    #[test]
    fn anything_not_comparable_is_infinite() {
        let want = t(&[1.0, 2.0]);
        assert_eq!(relative_error(&t(&[1.0, f64::NAN]), &want), f64::INFINITY);
        assert_eq!(relative_error(&t(&[f64::INFINITY, 2.0]), &want), f64::INFINITY);
        assert_eq!(max_abs_error(&t(&[f64::NAN, 2.0]), &want), f64::INFINITY);
        assert_eq!(relative_error(&t(&[1.0, 2.0, 3.0]), &want), f64::INFINITY);
        let reshaped = HostTensor::new(&[2, 1], vec![1.0, 2.0]).unwrap();
        assert_eq!(relative_error(&reshaped, &want), f64::INFINITY);
        assert_eq!(max_abs_error(&reshaped, &want), f64::INFINITY);
    }

    #[test]
    fn zero_reference() {
        let zeros = t(&[0.0, 0.0]);
        assert_eq!(relative_error(&zeros, &zeros), 0.0);
        assert_eq!(relative_error(&t(&[0.0, 1e-30]), &zeros), f64::INFINITY);
    }
}
