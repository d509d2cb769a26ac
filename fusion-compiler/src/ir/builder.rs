//! [`GraphBuilder`]: the programmatic way to make a [`Graph`], and the one
//! place where shapes and dtypes are inferred and checked.

use super::*;
use crate::diagnostic::{Diagnostic, Diagnostics};
use std::collections::HashMap;

/// Largest static dim: kernels index one axis with 32-bit integers.
pub const MAX_DIM: u64 = i32::MAX as u64;

/// Words that cannot name a graph, dim or tensor: the names become Rust and C
/// identifiers in generated code. Besides keywords: `stream` (every wrapper's
/// first parameter) and the prelude's `Some`, `None`, `Ok`, `Err` (a
/// parameter by that name would be read as a pattern).
const RESERVED: &[&str] = &[
    "as", "async", "await", "break", "const", "continue", "crate", "dyn", "else", "enum", "extern", "false",
    "fn", "for", "if", "impl", "in", "let", "loop", "match", "mod", "move", "mut", "pub", "ref", "return",
    "self", "Self", "static", "struct", "super", "trait", "true", "type", "unsafe", "use", "where", "while",
    "abstract", "become", "box", "do", "final", "macro", "override", "priv", "typeof", "unsized", "virtual",
    "yield", "try", "gen", "int", "float", "double", "char", "void", "long", "short", "signed", "unsigned",
    "auto", "register", "volatile", "sizeof", "switch", "case", "default", "goto", "union", "typedef",
    "stream", "Some", "None", "Ok", "Err",
];

/// The element type of a matmul of two FP8 operands: the dtype of the
/// unquantized tensors of Hugging Face FP8 checkpoints. (An FP8 GEMM
/// accumulates in f32; writing its output as f16, or as FP8 with a scale for
/// the next GEMM, needs a way to declare a computed tensor's type, which the
/// graph language does not have yet.)
pub const FP8_MATMUL_OUTPUT: DType = DType::BF16;

/// The prefix of the names generated wrappers declare beside a graph's
/// tensor names (`__call`, `__ptr_0`, `__GRAPH`), refused in a user's names
/// so the two can never collide.
pub const GENERATED_PREFIX: &str = "__";

/// Builds a [`Graph`] op by op, checking each op's operands as it is added.
///
/// ```
/// use fusion_compiler::ir::{DType, GraphBuilder, WeightLayout};
/// let mut b = GraphBuilder::new("mlp");
/// let m = b.dynamic_dim("M").unwrap();
/// let d = b.static_dim("D", 64).unwrap();
/// let x = b.input("x", DType::F16, &[m, d]).unwrap();
/// let w = b.weight("w", DType::F16, &[d, d]).unwrap();
/// let h = b.matmul(x, w, WeightLayout::NK).unwrap();
/// let y = b.gelu(h).unwrap();
/// b.output("y", y).unwrap();
/// let graph = b.build().unwrap();
/// assert_eq!(graph.ops.len(), 2);
/// ```
#[derive(Debug)]
pub struct GraphBuilder {
    graph: Graph,
    names: HashMap<String, Span>,
    /// Span given to the next op or declaration (see [`GraphBuilder::at`]).
    span: Span,
    auto_names: usize,
    /// Where the graph's name was written, for errors about it.
    name_span: Span,
}

impl GraphBuilder {
    /// An empty graph named `name`.
    pub fn new(name: impl Into<String>) -> GraphBuilder {
        GraphBuilder {
            graph: Graph {
                name: name.into(),
                doc: None,
                dims: Vec::new(),
                tensors: Vec::new(),
                ops: Vec::new(),
                inputs: Vec::new(),
                weights: Vec::new(),
                outputs: Vec::new(),
            },
            names: HashMap::new(),
            span: Span::None,
            auto_names: 0,
            name_span: Span::None,
        }
    }

    /// Records where the graph's name was written (front ends call this).
    pub fn name_span(&mut self, span: Span) -> &mut Self {
        self.name_span = span;
        self
    }

    /// Sets the graph's documentation.
    pub fn doc(&mut self, doc: impl Into<String>) -> &mut Self {
        self.graph.doc = Some(doc.into());
        self
    }

    /// Sets the source span recorded with (and reported for) the next
    /// declaration or op. Front ends call this; programmatic users need not.
    pub fn at(&mut self, span: Span) -> &mut Self {
        self.span = span;
        self
    }

    /// A tensor declared or computed so far.
    pub fn tensor(&self, t: TensorId) -> &TensorDesc {
        self.graph.tensor(t)
    }

    fn take_span(&mut self) -> Span {
        std::mem::take(&mut self.span)
    }

    fn error(&self, span: Span, message: impl Into<String>) -> Diagnostic {
        Diagnostic::new(span, message)
    }

    fn check_name(&self, name: &str, what: &str, span: Span) -> Result<(), Diagnostic> {
        let mut chars = name.chars();
        let valid = chars.next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(self.error(
                span,
                format!("`{name}` is not a valid {what} name: use letters, digits and `_`, not starting with a digit"),
            ));
        }
        if name.starts_with(GENERATED_PREFIX) {
            return Err(self.error(
                span,
                format!(
                    "`{name}` cannot name a {what}: names starting with `{GENERATED_PREFIX}` are kept for the code fusion generates"
                ),
            ));
        }
        if RESERVED.contains(&name) {
            return Err(self.error(
                span,
                format!(
                    "`{name}` cannot name a {what}: it is a reserved word in the generated Rust or C code"
                ),
            ));
        }
        Ok(())
    }

    fn claim_name(&mut self, name: &str, what: &str, span: Span) -> Result<(), Diagnostic> {
        self.check_name(name, what, span)?;
        if let Some(&first) = self.names.get(name) {
            return Err(self
                .error(span, format!("`{name}` is defined twice"))
                .with_label(first, "first defined"));
        }
        self.names.insert(name.to_string(), span);
        Ok(())
    }

    /// A dim whose size is known at compile time.
    pub fn static_dim(&mut self, name: &str, size: u64) -> Result<Extent, Diagnostic> {
        let span = self.take_span();
        self.claim_name(name, "dim", span)?;
        if size == 0 {
            return Err(self.error(span, format!("dim `{name}` is 0: a dim must be at least 1")));
        }
        if size > MAX_DIM {
            return Err(self.error(
                span,
                format!("dim `{name}` = {size} is too large: the most is {MAX_DIM} (2^31 - 1)"),
            ));
        }
        self.graph.dims.push(DimDef {
            name: name.to_string(),
            size: Some(size),
            span,
        });
        Ok(Extent::Static(size))
    }

    /// A dim read from the inputs at run time (the token count M).
    pub fn dynamic_dim(&mut self, name: &str) -> Result<Extent, Diagnostic> {
        let span = self.take_span();
        self.claim_name(name, "dim", span)?;
        self.graph.dims.push(DimDef {
            name: name.to_string(),
            size: None,
            span,
        });
        Ok(Extent::Dynamic(DimId(self.graph.dims.len() - 1)))
    }

    fn declare(
        &mut self,
        name: &str,
        dtype: DType,
        shape: &[Extent],
        kind: TensorKind,
    ) -> Result<TensorId, Diagnostic> {
        let span = self.take_span();
        self.claim_name(name, "tensor", span)?;
        if shape.is_empty() || shape.len() > 2 {
            return Err(self.error(
                span,
                format!("`{name}` has rank {}: tensors have one or two dims", shape.len()),
            ));
        }
        let id = self.push_tensor(name.to_string(), dtype, shape.to_vec(), kind, span);
        match kind {
            TensorKind::Input => self.graph.inputs.push(id),
            _ => self.graph.weights.push(id),
        }
        Ok(id)
    }

    fn push_tensor(
        &mut self,
        name: String,
        dtype: DType,
        shape: Vec<Extent>,
        kind: TensorKind,
        span: Span,
    ) -> TensorId {
        self.graph.tensors.push(TensorDesc {
            name,
            dtype,
            shape,
            kind,
            scale: None,
            span,
        });
        TensorId(self.graph.tensors.len() - 1)
    }

    /// An activation fed on every run.
    pub fn input(&mut self, name: &str, dtype: DType, shape: &[Extent]) -> Result<TensorId, Diagnostic> {
        self.declare(name, dtype, shape, TensorKind::Input)
    }

    /// A parameter bound once.
    pub fn weight(&mut self, name: &str, dtype: DType, shape: &[Extent]) -> Result<TensorId, Diagnostic> {
        self.declare(name, dtype, shape, TensorKind::Weight)
    }

    /// Declares `scale` as the scale of the FP8 tensor `t`: `t`'s value is
    /// its stored value times the scale. Both are declared tensors; the
    /// scale is f32, `[1]` (one for the whole tensor) or, for a weight,
    /// `[N]` (one per output channel, checked when a matmul reads it).
    /// These are the layouts of Hugging Face FP8 checkpoints: a
    /// `weight_scale` beside each weight, an `input_scale` for a static
    /// activation scale. Give the scale before the ops that read `t`.
    pub fn scale(&mut self, t: TensorId, scale: TensorId) -> Result<(), Diagnostic> {
        let span = self.take_span();
        let (desc, scale_desc) = (&self.graph.tensors[t.0], &self.graph.tensors[scale.0]);
        let declared = |kind| matches!(kind, TensorKind::Input | TensorKind::Weight);
        if !desc.dtype.is_fp8() {
            return Err(self.error(
                span,
                format!(
                    "{} takes no scale: only f8e4m3 tensors have one",
                    self.describe(t)
                ),
            ));
        }
        if let Some(first) = desc.scale {
            return Err(self.error(
                span,
                format!(
                    "`{}` already has the scale `{}`",
                    desc.name, self.graph.tensors[first.0].name
                ),
            ));
        }
        if !declared(desc.kind) || !declared(scale_desc.kind) {
            let computed = if declared(desc.kind) { scale } else { t };
            return Err(self.error(
                span,
                format!(
                    "{} is computed: an FP8 tensor and its scale are declared inputs or weights",
                    self.describe(computed)
                ),
            ));
        }
        let rows_of_weight = |e: &Extent| desc.kind == TensorKind::Weight && desc.shape.contains(e);
        let shape_fits = match scale_desc.shape[..] {
            [Extent::Static(1)] => true,
            [ref n] => rows_of_weight(n),
            _ => false,
        };
        if scale_desc.dtype != DType::F32 || !shape_fits {
            let allowed = match desc.kind {
                TensorKind::Weight => {
                    "f32[1] (one scale for the whole weight) or f32[N] (one per output channel)"
                }
                _ => "f32[1] (one scale for the whole activation)",
            };
            return Err(self.error(
                span,
                format!(
                    "the scale of {} is {}: it must be {allowed}",
                    self.describe(t),
                    self.describe(scale)
                ),
            ));
        }
        self.graph.tensors[t.0].scale = Some(scale);
        Ok(())
    }

    /// Names a computed tensor (otherwise it gets a generated `%N` name).
    pub fn name(&mut self, t: TensorId, name: &str) -> Result<(), Diagnostic> {
        let span = self.take_span();
        if self.graph.tensors[t.0].kind != TensorKind::Intermediate {
            return Err(self.error(span, format!("`{name}` would rename a declared tensor")));
        }
        self.claim_name(name, "tensor", span)?;
        self.graph.tensors[t.0].name = name.to_string();
        Ok(())
    }

    /// Marks a computed tensor as a graph output and names it.
    pub fn output(&mut self, name: &str, t: TensorId) -> Result<(), Diagnostic> {
        let span = self.span;
        match self.graph.tensors[t.0].kind {
            TensorKind::Input | TensorKind::Weight => {
                let source = self.graph.tensors[t.0].name.clone();
                self.take_span();
                return Err(self.error(
                    span,
                    format!("output `{name}` is the declared tensor `{source}`: an output must be computed"),
                ));
            }
            TensorKind::Output => {
                self.take_span();
                return Err(self.error(
                    span,
                    format!(
                        "output `{name}` is already the output `{}`",
                        self.graph.tensors[t.0].name
                    ),
                ));
            }
            TensorKind::Intermediate => {}
        }
        self.name(t, name)?;
        self.graph.tensors[t.0].kind = TensorKind::Output;
        self.graph.outputs.push(t);
        Ok(())
    }

    fn describe(&self, t: TensorId) -> String {
        format!(
            "`{}`: {}",
            self.graph.tensors[t.0].name,
            self.graph.type_string(t)
        )
    }

    /// Refuses FP8 operands of an op other than matmul.
    fn no_fp8(&self, op: &str, ts: &[TensorId], span: Span) -> Result<(), Diagnostic> {
        match ts.iter().find(|t| self.graph.tensors[t.0].dtype.is_fp8()) {
            Some(&t) => Err(self.error(
                span,
                format!(
                    "{} cannot be an operand of {op}: only a matmul reads f8e4m3 tensors (it multiplies them by their scales)",
                    self.describe(t)
                ),
            )),
            None => Ok(()),
        }
    }

    /// The checks of a matmul's FP8 operands: both FP8, each with its
    /// scale, A's one value, B's one value or one per output column (`n`).
    fn check_fp8_matmul(&self, a: TensorId, b: TensorId, n: Extent, span: Span) -> Result<(), Diagnostic> {
        let op = ops::MATMUL.name;
        if !(self.graph.tensors[a.0].dtype.is_fp8() && self.graph.tensors[b.0].dtype.is_fp8()) {
            return Err(self.error(
                span,
                format!(
                    "dtype mismatch in {op}: {} and {}: both operands of an FP8 matmul are f8e4m3, each with its scale",
                    self.describe(a),
                    self.describe(b)
                ),
            ));
        }
        for (t, role) in [(a, "left"), (b, "right")] {
            let desc = &self.graph.tensors[t.0];
            // Only a matmul reads an FP8 tensor, so this is where a missing
            // scale shows.
            let Some(scale) = desc.scale else {
                return Err(self
                    .error(
                        span,
                        format!(
                            "`{}` is f8e4m3 but has no scale: name its f32 scale tensor in its type, `{}[{}] scale {}_scale`",
                            desc.name,
                            desc.dtype,
                            self.graph.shape_string(&desc.shape),
                            desc.name
                        ),
                    )
                    .with_label(desc.span, "declared here"));
            };
            let per_column = role == "right" && self.shape(scale) == [n];
            if self.shape(scale) != [Extent::Static(1)] && !per_column {
                let allowed = if role == "left" {
                    "[1]: the left operand's rows are tokens, scaled per tensor".to_string()
                } else {
                    format!(
                        "[1] or [{}], one per output column",
                        self.graph.shape_string(&[n])
                    )
                };
                return Err(self.error(
                    span,
                    format!(
                        "the scale of {op}'s {role} operand `{}` is {}: it must be {allowed}",
                        desc.name,
                        self.describe(scale)
                    ),
                ));
            }
        }
        Ok(())
    }

    fn same_dtype(&self, op: &str, ts: &[TensorId], span: Span) -> Result<DType, Diagnostic> {
        let first = self.graph.tensors[ts[0].0].dtype;
        for &t in &ts[1..] {
            if self.graph.tensors[t.0].dtype != first {
                return Err(self.error(
                    span,
                    format!(
                        "dtype mismatch in {op}: {} and {}",
                        self.describe(ts[0]),
                        self.describe(t)
                    ),
                ));
            }
        }
        Ok(first)
    }

    fn push_op(
        &mut self,
        kind: OpKind,
        inputs: Vec<TensorId>,
        shape: Vec<Extent>,
        dtype: DType,
        span: Span,
    ) -> TensorId {
        self.auto_names += 1;
        let out = self.push_tensor(
            format!("%{}", self.auto_names),
            dtype,
            shape,
            TensorKind::Intermediate,
            span,
        );
        self.graph.ops.push(Op {
            kind,
            inputs,
            output: out,
            span,
        });
        out
    }

    fn shape(&self, t: TensorId) -> &[Extent] {
        &self.graph.tensors[t.0].shape
    }

    /// `a @ b` (`b_layout` KN) or `a @ b^T` (NK).
    pub fn matmul(
        &mut self,
        a: TensorId,
        b: TensorId,
        b_layout: WeightLayout,
    ) -> Result<TensorId, Diagnostic> {
        let span = self.take_span();
        let op = ops::MATMUL.name;
        let fp8 = self.graph.tensors[a.0].dtype.is_fp8() || self.graph.tensors[b.0].dtype.is_fp8();
        let dtype = if fp8 {
            FP8_MATMUL_OUTPUT
        } else {
            self.same_dtype(op, &[a, b], span)?
        };
        let (sa, sb) = (self.shape(a).to_vec(), self.shape(b).to_vec());
        if sa.len() != 2 || sb.len() != 2 {
            let bad = if sa.len() != 2 { a } else { b };
            return Err(self.error(
                span,
                format!("{op} needs two matrices; {} is not", self.describe(bad)),
            ));
        }
        let (k_b, n) = match b_layout {
            WeightLayout::KN => (sb[0], sb[1]),
            WeightLayout::NK => (sb[1], sb[0]),
        };
        if sa[1] != k_b {
            let how = match b_layout {
                WeightLayout::KN => "rows of the right operand",
                WeightLayout::NK => "columns of the right operand (it is read transposed)",
            };
            return Err(self.error(
                span,
                format!(
                    "shape mismatch in {op}: {} has {} columns but {} has {} {how}",
                    self.describe(a),
                    self.graph.shape_string(&sa[1..]),
                    self.describe(b),
                    self.graph.shape_string(&[k_b]),
                ),
            ));
        }
        if fp8 {
            self.check_fp8_matmul(a, b, n, span)?;
        }
        Ok(self.push_op(
            OpKind::MatMul { b_layout },
            vec![a, b],
            vec![sa[0], n],
            dtype,
            span,
        ))
    }

    /// `x + bias`, bias a row vector as long as x's rows.
    pub fn bias_add(&mut self, x: TensorId, bias: TensorId) -> Result<TensorId, Diagnostic> {
        let span = self.take_span();
        self.no_fp8("bias add", &[x, bias], span)?;
        let dtype = self.same_dtype("bias add", &[x, bias], span)?;
        let (sx, sb) = (self.shape(x).to_vec(), self.shape(bias).to_vec());
        if sb.len() != 1 || sx.last() != sb.last() {
            return Err(self.error(
                span,
                format!(
                    "shape mismatch in bias add: the bias must be a row as long as {}'s rows; it is {}",
                    self.describe(x),
                    self.describe(bias)
                ),
            ));
        }
        Ok(self.push_op(OpKind::BiasAdd, vec![x, bias], sx, dtype, span))
    }

    fn elementwise_binary(&mut self, kind: OpKind, a: TensorId, b: TensorId) -> Result<TensorId, Diagnostic> {
        let span = self.take_span();
        let name = kind.name();
        self.no_fp8(name, &[a, b], span)?;
        let dtype = self.same_dtype(name, &[a, b], span)?;
        if self.shape(a) != self.shape(b) {
            return Err(self.error(
                span,
                format!(
                    "shape mismatch in {name}: {} and {}",
                    self.describe(a),
                    self.describe(b)
                ),
            ));
        }
        let shape = self.shape(a).to_vec();
        Ok(self.push_op(kind, vec![a, b], shape, dtype, span))
    }

    /// Elementwise `a + b` (equal shapes; see [`GraphBuilder::bias_add`] for a row).
    pub fn add(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, Diagnostic> {
        self.elementwise_binary(OpKind::Add, a, b)
    }

    /// Elementwise `a * b` (equal shapes).
    pub fn mul(&mut self, a: TensorId, b: TensorId) -> Result<TensorId, Diagnostic> {
        self.elementwise_binary(OpKind::Mul, a, b)
    }

    fn unary(&mut self, kind: OpKind, x: TensorId) -> Result<TensorId, Diagnostic> {
        let span = self.take_span();
        self.no_fp8(kind.name(), &[x], span)?;
        let (shape, dtype) = (self.shape(x).to_vec(), self.graph.tensors[x.0].dtype);
        Ok(self.push_op(kind, vec![x], shape, dtype, span))
    }

    /// An activation, any row of the op table that is one
    /// ([`Activation::named`] finds it by name).
    pub fn activation(&mut self, activation: Activation, x: TensorId) -> Result<TensorId, Diagnostic> {
        self.unary(OpKind::Activation(activation), x)
    }

    /// GELU, tanh approximation.
    pub fn gelu(&mut self, x: TensorId) -> Result<TensorId, Diagnostic> {
        self.activation(Activation::GELU, x)
    }

    /// GELU, exact (erf) form.
    pub fn gelu_erf(&mut self, x: TensorId) -> Result<TensorId, Diagnostic> {
        self.activation(Activation::GELU_ERF, x)
    }

    /// SiLU: x·sigmoid(x).
    pub fn silu(&mut self, x: TensorId) -> Result<TensorId, Diagnostic> {
        self.activation(Activation::SILU, x)
    }

    /// ReLU: max(x, 0).
    pub fn relu(&mut self, x: TensorId) -> Result<TensorId, Diagnostic> {
        self.activation(Activation::RELU, x)
    }

    fn check_norm(
        &self,
        norm: &OpDef,
        x: TensorId,
        params: &[TensorId],
        eps: f64,
        span: Span,
    ) -> Result<DType, Diagnostic> {
        let op = norm.name;
        let mut all = vec![x];
        all.extend_from_slice(params);
        self.no_fp8(op, &all, span)?;
        let dtype = self.same_dtype(op, &all, span)?;
        let sx = self.shape(x);
        if sx.len() != 2 {
            return Err(self.error(span, format!("{op} needs a matrix; {} is not", self.describe(x))));
        }
        for &p in params {
            let sp = self.shape(p);
            if sp.len() != 1 || sp[0] != sx[1] {
                return Err(self.error(
                    span,
                    format!(
                        "shape mismatch in {op}: its scale and shift must be rows as long as {}'s rows; {} is not",
                        self.describe(x),
                        self.describe(p)
                    ),
                ));
            }
        }
        let keyword = &norm.keywords[0];
        if !(keyword.accepts)(eps) {
            return Err(self.error(
                span,
                format!("{op}: {} must be {}, not {eps}", keyword.name, keyword.allowed),
            ));
        }
        Ok(dtype)
    }

    /// LayerNorm over each row, with scale `gamma` and shift `beta`.
    pub fn layernorm(
        &mut self,
        x: TensorId,
        gamma: TensorId,
        beta: TensorId,
        eps: f64,
    ) -> Result<TensorId, Diagnostic> {
        let span = self.take_span();
        let dtype = self.check_norm(&ops::LAYERNORM, x, &[gamma, beta], eps, span)?;
        let shape = self.shape(x).to_vec();
        Ok(self.push_op(
            OpKind::LayerNorm { eps },
            vec![x, gamma, beta],
            shape,
            dtype,
            span,
        ))
    }

    /// RMSNorm over each row, with scale `gamma`.
    pub fn rmsnorm(&mut self, x: TensorId, gamma: TensorId, eps: f64) -> Result<TensorId, Diagnostic> {
        let span = self.take_span();
        let dtype = self.check_norm(&ops::RMSNORM, x, &[gamma], eps, span)?;
        let shape = self.shape(x).to_vec();
        Ok(self.push_op(OpKind::RmsNorm { eps }, vec![x, gamma], shape, dtype, span))
    }

    /// Checks the whole graph and returns it.
    pub fn build(self) -> Result<Graph, Diagnostics> {
        let mut errors = Vec::new();
        if let Err(e) = self.check_name(&self.graph.name, "graph", self.name_span) {
            errors.push(e);
        }
        let g = self.graph;
        if g.outputs.is_empty() {
            // At the graph's name: there is no missing output to point at.
            errors.push(Diagnostic::new(
                self.name_span,
                format!("graph `{}` has no outputs: declare at least one", g.name),
            ));
        }
        // Walk back from the outputs: whatever is not reached is dead.
        let index = g.index();
        let mut live = vec![false; g.tensors.len()];
        let mut stack: Vec<TensorId> = g.outputs.clone();
        while let Some(t) = stack.pop() {
            if std::mem::replace(&mut live[t.0], true) {
                continue;
            }
            if let Some(op) = index.producer(t) {
                stack.extend(g.op(op).inputs.iter().copied());
            }
            // A live FP8 tensor's scale is read with it.
            stack.extend(g.tensor(t).scale);
        }

        if !g.outputs.is_empty() {
            for &t in g.inputs.iter().chain(&g.weights) {
                if !live[t.0] {
                    let desc = g.tensor(t);
                    errors.push(Diagnostic::new(
                        desc.span,
                        format!("`{}` is declared but no output uses it", desc.name),
                    ));
                }
            }
            for op in &g.ops {
                if !live[op.output.0] {
                    let desc = g.tensor(op.output);
                    errors.push(Diagnostic::new(
                        op.span,
                        format!(
                            "`{}` ({}) is computed but no output uses it",
                            desc.name,
                            op.kind.name()
                        ),
                    ));
                }
            }
        }
        if errors.is_empty() {
            Ok(g)
        } else {
            Err(Diagnostics(errors))
        }
    }
}
