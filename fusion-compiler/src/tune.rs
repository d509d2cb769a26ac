//! The tuner's search space: for one GEMM kernel (its composition, dtype and
//! weight layout, a [`KernelKind`]) on one arch, the tile configs of the
//! arch's tile space ([`crate::target::Target::tile_space`]) worth compiling, and how many of the others each
//! reason pruned before any compile.
//!
//! Before compiling, a candidate is pruned when the arch's tensor cores do
//! not take the kernel's dtype, when the arch's own check of a config's
//! fields refuses it ([`TileConfig::check`]: the code that checks the
//! shipped tables' entries and a tuned cache's), or when it asks for more
//! resident blocks per SM than the device has (when its limits are given:
//! listing candidates needs no GPU). What a tile must be to fit
//! its mainloop (the headers' `tile_valid`: warp tiles, threads, registers,
//! accumulators) and the shared memory it needs are computed in CUDA alone,
//! so those checks are left to the compile ([`SearchSpace::unchecked`]):
//! nvcc refuses a unit whose tile breaks a rule or overflows the mainloop's
//! budget, and what the unit's `<symbol>_resources` reports is then held
//! against the device ([`check_resources`]).
//!
//! Not here: compiling, checking against the CPU reference or timing (a GPU
//! run: `fusion tune`, in the `fusion` crate's `tune` module), nor the
//! cache that run writes ([`crate::select::TunedCache`]).

use crate::ir::WeightLayout;
use crate::select::{Arch, KernelKind, TileConfig};
use std::collections::BTreeMap;
use std::fmt;

/// What the device allows a block, as the CUDA runtime reports it. There
/// is no default: a tuning run reads them from its device, and a search
/// without them leaves the checks that need them unchecked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DeviceLimits {
    /// Dynamic shared memory a block may opt in to, in bytes
    /// (`cudaDevAttrMaxSharedMemoryPerBlockOptin`).
    pub smem_optin_per_block: u32,
    /// `cudaDevAttrMaxThreadsPerBlock`.
    pub max_threads_per_block: u32,
    /// 32-bit registers a block may have (`cudaDevAttrMaxRegistersPerBlock`).
    pub registers_per_block: u32,
    /// Resident blocks per SM (`cudaDevAttrMaxBlocksPerMultiprocessor`).
    pub max_blocks_per_sm: u32,
}

/// Why a candidate is not timed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PruneReason {
    /// The arch's tensor cores do not take the kernel's dtype.
    Dtype,
    /// The arch's check of a config's fields refuses it.
    Fields,
    /// `min_blocks_per_sm` is more blocks than an SM of the device holds.
    BlocksPerSm,
    /// nvcc refused the unit: a rule of the mainloop's `tile_valid` fails,
    /// or its shared memory is over the mainloop's budget.
    Compile,
    /// Its dynamic shared memory, as its unit reports it, is over the
    /// device's opt-in limit.
    SharedMemory,
    /// Its threads per block, as its unit reports them, are over the
    /// device's limit.
    Threads,
    /// Its registers per thread (ptxas) times its threads are over the
    /// device's registers per block.
    Registers,
}

impl PruneReason {
    /// `blocks per SM`: the reason in a report.
    pub fn name(self) -> &'static str {
        match self {
            PruneReason::Dtype => "dtype",
            PruneReason::Fields => "fields",
            PruneReason::BlocksPerSm => "blocks per SM",
            PruneReason::Compile => "compile",
            PruneReason::SharedMemory => "shared memory",
            PruneReason::Threads => "threads",
            PruneReason::Registers => "registers",
        }
    }
}

impl fmt::Display for PruneReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The checks every candidate still faces after [`search_space`]: they need
/// nvcc or what a compiled unit reports.
pub const AFTER_SEARCH: &[PruneReason] = &[
    PruneReason::Compile,
    PruneReason::SharedMemory,
    PruneReason::Threads,
    PruneReason::Registers,
];

/// One kernel's candidates on one arch, and what was pruned before any
/// compile.
#[derive(Clone, Debug, PartialEq)]
pub struct SearchSpace {
    /// The arch it is for.
    pub arch: Arch,
    /// The kernel it is for.
    pub kernel: KernelKind,
    /// The configs to compile, in the space's order.
    pub candidates: Vec<TileConfig>,
    /// How many configs of the space each reason pruned.
    pub pruned: BTreeMap<PruneReason, usize>,
    /// The checks no candidate has passed yet: those of the compile and of
    /// what its unit reports ([`AFTER_SEARCH`]), after blocks per SM when
    /// the search had no device limits; none where no candidate is left.
    pub unchecked: Vec<PruneReason>,
}

impl SearchSpace {
    /// How many configs the space had.
    pub fn total(&self) -> usize {
        self.candidates.len() + self.pruned_total()
    }

    /// How many configs were pruned before any compile.
    pub fn pruned_total(&self) -> usize {
        self.pruned.values().sum()
    }
}

impl fmt::Display for SearchSpace {
    /// `gemm_bias_gelu f16 [N, K] on sm80: 1152 candidates, 768 pruned:
    /// blocks per SM → 768; not yet checked: compile, shared memory,
    /// threads, registers`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let layout = match self.kernel.layout {
            WeightLayout::KN => "[K, N]",
            WeightLayout::NK => "[N, K]",
        };
        write!(
            f,
            "{} {} {layout} on {}: {} candidates, {} pruned",
            self.kernel.name,
            self.kernel.dtype,
            self.arch,
            self.total(),
            self.pruned_total()
        )?;
        let reasons: Vec<String> = self
            .pruned
            .iter()
            .map(|(reason, count)| format!("{reason} → {count}"))
            .collect();
        if !reasons.is_empty() {
            write!(f, ": {}", reasons.join(", "))?;
        }
        if !self.unchecked.is_empty() {
            let unchecked: Vec<&str> = self.unchecked.iter().map(|r| r.name()).collect();
            write!(f, "; not yet checked: {}", unchecked.join(", "))?;
        }
        Ok(())
    }
}

/// The candidates for `kernel` on `arch`: its target's tile space, pruned
/// by the checks that need no compile (those of the device's `limits` only
/// where they are given), each pruned config counted under its reason.
/// Deterministic: the same arguments give the same candidates in the same
/// order.
pub fn search_space(arch: Arch, kernel: &KernelKind, limits: Option<&DeviceLimits>) -> SearchSpace {
    search(&(arch.target().tile_space)(), arch, kernel, limits)
}

/// [`search_space`] over `space` in place of the target's.
fn search(
    space: &[TileConfig],
    arch: Arch,
    kernel: &KernelKind,
    limits: Option<&DeviceLimits>,
) -> SearchSpace {
    let device_checks = limits.map_or(&[PruneReason::BlocksPerSm][..], |_| &[]);
    let mut result = SearchSpace {
        arch,
        kernel: kernel.clone(),
        candidates: Vec::new(),
        pruned: BTreeMap::new(),
        unchecked: [device_checks, AFTER_SEARCH].concat(),
    };
    if !arch.supports(kernel.dtype) {
        if !space.is_empty() {
            result.pruned.insert(PruneReason::Dtype, space.len());
        }
        // No candidate is left to check.
        result.unchecked.clear();
        return result;
    }
    for &tile in space {
        match prune_before_compile(&tile, arch, kernel, limits) {
            Some(reason) => *result.pruned.entry(reason).or_default() += 1,
            None => result.candidates.push(tile),
        }
    }
    result
}

/// Why `tile` is not worth compiling for `kernel` on `arch`, if it is not.
fn prune_before_compile(
    tile: &TileConfig,
    arch: Arch,
    kernel: &KernelKind,
    limits: Option<&DeviceLimits>,
) -> Option<PruneReason> {
    if tile.check(arch, kernel.gated).is_err() {
        return Some(PruneReason::Fields);
    }
    if limits.is_some_and(|l| tile.blocks_per_sm() > l.max_blocks_per_sm) {
        return Some(PruneReason::BlocksPerSm);
    }
    None
}

/// What a compiled tile config asks for per block: its unit's
/// `<symbol>_resources` gives shared memory and threads, ptxas its
/// registers per thread (absent where it was not read).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileResources {
    /// Dynamic shared memory per block, in bytes.
    pub smem_bytes: u32,
    /// Threads per block.
    pub threads: u32,
    /// Registers per thread, as ptxas reported them.
    pub registers_per_thread: Option<u32>,
}

/// Whether a compiled candidate fits the device; the error is the reason
/// to count it under.
pub fn check_resources(resources: &TileResources, limits: &DeviceLimits) -> Result<(), PruneReason> {
    if resources.smem_bytes > limits.smem_optin_per_block {
        return Err(PruneReason::SharedMemory);
    }
    if resources.threads > limits.max_threads_per_block {
        return Err(PruneReason::Threads);
    }
    let registers = resources
        .registers_per_thread
        .map(|per_thread| u64::from(per_thread) * u64::from(resources.threads));
    if registers.is_some_and(|r| r > u64::from(limits.registers_per_block)) {
        return Err(PruneReason::Registers);
    }
    Ok(())
}

#[cfg(test)]
mod tests;
