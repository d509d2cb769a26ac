//! Feed-forward block graphs from a Hugging Face `config.json`
//! (`fusion graph --from-hf`): the sizes, activation and epsilon a model's
//! config gives, written as a TOML graph that `fusion plan`, the build and
//! `fusion_graph!` read. Two families:
//!
//! - gated (Llama, Mistral, Qwen2, Qwen3): RMSNorm, then
//!   `act(h @ w_gate^T) * (h @ w_up^T)`, the down projection and the residual
//!   add: the norm feeds both projections, which the planner makes one gated
//!   GEMM with the norm folded into its interleaved weight;
//! - GPT-2: LayerNorm, `c_fc` with bias, the activation, `c_proj` with bias
//!   and the residual add.
//!
//! The weight names say which Hugging Face tensor each one is.

use crate::ir::DType;
use crate::names::gated_weight_name;
use serde_json::Value;

/// What a feed-forward block is made of, read from a config.
#[derive(Clone, Debug, PartialEq)]
pub struct FfnConfig {
    /// The config's `model_type`, e.g. `llama`.
    pub model_type: String,
    /// Which block it is.
    pub family: Family,
    /// D, the hidden size.
    pub hidden: u64,
    /// F, the feed-forward (intermediate) size.
    pub intermediate: u64,
    /// The activation, as the op table names it (`silu`, `gelu`, …).
    pub activation: &'static str,
    /// The norm's epsilon.
    pub eps: f64,
}

/// The kinds of feed-forward block a config can describe.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Family {
    /// RMSNorm and a gated MLP (Llama, Mistral, Qwen2, Qwen3).
    Gated,
    /// LayerNorm and a two-layer MLP with biases (GPT-2).
    Gpt2,
}

/// Reads a Hugging Face `config.json`. The error says which field is
/// missing or which value is not supported.
pub fn ffn_config(json: &str) -> Result<FfnConfig, String> {
    let config: Value = serde_json::from_str(json).map_err(|e| format!("not a JSON config: {e}"))?;
    let text = |key: &str| config.get(key).and_then(Value::as_str);
    let size = |key: &str| -> Result<u64, String> {
        config
            .get(key)
            .and_then(Value::as_u64)
            .filter(|&n| n > 0)
            .ok_or_else(|| format!("the config has no positive integer `{key}`"))
    };
    let number = |key: &str| -> Result<f64, String> {
        config
            .get(key)
            .and_then(Value::as_f64)
            .ok_or_else(|| format!("the config has no number `{key}`"))
    };
    let model_type = text("model_type")
        .ok_or("the config has no `model_type`")?
        .to_owned();
    match model_type.as_str() {
        "llama" | "mistral" | "qwen2" | "qwen3" => Ok(FfnConfig {
            family: Family::Gated,
            hidden: size("hidden_size")?,
            intermediate: size("intermediate_size")?,
            activation: activation(text("hidden_act").unwrap_or("silu"))?,
            eps: number("rms_norm_eps")?,
            model_type,
        }),
        "gpt2" => {
            let hidden = size("n_embd")?;
            // GPT-2 writes `n_inner: null` for the usual 4·n_embd.
            let intermediate = match config.get("n_inner") {
                None | Some(Value::Null) => 4 * hidden,
                Some(_) => size("n_inner")?,
            };
            Ok(FfnConfig {
                family: Family::Gpt2,
                hidden,
                intermediate,
                activation: activation(text("activation_function").unwrap_or("gelu_new"))?,
                eps: number("layer_norm_epsilon")?,
                model_type,
            })
        }
        other => Err(format!(
            "model_type `{other}` is not supported: llama, mistral, qwen2 and qwen3 (RMSNorm and a gated MLP) and gpt2 are"
        )),
    }
}

/// The op for a Hugging Face activation name.
pub(crate) fn activation(name: &str) -> Result<&'static str, String> {
    Ok(match name {
        "silu" | "swish" => "silu",
        "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => "gelu",
        "gelu" => "gelu_erf",
        "quick_gelu" => "gelu_quick",
        "relu" => "relu",
        other => return Err(format!("activation `{other}` is not supported")),
    })
}

/// The block as a TOML graph named `name`, its tensors in `dtype`.
pub fn ffn_toml(config: &FfnConfig, name: &str, dtype: DType) -> String {
    let FfnConfig {
        model_type,
        hidden,
        intermediate,
        activation,
        eps,
        ..
    } = config;
    let head = format!(
        "# {name}: the feed-forward block of a `{model_type}` model, from its config.json\n\
         # (D = hidden size, F = intermediate size); weight names in comments are Hugging Face's.\n\
         [graph]\nname = \"{name}\"\n"
    );
    let dims = format!("[dims]\nM = \"dyn\"      # token count\nD = {hidden}\nF = {intermediate}\n");
    let inputs = format!("[inputs]\nx = \"{dtype}[M, D]\"\n");
    match config.family {
        Family::Gated => {
            let norm = format!("rmsnorm(x, norm, eps = {eps:e})");
            let hf = |name| gated_weight_name(name).unwrap_or_default();
            let (hf_norm, hf_gate, hf_up, hf_down) = (hf("norm"), hf("w_gate"), hf("w_up"), hf("w_down"));
            format!(
                "{head}doc = \"{model_type} feed-forward block: RMSNorm, gated {activation} MLP, residual add.\"\n\n\
                 {dims}\n{inputs}\n\
                 [weights]\n\
                 norm   = \"{dtype}[D]\"      # {hf_norm}\n\
                 w_gate = \"{dtype}[F, D]\"   # {hf_gate}\n\
                 w_up   = \"{dtype}[F, D]\"   # {hf_up}\n\
                 w_down = \"{dtype}[D, F]\"   # {hf_down}\n\n\
                 # One norm for both projections: with them it is one gated GEMM, the norm folded into its weight.\n\
                 [compute]\n\
                 h    = \"{norm}\"\n\
                 gate = \"{activation}(h @ w_gate^T)\"\n\
                 act  = \"gate * (h @ w_up^T)\"\n\n\
                 [outputs]\n\
                 y = \"act @ w_down^T + x\"\n"
            )
        }
        Family::Gpt2 => format!(
            "{head}doc = \"{model_type} MLP block: LayerNorm, c_fc, {activation}, c_proj, residual add.\"\n\n\
             {dims}\n{inputs}\n\
             [weights]      # GPT-2 keeps c_fc and c_proj as Conv1D weights [in, out]: transpose them when loading\n\
             ln_g   = \"{dtype}[D]\"      # ln_2.weight\n\
             ln_b   = \"{dtype}[D]\"      # ln_2.bias\n\
             w_fc   = \"{dtype}[F, D]\"   # mlp.c_fc.weight, transposed\n\
             b_fc   = \"{dtype}[F]\"      # mlp.c_fc.bias\n\
             w_proj = \"{dtype}[D, F]\"   # mlp.c_proj.weight, transposed\n\
             b_proj = \"{dtype}[D]\"      # mlp.c_proj.bias\n\n\
             [compute]\n\
             h = \"{activation}(layernorm(x, ln_g, ln_b, eps = {eps:e}) @ w_fc^T + b_fc)\"\n\n\
             [outputs]\n\
             y = \"h @ w_proj^T + b_proj + x\"\n"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::diagnostic::SourceFile;

    const LLAMA_3_8B: &str = r#"{"model_type": "llama", "hidden_size": 4096, "intermediate_size": 14336,
        "hidden_act": "silu", "rms_norm_eps": 1e-05, "num_hidden_layers": 32}"#;
    const GPT2: &str = r#"{"model_type": "gpt2", "n_embd": 768, "n_inner": null,
        "activation_function": "gelu_new", "layer_norm_epsilon": 1e-05}"#;

    fn plan_of(toml: &str) -> crate::fuse::Plan {
        let source = SourceFile::new("generated.toml", toml);
        let graph = crate::graph_from_source(&source).unwrap_or_else(|e| panic!("{e}\n{toml}"));
        crate::fuse::plan(graph)
    }

    #[test]
    fn a_llama_config_gives_rmsnorm_and_a_gated_mlp_in_two_kernels_the_norm_folded() {
        let config = ffn_config(LLAMA_3_8B).unwrap();
        assert_eq!(
            (config.family, config.hidden, config.intermediate),
            (Family::Gated, 4096, 14336)
        );
        assert_eq!((config.activation, config.eps), ("silu", 1e-5));
        let toml = ffn_toml(&config, "llama_ffn", DType::BF16);
        assert!(toml.contains("D = 4096\nF = 14336\n"), "{toml}");
        assert!(toml.contains("w_gate = \"bf16[F, D]\""), "{toml}");
        assert!(
            toml.contains("w_gate = \"bf16[F, D]\"   # mlp.gate_proj.weight\n"),
            "{toml}"
        );
        let plan = plan_of(&toml);
        let names: Vec<&str> = plan.kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["rmsnorm_gemm_silu_glu", "gemm_residual"], "{plan}");
        assert!(plan.kernels[0].norm_foldable(&plan.graph), "{plan}");
    }

    #[test]
    fn a_gpt2_config_gives_layernorm_and_the_mlp_with_n_inner_defaulting_to_4_d() {
        let config = ffn_config(GPT2).unwrap();
        assert_eq!(
            (config.family, config.hidden, config.intermediate),
            (Family::Gpt2, 768, 3072)
        );
        assert_eq!(config.activation, "gelu");
        let plan = plan_of(&ffn_toml(&config, "gpt2_mlp", DType::F16));
        let names: Vec<&str> = plan.kernels.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(
            names,
            ["layernorm_gemm_bias_gelu", "gemm_bias_residual"],
            "{plan}"
        );
        assert!(plan.kernels[0].norm_foldable(&plan.graph));
    }

    #[test]
    fn activations_map_to_the_op_table_and_unknown_ones_are_named() {
        for (hf, op) in [
            ("gelu", "gelu_erf"),
            ("gelu_pytorch_tanh", "gelu"),
            ("quick_gelu", "gelu_quick"),
        ] {
            let json = LLAMA_3_8B.replace("\"silu\"", &format!("\"{hf}\""));
            let config = ffn_config(&json).unwrap();
            assert_eq!(config.activation, op);
            plan_of(&ffn_toml(&config, "g", DType::F16));
        }
        let json = LLAMA_3_8B.replace("\"silu\"", "\"mish\"");
        assert_eq!(
            ffn_config(&json).unwrap_err(),
            "activation `mish` is not supported"
        );
    }

    #[test]
    fn missing_fields_and_other_models_are_refused_with_the_reason() {
        let json = LLAMA_3_8B.replace("\"rms_norm_eps\": 1e-05,", "");
        assert_eq!(
            ffn_config(&json).unwrap_err(),
            "the config has no number `rms_norm_eps`"
        );
        let json = LLAMA_3_8B.replace("\"hidden_size\": 4096", "\"hidden_size\": 0");
        assert_eq!(
            ffn_config(&json).unwrap_err(),
            "the config has no positive integer `hidden_size`"
        );
        let json = LLAMA_3_8B.replace("llama", "t5");
        assert!(
            ffn_config(&json)
                .unwrap_err()
                .starts_with("model_type `t5` is not supported")
        );
        assert!(ffn_config("{").unwrap_err().starts_with("not a JSON config"));
    }
}
