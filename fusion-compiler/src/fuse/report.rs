//! The plan as text for a terminal (`fusion plan`) and as JSON (`fusion plan
//! --json`): which kernels the graph became, what each one reads and writes,
//! and which tensors pass through memory between them.

use super::plan::{Composition, FusedKernel, Plan, Role};
use crate::ir::WeightLayout;
use std::fmt::{self, Write as _};

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let graph = &self.graph;
        writeln!(
            f,
            "graph `{}`: {} → {}",
            graph.name,
            count(graph.ops.len(), "op"),
            count(self.kernels.len(), "kernel")
        )?;
        for (i, kernel) in self.kernels.iter().enumerate() {
            writeln!(f)?;
            f.write_str(&self.kernel_report(i, kernel))?;
        }
        for split in &self.splits {
            writeln!(f)?;
            writeln!(
                f,
                "not fused: {} runs as {} and kernels of its own, because it loses to that split ({}: {})",
                split.refused, split.kept, split.origin, split.reason
            )?;
        }
        writeln!(f)?;
        let crossing = self.crossing_tensors();
        if crossing.is_empty() {
            return writeln!(f, "no tensor passes between kernels");
        }
        writeln!(f, "between kernels (written to memory, read back):")?;
        let rows: Vec<Vec<String>> = crossing
            .iter()
            .map(|c| {
                let readers: Vec<String> = c.consumers.iter().map(|k| format!("#{k}")).collect();
                let mut flow = format!("#{} → {}", c.producer, readers.join(", "));
                if c.is_graph_output {
                    flow.push_str("  (also a graph output)");
                }
                vec![
                    graph.tensor(c.tensor).name.clone(),
                    graph.type_string(c.tensor),
                    flow,
                ]
            })
            .collect();
        f.write_str(&table(&rows, "  "))
    }
}

/// What kind of kernel it is, for reports.
fn kind_name(kernel: &FusedKernel) -> &'static str {
    match &kernel.composition {
        Composition::Gemm(gemm) if gemm.pattern().is_some() => "named pattern",
        Composition::Gemm(_) => "composed GEMM",
        Composition::Norm(_) => "standalone norm",
        Composition::Elementwise(_) => "standalone elementwise",
    }
}

impl Plan {
    /// The plan as data (`fusion plan --json`): each kernel with its ops,
    /// operands by role, output and, for a GEMM with a norm, whether the
    /// norm folds into its weight; then the tensors that pass through memory
    /// between kernels. The same facts as the text report.
    pub fn to_json(&self) -> serde_json::Value {
        let graph = &self.graph;
        let tensor = |t: crate::ir::TensorId| serde_json::json!({ "name": graph.tensor(t).name, "type": graph.type_string(t) });
        let kernels: Vec<serde_json::Value> = self
            .kernels
            .iter()
            .enumerate()
            .map(|(index, kernel)| {
                let ops: Vec<serde_json::Value> = kernel
                    .ops
                    .iter()
                    .map(|&op| {
                        let op = graph.op(op);
                        serde_json::json!({ "op": op.kind.name(), "output": graph.tensor(op.output).name })
                    })
                    .collect();
                let operands: Vec<serde_json::Value> = kernel
                    .operands
                    .iter()
                    .map(|o| {
                        let mut t = tensor(o.tensor);
                        t["role"] = o.role.name().into();
                        t
                    })
                    .collect();
                let (norm, gate) = match &kernel.composition {
                    Composition::Gemm(gemm) => (
                        gemm.prologue.map(|p| {
                            serde_json::json!({ "kind": p.kind.name(), "folds_when_bound": kernel.norm_foldable(graph) })
                        }),
                        gemm.gate.map(|a| a.def().name),
                    ),
                    _ => (None, None),
                };
                serde_json::json!({
                    "index": index,
                    "name": kernel.name,
                    "kind": kind_name(kernel),
                    "ops": ops,
                    "operands": operands,
                    "output": tensor(kernel.output),
                    "norm": norm,
                    "gate": gate,
                })
            })
            .collect();
        let between: Vec<serde_json::Value> = self
            .crossing_tensors()
            .iter()
            .map(|c| {
                let mut t = tensor(c.tensor);
                t["producer"] = c.producer.into();
                t["consumers"] = c.consumers.clone().into();
                t["graph_output"] = c.is_graph_output.into();
                t
            })
            .collect();
        let splits: Vec<serde_json::Value> = self
            .splits
            .iter()
            .map(|s| serde_json::json!({ "refused": s.refused, "kept": s.kept, "reason": s.reason, "origin": s.origin }))
            .collect();
        serde_json::json!({
            "graph": graph.name,
            "ops": graph.ops.len(),
            "kernels": kernels,
            "between_kernels": between,
            "not_fused": splits,
        })
    }

    /// The block for one kernel: heading, ops, operands with roles, output.
    fn kernel_report(&self, index: usize, kernel: &FusedKernel) -> String {
        let graph = &self.graph;
        let kind = kind_name(kernel);
        let mut out = format!("#{index}  {}  ({kind})\n", kernel.name);
        let ops: Vec<String> = kernel
            .ops
            .iter()
            .map(|&op| {
                let op = graph.op(op);
                format!("{} → {}", op.kind.name(), graph.tensor(op.output).name)
            })
            .collect();
        let b_layout = match &kernel.composition {
            Composition::Gemm(gemm) => Some(gemm.b_layout),
            _ => None,
        };
        let mut rows: Vec<Vec<String>> = kernel
            .operands
            .iter()
            .map(|operand| {
                let mut ty = graph.type_string(operand.tensor);
                if matches!(operand.role, Role::B | Role::Up) && b_layout == Some(WeightLayout::NK) {
                    ty.push_str(", read transposed");
                }
                vec![
                    operand.role.name().to_string(),
                    graph.tensor(operand.tensor).name.clone(),
                    ty,
                ]
            })
            .collect();
        rows.push(vec![
            "out".to_string(),
            graph.tensor(kernel.output).name.clone(),
            graph.type_string(kernel.output),
        ]);
        // The ops line shares the label column of the operand table below.
        let label_width = rows.iter().map(|r| r[0].len()).max().unwrap_or(0);
        writeln!(out, "    {:label_width$}  {}", "ops", ops.join(", ")).expect("writing to a String");
        out.push_str(&table(&rows, "    "));
        if let Composition::Gemm(gemm) = &kernel.composition
            && let Some(prologue) = gemm.prologue
        {
            out.push_str(&norm_note(prologue.kind.name(), kernel.norm_foldable(graph)));
        }
        if let Composition::Gemm(gemm) = &kernel.composition
            && let Some(activation) = gemm.gate
        {
            out.push_str(&format!(
                "    gated: one GEMM over B and up interleaved in blocks of 8 output columns when the graph struct \
                 binds the weights (per call by the free function); {}(gate) * up in registers, \
                 the two [M, N] projections never written\n",
                activation.def().name
            ));
        }
        out
    }
}

/// How a GEMM's norm runs: folded into its weight when the struct binds
/// the weights, else (and always from the free function) as the unfused
/// split, which a norm worked into every stage of the mainloop lost to.
fn norm_note(norm: &str, foldable: bool) -> String {
    if foldable {
        format!(
            "    {norm}: folded into B when the graph struct binds the weights (new): B' = B·diag(gamma), \
             row statistics in a pass over A, the correction in the epilogue; the free function, \
             given gamma per call, normalizes A into scratch and runs the plain GEMM\n"
        )
    } else {
        format!(
            "    {norm}: gamma or beta is not a weight, so it cannot be folded: A is normalized into \
             scratch, then the plain GEMM (fused into the mainloop it measured slower than that split)\n"
        )
    }
}

/// `1 op`, `7 ops`.
fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// Rows with each column padded to its widest cell, two spaces apart.
fn table(rows: &[Vec<String>], indent: &str) -> String {
    let columns = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..columns)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let mut line = indent.to_string();
        for (c, cell) in row.iter().enumerate() {
            if c + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(widths[c] - cell.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
