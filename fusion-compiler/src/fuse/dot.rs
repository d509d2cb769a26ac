//! The plan as a Graphviz `digraph` (`fusion plan --dot`): one cluster per
//! kernel holding its ops, the tensors that live in memory (inputs, weights,
//! and what kernels write) as nodes outside the clusters, and an edge for
//! every read. Render with `dot -Tsvg plan.dot -o plan.svg`.

use super::plan::{Plan, Role};
use crate::ir::{OpId, TensorId, TensorKind};

/// Writes the plan in the DOT language.
pub fn write(plan: &Plan) -> String {
    let graph = &plan.graph;
    let mut out = String::new();
    let mut line = |text: String| {
        out.push_str(&text);
        out.push('\n');
    };
    line(format!("digraph {} {{", quote(&[&graph.name])));
    let title = format!(
        "{}: {} ops → {} kernels",
        graph.name,
        graph.ops.len(),
        plan.kernels.len()
    );
    line(format!(
        "  graph [label={}, labelloc=t, fontname=\"Helvetica\", rankdir=TB];",
        quote(&[&title])
    ));
    line("  node [fontname=\"Helvetica\", fontsize=11];".to_string());
    line("  edge [fontname=\"Helvetica\", fontsize=9];".to_string());

    // Tensors in memory: what the caller passes in and what kernels write.
    let in_memory: Vec<TensorId> = graph
        .inputs
        .iter()
        .chain(&graph.weights)
        .copied()
        .chain(plan.kernels.iter().map(|k| k.output))
        .collect();
    for &t in &in_memory {
        let desc = graph.tensor(t);
        let style = match desc.kind {
            TensorKind::Input => "shape=ellipse",
            TensorKind::Weight => "shape=box, style=\"rounded,dashed\"",
            TensorKind::Output => "shape=ellipse, penwidth=2",
            TensorKind::Intermediate => "shape=ellipse, style=dotted",
        };
        line(format!(
            "  {} [label={}, {style}];",
            tensor_node(t),
            quote(&[&desc.name, &graph.type_string(t)])
        ));
    }

    for (i, kernel) in plan.kernels.iter().enumerate() {
        line(format!("  subgraph cluster_{i} {{"));
        line(format!(
            "    label={};",
            quote(&[&format!("#{i} {}", kernel.name)])
        ));
        line("    style=\"rounded,filled\"; fillcolor=\"#eef3fb\"; color=\"#6b8cc7\";".to_string());
        for &op in &kernel.ops {
            line(format!(
                "    {} [label={}, shape=box, style=filled, fillcolor=white];",
                op_node(op),
                quote(&[graph.op(op).kind.name()])
            ));
        }
        line("  }".to_string());
    }

    let index = graph.index();
    for kernel in &plan.kernels {
        for &op in &kernel.ops {
            for &t in &graph.op(op).inputs {
                match index.producer(t).filter(|p| kernel.ops.contains(p)) {
                    // Fused away: the value stays in registers inside the kernel.
                    Some(producer) => line(format!(
                        "  {} -> {} [label={}];",
                        op_node(producer),
                        op_node(op),
                        quote(&[&graph.tensor(t).name])
                    )),
                    None => {
                        let role = kernel.operands.iter().find(|o| o.tensor == t).map(|o| o.role);
                        let style = if role == Some(Role::B) {
                            " [style=bold]"
                        } else {
                            ""
                        };
                        line(format!("  {} -> {}{style};", tensor_node(t), op_node(op)));
                    }
                }
            }
        }
        let last = *kernel.ops.last().expect("a kernel has ops");
        line(format!("  {} -> {};", op_node(last), tensor_node(kernel.output)));
    }
    line("}".to_string());
    out
}

fn tensor_node(t: TensorId) -> String {
    format!("t{}", t.0)
}

fn op_node(op: OpId) -> String {
    format!("op{}", op.0)
}

/// A DOT quoted string of one or more lines: quotes and backslashes are
/// escaped, and each line ends in a centred line break.
fn quote(lines: &[&str]) -> String {
    let escaped: Vec<String> = lines
        .iter()
        .map(|l| {
            let mut s = String::with_capacity(l.len());
            for c in l.chars() {
                match c {
                    '"' => s.push_str("\\\""),
                    '\\' => s.push_str("\\\\"),
                    '\n' => s.push_str("\\n"),
                    '\r' => {}
                    c => s.push(c),
                }
            }
            s
        })
        .collect();
    format!("\"{}\"", escaped.join("\\n"))
}

#[cfg(test)]
mod tests {
    use super::quote;

    #[test]
    fn quote_escapes_quotes_backslashes_and_line_breaks() {
        assert_eq!(quote(&["a\"b\\c"]), r#""a\"b\\c""#);
        assert_eq!(quote(&["x", "f16[M, 64]"]), r#""x\nf16[M, 64]""#);
        assert_eq!(quote(&["two\nlines"]), r#""two\nlines""#);
    }
}
