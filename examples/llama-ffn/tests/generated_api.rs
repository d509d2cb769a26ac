//! Builds the example crate, which runs its build script: both graphs were
//! read from `src/model.rs`, planned and compiled by nvcc. Needs no GPU.

use llama_ffn::model::{Gpt2Mlp, SwigluFfn};

#[test]
fn the_generated_structs_carry_their_declarations() {
    let ffn = SwigluFfn::graph();
    assert_eq!(ffn.name, "SwigluFfn");
    let names: Vec<&str> = ffn.weights.iter().map(|&t| ffn.tensor(t).name.as_str()).collect();
    assert_eq!(names, ["w_gate", "w_up", "w_down"]);
    assert!(
        SwigluFfn::DECLARATION.contains("14336"),
        "{}",
        SwigluFfn::DECLARATION
    );

    let mlp = Gpt2Mlp::graph();
    assert_eq!(mlp.weights.len(), 6);
    assert_eq!(mlp.type_string(mlp.outputs[0]), "f16[M, 768]");
}

#[test]
fn the_build_script_fused_each_graph() {
    // SwiGLU: gate and up GEMMs, then the down GEMM with the residual;
    // GPT-2: LayerNorm+c_fc+GELU, then c_proj with bias and residual.
    let plan = |graph| fusion::core::fuse::plan(graph).kernels.len();
    assert!(plan(SwigluFfn::graph()) <= 3);
    assert_eq!(plan(Gpt2Mlp::graph()), 2);
}

#[test]
fn graph_is_the_declaration_written_out_as_data() {
    let parsed = |declaration: &str| {
        let tokens = declaration.parse().expect("tokens");
        fusion::core::syntax::parse_tokens(tokens)
            .and_then(|decl| fusion::ir::lower(&decl))
            .expect("the build script checked it")
    };
    assert_eq!(SwigluFfn::graph(), parsed(SwigluFfn::DECLARATION));
    assert_eq!(Gpt2Mlp::graph(), parsed(Gpt2Mlp::DECLARATION));
}
