//! Typed tensor views over device memory: what kernel wrappers take.
//!
//! A [`Tensor`] (read) or [`TensorMut`] (written) pairs a cudarc view with a
//! shape; constructing one checks that the buffer holds exactly that many
//! elements. Wrappers then check shapes against the graph, alignment and
//! context before anything is launched.
//!
//! # Threads
//!
//! [`Tensor`] and [`TensorMut`] are `Send` and `Sync` (checked by
//! `tests/send_sync.rs`). A view is a device address, a length and borrows
//! of its allocation's stream and events, all of which cudarc makes safe to
//! use from any thread. The borrow rules do the rest: a [`TensorMut`]
//! mutably borrows its allocation, so no other view of that memory exists
//! while it does, and a shared `&TensorMut` can only report its shape
//! (wrappers take `&mut TensorMut` to write). Reading one [`Tensor`] from
//! several threads on several streams at once is allowed, as reading one
//! buffer from several streams is in CUDA.

use crate::error::{Error, Result};
use cudarc::driver::{
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, SyncOnDrop,
};
use fusion_core::ir::DType;
use std::fmt;

/// An element type kernels are compiled for.
pub trait Element: DeviceRepr + Copy + Send + Sync + 'static {
    const DTYPE: DType;
}

impl Element for half::f16 {
    const DTYPE: DType = DType::F16;
}

impl Element for half::bf16 {
    const DTYPE: DType = DType::BF16;
}

impl Element for f32 {
    const DTYPE: DType = DType::F32;
}

/// A row vector `[n]` or a row-major matrix `[rows, cols]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    Vector(usize),
    Matrix(usize, usize),
}

impl Shape {
    /// The number of elements; [`Error::SizeOverflow`] when rows × cols does
    /// not fit a `usize` (then no buffer can match the shape).
    pub fn len(self) -> Result<usize> {
        match self {
            Shape::Vector(n) => Ok(n),
            Shape::Matrix(r, c) => r.checked_mul(c).ok_or_else(|| Error::SizeOverflow {
                what: format!("the element count of shape {self}"),
                limit: "usize",
            }),
        }
    }

    /// The size in bytes of the shape's elements of type `T`.
    pub fn bytes<T>(self) -> Result<usize> {
        self.len()?
            .checked_mul(size_of::<T>())
            .ok_or_else(|| Error::SizeOverflow {
                what: format!("the byte count of shape {self}"),
                limit: "usize",
            })
    }

    /// Whether the shape has no elements (some axis is 0).
    pub fn is_empty(self) -> bool {
        self.rows() == 0 || self.cols() == 0
    }

    /// Rows of a matrix; 1 for a vector.
    pub fn rows(self) -> usize {
        match self {
            Shape::Vector(_) => 1,
            Shape::Matrix(r, _) => r,
        }
    }

    /// Columns of a matrix; the length of a vector.
    pub fn cols(self) -> usize {
        match self {
            Shape::Vector(n) | Shape::Matrix(_, n) => n,
        }
    }
}

impl From<[usize; 2]> for Shape {
    fn from([r, c]: [usize; 2]) -> Shape {
        Shape::Matrix(r, c)
    }
}

impl From<[usize; 1]> for Shape {
    fn from([n]: [usize; 1]) -> Shape {
        Shape::Vector(n)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Shape::Vector(n) => write!(f, "[{n}]"),
            Shape::Matrix(r, c) => write!(f, "[{r}, {c}]"),
        }
    }
}

/// A buffer of `actual` elements holds exactly `shape`.
fn check_len(shape: Shape, actual: usize) -> Result<()> {
    let expected = shape.len()?;
    if expected != actual {
        return Err(Error::BufferLength {
            shape: shape.to_string(),
            expected,
            actual,
        });
    }
    Ok(())
}

/// A tensor a kernel reads. Cloning it makes another view of the same
/// device memory (it copies nothing).
#[derive(Debug)]
pub struct Tensor<'a, T> {
    view: CudaView<'a, T>,
    shape: Shape,
}

impl<T> Clone for Tensor<'_, T> {
    fn clone(&self) -> Self {
        Tensor {
            view: self.view.slice(..),
            shape: self.shape,
        }
    }
}

impl<'a, T: Element> Tensor<'a, T> {
    /// Views a whole allocation with a shape; its length must match.
    pub fn new(slice: &'a CudaSlice<T>, shape: impl Into<Shape>) -> Result<Self> {
        Tensor::from_view(slice.as_view(), shape)
    }

    /// Views part of an allocation (`slice.slice(a..b)`) with a shape.
    pub fn from_view(view: CudaView<'a, T>, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        check_len(shape, view.len())?;
        Ok(Tensor { view, shape })
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The device address and the guard that orders this use after earlier
    /// work on other streams. For generated wrappers.
    #[doc(hidden)]
    pub fn device_ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
        self.view.device_ptr(stream)
    }

    #[doc(hidden)]
    pub fn stream(&self) -> &CudaStream {
        use cudarc::driver::DeviceSlice;
        self.view.stream()
    }
}

/// A tensor a kernel writes.
#[derive(Debug)]
pub struct TensorMut<'a, T> {
    view: CudaViewMut<'a, T>,
    shape: Shape,
}

impl<'a, T: Element> TensorMut<'a, T> {
    pub fn new(slice: &'a mut CudaSlice<T>, shape: impl Into<Shape>) -> Result<Self> {
        TensorMut::from_view(slice.as_view_mut(), shape)
    }

    pub fn from_view(view: CudaViewMut<'a, T>, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        check_len(shape, view.len())?;
        Ok(TensorMut { view, shape })
    }

    pub fn shape(&self) -> Shape {
        self.shape
    }

    #[doc(hidden)]
    pub fn device_ptr_mut<'s>(&'s mut self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
        self.view.device_ptr_mut(stream)
    }

    #[doc(hidden)]
    pub fn stream(&self) -> &CudaStream {
        use cudarc::driver::DeviceSlice;
        self.view.stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_count_and_print() {
        assert_eq!(Shape::from([3, 4]).len().unwrap(), 12);
        assert_eq!(Shape::from([3, 4]).bytes::<half::f16>().unwrap(), 24);
        assert!(Shape::from([0, 4]).is_empty() && Shape::from([0]).is_empty());
        assert!(!Shape::from([1, 1]).is_empty());
        assert_eq!(Shape::from([5]).cols(), 5);
        assert_eq!(Shape::from([5]).rows(), 1);
        assert_eq!(Shape::from([3, 4]).to_string(), "[3, 4]");
        let e = check_len(Shape::from([3, 4]), 10).unwrap_err().to_string();
        assert_eq!(e, "shape [3, 4] needs 12 elements but the buffer holds 10");
    }

    #[test]
    fn a_shape_whose_size_overflows_is_an_error_not_a_wrapped_count() {
        // 2^61 + 1 rows of 8: the product wraps to 8 in unchecked arithmetic.
        let shape = Shape::from([(1usize << 61) + 1, 8]);
        let e = shape.len().unwrap_err();
        assert!(matches!(e, Error::SizeOverflow { .. }), "{e}");
        assert_eq!(
            e.to_string(),
            "the element count of shape [2305843009213693953, 8] overflows usize: no device buffer can be that large; check the shape"
        );
        // So no buffer, not even one of 8 elements, matches it.
        assert!(matches!(check_len(shape, 8), Err(Error::SizeOverflow { .. })));
        // Elements fit but bytes do not.
        let e = Shape::from([1usize << 62]).bytes::<f32>().unwrap_err();
        assert!(
            e.to_string()
                .starts_with("the byte count of shape [4611686018427387904]"),
            "{e}"
        );
    }
}
