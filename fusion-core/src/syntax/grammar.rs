//! The token grammar: `fusion_graph!` bodies, type strings and expressions.

use super::ast::GraphDecl;
use crate::diagnostic::Diagnostics;

/// Parses the body of a `fusion_graph!` invocation.
pub fn parse_tokens(_tokens: proc_macro2::TokenStream) -> Result<GraphDecl, Diagnostics> {
    todo!("token grammar")
}
