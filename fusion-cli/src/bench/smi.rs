//! What `nvidia-smi` says about the GPU during `fusion bench`: the driver's
//! version, and the SM clock, polled every [`SAMPLE_MS`] ms by a thread for
//! the whole run.
//!
//! The bench's dependencies reach the driver API, not NVML (cudarc has no
//! NVML binding), so the clock comes from the tool every driver install
//! ships. Each sample is one `nvidia-smi` query, stamped when it returns
//! (a looping `nvidia-smi` writing to a pipe may hold its lines in a
//! buffer, which would stamp them late). Without the tool, or on a GPU it
//! cannot find, the report says "not sampled" rather than failing the run.

use serde::{Deserialize, Serialize};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long the sampler waits between two queries (each takes some
/// milliseconds more).
pub const SAMPLE_MS: u32 = 100;

/// The SM clock over some span of the run, in MHz.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClockSummary {
    /// The lowest sample.
    pub min_mhz: f64,
    /// The median of the samples.
    pub median_mhz: f64,
    /// The highest sample.
    pub max_mhz: f64,
    /// How many samples fell within the span.
    pub samples: usize,
}

impl ClockSummary {
    /// Min, median and max of `mhz`; `None` for no samples.
    pub fn of(mhz: &[f64]) -> Option<ClockSummary> {
        let mut sorted = mhz.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(ClockSummary {
            min_mhz: *sorted.first()?,
            median_mhz: super::timing::percentile(&sorted, 0.5),
            max_mhz: *sorted.last()?,
            samples: sorted.len(),
        })
    }
}

/// The `-i` argument that names the device of `ctx` to `nvidia-smi`: its
/// PCI address, since CUDA's device numbers differ from nvidia-smi's under
/// `CUDA_VISIBLE_DEVICES` and with several GPUs.
pub fn pci_bus_id(ctx: &cudarc::driver::CudaContext) -> Option<String> {
    use cudarc::driver::sys::CUdevice_attribute::*;
    let domain = ctx.attribute(CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID).ok()?;
    let bus = ctx.attribute(CU_DEVICE_ATTRIBUTE_PCI_BUS_ID).ok()?;
    let device = ctx.attribute(CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID).ok()?;
    Some(format!("{domain:08X}:{bus:02X}:{device:02X}.0"))
}

/// One `--query-gpu` field of the GPU at `bus_id`, as `nvidia-smi` prints
/// it without header and unit; `None` when it does not run or fails.
fn query(bus_id: &str, field: &str) -> Option<String> {
    let out = Command::new("nvidia-smi")
        .args([
            &format!("--query-gpu={field}"),
            "--format=csv,noheader,nounits",
            "-i",
            bus_id,
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let value = text.trim();
    (out.status.success() && !value.is_empty()).then(|| value.to_string())
}

/// The driver version `nvidia-smi` reports for the GPU at `bus_id`.
pub fn driver_version(bus_id: &str) -> Option<String> {
    query(bus_id, "driver_version")
}

/// A number of MHz from one line of `--query-gpu=clocks.sm
/// --format=csv,noheader,nounits` (`1980`); `None` for `[N/A]` and the like.
pub fn parse_mhz(line: &str) -> Option<f64> {
    let value = line.trim().trim_end_matches("MHz").trim().parse::<f64>().ok()?;
    (value.is_finite() && value > 0.0).then_some(value)
}

/// Samples taken so far, each with the time it was read.
type Samples = Arc<Mutex<Vec<(Instant, f64)>>>;

/// One SM clock reading of the GPU at `bus_id`, in MHz.
fn query_mhz(bus_id: &str) -> Option<f64> {
    parse_mhz(&query(bus_id, "clocks.sm")?)
}

/// A thread that queries the SM clock every [`SAMPLE_MS`] ms. Dropping it
/// stops and joins the thread.
pub struct ClockSampler {
    samples: Samples,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ClockSampler {
    /// Starts sampling the GPU at `bus_id`; `None` when a first query
    /// fails (no `nvidia-smi`, or it does not know the GPU).
    pub fn start(bus_id: &str) -> Option<ClockSampler> {
        let first = query_mhz(bus_id)?;
        let samples: Samples = Arc::new(Mutex::new(vec![(Instant::now(), first)]));
        let stop = Arc::new(AtomicBool::new(false));
        let (sink, stopped, bus_id) = (Arc::clone(&samples), Arc::clone(&stop), bus_id.to_string());
        let thread = std::thread::spawn(move || {
            while !stopped.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(SAMPLE_MS.into()));
                if let Some(mhz) = query_mhz(&bus_id) {
                    sink.lock()
                        .expect("no panic holds the lock")
                        .push((Instant::now(), mhz));
                }
            }
        });
        Some(ClockSampler {
            samples,
            stop,
            thread: Some(thread),
        })
    }

    /// The clock over the samples read between `from` and `to`.
    pub fn between(&self, from: Instant, to: Instant) -> Option<ClockSummary> {
        self.within(&[(from, to)])
    }

    /// The clock over the samples read inside any of `spans` (each from,
    /// to): one summary of several short measurements of one kind, each
    /// shorter than the sampling period.
    pub fn within(&self, spans: &[(Instant, Instant)]) -> Option<ClockSummary> {
        let samples = self.samples.lock().expect("no panic holds the lock");
        let mhz: Vec<f64> = samples
            .iter()
            .filter(|(at, _)| spans.iter().any(|(from, to)| (from..=to).contains(&at)))
            .map(|&(_, mhz)| mhz)
            .collect();
        ClockSummary::of(&mhz)
    }

    /// The clock over every sample read so far.
    pub fn overall(&self) -> Option<ClockSummary> {
        let samples = self.samples.lock().expect("no panic holds the lock");
        ClockSummary::of(&samples.iter().map(|&(_, mhz)| mhz).collect::<Vec<_>>())
    }
}

impl Drop for ClockSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.thread.take() {
            // A panic in the thread lost samples only; the run is done.
            let _ = thread.join();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn clock_lines_parse_and_placeholders_do_not() {
        assert_eq!(parse_mhz("1980"), Some(1980.0));
        assert_eq!(parse_mhz(" 1755 MHz\n"), Some(1755.0));
        assert_eq!(parse_mhz("[N/A]"), None);
        assert_eq!(parse_mhz(""), None);
        assert_eq!(parse_mhz("0"), None);
    }

    #[test]
    fn a_summary_is_min_median_max() {
        let s = ClockSummary::of(&[1980.0, 1755.0, 1980.0, 1830.0]).unwrap();
        assert_eq!(
            (s.min_mhz, s.median_mhz, s.max_mhz, s.samples),
            (1755.0, 1905.0, 1980.0, 4)
        );
        assert_eq!(ClockSummary::of(&[]), None);
    }
}
