//! The vendor baseline: cuBLASLt GEMMs with their fused epilogues (BIAS,
//! RELU_BIAS, GELU_BIAS) or none, planned once and launched many times.
//!
//! Descriptors, layouts and the heuristic's algorithm are made when the plan
//! is made, so a timed call is one `cublasLtMatmul`, as a tuned application
//! would issue it.

use crate::error::{Error, Result};
use crate::ir::{DType, WeightLayout};
use crate::tensor::{Element, Shape};
use cudarc::cublaslt::{result, sys};
use cudarc::driver::{CudaSlice, CudaStream, DevicePtr, DevicePtrMut};
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

/// One planned `y[M, N] = epilogue(x[M, K] · w + bias)` in row-major terms.
pub struct LtGemm {
    /// The element type and `(m, n, k)` it was planned for: [`LtGemm::run`]
    /// checks its buffers against them, since cuBLASLt reads and writes
    /// through raw pointers whatever their lengths.
    dtype: DType,
    dims: (usize, usize, usize),
    handle: sys::cublasLtHandle_t,
    desc: sys::cublasLtMatmulDesc_t,
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: sys::cublasLtMatmulAlgo_t,
    workspace: CudaSlice<u8>,
    epilogue: LtEpilogue,
}

impl LtGemm {
    /// Plans the product for a dtype and the weight's layout.
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
        (m, n, k): (usize, usize, usize),
        epilogue: LtEpilogue,
    ) -> Result<LtGemm> {
        let data = match dtype {
            DType::F16 => sys::cudaDataType_t::CUDA_R_16F,
            DType::BF16 => sys::cudaDataType_t::CUDA_R_16BF,
            DType::F32 => sys::cudaDataType_t::CUDA_R_32F,
        };
        let planned = (m, n, k);
        // cuBLASLt takes dims as u64 and leading dimensions as i64, and
        // `run` checks buffer lengths against these products.
        let fits = |a: usize, b: usize| a.checked_mul(b).is_some() && i64::try_from(a.max(b)).is_ok();
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
        // SAFETY: `pref`, `handle`, `desc` and the layouts were created above
        // and are live; the attribute is a `usize` read from a live local;
        // `pref` is destroyed once, after its last use.
        let algo = unsafe {
            result::set_matmul_pref_attribute(
                pref,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&workspace_size as *const usize).cast(),
                size_of::<usize>(),
            )
            .map_err(lt)?;
            let heuristic = result::get_matmul_algo_heuristic(
                handle, desc, layouts[0], layouts[1], layouts[2], layouts[2], pref,
            );
            result::destroy_matmul_pref(pref).map_err(lt)?;
            heuristic.map_err(lt)?.algo
        };
        Ok(LtGemm {
            dtype,
            dims: planned,
            handle,
            desc,
            layouts,
            algo,
            workspace,
            epilogue,
        })
    }

    pub fn epilogue(&self) -> LtEpilogue {
        self.epilogue
    }

    /// Queues the product on `stream`. `bias` is required exactly when the
    /// epilogue has one; `residual`, when given, is added through cuBLASLt's
    /// `beta·C` term (C = residual, beta = 1), fused like the bias.
    ///
    /// The buffers must be of the planned element type and hold at least
    /// `x` `[M, K]`, `w` `K·N`, `bias` `[N]`, `residual` and `y` `[M, N]`:
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
                &self.algo,
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
        let has_bias = matches!(
            self.epilogue,
            LtEpilogue::Bias | LtEpilogue::ReluBias | LtEpilogue::GeluBias
        );
        if bias.is_some() != has_bias {
            return Err(Error::Shape {
                tensor: "bias".to_owned(),
                expected: if has_bias { "[N]" } else { "no bias" }.to_owned(),
                actual: if bias.is_some() { "a bias" } else { "none" }.to_owned(),
            });
        }
        let (m, n, k) = self.dims;
        let checks = [
            (Some(x.len()), Shape::Matrix(m, k)),
            (Some(w.len()), Shape::Matrix(k, n)),
            (bias.map(|b| b.len()), Shape::Vector(n)),
            (residual.map(|r| r.len()), Shape::Matrix(m, n)),
            (Some(y.len()), Shape::Matrix(m, n)),
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
