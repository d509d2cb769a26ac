//! `fusion bench --streams N`: a row's contenders (ours, and the baseline
//! with cuBLASLt's first algorithm) under concurrency. N host threads each
//! build the row's case on their own stream, with their own inputs, outputs
//! and workspace, and each contender is timed with every stream in flight
//! at once against one stream at a time: the slowdown an inference server
//! that overlaps requests on several streams pays, for ours and for the
//! vendor path alike.
//!
//! The method is `timing`'s, over spans instead of single calls: warm-up
//! first; a head start on a separate stream that the measured streams wait
//! for, so that every call is queued before the device reaches it; CUDA
//! events; medians over rounds, the two contenders and the solo and
//! concurrent measurements alternating round by round so that clock drift
//! moves them alike.

use super::report::{Concurrency, Slowdown};
use super::smi::ClockSampler;
use super::timing::{TimingPlan, percentile, warmup_rounds};
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, sys::CUevent_flags};
use fusion::error::{Error, Result};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier, Mutex};
use std::time::Instant;

/// Rounds of measurements; each times every contender once on each
/// stream alone and once on all streams together.
pub const ROUNDS: usize = 5;

/// The contenders a row hands over: ours, then the baseline.
const CONTENDERS: usize = 2;

/// One measurement: which contender, on which stream (None: all at once).
#[derive(Clone, Copy)]
struct Step {
    contender: usize,
    alone: Option<usize>,
}

/// The order of the measurements, the same for every thread.
fn schedule(streams: usize) -> Vec<Step> {
    let mut steps = Vec::new();
    for _ in 0..ROUNDS {
        for contender in 0..CONTENDERS {
            steps.extend((0..streams).map(|s| Step {
                contender,
                alone: Some(s),
            }));
            steps.push(Step {
                contender,
                alone: None,
            });
        }
    }
    steps
}

/// What the threads share: three barriers per measurement (ready; the
/// gate recorded; done), the gate, and the spans the measured streams
/// recorded.
struct Rendezvous {
    barrier: Barrier,
    /// The measured streams' threads.
    streams: usize,
    plan: TimingPlan,
    gate: Mutex<Option<Arc<CudaEvent>>>,
    spans: Mutex<Vec<(CudaEvent, CudaEvent)>>,
    /// Measurements in which the device reached the gate before a stream's
    /// calls were all queued: their time includes launch overhead.
    late: AtomicUsize,
}

/// One thread's side of the measurements: its stream, on which the row's
/// case is built, and [`Part::take_part`].
pub struct Part<'r> {
    rendezvous: &'r Rendezvous,
    index: usize,
    stream: Arc<CudaStream>,
    /// Barriers this thread has passed: a thread that fails or panics
    /// passes the rest without measuring, so that the others never wait
    /// for it.
    passed: Cell<usize>,
    failed: RefCell<Option<Error>>,
}

impl Part<'_> {
    /// The stream this thread's case runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// Runs this thread's side of every measurement with the case's
    /// contenders (ours, the baseline), each called with a rotating input
    /// index. Errors are kept for the end: every thread must reach every
    /// barrier.
    pub fn take_part(&self, mut contenders: [&mut dyn FnMut(usize) -> Result<()>; CONTENDERS]) {
        let plan = self.rendezvous.plan;
        let warm = (|| -> Result<()> {
            for i in 0..warmup_rounds(plan) {
                for call in contenders.iter_mut() {
                    call(i)?;
                }
            }
            Ok(self.stream.synchronize()?)
        })();
        self.keep(warm);
        self.steps(|step| {
            let active = step.alone.is_none_or(|s| s == self.index);
            if active && self.failed.borrow().is_none() {
                let measured = self.measure(&mut *contenders[step.contender]);
                self.keep(measured);
            }
        });
    }

    /// The barriers this thread has not passed yet, without measuring: for
    /// a thread whose case could not be built, or that panicked.
    fn sit_out(&self) {
        let total = 3 * schedule(self.rendezvous.streams).len();
        while self.passed.get() < total {
            self.pass();
        }
    }

    fn steps(&self, mut measure: impl FnMut(Step)) {
        for step in schedule(self.rendezvous.streams) {
            self.pass();
            self.pass();
            measure(step);
            self.pass();
        }
    }

    fn pass(&self) {
        self.rendezvous.barrier.wait();
        self.passed.set(self.passed.get() + 1);
    }

    /// `plan.runs` calls behind the gate, between two events.
    fn measure(&self, call: &mut dyn FnMut(usize) -> Result<()>) -> Result<()> {
        let gate = self
            .rendezvous
            .gate
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let Some(gate) = gate else {
            return Ok(());
        };
        let ctx = self.stream.context();
        let (start, end) = (
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
            ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?,
        );
        self.stream.wait(&gate)?;
        start.record(&self.stream)?;
        for i in 0..self.rendezvous.plan.runs {
            call(i)?;
        }
        end.record(&self.stream)?;
        if gate.is_complete() {
            self.rendezvous.late.fetch_add(1, Ordering::Relaxed);
        }
        end.synchronize()?;
        self.rendezvous
            .spans
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((start, end));
        Ok(())
    }

    fn keep(&self, result: Result<()>) {
        if let Err(e) = result {
            self.failed.borrow_mut().get_or_insert(e);
        }
    }
}

/// Measures a row's contenders on `streams` streams: `case` builds the row
/// on the stream of the [`Part`] it is given and calls
/// [`Part::take_part`]. `gate` (a stream of its own) and `head` (scratch
/// for the head start) stay on this thread. With `clock`, each contender's
/// SM clock alone and at once is summarized over the spans of its
/// measurements: a slowdown that a lower clock explains (the card held to
/// its power limit) shows there.
pub fn measure(
    gate: &Arc<CudaStream>,
    head: &mut CudaSlice<u8>,
    streams: usize,
    plan: TimingPlan,
    clock: Option<&ClockSampler>,
    case: impl Fn(&Part<'_>) -> Result<()> + Sync,
) -> Result<Concurrency> {
    let ctx = gate.context();
    let own_streams = (0..streams)
        .map(|_| ctx.new_stream())
        .collect::<Result<Vec<_>, _>>()?;
    let rendezvous = Rendezvous {
        barrier: Barrier::new(streams + 1),
        streams,
        plan,
        gate: Mutex::new(None),
        spans: Mutex::new(Vec::new()),
        late: AtomicUsize::new(0),
    };
    let mut samples = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    let mut spans = [[Vec::new(), Vec::new()], [Vec::new(), Vec::new()]];
    let (coordinated, threads) = std::thread::scope(|scope| {
        let handles: Vec<_> = own_streams
            .into_iter()
            .enumerate()
            .map(|(index, stream)| {
                let (rendezvous, case) = (&rendezvous, &case);
                scope.spawn(move || {
                    let part = Part {
                        rendezvous,
                        index,
                        stream,
                        passed: Cell::new(0),
                        failed: RefCell::new(None),
                    };
                    let built = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| case(&part)));
                    part.sit_out();
                    let built = built.unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                    built.and(part.failed.into_inner().map_or(Ok(()), Err))
                })
            })
            .collect();
        let coordinated = coordinate(gate, head, &rendezvous, streams, &mut samples, &mut spans);
        let threads: Vec<Result<()>> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))
            .collect();
        (coordinated, threads)
    });
    coordinated?;
    threads.into_iter().collect::<Result<Vec<()>>>()?;
    let clocks = spans.map(|modes| modes.map(|spans| clock.and_then(|c| c.within(&spans))));
    let [ours, baseline] = std::array::from_fn(|contender| {
        let [solo, concurrent] = &mut samples[contender];
        let [solo_clock, concurrent_clock] = clocks[contender];
        Slowdown {
            solo_clock,
            concurrent_clock,
            ..Slowdown::new(solo, concurrent)
        }
    });
    Ok(Concurrency {
        streams,
        calls: plan.runs,
        rounds: ROUNDS,
        ours,
        baseline,
        late: rendezvous.late.into_inner(),
    })
}

/// Where the per-call times and the host's spans of the measurements go:
/// `[contender][0 alone, 1 all at once]`.
type ByMode<T> = [[Vec<T>; 2]; CONTENDERS];

/// This thread's side: the head start and the gate before each
/// measurement, and the per-call time of each after it, into `samples`,
/// with the host's span of each measurement (from the gate's recording,
/// the head start's tail included, to the last stream's end) into `spans`.
fn coordinate(
    gate_stream: &Arc<CudaStream>,
    head: &mut CudaSlice<u8>,
    rendezvous: &Rendezvous,
    streams: usize,
    samples: &mut ByMode<f64>,
    spans: &mut ByMode<(Instant, Instant)>,
) -> Result<()> {
    let mut failed = None;
    let ctx = gate_stream.context();
    for step in schedule(streams) {
        rendezvous.barrier.wait();
        let gate = (|| -> Result<Arc<CudaEvent>> {
            super::head_start(gate_stream, head)?;
            let gate = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
            gate.record(gate_stream)?;
            Ok(Arc::new(gate))
        })();
        let gate = gate.map_err(|e| failed.get_or_insert(e)).ok();
        *rendezvous.gate.lock().unwrap_or_else(|e| e.into_inner()) = gate.clone();
        rendezvous.barrier.wait();
        let started = Instant::now();
        rendezvous.barrier.wait();
        let mode = usize::from(step.alone.is_none());
        spans[step.contender][mode].push((started, Instant::now()));
        let events = std::mem::take(&mut *rendezvous.spans.lock().unwrap_or_else(|e| e.into_inner()));
        let (Some(gate), false) = (gate, events.is_empty()) else {
            continue;
        };
        let per_call = (|| -> Result<f64> {
            let (mut first, mut last) = (f64::INFINITY, f64::NEG_INFINITY);
            for (start, end) in &events {
                first = first.min(f64::from(gate.elapsed_ms(start)?));
                last = last.max(f64::from(gate.elapsed_ms(end)?));
            }
            Ok((last - first) * 1e3 / (events.len() * rendezvous.plan.runs) as f64)
        })();
        match per_call {
            Ok(us) => samples[step.contender][mode].push(us),
            Err(e) => {
                failed.get_or_insert(e);
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

impl Slowdown {
    /// The medians of the per-call times alone and at once, and their
    /// ratio (NaN without samples, which a failed measurement reports as
    /// an error before this is reached).
    fn new(solo: &mut [f64], concurrent: &mut [f64]) -> Slowdown {
        let median = |s: &mut [f64]| {
            s.sort_by(f64::total_cmp);
            if s.is_empty() {
                f64::NAN
            } else {
                percentile(s, 0.5)
            }
        };
        let (solo_us, concurrent_us) = (median(solo), median(concurrent));
        Slowdown {
            solo_us,
            concurrent_us,
            slowdown: concurrent_us / solo_us,
            solo_clock: None,
            concurrent_clock: None,
        }
    }
}
