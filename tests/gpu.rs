//! GPU correctness of the built-in kernel library: every shipped graph
//! through its generated wrapper, f16 and bf16, at ragged and benchmark
//! shapes, against the CPU reference with fresh random inputs and outputs
//! poisoned with NaN before each launch; each activation step alone at its
//! hardest inputs (its expectations checked on the CPU); and the run-time
//! checks that refuse bad arguments before anything is launched.
//!
//! Run on a machine with a GPU: `cargo test --release --features kernels,testing --test gpu -- --ignored`
//! (see tests/support for the environment variables).

mod support;

use fusion::core::reference::{self, Bindings, HostTensor, Intermediates};
use fusion::cudarc::driver::CudaStream;
use fusion::half::{bf16, f16};
use fusion::{Tensor, TensorMut, kernels, testing};
use std::sync::Arc;
use support::{Case, TestElement, check, check_adjusted, gemm_shapes, stream, token_counts};

/// One test per single-GEMM pattern graph, over every (M, N, K) and both
/// element types; `$call` launches the wrapper with `r` (inputs then
/// weights) and `w` (outputs), compared with the exact reference or with
/// one that rounds `$intermediates` as the launch does.
macro_rules! pattern_test {
    ($test:ident, $graph:literal, |$s:ident, $r:ident, $w:ident| $call:expr) => {
        pattern_test!($test, $graph, Intermediates::Exact, |$s, $r, $w| $call);
    };
    ($test:ident, $graph:literal, $intermediates:expr, |$s:ident, $r:ident, $w:ident| $call:expr) => {
        #[test]
        #[ignore = "needs a CUDA GPU"]
        fn $test() {
            let stream = stream();
            let $s = &stream;
            for (m, n, k) in gemm_shapes() {
                let dims = [("M", m), ("N", n), ("K", k)];
                check_adjusted::<f16>($s, $graph, &dims, $intermediates, |_| {}, |$r, $w| $call);
                check_adjusted::<bf16>($s, $graph, &dims, $intermediates, |_| {}, |$r, $w| $call);
            }
        }
    };
}

pattern_test!(gemm, "gemm", |s, r, w| kernels::gemm(s, &r[0], &r[1], &mut w[0]));
pattern_test!(gemm_bias_gelu, "gemm_bias_gelu", |s, r, w| {
    kernels::gemm_bias_gelu(s, &r[0], &r[1], &r[2], &mut w[0])
});
pattern_test!(gemm_bias_gelu_erf, "gemm_bias_gelu_erf", |s, r, w| {
    kernels::gemm_bias_gelu_erf(s, &r[0], &r[1], &r[2], &mut w[0])
});
pattern_test!(gemm_bias_silu, "gemm_bias_silu", |s, r, w| {
    kernels::gemm_bias_silu(s, &r[0], &r[1], &r[2], &mut w[0])
});
pattern_test!(gemm_bias_relu, "gemm_bias_relu", |s, r, w| {
    kernels::gemm_bias_relu(s, &r[0], &r[1], &r[2], &mut w[0])
});
pattern_test!(gemm_bias, "gemm_bias", |s, r, w| kernels::gemm_bias(
    s, &r[0], &r[1], &r[2], &mut w[0]
));
pattern_test!(gemm_bias_residual, "gemm_bias_residual", |s, r, w| {
    kernels::gemm_bias_residual(s, &r[0], &r[1], &r[2], &r[3], &mut w[0])
});
// Without a bias (Llama's o_proj and down_proj), per call and bound.
pattern_test!(gemm_residual, "gemm_residual", |s, r, w| {
    kernels::gemm_residual(s, &r[0], &r[1], &r[2], &mut w[0])
});
pattern_test!(gemm_residual_bound, "gemm_residual", |s, r, w| {
    let weights = kernels::GemmResidualWeights { w: r[2].clone() };
    kernels::GemmResidual::new(s, weights)?.run(s, &r[0], &r[1], &mut w[0])
});
pattern_test!(gemm_gelu, "gemm_gelu", |s, r, w| kernels::gemm_gelu(
    s, &r[0], &r[1], &mut w[0]
));
pattern_test!(gemm_silu, "gemm_silu", |s, r, w| kernels::gemm_silu(
    s, &r[0], &r[1], &mut w[0]
));
pattern_test!(gemm_bias_sigmoid, "gemm_bias_sigmoid", |s, r, w| {
    kernels::gemm_bias_sigmoid(s, &r[0], &r[1], &r[2], &mut w[0])
});
pattern_test!(gemm_gelu_quick, "gemm_gelu_quick", |s, r, w| {
    kernels::gemm_gelu_quick(s, &r[0], &r[1], &mut w[0])
});
// Plain weights bound by a struct, which on sm90 (FUSION_PAD_WEIGHTS=sm90,
// the default; all: on every generation) copies a weight whose rows are not a multiple of
// 128 bytes into padded rows and runs the GEMM on that copy (K = 3000, 1032
// and 632 for [N, K]; N = 3000, 5400, 776 and 17016 for [K, N]).
pattern_test!(gemm_bound, "gemm", |s, r, w| {
    kernels::Gemm::new(s, kernels::GemmWeights { w: r[1].clone() })?.run(s, &r[0], &mut w[0])
});
pattern_test!(gemm_bias_gelu_bound, "gemm_bias_gelu", |s, r, w| {
    let weights = kernels::GemmBiasGeluWeights {
        w: r[1].clone(),
        b: r[2].clone(),
    };
    kernels::GemmBiasGelu::new(s, weights)?.run(s, &r[0], &mut w[0])
});
pattern_test!(gemm_bias_silu_bound, "gemm_bias_silu", |s, r, w| {
    let weights = kernels::GemmBiasSiluWeights {
        w: r[1].clone(),
        b: r[2].clone(),
    };
    kernels::GemmBiasSilu::new(s, weights)?.run(s, &r[0], &mut w[0])
});
pattern_test!(gemm_bias_residual_bound, "gemm_bias_residual", |s, r, w| {
    let weights = kernels::GemmBiasResidualWeights {
        w: r[2].clone(),
        b: r[3].clone(),
    };
    kernels::GemmBiasResidual::new(s, weights)?.run(s, &r[0], &r[1], &mut w[0])
});
// The free functions normalize A into T, then run the GEMM on it.
pattern_test!(
    layernorm_gemm,
    "layernorm_gemm",
    Intermediates::RoundedNorms,
    |s, r, w| { kernels::layernorm_gemm(s, &r[0], &r[1], &r[2], &r[3], &mut w[0]) }
);
pattern_test!(
    rmsnorm_gemm,
    "rmsnorm_gemm",
    Intermediates::RoundedNorms,
    |s, r, w| { kernels::rmsnorm_gemm(s, &r[0], &r[1], &r[2], &mut w[0]) }
);

// Gated GEMMs, per call: the launch interleaves gate and up into its
// workspace first.
pattern_test!(gemm_silu_glu, "gemm_silu_glu", |s, r, w| {
    kernels::gemm_silu_glu(s, &r[0], &r[1], &r[2], &mut w[0])
});
pattern_test!(gemm_gelu_glu, "gemm_gelu_glu", |s, r, w| {
    kernels::gemm_gelu_glu(s, &r[0], &r[1], &r[2], &mut w[0])
});
// A LayerNorm before the pair and a step after it: per call the launch
// normalizes A and interleaves the weights; bound, the norm (both its terms,
// over the 2N interleaved columns) folds into the interleaved weight.
pattern_test!(
    layernorm_gemm_silu_glu_residual,
    "layernorm_gemm_silu_glu_residual",
    Intermediates::RoundedNorms,
    |s, r, w| kernels::layernorm_gemm_silu_glu_residual(
        s, &r[0], &r[1], &r[2], &r[3], &r[4], &r[5], &mut w[0]
    )
);
pattern_test!(
    layernorm_gemm_silu_glu_residual_bound,
    "layernorm_gemm_silu_glu_residual",
    |s, r, w| {
        let weights = kernels::LayernormGemmSiluGluResidualWeights {
            g: r[2].clone(),
            b: r[3].clone(),
            w_gate: r[4].clone(),
            w_up: r[5].clone(),
        };
        kernels::LayernormGemmSiluGluResidual::new(s, weights)?.run(s, &r[0], &r[1], &mut w[0])
    }
);
// ...and bound: interleaved once by the struct.
pattern_test!(gemm_silu_glu_bound, "gemm_silu_glu", |s, r, w| {
    support::gemm_silu_glu_bound(s, &r[0], &r[1], &r[2], &mut w[0])
});
pattern_test!(gemm_gelu_glu_bound, "gemm_gelu_glu", |s, r, w| {
    support::gemm_gelu_glu_bound(s, &r[0], &r[1], &r[2], &mut w[0])
});

/// Gate and up hold different values, so a kernel that swapped them (or
/// read one twice) would be wrong: check that the comparison sees a swap,
/// per call and bound, on the decode kernel's rows and on the tiles'.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_gated_gemm_with_gate_and_up_swapped_fails_the_check() {
    let s = stream();
    for m in [1, 300] {
        let dims = [("M", m), ("N", 136), ("K", 1000)];
        for bound in [false, true] {
            let mut case = Case::<f16>::new(&s, "gemm_silu_glu", &dims);
            // Gate and up passed the wrong way round.
            case.launch(|r, w| {
                if bound {
                    support::gemm_silu_glu_bound(&s, &r[0], &r[2], &r[1], &mut w[0])
                } else {
                    kernels::gemm_silu_glu(&s, &r[0], &r[2], &r[1], &mut w[0])
                }
            })
            .expect("launch");
            let verdict = case.try_verify(&s);
            assert!(
                verdict.is_err(),
                "{} bound={bound}: a swap of gate and up passed: {verdict:?}",
                case.label
            );
        }
    }
}

// The same graphs with their weights bound: the norm is folded into `w`.
pattern_test!(layernorm_gemm_folded, "layernorm_gemm", |s, r, w| {
    support::layernorm_gemm_folded(s, r, w)
});
pattern_test!(rmsnorm_gemm_folded, "rmsnorm_gemm", |s, r, w| {
    support::rmsnorm_gemm_folded(s, r, w)
});

/// Rows far from zero against their spread (mean 3, half-width 0.5, where
/// a folded LayerNorm subtracts two large, nearly equal sums) and a gamma
/// with zeros and negative values, through both paths: the free function
/// (gamma per call: the norm kernel, then the GEMM) and the fold (the
/// struct). On a variant without T, `check_adjusted` expects the refusal.
#[test]
#[ignore = "needs a CUDA GPU"]
fn norms_on_rows_off_center_and_gamma_with_zeros_and_negatives() {
    let s = stream();
    let shapes: &[(usize, usize, usize)] = if support::tiny() {
        &[(77, 136, 136)]
    } else {
        &[(77, 136, 3000), (1000, 3000, 136), (300, 4096, 4096)]
    };
    for &(m, n, k) in shapes {
        let dims = [("M", m), ("N", n), ("K", k)];
        off_center::<f16>(&s, &dims);
        off_center::<bf16>(&s, &dims);
    }
}

fn off_center<T: TestElement>(s: &Arc<CudaStream>, dims: &[(&str, usize)]) {
    let rows = |host: &mut Bindings| support::off_center_norm_inputs(host, 3.0);
    let (per_call, folded) = (Intermediates::RoundedNorms, Intermediates::Exact);
    check_adjusted::<T>(s, "layernorm_gemm", dims, per_call, rows, |r, w| {
        kernels::layernorm_gemm(s, &r[0], &r[1], &r[2], &r[3], &mut w[0])
    });
    check_adjusted::<T>(s, "layernorm_gemm", dims, folded, rows, |r, w| {
        support::layernorm_gemm_folded(s, r, w)
    });
    check_adjusted::<T>(s, "rmsnorm_gemm", dims, per_call, rows, |r, w| {
        kernels::rmsnorm_gemm(s, &r[0], &r[1], &r[2], &mut w[0])
    });
    check_adjusted::<T>(s, "rmsnorm_gemm", dims, folded, rows, |r, w| {
        support::rmsnorm_gemm_folded(s, r, w)
    });
}

/// How a norm kernel runs.
#[derive(Clone, Copy, Debug)]
enum NormLaunch {
    /// A standalone norm: `y = norm(x)`.
    Standalone,
    /// A norm GEMM's free function: the norm kernel stores the normalized
    /// rows in T, then the GEMM reads them.
    PerCall,
    /// A norm GEMM's struct, the norm folded into the weight.
    Folded,
}

/// Every norm kernel, by graph and launch.
const NORM_KERNELS: [(&str, NormLaunch); 9] = [
    ("layernorm", NormLaunch::Standalone),
    ("rmsnorm", NormLaunch::Standalone),
    ("rmsnorm_eps1e5", NormLaunch::Standalone),
    ("layernorm_gemm", NormLaunch::PerCall),
    ("layernorm_gemm", NormLaunch::Folded),
    ("rmsnorm_gemm", NormLaunch::PerCall),
    ("rmsnorm_gemm", NormLaunch::Folded),
    ("layernorm_gemm_silu_glu_residual", NormLaunch::PerCall),
    ("layernorm_gemm_silu_glu_residual", NormLaunch::Folded),
];

impl NormLaunch {
    /// What the reference rounds to compute what the launch computes.
    fn intermediates(self) -> Intermediates {
        match self {
            NormLaunch::PerCall => Intermediates::RoundedNorms,
            NormLaunch::Standalone | NormLaunch::Folded => Intermediates::Exact,
        }
    }

    /// The sizes of its small-variance cases: (M, K) for a standalone norm,
    /// (M, N, K) for a norm GEMM, rows of 8 to 3000 elements; M = 13 runs
    /// the decode kernel where the GEMM's config has one.
    fn dims(self) -> Vec<Vec<(&'static str, usize)>> {
        let tiny = support::tiny();
        match self {
            NormLaunch::Standalone => {
                let shapes: &[(usize, usize)] = if tiny {
                    &[(1, 8), (77, 136)]
                } else {
                    &[(1, 8), (77, 136), (1000, 3000)]
                };
                shapes.iter().map(|&(m, k)| vec![("M", m), ("K", k)]).collect()
            }
            NormLaunch::PerCall | NormLaunch::Folded => {
                let shapes: &[(usize, usize, usize)] = if tiny {
                    &[(77, 136, 136)]
                } else {
                    &[(13, 520, 1032), (77, 136, 3000), (1000, 3000, 136)]
                };
                shapes
                    .iter()
                    .map(|&(m, n, k)| vec![("M", m), ("N", n), ("K", k)])
                    .collect()
            }
        }
    }
}

/// Launches the norm kernel of `graph` as `how` says, with `r` its inputs
/// then weights and `w` its output.
fn launch_norm<T: fusion::Element>(
    s: &Arc<CudaStream>,
    graph: &str,
    how: NormLaunch,
    r: &[Tensor<'_, T>],
    w: &mut [TensorMut<'_, T>],
) -> fusion::Result<()> {
    let folded = matches!(how, NormLaunch::Folded);
    match (graph, folded) {
        ("layernorm", _) => kernels::layernorm(s, &r[0], &r[1], &r[2], &mut w[0]),
        ("rmsnorm", _) => kernels::rmsnorm(s, &r[0], &r[1], &mut w[0]),
        ("rmsnorm_eps1e5", _) => kernels::rmsnorm_eps1e5(s, &r[0], &r[1], &mut w[0]),
        ("layernorm_gemm", false) => kernels::layernorm_gemm(s, &r[0], &r[1], &r[2], &r[3], &mut w[0]),
        ("layernorm_gemm", true) => support::layernorm_gemm_folded(s, r, w),
        ("rmsnorm_gemm", false) => kernels::rmsnorm_gemm(s, &r[0], &r[1], &r[2], &mut w[0]),
        ("rmsnorm_gemm", true) => support::rmsnorm_gemm_folded(s, r, w),
        ("layernorm_gemm_silu_glu_residual", false) => {
            kernels::layernorm_gemm_silu_glu_residual(s, &r[0], &r[1], &r[2], &r[3], &r[4], &r[5], &mut w[0])
        }
        ("layernorm_gemm_silu_glu_residual", true) => {
            let weights = kernels::LayernormGemmSiluGluResidualWeights {
                g: r[2].clone(),
                b: r[3].clone(),
                w_gate: r[4].clone(),
                w_up: r[5].clone(),
            };
            kernels::LayernormGemmSiluGluResidual::new(s, weights)?.run(s, &r[0], &r[1], &mut w[0])
        }
        _ => unreachable!("{graph} is not a norm kernel"),
    }
}

/// Rows of small variance (`support::small_variance_norm_inputs`: x
/// scaled by 1e-3), where the norm's eps, not the rows, sets the normalized
/// rows' scale, through every norm kernel: the standalone norms, and each
/// norm GEMM per call and folded. Everywhere else the rows' variance (about
/// 1/3) hides the eps; here an eps dropped, or 1e-6 for 1e-5, scales the
/// rows by 1.4x or more (`an_eps_off_fails_the_small_variance_norms`).
#[test]
#[ignore = "needs a CUDA GPU"]
fn norms_at_small_variance_are_scaled_by_their_eps() {
    let s = stream();
    for (graph, how) in NORM_KERNELS {
        for dims in how.dims() {
            small_variance::<f16>(&s, graph, how, &dims);
            small_variance::<bf16>(&s, graph, how, &dims);
        }
    }
}

fn small_variance<T: TestElement>(s: &Arc<CudaStream>, graph: &str, how: NormLaunch, dims: &[(&str, usize)]) {
    let rows = support::small_variance_norm_inputs;
    check_adjusted::<T>(s, graph, dims, how.intermediates(), rows, |r, w| {
        launch_norm(s, graph, how, r, w)
    });
}

/// `graph` with every norm's eps set to `eps`.
fn with_eps(graph: &fusion::ir::Graph, eps: f64) -> fusion::ir::Graph {
    use fusion::ir::OpKind;
    let mut graph = graph.clone();
    for op in &mut graph.ops {
        match &mut op.kind {
            OpKind::LayerNorm { eps: e } | OpKind::RmsNorm { eps: e } => *e = eps,
            _ => {}
        }
    }
    graph
}

/// The eps of `graph`'s norm.
fn norm_eps(graph: &fusion::ir::Graph) -> f64 {
    use fusion::ir::OpKind;
    graph
        .ops
        .iter()
        .find_map(|op| match op.kind {
            OpKind::LayerNorm { eps } | OpKind::RmsNorm { eps } => Some(eps),
            _ => None,
        })
        .expect("a norm kernel's graph has a norm")
}

/// On the CPU, the reference in f64 at the inputs of
/// [`norms_at_small_variance_are_scaled_by_their_eps`]: each norm kernel's
/// graph with its eps dropped (0), or 1e-6 and 1e-5 swapped, fails the
/// comparison the GPU test makes (`testing::compare`), its relative L2
/// error over ten times the limit; with the right eps the reference rounded
/// to the element type passes. The rows are independent, so 8 rows of each
/// case's (N, K) stand for all of them.
#[test]
fn an_eps_off_fails_the_small_variance_norms() {
    use fusion::core::reference::{evaluate_rows_with, random_bindings, relative_error};
    use fusion::ir::DType;
    use rand::SeedableRng;
    for (seed, (name, how)) in NORM_KERNELS.into_iter().enumerate() {
        for mut dims in how.dims() {
            for dim in &mut dims {
                if dim.0 == "M" {
                    dim.1 = dim.1.min(8);
                }
            }
            for dtype in [DType::F16, DType::BF16] {
                let graph = support::graph(name, dtype);
                let mut rng = rand::rngs::StdRng::seed_from_u64(seed as u64);
                let mut host = random_bindings(&graph, &dims, &mut rng).expect("bindings");
                support::small_variance_norm_inputs(&mut host);
                for t in host.values_mut() {
                    *t = t.rounded_to(dtype);
                }
                let m = dims.iter().find(|d| d.0 == "M").expect("a row dim").1;
                let rows: Vec<usize> = (0..m).collect();
                let output = graph.tensor(graph.outputs[0]).name.clone();
                let reference = |graph: &fusion::ir::Graph| {
                    evaluate_rows_with(graph, &host, &rows, how.intermediates()).expect("reference")[&output]
                        .clone()
                };
                let want = reference(&graph);
                let label = format!("{name} {how:?} {dtype} {dims:?}");
                testing::compare(&want.rounded_to(dtype), &want, dtype, &rows)
                    .unwrap_or_else(|e| panic!("{label}: the right eps fails: {e}"));
                let eps = norm_eps(&graph);
                let swapped = if eps == 1e-5 { 1e-6 } else { 1e-5 };
                for wrong in [0.0, swapped] {
                    let got = reference(&with_eps(&graph, wrong)).rounded_to(dtype);
                    let error = relative_error(&got, &want);
                    let limit = testing::relative_l2_limit(dtype);
                    eprintln!(
                        "{label}: eps {wrong:e} for {eps:e}: relative L2 error {error:.3e}, {:.0}x the limit",
                        error / limit
                    );
                    assert!(
                        testing::compare(&got, &want, dtype, &rows).is_err(),
                        "{label}: eps {wrong:e} for {eps:e} passes"
                    );
                    assert!(
                        error > 10.0 * limit,
                        "{label}: eps {wrong:e} for {eps:e}: relative L2 error {error:.3e}, limit {limit:e}"
                    );
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn swiglu_ffn() {
    let s = stream();
    for m in token_counts(8192) {
        check::<f16>(&s, "swiglu_ffn", &[("M", m)], |r, w| swiglu_ffn_run(&s, r, w));
        check::<bf16>(&s, "swiglu_ffn", &[("M", m)], |r, w| swiglu_ffn_run(&s, r, w));
    }
}

/// A SwigluFfn bound to `r`'s weights, run on its input.
fn swiglu_ffn_run<T: fusion::Element>(
    s: &Arc<CudaStream>,
    r: &[Tensor<'_, T>],
    w: &mut [TensorMut<'_, T>],
) -> fusion::Result<()> {
    let weights = kernels::SwigluFfnWeights {
        w_gate: r[1].clone(),
        w_up: r[2].clone(),
        w_down: r[3].clone(),
        b_down: r[4].clone(),
    };
    kernels::SwigluFfn::new(s, weights)?.run(s, &r[0], &mut w[0])
}

/// The FFN sub-layer, RMSNorm through the residual: its norm folded into
/// the interleaved gate/up weight when the struct binds the weights.
#[test]
#[ignore = "needs a CUDA GPU"]
fn ffn_sublayer() {
    let s = stream();
    for m in token_counts(8192) {
        check::<f16>(&s, "ffn_sublayer", &[("M", m)], |r, w| ffn_sublayer_run(&s, r, w));
        check::<bf16>(&s, "ffn_sublayer", &[("M", m)], |r, w| ffn_sublayer_run(&s, r, w));
    }
}

fn ffn_sublayer_run<T: fusion::Element>(
    s: &Arc<CudaStream>,
    r: &[Tensor<'_, T>],
    w: &mut [TensorMut<'_, T>],
) -> fusion::Result<()> {
    let weights = kernels::FfnSublayerWeights {
        gamma: r[1].clone(),
        w_gate: r[2].clone(),
        w_up: r[3].clone(),
        w_down: r[4].clone(),
    };
    kernels::FfnSublayer::new(s, weights)?.run(s, &r[0], &mut w[0])
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn llama_ffn() {
    let s = stream();
    for m in token_counts(8192) {
        check::<f16>(&s, "llama_ffn", &[("M", m)], |r, w| llama_ffn_run(&s, r, w));
        check::<bf16>(&s, "llama_ffn", &[("M", m)], |r, w| llama_ffn_run(&s, r, w));
    }
}

fn llama_ffn_run<T: fusion::Element>(
    s: &Arc<CudaStream>,
    r: &[Tensor<'_, T>],
    w: &mut [TensorMut<'_, T>],
) -> fusion::Result<()> {
    let weights = kernels::LlamaFfnWeights {
        w_gate: r[1].clone(),
        w_up: r[2].clone(),
        w_down: r[3].clone(),
    };
    kernels::LlamaFfn::new(s, weights)?.run(s, &r[0], &mut w[0])
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpt2_mlp() {
    let s = stream();
    // M = 512 too: there c_fc (N = 3072) runs its small-M tile fitted to
    // N, 128x96 (select::fitted_width), which no other count reaches.
    for m in token_counts(4096).into_iter().chain([512]) {
        check::<f16>(&s, "gpt2_mlp", &[("M", m)], |r, w| gpt2_mlp_run(&s, r, w));
        check::<bf16>(&s, "gpt2_mlp", &[("M", m)], |r, w| gpt2_mlp_run(&s, r, w));
    }
}

/// Its LayerNorm is folded into `w_fc` when the struct binds the weights.
fn gpt2_mlp_run<T: fusion::Element>(
    s: &Arc<CudaStream>,
    r: &[Tensor<'_, T>],
    w: &mut [TensorMut<'_, T>],
) -> fusion::Result<()> {
    let weights = kernels::Gpt2MlpWeights {
        ln_g: r[1].clone(),
        ln_b: r[2].clone(),
        w_fc: r[3].clone(),
        b_fc: r[4].clone(),
        w_proj: r[5].clone(),
        b_proj: r[6].clone(),
    };
    kernels::Gpt2Mlp::new(s, weights)?.run(s, &r[0], &mut w[0])
}

/// The standalone (unfused) kernels: every ragged shape, both element types.
macro_rules! standalone_test {
    ($test:ident, $graph:literal, $cols:literal, |$s:ident, $r:ident, $w:ident| $call:expr) => {
        #[test]
        #[ignore = "needs a CUDA GPU"]
        fn $test() {
            let stream = stream();
            let $s = &stream;
            let mut shapes: Vec<(usize, usize)> = [1, 77, 1000]
                .into_iter()
                .flat_map(|m| [8, 136, 3000].into_iter().map(move |n| (m, n)))
                .collect();
            if support::tiny() {
                shapes.retain(|&(m, n)| m < 1000 && n < 3000);
            } else {
                shapes.push((4096, 4096));
            }
            for (m, n) in shapes {
                let dims = [("M", m), ($cols, n)];
                check::<f16>($s, $graph, &dims, |$r, $w| $call);
                check::<bf16>($s, $graph, &dims, |$r, $w| $call);
            }
        }
    };
}

standalone_test!(silu, "silu", "N", |s, r, w| kernels::silu(s, &r[0], &mut w[0]));
standalone_test!(sigmoid, "sigmoid", "N", |s, r, w| kernels::sigmoid(
    s, &r[0], &mut w[0]
));
standalone_test!(gelu_quick, "gelu_quick", "N", |s, r, w| kernels::gelu_quick(
    s, &r[0], &mut w[0]
));
standalone_test!(mul, "mul", "N", |s, r, w| kernels::mul(
    s, &r[0], &r[1], &mut w[0]
));
// silu(gate) * up as one kernel: a chain of two steps, the factor read at
// the mul's step.
standalone_test!(silu_mul, "silu_mul", "N", |s, r, w| kernels::silu_mul(
    s, &r[0], &r[1], &mut w[0]
));
standalone_test!(gelu_mul, "gelu_mul", "N", |s, r, w| kernels::gelu_mul(
    s, &r[0], &r[1], &mut w[0]
));
standalone_test!(layernorm, "layernorm", "K", |s, r, w| kernels::layernorm(
    s, &r[0], &r[1], &r[2], &mut w[0]
));
standalone_test!(rmsnorm, "rmsnorm", "K", |s, r, w| kernels::rmsnorm(
    s, &r[0], &r[1], &mut w[0]
));
// The same kernel with Llama 3's eps, which its wrapper passes.
standalone_test!(rmsnorm_eps1e5, "rmsnorm_eps1e5", "K", |s, r, w| {
    kernels::rmsnorm_eps1e5(s, &r[0], &r[1], &mut w[0])
});

/// The standalone norms at row lengths that reach each of the launcher's
/// kernels (norm.cuh's `launch_norm_rows_with`): one block per row with 2,
/// 4 and 8 16-byte chunks a thread (K of 4104 to 32768, where the shapes
/// above take one chunk), and one warp per row past that; every length
/// but 32768 leaves the last threads or lanes part of a row's chunks.
#[test]
#[ignore = "needs a CUDA GPU"]
fn norms_on_long_rows() {
    let stream = stream();
    let s = &stream;
    // K / 8 chunks: 626 (2 a thread), 1026 (4), 2501 (8), 4096 (8, the
    // largest), 4126 (a warp per row).
    let lengths: &[usize] = if support::tiny() {
        &[5008, 8208]
    } else {
        &[5008, 8208, 20008, 32768, 33008]
    };
    for &k in lengths {
        for m in [1, 3] {
            let dims = [("M", m), ("K", k)];
            check::<f16>(s, "layernorm", &dims, |r, w| {
                kernels::layernorm(s, &r[0], &r[1], &r[2], &mut w[0])
            });
            check::<bf16>(s, "layernorm", &dims, |r, w| {
                kernels::layernorm(s, &r[0], &r[1], &r[2], &mut w[0])
            });
            check::<f16>(s, "rmsnorm", &dims, |r, w| {
                kernels::rmsnorm(s, &r[0], &r[1], &mut w[0])
            });
            check::<bf16>(s, "rmsnorm", &dims, |r, w| {
                kernels::rmsnorm(s, &r[0], &r[1], &mut w[0])
            });
        }
    }
}

// ---- each activation step alone, at its hardest inputs ---------------------

/// Rows and columns of the standalone activation cases.
const ACT_ROWS: usize = 64;
const ACT_COLS: usize = 64;

/// (rows, columns) of the activation cases through a GEMM, 4096 values
/// but for one row: 64 x 64 on the tiles, and on the decode kernel
/// (fusion-compiler/kernels/include/fusion/decode.cuh, which sm80 and sm90
/// run for M <= 16 over [N, K] weights) 16 rows, both halves of its mma,
/// and one. The GEMM's K is the column count (8 more for a gated GEMM).
const ACT_SHAPES: [(usize, usize); 3] = [(64, 64), (16, 256), (1, 1024)];

/// The values the last three columns' bias holds, so that the activation
/// sees NaN, +Inf and -Inf there (x + bias, x finite).
const SPECIAL_BIAS: [f64; 3] = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY];

/// Runs `graph` with weights that make the GEMM pass `rows x cols`
/// [`testing::activation_inputs`] to the activation unchanged (see
/// [`activation_case`]), and compares element by element with the
/// activation's own bound (`testing::compare_activation`), tight enough to
/// tell tanh-GELU from erf-GELU. The expected values at NaN and ±Inf (in a
/// graph with a bias) are PyTorch's on CUDA: NaN stays NaN (relu included),
/// act(+Inf) = +Inf (sigmoid: 1), act(-Inf) = NaN for GELU and SiLU (−∞·0),
/// 0 for ReLU and sigmoid.
fn activation_alone<T: TestElement>(
    s: &Arc<CudaStream>,
    graph: &str,
    (rows, cols): (usize, usize),
    launch: impl FnOnce(&[Tensor<'_, T>], &mut [TensorMut<'_, T>]) -> fusion::Result<()>,
) {
    let graph = support::graph(graph, T::DTYPE);
    let (host, z, want) = activation_case(&graph, rows, cols);
    check_activation(s, graph, host, &z, &want, launch);
}

/// A weight of `graph` with `n` outputs of `k` inputs each, whose element
/// for output i and input j is `value(i, j)`, in the layout the graph
/// declares ([N, K] or [K, N]).
fn weight_of(
    graph: &fusion::ir::Graph,
    name: &str,
    (n, k): (usize, usize),
    value: impl Fn(usize, usize) -> f64,
) -> (String, HostTensor) {
    let id = graph
        .weights
        .iter()
        .copied()
        .find(|&t| graph.tensor(t).name == name)
        .unwrap_or_else(|| panic!("{}: no weight `{name}`", graph.name));
    let n_first = match graph.tensor(id).shape[0] {
        fusion::ir::Extent::Dynamic(d) => graph.dims[d.0].name == "N",
        fusion::ir::Extent::Static(_) => panic!("{}: `{name}` has a static size", graph.name),
    };
    let (shape, data) = if n_first {
        ([n, k], (0..n * k).map(|e| value(e / k, e % k)).collect())
    } else {
        ([k, n], (0..n * k).map(|e| value(e % n, e / n)).collect())
    };
    (name.to_string(), HostTensor::new(&shape, data).expect("a weight"))
}

/// The inputs and weights of an [`activation_alone`] case on `graph` with
/// `rows x cols` activation inputs, the activation's input and the
/// reference output. `act(x @ w + b)` (or `w^T`): w the identity, b zero
/// but for [`SPECIAL_BIAS`] in the last columns; `act(x @ w)`: w the
/// identity; a gated `act(x @ w_gate) * (x @ w_up)`: x's columns through
/// the identity into the gate, and 8 more columns (row lengths stay
/// multiples of 8), the first all ones, which w_up sends to every column:
/// `act(x) * 1`. Every GEMM output is exact in f32: one product of x and
/// 1, the rest zeros.
fn activation_case(
    graph: &fusion::ir::Graph,
    rows: usize,
    cols: usize,
) -> (Bindings, HostTensor, HostTensor) {
    let dtype = graph.tensors[0].dtype;
    let x = testing::activation_inputs(dtype, rows, cols);
    let has = |name: &str| graph.weights.iter().any(|&t| graph.tensor(t).name == name);
    let identity = |i: usize, j: usize| if i == j { 1.0 } else { 0.0 };
    let mut z = x.clone();
    let host: Bindings = if has("w_gate") {
        let k = cols + 8;
        let mut padded = HostTensor::zeros(&[rows, k]);
        for (to, from) in padded.data.chunks_mut(k).zip(x.data.chunks(cols)) {
            to[..cols].copy_from_slice(from);
            to[cols] = 1.0;
        }
        let ones = |_: usize, j: usize| if j == cols { 1.0 } else { 0.0 };
        [
            ("x".to_string(), padded),
            weight_of(graph, "w_gate", (cols, k), identity),
            weight_of(graph, "w_up", (cols, k), ones),
        ]
        .into_iter()
        .collect()
    } else {
        let mut host: Bindings = [
            ("x".to_string(), x),
            weight_of(graph, "w", (cols, cols), identity),
        ]
        .into_iter()
        .collect();
        if has("b") {
            let mut bias = HostTensor::zeros(&[cols]);
            bias.data[cols - SPECIAL_BIAS.len()..].copy_from_slice(&SPECIAL_BIAS);
            for row in z.data.chunks_mut(cols) {
                for (v, b) in row.iter_mut().zip(&bias.data) {
                    *v += b;
                }
            }
            host.insert("b".to_string(), bias);
        }
        host
    };
    let output = &graph.tensor(graph.outputs[0]).name;
    let want = reference::evaluate(graph, &host).expect("reference")[output].clone();
    (host, z, want)
}

/// On the CPU: the activation cases expect PyTorch's values at NaN and
/// ±Inf, and the reference rounded to the element type passes their bound
/// (so the GPU tests fail only on the kernel's own error).
#[test]
fn activation_cases_expect_pytorchs_special_values() {
    use fusion::ir::DType;
    for (name, at_plus_infinity, at_minus_infinity) in [
        ("gemm_bias_gelu", f64::INFINITY, f64::NAN),
        ("gemm_bias_gelu_erf", f64::INFINITY, f64::NAN),
        ("gemm_bias_silu", f64::INFINITY, f64::NAN),
        ("gemm_bias_relu", f64::INFINITY, 0.0),
        ("gemm_bias_sigmoid", 1.0, 0.0),
    ] {
        for dtype in [DType::F16, DType::BF16] {
            for (rows, cols) in ACT_SHAPES {
                let (_, z, want) = activation_case(&support::graph(name, dtype), rows, cols);
                for row in want.data.chunks(cols) {
                    let [nan, plus, minus] = row[cols - 3..] else {
                        unreachable!()
                    };
                    assert!(nan.is_nan(), "{name}: act(NaN) = {nan}");
                    assert_eq!(plus, at_plus_infinity, "{name}: act(+Inf)");
                    assert!(
                        minus == at_minus_infinity || (minus.is_nan() && at_minus_infinity.is_nan()),
                        "{name}: act(-Inf) = {minus}"
                    );
                }
                testing::compare_activation(&want.rounded_to(dtype), &want, &z, dtype, &[])
                    .unwrap_or_else(|e| panic!("{name} {dtype} {rows}x{cols}: {e}"));
            }
        }
    }
}

/// The GELU graphs whose activation cases must tell tanh-GELU from
/// erf-GELU: with a bias, without one, and gated.
const GELU_GRAPHS: [&str; 4] = [
    "gemm_bias_gelu",
    "gemm_bias_gelu_erf",
    "gemm_gelu",
    "gemm_gelu_glu",
];

/// On the CPU: at every activation case of a GELU graph (each shape,
/// through a bias, without one, gated), the graph's output computed with
/// the other GELU formula, rounded to the element type, fails the bound the
/// GPU test judges it by, while its own formula passes: a kernel with the
/// wrong formula fails there. The formulas differ by 3.9e-4 to 4.7e-4 at
/// 2.4 <= |x| <= 3.0, where every other input lies. At the negative ones
/// GELU's outputs are small (under 0.04), so are their steps, and the bound
/// is little more than the approximation's allowance, 6.1e-5·|x| <= 2e-4:
/// each case has hundreds of values outside it (about 400 of 1024 at one
/// row; at the positive ones the difference is under half an f16 step).
#[test]
fn gelu_activation_cases_tell_tanh_from_erf() {
    use fusion::ir::{Activation, DType, OpKind};
    for name in GELU_GRAPHS {
        for dtype in [DType::F16, DType::BF16] {
            let graph = support::graph(name, dtype);
            let mut other = graph.clone();
            for op in &mut other.ops {
                if let OpKind::Activation(a) = &mut op.kind {
                    *a = if *a == Activation::GELU {
                        Activation::GELU_ERF
                    } else {
                        assert!(*a == Activation::GELU_ERF, "{name}: another activation");
                        Activation::GELU
                    };
                }
            }
            let output = &graph.tensor(graph.outputs[0]).name;
            for (rows, cols) in ACT_SHAPES {
                let (host, z, want) = activation_case(&graph, rows, cols);
                let label = format!("{name} {dtype} {rows}x{cols}");
                testing::compare_activation(&want.rounded_to(dtype), &want, &z, dtype, &[])
                    .unwrap_or_else(|e| panic!("{label}: its own formula fails: {e}"));
                let wrong = reference::evaluate(&other, &host).expect("reference")[output].rounded_to(dtype);
                let verdict = testing::compare_activation(&wrong, &want, &z, dtype, &[]);
                assert!(verdict.is_err(), "{label}: the other GELU passes: {verdict:?}");
            }
        }
    }
}

/// A standalone activation kernel (`y = act(x)`) on
/// [`testing::activation_inputs`] with NaN, +Inf and -Inf in the last row's
/// first three columns.
fn standalone_activation<T: TestElement>(
    s: &Arc<CudaStream>,
    graph: &str,
    launch: impl FnOnce(&[Tensor<'_, T>], &mut [TensorMut<'_, T>]) -> fusion::Result<()>,
) {
    let graph = support::graph(graph, T::DTYPE);
    let mut x = testing::activation_inputs(T::DTYPE, ACT_ROWS, ACT_COLS);
    let last_row = (ACT_ROWS - 1) * ACT_COLS;
    x.data[last_row..last_row + SPECIAL_BIAS.len()].copy_from_slice(&SPECIAL_BIAS);
    let host: Bindings = [("x".to_string(), x.clone())].into_iter().collect();
    let want = reference::evaluate(&graph, &host).expect("reference")["y"].clone();
    check_activation(s, graph, host, &x, &want, launch);
}

/// Launches one activation case and compares it (see [`activation_alone`]).
fn check_activation<T: TestElement>(
    s: &Arc<CudaStream>,
    graph: fusion::ir::Graph,
    host: Bindings,
    z: &HostTensor,
    want: &HostTensor,
    launch: impl FnOnce(&[Tensor<'_, T>], &mut [TensorMut<'_, T>]) -> fusion::Result<()>,
) {
    // M and K from x, N from the output.
    let (x, y) = (&host["x"].shape, &want.shape);
    let dims = [("M", x[0]), ("N", y[1]), ("K", x[1])];
    let dims: Vec<_> = dims
        .into_iter()
        .filter(|(d, _)| graph.dim_by_name(d).is_some())
        .collect();
    let mut case = Case::<T>::from_bindings(s, graph, host, &dims);
    let result = case.launch(launch);
    if !support::variant_supports::<T>() {
        assert!(
            matches!(result, Err(fusion::Error::UnsupportedDType { .. })),
            "{result:?}"
        );
        return;
    }
    result.unwrap_or_else(|e| panic!("{}: {e}", case.label));
    s.synchronize().expect("kernels finished");
    let (_, buf, _, shape) = &case.writes[0];
    let got = T::decode(shape, &s.clone_dtoh(buf).expect("download")).expect("shape");
    let err = testing::compare_activation(&got, want, z, T::DTYPE, &[])
        .unwrap_or_else(|e| panic!("{}: {e}", case.label));
    eprintln!("ok  {:<48} rel_err {err:.2e}", case.label);
}

/// One test per activation case, f16 then bf16: `gemm WRAPPER` runs
/// [`activation_alone`] at every [`ACT_SHAPES`] through a wrapper of
/// `(x, w, b)` or of a gated `(x, w_gate, w_up)`, `gemm_no_bias WRAPPER`
/// through one of `(x, w)`, `gemm |s, r, w| CALL` through a call of its
/// own (a struct's); `elementwise WRAPPER` runs [`standalone_activation`]
/// through a standalone kernel.
macro_rules! activation_test {
    ($test:ident, $graph:literal, gemm $wrapper:ident) => {
        activation_test!(
            $test,
            $graph,
            gemm | s,
            r,
            w | { kernels::$wrapper(s, &r[0], &r[1], &r[2], &mut w[0]) }
        );
    };
    ($test:ident, $graph:literal, gemm_no_bias $wrapper:ident) => {
        activation_test!(
            $test,
            $graph,
            gemm | s,
            r,
            w | kernels::$wrapper(s, &r[0], &r[1], &mut w[0])
        );
    };
    ($test:ident, $graph:literal, gemm |$s:ident, $r:ident, $w:ident| $call:expr) => {
        #[test]
        #[ignore = "needs a CUDA GPU"]
        fn $test() {
            let stream = stream();
            let $s = &stream;
            for shape in ACT_SHAPES {
                activation_alone::<f16>($s, $graph, shape, |$r, $w| $call);
                activation_alone::<bf16>($s, $graph, shape, |$r, $w| $call);
            }
        }
    };
    ($test:ident, $graph:literal, elementwise $wrapper:ident) => {
        #[test]
        #[ignore = "needs a CUDA GPU"]
        fn $test() {
            let s = &stream();
            standalone_activation::<f16>(s, $graph, |r, w| kernels::$wrapper(s, &r[0], &mut w[0]));
            standalone_activation::<bf16>(s, $graph, |r, w| kernels::$wrapper(s, &r[0], &mut w[0]));
        }
    };
}

activation_test!(gelu_alone_at_its_hardest_inputs, "gemm_bias_gelu", gemm gemm_bias_gelu);
activation_test!(gelu_erf_alone_at_its_hardest_inputs, "gemm_bias_gelu_erf", gemm gemm_bias_gelu_erf);
activation_test!(silu_step_alone_at_its_hardest_inputs, "gemm_bias_silu", gemm gemm_bias_silu);
activation_test!(relu_alone_at_its_hardest_inputs, "gemm_bias_relu", gemm gemm_bias_relu);
activation_test!(sigmoid_alone_at_its_hardest_inputs, "gemm_bias_sigmoid", gemm gemm_bias_sigmoid);
// GELU without a bias (its epilogue has no bias step) and gated (the
// gate's columns interleaved with up's), per call and bound.
activation_test!(gelu_without_bias_at_its_hardest_inputs, "gemm_gelu", gemm_no_bias gemm_gelu);
activation_test!(gated_gelu_at_its_hardest_inputs, "gemm_gelu_glu", gemm gemm_gelu_glu);
activation_test!(
    gated_gelu_bound_at_its_hardest_inputs,
    "gemm_gelu_glu",
    gemm | s,
    r,
    w | { support::gemm_gelu_glu_bound(s, &r[0], &r[1], &r[2], &mut w[0]) }
);
activation_test!(standalone_silu_at_its_hardest_inputs, "silu", elementwise silu);
activation_test!(standalone_sigmoid_at_its_hardest_inputs, "sigmoid", elementwise sigmoid);
activation_test!(standalone_gelu_quick_at_its_hardest_inputs, "gelu_quick", elementwise gelu_quick);

/// NaN and the infinities through the standalone sigmoid and quick GELU:
/// what PyTorch gives (sigmoid(+inf) = 1, sigmoid(-inf) = 0,
/// gelu_quick(+inf) = +inf, gelu_quick(-inf) = NaN, NaN stays NaN), and
/// finite values within f16 rounding of the CPU reference's formula.
#[test]
#[ignore = "needs a CUDA GPU"]
fn sigmoid_and_gelu_quick_keep_nan_and_infinities() {
    use fusion::core::ir::Activation;
    use fusion::{Tensor, TensorMut};
    let s = stream();
    let x = [
        f64::NAN,
        f64::INFINITY,
        f64::NEG_INFINITY,
        0.0,
        1.0,
        -1.0,
        12.0,
        -12.0,
    ];
    let input = s.clone_htod(&x.map(f16::from_f64).to_vec()).expect("upload");
    for name in ["sigmoid", "gelu_quick"] {
        let mut output = s.clone_htod(&vec![f16::ZERO; 8]).expect("upload");
        let x_view = Tensor::new(&input, [1, 8]).expect("view");
        let mut y_view = TensorMut::new(&mut output, [1, 8]).expect("view");
        let launched = match name {
            "sigmoid" => kernels::sigmoid(&s, &x_view, &mut y_view),
            _ => kernels::gelu_quick(&s, &x_view, &mut y_view),
        };
        launched.unwrap_or_else(|e| panic!("{name}: {e}"));
        let got = s.clone_dtoh(&output).expect("download");
        let formula = Activation::named(name).expect("in the op table").formula();
        for (&x, got) in x.iter().zip(got) {
            let (got, want) = (got.to_f64(), formula(x));
            let agrees = if want.is_nan() || want.is_infinite() {
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan())
            } else {
                (got - want).abs() <= 2e-3 * want.abs().max(1.0)
            };
            assert!(agrees, "{name}({x}): got {got}, want {want}");
        }
        eprintln!("ok  {name}: NaN, +-inf and six finite values");
    }
}
