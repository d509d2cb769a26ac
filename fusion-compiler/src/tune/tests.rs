use super::*;
use crate::ir::DType;
use crate::select::{ConfigSource, KernelConfig, Schedule, TunedTable, check_config};

/// Compute capability 9.0's limits, from the CUDA programming guide's
/// table of per-capability limits (what an H100 or H200 reports).
const CC90: DeviceLimits = DeviceLimits {
    smem_optin_per_block: 227 * 1024,
    max_threads_per_block: 1024,
    registers_per_block: 64 * 1024,
    max_blocks_per_sm: 32,
};

fn kernel(name: &str, dtype: DType, layout: WeightLayout, source_tile: bool) -> KernelKind {
    KernelKind::plain(name, dtype, layout, source_tile)
}

fn gemm(dtype: DType) -> KernelKind {
    kernel("gemm_bias_gelu", dtype, WeightLayout::NK, false)
}

/// Every kernel shape that selects differently: both layouts, with and
/// without a source tile, each dtype the arch takes.
fn kinds(arch: Arch) -> Vec<KernelKind> {
    let mut kinds = Vec::new();
    for dtype in [DType::F16, DType::BF16]
        .into_iter()
        .filter(|d| arch.supports(*d))
    {
        for layout in [WeightLayout::KN, WeightLayout::NK] {
            kinds.push(kernel("gemm_bias_gelu", dtype, layout, false));
            kinds.push(kernel("gemm_bias_residual", dtype, layout, true));
        }
    }
    kinds
}

#[test]
fn every_shipped_tile_is_in_its_targets_space() {
    for arch in Arch::ALL {
        let space: Vec<TileConfig> = (arch.target().tile_space)();
        let table = TunedTable::shipped(arch).unwrap();
        for (entry, config) in &table.configs {
            let tiles = [Some(config.large), config.small_m, config.small_m_alt];
            for tile in tiles.into_iter().flatten() {
                assert!(
                    space.contains(&tile),
                    "{}, entry `{entry}`: {} is not in {arch}'s tile space",
                    table.file,
                    tile.summary()
                );
            }
        }
    }
}

#[test]
fn every_candidate_passes_the_check_of_the_shipped_tables() {
    for arch in Arch::ALL {
        for kind in kinds(arch) {
            let space = search_space(arch, &kind, Some(&CC90));
            assert!(!space.candidates.is_empty(), "{space}");
            let source = ConfigSource {
                file: "search space".into(),
                entry: kind.name.clone(),
            };
            for tile in &space.candidates {
                let config = KernelConfig {
                    large: *tile,
                    small_m: None,
                    small_m_max: None,
                    small_m_alt: None,
                    large_alt: None,
                    decode_max_m: None,
                    by_m: None,
                    few_m: None,
                };
                check_config(&config, &source, arch, &kind).unwrap();
            }
        }
    }
}

#[test]
fn with_room_for_every_block_nothing_is_pruned_before_the_compile() {
    for arch in Arch::ALL {
        let space = search_space(arch, &gemm(DType::F16), Some(&CC90));
        assert_eq!(space.pruned, BTreeMap::new());
        assert_eq!(space.candidates.len(), (arch.target().tile_space)().len());
        assert_eq!(space.unchecked, AFTER_SEARCH);
    }
}

#[test]
fn sm75_has_no_bf16_candidates() {
    let space = search_space(Arch::Sm75, &gemm(DType::BF16), Some(&CC90));
    assert!(space.candidates.is_empty());
    let size = (Arch::Sm75.target().tile_space)().len();
    assert_eq!(space.pruned, BTreeMap::from([(PruneReason::Dtype, size)]));
    assert_eq!(space.total(), size);
    assert!(space.unchecked.is_empty());
    assert_eq!(
        space.to_string(),
        "gemm_bias_gelu bf16 [N, K] on sm75: 32 candidates, 32 pruned: dtype → 32"
    );
}

#[test]
fn a_config_over_the_devices_blocks_per_sm_is_counted_under_its_reason() {
    let one_block = DeviceLimits {
        max_blocks_per_sm: 1,
        ..CC90
    };
    let space = search_space(Arch::Sm80, &gemm(DType::F16), Some(&one_block));
    let over = (Arch::Sm80.target().tile_space)()
        .iter()
        .filter(|t| t.blocks_per_sm() > 1)
        .count();
    assert!(over > 0);
    assert_eq!(space.pruned, BTreeMap::from([(PruneReason::BlocksPerSm, over)]));
    assert!(space.candidates.iter().all(|t| t.blocks_per_sm() == 1));
    assert_eq!(space.total(), (Arch::Sm80.target().tile_space)().len());
    // The sm90 mainloop runs one block per SM and gives no blocks per SM.
    let sm90 = search_space(Arch::Sm90, &gemm(DType::F16), Some(&one_block));
    assert_eq!(sm90.pruned, BTreeMap::new());
}

#[test]
fn without_device_limits_their_checks_are_left_unchecked() {
    let space = search_space(Arch::Sm80, &gemm(DType::F16), None);
    assert_eq!(space.pruned, BTreeMap::new());
    assert_eq!(space.candidates.len(), (Arch::Sm80.target().tile_space)().len());
    assert_eq!(
        space.unchecked,
        [&[PruneReason::BlocksPerSm], AFTER_SEARCH].concat()
    );
    assert!(
        space
            .to_string()
            .ends_with("not yet checked: blocks per SM, compile, shared memory, threads, registers")
    );
}

#[test]
fn a_config_the_targets_check_refuses_is_counted_under_fields() {
    // sm90 tiles in sm80's space: the sm80 check refuses each of them.
    let space = [
        (Arch::Sm80.target().tile_space)(),
        (Arch::Sm90.target().tile_space)(),
    ]
    .concat();
    let result = search(&space, Arch::Sm80, &gemm(DType::F16), Some(&CC90));
    assert_eq!(
        result.pruned,
        BTreeMap::from([(PruneReason::Fields, (Arch::Sm90.target().tile_space)().len())])
    );
    assert!(result.candidates.iter().all(|t| t.arch() == Arch::Sm80));
}

#[test]
fn the_search_is_deterministic_and_its_report_says_what_was_pruned() {
    let one_block = DeviceLimits {
        max_blocks_per_sm: 1,
        ..CC90
    };
    let first = search_space(Arch::Sm80, &gemm(DType::F16), Some(&one_block));
    assert_eq!(
        first,
        search_space(Arch::Sm80, &gemm(DType::F16), Some(&one_block))
    );
    assert_eq!(
        first.to_string(),
        "gemm_bias_gelu f16 [N, K] on sm80: 1152 candidates, 768 pruned: blocks per SM → 768; \
         not yet checked: compile, shared memory, threads, registers"
    );
    assert_eq!(
        search_space(Arch::Sm90, &gemm(DType::F16), Some(&CC90)).to_string(),
        "gemm_bias_gelu f16 [N, K] on sm90: 168 candidates, 0 pruned; \
         not yet checked: compile, shared memory, threads, registers"
    );
}

#[test]
fn the_space_lists_each_combination_once_last_field_fastest() {
    let tiles: Vec<TileConfig> = (Arch::Sm90.target().tile_space)();
    assert_eq!(tiles.len(), 2 * 3 * 7 * 2 * 2);
    assert_eq!(
        tiles[0],
        TileConfig::sm90(64, 128, 2, Some(Schedule::Cooperative))
    );
    assert_eq!(tiles[1], TileConfig::sm90(64, 128, 2, Some(Schedule::PingPong)));
    assert_eq!(
        tiles[2],
        TileConfig::sm90(64, 128, 3, Some(Schedule::Cooperative))
    );
    assert_eq!(tiles[83], TileConfig::sm90(128, 256, 8, Some(Schedule::PingPong)));
    // The cluster field varies slowest: the same tiles again in 2-CTA
    // clusters.
    let clustered = |tile: TileConfig| TileConfig {
        fields: crate::target::Fields::Sm90(crate::target::sm90::Fields {
            cluster_m: 2,
            ..*tile.sm90_fields().unwrap()
        }),
        ..tile
    };
    assert_eq!(tiles[84], clustered(tiles[0]));
    assert_eq!(tiles[167], clustered(tiles[83]));
    let distinct: std::collections::HashSet<_> = tiles.iter().collect();
    assert_eq!(distinct.len(), tiles.len());
}

#[test]
fn a_compiled_candidate_is_held_against_the_device() {
    let fits = TileResources {
        smem_bytes: 227 * 1024,
        threads: 384,
        registers_per_thread: Some(168),
    };
    assert_eq!(check_resources(&fits, &CC90), Ok(()));
    let cases = [
        (
            TileResources {
                smem_bytes: 227 * 1024 + 1,
                ..fits
            },
            PruneReason::SharedMemory,
        ),
        (
            TileResources {
                threads: 1056,
                registers_per_thread: None,
                ..fits
            },
            PruneReason::Threads,
        ),
        (
            TileResources {
                registers_per_thread: Some(255),
                ..fits
            },
            PruneReason::Registers,
        ),
    ];
    for (resources, reason) in cases {
        assert_eq!(check_resources(&resources, &CC90), Err(reason), "{resources:?}");
    }
}
