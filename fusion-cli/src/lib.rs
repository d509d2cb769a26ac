//! fusion-cli: the `fusion` command line, beside the run-time crate
//! [`fusion`] as a code generator's tool sits beside its library.
//!
//! | module | what it is |
//! | --- | --- |
//! | [`bench`](mod@bench) | `fusion bench`: fused kernels against cuBLASLt (feature `kernels`) |
//! | [`cli`] | the `fusion` command line |
//! | [`render`] | `fusion render`: units of a candidate list, with the kernel self-test |
//! | [`run`](mod@run) | `fusion run`: a TOML graph on tensors from safetensors files (feature `kernels`) |
//! | [`tune`] | `fusion tune`: candidate tile configs compiled, checked and timed (feature `kernels`) |
//!
//! The feature `kernels` (default) builds fusion's shipped graphs
//! (`fusion::kernels`), which the bench times and whose launcher ABI the
//! tuner and `fusion run` call; without it the binary plans, renders and
//! draws graphs and runs no nvcc at build time.

#[cfg(feature = "kernels")]
pub mod bench;
pub mod cli;
pub mod render;
#[cfg(feature = "kernels")]
pub mod run;
#[cfg(feature = "kernels")]
pub mod tune;
