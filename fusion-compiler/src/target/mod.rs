//! The GPU generations fusion compiles for, one module each: everything the
//! build, the code generator, config selection and the run time need to know
//! about a generation lives in its [`Target`] (and xtask reads the part it
//! needs from the manifest the build writes, `OUT_DIR/kernels/units.json`).
//!
//! A [`Target`] says what a generation is called (`sm80`: the cargo feature
//! and the tuned table's stem), how nvcc compiles for it, which devices run
//! its code, which element types its tensor cores take, which fields a tile
//! config gives and how it is spelled in C++ for its mainloop, which header
//! that mainloop is in, its pre-tuned table, and the tile configs a tuner
//! may try on it ([`TileSpace`]). What a tile must be to fit
//! the mainloop and the block's limits (shapes, threads, registers, shared
//! memory) is written once, in the mainloop's headers: each generated unit
//! asserts it with a message naming the tuned table entry.
//! [`Arch`] names a generation; its methods read the generation's [`Target`].
//!
//! Adding a generation (say `sm100`) takes:
//! - a module `sm100.rs` here with its `TARGET`, a variant `Arch::Sm100`
//!   (declared after the generations it is newer than: [`Arch::best_for`]
//!   prefers the last one that runs), listed in [`Arch::ALL`] and mapped to
//!   its `TARGET` in [`Arch::target`];
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

use crate::ir::DType;
use crate::select::{KernelKind, Mainloop, Schedule, TileConfig};
use std::fmt;

/// A GPU generation a kernel variant is built for. Declared oldest first:
/// where several run on a device, the newest is preferred.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    /// Turing: the WMMA mainloop, f16 only.
    Sm75,
    /// Ampere and Ada: the mma.sync mainloop; also runs on sm_86 and sm_89.
    Sm80,
    /// Hopper, built as sm_90a: the wgmma + TMA mainloop.
    Sm90,
}

/// Everything about one GPU generation. Each generation's module defines one.
#[derive(Debug)]
pub struct Target {
    pub arch: Arch,
    /// `sm80`: the cargo feature, the tuned table's stem, the suffix of its
    /// units' names.
    pub name: &'static str,
    /// nvcc's `-gencode` flag for the library: machine code, plus PTX where
    /// that PTX can run on later devices.
    pub gencode: &'static str,
    /// nvcc's `-gencode` flag for machine code alone, so ptxas runs once (the
    /// resource report's).
    pub sass_gencode: &'static str,
    /// Which compute capabilities run this generation's code.
    pub runs_on: RunsOn,
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
    pub bm: &'static [u32],
    pub bn: &'static [u32],
    pub bk: &'static [u32],
    pub warp_m: &'static [u32],
    pub warp_n: &'static [u32],
    pub stages: &'static [u32],
    pub min_blocks_per_sm: &'static [u32],
    pub pipelined: &'static [bool],
    pub staged_store: &'static [bool],
    pub schedule: &'static [Option<Schedule>],
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
        ]
        .iter()
        .product()
    }

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
        }
    }
}

/// The compute capabilities (`major.minor`) that run a generation's code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RunsOn {
    /// Arch-specific machine code (sm_90a) runs on that capability alone.
    Exactly(i32, i32),
    /// Machine code plus PTX, which the driver compiles for any newer device.
    AtLeast(i32, i32),
}

impl RunsOn {
    pub fn includes(self, major: i32, minor: i32) -> bool {
        match self {
            RunsOn::Exactly(ma, mi) => (major, minor) == (ma, mi),
            RunsOn::AtLeast(ma, mi) => (major, minor) >= (ma, mi),
        }
    }
}

impl Arch {
    pub const ALL: [Arch; 3] = [Arch::Sm75, Arch::Sm80, Arch::Sm90];

    /// The generation's facts.
    pub fn target(self) -> &'static Target {
        match self {
            Arch::Sm75 => &sm75::TARGET,
            Arch::Sm80 => &sm80::TARGET,
            Arch::Sm90 => &sm90::TARGET,
        }
    }

    /// `sm80`: the cargo feature and the tuned file's stem.
    pub fn name(self) -> &'static str {
        self.target().name
    }

    /// The arch named `sm75`, `sm80` or `sm90`.
    pub fn parse(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    /// `sm75, sm80 or sm90`, for messages that list what is accepted.
    pub fn names_listed() -> String {
        let names: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
        match names.split_last() {
            Some((last, [])) => (*last).to_owned(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }

    /// The mainloop written for this arch, which all its kernels run.
    pub fn mainloop(self) -> Mainloop {
        self.target().mainloop
    }

    /// Whether this variant's code runs on a device of compute capability
    /// `major.minor`.
    pub fn runs_on(self, major: i32, minor: i32) -> bool {
        self.target().runs_on.includes(major, minor)
    }

    /// The best of `available` for a compute capability: the newest that
    /// runs there.
    pub fn best_for(major: i32, minor: i32, available: &[Arch]) -> Option<Arch> {
        available
            .iter()
            .copied()
            .filter(|a| a.runs_on(major, minor))
            .max()
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

    /// The generations whose cargo feature (`CARGO_FEATURE_SM80`, ...) is on
    /// for the crate whose build script runs.
    pub fn from_cargo_features() -> Vec<Arch> {
        Arch::ALL
            .into_iter()
            .filter(|a| std::env::var_os(a.cargo_feature_env()).is_some())
            .collect()
    }

    /// The generations a build script compiles for: `FUSION_ARCHS` (names,
    /// comma-separated: `sm80,sm90`) when set, else `CUDA_COMPUTE_CAP` (the
    /// devices' compute capabilities, comma-separated, as `90` or `8.6`, the
    /// way candle's build tools read it: for each, the newest generation
    /// whose code runs there), else the cargo features (`from_cargo_features`).
    pub fn for_build() -> Result<Vec<Arch>, String> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        match (var("FUSION_ARCHS"), var("CUDA_COMPUTE_CAP")) {
            (Some(names), _) => Arch::from_names(&names),
            (None, Some(caps)) => Arch::from_compute_caps(&caps),
            (None, None) => Ok(Arch::from_cargo_features()),
        }
    }

    /// The environment variables [`Arch::for_build`] reads beside the cargo
    /// features, for `cargo:rerun-if-env-changed`.
    pub const BUILD_ENV: [&'static str; 2] = ["FUSION_ARCHS", "CUDA_COMPUTE_CAP"];

    /// `sm80,sm90` as generations, in order, each once.
    pub fn from_names(list: &str) -> Result<Vec<Arch>, String> {
        let mut archs = list
            .split(',')
            .map(|name| {
                Arch::parse(name.trim()).ok_or_else(|| {
                    format!(
                        "FUSION_ARCHS: `{}` is not one of {}",
                        name.trim(),
                        Arch::names_listed()
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        archs.sort();
        archs.dedup();
        Ok(archs)
    }

    /// `90`, `8.6`, `80,90`: for each compute capability, the newest
    /// generation whose code runs there; in order, each once.
    pub fn from_compute_caps(list: &str) -> Result<Vec<Arch>, String> {
        let mut archs = list
            .split(',')
            .map(|cap| {
                let cap = cap.trim();
                let bad =
                    || format!("CUDA_COMPUTE_CAP: `{cap}` is not a compute capability such as 90 or 8.6");
                let (major, minor) = match cap.split_once('.') {
                    Some((major, minor)) => (
                        major.parse().map_err(|_| bad())?,
                        minor.parse().map_err(|_| bad())?,
                    ),
                    None if cap.len() >= 2 && cap.bytes().all(|b| b.is_ascii_digit()) => {
                        let (major, minor) = cap.split_at(cap.len() - 1);
                        (
                            major.parse().map_err(|_| bad())?,
                            minor.parse().map_err(|_| bad())?,
                        )
                    }
                    None => return Err(bad()),
                };
                Arch::best_for(major, minor, &Arch::ALL).ok_or_else(|| {
                    format!("CUDA_COMPUTE_CAP: no generation runs on compute capability {major}.{minor}")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        archs.sort();
        archs.dedup();
        Ok(archs)
    }

    /// `CARGO_FEATURE_SM80`: how cargo tells a build script the feature is on.
    pub fn cargo_feature_env(self) -> String {
        format!("CARGO_FEATURE_{}", self.name().to_ascii_uppercase())
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests;
