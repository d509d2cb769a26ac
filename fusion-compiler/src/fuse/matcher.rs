//! The matcher: grows a candidate chain from every matmul, settles the ops
//! two candidates both want by priority, turns what is left into standalone
//! kernels (a norm alone; elementwise ops chained by the same rule as a
//! GEMM's epilogue), and orders the kernels by their data dependencies.
//!
//! Only linear chains fuse: an op joins a chain when it is the only use of
//! the chain's current tensor (a tensor read twice, or returned to the
//! caller, must be written to memory, so it ends the chain). Under that rule
//! chains are paths through the graph that can only *merge* (at a binary op
//! whose operands are both chain tensors), never branch, so the kernel
//! dependency graph has no cycles. The one merge a chain takes in is a
//! gated pair, `act(A @ W_gate) * (A @ W_up)` over two weights of one shape
//! (see [`Gate`]): one GEMM over both weights, whose candidate contains
//! both matmuls and so outranks the chains that start at either.

use super::plan::{Composition, EpilogueStep, FusedKernel, GemmComposition, Norm, Operand, Plan, Role};
use super::split::{Split, SplitRule};
use crate::ir::{Extent, Graph, OpId, OpKind, TensorId, TensorIndex};
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// Most epilogue steps one GEMM takes. Each step holds its operand tile in
/// registers next to the accumulator; past four the register pressure costs
/// more than the memory round trip it saves. Also the most ops one
/// standalone elementwise kernel chains, whose params hold one operand per
/// step (`FUSION_ELEMENTWISE_MAX_STEPS` in abi.h, which a test holds equal).
pub const MAX_EPILOGUE_STEPS: usize = 4;

/// Splits `graph` into fused kernels. Every op lands in exactly one kernel.
pub fn plan(graph: Graph) -> Plan {
    plan_with(graph, &[])
}

/// [`plan()`], forming no composition that `rules` say loses to its split
/// (see [`super::split`]).
pub fn plan_with(graph: Graph, rules: &[SplitRule]) -> Plan {
    let mut splits = Vec::new();
    let chains = select_chains(&graph, candidate_chains(&graph), rules, &mut splits);
    let mut owned = vec![false; graph.ops.len()];
    let mut kernels = Vec::new();
    for chain in &chains {
        for op in chain.ops() {
            owned[op.0] = true;
        }
        kernels.push(chain.kernel(&graph));
    }
    // In graph order, so an elementwise chain starts at its first op.
    let index = graph.index();
    for op in graph.op_ids() {
        if !owned[op.0] {
            let kernel = standalone_kernel(&graph, &index, op, &owned);
            for op in &kernel.ops {
                owned[op.0] = true;
            }
            kernels.push(kernel);
        }
    }
    let kernels = order_by_dependencies(&graph, kernels);
    let plan = Plan {
        graph,
        kernels,
        splits,
    };
    debug_assert_eq!(plan.validate(), Ok(()));
    plan
}

/// A matmul with the norm before it and the elementwise ops after it that it
/// could absorb.
#[derive(Clone, Debug)]
struct Chain {
    prologue: Option<OpId>,
    matmul: OpId,
    /// With it, `matmul` is the gate projection of a gated pair.
    gate: Option<Gate>,
    /// In dataflow order; each reads the previous one's output (the first,
    /// the gate's mul's).
    epilogue: Vec<OpId>,
}

/// The rest of a gated pair `act(A @ W_gate) * (A @ W_up)` beside its gate
/// matmul: each op's output read once, by the next, and both weights
/// weights of the graph of one shape and layout, so that they can be
/// interleaved into one when the graph binds them.
#[derive(Clone, Copy, Debug)]
struct Gate {
    activation: OpId,
    up: OpId,
    mul: OpId,
}

/// What [`Chain::give_up_refused`] did.
enum Refusal {
    /// No rule refuses the chain.
    None,
    /// It gave up steps (or its norm) and waits again.
    Shortened,
    /// A gated pair refused even bare: the chains of its two matmuls take over.
    Dropped,
}

impl Chain {
    /// Its ops, in the order [`FusedKernel::ops`] lists them.
    fn ops(&self) -> impl Iterator<Item = OpId> + '_ {
        self.core_ops().chain(self.epilogue.iter().copied())
    }

    /// The ops it cannot give up: the norm, the matmuls and a gated pair's ops.
    fn core_ops(&self) -> impl Iterator<Item = OpId> + '_ {
        let gate = self.gate.map(|g| [g.activation, g.up, g.mul]);
        self.prologue
            .into_iter()
            .chain([self.matmul])
            .chain(gate.into_iter().flatten())
    }

    fn op_count(&self) -> usize {
        self.ops().count()
    }

    fn composition(&self, graph: &Graph) -> GemmComposition {
        let OpKind::MatMul { b_layout } = graph.op(self.matmul).kind else {
            unreachable!("a chain starts at a matmul")
        };
        GemmComposition {
            prologue: self.prologue.and_then(|op| Norm::of_op(&graph.op(op).kind)),
            b_layout,
            gate: self.gate.map(|g| match graph.op(g.activation).kind {
                OpKind::Activation(activation) => activation,
                _ => unreachable!("a gate's activation is an activation"),
            }),
            epilogue: self
                .epilogue
                .iter()
                .map(|&op| EpilogueStep::of_op(&graph.op(op).kind).expect("epilogue ops are elementwise"))
                .collect(),
        }
    }

    /// Which of two candidates for the same op wins: more ops fused (fewer
    /// round trips through memory), then a named pattern (it has tuned
    /// configs and a vendor baseline), then the earlier matmul (so the
    /// choice is deterministic).
    ///
    /// In a SwiGLU FFN, `silu(x @ w_gate^T) * (x @ w_up^T)`, the mul is
    /// wanted by the gated pair (both matmuls, silu, mul), the gate chain
    /// (matmul, silu, mul) and the up chain (matmul, mul). Over two weights
    /// the pair is longest and takes all of them: one `gemm_silu_glu`. Where
    /// the pair cannot form (an up weight that is an input, or a refusal),
    /// the gate chain is longer and takes the mul: a plain `gemm` writes the
    /// up projection, then `gemm_silu_mul` reads it as its mul operand.
    fn priority(&self, graph: &Graph) -> (usize, bool, Reverse<OpId>) {
        (
            self.op_count(),
            self.composition(graph).pattern().is_some(),
            Reverse(self.matmul),
        )
    }

    /// The static N and K of its matmul (`None` where dynamic).
    fn n_and_k(&self, graph: &Graph) -> (Option<u64>, Option<u64>) {
        let matmul = graph.op(self.matmul);
        let last = |t: TensorId| match graph.tensor(t).shape.last() {
            Some(&Extent::Static(size)) => Some(size),
            _ => None,
        };
        (last(matmul.output), last(matmul.inputs[0]))
    }

    /// The rule that refuses the composition as it stands, if any.
    fn refused_by<'r>(&self, graph: &Graph, rules: &'r [SplitRule]) -> Option<&'r SplitRule> {
        let composition = self.composition(graph);
        let (n, k) = self.n_and_k(graph);
        rules.iter().find(|rule| rule.refuses(&composition, n, k))
    }

    /// Shortens the chain until no rule refuses it: its last epilogue
    /// steps first, and only when even the norm and the bare matmul are
    /// refused, the norm, with the longest chain no rule refuses after it.
    /// A gated pair refused even bare and without its norm is dropped whole
    /// (its matmuls' own chains remain). Records each refusal in `splits`.
    fn give_up_refused(&mut self, graph: &Graph, rules: &[SplitRule], splits: &mut Vec<Split>) -> Refusal {
        let Some(rule) = self.refused_by(graph, rules) else {
            return Refusal::None;
        };
        let refused = self.composition(graph).name();
        let full = self.clone();
        let allowed = |chain: &Chain| chain.refused_by(graph, rules).is_none();
        let shorter = |mut chain: Chain| {
            while !allowed(&chain) && chain.epilogue.pop().is_some() {}
            chain
        };
        let mut kept = shorter(full.clone());
        if !allowed(&kept) {
            kept = shorter(Chain {
                prologue: None,
                ..full.clone()
            });
        }
        // A gated pair refused even bare and without its norm goes whole.
        let outcome = if allowed(&kept) || full.gate.is_none() {
            Refusal::Shortened
        } else {
            Refusal::Dropped
        };
        *self = kept;
        splits.push(Split {
            refused,
            kept: match outcome {
                Refusal::Dropped => "a GEMM for each of its two weights".to_string(),
                _ => self.composition(graph).name(),
            },
            reason: rule.reason.clone(),
            origin: rule.origin.clone(),
        });
        outcome
    }

    fn kernel(&self, graph: &Graph) -> FusedKernel {
        let composition = self.composition(graph);
        let matmul = graph.op(self.matmul);
        let mut operands = Vec::new();
        let a = match self.prologue {
            Some(norm) => graph.op(norm).inputs[0],
            None => matmul.inputs[0],
        };
        operands.push(Operand {
            role: Role::A,
            tensor: a,
        });
        operands.push(Operand {
            role: Role::B,
            tensor: matmul.inputs[1],
        });
        if let Some(gate) = self.gate {
            operands.push(Operand {
                role: Role::Up,
                tensor: graph.op(gate.up).inputs[1],
            });
        }
        if let Some(norm) = self.prologue {
            operands.extend(norm_params(graph, norm));
        }
        let output = push_step_operands(
            graph,
            &self.epilogue,
            &composition.epilogue,
            self.gate.map_or(matmul.output, |g| graph.op(g.mul).output),
            &mut operands,
        );
        FusedKernel {
            name: composition.name(),
            composition: Composition::Gemm(composition),
            ops: self.ops().collect(),
            operands,
            output,
        }
    }
}

/// One chain per matmul, as long as the linear-chain rule and the epilogue
/// cap allow, and one per gated pair, before any conflicts are settled.
fn candidate_chains(graph: &Graph) -> Vec<Chain> {
    let index = graph.index();
    let plain = graph
        .op_ids()
        .filter(|&op| matches!(graph.op(op).kind, OpKind::MatMul { .. }))
        .map(|matmul| Chain {
            prologue: norm_prologue(graph, &index, &[matmul]),
            matmul,
            gate: None,
            epilogue: epilogue_ops(graph, &index, graph.op(matmul).output),
        });
    let gated = graph.op_ids().filter_map(|mul| {
        let (matmul, gate) = gated_pair(graph, &index, mul)?;
        Some(Chain {
            prologue: norm_prologue(graph, &index, &[matmul, gate.up]),
            matmul,
            gate: Some(gate),
            epilogue: epilogue_ops(graph, &index, graph.op(mul).output),
        })
    });
    plain.chain(gated).collect()
}

/// The gate matmul and the rest of the gated pair whose product `mul`
/// computes, if it is one: `act(A @ W_gate) * (A @ W_up)` (either operand
/// order), each intermediate read once, the two matmuls on the same `A` in
/// the same layout, over two weights of the graph of one shape.
fn gated_pair(graph: &Graph, index: &TensorIndex, mul: OpId) -> Option<(OpId, Gate)> {
    let op = graph.op(mul);
    if op.kind != OpKind::Mul {
        return None;
    }
    let read_once_from = |t: TensorId| index.producer(t).filter(|_| index.use_count(t) == 1);
    let is_matmul = |op: OpId| matches!(graph.op(op).kind, OpKind::MatMul { .. });
    [(op.inputs[0], op.inputs[1]), (op.inputs[1], op.inputs[0])]
        .into_iter()
        .find_map(|(gated, up)| {
            let activation = read_once_from(gated)?;
            let OpKind::Activation(_) = graph.op(activation).kind else {
                return None;
            };
            let matmul = read_once_from(graph.op(activation).inputs[0]).filter(|&m| is_matmul(m))?;
            let up = read_once_from(up).filter(|&m| is_matmul(m))?;
            let (g, u) = (graph.op(matmul), graph.op(up));
            let (w_gate, w_up) = (g.inputs[1], u.inputs[1]);
            let pairs = matmul != up
                && g.inputs[0] == u.inputs[0]
                && g.kind == u.kind
                && graph.weights.contains(&w_gate)
                && graph.weights.contains(&w_up)
                && graph.tensor(w_gate).shape == graph.tensor(w_up).shape;
            pairs.then_some((matmul, Gate { activation, up, mul }))
        })
}

/// The norm that computes the `A` of `matmuls` (one, or a gated pair's
/// two), when they are that norm's only uses.
fn norm_prologue(graph: &Graph, index: &TensorIndex, matmuls: &[OpId]) -> Option<OpId> {
    let a = graph.op(matmuls[0]).inputs[0];
    let producer = index.producer(a)?;
    let is_norm = Norm::of_op(&graph.op(producer).kind).is_some();
    // Its uses are these matmuls' A: so not their B, not a graph output.
    let only_as_a = index.use_count(a) == matmuls.len()
        && matmuls
            .iter()
            .all(|&m| graph.op(m).inputs[0] == a && graph.op(m).inputs[1] != a);
    (is_norm && only_as_a).then_some(producer)
}

/// The elementwise ops that follow `start` (a matmul's or a gated pair's
/// output) one after another, each the only use of the tensor before it,
/// up to the second that reads an operand of one kind: a GEMM's epilogue
/// reads one bias, one residual and one multiplier (the kernels'
/// `EpilogueArgs`), so `x @ w + r1 + r2` adds `r2` in a kernel of its own.
fn epilogue_ops(graph: &Graph, index: &TensorIndex, start: TensorId) -> Vec<OpId> {
    let mut ops = linear_chain(graph, index, start, MAX_EPILOGUE_STEPS, |_| true);
    let mut read = Vec::new();
    let repeated = ops.iter().position(|&op| {
        let step = EpilogueStep::of_op(&graph.op(op).kind).filter(|s| s.operand_role(0).is_some());
        step.is_some_and(|step| {
            let seen = read.contains(&step);
            read.push(step);
            seen
        })
    });
    if let Some(cut) = repeated {
        ops.truncate(cut);
    }
    ops
}

/// Up to `room` elementwise ops that follow `from` one after another, each
/// the only use of the tensor before it and one that `may_join` accepts.
fn linear_chain(
    graph: &Graph,
    index: &TensorIndex,
    from: TensorId,
    room: usize,
    may_join: impl Fn(OpId) -> bool,
) -> Vec<OpId> {
    let mut ops = Vec::new();
    let mut current = from;
    while ops.len() < room && index.use_count(current) == 1 {
        // The one use may be the graph output itself, with no op reading it.
        let Some(&next) = index.uses(current).first() else {
            break;
        };
        if !may_join(next) || !fits_epilogue(graph, next, current) {
            break;
        }
        ops.push(next);
        current = graph.op(next).output;
    }
    ops
}

/// Whether `op`, which reads the chain tensor `chain`, can be applied to the
/// accumulator tile: a unary activation, a bias add of the chain tensor, or
/// an add or mul of the chain tensor with another tensor of its shape.
fn fits_epilogue(graph: &Graph, op: OpId, chain: TensorId) -> bool {
    let op = graph.op(op);
    let shape = |t: TensorId| &graph.tensor(t).shape;
    match op.kind {
        OpKind::Activation(_) => true,
        OpKind::BiasAdd => op.inputs[0] == chain && shape(op.inputs[1]).len() == 1,
        OpKind::Add | OpKind::Mul => {
            let other = if op.inputs[0] == chain {
                op.inputs[1]
            } else {
                op.inputs[0]
            };
            other != chain && shape(other) == shape(chain)
        }
        OpKind::MatMul { .. } | OpKind::LayerNorm { .. } | OpKind::RmsNorm { .. } => false,
    }
}

/// The operand of a binary elementwise op that is not the chain tensor.
fn other_operand(graph: &Graph, op: OpId, chain: TensorId) -> TensorId {
    let inputs = &graph.op(op).inputs;
    if inputs[0] == chain { inputs[1] } else { inputs[0] }
}

/// Pushes the operand of each step of `ops` (which compute `steps`, the
/// first reading `input`) that reads one, with its role; returns the last
/// op's output.
fn push_step_operands(
    graph: &Graph,
    ops: &[OpId],
    steps: &[EpilogueStep],
    input: TensorId,
    operands: &mut Vec<Operand>,
) -> TensorId {
    let mut current = input;
    for (step, (&op, kind)) in ops.iter().zip(steps).enumerate() {
        if let Some(role) = kind.operand_role(step) {
            operands.push(Operand {
                role,
                tensor: other_operand(graph, op, current),
            });
        }
        current = graph.op(op).output;
    }
    current
}

/// Settles conflicts: repeatedly commits the highest-priority candidate,
/// after cutting its epilogue before the first op already committed. Chains
/// only merge, so the ops after a contested one are the winner's too, and
/// the loser keeps a (shorter) contiguous chain.
///
/// A candidate competes with what it has left, not with what it wanted: a
/// cut only lowers a priority (fewer ops), so candidates wait in a heap
/// under the priority they had when pushed, and one found cut when it comes
/// to the top goes back with its new priority. That commits the same chains
/// as recomputing every priority after each commit, in n log n.
///
/// A candidate that `rules` refuse as it stands is shortened
/// ([`Chain::give_up_refused`]) and waits again the same way.
fn select_chains(
    graph: &Graph,
    pending: Vec<Chain>,
    rules: &[SplitRule],
    splits: &mut Vec<Split>,
) -> Vec<Chain> {
    let mut taken = vec![false; graph.ops.len()];
    let mut chosen = Vec::with_capacity(pending.len());
    let mut slots: Vec<Chain> = pending;
    let mut heap: BinaryHeap<_> = slots
        .iter()
        .enumerate()
        .map(|(i, chain)| (chain.priority(graph), i))
        .collect();
    while let Some((_, i)) = heap.pop() {
        let chain = &mut slots[i];
        // A matmul a gated pair took (or a pair whose matmul went to a
        // longer chain): the chain that took it computes it.
        if chain.core_ops().any(|op| taken[op.0]) {
            continue;
        }
        if let Some(cut) = chain.epilogue.iter().position(|op| taken[op.0]) {
            chain.epilogue.truncate(cut);
            heap.push((chain.priority(graph), i));
            continue;
        }
        match chain.give_up_refused(graph, rules, splits) {
            Refusal::None => {}
            Refusal::Shortened => {
                heap.push((chain.priority(graph), i));
                continue;
            }
            Refusal::Dropped => continue,
        }
        for op in chain.ops() {
            assert!(!taken[op.0], "op {} was fused into two kernels", op.0);
            taken[op.0] = true;
        }
        chosen.push(chain.clone());
    }
    chosen
}

/// `gamma` (and `beta`) of a norm op, with their roles.
fn norm_params(graph: &Graph, norm: OpId) -> Vec<Operand> {
    let inputs = &graph.op(norm).inputs;
    let mut params = vec![Operand {
        role: Role::Gamma,
        tensor: inputs[1],
    }];
    if let Some(&beta) = inputs.get(2) {
        params.push(Operand {
            role: Role::Beta,
            tensor: beta,
        });
    }
    params
}

/// A kernel for ops that no GEMM absorbed, starting at `id`: a norm alone,
/// or an elementwise op with the ops that follow it under the linear-chain
/// rule and that no GEMM took (`owned`).
fn standalone_kernel(graph: &Graph, index: &TensorIndex, id: OpId, owned: &[bool]) -> FusedKernel {
    let op = graph.op(id);
    let x = Operand {
        role: Role::X,
        tensor: op.inputs[0],
    };
    let mut operands = vec![x];
    let (composition, ops, output) = if let Some(norm) = Norm::of_op(&op.kind) {
        operands.extend(norm_params(graph, id));
        (Composition::Norm(norm), vec![id], op.output)
    } else if EpilogueStep::of_op(&op.kind).is_some() {
        let mut ops = vec![id];
        ops.extend(linear_chain(
            graph,
            index,
            op.output,
            MAX_EPILOGUE_STEPS - 1,
            |next| !owned[next.0],
        ));
        let steps: Vec<EpilogueStep> = ops
            .iter()
            .map(|&op| EpilogueStep::of_op(&graph.op(op).kind).expect("a chain holds elementwise ops"))
            .collect();
        let output = push_step_operands(graph, &ops, &steps, x.tensor, &mut operands);
        (Composition::Elementwise(steps), ops, output)
    } else {
        unreachable!("every matmul starts a chain, so none is left standalone")
    };
    FusedKernel {
        name: composition.name(),
        composition,
        ops,
        operands,
        output,
    }
}

/// Topologically sorts kernels by the tensors they pass each other. Among
/// kernels that are ready at once, the one whose first op comes first in the
/// graph goes first, so the plan reads in the order the graph was written.
fn order_by_dependencies(graph: &Graph, kernels: Vec<FusedKernel>) -> Vec<FusedKernel> {
    let mut writer = vec![None; graph.tensors.len()];
    for (i, kernel) in kernels.iter().enumerate() {
        writer[kernel.output.0] = Some(i);
    }
    let writer_of = |t: TensorId| writer[t.0];
    let mut waiting_on = vec![0usize; kernels.len()];
    let mut readers: Vec<Vec<usize>> = vec![Vec::new(); kernels.len()];
    for (i, kernel) in kernels.iter().enumerate() {
        let mut writers: Vec<usize> = kernel.inputs().filter_map(writer_of).collect();
        writers.sort_unstable();
        writers.dedup();
        waiting_on[i] = writers.len();
        for w in writers {
            readers[w].push(i);
        }
    }
    let first_op = |i: usize| kernels[i].ops[0];
    let mut ready: BinaryHeap<Reverse<(OpId, usize)>> = (0..kernels.len())
        .filter(|&i| waiting_on[i] == 0)
        .map(|i| Reverse((first_op(i), i)))
        .collect();
    let mut order = Vec::with_capacity(kernels.len());
    while let Some(Reverse((_, i))) = ready.pop() {
        order.push(i);
        for &r in &readers[i] {
            waiting_on[r] -= 1;
            if waiting_on[r] == 0 {
                ready.push(Reverse((first_op(r), r)));
            }
        }
    }
    assert_eq!(
        order.len(),
        kernels.len(),
        "the kernels of graph `{}` depend on each other in a cycle; the linear-chain rule should make that impossible",
        graph.name
    );
    let mut slots: Vec<Option<FusedKernel>> = kernels.into_iter().map(Some).collect();
    order
        .into_iter()
        .map(|i| slots[i].take().expect("each kernel is placed once"))
        .collect()
}
