//! What generated wrappers call: argument checks, the device memory a call
//! needs beside its tensors (the [`Workspace`]), and launch-result handling.
//! Not an API for users; it is public so that wrappers generated into
//! another crate can reach it.
//!
//! A wrapper makes one [`Call`], hands it every tensor (each is checked as it
//! arrives: shape against the declaration, dynamic dims against earlier
//! tensors, row length a multiple of 8, same CUDA context as the stream,
//! 16-byte alignment), checks aliasing, and only then launches anything.
//!
//! Rust owns every byte of device memory a launch uses: CUDA host code never
//! allocates, locks or reads the environment. A GEMM launcher says how much
//! scratch a call needs (`<symbol>_workspace_bytes`, see
//! `fusion-compiler/kernels/include/fusion/abi.h`: stream-K partial tiles and flags, a
//! folded norm's row statistics, a per-call norm's normalized A) and takes it from the [`Workspace`] a
//! graph struct holds (its own, or one it shares with other structs:
//! [`SharedWorkspace`]), or, for the free functions of one-kernel graphs,
//! from the workspace this module keeps per stream
//! ([`with_stream_workspace`]).

use crate::abi;
use crate::device::Arch;
use crate::error::{Error, Result};
use crate::tensor::{Element, Shape, Tensor, TensorMut};
use cudarc::driver::sys::CUstreamCaptureStatus;
use cudarc::driver::{CudaEvent, CudaSlice, CudaStream, DevicePtr, DevicePtrMut, SyncOnDrop};
use fusion_compiler::gemm_model::Splits;
use fusion_compiler::ir::DType;
use std::ffi::{CStr, c_int, c_void};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, TryLockError, Weak};
use std::thread::ThreadId;

pub use crate::abi::{ErrorString, FoldWeights, Launcher, WorkspaceBytes};

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

impl TensorDecl {
    pub const fn new(name: &'static str, shape: &'static [Dim]) -> TensorDecl {
        TensorDecl { name, shape }
    }
}

/// The device memory a graph's calls keep between them: a buffer per
/// intermediate tensor and one of scratch for the launchers, each grown on
/// demand (zeroed when grown: stream-K's flags must start at 0, and kernels
/// leave them at 0) and reused by every later call that fits. A buffer
/// replaced by a larger one is freed after the work queued on the growing
/// call's stream, which follows the last use (below). Dropping the
/// workspace waits for the last call that used it, wherever that ran, then
/// frees them.
///
/// Calls on different streams, or from different threads, may share one
/// workspace: each call ([`Workspace::begin_call`]) records an event on its
/// stream after its launches, and a call on another stream or from another
/// thread first makes its stream wait for that event, so the two never
/// overlap. cudarc's own events do not suffice: it tracks none while a
/// context has made no second stream (one stream, or candle's per-thread
/// default streams, one handle meaning another stream in every thread) or
/// with event tracking turned off.
///
/// A workspace is never grown while its stream is being captured into a
/// CUDA graph ([`Error::WorkspaceGrowsInCapture`]): run the call once before
/// capturing. The graph keeps the buffers' addresses, so the workspace must
/// outlive it and not grow (no larger call on it) while the graph may still
/// be replayed.
///
/// Several graph structs may share one workspace ([`SharedWorkspace`],
/// `with_workspace` on a generated struct): their calls run one after
/// another on a stream, so one set of buffers serves them all, each buffer
/// as large as the largest call needs (slot `i` holds the `i`-th
/// intermediate of whichever graph runs). The layers of a model then hold
/// one layer's workspace, not one per layer. A struct's
/// `workspace_bytes(stream, m)` says what one of its calls needs, and its
/// `reserve_workspace(stream, m)` grows the workspace to that before a
/// capture.
#[derive(Debug, Default)]
pub struct Workspace {
    intermediates: Buffers,
    scratch: Buffers,
    last_use: Option<LastUse>,
    queries: QueryCache,
}

/// Where a workspace was last used, and the event recorded on that stream
/// after the call's launches.
#[derive(Debug)]
struct LastUse {
    site: UseSite<CudaStream>,
    event: CudaEvent,
}

/// One stream as a thread uses it: the stream by the identity of its `Arc`,
/// the thread because a per-thread default stream's handle is another
/// stream in every thread. Not by the raw handle: once a stream is
/// destroyed (its work may still be queued) CUDA may give the handle to the
/// next stream made, and a call there would skip the wait for that work.
/// The `Weak` keeps the `Arc`'s allocation, so no other stream takes its
/// address while the site is kept, and the stream itself is not kept alive.
#[derive(Debug)]
struct UseSite<S> {
    stream: Weak<S>,
    thread: ThreadId,
}

impl<S> UseSite<S> {
    /// `stream` as the current thread uses it.
    fn of(stream: &Arc<S>) -> UseSite<S> {
        UseSite {
            stream: Arc::downgrade(stream),
            thread: std::thread::current().id(),
        }
    }

    /// Whether a call on `stream` from the current thread runs here, so is
    /// ordered after this use by the stream alone. Two `Arc`s of one
    /// stream are two sites: a wait where none was needed, never the
    /// reverse.
    fn is(&self, stream: &Arc<S>) -> bool {
        std::ptr::eq(self.stream.as_ptr(), Arc::as_ptr(stream)) && self.thread == std::thread::current().id()
    }
}

/// A workspace that several graph structs hold, called one at a time
/// (clones share it): each call locks it for as long as it enqueues its
/// kernels. Structs on one stream share one ([`SharedWorkspace::new`],
/// then `with_workspace(workspace.clone())` on each struct); the
/// workspace's own events order calls on other streams or threads after
/// the last use, as for one struct. Its memory is freed with the last
/// clone, after the last call that used it.
#[derive(Clone, Debug, Default)]
pub struct SharedWorkspace(Arc<Mutex<Workspace>>);

impl SharedWorkspace {
    /// An empty workspace to share.
    pub fn new() -> SharedWorkspace {
        SharedWorkspace::default()
    }

    /// Locks the workspace for one call. A call that panicked while it
    /// held the lock left the buffers usable (a buffer is replaced whole,
    /// after its successor exists), so a poisoned lock is taken as it is.
    pub fn lock(&self) -> MutexGuard<'_, Workspace> {
        self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// [`Workspace::bytes`], now.
    pub fn bytes(&self) -> usize {
        self.lock().bytes()
    }

    /// [`Workspace::allocations`], so far.
    pub fn allocations(&self) -> usize {
        self.lock().allocations()
    }

    /// [`Workspace::scratch_bytes`], now.
    pub fn scratch_bytes(&self) -> usize {
        self.lock().scratch_bytes()
    }

    /// [`Workspace::intermediate_bytes`], now.
    pub fn intermediate_bytes(&self) -> usize {
        self.lock().intermediate_bytes()
    }

    /// Whether `self` and `other` are one workspace.
    pub fn is(&self, other: &SharedWorkspace) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Workspace {
    pub fn new() -> Workspace {
        Workspace::default()
    }

    /// An empty workspace to share between graph structs
    /// ([`SharedWorkspace::new`]).
    pub fn shared() -> SharedWorkspace {
        SharedWorkspace::new()
    }

    /// The intermediates' buffers and the scratch for one call on `stream`,
    /// ordered after the workspace's last use if that was on another stream
    /// or from another thread, and the [`CallUse`] that records this use for
    /// the next: [`CallUse::finish`] after the call's launches (dropped
    /// unfinished, when the call fails part way, it records all the same).
    /// While `stream` is being captured into a CUDA graph neither happens:
    /// a replay is ordered by the stream it is launched on.
    #[doc(hidden)]
    pub fn begin_call(
        &mut self,
        stream: &Arc<CudaStream>,
    ) -> Result<(&mut Buffers, &mut Buffers, CallUse<'_>)> {
        let parts = self.begin_call_parts(stream)?;
        Ok((parts.intermediates, parts.scratch, parts.call_use))
    }

    /// [`Workspace::begin_call`], with the answers of the launchers'
    /// workspace queries that this workspace keeps ([`QueryCache`]).
    #[doc(hidden)]
    pub fn begin_call_parts(&mut self, stream: &Arc<CudaStream>) -> Result<CallParts<'_>> {
        let capturing = Allocator::capturing(stream)?;
        if !capturing
            && let Some(last) = &self.last_use
            && !last.site.is(stream)
        {
            stream.wait(&last.event)?;
        }
        let call_use = CallUse {
            last_use: &mut self.last_use,
            stream: (!capturing).then(|| stream.clone()),
        };
        Ok(CallParts {
            intermediates: &mut self.intermediates,
            scratch: &mut self.scratch,
            queries: &mut self.queries,
            call_use,
        })
    }

    /// Bytes of scratch held now (0 until a call needed some).
    pub fn scratch_bytes(&self) -> usize {
        self.scratch.len(0)
    }

    /// Bytes held now for intermediates, all slots together.
    pub fn intermediate_bytes(&self) -> usize {
        (0..self.intermediates.slots.len())
            .map(|slot| self.intermediates.len(slot))
            .sum()
    }

    /// Device bytes held now: [`Workspace::intermediate_bytes`] plus
    /// [`Workspace::scratch_bytes`].
    pub fn bytes(&self) -> usize {
        self.intermediate_bytes() + self.scratch_bytes()
    }

    /// Grows the workspace, as a call on `stream` would, so that it holds
    /// `intermediates[i]` bytes in slot `i` and `scratch` bytes of scratch:
    /// ordered after its last use elsewhere, refused while `stream` is
    /// being captured ([`Error::WorkspaceGrowsInCapture`]) unless it
    /// already fits.
    pub fn reserve(
        &mut self,
        stream: &Arc<CudaStream>,
        intermediates: &[usize],
        scratch: usize,
    ) -> Result<()> {
        let (buffers, scratch_buffers, call_use) = self.begin_call(stream)?;
        buffers.allocations += fit(&mut buffers.slots, intermediates, stream)?;
        scratch_buffers.allocations += fit(&mut scratch_buffers.slots, &[scratch], stream)?;
        call_use.finish()
    }

    /// Device buffers allocated since the workspace was made; an identical
    /// second call allocates none.
    pub fn allocations(&self) -> usize {
        self.intermediates.allocations + self.scratch.allocations
    }
}

/// What one call takes from a [`Workspace`] ([`Workspace::begin_call_parts`]).
#[doc(hidden)]
pub struct CallParts<'w> {
    pub intermediates: &'w mut Buffers,
    pub scratch: &'w mut Buffers,
    pub queries: &'w mut QueryCache,
    pub call_use: CallUse<'w>,
}

/// The answers a workspace keeps of its calls' GEMM workspace queries
/// (`<symbol>_workspace_bytes`, abi.h), so that a call of a shape seen
/// before asks no launcher. A query's answer is a function of what the
/// key holds: the launcher's query (gemm.cu.hbs's `workspace_bytes`,
/// gemm.cuh's and decode.cuh's `workspace_bytes`, sm90/mainloop.cuh's
/// `workspace_layout`) reads the params' sizes, row stride, epsilon and
/// flags, which operands are null and whether each is 16-byte aligned, and
/// the current device's SM count; never the memory behind a pointer, nor
/// the stream. The device is the context's (one context, one device), so
/// the context is in the key. At most [`QueryCache::CAPACITY`] answers are
/// kept; a new one past that replaces them all (a call with M growing
/// token by token asks once per M).
#[derive(Debug, Default)]
pub struct QueryCache {
    answers: Vec<(QueryKey, u64)>,
    /// Queries asked of launchers, for tests.
    asked: usize,
}

/// What a GEMM workspace query's answer depends on ([`QueryCache`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueryKey {
    /// The query's address.
    query: usize,
    /// The context's handle and its device's ordinal.
    context: (usize, usize),
    sizes: [i64; 4],
    eps: u32,
    flags: u32,
    /// Two bits per pointer field: non-null, and 16-byte aligned.
    pointers: u32,
}

impl QueryKey {
    /// The key of `query` asked about `params` on `context`'s device.
    pub fn of(
        query: WorkspaceBytes<abi::fusion_gemm_params>,
        context: &cudarc::driver::CudaContext,
        params: &abi::fusion_gemm_params,
    ) -> QueryKey {
        QueryKey::on((context.cu_ctx() as usize, context.ordinal()), query, params)
    }

    fn on(
        context: (usize, usize),
        query: WorkspaceBytes<abi::fusion_gemm_params>,
        p: &abi::fusion_gemm_params,
    ) -> QueryKey {
        let pointers = p.pointers().iter().enumerate().fold(0u32, |bits, (i, &ptr)| {
            let given = u32::from(!ptr.is_null());
            let aligned = u32::from((ptr as usize).is_multiple_of(16));
            bits | (given | aligned << 1) << (2 * i)
        });
        QueryKey {
            query: query as usize,
            context,
            sizes: [p.m, p.n, p.k, p.ldb],
            eps: p.eps.to_bits(),
            flags: p.flags,
            pointers,
        }
    }
}

impl QueryCache {
    /// The most answers kept.
    pub const CAPACITY: usize = 16;

    /// The answer for `key`: the one kept, else `ask()`'s, kept where it
    /// succeeds (an error is asked again next time).
    pub fn answer(&mut self, key: QueryKey, ask: impl FnOnce() -> Result<u64>) -> Result<u64> {
        if let Some(&(_, bytes)) = self.answers.iter().find(|(k, _)| *k == key) {
            return Ok(bytes);
        }
        self.asked += 1;
        let bytes = ask()?;
        if self.answers.len() == Self::CAPACITY {
            self.answers.clear();
        }
        self.answers.push((key, bytes));
        Ok(bytes)
    }

    /// Queries asked of launchers so far.
    pub fn asked(&self) -> usize {
        self.asked
    }
}

/// One call's use of a [`Workspace`], recorded for the next call when
/// finished or dropped.
pub struct CallUse<'w> {
    last_use: &'w mut Option<LastUse>,
    /// The call's stream; `None` while capturing.
    stream: Option<Arc<CudaStream>>,
}

impl CallUse<'_> {
    /// Whether the call's stream is being captured into a CUDA graph, as
    /// [`Workspace::begin_call`] found it: the call needs no second query.
    pub fn capturing(&self) -> bool {
        self.stream.is_none()
    }

    /// Records the end of the call's launches on its stream.
    pub fn finish(mut self) -> Result<()> {
        self.record()
    }

    fn record(&mut self) -> Result<()> {
        let Some(stream) = self.stream.take() else {
            return Ok(());
        };
        // The event of the last use where it belongs to this stream's context.
        let event = match self.last_use.take() {
            Some(last) if last.event.context().cu_ctx() == stream.context().cu_ctx() => last.event,
            _ => stream.context().new_event(None)?,
        };
        event.record(&stream)?;
        *self.last_use = Some(LastUse {
            site: UseSite::of(&stream),
            event,
        });
        Ok(())
    }
}

impl Drop for CallUse<'_> {
    fn drop(&mut self) {
        // A call that failed part way: its error is the one reported.
        let _ = self.record();
    }
}

impl Drop for Workspace {
    /// Each buffer is freed on the stream it was allocated on, which need
    /// not be the one that last used it (nor, for a per-thread stream, the
    /// same stream in this thread): wait for that use first.
    fn drop(&mut self) {
        if let Some(last) = &self.last_use {
            // Nothing to do about a failure here: the buffers are freed
            // either way, as cudarc frees them.
            let _ = last.event.synchronize();
        }
    }
}

/// Device buffers in numbered slots, each grown to fit and then reused.
#[derive(Debug, Default)]
pub struct Buffers {
    slots: Vec<Option<WorkspaceBuffer>>,
    allocations: usize,
}

impl Buffers {
    fn len(&self, slot: usize) -> usize {
        self.slots
            .get(slot)
            .and_then(Option::as_ref)
            .map_or(0, |b| b.slice.len())
    }
}

/// One workspace buffer and its device address, taken once when it is
/// allocated. A call hands the address to its launches without cudarc's
/// per-use events (a wait on the buffer's last write and read, and a
/// record after, each a driver call, on every use once a context has a
/// second stream): the workspace orders its uses itself. Every use is a
/// call that [`Workspace::begin_call`] ordered after the last one
/// elsewhere, a replaced buffer is freed after the work queued on the
/// growing call's stream ([`Allocator::free_after_queued_work`]), and
/// dropping the workspace waits for its last use first.
#[derive(Debug)]
struct WorkspaceBuffer {
    slice: CudaSlice<u8>,
    address: u64,
}

impl WorkspaceBuffer {
    /// `slice`, zeroed on `stream` just now, with its address.
    fn new(slice: CudaSlice<u8>, stream: &CudaStream) -> WorkspaceBuffer {
        // The guard records one read on `stream`, after the zeroing: the
        // only event cudarc keeps for this buffer.
        let (address, guard) = slice.device_ptr(stream);
        drop(guard);
        WorkspaceBuffer { slice, address }
    }
}

/// Where workspace buffers come from: zeroed device memory on the call's
/// stream, or host memory in unit tests.
trait Allocator {
    type Buffer;
    /// Whether `buffer` holds `bytes` and can be used here.
    fn fits(&self, buffer: &Self::Buffer, bytes: usize) -> bool;
    /// Whether the stream is being captured into a graph.
    fn capturing(&self) -> Result<bool>;
    /// A new buffer of `bytes` bytes, all zero.
    fn alloc_zeroed(&self, bytes: usize) -> Result<Self::Buffer>;
    /// Frees `old`, a buffer [`fit`] replaced, after the work queued so far
    /// on the stream: that work follows the workspace's last use
    /// ([`Workspace::begin_call`]), which may have read or written `old`.
    fn free_after_queued_work(&self, old: Self::Buffer) -> Result<()>;
}

impl Allocator for Arc<CudaStream> {
    type Buffer = WorkspaceBuffer;
    fn fits(&self, buffer: &WorkspaceBuffer, bytes: usize) -> bool {
        buffer.slice.len() >= bytes && buffer.slice.context().cu_ctx() == self.context().cu_ctx()
    }
    fn capturing(&self) -> Result<bool> {
        Ok(self.capture_status()? != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE)
    }
    fn alloc_zeroed(&self, bytes: usize) -> Result<WorkspaceBuffer> {
        Ok(WorkspaceBuffer::new(self.alloc_zeros::<u8>(bytes)?, self))
    }
    /// cudarc frees a buffer on the stream it was allocated on, ordered
    /// after other streams' work only by its per-buffer events, which it
    /// does not keep while a context has made one stream, nor with tracking
    /// off: that stream waits for this one first. Where the two are one
    /// stream the wait is a no-op; growing is rare enough not to tell them
    /// apart.
    fn free_after_queued_work(&self, old: WorkspaceBuffer) -> Result<()> {
        let old = old.slice;
        let ordered = self
            .record_event(None)
            .and_then(|queued| old.stream().wait(&queued));
        if let Err(e) = ordered {
            // Freed unordered, it could be handed out again under the
            // queued work: leaked instead, on a context already failing.
            old.leak();
            return Err(e.into());
        }
        drop(old);
        Ok(())
    }
}

/// Makes slot i of `slots` hold `sizes[i]` bytes (0: leave it as it is):
/// a buffer that fits is kept, contents and all; one that does not is
/// replaced by a larger, zeroed one, and freed after the work queued on
/// `alloc`'s stream. Refuses to allocate while the stream is being
/// captured. Returns how many buffers it allocated.
fn fit<A: Allocator>(slots: &mut Vec<Option<A::Buffer>>, sizes: &[usize], alloc: &A) -> Result<usize> {
    let mut allocated = 0;
    for (slot, &bytes) in sizes.iter().enumerate() {
        allocated += usize::from(fit_slot(slots, slot, bytes, alloc)?);
    }
    Ok(allocated)
}

/// [`fit`] for slot `slot` alone (made, empty, where `slots` is shorter);
/// returns whether it allocated.
fn fit_slot<A: Allocator>(
    slots: &mut Vec<Option<A::Buffer>>,
    slot: usize,
    bytes: usize,
    alloc: &A,
) -> Result<bool> {
    if slots.len() <= slot {
        slots.resize_with(slot + 1, || None);
    }
    let held = &mut slots[slot];
    if bytes == 0 || held.as_ref().is_some_and(|b| alloc.fits(b, bytes)) {
        return Ok(false);
    }
    if alloc.capturing()? {
        return Err(Error::WorkspaceGrowsInCapture { bytes });
    }
    let grown = alloc.alloc_zeroed(bytes)?;
    if let Some(old) = held.replace(grown) {
        alloc.free_after_queued_work(old)?;
    }
    Ok(true)
}

/// The environment variable `name` as the process first read it, kept in
/// `cell`: the run time's settings are read once, so that a call's path
/// does not read the environment and a later change of a variable changes
/// nothing.
pub(crate) fn env_once(cell: &'static OnceLock<Option<String>>, name: &str) -> Option<&'static str> {
    cell.get_or_init(|| std::env::var(name).ok()).as_deref()
}

/// How GEMM launches split (`FUSION_STREAM_K`, [`Splits::from_setting`]);
/// [`Error::Setting`] for a value it does not take.
pub fn splits() -> Result<Splits> {
    static VALUE: OnceLock<Option<String>> = OnceLock::new();
    let value = env_once(&VALUE, "FUSION_STREAM_K");
    Splits::from_setting(value).ok_or_else(|| splits_error(value.unwrap_or_default()))
}

/// [`Error::Setting`] for `FUSION_STREAM_K=value`.
fn splits_error(value: &str) -> Error {
    Error::Setting {
        variable: "FUSION_STREAM_K",
        value: value.to_owned(),
        expected: "0 (no split), split-k (the default: split-K where the tiles are fewer than half the SMs and \
                   have at least 48 k-blocks, stream-K over the last wave where they have at least 192), \
                   tail (stream-K over every last wave too) or fill (stream-K over a lone wave too)",
    }
}

/// Reads `FUSION_TILE_COUNTER` once: `1` has the sm90 kernel's CTAs take
/// their whole tiles from a counter in every GEMM launch, instead of each
/// CTA's being fixed at launch. Off by default: on an H200 it cut the
/// slowdown of 4 streams at once (1.33x to 1.02-1.06x at 8192^3) but costs
/// one stream up to 11% where a CTA runs few tiles (14.1 against 12.7 us at
/// (512, 2048, 2048), one tile per CTA; benchmarks/HISTORY.md v18, v19).
fn tile_counter_enabled() -> bool {
    static VALUE: OnceLock<Option<String>> = OnceLock::new();
    env_once(&VALUE, "FUSION_TILE_COUNTER") == Some("1")
}

/// Workspaces kept per stream, for callers with no struct to keep one in.
/// An entry lives while its stream can still be used: while some `Arc` of
/// it exists beside those the workspace's own buffers hold (each device
/// buffer keeps the stream it was allocated on). Dead entries are dropped,
/// freeing their memory, at the next lookup.
struct Registry<S, W> {
    entries: Vec<(Weak<S>, Arc<Mutex<W>>)>,
}

/// What a registry needs of a workspace: how many references to `stream`
/// it holds itself.
trait HoldsStream<S> {
    fn refs_to(&self, stream: &Arc<S>) -> usize;
}

/// Each buffer a workspace allocated on a stream keeps that stream alive.
impl HoldsStream<CudaStream> for Workspace {
    fn refs_to(&self, stream: &Arc<CudaStream>) -> usize {
        let on = |b: &Buffers| {
            b.slots
                .iter()
                .flatten()
                .filter(|buffer| Arc::ptr_eq(buffer.slice.stream(), stream))
                .count()
        };
        on(&self.intermediates) + on(&self.scratch)
    }
}

impl<S, W: Default + HoldsStream<S>> Registry<S, W> {
    const fn new() -> Self {
        Registry { entries: Vec::new() }
    }

    /// The workspace of `stream`, made on first use.
    fn entry(&mut self, stream: &Arc<S>) -> Arc<Mutex<W>> {
        self.entries
            .retain(|(weak, workspace)| Self::live(weak, workspace));
        let key = Arc::as_ptr(stream);
        if let Some((_, workspace)) = self.entries.iter().find(|(weak, _)| weak.as_ptr() == key) {
            return workspace.clone();
        }
        let workspace = Arc::new(Mutex::new(W::default()));
        self.entries.push((Arc::downgrade(stream), workspace.clone()));
        workspace
    }

    fn live(weak: &Weak<S>, workspace: &Mutex<W>) -> bool {
        let Some(stream) = weak.upgrade() else {
            return false;
        };
        let workspace = match workspace.try_lock() {
            Ok(workspace) => workspace,
            Err(TryLockError::Poisoned(poisoned)) => poisoned.into_inner(),
            // A call is using it right now, with its stream.
            Err(TryLockError::WouldBlock) => return true,
        };
        // `stream` itself is one of the strong references.
        Arc::strong_count(&stream) - 1 > workspace.refs_to(&stream)
    }
}

static STREAM_WORKSPACES: Mutex<Registry<CudaStream, Workspace>> = Mutex::new(Registry::new());

/// Runs `f` with the workspace this module keeps for `stream` (one per
/// `Arc<CudaStream>`: clones of one `Arc` share it). The free functions of
/// one-kernel graphs (`kernels::gemm_bias_gelu(&stream, …)`) take their
/// scratch from it, so a repeated call allocates nothing; it is freed once
/// the stream is dropped, at the next call of any free function. Calls on
/// one stream from several threads take turns.
pub fn with_stream_workspace<R>(stream: &Arc<CudaStream>, f: impl FnOnce(&mut Workspace) -> R) -> R {
    let workspace = STREAM_WORKSPACES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(stream);
    let mut workspace = workspace.lock().unwrap_or_else(|e| e.into_inner());
    f(&mut workspace)
}

/// Where one dynamic dim got its value.
#[derive(Clone, Copy)]
pub(crate) struct Bound {
    value: usize,
    from: &'static str,
}

/// Matches a tensor's extents `actual` against `decl`'s dims, one each: a
/// static dim must be its value (`Ok(false)` where not, for the caller's own
/// shape error); a dynamic dim takes its value from the first tensor that
/// has it (into `dims`, one per dim of `graph`) and the later ones must
/// agree (`Error::DimMismatch`, naming both).
pub(crate) fn bind_dims(
    graph: &GraphDecl,
    dims: &mut [Option<Bound>],
    decl: &'static TensorDecl,
    actual: &[usize],
) -> Result<bool> {
    if actual.len() != decl.shape.len() {
        return Ok(false);
    }
    for (&dim, &value) in decl.shape.iter().zip(actual) {
        match dim {
            Dim::Static(n) if n != value => return Ok(false),
            Dim::Static(_) => {}
            Dim::Dynamic(i) => match dims[i] {
                None => {
                    dims[i] = Some(Bound {
                        value,
                        from: decl.name,
                    })
                }
                Some(bound) if bound.value != value => {
                    return Err(Error::DimMismatch {
                        dim: graph.dims[i].to_owned(),
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
    Ok(true)
}

/// A call's dims bound from tensor shapes alone, with no device: what
/// [`crate::plan::fill`] reads where no [`Call`] is made, to compare the
/// params two paths build.
pub struct ShapeDims {
    graph: &'static GraphDecl,
    dims: Vec<Option<Bound>>,
}

impl ShapeDims {
    pub fn new(graph: &'static GraphDecl) -> ShapeDims {
        ShapeDims {
            graph,
            dims: vec![None; graph.dims.len()],
        }
    }

    /// Binds `decl`'s dims from `extents`, as [`Call`] does for a tensor;
    /// `Ok(false)` where a static dim differs.
    pub fn bind(&mut self, decl: &'static TensorDecl, extents: &[usize]) -> Result<bool> {
        bind_dims(self.graph, &mut self.dims, decl, extents)
    }

    /// Gives dynamic dim `dim` the value `value` (read from `from`) where no
    /// tensor has bound it yet.
    pub fn set(&mut self, dim: usize, value: usize, from: &'static str) {
        self.dims[dim].get_or_insert(Bound { value, from });
    }

    /// The name of a dynamic dim of `decl` that nothing has bound.
    pub fn unbound(&self, decl: &TensorDecl) -> Option<&'static str> {
        decl.shape.iter().find_map(|&d| match d {
            Dim::Dynamic(i) if self.dims[i].is_none() => Some(self.graph.dims[i]),
            _ => None,
        })
    }
}

impl crate::plan::Extents for ShapeDims {
    fn matrix(&self, decl: &TensorDecl) -> Result<(i64, i64)> {
        matrix_of(&self.dims, decl)
    }
    fn reduced_matrix(&self, decl: &TensorDecl, output: &TensorDecl) -> Result<(i64, i64)> {
        reduced_matrix_of(self.graph, &self.dims, decl, output)
    }
}

/// A GEMM's weight in the form its kernel reads, computed once when a
/// graph struct binds its weights (`<symbol>_fold_weights`, abi.h): a norm
/// folded in, W' = W·diag(gamma) in W's dtype and layout, with per output
/// column the f32 pair (rowsum of W', W·beta); a gated GEMM's gate and up
/// weights interleaved into one (with no column terms when no norm folds);
/// and, where [`bound_row_stride`] says so, a plain weight copied with its
/// rows padded. Each form's rows start [`bound_row_stride`] elements apart.
/// The struct owns it in place of the weights it was made from (which it
/// keeps only where a kernel still reads them as given): the weights'
/// bytes (plus the padding), plus 8 bytes per column of terms, plus, for a
/// folded LayerNorm the guard may send to cuBLASLt, one element per column
/// ([`FoldedWeights::with_vendor_bias`]).
#[derive(Debug)]
pub struct FoldedWeights {
    weight: CudaSlice<u8>,
    col_terms: CudaSlice<f32>,
    /// Elements from one row of `weight` to the next.
    row_stride: usize,
    /// W·beta plus the GEMM's bias, per column, in the weight's element
    /// type: cuBLASLt's bias on the vendor path of a folded LayerNorm.
    vendor_bias: Option<CudaSlice<u8>>,
}

impl FoldedWeights {
    /// Device bytes it holds: the prepared weight, its column terms and
    /// the vendor path's bias.
    pub fn bytes(&self) -> usize {
        self.weight.len()
            + self.col_terms.len() * size_of::<f32>()
            + self.vendor_bias.as_ref().map_or(0, CudaSlice::len)
    }

    /// Adds the vendor path's bias of a folded LayerNorm: per column, the
    /// fold's term c = W·beta plus the GEMM's `bias` (the device address of
    /// its `[N]` elements, where it has one), rounded to `dtype`, which
    /// cuBLASLt adds to x̂·W'ᵀ (x̂ the rows normalized without the affine)
    /// as the folded kernel's epilogue adds c and the bias. Computed once,
    /// on the host, from the terms the fold wrote. Unchanged (no vendor
    /// bias, so the fused kernel runs) for a dtype the guard does not serve
    /// (f16 and bf16 only) and for a weight of no columns.
    ///
    /// # Safety
    ///
    /// `bias` must be the address of a live `[N]` tensor of `dtype` in the
    /// stream's context, N the fold's columns.
    pub unsafe fn with_vendor_bias(
        mut self,
        stream: &Arc<CudaStream>,
        dtype: DType,
        bias: Option<u64>,
    ) -> Result<FoldedWeights> {
        let bf16 = match dtype {
            DType::F16 => false,
            DType::BF16 => true,
            _ => return Ok(self),
        };
        let decode = |b: [u8; 2]| {
            if bf16 {
                half::bf16::from_le_bytes(b).to_f32()
            } else {
                half::f16::from_le_bytes(b).to_f32()
            }
        };
        let encode = |v: f32| {
            if bf16 {
                half::bf16::from_f32(v).to_le_bytes()
            } else {
                half::f16::from_f32(v).to_le_bytes()
            }
        };
        let terms = stream.clone_dtoh(&self.col_terms)?;
        let mut sums: Vec<f32> = terms.chunks_exact(2).map(|term| term[1]).collect();
        if sums.is_empty() {
            return Ok(self);
        }
        if let Some(bias) = bias {
            let mut bytes = vec![0u8; sums.len() * 2];
            // SAFETY: the caller vouches for `bias`: N elements of `dtype`
            // (2 bytes each); the host buffer holds as many bytes.
            unsafe { cudarc::driver::result::memcpy_dtoh_async(&mut bytes, bias, stream.cu_stream()) }?;
            stream.synchronize()?;
            for (sum, b) in sums.iter_mut().zip(bytes.chunks_exact(2)) {
                *sum += decode([b[0], b[1]]);
            }
        }
        let bytes: Vec<u8> = sums.iter().flat_map(|&v| encode(v)).collect();
        self.vendor_bias = Some(stream.clone_htod(&bytes)?);
        Ok(self)
    }

    /// Elements from one row of the prepared weight to the next.
    pub fn row_stride(&self) -> usize {
        self.row_stride
    }

    /// The prepared weight's bytes and its column terms, copied to the
    /// host: for tests that compare two ways of binding.
    pub fn to_host(&self, stream: &Arc<CudaStream>) -> Result<(Vec<u8>, Vec<f32>)> {
        Ok((
            stream.clone_dtoh(&self.weight)?,
            stream.clone_dtoh(&self.col_terms)?,
        ))
    }

    /// Allocates W', `dims` = (rows, row length) of elements of
    /// `element_bytes` each, its rows `bound_row_stride(arch, ..)` apart,
    /// and the terms of `columns` columns, then calls `fold(w_folded,
    /// col_terms, row_stride)`, which enqueues the fold on `call`'s stream
    /// and returns its code; `kernel` names it in errors.
    #[allow(clippy::too_many_arguments, reason = "the fold's sizes and its callback")]
    pub fn fold(
        call: &Call<'_>,
        kernel: &str,
        arch: Arch,
        dims: (i64, i64),
        element_bytes: usize,
        columns: usize,
        fold: impl FnOnce(*mut c_void, *mut c_void, i64) -> c_int,
        error_string: ErrorString,
    ) -> Result<FoldedWeights> {
        Self::fold_with(
            call,
            kernel,
            arch,
            dims,
            element_bytes,
            columns,
            |w_folded, col_terms, stride| {
                call.launched(kernel, fold(w_folded, col_terms, stride), error_string)
            },
        )
    }

    /// [`FoldedWeights::fold`], with `fold` enqueueing the work (in as many
    /// launches as it likes, each part of W' at its offset) and checking
    /// each launch's code itself.
    pub fn fold_with(
        call: &Call<'_>,
        kernel: &str,
        arch: Arch,
        dims: (i64, i64),
        element_bytes: usize,
        columns: usize,
        fold: impl FnOnce(*mut c_void, *mut c_void, i64) -> Result<()>,
    ) -> Result<FoldedWeights> {
        let stream = call.stream;
        let term_len = columns.checked_mul(2).ok_or_else(|| Error::SizeOverflow {
            what: format!("the folded column terms of {kernel}"),
            limit: "usize",
        })?;
        let mut folded = Self::alloc(
            call,
            kernel,
            arch,
            rows_of(dims, kernel)?,
            element_bytes,
            term_len,
        )?;
        let stride = as_i64(folded.row_stride, kernel)?;
        {
            let (weight, _weight_guard) = folded.weight.device_ptr_mut(stream);
            let (terms, _terms_guard) = folded.col_terms.device_ptr_mut(stream);
            fold(weight as *mut c_void, terms as *mut c_void, stride)?;
        }
        Ok(folded)
    }

    /// A copy of the weight at device address `weight` (`dims` = (rows,
    /// row length), dense, checked by `call`) with its rows
    /// `bound_row_stride(arch, ..)` apart, enqueued on `call`'s stream; None
    /// when that stride is the dense one, and the kernel reads the weight
    /// as it is.
    pub fn pad(
        call: &Call<'_>,
        kernel: &str,
        arch: Arch,
        weight: u64,
        dims: (i64, i64),
        element_bytes: usize,
    ) -> Result<Option<FoldedWeights>> {
        let (rows, row_length) = rows_of(dims, kernel)?;
        if rows == 0 || bound_row_stride(arch, row_length, element_bytes)? == row_length {
            return Ok(None);
        }
        let stream = call.stream;
        let mut padded = Self::alloc(call, kernel, arch, (rows, row_length), element_bytes, 0)?;
        let code = {
            let (dst, _guard) = padded.weight.device_ptr_mut(stream);
            // Every product fits: alloc sized rows x row_stride x element_bytes.
            let copy = cudarc::driver::sys::CUDA_MEMCPY2D {
                srcXInBytes: 0,
                srcY: 0,
                srcMemoryType: cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                srcHost: std::ptr::null(),
                srcDevice: weight,
                srcArray: std::ptr::null_mut(),
                srcPitch: row_length * element_bytes,
                dstXInBytes: 0,
                dstY: 0,
                dstMemoryType: cudarc::driver::sys::CUmemorytype::CU_MEMORYTYPE_DEVICE,
                dstHost: std::ptr::null_mut(),
                dstDevice: dst,
                dstArray: std::ptr::null_mut(),
                dstPitch: padded.row_stride * element_bytes,
                WidthInBytes: row_length * element_bytes,
                Height: rows,
            };
            // SAFETY: the source is the checked weight tensor (`call` holds
            // its guard: rows x row_length elements), the destination was
            // just allocated with rows x row_stride >= that, both in the
            // stream's context; the copy is ordered on the stream.
            unsafe { cudarc::driver::sys::cuMemcpy2DAsync_v2(&copy, stream.cu_stream()) }
        };
        code.result()?;
        Ok(Some(padded))
    }

    /// Zeroed room for `rows` rows at the bound row stride and `term_len`
    /// f32 terms (at least one element each: cudarc refuses empty buffers).
    fn alloc(
        call: &Call<'_>,
        kernel: &str,
        arch: Arch,
        (rows, row_length): (usize, usize),
        element_bytes: usize,
        term_len: usize,
    ) -> Result<FoldedWeights> {
        let row_stride = bound_row_stride(arch, row_length, element_bytes)?;
        let bytes = rows
            .checked_mul(row_stride)
            .and_then(|e| e.checked_mul(element_bytes))
            .ok_or_else(|| Error::SizeOverflow {
                what: format!("the prepared weight of {kernel}"),
                limit: "usize",
            })?;
        let stream = call.stream;
        Ok(FoldedWeights {
            weight: stream.alloc_zeros::<u8>(bytes.max(1))?,
            col_terms: stream.alloc_zeros::<f32>(term_len.max(1))?,
            row_stride,
            vendor_bias: None,
        })
    }
}

/// A prepared weight's (rows, row length) as the wrapper passes them (i64,
/// as `Call::matrix` gives them) in usize.
fn rows_of((rows, row_length): (i64, i64), kernel: &str) -> Result<(usize, usize)> {
    let size = |n: i64| {
        usize::try_from(n).map_err(|_| Error::SizeOverflow {
            what: format!("the prepared weight of {kernel}"),
            limit: "usize",
        })
    };
    Ok((size(rows)?, size(row_length)?))
}

fn as_i64(value: usize, kernel: &str) -> Result<i64> {
    i64::try_from(value).map_err(|_| Error::SizeOverflow {
        what: format!("the prepared weight's row stride of {kernel}"),
        limit: "i64",
    })
}

/// The elements from one row of a bound weight's prepared copy to the next,
/// for rows of `row_length` elements of `element_bytes` each on `arch`, as
/// `FUSION_PAD_WEIGHTS` (read once per process) says: unset or `sm90`,
/// rounded up to a multiple of [`BOUND_ROW_ALIGN_BYTES`] where the rows are
/// not and padding adds at most an eighth, on sm90 (whose TMA loads of
/// misaligned rows ran the (2000, 3000, 1000) GEMM at 0.84 of cuBLASLt on an
/// H200, and at 1.02 from padded rows: benchmarks/HISTORY.md v24); `0`, the dense
/// `row_length` always; `all`, every such row padded on every generation
/// (which the tests use to reach the strided loads of sm80 and sm75).
pub fn bound_row_stride(arch: Arch, row_length: usize, element_bytes: usize) -> Result<usize> {
    let setting = padding_setting()?;
    Ok(row_stride_for(setting, arch, row_length, element_bytes))
}

/// The row alignment, in bytes, that a bound weight's rows are padded to:
/// one 128-byte swizzled TMA box row of the sm90 mainloop.
pub const BOUND_ROW_ALIGN_BYTES: usize = 128;

/// Where bound weights' rows are padded (`FUSION_PAD_WEIGHTS`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Padding {
    /// Where it measured faster: sm90, at most an eighth more memory
    /// (unset, or `sm90`).
    Measured,
    /// Never (`0`).
    Never,
    /// Every misaligned row on every generation (`all`).
    All,
}

fn padding_setting() -> Result<Padding> {
    static VALUE: OnceLock<Option<String>> = OnceLock::new();
    padding_of(env_once(&VALUE, "FUSION_PAD_WEIGHTS"))
}

fn padding_of(value: Option<&str>) -> Result<Padding> {
    match value {
        None | Some("") | Some("sm90") => Ok(Padding::Measured),
        Some("0") => Ok(Padding::Never),
        Some("all") => Ok(Padding::All),
        Some(other) => Err(Error::Setting {
            variable: "FUSION_PAD_WEIGHTS",
            value: other.to_owned(),
            expected: "sm90 (pad bound weights' misaligned rows on sm90, as when unset), all (on every GPU \
                       generation), or 0 (never)",
        }),
    }
}

fn row_stride_for(padding: Padding, arch: Arch, row_length: usize, element_bytes: usize) -> usize {
    let align = BOUND_ROW_ALIGN_BYTES / element_bytes.max(1);
    let padded = row_length.div_ceil(align).saturating_mul(align);
    let pads = match padding {
        Padding::Never => false,
        Padding::All => true,
        Padding::Measured => arch == Arch::Sm90 && (padded - row_length) * 8 <= row_length,
    };
    if pads { padded } else { row_length }
}

/// How every GEMM launch of the run time spreads its work, as
/// `fusion_gemm_params::flags` bits (abi.h): `FUSION_GEMM_NO_STREAM_K`
/// when `FUSION_STREAM_K=0`, `FUSION_GEMM_STREAM_K_TAIL` when
/// `FUSION_STREAM_K=tail`, `FUSION_GEMM_STREAM_K_FILL` when
/// `FUSION_STREAM_K=fill`, `FUSION_GEMM_STATIC_TILES` unless
/// `FUSION_TILE_COUNTER=1`, and `FUSION_GEMM_NO_STREAM_K` with
/// `FUSION_GEMM_STATIC_TILES` while `capturing` a graph. Without a tile
/// tier ([`Call::gemm_flags`] adds `FUSION_GEMM_TILE`'s): whether a capture
/// would change how a call runs.
pub fn schedule_flags(capturing: bool) -> Result<u32> {
    Ok(split_flags(capturing, splits()?) | tile_walk_flags(capturing))
}

/// The flag bits of `splits`, or of no split while `capturing`.
fn split_flags(capturing: bool, splits: Splits) -> u32 {
    match (capturing, splits) {
        (true, _) | (false, Splits::Off) => abi::FUSION_GEMM_NO_STREAM_K,
        (false, Splits::SplitK) => 0,
        (false, Splits::Tail) => abi::FUSION_GEMM_STREAM_K_TAIL,
        (false, Splits::Fill) => abi::FUSION_GEMM_STREAM_K_FILL,
    }
}

/// `FUSION_GEMM_STATIC_TILES` unless the tile counter is on and no graph
/// is being captured.
fn tile_walk_flags(capturing: bool) -> u32 {
    if capturing || !tile_counter_enabled() {
        abi::FUSION_GEMM_STATIC_TILES
    } else {
        0
    }
}

/// [`Call::gemm_flags`] for a stream that is `capturing` or not.
pub fn gemm_flags(capturing: bool) -> Result<u32> {
    let tier = forced_gemm_tile()?.map_or(0, |tier| tier.code() << abi::FUSION_GEMM_TILE_SHIFT);
    Ok(tier | schedule_flags(capturing)?)
}

/// A tile tier of a GEMM unit (`FUSION_GEMM_TILE`), named in its launch's
/// flags so that each tier can be measured at any shape, which the
/// fitted model of the kernel's time needs (fusion-compiler's
/// `select::model`). A unit without the tier makes its own choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GemmTile {
    /// The tuned table's `large` tile.
    Large,
    /// `large_alt`.
    LargeAlt,
    /// `small_m`.
    SmallM,
    /// `small_m_alt`.
    SmallMAlt,
    /// `few_m`: the sm90 few-M tile, which is not a table tier (not in
    /// [`GemmTile::ALL`]).
    FewM,
}

impl GemmTile {
    /// Every tier, as the tuned tables name them.
    pub const ALL: [GemmTile; 4] = [
        GemmTile::Large,
        GemmTile::LargeAlt,
        GemmTile::SmallM,
        GemmTile::SmallMAlt,
    ];

    /// `large_alt`: the tuned tables' name, which `FUSION_GEMM_TILE` takes.
    pub fn name(self) -> &'static str {
        match self {
            GemmTile::Large => "large",
            GemmTile::LargeAlt => "large_alt",
            GemmTile::SmallM => "small_m",
            GemmTile::SmallMAlt => "small_m_alt",
            GemmTile::FewM => "few_m",
        }
    }

    /// abi.h's `FUSION_GEMM_TILE_<TIER>`.
    pub(crate) fn code(self) -> u32 {
        match self {
            GemmTile::Large => abi::FUSION_GEMM_TILE_LARGE,
            GemmTile::LargeAlt => abi::FUSION_GEMM_TILE_LARGE_ALT,
            GemmTile::SmallM => abi::FUSION_GEMM_TILE_SMALL_M,
            GemmTile::SmallMAlt => abi::FUSION_GEMM_TILE_SMALL_M_ALT,
            GemmTile::FewM => abi::FUSION_GEMM_TILE_FEW_M,
        }
    }
}

/// The tier `FUSION_GEMM_TILE` names for every GEMM launch; `None` when it
/// is unset or empty, the launcher's own choice. Read once per process, on
/// first use: another value is [`Error::Setting`], the same
/// error from every call that asks (each call with a GEMM fails with it),
/// and changing the variable later changes nothing.
pub fn forced_gemm_tile() -> Result<Option<GemmTile>> {
    static VALUE: OnceLock<Option<String>> = OnceLock::new();
    gemm_tile_of(env_once(&VALUE, "FUSION_GEMM_TILE"))
}

fn gemm_tile_of(value: Option<&str>) -> Result<Option<GemmTile>> {
    match value {
        None | Some("") => Ok(None),
        Some(name) => GemmTile::ALL
            .into_iter()
            .chain([GemmTile::FewM])
            .find(|tier| tier.name() == name)
            .map(Some)
            .ok_or_else(|| gemm_tile_error(name)),
    }
}

/// [`Error::Setting`] for `FUSION_GEMM_TILE=value`.
fn gemm_tile_error(value: &str) -> Error {
    Error::Setting {
        variable: "FUSION_GEMM_TILE",
        value: value.to_owned(),
        expected: "large, large_alt, small_m or small_m_alt (the tuned tables' tiers), few_m (sm90's few-M tile), or \
                   unset for the launcher's own choice",
    }
}

/// The checks and pointers of one wrapper call.
pub struct Call<'s> {
    graph: &'static GraphDecl,
    stream: &'s Arc<CudaStream>,
    dims: Vec<Option<Bound>>,
    /// Each checked tensor's name and device bytes.
    reads: Vec<(&'static str, DeviceRange)>,
    writes: Vec<(&'static str, DeviceRange)>,
    guards: Vec<SyncOnDrop<'s>>,
}

impl<'s> Call<'s> {
    pub fn new(graph: &'static GraphDecl, stream: &'s Arc<CudaStream>) -> Call<'s> {
        // Room for a small graph's tensors at once: one allocation each.
        Call {
            graph,
            stream,
            dims: vec![None; graph.dims.len()],
            reads: Vec::with_capacity(8),
            writes: Vec::with_capacity(2),
            guards: Vec::with_capacity(12),
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
        Ok(ptr)
    }

    /// Checks a weight the call does not read, by the shape it had when it
    /// was bound (binding replaced it with a prepared copy): its dims bind
    /// the call's as [`Call::input`]'s would.
    pub fn bound_shape(&mut self, decl: &'static TensorDecl, shape: Shape) -> Result<()> {
        self.check_shape(decl, shape)
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

    /// Every output has no elements (M = 0, say): the call has nothing to
    /// write, and launches nothing. One empty output among others that have
    /// elements is not enough: the kernels writing the others still run
    /// (see [`Call::has_elements`]).
    pub fn is_empty(&self) -> bool {
        writes_nothing(&self.writes)
    }

    /// Whether the declared tensor has elements once the dims are bound: a
    /// kernel whose output has none is not launched, even when other
    /// kernels of the call are. Its launcher would write nothing either,
    /// but it checks its arguments before it looks at the sizes (abi.h's
    /// launchers refuse a null or misaligned pointer, and a GEMM a K of 0,
    /// whatever M and N are), and an empty tensor's need not pass: its
    /// address is not checked for alignment (`check_aligned`) and may be a
    /// zero-byte allocation's. Nothing a launched kernel reads comes from a
    /// skipped one: a kernel reading an empty tensor has rows of it (then
    /// its own output is empty too) or reduces over its empty rows (then
    /// [`Call::reduced_matrix`] refuses the call).
    pub fn has_elements(&self, decl: &TensorDecl) -> Result<bool> {
        has_elements(&self.dims, decl)
    }

    /// `(rows, cols)` of a declared tensor once its dims are bound; a vector
    /// is one row. [`Error::SizeOverflow`] when either does not fit the
    /// `int64_t` the kernels take.
    pub fn matrix(&self, decl: &TensorDecl) -> Result<(i64, i64)> {
        matrix_of(&self.dims, decl)
    }

    /// `(rows, cols)` of a tensor whose rows a kernel reduces over (a GEMM's
    /// `A`, whose row length is K), as [`Call::matrix`];
    /// [`Error::EmptyReduction`] when they are empty and the kernel's
    /// `output` has elements (an empty output is not launched).
    pub fn reduced_matrix(&self, decl: &TensorDecl, output: &TensorDecl) -> Result<(i64, i64)> {
        reduced_matrix_of(self.graph, &self.dims, decl, output)
    }

    /// Device buffers for the intermediates `ids` (tensor ids into
    /// `tensors`), slot `i` for `ids[i]`, from `buffers` (grown where they
    /// do not fit): each one's address is written into `address` at its
    /// tensor id. Nothing is allocated on the host.
    pub fn intermediates<T: Element>(
        &mut self,
        buffers: &'s mut Buffers,
        tensors: &'static [TensorDecl],
        ids: &[usize],
        address: &mut [Option<u64>],
    ) -> Result<()> {
        for (slot, &t) in ids.iter().enumerate() {
            let (rows, cols) = self.matrix(&tensors[t])?;
            // Both fit an i64, so both fit a usize.
            let bytes = Shape::Matrix(rows as usize, cols as usize).bytes::<T>()?.max(1);
            buffers.allocations += usize::from(fit_slot(&mut buffers.slots, slot, bytes, self.stream)?);
            let Some(buffer) = &buffers.slots[slot] else {
                unreachable!("fit_slot leaves a buffer in a slot of a nonzero size")
            };
            // Ordered by the workspace, not by cudarc's events (`WorkspaceBuffer`).
            address[t] = Some(buffer.address);
        }
        Ok(())
    }

    /// The `flags` of this call's GEMM launches (abi.h's bits):
    /// `FUSION_GEMM_NO_STREAM_K` (no split-K or stream-K) when
    /// `FUSION_STREAM_K=0`, `FUSION_GEMM_STREAM_K_TAIL` or `_FILL` for
    /// `tail` or `fill`, `FUSION_GEMM_STATIC_TILES` (no tile counter)
    /// unless `FUSION_TILE_COUNTER=1`, and both while the stream is being captured
    /// into a graph (the graph could be replayed on another stream, or
    /// twice at once, beside launches that share its workspace's counters
    /// and partials).
    ///
    /// With `FUSION_GEMM_TILE` set, the flags also name that tile tier
    /// ([`forced_gemm_tile`]).
    pub fn gemm_flags(&self) -> Result<u32> {
        gemm_flags(self.stream.capturing()?)
    }

    /// Asks a launcher how many bytes of workspace `params` need.
    pub fn workspace_bytes<P>(
        &self,
        kernel: &str,
        query: WorkspaceBytes<P>,
        params: &P,
        error_string: ErrorString,
    ) -> Result<u64> {
        let mut bytes = 0u64;
        // SAFETY: the query reads `params` (which outlives it) and writes
        // `bytes`; it enqueues nothing.
        let code = unsafe { query(params, self.stream_ptr(), &mut bytes) };
        self.launched(kernel, code, error_string)?;
        Ok(bytes)
    }

    /// [`Call::workspace_bytes`] for a GEMM, answered from `cache` where
    /// the same query was asked about the same shape on this device before.
    pub fn gemm_workspace_bytes(
        &self,
        cache: &mut QueryCache,
        kernel: &str,
        query: WorkspaceBytes<abi::fusion_gemm_params>,
        params: &abi::fusion_gemm_params,
        error_string: ErrorString,
    ) -> Result<u64> {
        let key = QueryKey::of(query, self.stream.context(), params);
        cache.answer(key, || self.workspace_bytes(kernel, query, params, error_string))
    }

    /// The launchers' scratch for this call: `bytes` (the most any of its
    /// kernels asked for) from `scratch` (a [`Workspace::parts`], grown if
    /// it does not fit), as the pointer and size to pass; null and 0 when
    /// no kernel needs any.
    pub fn scratch(&mut self, scratch: &'s mut Buffers, bytes: u64) -> Result<(*mut c_void, u64)> {
        if bytes == 0 {
            return Ok((std::ptr::null_mut(), 0));
        }
        scratch.allocations += fit(&mut scratch.slots, &[bytes as usize], self.stream)?;
        let Some(buffer) = scratch.slots.first().and_then(Option::as_ref) else {
            unreachable!("fit leaves a buffer in the slot")
        };
        // Ordered by the workspace, not by cudarc's events (`WorkspaceBuffer`).
        Ok((buffer.address as *mut c_void, buffer.slice.len() as u64))
    }

    /// The device addresses of prepared weights a launch reads and the
    /// elements between W''s rows: `(W', col_terms, ldb)`.
    pub fn folded(&mut self, folded: &'s FoldedWeights) -> (u64, u64, i64) {
        let (weight, guard) = folded.weight.device_ptr(self.stream);
        self.guards.push(guard);
        let (terms, guard) = folded.col_terms.device_ptr(self.stream);
        self.guards.push(guard);
        // It was an i64 when the fold was given it, or the dense stride of
        // a checked weight's rows.
        (weight, terms, folded.row_stride as i64)
    }

    /// The device address of prepared weights' vendor bias
    /// ([`FoldedWeights::with_vendor_bias`]), where they have one.
    pub fn vendor_bias(&mut self, folded: &'s FoldedWeights) -> Option<u64> {
        let bias = folded.vendor_bias.as_ref()?;
        let (address, guard) = bias.device_ptr(self.stream);
        self.guards.push(guard);
        Some(address)
    }

    /// The call's stream.
    pub fn stream(&self) -> &'s Arc<CudaStream> {
        self.stream
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
        let extents = [shape.rows(), shape.cols()];
        let actual = match shape {
            Shape::Vector(_) => &extents[1..],
            Shape::Matrix(..) => &extents[..],
        };
        let graph = self.graph;
        let shape_error = || Error::Shape {
            tensor: decl.name.to_owned(),
            expected: declared_shape(graph, decl),
            actual: shape.to_string(),
        };
        if !bind_dims(graph, &mut self.dims, decl, actual)? {
            return Err(shape_error());
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

/// Whether none of `writes` (a call's outputs) has a byte to write.
fn writes_nothing(writes: &[(&str, DeviceRange)]) -> bool {
    writes.iter().all(|(_, range)| range.is_empty())
}

/// `(rows, cols)` of `decl` with its dynamic dims from `dims` (an unbound
/// one is 0), as [`Call::matrix`].
fn matrix_of(dims: &[Option<Bound>], decl: &TensorDecl) -> Result<(i64, i64)> {
    let extent = |d: &Dim| match *d {
        Dim::Static(n) => n,
        Dim::Dynamic(i) => dims[i].map_or(0, |b| b.value),
    };
    let (rows, cols) = match decl.shape {
        [rows @ .., cols] => (
            rows.iter().try_fold(1usize, |p, r| p.checked_mul(extent(r))),
            extent(cols),
        ),
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

/// Whether `decl` has elements with its dynamic dims from `dims`, as
/// [`Call::has_elements`].
fn has_elements(dims: &[Option<Bound>], decl: &TensorDecl) -> Result<bool> {
    let (rows, cols) = matrix_of(dims, decl)?;
    Ok(rows > 0 && cols > 0)
}

/// [`Call::reduced_matrix`] with its dynamic dims from `dims`.
fn reduced_matrix_of(
    graph: &GraphDecl,
    dims: &[Option<Bound>],
    decl: &TensorDecl,
    output: &TensorDecl,
) -> Result<(i64, i64)> {
    let (rows, cols) = matrix_of(dims, decl)?;
    if cols == 0 && has_elements(dims, output)? {
        return Err(Error::EmptyReduction {
            tensor: decl.name.to_owned(),
            dim: decl
                .shape
                .last()
                .map_or_else(String::new, |&d| dim_name(graph, d)),
        });
    }
    Ok((rows, cols))
}

fn dim_name(graph: &GraphDecl, dim: Dim) -> String {
    match dim {
        Dim::Static(n) => n.to_string(),
        Dim::Dynamic(i) => graph.dims[i].to_owned(),
    }
}

/// `[M, 4096]`: a declaration's shape with its dims' names.
pub(crate) fn declared_shape(graph: &GraphDecl, decl: &TensorDecl) -> String {
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

    /// A query as the launchers answer: a function of the sizes, the flags
    /// and whether the gated pair comes per call.
    unsafe extern "C" fn rows_query(
        p: *const abi::fusion_gemm_params,
        _stream: *mut c_void,
        bytes: *mut u64,
    ) -> c_int {
        // SAFETY: the tests pass their params and a place for the answer.
        unsafe {
            let p = &*p;
            let stream_k = if p.flags & abi::FUSION_GEMM_NO_STREAM_K == 0 {
                4096
            } else {
                0
            };
            let pair = if p.b_up.is_null() { 0 } else { 2 * p.n * p.k };
            *bytes = (stream_k + 256 * p.m + pair) as u64;
        }
        0
    }

    fn gemm_params(m: i64) -> abi::fusion_gemm_params {
        let at = |a: usize| a as *const c_void;
        abi::fusion_gemm_params {
            a: at(0x1000),
            b: at(0x2000),
            b_up: std::ptr::null(),
            c: 0x3000 as *mut c_void,
            bias: at(0x4000),
            residual: std::ptr::null(),
            multiplier: std::ptr::null(),
            gamma: std::ptr::null(),
            beta: std::ptr::null(),
            col_terms: std::ptr::null(),
            m,
            n: 64,
            k: 32,
            ldb: 0,
            eps: 0.0,
            flags: 0,
            workspace: std::ptr::null_mut(),
            workspace_bytes: 0,
            scale_a: std::ptr::null(),
            scale_b: std::ptr::null(),
        }
    }

    fn asked_directly(p: &abi::fusion_gemm_params) -> u64 {
        let mut bytes = 0;
        // SAFETY: the test's own query reads the params alone.
        assert_eq!(unsafe { rows_query(p, std::ptr::null_mut(), &mut bytes) }, 0);
        bytes
    }

    #[test]
    fn a_cached_workspace_query_answers_as_the_launcher_and_asks_once_per_key() {
        let mut cache = QueryCache::default();
        let context = (0x7000, 0);
        let ask = |cache: &mut QueryCache, p: &abi::fusion_gemm_params| {
            cache.answer(QueryKey::on(context, rows_query, p), || Ok(asked_directly(p)))
        };
        let p = gemm_params(77);
        for _ in 0..5 {
            assert_eq!(ask(&mut cache, &p).unwrap(), asked_directly(&p));
        }
        assert_eq!(cache.asked(), 1);
        // Another M, other flags, a pair given per call: each asked once.
        let mut no_split = p;
        no_split.flags |= abi::FUSION_GEMM_NO_STREAM_K;
        let mut gated = p;
        gated.b_up = 0x5000 as *const c_void;
        for other in [gemm_params(78), no_split, gated] {
            for _ in 0..2 {
                assert_eq!(ask(&mut cache, &other).unwrap(), asked_directly(&other));
            }
        }
        assert_eq!(cache.asked(), 4);
        // Other addresses of the same kind (given, aligned) share the answer:
        // the launchers never read the memory.
        let mut moved = p;
        moved.a = 0x9000 as *const c_void;
        assert_eq!(ask(&mut cache, &moved).unwrap(), asked_directly(&p));
        assert_eq!(cache.asked(), 4);
        // A misaligned operand, another device or another query: asked.
        let mut misaligned = p;
        misaligned.a = 0x9008 as *const c_void;
        let key = QueryKey::on(context, rows_query, &p);
        assert_ne!(QueryKey::on(context, rows_query, &misaligned), key);
        assert_ne!(QueryKey::on((0x7000, 1), rows_query, &p), key);
        assert_ne!(QueryKey::on((0x8000, 0), rows_query, &p), key);
        unsafe extern "C" fn other_query(
            _: *const abi::fusion_gemm_params,
            _: *mut c_void,
            _: *mut u64,
        ) -> c_int {
            0
        }
        assert_ne!(QueryKey::on(context, other_query, &p), key);
    }

    #[test]
    fn a_failed_workspace_query_is_asked_again_and_the_cache_stays_bounded() {
        let mut cache = QueryCache::default();
        let key = |m| QueryKey::on((1, 0), rows_query, &gemm_params(m));
        let elsewhere = QueryKey::on((2, 0), rows_query, &gemm_params(1));
        let failed = cache.answer(elsewhere, || {
            Err(Error::Setting {
                variable: "X",
                value: String::new(),
                expected: "",
            })
        });
        assert!(failed.is_err());
        assert_eq!(cache.answer(elsewhere, || Ok(7)).unwrap(), 7);
        assert_eq!(cache.answer(elsewhere, || Ok(8)).unwrap(), 7);
        assert_eq!(cache.asked(), 2);
        // M token by token: never more than CAPACITY answers held, each
        // right.
        for m in 1..=100 {
            let p = gemm_params(m);
            assert_eq!(
                cache.answer(key(m), || Ok(asked_directly(&p))).unwrap(),
                asked_directly(&p)
            );
            assert!(cache.answers.len() <= QueryCache::CAPACITY);
        }
    }

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

    /// A graph of two row counts, M and T, and a dynamic N and K.
    static ROWS: GraphDecl = GraphDecl {
        name: "g",
        dims: &["M", "T", "N", "K"],
    };
    static A: TensorDecl = TensorDecl {
        name: "a",
        shape: &[Dim::Dynamic(0), Dim::Dynamic(3)],
    };
    static Y: TensorDecl = TensorDecl {
        name: "y",
        shape: &[Dim::Dynamic(0), Dim::Dynamic(2)],
    };
    static Z: TensorDecl = TensorDecl {
        name: "z",
        shape: &[Dim::Dynamic(1), Dim::Static(16)],
    };

    /// Dims bound from tensors of the given extents, as a call binds them.
    fn bound(tensors: &[(&'static TensorDecl, &[usize])]) -> Vec<Option<Bound>> {
        let mut dims = vec![None; ROWS.dims.len()];
        for &(decl, extents) in tensors {
            assert!(bind_dims(&ROWS, &mut dims, decl, extents).unwrap());
        }
        dims
    }

    #[test]
    fn one_empty_output_skips_its_own_kernel_not_the_call() {
        // y is [0, 8] (M = 0), z is [5, 16]: z is still written.
        let dims = bound(&[(&Y, &[0, 8]), (&Z, &[5, 16])]);
        let range = |decl, start, bytes| DeviceRange::new(decl, start, bytes).unwrap();
        let writes = [("y", range(&Y, 0x1000, 0)), ("z", range(&Z, 0x2000, 5 * 16 * 2))];
        assert!(!writes_nothing(&writes), "z has elements: the call runs");
        assert!(!has_elements(&dims, &Y).unwrap(), "y's kernel is skipped");
        assert!(has_elements(&dims, &Z).unwrap(), "z's kernel runs");
        // Only when every output is empty is the call a no-op.
        assert!(writes_nothing(&writes[..1]));
        let empty_z = [writes[0], ("z", range(&Z, 0x2000, 0))];
        assert!(writes_nothing(&empty_z));
        // N = 0 empties an output as M = 0 does.
        let dims = bound(&[(&Y, &[4, 0])]);
        assert!(!has_elements(&dims, &Y).unwrap());
    }

    #[test]
    fn an_empty_reduction_is_refused_only_where_the_output_has_elements() {
        let reduced = |m: usize, n: usize, k: usize| {
            let dims = bound(&[(&A, &[m, k]), (&Y, &[m, n])]);
            reduced_matrix_of(&ROWS, &dims, &A, &Y)
        };
        let e = reduced(4, 8, 0).unwrap_err();
        assert!(
            matches!(&e, Error::EmptyReduction { tensor, dim } if tensor == "a" && dim == "K"),
            "{e}"
        );
        // The output has no elements: its kernel is skipped, not refused.
        assert_eq!(reduced(4, 0, 0).unwrap(), (4, 0));
        assert_eq!(reduced(0, 8, 0).unwrap(), (0, 0));
        assert_eq!(reduced(4, 8, 16).unwrap(), (4, 16));
    }

    #[test]
    fn alignment_is_checked_only_for_non_empty_tensors() {
        assert!(check_aligned(&X, DeviceRange::new(&X, 8, 0).unwrap()).is_ok());
        let e = check_aligned(&X, DeviceRange::new(&X, 8, 16).unwrap()).unwrap_err();
        assert!(matches!(e, Error::Misaligned { address: 8, .. }), "{e}");
    }

    #[test]
    fn bound_rows_are_padded_to_128_bytes_on_sm90_where_it_costs_at_most_an_eighth() {
        let stride = |padding, arch, row| row_stride_for(padding, arch, row, 2);
        // K = 1000 (2000-byte rows): 1024 on sm90, dense elsewhere.
        assert_eq!(stride(Padding::Measured, Arch::Sm90, 1000), 1024);
        assert_eq!(stride(Padding::Measured, Arch::Sm80, 1000), 1000);
        assert_eq!(stride(Padding::Measured, Arch::Sm75, 1000), 1000);
        // Aligned rows are never padded.
        assert_eq!(stride(Padding::Measured, Arch::Sm90, 4096), 4096);
        assert_eq!(stride(Padding::All, Arch::Sm75, 4096), 4096);
        // Short rows would grow by more than an eighth: 136 -> 192.
        assert_eq!(stride(Padding::Measured, Arch::Sm90, 136), 136);
        assert_eq!(stride(Padding::Measured, Arch::Sm90, 456), 512);
        assert_eq!(stride(Padding::Measured, Arch::Sm90, 440), 448);
        assert_eq!(stride(Padding::Measured, Arch::Sm90, 392), 392);
        assert_eq!(stride(Padding::All, Arch::Sm80, 136), 192);
        assert_eq!(stride(Padding::Never, Arch::Sm90, 1000), 1000);
        // Four-byte elements pad to 32 of them.
        assert_eq!(row_stride_for(Padding::Measured, Arch::Sm90, 1000, 4), 1024);
        assert_eq!(row_stride_for(Padding::Measured, Arch::Sm90, 1008, 4), 1024);
    }

    #[test]
    fn the_gemm_tile_setting_names_a_tier_or_nothing() {
        assert_eq!(gemm_tile_of(None).unwrap(), None);
        assert_eq!(gemm_tile_of(Some("")).unwrap(), None);
        for tier in GemmTile::ALL.into_iter().chain([GemmTile::FewM]) {
            assert_eq!(gemm_tile_of(Some(tier.name())).unwrap(), Some(tier));
        }
        let e = gemm_tile_of(Some("huge")).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Setting {
                    variable: "FUSION_GEMM_TILE",
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("FUSION_GEMM_TILE=huge: expected large,"),
            "{e}"
        );
        // What a call returns for the value read once: the same error.
        assert_eq!(gemm_tile_error("huge").to_string(), e.to_string());
        // The process's own setting, parsed once: every call agrees.
        let first = forced_gemm_tile().map_err(|e| e.to_string());
        for _ in 0..3 {
            assert_eq!(forced_gemm_tile().map_err(|e| e.to_string()), first);
        }
    }

    #[test]
    fn the_padding_setting_is_sm90_unless_0_or_all() {
        assert_eq!(padding_of(None).unwrap(), Padding::Measured);
        assert_eq!(padding_of(Some("")).unwrap(), Padding::Measured);
        assert_eq!(padding_of(Some("0")).unwrap(), Padding::Never);
        assert_eq!(padding_of(Some("sm90")).unwrap(), Padding::Measured);
        assert_eq!(padding_of(Some("all")).unwrap(), Padding::All);
        let e = padding_of(Some("yes")).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Setting {
                    variable: "FUSION_PAD_WEIGHTS",
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string().starts_with("FUSION_PAD_WEIGHTS=yes: expected sm90"),
            "{e}"
        );
    }

    use std::cell::{Cell, RefCell};

    /// Host memory standing in for device memory: counts allocations, can
    /// pretend the stream is being captured, and keeps the sizes of the
    /// buffers it was given to free after the queued work.
    #[derive(Default)]
    struct HostAllocator {
        capturing: bool,
        allocated: Cell<usize>,
        freed_after_queued_work: RefCell<Vec<usize>>,
    }

    impl Allocator for HostAllocator {
        type Buffer = Vec<u8>;
        fn fits(&self, buffer: &Vec<u8>, bytes: usize) -> bool {
            buffer.len() >= bytes
        }
        fn capturing(&self) -> Result<bool> {
            Ok(self.capturing)
        }
        fn alloc_zeroed(&self, bytes: usize) -> Result<Vec<u8>> {
            self.allocated.set(self.allocated.get() + 1);
            Ok(vec![0; bytes])
        }
        fn free_after_queued_work(&self, old: Vec<u8>) -> Result<()> {
            self.freed_after_queued_work.borrow_mut().push(old.len());
            Ok(())
        }
    }

    #[test]
    fn a_workspace_grows_to_fit_and_is_reused() {
        let alloc = HostAllocator::default();
        let mut slots = Vec::new();
        assert_eq!(fit(&mut slots, &[64, 0], &alloc).unwrap(), 1);
        assert_eq!(slots.len(), 2);
        assert!(slots[1].is_none(), "0 bytes allocate nothing");
        // The same sizes, and smaller ones, reuse what is there.
        assert_eq!(fit(&mut slots, &[64, 0], &alloc).unwrap(), 0);
        assert_eq!(fit(&mut slots, &[16], &alloc).unwrap(), 0);
        assert_eq!(slots[0].as_ref().unwrap().len(), 64);
        // A larger size replaces the buffer; other slots stay.
        assert_eq!(fit(&mut slots, &[65, 8], &alloc).unwrap(), 2);
        assert_eq!(slots[0].as_ref().unwrap().len(), 65);
        assert_eq!(fit(&mut slots, &[65, 8], &alloc).unwrap(), 0);
        assert_eq!(alloc.allocated.get(), 3);
    }

    #[test]
    fn a_grown_buffer_is_zero_and_a_reused_one_keeps_its_contents() {
        let alloc = HostAllocator::default();
        let mut slots = Vec::new();
        fit(&mut slots, &[32], &alloc).unwrap();
        // What a kernel left behind is kept on reuse (stream-K's flags rely
        // on launches leaving them at 0, not on zeroing per call) …
        slots[0].as_mut().unwrap()[..4].copy_from_slice(&[7; 4]);
        fit(&mut slots, &[32], &alloc).unwrap();
        assert_eq!(slots[0].as_ref().unwrap()[..4], [7; 4]);
        // … and a grown buffer starts at zero.
        fit(&mut slots, &[4096], &alloc).unwrap();
        assert!(slots[0].as_ref().unwrap().iter().all(|&b| b == 0));
    }

    #[test]
    fn a_workspace_is_never_grown_during_a_capture() {
        let mut slots = Vec::new();
        fit(&mut slots, &[128], &HostAllocator::default()).unwrap();
        let capturing = HostAllocator {
            capturing: true,
            ..HostAllocator::default()
        };
        // What fits is used while capturing …
        assert_eq!(fit(&mut slots, &[128], &capturing).unwrap(), 0);
        // … what does not is refused with the error that says what to do.
        let e = fit(&mut slots, &[129], &capturing).unwrap_err();
        assert!(matches!(e, Error::WorkspaceGrowsInCapture { bytes: 129 }), "{e}");
        assert!(e.to_string().contains("once"), "{e}");
        assert_eq!(capturing.allocated.get(), 0);
        assert_eq!(slots[0].as_ref().unwrap().len(), 128, "the old buffer is kept");
    }

    #[test]
    fn a_replaced_buffer_is_freed_after_the_work_queued_on_the_calls_stream() {
        // A buffer may be in use on another stream than the one it was
        // allocated on, which cudarc frees it on: dropped as it is
        // replaced, its memory could be handed out again under that use.
        let alloc = HostAllocator::default();
        let freed = || alloc.freed_after_queued_work.borrow().clone();
        let mut slots = Vec::new();
        fit(&mut slots, &[64, 8], &alloc).unwrap();
        fit(&mut slots, &[64, 8], &alloc).unwrap();
        assert_eq!(freed(), Vec::<usize>::new(), "nothing was replaced");
        fit(&mut slots, &[65, 8], &alloc).unwrap();
        assert_eq!(freed(), [64], "the 64-byte buffer, through the allocator");
        fit(&mut slots, &[128, 16, 4], &alloc).unwrap();
        assert_eq!(freed(), [64, 65, 8]);
        // A capture keeps what it has.
        let capturing = HostAllocator {
            capturing: true,
            ..HostAllocator::default()
        };
        fit(&mut slots, &[256], &capturing).unwrap_err();
        assert!(capturing.freed_after_queued_work.borrow().is_empty());
        assert_eq!(slots[0].as_ref().unwrap().len(), 128);
    }

    /// A stream as the workspace sees it: `handle` is what CUDA calls it,
    /// and may give the next stream once this one is destroyed.
    struct HostStream {
        handle: usize,
    }

    #[test]
    fn a_use_site_is_one_streams_arc_in_one_thread_not_a_handle() {
        let stream = Arc::new(HostStream { handle: 7 });
        let site = UseSite::of(&stream);
        assert!(site.is(&stream));
        assert!(site.is(&stream.clone()), "clones of one Arc are one stream");
        std::thread::scope(|scope| {
            let other_thread = scope.spawn(|| site.is(&stream));
            assert!(
                !other_thread.join().unwrap(),
                "a per-thread stream's handle is another stream in every thread"
            );
        });
        // Two Arcs of one handle: another site, so a wait too many.
        assert!(!site.is(&Arc::new(HostStream { handle: 7 })));
        // The stream destroyed with its work still queued, and new streams
        // given its handle (as CUDA may), each allocated as the old one
        // was freed: none may pass for the site of the queued work, which
        // a key of the handle (or of a freed `Arc`'s address) would let
        // them do.
        drop(stream);
        for _ in 0..64 {
            let next = Arc::new(HostStream { handle: 7 });
            assert_eq!(next.handle, 7);
            assert!(!site.is(&next), "a new stream with the old one's handle");
        }
    }

    /// A workspace that holds `Arc`s of its stream, as device buffers do.
    #[derive(Default)]
    struct HoldingWorkspace(Vec<Arc<String>>);

    impl HoldsStream<String> for HoldingWorkspace {
        fn refs_to(&self, stream: &Arc<String>) -> usize {
            self.0.iter().filter(|s| Arc::ptr_eq(s, stream)).count()
        }
    }

    #[test]
    fn the_registry_keeps_one_workspace_per_stream_and_frees_dead_ones() {
        let mut registry = Registry::<String, HoldingWorkspace>::new();
        let a = Arc::new("a".to_owned());
        let b = Arc::new("b".to_owned());
        let first = registry.entry(&a);
        // Buffers allocated on a stream keep it alive.
        first.lock().unwrap().0.push(a.clone());
        first.lock().unwrap().0.push(a.clone());
        assert!(
            Arc::ptr_eq(&first, &registry.entry(&a)),
            "one workspace per stream"
        );
        assert!(
            Arc::ptr_eq(&first, &registry.entry(&a.clone())),
            "clones share it"
        );
        let other = registry.entry(&b);
        assert!(!Arc::ptr_eq(&first, &other));
        assert_eq!(registry.entries.len(), 2);
        drop(first);
        // `a` is now held only by its own workspace's buffers: the next
        // lookup frees the workspace, and with it the last `Arc` of `a`.
        let weak_a = Arc::downgrade(&a);
        drop(a);
        assert!(weak_a.upgrade().is_some());
        registry.entry(&b);
        assert_eq!(registry.entries.len(), 1);
        assert!(
            weak_a.upgrade().is_none(),
            "the dead stream's workspace was dropped"
        );
        // A stream whose workspace holds nothing dies with its last `Arc`.
        drop(other);
        let weak_b = Arc::downgrade(&b);
        drop(b);
        registry.entry(&Arc::new("c".to_owned()));
        assert!(weak_b.upgrade().is_none());
        assert_eq!(registry.entries.len(), 1);
    }

    #[test]
    fn a_workspace_in_use_is_kept() {
        let mut registry = Registry::<String, HoldingWorkspace>::new();
        let a = Arc::new("a".to_owned());
        let workspace = registry.entry(&a);
        workspace.lock().unwrap().0.push(a.clone());
        let weak_a = Arc::downgrade(&a);
        drop(a);
        // Locked by a call in progress: not judged, not freed.
        let guard = workspace.lock().unwrap();
        registry.entry(&Arc::new("b".to_owned()));
        assert!(weak_a.upgrade().is_some());
        drop(guard);
        drop(workspace);
        registry.entry(&Arc::new("b".to_owned()));
        assert!(weak_a.upgrade().is_none());
    }

    #[test]
    fn fusion_stream_k_chooses_how_launches_split() {
        assert_eq!(Splits::from_setting(None), Some(Splits::SplitK));
        assert_eq!(Splits::from_setting(Some("")), Some(Splits::SplitK));
        assert_eq!(Splits::from_setting(Some("split-k")), Some(Splits::SplitK));
        assert_eq!(Splits::from_setting(Some("0")), Some(Splits::Off));
        assert_eq!(Splits::from_setting(Some("tail")), Some(Splits::Tail));
        assert_eq!(Splits::from_setting(Some("fill")), Some(Splits::Fill));
        // A value it does not take is refused by name, not read as the
        // default: `1` (once "on", now ambiguous), a typo, and `off` (the
        // name a bench file records for `0`).
        for value in ["1", "fil", "Tail", "off"] {
            assert_eq!(Splits::from_setting(Some(value)), None, "{value}");
        }
        let e = splits_error("fil");
        assert!(
            matches!(
                e,
                Error::Setting {
                    variable: "FUSION_STREAM_K",
                    ..
                }
            ),
            "{e}"
        );
        assert!(
            e.to_string()
                .starts_with("FUSION_STREAM_K=fil: expected 0 (no split)"),
            "{e}"
        );
        assert_eq!(split_flags(false, Splits::SplitK), 0);
        assert_eq!(split_flags(false, Splits::Off), abi::FUSION_GEMM_NO_STREAM_K);
        assert_eq!(split_flags(false, Splits::Tail), abi::FUSION_GEMM_STREAM_K_TAIL);
        assert_eq!(split_flags(false, Splits::Fill), abi::FUSION_GEMM_STREAM_K_FILL);
        // A capture never splits, whatever the setting.
        for splits in [Splits::Off, Splits::SplitK, Splits::Tail, Splits::Fill] {
            assert_eq!(split_flags(true, splits), abi::FUSION_GEMM_NO_STREAM_K);
        }
    }
}
