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
