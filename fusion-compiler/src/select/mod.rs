//! Tile-config selection: which [`TileConfig`] each fused GEMM is rendered
//! with, per target architecture.
//!
//! The pre-tuned table for the architecture (`kernels/tuned/<arch>.json`,
//! embedded in this crate so a build needs no GPU) is the source unless a
//! tuned cache has measured the kernel (below): its entry for the
//! composition name and dtype, else for the composition name, else
//! `default.source_tile` for a composition that reads a residual or
//! multiplier tile or `default.gated` for a gated GEMM, else its `default`
//! entry. A table with none of these is a build error naming the file.
//! Selection checks that an entry gives the fields its mainloop takes; whether the tile fits the mainloop and the block's limits
//! (its shape rules, threads, registers, shared memory) is checked by nvcc:
//! codegen renders `static_assert`s of the header's own rules (`tile_valid`)
//! and sizes (sm90: `sizeof(SharedStorage)`) into the unit, their messages
//! naming the file and the entry (see [`crate::codegen`]), so that each rule
//! and size has one source. A tuned entry that does not fit is a build
//! error naming the file and the entry, never a launch that fails at run
//! time.
//!
//! Every kernel of an arch runs that arch's mainloop, norm compositions
//! included, and each config is one of that arch's tile configs, checked by
//! [`TileConfig::check`].
//!
//! M is only known at run time, so a kernel's [`KernelConfig`] holds a tile
//! for every M and, optionally, tiles its launcher picks among by M and the
//! device's SMs: a narrower large tile (`large_alt`), one or two small-M
//! tiles (`small_m`, `small_m_alt`) and the decode kernel (`decode_max_m`).
//!
//! A user's tuned cache ([`TunedCache`], `Builder::tuned` or `FUSION_TUNED`)
//! replaces the table's tiles for a kernel whose N and K are static and
//! which the cache has measured on the arch ([`select_tuned`]); anything
//! wrong with the cache is a warning and the table's config, never an error.
//!
//! Not here: measuring configs (the tuner writes the cache this reads).

mod few_m;
mod fitted;
pub mod guard;
pub mod model;
mod tuned;
mod tuned_cache;

pub use crate::gemm_model::FEW_M_DEEP_K;
pub use crate::target::{Arch, Schedule, TierChoice, TileConfig};
pub use few_m::few_m_tile;
pub use fitted::{fitted_stages, fitted_width};
pub use tuned::{GATED_DEFAULT, SOURCE_TILE_DEFAULT, TunedTable};
pub use tuned_cache::{CacheEntry, CacheKey, M_BUCKET_BOUNDS, MBucket, SELECT_ENV, TUNED_ENV, TunedCache};

use crate::fuse::GemmComposition;
use crate::ir::{DType, WeightLayout};
use std::fmt;

/// The rule by which a unit on `arch` chooses among its tiers per call:
/// its generation's (`Target::tier_choice`), or where its config came from
/// a tuned cache (`tuned`), [`TierChoice::WaveArea`], which the cache's
/// mapping of its buckets onto tiers assumes
/// ([`TunedCache::config_for`]).
pub fn tier_choice(arch: Arch, tuned: bool) -> TierChoice {
    if tuned {
        TierChoice::WaveArea
    } else {
        arch.target().tier_choice
    }
}

/// What a config is chosen for: the parts of a GEMM kernel that change
/// its resource use.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelKind {
    /// The composition's name (`gemm_bias_gelu`): the tuned table's key.
    pub name: String,
    /// The element type.
    pub dtype: DType,
    /// How B is stored.
    pub layout: WeightLayout,
    /// Has a norm before the GEMM (folded into B, or normalized into
    /// scratch first: kernels/include/fusion/prologue.cuh).
    pub prologue: bool,
    /// Its epilogue reads one [M, N] tile (a residual or a multiplier), its
    /// source tile: `fusion::EpilogueChain::kSourceTile` (a gated chain
    /// reads its tiles element by element: `fusion::GatedChain`).
    pub source_tile: bool,
    /// A gated GEMM (gate and up interleaved in B, `fusion::GatedChain`),
    /// whose tile of BN GEMM columns writes BN / 2 columns of C.
    pub gated: bool,
}

impl KernelKind {
    /// The kind of a planned GEMM composition in `dtype`.
    pub fn of(composition: &GemmComposition, dtype: DType) -> KernelKind {
        KernelKind {
            name: composition.name(),
            dtype,
            layout: composition.b_layout,
            prologue: composition.prologue.is_some(),
            source_tile: composition.gate.is_none() && composition.source_tiles() == 1,
            gated: composition.gate.is_some(),
        }
    }

    /// A kind without a norm before the GEMM and not gated, for tests.
    #[cfg(test)]
    pub(crate) fn plain(name: &str, dtype: DType, layout: WeightLayout, source_tile: bool) -> KernelKind {
        KernelKind {
            name: name.to_owned(),
            dtype,
            layout,
            prologue: false,
            source_tile,
            gated: false,
        }
    }

    /// The tuned tables' entry for kernels of this kind that have none of
    /// their own, tried before `default`: [`tuned::SOURCE_TILE_DEFAULT`] or
    /// [`tuned::GATED_DEFAULT`].
    pub fn kind_default(&self) -> Option<&'static str> {
        if self.source_tile {
            Some(tuned::SOURCE_TILE_DEFAULT)
        } else if self.gated {
            Some(tuned::GATED_DEFAULT)
        } else {
            None
        }
    }
}

/// The config(s) one kernel is rendered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct KernelConfig {
    /// Used for every M (above `small_m_max`, when there is a small config).
    pub large: TileConfig,
    /// A tile for `m <= small_m_max`. How a launch chooses among the tiers
    /// is its generation's rule ([`crate::target::TierChoice`]): on sm90
    /// every tier in range of M competes and the one whose busiest CTA
    /// loads least runs (`fusion::LightestTier` in gemm.cuh); on sm80 and
    /// sm75, and for a tuned cache's tiles, the small-M tiers serve every
    /// `m <= small_m_max` and the large ones the rest.
    #[serde(default)]
    pub small_m: Option<TileConfig>,
    /// The largest M the small-M tiles serve (or, on sm90, compete for).
    #[serde(default)]
    pub small_m_max: Option<u32>,
    /// A second tile for `m <= small_m_max`, with more rows than `small_m`.
    /// Where the small-M tiers serve alone, the kernel runs whichever of
    /// the two needs fewer waves of tile area on the device's SMs
    /// (`fusion::fewer_waves` in gemm.cuh), the larger tile on a tie: at
    /// m = 128 the 128-row tile when N gives it enough tiles to fill the
    /// SMs, the 64-row one when it does not.
    #[serde(default)]
    pub small_m_alt: Option<TileConfig>,
    /// A second tile for the Ms `large` serves, narrower than it. Between
    /// the two, both rules run it when it needs at most 1.2 times `large`'s
    /// waves (9/10 of its waves of tile area, `fusion::clearly_fewer_waves`
    /// in gemm.cuh): on 132 SMs the 128x192 tile at (1000, 18944, 3584),
    /// whose 792 tiles take 6 waves where 592 of 128x256 take 5 of a third
    /// more area each (on sm90 a tie in loads, which the half-idle last wave
    /// of 128x256 decides).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub large_alt: Option<TileConfig>,
    /// The largest M the decode kernel (`kernels/include/fusion/decode.cuh`)
    /// runs, ahead of every tile config; absent: never. The kernel streams
    /// B as [N, K] rows, so a [K, N] kernel ignores it
    /// ([`KernelConfig::decode_for`]). Its own limit (`kDecodeMaxM`, 16) is
    /// asserted by each unit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decode_max_m: Option<u32>,
    /// One tile per M bucket ([`MBucket`], smallest M first), chosen at
    /// build time for a GEMM whose N and K are static by the model of the
    /// kernel's time ([`model::choose_by_m`]): the launcher runs the
    /// bucket's tile for the Ms the decode kernel does not take. With it,
    /// `large` is the last bucket's tile and the other tiers are absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub by_m: Option<[TileConfig; MBucket::COUNT]>,
    /// A 64-row tile the sm90 launcher runs after the decode kernel and
    /// ahead of the other tiers wherever its tiles make one wave, in one
    /// row or, where K is at most [`FEW_M_DEEP_K`], two (`few_m_runs` in
    /// gemm.cuh), ahead of `by_m` too. The selection gives every sm90 GEMM
    /// of 16-bit elements with B [N, K], not gated, a 64x64 one
    /// ([`few_m_tile`]); a table or candidate list may name another for
    /// such a GEMM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub few_m: Option<TileConfig>,
}

impl KernelConfig {
    /// The small-M config and its threshold, when both are present.
    pub fn small(&self) -> Option<(TileConfig, u32)> {
        Some((self.small_m?, self.small_m_max?))
    }

    /// Each tier by the tuned tables' name for it (which
    /// `FUSION_GEMM_TILE` also takes), with its tile where it has one.
    pub fn tiers(&self) -> [(&'static str, Option<TileConfig>); 4] {
        [
            ("large", Some(self.large)),
            ("large_alt", self.large_alt),
            ("small_m", self.small_m),
            ("small_m_alt", self.small_m_alt),
        ]
    }

    /// The tiles of [`KernelConfig::by_m`] with the largest M each serves
    /// (`None`: every M above), neighbouring buckets of one tile merged;
    /// empty without it.
    pub fn tiers_by_m(&self) -> Vec<(Option<u32>, TileConfig)> {
        let mut tiers: Vec<(Option<u32>, TileConfig)> = Vec::new();
        for (bucket, tile) in MBucket::all().zip(self.by_m.iter().flatten()) {
            match tiers.last_mut() {
                Some((max_m, last)) if last == tile => *max_m = bucket.max_m(),
                _ => tiers.push((bucket.max_m(), *tile)),
            }
        }
        tiers
    }

    /// The config of every sm90 FP8 GEMM: the cooperative 128x128 tile
    /// (6 stages) for large M and 64x128 (8 stages) for M <= 512, the
    /// 16-bit table's small-M pair, with k-blocks of 128 FP8 elements: the
    /// same 128 bytes a row of A and B as their 64 16-bit ones, so the same
    /// stages fit beside the whole staging tile (which a residual or mul
    /// needs). No wider tile: an FP8 consumer holds its accumulators twice
    /// (`kPromote` in kernels/include/fusion/sm90/collective_mainloop.cuh).
    /// Not tuned or measured for FP8; no decode kernel (it reads 16-bit
    /// weights) and no tile per M bucket (the model is of 16-bit GEMMs).
    pub const fn fp8_sm90() -> KernelConfig {
        KernelConfig {
            large: TileConfig::sm90(128, 128, 6, None).with_fp8_block(),
            small_m: Some(TileConfig::sm90(64, 128, 8, None).with_fp8_block()),
            small_m_max: Some(512),
            small_m_alt: None,
            large_alt: None,
            decode_max_m: None,
            by_m: None,
            few_m: None,
        }
    }

    /// Up to which M a kernel with B in `layout` runs the decode kernel:
    /// `decode_max_m` for [N, K], none for [K, N].
    pub fn decode_for(&self, layout: WeightLayout) -> Option<u32> {
        self.decode_max_m.filter(|_| layout == WeightLayout::NK)
    }
}

/// The tuned entry a config came from, for errors:
/// `kernels/tuned/sm80.json`, entry `gemm_bias_gelu.f16`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConfigSource {
    /// The table's file (`kernels/tuned/sm80.json`), or the tuned cache's.
    pub file: String,
    /// The entry's key (`gemm_bias_gelu.f16`); for a tuned cache, the
    /// entries' keys.
    pub entry: String,
}

impl ConfigSource {
    /// Where [`KernelConfig::fp8_sm90`] comes from, for the unit's checks.
    pub fn fp8_sm90() -> ConfigSource {
        ConfigSource {
            file: "fusion-compiler/src/select/mod.rs".to_owned(),
            entry: "KernelConfig::fp8_sm90 (not tuned)".to_owned(),
        }
    }
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}, entry `{}`", self.file, self.entry)
    }
}

/// Why no config could be chosen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// A tuned table is not valid JSON of the expected form.
    #[error("{file}: {reason}")]
    Table {
        /// The table's file.
        file: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The table has no entry for the kernel and no `default`.
    #[error(
        "{file} has no entry `{kernel}.{dtype}`, `{kernel}` or `default` for a kernel of {arch}: add one"
    )]
    NoEntry {
        /// The table's file.
        file: String,
        /// The kernel's composition name.
        kernel: String,
        /// Its element type.
        dtype: DType,
        /// The arch it was chosen for.
        arch: Arch,
    },
    /// A config does not fit the architecture or the mainloop.
    #[error("tile config from {origin} for `{kernel}` ({which}) does not fit {arch}: {reason}")]
    Invalid {
        /// The entry the config came from.
        origin: ConfigSource,
        /// The kernel's composition name.
        kernel: String,
        /// The arch it does not fit.
        arch: Arch,
        /// `large`, `large_alt`, `small_m`, `small_m_alt` or `decode_max_m`.
        which: &'static str,
        /// Which rule it breaks.
        reason: String,
    },
}

/// The checked config for a kernel on `arch`: `table`'s entry for it (see
/// [`TunedTable::lookup`]).
pub fn select_with(table: &TunedTable, arch: Arch, kernel: &KernelKind) -> Result<KernelConfig, SelectError> {
    select_sourced(table, arch, kernel).map(|(config, _)| config)
}

/// [`select_with`], and the entry the config came from (for the checks
/// codegen renders into the unit).
pub fn select_sourced(
    table: &TunedTable,
    arch: Arch,
    kernel: &KernelKind,
) -> Result<(KernelConfig, ConfigSource), SelectError> {
    let (entry, config) = table
        .lookup(&kernel.name, kernel.dtype, kernel.kind_default())
        .ok_or_else(|| SelectError::NoEntry {
            file: table.file.clone(),
            kernel: kernel.name.clone(),
            dtype: kernel.dtype,
            arch,
        })?;
    let config = *config;
    let source = ConfigSource {
        file: table.file.clone(),
        entry: entry.to_owned(),
    };
    check_config(&config, &source, arch, kernel)?;
    Ok((config, source))
}

/// What [`select_tuned`] chose for one kernel.
#[derive(Clone, Debug, PartialEq)]
pub struct Selected {
    /// The config.
    pub config: KernelConfig,
    /// Where it came from.
    pub origin: ConfigSource,
    /// The static N and K the config was tuned for, when it came from a
    /// tuned cache (a shipped table's config serves every shape).
    pub tuned_for: Option<(u64, u64)>,
    /// The width of the table's `small_m_alt` fitted to a static N
    /// ([`fitted_width`]), where it was.
    pub fitted_width: Option<u32>,
    /// Why a cached config was not used, naming the cache file and key.
    pub warning: Option<String>,
}

/// The config for a kernel whose GEMM has static `n` and `k` (`None`:
/// dynamic): `cache`'s, mapped onto tiers ([`TunedCache::config_for`]),
/// where N and K are static and it has entries for the kernel on `arch`;
/// else, where N and K are static and the cache carries a model
/// ([`TunedCache::model`]), one tile per M bucket by the model
/// ([`model::select_by_model`]); else `table`'s ([`select_sourced`]), with
/// a `few_m` tile where it applies ([`few_m_tile`]) and, where N is
/// static, its `small_m_alt` fitted to N where that applies
/// (`select::fitted`). A cached config that fails the
/// table's checks ([`check_config`]) is a warning, and the table's config (fitted).
pub fn select_tuned(
    table: &TunedTable,
    cache: &TunedCache,
    arch: Arch,
    kernel: &KernelKind,
    n: Option<u64>,
    k: Option<u64>,
) -> Result<Selected, SelectError> {
    let (config, origin) = select_sourced(table, arch, kernel)?;
    let shipped = Selected {
        config: few_m::with_few_m(&config, arch, kernel),
        origin,
        tuned_for: None,
        fitted_width: None,
        warning: None,
    };
    let (Some(n), Some(k)) = (n, k) else {
        return Ok(shipped);
    };
    // The model chooses among the tiers a build with this N has, the
    // fitted one among them; a tuned cache maps its buckets onto the
    // table's.
    let fitted = fit_to_n(shipped.clone(), arch, kernel, n);
    let Some((tuned, tuned_origin)) = cache
        .config_for(arch, kernel, n, k, &shipped.config)
        .or_else(|| model::select_by_model(cache.model.as_ref()?, arch, kernel, n, k, &fitted.config))
    else {
        return Ok(fitted);
    };
    Ok(match check_config(&tuned, &tuned_origin, arch, kernel) {
        Ok(()) => Selected {
            config: tuned,
            origin: tuned_origin,
            tuned_for: Some((n, k)),
            fitted_width: None,
            warning: None,
        },
        Err(error) => Selected {
            warning: Some(format!("{error}; using {} instead", fitted.origin)),
            ..fitted
        },
    })
}

/// `shipped` with its `small_m_alt` fitted to the static `n`
/// ([`fitted::fit_small_m_alt`]), its origin saying so; else as it is.
fn fit_to_n(shipped: Selected, arch: Arch, kernel: &KernelKind, n: u64) -> Selected {
    let Some(config) = fitted::fit_small_m_alt(&shipped.config, arch, kernel, n) else {
        return shipped;
    };
    let width = config.small_m_alt.map(|tile| tile.bn);
    let origin = ConfigSource {
        entry: format!(
            "{} (small_m_alt fitted to N: {} columns)",
            shipped.origin.entry,
            width.unwrap_or_default()
        ),
        ..shipped.origin
    };
    Selected {
        config,
        origin,
        fitted_width: width,
        ..shipped
    }
}

/// Checks that `config`, from `source`, gives `kernel` on `arch` what its
/// mainloop takes: every tile through [`TileConfig::check`], each optional tile with
/// what it needs, `decode_max_m` only where there is a decode kernel. The
/// one check of a shipped table's entry and of the config a tuned cache
/// gives ([`TunedCache`]).
pub fn check_config(
    config: &KernelConfig,
    source: &ConfigSource,
    arch: Arch,
    kernel: &KernelKind,
) -> Result<(), SelectError> {
    let fail = |which, reason| SelectError::Invalid {
        origin: source.clone(),
        kernel: kernel.name.clone(),
        arch,
        which,
        reason,
    };
    config
        .large
        .check(arch, kernel.gated)
        .map_err(|r| fail("large", r))?;
    // The optional tiles: each fits the arch and comes with what it needs.
    let optional = [
        (
            config.small_m,
            "small_m",
            config.small_m_max.is_some(),
            "`small_m` needs `small_m_max`, the largest M it serves",
        ),
        (
            config.small_m_alt,
            "small_m_alt",
            config.small_m.is_some(),
            "`small_m_alt` is the alternative to a `small_m`, which this entry lacks",
        ),
        (config.large_alt, "large_alt", true, ""),
        (
            config.few_m,
            "few_m",
            arch == Arch::Sm90
                && kernel.layout == WeightLayout::NK
                && !kernel.gated
                && !kernel.dtype.is_fp8(),
            "`few_m` is a tile of the sm90 launchers of 16-bit GEMMs with B [N, K] that are not gated",
        ),
    ];
    if let Some(tiles) = &config.by_m {
        for tile in tiles {
            tile.check(arch, kernel.gated).map_err(|r| fail("by_m", r))?;
        }
        let tiered = config.small_m.is_some() || config.small_m_alt.is_some() || config.large_alt.is_some();
        if tiered || tiles[MBucket::COUNT - 1] != config.large {
            return Err(fail(
                "by_m",
                "`by_m` gives every M's tile: `large` is its last and the other tiers are left out".into(),
            ));
        }
    }
    if let Some(max_m) = config.decode_max_m {
        if !arch.target().decode {
            return Err(fail(
                "decode_max_m",
                format!(
                    "{arch} has no decode kernel (it needs the m16n8k16 mma of sm80 and newer); leave it out"
                ),
            ));
        }
        if max_m == 0 {
            return Err(fail(
                "decode_max_m",
                "`decode_max_m` is the largest M the decode kernel runs: at least 1, or left out for never"
                    .into(),
            ));
        }
    }
    for (tile, which, complete, missing) in optional {
        if let Some(tile) = tile {
            tile.check(arch, kernel.gated).map_err(|r| fail(which, r))?;
            if !complete {
                return Err(fail(which, missing.into()));
            }
        }
    }
    Ok(())
}

/// What the tables shipped for `archs` say loses to its split: the rules
/// the planner follows for a build that compiles for them (one plan serves
/// every arch, so a rule of any of them holds for all).
pub fn split_rules(archs: &[Arch]) -> Result<Vec<crate::fuse::SplitRule>, SelectError> {
    let mut rules = Vec::new();
    for &arch in archs {
        rules.extend(TunedTable::shipped(arch)?.unfused);
    }
    Ok(rules)
}

/// [`select_with`] the table shipped for `arch`.
pub fn select(arch: Arch, kernel: &KernelKind) -> Result<KernelConfig, SelectError> {
    select_with(&TunedTable::shipped(arch)?, arch, kernel)
}

#[cfg(test)]
mod tests;
