//! The compile half of the build driver: generated CUDA translation units in,
//! a linked static library and Rust FFI declarations out.
//!
//! A build script hands [`compile`] the sources the code generator rendered
//! ([`CudaSources`]). For each unit, nvcc runs through `cc` unless an object
//! with the same content hash is already in the object cache; the objects are
//! archived into `lib<name>.a`, cargo is told how to link it with the static
//! CUDA run time, and bindgen turns the generated C header into `fusion_ffi.rs`.
//!
//! The same units link the other way too: [`SharedCompiler`] compiles them
//! with the same nvcc command line into the same object cache and links
//! shared libraries, which `fusion tune` and `fusion run` load at run time.
//!
//! This module does not render anything and does not know about graphs: the
//! code generator decides what the units contain and prints its own
//! `rerun-if-changed` lines for graphs and templates.
//!
//! Environment (all optional):
//!
//! | variable | effect |
//! | --- | --- |
//! | `NVCC`, `CUDA_HOME`, `CUDA_PATH`, `PATH` | where nvcc is found, in that order (see [`nvcc`]) |
//! | `LIBCLANG_PATH` | the directory holding `libclang.so`, for bindgen |
//! | `FUSION_CACHE_DIR` | the object cache; default `<target dir>/fusion-cache` |
//! | `FUSION_TUNED` | a tuned cache whose tiles replace the shipped tables' ([`Builder::tuned`]) |
//! | `FUSION_SELECT` | `model`: sm90 GEMM tiles chosen by the fitted model of the kernel's time ([`crate::select::model`]), one per M bucket where N and K are static, per call where N or K is dynamic (the plan table's `TileModel`); `tables` or unset: the shipped tables' tiers, chosen among at launch |
//! | `FUSION_GUARD` | `on`: the M buckets of an sm90 GEMM that the fitted models (or a tuned entry) say lose to the unfused cuBLASLt path by more than 3% run that path, decided by the build where N and K are static and per call where N or K is dynamic ([`crate::select::guard`]; the run time needs fusion's feature `cublaslt`); `off` or unset: every bucket fused. Pending a check on a GPU, so off by default |
//! | `DOCS_RS`, `FUSION_SKIP_NVCC=1` | compile nothing, link nothing, still write the bindings ([`BuildMode::NvccSkipped`]) |
//! | `NVCC_CCBIN`, `NVCC_PREPEND_FLAGS`, `NVCC_APPEND_FLAGS` | read by nvcc itself, so part of the cache key |
//!
//! A project-local toolchain (`cargo xtask toolchain`) is described by
//! `<target dir>/toolchain/env`, lines of `KEY=VALUE`; its `NVCC`,
//! `CUDA_HOME` and `LIBCLANG_PATH` are used when the environment names none.

mod bindings;
mod builder;
mod cache;
mod compile;
mod manifest;
pub mod nvcc;
mod shared;
mod sources;

use crate::target::Arch;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

pub use crate::generated::MACRO_GRAPHS_DIR;
pub use builder::{Builder, BuiltLibrary, fp8_kernels};
pub use compile::DEFAULT_NVCC_FLAGS;
pub use manifest::MANIFEST_FILE;
pub use nvcc::Nvcc;
pub use shared::{SharedCompiler, SharedLibrary};

/// Everything the code generator produced for one library.
#[derive(Clone, Debug)]
pub struct CudaSources {
    /// One translation unit per fused kernel.
    pub units: Vec<Unit>,
    /// The C header declaring every launcher (`fusion_kernels.h`). It must
    /// include nothing but `<stdint.h>` and headers under `headers_dir`:
    /// bindgen may run on a libclang without clang's own headers.
    pub header: GeneratedFile,
    /// The include root of the hand-written CUDA building blocks
    /// (`kernels/include`). Every file under it is part of every cache key.
    pub headers_dir: PathBuf,
}

/// One generated CUDA translation unit.
#[derive(Clone, Debug)]
pub struct Unit {
    /// The file stem: `OUT_DIR/kernels/<name>.cu`. Letters, digits, `_` and
    /// `-`; unique within a [`CudaSources`].
    pub name: String,
    /// CUDA C++ source text.
    pub source: String,
    /// The generations to compile it for, oldest first; at least one. Each
    /// adds its [`Target::gencode`](crate::target::Target::gencode).
    pub archs: Vec<Arch>,
    /// What the code generator says the unit serves (`swiglu_ffn#0`: a
    /// graph's kernel and its index in the plan), for the manifest.
    pub used_by: Vec<String>,
    /// The tile configs its kernels are instantiated with, as summaries
    /// (`large: 128x256x64 (4 stages, cooperative, persistent)`), for the
    /// manifest; empty for units without a GEMM.
    pub tiles: Vec<String>,
}

/// A generated file other than a translation unit.
#[derive(Clone, Debug)]
pub struct GeneratedFile {
    /// File name, written into `OUT_DIR` (which is on nvcc's include path).
    pub name: String,
    /// The file's text.
    pub contents: String,
}

/// How [`compile`] runs. [`CompileOptions::from_build_script_env`] fills it
/// from what cargo gives a build script; tests build it with
/// [`CompileOptions::new`].
#[derive(Clone, Debug)]
pub struct CompileOptions {
    /// Where sources, the archive, the bindings and the log are written: the
    /// build script's `OUT_DIR`.
    pub out_dir: PathBuf,
    /// The library is `lib<lib_name>.a`.
    pub lib_name: String,
    /// The object cache. `None`: `FUSION_CACHE_DIR`, else
    /// `<target dir>/fusion-cache`, else `<out_dir>/cache`.
    pub cache_dir: Option<PathBuf>,
    /// How many nvcc processes may run at once (cargo's `NUM_JOBS`).
    pub jobs: usize,
    /// Rust target and host triples, for `cc` (host compiler flags, `ar`).
    pub target: String,
    /// The host triple (`HOST`).
    pub host: String,
    /// Compile and link nothing; only write the bindings.
    pub skip_nvcc: bool,
    /// Print `cargo:` lines (link flags, rerun triggers, warnings). Off when
    /// not running inside a build script.
    pub cargo_metadata: bool,
    /// Flags appended after [`DEFAULT_NVCC_FLAGS`]; part of the cache key.
    pub extra_nvcc_flags: Vec<String>,
}

/// The object cache `opts` names: [`CompileOptions::cache_dir`], else
/// `FUSION_CACHE_DIR`, else `<target dir>/fusion-cache`, else
/// `<out_dir>/cache`.
fn cache_dir(opts: &CompileOptions, env: &nvcc::Env, target_dir: Option<&Path>) -> PathBuf {
    opts.cache_dir
        .clone()
        .or_else(|| env.get("FUSION_CACHE_DIR").map(PathBuf::from))
        .or_else(|| target_dir.map(|t| t.join("fusion-cache")))
        .unwrap_or_else(|| opts.out_dir.join("cache"))
}

impl CompileOptions {
    /// Options for a caller outside a build script: everything explicit, no
    /// `cargo:` output, the host triple from `rustc -vV`.
    pub fn new(out_dir: impl Into<PathBuf>) -> CompileOptions {
        let host = host_triple();
        CompileOptions {
            out_dir: out_dir.into(),
            lib_name: "fusion_kernels".to_owned(),
            cache_dir: None,
            jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
            target: host.clone(),
            host,
            skip_nvcc: false,
            cargo_metadata: false,
            extra_nvcc_flags: Vec::new(),
        }
    }

    /// Options for a build script: `OUT_DIR`, `NUM_JOBS`, `TARGET`, `HOST`
    /// from cargo; skips nvcc when `DOCS_RS` is set or `FUSION_SKIP_NVCC=1`.
    pub fn from_build_script_env() -> Result<CompileOptions, BuildError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let out_dir = var("OUT_DIR").ok_or_else(|| {
            BuildError::Config("OUT_DIR is not set: call this from a build script".to_owned())
        })?;
        let mut options = CompileOptions::new(out_dir);
        if let Some(jobs) = var("NUM_JOBS").and_then(|j| j.parse::<usize>().ok()) {
            options.jobs = jobs.max(1);
        }
        if let Some(target) = var("TARGET") {
            options.target = target;
        }
        if let Some(host) = var("HOST") {
            options.host = host;
        }
        options.skip_nvcc = var("DOCS_RS").is_some() || var("FUSION_SKIP_NVCC").as_deref() == Some("1");
        options.cargo_metadata = true;
        Ok(options)
    }
}

/// Whether kernels were compiled and linked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BuildMode {
    /// Every unit was compiled (or taken from the cache) and archived, and
    /// cargo was told to link the archive and the static CUDA run time.
    Linked,
    /// `DOCS_RS` or `FUSION_SKIP_NVCC=1`: nvcc did not run and nothing is
    /// linked. The bindings still declare every launcher, so the code
    /// generator must emit wrappers that return an error instead of calling
    /// them (a call would fail to link).
    NvccSkipped,
}

/// What [`compile`] produced.
#[derive(Clone, Debug)]
pub struct CompiledLibrary {
    /// Whether anything was compiled and linked.
    pub mode: BuildMode,
    /// bindgen's output for the generated header: `OUT_DIR/fusion_ffi.rs`.
    pub ffi_rs: PathBuf,
    /// The archive's name (`-l static=<lib_name>`) and directory.
    pub lib_name: String,
    /// The directory that holds the archive.
    pub lib_dir: PathBuf,
    /// Units that went through nvcc in this call.
    pub units_compiled: usize,
    /// Units whose object came from the cache.
    pub units_cached: usize,
    /// Whether bindgen ran (false: the bindings came from the cache).
    pub bindings_generated: bool,
    /// Per-unit timings and cache decisions: `OUT_DIR/fusion-build.log`.
    pub log: PathBuf,
}

/// Why the kernels could not be built. Every message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// No nvcc was found.
    #[error(
        "nvcc was not found (searched: {}): run `cargo xtask toolchain` to install CUDA 13.0's nvcc into target/toolchain, or set NVCC",
        searched.join("; ")
    )]
    NvccNotFound {
        /// Every place searched, in order.
        searched: Vec<String>,
    },
    /// bindgen could not load libclang.
    #[error(
        "libclang, which bindgen needs to read {header}, could not be loaded: {reason}. Set LIBCLANG_PATH to the directory that holds libclang.so, or run `cargo xtask toolchain` to install one into target/toolchain."
    )]
    LibclangNotFound {
        /// The header bindgen was to read.
        header: PathBuf,
        /// Why libclang could not be loaded.
        reason: String,
    },
    /// nvcc refused a unit.
    #[error("nvcc failed on {} (unit `{unit}`, {status}):\n{stderr}", source_path.display())]
    Nvcc {
        /// The unit's name.
        unit: String,
        /// Its source file.
        source_path: PathBuf,
        /// How nvcc exited.
        status: String,
        /// What nvcc printed.
        stderr: String,
    },
    /// nvcc could not link a shared library.
    #[error("nvcc could not link {} ({status}):\n{output}", library.display())]
    Link {
        /// The library it was linking.
        library: PathBuf,
        /// How nvcc exited.
        status: String,
        /// What nvcc printed.
        output: String,
    },
    /// Several units failed, each with its error.
    #[error("{} kernel units failed to compile:\n\n{}", .0.len(), join_errors(.0))]
    Several(Vec<BuildError>),
    /// bindgen could not translate the generated header.
    #[error("bindgen could not translate {}: {reason}", header.display())]
    Bindgen {
        /// The header.
        header: PathBuf,
        /// bindgen's message.
        reason: String,
    },
    /// A file could not be read, written or created.
    #[error("{action} {}: {source}", path.display())]
    Io {
        /// What was being done (`cannot write`).
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The error the system gave.
        source: std::io::Error,
    },
    /// A setting (an environment variable, a graph file, a tuned table) is
    /// wrong; the message says which and how.
    #[error("{0}")]
    Config(String),
}

fn join_errors(errors: &[BuildError]) -> String {
    errors
        .iter()
        .map(|e| e.to_string())
        .collect::<Vec<_>>()
        .join("\n\n")
}

impl BuildError {
    fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> BuildError + 'a {
        move |source| BuildError::Io {
            action,
            path: path.to_owned(),
            source,
        }
    }
}

/// Environment variables whose value changes what [`compile`] does.
const WATCHED_ENV: &[&str] = &[
    "NVCC",
    "CUDA_HOME",
    "CUDA_PATH",
    "LIBCLANG_PATH",
    "FUSION_CACHE_DIR",
    "FUSION_SKIP_NVCC",
    "DOCS_RS",
    "NVCC_CCBIN",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
];

/// Compiles `sources` into `lib<opts.lib_name>.a` plus `fusion_ffi.rs`, taking
/// unchanged units from the object cache, and (in a build script) prints the
/// cargo lines that link it.
///
/// Call it from the build script's main thread: when the libclang location
/// comes from the toolchain file, it is exported as `LIBCLANG_PATH` for
/// bindgen, which reads nothing else.
pub fn compile(sources: &CudaSources, opts: &CompileOptions) -> Result<CompiledLibrary, BuildError> {
    let cargo = Cargo {
        enabled: opts.cargo_metadata,
    };
    for name in WATCHED_ENV {
        cargo.line(&format!("rerun-if-env-changed={name}"));
    }
    check_units(sources)?;

    std::fs::create_dir_all(&opts.out_dir).map_err(BuildError::io("cannot create", &opts.out_dir))?;
    let env = nvcc::Env::from_process();
    let target_dir = nvcc::find_target_dir(&opts.out_dir, env.get("CARGO_TARGET_DIR").as_deref());
    let toolchain = nvcc::ToolchainFile::load(target_dir.as_deref())?;
    if let Some(path) = &toolchain.path {
        cargo.line(&format!("rerun-if-changed={}", path.display()));
    }
    if sources.headers_dir.exists() {
        cargo.line(&format!("rerun-if-changed={}", sources.headers_dir.display()));
    }
    let cache_dir = cache_dir(opts, &env, target_dir.as_deref());
    let cache = cache::ObjectCache::open(&cache_dir)?;
    let mut log = BuildLog::default();
    log.line(format!("cache: {}", cache_dir.display()));

    let header_path = opts.out_dir.join(&sources.header.name);
    cache::write_if_changed(&header_path, sources.header.contents.as_bytes())?;
    let headers = cache::HeaderTree::read(&sources.headers_dir)?;
    log.line(format!(
        "include tree: {} files under {} ({})",
        headers.files.len(),
        headers.root.display(),
        headers.digest
    ));

    let (mode, units_compiled, units_cached) = if opts.skip_nvcc {
        log.line("nvcc: skipped (DOCS_RS or FUSION_SKIP_NVCC=1); nothing is linked".to_owned());
        (BuildMode::NvccSkipped, 0, 0)
    } else {
        let nvcc = nvcc::Nvcc::find(&env, &toolchain)?;
        log.line(format!(
            "nvcc: {} ({})",
            nvcc.program.display(),
            nvcc.version.lines().last().unwrap_or("")
        ));
        let compiler = compile::NvccCommand::new(&nvcc, opts, &env)?;
        let outcome = compile::compile_units(sources, &headers, &compiler, &cache, opts, &cargo, &mut log)?;
        compile::archive(&outcome.objects, opts, &mut log)?;
        let cuda_lib = nvcc::cuda_lib_dir(&nvcc.program, &opts.target)?;
        cargo.line(&format!("rustc-link-search=native={}", opts.out_dir.display()));
        cargo.line(&format!("rustc-link-lib=static={}", opts.lib_name));
        cargo.line(&format!("rustc-link-search=native={}", cuda_lib.display()));
        // cudart_static needs the C++ run time (nvcc's host code), and dl, rt
        // and pthread (it loads the driver with dlopen); glibc 2.34+ folds the
        // last three into libc, where naming them is harmless.
        for lib in ["static=cudart_static", "stdc++", "dl", "rt", "pthread"] {
            cargo.line(&format!("rustc-link-lib={lib}"));
        }
        (BuildMode::Linked, outcome.compiled, outcome.cached)
    };

    let started = Instant::now();
    let libclang_dir = env
        .get("LIBCLANG_PATH")
        .or_else(|| toolchain.get("LIBCLANG_PATH").map(Into::into));
    let ffi_rs = opts.out_dir.join("fusion_ffi.rs");
    let bindings_generated = bindings::write_bindings(&bindings::BindingsRequest {
        header_path: &header_path,
        header: &sources.header,
        headers: &headers,
        cache: &cache,
        libclang_dir: libclang_dir.as_deref().map(Path::new),
        libclang_from_env: env.get("LIBCLANG_PATH").is_some(),
        target: &opts.target,
        lib_name: &opts.lib_name,
        output: &ffi_rs,
    })?;
    log.line(format!(
        "bindings: {} ({:.2}s)",
        if bindings_generated {
            "generated by bindgen"
        } else {
            "cached"
        },
        started.elapsed().as_secs_f64()
    ));

    let log_path = opts.out_dir.join("fusion-build.log");
    log.write(&log_path)?;
    Ok(CompiledLibrary {
        mode,
        ffi_rs,
        lib_name: opts.lib_name.clone(),
        lib_dir: opts.out_dir.clone(),
        units_compiled,
        units_cached,
        bindings_generated,
        log: log_path,
    })
}

/// Rejects unit lists that would overwrite each other's files or produce an
/// empty fat binary.
fn check_units(sources: &CudaSources) -> Result<(), BuildError> {
    let mut seen = std::collections::HashSet::new();
    for unit in &sources.units {
        let valid_name = !unit.name.is_empty()
            && unit
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
        if !valid_name {
            return Err(BuildError::Config(format!(
                "kernel unit name `{}` is not a valid file stem: use letters, digits, `_` and `-`",
                unit.name
            )));
        }
        if !seen.insert(unit.name.as_str()) {
            return Err(BuildError::Config(format!(
                "two kernel units are named `{}`: names must be unique",
                unit.name
            )));
        }
        if unit.archs.is_empty() {
            return Err(BuildError::Config(format!(
                "kernel unit `{}` has no target architecture",
                unit.name
            )));
        }
    }
    let header = &sources.header.name;
    if header.is_empty() || header.contains(['/', '\\']) {
        return Err(BuildError::Config(format!(
            "generated header name `{header}` must be a plain file name"
        )));
    }
    Ok(())
}

/// `f` on every item, at most `workers` at a time (at least one), each
/// result at its item's place; `done` hears how many have finished after
/// each. The builds' units and `fusion tune`'s libraries go through it.
pub fn parallel_map<T: Sync, R: Send>(
    items: &[T],
    workers: usize,
    f: impl Fn(&T) -> R + Sync,
    done: impl Fn(usize) + Sync,
) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<R>>> = items.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers.clamp(1, items.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(index) else { break };
                    let result = f(item);
                    *results[index].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                    done(finished.fetch_add(1, Ordering::Relaxed) + 1);
                }
            });
        }
    });
    results
        .into_iter()
        .map(|result| {
            let result = result.into_inner().unwrap_or_else(|e| e.into_inner());
            // A worker that panicked has made the scope panic already.
            result.expect("every item ran")
        })
        .collect()
}

/// Prints `cargo:` lines when running inside a build script.
#[derive(Clone, Copy)]
struct Cargo {
    enabled: bool,
}

impl Cargo {
    fn line(&self, line: &str) {
        if self.enabled {
            println!("cargo:{line}");
        }
    }

    /// A warning cargo shows the user; one line each, as cargo requires.
    fn warning(&self, message: &str) {
        for line in message.lines() {
            self.line(&format!("warning=fusion: {line}"));
        }
    }
}

/// `OUT_DIR/fusion-build.log`: what each run compiled, took from the cache,
/// and how long it took. Progress goes here rather than to `cargo:warning`.
#[derive(Default)]
struct BuildLog {
    lines: Vec<String>,
}

impl BuildLog {
    fn line(&mut self, line: String) {
        self.lines.push(line);
    }

    fn write(&self, path: &Path) -> Result<(), BuildError> {
        let mut file = std::fs::File::create(path).map_err(BuildError::io("cannot write", path))?;
        for line in &self.lines {
            writeln!(file, "{line}").map_err(BuildError::io("cannot write", path))?;
        }
        Ok(())
    }
}

/// The triple `rustc` builds for by default, for callers outside a build
/// script (where cargo gives `TARGET` and `HOST`).
fn host_triple() -> String {
    let rustc = std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into());
    std::process::Command::new(rustc)
        .arg("-vV")
        .output()
        .ok()
        .and_then(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("host: ").map(str::to_owned))
        })
        .unwrap_or_else(|| format!("{}-unknown-linux-gnu", std::env::consts::ARCH))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A directory tree under the system temp dir, removed on drop.
    pub(super) struct TempTree(pub(super) PathBuf);

    impl TempTree {
        pub(super) fn new(tag: &str) -> TempTree {
            let dir = std::env::temp_dir().join(format!("fusion-build-test-{tag}-{}", std::process::id()));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(&dir).unwrap();
            TempTree(dir)
        }

        /// Creates an executable file at `rel`.
        pub(super) fn exe(&self, rel: &str) -> PathBuf {
            self.script(rel, "")
        }

        /// Creates an executable shell script at `rel` running `body`.
        pub(super) fn script(&self, rel: &str, body: &str) -> PathBuf {
            let path = self.0.join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, format!("#!/bin/sh\n{body}")).unwrap();
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt as _;
                std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
            }
            path
        }
    }

    impl Drop for TempTree {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    fn sources(units: Vec<Unit>, header: &str) -> CudaSources {
        CudaSources {
            units,
            header: GeneratedFile {
                name: header.to_owned(),
                contents: String::new(),
            },
            headers_dir: PathBuf::from("include"),
        }
    }

    fn unit(name: &str, archs: &[Arch]) -> Unit {
        Unit {
            name: name.to_owned(),
            source: String::new(),
            archs: archs.to_vec(),
            used_by: Vec::new(),
            tiles: Vec::new(),
        }
    }

    #[test]
    fn unit_lists_that_would_clash_are_rejected() {
        let ok = sources(vec![unit("gemm_bias_gelu-0", &[Arch::Sm80])], "fusion_kernels.h");
        assert!(check_units(&ok).is_ok());
        let cases = [
            (
                sources(vec![unit("../evil", &[Arch::Sm80])], "h.h"),
                "not a valid file stem",
            ),
            (
                sources(vec![unit("", &[Arch::Sm80])], "h.h"),
                "not a valid file stem",
            ),
            (
                sources(vec![unit("a", &[Arch::Sm80]), unit("a", &[Arch::Sm75])], "h.h"),
                "names must be unique",
            ),
            (sources(vec![unit("a", &[])], "h.h"), "no target architecture"),
            (sources(vec![], "include/h.h"), "plain file name"),
        ];
        for (bad, expected) in cases {
            let message = check_units(&bad).unwrap_err().to_string();
            assert!(message.contains(expected), "expected `{expected}` in: {message}");
        }
    }

    #[test]
    fn options_default_to_the_host_and_print_nothing() {
        let options = CompileOptions::new("out");
        assert!(options.jobs >= 1);
        assert_eq!(options.target, options.host);
        assert!(options.target.contains('-'), "{}", options.target);
        assert!(!options.cargo_metadata && !options.skip_nvcc);
        assert_eq!(options.lib_name, "fusion_kernels");
    }
}
