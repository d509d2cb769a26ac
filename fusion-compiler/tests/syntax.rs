//! The two front ends of `fusion_compiler::syntax`: they agree with each other,
//! every shipped graph parses and lowers, and every kind of mistake is
//! reported at the right file, line and column.

use fusion_compiler::diagnostic::{SourceFile, Span};
use fusion_compiler::syntax::{parse_tokens, parse_toml};
use fusion_compiler::{graph_from_source, ir};
use proc_macro2::TokenStream;
use quote::quote;
use std::path::PathBuf;
use std::str::FromStr;

fn graphs_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../graphs")
}

#[test]
fn toml_and_macro_front_ends_agree_on_swiglu() {
    let source = SourceFile::read(&graphs_dir().join("swiglu_ffn.toml")).unwrap();
    let from_toml = parse_toml(&source).unwrap();
    let from_tokens = parse_tokens(quote! {
        /// Llama-3-8B SwiGLU feed-forward block: bias on the down projection, residual add.
        pub graph swiglu_ffn {
            dims { M: dyn, D: 4096, F: 14336 }
            input x: f16[M, D];
            weight w_gate: f16[F, D], w_up: f16[F, D], w_down: f16[D, F], b_down: f16[D];
            let gate = silu(x @ w_gate^T);
            let h = gate * (x @ w_up^T);
            output y = h @ w_down^T + b_down + x;
        }
    })
    .unwrap();
    assert_eq!(from_toml, from_tokens);
    assert_eq!(from_toml.tensors.len(), 5);
    assert_eq!(from_toml.bindings.len(), 3);
    // A difference in content is seen (spans are ignored, content is not).
    let other = parse_tokens(quote! {
        graph swiglu_ffn {
            dims { M: dyn, D: 4096, F: 14336 }
            input x: f16[M, D];
            weight w_gate: f16[F, D], w_up: f16[F, D], w_down: f16[D, F], b_down: f16[D];
            let gate = silu(x @ w_gate^T);
            let h = gate * (x @ w_up^T);
            output y = h @ w_down^T + x + b_down;
        }
    })
    .unwrap();
    assert_ne!(from_toml, other);
}

#[test]
fn sigmoid_and_gelu_quick_parse_alike_from_toml_and_macro() {
    let toml = r#"[graph]
name = "heads"

[dims]
M = "dyn"
N = 64

[inputs]
x = "f16[M, N]"

[weights]
w = "f16[N, N]"
b = "f16[N]"

[outputs]
y = "gelu_quick(sigmoid(x @ w^T + b))"
"#;
    let from_toml = parse_toml(&SourceFile::new("heads.toml", toml)).unwrap();
    let from_tokens = parse_tokens(quote! {
        graph heads {
            dims { M: dyn, N: 64 }
            input x: f16[M, N];
            weight w: f16[N, N], b: f16[N];
            output y = gelu_quick(sigmoid(x @ w^T + b));
        }
    })
    .unwrap();
    assert_eq!(from_toml, from_tokens);
    let graph = ir::lower(&from_tokens).unwrap();
    let ops: Vec<&str> = graph.ops.iter().map(|op| op.kind.name()).collect();
    assert_eq!(ops, ["matmul", "bias_add", "sigmoid", "gelu_quick"]);
    assert!(
        matches!(graph.ops[2].kind, ir::OpKind::Activation(a) if a == ir::Activation::named("sigmoid").unwrap())
    );
    // Both take one argument and no keywords, from the same table.
    assert_toml_error(
        &edit("gelu(x @ w^T + b)", "sigmoid(x @ w^T, b)"),
        "sigmoid(",
        &["`sigmoid` takes 1 argument, got 2"],
    );
    assert_macro_error(
        "gelu(x @ w^T + b)",
        "gelu_quick(x @ w^T + b, eps = 1e-5)",
        "5:40",
        &["`gelu_quick` has no argument `eps`: it takes none"],
    );
}

#[test]
fn swiglu_lowers_to_seven_ops() {
    let graph = fusion_compiler::load_toml_graph(&graphs_dir().join("swiglu_ffn.toml")).unwrap();
    assert_eq!(graph.ops.len(), 7, "{graph:#?}");
}

#[test]
fn every_shipped_graph_parses_and_lowers() {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(graphs_dir()).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "toml") {
            continue;
        }
        let source = SourceFile::read(&path).unwrap();
        let decl = parse_toml(&source).unwrap_or_else(|e| panic!("{}", e.render(&source)));
        let graph = ir::lower(&decl).unwrap_or_else(|e| panic!("{}", e.render(&source)));
        assert_eq!(
            path.file_stem().unwrap().to_str().unwrap(),
            graph.name,
            "a shipped graph's file is named after it"
        );
        assert!(
            source.text.starts_with("# "),
            "{} starts with a comment",
            path.display()
        );
        names.push(graph.name);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "ffn_sublayer",
            "gelu_mul",
            "gelu_quick",
            "gemm",
            "gemm_bias",
            "gemm_bias_gelu",
            "gemm_bias_gelu_erf",
            "gemm_bias_relu",
            "gemm_bias_residual",
            "gemm_bias_sigmoid",
            "gemm_bias_silu",
            "gemm_gelu",
            "gemm_gelu_glu",
            "gemm_gelu_quick",
            "gemm_residual",
            "gemm_silu",
            "gemm_silu_glu",
            "gpt2_mlp",
            "layernorm",
            "layernorm_gemm",
            "layernorm_gemm_silu_glu_residual",
            "llama_ffn",
            "mul",
            "rmsnorm",
            "rmsnorm_eps1e5",
            "rmsnorm_gemm",
            "sigmoid",
            "silu",
            "silu_mul",
            "swiglu_ffn",
        ]
    );
}

// ---- errors in TOML files -------------------------------------------------

const BASE: &str = r#"[graph]
name = "g"

[dims]
M = "dyn"
K = 64
N = 32

[inputs]
x = "f16[M, K]"

[weights]
w = "f16[N, K]"
b = "f16[N]"

[outputs]
y = "gelu(x @ w^T + b)"
"#;

/// BASE with one piece replaced (which must be there).
fn edit(from: &str, to: &str) -> String {
    assert!(BASE.contains(from), "BASE has no `{from}`");
    BASE.replacen(from, to, 1)
}

/// Parses and lowers; returns the rendered error.
fn toml_error(text: &str) -> String {
    match graph_from_source(&SourceFile::new("g.toml", text)) {
        Ok(_) => panic!("expected an error for:\n{text}"),
        Err(rendered) => rendered,
    }
}

/// `g.toml:line:col` of `needle` in `text`, where it must occur once. A `|`
/// in the needle marks the position within it (else its start).
fn at(text: &str, needle: &str) -> String {
    let (before, after) = needle.split_once('|').unwrap_or(("", needle));
    let whole = format!("{before}{after}");
    assert_eq!(text.matches(&whole).count(), 1, "`{whole}` is not unique");
    let offset = text.find(&whole).unwrap() + before.len();
    let at = SourceFile::new("g.toml", text).line_col(offset);
    format!("g.toml:{}:{}", at.line, at.column)
}

/// The error is at `needle`'s position and says every one of `words`.
fn assert_toml_error(text: &str, needle: &str, words: &[&str]) {
    let rendered = toml_error(text);
    let location = format!("{}: error: ", at(text, needle));
    assert!(
        rendered.contains(&location),
        "expected an error at {location}\ngot:\n{rendered}"
    );
    for word in words {
        assert!(rendered.contains(word), "expected `{word}` in:\n{rendered}");
    }
}

#[test]
fn base_graph_is_valid() {
    graph_from_source(&SourceFile::new("g.toml", BASE)).unwrap();
}

#[test]
fn malformed_toml_is_reported_where_the_toml_parser_stopped() {
    let text = edit("x = \"f16[M, K]\"", "x = \"f16[M, K]");
    let rendered = toml_error(&text);
    assert!(rendered.starts_with("g.toml:10:"), "{rendered}");
    let text = edit("[weights]", "[weights");
    let rendered = toml_error(&text);
    assert!(rendered.starts_with("g.toml:12:"), "{rendered}");
}

#[test]
fn unknown_key_and_table_are_errors_at_the_key() {
    let text = edit("name = \"g\"", "name = \"g\"\nauthor = \"me\"");
    assert_toml_error(&text, "author", &["unknown field `author`"]);
    let text = edit("[weights]", "[weight]");
    assert_toml_error(&text, "weight]", &["unknown field `weight`"]);
    // Pinned once by hand, so `at` itself is checked.
    assert!(toml_error(&text).starts_with("g.toml:12:2: error: "));
}

#[test]
fn missing_outputs_table_is_an_error() {
    let text = BASE.split("[outputs]").next().unwrap();
    let rendered = toml_error(text);
    assert!(rendered.contains("missing field `outputs`"), "{rendered}");
    assert!(rendered.contains("note: a graph file needs"), "{rendered}");
    let text = edit("name = \"g\"", "");
    let rendered = toml_error(&text);
    assert!(rendered.contains("missing field `name`"), "{rendered}");
}

#[test]
fn unknown_op_is_reported_at_its_name() {
    let text = edit("gelu(x @ w^T + b)", "silux(x @ w^T + b)");
    assert_toml_error(&text, "silux", &["unknown op `silux`", "known ops:"]);
    assert!(toml_error(&text).starts_with("g.toml:17:6: error: "));
}

#[test]
fn wrong_arity_is_reported_at_the_call() {
    let text = edit("gelu(x @ w^T + b)", "gelu(x @ w^T, b)");
    assert_toml_error(&text, "gelu", &["`gelu` takes 1 argument, got 2"]);
}

#[test]
fn shape_mismatch_is_reported_at_the_matmul() {
    let text = edit("gelu(x @ w^T + b)", "gelu(x @ w + b)");
    assert_toml_error(&text, "x @ w", &["shape mismatch in matmul"]);
}

#[test]
fn dtype_mismatch_is_reported_at_the_add() {
    let text = edit("b = \"f16[N]\"", "b = \"f32[N]\"");
    assert_toml_error(&text, "x @ w^T + b", &["dtype mismatch in bias add"]);
}

#[test]
fn undefined_name_is_reported_at_the_name() {
    let text = edit("gelu(x @ w^T + b)", "gelu(x @ v^T + b)");
    assert_toml_error(&text, "v^T", &["`v` is not defined"]);
}

#[test]
fn name_defined_twice_points_at_both() {
    let text = edit("[outputs]", "[compute]\nb = \"gelu(x)\"\n\n[outputs]");
    assert_toml_error(
        &text,
        "b = \"gelu",
        &["`b` is defined twice", "first defined at g.toml:14:1"],
    );
}

#[test]
fn cycle_is_reported_with_its_path() {
    let text = edit(
        "[outputs]\ny = \"gelu(x @ w^T + b)\"",
        "[compute]\na = \"b2 * x\"\nb2 = \"a * x\"\n\n[outputs]\ny = \"gelu(a @ w^T + b)\"",
    );
    let rendered = toml_error(&text);
    assert!(rendered.contains("cycle: a → b2 → a"), "{rendered}");
    assert!(
        rendered.contains(&format!("{}: error: ", at(&text, "a * x"))),
        "{rendered}"
    );
}

#[test]
fn undeclared_dim_is_reported_at_its_use() {
    let text = edit("x = \"f16[M, K]\"", "x = \"f16[M, Q]\"");
    assert_toml_error(&text, "Q]", &["dim `Q` is not declared"]);
}

#[test]
fn dim_of_zero_is_reported_at_the_value() {
    let text = edit("K = 64", "K = 0");
    assert_toml_error(&text, "0\n", &["dim `K` is 0", "at least 1"]);
    let text = edit("x = \"f16[M, K]\"", "x = \"f16[M, 0]\"");
    assert_toml_error(&text, "0]", &["a dim of size 0"]);
}

#[test]
fn bad_dim_values_are_reported_at_the_value() {
    for bad in ["\"big\"", "4.5", "true", "[1]"] {
        let text = edit("K = 64", &format!("K = {bad}"));
        assert_toml_error(&text, bad, &["dims are an integer size or \"dyn\""]);
    }
    let text = edit("K = 64", "K = -4");
    assert_toml_error(&text, "-4", &["dim `K` is -4"]);
}

#[test]
fn unknown_dtype_is_reported_at_the_dtype() {
    let text = edit("w = \"f16[N, K]\"", "w = \"f17[N, K]\"");
    assert_toml_error(&text, "f17", &["unknown dtype `f17`"]);
}

#[test]
fn transpose_outside_a_matmul_is_an_error() {
    let text = edit("gelu(x @ w^T + b)", "gelu(x @ w^T + b^T)");
    assert_toml_error(
        &text,
        "b^T",
        &["`^T` is only allowed on the right operand of `@`"],
    );
}

#[test]
fn syntax_errors_in_expression_strings_point_into_the_string() {
    let text = edit("gelu(x @ w^T + b)", "gelu(x @ w^T - b)");
    assert_toml_error(&text, "- b", &["unexpected `-`: expressions use + * @ and calls"]);
    let text = edit("gelu(x @ w^T + b)", "gelu(x @ w^2 + b)");
    assert_toml_error(&text, "2 + b", &["expected `T` after `^`"]);
    // Nothing after `+`: the error is at the closing quote.
    let text = edit("\"gelu(x @ w^T + b)\"", "\"x @ w^T +\"");
    assert_toml_error(&text, "+|\"", &["expected an expression after `+`"]);
    let text = edit("gelu(x @ w^T + b)", "gelu(x @ w^T + b) x");
    assert_toml_error(
        &text,
        "x\"",
        &["expected an operator (+ * @) or the end of the expression"],
    );
    let text = edit("gelu(x @ w^T + b)", "gelu(x @ w^T + 2)");
    assert_toml_error(&text, "2)", &["unexpected `2`", "keyword arguments"]);
    let text = edit("gelu(x @ w^T + b)", "gelu(x @ w^T + b, eps = 1e-5, b)");
    assert_toml_error(
        &text,
        "b)",
        &["positional arguments come before keyword arguments"],
    );
}

#[test]
fn syntax_errors_in_type_strings_point_into_the_string() {
    let text = edit("x = \"f16[M, K]\"", "x = \"f16(M, K)\"");
    assert_toml_error(&text, "(M", &["expected `[` and the dims after the dtype"]);
    let text = edit("x = \"f16[M, K]\"", "x = \"f16[M K]\"");
    assert_toml_error(&text, "M |K]", &["expected `,` between dims"]);
    let text = edit("x = \"f16[M, K]\"", "x = \"f16[M, K] y\"");
    assert_toml_error(&text, "y\"", &["after the type"]);
    let text = edit("x = \"f16[M, K]\"", "x = 16");
    assert_toml_error(&text, "x = |16", &["`x` is 16: a tensor's type"]);
}

#[test]
fn lexer_error_in_a_string_is_reported_at_the_string() {
    let text = edit("gelu(x @ w^T + b)", "gelu(x @ w^T + b");
    assert_toml_error(&text, "(x @", &["has an unclosed `(`"]);
    let text = edit("gelu(x @ w^T + b)", "gelu(x @ w^T + b))");
    assert_toml_error(&text, ")|)", &["has an unmatched `)`"]);
    let text = edit("gelu(x @ w^T + b)", "gelu(x × w^T + b)");
    assert_toml_error(&text, "x |×", &["cannot be read as tokens"]);
}

#[test]
fn string_with_escapes_reports_at_the_whole_string() {
    // `\u0020` is a space: the text decodes fine, but offsets inside it no
    // longer match the file, so the error covers the string.
    let text = edit("gelu(x @ w^T + b)", r"gelu(x @ v^T +\u0020b)");
    assert_toml_error(&text, "\"gelu", &["`v` is not defined"]);
}

// ---- errors in fusion_graph! tokens ----------------------------------------

const MACRO_BASE: &str = "graph g {
    dims { M: dyn, K: 64, N: 32 }
    input x: f16[M, K];
    weight w: f16[N, K], b: f16[N];
    output y = gelu(x @ w^T + b);
}
";

/// Parses (and lowers) macro tokens read from text, rendering the error
/// against that text as `graph.rs`.
fn macro_error(from: &str, to: &str) -> String {
    assert!(MACRO_BASE.contains(from), "MACRO_BASE has no `{from}`");
    let text = MACRO_BASE.replacen(from, to, 1);
    let tokens = TokenStream::from_str(&text).unwrap();
    let errors = match parse_tokens(tokens) {
        Ok(decl) => ir::lower(&decl).expect_err("expected an error"),
        Err(errors) => errors,
    };
    assert!(
        errors
            .iter()
            .all(|d| matches!(d.span, Span::Tokens(_) | Span::None))
    );
    errors.render(&SourceFile::new("graph.rs", text))
}

fn assert_macro_error(from: &str, to: &str, location: &str, words: &[&str]) {
    let rendered = macro_error(from, to);
    assert!(
        rendered.starts_with(&format!("graph.rs:{location}: error: ")),
        "expected an error at {location}, got:\n{rendered}"
    );
    for word in words {
        assert!(rendered.contains(word), "expected `{word}` in:\n{rendered}");
    }
}

#[test]
fn macro_base_graph_is_valid() {
    let decl = parse_tokens(TokenStream::from_str(MACRO_BASE).unwrap()).unwrap();
    ir::lower(&decl).unwrap();
}

#[test]
fn macro_errors_have_messages_and_positions() {
    assert_macro_error("gelu(", "silux(", "5:16", &["unknown op `silux`"]);
    assert_macro_error(
        "gelu(x @ w^T + b)",
        "gelu(x @ w^T, b)",
        "5:16",
        &["`gelu` takes 1 argument, got 2"],
    );
    assert_macro_error("w^T + b", "v^T + b", "5:25", &["`v` is not defined"]);
    assert_macro_error("K: 64", "K: 0", "2:23", &["dim `K` is 0"]);
    assert_macro_error("f16[N, K]", "f17[N, K]", "4:15", &["unknown dtype `f17`"]);
    assert_macro_error(
        "+ b)",
        "- b)",
        "5:29",
        &["unexpected `-`: expressions use + * @ and calls"],
    );
    assert_macro_error("w^T", "w^2", "5:27", &["expected `T` after `^`"]);
    assert_macro_error("+ b)", "+)", "5:30", &["expected an expression after `+`"]);
    assert_macro_error("b);", "b)", "6:1", &["expected `;` after the expression"]);
    assert_macro_error(
        "M: dyn",
        "M: -1",
        "2:15",
        &["`-1` is negative: a size is a positive integer"],
    );
    assert_macro_error(
        "M: dyn",
        "M: big",
        "2:15",
        &["a dim's size is a positive integer or `dyn`; found `big`"],
    );
    assert_macro_error(
        "input x",
        "inputs x",
        "3:5",
        &["expected `dims { .. }`, `input ..;`"],
    );
    assert_macro_error(
        "b: f16[N];",
        "b: f16[N];\n    weight x: f16[M, K];",
        "5:12",
        &["`x` is defined twice"],
    );
    assert_macro_error("graph g", "graph type", "1:7", &["`type` is a Rust keyword"]);
}

#[test]
fn macro_accepts_statements_in_any_order_and_keeps_it() {
    let decl = parse_tokens(quote! {
        graph g {
            output y = gelu(h);
            weight w: f16[N, K];
            let h = x @ w^T;
            dims { M: dyn, K: 64 }
            input x: f16[M, K];
            dims { N: 32 }
        }
    })
    .unwrap();
    let dims: Vec<&str> = decl.dims.iter().map(|d| d.name.name.as_str()).collect();
    assert_eq!(dims, ["M", "K", "N"]);
    let bindings: Vec<&str> = decl.bindings.iter().map(|b| b.name.name.as_str()).collect();
    assert_eq!(bindings, ["y", "h"]);
    ir::lower(&decl).unwrap();
}

// ---- no input makes the parser panic ---------------------------------------

#[test]
fn malformed_input_is_an_error_never_a_panic() {
    let valid = std::fs::read_to_string(graphs_dir().join("swiglu_ffn.toml")).unwrap();
    let must_fail_below = valid.trim_end().len();
    let mut cuts: Vec<usize> = (0..valid.len()).step_by(7).collect();
    cuts.extend([must_fail_below - 1, must_fail_below - 2]);
    for cut in cuts {
        if !valid.is_char_boundary(cut) {
            continue;
        }
        let source = SourceFile::new("t.toml", &valid[..cut]);
        let result = parse_toml(&source).and_then(|d| ir::lower(&d));
        assert!(result.is_err(), "a file cut at byte {cut} was accepted");
        fusion_compiler::syntax::forget_token_spans();
    }
    let garbage = [
        "",
        "\0",
        "[graph]",
        "[graph]\nname = 5",
        "[graph]\nname = \"\"\n[outputs]\ny = \"\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"(((\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \")\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"'a\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"\\\"unterminated\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"x^\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"f(eps = )\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"f(eps = 1e999999)\"",
        "[graph]\nname = \"g\"\n[dims]\nM = 99999999999999999999\n[outputs]\ny = \"x\"",
        "[graph]\nname = \"g\"\n[dims]\nM = 9223372036854775807\n[inputs]\nx = \"f16[M]\"\n[outputs]\ny = \"gelu(x)\"",
        "[graph]\nname = \"g\"\n[inputs]\nx = \"f16[99999999999999999999999]\"\n[outputs]\ny = \"x\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"\"\"\nmulti\nline\"\"\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = '''x @'''",
        "[graph]\nname = \"é\"\n[outputs]\n\"ü\" = \"é @ ü^T\"",
        "[[graph]]\nname = \"g\"",
        "graph = 3\noutputs = 4",
        "\u{feff}[graph]\nname = \"g\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"x @ @ w\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"x ^ T ^\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"r#type\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"/* comment */\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"// comment\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"{x}\"",
        "[graph]\nname = \"g\"\n[outputs]\ny = \"x[0]\"",
    ];
    for text in garbage {
        let source = SourceFile::new("t.toml", text);
        let result = parse_toml(&source).and_then(|d| ir::lower(&d));
        let errors = result.expect_err(text);
        // Rendering must not panic either, and must name the file.
        assert!(errors.render(&source).starts_with("t.toml"), "{text}");
        fusion_compiler::syntax::forget_token_spans();
    }
    let macro_text = "graph g { dims { M: dyn } input x: f16[M, M]; output y = silu(x @ x^T, eps = 1); }";
    for cut in 0..macro_text.len() {
        if let Ok(tokens) = TokenStream::from_str(&macro_text[..cut]) {
            assert!(parse_tokens(tokens).and_then(|d| ir::lower(&d)).is_err());
        }
    }
}

#[test]
fn invalid_graph_name_is_reported_at_the_name() {
    let text = edit("name = \"g\"", "name = \"my-graph\"");
    assert_toml_error(&text, "my-graph", &["not a valid graph name"]);
}

// ---- the rest of the bad-input catalogue (docs/errors.md) -------------------

#[test]
fn a_graph_with_no_outputs_is_an_error_at_the_table() {
    let text = edit("[outputs]\ny = \"gelu(x @ w^T + b)\"\n", "[outputs]\n");
    let rendered = toml_error(&text);
    assert!(rendered.starts_with("g.toml:"), "{rendered}");
    assert!(rendered.contains("no outputs"), "{rendered}");
    // The same graph through the macro front end.
    let tokens = TokenStream::from_str("graph g { dims { M: dyn } input x: f16[M, 8]; }").unwrap();
    let decl = parse_tokens(tokens).unwrap();
    let errors = ir::lower(&decl).unwrap_err();
    assert!(errors.to_string().contains("no outputs"), "{errors}");
}

#[test]
fn dims_past_two_to_the_31_are_reported_at_the_value() {
    let text = edit("K = 64", "K = 2147483648");
    assert_toml_error(&text, "2147483648", &["too large", "2^31 - 1"]);
    let text = edit("x = \"f16[M, K]\"", "x = \"f16[M, 4294967296]\"");
    assert_toml_error(&text, "4294967296", &["too large"]);
    // The largest allowed size is accepted (as a row count: a row length
    // must also be a multiple of 8).
    let text = edit("M = \"dyn\"", "M = 2147483647");
    graph_from_source(&SourceFile::new("g.toml", &text)).unwrap();
}

#[test]
fn a_static_row_length_not_a_multiple_of_8_is_refused_at_the_first_tensor_with_it() {
    // K = 60: x's rows; reported once, at x, though w has rows of K too.
    let text = edit("K = 64", "K = 60");
    assert_toml_error(
        &text,
        "x = ",
        &[
            "`x` has rows of K = 60, not a multiple of 8",
            "pad it to a multiple of 8",
        ],
    );
    assert_eq!(toml_error(&text).matches("error:").count(), 1);
    // N = 12 is a weight's first dim: the output's rows (the matmul's) and b's.
    let text = edit("N = 32", "N = 12");
    let rendered = toml_error(&text);
    assert!(rendered.contains("`b` has rows of N = 12"), "{rendered}");
    // A dynamic K is checked on every call instead.
    graph_from_source(&SourceFile::new("g.toml", edit("K = 64", "K = \"dyn\""))).unwrap();
}

#[test]
fn eps_outside_f32s_normal_range_is_refused_at_the_argument() {
    for eps in ["1e300", "1e-60"] {
        let text = edit(
            "gelu(x @ w^T + b)",
            &format!("rmsnorm(x @ w^T + b, b, eps = {eps})"),
        );
        assert_toml_error(
            &text,
            "eps = 1",
            &["is outside f32's normal range (1.1754944e-38 to 3.4028235e38): the kernels compute in f32"],
        );
    }
    let text = edit("gelu(x @ w^T + b)", "rmsnorm(x @ w^T + b, b, eps = 1e-30)");
    graph_from_source(&SourceFile::new("g.toml", text)).unwrap();
}

// ---- FP8 tensors and their scales -------------------------------------------

/// An FP8 projection as a Hugging Face FP8 checkpoint stores it: the
/// activation with its static `input_scale`, the weight with a
/// `weight_scale` per output channel.
const FP8: &str = r#"[graph]
name = "fp8"

[dims]
M = "dyn"
K = 64
N = 32

[inputs]
x = "f8e4m3[M, K] scale x_scale"

[weights]
x_scale = "f32[1]"
w = "f8e4m3[N, K] scale w_scale"
w_scale = "f32[N]"
b = "bf16[N]"
g = "bf16[N]"

[outputs]
y = "rmsnorm(gelu(x @ w^T + b), g)"
"#;

/// FP8 with one piece replaced (which must be there).
fn fp8_edit(from: &str, to: &str) -> String {
    assert!(FP8.contains(from), "FP8 has no `{from}`");
    FP8.replacen(from, to, 1)
}

#[test]
fn fp8_tensors_and_their_scales_parse_alike_from_toml_and_macro() {
    let from_toml = parse_toml(&SourceFile::new("fp8.toml", FP8)).unwrap();
    let from_tokens = parse_tokens(quote! {
        graph fp8 {
            dims { M: dyn, K: 64, N: 32 }
            input x: f8e4m3[M, K] scale x_scale;
            weight x_scale: f32[1], w: f8e4m3[N, K] scale w_scale, w_scale: f32[N], b: bf16[N], g: bf16[N];
            output y = rmsnorm(gelu(x @ w^T + b), g);
        }
    })
    .unwrap();
    assert_eq!(from_toml, from_tokens);
    let graph = ir::lower(&from_toml).unwrap();
    let tensor = |name: &str| graph.tensor(graph.tensor_by_name(name).unwrap());
    assert_eq!(tensor("x").dtype, ir::DType::F8E4M3);
    assert_eq!(tensor("x").scale, graph.tensor_by_name("x_scale"));
    assert_eq!(tensor("w").scale, graph.tensor_by_name("w_scale"));
    assert_eq!(tensor("b").scale, None);
    assert_eq!(
        graph.type_string(graph.tensor_by_name("w").unwrap()),
        "f8e4m3[32, 64] scale w_scale"
    );
    // The product of FP8 operands is bf16; `x_scale`'s one value is no
    // row that must be a multiple of 8.
    let product = graph.ops[0].output;
    assert_eq!(graph.tensor(product).dtype, ir::DType::BF16);
    assert_eq!(tensor("y").dtype, ir::DType::BF16);
    // A scale is live through the tensor it scales; one for the whole
    // weight is `[1]`, and it may be declared before or after it.
    let text = fp8_edit("w_scale = \"f32[N]\"", "w_scale = \"f32[1]\"");
    let text = text
        .replace("x = \"f8e4m3[M, K] scale x_scale\"", "")
        .replace("[weights]", "[weights]\nx = \"f8e4m3[M, K] scale x_scale\"");
    graph_from_source(&SourceFile::new("g.toml", &text)).unwrap();
}

#[test]
fn an_fp8_operand_without_its_scale_is_refused_at_the_matmul() {
    let text = fp8_edit("w = \"f8e4m3[N, K] scale w_scale\"", "w = \"f8e4m3[N, K]\"")
        .replace("w_scale = \"f32[N]\"\n", "");
    assert_toml_error(
        &text,
        "x @ w^T",
        &[
            "`w` is f8e4m3 but has no scale: name its f32 scale tensor in its type, `f8e4m3[32, 64] scale w_scale`",
        ],
    );
}

#[test]
fn a_scale_that_is_not_declared_is_refused_at_its_name() {
    let text = fp8_edit("scale w_scale\"", "scale w_s\"");
    assert_toml_error(
        &text,
        "w_s\"",
        &["the scale `w_s` of `w` is not a declared input or weight"],
    );
}

#[test]
fn a_scale_of_the_wrong_dtype_or_shape_is_refused_naming_the_tensor() {
    // Not f32.
    let text = fp8_edit("w_scale = \"f32[N]\"", "w_scale = \"bf16[N]\"");
    assert_toml_error(
        &text,
        "w_scale\"\nw_scale",
        &[
            "the scale of `w`: f8e4m3[32, 64] is `w_scale`: bf16[32]: it must be f32[1] (one scale for the whole weight) or f32[N] (one per output channel)",
        ],
    );
    // A matrix.
    let text = fp8_edit("w_scale = \"f32[N]\"", "w_scale = \"f32[N, 8]\"");
    assert_toml_error(
        &text,
        "w_scale\"\nw_scale",
        &["the scale of `w`", "it must be f32[1]"],
    );
    // An activation takes one scale for the whole tensor.
    let text = fp8_edit("x_scale = \"f32[1]\"", "x_scale = \"f32[K]\"");
    assert_toml_error(
        &text,
        "x_scale\"",
        &[
            "the scale of `x`: f8e4m3[M, 64] is `x_scale`: f32[64]: it must be f32[1] (one scale for the whole activation)",
        ],
    );
    // Per input channel (K) is not per output channel (N): seen at the
    // matmul, which says which axis is which.
    let text = fp8_edit("w_scale = \"f32[N]\"", "w_scale = \"f32[K]\"");
    assert_toml_error(
        &text,
        "x @ w^T",
        &[
            "the scale of matmul's right operand `w` is `w_scale`: f32[64]: it must be [1] or [32], one per output column",
        ],
    );
    // A scale on a tensor that is not FP8.
    let text = fp8_edit("b = \"bf16[N]\"", "b = \"bf16[N] scale w_scale\"");
    assert_toml_error(
        &text,
        "w_scale\"\ng",
        &["`b`: bf16[32] takes no scale: only f8e4m3 tensors have one"],
    );
}

#[test]
fn fp8_where_an_op_cannot_take_it_is_refused_naming_the_tensor() {
    // A norm's gamma.
    let text = fp8_edit("g = \"bf16[N]\"", "g = \"f8e4m3[N] scale x_scale\"");
    assert_toml_error(
        &text,
        "rmsnorm(gelu(x @ w^T + b), g)",
        &[
            "`g`: f8e4m3[32] scale x_scale cannot be an operand of rmsnorm: only a matmul reads f8e4m3 tensors (it multiplies them by their scales)",
        ],
    );
    // An activation of an FP8 input, before any matmul.
    let text = fp8_edit("gelu(x @ w^T + b)", "gelu(x) @ w^T + b");
    assert_toml_error(
        &text,
        "gelu(x)",
        &["`x`: f8e4m3[M, 64] scale x_scale cannot be an operand of gelu"],
    );
    // FP8 with a wider operand in one matmul.
    let text = fp8_edit("x = \"f8e4m3[M, K] scale x_scale\"", "x = \"bf16[M, K]\"")
        .replace("x_scale = \"f32[1]\"\n", "");
    assert_toml_error(
        &text,
        "x @ w^T",
        &[
            "dtype mismatch in matmul: `x`: bf16[M, 64] and `w`: f8e4m3[32, 64] scale w_scale: both operands of an FP8 matmul are f8e4m3, each with its scale",
        ],
    );
    // The product is bf16: an f16 bias does not add to it.
    let text = fp8_edit("b = \"bf16[N]\"", "b = \"f16[N]\"");
    assert_toml_error(&text, "x @ w^T + b", &["dtype mismatch in bias add"]);
}

#[test]
fn fp8_scale_syntax_errors_point_into_the_type_string() {
    let text = fp8_edit("scale w_scale\"", "scale\"");
    assert_toml_error(
        &text,
        "K] |scale\"\nw_scale",
        &["expected the name of the scale tensor after `scale`"],
    );
    let text = fp8_edit("scale w_scale\"", "scale w_scale w\"");
    assert_toml_error(&text, "w\"\nw_scale", &["unexpected `w` after the type"]);
}
