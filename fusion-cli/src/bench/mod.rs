//! `fusion bench`: each fused kernel of the built-in library against the
//! strongest vendor path, timed in one process on the same inputs.
//!
//! The vendor path is cuBLASLt with its fused epilogue where one exists
//! (GELU_BIAS, RELU_BIAS, BIAS, GELU; a residual add rides on cuBLASLt's
//! `beta·C` term), else cuBLASLt followed by the standalone elementwise and
//! norm kernels of the same library. It runs twice over: its cuBLASLt GEMMs
//! with the heuristic's first algorithm, as users get it, and with the
//! fastest of the heuristic's top 16 (`vendor`); the SwiGLU FFN's baseline
//! is measured with its gate and up GEMMs separate and stacked, and stacked
//! with one fused silu·mul kernel after them (`GateUp`), and the FFN
//! sub-layer (RMSNorm first, no down bias) against the norm kernel and that
//! last chain (`FfnRow`).
//! The three contenders (ours, first, best) read the same random inputs,
//! rotate over copies of them so that L2 does not flatter any, and are
//! timed with CUDA events, alternating call by call (warm-up, then the
//! median and quartiles; `timing`). Before timing, the outputs of ours and
//! of the first are compared within the dtype's precision: a fast wrong
//! kernel is reported, not timed. With `--streams N`, each row's ours and
//! first are also timed on N streams at once against one at a time
//! (`streams`). Each row also gets its floor: its bytes at the copy
//! bandwidth measured once per run (`floor`).

pub mod compare;
pub mod corpus;
pub mod cublaslt;
pub mod floor;
pub mod host;
pub mod report;
pub mod smi;
pub mod streams;
pub mod timing;
pub mod vendor;

use cublaslt::LtEpilogue;
use cudarc::driver::{CudaSlice, CudaStream};
use fusion::error::{Error, Result};
use fusion::ir::{DType, WeightLayout};
use fusion::kernels;
use fusion::tensor::{Element, Tensor, TensorMut};
use report::Measured;
pub use report::{Concurrency, HostCost, Report, Row, Slowdown, TimingDescription, table};
use std::cell::RefCell;
use std::sync::Arc;
use std::time::Instant;
use timing::{TimingPlan, time_interleaved};
use vendor::{LtPair, Which};

/// Input sets rotated between calls: the contenders' calls take consecutive
/// indices (`timing::time_interleaved`), so each call reads a set last
/// touched this many calls earlier.
pub(crate) const SETS: usize = 8;

/// Bytes of the scratch [`head_start`] clears ahead of timed calls.
pub(crate) const HEAD_START_BYTES: usize = 256 << 20;

/// The shapes of `fusion bench` when none are given: (M, N, K), each for
/// every pattern.
pub const DEFAULT_SHAPES: [(usize, usize, usize); 6] = [
    (512, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (8192, 14336, 4096),
    (8192, 4096, 14336),
    (128, 14336, 4096),
];

/// Decode shapes when none are given: a few tokens through Llama-3-8B's
/// up (N = 14336) and down (K = 14336) projections, where the weight read
/// dominates. Only the patterns a decoder runs there ([`Pattern::DECODE`])
/// are timed at them, which keeps the default run short.
pub const DEFAULT_DECODE_SHAPES: [(usize, usize, usize); 6] = [
    (1, 14336, 4096),
    (16, 14336, 4096),
    (64, 14336, 4096),
    (1, 4096, 14336),
    (16, 4096, 14336),
    (64, 4096, 14336),
];

/// Token counts for the FFN rows: decode (1, 16), prefill chunks (128,
/// 1000) and a long prompt (8192).
pub const DEFAULT_FFN_TOKENS: [usize; 5] = [1, 16, 128, 1000, 8192];

/// The FFN blocks' width D (Llama-3-8B), as their graphs declare it.
pub const FFN_D: usize = 4096;
/// The FFN blocks' hidden width F (Llama-3-8B), as their graphs declare it.
pub const FFN_F: usize = 14336;

/// A single-GEMM pattern of the built-in library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// The bare GEMM: the mainloop alone, against cuBLASLt without an epilogue.
    Gemm,
    /// gelu(x·Wᵀ + b), GELU's tanh approximation, against cuBLASLt's
    /// GELU_BIAS epilogue.
    GemmBiasGelu,
    /// relu(x·Wᵀ + b), against cuBLASLt's RELU_BIAS epilogue.
    GemmBiasRelu,
    /// x·Wᵀ + b, against cuBLASLt's BIAS epilogue.
    GemmBias,
    /// silu(x·W + b), the weight stored `[K, N]`, against cuBLASLt's BIAS
    /// epilogue and a silu kernel.
    GemmBiasSilu,
    /// x·Wᵀ + b plus the residual, against cuBLASLt's BIAS epilogue with
    /// the residual as its `beta·C` term.
    GemmBiasResidual,
    /// A projection without bias plus the residual (Llama's o_proj, down_proj).
    GemmResidual,
    /// gelu(x·Wᵀ) without bias, against cuBLASLt's GELU epilogue.
    GemmGelu,
    /// silu(x·W) without bias, the weight stored `[K, N]`, against cuBLASLt
    /// and a silu kernel.
    GemmSilu,
    /// A gated pair, act(x·W_gateᵀ)·(x·W_upᵀ), as one GEMM over the two
    /// weights interleaved when bound; N is the width of each weight (and of
    /// the output), so the GEMM computes 2N columns.
    GemmSiluGlu,
    /// The same with GELU, the weights stored `[K, N]` (`graphs/gemm_gelu_glu.toml`).
    GemmGeluGlu,
    /// LayerNorm, then the GEMM: the graph's struct, with its weights bound
    /// and its norm folded.
    LayernormGemm,
    /// RMSNorm, then the GEMM: the graph's struct, with its weights bound
    /// and its norm folded.
    RmsnormGemm,
    /// LayerNorm, then the GEMM: the graph's free function, given gamma and
    /// beta with each call: the norm kernel into scratch, then the GEMM.
    LayernormGemmPerCall,
    /// RMSNorm, then the GEMM: the graph's free function, given gamma with
    /// each call: the norm kernel into scratch, then the GEMM.
    RmsnormGemmPerCall,
}

impl Pattern {
    /// Every pattern; a default run keeps those
    /// [`in_default_table`](Pattern::in_default_table).
    pub const ALL: [Pattern; 15] = [
        Pattern::Gemm,
        Pattern::GemmBiasGelu,
        Pattern::GemmBiasRelu,
        Pattern::GemmBias,
        Pattern::GemmBiasSilu,
        Pattern::GemmBiasResidual,
        Pattern::GemmResidual,
        Pattern::GemmGelu,
        Pattern::GemmSilu,
        Pattern::GemmSiluGlu,
        Pattern::GemmGeluGlu,
        Pattern::LayernormGemm,
        Pattern::RmsnormGemm,
        Pattern::LayernormGemmPerCall,
        Pattern::RmsnormGemmPerCall,
    ];

    /// The name `--kernel` takes and the table shows: the shipped graph's
    /// (`graphs/<name>.toml`), with `_per_call` for the free function's.
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Gemm => "gemm",
            Pattern::GemmBiasGelu => "gemm_bias_gelu",
            Pattern::GemmBiasRelu => "gemm_bias_relu",
            Pattern::GemmBias => "gemm_bias",
            Pattern::GemmBiasSilu => "gemm_bias_silu",
            Pattern::GemmBiasResidual => "gemm_bias_residual",
            Pattern::GemmResidual => "gemm_residual",
            Pattern::GemmGelu => "gemm_gelu",
            Pattern::GemmSilu => "gemm_silu",
            Pattern::GemmSiluGlu => "gemm_silu_glu",
            Pattern::GemmGeluGlu => "gemm_gelu_glu",
            Pattern::LayernormGemm => "layernorm_gemm",
            Pattern::RmsnormGemm => "rmsnorm_gemm",
            Pattern::LayernormGemmPerCall => "layernorm_gemm_per_call",
            Pattern::RmsnormGemmPerCall => "rmsnorm_gemm_per_call",
        }
    }

    /// LayerNorm (true) or RMSNorm (false) before the GEMM, if any.
    fn layernorm(self) -> Option<bool> {
        match self {
            Pattern::LayernormGemm | Pattern::LayernormGemmPerCall => Some(true),
            Pattern::RmsnormGemm | Pattern::RmsnormGemmPerCall => Some(false),
            _ => None,
        }
    }

    /// The weight layout of the shipped graph (`graphs/<name>.toml`).
    fn layout(self) -> WeightLayout {
        match self {
            Pattern::GemmBiasSilu | Pattern::GemmSilu | Pattern::GemmGeluGlu => WeightLayout::KN,
            _ => WeightLayout::NK,
        }
    }

    /// A gated pair's activation kernel for the baseline (silu·mul or
    /// gelu·mul after the stacked GEMM); None for a single weight.
    fn gated(self) -> Option<GatedAct> {
        match self {
            Pattern::GemmSiluGlu => Some(GatedAct::Silu),
            Pattern::GemmGeluGlu => Some(GatedAct::Gelu),
            _ => None,
        }
    }

    /// The weights the GEMM reads: two for a gated pair.
    fn weights(self) -> usize {
        if self.gated().is_some() { 2 } else { 1 }
    }

    /// The multiply-adds of one call at (M, N, K), times two.
    pub fn flop(self, (m, n, k): (usize, usize, usize)) -> f64 {
        2.0 * (m * self.weights() * n * k) as f64
    }

    /// The cuBLASLt epilogue of the baseline, and the unfused step after it.
    fn baseline(self) -> (LtEpilogue, &'static str) {
        match self {
            Pattern::Gemm => (LtEpilogue::None, ""),
            Pattern::GemmBiasGelu => (LtEpilogue::GeluBias, ""),
            Pattern::GemmBiasRelu => (LtEpilogue::ReluBias, ""),
            Pattern::GemmBias => (LtEpilogue::Bias, ""),
            Pattern::GemmBiasResidual => (LtEpilogue::Bias, " + beta·C"),
            Pattern::GemmResidual => (LtEpilogue::None, " + beta·C"),
            Pattern::GemmSiluGlu => (LtEpilogue::None, " stacked gate/up + silu·mul kernel"),
            Pattern::GemmGeluGlu => (LtEpilogue::None, " stacked gate/up + gelu·mul kernel"),
            Pattern::GemmGelu => (LtEpilogue::Gelu, ""),
            Pattern::GemmBiasSilu => (LtEpilogue::Bias, " + silu kernel"),
            Pattern::GemmSilu => (LtEpilogue::None, " + silu kernel"),
            Pattern::LayernormGemm | Pattern::LayernormGemmPerCall => {
                (LtEpilogue::None, " after layernorm kernel")
            }
            Pattern::RmsnormGemm | Pattern::RmsnormGemmPerCall => (LtEpilogue::None, " after rmsnorm kernel"),
        }
    }

    /// Whether the default table has it: every pattern but the three the
    /// corpus added (`gemm_residual` and the gated pairs), which run where
    /// `--kernel` names them or a corpus has them until their rows have been
    /// checked on a GPU.
    pub fn in_default_table(self) -> bool {
        !matches!(
            self,
            Pattern::GemmResidual | Pattern::GemmSiluGlu | Pattern::GemmGeluGlu
        )
    }

    /// The patterns timed at the decode shapes: the bare GEMM and the
    /// activations a decoder's projections carry.
    pub const DECODE: [Pattern; 3] = [Pattern::Gemm, Pattern::GemmBiasGelu, Pattern::GemmSilu];

    /// The pattern with this [`name`](Pattern::name); none for any other.
    pub fn parse(name: &str) -> Option<Pattern> {
        Pattern::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// The elementwise kernel after a gated pair's stacked GEMM in the baseline.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GatedAct {
    Silu,
    Gelu,
}

/// Random device data, the same in every rotated set (contents do not
/// matter for L2; addresses do).
struct Rotated<T> {
    sets: Vec<CudaSlice<T>>,
}

impl<T: BenchElement> Rotated<T> {
    fn random(stream: &Arc<CudaStream>, len: usize, scale: f32, seed: u64) -> Result<Rotated<T>> {
        Self::from_host(stream, &T::random(len, scale, seed))
    }

    fn from_host(stream: &Arc<CudaStream>, host: &[T]) -> Result<Rotated<T>> {
        let sets = (0..SETS)
            .map(|_| stream.clone_htod(host))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Rotated { sets })
    }

    fn zeros(stream: &Arc<CudaStream>, len: usize) -> Result<Rotated<T>> {
        let sets = (0..SETS)
            .map(|_| stream.alloc_zeros::<T>(len))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Rotated { sets })
    }

    fn get(&self, i: usize) -> &CudaSlice<T> {
        &self.sets[i % SETS]
    }

    fn get_mut(&mut self, i: usize) -> &mut CudaSlice<T> {
        &mut self.sets[i % SETS]
    }
}

/// An element type the bench can fill with random values.
pub trait BenchElement: Element + cudarc::driver::ValidAsZeroBits {
    /// `len` values uniform in [-scale, scale), the same for the same
    /// seed.
    fn random(len: usize, scale: f32, seed: u64) -> Vec<Self>;
    /// The value, exactly, for comparing outputs.
    fn to_f64(self) -> f64;
}

/// A small xorshift: the bench needs many values fast, not quality.
fn uniform(len: usize, scale: f32, seed: u64) -> impl Iterator<Item = f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len).map(move |_| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        ((state >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
    })
}

impl BenchElement for half::f16 {
    fn random(len: usize, scale: f32, seed: u64) -> Vec<Self> {
        uniform(len, scale, seed).map(half::f16::from_f32).collect()
    }
    fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }
}

impl BenchElement for half::bf16 {
    fn random(len: usize, scale: f32, seed: u64) -> Vec<Self> {
        uniform(len, scale, seed).map(half::bf16::from_f32).collect()
    }
    fn to_f64(self) -> f64 {
        f64::from(self.to_f32())
    }
}

/// ‖got − want‖₂ / ‖want‖₂; infinite where `got` has a NaN or an
/// infinity.
pub fn relative_difference<T: BenchElement>(got: &[T], want: &[T]) -> f64 {
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (x, y) in got.iter().zip(want) {
        let (x, y) = (x.to_f64(), y.to_f64());
        if !x.is_finite() {
            return f64::INFINITY;
        }
        diff += (x - y) * (x - y);
        norm += y * y;
    }
    (diff / norm.max(f64::MIN_POSITIVE)).sqrt()
}

/// The largest relative difference between two `dtype` outputs of one
/// computation that the bench accepts: the limit the GPU tests put on an
/// output against the exact reference (`testing::relative_l2_limit`, about
/// 5x the error measured for f32-accumulating GEMMs). Two independent such
/// outputs differ by about √2 times either's error, still well within it
/// (run D of benchmarks/HISTORY.md: at most 3.7e-4 for f16, limit 1e-3), and a
/// wrong tile, column or rounding to a coarser type is far above it.
pub fn agreement_limit(dtype: DType) -> f64 {
    fusion::testing::relative_l2_limit(dtype)
}

/// Copies both outputs to the host and compares them; an error when they
/// differ beyond [`agreement_limit`], so that a wrong kernel is not timed.
fn check_agreement<T: BenchElement>(
    stream: &Arc<CudaStream>,
    ours: &CudaSlice<T>,
    base: &CudaSlice<T>,
    kernel: &str,
    shape: String,
) -> Result<f64> {
    let relative = relative_difference(&stream.clone_dtoh(ours)?, &stream.clone_dtoh(base)?);
    if relative.is_nan() || relative > agreement_limit(T::DTYPE) {
        return Err(Error::BenchDisagreement {
            kernel: kernel.into(),
            shape,
            relative,
        });
    }
    Ok(relative)
}

/// Whether the built-in library's GEMMs whose N or K is dynamic choose their
/// sm90 tile per call by the model of the kernel's time (a build with
/// `FUSION_SELECT=model`): asked of `gemm`'s plan table, as the build wrote
/// it for every such pattern alike.
pub fn tiles_by_model() -> bool {
    use fusion::plan::{GemmOp, KernelOp};
    kernels::Gemm::<half::f16>::PLAN
        .kernels
        .iter()
        .any(|kernel| matches!(kernel.op, KernelOp::Gemm(GemmOp { model: Some(_), .. })))
}

/// Whether the built-in library's GEMMs whose N or K is dynamic run the
/// guard's verdict per call (a build with `FUSION_GUARD=on`) and this
/// process takes its routes ([`fusion::vendor::routes_enabled`]: cuBLASLt
/// loaded, `FUSION_GUARD` not `off` at run time): asked of `gemm`'s plan
/// table, as the build wrote it for every plain-epilogue pattern alike.
pub fn guarded() -> bool {
    use fusion::plan::{GemmOp, KernelOp, VendorRoute};
    let built = kernels::Gemm::<half::f16>::PLAN.kernels.iter().any(|kernel| {
        matches!(
            kernel.op,
            KernelOp::Gemm(GemmOp {
                vendor: VendorRoute {
                    per_call: Some(_),
                    ..
                },
                ..
            })
        )
    });
    built && fusion::vendor::routes_enabled()
}

/// The CUDA version the driver supports (`cuDriverGetVersion`: major·1000
/// + minor·10).
pub fn cuda_driver_version() -> Result<i32> {
    let mut version = 0;
    // SAFETY: writes one int to a live local; needs no context.
    unsafe { cudarc::driver::sys::cuDriverGetVersion(&mut version) }.result()?;
    Ok(version)
}

/// Device time of ≥ a few milliseconds queued before the timed calls.
pub(crate) fn head_start(stream: &Arc<CudaStream>, scratch: &mut CudaSlice<u8>) -> Result<()> {
    for _ in 0..16 {
        stream.memset_zeros(scratch)?;
    }
    Ok(())
}

/// Settings of one bench run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Every pattern of `patterns` runs at each of these.
    pub shapes: Vec<(usize, usize, usize)>,
    /// Those of `patterns` that are in [`Pattern::DECODE`] also run at
    /// each of these.
    pub decode_shapes: Vec<(usize, usize, usize)>,
    /// Every row of `ffn_rows` runs at each of these token counts.
    pub ffn_tokens: Vec<usize>,
    /// The FFN rows timed at `ffn_tokens`.
    pub ffn_rows: Vec<FfnRow>,
    /// The single-GEMM patterns timed at `shapes` (and `decode_shapes`).
    pub patterns: Vec<Pattern>,
    /// Cases run after the shapes' (`--corpus`): a pattern at (M, N, K) or
    /// a standalone norm at (M, K) each.
    pub corpus: Vec<corpus::Case>,
    /// Untimed and timed calls of each row's contenders.
    pub timing: TimingPlan,
    /// `--streams N`: also time each row on N streams at once.
    pub streams: Option<usize>,
    /// `--host`: also measure each row's host time per call (`host`).
    pub host: bool,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            shapes: DEFAULT_SHAPES.to_vec(),
            decode_shapes: DEFAULT_DECODE_SHAPES.to_vec(),
            ffn_tokens: DEFAULT_FFN_TOKENS.to_vec(),
            ffn_rows: FfnRow::ALL.to_vec(),
            patterns: Pattern::ALL
                .into_iter()
                .filter(|p| p.in_default_table())
                .collect(),
            corpus: Vec::new(),
            timing: TimingPlan::default(),
            streams: None,
            host: false,
        }
    }
}

impl BenchConfig {
    /// The single-GEMM cases in the order they run: each shape with every
    /// pattern, then each decode shape with the decode patterns, then the
    /// corpus's cases.
    pub fn gemm_cases(&self) -> Vec<(Pattern, (usize, usize, usize))> {
        let every = self
            .shapes
            .iter()
            .flat_map(|&shape| self.patterns.iter().map(move |&pattern| (pattern, shape)));
        let decode = self.decode_shapes.iter().flat_map(|&shape| {
            self.patterns
                .iter()
                .filter(|pattern| Pattern::DECODE.contains(pattern))
                .map(move |&pattern| (pattern, shape))
        });
        let corpus = self.corpus.iter().filter_map(|case| match *case {
            corpus::Case::Gemm(pattern, shape) => Some((pattern, shape)),
            corpus::Case::Norm(..) => None,
        });
        every.chain(decode).chain(corpus).collect()
    }

    /// The standalone norm cases, after the GEMM and FFN cases: the
    /// corpus's.
    pub fn norm_cases(&self) -> Vec<(NormRow, (usize, usize))> {
        self.corpus
            .iter()
            .filter_map(|case| match *case {
                corpus::Case::Norm(norm, shape) => Some((norm, shape)),
                corpus::Case::Gemm(..) => None,
            })
            .collect()
    }

    /// The FFN cases in the order they run, after the single-GEMM cases:
    /// each token count with every FFN row.
    pub fn ffn_cases(&self) -> Vec<(FfnRow, usize)> {
        self.ffn_tokens
            .iter()
            .flat_map(|&m| self.ffn_rows.iter().map(move |&row| (row, m)))
            .collect()
    }
}

/// A case's weight and norm parameters: random, the same for the same
/// (n, k, seed), so that a struct can bind an equal copy of the case's.
struct NormWeights<T> {
    w: Rotated<T>,
    gamma: Rotated<T>,
    beta: Rotated<T>,
}

impl<T: BenchElement> NormWeights<T> {
    fn random(stream: &Arc<CudaStream>, n: usize, k: usize, seed: u64) -> Result<NormWeights<T>> {
        Ok(NormWeights {
            w: Rotated::random(stream, n * k, 1.0 / (k as f32).sqrt(), seed + 1)?,
            gamma: Rotated::random(stream, k, 1.0, seed + 4)?,
            beta: Rotated::random(stream, k, 1.0, seed + 5)?,
        })
    }
}

/// A pattern's graph struct with its weights bound, called as the bench
/// calls every pattern: x, the residual (read only by the residual GEMMs)
/// and y.
trait Bound<T: Element> {
    fn call(
        &mut self,
        stream: &Arc<CudaStream>,
        x: &Tensor<'_, T>,
        residual: &Tensor<'_, T>,
        y: &mut TensorMut<'_, T>,
    ) -> Result<()>;

    /// Kernels one call launches: its plan's.
    fn launches(&self) -> usize;
}

/// [`Bound`] for the structs whose inputs are x alone (`x`) or x and the
/// residual (`x_residual`).
macro_rules! bound {
    ($inputs:ident: $($graph:ident),*) => {$(
        impl<T: Element> Bound<T> for kernels::$graph<'_, T> {
            fn call(
                &mut self,
                stream: &Arc<CudaStream>,
                x: &Tensor<'_, T>,
                residual: &Tensor<'_, T>,
                y: &mut TensorMut<'_, T>,
            ) -> Result<()> {
                bound!(@run $inputs self, stream, x, residual, y)
            }

            fn launches(&self) -> usize {
                Self::PLAN.kernels.len()
            }
        }
    )*};
    (@run x $s:expr, $stream:expr, $x:expr, $residual:expr, $y:expr) => {{
        let _ = $residual;
        $s.run($stream, $x, $y)
    }};
    (@run x_residual $s:expr, $stream:expr, $x:expr, $residual:expr, $y:expr) => {
        $s.run($stream, $x, $residual, $y)
    };
}
bound!(x: Gemm, GemmBiasGelu, GemmBiasRelu, GemmBias, GemmBiasSilu, GemmGelu, GemmSilu, GemmSiluGlu, GemmGeluGlu,
    LayernormGemm, RmsnormGemm);
bound!(x_residual: GemmBiasResidual, GemmResidual);

/// `pattern`'s struct bound to w (a gated pair's gate and up weights), the
/// bias b and the norm's g and be (each read where the graph has it).
fn bind<'w, T: Element>(
    stream: &Arc<CudaStream>,
    pattern: Pattern,
    w: [Tensor<'w, T>; 2],
    b: Tensor<'w, T>,
    g: Tensor<'w, T>,
    be: Tensor<'w, T>,
) -> Result<Box<dyn Bound<T> + 'w>> {
    use kernels::*;
    let [w, w_up] = w;
    if let Some(act) = pattern.gated() {
        let w_gate = w;
        return Ok(match act {
            GatedAct::Silu => Box::new(GemmSiluGlu::new(stream, GemmSiluGluWeights { w_gate, w_up })?),
            GatedAct::Gelu => Box::new(GemmGeluGlu::new(stream, GemmGeluGluWeights { w_gate, w_up })?),
        });
    }
    Ok(match pattern {
        Pattern::Gemm => Box::new(Gemm::new(stream, GemmWeights { w })?),
        Pattern::GemmBiasGelu => Box::new(GemmBiasGelu::new(stream, GemmBiasGeluWeights { w, b })?),
        Pattern::GemmBiasRelu => Box::new(GemmBiasRelu::new(stream, GemmBiasReluWeights { w, b })?),
        Pattern::GemmBias => Box::new(GemmBias::new(stream, GemmBiasWeights { w, b })?),
        Pattern::GemmBiasSilu => Box::new(GemmBiasSilu::new(stream, GemmBiasSiluWeights { w, b })?),
        Pattern::GemmBiasResidual => {
            Box::new(GemmBiasResidual::new(stream, GemmBiasResidualWeights { w, b })?)
        }
        Pattern::GemmResidual => Box::new(GemmResidual::new(stream, GemmResidualWeights { w })?),
        Pattern::GemmGelu => Box::new(GemmGelu::new(stream, GemmGeluWeights { w })?),
        Pattern::GemmSilu => Box::new(GemmSilu::new(stream, GemmSiluWeights { w })?),
        Pattern::LayernormGemm => Box::new(LayernormGemm::new(stream, LayernormGemmWeights { g, b: be, w })?),
        Pattern::RmsnormGemm => Box::new(RmsnormGemm::new(stream, RmsnormGemmWeights { g, w })?),
        Pattern::LayernormGemmPerCall | Pattern::RmsnormGemmPerCall => {
            unreachable!("a per-call norm binds only w, through its free function")
        }
        Pattern::GemmSiluGlu | Pattern::GemmGeluGlu => unreachable!("bound above"),
    })
}

/// Everything one (pattern, shape) case allocates.
struct GemmCase<T> {
    x: Rotated<T>,
    w: Rotated<T>,
    bias: Rotated<T>,
    residual: Rotated<T>,
    gamma: Rotated<T>,
    beta: Rotated<T>,
    ours: Rotated<T>,
    base: Rotated<T>,
    /// The baseline's intermediate (GEMM result or normalised activation).
    scratch: Rotated<T>,
}

fn mat<T: Element>(buf: &CudaSlice<T>, rows: usize, cols: usize) -> Result<Tensor<'_, T>> {
    Tensor::new(buf, [rows, cols])
}

fn vec_of<T: Element>(buf: &CudaSlice<T>, n: usize) -> Result<Tensor<'_, T>> {
    Tensor::new(buf, [n])
}

/// What a case does once its contenders are built: the timing of a row,
/// or one stream's part in `--streams`' measurements (no row).
enum Run<'a, 'r> {
    Timed {
        plan: TimingPlan,
        head: &'a mut CudaSlice<u8>,
        /// Also measure the host time per call (`--host`).
        host: bool,
    },
    Streams(&'a streams::Part<'r>),
}

/// Hands ours and the baseline with cuBLASLt's first algorithm, each a
/// call of input set `i`, to `part`; what a case does under [`Run::Streams`].
fn take_part<C>(
    part: &streams::Part<'_>,
    case: C,
    ours: impl FnMut(&mut C, usize) -> Result<()>,
    first: impl FnMut(&mut C, usize) -> Result<()>,
) {
    let (case, mut ours, mut first) = (RefCell::new(case), ours, first);
    part.take_part([&mut |i| ours(&mut case.borrow_mut(), i), &mut |i| {
        first(&mut case.borrow_mut(), i)
    }]);
}

/// Times one pattern at one shape: ours against its baseline with cuBLASLt's
/// first algorithm and with the best of its top candidates.
pub fn bench_pattern<T: BenchElement>(
    stream: &Arc<CudaStream>,
    pattern: Pattern,
    shape: (usize, usize, usize),
    plan: TimingPlan,
    head: &mut CudaSlice<u8>,
    host: bool,
) -> Result<Row> {
    let row = pattern_case::<T>(stream, pattern, shape, Run::Timed { plan, head, host })?;
    Ok(row.expect("a timed case gives its row"))
}

/// [`bench_pattern`], or its part in `--streams`' measurements.
fn pattern_case<T: BenchElement>(
    stream: &Arc<CudaStream>,
    pattern: Pattern,
    (m, n, k): (usize, usize, usize),
    run: Run<'_, '_>,
) -> Result<Option<Row>> {
    let seed = (m * 31 + n * 17 + k) as u64;
    // A gated pair's two weights one after the other, as the stacked
    // cuBLASLt call reads them; the struct binds a view of each.
    let halves = pattern.weights();
    let NormWeights { w, gamma, beta } = NormWeights::random(stream, halves * n, k, seed)?;
    let mut c = GemmCase::<T> {
        x: Rotated::random(stream, m * k, 1.0, seed)?,
        w,
        bias: Rotated::random(stream, n, 1.0, seed + 2)?,
        residual: Rotated::random(stream, m * n, 1.0, seed + 3)?,
        gamma,
        beta,
        ours: Rotated::zeros(stream, m * n)?,
        base: Rotated::zeros(stream, m * n)?,
        scratch: Rotated::zeros(stream, m * (halves * n).max(k))?,
    };
    let (epilogue, unfused) = pattern.baseline();
    let mut lt = LtPair::new(|candidates| {
        if halves == 2 {
            cublaslt::LtGemm::new_stacked(stream, T::DTYPE, pattern.layout(), (m, n, k), 2, candidates)
        } else {
            cublaslt::LtGemm::new(
                stream,
                T::DTYPE,
                pattern.layout(),
                (m, n, k),
                epilogue,
                candidates,
            )
        }
    })?;
    let w_shape = match pattern.layout() {
        WeightLayout::NK => [n, k],
        WeightLayout::KN => [k, n],
    };
    let has_bias = epilogue != LtEpilogue::None && epilogue != LtEpilogue::Gelu;
    let shape = format!("{m},{n},{k}");
    // Every pattern whose weights are weights runs as a model runs it: one
    // struct per input set, bound to that set's weights (a norm folded into
    // its own copy of w, a misaligned w copied into padded rows). Bound to
    // equal copies (same seeds), since the case's own buffers are borrowed
    // mutably below. The per-call norms take gamma and beta with each call.
    let per_call = matches!(
        pattern,
        Pattern::LayernormGemmPerCall | Pattern::RmsnormGemmPerCall
    );
    let bound_weights = (!per_call)
        .then(|| -> Result<_> {
            Ok((
                NormWeights::<T>::random(stream, halves * n, k, seed)?,
                Rotated::<T>::random(stream, n, 1.0, seed + 2)?,
            ))
        })
        .transpose()?;
    let mut bound: Vec<Box<dyn Bound<T> + '_>> = Vec::new();
    for (i, (weights, bias)) in bound_weights
        .iter()
        .flat_map(|weights| (0..SETS).map(move |i| (i, weights)))
    {
        let w = weights.w.get(i);
        let (w, g, be, b) = (
            [
                Tensor::from_view(w.slice(..n * k), w_shape)?,
                Tensor::from_view(w.slice((halves - 1) * n * k..halves * n * k), w_shape)?,
            ],
            vec_of(weights.gamma.get(i), k)?,
            vec_of(weights.beta.get(i), k)?,
            vec_of(bias.get(i), n)?,
        );
        bound.push(bind(stream, pattern, w, b, g, be)?);
    }

    // Per-call norms run free functions, whose kernels no plan counts.
    let launches = bound.first().map(|b| b.launches());
    let mut ours = |c: &mut GemmCase<T>, i: usize| -> Result<()> {
        let x = mat(c.x.get(i), m, k)?;
        let r = mat(c.residual.get(i), m, n)?;
        let mut y = TensorMut::new(c.ours.get_mut(i), [m, n])?;
        if let Some(bound) = bound.get_mut(i % SETS) {
            return bound.call(stream, &x, &r, &mut y);
        }
        let w = Tensor::new(c.w.get(i), w_shape)?;
        let g = vec_of(c.gamma.get(i), k)?;
        match pattern {
            Pattern::LayernormGemmPerCall => {
                kernels::layernorm_gemm(stream, &x, &g, &vec_of(c.beta.get(i), k)?, &w, &mut y)
            }
            Pattern::RmsnormGemmPerCall => kernels::rmsnorm_gemm(stream, &x, &g, &w, &mut y),
            _ => unreachable!("every other pattern runs its bound struct"),
        }
    };
    let baseline = |c: &mut GemmCase<T>, lt: &mut cublaslt::LtGemm, i: usize| -> Result<()> {
        let GemmCase {
            x,
            w,
            bias,
            residual,
            gamma,
            beta,
            base,
            scratch,
            ..
        } = c;
        let bias = Some(bias.get(i)).filter(|_| has_bias);
        if let Some(act) = pattern.gated() {
            // The stacked GEMM writes gate then up, each [M, N].
            lt.run(stream, x.get(i), w.get(i), None, None, scratch.get_mut(i))?;
            let gate = Tensor::from_view(scratch.get(i).slice(..m * n), [m, n])?;
            let up = Tensor::from_view(scratch.get(i).slice(m * n..2 * m * n), [m, n])?;
            let mut h = TensorMut::new(base.get_mut(i), [m, n])?;
            return match act {
                GatedAct::Silu => kernels::silu_mul(stream, &gate, &up, &mut h),
                GatedAct::Gelu => kernels::gelu_mul(stream, &gate, &up, &mut h),
            };
        }
        match pattern {
            Pattern::GemmBiasSilu | Pattern::GemmSilu => {
                lt.run(stream, x.get(i), w.get(i), bias, None, scratch.get_mut(i))?;
                let t = Tensor::from_view(scratch.get(i).slice(..m * n), [m, n])?;
                kernels::silu(stream, &t, &mut TensorMut::new(base.get_mut(i), [m, n])?)
            }
            _ if pattern.layernorm().is_some() => {
                {
                    let xi = mat(x.get(i), m, k)?;
                    let g = vec_of(gamma.get(i), k)?;
                    let mut normed = TensorMut::from_view(scratch.get_mut(i).slice_mut(..m * k), [m, k])?;
                    if pattern.layernorm() == Some(true) {
                        kernels::layernorm(stream, &xi, &g, &vec_of(beta.get(i), k)?, &mut normed)?;
                    } else {
                        kernels::rmsnorm(stream, &xi, &g, &mut normed)?;
                    }
                }
                lt.run(stream, scratch.get(i), w.get(i), None, None, base.get_mut(i))
            }
            Pattern::GemmBiasResidual | Pattern::GemmResidual => lt.run(
                stream,
                x.get(i),
                w.get(i),
                bias,
                Some(residual.get(i)),
                base.get_mut(i),
            ),
            _ => lt.run(stream, x.get(i), w.get(i), bias, None, base.get_mut(i)),
        }
    };

    let (plan, head, host) = match run {
        Run::Timed { plan, head, host } => (plan, head, host),
        Run::Streams(part) => {
            take_part(
                part,
                (c, lt),
                |(c, _), i| ours(c, i),
                |(c, lt), i| baseline(c, lt.get(Which::First), i),
            );
            return Ok(None);
        }
    };
    // Same inputs (set 0), then compare before timing anything.
    ours(&mut c, 0)?;
    baseline(&mut c, lt.get(Which::First), 0)?;
    stream.synchronize()?;
    let agreement = check_agreement(
        stream,
        c.ours.get(0),
        c.base.get(0),
        pattern.name(),
        shape.clone(),
    )?;
    {
        // The baseline's GEMM alone, on x (the norm patterns' GEMM reads the
        // normalised x, of the same shape: the same work), into the
        // baseline's output, or its scratch for a gated pair's two.
        let GemmCase {
            x,
            w,
            bias,
            residual,
            base,
            scratch,
            ..
        } = &mut c;
        let residual =
            matches!(pattern, Pattern::GemmBiasResidual | Pattern::GemmResidual).then_some(&*residual);
        lt.tune(
            stream,
            if halves == 2 { scratch } else { base },
            || head_start(stream, head),
            |gemm, out, i| {
                let bias = Some(bias.get(i)).filter(|_| has_bias);
                gemm.run(stream, x.get(i), w.get(i), bias, residual.map(|r| r.get(i)), out)
            },
        )?;
    }
    // The closures borrow the case and the plans mutably, one call at a time.
    let (c, lt_cell) = (RefCell::new(c), RefCell::new(lt));
    let [ours_t, first_t, best_t] = time_interleaved(
        stream,
        plan,
        || head_start(stream, head),
        [
            &mut |i| ours(&mut c.borrow_mut(), i),
            &mut |i| baseline(&mut c.borrow_mut(), lt_cell.borrow_mut().get(Which::First), i),
            &mut |i| baseline(&mut c.borrow_mut(), lt_cell.borrow_mut().get(Which::Best), i),
        ],
    )?;
    let host = match launches.filter(|_| host) {
        Some(launches) => Some(host::measure(
            stream,
            head,
            launches,
            &mut |i| ours(&mut c.borrow_mut(), i),
            // The baseline's GEMM alone: one cublasLtMatmul.
            &mut |i| {
                let GemmCase {
                    x,
                    w,
                    bias,
                    residual,
                    base,
                    scratch,
                    ..
                } = &mut *c.borrow_mut();
                let residual = matches!(pattern, Pattern::GemmBiasResidual | Pattern::GemmResidual)
                    .then(|| residual.get(i));
                let out = if halves == 2 { scratch } else { base };
                lt_cell.borrow_mut().get(Which::First).run(
                    stream,
                    x.get(i),
                    w.get(i),
                    Some(bias.get(i)).filter(|_| has_bias),
                    residual,
                    out.get_mut(i),
                )
            },
        )?),
        None => None,
    };
    let mut row = Row::new(
        pattern.name(),
        shape,
        T::DTYPE,
        format!("{}{unfused}", epilogue.name()),
        pattern.flop((m, n, k)),
        Measured {
            ours: ours_t,
            first: first_t,
            best: best_t,
            agreement,
            algorithms: vec![lt_cell.borrow().choice("gemm")?],
        },
    );
    row.host = host;
    Ok(Some(row))
}

/// How an FFN baseline computes the gate and up projections.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GateUp {
    /// Two cuBLASLt GEMMs, one per weight.
    Separate,
    /// One cuBLASLt call over the two weights stacked `[2F, D]`
    /// ([`cublaslt::LtGemm::new_stacked`]), as a model that stores them
    /// merged calls it.
    Stacked,
    /// The stacked call, then one kernel for silu(gate)·up
    /// (`kernels::silu_mul`) in place of the silu and mul kernels: three
    /// launches with the down GEMM, the strongest unfused chain a user
    /// could write.
    StackedFused,
}

impl GateUp {
    /// Every chain, in the order of the table's rows.
    pub const ALL: [GateUp; 3] = [GateUp::Separate, GateUp::Stacked, GateUp::StackedFused];

    /// The baseline's label in the table.
    fn baseline(self) -> &'static str {
        match self {
            GateUp::Separate => "cuBLASLt ×3 + silu, mul kernels",
            GateUp::Stacked => "cuBLASLt stacked gate/up, down + silu, mul",
            GateUp::StackedFused => "cuBLASLt stacked gate/up, silu·mul kernel, down: 3 launches",
        }
    }

    /// Whether gate and up are one cuBLASLt call over the stacked weights.
    fn stacked(self) -> bool {
        self != GateUp::Separate
    }
}

/// An FFN row of the bench: the block timed (Llama-3-8B's widths, D = 4096,
/// F = 14336) and the unfused chain it is timed against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FfnRow {
    /// `graphs/swiglu_ffn.toml`: SwiGLU, the down projection with its bias,
    /// the residual; against the chain [`GateUp`] names.
    SwigluFfn(GateUp),
    /// `graphs/ffn_sublayer.toml`: RMSNorm (eps 1e-5) first, then SwiGLU,
    /// the down projection without a bias, the residual x; against the
    /// norm kernel and the strongest chain ([`GateUp::StackedFused`]). The
    /// weaker chains are measured on the SwiGLU block, and the norm kernel
    /// would add the same to each.
    FfnSublayer,
}

impl FfnRow {
    /// Every FFN row the bench times: the SwiGLU block against each
    /// [`GateUp`] chain, then the sub-layer.
    pub const ALL: [FfnRow; 4] = [
        FfnRow::SwigluFfn(GateUp::Separate),
        FfnRow::SwigluFfn(GateUp::Stacked),
        FfnRow::SwigluFfn(GateUp::StackedFused),
        FfnRow::FfnSublayer,
    ];

    /// The block's graph: `--kernel NAME` selects every row of that name.
    pub fn name(self) -> &'static str {
        match self {
            FfnRow::SwigluFfn(_) => "swiglu_ffn",
            FfnRow::FfnSublayer => "ffn_sublayer",
        }
    }

    /// How the baseline computes the gate and up projections.
    pub fn gate_up(self) -> GateUp {
        match self {
            FfnRow::SwigluFfn(gate_up) => gate_up,
            FfnRow::FfnSublayer => GateUp::StackedFused,
        }
    }

    /// Whether the block normalises x before the projections (the
    /// residual is x itself either way).
    fn norm_first(self) -> bool {
        self == FfnRow::FfnSublayer
    }

    /// Whether the down projection adds a bias.
    fn down_bias(self) -> bool {
        matches!(self, FfnRow::SwigluFfn(_))
    }

    /// The baseline's label in the table.
    fn baseline(self) -> &'static str {
        match self {
            FfnRow::SwigluFfn(gate_up) => gate_up.baseline(),
            FfnRow::FfnSublayer => {
                "rmsnorm kernel, cuBLASLt stacked gate/up, silu·mul kernel, down: 4 launches"
            }
        }
    }
}

/// An FFN baseline's buffers (what its calls write) and plans.
struct FfnBaseline<T> {
    /// The normalised x `[M, D]` that the projections read, for a block
    /// that normalises first.
    normed: Option<Rotated<T>>,
    /// The gate projection `[M, F]`, then, when stacked, the up projection.
    gate_up: Rotated<T>,
    /// The up projection of the separate GEMM.
    up: Rotated<T>,
    /// silu(gate), between the separate silu and mul kernels.
    act: Rotated<T>,
    h: Rotated<T>,
    y: Rotated<T>,
    /// The gate and up GEMMs (one when stacked), then the down GEMM.
    lt: Vec<LtPair>,
}

/// The bound structs of an FFN row, one per input set.
enum FfnBound<'w, T: Element> {
    SwigluFfn(Vec<kernels::SwigluFfn<'w, T>>),
    FfnSublayer(Vec<kernels::FfnSublayer<'w, T>>),
}

/// Times an FFN row at M tokens: the block's struct against cuBLASLt GEMMs
/// with the row's unfused kernels between them.
pub fn bench_ffn<T: BenchElement>(
    stream: &Arc<CudaStream>,
    m: usize,
    row: FfnRow,
    plan: TimingPlan,
    head: &mut CudaSlice<u8>,
    host: bool,
) -> Result<Row> {
    let row = ffn_case::<T>(stream, m, row, Run::Timed { plan, head, host })?;
    Ok(row.expect("a timed case gives its row"))
}

/// [`bench_ffn`], or its part in `--streams`' measurements.
fn ffn_case<T: BenchElement>(
    stream: &Arc<CudaStream>,
    m: usize,
    row: FfnRow,
    run: Run<'_, '_>,
) -> Result<Option<Row>> {
    const D: usize = FFN_D;
    const F: usize = FFN_F;
    let gate_up = row.gate_up();
    let seed = m as u64 * 7 + 3;
    let scale = 1.0 / (D as f32).sqrt();
    let (w_gate_host, w_up_host) = (
        T::random(F * D, scale, seed + 1),
        T::random(F * D, scale, seed + 2),
    );
    let x = Rotated::<T>::random(stream, m * D, 1.0, seed)?;
    let w_gate = Rotated::from_host(stream, &w_gate_host)?;
    let w_up = Rotated::from_host(stream, &w_up_host)?;
    // The same weights, one after the other, for the stacked GEMM.
    let w_stacked = if gate_up.stacked() {
        Some(Rotated::from_host(stream, &[w_gate_host, w_up_host].concat())?)
    } else {
        None
    };
    let w_down = Rotated::<T>::random(stream, D * F, 1.0 / (F as f32).sqrt(), seed + 3)?;
    let b_down = row
        .down_bias()
        .then(|| Rotated::<T>::random(stream, D, 1.0, seed + 4))
        .transpose()?;
    let gamma = row
        .norm_first()
        .then(|| Rotated::<T>::random(stream, D, 1.0, seed + 5))
        .transpose()?;
    let mut ours_y = Rotated::<T>::zeros(stream, m * D)?;
    let plan_lt = |dims, epilogue| {
        LtPair::new(|candidates| {
            cublaslt::LtGemm::new(stream, T::DTYPE, WeightLayout::NK, dims, epilogue, candidates)
        })
    };
    let mut lt = if gate_up.stacked() {
        vec![LtPair::new(|candidates| {
            cublaslt::LtGemm::new_stacked(stream, T::DTYPE, WeightLayout::NK, (m, F, D), 2, candidates)
        })?]
    } else {
        vec![
            plan_lt((m, F, D), LtEpilogue::None)?,
            plan_lt((m, F, D), LtEpilogue::None)?,
        ]
    };
    // The residual rides on beta·C either way; the bias only where the
    // block has one.
    let down_epilogue = if row.down_bias() {
        LtEpilogue::Bias
    } else {
        LtEpilogue::None
    };
    lt.push(plan_lt((m, D, F), down_epilogue)?);
    let mut b = FfnBaseline {
        normed: row
            .norm_first()
            .then(|| Rotated::zeros(stream, m * D))
            .transpose()?,
        gate_up: Rotated::zeros(stream, 2 * m * F)?,
        up: Rotated::zeros(stream, m * F)?,
        act: Rotated::zeros(stream, m * F)?,
        h: Rotated::zeros(stream, m * F)?,
        y: Rotated::zeros(stream, m * D)?,
        lt,
    };
    // One struct per input set, bound to that set's weights (the sub-layer
    // folds gamma into its copy of the interleaved gate/up weight).
    let weights = |i: usize| -> Result<_> {
        Ok((
            mat(w_gate.get(i), F, D)?,
            mat(w_up.get(i), F, D)?,
            mat(w_down.get(i), D, F)?,
        ))
    };
    let mut bound = match row {
        FfnRow::SwigluFfn(_) => {
            let b_down = b_down.as_ref().expect("the SwiGLU block has a down bias");
            FfnBound::SwigluFfn(
                (0..SETS)
                    .map(|i| {
                        let (w_gate, w_up, w_down) = weights(i)?;
                        let b_down = vec_of(b_down.get(i), D)?;
                        let weights = kernels::SwigluFfnWeights {
                            w_gate,
                            w_up,
                            w_down,
                            b_down,
                        };
                        kernels::SwigluFfn::new(stream, weights)
                    })
                    .collect::<Result<_>>()?,
            )
        }
        FfnRow::FfnSublayer => {
            let gamma = gamma.as_ref().expect("the sub-layer has a norm");
            FfnBound::FfnSublayer(
                (0..SETS)
                    .map(|i| {
                        let (w_gate, w_up, w_down) = weights(i)?;
                        let gamma = vec_of(gamma.get(i), D)?;
                        let weights = kernels::FfnSublayerWeights {
                            gamma,
                            w_gate,
                            w_up,
                            w_down,
                        };
                        kernels::FfnSublayer::new(stream, weights)
                    })
                    .collect::<Result<_>>()?,
            )
        }
    };

    let mut ours = |ours_y: &mut Rotated<T>, i: usize| -> Result<()> {
        let x = mat(x.get(i), m, D)?;
        let mut y = TensorMut::new(ours_y.get_mut(i), [m, D])?;
        match &mut bound {
            FfnBound::SwigluFfn(ffns) => ffns[i % SETS].run(stream, &x, &mut y),
            FfnBound::FfnSublayer(sublayers) => sublayers[i % SETS].run(stream, &x, &mut y),
        }
    };
    // The standalone norm of the graph (its eps, 1e-5) on input set `i`.
    let normalise = |normed: &mut Rotated<T>, gamma: &Rotated<T>, i: usize| -> Result<()> {
        kernels::rmsnorm_eps1e5(
            stream,
            &mat(x.get(i), m, D)?,
            &vec_of(gamma.get(i), D)?,
            &mut TensorMut::new(normed.get_mut(i), [m, D])?,
        )
    };
    let baseline = |b: &mut FfnBaseline<T>, which: Which, i: usize| -> Result<()> {
        let FfnBaseline {
            normed,
            gate_up: gu,
            up,
            act,
            h,
            y,
            lt,
        } = b;
        if let (Some(normed), Some(gamma)) = (normed.as_mut(), &gamma) {
            normalise(normed, gamma, i)?;
        }
        // What the projections read: the normalised x, or x itself.
        let input = normed.as_ref().unwrap_or(&x).get(i);
        let (lt_down, lt_gate_up) = lt.split_last_mut().expect("the down GEMM is last");
        let up_half = match (lt_gate_up, &w_stacked) {
            ([lt_gate, lt_up], _) => {
                lt_gate
                    .get(which)
                    .run(stream, input, w_gate.get(i), None, None, gu.get_mut(i))?;
                lt_up
                    .get(which)
                    .run(stream, input, w_up.get(i), None, None, up.get_mut(i))?;
                up.get(i).slice(..)
            }
            ([lt_stacked], Some(w)) => {
                lt_stacked
                    .get(which)
                    .run(stream, input, w.get(i), None, None, gu.get_mut(i))?;
                gu.get(i).slice(m * F..)
            }
            _ => unreachable!("one stacked GEMM with its weight, or two"),
        };
        let gate = Tensor::from_view(gu.get(i).slice(..m * F), [m, F])?;
        let up_half = Tensor::from_view(up_half, [m, F])?;
        if gate_up == GateUp::StackedFused {
            kernels::silu_mul(
                stream,
                &gate,
                &up_half,
                &mut TensorMut::new(h.get_mut(i), [m, F])?,
            )?;
        } else {
            kernels::silu(stream, &gate, &mut TensorMut::new(act.get_mut(i), [m, F])?)?;
            kernels::mul(
                stream,
                &mat(act.get(i), m, F)?,
                &up_half,
                &mut TensorMut::new(h.get_mut(i), [m, F])?,
            )?;
        }
        lt_down.get(which).run(
            stream,
            h.get(i),
            w_down.get(i),
            b_down.as_ref().map(|b| b.get(i)),
            Some(x.get(i)),
            y.get_mut(i),
        )
    };
    let (plan, head, host) = match run {
        Run::Timed { plan, head, host } => (plan, head, host),
        Run::Streams(part) => {
            take_part(
                part,
                (ours_y, b),
                |(y, _), i| ours(y, i),
                |(_, b), i| baseline(b, Which::First, i),
            );
            return Ok(None);
        }
    };
    ours(&mut ours_y, 0)?;
    baseline(&mut b, Which::First, 0)?;
    stream.synchronize()?;
    let agreement = check_agreement(stream, ours_y.get(0), b.y.get(0), row.name(), format!("M={m}"))?;
    {
        // Each GEMM alone. The projections read the normalised x of every
        // set (set 0's is the agreement check's), so that their candidates
        // are timed on the data the baseline gives them. The down
        // projection reads what the gate GEMM's candidates left in
        // `gate_up`: products of the real inputs, so that its candidates
        // are compared on outputs that are not just the bias and the
        // residual.
        let FfnBaseline {
            normed,
            gate_up: gu,
            up,
            y,
            lt,
            ..
        } = &mut b;
        if let (Some(normed), Some(gamma)) = (normed.as_mut(), &gamma) {
            for i in 1..SETS {
                normalise(normed, gamma, i)?;
            }
        }
        let input = normed.as_ref().unwrap_or(&x);
        let (lt_down, lt_gate_up) = lt.split_last_mut().expect("the down GEMM is last");
        let mut projections: Vec<(&mut LtPair, &mut Rotated<T>, &Rotated<T>)> = match (lt_gate_up, &w_stacked)
        {
            ([lt_gate, lt_up], _) => vec![(lt_gate, &mut *gu, &w_gate), (lt_up, up, &w_up)],
            ([lt_stacked], Some(w)) => vec![(lt_stacked, &mut *gu, w)],
            _ => unreachable!("one stacked GEMM with its weight, or two"),
        };
        for (lt, out, w) in projections.iter_mut() {
            lt.tune(
                stream,
                out,
                || head_start(stream, head),
                |g, out, i| g.run(stream, input.get(i), w.get(i), None, None, out),
            )?;
        }
        drop(projections);
        lt_down.tune(
            stream,
            y,
            || head_start(stream, head),
            |g, out, i| {
                g.run(
                    stream,
                    gu.get(i),
                    w_down.get(i),
                    b_down.as_ref().map(|b| b.get(i)),
                    Some(x.get(i)),
                    out,
                )
            },
        )?;
    }
    let b = RefCell::new(b);
    let [ours_t, first_t, best_t] = time_interleaved(
        stream,
        plan,
        || head_start(stream, head),
        [
            &mut |i| ours(&mut ours_y, i),
            &mut |i| baseline(&mut b.borrow_mut(), Which::First, i),
            &mut |i| baseline(&mut b.borrow_mut(), Which::Best, i),
        ],
    )?;
    let names: &[&str] = if gate_up.stacked() {
        &["gate_up", "down"]
    } else {
        &["gate", "up", "down"]
    };
    let algorithms = b
        .borrow()
        .lt
        .iter()
        .zip(names)
        .map(|(lt, name)| lt.choice(name))
        .collect::<Result<_>>()?;
    let host = if host {
        let launches = match row {
            FfnRow::SwigluFfn(_) => kernels::SwigluFfn::<T>::PLAN.kernels.len(),
            FfnRow::FfnSublayer => kernels::FfnSublayer::<T>::PLAN.kernels.len(),
        };
        Some(host::measure(
            stream,
            head,
            launches,
            &mut |i| ours(&mut ours_y, i),
            // The down projection alone: one cublasLtMatmul.
            &mut |i| {
                let b = &mut *b.borrow_mut();
                let (lt_down, y) = (b.lt.last_mut().expect("the down GEMM is last"), &mut b.y);
                lt_down.get(Which::First).run(
                    stream,
                    b.gate_up.get(i),
                    w_down.get(i),
                    b_down.as_ref().map(|b| b.get(i)),
                    Some(x.get(i)),
                    y.get_mut(i),
                )
            },
        )?)
    } else {
        None
    };
    let mut timed = Row::new(
        row.name(),
        format!("M={m} D={D} F={F}"),
        T::DTYPE,
        row.baseline().into(),
        2.0 * 3.0 * (m * D * F) as f64,
        Measured {
            ours: ours_t,
            first: first_t,
            best: best_t,
            agreement,
            algorithms,
        },
    );
    timed.host = host;
    Ok(Some(timed))
}

/// Runs every case of `config`, reporting progress through `progress(done,
/// total, label)`; each row gets the SM clock `clock` sampled while it was
/// measured, and its floor at the run's copy bandwidth `copy` (with its
/// ceiling, a copy of its bytes timed after it: `floor`).
pub fn run<T: BenchElement>(
    stream: &Arc<CudaStream>,
    config: &BenchConfig,
    copy: &floor::CopyBandwidth,
    clock: Option<&smi::ClockSampler>,
    mut progress: impl FnMut(usize, usize, &str),
) -> Result<Vec<Row>> {
    let gemm_cases = config.gemm_cases();
    let ffn_cases = config.ffn_cases();
    let norm_cases = config.norm_cases();
    let total = gemm_cases.len() + ffn_cases.len() + norm_cases.len();
    let element = std::mem::size_of::<T>();
    let mut head = stream.alloc_zeros::<u8>(HEAD_START_BYTES)?;
    let mut rows = Vec::with_capacity(total);
    let mut measure =
        |label: &str, bytes: f64, case: &mut dyn FnMut(&mut CudaSlice<u8>) -> Result<Row>| -> Result<()> {
            progress(rows.len(), total, label);
            let from = Instant::now();
            let mut row = case(&mut head)?;
            row.sm_clock = clock.and_then(|c| c.between(from, Instant::now()));
            let ceiling = floor::measure_ceiling(stream, bytes, config.timing)?;
            row.floor = Some(floor::Floor::new(bytes, copy, row.ours_us).with_ceiling(ceiling, row.ours_us));
            rows.push(row);
            Ok(())
        };
    // With --streams, the row's case again on that many streams at once.
    let with_streams = |head: &mut CudaSlice<u8>,
                        mut row: Row,
                        case: &(dyn Fn(&streams::Part<'_>) -> Result<Option<Row>> + Sync)|
     -> Result<Row> {
        if let Some(n) = config.streams {
            let concurrency =
                streams::measure(stream, head, n, config.timing, clock, |part| case(part).map(drop))?;
            row.concurrency = Some(concurrency);
        }
        Ok(row)
    };
    for (pattern, shape) in gemm_cases {
        let bytes = floor::gemm_bytes(pattern, shape, element);
        measure(&format!("{} {shape:?}", pattern.name()), bytes, &mut |head| {
            let row = bench_pattern::<T>(stream, pattern, shape, config.timing, head, config.host)?;
            with_streams(head, row, &|part| {
                pattern_case::<T>(part.stream(), pattern, shape, Run::Streams(part))
            })
        })?;
    }
    for (row, m) in ffn_cases {
        let bytes = floor::ffn_bytes(row, m, FFN_D, FFN_F, element);
        let label = format!("{} M={m} ({:?})", row.name(), row.gate_up());
        measure(&label, bytes, &mut |head| {
            let timed = bench_ffn::<T>(stream, m, row, config.timing, head, config.host)?;
            with_streams(head, timed, &|part| {
                ffn_case::<T>(part.stream(), m, row, Run::Streams(part))
            })
        })?;
    }
    // Norm rows have no --streams measurement: their baseline is a copy.
    for (norm, shape) in norm_cases {
        let bytes = floor::norm_bytes(norm, shape, element);
        measure(&format!("{} {shape:?}", norm.name()), bytes, &mut |head| {
            bench_norm::<T>(stream, norm, shape, config.timing, head)
        })?;
    }
    progress(rows.len(), total, "done");
    Ok(rows)
}

/// A standalone norm of the built-in library (`graphs/layernorm.toml`,
/// `graphs/rmsnorm.toml`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NormRow {
    /// `graphs/layernorm.toml`.
    LayerNorm,
    /// `graphs/rmsnorm.toml`.
    RmsNorm,
}

impl NormRow {
    /// The graph's name, as `--kernel` names it.
    pub fn name(self) -> &'static str {
        match self {
            NormRow::LayerNorm => "layernorm",
            NormRow::RmsNorm => "rmsnorm",
        }
    }

    /// The `[K]` vectors it reads besides x: gamma, and LayerNorm's beta.
    pub fn vectors(self) -> usize {
        match self {
            NormRow::LayerNorm => 2,
            NormRow::RmsNorm => 1,
        }
    }
}

/// Times a standalone norm at (M, K) against one device copy of x into y
/// (the same bytes read and written, bar gamma and beta): ratio = the
/// copy's time over ours, so 1 is the norm at copy speed. Both baselines
/// are that copy. Before timing, ours is checked against the CPU reference
/// on sampled rows of input set 0.
pub fn bench_norm<T: BenchElement>(
    stream: &Arc<CudaStream>,
    norm: NormRow,
    (m, k): (usize, usize),
    plan: TimingPlan,
    head: &mut CudaSlice<u8>,
) -> Result<Row> {
    let seed = (m * 13 + k) as u64;
    let x_host = T::random(m * k, 1.0, seed);
    let x = Rotated::<T>::from_host(stream, &x_host)?;
    let gamma_host = T::random(k, 1.0, seed + 1);
    let beta_host = T::random(k, 1.0, seed + 2);
    let (gamma, beta) = (stream.clone_htod(&gamma_host)?, stream.clone_htod(&beta_host)?);
    let mut ours_y = Rotated::<T>::zeros(stream, m * k)?;
    let mut copy_y = Rotated::<T>::zeros(stream, m * k)?;
    let g = vec_of(&gamma, k)?;
    let b = vec_of(&beta, k)?;
    let ours = |y: &mut Rotated<T>, i: usize| -> Result<()> {
        let xi = mat(x.get(i), m, k)?;
        let mut yi = TensorMut::new(y.get_mut(i), [m, k])?;
        match norm {
            NormRow::LayerNorm => kernels::layernorm(stream, &xi, &g, &b, &mut yi),
            NormRow::RmsNorm => kernels::rmsnorm(stream, &xi, &g, &mut yi),
        }
    };
    ours(&mut ours_y, 0)?;
    let agreement = check_norm::<T>(
        stream,
        norm,
        (m, k),
        [&x_host, &gamma_host, &beta_host],
        ours_y.get(0),
    )?;
    let copy =
        |y: &mut Rotated<T>, i: usize| -> Result<()> { Ok(stream.memcpy_dtod(x.get(i), y.get_mut(i))?) };
    let (ours_y, copy_y) = (RefCell::new(ours_y), RefCell::new(&mut copy_y));
    let [ours_t, copy_t, again_t] = time_interleaved(
        stream,
        plan,
        || head_start(stream, head),
        [
            &mut |i| ours(&mut ours_y.borrow_mut(), i),
            &mut |i| copy(&mut copy_y.borrow_mut(), i),
            &mut |i| copy(&mut copy_y.borrow_mut(), i),
        ],
    )?;
    Ok(Row::new(
        norm.name(),
        format!("{m},{k}"),
        T::DTYPE,
        "device copy of x into y".into(),
        0.0,
        Measured {
            ours: ours_t,
            first: copy_t,
            best: again_t,
            agreement,
            algorithms: Vec::new(),
        },
    ))
}

/// ‖ours − reference‖ / ‖reference‖ over sampled rows of a norm's output,
/// the reference evaluating the norm's graph on the CPU from the same host
/// inputs (x, gamma, beta); an error where it exceeds the dtype's limit.
fn check_norm<T: BenchElement>(
    stream: &Arc<CudaStream>,
    norm: NormRow,
    (m, k): (usize, usize),
    [x, gamma, beta]: [&[T]; 3],
    ours: &CudaSlice<T>,
) -> Result<f64> {
    use fusion_compiler::reference::{self, HostTensor};
    let graph = match norm {
        NormRow::LayerNorm => kernels::Layernorm::<T>::graph(),
        NormRow::RmsNorm => kernels::Rmsnorm::<T>::graph(),
    };
    let host = |shape: &[usize], values: &[T]| {
        HostTensor::new(shape, values.iter().map(|v| v.to_f64()).collect()).expect("a shape of its length")
    };
    let mut bindings = reference::Bindings::new();
    bindings.insert("x".into(), host(&[m, k], x));
    bindings.insert("g".into(), host(&[k], gamma));
    if norm == NormRow::LayerNorm {
        bindings.insert("b".into(), host(&[k], beta));
    }
    let mut rows = vec![0, m / 2, m - 1];
    rows.dedup();
    let want = reference::evaluate_rows(&graph, &bindings, &rows)
        .expect("the norm's graph evaluates on its own tensors");
    let want = &want["y"];
    let got = stream.clone_dtoh(ours)?;
    let (mut diff, mut norm_sq) = (0.0f64, 0.0f64);
    for (i, &row) in rows.iter().enumerate() {
        for c in 0..k {
            let (g, w) = (got[row * k + c].to_f64(), want.data[i * k + c]);
            diff += (g - w) * (g - w);
            norm_sq += w * w;
        }
    }
    let relative = (diff / norm_sq).sqrt();
    if relative.is_nan() || relative > agreement_limit(T::DTYPE) {
        return Err(Error::BenchDisagreement {
            kernel: norm.name().into(),
            shape: format!("{m},{k}"),
            relative,
        });
    }
    Ok(relative)
}
