//! The guard's vendor path on a GPU: each plain-epilogue GEMM graph's plan
//! table with a route that sends every M but the smallest to cuBLASLt
//! (`fusion::plan::VendorRoute`), so that one call set runs both paths,
//! checked in f16 and bf16 against the CPU reference with fresh random
//! inputs and poisoned outputs, as the fused kernels are (tests/gpu.rs);
//! once with weights given per call and once bound (padded rows read at
//! their stride).
//!
//! Run on a machine with a GPU and cuBLASLt: `cargo test --release
//! --features kernels,testing,cublaslt --test gpu_guard -- --ignored`.

mod support;

use fusion::half::{bf16, f16};
use fusion::launch::Workspace;
use fusion::plan::{self, GemmOp, KernelEntry, KernelOp, PlanTable, VendorEpilogue, VendorRoute, Weights};
use fusion::{Tensor, TensorMut, kernels};
use support::{TestElement, check, gemm_shapes, stream};

/// `table` with each GEMM routed to cuBLASLt's `epilogue` for `ms` on the
/// generation the test's device runs.
fn routed(
    table: &'static PlanTable,
    ms: &'static [(u32, u32)],
    epilogue: VendorEpilogue,
) -> &'static PlanTable {
    let arch = fusion::device::arch_among(&stream(), &fusion::device::compiled())
        .expect("a compiled variant runs here");
    let kernels: Vec<KernelEntry> = table
        .kernels
        .iter()
        .map(|kernel| KernelEntry {
            label: kernel.label,
            output: kernel.output,
            op: match &kernel.op {
                KernelOp::Gemm(gemm) => KernelOp::Gemm(GemmOp {
                    vendor: VendorRoute {
                        arch,
                        ms,
                        epilogue,
                        per_call: None,
                    },
                    ..*gemm
                }),
                other => panic!(
                    "{}: a plain-epilogue graph is one GEMM, not {other:?}",
                    kernel.label
                ),
            },
            launchers: kernel.launchers,
        })
        .collect();
    Box::leak(Box::new(PlanTable {
        kernels: Box::leak(kernels.into_boxed_slice()),
        ..*table
    }))
}

/// Every M above 1 on the vendor path; M = 1 fused.
const ABOVE_ONE: &[(u32, u32)] = &[(2, u32::MAX)];

/// `name`'s graph through `table` (routed) at every GEMM shape of the
/// suite, in `T`, against the reference.
fn check_routed<T: TestElement>(name: &str, table: &'static PlanTable) {
    assert!(
        fusion::vendor::routes_enabled(),
        "the vendor path is off: build with the feature `cublaslt`, leave FUSION_GUARD unset, and make libcublasLt loadable"
    );
    let s = stream();
    let mut workspace = Workspace::new();
    for (m, n, k) in gemm_shapes() {
        let dims = [("M", m), ("N", n), ("K", k)];
        check::<T>(&s, name, &dims, |r, w| {
            let (inputs, weights) = r.split_at(table.inputs.len());
            let inputs: Vec<&Tensor<'_, T>> = inputs.iter().collect();
            let weights: Vec<&Tensor<'_, T>> = weights.iter().collect();
            let mut writes: Vec<&mut TensorMut<'_, T>> = w.iter_mut().collect();
            // SAFETY: the table is the generated one, its GEMMs given a
            // route; the vendor path reads the operands the fused kernel
            // reads.
            unsafe {
                plan::run(
                    table,
                    &mut workspace,
                    Weights::PerCall(&weights),
                    &s,
                    &inputs,
                    &mut writes,
                )
            }
        });
    }
}

/// [`check_routed`] with the weights bound first, as a graph struct binds
/// them: where the struct pads a weight's rows (sm90, a row length whose
/// bytes are not a multiple of 128), cuBLASLt reads the padded copy at its
/// row stride.
fn check_routed_bound<T: TestElement>(name: &str, table: &'static PlanTable) {
    assert!(fusion::vendor::routes_enabled(), "the vendor path is off");
    let s = stream();
    let mut workspace = Workspace::new();
    for (m, n, k) in gemm_shapes() {
        let dims = [("M", m), ("N", n), ("K", k)];
        check::<T>(&s, name, &dims, |r, w| {
            let (inputs, weights) = r.split_at(table.inputs.len());
            let inputs: Vec<&Tensor<'_, T>> = inputs.iter().collect();
            let mut writes: Vec<&mut TensorMut<'_, T>> = w.iter_mut().collect();
            // SAFETY: as in `check_routed`; the weights are the table's,
            // in its order.
            unsafe {
                let bound = plan::bind(table, &s, weights.to_vec())?;
                plan::run(
                    table,
                    &mut workspace,
                    Weights::Bound(&bound),
                    &s,
                    &inputs,
                    &mut writes,
                )
            }
        });
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bound_weights_padded_rows_on_the_vendor_path() {
    let table = |t| routed(t, ABOVE_ONE, VendorEpilogue::GeluBias);
    check_routed_bound::<f16>("gemm_bias_gelu", table(kernels::GemmBiasGelu::<f16>::PLAN));
    check_routed_bound::<bf16>("gemm_bias_gelu", table(kernels::GemmBiasGelu::<bf16>::PLAN));
    let table = |t| routed(t, ABOVE_ONE, VendorEpilogue::None);
    check_routed_bound::<f16>("gemm_residual", table(kernels::GemmResidual::<f16>::PLAN));
    check_routed_bound::<bf16>("gemm_residual", table(kernels::GemmResidual::<bf16>::PLAN));
}

macro_rules! guard_test {
    ($test:ident, $graph:literal, $plan:ident, $epilogue:ident) => {
        #[test]
        #[ignore = "needs a CUDA GPU"]
        fn $test() {
            check_routed::<f16>(
                $graph,
                routed(
                    kernels::$plan::<f16>::PLAN,
                    ABOVE_ONE,
                    VendorEpilogue::$epilogue,
                ),
            );
            check_routed::<bf16>(
                $graph,
                routed(
                    kernels::$plan::<bf16>::PLAN,
                    ABOVE_ONE,
                    VendorEpilogue::$epilogue,
                ),
            );
        }
    };
}

guard_test!(gemm_on_the_vendor_path, "gemm", Gemm, None);
guard_test!(gemm_bias_on_the_vendor_path, "gemm_bias", GemmBias, Bias);
guard_test!(
    gemm_bias_gelu_on_the_vendor_path,
    "gemm_bias_gelu",
    GemmBiasGelu,
    GeluBias
);
guard_test!(
    gemm_bias_relu_on_the_vendor_path,
    "gemm_bias_relu",
    GemmBiasRelu,
    ReluBias
);
guard_test!(gemm_gelu_on_the_vendor_path, "gemm_gelu", GemmGelu, Gelu);
guard_test!(
    gemm_bias_residual_on_the_vendor_path,
    "gemm_bias_residual",
    GemmBiasResidual,
    Bias
);
guard_test!(
    gemm_residual_on_the_vendor_path,
    "gemm_residual",
    GemmResidual,
    None
);
