//! The one error type of the run time: every way a call can be refused,
//! each with a message that says what to do.
//!
//! A call either computes the right answer or returns one of these; it never
//! launches a kernel on arguments it has not checked.

/// Why a call into fusion did not run.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A buffer holds a different number of elements than its shape needs.
    #[error("shape {shape} needs {expected} elements but the buffer holds {actual}")]
    BufferLength {
        /// The shape, as text.
        shape: String,
        /// The elements it needs.
        expected: usize,
        /// The elements the buffer holds.
        actual: usize,
    },
    /// A size computed from shapes (an element count, a byte count, the
    /// address one past a buffer, a dim passed to a kernel) does not fit the
    /// integer type it must be held in: no buffer can be that large.
    #[error("{what} overflows {limit}: no device buffer can be that large; check the shape")]
    SizeOverflow {
        /// The size that overflows, in words.
        what: String,
        /// The type it must fit (`u32`, `usize`).
        limit: &'static str,
    },
    /// Buffers of one element type were passed where another was planned.
    #[error("{what} was planned for {expected} but is given {actual} buffers")]
    ElementType {
        /// The kernel or graph.
        what: String,
        /// The element type it was planned for.
        expected: String,
        /// The element type given.
        actual: String,
    },
    /// A tensor's shape disagrees with the graph's declaration.
    #[error("`{tensor}` has shape {actual} but the graph declares {expected}")]
    Shape {
        /// The tensor's name.
        tensor: String,
        /// The declared shape.
        expected: String,
        /// The shape given.
        actual: String,
    },
    /// A dynamic dim (such as the token count M) differs between two tensors.
    #[error(
        "dim `{dim}` is {first_value} in `{first}` but {second_value} in `{second}`: pass tensors that agree"
    )]
    DimMismatch {
        /// The dim's name.
        dim: String,
        /// The first tensor that set it.
        first: String,
        /// The size that tensor gives it.
        first_value: usize,
        /// A later tensor that disagrees.
        second: String,
        /// The size that tensor gives it.
        second_value: usize,
    },
    /// Kernels read rows in 16-byte pieces.
    #[error(
        "`{tensor}`: {dim} = {value} is not a multiple of 8; fused kernels read rows 16 bytes (8 halves) at a time, so pad {dim} to a multiple of 8"
    )]
    NotMultipleOf8 {
        /// The tensor's name.
        tensor: String,
        /// The dim's name.
        dim: String,
        /// Its size.
        value: usize,
    },
    /// A matmul's reduced dim (K) is 0 while its output has elements.
    #[error(
        "`{tensor}` has rows of length 0 ({dim} = 0): a matmul sums over them, and the kernels need at least one element; pass {dim} ≥ 8"
    )]
    EmptyReduction {
        /// The tensor's name.
        tensor: String,
        /// The reduced dim.
        dim: String,
    },
    /// A device pointer is not 16-byte aligned.
    #[error(
        "`{tensor}` starts at {address:#x}, which is not 16-byte aligned; pass a buffer from a fresh allocation or a view starting at a multiple of 8 elements"
    )]
    Misaligned {
        /// The tensor's name.
        tensor: String,
        /// Its device address.
        address: u64,
    },
    /// A tensor lives in another CUDA context than the stream it is used on.
    #[error("`{tensor}` was allocated in another CUDA context (device) than the stream it is used on")]
    WrongContext {
        /// The tensor's name.
        tensor: String,
    },
    /// An output overlaps an input in a way the kernel cannot allow.
    #[error(
        "output `{output}` overlaps input `{input}`: this kernel reads `{input}` while writing `{output}`; use separate buffers"
    )]
    Aliasing {
        /// The output's name.
        output: String,
        /// The input's name.
        input: String,
    },
    /// The element type has no compiled kernel.
    #[error("no `{kernel}` kernel is compiled for {dtype}; compiled: {compiled}")]
    UnsupportedDType {
        /// The kernel's name.
        kernel: String,
        /// The element type asked for.
        dtype: String,
        /// The element types compiled, comma-separated.
        compiled: String,
    },
    /// No compiled kernel variant runs on this GPU.
    #[error(
        "no kernel variant runs on this GPU (compute capability {major}.{minor}); this build has {compiled}; rebuild with the cargo feature for it (sm75, sm80 or sm90)"
    )]
    UnsupportedDevice {
        /// The device's compute capability, major.
        major: i32,
        /// The device's compute capability, minor.
        minor: i32,
        /// The variants this build has.
        compiled: String,
    },
    /// `FUSION_FORCE_ARCH` names a variant that is not usable here.
    #[error("FUSION_FORCE_ARCH={value}: {reason}")]
    ForcedArch {
        /// The variable's value.
        value: String,
        /// Why it cannot be used.
        reason: String,
    },
    /// An environment variable fusion reads holds a value it does not take.
    #[error("{variable}={value}: expected {expected}")]
    Setting {
        /// The variable's name.
        variable: &'static str,
        /// Its value.
        value: String,
        /// The values it takes.
        expected: &'static str,
    },
    /// A call needed a larger workspace while its stream was being captured
    /// into a CUDA graph, where fusion never allocates.
    #[error(
        "the call needs a workspace of {bytes} bytes, more than it holds, while its stream is being captured into a CUDA graph, where fusion does not allocate; make the same call once (or a larger one, on the same stream or struct) before capturing"
    )]
    WorkspaceGrowsInCapture {
        /// The workspace the call needs.
        bytes: usize,
    },
    /// A graph struct's bound weights were asked for a tensor they do not
    /// keep: binding replaced it with the copy its kernel reads (a gated
    /// pair interleaved, a norm folded into its weight, rows padded), or
    /// the graph has no weight of that name.
    #[error("graph `{graph}` keeps no weight `{tensor}` once bound: {reason}")]
    WeightNotKept {
        /// The graph's name.
        graph: String,
        /// The weight asked for.
        tensor: String,
        /// What binding made of it, or that the graph has no such weight.
        reason: String,
    },
    /// A workspace was sized from M alone where another dim is not fixed by
    /// the graph's weights.
    #[error(
        "graph `{graph}`: `{dim}` is fixed neither by its weights nor by M, so the workspace of a call cannot be sized from M alone; make one call with tensors of the largest shapes instead"
    )]
    UnboundDim {
        /// The graph's name.
        graph: String,
        /// The dim left unbound.
        dim: String,
    },
    /// A kernel launch failed.
    #[error("kernel `{kernel}` failed: {message} (CUDA error {code})")]
    Launch {
        /// The kernel's launcher.
        kernel: String,
        /// The CUDA error code.
        code: i32,
        /// CUDA's message for it.
        message: String,
    },
    /// `fusion bench`: our output and the vendor baseline's disagree on the
    /// same inputs, so timing them would compare different functions.
    #[error(
        "bench: `{kernel}` at {shape} differs from the vendor baseline by {relative:e} (relative); not timing a wrong result"
    )]
    BenchDisagreement {
        /// The kernel's name.
        kernel: String,
        /// The shape it was run at.
        shape: String,
        /// ‖ours − baseline‖ / ‖baseline‖.
        relative: f64,
    },
    /// A tensor file could not be read, or is not a safetensors file.
    #[error("{file}: {reason}")]
    TensorFile {
        /// The file.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// A tensor file is larger than [`TensorFile::open`](crate::TensorFile::open)
    /// reads ([`MAX_TENSOR_FILE_BYTES`](crate::weights::MAX_TENSOR_FILE_BYTES)),
    /// by its size or by what its header says it holds.
    #[error(
        "{file}: it holds {bytes} bytes ({by}), more than the {limit} a tensor file may have, since it is read whole into host memory; pass a file of the tensors the graph reads"
    )]
    TensorFileTooLarge {
        /// The file.
        file: String,
        /// How many bytes it holds.
        bytes: u64,
        /// How it is known: `its size` or `as its header says`.
        by: &'static str,
        /// The most a tensor file may hold.
        limit: u64,
    },
    /// A tensor the graph needs is not in the file. (The graph's names are
    /// `&'static str`, which keeps `Error` small.)
    #[error("{file} has no tensor `{name}` (the graph's `{tensor}`); it holds {held}{hint}")]
    MissingTensor {
        /// The file.
        file: String,
        /// The name looked up in it.
        name: String,
        /// The graph's tensor.
        tensor: &'static str,
        /// The names the file holds.
        held: String,
        /// A name in the file that ends with the one looked up, if any, as a clause.
        hint: String,
    },
    /// A tensor in a file has another element type than the graph's.
    #[error(
        "`{name}` in {file} (the graph's `{tensor}`) holds {actual} elements, but the graph runs in {expected}: convert the file, or run the graph in the file's element type"
    )]
    TensorDType {
        /// The file.
        file: String,
        /// The name in it.
        name: String,
        /// The graph's tensor.
        tensor: &'static str,
        /// The element type the graph runs in.
        expected: String,
        /// The element type in the file.
        actual: String,
    },
    /// A tensor in a file has another shape than the graph declares.
    #[error(
        "`{name}` in {file} (the graph's `{tensor}`) has shape {actual} but the graph declares {expected}"
    )]
    TensorShape {
        /// The file.
        file: String,
        /// The name in it.
        name: String,
        /// The graph's tensor.
        tensor: &'static str,
        /// The declared shape.
        expected: String,
        /// The shape in the file.
        actual: String,
    },
    /// A candle tensor handed to a fused graph (feature `candle`) is not
    /// what the graph can read in place: not in CUDA memory, on another
    /// device than the call's, of another element type, not contiguous,
    /// or of rank 0.
    #[error("candle {tensor} {reason}")]
    CandleTensor {
        /// Which tensor (`input 0`, `output 1`).
        tensor: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A plan table written for another version of the run time's plan
    /// tables (`fusion::plan::SCHEMA_VERSION`) than this one reads.
    #[error(
        "the plan table of graph `{graph}` has schema {table}, but this fusion runs schema {runtime}: rebuild the \
         crate that generated it with the fusion-compiler that matches this fusion"
    )]
    PlanSchema {
        /// The graph whose table it is.
        graph: String,
        /// The table's schema.
        table: u32,
        /// The schema this run time reads.
        runtime: u32,
    },
    /// The CUDA driver refused something (allocation, copy, query).
    #[error("CUDA driver: {0}")]
    Driver(#[from] cudarc::driver::DriverError),
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
