//! `fusion_graph!`: declares a graph in Rust source and exposes its fused
//! kernels as a typed struct.
//!
//! The macro is one half of a pair, as in cxx: the crate's build script
//! (`fusion_compiler::build::Builder::sources`) reads the same invocation from
//! the source file, plans it, compiles its kernels with nvcc and writes the
//! typed wrappers to `OUT_DIR/fusion_graphs/<graph>.rs`. The macro parses
//! its input with [`fusion_compiler::syntax::parse_tokens`] and checks it with
//! [`fusion_compiler::ir::lower`] (so a mistake is a compile error at the
//! offending token), then includes that file. Both halves hash the tokens
//! with [`fusion_compiler::syntax::graph_fingerprint`]; the expansion checks the
//! generated file's hash at compile time, so a graph edited without the
//! build script seeing it is an error that says so, not a confusing type
//! error from stale code.
//!
//! The macro does no planning, rendering or compiling, and touches the file
//! system only to ask whether one file exists: editors expand macros
//! constantly. It does not even link that work: it depends on fusion-compiler
//! without features, which is the parser, the IR and the shared names in
//! [`fusion_compiler::generated`] (`tests/dependencies.rs` keeps it so).
//!
//! ```ignore
//! fusion::fusion_graph! {
//!     /// A linear layer with GELU.
//!     pub graph Mlp {
//!         dims { M: dyn, D: 768 }
//!         input x: f16[M, D];
//!         weight w: f16[D, D], b: f16[D];
//!         output y = gelu(x @ w^T + b);
//!     }
//! }
//! // build.rs: fusion_compiler::build::Builder::new().sources("src/model.rs").compile()
//! let mut mlp = Mlp::new(&stream, MlpWeights { w, b })?;
//! mlp.run(&stream, &x, &mut y)?;
//! ```

#![warn(missing_docs)]

use fusion_compiler::diagnostic::{Diagnostics, Span};
use fusion_compiler::generated::{MACRO_GRAPHS_DIR, struct_name};
use proc_macro::TokenStream;
use quote::{format_ident, quote, quote_spanned};

/// Declares a graph; see the crate documentation.
#[proc_macro]
pub fn fusion_graph(input: TokenStream) -> TokenStream {
    let tokens = proc_macro2::TokenStream::from(input);
    let fingerprint = fusion_compiler::syntax::graph_fingerprint(&tokens);
    let decl = match fusion_compiler::syntax::parse_tokens(tokens.clone()) {
        Ok(decl) => decl,
        Err(errors) => return compile_errors(&errors),
    };
    if let Err(errors) = fusion_compiler::ir::lower(&decl) {
        return compile_errors(&errors);
    }
    let name_span = match decl.name.span {
        Span::Tokens(span) => span,
        _ => proc_macro2::Span::call_site(),
    };
    let name = &decl.name.name;
    let visibility = visibility(&tokens);

    // The one file-system access: has the build script written this graph?
    // Asking before `include!` turns a missing file into a message that
    // says why, instead of include!'s "couldn't read".
    let generated = format!("{MACRO_GRAPHS_DIR}/{name}.rs");
    let missing = match std::env::var_os("OUT_DIR") {
        None => Some(format!(
            "graph `{name}` has no generated kernels: this crate has no build script, or it has not run. \
             Add a build.rs that compiles the file declaring this graph: \
             `fusion_compiler::build::Builder::new().sources(\"src/<file>.rs\").compile().unwrap();` \
             (with fusion-compiler in [build-dependencies])"
        )),
        Some(dir) if !std::path::Path::new(&dir).join(&generated).is_file() => Some(format!(
            "graph `{name}` has no generated kernels: build.rs does not list the file that declares it. \
             Add `.sources(\"src/<file>.rs\")` for that file to the fusion_compiler::build::Builder in build.rs \
             (it also prints the `cargo:rerun-if-changed` line, so later edits rebuild the kernels)"
        )),
        Some(_) => None,
    };
    if let Some(message) = missing {
        return quote_spanned!(name_span=> ::core::compile_error! { #message }).into();
    }

    let stale = format!(
        "graph `{name}` was edited after build.rs generated its kernels, so they are for another version of it. \
         build.rs regenerates them when a file it lists changes: make sure the Builder in build.rs calls \
         `.sources(...)` on the file that declares this graph (that prints `cargo:rerun-if-changed` for it), \
         and that no other listed file declares a graph of the same name; then build again"
    );
    let module = format_ident!("__fusion_graph_{}", name, span = name_span);
    let struct_ident = format_ident!("{}", struct_name(name), span = name_span);
    let weights_ident = format_ident!("{}Weights", struct_ident);
    let path = format!("/{generated}");
    quote! {
        #[doc(hidden)]
        #[allow(non_snake_case)]
        mod #module {
            include!(concat!(env!("OUT_DIR"), #path));
            const _: () = ::core::assert!(FINGERPRINT == #fingerprint, #stale);
        }
        #visibility use #module::#struct_ident;
        #visibility use #module::#weights_ident;
    }
    .into()
}

/// The visibility written before `graph` (after any doc attributes).
fn visibility(tokens: &proc_macro2::TokenStream) -> proc_macro2::TokenStream {
    let parser = |input: syn::parse::ParseStream| {
        input.call(syn::Attribute::parse_outer)?;
        let vis: syn::Visibility = input.parse()?;
        input.parse::<proc_macro2::TokenStream>()?;
        Ok(vis)
    };
    match syn::parse::Parser::parse2(parser, tokens.clone()) {
        Ok(vis) => quote!(#vis),
        Err(_) => quote!(),
    }
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
