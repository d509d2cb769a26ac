//! The pre-tuned tables, `kernels/tuned/<arch>.json`:
//!
//! ```json
//! { "arch": "sm80", "note": "...",
//!   "configs": {
//!     "default": { "large": { "bm": 128, ... }, "small_m": { ... }, "small_m_max": 256 },
//!     "gemm_bias_gelu.bf16": { "large": { ... } } } }
//! ```
//!
//! Keys are `<composition>.<dtype>`, `<composition>`, `default.source_tile`
//! (only for a composition whose epilogue reads one [M, N] tile: a residual
//! or a multiplier, which the sm90 epilogue brings into its staging tile
//! whole, so its tile needs room for that beside the stages) or
//! `default.gated` (only for a gated GEMM, whose tile writes half its
//! columns of C) or `default`, tried in that order. A tile's fields are
//! those of the table's generation, as its module in [`crate::target`]
//! spells them (every tile has `bm`, `bn`, `bk` and `stages`; an sm90 tile
//! adds [`crate::target::sm90::Fields`]). An entry may add
//! `small_m_alt`, a second tile for `m <= small_m_max`, `large_alt`, a
//! narrower tile than `large`, each of which a launch runs where its
//! generation's rule says ([`crate::target::TierChoice`]: on sm90 the tier
//! whose busiest CTA loads least; on sm80 and sm75 `small_m_alt` where it
//! needs fewer waves than `small_m` and `large_alt` where it needs at most
//! 9/10 of `large`'s waves of tile area), and
//! `decode_max_m`, the largest M that runs the decode kernel
//! (`kernels/include/fusion/decode.cuh`) ahead of every tile (sm80 and
//! sm90; [N, K] weights only).
//!
//! A table may also list compositions its measurements found slower than
//! their unfused split, which the planner then does not form:
//!
//! ```json
//!   "unfused": { "gemm_bias_residual": { "reason": "0.88 of cuBLASLt ...", "max_k": 2048 } }
//! ```
//!
//! with optional inclusive bounds `min_n`, `max_n`, `min_k`, `max_k` on the
//! GEMM's static dims (a dynamic dim meets only unbounded ones).
//!
//! The shipped tables are embedded (by each generation's module in
//! [`crate::target`]) so that a crate built outside this workspace gets them
//! too. Every table needs a `default` entry or one for each composition it
//! is asked for: there is no other fallback.

use super::{Arch, KernelConfig, SelectError, TileConfig};
use crate::fuse::{DimBounds, SplitRule};
use crate::ir::DType;
use indexmap::IndexMap;

/// The entry for compositions whose epilogue reads one [M, N] source tile,
/// before `default`.
pub const SOURCE_TILE_DEFAULT: &str = "default.source_tile";
/// The entry for gated GEMMs, before `default`.
pub const GATED_DEFAULT: &str = "default.gated";

/// One parsed tuned table.
#[derive(Clone, Debug, PartialEq)]
pub struct TunedTable {
    /// Where it came from, for error messages (`kernels/tuned/sm80.json`).
    pub file: String,
    /// The arch it is for.
    pub arch: Arch,
    /// Its entries by key (`gemm_bias_gelu.f16`, `default`, …), in file order.
    pub configs: IndexMap<String, KernelConfig>,
    /// Compositions measured slower than their unfused split, which the
    /// planner does not form ([`crate::fuse::split`]).
    pub unfused: Vec<SplitRule>,
}

/// An `"unfused"` entry: `{ "reason": "...", "max_k": 4096 }`, bounds on
/// the GEMM's static N and K (inclusive, each optional).
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct UnfusedEntry {
    reason: String,
    #[serde(default)]
    min_n: Option<u64>,
    #[serde(default)]
    max_n: Option<u64>,
    #[serde(default)]
    min_k: Option<u64>,
    #[serde(default)]
    max_k: Option<u64>,
}

/// A table's `arch`, read before the rest.
#[derive(serde::Deserialize)]
struct TableHead {
    arch: String,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TableFile {
    #[allow(dead_code, reason = "read first, by TableHead")]
    arch: String,
    #[serde(default)]
    #[allow(dead_code, reason = "documentation for people reading the file")]
    note: Option<String>,
    configs: IndexMap<String, KernelConfig>,
    #[serde(default)]
    unfused: IndexMap<String, UnfusedEntry>,
}

impl TunedTable {
    /// Parses a table; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<TunedTable, SelectError> {
        let fail = |reason: String| SelectError::Table {
            file: file.to_owned(),
            reason,
        };
        // The arch first: it says whose tile configs the entries are.
        let head: TableHead = serde_json::from_str(text).map_err(|e| fail(e.to_string()))?;
        let arch = Arch::parse(&head.arch).ok_or_else(|| {
            fail(format!(
                "unknown arch `{}`: expected {}",
                head.arch,
                Arch::names_listed()
            ))
        })?;
        let parsed: TableFile =
            TileConfig::read_for(arch, || serde_json::from_str(text)).map_err(|e| fail(e.to_string()))?;
        let mut unfused = Vec::new();
        for (composition, entry) in parsed.unfused {
            // A bare GEMM has nothing to split off.
            if composition == "gemm" || !composition.contains("gemm") {
                return Err(fail(format!(
                    "unfused `{composition}`: only a GEMM composition with a norm or epilogue steps can be split"
                )));
            }
            unfused.push(SplitRule {
                composition,
                n: DimBounds {
                    min: entry.min_n,
                    max: entry.max_n,
                },
                k: DimBounds {
                    min: entry.min_k,
                    max: entry.max_k,
                },
                reason: entry.reason,
                origin: file.to_owned(),
            });
        }
        Ok(TunedTable {
            file: file.to_owned(),
            arch,
            configs: parsed.configs,
            unfused,
        })
    }

    /// The table that ships with this version of fusion for `arch`.
    pub fn shipped(arch: Arch) -> Result<TunedTable, SelectError> {
        TunedTable::parse(&TunedTable::shipped_file(arch), arch.target().tuned_json)
    }

    /// `kernels/tuned/sm80.json`: where the table shipped for `arch` lives in
    /// fusion-compiler.
    pub fn shipped_file(arch: Arch) -> String {
        format!("kernels/tuned/{}.json", arch.name())
    }

    /// The most specific entry for a composition and dtype, and its key;
    /// `kind_default`: the entry for its kind of kernel, tried before
    /// `default` ([`super::KernelKind::kind_default`]).
    pub fn lookup(
        &self,
        composition: &str,
        dtype: DType,
        kind_default: Option<&str>,
    ) -> Option<(&str, &KernelConfig)> {
        [
            Some(format!("{composition}.{dtype}")),
            Some(composition.to_owned()),
            kind_default.map(str::to_owned),
            Some("default".to_owned()),
        ]
        .into_iter()
        .flatten()
        .find_map(|key| self.configs.get_key_value(&key))
        .map(|(k, v)| (k.as_str(), v))
    }
}
