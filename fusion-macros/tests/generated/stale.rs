// A graph whose generated file was written from other tokens (its
// FINGERPRINT differs): the compile-time check fails with a message that
// says the graph was edited after build.rs ran, not a type error from
// wrappers for another version of it.
fusion_macros::fusion_graph! {
    pub graph Stale {
        dims { M: dyn, D: 64 }
        input x: f16[M, D];
        weight w: f16[D, D], b: f16[D];
        output y = relu(x @ w^T + b);
    }
}

fn main() {}
