use super::*;
use crate::select::{Arch, KernelKind, select};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

pub(in crate::select) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn shape(m: u64, n: u64, k: u64) -> GemmShape {
    GemmShape { m, n, k }
}

// The examples split_plan.cuh's comments give.
#[test]
fn work_repeats_the_schedulers_plan() {
    // (128, 4096, 14336) in 64x128 tiles: 64 tiles of 224 k-blocks on 132
    // SMs, every CTA half a tile.
    let w = work(64, 128, 1, shape(128, 4096, 14336), 132, Splits::SplitK);
    assert_eq!((w.tiles, w.k_blocks, w.grid), (64, 224, 128));
    assert_eq!(w.split, Split::SplitK { ctas_per_tile: 2 });
    assert_eq!((w.busiest_k_blocks, w.partials), (112, 1));
    // 4096^3 in 128x256 tiles: the remainder's 57 k-blocks against 64 gain
    // less than their fixups cost, so 128 CTAs run 4 whole tiles each.
    let w = work(128, 256, 2, shape(4096, 4096, 4096), 132, Splits::Tail);
    assert_eq!((w.tiles, w.grid, w.split), (512, 128, Split::Whole));
    assert_eq!((w.busiest_k_blocks, w.rounds), (256, 4));
    // Tiles of fewer than 48 k-blocks are not split: (128, 1600, 1600) in
    // 64x128 tiles, 26 tiles of 25 k-blocks, runs whole on 26 CTAs.
    let w = work(64, 128, 1, shape(128, 1600, 1600), 132, Splits::SplitK);
    assert_eq!((w.tiles, w.grid, w.split), (26, 26, Split::Whole));
    // With no splits the same split-K shape runs whole tiles.
    let w = work(64, 128, 1, shape(128, 4096, 14336), 132, Splits::Off);
    assert_eq!((w.grid, w.busiest_k_blocks, w.split), (64, 224, Split::Whole));
    // 160 tiles: 28 over a wave, under half of one, so with the tail the
    // last full wave joins it and all 160 are shared out.
    let w = work(128, 256, 2, shape(512, 10240, 8192), 132, Splits::Tail);
    assert_eq!((w.tiles, w.split), (160, Split::StreamK));
    assert_eq!(w.busiest_k_blocks, (160 * 128u64).div_ceil(132));
    assert!(w.partials >= 1);
    // (512, 2560, 10240) in 128x128 tiles: 80 tiles, one wave on 132 SMs,
    // which `fill` shares out over all of them; by default, and with the
    // tail, it runs whole.
    for splits in [Splits::SplitK, Splits::Tail] {
        let w = work(128, 128, 2, shape(512, 2560, 10240), 132, splits);
        assert_eq!((w.grid, w.split, w.busiest_k_blocks), (80, Split::Whole, 160));
    }
    // Its 4 rows of 20 tiles each get 33 CTAs that share the row's
    // columns alike: 97 of a tile's 160 k-blocks a CTA.
    let w = work(128, 128, 2, shape(512, 2560, 10240), 132, Splits::Fill);
    assert_eq!((w.tiles, w.grid, w.split), (80, 132, Split::StreamK));
    assert_eq!((w.busiest_k_blocks, w.partials), ((20 * 160u64).div_ceil(33), 2));
    // (128, 6144, 24576) in 64x128 tiles: 2 rows of 48 tiles of 384
    // k-blocks, 66 CTAs a row; 9 rows of 128-row tiles would not fit a
    // group of the tile order (8 rows), so (1100, 1280, 8192)'s 90 tiles
    // are laid end to end over all 132 CTAs.
    let w = work(64, 128, 1, shape(128, 6144, 24576), 132, Splits::Fill);
    assert_eq!(
        (w.tiles, w.grid, w.busiest_k_blocks),
        (96, 132, (48 * 384u64).div_ceil(66))
    );
    let w = work(128, 128, 2, shape(1100, 1280, 8192), 132, Splits::Fill);
    assert_eq!(
        (w.tiles, w.grid, w.busiest_k_blocks),
        (90, 132, (90 * 128u64).div_ceil(132))
    );
    // 5 rows of 26 tiles: 26 CTAs a row (130 in all) would not share
    // anything, so the tiles run whole.
    let w = work(128, 128, 2, shape(600, 3328, 8192), 132, Splits::Fill);
    assert_eq!((w.tiles, w.grid, w.split), (130, 130, Split::Whole));
    // Beyond one wave `fill` runs the last wave whole, as the default does.
    let w = work(128, 256, 2, shape(512, 10240, 8192), 132, Splits::Fill);
    assert_eq!((w.grid, w.split), (80, Split::Whole));
    // By default a tail of tiles of 128 k-blocks runs whole: two rounds on
    // 80 CTAs.
    let w = work(128, 256, 2, shape(512, 10240, 8192), 132, Splits::default());
    assert_eq!(
        (w.grid, w.split, w.busiest_k_blocks, w.partials),
        (80, Split::Whole, 256, 0)
    );
    // Tiles of 192 k-blocks and more share the last wave by default where
    // that saves the busiest CTA a quarter of a tile: (1000, 4544, 18176)
    // in 128x192 tiles, 192 tiles of 284 k-blocks, 60 over a wave, so all
    // 192 are shared out over 132 CTAs (413 k-blocks each against 568).
    for splits in [Splits::SplitK, Splits::Fill, Splits::Tail] {
        let w = work(128, 192, 2, shape(1000, 4544, 18176), 132, splits);
        assert_eq!((w.tiles, w.k_blocks, w.grid), (192, 284, 132));
        assert_eq!(
            (w.split, w.busiest_k_blocks),
            (Split::StreamK, (192 * 284u64).div_ceil(132))
        );
    }
    // (1000, 6144, 24576) in 128x192 tiles: 256 tiles of 384 k-blocks, a
    // last wave of 124 on 132 SMs, whose share saves 23 k-blocks, under a
    // quarter of a tile: whole by default, shared with the tail.
    let w = work(128, 192, 2, shape(1000, 6144, 24576), 132, Splits::SplitK);
    assert_eq!(
        (w.tiles, w.split, w.busiest_k_blocks),
        (256, Split::Whole, 2 * 384)
    );
    let w = work(128, 192, 2, shape(1000, 6144, 24576), 132, Splits::Tail);
    assert_eq!(w.split, Split::StreamK);
}

fn sm90_config(kernel: &str) -> (KernelKind, KernelConfig) {
    let graph = crate::load_toml_graph(&repo_root().join("graphs").join(format!("{kernel}.toml"))).unwrap();
    let dtype = graph.tensors.iter().map(|t| t.dtype).next().unwrap();
    let plan = crate::fuse::plan(graph);
    let composition = plan
        .kernels
        .iter()
        .find_map(|k| match &k.composition {
            crate::fuse::Composition::Gemm(g) => Some(g.clone()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("graphs/{kernel}.toml has a GEMM"));
    let kind = KernelKind::of(&composition, dtype);
    let config = select(Arch::Sm90, &kind).unwrap();
    (kind, config)
}

// What the launcher's rule (gemm.cuh's LightestTier) gives at shapes
// whose tiers were measured (sm90.json's note).
#[test]
fn launched_tile_repeats_the_launchers_choice() {
    let (kind, config) = sm90_config("gemm");
    let decode = config.decode_for(kind.layout).is_some();
    let tile = |m, n| {
        config
            .launched_tile(m, n, 4096, 132, decode, TierChoice::LeastLoads)
            .map(|t| (t.bm, t.bn))
    };
    // 112 128x128 tiles, one wave: 256 loads against 384 for two waves of
    // 64x128 and 384 for one of 128x256.
    assert_eq!(tile(128, 14336), Some((128, 128)));
    // 64 64x128 tiles fill half the SMs.
    assert_eq!(tile(128, 4096), Some((64, 128)));
    assert_eq!(tile(512, 2048), Some((64, 128)));
    // Six whole waves of 128x192 against four and a half of 128x256: a
    // tie in loads (1920), which the idle half wave decides.
    assert_eq!(tile(1000, 18944), Some((128, 192)));
    // Narrow N at M = 1000: 112 64x128 tiles in one wave.
    assert_eq!(tile(1000, 896), Some((64, 128)));
    // M = 512, deep and wide: 4 x 54 = 216 128x192 tiles (2 waves, 640)
    // against 640 64x128 tiles (5 waves, 960) and 160 128x256 (2, 768).
    assert_eq!(tile(512, 10240), Some((128, 192)));
    assert_eq!(tile(8192, 8192), Some((128, 256)));
    assert_eq!(tile(16, 4096), None);
}

/// One GEMM row of a bench JSON with the tile its launch ran.
struct TimedRow {
    kernel: String,
    kind: KernelKind,
    /// M, N (C's columns) and K.
    dims: [u64; 3],
    tile: TileConfig,
    /// The splits the run's launches were allowed (the file's `splits`).
    splits: Splits,
    ours_us: f64,
    baseline_us: f64,
}

/// The GEMM rows of a bench JSON whose kernel is a built-in graph, each
/// with the tile its launch ran: the tier the run named (`gemm_tile`,
/// `FUSION_GEMM_TILE`), or where the run named none, the launcher's own
/// choice. A row whose kernel lacks the tier named is left out: its
/// launcher chose, by the rule of the commit measured. Also the tier the
/// run named, if it named one.
fn timed_rows(file: &str) -> (Option<String>, Vec<TimedRow>) {
    let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let named = json["gemm_tile"].as_str();
    let splits = json["splits"].as_str().map_or(Splits::Tail, |name| {
        Splits::from_name(name).unwrap_or_else(|| panic!("{file}: splits {name:?}"))
    });
    let mut rows = Vec::new();
    for row in json["rows"].as_array().unwrap() {
        let kernel = row["kernel"].as_str().unwrap();
        if !repo_root().join("graphs").join(format!("{kernel}.toml")).exists() || kernel.ends_with("norm") {
            continue;
        }
        let dims: Vec<u64> = row["shape"]
            .as_str()
            .unwrap()
            .split(',')
            .map(|d| d.parse().unwrap())
            .collect();
        let (kind, config) = sm90_config(kernel);
        let tile = match named {
            Some(name) => {
                let tiers = config.tiers();
                let few_m = [("few_m", crate::select::few_m_tile(&config, Arch::Sm90, &kind))];
                let (_, tile) = tiers
                    .iter()
                    .chain(&few_m)
                    .find(|(tier, _)| *tier == name)
                    .unwrap_or_else(|| panic!("{file}: gemm_tile {name:?} is no tier"));
                *tile
            }
            None => {
                let decode = config.decode_for(kind.layout).is_some();
                let gemm_n = kind_n(&kind, dims[1]);
                config.launched_tile(dims[0], gemm_n, dims[2], SM90_SMS, decode, TierChoice::LeastLoads)
            }
        };
        let Some(tile) = tile else {
            continue;
        };
        rows.push(TimedRow {
            kernel: kernel.to_owned(),
            kind,
            dims: [dims[0], dims[1], dims[2]],
            tile,
            splits,
            ours_us: row["ours_us"].as_f64().unwrap(),
            baseline_us: row["baseline_us"].as_f64().unwrap(),
        });
    }
    (named.map(str::to_owned), rows)
}

/// The rows of a bench JSON as samples ([`timed_rows`]).
fn samples_of(file: &str) -> Vec<Sample> {
    timed_rows(file)
        .1
        .into_iter()
        .map(|row| Sample {
            shape: shape(row.dims[0], kind_n(&row.kind, row.dims[1]), row.dims[2]),
            tile: TileShape::of(&row.tile),
            source_tile: row.kind.source_tile,
            splits: row.splits,
            us: row.ours_us,
        })
        .collect()
}

/// [`samples_of`] each file.
fn samples_of_files(files: &[String]) -> Vec<Sample> {
    files.iter().flat_map(|f| samples_of(f)).collect()
}

/// What the bench JSON files record of their run: the GPU, driver, commit
/// and date (all files must agree on the GPU).
pub(in crate::select) fn provenance_of(files: &[String]) -> Provenance {
    let read = |file: &String| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(repo_root().join(file)).unwrap()).unwrap()
    };
    let first = read(&files[0]);
    for file in files {
        assert_eq!(read(file)["device"], first["device"], "{file} ran on another GPU");
    }
    let field = |name: &str| first[name].as_str().unwrap_or_default().to_owned();
    Provenance {
        files: files.to_vec(),
        gpu: field("device"),
        driver: field("driver"),
        commit: field("commit"),
        date: field("date"),
    }
}

fn relative_errors(calibration: &Calibration, samples: &[Sample]) -> Vec<f64> {
    let mut errors: Vec<f64> = samples
        .iter()
        .map(|s| {
            (calibration
                .costs
                .predict_with(s.tile, s.shape, s.source_tile, s.splits)
                / s.us
                - 1.0)
                .abs()
        })
        .collect();
    errors.sort_by(f64::total_cmp);
    errors
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

/// The shipped calibration is the fit of the files it names: refitting
/// them gives the same costs (after an intended change, regenerate it with
/// `FUSION_BLESS=1 cargo test -p fusion-compiler model_calibration`).
#[test]
fn model_calibration_is_the_fit_of_its_files() {
    let shipped = Calibration::shipped_sm90();
    let samples = samples_of_files(&shipped.provenance.files);
    let refit = fit(
        &samples,
        shipped.costs.sms,
        provenance_of(&shipped.provenance.files),
    )
    .unwrap();
    if std::env::var_os("FUSION_BLESS").is_some_and(|v| v == "1") {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/tuned/sm90.model.json");
        std::fs::write(path, serde_json::to_string_pretty(&refit).unwrap() + "\n").unwrap();
        return;
    }
    assert_eq!(shipped.provenance, refit.provenance);
    assert_eq!(shipped.note, refit.note);
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
    assert_eq!(shipped.tiles, refit.tiles);
    for (a, b) in shipped.costs.as_array().iter().zip(refit.costs.as_array()) {
        assert!(close(*a, b), "shipped {shipped:?}\nrefit {refit:?}");
    }
}

/// The model explains the times it was fitted to, and predicts layers it
/// was not fitted to about as well: fitted on four fifths of the (N, K)
/// pairs, its error on the other fifth stays near its error on its own.
/// Fitted to every tier at every layer, tiers far from a layer's fastest
/// among them included (64x128 at M = 1000, up to twice as slow), it
/// explains them less closely than the launcher's choices alone: median
/// 0.09 and p90 0.25 on the shipped files.
#[test]
fn model_predicts_layers_it_was_not_fitted_to() {
    let shipped = Calibration::shipped_sm90();
    let samples = samples_of_files(&shipped.provenance.files);
    assert!(samples.len() >= 200, "{} samples", samples.len());
    let own = relative_errors(&shipped, &samples);
    let (median, p90) = (percentile(&own, 0.5), percentile(&own, 0.9));
    eprintln!(
        "fitted: {} samples, relative error median {median:.3}, p90 {p90:.3}",
        own.len()
    );
    assert!(
        median < 0.1 && p90 < 0.27,
        "fitted: median {median:.3}, p90 {p90:.3}"
    );
    let pairs: BTreeSet<(u64, u64)> = samples.iter().map(|s| (s.shape.n, s.shape.k)).collect();
    let mut held_out_errors = Vec::new();
    for fold in 0..5 {
        let held: BTreeSet<(u64, u64)> = pairs.iter().copied().skip(fold).step_by(5).collect();
        let (test, train): (Vec<Sample>, Vec<Sample>) = samples
            .iter()
            .partition(|s| held.contains(&(s.shape.n, s.shape.k)));
        let model = fit(&train, shipped.costs.sms, shipped.provenance.clone()).unwrap();
        held_out_errors.extend(relative_errors(&model, &test));
    }
    held_out_errors.sort_by(f64::total_cmp);
    let (median, p90) = (
        percentile(&held_out_errors, 0.5),
        percentile(&held_out_errors, 0.9),
    );
    eprintln!("held out: relative error median {median:.3}, p90 {p90:.3}");
    assert!(
        median < 0.11 && p90 < 0.3,
        "held out: median {median:.3}, p90 {p90:.3}"
    );
}

/// A unit of untiled kind with `tiles` as its tiers, in order.
fn unit(tiles: &[(u32, u32)]) -> UnitTiers {
    let mut unit = UnitTiers {
        tiles: [None; TIERS],
        decode_max_m: None,
        small_m_max: None,
        gated: false,
        source_tile: false,
        few_m: None,
    };
    for (slot, &(bm, bn)) in unit.tiles.iter_mut().zip(tiles) {
        *slot = Some(TileShape { bm, bn });
    }
    unit
}

#[test]
fn fastest_picks_the_tier_of_least_predicted_time() {
    let costs = Calibration::shipped_sm90().costs;
    assert_eq!(unit(&[]).fastest_in(&costs, MBucket::of(4096), 4096, 4096), None);
    // A deep, wide GEMM of many waves: the widest tile, whose k-blocks cost
    // least per flop.
    let tiles = [(64, 128), (128, 128), (128, 256)];
    let bucket = MBucket::of(8192);
    assert_eq!(unit(&tiles).fastest_in(&costs, bucket, 14336, 4096), Some(2));
    let time = |(bm, bn)| costs.bucket_time(TileShape { bm, bn }, bucket, 14336, 4096, false);
    assert!(time(tiles[2]) < time(tiles[0]) && time(tiles[2]) < time(tiles[1]));
    // 128 rows of a narrow GEMM: 128-row tiles leave most SMs idle, and
    // 64-row ones fill twice as many.
    assert_eq!(
        unit(&[(128, 256), (64, 128)]).fastest_in(&costs, MBucket::of(128), 2048, 2048),
        Some(1)
    );
    // Tiers of one shape: the first of them.
    assert_eq!(
        unit(&[(64, 128), (64, 128)]).fastest_in(&costs, MBucket::of(128), 2048, 2048),
        Some(0)
    );
    // The decode kernel's Ms are the launcher's own choice.
    let decoding = UnitTiers {
        decode_max_m: Some(16),
        ..unit(&tiles)
    };
    assert_eq!(decoding.choose(&costs, 16, 4096, 4096), None);
    assert!(decoding.choose(&costs, 17, 4096, 4096).is_some());
}

/// Where N or K is dynamic the run time chooses per call what a build
/// with the same N and K static chooses per M bucket: for every GEMM of the
/// corpus (`benchmarks/corpus.toml`), at the smallest, middle and largest M
/// of each bucket, the tier the run time runs is the tile `choose_by_m`
/// gives the bucket, and the decode kernel's Ms stay the launcher's.
#[test]
fn the_run_times_choice_agrees_with_the_builds_on_the_corpus() {
    let text = std::fs::read_to_string(repo_root().join("benchmarks/corpus.toml")).unwrap();
    let corpus = crate::corpus::Corpus::parse(&text).unwrap();
    let model = Calibration::shipped_sm90();
    let shapes = corpus.shapes();
    assert!(shapes.len() >= 20, "{} corpus shapes", shapes.len());
    let mut chosen = BTreeSet::new();
    for shape in &shapes {
        let (kind, shipped) = sm90_config(&shape.kernel);
        let built = choose_by_m(&model, &kind, shape.n, shape.k, &shipped);
        let unit = run_time_tiers(Arch::Sm90, &kind, None, Some(shape.k), &shipped)
            .expect("a dynamic N on sm90 is chosen at run time");
        let tiers = shipped.tiers();
        for bucket in MBucket::all() {
            for m in bucket.weighed_ms() {
                let at_run_time = unit
                    .choose(&model.costs, m, shape.n, shape.k)
                    .map(|tier| tiers[tier].1.unwrap());
                let at_build = built.launched_tile(
                    m,
                    kind_n(&kind, shape.n),
                    shape.k,
                    SM90_SMS,
                    unit.decode_max_m.is_some(),
                    TierChoice::LeastLoads,
                );
                assert_eq!(
                    at_run_time, at_build,
                    "{} at ({m}, {}, {})",
                    shape.kernel, shape.n, shape.k
                );
                chosen.extend(at_run_time.map(|t| (t.bm, t.bn)));
            }
        }
    }
    assert!(chosen.len() >= 2, "the corpus runs one tile alone: {chosen:?}");
}

/// The GEMM columns of `n` columns of C.
fn kind_n(kind: &KernelKind, n: u64) -> u64 {
    if kind.gated { 2 * n } else { n }
}

#[test]
fn the_run_time_chooses_only_what_the_build_could_not() {
    let (kind, shipped) = sm90_config("gemm_bias_gelu");
    assert!(run_time_tiers(Arch::Sm90, &kind, Some(4096), Some(4096), &shipped).is_none());
    assert!(run_time_tiers(Arch::Sm80, &kind, None, None, &shipped).is_none());
    let unit = run_time_tiers(Arch::Sm90, &kind, Some(4096), None, &shipped).unwrap();
    assert_eq!(unit, shipped.unit_tiers(&kind));
    assert_eq!(unit.tiles[0], Some(TileShape::of(&shipped.large)));
    let by_m = choose_by_m(&Calibration::shipped_sm90(), &kind, 4096, 4096, &shipped);
    assert!(run_time_tiers(Arch::Sm90, &kind, None, None, &by_m).is_none());
}

#[test]
fn solve_finds_the_solution_and_refuses_a_singular_system() {
    let x = solve(vec![vec![2.0, 1.0, 5.0], vec![1.0, 3.0, 10.0]]).unwrap();
    assert!((x[0] - 1.0).abs() < 1e-12 && (x[1] - 3.0).abs() < 1e-12, "{x:?}");
    assert!(solve(vec![vec![1.0, 2.0, 3.0], vec![2.0, 4.0, 6.0]]).is_none());
}

#[test]
fn fit_refuses_samples_that_do_not_tell_the_costs_apart() {
    let provenance = Calibration::shipped_sm90().provenance;
    let sample = Sample {
        shape: shape(4096, 4096, 4096),
        tile: TileShape { bm: 128, bn: 256 },
        source_tile: false,
        splits: Splits::SplitK,
        us: 180.0,
    };
    let error = fit(&[sample; 3], 132, provenance).unwrap_err();
    assert!(error.0.contains("3 samples"), "{error}");
}

/// One corpus GEMM at one M as files of one run per tier measured it:
/// each tier's tile and time, and cuBLASLt's (the median over the files,
/// which time the same baseline).
struct MeasuredTiers {
    kernel: String,
    dims: [u64; 3],
    times: Vec<(TileConfig, f64)>,
    baseline_us: f64,
}

/// The GEMM rows of `files` (bench JSONs each run with one tier named,
/// `gemm_tile`) by kernel and shape, each with the time of every tier its
/// kernel has.
fn measured_tiers(files: &[String]) -> Vec<MeasuredTiers> {
    type Times = (Vec<(TileConfig, f64)>, Vec<f64>);
    let mut by_row: std::collections::BTreeMap<(String, [u64; 3]), Times> = Default::default();
    for file in files {
        let (tier, rows) = timed_rows(file);
        assert!(tier.is_some(), "{file} names no tier");
        for row in rows {
            let entry = by_row.entry((row.kernel, row.dims)).or_default();
            entry.0.push((row.tile, row.ours_us));
            entry.1.push(row.baseline_us);
        }
    }
    by_row
        .into_iter()
        .map(|((kernel, dims), (times, mut baselines))| {
            baselines.sort_by(f64::total_cmp);
            MeasuredTiers {
                kernel,
                dims,
                times,
                baseline_us: baselines[baselines.len() / 2],
            }
        })
        .collect()
}

/// The bench JSONs of the corpus's GEMM layers run once per tier (the
/// suite's step `tiles`, in two shards), which the shipped calibration is
/// fitted to.
fn tier_files() -> Vec<String> {
    Calibration::shipped_sm90().provenance.files
}

fn geomean(values: &[f64]) -> f64 {
    (values.iter().map(|v| v.ln()).sum::<f64>() / values.len() as f64).exp()
}

/// The launcher's own choice of tier (least loads for the busiest CTA)
/// comes close to the fastest tier on every measured layer of the corpus:
/// per M, the geometric mean of cuBLASLt's time over the chosen tier's is
/// within 3% of the fastest tier's, and no choice is more than 1.5 times
/// slower than the fastest (the slowest: 1.4 times, rmsnorm_gemm at
/// (512, 9216, 7168), where 128x192 runs and 128x256 was fastest).
#[test]
fn the_launchers_tier_is_near_the_fastest_on_the_measured_corpus() {
    let rows = measured_tiers(&tier_files());
    assert!(rows.len() >= 200, "{} rows", rows.len());
    let mut by_m: std::collections::BTreeMap<u64, (Vec<f64>, Vec<f64>)> = Default::default();
    for row in &rows {
        let (kind, config) = sm90_config(&row.kernel);
        let [m, n, k] = row.dims;
        let gemm_n = kind_n(&kind, n);
        let decode = config.decode_for(kind.layout).is_some();
        let chosen = config
            .launched_tile(m, gemm_n, k, SM90_SMS, decode, TierChoice::LeastLoads)
            .unwrap();
        let time_of = |tile: TileConfig| row.times.iter().find(|(t, _)| *t == tile).map(|(_, us)| *us);
        let chosen_us = time_of(chosen)
            .unwrap_or_else(|| panic!("{} {:?}: {chosen:?} not measured", row.kernel, row.dims));
        let fastest_us = row.times.iter().map(|(_, us)| *us).fold(f64::INFINITY, f64::min);
        assert!(
            chosen_us <= 1.5 * fastest_us,
            "{} at ({m}, {n}, {k}): {} took {chosen_us:.1} us, the fastest tier {fastest_us:.1}",
            row.kernel,
            TileShape::of(&chosen)
        );
        let entry = by_m.entry(m).or_default();
        entry.0.push(row.baseline_us / chosen_us);
        entry.1.push(row.baseline_us / fastest_us);
    }
    for (m, (chosen, fastest)) in &by_m {
        let (chosen, fastest) = (geomean(chosen), geomean(fastest));
        eprintln!("M = {m}: the launcher's tier {chosen:.3} of cuBLASLt, the fastest tier {fastest:.3}");
        assert!(
            chosen >= 0.97 * fastest,
            "M = {m}: {chosen:.3} against {fastest:.3}"
        );
    }
}

/// The two rules a launcher may run, at shapes where they part: the
/// wave-area rule (sm80, sm75, a tuned cache's tiles) keeps M <= 512 on the
/// small-M tiers and chooses 64x128 at (512, 10240), where least loads
/// runs 128x192; above `small_m_max` both weigh the large tiers alike.
#[test]
fn the_wave_area_rule_keeps_the_small_tiers_for_small_m() {
    let (kind, config) = sm90_config("gemm");
    let decode = config.decode_for(kind.layout).is_some();
    let tile = |m, n, rule| {
        config
            .launched_tile(m, n, 4096, 132, decode, rule)
            .map(|t| (t.bm, t.bn))
    };
    assert_eq!(tile(512, 10240, TierChoice::WaveArea), Some((64, 128)));
    assert_eq!(tile(512, 10240, TierChoice::LeastLoads), Some((128, 192)));
    assert_eq!(tile(128, 14336, TierChoice::WaveArea), Some((128, 128)));
    for rule in [TierChoice::WaveArea, TierChoice::LeastLoads] {
        assert_eq!(tile(2000, 18944, rule), tile(2000, 18944, TierChoice::WaveArea));
        assert_eq!(tile(8192, 8192, rule), Some((128, 256)));
        assert_eq!(tile(16, 4096, rule), None);
    }
    assert_eq!(
        crate::select::tier_choice(Arch::Sm90, false),
        TierChoice::LeastLoads
    );
    assert_eq!(crate::select::tier_choice(Arch::Sm90, true), TierChoice::WaveArea);
    assert_eq!(
        crate::select::tier_choice(Arch::Sm80, false),
        TierChoice::WaveArea
    );
}
