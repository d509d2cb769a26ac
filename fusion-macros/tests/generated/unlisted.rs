// A valid graph in a crate whose build script ran but did not list this
// file, so OUT_DIR has no `fusion_graphs/Unlisted.rs`: one error that says
// which `.sources(...)` call to add, not an include! failure.
fusion_macros::fusion_graph! {
    pub graph Unlisted {
        dims { M: dyn, D: 64 }
        input x: f16[M, D];
        weight w: f16[D, D], b: f16[D];
        output y = gelu(x @ w^T + b);
    }
}

fn main() {}
