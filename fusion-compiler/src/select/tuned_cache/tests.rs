use super::*;
use crate::select::Schedule;
use std::path::PathBuf;

/// A fresh directory for one test (`tag` names it).
fn scratch(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusion-tuned-cache-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn sm90_tile(bm: u32, bn: u32, stages: u32) -> TileConfig {
    TileConfig::sm90(bm, bn, stages, Some(Schedule::Cooperative))
}

fn key(composition: &str, bucket: &str) -> CacheKey {
    CacheKey {
        composition: composition.to_owned(),
        dtype: DType::F16,
        layout: WeightLayout::NK,
        n: 3000,
        k: 1000,
        arch: Arch::Sm90,
        bucket: MBucket::parse(bucket).unwrap(),
    }
}

fn entry(tile: TileConfig, time_us: f64) -> CacheEntry {
    CacheEntry {
        tile,
        time_us,
        default_time_us: 50.0,
        cublaslt_time_us: 45.0,
        gpu: "NVIDIA H200".to_owned(),
        driver: "580.65.06".to_owned(),
        nvcc: "13.0.48".to_owned(),
        date: "2026-12-01".to_owned(),
    }
}

fn gemm_bias_gelu() -> KernelKind {
    KernelKind {
        name: "gemm_bias_gelu".to_owned(),
        dtype: DType::F16,
        layout: WeightLayout::NK,
        prologue: false,
        source_tile: false,
        gated: false,
    }
}

/// The shipped sm90 default, whose `decode_max_m` a cached config keeps.
fn shipped() -> KernelConfig {
    crate::select::select(Arch::Sm90, &gemm_bias_gelu()).unwrap()
}

#[test]
fn m_buckets_cover_every_m_once_and_parse_back_from_their_names() {
    let names: Vec<String> = MBucket::all().map(|b| b.to_string()).collect();
    assert_eq!(
        names,
        [
            "m<=16", "m<=64", "m<=128", "m<=256", "m<=512", "m<=1024", "m<=2048", "m<=4096", "m>4096"
        ]
    );
    for bucket in MBucket::all() {
        assert_eq!(MBucket::parse(&bucket.to_string()), Some(bucket));
    }
    for (m, name) in [
        (1, "m<=16"),
        (16, "m<=16"),
        (17, "m<=64"),
        (4096, "m<=4096"),
        (4097, "m>4096"),
    ] {
        assert_eq!(MBucket::of(m).to_string(), name, "m = {m}");
    }
    assert_eq!(MBucket::parse("m<=100"), None);
}

#[test]
fn keys_print_and_parse_back() {
    let key = key("rmsnorm_gemm_silu_glu", "m<=128");
    assert_eq!(
        key.to_string(),
        "rmsnorm_gemm_silu_glu.f16.nk.n3000.k1000.sm90.m<=128"
    );
    assert_eq!(CacheKey::parse(&key.to_string()), Ok(key));
    for (text, reason) in [
        ("gemm.f16.nk.n3000.k1000.sm90", "a key is"),
        ("gemm.f64.nk.n3000.k1000.sm90.m<=16", "unknown dtype `f64`"),
        ("gemm.f16.nn.n3000.k1000.sm90.m<=16", "unknown weight layout `nn`"),
        ("gemm.f16.nk.n0.k1000.sm90.m<=16", "`n0` is not"),
        ("gemm.f16.nk.n3000.k1000.sm70.m<=16", "unknown arch `sm70`"),
        ("gemm.f16.nk.n3000.k1000.sm90.m<=100", "unknown M bucket `m<=100`"),
    ] {
        let err = CacheKey::parse(text).unwrap_err();
        assert!(err.starts_with(reason), "{text}: {err}");
    }
}

#[test]
fn a_written_cache_reads_back_whole() {
    let dir = scratch("round-trip");
    let path = dir.join("tuned.json");
    let entries: IndexMap<CacheKey, CacheEntry> = [
        (
            key("gemm_bias_gelu", "m<=128"),
            entry(sm90_tile(64, 128, 8), 20.5),
        ),
        (
            key("gemm_bias_gelu", "m>4096"),
            entry(sm90_tile(128, 256, 4), 410.0),
        ),
        (
            key("layernorm_gemm_bias_gelu_erf", "m<=512"),
            entry(sm90_tile(128, 128, 6), 61.25),
        ),
    ]
    .into_iter()
    .collect();
    TunedCache::write(&path, &entries).unwrap();
    let read = TunedCache::read(&path);
    assert_eq!(read.warnings, Vec::<String>::new());
    assert_eq!(read.file, path.display().to_string());
    assert_eq!(read.entries.len(), 3);
    for (key, entry) in &entries {
        assert_eq!(read.entries.get(key), Some(entry), "{key}");
    }
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(
        text.contains("\"gemm_bias_gelu.f16.nk.n3000.k1000.sm90.m<=128\": {"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Each write keeps what the file had (an interrupted run resumes from
/// it), entries this version cannot read included; a key written again is
/// replaced; no temporary file is left; a file that is not a cache is not
/// overwritten.
/// Writers at once, each merging its own bucket's entry several times:
/// with the lock every entry survives (without it, a writer renaming a
/// merge read before another's rename drops that one's entry).
#[test]
fn concurrent_writers_keep_each_others_entries() {
    let dir = scratch("concurrent");
    let path = dir.join("tuned.json");
    let buckets: Vec<MBucket> = MBucket::all().collect();
    std::thread::scope(|scope| {
        for &bucket in &buckets {
            let path = &path;
            scope.spawn(move || {
                for round in 0..5 {
                    let key = CacheKey {
                        bucket,
                        ..key("gemm", "m<=16")
                    };
                    let entries: IndexMap<_, _> =
                        [(key, entry(sm90_tile(64, 128, 8), 30.0 + f64::from(round)))].into();
                    TunedCache::write(path, &entries).unwrap();
                }
            });
        }
    });
    let read = TunedCache::read(&path);
    assert!(read.warnings.is_empty(), "{:?}", read.warnings);
    assert_eq!(read.entries.len(), buckets.len());
    assert!(read.entries.values().all(|e| e.time_us == 34.0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn writes_merge_with_the_file_and_replace_it_whole() {
    let dir = scratch("merge");
    let path = dir.join("tuned.json");
    let first: IndexMap<_, _> = [(key("gemm", "m<=128"), entry(sm90_tile(64, 128, 8), 30.0))].into();
    TunedCache::write(&path, &first).unwrap();
    // An entry of a later version (a composition this one lacks) survives.
    let text = std::fs::read_to_string(&path).unwrap().replacen(
        "\"entries\": {",
        "\"entries\": {\n    \"gemm_softcap.f16.nk.n3000.k1000.sm90.m<=16\": { \"tile\": {} },",
        1,
    );
    std::fs::write(&path, text).unwrap();
    let second: IndexMap<_, _> = [
        (key("gemm", "m>4096"), entry(sm90_tile(128, 256, 4), 400.0)),
        (key("gemm", "m<=128"), entry(sm90_tile(128, 128, 6), 25.0)),
    ]
    .into();
    TunedCache::write(&path, &second).unwrap();
    let read = TunedCache::read(&path);
    assert_eq!(read.entries.len(), 2);
    assert_eq!(read.entries[&key("gemm", "m<=128")].tile, sm90_tile(128, 128, 6));
    assert_eq!(read.entries[&key("gemm", "m>4096")].time_us, 400.0);
    assert!(
        std::fs::read_to_string(&path)
            .unwrap()
            .contains("gemm_softcap.f16.nk.n3000.k1000.sm90.m<=16")
    );
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    files.sort();
    assert_eq!(
        files,
        [".tuned.json.lock", "tuned.json"],
        "no temporary file is left"
    );

    std::fs::write(&path, "{ not json").unwrap();
    let err = TunedCache::write(&path, &first).unwrap_err();
    assert!(err.to_string().contains("not overwriting it"), "{err}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "{ not json");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_missing_or_malformed_file_is_one_warning_naming_it_and_an_empty_cache() {
    let dir = scratch("malformed");
    let path = dir.join("tuned.json");
    let file = path.display().to_string();
    for (text, says) in [
        (None, "cannot read the tuned cache"),
        (Some("{ \"version\": 1, \"entries\": "), "is not a tuned cache"),
        (Some("{ \"version\": 7, \"entries\": {} }"), "of version 7"),
    ] {
        if let Some(text) = text {
            std::fs::write(&path, text).unwrap();
        }
        let cache = TunedCache::read(&path);
        assert!(cache.entries.is_empty());
        assert_eq!(cache.warnings.len(), 1, "{:?}", cache.warnings);
        let warning = &cache.warnings[0];
        assert!(warning.contains(&file) && warning.contains(says), "{warning}");
        assert!(
            warning.ends_with("the shipped tuned tables serve every kernel"),
            "{warning}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// An entry the arch's checks reject, or of a composition no kernel has,
/// is a warning naming the file and the key; its kernel keeps the shipped
/// table's config in every bucket, while other kernels' entries are used.
#[test]
fn stale_entries_are_warnings_naming_the_key_and_their_kernel_falls_back() {
    let dir = scratch("stale");
    let path = dir.join("tuned.json");
    // An sm80 tile under an sm90 key: written with its warp tile, which an
    // sm90 tile does not have.
    let warp_tiled = TileConfig {
        bk: 32,
        fields: crate::target::Fields::Sm80(crate::target::sm80::Fields {
            warp_m: 64,
            warp_n: 64,
            min_blocks_per_sm: 1,
            pipelined: false,
            staged_store: false,
        }),
        ..sm90_tile(128, 128, 4)
    };
    let entries: IndexMap<_, _> = [
        (key("gemm_bias_gelu", "m<=128"), entry(warp_tiled, 20.0)),
        (
            key("gemm_bias_gelu", "m>4096"),
            entry(sm90_tile(128, 256, 4), 400.0),
        ),
        (
            key("gemm_frobnicate", "m<=128"),
            entry(sm90_tile(64, 128, 8), 20.0),
        ),
        (key("gemm", "m<=128"), entry(sm90_tile(64, 128, 8), 20.0)),
    ]
    .into();
    TunedCache::write(&path, &entries).unwrap();
    let cache = TunedCache::read(&path);
    let file = path.display().to_string();
    assert_eq!(cache.warnings.len(), 2, "{:?}", cache.warnings);
    let warned = |key: &str, reason: &str| {
        let prefix = format!("{file}, entry `{key}`: ");
        assert!(
            cache
                .warnings
                .iter()
                .any(|w| w.starts_with(&prefix) && w.contains(reason)),
            "no warning `{prefix}...{reason}` in {:?}",
            cache.warnings
        );
    };
    warned(
        "gemm_bias_gelu.f16.nk.n3000.k1000.sm90.m<=128",
        // The first of the warp tile's fields in the file's order.
        "unknown field `min_blocks_per_sm`",
    );
    warned(
        "gemm_frobnicate.f16.nk.n3000.k1000.sm90.m<=128",
        "unknown composition `gemm_frobnicate`",
    );
    assert!(cache.warnings[0].ends_with("keeps the shipped tuned table's config"));
    // The valid m>4096 entry of the rejected kernel is not used alone.
    assert_eq!(
        cache.config_for(Arch::Sm90, &gemm_bias_gelu(), 3000, 1000, &shipped()),
        None
    );
    let mut gemm = gemm_bias_gelu();
    gemm.name = "gemm".to_owned();
    assert!(
        cache
            .config_for(Arch::Sm90, &gemm, 3000, 1000, &shipped())
            .is_some()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A cache of gemm_bias_gelu entries at (3000, 1000) on sm90, one per bucket.
fn cache_of(buckets: &[(&str, TileConfig)]) -> TunedCache {
    TunedCache {
        file: "tuned.json".to_owned(),
        entries: buckets
            .iter()
            .map(|&(bucket, tile)| (key("gemm_bias_gelu", bucket), entry(tile, 10.0)))
            .collect(),
        ..TunedCache::default()
    }
}

/// The buckets become the unit's tiers: the largest bucket's tile for every
/// M above the small tier, the small tier up to the largest bucket that
/// chose another tile, its two tiles ordered by rows; `decode_max_m` stays
/// the shipped one.
#[test]
fn buckets_map_onto_the_large_and_small_m_tiers() {
    let (large, wide, narrow) = (
        sm90_tile(128, 256, 4),
        sm90_tile(128, 128, 6),
        sm90_tile(64, 128, 8),
    );
    let kind = gemm_bias_gelu();
    let shipped = shipped();
    assert_eq!(shipped.decode_max_m, Some(16));

    let cache = cache_of(&[
        ("m>4096", large),
        ("m<=64", narrow),
        ("m<=128", narrow),
        ("m<=512", wide),
        ("m<=1024", large),
    ]);
    let (config, source) = cache.config_for(Arch::Sm90, &kind, 3000, 1000, &shipped).unwrap();
    assert_eq!(
        config,
        KernelConfig {
            large,
            small_m: Some(narrow),
            small_m_max: Some(512),
            small_m_alt: Some(wide),
            // The shipped narrower tile is not one the tuner measured here.
            large_alt: None,
            decode_max_m: Some(16),
            by_m: None,
            few_m: None,
        }
    );
    assert!(shipped.large_alt.is_some());
    assert_eq!(source.file, "tuned.json");
    assert_eq!(
        source.entry,
        "gemm_bias_gelu.f16.nk.n3000.k1000.sm90.{m<=64,m<=128,m<=512,m<=1024,m>4096}"
    );

    // One tile everywhere: no small tier.
    let (config, _) = cache_of(&[("m<=128", large), ("m>4096", large)])
        .config_for(Arch::Sm90, &kind, 3000, 1000, &shipped)
        .unwrap();
    assert_eq!(
        (config.large, config.small_m, config.small_m_max),
        (large, None, None)
    );

    // Two small tiles of the same rows: the one most buckets chose.
    let other_narrow = sm90_tile(64, 256, 4);
    let (config, _) = cache_of(&[
        ("m<=64", narrow),
        ("m<=128", narrow),
        ("m<=256", other_narrow),
        ("m>4096", large),
    ])
    .config_for(Arch::Sm90, &kind, 3000, 1000, &shipped)
    .unwrap();
    assert_eq!(
        (config.small_m, config.small_m_alt, config.small_m_max),
        (Some(narrow), None, Some(256))
    );

    // Another shape, arch or dtype has no entries.
    let cache = cache_of(&[("m>4096", large)]);
    assert!(
        cache
            .config_for(Arch::Sm90, &kind, 3000, 1024, &shipped)
            .is_none()
    );
    assert!(
        cache
            .config_for(Arch::Sm80, &kind, 3000, 1000, &shipped)
            .is_none()
    );
    let mut bf16 = kind.clone();
    bf16.dtype = DType::BF16;
    assert!(
        cache
            .config_for(Arch::Sm90, &bf16, 3000, 1000, &shipped)
            .is_none()
    );
}

/// Ms no bucket measured keep the shipped tiers where they can: a cache of
/// large Ms alone keeps the shipped small tier, one of small Ms alone keeps
/// the shipped large tile above them.
#[test]
fn ms_the_cache_did_not_measure_keep_the_shipped_tiers() {
    let config_of = |buckets: &[(&str, TileConfig)]| {
        cache_of(buckets)
            .config_for(Arch::Sm90, &gemm_bias_gelu(), 3000, 1000, &shipped())
            .unwrap()
            .0
    };
    let shipped = shipped();
    let shipped_max = shipped.small_m_max.expect("the sm90 table has a small tier");
    let (other_large, narrow) = (sm90_tile(128, 128, 5), sm90_tile(64, 128, 8));
    assert_ne!(other_large, shipped.large);

    // Only above the shipped small tier: that tier stays below the buckets.
    let above = MBucket::all()
        .find(|b| b.min_m() > shipped_max)
        .unwrap()
        .to_string();
    let config = config_of(&[(above.as_str(), other_large), ("m>4096", other_large)]);
    assert_eq!(config.large, other_large);
    assert_eq!(
        (config.small_m, config.small_m_alt, config.small_m_max),
        (shipped.small_m, shipped.small_m_alt, shipped.small_m_max)
    );

    // Only small Ms: the shipped large tile above them, the measured tile
    // for the whole shipped small tier.
    let config = config_of(&[("m<=64", narrow)]);
    assert_eq!(config.large, shipped.large);
    assert_eq!(
        (config.small_m, config.small_m_alt, config.small_m_max),
        (Some(narrow), None, Some(shipped_max.max(64)))
    );

    // A bounded top bucket that chose the shipped large tile ends the small
    // tier where it was measured.
    let config = config_of(&[("m<=64", narrow), ("m<=1024", shipped.large)]);
    assert_eq!(config.large, shipped.large);
    assert_eq!((config.small_m, config.small_m_max), (Some(narrow), Some(64)));

    // Measured inside the shipped small tier with one tile: no small tier.
    let config = config_of(&[("m<=128", other_large), ("m>4096", other_large)]);
    assert_eq!((config.large, config.small_m), (other_large, None));
}

/// A cached config keeps the shipped few-M tile where none of its buckets
/// holds an M that tile runs (two rows of 64: up to 128), and drops it
/// where one does: those Ms run the tile the tuner measured.
#[test]
fn a_cached_config_keeps_the_few_m_tile_only_above_its_ms() {
    let (large, few) = (sm90_tile(128, 256, 4), sm90_tile(64, 64, 8));
    let kind = gemm_bias_gelu();
    let shipped = KernelConfig {
        few_m: Some(few),
        ..shipped()
    };
    let above = cache_of(&[("m<=256", large), ("m>4096", large)]);
    let (config, _) = above.config_for(Arch::Sm90, &kind, 3000, 1000, &shipped).unwrap();
    assert_eq!(config.few_m, Some(few));
    let measured = cache_of(&[("m<=128", large), ("m>4096", large)]);
    let (config, _) = measured
        .config_for(Arch::Sm90, &kind, 3000, 1000, &shipped)
        .unwrap();
    assert_eq!(config.few_m, None);
}
