//! Compiles the shipped graphs (`graphs/*.toml`) into the crate's built-in
//! kernel library, `fusion::kernels`, when the feature `kernels` is on:
//! every graph for f16 and bf16 (bf16 only where an enabled generation has
//! it: sm75 has not), for the generations named by `FUSION_ARCHS`, else
//! `CUDA_COMPUTE_CAP`, else the cargo features
//! (`fusion_compiler::target::Arch::for_build`). With
//! `FUSION_FP8=experimental` and sm90 among them, the FP8 graphs
//! (`graphs/fp8/*.toml`) as well, as declared; the crate is then built with
//! `--cfg fusion_fp8` (their GPU tests, tests/gpu_fp8.rs, need it).

fn main() {
    // Without `kernels` nothing else is read; with it the builder names the
    // graphs, templates and tables it reads.
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-check-cfg=cfg(fusion_fp8)");
    // The run time's `fusion::device` picks among these: none without the
    // built-in library.
    #[cfg(feature = "kernels")]
    let archs = compile_shipped_graphs();
    #[cfg(not(feature = "kernels"))]
    let archs: [&str; 0] = [];
    println!("cargo:rustc-env=FUSION_COMPILED_ARCHS={}", archs.join(","));
}

/// Compiles `graphs/` into `libfusion_kernels.a` and its wrappers; returns
/// the names of the generations it compiled for. Exits on an error.
#[cfg(feature = "kernels")]
fn compile_shipped_graphs() -> Vec<&'static str> {
    use fusion_compiler::ir::DType;
    use fusion_compiler::target::Arch;
    for name in Arch::BUILD_ENV {
        println!("cargo:rerun-if-env-changed={name}");
    }
    let archs = Arch::for_build().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1);
    });
    // Asking for a dtype that no enabled arch has is a build error, so a
    // Turing-only build compiles f16 alone.
    let dtypes: Vec<DType> = [DType::F16, DType::BF16]
        .into_iter()
        .filter(|&dtype| dtype == DType::F16 || archs.iter().any(|a| a.supports(dtype)))
        .collect();
    let fp8 = fusion_compiler::build::fp8_kernels().unwrap_or_else(|e| {
        eprintln!("error: {e}");
        std::process::exit(1);
    }) && archs.contains(&Arch::Sm90);
    let mut builder = fusion_compiler::build::Builder::new().graphs_dir("graphs");
    if fp8 {
        // FP8 graphs keep their declared types; `dtypes` re-types the others.
        builder = builder.graphs_dir("graphs/fp8");
        println!("cargo:rustc-cfg=fusion_fp8");
    }
    let result = builder.dtypes(&dtypes).lib_name("fusion_kernels").compile();
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    archs.iter().map(|a| a.name()).collect()
}
