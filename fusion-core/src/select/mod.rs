//! Tile-config selection: which [`TileConfig`] each fused GEMM is rendered
//! with, per target architecture.
//!
//! The pre-tuned table for the architecture (`kernels/tuned/<arch>.json`,
//! embedded in this crate so a build needs no GPU) is consulted first, by
//! composition name and dtype, then by composition name, then its `default`
//! entry; an architecture whose table has no matching entry gets the
//! heuristic choice. Whatever the source, a config is checked against the
//! architecture's budgets (shared memory per block, threads per block,
//! registers) before anything is rendered: a tuned entry that does not fit is
//! a build error naming the file and the entry, never an nvcc failure or a
//! launch that fails at run time. Shared memory is the exception: the
//! kernel's own size (sm90: `sizeof(SharedStorage)`) is checked by nvcc,
//! against a `static_assert` that codegen renders into the unit with the
//! same message (see [`crate::codegen`]), so that the size has one source.
//!
//! Every kernel of an arch runs that arch's mainloop ([`Arch::mainloop`]),
//! norm compositions included, and each config is checked against it.
//!
//! M is only known at run time, so a kernel gets one config for every M plus,
//! optionally, a second one its launcher picks for small M.
//!
//! Not here: measuring configs (the CLI's `tune` writes the JSON this reads).

mod tuned;

pub use tuned::TunedTable;

use crate::fuse::GemmComposition;
use crate::ir::{DType, WeightLayout};
use std::fmt;

/// A kernel variant: the GPU generation whose budgets a config must fit and
/// whose mainloop it is rendered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Arch {
    /// Turing: the WMMA mainloop, f16 only.
    Sm75,
    /// Ampere and Ada: the mma.sync mainloop; also runs on sm_86 and sm_89.
    Sm80,
    /// Hopper, built as sm_90a: the wgmma + TMA mainloop.
    Sm90,
}

/// The mainloop template a kernel is instantiated with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Mainloop {
    /// `fusion::sm75::Mainloop`: WMMA, register-staged double buffering.
    Sm75,
    /// `fusion::sm80::Mainloop`: mma.sync, cp.async multi-stage pipeline.
    Sm80,
    /// `fusion::sm90::Mainloop`: persistent and warp-specialized, TMA loads
    /// into a ring of stages, wgmma from shared memory; a norm prologue
    /// normalizes each stage of A in place.
    Sm90,
}

impl Mainloop {
    /// `sm80`, for messages.
    pub fn name(self) -> &'static str {
        match self {
            Mainloop::Sm75 => "sm75",
            Mainloop::Sm80 => "sm80",
            Mainloop::Sm90 => "sm90",
        }
    }
}

/// How the sm90 mainloop's consumer warp groups share the work: its
/// `fusion::sm90::Schedule`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// `BM / 64` consumers split every tile by rows, 64 rows each.
    #[default]
    Cooperative,
    /// Two consumers take alternate whole tiles, so one's epilogue overlaps
    /// the other's K loop.
    PingPong,
}

impl Schedule {
    /// `cooperative`, as the tuned tables spell it.
    pub fn name(self) -> &'static str {
        match self {
            Schedule::Cooperative => "cooperative",
            Schedule::PingPong => "pingpong",
        }
    }
}

/// What one block of a kernel may use on an architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Budget {
    /// Shared memory one block may use, static and dynamic together.
    pub smem_per_block: usize,
    pub max_threads_per_block: u32,
    pub registers_per_sm: u32,
    pub max_registers_per_thread: u32,
}

impl Arch {
    pub const ALL: [Arch; 3] = [Arch::Sm75, Arch::Sm80, Arch::Sm90];

    /// `sm80`: the cargo feature and the tuned file's stem.
    pub fn name(self) -> &'static str {
        match self {
            Arch::Sm75 => "sm75",
            Arch::Sm80 => "sm80",
            Arch::Sm90 => "sm90",
        }
    }

    /// The mainloop written for this arch, which all its kernels run.
    pub fn mainloop(self) -> Mainloop {
        match self {
            Arch::Sm75 => Mainloop::Sm75,
            Arch::Sm80 => Mainloop::Sm80,
            Arch::Sm90 => Mainloop::Sm90,
        }
    }

    /// Whether this variant's code runs on a device of compute capability
    /// `major.minor`. sm_90a machine code runs on 9.0 alone; the sm80 and
    /// sm75 variants also carry PTX, which the driver compiles for any newer
    /// device.
    pub fn runs_on(self, major: i32, minor: i32) -> bool {
        match self {
            Arch::Sm90 => (major, minor) == (9, 0),
            Arch::Sm80 => major >= 8,
            Arch::Sm75 => (major, minor) >= (7, 5),
        }
    }

    /// The best of `available` for a compute capability.
    pub fn best_for(major: i32, minor: i32, available: &[Arch]) -> Option<Arch> {
        available
            .iter()
            .copied()
            .filter(|a| a.runs_on(major, minor))
            .max()
    }

    /// The arch named `sm75`, `sm80` or `sm90`.
    pub fn parse(name: &str) -> Option<Arch> {
        Arch::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Turing tensor cores have no bf16.
    pub fn supports(self, dtype: DType) -> bool {
        match self {
            Arch::Sm75 => dtype == DType::F16,
            Arch::Sm80 | Arch::Sm90 => matches!(dtype, DType::F16 | DType::BF16),
        }
    }

    /// The CUDA programming guide's per-block limits. The `sm80` variant also
    /// runs on sm_86 and sm_89, whose blocks get 99 KB rather than A100's
    /// 163 KB, so 99 KB is its budget.
    pub fn budget(self) -> Budget {
        let smem_per_block = match self {
            Arch::Sm75 => 64 * 1024,
            Arch::Sm80 => 99 * 1024,
            Arch::Sm90 => 227 * 1024,
        };
        Budget {
            smem_per_block,
            max_threads_per_block: 1024,
            registers_per_sm: 64 * 1024,
            max_registers_per_thread: 255,
        }
    }
}

impl fmt::Display for Arch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The parameters of the mainloops' `TileConfig` templates. One struct
/// serves every mainloop; which fields apply depends on it (see
/// [`TileConfig::check`]): the sm90 mainloop takes `bm`, `bn`, `bk` (always
/// 64), `stages` and `schedule`, and fixes the warp layout itself, so its
/// entries leave out `warp_m`, `warp_n` and `min_blocks_per_sm`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct TileConfig {
    /// Rows and columns of C one block computes, and the K step.
    pub bm: u32,
    pub bn: u32,
    pub bk: u32,
    /// Rows and columns of C one warp computes (sm75 and sm80; 0 when left
    /// out, which only the sm90 mainloop accepts).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warp_m: u32,
    #[serde(default, skip_serializing_if = "is_zero")]
    pub warp_n: u32,
    /// Shared-memory pipeline depth (the sm75 mainloop is fixed at 2).
    pub stages: u32,
    /// `__launch_bounds__`' second argument: caps registers so this many
    /// blocks fit on one SM (sm75 and sm80; the sm90 mainloop is persistent,
    /// one block per SM).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_blocks_per_sm: u32,
    /// The sm80 mainloop's pipelined K loop (A/B fragments double-buffered
    /// in registers, the stage barrier inside the last k16 step): 1.4-1.6x
    /// the per-stage loop on an H200 (BENCHMARKS.md, sweep of 2026-11-29).
    #[serde(default)]
    pub pipelined: bool,
    /// The sm80 mainloop's staged store: the epilogue runs on every fragment
    /// first, then C leaves through shared memory in 16-byte stores (+4-5%
    /// on the 128x256x64 tile, sweep set 2).
    #[serde(default)]
    pub staged_store: bool,
    /// The sm90 mainloop's schedule; absent means cooperative. Other
    /// mainloops reject it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<Schedule>,
}

fn is_zero(value: &u32) -> bool {
    *value == 0
}

/// Registers a thread needs besides its f32 accumulators: addresses, A/B
/// fragments, loop indices. ptxas puts the 128x128 tile (64 accumulators,
/// two blocks per SM) at exactly 128 registers without spills on sm_90a, and
/// the 128x256 tile (128 accumulators) at 227-236.
const REGISTERS_BESIDES_ACCUMULATORS: u32 = 64;

/// The sm90 mainloop's K step: one 128-byte swizzled row of 16-bit elements.
const SM90_BK: u32 = 64;

/// f32 accumulators one sm90 consumer thread may hold: consumers run with
/// 232 registers (`setmaxnreg`), which leaves room for 128 besides addresses
/// and the epilogue's values.
const SM90_MAX_ACCUMULATORS: u32 = 128;

impl TileConfig {
    /// 8 warps of 64x64, 96 KB: the fastest config at large M on an H200.
    pub const TILE_128X256: TileConfig = TileConfig {
        bm: 128,
        bn: 256,
        bk: 32,
        warp_m: 64,
        warp_n: 64,
        stages: 4,
        min_blocks_per_sm: 1,
        pipelined: false,
        staged_store: false,
        schedule: None,
    };
    /// 8 warps of 64x32, 64 KB, two blocks per SM: better when a 128x256
    /// tiling leaves SMs idle (M = 128 and 512 measured).
    pub const TILE_128X128: TileConfig = TileConfig {
        bm: 128,
        bn: 128,
        bk: 32,
        warp_m: 64,
        warp_n: 32,
        stages: 4,
        min_blocks_per_sm: 2,
        pipelined: false,
        staged_store: false,
        schedule: None,
    };
    /// The sm75 mainloop's double-buffered 128x128 tile (40 KB).
    pub const SM75_128X128: TileConfig = TileConfig {
        bm: 128,
        bn: 128,
        bk: 32,
        warp_m: 64,
        warp_n: 32,
        stages: 2,
        min_blocks_per_sm: 1,
        pipelined: false,
        staged_store: false,
        schedule: None,
    };
    /// The sm90 mainloop's 128x256 tile: two cooperative consumer warp
    /// groups, 4 stages (225 KB, with half the tile's staging for the
    /// epilogue's TMA stores).
    pub const SM90_128X256: TileConfig = TileConfig {
        bm: 128,
        bn: 256,
        bk: SM90_BK,
        warp_m: 0,
        warp_n: 0,
        stages: 4,
        min_blocks_per_sm: 0,
        pipelined: false,
        staged_store: false,
        schedule: Some(Schedule::Cooperative),
    };
    /// The sm90 mainloop's 64x128 tile, one consumer warp group, 8 stages
    /// (209 KB): four times the tiles of [`TileConfig::SM90_128X256`], to
    /// fill the SMs at small M.
    pub const SM90_64X128: TileConfig = TileConfig {
        bm: 64,
        bn: 128,
        stages: 8,
        ..TileConfig::SM90_128X256
    };
    /// The sm90 mainloop's cooperative 128x128 tile, 6 stages (197 KB): half
    /// the tiles of [`TileConfig::SM90_64X128`] at small M, each of them
    /// faster per flop.
    pub const SM90_128X128: TileConfig = TileConfig {
        bm: 128,
        bn: 128,
        stages: 6,
        ..TileConfig::SM90_128X256
    };

    /// The sm90 schedule, cooperative when the config names none.
    pub fn sm90_schedule(&self) -> Schedule {
        self.schedule.unwrap_or_default()
    }

    /// Threads per block, as the mainloop's `kThreads`: one warp per warp
    /// tile for sm75 and sm80; for sm90 a producer warp group plus one
    /// consumer warp group per 64 rows (cooperative) or two consumers
    /// (ping-pong).
    pub fn threads(&self, mainloop: Mainloop) -> u32 {
        match mainloop {
            Mainloop::Sm75 | Mainloop::Sm80 => {
                32 * (self.bm / self.warp_m.max(1)) * (self.bn / self.warp_n.max(1))
            }
            Mainloop::Sm90 => match self.sm90_schedule() {
                Schedule::Cooperative => 128 * (1 + self.bm / 64),
                Schedule::PingPong => 3 * 128,
            },
        }
    }

    /// Shared memory a block uses, mirroring the mainloops' `kSmemBytes`
    /// plus, on sm75 and sm80, the norm prologue's row statistics (two
    /// floats per row).
    pub fn smem_bytes(
        &self,
        mainloop: Mainloop,
        dtype: DType,
        layout: WeightLayout,
        prologue: bool,
    ) -> usize {
        let (bm, bn, bk) = (self.bm as usize, self.bn as usize, self.bk as usize);
        let elem = dtype.size_bytes();
        let dynamic = match mainloop {
            Mainloop::Sm80 => self.stages as usize * (bm * bk + bn * bk) * elem,
            Mainloop::Sm75 => {
                // Rows padded by 8 elements; B stored as it lies in memory.
                let pad = 8;
                let (b_rows, b_cols) = match layout {
                    WeightLayout::KN => (bk, bn),
                    WeightLayout::NK => (bn, bk),
                };
                let pipeline = 2 * (bm * (bk + pad) + b_rows * (b_cols + pad)) * elem;
                let warps = (self.threads(mainloop) / 32) as usize;
                let epilogue = warps * 16 * (self.warp_n as usize + 4) * 4;
                pipeline.max(epilogue)
            }
            Mainloop::Sm90 => {
                let stages = self.stages as usize;
                // 1024 bytes to align the stages for the 128-byte swizzle.
                let alignment = 1024;
                let pipeline = stages * (bm + bn) * bk * elem;
                // A "full" and an "empty" mbarrier of 8 bytes per stage, and
                // the two ping-pong order barriers.
                let barriers = 16 * stages + 16;
                // The CTA's stream-K pieces.
                let stream_k = 96;
                let without_staging = alignment + pipeline + barriers + stream_k;
                // The epilogue stages the whole tile for its TMA stores
                // (ping-pong's two consumers a tile each), or half its
                // columns at a time where the whole would not fit
                // (kStagingParts).
                let staged_rows = match self.sm90_schedule() {
                    Schedule::Cooperative => bm,
                    Schedule::PingPong => 2 * bm,
                };
                let whole = staged_rows * bn * elem;
                let fits = without_staging + whole <= Arch::Sm90.budget().smem_per_block;
                without_staging + if fits { whole } else { whole / 2 }
            }
        };
        // The sm75 and sm80 kernels keep their tile's row statistics in
        // shared memory; sm90's read them from the first pass's buffer.
        let row_stats = if prologue && mainloop != Mainloop::Sm90 {
            bm * 8
        } else {
            0
        };
        dynamic + row_stats
    }

    /// Estimated registers per thread for the sm75 and sm80 mainloops (see
    /// [`REGISTERS_BESIDES_ACCUMULATORS`]); the sm90 mainloop fixes its own.
    pub fn registers_estimate(&self) -> u32 {
        self.warp_m * self.warp_n / 32 + REGISTERS_BESIDES_ACCUMULATORS
    }

    /// f32 accumulators one sm90 consumer thread holds: a 64-row share of
    /// the tile (cooperative) or a whole tile (ping-pong) over 128 threads.
    pub fn sm90_accumulators(&self) -> u32 {
        match self.sm90_schedule() {
            Schedule::Cooperative => 64 * self.bn / 128,
            Schedule::PingPong => self.bm * self.bn / 128,
        }
    }

    /// `128x256x32 (warp 64x64, 4 stages, 1 block(s)/SM)` for the sm75 and
    /// sm80 mainloops; `128x256x64 (4 stages, cooperative, persistent)` for
    /// sm90's.
    pub fn summary(&self, mainloop: Mainloop) -> String {
        match mainloop {
            Mainloop::Sm75 | Mainloop::Sm80 => format!(
                "{}x{}x{} (warp {}x{}, {} stages, {} block(s)/SM)",
                self.bm, self.bn, self.bk, self.warp_m, self.warp_n, self.stages, self.min_blocks_per_sm
            ),
            Mainloop::Sm90 => format!(
                "{}x{}x{} ({} stages, {}, persistent)",
                self.bm,
                self.bn,
                self.bk,
                self.stages,
                self.sm90_schedule().name()
            ),
        }
    }

    /// Checks the config against what the arch's mainloop accepts and the
    /// architecture's budgets, for a kernel of this shape. The error is a
    /// sentence saying what is wrong and the limit.
    pub fn check(&self, arch: Arch, kernel: &KernelKind) -> Result<(), String> {
        match arch.mainloop() {
            Mainloop::Sm90 => self.check_sm90(),
            mainloop @ (Mainloop::Sm75 | Mainloop::Sm80) => self.check_warp_tiled(arch, mainloop, kernel),
        }
    }

    /// The sm75 and sm80 mainloops: warp tiles, a thread count from them and
    /// an estimate of the registers they need.
    fn check_warp_tiled(&self, arch: Arch, mainloop: Mainloop, kernel: &KernelKind) -> Result<(), String> {
        let c = self;
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
        let threads = c.threads(mainloop);
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
        match mainloop {
            Mainloop::Sm75 if c.stages != 2 => {
                return Err(format!(
                    "stages = {}: the sm75 mainloop is double-buffered, stages must be 2",
                    c.stages
                ));
            }
            Mainloop::Sm80 => {
                // Swizzled shared-memory rows hold a power of two of 16-byte chunks.
                let b_cols = match kernel.layout {
                    WeightLayout::KN => c.bn,
                    WeightLayout::NK => c.bk,
                };
                for (what, cols) in [("bk", c.bk), ("the B tile's row", b_cols)] {
                    let chunks = cols / 8;
                    if chunks < 2 || !chunks.is_power_of_two() {
                        return Err(format!(
                            "{what} of {cols} elements: the sm80 mainloop's swizzle needs rows of 16, 32, 64, ... elements"
                        ));
                    }
                }
            }
            Mainloop::Sm75 | Mainloop::Sm90 => {}
        }
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

    /// The sm90 mainloop: the template's static_asserts and its
    /// accumulators. Registers are fixed by the kernel (producer 40,
    /// consumers 232), so there is no estimate to check; shared memory is
    /// checked by nvcc, against the `static_assert` codegen renders into the
    /// unit for each config.
    fn check_sm90(&self) -> Result<(), String> {
        let c = self;
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
        if c.bk != SM90_BK {
            return Err(format!(
                "bk = {}: the sm90 mainloop's K step is fixed at {SM90_BK} (one 128-byte swizzled row)",
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
        if accumulators > SM90_MAX_ACCUMULATORS {
            return Err(format!(
                "{} needs {accumulators} f32 accumulators per consumer thread; the sm90 mainloop's consumers hold at most {SM90_MAX_ACCUMULATORS}",
                c.summary(Mainloop::Sm90)
            ));
        }
        Ok(())
    }
}

/// What a config is chosen for: the parts of a GEMM kernel that change
/// its resource use.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct KernelKind {
    /// The composition's name (`gemm_bias_gelu`): the tuned table's key.
    pub name: String,
    pub dtype: DType,
    pub layout: WeightLayout,
    /// Has a norm prologue (which on sm75 and sm80 keeps row statistics in
    /// shared memory).
    pub prologue: bool,
}

impl KernelKind {
    pub fn of(composition: &GemmComposition, dtype: DType) -> KernelKind {
        KernelKind {
            name: composition.name(),
            dtype,
            layout: composition.b_layout,
            prologue: composition.prologue.is_some(),
        }
    }
}

/// The config(s) one kernel is rendered with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct KernelConfig {
    /// Used for every M (above `small_m_max`, when there is a small config).
    pub large: TileConfig,
    /// Used when `m <= small_m_max`.
    #[serde(default)]
    pub small_m: Option<TileConfig>,
    #[serde(default)]
    pub small_m_max: Option<u32>,
    /// A second tile for `m <= small_m_max`, with more rows than `small_m`.
    /// At launch the kernel runs whichever of the two needs fewer waves of
    /// tile area on the device's SMs (`fusion::fewer_waves` in gemm.cuh),
    /// the larger tile on a tie: at m = 128 the 128-row tile when N gives
    /// it enough tiles to fill the SMs, the 64-row one when it does not.
    #[serde(default)]
    pub small_m_alt: Option<TileConfig>,
}

impl KernelConfig {
    /// The small-M config and its threshold, when both are present.
    pub fn small(&self) -> Option<(TileConfig, u32)> {
        Some((self.small_m?, self.small_m_max?))
    }
}

/// Where a config came from, for reports and errors.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum ConfigSource {
    /// `kernels/tuned/sm80.json`, entry `gemm_bias_gelu.f16`.
    Tuned {
        file: String,
        entry: String,
    },
    Heuristic,
}

impl fmt::Display for ConfigSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigSource::Tuned { file, entry } => write!(f, "{file}, entry `{entry}`"),
            ConfigSource::Heuristic => f.write_str("the heuristic"),
        }
    }
}

/// Why no config could be chosen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SelectError {
    /// A tuned table is not valid JSON of the expected form.
    #[error("{file}: {reason}")]
    Table { file: String, reason: String },
    /// A config does not fit the architecture or the mainloop.
    #[error("tile config from {origin} for `{kernel}` ({which}) does not fit {arch}: {reason}")]
    Invalid {
        origin: ConfigSource,
        kernel: String,
        arch: Arch,
        /// `large`, `small_m` or `small_m_alt`.
        which: &'static str,
        reason: String,
    },
}

/// The choice made when no tuned entry applies, per mainloop: the configs
/// the self-test benchmark measured best for sm75 and sm80, and the shipped
/// sm90 table's default for sm90.
pub fn heuristic(mainloop: Mainloop) -> KernelConfig {
    match mainloop {
        Mainloop::Sm75 => KernelConfig {
            large: TileConfig::SM75_128X128,
            small_m: None,
            small_m_max: None,
            small_m_alt: None,
        },
        Mainloop::Sm80 => KernelConfig {
            large: TileConfig::TILE_128X256,
            small_m: Some(TileConfig::TILE_128X128),
            small_m_max: Some(256),
            small_m_alt: None,
        },
        Mainloop::Sm90 => KernelConfig {
            large: TileConfig::SM90_128X256,
            small_m: Some(TileConfig::SM90_64X128),
            small_m_max: Some(512),
            small_m_alt: Some(TileConfig::SM90_128X128),
        },
    }
}

/// The checked config for a kernel on `arch`: from `table` when it has an
/// entry for the kernel, else [`heuristic`].
pub fn select_with(table: &TunedTable, arch: Arch, kernel: &KernelKind) -> Result<KernelConfig, SelectError> {
    select_sourced(table, arch, kernel).map(|(config, _)| config)
}

/// [`select_with`], and where the config came from (for the checks codegen
/// renders into the unit).
pub fn select_sourced(
    table: &TunedTable,
    arch: Arch,
    kernel: &KernelKind,
) -> Result<(KernelConfig, ConfigSource), SelectError> {
    let (config, source) = match table.lookup(&kernel.name, kernel.dtype) {
        Some((entry, config)) => (
            *config,
            ConfigSource::Tuned {
                file: table.file.clone(),
                entry: entry.to_owned(),
            },
        ),
        None => (heuristic(arch.mainloop()), ConfigSource::Heuristic),
    };
    let fail = |which, reason| SelectError::Invalid {
        origin: source.clone(),
        kernel: kernel.name.clone(),
        arch,
        which,
        reason,
    };
    config.large.check(arch, kernel).map_err(|r| fail("large", r))?;
    // The optional tiles: each fits the arch and comes with what it needs.
    let optional = [
        (
            config.small_m,
            "small_m",
            config.small_m_max.is_some(),
            "`small_m` needs `small_m_max`, the largest M it serves",
        ),
        (
            config.small_m_alt,
            "small_m_alt",
            config.small_m.is_some(),
            "`small_m_alt` is the alternative to a `small_m`, which this entry lacks",
        ),
    ];
    for (tile, which, complete, missing) in optional {
        if let Some(tile) = tile {
            tile.check(arch, kernel).map_err(|r| fail(which, r))?;
            if !complete {
                return Err(fail(which, missing.into()));
            }
        }
    }
    Ok((config, source))
}

/// [`select_with`] the table shipped for `arch`.
pub fn select(arch: Arch, kernel: &KernelKind) -> Result<KernelConfig, SelectError> {
    select_with(&TunedTable::shipped(arch)?, arch, kernel)
}

#[cfg(test)]
mod tests;
