//! [`Builder`]: what a build script calls to turn graph files into a linked
//! kernel library and typed wrappers.
//!
//! ```no_run
//! // build.rs
//! fusion_compiler::build::Builder::new()
//!     .graphs_dir("graphs")
//!     .dtypes(&[fusion_compiler::ir::DType::F16, fusion_compiler::ir::DType::BF16])
//!     .compile()
//!     .unwrap_or_else(|e| panic!("{e}"));
//! ```
//!
//! and in the crate: `include!(concat!(env!("OUT_DIR"), "/<name>.rs"));`, where
//! `<name>` is [`Builder::lib_name`]'s (by default `<package>_kernels`:
//! `fusion_kernels.rs` for fusion itself).
//!
//! A crate that declares its graphs with `fusion_graph!` lists the files that
//! hold them instead:
//!
//! ```no_run
//! // build.rs
//! fusion_compiler::build::Builder::new()
//!     .sources("src/model.rs")
//!     .compile()
//!     .unwrap_or_else(|e| panic!("{e}"));
//! ```
//!
//! Each invocation's wrappers go to `OUT_DIR/fusion_graphs/<graph>.rs`, with
//! the fingerprint of its tokens; the macro includes that file and checks
//! the fingerprint, so an edit the build script has not seen is a clear
//! compile error.
//!
//! The pipeline: collect the graph files → parse and lower (errors rendered
//! with `file:line:col`) → plan → select tile configs → render units and the
//! header → [`compile`](super::compile) → wrappers. Templates and CUDA
//! headers are embedded in fusion-compiler (see [`crate::codegen::templates`]);
//! the headers are written to `OUT_DIR/include` and compiled from there, so a
//! crate outside this repository builds the same way as the root crate.

use super::{
    BuildError, BuildMode, CompileOptions, CompiledLibrary, CudaSources, GeneratedFile, Unit, compile,
};
use crate::codegen::{self, GraphSpec, KernelKey, templates};
use crate::diagnostic::{Diagnostic, SourceFile, Span};
use crate::generated::{MACRO_GRAPHS_DIR, struct_name};
use crate::ir::DType;
use crate::select::{Arch, SELECT_ENV, TUNED_ENV, TunedCache};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Configures and runs the build of one kernel library.
#[derive(Clone, Debug)]
pub struct Builder {
    graphs_dirs: Vec<PathBuf>,
    graph_files: Vec<PathBuf>,
    rust_sources: Vec<PathBuf>,
    dtypes: Option<Vec<DType>>,
    archs: Option<Vec<Arch>>,
    lib_name: Option<String>,
    tuned: Option<PathBuf>,
}

impl Default for Builder {
    fn default() -> Self {
        Builder::new()
    }
}

impl Builder {
    /// A builder with nothing to compile yet.
    pub fn new() -> Builder {
        Builder {
            graphs_dirs: Vec::new(),
            graph_files: Vec::new(),
            rust_sources: Vec::new(),
            dtypes: None,
            archs: None,
            lib_name: None,
            tuned: None,
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

    /// Compiles every `fusion_graph!` invocation in a Rust source file (at
    /// item level, also inside inline modules and function bodies). Call it
    /// once per file that declares graphs: the macro refuses to expand a
    /// graph whose file the build script did not read.
    pub fn sources(mut self, path: impl Into<PathBuf>) -> Builder {
        self.rust_sources.push(path.into());
        self
    }

    /// Compiles every graph once per dtype, re-typing all its tensors.
    /// Default: the dtype each graph declares.
    pub fn dtypes(mut self, dtypes: &[DType]) -> Builder {
        self.dtypes = Some(dtypes.to_vec());
        self
    }

    /// The architectures to compile for. Default: `FUSION_ARCHS`, else
    /// `CUDA_COMPUTE_CAP`, else the cargo features `sm75`, `sm80`, `sm90`
    /// of the crate being built (`Arch::for_build`).
    pub fn archs(mut self, archs: &[Arch]) -> Builder {
        self.archs = Some(archs.to_vec());
        self
    }

    /// A tuned cache (the tuner's JSON file, format in
    /// [`TunedCache`](crate::select::TunedCache)) whose configs replace the
    /// shipped tables' for the kernels whose N and K are static and which it
    /// has entries for. Default: the file `FUSION_TUNED` names, else none.
    /// Anything wrong with the file is a warning, never a failed build.
    pub fn tuned(mut self, path: impl Into<PathBuf>) -> Builder {
        self.tuned = Some(path.into());
        self
    }

    /// The tuned cache to read: [`Builder::tuned`], else `FUSION_TUNED`.
    fn tuned_path(&self) -> Option<PathBuf> {
        self.tuned.clone().or_else(|| {
            std::env::var_os(TUNED_ENV)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        })
    }

    /// The library's name: `lib<name>.a`, `<name>.h`, `<name>.rs`, and the
    /// prefix of every launcher symbol. Default: `<package>_kernels` for the
    /// package whose build script runs (`fusion_kernels` for fusion itself),
    /// so the libraries of several crates link side by side.
    pub fn lib_name(mut self, name: &str) -> Builder {
        self.lib_name = Some(name.to_owned());
        self
    }

    fn resolved_lib_name(&self) -> String {
        if let Some(name) = &self.lib_name {
            return name.clone();
        }
        let package = std::env::var("CARGO_PKG_NAME").unwrap_or_else(|_| "fusion".to_owned());
        format!("{}_kernels", crate::codegen::library_name(&package))
    }

    /// Runs the whole pipeline inside a build script.
    pub fn compile(self) -> Result<(), BuildError> {
        let options = CompileOptions::from_build_script_env()?;
        self.compile_with(options).map(|_| ())
    }

    /// Runs the pipeline with explicit options (tests, tools); returns the
    /// path of the generated wrappers.
    pub fn compile_with(self, options: CompileOptions) -> Result<PathBuf, BuildError> {
        self.build_with(options).map(|built| built.wrappers)
    }

    /// Runs the pipeline with explicit options and says what it did.
    pub fn build_with(self, mut options: CompileOptions) -> Result<BuiltLibrary, BuildError> {
        let lib_name = self.resolved_lib_name();
        options.lib_name = lib_name.clone();
        let library = self.render_library(&lib_name, options.cargo_metadata)?;
        let warn = super::Cargo {
            enabled: options.cargo_metadata,
        };
        for warning in &library.warnings {
            warn.warning(warning);
        }
        self.compile_library(library, options)
    }

    /// Runs the pipeline up to nvcc: the library a build would compile, with
    /// its warnings (which a build prints as `cargo:warning` lines).
    pub fn render(&self) -> Result<codegen::KernelLibrary, BuildError> {
        self.render_library(&self.resolved_lib_name(), false)
    }

    /// Graph files to rendered units; `cargo`: print the rerun lines.
    fn render_library(&self, lib_name: &str, cargo: bool) -> Result<codegen::KernelLibrary, BuildError> {
        let files = self.collect(cargo)?;
        let tuned = self.tuned_path();
        if cargo {
            for name in Arch::BUILD_ENV.into_iter().chain([
                TUNED_ENV,
                SELECT_ENV,
                crate::select::guard::GUARD_ENV,
                codegen::FP8_ENV,
            ]) {
                println!("cargo:rerun-if-env-changed={name}");
            }
            if let Some(path) = &tuned {
                println!("cargo:rerun-if-changed={}", path.display());
            }
        }
        let archs = match self.archs.clone() {
            Some(archs) => archs,
            None => Arch::for_build().map_err(BuildError::Config)?,
        };
        if archs.is_empty() {
            return Err(BuildError::Config(format!(
                "no GPU architecture to compile for: enable a cargo feature {}, set FUSION_ARCHS or CUDA_COMPUTE_CAP, or call Builder::archs",
                Arch::names_listed()
            )));
        }
        // The fusions the tuned tables of these archs measured to lose are
        // not formed (crate::fuse::split).
        let rules = crate::select::split_rules(&archs).map_err(|e| BuildError::Config(e.to_string()))?;
        let fp8 = fp8_kernels()?;
        let mut declared = files
            .iter()
            .map(|path| self.toml_graph(path, &rules, fp8))
            .collect::<Result<Vec<_>, _>>()?;
        for path in &self.rust_sources {
            if cargo {
                println!("cargo:rerun-if-changed={}", path.display());
            }
            for graph in super::sources::read_macro_graphs(path)? {
                let dtypes = self.dtypes_for(&graph.graph, &graph.origin, fp8)?;
                // `fusion_graph!` expands to the graph's struct, which an FP8
                // graph does not get (codegen::wrappers exports its launchers).
                if graph.graph.has_fp8() {
                    return Err(BuildError::Config(format!(
                        "{}: graph `{}` has FP8 tensors, and FUSION_FP8=experimental generates their kernels for TOML graphs only: `fusion_graph!` expands to a graph struct, which the run time cannot give FP8 graphs yet; declare it in a TOML file",
                        graph.origin, graph.graph.name
                    )));
                }
                declared.push(Declared {
                    spec: GraphSpec {
                        plan: crate::fuse::plan_with(graph.graph, &rules),
                        dtypes,
                        origin: graph.origin,
                        fingerprint: Some(graph.fingerprint),
                        declaration: graph.declaration,
                    },
                    name_written: None,
                });
            }
        }
        check_unique_names(&declared)?;
        let specs: Vec<GraphSpec> = declared.into_iter().map(|d| d.spec).collect();
        if specs.is_empty() {
            return Err(BuildError::Config(
                "no graphs to compile: the graph directories, graph files and sources given to the Builder declare none"
                    .to_owned(),
            ));
        }
        let mut cache = tuned.map(|path| TunedCache::read(&path)).unwrap_or_default();
        cache.model = select_by_model()?.then(crate::select::model::Calibration::shipped_sm90);
        cache.guard = crate::select::guard::guard_from_env()
            .map_err(BuildError::Config)?
            .then(crate::select::guard::Guard::shipped_sm90);
        cache.fp8 = fp8;
        codegen::render_tuned(lib_name, &archs, &specs, &[], &cache)
            .map_err(|e| BuildError::Config(e.to_string()))
    }

    /// Compiles a rendered library and writes its wrappers.
    fn compile_library(
        &self,
        library: codegen::KernelLibrary,
        options: CompileOptions,
    ) -> Result<BuiltLibrary, BuildError> {
        let lib_name = &library.lib_name;
        let include_dir = options.out_dir.join("include");
        templates::write_headers(&include_dir)
            .map_err(BuildError::io("cannot write headers into", &include_dir))?;
        let mut units: Vec<Unit> = library
            .units
            .iter()
            .map(|u| Unit {
                name: u.symbol.clone(),
                source: u.source.clone(),
                archs: u.archs.clone(),
                used_by: u.used_by.clone(),
                tiles: tiles_of(&u.key),
            })
            .collect();
        units.push(Unit {
            name: library.error_unit.0.clone(),
            source: library.error_unit.1.clone(),
            archs: vec![library.archs[0]],
            used_by: Vec::new(),
            tiles: Vec::new(),
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
        let linked = compiled.mode == BuildMode::Linked;
        let ffi = compiled.ffi_rs.to_string_lossy().into_owned();
        let wrappers = codegen::wrappers::generate(&library, linked, &ffi);
        let path = options.out_dir.join(format!("{lib_name}.rs"));
        write_if_changed(&path, &wrappers)?;

        // One file per macro graph; files of graphs no longer declared go,
        // so a graph moved to a file this build does not read is reported
        // by the macro instead of linking against launchers that are gone.
        let graphs_dir = options.out_dir.join(MACRO_GRAPHS_DIR);
        std::fs::create_dir_all(&graphs_dir).map_err(BuildError::io("cannot create", &graphs_dir))?;
        let mut macro_graphs = Vec::new();
        for (index, launchers) in library.graphs.iter().enumerate() {
            if launchers.spec.fingerprint.is_none() {
                continue;
            }
            let file = graphs_dir.join(format!("{}.rs", launchers.spec.plan.graph.name));
            write_if_changed(
                &file,
                &codegen::wrappers::generate_macro_graph(&library, index, linked, &ffi),
            )?;
            macro_graphs.push(file);
        }
        let entries = std::fs::read_dir(&graphs_dir).map_err(BuildError::io("cannot read", &graphs_dir))?;
        for entry in entries.flatten() {
            let stale = entry.path();
            if stale.extension().is_some_and(|e| e == "rs") && !macro_graphs.contains(&stale) {
                std::fs::remove_file(&stale).map_err(BuildError::io("cannot remove", &stale))?;
            }
        }
        Ok(BuiltLibrary {
            wrappers: path,
            macro_graphs,
            compiled,
        })
    }

    /// The dtypes to compile a graph for: [`Builder::dtypes`], else the one
    /// it declares. An FP8 graph is compiled as declared, never re-typed
    /// (its scales would mean nothing), and only where the build asks for
    /// FP8 kernels (`fp8`: [`fp8_kernels`]).
    fn dtypes_for(
        &self,
        graph: &crate::ir::Graph,
        origin: &str,
        fp8: bool,
    ) -> Result<Vec<DType>, BuildError> {
        // Before the mixed-dtype check, which an FP8 graph (FP8 operands,
        // f32 scales) would fail with a less useful message.
        if graph.has_fp8() {
            if !fp8 {
                codegen::refuse_fp8(graph).map_err(|e| BuildError::Config(format!("{origin}: {e}")))?;
            }
            return Ok(vec![DType::F8E4M3]);
        }
        let mut declared: Vec<DType> = graph.tensors.iter().map(|t| t.dtype).collect();
        declared.sort_by_key(|d| d.name());
        declared.dedup();
        match &self.dtypes {
            Some(dtypes) => Ok(dtypes.clone()),
            None if declared.len() == 1 => Ok(declared),
            None => Err(BuildError::Config(format!(
                "{origin}: graph `{}` mixes dtypes; kernels take one element type (or call Builder::dtypes to re-type it)",
                graph.name
            ))),
        }
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
        Ok(files)
    }

    fn toml_graph(
        &self,
        path: &Path,
        rules: &[crate::fuse::SplitRule],
        fp8: bool,
    ) -> Result<Declared, BuildError> {
        let source = SourceFile::read(path).map_err(|d| BuildError::Config(d.message))?;
        let decl = crate::syntax::parse_toml(&source).map_err(|e| BuildError::Config(e.render(&source)))?;
        let graph = crate::ir::lower(&decl).map_err(|e| BuildError::Config(e.render(&source)))?;
        let origin = path.display().to_string();
        let dtypes = self.dtypes_for(&graph, &origin, fp8)?;
        Ok(Declared {
            spec: GraphSpec {
                plan: crate::fuse::plan_with(graph, rules),
                dtypes,
                origin,
                fingerprint: None,
                declaration: String::new(),
            },
            name_written: Some((source, decl.name.span)),
        })
    }
}

/// A graph of the library, with where its name was written when that was a
/// TOML file, so that a clash of names points at the `[graph] name` line.
/// (A macro graph's origin, `src/model.rs:12`, already names its line.)
struct Declared {
    spec: GraphSpec,
    name_written: Option<(SourceFile, Span)>,
}

impl Declared {
    /// `message` located at this graph's name where it has one.
    fn error_at_name(&self, message: String) -> BuildError {
        BuildError::Config(match &self.name_written {
            Some((source, span)) => source.render(&Diagnostic::new(*span, message)),
            None => message,
        })
    }
}

/// What [`Builder::build_with`] produced.
#[derive(Clone, Debug)]
pub struct BuiltLibrary {
    /// `OUT_DIR/<lib_name>.rs`: the wrappers of the TOML graphs.
    pub wrappers: PathBuf,
    /// `OUT_DIR/fusion_graphs/<graph>.rs`, one per `fusion_graph!` graph.
    pub macro_graphs: Vec<PathBuf>,
    /// What nvcc compiled and what came from the cache.
    pub compiled: CompiledLibrary,
}

/// Two graphs of one library may not share a name, nor a Rust type name:
/// their wrappers (and a macro graph's file) are named after it, and
/// `gemm__bias`, `gemm_bias` and `GemmBias` all become the struct `GemmBias`
/// (a `fusion_graph!` graph `g` also defines `GWeights`). The error is
/// located at the second graph's name.
fn check_unique_names(declared: &[Declared]) -> Result<(), BuildError> {
    let mut names: HashMap<&str, &GraphSpec> = HashMap::new();
    let mut types: HashMap<String, &GraphSpec> = HashMap::new();
    for graph in declared {
        let spec = &graph.spec;
        let name = spec.plan.graph.name.as_str();
        if let Some(first) = names.insert(name, spec) {
            return Err(graph.error_at_name(format!(
                "graph `{name}` is declared twice, in {} and in {}; rename one of them",
                first.origin, spec.origin
            )));
        }
        let struct_name = struct_name(name);
        let weights = spec.fingerprint.map(|_| format!("{struct_name}Weights"));
        for type_name in std::iter::once(struct_name).chain(weights) {
            if let Some(first) = types.get(&type_name) {
                return Err(graph.error_at_name(format!(
                    "graphs `{}` (in {}) and `{name}` (in {}) would both define the Rust type `{type_name}`; rename one of them",
                    first.plan.graph.name, first.origin, spec.origin
                )));
            }
            types.insert(type_name, spec);
        }
    }
    Ok(())
}

fn write_if_changed(path: &Path, text: &str) -> Result<(), BuildError> {
    if std::fs::read_to_string(path).ok().as_deref() != Some(text) {
        std::fs::write(path, text).map_err(BuildError::io("cannot write", path))?;
    }
    Ok(())
}

/// Whether `FUSION_FP8` ([`codegen::FP8_ENV`]) asks for FP8 kernels:
/// `experimental` yes (sm90's FP8 GEMM, checked on a GPU, not yet timed); unset or
/// empty no (FP8 graphs are refused); anything else is an error naming the
/// value it takes. A build script that adds FP8 graphs only when they are
/// asked for reads it here too.
pub fn fp8_kernels() -> Result<bool, BuildError> {
    let env = codegen::FP8_ENV;
    match std::env::var(env).as_deref() {
        Ok("experimental") => Ok(true),
        Ok("") | Err(std::env::VarError::NotPresent) => Ok(false),
        Ok(other) => Err(BuildError::Config(format!(
            "{env}={other:?}: it takes `experimental` (generate sm90 kernels for FP8 GEMMs, checked on a GPU, not yet timed) or nothing"
        ))),
        Err(std::env::VarError::NotUnicode(value)) => Err(BuildError::Config(format!(
            "{env}={value:?} is not Unicode: it takes `experimental`"
        ))),
    }
}

/// Whether `FUSION_SELECT` ([`SELECT_ENV`]) asks for the model's tiles:
/// `model` yes; unset, empty or `tables` no; anything else is an error
/// naming the values it takes.
fn select_by_model() -> Result<bool, BuildError> {
    match std::env::var(SELECT_ENV).as_deref() {
        Ok("model") => Ok(true),
        Ok("" | "tables") | Err(std::env::VarError::NotPresent) => Ok(false),
        Ok(other) => Err(BuildError::Config(format!(
            "{SELECT_ENV}={other:?}: it takes `model` (sm90 GEMM tiles by the model of their time: per M bucket where N and K are static, per call where not) or `tables` (the shipped tables, the default)"
        ))),
        Err(std::env::VarError::NotUnicode(value)) => Err(BuildError::Config(format!(
            "{SELECT_ENV}={value:?} is not Unicode: it takes `model` or `tables`"
        ))),
    }
}

/// A GEMM unit's tile configs, `large: 128x256x64 (...)` and the small-M
/// ones or those per M bucket (`m <= 512: ...`), and its decode kernel's
/// threshold (`decode: m <= 16`), for the manifest.
fn tiles_of(key: &KernelKey) -> Vec<String> {
    let KernelKey::Gemm { config, layout, .. } = key else {
        return Vec::new();
    };
    config
        .tiers()
        .into_iter()
        .chain([("few_m", config.few_m)])
        .filter_map(|(which, tile)| Some(format!("{which}: {}", tile?.summary())))
        .chain(config.tiers_by_m().into_iter().map(|(max_m, tile)| match max_m {
            Some(max_m) => format!("m <= {max_m}: {}", tile.summary()),
            None => format!("larger m: {}", tile.summary()),
        }))
        .chain(
            config
                .decode_for(*layout)
                .map(|max_m| format!("decode: m <= {max_m}")),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::GraphBuilder;

    /// A one-op graph named `name`, from a TOML file or (`macro_graph`) a
    /// `fusion_graph!`.
    fn spec(name: &str, macro_graph: bool) -> Declared {
        let mut b = GraphBuilder::new(name);
        let n = b.static_dim("N", 64).unwrap();
        let x = b.input("x", DType::F16, &[n, n]).unwrap();
        let y = b.relu(x).unwrap();
        b.output("y", y).unwrap();
        Declared {
            spec: GraphSpec {
                plan: crate::fuse::plan(b.build().unwrap()),
                dtypes: vec![DType::F16],
                origin: format!("graphs/{name}.toml"),
                fingerprint: macro_graph.then_some(0),
                declaration: String::new(),
            },
            name_written: None,
        }
    }

    fn names_error(declared: &[Declared]) -> String {
        match check_unique_names(declared) {
            Err(BuildError::Config(message)) => message,
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    #[test]
    fn graphs_that_would_define_one_rust_type_are_refused_naming_both_files() {
        assert!(check_unique_names(&[spec("gemm_bias", false), spec("gemm_bias_gelu", true)]).is_ok());
        assert_eq!(
            names_error(&[spec("gemm_bias", false), spec("gemm__bias", false)]),
            "graphs `gemm_bias` (in graphs/gemm_bias.toml) and `gemm__bias` (in graphs/gemm__bias.toml) \
             would both define the Rust type `GemmBias`; rename one of them"
        );
        assert!(names_error(&[spec("GemmBias", false), spec("gemm_bias", false)]).contains("`GemmBias`"));
        // A macro graph also defines `<Struct>Weights`.
        let message = names_error(&[spec("mlp", true), spec("mlp_weights", false)]);
        assert!(
            message.contains("would both define the Rust type `MlpWeights`"),
            "{message}"
        );
        let message = names_error(&[spec("mlp", false), spec("mlp", true)]);
        assert!(message.starts_with("graph `mlp` is declared twice"), "{message}");
    }

    /// A one-op TOML graph `name` whose tensors are `dtype`s.
    fn toml_graph(name: &str, dtype: &str) -> String {
        format!(
            "# {name}\n[graph]\nname = \"{name}\"\n[inputs]\nx = \"{dtype}[8, 8]\"\n[outputs]\ny = \"relu(x)\"\n"
        )
    }

    /// Builds the graph files `(file name, text)` for sm90 in a fresh
    /// directory (`tag` names it) and returns the config error it must
    /// stop with, and that directory's `graphs/`, which no longer exists.
    fn refused_build(tag: &str, files: &[(&str, String)]) -> (String, PathBuf) {
        let dir = std::env::temp_dir().join(format!("fusion-builder-{tag}-{}", std::process::id()));
        let graphs = dir.join("graphs");
        std::fs::create_dir_all(&graphs).unwrap();
        for (name, text) in files {
            std::fs::write(graphs.join(name), text).unwrap();
        }
        let built = Builder::new()
            .graphs_dir(&graphs)
            .archs(&[Arch::Sm90])
            .build_with(CompileOptions::new(dir.join("out")));
        let _ = std::fs::remove_dir_all(&dir);
        match built {
            Err(BuildError::Config(message)) => (message, graphs),
            other => panic!("expected a config error, got {other:?}"),
        }
    }

    /// A graph with FP8 tensors is refused (without FUSION_FP8=experimental,
    /// which this test leaves unset, as does every other test here) before
    /// the mixed-dtype check (its scales are f32) and before
    /// `Builder::dtypes` could re-type it; the message names the option.
    #[test]
    fn an_fp8_graph_is_refused_by_the_build_not_re_typed() {
        let fp8 = "[graph]\nname = \"g\"\n[inputs]\nx = \"f8e4m3[8, 8] scale s\"\n[weights]\ns = \"f32[1]\"\n\
                   w = \"f8e4m3[8, 8] scale s\"\n[outputs]\ny = \"x @ w\"\n";
        let (message, graphs) = refused_build("fp8", &[("g.toml", fp8.to_string())]);
        assert_eq!(
            message,
            format!(
                "{}: graph `g`: FP8 kernels are not generated yet, and `x` and `w` are f8e4m3; the front ends, \
                 the IR's checks and the CPU reference take FP8 graphs, but no GPU mainloop computes them; a build \
                 with FUSION_FP8=experimental generates sm90 kernels for FP8 GEMMs (checked on a GPU, not yet timed)",
                graphs.join("g.toml").display()
            )
        );
    }

    /// The clash is reported at the second TOML file's `[graph] name`, with
    /// the line shown, like the front end's own errors.
    #[test]
    fn a_type_name_clash_between_toml_graphs_points_at_the_second_name() {
        let files = [
            ("a.toml", toml_graph("gemm_bias", "f16")),
            ("b.toml", toml_graph("gemm__bias", "f16")),
        ];
        let (message, graphs) = refused_build("names", &files);
        let second = graphs.join("b.toml");
        let expected_start = format!(
            "{}:3:9: error: graphs `gemm_bias` (in {}) and `gemm__bias` (in {}) would both define the Rust type `GemmBias`",
            second.display(),
            graphs.join("a.toml").display(),
            second.display()
        );
        assert!(message.starts_with(&expected_start), "{message}");
        assert!(
            message.ends_with("3 | name = \"gemm__bias\"\n  |         ^^^^^^^^^^"),
            "{message}"
        );
    }

    /// The front ends accept f32 tensors (the CPU reference runs them), but
    /// no kernel takes f32: the build names the graph, unless
    /// `Builder::dtypes` re-types it. A graph mixing dtypes is refused
    /// unless re-typed the same way.
    #[test]
    fn f32_and_mixed_dtype_graphs_are_refused_by_the_build() {
        let (message, _) = refused_build("f32", &[("g.toml", toml_graph("g", "f32"))]);
        assert_eq!(
            message,
            "graph `g`: kernels are compiled for f16 and bf16 only, not f32"
        );
        let mixed =
            toml_graph("g", "f16").replace("[outputs]", "r = \"bf16[8, 8]\"\n[outputs]\nz = \"relu(r)\"");
        let (message, graphs) = refused_build("mixed", &[("g.toml", mixed)]);
        assert_eq!(
            message,
            format!(
                "{}: graph `g` mixes dtypes; kernels take one element type (or call Builder::dtypes to re-type it)",
                graphs.join("g.toml").display()
            )
        );
    }
}
