//! Finding the CUDA toolchain: nvcc, its run-time library directory, and the
//! project-local toolchain file that `cargo xtask toolchain` writes.
//!
//! nvcc is looked for where CUDA tools conventionally look, then in the
//! project's own toolchain: `NVCC` (the path of nvcc), `CUDA_HOME` and
//! `CUDA_PATH` (`<dir>/bin/nvcc`), each directory of `PATH`,
//! `/usr/local/cuda/bin/nvcc`, and last the `NVCC` or `CUDA_HOME` of
//! `<target dir>/toolchain/env`. The first that names an existing file wins;
//! an explicit `NVCC` that does not exist is an error rather than skipped.

use super::BuildError;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;

/// A snapshot of what discovery reads from the machine: the environment
/// variables and the system CUDA's nvcc, so tests can supply their own.
#[derive(Clone, Debug)]
pub struct Env {
    vars: BTreeMap<String, OsString>,
    system_nvcc: PathBuf,
}

impl Env {
    /// Variables read from the process environment.
    const NAMES: &'static [&'static str] = &[
        "NVCC",
        "CUDA_HOME",
        "CUDA_PATH",
        "PATH",
        "LIBCLANG_PATH",
        "FUSION_CACHE_DIR",
        "CARGO_TARGET_DIR",
        "NVCC_CCBIN",
        "NVCC_PREPEND_FLAGS",
        "NVCC_APPEND_FLAGS",
    ];

    /// The variables discovery reads, as the process has them.
    pub fn from_process() -> Env {
        Env::from_pairs(
            Env::NAMES
                .iter()
                .filter_map(|name| std::env::var_os(name).map(|value| (name.to_string(), value))),
        )
    }

    /// Variables given as pairs (for tests), with the system nvcc looked for at [`Env::SYSTEM_NVCC`].
    pub fn from_pairs<K: Into<String>, V: Into<OsString>>(pairs: impl IntoIterator<Item = (K, V)>) -> Env {
        Env {
            vars: pairs.into_iter().map(|(k, v)| (k.into(), v.into())).collect(),
            system_nvcc: PathBuf::from(Env::SYSTEM_NVCC),
        }
    }

    /// Where a system-wide CUDA install keeps nvcc.
    pub const SYSTEM_NVCC: &'static str = "/usr/local/cuda/bin/nvcc";

    /// The same variables with the system nvcc looked for at `path` instead.
    pub fn with_system_nvcc(self, path: impl Into<PathBuf>) -> Env {
        Env {
            system_nvcc: path.into(),
            ..self
        }
    }

    /// The variable's value; an empty value counts as unset.
    pub fn get(&self, name: &str) -> Option<OsString> {
        self.vars.get(name).filter(|v| !v.is_empty()).cloned()
    }
}

/// `<target dir>/toolchain/env`: `KEY=VALUE` lines describing a toolchain
/// installed into the project by `cargo xtask toolchain`.
#[derive(Clone, Debug, Default)]
pub struct ToolchainFile {
    /// Where it was read from; `None` when there is none.
    pub path: Option<PathBuf>,
    /// Where it was looked for, for error messages.
    pub looked_for: Option<PathBuf>,
    vars: BTreeMap<String, String>,
}

impl ToolchainFile {
    /// Reads `<target_dir>/toolchain/env` if it exists.
    pub fn load(target_dir: Option<&Path>) -> Result<ToolchainFile, BuildError> {
        let Some(path) = target_dir.map(|t| t.join("toolchain").join("env")) else {
            return Ok(ToolchainFile::default());
        };
        match std::fs::read_to_string(&path) {
            Ok(text) => Ok(ToolchainFile::parse(&text, path)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(ToolchainFile {
                looked_for: Some(path),
                ..ToolchainFile::default()
            }),
            Err(e) => Err(BuildError::Io {
                action: "cannot read",
                path,
                source: e,
            }),
        }
    }

    /// Parses `KEY=VALUE` lines; blank lines and `#` comments are skipped.
    pub fn parse(text: &str, path: PathBuf) -> ToolchainFile {
        let vars = text
            .lines()
            .map(str::trim)
            .filter(|line| !line.is_empty() && !line.starts_with('#'))
            .filter_map(|line| line.split_once('='))
            .map(|(key, value)| (key.trim().to_owned(), value.trim().to_owned()))
            .filter(|(key, value)| !key.is_empty() && !value.is_empty())
            .collect();
        ToolchainFile {
            looked_for: Some(path.clone()),
            path: Some(path),
            vars,
        }
    }

    /// The value of `key`, if set.
    pub fn get(&self, key: &str) -> Option<&str> {
        self.vars.get(key).map(String::as_str)
    }
}

/// The cargo target directory that holds `out_dir`: the nearest ancestor
/// with cargo's `CACHEDIR.TAG`, else the nearest one named `target`, else an
/// absolute `CARGO_TARGET_DIR`.
pub fn find_target_dir(out_dir: &Path, cargo_target_dir: Option<&std::ffi::OsStr>) -> Option<PathBuf> {
    let ancestors = || out_dir.ancestors().skip(1);
    ancestors()
        .find(|dir| dir.join("CACHEDIR.TAG").is_file())
        .or_else(|| ancestors().find(|dir| dir.file_name().is_some_and(|n| n == "target")))
        .map(Path::to_owned)
        .or_else(|| cargo_target_dir.map(PathBuf::from).filter(|p| p.is_absolute()))
}

/// Finds nvcc (see the module documentation for the order). On failure,
/// returns a description of every place searched.
pub fn find_nvcc(env: &Env, toolchain: &ToolchainFile) -> Result<PathBuf, Vec<String>> {
    let mut searched = Vec::new();
    if let Some(nvcc) = env.get("NVCC") {
        let nvcc = PathBuf::from(nvcc);
        if is_executable(&nvcc) {
            return Ok(nvcc);
        }
        // An explicit choice that is wrong should not be papered over by
        // whatever nvcc happens to be on PATH.
        return Err(vec![format!("NVCC={} (no such executable)", nvcc.display())]);
    }
    searched.push("NVCC (unset)".to_owned());
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        match env.get(var) {
            Some(dir) => {
                let nvcc = Path::new(&dir).join("bin").join("nvcc");
                if is_executable(&nvcc) {
                    return Ok(nvcc);
                }
                searched.push(format!("{var}: {}", nvcc.display()));
            }
            None => searched.push(format!("{var} (unset)")),
        }
    }
    match env.get("PATH") {
        Some(path) => {
            if let Some(nvcc) = std::env::split_paths(&path)
                .map(|dir| dir.join("nvcc"))
                .find(|nvcc| is_executable(nvcc))
            {
                return Ok(nvcc);
            }
            searched.push("every directory of PATH".to_owned());
        }
        None => searched.push("PATH (unset)".to_owned()),
    }
    if is_executable(&env.system_nvcc) {
        return Ok(env.system_nvcc.clone());
    }
    searched.push(env.system_nvcc.display().to_string());
    match &toolchain.path {
        Some(file) => {
            let candidates = [
                toolchain.get("NVCC").map(PathBuf::from),
                toolchain
                    .get("CUDA_HOME")
                    .map(|home| Path::new(home).join("bin").join("nvcc")),
            ];
            for nvcc in candidates.into_iter().flatten() {
                if is_executable(&nvcc) {
                    return Ok(nvcc);
                }
                searched.push(format!("{} (from {})", nvcc.display(), file.display()));
            }
            if toolchain.get("NVCC").is_none() && toolchain.get("CUDA_HOME").is_none() {
                searched.push(format!("{} (names neither NVCC nor CUDA_HOME)", file.display()));
            }
        }
        None => searched.push(match &toolchain.looked_for {
            Some(file) => format!("{} (not found)", file.display()),
            None => "target/toolchain/env (no target directory above OUT_DIR)".to_owned(),
        }),
    }
    Err(searched)
}

fn is_executable(path: &Path) -> bool {
    let Ok(meta) = std::fs::metadata(path) else {
        return false;
    };
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt as _;
        meta.is_file() && meta.permissions().mode() & 0o111 != 0
    }
    #[cfg(not(unix))]
    {
        meta.is_file()
    }
}

/// An nvcc found and asked for its version.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Nvcc {
    /// The nvcc executable.
    pub program: PathBuf,
    /// The output of `nvcc --version`: part of every cache key, so a
    /// different nvcc never reuses another's objects.
    pub version: String,
}

impl Nvcc {
    /// [`find_nvcc`], then `nvcc --version`.
    pub fn find(env: &Env, toolchain: &ToolchainFile) -> Result<Nvcc, BuildError> {
        let program = find_nvcc(env, toolchain).map_err(|searched| BuildError::NvccNotFound { searched })?;
        let version = nvcc_version(&program)?;
        Ok(Nvcc { program, version })
    }

    /// The nvcc a build started in the current directory would use, for a
    /// caller outside a build script: the process environment, then the
    /// toolchain file under `CARGO_TARGET_DIR`, else `./target`.
    pub fn find_from_current_dir() -> Result<Nvcc, BuildError> {
        let env = Env::from_process();
        let target = env
            .get("CARGO_TARGET_DIR")
            .map_or_else(|| PathBuf::from("target"), PathBuf::from);
        Nvcc::find(&env, &ToolchainFile::load(Some(&target))?)
    }

    /// nvcc's release (`13.0.88`), else the last line of its version.
    pub fn release(&self) -> &str {
        release(&self.version).unwrap_or_else(|| self.version.lines().last().unwrap_or(""))
    }
}

/// `13.0.88` from `nvcc --version`'s `… release 13.0, V13.0.88`.
pub fn release(version: &str) -> Option<&str> {
    let line = version.lines().find(|line| line.contains("release"))?;
    Some(line.rsplit_once(", V")?.1.trim())
}

fn nvcc_version(nvcc: &Path) -> Result<String, BuildError> {
    let output = Command::new(nvcc).arg("--version").output().map_err(|e| {
        BuildError::Config(format!(
            "found nvcc at {} but could not run it: {e}",
            nvcc.display()
        ))
    })?;
    if !output.status.success() {
        return Err(BuildError::Config(format!(
            "`{} --version` failed ({}): {}",
            nvcc.display(),
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

/// The directory holding `libcudart_static.a` next to nvcc: `lib` in the
/// PyPI layout, `lib64` in a system install, `targets/<arch>-linux/lib` in
/// NVIDIA's split layout.
pub fn cuda_lib_dir(nvcc: &Path, target: &str) -> Result<PathBuf, BuildError> {
    let root = nvcc.parent().and_then(Path::parent).unwrap_or(Path::new("."));
    let arch = target.split('-').next().unwrap_or("x86_64");
    let candidates = [
        root.join("lib"),
        root.join("lib64"),
        root.join("targets").join(format!("{arch}-linux")).join("lib"),
        root.join("targets").join("sbsa-linux").join("lib"),
    ];
    candidates
        .iter()
        .find(|dir| dir.join("libcudart_static.a").is_file())
        .cloned()
        .ok_or_else(|| {
            BuildError::Config(format!(
                "libcudart_static.a was not found next to nvcc ({}); looked in {}. Install the CUDA run time (the `nvidia-cuda-runtime` wheel, or `cargo xtask toolchain`).",
                nvcc.display(),
                candidates.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::build::tests::TempTree;

    fn no_toolchain() -> ToolchainFile {
        ToolchainFile::default()
    }

    #[test]
    fn nvcc_variable_wins_over_everything() {
        let t = TempTree::new("order-nvcc");
        let explicit = t.exe("explicit/nvcc");
        t.exe("home/bin/nvcc");
        t.exe("path/nvcc");
        let env = Env::from_pairs([
            ("NVCC", explicit.clone().into_os_string()),
            ("CUDA_HOME", t.0.join("home").into_os_string()),
            ("PATH", t.0.join("path").into_os_string()),
        ]);
        assert_eq!(find_nvcc(&env, &no_toolchain()), Ok(explicit));
    }

    #[test]
    fn cuda_home_then_cuda_path_then_path() {
        let t = TempTree::new("order-home");
        let home = t.exe("home/bin/nvcc");
        let cuda_path = t.exe("cudapath/bin/nvcc");
        let on_path = t.exe("path/nvcc");
        let path_var = std::env::join_paths([t.0.join("empty"), t.0.join("path")]).unwrap();
        let full = Env::from_pairs([
            ("CUDA_HOME", t.0.join("home").into_os_string()),
            ("CUDA_PATH", t.0.join("cudapath").into_os_string()),
            ("PATH", path_var.clone()),
        ]);
        assert_eq!(find_nvcc(&full, &no_toolchain()), Ok(home));
        // A CUDA_HOME without nvcc is passed over, not fatal.
        let no_home = Env::from_pairs([
            ("CUDA_HOME", t.0.join("missing").into_os_string()),
            ("CUDA_PATH", t.0.join("cudapath").into_os_string()),
            ("PATH", path_var.clone()),
        ]);
        assert_eq!(find_nvcc(&no_home, &no_toolchain()), Ok(cuda_path));
        let only_path = Env::from_pairs([("PATH", path_var)]);
        assert_eq!(find_nvcc(&only_path, &no_toolchain()), Ok(on_path));
    }

    #[test]
    fn toolchain_file_is_the_last_resort() {
        let t = TempTree::new("order-toolchain");
        let nvcc = t.exe("toolchain/cuda/bin/nvcc");
        let file = ToolchainFile::parse(
            &format!(
                "# written by cargo xtask toolchain\nNVCC={}\nLIBCLANG_PATH=/opt/clang\n",
                nvcc.display()
            ),
            t.0.join("toolchain/env"),
        );
        assert_eq!(file.get("LIBCLANG_PATH"), Some("/opt/clang"));
        let env = Env::from_pairs([("PATH", t.0.join("nothing-here").into_os_string())])
            .with_system_nvcc(t.0.join("system/bin/nvcc"));
        assert_eq!(find_nvcc(&env, &file), Ok(nvcc.clone()));
        let home_only = ToolchainFile::parse(
            &format!("CUDA_HOME={}\n", t.0.join("toolchain/cuda").display()),
            t.0.join("toolchain/env"),
        );
        assert!(find_nvcc(&env, &home_only).is_ok());
        // A system CUDA comes before the toolchain file, after PATH.
        let system = t.exe("system/bin/nvcc");
        assert_eq!(find_nvcc(&env, &file), Ok(system));
        let on_path = t.exe("path/nvcc");
        let with_path = Env::from_pairs([("PATH", t.0.join("path").into_os_string())])
            .with_system_nvcc(t.0.join("system/bin/nvcc"));
        assert_eq!(find_nvcc(&with_path, &file), Ok(on_path));
    }

    #[test]
    fn a_wrong_nvcc_variable_is_reported_not_skipped() {
        let t = TempTree::new("wrong-nvcc");
        t.exe("path/nvcc");
        let env = Env::from_pairs([
            ("NVCC", t.0.join("nope/nvcc").into_os_string()),
            ("PATH", t.0.join("path").into_os_string()),
        ]);
        let searched = find_nvcc(&env, &no_toolchain()).unwrap_err();
        assert_eq!(searched.len(), 1);
        assert!(searched[0].starts_with("NVCC="), "{searched:?}");
    }

    #[test]
    fn missing_nvcc_error_lists_every_place_and_the_fix() {
        let t = TempTree::new("missing");
        let env = Env::from_pairs([
            ("CUDA_HOME", t.0.join("home").into_os_string()),
            ("PATH", t.0.join("path").into_os_string()),
        ])
        .with_system_nvcc(t.0.join("system/bin/nvcc"));
        let searched = find_nvcc(&env, &no_toolchain()).unwrap_err();
        let message = BuildError::NvccNotFound { searched }.to_string();
        for needle in [
            "NVCC (unset)",
            "CUDA_HOME: ",
            "CUDA_PATH (unset)",
            "PATH",
            "system/bin/nvcc",
            "target/toolchain/env",
            "run `cargo xtask toolchain` to install CUDA 13.0's nvcc into target/toolchain, or set NVCC",
        ] {
            assert!(message.contains(needle), "`{needle}` missing from: {message}");
        }
    }

    #[test]
    fn a_non_executable_file_is_not_nvcc() {
        let t = TempTree::new("noexec");
        std::fs::create_dir_all(t.0.join("path")).unwrap();
        std::fs::write(t.0.join("path/nvcc"), "").unwrap();
        let env = Env::from_pairs([("PATH", t.0.join("path").into_os_string())]);
        let found = find_nvcc(&env, &no_toolchain());
        assert_ne!(found, Ok(t.0.join("path/nvcc")));
    }

    #[test]
    fn target_dir_is_found_from_out_dir() {
        let t = TempTree::new("targetdir");
        let target = t.0.join("custom-target");
        let out = target.join("debug/build/user-crate-0123abcd/out");
        std::fs::create_dir_all(&out).unwrap();
        std::fs::write(
            target.join("CACHEDIR.TAG"),
            "Signature: 8a477f597d28d172789f06886806bc55",
        )
        .unwrap();
        assert_eq!(find_target_dir(&out, None), Some(target.clone()));
        // Without cargo's tag, a directory named `target` is the answer.
        let plain = t.0.join("ws/target");
        let out = plain.join("x86_64-unknown-linux-gnu/release/build/c-1/out");
        std::fs::create_dir_all(&out).unwrap();
        assert_eq!(find_target_dir(&out, None), Some(plain));
        // Neither: an absolute CARGO_TARGET_DIR, never a relative one.
        let elsewhere = t.0.join("elsewhere/out");
        let explicit = t.0.join("explicit");
        assert_eq!(
            find_target_dir(&elsewhere, Some(explicit.as_os_str())),
            Some(explicit.clone())
        );
        assert_eq!(find_target_dir(&elsewhere, Some("relative/dir".as_ref())), None);
    }

    #[test]
    fn toolchain_file_is_read_from_the_target_dir() {
        let t = TempTree::new("toolchain-load");
        let missing = ToolchainFile::load(Some(&t.0)).unwrap();
        assert!(missing.path.is_none());
        assert_eq!(missing.looked_for, Some(t.0.join("toolchain/env")));
        std::fs::create_dir_all(t.0.join("toolchain")).unwrap();
        std::fs::write(t.0.join("toolchain/env"), "NVCC = /x/nvcc\nnot a pair\n=empty\n").unwrap();
        let file = ToolchainFile::load(Some(&t.0)).unwrap();
        assert_eq!(file.path, Some(t.0.join("toolchain/env")));
        assert_eq!(file.get("NVCC"), Some("/x/nvcc"));
        assert_eq!(file.get(""), None);
    }

    #[test]
    fn the_release_is_read_from_the_version() {
        let said = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0";
        assert_eq!(release(said), Some("13.0.88"));
        assert_eq!(release("something else"), None);
        let nvcc = |version: &str| Nvcc {
            program: PathBuf::from("nvcc"),
            version: version.to_owned(),
        };
        assert_eq!(nvcc(said).release(), "13.0.88");
        assert_eq!(nvcc("a\nBuild cuda_13.0").release(), "Build cuda_13.0");
    }

    #[test]
    fn cudart_is_found_in_pypi_and_system_layouts() {
        let t = TempTree::new("libdir");
        let pypi_nvcc = t.exe("pypi/cu13/bin/nvcc");
        std::fs::create_dir_all(t.0.join("pypi/cu13/lib")).unwrap();
        std::fs::write(t.0.join("pypi/cu13/lib/libcudart_static.a"), "!<arch>\n").unwrap();
        assert_eq!(
            cuda_lib_dir(&pypi_nvcc, "x86_64-unknown-linux-gnu").unwrap(),
            t.0.join("pypi/cu13/lib")
        );
        let system_nvcc = t.exe("sys/cuda/bin/nvcc");
        std::fs::create_dir_all(t.0.join("sys/cuda/lib64")).unwrap();
        std::fs::write(t.0.join("sys/cuda/lib64/libcudart_static.a"), "!<arch>\n").unwrap();
        assert!(
            cuda_lib_dir(&system_nvcc, "x86_64-unknown-linux-gnu")
                .unwrap()
                .ends_with("lib64")
        );
        let bare = t.exe("bare/bin/nvcc");
        let err = cuda_lib_dir(&bare, "x86_64-unknown-linux-gnu")
            .unwrap_err()
            .to_string();
        assert!(err.contains("libcudart_static.a was not found"), "{err}");
    }
}
