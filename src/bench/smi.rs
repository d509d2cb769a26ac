//! What `nvidia-smi` says about the GPU during `fusion bench`: the driver's
//! version, and the SM clock, sampled every [`SAMPLE_MS`] ms by one
//! `nvidia-smi` process for the whole run and read by a thread.
//!
//! The bench's dependencies reach the driver API, not NVML (cudarc has no
//! NVML binding), so the clock comes from the tool every driver install
//! ships. Without it, or on a GPU it cannot find, the report says "not
//! sampled" rather than failing the run.

use serde::{Deserialize, Serialize};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// How often the clock is sampled.
pub const SAMPLE_MS: u32 = 100;

/// The SM clock over some span of the run, in MHz.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClockSummary {
    pub min_mhz: f64,
    pub median_mhz: f64,
    pub max_mhz: f64,
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

/// The driver version `nvidia-smi` reports for the GPU at `bus_id`.
pub fn driver_version(bus_id: &str) -> Option<String> {
    let out = Command::new("nvidia-smi")
        .args([
            "--query-gpu=driver_version",
            "--format=csv,noheader",
            "-i",
            bus_id,
        ])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    let version = text.trim();
    (out.status.success() && !version.is_empty()).then(|| version.to_string())
}

/// A number of MHz from one line of `--query-gpu=clocks.sm
/// --format=csv,noheader,nounits` (`1980`); `None` for `[N/A]` and the like.
pub fn parse_mhz(line: &str) -> Option<f64> {
    let value = line.trim().trim_end_matches("MHz").trim().parse::<f64>().ok()?;
    (value.is_finite() && value > 0.0).then_some(value)
}

/// Samples taken so far, each with the time it was read.
type Samples = Arc<Mutex<Vec<(Instant, f64)>>>;

/// One `nvidia-smi` process printing the SM clock every [`SAMPLE_MS`] ms,
/// and the thread that collects its lines. Dropping it ends the process.
pub struct ClockSampler {
    child: Child,
    samples: Samples,
}

impl ClockSampler {
    /// Starts sampling the GPU at `bus_id`; `None` when `nvidia-smi`
    /// cannot be started.
    pub fn start(bus_id: &str) -> Option<ClockSampler> {
        let mut child = Command::new("nvidia-smi")
            .args([
                "--query-gpu=clocks.sm",
                "--format=csv,noheader,nounits",
                &format!("--loop-ms={SAMPLE_MS}"),
                "-i",
                bus_id,
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .ok()?;
        let stdout = child.stdout.take()?;
        let samples = Samples::default();
        let sink = Arc::clone(&samples);
        // The thread ends when the process does (its stdout closes).
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if let Some(mhz) = parse_mhz(&line) {
                    sink.lock()
                        .expect("no panic holds the lock")
                        .push((Instant::now(), mhz));
                }
            }
        });
        Some(ClockSampler { child, samples })
    }

    /// The clock over the samples read between `from` and `to`.
    pub fn between(&self, from: Instant, to: Instant) -> Option<ClockSummary> {
        let samples = self.samples.lock().expect("no panic holds the lock");
        let mhz: Vec<f64> = samples
            .iter()
            .filter(|(at, _)| (from..=to).contains(at))
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
        // The process loops until stopped; an error here means it has
        // already exited.
        let _ = self.child.kill();
        let _ = self.child.wait();
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
