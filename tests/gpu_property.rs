//! A property test on the GPU: random (pattern, dtype, layout, M, N, K)
//! cases through the generated wrappers against the CPU reference, with
//! fresh random inputs and NaN-poisoned outputs each time.
//!
//! Half of the norm GEMM cases draw rows far from zero (mean 1 to 4, half-width
//! 0.5) and a gamma with zeros and negative values; the norm GEMMs run both
//! through the free functions (gamma per call) and through their structs
//! (weights bound, the norm folded into w).
//!
//! M is drawn up to 2000 (with M = 0 and M = 1 among them, and one case in
//! ten from 2 to 24, the decode kernel's sizes), N and K are multiples of 8
//! up to 3000; the layout is the pattern's (`gemm_silu`, `gemm_bias_silu`
//! and `gemm_gelu_glu` read their weights as [K, N], the rest as [N, K]).
//! The gated GEMMs run per call and through their structs. Every
//! case runs, failures are collected, and the test fails listing them with
//! the seed to replay: `FUSION_TEST_SEED=<seed> ./gpu_property --ignored`.
//! `FUSION_PROPERTY_CASES` changes the number of cases (default 300).
//!
//! One case in four is a layer of the model corpus (`benchmarks/corpus.toml`,
//! built in): its kernel (a folded norm through its struct or its free
//! function, a gated pair per call or bound) at its own N and K, with a
//! ragged M drawn log-uniformly from 1 to 8192. The corpus cases take the
//! corpus's kernels in turn (a layer of that kernel at random) and, in
//! turn, M from four ranges (1-16, 16-256, 256-2048, 2048-8192), so that
//! every kernel and every range is drawn. The host's copies of one
//! case are kept under [`CORPUS_ELEMENTS`] elements per tensor: layers whose
//! weight is larger are not drawn, and M is cut where M × K or M × N would
//! pass it.

mod support;

use fusion::core::reference::Intermediates;
use fusion::half::{bf16, f16};
use fusion::kernels;
use fusion::{Tensor, TensorMut};
use rand::Rng;
use support::{TestElement, check_adjusted, rng, stream};

/// How a pattern's dims are named.
#[derive(Clone, Copy, Debug)]
enum Dims {
    /// M, N, K: one GEMM.
    Gemm,
    /// M and the row length under this name: a row-wise kernel.
    Rows(&'static str),
}

const PATTERNS: &[(&str, Dims)] = &[
    ("gemm", Dims::Gemm),
    ("gemm_bias_gelu", Dims::Gemm),
    ("gemm_bias_silu", Dims::Gemm),
    ("gemm_bias_relu", Dims::Gemm),
    ("gemm_bias", Dims::Gemm),
    ("gemm_bias_residual", Dims::Gemm),
    ("gemm_residual", Dims::Gemm),
    ("gemm_gelu", Dims::Gemm),
    ("gemm_silu", Dims::Gemm),
    ("gemm_bias_sigmoid", Dims::Gemm),
    ("gemm_gelu_quick", Dims::Gemm),
    ("layernorm_gemm", Dims::Gemm),
    ("rmsnorm_gemm", Dims::Gemm),
    // The same graphs through their structs, whose weights are bound and
    // the norm folded into w.
    ("layernorm_gemm_folded", Dims::Gemm),
    ("rmsnorm_gemm_folded", Dims::Gemm),
    // Gated GEMMs: per call (gate and up interleaved by the launch) and
    // through their structs (interleaved when bound).
    ("gemm_silu_glu", Dims::Gemm),
    ("gemm_gelu_glu", Dims::Gemm),
    ("gemm_silu_glu_bound", Dims::Gemm),
    ("gemm_gelu_glu_bound", Dims::Gemm),
    ("silu", Dims::Rows("N")),
    ("sigmoid", Dims::Rows("N")),
    ("gelu_quick", Dims::Rows("N")),
    ("mul", Dims::Rows("N")),
    ("silu_mul", Dims::Rows("N")),
    ("layernorm", Dims::Rows("K")),
    ("rmsnorm", Dims::Rows("K")),
];

/// The weight layout of a pattern, for the report.
fn layout(pattern: &str) -> &'static str {
    if matches!(pattern, "gemm_silu" | "gemm_bias_silu") || pattern.starts_with("gemm_gelu_glu") {
        "KN"
    } else {
        "NK"
    }
}

/// Calls a pattern's wrapper: `r` holds inputs then weights, `w` the output.
fn launch<T: TestElement>(
    s: &std::sync::Arc<fusion::cudarc::driver::CudaStream>,
    pattern: &str,
    r: &[Tensor<'_, T>],
    w: &mut [TensorMut<'_, T>],
) -> fusion::Result<()> {
    match pattern {
        "gemm" => kernels::gemm(s, &r[0], &r[1], &mut w[0]),
        "gemm_bias_gelu" => kernels::gemm_bias_gelu(s, &r[0], &r[1], &r[2], &mut w[0]),
        "gemm_bias_silu" => kernels::gemm_bias_silu(s, &r[0], &r[1], &r[2], &mut w[0]),
        "gemm_bias_relu" => kernels::gemm_bias_relu(s, &r[0], &r[1], &r[2], &mut w[0]),
        "gemm_bias" => kernels::gemm_bias(s, &r[0], &r[1], &r[2], &mut w[0]),
        "gemm_bias_residual" => kernels::gemm_bias_residual(s, &r[0], &r[1], &r[2], &r[3], &mut w[0]),
        "gemm_residual" => kernels::gemm_residual(s, &r[0], &r[1], &r[2], &mut w[0]),
        "gemm_gelu" => kernels::gemm_gelu(s, &r[0], &r[1], &mut w[0]),
        "gemm_silu" => kernels::gemm_silu(s, &r[0], &r[1], &mut w[0]),
        "gemm_bias_sigmoid" => kernels::gemm_bias_sigmoid(s, &r[0], &r[1], &r[2], &mut w[0]),
        "gemm_gelu_quick" => kernels::gemm_gelu_quick(s, &r[0], &r[1], &mut w[0]),
        "layernorm_gemm" => kernels::layernorm_gemm(s, &r[0], &r[1], &r[2], &r[3], &mut w[0]),
        "rmsnorm_gemm" => kernels::rmsnorm_gemm(s, &r[0], &r[1], &r[2], &mut w[0]),
        "layernorm_gemm_folded" => support::layernorm_gemm_folded(s, r, w),
        "rmsnorm_gemm_folded" => support::rmsnorm_gemm_folded(s, r, w),
        "gemm_silu_glu" => kernels::gemm_silu_glu(s, &r[0], &r[1], &r[2], &mut w[0]),
        "gemm_gelu_glu" => kernels::gemm_gelu_glu(s, &r[0], &r[1], &r[2], &mut w[0]),
        "gemm_silu_glu_bound" => support::gemm_silu_glu_bound(s, &r[0], &r[1], &r[2], &mut w[0]),
        "gemm_gelu_glu_bound" => support::gemm_gelu_glu_bound(s, &r[0], &r[1], &r[2], &mut w[0]),
        "silu" => kernels::silu(s, &r[0], &mut w[0]),
        "sigmoid" => kernels::sigmoid(s, &r[0], &mut w[0]),
        "gelu_quick" => kernels::gelu_quick(s, &r[0], &mut w[0]),
        "mul" => kernels::mul(s, &r[0], &r[1], &mut w[0]),
        "silu_mul" => kernels::silu_mul(s, &r[0], &r[1], &mut w[0]),
        "layernorm" => kernels::layernorm(s, &r[0], &r[1], &r[2], &mut w[0]),
        "rmsnorm" => kernels::rmsnorm(s, &r[0], &r[1], &mut w[0]),
        other => panic!("no wrapper for pattern `{other}`"),
    }
}

/// One drawn case.
#[derive(Debug)]
struct Draw {
    pattern: &'static str,
    dims: Dims,
    bf16: bool,
    m: usize,
    n: usize,
    k: usize,
    /// A norm GEMM's rows drawn around this mean (half-width 0.5) and its
    /// gamma with zeros and negative values; 0 for plain random inputs.
    row_mean: f64,
}

impl Draw {
    fn dims(&self) -> Vec<(&'static str, usize)> {
        match self.dims {
            Dims::Gemm => vec![("M", self.m), ("N", self.n), ("K", self.k)],
            Dims::Rows(cols) => vec![("M", self.m), (cols, self.n)],
        }
    }

    fn label(&self, index: usize) -> String {
        let dims: Vec<String> = self.dims().iter().map(|(d, v)| format!("{d}={v}")).collect();
        let rows = if self.row_mean != 0.0 {
            format!(" rows around {:.2}", self.row_mean)
        } else {
            String::new()
        };
        format!(
            "case {index}: {} {} {} {}{rows}",
            self.pattern,
            if self.bf16 { "bf16" } else { "f16" },
            layout(self.pattern),
            dims.join(" ")
        )
    }

    /// The graph it runs: the pattern, or the graph whose struct it uses.
    fn graph(&self) -> &'static str {
        let pattern = self.pattern;
        pattern
            .strip_suffix("_folded")
            .or_else(|| pattern.strip_suffix("_bound"))
            .unwrap_or(pattern)
    }

    /// What its launch rounds between ops: a free function normalizes a
    /// norm GEMM's A into T before the GEMM; a struct folds the norm.
    fn intermediates(&self) -> Intermediates {
        if self.pattern.ends_with("_folded") {
            Intermediates::Exact
        } else {
            Intermediates::RoundedNorms
        }
    }
}

/// The most elements a host tensor of a corpus case may hold (64 Mi: half
/// a GiB in the reference's f64).
const CORPUS_ELEMENTS: usize = 1 << 26;

/// The largest M a corpus case draws.
const CORPUS_MAX_M: usize = 8192;

/// The corpus's distinct (kernel, N, K) whose weights fit
/// [`CORPUS_ELEMENTS`].
fn corpus_layers() -> Vec<(String, usize, usize)> {
    let corpus = fusion::core::corpus::Corpus::parse(include_str!("../benchmarks/corpus.toml"))
        .unwrap_or_else(|e| panic!("the built-in corpus: {e}"));
    corpus
        .shapes()
        .into_iter()
        .map(|s| (s.kernel, s.n as usize, s.k as usize))
        .filter(|(_, n, k)| n * k <= CORPUS_ELEMENTS)
        .collect()
}

/// A corpus layer's kernel as one of [`PATTERNS`]: a norm GEMM through its
/// struct (the norm folded, as a model binds it) or its free function, a
/// gated pair bound or per call.
fn corpus_pattern(kernel: &str, rng: &mut rand::rngs::StdRng) -> (&'static str, Dims) {
    let variant = match kernel {
        "layernorm_gemm" | "rmsnorm_gemm" if rng.random_bool(0.5) => format!("{kernel}_folded"),
        "gemm_silu_glu" | "gemm_gelu_glu" if rng.random_bool(0.5) => format!("{kernel}_bound"),
        _ => kernel.to_string(),
    };
    *PATTERNS
        .iter()
        .find(|(p, _)| *p == variant)
        .unwrap_or_else(|| panic!("the corpus's kernel `{kernel}` is not a pattern here"))
}

/// Draws the case list up front, so a replay draws the same cases whatever
/// the cases themselves consume.
fn draw_cases(count: usize) -> Vec<Draw> {
    let mut rng = rng();
    let multiple_of_8 = |rng: &mut rand::rngs::StdRng| 8 * rng.random_range(1..=375usize);
    let layers = corpus_layers();
    let mut kernels: Vec<&str> = layers.iter().map(|(kernel, _, _)| kernel.as_str()).collect();
    kernels.sort_unstable();
    kernels.dedup();
    (0..count)
        .map(|i| {
            if i % 4 == 3 {
                let j = i / 4;
                let kernel = kernels[j % kernels.len()];
                let of_kernel: Vec<_> = layers.iter().filter(|l| l.0 == kernel).collect();
                let &(_, n, k) = of_kernel[rng.random_range(0..of_kernel.len())];
                let (pattern, dims) = corpus_pattern(kernel, &mut rng);
                // Log-uniform within the turn's range of 1..=8192, then cut
                // to the host's budget.
                let (low, high) =
                    [(0.0, 4.0), (4.0, 8.0), (8.0, 11.0), (11.0, 13.0)][(j / kernels.len()) % 4];
                let m = 2f64.powf(rng.random_range(low..=high)).round() as usize;
                let m = m.clamp(1, CORPUS_MAX_M.min(CORPUS_ELEMENTS / n.max(k)));
                let norm = pattern.contains("norm_gemm");
                return Draw {
                    pattern,
                    dims,
                    bf16: rng.random_bool(0.5),
                    m,
                    n,
                    k,
                    row_mean: if norm && rng.random_bool(0.5) {
                        rng.random_range(1.0..4.0)
                    } else {
                        0.0
                    },
                };
            }
            let (pattern, dims) = PATTERNS[rng.random_range(0..PATTERNS.len())];
            // A few exact edge cases at fixed positions, one case in ten
            // at decode sizes (the decode kernel's rows and just past
            // them), the rest spread out.
            let m = match i % 50 {
                0 => 0,
                1 => 1,
                2..=5 => rng.random_range(2..=24),
                _ => rng.random_range(2..=2000),
            };
            let norm = pattern.contains("norm_gemm");
            Draw {
                pattern,
                dims,
                bf16: rng.random_bool(0.5),
                m,
                n: multiple_of_8(&mut rng),
                k: multiple_of_8(&mut rng),
                row_mean: if norm && rng.random_bool(0.5) {
                    rng.random_range(1.0..4.0)
                } else {
                    0.0
                },
            }
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU"]
fn random_cases_match_the_reference() {
    let count = std::env::var("FUSION_PROPERTY_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let s = stream();
    let cases = draw_cases(count);
    let mut failures = Vec::new();
    for (index, case) in cases.iter().enumerate() {
        let label = case.label(index);
        let dims = case.dims();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let adjust = |host: &mut fusion::core::reference::Bindings| {
                if case.row_mean != 0.0 {
                    support::off_center_norm_inputs(host, case.row_mean);
                }
            };
            let (graph, rounded) = (case.graph(), case.intermediates());
            if case.bf16 {
                check_adjusted::<bf16>(&s, graph, &dims, rounded, adjust, |r, w| {
                    launch(&s, case.pattern, r, w)
                });
            } else {
                check_adjusted::<f16>(&s, graph, &dims, rounded, adjust, |r, w| {
                    launch(&s, case.pattern, r, w)
                });
            }
        }));
        if let Err(panic) = outcome {
            let message = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            eprintln!("FAIL {label}: {message}");
            failures.push(format!("{label}: {message}"));
        }
    }
    eprintln!(
        "property: {} cases, {} failures (replay with the FUSION_TEST_SEED printed above)",
        cases.len(),
        failures.len()
    );
    assert!(
        failures.is_empty(),
        "{} failures:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

#[test]
fn the_case_list_covers_every_pattern_both_dtypes_and_the_edges() {
    // Runs without a GPU: the drawing itself.
    let cases = draw_cases(300);
    for (pattern, _) in PATTERNS {
        assert!(
            cases.iter().any(|c| c.pattern == *pattern),
            "{pattern} never drawn"
        );
    }
    assert!(cases.iter().any(|c| c.bf16) && cases.iter().any(|c| !c.bf16));
    assert!(cases.iter().filter(|c| c.m == 0).count() >= 3);
    assert!(cases.iter().filter(|c| c.m == 1).count() >= 3);
    let drawn: Vec<&Draw> = cases
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 4 != 3)
        .map(|(_, c)| c)
        .collect();
    let corpus: Vec<&Draw> = cases
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 4 == 3)
        .map(|(_, c)| c)
        .collect();
    assert!(drawn.iter().all(|c| c.m <= 2000 && c.n % 8 == 0 && c.k % 8 == 0));
    assert!(
        drawn
            .iter()
            .all(|c| (8..=3000).contains(&c.n) && (8..=3000).contains(&c.k))
    );
    // The corpus's cases: its layers' own N and K, M from 1 up to the
    // host's budget, and every corpus kernel among them.
    let layers = corpus_layers();
    assert!(
        layers.len() >= 40,
        "{} corpus layers fit the budget",
        layers.len()
    );
    for c in &corpus {
        assert!(
            layers
                .iter()
                .any(|(kernel, n, k)| c.graph() == kernel && (c.n, c.k) == (*n, *k)),
            "{c:?} is not a corpus layer"
        );
        assert!((1..=CORPUS_MAX_M).contains(&c.m), "{c:?}");
        assert!(c.m * c.n.max(c.k) <= CORPUS_ELEMENTS, "{c:?}");
    }
    for (kernel, _, _) in &layers {
        assert!(
            corpus.iter().any(|c| c.graph() == kernel),
            "the corpus kernel {kernel} never drawn"
        );
    }
    assert!(corpus.iter().any(|c| c.m > 2000), "no corpus case past M = 2000");
    assert!(corpus.iter().any(|c| c.m <= 16), "no decode-sized corpus case");
    assert!(cases.iter().any(|c| layout(c.pattern) == "KN"));
    assert!(
        cases
            .iter()
            .any(|c| c.row_mean != 0.0 && c.pattern.ends_with("_folded")),
        "no folded norm drawn with off-center rows"
    );
}
