//! Running nvcc on the units that are not in the cache, and archiving every
//! unit's object into the static library. [`NvccCommand`] is the one nvcc
//! command line and object key, also for the shared libraries of
//! [`super::shared`].
//!
//! `cc` decides the compiler command (host compiler, `-fPIC`, `CXXFLAGS`,
//! …), but each unit is compiled on its own: one source per nvcc call, no
//! `--device-c` (cc adds it only when a build has more than one `.cu` file),
//! and no device-link step (cc runs `--device-link` only from `compile()` on
//! a build with `.cu` files). Each unit is a whole program on the device side,
//! so its object is complete as nvcc writes it, which is what makes objects
//! cacheable one by one. We run the command cc describes ourselves rather than
//! through `compile_intermediates()` so that nvcc writes straight into the
//! cache (for an atomic rename) and its error output lands in our error
//! instead of on cargo's console.

use super::cache::{CacheKey, HeaderTree, KeyHasher, Lookup, ObjectCache, write_if_changed};
use super::nvcc::{Env, Nvcc};
use super::{BuildError, BuildLog, Cargo, CompileOptions, CudaSources, Unit, parallel_map};
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// Flags every unit is compiled with, after cc's own (`-O3`, `-fPIC` for the
/// host compiler, …) and before [`CompileOptions::extra_nvcc_flags`].
/// `-lineinfo` keeps source lines for profilers at no run-time cost; ptxas's
/// spill warnings are the ones worth seeing in a build.
pub const DEFAULT_NVCC_FLAGS: &[&str] = &[
    "-std=c++17",
    "--expt-relaxed-constexpr",
    "-lineinfo",
    "-Xptxas=-warn-spills",
];

/// The nvcc command line shared by every unit, as `cc` builds it.
pub struct NvccCommand {
    nvcc: Nvcc,
    args: Vec<OsString>,
    envs: Vec<(OsString, OsString)>,
    /// Everything besides the sources that decides what nvcc produces.
    key_prefix: Vec<(String, Vec<u8>)>,
}

impl NvccCommand {
    pub fn new(nvcc: &Nvcc, opts: &CompileOptions, env: &Env) -> Result<NvccCommand, BuildError> {
        // `cc` picks nvcc's host compiler (`-ccbin`, from `CXX`), wraps host
        // flags in `-Xcompiler` and adds `CXXFLAGS`. It finds nvcc only through
        // `NVCC` or `PATH` (`Build::compiler` names the host compiler when
        // CUDA is on), so we take its arguments and run the nvcc we found.
        let mut build = cc::Build::new();
        build
            .cuda(true)
            .cudart("static")
            .target(&opts.target)
            .host(&opts.host)
            .out_dir(&opts.out_dir)
            // Kernels are always optimized: a debug build of the crate still
            // wants fast kernels, and one object serves every profile.
            .opt_level(3)
            .debug(false)
            // Position-independent (cc's default on Linux, said here because
            // it matters): one object serves a static archive and a shared
            // library alike.
            .pic(true)
            .cargo_metadata(opts.cargo_metadata)
            .cargo_warnings(false);
        for flag in DEFAULT_NVCC_FLAGS {
            build.flag(flag);
        }
        for flag in &opts.extra_nvcc_flags {
            build.flag(flag);
        }
        let tool = build
            .try_get_compiler()
            .map_err(|e| BuildError::Config(format!("cc could not set up the nvcc command line: {e}")))?;
        let args: Vec<OsString> = tool.args().to_vec();
        let envs: Vec<(OsString, OsString)> = tool
            .get_envs()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();

        let mut key_prefix = vec![
            ("nvcc --version".to_owned(), nvcc.version.as_bytes().to_vec()),
            ("target".to_owned(), opts.target.as_bytes().to_vec()),
        ];
        for arg in &args {
            key_prefix.push(("arg".to_owned(), arg.as_encoded_bytes().to_vec()));
        }
        for (name, value) in &envs {
            key_prefix.push((
                format!("env {}", name.to_string_lossy()),
                value.as_encoded_bytes().to_vec(),
            ));
        }
        // nvcc reads these itself; they change the object as much as flags.
        for name in ["NVCC_CCBIN", "NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS"] {
            let value = env.get(name).unwrap_or_default();
            key_prefix.push((format!("env {name}"), value.as_encoded_bytes().to_vec()));
        }
        Ok(NvccCommand {
            nvcc: nvcc.clone(),
            args,
            envs,
            key_prefix,
        })
    }

    pub fn nvcc(&self) -> &Nvcc {
        &self.nvcc
    }

    /// nvcc with cc's arguments and environment.
    pub(super) fn base_command(&self) -> Command {
        let mut cmd = Command::new(&self.nvcc.program);
        cmd.args(&self.args);
        cmd.envs(self.envs.iter().map(|(k, v)| (k, v)));
        cmd
    }

    /// Everything besides its inputs that decides what a command from
    /// [`NvccCommand::base_command`] makes, for a key.
    pub(super) fn key_fields(&self, hasher: &mut KeyHasher) {
        for (label, value) in &self.key_prefix {
            hasher.field(label, value);
        }
    }

    /// The command that compiles `source` to `object`.
    fn command(&self, unit: &Unit, source: &Path, object: &Path, include_dirs: &[&Path]) -> Command {
        let mut cmd = self.base_command();
        for arch in &unit.archs {
            cmd.arg(arch.target().gencode);
        }
        for dir in include_dirs {
            cmd.arg("-I").arg(dir);
        }
        cmd.arg("-c").arg(source).arg("-o").arg(object);
        cmd
    }

    /// The cache key of one unit: its source, every file under the include
    /// root, the nvcc version, the full flag list and the targets. Include
    /// directories are not part of it, their contents are: one object then
    /// serves every profile and crate whose `OUT_DIR` differs.
    pub fn unit_key(&self, unit: &Unit, headers: &HeaderTree) -> CacheKey {
        let mut hasher = KeyHasher::new("fusion-object-v1");
        hasher.field("source", unit.source.as_bytes());
        // Not the generated header: it lists every launcher, and no unit
        // includes it, so keying on it would recompile every kernel whenever
        // any graph is added or changed.
        hasher.field("include tree", headers.digest.to_string().as_bytes());
        self.key_fields(&mut hasher);
        for arch in &unit.archs {
            hasher.field("gencode", arch.target().gencode.as_bytes());
        }
        hasher.finish()
    }

    /// Compiles `unit`, written at `source_path`, into `cache` under `key`.
    pub fn compile(
        &self,
        unit: &Unit,
        source_path: &Path,
        key: CacheKey,
        cache: &ObjectCache,
        include_dirs: &[&Path],
    ) -> Result<Compiled, BuildError> {
        let started = Instant::now();
        let temp = cache.temp_path(key);
        let output = self
            .command(unit, source_path, &temp, include_dirs)
            .output()
            .map_err(|e| BuildError::Config(format!("could not run {}: {e}", self.nvcc.program.display())))?;
        let said = printed(&output);
        if !output.status.success() {
            let _ = std::fs::remove_file(&temp);
            return Err(BuildError::Nvcc {
                unit: unit.name.clone(),
                source_path: source_path.to_owned(),
                status: output.status.to_string(),
                stderr: said.trim().to_owned(),
            });
        }
        let object = cache
            .commit(&temp, key)
            .map_err(|e| BuildError::Config(format!("unit `{}`: {e}", unit.name)))?;
        Ok(Compiled {
            object,
            elapsed: started.elapsed(),
            output: said,
        })
    }
}

/// Every unit's object, in unit order, and where each came from.
pub struct UnitsOutcome {
    pub objects: Vec<(CacheKey, PathBuf)>,
    pub compiled: usize,
    pub cached: usize,
}

/// Writes every unit to `OUT_DIR/kernels/<name>.cu` and the manifest to
/// `OUT_DIR/kernels/units.json`, takes what it can from the cache and
/// compiles the rest, at most `opts.jobs` at a time.
pub fn compile_units(
    sources: &CudaSources,
    headers: &HeaderTree,
    nvcc: &NvccCommand,
    cache: &ObjectCache,
    opts: &CompileOptions,
    cargo: &Cargo,
    log: &mut BuildLog,
) -> Result<UnitsOutcome, BuildError> {
    let kernels_dir = opts.out_dir.join("kernels");
    let mut objects = Vec::with_capacity(sources.units.len());
    let mut misses = Vec::new();
    for (index, unit) in sources.units.iter().enumerate() {
        let source_path = kernels_dir.join(format!("{}.cu", unit.name));
        write_if_changed(&source_path, unit.source.as_bytes())?;
        let key = nvcc.unit_key(unit, headers);
        let targets = unit.archs.iter().map(|a| a.name()).collect::<Vec<_>>().join(",");
        match cache.lookup(key) {
            Lookup::Hit(path) => {
                log.line(format!("unit {} [{targets}]: cached {key}", unit.name));
                objects.push((key, Some(path)));
                continue;
            }
            Lookup::Corrupt(reason) => {
                cargo.warning(&format!(
                    "discarded a damaged cached object ({reason}); recompiling `{}`",
                    unit.name
                ));
                log.line(format!(
                    "unit {}: cached object was damaged ({reason})",
                    unit.name
                ));
            }
            Lookup::Miss => {}
        }
        objects.push((key, None));
        misses.push((index, source_path, key));
    }
    super::manifest::write(&kernels_dir, &sources.units)?;

    let include_dirs = [headers.root.as_path(), opts.out_dir.as_path()];
    let results = parallel_map(
        &misses,
        opts.jobs,
        |(index, source_path, key)| {
            nvcc.compile(&sources.units[*index], source_path, *key, cache, &include_dirs)
        },
        |_| {},
    );

    let mut errors = Vec::new();
    for ((index, _, _), result) in misses.iter().zip(results) {
        let unit = &sources.units[*index];
        match result {
            Ok(compiled) => {
                log.line(format!(
                    "unit {}: compiled in {:.2}s {}",
                    unit.name,
                    compiled.elapsed.as_secs_f64(),
                    objects[*index].0
                ));
                if !compiled.output.trim().is_empty() {
                    // nvcc succeeded, so what it printed are warnings (such as
                    // ptxas's register spills): worth showing once.
                    cargo.warning(&format!("nvcc on `{}`:\n{}", unit.name, compiled.output.trim()));
                    log.line(compiled.output.trim().to_owned());
                }
                objects[*index].1 = Some(compiled.object);
            }
            Err(e) => errors.push(e),
        }
    }
    match errors.len() {
        0 => {}
        1 => return Err(errors.remove(0)),
        _ => return Err(BuildError::Several(errors)),
    }
    let compiled = misses.len();
    let objects: Vec<(CacheKey, PathBuf)> = objects
        .into_iter()
        .map(|(key, path)| (key, path.expect("every unit has an object once no unit failed")))
        .collect();
    log.line(format!(
        "{} kernel units: {compiled} compiled with nvcc, {} from the cache",
        objects.len(),
        objects.len() - compiled
    ));
    Ok(UnitsOutcome {
        cached: objects.len() - compiled,
        compiled,
        objects,
    })
}

/// What a process printed: its standard output, then its standard error.
pub(super) fn printed(output: &std::process::Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// An object nvcc wrote into the cache.
pub struct Compiled {
    pub object: PathBuf,
    pub elapsed: Duration,
    /// What nvcc printed (warnings, ptxas's reports).
    pub output: String,
}

/// Archives the objects into `OUT_DIR/lib<name>.a` with `cc` (objects only:
/// no nvcc call, no device link). Skipped when the archive already holds
/// exactly these objects, as recorded in `lib<name>.a.inputs`.
pub fn archive(
    objects: &[(CacheKey, PathBuf)],
    opts: &CompileOptions,
    log: &mut BuildLog,
) -> Result<(), BuildError> {
    let archive = opts.out_dir.join(format!("lib{}.a", opts.lib_name));
    let stamp = opts.out_dir.join(format!("lib{}.a.inputs", opts.lib_name));
    let mut hasher = KeyHasher::new("fusion-archive-v1");
    hasher.field("target", opts.target.as_bytes());
    for (key, _) in objects {
        hasher.field("object", key.to_string().as_bytes());
    }
    let inputs = hasher.finish().to_string();
    if archive.is_file() && std::fs::read_to_string(&stamp).is_ok_and(|s| s == inputs) {
        log.line(format!("archive: {} unchanged", archive.display()));
        return Ok(());
    }
    let started = Instant::now();
    // Drop the stamp first: if archiving fails half way, the next run must
    // not trust what is left.
    let _ = std::fs::remove_file(&stamp);
    if objects.is_empty() {
        write_if_changed(&archive, b"!<arch>\n")?;
    } else {
        cc::Build::new()
            .objects(objects.iter().map(|(_, path)| path))
            .target(&opts.target)
            .host(&opts.host)
            .opt_level(3)
            .out_dir(&opts.out_dir)
            // We print the link lines ourselves: they are needed when this
            // step is skipped too, and cc would look for the CUDA run time
            // only where a system install keeps it.
            .cargo_metadata(false)
            .try_compile(&opts.lib_name)
            .map_err(|e| {
                BuildError::Config(format!(
                    "cannot archive the kernel objects into {}: {e}",
                    archive.display()
                ))
            })?;
    }
    super::cache::write_atomically(&stamp, inputs.as_bytes())?;
    log.line(format!(
        "archive: {} objects into {} in {:.2}s",
        objects.len(),
        archive.display(),
        started.elapsed().as_secs_f64()
    ));
    Ok(())
}
