//! `fusion bench --summary NEW.json --against OLD.json`: two runs row by
//! row, such as the suite's `ab` variants of one bundle (the tables against
//! `FUSION_STREAM_K=fill`) or one kernel change before and after. Rows are
//! matched by kernel, shape, dtype and baseline; for each kernel family it
//! gives the geometric mean, minimum and maximum of our time in the new run
//! over the old, the same of the ratio to cuBLASLt (which also moves with
//! the baseline's time between runs), and how many rows moved beyond both
//! runs' spread; then the rows that moved most each way.
//!
//! "Beyond the spread": the new median outside the old run's interquartile
//! range and the old median outside the new one's, so that a row whose calls
//! scatter is not counted as moved.

use super::Row;
use super::corpus::geomean;
use std::collections::{BTreeMap, BTreeSet};

/// How many rows that moved beyond the spread the table lists each way.
const LISTED: usize = 10;

/// One row of both runs.
#[derive(Clone, Debug, PartialEq)]
pub struct Pair {
    /// The kernel, as `--kernel` names it.
    pub kernel: String,
    /// The row's shape.
    pub shape: String,
    /// Our median in the old run and the new, in µs.
    pub old_us: f64,
    /// See `old_us`.
    pub new_us: f64,
    /// The ratio to cuBLASLt's first algorithm in the old run and the new.
    pub old_ratio: f64,
    /// See `old_ratio`.
    pub new_ratio: f64,
    /// -1: faster beyond the spread, 1: slower beyond it, 0: within it.
    pub moved: i8,
}

impl Pair {
    /// Our time in the new run over the old: below 1, the new is faster.
    pub fn time(&self) -> f64 {
        self.new_us / self.old_us
    }
}

/// Both runs' rows matched up.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The rows of both, in the new run's order.
    pub pairs: Vec<Pair>,
    /// Rows of the new run that the old lacks.
    pub only_new: usize,
    /// Rows of the old run that the new lacks.
    pub only_old: usize,
}

/// A row's identity across runs.
fn key(row: &Row) -> (&str, &str, &str, &str) {
    (&row.kernel, &row.shape, &row.dtype, &row.baseline)
}

/// Matches `new`'s rows with `old`'s (a key repeated within a run counts
/// once, its first row).
pub fn compare(new: &[Row], old: &[Row]) -> Comparison {
    let mut old_by_key: BTreeMap<_, &Row> = BTreeMap::new();
    for row in old {
        old_by_key.entry(key(row)).or_insert(row);
    }
    let mut seen = BTreeSet::new();
    let mut pairs = Vec::new();
    for row in new {
        if !seen.insert(key(row)) {
            continue;
        }
        let Some(before) = old_by_key.get(&key(row)) else {
            continue;
        };
        let (o, n) = (&before.ours_timing, &row.ours_timing);
        let moved = if n.median_us > o.q3_us && o.median_us < n.q1_us {
            1
        } else if n.median_us < o.q1_us && o.median_us > n.q3_us {
            -1
        } else {
            0
        };
        pairs.push(Pair {
            kernel: row.kernel.clone(),
            shape: row.shape.clone(),
            old_us: before.ours_us,
            new_us: row.ours_us,
            old_ratio: before.ratio,
            new_ratio: row.ratio,
            moved,
        });
    }
    Comparison {
        only_new: seen.len() - pairs.len(),
        only_old: old_by_key.len() - pairs.len(),
        pairs,
    }
}

/// The comparison as a text table: per kernel family in the order the
/// new run has them, then all rows, then the rows that moved most.
pub fn comparison_table(c: &Comparison) -> String {
    let mut out = format!(
        "{} rows in both runs ({} only in the new, {} only in the old)\n",
        c.pairs.len(),
        c.only_new,
        c.only_old
    );
    if c.pairs.is_empty() {
        return out;
    }
    out.push_str(&format!(
        "{:<20} {:>5}  {:>7} {:>7} {:>7}  {:>7} {:>7} {:>7}  {:>6} {:>6}\n",
        "kernel", "rows", "geomean", "min", "max", "geomean", "min", "max", "faster", "slower"
    ));
    out.push_str(&format!(
        "{:<20} {:>5}  {:^23}  {:^23}  {:^13}\n",
        "", "", "our time: new / old", "ratio: new / old", "beyond spread"
    ));
    let mut kernels: Vec<&str> = Vec::new();
    for p in &c.pairs {
        if !kernels.contains(&p.kernel.as_str()) {
            kernels.push(&p.kernel);
        }
    }
    let line = |name: &str, pairs: &[&Pair]| {
        let spread = |f: fn(&Pair) -> f64| {
            let values = || pairs.iter().map(|p| f(p));
            (
                geomean(values()),
                values().fold(f64::INFINITY, f64::min),
                values().fold(f64::NEG_INFINITY, f64::max),
            )
        };
        let (t, r) = (spread(Pair::time), spread(|p| p.new_ratio / p.old_ratio));
        let count = |way: i8| pairs.iter().filter(|p| p.moved == way).count();
        format!(
            "{name:<20} {:>5}  {:>7.3} {:>7.3} {:>7.3}  {:>7.3} {:>7.3} {:>7.3}  {:>6} {:>6}\n",
            pairs.len(),
            t.0,
            t.1,
            t.2,
            r.0,
            r.1,
            r.2,
            count(-1),
            count(1)
        )
    };
    for kernel in &kernels {
        let pairs: Vec<&Pair> = c.pairs.iter().filter(|p| p.kernel == *kernel).collect();
        out.push_str(&line(kernel, &pairs));
    }
    if kernels.len() > 1 {
        out.push_str(&line("all", &c.pairs.iter().collect::<Vec<_>>()));
    }
    let mut moved: Vec<&Pair> = c.pairs.iter().filter(|p| p.moved != 0).collect();
    moved.sort_by(|a, b| a.time().total_cmp(&b.time()));
    let faster = moved.iter().filter(|p| p.moved < 0).take(LISTED);
    let slower = moved.iter().rev().filter(|p| p.moved > 0).take(LISTED);
    for (title, listed) in [
        ("faster", faster.collect::<Vec<_>>()),
        ("slower", slower.collect::<Vec<_>>()),
    ] {
        if listed.is_empty() {
            continue;
        }
        out.push_str(&format!("{title} beyond the spread (most first):\n"));
        for p in listed {
            out.push_str(&format!(
                "  {:.3}  {:<20} {:<18} {:.1} -> {:.1} µs, ratio {:.3} -> {:.3}\n",
                p.time(),
                p.kernel,
                p.shape,
                p.old_us,
                p.new_us,
                p.old_ratio,
                p.new_ratio
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row whose calls took `us` ± `spread` µs, at `ratio` to cuBLASLt.
    fn row(kernel: &str, shape: &str, us: f64, spread: f64, ratio: f64) -> Row {
        Row::for_test(kernel, shape, us, spread, ratio, ratio)
    }

    #[test]
    fn rows_are_matched_by_kernel_and_shape_and_moved_only_beyond_both_spreads() {
        let old = [
            row("gemm_residual", "1000,4544,18176", 271.4, 1.0, 0.797),
            row("gemm_residual", "512,2560,9728", 53.5, 0.5, 0.756),
            row("layernorm_gemm", "1000,4800,1600", 37.5, 0.3, 0.876),
            row("gemm", "8,8,8", 5.0, 0.1, 1.0),
        ];
        let new = [
            // Faster beyond both spreads.
            row("gemm_residual", "1000,4544,18176", 263.2, 1.0, 0.859),
            // Slower, but within the new run's wide spread.
            row("gemm_residual", "512,2560,9728", 54.0, 2.0, 0.750),
            // Slower beyond both spreads.
            row("layernorm_gemm", "1000,4800,1600", 42.4, 0.3, 0.770),
            row("rmsnorm_gemm", "128,2560,2048", 13.4, 0.1, 1.049),
        ];
        let c = compare(&new, &old);
        assert_eq!((c.pairs.len(), c.only_new, c.only_old), (3, 1, 1));
        let moved: Vec<i8> = c.pairs.iter().map(|p| p.moved).collect();
        assert_eq!(moved, [-1, 0, 1]);
        assert!((c.pairs[0].time() - 263.2 / 271.4).abs() < 1e-12);
        let table = comparison_table(&c);
        assert!(
            table.starts_with("3 rows in both runs (1 only in the new, 1 only in the old)"),
            "{table}"
        );
        let all = table
            .lines()
            .find(|l| l.starts_with("all "))
            .expect("an `all` line");
        let geo = ((263.2_f64 / 271.4) * (54.0 / 53.5) * (42.4 / 37.5)).cbrt();
        assert!(all.contains(&format!("{geo:.3}")), "{all}");
        assert!(all.trim_end().ends_with("1      1"), "{all}");
        let faster = table
            .split("faster beyond the spread")
            .nth(1)
            .expect("a faster list");
        assert!(
            faster.contains("1000,4544,18176") && !faster.contains("512,2560,9728"),
            "{table}"
        );
        let slower = table
            .split("slower beyond the spread")
            .nth(1)
            .expect("a slower list");
        assert!(slower.contains("1000,4800,1600"), "{table}");
    }

    #[test]
    fn runs_without_common_rows_say_so() {
        let c = compare(&[row("gemm", "1,2,3", 1.0, 0.1, 1.0)], &[]);
        assert_eq!(
            comparison_table(&c),
            "0 rows in both runs (1 only in the new, 0 only in the old)\n"
        );
    }
}
