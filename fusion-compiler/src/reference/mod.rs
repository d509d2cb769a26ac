//! The CPU reference interpreter: evaluates an [`ir::Graph`](crate::ir::Graph)
//! in f64, the oracle every GPU correctness test compares against.
//!
//! It favours being obviously right over being fast, but is parallel enough
//! (rayon over row blocks and column tiles) to check large shapes, and can
//! evaluate a sample of rows ([`evaluate_rows`]) so that an 8192-row product
//! is checked without computing all of it.
//!
//! Every value is computed in f64 from inputs as given: nothing is rounded to
//! the graph's dtypes between ops, unless [`evaluate_rows_with`] is asked to
//! model a kernel that stores an intermediate in its element type
//! ([`Intermediates`]: a norm's output before the GEMM that reads it, as a
//! norm GEMM whose norm is not folded computes it). Inputs drawn with [`HostTensor::random`]
//! are already rounded to their dtype, so the GPU and the CPU start from the
//! same numbers and differ only by the GPU's own rounding.
//!
//! An FP8 tensor's binding holds its stored E4M3 values
//! ([`HostTensor::from_f8e4m3`]); a matmul that reads it multiplies each by
//! the tensor's scale (one value, or one per output column) and sums the
//! products in f64, as it sums any other. [`fp8`] holds the encoding and
//! its rounding (to nearest even, saturating to ±448).
//!
//! ```
//! use fusion_compiler::ir::{DType, GraphBuilder, WeightLayout};
//! use fusion_compiler::reference::{evaluate, evaluate_rows, random_bindings, relative_error};
//! use rand::SeedableRng;
//!
//! let mut b = GraphBuilder::new("proj");
//! let m = b.dynamic_dim("M").unwrap();
//! let d = b.static_dim("D", 32).unwrap();
//! let x = b.input("x", DType::F16, &[m, d]).unwrap();
//! let w = b.weight("w", DType::F16, &[d, d]).unwrap();
//! let y = b.matmul(x, w, WeightLayout::NK).unwrap();
//! let y = b.gelu(y).unwrap();
//! b.output("y", y).unwrap();
//! let graph = b.build().unwrap();
//!
//! let mut rng = rand::rngs::StdRng::seed_from_u64(0);
//! // Every input and weight, drawn and rounded to f16; feed `to_f16()` of
//! // each to the kernel under test.
//! let inputs = random_bindings(&graph, &[("M", 100)], &mut rng).unwrap();
//! let want = evaluate(&graph, &inputs).unwrap();
//! // Or only a sample of rows, for products too large to compute whole.
//! let rows = [0, 57, 99];
//! let sample = evaluate_rows(&graph, &inputs, &rows).unwrap();
//! let same_rows = want["y"].select_rows(&rows).unwrap();
//! assert_eq!(relative_error(&sample["y"], &same_rows), 0.0);
//! ```
//!
//! | module | what it holds |
//! | --- | --- |
//! | `tensor` | [`HostTensor`]: a row-major f64 array, dtype conversions, random draws |
//! | `kernels` | each op in f64: matmul, norms, activations, `erf` |
//! | `eval` | binding inputs by name, inferring dynamic dims, running the ops |
//! | `compare` | [`relative_error`] and [`max_abs_error`] |
//! | [`fp8`] | E4M3 codes, rounding to them, scales |

mod compare;
mod eval;
pub mod fp8;
mod kernels;
mod tensor;

pub use crate::ir::ops::{gelu_erf, gelu_tanh, silu};
pub use compare::{max_abs_error, relative_error};
pub use eval::{Intermediates, evaluate, evaluate_all, evaluate_rows, evaluate_rows_with, random_bindings};
pub use kernels::erf;
pub use tensor::HostTensor;

use crate::ir::DType;
use indexmap::IndexMap;
use std::collections::HashMap;
use thiserror::Error;

/// The graph's inputs and weights, by their declared names.
pub type Bindings = HashMap<String, HostTensor>;

/// Computed tensors by name, in the graph's order (declaration order for
/// outputs, op order for [`evaluate_all`]).
pub type Outputs = IndexMap<String, HostTensor>;

/// Why a graph could not be evaluated, or a tensor could not be made.
#[derive(Clone, Debug, PartialEq, Error)]
pub enum ReferenceError {
    /// A declared input or weight was not given.
    #[error("`{name}` is an input or weight of graph `{graph}` but was not given")]
    MissingInput {
        /// The graph's name.
        graph: String,
        /// The tensor's name.
        name: String,
    },

    /// A tensor was given that the graph does not take.
    #[error("`{name}` was given but is not an input or weight of graph `{graph}`; it has: {expected}")]
    UnexpectedInput {
        /// The graph's name.
        graph: String,
        /// The name given.
        name: String,
        /// The names the graph does take, comma-separated.
        expected: String,
    },

    /// A tensor's shape is not the declared one.
    #[error("`{name}` has shape [{got}] but graph `{graph}` declares it as [{expected}]")]
    WrongShape {
        /// The graph's name.
        graph: String,
        /// The tensor's name.
        name: String,
        /// The declared shape, dynamic dims by name: `M, 4096`.
        expected: String,
        /// The shape given.
        got: String,
    },

    /// Two tensors give a dynamic dim different sizes.
    #[error(
        "dynamic dim `{dim}` disagrees across inputs: it is {first_size} in `{first_tensor}` but {second_size} in `{second_tensor}`"
    )]
    DimsDisagree {
        /// The dim's name.
        dim: String,
        /// The first tensor that set it.
        first_tensor: String,
        /// The size that tensor gave it.
        first_size: usize,
        /// A later tensor that disagrees.
        second_tensor: String,
        /// The size that tensor gives it.
        second_size: usize,
    },

    /// A row was asked for beyond the tensors' rows.
    #[error("row {row} is out of range: dim `{dim}` has {rows} rows")]
    RowOutOfRange {
        /// The row asked for.
        row: usize,
        /// The dim that counts rows.
        dim: String,
        /// Its size.
        rows: usize,
    },

    /// Rows were selected in a graph whose rows depend on each other.
    #[error("cannot evaluate selected rows of graph `{graph}`: {reason}")]
    NotRowLocal {
        /// The graph's name.
        graph: String,
        /// Why its rows are not independent.
        reason: String,
    },

    /// A tensor's values do not fill its shape.
    #[error("a tensor of shape {shape:?} holds {expected} values, but {got} were given")]
    DataLength {
        /// The shape.
        shape: Vec<usize>,
        /// How many values it holds.
        expected: usize,
        /// How many were given.
        got: usize,
    },

    /// Random values cannot be drawn from a range.
    #[error("cannot draw {dtype} values uniformly from [{lo}, {hi}]: {reason}")]
    InvalidRange {
        /// The element type to draw.
        dtype: DType,
        /// The range's lower end.
        lo: f64,
        /// Its upper end.
        hi: f64,
        /// What is wrong with it.
        reason: String,
    },

    /// A dynamic dim that no tensor sizes was given no size.
    #[error("dynamic dim `{dim}` of graph `{graph}` needs a size")]
    MissingDimSize {
        /// The graph's name.
        graph: String,
        /// The dim's name.
        dim: String,
    },

    /// A size was given for a name that is not a dynamic dim.
    #[error("`{dim}` is not a dynamic dim of graph `{graph}`")]
    UnknownDim {
        /// The graph's name.
        graph: String,
        /// The name given.
        dim: String,
    },
}
