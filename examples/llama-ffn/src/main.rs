//! Runs the example's blocks on GPU 0, checks them against the CPU
//! reference and prints the time per call. Without a GPU it says so and
//! exits successfully (building this crate is what the CPU test suite
//! checks), unless `FUSION_REQUIRE_GPU=1` is set, as the GPU suite does:
//! then a missing GPU is an error.

use fusion::core::reference::{self, Bindings, HostTensor};
use fusion::cudarc::driver::{CudaSlice, CudaStream};
use fusion::half::f16;
use fusion::{Shape, Tensor, TensorMut};
use llama_ffn::model::{Gpt2Mlp, Gpt2MlpWeights, SwigluFfn, SwigluFfnWeights};
use rand::SeedableRng;
use std::sync::Arc;
use std::time::Instant;

/// Token count of each call; the reference checks the rows
/// `fusion::testing::rows_to_check` picks (every 64-row band).
const TOKENS: usize = 512;
const TIMED_CALLS: u32 = 20;

type Error = Box<dyn std::error::Error>;

fn main() -> Result<(), Error> {
    let stream =
        match fusion::testing::open_gpu(0).and_then(|ctx| ctx.new_stream().map_err(|e| e.to_string())) {
            Ok(stream) => stream,
            Err(why) if std::env::var_os("FUSION_REQUIRE_GPU").is_some_and(|v| v == "1") => {
                return Err(format!("{why} (FUSION_REQUIRE_GPU=1: a GPU is required)").into());
            }
            Err(why) => {
                println!("{why}: nothing to run; the kernels were compiled at build time");
                return Ok(());
            }
        };
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);

    let graph = SwigluFfn::graph();
    let host = reference::random_bindings(&graph, &[("M", TOKENS)], &mut rng)?;
    let w = Device::upload(&stream, &host)?;
    let mut ffn = SwigluFfn::new(
        &stream,
        SwigluFfnWeights {
            w_gate: w.tensor("w_gate")?,
            w_up: w.tensor("w_up")?,
            w_down: w.tensor("w_down")?,
        },
    )?;
    check_and_time("SwigluFfn", &stream, &graph, &host, &w, |x, y| {
        ffn.run(&stream, x, y)
    })?;

    let graph = Gpt2Mlp::graph();
    let host = reference::random_bindings(&graph, &[("M", TOKENS)], &mut rng)?;
    let w = Device::upload(&stream, &host)?;
    let mut mlp = Gpt2Mlp::new(
        &stream,
        Gpt2MlpWeights {
            ln_g: w.tensor("ln_g")?,
            ln_b: w.tensor("ln_b")?,
            w_fc: w.tensor("w_fc")?,
            b_fc: w.tensor("b_fc")?,
            w_proj: w.tensor("w_proj")?,
            b_proj: w.tensor("b_proj")?,
        },
    )?;
    check_and_time("Gpt2Mlp", &stream, &graph, &host, &w, |x, y| {
        mlp.run(&stream, x, y)
    })?;
    Ok(())
}

/// Every input and weight of a graph, on the device.
struct Device {
    buffers: Vec<(String, Shape, CudaSlice<f16>)>,
}

impl Device {
    fn upload(stream: &Arc<CudaStream>, host: &Bindings) -> Result<Device, Error> {
        let mut buffers = Vec::new();
        for (name, tensor) in host {
            let shape = match tensor.shape[..] {
                [n] => Shape::Vector(n),
                [rows, cols] => Shape::Matrix(rows, cols),
                _ => return Err(format!("`{name}` is neither a vector nor a matrix").into()),
            };
            buffers.push((name.clone(), shape, stream.clone_htod(&tensor.to_f16())?));
        }
        Ok(Device { buffers })
    }

    fn tensor(&self, name: &str) -> Result<Tensor<'_, f16>, Error> {
        let (_, shape, slice) = self
            .buffers
            .iter()
            .find(|(n, _, _)| n == name)
            .ok_or_else(|| format!("no tensor `{name}`"))?;
        Ok(Tensor::new(slice, *shape)?)
    }
}

/// Runs `call` once on an output poisoned with NaN, compares it with the
/// reference (see `fusion::testing::compare`), then times it.
fn check_and_time(
    label: &str,
    stream: &Arc<CudaStream>,
    graph: &fusion::core::ir::Graph,
    host: &Bindings,
    device: &Device,
    mut call: impl FnMut(&Tensor<'_, f16>, &mut TensorMut<'_, f16>) -> fusion::Result<()>,
) -> Result<(), Error> {
    let x = device.tensor("x")?;
    let cols = x.shape().cols();
    let mut y_buffer = stream.clone_htod(&vec![f16::NAN; TOKENS * cols])?;
    call(&x, &mut TensorMut::new(&mut y_buffer, [TOKENS, cols])?)?;
    stream.synchronize()?;
    let rows = fusion::testing::rows_to_check(TOKENS, &mut rand::rngs::StdRng::seed_from_u64(11));
    let got = HostTensor::from_f16(&[TOKENS, cols], &stream.clone_dtoh(&y_buffer)?)?.select_rows(&rows)?;
    let want = &reference::evaluate_rows(graph, host, &rows)?["y"];
    let error = fusion::testing::compare(&got, want, fusion::ir::DType::F16, &rows)
        .map_err(|mismatch| format!("{label} does not match the CPU reference: {mismatch}"))?;

    let mut y = TensorMut::new(&mut y_buffer, [TOKENS, cols])?;
    let start = Instant::now();
    for _ in 0..TIMED_CALLS {
        call(&x, &mut y)?;
    }
    stream.synchronize()?;
    let per_call = start.elapsed().as_secs_f64() * 1e6 / f64::from(TIMED_CALLS);
    println!(
        "{label}: M={TOKENS}: relative error {error:.2e} over {} rows (ok), {per_call:.1} us per call",
        rows.len()
    );
    Ok(())
}
