fusion_macros::fusion_graph! {
    graph g {
        dims { M: dyn, D: 64 }
        input __call: f16[M, D], None: f16[M, D];
        output y = silu(__call) + None;
    }
}

fn main() {}
