//! Compiles the shipped graphs (`graphs/*.toml`) into the crate's built-in
//! kernel library, `fusion::kernels`: every graph for f16 and bf16 (sm75
//! gets f16 only), for the architectures named by the cargo features.

use fusion_core::ir::DType;

fn main() {
    // Asking for bf16 in a build with no arch that has it (sm75 alone) is a
    // build error, so a Turing-only build compiles f16 alone.
    let has_bf16_arch = ["CARGO_FEATURE_SM80", "CARGO_FEATURE_SM90"]
        .iter()
        .any(|feature| std::env::var_os(feature).is_some());
    let dtypes: &[DType] = if has_bf16_arch {
        &[DType::F16, DType::BF16]
    } else {
        &[DType::F16]
    };
    let result = fusion_core::build::Builder::new()
        .graphs_dir("graphs")
        .dtypes(dtypes)
        .lib_name("fusion_kernels")
        .compile();
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
