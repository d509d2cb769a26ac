//! A small-M tile whose width is fitted to a GEMM's static N, so that its
//! tiles fill the SMs' waves.
//!
//! The shipped sm90 tiles are 128, 192 or 256 columns wide. At a few hundred
//! tokens that leaves most N with a lone wave on part of the SMs: at M = 512
//! and N = 2560, 4 rows of 128x128 tiles make 80 tiles on 132 SMs. cuBLASLt
//! picks the width that makes one wave there (128x80: 128 tiles), and so,
//! on an H100, does a 128-row tile of N / 32 columns: 1.06x-1.19x faster than
//! the shipped tile at (512, 2560, 10240), (512, 3072, 768),
//! (512, 3584, 4096), (512, 4544, 18176), (512, 5120, 14336) and
//! (512, 2560, 4096) (the kernel self-test on an H100, benchmarks/HISTORY.md v33),
//! and over the 30 corpus layers it fits 1.10x at M = 512 and 1.00x at
//! M = 1000, where it needs two waves (geometric means, v34).
//!
//! Where N is static, the unit's `small_m_alt` (the 128-row tier offered
//! for m <= `small_m_max`) becomes 128 x [`fitted_width`]: the narrowest
//! multiple of 16 whose tiles, in rows of four (M = 512), fit one wave of
//! [`SM90_SMS`] SMs, and in rows of eight (M = 1024) two. The launcher still
//! runs whichever tier its busiest CTA loads least for each M
//! (`fusion::LightestTier`), so the fitted tile runs only where it needs
//! fewer loads than the others.
//!
//! Not here: the kernel's rules for a tile
//! (`kernels/include/fusion/sm90/tile_config.cuh`), which each unit
//! asserts.

use super::{Arch, KernelConfig, KernelKind, TileConfig};
use crate::gemm_model::SM90_SMS;
use crate::ir::WeightLayout;

/// The narrowest width measured (128x80 at (512, 2560, 10240)); a narrower
/// fit keeps the shipped tile.
const MIN_FITTED_WIDTH: u32 = 80;
/// The widest tile the kernel takes.
const MAX_WIDTH: u32 = 256;
/// Tile widths are multiples of this (the epilogue's narrowest box).
const WIDTH_STEP: u32 = 16;
/// The fitted tile's rows.
const FITTED_ROWS: u32 = 128;
/// Rows of tiles a wave is fitted for: M = 512 in 128-row tiles.
const ROWS_PER_WAVE: u64 = 4;

/// An sm90 block's shared memory (`kSmemPerBlock` in tile_config.cuh).
const SMEM_PER_BLOCK: u32 = 227 * 1024;
/// What the kernel's shared memory holds besides the stages and the
/// staging tile, at most: the 1024-byte alignment slack, and the ring's
/// barriers and the scheduler's piece list (under 400 bytes at 8 stages).
const SMEM_FIXED: u32 = 1024 + 512;
/// Bytes a stage holds per row of A or B: one 128-byte k-block.
const STAGE_ROW_BYTES: u32 = 128;
/// The most stages a fitted tile gets (the shipped small-M tile's).
const MAX_STAGES: u32 = 8;

/// The width, a multiple of 16, at which N's tiles in rows of
/// four (M = 512 in 128-row tiles) just fit one wave of [`SM90_SMS`]: N / 33 rounded up
/// (2560 → 80, 3072 → 96, 3584 → 112, 4544 → 144, 5120 → 160), at most 256.
pub fn fitted_width(n: u64) -> u32 {
    let columns_per_wave = SM90_SMS / ROWS_PER_WAVE;
    let width = n
        .div_ceil(columns_per_wave)
        .next_multiple_of(u64::from(WIDTH_STEP));
    u32::try_from(width).map_or(MAX_WIDTH, |w| w.min(MAX_WIDTH))
}

/// The stages a cooperative 128 x `width` tile gets: as many as fit beside
/// its whole staging tile (2 bytes per element of C, which a residual or
/// multiplier tile needs whole), up to 8: 7 at 80 and 96
/// columns, 6 at 112 and 128, 5 at 144 and 160, 4 at 192.
pub fn fitted_stages(width: u32) -> u32 {
    stages_beside_staging(FITTED_ROWS, width)
}

/// The stages a cooperative `rows` x `width` tile gets: as many as fit
/// beside its whole staging tile, up to 8.
pub(super) fn stages_beside_staging(rows: u32, width: u32) -> u32 {
    let staging = rows * width * 2;
    let per_stage = (rows + width) * STAGE_ROW_BYTES;
    ((SMEM_PER_BLOCK - SMEM_FIXED - staging) / per_stage).min(MAX_STAGES)
}

/// Whether `config`'s small-M tiers can be fitted to N for `kernel` on
/// `arch`: an sm90 GEMM of 16-bit elements with B stored [N, K] (a [K, N]
/// B loads in 64-column boxes) that is not gated (a gated tile writes half
/// its columns in 64-column boxes) and has no tile per M bucket.
pub(super) fn fittable(config: &KernelConfig, arch: Arch, kernel: &KernelKind) -> bool {
    arch == Arch::Sm90
        && kernel.layout == WeightLayout::NK
        && !kernel.gated
        && !kernel.dtype.is_fp8()
        && config.by_m.is_none()
}

/// `tile` when it is a cooperative tile of `rows` rows and one CTA, the
/// kind a fitted tile is made from.
pub(super) fn cooperative_of_rows(tile: TileConfig, rows: u32) -> Option<TileConfig> {
    let fields = *tile.sm90_fields()?;
    let cooperative = fields.schedule.is_none_or(|s| s == super::Schedule::Cooperative);
    (tile.bm == rows && cooperative && fields.cluster_m <= 1).then_some(tile)
}

/// `config` with its `small_m_alt` fitted to a static `n`
/// ([`fitted_width`]), where `config` can be fitted ([`fittable`]) and its
/// `small_m_alt` is a cooperative 128-row tile of one CTA. `None` where
/// any of that fails, where the fit is narrower than
/// [`MIN_FITTED_WIDTH`], or where a 128-row tier of `config` has its width
/// already (N = 4096 and the shipped 128x128, 6144 and 128x192, 8192 and
/// more and 128x256): a unit of its own would add nothing.
pub fn fit_small_m_alt(
    config: &KernelConfig,
    arch: Arch,
    kernel: &KernelKind,
    n: u64,
) -> Option<KernelConfig> {
    if !fittable(config, arch, kernel) {
        return None;
    }
    let alt = cooperative_of_rows(config.small_m_alt?, FITTED_ROWS)?;
    let width = fitted_width(n);
    let offered = [Some(config.large), config.large_alt, Some(alt)]
        .into_iter()
        .flatten()
        .any(|tile| tile.bm == FITTED_ROWS && tile.bn == width);
    if width < MIN_FITTED_WIDTH || offered {
        return None;
    }
    Some(KernelConfig {
        small_m_alt: Some(TileConfig {
            bn: width,
            stages: fitted_stages(width),
            ..alt
        }),
        ..*config
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::DType;
    use crate::select::{TunedTable, select_with};

    fn kind(name: &str, dtype: DType, layout: WeightLayout, source_tile: bool, gated: bool) -> KernelKind {
        KernelKind {
            gated,
            ..KernelKind::plain(name, dtype, layout, source_tile)
        }
    }

    fn shipped(kernel: &KernelKind) -> KernelConfig {
        select_with(
            &TunedTable::shipped(Arch::Sm90).expect("the shipped sm90 table"),
            Arch::Sm90,
            kernel,
        )
        .expect("the shipped sm90 table has it")
    }

    /// tile_config.cuh gives an sm90 block [`SMEM_PER_BLOCK`] bytes.
    #[test]
    fn tile_config_cuh_declares_the_shared_memory() {
        let header = include_str!("../../kernels/include/fusion/sm90/tile_config.cuh");
        let line = format!(
            "constexpr int kSmemPerBlock = {} * 1024;\n",
            SMEM_PER_BLOCK / 1024
        );
        assert!(header.contains(&line), "tile_config.cuh lacks `{}`", line.trim());
    }

    #[test]
    fn widths_fill_one_wave_of_four_rows() {
        for (n, width) in [
            (2560, 80),
            (3072, 96),
            (3584, 112),
            (4096, 128),
            (4544, 144),
            (5120, 160),
        ] {
            assert_eq!(fitted_width(n), width, "n = {n}");
            let tiles = ROWS_PER_WAVE * n.div_ceil(u64::from(width));
            assert!(tiles <= SM90_SMS, "n = {n}: {tiles} tiles");
            // One step narrower would need a second wave.
            let narrower = ROWS_PER_WAVE * n.div_ceil(u64::from(width - WIDTH_STEP));
            assert!(
                narrower > SM90_SMS,
                "n = {n}: {narrower} tiles at {}",
                width - WIDTH_STEP
            );
        }
        assert_eq!(fitted_width(100_000), MAX_WIDTH);
        assert_eq!(fitted_width(768), 32);
    }

    #[test]
    fn stages_fill_shared_memory_beside_the_whole_staging_tile() {
        for (width, stages) in [
            (80, 7),
            (96, 7),
            (112, 6),
            (128, 6),
            (144, 5),
            (160, 5),
            (192, 4),
            (256, 3),
        ] {
            assert_eq!(fitted_stages(width), stages, "width {width}");
            let used =
                |s: u32| s * (FITTED_ROWS + width) * STAGE_ROW_BYTES + FITTED_ROWS * width * 2 + SMEM_FIXED;
            assert!(used(stages) <= SMEM_PER_BLOCK && used(stages + 1) > SMEM_PER_BLOCK);
        }
        // The shipped tiles with their whole staging tile: 128x128 with 6
        // stages, 128x192 with 4.
        let table = shipped(&kind("gemm", DType::F16, WeightLayout::NK, false, false));
        assert_eq!(
            table.small_m_alt.map(|t| (t.bn, t.stages)),
            Some((128, fitted_stages(128)))
        );
        assert_eq!(
            table.large_alt.map(|t| (t.bn, t.stages)),
            Some((192, fitted_stages(192)))
        );
    }

    /// With the model (`FUSION_SELECT=model`), the fitted tile is among
    /// the tiers it chooses from per M bucket.
    #[test]
    fn the_model_chooses_among_the_fitted_tiers() {
        use crate::select::{TunedCache, model::Calibration, select_tuned};
        let plain = kind("gemm_residual", DType::F16, WeightLayout::NK, true, false);
        let table = TunedTable::shipped(Arch::Sm90).expect("the shipped sm90 table");
        let mut cache = TunedCache::default();
        cache.model = Some(Calibration::shipped_sm90());
        let selected =
            select_tuned(&table, &cache, Arch::Sm90, &plain, Some(2560), Some(10240)).expect("selected");
        let by_m = selected.config.by_m.expect("a tile per M bucket");
        // (The shipped calibration gives it the buckets m<=128 and m<=256.)
        let widths: Vec<u32> = by_m.iter().map(|t| t.bn).collect();
        assert!(widths.contains(&80), "{widths:?}");
    }

    #[test]
    fn fits_the_small_m_alternative_of_nk_gemms_only() {
        let plain = kind("gemm_residual", DType::BF16, WeightLayout::NK, true, false);
        let config = shipped(&plain);
        let fitted = fit_small_m_alt(&config, Arch::Sm90, &plain, 2560).expect("fitted");
        let alt = fitted.small_m_alt.expect("a small-M alternative");
        assert_eq!((alt.bm, alt.bn, alt.stages), (128, 80, 7));
        assert_eq!(alt.fields, config.small_m_alt.expect("shipped").fields);
        // Everything else as shipped.
        assert_eq!(
            KernelConfig {
                small_m_alt: config.small_m_alt,
                ..fitted
            },
            config
        );
        // N = 4096 fits the shipped 128 columns, 6144 the large_alt's 192
        // and 10240 the large tile's 256; N = 768 would be narrower than
        // any width measured.
        for n in [4096, 6144, 10240, 768] {
            assert_eq!(fit_small_m_alt(&config, Arch::Sm90, &plain, n), None, "n = {n}");
        }
        assert_eq!(fitted_width(6144), 192);
        // Other archs, [K, N] weights, gated GEMMs keep theirs.
        assert_eq!(fit_small_m_alt(&config, Arch::Sm80, &plain, 2560), None);
        let kn = kind("gemm", DType::F16, WeightLayout::KN, false, false);
        assert_eq!(fit_small_m_alt(&shipped(&kn), Arch::Sm90, &kn, 2560), None);
        let gated = kind("gemm_silu_glu", DType::F16, WeightLayout::NK, false, true);
        assert_eq!(
            fit_small_m_alt(&shipped(&gated), Arch::Sm90, &gated, 2 * 2560),
            None
        );
    }
}
