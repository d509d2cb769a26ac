//! The model's blocks, declared where they are used. The build script reads
//! this file, so every edit here recompiles exactly the kernels it changes.

fusion::fusion_graph! {
    /// Llama-style SwiGLU feed-forward block (Llama 3 8B sizes), with the
    /// residual add fused into the down projection.
    pub graph SwigluFfn {
        dims { M: dyn, D: 4096, F: 14336 }
        input x: f16[M, D];
        weight w_gate: f16[F, D], w_up: f16[F, D], w_down: f16[D, F]; // nn.Linear layout: [out, in]
        output y = (silu(x @ w_gate^T) * (x @ w_up^T)) @ w_down^T + x;
    }
}

fusion::fusion_graph! {
    /// GPT-2 (124M) MLP block: LayerNorm, c_fc, GELU, c_proj, residual add.
    pub graph Gpt2Mlp {
        dims { M: dyn, D: 768, F: 3072 }
        input x: f16[M, D];
        weight ln_g: f16[D], ln_b: f16[D], w_fc: f16[F, D], b_fc: f16[F], w_proj: f16[D, F], b_proj: f16[D];
        let h = gelu(layernorm(x, ln_g, ln_b) @ w_fc^T + b_fc);
        output y = h @ w_proj^T + b_proj + x;
    }
}
