//! The tuner's compiles: each candidate's one-kernel library (its unit and
//! the unit with `<lib>_error_string`) built by nvcc into a shared library,
//! several at once. Under the work folder: `src/<symbol>/` the sources,
//! `include/` the CUDA headers, `lib/<symbol>.so` the library and
//! `log/<symbol>.log` what nvcc and ptxas said (ptxas's resource report
//! gives the registers). Each build is keyed by everything that decides
//! its output (the sources, every CUDA header, nvcc's version, the flags,
//! the gencode): a job whose key matches the last build's outcome
//! (`lib/<symbol>.key` beside a library, `log/<symbol>.refused` for a
//! refusal) is not built again, so a run that stopped resumes without
//! compiling what it had, and a changed header or nvcc rebuilds.

use fusion_compiler::build::nvcc::{self, Env, ToolchainFile};
use fusion_compiler::codegen::templates;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

/// The nvcc a tuning run compiles with.
#[derive(Clone, Debug)]
pub struct Nvcc {
    pub program: PathBuf,
    /// nvcc's release (`13.0.88`), for the cache's entries.
    pub version: String,
    /// Where `libcudart_static.a` is, when nvcc's own configuration may not
    /// say (the PyPI layout).
    lib_dir: Option<PathBuf>,
}

impl Nvcc {
    /// The nvcc a build would use (`NVCC`, `CUDA_HOME`, `CUDA_PATH`, `PATH`,
    /// the system CUDA), or an error saying where it looked.
    pub fn find() -> Result<Nvcc, String> {
        let program = nvcc::find_nvcc(&Env::from_process(), &toolchain_file()?).map_err(|searched| {
            format!(
                "`fusion tune` and `fusion run` compile kernels with nvcc at run time, which was not found; looked at {}. \
                 Set NVCC to its path, or CUDA_HOME to the CUDA install holding bin/nvcc.",
                searched.join(", ")
            )
        })?;
        let version = nvcc::nvcc_version(&program).map_err(|e| e.to_string())?;
        let version = release(&version).unwrap_or(version);
        let lib_dir = nvcc::cuda_lib_dir(&program, std::env::consts::ARCH).ok();
        Ok(Nvcc {
            program,
            version,
            lib_dir,
        })
    }
}

/// What `cargo xtask toolchain` saved for the checkout a run is started in
/// (`target/toolchain/env`, or under `CARGO_TARGET_DIR`), as a build reads
/// it; none elsewhere.
fn toolchain_file() -> Result<ToolchainFile, String> {
    let target = std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| PathBuf::from("target"), PathBuf::from);
    ToolchainFile::load(Some(&target)).map_err(|e| e.to_string())
}

/// `13.0.88` from `nvcc --version`'s `… release 13.0, V13.0.88`.
fn release(version: &str) -> Option<String> {
    let line = version.lines().find(|line| line.contains("release"))?;
    Some(line.rsplit_once(", V")?.1.trim().to_owned())
}

/// One library to build.
#[derive(Clone, Debug)]
pub struct Job {
    /// The launcher's symbol, also the library's file stem.
    pub symbol: String,
    /// `(file stem, CUDA source)`: the kernel's unit and its error-string unit.
    pub sources: Vec<(String, String)>,
    /// The target's `-gencode` flag.
    pub gencode: &'static str,
}

/// What became of a job.
#[derive(Clone, Debug, PartialEq)]
pub enum Built {
    Library {
        path: PathBuf,
        /// The most registers per thread ptxas gave any of its kernels;
        /// `None` when its report was not found (a reused library whose log
        /// is gone).
        registers: Option<u32>,
    },
    /// nvcc refused it: a tile rule or the shared-memory budget (a
    /// `static_assert` naming the config), or a toolchain problem.
    Failed { log: PathBuf, message: String },
}

/// Writes the CUDA headers under `work/include`, then builds every job,
/// `parallel` at a time, calling `progress` with the number finished after
/// each. The results are in the jobs' order.
pub fn build_all(
    nvcc: &Nvcc,
    work: &Path,
    jobs: &[Job],
    parallel: usize,
    progress: impl Fn(usize) + Sync,
) -> Result<Vec<Built>, String> {
    let include = work.join("include");
    templates::write_headers(&include)
        .map_err(|e| format!("cannot write the CUDA headers under {}: {e}", include.display()))?;
    for dir in ["src", "lib", "log"] {
        std::fs::create_dir_all(work.join(dir))
            .map_err(|e| format!("cannot create {}: {e}", work.join(dir).display()))?;
    }
    let next = AtomicUsize::new(0);
    let finished = AtomicUsize::new(0);
    let results: Mutex<Vec<Option<Built>>> = Mutex::new(vec![None; jobs.len()]);
    std::thread::scope(|scope| {
        for _ in 0..parallel.clamp(1, jobs.len().max(1)) {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(job) = jobs.get(index) else { break };
                    let built = build_one(nvcc, work, &include, job);
                    results.lock().expect("no builder panics holding it")[index] = Some(built);
                    progress(finished.fetch_add(1, Ordering::Relaxed) + 1);
                }
            });
        }
    });
    Ok(results
        .into_inner()
        .expect("no builder panics holding it")
        .into_iter()
        .map(|built| built.expect("every job was built"))
        .collect())
}

/// [`build_all`] with a progress bar on standard error (`compiling`, the
/// libraries done of all, the time so far), cleared when it ends.
pub fn build_all_with_progress(
    nvcc: &Nvcc,
    work: &Path,
    jobs: &[Job],
    parallel: usize,
) -> Result<Vec<Built>, String> {
    let bar = indicatif::ProgressBar::new(jobs.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("  compiling {bar:30} {pos}/{len} ({elapsed})")
            .expect("a valid template"),
    );
    let built = build_all(nvcc, work, jobs, parallel, |done| bar.set_position(done as u64));
    bar.finish_and_clear();
    built
}

/// The flags every candidate is built with, after the build's own
/// (`DEFAULT_NVCC_FLAGS`) and before its gencode.
const FLAGS: [&str; 6] = ["-O3", "-shared", "-Xcompiler", "-fPIC", "-Xptxas", "-v"];

/// A digest of everything that decides what nvcc makes of `job`.
fn build_key(nvcc: &Nvcc, job: &Job) -> String {
    let mut hasher = std::collections::hash_map::DefaultHasher::new();
    nvcc.version.hash(&mut hasher);
    fusion_compiler::build::DEFAULT_NVCC_FLAGS.hash(&mut hasher);
    FLAGS.hash(&mut hasher);
    job.gencode.hash(&mut hasher);
    job.sources.hash(&mut hasher);
    templates::HEADERS.hash(&mut hasher);
    for name in ["NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS", "NVCC_CCBIN"] {
        std::env::var_os(name).hash(&mut hasher);
    }
    format!("{:016x}", hasher.finish())
}

fn build_one(nvcc: &Nvcc, work: &Path, include: &Path, job: &Job) -> Built {
    let src = work.join("src").join(&job.symbol);
    let library = work.join("lib").join(format!("{}.so", job.symbol));
    let key_file = work.join("lib").join(format!("{}.key", job.symbol));
    let log = work.join("log").join(format!("{}.log", job.symbol));
    let refused = work.join("log").join(format!("{}.refused", job.symbol));
    let failed = |message: String| Built::Failed {
        log: log.clone(),
        message,
    };
    let key = build_key(nvcc, job);
    let same_key = |file: &Path| std::fs::read_to_string(file).is_ok_and(|k| k == key);
    if library.is_file() && same_key(&key_file) {
        let registers = std::fs::read_to_string(&log)
            .ok()
            .and_then(|l| most_registers(&l));
        return Built::Library {
            path: library,
            registers,
        };
    }
    if same_key(&refused) {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        return failed(first_error(&said));
    }
    if let Err(e) = std::fs::create_dir_all(&src) {
        return failed(format!("cannot create {}: {e}", src.display()));
    }
    let mut files = Vec::new();
    for (stem, source) in &job.sources {
        let path = src.join(format!("{stem}.cu"));
        if let Err(e) = write_whole(&path, source) {
            return failed(format!("cannot write {}: {e}", path.display()));
        }
        files.push(path);
    }
    // Built under another name and renamed when whole, so that a stopped
    // run leaves no library that looks finished; the name is this
    // process's, so that two runs building the same library at once (two
    // `fusion run`s of one graph sharing the default folder) each write
    // their own, and the second rename replaces the first with the same
    // bytes (a process that loaded the first keeps its mapping).
    let partial = work
        .join("lib")
        .join(format!("{}.so.{}.partial", job.symbol, std::process::id()));
    let _ = std::fs::remove_file(&key_file);
    let mut command = Command::new(&nvcc.program);
    command
        .args(fusion_compiler::build::DEFAULT_NVCC_FLAGS)
        .args(FLAGS)
        .arg(job.gencode)
        .arg("-I")
        .arg(include)
        .arg("-o")
        .arg(&partial)
        .args(&files);
    if let Some(dir) = &nvcc.lib_dir {
        command.arg("-L").arg(dir);
    }
    let output = match command.output() {
        Ok(output) => output,
        Err(e) => return failed(format!("cannot run {}: {e}", nvcc.program.display())),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let _ = std::fs::write(&log, &text);
    if !output.status.success() {
        let _ = std::fs::remove_file(&partial);
        let _ = std::fs::remove_file(&library);
        // Refused for what it is (a rule, the budget), not for a missing
        // toolchain: the same key is refused again without a compile.
        if text.contains("static assertion failed") {
            let _ = std::fs::write(&refused, &key);
        }
        return failed(first_error(&text));
    }
    if let Err(e) = std::fs::rename(&partial, &library).and_then(|()| std::fs::write(&key_file, &key)) {
        return failed(format!("cannot keep {}: {e}", library.display()));
    }
    Built::Library {
        path: library,
        registers: most_registers(&text),
    }
}

/// Writes `contents` to `path` unless it holds them already, through a
/// file of this process's renamed over it: an nvcc of another run reading
/// `path` sees the old file or the new one whole, never a truncated one.
fn write_whole(path: &Path, contents: &str) -> std::io::Result<()> {
    if std::fs::read(path).is_ok_and(|old| old == contents.as_bytes()) {
        return Ok(());
    }
    let mut temp = path.as_os_str().to_owned();
    temp.push(format!(".{}.tmp", std::process::id()));
    std::fs::write(&temp, contents)?;
    std::fs::rename(&temp, path)
}

/// The largest `Used N registers` of a ptxas report.
pub fn most_registers(report: &str) -> Option<u32> {
    report
        .lines()
        .filter_map(|line| {
            let (_, rest) = line.split_once("Used ")?;
            rest.split_once(" registers")?.0.trim().parse::<u32>().ok()
        })
        .max()
}

/// The first line of nvcc's output that says `error`, or its last line.
fn first_error(text: &str) -> String {
    text.lines()
        .find(|line| line.contains("error"))
        .or_else(|| text.lines().last())
        .unwrap_or("nvcc failed and said nothing")
        .trim()
        .to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registers_are_the_largest_any_kernel_of_the_report_uses() {
        let report = "ptxas info    : Compiling entry function '_Z1k' for 'sm_90a'\n\
                      ptxas info    : Used 168 registers, used 16 barriers\n\
                      ptxas info    : Used 232 registers, used 16 barriers\n\
                      ptxas info    : Used 104 registers, used 1 barriers, 8192 bytes smem\n";
        assert_eq!(most_registers(report), Some(232));
        assert_eq!(most_registers("no report"), None);
    }

    #[test]
    fn a_source_is_replaced_whole_and_left_alone_when_unchanged() {
        let dir = std::env::temp_dir().join(format!("fusion-tune-write-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("unit.cu");
        write_whole(&path, "int x;").unwrap();
        let first = std::fs::metadata(&path).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        write_whole(&path, "int x;").unwrap();
        assert_eq!(
            std::fs::metadata(&path).unwrap().modified().unwrap(),
            first,
            "unchanged: not rewritten"
        );
        write_whole(&path, "int y;").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "int y;");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["unit.cu"], "no temporary file is left");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn the_version_is_nvccs_release() {
        let said = "nvcc: NVIDIA (R) Cuda compiler driver\nCuda compilation tools, release 13.0, V13.0.88\nBuild cuda_13.0";
        assert_eq!(release(said).as_deref(), Some("13.0.88"));
        assert_eq!(release("something else"), None);
    }

    #[test]
    fn a_failure_is_named_by_its_first_error() {
        let text = "unit.cu(40): error: static assertion failed with \"tile config ... does not fit sm90\"\n\
                    1 error detected\n";
        assert!(first_error(text).starts_with("unit.cu(40): error: static assertion failed"));
        assert_eq!(
            first_error("ld: cannot find -lcudart\n"),
            "ld: cannot find -lcudart"
        );
    }

    /// With an "nvcc" that writes its `-o` file and counts its runs: a
    /// second build of the same job reuses the library; a changed source
    /// builds it again.
    #[test]
    #[cfg(unix)]
    fn an_unchanged_job_is_not_built_again_and_a_changed_one_is() {
        use std::os::unix::fs::PermissionsExt as _;
        let work = std::env::temp_dir().join(format!("fusion-tune-reuse-{}", std::process::id()));
        std::fs::create_dir_all(&work).unwrap();
        let runs = work.join("runs");
        let script = work.join("fake-nvcc");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\necho run >> {}\nwhile [ $# -gt 0 ]; do [ \"$1\" = -o ] && : > \"$2\"; shift; done\necho 'ptxas info    : Used 40 registers'\n",
                runs.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let nvcc = Nvcc {
            program: script,
            version: "test".into(),
            lib_dir: None,
        };
        let mut job = Job {
            symbol: "cand0_gemm_nk_f16_sm90".into(),
            sources: vec![("cand0_gemm_nk_f16_sm90".into(), "int x;".into())],
            gencode: "-gencode=arch=compute_90a,code=sm_90a",
        };
        let build = |job: &Job| build_all(&nvcc, &work, std::slice::from_ref(job), 1, |_| {}).unwrap();
        let count = || std::fs::read_to_string(&runs).unwrap().lines().count();
        let library = work.join("lib/cand0_gemm_nk_f16_sm90.so");
        let first = build(&job);
        assert_eq!(
            first,
            [Built::Library {
                path: library.clone(),
                registers: Some(40)
            }]
        );
        assert_eq!(build(&job), first);
        assert_eq!(count(), 1, "the second build reused the library");
        job.sources[0].1 = "int y;".into();
        build(&job);
        assert_eq!(count(), 2, "a changed source is built again");
        std::fs::remove_dir_all(&work).unwrap();
    }

    #[test]
    fn the_key_changes_with_the_sources_the_nvcc_and_the_gencode() {
        let nvcc = Nvcc {
            program: PathBuf::from("nvcc"),
            version: "13.0.88".into(),
            lib_dir: None,
        };
        let job = Job {
            symbol: "s".into(),
            sources: vec![("s".into(), "int x;".into())],
            gencode: "-gencode=arch=compute_90a,code=sm_90a",
        };
        let key = build_key(&nvcc, &job);
        assert_eq!(key, build_key(&nvcc, &job.clone()));
        let mut other = job.clone();
        other.sources[0].1 = "int y;".into();
        assert_ne!(key, build_key(&nvcc, &other));
        let mut other = job.clone();
        other.gencode = "-gencode=arch=compute_80,code=[sm_80,compute_80]";
        assert_ne!(key, build_key(&nvcc, &other));
        let newer = Nvcc {
            version: "13.1.0".into(),
            ..nvcc.clone()
        };
        assert_ne!(key, build_key(&newer, &job));
    }

    /// A job whose nvcc is `/bin/false`: the failure is reported, with its
    /// log, and no library is left behind.
    #[test]
    fn a_failed_compile_is_a_result_not_an_error() {
        let work = std::env::temp_dir().join(format!("fusion-tune-compile-{}", std::process::id()));
        let nvcc = Nvcc {
            program: PathBuf::from("/bin/false"),
            version: "none".into(),
            lib_dir: None,
        };
        let job = |symbol: &str| Job {
            symbol: symbol.into(),
            sources: vec![(symbol.into(), "int x;".into())],
            gencode: "-gencode=arch=compute_90a,code=sm_90a",
        };
        let symbols = ["cand0_gemm_nk_f16_sm90", "cand1_gemm_nk_f16_sm90"];
        let done = AtomicUsize::new(0);
        let built = build_all(&nvcc, &work, &symbols.map(job), 2, |n| {
            done.fetch_max(n, Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!(done.load(Ordering::Relaxed), 2);
        for (b, symbol) in built.into_iter().zip(symbols) {
            let Built::Failed { log, .. } = b else {
                panic!("{b:?}")
            };
            assert!(log.ends_with(format!("log/{symbol}.log")));
            assert!(!work.join(format!("lib/{symbol}.so")).exists());
        }
        assert!(work.join("include/fusion/abi.h").exists());
        std::fs::remove_dir_all(&work).unwrap();
    }
}
