//! What generated wrappers call: argument checks, the intermediates'
//! workspace, and launch-result handling. Not an API for users; it is public
//! so that wrappers generated into another crate can reach it.
//!
//! A wrapper makes one [`Call`], hands it every tensor (each is checked as it
//! arrives: shape against the declaration, dynamic dims against earlier
//! tensors, row length a multiple of 8, same CUDA context as the stream,
//! 16-byte alignment), checks aliasing, and only then launches anything.

use crate::device::Arch;
use crate::error::{Error, Result};
use crate::tensor::{Element, Shape, Tensor, TensorMut};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtrMut, SyncOnDrop};
use fusion_core::ir::DType;
use std::ffi::{CStr, c_char, c_int, c_void};
use std::sync::Arc;

/// A launcher's C signature, for a params struct `P`.
pub type Launcher<P> = unsafe extern "C" fn(*const P, *mut c_void) -> c_int;

/// The library's `<lib>_error_string`.
pub type ErrorString = unsafe extern "C" fn(c_int) -> *const c_char;

/// One axis of a declared tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dim {
    Static(usize),
    /// Index into [`GraphDecl::dims`].
    Dynamic(usize),
}

/// A graph's name and its dynamic dims.
#[derive(Debug)]
pub struct GraphDecl {
    pub name: &'static str,
    pub dims: &'static [&'static str],
}

/// A tensor as the graph declares it.
#[derive(Debug)]
pub struct TensorDecl {
    pub name: &'static str,
    pub shape: &'static [Dim],
}

/// Device buffers for a graph's intermediates, grown on demand and reused
/// across calls.
#[derive(Debug, Default)]
pub struct Workspace {
    buffers: Vec<CudaSlice<u8>>,
}

impl Workspace {
    pub fn new() -> Workspace {
        Workspace::default()
    }
}

/// Where one dynamic dim got its value.
#[derive(Clone, Copy)]
struct Bound {
    value: usize,
    from: &'static str,
}

/// The checks and pointers of one wrapper call.
pub struct Call<'s> {
    graph: &'static GraphDecl,
    stream: &'s Arc<CudaStream>,
    dims: Vec<Option<Bound>>,
    reads: Vec<(&'static str, u64, usize)>,
    writes: Vec<(&'static str, u64, usize)>,
    empty_output: bool,
    guards: Vec<SyncOnDrop<'s>>,
}

impl<'s> Call<'s> {
    pub fn new(graph: &'static GraphDecl, stream: &'s Arc<CudaStream>) -> Call<'s> {
        Call {
            graph,
            stream,
            dims: vec![None; graph.dims.len()],
            reads: Vec::new(),
            writes: Vec::new(),
            empty_output: false,
            guards: Vec::new(),
        }
    }

    /// Checks a tensor the graph reads; returns its device address.
    pub fn input<T: Element>(&mut self, decl: &'static TensorDecl, tensor: &'s Tensor<'_, T>) -> Result<u64> {
        self.check_shape(decl, tensor.shape())?;
        self.check_context(decl, tensor.stream())?;
        let (ptr, guard) = tensor.device_ptr(self.stream);
        self.guards.push(guard);
        let bytes = tensor.shape().len() * size_of::<T>();
        check_aligned(decl, ptr, bytes)?;
        self.reads.push((decl.name, ptr, bytes));
        Ok(ptr)
    }

    /// Checks a tensor the graph writes; returns its device address.
    pub fn output<T: Element>(
        &mut self,
        decl: &'static TensorDecl,
        tensor: &'s mut TensorMut<'_, T>,
    ) -> Result<u64> {
        let shape = tensor.shape();
        self.check_shape(decl, shape)?;
        self.check_context(decl, tensor.stream())?;
        let (ptr, guard) = tensor.device_ptr_mut(self.stream);
        self.guards.push(guard);
        let bytes = shape.len() * size_of::<T>();
        check_aligned(decl, ptr, bytes)?;
        self.writes.push((decl.name, ptr, bytes));
        self.empty_output |= shape.is_empty();
        Ok(ptr)
    }

    /// No output overlaps an input or another output.
    pub fn check_aliasing(&self) -> Result<()> {
        let overlap = |a: &(&str, u64, usize), b: &(&str, u64, usize)| {
            a.2 > 0 && b.2 > 0 && a.1 < b.1 + b.2 as u64 && b.1 < a.1 + a.2 as u64
        };
        for (i, write) in self.writes.iter().enumerate() {
            let others = self.reads.iter().chain(&self.writes[..i]);
            if let Some(other) = others.into_iter().find(|other| overlap(write, other)) {
                return Err(Error::Aliasing {
                    output: write.0.to_owned(),
                    input: other.0.to_owned(),
                });
            }
        }
        Ok(())
    }

    /// An output has no elements (M = 0): there is nothing to launch.
    pub fn is_empty(&self) -> bool {
        self.empty_output
    }

    /// `(rows, cols)` of a declared tensor once its dims are bound; a vector
    /// is one row.
    pub fn matrix(&self, decl: &TensorDecl) -> (i64, i64) {
        let extent = |d: &Dim| match *d {
            Dim::Static(n) => n,
            Dim::Dynamic(i) => self.dims[i].map_or(0, |b| b.value),
        };
        let extents: Vec<usize> = decl.shape.iter().map(extent).collect();
        match extents.as_slice() {
            [n] => (1, *n as i64),
            [rows @ .., cols] => (rows.iter().product::<usize>() as i64, *cols as i64),
            [] => (1, 1),
        }
    }

    /// Device buffers for the intermediates, in the order given, from
    /// `workspace` (grown if they do not fit).
    pub fn intermediates<T: Element>(
        &mut self,
        workspace: &'s mut Workspace,
        decls: &[&'static TensorDecl],
    ) -> Result<Vec<u64>> {
        let sizes: Vec<usize> = decls
            .iter()
            .map(|d| {
                let (rows, cols) = self.matrix(d);
                (rows * cols) as usize * size_of::<T>()
            })
            .collect();
        let ctx = self.stream.context().cu_ctx();
        for (i, &bytes) in sizes.iter().enumerate() {
            let fits = workspace
                .buffers
                .get(i)
                .is_some_and(|b| b.len() >= bytes && b.context().cu_ctx() == ctx);
            if !fits {
                let buffer = self.stream.alloc_zeros::<u8>(bytes.max(1))?;
                if i < workspace.buffers.len() {
                    workspace.buffers[i] = buffer;
                } else {
                    workspace.buffers.push(buffer);
                }
            }
        }
        let mut pointers = Vec::with_capacity(decls.len());
        for buffer in workspace.buffers.iter_mut().take(decls.len()) {
            let (ptr, guard) = buffer.device_ptr_mut(self.stream);
            self.guards.push(guard);
            pointers.push(ptr);
        }
        Ok(pointers)
    }

    /// The stream as the launchers take it.
    pub fn stream_ptr(&self) -> *mut c_void {
        self.stream.cu_stream() as *mut c_void
    }

    /// Turns a launcher's return code into a result.
    pub fn launched(&self, kernel: &str, code: c_int, error_string: ErrorString) -> Result<()> {
        if code == 0 {
            return Ok(());
        }
        // SAFETY: cudaGetErrorString returns a static NUL-terminated string
        // for every code, known or not.
        let message = unsafe {
            let ptr = error_string(code);
            if ptr.is_null() {
                "unknown error".to_owned()
            } else {
                CStr::from_ptr(ptr).to_string_lossy().into_owned()
            }
        };
        Err(Error::Launch {
            kernel: format!("{}: {kernel}", self.graph.name),
            code,
            message,
        })
    }

    fn check_shape(&mut self, decl: &'static TensorDecl, shape: Shape) -> Result<()> {
        let actual: Vec<usize> = match shape {
            Shape::Vector(n) => vec![n],
            Shape::Matrix(r, c) => vec![r, c],
        };
        let graph = self.graph;
        let shape_error = || Error::Shape {
            tensor: decl.name.to_owned(),
            expected: declared_shape(graph, decl),
            actual: shape.to_string(),
        };
        if actual.len() != decl.shape.len() {
            return Err(shape_error());
        }
        for (&dim, &value) in decl.shape.iter().zip(&actual) {
            match dim {
                Dim::Static(n) if n != value => return Err(shape_error()),
                Dim::Static(_) => {}
                Dim::Dynamic(i) => match self.dims[i] {
                    None => {
                        self.dims[i] = Some(Bound {
                            value,
                            from: decl.name,
                        })
                    }
                    Some(bound) if bound.value != value => {
                        return Err(Error::DimMismatch {
                            dim: self.graph.dims[i].to_owned(),
                            first: bound.from.to_owned(),
                            first_value: bound.value,
                            second: decl.name.to_owned(),
                            second_value: value,
                        });
                    }
                    Some(_) => {}
                },
            }
        }
        if let (Some(&last_decl), Some(&last)) = (decl.shape.last(), actual.last())
            && last % 8 != 0
        {
            return Err(Error::NotMultipleOf8 {
                tensor: decl.name.to_owned(),
                dim: dim_name(self.graph, last_decl),
                value: last,
            });
        }
        Ok(())
    }

    fn check_context(&self, decl: &TensorDecl, tensor_stream: &CudaStream) -> Result<()> {
        if tensor_stream.context().cu_ctx() != self.stream.context().cu_ctx() {
            return Err(Error::WrongContext {
                tensor: decl.name.to_owned(),
            });
        }
        Ok(())
    }
}

fn dim_name(graph: &GraphDecl, dim: Dim) -> String {
    match dim {
        Dim::Static(n) => n.to_string(),
        Dim::Dynamic(i) => graph.dims[i].to_owned(),
    }
}

fn declared_shape(graph: &GraphDecl, decl: &TensorDecl) -> String {
    let dims: Vec<String> = decl.shape.iter().map(|d| dim_name(graph, *d)).collect();
    format!("[{}]", dims.join(", "))
}

fn check_aligned(decl: &TensorDecl, ptr: u64, bytes: usize) -> Result<()> {
    if bytes > 0 && !ptr.is_multiple_of(16) {
        return Err(Error::Misaligned {
            tensor: decl.name.to_owned(),
            address: ptr,
        });
    }
    Ok(())
}

/// The error for a (dtype, arch) with no compiled launcher. `compiled`
/// lists what the build has, e.g. `f16 on sm80, sm90; bf16 on sm80, sm90`.
pub fn not_compiled(graph: &str, dtype: DType, arch: Arch, compiled: &str) -> Error {
    Error::UnsupportedDType {
        kernel: graph.to_owned(),
        dtype: format!("{dtype} on {}", arch.name()),
        compiled: compiled.to_owned(),
    }
}
