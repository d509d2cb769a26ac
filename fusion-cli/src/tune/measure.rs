//! One kernel's inputs at one M, on the host and on the device; a loaded
//! candidate checked against the CPU reference on sampled rows, then timed
//! call by call against the cuBLASLt product a user would call instead, by
//! the bench's method (warm-up, CUDA events, median, input sets rotated).

use super::library::LoadedUnit;
use crate::bench::cublaslt::{LtEpilogue, LtGemm};
use crate::bench::timing::{self, Timing, TimingPlan};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, ValidAsZeroBits};
use fusion::abi::{fusion_fold_params, fusion_gemm_params};
use fusion::error::Result as GpuResult;
use fusion::testing::{self, HostElement};
use fusion_compiler::fuse::{FusedKernel, GemmComposition, GemmOperands, Role};
use fusion_compiler::ir::{Graph, WeightLayout};
use fusion_compiler::reference::{self, HostTensor, Intermediates};
use fusion_compiler::select::guard::{VendorEpilogue, VendorPath};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::sync::Arc;

/// The input sets a timing rotates through, the bench's, fewer when a case
/// is large (`rotation_sets`).
const MAX_SETS: usize = crate::bench::SETS;

/// Device memory the rotated sets of one case may take together.
const ROTATION_BYTES: usize = 8 << 30;

/// The cuBLASLt product a kernel is timed against: the same GEMM with the
/// fused epilogue cuBLASLt has for the chain (a residual through its
/// `beta·C`), or the GEMM alone where it has none.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Baseline {
    pub epilogue: LtEpilogue,
    pub residual: bool,
    /// Whether it computes the kernel's whole chain.
    pub whole: bool,
    /// A gated GEMM's: gate and up as one GEMM of twice the columns, over
    /// the two weights stacked (as a model that stores them merged calls it).
    pub gated: bool,
}

/// The run time's name for the compiler's cuBLASLt epilogue.
pub fn lt_epilogue(epilogue: VendorEpilogue) -> LtEpilogue {
    match epilogue {
        VendorEpilogue::None => LtEpilogue::None,
        VendorEpilogue::Bias => LtEpilogue::Bias,
        VendorEpilogue::Relu => LtEpilogue::Relu,
        VendorEpilogue::ReluBias => LtEpilogue::ReluBias,
        VendorEpilogue::Gelu => LtEpilogue::Gelu,
        VendorEpilogue::GeluBias => LtEpilogue::GeluBias,
    }
}

impl Baseline {
    /// The unfused path the guard would run ([`VendorPath::of`]) where
    /// cuBLASLt computes the whole chain; else the GEMM alone.
    pub fn of(gemm: &GemmComposition) -> Baseline {
        let path = VendorPath::of(gemm);
        let whole = path.unsupported().is_none();
        let (epilogue, residual) = if whole {
            (lt_epilogue(path.epilogue), path.beta_residual)
        } else {
            (LtEpilogue::None, false)
        };
        Baseline {
            epilogue,
            residual,
            whole,
            gated: path.gated,
        }
    }

    /// `cuBLASLt BIAS + beta·C`, or `cuBLASLt, the GEMM alone`.
    pub fn describe(self) -> String {
        let mut name = self.epilogue.name().to_owned();
        if self.residual {
            name += " + beta·C";
        }
        if self.gated {
            name += ", gate and up as one GEMM";
        } else if !self.whole {
            name += ", the GEMM alone";
        }
        name
    }
}

/// A gated GEMM's baseline buffers, per set: gate and up stacked, and the
/// product of twice the columns.
struct Stacked<T> {
    weights: Vec<CudaSlice<T>>,
    outputs: Vec<CudaSlice<T>>,
}

/// Device addresses: every buffer of a case is allocated on, launched on
/// and freed (cudarc frees asynchronously, on the slice's stream) on the
/// case's one stream, so an address taken here (its event guard dropped at
/// once) stays valid for every launch queued on that stream before the
/// buffer is dropped, whether or not the host synchronized.
///
/// One kernel, alone as a graph (`Plan::kernel_graph`), at one M: its inputs drawn at
/// random, the reference's output on sampled rows, and the device buffers,
/// each in several rotated sets.
pub struct Case<T: HostElement> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    eps: f32,
    rows: Vec<usize>,
    want: HostTensor,
    /// Per role the kernel reads, its buffer in every set.
    operands: Vec<(Role, Vec<CudaSlice<T>>)>,
    /// The role of each pointer of the launch's params.
    fields: GemmOperands<Role>,
    outputs: Vec<CudaSlice<T>>,
    /// A gated GEMM's: per set, gate and up interleaved as a bound struct
    /// holds them ([`Case::bind_gated`]), which launches read as `b`.
    interleaved: Option<Vec<CudaSlice<T>>>,
    /// A gated GEMM's baseline: per set, the two weights stacked, and its
    /// outputs, of twice the columns.
    stacked: Option<Stacked<T>>,
    /// The launches' flags: the run time's split-K, stream-K and tile
    /// counter settings, so that a candidate is timed as calls run it.
    flags: u32,
    stream: Arc<CudaStream>,
}

impl<T: HostElement + ValidAsZeroBits> Case<T> {
    /// Draws `graph`'s inputs for `dims` (every dynamic dim) from `seed`,
    /// computes the reference on the rows a GPU test would compare, and
    /// copies the inputs to the device.
    pub fn new(
        stream: &Arc<CudaStream>,
        graph: &Graph,
        kernel: &FusedKernel,
        gemm: &GemmComposition,
        dims: &[(&str, usize)],
        (m, n, k): (usize, usize, usize),
        seed: u64,
    ) -> Result<Case<T>, String> {
        let mut rng = StdRng::seed_from_u64(seed);
        let host = reference::random_bindings(graph, dims, &mut rng).map_err(|e| e.to_string())?;
        let rows = testing::rows_to_check(m, &mut rng);
        let intermediates = if gemm.prologue.is_some() {
            Intermediates::RoundedNorms
        } else {
            Intermediates::Exact
        };
        let output = &graph.tensor(kernel.output).name;
        let want = reference::evaluate_rows_with(graph, &host, &rows, intermediates)
            .map_err(|e| e.to_string())?
            .shift_remove(output)
            .ok_or_else(|| format!("the reference computed no `{output}`"))?;
        let bytes: usize = kernel
            .operands
            .iter()
            .map(|o| host[&graph.tensor(o.tensor).name].data.len())
            .sum::<usize>()
            .saturating_add(m * n)
            .saturating_mul(size_of::<T>());
        let sets = rotation_sets(bytes);
        let gpu = |e: cudarc::driver::DriverError| e.to_string();
        let mut operands = Vec::new();
        for operand in &kernel.operands {
            let values = T::encode(&host[&graph.tensor(operand.tensor).name]);
            let copies = (0..sets)
                .map(|_| stream.clone_htod(&values))
                .collect::<Result<Vec<_>, _>>()
                .map_err(gpu)?;
            operands.push((operand.role, copies));
        }
        let outputs = (0..sets)
            .map(|_| stream.alloc_zeros::<T>(m * n))
            .collect::<Result<Vec<_>, _>>()
            .map_err(gpu)?;
        let stacked = match gemm.gate {
            None => None,
            Some(_) => {
                let tensor = |role| {
                    let operand = kernel
                        .operands
                        .iter()
                        .find(|o| o.role == role)
                        .expect("a gated GEMM reads B and Up");
                    &host[&graph.tensor(operand.tensor).name]
                };
                let both = T::encode(&stack(tensor(Role::B), tensor(Role::Up), gemm.b_layout));
                let weights = (0..sets)
                    .map(|_| stream.clone_htod(&both))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(gpu)?;
                let wide = (0..sets)
                    .map(|_| stream.alloc_zeros::<T>(2 * m * n))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(gpu)?;
                Some(Stacked {
                    weights,
                    outputs: wide,
                })
            }
        };
        Ok(Case {
            m,
            n,
            k,
            eps: gemm.prologue.map_or(0.0, |norm| norm.eps as f32),
            rows,
            want,
            operands,
            fields: kernel.gemm_operands().map(|o| o.role),
            outputs,
            interleaved: None,
            stacked,
            flags: fusion::launch::schedule_flags(false),
            stream: stream.clone(),
        })
    }

    /// For a gated GEMM: its gate and up weights interleaved by `unit`'s
    /// `_fold_weights` (the layout does not depend on the tile config), in
    /// every set, as a struct binding its weights prepares them once; every
    /// launch then reads them as `b`, with `b_up` null.
    pub fn bind_gated(&mut self, unit: &LoadedUnit) -> Result<(), String> {
        let sets = self.sets();
        let mut interleaved = Vec::with_capacity(sets);
        for set in 0..sets {
            let out = self
                .stream
                .alloc_zeros::<T>(2 * self.n * self.k)
                .map_err(|e| e.to_string())?;
            let address = |role| {
                self.operand(role, set).map_or(std::ptr::null(), |b| {
                    b.device_ptr(&self.stream).0 as *const std::ffi::c_void
                })
            };
            let params = fusion_fold_params {
                w: address(Role::B),
                w_up: address(Role::Up),
                gamma: std::ptr::null(),
                beta: std::ptr::null(),
                w_folded: out.device_ptr(&self.stream).0 as *mut std::ffi::c_void,
                col_terms: std::ptr::null_mut(),
                n: self.n as i64,
                k: self.k as i64,
                ld_folded: 0,
            };
            // SAFETY: w and w_up hold n·k elements each and `out` 2·n·k, all
            // on this case's stream (see `Case`).
            unsafe { unit.fold_weights(&params, self.stream.cu_stream().cast()) }?;
            interleaved.push(out);
        }
        self.interleaved = Some(interleaved);
        Ok(())
    }

    fn sets(&self) -> usize {
        self.outputs.len()
    }

    fn operand(&self, role: Role, set: usize) -> Option<&CudaSlice<T>> {
        self.operands
            .iter()
            .find(|(r, _)| *r == role)
            .map(|(_, copies)| &copies[set])
    }

    /// The launch's params for input set `set`, with `workspace`.
    fn params(&self, set: usize, workspace: Option<&CudaSlice<u8>>) -> fusion_gemm_params {
        let address = |buffer: Option<&CudaSlice<T>>| {
            buffer.map_or(std::ptr::null(), |b| {
                b.device_ptr(&self.stream).0 as *const std::ffi::c_void
            })
        };
        let fields = self.fields.map(|role| address(self.operand(role, set)));
        let field = |address: Option<*const std::ffi::c_void>| address.unwrap_or(std::ptr::null());
        let (workspace, workspace_bytes) = workspace.map_or((std::ptr::null_mut(), 0), |w| {
            (
                w.device_ptr(&self.stream).0 as *mut std::ffi::c_void,
                w.len() as u64,
            )
        });
        let (b, b_up) = match &self.interleaved {
            Some(interleaved) => (address(Some(&interleaved[set])), std::ptr::null()),
            None => (field(fields.b), field(fields.b_up)),
        };
        fusion_gemm_params {
            a: field(fields.a),
            b,
            b_up,
            c: self.outputs[set].device_ptr(&self.stream).0 as *mut std::ffi::c_void,
            bias: field(fields.bias),
            residual: field(fields.residual),
            multiplier: field(fields.multiplier),
            gamma: field(fields.gamma),
            beta: field(fields.beta),
            col_terms: std::ptr::null(),
            m: self.m as i64,
            n: self.n as i64,
            k: self.k as i64,
            ldb: 0,
            eps: self.eps,
            flags: self.flags,
            workspace,
            workspace_bytes,
        }
    }

    /// The scratch `unit` needs at this case's shape, zeroed (stream-K's
    /// flags start at 0 and kernels leave them so).
    pub fn workspace_for(&self, unit: &LoadedUnit) -> Result<Option<CudaSlice<u8>>, String> {
        // SAFETY: the params point at this case's buffers, of the sizes they say.
        let bytes = unsafe { unit.workspace_bytes(&self.params(0, None)) }?;
        if bytes == 0 {
            return Ok(None);
        }
        self.stream
            .alloc_zeros::<u8>(bytes as usize)
            .map(Some)
            .map_err(|e| e.to_string())
    }

    /// Runs `unit` once on set 0, its output poisoned with NaN first, and
    /// compares the sampled rows with the reference ([`testing::compare`]):
    /// the relative L2 error, or what is wrong.
    pub fn check(&mut self, unit: &LoadedUnit, workspace: Option<&CudaSlice<u8>>) -> Result<f64, String> {
        let poison = vec![T::NAN; self.m * self.n];
        self.stream
            .memcpy_htod(&poison, &mut self.outputs[0])
            .map_err(|e| e.to_string())?;
        let params = self.params(0, workspace);
        // SAFETY: the params point at this case's live buffers and the
        // unit's workspace; the stream is this case's.
        unsafe { unit.launch(&params, self.stream.cu_stream().cast()) }?;
        let got = self
            .stream
            .clone_dtoh(&self.outputs[0])
            .map_err(|e| e.to_string())?;
        let got = T::decode(&[self.m, self.n], &got)
            .and_then(|t| t.select_rows(&self.rows))
            .map_err(|e| e.to_string())?;
        testing::compare(&got, &self.want, T::DTYPE, &self.rows).map_err(|e| e.to_string())
    }

    /// The cuBLASLt plan of `baseline` at this shape: the heuristic's first
    /// algorithm, as PyTorch runs it.
    pub fn plan_baseline(&self, gemm: &GemmComposition, baseline: Baseline) -> GpuResult<LtGemm> {
        let gemm_n = if gemm.gate.is_some() { 2 * self.n } else { self.n };
        LtGemm::new(
            &self.stream,
            T::DTYPE,
            gemm.b_layout,
            (self.m, gemm_n, self.k),
            baseline.epilogue,
            1,
        )
    }

    /// Times `units` (each with its workspace) and `baseline`, call by
    /// call: one timing per unit, then the baseline's.
    pub fn time(
        &mut self,
        units: &[(&LoadedUnit, Option<&CudaSlice<u8>>)],
        baseline: &mut LtGemm,
        with: Baseline,
        plan: TimingPlan,
        head: &mut CudaSlice<u8>,
    ) -> Result<Vec<Timing>, String> {
        let sets = self.sets();
        // Addresses only: the launches below read no Rust borrow.
        let params: Vec<Vec<fusion_gemm_params>> = units
            .iter()
            .map(|(_, workspace)| (0..sets).map(|set| self.params(set, *workspace)).collect())
            .collect();
        let Case {
            operands,
            outputs,
            stacked,
            stream,
            ..
        } = self;
        let cu_stream = stream.cu_stream().cast();
        let mut calls: Vec<Box<dyn FnMut(usize) -> GpuResult<()> + '_>> = Vec::new();
        for ((unit, _), params) in units.iter().zip(&params) {
            calls.push(Box::new(move |i| {
                // SAFETY: each params points at this case's buffers, on its
                // stream (see `Case`), with the sizes the params say.
                unsafe { unit.launch(&params[i % sets], cu_stream) }.map_err(|message| {
                    fusion::Error::Launch {
                        kernel: "a tuning candidate".into(),
                        code: -1,
                        message,
                    }
                })
            }));
        }
        let operand = |role: fn(&Role) -> bool, set: usize| {
            operands
                .iter()
                .find(|(r, _)| role(r))
                .map(|(_, copies)| &copies[set])
        };
        let mut baseline_call = |i: usize| -> GpuResult<()> {
            let set = i % sets;
            let x = operand(|r| *r == Role::A, set).expect("a GEMM reads A");
            let bias =
                operand(|r| matches!(r, Role::Bias { .. }), set).filter(|_| with.epilogue.reads_bias());
            let residual = operand(|r| matches!(r, Role::Residual { .. }), set).filter(|_| with.residual);
            match stacked {
                Some(Stacked { weights, outputs }) => {
                    baseline.run(stream, x, &weights[set], bias, residual, &mut outputs[set])
                }
                None => {
                    let w = operand(|r| *r == Role::B, set).expect("a GEMM reads B");
                    baseline.run(stream, x, w, bias, residual, &mut outputs[set])
                }
            }
        };
        let mut contenders: Vec<&mut dyn FnMut(usize) -> GpuResult<()>> = calls
            .iter_mut()
            .map(|call| call.as_mut() as &mut dyn FnMut(usize) -> GpuResult<()>)
            .collect();
        contenders.push(&mut baseline_call);
        let head_stream = stream.clone();
        timing::time_many(
            stream,
            plan,
            || crate::bench::head_start(&head_stream, head),
            &mut contenders,
        )
        .map_err(|e| e.to_string())
    }
}

/// Two weights of one shape as one of twice the columns: `[N, K]` ones one
/// above the other (`[2N, K]`), `[K, N]` ones side by side (`[K, 2N]`).
fn stack(first: &HostTensor, second: &HostTensor, layout: WeightLayout) -> HostTensor {
    let data = match layout {
        WeightLayout::NK => [&first.data[..], &second.data[..]].concat(),
        WeightLayout::KN => {
            let n = first.row_len();
            first
                .data
                .chunks(n)
                .zip(second.data.chunks(n))
                .flat_map(|(a, b)| a.iter().chain(b).copied())
                .collect()
        }
    };
    let shape = match layout {
        WeightLayout::NK => [2 * first.shape[0], first.shape[1]],
        WeightLayout::KN => [first.shape[0], 2 * first.shape[1]],
    };
    HostTensor::new(&shape, data).expect("two weights of one shape stack")
}

/// How many rotated sets a case of `bytes` gets: [`MAX_SETS`], or fewer
/// where they would take more than [`ROTATION_BYTES`] (at least 2, so that
/// no call finds its inputs in L2 from the call before).
fn rotation_sets(bytes: usize) -> usize {
    (ROTATION_BYTES / bytes.max(1)).clamp(2, MAX_SETS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusion_compiler::fuse::{EpilogueStep, Norm, NormKind};
    use fusion_compiler::ir::Activation;

    fn gemm(epilogue: Vec<EpilogueStep>) -> GemmComposition {
        GemmComposition {
            prologue: None,
            b_layout: WeightLayout::NK,
            gate: None,
            epilogue,
        }
    }

    #[test]
    fn the_baseline_is_the_fused_cublaslt_epilogue_the_chain_has() {
        use EpilogueStep::{Activation as Act, Bias, Residual};
        let cases = [
            (vec![], "cuBLASLt"),
            (vec![Bias, Act(Activation::GELU)], "cuBLASLt GELU_BIAS"),
            (vec![Bias, Act(Activation::RELU)], "cuBLASLt RELU_BIAS"),
            (vec![Bias, Residual], "cuBLASLt BIAS + beta·C"),
            (vec![Bias, Act(Activation::SILU)], "cuBLASLt, the GEMM alone"),
            (vec![Bias, Act(Activation::GELU_ERF)], "cuBLASLt, the GEMM alone"),
        ];
        for (steps, want) in cases {
            let g = gemm(steps);
            assert_eq!(Baseline::of(&g).describe(), want, "{:?}", g.epilogue);
        }
        let mut norm = gemm(vec![]);
        norm.prologue = Some(Norm {
            kind: NormKind::RmsNorm,
            eps: 1e-5,
        });
        assert_eq!(Baseline::of(&norm).describe(), "cuBLASLt, the GEMM alone");
        let mut gated = gemm(vec![]);
        gated.gate = Some(Activation::SILU);
        assert_eq!(
            Baseline::of(&gated).describe(),
            "cuBLASLt, gate and up as one GEMM"
        );
    }

    #[test]
    fn two_weights_stack_into_one_of_twice_the_columns() {
        let a = HostTensor::new(&[2, 3], vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0]).unwrap();
        let b = HostTensor::new(&[2, 3], vec![7.0, 8.0, 9.0, 10.0, 11.0, 12.0]).unwrap();
        let nk = stack(&a, &b, WeightLayout::NK);
        assert_eq!(nk.shape, [4, 3]);
        assert_eq!(
            nk.data,
            [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]
        );
        let kn = stack(&a, &b, WeightLayout::KN);
        assert_eq!(kn.shape, [2, 6]);
        assert_eq!(
            kn.data,
            [1.0, 2.0, 3.0, 7.0, 8.0, 9.0, 4.0, 5.0, 6.0, 10.0, 11.0, 12.0]
        );
    }

    #[test]
    fn large_cases_rotate_fewer_sets() {
        assert_eq!(rotation_sets(1 << 20), MAX_SETS);
        assert_eq!(rotation_sets(2 << 30), 4);
        assert_eq!(rotation_sets(100 << 30), 2);
    }
}
