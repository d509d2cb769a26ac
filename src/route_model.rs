//! The guard's verdict per call where the build could not decide it: a
//! build with the guard (`FUSION_GUARD=on`) decides each M bucket of a GEMM
//! whose N and K are static, and for a GEMM whose N or K is dynamic writes
//! the two models' costs, what the vendor path runs and the unit's tiers
//! into the plan table ([`RouteModel`]). A call then runs the vendor path
//! where the same code the build runs
//! ([`fusion_compiler::guard_model::GuardCosts::vendor_in`]) says the fused
//! kernel loses its (M bucket, N, K) by more than the margin.
//!
//! The verdict is kept per (table entry, variant, M bucket, N, K), so a
//! call after the first of its shape looks it up without allocating.
//!
//! Not here: the models (fusion-compiler's `gemm_model` and
//! `guard_model`), whether routes are taken at all
//! ([`crate::vendor::routes_enabled`]) and running the path
//! ([`crate::vendor`]).

use crate::shape_memo::ShapeMemo;
use crate::tile_model::TileModel;
use fusion_compiler::gemm_model::{UnitTiers, bucket_of};
use fusion_compiler::guard_model::{GuardCosts, VendorWork};

/// What the run time weighs per call for a GEMM whose N or K is dynamic, as
/// a build with `FUSION_GUARD=on` writes it into the plan table
/// ([`crate::plan::VendorRoute::per_call`]).
#[derive(Debug)]
pub struct RouteModel {
    /// The fused kernel's and the vendor path's fitted costs (the build's
    /// `kernels/tuned/sm90.model.json` and `sm90.vendor.json`).
    pub costs: GuardCosts,
    /// What the vendor path runs.
    pub work: VendorWork,
    /// Per variant of the table ([`crate::plan::PlanTable::variants`],
    /// index for index): the tiers its unit was compiled with; `None` where
    /// the guard does not serve it (another generation than sm90, f32),
    /// and the fused kernel runs.
    pub units: &'static [Option<UnitTiers>],
}

/// The verdicts made so far: whether the vendor path runs. A route model
/// belongs to one table entry, whose tile model (the other thing a verdict
/// weighs) is fixed.
static VERDICTS: ShapeMemo<bool> = ShapeMemo::new();

impl RouteModel {
    /// Whether a call of `variant` at (`m`, `n`, `k`), with `n` C's
    /// columns, runs the vendor path: the verdict on `m`'s bucket, its
    /// fused kernel running the tier `tiles` (the GEMM's
    /// [`crate::plan::GemmOp::model`]) names for the variant, else its
    /// launcher's own. A tier forced by `FUSION_GEMM_TILE` is not weighed:
    /// the verdict is the plan's.
    pub fn vendor(&'static self, variant: usize, tiles: Option<&TileModel>, m: i64, n: i64, k: i64) -> bool {
        let Some(Some(unit)) = self.units.get(variant) else {
            return false;
        };
        let (Ok(m), Ok(n), Ok(k)) = (u64::try_from(m), u64::try_from(n), u64::try_from(k)) else {
            return false;
        };
        let bucket = bucket_of(m);
        let key = (std::ptr::from_ref(self) as usize, variant, bucket.index(), n, k);
        VERDICTS.get_or_make(key, || {
            let tiers_by = tiles.and_then(|t| t.costs_for(variant));
            self.costs.vendor_in(&self.work, unit, tiers_by, bucket, (n, k))
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use fusion_compiler::guard_model::VendorCosts;

    /// The shipped vendor calibration's costs, rounded.
    pub(crate) fn vendor_costs() -> VendorCosts {
        VendorCosts {
            sms: 132,
            launch_us: 7.85,
            wave_gflop_us: 1.073,
            memory_us_per_mb: 0.1478,
            extra_kernel_us: 1.338,
            extra_memory_us_per_mb: 0.2629,
        }
    }

    /// A GEMM with a bias and a residual on beta.
    const BIAS_RESIDUAL: VendorWork = VendorWork {
        norm: false,
        gated: false,
        beta_residual: true,
        elementwise_tiles: None,
    };

    /// A route model over [`crate::tile_model::tests::UNIT`] and a variant
    /// it does not serve, with the vendor path's costs scaled by `scale`.
    pub(crate) fn model(scale: f64) -> &'static RouteModel {
        let mut vendor = vendor_costs();
        vendor.launch_us *= scale;
        vendor.wave_gflop_us *= scale;
        vendor.memory_us_per_mb *= scale;
        Box::leak(Box::new(RouteModel {
            costs: GuardCosts {
                fused: crate::tile_model::tests::costs(),
                vendor,
            },
            work: BIAS_RESIDUAL,
            units: &[
                Some(UnitTiers {
                    source_tile: true,
                    ..crate::tile_model::tests::UNIT
                }),
                None,
            ],
        }))
    }

    #[test]
    fn a_call_takes_the_verdict_of_the_shared_model_on_its_bucket() {
        // A table entry's route model goes with one tile model (or none):
        // one route model for each.
        let mut verdicts = std::collections::BTreeSet::new();
        for tiles in [None, Some(crate::tile_model::tests::model())] {
            let model = model(1.0);
            let unit = model.units[0].unwrap();
            let tiers_by = tiles.and_then(|t| t.costs_for(0));
            for (m, n, k) in [
                (128, 4096, 4096),
                (8192, 14336, 4096),
                (1000, 18944, 3584),
                (64, 2048, 8192),
                (300, 768, 768),
                (4096, 768, 3072),
            ] {
                let bucket = bucket_of(m as u64);
                let want = model
                    .costs
                    .vendor_in(&model.work, &unit, tiers_by, bucket, (n as u64, k as u64));
                assert_eq!(model.vendor(0, tiles, m, n, k), want, "({m}, {n}, {k})");
                // Asked again, from the kept verdict: the same.
                assert_eq!(model.vendor(0, tiles, m, n, k), want);
                verdicts.insert(want);
            }
        }
        assert_eq!(verdicts.len(), 2, "the shapes go both ways");
        let model = model(1.0);
        // The variant it does not serve, and sizes that are not sizes.
        assert!(!model.vendor(1, None, 8192, 14336, 4096));
        assert!(!model.vendor(2, None, 8192, 14336, 4096));
        assert!(!model.vendor(0, None, -1, 14336, 4096));
    }

    #[test]
    fn a_cheap_vendor_path_takes_every_modelled_bucket_and_a_dear_one_none() {
        let (cheap, dear) = (model(0.1), model(10.0));
        for m in [17, 64, 128, 1000, 8192] {
            assert!(cheap.vendor(0, None, m, 4096, 4096), "m = {m}");
            assert!(!dear.vendor(0, None, m, 4096, 4096), "m = {m}");
        }
        // The decode kernel's Ms stay fused: the model does not cover it.
        assert!(!cheap.vendor(0, None, 16, 4096, 4096));
    }
}
