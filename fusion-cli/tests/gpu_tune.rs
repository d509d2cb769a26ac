//! `fusion tune` on a GPU: a small FFN sub-layer (a norm folded into a
//! gated pair, then the down projection with the residual), two candidates
//! per kernel built by nvcc at run time, each checked against the CPU
//! reference and timed through the run time's executor. GPU and nvcc only
//! (`#[ignore]`d; the tables the candidates run through are checked
//! without a GPU by `fusion_cli::tune`'s unit tests).

use fusion::core::select::TunedCache;
use fusion_cli::bench::timing::TimingPlan;
use fusion_cli::tune::{Settings, tune};
use std::path::PathBuf;

/// An FFN sub-layer at small sizes (`fusion run`'s GPU test runs it too):
/// its norm folds into the gated pair's interleaved weight, and the down
/// projection's weight is a plain bound weight (read from a copy with its
/// rows padded where `FUSION_PAD_WEIGHTS` says that reads faster).
const SUBLAYER: &str = include_str!("graphs/small_sublayer.toml");

fn folder() -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fusion-gpu-tune-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

#[test]
#[ignore = "needs a CUDA GPU and nvcc"]
fn every_candidate_is_checked_and_timed_through_the_executor() {
    let dir = folder();
    let graph = dir.join("sublayer.toml");
    std::fs::write(&graph, SUBLAYER).expect("write the graph");
    let settings = Settings {
        ms: vec![64, 300],
        dims: Vec::new(),
        arch: None,
        dtype: None,
        cache: dir.join("tuned.json"),
        work: dir.join("work"),
        jobs: std::thread::available_parallelism().map_or(1, |n| n.get()),
        limit: Some(2),
        timing: TimingPlan { warmup: 2, runs: 5 },
        force: true,
    };
    let mut out = Vec::new();
    let result = tune(&[graph], &settings, &mut out);
    let said = String::from_utf8(out).expect("the output is text");
    result.unwrap_or_else(|e| panic!("{e}\n{said}"));
    for index in [0, 1] {
        assert!(
            said.contains(&format!("graph `small_sublayer`, kernel #{index} `")),
            "{said}"
        );
    }
    // Every candidate called through the executor matched the reference
    // (the gated kernel's folded norm against exact rows), at both Ms of
    // both kernels.
    for m in [64, 300] {
        let lines: Vec<&str> = said
            .lines()
            .filter(|line| line.trim_start().starts_with(&format!("M = {m} (")))
            .collect();
        assert_eq!(lines.len(), 2, "{said}");
        for line in lines {
            assert!(line.contains(" 0 rejected; best "), "{line}\n{said}");
        }
    }
    let cache = TunedCache::read(&settings.cache);
    assert!(cache.warnings.is_empty(), "{:?}", cache.warnings);
    assert_eq!(cache.entries.len(), 4, "{said}");
    assert!(
        cache
            .entries
            .values()
            .all(|e| e.time_us > 0.0 && e.default_time_us > 0.0 && e.cublaslt_time_us > 0.0)
    );
    std::fs::remove_dir_all(&dir).ok();
}
