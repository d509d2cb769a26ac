//! fusion: fused transformer GPU kernels, compiled at build time.
pub use fusion_core as core;

pub mod cli;
