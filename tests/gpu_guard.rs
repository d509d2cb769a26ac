//! The guard's vendor path on a GPU: each plain-epilogue GEMM graph's plan
//! table with a route that sends every M but the smallest to cuBLASLt
//! (`fusion::plan::VendorRoute`), so that one call set runs both paths,
//! checked in f16 and bf16 against the CPU reference with fresh random
//! inputs and poisoned outputs, as the fused kernels are (tests/gpu.rs);
//! once with weights given per call and once bound (padded rows read at
//! their stride).
//!
//! The verdict per call, where N or K is dynamic (`fusion::plan::RouteModel`):
//! plain-epilogue graphs at shapes that the verdict sends both ways, once
//! with a vendor model that splits the shapes by their predicted fused time
//! (so that both paths run, whatever the shipped models say) and once with
//! the shipped models, as a build with `FUSION_GUARD=on` writes them (such
//! a build's own tables are checked to carry those).
//!
//! The norm GEMMs (`layernorm_gemm`, `rmsnorm_gemm`) likewise, their route
//! given the launchers of the library's standalone norm kernel of each
//! variant (which the vendor path runs before cuBLASLt), with their gamma
//! and beta per call (the norm with its affine, then cuBLASLt on W) and
//! bound (the norm folded into W': the rows normalized without the affine,
//! then cuBLASLt on W' with the fold's column terms as its bias), at the
//! suite's shapes and at rows of small variance, where a wrong eps fails.
//!
//! Run on a machine with a GPU and cuBLASLt: `cargo test --release
//! --features kernels,testing,cublaslt --test gpu_guard -- --ignored`, and
//! once more with `FUSION_GUARD=on` (and `FUSION_SELECT=model`) in the
//! build's environment, which checks the routes that build wrote.

mod support;

use fusion::abi::{Launcher, fusion_norm_params};
use fusion::core::fuse::{self, Composition};
use fusion::core::gemm_model::{UnitTiers, bucket_of};
use fusion::core::guard_model::{GuardCosts, VendorCosts};
use fusion::core::reference::{Bindings, Intermediates};
use fusion::core::select::guard::{Guard, VendorPath};
use fusion::core::select::{self, KernelKind};
use fusion::half::{bf16, f16};
use fusion::launch::Workspace;
use fusion::plan::{
    GemmOp, KernelEntry, KernelOp, Launchers, PlanTable, RouteModel, VendorEpilogue, VendorRoute,
};
use fusion::{Arch, kernels};
use support::{TestElement, check_adjusted, gemm_shapes, run_table, stream};

/// `table` with each GEMM routed to cuBLASLt's `epilogue` for `ms` on the
/// generation the test's device runs, after the standalone norm kernels
/// `norm` (per variant; empty for a GEMM without a norm prologue).
fn routed(
    table: &'static PlanTable,
    ms: &'static [(u32, u32)],
    epilogue: VendorEpilogue,
    norm: &'static [Launcher<fusion_norm_params>],
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
                        norm,
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

/// The launchers of the library's standalone norm graph `norm_table` (one
/// norm kernel), which are those of `table`'s variants, index for index.
fn norm_launchers(
    table: &PlanTable,
    norm_table: &'static PlanTable,
) -> &'static [Launcher<fusion_norm_params>] {
    assert_eq!(table.variants, norm_table.variants, "one library's variants");
    let [kernel] = norm_table.kernels else {
        panic!("{}: a standalone norm is one kernel", norm_table.graph.name);
    };
    let Launchers::Norm(launch) = kernel.launchers else {
        panic!("{}: not a norm kernel", kernel.label);
    };
    launch
}

/// What the reference rounds to compute what `table` computes in a call:
/// a norm GEMM's normalized rows in T where its gamma comes with the call
/// (unbound: the norm kernel writes them, on either path); nothing else.
fn intermediates(table: &PlanTable, bound: bool) -> Intermediates {
    let norm = table
        .kernels
        .iter()
        .any(|kernel| matches!(kernel.op, KernelOp::Gemm(GemmOp { gamma: Some(_), .. })));
    if norm && !bound {
        Intermediates::RoundedNorms
    } else {
        Intermediates::Exact
    }
}

/// `name`'s graph through `table` at `dims`, in `T`, against the
/// reference, its inputs changed by `adjust`; with `bound`, the weights
/// bound first, as a graph struct binds them.
fn check_table<T: TestElement>(
    name: &str,
    table: &'static PlanTable,
    dims: &[(&str, usize)],
    bound: bool,
    adjust: impl FnOnce(&mut Bindings),
) {
    let s = stream();
    let mut workspace = Workspace::new();
    // SAFETY: the table is the generated one, its GEMMs given a route;
    // the vendor path reads the operands the fused kernel reads.
    check_adjusted::<T>(
        &s,
        name,
        dims,
        intermediates(table, bound),
        adjust,
        |r, w| unsafe { run_table(table, &s, &mut workspace, r, w, bound) },
    );
}

/// `name`'s graph through `table` (routed) at every GEMM shape of the
/// suite, in `T`, against the reference; with `bound`, the weights bound
/// first, as a graph struct binds them: where the struct pads a weight's
/// rows (sm90, a row length whose bytes are not a multiple of 128),
/// cuBLASLt reads the padded copy at its row stride, and a norm folded
/// into the weight reaches cuBLASLt as W' and its column terms.
fn check_routed<T: TestElement>(name: &str, table: &'static PlanTable, bound: bool) {
    assert!(
        fusion::vendor::routes_enabled(),
        "the vendor path is off: build with the feature `cublaslt`, leave FUSION_GUARD unset, and make libcublasLt loadable"
    );
    for (m, n, k) in gemm_shapes() {
        check_table::<T>(name, table, &[("M", m), ("N", n), ("K", k)], bound, |_| {});
    }
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn bound_weights_padded_rows_on_the_vendor_path() {
    let table = |t| routed(t, ABOVE_ONE, VendorEpilogue::GeluBias, &[]);
    check_routed::<f16>("gemm_bias_gelu", table(kernels::GemmBiasGelu::<f16>::PLAN), true);
    check_routed::<bf16>("gemm_bias_gelu", table(kernels::GemmBiasGelu::<bf16>::PLAN), true);
    let table = |t| routed(t, ABOVE_ONE, VendorEpilogue::None, &[]);
    check_routed::<f16>("gemm_residual", table(kernels::GemmResidual::<f16>::PLAN), true);
    check_routed::<bf16>("gemm_residual", table(kernels::GemmResidual::<bf16>::PLAN), true);
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
                    &[],
                ),
                false,
            );
            check_routed::<bf16>(
                $graph,
                routed(
                    kernels::$plan::<bf16>::PLAN,
                    ABOVE_ONE,
                    VendorEpilogue::$epilogue,
                    &[],
                ),
                false,
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

/// The shapes of the small-variance cases (`support::small_variance_norm_inputs`):
/// rows of 136 to 3000 elements, each M on the vendor path (every M above
/// 1 is routed).
const SMALL_VARIANCE_SHAPES: [(usize, usize, usize); 3] =
    [(13, 520, 1032), (77, 136, 3000), (1000, 3000, 136)];

/// A norm GEMM `name` on the vendor path for every M above 1, its norm
/// kernel from `norm_table` (the library's standalone norm of that kind),
/// in `T`: with gamma and beta per call and bound (folded), at the suite's
/// shapes and at rows of small variance.
fn check_norm_routed<T: TestElement>(name: &str, table: &'static PlanTable, norm_table: &'static PlanTable) {
    let table = routed(
        table,
        ABOVE_ONE,
        VendorEpilogue::None,
        norm_launchers(table, norm_table),
    );
    for bound in [false, true] {
        check_routed::<T>(name, table, bound);
        for (m, n, k) in SMALL_VARIANCE_SHAPES {
            let dims = [("M", m), ("N", n), ("K", k)];
            check_table::<T>(name, table, &dims, bound, support::small_variance_norm_inputs);
        }
    }
}

macro_rules! norm_guard_test {
    ($test:ident, $graph:literal, $plan:ident, $norm:ident) => {
        #[test]
        #[ignore = "needs a CUDA GPU"]
        fn $test() {
            check_norm_routed::<f16>(
                $graph,
                kernels::$plan::<f16>::PLAN,
                kernels::$norm::<f16>::PLAN,
            );
            check_norm_routed::<bf16>(
                $graph,
                kernels::$plan::<bf16>::PLAN,
                kernels::$norm::<bf16>::PLAN,
            );
        }
    };
}

norm_guard_test!(
    layernorm_gemm_on_the_vendor_path,
    "layernorm_gemm",
    LayernormGemm,
    Layernorm
);
norm_guard_test!(
    rmsnorm_gemm_on_the_vendor_path,
    "rmsnorm_gemm",
    RmsnormGemm,
    Rmsnorm
);

/// The generation this test's device runs.
fn device_arch() -> Arch {
    fusion::device::arch_among(&stream(), &fusion::device::compiled()).expect("a compiled variant runs here")
}

/// `table`, the plan of the shipped graph `name` (one GEMM whose epilogue
/// cuBLASLt computes, after the norm kernels `norm` where it has a norm
/// prologue), with its GEMM's verdict left to the call: cuBLASLt's
/// `epilogue`, the vendor path's work as the guard counts it, the fused
/// kernel's costs shipped and the vendor path's `vendor` (the shipped ones
/// where `None`), and per variant of this device's generation the tiers of
/// the shipped table's config (sm90's config on another generation, whose
/// models the verdict then borrows). Where the build wrote a route left to
/// the call (`FUSION_GUARD=on`), it is checked to be the shipped models'
/// first, with the norm kernels of a norm GEMM.
fn per_call(
    name: &str,
    table: &'static PlanTable,
    (epilogue, norm): (VendorEpilogue, &'static [Launcher<fusion_norm_params>]),
    vendor: Option<VendorCosts>,
) -> &'static PlanTable {
    let plan = fuse::plan(support::graph(name, table.variants[0].0));
    let arch = device_arch();
    let shipped = Guard::shipped_sm90().costs();
    let [kernel] = table.kernels else {
        panic!("{name}: a plain-epilogue graph is one GEMM");
    };
    let (KernelOp::Gemm(gemm), Composition::Gemm(composition)) = (&kernel.op, &plan.kernels[0].composition)
    else {
        panic!("{name}: {} is not a GEMM", kernel.label);
    };
    let work = VendorPath::of(composition).work();
    let units: Vec<Option<UnitTiers>> = table
        .variants
        .iter()
        .map(|&(dtype, variant_arch)| {
            (variant_arch == arch).then(|| {
                let kind = KernelKind::of(composition, dtype);
                dynamic_config(Arch::Sm90, &kind).unit_tiers(&kind)
            })
        })
        .collect();
    if let Some(built) = gemm.vendor.per_call {
        assert_eq!(built.costs, shipped, "{name}: the costs the build wrote");
        assert_eq!(built.work, work, "{name}: the vendor path the build wrote");
        assert_eq!(
            gemm.vendor.epilogue, epilogue,
            "{name}: the epilogue the build wrote"
        );
        if arch == Arch::Sm90 {
            assert_eq!(built.units, &units[..], "{name}: the tiers the build wrote");
        }
        assert_eq!(
            gemm.vendor.norm.len(),
            norm.len(),
            "{name}: the build wrote a norm kernel per variant exactly for a norm GEMM"
        );
    }
    let model: &'static RouteModel = Box::leak(Box::new(RouteModel {
        costs: GuardCosts {
            fused: shipped.fused,
            vendor: vendor.unwrap_or(shipped.vendor),
        },
        work,
        units: Box::leak(units.into_boxed_slice()),
    }));
    let kernels = vec![KernelEntry {
        label: kernel.label,
        output: kernel.output,
        op: KernelOp::Gemm(GemmOp {
            vendor: VendorRoute {
                arch,
                ms: &[],
                epilogue,
                per_call: Some(model),
                norm,
            },
            ..*gemm
        }),
        launchers: kernel.launchers,
    }];
    Box::leak(Box::new(PlanTable {
        kernels: Box::leak(kernels.into_boxed_slice()),
        ..*table
    }))
}

/// The shapes of the per-call tests: the suite's GEMM shapes, and a few of
/// layer size (N and K ragged where the tiles leave partial ones).
fn per_call_shapes() -> Vec<(usize, usize, usize)> {
    let mut shapes = gemm_shapes();
    shapes.extend([
        (300, 768, 3072),
        (1000, 3000, 3000),
        (61, 4104, 632),
        (2048, 2304, 768),
    ]);
    shapes
}

/// Whether `table`'s GEMM, filled for `T` at `(m, n, k)`, takes its route
/// on this device (as the executor asks, routes being taken).
fn routes_at<T: TestElement>(table: &'static PlanTable, (m, n, k): (usize, usize, usize)) -> bool {
    let variant = table
        .variants
        .iter()
        .position(|&v| v == (T::DTYPE, device_arch()))
        .expect("the table has this device's variant");
    let KernelOp::Gemm(gemm) = &table.kernels[0].op else {
        unreachable!("one GEMM")
    };
    let model = gemm.vendor.per_call.expect("a route left to the call");
    model.vendor(variant, gemm.model, m as i64, n as i64, k as i64)
}

/// A vendor model whose every call of `table`'s GEMM (a route left to the
/// call, [`per_call`]) in `T` costs the geometric middle of the fused
/// kernel's predicted times over `shapes` (above the decode kernel's Ms):
/// the shapes the fused kernel is predicted slower on go to cuBLASLt, the
/// others stay fused, so both paths run.
fn splitting_vendor<T: TestElement>(
    name: &str,
    table: &'static PlanTable,
    shapes: &[(usize, usize, usize)],
) -> VendorCosts {
    let KernelOp::Gemm(gemm) = &table.kernels[0].op else {
        unreachable!("one GEMM")
    };
    let model = gemm.vendor.per_call.expect("a route left to the call");
    let variant = table
        .variants
        .iter()
        .position(|&v| v == (T::DTYPE, device_arch()))
        .expect("the table has this device's variant");
    let unit = model.units[variant].expect("this device's variant has tiers");
    let tiers_by = gemm.model.and_then(|tiles| tiles.costs_for(variant));
    let fused: Vec<f64> = shapes
        .iter()
        .filter_map(|&(m, n, k)| {
            let (m, n, k) = (m as u64, n as u64, k as u64);
            model
                .costs
                .bucket_times(&model.work, unit.source_tile, bucket_of(m), (n, k), |m| {
                    unit.tile_run(tiers_by, m, n, k)
                })
                .fused_us
        })
        .collect();
    let (least, most) = fused
        .iter()
        .fold((f64::INFINITY, 0.0f64), |(l, h), &t| (l.min(t), h.max(t)));
    assert!(least < most, "{name}: the shapes' predicted times differ");
    VendorCosts {
        sms: 132,
        launch_us: (least * most).sqrt(),
        wave_gflop_us: 0.0,
        memory_us_per_mb: 0.0,
        extra_kernel_us: 0.0,
        extra_memory_us_per_mb: 0.0,
    }
}

/// `name`'s graph through `table` at each of `shapes`, in `T`, against the
/// reference, weights per call and bound; returns how many shapes took the
/// vendor path and how many stayed fused.
fn check_per_call<T: TestElement>(
    name: &str,
    table: &'static PlanTable,
    shapes: &[(usize, usize, usize)],
) -> (usize, usize) {
    assert!(fusion::vendor::routes_enabled(), "the vendor path is off");
    let (mut vendor, mut fused) = (0, 0);
    for &(m, n, k) in shapes {
        let routed = routes_at::<T>(table, (m, n, k));
        eprintln!(
            "{name} {} at ({m}, {n}, {k}): {}",
            T::DTYPE,
            if routed { "vendor" } else { "fused" }
        );
        (vendor, fused) = if routed {
            (vendor + 1, fused)
        } else {
            (vendor, fused + 1)
        };
        let dims = [("M", m), ("N", n), ("K", k)];
        for bound in [false, true] {
            check_table::<T>(name, table, &dims, bound, |_| {});
        }
    }
    (vendor, fused)
}

/// Both dtypes of `name` with a vendor model that splits the shapes: some
/// calls go to cuBLASLt (after the norm kernels `f16_norm` and `bf16_norm`
/// of each table's variants, for a norm GEMM), some stay fused, each
/// checked; then with the shipped models, whichever way they send each
/// shape.
fn per_call_test<F: TestElement, B: TestElement>(
    name: &str,
    (f16_table, f16_norm): (&'static PlanTable, &'static [Launcher<fusion_norm_params>]),
    (bf16_table, bf16_norm): (&'static PlanTable, &'static [Launcher<fusion_norm_params>]),
    epilogue: VendorEpilogue,
) {
    let shapes = per_call_shapes();
    let shipped = per_call(name, f16_table, (epilogue, f16_norm), None);
    let vendor = splitting_vendor::<F>(name, shipped, &shapes);
    let table = per_call(name, f16_table, (epilogue, f16_norm), Some(vendor));
    let (routed, fused) = check_per_call::<F>(name, table, &shapes);
    assert!(routed > 0 && fused > 0, "{name}: {routed} routed, {fused} fused");
    let vendor = splitting_vendor::<B>(
        name,
        per_call(name, bf16_table, (epilogue, bf16_norm), None),
        &shapes,
    );
    let table = per_call(name, bf16_table, (epilogue, bf16_norm), Some(vendor));
    let (routed, fused) = check_per_call::<B>(name, table, &shapes);
    assert!(routed > 0 && fused > 0, "{name}: {routed} routed, {fused} fused");
    let (routed, fused) = check_per_call::<F>(name, shipped, &shapes);
    eprintln!("{name} f16 with the shipped models: {routed} routed, {fused} fused");
}

macro_rules! per_call_test {
    ($test:ident, $graph:literal, $plan:ident, $epilogue:ident) => {
        #[test]
        #[ignore = "needs a CUDA GPU"]
        fn $test() {
            per_call_test::<f16, bf16>(
                $graph,
                (kernels::$plan::<f16>::PLAN, &[]),
                (kernels::$plan::<bf16>::PLAN, &[]),
                VendorEpilogue::$epilogue,
            );
        }
    };
    ($test:ident, $graph:literal, $plan:ident, $epilogue:ident, norm $norm:ident) => {
        #[test]
        #[ignore = "needs a CUDA GPU"]
        fn $test() {
            let (f16_table, bf16_table) = (kernels::$plan::<f16>::PLAN, kernels::$plan::<bf16>::PLAN);
            per_call_test::<f16, bf16>(
                $graph,
                (
                    f16_table,
                    norm_launchers(f16_table, kernels::$norm::<f16>::PLAN),
                ),
                (
                    bf16_table,
                    norm_launchers(bf16_table, kernels::$norm::<bf16>::PLAN),
                ),
                VendorEpilogue::$epilogue,
            );
        }
    };
}

per_call_test!(
    gemm_bias_residual_decided_per_call,
    "gemm_bias_residual",
    GemmBiasResidual,
    Bias
);
per_call_test!(
    gemm_bias_gelu_decided_per_call,
    "gemm_bias_gelu",
    GemmBiasGelu,
    GeluBias
);
per_call_test!(gemm_decided_per_call, "gemm", Gemm, None);
per_call_test!(
    layernorm_gemm_decided_per_call,
    "layernorm_gemm",
    LayernormGemm,
    None,
    norm Layernorm
);
per_call_test!(
    rmsnorm_gemm_decided_per_call,
    "rmsnorm_gemm",
    RmsnormGemm,
    None,
    norm Rmsnorm
);

/// The config a build gives a GEMM of `kind` whose N and K are dynamic:
/// the shipped table's, with the few-M tile.
fn dynamic_config(arch: Arch, kind: &select::KernelKind) -> select::KernelConfig {
    let table = select::TunedTable::shipped(arch).unwrap();
    select::select_tuned(&table, &select::TunedCache::default(), arch, kind, None, None)
        .unwrap()
        .config
}
