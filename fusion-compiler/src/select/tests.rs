use super::*;
use crate::fuse::{Activation, EpilogueStep};
use crate::target::{Fields, sm75, sm80, sm90};

/// Tiles of the shipped tables (`kernels/tuned/*.json`, their one source),
/// written out here to check what selection returns.
impl TileConfig {
    /// sm80: 8 warps of 64x64.
    const TILE_128X256: TileConfig = sm80_tile(128, 256, 32, 64, 64, 4, 1, false);
    /// sm80: 8 warps of 64x32, two blocks per SM.
    const TILE_128X128: TileConfig = sm80_tile(128, 128, 32, 64, 32, 4, 2, false);
    /// The sm75 mainloop's double-buffered 128x128 tile.
    const SM75_128X128: TileConfig = TileConfig {
        bm: 128,
        bn: 128,
        bk: 32,
        stages: 2,
        fields: Fields::Sm75(sm75::Fields {
            warp_m: 64,
            warp_n: 32,
            min_blocks_per_sm: 1,
        }),
    };
    /// The sm90 mainloop's 128x256 tile: two cooperative consumer warp
    /// groups, 4 stages.
    const SM90_128X256: TileConfig = TileConfig::sm90(128, 256, 4, Some(Schedule::Cooperative));
}

/// An sm80 tile config with the per-tile store.
#[allow(clippy::too_many_arguments)]
const fn sm80_tile(
    bm: u32,
    bn: u32,
    bk: u32,
    warp_m: u32,
    warp_n: u32,
    stages: u32,
    min_blocks_per_sm: u32,
    pipelined: bool,
) -> TileConfig {
    TileConfig {
        bm,
        bn,
        bk,
        stages,
        fields: Fields::Sm80(sm80::Fields {
            warp_m,
            warp_n,
            min_blocks_per_sm,
            pipelined,
            staged_store: false,
        }),
    }
}

fn kernel(name: &str, dtype: DType, prologue: bool) -> KernelKind {
    KernelKind {
        name: name.to_owned(),
        dtype,
        layout: WeightLayout::NK,
        prologue,
        source_tile: false,
        gated: false,
    }
}

#[test]
fn shipped_tables_parse_and_fit_their_arch() {
    for arch in Arch::ALL {
        let table = TunedTable::shipped(arch).unwrap();
        assert_eq!(table.arch, arch);
        // Every entry, with the prologue its name implies, and a norm and a
        // plain composition that fall back to `default`, and one reading a
        // source tile that falls back to `default.source_tile` where there
        // is one, and a gated one (to `default.gated`).
        let mut names: Vec<String> = table
            .configs
            .keys()
            .map(|k| {
                k.replace(SOURCE_TILE_DEFAULT, "gemm_residual")
                    .replace(GATED_DEFAULT, "gemm_silu_glu")
                    .replace("default", "gemm")
            })
            .collect();
        names.extend(
            [
                "rmsnorm_gemm_bias_silu",
                "gemm_bias_silu",
                "gemm_silu_mul",
                "rmsnorm_gemm_gelu_glu",
            ]
            .map(str::to_owned),
        );
        for name in &names {
            let (name, dtypes) = match name.split_once('.') {
                Some((name, dtype)) => (name, vec![dtype.parse::<DType>().unwrap()]),
                None => (name.as_str(), vec![DType::F16, DType::BF16]),
            };
            let prologue = name.starts_with("layernorm_") || name.starts_with("rmsnorm_");
            let source_tile = name.ends_with("_residual") || name.ends_with("_mul");
            let gated = name.ends_with("_glu");
            for &dtype in dtypes.iter().filter(|d| arch.supports(**d)) {
                for layout in [WeightLayout::NK, WeightLayout::KN] {
                    let k = KernelKind {
                        layout,
                        source_tile,
                        gated,
                        ..kernel(name, dtype, prologue)
                    };
                    select(arch, &k).unwrap_or_else(|e| panic!("{e}"));
                }
            }
        }
    }
}

#[test]
fn defaults_are_the_measured_tiles() {
    let k = kernel("gemm_bias_gelu", DType::F16, false);
    let sm80 = select(Arch::Sm80, &k).unwrap();
    let pipelined = |bm, bn, bk, warp_m, warp_n, stages, min_blocks_per_sm| {
        sm80_tile(bm, bn, bk, warp_m, warp_n, stages, min_blocks_per_sm, true)
    };
    let small = pipelined(64, 128, 32, 32, 64, 4, 3);
    assert_eq!(sm80.large, pipelined(128, 128, 32, 64, 64, 4, 2));
    assert_eq!(sm80.small(), Some((small, 512)));
    // sm90: the sm90 mainloop's 128x256 and 64x128 cooperative tiles.
    let sm90 = select(Arch::Sm90, &k).unwrap();
    let sm90_tile = |bm, bn, stages| TileConfig::sm90(bm, bn, stages, Some(Schedule::Cooperative));
    assert_eq!(sm90.large, sm90_tile(128, 256, 4));
    assert_eq!(sm90.small(), Some((sm90_tile(64, 128, 8), 1024)));
    assert_eq!(sm90.small_m_alt, Some(sm90_tile(128, 128, 6)));
    assert_eq!(sm90, TunedTable::shipped(Arch::Sm90).unwrap().configs["default"]);
    // gemm_bias_residual has no override of its own any more.
    let residual = select(Arch::Sm90, &kernel("gemm_bias_residual", DType::BF16, false)).unwrap();
    assert_eq!(residual, sm90);
    // Norm prologues keep the per-stage loop, which does not spill with them.
    let norm = select(Arch::Sm80, &kernel("rmsnorm_gemm", DType::F16, true)).unwrap();
    assert_eq!(norm.large, TileConfig::TILE_128X128);
    // On sm90 they get the default tiles.
    let norm = select(Arch::Sm90, &kernel("layernorm_gemm_bias_gelu", DType::F16, true)).unwrap();
    assert_eq!(norm, sm90);
    assert_eq!(select(Arch::Sm75, &k).unwrap().large, TileConfig::SM75_128X128);
    assert_eq!(select(Arch::Sm75, &k).unwrap().small(), None);
}

#[test]
fn oversized_tuned_entry_is_passed_on_with_file_and_entry() {
    // 5 x (128 x 32 + 256 x 32) x 2 = 122880 bytes, over sm80's 101376:
    // selection passes it on with its source, and nvcc refuses the unit
    // (tests/build_tile_budget.rs).
    let json = r#"{ "arch": "sm80", "configs": {
        "gemm_bias_gelu.f16": { "large": { "bm": 128, "bn": 256, "bk": 32, "warp_m": 64, "warp_n": 64,
                                           "stages": 5, "min_blocks_per_sm": 1 } } } }"#;
    let table = TunedTable::parse("kernels/tuned/sm80.json", json).unwrap();
    let (config, source) =
        select_sourced(&table, Arch::Sm80, &kernel("gemm_bias_gelu", DType::F16, false)).unwrap();
    assert_eq!(config.large.stages, 5);
    assert_eq!(
        source.to_string(),
        "kernels/tuned/sm80.json, entry `gemm_bias_gelu.f16`"
    );
    // Another composition has no entry, and the table no `default`.
    let err = select_with(&table, Arch::Sm80, &kernel("gemm_bias", DType::F16, false)).unwrap_err();
    assert!(matches!(err, SelectError::NoEntry { .. }), "{err}");
    assert_eq!(
        err.to_string(),
        "kernels/tuned/sm80.json has no entry `gemm_bias.f16`, `gemm_bias` or `default` for a kernel of sm80: add one"
    );
}

#[test]
fn lookup_prefers_the_most_specific_key() {
    let json = r#"{ "arch": "sm80", "configs": {
        "default": { "large": { "bm": 128, "bn": 128, "bk": 32, "warp_m": 64, "warp_n": 32, "stages": 3, "min_blocks_per_sm": 1 } },
        "gemm_silu": { "large": { "bm": 128, "bn": 128, "bk": 32, "warp_m": 64, "warp_n": 32, "stages": 4, "min_blocks_per_sm": 1 } },
        "gemm_silu.bf16": { "large": { "bm": 128, "bn": 128, "bk": 32, "warp_m": 64, "warp_n": 32, "stages": 5, "min_blocks_per_sm": 1 } } } }"#;
    let table = TunedTable::parse("t.json", json).unwrap();
    let stages = |name, dtype| table.lookup(name, dtype, None).map(|(_, c)| c.large.stages);
    assert_eq!(stages("gemm_silu", DType::BF16), Some(5));
    assert_eq!(stages("gemm_silu", DType::F16), Some(4));
    assert_eq!(stages("gemm", DType::F16), Some(3));
}

#[test]
fn a_composition_reading_a_source_tile_takes_its_default_before_the_plain_one() {
    let json = r#"{ "arch": "sm90", "configs": {
        "default": { "large": { "bm": 128, "bn": 256, "bk": 64, "stages": 4 } },
        "default.source_tile": { "large": { "bm": 128, "bn": 256, "bk": 64, "stages": 3 } },
        "gemm_residual": { "large": { "bm": 128, "bn": 128, "bk": 64, "stages": 5 } } } }"#;
    let table = TunedTable::parse("t.json", json).unwrap();
    let source_tile = Some(SOURCE_TILE_DEFAULT);
    let entry = |name, kind_default| table.lookup(name, DType::F16, kind_default).map(|(key, _)| key);
    assert_eq!(
        entry("gemm_bias_residual", source_tile),
        Some("default.source_tile")
    );
    assert_eq!(entry("gemm_bias_gelu", None), Some("default"));
    // A composition's own entry still comes first.
    assert_eq!(entry("gemm_residual", source_tile), Some("gemm_residual"));
    let source = |name: &str| {
        let (prologue, epilogue) = match name {
            "gemm_silu_mul" => (
                None,
                vec![EpilogueStep::Activation(Activation::SILU), EpilogueStep::Mul],
            ),
            _ => (None, vec![EpilogueStep::Bias]),
        };
        KernelKind::of(
            &GemmComposition {
                prologue,
                b_layout: WeightLayout::NK,
                gate: None,
                epilogue,
            },
            DType::F16,
        )
        .source_tile
    };
    assert!(source("gemm_silu_mul"));
    assert!(!source("gemm_bias"));
}

#[test]
fn a_gated_gemm_takes_the_gated_default_and_no_tile_it_cannot_store() {
    let gated = |activation| {
        KernelKind::of(
            &GemmComposition {
                prologue: None,
                b_layout: WeightLayout::NK,
                gate: Some(activation),
                epilogue: vec![],
            },
            DType::F16,
        )
    };
    let silu_glu = gated(Activation::SILU);
    assert!(silu_glu.gated && !silu_glu.source_tile);
    assert_eq!(silu_glu.kind_default(), Some(GATED_DEFAULT));
    // The shipped sm90 table gives plain GEMMs a 192-column alternative,
    // which a gated GEMM's epilogue cannot store (96 columns of C).
    let plain = kernel("gemm_bias_gelu", DType::F16, false);
    assert_eq!(
        select(Arch::Sm90, &plain).unwrap().large_alt.map(|t| t.bn),
        Some(192)
    );
    let config = select(Arch::Sm90, &silu_glu).unwrap();
    assert_eq!(config.large_alt, None);
    assert_eq!(config.large.bn % 128, 0);
    // A table that gives one anyway is refused, naming the rule.
    let json = r#"{ "arch": "sm90", "configs": {
        "default": { "large": { "bm": 128, "bn": 192, "bk": 64, "stages": 4 } } } }"#;
    let table = TunedTable::parse("t.json", json).unwrap();
    let err = select_with(&table, Arch::Sm90, &silu_glu)
        .unwrap_err()
        .to_string();
    assert!(err.contains("gated") && err.contains("64-column"), "{err}");
    select_with(&table, Arch::Sm90, &plain).unwrap();
}

#[test]
fn malformed_tables_name_the_file() {
    let err = TunedTable::parse(
        "x.json",
        r#"{ "arch": "sm80", "configs": { "default": { "large": { "bm": 1 } } } }"#,
    )
    .unwrap_err()
    .to_string();
    assert!(err.starts_with("x.json: missing field"), "{err}");
    let err = TunedTable::parse("x.json", r#"{ "arch": "sm70", "configs": {} }"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown arch `sm70`"), "{err}");
}

#[test]
fn warp_tiled_entries_give_their_fields() {
    let k = kernel("gemm", DType::F16, false);
    let reject = |c: TileConfig, arch: Arch, needle: &str| {
        let err = c.check(arch, k.gated).unwrap_err();
        assert!(err.contains(needle), "`{needle}` missing from: {err}");
    };
    // (A missing warp field and a schedule: schedule_is_parsed_and_rejected_outside_sm90.)
    for tile in [TileConfig::SM75_128X128, TileConfig::TILE_128X128] {
        reject(
            TileConfig { stages: 0, ..tile },
            tile.arch(),
            "every field must be positive",
        );
    }
    // The tile rules are the headers' (warp_tiled.cuh and each mainloop's
    // tile_valid), which the unit asserts: selection passes these on and
    // nvcc refuses them naming the entry (tests/build_tile_budget.rs).
    let three_stages = TileConfig {
        stages: 3,
        ..TileConfig::SM75_128X128
    };
    assert_eq!(three_stages.check(Arch::Sm75, k.gated), Ok(()));
    let odd_warp = sm80_tile(128, 96, 32, 64, 24, 4, 2, false);
    assert_eq!(odd_warp.check(Arch::Sm80, k.gated), Ok(()));
}

#[test]
fn sm90_summary() {
    assert_eq!(
        TileConfig::SM90_128X256.summary(),
        "128x256x64 (4 stages, cooperative, persistent)"
    );
}

#[test]
fn sm90_shared_memory_is_left_to_the_units_static_assert() {
    // 1024 + 5 x 384 x 128 + 128 x 256 x 2 / 2 + 96 + 96 = 279744 bytes,
    // over sm90's 232448: selection passes it on with its source, and nvcc
    // refuses the unit (tests/build_tile_budget.rs).
    let json = r#"{ "arch": "sm90", "configs": {
        "gemm_bias.f16": { "large": { "bm": 128, "bn": 256, "bk": 64, "stages": 5 } } } }"#;
    let table = TunedTable::parse("kernels/tuned/sm90.json", json).unwrap();
    let (config, source) =
        select_sourced(&table, Arch::Sm90, &kernel("gemm_bias", DType::F16, false)).unwrap();
    assert_eq!(config.large.stages, 5);
    assert_eq!(
        source.to_string(),
        "kernels/tuned/sm90.json, entry `gemm_bias.f16`"
    );
}

#[test]
fn sm90_entries_leave_out_the_warp_tiled_fields() {
    let k = kernel("gemm", DType::F16, false);
    let base = TileConfig::SM90_128X256;
    assert_eq!(base.check(Arch::Sm90, k.gated), Ok(()));
    // The sm90 tile has no warp tile: a table that gives one is refused,
    // naming the field.
    let err = TunedTable::parse(
        "kernels/tuned/sm90.json",
        r#"{ "arch": "sm90", "configs": { "default": { "large": {
            "bm": 128, "bn": 256, "bk": 64, "stages": 4, "warp_m": 64 } } } }"#,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("unknown field `warp_m`"), "{err}");
    let err = TunedTable::parse(
        "kernels/tuned/sm90.json",
        r#"{ "arch": "sm90", "configs": { "default": { "large": {
            "bm": 128, "bn": 256, "bk": 64, "stages": 4, "staged_store": true } } } }"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("`staged_store` does not apply to the sm90 mainloop"),
        "{err}"
    );
    // Its tile rules are TileConfig's in sm90/tile_config.cuh, which the
    // unit asserts: a 256-accumulator ping-pong tile passes selection, and
    // nvcc refuses it naming the entry (tests/build_tile_budget.rs).
    let pingpong = TileConfig::sm90(128, 256, 4, Some(Schedule::PingPong));
    assert_eq!(pingpong.check(Arch::Sm90, k.gated), Ok(()));
}

#[test]
fn schedule_is_parsed_and_rejected_outside_sm90() {
    let entry = |arch: &str, schedule: &str| {
        format!(
            r#"{{ "arch": "{arch}", "configs": {{ "default": {{ "large": {{
                "bm": 128, "bn": 128, "bk": 64, "warp_m": 64, "warp_n": 32, "stages": 4,
                "min_blocks_per_sm": 1, "schedule": "{schedule}" }} }} }} }}"#
        )
    };
    // An sm80 tile has no schedule: the table is refused, naming the field.
    let err = TunedTable::parse("kernels/tuned/sm80.json", &entry("sm80", "pingpong"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `schedule`"), "{err}");
    let sm90 = r#"{ "arch": "sm90", "configs": { "default": { "large": {
        "bm": 128, "bn": 128, "bk": 64, "stages": 4, "schedule": "pingpong" } } } }"#;
    let table = TunedTable::parse("kernels/tuned/sm90.json", sm90).unwrap();
    assert_eq!(
        table.configs["default"].large.sm90_fields().unwrap().schedule,
        Some(Schedule::PingPong)
    );
    // An unknown schedule is a parse error naming the file.
    let err = TunedTable::parse("x.json", &sm90.replace("pingpong", "roundrobin"))
        .unwrap_err()
        .to_string();
    assert!(err.starts_with("x.json: unknown variant `roundrobin`"), "{err}");
    // sm80 entries still need their warp tile.
    let json = r#"{ "arch": "sm80", "configs": { "default": { "large": {
        "bm": 128, "bn": 128, "bk": 32, "warp_n": 32, "stages": 4, "min_blocks_per_sm": 1 } } } }"#;
    let table = TunedTable::parse("kernels/tuned/sm80.json", json).unwrap();
    let err = select_with(&table, Arch::Sm80, &kernel("gemm", DType::F16, false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("`warp_m` is missing or 0"), "{err}");
}

#[test]
fn norm_compositions_on_sm90_get_the_sm90_mainloop() {
    let norm = kernel("rmsnorm_gemm_bias_gelu", DType::BF16, true);
    // sm90.json's `default`, like any other composition.
    let plain = kernel("gemm_bias_gelu", DType::BF16, false);
    assert_eq!(
        select(Arch::Sm90, &norm).unwrap(),
        select(Arch::Sm90, &plain).unwrap()
    );
    // An sm80 config given to a norm composition on sm90 is refused.
    let err = TileConfig::TILE_128X256
        .check(Arch::Sm90, norm.gated)
        .unwrap_err();
    assert!(
        err.contains("is a tile config of the sm80 mainloop, not of sm90's"),
        "{err}"
    );
}

/// An sm90 table whose only entry, `gemm_bias`, is `entry` (JSON).
fn sm90_gemm_bias_table(entry: &str) -> TunedTable {
    let json = format!(r#"{{ "arch": "sm90", "configs": {{ "gemm_bias": {entry} }} }}"#);
    TunedTable::parse("kernels/tuned/sm90.json", &json).unwrap()
}

#[test]
fn small_m_alt_is_checked_and_needs_small_m() {
    let k = kernel("gemm_bias", DType::F16, false);
    let large = r#""large": { "bm": 128, "bn": 256, "bk": 64, "stages": 3 }"#;
    let small = r#""small_m": { "bm": 64, "bn": 128, "bk": 64, "stages": 8 }, "small_m_max": 512"#;
    let alt =
        |stages: u32| format!(r#""small_m_alt": {{ "bm": 128, "bn": 128, "bk": 64, "stages": {stages} }}"#);
    let alone = sm90_gemm_bias_table(&format!("{{ {large}, {} }}", alt(6)));
    let err = select_with(&alone, Arch::Sm90, &k).unwrap_err().to_string();
    assert!(err.contains("(small_m_alt)"), "{err}");
    assert!(err.contains("lacks"), "{err}");
    let warp_fields = format!(
        r#"{{ "arch": "sm90", "configs": {{ "gemm_bias": {{ {large}, {small}, {} }} }} }}"#,
        r#""small_m_alt": { "bm": 128, "bn": 128, "bk": 64, "warp_m": 64, "stages": 6 }"#
    );
    let err = TunedTable::parse("kernels/tuned/sm90.json", &warp_fields)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `warp_m`"), "{err}");
    let fine = sm90_gemm_bias_table(&format!("{{ {large}, {small}, {} }}", alt(6)));
    let config = select_with(&fine, Arch::Sm90, &k).unwrap();
    assert_eq!(
        config.small_m_alt.map(|t| (t.bm, t.bn, t.stages)),
        Some((128, 128, 6))
    );
}

#[test]
fn small_m_needs_its_threshold() {
    let table = sm90_gemm_bias_table(
        r#"{ "large": { "bm": 128, "bn": 256, "bk": 64, "stages": 3 },
             "small_m": { "bm": 64, "bn": 128, "bk": 64, "stages": 8 } }"#,
    );
    let err = select_with(&table, Arch::Sm90, &kernel("gemm_bias", DType::F16, false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("(small_m)"), "{err}");
    assert!(err.contains("the largest M it serves"), "{err}");
}

#[test]
fn a_table_lists_the_compositions_that_lose_to_their_split() {
    let json = r#"{ "arch": "sm90", "configs": {
        "default": { "large": { "bm": 128, "bn": 256, "bk": 64, "stages": 4 } } },
        "unfused": { "gemm_bias_residual": { "reason": "0.9 of cuBLASLt", "min_n": 1024, "max_k": 4096 } } }"#;
    let table = TunedTable::parse("t.json", json).unwrap();
    assert_eq!(
        table.unfused,
        [crate::fuse::SplitRule {
            composition: "gemm_bias_residual".to_owned(),
            n: crate::fuse::DimBounds {
                min: Some(1024),
                max: None
            },
            k: crate::fuse::DimBounds {
                min: None,
                max: Some(4096)
            },
            reason: "0.9 of cuBLASLt".to_owned(),
            origin: "t.json".to_owned(),
        }]
    );
    for bad in [
        r#""gemm": { "reason": "x" }"#,
        r#""gemm_bias": { "reason": "x", "max_m": 3 }"#,
        r#""gemm_bias": { }"#,
    ] {
        let json = format!(r#"{{ "arch": "sm90", "configs": {{}}, "unfused": {{ {bad} }} }}"#);
        let err = TunedTable::parse("t.json", &json).unwrap_err().to_string();
        assert!(err.starts_with("t.json: "), "{err}");
    }
    // The shipped tables measured no fusion slower than its split.
    for arch in Arch::ALL {
        assert_eq!(TunedTable::shipped(arch).unwrap().unfused, []);
    }
}

#[test]
fn the_decode_kernel_runs_for_small_m_on_nk_kernels_of_sm80_and_sm90() {
    let k = kernel("gemm_bias_gelu", DType::F16, false);
    // sm90's crossover measured on an H200 at the kernel's row limit;
    // sm80's is that limit, unmeasured.
    for (arch, max_m) in [(Arch::Sm80, 16), (Arch::Sm90, 16)] {
        let config = select(arch, &k).unwrap();
        assert_eq!(config.decode_max_m, Some(max_m), "{arch}");
        assert_eq!(config.decode_for(WeightLayout::NK), Some(max_m), "{arch}");
        // [K, N] weights run the tiles at every M.
        assert_eq!(config.decode_for(WeightLayout::KN), None, "{arch}");
    }
    assert_eq!(select(Arch::Sm75, &k).unwrap().decode_max_m, None);
    // sm80's norm entries keep the tiles at every M.
    let norm = select(Arch::Sm80, &kernel("rmsnorm_gemm", DType::F16, true)).unwrap();
    assert_eq!(norm.decode_max_m, None);
}

#[test]
fn decode_max_m_is_refused_on_sm75_and_at_zero() {
    let table = |arch: &str, large: &str, max_m: u32| {
        let json = format!(
            r#"{{ "arch": "{arch}", "configs": {{ "default": {{ "large": {large}, "decode_max_m": {max_m} }} }} }}"#
        );
        TunedTable::parse(&format!("kernels/tuned/{arch}.json"), &json).unwrap()
    };
    let sm75_tile = r#"{ "bm": 128, "bn": 128, "bk": 32, "warp_m": 64, "warp_n": 64, "stages": 2, "min_blocks_per_sm": 1 }"#;
    let sm90_tile = r#"{ "bm": 128, "bn": 256, "bk": 64, "stages": 4 }"#;
    let gemm = kernel("gemm", DType::F16, false);
    let err = select_with(&table("sm75", sm75_tile, 16), Arch::Sm75, &gemm)
        .unwrap_err()
        .to_string();
    assert!(err.contains("(decode_max_m)"), "{err}");
    assert!(err.contains("sm75 has no decode kernel"), "{err}");
    let err = select_with(&table("sm90", sm90_tile, 0), Arch::Sm90, &gemm)
        .unwrap_err()
        .to_string();
    assert!(err.contains("at least 1"), "{err}");
    let ok = select_with(&table("sm90", sm90_tile, 8), Arch::Sm90, &gemm).unwrap();
    assert_eq!(ok.decode_max_m, Some(8));
}

#[test]
fn a_cluster_is_an_sm90_field_written_only_when_set() {
    let one = TileConfig::sm90(128, 256, 4, None);
    let clustered = TileConfig {
        fields: Fields::Sm90(sm90::Fields {
            cluster_m: 2,
            ..*one.sm90_fields().unwrap()
        }),
        ..one
    };
    assert_eq!(
        clustered.summary(),
        "128x256x64 (4 stages, cooperative, persistent, 2-CTA clusters)"
    );
    assert_eq!(
        clustered.cpp_type(),
        "fusion::sm90::TileConfig<128, 256, 4, fusion::sm90::Schedule::Cooperative, 2>"
    );
    // One CTA keeps the template's default, so a table without the field
    // renders as before.
    assert_eq!(
        one.cpp_type(),
        "fusion::sm90::TileConfig<128, 256, 4, fusion::sm90::Schedule::Cooperative>"
    );
    let k = kernel("gemm_bias_gelu", DType::F16, false);
    clustered.check(Arch::Sm90, k.gated).unwrap();
    assert!(
        serde_json::to_string(&clustered)
            .unwrap()
            .contains(r#""cluster_m":2"#)
    );
    assert!(!serde_json::to_string(&one).unwrap().contains("cluster_m"));
    let json = r#"{ "arch": "sm80", "configs": { "default": { "large":
        { "bm": 128, "bn": 128, "bk": 32, "warp_m": 64, "warp_n": 64, "stages": 3, "min_blocks_per_sm": 1, "cluster_m": 2 } } } }"#;
    let err = TunedTable::parse("t.json", json).unwrap_err().to_string();
    assert!(err.contains("t.json: unknown field `cluster_m`"), "{err}");
}
