//! `cargo xtask demo`: what a newcomer runs first. It sets up the toolchain,
//! then shows what fusion does with the SwiGLU feed-forward block.

use crate::error::Result;
use crate::steps::{self, Action, Step};
use crate::workspace::Workspace;

/// The demo, in order. Compiling and running the kernels on a GPU are
/// further steps at the end of this list.
fn demo_steps() -> Vec<Step> {
    vec![
        Step::new("toolchain: nvcc and libclang", Action::Bootstrap),
        Step::new(
            "plan the SwiGLU FFN: fusion plan graphs/swiglu_ffn.toml",
            Action::Cargo(vec![
                "run",
                "--release",
                "-p",
                "fusion",
                "--",
                "plan",
                "graphs/swiglu_ffn.toml",
            ]),
        ),
    ]
}

pub fn run(workspace: &Workspace) -> Result<()> {
    steps::run(workspace, "demo", &demo_steps())
}
