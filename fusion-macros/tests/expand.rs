//! `fusion_graph!` expands a valid graph to its module.

use fusion_macros::fusion_graph;

fusion_graph! {
    /// Llama-3-8B SwiGLU feed-forward block.
    pub graph swiglu_ffn {
        dims { M: dyn, D: 4096, F: 14336 }
        input x: f16[M, D];
        weight w_gate: f16[F, D], w_up: f16[F, D], w_down: f16[D, F];
        let gate = silu(x @ w_gate^T);
        let h = gate * (x @ w_up^T);
        output y = h @ w_down^T + x;
    }
}

#[test]
fn expands_to_a_module_named_after_the_graph() {
    assert_eq!(swiglu_ffn::NAME, "swiglu_ffn");
    assert!(
        swiglu_ffn::DECLARATION.contains("output y"),
        "{}",
        swiglu_ffn::DECLARATION
    );
    // The declaration round-trips through the parser.
    let tokens: proc_macro2::TokenStream = swiglu_ffn::DECLARATION.parse().unwrap();
    let decl = fusion_core::syntax::parse_tokens(tokens).unwrap();
    assert_eq!(decl.doc.as_deref(), Some("Llama-3-8B SwiGLU feed-forward block."));
}
