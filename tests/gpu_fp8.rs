//! GPU correctness of the sm90 FP8 GEMMs (`graphs/fp8/`), which the built-in
//! library holds when it is built with `FUSION_FP8=experimental` for sm90
//! (build.rs then sets `--cfg fusion_fp8`; without it this binary has no
//! tests). The run time does not bind FP8 tensors yet, so each graph's
//! launcher (`fusion::kernels::<graph>::kernel_0`) is called through abi.h's
//! params, with its workspace query, on fresh random inputs: E4M3 codes
//! quantized on the host by the reference's `fp8` (round to nearest even),
//! f32 scales drawn from [0.5, 1] times each operand's bound over 448 (never
//! 1), a bf16 bias, and an output poisoned with NaN before the launch.
//!
//! Each output is compared element by element with the CPU reference
//! (`fusion::testing::compare` for a bf16 output): the kernel multiplies the
//! E4M3 values exactly, sums each k-block of 128 products in wgmma (which
//! keeps about 14 bits: some 2⁻¹³ of the block's sum) and adds the blocks
//! in f32, so what separates it from the reference (f64 sums of the
//! dequantized operands) is the bf16 rounding of the output (u = 2⁻⁸ of
//! each element), the blocks' sums (about 2⁻¹³ of the row's scale, their
//! errors independent), the f32 adds and the scales' one f32 product per
//! element (a few 2⁻²⁴), and GELU's tanh.approx (about 4e-6 relative): the
//! bound, 4·u·(|want| + the row's rms), is bf16's, not a loose 1e-2. It
//! does not tell the blocks' f32 adds from a K loop that summed every
//! block in wgmma's accumulators alone: at these K (up to 3008) that
//! loop's error stays inside the bound too; a long K of same-sign
//! operands would be needed for that.
//!
//! Per graph: the weight scaled per tensor (`fp8_gemm_bias`) and per output
//! channel (`fp8_gemm_bias_channel`, and with GELU `fp8_gemm_bias_gelu`);
//! M = 1, 77, 300 and 1000 (none a multiple of a tile's rows) at ragged N
//! and K (K not a multiple of the 128-element k-block), K of one partial
//! k-block (48) and of whole ones (1024), and M = 2100 at N =
//! 3000 (408 tiles of 128x128, 12 past three waves on 132 SMs, which run
//! whole unless stream-K over the last wave is asked for); each with the workspace the query
//! asks for and without one (every tile whole, the tiles fixed at launch).
//!
//! Run on an H100 or H200: `FUSION_FP8=experimental cargo test --release
//! --features kernels,testing,sm90 --test gpu_fp8 -- --ignored` (see
//! tests/support for the environment variables; `FUSION_TEST_SIZE=tiny`:
//! M = 1 and 77 at N = 136, K = 144 only).

#![cfg(fusion_fp8)]

mod support;

use fusion::abi::fusion_gemm_params;
use fusion::core::ir::DType;
use fusion::core::reference;
use fusion::cudarc::driver::{DevicePtr, DevicePtrMut};
use fusion::half::bf16;
use fusion::kernels;
use fusion::testing::{self, HostElement};
use std::ffi::c_void;
use support::{rng, stream, tiny};

/// A launcher and its workspace query (abi.h).
type Launch = unsafe fn(*const fusion_gemm_params, *mut c_void) -> i32;
type Query = unsafe fn(*const fusion_gemm_params, *mut c_void, *mut u64) -> i32;

/// (M, N, K): M not a multiple of the tiles' 64 or 128 rows; N a multiple
/// of 8, K of 16 (TMA's 16-byte rows); N never a multiple of the tiles'
/// columns, K a multiple of the 128-element k-block once (1024) and under
/// one k-block once (48).
fn shapes() -> Vec<(usize, usize, usize)> {
    if tiny() {
        return vec![(1, 136, 144), (77, 136, 144)];
    }
    let mut shapes = Vec::new();
    for m in [1, 77, 300, 1000] {
        for (n, k) in [(136, 144), (520, 3008), (3000, 1040), (136, 48), (520, 1024)] {
            shapes.push((m, n, k));
        }
    }
    shapes.push((2100, 3000, 1040));
    shapes
}

/// One launch of `graph`'s kernel at (m, n, k), with the workspace its
/// query asks for or (`workspace` false) none, checked against the CPU
/// reference; returns the relative L2 error.
fn check(
    graph_name: &str,
    launch: Launch,
    query: Query,
    (m, n, k): (usize, usize, usize),
    workspace: bool,
) -> f64 {
    let s = stream();
    let path = testing::graphs_dir()
        .join("fp8")
        .join(format!("{graph_name}.toml"));
    let graph = fusion::core::load_toml_graph(&path).unwrap_or_else(|e| panic!("{e}"));
    let mut rng = rng();
    let host = reference::random_bindings(&graph, &[("M", m), ("N", n), ("K", k)], &mut rng)
        .unwrap_or_else(|e| panic!("{e}"));
    let label = format!(
        "{graph_name} M={m} N={n} K={k}{}",
        if workspace { "" } else { " without a workspace" }
    );
    for scale in ["x_scale", "w_scale"] {
        assert!(
            host[scale].data.iter().all(|&v| v != 1.0),
            "{label}: `{scale}` is not 1"
        );
    }
    let codes = |name: &str| s.clone_htod(&host[name].to_f8e4m3()).expect("upload");
    let floats = |name: &str| {
        let values: Vec<f32> = host[name].data.iter().map(|&v| v as f32).collect();
        s.clone_htod(&values).expect("upload")
    };
    let (x, w, x_scale, w_scale) = (codes("x"), codes("w"), floats("x_scale"), floats("w_scale"));
    let b = s.clone_htod(&bf16::encode(&host["b"])).expect("upload");
    let mut y = s.clone_htod(&vec![bf16::NAN; m * n]).expect("poison");
    let to_i64 = |v: usize| i64::try_from(v).expect("a test size");
    {
        let (a_ptr, _a) = x.device_ptr(&s);
        let (b_ptr, _b) = w.device_ptr(&s);
        let (bias_ptr, _bias) = b.device_ptr(&s);
        let (scale_a_ptr, _scale_a) = x_scale.device_ptr(&s);
        let (scale_b_ptr, _scale_b) = w_scale.device_ptr(&s);
        let (c_ptr, _c) = y.device_ptr_mut(&s);
        let mut p = fusion_gemm_params {
            a: a_ptr as *const c_void,
            b: b_ptr as *const c_void,
            c: c_ptr as *mut c_void,
            bias: bias_ptr as *const c_void,
            scale_a: scale_a_ptr as *const c_void,
            scale_b: scale_b_ptr as *const c_void,
            m: to_i64(m),
            n: to_i64(n),
            k: to_i64(k),
            ..fusion_gemm_params::default()
        };
        let handle = s.cu_stream() as *mut c_void;
        let mut bytes = 0u64;
        // SAFETY: `p` points at live device buffers of the shapes it gives.
        let rc = unsafe { query(&p, handle, &mut bytes) };
        assert_eq!(rc, 0, "{label}: the workspace query returned cudaError {rc}");
        let scratch = (workspace && bytes > 0).then(|| {
            s.alloc_zeros::<u8>(usize::try_from(bytes).expect("a size"))
                .expect("workspace")
        });
        let scratch_ptr = scratch.as_ref().map(|scratch| scratch.device_ptr(&s));
        if let Some((ptr, _)) = &scratch_ptr {
            p.workspace = *ptr as *mut c_void;
            p.workspace_bytes = bytes;
        }
        // SAFETY: as above, and the workspace is the query's size, zeroed.
        let rc = unsafe { launch(&p, handle) };
        assert_eq!(rc, 0, "{label}: the launcher returned cudaError {rc}");
        s.synchronize().expect("the kernel ran");
    }
    let rows = testing::rows_to_check(m, &mut rng);
    let want = reference::evaluate_rows(&graph, &host, &rows).expect("reference");
    let got = bf16::decode(&[m, n], &s.clone_dtoh(&y).expect("download"))
        .and_then(|t| t.select_rows(&rows))
        .expect("shape matches");
    testing::compare(&got, &want["y"], DType::BF16, &rows).unwrap_or_else(|e| panic!("{label}: {e}"))
}

/// Every shape, with and without a workspace.
fn check_all(graph_name: &str, launch: Launch, query: Query) {
    let mut worst = 0.0f64;
    for shape in shapes() {
        for workspace in [true, false] {
            worst = worst.max(check(graph_name, launch, query, shape, workspace));
        }
    }
    eprintln!("{graph_name}: worst relative L2 error {worst:.2e}");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemm_bias_weight_scaled_per_tensor() {
    use kernels::fp8_gemm_bias::{kernel_0, kernel_0_workspace_bytes};
    check_all("fp8_gemm_bias", kernel_0, kernel_0_workspace_bytes);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemm_bias_weight_scaled_per_channel() {
    use kernels::fp8_gemm_bias_channel::{kernel_0, kernel_0_workspace_bytes};
    check_all("fp8_gemm_bias_channel", kernel_0, kernel_0_workspace_bytes);
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn fp8_gemm_bias_gelu_weight_scaled_per_channel() {
    use kernels::fp8_gemm_bias_gelu::{kernel_0, kernel_0_workspace_bytes};
    check_all("fp8_gemm_bias_gelu", kernel_0, kernel_0_workspace_bytes);
}
