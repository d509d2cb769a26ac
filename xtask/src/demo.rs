//! `cargo xtask demo`: what a newcomer runs first. It sets up the toolchain,
//! plans the SwiGLU feed-forward block and builds it; then, on a machine
//! with a GPU, runs it (checked against the CPU reference) and benchmarks it
//! against cuBLASLt; on one without, shows what its kernels cost in
//! registers, shared memory and spills.

use crate::error::Result;
use crate::resources;
use crate::steps::{self, Action, Step};
use crate::toolchain::Toolchain;
use crate::workspace::Workspace;
use std::process::{Command, Stdio};

/// The graph the demo is about.
const GRAPH: &str = "swiglu_ffn";

/// The demo, in order; the last steps depend on whether a GPU is present.
fn demo_steps(gpu_present: bool) -> Vec<Step> {
    let mut steps = vec![
        Step::new("toolchain: nvcc and libclang", Action::Bootstrap),
        Step::new(
            "plan the SwiGLU FFN: fusion plan graphs/swiglu_ffn.toml",
            Action::Cargo(vec![
                "run",
                "--release",
                "-p",
                "fusion-cli",
                "--",
                "plan",
                "graphs/swiglu_ffn.toml",
            ]),
        ),
        Step::new(
            "build the kernels: cargo build --release -p fusion-cli --examples",
            Action::Cargo(vec!["build", "--release", "-p", "fusion-cli", "--examples"]),
        ),
    ];
    if gpu_present {
        steps.push(Step::new(
            "run the SwiGLU FFN on GPU 0 against the CPU reference: fusion-cli/examples/swiglu_ffn.rs",
            Action::Cargo(vec![
                "run",
                "--release",
                "-p",
                "fusion-cli",
                "--example",
                "swiglu_ffn",
            ]),
        ));
        steps.push(Step::new(
            "benchmark against cuBLASLt: fusion bench",
            Action::Cargo(vec![
                "run",
                "--release",
                "-p",
                "fusion-cli",
                "--",
                "bench",
                "--kernel",
                "swiglu_ffn",
                "--kernel",
                "gemm_bias_gelu",
                "--shape",
                "4096,4096,4096",
                "--ffn-tokens",
                "128,8192",
            ]),
        ));
    } else {
        steps.push(Step::new(
            "kernel resources of the SwiGLU FFN: ptxas -v on each unit",
            Action::Function(swiglu_ffn_resources),
        ));
    }
    steps
}

fn swiglu_ffn_resources(workspace: &Workspace, toolchain: &Toolchain) -> Result<()> {
    resources::report(workspace, toolchain, GRAPH)
}

/// Whether `nvidia-smi -L` output lists a GPU ("GPU 0: NVIDIA H200 (UUID: …)").
fn lists_gpu(listing: &str) -> bool {
    listing.lines().any(|line| line.trim_start().starts_with("GPU "))
}

/// The first GPU `nvidia-smi -L` lists; `None` when it is missing, fails
/// or lists none.
fn first_gpu() -> Option<String> {
    let output = Command::new("nvidia-smi")
        .arg("-L")
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let listing = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() || !lists_gpu(&listing) {
        return None;
    }
    listing.lines().next().map(|line| line.trim().to_string())
}

pub fn run(workspace: &Workspace) -> Result<()> {
    let gpu = first_gpu();
    match &gpu {
        Some(gpu) => println!("GPU found: {gpu}"),
        None => println!(
            "no GPU found (`nvidia-smi -L` lists none): skipping the GPU run and the benchmark; \
             showing the kernels' resource use instead"
        ),
    }
    steps::run(workspace, "demo", &demo_steps(gpu.is_some()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_listing_without_gpu_lines_means_no_gpu() {
        assert!(lists_gpu(
            "GPU 0: NVIDIA H200 (UUID: GPU-0b4c6a2e-1d7f-4c1e-9a55-3f2b8c0d9e71)\n"
        ));
        assert!(!lists_gpu("No devices were found\n"));
        assert!(!lists_gpu(""));
    }

    #[test]
    fn the_gpu_decides_the_last_steps() {
        let titles = |gpu| -> Vec<&str> { demo_steps(gpu).iter().map(|s| s.title).collect() };
        let with = titles(true);
        let without = titles(false);
        assert_eq!(with[..3], without[..3]);
        assert!(with[3..].iter().any(|t| t.contains("fusion bench")));
        assert!(without[3..].iter().all(|t| t.contains("ptxas")));
    }
}
