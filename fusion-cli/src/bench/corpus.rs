//! `fusion bench --corpus`: the layers of public models
//! ([`fusion_compiler::corpus`]) as bench cases, and the summary a speed
//! claim over them is stated in: per kernel family, the geometric mean, the
//! 10th percentile and the minimum of the ratio to cuBLASLt, for the first
//! algorithm and for the best of the top candidates, over small and large M.
//!
//! The summary reads rows alone, so it serves a run just made and the JSON
//! files of earlier runs (`fusion bench --summary FILE.json`) alike.

use super::{NormRow, Pattern, Row};
use fusion_compiler::corpus::{Corpus, Norm};
use std::collections::BTreeMap;

/// One case of a corpus run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Case {
    /// A GEMM pattern at (M, N, K).
    Gemm(Pattern, (usize, usize, usize)),
    /// A standalone norm at (M, K).
    Norm(NormRow, (usize, usize)),
}

impl Case {
    /// The kernel's name, as `--kernel` names it.
    pub fn kernel(self) -> &'static str {
        match self {
            Case::Gemm(pattern, _) => pattern.name(),
            Case::Norm(norm, _) => norm.name(),
        }
    }

    /// M, the token count.
    pub fn m(self) -> usize {
        match self {
            Case::Gemm(_, (m, _, _)) | Case::Norm(_, (m, _)) => m,
        }
    }
}

/// Every distinct layer of `corpus`, then every distinct norm, at each
/// token count (`tokens`, else the corpus's own), in the corpus's order. An
/// error names a layer whose kernel is not a pattern of the bench.
pub fn cases(corpus: &Corpus, tokens: Option<&[u64]>) -> Result<Vec<Case>, String> {
    let tokens = tokens.unwrap_or(&corpus.tokens);
    let mut cases = Vec::new();
    for shape in corpus.shapes() {
        let pattern = Pattern::parse(&shape.kernel).ok_or_else(|| {
            format!(
                "{} runs on `{}`, which fusion bench does not time",
                shape.used_by.join(", "),
                shape.kernel
            )
        })?;
        for &m in tokens {
            cases.push(Case::Gemm(
                pattern,
                (m as usize, shape.n as usize, shape.k as usize),
            ));
        }
    }
    for norm in corpus.norms() {
        let row = match norm.norm {
            Norm::LayerNorm => NormRow::LayerNorm,
            Norm::RmsNorm => NormRow::RmsNorm,
        };
        for &m in tokens {
            cases.push(Case::Norm(row, (m as usize, norm.k as usize)));
        }
    }
    Ok(cases)
}

/// Part `index` (from 1) of `parts` of `cases`: every `parts`-th case, so
/// that each part has small and large shapes alike.
pub fn shard(cases: Vec<Case>, index: usize, parts: usize) -> Vec<Case> {
    cases
        .into_iter()
        .enumerate()
        .filter(|(i, _)| i % parts == index - 1)
        .map(|(_, case)| case)
        .collect()
}

/// M at or below this is the small-M class of the targets (decode and short
/// prompts); above it, the large.
pub const SMALL_M: usize = 64;

/// The statistics of one set of ratios.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spread {
    /// How many ratios.
    pub count: usize,
    /// Their geometric mean.
    pub geomean: f64,
    /// The nearest-rank 10th percentile: the value a tenth of the ratios
    /// are at or below.
    pub p10: f64,
    /// The lowest ratio.
    pub min: f64,
}

impl Spread {
    /// None for no ratios.
    pub fn of(ratios: &[f64]) -> Option<Spread> {
        if ratios.is_empty() {
            return None;
        }
        let mut sorted = ratios.to_vec();
        sorted.sort_by(f64::total_cmp);
        let rank = (sorted.len() as f64 * 0.1).ceil().max(1.0) as usize;
        Some(Spread {
            count: sorted.len(),
            geomean: geomean(sorted.iter().copied()),
            p10: sorted[rank - 1],
            min: sorted[0],
        })
    }
}

/// The geometric mean of positive `values` (at least one).
pub fn geomean(values: impl Iterator<Item = f64>) -> f64 {
    let (sum, count) = values.fold((0.0, 0usize), |(s, c), v| (s + v.ln(), c + 1));
    (sum / count as f64).exp()
}

/// One line of the summary: a kernel family over an M class.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    /// The rows' kernel, as [`Row::kernel`] names it.
    pub kernel: String,
    /// `M ≤ 64`, `M ≥ 128` (above [`SMALL_M`]) or `all M`.
    pub class: &'static str,
    /// The rows' ratios to the baseline with cuBLASLt's first algorithm
    /// ([`Row::ratio`]).
    pub first: Spread,
    /// The rows' ratios to the baseline with the best of its top candidates
    /// ([`Row::best_ratio`]).
    pub best: Spread,
    /// The row of the lowest ratio to the first: its shape.
    pub worst: String,
}

/// A class of token counts: its label, and whether M is in it.
type MClass = (&'static str, fn(usize) -> bool);

/// M of a row's shape: `M,N,K`, or the FFN rows' `M=… D=… F=…`.
fn m_of(row: &Row) -> Option<usize> {
    let shape = row.shape.as_str();
    match shape.strip_prefix("M=") {
        Some(rest) => rest.split(' ').next()?.parse().ok(),
        None => shape.split(',').next()?.parse().ok(),
    }
}

/// The summary of `rows`, kernel by kernel in the order they first appear:
/// small M, large M and, where a kernel has rows in both, all M. Where a
/// kernel has several rows at one shape (the SwiGLU block against three
/// baselines), the one with the lowest ratio to the first counts: the
/// strongest baseline. Rows whose shape has no M are left out.
pub fn summarize(rows: &[Row]) -> Vec<Summary> {
    let mut kernels: Vec<&str> = Vec::new();
    let mut by_kernel: BTreeMap<&str, Vec<(usize, &Row)>> = BTreeMap::new();
    for row in rows {
        let Some(m) = m_of(row) else { continue };
        if !kernels.contains(&row.kernel.as_str()) {
            kernels.push(&row.kernel);
        }
        let kept = by_kernel.entry(&row.kernel).or_default();
        match kept.iter_mut().find(|(_, r)| r.shape == row.shape) {
            Some(same) if row.ratio < same.1.ratio => same.1 = row,
            Some(_) => {}
            None => kept.push((m, row)),
        }
    }
    let classes: [MClass; 3] = [
        ("M ≤ 64", |m| m <= SMALL_M),
        ("M ≥ 128", |m| m > SMALL_M),
        ("all M", |_| true),
    ];
    let mut out = Vec::new();
    for kernel in kernels {
        let rows = &by_kernel[kernel];
        let both = rows.iter().any(|(m, _)| *m <= SMALL_M) && rows.iter().any(|(m, _)| *m > SMALL_M);
        for (class, within) in classes {
            if class == "all M" && !both {
                continue;
            }
            let chosen: Vec<&Row> = rows.iter().filter(|(m, _)| within(*m)).map(|(_, r)| *r).collect();
            let ratios = |f: fn(&Row) -> f64| chosen.iter().map(|r| f(r)).collect::<Vec<_>>();
            let (Some(first), Some(best)) = (
                Spread::of(&ratios(|r| r.ratio)),
                Spread::of(&ratios(|r| r.best_ratio)),
            ) else {
                continue;
            };
            let worst = chosen
                .iter()
                .min_by(|a, b| a.ratio.total_cmp(&b.ratio))
                .map_or(String::new(), |r| r.shape.clone());
            out.push(Summary {
                kernel: kernel.to_string(),
                class,
                first,
                best,
                worst,
            });
        }
    }
    out
}

/// The summary as a text table.
pub fn summary_table(summaries: &[Summary]) -> String {
    let mut out = format!(
        "{:<20} {:<8} {:>5}  {:>7} {:>7} {:>7}  {:>7} {:>7} {:>7}  {}\n",
        "kernel", "M", "rows", "geomean", "p10", "min", "geomean", "p10", "min", "lowest (M,N,K)"
    );
    out.push_str(&format!(
        "{:<20} {:<8} {:>5}  {:^23}  {:^23}\n",
        "", "", "", "against first", "against best"
    ));
    for s in summaries {
        out.push_str(&format!(
            "{:<20} {:<8} {:>5}  {:>7.3} {:>7.3} {:>7.3}  {:>7.3} {:>7.3} {:>7.3}  {}\n",
            s.kernel,
            s.class,
            s.first.count,
            s.first.geomean,
            s.first.p10,
            s.first.min,
            s.best.geomean,
            s.best.p10,
            s.best.min,
            s.worst
        ));
    }
    out.push_str(
        "ratio = the cuBLASLt baseline's time / ours (above 1: fusion is faster); p10: the nearest-rank \
         10th percentile\n",
    );
    out
}

/// The summary as a Markdown table, for a document that quotes a run
/// (BENCHMARKS.md's head).
pub fn summary_markdown(summaries: &[Summary]) -> String {
    let mut out = String::from(
        "| kernel | M | rows | first: geomean | p10 | min | best: geomean | p10 | min | lowest (M,N,K) |\n\
         | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n",
    );
    for s in summaries {
        out.push_str(&format!(
            "| {} | {} | {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {:.3} | {} |\n",
            s.kernel,
            s.class,
            s.first.count,
            s.first.geomean,
            s.first.p10,
            s.first.min,
            s.best.geomean,
            s.best.p10,
            s.best.min,
            s.worst
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(kernel: &str, shape: &str, ratio: f64, best_ratio: f64) -> Row {
        Row::for_test(kernel, shape, 1.0, 0.0, ratio, best_ratio)
    }

    #[test]
    fn spread_is_the_geometric_mean_nearest_rank_p10_and_min() {
        let s = Spread::of(&[2.0, 0.5, 1.0, 1.0]).unwrap();
        assert_eq!(s.count, 4);
        assert!((s.geomean - 1.0).abs() < 1e-12);
        assert_eq!((s.p10, s.min), (0.5, 0.5));
        // 20 ratios: the 2nd lowest is the 10th percentile.
        let many: Vec<f64> = (1..=20).map(f64::from).collect();
        assert_eq!(Spread::of(&many).unwrap().p10, 2.0);
        assert!(Spread::of(&[]).is_none());
    }

    #[test]
    fn rows_are_summarized_per_kernel_and_m_class() {
        let rows = [
            row("gemm", "1,4096,4096", 0.9, 0.8),
            row("gemm", "64,4096,4096", 1.1, 1.0),
            row("gemm", "128,4096,4096", 1.2, 1.0),
            row("gemm_residual", "4096,4096,4096", 1.0, 0.95),
            row("swiglu_ffn", "M=1 D=4096 F=14336", 1.0, 1.0),
            row("swiglu_ffn", "M=1 D=4096 F=14336", 0.95, 0.9),
            row("swiglu_ffn", "M=1 D=4096 F=14336", 1.05, 1.0),
        ];
        let s = summarize(&rows);
        let lines: Vec<(&str, &str, usize)> = s
            .iter()
            .map(|s| (s.kernel.as_str(), s.class, s.first.count))
            .collect();
        assert_eq!(
            lines,
            [
                ("gemm", "M ≤ 64", 2),
                ("gemm", "M ≥ 128", 1),
                ("gemm", "all M", 3),
                ("gemm_residual", "M ≥ 128", 1),
                ("swiglu_ffn", "M ≤ 64", 1),
            ]
        );
        assert_eq!(s[0].worst, "1,4096,4096");
        // The block's strongest baseline alone.
        assert_eq!((s[4].first.min, s[4].best.min), (0.95, 0.9));
        assert_eq!((s[0].first.min, s[0].best.min), (0.9, 0.8));
        let table = summary_table(&s);
        assert!(table.contains("gemm_residual"), "{table}");
        let markdown = summary_markdown(&s);
        assert_eq!(markdown.lines().count(), 2 + s.len());
        assert!(
            markdown.contains(
                "| gemm | M ≤ 64 | 2 | 0.995 | 0.900 | 0.900 | 0.894 | 0.800 | 0.800 | 1,4096,4096 |"
            ),
            "{markdown}"
        );
    }

    #[test]
    fn the_committed_corpus_maps_to_bench_patterns_and_shards_cover_it() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../benchmarks/corpus.toml");
        let corpus = Corpus::parse(&std::fs::read_to_string(path).unwrap()).unwrap();
        let all = cases(&corpus, None).unwrap();
        assert_eq!(
            all.len(),
            (corpus.shapes().len() + corpus.norms().len()) * corpus.tokens.len()
        );
        assert!(all.iter().any(|c| c.kernel() == "layernorm"));
        assert!(all.iter().any(|c| c.kernel() == "rmsnorm"));
        let only_one = cases(&corpus, Some(&[7])).unwrap();
        assert!(only_one.iter().all(|c| c.m() == 7));
        // Three parts: every case in exactly one, each part non-empty.
        let parts: Vec<Vec<Case>> = (1..=3).map(|i| shard(all.clone(), i, 3)).collect();
        assert_eq!(parts.iter().map(Vec::len).sum::<usize>(), all.len());
        assert!(parts.iter().all(|p| !p.is_empty()));
        assert_eq!(parts[0][..2], [all[0], all[3]]);
        assert_eq!(parts[2][0], all[2]);
    }

    /// Every kernel a corpus model can be given is one the bench times.
    #[test]
    fn every_kernel_the_corpus_derives_is_a_bench_pattern() {
        for (mlp, activation, bias) in [
            ("gated", "silu", false),
            ("gated", "gelu_pytorch_tanh", false),
            ("plain", "gelu_new", true),
            ("plain", "gelu", false),
            ("plain", "relu", true),
            ("plain", "silu", true),
            ("plain", "silu", false),
        ] {
            for norm in ["layernorm", "rmsnorm"] {
                let text = format!(
                    "tokens = [1]\n[[model]]\nname = \"m\"\nsource = \"s\"\nhidden = 64\nintermediate = 128\n\
                     heads = 2\nkv_heads = 1\nhead_dim = 32\nmlp = \"{mlp}\"\nactivation = \"{activation}\"\n\
                     norm = \"{norm}\"\nqkv_bias = {bias}\nout_bias = {bias}\nmlp_bias = {bias}\n"
                );
                let corpus = Corpus::parse(&text).unwrap_or_else(|e| panic!("{text}: {e}"));
                let cases = cases(&corpus, None).unwrap_or_else(|e| panic!("{text}: {e}"));
                assert_eq!(cases.len(), 5);
            }
        }
    }
}
