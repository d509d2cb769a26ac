//! The built-in kernels: one item per graph in `graphs/`, generated at build
//! time. Each graph has a struct that binds its weights once
//! (`SwigluFfn::new(&stream, SwigluFfnWeights { .. })?.run(&stream, &x,
//! &mut y)`) and, when it is a single kernel, a function that takes every
//! tensor with each call (`kernels::gemm_bias_gelu(&stream, &x, &w, &b, &mut
//! y)`). Every item's documentation shows the graph's arguments and its
//! fusion plan.

include!(concat!(env!("OUT_DIR"), "/fusion_kernels.rs"));

/// The launcher ABI's structs (abi.h), for `fusion tune`, which calls the
/// launchers of libraries it loads at run time.
#[cfg(feature = "cli")]
pub(crate) use ffi::{fusion_fold_params, fusion_gemm_params, fusion_tile_resources};
