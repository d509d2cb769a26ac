//! A corpus of real model layers: the linear layers of public transformer
//! models, derived from the sizes their published configs give, for
//! measuring a speed claim over many models rather than a few shapes
//! (`fusion bench --corpus`, `benchmarks/corpus.toml`).
//!
//! A model is a handful of config values (hidden size, intermediate size,
//! heads, key/value heads, head size, the MLP's kind and activation, the
//! norm, which projections carry a bias). Its layers follow from them:
//!
//! | layer | N | K | built-in graph that runs it |
//! | --- | --- | --- | --- |
//! | `qkv` | (heads + 2·kv_heads)·head_dim | hidden | the norm folded into the GEMM: `layernorm_gemm`, `rmsnorm_gemm` |
//! | `out` | hidden | heads·head_dim | the residual add: `gemm_bias_residual`, `gemm_residual` |
//! | `gate_up` (gated MLP) | intermediate | hidden | the gated pair as one GEMM: `gemm_silu_glu`, `gemm_gelu_glu` |
//! | `fc` (plain MLP) | intermediate | hidden | bias and activation: `gemm_bias_gelu`, `gemm_gelu`, `gemm_bias_relu`, … |
//! | `down` | hidden | intermediate | the residual add, as `out` |
//!
//! Two simplifications, both of which keep the baseline as strong as the
//! model's own: a q/k/v bias is left out of the `qkv` row (no built-in graph
//! has a norm, a GEMM and a bias; cuBLASLt's baseline leaves it out too),
//! and a GELU is timed in its tanh form whichever form the model uses (the
//! same cost, and cuBLASLt has a fused epilogue for that form alone).
//!
//! The file keeps each model's layers beside its config values, as data a
//! reader can check by eye; [`Corpus::parse`] derives them again and refuses
//! a file whose listed layers disagree, so the two never drift.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The corpus file: the token counts every layer runs at, and the models.
#[derive(Clone, Debug, PartialEq)]
pub struct Corpus {
    /// M values, in the file's order.
    pub tokens: Vec<u64>,
    /// The models, in the file's order.
    pub models: Vec<Model>,
}

/// One model's config values, as its published config gives them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// A short name, such as `Llama-3-8B`.
    pub name: String,
    /// Where the values come from, such as the Hugging Face repository whose
    /// config.json gives them.
    pub source: String,
    /// `hidden_size`: the width of the residual stream.
    pub hidden: u64,
    /// `intermediate_size`: the MLP's inner width.
    pub intermediate: u64,
    /// `num_attention_heads`.
    pub heads: u64,
    /// `num_key_value_heads` (as `heads` without grouped-query attention).
    pub kv_heads: u64,
    /// Each head's width.
    pub head_dim: u64,
    /// Gated or plain.
    pub mlp: Mlp,
    /// The activation as the config names it (`silu`, `gelu_new`,
    /// `gelu_pytorch_tanh`, `gelu`, `relu`).
    pub activation: String,
    /// LayerNorm or RMSNorm.
    pub norm: Norm,
    /// Whether q, k and v, the attention's output projection, and the MLP's
    /// projections carry a bias.
    pub qkv_bias: bool,
    /// Whether the attention's output projection carries a bias.
    pub out_bias: bool,
    /// Whether the MLP's projections carry a bias.
    pub mlp_bias: bool,
    /// The layers derived from the values above ([`Model::layers`]); the
    /// file lists them so that a reader sees the shapes.
    #[serde(default)]
    pub layers: Vec<Layer>,
}

/// The MLP's form.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mlp {
    /// act(x·W_gateᵀ) · (x·W_upᵀ), then the down projection (SwiGLU, GeGLU).
    Gated,
    /// act(x·W_fcᵀ + b), then the projection back (GPT-2, BERT, OPT).
    Plain,
}

/// The norm before each block.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Norm {
    /// LayerNorm (`layernorm`).
    LayerNorm,
    /// RMSNorm (`rmsnorm`).
    RmsNorm,
}

/// One linear layer: its role in the model, the built-in graph that runs it
/// with the model's epilogue, and its static N and K.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    /// Its role in the model (`qkv`, `out`, `down`, …).
    pub layer: String,
    /// The built-in graph that runs it.
    pub kernel: String,
    /// Its static N (output features).
    pub n: u64,
    /// Its static K (input features).
    pub k: u64,
}

/// One (kernel, N, K) of the corpus with the models that have it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Shape {
    /// The built-in graph that runs it.
    pub kernel: String,
    /// Its N.
    pub n: u64,
    /// Its K.
    pub k: u64,
    /// `model layer`, for each model layer with this kernel and shape.
    pub used_by: Vec<String>,
}

/// One norm of the corpus (kind and row length K, the hidden size) with
/// the models that have it: the norm before a model's q/k/v and MLP
/// projections, which a graph folds into them, and which runs standalone
/// where it cannot.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NormShape {
    /// LayerNorm or RMSNorm.
    pub norm: Norm,
    /// The row length (the hidden size).
    pub k: u64,
    /// `model`, for each model with this norm and size.
    pub used_by: Vec<String>,
}

impl Norm {
    /// The built-in graph of the standalone norm.
    pub fn kernel(self) -> &'static str {
        match self {
            Norm::LayerNorm => "layernorm",
            Norm::RmsNorm => "rmsnorm",
        }
    }
}

/// What is wrong with a corpus file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CorpusError(pub String);

impl fmt::Display for CorpusError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for CorpusError {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    tokens: Vec<u64>,
    model: Vec<Model>,
}

impl Corpus {
    /// Reads a corpus file's text. Each model's values are checked and its
    /// layers derived; a model that lists layers must list exactly those.
    pub fn parse(text: &str) -> Result<Corpus, CorpusError> {
        let file: File = toml::from_str(text).map_err(|e| CorpusError(format!("not a corpus file: {e}")))?;
        if file.tokens.is_empty() || file.tokens.contains(&0) {
            return Err(CorpusError("`tokens` must list positive token counts".into()));
        }
        let mut models = Vec::with_capacity(file.model.len());
        for mut model in file.model {
            let derived = model.derive_layers()?;
            if !model.layers.is_empty() && model.layers != derived {
                return Err(CorpusError(format!(
                    "model `{}` lists layers that its config values do not give; they give:\n{}",
                    model.name,
                    layers_toml(&derived)
                )));
            }
            model.layers = derived;
            models.push(model);
        }
        if models.is_empty() {
            return Err(CorpusError("the corpus has no [[model]]".into()));
        }
        Ok(Corpus {
            tokens: file.tokens,
            models,
        })
    }

    /// The distinct (kernel, N, K) of every model, in the order they first
    /// appear, each with the model layers that share it: what a bench times
    /// once per token count.
    pub fn shapes(&self) -> Vec<Shape> {
        let mut shapes: Vec<Shape> = Vec::new();
        for model in &self.models {
            for layer in &model.layers {
                let user = format!("{} {}", model.name, layer.layer);
                match shapes
                    .iter_mut()
                    .find(|s| s.kernel == layer.kernel && s.n == layer.n && s.k == layer.k)
                {
                    Some(shape) => shape.used_by.push(user),
                    None => shapes.push(Shape {
                        kernel: layer.kernel.clone(),
                        n: layer.n,
                        k: layer.k,
                        used_by: vec![user],
                    }),
                }
            }
        }
        shapes
    }
}

impl Corpus {
    /// The distinct norms (kind, hidden size) of the models, in the order
    /// they first appear.
    pub fn norms(&self) -> Vec<NormShape> {
        let mut norms: Vec<NormShape> = Vec::new();
        for model in &self.models {
            match norms
                .iter_mut()
                .find(|n| n.norm == model.norm && n.k == model.hidden)
            {
                Some(shape) => shape.used_by.push(model.name.clone()),
                None => norms.push(NormShape {
                    norm: model.norm,
                    k: model.hidden,
                    used_by: vec![model.name.clone()],
                }),
            }
        }
        norms
    }
}

impl Model {
    /// The model's linear layers with the built-in graph that runs each
    /// (the module's table). Refuses values no model has: a zero size,
    /// more key/value heads than heads or heads not a multiple of them, or
    /// an activation this crate has no op for.
    pub fn derive_layers(&self) -> Result<Vec<Layer>, CorpusError> {
        let bad = |what: String| CorpusError(format!("model `{}`: {what}", self.name));
        for (field, value) in [
            ("hidden", self.hidden),
            ("intermediate", self.intermediate),
            ("heads", self.heads),
            ("kv_heads", self.kv_heads),
            ("head_dim", self.head_dim),
        ] {
            if value == 0 {
                return Err(bad(format!("`{field}` is 0")));
            }
        }
        if self.kv_heads > self.heads || !self.heads.is_multiple_of(self.kv_heads) {
            return Err(bad(format!(
                "{} heads cannot share {} key/value heads",
                self.heads, self.kv_heads
            )));
        }
        let activation = crate::hf::activation(&self.activation).map_err(bad)?;
        let norm = match self.norm {
            Norm::LayerNorm => "layernorm_gemm",
            Norm::RmsNorm => "rmsnorm_gemm",
        };
        let residual = |bias: bool| {
            if bias {
                "gemm_bias_residual"
            } else {
                "gemm_residual"
            }
        };
        let layer = |layer: &str, kernel: String, n: u64, k: u64| Layer {
            layer: layer.into(),
            kernel,
            n,
            k,
        };
        // Every GELU in its tanh form (the module's comment says why).
        let activation = if activation == "gelu_erf" {
            "gelu"
        } else {
            activation
        };
        let mlp_first = match self.mlp {
            Mlp::Gated => match activation {
                "silu" | "gelu" => layer(
                    "gate_up",
                    format!("gemm_{activation}_glu"),
                    self.intermediate,
                    self.hidden,
                ),
                other => {
                    return Err(bad(format!(
                        "no gated GEMM of the built-in library has `{other}`"
                    )));
                }
            },
            Mlp::Plain => {
                let kernel = match (activation, self.mlp_bias) {
                    ("gelu" | "relu" | "silu", true) => format!("gemm_bias_{activation}"),
                    ("gelu" | "silu", false) => format!("gemm_{activation}"),
                    (other, bias) => {
                        return Err(bad(format!(
                            "no GEMM of the built-in library has `{other}` {} a bias",
                            if bias { "with" } else { "without" }
                        )));
                    }
                };
                layer("fc", kernel, self.intermediate, self.hidden)
            }
        };
        Ok(vec![
            layer(
                "qkv",
                norm.into(),
                (self.heads + 2 * self.kv_heads) * self.head_dim,
                self.hidden,
            ),
            layer(
                "out",
                residual(self.out_bias).into(),
                self.hidden,
                self.heads * self.head_dim,
            ),
            mlp_first,
            layer(
                "down",
                residual(self.mlp_bias).into(),
                self.hidden,
                self.intermediate,
            ),
        ])
    }
}

/// `layers` as the corpus file writes them.
pub fn layers_toml(layers: &[Layer]) -> String {
    let mut out = String::from("layers = [\n");
    for l in layers {
        out.push_str(&format!(
            "  {{ layer = \"{}\", kernel = \"{}\", n = {}, k = {} }},\n",
            l.layer, l.kernel, l.n, l.k
        ));
    }
    out.push(']');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: &str = r#"
tokens = [1, 77]
[[model]]
name = "Llama-3-8B"
source = "meta-llama/Meta-Llama-3-8B"
hidden = 4096
intermediate = 14336
heads = 32
kv_heads = 8
head_dim = 128
mlp = "gated"
activation = "silu"
norm = "rmsnorm"
qkv_bias = false
out_bias = false
mlp_bias = false
"#;

    #[test]
    fn a_gated_model_gives_its_four_layers() {
        let corpus = Corpus::parse(LLAMA).unwrap();
        assert_eq!(corpus.tokens, [1, 77]);
        let got: Vec<(&str, &str, u64, u64)> = corpus.models[0]
            .layers
            .iter()
            .map(|l| (l.layer.as_str(), l.kernel.as_str(), l.n, l.k))
            .collect();
        assert_eq!(
            got,
            [
                ("qkv", "rmsnorm_gemm", 6144, 4096),
                ("out", "gemm_residual", 4096, 4096),
                ("gate_up", "gemm_silu_glu", 14336, 4096),
                ("down", "gemm_residual", 4096, 14336),
            ]
        );
    }

    #[test]
    fn a_plain_mlp_with_biases_and_layernorm() {
        let text = LLAMA
            .replace("\"gated\"", "\"plain\"")
            .replace("\"silu\"", "\"gelu_new\"")
            .replace("\"rmsnorm\"", "\"layernorm\"")
            .replace("out_bias = false", "out_bias = true")
            .replace("mlp_bias = false", "mlp_bias = true");
        let layers = &Corpus::parse(&text).unwrap().models[0].layers;
        let kernels: Vec<&str> = layers.iter().map(|l| l.kernel.as_str()).collect();
        assert_eq!(
            kernels,
            [
                "layernorm_gemm",
                "gemm_bias_residual",
                "gemm_bias_gelu",
                "gemm_bias_residual"
            ]
        );
        assert_eq!(layers[2].layer, "fc");
        // An erf GELU is timed as the tanh form; ReLU without a bias has no graph.
        let erf = text.replace("\"gelu_new\"", "\"gelu\"");
        assert_eq!(
            Corpus::parse(&erf).unwrap().models[0].layers[2].kernel,
            "gemm_bias_gelu"
        );
        let relu = text
            .replace("\"gelu_new\"", "\"relu\"")
            .replace("mlp_bias = true", "mlp_bias = false");
        let e = Corpus::parse(&relu).unwrap_err();
        assert!(e.0.contains("`relu` without a bias"), "{e}");
    }

    #[test]
    fn listed_layers_must_be_the_derived_ones() {
        let good = format!(
            "{LLAMA}{}\n",
            layers_toml(&Corpus::parse(LLAMA).unwrap().models[0].layers)
        );
        assert!(Corpus::parse(&good).is_ok(), "{good}");
        let stale = good.replace("n = 6144", "n = 6000");
        let e = Corpus::parse(&stale).unwrap_err();
        assert!(e.0.contains("do not give; they give:"), "{e}");
        assert!(e.0.contains("n = 6144"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let cases = [
            (LLAMA.replace("kv_heads = 8", "kv_heads = 0"), "`kv_heads` is 0"),
            (
                LLAMA.replace("kv_heads = 8", "kv_heads = 5"),
                "32 heads cannot share 5",
            ),
            (
                LLAMA.replace("\"silu\"", "\"tanh\""),
                "activation `tanh` is not supported",
            ),
            (
                LLAMA.replace("\"silu\"", "\"relu\""),
                "no gated GEMM of the built-in library has `relu`",
            ),
            (
                LLAMA.replace("tokens = [1, 77]", "tokens = [0]"),
                "positive token counts",
            ),
            (
                LLAMA.replace("mlp_bias = false", "mlp_bias = false\nextra = 1"),
                "unknown field",
            ),
        ];
        for (text, want) in cases {
            let e = Corpus::parse(&text).unwrap_err();
            assert!(e.0.contains(want), "want {want:?}, got {e}");
        }
    }

    #[test]
    fn shared_shapes_are_timed_once() {
        let two = format!(
            "{LLAMA}{}",
            &LLAMA[LLAMA.find("[[model]]").unwrap()..].replace("Llama-3-8B", "Mistral-7B")
        );
        let corpus = Corpus::parse(&two).unwrap();
        let shapes = corpus.shapes();
        assert_eq!(shapes.len(), 4);
        assert_eq!(shapes[0].used_by, ["Llama-3-8B qkv", "Mistral-7B qkv"]);
        let norms = corpus.norms();
        assert_eq!(norms.len(), 1);
        assert_eq!((norms[0].norm.kernel(), norms[0].k), ("rmsnorm", 4096));
        assert_eq!(norms[0].used_by, ["Llama-3-8B", "Mistral-7B"]);
    }

    /// The committed corpus parses, lists the layers its values give, and
    /// spans what the schedule work must cover.
    #[test]
    fn the_committed_corpus_is_consistent_and_broad() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../benchmarks/corpus.toml");
        let text = std::fs::read_to_string(path).expect("benchmarks/corpus.toml is in the repository");
        let corpus = Corpus::parse(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert!(corpus.models.len() >= 15, "{} models", corpus.models.len());
        for model in &corpus.models {
            assert!(!model.layers.is_empty());
        }
        let hidden: Vec<u64> = corpus.models.iter().map(|m| m.hidden).collect();
        assert!(hidden.contains(&768) && hidden.contains(&8192));
        for kind in [Mlp::Gated, Mlp::Plain] {
            assert!(corpus.models.iter().any(|m| m.mlp == kind), "{kind:?}");
        }
        for norm in [Norm::LayerNorm, Norm::RmsNorm] {
            assert!(corpus.models.iter().any(|m| m.norm == norm), "{norm:?}");
        }
        for kernel in ["gemm_silu_glu", "gemm_gelu_glu", "gemm_bias_gelu"] {
            assert!(corpus.shapes().iter().any(|s| s.kernel == kernel), "{kernel}");
        }
        for m in [1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192] {
            assert!(corpus.tokens.contains(&m), "M = {m}");
        }
        assert!(corpus.tokens.iter().any(|m| !m.is_power_of_two()));
    }
}
