use super::*;

fn kernel(name: &str, dtype: DType, prologue: bool) -> KernelKind {
    KernelKind {
        name: name.to_owned(),
        dtype,
        layout: WeightLayout::NK,
        prologue,
    }
}

#[test]
fn shipped_tables_parse_and_fit_their_arch() {
    for arch in Arch::ALL {
        let table = TunedTable::shipped(arch).unwrap();
        assert_eq!(table.arch, arch);
        for dtype in [DType::F16, DType::BF16]
            .into_iter()
            .filter(|d| arch.supports(*d))
        {
            for layout in [WeightLayout::NK, WeightLayout::KN] {
                for prologue in [false, true] {
                    let k = KernelKind {
                        layout,
                        ..kernel("layernorm_gemm_bias_gelu", dtype, prologue)
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
    let pipelined = |bm, bn, bk, warp_m, warp_n, stages, min_blocks_per_sm| TileConfig {
        bm,
        bn,
        bk,
        warp_m,
        warp_n,
        stages,
        min_blocks_per_sm,
        pipelined: true,
        staged_store: false,
    };
    let small = pipelined(64, 128, 32, 32, 64, 4, 3);
    assert_eq!(sm80.large, pipelined(128, 128, 32, 64, 64, 4, 2));
    assert_eq!(sm80.small(), Some((small, 512)));
    let sm90 = select(Arch::Sm90, &k).unwrap();
    let staged = TileConfig {
        staged_store: true,
        ..pipelined(128, 256, 64, 64, 64, 3, 1)
    };
    assert_eq!(sm90.large, staged);
    assert_eq!(sm90.small(), Some((small, 512)));
    // Norm prologues keep the per-stage loop, which does not spill with them.
    let norm = select(Arch::Sm80, &kernel("rmsnorm_gemm", DType::F16, true)).unwrap();
    assert_eq!(norm.large, TileConfig::TILE_128X128);
    assert_eq!(select(Arch::Sm75, &k).unwrap().large, TileConfig::SM75_128X128);
    assert_eq!(select(Arch::Sm75, &k).unwrap().small(), None);
}

#[test]
fn smem_mirrors_the_mainloops() {
    // 4 stages x (128x32 + 256x32) x 2 bytes = 96 KB, as sm80/mainloop.cuh says.
    let big = TileConfig::TILE_128X256;
    assert_eq!(
        big.smem_bytes(Mainloop::Sm80, DType::F16, WeightLayout::NK, false),
        96 * 1024
    );
    assert_eq!(
        big.smem_bytes(Mainloop::Sm80, DType::F16, WeightLayout::NK, true),
        96 * 1024 + 1024
    );
    // sm75: 2 x (128x40 + 128x40) x 2 bytes = 40 KB, as sm75/mainloop.cuh says.
    let sm75 = TileConfig::SM75_128X128;
    assert_eq!(
        sm75.smem_bytes(Mainloop::Sm75, DType::F16, WeightLayout::NK, false),
        40 * 1024
    );
}

#[test]
fn oversized_tuned_entry_is_rejected_with_file_and_entry() {
    let json = r#"{ "arch": "sm80", "configs": {
        "gemm_bias_gelu.f16": { "large": { "bm": 256, "bn": 256, "bk": 32, "warp_m": 64, "warp_n": 64,
                                           "stages": 4, "min_blocks_per_sm": 1 } } } }"#;
    let table = TunedTable::parse("kernels/tuned/sm80.json", json).unwrap();
    let err = select_with(&table, Arch::Sm80, &kernel("gemm_bias_gelu", DType::F16, false))
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("kernels/tuned/sm80.json, entry `gemm_bias_gelu.f16`"),
        "{err}"
    );
    assert!(
        err.contains("131072 bytes of shared memory per block; sm80 allows 101376"),
        "{err}"
    );
    // It fits sm90's 227 KB, but 16 warps of 64x64 tiles exceed the register file.
    let err = select_with(&table, Arch::Sm90, &kernel("gemm_bias_gelu", DType::F16, false))
        .unwrap_err()
        .to_string();
    assert!(err.contains("registers per thread"), "{err}");
    // Another composition falls through to the heuristic.
    let other = select_with(&table, Arch::Sm80, &kernel("gemm_bias", DType::F16, false)).unwrap();
    assert_eq!(other, heuristic(Arch::Sm80));
}

#[test]
fn lookup_prefers_the_most_specific_key() {
    let json = r#"{ "arch": "sm90", "configs": {
        "default": { "large": { "bm": 128, "bn": 128, "bk": 32, "warp_m": 64, "warp_n": 32, "stages": 3, "min_blocks_per_sm": 1 } },
        "gemm_silu": { "large": { "bm": 128, "bn": 128, "bk": 32, "warp_m": 64, "warp_n": 32, "stages": 4, "min_blocks_per_sm": 1 } },
        "gemm_silu.bf16": { "large": { "bm": 128, "bn": 128, "bk": 32, "warp_m": 64, "warp_n": 32, "stages": 5, "min_blocks_per_sm": 1 } } } }"#;
    let table = TunedTable::parse("t.json", json).unwrap();
    let stages = |name, dtype| table.lookup(name, dtype).map(|(_, c)| c.large.stages);
    assert_eq!(stages("gemm_silu", DType::BF16), Some(5));
    assert_eq!(stages("gemm_silu", DType::F16), Some(4));
    assert_eq!(stages("gemm", DType::F16), Some(3));
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
fn mainloop_constraints_are_checked() {
    let k = kernel("gemm", DType::F16, false);
    let three_stages = TileConfig {
        stages: 3,
        ..TileConfig::SM75_128X128
    };
    assert!(
        three_stages
            .check(Arch::Sm75, &k)
            .unwrap_err()
            .contains("stages must be 2")
    );
    let odd_warp = TileConfig {
        warp_n: 24,
        bn: 96,
        ..TileConfig::TILE_128X128
    };
    assert!(
        odd_warp
            .check(Arch::Sm80, &k)
            .unwrap_err()
            .contains("multiples of 16")
    );
    let bk48 = TileConfig {
        bk: 48,
        ..TileConfig::TILE_128X128
    };
    assert!(bk48.check(Arch::Sm80, &k).is_err());
}
