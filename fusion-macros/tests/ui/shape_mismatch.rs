fusion_macros::fusion_graph! {
    graph g {
        dims { M: dyn, D: 64, F: 128 }
        input x: f16[M, D];
        weight w: f16[F, F];
        output y = x @ w^T;
    }
}

fn main() {}
