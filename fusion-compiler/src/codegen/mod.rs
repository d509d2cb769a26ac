//! Code generation: CUDA translation units, the C header that declares their
//! launchers, and the typed Rust wrappers that call them.
//!
//! [`render`] takes planned graphs and produces a [`KernelLibrary`]: one unit
//! per distinct kernel, where a kernel is a composition (norm prologue ×
//! mainloop × epilogue chain) with a `B` layout, a dtype, a mainloop and its
//! tile configs. Kernels that agree on all of these share one unit and one
//! launcher symbol, whichever graphs and kernel positions use them (the
//! `gemm_bias_residual` of three graphs is compiled once). The mainloop is
//! part of a GEMM's key and every generation has its own, so a GEMM unit
//! serves one generation; a standalone norm or elementwise kernel has no
//! mainloop, and its one unit is compiled for every generation built. Symbols start with the library name, so two crates' libraries
//! link side by side.
//!
//! The templates (`kernels/*.hbs`, see [`templates`]) only pick C++ types
//! (an epilogue step's is its row's in the op table, [`crate::ir::ops`]) and
//! copy parameters; what a kernel computes lives in the headers under
//! `kernels/include/fusion`. [`wrappers`] turns the same library description
//! into Rust.
//!
//! [`candidates`] renders units for explicit tile configs (the kernel
//! self-test, tile sweeps) through the same path.
//!
//! Not here: choosing configs ([`crate::select`]) and running nvcc
//! (`crate::build`).

pub mod candidates;
pub mod graph_literal;
pub mod templates;
pub mod wrappers;

use crate::fuse::{Activation, Composition, EpilogueStep, FusedKernel, NormKind, Plan, Role};
use crate::gemm_model::{Costs, UnitTiers};
use crate::guard_model::GuardCosts;
use crate::ir::{DType, Extent, Graph, WeightLayout};
use crate::select::{
    self, Arch, ConfigSource, KernelConfig, KernelKind, SelectError, TierChoice, TileConfig, TunedCache,
    TunedTable,
};
use indexmap::IndexMap;
use serde_json::json;

fn element_type(dtype: DType) -> &'static str {
    match dtype {
        DType::F16 => "__half",
        DType::BF16 => "__nv_bfloat16",
        DType::F32 => "float",
        DType::F8E4M3 => "__nv_fp8_e4m3",
    }
}

fn norm_type(kind: NormKind) -> &'static str {
    match kind {
        NormKind::LayerNorm => "LayerNorm",
        NormKind::RmsNorm => "RmsNorm",
    }
}

fn layout_name(layout: WeightLayout) -> &'static str {
    match layout {
        WeightLayout::KN => "KN",
        WeightLayout::NK => "NK",
    }
}

/// One graph to compile, and the element types to compile it for.
#[derive(Clone, Debug)]
pub struct GraphSpec {
    /// Its plan.
    pub plan: Plan,
    /// Each one re-types the whole graph; every kernel gets a variant per dtype.
    pub dtypes: Vec<DType>,
    /// Where the graph was declared (`graphs/gemm_bias.toml`), for comments.
    pub origin: String,
    /// Set for a graph declared with `fusion_graph!`: the hash of its tokens
    /// ([`crate::syntax::graph_fingerprint`]). Its wrappers then bind the
    /// weights in `new` and go to a file of their own, which the macro
    /// includes (see [`wrappers::generate_macro_graph`]).
    pub fingerprint: Option<u64>,
    /// A macro graph's declaration as written (its tokens as text), for
    /// the generated `DECLARATION` and `graph()`. Empty for TOML graphs.
    pub declaration: String,
}

/// How an FP8 GEMM's weight is scaled, which its unit's first epilogue
/// step (`fusion::Dequantize`, with A's per-tensor scale) follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WeightScale {
    /// One f32 for the whole weight (`f32[1]`).
    PerTensor,
    /// One f32 per output channel (`f32[N]`).
    PerChannel,
}

/// The build option that turns on FP8 kernel generation:
/// `FUSION_FP8=experimental` (read by `crate::build`, carried to [`render_tuned`]
/// as [`TunedCache::fp8`]).
pub const FP8_ENV: &str = "FUSION_FP8";

/// What one distinct kernel is: everything its unit's source depends on.
// A build holds one key per unit (tens of them), so the GEMM variant's
// size (its tile configs inline) costs nothing worth a box.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum KernelKey {
    /// A fused GEMM.
    Gemm {
        /// The norm before the GEMM, if any.
        prologue: Option<NormKind>,
        /// How B is stored.
        layout: WeightLayout,
        /// A gated GEMM's activation ([`crate::fuse::GemmComposition::gate`]).
        gate: Option<Activation>,
        /// The epilogue chain.
        steps: Vec<EpilogueStep>,
        /// The element type: of A, B and C, or of A and B for an FP8 GEMM
        /// (f8e4m3), which writes bf16.
        dtype: DType,
        /// An FP8 GEMM's weight scale; `None` for the others.
        weight_scale: Option<WeightScale>,
        /// The generation whose mainloop it runs.
        arch: Arch,
        /// Its tile configs.
        config: KernelConfig,
        /// The tuned table entry (or the tuned cache's entries) `config` came
        /// from, which the unit's resource checks name.
        origin: ConfigSource,
        /// The static N and K `config` was tuned for, when it came from a
        /// tuned cache: kernels of one composition at other shapes are
        /// other units.
        tuned_for: Option<(u64, u64)>,
        /// The width of a `small_m_alt` fitted to a static N
        /// (`select::fitted_width`): kernels of one composition with other
        /// widths are other units.
        fitted_width: Option<u32>,
    },
    /// A standalone norm.
    Norm {
        /// LayerNorm or RMSNorm.
        kind: NormKind,
        /// The element type.
        dtype: DType,
    },
    /// A standalone chain of elementwise steps.
    Elementwise {
        /// The steps, in order.
        steps: Vec<EpilogueStep>,
        /// The element type.
        dtype: DType,
    },
}

/// Which C params struct a launcher takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ParamsKind {
    /// `fusion_gemm_params`.
    Gemm,
    /// `fusion_norm_params`.
    Norm,
    /// `fusion_elementwise_params`.
    Elementwise,
}

impl ParamsKind {
    /// The struct's C name, as in `abi.h`.
    pub fn c_name(self) -> &'static str {
        match self {
            ParamsKind::Gemm => "fusion_gemm_params",
            ParamsKind::Norm => "fusion_norm_params",
            ParamsKind::Elementwise => "fusion_elementwise_params",
        }
    }

    /// Whether its launchers come with `<symbol>_workspace_bytes` (abi.h):
    /// GEMMs, whose launchers take stream-K scratch, a folded norm's row
    /// statistics and a per-call norm's normalized A from the caller.
    pub fn has_workspace(self) -> bool {
        self == ParamsKind::Gemm
    }
}

/// One rendered translation unit and its launcher.
#[derive(Clone, Debug)]
pub struct RenderedUnit {
    /// The launcher's `extern "C"` name, also the unit's file stem.
    pub symbol: String,
    /// What the unit computes.
    pub key: KernelKey,
    /// The params struct its launcher takes.
    pub params: ParamsKind,
    /// The architectures it is compiled for, ascending.
    pub archs: Vec<Arch>,
    /// The graph kernels it serves, `swiglu_ffn#0` (the kernel's index in
    /// the graph's plan).
    pub used_by: Vec<String>,
    /// The CUDA source.
    pub source: String,
}

impl RenderedUnit {
    /// Whether the unit also exports the folded form of its norm prologue
    /// (`<symbol>_folded`; see abi.h).
    pub fn has_folded_form(&self) -> bool {
        matches!(
            self.key,
            KernelKey::Gemm {
                prologue: Some(_),
                ..
            }
        )
    }

    /// Whether the unit exports `<symbol>_fold_weights`, which prepares
    /// bound weights: a norm folded in, a gated pair interleaved (abi.h).
    pub fn has_fold_weights(&self) -> bool {
        matches!(self.key, KernelKey::Gemm { prologue, gate, .. } if prologue.is_some() || gate.is_some())
    }
}

/// The launcher each (dtype, arch) of one planned kernel calls.
#[derive(Clone, Debug, Default)]
pub struct KernelVariants {
    /// `(dtype, arch, launcher symbol)`, one per variant built.
    pub variants: Vec<(DType, Arch, String)>,
    /// Where the guard sends the kernel to the vendor path
    /// ([`crate::select::guard`], `FUSION_GUARD=on`): the arch, the M
    /// buckets every dtype of the graph loses in, and cuBLASLt's epilogue.
    pub vendor: Option<select::guard::Route>,
    /// Per variant, index for index: the tiers the run time chooses among
    /// per call by the model, where the build has it
    /// ([`KernelLibrary::model`]) and left the GEMM's tile to the call
    /// ([`select::model::run_time_tiers`]); `None` for the others.
    pub tiers: Vec<Option<UnitTiers>>,
    /// Where the guard leaves the verdict to the call (`FUSION_GUARD=on`,
    /// N or K dynamic, [`select::guard::call_route`]): the route and, per
    /// variant, index for index, the tiers the run time weighs (`None` for
    /// a variant the guard does not serve).
    pub call_route: Option<(select::guard::CallRoute, Vec<Option<UnitTiers>>)>,
    /// Where the guard may send a GEMM with a norm prologue to the vendor
    /// path (a route, or a verdict left to the call): per variant, index for
    /// index, the launcher of the standalone norm kernel that path runs
    /// before cuBLASLt. Empty for every other kernel.
    pub vendor_norm: Vec<String>,
}

impl KernelVariants {
    /// The launcher of the variant for `dtype` on `arch`, if it was built.
    pub fn symbol(&self, dtype: DType, arch: Arch) -> Option<&str> {
        self.variants
            .iter()
            .find(|(d, a, _)| *d == dtype && *a == arch)
            .map(|(_, _, s)| s.as_str())
    }
}

/// One compiled graph: its plan and, per kernel of the plan, its launchers.
#[derive(Clone, Debug)]
pub struct GraphLaunchers {
    /// The graph, as given to [`render`].
    pub spec: GraphSpec,
    /// Per kernel of the plan, in plan order, its launchers.
    pub kernels: Vec<KernelVariants>,
}

/// Everything rendered for one library.
#[derive(Clone, Debug)]
pub struct KernelLibrary {
    /// The library's name: the prefix of every symbol.
    pub lib_name: String,
    /// The generations it was rendered for, ascending.
    pub archs: Vec<Arch>,
    /// Kernel units, then the unit with `<lib>_error_string`.
    pub units: Vec<RenderedUnit>,
    /// `<lib>_error_string`'s unit: `(file stem, source)`.
    pub error_unit: (String, String),
    /// `<lib>.h` and its contents.
    pub header: (String, String),
    /// The graphs it compiles, in the order given.
    pub graphs: Vec<GraphLaunchers>,
    /// What the build should tell the user: problems with the tuned cache,
    /// each naming its file (and the entry), each once.
    pub warnings: Vec<String>,
    /// The model of the sm90 GEMM kernel's time the build chose tiles by
    /// (`FUSION_SELECT=model`): its costs, which the plan tables carry
    /// where a GEMM's tile is chosen per call ([`KernelVariants::tiers`]).
    pub model: Option<Costs>,
    /// The guard's models (`FUSION_GUARD=on`): their costs, which the plan
    /// tables carry where a GEMM's verdict is made per call
    /// ([`KernelVariants::call_route`]).
    pub guard: Option<GuardCosts>,
}

/// Why code could not be generated.
#[derive(Debug, thiserror::Error)]
pub enum CodegenError {
    /// No tile config could be chosen.
    #[error(transparent)]
    Select(#[from] SelectError),
    /// A graph asks for something the code generator cannot render.
    #[error("graph `{graph}`: {message}")]
    Unsupported {
        /// The graph's name.
        graph: String,
        /// What it asks for.
        message: String,
    },
    #[error(
        "`{0}` is not a valid library name: use lowercase letters, digits and `_`, starting with a letter"
    )]
    /// The library name is not usable in C symbols.
    LibName(String),
    /// The graph has FP8 tensors, and the build did not ask for FP8
    /// kernels ([`FP8_ENV`]; [`Graph::fp8_refusal`] says which tensors).
    #[error(
        "{0}; a build with FUSION_FP8=experimental generates sm90 kernels for FP8 GEMMs (checked on a GPU, not yet timed)"
    )]
    Fp8NotGenerated(String),
    /// FP8 kernels are asked for, but none of the generations built has
    /// them: only sm90's mainloop multiplies e4m3 (wgmma).
    #[error(
        "{origin}: graph `{graph}` has FP8 tensors, and FP8 kernels need sm90 (wgmma's e4m3 form); this build is for {archs}: build for sm90 as well"
    )]
    Fp8NeedsSm90 {
        /// Where the graph was declared.
        origin: String,
        /// The graph's name.
        graph: String,
        /// The generations built, `sm75, sm80`.
        archs: String,
    },
    /// An FP8 GEMM the sm90 kernel does not compute yet: a weight stored
    /// [K, N], a gated GEMM, a weight scale that is neither per tensor nor
    /// per output channel.
    #[error("{origin}: graph `{graph}`, kernel #{kernel} (`{composition}`): {message}")]
    Fp8Unsupported {
        /// Where the graph was declared.
        origin: String,
        /// The graph's name.
        graph: String,
        /// The kernel's index in the plan.
        kernel: usize,
        /// The kernel's composition name.
        composition: String,
        /// What it asks for and what to do instead.
        message: String,
    },
    /// A template failed to render.
    #[error("rendering {template}: {message}")]
    Template {
        /// The template's name.
        template: String,
        /// Handlebars' message.
        message: String,
    },
}

/// `text` as a library name [`render`] accepts: lowercase ASCII letters,
/// digits and `_` (any other character becomes `_`), starting with a letter
/// (`lib_` is put before one that does not).
pub fn library_name(text: &str) -> String {
    let mut name: String = text
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '_'
            }
        })
        .collect();
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        name.insert_str(0, "lib_");
    }
    name
}

/// Renders every kernel of `graphs` for every arch in `archs` (bf16 is
/// skipped on sm75, which has no bf16 tensor cores) into one library. A
/// dtype that no arch in `archs` supports (bf16 when only sm75 is built) is
/// an error naming the graph's file: its wrappers could only ever refuse.
pub fn render(lib_name: &str, archs: &[Arch], graphs: &[GraphSpec]) -> Result<KernelLibrary, CodegenError> {
    render_with_tables(lib_name, archs, graphs, &[])
}

/// [`render`], with `tables` in place of the shipped tuned table of their
/// arch (the shipped one for the others).
pub fn render_with_tables(
    lib_name: &str,
    archs: &[Arch],
    graphs: &[GraphSpec],
    tables: &[TunedTable],
) -> Result<KernelLibrary, CodegenError> {
    render_tuned(lib_name, archs, graphs, tables, &TunedCache::default())
}

/// [`render_with_tables`], with the configs of a user's tuned cache for the
/// kernels whose N and K are static and which it has entries for
/// ([`select::select_tuned`]). The cache's warnings, and those of entries
/// that could not be used, are the library's [`KernelLibrary::warnings`].
pub fn render_tuned(
    lib_name: &str,
    archs: &[Arch],
    graphs: &[GraphSpec],
    tables: &[TunedTable],
    cache: &TunedCache,
) -> Result<KernelLibrary, CodegenError> {
    let valid_name = lib_name.starts_with(|c: char| c.is_ascii_lowercase())
        && lib_name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
    if !valid_name {
        return Err(CodegenError::LibName(lib_name.to_owned()));
    }
    let mut archs = archs.to_vec();
    archs.sort();
    archs.dedup();
    let tables = archs
        .iter()
        .map(|&arch| match tables.iter().find(|t| t.arch == arch) {
            Some(table) => Ok(table.clone()),
            None => TunedTable::shipped(arch),
        })
        .collect::<Result<Vec<_>, _>>()?;

    // Distinct kernels, in first-use order, with the archs and the users of each.
    struct Pending {
        archs: Vec<Arch>,
        composition: String,
        used_by: Vec<String>,
    }
    let mut distinct: IndexMap<KernelKey, Pending> = IndexMap::new();
    let mut warnings = cache.warnings.clone();
    // One variant of a kernel: its dtype, arch, key, run-time tiers and
    // the guard's verdict left to the call.
    type Use = (
        DType,
        Arch,
        KernelKey,
        Option<UnitTiers>,
        Option<(select::guard::CallRoute, UnitTiers)>,
    );
    // Per graph, per kernel, its variants.
    let mut uses: Vec<Vec<Vec<Use>>> = Vec::new();
    // Per graph, per kernel: the guard's route ([`KernelVariants::vendor`]).
    let mut routes: Vec<Vec<Option<select::guard::Route>>> = Vec::new();
    // Per graph, per kernel, per variant: the standalone norm kernel of its
    // vendor path ([`KernelVariants::vendor_norm`]).
    let mut vendor_norms: Vec<Vec<Vec<KernelKey>>> = Vec::new();
    for spec in graphs {
        check_dtypes(spec, &archs, cache.fp8)?;
        let mut graph_uses = Vec::new();
        let mut graph_routes = Vec::new();
        let mut graph_norms = Vec::new();
        for (index, kernel) in spec.plan.kernels.iter().enumerate() {
            let weight_scale = fp8_weight_scale(spec, index, kernel)?;
            let mut kernel_uses = Vec::new();
            // The buckets every dtype's verdict sends to the vendor path.
            let mut route: Option<select::guard::Route> = None;
            let mut routed_dtypes = 0;
            for &dtype in &spec.dtypes {
                for (&arch, table) in archs.iter().zip(&tables).filter(|(a, _)| a.supports(dtype)) {
                    let (n, k) = kernel.static_n_and_k(&spec.plan.graph);
                    let (key, warning) =
                        kernel_key(&kernel.composition, dtype, weight_scale, arch, table, cache, n, k)?;
                    // Where the build has the model but left the tile to the
                    // call, the tiers the run time chooses among (the model
                    // and the guard are of 16-bit GEMMs).
                    let tiers = match (&key, &kernel.composition, &cache.model) {
                        (KernelKey::Gemm { config, .. }, Composition::Gemm(gemm), Some(_))
                            if !dtype.is_fp8() =>
                        {
                            select::model::run_time_tiers(arch, &KernelKind::of(gemm, dtype), n, k, config)
                        }
                        _ => None,
                    };
                    if let Some(warning) = warning.filter(|w| !warnings.contains(w)) {
                        warnings.push(warning);
                    }
                    let entry = distinct.entry(key.clone()).or_insert_with(|| Pending {
                        archs: Vec::new(),
                        composition: kernel.composition.name(),
                        used_by: Vec::new(),
                    });
                    if !entry.archs.contains(&arch) {
                        entry.archs.push(arch);
                    }
                    // One kernel's users arrive together (its dtypes and
                    // archs), so comparing with the last keeps each once
                    // without searching the list.
                    let user = format!("{}#{index}", spec.plan.graph.name);
                    if entry.used_by.last() != Some(&user) {
                        entry.used_by.push(user);
                    }
                    let mut call_route = None;
                    if let (
                        KernelKey::Gemm {
                            config, tuned_for, ..
                        },
                        false,
                    ) = (&key, dtype.is_fp8())
                    {
                        let rule = select::tier_choice(arch, tuned_for.is_some());
                        if let Some(this) =
                            select::guard::route(cache, arch, kernel, &spec.plan.graph, dtype, config, rule)
                        {
                            routed_dtypes += 1;
                            route = Some(match route {
                                None => this,
                                Some(kept) => kept.both(&this),
                            });
                        }
                        call_route =
                            select::guard::call_route(cache, arch, kernel, &spec.plan.graph, dtype, config);
                    }
                    kernel_uses.push((dtype, arch, key, tiers, call_route));
                }
            }
            let route = route.filter(|route| routed_dtypes == spec.dtypes.len() && !route.buckets.is_empty());
            // A routed GEMM with a norm prologue runs the standalone norm
            // kernel of each variant's dtype first, on the vendor path.
            let routed = route.is_some() || kernel_uses.iter().any(|(.., call)| call.is_some());
            let norm = match &kernel.composition {
                Composition::Gemm(gemm) if routed => gemm.prologue.map(|p| p.kind),
                _ => None,
            };
            let mut norm_keys = Vec::new();
            if let Some(kind) = norm {
                for &(dtype, arch, ..) in &kernel_uses {
                    let key = KernelKey::Norm { kind, dtype };
                    let entry = distinct.entry(key.clone()).or_insert_with(|| Pending {
                        archs: Vec::new(),
                        composition: kind.name().to_owned(),
                        used_by: Vec::new(),
                    });
                    if !entry.archs.contains(&arch) {
                        entry.archs.push(arch);
                    }
                    let user = format!("{}#{index} (vendor path)", spec.plan.graph.name);
                    if !entry.used_by.contains(&user) {
                        entry.used_by.push(user);
                    }
                    norm_keys.push(key);
                }
            }
            graph_uses.push(kernel_uses);
            graph_routes.push(route);
            graph_norms.push(norm_keys);
        }
        uses.push(graph_uses);
        routes.push(graph_routes);
        vendor_norms.push(graph_norms);
    }

    let registry = templates::registry();
    let mut units = Vec::new();
    let mut symbols: IndexMap<KernelKey, String> = IndexMap::new();
    for (key, pending) in distinct {
        let symbol = symbol_for(lib_name, &key, &pending.composition, &pending.archs);
        let unit = render_unit(
            &registry,
            &symbol,
            &key,
            &pending.composition,
            &pending.archs,
            &pending.used_by,
        )?;
        symbols.insert(key, symbol);
        units.push(unit);
    }

    let graphs = graphs
        .iter()
        .zip(uses)
        .zip(routes)
        .zip(vendor_norms)
        .map(
            |(((spec, graph_uses), graph_routes), graph_norms)| GraphLaunchers {
                spec: spec.clone(),
                kernels: graph_uses
                    .into_iter()
                    .zip(graph_routes)
                    .zip(graph_norms)
                    .map(|((kernel_uses, vendor), norm_keys)| KernelVariants {
                        vendor_norm: norm_keys.iter().map(|key| symbols[key].clone()).collect(),
                        tiers: kernel_uses.iter().map(|(.., tiers, _)| *tiers).collect(),
                        call_route: kernel_uses
                            .iter()
                            .find_map(|(.., call)| call.as_ref().map(|(route, _)| route.clone()))
                            .map(|route| {
                                let units = kernel_uses
                                    .iter()
                                    .map(|(.., call)| call.as_ref().map(|(_, unit)| *unit))
                                    .collect();
                                (route, units)
                            }),
                        variants: kernel_uses
                            .into_iter()
                            .map(|(dtype, arch, key, ..)| (dtype, arch, symbols[&key].clone()))
                            .collect(),
                        vendor,
                    })
                    .collect(),
            },
        )
        .collect();

    let error_unit = (
        format!("{lib_name}_error_string"),
        render_template(&registry, "error_string.cu", &json!({ "lib_name": lib_name }))?,
    );
    let launchers: Vec<_> = units
        .iter()
        .map(|u| {
            json!({
                "symbol": u.symbol,
                "params": u.params.c_name(),
                "resources": u.params == ParamsKind::Gemm,
                "workspace": u.params.has_workspace(),
                "folded": u.has_folded_form(),
                "fold_weights": u.has_fold_weights(),
                "doc": format!("{}, built for {}", describe_key(&u.key), arch_list(&u.archs)),
            })
        })
        .collect();
    let header_context = json!({
        "lib_name": lib_name,
        "guard": format!("{}_H", lib_name.to_ascii_uppercase()),
        "launchers": launchers,
    });
    let header = (
        format!("{lib_name}.h"),
        render_template(&registry, "fusion_kernels.h", &header_context)?,
    );
    Ok(KernelLibrary {
        lib_name: lib_name.to_owned(),
        archs,
        units,
        error_unit,
        header,
        graphs,
        warnings,
        model: cache.model.as_ref().map(|model| model.costs),
        guard: cache.guard.as_ref().map(select::guard::Guard::costs),
    })
}

/// Refuses a graph with FP8 tensors: no kernel computes them yet, and
/// re-typing one (`Builder::dtypes`) would drop what its scales mean. The
/// build refuses them before this, and `fusion run` and `fusion tune` as
/// they load a graph; every rendering passes here too.
pub fn refuse_fp8(graph: &Graph) -> Result<(), CodegenError> {
    graph
        .fp8_refusal()
        .map_or(Ok(()), |message| Err(CodegenError::Fp8NotGenerated(message)))
}

/// Kernels take f16 or bf16, or, where the build asks for them (`fp8`:
/// [`FP8_ENV`]) and builds sm90, an FP8 graph as declared.
fn check_dtypes(spec: &GraphSpec, archs: &[Arch], fp8: bool) -> Result<(), CodegenError> {
    let graph = &spec.plan.graph;
    let unsupported = |message: String| CodegenError::Unsupported {
        graph: graph.name.clone(),
        message,
    };
    if graph.has_fp8() {
        if !fp8 {
            return refuse_fp8(graph);
        }
        if spec.dtypes != [DType::F8E4M3] {
            return Err(unsupported(format!(
                "{}: an FP8 graph is compiled as declared, for f8e4m3 alone: re-typed, its scales would mean nothing",
                spec.origin
            )));
        }
        if !archs.iter().any(|a| a.supports(DType::F8E4M3)) {
            return Err(CodegenError::Fp8NeedsSm90 {
                origin: spec.origin.clone(),
                graph: graph.name.clone(),
                archs: arch_list(archs),
            });
        }
        return Ok(());
    }
    if spec.dtypes.is_empty() {
        return Err(unsupported("no dtype to compile it for".into()));
    }
    if let Some(d) = spec
        .dtypes
        .iter()
        .find(|d| !matches!(d, DType::F16 | DType::BF16))
    {
        return Err(unsupported(format!(
            "kernels are compiled for f16 and bf16 only, not {d}"
        )));
    }
    if let Some(d) = spec
        .dtypes
        .iter()
        .find(|&&d| !archs.is_empty() && !archs.iter().any(|a| a.supports(d)))
    {
        let names: Vec<&str> = archs.iter().map(|a| a.name()).collect();
        return Err(unsupported(format!(
            "{}: {d} has no kernel on {} (Turing tensor cores have no {d}); build for sm80 or sm90 as well, or compile this graph for f16",
            spec.origin,
            names.join(", ")
        )));
    }
    Ok(())
}

/// The weight scale of kernel `index` of `spec`'s plan where it is an FP8
/// GEMM (its B has a scale), checked against what the sm90 kernel
/// computes: B stored [N, K], no gate, A's scale per tensor and B's per
/// tensor or per output channel. In an FP8 graph every kernel is keyed by
/// the graph's one dtype, E4M3, so any other kernel there (a 16-bit GEMM
/// after the FP8 one, a norm, an elementwise chain) is refused: it would
/// be generated reading its 16-bit operands as E4M3 bytes.
fn fp8_weight_scale(
    spec: &GraphSpec,
    index: usize,
    kernel: &FusedKernel,
) -> Result<Option<WeightScale>, CodegenError> {
    let graph = &spec.plan.graph;
    let refuse = |message: String| CodegenError::Fp8Unsupported {
        origin: spec.origin.clone(),
        graph: graph.name.clone(),
        kernel: index,
        composition: kernel.composition.name(),
        message,
    };
    let fp8_graph = spec.dtypes.iter().any(|d| d.is_fp8());
    let not_fp8_gemm = || {
        refuse(
            "an FP8 graph's kernels are generated for E4M3 alone, and this one is not a GEMM of scaled FP8 operands: \
             put the FP8 GEMMs and the rest of the model in separate graphs"
                .to_owned(),
        )
    };
    let Composition::Gemm(gemm) = &kernel.composition else {
        return if fp8_graph { Err(not_fp8_gemm()) } else { Ok(None) };
    };
    let scale_of = |role: Role| {
        kernel
            .operand(role)
            .and_then(|t| Some((t, graph.tensor(t).scale?)))
    };
    let Some((b, b_scale)) = scale_of(Role::B) else {
        return if fp8_graph { Err(not_fp8_gemm()) } else { Ok(None) };
    };
    let name = |t| &graph.tensor(t).name;
    if gemm.b_layout == WeightLayout::KN {
        return Err(refuse(format!(
            "the FP8 weight `{}` is stored [K, N], and 8-bit wgmma reads both operands K-major: declare it [N, K] and multiply by its transpose (`x @ w^T`), the layout FP8 checkpoints store",
            name(b)
        )));
    }
    if gemm.gate.is_some() {
        return Err(refuse(
            "FP8 gated GEMMs (gate and up weights interleaved) are not generated yet: write the gate and up projections as two GEMMs"
                .to_owned(),
        ));
    }
    if let Some((a, a_scale)) = scale_of(Role::A)
        && graph.tensor(a_scale).shape[..] != [Extent::Static(1)]
    {
        return Err(refuse(format!(
            "the scale `{}` of `{}` is not per tensor: the sm90 kernel takes one f32 scale for A ([1])",
            name(a_scale),
            name(a)
        )));
    }
    let n = graph.tensor(kernel.output).shape.last();
    match &graph.tensor(b_scale).shape[..] {
        [Extent::Static(1)] => Ok(Some(WeightScale::PerTensor)),
        [channels] if Some(channels) == n => Ok(Some(WeightScale::PerChannel)),
        _ => Err(refuse(format!(
            "the scale `{}` of `{}` is neither per tensor ([1]) nor per output channel ([N])",
            name(b_scale),
            name(b)
        ))),
    }
}

/// The distinct kernel a planned kernel with static `n` and `k` (`None`:
/// dynamic) becomes for one dtype and arch, and why a cached config was not
/// used, if it was not. An FP8 GEMM (dtype f8e4m3, its `weight_scale`
/// given) takes [`KernelConfig::fp8_sm90`]: nothing is tuned for FP8 yet.
#[allow(clippy::too_many_arguments)]
fn kernel_key(
    composition: &Composition,
    dtype: DType,
    weight_scale: Option<WeightScale>,
    arch: Arch,
    table: &TunedTable,
    cache: &TunedCache,
    n: Option<u64>,
    k: Option<u64>,
) -> Result<(KernelKey, Option<String>), CodegenError> {
    Ok(match composition {
        Composition::Gemm(gemm) => {
            let selected = if dtype.is_fp8() {
                select::Selected {
                    config: KernelConfig::fp8_sm90(),
                    origin: ConfigSource::fp8_sm90(),
                    tuned_for: None,
                    fitted_width: None,
                    warning: None,
                }
            } else {
                select::select_tuned(table, cache, arch, &KernelKind::of(gemm, dtype), n, k)?
            };
            let key = KernelKey::Gemm {
                prologue: gemm.prologue.map(|p| p.kind),
                layout: gemm.b_layout,
                gate: gemm.gate,
                steps: gemm.epilogue.clone(),
                dtype,
                weight_scale,
                arch,
                config: selected.config,
                origin: selected.origin,
                tuned_for: selected.tuned_for,
                fitted_width: selected.fitted_width,
            };
            (key, selected.warning)
        }
        Composition::Norm(norm) => (
            KernelKey::Norm {
                kind: norm.kind,
                dtype,
            },
            None,
        ),
        Composition::Elementwise(steps) => (
            KernelKey::Elementwise {
                steps: steps.clone(),
                dtype,
            },
            None,
        ),
    })
}

/// `<lib>_<composition>_<layout>_<dtype>_<archs>` for GEMMs (the archs keep
/// two configs of one composition apart; an FP8 GEMM whose weight is scaled
/// per output channel has `_per_channel` after its dtype), with `_n<N>_k<K>` for configs from
/// a tuned cache (which differ by shape) and `_w<width>` for a `small_m_alt` fitted to
/// N (`select::fitted_width`), `<lib>_<op>_<dtype>` otherwise.
fn symbol_for(lib_name: &str, key: &KernelKey, composition: &str, archs: &[Arch]) -> String {
    match key {
        KernelKey::Gemm {
            layout,
            dtype,
            weight_scale,
            tuned_for,
            fitted_width,
            ..
        } => {
            let archs: Vec<&str> = archs.iter().map(|a| a.name()).collect();
            let shape = match (tuned_for, fitted_width) {
                (Some((n, k)), _) => format!("_n{n}_k{k}"),
                (None, Some(width)) => format!("_w{width}"),
                (None, None) => String::new(),
            };
            let per_channel = if *weight_scale == Some(WeightScale::PerChannel) {
                "_per_channel"
            } else {
                ""
            };
            format!(
                "{lib_name}_{composition}_{}_{dtype}{per_channel}_{}{shape}",
                layout_name(*layout).to_ascii_lowercase(),
                archs.join("_")
            )
        }
        KernelKey::Norm { dtype, .. } | KernelKey::Elementwise { dtype, .. } => {
            format!("{lib_name}_{composition}_{dtype}")
        }
    }
}

fn arch_list(archs: &[Arch]) -> String {
    archs.iter().map(|a| a.name()).collect::<Vec<_>>().join(", ")
}

/// A one-line description for comments: `gemm_bias_gelu (B [N, K]), f16`.
fn describe_key(key: &KernelKey) -> String {
    match key {
        KernelKey::Gemm {
            prologue,
            layout,
            gate,
            steps,
            dtype,
            weight_scale,
            ..
        } => {
            let name = crate::fuse::pattern::composed_name(*prologue, *gate, steps);
            let layout = match layout {
                WeightLayout::KN => "B [K, N]",
                WeightLayout::NK => "B [N, K]",
            };
            let scale = match weight_scale {
                None => "",
                Some(WeightScale::PerTensor) => " (weight scaled per tensor)",
                Some(WeightScale::PerChannel) => " (weight scaled per channel)",
            };
            format!("{name} ({layout}), {dtype}{scale}")
        }
        KernelKey::Norm { kind, dtype } => format!("{}, {dtype}", kind.name()),
        KernelKey::Elementwise { steps, dtype } => {
            format!("{}, {dtype}", crate::fuse::pattern::elementwise_name(steps))
        }
    }
}

fn render_unit(
    registry: &handlebars::Handlebars<'_>,
    symbol: &str,
    key: &KernelKey,
    composition: &str,
    archs: &[Arch],
    used_by: &[String],
) -> Result<RenderedUnit, CodegenError> {
    let common = |dtype: DType| {
        json!({
            "symbol": symbol,
            "composition": composition,
            "dtype": dtype.name(),
            "element": element_type(dtype),
            "archs": arch_list(archs),
            "used_by": used_by.join(", "),
        })
    };
    let (template, params, context) = match key {
        KernelKey::Gemm {
            prologue,
            layout,
            gate,
            steps,
            dtype,
            weight_scale,
            arch,
            config,
            origin,
            tuned_for,
            fitted_width: _,
        } => {
            let mut context = common(*dtype);
            let target = arch.target();
            let (mainloop_type, header) = (target.mainloop_type, target.mainloop_header);
            // A norm prologue's unit also has the folded form (abi.h).
            let folded = prologue.map(|kind| {
                json!({
                    "prologue": format!("fusion::FoldedNorm<fusion::NormKind::{}>", norm_type(kind)),
                    "kind": format!("fusion::NormKind::{}", norm_type(kind)),
                })
            });
            let prologue = match prologue {
                None => "fusion::NoPrologue".to_owned(),
                Some(kind) => format!("fusion::NormPrologue<fusion::NormKind::{}>", norm_type(*kind)),
            };
            let small = config.small().map(|(tile, max_m)| {
                let alt = config
                    .small_m_alt
                    .map(|alt| json!({ "tile": alt.cpp_type(), "tile_doc": alt.summary() }));
                json!({
                    "tile": tile.cpp_type(),
                    "tile_doc": tile.summary(),
                    "max_m": max_m,
                    "alt": alt.unwrap_or(serde_json::Value::Bool(false)),
                })
            });
            // Per tile config: the alias the template declares, its name in
            // the tuned tables, its K step and stages (which not every
            // mainloop's template takes, so the unit checks them against the
            // template's own), and the messages of the checks that it is a
            // tile the mainloop takes (`tile_valid`, whose parts the headers
            // assert one by one) and that its shared memory fits the
            // mainloop's limit.
            let smem_limit = format!("fusion::{}::kSmemPerBlock", arch.name());
            // A tile per M bucket (the model's choice): each tile other
            // than the large one once, as `MTile<i>`, and the Ms each serves.
            let mut by_m_aliases: Vec<(String, TileConfig)> = Vec::new();
            let mut by_m = Vec::new();
            for (max_m, tile) in config.tiers_by_m() {
                let alias = if tile == config.large {
                    "LargeTile".to_owned()
                } else if let Some((alias, _)) = by_m_aliases.iter().find(|(_, t)| *t == tile) {
                    alias.clone()
                } else {
                    let alias = format!("MTile{}", by_m_aliases.len());
                    by_m_aliases.push((alias.clone(), tile));
                    alias
                };
                if let Some(max_m) = max_m {
                    by_m.push(json!({ "max_m": max_m, "alias": alias }));
                }
            }
            let tiles: Vec<_> = [
                ("LargeTile".to_owned(), "large", Some(config.large)),
                ("LargeAltTile".to_owned(), "large_alt", config.large_alt),
                ("SmallTile".to_owned(), "small_m", config.small().map(|(tile, _)| tile)),
                ("SmallAltTile".to_owned(), "small_m_alt", config.small().and(config.small_m_alt)),
                ("FewMTile".to_owned(), "few_m", config.few_m),
            ]
            .into_iter()
            .chain(by_m_aliases.iter().map(|(alias, tile)| (alias.clone(), "by_m", Some(*tile))))
            .filter_map(|(alias, which, tile)| {
                let tile = tile?;
                // In quotes rather than backticks, which nvcc prints as `?`.
                let fits = |what: String| {
                    let message = format!(
                        "tile config from {origin} for `{composition}` ({which}) does not fit {}: {} {what}",
                        arch_list(archs),
                        tile.summary(),
                    );
                    c_string(&message.replace('`', "'"))
                };
                Some(json!({
                    "alias": alias,
                    "which": which,
                    "bk": tile.bk,
                    "stages": tile.stages,
                    "rules_message": fits(format!(
                        "is not a tile the {} mainloop takes: a rule of its TileConfig fails (an error above names it), or bk or stages differ from the template's own",
                        arch.name()
                    )),
                    "smem_message": fits(format!(
                        "needs more shared memory per block than {} allows",
                        arch_list(archs)
                    )),
                    "epilogue_message": fits(format!(
                        "leaves too little shared memory to bring its epilogue's [M, N] source tile (residual, mul) in whole beside the stages: use fewer stages (see the tuned table's `{}`)",
                        select::SOURCE_TILE_DEFAULT
                    )),
                }))
            })
            .collect();
            // The decode kernel ahead of the tiles, for m <= its threshold,
            // which the unit checks against the kernel's own row limit.
            let decode = config.decode_for(*layout).map(|max_m| {
                let message = format!(
                    "decode_max_m {max_m} from {origin} for `{composition}` is more rows than the decode kernel takes (fusion::kDecodeMaxM)"
                );
                json!({ "max_m": max_m, "message": c_string(&message.replace('`', "'")) })
            });
            let extra = json!({
                "tiles": tiles,
                "decode": decode.unwrap_or(serde_json::Value::Bool(false)),
                "tile_valid": format!("fusion::{}::tile_valid", arch.name()),
                "smem_limit": smem_limit,
                "mainloop": mainloop_type,
                "mainloop_header": header,
                "layout": layout_name(*layout),
                "layout_doc": match layout { WeightLayout::KN => "[K, N]", WeightLayout::NK => "[N, K]" },
                "prologue": prologue,
                "chain": chain_type(*gate, steps, *weight_scale),
                // What C holds: the operands' type, or bf16 for FP8 ones.
                "output": if dtype.is_fp8() { "fusion::OutputOf<Element>" } else { "Element" },
                "scaled": weight_scale.is_some(),
                "gated": gate.is_some(),
                "fold_weights": folded.is_some() || gate.is_some(),
                "large_tile": config.large.cpp_type(),
                "large_tile_doc": config.large.summary(),
                "large_alt": config.large_alt.map_or(serde_json::Value::Bool(false), |alt| {
                    json!({ "tile": alt.cpp_type(), "tile_doc": alt.summary() })
                }),
                "small": small.unwrap_or(serde_json::Value::Bool(false)),
                "few_m": config.few_m.map_or(serde_json::Value::Bool(false), |tile| {
                    json!({ "tile": tile.cpp_type(), "tile_doc": tile.summary() })
                }),
                "least_loads": select::tier_choice(*arch, tuned_for.is_some()) == TierChoice::LeastLoads
                    && (config.large_alt.is_some() || config.small().is_some()),
                "by_m_tiles": by_m_aliases
                    .iter()
                    .map(|(alias, tile)| json!({ "alias": alias, "tile": tile.cpp_type(), "tile_doc": tile.summary() }))
                    .collect::<Vec<_>>(),
                "by_m": by_m,
                "folded": folded.unwrap_or(serde_json::Value::Bool(false)),
            });
            merge(&mut context, extra);
            ("gemm.cu", ParamsKind::Gemm, context)
        }
        KernelKey::Norm { kind, dtype } => {
            let mut context = common(*dtype);
            merge(&mut context, json!({ "kind": norm_type(*kind) }));
            ("norm.cu", ParamsKind::Norm, context)
        }
        KernelKey::Elementwise { steps, dtype } => {
            let mut context = common(*dtype);
            let steps: Vec<&str> = steps.iter().map(|s| s.cuda_type()).collect();
            merge(&mut context, json!({ "steps": steps.join(", ") }));
            ("elementwise.cu", ParamsKind::Elementwise, context)
        }
    };
    Ok(RenderedUnit {
        symbol: symbol.to_owned(),
        key: key.clone(),
        params,
        archs: archs.to_vec(),
        used_by: used_by.to_vec(),
        source: render_template(registry, template, &context)?,
    })
}

/// The unit's epilogue chain type (kernels/include/fusion/epilogue.cuh):
/// `fusion::EpilogueChain<fusion::Bias, fusion::Gelu>`, or for a gated GEMM
/// `fusion::GatedChain<fusion::Silu, fusion::EpilogueChain<>>`. An FP8
/// GEMM's starts with its scales, `fusion::Dequantize<per channel>`.
fn chain_type(gate: Option<Activation>, steps: &[EpilogueStep], weight_scale: Option<WeightScale>) -> String {
    let dequantize = weight_scale.map(|scale| match scale {
        WeightScale::PerTensor => "fusion::Dequantize<false>",
        WeightScale::PerChannel => "fusion::Dequantize<true>",
    });
    let steps: Vec<&str> = dequantize
        .into_iter()
        .chain(steps.iter().map(|s| s.cuda_type()))
        .collect();
    let chain = format!("fusion::EpilogueChain<{}>", steps.join(", "));
    match gate {
        Some(activation) => format!(
            "fusion::GatedChain<{}, {chain}>",
            EpilogueStep::Activation(activation).cuda_type()
        ),
        None => chain,
    }
}

/// `text` as the inside of a C string literal.
fn c_string(text: &str) -> String {
    let mut out = String::new();
    for byte in text.bytes() {
        match byte {
            b'"' | b'\\' => {
                out.push('\\');
                out.push(byte as char);
            }
            b' '..=b'~' => out.push(byte as char),
            // A hex escape runs on over hex digits: end the literal after it
            // (adjacent literals concatenate).
            _ => out.push_str(&format!("\\x{byte:02x}\"\"")),
        }
    }
    out
}

fn merge(into: &mut serde_json::Value, from: serde_json::Value) {
    if let (Some(into), serde_json::Value::Object(from)) = (into.as_object_mut(), from) {
        into.extend(from);
    }
}

fn render_template(
    registry: &handlebars::Handlebars<'_>,
    template: &str,
    context: &serde_json::Value,
) -> Result<String, CodegenError> {
    registry
        .render(template, context)
        .map_err(|e| CodegenError::Template {
            template: format!("kernels/{template}.hbs"),
            message: e.to_string(),
        })
}

#[cfg(test)]
mod tests;
