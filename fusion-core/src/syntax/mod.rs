//! The one parser for graph declarations, whichever front end wrote them.
//!
//! Both front ends yield the same [`ast::GraphDecl`]:
//! - [`parse_tokens`] reads the body of a `fusion_graph!` invocation (the
//!   macro calls it with the compiler's tokens; a build script calls it with
//!   tokens it read from the same source file);
//! - [`parse_toml`] reads a `graphs/*.toml` file. Its type strings
//!   (`"f16[M, D]"`) and expression strings (`"silu(x @ w^T)"`) go through
//!   the same token grammar as the macro, with spans moved to where the
//!   string sits in the file.
//!
//! Nothing here resolves names or checks shapes: that is [`crate::ir::lower`].

pub mod ast;
mod grammar;
mod toml_reader;

pub use grammar::parse_tokens;
pub use toml_reader::parse_toml;
