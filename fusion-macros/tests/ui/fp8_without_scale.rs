fusion_macros::fusion_graph! {
    graph g {
        dims { M: dyn, K: 64, N: 32 }
        input x: f8e4m3[M, K] scale x_scale;
        weight x_scale: f32[1], w: f8e4m3[N, K];
        output y = x @ w^T;
    }
}

fn main() {}
