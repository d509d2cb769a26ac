//! The op table: one row per op a graph may use, and everything the rest of
//! the compiler knows about it: its name in graph declarations, its operands
//! and keyword arguments, the epilogue step it becomes in a fused kernel (with
//! that step's CUDA type) and the formula the CPU reference computes it with.
//!
//! The parser's function table, the builder, the matcher, the code generator
//! and the reference all read these rows, so an op's name and formula are
//! written here and nowhere else. A new activation is one row here (and its
//! entry in [`OPS`]) plus one step struct in
//! `kernels/include/fusion/epilogue.cuh`.
//!
//! Not here: shape and dtype rules (the builder) and how a row becomes an
//! [`OpKind`](super::OpKind) with its parameters (the `eps` of a norm, the
//! weight layout of a matmul).

use std::fmt;
use std::hash::{Hash, Hasher};

/// One op.
#[derive(Debug)]
pub struct OpDef {
    /// As written in graph declarations: `silu(x)`.
    pub name: &'static str,
    /// Positional operands.
    pub arity: usize,
    /// Keyword arguments, each optional.
    pub keywords: &'static [Keyword],
    /// What kind of computation it is.
    pub form: OpForm,
    /// How the CPU reference computes it.
    pub reference: Formula,
}

/// A keyword argument, such as a norm's `eps`.
#[derive(Debug)]
pub struct Keyword {
    /// As written in a call: `eps`.
    pub name: &'static str,
    /// Used when the call leaves it out.
    pub default: f64,
    /// The values it accepts, in words: "a positive number".
    pub allowed: &'static str,
    /// Whether a value is one of those [`Keyword::allowed`] describes.
    pub accepts: fn(f64) -> bool,
}

/// What kind of computation an op is, as the matcher sees it.
#[derive(Debug)]
pub enum OpForm {
    /// A matrix product: the mainloop of a fused GEMM.
    MatMul,
    /// A row normalisation with scale and shift: a GEMM's prologue.
    LayerNorm,
    /// A row normalisation with scale only: a GEMM's prologue.
    RmsNorm,
    /// Elementwise: a step of a GEMM's epilogue, or a standalone kernel.
    Step(StepDef),
}

/// What an elementwise op is in an epilogue chain.
#[derive(Debug)]
pub struct StepDef {
    /// Which operand, if any, it reads besides the accumulator.
    pub kind: StepKind,
    /// The word it adds to a composed kernel name (`bias` in
    /// `gemm_bias_gelu`); tuned tables and launcher symbols are keyed by
    /// these names.
    pub word: &'static str,
    /// The step's type in `kernels/include/fusion/epilogue.cuh`.
    pub cuda_type: &'static str,
}

/// Which operand, if any, an epilogue step reads besides the accumulator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum StepKind {
    /// `[x, bias]`: reads a `[N]` row, added to every row.
    Bias,
    /// `[a, b]`: reads a tensor of the accumulator's shape and adds it.
    Residual,
    /// `[a, b]`: reads a tensor of the accumulator's shape and multiplies by it.
    Mul,
    /// `[x]`: a function of each value alone; reads nothing.
    Activation,
}

/// How the CPU reference computes an op.
#[derive(Debug)]
pub enum Formula {
    /// A routine of its own in `reference::kernels`, which needs the op's
    /// shapes or parameters (matmul, the norms, the bias add's broadcast).
    Routine,
    /// Of the two operands' values at the same index.
    Binary(fn(f64, f64) -> f64),
    /// Of each value alone.
    Unary(fn(f64) -> f64),
}

impl OpDef {
    /// The epilogue step it becomes, for elementwise ops.
    pub fn step(&self) -> Option<&StepDef> {
        match &self.form {
            OpForm::Step(step) => Some(step),
            OpForm::MatMul | OpForm::LayerNorm | OpForm::RmsNorm => None,
        }
    }
}

/// A norm's epsilon: added to the variance (or mean square) under the root.
const fn eps(default: f64) -> Keyword {
    Keyword {
        name: "eps",
        default,
        allowed: "a positive number",
        accepts: |v| v > 0.0 && v.is_finite(),
    }
}

/// `matmul(a, b)`, `a @ b`: a matrix product, the mainloop of a fused GEMM.
pub const MATMUL: OpDef = OpDef {
    name: "matmul",
    arity: 2,
    keywords: &[],
    form: OpForm::MatMul,
    reference: Formula::Routine,
};

/// The row of an elementwise op: an epilogue step.
const fn step(
    name: &'static str,
    arity: usize,
    kind: StepKind,
    word: &'static str,
    cuda_type: &'static str,
    reference: Formula,
) -> OpDef {
    OpDef {
        name,
        arity,
        keywords: &[],
        form: OpForm::Step(StepDef {
            kind,
            word,
            cuda_type,
        }),
        reference,
    }
}

/// `add(a, b)`, `a + b` of two tensors of one shape: a residual add in an epilogue.
pub const ADD: OpDef = step(
    "add",
    2,
    StepKind::Residual,
    "residual",
    "fusion::Residual",
    Formula::Binary(|a, b| a + b),
);

/// `mul(a, b)`, `a * b`: an elementwise product (SwiGLU's gate times up).
pub const MUL: OpDef = step(
    "mul",
    2,
    StepKind::Mul,
    "mul",
    "fusion::Mul",
    Formula::Binary(|a, b| a * b),
);

/// `bias_add(x, b)`, `x + b` with `b` a row vector `[N]`: a bias added to every row.
pub const BIAS_ADD: OpDef = step(
    "bias_add",
    2,
    StepKind::Bias,
    "bias",
    "fusion::Bias",
    Formula::Routine,
);

/// An activation's row: its name is also its word in composed names.
const fn activation(name: &'static str, cuda_type: &'static str, formula: fn(f64) -> f64) -> OpDef {
    step(
        name,
        1,
        StepKind::Activation,
        name,
        cuda_type,
        Formula::Unary(formula),
    )
}

/// `gelu(x)`: GELU, tanh approximation.
pub const GELU: OpDef = activation("gelu", "fusion::Gelu", gelu_tanh);
/// `gelu_erf(x)`: GELU, exact (erf).
pub const GELU_ERF: OpDef = activation("gelu_erf", "fusion::GeluErf", gelu_erf);
/// `silu(x)`: x·sigmoid(x).
pub const SILU: OpDef = activation("silu", "fusion::Silu", silu);
/// `relu(x)`: max(x, 0).
pub const RELU: OpDef = activation("relu", "fusion::Relu", relu);
/// `sigmoid(x)`: 1/(1 + e^−x).
pub const SIGMOID: OpDef = activation("sigmoid", "fusion::Sigmoid", sigmoid);
/// `gelu_quick(x)`: CLIP's quick GELU, x·sigmoid(1.702·x).
pub const GELU_QUICK: OpDef = activation("gelu_quick", "fusion::GeluQuick", gelu_quick);

/// A row normalisation's row.
const fn norm(name: &'static str, arity: usize, keywords: &'static [Keyword], form: OpForm) -> OpDef {
    OpDef {
        name,
        arity,
        keywords,
        form,
        reference: Formula::Routine,
    }
}

/// LayerNorm's default epsilon is PyTorch's; RMSNorm's is Llama's.
const LAYERNORM_KEYWORDS: &[Keyword] = &[eps(1e-5)];
const RMSNORM_KEYWORDS: &[Keyword] = &[eps(1e-6)];

/// `layernorm(x, gamma, beta, eps = 1e-5)`: LayerNorm over each row.
pub const LAYERNORM: OpDef = norm("layernorm", 3, LAYERNORM_KEYWORDS, OpForm::LayerNorm);
/// `rmsnorm(x, gamma, eps = 1e-6)`: RMSNorm over each row.
pub const RMSNORM: OpDef = norm("rmsnorm", 2, RMSNORM_KEYWORDS, OpForm::RmsNorm);

/// Every op, in the order error notes list them.
pub const OPS: &[&OpDef] = &[
    &MATMUL,
    &ADD,
    &MUL,
    &BIAS_ADD,
    &GELU,
    &GELU_ERF,
    &SILU,
    &RELU,
    &SIGMOID,
    &GELU_QUICK,
    &LAYERNORM,
    &RMSNORM,
];

/// The op written `name` in graph declarations.
pub fn op_named(name: &str) -> Option<&'static OpDef> {
    OPS.iter().copied().find(|op| op.name == name)
}

/// An activation: a row of [`OPS`] whose epilogue step is
/// [`StepKind::Activation`]. Two are equal when they are the same row
/// (names are unique).
#[derive(Clone, Copy)]
pub struct Activation(&'static OpDef);

impl Activation {
    /// [`GELU`]'s row as an activation.
    pub const GELU: Activation = Activation(&GELU);
    /// [`GELU_ERF`]'s row as an activation.
    pub const GELU_ERF: Activation = Activation(&GELU_ERF);
    /// [`SILU`]'s row as an activation.
    pub const SILU: Activation = Activation(&SILU);
    /// [`RELU`]'s row as an activation.
    pub const RELU: Activation = Activation(&RELU);

    /// The activation a row is, if it is one.
    pub fn of(op: &'static OpDef) -> Option<Activation> {
        matches!(op.step(), Some(step) if step.kind == StepKind::Activation).then_some(Activation(op))
    }

    /// The activation written `name` in graph declarations.
    pub fn named(name: &str) -> Option<Activation> {
        op_named(name).and_then(Activation::of)
    }

    /// Every activation, in table order.
    pub fn all() -> impl Iterator<Item = Activation> {
        OPS.iter().copied().filter_map(Activation::of)
    }

    /// Its row of the op table.
    pub fn def(self) -> &'static OpDef {
        self.0
    }

    /// As written in graph declarations, and in composed kernel names.
    pub fn name(self) -> &'static str {
        self.0.name
    }

    /// Its step type in `epilogue.cuh`: `fusion::Silu`.
    pub fn cuda_type(self) -> &'static str {
        self.0
            .step()
            .expect("an activation is an epilogue step")
            .cuda_type
    }

    /// The function the CPU reference applies to each value.
    pub fn formula(self) -> fn(f64) -> f64 {
        match self.0.reference {
            Formula::Unary(f) => f,
            Formula::Binary(_) | Formula::Routine => {
                unreachable!("activation `{}` has no unary formula", self.0.name)
            }
        }
    }
}

impl PartialEq for Activation {
    fn eq(&self, other: &Activation) -> bool {
        self.name() == other.name()
    }
}

impl Eq for Activation {}

impl Hash for Activation {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.name().hash(state);
    }
}

impl fmt::Debug for Activation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Activation({})", self.name())
    }
}

// The activations' formulas, in f64. Where one is rewritten to avoid
// cancellation, its comment gives the identity.

/// GELU, exact form: `0.5·x·(1 + erf(x/√2))`.
pub fn gelu_erf(x: f64) -> f64 {
    // 1 + erf(z) = erfc(−z); erfc keeps full precision where 1 + erf(z)
    // cancels (large negative x).
    0.5 * x * libm::erfc(-x / std::f64::consts::SQRT_2)
}

/// GELU, tanh approximation: `0.5·x·(1 + tanh(u))` with
/// `u = √(2/π)·(x + 0.044715·x³)`.
pub fn gelu_tanh(x: f64) -> f64 {
    // 1 + tanh(u) = 2/(1 + e^(−2u)), so 0.5·x·(1 + tanh(u)) = x/(1 + e^(−2u)),
    // which does not cancel for large negative x.
    let sqrt_2_over_pi = (2.0 / std::f64::consts::PI).sqrt();
    let u = sqrt_2_over_pi * (x + 0.044715 * x * x * x);
    x / (1.0 + (-2.0 * u).exp())
}

/// SiLU: `x/(1 + e^(−x))`.
pub fn silu(x: f64) -> f64 {
    x / (1.0 + (-x).exp())
}

/// The logistic sigmoid: `1/(1 + e^(−x))`. As in PyTorch, NaN stays NaN,
/// +∞ gives 1 and −∞ gives 0.
pub fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// CLIP's "quick GELU": `x·sigmoid(1.702·x)`, written `x/(1 + e^(−1.702·x))`
/// like SiLU. As PyTorch's `x * torch.sigmoid(1.702 * x)`: NaN stays NaN,
/// +∞ gives +∞ and −∞ gives NaN (−∞ · 0).
pub fn gelu_quick(x: f64) -> f64 {
    x / (1.0 + (-1.702 * x).exp())
}

/// ReLU: max(x, 0), passing NaN through (`f64::max` would turn it into 0 and
/// hide it from the comparison).
pub fn relu(x: f64) -> f64 {
    if x < 0.0 { 0.0 } else { x }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_every_row_is_consistent() {
        for (i, op) in OPS.iter().enumerate() {
            assert!(
                OPS[..i].iter().all(|other| other.name != op.name),
                "`{}` is in the table twice",
                op.name
            );
            match (&op.form, &op.reference) {
                (OpForm::Step(step), Formula::Unary(_)) => {
                    assert_eq!(step.kind, StepKind::Activation, "{}", op.name);
                    assert_eq!((op.arity, step.word), (1, op.name));
                }
                (OpForm::Step(step), Formula::Binary(_)) => {
                    assert!(
                        matches!(step.kind, StepKind::Residual | StepKind::Mul),
                        "{}",
                        op.name
                    );
                    assert_eq!(op.arity, 2);
                }
                (OpForm::Step(step), Formula::Routine) => assert_eq!(step.kind, StepKind::Bias),
                (_, formula) => assert!(matches!(formula, Formula::Routine), "{}", op.name),
            }
            if let Some(step) = op.step() {
                assert!(step.cuda_type.starts_with("fusion::"), "{}", op.name);
            }
        }
    }

    #[test]
    fn the_readme_lists_every_op() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../README.md");
        let readme = std::fs::read_to_string(path).unwrap();
        // From its heading to the next one.
        let start = readme
            .find("### Expressions")
            .expect("README has an Expressions section");
        let section = &readme[start..];
        let section = &section[..section[1..].find("\n#").map_or(section.len(), |end| end + 1)];
        for op in OPS {
            assert!(
                section.contains(&format!("`{}(", op.name)),
                "README.md's Expressions table does not list `{}`",
                op.name
            );
        }
    }

    #[test]
    fn activations_are_found_by_name_and_only_activations() {
        let names: Vec<&str> = Activation::all().map(Activation::name).collect();
        assert_eq!(
            names,
            ["gelu", "gelu_erf", "silu", "relu", "sigmoid", "gelu_quick"]
        );
        assert_eq!(Activation::named("silu"), Some(Activation::SILU));
        assert_eq!(Activation::named("add"), None);
        assert_eq!(Activation::named("softplus"), None);
        assert_eq!(Activation::GELU_ERF.cuda_type(), "fusion::GeluErf");
    }

    #[test]
    fn norm_epsilons_accept_positive_numbers_only() {
        for op in [&LAYERNORM, &RMSNORM] {
            let eps = &op.keywords[0];
            assert!((eps.accepts)(eps.default));
            for bad in [0.0, -1e-5, f64::NAN, f64::INFINITY] {
                assert!(!(eps.accepts)(bad), "{} accepts eps = {bad}", op.name);
            }
        }
    }

    #[test]
    fn rewritten_gelus_equal_their_definitions() {
        let c = (2.0 / std::f64::consts::PI).sqrt();
        for i in -40..=40 {
            let x = i as f64 / 8.0;
            let tanh_form = 0.5 * x * (1.0 + (c * (x + 0.044715 * x * x * x)).tanh());
            assert!((gelu_tanh(x) - tanh_form).abs() < 1e-15, "gelu_tanh({x})");
            let erf_form = 0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2));
            assert!((gelu_erf(x) - erf_form).abs() < 1e-15, "gelu_erf({x})");
        }
    }

    #[test]
    fn sigmoid_and_gelu_quick_equal_their_tanh_forms() {
        // σ(x) = 0.5 + 0.5·tanh(x/2): the form the CUDA steps compute.
        for i in -80..=80 {
            let x = i as f64 / 8.0;
            let tanh_sigmoid = |z: f64| 0.5 + 0.5 * (0.5 * z).tanh();
            assert!((sigmoid(x) - tanh_sigmoid(x)).abs() < 1e-15, "sigmoid({x})");
            let quick = x * tanh_sigmoid(1.702 * x);
            assert!((gelu_quick(x) - quick).abs() < 1e-14, "gelu_quick({x})");
        }
        // By hand: σ(0) = 1/2; σ(2) = 1/(1 + e^−2) = 1/1.1353352832 = 0.8807970780;
        // gelu_quick(1) = σ(1.702) = 1/(1 + e^−1.702) = 1/1.1823185221 = 0.8457957659.
        assert_eq!(sigmoid(0.0), 0.5);
        assert!((sigmoid(2.0) - 0.8807970780).abs() < 1e-10);
        assert!((sigmoid(-2.0) - (1.0 - 0.8807970780)).abs() < 1e-10);
        assert!((gelu_quick(1.0) - 0.8457957659).abs() < 1e-10);
        assert_eq!(gelu_quick(0.0), 0.0);
    }

    #[test]
    fn sigmoid_and_gelu_quick_treat_nan_and_infinities_as_pytorch_does() {
        assert!(sigmoid(f64::NAN).is_nan());
        assert_eq!(sigmoid(f64::INFINITY), 1.0);
        assert_eq!(sigmoid(f64::NEG_INFINITY), 0.0);
        // Far out, where e^−x overflows: the limits, not NaN.
        assert_eq!(sigmoid(-1000.0), 0.0);
        assert_eq!(sigmoid(1000.0), 1.0);
        assert!(gelu_quick(f64::NAN).is_nan());
        assert_eq!(gelu_quick(f64::INFINITY), f64::INFINITY);
        assert!(gelu_quick(f64::NEG_INFINITY).is_nan());
        assert_eq!(gelu_quick(-1000.0), 0.0);
        assert_eq!(gelu_quick(1000.0), 1000.0);
    }

    #[test]
    fn relu_keeps_nan() {
        assert!(relu(f64::NAN).is_nan());
        assert_eq!(relu(-2.0), 0.0);
        assert_eq!(relu(3.5), 3.5);
    }
}
