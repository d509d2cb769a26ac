//! What the sm75 and sm80 mainloops' tile configs share: both take a warp
//! tile and blocks per SM. What a tile must be to fit the mainloop (warp
//! tiles dividing the block, threads, 16-byte chunks, registers) is the
//! headers' `WarpTiledRules` (`kernels/include/fusion/warp_tiled.cuh`), which
//! every rendered unit asserts with a message naming the tuned table entry.

use super::{Arch, TileConfig};

/// The warp tile and blocks per SM of a warp-tiled mainloop's config.
#[derive(Clone, Copy, Debug)]
pub(super) struct WarpTile {
    pub warp_m: u32,
    pub warp_n: u32,
    pub min_blocks_per_sm: u32,
}

impl WarpTile {
    /// Checks that `c` gives the fields a warp-tiled mainloop of `arch` needs.
    pub fn check(&self, c: &TileConfig, arch: Arch) -> Result<(), String> {
        let required = [
            ("warp_m", self.warp_m),
            ("warp_n", self.warp_n),
            ("min_blocks_per_sm", self.min_blocks_per_sm),
        ];
        if let Some((field, _)) = required.iter().find(|(_, value)| *value == 0) {
            return Err(format!(
                "`{field}` is missing or 0: the {arch} mainloop needs `warp_m`, `warp_n` and `min_blocks_per_sm`"
            ));
        }
        if [c.bm, c.bn, c.bk, c.stages].contains(&0) {
            return Err(format!("{}: every field must be positive", self.summary(c)));
        }
        Ok(())
    }

    /// `128x256x32 (warp 64x64, 4 stages, 1 block(s)/SM)`.
    pub fn summary(&self, c: &TileConfig) -> String {
        format!(
            "{}x{}x{} (warp {}x{}, {} stages, {} block(s)/SM)",
            c.bm, c.bn, c.bk, self.warp_m, self.warp_n, c.stages, self.min_blocks_per_sm
        )
    }
}

/// A warp-tiled (sm75 or sm80) tile config as the tuned tables and caches
/// spell it; each generation reads it into its own fields.
#[derive(serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Spelled {
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warp_m: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warp_n: u32,
    pub stages: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_blocks_per_sm: u32,
    /// Options of the sm80 mainloop. sm75 configs carry them as `false`
    /// (written into every config when one type served every generation),
    /// so that tuned caches read and write as before; sm75 refuses `true`.
    #[serde(default)]
    pub pipelined: bool,
    #[serde(default)]
    pub staged_store: bool,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}
