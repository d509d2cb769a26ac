//! The tuner's compiles: each candidate's one-kernel library (its unit and
//! the unit with `<lib>_error_string`) built by nvcc into a shared library,
//! several at once. Under the work folder: `src/<symbol>/` the sources,
//! `include/` the CUDA headers, `lib/<symbol>.so` the library and
//! `log/<symbol>.log` what nvcc and ptxas said (ptxas's resource report
//! gives the registers). A library whose sources are the same as when it was
//! built is not built again, so a run that stopped resumes without
//! compiling what it had.

use fusion_compiler::build::nvcc::{self, Env, ToolchainFile};
use fusion_compiler::codegen::templates;
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
        let program =
            nvcc::find_nvcc(&Env::from_process(), &ToolchainFile::default()).map_err(|searched| {
                format!(
                    "`fusion tune` compiles its candidates with nvcc, which was not found; looked at {}. \
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

fn build_one(nvcc: &Nvcc, work: &Path, include: &Path, job: &Job) -> Built {
    let src = work.join("src").join(&job.symbol);
    let library = work.join("lib").join(format!("{}.so", job.symbol));
    let log = work.join("log").join(format!("{}.log", job.symbol));
    let failed = |message: String| Built::Failed {
        log: log.clone(),
        message,
    };
    if let Err(e) = std::fs::create_dir_all(&src) {
        return failed(format!("cannot create {}: {e}", src.display()));
    }
    let mut unchanged = library.is_file();
    let mut files = Vec::new();
    for (stem, source) in &job.sources {
        let path = src.join(format!("{stem}.cu"));
        if std::fs::read(&path).is_ok_and(|old| old == source.as_bytes()) {
            files.push(path);
            continue;
        }
        unchanged = false;
        if let Err(e) = std::fs::write(&path, source) {
            return failed(format!("cannot write {}: {e}", path.display()));
        }
        files.push(path);
    }
    // The headers are rewritten by every run; a library is reused only when
    // it is newer than they are.
    let headers_older = |lib: &Path| {
        let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
        match (modified(lib), modified(&include.join("fusion").join("abi.h"))) {
            (Some(lib), Some(header)) => lib >= header,
            _ => false,
        }
    };
    if unchanged && headers_older(&library) {
        let registers = std::fs::read_to_string(&log)
            .ok()
            .and_then(|l| most_registers(&l));
        return Built::Library {
            path: library,
            registers,
        };
    }
    let mut command = Command::new(&nvcc.program);
    command
        .args(fusion_compiler::build::DEFAULT_NVCC_FLAGS)
        .args([
            "-O3",
            "-shared",
            "-Xcompiler",
            "-fPIC",
            "-Xptxas",
            "-v",
            job.gencode,
        ])
        .arg("-I")
        .arg(include)
        .arg("-o")
        .arg(&library)
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
        let _ = std::fs::remove_file(&library);
        return failed(first_error(&text));
    }
    Built::Library {
        path: library,
        registers: most_registers(&text),
    }
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
