//! Checking kernels on a GPU against the CPU reference: what the GPU tests
//! and the examples share. Host values become device values of an element
//! type, outputs are poisoned with NaN before a call so that an unwritten
//! element fails the comparison, and large outputs are checked on a sample
//! of rows (the reference is row-local, so sampled rows are checked exactly).

use crate::tensor::{Element, Shape};
use cudarc::driver::{CudaContext, ValidAsZeroBits};
use fusion_core::ir::{DType, Graph};
use fusion_core::reference::{HostTensor, ReferenceError};
use half::{bf16, f16};
use rand::Rng;
use std::path::Path;
use std::sync::Arc;

/// Largest relative error a f16/bf16 result may have against the f64 reference.
pub const TOLERANCE: f64 = 1e-2;

/// Rows of a large output compared against the reference.
pub const SAMPLED_ROWS: usize = 48;

/// The context of GPU `ordinal`, or a sentence starting "no CUDA device: "
/// saying why there is none. cudarc panics when the driver library is
/// missing; this checks for it first.
pub fn open_gpu(ordinal: usize) -> Result<Arc<CudaContext>, String> {
    // SAFETY: only tries to load the driver library, then drops it.
    let driver_present = unsafe { cudarc::driver::sys::is_culib_present() };
    if !driver_present {
        return Err("no CUDA device: the CUDA driver library (libcuda.so) is not installed".into());
    }
    CudaContext::new(ordinal).map_err(|e| format!("no CUDA device: GPU {ordinal}: {e}"))
}

/// An element type whose values can be made from, and read back into, the
/// reference's host tensors.
pub trait HostElement: Element + Default + ValidAsZeroBits {
    /// The value outputs are filled with before a call.
    const NAN: Self;
    /// `t`'s values rounded to this type, row-major.
    fn encode(t: &HostTensor) -> Vec<Self>;
    /// A host tensor of `shape` holding `values`.
    fn decode(shape: &[usize], values: &[Self]) -> Result<HostTensor, ReferenceError>;
}

impl HostElement for f16 {
    const NAN: f16 = f16::NAN;
    fn encode(t: &HostTensor) -> Vec<f16> {
        t.to_f16()
    }
    fn decode(shape: &[usize], values: &[f16]) -> Result<HostTensor, ReferenceError> {
        HostTensor::from_f16(shape, values)
    }
}

impl HostElement for bf16 {
    const NAN: bf16 = bf16::NAN;
    fn encode(t: &HostTensor) -> Vec<bf16> {
        t.to_bf16()
    }
    fn decode(shape: &[usize], values: &[bf16]) -> Result<HostTensor, ReferenceError> {
        HostTensor::from_bf16(shape, values)
    }
}

/// The graph in the TOML file at `path` with every tensor re-typed to
/// `dtype` (the shipped graphs are written in f16).
/// Where the shipped `graphs/*.toml` are: `FUSION_GRAPHS_DIR` when a binary
/// runs away from its checkout (a bundle copied to a GPU machine), else the
/// checkout's `graphs/`.
pub fn graphs_dir() -> std::path::PathBuf {
    std::env::var_os("FUSION_GRAPHS_DIR").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("graphs"),
        Into::into,
    )
}

pub fn load_graph_as(path: &Path, dtype: DType) -> Result<Graph, String> {
    let mut graph = fusion_core::load_toml_graph(path)?;
    for tensor in &mut graph.tensors {
        tensor.dtype = dtype;
    }
    Ok(graph)
}

/// The device shape of a host tensor; `None` for ranks other than 1 and 2.
pub fn shape_of(t: &HostTensor) -> Option<Shape> {
    match t.shape[..] {
        [n] => Some(Shape::Vector(n)),
        [rows, cols] => Some(Shape::Matrix(rows, cols)),
        _ => None,
    }
}

/// The rows of an `m`-row output to compare: all of them when there are
/// few, else [`SAMPLED_ROWS`] at most, always including the first and the
/// last (where tile edges are), sorted and distinct.
pub fn rows_to_check<R: Rng + ?Sized>(m: usize, rng: &mut R) -> Vec<usize> {
    if m <= SAMPLED_ROWS * 2 {
        return (0..m).collect();
    }
    let mut rows: Vec<usize> = (0..SAMPLED_ROWS - 2)
        .map(|_| rng.random_range(0..m))
        .chain([0, m - 1])
        .collect();
    rows.sort_unstable();
    rows.dedup();
    rows
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::StdRng;

    #[test]
    fn small_outputs_are_checked_whole() {
        let mut rng = StdRng::seed_from_u64(1);
        assert_eq!(rows_to_check(0, &mut rng), Vec::<usize>::new());
        assert_eq!(rows_to_check(5, &mut rng), vec![0, 1, 2, 3, 4]);
        assert_eq!(rows_to_check(96, &mut rng).len(), 96);
    }

    #[test]
    fn large_outputs_are_sampled_with_both_ends() {
        let mut rng = StdRng::seed_from_u64(2);
        let rows = rows_to_check(100_000, &mut rng);
        assert!(rows.len() <= SAMPLED_ROWS && rows.len() > 2);
        assert_eq!(rows.first(), Some(&0));
        assert_eq!(rows.last(), Some(&99_999));
        assert!(rows.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn host_values_survive_a_round_trip() {
        let t = HostTensor::new(&[2, 2], vec![0.5, -1.0, 2.0, 0.25]).unwrap();
        let back = f16::decode(&t.shape, &f16::encode(&t)).unwrap();
        assert_eq!(back.data, t.data);
        let back = bf16::decode(&t.shape, &bf16::encode(&t)).unwrap();
        assert_eq!(back.data, t.data);
        assert!(f16::decode(&[3], &f16::encode(&t)).is_err());
    }

    #[test]
    fn shapes_follow_rank() {
        let v = HostTensor::zeros(&[4]);
        let m = HostTensor::zeros(&[2, 3]);
        let cube = HostTensor::zeros(&[1, 2, 3]);
        assert_eq!(shape_of(&v), Some(Shape::Vector(4)));
        assert_eq!(shape_of(&m), Some(Shape::Matrix(2, 3)));
        assert_eq!(shape_of(&cube), None);
    }
}
