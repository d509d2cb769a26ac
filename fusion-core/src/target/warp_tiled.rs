//! The checks the sm75 and sm80 mainloops share: both tile a block into
//! warp tiles, run one warp per warp tile and cap registers through
//! `min_blocks_per_sm`, so a config's threads and registers follow from it.

use super::Arch;
use crate::select::{KernelKind, TileConfig};

/// Checks `c` against a warp-tiled mainloop and `arch`'s budgets;
/// `mainloop_rules` adds what only that mainloop requires, checked after the
/// warp tiles and before the budgets.
pub(super) fn check(
    c: &TileConfig,
    arch: Arch,
    kernel: &KernelKind,
    mainloop_rules: impl Fn(&TileConfig, &KernelKind) -> Result<(), String>,
) -> Result<(), String> {
    let mainloop = arch.mainloop();
    let budget = arch.budget();
    if let Some(schedule) = c.schedule {
        return Err(format!(
            "`schedule` ({}) is an option of the sm90 mainloop; the {} mainloop has none, leave it out",
            schedule.name(),
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
    if !c.bm.is_multiple_of(c.warp_m) || !c.bn.is_multiple_of(c.warp_n) {
        return Err(format!(
            "warp tile {}x{} does not divide the block tile {}x{}",
            c.warp_m, c.warp_n, c.bm, c.bn
        ));
    }
    if !c.warp_m.is_multiple_of(16) || !c.warp_n.is_multiple_of(16) || !c.bk.is_multiple_of(16) {
        return Err(format!(
            "warp tile {}x{} and bk = {} must be multiples of 16 (the tensor-core tile)",
            c.warp_m, c.warp_n, c.bk
        ));
    }
    let threads = c.warp_tiled_threads();
    if threads > budget.max_threads_per_block {
        return Err(format!(
            "{threads} threads per block; at most {} are allowed",
            budget.max_threads_per_block
        ));
    }
    let chunks_a = c.bm * c.bk / 8;
    let chunks_b = c.bn * c.bk / 8;
    if !chunks_a.is_multiple_of(threads) || !chunks_b.is_multiple_of(threads) {
        return Err(format!(
            "{threads} threads cannot split a {}x{} A tile and a {}x{} B tile into equal shares of 16-byte chunks",
            c.bm, c.bk, c.bk, c.bn
        ));
    }
    mainloop_rules(c, kernel)?;
    let registers = c.registers_estimate();
    let register_cap = budget
        .max_registers_per_thread
        .min(budget.registers_per_sm / (threads * c.min_blocks_per_sm));
    if registers > register_cap {
        return Err(format!(
            "{} needs about {registers} registers per thread ({} accumulators); {} threads x {} block(s)/SM leave {register_cap}",
            c.summary(mainloop),
            c.warp_m * c.warp_n / 32,
            threads,
            c.min_blocks_per_sm
        ));
    }
    Ok(())
}
