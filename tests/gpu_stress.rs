//! The GPU under load: one compiled graph from several host threads on
//! several streams at once, and an output of more than 2^31 (and up to
//! 2^32) elements, where a 32-bit index anywhere in a kernel would write to
//! the wrong place.
//!
//! Run on a machine with a GPU: `cargo test --release --test gpu_stress --
//! --ignored --test-threads 1` (see tests/support for the environment).

mod support;

use fusion::core::reference::{self, HostTensor};
use fusion::cudarc::driver::{CudaSlice, CudaStream};
use fusion::half::f16;
use fusion::{Tensor, TensorMut, kernels};
use std::sync::Arc;
use support::{Case, TestElement, rng, stream};

const THREADS: usize = 4;
const CALLS: usize = 1000;
/// Calls after which a thread checks its output (and the last one).
const CHECK_EVERY: usize = 250;

/// Runs `thread(index)` on `THREADS` threads at once; each returns how
/// many checks it made, which must be `CALLS / CHECK_EVERY`.
fn on_threads(thread: impl Fn(usize) -> usize + Sync) {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|index| {
                let thread = &thread;
                scope.spawn(move || thread(index))
            })
            .collect();
        for (thread, handle) in handles.into_iter().enumerate() {
            let checks = handle
                .join()
                .unwrap_or_else(|_| panic!("thread {thread} failed (see its message above)"));
            assert_eq!(checks, CALLS / CHECK_EVERY, "thread {thread}");
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
    on_threads(|thread| {
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
    on_threads(|thread| {
        let s = stream();
        let mut case = Case::<f16>::new(&s, "swiglu_ffn", &[("M", 24)]);
        let weights = case.weight_copies(&s);
        let mut ffn = kernels::SwigluFfn::new(&s, Case::swiglu_ffn_weights(&weights)).expect("weights bind");
        calls(thread, &s, &mut case, |case| {
            case.launch(|r, w| ffn.run(&s, &r[0], &mut w[0]))
        })
    });
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
