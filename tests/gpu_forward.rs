//! A whole forward: a stack of Llama-3-8B FFN sub-layers
//! (graphs/ffn_sublayer.toml; D = 4096 and F = 14336, as the graph fixes
//! them) bound from one safetensors file under Hugging Face names, sharing
//! one workspace, run eagerly (a call per layer) and as one captured CUDA
//! graph, in f16 and bf16 at M = 1 and 77. Every layer's input and output
//! stay on the device, and each layer's output is compared with the CPU
//! reference of that layer on its own GPU input, so that a layer is judged
//! by its own error rather than by what the layers before it made of the
//! input (the layers are row-local: the chosen rows are checked exactly).
//! The shared workspace holds at most 1.05x what one layer with its own
//! holds; replays of the captured graph give the same bits, and give the
//! eager calls' bits where a direct call runs a captured call's schedule
//! (`FUSION_STREAM_K=0`: otherwise a direct call may split K, which sums
//! in another order, and both are held to the reference alone).
//!
//! Run on a machine with a GPU: `cargo test --release --features kernels,testing --test
//! gpu_forward -- --ignored` (see tests/support for the environment).

mod support;

use fusion::core::ir::Graph;
use fusion::core::reference;
use fusion::cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use fusion::cudarc::driver::{CudaSlice, CudaStream};
use fusion::half::{bf16, f16};
use fusion::kernels::FfnSublayer;
use fusion::{SharedWorkspace, TensorFile, TensorNames, testing};
use rand::Rng;
use std::sync::Arc;
use support::{TestElement, rng, stream};

/// Layers in the stack: enough that a layer's output is the next one's
/// input more than once, few enough that the reference stays quick.
const LAYERS: usize = 4;

/// Rows of each layer's output compared with the reference: the first,
/// the last and some at random (all of them up to this many).
const CHECKED_ROWS: usize = 8;

#[test]
#[ignore = "needs a CUDA GPU"]
fn an_f16_stack_runs_eagerly_and_captured_to_the_reference_in_one_workspace() {
    stack_runs_eagerly_and_captured::<f16>();
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_bf16_stack_runs_eagerly_and_captured_to_the_reference_in_one_workspace() {
    stack_runs_eagerly_and_captured::<bf16>();
}

fn stack_runs_eagerly_and_captured<T: TestElement>() {
    let s = stream();
    // A capture may not wait on events recorded before it began, which
    // cudarc's per-buffer event tracking would make it do; every buffer of
    // this test lives on its one stream.
    unsafe { s.context().disable_event_tracking() };
    let graph = support::graph("ffn_sublayer", T::DTYPE);
    let seed = rng().random();
    let bytes =
        testing::random_layers_file::<T>(&graph, LAYERS, &[("M", 1)], TensorNames::hugging_face, seed)
            .expect("the layers' file");
    let dir = std::env::temp_dir().join(format!("fusion-gpu-forward-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join(format!("stack_{}.safetensors", T::DTYPE));
    std::fs::write(&path, bytes).expect("write the file");
    let file = TensorFile::open(&path).expect("the file reads");
    let _ = std::fs::remove_file(&path);
    assert!(
        file.get("model.layers.3.mlp.down_proj.weight").is_some(),
        "{:?}",
        file.names().collect::<Vec<_>>()
    );

    let workspace = SharedWorkspace::new();
    let mut layers: Vec<FfnSublayer<'static, T>> = (0..LAYERS)
        .map(|i| {
            FfnSublayer::from_safetensors(&s, &file, &TensorNames::hugging_face(i))
                .expect("weights bind")
                .with_workspace(workspace.clone())
        })
        .collect();
    // Layer 0 again, with a workspace of its own: what one layer holds.
    let mut solo =
        FfnSublayer::<T>::from_safetensors(&s, &file, &TensorNames::hugging_face(0)).expect("weights bind");

    for m in [1, 77] {
        let label = format!("{LAYERS} ffn_sublayer layers, {}, M = {m}", T::DTYPE);
        let x = reference::random_bindings(&graph, &[("M", m)], &mut rng()).expect("bindings")["x"].clone();
        let d = x.shape[1];
        let mut act: Vec<CudaSlice<T>> = std::iter::once(s.clone_htod(&T::encode(&x)).expect("upload"))
            .chain((0..LAYERS).map(|_| s.clone_htod(&vec![T::NAN; m * d]).expect("alloc")))
            .collect();
        let rows = testing::sample_rows(m, CHECKED_ROWS, &mut rng());

        // Eager, which also grows the workspace to what a call needs.
        forward(&s, &mut layers, &mut act, m, d).expect("the eager forward");
        let eager = download(&s, &act);
        check(&label, "eager", &graph, &file, &eager, [m, d], &rows);

        // One layer alone, at the same size.
        let mut y = s.clone_htod(&vec![T::NAN; m * d]).expect("alloc");
        solo.run(
            &s,
            &fusion::Tensor::new(&act[0], [m, d]).expect("x"),
            &mut fusion::TensorMut::new(&mut y, [m, d]).expect("y"),
        )
        .expect("one layer runs");
        s.synchronize().expect("the calls finish");
        let (shared, alone) = (workspace.bytes(), solo.workspace().bytes());
        eprintln!(
            "{label}: the shared workspace holds {shared} bytes, one layer's own {alone} (a call needs {})",
            solo.workspace_bytes(&s, m).expect("the need")
        );
        assert!(
            shared as f64 <= 1.05 * alone as f64,
            "{label}: {shared} bytes for {LAYERS} layers, {alone} for one"
        );
        let grown = workspace.allocations();

        // Captured: the same calls as one CUDA graph, replayed.
        poison(&s, &mut act, m * d);
        s.begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)
            .expect("capture begins");
        let captured = forward(&s, &mut layers, &mut act, m, d);
        let cuda_graph = s.end_capture(CUgraphInstantiate_flags(0)).expect("capture ends");
        captured.expect("the forward is captured");
        let cuda_graph = cuda_graph.expect("a graph of the layers' kernels");
        let mut first: Option<Vec<Vec<T>>> = None;
        for replay in 0..3 {
            poison(&s, &mut act, m * d);
            cuda_graph.launch().expect("the graph launches");
            let replayed = download(&s, &act);
            match &first {
                None => {
                    check(&label, "captured", &graph, &file, &replayed, [m, d], &rows);
                    first = Some(replayed);
                }
                Some(first) => assert_eq!(
                    differing(first, &replayed),
                    0,
                    "{label}: replay {replay} differs from the first"
                ),
            }
        }
        assert_eq!(
            workspace.allocations(),
            grown,
            "{label}: the capture grew the workspace"
        );
        let replayed = first.expect("replayed");
        let differ = differing(&eager, &replayed);
        let schedule =
            |capturing| fusion::launch::schedule_flags(capturing).expect("FUSION_STREAM_K is valid");
        let same_schedule = schedule(false) == schedule(true);
        eprintln!(
            "{label}: eager and captured differ in {differ} of {} elements ({})",
            LAYERS * m * d,
            if same_schedule {
                "one schedule"
            } else {
                "direct calls may split K"
            }
        );
        if same_schedule {
            assert_eq!(
                differ, 0,
                "{label}: the captured graph computes other bits than the eager calls"
            );
        }
        // The graph holds the workspace's addresses: dropped before a
        // larger call may grow it.
        drop(cuda_graph);
    }
}

/// Layer `i` reads `act[i]` and writes `act[i + 1]`.
fn forward<T: TestElement>(
    s: &Arc<CudaStream>,
    layers: &mut [FfnSublayer<'static, T>],
    act: &mut [CudaSlice<T>],
    m: usize,
    d: usize,
) -> fusion::Result<()> {
    for (i, layer) in layers.iter_mut().enumerate() {
        let (inputs, outputs) = act.split_at_mut(i + 1);
        layer.run(
            s,
            &fusion::Tensor::new(&inputs[i], [m, d])?,
            &mut fusion::TensorMut::new(&mut outputs[0], [m, d])?,
        )?;
    }
    Ok(())
}

/// Every layer's output set to NaN, so that one left unwritten fails.
fn poison<T: TestElement>(s: &Arc<CudaStream>, act: &mut [CudaSlice<T>], len: usize) {
    for a in &mut act[1..] {
        s.memcpy_htod(&vec![T::NAN; len], a).expect("poison");
    }
}

/// How many elements of `a` and `b` differ in their bits.
fn differing<T: TestElement>(a: &[Vec<T>], b: &[Vec<T>]) -> usize {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| {
            let (a, b) = (T::to_le_bytes(a), T::to_le_bytes(b));
            let size = size_of::<T>();
            a.chunks(size).zip(b.chunks(size)).filter(|(a, b)| a != b).count()
        })
        .sum()
}

fn download<T: TestElement>(s: &Arc<CudaStream>, act: &[CudaSlice<T>]) -> Vec<Vec<T>> {
    act.iter().map(|a| s.clone_dtoh(a).expect("download")).collect()
}

/// Each layer's output (`act[i + 1]`) against the reference of layer `i`,
/// its weights read back from `file`, on its GPU input (`act[i]`).
fn check<T: TestElement>(
    label: &str,
    how: &str,
    graph: &Graph,
    file: &TensorFile,
    act: &[Vec<T>],
    shape: [usize; 2],
    rows: &[usize],
) {
    for layer in 0..LAYERS {
        let mut host = testing::weights_from_file::<T>(graph, file, &TensorNames::hugging_face(layer))
            .unwrap_or_else(|e| panic!("{e}"));
        host.insert("x".into(), T::decode(&shape, &act[layer]).expect("shape"));
        let want = reference::evaluate_rows(graph, &host, rows).expect("reference");
        let got = T::decode(&shape, &act[layer + 1])
            .and_then(|t| t.select_rows(rows))
            .expect("rows");
        let error = testing::compare(&got, &want["y"], T::DTYPE, rows)
            .unwrap_or_else(|mismatch| panic!("{label}, {how}, layer {layer}: {mismatch}"));
        eprintln!(
            "{label}, {how}, layer {layer}: relative error {error:.2e} over {} rows",
            rows.len()
        );
    }
}
