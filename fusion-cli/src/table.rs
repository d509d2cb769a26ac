//! A plan rendered and built at run time, as the table the run time's one
//! executor runs ([`fusion::plan::PlanTable`], [`fusion::plan::bind`],
//! [`fusion::plan::run`]): the graph's declarations, each kernel's operand
//! per params field and what binding the weights computes for it, as the
//! generated wrappers' tables have them, and the launchers loaded from the
//! libraries nvcc built. `fusion run` makes one for a whole graph, `fusion
//! tune` one per candidate of a kernel (its plan alone, `Plan::kernel_plan`).
//! Not here: rendering and compiling (`tune::compile`), loading the
//! libraries (`tune::library`), or calling the executor.

use fusion::Arch;
use fusion::launch::{Dim, ErrorString, FoldedWeights, GraphDecl, TensorDecl};
use fusion::plan::{self, Bind, Fold, GemmOp, KernelEntry, KernelOp, Launchers, PlanTable, VendorRoute};
use fusion_compiler::fuse::{Composition, FusedKernel, Plan, Role};
use fusion_compiler::ir::{DType, Extent, Graph, TensorId};
use fusion_compiler::reference::Intermediates;

/// A graph's declarations as a generated wrapper has them, made once per
/// graph and kept for the process (the checks of `fusion::launch::Call` and
/// `fusion::weights::Binder` take them as `'static`).
#[derive(Clone, Copy, Debug)]
pub struct Declared {
    /// The graph's name and dynamic dims.
    pub graph: &'static GraphDecl,
    /// By tensor id.
    pub tensors: &'static [TensorDecl],
}

impl Declared {
    /// The declarations of `graph`, leaked so that they live for the
    /// process.
    pub fn of(graph: &Graph) -> Declared {
        fn leak(text: &str) -> &'static str {
            Box::leak(text.to_owned().into_boxed_str())
        }
        let dims: Vec<&'static str> = graph.dynamic_dims().map(|d| leak(&d.name)).collect();
        let decl = Box::leak(Box::new(GraphDecl {
            name: leak(&graph.name),
            dims: Box::leak(dims.into_boxed_slice()),
        }));
        let tensors: Vec<TensorDecl> = graph
            .tensors
            .iter()
            .map(|tensor| {
                let shape: Vec<Dim> = tensor
                    .shape
                    .iter()
                    .map(|extent| match *extent {
                        Extent::Static(n) => Dim::Static(n as usize),
                        Extent::Dynamic(d) => Dim::Dynamic(
                            graph
                                .dynamic_index(d)
                                .expect("a dynamic extent names a dynamic dim"),
                        ),
                    })
                    .collect();
                TensorDecl {
                    name: leak(&tensor.name),
                    shape: Box::leak(shape.into_boxed_slice()),
                }
            })
            .collect();
        Declared {
            graph: decl,
            tensors: Box::leak(tensors.into_boxed_slice()),
        }
    }

    /// The declarations of the tensors `ids`, in their order.
    pub fn of_ids(&self, ids: &[TensorId]) -> Vec<&'static TensorDecl> {
        let tensors = self.tensors;
        ids.iter().map(|t| &tensors[t.0]).collect()
    }
}

/// A table's list of one item, kept for the process (as the table is).
pub fn one<T>(item: T) -> &'static [T] {
    Box::leak(Box::new([item]))
}

/// `plan` as the table a generated wrapper's `__PLAN` holds, for `dtype`
/// on `arch` with `kernels` (each kernel's launchers and its library's
/// `_error_string`, in plan order) as its one variant each: what
/// [`plan::bind`] and [`plan::run`] take. Kept for the process (the checks
/// take declarations as `'static`).
pub fn plan_table(
    plan: &Plan,
    declared: Declared,
    dtype: DType,
    arch: Arch,
    kernels: Vec<(Launchers, ErrorString)>,
) -> &'static PlanTable {
    fn leak<T>(items: Vec<T>) -> &'static [T] {
        Box::leak(items.into_boxed_slice())
    }
    let graph = &plan.graph;
    let ids = |ids: &[TensorId]| leak(ids.iter().map(|t| t.0).collect());
    // Every unit's library has the same `_error_string`.
    let error_string = kernels.first().map(|&(_, error_string)| error_string);
    let entries = plan
        .kernels
        .iter()
        .zip(kernels)
        .enumerate()
        .map(|(index, (kernel, (launchers, _)))| KernelEntry {
            label: Box::leak(plan.kernel_label(index).into_boxed_str()),
            output: kernel.output.0,
            op: kernel_op(graph, kernel),
            launchers,
        })
        .collect();
    Box::leak(Box::new(PlanTable {
        schema: plan::SCHEMA_VERSION,
        graph: declared.graph,
        tensors: declared.tensors,
        inputs: ids(&graph.inputs),
        weights: ids(&graph.weights),
        outputs: ids(&graph.outputs),
        temporaries: ids(&plan.temporaries()),
        kernels: leak(entries),
        variants: one((dtype, arch)),
        error_string,
        archs: Some(one(arch)),
        compiled: Box::leak(format!("{dtype} on {}", arch.name()).into_boxed_str()),
    }))
}

/// A kernel's entry in the plan table: the operand of each params field
/// (`FusedKernel::gemm_operands`, `step_operands`) and what binding the
/// weights computes for it, as the generated wrappers' table has them.
fn kernel_op(graph: &Graph, kernel: &FusedKernel) -> KernelOp {
    let id = |t: Option<TensorId>| t.map(|t| t.0);
    match &kernel.composition {
        Composition::Gemm(gemm) => {
            let f = kernel.gemm_operands().map(|o| o.tensor.0);
            let bind = if kernel.prepares_weights(graph) {
                Bind::Fold(match (kernel.norm_foldable(graph), gemm.gate.is_some()) {
                    (true, true) => Fold::NormInterleave,
                    (true, false) => Fold::Norm,
                    (false, _) => Fold::Interleave,
                })
            } else if kernel.binds_b(graph) {
                Bind::Pad
            } else {
                Bind::Nothing
            };
            KernelOp::Gemm(GemmOp {
                a: f.a,
                b: f.b,
                b_up: f.b_up,
                bias: f.bias,
                residual: f.residual,
                multiplier: f.multiplier,
                gamma: f.gamma,
                beta: f.beta,
                eps: gemm.prologue.map_or(0.0, |p| p.eps) as f32,
                b_layout: gemm.b_layout,
                bind,
                // The guard is a build option: a plan rendered here keeps
                // every M fused.
                vendor: VendorRoute::NONE,
                // So is the model's choice per call: the launcher chooses.
                model: None,
            })
        }
        Composition::Norm(norm) => KernelOp::Norm {
            x: id(kernel.operand(Role::X)),
            gamma: id(kernel.operand(Role::Gamma)),
            beta: id(kernel.operand(Role::Beta)),
            eps: norm.eps as f32,
        },
        Composition::Elementwise(_) => KernelOp::Elementwise {
            x: id(kernel.operand(Role::X)),
            operands: kernel.step_operands().map(|o| o.map(|o| o.tensor.0)),
        },
    }
}

/// How the CPU reference computes a norm GEMM's normalized rows, to match
/// what the executor ran: a GEMM whose norm was not folded stores them in
/// the element type first, and the reference rounds them too. `folded` is
/// what [`plan::bind`] returned: an entry per kernel, or none at all where
/// no kernel binds its weights.
pub fn reference_intermediates(plan: &Plan, folded: &[Option<FoldedWeights>]) -> Intermediates {
    let unfolded_norm = plan.kernels.iter().enumerate().any(|(index, kernel)| {
        let folds = folded.get(index).is_some_and(Option::is_some) && kernel.norm_foldable(&plan.graph);
        matches!(&kernel.composition, Composition::Gemm(g) if g.prologue.is_some()) && !folds
    });
    if unfolded_norm {
        Intermediates::RoundedNorms
    } else {
        Intermediates::Exact
    }
}

/// What the tests of the tables made here compare them with, without a
/// device: the generated wrappers' tables, and params filled from any table
/// with stand-in launchers.
#[cfg(test)]
pub(crate) mod stand_ins {
    use super::*;
    use fusion::abi::{
        fusion_elementwise_params, fusion_fold_params, fusion_gemm_params, fusion_norm_params,
    };
    use half::f16;
    use std::ffi::{c_char, c_int, c_void};

    unsafe extern "C" fn gemm(_: *const fusion_gemm_params, _: *mut c_void) -> c_int {
        1
    }
    unsafe extern "C" fn query(_: *const fusion_gemm_params, _: *mut c_void, _: *mut u64) -> c_int {
        1
    }
    unsafe extern "C" fn fold(_: *const fusion_fold_params, _: *mut c_void) -> c_int {
        1
    }
    unsafe extern "C" fn norm(_: *const fusion_norm_params, _: *mut c_void) -> c_int {
        1
    }
    unsafe extern "C" fn elementwise(_: *const fusion_elementwise_params, _: *mut c_void) -> c_int {
        1
    }
    unsafe extern "C" fn error_string(_: c_int) -> *const c_char {
        c"stand-in".as_ptr()
    }

    /// Stand-ins for the launchers a library built for `kernel` of `graph`
    /// exports, as `SharedLibrary::launchers` looks them up: the params
    /// are filled without a device, and nothing is launched.
    pub fn launchers(kernel: &FusedKernel, graph: &Graph) -> (Launchers, ErrorString) {
        let launch = match kernel.composition {
            Composition::Gemm(_) => Launchers::Gemm {
                launch: &[gemm],
                query: &[query],
                folded: if kernel.norm_foldable(graph) {
                    &[(gemm, query)]
                } else {
                    &[]
                },
                fold: if kernel.prepares_weights(graph) {
                    &[fold]
                } else {
                    &[]
                },
            },
            Composition::Norm(_) => Launchers::Norm(&[norm]),
            Composition::Elementwise(_) => Launchers::Elementwise(&[elementwise]),
        };
        (launch, error_string as ErrorString)
    }

    /// The generated wrappers of the shipped graphs (f16 where generic):
    /// each one's table, graph and the archs it was built for.
    pub fn generated() -> [(&'static PlanTable, Graph, &'static [Arch]); 8] {
        use fusion::kernels as k;
        [
            (
                k::SwigluFfn::<f16>::PLAN,
                k::SwigluFfn::<f16>::graph(),
                k::SwigluFfn::<f16>::ARCHS,
            ),
            (
                k::FfnSublayer::<f16>::PLAN,
                k::FfnSublayer::<f16>::graph(),
                k::FfnSublayer::<f16>::ARCHS,
            ),
            (
                k::LayernormGemmSiluGluResidual::<f16>::PLAN,
                k::LayernormGemmSiluGluResidual::<f16>::graph(),
                k::LayernormGemmSiluGluResidual::<f16>::ARCHS,
            ),
            (
                k::LayernormGemm::<f16>::PLAN,
                k::LayernormGemm::<f16>::graph(),
                k::LayernormGemm::<f16>::ARCHS,
            ),
            (
                k::GemmBiasGelu::<f16>::PLAN,
                k::GemmBiasGelu::<f16>::graph(),
                k::GemmBiasGelu::<f16>::ARCHS,
            ),
            (
                k::Gpt2Mlp::<f16>::PLAN,
                k::Gpt2Mlp::<f16>::graph(),
                k::Gpt2Mlp::<f16>::ARCHS,
            ),
            (k::SiluMul::PLAN, k::SiluMul::graph(), k::SiluMul::ARCHS),
            (
                k::Layernorm::<f16>::PLAN,
                k::Layernorm::<f16>::graph(),
                k::Layernorm::<f16>::ARCHS,
            ),
        ]
    }

    /// Each kernel's params as `table` fills them for one call: every
    /// dynamic dim bound from the tensors' shapes (the `i`th dim `24 + 8 i`),
    /// tensor `t` at address `(t + 1) << 12`, the flags given, and the
    /// weights prepared (at fixed addresses) where the table binds them.
    pub fn filled(table: &'static PlanTable, flags: u32, prepared: bool) -> Vec<(String, Vec<u8>)> {
        let mut dims = fusion::launch::ShapeDims::new(table.graph);
        let extent = |d: &Dim| match *d {
            Dim::Static(n) => n,
            Dim::Dynamic(i) => 24 + 8 * i,
        };
        for &t in table.inputs.iter().chain(table.weights).chain(table.outputs) {
            let decl = &table.tensors[t];
            let extents: Vec<usize> = decl.shape.iter().map(extent).collect();
            assert!(dims.bind(decl, &extents).unwrap());
        }
        let address: Vec<Option<u64>> = (0..table.tensors.len())
            .map(|t| Some((t as u64 + 1) << 12))
            .collect();
        table
            .kernels
            .iter()
            .map(|kernel| {
                let binds = matches!(&kernel.op, KernelOp::Gemm(g) if g.bind != Bind::Nothing);
                let weights = (prepared && binds).then_some((0xa000_0000, 0xb000_0000, 4160));
                let params = plan::fill(table, kernel, &dims, &address, flags, weights).unwrap();
                (kernel.label.to_owned(), params.field_bytes())
            })
            .collect()
    }
}
