//! Compiles the shipped graphs (`graphs/*.toml`) into the crate's built-in
//! kernel library, `fusion::kernels`: every graph for f16 and bf16 (bf16 only
//! where an enabled generation has it: sm75 has not), for the generations
//! named by the cargo features (`fusion_core::target` lists them).

use fusion_core::ir::DType;
use fusion_core::target::Arch;

fn main() {
    let archs = Arch::from_cargo_features();
    // The run time's `fusion::device` picks among these.
    let names: Vec<&str> = archs.iter().map(|a| a.name()).collect();
    println!("cargo:rustc-env=FUSION_COMPILED_ARCHS={}", names.join(","));
    // Asking for a dtype that no enabled arch has is a build error, so a
    // Turing-only build compiles f16 alone.
    let dtypes: Vec<DType> = [DType::F16, DType::BF16]
        .into_iter()
        .filter(|&dtype| dtype == DType::F16 || archs.iter().any(|a| a.supports(dtype)))
        .collect();
    let result = fusion_core::build::Builder::new()
        .graphs_dir("graphs")
        .dtypes(&dtypes)
        .lib_name("fusion_kernels")
        .compile();
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
