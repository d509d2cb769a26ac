use super::*;
use crate::select::TunedTable;
use std::path::Path;

/// The workspace root, which holds the root crate's `Cargo.toml`.
fn workspace() -> &'static Path {
    crate_dir().parent().unwrap()
}

/// fusion-compiler's own folder, which holds the headers and the tuned tables.
fn crate_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn every_generation_has_its_feature_headers_and_table() {
    let manifest = std::fs::read_to_string(workspace().join("Cargo.toml")).unwrap();
    let manifest: toml::Table = toml::from_str(&manifest).unwrap();
    let features = manifest["features"].as_table().unwrap();
    for arch in Arch::ALL {
        let target = arch.target();
        assert_eq!(target.arch, arch);
        assert!(
            features.contains_key(target.arch.name()),
            "the root Cargo.toml has no feature `{}`",
            target.arch.name()
        );
        let header = crate_dir().join("kernels/include").join(target.mainloop_header);
        assert!(header.is_file(), "{} is missing", header.display());
        assert!(
            target
                .mainloop_type
                .starts_with(&format!("fusion::{}::", target.arch.name()))
        );
        // The tile rules each unit asserts, as codegen names them.
        let folder = header.parent().unwrap();
        let declares_tile_valid = std::fs::read_dir(folder).unwrap().any(|entry| {
            std::fs::read_to_string(entry.unwrap().path())
                .is_ok_and(|text| text.contains("constexpr bool tile_valid ="))
        });
        assert!(
            declares_tile_valid,
            "no header in {} declares `fusion::{}::tile_valid`",
            folder.display(),
            target.arch.name()
        );
        let file = TunedTable::shipped_file(arch);
        let on_disk = std::fs::read_to_string(crate_dir().join(&file)).unwrap();
        assert_eq!(on_disk, target.tuned_json, "{file} is not the embedded table");
        let table = TunedTable::shipped(arch).unwrap();
        assert!(
            table.configs.contains_key("default"),
            "{file} has no `default` entry, the fallback of every composition"
        );
    }
}

#[test]
fn generations_are_distinct_and_oldest_first() {
    let names: Vec<&str> = Arch::ALL.iter().map(|a| a.name()).collect();
    assert_eq!(names, ["sm75", "sm80", "sm90"]);
    assert!(Arch::ALL.is_sorted());
    for arch in Arch::ALL {
        assert_eq!(Arch::parse(arch.name()), Some(arch));
        assert_eq!(
            arch.cargo_feature_env(),
            format!("CARGO_FEATURE_{}", arch.name().to_uppercase())
        );
    }
    assert_eq!(Arch::parse("sm60"), None);
    assert_eq!(Arch::names_listed(), "sm75, sm80 or sm90");
}

#[test]
fn gencode_flags_keep_ptx_only_where_it_can_run_elsewhere() {
    let flags = |arch: Arch| (arch.target().gencode, arch.target().sass_gencode);
    assert_eq!(
        flags(Arch::Sm75),
        (
            "-gencode=arch=compute_75,code=[sm_75,compute_75]",
            "-gencode=arch=compute_75,code=sm_75"
        )
    );
    assert_eq!(
        flags(Arch::Sm80),
        (
            "-gencode=arch=compute_80,code=[sm_80,compute_80]",
            "-gencode=arch=compute_80,code=sm_80"
        )
    );
    assert_eq!(
        flags(Arch::Sm90),
        (
            "-gencode=arch=compute_90a,code=sm_90a",
            "-gencode=arch=compute_90a,code=sm_90a"
        )
    );
}

#[test]
fn code_runs_where_its_gencode_says() {
    // sm_90a machine code runs on 9.0 alone; sm80 and sm75 carry PTX.
    assert!(Arch::Sm90.runs_on(9, 0));
    assert!(!Arch::Sm90.runs_on(10, 0));
    assert!(!Arch::Sm90.runs_on(8, 9));
    assert!(Arch::Sm80.runs_on(12, 0) && Arch::Sm80.runs_on(8, 6));
    assert!(!Arch::Sm80.runs_on(7, 5));
    assert!(Arch::Sm75.runs_on(7, 5) && !Arch::Sm75.runs_on(7, 0));
}

#[test]
fn dtypes() {
    assert!(Arch::Sm75.supports(DType::F16) && !Arch::Sm75.supports(DType::BF16));
    for arch in [Arch::Sm80, Arch::Sm90] {
        assert!(arch.supports(DType::F16) && arch.supports(DType::BF16));
    }
    assert!(Arch::ALL.iter().all(|a| !a.supports(DType::F32)));
    // e4m3 only where wgmma multiplies it (the FP8 GEMM, FUSION_FP8=experimental).
    let fp8: Vec<Arch> = Arch::ALL
        .into_iter()
        .filter(|a| a.supports(DType::F8E4M3))
        .collect();
    assert_eq!(fp8, [Arch::Sm90]);
}

#[test]
fn a_build_takes_its_generations_from_fusion_archs_or_cuda_compute_cap() {
    assert_eq!(
        Arch::from_names("sm90, sm80,sm90").unwrap(),
        [Arch::Sm80, Arch::Sm90]
    );
    assert!(
        Arch::from_names("sm61")
            .unwrap_err()
            .contains("`sm61` is not one of")
    );
    // candle's spelling (90) and the dotted one; an Ada card runs sm80 code.
    assert_eq!(Arch::from_compute_caps("90").unwrap(), [Arch::Sm90]);
    assert_eq!(
        Arch::from_compute_caps("8.9,75").unwrap(),
        [Arch::Sm75, Arch::Sm80]
    );
    assert_eq!(
        Arch::from_compute_caps("86, 90").unwrap(),
        [Arch::Sm80, Arch::Sm90]
    );
    assert!(
        Arch::from_compute_caps("70")
            .unwrap_err()
            .contains("no generation runs on compute capability 7.0")
    );
    assert!(
        Arch::from_compute_caps("nine")
            .unwrap_err()
            .contains("`nine` is not a compute capability")
    );
}

#[test]
fn target_reads_no_later_stage() {
    // `select`, `tune` and `codegen` read the targets; the targets read
    // none of them, so that a generation's facts have one home and the
    // modules no cycle. The tests may (they load the shipped tables).
    let sources = [
        ("mod.rs", include_str!("mod.rs")),
        ("sm75.rs", include_str!("sm75.rs")),
        ("sm80.rs", include_str!("sm80.rs")),
        ("sm90.rs", include_str!("sm90.rs")),
        ("warp_tiled.rs", include_str!("warp_tiled.rs")),
    ];
    let files = std::fs::read_dir(crate_dir().join("src/target")).unwrap();
    let mut on_disk: Vec<String> = files
        .map(|f| f.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name != "tests.rs")
        .collect();
    on_disk.sort();
    let mut listed: Vec<&str> = sources.iter().map(|(name, _)| *name).collect();
    listed.sort();
    assert_eq!(on_disk, listed, "list every module of target/ here");
    for (name, text) in sources {
        for later in ["select", "tune", "codegen", "build", "fuse"] {
            for path in [format!("crate::{later}"), format!("super::super::{later}")] {
                assert!(
                    !text.contains(&path),
                    "target/{name} names `{path}`: a later stage's; move what it needs into target"
                );
            }
        }
    }
}

#[test]
fn each_generation_reads_and_writes_only_its_own_fields() {
    let read =
        |arch: Arch, json: &str| TileConfig::read_for(arch, || serde_json::from_str::<TileConfig>(json));
    let sm80 = r#"{"bm":128,"bn":128,"bk":32,"warp_m":64,"warp_n":64,"stages":3,"min_blocks_per_sm":1,"pipelined":true,"staged_store":false}"#;
    let tile = read(Arch::Sm80, sm80).unwrap();
    assert_eq!(tile.arch(), Arch::Sm80);
    assert_eq!(serde_json::to_string(&tile).unwrap(), sm80);
    // Another generation's field is unknown, by name.
    let err = read(Arch::Sm80, r#"{"bm":128,"bn":128,"bk":32,"warp_m":64,"warp_n":64,"stages":3,"min_blocks_per_sm":1,"cluster_m":2}"#)
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `cluster_m`"), "{err}");
    let err = read(
        Arch::Sm90,
        r#"{"bm":128,"bn":256,"bk":64,"stages":4,"warp_m":64}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("unknown field `warp_m`"), "{err}");
    // `pipelined` and `staged_store`, written false into every tile before
    // each generation had its own fields, still read and write as before.
    let sm90 = r#"{"bm":128,"bn":256,"bk":64,"stages":4,"pipelined":false,"staged_store":false,"schedule":"pingpong"}"#;
    let tile = read(Arch::Sm90, sm90).unwrap();
    assert_eq!(tile, TileConfig::sm90(128, 256, 4, Some(Schedule::PingPong)));
    assert_eq!(serde_json::to_string(&tile).unwrap(), sm90);
    let err = read(
        Arch::Sm90,
        r#"{"bm":128,"bn":256,"bk":64,"stages":4,"pipelined":true}"#,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("`pipelined` does not apply to the sm90 mainloop"),
        "{err}"
    );
    // Outside `read_for`, no generation is known.
    let err = serde_json::from_str::<TileConfig>(sm90).unwrap_err().to_string();
    assert!(err.contains("read for one generation"), "{err}");
    // A config is checked against its own generation.
    let err = tile.check(Arch::Sm80, false).unwrap_err();
    assert!(
        err.contains("is a tile config of the sm90 mainloop, not of sm80's"),
        "{err}"
    );
}

#[test]
fn every_generation_has_a_tile_space() {
    for arch in Arch::ALL {
        let tiles = (arch.target().tile_space)();
        assert!(!tiles.is_empty(), "{arch}");
        assert!(
            tiles
                .iter()
                .all(|t| t.arch() == arch && t.check(arch, false).is_ok()),
            "{arch}"
        );
    }
}

#[test]
fn targets_json_is_what_the_targets_say() {
    let path = crate_dir().join(TARGETS_JSON);
    let want = targets_json();
    if std::env::var_os("FUSION_BLESS").is_some_and(|v| v == "1") {
        std::fs::write(&path, &want).unwrap();
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == want,
        "{} is not what src/target/ says: run `FUSION_BLESS=1 cargo test -p fusion-compiler targets_json` and commit it",
        path.display()
    );
}
