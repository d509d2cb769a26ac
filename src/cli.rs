//! The `fusion` command line: its arguments and what each subcommand does.
//!
//! `src/bin/fusion.rs` only calls [`main`]; the work is in functions that
//! take their inputs and an output stream, so tests drive them directly.

use clap::{Args, Parser, Subcommand};
use fusion_core::fuse;
use fusion_core::ir::Graph;
use std::fmt;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Fused transformer GPU kernels, compiled at build time from dataflow graphs.
#[derive(Debug, Parser)]
#[command(name = "fusion", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Splits a graph into fused kernels and prints the plan.
    Plan(PlanArgs),
    /// Times the built-in fused kernels against cuBLASLt on GPU 0.
    Bench(BenchArgs),
    /// Renders the GEMM units of a candidate list, with the kernel self-test
    /// harness and a Makefile, into a folder that builds with nvcc alone.
    Render(RenderArgs),
    /// Writes a model's feed-forward block as a TOML graph, from its Hugging
    /// Face config.json.
    Graph(GraphArgs),
}

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

#[derive(Debug, Args)]
pub struct RenderArgs {
    /// The candidate list, such as `kernels/selftest/candidates.json`.
    #[arg(value_name = "LIST.json")]
    pub list: PathBuf,
    /// The folder to write.
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
    /// Where the graphs the list names are; default: the shipped `graphs/`
    /// (or `FUSION_GRAPHS_DIR`).
    #[arg(long, value_name = "DIR")]
    pub graphs: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A shape `M,N,K` to time (repeat for several); default: the six standard shapes.
    #[arg(long = "shape", value_name = "M,N,K", value_parser = parse_shape)]
    pub shapes: Vec<(usize, usize, usize)>,
    /// Only these kernels (repeat for several), by graph name such as `gemm_bias_gelu`.
    #[arg(long = "kernel", value_name = "NAME")]
    pub kernels: Vec<String>,
    /// Token counts for the SwiGLU FFN block (comma-separated); 0 skips it.
    #[arg(long = "ffn-tokens", value_name = "M,…", value_delimiter = ',', default_values_t = crate::bench::DEFAULT_FFN_TOKENS)]
    pub ffn_tokens: Vec<usize>,
    /// Element type: f16 or bf16.
    #[arg(long, default_value = "f16")]
    pub dtype: String,
    /// Timed calls per contender (the median is reported).
    #[arg(long, default_value_t = 50)]
    pub runs: usize,
    /// Untimed calls first.
    #[arg(long, default_value_t = 10)]
    pub warmup: usize,
    /// Also write the results as JSON to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also time each row's ours and first on N streams at once, each with
    /// its own host thread, buffers and workspace, against one stream at a
    /// time: a second table of slowdowns.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=64))]
    pub streams: Option<u16>,
}

fn parse_shape(text: &str) -> Result<(usize, usize, usize), String> {
    let dims: Vec<usize> = text
        .split(',')
        .map(|d| {
            d.trim()
                .parse::<usize>()
                .map_err(|_| format!("`{text}` is not M,N,K (three whole numbers)"))
        })
        .collect::<Result<_, _>>()?;
    match dims[..] {
        [m, n, k] if m > 0 && n > 0 && k > 0 => Ok((m, n, k)),
        _ => Err(format!("`{text}` is not M,N,K (three positive whole numbers)")),
    }
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    /// The graph, a TOML file such as `graphs/swiglu_ffn.toml`.
    #[arg(value_name = "GRAPH.toml")]
    pub graph: PathBuf,
    /// Also write the plan as a Graphviz digraph to FILE.
    #[arg(long, value_name = "FILE")]
    pub dot: Option<PathBuf>,
    /// Print the plan as JSON instead of the table.
    #[arg(long)]
    pub json: bool,
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
            let graph = fusion_core::load_toml_graph(&args.graph).map_err(CliError::from_front_end)?;
            plan_graph(graph, args.dot.as_deref(), args.json, out)
        }
        Command::Bench(args) => bench(args, out),
        Command::Render(args) => {
            let graphs = args.graphs.clone().unwrap_or_else(crate::testing::graphs_dir);
            crate::render::render(&args.list, &graphs, &args.out, out)
        }
        Command::Graph(args) => graph_from_hf(args, out),
    }
}

/// `fusion graph --from-hf`: the block's TOML on `out` or in `--out`. The
/// TOML is parsed and planned before it is written, so what it writes reads.
pub fn graph_from_hf(args: &GraphArgs, out: &mut dyn Write) -> Result<(), CliError> {
    use fusion_core::hf;
    let path = args.from_hf.display();
    let json = std::fs::read_to_string(&args.from_hf)
        .map_err(|e| CliError::Message(format!("cannot read {path}: {e}")))?;
    let config = hf::ffn_config(&json).map_err(|e| CliError::Message(format!("{path}: {e}")))?;
    let dtype = match args.dtype.as_str() {
        "f16" => fusion_core::ir::DType::F16,
        "bf16" => fusion_core::ir::DType::BF16,
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
    let source = fusion_core::diagnostic::SourceFile::new(format!("{name}.toml"), toml.as_str());
    let graph = fusion_core::graph_from_source(&source).map_err(CliError::Rendered)?;
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

/// `fusion bench`: the table on `out`, progress on stderr, JSON on request.
pub fn bench(args: &BenchArgs, out: &mut dyn Write) -> Result<(), CliError> {
    use crate::bench::{self, BenchConfig, Pattern};
    let mut config = BenchConfig::default();
    if !args.shapes.is_empty() {
        config.shapes = args.shapes.clone();
    }
    if !args.kernels.is_empty() {
        config.patterns = args
            .kernels
            .iter()
            .filter(|k| k.as_str() != "swiglu_ffn")
            .map(|k| {
                Pattern::parse(k).ok_or_else(|| {
                    let known: Vec<&str> = Pattern::ALL.iter().map(|p| p.name()).collect();
                    CliError::Message(format!(
                        "unknown kernel `{k}`: known are {} and swiglu_ffn",
                        known.join(", ")
                    ))
                })
            })
            .collect::<Result<_, _>>()?;
        if !args.kernels.iter().any(|k| k == "swiglu_ffn") {
            config.ffn_tokens.clear();
        }
    }
    config.ffn_tokens.retain(|&m| m > 0);
    if !args.kernels.is_empty()
        && args.kernels.iter().any(|k| k == "swiglu_ffn")
        && config.ffn_tokens.is_empty()
    {
        config.ffn_tokens = bench::DEFAULT_FFN_TOKENS.to_vec();
    }
    config.timing = bench::timing::TimingPlan {
        warmup: args.warmup,
        runs: args.runs.max(1),
    };
    config.streams = args.streams.map(usize::from);

    let gpu = |e: crate::Error| CliError::Message(e.to_string());
    let ctx = crate::testing::open_gpu(0).map_err(CliError::Message)?;
    let stream = ctx.new_stream().map_err(|e| gpu(e.into()))?;
    let (major, minor) = ctx.compute_capability().map_err(|e| gpu(e.into()))?;
    let arch = crate::device::arch_for(&stream).map_err(gpu)?;
    let device = ctx.name().unwrap_or_else(|_| "unknown GPU".into());
    let date = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let bus_id = bench::smi::pci_bus_id(&ctx);
    let driver = bus_id.as_deref().and_then(bench::smi::driver_version);
    let clock = bus_id.as_deref().and_then(bench::smi::ClockSampler::start);
    writeln!(
        out,
        "{device} (compute capability {major}.{minor}), fusion variant {}, {}, fusion {}, cuBLASLt {}, driver {}",
        arch.name(),
        args.dtype,
        COMMIT,
        bench::cublaslt::version(),
        driver.as_deref().unwrap_or("unknown"),
    )
    .map_err(CliError::from_stdout)?;

    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("a valid template"),
    );
    let progress = |done: usize, total: usize, label: &str| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(label.to_string());
    };
    let rows = match args.dtype.as_str() {
        "f16" => bench::run::<half::f16>(&stream, &config, clock.as_ref(), progress),
        "bf16" => bench::run::<half::bf16>(&stream, &config, clock.as_ref(), progress),
        other => {
            return Err(CliError::Message(format!(
                "--dtype {other}: expected f16 or bf16"
            )));
        }
    };
    bar.finish_and_clear();
    let report = bench::Report {
        device,
        compute_capability: format!("{major}.{minor}"),
        variant: arch.name().to_string(),
        dtype: args.dtype.clone(),
        runs: config.timing.runs,
        warmup: config.timing.warmup,
        rows: rows.map_err(gpu)?,
        commit: COMMIT.to_string(),
        date: bench::report::utc_date(date),
        cublaslt_version: bench::cublaslt::version(),
        cuda_driver_version: bench::cuda_driver_version().map_err(gpu)?,
        driver,
        timing: bench::TimingDescription::new(config.timing),
        sm_clock: clock.as_ref().and_then(|c| c.overall()),
    };
    drop(clock);
    write!(out, "{}", bench::table(&report)).map_err(CliError::from_stdout)?;
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).expect("a report serialises");
        std::fs::write(path, text + "\n")
            .map_err(|e| CliError::Message(format!("cannot write {}: {e}", path.display())))?;
        writeln!(out, "wrote {}", path.display()).map_err(CliError::from_stdout)?;
    }
    Ok(())
}

/// The commit `fusion` was built from (`build.rs`), for `fusion bench`'s
/// report.
const COMMIT: &str = env!("FUSION_GIT_COMMIT");

/// `fusion plan` on a loaded graph: prints the plan (as JSON with `json`)
/// and, given a path, writes it there as Graphviz; with JSON on standard
/// output, the line saying so goes to standard error.
pub fn plan_graph(graph: Graph, dot: Option<&Path>, json: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let plan = fuse::plan(graph);
    if json {
        let text = serde_json::to_string_pretty(&plan.to_json()).expect("a JSON value serializes");
        writeln!(out, "{text}").map_err(CliError::from_stdout)?;
    } else {
        write!(out, "{plan}").map_err(CliError::from_stdout)?;
    }
    if let Some(path) = dot {
        std::fs::write(path, fuse::dot::write(&plan)).map_err(|e| {
            CliError::Message(format!("cannot write the Graphviz file {}: {e}", path.display()))
        })?;
        let note = format!(
            "wrote the plan as Graphviz to {} (render it with `dot -Tsvg {} -o plan.svg`)",
            path.display(),
            path.display()
        );
        if json {
            eprintln!("{note}");
        } else {
            writeln!(out, "\n{note}").map_err(CliError::from_stdout)?;
        }
    }
    out.flush().map_err(CliError::from_stdout)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;
    use fusion_core::ir::{DType, GraphBuilder, WeightLayout};
    use std::ffi::OsStr;

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
    fn plan_prints_the_plan() {
        let mut out = Vec::new();
        plan_graph(ffn(), None, false, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("graph `ffn`: 3 ops → 1 kernel\n"), "{text}");
        assert!(text.contains("#0  gemm_bias_gelu  (named pattern)"), "{text}");
        assert!(!text.contains("Graphviz"), "{text}");
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
        assert!(String::from_utf8(out).unwrap().contains("(3 kernels:"));
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
        assert!(written.starts_with("digraph \"ffn\" {"), "{written}");
        assert_eq!(written.matches("subgraph cluster_").count(), 1);
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(&format!("wrote the plan as Graphviz to {}", path.display())),
            "{text}"
        );
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
        assert_eq!(args.list, Path::new("list.json"));
        assert_eq!(args.out, Path::new("dir"));
        assert_eq!(args.graphs, None);
        assert!(
            Cli::try_parse_from(["fusion", "render", "list.json"]).is_err(),
            "--out is required"
        );
    }

    #[test]
    fn bench_shapes_parse_and_bad_ones_are_refused() {
        assert_eq!(parse_shape("512,2048,2048"), Ok((512, 2048, 2048)));
        assert!(parse_shape("512,2048").unwrap_err().contains("not M,N,K"));
        assert!(parse_shape("0,8,8").unwrap_err().contains("positive"));
        let cli = Cli::try_parse_from([
            "fusion",
            "bench",
            "--shape",
            "128,14336,4096",
            "--kernel",
            "gemm_bias",
        ])
        .unwrap();
        let Command::Bench(args) = cli.command else {
            panic!("bench")
        };
        assert_eq!(args.shapes, [(128, 14336, 4096)]);
        assert_eq!(args.ffn_tokens, crate::bench::DEFAULT_FFN_TOKENS);
    }

    #[test]
    fn bench_refuses_an_unknown_kernel_before_touching_the_gpu() {
        let cli = Cli::try_parse_from(["fusion", "bench", "--kernel", "gemm_tanh"]).unwrap();
        let err = run(&cli, &mut Vec::new()).unwrap_err();
        let CliError::Message(text) = err else {
            panic!("{err:?}")
        };
        assert!(
            text.contains("unknown kernel `gemm_tanh`") && text.contains("gemm_bias_gelu"),
            "{text}"
        );
    }
}
