//! The pre-tuned tables, `kernels/tuned/<arch>.json`:
//!
//! ```json
//! { "arch": "sm80", "note": "...",
//!   "configs": {
//!     "default": { "large": { "bm": 128, ... }, "small_m": { ... }, "small_m_max": 256 },
//!     "gemm_bias_gelu.bf16": { "large": { ... } } } }
//! ```
//!
//! Keys are `<composition>.<dtype>`, `<composition>` or `default`, tried in
//! that order. An sm90 entry names `bm`, `bn`, `bk` (64), `stages` and
//! optionally `"schedule": "cooperative" | "pingpong"`. An entry may add
//! `small_m_alt`, a second tile for `m <= small_m_max` that the kernel runs
//! instead of `small_m` when it needs fewer waves on the device's SMs, and
//! `decode_max_m`, the largest M that runs the decode kernel
//! (`kernels/include/fusion/decode.cuh`) ahead of every tile (sm80 and
//! sm90; [N, K] weights only).
//!
//! The shipped tables are embedded (by each generation's module in
//! [`crate::target`]) so that a crate built outside this workspace gets them
//! too. Every table needs a `default` entry or one for each composition it
//! is asked for: there is no other fallback.

use super::{Arch, KernelConfig, SelectError};
use crate::ir::DType;
use indexmap::IndexMap;

/// One parsed tuned table.
#[derive(Clone, Debug, PartialEq)]
pub struct TunedTable {
    /// Where it came from, for error messages (`kernels/tuned/sm80.json`).
    pub file: String,
    pub arch: Arch,
    pub configs: IndexMap<String, KernelConfig>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct TableFile {
    arch: String,
    #[serde(default)]
    #[allow(dead_code, reason = "documentation for people reading the file")]
    note: Option<String>,
    configs: IndexMap<String, KernelConfig>,
}

impl TunedTable {
    /// Parses a table; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<TunedTable, SelectError> {
        let fail = |reason: String| SelectError::Table {
            file: file.to_owned(),
            reason,
        };
        let parsed: TableFile = serde_json::from_str(text).map_err(|e| fail(e.to_string()))?;
        let arch = Arch::parse(&parsed.arch).ok_or_else(|| {
            fail(format!(
                "unknown arch `{}`: expected {}",
                parsed.arch,
                Arch::names_listed()
            ))
        })?;
        Ok(TunedTable {
            file: file.to_owned(),
            arch,
            configs: parsed.configs,
        })
    }

    /// The table that ships with this version of fusion for `arch`.
    pub fn shipped(arch: Arch) -> Result<TunedTable, SelectError> {
        TunedTable::parse(&TunedTable::shipped_file(arch), arch.target().tuned_json)
    }

    /// `kernels/tuned/sm80.json`: where the table shipped for `arch` lives in
    /// the workspace.
    pub fn shipped_file(arch: Arch) -> String {
        format!("kernels/tuned/{}.json", arch.name())
    }

    /// The most specific entry for a composition and dtype, and its key.
    pub fn lookup(&self, composition: &str, dtype: DType) -> Option<(&str, &KernelConfig)> {
        [
            format!("{composition}.{dtype}"),
            composition.to_owned(),
            "default".to_owned(),
        ]
        .into_iter()
        .find_map(|key| self.configs.get_key_value(&key))
        .map(|(k, v)| (k.as_str(), v))
    }
}
