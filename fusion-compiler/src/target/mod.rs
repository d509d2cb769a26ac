//! The GPU generations fusion compiles for, one module each: everything the
//! build, the code generator, config selection and the run time need to know
//! about a generation lives in its [`Target`] (and xtask reads the part it
//! needs from the manifest the build writes, `OUT_DIR/kernels/units.json`).
//!
//! A [`Target`] says how nvcc compiles for a generation, which element types its tensor cores take, which fields a tile
//! config gives and how it is spelled in C++ for its mainloop, which header
//! that mainloop is in, and its pre-tuned table. What a tile must be to fit
//! the mainloop and the block's limits (shapes, threads, registers, shared
//! memory) is written once, in the mainloop's headers: each generated unit
//! asserts it with a message naming the tuned table entry.
//! [`Arch`] (in `arch`, present without the feature `compiler`, for the run
//! time) names a generation and says which devices run its code; its methods
//! here read the generation's [`Target`].
//!
//! Adding a generation (say `sm100`) takes:
//! - a module `sm100.rs` here with its `TARGET`, a variant `Arch::Sm100` in
//!   `arch.rs` (declared after the generations it is newer than:
//!   [`Arch::best_for`] prefers the last one that runs) with its name and
//!   compute capabilities, listed in [`Arch::ALL`] and mapped to its `TARGET`
//!   in [`Arch::target`];
//! - a `Mainloop::Sm100` with its arm in `TileConfig::summary` (select);
//! - its header folder, `kernels/include/fusion/sm100/`, with the
//!   `fusion::sm100::Mainloop` and `TileConfig` templates, its
//!   `fusion::sm100::tile_valid<LayoutB, Tile>` (the tile rules) and its
//!   `kSmemPerBlock` (tiles are checked and sized there alone: each
//!   generated unit asserts its configs fit, and reports their sizes through
//!   `<symbol>_resources`);
//! - its tuned table, `kernels/tuned/sm100.json`, with a `default` entry
//!   (a table without a usable entry is a build error);
//! - its cargo feature, `sm100 = []`, in the root `Cargo.toml`.
//!
//! The root build script and the run time's variant choice read the feature
//! list from this table (the tests check that every generation has its
//! feature, its header folder and its table).

mod sm75;
mod sm80;
mod sm90;
mod warp_tiled;

pub use crate::arch::{Arch, RunsOn};
use crate::ir::DType;
use crate::select::{KernelKind, Mainloop, TileConfig};

/// Everything about one GPU generation. Each generation's module defines one.
#[derive(Debug)]
pub struct Target {
    pub arch: Arch,
    /// nvcc's `-gencode` flag for the library: machine code, plus PTX where
    /// that PTX can run on later devices.
    pub gencode: &'static str,
    /// nvcc's `-gencode` flag for machine code alone, so ptxas runs once (the
    /// resource report's).
    pub sass_gencode: &'static str,
    /// The element types its tensor cores take.
    pub dtypes: &'static [DType],
    /// The mainloop every kernel of this generation runs.
    pub mainloop: Mainloop,
    /// Its C++ template (`fusion::sm80::Mainloop`) and the header declaring
    /// it, relative to `kernels/include`.
    pub mainloop_type: &'static str,
    pub mainloop_header: &'static str,
    /// A tile config as the mainloop's `TileConfig` template arguments.
    pub tile_type: fn(&TileConfig) -> String,
    /// Whether a config gives the fields the mainloop takes and no other (its
    /// tile rules are the header's `tile_valid`); the error is a sentence
    /// saying what is wrong.
    pub check: fn(&TileConfig, &KernelKind) -> Result<(), String>,
    /// Whether the decode kernel (`kernels/include/fusion/decode.cuh`, built
    /// on the m16n8k16 mma of sm80 and newer) runs on it, so that its tuned
    /// entries may set `decode_max_m`.
    pub decode: bool,
    /// The pre-tuned table, `kernels/tuned/<name>.json`, embedded so that a
    /// crate built outside this workspace gets it too.
    pub tuned_json: &'static str,
}

impl Arch {
    /// The generation's facts.
    pub fn target(self) -> &'static Target {
        match self {
            Arch::Sm75 => &sm75::TARGET,
            Arch::Sm80 => &sm80::TARGET,
            Arch::Sm90 => &sm90::TARGET,
        }
    }

    /// The mainloop written for this arch, which all its kernels run.
    pub fn mainloop(self) -> Mainloop {
        self.target().mainloop
    }

    /// Whether its tensor cores take `dtype`.
    pub fn supports(self, dtype: DType) -> bool {
        self.target().dtypes.contains(&dtype)
    }

    /// The generation whose kernels run `mainloop`.
    pub fn of_mainloop(mainloop: Mainloop) -> Arch {
        Arch::ALL
            .into_iter()
            .find(|a| a.mainloop() == mainloop)
            .expect("every mainloop belongs to a generation")
    }
}

#[cfg(test)]
mod tests;
