//! GPU correctness of the built-in kernel library: every shipped graph
//! through its generated wrapper, f16 and bf16, at ragged and benchmark
//! shapes, against the CPU reference with fresh random inputs and outputs
//! poisoned with NaN before each launch; and the run-time checks that refuse
//! bad arguments before anything is launched.
//!
//! Run on a machine with a GPU: `cargo test --release --test gpu -- --ignored`
//! (see tests/support for the environment variables).

mod support;

use fusion::half::{bf16, f16};
use fusion::kernels;
use support::{check, gemm_shapes, stream, token_counts};

/// One test per single-GEMM pattern graph, over every (M, N, K) and both
/// element types; `$call` launches the wrapper with `r` (inputs then
/// weights) and `w` (outputs).
macro_rules! pattern_test {
    ($test:ident, $graph:literal, |$s:ident, $r:ident, $w:ident| $call:expr) => {
        #[test]
        #[ignore = "needs a CUDA GPU"]
        fn $test() {
            let stream = stream();
            let $s = &stream;
            for (m, n, k) in gemm_shapes() {
                let dims = [("M", m), ("N", n), ("K", k)];
                check::<f16>($s, $graph, &dims, |$r, $w| $call);
                check::<bf16>($s, $graph, &dims, |$r, $w| $call);
            }
        }
    };
}

pattern_test!(gemm, "gemm", |s, r, w| kernels::gemm(s, &r[0], &r[1], &mut w[0]));
pattern_test!(gemm_bias_gelu, "gemm_bias_gelu", |s, r, w| {
    kernels::gemm_bias_gelu(s, &r[0], &r[1], &r[2], &mut w[0])
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
pattern_test!(layernorm_gemm, "layernorm_gemm", |s, r, w| {
    kernels::layernorm_gemm(s, &r[0], &r[1], &r[2], &r[3], &mut w[0])
});
pattern_test!(rmsnorm_gemm, "rmsnorm_gemm", |s, r, w| kernels::rmsnorm_gemm(
    s, &r[0], &r[1], &r[2], &mut w[0]
));

#[test]
#[ignore = "needs a CUDA GPU"]
fn swiglu_ffn() {
    let s = stream();
    // One struct for every size: its workspace grows and is reused.
    let mut ffn16 = kernels::SwigluFfn::new();
    let mut ffn_bf = kernels::SwigluFfn::new();
    for m in token_counts(8192) {
        check::<f16>(&s, "swiglu_ffn", &[("M", m)], |r, w| {
            ffn16.run(&s, &r[0], &r[1], &r[2], &r[3], &r[4], &mut w[0])
        });
        check::<bf16>(&s, "swiglu_ffn", &[("M", m)], |r, w| {
            ffn_bf.run(&s, &r[0], &r[1], &r[2], &r[3], &r[4], &mut w[0])
        });
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn llama_ffn() {
    let s = stream();
    let mut ffn = kernels::LlamaFfn::new();
    let mut ffn_bf = kernels::LlamaFfn::new();
    for m in token_counts(8192) {
        check::<f16>(&s, "llama_ffn", &[("M", m)], |r, w| {
            ffn.run(&s, &r[0], &r[1], &r[2], &r[3], &mut w[0])
        });
        check::<bf16>(&s, "llama_ffn", &[("M", m)], |r, w| {
            ffn_bf.run(&s, &r[0], &r[1], &r[2], &r[3], &mut w[0])
        });
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gpt2_mlp() {
    let s = stream();
    let mut mlp = kernels::Gpt2Mlp::new();
    let mut mlp_bf = kernels::Gpt2Mlp::new();
    for m in token_counts(4096) {
        check::<f16>(&s, "gpt2_mlp", &[("M", m)], |r, w| {
            mlp.run(&s, &r[0], &r[1], &r[2], &r[3], &r[4], &r[5], &r[6], &mut w[0])
        });
        check::<bf16>(&s, "gpt2_mlp", &[("M", m)], |r, w| {
            mlp_bf.run(&s, &r[0], &r[1], &r[2], &r[3], &r[4], &r[5], &r[6], &mut w[0])
        });
    }
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
standalone_test!(layernorm, "layernorm", "K", |s, r, w| kernels::layernorm(
    s, &r[0], &r[1], &r[2], &mut w[0]
));
standalone_test!(rmsnorm, "rmsnorm", "K", |s, r, w| kernels::rmsnorm(
    s, &r[0], &r[1], &mut w[0]
));

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
