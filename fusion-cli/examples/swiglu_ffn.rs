//! The SwiGLU feed-forward block of graphs/swiglu_ffn.toml on GPU 0, in f16
//! and bf16: random inputs, outputs poisoned with NaN, one call of the fused
//! kernels checked against the CPU reference, then the time per call.
//!
//! `cargo run --release -p fusion-cli --example swiglu_ffn [-- M]` (M tokens, default 512).
//! Exits non-zero when a result is outside the bounds of
//! `fusion::testing::compare`.

use fusion::core::reference::{self, Bindings};
use fusion::cudarc::driver::{CudaSlice, CudaStream};
use fusion::half::{bf16, f16};
use fusion::kernels::{SwigluFfn, SwigluFfnWeights};
use fusion::testing::{self, HostElement};
use fusion::{Tensor, TensorMut};
use fusion_cli::bench::timing::{TimingPlan, time_calls};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::process::ExitCode;
use std::sync::Arc;

const DEFAULT_TOKENS: usize = 512;
const TIMED_CALLS: usize = 20;

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: the fused kernels disagree with the CPU reference (see above)");
            ExitCode::FAILURE
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Whether every element type agreed with the reference.
fn run() -> Result<bool, String> {
    let m = tokens_from_args()?;
    let ctx = testing::open_gpu(0)?;
    let stream = ctx
        .new_stream()
        .map_err(|e| format!("could not create a stream on GPU 0: {e}"))?;
    let name = ctx.name().unwrap_or_else(|_| "GPU 0".into());
    println!("swiglu_ffn on {name}, M = {m} tokens");
    let f16_ok = check_and_time::<f16>(&stream, m)?;
    let bf16_ok = check_and_time::<bf16>(&stream, m)?;
    Ok(f16_ok && bf16_ok)
}

fn tokens_from_args() -> Result<usize, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok(DEFAULT_TOKENS),
        [m] => m
            .parse()
            .ok()
            .filter(|&m| m > 0)
            .ok_or_else(|| format!("M must be a positive token count, got `{m}` (usage: swiglu_ffn [M])")),
        _ => Err("expected at most one argument, the token count M (usage: swiglu_ffn [M])".into()),
    }
}

/// Runs the block once in element type `T`, compares it with the reference,
/// then times it. Returns whether it agreed.
fn check_and_time<T: HostElement>(stream: &Arc<CudaStream>, m: usize) -> Result<bool, String> {
    let dtype = T::DTYPE;
    let path = fusion::testing::graphs_dir().join("swiglu_ffn.toml");
    let graph = testing::load_graph_as(&path, dtype)?;
    let seed = 0x5EED ^ m as u64;
    let host = reference::random_bindings(&graph, &[("M", m)], &mut StdRng::seed_from_u64(seed))
        .map_err(|e| e.to_string())?;
    let upload = |name: &str| -> Result<CudaSlice<T>, String> {
        stream
            .clone_htod(&T::encode(&host[name]))
            .map_err(|e| format!("could not upload `{name}`: {e}"))
    };
    let (x, w_gate, w_up, w_down, b_down) = (
        upload("x")?,
        upload("w_gate")?,
        upload("w_up")?,
        upload("w_down")?,
        upload("b_down")?,
    );
    let d = host["x"].shape[1];
    let mut y = stream
        .clone_htod(&vec![T::NAN; m * d])
        .map_err(|e| format!("could not allocate `y`: {e}"))?;

    // The weights are bound once; each call passes the input and output.
    let weights = SwigluFfnWeights {
        w_gate: view(&w_gate, &host, "w_gate").map_err(|e| format!("swiglu_ffn {dtype}: {e}"))?,
        w_up: view(&w_up, &host, "w_up").map_err(|e| format!("swiglu_ffn {dtype}: {e}"))?,
        w_down: view(&w_down, &host, "w_down").map_err(|e| format!("swiglu_ffn {dtype}: {e}"))?,
        b_down: view(&b_down, &host, "b_down").map_err(|e| format!("swiglu_ffn {dtype}: {e}"))?,
    };
    let mut ffn = SwigluFfn::new(stream, weights).map_err(|e| format!("swiglu_ffn {dtype}: {e}"))?;
    let mut call = |y: &mut CudaSlice<T>| -> fusion::Result<()> {
        ffn.run(stream, &view(&x, &host, "x")?, &mut TensorMut::new(y, [m, d])?)
    };
    call(&mut y).map_err(|e| format!("swiglu_ffn {dtype}: {e}"))?;
    stream
        .synchronize()
        .map_err(|e| format!("swiglu_ffn {dtype}: {e}"))?;

    let rows = testing::rows_to_check(m, &mut StdRng::seed_from_u64(seed + 1));
    let (error, agreed) = match compare(stream, &graph, &host, &y, [m, d], &rows)? {
        Ok(error) => (error, true),
        Err(mismatch) => {
            eprintln!("swiglu_ffn {dtype}: {mismatch}");
            (f64::NAN, false)
        }
    };

    let plan = TimingPlan {
        warmup: 5,
        runs: TIMED_CALLS,
    };
    let timing = time_calls(stream, plan, || Ok(()), |_| call(&mut y))
        .map_err(|e| format!("timing swiglu_ffn {dtype}: {e}"))?;
    println!(
        "  {dtype:<4}  relative error {error:.2e} over {} of {m} rows ({})  {:>9.1} us per call (median of {TIMED_CALLS})",
        rows.len(),
        if agreed { "ok" } else { "MISMATCH" },
        timing.median_us,
    );
    Ok(agreed)
}

/// A read view of `buf` with the shape of host tensor `name`.
fn view<'a, T: HostElement>(
    buf: &'a CudaSlice<T>,
    host: &Bindings,
    name: &str,
) -> fusion::Result<Tensor<'a, T>> {
    let shape = testing::shape_of(&host[name]).expect("the graph's tensors have rank 1 or 2");
    Tensor::new(buf, shape)
}

/// Output `y` compared with the reference over `rows` (see
/// `fusion::testing::compare`): the relative L2 error, or where it is off.
fn compare<T: HostElement>(
    stream: &Arc<CudaStream>,
    graph: &fusion::ir::Graph,
    host: &Bindings,
    y: &CudaSlice<T>,
    shape: [usize; 2],
    rows: &[usize],
) -> Result<Result<f64, testing::Mismatch>, String> {
    let values = stream
        .clone_dtoh(y)
        .map_err(|e| format!("could not download `y`: {e}"))?;
    let got = T::decode(&shape, &values)
        .and_then(|t| t.select_rows(rows))
        .map_err(|e| e.to_string())?;
    let want = reference::evaluate_rows(graph, host, rows).map_err(|e| e.to_string())?;
    Ok(testing::compare(&got, &want["y"], T::DTYPE, rows))
}
