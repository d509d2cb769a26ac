//! `Builder::tuned` and `FUSION_TUNED` point a build at a tuned cache. One
//! test in its own binary: it sets the environment variable.

use fusion_compiler::build::Builder;
use fusion_compiler::select::{Arch, CacheEntry, CacheKey, TUNED_ENV, TileConfig, TunedCache};
use indexmap::IndexMap;
use std::path::Path;

const GRAPH: &str = "[graph]\nname = \"proj\"\n[dims]\nM = \"dyn\"\nK = 1000\nN = 3000\n\
[inputs]\nx = \"f16[M, K]\"\n[weights]\nw = \"f16[N, K]\"\nb = \"f16[N]\"\n[outputs]\ny = \"gelu(x @ w^T + b)\"\n";

fn large_tile_of(builder: Builder) -> (String, Vec<String>) {
    let library = builder.render().unwrap_or_else(|e| panic!("{e}"));
    let unit = &library.units[0];
    let line = unit
        .source
        .lines()
        .find(|l| l.starts_with("using LargeTile = "))
        .unwrap_or_else(|| panic!("no LargeTile in:\n{}", unit.source));
    (format!("{}: {line}", unit.symbol), library.warnings)
}

fn write_cache(path: &Path, bm: u32, bn: u32, stages: u32) {
    let tile = TileConfig::sm90(bm, bn, stages, None);
    let entry = CacheEntry {
        tile,
        time_us: 40.0,
        default_time_us: 48.0,
        cublaslt_time_us: 41.0,
        gpu: "NVIDIA H200".to_owned(),
        driver: "580.65.06".to_owned(),
        nvcc: "13.0.48".to_owned(),
        date: "2026-12-01".to_owned(),
    };
    let key = CacheKey::parse("gemm_bias_gelu.f16.nk.n3000.k1000.sm90.m>4096").unwrap();
    TunedCache::write(path, &IndexMap::from([(key, entry)])).unwrap();
}

#[test]
fn builder_tuned_and_the_environment_variable_select_the_cached_tiles() {
    let dir = std::env::temp_dir().join(format!("fusion-build-tuned-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let graph = dir.join("proj.toml");
    std::fs::write(&graph, GRAPH).unwrap();
    let (by_builder, by_env) = (dir.join("builder.json"), dir.join("env.json"));
    write_cache(&by_builder, 128, 128, 5);
    write_cache(&by_env, 64, 256, 4);
    let builder = || {
        Builder::new()
            .graph_file(&graph)
            .archs(&[Arch::Sm90])
            .lib_name("k")
    };
    let tuned = |tile: &str| {
        (
            format!(
                "k_gemm_bias_gelu_nk_f16_sm90_n3000_k1000: using LargeTile = fusion::sm90::TileConfig<{tile}, fusion::sm90::Schedule::Cooperative>;"
            ),
            Vec::new(),
        )
    };
    // Without a cache: the shipped tiles, the small-M alternative fitted to
    // N = 3000 (96 columns, a unit of its own).
    let shipped = (
        "k_gemm_bias_gelu_nk_f16_sm90_w96: using LargeTile = fusion::sm90::TileConfig<128, 256, 4, fusion::sm90::Schedule::Cooperative>;".to_owned(),
        Vec::new(),
    );

    assert_eq!(large_tile_of(builder()), shipped);
    assert_eq!(large_tile_of(builder().tuned(&by_builder)), tuned("128, 128, 5"));
    // SAFETY: this binary's only test; nothing else reads the environment.
    unsafe { std::env::set_var(TUNED_ENV, &by_env) };
    assert_eq!(large_tile_of(builder()), tuned("64, 256, 4"));
    // Builder::tuned wins over the variable.
    assert_eq!(large_tile_of(builder().tuned(&by_builder)), tuned("128, 128, 5"));
    // A file that is not there is a warning naming it, and the shipped tiles.
    let missing = dir.join("missing.json");
    unsafe { std::env::set_var(TUNED_ENV, &missing) };
    let (tile, warnings) = large_tile_of(builder());
    assert_eq!(tile, shipped.0);
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with(&format!("cannot read the tuned cache {}", missing.display())),
        "{warnings:?}"
    );
    unsafe { std::env::remove_var(TUNED_ENV) };
    let _ = std::fs::remove_dir_all(&dir);
}
