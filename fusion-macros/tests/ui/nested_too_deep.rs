fusion_macros::fusion_graph! {
    graph g {
        dims { M: dyn, D: 64 }
        input x: f16[M, D];
        output y = relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(
            relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(
            relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(
            relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(relu(
            x
        ))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))));
    }
}

fn main() {}
