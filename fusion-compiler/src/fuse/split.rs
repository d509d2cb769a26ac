//! Fusions known to lose: GEMM compositions that a tuned table measured
//! slower than their unfused split on some range of static shapes. The
//! matcher never forms one of them there; it fuses less (the chain's last
//! epilogue steps, or its norm, run as standalone kernels; the steps as one
//! elementwise chain) and the plan records why ([`Split`]), so that
//! `fusion plan` can say so.
//!
//! The rules come from the tuned tables of the architectures a build
//! compiles for (`"unfused"` in `kernels/tuned/<arch>.json`, read by
//! [`crate::select::TunedTable`]); one plan serves every architecture, so a
//! composition that loses on any of them is split on all.

use super::plan::GemmComposition;

/// One composition that loses to its split, on the static shapes within its
/// bounds (inclusive; absent bounds are unbounded).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SplitRule {
    /// The composition's name (`gemm_bias_residual`).
    pub composition: String,
    /// Bounds on the GEMM's static N.
    pub n: DimBounds,
    /// Bounds on the GEMM's static K.
    pub k: DimBounds,
    /// What was measured, for `fusion plan` (a sentence, with where it is
    /// recorded: "0.88 of cuBLASLt BIAS + beta·C at (512, 2048, 2048),
    /// benchmarks/HISTORY.md v13").
    pub reason: String,
    /// The table it comes from: `kernels/tuned/sm90.json`.
    pub origin: String,
}

/// Bounds on one static dim of a GEMM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DimBounds {
    /// The smallest size within, if any.
    pub min: Option<u64>,
    /// The largest size within, if any.
    pub max: Option<u64>,
}

impl DimBounds {
    fn is_unbounded(self) -> bool {
        self.min.is_none() && self.max.is_none()
    }

    /// Whether a dim of size `value` (`None`: dynamic) lies within. A
    /// dynamic dim is within only unbounded ones: nothing was measured to
    /// lose at sizes the build cannot know.
    fn holds(self, value: Option<u64>) -> bool {
        match value {
            None => self.is_unbounded(),
            Some(v) => self.min.is_none_or(|min| v >= min) && self.max.is_none_or(|max| v <= max),
        }
    }
}

impl SplitRule {
    /// Whether the rule refuses `composition` at static N and K
    /// (`None`: dynamic).
    pub fn refuses(&self, composition: &GemmComposition, n: Option<u64>, k: Option<u64>) -> bool {
        self.composition == composition.name() && self.n.holds(n) && self.k.holds(k)
    }
}

/// A fusion the matcher did not form, and what it formed instead.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// The composition it would have formed (`gemm_bias_residual`).
    pub refused: String,
    /// The composition it formed in its place (`gemm_bias`); the ops left
    /// out run as kernels of their own.
    pub kept: String,
    /// The rule's reason ([`SplitRule::reason`]).
    pub reason: String,
    /// The table the rule comes from.
    pub origin: String,
}
