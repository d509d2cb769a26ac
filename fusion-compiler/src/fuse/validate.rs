//! [`Plan::validate`]: the invariants every plan must hold, checked from the
//! plan alone, so a bug in the matcher shows up as a sentence, not as a
//! wrong kernel.

use super::plan::{Composition, EpilogueStep, FusedKernel, Norm, Plan, Role};
use crate::ir::{Graph, OpId, OpKind, TensorId, TensorIndex};

impl Plan {
    /// Checks that every op is in exactly one kernel, that each kernel is a
    /// linear chain whose intermediates nothing else reads, that its
    /// composition and operands describe its ops, and that each kernel comes
    /// after the kernels that compute its inputs. The error says which rule
    /// broke, naming the kernel.
    pub fn validate(&self) -> Result<(), String> {
        let graph = &self.graph;
        let index = graph.index();
        let mut owner: Vec<Option<usize>> = vec![None; graph.ops.len()];
        for (i, kernel) in self.kernels.iter().enumerate() {
            if kernel.ops.is_empty() {
                return Err(format!("kernel {i} (`{}`) has no ops", kernel.name));
            }
            for op in &kernel.ops {
                if let Some(first) = owner[op.0].replace(i) {
                    return Err(format!(
                        "op {} ({}) is in kernel {first} and kernel {i}",
                        op.0,
                        graph.op(*op).kind.name()
                    ));
                }
            }
        }
        if let Some(op) = owner.iter().position(Option::is_none) {
            return Err(format!(
                "op {op} ({} → `{}`) is in no kernel",
                graph.ops[op].kind.name(),
                graph.tensor(graph.ops[op].output).name
            ));
        }
        for (i, kernel) in self.kernels.iter().enumerate() {
            check_kernel(graph, &index, kernel)
                .map_err(|e| format!("kernel {i} (`{}`): {e}", kernel.name))?;
            for t in kernel.inputs() {
                if let Some(producer) = index.producer(t) {
                    let writer = owner[producer.0].expect("every op has an owner");
                    if writer >= i {
                        return Err(format!(
                            "kernel {i} (`{}`) reads `{}`, which kernel {writer} writes: kernels are out of dependency order",
                            kernel.name,
                            graph.tensor(t).name
                        ));
                    }
                }
            }
        }
        Ok(())
    }
}

/// The rules one kernel must hold on its own.
fn check_kernel(graph: &Graph, index: &TensorIndex, kernel: &FusedKernel) -> Result<(), String> {
    let last = *kernel.ops.last().expect("checked non-empty");
    if kernel.output != graph.op(last).output {
        return Err("its output is not its last op's output".to_string());
    }
    if kernel.name != kernel.composition.name() {
        return Err(format!(
            "its name is not its composition's (`{}`)",
            kernel.composition.name()
        ));
    }
    // Linear chain: each op's output is read once, by the next op; in a
    // gated GEMM the ops of its pair are read as the pair reads them.
    let linear_from = match &kernel.composition {
        Composition::Gemm(gemm) if gemm.gate.is_some() => check_gated_pair(graph, index, kernel)?,
        _ => 0,
    };
    for pair in kernel.ops[linear_from..].windows(2) {
        let t = graph.op(pair[0]).output;
        if index.use_count(t) != 1 || !graph.op(pair[1]).inputs.contains(&t) {
            return Err(fused_away(graph, t));
        }
    }
    // The operands are exactly the tensors its ops read from outside it.
    let inside: Vec<TensorId> = kernel.ops.iter().map(|&op| graph.op(op).output).collect();
    // A gated pair's up matmul reads the gate matmul's A: one operand.
    let second_a = match &kernel.composition {
        Composition::Gemm(gemm) if gemm.gate.is_some() => {
            kernel.ops.get(usize::from(gemm.prologue.is_some()) + 2)
        }
        _ => None,
    };
    let mut external: Vec<TensorId> = kernel
        .ops
        .iter()
        .flat_map(|op| {
            let skip = usize::from(Some(op) == second_a);
            graph.op(*op).inputs.iter().skip(skip).copied()
        })
        .filter(|t| !inside.contains(t))
        .collect();
    let mut operands: Vec<TensorId> = kernel.inputs().collect();
    external.sort_unstable();
    operands.sort_unstable();
    if external != operands {
        return Err("its operands are not the tensors its ops read from other kernels".to_string());
    }
    let kinds: Vec<&OpKind> = kernel.ops.iter().map(|&op| &graph.op(op).kind).collect();
    match &kernel.composition {
        Composition::Gemm(gemm) => {
            let prologue = usize::from(gemm.prologue.is_some());
            let pair = if gemm.gate.is_some() { 3 } else { 0 };
            if kinds.len() != prologue + 1 + pair + gemm.epilogue.len() {
                return Err("its op count does not match its composition".to_string());
            }
            if gemm.epilogue.len() > super::matcher::MAX_EPILOGUE_STEPS {
                return Err(format!("its epilogue has {} steps", gemm.epilogue.len()));
            }
            if prologue == 1 && gemm.prologue != Norm::of_op(kinds[0]) {
                return Err("its prologue is not the norm it holds".to_string());
            }
            if !matches!(kinds[prologue], OpKind::MatMul { b_layout } if *b_layout == gemm.b_layout) {
                return Err("its mainloop op is not a matmul with its B layout".to_string());
            }
            if let Some(activation) = gemm.gate
                && (kinds[prologue + 1] != &OpKind::Activation(activation)
                    || !matches!(kinds[prologue + 2], OpKind::MatMul { b_layout } if *b_layout == gemm.b_layout)
                    || kinds[prologue + 3] != &OpKind::Mul
                    || kernel.operand(Role::Up).is_none())
            {
                return Err(
                    "its gated pair is not an activation, an up matmul and a mul with an up operand"
                        .to_string(),
                );
            }
            let steps: Vec<Option<EpilogueStep>> = kinds[prologue + 1 + pair..]
                .iter()
                .map(|k| EpilogueStep::of_op(k))
                .collect();
            if steps
                .iter()
                .zip(&gemm.epilogue)
                .any(|(op, step)| *op != Some(*step))
            {
                return Err("its epilogue steps are not the ops it holds".to_string());
            }
            if kernel.operand(Role::A).is_none() || kernel.operand(Role::B).is_none() {
                return Err("it lacks an A or B operand".to_string());
            }
        }
        Composition::Norm(norm) => {
            if kinds.len() != 1 || Norm::of_op(kinds[0]) != Some(*norm) {
                return Err("a standalone norm kernel must hold exactly its norm op".to_string());
            }
        }
        Composition::Elementwise(steps) => {
            if steps.is_empty() || steps.len() > super::matcher::MAX_EPILOGUE_STEPS {
                return Err(format!("its elementwise chain has {} steps", steps.len()));
            }
            if kinds.len() != steps.len()
                || kinds
                    .iter()
                    .zip(steps)
                    .any(|(op, step)| EpilogueStep::of_op(op) != Some(*step))
            {
                return Err("its elementwise steps are not the ops it holds".to_string());
            }
            // What the launcher's params take: x, then each step's operand
            // at that step's index.
            let roles: Vec<Role> = std::iter::once(Role::X)
                .chain(
                    steps
                        .iter()
                        .enumerate()
                        .filter_map(|(i, step)| step.operand_role(i)),
                )
                .collect();
            let first_input = graph.op(kernel.ops[0]).inputs[0];
            if kernel.operands.iter().map(|o| o.role).ne(roles)
                || kernel.operand(Role::X) != Some(first_input)
            {
                return Err(
                    "its operands are not x and one per step that reads one, in step order".to_string(),
                );
            }
        }
    }
    Ok(())
}

/// A gated GEMM's ops up to its mul: `[norm,] gate matmul, activation, up
/// matmul, mul`, each intermediate read once, by the op after it in the
/// pair (a norm's output by the two matmuls, as their A). Returns the index
/// of the mul, from which the rest is a linear chain.
fn check_gated_pair(graph: &Graph, index: &TensorIndex, kernel: &FusedKernel) -> Result<usize, String> {
    let first = usize::from(matches!(&kernel.composition, Composition::Gemm(g) if g.prologue.is_some()));
    if kernel.ops.len() < first + 4 {
        return Err("its gated pair lacks ops".to_string());
    }
    let [gate, activation, up, mul] = [0, 1, 2, 3].map(|i| kernel.ops[first + i]);
    let output = |op: OpId| graph.op(op).output;
    let (gate_op, up_op) = (graph.op(gate), graph.op(up));
    if gate_op.inputs[0] != up_op.inputs[0] {
        return Err("the two matmuls of its gated pair read different A".to_string());
    }
    // B is the gate matmul's weight and Up the up matmul's (a swap would
    // compute act(A @ W_up) * (A @ W_gate)), of one shape.
    let (w_gate, w_up) = (gate_op.inputs[1], up_op.inputs[1]);
    if kernel.operand(Role::B) != Some(w_gate)
        || kernel.operand(Role::Up) != Some(w_up)
        || graph.tensor(w_gate).shape != graph.tensor(w_up).shape
    {
        return Err(
            "its B and up operands are not its gate and up matmuls' weights of one shape".to_string(),
        );
    }
    if first == 1 {
        let a = output(kernel.ops[0]);
        if index.use_count(a) != 2 || gate_op.inputs[0] != a {
            return Err(fused_away(graph, a));
        }
    }
    for (t, reader) in [
        (output(gate), activation),
        (output(activation), mul),
        (output(up), mul),
    ] {
        if index.use_count(t) != 1 || index.uses(t) != [reader] {
            return Err(fused_away(graph, t));
        }
    }
    Ok(first + 3)
}

/// The error of an intermediate that a kernel keeps in registers although
/// something else reads it.
fn fused_away(graph: &Graph, t: TensorId) -> String {
    format!(
        "`{}` is fused away but is read elsewhere or is a graph output",
        graph.tensor(t).name
    )
}
