//! `cargo xtask test`: the whole test suite, exactly what CI runs. Nothing
//! in it needs a GPU.

use crate::error::Result;
use crate::lean_runtime;
use crate::package_cache;
use crate::packaged_crate;
use crate::steps::{self, Action, Step};
use crate::targets;
use crate::user_crate;
use crate::workspace::Workspace;
use std::sync::OnceLock;

fn suite_steps() -> Vec<Step> {
    vec![
        // First, so that CI proves the bootstrap works on a fresh machine.
        Step::new("toolchain: nvcc and libclang", Action::Bootstrap),
        Step::new(
            "nvcc compiles for every generation of fusion-compiler/kernels/targets.json",
            Action::SmokeCompile,
        ),
        Step::new(
            "cargo fmt --check",
            Action::Cargo(vec!["fmt", "--all", "--", "--check"]),
        ),
        Step::new(
            "cargo clippy",
            Action::Cargo(vec![
                "clippy",
                "--workspace",
                "--all-targets",
                // Every kernel variant: each template compiled for every
                // generation (shared with the test step's build through the
                // kernel cache).
                "--features",
                every_feature_but_candle(),
                "--",
                "-D",
                "warnings",
            ]),
        ),
        Step::new(
            "cargo clippy fusion and fusion-cli with the feature `candle` (its module, GPU test and example; builds candle's CUDA kernels)",
            Action::CargoWithEnv(
                CANDLE_BUILD,
                vec![
                    "clippy",
                    "-p",
                    "fusion",
                    "-p",
                    "fusion-cli",
                    "--all-targets",
                    "--features",
                    "fusion/candle,fusion/kernels,fusion/testing,fusion-cli/candle",
                    "--",
                    "-D",
                    "warnings",
                ],
            ),
        ),
        Step::new(
            // The rest of the suite turns every feature on, so this is the
            // one build of fusion-compiler as fusion-macros links it.
            "cargo clippy fusion-compiler without features (the parser and IR fusion-macros links)",
            Action::Cargo(vec![
                "clippy",
                "-p",
                "fusion-compiler",
                "--no-default-features",
                "--",
                "-D",
                "warnings",
            ]),
        ),
        Step::new(
            "cargo clippy fusion without default features (the lean run time: no command line, no shipped kernels, no nvcc)",
            Action::CargoWithEnv(
                &[NO_NVCC],
                vec![
                    "clippy",
                    "-p",
                    "fusion",
                    "--no-default-features",
                    "--",
                    "-D",
                    "warnings",
                ],
            ),
        ),
        Step::new(
            "the lean run time's dependencies (fusion with its default features, and with kernels): none of the command line's or the compiler's",
            Action::Function(lean_runtime::check),
        ),
        Step::new(
            "cargo test (every kernel variant: every generation's feature)",
            Action::Cargo(vec![
                "test",
                "--workspace",
                "--features",
                every_feature_but_candle(),
            ]),
        ),
        // Planning needs no kernel library: fusion-cli built without the
        // feature `kernels` and without nvcc plans every graph.
        Step::new(
            "fusion plan on every graphs/*.toml, fusion-cli built without the shipped kernels and without nvcc",
            Action::PlanEveryGraph(&[NO_NVCC]),
        ),
        // What docs.rs does, on a machine without CUDA: the build scripts
        // skip nvcc, link nothing and still write the bindings, and the
        // generated wrappers compile without launchers (a call on a GPU
        // finds no kernel: `UnsupportedDType`). NVCC points at nothing, so a build script that
        // looked for nvcc anyway would fail. Default features, as docs.rs
        // builds them, which also keeps these builds' artifacts apart from
        // the every-feature ones above.
        Step::new(
            "a crate built without nvcc (FUSION_SKIP_NVCC=1): llama-ffn, its build script and fusion",
            Action::CargoWithEnv(WITHOUT_NVCC_SKIP, vec!["build", "-p", "llama-ffn"]),
        ),
        Step::new(
            "a crate outside the workspace with fusion_graph! in its library and binary: clippy pedantic, warnings fatal (without nvcc)",
            Action::Function(user_crate::check_warning_free),
        ),
        Step::new(
            "the same crate built by nvcc for sm80 alone beside fusion's sm90: its wrappers choose among its own generations",
            Action::Function(user_crate::check_own_archs),
        ),
        Step::new(
            "forget cargo's extracted copies of earlier packages of the published crates",
            Action::Function(package_cache::forget_stale_extractions),
        ),
        // What `cargo publish` would upload, each crate built from its
        // package alone (in target/package) against the others' packages:
        // a file a crate embeds but leaves out of its include list fails
        // here. Without nvcc, as above, so it reuses that step's build.
        Step::new(
            "cargo package of every published crate (fusion-compiler, fusion-macros, fusion, fusion-cli), each built from its package",
            Action::CargoWithEnv(
                WITHOUT_NVCC_SKIP,
                vec![
                    "package",
                    // Uncommitted work is packaged too, so that the step
                    // checks the tree it runs on.
                    "--allow-dirty",
                    "-p",
                    "fusion-compiler",
                    "-p",
                    "fusion-macros",
                    "-p",
                    "fusion",
                    "-p",
                    "fusion-cli",
                ],
            ),
        ),
        Step::new(
            "examples/llama-ffn outside the workspace, built by nvcc against those packages: its tests (the safetensors one needs a GPU)",
            Action::Function(packaged_crate::check),
        ),
        Step::new(
            "cargo doc of the workspace as docs.rs builds it (DOCS_RS=1), warnings fatal",
            Action::CargoWithEnv(WITHOUT_NVCC_DOCS_RS, vec!["doc", "--workspace", "--no-deps"]),
        ),
    ]
}

/// Every feature of the workspace's crates (fusion-cli's defaults, its
/// `kernels` among them, are its own already) but `candle`: candle's CUDA
/// backend links the CUDA libraries, which a machine without a GPU driver
/// cannot load, so its test binaries could not start here. The `candle`
/// step checks that code without linking it.
/// Every generation's feature is one of fusion's and of llama-ffn's, named
/// after it (`fusion-compiler/kernels/targets.json`).
fn every_feature_but_candle() -> &'static str {
    static FEATURES: OnceLock<String> = OnceLock::new();
    FEATURES.get_or_init(|| {
        format!(
            "fusion/kernels,fusion/testing,{},{}",
            targets::features("fusion"),
            targets::features("llama-ffn")
        )
    })
}

/// candle's kernels are built for one compute capability, which its build
/// script reads from `CUDA_COMPUTE_CAP` where there is no GPU to ask; 90 also
/// limits fusion's own kernels in that build to sm90.
const CANDLE_BUILD: &[(&str, &str)] = &[("CUDA_COMPUTE_CAP", "90")];

/// No nvcc: a path that does not exist, which the build scripts report as
/// an error if they look for nvcc at all.
const NO_NVCC: (&str, &str) = ("NVCC", "/nonexistent/nvcc");
pub const WITHOUT_NVCC_SKIP: &[(&str, &str)] = &[("FUSION_SKIP_NVCC", "1"), NO_NVCC];
const WITHOUT_NVCC_DOCS_RS: &[(&str, &str)] = &[("DOCS_RS", "1"), ("RUSTDOCFLAGS", "-D warnings"), NO_NVCC];

pub fn run(workspace: &Workspace) -> Result<()> {
    steps::run(workspace, "test", &suite_steps())
}
