//! Hopper (sm_90a): the persistent, warp-specialized wgmma + TMA mainloop
//! (`kernels/include/fusion/sm90/`).

use super::{Arch, Budget, RunsOn, Target};
use crate::ir::DType;
use crate::select::{KernelKind, Mainloop, Schedule, TileConfig};

pub(super) static TARGET: Target = Target {
    arch: Arch::Sm90,
    name: "sm90",
    // wgmma and TMA are sm_90a features: its code runs on nothing else, so
    // there is no PTX to carry.
    gencode: "-gencode=arch=compute_90a,code=sm_90a",
    sass_gencode: "-gencode=arch=compute_90a,code=sm_90a",
    runs_on: RunsOn::Exactly(9, 0),
    budget: Budget::CUDA,
    dtypes: &[DType::F16, DType::BF16],
    mainloop: Mainloop::Sm90,
    mainloop_type: "fusion::sm90::Mainloop",
    mainloop_header: "fusion/sm90/mainloop.cuh",
    tile_type,
    check,
    tuned_json: include_str!("../../../kernels/tuned/sm90.json"),
};

/// The mainloop's K step: one 128-byte swizzled row of 16-bit elements.
pub(crate) const BK: u32 = 64;

/// f32 accumulators one consumer thread may hold: consumers run with 232
/// registers (`setmaxnreg`), which leaves room for 128 besides addresses and
/// the epilogue's values.
const MAX_ACCUMULATORS: u32 = 128;

/// BK is fixed at 64 by the template, so it is not an argument.
fn tile_type(c: &TileConfig) -> String {
    let schedule = match c.sm90_schedule() {
        Schedule::Cooperative => "Cooperative",
        Schedule::PingPong => "PingPong",
    };
    format!(
        "fusion::sm90::TileConfig<{}, {}, {}, fusion::sm90::Schedule::{schedule}>",
        c.bm, c.bn, c.stages
    )
}

/// The template's static_asserts and its accumulators. Registers are fixed
/// by the kernel (producer 40, consumers 232), so there is no estimate to
/// check; shared memory is checked by nvcc, against the `static_assert`
/// codegen renders into the unit for each config.
fn check(c: &TileConfig, _kernel: &KernelKind) -> Result<(), String> {
    let sm80_only = [
        ("warp_m", c.warp_m != 0),
        ("warp_n", c.warp_n != 0),
        ("min_blocks_per_sm", c.min_blocks_per_sm != 0),
        ("pipelined", c.pipelined),
        ("staged_store", c.staged_store),
    ];
    if let Some((field, _)) = sm80_only.iter().find(|(_, set)| *set) {
        return Err(format!(
            "`{field}` does not apply to the sm90 mainloop, which fixes its warp groups and runs one block per SM; leave it out"
        ));
    }
    if c.bk != BK {
        return Err(format!(
            "bk = {}: the sm90 mainloop's K step is fixed at {BK} (one 128-byte swizzled row)",
            c.bk
        ));
    }
    if !matches!(c.bm, 64 | 128) {
        return Err(format!(
            "bm = {}: the sm90 mainloop takes 64 or 128 (one or two consumer warp groups of 64 rows)",
            c.bm
        ));
    }
    if !matches!(c.bn, 128 | 256) {
        return Err(format!(
            "bn = {}: the sm90 mainloop takes 128 or 256 (the wgmma widths it instantiates)",
            c.bn
        ));
    }
    if c.stages < 2 {
        return Err(format!(
            "stages = {}: the sm90 mainloop's pipeline needs at least 2",
            c.stages
        ));
    }
    let schedule = c.sm90_schedule();
    if schedule == Schedule::PingPong && c.bm != 128 {
        return Err(format!(
            "bm = {}: the ping-pong schedule needs bm = 128 (two consumer warp groups, each taking whole tiles)",
            c.bm
        ));
    }
    let accumulators = c.sm90_accumulators();
    if accumulators > MAX_ACCUMULATORS {
        return Err(format!(
            "{} needs {accumulators} f32 accumulators per consumer thread; the sm90 mainloop's consumers hold at most {MAX_ACCUMULATORS}",
            c.summary(Mainloop::Sm90)
        ));
    }
    Ok(())
}
