//! A graph as data its generated struct carries: `__DECLARED`, a
//! `fusion::plan::DeclaredGraph` that, with the plan table's tensors
//! (names and shapes), is what the struct's `graph()` returns
//! (`fusion::plan::graph`), so that a program carries its graph as fixed
//! when its build script ran, not as a declaration parsed again at run time.
//!
//! The matches below name every variant, so a new kind of op fails to
//! compile here until it is written out too.

use crate::ir::{DType, Graph, OpKind, WeightLayout};
use proc_macro2::{Literal, TokenStream};
use quote::quote;

/// The `__DECLARED` static of `graph`: its doc, dims, element types and ops.
pub fn declared_graph(graph: &Graph) -> TokenStream {
    let doc = match &graph.doc {
        Some(doc) => quote!(Some(#doc)),
        None => quote!(None),
    };
    let dims = graph.dims.iter().map(|d| {
        let name = &d.name;
        let size = match d.size {
            Some(n) => {
                let n = Literal::u64_unsuffixed(n);
                quote!(Some(#n))
            }
            None => quote!(None),
        };
        quote!((#name, #size))
    });
    // One element type for every tensor (the common case) is written once.
    let dtypes = match graph.tensors.first() {
        Some(first) if graph.tensors.iter().all(|t| t.dtype == first.dtype) => {
            let (dtype, count) = (
                dtype_tokens(first.dtype),
                Literal::usize_unsuffixed(graph.tensors.len()),
            );
            quote!(&[#dtype; #count])
        }
        _ => {
            let each = graph.tensors.iter().map(|t| dtype_tokens(t.dtype));
            quote!(&[#(#each),*])
        }
    };
    let ops = graph.ops.iter().map(|op| {
        let kind = op_kind_tokens(&op.kind);
        let inputs = op.inputs.iter().map(|t| Literal::usize_unsuffixed(t.0));
        let output = Literal::usize_unsuffixed(op.output.0);
        quote!((#kind, &[#(#inputs),*], #output))
    });
    quote! {
        pub(super) static __DECLARED: fusion::plan::DeclaredGraph = fusion::plan::DeclaredGraph {
            doc: #doc,
            dims: &[#(#dims),*],
            dtypes: #dtypes,
            ops: &[#(#ops),*],
        };
    }
}

fn dtype_tokens(dtype: DType) -> TokenStream {
    match dtype {
        DType::F16 => quote!(DType::F16),
        DType::BF16 => quote!(DType::BF16),
        DType::F32 => quote!(DType::F32),
        DType::F8E4M3 => quote!(DType::F8E4M3),
    }
}

fn op_kind_tokens(kind: &OpKind) -> TokenStream {
    match *kind {
        OpKind::MatMul { b_layout } => {
            let layout = match b_layout {
                WeightLayout::KN => quote!(KN),
                WeightLayout::NK => quote!(NK),
            };
            quote!(OpCode::MatMul(fusion::ir::WeightLayout::#layout))
        }
        OpKind::BiasAdd => quote!(OpCode::BiasAdd),
        OpKind::Add => quote!(OpCode::Add),
        OpKind::Mul => quote!(OpCode::Mul),
        // The op table's row by its name: the rows are statics of the table,
        // which a literal cannot name.
        OpKind::Activation(activation) => {
            let name = activation.name();
            quote!(OpCode::Activation(#name))
        }
        OpKind::LayerNorm { eps } => {
            let eps = Literal::f64_suffixed(eps);
            quote!(OpCode::LayerNorm(#eps))
        }
        OpKind::RmsNorm { eps } => {
            let eps = Literal::f64_suffixed(eps);
            quote!(OpCode::RmsNorm(#eps))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn graph(source: &str) -> Graph {
        let decl = crate::syntax::parse_toml(&crate::diagnostic::SourceFile::new("test.toml", source))
            .expect("parses");
        crate::ir::lower(&decl).expect("lowers")
    }

    #[test]
    fn every_part_of_the_graph_is_written_out() {
        let g = graph(
            r#"
[graph]
name = "norm_gelu"
doc = "A norm, a GEMM and GELU."
[dims]
M = "dyn"
D = 64
[inputs]
x = "f16[M, D]"
[weights]
gamma = "f16[D]"
w = "f16[D, D]"
[outputs]
y = "gelu(rmsnorm(x, gamma, eps = 0.00001) @ w^T)"
"#,
        );
        let text = declared_graph(&g).to_string();
        for part in [
            "\"A norm, a GEMM and GELU.\"",
            "(\"M\" , None)",
            "(\"D\" , Some (64))",
            "OpCode :: RmsNorm (0.00001f64)",
            "OpCode :: MatMul (fusion :: ir :: WeightLayout :: NK)",
            "OpCode :: Activation (\"gelu\")",
            "DType :: F16",
        ] {
            assert!(text.contains(part), "`{part}` missing from {text}");
        }
    }

    #[test]
    fn an_eps_is_written_so_that_it_reads_back_exactly() {
        for eps in [1e-5, 1e-6, 0.1 + 0.2, f64::MIN_POSITIVE] {
            let text = Literal::f64_suffixed(eps).to_string();
            let back: f64 = text.trim_end_matches("f64").parse().expect("a number");
            assert_eq!(back.to_bits(), eps.to_bits(), "{text}");
        }
    }
}
