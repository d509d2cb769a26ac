//! Typed tensor views over device memory: what kernel wrappers take.
//!
//! A [`Tensor`] (read) or [`TensorMut`] (written) pairs a cudarc view with a
//! shape; constructing one checks that the buffer holds exactly that many
//! elements. Wrappers then check shapes against the graph, alignment and
//! context before anything is launched.
//!
//! A [`Tensor`] either borrows its memory ([`Tensor::new`], [`Tensor::from_view`])
//! or holds it ([`Tensor::owned`], [`Tensor::shared`]: a `Tensor<'static, T>`),
//! so that a struct can keep weights and the graph that reads them together
//! (what `XWeights::from_safetensors` returns).
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
    CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut, DeviceRepr, DeviceSlice,
    SyncOnDrop,
};
use fusion_compiler::ir::DType;
use std::fmt;
use std::sync::Arc;

/// An element type kernels are compiled for.
pub trait Element: DeviceRepr + Copy + Send + Sync + 'static {
    /// The graph element type it is.
    const DTYPE: DType;
    /// Elements from their little-endian bytes, as safetensors files hold
    /// them; `bytes.len()` is a multiple of the element's size.
    fn from_le_bytes(bytes: &[u8]) -> Vec<Self>;
    /// The elements' little-endian bytes, as safetensors files hold them.
    fn to_le_bytes(values: &[Self]) -> Vec<u8>;
}

/// `Element` for a type with `from_le_bytes` and `to_le_bytes` of its own.
macro_rules! element {
    ($ty:ty, $dtype:ident) => {
        impl Element for $ty {
            const DTYPE: DType = DType::$dtype;
            fn from_le_bytes(bytes: &[u8]) -> Vec<Self> {
                bytes
                    .chunks_exact(size_of::<Self>())
                    .map(|chunk| {
                        <$ty>::from_le_bytes(chunk.try_into().expect("chunks of the element's size"))
                    })
                    .collect()
            }
            fn to_le_bytes(values: &[Self]) -> Vec<u8> {
                values.iter().flat_map(|v| v.to_le_bytes()).collect()
            }
        }
    };
}

element!(half::f16, F16);
element!(half::bf16, BF16);
element!(f32, F32);

/// A row vector `[n]` or a row-major matrix `[rows, cols]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Shape {
    /// A row vector of this many elements.
    Vector(usize),
    /// A matrix of this many rows and columns.
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
/// device memory (it copies nothing; an owned tensor's clones share it).
#[derive(Debug)]
pub struct Tensor<'a, T> {
    memory: Memory<'a, T>,
    shape: Shape,
}

/// Where a [`Tensor`]'s elements live.
#[derive(Debug)]
enum Memory<'a, T> {
    /// Part or all of an allocation someone else owns.
    Borrowed(CudaView<'a, T>),
    /// An allocation the tensor keeps alive, maybe with other tensors.
    Shared(Arc<CudaSlice<T>>),
}

impl<T> Clone for Tensor<'_, T> {
    fn clone(&self) -> Self {
        let memory = match &self.memory {
            Memory::Borrowed(view) => Memory::Borrowed(view.slice(..)),
            Memory::Shared(slice) => Memory::Shared(Arc::clone(slice)),
        };
        Tensor {
            memory,
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
        Ok(Tensor {
            memory: Memory::Borrowed(view),
            shape,
        })
    }

    /// Its shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The device address and the guard that orders this use after earlier
    /// work on other streams. For generated wrappers.
    #[doc(hidden)]
    pub fn device_ptr<'s>(&'s self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
        match &self.memory {
            Memory::Borrowed(view) => view.device_ptr(stream),
            Memory::Shared(slice) => slice.device_ptr(stream),
        }
    }

    #[doc(hidden)]
    pub fn stream(&self) -> &CudaStream {
        match &self.memory {
            Memory::Borrowed(view) => view.stream(),
            Memory::Shared(slice) => slice.stream(),
        }
    }
}

impl<T: Element> Tensor<'static, T> {
    /// Takes a whole allocation with a shape; its length must match. The
    /// tensor frees it when the last of its clones is dropped.
    pub fn owned(slice: CudaSlice<T>, shape: impl Into<Shape>) -> Result<Self> {
        Tensor::shared(Arc::new(slice), shape)
    }

    /// Shares an allocation others may hold too (one buffer bound to
    /// several graphs); its length must match the shape.
    pub fn shared(slice: Arc<CudaSlice<T>>, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        check_len(shape, slice.len())?;
        Ok(Tensor {
            memory: Memory::Shared(slice),
            shape,
        })
    }
}

/// A tensor a kernel writes.
#[derive(Debug)]
pub struct TensorMut<'a, T> {
    view: CudaViewMut<'a, T>,
    shape: Shape,
}

impl<'a, T: Element> TensorMut<'a, T> {
    /// Views a whole allocation with a shape; its length must match.
    pub fn new(slice: &'a mut CudaSlice<T>, shape: impl Into<Shape>) -> Result<Self> {
        TensorMut::from_view(slice.as_view_mut(), shape)
    }

    /// Views part of an allocation (`slice.slice_mut(a..b)`) with a shape.
    pub fn from_view(view: CudaViewMut<'a, T>, shape: impl Into<Shape>) -> Result<Self> {
        let shape = shape.into();
        check_len(shape, view.len())?;
        Ok(TensorMut { view, shape })
    }

    /// Its shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    #[doc(hidden)]
    pub fn device_ptr_mut<'s>(&'s mut self, stream: &'s CudaStream) -> (u64, SyncOnDrop<'s>) {
        self.view.device_ptr_mut(stream)
    }

    #[doc(hidden)]
    pub fn stream(&self) -> &CudaStream {
        self.view.stream()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elements_round_trip_through_little_endian_bytes() {
        use half::{bf16, f16};
        let values = [f16::from_f32(1.5), f16::from_f32(-2.0)];
        let bytes = <f16 as Element>::to_le_bytes(&values);
        assert_eq!(bytes, [0x00, 0x3e, 0x00, 0xc0]);
        assert_eq!(<f16 as Element>::from_le_bytes(&bytes), values);
        let bytes = <f32 as Element>::to_le_bytes(&[1.0]);
        assert_eq!(bytes, 1.0f32.to_le_bytes());
        assert_eq!(<f32 as Element>::from_le_bytes(&bytes), [1.0]);
        let b = [bf16::from_f32(3.0)];
        assert_eq!(
            <bf16 as Element>::from_le_bytes(&<bf16 as Element>::to_le_bytes(&b)),
            b
        );
    }

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
