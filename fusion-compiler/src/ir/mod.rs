//! The graph IR: typed tensors, ops, and the checks that make a graph valid.
//!
//! A [`Graph`] is built either programmatically with [`GraphBuilder`] or from
//! a parsed declaration with [`lower`]; both go through the builder, so shape
//! and dtype inference and every validity check live in one place. A built
//! graph is valid: single definition, acyclic, shapes and dtypes agree, every
//! declared tensor is used and every op contributes to an output. What each
//! op is called, takes and computes is its row in the op table, [`ops`].

mod builder;
mod lower;
pub mod ops;

pub use builder::GraphBuilder;
pub use lower::lower;
pub use ops::{Activation, OpDef};

use crate::diagnostic::Span;
use std::fmt;
use std::str::FromStr;

/// Element type of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    /// IEEE half precision.
    F16,
    /// bfloat16.
    BF16,
    /// IEEE single precision.
    F32,
    /// FP8 E4M3 (1 sign, 4 exponent bits with bias 7, 3 mantissa bits; no
    /// infinities; largest finite ±448): a stored value times the scale
    /// tensor the declaration names ([`TensorDesc::scale`]). The front ends,
    /// the IR's checks and the CPU reference take it; no kernel is
    /// generated for it yet.
    F8E4M3,
}

impl DType {
    /// Every dtype, in the order the parser lists them.
    pub const ALL: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F8E4M3];

    /// The name used in graph declarations (`f16`).
    pub fn name(self) -> &'static str {
        match self {
            DType::F16 => "f16",
            DType::BF16 => "bf16",
            DType::F32 => "f32",
            DType::F8E4M3 => "f8e4m3",
        }
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::F16 | DType::BF16 => 2,
            DType::F32 => 4,
            DType::F8E4M3 => 1,
        }
    }

    /// An 8-bit float, which holds a value only with its scale.
    pub fn is_fp8(self) -> bool {
        matches!(self, DType::F8E4M3)
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for DType {
    type Err = String;
    fn from_str(s: &str) -> Result<DType, String> {
        DType::ALL
            .into_iter()
            .find(|d| d.name() == s)
            .ok_or_else(|| format!("unknown dtype `{s}`: expected one of f16, bf16, f32, f8e4m3"))
    }
}

/// Index of a dim in [`Graph::dims`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DimId(pub usize);

/// Index of a tensor in [`Graph::tensors`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TensorId(pub usize);

/// Index of an op in [`Graph::ops`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub usize);

/// A named dim of the graph.
#[derive(Clone, Debug, PartialEq)]
pub struct DimDef {
    /// The dim's name (`M`).
    pub name: String,
    /// `None` for a dynamic dim, known only at run time.
    pub size: Option<u64>,
    /// Where it was declared.
    pub span: Span,
}

/// The size of one axis of a tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Extent {
    /// A size known when the graph is compiled.
    Static(u64),
    /// A dynamic dim: two axes with the same `DimId` have the same size at
    /// run time.
    Dynamic(DimId),
}

/// What a tensor is to the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TensorKind {
    /// Fed on every run.
    Input,
    /// Bound once, when the compiled graph is constructed.
    Weight,
    /// Computed, and consumed only inside the graph.
    Intermediate,
    /// Computed and returned.
    Output,
}

/// A tensor: row-major over its shape.
#[derive(Clone, Debug, PartialEq)]
pub struct TensorDesc {
    /// The tensor's name, unique in the graph (`%<n>` for an unnamed intermediate).
    pub name: String,
    /// Its element type.
    pub dtype: DType,
    /// One extent per axis, outermost first.
    pub shape: Vec<Extent>,
    /// Input, weight, intermediate or output.
    pub kind: TensorKind,
    /// For an FP8 tensor, the declared f32 tensor its stored values are
    /// multiplied by (`[1]`: one scale for the whole tensor; `[N]`: one per
    /// output channel of a weight); `None` for every other dtype. A built
    /// graph gives every FP8 tensor one.
    pub scale: Option<TensorId>,
    /// Where it was declared or computed.
    pub span: Span,
}

/// How a matmul reads its right operand.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightLayout {
    /// `[K, N]`, row-major: `x @ w`.
    KN,
    /// `[N, K]`, as `torch.nn.Linear` stores its weight: `x @ w^T`.
    NK,
}

/// What an op computes: a row of the op table ([`ops::OPS`]) with its
/// parameters. Operand order is fixed per kind (see each variant).
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum OpKind {
    /// `[a, b]`: a `[M, K]` times b (`[K, N]` or `[N, K]`) → `[M, N]`.
    MatMul {
        /// How b is stored.
        b_layout: WeightLayout,
    },
    /// `[x, bias]`: x `[M, N]` plus bias `[N]` on every row.
    BiasAdd,
    /// `[a, b]`: elementwise sum of equal shapes.
    Add,
    /// `[a, b]`: elementwise product of equal shapes.
    Mul,
    /// `[x]`: the activation's formula of each value (see [`ops`]).
    Activation(Activation),
    /// `[x, gamma, beta]`: per row, (x − mean)/√(var + eps)·gamma + beta.
    LayerNorm {
        /// Added to the variance under the root.
        eps: f64,
    },
    /// `[x, gamma]`: per row, x/√(mean(x²) + eps)·gamma.
    RmsNorm {
        /// Added to the mean square under the root.
        eps: f64,
    },
}

impl OpKind {
    /// The op's row in the op table.
    pub fn def(&self) -> &'static OpDef {
        match self {
            OpKind::MatMul { .. } => &ops::MATMUL,
            OpKind::BiasAdd => &ops::BIAS_ADD,
            OpKind::Add => &ops::ADD,
            OpKind::Mul => &ops::MUL,
            OpKind::Activation(activation) => activation.def(),
            OpKind::LayerNorm { .. } => &ops::LAYERNORM,
            OpKind::RmsNorm { .. } => &ops::RMSNORM,
        }
    }

    /// The op's name as written in graph declarations.
    pub fn name(&self) -> &'static str {
        self.def().name
    }

    /// Computes each output element from the same element of its inputs
    /// (a bias add broadcasts along rows, which is still per element).
    pub fn is_elementwise(&self) -> bool {
        self.def().step().is_some()
    }
}

/// One op: reads `inputs`, defines `output`.
#[derive(Clone, Debug, PartialEq)]
pub struct Op {
    /// What it computes, with its parameters.
    pub kind: OpKind,
    /// Its operands, in the order the op table gives them.
    pub inputs: Vec<TensorId>,
    /// The tensor it defines.
    pub output: TensorId,
    /// The expression it came from.
    pub span: Span,
}

/// A valid dataflow graph. Ops are in topological order.
#[derive(Clone, Debug, PartialEq)]
pub struct Graph {
    /// The graph's name.
    pub name: String,
    /// Its documentation, from the declaration.
    pub doc: Option<String>,
    /// Its named dims, indexed by [`DimId`].
    pub dims: Vec<DimDef>,
    /// Every tensor, indexed by [`TensorId`].
    pub tensors: Vec<TensorDesc>,
    /// Every op, indexed by [`OpId`], in topological order.
    pub ops: Vec<Op>,
    /// Declared inputs, in declaration order.
    pub inputs: Vec<TensorId>,
    /// Declared weights, in declaration order.
    pub weights: Vec<TensorId>,
    /// Outputs, in declaration order.
    pub outputs: Vec<TensorId>,
}

impl Graph {
    /// The tensor `id`.
    pub fn tensor(&self, id: TensorId) -> &TensorDesc {
        &self.tensors[id.0]
    }

    /// The op `id`.
    pub fn op(&self, id: OpId) -> &Op {
        &self.ops[id.0]
    }

    /// Every op's id, in topological order.
    pub fn op_ids(&self) -> impl Iterator<Item = OpId> + '_ {
        (0..self.ops.len()).map(OpId)
    }

    /// The dynamic dims, in declaration order: the order a call numbers
    /// them in (`fusion::launch::Dim::Dynamic(i)`).
    pub fn dynamic_dims(&self) -> impl Iterator<Item = &DimDef> + '_ {
        self.dims.iter().filter(|d| d.size.is_none())
    }

    /// The place of `dim` among [`Graph::dynamic_dims`]; `None` for a
    /// static dim.
    pub fn dynamic_index(&self, dim: DimId) -> Option<usize> {
        self.dims[dim.0]
            .size
            .is_none()
            .then(|| self.dims[..dim.0].iter().filter(|d| d.size.is_none()).count())
    }

    /// The tensor named `name`.
    pub fn tensor_by_name(&self, name: &str) -> Option<TensorId> {
        self.tensors.iter().position(|t| t.name == name).map(TensorId)
    }

    /// The dim named `name`.
    pub fn dim_by_name(&self, name: &str) -> Option<DimId> {
        self.dims.iter().position(|d| d.name == name).map(DimId)
    }

    /// The op that defines a tensor (`None` for inputs and weights).
    ///
    /// This, [`Graph::uses`] and [`Graph::use_count`] look at every op; a
    /// pass that asks about many tensors builds a [`TensorIndex`] once.
    pub fn producer(&self, t: TensorId) -> Option<OpId> {
        self.index().producer(t)
    }

    /// Every use of a tensor as an operand, once per use (an op that reads
    /// the same tensor twice appears twice).
    pub fn uses(&self, t: TensorId) -> Vec<OpId> {
        self.index().uses(t).to_vec()
    }

    /// Number of uses, counting a graph output as one more.
    pub fn use_count(&self, t: TensorId) -> usize {
        self.index().use_count(t)
    }

    /// Who defines and who reads each tensor, in one pass over the ops.
    pub fn index(&self) -> TensorIndex {
        let mut index = TensorIndex {
            producer: vec![None; self.tensors.len()],
            uses: vec![Vec::new(); self.tensors.len()],
            is_output: vec![false; self.tensors.len()],
        };
        for (i, op) in self.ops.iter().enumerate() {
            index.producer[op.output.0] = Some(OpId(i));
            for &t in &op.inputs {
                index.uses[t.0].push(OpId(i));
            }
        }
        for &t in &self.outputs {
            index.is_output[t.0] = true;
        }
        index
    }

    /// `f16[M, 4096]`; an FP8 tensor with its scale, as declared:
    /// `f8e4m3[4096, 4096] scale w_scale`.
    pub fn type_string(&self, t: TensorId) -> String {
        let desc = self.tensor(t);
        let ty = format!("{}[{}]", desc.dtype, self.shape_string(&desc.shape));
        match desc.scale {
            Some(scale) => format!("{ty} scale {}", self.tensor(scale).name),
            None => ty,
        }
    }

    /// Whether any of its tensors is FP8.
    pub fn has_fp8(&self) -> bool {
        self.tensors.iter().any(|t| t.dtype.is_fp8())
    }

    /// Why no kernel can be generated for this graph, if it has FP8
    /// tensors: the front ends, the IR's checks and the CPU reference take
    /// them, but no GPU mainloop computes them yet.
    pub fn fp8_refusal(&self) -> Option<String> {
        let fp8: Vec<String> = self
            .tensors
            .iter()
            .filter(|t| t.dtype.is_fp8())
            .map(|t| format!("`{}`", t.name))
            .collect();
        let tensors = match &fp8[..] {
            [] => return None,
            [one] => format!("{one} is"),
            [rest @ .., last] => format!("{} and {last} are", rest.join(", ")),
        };
        Some(format!(
            "graph `{}`: FP8 kernels are not generated yet, and {tensors} f8e4m3; the front ends, the IR's checks \
             and the CPU reference take FP8 graphs, but no GPU mainloop computes them",
            self.name
        ))
    }

    /// The scales of the graph's FP8 tensors (one pass over the tensors;
    /// a graph has a handful, so `contains` on the result is cheap).
    pub fn scales(&self) -> Vec<TensorId> {
        self.tensors.iter().filter_map(|desc| desc.scale).collect()
    }

    /// `M, 4096`: dynamic dims by name, static ones by size.
    pub fn shape_string(&self, shape: &[Extent]) -> String {
        shape
            .iter()
            .map(|e| match e {
                Extent::Static(n) => n.to_string(),
                Extent::Dynamic(d) => self.dims[d.0].name.clone(),
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// The producer and the uses of every tensor of a [`Graph`], so that passes
/// asking about each tensor take time linear in the graph, not quadratic.
/// It describes the graph it was built from ([`Graph::index`]).
#[derive(Clone, Debug)]
pub struct TensorIndex {
    producer: Vec<Option<OpId>>,
    uses: Vec<Vec<OpId>>,
    is_output: Vec<bool>,
}

impl TensorIndex {
    /// The op that defines a tensor (`None` for inputs and weights).
    pub fn producer(&self, t: TensorId) -> Option<OpId> {
        self.producer[t.0]
    }

    /// Every use of a tensor as an operand, in op order, once per use.
    pub fn uses(&self, t: TensorId) -> &[OpId] {
        &self.uses[t.0]
    }

    /// Number of uses, counting a graph output as one more.
    pub fn use_count(&self, t: TensorId) -> usize {
        self.uses[t.0].len() + usize::from(self.is_output[t.0])
    }
}
