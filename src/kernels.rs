//! The built-in kernels: one item per graph in `graphs/`, generated at build
//! time. Each graph has a struct that binds its weights once
//! (`SwigluFfn::new(&stream, SwigluFfnWeights { .. })?.run(&stream, &x,
//! &mut y)`) and, when it is a single kernel, a function that takes every
//! tensor with each call (`kernels::gemm_bias_gelu(&stream, &x, &w, &b, &mut
//! y)`). Every item's documentation shows the graph's arguments and its
//! fusion plan.

include!(concat!(env!("OUT_DIR"), "/fusion_kernels.rs"));

#[cfg(test)]
mod tests {
    /// The tile tiers' codes and their place in the flags
    /// (`crate::launch::GemmTile`) are abi.h's, as the bindings have them.
    #[test]
    fn the_gemm_tile_codes_are_abi_hs() {
        use super::ffi;
        use crate::launch::{GEMM_TILE_SHIFT, GemmTile};
        assert_eq!(GEMM_TILE_SHIFT, ffi::FUSION_GEMM_TILE_SHIFT);
        let codes = [
            ffi::FUSION_GEMM_TILE_LARGE,
            ffi::FUSION_GEMM_TILE_LARGE_ALT,
            ffi::FUSION_GEMM_TILE_SMALL_M,
            ffi::FUSION_GEMM_TILE_SMALL_M_ALT,
        ];
        for (tier, code) in GemmTile::ALL.into_iter().zip(codes) {
            assert_eq!(tier.code(), code, "{tier:?}");
        }
        let other_flags = ffi::FUSION_GEMM_NO_STREAM_K | ffi::FUSION_GEMM_STATIC_TILES;
        assert_eq!((7 << GEMM_TILE_SHIFT) & other_flags, 0);
    }

    use fusion_compiler::diagnostic::SourceFile;
    use half::f16;

    /// Each struct's `graph()` is its TOML file's graph, written out as data
    /// when fusion was built.
    #[test]
    fn a_structs_graph_is_its_files_graph() {
        let lowered = |file: &str| {
            let path = format!("{}/graphs/{file}", env!("CARGO_MANIFEST_DIR"));
            let source = SourceFile::new(&path, std::fs::read_to_string(&path).expect("a shipped graph"));
            let decl = fusion_compiler::syntax::parse_toml(&source).expect("parses");
            fusion_compiler::ir::lower(&decl).expect("lowers")
        };
        assert_eq!(super::SwigluFfn::<f16>::graph(), lowered("swiglu_ffn.toml"));
        assert_eq!(super::FfnSublayer::<f16>::graph(), lowered("ffn_sublayer.toml"));
        assert_eq!(
            super::GemmBiasGelu::<f16>::graph(),
            lowered("gemm_bias_gelu.toml")
        );
        assert_eq!(super::Silu::graph(), lowered("silu.toml"));
    }
}
