//! The TOML front end: reads a `graphs/*.toml` file into a [`GraphDecl`].
//!
//! The format, table by table:
//!
//! ```toml
//! [graph]
//! name = "swiglu_ffn"                   # required; becomes the Rust module name
//! doc = "Llama-3-8B SwiGLU block."      # optional
//!
//! [dims]                                # optional
//! M = "dyn"                             # read from the inputs at run time
//! D = 4096                              # a positive integer: fixed at build time
//!
//! [inputs]                              # activations, passed on every run
//! x = "f16[M, D]"
//!
//! [weights]                             # parameters, bound once
//! w_gate = "f16[F, D]"                  # nn.Linear layout [out, in]: `w^T` reads it transposed
//!
//! [compute]                             # optional: intermediates, in any order
//! gate = "silu(x @ w_gate^T)"
//!
//! [outputs]                             # required: at least one
//! y = "gate @ w_down^T + x"
//! ```
//!
//! Type strings and expression strings are tokenized with proc-macro2 and
//! parsed by the same grammar as `fusion_graph!` ([`super::grammar`]); each
//! token's span is moved to where it sits in the file, so an error inside a
//! string points at the offending token. Declaration order is kept: inputs
//! before weights, compute before outputs, each in file order.

use super::ast::{DimDecl, DimSize, GraphDecl, Ident, TensorDecl, TensorRole};
use super::grammar::{self, SpanMap};
use crate::diagnostic::{Diagnostic, Diagnostics, SourceFile, Span};
use indexmap::IndexMap;
use proc_macro2::TokenStream;
use serde::Deserialize;
use std::ops::Range;
use std::str::FromStr;
use toml::Spanned;

/// A table of `name = value` entries, in file order, with spans.
type Entries = IndexMap<Spanned<String>, Spanned<toml::Value>>;

/// The whole file. Unknown tables are errors at their key.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphFile {
    graph: GraphTable,
    #[serde(default)]
    dims: Entries,
    #[serde(default)]
    inputs: Entries,
    #[serde(default)]
    weights: Entries,
    #[serde(default)]
    compute: Entries,
    outputs: Entries,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct GraphTable {
    name: Spanned<String>,
    #[serde(default)]
    doc: Option<String>,
}

/// Parses a `graphs/*.toml` file. Every error carries a [`Span::Source`] in
/// `source`, so [`Diagnostics::render`] shows `file:line:col`.
pub fn parse_toml(source: &SourceFile) -> Result<GraphDecl, Diagnostics> {
    let text = source.text.as_str();
    let file: GraphFile = toml::from_str(text).map_err(|e| {
        let range = e.span().unwrap_or(0..0);
        let message = e.message().trim_end();
        let diagnostic = Diagnostic::new(Span::source(range.start, range.end), message);
        if message.starts_with("missing field") {
            diagnostic.with_note(
                "a graph file needs a `[graph]` table with a `name`, and an `[outputs]` table \
                 with at least one `name = \"expression\"`",
            )
        } else {
            diagnostic
        }
    })?;
    let mut reader = Reader {
        text,
        errors: Vec::new(),
    };
    let name = reader.string_ident(&file.graph.name);
    let doc = file
        .graph
        .doc
        .map(|d| d.trim().to_string())
        .filter(|d| !d.is_empty());
    let dims = file
        .dims
        .iter()
        .filter_map(|(key, value)| reader.dim(key, value))
        .collect();
    let mut tensors = Vec::new();
    for (table, role) in [
        (&file.inputs, TensorRole::Input),
        (&file.weights, TensorRole::Weight),
    ] {
        for (key, value) in table {
            if let Some(ty) = reader.type_string(key, value) {
                tensors.push(TensorDecl {
                    role,
                    name: key_ident(key),
                    ty,
                });
            }
        }
    }
    let mut bindings = Vec::new();
    for (table, is_output) in [(&file.compute, false), (&file.outputs, true)] {
        for (key, value) in table {
            if let Some(expr) = reader.expr_string(key, value) {
                bindings.push(super::ast::Binding {
                    name: key_ident(key),
                    expr,
                    is_output,
                });
            }
        }
    }
    if !reader.errors.is_empty() {
        return Err(Diagnostics(reader.errors));
    }
    Ok(GraphDecl {
        name,
        doc,
        dims,
        tensors,
        bindings,
    })
}

fn span_of(range: Range<usize>) -> Span {
    Span::source(range.start, range.end)
}

fn key_ident(key: &Spanned<String>) -> Ident {
    Ident::new(key.get_ref().clone(), span_of(key.span()))
}

/// Where a string's text sits in the file, for moving token spans there.
struct StringSite {
    /// Offset of the first character of the string's text.
    content_start: usize,
    /// The whole string, quotes included.
    whole: Range<usize>,
    /// Whether the decoded text is byte for byte the text in the file. When
    /// it is not (escapes, a trimmed first newline), offsets within the text
    /// do not match offsets in the file, so every span is the whole string.
    verbatim: bool,
}

impl StringSite {
    fn new(file: &str, whole: Range<usize>, decoded: &str) -> StringSite {
        let raw = file.get(whole.clone()).unwrap_or("");
        let quote_len = if raw.starts_with("\"\"\"") || raw.starts_with("'''") {
            3
        } else {
            1
        };
        let verbatim =
            raw.len() >= 2 * quote_len && raw.get(quote_len..raw.len() - quote_len) == Some(decoded);
        StringSite {
            content_start: whole.start + quote_len,
            whole,
            verbatim,
        }
    }

    fn whole_span(&self) -> Span {
        span_of(self.whole.clone())
    }

    /// The file span of a token in the string. An empty range is syn's "end
    /// of input", shown at the closing quote.
    fn map(&self, token: proc_macro2::Span) -> Span {
        if !self.verbatim {
            return self.whole_span();
        }
        let range = token.byte_range();
        if range.is_empty() {
            return Span::source(self.whole.end.saturating_sub(1), self.whole.end);
        }
        let lo = (self.content_start + range.start).min(self.whole.end);
        let hi = (self.content_start + range.end).min(self.whole.end);
        Span::source(lo, hi)
    }
}

struct Reader<'a> {
    text: &'a str,
    errors: Vec<Diagnostic>,
}

impl Reader<'_> {
    /// The graph's name: a string holding one identifier.
    fn string_ident(&mut self, value: &Spanned<String>) -> Ident {
        let site = StringSite::new(self.text, value.span(), value.get_ref());
        let span = if site.verbatim {
            Span::source(site.content_start, site.content_start + value.get_ref().len())
        } else {
            site.whole_span()
        };
        Ident::new(value.get_ref().clone(), span)
    }

    fn dim(&mut self, key: &Spanned<String>, value: &Spanned<toml::Value>) -> Option<DimDecl> {
        let size_span = span_of(value.span());
        let size = match value.get_ref() {
            toml::Value::Integer(n) if *n >= 0 => DimSize::Static(*n as u64),
            toml::Value::Integer(n) => {
                self.errors.push(Diagnostic::new(
                    size_span,
                    format!(
                        "dim `{}` is {n}: dims are an integer size or \"dyn\", and a size is at least 1",
                        key.get_ref()
                    ),
                ));
                return None;
            }
            toml::Value::String(s) if s == "dyn" => DimSize::Dynamic,
            other => {
                self.errors.push(
                    Diagnostic::new(
                        size_span,
                        format!(
                            "dim `{}` is {}: dims are an integer size or \"dyn\"",
                            key.get_ref(),
                            describe_value(other)
                        ),
                    )
                    .with_note("`M = \"dyn\"` is read from the inputs at run time; `D = 4096` is fixed"),
                );
                return None;
            }
        };
        Some(DimDecl {
            name: key_ident(key),
            size,
            size_span,
        })
    }

    /// The string value of a tensor or binding entry, with its site.
    fn string_value<'v>(
        &mut self,
        key: &Spanned<String>,
        value: &'v Spanned<toml::Value>,
        what: &str,
    ) -> Option<(&'v str, StringSite)> {
        match value.get_ref() {
            toml::Value::String(s) => Some((s, StringSite::new(self.text, value.span(), s))),
            other => {
                self.errors.push(Diagnostic::new(
                    span_of(value.span()),
                    format!(
                        "`{}` is {}: {what} is a string",
                        key.get_ref(),
                        describe_value(other)
                    ),
                ));
                None
            }
        }
    }

    fn type_string(
        &mut self,
        key: &Spanned<String>,
        value: &Spanned<toml::Value>,
    ) -> Option<super::ast::TypeExpr> {
        let (text, site) = self.string_value(key, value, "a tensor's type, like \"f16[M, D]\",")?;
        let tokens = self.tokenize(text, &site)?;
        let map = |s: proc_macro2::Span| site.map(s);
        self.keep(grammar::parse_type(tokens, &map as SpanMap))
    }

    fn expr_string(
        &mut self,
        key: &Spanned<String>,
        value: &Spanned<toml::Value>,
    ) -> Option<super::ast::Expr> {
        let (text, site) = self.string_value(key, value, "an expression, like \"silu(x @ w^T)\",")?;
        let tokens = self.tokenize(text, &site)?;
        let map = |s: proc_macro2::Span| site.map(s);
        self.keep(grammar::parse_expr(tokens, &map as SpanMap))
    }

    fn keep<T>(&mut self, parsed: Result<T, Diagnostics>) -> Option<T> {
        parsed.map_err(|e| self.errors.extend(e.0)).ok()
    }

    /// Splits a string into Rust tokens; a string that does not lex (an
    /// unbalanced bracket, a stray quote) is reported at the string.
    fn tokenize(&mut self, text: &str, site: &StringSite) -> Option<TokenStream> {
        match TokenStream::from_str(text) {
            Ok(tokens) => Some(tokens),
            Err(error) => {
                let message = match unbalanced_delimiter(text) {
                    Some(problem) => format!("`{text}` has {problem}"),
                    None => format!(
                        "`{text}` cannot be read as tokens: it holds a character or quote the graph syntax does not use"
                    ),
                };
                // The lexer's span is an empty range where it gave up.
                let at = error.span().byte_range();
                let span = if site.verbatim {
                    let lo = (site.content_start + at.start).min(site.whole.end);
                    Span::source(lo, (lo + 1).min(site.whole.end))
                } else {
                    site.whole_span()
                };
                self.errors.push(Diagnostic::new(span, message));
                None
            }
        }
    }
}

/// "an unclosed `(`" or "an unmatched `)`", if brackets do not balance.
fn unbalanced_delimiter(text: &str) -> Option<String> {
    let mut open = Vec::new();
    for c in text.chars() {
        match c {
            '(' | '[' | '{' => open.push(c),
            ')' | ']' | '}' => {
                let expected = match c {
                    ')' => '(',
                    ']' => '[',
                    _ => '{',
                };
                if open.pop() != Some(expected) {
                    return Some(format!("an unmatched `{c}`"));
                }
            }
            _ => {}
        }
    }
    open.pop().map(|c| format!("an unclosed `{c}`"))
}

fn describe_value(value: &toml::Value) -> String {
    match value {
        toml::Value::String(s) => format!("\"{s}\""),
        toml::Value::Integer(n) => n.to_string(),
        toml::Value::Float(x) => x.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        toml::Value::Datetime(d) => d.to_string(),
        toml::Value::Array(_) => "an array".to_string(),
        toml::Value::Table(_) => "a table".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::syntax::ast::{Expr, TensorRole};

    /// The TOML reader adds a string's position in the file to each token's
    /// `byte_range()`, which relies on proc-macro2 (outside a proc macro)
    /// giving byte offsets relative to the string that was tokenized, not
    /// offsets into all the text it has seen on the thread.
    #[test]
    fn byte_range_is_bytes_within_the_tokenized_string() {
        let _earlier = TokenStream::from_str("some earlier text that shifts global offsets").unwrap();
        let tokens: Vec<_> = TokenStream::from_str("é + cd").unwrap().into_iter().collect();
        assert_eq!(tokens[0].span().byte_range(), 0..2, "`é` is two bytes");
        assert_eq!(tokens[1].span().byte_range(), 3..4);
        assert_eq!(tokens[2].span().byte_range(), 5..7);
        // The call site (syn's "end of input") has an empty range.
        assert!(proc_macro2::Span::call_site().byte_range().is_empty());
    }

    fn parse(text: &str) -> Result<GraphDecl, Diagnostics> {
        parse_toml(&SourceFile::new("g.toml", text))
    }

    const GRAPH: &str = r#"
[outputs]
y = "h @ w^T"
z = "gelu(h)"

[compute]
h = "x * x"

[weights]
w = "f16[N, N]"

[inputs]
x = "f16[M, N]"

[dims]
N = 8
M = "dyn"

[graph]
name = "order"
doc = "  Tables in any order.  "
"#;

    #[test]
    fn declaration_order_is_kept_whatever_the_table_order() {
        let decl = parse(GRAPH).unwrap();
        assert_eq!(decl.name.name, "order");
        assert_eq!(decl.doc.as_deref(), Some("Tables in any order."));
        let dims: Vec<_> = decl.dims.iter().map(|d| (d.name.name.as_str(), d.size)).collect();
        assert_eq!(dims, [("N", DimSize::Static(8)), ("M", DimSize::Dynamic)]);
        let tensors: Vec<_> = decl
            .tensors
            .iter()
            .map(|t| (t.name.name.as_str(), t.role))
            .collect();
        assert_eq!(tensors, [("x", TensorRole::Input), ("w", TensorRole::Weight)]);
        let bindings: Vec<_> = decl
            .bindings
            .iter()
            .map(|b| (b.name.name.as_str(), b.is_output))
            .collect();
        assert_eq!(bindings, [("h", false), ("y", true), ("z", true)]);
    }

    #[test]
    fn spans_point_into_the_file() {
        let decl = parse(GRAPH).unwrap();
        let span_text = |span: Span| match span {
            Span::Source { lo, hi } => &GRAPH[lo..hi],
            other => panic!("not a file span: {other:?}"),
        };
        assert_eq!(span_text(decl.name.span), "order");
        assert_eq!(span_text(decl.dims[0].size_span), "8");
        assert_eq!(span_text(decl.dims[1].size_span), "\"dyn\"");
        assert_eq!(span_text(decl.tensors[1].ty.span), "f16[N, N]");
        assert_eq!(span_text(decl.tensors[1].ty.dtype.span), "f16");
        let y = &decl.bindings[1];
        assert_eq!(span_text(y.name.span), "y");
        assert_eq!(span_text(y.expr.span()), "h @ w^T");
        let Expr::Binary(matmul) = &y.expr else { panic!() };
        assert_eq!(span_text(matmul.rhs.span()), "w^T");
        assert_eq!(span_text(decl.bindings[2].expr.span()), "gelu(h)");
    }

    #[test]
    fn strings_that_differ_from_the_file_map_to_the_whole_string() {
        let text = "[graph]\nname = \"g\"\n[outputs]\ny = \"gelu(\\u0078)\"\nz = '''relu(x)'''\n";
        let decl = parse(text).unwrap();
        let whole = text.find("\"gelu").unwrap();
        let Expr::Call(call) = &decl.bindings[0].expr else {
            panic!()
        };
        assert_eq!(
            call.args[0],
            Expr::Name(crate::syntax::ast::Ident::new("x", Span::None))
        );
        assert!(
            matches!(call.args[0].span(), Span::Source { lo, hi } if lo == whole && &text[hi - 1..hi] == "\"")
        );
        // A literal string has no escapes: its tokens keep exact positions.
        let lo = text.find("relu").unwrap();
        assert!(
            matches!(decl.bindings[1].expr.span(), Span::Source { lo: l, hi: h } if l == lo && h == lo + 7)
        );
    }

    #[test]
    fn several_errors_are_reported_together() {
        let text = "[graph]\nname = \"g\"\n[dims]\nA = \"x\"\nB = -1\n[outputs]\ny = \"a -\"\nz = \"(\"\n";
        let errors = parse(text).unwrap_err();
        assert_eq!(errors.0.len(), 4, "{errors}");
    }
}
