fusion_macros::fusion_graph! {
    graph g {
        dims { M: dyn }
        input x: f16[M, D];
        output y = silu(x);
    }
}

fn main() {}
