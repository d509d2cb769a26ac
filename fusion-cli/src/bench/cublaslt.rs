//! The vendor baseline: cuBLASLt GEMMs with their fused epilogues (BIAS,
//! RELU_BIAS, GELU_BIAS) or none, planned once and launched many times.
//!
//! Descriptors, layouts and the heuristic's candidate algorithms are made
//! when the plan is made, so a timed call is one `cublasLtMatmul`, as a tuned
//! application would issue it. A plan runs one of its candidates, the
//! heuristic's first unless [`LtGemm::choose`] picked another
//! (`bench::vendor` times them).

use cudarc::cublaslt::{result, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
use fusion::error::{Error, Result};
use fusion::ir::{DType, WeightLayout};
use fusion::tensor::{Element, Shape};
use serde::{Deserialize, Serialize};
use std::ffi::c_void;
use std::mem::size_of;
use std::sync::Arc;

/// cuBLASLt's fused epilogues that fusion's patterns are measured against.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LtEpilogue {
    None,
    Bias,
    ReluBias,
    GeluBias,
    Gelu,
}

impl LtEpilogue {
    pub fn name(self) -> &'static str {
        match self {
            LtEpilogue::None => "cuBLASLt",
            LtEpilogue::Bias => "cuBLASLt BIAS",
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

    fn raw(self) -> sys::cublasLtEpilogue_t {
        use sys::cublasLtEpilogue_t::*;
        match self {
            LtEpilogue::None => CUBLASLT_EPILOGUE_DEFAULT,
            LtEpilogue::Bias => CUBLASLT_EPILOGUE_BIAS,
            LtEpilogue::ReluBias => CUBLASLT_EPILOGUE_RELU_BIAS,
            LtEpilogue::GeluBias => CUBLASLT_EPILOGUE_GELU_BIAS,
            LtEpilogue::Gelu => CUBLASLT_EPILOGUE_GELU,
        }
    }
}

/// `cublasOperation_t` values (cuBLASLt's attribute takes the int).
const CUBLAS_OP_N: i32 = 0;
const CUBLAS_OP_T: i32 = 1;

fn lt(e: cudarc::cublaslt::result::CublasError) -> Error {
    Error::Launch {
        kernel: "cublasLtMatmul".into(),
        code: e.0 as i32,
        message: format!("{e:?}"),
    }
}

/// One planned `y[M, N] = epilogue(x[M, K] · w + bias)` in row-major terms,
/// or a stack of such products sharing x ([`LtGemm::new_stacked`]).
pub struct LtGemm {
    /// The element type, `(m, n, k)` and stack it was planned for:
    /// [`LtGemm::run`] checks its buffers against them, since cuBLASLt reads
    /// and writes through raw pointers whatever their lengths.
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
    workspace: CudaSlice<u8>,
    epilogue: LtEpilogue,
}

impl LtGemm {
    /// Plans the product for a dtype and the weight's layout, asking the
    /// heuristic for up to `candidates` algorithms (at least one; PyTorch
    /// asks for one and runs it).
    ///
    /// cuBLASLt is column-major: a row-major `[M, N]` output is its `[N, M]`
    /// column-major matrix, so it computes `D = op(W) · X` with `X` the
    /// activation read as `[K, M]` and `W` read transposed when the weight is
    /// stored `[N, K]`. Its bias then runs along D's rows, which are our
    /// columns: the broadcast we want.
    pub fn new(
        stream: &Arc<CudaStream>,
        dtype: DType,
        layout: WeightLayout,
        dims: (usize, usize, usize),
        epilogue: LtEpilogue,
        candidates: usize,
    ) -> Result<LtGemm> {
        Self::plan(stream, dtype, layout, dims, epilogue, candidates, 1)
    }

    /// Plans `stack` products of one x `[M, K]` with `stack` weights
    /// `[N, K]` (or `[K, N]`, as `layout` says) stored one after the other
    /// (`[stack·N, K]`, as a stacked `nn.Linear` holds them), without
    /// epilogue, writing `stack` outputs
    /// `[M, N]` one after the other: one cuBLASLt call, a strided batch whose
    /// x has stride 0. For SwiGLU's gate and up projections, this is the one
    /// GEMM over the stacked weight a user would call, with gate and up each
    /// left contiguous for the elementwise kernels.
    pub fn new_stacked(
        stream: &Arc<CudaStream>,
        dtype: DType,
        layout: WeightLayout,
        dims: (usize, usize, usize),
        stack: usize,
        candidates: usize,
    ) -> Result<LtGemm> {
        Self::plan(
            stream,
            dtype,
            layout,
            dims,
            LtEpilogue::None,
            candidates,
            stack.max(1),
        )
    }

    fn plan(
        stream: &Arc<CudaStream>,
        dtype: DType,
        layout: WeightLayout,
        (m, n, k): (usize, usize, usize),
        epilogue: LtEpilogue,
        candidates: usize,
        stack: usize,
    ) -> Result<LtGemm> {
        let data = match dtype {
            DType::F16 => sys::cudaDataType_t::CUDA_R_16F,
            DType::BF16 => sys::cudaDataType_t::CUDA_R_16BF,
            DType::F32 => sys::cudaDataType_t::CUDA_R_32F,
        };
        let planned = (m, n, k);
        // cuBLASLt takes dims as u64 and leading dimensions as i64, and
        // `run` checks buffer lengths against these products.
        let fits = |a: usize, b: usize| {
            a.checked_mul(b)
                .and_then(|ab| ab.checked_mul(stack))
                .is_some_and(|len| i64::try_from(len).is_ok())
        };
        if !(fits(m, k) && fits(k, n) && fits(m, n)) {
            return Err(Error::SizeOverflow {
                what: format!("the cuBLASLt GEMM M={m}, N={n}, K={k}"),
                limit: "i64",
            });
        }
        let (m, n, k) = (m as u64, n as u64, k as u64);
        let handle = result::create_handle().map_err(lt)?;
        let desc = result::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )
        .map_err(lt)?;
        let (w_layout, transa) = match layout {
            WeightLayout::NK => (result::create_matrix_layout(data, k, n, k as i64), CUBLAS_OP_T),
            WeightLayout::KN => (result::create_matrix_layout(data, n, k, n as i64), CUBLAS_OP_N),
        };
        let layouts = [
            w_layout.map_err(lt)?,
            result::create_matrix_layout(data, k, m, k as i64).map_err(lt)?,
            result::create_matrix_layout(data, n, m, n as i64).map_err(lt)?,
        ];
        if stack > 1 {
            // Weight i at i·N·K, output i at i·M·N, every product reading
            // the one x (stride 0).
            let (count, strides) = (stack as i32, [(n * k) as i64, 0, (n * m) as i64]);
            use sys::cublasLtMatrixLayoutAttribute_t::*;
            for (layout, stride) in layouts.into_iter().zip(strides) {
                // SAFETY: each layout was just created and is live; each
                // attribute is read from a live local of its type (int32
                // count, int64 offset), which cuBLASLt copies.
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
        // SAFETY: `desc` was just created and is destroyed only by `Drop`;
        // each call below passes a pointer to a live local of exactly
        // `size` bytes, the attribute's type, which cuBLASLt copies.
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
        // Hopper's recommendation; 4 MiB suffices elsewhere.
        let workspace_size = 32usize << 20;
        let workspace = stream.alloc_zeros::<u8>(workspace_size)?;
        let pref = result::create_matmul_pref().map_err(lt)?;
        let requested = candidates.clamp(1, i32::MAX as usize);
        // SAFETY: `pref`, `handle`, `desc` and the layouts were created above
        // and are live; the attribute is a `usize` read from a live local;
        // the heuristic writes at most `requested` results into `results`,
        // which holds that many, and says how many in `returned`; `pref` is
        // destroyed once, after its last use.
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
            workspace,
            epilogue,
        })
    }

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

    /// The configuration of the algorithm `run` uses, as cuBLASLt reports it.
    pub fn chosen_config(&self) -> Result<LtAlgoConfig> {
        LtAlgoConfig::of(&self.algos[self.chosen], self.chosen)
    }

    /// Queues the product on `stream`. `bias` is required exactly when the
    /// epilogue has one; `residual`, when given, is added through cuBLASLt's
    /// `beta·C` term (C = residual, beta = 1), fused like the bias.
    ///
    /// The buffers must be of the planned element type and hold at least
    /// `x` `[M, K]`, `w` `K·N`, `bias` `[N]`, `residual` and `y` `[M, N]`
    /// (`w`, `residual` and `y` that many times over for a stacked plan):
    /// otherwise [`Error::ElementType`], [`Error::BufferLength`] or
    /// [`Error::Shape`] (a bias given or missing against the epilogue), and
    /// nothing is queued.
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
        if let Some(bias) = bias {
            let (ptr, _guard) = bias.device_ptr(stream);
            // SAFETY: `desc` is live; the attribute is a device address (u64)
            // read from a live local. The bias holds N elements (checked).
            unsafe {
                result::set_matmul_desc_attribute(
                    self.desc,
                    sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                    (&ptr as *const u64).cast(),
                    size_of::<u64>(),
                )
                .map_err(lt)?;
            }
        }
        let (alpha, beta) = (1.0f32, if residual.is_some() { 1.0f32 } else { 0.0 });
        let residual = residual.map(|r| r.device_ptr(stream));
        let (x_ptr, _gx) = x.device_ptr(stream);
        let (w_ptr, _gw) = w.device_ptr(stream);
        let (y_ptr, _gy) = y.device_ptr_mut(stream);
        let workspace_len = self.workspace.len();
        let (ws_ptr, _gws) = self.workspace.device_ptr_mut(stream);
        // SAFETY: handle, descriptor, layouts and algorithm are live and were
        // planned for this element type and (M, N, K); `check_buffers` made
        // sure every buffer is of that type and exactly that long, and the
        // guards keep them ordered on `stream` until the call is queued. The
        // workspace is ours and `workspace_len` long; alpha and beta are
        // live f32 locals, as CUBLAS_COMPUTE_32F with f32 scale reads them.
        unsafe {
            result::matmul(
                self.handle,
                self.desc,
                (&alpha as *const f32).cast(),
                (&beta as *const f32).cast(),
                w_ptr as *const c_void,
                self.layouts[0],
                x_ptr as *const c_void,
                self.layouts[1],
                residual.as_ref().map_or(y_ptr, |r| r.0) as *const c_void,
                self.layouts[2],
                y_ptr as *mut c_void,
                self.layouts[2],
                &self.algos[self.chosen],
                ws_ptr as *mut c_void,
                workspace_len,
                stream.cu_stream() as sys::cudaStream_t,
            )
            .map_err(lt)
        }
    }
}

impl LtGemm {
    /// What [`LtGemm::run`] promises cuBLASLt: the planned element type, and
    /// buffers at least as long as the planned shapes.
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
        // cuBLASLt touches the planned extent alone, so a longer buffer is
        // safe (fusion bench sizes its buffers for the largest shape).
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

/// What identifies a cuBLASLt algorithm: its `CUBLASLT_ALGO_CONFIG_*`
/// attributes (numbering as in cuBLASLt's headers: `tile` is a
/// `cublasLtMatmulTile_t`, `stages` a `cublasLtMatmulStages_t`, …), and its
/// place in the heuristic's list.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LtAlgoConfig {
    /// 0 for the heuristic's first.
    pub heuristic_rank: usize,
    pub id: u64,
    pub tile: u64,
    pub stages: u64,
    pub splitk: u64,
    pub reduction_scheme: u64,
    pub cta_swizzling: u64,
    pub custom_option: u64,
    pub inner_shape: u64,
    pub cluster_shape: u64,
}

impl LtAlgoConfig {
    fn of(algo: &sys::cublasLtMatmulAlgo_t, heuristic_rank: usize) -> Result<LtAlgoConfig> {
        use sys::cublasLtMatmulAlgoConfigAttributes_t::*;
        let get = |attr: sys::cublasLtMatmulAlgoConfigAttributes_t| -> Result<u64> {
            // cuBLASLt wants the attribute's exact size (1 to 8 bytes, by
            // attribute and version): ask for it, then read that many.
            let mut size = 0usize;
            let mut bytes = [0u8; 8];
            // SAFETY: `algo` is a live heuristic result; the first call only
            // writes the size to a live local; the second writes `size` ≤ 8
            // bytes into `bytes`, checked before the call.
            unsafe {
                sys::cublasLtMatmulAlgoConfigGetAttribute(algo, attr, std::ptr::null_mut(), 0, &mut size)
                    .result()
                    .map_err(lt)?;
                if size > bytes.len() {
                    return Err(lt(result::CublasError(
                        sys::cublasStatus_t::CUBLAS_STATUS_NOT_SUPPORTED,
                    )));
                }
                sys::cublasLtMatmulAlgoConfigGetAttribute(
                    algo,
                    attr,
                    bytes.as_mut_ptr().cast(),
                    size,
                    &mut size,
                )
                .result()
                .map_err(lt)?;
            }
            // Every attribute is an unsigned (or non-negative) integer.
            Ok(u64::from_le_bytes(bytes))
        };
        Ok(LtAlgoConfig {
            heuristic_rank,
            id: get(CUBLASLT_ALGO_CONFIG_ID)?,
            tile: get(CUBLASLT_ALGO_CONFIG_TILE_ID)?,
            stages: get(CUBLASLT_ALGO_CONFIG_STAGES_ID)?,
            splitk: get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM)?,
            reduction_scheme: get(CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME)?,
            cta_swizzling: get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING)?,
            custom_option: get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION)?,
            inner_shape: get(CUBLASLT_ALGO_CONFIG_INNER_SHAPE_ID)?,
            cluster_shape: get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID)?,
        })
    }
}

/// The version of the cuBLASLt library loaded, as `cublasLtGetVersion`
/// reports it (major·10000 + minor·100 + patch).
pub fn version() -> usize {
    // SAFETY: takes no arguments and reads no state but the loaded library's.
    unsafe { sys::cublasLtGetVersion() }
}

impl Drop for LtGemm {
    fn drop(&mut self) {
        // Destruction failures leave nothing to recover; the handle goes last.
        // SAFETY: each object was created in `new`, is destroyed once, here,
        // and nothing uses it after `self` is dropped.
        unsafe {
            for layout in self.layouts {
                let _ = result::destroy_matrix_layout(layout);
            }
            let _ = result::destroy_matmul_desc(self.desc);
            let _ = result::destroy_handle(self.handle);
        }
    }
}
