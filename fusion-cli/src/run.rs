//! `fusion run`: any TOML graph run on tensors from safetensors files,
//! without writing Rust.
//!
//! The graph is planned for the GPU's generation and its kernels rendered
//! as a build renders them, then built by nvcc into one shared library per
//! kernel on first use (the tuner's compiles, which a later run reuses while
//! the sources, headers, nvcc and flags are unchanged) and loaded. A call
//! goes through the checks a generated wrapper makes
//! ([`fusion::launch::Call`]: shapes, dims, alignment, aliasing) and the
//! same workspace; the weights are bound once first, as a graph struct
//! binds them (a norm folded into the weight after it, a gated pair
//! interleaved). Every tensor of the files is checked against the
//! declaration before anything reaches the device, and each refusal names
//! the file, the tensor and what was expected.

use crate::bench::timing::{self, TimingPlan};
use crate::tune::compile::{self, Built, Job};
use crate::tune::library::SharedLibrary;
use cudarc::driver::{CudaSlice, CudaStream};
use fusion::error::Result as GpuResult;
use fusion::kernels::{
    FUSION_GEMM_NO_STREAM_K, FUSION_GEMM_STATIC_TILES, fusion_elementwise_params, fusion_fold_params,
    fusion_gemm_params, fusion_norm_params,
};
use fusion::launch::{
    Call, Dim, ErrorString, FoldWeights, FoldedWeights, GraphDecl, Launcher, TensorDecl, Workspace,
    WorkspaceBytes,
};
use fusion::testing::{self, HostElement};
use fusion::weights::{Binder, TensorFile, TensorNames};
use fusion::{Arch, Shape, Tensor, TensorMut};
use fusion_compiler::codegen::{self, GraphSpec};
use fusion_compiler::fuse::{self, Composition, Plan, Role};
use fusion_compiler::ir::{DType, Extent, Graph, TensorId, WeightLayout};
use fusion_compiler::reference::{self, Bindings, HostTensor, Intermediates};
use half::{bf16, f16};
use std::ffi::c_void;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// What `fusion run` is asked to do.
#[derive(Clone, Debug)]
pub struct Settings {
    pub graph: PathBuf,
    /// Every tensor of the graph in this element type; default: as declared.
    pub dtype: Option<DType>,
    /// The graph's inputs, under their declared names.
    pub inputs: PathBuf,
    /// Its weights; default: the inputs' file.
    pub weights: Option<PathBuf>,
    /// The names the weights are stored under.
    pub weight_names: TensorNames,
    /// Where to write the outputs.
    pub out: Option<PathBuf>,
    /// Compare every output with the CPU reference on sampled rows.
    pub check: bool,
    /// Time this many calls after the first.
    pub time: Option<usize>,
    /// Where the kernels' units, libraries and nvcc logs go.
    pub work: PathBuf,
    /// nvcc processes at once.
    pub jobs: usize,
}

/// Runs the graph once on the files' tensors; progress and results on `out`.
pub fn run(settings: &Settings, out: &mut dyn Write) -> Result<(), String> {
    let path = &settings.graph;
    let graph = match settings.dtype {
        Some(dtype) => testing::load_graph_as(path, dtype)?,
        None => fusion_compiler::load_toml_graph(path)?,
    };
    let dtype = graph_dtype(&graph).map_err(|e| format!("{}: {e}", path.display()))?;
    let inputs = TensorFile::open(&settings.inputs).map_err(|e| e.to_string())?;
    let weights = match &settings.weights {
        Some(file) => Some(TensorFile::open(file).map_err(|e| e.to_string())?),
        None => None,
    };
    let files = Files {
        inputs: &inputs,
        weights: weights.as_ref().unwrap_or(&inputs),
        weight_names: &settings.weight_names,
    };
    match dtype {
        DType::F16 => run_as::<f16>(settings, graph, files, out),
        DType::BF16 => run_as::<bf16>(settings, graph, files, out),
        DType::F32 => Err(format!(
            "{}: kernels take f16 or bf16 tensors; this graph's are f32",
            path.display()
        )),
    }
}

/// The files a run reads its tensors from.
#[derive(Clone, Copy)]
struct Files<'f> {
    inputs: &'f TensorFile,
    weights: &'f TensorFile,
    weight_names: &'f TensorNames,
}

/// The one element type of every tensor of `graph`, as kernels take it.
fn graph_dtype(graph: &Graph) -> Result<DType, String> {
    let first = graph.tensors.first().map_or(DType::F16, |t| t.dtype);
    match graph.tensors.iter().find(|t| t.dtype != first) {
        Some(other) => Err(format!(
            "kernels take one element type per graph; `{}` is {first} and `{}` is {}",
            graph.tensors[0].name, other.name, other.dtype
        )),
        None => Ok(first),
    }
}

/// The graph's declarations as a generated wrapper has them, made once per
/// process (the checks of [`Call`] and [`Binder`] take them as `'static`).
struct Declared {
    graph: &'static GraphDecl,
    /// By tensor id.
    tensors: Vec<&'static TensorDecl>,
}

impl Declared {
    fn of(graph: &Graph) -> Declared {
        fn leak(text: &str) -> &'static str {
            Box::leak(text.to_owned().into_boxed_str())
        }
        let dims: Vec<&'static str> = graph.dynamic_dims().map(|d| leak(&d.name)).collect();
        let decl = Box::leak(Box::new(GraphDecl {
            name: leak(&graph.name),
            dims: Box::leak(dims.into_boxed_slice()),
        }));
        let tensors = graph
            .tensors
            .iter()
            .map(|tensor| {
                let shape: Vec<Dim> = tensor
                    .shape
                    .iter()
                    .map(|extent| match *extent {
                        Extent::Static(n) => Dim::Static(n as usize),
                        Extent::Dynamic(d) => Dim::Dynamic(
                            graph
                                .dynamic_index(d)
                                .expect("a dynamic extent names a dynamic dim"),
                        ),
                    })
                    .collect();
                &*Box::leak(Box::new(TensorDecl {
                    name: leak(&tensor.name),
                    shape: Box::leak(shape.into_boxed_slice()),
                }))
            })
            .collect();
        Declared { graph: decl, tensors }
    }

    fn of_ids(&self, ids: &[TensorId]) -> Vec<&'static TensorDecl> {
        ids.iter().map(|t| self.tensors[t.0]).collect()
    }
}

/// Checks the files' tensors against the declaration: each input in the
/// inputs' file and each weight in the weights', present, of the graph's
/// element type and declared shape, their dynamic dims agreeing within a
/// file. Nothing touches a device.
fn check_files<T: HostElement>(graph: &Graph, declared: &Declared, files: Files<'_>) -> GpuResult<()> {
    let declared_names = TensorNames::declared();
    Binder::new(declared.graph, files.inputs, &declared_names).check::<T>(&declared.of_ids(&graph.inputs))?;
    Binder::new(declared.graph, files.weights, files.weight_names)
        .check::<T>(&declared.of_ids(&graph.weights))
}

fn run_as<T: HostElement>(
    settings: &Settings,
    graph: Graph,
    files: Files<'_>,
    out: &mut dyn Write,
) -> Result<(), String> {
    let declared = Declared::of(&graph);
    check_files::<T>(&graph, &declared, files).map_err(|e| e.to_string())?;
    let ctx = testing::open_gpu(0)?;
    let gpu = |e: cudarc::driver::DriverError| e.to_string();
    let stream = ctx.new_stream().map_err(gpu)?;
    let arch = fusion::device::arch_among(&stream, &Arch::ALL).map_err(|e| e.to_string())?;
    if !arch.supports(T::DTYPE) {
        return Err(format!("{arch} kernels do not take {}", T::DTYPE));
    }
    let rules = fusion_compiler::select::split_rules(&[arch]).map_err(|e| e.to_string())?;
    let plan = fuse::plan_with(graph, &rules);
    say(
        out,
        format!(
            "{} on {} (fusion variant {arch}): {} kernel{}",
            plan.graph.name,
            ctx.name().unwrap_or_else(|_| "GPU 0".into()),
            plan.kernels.len(),
            if plan.kernels.len() == 1 { "" } else { "s" }
        ),
    )?;
    let kernels = build(settings, &plan, T::DTYPE, arch, out)?;

    let declared_names = TensorNames::declared();
    let upload = |file: &TensorFile,
                  names: &TensorNames,
                  ids: &[TensorId]|
     -> Result<Vec<(TensorId, Tensor<'static, T>)>, String> {
        let mut binder = Binder::new(declared.graph, file, names);
        ids.iter()
            .map(|&t| {
                Ok((
                    t,
                    binder
                        .upload::<T>(&stream, declared.tensors[t.0])
                        .map_err(|e| e.to_string())?,
                ))
            })
            .collect()
    };
    let weights = upload(files.weights, files.weight_names, &plan.graph.weights)?;
    let inputs = upload(files.inputs, &declared_names, &plan.graph.inputs)?;
    let runner = Runner {
        plan: &plan,
        declared: &declared,
        kernels: &kernels,
        stream: &stream,
        arch,
        temporaries: plan.temporaries(),
    };
    let started = Instant::now();
    let folded = runner.bind(&weights).map_err(|e| e.to_string())?;
    if folded.iter().any(Option::is_some) {
        say(
            out,
            format!(
                "  weights bound in {:.1} ms (norms folded, gated pairs interleaved)",
                started.elapsed().as_secs_f64() * 1e3
            ),
        )?;
    }
    let reads: Vec<(TensorId, Tensor<'static, T>)> = inputs.into_iter().chain(weights).collect();
    let mut outputs = Vec::new();
    for (tensor, shape) in runner.output_shapes(&reads).map_err(|e| e.to_string())? {
        let poison = poisoned::<T>(&plan.graph.tensor(tensor).name, shape)?;
        let slice = stream.clone_htod(&poison).map_err(gpu)?;
        outputs.push(Output { tensor, shape, slice });
    }
    let mut workspace = Workspace::new();
    runner
        .call(&mut workspace, &folded, &reads, &mut outputs)
        .map_err(|e| e.to_string())?;
    let mut results = Vec::new();
    for output in &outputs {
        let values = stream.clone_dtoh(&output.slice).map_err(gpu)?;
        let shape = [output.shape.rows(), output.shape.cols()];
        let decoded = T::decode(&shape, &values).map_err(|e| e.to_string())?;
        let name = plan.graph.tensor(output.tensor).name.clone();
        let not_finite = decoded.data.iter().filter(|v| !v.is_finite()).count();
        let finite = match not_finite {
            0 => "all finite".to_owned(),
            n => format!("{n} not finite"),
        };
        say(out, format!("  {name}: {} {}, {finite}", output.shape, T::DTYPE))?;
        results.push(Computed {
            name,
            shape: output.shape,
            values,
            decoded,
        });
    }
    if let Some(path) = &settings.out {
        write_outputs(path, &results)?;
        say(out, format!("  wrote {}", path.display()))?;
    }
    if settings.check {
        check(&plan, files, &results, &folded, out)?;
    }
    if let Some(calls) = settings.time {
        let mut head = stream
            .alloc_zeros::<u8>(crate::bench::HEAD_START_BYTES)
            .map_err(gpu)?;
        let head_stream = stream.clone();
        let timing = timing::time_calls(
            &stream,
            TimingPlan {
                warmup: calls.clamp(1, 10),
                runs: calls.max(1),
            },
            || crate::bench::head_start(&head_stream, &mut head),
            |_| runner.call(&mut workspace, &folded, &reads, &mut outputs),
        )
        .map_err(|e| e.to_string())?;
        say(
            out,
            format!(
                "  {} calls: median {:.1} µs per call (interquartile {:.1}-{:.1} µs)",
                calls.max(1),
                timing.median_us,
                timing.q1_us,
                timing.q3_us
            ),
        )?;
    }
    Ok(())
}

/// The host image of output `name` before the call: NaN everywhere, so
/// that an element no kernel wrote reads back as NaN. Its element and byte
/// counts are checked ([`Shape::bytes`]) and its memory asked for, not
/// assumed: a shape too large for host memory is an error that names it.
fn poisoned<T: HostElement>(name: &str, shape: Shape) -> Result<Vec<T>, String> {
    let bytes = shape.bytes::<T>().map_err(|e| e.to_string())?;
    let len = shape.len().map_err(|e| e.to_string())?;
    let mut values = Vec::new();
    values
        .try_reserve_exact(len)
        .map_err(|e| format!("cannot hold output `{name}` ({shape}, {bytes} bytes) in host memory: {e}"))?;
    values.resize(len, T::NAN);
    Ok(values)
}

fn say(out: &mut dyn Write, line: String) -> Result<(), String> {
    writeln!(out, "{line}").map_err(|e| format!("cannot write to standard output: {e}"))
}

/// One kernel of the plan, loaded: its launcher and what comes with it.
enum Launch {
    Gemm {
        launch: Launcher<fusion_gemm_params>,
        query: WorkspaceBytes<fusion_gemm_params>,
        /// The launcher and query of the folded form, for a kernel whose
        /// norm folds into its weight.
        folded: Option<(Launcher<fusion_gemm_params>, WorkspaceBytes<fusion_gemm_params>)>,
        /// `_fold_weights`, for a kernel that prepares its weights.
        fold: Option<FoldWeights<fusion_fold_params>>,
    },
    Norm(Launcher<fusion_norm_params>),
    Elementwise(Launcher<fusion_elementwise_params>),
}

struct Kernel {
    /// `kernel #0 (gemm_bias_gelu)`, as wrappers name it in errors.
    label: String,
    launch: Launch,
    error_string: ErrorString,
}

/// Renders the plan's kernels for `dtype` on `arch`, builds each into a
/// shared library (or finds it built) and loads them, in plan order.
fn build(
    settings: &Settings,
    plan: &Plan,
    dtype: DType,
    arch: Arch,
    out: &mut dyn Write,
) -> Result<Vec<Kernel>, String> {
    let lib_name = library_name(&plan.graph.name);
    let spec = GraphSpec {
        plan: plan.clone(),
        dtypes: vec![dtype],
        origin: settings.graph.display().to_string(),
        fingerprint: None,
        declaration: String::new(),
    };
    let library = codegen::render(&lib_name, &[arch], &[spec]).map_err(|e| e.to_string())?;
    for warning in &library.warnings {
        say(out, format!("  warning: {warning}"))?;
    }
    let jobs: Vec<Job> = library
        .units
        .iter()
        .map(|unit| Job {
            symbol: unit.symbol.clone(),
            sources: vec![
                (unit.symbol.clone(), unit.source.clone()),
                library.error_unit.clone(),
            ],
            arch,
        })
        .collect();
    let nvcc = compile::find_nvcc()?;
    let started = Instant::now();
    let built = compile::build_all_with_progress(&nvcc, &settings.work, &jobs, settings.jobs)?;
    say(
        out,
        format!(
            "  {} unit{} for {arch} ready in {:.1} s (nvcc {}; units, libraries, logs: {})",
            jobs.len(),
            if jobs.len() == 1 { "" } else { "s" },
            started.elapsed().as_secs_f64(),
            nvcc.release(),
            settings.work.display()
        ),
    )?;
    let mut libraries = Vec::new();
    for (job, built) in jobs.iter().zip(built) {
        match built {
            Built::Library { path, .. } => {
                // SAFETY: built just now (or earlier, from the same key) by
                // `compile` from units fusion rendered.
                libraries.push((job.symbol.as_str(), unsafe { SharedLibrary::load(&path) }?));
            }
            Built::Failed { log, message } => {
                return Err(format!(
                    "nvcc did not build {}: {message} (log: {})",
                    job.symbol,
                    log.display()
                ));
            }
        }
    }
    let error_name = format!("{lib_name}_error_string");
    plan.kernels
        .iter()
        .enumerate()
        .map(|(index, kernel)| {
            let symbol = library.graphs[0].kernels[index]
                .symbol(dtype, arch)
                .expect("the library renders every kernel for its dtype and arch");
            let (_, lib) = libraries
                .iter()
                .find(|(s, _)| *s == symbol)
                .expect("one library per unit");
            // SAFETY: each type is the one abi.h declares for that name,
            // which fusion's templates render for this kind of kernel.
            let launch = unsafe {
                match kernel.composition {
                    Composition::Gemm(_) => Launch::Gemm {
                        launch: lib.get(symbol)?,
                        query: lib.get(&format!("{symbol}_workspace_bytes"))?,
                        folded: if kernel.norm_foldable(&plan.graph) {
                            Some((
                                lib.get(&format!("{symbol}_folded"))?,
                                lib.get(&format!("{symbol}_folded_workspace_bytes"))?,
                            ))
                        } else {
                            None
                        },
                        fold: if kernel.prepares_weights(&plan.graph) {
                            Some(lib.get(&format!("{symbol}_fold_weights"))?)
                        } else {
                            None
                        },
                    },
                    Composition::Norm(_) => Launch::Norm(lib.get(symbol)?),
                    Composition::Elementwise(_) => Launch::Elementwise(lib.get(symbol)?),
                }
            };
            Ok(Kernel {
                label: plan.kernel_label(index),
                launch,
                // SAFETY: abi.h's `const char* <lib>_error_string(int)`.
                error_string: unsafe { lib.get(&error_name) }?,
            })
        })
        .collect()
}

/// The library name of a graph's kernels: `run_` and the graph's name as
/// symbols take it.
fn library_name(graph: &str) -> String {
    codegen::library_name(&format!("run_{graph}"))
}

/// A planned graph with its kernels loaded: what a generated module's
/// `fold_weights` and `run` do, driven by the plan at run time.
struct Runner<'r> {
    plan: &'r Plan,
    declared: &'r Declared,
    kernels: &'r [Kernel],
    stream: &'r Arc<CudaStream>,
    /// The generation the kernels were built for.
    arch: Arch,
    /// [`Plan::temporaries`], a workspace buffer each.
    temporaries: Vec<TensorId>,
}

/// An output's device buffer and shape.
struct Output<T> {
    tensor: TensorId,
    shape: Shape,
    slice: CudaSlice<T>,
}

/// One kernel's params and the launcher that takes them, ready to launch.
enum Params {
    Gemm(fusion_gemm_params, Launcher<fusion_gemm_params>),
    Norm(fusion_norm_params, Launcher<fusion_norm_params>),
    Elementwise(fusion_elementwise_params, Launcher<fusion_elementwise_params>),
}

fn pointer(address: Option<u64>) -> *const c_void {
    address.map_or(std::ptr::null(), |a| a as *const c_void)
}

impl Runner<'_> {
    /// Prepares each kernel's weights that can be prepared (abi.h's
    /// `_fold_weights`): one entry per kernel; returns once the folds ran.
    fn bind<T: HostElement>(
        &self,
        weights: &[(TensorId, Tensor<'static, T>)],
    ) -> GpuResult<Vec<Option<FoldedWeights>>> {
        let graph = &self.plan.graph;
        let mut call = Call::new(self.declared.graph, self.stream);
        let mut address = vec![None; graph.tensors.len()];
        for (tensor, value) in weights {
            address[tensor.0] = Some(call.input(self.declared.tensors[tensor.0], value)?);
        }
        let mut folded = Vec::new();
        for (kernel, loaded) in self.plan.kernels.iter().zip(self.kernels) {
            let (Composition::Gemm(gemm), Launch::Gemm { fold, .. }) = (&kernel.composition, &loaded.launch)
            else {
                folded.push(None);
                continue;
            };
            let b = kernel.operand(Role::B).expect("a GEMM reads B");
            let Some(fold) = fold else {
                // A bound plain weight: copied into padded rows where that
                // reads faster, as a graph struct does.
                let padded = match address[b.0] {
                    Some(weight) if kernel.binds_b(graph) => FoldedWeights::pad(
                        &call,
                        &loaded.label,
                        self.arch,
                        weight,
                        call.matrix(self.declared.tensors[b.0])?,
                        size_of::<T>(),
                    )?,
                    _ => None,
                };
                folded.push(padded);
                continue;
            };
            let foldable = kernel.norm_foldable(graph);
            let fields = kernel.gemm_operands().map(|o| address[o.tensor.0]);
            let (rows, cols) = call.matrix(self.declared.tensors[b.0])?;
            let (n, k) = match gemm.b_layout {
                WeightLayout::NK => (rows, cols),
                WeightLayout::KN => (cols, rows),
            };
            // A gated pair's prepared weight holds both: twice the columns.
            // Column terms only where a norm folds.
            let halves = if gemm.gate.is_some() { 2 } else { 1 };
            let columns = if foldable { halves * n as usize } else { 0 };
            // The weights were checked: twice their rows still fit an i64.
            let stored = match gemm.b_layout {
                WeightLayout::NK => (halves as i64 * rows, cols),
                WeightLayout::KN => (rows, halves as i64 * cols),
            };
            let stream = call.stream_ptr();
            let prepared = FoldedWeights::fold(
                &call,
                &loaded.label,
                self.arch,
                stored,
                size_of::<T>(),
                columns,
                |w_folded, col_terms, ld_folded| {
                    let (gamma, beta) = if foldable {
                        (pointer(fields.gamma.flatten()), pointer(fields.beta.flatten()))
                    } else {
                        (std::ptr::null(), std::ptr::null())
                    };
                    let params = fusion_fold_params {
                        w: pointer(fields.b.flatten()),
                        w_up: pointer(fields.b_up.flatten()),
                        gamma,
                        beta,
                        w_folded,
                        col_terms,
                        n,
                        k,
                        ld_folded,
                    };
                    // SAFETY: the weights were checked by `call` and the
                    // outputs were just allocated at the sizes the fold writes.
                    unsafe { fold(&params, stream) }
                },
                loaded.error_string,
            )?;
            folded.push(Some(prepared));
        }
        self.stream.synchronize()?;
        Ok(folded)
    }

    /// Each output's shape once the dims of `reads` are bound.
    fn output_shapes<T: HostElement>(
        &self,
        reads: &[(TensorId, Tensor<'static, T>)],
    ) -> GpuResult<Vec<(TensorId, Shape)>> {
        let mut call = Call::new(self.declared.graph, self.stream);
        for (tensor, value) in reads {
            call.input(self.declared.tensors[tensor.0], value)?;
        }
        self.plan
            .graph
            .outputs
            .iter()
            .map(|&t| {
                let decl = self.declared.tensors[t.0];
                // Both fit an i64, so both fit a usize.
                let (rows, cols) = call.matrix(decl)?;
                Ok((
                    t,
                    match decl.shape.len() {
                        1 => Shape::Vector(cols as usize),
                        _ => Shape::Matrix(rows as usize, cols as usize),
                    },
                ))
            })
            .collect()
    }

    /// One call of the graph: `reads` (inputs and weights) checked, the
    /// outputs written, every kernel queued on the stream.
    fn call<T: HostElement>(
        &self,
        workspace: &mut Workspace,
        folded: &[Option<FoldedWeights>],
        reads: &[(TensorId, Tensor<'static, T>)],
        outputs: &mut [Output<T>],
    ) -> GpuResult<()> {
        let graph = &self.plan.graph;
        let decl = |t: TensorId| self.declared.tensors[t.0];
        let mut views = Vec::with_capacity(outputs.len());
        for output in outputs.iter_mut() {
            views.push((output.tensor, TensorMut::new(&mut output.slice, output.shape)?));
        }
        let mut call = Call::new(self.declared.graph, self.stream);
        let mut address: Vec<Option<u64>> = vec![None; graph.tensors.len()];
        for (tensor, value) in reads {
            address[tensor.0] = Some(call.input(decl(*tensor), value)?);
        }
        for (tensor, view) in views.iter_mut() {
            address[tensor.0] = Some(call.output(decl(*tensor), view)?);
        }
        call.check_aliasing()?;
        // No output has an element: nothing to launch. (One empty output
        // among others skips only its own kernel, below.)
        if call.is_empty() {
            return Ok(());
        }
        let (intermediates, scratch, call_use) = workspace.begin_call(self.stream)?;
        if !self.temporaries.is_empty() {
            let decls = self.declared.of_ids(&self.temporaries);
            let buffers = call.intermediates::<T>(intermediates, &decls)?;
            for (tensor, buffer) in self.temporaries.iter().zip(buffers) {
                address[tensor.0] = Some(buffer);
            }
        }
        let flags = call.gemm_flags(FUSION_GEMM_NO_STREAM_K, FUSION_GEMM_STATIC_TILES)?;
        let mut params = Vec::with_capacity(self.kernels.len());
        let mut scratch_bytes = 0u64;
        for (index, (kernel, loaded)) in self.plan.kernels.iter().zip(self.kernels).enumerate() {
            let at = |t: Option<TensorId>| pointer(t.and_then(|t| address[t.0]));
            let out = address[kernel.output.0].unwrap_or_default() as *mut c_void;
            let out_decl = decl(kernel.output);
            params.push(match (&kernel.composition, &loaded.launch) {
                (
                    Composition::Gemm(gemm),
                    Launch::Gemm {
                        launch,
                        query,
                        folded: folded_form,
                        ..
                    },
                ) => {
                    let fields = kernel.gemm_operands().map(|o| o.tensor);
                    let (m, k) = call.reduced_matrix(decl(fields.a.unwrap_or(kernel.output)), out_decl)?;
                    let n = call.matrix(out_decl)?.1;
                    let mut p = fusion_gemm_params {
                        a: at(fields.a),
                        b: at(fields.b),
                        b_up: at(fields.b_up),
                        c: out,
                        bias: at(fields.bias),
                        residual: at(fields.residual),
                        multiplier: at(fields.multiplier),
                        gamma: at(fields.gamma),
                        beta: at(fields.beta),
                        col_terms: std::ptr::null(),
                        m,
                        n,
                        k,
                        ldb: 0,
                        eps: gemm.prologue.map_or(0.0, |p| p.eps) as f32,
                        flags,
                        workspace: std::ptr::null_mut(),
                        workspace_bytes: 0,
                    };
                    let prepared = folded.get(index).and_then(Option::as_ref);
                    if let Some(weights) = prepared {
                        let (b, col_terms, ldb) = call.folded(weights);
                        p.b = b as *const c_void;
                        p.ldb = ldb;
                        if kernel.prepares_weights(&self.plan.graph) {
                            p.b_up = std::ptr::null();
                            p.col_terms = col_terms as *const c_void;
                        }
                    }
                    // With its norm folded into the weight, the kernel runs
                    // the folded launcher.
                    let (launch, query) = match (prepared, folded_form) {
                        (Some(_), Some(form)) => *form,
                        _ => (*launch, *query),
                    };
                    scratch_bytes = scratch_bytes.max(call.workspace_bytes(
                        &loaded.label,
                        query,
                        &p,
                        loaded.error_string,
                    )?);
                    Params::Gemm(p, launch)
                }
                (Composition::Norm(norm), Launch::Norm(launch)) => {
                    let (m, k) = call.matrix(out_decl)?;
                    Params::Norm(
                        fusion_norm_params {
                            x: at(kernel.operand(Role::X)),
                            y: out,
                            gamma: at(kernel.operand(Role::Gamma)),
                            beta: at(kernel.operand(Role::Beta)),
                            m,
                            k,
                            eps: norm.eps as f32,
                        },
                        *launch,
                    )
                }
                (Composition::Elementwise(_), Launch::Elementwise(launch)) => {
                    let (m, n) = call.matrix(out_decl)?;
                    Params::Elementwise(
                        fusion_elementwise_params {
                            x: at(kernel.operand(Role::X)),
                            y: out,
                            operands: kernel.step_operands().map(|o| at(o.map(|o| o.tensor))),
                            m,
                            n,
                        },
                        *launch,
                    )
                }
                _ => unreachable!("each kernel is loaded for its composition"),
            });
        }
        let (scratch_ptr, scratch_len) = call.scratch(scratch, scratch_bytes)?;
        for ((params, loaded), kernel) in params.iter_mut().zip(self.kernels).zip(&self.plan.kernels) {
            // A kernel whose own output is empty is not launched, while the
            // others are (`Call::has_elements` says why).
            if !call.has_elements(decl(kernel.output))? {
                continue;
            }
            // SAFETY (each launch): every pointer was checked by `call`
            // (shape, context, alignment, no output aliasing an input) and
            // stays borrowed until `call` is dropped; the launcher only
            // enqueues work.
            let code = match params {
                Params::Gemm(p, launch) => {
                    p.workspace = scratch_ptr;
                    p.workspace_bytes = scratch_len;
                    unsafe { launch(p, call.stream_ptr()) }
                }
                Params::Norm(p, launch) => unsafe { launch(p, call.stream_ptr()) },
                Params::Elementwise(p, launch) => unsafe { launch(p, call.stream_ptr()) },
            };
            call.launched(&loaded.label, code, loaded.error_string)?;
        }
        call_use.finish()?;
        Ok(())
    }
}

/// An output as the run read it back.
struct Computed<T> {
    name: String,
    shape: Shape,
    values: Vec<T>,
    /// `values` for the reference's comparisons.
    decoded: HostTensor,
}

/// Writes the outputs to a safetensors file, whole or not at all.
fn write_outputs<T: HostElement>(path: &Path, results: &[Computed<T>]) -> Result<(), String> {
    let tensors: Vec<(String, DType, Vec<usize>, Vec<u8>)> = results
        .iter()
        .map(|r| {
            let shape = match r.shape {
                Shape::Vector(n) => vec![n],
                Shape::Matrix(rows, cols) => vec![rows, cols],
            };
            (r.name.clone(), T::DTYPE, shape, T::to_le_bytes(&r.values))
        })
        .collect();
    let bytes = fusion::weights::serialize(&tensors)?;
    let partial = path.with_extension("safetensors.partial");
    std::fs::write(&partial, bytes)
        .and_then(|()| std::fs::rename(&partial, path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// Compares each output with the CPU reference on the rows a GPU test
/// compares (all up to 256, else one per 64-row band and more at random).
fn check<T: HostElement>(
    plan: &Plan,
    files: Files<'_>,
    results: &[Computed<T>],
    folded: &[Option<FoldedWeights>],
    out: &mut dyn Write,
) -> Result<(), String> {
    let graph = &plan.graph;
    let mut bindings = Bindings::new();
    let declared_names = TensorNames::declared();
    for (file, names, ids) in [
        (files.inputs, &declared_names, &graph.inputs),
        (files.weights, files.weight_names, &graph.weights),
    ] {
        for &t in ids {
            let name = &graph.tensor(t).name;
            let view = file.get(&names.in_file(name)).expect("checked before the run");
            let values = T::from_le_bytes(view.bytes);
            bindings.insert(
                name.clone(),
                T::decode(view.shape, &values).map_err(|e| e.to_string())?,
            );
        }
    }
    // A norm GEMM whose norm was not folded stores the normalized rows in
    // the element type first; the reference rounds them too.
    let unfolded_norm = plan.kernels.iter().zip(folded).any(|(kernel, prepared)| {
        let folds = prepared.is_some() && kernel.norm_foldable(graph);
        matches!(&kernel.composition, Composition::Gemm(g) if g.prologue.is_some()) && !folds
    });
    let intermediates = if unfolded_norm {
        Intermediates::RoundedNorms
    } else {
        Intermediates::Exact
    };
    let rows_of = results.first().map_or(0, |r| r.shape.rows());
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(seed);
    let rows = testing::rows_to_check(rows_of, &mut rng);
    let started = Instant::now();
    let want =
        reference::evaluate_rows_with(graph, &bindings, &rows, intermediates).map_err(|e| e.to_string())?;
    let mut failed = Vec::new();
    for result in results {
        let (name, count) = (&result.name, result.shape.rows());
        let got = result.decoded.select_rows(&rows).map_err(|e| e.to_string())?;
        let want = want
            .get(name)
            .ok_or_else(|| format!("the reference computed no `{name}`"))?;
        match testing::compare(&got, want, T::DTYPE, &rows) {
            Ok(error) => say(
                out,
                format!(
                    "  check {name}: {} of {count} rows match the CPU reference (relative L2 error {error:.2e}, limit {:.1e})",
                    rows.len(),
                    testing::relative_l2_limit(T::DTYPE)
                ),
            )?,
            Err(mismatch) => {
                say(out, format!("  check {name}: MISMATCH: {mismatch}"))?;
                failed.push(name.clone());
            }
        }
    }
    say(
        out,
        format!("  reference computed in {:.1} s", started.elapsed().as_secs_f64()),
    )?;
    if failed.is_empty() {
        Ok(())
    } else {
        Err(format!("{} did not match the CPU reference", failed.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fusion_compiler::diagnostic::SourceFile;

    const GRAPH: &str = r#"
[graph]
name = "ffn_Block"
[dims]
M = "dyn"
D = 16
F = 8
[inputs]
x = "f16[M, D]"
[weights]
norm = "f16[D]"
w_gate = "f16[F, D]"
[outputs]
y = "rmsnorm(x, norm, eps = 1e-5) @ w_gate^T"
"#;

    fn graph() -> Graph {
        fusion_compiler::graph_from_source(&SourceFile::new("ffn.toml", GRAPH)).expect("a valid graph")
    }

    fn file(label: &str, tensors: &[(&str, DType, &[usize])]) -> TensorFile {
        let tensors: Vec<(String, DType, Vec<usize>, Vec<u8>)> = tensors
            .iter()
            .map(|&(name, dtype, shape)| {
                let bytes = vec![0x3c; 2 * shape.iter().product::<usize>()];
                (name.to_owned(), dtype, shape.to_vec(), bytes)
            })
            .collect();
        TensorFile::from_bytes(label, fusion::weights::serialize(&tensors).unwrap()).unwrap()
    }

    fn checked(inputs: &TensorFile, weights: &TensorFile, names: &TensorNames) -> Result<(), String> {
        let graph = graph();
        let declared = Declared::of(&graph);
        let files = Files {
            inputs,
            weights,
            weight_names: names,
        };
        check_files::<f16>(&graph, &declared, files).map_err(|e| e.to_string())
    }

    #[test]
    fn each_tensor_is_checked_against_the_declaration_before_the_gpu() {
        let x = file("x.safetensors", &[("x", DType::F16, &[5, 16])]);
        let declared = TensorNames::declared();
        let weights = file(
            "w.safetensors",
            &[("norm", DType::F16, &[16]), ("w_gate", DType::F16, &[8, 16])],
        );
        assert_eq!(checked(&x, &weights, &declared), Ok(()));

        let missing = file("w.safetensors", &[("norm", DType::F16, &[16])]);
        let error = checked(&x, &missing, &declared).unwrap_err();
        assert!(
            error.starts_with("w.safetensors has no tensor `w_gate`"),
            "{error}"
        );

        let bf16_gate = file(
            "w.safetensors",
            &[("norm", DType::F16, &[16]), ("w_gate", DType::BF16, &[8, 16])],
        );
        let error = checked(&x, &bf16_gate, &declared).unwrap_err();
        assert!(
            error.contains("`w_gate` in w.safetensors") && error.contains("BF16"),
            "{error}"
        );

        let short_x = file("x.safetensors", &[("x", DType::F16, &[5, 12])]);
        let error = checked(&short_x, &weights, &declared).unwrap_err();
        assert!(
            error.contains("has shape [5, 12] but the graph declares [M, 16]"),
            "{error}"
        );
    }

    #[test]
    fn weights_are_found_under_a_decoder_layers_hugging_face_names() {
        let x = file("x.safetensors", &[("x", DType::F16, &[5, 16])]);
        let checkpoint = file(
            "model.safetensors",
            &[
                (
                    "model.layers.2.post_attention_layernorm.weight",
                    DType::F16,
                    &[16],
                ),
                ("model.layers.2.mlp.gate_proj.weight", DType::F16, &[8, 16]),
            ],
        );
        assert_eq!(checked(&x, &checkpoint, &TensorNames::hugging_face(2)), Ok(()));
        let error = checked(&x, &checkpoint, &TensorNames::hugging_face(3)).unwrap_err();
        assert!(error.contains("no tensor `model.layers.3."), "{error}");
    }

    #[test]
    fn the_declarations_index_the_dynamic_dims_in_order() {
        let declared = Declared::of(&graph());
        assert_eq!(declared.graph.name, "ffn_Block");
        assert_eq!(declared.graph.dims, ["M"]);
        let x = declared.tensors.iter().find(|t| t.name == "x").unwrap();
        assert_eq!(x.shape, [Dim::Dynamic(0), Dim::Static(16)]);
    }

    #[test]
    fn a_graph_of_two_element_types_is_refused_and_names_are_symbol_safe() {
        // The front end accepts two element types where no op mixes them:
        // a bf16 input with an output of its own beside the f16 block.
        let mixed = GRAPH
            .replace("[weights]", "r = \"bf16[M, 16]\"\n[weights]")
            .replace("[outputs]", "[outputs]\nz = \"relu(r)\"");
        let mixed = fusion_compiler::graph_from_source(&SourceFile::new("mixed.toml", mixed))
            .expect("the front end accepts ops that each take one element type");
        let error = graph_dtype(&mixed).unwrap_err();
        assert_eq!(
            error,
            "kernels take one element type per graph; `x` is f16 and `r` is bf16"
        );
        assert_eq!(graph_dtype(&graph()), Ok(DType::F16));
        assert_eq!(library_name("ffn_Block"), "run_ffn_block");
        assert_eq!(library_name("Gemm2"), "run_gemm2");
    }

    #[test]
    fn an_outputs_poison_has_checked_sizes() {
        let poison = poisoned::<f16>("y", Shape::Matrix(3, 8)).unwrap();
        assert_eq!(poison.len(), 24);
        assert!(poison.iter().all(|v| v.is_nan()));
        assert!(poisoned::<f16>("y", Shape::Matrix(0, 8)).unwrap().is_empty());
        // The element count overflows: rows × cols wrapped (or panicked)
        // before it was checked.
        let error = poisoned::<f16>("y", Shape::Matrix(usize::MAX / 2 + 1, 2)).unwrap_err();
        assert!(
            error.starts_with("the element count of shape") && error.contains("overflows usize"),
            "{error}"
        );
        // The byte count overflows.
        let error = poisoned::<f16>("y", Shape::Vector(usize::MAX / 2 + 1)).unwrap_err();
        assert!(error.starts_with("the byte count of shape"), "{error}");
        // Both fit a usize, but no allocation can be that large.
        let error = poisoned::<f16>("y", Shape::Matrix(usize::MAX / 4, 2)).unwrap_err();
        assert!(
            error.starts_with(
                "cannot hold output `y` ([4611686018427387903, 2], 18446744073709551612 bytes) in host memory"
            ),
            "{error}"
        );
    }
}
