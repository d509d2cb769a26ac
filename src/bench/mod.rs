//! `fusion bench`: each fused kernel of the built-in library against the best
//! vendor path, timed in one process on the same inputs.
//!
//! The vendor path is cuBLASLt with its fused epilogue where one exists
//! (GELU_BIAS, RELU_BIAS, BIAS, GELU; a residual add rides on cuBLASLt's
//! `beta·C` term), else cuBLASLt followed by the standalone elementwise and
//! norm kernels of the same library. Both sides read the same random inputs,
//! rotate over four copies of them each so that L2 does not flatter either,
//! and are timed with CUDA events, alternating call by call (warm-up, then
//! the median). Before timing, the two
//! outputs are compared: a fast wrong kernel is reported, not timed.

pub mod cublaslt;
pub mod timing;

use crate::error::{Error, Result};
use crate::ir::{DType, WeightLayout};
use crate::kernels;
use crate::tensor::{Element, Tensor, TensorMut};
use cublaslt::{LtEpilogue, LtGemm};
use cudarc::driver::{CudaSlice, CudaStream};
use serde::Serialize;
use std::sync::Arc;
use timing::{Timing, TimingPlan, time_interleaved};

/// Input sets rotated between calls: even for ours, odd for the baseline
/// (`timing::time_interleaved`), four each.
const SETS: usize = 8;

/// The shapes of `fusion bench` when none are given: (M, N, K).
pub const DEFAULT_SHAPES: [(usize, usize, usize); 6] = [
    (512, 2048, 2048),
    (4096, 4096, 4096),
    (8192, 8192, 8192),
    (8192, 14336, 4096),
    (8192, 4096, 14336),
    (128, 14336, 4096),
];

/// Token counts for the SwiGLU FFN (Llama-3-8B sizes).
pub const DEFAULT_FFN_TOKENS: [usize; 2] = [128, 8192];

/// A single-GEMM pattern of the built-in library.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Pattern {
    /// The bare GEMM: the mainloop alone, against cuBLASLt without an epilogue.
    Gemm,
    GemmBiasGelu,
    GemmBiasRelu,
    GemmBias,
    GemmBiasSilu,
    GemmBiasResidual,
    GemmGelu,
    GemmSilu,
    LayernormGemm,
    RmsnormGemm,
}

impl Pattern {
    pub const ALL: [Pattern; 10] = [
        Pattern::Gemm,
        Pattern::GemmBiasGelu,
        Pattern::GemmBiasRelu,
        Pattern::GemmBias,
        Pattern::GemmBiasSilu,
        Pattern::GemmBiasResidual,
        Pattern::GemmGelu,
        Pattern::GemmSilu,
        Pattern::LayernormGemm,
        Pattern::RmsnormGemm,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Pattern::Gemm => "gemm",
            Pattern::GemmBiasGelu => "gemm_bias_gelu",
            Pattern::GemmBiasRelu => "gemm_bias_relu",
            Pattern::GemmBias => "gemm_bias",
            Pattern::GemmBiasSilu => "gemm_bias_silu",
            Pattern::GemmBiasResidual => "gemm_bias_residual",
            Pattern::GemmGelu => "gemm_gelu",
            Pattern::GemmSilu => "gemm_silu",
            Pattern::LayernormGemm => "layernorm_gemm",
            Pattern::RmsnormGemm => "rmsnorm_gemm",
        }
    }

    /// The weight layout of the shipped graph (`graphs/<name>.toml`).
    fn layout(self) -> WeightLayout {
        match self {
            Pattern::GemmBiasSilu | Pattern::GemmSilu => WeightLayout::KN,
            _ => WeightLayout::NK,
        }
    }

    /// The cuBLASLt epilogue of the baseline, and the unfused step after it.
    fn baseline(self) -> (LtEpilogue, &'static str) {
        match self {
            Pattern::Gemm => (LtEpilogue::None, ""),
            Pattern::GemmBiasGelu => (LtEpilogue::GeluBias, ""),
            Pattern::GemmBiasRelu => (LtEpilogue::ReluBias, ""),
            Pattern::GemmBias => (LtEpilogue::Bias, ""),
            Pattern::GemmBiasResidual => (LtEpilogue::Bias, " + beta·C"),
            Pattern::GemmGelu => (LtEpilogue::Gelu, ""),
            Pattern::GemmBiasSilu => (LtEpilogue::Bias, " + silu kernel"),
            Pattern::GemmSilu => (LtEpilogue::None, " + silu kernel"),
            Pattern::LayernormGemm => (LtEpilogue::None, " after layernorm kernel"),
            Pattern::RmsnormGemm => (LtEpilogue::None, " after rmsnorm kernel"),
        }
    }

    pub fn parse(name: &str) -> Option<Pattern> {
        Pattern::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// One line of the table.
#[derive(Clone, Debug, Serialize)]
pub struct Row {
    pub kernel: String,
    pub shape: String,
    pub dtype: String,
    pub baseline: String,
    pub ours_us: f64,
    pub baseline_us: f64,
    /// Baseline time over ours: above 1, fusion is faster.
    pub ratio: f64,
    pub ours_tflops: f64,
    pub baseline_tflops: f64,
    /// ‖ours − baseline‖ / ‖baseline‖ on the same inputs.
    pub agreement: f64,
}

/// What one case measured.
struct Measured {
    ours: Timing,
    base: Timing,
    agreement: f64,
}

impl Row {
    fn new(kernel: &str, shape: String, dtype: DType, baseline: String, flop: f64, m: Measured) -> Row {
        Row {
            kernel: kernel.to_string(),
            shape,
            dtype: dtype.to_string(),
            baseline,
            ours_us: m.ours.median_us,
            baseline_us: m.base.median_us,
            ratio: m.base.median_us / m.ours.median_us,
            ours_tflops: flop / m.ours.median_us / 1e6,
            baseline_tflops: flop / m.base.median_us / 1e6,
            agreement: m.agreement,
        }
    }
}

/// Formats rows as an aligned text table.
pub fn table(rows: &[Row]) -> String {
    let mut out = format!(
        "{:<20} {:<18} {:<5} {:<38} {:>10} {:>10} {:>6} {:>8} {:>8}\n",
        "kernel", "shape (M,N,K)", "dtype", "baseline", "ours µs", "base µs", "ratio", "ours TF", "base TF"
    );
    for r in rows {
        out.push_str(&format!(
            "{:<20} {:<18} {:<5} {:<38} {:>10.1} {:>10.1} {:>6.3} {:>8.1} {:>8.1}\n",
            r.kernel,
            r.shape,
            r.dtype,
            r.baseline,
            r.ours_us,
            r.baseline_us,
            r.ratio,
            r.ours_tflops,
            r.baseline_tflops
        ));
    }
    out.push_str("ratio = baseline time / ours (above 1: fusion is faster); median of timed calls\n");
    out
}

/// Random device data, the same in every rotated set (contents do not
/// matter for L2; addresses do).
struct Rotated<T> {
    sets: Vec<CudaSlice<T>>,
}

impl<T: BenchElement> Rotated<T> {
    fn random(stream: &Arc<CudaStream>, len: usize, scale: f32, seed: u64) -> Result<Rotated<T>> {
        let host = T::random(len, scale, seed);
        let sets = (0..SETS)
            .map(|_| stream.clone_htod(&host))
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
    fn random(len: usize, scale: f32, seed: u64) -> Vec<Self>;
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

fn agreement<T: BenchElement>(
    stream: &Arc<CudaStream>,
    ours: &CudaSlice<T>,
    base: &CudaSlice<T>,
) -> Result<f64> {
    let (a, b) = (stream.clone_dtoh(ours)?, stream.clone_dtoh(base)?);
    let (mut diff, mut norm) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(&b) {
        let (x, y) = (x.to_f64(), y.to_f64());
        if !x.is_finite() {
            return Ok(f64::INFINITY);
        }
        diff += (x - y) * (x - y);
        norm += y * y;
    }
    Ok((diff / norm.max(f64::MIN_POSITIVE)).sqrt())
}

/// Outputs that disagree by more than this are reported as failures.
const AGREEMENT: f64 = 1e-2;

/// Device time of ≥ a few milliseconds queued before the timed calls.
fn head_start(stream: &Arc<CudaStream>, scratch: &mut CudaSlice<u8>) -> Result<()> {
    for _ in 0..16 {
        stream.memset_zeros(scratch)?;
    }
    Ok(())
}

/// Settings of one bench run.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    pub shapes: Vec<(usize, usize, usize)>,
    pub ffn_tokens: Vec<usize>,
    pub patterns: Vec<Pattern>,
    pub timing: TimingPlan,
}

impl Default for BenchConfig {
    fn default() -> Self {
        BenchConfig {
            shapes: DEFAULT_SHAPES.to_vec(),
            ffn_tokens: DEFAULT_FFN_TOKENS.to_vec(),
            patterns: Pattern::ALL.to_vec(),
            timing: TimingPlan::default(),
        }
    }
}

/// A norm GEMM's weights, for the structs that bind them.
struct NormWeights<T> {
    w: Rotated<T>,
    gamma: Rotated<T>,
    beta: Rotated<T>,
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

/// Times one pattern at one shape.
pub fn bench_pattern<T: BenchElement>(
    stream: &Arc<CudaStream>,
    pattern: Pattern,
    (m, n, k): (usize, usize, usize),
    plan: TimingPlan,
    head: &mut CudaSlice<u8>,
) -> Result<Row> {
    let seed = (m * 31 + n * 17 + k) as u64;
    let mut c = GemmCase::<T> {
        x: Rotated::random(stream, m * k, 1.0, seed)?,
        w: Rotated::random(stream, n * k, 1.0 / (k as f32).sqrt(), seed + 1)?,
        bias: Rotated::random(stream, n, 1.0, seed + 2)?,
        residual: Rotated::random(stream, m * n, 1.0, seed + 3)?,
        gamma: Rotated::random(stream, k, 1.0, seed + 4)?,
        beta: Rotated::random(stream, k, 1.0, seed + 5)?,
        ours: Rotated::zeros(stream, m * n)?,
        base: Rotated::zeros(stream, m * n)?,
        scratch: Rotated::zeros(stream, m * n.max(k))?,
    };
    let (epilogue, unfused) = pattern.baseline();
    let mut lt = LtGemm::new(stream, T::DTYPE, pattern.layout(), (m, n, k), epilogue)?;
    let w_shape = match pattern.layout() {
        WeightLayout::NK => [n, k],
        WeightLayout::KN => [k, n],
    };
    // The norm GEMMs run as a model runs them: one struct per input set,
    // bound to that set's weights, which it folds into its own copy of w.
    // Bound to equal copies (same seeds), since the case's own buffers are
    // borrowed mutably below.
    let is_norm = matches!(pattern, Pattern::LayernormGemm | Pattern::RmsnormGemm);
    let norm_weights = NormWeights::<T> {
        w: Rotated::random(
            stream,
            if is_norm { n * k } else { 0 },
            1.0 / (k as f32).sqrt(),
            seed + 1,
        )?,
        gamma: Rotated::random(stream, if is_norm { k } else { 0 }, 1.0, seed + 4)?,
        beta: Rotated::random(stream, if is_norm { k } else { 0 }, 1.0, seed + 5)?,
    };
    let mut layernorm_gemms = Vec::new();
    let mut rmsnorm_gemms = Vec::new();
    for i in (0..SETS).filter(|_| is_norm) {
        let (w, g, be) = (
            Tensor::new(norm_weights.w.get(i), w_shape)?,
            vec_of(norm_weights.gamma.get(i), k)?,
            vec_of(norm_weights.beta.get(i), k)?,
        );
        match pattern {
            Pattern::LayernormGemm => layernorm_gemms.push(kernels::LayernormGemm::new(
                stream,
                kernels::LayernormGemmWeights { g, b: be, w },
            )?),
            Pattern::RmsnormGemm => rmsnorm_gemms.push(kernels::RmsnormGemm::new(
                stream,
                kernels::RmsnormGemmWeights { g, w },
            )?),
            _ => {}
        }
    }

    let mut ours = |c: &mut GemmCase<T>, i: usize| -> Result<()> {
        let (x, w, b) = (
            mat(c.x.get(i), m, k)?,
            Tensor::new(c.w.get(i), w_shape)?,
            vec_of(c.bias.get(i), n)?,
        );
        let r = mat(c.residual.get(i), m, n)?;
        let mut y = TensorMut::new(c.ours.get_mut(i), [m, n])?;
        match pattern {
            Pattern::Gemm => kernels::gemm(stream, &x, &w, &mut y),
            Pattern::GemmBiasGelu => kernels::gemm_bias_gelu(stream, &x, &w, &b, &mut y),
            Pattern::GemmBiasRelu => kernels::gemm_bias_relu(stream, &x, &w, &b, &mut y),
            Pattern::GemmBias => kernels::gemm_bias(stream, &x, &w, &b, &mut y),
            Pattern::GemmBiasSilu => kernels::gemm_bias_silu(stream, &x, &w, &b, &mut y),
            Pattern::GemmBiasResidual => kernels::gemm_bias_residual(stream, &x, &r, &w, &b, &mut y),
            Pattern::GemmGelu => kernels::gemm_gelu(stream, &x, &w, &mut y),
            Pattern::GemmSilu => kernels::gemm_silu(stream, &x, &w, &mut y),
            Pattern::LayernormGemm => layernorm_gemms[i % SETS].run(stream, &x, &mut y),
            Pattern::RmsnormGemm => rmsnorm_gemms[i % SETS].run(stream, &x, &mut y),
        }
    };
    let mut baseline = |c: &mut GemmCase<T>, i: usize| -> Result<()> {
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
        let bias = Some(bias.get(i)).filter(|_| epilogue != LtEpilogue::None && epilogue != LtEpilogue::Gelu);
        match pattern {
            Pattern::GemmBiasSilu | Pattern::GemmSilu => {
                lt.run(stream, x.get(i), w.get(i), bias, None, scratch.get_mut(i))?;
                let t = Tensor::from_view(scratch.get(i).slice(..m * n), [m, n])?;
                kernels::silu(stream, &t, &mut TensorMut::new(base.get_mut(i), [m, n])?)
            }
            Pattern::LayernormGemm | Pattern::RmsnormGemm => {
                {
                    let xi = mat(x.get(i), m, k)?;
                    let g = vec_of(gamma.get(i), k)?;
                    let mut normed = TensorMut::from_view(scratch.get_mut(i).slice_mut(..m * k), [m, k])?;
                    if pattern == Pattern::LayernormGemm {
                        kernels::layernorm(stream, &xi, &g, &vec_of(beta.get(i), k)?, &mut normed)?;
                    } else {
                        kernels::rmsnorm(stream, &xi, &g, &mut normed)?;
                    }
                }
                lt.run(stream, scratch.get(i), w.get(i), None, None, base.get_mut(i))
            }
            Pattern::GemmBiasResidual => lt.run(
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

    // Same inputs (set 0), then compare before timing anything.
    ours(&mut c, 0)?;
    baseline(&mut c, 0)?;
    stream.synchronize()?;
    let agree = agreement(stream, c.ours.get(0), c.base.get(0))?;
    if agree.is_nan() || agree > AGREEMENT {
        return Err(Error::BenchDisagreement {
            kernel: pattern.name().into(),
            shape: format!("{m},{n},{k}"),
            relative: agree,
        });
    }
    // Both closures borrow the case mutably (their outputs), one at a time.
    let c = std::cell::RefCell::new(c);
    let (t_ours, t_base) = time_interleaved(
        stream,
        plan,
        || head_start(stream, head),
        |i| ours(&mut c.borrow_mut(), i),
        |i| baseline(&mut c.borrow_mut(), i),
    )?;
    Ok(Row::new(
        pattern.name(),
        format!("{m},{n},{k}"),
        T::DTYPE,
        format!("{}{unfused}", epilogue.name()),
        2.0 * (m * n * k) as f64,
        Measured {
            ours: t_ours,
            base: t_base,
            agreement: agree,
        },
    ))
}

/// Times the SwiGLU FFN block (Llama-3-8B: D = 4096, F = 14336) at M tokens
/// against cuBLASLt GEMMs with the silu and mul kernels between them.
pub fn bench_ffn<T: BenchElement>(
    stream: &Arc<CudaStream>,
    m: usize,
    plan: TimingPlan,
    head: &mut CudaSlice<u8>,
) -> Result<Row> {
    const D: usize = 4096;
    const F: usize = 14336;
    let seed = m as u64 * 7 + 3;
    let x = Rotated::<T>::random(stream, m * D, 1.0, seed)?;
    let w_gate = Rotated::<T>::random(stream, F * D, 1.0 / (D as f32).sqrt(), seed + 1)?;
    let w_up = Rotated::<T>::random(stream, F * D, 1.0 / (D as f32).sqrt(), seed + 2)?;
    let w_down = Rotated::<T>::random(stream, D * F, 1.0 / (F as f32).sqrt(), seed + 3)?;
    let b_down = Rotated::<T>::random(stream, D, 1.0, seed + 4)?;
    let mut ours_y = Rotated::<T>::zeros(stream, m * D)?;
    let mut base_y = Rotated::<T>::zeros(stream, m * D)?;
    let mut gate = Rotated::<T>::zeros(stream, m * F)?;
    let mut up = Rotated::<T>::zeros(stream, m * F)?;
    let mut act = Rotated::<T>::zeros(stream, m * F)?;
    // One struct per input set, bound to that set's weights.
    let mut ffns = (0..SETS)
        .map(|i| {
            let weights = kernels::SwigluFfnWeights {
                w_gate: mat(w_gate.get(i), F, D)?,
                w_up: mat(w_up.get(i), F, D)?,
                w_down: mat(w_down.get(i), D, F)?,
                b_down: vec_of(b_down.get(i), D)?,
            };
            kernels::SwigluFfn::new(stream, weights)
        })
        .collect::<Result<Vec<_>>>()?;
    let mut lt_gate = LtGemm::new(stream, T::DTYPE, WeightLayout::NK, (m, F, D), LtEpilogue::None)?;
    let mut lt_up = LtGemm::new(stream, T::DTYPE, WeightLayout::NK, (m, F, D), LtEpilogue::None)?;
    let mut lt_down = LtGemm::new(stream, T::DTYPE, WeightLayout::NK, (m, D, F), LtEpilogue::Bias)?;

    let mut ours = |ours_y: &mut Rotated<T>, i: usize| -> Result<()> {
        ffns[i % SETS].run(
            stream,
            &mat(x.get(i), m, D)?,
            &mut TensorMut::new(ours_y.get_mut(i), [m, D])?,
        )
    };
    let mut baseline = |base_y: &mut Rotated<T>, i: usize| -> Result<()> {
        lt_gate.run(stream, x.get(i), w_gate.get(i), None, None, gate.get_mut(i))?;
        kernels::silu(
            stream,
            &mat(gate.get(i), m, F)?,
            &mut TensorMut::new(act.get_mut(i), [m, F])?,
        )?;
        lt_up.run(stream, x.get(i), w_up.get(i), None, None, up.get_mut(i))?;
        kernels::mul(
            stream,
            &mat(act.get(i), m, F)?,
            &mat(up.get(i), m, F)?,
            &mut TensorMut::new(gate.get_mut(i), [m, F])?,
        )?;
        lt_down.run(
            stream,
            gate.get(i),
            w_down.get(i),
            Some(b_down.get(i)),
            Some(x.get(i)),
            base_y.get_mut(i),
        )
    };
    ours(&mut ours_y, 0)?;
    baseline(&mut base_y, 0)?;
    stream.synchronize()?;
    let agree = agreement(stream, ours_y.get(0), base_y.get(0))?;
    if agree.is_nan() || agree > AGREEMENT {
        return Err(Error::BenchDisagreement {
            kernel: "swiglu_ffn".into(),
            shape: format!("M={m}"),
            relative: agree,
        });
    }
    let (t_ours, t_base) = time_interleaved(
        stream,
        plan,
        || head_start(stream, head),
        |i| ours(&mut ours_y, i),
        |i| baseline(&mut base_y, i),
    )?;
    Ok(Row::new(
        "swiglu_ffn",
        format!("M={m} D={D} F={F}"),
        T::DTYPE,
        "cuBLASLt ×3 + silu, mul kernels".into(),
        2.0 * 3.0 * (m * D * F) as f64,
        Measured {
            ours: t_ours,
            base: t_base,
            agreement: agree,
        },
    ))
}

/// Runs every case of `config`, reporting progress through `progress(done,
/// total, label)`.
pub fn run<T: BenchElement>(
    stream: &Arc<CudaStream>,
    config: &BenchConfig,
    mut progress: impl FnMut(usize, usize, &str),
) -> Result<Vec<Row>> {
    let total = config.patterns.len() * config.shapes.len() + config.ffn_tokens.len();
    let mut head = stream.alloc_zeros::<u8>(256 << 20)?;
    let mut rows = Vec::with_capacity(total);
    let mut done = 0;
    for &shape in &config.shapes {
        for &pattern in &config.patterns {
            progress(done, total, &format!("{} {shape:?}", pattern.name()));
            rows.push(bench_pattern::<T>(
                stream,
                pattern,
                shape,
                config.timing,
                &mut head,
            )?);
            done += 1;
        }
    }
    for &m in &config.ffn_tokens {
        progress(done, total, &format!("swiglu_ffn M={m}"));
        rows.push(bench_ffn::<T>(stream, m, config.timing, &mut head)?);
        done += 1;
    }
    progress(done, total, "done");
    Ok(rows)
}
