//! Compiles the shipped graphs (`graphs/*.toml`) into the crate's built-in
//! kernel library, `fusion::kernels`: every graph for f16 and bf16 (sm75
//! gets f16 only), for the architectures named by the cargo features.

use fusion_core::ir::DType;

fn main() {
    let result = fusion_core::build::Builder::new()
        .graphs_dir("graphs")
        .dtypes(&[DType::F16, DType::BF16])
        .lib_name("fusion_kernels")
        .compile();
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
