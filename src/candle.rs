//! Fused graphs on candle tensors (feature `candle`): a graph's wrapper
//! called on candle CUDA tensors, on their device's stream, reading and
//! writing their device memory where it is (nothing is copied).
//!
//! [`call`] runs one call: it views the candle inputs as [`Tensor`]s,
//! allocates the outputs as candle tensors and hands both to a closure that
//! calls the wrapper. [`Views`] lends candle tensors to a graph struct for as
//! long as it lives, which is how a struct binds weights that candle loaded.
//!
//! A candle tensor of rank 2 or more is seen as a matrix of its last axis
//! (`[batch, seq, hidden]` is `[batch·seq, hidden]`), as a transformer block
//! treats its tokens; one of rank 1 as a vector. It must be contiguous (a
//! transposed or narrowed view is refused: call `.contiguous()` first) and of
//! the element type the graph is called for.

use crate::{Element, Error, Result, Shape, Tensor, TensorMut};
use candle_core::backend::BackendStorage;
use candle_core::cuda::{CudaDType, CudaDevice, CudaStorage};
use candle_core::op::BackpropOp;
use candle_core::{Layout, Storage, StorageRef, TensorId, WithDType};
use cudarc::driver::{CudaSlice, CudaStream};
use std::sync::Arc;

/// An element type of both fusion's tensors and candle's CUDA tensors: f16
/// and bf16, the ones fusion's kernels are compiled for (and f32).
pub trait CandleElement: Element + CudaDType + WithDType {}
impl<T: Element + CudaDType + WithDType> CandleElement for T {}

/// Candle tensors lent to fusion: each one's storage is locked for reading
/// while the `Views` lives, so that [`Views::tensor`] can view it as a
/// [`Tensor`] for that long.
///
/// A graph struct bound to views (`SwigluFfn::new(&stream, weights)` with
/// weights from [`Views::tensor`]) borrows them, so candle's weights serve
/// the fused graph without a second copy in device memory. A tensor given
/// twice is locked once. The lock is candle's, which queues readers behind
/// a waiting writer: while tensors are lent, an in-place write to one of
/// them (`slice_set`, `Var::set`) waits until the views are dropped, and
/// waits for ever on this thread; and if another thread is waiting to write
/// one, locking the same storage again on this thread (another `Views` or
/// [`call`] of it, or of a view of it) waits for ever too. Weights are not
/// written in place at inference: drop the struct and its views before
/// training them.
pub struct Views<'t> {
    /// Each distinct tensor's storage, locked for reading.
    storages: Vec<(TensorId, StorageRef<'t>)>,
    tensors: Vec<Lent<'t>>,
}

/// One lent candle tensor: which of the storages it reads, its layout and
/// the role it is named by in errors.
struct Lent<'t> {
    storage: usize,
    layout: &'t Layout,
    role: String,
}

impl<'t> Views<'t> {
    /// Locks each tensor's storage for reading. Fails with
    /// [`Error::CandleTensor`] when a tensor is not on a CUDA device or not
    /// on the same device as the first.
    pub fn new(tensors: &[&'t candle_core::Tensor]) -> Result<Self> {
        Views::with_role(tensors, "tensor")
    }

    fn with_role(tensors: &[&'t candle_core::Tensor], role: &str) -> Result<Self> {
        let first = tensors.first().map(|t| t.device());
        let mut views = Views {
            storages: Vec::new(),
            tensors: Vec::new(),
        };
        for (i, t) in tensors.iter().enumerate() {
            let role = format!("{role} {i}");
            if !t.device().is_cuda() {
                return Err(refused(
                    &role,
                    format!("is on {:?}, not on a CUDA device", t.device()),
                ));
            }
            if let Some(first) = first.filter(|first| !first.same_device(t.device())) {
                return Err(refused(
                    &role,
                    format!(
                        "is on {:?}, another device than the first's ({first:?})",
                        t.device()
                    ),
                ));
            }
            let storage = match views.storages.iter().position(|(id, _)| *id == t.id()) {
                Some(locked) => locked,
                None => {
                    views.storages.push((t.id(), t.storage_and_layout().0));
                    views.storages.len() - 1
                }
            };
            views.tensors.push(Lent {
                storage,
                layout: t.layout(),
                role,
            });
        }
        Ok(views)
    }

    /// How many tensors are lent.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether none are.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Tensor `i` as a fusion tensor of element type `T`, viewing candle's
    /// memory: [`Error::CandleTensor`] when it holds another element type,
    /// is not contiguous or has rank 0.
    ///
    /// # Panics
    ///
    /// When `i` is not below [`Views::len`].
    pub fn tensor<T: CandleElement>(&self, i: usize) -> Result<Tensor<'_, T>> {
        let lent = &self.tensors[i];
        let storage = self.cuda_storage(lent)?;
        let wanted = <T as WithDType>::DTYPE;
        if storage.dtype() != wanted {
            return Err(refused(
                &lent.role,
                format!(
                    "holds {:?}, but the graph is called for {wanted:?}",
                    storage.dtype()
                ),
            ));
        }
        let (start, end) = lent.layout.contiguous_offsets().ok_or_else(|| {
            refused(
                &lent.role,
                format!(
                    "is not contiguous (shape {:?}, strides {:?}): call `.contiguous()` first",
                    lent.layout.dims(),
                    lent.layout.stride()
                ),
            )
        })?;
        let slice = storage
            .as_cuda_slice::<T>()
            .map_err(|e| refused(&lent.role, e.to_string()))?;
        Tensor::from_view(
            slice.slice(start..end),
            matrix_of(&lent.role, lent.layout.dims())?,
        )
    }

    /// The CUDA device of the tensors, with the stream candle launches its
    /// own kernels on; `None` when none are lent.
    fn device(&self) -> Result<Option<&CudaDevice>> {
        match self.tensors.first() {
            Some(lent) => Ok(Some(&self.cuda_storage(lent)?.device)),
            None => Ok(None),
        }
    }

    fn cuda_storage(&self, lent: &Lent<'_>) -> Result<&CudaStorage> {
        match &*self.storages[lent.storage].1 {
            Storage::Cuda(storage) => Ok(storage),
            _ => Err(refused(&lent.role, "is not in CUDA memory".to_owned())),
        }
    }
}

/// Calls a fused graph on candle tensors: `inputs` are viewed in place,
/// outputs of the shapes `outputs` gives are allocated on their device, and
/// `launch` gets candle's stream for that device (the one candle's own ops
/// run on, so the call is ordered after them and before what follows) with
/// the inputs and outputs as fusion tensors, in order. Returns the outputs
/// as candle tensors (with no gradient history).
///
/// ```no_run
/// # fn demo(ffn: &mut fusion::kernels::SwigluFfn<'_, half::f16>, x: &candle_core::Tensor) -> fusion::Result<()> {
/// let [y] = fusion::candle::call([x], [x.dims()], |stream, [x], [y]| ffn.run(stream, x, y))?;
/// # Ok(()) }
/// ```
///
/// The outputs are allocated without being cleared: a graph's wrapper writes
/// every element of each output it is given (every bit pattern of f16 and
/// bf16 is a value, so an element a `launch` leaves unwritten reads as an
/// arbitrary number, never as undefined behaviour).
///
/// [`Error::CandleTensor`] names an input that is not a contiguous CUDA
/// tensor of element type `T` on the first input's device, and an output
/// shape of rank 0; `call` without inputs is refused the same way, since the
/// device comes from them.
pub fn call<T, const I: usize, const O: usize>(
    inputs: [&candle_core::Tensor; I],
    outputs: [&[usize]; O],
    launch: impl FnOnce(&Arc<CudaStream>, &[Tensor<'_, T>; I], &mut [TensorMut<'_, T>; O]) -> Result<()>,
) -> Result<[candle_core::Tensor; O]>
where
    T: CandleElement,
{
    let views = Views::with_role(&inputs, "input")?;
    let device = views
        .device()?
        .ok_or_else(|| refused("inputs", "are none: the call's device is its inputs'".to_owned()))?
        .clone();
    let stream = device.cuda_stream();
    let inputs: [Tensor<'_, T>; I] = array((0..I).map(|i| views.tensor(i)))?;
    let mut slices: [(CudaSlice<T>, Shape); O] = array(outputs.iter().enumerate().map(|(i, dims)| {
        let role = format!("output {i}");
        let shape = matrix_of(&role, dims)?;
        // SAFETY: the memory is written by the launch before it is read (see
        // above); reading it unwritten reads some value of T, not undefined
        // behaviour, as every bit pattern of T is one.
        let slice = unsafe { device.alloc::<T>(shape.len()?) }
            .map_err(|e| refused(&role, format!("could not be allocated: {e}")))?;
        Ok((slice, shape))
    }))?;
    {
        let mut outs: [TensorMut<'_, T>; O] = array(
            slices
                .iter_mut()
                .map(|(slice, shape)| TensorMut::new(slice, *shape)),
        )?;
        launch(&stream, &inputs, &mut outs)?;
    }
    drop(inputs);
    drop(views);
    let mut dims = outputs.into_iter();
    Ok(slices.map(|(slice, _)| {
        let storage = Storage::Cuda(CudaStorage::wrap_cuda_slice(slice, device.clone()));
        let dims = dims.next().expect("one shape per output").to_vec();
        candle_core::Tensor::from_storage(storage, dims, BackpropOp::none(), false)
    }))
}

/// Candle's dims as fusion's shape: a vector for rank 1, else a matrix of
/// the last axis.
fn matrix_of(role: &str, dims: &[usize]) -> Result<Shape> {
    match dims {
        [] => Err(refused(
            role,
            "has rank 0; fusion's tensors are vectors or matrices".to_owned(),
        )),
        [n] => Ok(Shape::Vector(*n)),
        [rows @ .., cols] => {
            let rows = rows.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
            let rows = rows.ok_or_else(|| Error::SizeOverflow {
                what: format!("the row count of candle {role} of shape {dims:?}"),
                limit: "usize",
            })?;
            Ok(Shape::Matrix(rows, *cols))
        }
    }
}

/// Collects exactly `N` results into an array, or the first error.
fn array<X, const N: usize>(items: impl Iterator<Item = Result<X>>) -> Result<[X; N]> {
    let items = items.collect::<Result<Vec<X>>>()?;
    let count = items.len();
    items
        .try_into()
        .map_err(|_| unreachable!("{count} items collected where {N} were made"))
}

fn refused(role: &str, reason: String) -> Error {
    Error::CandleTensor {
        tensor: role.to_owned(),
        reason,
    }
}

/// So that candle code can use `?` on fusion's calls.
impl From<Error> for candle_core::Error {
    fn from(e: Error) -> Self {
        candle_core::Error::wrap(e)
    }
}
