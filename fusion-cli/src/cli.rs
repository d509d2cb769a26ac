//! The `fusion` command line: its arguments and what each subcommand does.
//!
//! `src/bin/fusion.rs` only calls [`main`]; the work is in functions that
//! take their inputs and an output stream, so tests drive them directly.

use clap::{Args, Parser, Subcommand};
use fusion_compiler::fuse;
use fusion_compiler::ir::Graph;
use fusion_compiler::select::guard;
use std::ffi::OsStr;
use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[cfg(feature = "kernels")]
mod bench;
#[cfg(feature = "kernels")]
pub use bench::{BenchArgs, bench};
#[cfg(feature = "kernels")]
mod run;
#[cfg(feature = "kernels")]
pub use run::RunArgs;
mod tune;
pub use tune::{TuneArgs, tune};

/// Fused transformer GPU kernels, compiled at build time from dataflow graphs.
#[derive(Debug, Parser)]
#[command(name = "fusion", version)]
pub struct Cli {
    /// The subcommand to run.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands of `fusion`, each with its arguments.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Splits a graph into fused kernels and prints the plan.
    Plan(PlanArgs),
    /// Times the built-in fused kernels against cuBLASLt on GPU 0.
    #[cfg(feature = "kernels")]
    Bench(BenchArgs),
    /// Renders the GEMM units of a candidate list, with the kernel self-test
    /// harness and a Makefile, into a folder that builds with nvcc alone.
    Render(RenderArgs),
    /// Writes a model's feed-forward block as a TOML graph, from its Hugging
    /// Face config.json.
    Graph(GraphArgs),
    /// Runs a TOML graph on tensors from safetensors files on GPU 0, its
    /// kernels built with nvcc on first use (`--check`: against the CPU
    /// reference; `--time N`: per-call time).
    #[cfg(feature = "kernels")]
    Run(RunArgs),
    /// Measures tile configs for graphs' GEMM kernels on GPU 0 and writes
    /// the fastest into a tuned cache that builds read (`--list`: the
    /// candidates alone, no GPU; `--report`: a cache's entries).
    Tune(TuneArgs),
}

/// `fusion graph`'s arguments.
#[derive(Debug, Args)]
pub struct GraphArgs {
    /// The model's Hugging Face `config.json` (Llama, Mistral, Qwen2, Qwen3 or GPT-2).
    #[arg(long = "from-hf", value_name = "config.json")]
    pub from_hf: PathBuf,
    /// The graph's name; default `<model_type>_ffn`.
    #[arg(long)]
    pub name: Option<String>,
    /// Element type of its tensors: f16 or bf16.
    #[arg(long, default_value = "f16")]
    pub dtype: String,
    /// Write the graph to FILE instead of standard output.
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
}

/// `fusion render`'s arguments.
#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The candidate list, such as `fusion-compiler/kernels/selftest/candidates.json`.
    #[arg(value_name = "LIST.json", required_unless_present = "fitted_corpus")]
    pub list: Option<PathBuf>,
    /// In place of a list: every GEMM layer of a corpus (such as
    /// `benchmarks/corpus.toml`) whose tiles a build with its N static fits
    /// to N, as that build renders it and as the shipped tables do (f16,
    /// sm90), and `fitted.txt`, one line per layer and token count: the
    /// shape and the two units' symbols, for `selftest --unit` to time side
    /// by side.
    #[arg(long, value_name = "CORPUS.toml", conflicts_with = "list")]
    pub fitted_corpus: Option<PathBuf>,
    /// The token counts M of `--fitted-corpus`'s lines (comma-separated);
    /// default 512,1000.
    #[arg(
        long = "corpus-tokens",
        value_name = "M,…",
        value_delimiter = ',',
        requires = "fitted_corpus",
        conflicts_with = "list"
    )]
    pub corpus_tokens: Vec<u64>,
    /// The folder to write.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Where the graphs the list names are; default: the shipped `graphs/`
    /// (or `FUSION_GRAPHS_DIR`).
    #[arg(long, value_name = "DIR")]
    pub graphs: Option<PathBuf>,
}

/// `fusion plan`'s arguments.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The graph, a TOML file such as `graphs/swiglu_ffn.toml`.
    #[arg(value_name = "GRAPH.toml")]
    pub graph: PathBuf,
    /// Also write the plan as a Graphviz digraph to FILE, and as SVG beside
    /// it (FILE with the extension .svg) when Graphviz's `dot` is on PATH.
    #[arg(long, value_name = "FILE")]
    pub dot: Option<PathBuf>,
    /// Print the plan as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Also say which M buckets of each GEMM a build with the guard on
    /// (`FUSION_GUARD=on`, which shows this too) runs on the vendor path,
    /// and why: the predicted or tuned times of both paths. With `--json`
    /// it goes to standard error.
    #[arg(long)]
    pub guard: bool,
}

/// Why a command failed.
#[derive(Debug, PartialEq, Eq)]
pub enum CliError {
    /// A sentence, shown as `error: …`.
    Message(String),
    /// Diagnostics already rendered against their file
    /// (`path:line:col: error: …`), shown as they are.
    Rendered(String),
    /// Standard output was closed early (`fusion plan g.toml | head`): the
    /// reader has what it wanted, so there is nothing to report.
    OutputClosed,
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CliError::Message(message) => write!(f, "error: {message}"),
            CliError::Rendered(text) => f.write_str(text),
            CliError::OutputClosed => f.write_str("standard output was closed"),
        }
    }
}

impl CliError {
    /// Wraps an error from the front end, which renders syntax and graph
    /// errors against the file but reports an unreadable file as a bare
    /// sentence.
    fn from_front_end(text: String) -> CliError {
        let first_line = text.lines().next().unwrap_or_default();
        if first_line.starts_with("error:") || first_line.contains(": error: ") {
            CliError::Rendered(text)
        } else {
            CliError::Message(text)
        }
    }

    fn from_stdout(error: io::Error) -> CliError {
        match error.kind() {
            io::ErrorKind::BrokenPipe => CliError::OutputClosed,
            _ => CliError::Message(format!("cannot write to standard output: {error}")),
        }
    }
}

/// A `--dtype` argument: an element type kernels take (bench, tune and run,
/// which come with `kernels`).
#[cfg(feature = "kernels")]
fn kernel_dtype(value: &str) -> Result<fusion_compiler::ir::DType, CliError> {
    match value {
        "f16" => Ok(fusion_compiler::ir::DType::F16),
        "bf16" => Ok(fusion_compiler::ir::DType::BF16),
        other => Err(CliError::Message(format!(
            "--dtype {other}: expected f16 or bf16"
        ))),
    }
}

/// Parses the arguments, runs the command, and reports a failure on stderr
/// with exit status 1.
pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let stdout = io::stdout();
    match run(&cli, &mut stdout.lock()) {
        Ok(()) | Err(CliError::OutputClosed) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("{error}");
            ExitCode::FAILURE
        }
    }
}

/// Runs a parsed command, writing what it reports to `out`.
pub fn run(cli: &Cli, out: &mut dyn Write) -> Result<(), CliError> {
    match &cli.command {
        Command::Plan(args) => {
            let graph = fusion_compiler::load_toml_graph(&args.graph).map_err(CliError::from_front_end)?;
            let guard = args.guard || guard::guard_from_env().map_err(CliError::Message)?;
            let report = if guard { Some(guard_report(&graph)?) } else { None };
            plan_graph(graph, args.dot.as_deref(), args.json, out)?;
            match report {
                Some(report) if args.json => eprint!("{report}"),
                Some(report) => {
                    write!(out, "\n{report}").map_err(CliError::from_stdout)?;
                    out.flush().map_err(CliError::from_stdout)?;
                }
                None => {}
            }
            Ok(())
        }
        #[cfg(feature = "kernels")]
        Command::Bench(args) => bench(args, out),
        Command::Render(args) => {
            let graphs = args.graphs.clone().unwrap_or_else(fusion::testing::graphs_dir);
            match (&args.list, &args.fitted_corpus) {
                (Some(list), _) => crate::render::render(list, &graphs, &args.out, out),
                (None, Some(corpus)) => {
                    let tokens = if args.corpus_tokens.is_empty() {
                        vec![512, 1000]
                    } else {
                        args.corpus_tokens.clone()
                    };
                    crate::render::render_fitted_corpus(corpus, &tokens, &graphs, &args.out, out)
                }
                (None, None) => Err(CliError::Message(
                    "fusion render needs a candidate list or --fitted-corpus".into(),
                )),
            }
        }
        Command::Graph(args) => graph_from_hf(args, out),
        #[cfg(feature = "kernels")]
        Command::Run(args) => run::run(args, out),
        Command::Tune(args) => tune(args, out),
    }
}

/// `fusion graph --from-hf`: the block's TOML on `out` or in `--out`. The
/// TOML is parsed and planned before it is written, so what it writes reads.
pub fn graph_from_hf(args: &GraphArgs, out: &mut dyn Write) -> Result<(), CliError> {
    use fusion_compiler::hf;
    let path = args.from_hf.display();
    let json = std::fs::read_to_string(&args.from_hf)
        .map_err(|e| CliError::Message(format!("cannot read {path}: {e}")))?;
    let config = hf::ffn_config(&json).map_err(|e| CliError::Message(format!("{path}: {e}")))?;
    let dtype = match args.dtype.as_str() {
        "f16" => fusion_compiler::ir::DType::F16,
        "bf16" => fusion_compiler::ir::DType::BF16,
        other => {
            return Err(CliError::Message(format!(
                "--dtype {other}: expected f16 or bf16"
            )));
        }
    };
    let name = args
        .name
        .clone()
        .unwrap_or_else(|| format!("{}_ffn", config.model_type));
    let toml = hf::ffn_toml(&config, &name, dtype);
    let source = fusion_compiler::diagnostic::SourceFile::new(format!("{name}.toml"), toml.as_str());
    let graph = fusion_compiler::graph_from_source(&source).map_err(CliError::Rendered)?;
    match &args.out {
        Some(file) => {
            std::fs::write(file, &toml)
                .map_err(|e| CliError::Message(format!("cannot write {}: {e}", file.display())))?;
            let plan = fuse::plan(graph);
            writeln!(
                out,
                "wrote graph `{name}` to {} ({} kernels: `fusion plan {}`)",
                file.display(),
                plan.kernels.len(),
                file.display()
            )
            .map_err(CliError::from_stdout)?;
        }
        None => out.write_all(toml.as_bytes()).map_err(CliError::from_stdout)?,
    }
    out.flush().map_err(CliError::from_stdout)
}

/// A line for each sm90 GEMM of `plan` whose static N a build fits its
/// small-M tile to (`fusion_compiler::select::fitted_width`), as a build
/// without a tuned cache selects it.
fn fitted_tile_lines(plan: &fuse::Plan) -> Vec<String> {
    use fusion_compiler::select::{Arch, KernelKind, TunedCache, TunedTable, select_tuned};
    let Ok(table) = TunedTable::shipped(Arch::Sm90) else {
        return Vec::new();
    };
    let mut lines = Vec::new();
    for (index, kernel) in plan.kernels.iter().enumerate() {
        let fuse::Composition::Gemm(gemm) = &kernel.composition else {
            continue;
        };
        let dtype = plan.graph.tensor(kernel.output).dtype;
        let (n, k) = kernel.static_n_and_k(&plan.graph);
        let kind = KernelKind::of(gemm, dtype);
        let Ok(selected) = select_tuned(&table, &TunedCache::default(), Arch::Sm90, &kind, n, k) else {
            continue;
        };
        let (Some(width), Some(tile), Some(n)) = (selected.fitted_width, selected.config.small_m_alt, n)
        else {
            continue;
        };
        lines.push(format!(
            "sm90, #{index}: N = {n} is static, so its small-M tile is fitted to it: {}x{width} ({} stages), \
             beside the table's tiers for M up to {} (unless a tuned cache names its tiles)",
            tile.bm,
            tile.stages,
            selected.config.small_m_max.unwrap_or_default()
        ));
    }
    lines
}

/// `fusion plan` on a loaded graph: prints the plan (as JSON with `json`)
/// and, given a path, writes it there as Graphviz; with JSON on standard
/// output, the line saying so goes to standard error.
pub fn plan_graph(graph: Graph, dot: Option<&Path>, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    // As a build for this library's archs plans it: without the fusions
    // their tuned tables measured to lose.
    let rules = fusion_compiler::select::split_rules(&fusion::device::compiled())
        .map_err(|e| CliError::Message(e.to_string()))?;
    let plan = fuse::plan_with(graph, &rules);
    let workspace = intermediate_rows(&plan);
    if json {
        let mut value = plan.to_json();
        value["workspace"] = serde_json::json!({
            "intermediates": workspace.iter().map(|w| serde_json::json!({
                "name": w.name,
                "rows": w.rows,
                "bytes_per_row": w.bytes_per_row,
                "times": w.times,
            })).collect::<Vec<_>>(),
            "scratch": "asked of each GEMM's launcher at run time (`workspace_bytes(stream, m)` on a graph struct)",
        });
        let text = serde_json::to_string_pretty(&value).expect("a JSON value serializes");
        writeln!(out, "{text}").map_err(CliError::from_stdout)?;
    } else {
        write!(out, "{plan}").map_err(CliError::from_stdout)?;
        writeln!(out, "\n{}", workspace_line(&workspace)).map_err(CliError::from_stdout)?;
        if fusion::device::is_compiled(fusion_compiler::select::Arch::Sm90) {
            let lines = fitted_tile_lines(&plan);
            if !lines.is_empty() {
                writeln!(out, "\n{}", lines.join("\n")).map_err(CliError::from_stdout)?;
            }
        }
        if let Some(refusal) = plan.graph.fp8_refusal() {
            writeln!(
                out,
                "\nnote: {refusal}: a build refuses this graph unless it sets FUSION_FP8=experimental (sm90 FP8 \
                 GEMMs, checked on a GPU, not yet timed); the plan above is how it is split"
            )
            .map_err(CliError::from_stdout)?;
        }
    }
    if let Some(path) = dot {
        std::fs::write(path, fuse::dot::write(&plan)).map_err(|e| {
            CliError::Message(format!("cannot write the Graphviz file {}: {e}", path.display()))
        })?;
        let note = match render_svg(GRAPHVIZ.as_ref(), path)? {
            Svg::Written(svg) => format!(
                "wrote the plan as Graphviz to {} and as SVG to {}",
                path.display(),
                svg.display()
            ),
            Svg::NoGraphviz => format!(
                "wrote the plan as Graphviz to {}; no SVG, as Graphviz's `dot` is not on PATH: \
                 install Graphviz (`apt-get install graphviz`, `brew install graphviz` or \
                 https://graphviz.org/download/) and run this again, or `dot -Tsvg {} -o plan.svg`",
                path.display(),
                path.display()
            ),
        };
        if json {
            eprintln!("{note}");
        } else {
            writeln!(out, "\n{note}").map_err(CliError::from_stdout)?;
        }
    }
    out.flush().map_err(CliError::from_stdout)
}

/// One intermediate's buffer in a call's workspace: `bytes_per_row` bytes
/// (times the dynamic dims in `times`) for each of its `rows`.
struct IntermediateRows {
    name: String,
    /// The name of its row dim (M), or its static row count.
    rows: String,
    bytes_per_row: u64,
    /// Dynamic dims of a row, multiplying `bytes_per_row`.
    times: Vec<String>,
}

/// The intermediates a call keeps in its workspace (the plan's
/// temporaries), by the bytes each takes per row.
fn intermediate_rows(plan: &fusion_compiler::fuse::Plan) -> Vec<IntermediateRows> {
    use fusion_compiler::ir::Extent;
    let graph = &plan.graph;
    let name = |e: &Extent| match *e {
        Extent::Static(n) => n.to_string(),
        Extent::Dynamic(d) => graph.dims[d.0].name.clone(),
    };
    plan.temporaries()
        .into_iter()
        .map(|t| {
            let tensor = graph.tensor(t);
            let (rows, row) = match tensor.shape.as_slice() {
                [rows, row @ ..] if !row.is_empty() => (name(rows), row),
                whole => ("1".to_owned(), whole),
            };
            let statics: u64 = row
                .iter()
                .filter_map(|e| match *e {
                    Extent::Static(n) => Some(n),
                    Extent::Dynamic(_) => None,
                })
                .product();
            IntermediateRows {
                name: tensor.name.clone(),
                rows,
                bytes_per_row: statics * tensor.dtype.size_bytes() as u64,
                times: row
                    .iter()
                    .filter(|e| matches!(e, Extent::Dynamic(_)))
                    .map(name)
                    .collect(),
            }
        })
        .collect()
}

/// `fusion plan`'s last line: what a call's intermediates take of its
/// workspace per row of M, beside the scratch the launchers ask for.
fn workspace_line(rows: &[IntermediateRows]) -> String {
    let scratch = "the kernels' scratch, which their launchers size at run time \
                   (`workspace_bytes(stream, m)` on a graph struct says the whole)";
    if rows.is_empty() {
        return format!("workspace per call: no intermediates; {scratch}");
    }
    let each: Vec<String> = rows
        .iter()
        .map(|r| {
            let times: String = r.times.iter().map(|d| format!(" × {d}")).collect();
            format!(
                "{} {}{times} bytes per row of {}",
                r.name, r.bytes_per_row, r.rows
            )
        })
        .collect();
    let same_rows = rows.iter().all(|r| r.times.is_empty() && r.rows == rows[0].rows);
    let total = if same_rows && rows.len() > 1 {
        let sum: u64 = rows.iter().map(|r| r.bytes_per_row).sum();
        format!(" ({sum} bytes per row of {} in all)", rows[0].rows)
    } else {
        String::new()
    };
    format!("workspace per call: {}{total}, plus {scratch}", each.join(", "))
}

/// What the guard decides for each GEMM kernel of `graph` on sm90, as a
/// build with `FUSION_GUARD=on` and this environment's `FUSION_TUNED` and
/// `FUSION_SELECT` decides it ([`guard::report`]).
pub fn guard_report(graph: &Graph) -> Result<String, CliError> {
    use fusion_compiler::select::{SELECT_ENV, TUNED_ENV, TunedCache};
    let rules = fusion_compiler::select::split_rules(&fusion::device::compiled())
        .map_err(|e| CliError::Message(e.to_string()))?;
    let plan = fuse::plan_with(graph.clone(), &rules);
    let mut cache = std::env::var_os(TUNED_ENV)
        .map(|path| TunedCache::read(Path::new(&path)))
        .unwrap_or_default();
    for warning in &cache.warnings {
        eprintln!("warning: {warning}");
    }
    if std::env::var(SELECT_ENV).as_deref() == Ok("model") {
        cache.model = Some(fusion_compiler::select::model::Calibration::shipped_sm90());
    }
    guard::report(&plan, &guard::Guard::shipped_sm90(), &cache).map_err(|e| CliError::Message(e.to_string()))
}

/// Graphviz's renderer, which `fusion plan --dot` runs when it is on PATH.
const GRAPHVIZ: &str = "dot";

/// What became of the SVG beside a Graphviz file.
#[derive(Debug, PartialEq, Eq)]
enum Svg {
    /// Written to this path.
    Written(PathBuf),
    /// Not written: the renderer is not installed.
    NoGraphviz,
}

/// Renders the Graphviz file `dot_file` as SVG beside it (`plan.dot` →
/// `plan.svg`, `plan` → `plan.svg`, `plan.svg` → `plan.svg.svg`) with
/// `program`, Graphviz's `dot`. A renderer that is not installed is no
/// error (the Graphviz file is the output asked for); one that fails is.
fn render_svg(program: &OsStr, dot_file: &Path) -> Result<Svg, CliError> {
    let mut svg = dot_file.with_extension("svg");
    if svg == dot_file {
        svg = PathBuf::from(format!("{}.svg", dot_file.display()));
    }
    let output = std::process::Command::new(program)
        .arg("-Tsvg")
        .arg(dot_file)
        .arg("-o")
        .arg(&svg)
        .output();
    let rendering = format!("`{} -Tsvg {}`", program.to_string_lossy(), dot_file.display());
    match output {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Svg::NoGraphviz),
        Err(e) => Err(CliError::Message(format!("cannot run {rendering}: {e}"))),
        Ok(output) if output.status.success() => Ok(Svg::Written(svg)),
        Ok(output) => Err(CliError::Message(format!(
            "{rendering} failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use fusion_compiler::ir::{DType, GraphBuilder, WeightLayout};
    use std::ffi::OsStr;

    /// gpt2_mlp's c_fc (N = 3072) gets a small-M tile fitted to N; its
    /// c_proj (N = 768, narrower than any fitted width) and the 64-wide
    /// test graph do not.
    #[test]
    fn plan_says_which_gemms_get_a_tile_fitted_to_n() {
        let path = fusion::testing::graphs_dir().join("gpt2_mlp.toml");
        let plan = fuse::plan(fusion_compiler::load_toml_graph(&path).unwrap());
        let lines = fitted_tile_lines(&plan);
        assert_eq!(lines.len(), 1, "{lines:?}");
        assert!(
            lines[0].starts_with(
                "sm90, #0: N = 3072 is static, so its small-M tile is fitted to it: 128x96 (7 stages)"
            ),
            "{lines:?}"
        );
        assert_eq!(fitted_tile_lines(&fuse::plan(ffn())), Vec::<String>::new());
    }

    fn ffn() -> Graph {
        let mut b = GraphBuilder::new("ffn");
        let m = b.dynamic_dim("M").unwrap();
        let d = b.static_dim("D", 64).unwrap();
        let x = b.input("x", DType::F16, &[m, d]).unwrap();
        let w = b.weight("w", DType::F16, &[d, d]).unwrap();
        let bias = b.weight("bias", DType::F16, &[d]).unwrap();
        let h = b.matmul(x, w, WeightLayout::NK).unwrap();
        let h = b.bias_add(h, bias).unwrap();
        let y = b.gelu(h).unwrap();
        b.output("y", y).unwrap();
        b.build().unwrap()
    }

    /// A path under the system temp dir, unique to this process and test.
    fn scratch(name: &str) -> PathBuf {
        std::env::temp_dir().join(format!("fusion-cli-{}-{name}", std::process::id()))
    }

    #[test]
    fn the_argument_definitions_are_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn plan_takes_a_graph_and_an_optional_dot_file() {
        let cli = Cli::try_parse_from(["fusion", "plan", "g.toml", "--dot", "out.dot"]).unwrap();
        let Command::Plan(args) = cli.command else {
            panic!("plan")
        };
        assert_eq!(args.graph, Path::new("g.toml"));
        assert_eq!(args.dot.as_deref(), Some(Path::new("out.dot")));
        let cli = Cli::try_parse_from(["fusion", "plan", "g.toml"]).unwrap();
        let Command::Plan(args) = cli.command else {
            panic!("plan")
        };
        assert_eq!(args.dot, None);
        assert!(Cli::try_parse_from(["fusion", "plan"]).is_err());
    }

    #[test]
    fn plan_with_guard_says_what_each_gemm_runs() {
        let cli = Cli::try_parse_from(["fusion", "plan", "g.toml", "--guard"]).unwrap();
        let Command::Plan(args) = cli.command else {
            panic!("plan")
        };
        assert!(args.guard);
        let text = guard_report(&ffn()).unwrap();
        assert!(text.starts_with("guard on sm90: "), "{text}");
        assert!(
            text.contains("kernel #0 (gemm_bias_gelu, f16, N=64 K=64): "),
            "{text}"
        );
        assert!(text.contains("  m<=256: "), "{text}");
    }

    #[test]
    fn plan_prints_the_plan() {
        let mut out = Vec::new();
        plan_graph(ffn(), None, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("graph `ffn`: 3 ops → 1 kernel\n"), "{text}");
        assert!(text.contains("#0  gemm_bias_gelu  (named pattern)"), "{text}");
        assert!(!text.contains("Graphviz"), "{text}");
        assert!(
            text.contains("workspace per call: no intermediates; the kernels' scratch"),
            "{text}"
        );
    }

    #[test]
    fn plan_reports_the_workspace_a_call_needs_per_row_of_m() {
        // x [M, 64] -> gelu(x @ w1^T + b1) [M, 128] -> @ w2^T -> y [M, 64]:
        // the [M, 128] f16 activation passes between two GEMMs.
        let mut b = GraphBuilder::new("mlp");
        let m = b.dynamic_dim("M").unwrap();
        let d = b.static_dim("D", 64).unwrap();
        let f = b.static_dim("F", 128).unwrap();
        let x = b.input("x", DType::F16, &[m, d]).unwrap();
        let w1 = b.weight("w1", DType::F16, &[f, d]).unwrap();
        let b1 = b.weight("b1", DType::F16, &[f]).unwrap();
        let w2 = b.weight("w2", DType::F16, &[d, f]).unwrap();
        let h = b.matmul(x, w1, WeightLayout::NK).unwrap();
        let h = b.bias_add(h, b1).unwrap();
        let h = b.gelu(h).unwrap();
        let y = b.matmul(h, w2, WeightLayout::NK).unwrap();
        b.output("y", y).unwrap();
        let graph = b.build().unwrap();
        let mut out = Vec::new();
        plan_graph(graph.clone(), None, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains("workspace per call: %3 256 bytes per row of M, plus the kernels' scratch"),
            "{text}"
        );
        let mut out = Vec::new();
        plan_graph(graph, None, true, &mut out).unwrap();
        let plan: serde_json::Value = serde_json::from_slice(&out).unwrap();
        let h = &plan["workspace"]["intermediates"][0];
        assert_eq!((&h["rows"], &h["bytes_per_row"]), (&"M".into(), &256.into()));
    }

    #[test]
    fn graph_from_hf_writes_a_graph_that_plans() {
        let config = scratch("config.json");
        std::fs::write(
            &config,
            r#"{"model_type": "mistral", "hidden_size": 4096, "intermediate_size": 14336, "hidden_act": "silu", "rms_norm_eps": 1e-5}"#,
        )
        .unwrap();
        let cli = Cli::try_parse_from(["fusion", "graph", "--from-hf", config.to_str().unwrap()]).unwrap();
        let Command::Graph(args) = cli.command else {
            panic!("graph")
        };
        let mut out = Vec::new();
        graph_from_hf(&args, &mut out).unwrap();
        let toml = String::from_utf8(out).unwrap();
        assert!(toml.contains("name = \"mistral_ffn\""), "{toml}");
        let file = scratch("mistral_ffn.toml");
        let args = GraphArgs {
            out: Some(file.clone()),
            ..args
        };
        let mut out = Vec::new();
        graph_from_hf(&args, &mut out).unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), toml);
        assert!(String::from_utf8(out).unwrap().contains("(2 kernels:"));
        std::fs::write(&config, r#"{"model_type": "bert"}"#).unwrap();
        let error = graph_from_hf(&GraphArgs { out: None, ..args }, &mut Vec::new()).unwrap_err();
        assert!(
            error.to_string().contains("model_type `bert` is not supported"),
            "{error}"
        );
    }

    #[test]
    fn plan_as_json_is_data_with_each_kernel() {
        let cli = Cli::try_parse_from(["fusion", "plan", "g.toml", "--json"]).unwrap();
        let Command::Plan(args) = cli.command else {
            panic!("plan")
        };
        assert!(args.json);
        let mut out = Vec::new();
        plan_graph(ffn(), None, true, &mut out).unwrap();
        let plan: serde_json::Value = serde_json::from_slice(&out).expect("the output is JSON");
        assert_eq!(plan["graph"], "ffn");
        assert_eq!(plan["kernels"][0]["name"], "gemm_bias_gelu");
        assert_eq!(plan["kernels"][0]["kind"], "named pattern");
        assert_eq!(plan["kernels"][0]["operands"][0]["role"], "A");
        assert!(plan["kernels"][0]["norm"].is_null());
        assert_eq!(plan["between_kernels"].as_array().map(Vec::len), Some(0));
    }

    #[test]
    fn plan_with_dot_writes_the_file_and_says_where() {
        let path = scratch("plan.dot");
        let mut out = Vec::new();
        plan_graph(ffn(), Some(&path), false, &mut out).unwrap();
        let written = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        // Written where Graphviz is installed.
        let _ = std::fs::remove_file(path.with_extension("svg"));
        assert!(written.starts_with("digraph \"ffn\" {"), "{written}");
        assert_eq!(written.matches("subgraph cluster_").count(), 1);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(&format!("wrote the plan as Graphviz to {}", path.display())),
            "{text}"
        );
    }

    #[test]
    fn without_graphviz_the_svg_is_skipped_and_the_note_says_how_to_get_it() {
        let dot = scratch("no-graphviz.dot");
        std::fs::write(&dot, "digraph g {}").unwrap();
        let missing = OsStr::new("fusion-test-no-such-graphviz");
        assert_eq!(render_svg(missing, &dot), Ok(Svg::NoGraphviz));
        assert!(!dot.with_extension("svg").exists());
        std::fs::remove_file(&dot).unwrap();
    }

    /// A stand-in for Graphviz's `dot`: a script that writes its arguments
    /// to the file after `-o`, or fails when asked to.
    #[cfg(unix)]
    fn fake_graphviz(name: &str, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let program = scratch(name);
        std::fs::write(&program, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755)).unwrap();
        program
    }

    #[cfg(unix)]
    #[test]
    fn with_graphviz_the_svg_is_written_beside_the_dot_file() {
        let program = fake_graphviz("fake-dot", r#"echo "$@" > "$4""#);
        let dot = scratch("with-graphviz.dot");
        let svg = dot.with_extension("svg");
        assert_eq!(
            render_svg(program.as_os_str(), &dot),
            Ok(Svg::Written(svg.clone()))
        );
        let args = std::fs::read_to_string(&svg).unwrap();
        assert_eq!(
            args.trim(),
            format!("-Tsvg {} -o {}", dot.display(), svg.display())
        );
        std::fs::remove_file(&svg).unwrap();
        let named_svg = scratch("named.svg");
        assert_eq!(
            render_svg(program.as_os_str(), &named_svg),
            Ok(Svg::Written(PathBuf::from(format!(
                "{}.svg",
                named_svg.display()
            ))))
        );
        std::fs::remove_file(format!("{}.svg", named_svg.display())).unwrap();
        std::fs::remove_file(&program).unwrap();
    }

    #[cfg(unix)]
    #[test]
    fn a_failing_graphviz_is_an_error_with_its_message() {
        let program = fake_graphviz("failing-dot", "echo 'syntax error in line 1' >&2; exit 1");
        let error = render_svg(program.as_os_str(), &scratch("bad.dot")).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("-Tsvg") && text.contains("failed"), "{text}");
        assert!(text.contains("syntax error in line 1"), "{text}");
        std::fs::remove_file(&program).unwrap();
    }

    #[test]
    fn an_unwritable_dot_file_is_an_error_that_names_it() {
        let path = scratch("no-such-dir").join("plan.dot");
        let error = plan_graph(ffn(), Some(&path), false, &mut Vec::new()).unwrap_err();
        let text = error.to_string();
        assert!(
            text.starts_with("error: cannot write the Graphviz file "),
            "{text}"
        );
        assert!(text.contains(&path.display().to_string()), "{text}");
    }

    #[test]
    fn a_missing_graph_file_is_an_error_that_names_it() {
        let path = scratch("missing.toml");
        let cli = Cli::try_parse_from([OsStr::new("fusion"), OsStr::new("plan"), path.as_os_str()]).unwrap();
        let error = run(&cli, &mut Vec::new()).unwrap_err();
        let text = error.to_string();
        assert!(text.starts_with("error: cannot read "), "{text}");
        assert!(text.contains("missing.toml"), "{text}");
    }

    #[test]
    fn rendered_diagnostics_are_shown_as_they_are() {
        let rendered = "g.toml:2:5: error: dim `M` is 0\n  |\n2 | M = 0".to_string();
        let error = CliError::from_front_end(rendered.clone());
        assert_eq!(error, CliError::Rendered(rendered.clone()));
        assert_eq!(error.to_string(), rendered);
    }

    /// Standard output of `fusion plan g.toml | head -1` after `head` exits.
    struct ClosedPipe;

    impl Write for ClosedPipe {
        fn write(&mut self, _: &[u8]) -> io::Result<usize> {
            Err(io::Error::from(io::ErrorKind::BrokenPipe))
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_closed_stdout_is_not_reported_as_an_error() {
        assert_eq!(
            plan_graph(ffn(), None, false, &mut ClosedPipe),
            Err(CliError::OutputClosed)
        );
    }

    #[test]
    fn render_takes_a_list_an_out_folder_and_an_optional_graphs_folder() {
        let cli = Cli::try_parse_from(["fusion", "render", "list.json", "--out", "dir"]).unwrap();
        let Command::Render(args) = cli.command else {
            panic!("render")
        };
        assert_eq!(args.list.as_deref(), Some(Path::new("list.json")));
        assert_eq!(args.out, Path::new("dir"));
        assert_eq!(args.graphs, None);
        assert!(
            Cli::try_parse_from(["fusion", "render", "list.json"]).is_err(),
            "--out is required"
        );
        // Or a corpus in place of the list, never both, and one of them.
        let cli = Cli::try_parse_from([
            "fusion",
            "render",
            "--fitted-corpus",
            "corpus.toml",
            "--corpus-tokens",
            "512,1024",
            "--out",
            "dir",
        ])
        .unwrap();
        let Command::Render(args) = cli.command else {
            panic!("render")
        };
        assert_eq!((args.list, args.corpus_tokens), (None, vec![512, 1024]));
        assert_eq!(args.fitted_corpus.as_deref(), Some(Path::new("corpus.toml")));
        for both_or_neither in [
            &[
                "fusion",
                "render",
                "list.json",
                "--fitted-corpus",
                "c.toml",
                "--out",
                "d",
            ][..],
            &["fusion", "render", "--out", "d"][..],
            &[
                "fusion",
                "render",
                "list.json",
                "--corpus-tokens",
                "512",
                "--out",
                "d",
            ][..],
        ] {
            assert!(
                Cli::try_parse_from(both_or_neither).is_err(),
                "{both_or_neither:?}"
            );
        }
    }
}
