//! Compiles the graphs declared with `fusion_graph!` in `src/model.rs` into
//! fused kernels (for the GPU generations named by the cargo features).

fn main() {
    if let Err(e) = fusion_compiler::build::Builder::new()
        .sources("src/model.rs")
        .compile()
    {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
