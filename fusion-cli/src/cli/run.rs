//! `fusion run`'s arguments and the dispatch to [`crate::run`].

use super::CliError;
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

/// `fusion run`'s arguments.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The graph, a TOML file such as `graphs/swiglu_ffn.toml`.
    #[arg(value_name = "GRAPH.toml")]
    pub graph: PathBuf,
    /// A safetensors file holding the graph's inputs under their declared
    /// names, f16 or bf16 as the graph declares them.
    #[arg(long, value_name = "X.safetensors")]
    pub inputs: PathBuf,
    /// A safetensors file holding its weights; default: the inputs' file.
    #[arg(long, value_name = "W.safetensors")]
    pub weights: Option<PathBuf>,
    /// Read the weights under the names of decoder layer N of a Llama-style
    /// Hugging Face checkpoint (`model.layers.N.mlp.gate_proj.weight` for
    /// `w_gate`, `…post_attention_layernorm.weight` for `norm`, as `fusion
    /// graph --from-hf` names them); default: their declared names.
    #[arg(long = "hf-layer", value_name = "N")]
    pub hf_layer: Option<usize>,
    /// Run the graph in this element type (`f16`, `bf16`) in place of the
    /// one it declares: a bf16 checkpoint through an f16 graph.
    #[arg(long, value_name = "DTYPE")]
    pub dtype: Option<String>,
    /// Write the outputs to this safetensors file.
    #[arg(long, value_name = "Y.safetensors")]
    pub out: Option<PathBuf>,
    /// Compare every output with the CPU reference on sampled rows (all up
    /// to 256 rows; beyond, one in every 64-row band and 16 more); fails
    /// when one does not match.
    #[arg(long)]
    pub check: bool,
    /// Time N calls (CUDA events, after up to 10 untimed ones) and print
    /// the median per call.
    #[arg(long, value_name = "N")]
    pub time: Option<usize>,
    /// Where the kernels' units, shared libraries and nvcc logs go; a later
    /// run reuses a library whose sources, headers, nvcc and flags are
    /// unchanged. Default: `fusion/run` under `XDG_CACHE_HOME` (else
    /// `~/.cache`).
    #[arg(long, value_name = "DIR")]
    pub work: Option<PathBuf>,
    /// nvcc processes at once; default: one per CPU.
    #[arg(long, value_name = "N")]
    pub jobs: Option<usize>,
}

/// `fusion run`: the graph once on the files' tensors.
pub fn run(args: &RunArgs, out: &mut dyn Write) -> Result<(), CliError> {
    let settings = crate::run::Settings {
        graph: args.graph.clone(),
        dtype: args.dtype.as_deref().map(super::kernel_dtype).transpose()?,
        inputs: args.inputs.clone(),
        weights: args.weights.clone(),
        weight_names: args.hf_layer.map_or_else(
            fusion::weights::TensorNames::declared,
            fusion::weights::TensorNames::hugging_face,
        ),
        out: args.out.clone(),
        check: args.check,
        time: args.time,
        work: args.work.clone().unwrap_or_else(default_work),
        jobs: args
            .jobs
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())),
    };
    crate::run::run(&settings, out).map_err(CliError::Message)
}

/// `fusion/run` under the user's cache folder, or `fusion-run` here when
/// there is no home.
fn default_work() -> PathBuf {
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".cache")));
    cache.map_or_else(
        || PathBuf::from("fusion-run"),
        |dir| dir.join("fusion").join("run"),
    )
}
