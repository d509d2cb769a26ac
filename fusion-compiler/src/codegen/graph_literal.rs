//! A graph as Rust code that builds it: the body of a generated struct's
//! `graph()`, so that a program carries its graph as data fixed when its
//! build script ran, not as a declaration parsed again at run time.
//!
//! Every field is written out (spans aside, which become `Span::None`: the
//! graph has been checked, no error will point into it). The matches below
//! name every variant, so a new kind of op or extent fails to compile here
//! until it is written out too.

use crate::ir::{DType, Extent, Graph, OpKind, TensorKind, WeightLayout};
use proc_macro2::{Literal, TokenStream};
use quote::quote;

/// An expression of type `fusion::ir::Graph` equal to `graph`: a block that
/// names the IR's types and builds it.
pub fn graph_expr(graph: &Graph) -> TokenStream {
    let name = &graph.name;
    let doc = match &graph.doc {
        Some(doc) => quote!(Some(#doc.to_owned())),
        None => quote!(None),
    };
    let dims = graph.dims.iter().map(|d| {
        let name = &d.name;
        let size = match d.size {
            Some(n) => quote!(Some(#n)),
            None => quote!(None),
        };
        quote!(DimDef { name: #name.to_owned(), size: #size, span: Span::None })
    });
    let tensors = graph.tensors.iter().map(|t| {
        let name = &t.name;
        let dtype = dtype_tokens(t.dtype);
        let shape = t.shape.iter().map(|&e| extent_tokens(e));
        let kind = match t.kind {
            TensorKind::Input => quote!(Input),
            TensorKind::Weight => quote!(Weight),
            TensorKind::Intermediate => quote!(Intermediate),
            TensorKind::Output => quote!(Output),
        };
        quote! {
            TensorDesc {
                name: #name.to_owned(),
                dtype: #dtype,
                shape: vec![#(#shape),*],
                kind: TensorKind::#kind,
                span: Span::None,
            }
        }
    });
    let ops = graph.ops.iter().map(|op| {
        let kind = op_kind_tokens(&op.kind);
        let inputs = op.inputs.iter().map(|t| tensor_id(t.0));
        let output = tensor_id(op.output.0);
        quote! {
            Op {
                kind: #kind,
                inputs: vec![#(#inputs),*],
                output: #output,
                span: Span::None,
            }
        }
    });
    let ids = |list: &[crate::ir::TensorId]| {
        let ids = list.iter().map(|t| tensor_id(t.0));
        quote!(vec![#(#ids),*])
    };
    let (inputs, weights, outputs) = (ids(&graph.inputs), ids(&graph.weights), ids(&graph.outputs));
    quote! {{
        #[allow(unused_imports, reason = "the graph's ops may not need each of them")]
        use fusion::ir::{
            Activation, DType, DimDef, DimId, Extent, Graph, Op, OpKind, TensorDesc, TensorId, TensorKind,
            WeightLayout,
        };
        use fusion::core::diagnostic::Span;
        Graph {
            name: #name.to_owned(),
            doc: #doc,
            dims: vec![#(#dims),*],
            tensors: vec![#(#tensors),*],
            ops: vec![#(#ops),*],
            inputs: #inputs,
            weights: #weights,
            outputs: #outputs,
        }
    }}
}

fn tensor_id(index: usize) -> TokenStream {
    let index = Literal::usize_unsuffixed(index);
    quote!(TensorId(#index))
}

fn dtype_tokens(dtype: DType) -> TokenStream {
    match dtype {
        DType::F16 => quote!(DType::F16),
        DType::BF16 => quote!(DType::BF16),
        DType::F32 => quote!(DType::F32),
    }
}

fn extent_tokens(extent: Extent) -> TokenStream {
    match extent {
        Extent::Static(n) => quote!(Extent::Static(#n)),
        Extent::Dynamic(d) => {
            let index = Literal::usize_unsuffixed(d.0);
            quote!(Extent::Dynamic(DimId(#index)))
        }
    }
}

fn op_kind_tokens(kind: &OpKind) -> TokenStream {
    match *kind {
        OpKind::MatMul { b_layout } => {
            let layout = match b_layout {
                WeightLayout::KN => quote!(KN),
                WeightLayout::NK => quote!(NK),
            };
            quote!(OpKind::MatMul { b_layout: WeightLayout::#layout })
        }
        OpKind::BiasAdd => quote!(OpKind::BiasAdd),
        OpKind::Add => quote!(OpKind::Add),
        OpKind::Mul => quote!(OpKind::Mul),
        // The op table's row by its name: the rows are statics of the table,
        // which a literal cannot name.
        OpKind::Activation(activation) => {
            let name = activation.name();
            quote! {
                OpKind::Activation(
                    Activation::named(#name)
                        .expect("the build script's op table has this activation")
                )
            }
        }
        OpKind::LayerNorm { eps } => {
            let eps = Literal::f64_suffixed(eps);
            quote!(OpKind::LayerNorm { eps: #eps })
        }
        OpKind::RmsNorm { eps } => {
            let eps = Literal::f64_suffixed(eps);
            quote!(OpKind::RmsNorm { eps: #eps })
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
        let text = graph_expr(&g).to_string();
        for part in [
            "\"norm_gelu\"",
            "\"A norm, a GEMM and GELU.\"",
            "size : None",
            "size : Some (64u64)",
            "RmsNorm { eps : 0.00001f64 }",
            "MatMul { b_layout : WeightLayout :: NK }",
            "Activation :: named (\"gelu\")",
            "Extent :: Dynamic (DimId (0))",
            "TensorKind :: Weight",
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
