fusion_macros::fusion_graph! {
    graph g {
        dims { M: dyn, D: 64 }
        input x: f16[M, D];
        let a = b + x;
        let b = a + x;
        output y = a;
    }
}

fn main() {}
