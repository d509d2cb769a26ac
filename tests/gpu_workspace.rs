//! The device memory a call uses beside its tensors (`fusion::launch::Workspace`):
//! stream-K's partial tiles and flags and a norm prologue's row statistics,
//! owned by Rust and handed to the launchers. A call computes what the
//! reference says whether its scratch was just allocated or reused, a
//! second identical call allocates nothing, streams get their own scratch
//! (or, sharing a struct's, take turns, also from threads on per-thread
//! streams), and a buffer a call outgrows is freed only after its last use. Captures are in gpu_graphs.rs,
//! whose tests turn cudarc's event tracking off for the whole context.
//!
//! Run on a machine with a GPU: `cargo test --release --features kernels,testing --test
//! gpu_workspace -- --ignored` (see tests/support for the environment).

mod support;

use fusion::Tensor;
use fusion::core::ir::DType;
use fusion::core::reference::{Bindings, Intermediates, random_bindings};
use fusion::cudarc::driver::CudaSlice;
use fusion::half::f16;
use fusion::kernels;
use fusion::launch::with_stream_workspace;
use support::{Case, stream};

/// A shape whose tiles are fewer than half the SMs (64 of 64x128 on 132),
/// which a direct call on an H200 splits by split-K (two CTAs a tile).
const DIMS: [(&str, usize); 3] = [("M", 128), ("N", 4096), ("K", 4096)];

/// (bytes of scratch, allocations) of the workspace the free functions keep
/// for `s`.
fn stream_scratch(s: &std::sync::Arc<fusion::cudarc::driver::CudaStream>) -> (usize, usize) {
    with_stream_workspace(s, |w| (w.scratch_bytes(), w.allocations()))
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_second_identical_call_reuses_its_scratch_and_computes_the_same() {
    let s = stream();
    let mut norm =
        Case::<f16>::new(&s, "layernorm_gemm", &DIMS).with_intermediates(Intermediates::RoundedNorms);
    let mut gelu = Case::<f16>::new(&s, "gemm_bias_gelu", &DIMS);
    let mut outputs = Vec::new();
    let mut held = Vec::new();
    for call in 0..2 {
        norm.poison(&s);
        gelu.poison(&s);
        norm.launch(|r, w| kernels::layernorm_gemm(&s, &r[0], &r[1], &r[2], &r[3], &mut w[0]))
            .expect("layernorm_gemm runs");
        gelu.launch(|r, w| kernels::gemm_bias_gelu(&s, &r[0], &r[1], &r[2], &mut w[0]))
            .expect("gemm_bias_gelu runs");
        let errors = (norm.verify(&s), gelu.verify(&s));
        eprintln!("call {call}: relative error {:.2e}, {:.2e}", errors.0, errors.1);
        let (bytes, allocations) = stream_scratch(&s);
        eprintln!("call {call}: {bytes} bytes of scratch, {allocations} allocations");
        // A norm prologue always needs its row statistics (M x 8 bytes).
        assert!(bytes >= 2100 * 8, "call {call}: {bytes} bytes of scratch");
        held.push((bytes, allocations));
        outputs.push(
            [&norm, &gelu]
                .iter()
                .map(|case| s.clone_dtoh(&case.writes[0].1).expect("download"))
                .collect::<Vec<Vec<f16>>>(),
        );
    }
    assert_eq!(held[0], held[1], "the second call allocated");
    assert!(outputs[0] == outputs[1], "the reused scratch changed a result");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_graph_struct_allocates_only_on_its_first_call() {
    let s = stream();
    let mut case = Case::<f16>::new(&s, "swiglu_ffn", &[("M", 2100)]);
    // The struct binds copies of the case's weights, which it borrows
    // across launches of the case.
    let weights = case.weight_copies(&s);
    let mut ffn = kernels::SwigluFfn::new(&s, Case::swiglu_ffn_weights(&weights)).expect("weights bind");
    assert_eq!(ffn.workspace().allocations(), 0);
    case.launch(|r, w| ffn.run(&s, &r[0], &mut w[0]))
        .expect("swiglu_ffn runs");
    case.verify(&s);
    let first = ffn.workspace().allocations();
    assert!(first > 0, "the intermediates were never allocated");
    case.poison(&s);
    case.launch(|r, w| ffn.run(&s, &r[0], &mut w[0]))
        .expect("swiglu_ffn runs again");
    case.verify(&s);
    assert_eq!(ffn.workspace().allocations(), first, "the second call allocated");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn streams_get_their_own_scratch_and_a_shared_struct_orders_them() {
    let a = stream();
    let b = a.fork().expect("a second stream");
    let mut on_a = Case::<f16>::new(&a, "gemm_bias_gelu", &DIMS);
    let mut on_b = Case::<f16>::new(&b, "gemm_bias_gelu", &DIMS);
    on_a.launch(|r, w| kernels::gemm_bias_gelu(&a, &r[0], &r[1], &r[2], &mut w[0]))
        .expect("runs on a");
    let (bytes_a, _) = stream_scratch(&a);
    assert!(bytes_a > 0, "this shape splits by split-K on an H200 (132 SMs)");
    assert_eq!(stream_scratch(&b), (0, 0), "b's workspace is its own");
    // Both streams at once, each with its own scratch, many times over.
    for _ in 0..20 {
        on_a.launch(|r, w| kernels::gemm_bias_gelu(&a, &r[0], &r[1], &r[2], &mut w[0]))
            .expect("runs on a");
        on_b.launch(|r, w| kernels::gemm_bias_gelu(&b, &r[0], &r[1], &r[2], &mut w[0]))
            .expect("runs on b");
    }
    on_a.verify(&a);
    on_b.verify(&b);
    // One struct's workspace on both streams: cudarc's events make each
    // stream wait for the other's use of the scratch.
    // Both cases drew their own weights: the struct runs b's weights on
    // a's input too, so b's case takes a's.
    on_b.reads.truncate(1);
    let weights = on_a.weight_copies(&a);
    for (name, (buf, shape)) in ["w", "b"].into_iter().zip(on_a.weight_copies(&b)) {
        on_b.host.insert(name.to_owned(), on_a.host[name].clone());
        on_b.reads.push((name.to_owned(), buf, shape));
    }
    let view = |i: usize| Tensor::new(&weights[i].0, weights[i].1).expect("view");
    let bound = kernels::GemmBiasGeluWeights {
        w: view(0),
        b: view(1),
    };
    let mut gelu = kernels::GemmBiasGelu::new(&a, bound).expect("weights bind");
    for case in [&mut on_a, &mut on_b] {
        case.poison(&a);
        case.poison(&b);
    }
    for _ in 0..20 {
        on_a.launch(|r, w| gelu.run(&a, &r[0], &mut w[0]))
            .expect("runs on a");
        on_b.launch(|r, w| gelu.run(&b, &r[0], &mut w[0]))
            .expect("runs on b");
    }
    on_a.verify(&a);
    on_b.verify(&b);
    assert_eq!(gelu.workspace().allocations(), 1, "one scratch buffer, reused");
}

/// A host function that holds its stream until the channel it owns is
/// sent to (or dropped, or 30 s have passed).
unsafe extern "C" fn hold_until_released(data: *mut std::ffi::c_void) {
    // SAFETY: `data` is the boxed receiver `hold_stream` gave away; this
    // callback runs once and makes no CUDA calls.
    let release = unsafe { Box::from_raw(data.cast::<std::sync::mpsc::Receiver<()>>()) };
    let _ = release.recv_timeout(std::time::Duration::from_secs(30));
}

/// Holds `stream` (nothing queued after this runs) until the returned
/// sender sends or is dropped.
fn hold_stream(stream: &fusion::cudarc::driver::CudaStream) -> std::sync::mpsc::Sender<()> {
    let (release, held) = std::sync::mpsc::channel::<()>();
    let held = Box::into_raw(Box::new(held));
    // SAFETY: the callback takes ownership of the boxed receiver and makes
    // no CUDA calls; the stream belongs to a live context.
    let launched = unsafe {
        fusion::cudarc::driver::result::stream::launch_host_function(
            stream.cu_stream(),
            hold_until_released,
            held.cast(),
        )
    };
    if let Err(e) = launched {
        // SAFETY: a failed launch never ran the callback: the box is ours.
        drop(unsafe { Box::from_raw(held) });
        panic!("cannot hold the stream: {e}");
    }
    release
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_struct_shared_by_threads_on_per_thread_streams_orders_its_workspace() {
    // A context that makes no second stream, as candle's devices do: cudarc
    // then tracks no events, and the per-thread default stream is one
    // handle meaning another stream in every thread.
    let ctx = fusion::testing::open_gpu(0).unwrap_or_else(|e| panic!("{e}"));
    let main = ctx.per_thread_stream();
    let graph = support::graph("swiglu_ffn", fusion::core::ir::DType::F16);
    let dims = [("M", 2100)];
    let draw =
        || fusion::core::reference::random_bindings(&graph, &dims, &mut support::rng()).expect("bindings");
    // Two input sets over the same weights.
    let first = draw();
    let mut second = draw();
    for &w in &graph.weights {
        let name = &graph.tensor(w).name;
        second.insert(name.clone(), first[name].clone());
    }
    let weights = Case::<f16>::from_bindings(&main, graph.clone(), first.clone(), &dims).weight_copies(&main);
    let ffn = std::sync::Mutex::new(
        kernels::SwigluFfn::new(&main, Case::swiglu_ffn_weights(&weights)).expect("weights bind"),
    );
    // One call before any hold: it loads the kernels and sizes the
    // workspace. A kernel loaded lazily inside a held call waits for the
    // context, so thread A's launch would block until its own hold ended.
    let mut warm = Case::<f16>::from_bindings(&main, graph.clone(), first.clone(), &dims);
    warm.launch(|r, w| {
        ffn.lock()
            .expect("no thread panicked")
            .run(&main, &r[0], &mut w[0])
    })
    .expect("swiglu_ffn runs");
    warm.verify(&main);
    main.synchronize().expect("weights copied");
    // Thread A queues its call behind a hold on its stream; thread B then
    // queues its own on its stream. While A is held B's call must not run
    // (they share the workspace); once released, both compute their own.
    let (a_queued, a_call) = std::sync::mpsc::channel();
    std::thread::scope(|scope| {
        let (ctx, ffn) = (&ctx, &ffn);
        scope.spawn(move || {
            let s = ctx.per_thread_stream();
            // A graph holds no thread-shared parts: each thread loads its own.
            let graph = support::graph("swiglu_ffn", fusion::core::ir::DType::F16);
            let mut case = Case::<f16>::from_bindings(&s, graph, first, &dims);
            let release = hold_stream(&s);
            case.launch(|r, w| ffn.lock().expect("no thread panicked").run(&s, &r[0], &mut w[0]))
                .expect("swiglu_ffn runs on thread A");
            let a_done = s.record_event(None).expect("event");
            a_queued.send((release, a_done)).expect("thread B waits");
            if let Err(e) = case.try_verify(&s) {
                panic!("thread A: {e}");
            }
        });
        scope.spawn(move || {
            let s = ctx.per_thread_stream();
            let graph = support::graph("swiglu_ffn", fusion::core::ir::DType::F16);
            let mut case = Case::<f16>::from_bindings(&s, graph, second, &dims);
            s.synchronize().expect("inputs uploaded");
            let (release_a, a_done) = a_call.recv().expect("thread A queued its call");
            case.launch(|r, w| ffn.lock().expect("no thread panicked").run(&s, &r[0], &mut w[0]))
                .expect("swiglu_ffn runs on thread B");
            let b_done = s.record_event(None).expect("event");
            // Ample time for the call (about a millisecond) to run if
            // nothing orders it after thread A's.
            std::thread::sleep(std::time::Duration::from_millis(300));
            let (a_ran, b_ran) = (a_done.is_complete(), b_done.is_complete());
            drop(release_a);
            assert!(
                !a_ran,
                "thread A's call ran although its stream was held: the test proves nothing"
            );
            assert!(
                !b_ran,
                "thread B's call ran while thread A's, queued first over the same workspace, had not"
            );
            if let Err(e) = case.try_verify(&s) {
                panic!("thread B: {e}");
            }
        });
    });
    assert!(
        !ctx.is_in_multi_stream_mode(),
        "the test's context made a second stream: cudarc's events would order the calls"
    );
}

/// A [`kernels::Gpt2Mlp`]'s weights from [`Case::weight_copies`] of a
/// `gpt2_mlp` case.
fn gpt2_mlp_weights(copies: &[(CudaSlice<f16>, fusion::Shape)]) -> kernels::Gpt2MlpWeights<'_, f16> {
    let view = |i: usize| Tensor::new(&copies[i].0, copies[i].1).expect("view");
    kernels::Gpt2MlpWeights {
        ln_g: view(0),
        ln_b: view(1),
        w_fc: view(2),
        b_fc: view(3),
        w_proj: view(4),
        b_proj: view(5),
    }
}

/// A buffer a call grows is replaced, and the old one is freed on the
/// stream it was allocated on, where its last use, on another stream, may
/// still be queued. Call 1 (on A) makes a struct's intermediates and scratch
/// for 64 rows; call 2 (on B, held) uses them; call 3 (on B, 128 rows)
/// replaces them. Freed at once on A, their memory would be free while
/// call 2 waits: an event recorded on A after call 3 must not complete
/// before B runs, and memory allocated and zeroed on A then (which the pool
/// may hand out from the freed buffers) must not take call 2's writes.
#[test]
#[ignore = "needs a CUDA GPU"]
fn a_replaced_buffer_is_freed_after_its_last_use_on_another_stream() {
    let a = stream();
    // cudarc's per-buffer events would order the free by themselves; the
    // workspace must not rely on them (a context with one stream, or
    // candle's, has none).
    unsafe { a.context().disable_event_tracking() };
    let b = a.fork().expect("a second stream");
    let graph = support::graph("gpt2_mlp", DType::F16);
    let (small, large) = ([("M", 64)], [("M", 128)]);
    let draw = |dims: &[(&str, usize)]| random_bindings(&graph, dims, &mut support::rng()).expect("bindings");
    let first = draw(&small);
    // Every case runs the first case's weights, which the struct binds.
    let with_first_weights = |mut host: Bindings| {
        for &w in &graph.weights {
            let name = &graph.tensor(w).name;
            host.insert(name.clone(), first[name].clone());
        }
        host
    };
    let (second, third) = (with_first_weights(draw(&small)), with_first_weights(draw(&large)));
    let mut on_a = Case::<f16>::from_bindings(&a, graph.clone(), first.clone(), &small);
    let weights = on_a.weight_copies(&a);
    // Both sizes run once first, through a struct of their own: a kernel
    // loaded lazily inside a held call waits for the context.
    let mut warm = kernels::Gpt2Mlp::new(&a, gpt2_mlp_weights(&weights)).expect("weights bind");
    for (host, dims) in [(&first, &small), (&third, &large)] {
        let mut case = Case::<f16>::from_bindings(&a, graph.clone(), host.clone(), dims);
        case.launch(|r, w| warm.run(&a, &r[0], &mut w[0]))
            .expect("gpt2_mlp runs");
        case.verify(&a);
    }
    let mut mlp = kernels::Gpt2Mlp::new(&a, gpt2_mlp_weights(&weights)).expect("weights bind");
    on_a.launch(|r, w| mlp.run(&a, &r[0], &mut w[0]))
        .expect("call 1 runs on A");
    on_a.verify(&a);
    let mut on_b = Case::<f16>::from_bindings(&b, graph.clone(), second, &small);
    let mut grown_on_b = Case::<f16>::from_bindings(&b, graph.clone(), third, &large);
    b.synchronize().expect("inputs uploaded");
    let allocations = mlp.workspace().allocations();

    let release = hold_stream(&b);
    on_b.launch(|r, w| mlp.run(&b, &r[0], &mut w[0]))
        .expect("call 2 queues on B");
    grown_on_b
        .launch(|r, w| mlp.run(&b, &r[0], &mut w[0]))
        .expect("call 3 queues on B");
    assert!(
        mlp.workspace().allocations() > allocations,
        "call 3 replaced nothing: the test proves nothing"
    );
    let b_done = b.record_event(None).expect("event");
    // The size of call 1's intermediate (64 x 3072 f16), a few times over.
    let fresh: Vec<CudaSlice<u8>> = (0..4)
        .map(|_| a.alloc_zeros::<u8>(64 * 3072 * 2).expect("alloc"))
        .collect();
    let a_done = a.record_event(None).expect("event");
    // Ample time for A's frees and memsets to run if nothing orders them
    // after B's calls.
    std::thread::sleep(std::time::Duration::from_millis(300));
    let (a_ran, b_ran) = (a_done.is_complete(), b_done.is_complete());
    drop(release);
    assert!(
        !b_ran,
        "B's calls ran although B was held: the test proves nothing"
    );
    assert!(
        !a_ran,
        "stream A freed the buffers call 2 uses (queued on B) before call 2 ran"
    );
    for case in [&on_b, &grown_on_b] {
        if let Err(e) = case.try_verify(&b) {
            panic!("on B: {e}");
        }
    }
    a.synchronize().expect("A's work finished");
    for buffer in &fresh {
        let bytes = a.clone_dtoh(buffer).expect("download");
        assert!(
            bytes.iter().all(|&v| v == 0),
            "call 2 wrote into memory freed under it and allocated again on A"
        );
    }
}

/// Two structs of different graphs sharing one workspace, called in turn
/// on one stream at two sizes: each computes what the reference says, the
/// workspace holds what the larger of their calls needs (not their sum),
/// and once it has grown to that no later call allocates.
#[test]
#[ignore = "needs a CUDA GPU"]
fn structs_of_two_graphs_share_one_workspace_on_a_stream() {
    let s = stream();
    let workspace = fusion::SharedWorkspace::new();
    let mut ffn_case = Case::<f16>::new(&s, "swiglu_ffn", &[("M", 300)]);
    let ffn_weights = ffn_case.weight_copies(&s);
    let mut ffn = kernels::SwigluFfn::new(&s, Case::swiglu_ffn_weights(&ffn_weights))
        .expect("weights bind")
        .with_workspace(workspace.clone());
    let mut mlp_case = Case::<f16>::new(&s, "gpt2_mlp", &[("M", 300)]);
    let mlp_weights = mlp_case.weight_copies(&s);
    let mut mlp = kernels::Gpt2Mlp::new(&s, gpt2_mlp_weights(&mlp_weights))
        .expect("weights bind")
        .with_workspace(workspace.clone());
    assert!(ffn.workspace().is(&workspace) && mlp.workspace().is(&workspace));
    let needs = (
        ffn.workspace_bytes(&s, 300).expect("ffn's need"),
        mlp.workspace_bytes(&s, 300).expect("mlp's need"),
    );
    eprintln!(
        "workspace per call at M = 300: swiglu_ffn {} bytes, gpt2_mlp {} bytes",
        needs.0, needs.1
    );
    let mut grown = 0;
    for round in 0..4 {
        for case in [&mut ffn_case, &mut mlp_case] {
            case.poison(&s);
        }
        ffn_case
            .launch(|r, w| ffn.run(&s, &r[0], &mut w[0]))
            .expect("swiglu_ffn runs");
        mlp_case
            .launch(|r, w| mlp.run(&s, &r[0], &mut w[0]))
            .expect("gpt2_mlp runs");
        ffn_case.verify(&s);
        mlp_case.verify(&s);
        if round == 0 {
            grown = workspace.allocations();
        }
        assert_eq!(workspace.allocations(), grown, "round {round} allocated");
    }
    let held = workspace.bytes();
    eprintln!("shared workspace: {held} bytes");
    assert!(
        held >= needs.0.max(needs.1),
        "{held} bytes, less than a call needs"
    );
    assert!(
        held < needs.0 + needs.1,
        "{held} bytes: the sum of the two, not the larger"
    );
    // Reserving for a size already held allocates nothing.
    ffn.reserve_workspace(&s, 300).expect("reserve");
    assert_eq!(workspace.allocations(), grown);
}

/// One workspace shared by two structs of different graphs, each run from
/// its own thread on its own stream, many times: the workspace's events
/// order every call after the last use on the other stream, so both
/// compute what the reference says.
#[test]
#[ignore = "needs a CUDA GPU"]
fn structs_sharing_a_workspace_from_two_threads_on_two_streams_take_turns() {
    let a = stream();
    let b = a.fork().expect("a second stream");
    let workspace = fusion::SharedWorkspace::new();
    let dims = [("M", 700)];
    // Cases hold no thread-shared parts: each thread makes its own from
    // bindings drawn here, whose weights the structs bind.
    let draw = |name: &str| {
        let graph = support::graph(name, DType::F16);
        let host = random_bindings(&graph, &dims, &mut support::rng()).expect("bindings");
        let weights = Case::<f16>::from_bindings(&a, graph, host.clone(), &dims).weight_copies(&a);
        (host, weights)
    };
    let (ffn_host, ffn_weights) = draw("swiglu_ffn");
    let (mlp_host, mlp_weights) = draw("gpt2_mlp");
    a.synchronize().expect("weights copied");
    let mut ffn = kernels::SwigluFfn::new(&a, Case::swiglu_ffn_weights(&ffn_weights))
        .expect("weights bind")
        .with_workspace(workspace.clone());
    let mut mlp = kernels::Gpt2Mlp::new(&b, gpt2_mlp_weights(&mlp_weights))
        .expect("weights bind")
        .with_workspace(workspace.clone());
    std::thread::scope(|scope| {
        let (a, b, dims) = (&a, &b, &dims);
        let (ffn, mlp) = (&mut ffn, &mut mlp);
        scope.spawn(move || {
            let graph = support::graph("swiglu_ffn", DType::F16);
            let mut case = Case::<f16>::from_bindings(a, graph, ffn_host, dims);
            for call in 0..20 {
                case.poison(a);
                case.launch(|r, w| ffn.run(a, &r[0], &mut w[0]))
                    .expect("swiglu_ffn runs on a");
                if let Err(e) = case.try_verify(a) {
                    panic!("swiglu_ffn, call {call} on stream a: {e}");
                }
            }
        });
        scope.spawn(move || {
            let graph = support::graph("gpt2_mlp", DType::F16);
            let mut case = Case::<f16>::from_bindings(b, graph, mlp_host, dims);
            for call in 0..20 {
                case.poison(b);
                case.launch(|r, w| mlp.run(b, &r[0], &mut w[0]))
                    .expect("gpt2_mlp runs on b");
                if let Err(e) = case.try_verify(b) {
                    panic!("gpt2_mlp, call {call} on stream b: {e}");
                }
            }
        });
    });
}

/// The target of one workspace for a model: 32 layers of the Llama-3-8B
/// FFN sub-layer, bound from one safetensors file, sharing one workspace
/// through the same calls (M = 1, 16, 512), hold at most 1.05x what one
/// layer with a workspace of its own holds after them.
#[test]
#[ignore = "needs a CUDA GPU"]
fn thirty_two_llama_ffn_layers_share_one_layers_workspace() {
    use support::TestElement;
    let s = stream();
    let graph = support::graph("ffn_sublayer", DType::F16);
    let m = 512;
    let host = random_bindings(&graph, &[("M", m)], &mut support::rng()).expect("bindings");
    let tensors: Vec<_> = graph
        .weights
        .iter()
        .map(|&t| {
            let name = &graph.tensor(t).name;
            let value = &host[name];
            (
                name.clone(),
                DType::F16,
                value.shape.clone(),
                <f16 as fusion::Element>::to_le_bytes(&<f16 as TestElement>::encode(value)),
            )
        })
        .collect();
    let bytes = fusion::weights::serialize(&tensors).expect("serialize");
    let dir = std::env::temp_dir().join(format!("fusion-gpu-shared-layers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("ffn_sublayer.safetensors");
    std::fs::write(&path, bytes).expect("write");
    let file = fusion::TensorFile::open(&path).expect("read");
    let names = fusion::TensorNames::declared();
    let workspace = fusion::SharedWorkspace::new();
    let bind = || kernels::FfnSublayer::<f16>::from_safetensors(&s, &file, &names).expect("weights bind");
    let mut layers: Vec<_> = (0..32)
        .map(|_| bind().with_workspace(workspace.clone()))
        .collect();
    let mut solo = bind();
    let mut case = Case::<f16>::from_bindings(&s, graph.clone(), host.clone(), &[("M", m)]);
    for tokens in [1, 16, m] {
        // Its inputs (the layers read their own weights, not the case's).
        let host = random_bindings(&graph, &[("M", tokens)], &mut support::rng()).expect("bindings");
        let mut calls = Case::<f16>::from_bindings(&s, graph.clone(), host, &[("M", tokens)]);
        calls
            .launch(|r, w| solo.run(&s, &r[0], &mut w[0]))
            .expect("one layer runs");
        for layer in &mut layers {
            calls
                .launch(|r, w| layer.run(&s, &r[0], &mut w[0]))
                .expect("layer runs");
        }
        eprintln!(
            "M = {tokens}: a call needs {} bytes of workspace; 32 layers hold {}, one layer alone {}",
            solo.workspace_bytes(&s, tokens).expect("need"),
            workspace.bytes(),
            solo.workspace().bytes()
        );
    }
    s.synchronize().expect("layers ran");
    let (shared, alone) = (workspace.bytes(), solo.workspace().bytes());
    assert!(
        shared as f64 <= 1.05 * alone as f64,
        "{shared} bytes for 32 layers, {alone} for one"
    );
    // The layers still compute what the reference says.
    for layer in [0, 31] {
        case.poison(&s);
        case.launch(|r, w| layers[layer].run(&s, &r[0], &mut w[0]))
            .expect("layer runs");
        case.verify(&s);
    }
    let _ = std::fs::remove_file(&path);
}
