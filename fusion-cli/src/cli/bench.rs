//! `fusion bench`: its arguments and the run that times the shipped kernels
//! against cuBLASLt. Part of the command line only with the `kernels`
//! feature, as what it times is `fusion::kernels`.

use super::CliError;
use crate::bench::{self, BenchConfig, FfnRow, NormRow, Pattern, compare, corpus};

/// The standalone norms, which a corpus run times at its models' hidden
/// sizes.
const NORMS: [NormRow; 2] = [NormRow::LayerNorm, NormRow::RmsNorm];
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

/// `fusion bench`'s arguments.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// A shape `M,N,K` to time with every kernel named (repeat for several); default: six standard
    /// shapes for every kernel, and M = 1, 16, 64 at (M, 14336, 4096) and (M, 4096, 14336) for gemm,
    /// gemm_bias_gelu and gemm_silu.
    #[arg(long = "shape", value_name = "M,N,K", value_parser = parse_shape)]
    pub shapes: Vec<(usize, usize, usize)>,
    /// Only these kernels (repeat for several), by graph name such as `gemm_bias_gelu`.
    #[arg(long = "kernel", value_name = "NAME")]
    pub kernels: Vec<String>,
    /// Token counts for the FFN blocks, swiglu_ffn and ffn_sublayer (comma-separated); 0 skips them.
    /// Default: 1,16,128,1000,8192.
    #[arg(long = "ffn-tokens", value_name = "M,…", value_delimiter = ',', default_values_t = bench::DEFAULT_FFN_TOKENS)]
    pub ffn_tokens: Vec<usize>,
    /// Element type: f16 or bf16.
    #[arg(long, default_value = "f16")]
    pub dtype: String,
    /// Timed calls per contender (the median is reported).
    #[arg(long, default_value_t = 50)]
    pub runs: usize,
    /// Untimed calls first (at least one per rotated input set: 8).
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
    /// Also measure each row's host time per call (checks, event
    /// bookkeeping, launches; the device kept busy) against as many
    /// cublasLtMatmul calls as the row's struct launches kernels: a table
    /// of µs per call and per launch.
    #[arg(long)]
    pub host: bool,
    /// Time the layers of a model corpus (such as `benchmarks/corpus.toml`)
    /// in place of the standard shapes and FFN rows, each with its model's
    /// epilogue at each of the corpus's token counts, and print the ratios'
    /// geometric mean, 10th percentile and minimum per kernel. `--kernel`
    /// keeps only the layers of the kernels named.
    #[arg(long, value_name = "FILE")]
    pub corpus: Option<PathBuf>,
    /// The token counts M of `--corpus` (comma-separated) in place of the file's.
    #[arg(
        long = "corpus-tokens",
        value_name = "M,…",
        value_delimiter = ',',
        requires = "corpus"
    )]
    pub corpus_tokens: Vec<u64>,
    /// Run part I of N of `--corpus`'s cases (every N-th, from the I-th), so
    /// that a long run can be split over several; `--summary` reads the
    /// parts' JSON files together.
    #[arg(long, value_name = "I/N", value_parser = parse_shard, requires = "corpus")]
    pub shard: Option<(usize, usize)>,
    /// Print the summary of earlier runs' `--json` files (several are read
    /// as one run, such as the shards of one) and time nothing.
    #[arg(long, value_name = "FILE.json", num_args = 1.., conflicts_with_all = ["corpus", "shapes"])]
    pub summary: Vec<PathBuf>,
    /// With `--summary`: the summary as a Markdown table (BENCHMARKS.md's head).
    #[arg(long, requires = "summary")]
    pub markdown: bool,
    /// With `--summary`: compare its files' rows with these earlier runs'
    /// (several read as one), row by row: our time and the ratio, new over
    /// old, per kernel family, and the rows that moved beyond both runs'
    /// spread.
    #[arg(long, value_name = "FILE.json", num_args = 1.., requires = "summary")]
    pub against: Vec<PathBuf>,
}

fn parse_shard(text: &str) -> Result<(usize, usize), String> {
    let bad = || format!("`{text}` is not I/N with 1 ≤ I ≤ N");
    let (i, n) = text.split_once('/').ok_or_else(bad)?;
    let (i, n) = (
        i.trim().parse::<usize>().map_err(|_| bad())?,
        n.trim().parse::<usize>().map_err(|_| bad())?,
    );
    if i == 0 || i > n { Err(bad()) } else { Ok((i, n)) }
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

/// `fusion bench`: the table on `out`, progress on stderr, JSON on request.
pub fn bench(args: &BenchArgs, out: &mut dyn Write) -> Result<(), CliError> {
    if !args.summary.is_empty() {
        let rows = read_rows(&args.summary, args.markdown, out)?;
        write_summary(&rows, args.markdown, out)?;
        if !args.against.is_empty() {
            writeln!(out, "\nAgainst:").map_err(CliError::from_stdout)?;
            let old = read_rows(&args.against, false, out)?;
            let table = compare::comparison_table(&compare::compare(&rows, &old));
            write!(out, "{table}").map_err(CliError::from_stdout)?;
        }
        return Ok(());
    }
    let config = config_of(args)?;
    run_bench(config, args, out)
}

/// `--summary`: the rows of its files, summarized as one run, as text or
/// as Markdown.
fn write_summary(rows: &[bench::Row], markdown: bool, out: &mut dyn Write) -> Result<(), CliError> {
    let summaries = corpus::summarize(rows);
    let text = if markdown {
        format!("\n{}", corpus::summary_markdown(&summaries))
    } else {
        corpus::summary_table(&summaries)
    };
    write!(out, "{text}").map_err(CliError::from_stdout)
}

/// The rows of every `--json` file of `paths`, in order, each file named on
/// `out` with its run's device, dtype, commit and date.
fn read_rows(paths: &[PathBuf], markdown: bool, out: &mut dyn Write) -> Result<Vec<bench::Row>, CliError> {
    let mut rows = Vec::new();
    for path in paths {
        let text = std::fs::read_to_string(path)
            .map_err(|e| CliError::Message(format!("cannot read {}: {e}", path.display())))?;
        let report: bench::Report = serde_json::from_str(&text).map_err(|e| {
            CliError::Message(format!("{}: not a fusion bench --json file: {e}", path.display()))
        })?;
        let name = if markdown {
            format!("From `{}`", path.display())
        } else {
            path.display().to_string()
        };
        writeln!(
            out,
            "{name}: {} rows, {} {}, fusion {}, {}",
            report.rows.len(),
            report.device,
            report.dtype,
            report.commit,
            report.date,
        )
        .map_err(CliError::from_stdout)?;
        rows.extend(report.rows);
    }
    Ok(rows)
}

/// The corpus's cases (`--corpus`, `--corpus-tokens`), those of the kernels
/// named alone when some are.
fn corpus_cases(path: &std::path::Path, args: &BenchArgs) -> Result<Vec<corpus::Case>, CliError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Message(format!("cannot read {}: {e}", path.display())))?;
    let parsed = fusion_compiler::corpus::Corpus::parse(&text)
        .map_err(|e| CliError::Message(format!("{}: {e}", path.display())))?;
    let tokens = (!args.corpus_tokens.is_empty()).then_some(args.corpus_tokens.as_slice());
    if tokens.is_some_and(|t| t.contains(&0)) {
        return Err(CliError::Message(
            "--corpus-tokens: token counts must be positive".into(),
        ));
    }
    let mut cases =
        corpus::cases(&parsed, tokens).map_err(|e| CliError::Message(format!("{}: {e}", path.display())))?;
    if !args.kernels.is_empty() {
        cases.retain(|case| args.kernels.iter().any(|k| k == case.kernel()));
    }
    Ok(cases)
}

/// What `fusion bench` measures, from its arguments: the shapes, the kernels
/// and the FFN rows with their token counts (none unless an FFN block,
/// swiglu_ffn or ffn_sublayer, is asked for or no kernel is named; the
/// default counts when one is asked for with none left).
fn config_of(args: &BenchArgs) -> Result<BenchConfig, CliError> {
    let mut config = BenchConfig {
        ffn_tokens: args.ffn_tokens.clone(),
        ..BenchConfig::default()
    };
    if !args.shapes.is_empty() {
        // The shapes given replace the decode shapes too: each is timed
        // with every kernel named.
        config.shapes = args.shapes.clone();
        config.decode_shapes.clear();
    }
    if !args.kernels.is_empty() {
        let is_ffn = |k: &str| FfnRow::ALL.iter().any(|row| row.name() == k);
        let is_norm = |k: &str| NORMS.iter().any(|norm| norm.name() == k);
        if let Some(norm) = args.kernels.iter().find(|k| is_norm(k))
            && args.corpus.is_none()
        {
            return Err(CliError::Message(format!(
                "`{norm}` is timed in a corpus run alone (--corpus FILE), at its models' hidden sizes"
            )));
        }
        config.patterns = args
            .kernels
            .iter()
            .filter(|k| !is_ffn(k) && !is_norm(k))
            .map(|k| {
                Pattern::parse(k).ok_or_else(|| {
                    let mut known: Vec<&str> = Pattern::ALL.iter().map(|p| p.name()).collect();
                    // An FFN block's rows are adjacent in `FfnRow::ALL`: one name each.
                    known.extend(FfnRow::ALL.iter().map(|row| row.name()));
                    known.dedup();
                    known.extend(NORMS.iter().map(|norm| norm.name()));
                    CliError::Message(format!("unknown kernel `{k}`: known are {}", known.join(", ")))
                })
            })
            .collect::<Result<_, _>>()?;
        config.ffn_rows = FfnRow::ALL
            .into_iter()
            .filter(|row| args.kernels.iter().any(|k| k == row.name()))
            .collect();
        if config.ffn_rows.is_empty() {
            config.ffn_tokens.clear();
        }
    }
    config.ffn_tokens.retain(|&m| m > 0);
    if !args.kernels.is_empty() && !config.ffn_rows.is_empty() && config.ffn_tokens.is_empty() {
        config.ffn_tokens = bench::DEFAULT_FFN_TOKENS.to_vec();
    }
    config.timing = bench::timing::TimingPlan {
        warmup: args.warmup,
        runs: args.runs.max(1),
    };
    config.streams = args.streams.map(usize::from);
    config.host = args.host;
    if let Some(path) = &args.corpus {
        // The corpus in place of the standard table.
        config.corpus = corpus_cases(path, args)?;
        config.shapes.clear();
        config.decode_shapes.clear();
        config.ffn_tokens.clear();
    }
    if let Some((index, parts)) = args.shard {
        config.corpus = corpus::shard(std::mem::take(&mut config.corpus), index, parts);
    }
    Ok(config)
}

fn run_bench(config: BenchConfig, args: &BenchArgs, out: &mut dyn Write) -> Result<(), CliError> {
    // Refused before the GPU is touched (the copy measurement allocates 1 GiB).
    let bf16 = super::kernel_dtype(&args.dtype)? == fusion_compiler::ir::DType::BF16;
    let gpu = |e: fusion::Error| CliError::Message(e.to_string());
    let ctx = fusion::testing::open_gpu(0).map_err(CliError::Message)?;
    let stream = ctx.new_stream().map_err(|e| gpu(e.into()))?;
    let (major, minor) = ctx.compute_capability().map_err(|e| gpu(e.into()))?;
    let arch = fusion::device::arch_for(&stream).map_err(gpu)?;
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
    let copy = bench::floor::CopyBandwidth::measure(&stream, config.timing).map_err(gpu)?;
    writeln!(out, "{}", copy.describe()).map_err(CliError::from_stdout)?;

    let bar = indicatif::ProgressBar::new(0).with_style(
        indicatif::ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("a valid template"),
    );
    let progress = |done: usize, total: usize, label: &str| {
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        bar.set_message(label.to_string());
    };
    let rows = if bf16 {
        bench::run::<half::bf16>(&stream, &config, &copy, clock.as_ref(), progress)
    } else {
        bench::run::<half::f16>(&stream, &config, &copy, clock.as_ref(), progress)
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
        copy: Some(copy),
        gemm_tile: fusion::launch::forced_gemm_tile()
            .map_err(|e| CliError::Message(e.to_string()))?
            .map(|tier| tier.name().to_owned()),
        splits: Some(
            fusion::launch::splits()
                .map_err(|e| CliError::Message(e.to_string()))?
                .name()
                .to_owned(),
        ),
        tiles_by_model: bench::tiles_by_model(),
        guarded: bench::guarded(),
    };
    drop(clock);
    write!(out, "{}", bench::table(&report)).map_err(CliError::from_stdout)?;
    if args.corpus.is_some() {
        write!(out, "{}", corpus::summary_table(&corpus::summarize(&report.rows)))
            .map_err(CliError::from_stdout)?;
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command, run};
    use clap::Parser;

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
        assert_eq!(args.ffn_tokens, bench::DEFAULT_FFN_TOKENS);
    }

    #[test]
    fn bench_times_the_ffn_at_the_token_counts_given() {
        let config = |extra: &[&str]| {
            let cli = Cli::try_parse_from(["fusion", "bench"].iter().chain(extra)).unwrap();
            let Command::Bench(args) = cli.command else {
                panic!("bench")
            };
            config_of(&args).unwrap().ffn_tokens
        };
        assert_eq!(config(&[]), bench::DEFAULT_FFN_TOKENS);
        assert_eq!(config(&["--ffn-tokens", "1,128,8192"]), [1, 128, 8192]);
        assert_eq!(config(&["--ffn-tokens", "0"]), [] as [usize; 0]);
        assert_eq!(
            config(&["--kernel", "gemm", "--ffn-tokens", "16"]),
            [] as [usize; 0]
        );
        assert_eq!(config(&["--kernel", "swiglu_ffn", "--ffn-tokens", "16"]), [16]);
        assert_eq!(
            config(&["--kernel", "swiglu_ffn", "--ffn-tokens", "0"]),
            bench::DEFAULT_FFN_TOKENS
        );
    }

    #[test]
    fn ffn_blocks_are_selected_by_name_each_with_its_rows() {
        let cases = |extra: &[&str]| {
            let cli = Cli::try_parse_from(["fusion", "bench"].iter().chain(extra)).unwrap();
            let Command::Bench(args) = cli.command else {
                panic!("bench")
            };
            config_of(&args).unwrap().ffn_cases()
        };
        let tokens = bench::DEFAULT_FFN_TOKENS.len();
        // By default: the SwiGLU block's three rows and the sub-layer's one
        // at each token count, in that order.
        let all = cases(&[]);
        assert_eq!(all.len(), tokens * 4);
        assert_eq!(
            all[..4],
            [
                (FfnRow::SwigluFfn(bench::GateUp::Separate), 1),
                (FfnRow::SwigluFfn(bench::GateUp::Stacked), 1),
                (FfnRow::SwigluFfn(bench::GateUp::StackedFused), 1),
                (FfnRow::FfnSublayer, 1),
            ]
        );
        assert_eq!(all[4], (FfnRow::SwigluFfn(bench::GateUp::Separate), 16));
        let sublayer = cases(&["--kernel", "ffn_sublayer"]);
        assert_eq!(
            sublayer,
            bench::DEFAULT_FFN_TOKENS.map(|m| (FfnRow::FfnSublayer, m))
        );
        assert_eq!(
            cases(&["--kernel", "ffn_sublayer", "--ffn-tokens", "0"]),
            sublayer
        );
        let swiglu = cases(&["--kernel", "swiglu_ffn", "--ffn-tokens", "128"]);
        assert_eq!(swiglu.len(), 3);
        assert!(
            swiglu
                .iter()
                .all(|&(row, m)| row.name() == "swiglu_ffn" && m == 128)
        );
        assert_eq!(
            cases(&[
                "--kernel",
                "swiglu_ffn",
                "--kernel",
                "ffn_sublayer",
                "--ffn-tokens",
                "8"
            ])
            .len(),
            4
        );
        // The FFN names are not single-GEMM patterns; a GEMM named alone
        // runs no FFN row.
        let cli = Cli::try_parse_from(["fusion", "bench", "--kernel", "ffn_sublayer"]).unwrap();
        let Command::Bench(args) = cli.command else {
            panic!("bench")
        };
        assert!(config_of(&args).unwrap().patterns.is_empty());
        assert!(cases(&["--kernel", "gemm"]).is_empty());
    }

    #[test]
    fn decode_shapes_run_the_decode_kernels_unless_shapes_are_given() {
        let cases = |extra: &[&str]| {
            let cli = Cli::try_parse_from(["fusion", "bench"].iter().chain(extra)).unwrap();
            let Command::Bench(args) = cli.command else {
                panic!("bench")
            };
            config_of(&args).unwrap().gemm_cases()
        };
        let is_decode = |shape: &(usize, usize, usize)| bench::DEFAULT_DECODE_SHAPES.contains(shape);
        let all = cases(&[]);
        let default_table = Pattern::ALL.iter().filter(|p| p.in_default_table()).count();
        assert_eq!(default_table, 12);
        let standard = bench::DEFAULT_SHAPES.len() * default_table;
        assert_eq!(
            all.len(),
            standard + bench::DEFAULT_DECODE_SHAPES.len() * Pattern::DECODE.len()
        );
        // Each standard shape with every pattern first, then the decode
        // shapes with the decode patterns alone.
        assert_eq!(all[0], (Pattern::Gemm, bench::DEFAULT_SHAPES[0]));
        assert_eq!(all[default_table].1, bench::DEFAULT_SHAPES[1]);
        assert!(all[..standard].iter().all(|(_, shape)| !is_decode(shape)));
        assert!(
            all[standard..]
                .iter()
                .all(|(pattern, shape)| is_decode(shape) && Pattern::DECODE.contains(pattern))
        );
        assert_eq!(
            all[standard..standard + 3],
            [
                (Pattern::Gemm, (1, 14336, 4096)),
                (Pattern::GemmBiasGelu, (1, 14336, 4096)),
                (Pattern::GemmSilu, (1, 14336, 4096)),
            ]
        );
        // A kernel named that is not a decode pattern: the standard shapes.
        let bias = cases(&["--kernel", "gemm_bias"]);
        assert_eq!(bias.len(), bench::DEFAULT_SHAPES.len());
        assert!(
            bias.iter()
                .all(|&(pattern, shape)| pattern == Pattern::GemmBias && !is_decode(&shape))
        );
        let two = cases(&["--kernel", "gemm_bias", "--kernel", "gemm"]);
        assert_eq!(
            two.len(),
            2 * bench::DEFAULT_SHAPES.len() + bench::DEFAULT_DECODE_SHAPES.len()
        );
        // Shapes given replace both lists, for every kernel named.
        assert_eq!(
            cases(&["--shape", "1,14336,4096", "--kernel", "gemm_bias"]),
            [(Pattern::GemmBias, (1, 14336, 4096))]
        );
        assert_eq!(cases(&["--shape", "2,8,8"]).len(), default_table);
        // A kernel outside the default table runs where it is named.
        assert_eq!(
            cases(&["--shape", "2,8,8", "--kernel", "gemm_silu_glu"]),
            [(Pattern::GemmSiluGlu, (2, 8, 8))]
        );
    }

    #[test]
    fn a_corpus_replaces_the_standard_table_and_shards_split_it() {
        let corpus = concat!(env!("CARGO_MANIFEST_DIR"), "/../benchmarks/corpus.toml");
        let config = |extra: &[&str]| {
            let cli =
                Cli::try_parse_from(["fusion", "bench", "--corpus", corpus].iter().chain(extra)).unwrap();
            let Command::Bench(args) = cli.command else {
                panic!("bench")
            };
            config_of(&args).unwrap()
        };
        let all = config(&[]);
        assert!(all.ffn_cases().is_empty());
        assert_eq!(all.gemm_cases().len() + all.norm_cases().len(), all.corpus.len());
        assert!(!all.norm_cases().is_empty());
        assert!(all.corpus.len() > 500, "{}", all.corpus.len());
        let residual = config(&["--kernel", "gemm_residual", "--corpus-tokens", "5,6"]);
        assert!(!residual.corpus.is_empty());
        assert!(
            residual
                .corpus
                .iter()
                .all(|c| c.kernel() == "gemm_residual" && [5, 6].contains(&c.m()))
        );
        let norms = config(&["--kernel", "rmsnorm"]);
        assert!(norms.gemm_cases().is_empty() && !norms.norm_cases().is_empty());
        // A norm named without a corpus is refused, not silently skipped.
        let cli = Cli::try_parse_from(["fusion", "bench", "--kernel", "layernorm"]).unwrap();
        let Command::Bench(args) = cli.command else {
            panic!("bench")
        };
        assert!(matches!(config_of(&args), Err(CliError::Message(m)) if m.contains("corpus run alone")));
        let halves = [config(&["--shard", "1/2"]), config(&["--shard", "2/2"])];
        assert_eq!(halves[0].corpus.len() + halves[1].corpus.len(), all.corpus.len());
        assert_eq!(halves[1].corpus[0], all.corpus[1]);
        assert_eq!(parse_shard("3/2").unwrap_err(), "`3/2` is not I/N with 1 ≤ I ≤ N");
        assert!(parse_shard("0/2").is_err() && parse_shard("1").is_err());
        // --shard and --corpus-tokens need a corpus.
        assert!(Cli::try_parse_from(["fusion", "bench", "--shard", "1/2"]).is_err());
    }

    #[test]
    fn a_summary_reads_bench_json_files_without_a_gpu() {
        let dir = std::env::temp_dir().join(format!("fusion-summary-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let committed = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../benchmarks/2026-12-03-c1372dc.json"
        );
        let cli = Cli::try_parse_from(["fusion", "bench", "--summary", committed]).unwrap();
        let mut out = Vec::new();
        run(&cli, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.contains("rows, NVIDIA H200"), "{text}");
        assert!(
            text.contains("gemm_bias_gelu") && text.contains("M ≥ 128"),
            "{text}"
        );
        let cli = Cli::try_parse_from(["fusion", "bench", "--summary", committed, "--markdown"]).unwrap();
        let mut out = Vec::new();
        run(&cli, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("From `"), "{text}");
        assert!(text.contains("| gemm_bias_gelu | M ≥ 128 |"), "{text}");
        let bad = dir.join("bad.json");
        std::fs::write(&bad, "{}").unwrap();
        let cli = Cli::try_parse_from(["fusion", "bench", "--summary", bad.to_str().unwrap()]).unwrap();
        let CliError::Message(e) = run(&cli, &mut Vec::new()).unwrap_err() else {
            panic!("a message")
        };
        assert!(e.contains("not a fusion bench --json file"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_summary_against_earlier_runs_compares_them_row_by_row() {
        let file = |name: &str| {
            format!(
                "{}/../benchmarks/2026-12-05-11895f7-corpus-{name}-h200.json",
                env!("CARGO_MANIFEST_DIR")
            )
        };
        let (tail, whole) = (file("tables-1of2"), file("nosk-1of2"));
        let cli = Cli::try_parse_from(["fusion", "bench", "--summary", &tail, "--against", &whole]).unwrap();
        let mut out = Vec::new();
        run(&cli, &mut out).unwrap();
        let text = String::from_utf8(out).unwrap();
        let (summary, comparison) = text
            .split_once("\nAgainst:\n")
            .expect("a comparison after the summary");
        assert!(summary.contains("gemm_residual"), "{summary}");
        assert!(
            comparison.contains("153 rows in both runs (0 only in the new, 0 only in the old)"),
            "{comparison}"
        );
        assert!(comparison.lines().any(|l| l.starts_with("all ")), "{comparison}");
        // Stream-K over the last wave of (1000, 4800, 1600)'s 200 tiles of
        // 25 k-blocks took 42.4 against 37.5 us in this run.
        let slower = comparison
            .split("slower beyond the spread")
            .nth(1)
            .expect("rows slower with the tail");
        assert!(slower.contains("1000,4800,1600"), "{comparison}");
        // --against needs --summary.
        assert!(Cli::try_parse_from(["fusion", "bench", "--against", &whole]).is_err());
    }

    #[test]
    fn bench_refuses_an_unknown_kernel_before_touching_the_gpu() {
        let cli = Cli::try_parse_from(["fusion", "bench", "--kernel", "gemm_tanh"]).unwrap();
        let err = run(&cli, &mut Vec::new()).unwrap_err();
        let CliError::Message(text) = err else {
            panic!("{err:?}")
        };
        assert!(
            text.contains("unknown kernel `gemm_tanh`")
                && text.contains("gemm_bias_gelu")
                && text.ends_with("swiglu_ffn, ffn_sublayer, layernorm, rmsnorm"),
            "{text}"
        );
    }
}
