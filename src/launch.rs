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
    /// Each checked tensor's name and device bytes.
    reads: Vec<(&'static str, DeviceRange)>,
    writes: Vec<(&'static str, DeviceRange)>,
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
        let range = DeviceRange::new(decl, ptr, tensor.shape().bytes::<T>()?)?;
        check_aligned(decl, range)?;
        self.reads.push((decl.name, range));
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
        let range = DeviceRange::new(decl, ptr, shape.bytes::<T>()?)?;
        check_aligned(decl, range)?;
        self.writes.push((decl.name, range));
        self.empty_output |= shape.is_empty();
        Ok(ptr)
    }

    /// No output overlaps an input or another output.
    pub fn check_aliasing(&self) -> Result<()> {
        let overlap = |a: &(&str, DeviceRange), b: &(&str, DeviceRange)| a.1.overlaps(b.1);
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
    /// is one row. [`Error::SizeOverflow`] when either does not fit the
    /// `int64_t` the kernels take.
    pub fn matrix(&self, decl: &TensorDecl) -> Result<(i64, i64)> {
        let extent = |d: &Dim| match *d {
            Dim::Static(n) => n,
            Dim::Dynamic(i) => self.dims[i].map_or(0, |b| b.value),
        };
        let extents: Vec<usize> = decl.shape.iter().map(extent).collect();
        let (rows, cols) = match extents.as_slice() {
            [rows @ .., cols] => (rows.iter().try_fold(1usize, |p, &r| p.checked_mul(r)), *cols),
            [] => (Some(1), 1),
        };
        let as_i64 = |n: Option<usize>, what: &str| {
            n.and_then(|n| i64::try_from(n).ok())
                .ok_or_else(|| Error::SizeOverflow {
                    what: format!("the {what} of `{}`", decl.name),
                    limit: "i64",
                })
        };
        Ok((as_i64(rows, "row count")?, as_i64(Some(cols), "row length")?))
    }

    /// `(rows, cols)` of a tensor whose rows a kernel reduces over (a GEMM's
    /// `A`, whose row length is K), as [`Call::matrix`];
    /// [`Error::EmptyReduction`] when it has rows but they are empty.
    pub fn reduced_matrix(&self, decl: &TensorDecl) -> Result<(i64, i64)> {
        let (rows, cols) = self.matrix(decl)?;
        if rows > 0 && cols == 0 {
            return Err(Error::EmptyReduction {
                tensor: decl.name.to_owned(),
                dim: decl
                    .shape
                    .last()
                    .map_or_else(String::new, |&d| dim_name(self.graph, d)),
            });
        }
        Ok((rows, cols))
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
                let (rows, cols) = self.matrix(d)?;
                // Both fit an i64, so both fit a usize.
                Shape::Matrix(rows as usize, cols as usize).bytes::<T>()
            })
            .collect::<Result<_>>()?;
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

fn check_aligned(decl: &TensorDecl, range: DeviceRange) -> Result<()> {
    if !range.is_empty() && !range.start.is_multiple_of(16) {
        return Err(Error::Misaligned {
            tensor: decl.name.to_owned(),
            address: range.start,
        });
    }
    Ok(())
}

/// The device bytes `start..end` of one tensor.
#[derive(Clone, Copy, Debug)]
struct DeviceRange {
    start: u64,
    end: u64,
}

impl DeviceRange {
    /// `bytes` from `start`; [`Error::SizeOverflow`] when the end is past
    /// the last address.
    fn new(decl: &TensorDecl, start: u64, bytes: usize) -> Result<DeviceRange> {
        let end = u64::try_from(bytes)
            .ok()
            .and_then(|bytes| start.checked_add(bytes))
            .ok_or_else(|| Error::SizeOverflow {
                what: format!("the end address of `{}` ({start:#x} + {bytes} bytes)", decl.name),
                limit: "u64",
            })?;
        Ok(DeviceRange { start, end })
    }

    fn is_empty(self) -> bool {
        self.start == self.end
    }

    /// Whether the two share a byte (empty ranges share none).
    fn overlaps(self, other: DeviceRange) -> bool {
        !self.is_empty() && !other.is_empty() && self.start < other.end && other.start < self.end
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const X: TensorDecl = TensorDecl {
        name: "x",
        shape: &[],
    };

    #[test]
    fn a_range_past_the_last_address_is_an_error_not_a_wrapped_end() {
        let e = DeviceRange::new(&X, u64::MAX - 15, 16).unwrap_err();
        assert!(matches!(e, Error::SizeOverflow { limit: "u64", .. }), "{e}");
        assert!(
            e.to_string()
                .starts_with("the end address of `x` (0xfffffffffffffff0 + 16 bytes) overflows u64"),
            "{e}"
        );
        let last = DeviceRange::new(&X, u64::MAX - 15, 15).unwrap();
        assert_eq!(last.end, u64::MAX);
    }

    #[test]
    fn ranges_overlap_when_they_share_a_byte() {
        let range = |start, bytes| DeviceRange::new(&X, start, bytes).unwrap();
        assert!(range(0, 32).overlaps(range(16, 32)));
        assert!(range(16, 32).overlaps(range(0, 32)));
        assert!(!range(0, 16).overlaps(range(16, 16)), "adjacent");
        assert!(!range(0, 0).overlaps(range(0, 16)), "empty");
        // Near the top of the address space, where `start + len` used to wrap.
        assert!(range(u64::MAX - 32, 32).overlaps(range(u64::MAX - 16, 16)));
    }

    #[test]
    fn alignment_is_checked_only_for_non_empty_tensors() {
        assert!(check_aligned(&X, DeviceRange::new(&X, 8, 0).unwrap()).is_ok());
        let e = check_aligned(&X, DeviceRange::new(&X, 8, 16).unwrap()).unwrap_err();
        assert!(matches!(e, Error::Misaligned { address: 8, .. }), "{e}");
    }
}
