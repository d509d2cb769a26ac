//! `fusion tune`: its arguments, `--list` (the candidates, no GPU) and the
//! dispatch to a tuning run ([`crate::tune`]) or a cache's report.

use super::CliError;
use clap::Args;
use fusion_compiler::fuse;
use std::io::Write;
use std::path::{Path, PathBuf};

/// `fusion tune`'s arguments.
#[derive(Debug, Args)]
pub struct TuneArgs {
    /// The graphs, TOML files such as `graphs/gemm_bias_gelu.toml`;
    /// default: every graph in the graphs folder (`FUSION_GRAPHS_DIR`, else
    /// `graphs` under the current directory); each GEMM kernel of their
    /// plans is tuned alone.
    #[arg(value_name = "GRAPH.toml")]
    pub graphs: Vec<PathBuf>,
    /// Print each kernel's candidates and pruning counts, and stop (no GPU,
    /// no compile).
    #[arg(long)]
    pub list: bool,
    /// Print the entries of a tuned cache, tuned against shipped and
    /// cuBLASLt, and stop (no GPU).
    #[arg(long, value_name = "FILE", conflicts_with = "list")]
    pub report: Option<PathBuf>,
    /// The generations, comma-separated (`sm80,sm90`). With `--list`,
    /// default every one; when tuning, one that runs on the GPU, default
    /// the one it runs best (sm80 on an sm90 GPU runs as PTX).
    #[arg(long, value_name = "ARCHS")]
    pub arch: Option<String>,
    /// The row counts to measure at, comma-separated; each gives the cache
    /// the entry of its M bucket (one M per bucket). Default: each bucket's
    /// bound, 16, 64, …, 4096, and 8192 for the last (on sm90 the decode
    /// kernel serves M <= 16 of [N, K] weights, which are not tuned).
    #[arg(long, value_name = "M,…", value_delimiter = ',', default_values_t = default_ms())]
    pub m: Vec<usize>,
    /// Tune the graphs in this element type (`f16`, `bf16`) in place of the
    /// one they declare, as a build compiles them for both.
    #[arg(long, value_name = "DTYPE")]
    pub dtype: Option<String>,
    /// The size of a dynamic dim other than M, `NAME=SIZE` (repeat for
    /// several): `--dim N=3000 --dim K=1000`.
    #[arg(long = "dim", value_name = "NAME=SIZE", value_parser = parse_dim)]
    pub dims: Vec<(String, usize)>,
    /// The tuned cache to write, merged with the entries it holds.
    #[arg(long, value_name = "FILE", default_value = "fusion-tuned.json")]
    pub cache: PathBuf,
    /// Where the candidates' units, shared libraries and nvcc logs go; a
    /// later run reuses a build whose sources, headers, nvcc and flags are
    /// unchanged.
    #[arg(long, value_name = "DIR", default_value = "fusion-tune")]
    pub work: PathBuf,
    /// nvcc processes at once; default: one per CPU.
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
    /// Compile and time only the first N configs of the space (the shipped
    /// config's own tiles are always among them).
    #[arg(long, value_name = "N")]
    pub limit: Option<usize>,
    /// Timed calls per candidate (the fastest, the shipped config and
    /// cuBLASLt get twice as many, side by side).
    #[arg(long, default_value_t = 20)]
    pub runs: usize,
    /// Untimed calls first (at least one per rotated input set: 8).
    #[arg(long, default_value_t = 5)]
    pub warmup: usize,
    /// Measure again an M whose bucket the cache already holds for this GPU.
    #[arg(long)]
    pub force: bool,
}

/// One M per bucket of the tuned cache: its bound, and twice the last
/// bound for the unbounded one.
fn default_ms() -> Vec<usize> {
    use fusion_compiler::select::M_BUCKET_BOUNDS;
    let last = M_BUCKET_BOUNDS[M_BUCKET_BOUNDS.len() - 1];
    M_BUCKET_BOUNDS
        .iter()
        .chain([&(2 * last)])
        .map(|&m| m as usize)
        .collect()
}

fn parse_dim(text: &str) -> Result<(String, usize), String> {
    let parsed = text.split_once('=').and_then(|(name, size)| {
        let size = size.trim().parse::<usize>().ok().filter(|&s| s > 0)?;
        Some((name.trim().to_owned(), size)).filter(|(name, _)| !name.is_empty())
    });
    parsed.ok_or_else(|| format!("`{text}` is not NAME=SIZE with a positive whole size"))
}

/// `fusion tune`: the candidates (`--list`), a cache's entries
/// (`--report`), or a tuning run on GPU 0.
pub fn tune(args: &TuneArgs, out: &mut dyn Write) -> Result<(), CliError> {
    if let Some(path) = &args.report {
        return report(path, out);
    }
    let graphs = if args.graphs.is_empty() {
        // At run time, not the checkout this binary was built in.
        let dir =
            std::env::var_os("FUSION_GRAPHS_DIR").map_or_else(|| PathBuf::from("graphs"), PathBuf::from);
        every_graph(&dir)?
    } else {
        args.graphs.clone()
    };
    if args.list {
        return tune_list(&graphs, args.arch.as_deref(), out);
    }
    run(args, &graphs, out)
}

#[cfg(feature = "kernels")]
fn report(path: &Path, out: &mut dyn Write) -> Result<(), CliError> {
    crate::tune::report(path, out).map_err(CliError::Message)
}

#[cfg(not(feature = "kernels"))]
fn report(path: &Path, _: &mut dyn Write) -> Result<(), CliError> {
    Err(CliError::Message(format!(
        "`fusion tune --report {}` needs fusion built with its `kernels` feature",
        path.display()
    )))
}

#[cfg(feature = "kernels")]
fn run(args: &TuneArgs, graphs: &[PathBuf], out: &mut dyn Write) -> Result<(), CliError> {
    use fusion_compiler::select::Arch;
    let arch = match args.arch.as_deref() {
        None => None,
        Some(names) => match Arch::from_names(names).map_err(CliError::Message)?[..] {
            [arch] => Some(arch),
            _ => {
                return Err(CliError::Message(
                    "--arch: a tuning run tunes for one arch".into(),
                ));
            }
        },
    };
    let dtype = args.dtype.as_deref().map(super::kernel_dtype).transpose()?;
    let settings = crate::tune::Settings {
        ms: args.m.clone(),
        dims: args.dims.clone(),
        arch,
        dtype,
        cache: args.cache.clone(),
        work: args.work.clone(),
        jobs: args
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
        limit: args.limit,
        timing: crate::bench::timing::TimingPlan {
            warmup: args.warmup,
            runs: args.runs.max(1),
        },
        force: args.force,
    };
    crate::tune::tune(graphs, &settings, out).map_err(CliError::Message)
}

#[cfg(not(feature = "kernels"))]
fn run(_: &TuneArgs, _: &[PathBuf], _: &mut dyn Write) -> Result<(), CliError> {
    Err(CliError::Message(
        "a tuning run needs fusion built with its `kernels` feature; `fusion tune --list` works without"
            .into(),
    ))
}

/// The `*.toml` files of `dir`, sorted.
fn every_graph(dir: &Path) -> Result<Vec<PathBuf>, CliError> {
    let entries = std::fs::read_dir(dir)
        .map_err(|e| CliError::Message(format!("cannot list the graphs in {}: {e}", dir.display())))?;
    let mut graphs: Vec<PathBuf> = entries
        .filter_map(|entry| entry.ok().map(|e| e.path()))
        .filter(|path| path.extension().is_some_and(|ext| ext == "toml"))
        .collect();
    graphs.sort();
    Ok(graphs)
}

/// `fusion tune --list`: per graph, per GEMM kernel of its plan, dtype and
/// arch, the search space's summary line (candidates, pruned by reason,
/// what is not yet checked) and each candidate as a tuned table writes a
/// tile. Without a device, its limits are not checked.
pub fn tune_list(graphs: &[PathBuf], arch: Option<&str>, out: &mut dyn Write) -> Result<(), CliError> {
    use fusion_compiler::fuse::Composition;
    use fusion_compiler::select::{Arch, KernelKind};
    let archs = match arch {
        Some(names) => Arch::from_names(names).map_err(CliError::Message)?,
        None => Arch::ALL.to_vec(),
    };
    let rules = fusion_compiler::select::split_rules(&archs).map_err(|e| CliError::Message(e.to_string()))?;
    let write = |out: &mut dyn Write, line: String| writeln!(out, "{line}").map_err(CliError::from_stdout);
    for path in graphs {
        let graph = fusion_compiler::load_toml_graph(path).map_err(CliError::from_front_end)?;
        let mut dtypes: Vec<_> = graph.tensors.iter().map(|t| t.dtype).collect();
        dtypes.sort_by_key(|d| d.name());
        dtypes.dedup();
        let plan = fuse::plan_with(graph, &rules);
        write(out, format!("graph `{}` ({})", plan.graph.name, path.display()))?;
        for (index, kernel) in plan.kernels.iter().enumerate() {
            let Composition::Gemm(gemm) = &kernel.composition else {
                continue;
            };
            for &dtype in &dtypes {
                let kind = KernelKind::of(gemm, dtype);
                for &arch in &archs {
                    let space = fusion_compiler::tune::search_space(arch, &kind, None);
                    write(out, format!("#{index} {space}"))?;
                    for tile in &space.candidates {
                        let tile = serde_json::to_string(tile).expect("a tile config serializes");
                        write(out, format!("  {tile}"))?;
                    }
                }
            }
        }
    }
    Ok(())
}
