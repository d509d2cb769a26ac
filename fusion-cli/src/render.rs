//! `fusion render`: the GEMM units of a candidate list (graph, dtypes,
//! layouts, archs, tile config; see [`fusion_compiler::codegen::candidates`]),
//! rendered as a build renders them, written into one folder that builds
//! with nvcc alone: the units, the CUDA headers, the kernel self-test
//! harness (`fusion-compiler/kernels/selftest/harness.cu`), the table of units it calls
//! (`units.inc`) and a Makefile whose gencode flags are each unit's target's.
//! The folder can be copied to a GPU machine with no Rust and built there
//! with `make -j`. With `--fitted-corpus`, the list is made from a layer
//! corpus: each layer's GEMM as a build with its N static renders it, where
//! that fits a tile to N (`fusion_compiler::select::fitted_width`), beside
//! the shipped unit, for the self-test to time the two at each layer.

use crate::cli::CliError;
use fusion_compiler::arch::RunsOn;
use fusion_compiler::codegen::candidates::{self, CandidateList, CandidateUnit};
use fusion_compiler::codegen::templates;
use fusion_compiler::fuse::{self, NormKind};
use fusion_compiler::ir::{Activation, DType, WeightLayout};
use fusion_compiler::select::Arch;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;

/// Renders the units of the list in `list_file` (graphs read from
/// `graphs_dir`) and writes the folder `out_dir`; says what it wrote on `out`.
pub fn render(
    list_file: &Path,
    graphs_dir: &Path,
    out_dir: &Path,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let (file, text) = read_input(list_file, "the candidate list")?;
    let list = CandidateList::parse(&file, &text).map_err(CliError::Message)?;
    render_list(&file, &list, graphs_dir, out_dir, out).map(|_| ())
}

/// The folder of [`render`] for a corpus's layers fitted to N, and
/// `fitted.txt` in it: a line `M,N,K shipped fitted kernel` for each layer
/// and token count in `tokens` whose sm90 f16 GEMM a build with N static
/// fits ([`fitted_list`]).
pub fn render_fitted_corpus(
    corpus_file: &Path,
    tokens: &[u64],
    graphs_dir: &Path,
    out_dir: &Path,
    out: &mut dyn Write,
) -> Result<(), CliError> {
    let (file, text) = read_input(corpus_file, "the corpus")?;
    let corpus = fusion_compiler::corpus::Corpus::parse(&text)
        .map_err(|e| CliError::Message(format!("{file}: {e}")))?;
    let load = |name: &str| {
        let path = graphs_dir.join(format!("{name}.toml"));
        fusion_compiler::load_toml_graph(&path).map(fuse::plan)
    };
    let (list, layers) = fitted_list(&corpus, load).map_err(CliError::Message)?;
    let list_name = format!("{file}, fitted to N");
    let units = render_list(&list_name, &list, graphs_dir, out_dir, out)?;
    let symbol = |candidate: usize| {
        units
            .iter()
            .find(|u| u.candidate == candidate)
            .map(|u| u.unit.symbol.clone())
            .expect("every candidate renders one unit")
    };
    let mut lines = String::new();
    for layer in &layers {
        for m in tokens {
            let _ = writeln!(
                lines,
                "{m},{},{} {} {} {}",
                layer.n,
                layer.k,
                symbol(layer.shipped),
                symbol(layer.fitted),
                layer.kernel
            );
        }
    }
    let path = out_dir.join("fitted.txt");
    std::fs::write(&path, lines)
        .map_err(|e| CliError::Message(format!("cannot write {}: {e}", path.display())))?;
    writeln!(
        out,
        "wrote {} ({} layers fitted to N)",
        path.display(),
        layers.len()
    )
    .map_err(|e| CliError::Message(format!("cannot write to standard output: {e}")))
}

/// `path` as it is named in messages, and its text; an error naming it as
/// `what` where it cannot be read.
fn read_input(path: &Path, what: &str) -> Result<(String, String), CliError> {
    let file = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| CliError::Message(format!("cannot read {what} {file}: {e}")))?;
    Ok((file, text))
}

/// A corpus layer whose GEMM a build with N static fits to N: the
/// candidates of its shipped and its fitted unit.
#[derive(Clone, Debug, PartialEq)]
pub struct FittedLayer {
    /// The built-in graph that runs it.
    pub kernel: String,
    /// Its N.
    pub n: u64,
    /// Its K.
    pub k: u64,
    /// The candidate of the shipped unit (the graph's, N dynamic).
    pub shipped: usize,
    /// The candidate of the unit a build with N static renders.
    pub fitted: usize,
}

/// The candidate list of [`render_fitted_corpus`]: for each graph of the
/// corpus, its shipped sm90 f16 unit, and for each layer whose static
/// selection (`select_tuned` with N and K static and no cache) fits a tile
/// to N, that config, once per graph and config; with the layers.
pub fn fitted_list(
    corpus: &fusion_compiler::corpus::Corpus,
    mut load_plan: impl FnMut(&str) -> Result<fuse::Plan, String>,
) -> Result<(CandidateList, Vec<FittedLayer>), String> {
    use fusion_compiler::fuse::Composition;
    use fusion_compiler::select::{KernelKind, TunedCache, TunedTable, select_tuned};
    let table = TunedTable::shipped(Arch::Sm90).map_err(|e| e.to_string())?;
    let mut candidates: Vec<serde_json::Value> = Vec::new();
    let mut index_of: Vec<(String, Option<String>)> = Vec::new();
    let mut layers = Vec::new();
    let mut candidate = |graph: &str, config: Option<serde_json::Value>| {
        let key = (graph.to_owned(), config.as_ref().map(ToString::to_string));
        if let Some(at) = index_of.iter().position(|k| *k == key) {
            return at;
        }
        let mut entry = serde_json::json!({
            "graph": graph, "dtypes": ["f16"], "layouts": ["nk"], "archs": ["sm90"]
        });
        if let Some(config) = config {
            entry["config"] = config;
        }
        candidates.push(entry);
        index_of.push(key);
        candidates.len() - 1
    };
    for shape in corpus.shapes() {
        let plan = load_plan(&shape.kernel)?;
        let Some(gemm) = plan.kernels.iter().find_map(|k| match &k.composition {
            Composition::Gemm(gemm) => Some(gemm),
            _ => None,
        }) else {
            continue;
        };
        let kind = KernelKind::of(gemm, DType::F16);
        let selected = select_tuned(
            &table,
            &TunedCache::default(),
            Arch::Sm90,
            &kind,
            Some(shape.n),
            Some(shape.k),
        )
        .map_err(|e| e.to_string())?;
        if selected.fitted_width.is_none() {
            continue;
        }
        let config = serde_json::to_value(selected.config).map_err(|e| e.to_string())?;
        let shipped = candidate(&shape.kernel, None);
        let fitted = candidate(&shape.kernel, Some(config));
        layers.push(FittedLayer {
            kernel: shape.kernel.clone(),
            n: shape.n,
            k: shape.k,
            shipped,
            fitted,
        });
    }
    let text = serde_json::json!({
        "note": "every corpus GEMM layer a build with N static fits to N, and its shipped unit",
        "candidates": candidates,
    })
    .to_string();
    Ok((CandidateList::parse("the corpus's fitted layers", &text)?, layers))
}

/// Renders `list` (named `file` in messages) into `out_dir` as [`render`]
/// does, and returns its units.
fn render_list(
    file: &str,
    list: &CandidateList,
    graphs_dir: &Path,
    out_dir: &Path,
    out: &mut dyn Write,
) -> Result<Vec<CandidateUnit>, CliError> {
    let units = candidates::render_candidates(file, list, |name| {
        let path = graphs_dir.join(format!("{name}.toml"));
        fusion_compiler::load_toml_graph(&path).map(fuse::plan)
    })
    .map_err(CliError::Message)?;
    let write = |relative: &str, contents: &str| -> Result<(), CliError> {
        let path = out_dir.join(relative);
        // Unchanged files keep their timestamps, so make rebuilds only what changed.
        if std::fs::read(&path).is_ok_and(|old| old == contents.as_bytes()) {
            return Ok(());
        }
        std::fs::create_dir_all(path.parent().unwrap_or(out_dir))
            .and_then(|()| std::fs::write(&path, contents))
            .map_err(|e| CliError::Message(format!("cannot write {}: {e}", path.display())))
    };
    for unit in &units {
        write(&format!("units/{}.cu", unit.unit.symbol), &unit.unit.source)?;
    }
    for (name, contents) in templates::SELFTEST_HARNESS {
        write(name, contents)?;
    }
    write("units.inc", &unit_table(file, &units))?;
    write("Makefile", &makefile(file, &units))?;
    templates::write_headers(&out_dir.join("include")).map_err(|e| {
        CliError::Message(format!(
            "cannot write the headers under {}: {e}",
            out_dir.display()
        ))
    })?;
    writeln!(
        out,
        "wrote {} units of {} candidates to {}; build with `make -C {} -j` (nvcc, cuBLASLt), then run {}/selftest",
        units.len(),
        list.candidates.len(),
        out_dir.display(),
        out_dir.display(),
        out_dir.display()
    )
    .map_err(|e| CliError::Message(format!("cannot write to standard output: {e}")))?;
    Ok(units)
}

/// The op table's activations for harness.cu's reference, each by its name
/// and its epilogue step's CUDA type, as an X-macro:
/// `#define FUSION_ACTIVATIONS(X) X("gelu", fusion::Gelu) ...`.
fn activation_list() -> String {
    let mut text =
        "// The op table's activations: (name, epilogue step type).\n#define FUSION_ACTIVATIONS(X)"
            .to_owned();
    for activation in Activation::all() {
        let _ = write!(
            text,
            " \\\n  X(\"{}\", {})",
            activation.name(),
            activation.cuda_type()
        );
    }
    text += "\n\n";
    text
}

/// `units.inc`: each unit's launcher functions and its row of harness.cu's
/// `Unit` table.
fn unit_table(file: &str, units: &[CandidateUnit]) -> String {
    let mut text =
        format!("// Generated by `fusion render` from {file}: the units harness.cu calls. Do not edit.\n");
    text += &activation_list();
    text += "extern \"C\" {\n";
    for u in units {
        let s = &u.unit.symbol;
        let _ = writeln!(text, "int {s}(const fusion_gemm_params* p, void* stream);");
        let _ = writeln!(
            text,
            "int {s}_workspace_bytes(const fusion_gemm_params* p, void* stream, uint64_t* bytes);"
        );
        let _ = writeln!(
            text,
            "int {s}_resources(fusion_tile_resources* out, int capacity);"
        );
    }
    text += "}\n\n";
    // Each unit's epilogue steps by name; a unit without any points at none.
    for u in units.iter().filter(|u| !u.composition.epilogue.is_empty()) {
        let steps: Vec<String> = u
            .composition
            .epilogue
            .iter()
            .map(|step| format!("\"{}\"", step.name()))
            .collect();
        let _ = writeln!(
            text,
            "static const char* const {}_steps[] = {{{}}};",
            u.unit.symbol,
            steps.join(", ")
        );
    }
    text += "\nstatic const Unit kUnits[] = {\n";
    for u in units {
        let s = &u.unit.symbol;
        let (major, minor, exactly) = match u.arch.compute_capabilities() {
            RunsOn::Exactly(major, minor) => (major, minor, true),
            RunsOn::AtLeast(major, minor) => (major, minor, false),
        };
        let dtype = match u.dtype {
            DType::BF16 => "BF16",
            _ => "F16",
        };
        let layout = match u.composition.b_layout {
            WeightLayout::KN => "KN",
            WeightLayout::NK => "NK",
        };
        let (norm, eps) = match u.composition.prologue {
            None => ("None", 0.0),
            Some(n) => (
                match n.kind {
                    NormKind::LayerNorm => "LayerNorm",
                    NormKind::RmsNorm => "RmsNorm",
                },
                n.eps,
            ),
        };
        let steps = match u.composition.epilogue.len() {
            0 => "nullptr".to_owned(),
            _ => format!("{s}_steps"),
        };
        let _ = writeln!(
            text,
            "    {{\"{s}\", \"{}\", {}, \"{}\", {{{major}, {minor}, {exactly}}}, DType::{dtype}, Layout::{layout}, \
             Norm::{norm}, {eps:e}f, {steps}, {}, \"{}\", {s}, {s}_workspace_bytes, {s}_resources}},",
            u.composition.name(),
            u.candidate,
            u.arch.name(),
            u.composition.epilogue.len(),
            tile_summary(u),
        );
    }
    text += "};\n";
    text
}

/// The large tile, the decode kernel's threshold when it has one, the
/// few-M tile and the small-M ones when there are.
fn tile_summary(u: &CandidateUnit) -> String {
    let mut summary = u.config.large.summary();
    if let Some(max_m) = u.config.decode_for(u.composition.b_layout) {
        let _ = write!(summary, "; m <= {max_m}: decode");
    }
    if let Some(few) = u.config.few_m {
        let _ = write!(summary, "; few-M: {}", few.summary());
    }
    if let Some((small, max_m)) = u.config.small() {
        let _ = write!(summary, "; m <= {max_m}: {}", small.summary());
        if let Some(alt) = u.config.small_m_alt {
            let _ = write!(summary, " or {}", alt.summary());
        }
    }
    summary
}

/// The Makefile: each unit compiled with its target's gencode flags (ptxas's
/// report in `obj/<symbol>.log`), the harness with those of every target in
/// the list, so its reference kernels run wherever a unit does.
fn makefile(file: &str, units: &[CandidateUnit]) -> String {
    let mut archs: Vec<Arch> = units.iter().map(|u| u.arch).collect();
    archs.sort();
    archs.dedup();
    let harness_gencode: Vec<String> = archs
        .iter()
        .map(|a| format!("'{}'", a.target().gencode))
        .collect();
    let objects: Vec<String> = units.iter().map(|u| format!("obj/{}.o", u.unit.symbol)).collect();
    let mut text = format!(
        "# Generated by `fusion render` from {file}: do not edit.\n\
         # `make -j` builds ./selftest with nvcc (NVCC, default nvcc on PATH).\n\
         # UNIT_FLAGS adds flags to every unit (e.g. -DFUSION_SM90_TRACE);\n\
         # CUBLAS_FLAGS and LDFLAGS say where cuBLASLt is when nvcc does not know.\n\
         NVCC ?= nvcc\n\
         NVCCFLAGS ?= -O3 -std=c++17 -lineinfo\n\
         UNIT_FLAGS ?=\n\
         CUBLAS_FLAGS ?=\n\
         LDFLAGS ?=\n\
         INCLUDES = -I include -I .\n\
         HEADERS = $(wildcard include/fusion/*.h include/fusion/*.cuh include/fusion/*/*.cuh)\n\
         HARNESS_GENCODE = {}\n\
         OBJECTS = {}\n\n\
         selftest: obj/harness.o $(OBJECTS)\n\
         \t$(NVCC) $(HARNESS_GENCODE) $^ $(LDFLAGS) -lcublasLt -o $@\n\n\
         obj/harness.o: harness.cu harness.cuh units.inc $(HEADERS)\n\
         \t@mkdir -p obj\n\
         \t$(NVCC) $(NVCCFLAGS) $(CUBLAS_FLAGS) $(INCLUDES) $(HARNESS_GENCODE) -c $< -o $@\n",
        harness_gencode.join(" "),
        objects.join(" \\\n  "),
    );
    for u in units {
        let s = &u.unit.symbol;
        let _ = write!(
            text,
            "\nobj/{s}.o: units/{s}.cu $(HEADERS)\n\
             \t@mkdir -p obj\n\
             \t$(NVCC) $(NVCCFLAGS) $(UNIT_FLAGS) $(INCLUDES) '{}' -Xptxas -v -c $< -o $@ 2> obj/{s}.log \
             || {{ cat obj/{s}.log; exit 1; }}\n",
            u.arch.target().gencode
        );
    }
    text += "\nclean:\n\trm -rf obj selftest\n\n.PHONY: clean\n";
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scratch(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("fusion-render-{}-{name}", std::process::id()))
    }

    #[test]
    fn the_folder_has_units_their_table_the_harness_and_a_makefile() {
        let dir = scratch("out");
        let list = scratch("list.json");
        std::fs::write(
            &list,
            r#"{ "candidates": [
                 { "graph": "layernorm_gemm", "dtypes": ["bf16"], "archs": ["sm80", "sm90"] },
                 { "graph": "gemm_bias_gelu", "dtypes": ["f16"], "layouts": ["kn"], "archs": ["sm75"] } ] }"#,
        )
        .unwrap();
        let mut said = Vec::new();
        render(&list, &fusion::testing::graphs_dir(), &dir, &mut said).unwrap();
        let said = String::from_utf8(said).unwrap();
        assert!(said.starts_with("wrote 3 units of 2 candidates"), "{said}");

        let table = std::fs::read_to_string(dir.join("units.inc")).unwrap();
        let sm90 = "cand0_layernorm_gemm_nk_bf16_sm90";
        assert!(table.contains(&format!(
            "int {sm90}_resources(fusion_tile_resources* out, int capacity);"
        )));
        assert!(
            table.contains(&format!(
                "{{\"{sm90}\", \"layernorm_gemm\", 0, \"sm90\", {{9, 0, true}}, DType::BF16, Layout::NK, Norm::LayerNorm, 1e-5f, nullptr, 0,"
            )),
            "{table}"
        );
        // Every activation of the op table, for the reference.
        assert!(
            table.contains("#define FUSION_ACTIVATIONS(X) \\\n  X(\"gelu\", fusion::Gelu) \\\n"),
            "{table}"
        );
        assert!(
            table.contains("  X(\"gelu_quick\", fusion::GeluQuick)\n"),
            "{table}"
        );
        let sm75 = "cand1_gemm_bias_gelu_kn_f16_sm75";
        assert!(
            table.contains(&format!(
                "static const char* const {sm75}_steps[] = {{\"bias\", \"gelu\"}};"
            )),
            "{table}"
        );
        assert!(
            table.contains(&format!(
                "\"sm75\", {{7, 5, false}}, DType::F16, Layout::KN, Norm::None, 0e0f, {sm75}_steps, 2,"
            )),
            "{table}"
        );

        let makefile = std::fs::read_to_string(dir.join("Makefile")).unwrap();
        // Each unit with its own target's flags; the harness with all of them.
        assert!(makefile.contains(&format!(
            "'{}' -Xptxas -v -c $< -o $@ 2> obj/{sm90}.log",
            Arch::Sm90.target().gencode
        )));
        let harness_line = makefile
            .lines()
            .find(|l| l.starts_with("HARNESS_GENCODE = "))
            .unwrap();
        for arch in Arch::ALL {
            assert!(harness_line.contains(arch.target().gencode), "{harness_line}");
        }
        assert!(dir.join(format!("units/{sm90}.cu")).exists());
        assert!(dir.join("include/fusion/abi.h").exists());
        assert!(dir.join("harness.cu").exists());
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::remove_file(&list).unwrap();
    }

    /// Over the layer corpus: each line of fitted.txt names a shipped unit
    /// with the table's 128x128 small-M alternative and a fitted one whose
    /// alternative is 128 x fitted_width(N), at each token count asked for;
    /// a layer whose N the shipped width fits already (4096) has none.
    #[test]
    fn a_fitted_corpus_pairs_each_fitted_layer_with_its_shipped_unit() {
        let dir = scratch("fitted");
        let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benchmarks/corpus.toml");
        let mut said = Vec::new();
        render_fitted_corpus(
            &corpus,
            &[512, 1000],
            &fusion::testing::graphs_dir(),
            &dir,
            &mut said,
        )
        .unwrap();
        let said = String::from_utf8(said).unwrap();
        assert!(said.contains("layers fitted to N)"), "{said}");
        let lines = std::fs::read_to_string(dir.join("fitted.txt")).unwrap();
        let lines: Vec<Vec<&str>> = lines.lines().map(|l| l.split(' ').collect()).collect();
        assert!(lines.len() >= 20, "{} lines", lines.len());
        let alt = |symbol: &str| {
            let source = std::fs::read_to_string(dir.join(format!("units/{symbol}.cu"))).unwrap();
            source
                .lines()
                .find(|l| l.starts_with("using SmallAltTile = "))
                .unwrap_or_else(|| panic!("{symbol} has no small-M alternative"))
                .to_owned()
        };
        for (pair, line) in lines.chunks(2).zip(lines.iter().step_by(2)) {
            let shape: Vec<u64> = line[0].split(',').map(|v| v.parse().unwrap()).collect();
            assert_eq!(
                pair.iter()
                    .map(|l| l[0].split(',').next().unwrap())
                    .collect::<Vec<_>>(),
                ["512", "1000"]
            );
            assert_ne!(shape[1], 4096, "{line:?}");
            assert!(alt(line[1]).contains("TileConfig<128, 128, 6,"), "{line:?}");
            let width = fusion_compiler::select::fitted_width(shape[1]);
            let fitted = format!(
                "TileConfig<128, {width}, {},",
                fusion_compiler::select::fitted_stages(width)
            );
            assert!(alt(line[2]).contains(&fitted), "{line:?}: {}", alt(line[2]));
            assert_eq!(line[1].split('_').nth(1), line[2].split('_').nth(1));
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_list_is_an_error_that_names_it() {
        let err = render(
            Path::new("no/such/list.json"),
            &fusion::testing::graphs_dir(),
            &scratch("none"),
            &mut Vec::new(),
        )
        .unwrap_err();
        assert!(
            matches!(&err, CliError::Message(m) if m.starts_with("cannot read the candidate list no/such/list.json")),
            "{err}"
        );
    }
}
