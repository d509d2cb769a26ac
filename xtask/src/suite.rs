//! `cargo xtask test`: the whole test suite, exactly what CI runs. Nothing
//! in it needs a GPU.

use crate::error::Result;
use crate::steps::{self, Action, Step};
use crate::workspace::Workspace;

fn suite_steps() -> Vec<Step> {
    vec![
        // First, so that CI proves the bootstrap works on a fresh machine.
        Step::new("toolchain: nvcc and libclang", Action::Bootstrap),
        Step::new("nvcc compiles for sm_75, sm_80 and sm_90a", Action::SmokeCompile),
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
                // Every kernel variant: each template compiled for sm_75,
                // sm_80 and sm_90a (shared with the test step's build through
                // the kernel cache).
                "--all-features",
                "--",
                "-D",
                "warnings",
            ]),
        ),
        Step::new(
            // The rest of the suite turns every feature on, so this is the
            // one build of fusion-core as fusion-macros links it.
            "cargo clippy fusion-core without features (the parser and IR fusion-macros links)",
            Action::Cargo(vec![
                "clippy",
                "-p",
                "fusion-core",
                "--no-default-features",
                "--",
                "-D",
                "warnings",
            ]),
        ),
        Step::new(
            "cargo test (every kernel variant: sm75, sm80, sm90)",
            Action::Cargo(vec!["test", "--workspace", "--all-features"]),
        ),
        Step::new("fusion plan on every graphs/*.toml", Action::PlanEveryGraph),
    ]
}

pub fn run(workspace: &Workspace) -> Result<()> {
    steps::run(workspace, "test", &suite_steps())
}
