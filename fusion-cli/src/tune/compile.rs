//! The tuner's compiles: each candidate's one-kernel library (its unit and
//! the unit with `<lib>_error_string`) built into a shared library by
//! fusion-compiler's [`SharedCompiler`] (the build's nvcc, flags and object
//! cache), several at once. Under the work folder: `include/` the CUDA
//! headers, `src/<symbol>/` the sources and `lib/<symbol>.so` the library
//! (see [`SharedCompiler`] for when one is reused), `cache/` the objects
//! unless `FUSION_CACHE_DIR` names another, and `log/<symbol>.log` what
//! nvcc and ptxas said (ptxas's resource report gives the registers). A
//! refusal is remembered too (`log/<symbol>.refused` holds the library's
//! key), so a run that stopped resumes without compiling what it had.

use fusion_compiler::build::{BuildError, CompileOptions, Nvcc, SharedCompiler, Unit, parallel_map};
use fusion_compiler::codegen::templates;
use fusion_compiler::target::Arch;
use std::path::{Path, PathBuf};

/// The nvcc a build would use (`NVCC`, `CUDA_HOME`, `CUDA_PATH`, `PATH`,
/// the system CUDA, the toolchain file of `./target`), or an error saying
/// where it looked.
pub fn find_nvcc() -> Result<Nvcc, String> {
    Nvcc::find_from_current_dir().map_err(|e| match e {
        BuildError::NvccNotFound { searched } => format!(
            "`fusion tune` and `fusion run` compile kernels with nvcc at run time, which was not found; looked at {}. \
             Set NVCC to its path, or CUDA_HOME to the CUDA install holding bin/nvcc.",
            searched.join(", ")
        ),
        other => other.to_string(),
    })
}

/// One library to build.
#[derive(Clone, Debug)]
pub struct Job {
    /// The launcher's symbol, also the library's file stem.
    pub symbol: String,
    /// `(file stem, CUDA source)`: the kernel's unit and its error-string unit.
    pub sources: Vec<(String, String)>,
    /// The generation it is compiled for.
    pub arch: Arch,
}

impl Job {
    fn units(&self) -> Vec<Unit> {
        self.sources
            .iter()
            .map(|(name, source)| Unit {
                name: name.clone(),
                source: source.clone(),
                archs: vec![self.arch],
                used_by: Vec::new(),
                tiles: Vec::new(),
            })
            .collect()
    }
}

/// What became of a job.
#[derive(Clone, Debug, PartialEq)]
pub enum Built {
    Library {
        path: PathBuf,
        /// The most registers per thread ptxas gave any of its kernels;
        /// `None` when its report was not found (the cache no longer
        /// holds a unit's).
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
    let log_dir = work.join("log");
    std::fs::create_dir_all(&log_dir).map_err(|e| format!("cannot create {}: {e}", log_dir.display()))?;
    let mut options = CompileOptions::new(work);
    // ptxas's resource report, for the registers.
    options.extra_nvcc_flags.push("-Xptxas=-v".to_owned());
    let compiler = SharedCompiler::new(nvcc, &options, &include).map_err(|e| e.to_string())?;
    Ok(parallel_map(
        jobs,
        parallel,
        |job| build_one(&compiler, &log_dir, job),
        progress,
    ))
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

fn build_one(compiler: &SharedCompiler, log_dir: &Path, job: &Job) -> Built {
    let log = log_dir.join(format!("{}.log", job.symbol));
    let refused = log_dir.join(format!("{}.refused", job.symbol));
    let units = job.units();
    let key = compiler.key(&units).to_string();
    if std::fs::read_to_string(&refused).is_ok_and(|k| k == key) {
        let said = std::fs::read_to_string(&log).unwrap_or_default();
        return Built::Failed {
            log,
            message: first_error(&said),
        };
    }
    let said = match compiler.build(&job.symbol, &units) {
        Ok(library) => {
            let _ = std::fs::write(&log, &library.output);
            return Built::Library {
                registers: most_registers(&library.output),
                path: library.path,
            };
        }
        Err(BuildError::Nvcc { stderr, .. }) => stderr,
        Err(BuildError::Link { output, .. }) => output,
        Err(other) => other.to_string(),
    };
    let _ = std::fs::write(&log, &said);
    // Refused for what it is (a rule, the budget), not for a missing
    // toolchain: the same key is refused again without a compile.
    if said.contains("static assertion failed") {
        let _ = std::fs::write(&refused, &key);
    }
    Built::Failed {
        log,
        message: first_error(&said),
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
    use std::sync::atomic::{AtomicUsize, Ordering};

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
        };
        let job = |symbol: &str| Job {
            symbol: symbol.into(),
            sources: vec![(symbol.into(), "int x;".into())],
            arch: Arch::Sm90,
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
