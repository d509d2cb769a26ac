//! Timing on the device: CUDA events around each call, warm-up first, the
//! median of many calls, and input sets rotated between calls so that no
//! contender is timed out of a warm L2 cache.

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
/// `i`. The timed calls are queued back to back behind `head_start` (a few
/// milliseconds of device work), so the host has queued them all before the
/// device reaches them and the events between calls measure device time
/// alone, not launch overhead.
pub fn time_calls(
    stream: &Arc<CudaStream>,
    plan: TimingPlan,
    mut head_start: impl FnMut() -> Result<()>,
    mut call: impl FnMut(usize) -> Result<()>,
) -> Result<Timing> {
    for i in 0..plan.warmup {
        call(i)?;
    }
    stream.synchronize()?;
    let ctx = stream.context();
    let events = (0..=plan.runs)
        .map(|_| ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT)))
        .collect::<Result<Vec<_>, _>>()?;
    head_start()?;
    for (i, event) in events[..plan.runs].iter().enumerate() {
        event.record(stream)?;
        call(plan.warmup + i)?;
    }
    events[plan.runs].record(stream)?;
    events[plan.runs].synchronize()?;
    let mut samples = events
        .windows(2)
        .map(|w| Ok(f64::from(w[0].elapsed_ms(&w[1])?) * 1e3))
        .collect::<Result<Vec<f64>>>()?;
    Ok(summarise(&mut samples))
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
