//! The checks of a config's fields that the sm75 and sm80 mainloops share:
//! both take a warp tile and blocks per SM, and no schedule. What a tile must
//! be to fit the mainloop (warp tiles dividing the block, threads, 16-byte
//! chunks, registers) is the headers' `WarpTiledRules`
//! (`kernels/include/fusion/warp_tiled.cuh`), which every rendered unit
//! asserts with a message naming the tuned table entry.

use super::Arch;
use crate::select::TileConfig;

/// Checks that `c` gives the fields a warp-tiled mainloop of `arch` needs
/// and none it does not take.
pub(super) fn check(c: &TileConfig, arch: Arch) -> Result<(), String> {
    let mainloop = arch.mainloop();
    if let Some(schedule) = c.schedule {
        return Err(format!(
            "`schedule` ({}) is an option of the sm90 mainloop; the {} mainloop has none, leave it out",
            schedule.name(),
            mainloop.name()
        ));
    }
    if c.cluster_m > 1 {
        return Err(format!(
            "`cluster_m` ({}) is an option of the sm90 mainloop; the {} mainloop runs no clusters, leave it out",
            c.cluster_m,
            mainloop.name()
        ));
    }
    let required = [
        ("warp_m", c.warp_m),
        ("warp_n", c.warp_n),
        ("min_blocks_per_sm", c.min_blocks_per_sm),
    ];
    if let Some((field, _)) = required.iter().find(|(_, value)| *value == 0) {
        return Err(format!(
            "`{field}` is missing or 0: the {} mainloop needs `warp_m`, `warp_n` and `min_blocks_per_sm`",
            mainloop.name()
        ));
    }
    if [c.bm, c.bn, c.bk, c.stages].contains(&0) {
        return Err(format!("{}: every field must be positive", c.summary(mainloop)));
    }
    Ok(())
}
