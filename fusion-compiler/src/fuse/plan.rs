//! The result of fusion: a [`Plan`] of [`FusedKernel`]s, each a composition
//! of parts a code generator instantiates (norm prologue × GEMM mainloop ×
//! epilogue chain), with every operand tensor tagged by the role it plays.
//!
//! These types describe *what* each kernel computes, not how: tile shapes and
//! the target architecture are chosen later, per kernel.

use super::pattern::{self, NamedPattern};
pub use crate::ir::Activation;
use crate::ir::{Graph, OpDef, OpId, OpKind, TensorId, TensorKind, WeightLayout, ops};
use std::fmt;

/// A graph split into kernels: every op of `graph` is in exactly one kernel,
/// and a kernel comes after every kernel that computes one of its inputs.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    /// The graph it splits.
    pub graph: Graph,
    /// In an order that respects data dependencies: launch them in turn.
    pub kernels: Vec<FusedKernel>,
    /// The fusions it did not form because a tuned table measured them
    /// slower than their split ([`super::split`]).
    pub splits: Vec<super::split::Split>,
}

/// One kernel: a connected chain of ops, read through `operands`, written to
/// `output`.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedKernel {
    /// The composition's name (`gemm_bias_gelu`, `gemm_silu_mul`, `add`).
    /// Not unique within a plan: see [`Plan::kernel_symbol`].
    pub name: String,
    /// What it computes.
    pub composition: Composition,
    /// The ops it computes, in dataflow order (which is also topological
    /// order): the prologue norm, the matmul, a gated GEMM's activation, up
    /// matmul and mul (see [`GemmComposition::gate`]), then each epilogue op.
    pub ops: Vec<OpId>,
    /// Tensors the kernel reads from memory, in the order the kernel takes
    /// them (see [`Role`]). A tensor read in two roles appears twice.
    pub operands: Vec<Operand>,
    /// The one tensor it writes: the output of its last op.
    pub output: TensorId,
}

/// What a kernel computes.
#[derive(Clone, Debug, PartialEq)]
pub enum Composition {
    /// A GEMM with an optional norm prologue and an epilogue chain.
    /// Operands: `A`, `B` (and a gated GEMM's `Up`), then `gamma` (and
    /// `beta`) of the prologue, then one operand for each epilogue step
    /// that reads one, in step order.
    Gemm(GemmComposition),
    /// A standalone LayerNorm or RMSNorm. Operands: `x`, `gamma` (, `beta`).
    Norm(Norm),
    /// A chain of standalone elementwise ops (one to
    /// [`MAX_EPILOGUE_STEPS`](super::MAX_EPILOGUE_STEPS), each reading the
    /// previous one's output), expressed as epilogue steps applied in order
    /// to `x` (so it reuses the epilogue's functors). Operands: `x`, the
    /// first op's input, then one operand for each step that reads one
    /// (`bias`, `residual` for the other addend of an add, `mul` for the
    /// other factor of a mul), in step order.
    Elementwise(Vec<EpilogueStep>),
}

/// Norm prologue × GEMM mainloop × epilogue chain.
#[derive(Clone, Debug, PartialEq)]
pub struct GemmComposition {
    /// Normalises each row of `A` before it enters the mainloop.
    pub prologue: Option<Norm>,
    /// How the mainloop reads `B`.
    pub b_layout: WeightLayout,
    /// A gated (GLU) GEMM: `act(A @ B) * (A @ Up)` with `act` this
    /// activation (SwiGLU for SiLU, GeGLU for GELU), one GEMM over `B` and
    /// `Up` interleaved (kernels/include/fusion/gated.cuh), whose epilogue
    /// combines each gate and up value in registers; the steps of
    /// `epilogue` then apply to the product.
    pub gate: Option<Activation>,
    /// Applied in order to the accumulator tile before it is stored.
    pub epilogue: Vec<EpilogueStep>,
}

/// A row normalisation and its epsilon.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Norm {
    /// LayerNorm or RMSNorm.
    pub kind: NormKind,
    /// Added to the variance (or mean square) under the root.
    pub eps: f64,
}

/// Which row normalisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum NormKind {
    /// Reads `gamma` and `beta`.
    LayerNorm,
    /// Reads `gamma` only.
    RmsNorm,
}

/// One elementwise step applied to the accumulator (or, standalone, to `x`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EpilogueStep {
    /// Adds a `[N]` row to every row: reads a [`Role::Bias`] operand.
    Bias,
    /// Applies an activation to each value.
    Activation(Activation),
    /// Adds a tensor of the accumulator's shape: reads a [`Role::Residual`].
    Residual,
    /// Multiplies by a tensor of the accumulator's shape: reads a
    /// [`Role::MulOperand`].
    Mul,
}

/// A tensor a kernel reads, and what for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Operand {
    /// What the kernel reads it for.
    pub role: Role,
    /// The tensor.
    pub tensor: TensorId,
}

/// The operand of each pointer field of `fusion_gemm_params` (abi.h), or
/// `None` for a null pointer; [`GemmOperands::map`] turns them into what a
/// caller passes (a variable's tokens, a device address).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GemmOperands<T> {
    /// `A`, the activations.
    pub a: Option<T>,
    /// `B`, the weight (a gated GEMM's gate weight).
    pub b: Option<T>,
    /// A gated GEMM's up weight.
    pub b_up: Option<T>,
    /// The `[N]` bias.
    pub bias: Option<T>,
    /// The `[M, N]` tensor a residual step adds.
    pub residual: Option<T>,
    /// The `[M, N]` tensor a mul step multiplies by.
    pub multiplier: Option<T>,
    /// The norm prologue's gamma.
    pub gamma: Option<T>,
    /// LayerNorm's beta.
    pub beta: Option<T>,
}

impl<T> GemmOperands<T> {
    /// Each field through `f`, `None` kept.
    pub fn map<U>(self, mut f: impl FnMut(T) -> U) -> GemmOperands<U> {
        let mut each = |field: Option<T>| field.map(&mut f);
        GemmOperands {
            a: each(self.a),
            b: each(self.b),
            b_up: each(self.b_up),
            bias: each(self.bias),
            residual: each(self.residual),
            multiplier: each(self.multiplier),
            gamma: each(self.gamma),
            beta: each(self.beta),
        }
    }
}

/// What an operand is to its kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// The GEMM's left operand `[M, K]`; with a prologue, before the norm.
    A,
    /// The GEMM's right operand, read in the composition's `b_layout`; a
    /// gated GEMM's gate weight.
    B,
    /// A gated GEMM's up weight, of `B`'s shape and layout.
    Up,
    /// A norm's scale `[K]` (prologue or standalone norm).
    Gamma,
    /// A LayerNorm's shift `[K]`.
    Beta,
    /// The input of a standalone norm, or of an elementwise chain's first op.
    X,
    /// The `[N]` row of the epilogue step at index `step`.
    Bias {
        /// The step's index in the epilogue chain.
        step: usize,
    },
    /// The tensor the epilogue step at index `step` adds.
    Residual {
        /// The step's index in the epilogue chain.
        step: usize,
    },
    /// The tensor the epilogue step at index `step` multiplies by.
    MulOperand {
        /// The step's index in the epilogue chain.
        step: usize,
    },
}

impl Role {
    /// A short name for reports: `A`, `gamma`, `residual`.
    pub fn name(self) -> &'static str {
        match self {
            Role::A => "A",
            Role::B => "B",
            Role::Up => "up",
            Role::Gamma => "gamma",
            Role::Beta => "beta",
            Role::X => "x",
            Role::Bias { .. } => "bias",
            Role::Residual { .. } => "residual",
            Role::MulOperand { .. } => "mul",
        }
    }

    /// The index of the epilogue step that reads it, for a step's operand.
    pub fn step(self) -> Option<usize> {
        match self {
            Role::Bias { step } | Role::Residual { step } | Role::MulOperand { step } => Some(step),
            Role::A | Role::B | Role::Up | Role::Gamma | Role::Beta | Role::X => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl NormKind {
    /// The norm op's row in the op table.
    pub fn def(self) -> &'static OpDef {
        match self {
            NormKind::LayerNorm => &ops::LAYERNORM,
            NormKind::RmsNorm => &ops::RMSNORM,
        }
    }

    /// As written in graph declarations, and as a prologue in composed
    /// names (`layernorm_gemm`).
    pub fn name(self) -> &'static str {
        self.def().name
    }
}

impl Norm {
    /// The norm an op computes, if it is one.
    pub fn of_op(kind: &OpKind) -> Option<Norm> {
        match *kind {
            OpKind::LayerNorm { eps } => Some(Norm {
                kind: NormKind::LayerNorm,
                eps,
            }),
            OpKind::RmsNorm { eps } => Some(Norm {
                kind: NormKind::RmsNorm,
                eps,
            }),
            _ => None,
        }
    }
}

impl EpilogueStep {
    /// The step an elementwise op becomes (`None` for matmuls and norms).
    pub fn of_op(kind: &OpKind) -> Option<EpilogueStep> {
        Some(match *kind {
            OpKind::BiasAdd => EpilogueStep::Bias,
            OpKind::Add => EpilogueStep::Residual,
            OpKind::Mul => EpilogueStep::Mul,
            OpKind::Activation(activation) => EpilogueStep::Activation(activation),
            OpKind::MatMul { .. } | OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. } => return None,
        })
    }

    /// The op table's row of the op it is: `bias_add` for [`EpilogueStep::Bias`].
    pub fn def(self) -> &'static OpDef {
        match self {
            EpilogueStep::Bias => &ops::BIAS_ADD,
            EpilogueStep::Activation(activation) => activation.def(),
            EpilogueStep::Residual => &ops::ADD,
            EpilogueStep::Mul => &ops::MUL,
        }
    }

    fn step_def(self) -> &'static ops::StepDef {
        self.def().step().expect("the row of an epilogue step is a step")
    }

    /// Whether it reads a tensor of the accumulator's shape (residual, mul).
    pub fn reads_tile(self) -> bool {
        matches!(self.step_def().kind, ops::StepKind::Residual | ops::StepKind::Mul)
    }

    /// The word it adds to a composed name: `bias`, `gelu`, `residual`, `mul`.
    pub fn name(self) -> &'static str {
        self.step_def().word
    }

    /// Its step type in `kernels/include/fusion/epilogue.cuh`: `fusion::Bias`.
    pub fn cuda_type(self) -> &'static str {
        self.step_def().cuda_type
    }

    /// The role of the operand the step at `step` reads, if it reads one.
    pub fn operand_role(self, step: usize) -> Option<Role> {
        match self {
            EpilogueStep::Bias => Some(Role::Bias { step }),
            EpilogueStep::Residual => Some(Role::Residual { step }),
            EpilogueStep::Mul => Some(Role::MulOperand { step }),
            EpilogueStep::Activation(_) => None,
        }
    }
}

impl GemmComposition {
    /// The composed name: `[layernorm_|rmsnorm_]gemm[_<act>_glu][_step]*`,
    /// e.g. `layernorm_gemm_bias_gelu`, `rmsnorm_gemm_silu_glu`. For the nine
    /// named patterns it is the pattern's name.
    pub fn name(&self) -> String {
        pattern::composed_name(self.prologue.map(|p| p.kind), self.gate, &self.epilogue)
    }

    /// The named pattern this composition is, if it is one of the nine.
    pub fn pattern(&self) -> Option<NamedPattern> {
        NamedPattern::of(self)
    }

    /// How many of its epilogue steps read an [M, N] tensor (residual,
    /// multiplier).
    pub fn source_tiles(&self) -> usize {
        self.epilogue.iter().filter(|s| s.reads_tile()).count()
    }
}

impl Composition {
    /// The kernel's name: the GEMM's composed name, or the standalone ops'
    /// names as written in graph declarations (`layernorm`, `bias_add`,
    /// `silu_mul`).
    pub fn name(&self) -> String {
        match self {
            Composition::Gemm(gemm) => gemm.name(),
            Composition::Norm(norm) => norm.kind.name().to_string(),
            Composition::Elementwise(steps) => pattern::elementwise_name(steps),
        }
    }
}

impl FusedKernel {
    /// The tensors it reads, in operand order (repeats included).
    pub fn inputs(&self) -> impl Iterator<Item = TensorId> + '_ {
        self.operands.iter().map(|o| o.tensor)
    }

    /// The tensor read in `role`, if the kernel has that role.
    pub fn operand(&self, role: Role) -> Option<TensorId> {
        self.operands.iter().find(|o| o.role == role).map(|o| o.tensor)
    }

    /// Which operand each pointer of a GEMM launcher's params takes
    /// (abi.h's `fusion_gemm_params`): the one map of roles to fields that
    /// generated wrappers, `fusion tune` and `fusion run` fill them from.
    pub fn gemm_operands(&self) -> GemmOperands<Operand> {
        let role = |role: Role| self.operands.iter().find(|o| o.role == role).copied();
        let step = |matches: fn(&Role) -> bool| self.operands.iter().find(|o| matches(&o.role)).copied();
        GemmOperands {
            a: role(Role::A),
            b: role(Role::B),
            b_up: role(Role::Up),
            bias: step(|r| matches!(r, Role::Bias { .. })),
            residual: step(|r| matches!(r, Role::Residual { .. })),
            multiplier: step(|r| matches!(r, Role::MulOperand { .. })),
            gamma: role(Role::Gamma),
            beta: role(Role::Beta),
        }
    }

    /// An elementwise launcher's `operands` (abi.h): step i's operand at
    /// index i, `None` where the step reads none and past the last step.
    pub fn step_operands(&self) -> [Option<Operand>; super::MAX_EPILOGUE_STEPS] {
        std::array::from_fn(|step| {
            self.operands
                .iter()
                .find(|o| o.role.step() == Some(step))
                .copied()
        })
    }

    /// A GEMM kernel's N and K where `graph` declares them static (`None`
    /// where dynamic): the last dims of its output and of `A`.
    pub fn static_n_and_k(&self, graph: &Graph) -> (Option<u64>, Option<u64>) {
        let last = |tensor: Option<TensorId>| match tensor.map(|t| graph.tensor(t).shape.last()) {
            Some(Some(&crate::ir::Extent::Static(size))) => Some(size),
            _ => None,
        };
        (last(Some(self.output)), last(self.operand(Role::A)))
    }

    /// Whether its norm prologue can be folded into its weight once the
    /// graph's weights are bound: a GEMM with a norm prologue whose B,
    /// gamma and (LayerNorm) beta are all weights of `graph`, not inputs
    /// or intermediates. Its unit then also runs folded (abi.h).
    pub fn norm_foldable(&self, graph: &Graph) -> bool {
        let Composition::Gemm(gemm) = &self.composition else {
            return false;
        };
        let Some(prologue) = gemm.prologue else {
            return false;
        };
        self.is_weight(graph, Role::B)
            && (gemm.gate.is_none() || self.is_weight(graph, Role::Up))
            && self.is_weight(graph, Role::Gamma)
            && (prologue.kind == NormKind::RmsNorm || self.is_weight(graph, Role::Beta))
    }

    /// Whether the graph struct computes a form of its weights when it
    /// binds them (`<symbol>_fold_weights`, abi.h): its norm folded in
    /// ([`FusedKernel::norm_foldable`]), a gated GEMM's gate and up weights
    /// interleaved (which the planner forms only over weights).
    pub fn prepares_weights(&self, graph: &Graph) -> bool {
        let Composition::Gemm(gemm) = &self.composition else {
            return false;
        };
        self.norm_foldable(graph)
            || (gemm.gate.is_some() && self.is_weight(graph, Role::B) && self.is_weight(graph, Role::Up))
    }

    /// Whether it is a GEMM whose B is a weight of `graph`, which a graph
    /// struct binds once (and may keep in the row layout its kernel reads
    /// best).
    pub fn binds_b(&self, graph: &Graph) -> bool {
        matches!(self.composition, Composition::Gemm(_)) && self.is_weight(graph, Role::B)
    }

    /// Whether the tensor it reads in `role` is a weight of `graph`.
    fn is_weight(&self, graph: &Graph, role: Role) -> bool {
        self.operand(role).is_some_and(|t| graph.weights.contains(&t))
    }

    /// The named pattern it is, if it is a GEMM composition among the nine.
    pub fn pattern(&self) -> Option<NamedPattern> {
        match &self.composition {
            Composition::Gemm(gemm) => gemm.pattern(),
            _ => None,
        }
    }
}

/// A tensor written by one kernel and read by later ones: it lives in
/// memory between launches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CrossingTensor {
    /// The tensor.
    pub tensor: TensorId,
    /// Index of the kernel that writes it.
    pub producer: usize,
    /// Indices of the kernels that read it, ascending, each once.
    pub consumers: Vec<usize>,
    /// Also returned to the caller (otherwise a temporary the run time allocates).
    pub is_graph_output: bool,
}

impl Plan {
    /// Index of the kernel that computes `op`.
    pub fn kernel_of_op(&self, op: OpId) -> Option<usize> {
        self.kernels.iter().position(|k| k.ops.contains(&op))
    }

    /// Index of the kernel that writes `t` (`None` for inputs and weights).
    pub fn producer_kernel(&self, t: TensorId) -> Option<usize> {
        self.kernels.iter().position(|k| k.output == t)
    }

    /// The crossing tensors that are no graph output: what a call keeps in
    /// a workspace buffer each, ordered by producing kernel.
    pub fn temporaries(&self) -> Vec<TensorId> {
        self.crossing_tensors()
            .into_iter()
            .filter(|c| !c.is_graph_output)
            .map(|c| c.tensor)
            .collect()
    }

    /// Tensors that cross kernel boundaries, ordered by producing kernel.
    pub fn crossing_tensors(&self) -> Vec<CrossingTensor> {
        let mut writer = vec![None; self.graph.tensors.len()];
        for (i, kernel) in self.kernels.iter().enumerate() {
            writer[kernel.output.0] = Some(i);
        }
        let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); self.kernels.len()];
        for (reader, kernel) in self.kernels.iter().enumerate() {
            for t in kernel.inputs() {
                if let Some(producer) = writer[t.0]
                    && consumers[producer].last() != Some(&reader)
                {
                    consumers[producer].push(reader);
                }
            }
        }
        let mut is_graph_output = vec![false; self.graph.tensors.len()];
        for &t in &self.graph.outputs {
            is_graph_output[t.0] = true;
        }
        self.kernels
            .iter()
            .zip(consumers)
            .enumerate()
            .filter(|(_, (_, consumers))| !consumers.is_empty())
            .map(|(producer, (kernel, consumers))| CrossingTensor {
                tensor: kernel.output,
                producer,
                consumers,
                is_graph_output: is_graph_output[kernel.output.0],
            })
            .collect()
    }

    /// Kernel `index` alone as a graph (named `<graph>_k<index>`): its ops,
    /// the tensors it reads as the inputs (activations, `A` first, and the
    /// intermediates other kernels write) and weights they are in the
    /// graph, and its output the one output. Tensor ids stay the plan's, so
    /// the kernel's operands name the new graph's tensors; what the kernel
    /// does not touch stays in `tensors`, unread. For checking one kernel
    /// against the CPU reference on its own.
    pub fn kernel_graph(&self, index: usize) -> Graph {
        let kernel = &self.kernels[index];
        let mut graph = self.graph.clone();
        graph.name = format!("{}_k{index}", self.graph.name);
        graph.ops = kernel.ops.iter().map(|&op| self.graph.op(op).clone()).collect();
        let mut reads: Vec<TensorId> = Vec::new();
        // An FP8 operand's scale is read with it.
        for t in kernel
            .inputs()
            .flat_map(|t| [Some(t), self.graph.tensor(t).scale])
            .flatten()
        {
            if !reads.contains(&t) {
                reads.push(t);
            }
        }
        let (weights, inputs): (Vec<TensorId>, Vec<TensorId>) = reads
            .into_iter()
            .partition(|&t| self.graph.tensor(t).kind == TensorKind::Weight);
        for &t in &inputs {
            graph.tensors[t.0].kind = TensorKind::Input;
        }
        for t in 0..graph.tensors.len() {
            let tensor = &mut graph.tensors[t];
            if tensor.kind == TensorKind::Output && TensorId(t) != kernel.output {
                tensor.kind = TensorKind::Intermediate;
            }
        }
        graph.tensors[kernel.output.0].kind = TensorKind::Output;
        graph.inputs = inputs;
        graph.weights = weights;
        graph.outputs = vec![kernel.output];
        graph
    }

    /// Kernel `index` alone as a plan of its own: its graph
    /// [`Plan::kernel_graph`], the kernel its one kernel. What `fusion tune`
    /// times a candidate of the kernel through, as a table the run time's
    /// executor runs.
    pub fn kernel_plan(&self, index: usize) -> Plan {
        Plan {
            graph: self.kernel_graph(index),
            kernels: vec![self.kernels[index].clone()],
            splits: Vec::new(),
        }
    }

    /// How errors name kernel `index`: `kernel #0 (gemm_bias_gelu)`.
    pub fn kernel_label(&self, index: usize) -> String {
        format!("kernel #{index} ({})", self.kernels[index].name)
    }

    /// A name for kernel `index` that is unique within the plan and a valid
    /// C identifier: `<graph>_k<index>_<composition>`.
    pub fn kernel_symbol(&self, index: usize) -> String {
        format!("{}_k{index}_{}", self.graph.name, self.kernels[index].name)
    }
}
