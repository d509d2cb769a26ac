//! The two cuBLASLt baselines of `fusion bench`: the heuristic's first
//! algorithm, as users get it (PyTorch asks the heuristic for one algorithm
//! and runs it), and the fastest of its top [`CANDIDATES`], found by timing
//! each candidate on the case's own inputs.
//!
//! Targets are stated against the first; the best shows how much cuBLASLt
//! leaves on the table with its default pick, so a ratio above 1 that only
//! holds against the first is visible as such.

use super::timing::{Timing, TimingPlan, time_calls};
use super::{BenchElement, Rotated, agreement_limit, relative_difference};
use cudarc::driver::{CudaSlice, CudaStream};
use fusion::error::Result;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

use super::cublaslt::{ChosenConfig, LtAlgoConfig, LtGemm};

/// How many algorithms the best-of baseline asks the heuristic for.
pub const CANDIDATES: usize = 16;

/// The short timing of each candidate: enough calls for a median that
/// separates algorithms a few percent apart, few enough that sixteen
/// candidates cost about as many calls as the row's own timing (16 × 13
/// against 3 × 60 with the default plan).
pub const CANDIDATE_PLAN: TimingPlan = TimingPlan { warmup: 3, runs: 10 };

/// Which of a pair's plans a baseline call runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Which {
    /// The heuristic's first algorithm.
    First,
    /// The fastest of its top [`CANDIDATES`].
    Best,
}

/// What happened to one candidate algorithm when it was tried.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Trial {
    /// It ran; its short timing. The kept candidate's output agreed with
    /// the first's; another's was compared only if it was timed faster than
    /// the kept one (and then it is `Disagrees`).
    Timed(Timing),
    /// It ran and was timed faster than the one kept, but its output
    /// differs from the first's by this much (relative; none where it had a
    /// NaN or an infinity).
    Disagrees(Option<f64>),
    /// cuBLASLt refused to run it.
    Failed(String),
}

/// The candidate to keep: the timed one of smallest median, the earlier in
/// the heuristic's order on a tie; `None` when none was timed.
pub fn fastest(trials: &[Trial]) -> Option<usize> {
    trials
        .iter()
        .enumerate()
        .filter_map(|(rank, trial)| match trial {
            Trial::Timed(t) => Some((rank, t.median_us)),
            _ => None,
        })
        .min_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)))
        .map(|(rank, _)| rank)
}

/// The fastest timed candidate whose output agrees: asks `check(rank)`,
/// fastest first, until it answers `None` (agrees); an answer `Some(trial)`
/// (it disagrees, or failed this time) replaces that candidate's timing.
pub fn fastest_agreeing(
    trials: &mut [Trial],
    mut check: impl FnMut(usize) -> Result<Option<Trial>>,
) -> Result<Option<usize>> {
    while let Some(rank) = fastest(trials) {
        match check(rank)? {
            None => return Ok(Some(rank)),
            Some(trial) => trials[rank] = trial,
        }
    }
    Ok(None)
}

/// The algorithms one cuBLASLt GEMM of a baseline ran with, for the report.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GemmChoice {
    /// Which GEMM of the baseline ("gemm", or "gate", "up", "down").
    pub gemm: String,
    /// The heuristic's first algorithm.
    pub first: LtAlgoConfig,
    /// The one kept as the best (its `heuristic_rank` says where in the
    /// list of candidates it was); the first's when no candidate was timed.
    pub best: LtAlgoConfig,
    /// Every candidate's fate, in the heuristic's order.
    pub trials: Vec<Trial>,
}

/// One cuBLASLt GEMM planned twice: with the heuristic's first algorithm
/// and with the fastest of its top [`CANDIDATES`].
pub struct LtPair {
    first: LtGemm,
    best: LtGemm,
    trials: Vec<Trial>,
    /// Whether a candidate of `best` was timed; else the best baseline
    /// runs the first's plan, the one known to agree.
    best_timed: bool,
}

impl LtPair {
    /// Plans both with `plan(candidates)` (an [`LtGemm`] constructor given
    /// how many algorithms to ask the heuristic for): the first with one,
    /// as PyTorch asks, the best with [`CANDIDATES`]. Until `tune` has timed
    /// a candidate, the best runs the first's plan.
    pub fn new(mut plan: impl FnMut(usize) -> Result<LtGemm>) -> Result<LtPair> {
        Ok(LtPair {
            first: plan(1)?,
            best: plan(CANDIDATES)?,
            trials: Vec::new(),
            best_timed: false,
        })
    }

    /// The plan that runs as `which`; for the best, the first's until `tune`
    /// has kept one of its candidates.
    pub fn get(&mut self, which: Which) -> &mut LtGemm {
        match which {
            Which::First => &mut self.first,
            Which::Best if self.best_timed => &mut self.best,
            Which::Best => &mut self.first,
        }
    }

    /// Tries every candidate on `gemm(plan, output, i)` (the GEMM alone,
    /// writing into `out`'s set `i`, reading the caller's set `i`): times
    /// each that runs with [`CANDIDATE_PLAN`], then, fastest first, runs it
    /// on set 0 and compares its whole output with the first's there (the
    /// dtype's precision bounds the difference, as for ours against the
    /// baseline) until one agrees, and keeps that one. Comparing only the
    /// candidates that could be kept spares copying every candidate's
    /// output to the host and summing it there (16 copies of up to 235 MB
    /// per row at (8192, 14336, 4096)). The heuristic's top pick leads the
    /// list (normally the first's own algorithm), so the best is at least as
    /// fast as it in this short timing; the interleaved run then times both
    /// for the table.
    pub(super) fn tune<T: BenchElement>(
        &mut self,
        stream: &Arc<CudaStream>,
        out: &mut Rotated<T>,
        mut head_start: impl FnMut() -> Result<()>,
        mut gemm: impl FnMut(&mut LtGemm, &mut CudaSlice<T>, usize) -> Result<()>,
    ) -> Result<()> {
        gemm(&mut self.first, out.get_mut(0), 0)?;
        let reference = stream.clone_dtoh(out.get(0))?;
        let limit = agreement_limit(T::DTYPE);
        self.trials.clear();
        for rank in 0..self.best.candidates() {
            self.best.choose(rank);
            if let Err(e) = gemm(&mut self.best, out.get_mut(0), 0) {
                self.trials.push(Trial::Failed(e.to_string()));
                continue;
            }
            let best = &mut self.best;
            let timing = time_calls(stream, CANDIDATE_PLAN, &mut head_start, |i| {
                gemm(best, out.get_mut(i), i)
            })?;
            self.trials.push(Trial::Timed(timing));
        }
        let best = &mut self.best;
        let fastest = fastest_agreeing(&mut self.trials, |rank| {
            best.choose(rank);
            if let Err(e) = gemm(best, out.get_mut(0), 0) {
                return Ok(Some(Trial::Failed(e.to_string())));
            }
            let relative = relative_difference(&stream.clone_dtoh(out.get(0))?, &reference);
            Ok((!(relative.is_finite() && relative <= limit))
                .then(|| Trial::Disagrees(Some(relative).filter(|r| r.is_finite()))))
        })?;
        self.best_timed = fastest.is_some();
        self.best.choose(fastest.unwrap_or(0));
        Ok(())
    }

    /// What each plan ran, for the report.
    pub fn choice(&self, gemm: &str) -> Result<GemmChoice> {
        Ok(GemmChoice {
            gemm: gemm.to_string(),
            first: self.first.chosen_config()?,
            best: if self.best_timed {
                self.best.chosen_config()?
            } else {
                self.first.chosen_config()?
            },
            trials: self.trials.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn timed(median_us: f64) -> Trial {
        Trial::Timed(Timing::every_call(median_us))
    }

    #[test]
    fn the_fastest_timed_candidate_is_kept() {
        let trials = [timed(10.0), timed(9.5), timed(9.9)];
        assert_eq!(fastest(&trials), Some(1));
    }

    #[test]
    fn a_faster_candidate_that_disagrees_or_failed_is_passed_over() {
        let trials = [
            timed(10.0),
            Trial::Disagrees(Some(0.3)),
            Trial::Failed("CUBLAS_STATUS_NOT_SUPPORTED".into()),
            timed(9.8),
        ];
        assert_eq!(fastest(&trials), Some(3));
        // Only the first timed: it is the best.
        assert_eq!(fastest(&[timed(10.0), Trial::Disagrees(None)]), Some(0));
    }

    #[test]
    fn outputs_are_compared_fastest_first_until_one_agrees() {
        let mut trials = vec![timed(10.0), timed(9.0), timed(9.5), Trial::Failed("x".into())];
        let mut asked = Vec::new();
        let kept = fastest_agreeing(&mut trials, |rank| {
            asked.push(rank);
            Ok((rank == 1).then_some(Trial::Disagrees(Some(0.2))))
        })
        .unwrap();
        assert_eq!(kept, Some(2));
        assert_eq!(asked, [1, 2]);
        assert_eq!(trials[1], Trial::Disagrees(Some(0.2)));
        assert_eq!(trials[0], timed(10.0));
        // None agrees: nothing kept, every timed one marked.
        let mut trials = vec![timed(10.0), timed(9.0)];
        let kept = fastest_agreeing(&mut trials, |_| Ok(Some(Trial::Disagrees(None)))).unwrap();
        assert_eq!(kept, None);
        assert_eq!(trials, [Trial::Disagrees(None), Trial::Disagrees(None)]);
    }

    #[test]
    fn a_tie_keeps_the_heuristics_earlier_pick() {
        assert_eq!(fastest(&[timed(9.0), timed(8.0), timed(8.0)]), Some(1));
    }

    #[test]
    fn nothing_timed_is_no_choice() {
        assert_eq!(fastest(&[]), None);
        assert_eq!(fastest(&[Trial::Failed("x".into())]), None);
    }

    #[test]
    fn trials_round_trip_through_json() {
        let trials = vec![
            timed(1.5),
            Trial::Disagrees(Some(0.25)),
            Trial::Disagrees(None),
            Trial::Failed("refused".into()),
        ];
        let text = serde_json::to_string(&trials).unwrap();
        assert!(text.contains("\"disagrees\":0.25"), "{text}");
        assert_eq!(serde_json::from_str::<Vec<Trial>>(&text).unwrap(), trials);
    }
}
