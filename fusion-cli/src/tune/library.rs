//! A shared library of kernels fusion built (a tuning candidate's, or a
//! `fusion run` kernel's), loaded into the process, and its launcher
//! functions (`fusion-compiler/kernels/include/fusion/abi.h`) looked up by
//! symbol, as a plan table's entries take them.
//!
//! Libraries are never unloaded: each carries its own CUDA run time, whose
//! exit handlers must find its code still mapped when the process ends.

use crate::table::one;
use fusion::abi::{fusion_fold_params, fusion_gemm_params, fusion_tile_resources};
use fusion::launch::{ErrorString, FoldWeights, Launcher, WorkspaceBytes};
use fusion::plan::Launchers;
use fusion_compiler::fuse::{Composition, FusedKernel};
use fusion_compiler::ir::Graph;
use std::ffi::{CStr, c_int, c_void};
use std::path::{Path, PathBuf};

/// `<symbol>_resources` (abi.h).
type Resources = unsafe extern "C" fn(*mut fusion_tile_resources, c_int) -> c_int;

/// A shared library fusion built, loaded for the rest of the process.
pub struct SharedLibrary {
    library: &'static libloading::Library,
    path: PathBuf,
}

impl SharedLibrary {
    /// Loads the library at `path`.
    ///
    /// # Safety
    /// The library must be one [`super::compile`] built from units fusion
    /// rendered: loading runs its initializers.
    pub unsafe fn load(path: &Path) -> Result<SharedLibrary, String> {
        // SAFETY: the caller vouches for the library (see above).
        let library = unsafe { libloading::Library::new(path) }
            .map_err(|e| format!("cannot load {}: {e}", path.display()))?;
        // Never unloaded (module comment): its functions stay valid for
        // the process's life.
        Ok(SharedLibrary {
            library: Box::leak(Box::new(library)),
            path: path.to_owned(),
        })
    }

    /// The launchers of the unit with launcher `symbol`, rendered for
    /// `kernel` of `graph`, as a plan table's entry takes them
    /// ([`crate::table`]): the launcher (and a GEMM's workspace query),
    /// the folded form where the kernel's norm folds into its weight, and
    /// `_fold_weights` where binding prepares its weights.
    ///
    /// # Safety
    /// The library holds a unit fusion rendered for `kernel` of `graph`
    /// (abi.h's functions, with its signatures, for that kind of kernel).
    pub unsafe fn launchers(
        &self,
        symbol: &str,
        kernel: &FusedKernel,
        graph: &Graph,
    ) -> Result<Launchers, String> {
        // SAFETY: each type is the one abi.h declares for that name, which
        // fusion's templates render for this kind of kernel.
        unsafe {
            Ok(match kernel.composition {
                Composition::Gemm(_) => Launchers::Gemm {
                    launch: one(self.get(symbol)?),
                    query: one(self.get(&format!("{symbol}_workspace_bytes"))?),
                    folded: if kernel.norm_foldable(graph) {
                        one((
                            self.get(&format!("{symbol}_folded"))?,
                            self.get(&format!("{symbol}_folded_workspace_bytes"))?,
                        ))
                    } else {
                        &[]
                    },
                    fold: if kernel.prepares_weights(graph) {
                        one(self.get(&format!("{symbol}_fold_weights"))?)
                    } else {
                        &[]
                    },
                },
                Composition::Norm(_) => Launchers::Norm(one(self.get(symbol)?)),
                Composition::Elementwise(_) => Launchers::Elementwise(one(self.get(symbol)?)),
            })
        }
    }

    /// The function `name` of the library, as an `F`.
    ///
    /// # Safety
    /// `F` is the type abi.h declares for `name`.
    pub unsafe fn get<F: Copy>(&self, name: &str) -> Result<F, String> {
        // SAFETY: the caller's contract.
        unsafe { self.library.get::<F>(name.as_bytes()) }
            .map(|symbol| *symbol)
            .map_err(|e| format!("{}: no `{name}`: {e}", self.path.display()))
    }
}

/// One loaded candidate.
pub struct LoadedUnit {
    launcher: Launcher<fusion_gemm_params>,
    workspace_bytes: WorkspaceBytes<fusion_gemm_params>,
    resources: Resources,
    error_string: ErrorString,
    /// `<symbol>_fold_weights`, which gated GEMMs (and norm GEMMs) have.
    fold_weights: Option<FoldWeights<fusion_fold_params>>,
}

/// What one tile config of a unit asks for per block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileAsk {
    /// `large`, `small_m`, `small_m_alt` or `decode`.
    pub tile: String,
    pub smem_bytes: u32,
    pub threads: u32,
}

impl LoadedUnit {
    /// Loads the library at `path`, built from a unit with launcher
    /// `symbol` in the library `lib_name`.
    ///
    /// # Safety
    /// The library must be one [`super::compile`] built from units fusion
    /// rendered: loading runs its initializers, and the functions are
    /// called with abi.h's signatures.
    pub unsafe fn load(path: &Path, symbol: &str, lib_name: &str) -> Result<LoadedUnit, String> {
        // SAFETY: the caller vouches for the library (see above).
        let library = unsafe { SharedLibrary::load(path) }?;
        // SAFETY: each type below is the one abi.h declares for that name,
        // which fusion's templates render.
        unsafe {
            Ok(LoadedUnit {
                launcher: library.get(symbol)?,
                workspace_bytes: library.get(&format!("{symbol}_workspace_bytes"))?,
                resources: library.get(&format!("{symbol}_resources"))?,
                error_string: library.get(&format!("{lib_name}_error_string"))?,
                fold_weights: library.get(&format!("{symbol}_fold_weights")).ok(),
            })
        }
    }

    /// What each of its tile configs asks for, large first.
    pub fn resources(&self) -> Vec<TileAsk> {
        let empty = fusion_tile_resources {
            tile: std::ptr::null(),
            smem_bytes: 0,
            threads: 0,
        };
        let mut tiles = [empty; 8];
        // SAFETY: writes at most `capacity` entries into the live array.
        let count = unsafe { (self.resources)(tiles.as_mut_ptr(), tiles.len() as c_int) };
        tiles
            .iter()
            .take(count.clamp(0, tiles.len() as c_int) as usize)
            .map(|t| TileAsk {
                // SAFETY: the unit's names are static C strings (or null).
                tile: if t.tile.is_null() {
                    String::new()
                } else {
                    unsafe { CStr::from_ptr(t.tile) }.to_string_lossy().into_owned()
                },
                smem_bytes: t.smem_bytes,
                threads: t.threads,
            })
            .collect()
    }

    /// The workspace a launch of `params` needs, in bytes.
    ///
    /// # Safety
    /// `params`' pointers are device addresses of buffers that hold what
    /// its sizes say, on the current device.
    pub unsafe fn workspace_bytes(&self, params: &fusion_gemm_params) -> Result<u64, String> {
        let mut bytes = 0u64;
        // SAFETY: the caller's contract; `bytes` is a live local.
        let code = unsafe { (self.workspace_bytes)(params, std::ptr::null_mut(), &mut bytes) };
        self.result(code).map(|()| bytes)
    }

    /// Queues the launch of `params` on `stream` (a `CUstream`).
    ///
    /// # Safety
    /// As for [`LoadedUnit::workspace_bytes`], and the buffers stay alive
    /// until the launch has run; `stream` is a live stream of the current
    /// context.
    pub unsafe fn launch(&self, params: &fusion_gemm_params, stream: *mut c_void) -> Result<(), String> {
        // SAFETY: the caller's contract.
        let code = unsafe { (self.launcher)(params, stream) };
        self.result(code)
    }

    /// Queues `<symbol>_fold_weights` of `params` on `stream`: for a gated
    /// GEMM, its gate and up weights interleaved into `w_folded` (abi.h).
    ///
    /// # Safety
    /// As for [`LoadedUnit::launch`], for the fold's params.
    pub unsafe fn fold_weights(
        &self,
        params: &fusion_fold_params,
        stream: *mut c_void,
    ) -> Result<(), String> {
        let fold = self
            .fold_weights
            .ok_or_else(|| "the unit has no `_fold_weights`".to_owned())?;
        // SAFETY: the caller's contract.
        let code = unsafe { fold(params, stream) };
        self.result(code)
    }

    fn result(&self, code: c_int) -> Result<(), String> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: cudaGetErrorString's static string for any code.
        let message = unsafe { CStr::from_ptr((self.error_string)(code)) };
        Err(format!("CUDA error {code}: {}", message.to_string_lossy()))
    }
}
