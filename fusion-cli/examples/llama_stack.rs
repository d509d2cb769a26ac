//! A whole forward of a layer stack: N Llama-3-8B FFN sub-layers
//! (graphs/ffn_sublayer.toml: RMSNorm, SwiGLU gate and up, down projection,
//! residual; D = 4096, F = 14336, fixed by the graph) bound from one
//! safetensors file under Hugging Face names (`model.layers.{i}.mlp.…`),
//! sharing one workspace, run on GPU 0 eagerly (N calls) and as one
//! captured CUDA graph. It prints the device memory the weights and the
//! workspace take, and the time per token of both ways against N times one
//! layer's own time.
//!
//! ```text
//! cargo run --release -p fusion-cli --example llama_stack -- [LAYERS] [M] [--bf16] [--weights FILE]
//! ```
//!
//! LAYERS defaults to 32 and M (tokens) to 1. Without `--weights` every
//! layer's weights are drawn at random (f16, or bf16 with `--bf16`) and
//! written to one temporary safetensors file, which is bound and deleted;
//! with it, layers 0..LAYERS are read from FILE in its element type.
//!
//! The check: each layer's output is compared with the CPU reference of
//! that layer computed on the layer's own GPU input (every layer's input
//! and output stay on the device), so a layer is judged by its own error,
//! not by what earlier layers' roundings made of the input. The reference
//! costs 3·D·F multiply-adds per row, so the first, middle and last layer
//! are checked (every layer when there are at most 4), on up to 8 rows
//! (all of them up to M = 8, else the first, the last and 6 at random;
//! the layers are row-local, so a chosen row is checked exactly). Eager
//! and captured outputs are checked alike, and compared bit for bit where
//! a direct call runs the same schedule as a captured one
//! (`FUSION_STREAM_K=0`; otherwise a direct call may split K, which sums
//! in another order). Exits non-zero on a mismatch. Without a GPU it says
//! so and exits 0, unless `FUSION_REQUIRE_GPU=1` (as the GPU suite sets).

use fusion::core::ir::Graph;
use fusion::core::reference::{self, Bindings};
use fusion::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use fusion::cudarc::driver::{CudaSlice, CudaStream};
use fusion::half::{bf16, f16};
use fusion::kernels::FfnSublayer;
use fusion::testing::{self, HostElement};
use fusion::{TensorFile, TensorNames};
use fusion_cli::bench::timing::{TimingPlan, time_calls};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

const DEFAULT_LAYERS: usize = 32;
const DEFAULT_TOKENS: usize = 1;
/// Rows of a layer's output compared with the reference.
const CHECKED_ROWS: usize = 8;
const USAGE: &str = "usage: llama_stack [LAYERS] [M] [--bf16] [--weights FILE]";

struct Args {
    layers: usize,
    tokens: usize,
    bf16: bool,
    weights: Option<PathBuf>,
}

fn main() -> ExitCode {
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => {
            eprintln!("error: the stack disagrees with the CPU reference (see above)");
            ExitCode::FAILURE
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Whether the stack agreed with the reference.
fn run() -> Result<bool, String> {
    let args = parse_args()?;
    let ctx = match testing::open_gpu(0) {
        Ok(ctx) => ctx,
        Err(why) if std::env::var_os("FUSION_REQUIRE_GPU").is_some_and(|v| v == "1") => {
            return Err(format!("{why} (FUSION_REQUIRE_GPU=1: a GPU is required)"));
        }
        Err(why) => {
            println!("{why}: nothing to run; the kernels were compiled at build time");
            return Ok(true);
        }
    };
    // A capture may not wait on events recorded before it began, which
    // cudarc's per-buffer event tracking would make it do; every buffer
    // here lives on one stream, which orders them without it.
    unsafe { ctx.disable_event_tracking() };
    let stream = ctx
        .new_stream()
        .map_err(|e| format!("could not create a stream on GPU 0: {e}"))?;
    let name = ctx.name().unwrap_or_else(|_| "GPU 0".into());

    let (file, temporary) = match &args.weights {
        Some(path) => (TensorFile::open(path).map_err(|e| e.to_string())?, None),
        None => {
            let path =
                std::env::temp_dir().join(format!("fusion-llama-stack-{}.safetensors", std::process::id()));
            let started = std::time::Instant::now();
            let bytes = if args.bf16 {
                random_file::<bf16>(args.layers)?
            } else {
                random_file::<f16>(args.layers)?
            };
            std::fs::write(&path, bytes).map_err(|e| format!("could not write {}: {e}", path.display()))?;
            let file = TensorFile::open(&path).map_err(|e| e.to_string());
            println!(
                "random weights of {} layers written to {} ({:.1} s)",
                args.layers,
                path.display(),
                started.elapsed().as_secs_f64()
            );
            (file?, Some(path))
        }
    };
    let dtype = file
        .get(&TensorNames::hugging_face(0).in_file("w_gate"))
        .and_then(|t| t.element_type());
    println!(
        "ffn_sublayer x {} layers on {name}, M = {} tokens, weights in {} from {}",
        args.layers,
        args.tokens,
        dtype.map_or_else(|| "?".to_owned(), |d| d.to_string()),
        file.label()
    );
    let result = match dtype {
        Some(fusion::core::ir::DType::BF16) => forward::<bf16>(&stream, &args, file),
        _ => forward::<f16>(&stream, &args, file),
    };
    if let Some(path) = temporary {
        let _ = std::fs::remove_file(path);
    }
    result
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        layers: DEFAULT_LAYERS,
        tokens: DEFAULT_TOKENS,
        bf16: false,
        weights: None,
    };
    let mut positional = 0;
    let mut given = std::env::args().skip(1);
    while let Some(arg) = given.next() {
        match arg.as_str() {
            "--bf16" => args.bf16 = true,
            "--weights" => args.weights = Some(given.next().ok_or(USAGE)?.into()),
            count => {
                let value = count
                    .parse()
                    .ok()
                    .filter(|&n: &usize| n > 0)
                    .ok_or_else(|| format!("expected a positive count, got `{count}` ({USAGE})"))?;
                match positional {
                    0 => args.layers = value,
                    1 => args.tokens = value,
                    _ => return Err(format!("too many arguments ({USAGE})")),
                }
                positional += 1;
            }
        }
    }
    Ok(args)
}

fn graph<T: HostElement>() -> Result<Graph, String> {
    testing::load_graph_as(&testing::graphs_dir().join("ffn_sublayer.toml"), T::DTYPE)
}

/// Random weights for `layers` layers in one safetensors file, under the
/// names of a Hugging Face checkpoint.
fn random_file<T: HostElement>(layers: usize) -> Result<Vec<u8>, String> {
    testing::random_layers_file::<T>(
        &graph::<T>()?,
        layers,
        &[("M", 1)],
        TensorNames::hugging_face,
        0x5EED,
    )
}

/// Device memory in use now, all work on `s` done.
fn device_bytes(s: &Arc<CudaStream>) -> Result<usize, String> {
    s.synchronize().map_err(|e| e.to_string())?;
    let (free, total) = s.context().mem_get_info().map_err(|e| e.to_string())?;
    Ok(total - free)
}

/// Binds, checks and times the stack in element type `T`. Returns whether
/// it agreed with the reference.
fn forward<T: HostElement>(s: &Arc<CudaStream>, args: &Args, file: TensorFile) -> Result<bool, String> {
    let (n, m) = (args.layers, args.tokens);
    let graph = graph::<T>()?;
    let checked: Vec<usize> = if n <= 4 {
        (0..n).collect()
    } else {
        vec![0, n / 2, n - 1]
    };
    // The checked layers' weights, from the file, for the reference.
    let host_weights: Vec<Bindings> = checked
        .iter()
        .map(|&i| testing::weights_from_file::<T>(&graph, &file, &TensorNames::hugging_face(i)))
        .collect::<Result<_, _>>()?;

    let before = device_bytes(s)?;
    let workspace = fusion::SharedWorkspace::new();
    let mut layers = (0..n)
        .map(|i| {
            FfnSublayer::<T>::from_safetensors(s, &file, &TensorNames::hugging_face(i))
                .map(|layer| layer.with_workspace(workspace.clone()))
                .map_err(fail(format!("layer {i} binds")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    drop(file);
    let bound = device_bytes(s)?;
    let weight_bytes: usize = layers.iter().map(|l| l.weights().bytes()).sum();

    // Every layer's input and output on the device: act[i] is layer i's
    // input, act[i + 1] its output.
    let x = reference::random_bindings(&graph, &[("M", m)], &mut StdRng::seed_from_u64(0x5EED ^ m as u64))
        .map_err(|e| e.to_string())?
        .remove("x")
        .expect("the graph's input");
    let d = x.shape[1];
    let mut act: Vec<CudaSlice<T>> = std::iter::once(s.clone_htod(&T::encode(&x)))
        .chain((0..n).map(|_| s.clone_htod(&vec![T::NAN; m * d])))
        .collect::<Result<_, _>>()
        .map_err(|e| format!("could not allocate the activations: {e}"))?;
    let poison = |act: &mut [CudaSlice<T>]| -> Result<(), String> {
        for a in &mut act[1..] {
            s.memcpy_htod(&vec![T::NAN; m * d], a)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    };
    let allocated = device_bytes(s)?;
    // The shared workspace, grown to what one call needs before any runs.
    layers[0]
        .reserve_workspace(s, m)
        .map_err(fail("reserve_workspace"))?;
    let reserved = device_bytes(s)?;

    let forward = |layers: &mut [FfnSublayer<'static, T>], act: &mut [CudaSlice<T>]| -> fusion::Result<()> {
        for (i, layer) in layers.iter_mut().enumerate() {
            let (inputs, outputs) = act.split_at_mut(i + 1);
            layer.run(
                s,
                &fusion::Tensor::new(&inputs[i], [m, d])?,
                &mut fusion::TensorMut::new(&mut outputs[0], [m, d])?,
            )?;
        }
        Ok(())
    };

    // Eager: N calls, which grow the workspace no further (a capture must
    // not grow it).
    forward(&mut layers, &mut act).map_err(fail("the eager forward"))?;
    let eager = download(s, &act)?;
    let rows = testing::sample_rows(m, CHECKED_ROWS, &mut StdRng::seed_from_u64(m as u64));
    let mut agreed = check("eager", &graph, &checked, &host_weights, &eager, [m, d], &rows)?;

    // Captured: the same N calls as one CUDA graph.
    poison(&mut act)?;
    s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
        .map_err(|e| format!("capture begins: {e}"))?;
    let captured = forward(&mut layers, &mut act);
    let cuda_graph = s
        .end_capture(CUgraphInstantiate_flags(0))
        .map_err(|e| format!("capture ends: {e}"))?;
    captured.map_err(fail("the captured forward"))?;
    let cuda_graph = cuda_graph.ok_or("the capture recorded no work")?;
    cuda_graph
        .launch()
        .map_err(|e| format!("the graph launches: {e}"))?;
    let replayed = download(s, &act)?;
    agreed &= check(
        "captured",
        &graph,
        &checked,
        &host_weights,
        &replayed,
        [m, d],
        &rows,
    )?;
    let differ = eager
        .iter()
        .zip(&replayed)
        .map(|(a, b)| {
            let (a, b) = (T::to_le_bytes(a), T::to_le_bytes(b));
            let size = size_of::<T>();
            a.chunks(size).zip(b.chunks(size)).filter(|(a, b)| a != b).count()
        })
        .sum::<usize>();
    let schedule = |capturing| fusion::launch::schedule_flags(capturing).map_err(|e| e.to_string());
    let same_schedule = schedule(false)? == schedule(true)?;
    println!(
        "  eager and captured outputs: {differ} of {} elements differ{}",
        n * m * d,
        if same_schedule {
            ""
        } else {
            " (direct calls may split K: FUSION_STREAM_K=0 for the same schedule)"
        }
    );
    if same_schedule && differ > 0 {
        eprintln!("  the captured graph computes other bits than the eager calls under one schedule");
        agreed = false;
    }

    let need = layers[0].workspace_bytes(s, m).map_err(fail("workspace_bytes"))?;
    let held = workspace.bytes();
    let mib = |bytes: usize| bytes as f64 / (1 << 20) as f64;
    println!(
        "  device memory: weights {:.1} MiB held ({:.1} MiB read by the kernels), activations {:.2} MiB, \
         workspace {:.2} MiB ({:.2} MiB by the driver's count); one call needs {:.2} MiB: {:.3}x one layer's",
        mib(bound.saturating_sub(before)),
        mib(weight_bytes),
        mib(allocated.saturating_sub(bound)),
        mib(held),
        mib(reserved.saturating_sub(allocated)),
        mib(need),
        held as f64 / need.max(1) as f64
    );

    // Times: one layer alone, then the stack both ways.
    let plan = TimingPlan {
        warmup: 3,
        runs: if n * m > 256 { 10 } else { 20 },
    };
    let one = {
        let (inputs, outputs) = act.split_at_mut(1);
        let x = fusion::Tensor::new(&inputs[0], [m, d]).map_err(fail("x"))?;
        let mut y = fusion::TensorMut::new(&mut outputs[0], [m, d]).map_err(fail("y"))?;
        let layer = &mut layers[0];
        time_calls(s, plan, || Ok(()), |_| layer.run(s, &x, &mut y)).map_err(fail("timing one layer"))?
    };
    let eager_time =
        time_calls(s, plan, || Ok(()), |_| forward(&mut layers, &mut act)).map_err(fail("timing eager"))?;
    let graph_time = time_calls(
        s,
        plan,
        || Ok(()),
        |_| cuda_graph.launch().map_err(fusion::Error::from),
    )
    .map_err(fail("timing the graph"))?;
    let per_token = |us: f64| us / m as f64;
    println!(
        "  one layer: {:.1} us per call; N x one layer: {:.1} us",
        one.median_us,
        n as f64 * one.median_us
    );
    for (how, timing) in [("eager", &eager_time), ("captured", &graph_time)] {
        println!(
            "  {how:<8}: {:>9.1} us per forward, {:>8.2} us per token, {:>7.2} us per layer: {:.3}x N x one layer (median of {})",
            timing.median_us,
            per_token(timing.median_us),
            timing.median_us / n as f64,
            timing.median_us / (n as f64 * one.median_us),
            plan.runs
        );
    }
    drop(cuda_graph);
    Ok(agreed)
}

/// A message for a failed call: what it did, then why.
fn fail(what: impl std::fmt::Display) -> impl FnOnce(fusion::Error) -> String {
    move |e| format!("{what}: {e}")
}

/// Every activation buffer, downloaded.
fn download<T: HostElement>(s: &Arc<CudaStream>, act: &[CudaSlice<T>]) -> Result<Vec<Vec<T>>, String> {
    act.iter()
        .map(|a| s.clone_dtoh(a).map_err(|e| format!("could not download: {e}")))
        .collect()
}

/// Each checked layer's output (`act[i + 1]`) against the reference of
/// layer `i` on its GPU input (`act[i]`), over `rows`.
fn check<T: HostElement>(
    how: &str,
    graph: &Graph,
    checked: &[usize],
    weights: &[Bindings],
    act: &[Vec<T>],
    shape: [usize; 2],
    rows: &[usize],
) -> Result<bool, String> {
    let mut agreed = true;
    for (&i, weights) in checked.iter().zip(weights) {
        let mut host = weights.clone();
        host.insert("x".into(), T::decode(&shape, &act[i]).map_err(|e| e.to_string())?);
        let want = reference::evaluate_rows(graph, &host, rows).map_err(|e| e.to_string())?;
        let got = T::decode(&shape, &act[i + 1])
            .and_then(|t| t.select_rows(rows))
            .map_err(|e| e.to_string())?;
        match testing::compare(&got, &want["y"], T::DTYPE, rows) {
            Ok(error) => println!(
                "  {how:<8} layer {i:>2}: relative error {error:.2e} over {} rows (ok)",
                rows.len()
            ),
            Err(mismatch) => {
                eprintln!("  {how:<8} layer {i:>2}: {mismatch}");
                agreed = false;
            }
        }
    }
    Ok(agreed)
}
