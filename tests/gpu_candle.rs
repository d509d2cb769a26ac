//! Fused graphs on candle tensors (feature `candle`), on GPU 0: the SwiGLU
//! block bound to weights candle holds and a two-input graph called on
//! [batch, seq, hidden] candle tensors, each compared with the CPU
//! reference (fresh random inputs, outputs poisoned before the launch) and
//! with the same graph computed by candle's own unfused ops; and the candle
//! tensors a fused graph cannot read in place, refused by name.
//!
//! Run on a machine with a GPU:
//! `cargo test --release --features candle,kernels,testing --test gpu_candle -- --ignored`.

mod support;

use candle_core::{DType as CandleDType, Device, Tensor as CandleTensor};
use fusion::core::reference::{self, Bindings, HostTensor};
use fusion::cudarc::driver::result::memset_d8_async;
use fusion::half::{bf16, f16};
use fusion::{TensorMut, kernels, testing};
use support::TestElement;

fn gpu() -> Device {
    Device::new_cuda(0).unwrap_or_else(|e| panic!("no CUDA device: {e}"))
}

/// Host tensor `name` of `host` as a candle tensor of element type `T` with
/// `dims` (the host tensor's own shape when `None`).
fn upload<T: TestElement + candle_core::WithDType>(
    device: &Device,
    host: &Bindings,
    name: &str,
    dims: Option<&[usize]>,
) -> CandleTensor {
    let t = &host[name];
    let dims = dims.unwrap_or(&t.shape);
    CandleTensor::from_vec(T::encode(t), dims, device).unwrap_or_else(|e| panic!("upload {name}: {e}"))
}

/// A candle output as a host tensor of `rows` x last-axis.
fn download<T: TestElement + candle_core::WithDType>(t: &CandleTensor) -> HostTensor {
    let dims = t.dims();
    let cols = dims[dims.len() - 1];
    let values = t.flatten_all().and_then(|t| t.to_vec1::<T>()).expect("download");
    T::decode(&[values.len() / cols, cols], &values).expect("a matrix")
}

/// Writes NaN (all bits set, in f16 and in bf16) over an output before the
/// launch, so that an element the launch leaves unwritten fails the check.
fn poison<T: fusion::Element>(stream: &fusion::cudarc::driver::CudaStream, y: &mut TensorMut<'_, T>) {
    let bytes = y.shape().bytes::<T>().expect("a test shape fits");
    let (ptr, _sync) = y.device_ptr_mut(stream);
    // SAFETY: `ptr` is the output's own `bytes` of device memory, written on
    // the stream the launch that follows runs on.
    unsafe { memset_d8_async(ptr, 0xFF, bytes, stream.cu_stream()) }.expect("memset");
}

/// `got` against the CPU reference on the rows fusion's GPU tests compare,
/// and against candle's unfused result within twice the reference's
/// relative L2 bound: both accumulate in f32 and round each op's result
/// once, so each is a few roundings from the exact value (a failure here
/// with the reference check passing would be candle's path, which is why
/// candle's own distance to the reference is printed).
fn verify<T: TestElement>(
    label: &str,
    got: &HostTensor,
    candle: &HostTensor,
    want_all: &dyn Fn(&[usize]) -> HostTensor,
) {
    let rows = testing::rows_to_check(got.shape[0], &mut support::rng());
    let pick = |t: &HostTensor| t.select_rows(&rows).expect("rows");
    let want = want_all(&rows);
    let err = testing::compare(&pick(got), &want, T::DTYPE, &rows)
        .unwrap_or_else(|e| panic!("{label}: fused: {e}"));
    // Candle's own distance to the reference is printed, not asserted.
    let candle_err = testing::compare(&pick(candle), &want, T::DTYPE, &rows).map_or_else(
        |e| format!("outside the bounds ({e})"),
        |err| format!("{err:.2e}"),
    );
    let between = relative_l2(&pick(got), &pick(candle));
    let limit = 2.0 * testing::relative_l2_limit(T::DTYPE);
    assert!(
        between <= limit,
        "{label}: fused and candle's ops differ by {between:.2e} (relative L2), over {limit:.1e}"
    );
    eprintln!("ok  {label:<44} rel_err {err:.2e}, candle's {candle_err}, between {between:.2e}");
}

fn relative_l2(a: &HostTensor, b: &HostTensor) -> f64 {
    let (num, den) = a
        .data
        .iter()
        .zip(&b.data)
        .fold((0.0, 0.0), |(n, d), (&x, &y)| (n + (x - y) * (x - y), d + y * y));
    (num / den).sqrt()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn swiglu_ffn_bound_to_candle_weights() {
    swiglu_ffn::<f16>();
    swiglu_ffn::<bf16>();
}

fn swiglu_ffn<T: TestElement + fusion::candle::CandleElement>() {
    let device = gpu();
    let stream = device.as_cuda_device().expect("cuda").cuda_stream();
    let dtype = <T as fusion::Element>::DTYPE;
    let graph = support::graph("swiglu_ffn", dtype);
    for (batch, seq) in [(1, 1), (1, 77), (3, 100)] {
        let m = batch * seq;
        let host = reference::random_bindings(&graph, &[("M", m)], &mut support::rng()).expect("inputs");
        let d = host["x"].shape[1];
        let up = |name: &str| upload::<T>(&device, &host, name, None);
        let (w_gate, w_up, w_down, b_down) = (up("w_gate"), up("w_up"), up("w_down"), up("b_down"));
        let x = upload::<T>(&device, &host, "x", Some(&[batch, seq, d]));

        let lent = fusion::candle::Views::new(&[&w_gate, &w_up, &w_down, &b_down]).expect("views");
        let weights = kernels::SwigluFfnWeights {
            w_gate: lent.tensor(0).expect("w_gate"),
            w_up: lent.tensor(1).expect("w_up"),
            w_down: lent.tensor(2).expect("w_down"),
            b_down: lent.tensor(3).expect("b_down"),
        };
        let mut ffn = kernels::SwigluFfn::<T>::new(&stream, weights).expect("bind");
        let [y] = fusion::candle::call([&x], [x.dims()], |s, [x], [y]| {
            poison(s, y);
            ffn.run(s, x, y)
        })
        .expect("fused call");
        assert_eq!(y.dims(), &[batch, seq, d]);

        let rows = x.flatten_to(1).expect("rows");
        let gate = rows
            .matmul(&w_gate.t().expect("t"))
            .and_then(|g| g.silu())
            .expect("gate");
        let upj = rows.matmul(&w_up.t().expect("t")).expect("up");
        let unfused = (gate * upj)
            .and_then(|h| h.matmul(&w_down.t()?))
            .and_then(|z| z.broadcast_add(&b_down))
            .and_then(|z| z + &rows)
            .expect("candle's ops");
        verify::<T>(
            &format!("swiglu_ffn {dtype} [{batch}, {seq}, {d}]"),
            &download::<T>(&y),
            &download::<T>(&unfused),
            &|r| reference::evaluate_rows(&graph, &host, r).expect("reference")["y"].clone(),
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn a_two_input_graph_on_batched_candle_tensors() {
    residual::<f16>();
    residual::<bf16>();
}

fn residual<T: TestElement + fusion::candle::CandleElement>() {
    let device = gpu();
    let dtype = <T as fusion::Element>::DTYPE;
    let graph = support::graph("gemm_bias_residual", dtype);
    for (batch, seq, n, k) in [(2, 3, 136, 72), (4, 130, 1000, 776)] {
        let dims = [("M", batch * seq), ("N", n), ("K", k)];
        let host = reference::random_bindings(&graph, &dims, &mut support::rng()).expect("inputs");
        // x lies 3 rows into its storage (a narrowed view), so a view that
        // missed candle's start offset would read the wrong rows.
        let padded = CandleTensor::cat(
            &[
                &CandleTensor::ones((3, k), <T as candle_core::WithDType>::DTYPE, &device).expect("padding"),
                &upload::<T>(&device, &host, "x", None),
            ],
            0,
        )
        .expect("cat");
        let x = padded
            .narrow(0, 3, batch * seq)
            .and_then(|x| x.reshape((batch, seq, k)))
            .expect("a view 3 rows in");
        assert!(
            x.layout().start_offset() > 0,
            "the input starts inside its storage"
        );
        let r = upload::<T>(&device, &host, "r", Some(&[batch, seq, n]));
        let (w, b) = (
            upload::<T>(&device, &host, "w", None),
            upload::<T>(&device, &host, "b", None),
        );
        let [y] = fusion::candle::call::<T, 4, 1>([&x, &r, &w, &b], [r.dims()], |s, [x, r, w, b], [y]| {
            poison(s, y);
            kernels::gemm_bias_residual(s, x, r, w, b, y)
        })
        .expect("fused call");
        let unfused = x
            .flatten_to(1)
            .and_then(|x| x.matmul(&w.t()?))
            .and_then(|z| z.broadcast_add(&b))
            .and_then(|z| z + r.flatten_to(1)?)
            .expect("candle's ops");
        verify::<T>(
            &format!("gemm_bias_residual {dtype} [{batch}, {seq}] n={n} k={k}"),
            &download::<T>(&y),
            &download::<T>(&unfused),
            &|rows| reference::evaluate_rows(&graph, &host, rows).expect("reference")["y"].clone(),
        );
    }
}

/// Each candle tensor a fused graph cannot read in place is refused with
/// `Error::CandleTensor`, naming which one and why, before any launch.
#[test]
#[ignore = "needs a CUDA GPU"]
fn candle_tensors_that_cannot_be_read_in_place_are_named() {
    let device = gpu();
    let x = CandleTensor::ones((8, 16), CandleDType::F16, &device).expect("x");
    let refusal = |inputs: &[&CandleTensor], dims: &[usize]| -> String {
        let [a, b] = [inputs[0], inputs[inputs.len() - 1]];
        let result = fusion::candle::call::<f16, 2, 1>([a, b], [dims], |_, _, _| panic!("launched"));
        assert!(
            matches!(result, Err(fusion::Error::CandleTensor { .. })),
            "expected Error::CandleTensor, got {result:?}"
        );
        result.expect_err("refused").to_string()
    };
    let on_cpu = CandleTensor::ones((8, 16), CandleDType::F16, &Device::Cpu).expect("cpu");
    assert!(refusal(&[&x, &on_cpu], &[8, 16]).contains("input 1 is on Cpu"));
    let wide = x.to_dtype(CandleDType::BF16).expect("bf16");
    assert!(refusal(&[&wide, &x], &[8, 16]).contains("input 0 holds BF16"));
    let transposed = x.t().expect("t");
    assert!(refusal(&[&x, &transposed], &[16, 8]).contains("not contiguous"));
    assert!(refusal(&[&x, &x], &[]).contains("output 0 has rank 0"));
    // A contiguous narrowing (whole rows) is read in place.
    let rows = x.narrow(0, 2, 4).expect("narrow");
    let [y] = fusion::candle::call::<f16, 1, 1>([&rows], [rows.dims()], |_, [x], [_]| {
        assert_eq!(x.shape(), fusion::Shape::Matrix(4, 16));
        Ok(())
    })
    .expect("a row range is contiguous");
    assert_eq!(y.dims(), &[4, 16]);
}
