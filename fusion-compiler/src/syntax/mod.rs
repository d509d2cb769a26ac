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
mod fingerprint;
mod grammar;
mod toml_reader;

pub use fingerprint::graph_fingerprint;
pub use grammar::{MAX_NESTING, parse_tokens};
pub use toml_reader::parse_toml;

/// Frees the text proc-macro2 keeps for every string it has tokenized on
/// this thread (each TOML type and expression string, each source file a
/// build script tokenized).
///
/// [`parse_toml`] keeps no token spans (it moves them into the file as byte
/// offsets), but proc-macro2 keeps the tokenized text for the life of the
/// thread, so a process that parses graphs without end (a fuzzer, a language
/// server) grows. It calls this between parses.
///
/// Only call it when no [`crate::diagnostic::Span::Tokens`] from tokenized
/// text is still in use on this thread: asking such a span for its location
/// afterwards panics. That is why [`parse_toml`] does not call it itself: a
/// build script may hold a macro graph's spans while it reads TOML graphs.
/// Inside a procedural macro it does nothing (the compiler owns the spans).
pub fn forget_token_spans() {
    if !proc_macro_is_running() {
        proc_macro2::extra::invalidate_current_thread_spans();
    }
}

/// proc-macro2 panics when asked to invalidate spans inside a macro.
fn proc_macro_is_running() -> bool {
    extern crate proc_macro;
    proc_macro::is_available()
}
