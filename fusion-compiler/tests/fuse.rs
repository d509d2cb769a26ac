//! The fusion matcher on small graphs built with `GraphBuilder`: named
//! patterns, composed chains, the linear-chain rule, conflicts between
//! chains, standalone kernels, kernel order and the Graphviz output.

use fusion_compiler::fuse::{
    self, Composition, EpilogueStep, MAX_EPILOGUE_STEPS, NamedPattern, NormKind, Plan, Role, dot,
};
use fusion_compiler::ir::{Activation, DType, Extent, Graph, GraphBuilder, TensorId, WeightLayout};

/// Plans a graph and checks the plan's invariants.
fn plan_of(graph: Graph) -> Plan {
    let plan = fuse::plan(graph);
    plan.validate()
        .unwrap_or_else(|e| panic!("invalid plan: {e}\n{plan}"));
    plan
}

fn names(plan: &Plan) -> Vec<&str> {
    plan.kernels.iter().map(|k| k.name.as_str()).collect()
}

fn tensor(plan: &Plan, name: &str) -> TensorId {
    plan.graph
        .tensor_by_name(name)
        .unwrap_or_else(|| panic!("no tensor `{name}`"))
}

/// A graph builder with `M` dynamic and `D` = 64, and an `[M, D]` input `x`.
struct Fixture {
    b: GraphBuilder,
    m: Extent,
    d: Extent,
    x: TensorId,
    count: usize,
}

impl Fixture {
    fn new(name: &str) -> Fixture {
        let mut b = GraphBuilder::new(name);
        let m = b.dynamic_dim("M").unwrap();
        let d = b.static_dim("D", 64).unwrap();
        let x = b.input("x", DType::F16, &[m, d]).unwrap();
        Fixture { b, m, d, x, count: 0 }
    }

    fn fresh(&mut self, prefix: &str) -> String {
        self.count += 1;
        format!("{prefix}{}", self.count)
    }

    /// A `[D, D]` weight, read transposed.
    fn linear(&mut self, a: TensorId) -> TensorId {
        let name = self.fresh("w");
        let w = self.b.weight(&name, DType::F16, &[self.d, self.d]).unwrap();
        self.b.matmul(a, w, WeightLayout::NK).unwrap()
    }

    fn row(&mut self, prefix: &str) -> TensorId {
        let name = self.fresh(prefix);
        self.b.weight(&name, DType::F16, &[self.d]).unwrap()
    }

    fn activation_input(&mut self, prefix: &str) -> TensorId {
        let name = self.fresh(prefix);
        self.b.input(&name, DType::F16, &[self.m, self.d]).unwrap()
    }

    fn bias(&mut self, t: TensorId) -> TensorId {
        let bias = self.row("b");
        self.b.bias_add(t, bias).unwrap()
    }

    fn layernorm(&mut self, t: TensorId) -> TensorId {
        let (gamma, beta) = (self.row("gamma"), self.row("beta"));
        self.b.layernorm(t, gamma, beta, 1e-5).unwrap()
    }

    fn rmsnorm(&mut self, t: TensorId) -> TensorId {
        let gamma = self.row("gamma");
        self.b.rmsnorm(t, gamma, 1e-6).unwrap()
    }

    /// Applies an epilogue step by its name in composed kernel names.
    fn step(&mut self, t: TensorId, step: &str) -> TensorId {
        match step {
            "bias" => self.bias(t),
            "gelu" => self.b.gelu(t).unwrap(),
            "gelu_erf" => self.b.gelu_erf(t).unwrap(),
            "silu" => self.b.silu(t).unwrap(),
            "relu" => self.b.relu(t).unwrap(),
            "residual" => {
                let r = self.activation_input("r");
                self.b.add(t, r).unwrap()
            }
            "mul" => {
                let u = self.activation_input("u");
                self.b.mul(u, t).unwrap()
            }
            other => {
                let activation = Activation::named(other).unwrap_or_else(|| panic!("unknown step `{step}`"));
                self.b.activation(activation, t).unwrap()
            }
        }
    }

    fn build(mut self, outputs: &[(&str, TensorId)]) -> Graph {
        for (name, t) in outputs {
            self.b.output(name, *t).unwrap();
        }
        self.b.build().unwrap()
    }
}

/// `[norm ->] x @ w^T -> steps...`, the output named `y`.
fn chain_graph(prologue: Option<&str>, steps: &[&str]) -> Graph {
    let mut f = Fixture::new("chain");
    let a = match prologue {
        None => f.x,
        Some("layernorm") => f.layernorm(f.x),
        Some("rmsnorm") => f.rmsnorm(f.x),
        Some(other) => panic!("unknown norm `{other}`"),
    };
    let mut t = f.linear(a);
    for step in steps {
        t = f.step(t, step);
    }
    f.build(&[("y", t)])
}

#[test]
fn each_named_pattern_plans_to_one_kernel_with_its_name() {
    let cases: [(&str, Option<&str>, &[&str]); 9] = [
        ("gemm_bias_gelu", None, &["bias", "gelu"]),
        ("gemm_bias_silu", None, &["bias", "silu"]),
        ("gemm_bias_relu", None, &["bias", "relu"]),
        ("gemm_bias", None, &["bias"]),
        ("gemm_bias_residual", None, &["bias", "residual"]),
        ("gemm_gelu", None, &["gelu"]),
        ("gemm_silu", None, &["silu"]),
        ("layernorm_gemm", Some("layernorm"), &[]),
        ("rmsnorm_gemm", Some("rmsnorm"), &[]),
    ];
    let mut seen = Vec::new();
    for (name, prologue, steps) in cases {
        let plan = plan_of(chain_graph(prologue, steps));
        assert_eq!(names(&plan), [name], "{plan}");
        let kernel = &plan.kernels[0];
        let pattern = kernel
            .pattern()
            .unwrap_or_else(|| panic!("`{name}` is not a named pattern"));
        assert_eq!(pattern.name(), name);
        assert_eq!(kernel.ops.len(), plan.graph.ops.len());
        assert_eq!(kernel.output, tensor(&plan, "y"));
        seen.push(pattern);
    }
    assert_eq!(seen, NamedPattern::ALL);
}

#[test]
fn other_chains_get_composed_names() {
    let cases: [(&str, Option<&str>, &[&str]); 6] = [
        ("gemm", None, &[]),
        ("gemm_residual", None, &["residual"]),
        ("gemm_bias_gelu_erf", None, &["bias", "gelu_erf"]),
        ("gemm_silu_mul", None, &["silu", "mul"]),
        ("layernorm_gemm_bias_gelu", Some("layernorm"), &["bias", "gelu"]),
        (
            "rmsnorm_gemm_relu_residual",
            Some("rmsnorm"),
            &["relu", "residual"],
        ),
    ];
    for (name, prologue, steps) in cases {
        let plan = plan_of(chain_graph(prologue, steps));
        assert_eq!(names(&plan), [name], "{plan}");
        assert_eq!(plan.kernels[0].pattern(), None, "`{name}` is not one of the nine");
    }
}

#[test]
fn sigmoid_and_gelu_quick_fuse_into_gemm_epilogues_and_stand_alone() {
    let cases: [(&str, Option<&str>, &[&str]); 4] = [
        ("gemm_bias_sigmoid", None, &["bias", "sigmoid"]),
        ("gemm_gelu_quick", None, &["gelu_quick"]),
        (
            "layernorm_gemm_bias_gelu_quick",
            Some("layernorm"),
            &["bias", "gelu_quick"],
        ),
        ("gemm_sigmoid_mul", None, &["sigmoid", "mul"]),
    ];
    for (name, prologue, steps) in cases {
        let plan = plan_of(chain_graph(prologue, steps));
        assert_eq!(names(&plan), [name], "{plan}");
        let kernel = &plan.kernels[0];
        assert_eq!(kernel.ops.len(), plan.graph.ops.len(), "{plan}");
        assert_eq!(kernel.pattern(), None, "`{name}` is not one of the nine");
    }
    // With no matmul to join, each is a standalone elementwise kernel.
    for op in ["sigmoid", "gelu_quick"] {
        let mut f = Fixture::new("alone");
        let y = f.step(f.x, op);
        let plan = plan_of(f.build(&[("y", y)]));
        assert_eq!(names(&plan), [op], "{plan}");
        assert_eq!(
            plan.kernels[0].composition,
            Composition::Elementwise(vec![EpilogueStep::Activation(Activation::named(op).unwrap())])
        );
    }
}

#[test]
fn operands_come_in_kernel_order_with_their_roles() {
    let plan = plan_of(chain_graph(
        Some("layernorm"),
        &["bias", "gelu", "residual", "mul"],
    ));
    assert_eq!(names(&plan), ["layernorm_gemm_bias_gelu_residual_mul"]);
    let kernel = &plan.kernels[0];
    let roles: Vec<Role> = kernel.operands.iter().map(|o| o.role).collect();
    assert_eq!(
        roles,
        [
            Role::A,
            Role::B,
            Role::Gamma,
            Role::Beta,
            Role::Bias { step: 0 },
            Role::Residual { step: 2 },
            Role::MulOperand { step: 3 }
        ]
    );
    let tensors: Vec<&str> = kernel
        .inputs()
        .map(|t| plan.graph.tensor(t).name.as_str())
        .collect();
    assert_eq!(tensors, ["x", "w3", "gamma1", "beta2", "b4", "r5", "u6"]);
    let Composition::Gemm(gemm) = &kernel.composition else {
        panic!("not a GEMM: {kernel:?}")
    };
    assert_eq!(gemm.b_layout, WeightLayout::NK);
    assert_eq!(
        gemm.prologue.map(|p| (p.kind, p.eps)),
        Some((NormKind::LayerNorm, 1e-5))
    );
}

#[test]
fn the_epilogue_stops_at_the_cap() {
    let steps = ["bias", "relu", "residual", "gelu", "silu"];
    assert_eq!(steps.len(), MAX_EPILOGUE_STEPS + 1);
    let plan = plan_of(chain_graph(None, &steps));
    assert_eq!(names(&plan), ["gemm_bias_relu_residual_gelu", "silu"]);
}

#[test]
fn an_intermediate_with_a_second_consumer_is_not_fused_away() {
    let mut f = Fixture::new("fan_out");
    let h = f.linear(f.x);
    f.b.name(h, "h").unwrap();
    let y1 = f.b.gelu(h).unwrap();
    let y2 = f.b.relu(h).unwrap();
    let plan = plan_of(f.build(&[("y1", y1), ("y2", y2)]));
    assert_eq!(names(&plan), ["gemm", "gelu", "relu"]);
    assert_eq!(plan.kernels[0].output, tensor(&plan, "h"));
}

#[test]
fn a_tensor_read_twice_by_one_op_ends_the_chain() {
    let mut f = Fixture::new("square");
    let h = f.linear(f.x);
    let y = f.b.mul(h, h).unwrap();
    let plan = plan_of(f.build(&[("y", y)]));
    assert_eq!(names(&plan), ["gemm", "mul"]);
}

#[test]
fn a_chain_intermediate_that_is_a_graph_output_ends_the_chain() {
    let mut f = Fixture::new("two_outputs");
    let h = f.linear(f.x);
    let h = f.bias(h);
    let y = f.b.gelu(h).unwrap();
    let plan = plan_of(f.build(&[("h", h), ("y", y)]));
    assert_eq!(names(&plan), ["gemm_bias", "gelu"]);
    assert_eq!(plan.kernels[0].output, tensor(&plan, "h"));
    let crossing = plan.crossing_tensors();
    assert_eq!(crossing.len(), 1);
    assert!(crossing[0].is_graph_output);
}

#[test]
fn a_contested_add_goes_to_one_gemm_only() {
    // y = (x @ w1^T) + (x @ w2^T): the add could be either GEMM's residual.
    // Equal op counts, neither named: the earlier matmul wins.
    let mut f = Fixture::new("two_branches");
    let a = f.linear(f.x);
    f.b.name(a, "a").unwrap();
    let c = f.linear(f.x);
    f.b.name(c, "c").unwrap();
    let y = f.b.add(a, c).unwrap();
    let plan = plan_of(f.build(&[("y", y)]));
    assert_eq!(names(&plan), ["gemm", "gemm_residual"]);
    assert_eq!(plan.kernels[0].output, tensor(&plan, "c"));
    let winner = &plan.kernels[1];
    assert_eq!(winner.operand(Role::A), Some(tensor(&plan, "x")));
    assert_eq!(
        winner.operand(Role::Residual { step: 0 }),
        Some(tensor(&plan, "c"))
    );
}

#[test]
fn a_contested_add_goes_to_the_longer_chain() {
    // The second GEMM has a bias: three ops against two.
    let mut f = Fixture::new("longer_wins");
    let a = f.linear(f.x);
    f.b.name(a, "a").unwrap();
    let c = f.linear(f.x);
    let c = f.bias(c);
    let y = f.b.add(a, c).unwrap();
    let plan = plan_of(f.build(&[("y", y)]));
    assert_eq!(names(&plan), ["gemm", "gemm_bias_residual"]);
    assert_eq!(
        plan.kernels[1].operand(Role::Residual { step: 1 }),
        Some(tensor(&plan, "a"))
    );
}

#[test]
fn a_contested_add_goes_to_a_named_pattern_over_a_composed_one() {
    // gelu(x @ w1^T) + (x @ w2^T + b): both chains hold three ops;
    // gemm_bias_residual is named, gemm_gelu_residual is not.
    let mut f = Fixture::new("named_wins");
    let a = f.linear(f.x);
    let a = f.b.gelu(a).unwrap();
    f.b.name(a, "a").unwrap();
    let c = f.linear(f.x);
    let c = f.bias(c);
    let y = f.b.add(a, c).unwrap();
    let plan = plan_of(f.build(&[("y", y)]));
    assert_eq!(names(&plan), ["gemm_gelu", "gemm_bias_residual"]);
}

#[test]
fn three_chains_merging_put_every_op_in_one_kernel() {
    let mut f = Fixture::new("three_way");
    let a = f.linear(f.x);
    let c = f.linear(f.x);
    let e = f.linear(f.x);
    let s = f.b.add(a, c).unwrap();
    let y = f.b.add(s, e).unwrap();
    let plan = plan_of(f.build(&[("y", y)]));
    assert_eq!(plan.kernels.len(), 3);
    assert_eq!(plan.kernels.iter().map(|k| k.ops.len()).sum::<usize>(), 5);
    // A GEMM reads one residual: the second add is the third GEMM's.
    let mut kernels = names(&plan);
    kernels.sort_unstable();
    assert_eq!(kernels, ["gemm", "gemm_residual", "gemm_residual"], "{plan}");
}

#[test]
fn a_gemm_epilogue_reads_one_operand_of_each_kind() {
    // x @ w + r1 + r2, x @ w * m1 * m2, x @ w + b1 + b2: the second step of
    // a kind is a kernel of its own (the elementwise chain reads each).
    for (step, gemm, rest) in [
        ("residual", "gemm_residual", "add"),
        ("mul", "gemm_mul", "mul"),
        ("bias", "gemm_bias", "bias_add"),
    ] {
        let plan = plan_of(chain_graph(None, &[step, step]));
        assert_eq!(names(&plan), [gemm, rest], "{plan}");
    }
    // Different kinds still fuse.
    let plan = plan_of(chain_graph(None, &["bias", "residual", "mul"]));
    assert_eq!(names(&plan), ["gemm_bias_residual_mul"], "{plan}");
}

/// gate = silu(x @ w_gate^T); h = gate * (x @ w_up^T); y = h @ w_down^T [+ b_down] + x.
fn swiglu(with_bias: bool, up_first: bool) -> Graph {
    let mut b = GraphBuilder::new("swiglu_ffn");
    let m = b.dynamic_dim("M").unwrap();
    let d = b.static_dim("D", 4096).unwrap();
    let f = b.static_dim("F", 11008).unwrap();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let w_gate = b.weight("w_gate", DType::F16, &[f, d]).unwrap();
    let w_up = b.weight("w_up", DType::F16, &[f, d]).unwrap();
    let w_down = b.weight("w_down", DType::F16, &[d, f]).unwrap();
    let b_down = with_bias.then(|| b.weight("b_down", DType::F16, &[d]).unwrap());
    let (gate, up) = if up_first {
        let up = b.matmul(x, w_up, WeightLayout::NK).unwrap();
        let gate = b.matmul(x, w_gate, WeightLayout::NK).unwrap();
        (gate, up)
    } else {
        let gate = b.matmul(x, w_gate, WeightLayout::NK).unwrap();
        let up = b.matmul(x, w_up, WeightLayout::NK).unwrap();
        (gate, up)
    };
    b.name(up, "up").unwrap();
    let gate = b.silu(gate).unwrap();
    b.name(gate, "gate").unwrap();
    let h = b.mul(gate, up).unwrap();
    b.name(h, "h").unwrap();
    let mut y = b.matmul(h, w_down, WeightLayout::NK).unwrap();
    if let Some(b_down) = b_down {
        y = b.bias_add(y, b_down).unwrap();
    }
    let y = b.add(y, x).unwrap();
    b.output("y", y).unwrap();
    b.build().unwrap()
}

#[test]
fn swiglu_ffn_is_two_kernels_the_gated_pair_in_one() {
    for up_first in [false, true] {
        let plan = plan_of(swiglu(true, up_first));
        assert_eq!(plan.graph.ops.len(), 7);
        // Both matmuls, the silu and the mul are one gated GEMM (the mul is
        // also wanted by the gate chain and the up chain, which are shorter).
        assert_eq!(names(&plan), ["gemm_silu_glu", "gemm_bias_residual"], "{plan}");
        let gated = &plan.kernels[0];
        let roles: Vec<Role> = gated.operands.iter().map(|o| o.role).collect();
        assert_eq!(roles, [Role::A, Role::B, Role::Up]);
        assert_eq!(gated.operand(Role::B), Some(tensor(&plan, "w_gate")));
        assert_eq!(gated.operand(Role::Up), Some(tensor(&plan, "w_up")));
        assert_eq!(gated.output, tensor(&plan, "h"));
        assert!(gated.prepares_weights(&plan.graph));
        assert!(!gated.norm_foldable(&plan.graph));
        let Composition::Gemm(gemm) = &gated.composition else {
            panic!("a GEMM")
        };
        assert_eq!(gemm.gate, Some(Activation::SILU));
        assert!(gemm.epilogue.is_empty());
        assert_eq!(
            plan.kernels[1].operand(Role::Residual { step: 1 }),
            Some(tensor(&plan, "x"))
        );
        assert_eq!(plan.kernel_symbol(0), "swiglu_ffn_k0_gemm_silu_glu");
        assert_eq!(plan.kernel_symbol(1), "swiglu_ffn_k1_gemm_bias_residual");
        assert_eq!(plan.to_json()["kernels"][0]["gate"], "silu");
        assert!(
            plan.to_string()
                .contains("gated: one GEMM over B and up interleaved"),
            "{plan}"
        );
    }
}

#[test]
fn llama_ffn_without_bias_ends_in_gemm_residual() {
    let plan = plan_of(swiglu(false, false));
    assert_eq!(plan.graph.ops.len(), 6);
    assert_eq!(names(&plan), ["gemm_silu_glu", "gemm_residual"]);
    let crossing: Vec<&str> = plan
        .crossing_tensors()
        .iter()
        .map(|c| plan.graph.tensor(c.tensor).name.as_str())
        .collect();
    assert_eq!(crossing, ["h"]);
}

/// `gelu(x @ w_gate^T) * (x @ w_up)` with an `[F, D]` gate weight and an
/// up weight in `up_layout` (`[F, D]` for NK, `[D, F]` for KN), given as an
/// input when `up_is_input`; an RMSNorm (gamma a weight) before both when
/// `norm`; and a silu on the up projection when `up_activated` (then
/// neither side is a plain projection).
fn gated(norm: bool, up_is_input: bool, up_layout: WeightLayout, up_activated: bool) -> Graph {
    let mut b = GraphBuilder::new("gated");
    let m = b.dynamic_dim("M").unwrap();
    let d = b.static_dim("D", 64).unwrap();
    let f = b.static_dim("F", 128).unwrap();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let w_gate = b.weight("w_gate", DType::F16, &[f, d]).unwrap();
    let up_shape = match up_layout {
        WeightLayout::NK => [f, d],
        WeightLayout::KN => [d, f],
    };
    let w_up = if up_is_input {
        b.input("w_up", DType::F16, &up_shape).unwrap()
    } else {
        b.weight("w_up", DType::F16, &up_shape).unwrap()
    };
    let a = if norm {
        let gamma = b.weight("gamma", DType::F16, &[d]).unwrap();
        b.rmsnorm(x, gamma, 1e-6).unwrap()
    } else {
        x
    };
    let gate = b.matmul(a, w_gate, WeightLayout::NK).unwrap();
    let gate = b.gelu(gate).unwrap();
    let mut up = b.matmul(a, w_up, up_layout).unwrap();
    if up_activated {
        up = b.silu(up).unwrap();
    }
    let h = b.mul(up, gate).unwrap();
    b.output("h", h).unwrap();
    b.build().unwrap()
}

#[test]
fn a_gated_pair_takes_any_activation_and_the_norm_of_both_projections() {
    let plan = plan_of(gated(false, false, WeightLayout::NK, false));
    assert_eq!(names(&plan), ["gemm_gelu_glu"]);
    // The FFN sub-layer's shape: one norm feeding both projections is the
    // gated GEMM's prologue, folded into the interleaved weight when bound.
    let plan = plan_of(gated(true, false, WeightLayout::NK, false));
    assert_eq!(names(&plan), ["rmsnorm_gemm_gelu_glu"], "{plan}");
    let roles: Vec<Role> = plan.kernels[0].operands.iter().map(|o| o.role).collect();
    assert_eq!(roles, [Role::A, Role::B, Role::Up, Role::Gamma]);
    assert!(plan.kernels[0].norm_foldable(&plan.graph));
    assert!(plan.kernels[0].prepares_weights(&plan.graph));
}

#[test]
fn a_gated_pair_needs_two_weights_of_one_shape_and_one_plain_projection() {
    // An up weight given per call cannot be interleaved once: the chains of
    // the two matmuls as before.
    let plan = plan_of(gated(false, true, WeightLayout::NK, false));
    assert_eq!(names(&plan), ["gemm", "gemm_gelu_mul"], "{plan}");
    // Weights of two layouts (so two shapes) do not interleave.
    let plan = plan_of(gated(false, false, WeightLayout::KN, false));
    assert_eq!(names(&plan), ["gemm", "gemm_gelu_mul"], "{plan}");
    // Both sides activated: no plain up projection.
    let plan = plan_of(gated(false, false, WeightLayout::NK, true));
    assert_eq!(names(&plan), ["gemm_silu", "gemm_gelu_mul"], "{plan}");
    // A norm read by a third op stays standalone, and the pair still forms.
    let mut b = GraphBuilder::new("shared");
    let m = b.dynamic_dim("M").unwrap();
    let d = b.static_dim("D", 64).unwrap();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let gamma = b.weight("gamma", DType::F16, &[d]).unwrap();
    let w_gate = b.weight("w_gate", DType::F16, &[d, d]).unwrap();
    let w_up = b.weight("w_up", DType::F16, &[d, d]).unwrap();
    let n = b.rmsnorm(x, gamma, 1e-6).unwrap();
    let gate = b.matmul(n, w_gate, WeightLayout::NK).unwrap();
    let gate = b.silu(gate).unwrap();
    let up = b.matmul(n, w_up, WeightLayout::NK).unwrap();
    let h = b.mul(gate, up).unwrap();
    let y = b.add(h, n).unwrap();
    b.output("y", y).unwrap();
    let plan = plan_of(b.build().unwrap());
    assert_eq!(names(&plan), ["rmsnorm", "gemm_silu_glu_residual"], "{plan}");
}

#[test]
fn a_gated_pair_whose_projection_is_an_output_does_not_form() {
    let mut b = GraphBuilder::new("shared_up");
    let m = b.dynamic_dim("M").unwrap();
    let d = b.static_dim("D", 64).unwrap();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let w_gate = b.weight("w_gate", DType::F16, &[d, d]).unwrap();
    let w_up = b.weight("w_up", DType::F16, &[d, d]).unwrap();
    let gate = b.matmul(x, w_gate, WeightLayout::NK).unwrap();
    let gate = b.silu(gate).unwrap();
    let up = b.matmul(x, w_up, WeightLayout::NK).unwrap();
    let h = b.mul(gate, up).unwrap();
    b.output("h", h).unwrap();
    b.output("up", up).unwrap();
    let plan = plan_of(b.build().unwrap());
    assert_eq!(names(&plan), ["gemm", "gemm_silu_mul"], "{plan}");
}

fn gpt2_mlp() -> Graph {
    gpt2_mlp_with_proj(WeightLayout::NK)
}

/// GPT-2's MLP block with the output projection's weight stored as `proj`
/// says: [N, K] like nn.Linear, or [K, N].
fn gpt2_mlp_with_proj(proj: WeightLayout) -> Graph {
    let mut b = GraphBuilder::new("gpt2_mlp");
    let m = b.dynamic_dim("M").unwrap();
    let d = b.static_dim("D", 768).unwrap();
    let f = b.static_dim("F", 3072).unwrap();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let ln_g = b.weight("ln_g", DType::F16, &[d]).unwrap();
    let ln_b = b.weight("ln_b", DType::F16, &[d]).unwrap();
    let w_fc = b.weight("w_fc", DType::F16, &[f, d]).unwrap();
    let b_fc = b.weight("b_fc", DType::F16, &[f]).unwrap();
    let proj_shape = match proj {
        WeightLayout::NK => [d, f],
        WeightLayout::KN => [f, d],
    };
    let w_proj = b.weight("w_proj", DType::F16, &proj_shape).unwrap();
    let b_proj = b.weight("b_proj", DType::F16, &[d]).unwrap();
    let normed = b.layernorm(x, ln_g, ln_b, 1e-5).unwrap();
    let h = b.matmul(normed, w_fc, WeightLayout::NK).unwrap();
    let h = b.bias_add(h, b_fc).unwrap();
    let h = b.gelu(h).unwrap();
    b.name(h, "h").unwrap();
    let y = b.matmul(h, w_proj, proj).unwrap();
    let y = b.bias_add(y, b_proj).unwrap();
    let y = b.add(y, x).unwrap();
    b.output("y", y).unwrap();
    b.build().unwrap()
}

#[test]
fn gpt2_mlp_is_two_kernels() {
    let plan = plan_of(gpt2_mlp());
    assert_eq!(plan.graph.ops.len(), 7);
    assert_eq!(names(&plan), ["layernorm_gemm_bias_gelu", "gemm_bias_residual"]);
    assert_eq!(plan.kernels[0].output, tensor(&plan, "h"));
    assert_eq!(plan.kernels[0].operand(Role::A), Some(tensor(&plan, "x")));
}

#[test]
fn ops_without_a_matmul_chain_into_one_elementwise_kernel() {
    let mut f = Fixture::new("no_matmul");
    let z = f.activation_input("z");
    let s = f.b.add(f.x, z).unwrap();
    let y = f.b.relu(s).unwrap();
    let plan = plan_of(f.build(&[("y", y)]));
    assert_eq!(names(&plan), ["add_relu"]);
    assert_eq!(
        plan.kernels[0].composition,
        Composition::Elementwise(vec![
            EpilogueStep::Residual,
            EpilogueStep::Activation(Activation::RELU)
        ])
    );
    let roles: Vec<Role> = plan.kernels[0].operands.iter().map(|o| o.role).collect();
    assert_eq!(roles, [Role::X, Role::Residual { step: 0 }]);
    assert_eq!(plan.kernels[0].operand(Role::X), Some(tensor(&plan, "x")));
    assert_eq!(plan.kernels[0].output, y);
}

/// `y = silu(a) * b`, or `b * silu(a)` with `silu_second`.
fn silu_mul(silu_second: bool) -> Graph {
    let mut f = Fixture::new("silu_mul");
    let up = f.activation_input("up");
    let gate = f.b.silu(f.x).unwrap();
    let y = if silu_second {
        f.b.mul(up, gate).unwrap()
    } else {
        f.b.mul(gate, up).unwrap()
    };
    f.build(&[("y", y)])
}

#[test]
fn silu_times_a_tensor_is_one_kernel_named_after_its_steps() {
    for silu_second in [false, true] {
        let plan = plan_of(silu_mul(silu_second));
        assert_eq!(names(&plan), ["silu_mul"], "{plan}");
        let kernel = &plan.kernels[0];
        assert_eq!(
            kernel.composition,
            Composition::Elementwise(vec![
                EpilogueStep::Activation(Activation::SILU),
                EpilogueStep::Mul
            ])
        );
        assert_eq!(kernel.ops.len(), 2);
        assert_eq!(kernel.operand(Role::X), Some(tensor(&plan, "x")));
        assert_eq!(
            kernel.operand(Role::MulOperand { step: 1 }),
            Some(tensor(&plan, "up1"))
        );
        assert_eq!(kernel.operands.len(), 2);
        assert!(plan.crossing_tensors().is_empty());
    }
}

#[test]
fn two_operands_of_one_kind_keep_their_step_indices() {
    // y = x * a * b: both factors are mul operands, told apart by step.
    let mut f = Fixture::new("mul_mul");
    let (a, c) = (f.activation_input("a"), f.activation_input("c"));
    let h = f.b.mul(f.x, a).unwrap();
    let y = f.b.mul(h, c).unwrap();
    let plan = plan_of(f.build(&[("y", y)]));
    assert_eq!(names(&plan), ["mul_mul"]);
    let roles: Vec<Role> = plan.kernels[0].operands.iter().map(|o| o.role).collect();
    assert_eq!(
        roles,
        [
            Role::X,
            Role::MulOperand { step: 0 },
            Role::MulOperand { step: 1 }
        ]
    );
    assert_eq!(plan.kernels[0].operand(Role::MulOperand { step: 0 }), Some(a));
    assert_eq!(plan.kernels[0].operand(Role::MulOperand { step: 1 }), Some(c));
}

#[test]
fn a_tensor_used_twice_ends_an_elementwise_chain() {
    let mut f = Fixture::new("shared_gate");
    let up = f.activation_input("up");
    let gate = f.b.silu(f.x).unwrap();
    f.b.name(gate, "gate").unwrap();
    let h = f.b.mul(gate, up).unwrap();
    let g = f.b.relu(gate).unwrap();
    let y = f.b.add(h, g).unwrap();
    let plan = plan_of(f.build(&[("y", y)]));
    // `gate` is read twice: written by its own kernel. The mul then takes
    // the add, whose other operand the relu writes first.
    assert_eq!(names(&plan), ["silu", "relu", "mul_add"], "{plan}");
    assert_eq!(plan.kernels[0].output, tensor(&plan, "gate"));
    // And a chain tensor returned to the caller is written too.
    let mut f = Fixture::new("gate_out");
    let up = f.activation_input("up");
    let gate = f.b.silu(f.x).unwrap();
    let h = f.b.mul(gate, up).unwrap();
    let plan = plan_of(f.build(&[("gate", gate), ("h", h)]));
    assert_eq!(names(&plan), ["silu", "mul"]);
}

#[test]
fn an_elementwise_chain_stops_at_the_cap() {
    let steps = ["relu", "gelu", "silu", "sigmoid", "gelu_quick"];
    assert_eq!(steps.len(), MAX_EPILOGUE_STEPS + 1);
    let mut f = Fixture::new("five_activations");
    let mut t = f.x;
    for step in steps {
        t = f.step(t, step);
    }
    let plan = plan_of(f.build(&[("y", t)]));
    assert_eq!(names(&plan), ["relu_gelu_silu_sigmoid", "gelu_quick"]);
}

#[test]
fn an_elementwise_chain_stops_at_an_op_a_gemm_took() {
    // h = silu(a) is the mul operand of the GEMM's epilogue: the silu
    // cannot take the mul, which the GEMM chain holds.
    let mut f = Fixture::new("gemm_takes_the_mul");
    let a = f.activation_input("a");
    let h = f.b.silu(a).unwrap();
    let p = f.linear(f.x);
    let y = f.b.mul(p, h).unwrap();
    let plan = plan_of(f.build(&[("y", y)]));
    assert_eq!(names(&plan), ["silu", "gemm_mul"]);
}

#[test]
fn validate_rejects_elementwise_steps_that_are_not_its_ops() {
    let mut plan = plan_of(silu_mul(false));
    plan.kernels[0].composition = Composition::Elementwise(vec![EpilogueStep::Mul, EpilogueStep::Mul]);
    plan.kernels[0].name = plan.kernels[0].composition.name();
    let error = plan.validate().unwrap_err();
    assert!(error.contains("elementwise steps are not the ops"), "{error}");
    let mut plan = plan_of(silu_mul(false));
    plan.kernels[0].operands[1].role = Role::MulOperand { step: 0 };
    let error = plan.validate().unwrap_err();
    assert!(error.contains("one per step"), "{error}");
}

#[test]
fn a_norm_that_feeds_two_matmuls_stays_standalone() {
    let mut f = Fixture::new("shared_norm");
    let n = f.layernorm(f.x);
    f.b.name(n, "n").unwrap();
    let a = f.linear(n);
    let c = f.linear(n);
    let y = f.b.add(a, c).unwrap();
    let plan = plan_of(f.build(&[("y", y)]));
    assert_eq!(names(&plan), ["layernorm", "gemm", "gemm_residual"]);
    assert!(matches!(plan.kernels[0].composition, Composition::Norm(_)));
    let roles: Vec<Role> = plan.kernels[0].operands.iter().map(|o| o.role).collect();
    assert_eq!(roles, [Role::X, Role::Gamma, Role::Beta]);
    assert_eq!(plan.kernels[1].operand(Role::A), Some(tensor(&plan, "n")));
}

#[test]
fn a_norm_that_is_a_graph_output_is_not_a_prologue() {
    let mut f = Fixture::new("norm_out");
    let n = f.rmsnorm(f.x);
    let y = f.linear(n);
    let plan = plan_of(f.build(&[("n", n), ("y", y)]));
    assert_eq!(names(&plan), ["rmsnorm", "gemm"]);
}

#[test]
fn the_residual_may_be_the_gemm_input_itself() {
    let mut f = Fixture::new("self_residual");
    let h = f.linear(f.x);
    let y = f.b.add(f.x, h).unwrap();
    let plan = plan_of(f.build(&[("y", y)]));
    assert_eq!(names(&plan), ["gemm_residual"]);
    let x = tensor(&plan, "x");
    assert_eq!(plan.kernels[0].operand(Role::A), Some(x));
    assert_eq!(plan.kernels[0].operand(Role::Residual { step: 0 }), Some(x));
}

#[test]
fn validate_rejects_an_op_in_two_kernels() {
    let mut plan = plan_of(gpt2_mlp());
    let stolen = plan.kernels[0].ops[0];
    plan.kernels[1].ops.insert(0, stolen);
    let error = plan.validate().unwrap_err();
    assert!(error.contains("kernel 0 and kernel 1"), "{error}");
}

#[test]
fn validate_rejects_an_op_in_no_kernel() {
    let mut plan = plan_of(swiglu(true, false));
    plan.kernels.remove(0);
    let error = plan.validate().unwrap_err();
    assert!(error.contains("is in no kernel"), "{error}");
}

#[test]
fn validate_rejects_kernels_out_of_dependency_order() {
    let mut plan = plan_of(gpt2_mlp());
    plan.kernels.swap(0, 1);
    let error = plan.validate().unwrap_err();
    assert!(error.contains("out of dependency order"), "{error}");
}

#[test]
fn validate_rejects_operands_that_do_not_match_the_ops() {
    let mut plan = plan_of(gpt2_mlp());
    plan.kernels[1].operands.pop();
    let error = plan.validate().unwrap_err();
    assert!(error.contains("operands"), "{error}");
}

#[test]
fn dot_has_a_cluster_per_kernel_and_every_op_inside_one() {
    for graph in [swiglu(true, false), gpt2_mlp()] {
        let plan = plan_of(graph);
        let text = dot::write(&plan);
        assert!(
            text.starts_with(&format!("digraph \"{}\" {{", plan.graph.name)),
            "{text}"
        );
        assert!(text.trim_end().ends_with('}'));
        assert_eq!(
            text.matches("subgraph cluster_").count(),
            plan.kernels.len(),
            "{text}"
        );
        for (i, kernel) in plan.kernels.iter().enumerate() {
            assert!(
                text.contains(&format!("label=\"#{i} {}\"", kernel.name)),
                "{text}"
            );
        }
        for op in plan.graph.op_ids() {
            assert_eq!(
                text.matches(&format!("  op{} [label=", op.0)).count(),
                1,
                "{text}"
            );
        }
        // Braces balance: one per cluster, one for the digraph.
        assert_eq!(text.matches('{').count(), text.matches('}').count());
    }
}

#[test]
fn dot_draws_fused_intermediates_as_edges_between_ops() {
    let plan = plan_of(gpt2_mlp());
    let text = dot::write(&plan);
    // layernorm (op 0) feeds the matmul (op 1) inside kernel 0.
    assert!(text.contains("op0 -> op1 [label=\"%1\"]"), "{text}");
    // `h` crosses kernels: a tensor node written by gelu (op 3), read by op 4.
    let h = tensor(&plan, "h").0;
    assert!(text.contains(&format!("op3 -> t{h};")), "{text}");
    assert!(text.contains(&format!("t{h} -> op4;")), "{text}");
}

#[test]
fn report_of_a_gpt2_mlp() {
    let text = plan_of(gpt2_mlp_with_proj(WeightLayout::KN)).to_string();
    let expected = "\
graph `gpt2_mlp`: 7 ops → 2 kernels

#0  layernorm_gemm_bias_gelu  (composed GEMM)
    ops    layernorm → %1, matmul → %2, bias_add → %3, gelu → h
    A      x     f16[M, 768]
    B      w_fc  f16[3072, 768], read transposed
    gamma  ln_g  f16[768]
    beta   ln_b  f16[768]
    bias   b_fc  f16[3072]
    out    h     f16[M, 3072]
    layernorm: folded into B when the graph struct binds the weights (new): B' = B·diag(gamma), row statistics in a pass over A, the correction in the epilogue; the free function, given gamma per call, normalizes A into scratch and runs the plain GEMM

#1  gemm_bias_residual  (named pattern)
    ops       matmul → %5, bias_add → %6, add → y
    A         h       f16[M, 3072]
    B         w_proj  f16[3072, 768]
    bias      b_proj  f16[768]
    residual  x       f16[M, 768]
    out       y       f16[M, 768]

between kernels (written to memory, read back):
  h  f16[M, 3072]  #0 → #1
";
    assert_eq!(text, expected, "\n{text}");
}

/// A rule refusing `composition` on every shape, as a tuned table's
/// `"unfused"` entry gives it.
fn refuse(composition: &str) -> fuse::SplitRule {
    fuse::SplitRule {
        composition: composition.to_owned(),
        n: fuse::DimBounds::default(),
        k: fuse::DimBounds::default(),
        reason: format!("{composition} measured slower"),
        origin: "t.json".to_owned(),
    }
}

fn plan_refusing(graph: Graph, rules: &[fuse::SplitRule]) -> Plan {
    let plan = fuse::plan_with(graph, rules);
    plan.validate()
        .unwrap_or_else(|e| panic!("invalid plan: {e}\n{plan}"));
    plan
}

#[test]
fn a_refused_composition_is_split_into_what_is_left_and_standalone_kernels() {
    let plan = plan_refusing(
        chain_graph(None, &["bias", "residual"]),
        &[refuse("gemm_bias_residual")],
    );
    assert_eq!(names(&plan), ["gemm_bias", "add"]);
    assert_eq!(plan.splits.len(), 1);
    assert_eq!(plan.splits[0].refused, "gemm_bias_residual");
    assert_eq!(plan.splits[0].kept, "gemm_bias");
    let report = plan.to_string();
    assert!(
        report.contains("not fused: gemm_bias_residual runs as gemm_bias and kernels of its own, because it loses to that split (t.json: gemm_bias_residual measured slower)"),
        "{report}"
    );
    assert_eq!(plan.to_json()["not_fused"][0]["kept"], "gemm_bias");
    // Without the rule it is one kernel, and no split is reported.
    let fused = plan_of(chain_graph(None, &["bias", "residual"]));
    assert_eq!(names(&fused), ["gemm_bias_residual"]);
    assert!(fused.splits.is_empty());
    assert!(!fused.to_string().contains("not fused"));
}

#[test]
fn steps_are_given_up_from_the_end_until_no_rule_refuses() {
    let plan = plan_refusing(
        chain_graph(None, &["bias", "gelu", "residual"]),
        &[refuse("gemm_bias_gelu_residual"), refuse("gemm_bias_gelu")],
    );
    // The steps given up chain into one elementwise kernel.
    assert_eq!(names(&plan), ["gemm_bias", "gelu_add"]);
    assert_eq!(plan.splits[0].kept, "gemm_bias");
}

#[test]
fn a_norm_is_given_up_only_when_every_chain_with_it_is_refused() {
    // The norm with a shorter epilogue is still allowed: it stays.
    let plan = plan_refusing(
        chain_graph(Some("rmsnorm"), &["silu"]),
        &[refuse("rmsnorm_gemm_silu")],
    );
    assert_eq!(names(&plan), ["rmsnorm_gemm", "silu"]);
    // The norm and the bare GEMM refused: the norm runs alone, the GEMM
    // keeps its epilogue.
    let plan = plan_refusing(
        chain_graph(Some("rmsnorm"), &["silu"]),
        &[refuse("rmsnorm_gemm_silu"), refuse("rmsnorm_gemm")],
    );
    assert_eq!(names(&plan), ["rmsnorm", "gemm_silu"]);
    assert_eq!(plan.splits[0].kept, "gemm_silu");
}

#[test]
fn a_rule_holds_only_within_its_bounds_on_static_dims() {
    // D = 64 is both N and K of the fixture's GEMMs.
    let bounded = |n: fuse::DimBounds, k: fuse::DimBounds| fuse::SplitRule {
        n,
        k,
        ..refuse("gemm_bias_residual")
    };
    let below = fuse::DimBounds {
        min: None,
        max: Some(63),
    };
    let around = fuse::DimBounds {
        min: Some(64),
        max: Some(64),
    };
    for (rule, splits) in [
        (bounded(below, fuse::DimBounds::default()), false),
        (bounded(around, fuse::DimBounds::default()), true),
        (bounded(fuse::DimBounds::default(), around), true),
        (bounded(around, below), false),
    ] {
        let plan = plan_refusing(chain_graph(None, &["bias", "residual"]), &[rule]);
        assert_eq!(plan.kernels.len() == 2, splits, "{plan}");
    }
}

#[test]
fn a_bound_on_a_dynamic_dim_never_holds() {
    // N dynamic: `[D, N]` weight read as [K, N].
    let mut b = GraphBuilder::new("dynamic_n");
    let m = b.dynamic_dim("M").unwrap();
    let n = b.dynamic_dim("N").unwrap();
    let d = b.static_dim("D", 64).unwrap();
    let x = b.input("x", DType::F16, &[m, d]).unwrap();
    let w = b.weight("w", DType::F16, &[d, n]).unwrap();
    let r = b.input("r", DType::F16, &[m, n]).unwrap();
    let y = b.matmul(x, w, WeightLayout::KN).unwrap();
    let y = b.add(y, r).unwrap();
    b.output("y", y).unwrap();
    let graph = b.build().unwrap();
    let rule = fuse::SplitRule {
        n: fuse::DimBounds {
            min: None,
            max: Some(1 << 20),
        },
        ..refuse("gemm_residual")
    };
    assert_eq!(names(&plan_refusing(graph.clone(), &[rule])), ["gemm_residual"]);
    assert_eq!(
        names(&plan_refusing(graph, &[refuse("gemm_residual")])),
        ["gemm", "add"]
    );
}

#[test]
fn a_refused_swiglu_gate_leaves_the_mul_to_the_up_projection() {
    // The gated pair refused: the two matmuls' chains, as without it.
    let plan = plan_refusing(swiglu(true, false), &[refuse("gemm_silu_glu")]);
    assert_eq!(names(&plan), ["gemm", "gemm_silu_mul", "gemm_bias_residual"]);
    assert_eq!(plan.splits[0].refused, "gemm_silu_glu");
    assert_eq!(plan.splits[0].kept, "a GEMM for each of its two weights");
    let plan = plan_refusing(
        swiglu(true, false),
        &[refuse("gemm_silu_glu"), refuse("gemm_silu_mul")],
    );
    assert_eq!(names(&plan), ["gemm_silu", "gemm_mul", "gemm_bias_residual"]);
}

#[test]
fn a_gated_pair_refused_with_its_norm_keeps_the_pair_and_runs_the_norm_alone() {
    let graph = gated(true, false, WeightLayout::NK, false);
    let plan = plan_refusing(graph.clone(), &[refuse("rmsnorm_gemm_gelu_glu")]);
    assert_eq!(names(&plan), ["rmsnorm", "gemm_gelu_glu"], "{plan}");
    assert_eq!(plan.splits[0].kept, "gemm_gelu_glu");
    // Refused both ways: the two matmuls' own chains, the norm alone.
    let plan = plan_refusing(graph, &[refuse("rmsnorm_gemm_gelu_glu"), refuse("gemm_gelu_glu")]);
    assert_eq!(names(&plan), ["rmsnorm", "gemm", "gemm_gelu_mul"], "{plan}");
    assert_eq!(plan.splits[0].kept, "a GEMM for each of its two weights");
}

/// Each kernel of the shipped SwiGLU block (at small D and F), alone as a
/// graph, computes on the reference what it computes inside the block: the
/// down projection's graph reads the gated kernel's output as an input.
#[test]
fn a_kernel_alone_as_a_graph_computes_what_it_does_in_its_plan() {
    use fusion_compiler::diagnostic::SourceFile;
    use fusion_compiler::ir::TensorKind;
    use fusion_compiler::reference::{self, Bindings};
    use rand::SeedableRng;
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/swiglu_ffn.toml");
    let text = std::fs::read_to_string(path)
        .unwrap()
        .replace("D = 4096", "D = 16")
        .replace("F = 14336", "F = 24");
    let source = SourceFile::new("swiglu_ffn.toml".to_owned(), text.as_str());
    let plan = plan_of(fusion_compiler::graph_from_source(&source).unwrap());
    assert_eq!(plan.kernels.len(), 2, "{plan}");
    let host = reference::random_bindings(
        &plan.graph,
        &[("M", 3)],
        &mut rand::rngs::StdRng::seed_from_u64(7),
    )
    .unwrap();
    let every = reference::evaluate_all(&plan.graph, &host).unwrap();
    for index in 0..plan.kernels.len() {
        let kernel = &plan.kernels[index];
        let alone = plan.kernel_graph(index);
        assert_eq!(alone.name, format!("swiglu_ffn_k{index}"));
        assert_eq!(alone.outputs, [kernel.output]);
        assert_eq!(alone.ops.len(), kernel.ops.len());
        assert_eq!(alone.inputs[0], kernel.operand(Role::A).unwrap(), "A comes first");
        assert!(
            alone
                .weights
                .iter()
                .all(|&w| alone.tensor(w).kind == TensorKind::Weight)
        );
        let inputs: Bindings = alone
            .inputs
            .iter()
            .chain(&alone.weights)
            .map(|&t| {
                let name = alone.tensor(t).name.clone();
                let value = host.get(&name).or_else(|| every.get(&name)).unwrap().clone();
                (name, value)
            })
            .collect();
        let output = &alone.tensor(kernel.output).name;
        let got = &reference::evaluate(&alone, &inputs).unwrap()[output];
        assert_eq!(got.data, every[output].data, "kernel {index}");
        // As a plan of its own: the kernel alone over that graph, with
        // nothing passing between kernels.
        let one = plan.kernel_plan(index);
        assert_eq!(
            (one.graph.name.as_str(), &one.kernels[..]),
            (alone.name.as_str(), std::slice::from_ref(kernel))
        );
        assert!(one.temporaries().is_empty());
    }
    // The down projection reads the gated kernel's output as its input.
    let down = plan.kernel_graph(1);
    assert_eq!(down.tensor(down.inputs[0]).kind, TensorKind::Input);
    assert_eq!(down.inputs[0], plan.kernels[0].output);
}

fn toml_plan(text: &str) -> Plan {
    let source = fusion_compiler::diagnostic::SourceFile::new("t.toml", text);
    plan_of(fusion_compiler::graph_from_source(&source).unwrap_or_else(|e| panic!("{e}")))
}

/// The launcher params' pointers come from one map of roles to fields.
#[test]
fn a_kernels_operands_map_to_the_launch_params_fields() {
    let plan = toml_plan(
        "[graph]\nname = \"t\"\n[dims]\nM = \"dyn\"\nD = 64\nN = 32\n\
         [inputs]\nx = \"f16[M, D]\"\nr = \"f16[M, N]\"\n\
         [weights]\ng = \"f16[D]\"\nw = \"f16[N, D]\"\nb = \"f16[N]\"\n\
         [outputs]\ny = \"rmsnorm(x, g) @ w^T + b + r\"\n",
    );
    assert_eq!(plan.kernels.len(), 1, "{plan}");
    let fields = plan.kernels[0].gemm_operands().map(|o| o.tensor);
    let t = |name| Some(tensor(&plan, name));
    assert_eq!(
        (fields.a, fields.b, fields.gamma, fields.bias, fields.residual),
        (t("x"), t("w"), t("g"), t("b"), t("r"))
    );
    assert_eq!((fields.b_up, fields.multiplier, fields.beta), (None, None, None));

    let chain = toml_plan(
        "[graph]\nname = \"c\"\n[dims]\nM = \"dyn\"\nN = 32\n\
         [inputs]\nx = \"f16[M, N]\"\nu = \"f16[M, N]\"\nv = \"f16[M, N]\"\n\
         [outputs]\ny = \"silu(x) * u + v\"\n",
    );
    assert_eq!(chain.kernels.len(), 1, "{chain}");
    let steps = chain.kernels[0].step_operands().map(|o| o.map(|o| o.tensor));
    let t = |name| Some(tensor(&chain, name));
    assert_eq!(steps, [None, t("u"), t("v"), None]);
}
