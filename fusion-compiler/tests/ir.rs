//! IR validation through the programmatic API: shape and dtype inference,
//! naming rules, and the whole-graph checks `GraphBuilder::build` makes.

use fusion_compiler::ir::{DType, Extent, GraphBuilder, OpKind, TensorKind, WeightLayout};

fn builder() -> (GraphBuilder, Extent, Extent, Extent) {
    let mut b = GraphBuilder::new("g");
    let m = b.dynamic_dim("M").unwrap();
    let d = b.static_dim("D", 64).unwrap();
    let f = b.static_dim("F", 256).unwrap();
    (b, m, d, f)
}

#[test]
fn matmul_infers_shape_for_both_layouts() {
    let (mut b, m, d, f) = builder();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let w_nk = b.weight("w_nk", DType::F16, &[f, d]).unwrap();
    let w_kn = b.weight("w_kn", DType::F16, &[d, f]).unwrap();
    let y1 = b.matmul(x, w_nk, WeightLayout::NK).unwrap();
    let y2 = b.matmul(x, w_kn, WeightLayout::KN).unwrap();
    assert_eq!(b.tensor(y1).shape, vec![m, f]);
    assert_eq!(b.tensor(y2).shape, vec![m, f]);
    let y = b.add(y1, y2).unwrap();
    b.output("y", y).unwrap();
    let g = b.build().unwrap();
    assert_eq!(g.ops.len(), 3);
    assert_eq!(g.type_string(g.outputs[0]), "f16[M, 256]");
    assert_eq!(g.tensor(g.outputs[0]).kind, TensorKind::Output);
}

#[test]
fn matmul_inner_dim_mismatch_names_both_operands() {
    let (mut b, m, d, f) = builder();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let w = b.weight("w", DType::F16, &[f, d]).unwrap();
    // [M, 64] @ [256, 64] without ^T: 64 columns against 256 rows.
    let err = b.matmul(x, w, WeightLayout::KN).unwrap_err();
    assert!(
        err.message.contains("shape mismatch in matmul"),
        "{}",
        err.message
    );
    assert!(
        err.message.contains("`x`") && err.message.contains("`w`"),
        "{}",
        err.message
    );
}

#[test]
fn dtype_mismatch_is_an_error() {
    let (mut b, m, d, _) = builder();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let r = b.input("r", DType::BF16, &[m, d]).unwrap();
    let err = b.add(x, r).unwrap_err();
    assert!(
        err.message.starts_with("dtype mismatch in add"),
        "{}",
        err.message
    );
    assert!(err.message.contains("bf16"), "{}", err.message);
}

#[test]
fn elementwise_shapes_must_match_and_bias_must_be_a_row() {
    let (mut b, m, d, f) = builder();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let z = b.input("z", DType::F16, &[m, f]).unwrap();
    let bias_wrong = b.weight("bias", DType::F16, &[f]).unwrap();
    assert!(b.mul(x, z).unwrap_err().message.contains("shape mismatch in mul"));
    assert!(
        b.bias_add(x, bias_wrong)
            .unwrap_err()
            .message
            .contains("shape mismatch in bias add")
    );
}

#[test]
fn dynamic_dims_match_only_themselves() {
    let mut b = GraphBuilder::new("g");
    let m = b.dynamic_dim("M").unwrap();
    let n = b.dynamic_dim("N").unwrap();
    let d = b.static_dim("D", 8).unwrap();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let y = b.input("y", DType::F16, &[n, d]).unwrap();
    let err = b.add(x, y).unwrap_err();
    assert!(
        err.message.contains("f16[M, 8]") && err.message.contains("f16[N, 8]"),
        "{}",
        err.message
    );
}

#[test]
fn static_dims_compare_by_size_not_name() {
    let mut b = GraphBuilder::new("g");
    let m = b.dynamic_dim("M").unwrap();
    let d = b.static_dim("D", 8).unwrap();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let y = b.input("y", DType::F16, &[m, Extent::Static(8)]).unwrap();
    let s = b.add(x, y).unwrap();
    b.output("s", s).unwrap();
    assert!(b.build().is_ok());
}

#[test]
fn dims_must_be_between_one_and_two_to_the_31() {
    let mut b = GraphBuilder::new("g");
    assert!(
        b.static_dim("Z", 0)
            .unwrap_err()
            .message
            .contains("must be at least 1")
    );
    let too_big = b.static_dim("H", 1 << 31).unwrap_err();
    assert!(too_big.message.contains("too large"), "{}", too_big.message);
    assert!(b.static_dim("B", (1 << 31) - 1).is_ok());
}

#[test]
fn names_are_checked_and_defined_once() {
    let (mut b, m, d, _) = builder();
    b.input("x", DType::F16, &[m, d]).unwrap();
    let twice = b.input("x", DType::F16, &[m, d]).unwrap_err();
    assert_eq!(twice.message, "`x` is defined twice");
    assert_eq!(twice.labels.len(), 1, "points at the first definition");
    assert!(
        b.input("M", DType::F16, &[m, d])
            .unwrap_err()
            .message
            .contains("defined twice")
    );
    assert!(
        b.input("2x", DType::F16, &[m, d])
            .unwrap_err()
            .message
            .contains("not a valid tensor name")
    );
    assert!(
        b.input("type", DType::F16, &[m, d])
            .unwrap_err()
            .message
            .contains("reserved word")
    );
    // A parameter named like a prelude variant would be read as a pattern.
    for name in ["None", "Some", "Ok", "Err", "stream"] {
        let message = b.input(name, DType::F16, &[m, d]).unwrap_err().message;
        assert!(message.contains("reserved word"), "{name}: {message}");
    }
    // Generated wrappers declare their own names with this prefix.
    assert_eq!(
        b.input("__call", DType::F16, &[m, d]).unwrap_err().message,
        "`__call` cannot name a tensor: names starting with `__` are kept for the code fusion generates"
    );
    let message = b.static_dim("__D", 8).unwrap_err().message;
    assert!(message.contains("cannot name a dim"), "{message}");
}

#[test]
fn rank_must_be_one_or_two() {
    let (mut b, m, d, f) = builder();
    let err = b.input("x", DType::F16, &[m, d, f]).unwrap_err();
    assert!(err.message.contains("rank 3"), "{}", err.message);
}

#[test]
fn norms_check_params_and_eps() {
    let (mut b, m, d, f) = builder();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let g = b.weight("g", DType::F16, &[d]).unwrap();
    let g_wrong = b.weight("g_wrong", DType::F16, &[f]).unwrap();
    assert!(
        b.rmsnorm(x, g_wrong, 1e-6)
            .unwrap_err()
            .message
            .contains("shape mismatch in rmsnorm")
    );
    assert!(
        b.rmsnorm(x, g, 0.0)
            .unwrap_err()
            .message
            .contains("eps must be a positive number")
    );
    let n = b.layernorm(x, g, g, 1e-5).unwrap();
    assert!(matches!(b.tensor(n).shape[..], [_, Extent::Static(64)]));
}

#[test]
fn build_rejects_no_outputs_unused_declarations_and_dead_ops() {
    let (mut b, m, d, _) = builder();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    b.input("unused", DType::F16, &[m, d]).unwrap();
    b.relu(x).unwrap();
    let y = b.silu(x).unwrap();
    b.output("y", y).unwrap();
    let errs = b.build().unwrap_err();
    let messages: Vec<&str> = errs.iter().map(|d| d.message.as_str()).collect();
    assert_eq!(messages.len(), 2, "{messages:?}");
    assert!(messages[0].contains("`unused` is declared but no output uses it"));
    assert!(messages[1].contains("(relu) is computed but no output uses it"));

    let (b, ..) = builder();
    let errs = b.build().unwrap_err();
    assert!(errs.0[0].message.contains("has no outputs"));
}

#[test]
fn an_output_must_be_computed() {
    let (mut b, m, d, _) = builder();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let err = b.output("y", x).unwrap_err();
    assert!(err.message.contains("must be computed"), "{}", err.message);
}

#[test]
fn graph_name_must_be_an_identifier() {
    let mut b = GraphBuilder::new("my graph");
    let m = b.dynamic_dim("M").unwrap();
    let x = b.input("x", DType::F16, &[m, Extent::Static(8)]).unwrap();
    let y = b.relu(x).unwrap();
    b.output("y", y).unwrap();
    assert!(
        b.build().unwrap_err().0[0]
            .message
            .contains("not a valid graph name")
    );
}

#[test]
fn uses_count_repeats_and_outputs() {
    let (mut b, m, d, _) = builder();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let sq = b.mul(x, x).unwrap();
    let y = b.relu(sq).unwrap();
    b.output("y", y).unwrap();
    let z = b.gelu(sq).unwrap();
    b.output("z", z).unwrap();
    let g = b.build().unwrap();
    assert_eq!(g.use_count(x), 2, "x * x reads x twice");
    assert_eq!(g.use_count(sq), 2);
    assert_eq!(g.use_count(y), 1, "an output counts as a use");
    assert_eq!(g.op(g.producer(sq).unwrap()).kind, OpKind::Mul);
    assert!(g.producer(x).is_none());
}

#[test]
fn fp8_scales_are_given_once_to_declared_fp8_tensors() {
    let (mut b, m, d, f) = builder();
    let one = Extent::Static(1);
    let x = b.input("x", DType::F8E4M3, &[m, d]).unwrap();
    let x_scale = b.weight("x_scale", DType::F32, &[one]).unwrap();
    // [K, N]: one scale per output column, the weight's second axis.
    let w = b.weight("w", DType::F8E4M3, &[d, f]).unwrap();
    let w_scale = b.weight("w_scale", DType::F32, &[f]).unwrap();
    let h = b.weight("h", DType::BF16, &[f]).unwrap();
    // A matmul before the scale is given is refused: that is where the
    // scale is checked against the output columns.
    let err = b.matmul(x, w, WeightLayout::KN).unwrap_err();
    assert!(err.message.contains("`x` is f8e4m3 but has no scale"), "{err}");
    b.scale(x, x_scale).unwrap();
    b.scale(w, w_scale).unwrap();
    let err = b.scale(w, x_scale).unwrap_err();
    assert_eq!(err.message, "`w` already has the scale `w_scale`");
    let err = b.scale(h, x_scale).unwrap_err();
    assert!(err.message.contains("`h`: bf16[256] takes no scale"), "{err}");
    let y = b.matmul(x, w, WeightLayout::KN).unwrap();
    assert_eq!(b.tensor(y).dtype, DType::BF16);
    let err = b.scale(y, x_scale).unwrap_err();
    assert!(err.message.contains("takes no scale"), "{err}");
    let err = b.relu(x).unwrap_err();
    assert!(err.message.contains("cannot be an operand of relu"), "{err}");
    let y = b.bias_add(y, h).unwrap();
    b.output("y", y).unwrap();
    // The scales are no op's operands, but live: they are read with their
    // tensors.
    let g = b.build().unwrap();
    assert_eq!(g.tensor(x).scale, Some(x_scale));
    assert_eq!(g.scales(), vec![x_scale, w_scale]);
}
