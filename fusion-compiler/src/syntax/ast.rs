//! The parsed form of a graph declaration, shared by both front ends.
//!
//! The TOML reader and the `fusion_graph!` token parser each produce a
//! [`GraphDecl`]; nothing here is resolved yet (names, dims, dtypes and op
//! names are checked when [`crate::ir::lower`] turns it into a graph).

use crate::diagnostic::Span;

/// One graph: its dims, inputs, weights and the tensors it computes.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphDecl {
    /// The graph's name, as declared (`swiglu_ffn`).
    pub name: Ident,
    /// Documentation (`///` lines in the macro, `doc` in TOML).
    pub doc: Option<String>,
    /// Its dims, in declaration order.
    pub dims: Vec<DimDecl>,
    /// Inputs and weights, in declaration order.
    pub tensors: Vec<TensorDecl>,
    /// Computed tensors, in declaration order (which need not be dependency
    /// order: names are resolved across the whole graph).
    pub bindings: Vec<Binding>,
}

/// A name with where it was written.
#[derive(Clone, Debug, PartialEq)]
pub struct Ident {
    /// The name as written.
    pub name: String,
    /// Where it was written.
    pub span: Span,
}

impl Ident {
    /// A name written at `span`.
    pub fn new(name: impl Into<String>, span: Span) -> Ident {
        Ident {
            name: name.into(),
            span,
        }
    }
}

/// `M: dyn` or `D: 4096`.
#[derive(Clone, Debug, PartialEq)]
pub struct DimDecl {
    /// The dim's name (`M`).
    pub name: Ident,
    /// Its size, or `dyn`.
    pub size: DimSize,
    /// Span of the size (the literal or `dyn`).
    pub size_span: Span,
}

/// A declared dim's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DimSize {
    /// Known when the graph is compiled.
    Static(u64),
    /// Read from the inputs at run time (the token count M).
    Dynamic,
}

/// Whether a declared tensor is fed per call or bound once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TensorRole {
    /// Passed to every run (activations).
    Input,
    /// Bound when the compiled graph is constructed (parameters).
    Weight,
}

/// `x: f16[M, D]`.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDecl {
    /// Input or weight.
    pub role: TensorRole,
    /// The tensor's name.
    pub name: Ident,
    /// Its element type and shape.
    pub ty: TypeExpr,
}

/// `f16[M, D]`: an element type and a shape; for an FP8 tensor also its
/// scale, `f8e4m3[F, D] scale w_scale`.
#[derive(Clone, Debug, PartialEq)]
pub struct TypeExpr {
    /// Element type as written (`f16`, `bf16`, `f32`, `f8e4m3`); checked
    /// when lowered.
    pub dtype: Ident,
    /// The shape, one entry per axis.
    pub dims: Vec<DimExpr>,
    /// The declared tensor named after `scale`, if written; resolved and
    /// checked when lowered.
    pub scale: Option<Ident>,
    /// The whole type expression, the scale clause included.
    pub span: Span,
}

/// One entry of a shape.
#[derive(Clone, Debug, PartialEq)]
pub enum DimExpr {
    /// A declared dim (`M`).
    Named(Ident),
    /// A literal size (`4096`).
    Literal(u64, Span),
}

/// `name = expr`, an intermediate or (with `is_output`) a graph output.
#[derive(Clone, Debug, PartialEq)]
pub struct Binding {
    /// The computed tensor's name.
    pub name: Ident,
    /// What computes it.
    pub expr: Expr,
    /// Whether it is a graph output (else an intermediate).
    pub is_output: bool,
}

/// An expression over tensors.
#[derive(Clone, Debug, PartialEq)]
pub enum Expr {
    /// A tensor by name.
    Name(Ident),
    /// `silu(x)`, `layernorm(x, g, b, eps = 1e-5)`.
    Call(Call),
    /// `a + b`, `a * b`, `a @ b`.
    Binary(Binary),
    /// `w^T`: read `w` transposed (nn.Linear's `[N, K]` layout as a matmul's
    /// right operand).
    Transpose {
        /// The expression read transposed.
        operand: Box<Expr>,
        /// The whole `w^T`.
        span: Span,
    },
}

/// Drops the tree with a loop: an operator chain (`a + b + c …`) is as deep
/// as it is long, and the derived drop would recurse once per operator.
impl Drop for Expr {
    fn drop(&mut self) {
        let mut children = Vec::new();
        self.take_children(&mut children);
        while let Some(mut child) = children.pop() {
            child.take_children(&mut children);
        }
    }
}

impl Expr {
    /// Moves this node's sub-expressions into `into`, leaving placeholders
    /// without children, so that dropping the node does not recurse.
    fn take_children(&mut self, into: &mut Vec<Expr>) {
        let leaf = || Expr::Name(Ident::new(String::new(), Span::None));
        match self {
            Expr::Name(_) => {}
            Expr::Call(call) => into.append(&mut call.args),
            Expr::Binary(binary) => {
                into.push(std::mem::replace(&mut *binary.lhs, leaf()));
                into.push(std::mem::replace(&mut *binary.rhs, leaf()));
            }
            Expr::Transpose { operand, .. } => into.push(std::mem::replace(&mut **operand, leaf())),
        }
    }

    /// The span of the whole expression.
    pub fn span(&self) -> Span {
        match self {
            Expr::Name(i) => i.span,
            Expr::Call(c) => c.span,
            Expr::Binary(b) => b.span,
            Expr::Transpose { span, .. } => *span,
        }
    }
}

/// A function applied to tensors: `silu(x)`, `layernorm(x, g, b, eps = 1e-5)`.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The function's name.
    pub func: Ident,
    /// Positional arguments.
    pub args: Vec<Expr>,
    /// Keyword arguments (`eps = 1e-5`).
    pub kwargs: Vec<KwArg>,
    /// The whole call, from the function name to the closing parenthesis.
    pub span: Span,
}

/// `eps = 1e-5`.
#[derive(Clone, Debug, PartialEq)]
pub struct KwArg {
    /// The keyword.
    pub name: Ident,
    /// Its value.
    pub value: f64,
    /// The whole `name = value`.
    pub span: Span,
}

/// A binary operation: `a + b`, `a * b`, `a @ b`.
#[derive(Clone, Debug, PartialEq)]
pub struct Binary {
    /// The operator.
    pub op: BinOp,
    /// The left operand.
    pub lhs: Box<Expr>,
    /// The right operand.
    pub rhs: Box<Expr>,
    /// The whole expression.
    pub span: Span,
}

/// A binary operator.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BinOp {
    /// `+`: elementwise add, or a bias add when the right side is a row vector.
    Add,
    /// `*`: elementwise multiply.
    Mul,
    /// `@`: matrix multiply.
    MatMul,
}
