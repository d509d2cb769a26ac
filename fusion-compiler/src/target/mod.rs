//! The GPU generations fusion compiles for, one module each: everything the
//! build, the code generator, config selection and the run time need to know
//! about a generation lives in its [`Target`] (and xtask reads the part it
//! needs from the manifest the build writes, `OUT_DIR/kernels/units.json`).
//!
//! A [`Target`] says how nvcc compiles for a generation, which element types its tensor cores take, which fields a tile
//! config gives and how it is spelled in C++ for its mainloop, which header
//! that mainloop is in, its pre-tuned table, and the tile configs a tuner
//! may try on it ([`TileSpace`]). What a tile must be to fit
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
//! - its cargo feature, `sm100 = []`, in the root `Cargo.toml`;
//! - its `tile_space`, the values of each field of its mainloop's
//!   `TileConfig` a tuner tries (the tests check that it covers the tuned
//!   table's tiles).
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
use crate::select::{KernelKind, Mainloop, Schedule, TileConfig};

/// Everything about one GPU generation. Each generation's module defines one.
#[derive(Debug)]
pub struct Target {
    /// The generation.
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
    /// The header declaring [`Target::mainloop_type`], relative to `kernels/include`.
    pub mainloop_header: &'static str,
    /// A tile config as the mainloop's `TileConfig` template arguments.
    pub tile_type: fn(&TileConfig) -> String,
    /// Whether a config gives the fields the mainloop takes and no other (its
    /// tile rules are the header's `tile_valid`); the error is a sentence
    /// saying what is wrong.
    pub check: fn(&TileConfig, &KernelKind) -> Result<(), String>,
    /// The tile configs a tuner tries on this mainloop
    /// ([`crate::tune::search_space`]).
    pub tile_space: TileSpace,
    /// Whether the decode kernel (`kernels/include/fusion/decode.cuh`, built
    /// on the m16n8k16 mma of sm80 and newer) runs on it, so that its tuned
    /// entries may set `decode_max_m`.
    pub decode: bool,
    /// The pre-tuned table, `kernels/tuned/<name>.json`, embedded so that a
    /// crate built outside this workspace gets it too.
    pub tuned_json: &'static str,
}

/// The values a tuner tries for each field of a mainloop's tile config:
/// its search space is every combination ([`TileSpace::tiles`]). A field
/// the mainloop does not take has the one value its configs leave it at (0,
/// `false`, `None`). Which combinations the mainloop's rules accept is for
/// its headers to say (`tile_valid`), not this list: a combination they
/// refuse fails its unit's compile.
#[derive(Clone, Copy, Debug)]
pub struct TileSpace {
    /// Values of `TileConfig::bm` to try.
    pub bm: &'static [u32],
    /// Values of `TileConfig::bn` to try.
    pub bn: &'static [u32],
    /// Values of `TileConfig::bk` to try.
    pub bk: &'static [u32],
    /// Values of `TileConfig::warp_m` to try.
    pub warp_m: &'static [u32],
    /// Values of `TileConfig::warp_n` to try.
    pub warp_n: &'static [u32],
    /// Values of `TileConfig::stages` to try.
    pub stages: &'static [u32],
    /// Values of `TileConfig::min_blocks_per_sm` to try.
    pub min_blocks_per_sm: &'static [u32],
    /// Values of `TileConfig::pipelined` to try.
    pub pipelined: &'static [bool],
    /// Values of `TileConfig::staged_store` to try.
    pub staged_store: &'static [bool],
    /// Values of `TileConfig::schedule` to try.
    pub schedule: &'static [Option<Schedule>],
    /// Values of `TileConfig::cluster_m` to try.
    pub cluster_m: &'static [u32],
}

impl TileSpace {
    /// How many combinations the space has.
    pub fn len(&self) -> usize {
        [
            self.bm.len(),
            self.bn.len(),
            self.bk.len(),
            self.warp_m.len(),
            self.warp_n.len(),
            self.stages.len(),
            self.min_blocks_per_sm.len(),
            self.pipelined.len(),
            self.staged_store.len(),
            self.schedule.len(),
            self.cluster_m.len(),
        ]
        .iter()
        .product()
    }

    /// Whether the space has no combination.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every combination, the last field varying fastest: always in the
    /// same order, so that counts and reports are too.
    pub fn tiles(&self) -> impl Iterator<Item = TileConfig> + '_ {
        (0..self.len()).map(|index| self.tile(index))
    }

    /// The combination at `index` (below [`TileSpace::len`]), read as a
    /// number whose digits pick each field's value, the last field's the
    /// lowest digit.
    fn tile(&self, mut index: usize) -> TileConfig {
        let mut pick = |count: usize| {
            let digit = index % count;
            index /= count;
            digit
        };
        let schedule = self.schedule[pick(self.schedule.len())];
        let staged_store = self.staged_store[pick(self.staged_store.len())];
        let pipelined = self.pipelined[pick(self.pipelined.len())];
        let min_blocks_per_sm = self.min_blocks_per_sm[pick(self.min_blocks_per_sm.len())];
        let stages = self.stages[pick(self.stages.len())];
        let warp_n = self.warp_n[pick(self.warp_n.len())];
        let warp_m = self.warp_m[pick(self.warp_m.len())];
        let bk = self.bk[pick(self.bk.len())];
        let bn = self.bn[pick(self.bn.len())];
        let bm = self.bm[pick(self.bm.len())];
        // The slowest digit, after bm: the space without clusters first.
        let cluster_m = self.cluster_m[pick(self.cluster_m.len())];
        TileConfig {
            bm,
            bn,
            bk,
            warp_m,
            warp_n,
            stages,
            min_blocks_per_sm,
            pipelined,
            staged_store,
            schedule,
            cluster_m,
        }
    }
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
