//! `fusion bench --host`: the host's cost of one call of a graph struct
//! (every check, the workspace's event bookkeeping and the launches)
//! against the host's cost of as many `cublasLtMatmul` calls as the struct
//! launches kernels, in the same process.
//!
//! Host time is wall-clock time around a loop of calls on the thread that
//! makes them. The device must not run dry while the loop runs: an idle
//! device lets the driver take another path, and a call that waits on the
//! device would count device time as host time. So every measurement is
//! queued behind a head start (`bench::head_start`, repeated) and an event
//! after it tells afterwards whether the device was still busy with the
//! head start when the loop ended; measurements where it was not are
//! counted as `late`. The two contenders alternate measurement by
//! measurement, so that a slow phase of the host moves both alike.

use super::report::HostCost;
use super::timing::summarise;
use cudarc::driver::{CudaSlice, CudaStream, sys::CUevent_flags};
use fusion::error::Result;
use std::sync::Arc;
use std::time::Instant;

/// Measurements per contender (after one untimed round).
pub const ROUNDS: usize = 9;

/// Calls of ours per measurement; the baseline makes `CALLS` times as many
/// `cublasLtMatmul` calls as ours launches kernels per call.
pub const CALLS: usize = 48;

/// Head starts queued before each measurement: enough device work that
/// the device is still busy when the host has queued every call (about 1
/// ms each on an H200; `late` counts the measurements where it was not).
const HEAD_STARTS: usize = 16;

/// Measures ours (`ours(i)`: one call of the struct on input set `i`,
/// launching `launches` kernels) against `vendor(i)` (one
/// `cublasLtMatmul` call on input set `i`).
pub fn measure(
    stream: &Arc<CudaStream>,
    head: &mut CudaSlice<u8>,
    launches: usize,
    ours: &mut dyn FnMut(usize) -> Result<()>,
    vendor: &mut dyn FnMut(usize) -> Result<()>,
) -> Result<HostCost> {
    let launches = launches.max(1);
    let counts = [CALLS, CALLS * launches];
    let mut contenders: [&mut dyn FnMut(usize) -> Result<()>; 2] = [ours, vendor];
    let mut samples: [Vec<f64>; 2] = [Vec::new(), Vec::new()];
    let mut late = 0;
    let ctx = stream.context();
    let gate = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
    for round in 0..=ROUNDS {
        for (j, call) in contenders.iter_mut().enumerate() {
            for _ in 0..HEAD_STARTS {
                super::head_start(stream, head)?;
            }
            gate.record(stream)?;
            let from = Instant::now();
            for i in 0..counts[j] {
                call(i)?;
            }
            let elapsed = from.elapsed();
            let busy = !gate.is_complete();
            stream.synchronize()?;
            if round == 0 {
                continue;
            }
            late += usize::from(!busy);
            samples[j].push(elapsed.as_secs_f64() * 1e6 / counts[j] as f64);
        }
    }
    let [mut ours, mut vendor] = samples;
    let (ours, vendor) = (summarise(&mut ours), summarise(&mut vendor));
    Ok(HostCost::new(CALLS, ROUNDS, launches, ours, vendor, late))
}
