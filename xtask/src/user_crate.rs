//! A crate outside the workspace that uses fusion as a dependent does: a
//! library and a binary, each with a `fusion_graph!`, compiled by its own
//! build script. Written under `target/` and checked with clippy, pedantic
//! lints on and every warning fatal, and with rustdoc, so that code fusion
//! generates into a user's crate is warning-free there, its docs included.
//! Built without nvcc, as a crate on a machine without CUDA builds it
//! (`FUSION_SKIP_NVCC=1`): the wrappers are the same, only their launchers
//! are missing. Then built by nvcc for another generation than fusion's
//! (`check_own_archs`), whose test checks what its wrappers dispatch among.

use crate::error::{Error, Result};
use crate::process::{self, display_command};
use crate::toolchain::Toolchain;
use crate::workspace::Workspace;
use std::path::Path;
use std::process::Command;

/// `Cargo.toml`: fusion with `{fusion_features}` (none: without its shipped
/// kernels; the crate compiles its own graphs either way), fusion-compiler
/// for the build script. `{root}` is the workspace. Its own `[workspace]`,
/// as it lies inside this one's folder.
const MANIFEST: &str = r#"[package]
name = "fusion-user-crate"
version = "0.0.0"
edition = "2024"
publish = false

[dependencies]
fusion = { path = "{root}", default-features = false, features = [{fusion_features}] }

[build-dependencies]
fusion-compiler = { path = "{root}/fusion-compiler", default-features = false, features = ["build"] }

# The generations its build script compiles for, as a user crate names them.
[features]
default = ["sm80", "sm90"]
sm80 = []
sm90 = []

[workspace]
"#;

const BUILD_RS: &str = r#"//! Compiles the graphs of the library and the binary, and of `graphs/`.

fn main() {
    let result = fusion_compiler::build::Builder::new()
        .sources("src/lib.rs")
        .sources("src/main.rs")
        .graphs_dir("graphs")
        .compile();
    if let Err(e) = result {
        eprintln!("error: {e}");
        std::process::exit(1);
    }
}
"#;

/// A TOML graph of one kernel, which the binary includes.
const GELU_LAYER_TOML: &str = r#"[graph]
name = "gelu_layer"
doc = "A linear layer with bias and GELU."

[dims]
M = "dyn"
D = 64

[inputs]
x = "f16[M, D]"

[weights]
w = "f16[D, D]"
b = "f16[D]"

[outputs]
y = "gelu(x @ w^T + b)"
"#;

/// A library exporting a single-kernel graph and a graph of several
/// kernels, both generic over the element type.
const LIB_RS: &str = r"//! A library whose public API is two fused graphs.

fusion::fusion_graph! {
    /// A linear layer with bias and GELU.
    pub graph Projection {
        dims { M: dyn, N: 128, K: 64 }
        input x: f16[M, K];
        weight w: f16[N, K], b: f16[N];
        output y = gelu(x @ w^T + b);
    }
}

fusion::fusion_graph! {
    /// A `SwiGLU` feed-forward block with the residual add (a doc the
    /// generated struct carries, so pedantic lints read it too).
    pub graph Ffn {
        dims { M: dyn, D: 64, F: 128 }
        input x: f16[M, D];
        weight w_gate: f16[F, D], w_up: f16[F, D], w_down: f16[D, F];
        output y = (silu(x @ w_gate^T) * (x @ w_up^T)) @ w_down^T + x;
    }
}

/// Run by `cargo xtask test` with this crate built for sm80 alone and by
/// nvcc, beside fusion with its shipped kernels built for sm90: the
/// wrappers choose among what this crate compiled, not among fusion's
/// generations.
#[cfg(test)]
mod tests {
    use super::{Ffn, Projection};
    use fusion::Arch;
    use fusion::device::{choose, compiled};

    #[test]
    fn the_wrappers_choose_among_the_generations_this_crate_compiled() {
        assert_eq!(compiled(), [Arch::Sm90]);
        assert_eq!(Projection::ARCHS, [Arch::Sm80]);
        assert_eq!(Ffn::ARCHS, [Arch::Sm80]);
        // An A100 runs this crate's sm80 code, which fusion's own list lacks;
        // an H100 runs it too, as PTX.
        assert_eq!(choose(8, 0, None, Projection::ARCHS).ok(), Some(Arch::Sm80));
        assert_eq!(choose(9, 0, None, Ffn::ARCHS).ok(), Some(Arch::Sm80));
        assert!(choose(8, 0, None, &compiled()).is_err());
    }
}
";

/// A binary that binds a macro graph's weights and runs it once, and runs
/// a TOML graph through its free function, using nothing else of what was
/// generated (not `DECLARATION`, `graph`, `weights`, `workspace`, nor the
/// TOML graph's struct): what is left unused must not warn. Compiled, never
/// run.
const MAIN_RS: &str = r#"//! Runs a fused graph declared in a private module.

use fusion::cudarc::driver::{CudaContext, CudaSlice, CudaStream};
use fusion::half::f16;
use fusion::{Tensor, TensorMut};
use std::sync::Arc;

mod model {
    fusion::fusion_graph! {
        /// A linear layer with bias and residual add.
        pub graph Residual {
            dims { M: dyn, D: 64 }
            input x: f16[M, D];
            weight w: f16[D, D], b: f16[D];
            output y = x @ w^T + b + x;
        }
    }
}

/// The TOML graphs of `graphs/`: a single kernel, so a struct and a free
/// function.
mod kernels {
    include!(concat!(env!("OUT_DIR"), "/fusion_user_crate_kernels.rs"));
}

/// `len` elements alternating between 0.5 and -0.25, on the device.
fn device_values(stream: &Arc<CudaStream>, len: usize) -> Result<CudaSlice<f16>, Box<dyn std::error::Error>> {
    let values: Vec<f16> = (0..len).map(|i| f16::from_f32(if i % 2 == 0 { 0.5 } else { -0.25 })).collect();
    Ok(stream.clone_htod(&values)?)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const D: usize = 64;
    let rows = 8;
    let stream = CudaContext::new(0)?.default_stream();
    let (w, b, x) = (device_values(&stream, D * D)?, device_values(&stream, D)?, device_values(&stream, rows * D)?);
    let mut y = stream.alloc_zeros::<f16>(rows * D)?;
    let weights = model::ResidualWeights { w: Tensor::new(&w, [D, D])?, b: Tensor::new(&b, [D])? };
    let mut residual = model::Residual::new(&stream, weights)?;
    residual.run(&stream, &Tensor::new(&x, [rows, D])?, &mut TensorMut::new(&mut y, [rows, D])?)?;
    let mut activated = stream.alloc_zeros::<f16>(rows * D)?;
    kernels::gelu_layer(&stream, &Tensor::new(&y, [rows, D])?, &Tensor::new(&w, [D, D])?, &Tensor::new(&b, [D])?, &mut TensorMut::new(&mut activated, [rows, D])?)?;
    stream.synchronize()?;
    Ok(())
}
"#;

/// Writes the crate into `target/user-crate` and runs clippy on it (its
/// library and binary; fusion's own crates are built as dependencies, not
/// linted), with `-D warnings -W clippy::pedantic`, then rustdoc with
/// `-D warnings`.
pub fn check_warning_free(workspace: &Workspace, toolchain: &Toolchain) -> Result<()> {
    let dir = write_crate(workspace, "user-crate", "")?;
    // Clippy, then rustdoc: the generated docs' links must resolve with the
    // features a user crate gives fusion (none of `cli`, `testing`).
    let clippy = [
        "clippy",
        "--no-deps",
        "--all-targets",
        "--",
        "-D",
        "warnings",
        "-W",
        "clippy::pedantic",
    ];
    let doc = ["doc", "--no-deps"];
    for (args, rustdocflags) in [(&clippy[..], None), (&doc[..], Some("-D warnings"))] {
        let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        toolchain.apply_to(&mut command);
        command
            .current_dir(&dir)
            .env("CARGO_TARGET_DIR", workspace.root.join("target"))
            .env("FUSION_SKIP_NVCC", "1")
            .env("NVCC", "/nonexistent/nvcc")
            .args(args);
        if let Some(flags) = rustdocflags {
            command.env("RUSTDOCFLAGS", flags);
        }
        let status = process::run_inheriting(&mut command)?;
        if !status.success() {
            return Err(Error::new(format!(
                "code generated into a user crate is not warning-free: `{}` (in {}) ended with {status}",
                display_command(&command),
                workspace.display(&dir)
            )));
        }
    }
    Ok(())
}

/// Builds the crate, in `target/user-crate-archs`, for sm80 alone (its
/// features) by nvcc, beside fusion with its shipped kernels for sm90 (whose
/// objects the workspace's tests have cached), and runs its library's test:
/// each struct's `ARCHS`, which its wrappers dispatch among, is the crate's
/// own generation, not fusion's.
pub fn check_own_archs(workspace: &Workspace, toolchain: &Toolchain) -> Result<()> {
    let dir = write_crate(workspace, "user-crate-archs", r#""kernels", "sm90""#)?;
    cargo_with_nvcc(
        workspace,
        toolchain,
        &dir,
        &["test", "--lib", "--no-default-features", "--features", "sm80"],
        "a crate built for other generations than fusion's",
    )
}

/// Runs cargo with `args` in the crate at `dir`, its kernels built by nvcc
/// for the generations its features name (none of the environment's
/// overrides), in the workspace's target folder so that crates.io's
/// dependencies are not built again; on failure the error names `what`
/// failed, the command and the folder.
pub fn cargo_with_nvcc(
    workspace: &Workspace,
    toolchain: &Toolchain,
    dir: &Path,
    args: &[&str],
    what: &str,
) -> Result<()> {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    toolchain.apply_to(&mut command);
    command
        .current_dir(dir)
        .env("CARGO_TARGET_DIR", workspace.root.join("target"))
        .env_remove("FUSION_SKIP_NVCC")
        .env_remove("FUSION_ARCHS")
        .env_remove("CUDA_COMPUTE_CAP")
        .args(args);
    let status = process::run_inheriting(&mut command)?;
    if status.success() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "{what}: `{}` (in {}) ended with {status}",
            display_command(&command),
            workspace.display(dir)
        )))
    }
}

/// Writes the crate into `target/<folder>`, fusion's features in its
/// manifest (`"kernels", "sm90"`), with the workspace's `Cargo.lock`, and
/// returns its folder.
fn write_crate(workspace: &Workspace, folder: &str, fusion_features: &str) -> Result<std::path::PathBuf> {
    let dir = workspace.root.join("target").join(folder);
    let root = workspace.root.display().to_string();
    let manifest = MANIFEST
        .replace("{root}", &root)
        .replace("{fusion_features}", fusion_features);
    for (file, contents) in [
        ("Cargo.toml", manifest.as_str()),
        ("build.rs", BUILD_RS),
        ("src/lib.rs", LIB_RS),
        ("src/main.rs", MAIN_RS),
        ("graphs/gelu_layer.toml", GELU_LAYER_TOML),
    ] {
        write_if_changed(&dir.join(file), contents)?;
    }
    // Resolved as the workspace is, so that no dependency is built twice.
    std::fs::copy(workspace.root.join("Cargo.lock"), dir.join("Cargo.lock"))
        .map_err(|e| Error::new(format!("cannot copy Cargo.lock into {}: {e}", dir.display())))?;
    Ok(dir)
}

/// Writes `contents` to `path` unless it already holds them, so that an
/// unchanged crate is not rebuilt.
pub fn write_if_changed(path: &Path, contents: &str) -> Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|old| old == contents) {
        return Ok(());
    }
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent)
            .map_err(|e| Error::new(format!("cannot create {}: {e}", parent.display())))?;
    }
    std::fs::write(path, contents).map_err(|e| Error::new(format!("cannot write {}: {e}", path.display())))
}
