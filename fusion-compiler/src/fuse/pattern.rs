//! The nine named patterns of the original design, as names for particular
//! GEMM compositions, and the functions that name any GEMM composition and
//! any chain of standalone elementwise ops.
//!
//! A pattern is not a template: `gemm_bias_gelu` is the composition
//! "no prologue, epilogue [bias, gelu]", and any other composition is named
//! the same way from its parts (`gemm_silu_mul`, `layernorm_gemm_bias_gelu`).

use super::plan::{Activation, EpilogueStep, GemmComposition, NormKind};
use std::fmt;

/// The nine compositions that had their own kernels in the original design
/// (and so names users know, cuBLASLt epilogue equivalents, tuned configs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NamedPattern {
    /// `gelu(x @ w^T + b)`.
    GemmBiasGelu,
    /// `silu(x @ w^T + b)`.
    GemmBiasSilu,
    /// `relu(x @ w^T + b)`.
    GemmBiasRelu,
    /// `x @ w^T + b`.
    GemmBias,
    /// `x @ w^T + b + r`.
    GemmBiasResidual,
    /// `gelu(x @ w^T)`.
    GemmGelu,
    /// `silu(x @ w^T)`.
    GemmSilu,
    /// `layernorm(x, gamma, beta) @ w^T`.
    LayerNormGemm,
    /// `rmsnorm(x, gamma) @ w^T`.
    RmsNormGemm,
}

const GELU: EpilogueStep = EpilogueStep::Activation(Activation::GELU);
const SILU: EpilogueStep = EpilogueStep::Activation(Activation::SILU);
const RELU: EpilogueStep = EpilogueStep::Activation(Activation::RELU);

impl NamedPattern {
    /// All nine, in the order above.
    pub const ALL: [NamedPattern; 9] = [
        NamedPattern::GemmBiasGelu,
        NamedPattern::GemmBiasSilu,
        NamedPattern::GemmBiasRelu,
        NamedPattern::GemmBias,
        NamedPattern::GemmBiasResidual,
        NamedPattern::GemmGelu,
        NamedPattern::GemmSilu,
        NamedPattern::LayerNormGemm,
        NamedPattern::RmsNormGemm,
    ];

    /// The composition the pattern names: its prologue and epilogue steps
    /// (any `B` layout and any norm epsilon).
    pub fn parts(self) -> (Option<NormKind>, &'static [EpilogueStep]) {
        use EpilogueStep::{Bias, Residual};
        match self {
            NamedPattern::GemmBiasGelu => (None, &[Bias, GELU]),
            NamedPattern::GemmBiasSilu => (None, &[Bias, SILU]),
            NamedPattern::GemmBiasRelu => (None, &[Bias, RELU]),
            NamedPattern::GemmBias => (None, &[Bias]),
            NamedPattern::GemmBiasResidual => (None, &[Bias, Residual]),
            NamedPattern::GemmGelu => (None, &[GELU]),
            NamedPattern::GemmSilu => (None, &[SILU]),
            NamedPattern::LayerNormGemm => (Some(NormKind::LayerNorm), &[]),
            NamedPattern::RmsNormGemm => (Some(NormKind::RmsNorm), &[]),
        }
    }

    /// The pattern a composition is, if it is one of the nine.
    pub fn of(composition: &GemmComposition) -> Option<NamedPattern> {
        let prologue = composition.prologue.map(|p| p.kind);
        if composition.gate.is_some() {
            return None;
        }
        NamedPattern::ALL
            .into_iter()
            .find(|p| p.parts() == (prologue, composition.epilogue.as_slice()))
    }

    /// `gemm_bias_gelu`: the composed name of its parts.
    pub fn name(self) -> String {
        let (prologue, epilogue) = self.parts();
        composed_name(prologue, None, epilogue)
    }
}

impl fmt::Display for NamedPattern {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

/// `[<norm>_]gemm[_<act>_glu][_<step>]*`: the name of a GEMM composition
/// from its parts (a gated GEMM's activation, see
/// [`GemmComposition::gate`], with `glu`).
pub fn composed_name(
    prologue: Option<NormKind>,
    gate: Option<Activation>,
    epilogue: &[EpilogueStep],
) -> String {
    let mut name = String::new();
    if let Some(norm) = prologue {
        name.push_str(norm.name());
        name.push('_');
    }
    name.push_str("gemm");
    if let Some(activation) = gate {
        name.push('_');
        name.push_str(EpilogueStep::Activation(activation).name());
        name.push_str("_glu");
    }
    for step in epilogue {
        name.push('_');
        name.push_str(step.name());
    }
    name
}

/// The parts a composed name ([`composed_name`]) was made from, or `None`
/// when no composition has that name (`gemm_frobnicate`). Where step words
/// share a start (`gelu`, `gelu_erf`), the longest that fits is taken; the
/// result is checked by composing its name again.
pub fn parse_composed_name(name: &str) -> Option<(Option<NormKind>, Option<Activation>, Vec<EpilogueStep>)> {
    let prologue = [NormKind::LayerNorm, NormKind::RmsNorm]
        .into_iter()
        .find(|norm| name.starts_with(&format!("{}_gemm", norm.name())));
    let mut rest = match prologue {
        Some(norm) => &name[norm.name().len() + 1..],
        None => name,
    }
    .strip_prefix("gemm")?;
    let words: Vec<EpilogueStep> = [EpilogueStep::Bias, EpilogueStep::Residual, EpilogueStep::Mul]
        .into_iter()
        .chain(Activation::all().map(EpilogueStep::Activation))
        .collect();
    // The longest step word that `rest` starts with, as `_<word>` ending at
    // the end or at the next `_`.
    let next_step = |rest: &str| -> Option<(EpilogueStep, usize)> {
        words
            .iter()
            .filter_map(|&step| {
                let after = rest.strip_prefix('_')?.strip_prefix(step.name())?;
                (after.is_empty() || after.starts_with('_')).then_some((step, rest.len() - after.len()))
            })
            .max_by_key(|&(_, len)| len)
    };
    let mut gate = None;
    if let Some((EpilogueStep::Activation(activation), len)) = next_step(rest)
        && let Some(after) = rest[len..].strip_prefix("_glu")
        && (after.is_empty() || after.starts_with('_'))
    {
        gate = Some(activation);
        rest = after;
    }
    let mut epilogue = Vec::new();
    while !rest.is_empty() {
        let (step, len) = next_step(rest)?;
        epilogue.push(step);
        rest = &rest[len..];
    }
    (composed_name(prologue, gate, &epilogue) == name).then_some((prologue, gate, epilogue))
}

/// `<op>[_<op>]*`: the name of a chain of standalone elementwise ops, from
/// the ops' names as written in graph declarations (`silu_mul`,
/// `bias_add_gelu`), not the epilogue words of [`composed_name`]: a chain
/// of one op is then named as the op (`add`, not `residual`), as it always
/// was, and longer chains by the same rule.
pub fn elementwise_name(steps: &[EpilogueStep]) -> String {
    let names: Vec<&str> = steps.iter().map(|step| step.def().name).collect();
    names.join("_")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fuse::plan::Norm;
    use crate::ir::WeightLayout;

    #[test]
    fn the_nine_names_are_distinct_and_each_names_its_own_composition() {
        let names: Vec<String> = NamedPattern::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(
            names,
            [
                "gemm_bias_gelu",
                "gemm_bias_silu",
                "gemm_bias_relu",
                "gemm_bias",
                "gemm_bias_residual",
                "gemm_gelu",
                "gemm_silu",
                "layernorm_gemm",
                "rmsnorm_gemm"
            ]
        );
        for pattern in NamedPattern::ALL {
            let (prologue, epilogue) = pattern.parts();
            let composition = GemmComposition {
                prologue: prologue.map(|kind| Norm { kind, eps: 1e-5 }),
                b_layout: WeightLayout::NK,
                gate: None,
                epilogue: epilogue.to_vec(),
            };
            assert_eq!(NamedPattern::of(&composition), Some(pattern));
            assert_eq!(composition.name(), pattern.name());
        }
    }

    #[test]
    fn composed_names_parse_back_into_their_parts() {
        use EpilogueStep::{Bias, Mul, Residual};
        let cases: [(Option<NormKind>, Option<Activation>, Vec<EpilogueStep>); 5] = [
            (None, None, vec![]),
            (None, None, vec![Bias, GELU]),
            (
                Some(NormKind::LayerNorm),
                None,
                vec![Bias, EpilogueStep::Activation(Activation::GELU_ERF), Residual],
            ),
            (Some(NormKind::RmsNorm), Some(Activation::SILU), vec![Mul]),
            (None, Some(Activation::GELU_ERF), vec![]),
        ];
        for (prologue, gate, epilogue) in cases {
            let name = composed_name(prologue, gate, &epilogue);
            assert_eq!(
                parse_composed_name(&name),
                Some((prologue, gate, epilogue)),
                "{name}"
            );
        }
        for name in [
            "gemm_frobnicate",
            "gemmbias",
            "softmax",
            "layernorm",
            "gemm_bias_",
            "",
        ] {
            assert_eq!(parse_composed_name(name), None, "{name}");
        }
    }

    #[test]
    fn elementwise_chains_are_named_by_their_ops() {
        use EpilogueStep::{Bias, Mul, Residual};
        assert_eq!(elementwise_name(&[SILU, Mul]), "silu_mul");
        assert_eq!(elementwise_name(&[Bias, GELU]), "bias_add_gelu");
        // One op keeps the op's own name.
        for (step, name) in [
            (Residual, "add"),
            (Mul, "mul"),
            (Bias, "bias_add"),
            (SILU, "silu"),
        ] {
            assert_eq!(elementwise_name(&[step]), name);
        }
    }

    #[test]
    fn other_compositions_are_composed_names_and_not_patterns() {
        let composition = GemmComposition {
            prologue: Some(Norm {
                kind: NormKind::LayerNorm,
                eps: 1e-5,
            }),
            b_layout: WeightLayout::KN,
            gate: None,
            epilogue: vec![EpilogueStep::Bias, EpilogueStep::Activation(Activation::GELU_ERF)],
        };
        assert_eq!(composition.name(), "layernorm_gemm_bias_gelu_erf");
        assert_eq!(NamedPattern::of(&composition), None);
        let plain = GemmComposition {
            prologue: None,
            b_layout: WeightLayout::KN,
            gate: None,
            epilogue: vec![],
        };
        assert_eq!(plain.name(), "gemm");
        assert_eq!(plain.pattern(), None);
        // A gated GEMM is never one of the nine, whatever its other parts.
        let gated = GemmComposition {
            prologue: Some(Norm {
                kind: NormKind::RmsNorm,
                eps: 1e-6,
            }),
            b_layout: WeightLayout::NK,
            gate: Some(Activation::SILU),
            epilogue: vec![],
        };
        assert_eq!(gated.name(), "rmsnorm_gemm_silu_glu");
        assert_eq!(gated.pattern(), None);
    }
}
