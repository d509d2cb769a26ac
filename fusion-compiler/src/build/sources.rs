//! Finds the `fusion_graph!` invocations in a crate's Rust sources, the way
//! cxx-build finds `#[cxx::bridge]` modules: parse the file with `syn`, walk
//! its items, and hand each invocation's tokens to the same parser and
//! checker the macro uses. Errors are rendered as `file:line:col` against
//! the source file (proc-macro2 keeps line and column for tokens it read).

use super::BuildError;
use crate::diagnostic::{Diagnostic, Diagnostics, SourceFile, Span};
use crate::ir::Graph;
use proc_macro2::TokenStream;
use std::path::Path;

/// One checked graph from a source file.
#[derive(Debug)]
pub struct MacroGraph {
    pub graph: Graph,
    /// [`crate::syntax::graph_fingerprint`] of the invocation's tokens.
    pub fingerprint: u64,
    /// The invocation's tokens as text.
    pub declaration: String,
    /// `src/model.rs:12`: where the invocation is, for generated comments.
    pub origin: String,
}

/// Every graph declared with `fusion_graph!` in `path`, in source order.
pub fn read_macro_graphs(path: &Path) -> Result<Vec<MacroGraph>, BuildError> {
    let source = SourceFile::read(path).map_err(|d| BuildError::Config(d.message))?;
    let file = syn::parse_file(&source.text).map_err(|e| {
        let d = Diagnostic::new(
            Span::Tokens(e.span()),
            format!("cannot parse this Rust file: {e}"),
        );
        BuildError::Config(source.render(&d))
    })?;
    let mut invocations = Vec::new();
    find_invocations(&file.items, &mut invocations);
    let mut graphs = Vec::new();
    let mut errors = Vec::new();
    for (line, tokens) in invocations {
        let fingerprint = crate::syntax::graph_fingerprint(&tokens);
        let declaration = tokens.to_string();
        let checked = crate::syntax::parse_tokens(tokens).and_then(|decl| crate::ir::lower(&decl));
        match checked {
            Ok(graph) => graphs.push(MacroGraph {
                graph,
                fingerprint,
                declaration,
                origin: format!("{}:{line}", path.display()),
            }),
            Err(e) => errors.push(render(&source, &e)),
        }
    }
    if !errors.is_empty() {
        return Err(BuildError::Config(errors.join("\n")));
    }
    Ok(graphs)
}

fn render(source: &SourceFile, errors: &Diagnostics) -> String {
    errors.render(source)
}

/// Whether a macro path names `fusion_graph!` (`fusion_graph!`,
/// `fusion::fusion_graph!`, `::fusion_macros::fusion_graph!`).
fn is_fusion_graph(mac: &syn::Macro) -> bool {
    mac.path
        .segments
        .last()
        .is_some_and(|s| s.ident == "fusion_graph")
}

/// Collects `(line, tokens)` of every invocation among `items`, descending
/// into inline modules and function bodies.
fn find_invocations(items: &[syn::Item], out: &mut Vec<(usize, TokenStream)>) {
    for item in items {
        match item {
            syn::Item::Macro(m) if is_fusion_graph(&m.mac) => {
                let line = m.mac.path.segments[0].ident.span().start().line;
                out.push((line, m.mac.tokens.clone()));
            }
            syn::Item::Mod(m) => {
                if let Some((_, items)) = &m.content {
                    find_invocations(items, out);
                }
            }
            syn::Item::Fn(f) => find_in_block(&f.block, out),
            syn::Item::Impl(i) => {
                for item in &i.items {
                    if let syn::ImplItem::Fn(f) = item {
                        find_in_block(&f.block, out);
                    }
                }
            }
            _ => {}
        }
    }
}

fn find_in_block(block: &syn::Block, out: &mut Vec<(usize, TokenStream)>) {
    for stmt in &block.stmts {
        match stmt {
            syn::Stmt::Item(item) => find_invocations(std::slice::from_ref(item), out),
            syn::Stmt::Macro(m) if is_fusion_graph(&m.mac) => {
                let line = m.mac.path.segments[0].ident.span().start().line;
                out.push((line, m.mac.tokens.clone()));
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(name: &str, text: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("fusion-sources-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("model.rs");
        std::fs::write(&path, text).unwrap();
        path
    }

    const MLP: &str = "
        dims { M: dyn, D: 64 }
        input x: f16[M, D];
        weight w: f16[D, D], b: f16[D];
        output y = gelu(x @ w^T + b);";

    #[test]
    fn finds_invocations_by_any_path_and_in_modules() {
        let text = format!(
            "fusion::fusion_graph! {{ pub graph a {{ {MLP} }} }}\n\
             mod inner {{ fusion_graph! {{ graph b {{ {MLP} }} }} }}\n\
             fn f() {{ ::fusion_macros::fusion_graph! {{ graph c {{ {MLP} }} }} }}\n\
             macro_rules! other {{ () => {{}} }}\n"
        );
        let path = write("paths", &text);
        let graphs = read_macro_graphs(&path).unwrap();
        let names: Vec<&str> = graphs.iter().map(|g| g.graph.name.as_str()).collect();
        assert_eq!(names, ["a", "b", "c"]);
        assert!(graphs[0].origin.ends_with("model.rs:1"), "{}", graphs[0].origin);
        assert_ne!(graphs[0].fingerprint, graphs[1].fingerprint);
    }

    #[test]
    fn errors_point_at_the_file_line_and_column() {
        let text = "\n\nfusion_graph! {\n    graph bad {\n        dims { M: dyn }\n        input x: f16[M, Q];\n        output y = x;\n    }\n}\n";
        let path = write("errors", text);
        let message = read_macro_graphs(&path).unwrap_err().to_string();
        let expected = format!("{}:6:25: error:", path.display());
        assert!(message.contains(&expected), "{message}");
        assert!(message.contains("`Q`"), "{message}");
    }

    #[test]
    fn the_fingerprint_is_the_macros() {
        let text = format!("fusion_graph! {{ graph a {{ {MLP} }} }}");
        let path = write("fingerprint", &text);
        let graphs = read_macro_graphs(&path).unwrap();
        let tokens: TokenStream = format!("graph a {{ {MLP} }}").parse().unwrap();
        assert_eq!(graphs[0].fingerprint, crate::syntax::graph_fingerprint(&tokens));
    }
}
