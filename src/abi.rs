//! The launcher ABI (`fusion-compiler/kernels/include/fusion/abi.h`) as the
//! run time declares it: the params structs every launcher takes, its flags,
//! and the C signatures of launchers, workspace queries and weight folds.
//!
//! Generated code does not declare these structs itself: its bindings of a
//! kernel library name these very types (bindgen leaves them out and the
//! generated `ffi` module imports them from here), so a launcher of a
//! generated crate is a [`Launcher`] of this module's params without a
//! cast, and a plan table ([`crate::plan`]) holds it as such. A change
//! here or in abi.h bumps [`crate::plan::SCHEMA_VERSION`], which generated
//! code asserts at compile time, so that generated code and a run time that
//! disagree fail the build instead of passing a struct of another layout.
//!
//! The names are abi.h's, so that what a reader finds in the header is what
//! the Rust says.

#![allow(non_camel_case_types, reason = "the C names of abi.h")]

use std::ffi::{c_char, c_int, c_void};

/// `fusion_gemm_params::flags`: no split-K or stream-K.
pub const FUSION_GEMM_NO_STREAM_K: u32 = 1;
/// `fusion_gemm_params::flags`: each CTA's whole tiles fixed at launch.
pub const FUSION_GEMM_STATIC_TILES: u32 = 2;
/// `fusion_gemm_params::flags`: where a caller-named tile tier's code sits.
pub const FUSION_GEMM_TILE_SHIFT: u32 = 2;
/// `fusion_gemm_params::flags`: the bits of a caller-named tile tier
/// (`FUSION_GEMM_TILE`, or the tier the model of the kernel's time chooses
/// per call where the build left the tile to the call: `plan::TileModel`);
/// none set, the launcher's own choice.
pub const FUSION_GEMM_TILE_MASK: u32 = 7 << FUSION_GEMM_TILE_SHIFT;
/// `fusion_gemm_params::flags`: the plan before split-K's 48-k-block bound:
/// stream-K over the last wave, and split-K on short tiles too.
pub const FUSION_GEMM_STREAM_K_TAIL: u32 = 32;
/// `fusion_gemm_params::flags`: stream-K over a lone wave of more than half
/// the SMs' tiles.
pub const FUSION_GEMM_STREAM_K_FILL: u32 = 64;
/// A tile tier's code: the tuned table's `large` tile.
pub const FUSION_GEMM_TILE_LARGE: u32 = 1;
/// A tile tier's code: `large_alt`.
pub const FUSION_GEMM_TILE_LARGE_ALT: u32 = 2;
/// A tile tier's code: `small_m`.
pub const FUSION_GEMM_TILE_SMALL_M: u32 = 3;
/// A tile tier's code: `small_m_alt`.
pub const FUSION_GEMM_TILE_SMALL_M_ALT: u32 = 4;
/// A tile tier's code: the sm90 few-M tile, `few_m`.
pub const FUSION_GEMM_TILE_FEW_M: u32 = 5;
/// The most steps an elementwise launcher chains.
pub const FUSION_ELEMENTWISE_MAX_STEPS: usize = 4;

/// C = epilogue(prologue(A) @ B); see abi.h for each field.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fusion_gemm_params {
    pub a: *const c_void,
    pub b: *const c_void,
    pub b_up: *const c_void,
    pub c: *mut c_void,
    pub bias: *const c_void,
    pub residual: *const c_void,
    pub multiplier: *const c_void,
    pub gamma: *const c_void,
    pub beta: *const c_void,
    pub col_terms: *const c_void,
    pub m: i64,
    pub n: i64,
    pub k: i64,
    pub ldb: i64,
    pub eps: f32,
    pub flags: u32,
    pub workspace: *mut c_void,
    pub workspace_bytes: u64,
    pub scale_a: *const c_void,
    pub scale_b: *const c_void,
}

impl fusion_gemm_params {
    /// Its pointer fields in the order they are declared: the operands,
    /// the output, the workspace, then an FP8 GEMM's scales.
    pub fn pointers(&self) -> [*const c_void; 13] {
        [
            self.a,
            self.b,
            self.b_up,
            self.c.cast_const(),
            self.bias,
            self.residual,
            self.multiplier,
            self.gamma,
            self.beta,
            self.col_terms,
            self.workspace.cast_const(),
            self.scale_a,
            self.scale_b,
        ]
    }
}

/// A norm folded into (or a gated pair interleaved into) a bound weight.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fusion_fold_params {
    pub w: *const c_void,
    pub w_up: *const c_void,
    pub gamma: *const c_void,
    pub beta: *const c_void,
    pub w_folded: *mut c_void,
    pub col_terms: *mut c_void,
    pub n: i64,
    pub k: i64,
    pub ld_folded: i64,
}

/// y = norm(x) over rows of length k.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fusion_norm_params {
    pub x: *const c_void,
    pub y: *mut c_void,
    pub gamma: *const c_void,
    pub beta: *const c_void,
    pub m: i64,
    pub k: i64,
    pub eps: f32,
}

/// y = steps(x) elementwise, step i reading `operands[i]`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fusion_elementwise_params {
    pub x: *const c_void,
    pub y: *mut c_void,
    pub operands: [*const c_void; FUSION_ELEMENTWISE_MAX_STEPS],
    pub m: i64,
    pub n: i64,
}

/// What one tile config of a GEMM launcher asks for per block at launch.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct fusion_tile_resources {
    pub tile: *const c_char,
    pub smem_bytes: u32,
    pub threads: u32,
}

/// Every struct above is pointers, integers and floats, for which all-zero
/// bytes are a valid value (null, 0, 0.0): the empty params a caller fills.
macro_rules! zeroed_default {
    ($($ty:ty),*) => {$(
        impl Default for $ty {
            fn default() -> Self {
                // SAFETY: see the macro's comment.
                unsafe { std::mem::zeroed() }
            }
        }
    )*};
}
zeroed_default!(
    fusion_gemm_params,
    fusion_fold_params,
    fusion_norm_params,
    fusion_elementwise_params,
    fusion_tile_resources
);

/// A launcher's C signature, for a params struct `P`.
pub type Launcher<P> = unsafe extern "C" fn(*const P, *mut c_void) -> c_int;

/// A launcher's workspace query, `<symbol>_workspace_bytes` (abi.h).
pub type WorkspaceBytes<P> = unsafe extern "C" fn(*const P, *mut c_void, *mut u64) -> c_int;

/// The library's `<lib>_error_string`.
pub type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

/// A unit's `<symbol>_fold_weights` (abi.h), for a params struct `P`.
pub type FoldWeights<P> = unsafe extern "C" fn(*const P, *mut c_void) -> c_int;

#[cfg(test)]
mod tests {
    use super::*;

    /// Field offsets, as C lays the structs out on a 64-bit target: every
    /// pointer and 64-bit integer 8 bytes apart, no padding before a field.
    #[test]
    fn the_structs_have_abi_hs_layout() {
        use std::mem::{offset_of, size_of};
        assert_eq!(offset_of!(fusion_gemm_params, col_terms), 72);
        assert_eq!(offset_of!(fusion_gemm_params, m), 80);
        assert_eq!(offset_of!(fusion_gemm_params, ldb), 104);
        assert_eq!(offset_of!(fusion_gemm_params, eps), 112);
        assert_eq!(offset_of!(fusion_gemm_params, flags), 116);
        assert_eq!(offset_of!(fusion_gemm_params, workspace), 120);
        assert_eq!(offset_of!(fusion_gemm_params, scale_a), 136);
        assert_eq!(size_of::<fusion_gemm_params>(), 152);
        assert_eq!(offset_of!(fusion_fold_params, ld_folded), 64);
        assert_eq!(size_of::<fusion_fold_params>(), 72);
        assert_eq!(offset_of!(fusion_norm_params, eps), 48);
        assert_eq!(size_of::<fusion_norm_params>(), 56);
        assert_eq!(offset_of!(fusion_elementwise_params, m), 48);
        assert_eq!(size_of::<fusion_elementwise_params>(), 64);
        assert_eq!(size_of::<fusion_tile_resources>(), 16);
    }

    /// abi.h, as the build compiles it, declares the constants this module does.
    #[test]
    fn the_header_declares_this_modules_constants() {
        let abi = include_str!("../fusion-compiler/kernels/include/fusion/abi.h");
        assert!(abi.contains(&format!(
            "#define FUSION_ELEMENTWISE_MAX_STEPS {FUSION_ELEMENTWISE_MAX_STEPS}\n"
        )));
        assert!(abi.contains(&format!(
            "#define FUSION_GEMM_NO_STREAM_K {FUSION_GEMM_NO_STREAM_K}u\n"
        )));
        assert!(abi.contains(&format!(
            "#define FUSION_GEMM_STATIC_TILES {FUSION_GEMM_STATIC_TILES}u\n"
        )));
        assert!(abi.contains(&format!(
            "#define FUSION_GEMM_STREAM_K_TAIL {FUSION_GEMM_STREAM_K_TAIL}u\n"
        )));
        assert!(abi.contains(&format!(
            "#define FUSION_GEMM_STREAM_K_FILL {FUSION_GEMM_STREAM_K_FILL}u\n"
        )));
        for (name, value) in [
            ("SHIFT", FUSION_GEMM_TILE_SHIFT),
            ("LARGE", FUSION_GEMM_TILE_LARGE),
            ("LARGE_ALT", FUSION_GEMM_TILE_LARGE_ALT),
            ("SMALL_M", FUSION_GEMM_TILE_SMALL_M),
            ("SMALL_M_ALT", FUSION_GEMM_TILE_SMALL_M_ALT),
            ("FEW_M", FUSION_GEMM_TILE_FEW_M),
        ] {
            let line = format!("#define FUSION_GEMM_TILE_{name} {value}u\n");
            assert!(abi.contains(&line), "abi.h lacks `{}`", line.trim());
        }
        assert!(abi.contains("#define FUSION_GEMM_TILE_MASK (7u << FUSION_GEMM_TILE_SHIFT)\n"));
        assert_eq!(FUSION_GEMM_TILE_MASK, 7 << FUSION_GEMM_TILE_SHIFT);
        // The tier's bits are clear of the other flags.
        assert_eq!(
            FUSION_GEMM_TILE_MASK
                & (FUSION_GEMM_NO_STREAM_K
                    | FUSION_GEMM_STATIC_TILES
                    | FUSION_GEMM_STREAM_K_TAIL
                    | FUSION_GEMM_STREAM_K_FILL),
            0
        );
    }
}
