//! The sm90 GEMM tile a call runs where the build could not choose it: a
//! build with the model of the kernel's time (`FUSION_SELECT=model`) chooses
//! one tile per M bucket where a GEMM's N and K are static, and for a GEMM
//! whose N or K is dynamic writes the unit's tiers and the model's costs
//! into the plan table ([`TileModel`]). A call then names the tier the model
//! chooses for its (M, N, K) in the launch's flags, with the same code the
//! build runs ([`fusion_compiler::gemm_model::UnitTiers::fastest_in`]).
//!
//! The choice is kept per (table entry, variant, M bucket, N, K), so a call
//! after the first of its shape looks it up without allocating.
//!
//! Not here: the model (fusion-compiler's `gemm_model`) and the tiers a
//! unit was compiled with (the build writes them).

use crate::abi;
use crate::launch::GemmTile;
use crate::shape_memo::ShapeMemo;
use fusion_compiler::gemm_model::{Costs, UnitTiers, bucket_of};

/// A GEMM's tile chosen per call by the model of the kernel's time, as a
/// build with `FUSION_SELECT=model` writes it into the plan table where the
/// GEMM's N or K is dynamic.
#[derive(Debug)]
pub struct TileModel {
    /// The model's fitted costs (the build's
    /// `kernels/tuned/sm90.model.json`).
    pub costs: Costs,
    /// Per variant of the table ([`crate::plan::PlanTable::variants`],
    /// index for index): the tiers its unit was compiled with; `None` where
    /// its launcher chooses (another generation than sm90).
    pub units: &'static [Option<UnitTiers>],
}

/// The choices made so far: the tier, or `None` for the launcher's own.
static CHOICES: ShapeMemo<Option<u8>> = ShapeMemo::new();

impl TileModel {
    /// Its costs where it names the tier of `variant`'s calls (the variant
    /// has tiers); `None` where the launcher chooses.
    pub fn costs_for(&self, variant: usize) -> Option<&Costs> {
        matches!(self.units.get(variant), Some(Some(_))).then_some(&self.costs)
    }

    /// `flags` (a GEMM launch's, [`crate::launch::gemm_flags`]) for a call
    /// of `variant` at (`m`, `n`, `k`), with `n` C's columns: with the tier
    /// the model chooses named in them ([`GemmTile`]), or as they are where
    /// they name a tier already (`FUSION_GEMM_TILE`), where the variant has
    /// no tiers, and where the decode kernel or the unit's few-M tile takes
    /// the call ([`UnitTiers::few_m_run`]), which the launcher then runs.
    pub fn flags(&'static self, variant: usize, flags: u32, m: i64, n: i64, k: i64) -> u32 {
        if flags & abi::FUSION_GEMM_TILE_MASK != 0 {
            return flags;
        }
        let Some(Some(unit)) = self.units.get(variant) else {
            return flags;
        };
        let (Ok(m), Ok(n), Ok(k)) = (u64::try_from(m), u64::try_from(n), u64::try_from(k)) else {
            return flags;
        };
        if unit.decodes(m) || unit.few_m_run(m, n, k).is_some() {
            return flags;
        }
        let bucket = bucket_of(m);
        let key = (std::ptr::from_ref(self) as usize, variant, bucket.index(), n, k);
        let tier = CHOICES.get_or_make(key, || {
            unit.fastest_in(&self.costs, bucket, n, k)
                .and_then(|tier| u8::try_from(tier).ok())
        });
        match tier.and_then(|tier| GemmTile::ALL.get(usize::from(tier))) {
            Some(tier) => flags | tier.code() << abi::FUSION_GEMM_TILE_SHIFT,
            None => flags,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use fusion_compiler::gemm_model::{TIERS, TileShape};

    pub(crate) fn costs() -> Costs {
        // The shipped calibration's, rounded: the choices below hold for
        // either.
        Costs {
            sms: 132,
            launch_us: 5.12,
            k_block_area_us: 0.594,
            k_block_edge_us: 0.0321,
            tile_area_us: 0.400,
            tile_us: 2.45,
            partial_us: 3.95,
            memory_us_per_mb: 0.0913,
        }
    }

    /// A unit with tiers large 128x256, large_alt 128x192, small_m 64x128
    /// and small_m_alt 128x128 (up to 128 rows), and the decode kernel up
    /// to 16 rows.
    pub(crate) const UNIT: UnitTiers = UnitTiers {
        tiles: [
            Some(TileShape { bm: 128, bn: 256 }),
            Some(TileShape { bm: 128, bn: 192 }),
            Some(TileShape { bm: 64, bn: 128 }),
            Some(TileShape { bm: 128, bn: 128 }),
        ],
        decode_max_m: Some(16),
        small_m_max: Some(128),
        gated: false,
        source_tile: false,
        few_m: None,
    };

    /// A model of two variants: the first with [`UNIT`]'s tiers, the
    /// second without tiers.
    pub(crate) fn model() -> &'static TileModel {
        Box::leak(Box::new(TileModel {
            costs: costs(),
            units: &[Some(UNIT), None],
        }))
    }

    fn tier_of(flags: u32) -> u32 {
        (flags & abi::FUSION_GEMM_TILE_MASK) >> abi::FUSION_GEMM_TILE_SHIFT
    }

    #[test]
    fn a_call_names_the_tier_the_model_chooses_for_its_shape() {
        let model = model();
        let schedule = abi::FUSION_GEMM_NO_STREAM_K;
        for (m, n, k) in [
            (128, 4096, 4096),
            (8192, 14336, 4096),
            (1000, 18944, 3584),
            (64, 2048, 8192),
        ] {
            let flags = model.flags(0, schedule, m, n, k);
            assert_eq!(
                flags & !abi::FUSION_GEMM_TILE_MASK,
                schedule,
                "the other flags stay"
            );
            let want = UNIT.choose(&costs(), m as u64, n as u64, k as u64).unwrap();
            assert_eq!(tier_of(flags), GemmTile::ALL[want].code(), "({m}, {n}, {k})");
            // Asked again, from the kept choice: the same.
            assert_eq!(model.flags(0, schedule, m, n, k), flags);
        }
        // Shapes that choose different tiers.
        let tiers: std::collections::BTreeSet<u32> = [(8192, 14336, 4096), (128, 4096, 4096)]
            .iter()
            .map(|&(m, n, k)| tier_of(model.flags(0, 0, m, n, k)))
            .collect();
        assert_eq!(tiers.len(), 2, "{tiers:?}");
    }

    #[test]
    fn a_named_tier_the_decode_kernel_and_other_generations_are_left_as_they_are() {
        let model = model();
        // FUSION_GEMM_TILE's tier wins.
        let forced = GemmTile::SmallMAlt.code() << abi::FUSION_GEMM_TILE_SHIFT;
        assert_eq!(model.flags(0, forced, 8192, 14336, 4096), forced);
        // The decode kernel's Ms, and the variant without tiers.
        assert_eq!(model.flags(0, 0, 16, 4096, 4096), 0);
        assert_ne!(model.flags(0, 0, 17, 4096, 4096), 0);
        assert_eq!(model.flags(1, 0, 8192, 14336, 4096), 0);
        assert_eq!(model.flags(2, 0, 8192, 14336, 4096), 0);
    }

    /// Where the unit's few-M tile runs, the call names no tier, so that
    /// the launcher runs it; elsewhere the model's tier.
    #[test]
    fn the_few_m_tiles_calls_are_left_to_the_launcher() {
        let few: &'static TileModel = Box::leak(Box::new(TileModel {
            costs: costs(),
            units: Box::leak(Box::new([Some(UnitTiers {
                few_m: Some(TileShape { bm: 64, bn: 64 }),
                ..UNIT
            })])),
        }));
        // Two rows of 64x64 tiles, 64 columns: one wave of 128 tiles.
        assert_eq!(few.flags(0, 0, 128, 4096, 4096), 0);
        assert_eq!(few.flags(0, 0, 17, 4096, 4096), 0);
        // Deeper than FEW_M_DEEP_K two rows are not: the model's tier.
        assert_ne!(few.flags(0, 0, 128, 4096, 16384), 0);
        assert_eq!(few.flags(0, 0, 64, 4096, 16384), 0);
        // Three rows, or a second wave: the model's tier.
        assert_ne!(few.flags(0, 0, 129, 4096, 4096), 0);
        assert_ne!(few.flags(0, 0, 128, 8192, 4096), 0);
    }

    #[test]
    fn the_tiers_are_the_tuned_tables_in_their_order() {
        assert_eq!(GemmTile::ALL.len(), TIERS);
        let names: Vec<&str> = GemmTile::ALL.iter().map(|t| t.name()).collect();
        assert_eq!(names, ["large", "large_alt", "small_m", "small_m_alt"]);
        for (index, tier) in GemmTile::ALL.iter().enumerate() {
            assert_eq!(tier.code() as usize, index + 1, "abi.h's codes count from 1");
        }
    }
}
