//! What the generated graph structs are made of: the state a struct holds
//! ([`Bound`], [`Unbound`]), its plan table once vouched for ([`Plan`]),
//! and [`items!`](crate::shell::items), which writes the methods that are
//! the same for every graph (with their documentation) into a struct's
//! `impl`. The generated code keeps what differs per graph: the structs,
//! `new`, `run` and the plan table.
//!
//! Not the API users call (they call the generated structs); public so
//! that generated code in another crate reaches it.

use crate::device::Arch;
use crate::error::Result;
use crate::launch::{SharedWorkspace, Workspace};
use crate::plan::{DeclaredGraph, PlanTable, Weights};
use crate::tensor::{Element, Tensor, TensorMut};
use crate::weights::{BoundWeights, TensorFile, TensorNames};
use cudarc::driver::CudaStream;
use std::sync::Arc;

/// A plan table that generated code vouches for: its launchers read and
/// write what its entries say. Every call through it is then safe.
#[derive(Clone, Copy, Debug)]
pub struct Plan(&'static PlanTable);

impl Plan {
    /// Vouches for `table`.
    ///
    /// # Safety
    ///
    /// As [`crate::plan::run`]: `table` says truly what its launchers read
    /// and write. The tables fusion-compiler generates do.
    pub const unsafe fn new(table: &'static PlanTable) -> Plan {
        Plan(table)
    }

    /// The table.
    pub const fn table(self) -> &'static PlanTable {
        self.0
    }

    /// The GPU generations its launchers were compiled for; empty where
    /// none were.
    pub const fn archs(self) -> &'static [Arch] {
        match self.0.archs {
            Some(archs) => archs,
            None => &[],
        }
    }

    /// The graph it runs ([`crate::plan::graph`]).
    pub fn graph(self, declared: &DeclaredGraph) -> fusion_compiler::ir::Graph {
        crate::plan::graph(self.0, declared)
    }

    /// Its weights from a safetensors file ([`crate::plan::load_weights`]).
    pub fn load_weights<T: Element, const N: usize>(
        self,
        stream: &Arc<CudaStream>,
        file: &TensorFile,
        names: &TensorNames,
    ) -> Result<[Tensor<'static, T>; N]> {
        crate::plan::load_weights(self.0, stream, file, names)
    }

    /// One call with every tensor given (a free function's), its scratch
    /// from the workspace kept per stream
    /// ([`crate::launch::with_stream_workspace`]).
    pub fn run_per_call<T: Element>(
        self,
        stream: &Arc<CudaStream>,
        weights: &[&Tensor<'_, T>],
        inputs: &[&Tensor<'_, T>],
        outputs: &mut [&mut TensorMut<'_, T>],
    ) -> Result<()> {
        crate::launch::with_stream_workspace(stream, |workspace| {
            // SAFETY: `Plan::new`'s caller vouched for the table.
            unsafe {
                crate::plan::run(
                    self.0,
                    workspace,
                    Weights::PerCall(weights),
                    stream,
                    inputs,
                    outputs,
                )
            }
        })
    }
}

/// What a struct whose graph has weights holds: the weights as bound, and
/// its workspace.
#[derive(Debug)]
pub struct Bound<'w, T> {
    weights: BoundWeights<'w, T>,
    workspace: SharedWorkspace,
}

impl<'w, T: Element> Bound<'w, T> {
    /// Binds `weights`, in the table's order ([`crate::plan::bind`]), with
    /// a workspace of its own.
    pub fn new(plan: Plan, stream: &Arc<CudaStream>, weights: Vec<Tensor<'w, T>>) -> Result<Self> {
        // SAFETY: `Plan::new`'s caller vouched for the table.
        let weights = unsafe { crate::plan::bind(plan.0, stream, weights) }?;
        Ok(Bound {
            weights,
            workspace: Workspace::shared(),
        })
    }

    /// One call ([`crate::plan::run`]).
    pub fn run(
        &mut self,
        plan: Plan,
        stream: &Arc<CudaStream>,
        inputs: &[&Tensor<'_, T>],
        outputs: &mut [&mut TensorMut<'_, T>],
    ) -> Result<()> {
        let mut workspace = self.workspace.lock();
        let weights = Weights::Bound(&self.weights);
        // SAFETY: `Plan::new`'s caller vouched for the table.
        unsafe { crate::plan::run(plan.0, &mut workspace, weights, stream, inputs, outputs) }
    }

    /// The weights as bound.
    pub fn weights(&self) -> &BoundWeights<'w, T> {
        &self.weights
    }
}

impl<T> Bound<'_, T> {
    /// The workspace.
    pub fn workspace(&self) -> &SharedWorkspace {
        &self.workspace
    }

    /// Has calls use `workspace`.
    pub fn set_workspace(&mut self, workspace: SharedWorkspace) {
        self.workspace = workspace;
    }
}

impl<T: Element> Bound<'static, T> {
    /// Reads the weights from a file and binds them
    /// ([`crate::plan::bind_file`]), with a workspace of its own.
    pub fn from_file(
        plan: Plan,
        stream: &Arc<CudaStream>,
        file: &TensorFile,
        names: &TensorNames,
    ) -> Result<Self> {
        // SAFETY: `Plan::new`'s caller vouched for the table.
        let weights = unsafe { crate::plan::bind_file(plan.0, stream, file, names) }?;
        Ok(Bound {
            weights,
            workspace: Workspace::shared(),
        })
    }
}

/// What a struct whose graph has no weights holds: its workspace.
#[derive(Debug, Default)]
pub struct Unbound {
    workspace: SharedWorkspace,
}

impl Unbound {
    /// The workspace.
    pub fn workspace(&self) -> &SharedWorkspace {
        &self.workspace
    }

    /// Has calls use `workspace`.
    pub fn set_workspace(&mut self, workspace: SharedWorkspace) {
        self.workspace = workspace;
    }

    /// One call ([`crate::plan::run`]).
    pub fn run<T: Element>(
        &mut self,
        plan: Plan,
        stream: &Arc<CudaStream>,
        inputs: &[&Tensor<'_, T>],
        outputs: &mut [&mut TensorMut<'_, T>],
    ) -> Result<()> {
        let mut workspace = self.workspace.lock();
        // SAFETY: `Plan::new`'s caller vouched for the table.
        unsafe {
            crate::plan::run(
                plan.0,
                &mut workspace,
                Weights::PerCall(&[]),
                stream,
                inputs,
                outputs,
            )
        }
    }
}

/// The state of a struct of either kind, as the workspace methods read it.
pub trait State<T> {
    /// The weights a call reads.
    fn call_weights(&self) -> Weights<'_, '_, T>;
    /// The workspace.
    fn workspace(&self) -> &SharedWorkspace;
}

impl<T: Element> State<T> for Bound<'_, T> {
    fn call_weights(&self) -> Weights<'_, '_, T> {
        Weights::Bound(&self.weights)
    }
    fn workspace(&self) -> &SharedWorkspace {
        &self.workspace
    }
}

impl<T: Element> State<T> for Unbound {
    fn call_weights(&self) -> Weights<'_, '_, T> {
        Weights::PerCall(&[])
    }
    fn workspace(&self) -> &SharedWorkspace {
        &self.workspace
    }
}

/// The bytes of workspace a call of `m` rows needs
/// ([`crate::plan::workspace_need`]).
pub fn workspace_bytes<T: Element>(
    plan: Plan,
    state: &impl State<T>,
    stream: &Arc<CudaStream>,
    m: usize,
) -> Result<usize> {
    // SAFETY: `Plan::new`'s caller vouched for the table.
    let need = unsafe { crate::plan::workspace_need(plan.0, state.call_weights(), stream, m) }?;
    Ok(need.bytes())
}

/// Grows the workspace to what a call of `m` rows needs
/// ([`crate::plan::reserve`]).
pub fn reserve_workspace<T: Element>(
    plan: Plan,
    state: &impl State<T>,
    stream: &Arc<CudaStream>,
    m: usize,
) -> Result<()> {
    let mut workspace = state.workspace().lock();
    // SAFETY: `Plan::new`'s caller vouched for the table.
    unsafe { crate::plan::reserve(plan.0, &mut workspace, state.call_weights(), stream, m) }
}

/// Writes into a generated struct's `impl` the items every graph struct
/// has, with their documentation. The struct is a tuple struct over
/// [`Bound`] or [`Unbound`]; `$m` is the module of its tables (`PLAN`, a
/// [`Plan`], and `__DECLARED`).
///
/// - `items!(weights $m { w1, w2 })` in `impl<T> NameWeights<'static, T>`:
///   `from_safetensors`.
/// - `items!(owned $m, NameWeights)` in `impl<T> Name<'static, T>`:
///   `from_safetensors`.
/// - `items!(bound $m, 'w, T)` in `impl<'w, T> Name<'w, T>` (`T` the
///   element type, or the one it was compiled for): `ARCHS`, `graph`,
///   `PLAN`, `weights` and the workspace methods.
/// - `items!(unbound $m, f16)` or `items!(unbound $m, generic)` in
///   `impl Name`: `ARCHS`, `graph`, `PLAN` and the workspace methods,
///   generic over the element type with `generic`.
#[doc(hidden)]
#[macro_export]
macro_rules! __shell_items {
    (weights $m:ident { $($w:ident),* }) => {
        /// Reads the weights from a safetensors file: each one under
        /// the name `names` gives it (`fusion::TensorNames::declared()`
        /// for the declared names, `fusion::TensorNames::hugging_face(layer)`
        /// for a checkpoint's), all checked (present, element type,
        /// shape against the declaration) before any is copied to
        /// `stream`'s device, into memory the weights own.
        pub fn from_safetensors(
            stream: &::std::sync::Arc<$crate::cudarc::driver::CudaStream>,
            file: &$crate::TensorFile,
            names: &$crate::TensorNames,
        ) -> $crate::Result<Self> {
            let [$($w),*] = $m::PLAN.load_weights(stream, file, names)?;
            Ok(Self { $($w),* })
        }
    };
    (owned $m:ident, $weights:ident) => {
        #[doc = concat!(
            "Reads the weights from a safetensors file (as [`", stringify!($weights),
            "::from_safetensors`]) and binds them (as [`Self::new`]) one kernel at a time: a kernel's \
             weights are copied to the device, bound, and those its copy replaces freed before the next \
             kernel's are read; a gated pair is interleaved an eighth of its rows at a time, never on the \
             device whole beside its copy. A struct that owns its weights."
        )]
        pub fn from_safetensors(
            stream: &::std::sync::Arc<$crate::cudarc::driver::CudaStream>,
            file: &$crate::TensorFile,
            names: &$crate::TensorNames,
        ) -> $crate::Result<Self> {
            $crate::shell::Bound::from_file($m::PLAN, stream, file, names).map(Self)
        }
    };
    (bound $m:ident, $w:lifetime, $elem:ty) => {
        $crate::__shell_items!(@common $m);

        /// The bound weights: each declared weight that a kernel
        /// reads as given (`get(name)`; a weight binding replaced with
        /// its copy is `fusion::Error::WeightNotKept`, naming the
        /// kernel and the copy), and the bytes kept and prepared.
        #[must_use]
        #[allow(dead_code, reason = "accessors a crate may not call")]
        pub fn weights(&self) -> &$crate::BoundWeights<$w, $elem> {
            self.0.weights()
        }

        $crate::__shell_items!(@sizes $m, [], $elem);
    };
    (unbound $m:ident, generic) => {
        $crate::__shell_items!(@common $m);
        $crate::__shell_items!(@sizes $m, [<T: $crate::Element>], T);
    };
    (unbound $m:ident, $elem:ty) => {
        $crate::__shell_items!(@common $m);
        $crate::__shell_items!(@sizes $m, [], $elem);
    };
    (@common $m:ident) => {
        /// The GPU generations this struct's kernels were compiled for, as
        /// the build script of the crate declaring it chose them (its cargo
        /// features, `FUSION_ARCHS` or `CUDA_COMPUTE_CAP`), whatever
        /// fusion's own features are: each call runs the newest of them the
        /// device runs (or `FUSION_FORCE_ARCH`'s). Empty when that build ran
        /// no nvcc.
        #[allow(dead_code, reason = "accessors a crate may not call")]
        pub const ARCHS: &'static [$crate::Arch] = $m::PLAN.archs();

        /// The graph this struct runs, as the build script checked it, built
        /// from data written then (nothing is parsed at run time): for the
        /// CPU reference (`fusion::core::reference`, present with fusion's
        /// feature `testing`) and for drawing test data with its shapes.
        ///
        /// # Panics
        ///
        /// Never: every activation it names is a row of the op table the
        /// build script read, which this crate's fusion shares.
        #[must_use]
        #[allow(dead_code, reason = "accessors a crate may not call")]
        pub fn graph() -> $crate::ir::Graph {
            $m::PLAN.graph(&$m::__DECLARED)
        }

        /// The plan this struct runs, as data (`fusion::plan`).
        #[doc(hidden)]
        #[allow(dead_code, reason = "accessors a crate may not call")]
        pub const PLAN: &'static $crate::plan::PlanTable = $m::PLAN.table();

        /// Has this struct's calls use `workspace`, shared with other
        /// structs whose calls run one after another on a stream (the
        /// layers of a model): it holds what the largest of them needs,
        /// not their sum. Its own workspace is dropped.
        #[must_use]
        #[allow(dead_code, reason = "accessors a crate may not call")]
        pub fn with_workspace(mut self, workspace: $crate::SharedWorkspace) -> Self {
            self.0.set_workspace(workspace);
            self
        }

        /// The device memory kept between calls: the intermediates and
        /// the kernels' scratch (see `fusion::Workspace`), shared with the
        /// structs given the same one.
        #[must_use]
        #[allow(dead_code, reason = "accessors a crate may not call")]
        pub fn workspace(&self) -> &$crate::SharedWorkspace {
            self.0.workspace()
        }
    };
    (@sizes $m:ident, [$($generics:tt)*], $elem:ty) => {
        /// The bytes of workspace one call of `m` rows on `stream`'s
        /// device needs: its intermediates, and the most scratch any of
        /// its kernels asks for (with the process's splits, as outside a
        /// capture).
        /// `fusion::Error::UnboundDim` where a dim other than M is fixed
        /// by no weight.
        #[allow(dead_code, reason = "accessors a crate may not call")]
        pub fn workspace_bytes $($generics)* (
            &self,
            stream: &::std::sync::Arc<$crate::cudarc::driver::CudaStream>,
            m: usize,
        ) -> $crate::Result<usize> {
            $crate::shell::workspace_bytes::<$elem>($m::PLAN, &self.0, stream, m)
        }

        /// Grows the workspace to what a call of `m` rows needs
        /// (`workspace_bytes`), so that such a call, or a smaller one,
        /// can then be captured into a CUDA graph.
        #[allow(dead_code, reason = "accessors a crate may not call")]
        pub fn reserve_workspace $($generics)* (
            &self,
            stream: &::std::sync::Arc<$crate::cudarc::driver::CudaStream>,
            m: usize,
        ) -> $crate::Result<()> {
            $crate::shell::reserve_workspace::<$elem>($m::PLAN, &self.0, stream, m)
        }
    };
}

#[doc(hidden)]
pub use crate::__shell_items as items;
