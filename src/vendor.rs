//! The vendor path: a GEMM run by cuBLASLt with its fused epilogue (BIAS,
//! RELU, RELU_BIAS, GELU, GELU_BIAS; a residual through its `beta·C` term),
//! where the guard sends an M bucket that the fused kernel is predicted to
//! lose (`fusion_compiler::select::guard`), and the baseline `fusion bench`
//! times fusion against. (A norm GEMM's norm kernel, which runs first on
//! that path, is the plan executor's launch: `crate::plan`.)
//!
//! cuBLASLt is loaded at run time, as the driver is (cudarc's
//! `fallback-dynamic-loading`): nothing links it, and a machine without it
//! runs the fused kernel where a plan would have taken this path. The
//! cuBLASLt calls themselves come with the feature `cublaslt`; without it a
//! plan table's vendor routes are not taken.
//!
//! Not here: which buckets take the path (decided at build time and written
//! into the plan table as [`crate::plan::VendorRoute`], or per call by its
//! [`crate::plan::RouteModel`] where N or K is dynamic) and the choice
//! among cuBLASLt's candidate algorithms by timing (`fusion bench`).

/// cuBLASLt's fused epilogues that a vendor path asks for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum LtEpilogue {
    /// The GEMM alone (`CUBLASLT_EPILOGUE_DEFAULT`).
    None,
    /// A bias added to the product.
    Bias,
    /// ReLU on the product.
    Relu,
    /// A bias, then ReLU.
    ReluBias,
    /// A bias, then GELU.
    GeluBias,
    /// GELU on the product.
    Gelu,
}

impl LtEpilogue {
    /// `cuBLASLt GELU_BIAS`, as reports name the baseline.
    pub fn name(self) -> &'static str {
        match self {
            LtEpilogue::None => "cuBLASLt",
            LtEpilogue::Bias => "cuBLASLt BIAS",
            LtEpilogue::Relu => "cuBLASLt RELU",
            LtEpilogue::ReluBias => "cuBLASLt RELU_BIAS",
            LtEpilogue::GeluBias => "cuBLASLt GELU_BIAS",
            LtEpilogue::Gelu => "cuBLASLt GELU",
        }
    }

    /// Whether the epilogue adds a bias, which a call must then give.
    pub fn reads_bias(self) -> bool {
        matches!(
            self,
            LtEpilogue::Bias | LtEpilogue::ReluBias | LtEpilogue::GeluBias
        )
    }

    /// The epilogue that adds a bias first, then does what this one does.
    pub fn with_bias(self) -> LtEpilogue {
        match self {
            LtEpilogue::None | LtEpilogue::Bias => LtEpilogue::Bias,
            LtEpilogue::Relu | LtEpilogue::ReluBias => LtEpilogue::ReluBias,
            LtEpilogue::Gelu | LtEpilogue::GeluBias => LtEpilogue::GeluBias,
        }
    }
}

/// Whether a plan's vendor routes are taken: not where `FUSION_GUARD=off`
/// is set at run time (which measures the fused kernels alone), nor
/// without the feature `cublaslt`, nor where cuBLASLt cannot be loaded.
pub fn routes_enabled() -> bool {
    use std::sync::OnceLock;
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| {
        let off = std::env::var("FUSION_GUARD").is_ok_and(|v| v == "off");
        !off && cfg!(feature = "cublaslt") && lt::loaded()
    })
}

/// What a vendor route's cuBLASLt call reads and writes, taken from the
/// GEMM's filled params: sizes, the weight's row stride where binding
/// padded it, and the device addresses (a bias only where the epilogue
/// adds one; the residual, through beta, where the GEMM has one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RouteCall {
    /// `(m, n, k)`.
    pub dims: (usize, usize, usize),
    /// The weight's row stride in elements; `None`: dense.
    pub ld_w: Option<usize>,
    /// The address of A, the activations.
    pub x: u64,
    /// The address of the weight.
    pub w: u64,
    /// The address of the bias, where the epilogue adds one.
    pub bias: Option<u64>,
    /// The address of the residual, where the GEMM adds one (through beta).
    pub residual: Option<u64>,
    /// The address of the output.
    pub y: u64,
}

impl RouteCall {
    /// The call for params `p` with cuBLASLt's `epilogue`.
    ///
    /// # Panics
    ///
    /// Where `p` has a negative size, which the executor never fills.
    pub fn of(p: &crate::abi::fusion_gemm_params, epilogue: LtEpilogue) -> RouteCall {
        let dim = |v: i64| usize::try_from(v).expect("the executor's sizes are not negative");
        let address = |ptr: *const std::ffi::c_void| (!ptr.is_null()).then_some(ptr as u64);
        RouteCall {
            dims: (dim(p.m), dim(p.n), dim(p.k)),
            ld_w: (p.ldb > 0).then(|| dim(p.ldb)),
            x: p.a as u64,
            w: p.b as u64,
            bias: if epilogue.reads_bias() {
                address(p.bias)
            } else {
                None
            },
            residual: address(p.residual),
            y: p.c as u64,
        }
    }
}

/// The workspace cuBLASLt's heuristic may plan for: Hopper's
/// recommendation (4 MiB suffices elsewhere).
pub const WORKSPACE_BYTES: usize = 32 << 20;

/// The scratch a vendor route asks of the workspace for cuBLASLt (a norm
/// GEMM's normalized rows come after it: `crate::plan`).
pub(crate) const ROUTE_WORKSPACE_BYTES: u64 = WORKSPACE_BYTES as u64;

#[cfg(feature = "cublaslt")]
pub use lt::LtGemm;

#[cfg(feature = "cublaslt")]
pub(crate) use lt::run_route;

#[cfg(not(feature = "cublaslt"))]
mod lt {
    pub(super) fn loaded() -> bool {
        false
    }
}

#[cfg(feature = "cublaslt")]
mod lt {
    use super::LtEpilogue;
    use crate::error::{Error, Result};
    use crate::tensor::{Element, Shape};
    use cudarc::cublaslt::{result, sys};
    use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
    use fusion_compiler::ir::{DType, WeightLayout};
    use std::collections::HashMap;
    use std::ffi::c_void;
    use std::mem::size_of;
    use std::sync::{Arc, Mutex};

    /// Names cudarc also tries for the library (among others), so that
    /// where one of these loads, cudarc's own loading succeeds.
    const LIBRARY_NAMES: [&str; 3] = ["libcublasLt.so", "libcublasLt.so.13", "libcublasLt.so.12"];

    /// Whether the cuBLASLt library loads. cudarc panics on its first call
    /// where it does not, so the run time asks first (the library stays
    /// loaded once cudarc has it; this handle is dropped).
    pub(super) fn loaded() -> bool {
        LIBRARY_NAMES.iter().any(|name| {
            // SAFETY: loading cuBLASLt runs its initializers, which only
            // set up the library itself (cudarc loads the same file).
            unsafe { libloading::Library::new(*name) }.is_ok()
        })
    }

    impl LtEpilogue {
        fn raw(self) -> sys::cublasLtEpilogue_t {
            use sys::cublasLtEpilogue_t::*;
            match self {
                LtEpilogue::None => CUBLASLT_EPILOGUE_DEFAULT,
                LtEpilogue::Bias => CUBLASLT_EPILOGUE_BIAS,
                LtEpilogue::Relu => CUBLASLT_EPILOGUE_RELU,
                LtEpilogue::ReluBias => CUBLASLT_EPILOGUE_RELU_BIAS,
                LtEpilogue::GeluBias => CUBLASLT_EPILOGUE_GELU_BIAS,
                LtEpilogue::Gelu => CUBLASLT_EPILOGUE_GELU,
            }
        }
    }

    /// `cublasOperation_t` values (cuBLASLt's attribute takes the int).
    const CUBLAS_OP_N: i32 = 0;
    const CUBLAS_OP_T: i32 = 1;

    use super::WORKSPACE_BYTES;

    fn lt(e: result::CublasError) -> Error {
        Error::Launch {
            kernel: "cublasLtMatmul".into(),
            code: e.0 as i32,
            message: format!("{e:?}"),
        }
    }

    /// One planned `y[M, N] = epilogue(x[M, K] · w + bias)` in row-major
    /// terms, or a stack of such products sharing x ([`LtGemm::new_stacked`]).
    pub struct LtGemm {
        /// The element type, `(m, n, k)` and stack it was planned for:
        /// [`LtGemm::run`] checks its buffers against them, since cuBLASLt
        /// reads and writes through raw pointers whatever their lengths.
        dtype: DType,
        dims: (usize, usize, usize),
        stack: usize,
        handle: sys::cublasLtHandle_t,
        desc: sys::cublasLtMatmulDesc_t,
        layouts: [sys::cublasLtMatrixLayout_t; 3],
        /// The heuristic's algorithms, in its order; at least one.
        algos: Vec<sys::cublasLtMatmulAlgo_t>,
        /// The one [`LtGemm::run`] uses, an index into `algos`.
        chosen: usize,
        /// Its own workspace, where it was planned with one (else the
        /// caller's, [`LtGemm::run_raw`]).
        workspace: Option<CudaSlice<u8>>,
        epilogue: LtEpilogue,
    }

    // SAFETY: the handle, descriptors and layouts are cuBLASLt objects
    // that any thread may use; `LtGemm` hands them out only through
    // `&mut self`, so no two threads use one at once (run time plans are
    // kept behind a mutex).
    unsafe impl Send for LtGemm {}

    impl LtGemm {
        /// Plans the product for a dtype and the weight's layout, asking
        /// the heuristic for up to `candidates` algorithms (at least one;
        /// PyTorch asks for one and runs it), with a workspace of its own.
        ///
        /// cuBLASLt is column-major: a row-major `[M, N]` output is its
        /// `[N, M]` column-major matrix, so it computes `D = op(W) · X` with
        /// `X` the activation read as `[K, M]` and `W` read transposed when
        /// the weight is stored `[N, K]`. Its bias then runs along D's
        /// rows, which are our columns: the broadcast we want.
        pub fn new(
            stream: &Arc<CudaStream>,
            dtype: DType,
            layout: WeightLayout,
            dims: (usize, usize, usize),
            epilogue: LtEpilogue,
            candidates: usize,
        ) -> Result<LtGemm> {
            let mut gemm = Self::plan(stream, dtype, layout, dims, None, epilogue, candidates, 1, false)?;
            gemm.workspace = Some(stream.alloc_zeros::<u8>(WORKSPACE_BYTES)?);
            Ok(gemm)
        }

        /// Plans `stack` products of one x `[M, K]` with `stack` weights
        /// `[N, K]` (or `[K, N]`, as `layout` says) stored one after the
        /// other (`[stack·N, K]`, as a stacked `nn.Linear` holds them),
        /// without epilogue, writing `stack` outputs `[M, N]` one after the
        /// other: one cuBLASLt call, a strided batch whose x has stride 0.
        /// For SwiGLU's gate and up projections, this is the one GEMM over
        /// the stacked weight a user would call, with gate and up each left
        /// contiguous for the elementwise kernels.
        pub fn new_stacked(
            stream: &Arc<CudaStream>,
            dtype: DType,
            layout: WeightLayout,
            dims: (usize, usize, usize),
            stack: usize,
            candidates: usize,
        ) -> Result<LtGemm> {
            let mut gemm = Self::plan(
                stream,
                dtype,
                layout,
                dims,
                None,
                LtEpilogue::None,
                candidates,
                stack.max(1),
                false,
            )?;
            gemm.workspace = Some(stream.alloc_zeros::<u8>(WORKSPACE_BYTES)?);
            Ok(gemm)
        }

        /// The plan of [`LtGemm::new`] and [`LtGemm::new_stacked`], with
        /// the weight's row stride `ld_w` (`None`: dense) and, where
        /// `routed` (a plan table's route), algorithms that take buffers
        /// aligned to 16 bytes, as the executor checks them.
        #[allow(clippy::too_many_arguments)]
        fn plan(
            stream: &Arc<CudaStream>,
            dtype: DType,
            layout: WeightLayout,
            (m, n, k): (usize, usize, usize),
            ld_w: Option<usize>,
            epilogue: LtEpilogue,
            candidates: usize,
            stack: usize,
            routed: bool,
        ) -> Result<LtGemm> {
            let data = match dtype {
                DType::F16 => sys::cudaDataType_t::CUDA_R_16F,
                DType::BF16 => sys::cudaDataType_t::CUDA_R_16BF,
                DType::F32 => sys::cudaDataType_t::CUDA_R_32F,
                DType::F8E4M3 => sys::cudaDataType_t::CUDA_R_8F_E4M3,
            };
            let planned = (m, n, k);
            let dense = match layout {
                WeightLayout::NK => k,
                WeightLayout::KN => n,
            };
            let ld_w = ld_w.unwrap_or(dense).max(dense);
            // cuBLASLt takes dims as u64 and leading dimensions as i64, and
            // `run` checks buffer lengths against these products.
            let fits = |a: usize, b: usize| {
                a.checked_mul(b)
                    .and_then(|ab| ab.checked_mul(stack))
                    .is_some_and(|len| i64::try_from(len).is_ok())
            };
            let w_rows = match layout {
                WeightLayout::NK => n,
                WeightLayout::KN => k,
            };
            if !(fits(m, k) && fits(w_rows, ld_w) && fits(m, n)) {
                return Err(Error::SizeOverflow {
                    what: format!("the cuBLASLt GEMM M={m}, N={n}, K={k}"),
                    limit: "i64",
                });
            }
            stream.context().bind_to_thread()?;
            let (m, n, k) = (m as u64, n as u64, k as u64);
            let handle = result::create_handle().map_err(lt)?;
            let desc = result::create_matmul_desc(
                sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
                sys::cudaDataType_t::CUDA_R_32F,
            )
            .map_err(lt)?;
            let (w_layout, transa) = match layout {
                WeightLayout::NK => (result::create_matrix_layout(data, k, n, ld_w as i64), CUBLAS_OP_T),
                WeightLayout::KN => (result::create_matrix_layout(data, n, k, ld_w as i64), CUBLAS_OP_N),
            };
            let layouts = [
                w_layout.map_err(lt)?,
                result::create_matrix_layout(data, k, m, k as i64).map_err(lt)?,
                result::create_matrix_layout(data, n, m, n as i64).map_err(lt)?,
            ];
            if stack > 1 {
                // Weight i at i·N·K, output i at i·M·N, every product
                // reading the one x (stride 0).
                let (count, strides) = (stack as i32, [(n * k) as i64, 0, (n * m) as i64]);
                use sys::cublasLtMatrixLayoutAttribute_t::*;
                for (layout, stride) in layouts.into_iter().zip(strides) {
                    // SAFETY: each layout was just created and is live;
                    // each attribute is read from a live local of its type
                    // (int32 count, int64 offset), which cuBLASLt copies.
                    unsafe {
                        result::set_matrix_layout_attribute(
                            layout,
                            CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT,
                            (&count as *const i32).cast(),
                            size_of::<i32>(),
                        )
                        .map_err(lt)?;
                        result::set_matrix_layout_attribute(
                            layout,
                            CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                            (&stride as *const i64).cast(),
                            size_of::<i64>(),
                        )
                        .map_err(lt)?;
                    }
                }
            }
            // SAFETY: `desc` was just created and is destroyed only by
            // `Drop`; each call below passes a pointer to a live local of
            // exactly `size` bytes, the attribute's type, which cuBLASLt
            // copies.
            let set = |attr: sys::cublasLtMatmulDescAttributes_t, value: *const c_void, size: usize| unsafe {
                result::set_matmul_desc_attribute(desc, attr, value, size).map_err(lt)
            };
            use sys::cublasLtMatmulDescAttributes_t::*;
            set(
                CUBLASLT_MATMUL_DESC_TRANSA,
                (&transa as *const i32).cast(),
                size_of::<i32>(),
            )?;
            let raw = epilogue.raw();
            set(
                CUBLASLT_MATMUL_DESC_EPILOGUE,
                (&raw as *const sys::cublasLtEpilogue_t).cast(),
                size_of::<sys::cublasLtEpilogue_t>(),
            )?;
            let workspace_size = WORKSPACE_BYTES;
            let pref = result::create_matmul_pref().map_err(lt)?;
            // The heuristic assumes 256-byte aligned buffers unless told
            // otherwise; a plan table's operands are only checked to be
            // 16-byte aligned (tensors may be views into larger buffers).
            if routed {
                use sys::cublasLtMatmulPreferenceAttributes_t::*;
                let alignment: u32 = 16;
                for attr in [
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES,
                ] {
                    // SAFETY: `pref` was just created and is live; the
                    // attribute is a uint32 read from a live local.
                    let set = unsafe {
                        result::set_matmul_pref_attribute(
                            pref,
                            attr,
                            (&alignment as *const u32).cast(),
                            size_of::<u32>(),
                        )
                    };
                    if let Err(e) = set {
                        // SAFETY: destroyed once, and not used after.
                        let _ = unsafe { result::destroy_matmul_pref(pref) };
                        return Err(lt(e));
                    }
                }
            }
            let requested = candidates.clamp(1, i32::MAX as usize);
            // SAFETY: `pref`, `handle`, `desc` and the layouts were created
            // above and are live; the attribute is a `usize` read from a
            // live local; the heuristic writes at most `requested` results
            // into `results`, which holds that many, and says how many in
            // `returned`; `pref` is destroyed once, after its last use.
            let algos = unsafe {
                result::set_matmul_pref_attribute(
                    pref,
                    sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                    (&workspace_size as *const usize).cast(),
                    size_of::<usize>(),
                )
                .map_err(lt)?;
                let mut results = vec![std::mem::zeroed::<sys::cublasLtMatmulHeuristicResult_t>(); requested];
                let mut returned = 0i32;
                let heuristic = sys::cublasLtMatmulAlgoGetHeuristic(
                    handle,
                    desc,
                    layouts[0],
                    layouts[1],
                    layouts[2],
                    layouts[2],
                    pref,
                    requested as i32,
                    results.as_mut_ptr(),
                    &mut returned,
                )
                .result();
                result::destroy_matmul_pref(pref).map_err(lt)?;
                heuristic.map_err(lt)?;
                results.truncate(usize::try_from(returned).unwrap_or(0));
                results.into_iter().map(|r| r.algo).collect::<Vec<_>>()
            };
            if algos.is_empty() {
                return Err(lt(result::CublasError(
                    sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
                )));
            }
            Ok(LtGemm {
                dtype,
                dims: planned,
                stack,
                handle,
                desc,
                layouts,
                algos,
                chosen: 0,
                workspace: None,
                epilogue,
            })
        }

        /// The fused epilogue this GEMM was planned with.
        pub fn epilogue(&self) -> LtEpilogue {
            self.epilogue
        }

        /// How many algorithms the heuristic returned (at least one).
        pub fn candidates(&self) -> usize {
            self.algos.len()
        }

        /// Makes [`LtGemm::run`] use the heuristic's `index`-th algorithm.
        ///
        /// # Panics
        /// If `index` is not below [`LtGemm::candidates`].
        pub fn choose(&mut self, index: usize) {
            assert!(
                index < self.algos.len(),
                "cuBLASLt candidate {index} of {}",
                self.algos.len()
            );
            self.chosen = index;
        }

        /// The index, in the heuristic's order, of the algorithm `run` uses.
        pub fn chosen(&self) -> usize {
            self.chosen
        }

        /// The algorithm `run` uses, for reading its configuration.
        pub fn chosen_algo(&self) -> &sys::cublasLtMatmulAlgo_t {
            &self.algos[self.chosen]
        }

        /// Queues the product on `stream`, with the plan's own workspace.
        /// `bias` is required exactly when the epilogue has one;
        /// `residual`, when given, is added through cuBLASLt's `beta·C`
        /// term (C = residual, beta = 1), fused like the bias.
        ///
        /// The buffers must be of the planned element type and hold at
        /// least `x` `[M, K]`, `w` `K·N`, `bias` `[N]`, `residual` and `y`
        /// `[M, N]` (`w`, `residual` and `y` that many times over for a
        /// stacked plan): otherwise [`Error::ElementType`],
        /// [`Error::BufferLength`] or [`Error::Shape`] (a bias given or
        /// missing against the epilogue), and nothing is queued.
        pub fn run<T: Element>(
            &mut self,
            stream: &Arc<CudaStream>,
            x: &CudaSlice<T>,
            w: &CudaSlice<T>,
            bias: Option<&CudaSlice<T>>,
            residual: Option<&CudaSlice<T>>,
            y: &mut CudaSlice<T>,
        ) -> Result<()> {
            self.check_buffers(x, w, bias, residual, y)?;
            let mut workspace = self
                .workspace
                .take()
                .expect("the public constructors give a plan its workspace");
            let queued = {
                let bias = bias.map(|b| b.device_ptr(stream));
                let residual = residual.map(|r| r.device_ptr(stream));
                let (x_ptr, _gx) = x.device_ptr(stream);
                let (w_ptr, _gw) = w.device_ptr(stream);
                let (y_ptr, _gy) = y.device_ptr_mut(stream);
                let workspace_len = workspace.len();
                let (ws_ptr, _gws) = workspace.device_ptr_mut(stream);
                // SAFETY: `check_buffers` made sure every buffer is of the
                // planned type and at least the planned length; the guards
                // keep them ordered on `stream` until the call is queued;
                // the workspace is this plan's own.
                unsafe {
                    self.run_raw(
                        stream,
                        x_ptr,
                        w_ptr,
                        bias.as_ref().map(|b| b.0),
                        residual.as_ref().map(|r| r.0),
                        y_ptr,
                        (ws_ptr, workspace_len),
                    )
                }
            };
            self.workspace = Some(workspace);
            queued
        }

        /// Queues the product on `stream` at device addresses, with the
        /// caller's `workspace` (address, bytes).
        ///
        /// # Safety
        ///
        /// Every address must be of a live allocation in `stream`'s
        /// context, of the planned element type, at least as long as the
        /// planned shapes ([`LtGemm::run`]), with the weight's rows at the
        /// planned stride; `bias` given exactly where the epilogue reads
        /// one; `y` must not alias `x`, `w` or `bias`; the workspace must be
        /// the caller's for as long as the stream runs the call.
        #[allow(clippy::too_many_arguments)]
        pub unsafe fn run_raw(
            &mut self,
            stream: &Arc<CudaStream>,
            x: u64,
            w: u64,
            bias: Option<u64>,
            residual: Option<u64>,
            y: u64,
            (workspace, workspace_len): (u64, usize),
        ) -> Result<()> {
            if let Some(bias) = bias {
                // SAFETY: `desc` is live; the attribute is a device address
                // (u64) read from a live local.
                unsafe {
                    result::set_matmul_desc_attribute(
                        self.desc,
                        sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                        (&bias as *const u64).cast(),
                        size_of::<u64>(),
                    )
                    .map_err(lt)?;
                }
            }
            let (alpha, beta) = (1.0f32, if residual.is_some() { 1.0f32 } else { 0.0 });
            // SAFETY: handle, descriptor, layouts and algorithm are live
            // and were planned for this element type and (M, N, K); the
            // caller vouches for the buffers and the workspace; alpha and
            // beta are live f32 locals, as CUBLAS_COMPUTE_32F with f32
            // scale reads them.
            unsafe {
                result::matmul(
                    self.handle,
                    self.desc,
                    (&alpha as *const f32).cast(),
                    (&beta as *const f32).cast(),
                    w as *const c_void,
                    self.layouts[0],
                    x as *const c_void,
                    self.layouts[1],
                    residual.unwrap_or(y) as *const c_void,
                    self.layouts[2],
                    y as *mut c_void,
                    self.layouts[2],
                    &self.algos[self.chosen],
                    workspace as *mut c_void,
                    workspace_len,
                    stream.cu_stream() as sys::cudaStream_t,
                )
                .map_err(lt)
            }
        }

        /// What [`LtGemm::run`] promises cuBLASLt: the planned element
        /// type, and buffers at least as long as the planned shapes.
        fn check_buffers<T: Element>(
            &self,
            x: &CudaSlice<T>,
            w: &CudaSlice<T>,
            bias: Option<&CudaSlice<T>>,
            residual: Option<&CudaSlice<T>>,
            y: &CudaSlice<T>,
        ) -> Result<()> {
            if T::DTYPE != self.dtype {
                return Err(Error::ElementType {
                    what: "this cublasLtMatmul".to_owned(),
                    expected: self.dtype.to_string(),
                    actual: T::DTYPE.to_string(),
                });
            }
            let has_bias = self.epilogue.reads_bias();
            if bias.is_some() != has_bias {
                return Err(Error::Shape {
                    tensor: "bias".to_owned(),
                    expected: if has_bias { "[N]" } else { "no bias" }.to_owned(),
                    actual: if bias.is_some() { "a bias" } else { "none" }.to_owned(),
                });
            }
            let ((m, n, k), stack) = (self.dims, self.stack);
            let checks = [
                (Some(x.len()), Shape::Matrix(m, k)),
                (Some(w.len()), Shape::Matrix(stack * k, n)),
                (bias.map(|b| b.len()), Shape::Vector(n)),
                (residual.map(|r| r.len()), Shape::Matrix(stack * m, n)),
                (Some(y.len()), Shape::Matrix(stack * m, n)),
            ];
            // cuBLASLt touches the planned extent alone, so a longer buffer
            // is safe (fusion bench sizes its buffers for the largest shape).
            for (len, shape) in checks {
                let expected = shape.len()?;
                if let Some(actual) = len.filter(|&actual| actual < expected) {
                    return Err(Error::BufferLength {
                        shape: shape.to_string(),
                        expected,
                        actual,
                    });
                }
            }
            Ok(())
        }
    }

    impl Drop for LtGemm {
        fn drop(&mut self) {
            // Destruction failures leave nothing to recover; the handle
            // goes last.
            // SAFETY: each object was created in `plan`, is destroyed once,
            // here, and nothing uses it after `self` is dropped.
            unsafe {
                for layout in self.layouts {
                    let _ = result::destroy_matrix_layout(layout);
                }
                let _ = result::destroy_matmul_desc(self.desc);
                let _ = result::destroy_handle(self.handle);
            }
        }
    }

    /// What a run time plan of cuBLASLt is made for.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
    struct PlanKey {
        ordinal: usize,
        dtype: DType,
        layout: WeightLayout,
        dims: (usize, usize, usize),
        ld_w: usize,
        epilogue: LtEpilogue,
    }

    /// The plans made for plan tables' vendor routes, by what they were
    /// made for: a plan is made once (its heuristic query costs more than
    /// the GEMM at small M) and reused by every call of that shape. Past
    /// [`MAX_PLANS`] the map is emptied, so that a run over many Ms holds
    /// no more than that many handles.
    static PLANS: Mutex<Option<HashMap<PlanKey, LtGemm>>> = Mutex::new(None);

    /// The most plans [`PLANS`] keeps.
    const MAX_PLANS: usize = 256;

    /// Queues one plan-table GEMM on its vendor route: `p`'s operands,
    /// sizes and weight stride, cuBLASLt's `epilogue` (the residual, where
    /// `p` has one, through beta), in `dtype` with B stored as `layout`,
    /// with `workspace` (address, bytes) as its scratch.
    ///
    /// # Safety
    ///
    /// `p`'s pointers must be as [`LtGemm::run_raw`] requires for a GEMM
    /// of `p.m`, `p.n`, `p.k` (the plan executor checked them), and the
    /// workspace the caller's.
    pub(crate) unsafe fn run_route(
        stream: &Arc<CudaStream>,
        dtype: DType,
        layout: WeightLayout,
        epilogue: LtEpilogue,
        p: &crate::abi::fusion_gemm_params,
        workspace: (u64, usize),
    ) -> Result<()> {
        let call = super::RouteCall::of(p, epilogue);
        let key = PlanKey {
            ordinal: stream.context().ordinal(),
            dtype,
            layout,
            dims: call.dims,
            ld_w: call.ld_w.unwrap_or(0),
            epilogue,
        };
        let mut plans = PLANS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let plans = plans.get_or_insert_with(HashMap::new);
        if !plans.contains_key(&key) {
            if plans.len() >= MAX_PLANS {
                plans.clear();
            }
            let plan = LtGemm::plan(stream, dtype, layout, call.dims, call.ld_w, epilogue, 1, 1, true)?;
            plans.insert(key, plan);
        }
        let plan = plans.get_mut(&key).expect("inserted above");
        // SAFETY: the caller vouches for the operands and the workspace;
        // the plan was made for these sizes, element type, layout and
        // weight stride.
        unsafe {
            plan.run_raw(
                stream,
                call.x,
                call.w,
                call.bias,
                call.residual,
                call.y,
                workspace,
            )
        }
    }
}
