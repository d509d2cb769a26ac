//! fusion-cli: the `fusion` command line. [`fusion`] is the run time a
//! program links; this crate is the tool beside it, which plans, renders,
//! benchmarks, tunes and runs graphs.
//!
//! | module | what it is |
//! | --- | --- |
//! | [`bench`](mod@bench) | `fusion bench`: fused kernels against cuBLASLt (feature `kernels`) |
//! | [`cli`] | the `fusion` command line |
//! | [`render`] | `fusion render`: units of a candidate list, with the kernel self-test |
//! | [`run`](mod@run) | `fusion run`: a TOML graph on tensors from safetensors files (feature `kernels`) |
//! | [`table`] | a plan built at run time as the run time's executor's table, for `run` and `tune` (feature `kernels`) |
//! | [`tune`] | `fusion tune`: candidate tile configs compiled, checked and timed (feature `kernels`) |
//!
//! The feature `kernels` (default) builds fusion's shipped graphs
//! (`fusion::kernels`), which the bench times and whose launcher ABI the
//! tuner and `fusion run` call. Without it the build runs no nvcc, and the
//! binary plans and renders graphs, writes them from Hugging Face configs
//! and lists tuning candidates.

#![warn(missing_docs)]

#[cfg(feature = "kernels")]
pub mod bench;
pub mod cli;
pub mod render;
#[cfg(feature = "kernels")]
pub mod run;
#[cfg(feature = "kernels")]
pub mod table;
#[cfg(feature = "kernels")]
pub mod tune;
