//! The example crate `examples/llama-ffn` as a user would have it: copied
//! outside the workspace and built against the packages `cargo package`
//! made (`target/package/<crate>-<version>`), not the repository's sources.
//! Its build script compiles its `fusion_graph!` blocks with nvcc, and its
//! tests run: the generated API's on the CPU here, and on a GPU the one that
//! binds Llama-style weights from a safetensors file under their Hugging
//! Face names and matches the CPU reference (`#[ignore]`d here, run with
//! `--ignored` where there is a GPU).

use crate::error::{Error, Result};
use crate::targets;
use crate::toolchain::Toolchain;
use crate::user_crate::{cargo_with_nvcc, write_if_changed};
use crate::workspace::Workspace;

/// Its manifest: fusion from its package, with `testing` (the CPU
/// reference its tests compare with) and no shipped kernels; the packages
/// of fusion's own dependencies in place of crates.io's.
/// Its package is named apart from the workspace's `llama-ffn` (whose
/// binary shares the target folder); its library keeps the example's name,
/// which the tests import.
const MANIFEST: &str = r#"[package]
name = "packaged-llama-ffn"
version = "0.0.0"
edition = "2024"
publish = false

[lib]
name = "llama_ffn"

[dependencies]
fusion = { path = "{package}/fusion-{version}", default-features = false, features = ["testing"] }
rand = "0.9"

[build-dependencies]
fusion-compiler = { path = "{package}/fusion-compiler-{version}", default-features = false, features = ["build"] }

[features]
default = ["sm90"]
{generations}

[patch.crates-io]
fusion-compiler = { path = "{package}/fusion-compiler-{version}" }
fusion-macros = { path = "{package}/fusion-macros-{version}" }

[workspace]
"#;

/// The example's files the copy takes as they are.
const FILES: [&str; 6] = [
    "build.rs",
    "src/lib.rs",
    "src/main.rs",
    "src/model.rs",
    "tests/generated_api.rs",
    "tests/safetensors.rs",
];

/// Where the copy is written, under the workspace's `target/`.
const FOLDER: &str = "packaged-llama-ffn";

/// Writes the copy into `target/packaged-llama-ffn` and runs `cargo test`
/// there (nvcc for sm90, the generations its default feature names). Needs
/// the `cargo package` step's packages.
pub fn check(workspace: &Workspace, toolchain: &Toolchain) -> Result<()> {
    let package = workspace.root.join("target").join("package");
    let version = env!("CARGO_PKG_VERSION");
    for name in ["fusion", "fusion-compiler", "fusion-macros"] {
        let dir = package.join(format!("{name}-{version}"));
        if !dir.join("Cargo.toml").is_file() {
            return Err(Error::new(format!(
                "{} is missing: run `cargo package -p fusion-compiler -p fusion-macros -p fusion` first",
                workspace.display(&dir)
            )));
        }
    }
    let dir = write_copy(workspace, &package.display().to_string(), version)?;
    cargo_with_nvcc(
        workspace,
        toolchain,
        &dir,
        &["test"],
        "the example crate built against the packages",
    )
}

/// Writes the manifest and copies the example's files; returns the folder.
fn write_copy(workspace: &Workspace, package: &str, version: &str) -> Result<std::path::PathBuf> {
    let dir = workspace.root.join("target").join(FOLDER);
    let example = workspace.root.join("examples").join("llama-ffn");
    // A feature per generation, as the example's own manifest has.
    let generations: Vec<String> = targets::generations()
        .iter()
        .map(|g| format!("{} = []", g.name))
        .collect();
    let manifest = MANIFEST
        .replace("{package}", package)
        .replace("{version}", version)
        .replace("{generations}", &generations.join("\n"));
    write_if_changed(&dir.join("Cargo.toml"), &manifest)?;
    for file in FILES {
        let from = example.join(file);
        let contents = std::fs::read_to_string(&from)
            .map_err(|e| Error::new(format!("cannot read {}: {e}", workspace.display(&from))))?;
        write_if_changed(&dir.join(file), &contents)?;
    }
    Ok(dir)
}
