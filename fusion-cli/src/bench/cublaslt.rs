//! The vendor baseline: cuBLASLt GEMMs with their fused epilogues (BIAS,
//! RELU_BIAS, GELU_BIAS) or none, planned once and launched many times
//! (`fusion::vendor::LtGemm`, which the run time's guard runs too).
//!
//! Descriptors, layouts and the heuristic's candidate algorithms are made
//! when the plan is made, so a timed call is one `cublasLtMatmul`, as a tuned
//! application would issue it. A plan runs one of its candidates, the
//! heuristic's first unless [`LtGemm::choose`] picked another
//! (`bench::vendor` times them); [`ChosenConfig`] says which for the report.

use cudarc::cublaslt::{result, sys};
use fusion::error::{Error, Result};
pub use fusion::vendor::{LtEpilogue, LtGemm};
use serde::{Deserialize, Serialize};

fn lt(e: cudarc::cublaslt::result::CublasError) -> Error {
    Error::Launch {
        kernel: "cublasLtMatmul".into(),
        code: e.0 as i32,
        message: format!("{e:?}"),
    }
}

/// The configuration of the algorithm a plan runs, as cuBLASLt reports it.
pub trait ChosenConfig {
    /// [`LtAlgoConfig`] of the algorithm [`LtGemm::run`] uses.
    fn chosen_config(&self) -> Result<LtAlgoConfig>;
}

impl ChosenConfig for LtGemm {
    fn chosen_config(&self) -> Result<LtAlgoConfig> {
        LtAlgoConfig::of(self.chosen_algo(), self.chosen())
    }
}

/// What identifies a cuBLASLt algorithm: its `CUBLASLT_ALGO_CONFIG_*`
/// attributes (numbering as in cuBLASLt's headers: `tile` is a
/// `cublasLtMatmulTile_t`, `stages` a `cublasLtMatmulStages_t`, …), and its
/// place in the heuristic's list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LtAlgoConfig {
    /// 0 for the heuristic's first.
    pub heuristic_rank: usize,
    /// `CUBLASLT_ALGO_CONFIG_ID`: the algorithm.
    pub id: u64,
    /// `CUBLASLT_ALGO_CONFIG_TILE_ID`: a `cublasLtMatmulTile_t`.
    pub tile: u64,
    /// `CUBLASLT_ALGO_CONFIG_STAGES_ID`: a `cublasLtMatmulStages_t`.
    pub stages: u64,
    /// `CUBLASLT_ALGO_CONFIG_SPLITK_NUM`: the number of K splits.
    pub splitk: u64,
    /// `CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME`: how split-K partial results
    /// are reduced, a `cublasLtReductionScheme_t`.
    pub reduction_scheme: u64,
    /// `CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING`: whether thread blocks are
    /// swizzled.
    pub cta_swizzling: u64,
    /// `CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION`: the algorithm's custom option.
    pub custom_option: u64,
    /// `CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID`: a `cublasLtMatmulInnerShape_t`.
    pub inner_shape: u64,
    /// `CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID`: a `cublasLtClusterShape_t`.
    pub cluster_shape: u64,
}

impl LtAlgoConfig {
    fn of(algo: &sys::cublasLtMatmulAlgo_t, heuristic_rank: usize) -> Result<LtAlgoConfig> {
        use sys::cublasLtMatmulAlgoConfigAttributes_t::*;
        let get = |attr: sys::cublasLtMatmulAlgoConfigAttributes_t| -> Result<u64> {
            // cuBLASLt wants the attribute's exact size (1 to 8 bytes, by
            // attribute and version): ask for it, then read that many.
            let mut size = 0usize;
            let mut bytes = [0u8; 8];
            // SAFETY: `algo` is a live heuristic result; the first call only
            // writes the size to a live local; the second writes `size` ≤ 8
            // bytes into `bytes`, checked before the call.
            unsafe {
                sys::cublasLtMatmulAlgoConfigGetAttribute(algo, attr, std::ptr::null_mut(), 0, &mut size)
                    .result()
                    .map_err(lt)?;
                if size > bytes.len() {
                    return Err(lt(result::CublasError(
                        sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
                    )));
                }
                sys::cublasLtMatmulAlgoConfigGetAttribute(
                    algo,
                    attr,
                    bytes.as_mut_ptr().cast(),
                    size,
                    &mut size,
                )
                .result()
                .map_err(lt)?;
            }
            // Every attribute is an unsigned (or non-negative) integer.
            Ok(u64::from_le_bytes(bytes))
        };
        Ok(LtAlgoConfig {
            heuristic_rank,
            id: get(CUBLASLT_ALGO_CONFIG_ID)?,
            tile: get(CUBLASLT_ALGO_CONFIG_TILE_ID)?,
            stages: get(CUBLASLT_ALGO_CONFIG_STAGES_ID)?,
            splitk: get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)?,
            reduction_scheme: get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)?,
            cta_swizzling: get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)?,
            custom_option: get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION)?,
            inner_shape: get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID)?,
            cluster_shape: get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)?,
        })
    }
}

/// The version of the cuBLASLt library loaded, as `cublasLtGetVersion`
/// reports it (major·10000 + minor·100 + patch).
pub fn version() -> usize {
    // SAFETY: takes no arguments and reads no state but the loaded library's.
    unsafe { sys::cublasLtGetVersion() }
}
