//! fusion-compiler: the fusion compiler. It needs no GPU.
//!
//! Data flows one way through these modules:
//!
//! | module | what it does |
//! | --- | --- |
//! | [`syntax`] | parses a graph from TOML or from `fusion_graph!` tokens into one AST |
//! | [`ir`] | resolves and checks it: a [`ir::Graph`] with shapes and dtypes; the op table ([`ir::ops`]) every later stage reads |
//! | [`fuse`] | splits the graph into fused kernels: a [`fuse::Plan`] |
//! | [`select`] | picks and checks a tile config per kernel and target arch |
//! | [`codegen`] | renders CUDA units, the C header and typed Rust wrappers |
//! | [`target`] | one module per GPU generation: gencode, devices, budgets, dtypes, mainloop, checks, tuned table, tile space |
//! | [`tune`] | the tuner's candidates per kernel and arch, pruned before any compile |
//! | [`reference`](mod@reference) | evaluates a graph on the CPU in f64: the oracle for GPU tests |
//! | [`build`] | compiles generated CUDA with nvcc (cached), archives it, runs bindgen (feature `build`) |
//! | [`hf`] | feed-forward block graphs from a Hugging Face `config.json` (`fusion graph --from-hf`) |
//! | [`corpus`] | the linear layers of public models, derived from their configs (`fusion bench --corpus`) |
//!
//! [`arch`] names the GPU generations and which devices run each;
//! [`gemm_model`] models the sm90 GEMM kernel's time and chooses its tile
//! tier, and [`guard_model`] the vendor path's time and the guard's
//! verdict, for the build (`select`) and for the run time alike;
//! [`names`] the Hugging Face names of a block's weights.
//! [`diagnostic`] holds the spans and error messages every stage shares;
//! [`generated`] the names the build script writes and `fusion_graph!`
//! expands to.
//!
//! `syntax`, `ir`, `diagnostic`, `generated`, `arch`, `names`, `gemm_model` and `guard_model` are always
//! present: they are what the `fusion_graph!` macro and fusion's run time
//! link. `fuse`, `select`, `target`, `tune`,
//! `codegen` and `reference` need the feature `compiler`, and `build` the feature `build`
//! (which includes `compiler`); both are on by default.

#![warn(missing_docs)]

pub mod arch;
#[cfg(feature = "build")]
pub mod build;
#[cfg(feature = "compiler")]
pub mod codegen;
#[cfg(feature = "compiler")]
pub mod corpus;
pub mod diagnostic;
#[cfg(feature = "compiler")]
pub mod fuse;
pub mod gemm_model;
pub mod generated;
pub mod guard_model;
#[cfg(feature = "compiler")]
pub mod hf;
pub mod ir;
pub mod names;
#[cfg(feature = "compiler")]
pub mod reference;
#[cfg(feature = "compiler")]
pub mod select;
pub mod syntax;
#[cfg(feature = "compiler")]
pub mod target;
#[cfg(feature = "compiler")]
pub mod tune;

use diagnostic::SourceFile;
use std::path::Path;

/// Reads, parses and lowers a TOML graph. The error is rendered against the
/// file: `path:line:col: error: …` with the offending line underlined.
pub fn load_toml_graph(path: &Path) -> Result<ir::Graph, String> {
    let source = SourceFile::read(path).map_err(|d| d.message)?;
    graph_from_source(&source)
}

/// Parses and lowers TOML text already read.
pub fn graph_from_source(source: &SourceFile) -> Result<ir::Graph, String> {
    let decl = syntax::parse_toml(source).map_err(|e| e.render(source))?;
    ir::lower(&decl).map_err(|e| e.render(source))
}
