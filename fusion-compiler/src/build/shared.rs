//! Shared libraries from the units a build script would archive: what
//! `fusion tune` and `fusion run` build from graphs they only see at run
//! time, and load. Each unit is compiled by the build's nvcc command line
//! (cc's flags, [`DEFAULT_NVCC_FLAGS`](super::DEFAULT_NVCC_FLAGS), the
//! caller's extra flags, the targets' gencode) into the object cache under
//! the key a build gives it; nvcc then links a library's objects and the
//! static CUDA run time into `lib/<name>.so`.
//!
//! Under the output folder: `src/<name>/<unit>.cu`, the sources nvcc's
//! errors point at, and `lib/<name>.so` beside `lib/<name>.key`, the key it
//! was linked from ([`SharedCompiler::key`]): a library whose key matches is
//! not built again, so a run that stopped resumes without compiling what it
//! had, and a changed header or nvcc rebuilds. What nvcc printed for a unit
//! is kept in the cache beside its object (`<key>.log`), so a library comes
//! with its units' reports (ptxas's registers) even when nothing ran.
//!
//! Not here: loading a library, or reading what nvcc printed.

use super::cache::{CacheKey, HeaderTree, KeyHasher, Lookup, ObjectCache, write_if_changed};
use super::compile::{NvccCommand, printed};
use super::nvcc::{self, Env, Nvcc};
use super::{BuildError, CompileOptions, Unit};
use std::path::{Path, PathBuf};

/// Builds shared libraries from units, through the object cache.
pub struct SharedCompiler {
    command: NvccCommand,
    cache: ObjectCache,
    headers: HeaderTree,
    out_dir: PathBuf,
    /// Where `libcudart_static.a` is, when nvcc's own configuration may
    /// not say (the PyPI layout).
    cuda_lib_dir: Option<PathBuf>,
}

/// A library [`SharedCompiler::build`] made or found made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SharedLibrary {
    /// The shared library's path.
    pub path: PathBuf,
    /// What nvcc printed compiling each unit (for an object from the cache,
    /// when it was compiled) and linking them.
    pub output: String,
}

impl SharedCompiler {
    /// Sources and libraries go under `opts.out_dir`; the object cache is
    /// `opts.cache_dir`, else `FUSION_CACHE_DIR`, else `<out_dir>/cache`;
    /// `headers_dir` is the include root, every file of which is part of
    /// every key.
    pub fn new(nvcc: &Nvcc, opts: &CompileOptions, headers_dir: &Path) -> Result<SharedCompiler, BuildError> {
        let env = Env::from_process();
        Ok(SharedCompiler {
            command: NvccCommand::new(nvcc, opts, &env)?,
            cache: ObjectCache::open(&super::cache_dir(opts, &env, None))?,
            headers: HeaderTree::read(headers_dir)?,
            out_dir: opts.out_dir.clone(),
            cuda_lib_dir: nvcc::cuda_lib_dir(&nvcc.program, &opts.target).ok(),
        })
    }

    /// The nvcc it compiles with.
    pub fn nvcc(&self) -> &Nvcc {
        self.command.nvcc()
    }

    /// The key of the library `units` link into: each unit's object key
    /// (its source, the headers, nvcc, every flag, the targets) and how
    /// nvcc links them.
    pub fn key(&self, units: &[Unit]) -> CacheKey {
        self.library_key(&self.object_keys(units))
    }

    fn object_keys(&self, units: &[Unit]) -> Vec<CacheKey> {
        units
            .iter()
            .map(|unit| self.command.unit_key(unit, &self.headers))
            .collect()
    }

    fn library_key(&self, objects: &[CacheKey]) -> CacheKey {
        let mut hasher = KeyHasher::new("fusion-shared-v1");
        self.command.key_fields(&mut hasher);
        if let Some(dir) = &self.cuda_lib_dir {
            hasher.field("-L", dir.as_os_str().as_encoded_bytes());
        }
        for object in objects {
            hasher.field("object", object.to_string().as_bytes());
        }
        hasher.finish()
    }

    /// `<out_dir>/lib/<name>.so` from `units`: the one there when its key
    /// matches, else linked from their objects, cached or compiled now.
    pub fn build(&self, name: &str, units: &[Unit]) -> Result<SharedLibrary, BuildError> {
        let lib_dir = self.out_dir.join("lib");
        let library = lib_dir.join(format!("{name}.so"));
        let key_file = lib_dir.join(format!("{name}.key"));
        let keys = self.object_keys(units);
        let key = self.library_key(&keys).to_string();
        if library.is_file() && std::fs::read_to_string(&key_file).is_ok_and(|k| k == key) {
            let output = keys.iter().map(|&k| self.cached_output(k)).collect();
            return Ok(SharedLibrary {
                path: library,
                output,
            });
        }
        // A library whose key file is gone is not reused; one left from an
        // earlier key goes too when this build fails.
        let _ = std::fs::remove_file(&key_file);
        let built = self.compile_and_link(name, units, &keys, &library);
        if built.is_err() {
            let _ = std::fs::remove_file(&library);
        }
        let output = built?;
        std::fs::write(&key_file, &key).map_err(BuildError::io("cannot write", &key_file))?;
        Ok(SharedLibrary {
            path: library,
            output,
        })
    }

    /// Compiles what the cache lacks of `units` (whose object keys are
    /// `keys`) and links `library`; returns what nvcc printed.
    fn compile_and_link(
        &self,
        name: &str,
        units: &[Unit],
        keys: &[CacheKey],
        library: &Path,
    ) -> Result<String, BuildError> {
        let src = self.out_dir.join("src").join(name);
        let include_dirs = [self.headers.root.as_path()];
        let mut objects = Vec::new();
        let mut output = String::new();
        for (unit, &key) in units.iter().zip(keys) {
            let source_path = src.join(format!("{}.cu", unit.name));
            write_if_changed(&source_path, unit.source.as_bytes())?;
            if let Lookup::Hit(object) = self.cache.lookup(key) {
                output.push_str(&self.cached_output(key));
                objects.push(object);
                continue;
            }
            let compiled = self
                .command
                .compile(unit, &source_path, key, &self.cache, &include_dirs)?;
            if !compiled.output.is_empty() {
                self.cache
                    .write_file(&format!("{key}.log"), compiled.output.as_bytes())?;
            }
            output.push_str(&compiled.output);
            objects.push(compiled.object);
        }
        let lib_dir = library.parent().expect("a library is in lib/");
        std::fs::create_dir_all(lib_dir).map_err(BuildError::io("cannot create", lib_dir))?;
        // Linked under another name and renamed when whole, so that a
        // stopped run leaves no library that looks finished; the name is
        // this process's, so that two runs linking the same library at once
        // (two `fusion run`s of one graph sharing a folder) each write their
        // own, and the second rename replaces the first with the same bytes
        // (a process that loaded the first keeps its mapping).
        let partial = lib_dir.join(format!("{name}.so.{}.partial", std::process::id()));
        output.push_str(&self.link(&objects, &partial, library)?);
        std::fs::rename(&partial, library).map_err(BuildError::io("cannot keep", library))?;
        Ok(output)
    }

    /// What nvcc printed when it compiled the object `key`, if kept.
    fn cached_output(&self, key: CacheKey) -> String {
        self.cache
            .read_file(&format!("{key}.log"))
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .unwrap_or_default()
    }

    /// nvcc links `objects` and the static CUDA run time into `partial`
    /// (for `library`); returns what it printed.
    fn link(&self, objects: &[PathBuf], partial: &Path, library: &Path) -> Result<String, BuildError> {
        let mut command = self.command.base_command();
        command.arg("-shared").arg("-o").arg(partial).args(objects);
        if let Some(dir) = &self.cuda_lib_dir {
            command.arg("-L").arg(dir);
        }
        let output = command.output().map_err(|e| {
            BuildError::Config(format!("could not run {}: {e}", self.nvcc().program.display()))
        })?;
        let said = printed(&output);
        if !output.status.success() {
            let _ = std::fs::remove_file(partial);
            return Err(BuildError::Link {
                library: library.to_owned(),
                status: output.status.to_string(),
                output: said.trim().to_owned(),
            });
        }
        Ok(said)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::target::Arch;

    use crate::build::tests::TempTree;

    /// A work folder with an include root.
    fn work(tag: &str) -> TempTree {
        let work = TempTree::new(tag);
        std::fs::create_dir_all(work.0.join("include/fusion")).unwrap();
        std::fs::write(work.0.join("include/fusion/abi.h"), "#pragma once\n").unwrap();
        work
    }

    fn shared_compiler(work: &TempTree, nvcc: &Nvcc, extra_flags: &[&str]) -> SharedCompiler {
        let mut options = CompileOptions::new(&work.0);
        options.cache_dir = Some(work.0.join("cache"));
        options.extra_nvcc_flags = extra_flags.iter().map(|f| f.to_string()).collect();
        SharedCompiler::new(nvcc, &options, &work.0.join("include")).unwrap()
    }

    fn unit(source: &str, arch: Arch) -> Unit {
        Unit {
            name: "cand0_gemm_nk_f16_sm90".into(),
            source: source.into(),
            archs: vec![arch],
            used_by: Vec::new(),
            tiles: Vec::new(),
        }
    }

    #[test]
    fn the_key_changes_with_the_sources_the_nvcc_the_targets_and_the_flags() {
        let work = work("shared-key");
        let nvcc = Nvcc {
            program: PathBuf::from("nvcc"),
            version: "13.0.88".into(),
        };
        let compiler = shared_compiler(&work, &nvcc, &[]);
        let units = [unit("int x;", Arch::Sm90)];
        let key = compiler.key(&units);
        assert_eq!(key, compiler.key(&units.clone()));
        assert_ne!(key, compiler.key(&[unit("int y;", Arch::Sm90)]));
        assert_ne!(key, compiler.key(&[unit("int x;", Arch::Sm80)]));
        let newer = Nvcc {
            version: "13.1.0".into(),
            ..nvcc.clone()
        };
        assert_ne!(key, shared_compiler(&work, &newer, &[]).key(&units));
        assert_ne!(key, shared_compiler(&work, &nvcc, &["-Xptxas=-v"]).key(&units));
        std::fs::write(work.0.join("include/fusion/abi.h"), "#pragma once\n// edited\n").unwrap();
        assert_ne!(key, shared_compiler(&work, &nvcc, &[]).key(&units));
    }

    /// With an "nvcc" that writes an ELF file at `-o` and counts its runs: a
    /// second build of the same units reuses the library; a removed library
    /// is linked again from the cached object, with the unit's report; a
    /// changed source is compiled again.
    #[test]
    #[cfg(target_os = "linux")]
    fn an_unchanged_library_is_not_built_again_and_a_changed_one_is() {
        let work = work("shared-reuse");
        let runs = work.0.join("runs");
        let script = work.script(
            "fake-nvcc",
            &format!(
                "echo run >> {}\nwhile [ $# -gt 0 ]; do [ \"$1\" = -o ] && cp /bin/true \"$2\"; shift; done\necho 'ptxas info    : Used 40 registers'\n",
                runs.display()
            ),
        );
        let nvcc = Nvcc {
            program: script,
            version: "test".into(),
        };
        let compiler = shared_compiler(&work, &nvcc, &[]);
        let count = || std::fs::read_to_string(&runs).unwrap().lines().count();
        let mut units = [unit("int x;", Arch::Sm90)];
        let first = compiler.build("cand0", &units).unwrap();
        assert_eq!(first.path, work.0.join("lib/cand0.so"));
        assert_eq!(count(), 2, "one compile, one link");
        assert!(work.0.join("src/cand0/cand0_gemm_nk_f16_sm90.cu").is_file());
        assert_eq!(compiler.build("cand0", &units).unwrap().path, first.path);
        assert_eq!(count(), 2, "the second build reused the library");
        std::fs::remove_file(&first.path).unwrap();
        let relinked = compiler.build("cand0", &units).unwrap();
        assert_eq!(count(), 3, "the object came from the cache");
        assert!(
            relinked.output.contains("Used 40 registers"),
            "{}",
            relinked.output
        );
        units[0].source = "int y;".into();
        compiler.build("cand0", &units).unwrap();
        assert_eq!(count(), 5, "a changed source is built again");
    }
}
