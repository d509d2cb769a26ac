//! A graph's plan as data, and the one executor that runs any such plan.
//!
//! The build writes a [`PlanTable`] per graph (`static` data in the
//! generated wrappers): the kernels in order, each with the operand of every
//! pointer field of its params struct, what binding the weights computes
//! for it (a norm folded into its weight, a gated pair interleaved, rows
//! padded), the intermediates the workspace holds, and per (dtype, arch)
//! the launchers compiled for it. `fusion run` builds the same table at run
//! time from a plan it renders and loads. [`bind`] and [`run`] then do what
//! a call does for every graph, whoever made the table: every check of
//! [`crate::launch::Call`], the workspace, the params ([`fill`], which needs
//! no device) and the launches.
//!
//! Not the API users call (they call the generated structs); public so that
//! generated code in another crate and the command-line tools reach it.

use crate::abi::{
    ErrorString, FUSION_ELEMENTWISE_MAX_STEPS, FoldWeights, Launcher, WorkspaceBytes,
    fusion_elementwise_params, fusion_fold_params, fusion_gemm_params, fusion_norm_params,
};
use crate::device::Arch;
use crate::error::{Error, Result};
use crate::launch::{Call, FoldedWeights, GraphDecl, TensorDecl, Workspace, not_compiled};
pub use crate::route_model::RouteModel;
use crate::tensor::{Element, Shape, Tensor, TensorMut};
pub use crate::tile_model::TileModel;
pub use crate::vendor::LtEpilogue as VendorEpilogue;
use crate::weights::{Binder, BoundWeights, TensorFile, TensorNames};
use cudarc::driver::CudaStream;
use cudarc::driver::{CudaSlice, DevicePtr};
use fusion_compiler::ir::{DType, WeightLayout};
use std::ffi::c_void;
use std::ops::Range;
use std::sync::Arc;

/// The version of [`PlanTable`]'s layout and of the launcher ABI
/// ([`crate::abi`]) its launchers take. Generated code asserts it at compile
/// time ([`expect_schema`]); [`run`] and [`bind`] refuse a table of another
/// ([`Error::PlanSchema`]).
pub const SCHEMA_VERSION: u32 = 3;

/// Fails the build of generated code written for another schema: generated
/// code says `const _: () = fusion::plan::expect_schema(3);`.
///
/// # Panics
///
/// At compile time, where `version` is not [`SCHEMA_VERSION`].
pub const fn expect_schema(version: u32) {
    assert!(
        version == SCHEMA_VERSION,
        "this generated code was written for another version of fusion's plan tables: rebuild it with the \
         fusion-compiler that matches this fusion"
    );
}

/// One graph's plan, as its kernels are called.
#[derive(Debug)]
pub struct PlanTable {
    /// [`SCHEMA_VERSION`] of the code that wrote it.
    pub schema: u32,
    pub graph: &'static GraphDecl,
    /// Every tensor of the graph, by tensor id.
    pub tensors: &'static [TensorDecl],
    /// Tensor ids of the inputs, the weights and the outputs, in the order
    /// calls pass them (inputs, then weights, then outputs).
    pub inputs: &'static [usize],
    pub weights: &'static [usize],
    pub outputs: &'static [usize],
    /// The intermediates written between kernels: a workspace buffer each.
    pub temporaries: &'static [usize],
    pub kernels: &'static [KernelEntry],
    /// The (dtype, arch) of each kernel's launchers, index for index.
    pub variants: &'static [(DType, Arch)],
    /// The library's `<lib>_error_string`; `None` where no launcher was
    /// compiled.
    pub error_string: Option<ErrorString>,
    /// The generations the launchers were compiled for; `None`: none were
    /// (a build without nvcc), and a call fails as the run time's own
    /// dispatch would.
    pub archs: Option<&'static [Arch]>,
    /// What was compiled, for [`not_compiled`]: `f16 on sm80, sm90`.
    pub compiled: &'static str,
}

/// One kernel of the plan.
#[derive(Debug)]
pub struct KernelEntry {
    /// `kernel #0 (gemm_bias_gelu)`, as errors name it.
    pub label: &'static str,
    /// The tensor it writes.
    pub output: usize,
    pub op: KernelOp,
    /// Its launchers, one per [`PlanTable::variants`].
    pub launchers: Launchers,
}

/// What a kernel computes, as the fields of its params struct take it:
/// each operand is a tensor id, `None` for a null pointer.
#[derive(Debug)]
pub enum KernelOp {
    Gemm(GemmOp),
    Norm {
        x: Option<usize>,
        gamma: Option<usize>,
        beta: Option<usize>,
        eps: f32,
    },
    Elementwise {
        x: Option<usize>,
        /// Step i's operand at index i (abi.h).
        operands: [Option<usize>; FUSION_ELEMENTWISE_MAX_STEPS],
    },
}

/// A GEMM: the operand of each pointer field of `fusion_gemm_params`.
#[derive(Clone, Copy, Debug)]
pub struct GemmOp {
    pub a: Option<usize>,
    pub b: Option<usize>,
    pub b_up: Option<usize>,
    pub bias: Option<usize>,
    pub residual: Option<usize>,
    pub multiplier: Option<usize>,
    pub gamma: Option<usize>,
    pub beta: Option<usize>,
    /// The norm prologue's epsilon (0 without one).
    pub eps: f32,
    /// How B is stored.
    pub b_layout: WeightLayout,
    /// What binding the weights computes for it.
    pub bind: Bind,
    /// The Ms at which the guard runs it on the vendor path.
    pub vendor: VendorRoute,
    /// Where a build with the model (`FUSION_SELECT=model`) left its tile
    /// to the call (N or K dynamic): the tiers and the model that chooses
    /// among them per call; `None`: its launcher chooses.
    pub model: Option<&'static TileModel>,
}

/// Where the guard sends a GEMM to cuBLASLt (`fusion::vendor`): the M
/// ranges the build predicted or measured the fused kernel to lose on one
/// GPU generation (N and K static), or the models that decide per call (N
/// or K dynamic), cuBLASLt's epilogue for the GEMM's steps (its bias is
/// the GEMM's bias, its residual rides on `beta·C`), and for a GEMM with a
/// norm prologue the standalone norm kernel that first writes A's
/// normalized rows into the call's scratch ([`vendor_route`] says how a
/// norm folded into a bound weight is served). Taken only on that
/// generation and where [`crate::vendor::routes_enabled`] says so; else
/// the fused kernel runs.
#[derive(Clone, Copy, Debug)]
pub struct VendorRoute {
    /// The generation the ranges were decided for.
    pub arch: Arch,
    /// Inclusive `(smallest M, largest M)` ranges, `u32::MAX` as the
    /// largest for every M above; empty: always fused.
    pub ms: &'static [(u32, u32)],
    /// cuBLASLt's epilogue.
    pub epilogue: VendorEpilogue,
    /// Where the build left the verdict to the call (N or K dynamic): the
    /// models that decide each call's M bucket at its N and K.
    pub per_call: Option<&'static RouteModel>,
    /// For a GEMM with a norm prologue, per variant ([`PlanTable::variants`],
    /// index for index): the standalone norm kernel of the variant's dtype
    /// that runs before cuBLASLt. Empty for a GEMM without one (a norm GEMM
    /// without it stays fused).
    pub norm: &'static [Launcher<fusion_norm_params>],
}

impl VendorRoute {
    /// No M: the fused kernel always.
    pub const NONE: VendorRoute = VendorRoute {
        arch: Arch::Sm90,
        ms: &[],
        epilogue: VendorEpilogue::None,
        per_call: None,
        norm: &[],
    };

    /// Whether a call on `arch` may take the route, at some M or shape.
    pub fn may_take(&self, arch: Arch) -> bool {
        arch == self.arch && (!self.ms.is_empty() || self.per_call.is_some())
    }

    /// Whether a call of `m` rows on `arch` is in one of its ranges.
    pub fn covers(&self, arch: Arch, m: i64) -> bool {
        arch == self.arch
            && self
                .ms
                .iter()
                .any(|&(low, high)| i64::from(low) <= m && (high == u32::MAX || m <= i64::from(high)))
    }

    /// Whether a call of `variant` on `arch` filled as `p` takes the route:
    /// its M is in one of the ranges, or the models decide so at its (M, N,
    /// K) ([`RouteModel::vendor`], its fused kernel running the tier
    /// `tiles` names).
    pub fn takes(
        &self,
        arch: Arch,
        variant: usize,
        tiles: Option<&TileModel>,
        p: &fusion_gemm_params,
    ) -> bool {
        self.covers(arch, p.m)
            || (arch == self.arch
                && self
                    .per_call
                    .is_some_and(|model| model.vendor(variant, tiles, p.m, p.n, p.k)))
    }
}

impl GemmOp {
    /// No operand, no norm, `[N, K]` weights, nothing bound: what a table
    /// entry's fields start from (`..GemmOp::EMPTY`).
    pub const EMPTY: GemmOp = GemmOp {
        a: None,
        b: None,
        b_up: None,
        bias: None,
        residual: None,
        multiplier: None,
        gamma: None,
        beta: None,
        eps: 0.0,
        b_layout: WeightLayout::NK,
        bind: Bind::Nothing,
        vendor: VendorRoute::NONE,
        model: None,
    };
}

/// What a graph struct computes once for a GEMM when it binds the weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bind {
    /// Nothing: B is not a weight.
    Nothing,
    /// B is a plain bound weight, copied with its rows padded where that
    /// reads faster ([`FoldedWeights::pad`]).
    Pad,
    /// `_fold_weights` prepares B (the kernel then reads it with `b_up`
    /// null).
    Fold(Fold),
}

/// What `_fold_weights` does to a GEMM's bound weights.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fold {
    /// The norm prologue folded into B (the kernel then runs its folded
    /// launcher).
    Norm,
    /// A gated pair's gate and up weights interleaved into one.
    Interleave,
    /// Both: the norm folded into the interleaved pair.
    NormInterleave,
}

impl Fold {
    fn norm(self) -> bool {
        matches!(self, Fold::Norm | Fold::NormInterleave)
    }
    fn gated(self) -> bool {
        matches!(self, Fold::Interleave | Fold::NormInterleave)
    }
}

/// A kernel's launchers, one per (dtype, arch) of [`PlanTable::variants`].
#[derive(Clone, Copy, Debug)]
pub enum Launchers {
    Gemm {
        launch: &'static [Launcher<fusion_gemm_params>],
        query: &'static [WorkspaceBytes<fusion_gemm_params>],
        /// The folded form's launcher and query, for a kernel whose norm
        /// folds into its weight (else empty).
        folded: &'static [(Launcher<fusion_gemm_params>, WorkspaceBytes<fusion_gemm_params>)],
        /// `_fold_weights`, for a kernel that prepares its weights (else
        /// empty).
        fold: &'static [FoldWeights<fusion_fold_params>],
    },
    Norm(&'static [Launcher<fusion_norm_params>]),
    Elementwise(&'static [Launcher<fusion_elementwise_params>]),
}

/// One kernel's launchers for the call's (dtype, arch).
#[derive(Clone, Copy, Debug)]
enum Launch {
    Gemm {
        launch: Launcher<fusion_gemm_params>,
        query: WorkspaceBytes<fusion_gemm_params>,
        folded: Option<(Launcher<fusion_gemm_params>, WorkspaceBytes<fusion_gemm_params>)>,
        fold: Option<FoldWeights<fusion_fold_params>>,
    },
    Norm(Launcher<fusion_norm_params>),
    Elementwise(Launcher<fusion_elementwise_params>),
}

impl Launchers {
    /// The launchers of variant `index`.
    fn get(&self, index: usize) -> Launch {
        match *self {
            Launchers::Gemm {
                launch,
                query,
                folded,
                fold,
            } => Launch::Gemm {
                launch: launch[index],
                query: query[index],
                folded: folded.get(index).copied(),
                fold: fold.get(index).copied(),
            },
            Launchers::Norm(launch) => Launch::Norm(launch[index]),
            Launchers::Elementwise(launch) => Launch::Elementwise(launch[index]),
        }
    }
}

/// What a generated struct's `graph()` returns, beside its plan table
/// (which has the tensors' names and shapes): the rest of the graph as the
/// build script checked it.
#[derive(Debug)]
pub struct DeclaredGraph {
    pub doc: Option<&'static str>,
    /// Every dim in declaration order, `None` for a dynamic one.
    pub dims: &'static [(&'static str, Option<u64>)],
    /// Each tensor's element type as declared, by tensor id.
    pub dtypes: &'static [DType],
    /// Each op's kind, inputs and output (tensor ids), in order.
    pub ops: &'static [(OpCode, &'static [usize], usize)],
}

/// [`fusion_compiler::ir::OpKind`] as a `static` can hold it: an
/// activation by its name in the op table.
#[derive(Clone, Copy, Debug)]
pub enum OpCode {
    MatMul(WeightLayout),
    BiasAdd,
    Add,
    Mul,
    Activation(&'static str),
    LayerNorm(f64),
    RmsNorm(f64),
}

/// The graph `table` runs, from its declarations and `declared`: what a
/// generated struct's `graph()` returns. Nothing is parsed.
///
/// # Panics
///
/// Where `declared` names an activation the op table lacks, which the
/// build script that wrote it read from the same table.
pub fn graph(table: &PlanTable, declared: &DeclaredGraph) -> fusion_compiler::ir::Graph {
    use crate::launch::Dim;
    use fusion_compiler::diagnostic::Span;
    use fusion_compiler::ir::{
        Activation, DimDef, DimId, Extent, Graph, Op, OpKind, TensorDesc, TensorId, TensorKind,
    };
    // The graph's index of each dynamic dim.
    let dynamic: Vec<usize> = (0..declared.dims.len())
        .filter(|&d| declared.dims[d].1.is_none())
        .collect();
    let ids = |ids: &[usize]| ids.iter().map(|&t| TensorId(t)).collect::<Vec<_>>();
    let tensors = table
        .tensors
        .iter()
        .zip(declared.dtypes)
        .enumerate()
        .map(|(t, (decl, &dtype))| TensorDesc {
            name: decl.name.to_owned(),
            dtype,
            shape: decl
                .shape
                .iter()
                .map(|&d| match d {
                    Dim::Static(n) => Extent::Static(n as u64),
                    Dim::Dynamic(i) => Extent::Dynamic(DimId(dynamic[i])),
                })
                .collect(),
            kind: if table.inputs.contains(&t) {
                TensorKind::Input
            } else if table.weights.contains(&t) {
                TensorKind::Weight
            } else if table.outputs.contains(&t) {
                TensorKind::Output
            } else {
                TensorKind::Intermediate
            },
            // A graph with FP8 tensors has no plan table: the build refuses it.
            scale: None,
            span: Span::None,
        })
        .collect();
    let ops = declared
        .ops
        .iter()
        .map(|&(kind, inputs, output)| Op {
            kind: match kind {
                OpCode::MatMul(b_layout) => OpKind::MatMul { b_layout },
                OpCode::BiasAdd => OpKind::BiasAdd,
                OpCode::Add => OpKind::Add,
                OpCode::Mul => OpKind::Mul,
                OpCode::Activation(name) => OpKind::Activation(
                    Activation::named(name).expect("the build script's op table has this activation"),
                ),
                OpCode::LayerNorm(eps) => OpKind::LayerNorm { eps },
                OpCode::RmsNorm(eps) => OpKind::RmsNorm { eps },
            },
            inputs: ids(inputs),
            output: TensorId(output),
            span: Span::None,
        })
        .collect();
    Graph {
        name: table.graph.name.to_owned(),
        doc: declared.doc.map(str::to_owned),
        dims: declared
            .dims
            .iter()
            .map(|&(name, size)| DimDef {
                name: name.to_owned(),
                size,
                span: Span::None,
            })
            .collect(),
        tensors,
        ops,
        inputs: ids(table.inputs),
        weights: ids(table.weights),
        outputs: ids(table.outputs),
    }
}

/// One kernel's filled params.
#[derive(Clone, Copy, Debug)]
pub enum Params {
    Gemm(fusion_gemm_params),
    Norm(fusion_norm_params),
    Elementwise(fusion_elementwise_params),
}

/// The extents a call has bound, as [`fill`] reads them: a
/// [`Call`]'s, or dims bound from shapes alone (for checking params
/// without a device).
pub trait Extents {
    /// [`Call::matrix`].
    fn matrix(&self, decl: &TensorDecl) -> Result<(i64, i64)>;
    /// [`Call::reduced_matrix`].
    fn reduced_matrix(&self, decl: &TensorDecl, output: &TensorDecl) -> Result<(i64, i64)>;
}

impl Extents for Call<'_> {
    fn matrix(&self, decl: &TensorDecl) -> Result<(i64, i64)> {
        Call::matrix(self, decl)
    }
    fn reduced_matrix(&self, decl: &TensorDecl, output: &TensorDecl) -> Result<(i64, i64)> {
        Call::reduced_matrix(self, decl, output)
    }
}

impl PlanTable {
    /// The index of `dtype` on `arch` among the variants, or the error that
    /// says what was compiled instead.
    fn variant(&self, dtype: DType, arch: Arch) -> Result<usize> {
        self.variants
            .iter()
            .position(|&v| v == (dtype, arch))
            .ok_or_else(|| not_compiled(self.graph.name, dtype, arch, self.compiled))
    }

    /// The library's error string; there is one wherever a variant is.
    fn error_string(&self) -> ErrorString {
        self.error_string
            .expect("a table with variants names its library's error string")
    }

    /// The generation a call on `stream` runs.
    fn arch(&self, stream: &CudaStream) -> Result<Arch> {
        match self.archs {
            Some(archs) => crate::device::arch_among(stream, archs),
            None => crate::device::arch_among(stream, &crate::device::compiled()),
        }
    }

    fn check_schema(&self) -> Result<()> {
        if self.schema == SCHEMA_VERSION {
            return Ok(());
        }
        Err(Error::PlanSchema {
            graph: self.graph.name.to_owned(),
            table: self.schema,
            runtime: SCHEMA_VERSION,
        })
    }

    fn decl(&'static self, tensor: usize) -> &'static TensorDecl {
        &self.tensors[tensor]
    }
}

fn pointer(address: Option<u64>) -> *const c_void {
    address.map_or(std::ptr::null(), |a| a as *const c_void)
}

/// `kernel`'s params: its operands' device addresses from `address` (by
/// tensor id; an operand without one is null), its sizes from `extents`,
/// the GEMM `flags`, and where binding prepared its weight, that weight's
/// `(address, column terms, row stride)`. The workspace fields stay empty:
/// [`run`] fills them once every kernel has said what it needs.
pub fn fill(
    table: &PlanTable,
    kernel: &KernelEntry,
    extents: &dyn Extents,
    address: &[Option<u64>],
    flags: u32,
    prepared: Option<(u64, u64, i64)>,
) -> Result<Params> {
    let at = |t: Option<usize>| pointer(t.and_then(|t| address[t]));
    let out = address[kernel.output].unwrap_or_default() as *mut c_void;
    let out_decl = &table.tensors[kernel.output];
    Ok(match &kernel.op {
        KernelOp::Gemm(gemm) => {
            let (m, k) = extents.reduced_matrix(&table.tensors[gemm.a.unwrap_or(kernel.output)], out_decl)?;
            let n = extents.matrix(out_decl)?.1;
            let mut p = fusion_gemm_params {
                a: at(gemm.a),
                b: at(gemm.b),
                b_up: at(gemm.b_up),
                c: out,
                bias: at(gemm.bias),
                residual: at(gemm.residual),
                multiplier: at(gemm.multiplier),
                gamma: at(gemm.gamma),
                beta: at(gemm.beta),
                col_terms: std::ptr::null(),
                m,
                n,
                k,
                ldb: 0,
                eps: gemm.eps,
                flags,
                workspace: std::ptr::null_mut(),
                workspace_bytes: 0,
                scale_a: std::ptr::null(),
                scale_b: std::ptr::null(),
            };
            match (gemm.bind, prepared) {
                // B is its prepared form, which a gated GEMM's up weight
                // is part of.
                (Bind::Fold(_), Some((b, col_terms, ldb))) => {
                    p.b = b as *const c_void;
                    p.ldb = ldb;
                    p.b_up = std::ptr::null();
                    p.col_terms = col_terms as *const c_void;
                }
                // A plain weight, read from its copy with padded rows.
                (Bind::Pad, Some((b, _, ldb))) => {
                    p.b = b as *const c_void;
                    p.ldb = ldb;
                }
                _ => {}
            }
            Params::Gemm(p)
        }
        KernelOp::Norm { x, gamma, beta, eps } => {
            let (m, k) = extents.matrix(out_decl)?;
            Params::Norm(fusion_norm_params {
                x: at(*x),
                y: out,
                gamma: at(*gamma),
                beta: at(*beta),
                m,
                k,
                eps: *eps,
            })
        }
        KernelOp::Elementwise { x, operands } => {
            let (m, n) = extents.matrix(out_decl)?;
            Params::Elementwise(fusion_elementwise_params {
                x: at(*x),
                y: out,
                operands: operands.map(at),
                m,
                n,
            })
        }
    })
}

impl Params {
    /// Every field's bytes in declaration order (no padding), to compare
    /// the params of two paths.
    pub fn field_bytes(&self) -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut ptr = |p: *const c_void| bytes.extend_from_slice(&(p as u64).to_ne_bytes());
        match self {
            Params::Gemm(p) => {
                for field in p.pointers() {
                    ptr(field);
                }
                for n in [p.m, p.n, p.k, p.ldb] {
                    bytes.extend_from_slice(&n.to_ne_bytes());
                }
                bytes.extend_from_slice(&p.eps.to_ne_bytes());
                bytes.extend_from_slice(&p.flags.to_ne_bytes());
                bytes.extend_from_slice(&p.workspace_bytes.to_ne_bytes());
            }
            Params::Norm(p) => {
                for field in [p.x, p.y.cast_const(), p.gamma, p.beta] {
                    ptr(field);
                }
                for n in [p.m, p.k] {
                    bytes.extend_from_slice(&n.to_ne_bytes());
                }
                bytes.extend_from_slice(&p.eps.to_ne_bytes());
            }
            Params::Elementwise(p) => {
                for field in [p.x, p.y.cast_const()].into_iter().chain(p.operands) {
                    ptr(field);
                }
                for n in [p.m, p.n] {
                    bytes.extend_from_slice(&n.to_ne_bytes());
                }
            }
        }
        bytes
    }
}

/// Reads a graph's weights from a safetensors file, each under the name
/// `names` gives it, all checked (present, element type, shape) before any
/// is copied to `stream`'s device. `N` is the number of weights.
pub fn load_weights<T: Element, const N: usize>(
    table: &'static PlanTable,
    stream: &Arc<CudaStream>,
    file: &TensorFile,
    names: &TensorNames,
) -> Result<[Tensor<'static, T>; N]> {
    assert_eq!(table.weights.len(), N, "one tensor per weight of the plan table");
    let mut binder = Binder::new(table.graph, file, names);
    let decls: Vec<&'static TensorDecl> = table.weights.iter().map(|&t| table.decl(t)).collect();
    binder.check::<T>(&decls)?;
    let mut uploaded = Vec::with_capacity(N);
    for decl in decls {
        uploaded.push(binder.upload(stream, decl)?);
    }
    Ok(uploaded
        .try_into()
        .unwrap_or_else(|_| unreachable!("one tensor per weight")))
}

/// The weights of one call of [`run`]: given with it, or bound once.
#[derive(Debug)]
pub enum Weights<'a, 'w, T> {
    /// Every weight, in the table's order, read as given: nothing was
    /// prepared (a free function's call, which folds a norm and
    /// interleaves a gated pair into its scratch on every call).
    PerCall(&'a [&'a Tensor<'w, T>]),
    /// What [`bind`] kept and prepared.
    Bound(&'a BoundWeights<'w, T>),
}

impl<T> Clone for Weights<'_, '_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T> Copy for Weights<'_, '_, T> {}

/// The tensors a kernel reads: those it reads as given, and those that the
/// copy binding prepared for it stands in for (where `prepared`): B (and
/// a gated GEMM's up weight) for a padded, folded or interleaved weight,
/// and gamma and beta where the norm folds (the folded launcher reads no
/// gamma or beta, abi.h).
fn operands(op: &KernelOp, prepared: bool) -> (Vec<usize>, Vec<usize>) {
    let mut given = Vec::new();
    let mut replaced = Vec::new();
    match op {
        KernelOp::Gemm(g) => {
            given.extend([g.a, g.bias, g.residual, g.multiplier].into_iter().flatten());
            // A padded copy is B's alone ([`fill`] reads any up weight as
            // given); a fold's holds a gated pair's both halves.
            let (weight, up, norm) = match (g.bind, prepared) {
                (Bind::Pad, true) => (true, false, false),
                (Bind::Fold(fold), true) => (true, true, fold.norm()),
                _ => (false, false, false),
            };
            for (operand, replaced_here) in [(g.b, weight), (g.b_up, up), (g.gamma, norm), (g.beta, norm)] {
                match (operand, replaced_here) {
                    (Some(t), true) => replaced.push(t),
                    (Some(t), false) => given.push(t),
                    (None, _) => {}
                }
            }
        }
        KernelOp::Norm { x, gamma, beta, .. } => given.extend([*x, *gamma, *beta].into_iter().flatten()),
        KernelOp::Elementwise { x, operands } => {
            given.extend(std::iter::once(*x).chain(operands.iter().copied()).flatten());
        }
    }
    (given, replaced)
}

/// What became of weight `t`, which `kernel`'s prepared copy stands in for:
/// for [`BoundWeights::get`].
fn replaced_by(table: &PlanTable, kernel: &KernelEntry, t: usize) -> String {
    let KernelOp::Gemm(g) = &kernel.op else {
        unreachable!("only a GEMM's weights are prepared")
    };
    let name = |t: Option<usize>| t.map_or("?", |t| table.tensors[t].name);
    let label = kernel.label;
    if Some(t) == g.gamma || Some(t) == g.beta {
        return format!("{label} folded it into its copy of `{}`", name(g.b));
    }
    match g.bind {
        Bind::Pad => format!("{label} reads a copy of it with its rows padded"),
        Bind::Fold(Fold::Norm) => format!(
            "{label} reads a copy of it with the norm's `{}` folded in",
            name(g.gamma)
        ),
        Bind::Fold(Fold::Interleave) => format!(
            "{label} reads `{}` and `{}` interleaved into one copy",
            name(g.b),
            name(g.b_up)
        ),
        Bind::Fold(Fold::NormInterleave) => format!(
            "{label} reads `{}` and `{}` interleaved into one copy, the norm's `{}` folded in",
            name(g.b),
            name(g.b_up),
            name(g.gamma)
        ),
        Bind::Nothing => unreachable!("a kernel that binds nothing prepares nothing"),
    }
}

/// Binds the weights (`weights`, in the table's order): checks each (shape,
/// dims, context, alignment) and computes once what the kernels need from
/// them alone: a norm folded into its GEMM's weight, a gated pair
/// interleaved, a plain weight's rows padded. What it returns keeps only
/// what the kernels read: a weight that a prepared copy replaces is
/// dropped (freed, where it was owned and not shared) once that copy
/// exists. Returns once that work is done.
///
/// # Safety
///
/// `table` must say truly what its launchers read and write: every
/// kernel's operands name tensors of the shapes and element type its
/// launchers take, and each launcher is the symbol of the kind its entry
/// says. The checks here compare the tensors with the table, not the table
/// with the kernels, so a table that lies sends a kernel outside its
/// buffers. The tables fusion-compiler generates and those `fusion run`
/// builds from a plan are true by construction.
pub unsafe fn bind<'w, T: Element>(
    table: &'static PlanTable,
    stream: &Arc<CudaStream>,
    weights: Vec<Tensor<'w, T>>,
) -> Result<BoundWeights<'w, T>> {
    assert_eq!(
        weights.len(),
        table.weights.len(),
        "one tensor per weight of the plan table"
    );
    let shapes = weights.iter().map(Tensor::shape).collect();
    let mut given = Given(weights.into_iter().map(Some).collect());
    // SAFETY: as the caller promises.
    unsafe { bind_each(table, stream, shapes, &mut given) }
}

/// Where binding gets the weights, by their index in the table's weights,
/// each asked for once.
trait WeightSource<'w, T> {
    /// Weight `w`, whole, on the device.
    fn fetch(&mut self, w: usize) -> Result<Tensor<'w, T>>;
    /// Rows `rows` of weight `w` (a matrix) in host memory, where the
    /// source reads weights a part at a time (`None` where it does not):
    /// a gated pair is then interleaved part by part, never held whole.
    fn rows(&mut self, w: usize, rows: Range<usize>) -> Option<Result<Vec<T>>>;
}

/// Weights given whole, on the device.
struct Given<'w, T>(Vec<Option<Tensor<'w, T>>>);

impl<'w, T> WeightSource<'w, T> for Given<'w, T> {
    fn fetch(&mut self, w: usize) -> Result<Tensor<'w, T>> {
        Ok(self.0[w].take().expect("binding takes each weight once"))
    }
    fn rows(&mut self, _w: usize, _rows: Range<usize>) -> Option<Result<Vec<T>>> {
        None
    }
}

/// Weights read from a safetensors file, checked already.
struct FromFile<'f, 's> {
    binder: Binder<'f>,
    decls: Vec<&'static TensorDecl>,
    stream: &'s Arc<CudaStream>,
}

impl<T: Element> WeightSource<'static, T> for FromFile<'_, '_> {
    fn fetch(&mut self, w: usize) -> Result<Tensor<'static, T>> {
        self.binder.upload(self.stream, self.decls[w])
    }
    fn rows(&mut self, w: usize, rows: Range<usize>) -> Option<Result<Vec<T>>> {
        Some(self.binder.rows(self.decls[w], rows))
    }
}

/// Reads a graph's weights from a safetensors file (each under the name
/// `names` gives it, all checked before any is copied) and binds them
/// ([`bind`]) one kernel at a time: a kernel's weights are copied to the
/// device, its copy is prepared, and the weights that copy replaces are
/// freed before the next kernel's are read. The device memory at its
/// height is what the kernels before have kept, plus one kernel's weights
/// and its copy; a gated pair in `[N, K]` layout read by no other kernel
/// is copied and interleaved an eighth of its rows at a time, so that
/// beside its interleaved copy it takes a quarter of one of its weights,
/// never the pair.
///
/// # Safety
///
/// As [`bind`].
pub unsafe fn bind_file<T: Element>(
    table: &'static PlanTable,
    stream: &Arc<CudaStream>,
    file: &TensorFile,
    names: &TensorNames,
) -> Result<BoundWeights<'static, T>> {
    let mut binder = Binder::new(table.graph, file, names);
    let decls: Vec<&'static TensorDecl> = table.weights.iter().map(|&t| table.decl(t)).collect();
    let shapes = binder.check::<T>(&decls)?;
    let mut source = FromFile {
        binder,
        decls,
        stream,
    };
    // SAFETY: as the caller promises.
    unsafe { bind_each(table, stream, shapes, &mut source) }
}

/// [`bind`], with each weight from `source`, when the first kernel that
/// reads it is bound; `shapes` are their shapes, checked before any is
/// fetched.
unsafe fn bind_each<'w, T: Element>(
    table: &'static PlanTable,
    stream: &Arc<CudaStream>,
    shapes: Vec<Shape>,
    source: &mut dyn WeightSource<'w, T>,
) -> Result<BoundWeights<'w, T>> {
    table.check_schema()?;
    let arch = table.arch(stream)?;
    // Every weight's shape, and the dims they share, before any is read.
    let mut shape_call = Call::new(table.graph, stream);
    for (&t, &shape) in table.weights.iter().zip(&shapes) {
        shape_call.bound_shape(table.decl(t), shape)?;
    }
    drop(shape_call);
    let count = table.weights.len();
    let weight_of = |t: usize| table.weights.iter().position(|&w| w == t);
    let mut tensors: Vec<Option<Tensor<'w, T>>> = (0..count).map(|_| None).collect();
    let mut kept = vec![false; count];
    let mut replaced: Vec<Option<String>> = vec![None; count];
    let mut prepared = Vec::with_capacity(table.kernels.len());
    // The weights each kernel may read, in either form.
    let reads: Vec<Vec<usize>> = table
        .kernels
        .iter()
        .map(|kernel| {
            let (given, replaced) = operands(&kernel.op, true);
            let mut weights: Vec<usize> = given.into_iter().chain(replaced).filter_map(weight_of).collect();
            weights.sort_unstable();
            weights.dedup();
            weights
        })
        .collect();
    for (index, kernel) in table.kernels.iter().enumerate() {
        // A gated pair read part by part is never fetched whole.
        let pair = in_parts(kernel, &reads, index, &tensors, &weight_of, &shapes)
            .filter(|&(gate, _, _)| source.rows(gate, 0..0).is_some());
        let whole: Vec<usize> = reads[index]
            .iter()
            .copied()
            .filter(|w| pair.is_none_or(|(gate, up, _)| *w != gate && *w != up))
            .collect();
        for &w in &whole {
            if tensors[w].is_none() {
                tensors[w] = Some(source.fetch(w)?);
            }
        }
        let mut call = Call::new(table.graph, stream);
        let mut address = vec![None; table.tensors.len()];
        for &w in &whole {
            let t = table.weights[w];
            let tensor = tensors[w].as_ref().expect("fetched above");
            address[t] = Some(call.input(table.decl(t), tensor)?);
        }
        // SAFETY (both): as the caller promises; `call` checked the
        // weights it was given, and the pair's shapes were checked.
        let copy = match pair {
            Some(pair) => {
                Some(unsafe { interleave_in_parts::<T>(table, &call, arch, kernel, &address, source, pair) }?)
            }
            None => unsafe { prepare::<T>(table, &call, arch, kernel, &address) }?,
        };
        drop(call);
        let (given, _) = operands(&kernel.op, copy.is_some());
        for &w in &reads[index] {
            if given.contains(&table.weights[w]) {
                kept[w] = true;
            } else {
                replaced[w].get_or_insert_with(|| replaced_by(table, kernel, table.weights[w]));
            }
        }
        prepared.push(copy);
        // A weight its copy replaces, that no kernel reads as given and no
        // later kernel reads at all, is dropped once the copy is written.
        let done: Vec<Tensor<'w, T>> = reads[index]
            .iter()
            .filter(|&&w| !kept[w] && !reads[index + 1..].iter().any(|later| later.contains(&w)))
            .filter_map(|&w| tensors[w].take())
            .collect();
        if !done.is_empty() {
            stream.synchronize()?;
            drop(done);
        }
    }
    // A weight no kernel reads is kept as given.
    for w in 0..count {
        if tensors[w].is_none() && replaced[w].is_none() {
            tensors[w] = Some(source.fetch(w)?);
        }
    }
    stream.synchronize()?;
    Ok(BoundWeights {
        graph: table.graph.name,
        names: table.weights.iter().map(|&t| table.decl(t).name).collect(),
        tensors,
        shapes,
        prepared,
        replaced,
    })
}

/// The gated pair of `kernel` (the `index`-th) that binding can read and
/// interleave part by part: `(gate, up, (N, K))`, by weight index, where
/// the kernel interleaves them in `[N, K]` layout, neither is on the
/// device yet and no other kernel reads either. (Whether the source reads
/// parts is its own answer, [`WeightSource::rows`].)
fn in_parts<X>(
    kernel: &KernelEntry,
    reads: &[Vec<usize>],
    index: usize,
    tensors: &[Option<X>],
    weight_of: &dyn Fn(usize) -> Option<usize>,
    shapes: &[Shape],
) -> Option<(usize, usize, (usize, usize))> {
    let KernelOp::Gemm(gemm) = &kernel.op else {
        return None;
    };
    let (Bind::Fold(fold), WeightLayout::NK) = (gemm.bind, gemm.b_layout) else {
        return None;
    };
    let (gate, up) = (weight_of(gemm.b?)?, weight_of(gemm.b_up?)?);
    let Shape::Matrix(n, k) = shapes[gate] else {
        return None;
    };
    let elsewhere = |w: usize| {
        reads
            .iter()
            .enumerate()
            .any(|(other, r)| other != index && r.contains(&w))
    };
    let apart = fold.gated() && gate != up && tensors[gate].is_none() && tensors[up].is_none();
    (apart && !elsewhere(gate) && !elsewhere(up) && n > 0).then_some((gate, up, (n, k)))
}

/// [`prepare`] for a gated pair `(gate, up, (N, K))` that [`in_parts`]
/// chose, from a source that reads rows: the interleaved copy is
/// allocated whole, then filled an eighth of the pair's rows at a time
/// (rows s..e of gate and of up interleave into rows 2s..2e of the copy,
/// in blocks of 8, and their column terms into terms 2s..2e), through two
/// buffers of that many rows.
///
/// # Safety
///
/// As [`prepare`].
unsafe fn interleave_in_parts<'w, T: Element>(
    table: &'static PlanTable,
    call: &Call<'_>,
    arch: Arch,
    kernel: &KernelEntry,
    address: &[Option<u64>],
    source: &mut dyn WeightSource<'w, T>,
    (gate, up, (n, k)): (usize, usize, (usize, usize)),
) -> Result<FoldedWeights> {
    let KernelOp::Gemm(gemm) = &kernel.op else {
        unreachable!("`in_parts` chose a GEMM")
    };
    let Bind::Fold(fold_kind) = gemm.bind else {
        unreachable!("`in_parts` chose a fold")
    };
    let variant = table.variant(T::DTYPE, arch)?;
    let Launch::Gemm { fold: Some(fold), .. } = kernel.launchers.get(variant) else {
        unreachable!("a kernel that folds its weights has `_fold_weights`")
    };
    let stream = call.stream();
    let parts = interleave_parts(n);
    let part = parts.first().map_or(0, |rows| rows.len());
    // SAFETY: each part is written (`memcpy_htod`) before the fold reads
    // it, and the fold reads no more than was written.
    let buffer =
        |rows: usize| -> Result<CudaSlice<T>> { Ok(unsafe { stream.alloc::<T>((rows * k).max(1)) }?) };
    let (mut gate_part, mut up_part) = (buffer(part)?, buffer(part)?);
    let norm = fold_kind.norm();
    let at = |t: Option<usize>| pointer(t.and_then(|t| address[t]));
    let (gamma, beta) = if norm {
        (at(gemm.gamma), at(gemm.beta))
    } else {
        (std::ptr::null(), std::ptr::null())
    };
    let (rows, cols) = (as_i64(2 * n)?, as_i64(k)?);
    let columns = if norm { 2 * n } else { 0 };
    let error_string = table.error_string();
    let stream_ptr = call.stream_ptr();
    FoldedWeights::fold_with(
        call,
        kernel.label,
        arch,
        (rows, cols),
        size_of::<T>(),
        columns,
        |w_folded, col_terms, ld_folded| {
            for Range { start, end } in parts {
                let len = (end - start) * k;
                for (w, buffer) in [(gate, &mut gate_part), (up, &mut up_part)] {
                    let host = source
                        .rows(w, start..end)
                        .expect("`in_parts` is asked of a source that reads rows")?;
                    stream.memcpy_htod(&host, &mut buffer.slice_mut(..len))?;
                }
                let (w, _w_guard) = gate_part.device_ptr(stream);
                let (w_up, _up_guard) = up_part.device_ptr(stream);
                // Rows 2·start.. of the copy, and their terms (only where a
                // norm folds: else there are none to offset).
                let first_row = 2 * start;
                let params = fusion_fold_params {
                    w: w as *const c_void,
                    w_up: w_up as *const c_void,
                    gamma,
                    beta,
                    w_folded: w_folded
                        .cast::<u8>()
                        .wrapping_add(first_row * ld_folded as usize * size_of::<T>())
                        .cast(),
                    col_terms: if norm {
                        col_terms
                            .cast::<u8>()
                            .wrapping_add(first_row * 2 * size_of::<f32>())
                            .cast()
                    } else {
                        col_terms
                    },
                    n: as_i64(end - start)?,
                    k: cols,
                    ld_folded,
                };
                // SAFETY: the parts were just written with these rows, the
                // copy was allocated for all 2N of them (the offsets stay
                // inside it), gamma and beta were checked by `call`.
                let code = unsafe { fold(&params, stream_ptr) };
                call.launched(kernel.label, code, error_string)?;
            }
            Ok(())
        },
    )
}

/// The rows of a gated pair of `n` rows each that binding interleaves at a
/// time: about an eighth of them, a multiple of 8 (the interleave's block,
/// gated.cuh's `kGateBlock`, so that rows s..e of gate and up land in rows
/// 2s..2e of the copy, interleaved as the whole pair would be), the last
/// part what is left.
fn interleave_parts(n: usize) -> Vec<Range<usize>> {
    let part = n.div_ceil(8).next_multiple_of(8).max(8);
    (0..n)
        .step_by(part)
        .map(|start| start..(start + part).min(n))
        .collect()
}

/// A size the kernels take as an `int64_t`.
fn as_i64(n: usize) -> Result<i64> {
    i64::try_from(n).map_err(|_| Error::SizeOverflow {
        what: "a bound weight's size".to_owned(),
        limit: "i64",
    })
}

/// What binding computes for one kernel from its weights, whose addresses
/// `call` checked (in `address`, by tensor id): its folded or interleaved
/// weight, or its padded copy; `None` where it reads its weights as given.
///
/// # Safety
///
/// As [`bind`]: the kernel's `_fold_weights` is the table's.
unsafe fn prepare<T: Element>(
    table: &'static PlanTable,
    call: &Call<'_>,
    arch: Arch,
    kernel: &KernelEntry,
    address: &[Option<u64>],
) -> Result<Option<FoldedWeights>> {
    let KernelOp::Gemm(gemm) = &kernel.op else {
        return Ok(None);
    };
    let b = gemm.b.expect("a GEMM reads B");
    match gemm.bind {
        Bind::Nothing => Ok(None),
        Bind::Pad => {
            let weight = address[b].expect("a padded B is a weight");
            let dims = call.matrix(table.decl(b))?;
            FoldedWeights::pad(call, kernel.label, arch, weight, dims, size_of::<T>())
        }
        Bind::Fold(fold_kind) => {
            let (norm, gated) = (fold_kind.norm(), fold_kind.gated());
            let kn = gemm.b_layout == WeightLayout::KN;
            let variant = table.variant(T::DTYPE, arch)?;
            let Launch::Gemm { fold: Some(fold), .. } = kernel.launchers.get(variant) else {
                unreachable!("a kernel that folds its weights has `_fold_weights`")
            };
            let (rows, cols) = call.matrix(table.decl(b))?;
            let (n, k) = if kn { (cols, rows) } else { (rows, cols) };
            // A gated pair's prepared weight holds both: twice the
            // columns. Column terms only where a norm folds (an
            // interleave alone writes none).
            let halves: i64 = if gated { 2 } else { 1 };
            let columns = if norm { halves as usize * n as usize } else { 0 };
            // The weights were checked: twice their rows still fit an i64.
            let stored = if kn {
                (rows, halves * cols)
            } else {
                (halves * rows, cols)
            };
            let at = |t: Option<usize>| pointer(t.and_then(|t| address[t]));
            // The norm's parameters only where it folds: a gated pair
            // whose norm comes with each call is only interleaved.
            let (gamma, beta) = if norm {
                (at(gemm.gamma), at(gemm.beta))
            } else {
                (std::ptr::null(), std::ptr::null())
            };
            let (w, w_up) = (at(gemm.b), at(gemm.b_up));
            let stream_ptr = call.stream_ptr();
            let folded = FoldedWeights::fold(
                call,
                kernel.label,
                arch,
                stored,
                size_of::<T>(),
                columns,
                |w_folded, col_terms, ld_folded| {
                    let params = fusion_fold_params {
                        w,
                        w_up,
                        gamma,
                        beta,
                        w_folded,
                        col_terms,
                        n,
                        k,
                        ld_folded,
                    };
                    // SAFETY: the weights were checked by `call` and the
                    // outputs were just allocated at the sizes the fold
                    // writes.
                    unsafe { fold(&params, stream_ptr) }
                },
                table.error_string(),
            )?;
            // A folded LayerNorm the guard may send to cuBLASLt: its beta
            // term and bias as one (`vendor_route`).
            if norm
                && !gated
                && gemm.beta.is_some()
                && !gemm.vendor.norm.is_empty()
                && gemm.vendor.may_take(arch)
            {
                let bias = gemm.bias.and_then(|t| address[t]);
                // SAFETY: `call` checked the bias, an [N] tensor of T.
                return Ok(Some(unsafe {
                    folded.with_vendor_bias(call.stream(), T::DTYPE, bias)
                }?));
            }
            Ok(Some(folded))
        }
    }
}

/// What one call of a graph needs of its workspace: the bytes of each
/// intermediate's buffer (slot by slot, as [`Workspace`] holds them) and
/// of the kernels' scratch (the most any of them asks for).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkspaceNeed {
    pub intermediates: Vec<usize>,
    pub scratch: usize,
}

impl WorkspaceNeed {
    /// Everything together: what a workspace used by this call alone holds.
    pub fn bytes(&self) -> usize {
        self.intermediates.iter().sum::<usize>() + self.scratch
    }
}

/// What a call of `m` rows (the first dim of the table's first input)
/// needs of a workspace on `stream`'s device, the other dims from
/// `weights`' shapes: the intermediates' sizes, and the scratch each GEMM's
/// launcher asks for (`_workspace_bytes`, with the process's splits,
/// `FUSION_STREAM_K`, as outside a capture, where it needs the most). [`Error::UnboundDim`] where a dim
/// of a tensor a call reads or writes is fixed neither by the weights nor
/// by `m`.
///
/// # Safety
///
/// As [`run`]: the queries are the table's launchers.
pub unsafe fn workspace_need<T: Element>(
    table: &'static PlanTable,
    weights: Weights<'_, '_, T>,
    stream: &Arc<CudaStream>,
    m: usize,
) -> Result<WorkspaceNeed> {
    table.check_schema()?;
    let arch = table.arch(stream)?;
    let variant = table.variant(T::DTYPE, arch)?;
    stream.context().bind_to_thread()?;
    let call = Call::new(table.graph, stream);
    let flags = crate::launch::gemm_flags(false)?;
    let error_string = table.error_string();
    need_of::<T>(
        table,
        (variant, arch),
        weights,
        m,
        flags,
        |kernel, query, params| call.workspace_bytes(kernel.label, query, params, error_string),
    )
}

/// [`workspace_need`] for variant `variant` and GEMM `flags`, each
/// launcher's query made by `query(kernel, its query, the params)`.
fn need_of<T: Element>(
    table: &'static PlanTable,
    (variant, arch): (usize, Arch),
    weights: Weights<'_, '_, T>,
    m: usize,
    flags: u32,
    mut query: impl FnMut(&KernelEntry, WorkspaceBytes<fusion_gemm_params>, &fusion_gemm_params) -> Result<u64>,
) -> Result<WorkspaceNeed> {
    let mut dims = crate::launch::ShapeDims::new(table.graph);
    // Every tensor has an address of its own (the queries read sizes and
    // which operands are given, never memory), but a weight binding
    // replaced, which has none.
    let mut address: Vec<Option<u64>> = (0..table.tensors.len() as u64)
        .map(|t| Some((t + 1) << 12))
        .collect();
    let (shapes, prepared): (Vec<Shape>, &[Option<FoldedWeights>]) = match weights {
        Weights::PerCall(tensors) => (tensors.iter().map(|t| t.shape()).collect(), &[]),
        Weights::Bound(bound) => {
            for (&t, tensor) in table.weights.iter().zip(&bound.tensors) {
                if tensor.is_none() {
                    address[t] = None;
                }
            }
            (bound.shapes.clone(), &bound.prepared)
        }
    };
    for (&t, shape) in table.weights.iter().zip(&shapes) {
        let extents = match *shape {
            Shape::Vector(n) => vec![n],
            Shape::Matrix(rows, cols) => vec![rows, cols],
        };
        dims.bind(table.decl(t), &extents)?;
    }
    if let Some(&input) = table.inputs.first()
        && let Some(&crate::launch::Dim::Dynamic(i)) = table.decl(input).shape.first()
    {
        dims.set(i, m, table.decl(input).name);
    }
    let called = table.inputs.iter().chain(table.outputs).chain(table.temporaries);
    if let Some(dim) = called.map(|&t| dims.unbound(table.decl(t))).find_map(|d| d) {
        return Err(Error::UnboundDim {
            graph: table.graph.name.to_owned(),
            dim: dim.to_owned(),
        });
    }
    let intermediates = table
        .temporaries
        .iter()
        .map(|&t| {
            let (rows, cols) = dims.matrix(table.decl(t))?;
            // As `Call::intermediates` sizes them: both fit an i64.
            Ok(Shape::Matrix(rows as usize, cols as usize).bytes::<T>()?.max(1))
        })
        .collect::<Result<Vec<usize>>>()?;
    let mut scratch = 0u64;
    for (index, kernel) in table.kernels.iter().enumerate() {
        let Launch::Gemm {
            query: plain, folded, ..
        } = kernel.launchers.get(variant)
        else {
            continue;
        };
        let bound = prepared.get(index).and_then(Option::as_ref);
        let copy = bound.map(|p| (1u64 << 40, 2u64 << 40, p.row_stride() as i64));
        let Params::Gemm(mut params) = fill(table, kernel, &dims, &address, flags, copy)? else {
            unreachable!("a GEMM's params are a GEMM's")
        };
        name_model_tile(kernel, variant, &mut params);
        let chosen = match (bound, folded) {
            (Some(_), Some((_, folded_query))) => folded_query,
            _ => plain,
        };
        scratch = scratch.max(query(kernel, chosen, &params)?);
        // Where the guard may send it to cuBLASLt, what that path takes.
        if let KernelOp::Gemm(gemm) = &kernel.op
            && gemm.vendor.may_take(arch)
            && crate::vendor::routes_enabled()
        {
            scratch = scratch.max(vendor_scratch(gemm.gamma.is_some(), &params, size_of::<T>()));
        }
    }
    Ok(WorkspaceNeed {
        intermediates,
        scratch: usize::try_from(scratch).map_err(|_| Error::SizeOverflow {
            what: format!("the scratch of graph `{}`", table.graph.name),
            limit: "usize",
        })?,
    })
}

/// Grows `workspace` to what a call of `m` rows needs ([`workspace_need`]),
/// as that call would: outside a capture, so that the call (or a smaller
/// one) can then be captured.
///
/// # Safety
///
/// As [`run`].
pub unsafe fn reserve<T: Element>(
    table: &'static PlanTable,
    workspace: &mut Workspace,
    weights: Weights<'_, '_, T>,
    stream: &Arc<CudaStream>,
    m: usize,
) -> Result<()> {
    // SAFETY: as the caller promises.
    let need = unsafe { workspace_need(table, weights, stream, m) }?;
    workspace.reserve(stream, &need.intermediates, need.scratch)
}

/// One call of the graph: `inputs` and the `weights` (each in the table's
/// order) and `writes` (the outputs) checked, the intermediates and the
/// kernels' scratch taken from `workspace`, every kernel queued on `stream`
/// in order (a kernel whose own output is empty is skipped). A bound
/// weight that binding replaced is checked by the shape it was bound with,
/// and its kernel reads the copy. Returns once the kernels are enqueued.
///
/// # Safety
///
/// `table` must say truly what its launchers read and write: every
/// kernel's operands name tensors of the shapes and element type its
/// launchers take, and each launcher is the symbol of the kind its entry
/// says. The checks here compare the tensors with the table, not the table
/// with the kernels, so a table that lies sends a kernel outside its
/// buffers. The tables fusion-compiler generates and those `fusion run`
/// builds from a plan are true by construction.
pub unsafe fn run<T: Element>(
    table: &'static PlanTable,
    workspace: &mut Workspace,
    weights: Weights<'_, '_, T>,
    stream: &Arc<CudaStream>,
    inputs: &[&Tensor<'_, T>],
    writes: &mut [&mut TensorMut<'_, T>],
) -> Result<()> {
    assert_eq!(
        inputs.len(),
        table.inputs.len(),
        "one tensor per input of the plan table"
    );
    assert_eq!(
        writes.len(),
        table.outputs.len(),
        "one tensor per output of the plan table"
    );
    table.check_schema()?;
    let arch = table.arch(stream)?;
    let variant = table.variant(T::DTYPE, arch)?;
    let error_string = table.error_string();
    let mut call = Call::new(table.graph, stream);
    let mut address = CallTable::<Option<u64>, 32>::new(table.tensors.len(), None);
    for (&t, &tensor) in table.inputs.iter().zip(inputs) {
        address[t] = Some(call.input(table.decl(t), tensor)?);
    }
    let prepared: &[Option<FoldedWeights>] = match weights {
        Weights::PerCall(tensors) => {
            assert_eq!(
                tensors.len(),
                table.weights.len(),
                "one tensor per weight of the plan table"
            );
            for (&t, &tensor) in table.weights.iter().zip(tensors) {
                address[t] = Some(call.input(table.decl(t), tensor)?);
            }
            &[]
        }
        Weights::Bound(bound) => {
            for ((&t, tensor), &shape) in table.weights.iter().zip(&bound.tensors).zip(&bound.shapes) {
                match tensor {
                    Some(tensor) => address[t] = Some(call.input(table.decl(t), tensor)?),
                    None => call.bound_shape(table.decl(t), shape)?,
                }
            }
            &bound.prepared
        }
    };
    for (&t, tensor) in table.outputs.iter().zip(writes.iter_mut()) {
        address[t] = Some(call.output(table.decl(t), tensor)?);
    }
    call.check_aliasing()?;
    // No output has an element: nothing to launch. (One empty output among
    // others skips only its own kernel, below.)
    if call.is_empty() {
        return Ok(());
    }
    let crate::launch::CallParts {
        intermediates,
        scratch,
        queries,
        call_use,
    } = workspace.begin_call_parts(stream)?;
    call.intermediates::<T>(intermediates, table.tensors, table.temporaries, &mut address)?;
    let has_gemm = table.kernels.iter().any(|k| matches!(k.op, KernelOp::Gemm(_)));
    // The capture status `begin_call` read, not a second driver query.
    let flags = if has_gemm {
        crate::launch::gemm_flags(call_use.capturing())?
    } else {
        0
    };
    // The GEMMs ask for their scratch; the most any asks for is taken once
    // and shared, since the kernels run one after another on the stream.
    // Each kernel's params, and what its vendor path runs where the guard
    // sends the GEMM there at this call's shape.
    let mut params = CallTable::<Option<(Params, Option<VendorCall>)>, 8>::new(table.kernels.len(), None);
    let mut scratch_bytes = 0u64;
    for (index, kernel) in table.kernels.iter().enumerate() {
        let launch = kernel.launchers.get(variant);
        let bound = prepared.get(index).and_then(Option::as_ref);
        let weights = bound.map(|w| call.folded(w));
        let mut filled = fill(table, kernel, &call, &address, flags, weights)?;
        if let Params::Gemm(p) = &mut filled {
            name_model_tile(kernel, variant, p);
        }
        let folded_norm = matches!(
            kernel.op,
            KernelOp::Gemm(GemmOp {
                bind: Bind::Fold(_),
                ..
            })
        ) && bound.is_some();
        let vendor_bias = bound.and_then(|w| call.vendor_bias(w));
        let route = vendor_route(kernel, &filled, arch, variant, (folded_norm, vendor_bias));
        if let (Some(route), Params::Gemm(p)) = (&route, &filled) {
            scratch_bytes = scratch_bytes.max(vendor_scratch(route.norm.is_some(), p, size_of::<T>()));
        } else if let (Params::Gemm(p), Launch::Gemm { query, folded, .. }) = (&filled, launch) {
            // With its norm folded into the weight, the kernel runs the
            // folded launcher.
            let query = match (bound, folded) {
                (Some(_), Some((_, folded_query))) => folded_query,
                _ => query,
            };
            let bytes = call.gemm_workspace_bytes(queries, kernel.label, query, p, error_string)?;
            scratch_bytes = scratch_bytes.max(bytes);
        }
        params[index] = Some((filled, route));
    }
    let (scratch_ptr, scratch_len) = call.scratch(scratch, scratch_bytes)?;
    for (index, (kernel, filled)) in table.kernels.iter().zip(params.iter_mut()).enumerate() {
        let (params, route) = filled.as_mut().expect("every kernel's params were filled above");
        // This build has no vendor path (`vendor_route` said none).
        #[cfg(not(feature = "cublaslt"))]
        let _ = route;
        // A kernel whose own output is empty is not launched, while the
        // others are (`Call::has_elements` says why).
        if !call.has_elements(table.decl(kernel.output))? {
            continue;
        }
        #[cfg(feature = "cublaslt")]
        if let (Some(route), Params::Gemm(p), KernelOp::Gemm(gemm)) = (*route, &*params, &kernel.op) {
            // SAFETY: as for a launch (below): `call` checked every operand
            // of the GEMM's params, and the scratch is this call's, as
            // large as `vendor_scratch` asked.
            unsafe {
                run_vendor::<T>(
                    &call,
                    kernel.label,
                    gemm.b_layout,
                    route,
                    p,
                    (scratch_ptr as u64, scratch_len as usize),
                    error_string,
                )?;
            }
            continue;
        }
        let stream_ptr = call.stream_ptr();
        // SAFETY (each launch): every pointer was checked by `call` (shape,
        // context, alignment, no output aliasing an input) and stays
        // borrowed until `call` is dropped; the params are the launcher's
        // own struct (the table pairs them by kind); the launcher only
        // enqueues work.
        let code = match (params, kernel.launchers.get(variant)) {
            (Params::Gemm(p), Launch::Gemm { launch, folded, .. }) => {
                p.workspace = scratch_ptr;
                p.workspace_bytes = scratch_len;
                let bound = prepared.get(index).and_then(Option::as_ref);
                let launch = match (bound, folded) {
                    (Some(_), Some((folded_launch, _))) => folded_launch,
                    _ => launch,
                };
                unsafe { launch(p, stream_ptr) }
            }
            (Params::Norm(p), Launch::Norm(launch)) => unsafe { launch(p, stream_ptr) },
            (Params::Elementwise(p), Launch::Elementwise(launch)) => unsafe { launch(p, stream_ptr) },
            _ => unreachable!("a kernel's launcher takes the params of its op"),
        };
        call.launched(kernel.label, code, error_string)?;
    }
    call_use.finish()
}

/// Names in `params`' flags the tile the model chooses for the call, where
/// `kernel` is a GEMM whose build left its tile to the call
/// ([`GemmOp::model`]) and variant `variant` has tiers: for the launch and
/// for its workspace query alike, so that both see one tile.
fn name_model_tile(kernel: &KernelEntry, variant: usize, params: &mut fusion_gemm_params) {
    if let KernelOp::Gemm(GemmOp {
        model: Some(model), ..
    }) = &kernel.op
    {
        params.flags = model.flags(variant, params.flags, params.m, params.n, params.k);
    }
}

/// A call's table of one value per tensor or per kernel: on the stack up to
/// `N` entries (every graph fusion ships fits), on the heap beyond, so that
/// a call of a small graph allocates no host memory for it.
struct CallTable<T, const N: usize> {
    inline: [T; N],
    spilled: Vec<T>,
    len: usize,
}

impl<T: Copy, const N: usize> CallTable<T, N> {
    /// `len` entries, each `value`.
    fn new(len: usize, value: T) -> Self {
        CallTable {
            inline: [value; N],
            spilled: if len > N { vec![value; len] } else { Vec::new() },
            len,
        }
    }

    /// Whether the entries live on the heap.
    #[cfg(test)]
    fn spilled(&self) -> bool {
        self.spilled.capacity() > 0
    }
}

impl<T, const N: usize> std::ops::Deref for CallTable<T, N> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        if self.len <= N {
            &self.inline[..self.len]
        } else {
            &self.spilled
        }
    }
}

impl<T, const N: usize> std::ops::DerefMut for CallTable<T, N> {
    fn deref_mut(&mut self) -> &mut [T] {
        if self.len <= N {
            &mut self.inline[..self.len]
        } else {
            &mut self.spilled
        }
    }
}

/// What a call runs on a GEMM's vendor path ([`vendor_route`]).
#[derive(Clone, Copy, Debug)]
pub struct VendorCall {
    /// cuBLASLt's epilogue.
    pub epilogue: VendorEpilogue,
    /// The norm kernel that first writes A's normalized rows into the
    /// scratch, for a GEMM with a norm prologue.
    pub norm: Option<Launcher<fusion_norm_params>>,
    /// The norm is folded into the bound weight: it runs without its
    /// affine (gamma and beta are in W' and the column terms).
    pub folded: bool,
    /// cuBLASLt's bias in place of the GEMM's: a folded LayerNorm's
    /// ([`FoldedWeights::with_vendor_bias`]).
    pub bias: Option<u64>,
}

/// What the guard runs for `kernel`, filled as `params` for `variant`, on
/// the vendor path at this call's shape on `arch`, `None` where it runs
/// the fused kernel: its route takes them ([`VendorRoute::takes`]), routes
/// are taken ([`crate::vendor::routes_enabled`]), and cuBLASLt, after the
/// route's norm kernel where there is a norm prologue, computes what the
/// fused kernel does from what the call holds. `(folded, vendor_bias)`:
/// whether the norm is folded into the bound weight, and the bias binding
/// computed for its vendor path.
///
/// - A plain weight, as declared or padded: cuBLASLt reads it, its bias
///   and residual (no multiplier, no gated pair).
/// - A norm with gamma and beta per call: the norm kernel writes x̂·gamma
///   (+ beta) into the scratch, cuBLASLt multiplies that by W.
/// - A norm folded into the bound weight W' = W·diag(gamma), whose gamma
///   and beta binding dropped: the folded kernel computes rstd·(x·W'ᵀ −
///   mean·u) + c (+ bias), u the rowsums of W' and c = W·beta (fold.cuh,
///   epilogue.cuh's `FoldedNormStep`), which is x̂·W'ᵀ + c with x̂ = (x −
///   mean)·rstd the rows normalized without the affine. So the norm kernel
///   writes x̂ (gamma and beta null), cuBLASLt multiplies it by W' and adds
///   c and the GEMM's bias as its bias (`vendor_bias`: a LayerNorm
///   without it runs fused); an RMSNorm has no c, x̂ = x·rstd, and its bias
///   is the GEMM's.
pub fn vendor_route(
    kernel: &KernelEntry,
    params: &Params,
    arch: Arch,
    variant: usize,
    (folded, vendor_bias): (bool, Option<u64>),
) -> Option<VendorCall> {
    let (KernelOp::Gemm(gemm), Params::Gemm(p)) = (&kernel.op, params) else {
        return None;
    };
    // A norm's kernel for this variant, where the GEMM has one: a table
    // without it runs the fused kernel.
    let norm = match gemm.gamma {
        Some(_) => Some(*gemm.vendor.norm.get(variant)?),
        None => None,
    };
    let folded_beta = folded && gemm.beta.is_some();
    let weight = match gemm.bind {
        Bind::Nothing | Bind::Pad => true,
        Bind::Fold(Fold::Norm) => !folded_beta || vendor_bias.is_some(),
        Bind::Fold(Fold::Interleave | Fold::NormInterleave) => false,
    };
    // The operands cuBLASLt takes, and a bias exactly where its epilogue
    // adds one: a table that says otherwise runs the fused kernel.
    let plain = weight
        && gemm.b_up.is_none()
        && gemm.multiplier.is_none()
        && gemm.vendor.epilogue.reads_bias() == gemm.bias.is_some();
    let taken = plain && crate::vendor::routes_enabled() && gemm.vendor.takes(arch, variant, gemm.model, p);
    taken.then(|| VendorCall {
        epilogue: if folded_beta {
            gemm.vendor.epilogue.with_bias()
        } else {
            gemm.vendor.epilogue
        },
        norm,
        folded: folded && norm.is_some(),
        bias: vendor_bias.filter(|_| folded_beta),
    })
}

/// Where cuBLASLt's part of a vendor path's scratch starts: after the
/// fused kernels' counters, which it leaves alone (their launches expect
/// them at zero: [`fusion_compiler::gemm_model::WORKSPACE_FLAG_BYTES`]).
const VENDOR_LT_START: u64 = fusion_compiler::gemm_model::WORKSPACE_FLAG_BYTES;

/// Where a norm GEMM's normalized rows start in its vendor path's scratch:
/// after cuBLASLt's part.
const VENDOR_ROWS_START: u64 = VENDOR_LT_START + crate::vendor::ROUTE_WORKSPACE_BYTES;

/// The scratch a GEMM's vendor path takes, for params `p` with elements of
/// `element_bytes`: the counters, cuBLASLt's part and, where a norm kernel
/// runs first (`norm`), A's normalized rows ([`VENDOR_ROWS_START`]).
fn vendor_scratch(norm: bool, p: &fusion_gemm_params, element_bytes: usize) -> u64 {
    let rows = if norm {
        let elements = u64::try_from(p.m.max(0).saturating_mul(p.k.max(0))).unwrap_or(u64::MAX);
        elements.saturating_mul(element_bytes as u64)
    } else {
        0
    };
    VENDOR_ROWS_START.saturating_add(rows)
}

/// Queues one GEMM's vendor path ([`vendor_route`]) on `call`'s stream:
/// the norm kernel, where `route` has one, writing A's normalized rows
/// after cuBLASLt's part of the scratch, then cuBLASLt on them with the
/// params `p` the fused kernel would have run (its bias replaced by the
/// route's, where it has one); `label` names the kernel in errors.
///
/// # Safety
///
/// As [`run`]'s launches: `call` checked every operand of `p`, and the
/// scratch is the call's, at least [`vendor_scratch`] bytes.
#[cfg(feature = "cublaslt")]
unsafe fn run_vendor<T: Element>(
    call: &Call<'_>,
    label: &str,
    layout: WeightLayout,
    route: VendorCall,
    p: &fusion_gemm_params,
    (scratch, scratch_len): (u64, usize),
    error_string: ErrorString,
) -> Result<()> {
    let mut lt = *p;
    if let Some(norm) = route.norm {
        let normalized = scratch + VENDOR_ROWS_START;
        // Folded: gamma and beta are in the weight (null: no affine).
        let (gamma, beta) = if route.folded {
            (std::ptr::null(), std::ptr::null())
        } else {
            (p.gamma, p.beta)
        };
        let params = fusion_norm_params {
            x: p.a,
            y: normalized as *mut c_void,
            gamma,
            beta,
            m: p.m,
            k: p.k,
            eps: p.eps,
        };
        // SAFETY: A and the norm's parameters were checked by `call`; the
        // normalized rows fit the scratch after cuBLASLt's part.
        let code = unsafe { norm(&params, call.stream_ptr()) };
        call.launched(label, code, error_string)?;
        lt.a = normalized as *const c_void;
    }
    if let Some(bias) = route.bias {
        lt.bias = bias as *const c_void;
    }
    // cuBLASLt may write anywhere in its part, which starts after the fused
    // kernels' counters.
    let lt_bytes = (scratch_len as u64)
        .saturating_sub(VENDOR_LT_START)
        .min(crate::vendor::ROUTE_WORKSPACE_BYTES);
    let workspace = (scratch + VENDOR_LT_START, lt_bytes as usize);
    // SAFETY: as the caller promises; A is the normalized rows just queued
    // on the same stream, where a norm runs.
    unsafe { crate::vendor::run_route(call.stream(), T::DTYPE, layout, route.epilogue, &lt, workspace) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::abi;
    use crate::launch::{Dim, ShapeDims};
    use std::ffi::c_int;

    /// A GEMM's launchers in a table whose kernels are never launched.
    const NO_LAUNCHERS: Launchers = Launchers::Gemm {
        launch: &[],
        query: &[],
        folded: &[],
        fold: &[],
    };

    static GRAPH: GraphDecl = GraphDecl {
        name: "g",
        dims: &["M"],
    };
    /// x [M, 64] @ w [32, 64]^T + bias [32] -> y [M, 32], with w, up and
    /// bias weights.
    static TENSORS: [TensorDecl; 5] = [
        TensorDecl::new("x", &[Dim::Dynamic(0), Dim::Static(64)]),
        TensorDecl::new("w", &[Dim::Static(32), Dim::Static(64)]),
        TensorDecl::new("up", &[Dim::Static(32), Dim::Static(64)]),
        TensorDecl::new("bias", &[Dim::Static(32)]),
        TensorDecl::new("y", &[Dim::Dynamic(0), Dim::Static(32)]),
    ];

    fn table(schema: u32, bind: Bind) -> &'static PlanTable {
        let kernels = Box::leak(Box::new([KernelEntry {
            label: "kernel #0 (gemm)",
            output: 4,
            op: KernelOp::Gemm(GemmOp {
                a: Some(0),
                b: Some(1),
                b_up: Some(2),
                bias: Some(3),
                bind,
                ..GemmOp::EMPTY
            }),
            launchers: NO_LAUNCHERS,
        }]));
        Box::leak(Box::new(PlanTable {
            schema,
            graph: &GRAPH,
            tensors: &TENSORS,
            inputs: &[0],
            weights: &[1, 2, 3],
            outputs: &[4],
            temporaries: &[],
            kernels,
            variants: &[],
            error_string: None,
            archs: None,
            compiled: "nothing",
        }))
    }

    fn gemm(table: &PlanTable, prepared: Option<(u64, u64, i64)>) -> fusion_gemm_params {
        let mut dims = ShapeDims::new(table.graph);
        assert!(dims.bind(&TENSORS[0], &[5, 64]).unwrap());
        let address: Vec<Option<u64>> = (1..=5).map(|t| Some(t << 12)).collect();
        match fill(table, &table.kernels[0], &dims, &address, 3, prepared).unwrap() {
            Params::Gemm(p) => p,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_gemms_params_take_each_operand_and_the_bound_sizes() {
        let p = gemm(table(SCHEMA_VERSION, Bind::Nothing), None);
        assert_eq!(
            (p.a, p.b, p.b_up, p.bias, p.c.cast_const()),
            (0x1000 as _, 0x2000 as _, 0x3000 as _, 0x4000 as _, 0x5000 as _)
        );
        assert!(p.residual.is_null() && p.gamma.is_null() && p.col_terms.is_null());
        assert_eq!((p.m, p.n, p.k, p.ldb, p.flags), (5, 32, 64, 0, 3));
        assert!(p.workspace.is_null());
    }

    #[test]
    fn prepared_weights_replace_b_as_their_binding_says() {
        let prepared = Some((0xa000, 0xb000, 72));
        // A folded or interleaved B: read alone, with its terms.
        let p = gemm(table(SCHEMA_VERSION, Bind::Fold(Fold::Interleave)), prepared);
        assert_eq!((p.b, p.ldb, p.col_terms), (0xa000 as _, 72, 0xb000 as _));
        assert!(p.b_up.is_null());
        // A padded B: its copy, no terms, the rest as given.
        let p = gemm(table(SCHEMA_VERSION, Bind::Pad), prepared);
        assert_eq!((p.b, p.ldb, p.b_up), (0xa000 as _, 72, 0x3000 as _));
        assert!(p.col_terms.is_null());
        // Nothing bound: the weights as given (a struct's table never
        // prepares such a kernel's; a stale entry is not read).
        let p = gemm(table(SCHEMA_VERSION, Bind::Nothing), prepared);
        assert_eq!((p.b, p.ldb), (0x2000 as _, 0));
    }

    /// What a kernel reads once bound: the weights its prepared copy
    /// stands in for are not kept (`bind_each` keeps a weight only where
    /// some kernel's `given` names it).
    #[test]
    fn binding_keeps_only_the_weights_a_kernel_still_reads_as_given() {
        let op = |bind: Bind| {
            KernelOp::Gemm(GemmOp {
                a: Some(0),
                b: Some(1),
                b_up: Some(2),
                bias: Some(3),
                gamma: Some(5),
                beta: Some(6),
                bind,
                ..GemmOp::EMPTY
            })
        };
        let sorted = |(mut given, mut replaced): (Vec<usize>, Vec<usize>)| {
            given.sort_unstable();
            replaced.sort_unstable();
            (given, replaced)
        };
        // A gated pair interleaved: gate and up are the copy; a norm given
        // per call is still read.
        assert_eq!(
            sorted(operands(&op(Bind::Fold(Fold::Interleave)), true)),
            (vec![0, 3, 5, 6], vec![1, 2])
        );
        // The norm folded in too: gamma and beta are read by no launcher.
        assert_eq!(
            sorted(operands(&op(Bind::Fold(Fold::NormInterleave)), true)),
            (vec![0, 3], vec![1, 2, 5, 6])
        );
        assert_eq!(
            sorted(operands(&op(Bind::Fold(Fold::Norm)), true)),
            (vec![0, 3], vec![1, 2, 5, 6])
        );
        // A padded copy replaces B alone, as `fill` reads it.
        assert_eq!(
            sorted(operands(&op(Bind::Pad), true)),
            (vec![0, 2, 3, 5, 6], vec![1])
        );
        // Nothing prepared (a fold the table names but that made no copy,
        // rows already aligned): every weight is read as given.
        for bind in [Bind::Nothing, Bind::Pad, Bind::Fold(Fold::NormInterleave)] {
            assert_eq!(
                sorted(operands(&op(bind), false)),
                (vec![0, 1, 2, 3, 5, 6], vec![])
            );
        }
    }

    #[test]
    fn a_gated_pair_from_a_file_is_interleaved_in_parts_of_whole_blocks() {
        // Llama-3-8B's F: eight parts of 1792 rows, each a multiple of 8.
        let parts = interleave_parts(14336);
        assert_eq!(parts.len(), 8);
        assert!(parts.iter().all(|p| p.len() == 1792 && p.start % 8 == 0));
        assert_eq!((parts[0].start, parts[7].end), (0, 14336));
        // Parts meet, and a last one takes what is left.
        for n in [8, 16, 72, 136, 1000, 4104] {
            let parts = interleave_parts(n);
            assert_eq!(parts.first().unwrap().start, 0);
            assert_eq!(parts.last().unwrap().end, n);
            assert!(parts.windows(2).all(|w| w[0].end == w[1].start), "{parts:?}");
            assert!(
                parts
                    .iter()
                    .all(|p| p.start % 8 == 0 && p.len() <= parts[0].len())
            );
            assert!(parts.len() <= 8, "{n}: {parts:?}");
        }
        assert!(interleave_parts(0).is_empty());
    }

    #[test]
    fn only_a_pair_no_other_kernel_reads_is_interleaved_in_parts() {
        let table = two_kernels();
        let weight_of = |t: usize| table.weights.iter().position(|&w| w == t);
        let reads = vec![vec![0, 1], vec![2, 3]];
        let shapes = [
            Shape::Matrix(128, 64),
            Shape::Matrix(128, 64),
            Shape::Matrix(32, 128),
            Shape::Vector(32),
        ];
        let none: [Option<()>; 4] = [None; 4];
        assert_eq!(
            in_parts(&table.kernels[0], &reads, 0, &none, &weight_of, &shapes),
            Some((0, 1, (128, 64)))
        );
        // Not the padded GEMM, which has no pair.
        assert_eq!(
            in_parts(&table.kernels[1], &reads, 1, &none, &weight_of, &shapes),
            None
        );
        // Not where another kernel reads up too: it must be held whole.
        let shared = vec![vec![0, 1], vec![1, 2, 3]];
        assert_eq!(
            in_parts(&table.kernels[0], &shared, 0, &none, &weight_of, &shapes),
            None
        );
        // Not where the gate is on the device already.
        let fetched = [Some(()), None, None, None];
        assert_eq!(
            in_parts(&table.kernels[0], &reads, 0, &fetched, &weight_of, &shapes),
            None
        );
    }

    #[test]
    fn a_replaced_weight_says_which_kernel_and_which_copy() {
        let gated = table(SCHEMA_VERSION, Bind::Fold(Fold::Interleave));
        assert_eq!(
            replaced_by(gated, &gated.kernels[0], 2),
            "kernel #0 (gemm) reads `w` and `up` interleaved into one copy"
        );
        let padded = table(SCHEMA_VERSION, Bind::Pad);
        assert_eq!(
            replaced_by(padded, &padded.kernels[0], 1),
            "kernel #0 (gemm) reads a copy of it with its rows padded"
        );
    }

    #[test]
    fn a_weight_binding_replaced_is_refused_by_name_with_its_kernel() {
        let bound = BoundWeights::<half::f16> {
            graph: "g",
            names: vec!["w", "up", "bias"],
            tensors: vec![None, None, None],
            shapes: vec![Shape::Matrix(32, 64), Shape::Matrix(32, 64), Shape::Vector(32)],
            prepared: Vec::new(),
            replaced: vec![
                Some("kernel #0 (gemm) reads `w` and `up` interleaved into one copy".to_owned()),
                Some("kernel #0 (gemm) reads `w` and `up` interleaved into one copy".to_owned()),
                None,
            ],
        };
        let e = bound.get("up").unwrap_err();
        assert!(
            matches!(&e, Error::WeightNotKept { graph, tensor, reason }
                if graph == "g" && tensor == "up" && reason.contains("interleaved")),
            "{e}"
        );
        assert_eq!(
            e.to_string(),
            "graph `g` keeps no weight `up` once bound: kernel #0 (gemm) reads `w` and `up` interleaved into one copy"
        );
        let e = bound.get("gate").unwrap_err();
        assert!(
            e.to_string()
                .ends_with("it declares no such weight (its weights: w, up, bias)"),
            "{e}"
        );
        assert_eq!(bound.kept().count(), 0);
        assert_eq!((bound.kept_bytes(), bound.prepared_bytes()), (0, 0));
        assert_eq!(bound.shape("up"), Some(Shape::Matrix(32, 64)));
    }

    /// A launcher's scratch query as the sm90 ones answer: 256 bytes per
    /// row of A, plus 4 KiB of flags.
    unsafe extern "C" fn query_rows(
        p: *const fusion_gemm_params,
        _stream: *mut c_void,
        bytes: *mut u64,
    ) -> c_int {
        // SAFETY: `need_of` passes its params and a place for the answer.
        unsafe { *bytes = 4096 + 256 * (*p).m as u64 };
        0
    }

    /// A gated query: the interleaved weights too where the call gives both.
    unsafe extern "C" fn query_gated(
        p: *const fusion_gemm_params,
        _stream: *mut c_void,
        bytes: *mut u64,
    ) -> c_int {
        // SAFETY: as `query_rows`.
        unsafe {
            let interleaved = if (*p).b_up.is_null() {
                0
            } else {
                2 * (*p).n * (*p).k * 2
            };
            *bytes = 4096 + interleaved as u64;
        }
        0
    }

    unsafe extern "C" fn no_launch(_p: *const fusion_gemm_params, _stream: *mut c_void) -> c_int {
        0
    }

    /// x [M, 64] -> h [M, 128] (gated GEMM of w and up) -> y [M, 32]
    /// (GEMM of w2, bias): h passes between the kernels.
    fn two_kernels() -> &'static PlanTable {
        two_kernels_with(None)
    }

    /// [`two_kernels`], each GEMM's tile left to `model`.
    fn two_kernels_with(model: Option<&'static TileModel>) -> &'static PlanTable {
        static TENSORS: [TensorDecl; 7] = [
            TensorDecl::new("x", &[Dim::Dynamic(0), Dim::Static(64)]),
            TensorDecl::new("w", &[Dim::Dynamic(1), Dim::Static(64)]),
            TensorDecl::new("up", &[Dim::Dynamic(1), Dim::Static(64)]),
            TensorDecl::new("w2", &[Dim::Static(32), Dim::Dynamic(1)]),
            TensorDecl::new("bias", &[Dim::Static(32)]),
            TensorDecl::new("h", &[Dim::Dynamic(0), Dim::Dynamic(1)]),
            TensorDecl::new("y", &[Dim::Dynamic(0), Dim::Static(32)]),
        ];
        static GRAPH2: GraphDecl = GraphDecl {
            name: "ffn",
            dims: &["M", "F"],
        };
        let kernels = Box::leak(Box::new([
            KernelEntry {
                label: "kernel #0 (gemm_silu_glu)",
                output: 5,
                op: KernelOp::Gemm(GemmOp {
                    a: Some(0),
                    b: Some(1),
                    b_up: Some(2),
                    bind: Bind::Fold(Fold::Interleave),
                    model,
                    ..GemmOp::EMPTY
                }),
                launchers: Launchers::Gemm {
                    launch: &[no_launch],
                    query: &[query_gated],
                    folded: &[],
                    fold: &[],
                },
            },
            KernelEntry {
                label: "kernel #1 (gemm_bias)",
                output: 6,
                op: KernelOp::Gemm(GemmOp {
                    a: Some(5),
                    b: Some(3),
                    bias: Some(4),
                    bind: Bind::Pad,
                    model,
                    ..GemmOp::EMPTY
                }),
                launchers: Launchers::Gemm {
                    launch: &[no_launch],
                    query: &[query_rows],
                    folded: &[],
                    fold: &[],
                },
            },
        ]));
        Box::leak(Box::new(PlanTable {
            schema: SCHEMA_VERSION,
            graph: &GRAPH2,
            tensors: &TENSORS,
            inputs: &[0],
            weights: &[1, 2, 3, 4],
            outputs: &[6],
            temporaries: &[5],
            kernels,
            variants: &[(DType::F16, Arch::Sm90)],
            error_string: None,
            archs: None,
            compiled: "f16 on sm90",
        }))
    }

    fn need(weights: Weights<'_, '_, half::f16>, m: usize) -> Result<WorkspaceNeed> {
        let table = two_kernels();
        need_of(table, (0, Arch::Sm90), weights, m, 0, |_, query, params| {
            let mut bytes = 0;
            // SAFETY: the test's own queries read the params alone.
            assert_eq!(unsafe { query(params, std::ptr::null_mut(), &mut bytes) }, 0);
            Ok(bytes)
        })
    }

    fn bound_ffn(f: usize) -> BoundWeights<'static, half::f16> {
        BoundWeights {
            graph: "ffn",
            names: vec!["w", "up", "w2", "bias"],
            tensors: vec![None, None, None, None],
            shapes: vec![
                Shape::Matrix(f, 64),
                Shape::Matrix(f, 64),
                Shape::Matrix(32, f),
                Shape::Vector(32),
            ],
            prepared: Vec::new(),
            replaced: vec![None; 4],
        }
    }

    #[test]
    fn a_calls_workspace_is_its_intermediates_per_row_and_the_largest_scratch() {
        let bound = bound_ffn(128);
        for m in [1, 16, 4096] {
            let need = need(Weights::Bound(&bound), m).unwrap();
            // h: m x 128 halves; the largest query is kernel #1's (m rows
            // of 256 bytes), the gated one's 4 KiB of flags alone.
            assert_eq!(need.intermediates, [m * 128 * 2]);
            assert_eq!(need.scratch, 4096 + 256 * m);
            assert_eq!(need.bytes(), m * 256 + 4096 + 256 * m);
        }
        // Per M: the bytes grow by the same amount for every row.
        let bytes = |m| need(Weights::Bound(&bound), m).unwrap().bytes();
        assert_eq!(bytes(2048) - bytes(1024), 1024 * (256 + 256));
    }

    /// Where the build left a GEMM's tile to the call, its workspace query
    /// sees the tier the model chooses for the call's shape, as its launch
    /// does (both fill their params through `name_model_tile`); the decode
    /// kernel's Ms and a tier named by `FUSION_GEMM_TILE` stay as they are.
    #[test]
    fn a_gemm_left_to_the_model_is_queried_with_the_tier_it_chooses() {
        let model = crate::tile_model::tests::model();
        let table = two_kernels_with(Some(model));
        let bound = bound_ffn(1024);
        let flags_seen = |m: usize, flags: u32| {
            let mut seen = Vec::new();
            need_of(
                table,
                (0, Arch::Sm90),
                Weights::Bound(&bound),
                m,
                flags,
                |kernel, _, p| {
                    seen.push((kernel.label, p.m, p.n, p.k, p.flags));
                    Ok(0)
                },
            )
            .unwrap();
            seen
        };
        for (label, m, n, k, flags) in flags_seen(4096, 0) {
            assert_ne!(flags & abi::FUSION_GEMM_TILE_MASK, 0, "{label}");
            assert_eq!(flags, model.flags(0, 0, m, n, k), "{label}");
        }
        for (label, .., flags) in flags_seen(16, 0) {
            assert_eq!(flags, 0, "{label}: the decode kernel's Ms");
        }
        let forced = 3 << abi::FUSION_GEMM_TILE_SHIFT;
        for (label, .., flags) in flags_seen(4096, forced) {
            assert_eq!(flags, forced, "{label}: FUSION_GEMM_TILE's tier");
        }
        // Without the model the flags are the call's.
        let plain = need_of(
            two_kernels(),
            (0, Arch::Sm90),
            Weights::Bound(&bound),
            4096,
            0,
            |_, _, p| {
                assert_eq!(p.flags, 0);
                Ok(0)
            },
        );
        assert!(plain.is_ok());
    }

    #[test]
    fn a_dim_fixed_by_no_weight_is_refused_by_name() {
        // No weight given, so no shape fixes F (the width of h): M alone
        // cannot size the call.
        let e = need(Weights::PerCall(&[]), 4).unwrap_err();
        assert!(
            matches!(&e, Error::UnboundDim { graph, dim } if graph == "ffn" && dim == "F"),
            "{e}"
        );
    }

    #[test]
    fn structs_sharing_a_workspace_need_the_largest_of_their_calls_slot_by_slot() {
        // Two graphs of one table shape but different widths, as two layers
        // of different sizes: a shared workspace holds, slot by slot, the
        // larger of the two, never the sum.
        let small = need(Weights::Bound(&bound_ffn(64)), 512).unwrap();
        let large = need(Weights::Bound(&bound_ffn(128)), 512).unwrap();
        let shared: Vec<usize> = small
            .intermediates
            .iter()
            .zip(&large.intermediates)
            .map(|(a, b)| *a.max(b))
            .collect();
        assert_eq!(shared, large.intermediates);
        assert_eq!(small.scratch.max(large.scratch), large.scratch);
        // 32 identical layers share exactly one layer's workspace.
        let layers: Vec<WorkspaceNeed> = (0..32).map(|_| large.clone()).collect();
        let held = layers
            .iter()
            .fold(WorkspaceNeed::default(), |held, need| WorkspaceNeed {
                intermediates: held
                    .intermediates
                    .iter()
                    .copied()
                    .chain(std::iter::repeat(0))
                    .zip(&need.intermediates)
                    .map(|(a, &b)| a.max(b))
                    .collect(),
                scratch: held.scratch.max(need.scratch),
            });
        assert_eq!(held.bytes(), large.bytes());
    }

    #[test]
    fn a_vendor_route_covers_its_ranges_alone() {
        let route = VendorRoute {
            arch: Arch::Sm90,
            ms: &[(17, 64), (257, u32::MAX)],
            epilogue: VendorEpilogue::GeluBias,
            per_call: None,
            norm: &[],
        };
        let covered: Vec<i64> = [1, 16, 17, 64, 65, 256, 257, 1 << 40]
            .into_iter()
            .filter(|&m| route.covers(Arch::Sm90, m))
            .collect();
        assert_eq!(covered, [17, 64, 257, 1 << 40]);
        assert!(!VendorRoute::NONE.covers(Arch::Sm90, 1));
        assert!(!route.covers(Arch::Sm90, -1));
        // Another generation runs the fused kernel: the ranges were
        // decided for sm90.
        assert!(!route.covers(Arch::Sm80, 17));
    }

    #[test]
    fn a_route_left_to_the_call_takes_the_models_verdict_at_its_shape() {
        let route = |scale| VendorRoute {
            ms: &[],
            per_call: Some(crate::route_model::tests::model(scale)),
            ..VendorRoute::NONE
        };
        let mut p = gemm(table(SCHEMA_VERSION, Bind::Nothing), None);
        (p.m, p.n, p.k) = (1000, 4096, 4096);
        // A vendor path ten times cheaper than the shipped model's: taken on
        // sm90, for the variant the model serves.
        let cheap = route(0.1);
        assert!(cheap.takes(Arch::Sm90, 0, None, &p));
        assert!(!cheap.takes(Arch::Sm80, 0, None, &p));
        assert!(!cheap.takes(Arch::Sm90, 1, None, &p));
        // The decode kernel's Ms stay fused.
        p.m = 16;
        assert!(!cheap.takes(Arch::Sm90, 0, None, &p));
        // Ten times dearer: never.
        p.m = 1000;
        assert!(!route(10.0).takes(Arch::Sm90, 0, None, &p));
    }

    #[test]
    fn a_routed_gemm_calls_cublaslt_with_its_filled_operands() {
        use crate::vendor::RouteCall;
        // Bias + GELU: the bias is cuBLASLt's, no residual.
        let p = gemm(table(SCHEMA_VERSION, Bind::Nothing), None);
        let call = RouteCall::of(&p, VendorEpilogue::GeluBias);
        assert_eq!(
            call,
            RouteCall {
                dims: (5, 32, 64),
                ld_w: None,
                x: 0x1000,
                w: 0x2000,
                bias: Some(0x4000),
                residual: None,
                y: 0x5000,
            }
        );
        // An epilogue without a bias reads none, whatever the params hold.
        assert_eq!(RouteCall::of(&p, VendorEpilogue::Gelu).bias, None);
        // A padded weight: its copy, at its row stride.
        let p = gemm(table(SCHEMA_VERSION, Bind::Pad), Some((0xa000, 0, 72)));
        let call = RouteCall::of(&p, VendorEpilogue::Bias);
        assert_eq!((call.w, call.ld_w), (0xa000, Some(72)));
        // A residual rides on beta.
        let mut p = p;
        p.residual = 0x6000 as _;
        assert_eq!(RouteCall::of(&p, VendorEpilogue::None).residual, Some(0x6000));
    }

    #[test]
    fn a_folded_gemm_is_never_routed() {
        let kernel_of = |bind, bias| KernelEntry {
            label: "kernel #0 (gemm)",
            output: 4,
            op: KernelOp::Gemm(GemmOp {
                a: Some(0),
                b: Some(1),
                bias,
                bind,
                vendor: VendorRoute {
                    arch: Arch::Sm90,
                    ms: &[(1, u32::MAX)],
                    epilogue: VendorEpilogue::None,
                    per_call: None,
                    norm: &[],
                },
                ..GemmOp::EMPTY
            }),
            launchers: NO_LAUNCHERS,
        };
        let kernel = |bind| kernel_of(bind, None);
        let kernel_with_bias = |bind| kernel_of(bind, Some(3));
        let p = Params::Gemm(gemm(table(SCHEMA_VERSION, Bind::Nothing), None));
        let per_call = (false, None);
        // An interleaved pair is no weight cuBLASLt reads.
        for fold in [Fold::Interleave, Fold::NormInterleave] {
            assert!(vendor_route(&kernel(Bind::Fold(fold)), &p, Arch::Sm90, 0, (true, None)).is_none());
        }
        // An epilogue without a bias on a GEMM with one: never routed.
        assert!(vendor_route(&kernel_with_bias(Bind::Nothing), &p, Arch::Sm90, 0, per_call).is_none());
        // A plain one is routed exactly where routes are taken (the
        // feature `cublaslt`, cuBLASLt loaded, FUSION_GUARD not off).
        let routed = vendor_route(&kernel(Bind::Nothing), &p, Arch::Sm90, 0, per_call);
        assert_eq!(routed.is_some(), crate::vendor::routes_enabled());
    }

    /// The launcher of a norm kernel in a table that is never called.
    unsafe extern "C" fn never_norm(_: *const fusion_norm_params, _: *mut c_void) -> std::ffi::c_int {
        unreachable!("the test calls no launcher")
    }

    #[test]
    fn a_norm_gemm_is_routed_through_its_norm_kernel_and_a_folded_layernorm_through_its_bias() {
        // A LayerNorm GEMM (gamma 2, beta 3) with no bias of its own.
        let kernel = |bind, norm: &'static [Launcher<fusion_norm_params>]| KernelEntry {
            label: "kernel #0 (layernorm_gemm)",
            output: 4,
            op: KernelOp::Gemm(GemmOp {
                a: Some(0),
                b: Some(1),
                gamma: Some(2),
                beta: Some(3),
                eps: 1e-5,
                bind,
                vendor: VendorRoute {
                    arch: Arch::Sm90,
                    ms: &[(1, u32::MAX)],
                    epilogue: VendorEpilogue::Gelu,
                    per_call: None,
                    norm,
                },
                ..GemmOp::EMPTY
            }),
            launchers: NO_LAUNCHERS,
        };
        let norm: &'static [Launcher<fusion_norm_params>] = &[never_norm];
        let p = Params::Gemm(gemm(table(SCHEMA_VERSION, Bind::Nothing), None));
        let route = |bind, norm, bound| vendor_route(&kernel(bind, norm), &p, Arch::Sm90, 0, bound);
        let enabled = crate::vendor::routes_enabled();
        // Without the norm kernel of the variant: fused.
        assert!(route(Bind::Fold(Fold::Norm), &[], (false, None)).is_none());
        assert!(
            vendor_route(
                &kernel(Bind::Fold(Fold::Norm), norm),
                &p,
                Arch::Sm90,
                1,
                (false, None)
            )
            .is_none()
        );
        // Gamma and beta per call: the norm with its affine, cuBLASLt's
        // epilogue the graph's.
        let per_call = route(Bind::Fold(Fold::Norm), norm, (false, None));
        assert_eq!(per_call.is_some(), enabled);
        if let Some(call) = per_call {
            assert!(call.norm.is_some() && !call.folded && call.bias.is_none());
            assert_eq!(call.epilogue, VendorEpilogue::Gelu);
        }
        // Folded: without the bias binding computes for it, a LayerNorm
        // stays fused; with it, the norm runs without its affine and
        // cuBLASLt adds that bias before its GELU.
        assert!(route(Bind::Fold(Fold::Norm), norm, (true, None)).is_none());
        let folded = route(Bind::Fold(Fold::Norm), norm, (true, Some(0x9000)));
        assert_eq!(folded.is_some(), enabled);
        if let Some(call) = folded {
            assert!(call.norm.is_some() && call.folded);
            assert_eq!(
                (call.epilogue, call.bias),
                (VendorEpilogue::GeluBias, Some(0x9000))
            );
        }
    }

    #[test]
    fn a_vendor_path_takes_its_scratch_after_the_fused_kernels_counters() {
        let mut p = gemm(table(SCHEMA_VERSION, Bind::Nothing), None);
        (p.m, p.k) = (300, 4096);
        let flags = fusion_compiler::gemm_model::WORKSPACE_FLAG_BYTES;
        let lt = crate::vendor::ROUTE_WORKSPACE_BYTES;
        assert_eq!((VENDOR_LT_START, VENDOR_ROWS_START), (flags, flags + lt));
        assert_eq!(vendor_scratch(false, &p, 2), flags + lt);
        assert_eq!(vendor_scratch(true, &p, 2), flags + lt + 300 * 4096 * 2);
    }

    #[test]
    fn a_call_table_holds_a_small_graph_on_the_stack_and_any_graph_whole() {
        for len in [0, 1, 7, 8, 9, 40] {
            let mut table = CallTable::<Option<u64>, 8>::new(len, None);
            assert_eq!(table.len(), len);
            assert!(table.iter().all(Option::is_none));
            assert_eq!(table.spilled(), len > 8, "{len}");
            for (i, entry) in table.iter_mut().enumerate() {
                *entry = Some(i as u64);
            }
            let expected: Vec<Option<u64>> = (0..len as u64).map(Some).collect();
            assert_eq!(&*table, &expected[..]);
        }
    }

    #[test]
    fn a_table_of_another_schema_is_refused_by_name() {
        assert!(table(SCHEMA_VERSION, Bind::Nothing).check_schema().is_ok());
        let e = table(SCHEMA_VERSION + 1, Bind::Nothing)
            .check_schema()
            .unwrap_err();
        assert!(
            matches!(&e, Error::PlanSchema { graph, table, runtime }
                if graph == "g" && *table == SCHEMA_VERSION + 1 && *runtime == SCHEMA_VERSION),
            "{e}"
        );
    }
}
