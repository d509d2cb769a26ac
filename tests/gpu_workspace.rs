//! The device memory a call uses beside its tensors (`fusion::launch::Workspace`):
//! stream-K's partial tiles and flags and a norm prologue's row statistics,
//! owned by Rust and handed to the launchers. A call computes what the
//! reference says whether its scratch was just allocated or reused, a
//! second identical call allocates nothing, streams get their own scratch
//! (or, sharing a struct's, take turns, also from threads on per-thread
//! streams). Captures are in gpu_graphs.rs,
//! whose tests turn cudarc's event tracking off for the whole context.
//!
//! Run on a machine with a GPU: `cargo test --release --test gpu_workspace --
//! --ignored` (see tests/support for the environment).

mod support;

use fusion::Tensor;
use fusion::core::reference::Intermediates;
use fusion::half::f16;
use fusion::kernels;
use fusion::launch::with_stream_workspace;
use support::{Case, stream};

/// A shape whose 128x256 tiles leave a partial last wave on 132 SMs (204
/// tiles), which a direct call on an H200 splits by stream-K.
const DIMS: [(&str, usize); 3] = [("M", 2100), ("N", 3000), ("K", 3000)];

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
    assert!(bytes_a > 0, "this shape splits by stream-K on an H200 (132 SMs)");
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
