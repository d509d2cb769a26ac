//! `FUSION_FP8=experimental` has a build generate sm90 kernels for FP8
//! GEMMs (`graphs/fp8/`), which nvcc compiles for sm_90a; without it the
//! build refuses FP8 graphs, naming the option, and with it a build without
//! sm90 refuses them, naming sm90. One test in its own binary: it sets the
//! environment variable.
//!
//! nvcc is required: `cargo xtask test` installs it and exports `NVCC`;
//! locally, set `NVCC` or run `cargo xtask toolchain`. No GPU is needed.

#![cfg(feature = "build")]

use fusion_compiler::build::{Builder, CompileOptions};
use fusion_compiler::codegen::FP8_ENV;
use fusion_compiler::select::Arch;
use std::path::Path;

#[test]
fn fusion_fp8_experimental_builds_sm90_fp8_gemms_and_nothing_else_does() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fusion-build-fp8");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let graphs = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/fp8");
    let builder = |archs: &[Arch]| Builder::new().graphs_dir(&graphs).archs(archs).lib_name("k");

    // SAFETY (every set_var and remove_var below): this binary's only test;
    // nothing else reads the environment.
    unsafe { std::env::remove_var(FP8_ENV) };
    let refused = builder(&[Arch::Sm90]).render().unwrap_err().to_string();
    assert!(
        refused.contains("FP8 kernels are not generated yet") && refused.contains("FUSION_FP8=experimental"),
        "{refused}"
    );

    unsafe { std::env::set_var(FP8_ENV, "yes") };
    let error = builder(&[Arch::Sm90]).render().unwrap_err().to_string();
    assert!(
        error.contains("FUSION_FP8=\"yes\"") && error.contains("`experimental`"),
        "{error}"
    );

    unsafe { std::env::set_var(FP8_ENV, "experimental") };
    let error = builder(&[Arch::Sm75, Arch::Sm80])
        .render()
        .unwrap_err()
        .to_string();
    assert!(error.contains("FP8 kernels need sm90"), "{error}");

    // A `fusion_graph!` FP8 graph would expand to a struct it does not get.
    let source = dir.join("model.rs");
    std::fs::write(
        &source,
        "fusion::fusion_graph! {\n    graph fp8_macro {\n        dims { M: dyn, K: 64, N: 32 }\n        \
         input x: f8e4m3[M, K] scale x_scale;\n        weight x_scale: f32[1], w: f8e4m3[N, K] scale w_scale, \
         w_scale: f32[1];\n        output y = x @ w^T;\n    }\n}\n",
    )
    .unwrap();
    let error = Builder::new()
        .sources(&source)
        .archs(&[Arch::Sm90])
        .lib_name("k")
        .render()
        .unwrap_err()
        .to_string();
    assert!(
        error.contains("graph `fp8_macro` has FP8 tensors") && error.contains("declare it in a TOML file"),
        "{error}"
    );

    let library = builder(&[Arch::Sm80, Arch::Sm90]).render().unwrap();
    let symbols: Vec<&str> = library.units.iter().map(|u| u.symbol.as_str()).collect();
    assert_eq!(
        symbols,
        [
            "k_gemm_bias_nk_f8e4m3_sm90",
            "k_gemm_bias_nk_f8e4m3_per_channel_sm90",
            "k_gemm_bias_gelu_nk_f8e4m3_per_channel_sm90",
        ]
    );
    // The units nvcc compiles are the ones rendered; the wrappers export
    // each graph's launcher.
    let mut options = CompileOptions::new(dir.join("out"));
    options.cache_dir = Some(dir.join("cache"));
    options.cargo_metadata = false;
    let built = builder(&[Arch::Sm90]).build_with(options).unwrap_or_else(|e| {
        panic!("the FP8 units did not build (nvcc is needed: `cargo xtask toolchain`): {e}")
    });
    let wrappers = std::fs::read_to_string(&built.wrappers).unwrap();
    for (graph, symbol) in [
        ("fp8_gemm_bias", "k_gemm_bias_nk_f8e4m3_sm90"),
        ("fp8_gemm_bias_channel", "k_gemm_bias_nk_f8e4m3_per_channel_sm90"),
        (
            "fp8_gemm_bias_gelu",
            "k_gemm_bias_gelu_nk_f8e4m3_per_channel_sm90",
        ),
    ] {
        assert!(wrappers.contains(&format!("pub mod {graph} {{")), "{wrappers}");
        assert!(
            wrappers.contains(&format!("unsafe {{ super::ffi::{symbol}(p, stream) }}")),
            "{wrappers}"
        );
    }
    unsafe { std::env::remove_var(FP8_ENV) };
    let _ = std::fs::remove_dir_all(&dir);
}
