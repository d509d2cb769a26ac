//! A tuned tile config that breaks a rule of its mainloop or whose shared
//! memory does not fit is refused by the build, through the real nvcc: the
//! headers hold the rules (each generation's `tile_valid`) and size their
//! shared memory (sm90: `sizeof(SharedStorage)`), and codegen renders
//! `static_assert`s of both per tile config into the unit, their messages
//! naming the tuned table's file and entry.
//!
//! The same unit's `<symbol>_resources` function reports each tile
//! config's shared memory and threads as the kernel computes them (Rust
//! never derives them); a host program built from the unit prints them.
//!
//! nvcc is required: `cargo xtask test` installs it and exports `NVCC`;
//! locally, set `NVCC` or run `cargo xtask toolchain`. No GPU is needed.

#![cfg(feature = "build")]

use fusion_compiler::build::nvcc::{Env, ToolchainFile, cuda_lib_dir, find_nvcc};
use fusion_compiler::build::{BuildError, CompileOptions, CudaSources, GeneratedFile, Unit, compile};
use fusion_compiler::codegen::{self, GraphSpec, KernelKey, templates};
use fusion_compiler::ir::DType;
use fusion_compiler::select::{Arch, TunedTable};
use std::path::{Path, PathBuf};
use std::process::Command;

fn fresh_dir(name: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(&root).unwrap();
    root
}

fn gemm_bias_gelu_f16() -> GraphSpec {
    let graph_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../graphs/gemm_bias_gelu.toml");
    let graph = fusion_compiler::load_toml_graph(&graph_path).unwrap();
    GraphSpec {
        plan: fusion_compiler::fuse::plan(graph),
        dtypes: vec![DType::F16],
        origin: "graphs/gemm_bias_gelu.toml".to_owned(),
        fingerprint: None,
        declaration: String::new(),
    }
}

/// Renders graphs/gemm_bias_gelu.toml for `arch` with `json` as its tuned
/// table (file name `file`), compiles the one unit with nvcc and returns
/// nvcc's errors.
fn nvcc_errors(arch: Arch, file: &str, json: &str) -> String {
    // One folder per table: tests run in parallel.
    let root = fresh_dir(&format!("fusion-build-tile-budget-{}", file.replace('/', "-")));
    let table = TunedTable::parse(file, json).unwrap();
    let library =
        codegen::render_with_tables("fusion_kernels", &[arch], &[gemm_bias_gelu_f16()], &[table]).unwrap();
    assert_eq!(library.units.len(), 1);
    let unit = &library.units[0];
    let include_dir = root.join("include");
    templates::write_headers(&include_dir).unwrap();
    let sources = CudaSources {
        units: vec![Unit {
            name: unit.symbol.clone(),
            source: unit.source.clone(),
            archs: vec![arch],
            used_by: Vec::new(),
            tiles: Vec::new(),
        }],
        header: GeneratedFile {
            name: library.header.0.clone(),
            contents: library.header.1.clone(),
        },
        headers_dir: include_dir,
    };
    let mut options = CompileOptions::new(root.join("out"));
    options.cache_dir = Some(root.join("cache"));
    match compile(&sources, &options) {
        Err(BuildError::Nvcc { stderr, .. }) => stderr,
        Err(e @ BuildError::NvccNotFound { .. }) => {
            panic!("this test compiles CUDA and needs nvcc; `cargo xtask test` provides it.\n{e}")
        }
        Err(e) => panic!("expected nvcc to refuse the unit, got: {e}"),
        Ok(_) => panic!("the over-budget tile config compiled"),
    }
}

#[test]
fn an_sm90_entry_over_the_shared_memory_budget_fails_the_build_naming_the_entry() {
    // 128x256 tiles with 5 stages: 1024 + 5 x 48 KB of stages + 32 KB of
    // staging + barriers, over the 227 KB an sm_90 block may have.
    let json = r#"{ "arch": "sm90", "configs": {
        "gemm_bias_gelu.f16": { "large": { "bm": 128, "bn": 256, "bk": 64, "stages": 5 } } } }"#;
    refused(
        Arch::Sm90,
        json,
        "over-budget",
        "128x256x64 (5 stages, cooperative, persistent) needs more shared memory per block than sm90 allows",
        None,
    );
}

#[test]
fn an_sm80_entry_over_the_shared_memory_budget_fails_the_build_naming_the_entry() {
    // 5 x (128 x 32 + 256 x 32) x 2 = 120 KB, over the 99 KB of sm_86/89.
    let json = r#"{ "arch": "sm80", "configs": {
        "gemm_bias_gelu.f16": { "large": { "bm": 128, "bn": 256, "bk": 32, "warp_m": 64, "warp_n": 64,
                                           "stages": 5, "min_blocks_per_sm": 1 } } } }"#;
    refused(
        Arch::Sm80,
        json,
        "over-budget",
        "128x256x32 (warp 64x64, 5 stages, 1 block(s)/SM) needs more shared memory per block than sm80 allows",
        None,
    );
}

/// Asserts that nvcc refused `json`'s `gemm_bias_gelu.f16` entry (the table
/// `tuned/<stem>-<arch>.json`) on `arch` with a message naming the entry and
/// ending in `what`, and with the header's own message for the rule when
/// there is one.
fn refused(arch: Arch, json: &str, stem: &str, what: &str, rule: Option<&str>) {
    let file = format!("tuned/{stem}-{arch}.json");
    let errors = nvcc_errors(arch, &file, json);
    let needle = format!(
        "tile config from {file}, entry 'gemm_bias_gelu.f16' for 'gemm_bias_gelu' (large) does not fit {arch}: {what}"
    );
    assert!(
        errors.contains(&needle),
        "`{needle}` missing from nvcc's errors:\n{errors}"
    );
    if let Some(rule) = rule {
        assert!(
            errors.contains(rule),
            "`{rule}` missing from nvcc's errors:\n{errors}"
        );
    }
}

/// [`refused`] for a tile rule: `summary` is the tile's.
fn refused_by_rule(arch: Arch, json: &str, summary: &str, rule: Option<&str>) {
    let what = format!("{summary} is not a tile the {arch} mainloop takes");
    refused(arch, json, "rule", &what, rule);
}

#[test]
fn an_sm90_entry_that_breaks_a_tile_rule_fails_the_build_naming_the_entry() {
    // A whole 128x256 tile per ping-pong consumer: 256 accumulators a thread.
    let json = r#"{ "arch": "sm90", "configs": {
        "gemm_bias_gelu.f16": { "large": { "bm": 128, "bn": 256, "bk": 64, "stages": 3, "schedule": "pingpong" } } } }"#;
    let summary = "128x256x64 (3 stages, pingpong, persistent)";
    refused_by_rule(
        Arch::Sm90,
        json,
        summary,
        Some("a consumer thread holds at most 128 accumulators"),
    );
    // The template fixes BK; an entry asking for another is refused.
    let json = r#"{ "arch": "sm90", "configs": {
        "gemm_bias_gelu.f16": { "large": { "bm": 128, "bn": 128, "bk": 32, "stages": 4 } } } }"#;
    refused_by_rule(
        Arch::Sm90,
        json,
        "128x128x32 (4 stages, cooperative, persistent)",
        None,
    );
}

#[test]
fn warp_tiled_entries_that_break_a_tile_rule_fail_the_build_naming_the_entry() {
    // 64x128 warp tiles hold 256 accumulators a thread: more registers than
    // 256 threads with 2 blocks per SM leave.
    let json = r#"{ "arch": "sm80", "configs": {
        "gemm_bias_gelu.f16": { "large": { "bm": 128, "bn": 256, "bk": 32, "warp_m": 64, "warp_n": 128,
                                           "stages": 2, "min_blocks_per_sm": 2 } } } }"#;
    refused_by_rule(
        Arch::Sm80,
        json,
        "128x256x32 (warp 64x128, 2 stages, 2 block(s)/SM)",
        Some("the warp tile's accumulators need more registers than the threads and blocks per SM leave"),
    );
    // The sm75 mainloop is double-buffered: its template fixes the stages.
    let json = r#"{ "arch": "sm75", "configs": {
        "gemm_bias_gelu.f16": { "large": { "bm": 128, "bn": 128, "bk": 32, "warp_m": 64, "warp_n": 32,
                                           "stages": 3, "min_blocks_per_sm": 1 } } } }"#;
    refused_by_rule(
        Arch::Sm75,
        json,
        "128x128x32 (warp 64x32, 3 stages, 1 block(s)/SM)",
        None,
    );
}

/// A host program that prints what `<symbol>_resources` reports, one line
/// per tile config: `<tile> <smem_bytes> <threads>`.
const PRINT_RESOURCES: &str = r#"
#include <stdio.h>
int main() {
  fusion_tile_resources tiles[8];
  const int count = SYMBOL_resources(tiles, 8);
  for (int i = 0; i < count && i < 8; ++i) printf("%s %u %u\n", tiles[i].tile, tiles[i].smem_bytes, tiles[i].threads);
  return 0;
}
"#;

#[test]
fn an_sm90_unit_reports_each_tile_configs_resources() {
    let root = fresh_dir("fusion-build-tile-resources");
    let library = codegen::render("fusion_kernels", &[Arch::Sm90], &[gemm_bias_gelu_f16()]).unwrap();
    let unit = &library.units[0];
    let KernelKey::Gemm { config, layout, .. } = &unit.key else {
        panic!("not a GEMM unit: {}", unit.symbol)
    };
    let include_dir = root.join("include");
    templates::write_headers(&include_dir).unwrap();
    let source = root.join("resources.cu");
    let main = PRINT_RESOURCES.replace("SYMBOL", &unit.symbol);
    std::fs::write(&source, format!("{}\n{main}", unit.source)).unwrap();
    let target_dir = Path::new(env!("CARGO_TARGET_TMPDIR")).parent();
    let toolchain = ToolchainFile::load(target_dir).unwrap_or_default();
    let nvcc = find_nvcc(&Env::from_process(), &toolchain)
        .unwrap_or_else(|searched| panic!("this test needs nvcc; searched: {searched:?}"));
    let lib_dir = cuda_lib_dir(&nvcc, std::env::consts::ARCH).unwrap();
    let program = root.join("resources");
    let built = Command::new(&nvcc)
        .args([
            "-std=c++17",
            "--expt-relaxed-constexpr",
            "-gencode=arch=compute_90a,code=sm_90a",
            "-I",
        ])
        .arg(&include_dir)
        .arg("-L")
        .arg(&lib_dir)
        .arg(&source)
        .arg("-o")
        .arg(&program)
        .output()
        .unwrap();
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stderr)
    );
    // Asks nothing of a GPU: the function only reads constants.
    let ran = Command::new(&program).output().unwrap();
    assert!(ran.status.success(), "{}", String::from_utf8_lossy(&ran.stderr));
    let printed = String::from_utf8(ran.stdout).unwrap();

    // One line per tile config the unit instantiates, in select's order,
    // then its decode kernel.
    let tiles = [
        ("large", Some(config.large)),
        ("large_alt", config.large_alt),
        ("small_m", config.small_m),
        ("small_m_alt", config.small_m_alt),
        ("few_m", config.few_m),
    ];
    let expected: Vec<&str> = tiles
        .iter()
        .filter_map(|(which, tile)| tile.map(|_| *which))
        .chain(config.decode_for(*layout).map(|_| "decode"))
        .collect();
    assert!(
        expected.contains(&"decode"),
        "the shipped sm90 default runs the decode kernel for small M"
    );
    let reported: Vec<&str> = printed
        .lines()
        .filter_map(|line| line.split(' ').next())
        .collect();
    assert_eq!(reported, expected, "{printed}");
    // The shipped 128x256 tile with 4 stages: half its staging tile fits
    // (4 x 48 KB of stages, 32 KB of staging, 1 KB of alignment slack and
    // 248 bytes of barriers, the scheduler's plan and the pieces posted
    // beside the 4 stages).
    assert!(printed.starts_with("large 230648 384\n"), "{printed}");
    // Its 128x192 alternative stages its whole tile (4 x 40 KB of stages,
    // 48 KB of staging, the same slack and bookkeeping).
    assert!(printed.contains("\nlarge_alt 214264 384\n"), "{printed}");
    // The few-M tile every such unit has, 64x64 with 8 stages: 8 x 16 KB
    // of stages, its whole 8 KB staging tile, the same slack and 368 bytes
    // of bookkeeping.
    assert!(printed.contains("\nfew_m 140656 256\n"), "{printed}");
    // The decode kernel: 8 warps, its partial sums in static shared memory.
    assert!(printed.ends_with("decode 0 256\n"), "{printed}");
}
