//! The few-M tile: a 64x64 tile the sm90 launcher runs ahead of its tiers
//! wherever its tiles make one wave.
//!
//! At M = 64 and 128 the table's 64x128 small-M tile leaves so few tiles
//! that the launch splits K over several CTAs, and the partial tiles'
//! fix-ups cost more than the split saves. Tiles of 64x64 that make one
//! wave split K over fewer CTAs, or none. On an H100 (the kernel self-test,
//! benchmarks/HISTORY.md v34) `gemm_residual`'s 64x64 tile ran 1.20x-1.45x
//! faster than the shipped unit at (128, 768, 3072), (128, 1024, 4096),
//! (128, 3584, 3584), (64, 1024, 4096) and (64, 3072, 3072); over 56 corpus
//! layers, 64-row tiles (64x64 where N <= 4224) ran 1.09x (M = 64) and
//! 1.04x (M = 128) faster (geometric means), but lost at M = 128 from
//! K = 9728 on, where two rows of whole-K tiles load each k-block of B
//! twice per column and the split's fix-ups are paid for.
//!
//! So every sm90 GEMM whose small-M tiers can be refitted
//! (`fitted::fittable`: 16-bit, B [N, K], not gated) gets a `few_m` tile of
//! 64x64, and its launcher runs it after the decode kernel wherever its
//! tiles make one wave in one row, or in two where K is at most
//! [`FEW_M_DEEP_K`] (`few_m_runs` in gemm.cuh,
//! [`crate::gemm_model::few_m_runs`]); else it chooses among the tiers as
//! before. Wider 64-row tiles fitted to N (N / 66 columns) measured no
//! faster at M = 128 and slower than 64x64 at M = 64 (v34); 32 and 48
//! columns, no faster at M = 128 and not instantiated by the kernel.

use super::fitted::{cooperative_of_rows, fittable, stages_beside_staging};
use super::{Arch, KernelConfig, KernelKind, TileConfig};
#[cfg(doc)]
use crate::gemm_model::FEW_M_DEEP_K;

/// The few-M tile's rows and columns.
const FEW_M_ROWS: u32 = 64;
const FEW_M_COLUMNS: u32 = 64;

/// The few-M tile for `config` where its small-M tiers can be refitted
/// (`fitted::fittable`) and its `small_m` is a cooperative 64-row tile of one
/// CTA wider than 64 columns: 64x64 with its fields, with as many stages
/// as fit beside its whole staging tile (8).
pub fn few_m_tile(config: &KernelConfig, arch: Arch, kernel: &KernelKind) -> Option<TileConfig> {
    if !fittable(config, arch, kernel) {
        return None;
    }
    let small = cooperative_of_rows(config.small_m?, FEW_M_ROWS)?;
    (small.bn > FEW_M_COLUMNS).then(|| TileConfig {
        bn: FEW_M_COLUMNS,
        stages: stages_beside_staging(FEW_M_ROWS, FEW_M_COLUMNS),
        ..small
    })
}

/// `config` with a few-M tile ([`few_m_tile`]) where it names none (a
/// candidate list's config may) and one applies.
pub fn with_few_m(config: &KernelConfig, arch: Arch, kernel: &KernelKind) -> KernelConfig {
    KernelConfig {
        few_m: config.few_m.or_else(|| few_m_tile(config, arch, kernel)),
        ..*config
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gemm_model::{FEW_M_DEEP_K, SM90_SMS};
    use crate::ir::{DType, WeightLayout};
    use crate::select::{TierChoice, TunedTable, select_with};

    fn kind(name: &str, layout: WeightLayout, gated: bool) -> KernelKind {
        KernelKind {
            gated,
            ..KernelKind::plain(name, DType::F16, layout, false)
        }
    }

    fn shipped(kernel: &KernelKind) -> KernelConfig {
        let table = TunedTable::shipped(Arch::Sm90).expect("the shipped sm90 table");
        select_with(&table, Arch::Sm90, kernel).expect("the shipped sm90 table has it")
    }

    #[test]
    fn nk_gemms_get_a_64x64_tile_with_the_small_m_tiles_fields() {
        let plain = kind("gemm_residual", WeightLayout::NK, false);
        let config = shipped(&plain);
        let small = config.small_m.expect("a small-M tile");
        let few = few_m_tile(&config, Arch::Sm90, &plain).expect("a few-M tile");
        assert_eq!((few.bm, few.bn, few.stages), (64, 64, 8));
        assert_eq!(few.fields, small.fields);
        assert_eq!(with_few_m(&config, Arch::Sm90, &plain).few_m, Some(few));
        // A config that names one keeps it.
        let named = KernelConfig {
            few_m: Some(TileConfig { stages: 4, ..few }),
            ..config
        };
        assert_eq!(with_few_m(&named, Arch::Sm90, &plain), named);
        // Other archs, [K, N] weights and gated GEMMs get none.
        assert_eq!(few_m_tile(&config, Arch::Sm80, &plain), None);
        let kn = kind("gemm", WeightLayout::KN, false);
        assert_eq!(few_m_tile(&shipped(&kn), Arch::Sm90, &kn), None);
        let gated = kind("gemm_silu_glu", WeightLayout::NK, true);
        assert_eq!(few_m_tile(&shipped(&gated), Arch::Sm90, &gated), None);
    }

    /// The launcher runs the few-M tile after the decode kernel where its
    /// tiles make one wave: two rows up to FEW_M_DEEP_K, one deeper.
    #[test]
    fn the_few_m_tile_runs_where_its_tiles_make_one_wave() {
        let plain = kind("gemm", WeightLayout::NK, false);
        let config = with_few_m(&shipped(&plain), Arch::Sm90, &plain);
        let few = config.few_m.expect("a few-M tile");
        let run = |m, n, k| config.launched_tile(m, n, k, SM90_SMS, true, TierChoice::LeastLoads);
        assert_eq!(run(16, 3072, 3072), None, "the decode kernel");
        assert_eq!(run(17, 3072, 3072), Some(few));
        assert_eq!(run(128, 3072, 3072), Some(few));
        assert_ne!(run(129, 3072, 3072), Some(few));
        // Deeper than FEW_M_DEEP_K: one row.
        assert_eq!(run(64, 3072, FEW_M_DEEP_K + 1), Some(few));
        assert_ne!(run(65, 3072, FEW_M_DEEP_K + 1), Some(few));
        assert_eq!(run(65, 3072, FEW_M_DEEP_K), Some(few));
        // One wave: 132 tiles in one row, 66 columns in two.
        assert_eq!(run(64, 132 * 64, 3072), Some(few));
        assert_ne!(run(64, 132 * 64 + 8, 3072), Some(few));
        assert_eq!(run(128, 66 * 64, 3072), Some(few));
        assert_ne!(run(128, 66 * 64 + 8, 3072), Some(few));
    }

    /// A config may name a few-M tile only where the sm90 launchers run
    /// one: 16-bit, B [N, K], not gated.
    #[test]
    fn a_config_names_a_few_m_tile_only_where_it_runs() {
        use crate::select::{ConfigSource, check_config};
        let source = ConfigSource {
            file: "table.json".into(),
            entry: "gemm".into(),
        };
        let plain = kind("gemm", WeightLayout::NK, false);
        let config = with_few_m(&shipped(&plain), Arch::Sm90, &plain);
        assert!(check_config(&config, &source, Arch::Sm90, &plain).is_ok());
        let kn = kind("gemm", WeightLayout::KN, false);
        let error = check_config(&config, &source, Arch::Sm90, &kn).unwrap_err();
        assert!(error.to_string().contains("few_m"), "{error}");
        let gated = kind("gemm_silu_glu", WeightLayout::NK, true);
        assert!(check_config(&config, &source, Arch::Sm90, &gated).is_err());
    }
}
