//! Hopper (sm_90a): the persistent, warp-specialized wgmma + TMA mainloop
//! (`kernels/include/fusion/sm90/`).

use super::{Arch, Target, TileSpace};
use crate::ir::DType;
use crate::select::{KernelKind, Mainloop, Schedule, TileConfig};

pub(super) static TARGET: Target = Target {
    arch: Arch::Sm90,
    // wgmma and TMA are sm_90a features: its code runs on nothing else, so
    // there is no PTX to carry.
    gencode: "-gencode=arch=compute_90a,code=sm_90a",
    sass_gencode: "-gencode=arch=compute_90a,code=sm_90a",
    dtypes: &[DType::F16, DType::BF16],
    mainloop: Mainloop::Sm90,
    mainloop_type: "fusion::sm90::Mainloop",
    mainloop_header: "fusion/sm90/mainloop.cuh",
    tile_type,
    check,
    // The row and column counts wgmma is instantiated for, K in the
    // template's steps of 64, 2 to 8 stages (the shipped tiles use 3 to 8),
    // both schedules, one CTA or 2-CTA clusters along M (which measured
    // faster only at short K: BENCHMARKS.md v21). The grouping of the
    // template's TileConfig keeps its default: the tables do not give it.
    tile_space: TileSpace {
        bm: &[64, 128],
        bn: &[128, 192, 256],
        bk: &[64],
        warp_m: &[0],
        warp_n: &[0],
        stages: &[2, 3, 4, 5, 6, 7, 8],
        min_blocks_per_sm: &[0],
        pipelined: &[false],
        staged_store: &[false],
        schedule: &[Some(Schedule::Cooperative), Some(Schedule::PingPong)],
        cluster_m: &[0, 2],
    },
    decode: true,
    tuned_json: include_str!("../../kernels/tuned/sm90.json"),
};

/// BK is fixed by the template, so it is not an argument; each unit asserts
/// that the entry's `bk` is the template's.
fn tile_type(c: &TileConfig) -> String {
    let schedule = match c.sm90_schedule() {
        Schedule::Cooperative => "Cooperative",
        Schedule::PingPong => "PingPong",
    };
    let cluster = if c.cluster_m > 1 {
        format!(", {}", c.cluster_m)
    } else {
        String::new()
    };
    format!(
        "fusion::sm90::TileConfig<{}, {}, {}, fusion::sm90::Schedule::{schedule}{cluster}>",
        c.bm, c.bn, c.stages
    )
}

/// The fields: those of the warp-tiled mainloops do not apply. What a tile
/// must be is `TileConfig`'s rules in
/// `kernels/include/fusion/sm90/tile_config.cuh`, and its shared memory is
/// `sizeof(SharedStorage)`: each unit asserts both with a message naming the
/// tuned table entry. Registers are fixed by the kernel (producer 40,
/// consumers 232), so there is no estimate to check.
fn check(c: &TileConfig, kernel: &KernelKind) -> Result<(), String> {
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
    // CollectiveEpilogue::fits, asked before any compile.
    if kernel.gated && !(c.bn / 2).is_multiple_of(64) {
        return Err(format!(
            "a gated GEMM's tile writes bn / 2 = {} columns of C, which the sm90 epilogue stores as whole 64-column boxes: bn 128 or 256",
            c.bn / 2
        ));
    }
    Ok(())
}
