// A valid graph in a crate whose build script never generated it: one
// error that says what to add, not an include! failure.
fusion_macros::fusion_graph! {
    /// A linear layer with GELU.
    pub graph Mlp {
        dims { M: dyn, D: 64 }
        input x: f16[M, D];
        weight w: f16[D, D], b: f16[D];
        output y = gelu(x @ w^T + b);
    }
}

fn main() {}
