//! [`Builder`]: what a build script calls to turn graph files into a linked
//! kernel library and typed wrappers.
//!
//! ```no_run
//! // build.rs
//! fusion_core::build::Builder::new()
//!     .graphs_dir("graphs")
//!     .dtypes(&[fusion_core::ir::DType::F16, fusion_core::ir::DType::BF16])
//!     .compile()
//!     .unwrap_or_else(|e| panic!("{e}"));
//! ```
//!
//! and in the crate: `include!(concat!(env!("OUT_DIR"), "/fusion_kernels.rs"));`.
//!
//! The pipeline: collect the graph files → parse and lower (errors rendered
//! with `file:line:col`) → plan → select tile configs → render units and the
//! header → [`compile`](super::compile) → wrappers. Templates and CUDA
//! headers are embedded in fusion-core (see [`crate::codegen::templates`]);
//! the headers are written to `OUT_DIR/include` and compiled from there, so a
//! crate outside this repository builds the same way as the root crate.

use super::{BuildError, BuildMode, CompileOptions, CudaSources, GeneratedFile, Target, Unit, compile};
use crate::codegen::{self, GraphSpec, templates};
use crate::ir::DType;
use crate::select::Arch;
use std::path::{Path, PathBuf};

/// Configures and runs the build of one kernel library.
#[derive(Clone, Debug)]
pub struct Builder {
    graphs_dirs: Vec<PathBuf>,
    graph_files: Vec<PathBuf>,
    dtypes: Option<Vec<DType>>,
    archs: Option<Vec<Arch>>,
    lib_name: String,
}

impl Default for Builder {
    fn default() -> Self {
        Builder::new()
    }
}

impl Builder {
    pub fn new() -> Builder {
        Builder {
            graphs_dirs: Vec::new(),
            graph_files: Vec::new(),
            dtypes: None,
            archs: None,
            lib_name: "fusion_kernels".to_owned(),
        }
    }

    /// Compiles every `*.toml` in `dir` (not recursive), in name order.
    pub fn graphs_dir(mut self, dir: impl Into<PathBuf>) -> Builder {
        self.graphs_dirs.push(dir.into());
        self
    }

    /// Compiles one graph file.
    pub fn graph_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.graph_files.push(path.into());
        self
    }

    /// Compiles every graph once per dtype, re-typing all its tensors.
    /// Default: the dtype each graph declares.
    pub fn dtypes(mut self, dtypes: &[DType]) -> Builder {
        self.dtypes = Some(dtypes.to_vec());
        self
    }

    /// The architectures to compile for. Default: from the cargo features
    /// `sm75`, `sm80`, `sm90` of the crate being built.
    pub fn archs(mut self, archs: &[Arch]) -> Builder {
        self.archs = Some(archs.to_vec());
        self
    }

    /// The library's name: `lib<name>.a`, `<name>.h`, `<name>.rs`, and the
    /// prefix of every launcher symbol. Default `fusion_kernels`.
    pub fn lib_name(mut self, name: &str) -> Builder {
        self.lib_name = name.to_owned();
        self
    }

    /// Runs the whole pipeline inside a build script.
    pub fn compile(self) -> Result<(), BuildError> {
        let options = CompileOptions::from_build_script_env()?;
        self.compile_with(options).map(|_| ())
    }

    /// Runs the pipeline with explicit options (tests, tools); returns the
    /// path of the generated wrappers.
    pub fn compile_with(self, mut options: CompileOptions) -> Result<PathBuf, BuildError> {
        options.lib_name = self.lib_name.clone();
        let cargo = options.cargo_metadata;
        let files = self.collect(cargo)?;
        let archs = self.archs.clone().unwrap_or_else(archs_from_features);
        if archs.is_empty() {
            return Err(BuildError::Config(
                "no GPU architecture to compile for: enable a cargo feature sm75, sm80 or sm90, or call Builder::archs"
                    .to_owned(),
            ));
        }
        let specs = files
            .iter()
            .map(|path| self.graph_spec(path))
            .collect::<Result<Vec<_>, _>>()?;
        let library =
            codegen::render(&self.lib_name, &archs, &specs).map_err(|e| BuildError::Config(e.to_string()))?;

        let include_dir = options.out_dir.join("include");
        templates::write_headers(&include_dir)
            .map_err(BuildError::io("cannot write headers into", &include_dir))?;
        let mut units: Vec<Unit> = library
            .units
            .iter()
            .map(|u| Unit {
                name: u.symbol.clone(),
                source: u.source.clone(),
                targets: u.archs.iter().map(|a| target_of(*a)).collect(),
            })
            .collect();
        units.push(Unit {
            name: library.error_unit.0.clone(),
            source: library.error_unit.1.clone(),
            targets: vec![target_of(archs[0])],
        });
        let sources = CudaSources {
            units,
            header: GeneratedFile {
                name: library.header.0.clone(),
                contents: library.header.1.clone(),
            },
            headers_dir: include_dir,
        };
        let compiled = compile(&sources, &options)?;
        let ffi = compiled.ffi_rs.to_string_lossy().into_owned();
        let wrappers = codegen::wrappers::generate(&library, compiled.mode == BuildMode::Linked, &ffi);
        let path = options.out_dir.join(format!("{}.rs", self.lib_name));
        if std::fs::read_to_string(&path).ok().as_deref() != Some(wrappers.as_str()) {
            std::fs::write(&path, wrappers).map_err(BuildError::io("cannot write", &path))?;
        }
        Ok(path)
    }

    /// The graph files, sorted and deduplicated; prints the rerun lines.
    fn collect(&self, cargo: bool) -> Result<Vec<PathBuf>, BuildError> {
        let mut files = self.graph_files.clone();
        for dir in &self.graphs_dirs {
            if cargo {
                // A directory's mtime changes when a file is added or removed.
                println!("cargo:rerun-if-changed={}", dir.display());
            }
            let entries =
                std::fs::read_dir(dir).map_err(BuildError::io("cannot read graph directory", dir))?;
            let mut found = Vec::new();
            for entry in entries {
                let path = entry
                    .map_err(BuildError::io("cannot read graph directory", dir))?
                    .path();
                if path.extension().is_some_and(|e| e == "toml") && path.is_file() {
                    found.push(path);
                }
            }
            found.sort();
            files.extend(found);
        }
        files.dedup();
        if cargo {
            for file in &files {
                println!("cargo:rerun-if-changed={}", file.display());
            }
        }
        if files.is_empty() {
            return Err(BuildError::Config("no graph files to compile".to_owned()));
        }
        Ok(files)
    }

    fn graph_spec(&self, path: &Path) -> Result<GraphSpec, BuildError> {
        let graph = crate::load_toml_graph(path).map_err(BuildError::Config)?;
        let declared: Vec<DType> = {
            let mut d: Vec<DType> = graph.tensors.iter().map(|t| t.dtype).collect();
            d.sort_by_key(|d| d.name());
            d.dedup();
            d
        };
        let dtypes = match &self.dtypes {
            Some(dtypes) => dtypes.clone(),
            None if declared.len() == 1 => declared,
            None => {
                return Err(BuildError::Config(format!(
                    "{}: graph `{}` mixes dtypes; kernels take one element type (or call Builder::dtypes to re-type it)",
                    path.display(),
                    graph.name
                )));
            }
        };
        let plan = crate::fuse::plan(graph);
        Ok(GraphSpec {
            plan,
            dtypes,
            origin: path.display().to_string(),
            fingerprint: None,
        })
    }
}

/// sm90 builds as sm_90a.
fn target_of(arch: Arch) -> Target {
    match arch {
        Arch::Sm75 => Target::Sm75,
        Arch::Sm80 => Target::Sm80,
        Arch::Sm90 => Target::Sm90a,
    }
}

/// `CARGO_FEATURE_SM75` etc. of the crate whose build script runs.
fn archs_from_features() -> Vec<Arch> {
    Arch::ALL
        .into_iter()
        .filter(|a| std::env::var_os(format!("CARGO_FEATURE_{}", a.name().to_ascii_uppercase())).is_some())
        .collect()
}
