//! What the GPU tests share: device set-up, random inputs shared with the
//! CPU reference, poisoned outputs, and the comparison.
//!
//! Environment:
//! - `FUSION_TEST_SEED`: replay a run (the seed is printed by every test);
//! - `FUSION_TEST_SIZE=quick`: ragged shapes and one mid-size shape only
//!   (for the PTX variants); `tiny`: M in {1, 77}, N and K in {8, 136}, and
//!   the decode kernel's wide shape (for the sanitizers); default `full` adds the benchmark shapes;
//! - `FUSION_FORCE_ARCH`: run another compiled variant (see `fusion::device`);
//! - `FUSION_GRAPHS_DIR`: where `graphs/*.toml` are, when the test binary
//!   runs away from its checkout.

#![allow(dead_code)]

use fusion::core::ir::{DType, Graph};
use fusion::core::reference::{self, Bindings, HostTensor, Intermediates};
use fusion::cudarc::driver::{CudaSlice, CudaStream};
use fusion::testing;
use fusion::{Element, Tensor, TensorMut};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// The element types the tests run; see `fusion::testing`.
pub use fusion::testing::HostElement as TestElement;

pub fn quick() -> bool {
    std::env::var("FUSION_TEST_SIZE").is_ok_and(|v| matches!(v.as_str(), "quick" | "tiny" | "tiny-no-wrap"))
}

/// Ragged shapes only, smallest first: for the sanitizers, which slow
/// kernels down by orders of magnitude.
pub fn tiny() -> bool {
    std::env::var("FUSION_TEST_SIZE").is_ok_and(|v| matches!(v.as_str(), "tiny" | "tiny-no-wrap"))
}

/// The tiny shapes less those whose CTAs run more k-blocks than the sm90
/// ring has stages (`FUSION_TEST_SIZE=tiny-no-wrap`), for racecheck: once
/// the ring wraps, the producer's next post beside a stage
/// (`Plan::posted`, mainloop.cuh) comes after the consumers' read of the
/// last one only through the stage's empty barrier, which racecheck does
/// not follow, and it reports the pair (benchmarks/HISTORY.md v21, v30).
pub fn no_wrap() -> bool {
    std::env::var("FUSION_TEST_SIZE").is_ok_and(|v| v == "tiny-no-wrap")
}

/// The variant forced for this run, if any.
pub fn forced_arch() -> Option<String> {
    std::env::var("FUSION_FORCE_ARCH").ok().filter(|v| !v.is_empty())
}

static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
static DRAWS: AtomicU64 = AtomicU64::new(0);

/// A generator for one case: the run's seed (printed once) plus a counter.
pub fn rng() -> StdRng {
    let seed = *SEED.get_or_init(|| {
        let seed = std::env::var("FUSION_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| {
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(1, |d| d.as_nanos() as u64)
            });
        eprintln!("GPU tests: FUSION_TEST_SEED={seed}");
        seed
    });
    StdRng::seed_from_u64(
        seed ^ DRAWS
            .fetch_add(1, Ordering::Relaxed)
            .wrapping_mul(0x9E37_79B9_7F4A_7C15),
    )
}

pub fn stream() -> Arc<CudaStream> {
    let ctx = testing::open_gpu(0).unwrap_or_else(|e| panic!("{e}"));
    ctx.new_stream().expect("a stream")
}

/// A shipped graph, re-typed to the element type under test.
pub fn graph(name: &str, dtype: DType) -> Graph {
    let path = testing::graphs_dir().join(format!("{name}.toml"));
    testing::load_graph_as(&path, dtype).unwrap_or_else(|e| panic!("{e}"))
}

fn shape_of(t: &HostTensor) -> fusion::Shape {
    testing::shape_of(t).expect("tensors have rank 1 or 2")
}

/// One graph at one size, on the device: inputs uploaded, outputs poisoned.
pub struct Case<T: TestElement> {
    pub graph: Graph,
    pub host: Bindings,
    pub reads: Vec<(String, CudaSlice<T>, fusion::Shape)>,
    pub writes: Vec<(String, CudaSlice<T>, fusion::Shape, Vec<usize>)>,
    pub label: String,
    /// What the reference rounds between ops, to compute what the launch
    /// computes: `RoundedNorms` for a norm GEMM's free function, whose
    /// kernel stores the normalized rows in T; `Exact` (the default) for
    /// everything else, a struct that folds its norm included.
    pub intermediates: Intermediates,
}

impl<T: TestElement> Case<T> {
    pub fn new(stream: &Arc<CudaStream>, name: &str, dims: &[(&str, usize)]) -> Case<T> {
        let graph = graph(name, T::DTYPE);
        let host = reference::random_bindings(&graph, dims, &mut rng()).unwrap_or_else(|e| panic!("{e}"));
        Case::from_bindings(stream, graph, host, dims)
    }

    /// A case with the inputs and weights given (each already rounded to
    /// `T`) instead of random ones.
    pub fn from_bindings(
        stream: &Arc<CudaStream>,
        graph: Graph,
        host: Bindings,
        dims: &[(&str, usize)],
    ) -> Case<T> {
        let name = graph.name.clone();
        let reads = graph
            .inputs
            .iter()
            .chain(&graph.weights)
            .map(|&t| {
                let name = graph.tensor(t).name.clone();
                let value = &host[&name];
                let buf = stream.clone_htod(&T::encode(value)).expect("upload");
                (name, buf, shape_of(value))
            })
            .collect();
        // Output shapes: the reference's, from one row (cheap), scaled to M.
        let m = dims.iter().find(|d| d.0 == "M").map_or(1, |d| d.1);
        let probe =
            reference::evaluate_rows(&graph, &host, if m > 0 { &[0] } else { &[] }).expect("reference");
        let writes = graph
            .outputs
            .iter()
            .map(|&t| {
                let name = graph.tensor(t).name.clone();
                let cols = probe[&name].shape[1];
                let poison = vec![T::NAN; m * cols];
                let buf = if poison.is_empty() {
                    stream.alloc_zeros::<T>(0).expect("alloc")
                } else {
                    stream.clone_htod(&poison).expect("upload")
                };
                (name, buf, fusion::Shape::Matrix(m, cols), vec![m, cols])
            })
            .collect();
        let label = format!(
            "{name} {} {}",
            T::DTYPE,
            dims.iter()
                .map(|(d, v)| format!("{d}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        );
        Case {
            graph,
            host,
            reads,
            writes,
            label,
            intermediates: Intermediates::Exact,
        }
    }

    /// The case with its reference rounding `intermediates`.
    pub fn with_intermediates(self, intermediates: Intermediates) -> Case<T> {
        Case {
            intermediates,
            ..self
        }
    }

    /// Calls `launch` with views of the inputs (in declaration order: inputs,
    /// then weights) and the outputs.
    pub fn launch(
        &mut self,
        launch: impl FnOnce(&[Tensor<'_, T>], &mut [TensorMut<'_, T>]) -> fusion::Result<()>,
    ) -> fusion::Result<()> {
        let reads: Vec<Tensor<'_, T>> = self
            .reads
            .iter()
            .map(|(_, buf, shape)| Tensor::new(buf, *shape).expect("view"))
            .collect();
        let mut writes: Vec<TensorMut<'_, T>> = self
            .writes
            .iter_mut()
            .map(|(_, buf, shape, _)| TensorMut::new(buf, *shape).expect("view"))
            .collect();
        launch(&reads, &mut writes)
    }

    /// Device copies of the case's weights (the reads after its inputs),
    /// for a graph struct that binds them across launches of the case.
    pub fn weight_copies(&self, stream: &Arc<CudaStream>) -> Vec<(CudaSlice<T>, fusion::Shape)> {
        self.reads[self.graph.inputs.len()..]
            .iter()
            .map(|(_, buf, shape)| (stream.clone_dtod(buf).expect("copy"), *shape))
            .collect()
    }

    /// A SwiGLU FFN case's weights as the struct binds them, from
    /// [`Case::weight_copies`].
    pub fn swiglu_ffn_weights(
        copies: &[(CudaSlice<T>, fusion::Shape)],
    ) -> fusion::kernels::SwigluFfnWeights<'_, T> {
        let view = |i: usize| Tensor::new(&copies[i].0, copies[i].1).expect("view");
        fusion::kernels::SwigluFfnWeights {
            w_gate: view(0),
            w_up: view(1),
            w_down: view(2),
            b_down: view(3),
        }
    }

    /// Writes NaN over every output, so that a check after the next call
    /// only passes if that call wrote the whole output.
    pub fn poison(&mut self, stream: &Arc<CudaStream>) {
        for (_, buf, shape, _) in &mut self.writes {
            let nan = vec![T::NAN; shape.len().expect("a test shape fits a usize")];
            if !nan.is_empty() {
                stream.memcpy_htod(&nan, buf).expect("upload");
            }
        }
    }

    /// Downloads every output and compares it with the CPU reference (all
    /// rows of a small output, beyond that every 64-row band; see
    /// `fusion::testing::compare`). Returns the worst relative L2 error.
    pub fn verify(&self, stream: &Arc<CudaStream>) -> f64 {
        self.try_verify(stream).unwrap_or_else(|e| panic!("{e}"))
    }

    /// [`Case::verify`], returning the first disagreement instead of
    /// panicking (for tests that expect one).
    pub fn try_verify(&self, stream: &Arc<CudaStream>) -> Result<f64, String> {
        stream.synchronize().expect("kernels finished");
        let m = self.writes.first().map_or(0, |w| w.3[0]);
        let rows = testing::rows_to_check(m, &mut rng());
        let want = reference::evaluate_rows_with(&self.graph, &self.host, &rows, self.intermediates)
            .expect("reference");
        let mut worst = 0.0f64;
        for (name, buf, _, shape) in &self.writes {
            let values = stream.clone_dtoh(buf).expect("download");
            let got = T::decode(shape, &values)
                .and_then(|t| t.select_rows(&rows))
                .expect("shape matches");
            let err = testing::compare(&got, &want[name], T::DTYPE, &rows)
                .map_err(|e| format!("{}: output `{name}`: {e}", self.label))?;
            worst = worst.max(err);
        }
        Ok(worst)
    }
}

/// One call of `table` through the executor on the tensors [`check`]
/// hands its launch (the table's inputs, then its weights, in its order),
/// with the weights given per call or, where `bound`, bound first as a
/// graph struct binds them.
///
/// # Safety
///
/// As [`fusion::plan::run`]: `table` says truly what its launchers read and
/// write.
pub unsafe fn run_table<T: Element>(
    table: &'static fusion::plan::PlanTable,
    stream: &Arc<CudaStream>,
    workspace: &mut fusion::launch::Workspace,
    tensors: &[Tensor<'_, T>],
    outputs: &mut [TensorMut<'_, T>],
    bound: bool,
) -> fusion::Result<()> {
    use fusion::plan::{self, Weights};
    let (inputs, weights) = tensors.split_at(table.inputs.len());
    let inputs: Vec<&Tensor<'_, T>> = inputs.iter().collect();
    let mut outputs: Vec<&mut TensorMut<'_, T>> = outputs.iter_mut().collect();
    // SAFETY: the caller's.
    unsafe {
        if bound {
            let bound = plan::bind(table, stream, weights.to_vec())?;
            plan::run(
                table,
                workspace,
                Weights::Bound(&bound),
                stream,
                &inputs,
                &mut outputs,
            )
        } else {
            let weights: Vec<&Tensor<'_, T>> = weights.iter().collect();
            plan::run(
                table,
                workspace,
                Weights::PerCall(&weights),
                stream,
                &inputs,
                &mut outputs,
            )
        }
    }
}

/// Whether this run's variant can run element type `T` (sm75 has no bf16).
pub fn variant_supports<T: Element>() -> bool {
    !(T::DTYPE == DType::BF16 && forced_arch().as_deref() == Some("sm75"))
}

/// Runs one graph at one size for one element type: fresh inputs, poisoned
/// outputs, the wrapper, the comparison with the exact reference. On a
/// variant without this element type the wrapper must refuse with
/// `UnsupportedDType`. For a launch that rounds no norm's output before a
/// GEMM: a norm GEMM's free function goes through [`check_adjusted`].
pub fn check<T: TestElement>(
    stream: &Arc<CudaStream>,
    name: &str,
    dims: &[(&str, usize)],
    launch: impl FnOnce(&[Tensor<'_, T>], &mut [TensorMut<'_, T>]) -> fusion::Result<()>,
) {
    check_adjusted(stream, name, dims, Intermediates::Exact, |_| {}, launch);
}

/// [`check`] against a reference that rounds `intermediates` (what the
/// launch stores in T; see [`Case::intermediates`]), with the random inputs
/// and weights changed by `adjust` first (and then rounded to `T`).
pub fn check_adjusted<T: TestElement>(
    stream: &Arc<CudaStream>,
    name: &str,
    dims: &[(&str, usize)],
    intermediates: Intermediates,
    adjust: impl FnOnce(&mut Bindings),
    launch: impl FnOnce(&[Tensor<'_, T>], &mut [TensorMut<'_, T>]) -> fusion::Result<()>,
) {
    let graph = graph(name, T::DTYPE);
    let mut host = reference::random_bindings(&graph, dims, &mut rng()).unwrap_or_else(|e| panic!("{e}"));
    adjust(&mut host);
    for t in host.values_mut() {
        *t = T::decode(&t.shape, &T::encode(t)).expect("a value rounds to T");
    }
    let mut case = Case::<T>::from_bindings(stream, graph, host, dims).with_intermediates(intermediates);
    let result = case.launch(launch);
    if !variant_supports::<T>() {
        assert!(
            matches!(result, Err(fusion::Error::UnsupportedDType { .. })),
            "{}: expected UnsupportedDType, got {result:?}",
            case.label
        );
        return;
    }
    result.unwrap_or_else(|e| panic!("{}: {e}", case.label));
    let err = case.verify(stream);
    eprintln!("ok  {:<48} rel_err {err:.2e}", case.label);
}

/// Moves a norm GEMM's rows `x` far from zero against their spread (mean
/// `mean`, half-width 0.5, where a folded LayerNorm subtracts two large,
/// nearly equal sums) and gives its gamma `g` zeros and negative values.
pub fn off_center_norm_inputs(host: &mut Bindings, mean: f64) {
    let x = host.get_mut("x").expect("the graph reads x");
    x.data.iter_mut().for_each(|v| *v = mean + 0.5 * *v);
    let gamma = host.get_mut("g").expect("the graph's gamma is g");
    for (i, v) in gamma.data.iter_mut().enumerate() {
        *v = match i % 5 {
            0 => 0.0,
            1 | 3 => -v.abs(),
            _ => *v,
        };
    }
}

/// What [`small_variance_norm_inputs`] scales a norm's rows by.
pub const SMALL_VARIANCE_SCALE: f64 = 1e-3;

/// Scales a norm's rows `x` by [`SMALL_VARIANCE_SCALE`], so that the norm's
/// eps, not the rows, sets the output's scale. Drawn from U(−1, 1), the rows
/// become U(−s, s) with s = 1e-3: every row's variance or mean square v is
/// at most s² = 1e-6 (about s²/3 = 3.3e-7), no more than the norms' eps
/// (1e-6 for `rmsnorm`, 1e-5 for the others), and the normalized row is the
/// row times 1/√(v + eps). A kernel that uses eps′ instead scales each
/// normalized row by √(v + eps)/√(v + eps′), all its elements alike:
/// - eps 1e-5, eps′ 0: at least √(1.1e-5 / 1e-6) = 3.3 (about 5.6);
/// - eps 1e-5, eps′ 1e-6: at least √(1.1e-5 / 2e-6) = 2.3 (about 2.8);
/// - eps 1e-6, eps′ 0: at least √(2e-6 / 1e-6) = 1.41 (about 2.0);
/// - eps 1e-6, eps′ 1e-5: at most 1 / 2.3 (about 1 / 2.8).
///
/// So every normalized row is off by 41% or more of itself, and so is
/// every row of a GEMM's output over it: 400 times the f16 relative L2
/// limit (1e-3) and 50 times the bf16 one (8e-3) of `fusion::testing::compare`.
/// A LayerNorm's beta, added after the scaling, dilutes that (to 0.3 of the
/// output for eps′ 1e-6, 40 times the bf16 limit), and so would a residual
/// added after the GEMM, which is scaled as well;
/// `an_eps_off_fails_the_small_variance_norms` (tests/gpu.rs) computes each
/// case's error with the CPU reference. At U(−1, 1) the same eps′ moves
/// v + eps ≈ 0.33 by at most 1e-5, the outputs by 1.5e-5 of themselves: far
/// inside either bound, so no other test fails on an eps. (In f16 the rows'
/// values under 6.1e-5 are subnormal; the kernels read them as f32, and the
/// reference reads them as rounded to T.)
pub fn small_variance_norm_inputs(host: &mut Bindings) {
    let x = host.get_mut("x").expect("the graph reads x");
    x.data.iter_mut().for_each(|v| *v *= SMALL_VARIANCE_SCALE);
    // A residual added after the GEMM (layernorm_gemm_silu_glu_residual's
    // r) would be most of the output, and hide most of a wrong scale.
    if let Some(r) = host.get_mut("r") {
        r.data.iter_mut().for_each(|v| *v *= SMALL_VARIANCE_SCALE);
    }
}

/// `layernorm_gemm` through its struct, bound to `r`'s weights (g, b, w):
/// the norm folded into w.
pub fn layernorm_gemm_folded<T: Element>(
    s: &Arc<CudaStream>,
    r: &[Tensor<'_, T>],
    w: &mut [TensorMut<'_, T>],
) -> fusion::Result<()> {
    let weights = fusion::kernels::LayernormGemmWeights {
        g: r[1].clone(),
        b: r[2].clone(),
        w: r[3].clone(),
    };
    fusion::kernels::LayernormGemm::new(s, weights)?.run(s, &r[0], &mut w[0])
}

/// `rmsnorm_gemm` through its struct, bound to `r`'s weights (g, w).
pub fn rmsnorm_gemm_folded<T: Element>(
    s: &Arc<CudaStream>,
    r: &[Tensor<'_, T>],
    w: &mut [TensorMut<'_, T>],
) -> fusion::Result<()> {
    let weights = fusion::kernels::RmsnormGemmWeights {
        g: r[1].clone(),
        w: r[2].clone(),
    };
    fusion::kernels::RmsnormGemm::new(s, weights)?.run(s, &r[0], &mut w[0])
}

/// `gemm_silu_glu` through its struct, bound to `w_gate` and `w_up` (the
/// free function's arguments): the weights interleaved once.
pub fn gemm_silu_glu_bound<T: Element>(
    s: &Arc<CudaStream>,
    x: &Tensor<'_, T>,
    w_gate: &Tensor<'_, T>,
    w_up: &Tensor<'_, T>,
    h: &mut TensorMut<'_, T>,
) -> fusion::Result<()> {
    let weights = fusion::kernels::GemmSiluGluWeights {
        w_gate: w_gate.clone(),
        w_up: w_up.clone(),
    };
    fusion::kernels::GemmSiluGlu::new(s, weights)?.run(s, x, h)
}

/// `gemm_gelu_glu` through its struct, as [`gemm_silu_glu_bound`].
pub fn gemm_gelu_glu_bound<T: Element>(
    s: &Arc<CudaStream>,
    x: &Tensor<'_, T>,
    w_gate: &Tensor<'_, T>,
    w_up: &Tensor<'_, T>,
    h: &mut TensorMut<'_, T>,
) -> fusion::Result<()> {
    let weights = fusion::kernels::GemmGeluGluWeights {
        w_gate: w_gate.clone(),
        w_up: w_up.clone(),
    };
    fusion::kernels::GemmGeluGlu::new(s, weights)?.run(s, x, h)
}

/// (M, N, K) for the single-GEMM patterns.
pub fn gemm_shapes() -> Vec<(usize, usize, usize)> {
    let mut shapes = Vec::new();
    let (ms, nks): (&[usize], &[usize]) = if tiny() {
        (&[1, 77], &[8, 136])
    } else {
        (&[1, 77, 1000], &[8, 136, 3000])
    };
    for &m in ms {
        for &n in nks {
            for &k in nks {
                shapes.push((m, n, k));
            }
        }
    }
    if tiny() {
        // The decode kernel's wide CTA shape (see below), which M = 1 does
        // not reach, for the sanitizers; and 1100 x 776 x 72 on sm90's
        // 128x192 tile (45 tiles in one wave, 320 loads against 384 for 36
        // of 128x256: gemm.cuh's LightestTier), N and K ragged;
        // 641 x 16904 x 632: 402 tiles of 128x256 on 132 SMs, the last 138
        // shared out by stream-K, so each CTA runs pieces of 11 k-blocks
        // across two tiles of 10, whose stages wrap the ring (one piece a
        // CTA in every other tiny shape), with FUSION_STREAM_K=tail;
        // 200 x 2560 x 3072: 80 tiles of 64x128, one wave of more than half
        // the SMs, which FUSION_STREAM_K=fill shares out (30 of a tile's 48
        // k-blocks a CTA). The last two wrap the ring: `tiny-no-wrap`
        // (racecheck) leaves them out.
        shapes.extend([(13, 5400, 1032), (1100, 776, 72)]);
        if !no_wrap() {
            shapes.extend([(641, 16904, 632), (200, 2560, 3072)]);
        }
        return shapes;
    }
    // sm90's tiers as gemm.cuh's LightestTier chooses them (the fewest
    // loads for the busiest CTA): 512 x 2048, 1000 x 136 and 77 x 3000
    // (above) on the 64x128 tile; 2100 x 3000 on the 128x256 tile: 204
    // tiles, so on 132 SMs the last 72 are shared out by stream-K with
    // FUSION_STREAM_K=tail (whole by default);
    // 4100 x 3000 x 1000: 396 tiles of 128x256, three whole waves on 132
    // SMs; 200 x 8200 x 1000: 130 tiles of the 128x128 tile, one wave.
    // 1000 x 3000 (above, 128 tiles of 128x192 against 96 of 128x256) and
    // 2500 x 2304 x 4000 (240 tiles against 180, two waves either way, the
    // last 108 shared out by stream-K) run the 128x192 tile (the last waves
    // shared out with FUSION_STREAM_K=tail). 300 x 2560 x 4096: 100 tiles
    // of 64x128 in one wave, which FUSION_STREAM_K=fill shares out.
    // 128 x 1024 x 4096: 16 tiles of 64x128 of 64 k-blocks, which split-K
    // shares 8 ways by default (K = 3000 above, 47 k-blocks, splits only
    // with FUSION_STREAM_K=tail). 2100 x 3000 x 12296: 204 tiles of
    // 128x256 of 193 k-blocks, whose last 72 stream-K shares out by
    // default (deep tiles; 106 k-blocks a CTA against 193). Ragged M, N
    // and K, so the sm90 waves that walk K backwards
    // start on a partial k-block. M = 9, 13 and 16: the decode kernel
    // (fusion-compiler/kernels/include/fusion/decode.cuh) with rows in both halves of its
    // mma, N not a multiple of its 16-column blocks, K not one of its
    // 128-element steps; at 13 x 5400, 338 blocks of 16 columns, its wide
    // CTA shape on up to 135 SMs (decode_runs_wide), the deep one elsewhere.
    shapes.extend([
        (9, 520, 3000),
        (13, 5400, 1032),
        (16, 3000, 1032),
        (512, 2048, 2048),
        (2100, 3000, 3000),
        (4100, 3000, 1000),
        (200, 8200, 1000),
        (2500, 2304, 4000),
        (300, 2560, 4096),
        (128, 1024, 4096),
        (2100, 3000, 12296),
    ]);
    if !quick() {
        shapes.extend([
            (4096, 4096, 4096),
            (8192, 8192, 8192),
            (8192, 14336, 4096),
            (8192, 4096, 14336),
            (128, 14336, 4096),
        ]);
    }
    shapes
}

/// Token counts for the whole-block graphs.
pub fn token_counts(large: usize) -> Vec<usize> {
    if tiny() {
        return vec![1, 77];
    }
    let mut m = vec![1, 77, 128, 1000];
    if !quick() {
        m.push(large);
    }
    m
}
