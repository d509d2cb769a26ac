//! The SwiGLU feed-forward block of graphs/swiglu_ffn.toml (Llama-3-8B
//! sizes, bias on the down projection, residual add) called on candle
//! tensors: weights and input made by candle on GPU 0, the fused block run
//! on them in place through `fusion::candle`, and the same block computed
//! with candle's own ops (cuBLAS matmuls, then silu, mul, bias and residual
//! kernels) to compare with and to time against.
//!
//! `cargo run --release -p fusion-cli --features candle --example candle_ffn [-- TOKENS]`
//! (default 512 tokens, as a batch of 4 sequences). Exits non-zero when the
//! two disagree by more than f16's precision allows.

use candle_core::{DType, Device, Tensor};
use fusion::half::f16;
use fusion::kernels::{SwigluFfn, SwigluFfnWeights};
use fusion_cli::bench::timing::{TimingPlan, time_interleaved};
use std::process::ExitCode;

const HIDDEN: usize = 4096;
const INTERMEDIATE: usize = 14336;
const SEQUENCES: usize = 4;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: the fused block disagrees with candle's unfused ops (see above)");
            ExitCode::FAILURE
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let tokens = match std::env::args().nth(1) {
        Some(t) => t
            .parse::<usize>()
            .ok()
            .filter(|&t| t > 0 && t % SEQUENCES == 0)
            .ok_or_else(|| format!("TOKENS must be a positive multiple of {SEQUENCES}, got `{t}`"))?,
        None => 512,
    };
    let device = Device::new_cuda(0)?;
    let stream = device.as_cuda_device()?.cuda_stream();

    // Weights as a candle model holds them ([out, in], as nn.Linear), and
    // activations shaped [batch, seq, hidden].
    let weight = |rows: usize, cols: usize| -> candle_core::Result<Tensor> {
        Tensor::randn(0f32, (cols as f32).powf(-0.5), (rows, cols), &device)?.to_dtype(DType::F16)
    };
    let w_gate = weight(INTERMEDIATE, HIDDEN)?;
    let w_up = weight(INTERMEDIATE, HIDDEN)?;
    let w_down = weight(HIDDEN, INTERMEDIATE)?;
    let b_down = Tensor::randn(0f32, 0.1, HIDDEN, &device)?.to_dtype(DType::F16)?;
    let x =
        Tensor::randn(0f32, 1.0, (SEQUENCES, tokens / SEQUENCES, HIDDEN), &device)?.to_dtype(DType::F16)?;

    // The struct binds candle's weights where they are: `Views` lends them
    // for as long as the struct lives.
    let weights = fusion::candle::Views::new(&[&w_gate, &w_up, &w_down, &b_down])?;
    let mut ffn = SwigluFfn::<f16>::new(
        &stream,
        SwigluFfnWeights {
            w_gate: weights.tensor(0)?,
            w_up: weights.tensor(1)?,
            w_down: weights.tensor(2)?,
            b_down: weights.tensor(3)?,
        },
    )?;
    let mut fused = |x: &Tensor| -> fusion::Result<Tensor> {
        let [y] = fusion::candle::call([x], [x.dims()], |stream, [x], [y]| ffn.run(stream, x, y))?;
        Ok(y)
    };
    let unfused = |x: &Tensor| -> candle_core::Result<Tensor> {
        let rows = x.flatten_to(1)?;
        let gate = rows.matmul(&w_gate.t()?)?.silu()?;
        let up = rows.matmul(&w_up.t()?)?;
        let y = ((gate * up)?.matmul(&w_down.t()?)?.broadcast_add(&b_down)? + rows)?;
        y.reshape(x.dims())
    };

    let (y, y_candle) = (fused(&x)?, unfused(&x)?);
    println!(
        "swiglu_ffn on candle tensors: x {:?} {:?}, y {:?}",
        x.dims(),
        x.dtype(),
        y.dims()
    );
    let error = relative_l2(&y, &y_candle)?;
    // Both round the [tokens, 14336] intermediate to f16 and accumulate in
    // f32, in different orders: their difference is a few of f16's unit
    // roundoffs (2^-11) of the output's scale (fusion::testing's bounds).
    let limit = 2.0 * fusion::testing::relative_l2_limit(fusion::ir::DType::F16);
    let agreed = error <= limit;
    println!(
        "  fused vs candle's ops: relative L2 difference {error:.2e} (limit {limit:.1e}) {}",
        if agreed { "ok" } else { "MISMATCH" }
    );

    let plan = TimingPlan { warmup: 5, runs: 30 };
    let mut fused_call = |_| fused(&x).map(drop);
    let mut candle_call = |_| {
        unfused(&x).expect("candle's ops ran on these tensors above");
        Ok(())
    };
    let [ours, theirs] = time_interleaved(&stream, plan, || Ok(()), [&mut fused_call, &mut candle_call])?;
    println!(
        "  per call (median of {}, CUDA events, the same tensors each call): fused {:.1} us, candle {:.1} us ({:.2}x)",
        plan.runs,
        ours.median_us,
        theirs.median_us,
        theirs.median_us / ours.median_us
    );
    Ok(agreed)
}

/// ‖a − b‖₂ / ‖b‖₂, computed in f32 on the device.
fn relative_l2(a: &Tensor, b: &Tensor) -> candle_core::Result<f64> {
    let (a, b) = (a.to_dtype(DType::F32)?, b.to_dtype(DType::F32)?);
    let diff = (&a - &b)?.sqr()?.sum_all()?.to_scalar::<f32>()?;
    let norm = b.sqr()?.sum_all()?.to_scalar::<f32>()?;
    Ok(f64::from((diff / norm).sqrt()))
}
