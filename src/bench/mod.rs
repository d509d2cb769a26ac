//! `fusion bench`: fused kernels against the best vendor path, timed in one
//! process on the same inputs.

pub mod cublaslt;
pub mod timing;
