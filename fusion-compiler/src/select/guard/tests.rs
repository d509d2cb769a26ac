use super::*;
use crate::fuse::{Composition, GemmComposition};
use crate::guard_model::geometric_mean;
use crate::ir::WeightLayout;
use crate::select::model::tests::{provenance_of, repo_root};
use crate::select::{CacheEntry, TileConfig, select};
use std::path::Path;

/// The GEMM composition of the built-in graph `kernel` (`graphs/<kernel>.toml`),
/// if it is one.
fn composition_of(kernel: &str) -> Option<GemmComposition> {
    let path = repo_root().join("graphs").join(format!("{kernel}.toml"));
    if !path.exists() {
        return None;
    }
    let plan = crate::fuse::plan(crate::load_toml_graph(&path).unwrap());
    plan.kernels.iter().find_map(|k| match &k.composition {
        Composition::Gemm(g) => Some(g.clone()),
        _ => None,
    })
}

/// Every GEMM row of the bench files with its vendor path and the time
/// the row measured for it (`baseline_us`: cuBLASLt with the heuristic's
/// first algorithm, and the kernels around it).
fn vendor_samples(files: &[String]) -> Vec<VendorSample> {
    files
        .iter()
        .flat_map(|file| gemm_rows(file))
        .map(|(gemm, [m, n, k], row)| VendorSample {
            path: VendorPath::of(&gemm),
            m,
            n,
            k,
            us: row["baseline_us"].as_f64().unwrap(),
        })
        .collect()
}

/// The rows of the bench file `file` (a path from the repository's root)
/// whose kernel is a built-in graph with a GEMM: its composition, the
/// row's (M, N, K) and the row.
fn gemm_rows(file: &str) -> Vec<(GemmComposition, [u64; 3], serde_json::Value)> {
    let text = std::fs::read_to_string(repo_root().join(file)).unwrap();
    let json: serde_json::Value = serde_json::from_str(&text).unwrap();
    let serde_json::Value::Array(rows) = json["rows"].clone() else {
        panic!("{file}: no rows");
    };
    rows.into_iter()
        .filter_map(|row| {
            let gemm = composition_of(row["kernel"].as_str().unwrap())?;
            let dims: Vec<u64> = row["shape"]
                .as_str()
                .unwrap()
                .split(',')
                .map(|d| d.parse().unwrap())
                .collect();
            Some((gemm, [dims[0], dims[1], dims[2]], row))
        })
        .collect()
}

/// The files the vendor model is fitted to: those of the fused kernel's
/// model, so that both sides of a verdict come from one run.
fn vendor_files() -> Vec<String> {
    Calibration::shipped_sm90().provenance.files
}

/// The shipped vendor calibration is the fit of the files the fused
/// kernel's model names (after an intended change, regenerate it with
/// `FUSION_BLESS=1 cargo test -p fusion-compiler vendor_calibration`).
#[test]
fn vendor_calibration_is_the_fit_of_its_files() {
    let files = vendor_files();
    let samples = vendor_samples(&files);
    let refit = fit_vendor(&samples, SM90_SMS, provenance_of(&files)).unwrap();
    if std::env::var_os("FUSION_BLESS").is_some_and(|v| v == "1") {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels/tuned/sm90.vendor.json");
        std::fs::write(path, serde_json::to_string_pretty(&refit).unwrap() + "\n").unwrap();
        return;
    }
    let shipped = VendorCalibration::shipped_sm90();
    assert_eq!(
        (&shipped.provenance, &shipped.note),
        (&refit.provenance, &refit.note)
    );
    let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1.0);
    for (a, b) in shipped.costs.as_array().iter().zip(refit.costs.as_array()) {
        assert!(close(*a, b), "shipped {shipped:?}\nrefit {refit:?}");
    }
}

/// The vendor model explains the cuBLASLt times it was fitted to about as
/// well as the fused kernel's model explains its own, and layers it was
/// not fitted to nearly as well.
#[test]
fn vendor_model_predicts_layers_it_was_not_fitted_to() {
    let shipped = VendorCalibration::shipped_sm90();
    let samples = vendor_samples(&vendor_files());
    assert!(samples.len() >= 200, "{} samples", samples.len());
    let errors = |model: &VendorCalibration, samples: &[&VendorSample]| -> Vec<f64> {
        let mut e: Vec<f64> = samples
            .iter()
            .map(|s| (model.predict(&s.path, s.m, s.n, s.k) / s.us - 1.0).abs())
            .collect();
        e.sort_by(f64::total_cmp);
        e
    };
    let at = |sorted: &[f64], p: f64| sorted[((sorted.len() - 1) as f64 * p).round() as usize];
    let all: Vec<&VendorSample> = samples.iter().collect();
    let own = errors(&shipped, &all);
    let (median, p90) = (at(&own, 0.5), at(&own, 0.9));
    eprintln!(
        "fitted: {} samples, relative error median {median:.3}, p90 {p90:.3}",
        own.len()
    );
    assert!(
        median < 0.08 && p90 < 0.2,
        "fitted: median {median:.3}, p90 {p90:.3}"
    );
    let mut pairs: Vec<(u64, u64)> = samples.iter().map(|s| (s.n, s.k)).collect();
    pairs.sort();
    pairs.dedup();
    let mut held_out = Vec::new();
    for fold in 0..5 {
        let held: Vec<(u64, u64)> = pairs.iter().copied().skip(fold).step_by(5).collect();
        let (test, train): (Vec<VendorSample>, Vec<VendorSample>) =
            samples.iter().cloned().partition(|s| held.contains(&(s.n, s.k)));
        let model = fit_vendor(&train, SM90_SMS, shipped.provenance.clone()).unwrap();
        held_out.extend(errors(&model, &test.iter().collect::<Vec<_>>()));
    }
    held_out.sort_by(f64::total_cmp);
    let (median, p90) = (at(&held_out, 0.5), at(&held_out, 0.9));
    eprintln!("held out: relative error median {median:.3}, p90 {p90:.3}");
    assert!(
        median < 0.1 && p90 < 0.25,
        "held out: median {median:.3}, p90 {p90:.3}"
    );
    // Every cost is a cost: none of the fit's terms pays time back.
    assert!(shipped.costs.as_array().iter().all(|&c| c > 0.0), "{shipped:?}");
}

#[test]
fn the_vendor_path_takes_what_cublaslt_fuses_and_leaves_the_rest() {
    let path = |kernel: &str| VendorPath::of(&composition_of(kernel).unwrap());
    let p = path("gemm_bias_gelu");
    assert_eq!(
        (p.epilogue, p.beta_residual, p.remainder.len()),
        (VendorEpilogue::GeluBias, false, 0)
    );
    assert_eq!(path("gemm_bias_relu").epilogue, VendorEpilogue::ReluBias);
    assert_eq!(path("gemm_gelu").epilogue, VendorEpilogue::Gelu);
    assert_eq!(path("gemm").epilogue, VendorEpilogue::None);
    let p = path("gemm_bias_residual");
    assert_eq!((p.epilogue, p.beta_residual), (VendorEpilogue::Bias, true));
    assert!(p.unsupported().is_none());
    let p = path("gemm_residual");
    assert_eq!((p.epilogue, p.beta_residual), (VendorEpilogue::None, true));
    // SiLU is no cuBLASLt epilogue: after the bias, an elementwise kernel.
    let p = path("gemm_bias_silu");
    assert_eq!(p.epilogue, VendorEpilogue::Bias);
    assert_eq!(
        p.remainder,
        [EpilogueStep::Activation(Activation::named("silu").unwrap())]
    );
    assert!(
        p.unsupported().unwrap().contains("no epilogue for silu"),
        "{:?}",
        p.unsupported()
    );
    // A residual after an activation cannot ride on beta (cuBLASLt adds
    // beta·C before its activation).
    let gelu = EpilogueStep::Activation(Activation::named("gelu").unwrap());
    let gemm = GemmComposition {
        prologue: None,
        b_layout: WeightLayout::NK,
        gate: None,
        epilogue: vec![EpilogueStep::Bias, gelu, EpilogueStep::Residual],
    };
    let p = VendorPath::of(&gemm);
    assert_eq!((p.epilogue, p.beta_residual), (VendorEpilogue::GeluBias, false));
    assert_eq!(p.remainder, [EpilogueStep::Residual]);
    // Nor is an activation of the sum with a residual taken.
    let gemm = GemmComposition {
        epilogue: vec![EpilogueStep::Residual, gelu],
        ..gemm
    };
    let p = VendorPath::of(&gemm);
    assert_eq!((p.epilogue, p.beta_residual), (VendorEpilogue::None, true));
    assert_eq!(p.remainder, [gelu]);
    // A norm GEMM: the norm kernel first, then cuBLASLt with the epilogue
    // it takes. Gated pairs are described, not yet run.
    let p = path("rmsnorm_gemm");
    assert_eq!(
        (p.norm, p.epilogue),
        (Some(NormKind::RmsNorm), VendorEpilogue::None)
    );
    assert!(p.unsupported().is_none());
    assert_eq!(vendor_name(&p), "rmsnorm kernel + cuBLASLt");
    let p = path("layernorm_gemm");
    assert_eq!(p.norm, Some(NormKind::LayerNorm));
    assert!(p.unsupported().is_none());
    let p = path("layernorm_gemm_silu_glu_residual");
    assert!(p.norm.is_some() && p.unsupported().unwrap().contains("gated pair"));
    let p = path("gemm_silu_glu");
    assert!(p.gated && p.unsupported().unwrap().contains("gated pair"));
}

#[test]
fn a_bucket_leaves_the_fused_kernel_only_past_the_margin() {
    let bucket = MBucket::of(128);
    let decide = |fused| BucketVerdict::decide(bucket, fused, 100.0, Evidence::Model).vendor;
    assert!(!decide(Some(100.0)));
    assert!(!decide(Some(103.0)), "3% slower is within the margin");
    assert!(decide(Some(103.5)));
    assert!(!decide(Some(50.0)));
    assert!(!decide(None), "the decode kernel's buckets stay fused");
    let text = BucketVerdict::decide(bucket, Some(120.0), 100.0, Evidence::Model).to_string();
    assert_eq!(
        text,
        "m<=128: VENDOR (fused 120.0 us, vendor 100.0 us, predicted; fused/vendor 1.20)"
    );
}

#[test]
fn the_option_is_off_unless_asked_for() {
    assert_eq!(parse_guard(None), Ok(false));
    assert_eq!(parse_guard(Some("")), Ok(false));
    assert_eq!(parse_guard(Some("off")), Ok(false));
    assert_eq!(parse_guard(Some("on")), Ok(true));
    let error = parse_guard(Some("yes")).unwrap_err();
    assert!(
        error.contains("FUSION_GUARD=\"yes\"") && error.contains("`on`"),
        "{error}"
    );
}

fn gemm_bias_gelu() -> (GemmComposition, KernelConfig) {
    let gemm = composition_of("gemm_bias_gelu").unwrap();
    let config = select(Arch::Sm90, &KernelKind::of(&gemm, DType::F16)).unwrap();
    (gemm, config)
}

/// The verdicts follow the two predictions bucket by bucket.
#[test]
fn verdicts_compare_the_two_predictions_per_bucket() {
    let guard = Guard::shipped_sm90();
    let (gemm, config) = gemm_bias_gelu();
    let cache = TunedCache::default();
    let verdicts = guard
        .verdicts(
            &cache,
            Arch::Sm90,
            &gemm,
            DType::F16,
            (Some(4096), Some(4096)),
            &config,
            TierChoice::LeastLoads,
        )
        .unwrap();
    assert_eq!(verdicts.len(), MBucket::COUNT);
    let path = VendorPath::of(&gemm);
    for v in &verdicts {
        assert_eq!(v.evidence, Evidence::Model);
        let ms = v.bucket.weighed_ms();
        let vendor = geometric_mean(&ms.map(|m| guard.vendor.predict(&path, m, 4096, 4096)));
        assert!((v.vendor_us - vendor).abs() < 1e-9);
        match v.fused_us {
            Some(fused) => assert_eq!(v.vendor, fused > vendor * (1.0 + MARGIN), "{v}"),
            None => assert!(!v.vendor),
        }
    }
    // The decode kernel serves the smallest bucket of an [N, K] kernel.
    assert_eq!(verdicts[0].fused_us, None);
    // A model that makes cuBLASLt ten times faster sends every modelled
    // bucket to it; one that makes it ten times slower, none.
    let mut fast = guard.clone();
    for cost in [
        &mut fast.vendor.costs.launch_us,
        &mut fast.vendor.costs.wave_gflop_us,
        &mut fast.vendor.costs.memory_us_per_mb,
    ] {
        *cost /= 10.0;
    }
    let verdicts = fast
        .verdicts(
            &cache,
            Arch::Sm90,
            &gemm,
            DType::F16,
            (Some(4096), Some(4096)),
            &config,
            TierChoice::LeastLoads,
        )
        .unwrap();
    assert!(verdicts.iter().all(|v| v.vendor == v.fused_us.is_some()));
    assert_eq!(
        vendor_ranges(&verdicts),
        [(17, None)],
        "neighbouring buckets merge into one range"
    );
    let mut slow = guard.clone();
    slow.vendor.costs.launch_us *= 10.0;
    let verdicts = slow
        .verdicts(
            &cache,
            Arch::Sm90,
            &gemm,
            DType::F16,
            (Some(4096), Some(4096)),
            &config,
            TierChoice::LeastLoads,
        )
        .unwrap();
    assert!(verdicts.iter().all(|v| !v.vendor));
    assert!(vendor_ranges(&verdicts).is_empty());
}

/// A tuned entry that timed both sides decides its bucket, whatever the
/// models say.
#[test]
fn a_tuned_entry_overrides_the_models_for_its_bucket() {
    let guard = Guard::shipped_sm90();
    let (gemm, config) = gemm_bias_gelu();
    let mut cache = TunedCache::default();
    let key =
        |bucket: &str| CacheKey::parse(&format!("gemm_bias_gelu.f16.nk.n4096.k4096.sm90.{bucket}")).unwrap();
    let entry = |time_us, cublaslt_time_us| CacheEntry {
        tile: TileConfig::sm90(128, 256, 4, None),
        time_us,
        default_time_us: time_us,
        cublaslt_time_us,
        gpu: "NVIDIA H200".into(),
        driver: "580".into(),
        nvcc: "13.0".into(),
        date: "2026-12-05".into(),
    };
    cache.entries.insert(key("m<=512"), entry(50.0, 40.0));
    cache.entries.insert(key("m>4096"), entry(40.0, 50.0));
    let verdicts = guard
        .verdicts(
            &cache,
            Arch::Sm90,
            &gemm,
            DType::F16,
            (Some(4096), Some(4096)),
            &config,
            TierChoice::LeastLoads,
        )
        .unwrap();
    let at = |m| verdicts[MBucket::of(m).index()];
    assert_eq!(
        (
            at(512).evidence,
            at(512).fused_us,
            at(512).vendor_us,
            at(512).vendor
        ),
        (Evidence::Tuned, Some(50.0), 40.0, true)
    );
    assert_eq!((at(8192).evidence, at(8192).vendor), (Evidence::Tuned, false));
    assert_eq!(at(1024).evidence, Evidence::Model);
    assert!(
        vendor_ranges(&verdicts)
            .iter()
            .any(|&(low, high)| low <= 257 && high.is_some_and(|high| high >= 512)),
        "{:?}",
        vendor_ranges(&verdicts)
    );
}

#[test]
fn kernels_the_guard_cannot_serve_say_why() {
    let guard = Guard::shipped_sm90();
    let cache = TunedCache::default();
    let (gemm, config) = gemm_bias_gelu();
    let verdicts = |arch, dtype, n, k, gemm: &GemmComposition| {
        guard.verdicts(&cache, arch, gemm, dtype, (n, k), &config, TierChoice::LeastLoads)
    };
    assert_eq!(
        verdicts(Arch::Sm80, DType::F16, Some(64), Some(64), &gemm),
        Err(Unguarded::Arch(Arch::Sm80))
    );
    assert_eq!(
        verdicts(Arch::Sm90, DType::F16, None, Some(64), &gemm),
        Err(Unguarded::Dynamic)
    );
    let silu = composition_of("gemm_bias_silu").unwrap();
    let error = verdicts(Arch::Sm90, DType::F16, Some(64), Some(64), &silu).unwrap_err();
    assert!(
        error
            .to_string()
            .starts_with("not guarded: cuBLASLt has no epilogue for silu"),
        "{error}"
    );
}

/// A norm GEMM whose epilogue cuBLASLt computes gets a verdict per bucket,
/// its vendor path counting the norm kernel (so it costs more than the
/// same GEMM's without one); with a gated pair after the norm it stays
/// fused.
#[test]
fn norm_gemms_get_a_verdict_per_bucket_counting_their_norm_kernel() {
    let guard = Guard::shipped_sm90();
    let cache = TunedCache::default();
    let verdicts = |kernel: &str| {
        let gemm = composition_of(kernel).unwrap();
        let config = select(Arch::Sm90, &KernelKind::of(&gemm, DType::BF16)).unwrap();
        guard.verdicts(
            &cache,
            Arch::Sm90,
            &gemm,
            DType::BF16,
            (Some(4096), Some(4096)),
            &config,
            TierChoice::LeastLoads,
        )
    };
    for (norm, plain) in [("rmsnorm_gemm", "gemm"), ("layernorm_gemm", "gemm")] {
        let (with_norm, without) = (verdicts(norm).unwrap(), verdicts(plain).unwrap());
        assert_eq!(with_norm.len(), MBucket::all().count(), "{norm}");
        for (n, p) in with_norm.iter().zip(&without) {
            assert_eq!(n.bucket, p.bucket);
            assert!(n.vendor_us > p.vendor_us, "{norm} {}: {n} against {p}", n.bucket);
        }
    }
    let error = verdicts("layernorm_gemm_silu_glu_residual").unwrap_err();
    assert!(error.to_string().contains("a gated pair"), "{error}");
}

#[test]
fn the_report_names_each_gemm_kernel_and_its_buckets() {
    let path = repo_root().join("graphs/gpt2_mlp.toml");
    let plan = crate::fuse::plan(crate::load_toml_graph(&path).unwrap());
    let mut fast = Guard::shipped_sm90();
    fast.vendor.costs.launch_us /= 100.0;
    fast.vendor.costs.wave_gflop_us /= 100.0;
    let text = report(&plan, &fast, &TunedCache::default()).unwrap();
    assert!(
        text.starts_with(
            "guard on sm90: an M bucket runs the vendor path where the fused kernel is more than 3% slower"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "kernel #0 (layernorm_gemm_bias_gelu, f16, N=3072 K=768): layernorm kernel + cuBLASLt GELU_BIAS for M 17 and more"
        ),
        "{text}"
    );
    assert!(
        text.contains(
            "kernel #1 (gemm_bias_residual, f16, N=768 K=3072): cuBLASLt BIAS + beta·C for M 17 and more"
        ),
        "{text}"
    );
    assert!(text.contains("  m>4096: VENDOR (fused "), "{text}");
    // N and K dynamic: the run time decides.
    let path = repo_root().join("graphs/gemm_bias_residual.toml");
    let plan = crate::fuse::plan(crate::load_toml_graph(&path).unwrap());
    let text = report(&plan, &Guard::shipped_sm90(), &TunedCache::default()).unwrap();
    assert!(
        text.contains(
            "kernel #0 (gemm_bias_residual, f16): cuBLASLt BIAS + beta·C where the fused kernel is predicted more \
             than 3% slower, decided per call (N or K is dynamic)"
        ),
        "{text}"
    );
    // A norm GEMM's vendor path runs its norm kernel first.
    let path = repo_root().join("graphs/rmsnorm_gemm.toml");
    let plan = crate::fuse::plan(crate::load_toml_graph(&path).unwrap());
    let text = report(&plan, &Guard::shipped_sm90(), &TunedCache::default()).unwrap();
    assert!(
        text.contains("kernel #0 (rmsnorm_gemm, f16): rmsnorm kernel + cuBLASLt where the fused kernel"),
        "{text}"
    );
}

#[test]
fn a_kernel_of_two_dtypes_routes_the_buckets_both_lose() {
    let route = |buckets: &[u32]| Route {
        arch: Arch::Sm90,
        buckets: buckets.iter().map(|&m| MBucket::of(m)).collect(),
        epilogue: VendorEpilogue::Bias,
    };
    let both = route(&[64, 128, 512]).both(&route(&[128, 512, 8192]));
    assert_eq!(both, route(&[128, 512]));
    assert_eq!(bucket_ranges(&both.buckets), [(65, Some(128)), (257, Some(512))]);
}

/// Corpus runs of the launchers' own tiles (no tier named) on the GPU the
/// shipped models were fitted on: what the guard's verdicts are weighed
/// against.
const LAUNCHER_CORPUS_FILES: [&str; 2] = [
    "benchmarks/2026-12-05-f8745d3-corpus-128-h100.json",
    "benchmarks/2026-12-05-f8745d3-corpus-512-1000-h100.json",
];

/// What the guard would have done to the measured corpus rows of the
/// kernels it serves: a row whose bucket it routes runs the vendor path,
/// which is the row's own baseline (ratio 1), and the others keep their
/// measured ratio. Printed for the record (`--nocapture`); it must leave
/// fewer rows below 0.98 of their unfused path than the fused kernels
/// alone, and route few rows the fused kernel won by more than 10% (the
/// models' errors, which a tuned entry corrects): at most one in 20.
#[test]
fn the_guard_lifts_the_corpus_rows_it_serves() {
    let guard = Guard::shipped_sm90();
    let cache = TunedCache::default();
    let files: Vec<String> = LAUNCHER_CORPUS_FILES.iter().map(|f| f.to_string()).collect();
    // One GPU for the models and the rows (provenance_of asserts it).
    let mut with_models = files.clone();
    with_models.push(vendor_files()[0].clone());
    provenance_of(&with_models);
    let (mut rows, mut below_before, mut below_after, mut routed, mut routed_wins) = (0, 0, 0, 0, 0);
    for (gemm, dims, row) in files.iter().flat_map(|file| gemm_rows(file)) {
        let kind = KernelKind::of(&gemm, DType::F16);
        let config = select(Arch::Sm90, &kind).unwrap();
        let Ok(verdicts) = guard.verdicts(
            &cache,
            Arch::Sm90,
            &gemm,
            DType::F16,
            (Some(dims[1]), Some(dims[2])),
            &config,
            TierChoice::LeastLoads,
        ) else {
            continue;
        };
        rows += 1;
        let ratio = row["ratio"].as_f64().unwrap();
        let vendor = verdicts[MBucket::of(u32::try_from(dims[0]).unwrap()).index()].vendor;
        below_before += usize::from(ratio < 0.98);
        below_after += usize::from(!vendor && ratio < 0.98);
        routed += usize::from(vendor);
        routed_wins += usize::from(vendor && ratio > 1.1);
        if vendor && ratio > 1.1 {
            eprintln!(
                "routed, though fused won: {} {} ratio {ratio:.2}",
                row["kernel"], row["shape"]
            );
        }
    }
    eprintln!(
        "{files:?}: {rows} rows the guard serves; below 0.98: {below_before} fused, {below_after} guarded; {routed} routed, {routed_wins} of them won by the fused kernel by more than 10%"
    );
    assert!(rows >= 100, "{rows} rows");
    assert!(below_after < below_before, "{below_after} >= {below_before}");
    assert!(routed_wins * 20 <= routed, "{routed_wins} of {routed}");
}

/// Where N or K is dynamic the run time decides per call what a build with
/// the same N and K static decides per M bucket: for every GEMM of the
/// corpus (`benchmarks/corpus.toml`), its built-in graph (N and K dynamic)
/// is rendered with the guard, as the build writes its plan table, and the
/// verdict the run time makes from that table's route on each bucket at the
/// layer's N and K ([`crate::guard_model::GuardCosts::vendor_in`], as
/// `fusion::plan::RouteModel` calls it) is the build's verdict on that
/// bucket for the static shape, in f16 and bf16, with the tiles the
/// launcher chooses and with those the model chooses (`FUSION_SELECT=model`).
/// A kernel the guard does not serve is served by neither.
#[test]
fn the_verdict_per_call_is_the_builds_on_the_corpus() {
    use crate::codegen::{GraphSpec, KernelVariants, render_tuned};
    use std::collections::BTreeMap;
    let text = std::fs::read_to_string(repo_root().join("benchmarks/corpus.toml")).unwrap();
    let corpus = crate::corpus::Corpus::parse(&text).unwrap();
    let shapes = corpus.shapes();
    let guard = Guard::shipped_sm90();
    let table = super::super::TunedTable::shipped(Arch::Sm90).unwrap();
    let dtypes = [DType::F16, DType::BF16];
    let (mut compared, mut routed, mut unserved) = (0, 0, 0);
    for model in [None, Some(Calibration::shipped_sm90())] {
        let mut cache = TunedCache::default();
        (cache.guard, cache.model) = (Some(guard.clone()), model);
        // Each built-in graph rendered once: its GEMM's plan-table entry.
        let mut rendered: BTreeMap<String, (GemmComposition, KernelVariants)> = BTreeMap::new();
        for shape in &shapes {
            let (gemm, variants) = rendered.entry(shape.kernel.clone()).or_insert_with(|| {
                let path = repo_root().join("graphs").join(format!("{}.toml", shape.kernel));
                let plan = crate::fuse::plan(crate::load_toml_graph(&path).unwrap());
                let spec = GraphSpec {
                    plan,
                    dtypes: dtypes.to_vec(),
                    origin: format!("graphs/{}.toml", shape.kernel),
                    fingerprint: None,
                    declaration: String::new(),
                };
                let library = render_tuned("corpus", &[Arch::Sm90], &[spec], &[], &cache).unwrap();
                let graph = &library.graphs[0];
                let index = graph
                    .spec
                    .plan
                    .kernels
                    .iter()
                    .position(|k| matches!(k.composition, Composition::Gemm(_)))
                    .unwrap();
                let Composition::Gemm(gemm) = &graph.spec.plan.kernels[index].composition else {
                    unreachable!()
                };
                (gemm.clone(), graph.kernels[index].clone())
            });
            for (variant, &dtype) in dtypes.iter().enumerate() {
                let kind = KernelKind::of(gemm, dtype);
                let mut selected = super::super::select_tuned(
                    &table,
                    &cache,
                    Arch::Sm90,
                    &kind,
                    Some(shape.n),
                    Some(shape.k),
                )
                .unwrap();
                // A static N also fits the table's small-M tiers to N, which
                // the dynamic unit cannot: compare with a dynamic N's tiles
                // (the table's and a 64x64 few_m tile), and with the model's
                // choice among them.
                let table_config =
                    super::super::select_tuned(&table, &TunedCache::default(), Arch::Sm90, &kind, None, None)
                        .unwrap()
                        .config;
                if let Some(model) = cache.model.as_ref() {
                    let (config, _) = crate::select::model::select_by_model(
                        model,
                        Arch::Sm90,
                        &kind,
                        shape.n,
                        shape.k,
                        &table_config,
                    )
                    .unwrap();
                    selected.config = config;
                } else if selected.fitted_width.is_some() {
                    selected.config = table_config;
                }
                let at_build = guard.verdicts(
                    &cache,
                    Arch::Sm90,
                    gemm,
                    dtype,
                    (Some(shape.n), Some(shape.k)),
                    &selected.config,
                    crate::select::tier_choice(Arch::Sm90, selected.tuned_for.is_some()),
                );
                let Some((route, units)) = &variants.call_route else {
                    assert!(
                        matches!(at_build, Err(Unguarded::Path(_))),
                        "{}: the build serves what the run time does not",
                        shape.kernel
                    );
                    unserved += 1;
                    continue;
                };
                let at_build = at_build.unwrap();
                let unit = units[variant].expect("sm90 in f16 and bf16 is served");
                let tiers_by = variants.tiers[variant]
                    .and(cache.model.as_ref())
                    .map(|m| &m.costs);
                for verdict in &at_build {
                    let per_call = guard.costs().vendor_in(
                        &route.work,
                        &unit,
                        tiers_by,
                        verdict.bucket,
                        (shape.n, shape.k),
                    );
                    assert_eq!(
                        per_call, verdict.vendor,
                        "{} {dtype} at N={} K={}: {verdict}",
                        shape.kernel, shape.n, shape.k
                    );
                    compared += 1;
                    routed += usize::from(per_call);
                }
            }
        }
    }
    eprintln!("{compared} buckets compared, {routed} routed; {unserved} unserved kernels");
    assert!(compared >= 200, "{compared} buckets compared");
    assert!(routed > 0 && routed < compared, "{routed} of {compared} routed");
}
