//! The CPU reference against values worked out by hand, and its error
//! handling. Every expected number below is derived in the comment above it.

use fusion_compiler::ir::{Activation, DType, Extent, Graph, GraphBuilder, TensorId, WeightLayout};
use fusion_compiler::reference::{
    Bindings, HostTensor, Intermediates, ReferenceError, erf, evaluate, evaluate_all, evaluate_rows,
    evaluate_rows_with, gelu_erf, gelu_tanh, max_abs_error, random_bindings, relative_error, silu,
};
use half::{bf16, f16};
use rand::SeedableRng;
use rand::rngs::StdRng;

fn tensor(shape: &[usize], data: &[f64]) -> HostTensor {
    HostTensor::new(shape, data.to_vec()).unwrap()
}

fn bindings(pairs: &[(&str, HostTensor)]) -> Bindings {
    pairs.iter().map(|(n, t)| (n.to_string(), t.clone())).collect()
}

fn assert_close(got: &[f64], want: &[f64], tolerance: f64) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= tolerance, "element {i}: got {g}, want {w}");
    }
}

/// `y = op(x)` for a one-input elementwise op on `x: f32[M, N]`.
fn unary_graph(n: u64, op: impl FnOnce(&mut GraphBuilder, TensorId) -> TensorId) -> Graph {
    let mut b = GraphBuilder::new("unary");
    let m = b.dynamic_dim("M").unwrap();
    let d = b.static_dim("N", n).unwrap();
    let x = b.input("x", DType::F32, &[m, d]).unwrap();
    let y = op(&mut b, x);
    b.output("y", y).unwrap();
    b.build().unwrap()
}

fn eval_unary(graph: &Graph, x: HostTensor) -> Vec<f64> {
    let out = evaluate(graph, &bindings(&[("x", x)])).unwrap();
    out["y"].data.clone()
}

/// `y = x @ w` with x `[M, 3]` and w `[3, 2]` (KN) or `[2, 3]` (NK).
fn matmul_graph(layout: WeightLayout) -> Graph {
    let mut b = GraphBuilder::new("matmul");
    let m = b.dynamic_dim("M").unwrap();
    let k = b.static_dim("K", 3).unwrap();
    let n = b.static_dim("N", 2).unwrap();
    let x = b.input("x", DType::F16, &[m, k]).unwrap();
    let w_shape = match layout {
        WeightLayout::KN => [k, n],
        WeightLayout::NK => [n, k],
    };
    let w = b.weight("w", DType::F16, &w_shape).unwrap();
    let y = b.matmul(x, w, layout).unwrap();
    b.output("y", y).unwrap();
    b.build().unwrap()
}

#[test]
fn matmul_in_both_layouts() {
    // [[1, 2, 3], [4, 5, 6]] @ [[7, 8], [9, 10], [11, 12]]:
    //   row 0: 1·7 + 2·9 + 3·11 = 58,   1·8 + 2·10 + 3·12 = 64
    //   row 1: 4·7 + 5·9 + 6·11 = 139,  4·8 + 5·10 + 6·12 = 154
    let x = tensor(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let want = [58.0, 64.0, 139.0, 154.0];

    let w_kn = tensor(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
    let out = evaluate(
        &matmul_graph(WeightLayout::KN),
        &bindings(&[("x", x.clone()), ("w", w_kn)]),
    )
    .unwrap();
    assert_eq!(out["y"].shape, vec![2, 2]);
    assert_eq!(out["y"].data, want);

    // The same product with the weight stored as its transpose, [N, K].
    let w_nk = tensor(&[2, 3], &[7.0, 9.0, 11.0, 8.0, 10.0, 12.0]);
    let out = evaluate(
        &matmul_graph(WeightLayout::NK),
        &bindings(&[("x", x), ("w", w_nk)]),
    )
    .unwrap();
    assert_eq!(out["y"].data, want);
}

#[test]
fn bias_add_broadcasts_over_rows() {
    let mut b = GraphBuilder::new("bias");
    let m = b.dynamic_dim("M").unwrap();
    let n = b.static_dim("N", 2).unwrap();
    let x = b.input("x", DType::F32, &[m, n]).unwrap();
    let bias = b.weight("bias", DType::F32, &[n]).unwrap();
    let y = b.bias_add(x, bias).unwrap();
    b.output("y", y).unwrap();
    let graph = b.build().unwrap();
    // [[1, 2], [3, 4]] + [10, 20] on each row = [[11, 22], [13, 24]].
    let out = evaluate(
        &graph,
        &bindings(&[
            ("x", tensor(&[2, 2], &[1.0, 2.0, 3.0, 4.0])),
            ("bias", tensor(&[2], &[10.0, 20.0])),
        ]),
    )
    .unwrap();
    assert_eq!(out["y"].data, vec![11.0, 22.0, 13.0, 24.0]);
}

#[test]
fn add_and_mul_are_elementwise() {
    let mut b = GraphBuilder::new("arith");
    let m = b.dynamic_dim("M").unwrap();
    let n = b.static_dim("N", 3).unwrap();
    let x = b.input("x", DType::F32, &[m, n]).unwrap();
    let r = b.input("r", DType::F32, &[m, n]).unwrap();
    let s = b.add(x, r).unwrap();
    let p = b.mul(x, r).unwrap();
    b.output("s", s).unwrap();
    b.output("p", p).unwrap();
    let graph = b.build().unwrap();
    let out = evaluate(
        &graph,
        &bindings(&[
            ("x", tensor(&[1, 3], &[1.0, -2.0, 0.5])),
            ("r", tensor(&[1, 3], &[3.0, 4.0, -8.0])),
        ]),
    )
    .unwrap();
    // Outputs come back in declaration order.
    assert_eq!(out.keys().collect::<Vec<_>>(), ["s", "p"]);
    assert_eq!(out["s"].data, vec![4.0, 2.0, -7.5]);
    assert_eq!(out["p"].data, vec![3.0, -8.0, -4.0]);
}

#[test]
fn gelu_tanh_known_values() {
    // gelu_tanh(1) = 0.5·(1 + tanh(√(2/π)·1.044715)) = 0.5·(1 + tanh(0.8335565…))
    //              = 0.5·(1 + 0.6823839…) = 0.8411919906…
    // The tanh form is odd around x/2: gelu(x) − gelu(−x) = x, so
    // gelu_tanh(−1) = 0.8411919906 − 1 = −0.1588080094.
    let graph = unary_graph(3, |b, x| b.gelu(x).unwrap());
    let got = eval_unary(&graph, tensor(&[1, 3], &[0.0, 1.0, -1.0]));
    assert_close(&got, &[0.0, 0.8411919906, -0.1588080094], 1e-10);
    assert_eq!(gelu_tanh(0.0), 0.0);
}

#[test]
fn gelu_erf_known_values() {
    // gelu_erf(1) = 0.5·(1 + erf(1/√2)) = 0.5·(1 + 0.6826894921) = 0.8413447461
    // (erf(1/√2) is the one-sigma probability of a normal distribution).
    let graph = unary_graph(2, |b, x| b.gelu_erf(x).unwrap());
    let got = eval_unary(&graph, tensor(&[1, 2], &[1.0, 0.0]));
    assert_close(&got, &[0.8413447461, 0.0], 1e-10);
    // Far out on the negative side the value is tiny but not zero:
    // gelu_erf(−10) = −10·Φ(−10) = −10·7.6198530241605e−24.
    let far = gelu_erf(-10.0);
    assert!((far / -7.6198530241605e-23 - 1.0).abs() < 1e-10, "{far}");
}

#[test]
fn silu_and_relu_known_values() {
    // silu(1) = 1/(1 + e^−1) = 1/1.3678794412 = 0.7310585786;
    // silu(−1) = −1/(1 + e) = −0.2689414214.
    let graph = unary_graph(3, |b, x| b.silu(x).unwrap());
    let got = eval_unary(&graph, tensor(&[1, 3], &[1.0, -1.0, 0.0]));
    assert_close(&got, &[0.7310585786, -0.2689414214, 0.0], 1e-10);
    assert_close(&[silu(1.0)], &[0.7310585786], 1e-10);

    let graph = unary_graph(4, |b, x| b.relu(x).unwrap());
    let got = eval_unary(&graph, tensor(&[1, 4], &[-2.0, 0.0, 0.25, 7.0]));
    assert_eq!(got, vec![0.0, 0.0, 0.25, 7.0]);
}

#[test]
fn sigmoid_and_gelu_quick_known_values_and_limits() {
    // sigmoid(2) = 1/(1 + e^−2) = 1/1.1353352832 = 0.8807970780, and
    // sigmoid(−x) = 1 − sigmoid(x). PyTorch: sigmoid(±∞) = 1, 0; NaN stays NaN.
    let sigmoid = Activation::named("sigmoid").unwrap();
    let graph = unary_graph(6, |b, x| b.activation(sigmoid, x).unwrap());
    let x = [0.0, 2.0, -2.0, f64::INFINITY, f64::NEG_INFINITY, f64::NAN];
    let got = eval_unary(&graph, tensor(&[1, 6], &x));
    assert_close(&got[..5], &[0.5, 0.8807970780, 0.1192029220, 1.0, 0.0], 1e-10);
    assert!(got[5].is_nan());

    // gelu_quick(x) = x·sigmoid(1.702·x): gelu_quick(1) = 1/(1 + e^−1.702)
    // = 1/1.1823185221 = 0.8457957659; gelu_quick(−1) = gelu_quick(1) − 1.
    // PyTorch's x * sigmoid(1.702 * x) at −∞ is −∞ · 0 = NaN.
    let quick = Activation::named("gelu_quick").unwrap();
    let graph = unary_graph(5, |b, x| b.activation(quick, x).unwrap());
    let x = [1.0, -1.0, 0.0, f64::INFINITY, f64::NEG_INFINITY];
    let got = eval_unary(&graph, tensor(&[1, 5], &x));
    assert_close(&got[..3], &[0.8457957659, -0.1542042341, 0.0], 1e-10);
    assert_eq!(got[3], f64::INFINITY);
    assert!(got[4].is_nan());
}

#[test]
fn erf_table() {
    // Values of erf from published tables, checked with arbitrary-precision
    // arithmetic and written as the nearest f64.
    let table = [
        (0.0, 0.0),
        (0.01, 0.011283415555849616),
        (0.1, 0.1124629160182849),
        (0.5, 0.5204998778130465),
        (1.0, 0.8427007929497149),
        (1.5, 0.9661051464753108),
        (2.0, 0.9953222650189527),
        (2.5, 0.999593047982555),
        (3.0, 0.9999779095030014),
        (4.0, 0.9999999845827421),
        // erf(6) = 1 − 2.15e−17, which is 1 in f64.
        (6.0, 1.0),
    ];
    for (x, want) in table {
        assert!(
            (erf(x) - want).abs() < 1e-12,
            "erf({x}) = {}, want {want}",
            erf(x)
        );
        // erf is odd.
        assert!((erf(-x) + want).abs() < 1e-12, "erf(-{x})");
    }
}

#[test]
fn layernorm_of_one_to_four() {
    // mean = 2.5; biased var = (1.5² + 0.5² + 0.5² + 1.5²)/4 = 5/4;
    // √1.25 = 1.1180339887; (x − mean)/√var = ±1.5/1.118… = ±1.3416407865,
    // ±0.5/1.118… = ±0.4472135955. The builder needs eps > 0: 1e-300 vanishes
    // next to 1.25 in f64, so this is eps = 0.
    let mut b = GraphBuilder::new("ln");
    let m = b.dynamic_dim("M").unwrap();
    let n = b.static_dim("N", 4).unwrap();
    let x = b.input("x", DType::F32, &[m, n]).unwrap();
    let gamma = b.weight("gamma", DType::F32, &[n]).unwrap();
    let beta = b.weight("beta", DType::F32, &[n]).unwrap();
    let y = b.layernorm(x, gamma, beta, 1e-300).unwrap();
    b.output("y", y).unwrap();
    let graph = b.build().unwrap();
    let run = |gamma: &[f64], beta: &[f64]| {
        evaluate(
            &graph,
            &bindings(&[
                ("x", tensor(&[1, 4], &[1.0, 2.0, 3.0, 4.0])),
                ("gamma", tensor(&[4], gamma)),
                ("beta", tensor(&[4], beta)),
            ]),
        )
        .unwrap()["y"]
            .data
            .clone()
    };
    let normalised = [-1.3416407865, -0.4472135955, 0.4472135955, 1.3416407865];
    assert_close(&run(&[1.0; 4], &[0.0; 4]), &normalised, 1e-10);
    // With gamma [2, 1, 1, −1] and beta [0, 1, 0, 0.5]:
    // [−2.6832815730, 0.5527864045, 0.4472135955, −0.8416407865].
    assert_close(
        &run(&[2.0, 1.0, 1.0, -1.0], &[0.0, 1.0, 0.0, 0.5]),
        &[-2.6832815730, 0.5527864045, 0.4472135955, -0.8416407865],
        1e-10,
    );
}

#[test]
fn rmsnorm_of_one_to_four() {
    // mean(x²) = (1 + 4 + 9 + 16)/4 = 7.5; rms = √7.5 = 2.7386127875;
    // x/rms = [0.3651483717, 0.7302967433, 1.0954451150, 1.4605934867].
    // With gamma [1, −1, 2, 0.5]: [0.3651483717, −0.7302967433, 2.1908902300,
    // 0.7302967433].
    let mut b = GraphBuilder::new("rms");
    let m = b.dynamic_dim("M").unwrap();
    let n = b.static_dim("N", 4).unwrap();
    let x = b.input("x", DType::BF16, &[m, n]).unwrap();
    let gamma = b.weight("gamma", DType::BF16, &[n]).unwrap();
    let y = b.rmsnorm(x, gamma, 1e-300).unwrap();
    b.output("y", y).unwrap();
    let graph = b.build().unwrap();
    let out = evaluate(
        &graph,
        &bindings(&[
            ("x", tensor(&[2, 4], &[1.0, 2.0, 3.0, 4.0, 1.0, 2.0, 3.0, 4.0])),
            ("gamma", tensor(&[4], &[1.0, -1.0, 2.0, 0.5])),
        ]),
    )
    .unwrap();
    let row = [0.3651483717, -0.7302967433, 2.1908902300, 0.7302967433];
    assert_close(&out["y"].data[..4], &row, 1e-10);
    // Each row is normalised on its own: the second equals the first.
    assert_close(&out["y"].data[4..], &row, 1e-10);
}

/// `h = relu(x @ w)`, `y = h + bias`: a matmul feeding two elementwise ops.
fn chain_graph() -> Graph {
    let mut b = GraphBuilder::new("chain");
    let m = b.dynamic_dim("M").unwrap();
    let n = b.static_dim("N", 2).unwrap();
    let x = b.input("x", DType::F16, &[m, n]).unwrap();
    let w = b.weight("w", DType::F16, &[n, n]).unwrap();
    let bias = b.weight("bias", DType::F16, &[n]).unwrap();
    let p = b.matmul(x, w, WeightLayout::KN).unwrap();
    let h = b.relu(p).unwrap();
    b.name(h, "h").unwrap();
    let y = b.bias_add(h, bias).unwrap();
    b.output("y", y).unwrap();
    b.build().unwrap()
}

fn chain_inputs() -> Bindings {
    bindings(&[
        ("x", tensor(&[2, 2], &[1.0, -1.0, 2.0, 3.0])),
        ("w", tensor(&[2, 2], &[1.0, 2.0, 3.0, -4.0])),
        ("bias", tensor(&[2], &[0.5, -0.5])),
    ])
}

#[test]
fn op_chain_and_its_intermediates() {
    // x @ w = [[1·1 − 1·3, 1·2 − 1·−4], [2·1 + 3·3, 2·2 + 3·−4]]
    //       = [[−2, 6], [11, −8]];
    // relu → [[0, 6], [11, 0]]; + [0.5, −0.5] → [[0.5, 5.5], [11.5, −0.5]].
    let graph = chain_graph();
    let out = evaluate(&graph, &chain_inputs()).unwrap();
    assert_eq!(out.len(), 1);
    assert_eq!(out["y"].data, vec![0.5, 5.5, 11.5, -0.5]);

    let all = evaluate_all(&graph, &chain_inputs()).unwrap();
    let names: Vec<&str> = all.keys().map(String::as_str).collect();
    assert_eq!(names.len(), 3);
    assert_eq!(&names[1..], ["h", "y"]);
    assert!(
        names[0].starts_with('%'),
        "the unnamed product keeps its generated name"
    );
    assert_eq!(all[0].data, vec![-2.0, 6.0, 11.0, -8.0]);
    assert_eq!(all["h"].data, vec![0.0, 6.0, 11.0, 0.0]);
    assert_eq!(all["y"], out["y"]);
}

/// An MLP block with every kind of op: LayerNorm → up projection (nn.Linear
/// layout) → bias → GELU → down projection (KN) → residual add, and an
/// RMSNorm-gated SiLU branch multiplied in.
fn block_graph() -> Graph {
    let mut b = GraphBuilder::new("block");
    let m = b.dynamic_dim("M").unwrap();
    let d = b.static_dim("D", 24).unwrap();
    let f = b.static_dim("F", 136).unwrap();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let gamma = b.weight("gamma", DType::F16, &[d]).unwrap();
    let beta = b.weight("beta", DType::F16, &[d]).unwrap();
    let w_up = b.weight("w_up", DType::F16, &[f, d]).unwrap();
    let b_up = b.weight("b_up", DType::F16, &[f]).unwrap();
    let w_gate = b.weight("w_gate", DType::F16, &[d, f]).unwrap();
    let w_down = b.weight("w_down", DType::F16, &[f, d]).unwrap();
    let g_rms = b.weight("g_rms", DType::F16, &[d]).unwrap();
    let normed = b.layernorm(x, gamma, beta, 1e-5).unwrap();
    let up = b.matmul(normed, w_up, WeightLayout::NK).unwrap();
    let up = b.bias_add(up, b_up).unwrap();
    let up = b.gelu_erf(up).unwrap();
    let rms = b.rmsnorm(x, g_rms, 1e-6).unwrap();
    let gate = b.matmul(rms, w_gate, WeightLayout::KN).unwrap();
    let gate = b.silu(gate).unwrap();
    let hidden = b.mul(up, gate).unwrap();
    let down = b.matmul(hidden, w_down, WeightLayout::KN).unwrap();
    let y = b.add(down, x).unwrap();
    let z = b.gelu(y).unwrap();
    b.output("y", y).unwrap();
    b.output("z", z).unwrap();
    b.build().unwrap()
}

#[test]
fn evaluate_rows_equals_the_same_rows_of_evaluate() {
    let graph = block_graph();
    let mut rng = StdRng::seed_from_u64(42);
    let inputs = random_bindings(&graph, &[("M", 37)], &mut rng).unwrap();
    let full = evaluate(&graph, &inputs).unwrap();
    assert_eq!(full["y"].shape, vec![37, 24]);
    let rows = [36, 0, 17, 17, 8];
    let some = evaluate_rows(&graph, &inputs, &rows).unwrap();
    for name in ["y", "z"] {
        assert_eq!(some[name].shape, vec![rows.len(), 24]);
        // Every element is computed by the same arithmetic in the same order
        // either way, so they agree exactly.
        assert_eq!(some[name], full[name].select_rows(&rows).unwrap(), "{name}");
    }
    // No rows is a valid, empty request.
    assert_eq!(
        evaluate_rows(&graph, &inputs, &[]).unwrap()["z"].shape,
        vec![0, 24]
    );
}

/// `y = layernorm(x) @ wᵀ` (f16, K = 64, N = 16), also returning `n =
/// rmsnorm(x)`, which no matmul reads; with `split`, the two halves alone:
/// the norms, and the product of an input `a` standing for their output.
fn norm_gemm_graph(split: bool) -> Graph {
    let mut b = GraphBuilder::new(if split { "product" } else { "norm_gemm" });
    let m = b.dynamic_dim("M").unwrap();
    let k = b.static_dim("K", 64).unwrap();
    let n = b.static_dim("N", 16).unwrap();
    let x = b.input("x", DType::F16, &[m, k]).unwrap();
    let w = b.weight("w", DType::F16, &[n, k]).unwrap();
    if split {
        let y = b.matmul(x, w, WeightLayout::NK).unwrap();
        b.output("y", y).unwrap();
        return b.build().unwrap();
    }
    let g = b.weight("g", DType::F16, &[k]).unwrap();
    let beta = b.weight("beta", DType::F16, &[k]).unwrap();
    let normed = b.layernorm(x, g, beta, 1e-5).unwrap();
    let y = b.matmul(normed, w, WeightLayout::NK).unwrap();
    b.output("y", y).unwrap();
    let alone = b.rmsnorm(x, g, 1e-5).unwrap();
    b.output("n", alone).unwrap();
    b.build().unwrap()
}

#[test]
fn rounded_norms_round_what_a_matmul_reads_and_nothing_else() {
    let graph = norm_gemm_graph(false);
    let inputs = random_bindings(&graph, &[("M", 5)], &mut StdRng::seed_from_u64(7)).unwrap();
    let rows = [4, 0, 2];
    let exact = evaluate_rows(&graph, &inputs, &rows).unwrap();
    assert_eq!(
        evaluate_rows_with(&graph, &inputs, &rows, Intermediates::Exact).unwrap(),
        exact
    );
    let rounded = evaluate_rows_with(&graph, &inputs, &rows, Intermediates::RoundedNorms).unwrap();
    // The norm's output, rounded to f16, fed to the product alone: the same
    // arithmetic in the same order, so exactly equal.
    let layernorm_only = {
        let mut b = GraphBuilder::new("layernorm");
        let m = b.dynamic_dim("M").unwrap();
        let k = b.static_dim("K", 64).unwrap();
        let x = b.input("x", DType::F16, &[m, k]).unwrap();
        let g = b.weight("g", DType::F16, &[k]).unwrap();
        let beta = b.weight("beta", DType::F16, &[k]).unwrap();
        let normed = b.layernorm(x, g, beta, 1e-5).unwrap();
        b.output("a", normed).unwrap();
        b.build().unwrap()
    };
    let norm_inputs: Bindings = ["x", "g", "beta"]
        .iter()
        .map(|&name| (name.to_string(), inputs[name].clone()))
        .collect();
    let normed = &evaluate_rows(&layernorm_only, &norm_inputs, &rows).unwrap()["a"];
    let product = |a: HostTensor| {
        evaluate(
            &norm_gemm_graph(true),
            &bindings(&[("x", a), ("w", inputs["w"].clone())]),
        )
        .unwrap()["y"]
            .clone()
    };
    assert_eq!(rounded["y"], product(normed.rounded_to(DType::F16)));
    assert_eq!(exact["y"], product(normed.clone()));
    assert_ne!(rounded["y"], exact["y"]);
    // The rounding moves each output by about u·√K of its terms' scale
    // (u = 2⁻¹¹; normalized values near 1, weights within 1/√K): well
    // under 2⁻¹¹ here.
    assert!(max_abs_error(&rounded["y"], &exact["y"]) < 2f64.powi(-11));
    // A norm that no matmul reads is an output, rounded by the kernel's
    // store and judged by the comparison: the reference keeps it exact.
    assert_eq!(rounded["n"], exact["n"]);
}

#[test]
fn evaluate_rows_rejects_rows_out_of_range() {
    let err = evaluate_rows(&chain_graph(), &chain_inputs(), &[1, 2]).unwrap_err();
    assert_eq!(
        err,
        ReferenceError::RowOutOfRange {
            row: 2,
            dim: "M".into(),
            rows: 2
        }
    );
    assert_eq!(err.to_string(), "row 2 is out of range: dim `M` has 2 rows");
}

#[test]
fn evaluate_rows_needs_a_row_local_graph() {
    // A bias fed as an input has no row axis: selecting rows of it would
    // change the result.
    let mut b = GraphBuilder::new("input_bias");
    let m = b.dynamic_dim("M").unwrap();
    let n = b.static_dim("N", 2).unwrap();
    let x = b.input("x", DType::F32, &[m, n]).unwrap();
    let bias = b.input("bias", DType::F32, &[n]).unwrap();
    let y = b.bias_add(x, bias).unwrap();
    b.output("y", y).unwrap();
    let graph = b.build().unwrap();
    let inputs = bindings(&[
        ("x", tensor(&[1, 2], &[1.0, 2.0])),
        ("bias", tensor(&[2], &[0.0, 0.0])),
    ]);
    let err = evaluate_rows(&graph, &inputs, &[0]).unwrap_err();
    assert!(matches!(err, ReferenceError::NotRowLocal { .. }), "{err:?}");
    assert!(err.to_string().contains("`bias`"), "{err}");
    // The whole graph still evaluates.
    assert!(evaluate(&graph, &inputs).is_ok());

    // x @ y with y an activation: row i of the product reads every row of y.
    let mut b = GraphBuilder::new("gram");
    let m = b.dynamic_dim("M").unwrap();
    let x = b.input("x", DType::F32, &[m, m]).unwrap();
    let y = b.input("y", DType::F32, &[m, m]).unwrap();
    let p = b.matmul(x, y, WeightLayout::KN).unwrap();
    b.output("p", p).unwrap();
    let graph = b.build().unwrap();
    let inputs = bindings(&[
        ("x", HostTensor::zeros(&[2, 2])),
        ("y", HostTensor::zeros(&[2, 2])),
    ]);
    let err = evaluate_rows(&graph, &inputs, &[0]).unwrap_err();
    assert!(err.to_string().contains("on a later axis"), "{err}");
}

#[test]
fn dynamic_dims_must_agree() {
    let mut b = GraphBuilder::new("residual");
    let m = b.dynamic_dim("M").unwrap();
    let n = b.static_dim("N", 2).unwrap();
    let x = b.input("x", DType::F16, &[m, n]).unwrap();
    let r = b.input("r", DType::F16, &[m, n]).unwrap();
    let y = b.add(x, r).unwrap();
    b.output("y", y).unwrap();
    let graph = b.build().unwrap();
    let err = evaluate(
        &graph,
        &bindings(&[
            ("x", HostTensor::zeros(&[3, 2])),
            ("r", HostTensor::zeros(&[4, 2])),
        ]),
    )
    .unwrap_err();
    assert_eq!(
        err,
        ReferenceError::DimsDisagree {
            dim: "M".into(),
            first_tensor: "x".into(),
            first_size: 3,
            second_tensor: "r".into(),
            second_size: 4,
        }
    );
    assert_eq!(
        err.to_string(),
        "dynamic dim `M` disagrees across inputs: it is 3 in `x` but 4 in `r`"
    );
}

#[test]
fn inputs_are_checked_by_name_and_shape() {
    let graph = chain_graph();
    let mut inputs = chain_inputs();
    inputs.remove("w");
    let err = evaluate(&graph, &inputs).unwrap_err();
    assert_eq!(
        err.to_string(),
        "`w` is an input or weight of graph `chain` but was not given"
    );

    let mut inputs = chain_inputs();
    inputs.insert("bais".into(), tensor(&[2], &[0.0, 0.0]));
    let err = evaluate(&graph, &inputs).unwrap_err();
    assert_eq!(
        err.to_string(),
        "`bais` was given but is not an input or weight of graph `chain`; it has: `x`, `w`, `bias`"
    );

    let mut inputs = chain_inputs();
    inputs.insert("w".into(), HostTensor::zeros(&[2, 3]));
    let err = evaluate(&graph, &inputs).unwrap_err();
    assert_eq!(
        err.to_string(),
        "`w` has shape [2, 3] but graph `chain` declares it as [2, 2]"
    );

    // The wrong rank is a wrong shape too, named with the dynamic dim.
    let mut inputs = chain_inputs();
    inputs.insert("x".into(), HostTensor::zeros(&[4]));
    let err = evaluate(&graph, &inputs).unwrap_err();
    assert_eq!(
        err.to_string(),
        "`x` has shape [4] but graph `chain` declares it as [M, 2]"
    );

    // A tensor whose public fields were made inconsistent is caught, not
    // indexed out of bounds.
    let mut inputs = chain_inputs();
    inputs.get_mut("x").unwrap().data.pop();
    assert!(matches!(
        evaluate(&graph, &inputs),
        Err(ReferenceError::DataLength {
            expected: 4,
            got: 3,
            ..
        })
    ));
}

#[test]
fn random_inputs_round_trip_through_their_dtype() {
    let mut rng = StdRng::seed_from_u64(3);
    let t = HostTensor::random(DType::F16, &[5, 7], &mut rng);
    let halves: Vec<f16> = t.to_f16();
    assert_eq!(HostTensor::from_f16(&[5, 7], &halves).unwrap(), t);

    let t = HostTensor::random(DType::BF16, &[33], &mut rng);
    let bfloats: Vec<bf16> = t.to_bf16();
    assert_eq!(HostTensor::from_bf16(&[33], &bfloats).unwrap(), t);

    let t = HostTensor::random(DType::F32, &[2, 2], &mut rng);
    assert_eq!(HostTensor::from_f32(&[2, 2], &t.to_f32()).unwrap(), t);

    // A plain f64 draw would not survive the trip: the rounding is real.
    let raw = HostTensor::new(&[1], vec![0.1]).unwrap();
    assert_ne!(HostTensor::from_f16(&[1], &raw.to_f16()).unwrap(), raw);
}

#[test]
fn random_bindings_scale_weights_by_fan_in() {
    let graph = block_graph();
    let mut rng = StdRng::seed_from_u64(5);
    let inputs = random_bindings(&graph, &[("M", 3)], &mut rng).unwrap();
    assert_eq!(inputs.len(), 8);
    assert_eq!(inputs["x"].shape, vec![3, 24]);
    assert_eq!(inputs["w_up"].shape, vec![136, 24]);
    // Values are rounded to f16 after the draw, so the bound they respect is
    // the f16 nearest the scale.
    let within = |name: &str, bound: f64| {
        let bound = f16::from_f64(bound).to_f64();
        inputs[name].data.iter().all(|v| v.abs() <= bound)
    };
    // w_up is read NK with K = D = 24; w_down KN with K = F = 136.
    assert!(within("w_up", 1.0 / 24f64.sqrt()));
    assert!(within("w_down", 1.0 / 136f64.sqrt()));
    assert!(within("x", 1.0) && inputs["x"].data.iter().any(|v| v.abs() > 0.5));

    let err = random_bindings(&graph, &[], &mut rng).unwrap_err();
    assert_eq!(err.to_string(), "dynamic dim `M` of graph `block` needs a size");
    let err = random_bindings(&graph, &[("M", 3), ("D", 24)], &mut rng).unwrap_err();
    assert!(matches!(err, ReferenceError::UnknownDim { .. }), "{err:?}");
}

#[test]
fn comparing_against_the_reference() {
    let graph = chain_graph();
    let want = evaluate(&graph, &chain_inputs()).unwrap()["y"].clone();
    // What a kernel writing f16 would return: the same values rounded.
    let got = want.rounded_to(DType::F16);
    assert_eq!(relative_error(&got, &want), 0.0, "these values are exact in f16");
    let mut off = want.clone();
    off.data[1] += 0.01;
    assert!(relative_error(&off, &want) > 0.0 && relative_error(&off, &want) < 1e-3);
    assert!((max_abs_error(&off, &want) - 0.01).abs() < 1e-12);
    off.data[2] = f64::NAN;
    assert_eq!(relative_error(&off, &want), f64::INFINITY);
    assert_eq!(max_abs_error(&off, &want), f64::INFINITY);
}

#[test]
fn static_extents_resolve() {
    // A graph whose dims are all static evaluates without any dynamic dim.
    let mut b = GraphBuilder::new("fixed");
    let n = b.static_dim("N", 2).unwrap();
    let x = b.input("x", DType::F32, &[Extent::Static(3), n]).unwrap();
    let y = b.relu(x).unwrap();
    b.output("y", y).unwrap();
    let graph = b.build().unwrap();
    let out = evaluate(
        &graph,
        &bindings(&[("x", tensor(&[3, 2], &[-1.0, 1.0, -2.0, 2.0, -3.0, 3.0]))]),
    )
    .unwrap();
    assert_eq!(out["y"].data, vec![0.0, 1.0, 0.0, 2.0, 0.0, 3.0]);
    // It has no dynamic first axis, so it cannot be evaluated by rows.
    let err = evaluate_rows(&graph, &bindings(&[("x", HostTensor::zeros(&[3, 2]))]), &[0]).unwrap_err();
    assert!(err.to_string().contains("static size 3"), "{err}");
}

/// `y = x @ w` over FP8 operands: x `[M, 2]` with one scale, w `[2, 2]`
/// (KN or NK) with one scale per output column.
fn fp8_matmul_graph(layout: WeightLayout) -> Graph {
    let mut b = GraphBuilder::new("fp8_matmul");
    let m = b.dynamic_dim("M").unwrap();
    let two = Extent::Static(2);
    let x = b.input("x", DType::F8E4M3, &[m, two]).unwrap();
    let x_scale = b.weight("x_scale", DType::F32, &[Extent::Static(1)]).unwrap();
    let w = b.weight("w", DType::F8E4M3, &[two, two]).unwrap();
    let w_scale = b.weight("w_scale", DType::F32, &[two]).unwrap();
    b.scale(x, x_scale).unwrap();
    b.scale(w, w_scale).unwrap();
    let y = b.matmul(x, w, layout).unwrap();
    b.output("y", y).unwrap();
    b.build().unwrap()
}

#[test]
fn an_fp8_matmul_sums_products_of_dequantized_operands() {
    // Stored x = [[1, 2], [-3, 0.5]] (E4M3 values), x_scale = 0.5: x means
    // [[0.5, 1], [-1.5, 0.25]]. Stored w = [[2, 4], [1, -1]], the output
    // columns' scales [0.25, 2].
    let x = HostTensor::from_f8e4m3(&[2, 2], &[0x38, 0x40, 0xC4, 0x30]).unwrap();
    assert_eq!(x.data, vec![1.0, 2.0, -3.0, 0.5]);
    let w_stored = [2.0, 4.0, 1.0, -1.0];
    let inputs = |w: HostTensor| {
        bindings(&[
            ("x", x.clone()),
            ("x_scale", tensor(&[1], &[0.5])),
            ("w", w),
            ("w_scale", tensor(&[2], &[0.25, 2.0])),
        ])
    };
    // KN: w is [K, N], column n scaled by w_scale[n]: w means
    // [[0.5, 8], [0.25, -2]]. Row 0: [0.5·0.5 + 1·0.25, 0.5·8 + 1·(-2)] =
    // [0.5, 2]; row 1: [-1.5·0.5 + 0.25·0.25, -1.5·8 + 0.25·(-2)] =
    // [-0.6875, -12.5].
    let kn = evaluate(
        &fp8_matmul_graph(WeightLayout::KN),
        &inputs(tensor(&[2, 2], &w_stored)),
    )
    .unwrap();
    assert_eq!(kn["y"].data, vec![0.5, 2.0, -0.6875, -12.5]);
    // NK: w is [N, K], row n scaled by w_scale[n]: w means
    // [[0.5, 1], [2, -2]]. Row 0: [0.5·0.5 + 1·1, 0.5·2 + 1·(-2)] =
    // [1.25, -1]; row 1: [-1.5·0.5 + 0.25·1, -1.5·2 + 0.25·(-2)] =
    // [-0.5, -3.5].
    let nk = evaluate(
        &fp8_matmul_graph(WeightLayout::NK),
        &inputs(tensor(&[2, 2], &w_stored)),
    )
    .unwrap();
    assert_eq!(nk["y"].data, vec![1.25, -1.0, -0.5, -3.5]);
    // Rows are still evaluated alone: the scale has no rows.
    let rows = evaluate_rows(
        &fp8_matmul_graph(WeightLayout::NK),
        &inputs(tensor(&[2, 2], &w_stored)),
        &[1],
    )
    .unwrap();
    assert_eq!(rows["y"].data, vec![-0.5, -3.5]);
}

#[test]
fn random_fp8_bindings_are_e4m3_values_with_scales_that_keep_the_product_near_one() {
    let graph = fp8_matmul_graph(WeightLayout::NK);
    let mut rng = StdRng::seed_from_u64(23);
    let inputs = random_bindings(&graph, &[("M", 64)], &mut rng).unwrap();
    for name in ["x", "w"] {
        let t = &inputs[name];
        assert_eq!(t.rounded_to(DType::F8E4M3), *t, "{name} holds E4M3 values");
        assert!(t.data.iter().all(|v| v.abs() <= 448.0));
        assert!(
            t.data.iter().any(|v| v.abs() > 64.0),
            "{name} spans the E4M3 range"
        );
    }
    // x's values mean up to ±1, w's up to ±1/√K (K = 2).
    let x_scale = inputs["x_scale"].data[0];
    assert!((0.5 / 448.0..=1.0 / 448.0).contains(&x_scale), "{x_scale}");
    let bound = 1.0 / 2f64.sqrt() / 448.0;
    assert!(
        inputs["w_scale"]
            .data
            .iter()
            .all(|s| (0.5 * bound..=bound).contains(s))
    );
    let y = evaluate(&graph, &inputs).unwrap();
    assert!(y["y"].data.iter().all(|v| v.abs() <= 2.0));
}
