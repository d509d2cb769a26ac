//! The GPU generations fusion compiles for, one module each: everything the
//! build, the code generator, config selection and the run time need to know
//! about a generation lives in its [`Target`] (and xtask and `scripts/` read
//! the part they need from the manifest the build writes,
//! `OUT_DIR/kernels/units.json`, and from [`TARGETS_JSON`]).
//!
//! A [`Target`] says how nvcc compiles for a generation, which element
//! types its tensor cores take, which header its mainloop is in, its
//! pre-tuned table, and the tile configs a tuner may try on it
//! ([`Target::tile_space`]). Each generation's module also owns its tile
//! configs' own fields ([`Fields`]): how they are spelled in JSON, in C++
//! for its mainloop and in messages, and what they must give. What a tile
//! must be to fit the mainloop and the block's limits (shapes, threads,
//! registers, shared memory) is written once, in the mainloop's headers:
//! each generated unit asserts it with a message naming the tuned table
//! entry.
//! [`Arch`] (in `arch`, present without the feature `compiler`, for the run
//! time) names a generation and says which devices run its code; its methods
//! here read the generation's [`Target`].
//!
//! This module is below `select`, `tune` and `codegen`: they read it, and
//! it reads none of them (`tests::target_reads_no_later_stage` checks).
//! A field of one generation's tile configs is declared, read, written,
//! checked, rendered and searched in that generation's module alone.
//!
//! Adding a generation (say `sm100`) takes:
//! - a module `sm100.rs` here with its `TARGET`, a variant `Arch::Sm100` in
//!   `arch.rs` (declared after the generations it is newer than:
//!   [`Arch::best_for`] prefers the last one that runs) with its name and
//!   compute capabilities, listed in [`Arch::ALL`] and mapped to its `TARGET`
//!   in [`Arch::target`];
//! - its [`Fields`] (`sm100::Fields`, a variant `Fields::Sm100`), with an
//!   arm for it in each `match` of [`TileConfig`] and its `read`;
//! - its header folder, `kernels/include/fusion/sm100/`, with the
//!   `fusion::sm100::Mainloop` and `TileConfig` templates, its
//!   `fusion::sm100::tile_valid<LayoutB, Tile>` (the tile rules) and its
//!   `kSmemPerBlock` (tiles are checked and sized there alone: each
//!   generated unit asserts its configs fit, and reports their sizes through
//!   `<symbol>_resources`);
//! - its tuned table, `kernels/tuned/sm100.json`, with a `default` entry
//!   (a table without a usable entry is a build error);
//! - its cargo feature, `sm100 = []`, in the root `Cargo.toml` and in
//!   `examples/llama-ffn/Cargo.toml`;
//! - [`TARGETS_JSON`] rewritten (`FUSION_BLESS=1 cargo test -p
//!   fusion-compiler targets_json`), which xtask and `scripts/` read;
//! - its `tile_space`, the tile configs a tuner tries (the tests check
//!   that it covers the tuned table's tiles).
//!
//! The root build script and the run time's variant choice read the feature
//! list from this table (the tests check that every generation has its
//! feature, its header folder and its table).

pub mod sm75;
pub mod sm80;
pub mod sm90;
mod warp_tiled;

pub use crate::arch::{Arch, RunsOn};
use crate::ir::DType;
pub use sm90::Schedule;
use std::cell::Cell;

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
    /// Its C++ template (`fusion::sm80::Mainloop`) and the header declaring
    /// it, relative to `kernels/include`.
    pub mainloop_type: &'static str,
    /// The header declaring [`Target::mainloop_type`], relative to `kernels/include`.
    pub mainloop_header: &'static str,
    /// The tile configs a tuner tries on this mainloop, every combination of
    /// the values its module lists for each field of its tile config, always
    /// in the same order (the tuner's search space starts from it). Which combinations
    /// the mainloop's rules accept is for its headers to say (`tile_valid`),
    /// not this list: a combination they refuse fails its unit's compile.
    pub tile_space: fn() -> Vec<TileConfig>,
    /// Whether the decode kernel (`kernels/include/fusion/decode.cuh`, built
    /// on the m16n8k16 mma of sm80 and newer) runs on it, so that its tuned
    /// entries may set `decode_max_m`.
    pub decode: bool,
    /// How its launchers choose among a unit's tiers for a call (with no
    /// tier named in the flags and the decode kernel not taking M).
    pub tier_choice: TierChoice,
    /// The pre-tuned table, `kernels/tuned/<name>.json`, embedded so that a
    /// crate built outside this workspace gets it too.
    pub tuned_json: &'static str,
}

pub use crate::gemm_model::TierChoice;

/// One tile config of one generation's mainloop: the fields every mainloop
/// takes, and the generation's own ([`Fields`]). In JSON (the tuned tables,
/// the tuned cache) it is one flat object, as each generation's module
/// spells it; which generation's a config is depends on where it is read
/// ([`TileConfig::read_for`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TileConfig {
    /// Rows of C one block computes.
    pub bm: u32,
    /// Columns of C one block computes.
    pub bn: u32,
    /// The K step of one stage.
    pub bk: u32,
    /// Shared-memory pipeline depth (the sm75 mainloop's template fixes it).
    pub stages: u32,
    /// What only its generation's mainloop takes.
    pub fields: Fields,
}

/// The fields of a tile config that one generation's mainloop alone takes,
/// each generation's defined in its module.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Fields {
    /// The sm75 mainloop's.
    Sm75(sm75::Fields),
    /// The sm80 mainloop's.
    Sm80(sm80::Fields),
    /// The sm90 mainloop's.
    Sm90(sm90::Fields),
}

impl TileConfig {
    /// The generation whose mainloop takes this config.
    pub fn arch(&self) -> Arch {
        match self.fields {
            Fields::Sm75(_) => Arch::Sm75,
            Fields::Sm80(_) => Arch::Sm80,
            Fields::Sm90(_) => Arch::Sm90,
        }
    }

    /// `128x256x32 (warp 64x64, 4 stages, 1 block(s)/SM)` for the sm75 and
    /// sm80 mainloops; `128x256x64 (4 stages, cooperative, persistent)` for
    /// sm90's.
    pub fn summary(&self) -> String {
        match &self.fields {
            Fields::Sm75(f) => f.summary(self),
            Fields::Sm80(f) => f.summary(self),
            Fields::Sm90(f) => f.summary(self),
        }
    }

    /// The config as its mainloop's C++ `TileConfig` type
    /// (`fusion::sm90::TileConfig<128, 256, 4, fusion::sm90::Schedule::Cooperative>`).
    pub fn cpp_type(&self) -> String {
        match &self.fields {
            Fields::Sm75(f) => f.cpp_type(self),
            Fields::Sm80(f) => f.cpp_type(self),
            Fields::Sm90(f) => f.cpp_type(self),
        }
    }

    /// The sm90 fields, where the config is an sm90 one.
    pub fn sm90_fields(&self) -> Option<&sm90::Fields> {
        match &self.fields {
            Fields::Sm90(f) => Some(f),
            _ => None,
        }
    }

    /// The blocks per SM its launch bounds ask for (`min_blocks_per_sm` of
    /// the warp-tiled mainloops); the sm90 mainloop runs one, persistent.
    pub fn blocks_per_sm(&self) -> u32 {
        match &self.fields {
            Fields::Sm75(f) => f.min_blocks_per_sm,
            Fields::Sm80(f) => f.min_blocks_per_sm,
            Fields::Sm90(_) => 1,
        }
    }

    /// Checks that the config is one of `arch`'s and gives the fields its
    /// mainloop needs, for a kernel that is `gated` (gate and up interleaved
    /// in B) or not; the tile rules are checked by nvcc in the unit. The
    /// error is a sentence saying what is wrong.
    pub fn check(&self, arch: Arch, gated: bool) -> Result<(), String> {
        if self.arch() != arch {
            return Err(format!(
                "{} is a tile config of the {} mainloop, not of {arch}'s",
                self.summary(),
                self.arch()
            ));
        }
        match &self.fields {
            Fields::Sm75(f) => f.check(self),
            Fields::Sm80(f) => f.check(self),
            Fields::Sm90(f) => f.check(self, gated),
        }
    }

    /// Runs `read`, in which every tile config deserialized is read as one of
    /// `arch`'s: a flat object whose fields its module names. A tile config
    /// deserialized outside is an error, since the JSON alone does not say
    /// which generation's it is.
    pub fn read_for<R>(arch: Arch, read: impl FnOnce() -> R) -> R {
        struct Restore(Option<Arch>);
        impl Drop for Restore {
            fn drop(&mut self) {
                READING_FOR.set(self.0);
            }
        }
        let _restore = Restore(READING_FOR.replace(Some(arch)));
        read()
    }
}

thread_local! {
    /// The generation whose tile configs are being read ([`TileConfig::read_for`]).
    static READING_FOR: Cell<Option<Arch>> = const { Cell::new(None) };
}

impl<'de> serde::Deserialize<'de> for TileConfig {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<TileConfig, D::Error> {
        match READING_FOR.get() {
            Some(Arch::Sm75) => sm75::read(deserializer),
            Some(Arch::Sm80) => sm80::read(deserializer),
            Some(Arch::Sm90) => sm90::read(deserializer),
            None => Err(serde::de::Error::custom(
                "a tile config is read for one generation (TileConfig::read_for)",
            )),
        }
    }
}

impl serde::Serialize for TileConfig {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match &self.fields {
            Fields::Sm75(f) => f.write(self, serializer),
            Fields::Sm80(f) => f.write(self, serializer),
            Fields::Sm90(f) => f.write(self, serializer),
        }
    }
}

/// Where [`targets_json`] is kept, relative to fusion-compiler's folder.
pub const TARGETS_JSON: &str = "kernels/targets.json";

/// The facts of every generation that tools outside the compiler read
/// (xtask, `scripts/`), as JSON: each generation's name (its cargo
/// feature), nvcc flags and the compute capability its code runs on (and
/// whether newer ones run it too, through its PTX). A test keeps
/// [`TARGETS_JSON`] equal to it.
pub fn targets_json() -> String {
    #[derive(serde::Serialize)]
    struct Generation {
        name: &'static str,
        gencode: &'static str,
        sass_gencode: &'static str,
        compute_capability: String,
        runs_on_newer: bool,
    }
    #[derive(serde::Serialize)]
    struct File {
        note: &'static str,
        generations: Vec<Generation>,
    }
    let generations = Arch::ALL
        .into_iter()
        .map(|arch| {
            let ((major, minor), runs_on_newer) = match arch.compute_capabilities() {
                RunsOn::Exactly(major, minor) => ((major, minor), false),
                RunsOn::AtLeast(major, minor) => ((major, minor), true),
            };
            Generation {
                name: arch.name(),
                gencode: arch.target().gencode,
                sass_gencode: arch.target().sass_gencode,
                compute_capability: format!("{major}.{minor}"),
                runs_on_newer,
            }
        })
        .collect();
    let file = File {
        note: "Written by fusion-compiler from src/target/ (FUSION_BLESS=1 cargo test -p fusion-compiler targets_json); do not edit. The GPU generations, oldest first, for xtask and scripts/.",
        generations,
    };
    serde_json::to_string_pretty(&file).expect("plain data") + "\n"
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

    /// Whether its tensor cores take `dtype`.
    pub fn supports(self, dtype: DType) -> bool {
        self.target().dtypes.contains(&dtype)
    }
}

#[cfg(test)]
mod tests;
