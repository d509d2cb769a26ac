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
//!
//! # Generated graph structs
//!
//! A build script (`fusion_compiler::build::Builder`) or `fusion_graph!`
//! turns each graph into a struct named after it and a `<Name>Weights`
//! struct of its weights (a graph without weights gets the first alone;
//! [`kernels`] holds those of the built-in graphs). Each item's own
//! documentation shows the graph's arguments and its fusion plan; what is
//! the same for every graph is said here once.
//!
//! ## Binding weights
//!
//! `Name::new(stream, weights)` checks each weight's shape (static dims
//! against the declaration, shared dims against each other) and that it
//! lives on `stream`'s device, and computes once what later calls need from
//! the weights alone: a norm followed by a GEMM whose gamma, beta and
//! weight are all bound is folded into a copy of that weight, a gated
//! pair's two weights are interleaved into one, and a plain weight whose
//! rows are not a multiple of 128 bytes is copied with its rows padded to
//! that on sm90 (where such rows read slower; at most an eighth more per
//! row; `FUSION_PAD_WEIGHTS=0` turns it off). Each copy replaces the
//! weights it was made from: the struct keeps only what its kernels read
//! ([`BoundWeights`]), and drops an owned weight once its copy exists (a
//! borrowed one is no longer referenced). `new` returns once that work is
//! done. `Name::from_safetensors` reads and binds the weights one kernel at
//! a time instead.
//!
//! ## Threads and memory
//!
//! A struct is `Send` and `Sync`: it owns nothing but device buffers. Every
//! call takes the intermediates and the kernels' scratch from one workspace
//! ([`SharedWorkspace`]), grown when a call needs more, never while the
//! stream is being captured into a CUDA graph (run once, or
//! `reserve_workspace`, before capturing). It is the struct's own unless
//! `with_workspace` gave it one to share: structs called one after another
//! on a stream, such as the layers of a model, share one, as large as the
//! largest call needs (`workspace_bytes` says what a call of M rows needs).
//! A call locks the workspace while it enqueues its kernels, so calls
//! sharing it take turns; `run` takes `&mut self`, and to run one graph
//! from several threads at the same time, give each thread its own struct.
//! Calls on different streams or from different threads are ordered: each
//! records an event on its stream after its launches, and the next call
//! elsewhere makes its stream wait for it before it uses the workspace. The
//! workspace is freed with its last holder, after the last call that used
//! it.
//!
//! ## Free functions
//!
//! A graph of one kernel also gets a function named after it, which takes
//! every tensor, weights included, with each call. What the struct
//! computes once when it binds the weights then runs on every call: a norm
//! folds into no weight (A is normalized into the scratch first) and a
//! gated pair's two weights are written interleaved into the scratch first
//! (2 N K elements, more than the GEMM itself reads at small M). The
//! kernel's scratch comes from a workspace kept per `Arc<CudaStream>`
//! (clones share it), grown when a call needs more and reused after that;
//! it is freed after the stream is dropped. It is never grown while the
//! stream is being captured into a CUDA graph: call once before capturing.

#![warn(missing_docs)]

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
mod route_model;
mod shape_memo;
#[doc(hidden)]
pub mod shell;
pub mod tensor;
#[cfg(feature = "testing")]
pub mod testing;
mod tile_model;
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
