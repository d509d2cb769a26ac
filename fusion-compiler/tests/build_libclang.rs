//! A missing libclang is one clear error, not bindgen's panic. Needs neither
//! nvcc nor libclang. Its own test binary, with one test, because it changes
//! `LIBCLANG_PATH` for the whole process.

#![cfg(feature = "build")]

use fusion_compiler::build::{BuildError, CompileOptions, CudaSources, GeneratedFile, compile};
use std::path::Path;

#[test]
fn missing_libclang_names_the_variable_and_the_fix() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fusion-build-libclang");
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("include")).unwrap();
    // SAFETY: this is the only test in this binary, so no other thread reads
    // the environment while it is changed.
    unsafe { std::env::set_var("LIBCLANG_PATH", root.join("no-libclang-here")) };

    let sources = CudaSources {
        units: Vec::new(),
        header: GeneratedFile {
            name: "fusion_kernels.h".to_owned(),
            contents: "#include <stdint.h>\nint fusion_nothing(void* stream);\n".to_owned(),
        },
        headers_dir: root.join("include"),
    };
    let mut options = CompileOptions::new(root.join("out"));
    options.cache_dir = Some(root.join("cache"));
    options.skip_nvcc = true;
    let err = compile(&sources, &options).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, BuildError::LibclangNotFound { .. }), "{message}");
    for needle in [
        "libclang",
        "LIBCLANG_PATH",
        "cargo xtask toolchain",
        "fusion_kernels.h",
    ] {
        assert!(message.contains(needle), "`{needle}` missing from: {message}");
    }
}
