//! Compiles the shipped graphs (`graphs/*.toml`) into the crate's built-in
//! kernel library, `fusion::kernels`, when the feature `kernels` is on:
//! every graph for f16 and bf16 (bf16 only where an enabled generation has
//! it: sm75 has not), for the generations named by `FUSION_ARCHS`, else
//! `CUDA_COMPUTE_CAP`, else the cargo features
//! (`fusion_compiler::target::Arch::for_build`). Always bakes in the commit
//! being built, for `fusion bench`'s report.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rustc-env=FUSION_GIT_COMMIT={}", git_commit());
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
    let result = fusion_compiler::build::Builder::new()
        .graphs_dir("graphs")
        .dtypes(&dtypes)
        .lib_name("fusion_kernels")
        .compile();
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
    archs.iter().map(|a| a.name()).collect()
}

/// `git rev-parse --short HEAD` of the checkout being built, or
/// `FUSION_GIT_COMMIT` from the environment when set (a build of an exported
/// tree); "unknown" outside a git checkout. The lines it prints make cargo
/// run this script again when HEAD moves, a commit or a checkout, and not
/// otherwise.
fn git_commit() -> String {
    println!("cargo:rerun-if-env-changed=FUSION_GIT_COMMIT");
    if let Ok(commit) = std::env::var("FUSION_GIT_COMMIT") {
        return commit;
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        out.status.success().then(|| text.trim().to_string())
    };
    let Some(commit) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown".to_string();
    };
    // HEAD names the branch; the branch's ref, loose or packed, the commit.
    let branch = git(&["rev-parse", "--symbolic-full-name", "HEAD"]).filter(|r| r.starts_with("refs/"));
    for name in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
        // A path cargo cannot find would make it rerun this every build.
        if let Some(path) = git(&["rev-parse", "--git-path", name]).filter(|p| Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    commit
}
