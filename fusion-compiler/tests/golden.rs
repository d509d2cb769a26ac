//! Golden files of generated code: for four shipped graphs, the CUDA units
//! and the Rust wrappers that codegen renders, compared byte for byte with
//! the files checked in under `tests/golden/<graph>/`. A change to the
//! templates, headers' callers, tile tables or wrappers shows up here as a
//! diff to review. After an intended change, rewrite them with
//! `FUSION_BLESS=1 cargo test -p fusion-compiler --test golden` and commit the
//! result. No nvcc is needed: nothing is compiled.

use fusion_compiler::codegen::{self, GraphSpec, wrappers};
use fusion_compiler::ir::DType;
use fusion_compiler::select::guard::Guard;
use fusion_compiler::select::model::Calibration;
use fusion_compiler::select::{Arch, TunedCache};
use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

/// Four different paths: several kernels with a gated GEMM (`swiglu_ffn`),
/// a norm prologue (`layernorm_gemm`), one GEMM with bias and activation
/// (`gemm_bias_gelu`), and a gated GEMM with a norm to fold and a step after
/// it (`layernorm_gemm_silu_glu_residual`).
const GRAPHS: &[&str] = &[
    "swiglu_ffn",
    "layernorm_gemm",
    "gemm_bias_gelu",
    "layernorm_gemm_silu_glu_residual",
];

/// As the root crate builds them by default (features `sm80`, `sm90`; f16
/// and bf16), so the wrappers are the generic ones that ship.
const ARCHS: &[Arch] = &[Arch::Sm80, Arch::Sm90];
const DTYPES: &[DType] = &[DType::F16, DType::BF16];

/// Stands in for `OUT_DIR/fusion_ffi.rs`, which the build passes as an
/// absolute path: golden files hold nothing machine-specific.
const FFI_RS: &str = "fusion_ffi.rs";

/// A shipped graph (`graphs/<graph>.toml`) as a build hands it to codegen.
fn spec(graph: &str) -> GraphSpec {
    spec_at(&format!("graphs/{graph}.toml"), DTYPES)
}

/// The graph of `origin` (a path from the repository's root) compiled for
/// `dtypes`.
fn spec_at(origin: &str, dtypes: &[DType]) -> GraphSpec {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let ir = fusion_compiler::load_toml_graph(&root.join(origin)).unwrap_or_else(|e| panic!("{e}"));
    GraphSpec {
        plan: fusion_compiler::fuse::plan(ir),
        dtypes: dtypes.to_vec(),
        origin: origin.to_owned(),
        fingerprint: None,
        declaration: String::new(),
    }
}

/// What codegen renders for one graph: file name → contents.
fn render(graph: &str) -> BTreeMap<String, String> {
    let library =
        codegen::render("fusion_kernels", ARCHS, &[spec(graph)]).unwrap_or_else(|e| panic!("{graph}: {e}"));
    files_of(&library)
}

/// A library's units and wrappers: file name → contents.
fn files_of(library: &codegen::KernelLibrary) -> BTreeMap<String, String> {
    let mut files: BTreeMap<String, String> = library
        .units
        .iter()
        .map(|unit| (format!("{}.cu", unit.symbol), unit.source.clone()))
        .collect();
    files.insert("wrappers.rs".into(), wrappers::generate(library, true, FFI_RS));
    files
}

/// Whether this run rewrites the golden files (`FUSION_BLESS=1`).
fn blessing() -> bool {
    std::env::var_os("FUSION_BLESS").is_some_and(|v| v == "1")
}

/// Compares `rendered` with the files of `tests/golden/<name>`, or, when
/// [`blessing`], rewrites them with it.
fn check_golden(name: &str, rendered: &BTreeMap<String, String>) {
    let dir = golden_dir(name);
    if blessing() {
        bless(&dir, rendered);
        return;
    }
    let problems = mismatches(&dir, rendered);
    assert!(
        problems.is_empty(),
        "generated code differs from tests/golden/{name}:\n{}\n\nIf the change is intended, rewrite it with \
         `FUSION_BLESS=1 cargo test -p fusion-compiler --test golden`.",
        problems.join("\n")
    );
}

fn golden_dir(graph: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(graph)
}

/// The first line where `expected` and `actual` differ, both sides shown.
fn first_difference(expected: &str, actual: &str) -> String {
    let (mut expected_lines, mut actual_lines) = (expected.lines(), actual.lines());
    for line in 1.. {
        match (expected_lines.next(), actual_lines.next()) {
            (Some(e), Some(a)) if e == a => continue,
            (None, None) => break,
            (e, a) => {
                return format!(
                    "first difference at line {line}:\n  golden:   {}\n  rendered: {}",
                    e.unwrap_or("(end of file)"),
                    a.unwrap_or("(end of file)")
                );
            }
        }
    }
    "the files differ only in line endings or a final newline".into()
}

/// Each mismatch between `rendered` and the files in `dir`, in words.
fn mismatches(dir: &Path, rendered: &BTreeMap<String, String>) -> Vec<String> {
    let mut problems = Vec::new();
    for (name, actual) in rendered {
        match fs::read_to_string(dir.join(name)) {
            Ok(expected) if expected == *actual => {}
            Ok(expected) => problems.push(format!("{name}: {}", first_difference(&expected, actual))),
            Err(_) => problems.push(format!("{name}: rendered, but there is no golden file")),
        }
    }
    for name in golden_files(dir) {
        if !rendered.contains_key(&name) {
            problems.push(format!("{name}: golden file, but no longer rendered"));
        }
    }
    problems
}

fn golden_files(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .map(|entry| {
            entry
                .expect("list the golden directory")
                .file_name()
                .to_string_lossy()
                .into_owned()
        })
        .collect()
}

/// Replaces the golden files of `dir` with `rendered`.
fn bless(dir: &Path, rendered: &BTreeMap<String, String>) {
    if dir.exists() {
        fs::remove_dir_all(dir).unwrap_or_else(|e| panic!("remove {}: {e}", dir.display()));
    }
    fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    for (name, contents) in rendered {
        fs::write(dir.join(name), contents).unwrap_or_else(|e| panic!("write {name}: {e}"));
    }
}

/// The wrappers a build with `cache` renders for `graph`, and the units it
/// adds to a plain build's (the guard's norm kernels, which a routed norm
/// GEMM's vendor path runs first), checked to keep every unit of a plain
/// build and to differ from its wrappers only in the plan table's fields
/// whose first line starts with `field`: what the build option `option`
/// changes.
fn render_with(graph: &str, cache: &TunedCache, field: &str, option: &str) -> BTreeMap<String, String> {
    let spec = spec(graph);
    let library = codegen::render_tuned("fusion_kernels", ARCHS, std::slice::from_ref(&spec), &[], cache)
        .unwrap_or_else(|e| panic!("{graph}: {e}"));
    let wrappers = wrappers::generate(&library, true, FFI_RS);
    let plain = codegen::render("fusion_kernels", ARCHS, &[spec]).unwrap_or_else(|e| panic!("{e}"));
    let plain_units: BTreeMap<&str, &str> = plain
        .units
        .iter()
        .map(|unit| (unit.symbol.as_str(), unit.source.as_str()))
        .collect();
    let mut files = BTreeMap::new();
    for unit in &library.units {
        match plain_units.get(unit.symbol.as_str()) {
            Some(source) => assert_eq!(
                *source, unit.source,
                "{option} changes unit {} of {graph}",
                unit.symbol
            ),
            None => {
                files.insert(format!("{}.cu", unit.symbol), unit.source.clone());
            }
        }
    }
    assert_eq!(
        library.units.len(),
        plain.units.len() + files.len(),
        "{option} keeps every unit of {graph}"
    );
    assert_eq!(
        without_fields(&wrappers, field),
        wrappers::generate(&plain, true, FFI_RS),
        "{option} changes the plan table's `{field}` fields alone"
    );
    files.insert("wrappers.rs".to_owned(), wrappers);
    files
}

/// `wrappers` without the fields whose first line starts with `opening`:
/// each ends at the next line of its indentation.
fn without_fields(wrappers: &str, opening: &str) -> String {
    let mut kept = String::new();
    let mut open: Option<usize> = None;
    for line in wrappers.split_inclusive('\n') {
        let indent = line.len() - line.trim_start().len();
        match open {
            None if line.trim_start().starts_with(opening) => open = Some(indent),
            None => kept.push_str(line),
            Some(start) if indent == start => open = None,
            Some(_) => {}
        }
    }
    kept
}

/// A tuned cache that carries the shipped guard (`FUSION_GUARD=on`).
fn guarded() -> TunedCache {
    let mut cache = TunedCache::default();
    cache.guard = Some(Guard::shipped_sm90());
    cache
}

/// The route a guarded plan table's GEMM carries.
const ROUTE: &str = "vendor: fusion::plan::VendorRoute {";

/// `gemm_bias_residual`, whose N and K are dynamic, as a build with
/// `FUSION_GUARD=on` renders it: a plan table whose GEMM carries a route
/// left to the call (`per_call: Some(&fusion::plan::RouteModel { .. })`:
/// the two models' costs, what the vendor path runs, each variant's tiers,
/// `None` for sm80), so that the run time decides per call.
#[test]
fn wrappers_guarded_per_call_match_their_golden_file() {
    let rendered = render_with("gemm_bias_residual", &guarded(), ROUTE, "FUSION_GUARD=on");
    check_golden("gemm_bias_residual_guarded", &rendered);
    let wrappers = &rendered["wrappers.rs"];
    assert_eq!(
        wrappers.matches("&fusion::plan::RouteModel {").count(),
        1,
        "one GEMM"
    );
    assert_eq!(
        wrappers.matches("fusion::core::gemm_model::UnitTiers {").count(),
        2,
        "f16 and bf16 on sm90"
    );
    assert!(wrappers.contains("beta_residual: true"));
    assert!(wrappers.contains("fusion::plan::VendorEpilogue::Bias"));
}

/// `gemm_bias_residual`, whose N and K are dynamic, as a build with
/// `FUSION_SELECT=model` renders it: the build cannot choose a tile per M
/// bucket, so its plan table's GEMM carries the model's costs and each
/// variant's tiers (`model: Some(&fusion::plan::TileModel { .. })`, `None`
/// for sm80), and the run time chooses the tier per call.
#[test]
fn modelled_wrappers_match_their_golden_file() {
    let mut cache = TunedCache::default();
    cache.model = Some(Calibration::shipped_sm90());
    let rendered = render_with(
        "gemm_bias_residual",
        &cache,
        "model: Some(",
        "FUSION_SELECT=model",
    );
    check_golden("gemm_bias_residual_model", &rendered);
    let wrappers = &rendered["wrappers.rs"];
    assert_eq!(
        wrappers.matches("fusion::core::gemm_model::UnitTiers {").count(),
        2,
        "f16 and bf16 on sm90"
    );
    assert!(wrappers.contains("source_tile: true"));
}

/// `gpt2_mlp` as a build with `FUSION_GUARD=on` renders it: the guard's
/// models route its `gemm_bias_residual` (N = 768, K = 3072) to cuBLASLt
/// for the M buckets they predict it loses, and its `layernorm_gemm_bias_gelu`
/// (N = 3072, K = 768) likewise, whose vendor path runs the standalone
/// LayerNorm kernel of each variant first: the build adds that unit, and
/// the route names its launchers (`norm: &[..]`).
#[test]
fn guarded_wrappers_match_their_golden_file() {
    let rendered = render_with("gpt2_mlp", &guarded(), ROUTE, "FUSION_GUARD=on");
    check_golden("gpt2_mlp_guarded", &rendered);
    let wrappers = &rendered["wrappers.rs"];
    assert!(wrappers.contains("fusion::plan::VendorEpilogue::Bias"));
    assert!(wrappers.contains("fusion::plan::VendorEpilogue::GeluBias"));
    let norm_units: Vec<&String> = rendered.keys().filter(|name| name.ends_with(".cu")).collect();
    assert_eq!(
        norm_units,
        [
            "fusion_kernels_layernorm_bf16.cu",
            "fusion_kernels_layernorm_f16.cu"
        ],
        "a LayerNorm unit per dtype for the vendor path"
    );
    assert!(wrappers.contains("ffi::fusion_kernels_layernorm_f16,"));
}

/// `rmsnorm_gemm`, whose N and K are dynamic, as a build with
/// `FUSION_GUARD=on` renders it: a route left to the call whose vendor path
/// runs the standalone RMSNorm kernel of each variant (`norm: &[..]`, a
/// unit the build adds) before cuBLASLt.
#[test]
fn wrappers_guarded_norm_gemm_per_call_match_their_golden_file() {
    let rendered = render_with("rmsnorm_gemm", &guarded(), ROUTE, "FUSION_GUARD=on");
    check_golden("rmsnorm_gemm_guarded", &rendered);
    let wrappers = &rendered["wrappers.rs"];
    assert_eq!(
        wrappers.matches("&fusion::plan::RouteModel {").count(),
        1,
        "one GEMM"
    );
    assert!(
        wrappers.contains("norm: true"),
        "the vendor model counts the norm kernel"
    );
    assert!(wrappers.contains("ffi::fusion_kernels_rmsnorm_bf16,"));
    assert_eq!(
        rendered.keys().collect::<Vec<_>>(),
        [
            "fusion_kernels_rmsnorm_bf16.cu",
            "fusion_kernels_rmsnorm_f16.cu",
            "wrappers.rs"
        ],
        "the wrappers and an RMSNorm unit per dtype"
    );
}

#[test]
fn generated_code_matches_golden_files() {
    let mut report = Vec::new();
    for graph in GRAPHS {
        let rendered = render(graph);
        let dir = golden_dir(graph);
        if blessing() {
            bless(&dir, &rendered);
        } else {
            report.extend(
                mismatches(&dir, &rendered)
                    .into_iter()
                    .map(|p| format!("tests/golden/{graph}/{p}")),
            );
        }
    }
    assert!(
        report.is_empty(),
        "generated code differs from the golden files:\n{}\n\nIf the change is intended, rewrite them with \
         `FUSION_BLESS=1 cargo test -p fusion-compiler --test golden` and review `git diff fusion-compiler/tests/golden`.",
        report.join("\n")
    );
}

/// Two FP8 graphs (`graphs/fp8/`) as a build with `FUSION_FP8=experimental`
/// renders them for sm80 and sm90: one sm90 unit each, with A's and B's
/// scales as the chain's first step (per tensor for `fp8_gemm_bias`, per
/// output channel for `fp8_gemm_bias_gelu`), and wrappers that export its
/// launcher. The default build's files (the other golden tests) are
/// unchanged by the option.
#[test]
fn fp8_units_match_their_golden_files() {
    let mut cache = TunedCache::default();
    cache.fp8 = true;
    for (graph, chain) in [
        (
            "fp8_gemm_bias",
            "fusion::EpilogueChain<fusion::Dequantize<false>, fusion::Bias>",
        ),
        (
            "fp8_gemm_bias_gelu",
            "fusion::EpilogueChain<fusion::Dequantize<true>, fusion::Bias, fusion::Gelu>",
        ),
    ] {
        let spec = spec_at(&format!("graphs/fp8/{graph}.toml"), &[DType::F8E4M3]);
        let library = codegen::render_tuned("fusion_kernels", ARCHS, &[spec], &[], &cache)
            .unwrap_or_else(|e| panic!("{graph}: {e}"));
        let rendered = files_of(&library);
        check_golden(graph, &rendered);
        let [unit] = &library.units[..] else {
            panic!("{graph}: one unit, the sm90 FP8 GEMM");
        };
        assert_eq!(unit.archs, [Arch::Sm90], "{graph}");
        assert!(
            unit.source.contains(&format!("using Chain = {chain};")),
            "{graph}"
        );
        assert!(unit.source.contains("using Element = __nv_fp8_e4m3;"), "{graph}");
    }
}
