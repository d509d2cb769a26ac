//! Turing (sm_75): the WMMA mainloop (`kernels/include/fusion/sm75/`), f16
//! only, double-buffered through registers.

use super::{Arch, Target, TileSpace, warp_tiled};
use crate::ir::DType;
use crate::select::{KernelKind, Mainloop, TileConfig};

pub(super) static TARGET: Target = Target {
    arch: Arch::Sm75,
    // PTX too, so later GPUs can JIT it.
    gencode: "-gencode=arch=compute_75,code=[sm_75,compute_75]",
    sass_gencode: "-gencode=arch=compute_75,code=sm_75",
    // Turing tensor cores have no bf16.
    dtypes: &[DType::F16],
    mainloop: Mainloop::Sm75,
    mainloop_type: "fusion::sm75::Mainloop",
    mainloop_header: "fusion/sm75/mainloop.cuh",
    tile_type,
    check,
    // The shipped 128x128 tile and its halves, warp tiles of 32 and 64 and
    // one or two blocks per SM; stages are the template's 2 (it is
    // double-buffered through registers), BK the WMMA loads' 32.
    tile_space: TileSpace {
        bm: &[64, 128],
        bn: &[64, 128],
        bk: &[32],
        warp_m: &[32, 64],
        warp_n: &[32, 64],
        stages: &[2],
        min_blocks_per_sm: &[1, 2],
        pipelined: &[false],
        staged_store: &[false],
        schedule: &[None],
        cluster_m: &[0],
    },
    decode: false,
    tuned_json: include_str!("../../kernels/tuned/sm75.json"),
};

fn tile_type(c: &TileConfig) -> String {
    format!(
        "fusion::sm75::TileConfig<{}, {}, {}, {}, {}, {}>",
        c.bm, c.bn, c.bk, c.warp_m, c.warp_n, c.min_blocks_per_sm
    )
}

/// The fields; the tile rules (and stages = 2: the mainloop is
/// double-buffered) are its header's, asserted by each unit.
fn check(c: &TileConfig, _kernel: &KernelKind) -> Result<(), String> {
    warp_tiled::check(c, Arch::Sm75)
}
