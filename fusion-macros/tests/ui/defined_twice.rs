fusion_macros::fusion_graph! {
    graph g {
        dims { M: dyn, D: 64 }
        input x: f16[M, D];
        let h = silu(x);
        let h = gelu(x);
        output y = h;
    }
}

fn main() {}
