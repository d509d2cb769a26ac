//! Timing on the device: CUDA events around each call, warm-up first, the
//! median and spread of many calls, the contenders alternating call by call,
//! and input sets rotated between calls so that no contender is timed out of
//! a warm L2 cache.

use cudarc::driver::{CudaStream, sys::CUevent_flags};
use fusion::error::Result;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// How many calls to make and how to summarise them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimingPlan {
    /// Untimed calls of each contender before the timed ones.
    pub warmup: usize,
    /// Timed calls of each contender, which its [`Timing`] summarises.
    pub runs: usize,
}

impl Default for TimingPlan {
    fn default() -> Self {
        TimingPlan { warmup: 10, runs: 50 }
    }
}

/// Median, quartiles, fastest and slowest of the timed calls, in
/// microseconds.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Timing {
    /// The median of the timed calls.
    pub median_us: f64,
    /// The 25th and 75th percentiles: the interquartile range, the spread
    /// `fusion bench` prints, since one stalled call moves the maximum alone.
    pub q1_us: f64,
    /// The 75th percentile (see `q1_us`).
    pub q3_us: f64,
    /// The fastest timed call.
    pub min_us: f64,
    /// The slowest timed call.
    pub max_us: f64,
}

impl Timing {
    /// Every call at `us`: a timing for tests of what reads timings.
    #[cfg(test)]
    pub fn every_call(us: f64) -> Timing {
        Timing {
            median_us: us,
            q1_us: us,
            q3_us: us,
            min_us: us,
            max_us: us,
        }
    }
}

/// The untimed rounds before the timed ones: `plan.warmup`, and at least
/// one per rotated input set (`SETS` of them), so that every contender has
/// made a call with each set it will be timed on before any call is timed.
/// A contender may hold state per set (a bound struct each, whose first
/// call allocates and zeroes its workspace); with fewer rounds those first
/// calls fell among the timed ones (with 3 rounds, half of 10 timed calls
/// of three contenders), adding the zeroing's device time to a timed call.
pub fn warmup_rounds(plan: TimingPlan) -> usize {
    plan.warmup.max(super::SETS)
}

/// Times `call(i)` for i = 0, 1, 2, …; the caller rotates its input sets by
/// `i`.
pub fn time_calls(
    stream: &Arc<CudaStream>,
    plan: TimingPlan,
    head_start: impl FnMut() -> Result<()>,
    mut call: impl FnMut(usize) -> Result<()>,
) -> Result<Timing> {
    let [timing] = time_interleaved(stream, plan, head_start, [&mut call])?;
    Ok(timing)
}

/// Times N contenders call by call, alternating: ours, baseline, ours, …
/// (or ours, first baseline, second baseline, ours, …).
///
/// Interleaving gives all the same clocks: on an H200 the long shapes ran
/// ±5-10% apart from one block of calls to the next (power and clock
/// drift), which made a ratio of two separately timed blocks move by as
/// much. Contender j's call in round r gets index N r + j, so the calls'
/// indices run 0, 1, 2, … in the order they are queued: with S rotated
/// input sets, every call reads a set last touched S calls earlier, and no
/// contender finds the inputs another just read in L2.
///
/// It runs [`warmup_rounds`] untimed and `plan.runs` timed rounds of one call
/// per contender. The timed calls are queued back to back behind
/// `head_start` (a few milliseconds of device work), so the host has queued
/// them all before the device reaches them and the events between calls
/// measure device time alone, not launch overhead.
pub fn time_interleaved<const N: usize>(
    stream: &Arc<CudaStream>,
    plan: TimingPlan,
    head_start: impl FnMut() -> Result<()>,
    mut contenders: [&mut dyn FnMut(usize) -> Result<()>; N],
) -> Result<[Timing; N]> {
    let timings = time_many(stream, plan, head_start, &mut contenders)?;
    Ok(timings
        .try_into()
        .unwrap_or_else(|_| unreachable!("one timing per contender")))
}

/// [`time_interleaved`] for a number of contenders known at run time (at
/// least one): one timing each, in their order.
pub fn time_many(
    stream: &Arc<CudaStream>,
    plan: TimingPlan,
    mut head_start: impl FnMut() -> Result<()>,
    contenders: &mut [&mut dyn FnMut(usize) -> Result<()>],
) -> Result<Vec<Timing>> {
    let n = contenders.len();
    let warmup = warmup_rounds(plan);
    for round in 0..warmup {
        for (j, call) in contenders.iter_mut().enumerate() {
            call(n * round + j)?;
        }
    }
    stream.synchronize()?;
    let ctx = stream.context();
    let events = (0..=n * plan.runs)
        .map(|_| ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)))
        .collect::<Result<Vec<_>, _>>()?;
    head_start()?;
    for round in 0..plan.runs {
        for (j, call) in contenders.iter_mut().enumerate() {
            events[n * round + j].record(stream)?;
            call(n * (warmup + round) + j)?;
        }
    }
    let last = &events[n * plan.runs];
    last.record(stream)?;
    last.synchronize()?;
    let mut samples: Vec<Vec<f64>> = (0..n).map(|_| Vec::with_capacity(plan.runs)).collect();
    for (i, w) in events.windows(2).enumerate() {
        samples[i % n].push(f64::from(w[0].elapsed_ms(&w[1])?) * 1e3);
    }
    Ok(samples.into_iter().map(|mut s| summarise(&mut s)).collect())
}

/// Sorts `samples` (at least one) and summarises them.
pub fn summarise(samples: &mut [f64]) -> Timing {
    samples.sort_by(f64::total_cmp);
    Timing {
        median_us: percentile(samples, 0.5),
        q1_us: percentile(samples, 0.25),
        q3_us: percentile(samples, 0.75),
        min_us: samples[0],
        max_us: samples[samples.len() - 1],
    }
}

/// The `p`-quantile (0 ≤ p ≤ 1) of sorted, non-empty `sorted`, interpolated
/// linearly between the two nearest ranks (numpy's default), so that the
/// median of an even count is the mean of the middle two.
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    let rank = p.clamp(0.0, 1.0) * (sorted.len() - 1) as f64;
    let (below, above) = (rank.floor() as usize, rank.ceil() as usize);
    let weight = rank - below as f64;
    sorted[below] + (sorted[above] - sorted[below]) * weight
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rotated set a contender is timed on, it called untimed first,
    /// whatever the number of contenders and `--warmup`.
    #[test]
    fn the_warmup_reaches_every_set_a_timed_call_reads() {
        let sets = crate::bench::SETS;
        for contenders in 1..=4 {
            for warmup in [0, 1, 3, 5, 10] {
                let plan = TimingPlan { warmup, runs: 50 };
                let rounds = warmup_rounds(plan);
                assert!(rounds >= warmup);
                for j in 0..contenders {
                    let warmed: std::collections::HashSet<usize> =
                        (0..rounds).map(|r| (contenders * r + j) % sets).collect();
                    for r in rounds..rounds + plan.runs {
                        let set = (contenders * r + j) % sets;
                        assert!(
                            warmed.contains(&set),
                            "{contenders} contenders, --warmup {warmup}: contender {j} is timed on set {set} first"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(summarise(&mut [3.0, 1.0, 2.0]).median_us, 2.0);
        let t = summarise(&mut [4.0, 1.0, 3.0, 2.0]);
        assert_eq!((t.median_us, t.min_us, t.max_us), (2.5, 1.0, 4.0));
    }

    #[test]
    fn quartiles_interpolate_between_ranks() {
        // Ranks 0..=8 of nine values: q1 at rank 2, q3 at rank 6.
        let t = summarise(&mut [9.0, 1.0, 8.0, 2.0, 7.0, 3.0, 6.0, 4.0, 5.0]);
        assert_eq!((t.q1_us, t.median_us, t.q3_us), (3.0, 5.0, 7.0));
        // Four values: q1 at rank 0.75, between 10 and 20.
        let t = summarise(&mut [40.0, 10.0, 30.0, 20.0]);
        assert_eq!((t.q1_us, t.q3_us), (17.5, 32.5));
        // One stalled call moves the maximum, not the quartiles.
        let mut calls = vec![10.0; 49];
        calls.push(500.0);
        let t = summarise(&mut calls);
        assert_eq!(
            (t.q1_us, t.median_us, t.q3_us, t.max_us),
            (10.0, 10.0, 10.0, 500.0)
        );
    }

    #[test]
    fn a_single_sample_is_every_statistic() {
        let t = summarise(&mut [7.0]);
        assert_eq!(
            (t.min_us, t.q1_us, t.median_us, t.q3_us, t.max_us),
            (7.0, 7.0, 7.0, 7.0, 7.0)
        );
        assert_eq!(percentile(&[1.0, 2.0], 0.0), 1.0);
        assert_eq!(percentile(&[1.0, 2.0], 1.0), 2.0);
    }
}
