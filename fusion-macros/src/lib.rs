//! `fusion_graph!`: declares a graph in Rust source.
//!
//! The macro is a thin caller of `fusion_core`: it parses its input with
//! [`fusion_core::syntax::parse_tokens`] (the same grammar the TOML front end
//! uses) and checks it with [`fusion_core::ir::lower`], so a mistake in the
//! graph is a compile error at the offending token. It does no heavy work of
//! its own: editors expand macros constantly.
//!
//! For now it expands to a module named after the graph that records the
//! declaration; the typed wrappers that the build script generates will be
//! included from there.
//!
//! ```ignore
//! fusion_graph! {
//!     /// A linear layer with GELU.
//!     pub graph mlp {
//!         dims { M: dyn, D: 768 }
//!         input x: f16[M, D];
//!         weight w: f16[D, D], b: f16[D];
//!         output y = gelu(x @ w^T + b);
//!     }
//! }
//! assert_eq!(mlp::NAME, "mlp");
//! ```

use fusion_core::diagnostic::{Diagnostics, Span};
use proc_macro::TokenStream;
use quote::{quote, quote_spanned};

/// Declares a graph; see the crate documentation for the syntax.
#[proc_macro]
pub fn fusion_graph(input: TokenStream) -> TokenStream {
    let tokens = proc_macro2::TokenStream::from(input);
    let declaration = tokens.to_string();
    let decl = match fusion_core::syntax::parse_tokens(tokens) {
        Ok(decl) => decl,
        Err(errors) => return compile_errors(&errors),
    };
    if let Err(errors) = fusion_core::ir::lower(&decl) {
        return compile_errors(&errors);
    }
    let name_span = match decl.name.span {
        Span::Tokens(span) => span,
        _ => proc_macro2::Span::call_site(),
    };
    // Lowering accepted the name, so it is a plain identifier.
    let module = proc_macro2::Ident::new(&decl.name.name, name_span);
    let name = &decl.name.name;
    let doc = decl.doc.iter();
    quote! {
        #(#[doc = #doc])*
        pub mod #module {
            /// The graph's name.
            pub const NAME: &str = #name;
            /// The declaration as written, for the build script and for messages.
            pub const DECLARATION: &str = #declaration;
        }
    }
    .into()
}

/// One `compile_error!` per diagnostic, at its span where it has one.
fn compile_errors(errors: &Diagnostics) -> TokenStream {
    errors
        .iter()
        .map(|d| {
            let span = match d.span {
                Span::Tokens(span) => span,
                _ => proc_macro2::Span::call_site(),
            };
            let mut message = d.to_string();
            for (at, label) in &d.labels {
                message.push_str(&format!("\n  note: {label}"));
                // A `compile_error!` has one span; name the other place in words.
                if let Span::Tokens(at) = at
                    && at.start().line > 0
                {
                    let start = at.start();
                    message.push_str(&format!(" at line {}, column {}", start.line, start.column + 1));
                }
            }
            // Braces, not `( );`: a `;` after an item-position macro is an error.
            quote_spanned!(span=> ::core::compile_error! { #message })
        })
        .collect::<proc_macro2::TokenStream>()
        .into()
}
