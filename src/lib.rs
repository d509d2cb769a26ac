//! fusion: fused transformer GPU kernels, compiled at build time from
//! dataflow graphs and called as typed, checked Rust functions.
//!
//! | module | what it is |
//! | --- | --- |
//! | [`tensor`] | typed views of device memory that kernels take |
//! | [`device`] | which compiled kernel variant runs on a GPU |
//! | [`error`] | every way a call can be refused |
//! | [`kernels`] | the built-in kernels compiled from `graphs/` (feature `kernels`) |
//! | `candle` | fused graphs called on candle's CUDA tensors, in place (feature `candle`) |
//! | [`testing`] | checking kernels on a GPU against the CPU reference (feature `testing`) |
//! | [`vendor`] | cuBLASLt, loaded at run time, where the guard sends a GEMM (feature `cublaslt`) |
//! | [`weights`] | tensors from safetensors files, checked against a graph |
//!
//! The compiler itself (parsing, planning, code generation) is
//! [`fusion_compiler`], re-exported as [`core`]. Without the feature
//! `testing` it is only the part the run time and generated wrappers read:
//! the IR, the GPU generations and the weight names; with the default
//! features the crate depends on it, cudarc, half, thiserror, safetensors,
//! serde_json (which reads a safetensors file's header) and the
//! `fusion_graph!` macro alone. The `fusion` command line (plan, bench,
//! tune, run) is the crate fusion-cli.

// Generated wrappers name this crate `fusion::`, also from inside it.
extern crate self as fusion;

#[doc(hidden)]
pub mod abi;
#[cfg(feature = "candle")]
pub mod candle;
pub mod device;
pub mod error;
#[cfg(feature = "kernels")]
pub mod kernels;
#[doc(hidden)]
pub mod launch;
#[doc(hidden)]
pub mod plan;
pub mod tensor;
#[cfg(feature = "testing")]
pub mod testing;
pub mod vendor;
pub mod weights;

pub use device::Arch;
pub use error::{Error, Result};
pub use fusion_compiler as core;
pub use fusion_compiler::ir;
/// Declares a graph in Rust source; its kernels are compiled by the crate's
/// build script (`fusion_compiler::build::Builder::sources`).
pub use fusion_macros::fusion_graph;
pub use launch::{SharedWorkspace, Workspace};
pub use tensor::{Element, Shape, Tensor, TensorMut};
pub use weights::{BoundWeights, TensorFile, TensorNames};

/// Re-exported so that users and generated code name the same version.
pub use cudarc;
pub use half;
