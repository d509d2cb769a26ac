//! The plan as text for a terminal (`fusion plan`): which kernels the graph
//! became, what each one reads and writes, and which tensors pass through
//! memory between them.

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

impl Plan {
    /// The block for one kernel: heading, ops, operands with roles, output.
    fn kernel_report(&self, index: usize, kernel: &FusedKernel) -> String {
        let graph = &self.graph;
        let kind = match &kernel.composition {
            Composition::Gemm(gemm) if gemm.pattern().is_some() => "named pattern",
            Composition::Gemm(_) => "composed GEMM",
            Composition::Norm(_) => "standalone norm",
            Composition::Elementwise(_) => "standalone elementwise",
        };
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
                if operand.role == Role::B && b_layout == Some(WeightLayout::NK) {
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
        out
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

#[cfg(test)]
mod tests {
    use crate::fuse::plan;
    use crate::ir::{DType, GraphBuilder, WeightLayout};

    #[test]
    fn report_of_a_gpt2_mlp() {
        let mut b = GraphBuilder::new("gpt2_mlp");
        let m = b.dynamic_dim("M").unwrap();
        let d = b.static_dim("D", 768).unwrap();
        let f = b.static_dim("F", 3072).unwrap();
        let x = b.input("x", DType::F16, &[m, d]).unwrap();
        let ln_g = b.weight("ln_g", DType::F16, &[d]).unwrap();
        let ln_b = b.weight("ln_b", DType::F16, &[d]).unwrap();
        let w_fc = b.weight("w_fc", DType::F16, &[f, d]).unwrap();
        let b_fc = b.weight("b_fc", DType::F16, &[f]).unwrap();
        let w_proj = b.weight("w_proj", DType::F16, &[f, d]).unwrap();
        let b_proj = b.weight("b_proj", DType::F16, &[d]).unwrap();
        let normed = b.layernorm(x, ln_g, ln_b, 1e-5).unwrap();
        let fc = b.matmul(normed, w_fc, WeightLayout::NK).unwrap();
        let fc = b.bias_add(fc, b_fc).unwrap();
        let h = b.gelu(fc).unwrap();
        b.name(h, "h").unwrap();
        let proj = b.matmul(h, w_proj, WeightLayout::KN).unwrap();
        let proj = b.bias_add(proj, b_proj).unwrap();
        let y = b.add(proj, x).unwrap();
        b.output("y", y).unwrap();
        let text = plan(b.build().unwrap()).to_string();
        let expected = "\
graph `gpt2_mlp`: 7 ops → 2 kernels

#0  layernorm_gemm_bias_gelu  (composed GEMM)
    ops    layernorm → %1, matmul → %2, bias_add → %3, gelu → h
    A      x     f16[M, 768]
    B      w_fc  f16[3072, 768], read transposed
    gamma  ln_g  f16[768]
    beta   ln_b  f16[768]
    bias   b_fc  f16[3072]
    out    h     f16[M, 3072]

#1  gemm_bias_residual  (named pattern)
    ops       matmul → %5, bias_add → %6, add → y
    A         h       f16[M, 3072]
    B         w_proj  f16[3072, 768]
    bias      b_proj  f16[768]
    residual  x       f16[M, 768]
    out       y       f16[M, 768]

between kernels (written to memory, read back):
  h  f16[M, 3072]  #0 → #1
";
        assert_eq!(text, expected, "\n{text}");
    }
}
