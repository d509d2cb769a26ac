//! Graphs far deeper or longer than real ones: the front end and the planner
//! answer each with a plan or a located error, never a stack overflow, and
//! in time linear in the size of the file.
//!
//! Test threads have smaller stacks than a program's main thread, so a pass
//! that recursed once per term or per `[compute]` entry would abort here.

use fusion_compiler::diagnostic::{MAX_RENDERED, SourceFile};
use fusion_compiler::fuse;
use fusion_compiler::syntax::{MAX_NESTING, parse_tokens, parse_toml};
use fusion_compiler::{graph_from_source, ir};
use proc_macro2::TokenStream;
use std::str::FromStr;

const HEADER: &str = "[graph]\nname = \"g\"\n\n[dims]\nM = \"dyn\"\nD = 64\n\n[inputs]\nx = \"f16[M, D]\"\n\n\
                      [weights]\nw = \"f16[D, D]\"\n\n";

fn source(tables: &str) -> SourceFile {
    SourceFile::new("g.toml", format!("{HEADER}{tables}"))
}

/// `[outputs]` with one output `y = "<expr>"`.
fn with_output(expr: &str) -> SourceFile {
    source(&format!("[outputs]\ny = \"{expr}\"\n"))
}

/// Parses, lowers and plans; the plan's report, or the rendered errors.
fn plan(source: &SourceFile) -> Result<String, String> {
    let graph = graph_from_source(source)?;
    Ok(fuse::plan(graph).to_string())
}

fn nested(open: &str, inner: &str, close: &str, depth: usize) -> String {
    format!("{}{inner}{}", open.repeat(depth), close.repeat(depth))
}

#[test]
fn parentheses_nest_up_to_the_limit_and_past_it_are_a_located_error() {
    let deep_enough = with_output(&nested("(", "x @ w", ")", MAX_NESTING));
    plan(&deep_enough).unwrap();

    let too_deep = with_output(&nested("(", "x @ w", ")", 5_000));
    let error = plan(&too_deep).unwrap_err();
    assert!(
        error.contains(&format!(
            "g.toml:15:{}: error: brackets nest more than {MAX_NESTING} deep",
            6 + MAX_NESTING
        )),
        "{error}"
    );
}

#[test]
fn calls_nested_ten_thousand_deep_are_a_located_error() {
    let error = plan(&with_output(&nested("relu(", "x @ w", ")", 10_000))).unwrap_err();
    // At the `(` of the call one past the limit.
    let column = 6 + MAX_NESTING * 5 + 4;
    assert!(
        error.contains(&format!("g.toml:15:{column}: error: brackets nest more than")),
        "{error}"
    );
    let error = parse_tokens(
        TokenStream::from_str(&format!(
            "graph g {{ output y = {}; }}",
            nested("relu(", "x", ")", 10_000)
        ))
        .unwrap(),
    )
    .unwrap_err();
    assert!(error.to_string().contains("nest more than"), "{error}");
}

#[test]
fn a_flat_sum_of_twenty_thousand_terms_plans() {
    let terms = vec!["x"; 20_000].join(" + ");
    let report = plan(&with_output(&format!("({terms}) @ w"))).unwrap();
    assert!(
        report.starts_with("graph `g`: 20000 ops → "),
        "{}",
        &report[..100]
    );
    // So does its Graphviz drawing (`fusion plan --dot`): one edge per read.
    // The 19,999 adds chain four to a kernel, 5,000 kernels, and the GEMM
    // is one more; each op reads two tensors (from memory or from the op
    // before it), each kernel writes one.
    let graph = graph_from_source(&with_output(&format!("({terms}) @ w"))).unwrap();
    let plan = fuse::plan(graph);
    assert_eq!(plan.kernels.len(), 5_001);
    let dot = fuse::dot::write(&plan);
    assert_eq!(dot.matches(" -> ").count(), 2 * 20_000 + 5_001);
    // The macro's tokens go through the same loops.
    let decl =
        parse_tokens(TokenStream::from_str(&format!("graph g {{ output y = {terms}; }}")).unwrap()).unwrap();
    assert_eq!(decl.bindings.len(), 1);
}

#[test]
fn long_operator_chains_of_every_kind_return() {
    // A chain of matmuls, one of products and one of transposes (refused:
    // `^T` only reads a matmul's right operand, but the tree is as deep).
    let matmuls = format!("x{}", " @ w".repeat(5_000));
    let report = plan(&with_output(&matmuls)).unwrap();
    assert!(
        report.starts_with("graph `g`: 5000 ops → 5000 kernels"),
        "{}",
        &report[..100]
    );
    let products = format!("(x @ w){}", " * x".repeat(20_000));
    assert!(
        plan(&with_output(&products))
            .unwrap()
            .starts_with("graph `g`: 20001 ops")
    );
    let transposes = format!("x @ w{}", "^T".repeat(20_000));
    let error = plan(&with_output(&transposes)).unwrap_err();
    assert!(
        error.contains("`^T` is only allowed on the right operand of `@`"),
        "{error}"
    );
}

#[test]
fn twenty_thousand_outputs_plan() {
    let outputs: String = (0..20_000).map(|i| format!("y{i} = \"relu(x @ w)\"\n")).collect();
    let report = plan(&source(&format!("[outputs]\n{outputs}"))).unwrap();
    assert!(
        report.starts_with("graph `g`: 40000 ops → 20000 kernels"),
        "{}",
        &report[..100]
    );
}

/// `c0` reads `c1`, which reads `c2`, ...: each entry needs the next one, so
/// lowering them in file order needs the whole chain resolved first.
fn compute_chain(count: usize, last: &str) -> SourceFile {
    let mut compute: String = (0..count - 1)
        .map(|i| format!("c{i} = \"relu(c{})\"\n", i + 1))
        .collect();
    compute.push_str(&format!("c{} = \"relu({last})\"\n", count - 1));
    source(&format!("[compute]\n{compute}\n[outputs]\ny = \"c0 @ w\"\n"))
}

#[test]
fn ten_thousand_compute_entries_in_reverse_order_plan() {
    let report = plan(&compute_chain(10_000, "x")).unwrap();
    assert!(report.starts_with("graph `g`: 10001 ops"), "{}", &report[..100]);
    let graph = graph_from_source(&compute_chain(10_000, "x")).unwrap();
    assert_eq!(
        graph.tensor(graph.ops[0].output).name,
        "c9999",
        "dependencies first"
    );
}

#[test]
fn a_cycle_ten_thousand_entries_long_is_reported_once_with_its_ends() {
    let source = compute_chain(10_000, "c0 + x");
    let decl = parse_toml(&source).unwrap();
    let errors = ir::lower(&decl).unwrap_err();
    assert_eq!(errors.0.len(), 1, "{errors}");
    let message = &errors.0[0].message;
    // 10,001 names: the first and last 8 are shown.
    assert_eq!(
        message,
        "cycle: c0 → c1 → c2 → c3 → c4 → c5 → c6 → c7 → … (9985 more) … → \
         c9993 → c9994 → c9995 → c9996 → c9997 → c9998 → c9999 → c0"
    );
}

#[test]
fn thousands_of_errors_render_the_first_few_and_a_count() {
    let outputs: String = (0..20_000).map(|i| format!("y{i} = \"relu(q)\"\n")).collect();
    let error = plan(&source(&format!("[outputs]\n{outputs}"))).unwrap_err();
    assert_eq!(error.matches("error: `q` is not defined").count(), MAX_RENDERED);
    assert!(
        error.ends_with(&format!(
            "g.toml: error: {} more errors not shown",
            20_000 - MAX_RENDERED
        )),
        "{}",
        &error[error.len() - 100..]
    );
}

/// Rendering and the wrappers are linear too (20,000 kernels took 3.4 times
/// as long as 5,000 in a debug build); a few thousand keep the test quick.
#[test]
fn the_wrappers_of_thousands_of_kernels_render() {
    const KERNELS: usize = 2_000;
    use fusion_compiler::codegen::{self, GraphSpec};
    use fusion_compiler::ir::DType;
    use fusion_compiler::select::Arch;
    let outputs: String = (0..KERNELS)
        .map(|i| format!("y{i} = \"relu(x @ w)\"\n"))
        .collect();
    let graph = graph_from_source(&source(&format!("[outputs]\n{outputs}"))).unwrap();
    let spec = GraphSpec {
        plan: fuse::plan(graph),
        dtypes: vec![DType::F16],
        origin: "g.toml".to_string(),
        fingerprint: None,
        declaration: String::new(),
    };
    let library = codegen::render("k", &[Arch::Sm80], &[spec]).unwrap();
    assert_eq!(library.units.len(), 1, "one distinct kernel");
    let rust = codegen::wrappers::generate(&library, true, "/out/ffi.rs");
    // One entry per kernel in the graph's plan table.
    assert_eq!(rust.matches("KernelEntry {").count(), KERNELS);
}
