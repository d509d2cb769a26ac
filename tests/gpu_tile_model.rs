//! The tile the model of the sm90 GEMM kernel's time chooses per call, where
//! a build with `FUSION_SELECT=model` left it to the call (N or K dynamic:
//! `fusion::plan::TileModel`), on a GPU: single-GEMM graphs at shapes where
//! the model names each of the unit's tiers (and at an M the decode kernel
//! takes), checked in f16 and bf16 against the CPU reference with fresh
//! random inputs and poisoned outputs, as the launcher's own choices are
//! (tests/gpu.rs); with weights given per call and bound (padded rows, a
//! gated pair interleaved).
//!
//! A default build's tables get the model here, with the tiers that build
//! writes for each kernel (the shipped table's config, the shipped
//! calibration's costs); a build with `FUSION_SELECT=model` brings its own,
//! which are checked to be those.
//!
//! Run on a machine with an sm90 GPU (H100, H200): `cargo test --release
//! --features kernels,testing --test gpu_tile_model -- --ignored`, and once
//! more with `FUSION_SELECT=model` in the build's environment.

mod support;

use fusion::abi::{FUSION_GEMM_TILE_MASK, FUSION_GEMM_TILE_SHIFT};
use fusion::core::fuse::{self, Composition};
use fusion::core::gemm_model::UnitTiers;
use fusion::core::select::{self, KernelKind, model::Calibration};
use fusion::half::{bf16, f16};
use fusion::launch::Workspace;
use fusion::plan::{GemmOp, KernelEntry, KernelOp, PlanTable, TileModel};
use fusion::{Arch, kernels};
use std::collections::BTreeSet;
use support::{TestElement, check, run_table, stream};

/// `table`, the plan of the shipped graph `name`, with each GEMM's tile
/// chosen per call by the model: the table itself where its build wrote the
/// models (checked to be what follows), else a copy whose GEMMs carry the
/// shipped calibration's costs and, per sm90 variant, the tiers of the
/// shipped table's config for the kernel, as such a build writes them.
fn modelled(name: &str, table: &'static PlanTable) -> &'static PlanTable {
    let plan = fuse::plan(support::graph(name, table.variants[0].0));
    let costs = Calibration::shipped_sm90().costs;
    let kernels: Vec<KernelEntry> = table
        .kernels
        .iter()
        .zip(&plan.kernels)
        .map(|(kernel, planned)| {
            let (KernelOp::Gemm(gemm), Composition::Gemm(composition)) = (&kernel.op, &planned.composition)
            else {
                panic!("{name}: {} is not a GEMM", kernel.label);
            };
            let units: Vec<Option<UnitTiers>> = table
                .variants
                .iter()
                .map(|&(dtype, arch)| {
                    (arch == Arch::Sm90).then(|| {
                        let kind = KernelKind::of(composition, dtype);
                        dynamic_config(arch, &kind).unit_tiers(&kind)
                    })
                })
                .collect();
            let model: &'static TileModel = match gemm.model {
                Some(built) => {
                    assert_eq!(built.units, &units[..], "{name}: the tiers the build wrote");
                    assert_eq!(built.costs, costs, "{name}: the costs the build wrote");
                    built
                }
                None => Box::leak(Box::new(TileModel {
                    costs,
                    units: Box::leak(units.into_boxed_slice()),
                })),
            };
            KernelEntry {
                label: kernel.label,
                output: kernel.output,
                op: KernelOp::Gemm(GemmOp {
                    model: Some(model),
                    ..*gemm
                }),
                launchers: kernel.launchers,
            }
        })
        .collect();
    Box::leak(Box::new(PlanTable {
        kernels: Box::leak(kernels.into_boxed_slice()),
        ..*table
    }))
}

/// The tiers (abi.h's codes, 0 for the launcher's own choice) the model
/// names for `shapes` on the `T`, `arch` variant of `table`'s first GEMM.
fn tiers_named<T: TestElement>(
    table: &'static PlanTable,
    arch: Arch,
    shapes: &[(usize, usize, usize)],
) -> BTreeSet<u32> {
    let variant = table
        .variants
        .iter()
        .position(|&v| v == (T::DTYPE, arch))
        .unwrap_or_else(|| panic!("the table has a {} {arch} variant", T::DTYPE));
    let KernelOp::Gemm(GemmOp {
        model: Some(model), ..
    }) = &table.kernels[0].op
    else {
        panic!("the table's GEMM has a model");
    };
    shapes
        .iter()
        .map(|&(m, n, k)| {
            let flags = model.flags(variant, 0, m as i64, n as i64, k as i64);
            (flags & FUSION_GEMM_TILE_MASK) >> FUSION_GEMM_TILE_SHIFT
        })
        .collect()
}

/// On an sm90 device, `shapes` name every tier in `want` (abi.h's codes, 0
/// for the decode kernel); elsewhere the model names none.
fn assert_tiers<T: TestElement>(
    name: &str,
    table: &'static PlanTable,
    shapes: &[(usize, usize, usize)],
    want: &[u32],
) {
    let arch = fusion::device::arch_among(&stream(), &fusion::device::compiled())
        .expect("a compiled variant runs here");
    let named = tiers_named::<T>(table, arch, shapes);
    if arch == Arch::Sm90 {
        assert_eq!(
            named,
            want.iter().copied().collect(),
            "{name}: the tiers the shapes run"
        );
    } else {
        eprintln!("{name}: {arch} runs the launcher's own tiles; the model chooses on sm90 alone");
        assert_eq!(named, BTreeSet::from([0]));
    }
}

/// `name`'s graph through `table` at each of `shapes` (dims M, N, K), in
/// `T`, against the reference; weights per call, or bound first.
fn check_modelled<T: TestElement>(
    name: &str,
    table: &'static PlanTable,
    shapes: &[(usize, usize, usize)],
    bound: bool,
) {
    let s = stream();
    let mut workspace = Workspace::new();
    for &(m, n, k) in shapes {
        let dims = [("M", m), ("N", n), ("K", k)];
        // SAFETY: the table is the generated one, its GEMMs given a model
        // whose tiers are their units' own.
        check::<T>(&s, name, &dims, |r, w| unsafe {
            run_table(table, &s, &mut workspace, r, w, bound)
        });
    }
}

/// gemm_bias_residual's shapes and the tiers the shipped model names for
/// them on sm90 (abi.h's codes, [`RESIDUAL_TIERS`]): the decode kernel at
/// 13 rows; small_m (64x128) at (128, 4096, 4096) and at 61 rows of 17016
/// columns, where the launcher would run large_alt; large_alt (128x192) at
/// (500, 8200, 1000), where it would run large; small_m_alt (128x128) at
/// (900, 2800, 3000), where it would run large_alt; large (128x256) at
/// (4100, 3000, 1000). M, N and K ragged where the tiles leave partial ones.
const RESIDUAL_SHAPES: [(usize, usize, usize); 6] = [
    (13, 5400, 1032),
    (128, 4096, 4096),
    (500, 8200, 1000),
    (61, 17016, 632),
    (900, 2800, 3000),
    (4100, 3000, 1000),
];
const RESIDUAL_TIERS: [u32; 5] = [0, 1, 2, 3, 4];

#[test]
#[ignore = "needs a CUDA GPU"]
fn gemm_bias_residual_runs_each_tier_the_model_chooses() {
    let name = "gemm_bias_residual";
    let f16_table = modelled(name, kernels::GemmBiasResidual::<f16>::PLAN);
    let bf16_table = modelled(name, kernels::GemmBiasResidual::<bf16>::PLAN);
    assert_tiers::<f16>(name, f16_table, &RESIDUAL_SHAPES, &RESIDUAL_TIERS);
    check_modelled::<f16>(name, f16_table, &RESIDUAL_SHAPES, false);
    check_modelled::<bf16>(name, bf16_table, &RESIDUAL_SHAPES, false);
    check_modelled::<f16>(name, f16_table, &RESIDUAL_SHAPES, true);
}

/// gemm_silu_glu (gated: two GEMM columns per output column; no
/// large_alt tier) and the tiers named on sm90: the decode kernel at 13
/// rows, small_m at 61 rows of 17016 columns, small_m_alt at (500, 8200,
/// 1000), where the launcher would run large, and large at (300, 5000,
/// 2000).
const GATED_SHAPES: [(usize, usize, usize); 4] = [
    (13, 5400, 1032),
    (61, 17016, 632),
    (500, 8200, 1000),
    (300, 5000, 2000),
];
const GATED_TIERS: [u32; 4] = [0, 1, 3, 4];

/// The shapes above name the tiers the GPU tests expect on sm90, worked out
/// without a device: a change to the model or to a launch's splits that
/// moves a shape to another tier fails here, on any machine, and not only
/// when the GPU tests run ((1000, 3000, 3000) moved from small_m_alt to
/// large_alt when the last wave came to run whole by default).
#[test]
fn the_shapes_name_every_tier_on_sm90() {
    let residual = modelled("gemm_bias_residual", kernels::GemmBiasResidual::<f16>::PLAN);
    let named = tiers_named::<f16>(residual, Arch::Sm90, &RESIDUAL_SHAPES);
    assert_eq!(named, BTreeSet::from(RESIDUAL_TIERS), "gemm_bias_residual");
    let gated = modelled("gemm_silu_glu", kernels::GemmSiluGlu::<f16>::PLAN);
    let named = tiers_named::<f16>(gated, Arch::Sm90, &GATED_SHAPES);
    assert_eq!(named, BTreeSet::from(GATED_TIERS), "gemm_silu_glu");
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn gemm_silu_glu_runs_each_tier_the_model_chooses() {
    let name = "gemm_silu_glu";
    let f16_table = modelled(name, kernels::GemmSiluGlu::<f16>::PLAN);
    let bf16_table = modelled(name, kernels::GemmSiluGlu::<bf16>::PLAN);
    assert_tiers::<f16>(name, f16_table, &GATED_SHAPES, &GATED_TIERS);
    check_modelled::<f16>(name, f16_table, &GATED_SHAPES, true);
    check_modelled::<bf16>(name, bf16_table, &GATED_SHAPES, true);
    check_modelled::<f16>(name, f16_table, &GATED_SHAPES, false);
}

/// The config a build gives a GEMM of `kind` whose N and K are dynamic:
/// the shipped table's, with the few-M tile.
fn dynamic_config(arch: Arch, kind: &select::KernelKind) -> select::KernelConfig {
    let table = select::TunedTable::shipped(arch).unwrap();
    select::select_tuned(&table, &select::TunedCache::default(), arch, kind, None, None)
        .unwrap()
        .config
}
