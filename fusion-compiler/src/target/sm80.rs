//! Ampere and Ada (sm_80, also run on sm_86 and sm_89): the mma.sync
//! mainloop with a cp.async multi-stage pipeline (`kernels/include/fusion/sm80/`).

use super::{Arch, Target, TileSpace, warp_tiled};
use crate::ir::DType;
use crate::select::{KernelKind, Mainloop, TileConfig};

pub(super) static TARGET: Target = Target {
    arch: Arch::Sm80,
    // PTX too, so later GPUs (sm_100 and on) can JIT it.
    gencode: "-gencode=arch=compute_80,code=[sm_80,compute_80]",
    sass_gencode: "-gencode=arch=compute_80,code=sm_80",
    dtypes: &[DType::F16, DType::BF16],
    mainloop: Mainloop::Sm80,
    mainloop_type: "fusion::sm80::Mainloop",
    mainloop_header: "fusion/sm80/mainloop.cuh",
    tile_type,
    check,
    // Around the shipped tiles (128x128x32, 64x128x32) and the self-test
    // sweep's (kernels/selftest/sweep.json: 128x256, BK 64, 3 stages, the
    // staged store): both K loops, both stores, one to three blocks per SM.
    tile_space: TileSpace {
        bm: &[64, 128],
        bn: &[64, 128, 256],
        bk: &[32, 64],
        warp_m: &[32, 64],
        warp_n: &[32, 64],
        stages: &[3, 4],
        min_blocks_per_sm: &[1, 2, 3],
        pipelined: &[true, false],
        staged_store: &[false, true],
        schedule: &[None],
        cluster_m: &[0],
    },
    decode: true,
    tuned_json: include_str!("../../kernels/tuned/sm80.json"),
};

fn tile_type(c: &TileConfig) -> String {
    // Optional trailing parameters are positional: name the K loop
    // whenever a later one is given.
    let mut extra = String::new();
    if c.pipelined || c.staged_store {
        extra += if c.pipelined {
            ", fusion::sm80::KLoop::Pipelined"
        } else {
            ", fusion::sm80::KLoop::PerStage"
        };
    }
    if c.staged_store {
        extra += ", fusion::sm80::Store::Staged";
    }
    format!(
        "fusion::sm80::TileConfig<{}, {}, {}, {}, {}, {}, {}{extra}>",
        c.bm, c.bn, c.bk, c.warp_m, c.warp_n, c.stages, c.min_blocks_per_sm
    )
}

/// The fields; the tile rules (and the swizzle's rows of 16, 32, 64, ...
/// elements) are its header's, asserted by each unit.
fn check(c: &TileConfig, _kernel: &KernelKind) -> Result<(), String> {
    warp_tiled::check(c, Arch::Sm80)
}
