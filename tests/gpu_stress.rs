//! The GPU under load: one compiled graph from several host threads on
//! several streams at once; a stream-K GEMM while another stream's kernel
//! holds most of the SMs, so that many of its CTAs can start only after
//! others have finished (the split tiles' fix-up must not wait for a CTA
//! that is not running); and an output of more than 2^31 (and up to 2^32)
//! elements, where a 32-bit index anywhere in a kernel would write to the
//! wrong place.
//!
//! Run on a machine with a GPU: `cargo test --release --features kernels,testing --test
//! gpu_stress -- --ignored --test-threads 1` (see tests/support for the environment).

mod support;

use fusion::core::reference::{self, HostTensor};
use fusion::cudarc::driver::{CudaSlice, CudaStream, result, sys};
use fusion::half::f16;
use fusion::launch::with_stream_workspace;
use fusion::{Tensor, TensorMut, kernels};
use std::ffi::{CString, c_void};
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};
use support::{Case, TestElement, rng, stream};

const THREADS: usize = 4;
const CALLS: usize = 1000;
/// Calls after which a thread checks its output (and the last one).
const CHECK_EVERY: usize = 250;

/// Runs `thread(index)` on `THREADS` threads at once; each returns how
/// many checks it made, which must be `checks`.
fn on_threads(checks: usize, thread: impl Fn(usize) -> usize + Sync) {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|index| {
                let thread = &thread;
                scope.spawn(move || thread(index))
            })
            .collect();
        for (thread, handle) in handles.into_iter().enumerate() {
            let made = handle
                .join()
                .unwrap_or_else(|_| panic!("thread {thread} failed (see its message above)"));
            assert_eq!(made, checks, "thread {thread}");
        }
    });
}

/// `CALLS` calls of `launch` on `case`, checked against the reference
/// every `CHECK_EVERY` calls and after the last; returns the checks made.
fn calls<T: TestElement>(
    thread: usize,
    s: &Arc<CudaStream>,
    case: &mut Case<T>,
    mut launch: impl FnMut(&mut Case<T>) -> fusion::Result<()>,
) -> usize {
    let mut checks = 0;
    for call in 1..=CALLS {
        let check = call % CHECK_EVERY == 0 || call == CALLS;
        if check {
            case.poison(s);
        }
        launch(case).unwrap_or_else(|e| panic!("thread {thread}, call {call}: {e}"));
        if check {
            let err = case.verify(s);
            eprintln!("thread {thread} call {call}: {} rel_err {err:.2e}", case.label);
            checks += 1;
        }
    }
    checks
}

/// Each thread: its own stream, inputs and outputs; [`calls`] of `launch`.
fn hammer<T: TestElement>(
    graph: &str,
    dims: &[(&str, usize)],
    launch: impl Fn(&Arc<CudaStream>, &mut Case<T>) -> fusion::Result<()> + Sync,
) {
    on_threads(CALLS / CHECK_EVERY, |thread| {
        let s = stream();
        let mut case = Case::<T>::new(&s, graph, dims);
        calls(thread, &s, &mut case, |case| launch(&s, case))
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn one_kernel_from_four_threads_on_four_streams() {
    let dims = [("M", 200), ("N", 1024), ("K", 512)];
    hammer::<f16>("gemm_bias_gelu", &dims, |s, case| {
        case.launch(|r, w| kernels::gemm_bias_gelu(s, &r[0], &r[1], &r[2], &mut w[0]))
    });
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_graph_with_a_workspace_from_four_threads_each_with_its_own_struct() {
    // SwigluFfn keeps two intermediates in its workspace; a struct per
    // thread is what its documentation asks for. Each binds copies of its
    // case's weights and runs all of its thread's calls.
    on_threads(CALLS / CHECK_EVERY, |thread| {
        let s = stream();
        let mut case = Case::<f16>::new(&s, "swiglu_ffn", &[("M", 24)]);
        let weights = case.weight_copies(&s);
        let mut ffn = kernels::SwigluFfn::new(&s, Case::swiglu_ffn_weights(&weights)).expect("weights bind");
        calls(thread, &s, &mut case, |case| {
            case.launch(|r, w| ffn.run(&s, &r[0], &mut w[0]))
        })
    });
}

/// Shapes that a direct call on an H200 (132 SMs) splits: 204 tiles of
/// 128x256, whose last 72 are shared by stream-K with `FUSION_STREAM_K=tail`
/// (the GPU suite's stress step sets it; by default the last wave runs
/// whole); and 128 rows, whose tiles go to split-K. Each test asserts that
/// the call kept stream-K scratch, so a GPU or a setting on which a shape
/// runs unsplit fails rather than passing without testing the fix-up.
const SPLIT_SHAPES: [[(&str, usize); 3]; 2] = [
    [("M", 2100), ("N", 3000), ("K", 3000)],
    [("M", 128), ("N", 4096), ("K", 4096)],
];

fn gemm_bias_gelu(s: &Arc<CudaStream>, case: &mut Case<f16>) {
    case.launch(|r, w| kernels::gemm_bias_gelu(s, &r[0], &r[1], &r[2], &mut w[0]))
        .unwrap_or_else(|e| panic!("{}: {e}", case.label));
}

/// The case's output, downloaded after its stream's work.
fn output(s: &Arc<CudaStream>, case: &Case<f16>) -> Vec<f16> {
    s.synchronize().expect("kernels finished");
    s.clone_dtoh(&case.writes[0].1).expect("download")
}

/// One call on its own, checked against the reference; its output, which
/// every later call must match bit for bit (a split tile is summed in the
/// same order whichever of its CTAs adds it up).
fn solo_output(s: &Arc<CudaStream>, case: &mut Case<f16>) -> Vec<f16> {
    case.poison(s);
    gemm_bias_gelu(s, case);
    let err = case.verify(s);
    let scratch = with_stream_workspace(s, |w| w.scratch_bytes());
    eprintln!(
        "{} alone: rel_err {err:.2e}, {scratch} bytes of scratch",
        case.label
    );
    // A launch with the tile counter takes 4 KB of counters at the start;
    // a split adds its partial tiles, at least two slots of one consumer's
    // f32 accumulators (64 x 128 x 4 bytes each).
    assert!(
        scratch >= 64 * 1024,
        "{}: the call was not split ({scratch} bytes of scratch, no partial tiles)",
        case.label
    );
    output(s, case)
}

/// Spins every thread of a block until `ns` nanoseconds of the global timer
/// have passed since it started: a kernel that holds its SMs for a bounded
/// time whatever else runs, and then ends on its own.
const OCCUPIER_PTX: &str = "
.version 7.0
.target sm_75
.address_size 64
.visible .entry occupy(.param .u64 ns)
{
    .reg .pred %p;
    .reg .b64 %rd<5>;
    ld.param.u64 %rd1, [ns];
    mov.u64 %rd2, %globaltimer;
spin:
    mov.u64 %rd3, %globaltimer;
    sub.u64 %rd4, %rd3, %rd2;
    setp.lt.u64 %p, %rd4, %rd1;
    @%p bra spin;
    ret;
}
";

/// Shared memory each occupying block asks for: more than half an SM's
/// (228 KB on sm_90), so that one block holds one SM, and with it no GEMM
/// CTA (which needs most of an SM's) fits beside it.
const OCCUPIER_SMEM: u32 = 120 * 1024;

/// The occupying kernel, loaded into the stream's context.
struct Occupier {
    module: sys::CUmodule,
    function: sys::CUfunction,
}

impl Occupier {
    fn load(s: &Arc<CudaStream>) -> Occupier {
        s.context().bind_to_thread().expect("context");
        let ptx = CString::new(OCCUPIER_PTX).expect("no NUL in the PTX");
        // SAFETY: `ptx` is a NUL-terminated PTX text that outlives the call;
        // the module is unloaded in Drop, after its function's last use.
        let module = unsafe { result::module::load_data(ptx.as_ptr().cast()) }.expect("the PTX loads");
        // SAFETY: `module` was just loaded and names the entry `occupy`.
        let function =
            unsafe { result::module::get_function(module, CString::new("occupy").unwrap()) }.expect("occupy");
        // SAFETY: a live function handle; the value is within sm_90's
        // 227 KB of dynamic shared memory per block.
        unsafe {
            result::function::set_function_attribute(
                function,
                sys::CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                OCCUPIER_SMEM as i32,
            )
        }
        .expect("the occupier's shared memory");
        Occupier { module, function }
    }

    /// Queues `blocks` blocks that each hold an SM for `time` on `s`.
    fn launch(&self, s: &Arc<CudaStream>, blocks: u32, time: Duration) {
        let mut ns = time.as_nanos() as u64;
        let mut params = [(&mut ns as *mut u64).cast::<c_void>()];
        // SAFETY: `occupy` takes one u64, which `params` points at for the
        // duration of the call (the driver copies it); the stream is live.
        unsafe {
            result::launch_kernel(
                self.function,
                (blocks, 1, 1),
                (128, 1, 1),
                OCCUPIER_SMEM,
                s.cu_stream(),
                &mut params,
            )
        }
        .expect("the occupier launches");
    }
}

impl Drop for Occupier {
    fn drop(&mut self) {
        // SAFETY: every launch of its function has finished (the tests
        // synchronize its stream first).
        let _ = unsafe { result::module::unload(self.module) };
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_split_gemm_finishes_while_another_kernel_holds_most_sms() {
    // Long against the GEMMs (well under a millisecond alone), short enough
    // for a test.
    const HOLD: Duration = Duration::from_millis(200);
    let busy_stream = stream();
    let sms = busy_stream
        .context()
        .attribute(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)
        .expect("SM count") as u32;
    let occupier = Occupier::load(&busy_stream);
    for dims in SPLIT_SHAPES {
        // A stream of its own per shape, so that its scratch is this shape's.
        let gemm_stream = stream();
        let mut case = Case::<f16>::new(&gemm_stream, "gemm_bias_gelu", &dims);
        let solo = solo_output(&gemm_stream, &mut case);
        case.poison(&gemm_stream);
        gemm_stream.synchronize().expect("poisoned");
        // All but an eighth of the SMs (16 of 132), held before the GEMM is
        // queued: most of its CTAs wait for others to finish.
        let held = sms - sms / 8;
        let held_until = busy_stream.context().new_event(None).expect("event");
        occupier.launch(&busy_stream, held, HOLD);
        held_until.record(&busy_stream).expect("event");
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !held_until.is_complete(),
            "the occupier ended before the GEMM was queued"
        );
        let started = Instant::now();
        gemm_bias_gelu(&gemm_stream, &mut case);
        let got = output(&gemm_stream, &case);
        let took = started.elapsed();
        // Finished on the SMs left free, not after the occupier let go.
        let overlapped = !held_until.is_complete();
        busy_stream.synchronize().expect("the occupier ended");
        eprintln!(
            "{} beside {held} of {sms} SMs held: {:.2} ms, finished while they were held: {overlapped}",
            case.label,
            took.as_secs_f64() * 1e3
        );
        assert!(got == solo, "{}: differs from the call alone", case.label);
        assert!(
            overlapped,
            "{}: finished only after the occupier ended ({took:?})",
            case.label
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn split_gemms_from_four_threads_on_four_streams_match_their_solo_runs() {
    const SPLIT_CALLS: usize = 100;
    const SPLIT_CHECK_EVERY: usize = 25;
    // Solo calls one at a time, then every thread's calls at once.
    let solo_turn = Mutex::new(());
    let start = Barrier::new(THREADS);
    for dims in SPLIT_SHAPES {
        on_threads(SPLIT_CALLS / SPLIT_CHECK_EVERY, |thread| {
            let s = stream();
            let mut case = Case::<f16>::new(&s, "gemm_bias_gelu", &dims);
            let solo = {
                let _turn = solo_turn.lock().unwrap_or_else(|e| e.into_inner());
                solo_output(&s, &mut case)
            };
            start.wait();
            let mut checks = 0;
            for call in 1..=SPLIT_CALLS {
                let check = call % SPLIT_CHECK_EVERY == 0;
                if check {
                    case.poison(&s);
                }
                gemm_bias_gelu(&s, &mut case);
                if check {
                    assert!(
                        output(&s, &case) == solo,
                        "thread {thread} call {call}: {} differs from its solo run",
                        case.label
                    );
                    checks += 1;
                }
            }
            eprintln!(
                "thread {thread}: {} {SPLIT_CALLS} calls beside the other threads' match",
                case.label
            );
            checks
        });
    }
}

/// M·N = 2^32 elements of output; the rows around element 2^31 (row
/// 131072) and the last row are where a 32-bit signed or unsigned offset
/// would go wrong.
#[test]
#[ignore = "needs a CUDA GPU with 10 GB free"]
fn outputs_past_two_to_the_31_elements_are_computed() {
    const M: usize = 262_144;
    const N: usize = 16_384;
    const K: usize = 64;
    let s = stream();
    let graph = support::graph("gemm_bias_gelu", fusion::ir::DType::F16);
    let host =
        reference::random_bindings(&graph, &[("M", M), ("N", N), ("K", K)], &mut rng()).expect("bindings");
    let upload = |name: &str| -> CudaSlice<f16> { s.clone_htod(&f16::encode(&host[name])).expect("upload") };
    let (x, w, b) = (upload("x"), upload("w"), upload("b"));
    // 8 GiB of output. Zeroed, then the checked rows are poisoned with NaN.
    let mut y = s.alloc_zeros::<f16>(M * N).expect("8 GiB of device memory");
    let boundary = (1usize << 31) / N;
    // Every 64-row band (so every tile), and the rows either side of 2^31.
    let mut rows = fusion::testing::rows_to_check(M, &mut rng());
    rows.extend([1, boundary - 1, boundary, boundary + 1, M - 2]);
    rows.sort_unstable();
    rows.dedup();
    let nan_row = vec![f16::NAN; N];
    for &r in &rows {
        s.memcpy_htod(&nan_row, &mut y.slice_mut(r * N..(r + 1) * N))
            .expect("poison");
    }
    kernels::gemm_bias_gelu(
        &s,
        &Tensor::new(&x, [M, K]).unwrap(),
        &Tensor::new(&w, [N, K]).unwrap(),
        &Tensor::new(&b, [N]).unwrap(),
        &mut TensorMut::new(&mut y, [M, N]).unwrap(),
    )
    .expect("launch");
    s.synchronize().expect("the kernel finished");
    let want = reference::evaluate_rows(&graph, &host, &rows).expect("reference");
    let mut got = Vec::with_capacity(rows.len() * N);
    for &r in &rows {
        got.extend(s.clone_dtoh(&y.slice(r * N..(r + 1) * N)).expect("download"));
    }
    let got = HostTensor::from_f16(&[rows.len(), N], &got).unwrap();
    let err = fusion::testing::compare(&got, &want["y"], fusion::ir::DType::F16, &rows)
        .unwrap_or_else(|e| panic!("gemm_bias_gelu M={M} N={N} K={K}: {e}"));
    eprintln!(
        "gemm_bias_gelu M={M} N={N} K={K} (2^32 outputs): {} rows, every 64-row band and {:?} around 2^31: rel_err {err:.2e}",
        rows.len(),
        [boundary - 1, boundary, boundary + 1]
    );
}
