//! Finds the two external tools a fusion build needs, or installs them inside
//! the checkout: nvcc (CUDA 13.0) to compile kernels, libclang for bindgen.
//!
//! What was found is saved to `target/toolchain/env` and reused while its files
//! still exist, so only the first run on a machine does any work. Commands that
//! run cargo pass the result on as `NVCC`, `CUDA_HOME` and `LIBCLANG_PATH`, the
//! variables build scripts look at.

use crate::error::{Error, Result};
use crate::process::{self, find_on_path, format_duration, is_executable, running_as_root};
use crate::targets;
use crate::workspace::Workspace;
use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

/// The CUDA 13.0 compiler wheels on PyPI. Pinned to 13.0 because the GPU
/// machines run driver 580 (CUDA 13.0), which cannot JIT the PTX of a newer nvcc.
const NVCC_WHEELS: &[&str] = &[
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-cccl==13.0.*",
];
/// Measured for the wheels above: about 105 MB to download, 270 MB unpacked.
const NVCC_WHEELS_SIZE: &str = "about 105 MB download, 270 MB on disk";
/// Where the wheels put the CUDA tree, relative to pip's `--target`.
const PYPI_CUDA_HOME: &str = "nvidia/cu13";

/// The libclang wheel, for machines where apt-get cannot be used.
const LIBCLANG_WHEEL: &str = "libclang==18.1.1";
/// Where that wheel puts `libclang.so`, relative to pip's `--target`.
const PYPI_LIBCLANG_DIR: &str = "clang/native";

/// A kernel touching what fusion's kernels use: the half and bfloat16 headers
/// (found through nvcc's include path) and device code for every architecture.
const SMOKE_KERNEL: &str = r#"// Written by `cargo xtask` to check that nvcc, its headers and its device
// back ends work. Only the object file is produced; no GPU is needed.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

__global__ void scale_add(const __half* x, __nv_bfloat16* y, float alpha, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = __float2bfloat16(alpha * __half2float(x[i]) + __bfloat162float(y[i]));
    }
}
"#;

/// How a tool was found; saved in the env file so a cached run reports the same.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    NvccVariable,
    CudaHomeVariable,
    CudaPathVariable,
    SearchPath,
    LibclangPathVariable,
    System,
    InstalledFromPypi,
    InstalledWithApt,
}

impl Origin {
    const ALL: [Origin; 8] = [
        Origin::NvccVariable,
        Origin::CudaHomeVariable,
        Origin::CudaPathVariable,
        Origin::SearchPath,
        Origin::LibclangPathVariable,
        Origin::System,
        Origin::InstalledFromPypi,
        Origin::InstalledWithApt,
    ];

    /// The word stored in the env file.
    fn key(self) -> &'static str {
        match self {
            Origin::NvccVariable => "nvcc-variable",
            Origin::CudaHomeVariable => "cuda-home-variable",
            Origin::CudaPathVariable => "cuda-path-variable",
            Origin::SearchPath => "path",
            Origin::LibclangPathVariable => "libclang-path-variable",
            Origin::System => "system",
            Origin::InstalledFromPypi => "pypi",
            Origin::InstalledWithApt => "apt",
        }
    }

    fn from_key(key: &str) -> Option<Origin> {
        Origin::ALL.into_iter().find(|origin| origin.key() == key)
    }
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Origin::NvccVariable => "from NVCC",
            Origin::CudaHomeVariable => "from CUDA_HOME",
            Origin::CudaPathVariable => "from CUDA_PATH",
            Origin::SearchPath => "on PATH",
            Origin::LibclangPathVariable => "from LIBCLANG_PATH",
            Origin::System => "system",
            Origin::InstalledFromPypi => "installed from PyPI",
            Origin::InstalledWithApt => "installed with apt-get",
        })
    }
}

/// The tools a build needs, each checked to exist.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Toolchain {
    pub nvcc: PathBuf,
    /// As nvcc reports it: "13.0.88".
    pub nvcc_version: String,
    pub nvcc_origin: Origin,
    /// The CUDA tree nvcc belongs to (`include/`, `lib/`), when it has one.
    pub cuda_home: Option<PathBuf>,
    /// The directory holding `libclang.so` (or the file itself, as
    /// `LIBCLANG_PATH` may name either).
    pub libclang_path: PathBuf,
    pub libclang_origin: Origin,
}

impl Toolchain {
    /// The variables a child cargo needs so that build scripts find the tools.
    /// nvcc's directory also goes first on `PATH`, for tools that look only there.
    pub fn env_vars(&self) -> Vec<(&'static str, OsString)> {
        let mut vars = vec![("NVCC", self.nvcc.clone().into_os_string())];
        if let Some(cuda_home) = &self.cuda_home {
            vars.push(("CUDA_HOME", cuda_home.clone().into_os_string()));
        }
        vars.push(("LIBCLANG_PATH", self.libclang_path.clone().into_os_string()));
        if let Some(nvcc_dir) = self.nvcc.parent() {
            let mut dirs = vec![nvcc_dir.to_path_buf()];
            dirs.extend(std::env::var_os("PATH").iter().flat_map(std::env::split_paths));
            if let Ok(path) = std::env::join_paths(dirs) {
                vars.push(("PATH", path));
            }
        }
        vars
    }

    pub fn apply_to(&self, command: &mut Command) {
        command.envs(self.env_vars());
    }

    fn print(&self, note: &str) {
        println!(
            "nvcc {}: {} ({}{note})",
            self.nvcc_version,
            self.nvcc.display(),
            self.nvcc_origin
        );
        println!(
            "libclang: {} ({}{note})",
            self.libclang_path.display(),
            self.libclang_origin
        );
    }

    /// The env file: `KEY=VALUE` lines, with the three variables build scripts read.
    fn to_env_file(&self) -> String {
        let mut text = String::from(
            "# The toolchain `cargo xtask toolchain` found; delete this file to search again.\n",
        );
        let mut line = |key: &str, value: &str| text.push_str(&format!("{key}={value}\n"));
        line("NVCC", &self.nvcc.to_string_lossy());
        line("NVCC_VERSION", &self.nvcc_version);
        line("NVCC_ORIGIN", self.nvcc_origin.key());
        if let Some(cuda_home) = &self.cuda_home {
            line("CUDA_HOME", &cuda_home.to_string_lossy());
        }
        line("LIBCLANG_PATH", &self.libclang_path.to_string_lossy());
        line("LIBCLANG_ORIGIN", self.libclang_origin.key());
        text
    }

    fn from_env_file(text: &str) -> Option<Toolchain> {
        let value = |key: &str| {
            text.lines()
                .filter(|line| !line.trim_start().starts_with('#'))
                .filter_map(|line| line.split_once('='))
                .find(|(k, _)| k.trim() == key)
                .map(|(_, v)| v.trim().to_string())
        };
        Some(Toolchain {
            nvcc: PathBuf::from(value("NVCC")?),
            nvcc_version: value("NVCC_VERSION")?,
            nvcc_origin: Origin::from_key(&value("NVCC_ORIGIN")?)?,
            cuda_home: value("CUDA_HOME").map(PathBuf::from),
            libclang_path: PathBuf::from(value("LIBCLANG_PATH")?),
            libclang_origin: Origin::from_key(&value("LIBCLANG_ORIGIN")?)?,
        })
    }

    /// Whether a saved toolchain can be used as is: its files are still there,
    /// and no variable set now asks for a different nvcc or libclang.
    fn still_valid(&self) -> bool {
        let files_exist = is_executable(&self.nvcc)
            && self.cuda_home.as_deref().is_none_or(Path::is_dir)
            && holds_libclang(&self.libclang_path);
        let nvcc_agrees = match nvcc_from_variables(false) {
            Ok(Some((nvcc, _))) => nvcc == self.nvcc,
            Ok(None) => true,
            Err(_) => false,
        };
        let libclang_agrees =
            env_path("LIBCLANG_PATH").is_none_or(|path| absolute(&path) == self.libclang_path);
        files_exist && nvcc_agrees && libclang_agrees
    }
}

/// `cargo xtask toolchain`: the saved toolchain when it is still valid, else a
/// search (installing what is missing), a test compile, and a new env file.
pub fn bootstrap(workspace: &Workspace) -> Result<Toolchain> {
    let env_file = workspace.toolchain_dir().join("env");
    if let Some(saved) = std::fs::read_to_string(&env_file)
        .ok()
        .and_then(|t| Toolchain::from_env_file(&t))
        && saved.still_valid()
    {
        saved.print(&format!("; saved in {}", workspace.display(&env_file)));
        return Ok(saved);
    }

    let (nvcc, nvcc_origin) = match find_nvcc(workspace)? {
        Some(found) => found,
        None => (install_nvcc(workspace)?, Origin::InstalledFromPypi),
    };
    let (nvcc_version, version_line) = nvcc_version(&nvcc)?;
    println!("{}: {version_line}", nvcc.display());
    warn_if_newer_than_driver(&nvcc_version);
    smoke_compile(workspace, &nvcc)?;
    let (libclang_path, libclang_origin) = find_or_install_libclang(workspace)?;

    let cuda_home = nvcc
        .parent()
        .and_then(Path::parent)
        .filter(|home| home.join("include").join("cuda_runtime.h").is_file())
        .map(Path::to_path_buf);
    let toolchain = Toolchain {
        nvcc,
        nvcc_version,
        nvcc_origin,
        cuda_home,
        libclang_path,
        libclang_origin,
    };
    write_file(&env_file, &toolchain.to_env_file())?;
    toolchain.print("");
    println!(
        "saved to {} (delete it to search again)",
        workspace.display(&env_file)
    );
    Ok(toolchain)
}

/// A variable's value as a path, when set and not empty.
fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// nvcc as the variables name it: `NVCC` (a path, or a program on `PATH`),
/// else `<CUDA_HOME>/bin/nvcc`, else `<CUDA_PATH>/bin/nvcc`.
fn nvcc_from_variables(print_notes: bool) -> Result<Option<(PathBuf, Origin)>> {
    if let Some(nvcc) = env_path("NVCC") {
        let resolved = if nvcc.components().count() == 1 {
            find_on_path(&nvcc.to_string_lossy())
        } else {
            Some(absolute(&nvcc)).filter(|path| is_executable(path))
        };
        return match resolved {
            Some(path) => Ok(Some((path, Origin::NvccVariable))),
            None => Err(Error::new(format!(
                "NVCC is set to `{}`, which is not an executable file; point it at nvcc or unset it",
                nvcc.display()
            ))),
        };
    }
    for (variable, origin) in [
        ("CUDA_HOME", Origin::CudaHomeVariable),
        ("CUDA_PATH", Origin::CudaPathVariable),
    ] {
        if let Some(home) = env_path(variable) {
            let nvcc = absolute(&home.join("bin").join("nvcc"));
            if is_executable(&nvcc) {
                return Ok(Some((nvcc, origin)));
            }
            if print_notes {
                println!(
                    "note: {variable} is set to `{}`, but it has no bin/nvcc; looking further",
                    home.display()
                );
            }
        }
    }
    Ok(None)
}

/// Looks for nvcc in the conventional places, then in the project-local install.
fn find_nvcc(workspace: &Workspace) -> Result<Option<(PathBuf, Origin)>> {
    if let Some(found) = nvcc_from_variables(true)? {
        return Ok(Some(found));
    }
    if let Some(nvcc) = find_on_path("nvcc") {
        return Ok(Some((nvcc, Origin::SearchPath)));
    }
    let usr_local = PathBuf::from("/usr/local/cuda/bin/nvcc");
    if is_executable(&usr_local) {
        return Ok(Some((usr_local, Origin::System)));
    }
    let project_local = pypi_nvcc(workspace);
    if is_executable(&project_local) {
        return Ok(Some((project_local, Origin::InstalledFromPypi)));
    }
    Ok(None)
}

fn pypi_nvcc(workspace: &Workspace) -> PathBuf {
    workspace
        .toolchain_dir()
        .join("cuda")
        .join(PYPI_CUDA_HOME)
        .join("bin")
        .join("nvcc")
}

fn install_nvcc(workspace: &Workspace) -> Result<PathBuf> {
    println!("nvcc: not found in NVCC, CUDA_HOME, CUDA_PATH, PATH or /usr/local/cuda");
    require_pip("nvcc", "set NVCC to an existing nvcc")?;
    let target = workspace.toolchain_dir().join("cuda");
    println!(
        "installing CUDA 13.0 nvcc from PyPI into {} ({NVCC_WHEELS_SIZE})...",
        workspace.display(&target)
    );
    let elapsed = pip_install(workspace, &target, NVCC_WHEELS)?;
    let nvcc = pypi_nvcc(workspace);
    if !is_executable(&nvcc) {
        return Err(Error::new(format!(
            "pip installed the CUDA wheels, but {} is missing: the wheels' layout has changed",
            workspace.display(&nvcc)
        )));
    }
    println!("installed nvcc in {elapsed}");
    Ok(nvcc)
}

/// Checks that `python3 -m pip` works before a long install starts.
fn require_pip(tool: &str, alternative: &str) -> Result<()> {
    let works = find_on_path("python3").is_some()
        && Command::new("python3")
            .args(["-m", "pip", "--version"])
            .stdin(std::process::Stdio::null())
            .output()
            .is_ok_and(|output| output.status.success());
    if works {
        Ok(())
    } else {
        Err(Error::new(format!(
            "python3 with pip is needed to install {tool}; install it (e.g. apt-get install python3-pip) or {alternative}"
        )))
    }
}

/// `pip install --target` into a scratch directory renamed into place at the
/// end, so an interrupted install never looks like a finished one.
/// Returns how long it took, formatted.
fn pip_install(workspace: &Workspace, target: &Path, packages: &[&str]) -> Result<String> {
    let mut scratch = target.as_os_str().to_owned();
    scratch.push(".partial");
    let scratch = PathBuf::from(scratch);
    for dir in [target, &scratch] {
        remove_dir(dir)?;
    }
    let start = Instant::now();
    let mut pip = Command::new("python3");
    pip.current_dir(&workspace.root)
        .args(["-m", "pip", "install", "--target"])
        .arg(workspace.display(&scratch))
        .arg("--no-deps")
        .args(packages)
        .env("PIP_DISABLE_PIP_VERSION_CHECK", "1")
        .env("PIP_ROOT_USER_ACTION", "ignore")
        .env("PIP_NO_INPUT", "1");
    if let Err(error) = process::run_echoing_stderr(&mut pip) {
        let _ = std::fs::remove_dir_all(&scratch);
        return Err(error);
    }
    std::fs::rename(&scratch, target).map_err(|e| {
        Error::new(format!(
            "could not rename {} to {}: {e}",
            scratch.display(),
            target.display()
        ))
    })?;
    Ok(format_duration(start.elapsed()))
}

fn remove_dir(dir: &Path) -> Result<()> {
    if dir.exists() {
        std::fs::remove_dir_all(dir)
            .map_err(|e| Error::new(format!("could not remove {}: {e}", dir.display())))?;
    }
    Ok(())
}

fn write_file(path: &Path, contents: &str) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)
            .map_err(|e| Error::new(format!("could not create {}: {e}", dir.display())))?;
    }
    std::fs::write(path, contents).map_err(|e| Error::new(format!("could not write {}: {e}", path.display())))
}

/// Runs `nvcc --version`; returns "13.0.88" and the line it came from.
fn nvcc_version(nvcc: &Path) -> Result<(String, String)> {
    let output = process::run_quiet(Command::new(nvcc).arg("--version"))?;
    let text = String::from_utf8_lossy(&output.stdout);
    parse_nvcc_version(&text).ok_or_else(|| {
        Error::new(format!(
            "`{} --version` printed no release line; is it nvcc?",
            nvcc.display()
        ))
    })
}

/// Finds "Cuda compilation tools, release 13.0, V13.0.88" and takes "13.0.88".
fn parse_nvcc_version(text: &str) -> Option<(String, String)> {
    let line = text.lines().find(|line| line.contains("release"))?.trim();
    let version = line.split_whitespace().last()?.strip_prefix('V')?;
    Some((version.to_string(), line.to_string()))
}

fn major_minor(version: &str) -> Option<(u32, u32)> {
    let mut parts = version.split('.').map(str::parse::<u32>);
    Some((parts.next()?.ok()?, parts.next()?.ok()?))
}

fn warn_if_newer_than_driver(version: &str) {
    if major_minor(version).is_some_and(|release| release > (13, 0)) {
        println!(
            "note: nvcc {version} is newer than CUDA 13.0; a driver 580 GPU runs its sm_* code but \
             cannot JIT its PTX (set NVCC to a 13.0 nvcc to match)"
        );
    }
}

/// The command that compiles the test kernel, for running and for printing.
pub fn smoke_compile_command(workspace: &Workspace, nvcc: &Path) -> Command {
    let dir = workspace.toolchain_dir().join("smoke");
    let mut command = Command::new(nvcc);
    command
        .arg("-c")
        .arg(dir.join("smoke.cu"))
        .arg("-o")
        .arg(dir.join("smoke.o"));
    // Every generation's machine code, with the flags its builds use.
    for generation in targets::generations() {
        command.arg(&generation.sass_gencode);
    }
    command
}

/// Compiles a small kernel for every target architecture, to prove nvcc, its
/// host compiler and its headers work together. Needs no GPU.
pub fn smoke_compile(workspace: &Workspace, nvcc: &Path) -> Result<()> {
    let source = workspace.toolchain_dir().join("smoke").join("smoke.cu");
    write_file(&source, SMOKE_KERNEL)?;
    print!(
        "checking nvcc: compiling a test kernel for {}... ",
        targets::names()
    );
    let _ = std::io::Write::flush(&mut std::io::stdout());
    let start = Instant::now();
    let result = process::run_quiet(&mut smoke_compile_command(workspace, nvcc));
    match result {
        Ok(_) => {
            println!("ok ({})", format_duration(start.elapsed()));
            Ok(())
        }
        Err(error) => {
            println!("failed");
            if find_on_path("g++").is_none() && env_path("NVCC_CCBIN").is_none() {
                return Err(Error::new(
                    "nvcc needs a C++ host compiler and g++ is not on PATH; install it \
                     (e.g. apt-get install g++) or set NVCC_CCBIN to one",
                ));
            }
            Err(error)
        }
    }
}

/// A directory holding a libclang shared library, or such a file itself.
fn holds_libclang(path: &Path) -> bool {
    if path.is_file() {
        return path
            .file_name()
            .is_some_and(|name| is_libclang_file_name(&name.to_string_lossy()));
    }
    std::fs::read_dir(path).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|entry| is_libclang_file_name(&entry.file_name().to_string_lossy()))
    })
}

/// `libclang.so`, `libclang.so.1`, `libclang-14.so.1`; not `libclang-cpp.so`
/// (the C++ library, which bindgen cannot use) nor static archives.
fn is_libclang_file_name(name: &str) -> bool {
    let Some(rest) = name.strip_prefix("libclang") else {
        return false;
    };
    if rest.starts_with(".so") {
        return true;
    }
    rest.strip_prefix('-').is_some_and(|versioned| {
        versioned.starts_with(|c: char| c.is_ascii_digit()) && versioned.contains(".so")
    })
}

/// Debian and Ubuntu's places: `/usr/lib/llvm-<N>/lib` (newest first), then the
/// multiarch library directory.
fn system_libclang_dir() -> Option<PathBuf> {
    let mut llvm_dirs: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().to_string_lossy().into_owned();
            let version = name.strip_prefix("llvm-")?.split('.').next()?.parse().ok()?;
            Some((version, entry.path().join("lib")))
        })
        .collect();
    llvm_dirs.sort_by_key(|(version, _)| std::cmp::Reverse(*version));
    let multiarch = PathBuf::from(format!("/usr/lib/{}-linux-gnu", std::env::consts::ARCH));
    llvm_dirs
        .into_iter()
        .map(|(_, dir)| dir)
        .chain([multiarch])
        .find(|dir| holds_libclang(dir))
}

fn find_or_install_libclang(workspace: &Workspace) -> Result<(PathBuf, Origin)> {
    if let Some(path) = env_path("LIBCLANG_PATH") {
        let path = absolute(&path);
        if holds_libclang(&path) {
            return Ok((path, Origin::LibclangPathVariable));
        }
        return Err(Error::new(format!(
            "LIBCLANG_PATH is set to `{}`, which holds no libclang*.so; point it at the directory \
             holding libclang.so or unset it",
            path.display()
        )));
    }
    if let Some(dir) = system_libclang_dir() {
        return Ok((dir, Origin::System));
    }
    let pypi_dir = workspace.toolchain_dir().join("libclang").join(PYPI_LIBCLANG_DIR);
    if holds_libclang(&pypi_dir) {
        return Ok((pypi_dir, Origin::InstalledFromPypi));
    }
    if running_as_root() && find_on_path("apt-get").is_some() {
        match apt_install_libclang() {
            Ok(()) => match system_libclang_dir() {
                Some(dir) => return Ok((dir, Origin::InstalledWithApt)),
                None => println!("note: apt-get installed libclang-dev, but no libclang*.so turned up"),
            },
            Err(error) => println!("note: {error}"),
        }
        println!("falling back to the libclang wheel from PyPI");
    }
    install_pypi_libclang(workspace, &pypi_dir)
}

fn apt_install_libclang() -> Result<()> {
    println!("installing libclang-dev with apt-get (for bindgen)...");
    let start = Instant::now();
    // Waits for the package lock instead of failing when another apt runs.
    let apt = |args: &[&str]| {
        let mut command = Command::new("apt-get");
        command
            .args(["-o", "DPkg::Lock::Timeout=600", "-q"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive");
        command
    };
    let install = ["install", "-y", "--no-install-recommends", "libclang-dev"];
    if process::run_quiet(&mut apt(&install)).is_err() {
        // A fresh container has no package lists yet.
        process::run_quiet(&mut apt(&["update"]))?;
        process::run_quiet(&mut apt(&install))?;
    }
    println!("installed libclang-dev in {}", format_duration(start.elapsed()));
    Ok(())
}

fn install_pypi_libclang(workspace: &Workspace, pypi_dir: &Path) -> Result<(PathBuf, Origin)> {
    require_pip(
        "libclang",
        "set LIBCLANG_PATH to the directory holding libclang.so",
    )?;
    let target = workspace.toolchain_dir().join("libclang");
    println!(
        "installing {LIBCLANG_WHEEL} from PyPI into {} (about 25 MB)...",
        workspace.display(&target)
    );
    let elapsed = pip_install(workspace, &target, &[LIBCLANG_WHEEL])?;
    if !holds_libclang(pypi_dir) {
        return Err(Error::new(format!(
            "pip installed {LIBCLANG_WHEEL}, but {} holds no libclang.so: the wheel's layout has changed",
            workspace.display(pypi_dir)
        )));
    }
    println!("installed libclang in {elapsed}");
    println!(
        "note: this libclang lacks clang's builtin headers (stddef.h); install libclang-dev \
         for headers that need them"
    );
    Ok((pypi_dir.to_path_buf(), Origin::InstalledFromPypi))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_release_line_of_nvcc() {
        let text = "nvcc: NVIDIA (R) Cuda compiler driver\n\
                    Copyright (c) 2005-2025 NVIDIA Corporation\n\
                    Cuda compilation tools, release 13.0, V13.0.88\n\
                    Build cuda_13.0.r13.0/compiler.36424714_0\n";
        let (version, line) = parse_nvcc_version(text).unwrap();
        assert_eq!(version, "13.0.88");
        assert_eq!(line, "Cuda compilation tools, release 13.0, V13.0.88");
        assert_eq!(major_minor(&version), Some((13, 0)));
        assert_eq!(parse_nvcc_version("gcc (Debian 12.2.0) 12.2.0\n"), None);
    }

    #[test]
    fn recognises_libclang_but_not_its_cpp_sibling() {
        for name in [
            "libclang.so",
            "libclang.so.1",
            "libclang-14.so.1",
            "libclang-14.0.6.so",
        ] {
            assert!(is_libclang_file_name(name), "{name}");
        }
        for name in [
            "libclang-cpp.so.14",
            "libclangAST.a",
            "libclang.a",
            "libLLVM-14.so",
            "clang",
        ] {
            assert!(!is_libclang_file_name(name), "{name}");
        }
    }

    #[test]
    fn env_file_round_trips() {
        let toolchain = Toolchain {
            nvcc: PathBuf::from("/opt/cuda/bin/nvcc"),
            nvcc_version: "13.0.88".into(),
            nvcc_origin: Origin::InstalledFromPypi,
            cuda_home: Some(PathBuf::from("/opt/cuda")),
            libclang_path: PathBuf::from("/usr/lib/llvm-14/lib"),
            libclang_origin: Origin::InstalledWithApt,
        };
        let text = toolchain.to_env_file();
        assert!(text.contains("\nNVCC=/opt/cuda/bin/nvcc\n"), "{text}");
        assert!(text.contains("\nLIBCLANG_PATH=/usr/lib/llvm-14/lib\n"), "{text}");
        assert_eq!(Toolchain::from_env_file(&text), Some(toolchain.clone()));

        let without_home = Toolchain {
            cuda_home: None,
            ..toolchain
        };
        assert_eq!(
            Toolchain::from_env_file(&without_home.to_env_file()),
            Some(without_home)
        );
    }

    #[test]
    fn a_damaged_env_file_is_ignored() {
        assert_eq!(Toolchain::from_env_file("NVCC=/usr/bin/nvcc\n"), None);
        assert_eq!(
            Toolchain::from_env_file(
                "NVCC=/a\nNVCC_VERSION=13.0\nNVCC_ORIGIN=somewhere\nLIBCLANG_PATH=/b\nLIBCLANG_ORIGIN=system\n"
            ),
            None
        );
    }

    #[test]
    fn every_origin_has_a_distinct_key() {
        for origin in Origin::ALL {
            assert_eq!(Origin::from_key(origin.key()), Some(origin));
        }
    }
}
