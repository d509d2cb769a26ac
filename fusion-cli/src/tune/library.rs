//! A shared library of kernels fusion built (a tuning candidate's, or a
//! `fusion run` kernel's), loaded into the process, and its launcher
//! functions (`fusion-compiler/kernels/include/fusion/abi.h`) looked up by
//! symbol, as a plan table's entries take them.
//!
//! Libraries are never unloaded: each carries its own CUDA run time, whose
//! exit handlers must find its code still mapped when the process ends.

use crate::table::{self, Declared, one};
use fusion::Arch;
use fusion::abi::fusion_tile_resources;
use fusion::plan::{Launchers, PlanTable};
use fusion_compiler::fuse::{Composition, FusedKernel, Plan};
use fusion_compiler::ir::{DType, Graph};
use std::ffi::{CStr, c_int};
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

/// One loaded candidate: its one-kernel plan as the table the executor
/// runs, with the unit's launchers.
pub struct LoadedUnit {
    /// What `fusion tune` checks and times the candidate through
    /// ([`fusion::plan::run`]).
    pub table: &'static PlanTable,
    resources: Resources,
}

/// What one tile config of a unit asks for per block.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TileAsk {
    /// `large`, `large_alt`, `small_m`, `small_m_alt`, `few_m` or `decode`
    /// (abi.h's `fusion_tile_resources`).
    pub tile: String,
    pub smem_bytes: u32,
    pub threads: u32,
}

impl LoadedUnit {
    /// Loads the library at `path`, built from the unit with launcher
    /// `symbol` in the library `lib_name`, rendered for the one kernel of
    /// `plan` (`Plan::kernel_plan`, declared as `declared`) in `dtype` on
    /// `arch`; its table is that plan's ([`table::plan_table`]).
    ///
    /// # Safety
    /// The library must be one [`super::compile`] built from that unit:
    /// loading runs its initializers, and the functions are called with
    /// abi.h's signatures.
    pub unsafe fn load(
        path: &Path,
        (symbol, lib_name): (&str, &str),
        plan: &Plan,
        declared: Declared,
        (dtype, arch): (DType, Arch),
    ) -> Result<LoadedUnit, String> {
        // SAFETY: the caller vouches for the library (see above).
        let library = unsafe { SharedLibrary::load(path) }?;
        let kernel = plan
            .kernels
            .first()
            .expect("a candidate's plan has its one kernel");
        // SAFETY: each type below is the one abi.h declares for that name,
        // which fusion's templates render.
        unsafe {
            let launchers = library.launchers(symbol, kernel, &plan.graph)?;
            let error_string = library.get(&format!("{lib_name}_error_string"))?;
            Ok(LoadedUnit {
                table: table::plan_table(plan, declared, dtype, arch, vec![(launchers, error_string)]),
                resources: library.get(&format!("{symbol}_resources"))?,
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
}
