//! [`HostTensor`]: a row-major array of f64 on the host, with conversions
//! from and to the dtypes kernels use and random draws rounded to them.

use super::ReferenceError;
use crate::ir::DType;
use half::{bf16, f16};
use rand::Rng;

/// A row-major array of f64. `data.len()` is the product of `shape`; the
/// constructors check it, and so does every function that takes a tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct HostTensor {
    /// Its shape, outermost axis first.
    pub shape: Vec<usize>,
    /// Its values, row-major.
    pub data: Vec<f64>,
}

/// The number of elements of a shape (1 for a scalar's empty shape).
pub(super) fn element_count(shape: &[usize]) -> usize {
    shape.iter().product()
}

impl HostTensor {
    /// A tensor from values already in row-major order.
    pub fn new(shape: &[usize], data: Vec<f64>) -> Result<HostTensor, ReferenceError> {
        let tensor = HostTensor {
            shape: shape.to_vec(),
            data,
        };
        tensor.check_len()?;
        Ok(tensor)
    }

    /// A tensor of `shape` filled with 0.
    pub fn zeros(shape: &[usize]) -> HostTensor {
        HostTensor {
            shape: shape.to_vec(),
            data: vec![0.0; element_count(shape)],
        }
    }

    /// Errs unless `data` holds exactly as many values as `shape` says.
    pub fn check_len(&self) -> Result<(), ReferenceError> {
        let expected = element_count(&self.shape);
        if self.data.len() != expected {
            return Err(ReferenceError::DataLength {
                shape: self.shape.clone(),
                expected,
                got: self.data.len(),
            });
        }
        Ok(())
    }

    /// A tensor of f16 values, widened exactly.
    pub fn from_f16(shape: &[usize], values: &[f16]) -> Result<HostTensor, ReferenceError> {
        HostTensor::new(shape, values.iter().map(|v| v.to_f64()).collect())
    }

    /// A tensor of bf16 values, widened exactly.
    pub fn from_bf16(shape: &[usize], values: &[bf16]) -> Result<HostTensor, ReferenceError> {
        HostTensor::new(shape, values.iter().map(|v| v.to_f64()).collect())
    }

    /// A tensor of f32 values, widened exactly.
    pub fn from_f32(shape: &[usize], values: &[f32]) -> Result<HostTensor, ReferenceError> {
        HostTensor::new(shape, values.iter().map(|&v| f64::from(v)).collect())
    }

    /// Each value rounded to the nearest f16 (ties to even), straight from
    /// f64 so there is no double rounding through f32.
    pub fn to_f16(&self) -> Vec<f16> {
        self.data.iter().map(|&v| f16::from_f64(v)).collect()
    }

    /// Each value rounded to the nearest bf16 (ties to even).
    pub fn to_bf16(&self) -> Vec<bf16> {
        self.data.iter().map(|&v| bf16::from_f64(v)).collect()
    }

    /// Each value rounded to the nearest f32.
    pub fn to_f32(&self) -> Vec<f32> {
        self.data.iter().map(|&v| v as f32).collect()
    }

    /// A tensor of E4M3 codes (the stored values of an FP8 tensor, before
    /// its scale), widened exactly.
    pub fn from_f8e4m3(shape: &[usize], codes: &[u8]) -> Result<HostTensor, ReferenceError> {
        HostTensor::new(shape, codes.iter().map(|&c| super::fp8::e4m3_to_f64(c)).collect())
    }

    /// Each value as the E4M3 code nearest it (ties to even, saturating to
    /// ±448; see [`super::fp8`]).
    pub fn to_f8e4m3(&self) -> Vec<u8> {
        self.data.iter().map(|&v| super::fp8::e4m3_from_f64(v)).collect()
    }

    /// The same tensor with every value rounded to `dtype` (and kept in f64,
    /// where every f16, bf16, f32 and E4M3 value is exact).
    pub fn rounded_to(&self, dtype: DType) -> HostTensor {
        HostTensor {
            shape: self.shape.clone(),
            data: self.data.iter().map(|&v| round_to(dtype, v)).collect(),
        }
    }

    /// Values drawn uniformly from [-1, 1] and rounded to `dtype`: the range
    /// of normalised transformer activations. For a weight, scale the range
    /// by 1/√fan-in with [`HostTensor::random_uniform`].
    pub fn random<R: Rng + ?Sized>(dtype: DType, shape: &[usize], rng: &mut R) -> HostTensor {
        HostTensor::random_uniform(dtype, shape, -1.0, 1.0, rng)
            .expect("[-1, 1] is a valid range for every dtype")
    }

    /// Values drawn uniformly from `[lo, hi]` and each rounded to `dtype`, so
    /// that a kernel fed `to_f16()` (or `to_bf16()`, `to_f32()`) sees exactly
    /// the values this tensor holds. The values lie in `[lo, hi]` with the
    /// bounds themselves rounded to `dtype`: a bound the dtype cannot hold
    /// may be passed by less than one of its steps.
    pub fn random_uniform<R: Rng + ?Sized>(
        dtype: DType,
        shape: &[usize],
        lo: f64,
        hi: f64,
        rng: &mut R,
    ) -> Result<HostTensor, ReferenceError> {
        let invalid = |reason: &str| ReferenceError::InvalidRange {
            dtype,
            lo,
            hi,
            reason: reason.to_string(),
        };
        if !(lo.is_finite() && hi.is_finite()) {
            return Err(invalid("both bounds must be finite numbers"));
        }
        if lo > hi {
            return Err(invalid("the lower bound is above the upper bound"));
        }
        if !(hi - lo).is_finite() {
            return Err(invalid("the range is wider than the largest f64"));
        }
        // E4M3 saturates rather than overflowing to infinity.
        let beyond_fp8 = dtype.is_fp8() && lo.abs().max(hi.abs()) > super::fp8::E4M3_MAX;
        if beyond_fp8 || !(round_to(dtype, lo).is_finite() && round_to(dtype, hi).is_finite()) {
            return Err(invalid("a bound is beyond the dtype's largest finite value"));
        }
        let data = (0..element_count(shape))
            .map(|_| round_to(dtype, rng.random_range(lo..=hi)))
            .collect();
        Ok(HostTensor {
            shape: shape.to_vec(),
            data,
        })
    }

    /// The size of the first axis (1 for a scalar).
    pub fn rows(&self) -> usize {
        self.shape.first().copied().unwrap_or(1)
    }

    /// The number of values in one row: the product of every axis but the
    /// first.
    pub fn row_len(&self) -> usize {
        self.shape.iter().skip(1).product()
    }

    /// Row `i` (along the first axis), if there is one.
    pub fn row(&self, i: usize) -> Option<&[f64]> {
        if self.shape.is_empty() || i >= self.rows() {
            return None;
        }
        let len = self.row_len();
        self.data.get(i * len..(i + 1) * len)
    }

    /// A new tensor of the given rows (along the first axis), in the order
    /// given; repeats are allowed. Use it to pick out of a GPU result the
    /// rows that [`evaluate_rows`](super::evaluate_rows) computed.
    pub fn select_rows(&self, rows: &[usize]) -> Result<HostTensor, ReferenceError> {
        self.check_len()?;
        let (count, len) = (self.rows(), self.row_len());
        let mut data = Vec::with_capacity(rows.len() * len);
        for &r in rows {
            let row = self.row(r).ok_or(ReferenceError::RowOutOfRange {
                row: r,
                dim: "the first axis".to_string(),
                rows: count,
            })?;
            data.extend_from_slice(row);
        }
        let mut shape = self.shape.clone();
        if let Some(first) = shape.first_mut() {
            *first = rows.len();
        }
        Ok(HostTensor { shape, data })
    }
}

/// `v` rounded to the nearest value of `dtype`, returned as the f64 that
/// holds it exactly.
pub(super) fn round_to(dtype: DType, v: f64) -> f64 {
    match dtype {
        DType::F16 => f16::from_f64(v).to_f64(),
        DType::BF16 => bf16::from_f64(v).to_f64(),
        DType::F32 => f64::from(v as f32),
        DType::F8E4M3 => super::fp8::round_to_e4m3(v),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn constructors_check_the_length() {
        let err = HostTensor::from_f32(&[2, 3], &[1.0; 5]).unwrap_err();
        assert_eq!(
            err,
            ReferenceError::DataLength {
                shape: vec![2, 3],
                expected: 6,
                got: 5
            }
        );
        assert!(err.to_string().contains("holds 6 values, but 5 were given"));
        assert!(HostTensor::from_f16(&[2], &[f16::ONE; 3]).is_err());
        assert!(HostTensor::from_bf16(&[4], &[bf16::ONE; 4]).is_ok());
        assert!(HostTensor::from_f8e4m3(&[4], &[0x38; 3]).is_err());
    }

    #[test]
    fn e4m3_codes_convert_both_ways() {
        let t = HostTensor::from_f8e4m3(&[4], &[0x38, 0xB8, 0x7E, 0x01]).unwrap();
        assert_eq!(t.data, vec![1.0, -1.0, 448.0, 2f64.powi(-9)]);
        assert_eq!(t.to_f8e4m3(), vec![0x38, 0xB8, 0x7E, 0x01]);
        // 1.0625 is a tie between 1 and 1.125: 1 (even); 500 saturates.
        let wide = HostTensor::new(&[2], vec![1.0625, 500.0]).unwrap();
        assert_eq!(wide.to_f8e4m3(), vec![0x38, 0x7E]);
        assert_eq!(wide.rounded_to(DType::F8E4M3).data, vec![1.0, 448.0]);
    }

    #[test]
    fn conversions_round_to_nearest() {
        // 1 + 2^-11 is halfway between the f16 values 1 and 1 + 2^-10; ties
        // go to the even one, 1. 1 + 3·2^-12 is nearer 1 + 2^-10.
        let t = HostTensor::new(&[2], vec![1.0 + 2f64.powi(-11), 1.0 + 3.0 * 2f64.powi(-12)]).unwrap();
        let h = t.to_f16();
        assert_eq!(h[0].to_f64(), 1.0);
        assert_eq!(h[1].to_f64(), 1.0 + 2f64.powi(-10));
        // bf16 keeps 8 significant bits, so its step at 1 is 2^-7: 1 + 2^-8
        // is a tie and goes to 1; 1 + 3·2^-9 is nearer 1 + 2^-7.
        let b = HostTensor::new(&[2], vec![1.0 + 2f64.powi(-8), 1.0 + 3.0 * 2f64.powi(-9)])
            .unwrap()
            .to_bf16();
        assert_eq!(b[0].to_f64(), 1.0);
        assert_eq!(b[1].to_f64(), 1.0 + 2f64.powi(-7));
        assert_eq!(t.rounded_to(DType::F16).data, vec![1.0, 1.0 + 2f64.powi(-10)]);
    }

    #[test]
    fn random_values_are_in_range_and_representable() {
        let mut rng = StdRng::seed_from_u64(7);
        for dtype in DType::ALL {
            let t = HostTensor::random_uniform(dtype, &[16, 9], -0.5, 0.25, &mut rng).unwrap();
            assert_eq!(t.data.len(), 144);
            assert!(t.data.iter().all(|&v| (-0.5..=0.25).contains(&v)));
            assert_eq!(t.rounded_to(dtype), t, "{dtype} values must already be rounded");
            // Not all equal: the draw is random.
            assert!(t.data.iter().any(|&v| v != t.data[0]));
        }
    }

    #[test]
    fn bad_ranges_are_errors() {
        let mut rng = StdRng::seed_from_u64(1);
        for (lo, hi) in [
            (1.0, -1.0),
            (f64::NAN, 1.0),
            (0.0, f64::INFINITY),
            (-f64::MAX, f64::MAX),
        ] {
            assert!(HostTensor::random_uniform(DType::F32, &[2], lo, hi, &mut rng).is_err());
        }
        let err = HostTensor::random_uniform(DType::F16, &[2], 0.0, 70000.0, &mut rng).unwrap_err();
        assert!(err.to_string().contains("largest finite value"), "{err}");
        // E4M3 saturates at 448 instead of overflowing: the bound is checked.
        let err = HostTensor::random_uniform(DType::F8E4M3, &[2], -500.0, 0.0, &mut rng).unwrap_err();
        assert!(err.to_string().contains("largest finite value"), "{err}");
        assert!(HostTensor::random_uniform(DType::F8E4M3, &[2], -448.0, 448.0, &mut rng).is_ok());
        // A single point is a valid range.
        let t = HostTensor::random_uniform(DType::F16, &[3], 0.5, 0.5, &mut rng).unwrap();
        assert_eq!(t.data, vec![0.5; 3]);
    }

    #[test]
    fn select_rows_picks_and_reorders() {
        let t = HostTensor::new(&[3, 2], vec![0.0, 1.0, 10.0, 11.0, 20.0, 21.0]).unwrap();
        let s = t.select_rows(&[2, 0, 2]).unwrap();
        assert_eq!(s.shape, vec![3, 2]);
        assert_eq!(s.data, vec![20.0, 21.0, 0.0, 1.0, 20.0, 21.0]);
        assert!(matches!(
            t.select_rows(&[3]),
            Err(ReferenceError::RowOutOfRange { row: 3, rows: 3, .. })
        ));
    }
}
