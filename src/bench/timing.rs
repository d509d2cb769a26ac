//! Timing on the device: CUDA events around each call, warm-up first, the
//! median of many calls, the two contenders alternating call by call, and
//! input sets rotated between calls so that no contender is timed out of a
//! warm L2 cache.

use crate::error::Result;
use cudarc::driver::{CudaStream, sys::CUevent_flags};
use std::sync::Arc;

/// How many calls to make and how to summarise them.
#[derive(Clone, Copy, Debug)]
pub struct TimingPlan {
    pub warmup: usize,
    pub runs: usize,
}

impl Default for TimingPlan {
    fn default() -> Self {
        TimingPlan { warmup: 10, runs: 50 }
    }
}

/// Median, fastest and slowest of the timed calls, in microseconds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Timing {
    pub median_us: f64,
    pub min_us: f64,
    pub max_us: f64,
}

/// Times `call(i)` for i = 0, 1, 2, …; the caller rotates its input sets by
/// `i`.
pub fn time_calls(
    stream: &Arc<CudaStream>,
    plan: TimingPlan,
    head_start: impl FnMut() -> Result<()>,
    mut call: impl FnMut(usize) -> Result<()>,
) -> Result<Timing> {
    let [timing] = time_rounds(stream, plan, head_start, [&mut call])?;
    Ok(timing)
}

/// Times two contenders call by call, alternating: ours, baseline, ours, …
///
/// Interleaving gives both the same clocks: on an H200 the long shapes ran
/// ±5-10% apart from one block of calls to the next (power and clock
/// drift), which made a ratio of two separately timed blocks move by as
/// much. `ours(i)` gets the even indices and `baseline(i)` the odd ones, so
/// with an even number of rotated input sets each contender reads its own
/// sets, each last touched that many calls earlier, and neither finds the
/// inputs the other just read in L2.
pub fn time_interleaved(
    stream: &Arc<CudaStream>,
    plan: TimingPlan,
    head_start: impl FnMut() -> Result<()>,
    mut ours: impl FnMut(usize) -> Result<()>,
    mut baseline: impl FnMut(usize) -> Result<()>,
) -> Result<(Timing, Timing)> {
    let [ours, base] = time_rounds(stream, plan, head_start, [&mut ours, &mut baseline])?;
    Ok((ours, base))
}

/// Runs `plan.warmup` untimed and `plan.runs` timed rounds of one call per
/// contender; contender j's call in round r gets index N r + j. The timed
/// calls are queued back to back behind `head_start` (a few milliseconds of
/// device work), so the host has queued them all before the device reaches
/// them and the events between calls measure device time alone, not launch
/// overhead.
fn time_rounds<const N: usize>(
    stream: &Arc<CudaStream>,
    plan: TimingPlan,
    mut head_start: impl FnMut() -> Result<()>,
    mut contenders: [&mut dyn FnMut(usize) -> Result<()>; N],
) -> Result<[Timing; N]> {
    for round in 0..plan.warmup {
        for (j, call) in contenders.iter_mut().enumerate() {
            call(N * round + j)?;
        }
    }
    stream.synchronize()?;
    let ctx = stream.context();
    let events = (0..=N * plan.runs)
        .map(|_| ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)))
        .collect::<Result<Vec<_>, _>>()?;
    head_start()?;
    for round in 0..plan.runs {
        for (j, call) in contenders.iter_mut().enumerate() {
            events[N * round + j].record(stream)?;
            call(N * (plan.warmup + round) + j)?;
        }
    }
    let last = &events[N * plan.runs];
    last.record(stream)?;
    last.synchronize()?;
    let mut samples: [Vec<f64>; N] = std::array::from_fn(|_| Vec::with_capacity(plan.runs));
    for (i, w) in events.windows(2).enumerate() {
        samples[i % N].push(f64::from(w[0].elapsed_ms(&w[1])?) * 1e3);
    }
    Ok(samples.map(|mut s| summarise(&mut s)))
}

fn summarise(samples: &mut [f64]) -> Timing {
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    let median_us = if n % 2 == 1 {
        samples[n / 2]
    } else {
        (samples[n / 2 - 1] + samples[n / 2]) / 2.0
    };
    Timing {
        median_us,
        min_us: samples[0],
        max_us: samples[n - 1],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(summarise(&mut [3.0, 1.0, 2.0]).median_us, 2.0);
        let t = summarise(&mut [4.0, 1.0, 3.0, 2.0]);
        assert_eq!((t.median_us, t.min_us, t.max_us), (2.5, 1.0, 4.0));
    }
}
