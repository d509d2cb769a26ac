//! One kernel's inputs at one M, on the host and on the device; a loaded
//! candidate called through the run time's executor as a bound graph
//! struct calls it (its table, `fusion::plan::run`), checked against the
//! CPU reference on sampled rows, then timed call by call against the
//! cuBLASLt product a user would call instead, by the bench's method
//! (warm-up, CUDA events, median, input sets rotated). Params, bound
//! weights and workspace are the executor's; this module only draws the
//! inputs, times the calls and plans the baseline.

use super::library::LoadedUnit;
use crate::bench::cublaslt::{LtEpilogue, LtGemm};
use crate::bench::timing::{self, Timing, TimingPlan};
use crate::table::reference_intermediates;
use cudarc::driver::{CudaSlice, CudaStream, ValidAsZeroBits};
use fusion::error::Result as GpuResult;
use fusion::plan::{self, PlanTable, Weights};
use fusion::testing::{self, HostElement};
use fusion::{BoundWeights, Tensor, TensorMut, Workspace};
use fusion_compiler::fuse::{GemmComposition, Plan, Role};
use fusion_compiler::ir::WeightLayout;
use fusion_compiler::reference::{self, HostTensor};
use fusion_compiler::select::guard::{VendorEpilogue, VendorPath};
use rand::SeedableRng;
use rand::rngs::StdRng;
use std::cell::RefCell;
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
    /// cuBLASLt computes the whole chain; else the GEMM alone (a norm
    /// prologue, which the guard's path runs as a kernel of its own, is no
    /// part of cuBLASLt's product).
    pub fn of(gemm: &GemmComposition) -> Baseline {
        let path = VendorPath::of(gemm);
        let whole = path.unsupported().is_none() && path.norm.is_none();
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

/// One kernel alone as a plan (`Plan::kernel_plan`) at one M: its inputs
/// drawn at random, the reference's output on sampled rows, and on the
/// device, in several rotated sets, the call's inputs, its weights bound as
/// a graph struct binds them ([`plan::bind`]: a norm folded into the
/// weight, a gated pair interleaved, rows padded) and its output. Every
/// candidate of the kernel is called through the executor ([`plan::run`])
/// with its own table and these bound weights.
///
/// Every buffer is allocated on, used on and freed (cudarc frees
/// asynchronously, on the slice's stream) on the case's one stream.
pub struct Case<T: HostElement> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    rows: Vec<usize>,
    want: HostTensor,
    /// Per set: the call's inputs, in the table's order.
    inputs: Vec<Vec<Tensor<'static, T>>>,
    /// Per set: the weights as bound by the first candidate's table (the
    /// shipped config's). Every candidate's table is the same plan with
    /// other launchers, and what binding writes (`_fold_weights`' layout,
    /// padded rows) no tile config changes, so each reads them as its own.
    bound: Vec<BoundWeights<'static, T>>,
    /// Per role the kernel reads: its buffer in every set, which the
    /// baseline reads (the bound weights share them).
    operands: Vec<(Role, Vec<Arc<CudaSlice<T>>>)>,
    outputs: Vec<CudaSlice<T>>,
    /// A gated GEMM's baseline: per set, the two weights stacked, and its
    /// outputs, of twice the columns.
    stacked: Option<Stacked<T>>,
    stream: Arc<CudaStream>,
}

impl<T: HostElement + ValidAsZeroBits> Case<T> {
    /// Draws the inputs of `plan` (one kernel, a GEMM `gemm`) for `dims`
    /// (every dynamic dim) from `seed`, copies them to the device, binds
    /// the weights of every set with `binder`'s table, and computes the
    /// reference on the rows a GPU test would compare, as the bound kernel
    /// computes them (a folded norm's rows exact, a per-call norm's
    /// rounded).
    pub fn new(
        stream: &Arc<CudaStream>,
        (plan, gemm): (&Plan, &GemmComposition),
        binder: &LoadedUnit,
        dims: &[(&str, usize)],
        (m, n, k): (usize, usize, usize),
        seed: u64,
    ) -> Result<Case<T>, String> {
        let (graph, table) = (&plan.graph, binder.table);
        let kernel = plan.kernels.first().expect("a kernel's plan has the kernel");
        let mut rng = StdRng::seed_from_u64(seed);
        let host = reference::random_bindings(graph, dims, &mut rng).map_err(|e| e.to_string())?;
        let rows = testing::rows_to_check(m, &mut rng);
        let host_of = |t: usize| &host[&graph.tensors[t].name];
        let reads: Vec<usize> = table.inputs.iter().chain(table.weights).copied().collect();
        let read_bytes: usize = reads.iter().map(|&t| host_of(t).data.len()).sum();
        // What binding prepares is a copy of the weights, beside them.
        let copy_bytes: usize = if kernel.binds_b(graph) {
            table.weights.iter().map(|&t| host_of(t).data.len()).sum()
        } else {
            0
        };
        let bytes = read_bytes
            .saturating_add(copy_bytes)
            .saturating_add(m * n)
            .saturating_mul(size_of::<T>());
        let sets = rotation_sets(bytes);
        let gpu = |e: cudarc::driver::DriverError| e.to_string();
        let encoded: Vec<(usize, Vec<T>)> = reads.iter().map(|&t| (t, T::encode(host_of(t)))).collect();
        let shape = |t: usize| testing::shape_of(host_of(t)).expect("a kernel reads vectors and matrices");
        let tensor = |buffers: &[Option<Arc<CudaSlice<T>>>], t: usize| {
            let buffer = buffers[t]
                .clone()
                .expect("every tensor the call reads is on the device");
            Tensor::shared(buffer, shape(t)).map_err(|e| e.to_string())
        };
        let (mut inputs, mut bound, mut by_set) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..sets {
            // By tensor id.
            let mut buffers: Vec<Option<Arc<CudaSlice<T>>>> = vec![None; graph.tensors.len()];
            for (t, values) in &encoded {
                buffers[*t] = Some(Arc::new(stream.clone_htod(values).map_err(gpu)?));
            }
            inputs.push(
                table
                    .inputs
                    .iter()
                    .map(|&t| tensor(&buffers, t))
                    .collect::<Result<Vec<_>, _>>()?,
            );
            let weights = table
                .weights
                .iter()
                .map(|&t| tensor(&buffers, t))
                .collect::<Result<Vec<_>, _>>()?;
            // SAFETY: the table was made from this plan, with the launchers
            // of the unit rendered for its kernel (`LoadedUnit::load`).
            bound.push(unsafe { plan::bind(table, stream, weights) }.map_err(|e| e.to_string())?);
            by_set.push(buffers);
        }
        let operands = kernel
            .operands
            .iter()
            .map(|operand| {
                let copies = by_set
                    .iter()
                    .map(|buffers| buffers[operand.tensor.0].clone().expect("the kernel reads it"))
                    .collect();
                (operand.role, copies)
            })
            .collect();
        let intermediates = reference_intermediates(plan, bound[0].prepared());
        let output = &graph.tensor(kernel.output).name;
        let want = reference::evaluate_rows_with(graph, &host, &rows, intermediates)
            .map_err(|e| e.to_string())?
            .shift_remove(output)
            .ok_or_else(|| format!("the reference computed no `{output}`"))?;
        let outputs = (0..sets)
            .map(|_| stream.alloc_zeros::<T>(m * n))
            .collect::<Result<Vec<_>, _>>()
            .map_err(gpu)?;
        let stacked = match gemm.gate {
            None => None,
            Some(_) => {
                let weight = |role| {
                    let operand = kernel.operand(role).expect("a gated GEMM reads B and Up");
                    host_of(operand.0)
                };
                let both = T::encode(&stack(weight(Role::B), weight(Role::Up), gemm.b_layout));
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
            rows,
            want,
            inputs,
            bound,
            operands,
            outputs,
            stacked,
            stream: stream.clone(),
        })
    }

    fn sets(&self) -> usize {
        self.outputs.len()
    }

    /// A workspace for `unit`'s calls, grown to what a call at this case's
    /// shape needs ([`plan::reserve`]; zeroed: stream-K's flags start at 0
    /// and kernels leave them so). One per candidate, so that a candidate
    /// that leaves it otherwise harms no other.
    pub fn workspace_for(&self, unit: &LoadedUnit) -> Result<Workspace, String> {
        let mut workspace = Workspace::new();
        // SAFETY: as for [`plan::bind`] in [`Case::new`].
        unsafe {
            plan::reserve(
                unit.table,
                &mut workspace,
                Weights::Bound(&self.bound[0]),
                &self.stream,
                self.m,
            )
        }
        .map_err(|e| e.to_string())?;
        Ok(workspace)
    }

    /// Runs `unit` once on set 0, its output poisoned with NaN first, and
    /// compares the sampled rows with the reference ([`testing::compare`]):
    /// the relative L2 error, or what is wrong.
    pub fn check(&mut self, unit: &LoadedUnit, workspace: &mut Workspace) -> Result<f64, String> {
        let poison = vec![T::NAN; self.m * self.n];
        self.stream
            .memcpy_htod(&poison, &mut self.outputs[0])
            .map_err(|e| e.to_string())?;
        call(
            unit.table,
            workspace,
            (&self.bound[0], &self.inputs[0]),
            &self.stream,
            (&mut self.outputs[0], self.m, self.n),
        )
        .map_err(|e| e.to_string())?;
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
        units: &mut [(&LoadedUnit, &mut Workspace)],
        baseline: &mut LtGemm,
        with: Baseline,
        plan: TimingPlan,
        head: &mut CudaSlice<u8>,
    ) -> Result<Vec<Timing>, String> {
        let sets = self.sets();
        let (m, n) = (self.m, self.n);
        let Case {
            inputs,
            bound,
            operands,
            outputs,
            stacked,
            stream,
            ..
        } = self;
        let (inputs, bound, stream) = (&*inputs, &*bound, &*stream);
        // The candidates and the baseline write one output per set, one
        // call at a time.
        let outputs = RefCell::new(outputs);
        let outputs = &outputs;
        let mut calls: Vec<Box<dyn FnMut(usize) -> GpuResult<()> + '_>> = Vec::new();
        for (unit, workspace) in units.iter_mut() {
            let table = unit.table;
            calls.push(Box::new(move |i| {
                let set = i % sets;
                call(
                    table,
                    workspace,
                    (&bound[set], &inputs[set]),
                    stream,
                    (&mut outputs.borrow_mut()[set], m, n),
                )
            }));
        }
        let operand = |role: fn(&Role) -> bool, set: usize| {
            operands
                .iter()
                .find(|(r, _)| role(r))
                .map(|(_, copies)| &*copies[set])
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
                    baseline.run(stream, x, w, bias, residual, &mut outputs.borrow_mut()[set])
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

/// One call of `table` through the executor, as a bound graph struct's
/// call runs it: the `bound` weights and the `inputs` of one set, its
/// output `[m, n]` written into `output`, scratch from `workspace`.
fn call<T: HostElement>(
    table: &'static PlanTable,
    workspace: &mut Workspace,
    (bound, inputs): (&BoundWeights<'static, T>, &[Tensor<'static, T>]),
    stream: &Arc<CudaStream>,
    (output, m, n): (&mut CudaSlice<T>, usize, usize),
) -> GpuResult<()> {
    let inputs: Vec<&Tensor<'static, T>> = inputs.iter().collect();
    let mut y = TensorMut::new(output, [m, n])?;
    // SAFETY: the table was made from the candidate's plan with its unit's
    // launchers (`LoadedUnit::load`); the weights were bound by a table of
    // the same plan (see `Case::bound`).
    unsafe {
        plan::run(
            table,
            workspace,
            Weights::Bound(bound),
            stream,
            &inputs,
            &mut [&mut y],
        )
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
