//! `fusion run`: any TOML graph run on tensors from safetensors files,
//! without writing Rust.
//!
//! The graph is planned for the GPU's generation and its kernels rendered
//! as a build renders them, then built by nvcc into one shared library per
//! kernel on first use (the tuner's compiles, which a later run reuses while
//! the sources, headers, nvcc and flags are unchanged) and loaded. A call
//! is the plan as a table ([`fusion::plan::PlanTable`]) run by the executor
//! generated wrappers run theirs with ([`fusion::plan::run`]): the same
//! checks (shapes, dims, alignment, aliasing), the same workspace, the same
//! params; the weights are bound once first, as a graph struct binds them
//! ([`fusion::plan::bind`]: a norm folded into the weight after it, a gated
//! pair interleaved, rows padded). Every tensor of the files is checked against the
//! declaration before anything reaches the device, and each refusal names
//! the file, the tensor and what was expected.

use crate::bench::timing::{self, TimingPlan};
use crate::table::{self, Declared, reference_intermediates};
use crate::tune::compile::{self, Built, Job};
use crate::tune::library::SharedLibrary;
use cudarc::driver::{CudaSlice, CudaStream};
use fusion::error::Result as GpuResult;
use fusion::launch::{Call, ErrorString, FoldedWeights, Workspace};
use fusion::plan::{self, Launchers, PlanTable, Weights};
use fusion::testing::{self, HostElement};
use fusion::weights::{Binder, BoundWeights, TensorFile, TensorNames};
use fusion::{Arch, Shape, Tensor, TensorMut};
use fusion_compiler::codegen::{self, GraphSpec};
use fusion_compiler::fuse::{self, Plan};
use fusion_compiler::ir::{DType, Graph, TensorId};
use fusion_compiler::reference::{self, Bindings, HostTensor};
use half::{bf16, f16};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// What `fusion run` is asked to do.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The graph's TOML file.
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
    if let Some(refusal) = graph.fp8_refusal() {
        return Err(format!("{}: {refusal}", path.display()));
    }
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
        DType::F32 | DType::F8E4M3 => Err(format!(
            "{}: kernels take f16 or bf16 tensors; this graph's are {dtype}",
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

/// Checks the files' tensors against the declaration: each input in the
/// inputs' file and each weight in the weights', present, of the graph's
/// element type and declared shape, their dynamic dims agreeing within a
/// file. Nothing touches a device.
fn check_files<T: HostElement>(graph: &Graph, declared: &Declared, files: Files<'_>) -> GpuResult<()> {
    let declared_names = TensorNames::declared();
    Binder::new(declared.graph, files.inputs, &declared_names).check::<T>(&declared.of_ids(&graph.inputs))?;
    Binder::new(declared.graph, files.weights, files.weight_names)
        .check::<T>(&declared.of_ids(&graph.weights))?;
    Ok(())
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
                        .upload::<T>(&stream, &declared.tensors[t.0])
                        .map_err(|e| e.to_string())?,
                ))
            })
            .collect()
    };
    let weights = upload(files.weights, files.weight_names, &plan.graph.weights)?;
    let inputs = upload(files.inputs, &declared_names, &plan.graph.inputs)?;
    let table = table::plan_table(&plan, declared, T::DTYPE, arch, kernels);
    let started = Instant::now();
    // Clones share the weights' memory: the reference's reads keep them.
    let weight_views: Vec<Tensor<'static, T>> = weights.iter().map(|(_, w)| w.clone()).collect();
    // SAFETY: `table::plan_table` built the table from the plan whose kernels these libraries hold.
    let bound = unsafe { plan::bind(table, &stream, weight_views) }.map_err(|e| e.to_string())?;
    let folded = bound.prepared();
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
    for (tensor, shape) in output_shapes(table, &stream, &reads).map_err(|e| e.to_string())? {
        let poison = poisoned::<T>(&plan.graph.tensor(tensor).name, shape)?;
        let slice = stream.clone_htod(&poison).map_err(gpu)?;
        outputs.push(Output { tensor, shape, slice });
    }
    let mut workspace = Workspace::new();
    call(table, &mut workspace, &bound, &stream, &reads, &mut outputs).map_err(|e| e.to_string())?;
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
        check(&plan, files, &results, folded, out)?;
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
            |_| call(table, &mut workspace, &bound, &stream, &reads, &mut outputs),
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

/// Renders the plan's kernels for `dtype` on `arch`, builds each into a
/// shared library (or finds it built) and loads them, in plan order: each
/// kernel's launchers and its library's `_error_string`.
fn build(
    settings: &Settings,
    plan: &Plan,
    dtype: DType,
    arch: Arch,
    out: &mut dyn Write,
) -> Result<Vec<(Launchers, ErrorString)>, String> {
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
            // SAFETY: fusion's templates rendered the unit for this kernel.
            let launch = unsafe { lib.launchers(symbol, kernel, &plan.graph) }?;
            // SAFETY: abi.h's `const char* <lib>_error_string(int)`.
            Ok((launch, unsafe { lib.get(&error_name) }?))
        })
        .collect()
}

/// The library name of a graph's kernels: `run_` and the graph's name as
/// symbols take it.
fn library_name(graph: &str) -> String {
    codegen::library_name(&format!("run_{graph}"))
}

/// An output's device buffer and shape.
struct Output<T> {
    tensor: TensorId,
    shape: Shape,
    slice: CudaSlice<T>,
}

/// Each output's shape once the dims of `reads` are bound.
fn output_shapes<T: HostElement>(
    table: &'static PlanTable,
    stream: &Arc<CudaStream>,
    reads: &[(TensorId, Tensor<'static, T>)],
) -> GpuResult<Vec<(TensorId, Shape)>> {
    let mut call = Call::new(table.graph, stream);
    for (tensor, value) in reads {
        call.input(&table.tensors[tensor.0], value)?;
    }
    table
        .outputs
        .iter()
        .map(|&t| {
            let decl = &table.tensors[t];
            // Both fit an i64, so both fit a usize.
            let (rows, cols) = call.matrix(decl)?;
            Ok((
                TensorId(t),
                match decl.shape.len() {
                    1 => Shape::Vector(cols as usize),
                    _ => Shape::Matrix(rows as usize, cols as usize),
                },
            ))
        })
        .collect()
}

/// One call of the graph through the executor: the inputs (the first of
/// `reads`, as [`run_as`] lists them), the `bound` weights and the outputs.
fn call<T: HostElement>(
    table: &'static PlanTable,
    workspace: &mut Workspace,
    bound: &BoundWeights<'static, T>,
    stream: &Arc<CudaStream>,
    reads: &[(TensorId, Tensor<'static, T>)],
    outputs: &mut [Output<T>],
) -> GpuResult<()> {
    let inputs: Vec<&Tensor<'static, T>> = reads[..table.inputs.len()].iter().map(|(_, t)| t).collect();
    let mut views = Vec::with_capacity(outputs.len());
    for output in outputs.iter_mut() {
        views.push(TensorMut::new(&mut output.slice, output.shape)?);
    }
    let mut writes: Vec<&mut TensorMut<'_, T>> = views.iter_mut().collect();
    // SAFETY: `table::plan_table` built the table from the plan, with its libraries' launchers.
    unsafe {
        plan::run(
            table,
            workspace,
            Weights::Bound(bound),
            stream,
            &inputs,
            &mut writes,
        )
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
    let intermediates = reference_intermediates(plan, folded);
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
    use crate::table::stand_ins::{self, filled};
    use fusion::abi::{FUSION_GEMM_NO_STREAM_K, FUSION_GEMM_STATIC_TILES};
    use fusion::launch::Dim;
    use fusion::plan::{KernelEntry, KernelOp};
    use fusion_compiler::diagnostic::SourceFile;
    use fusion_compiler::fuse::Composition;
    use fusion_compiler::reference::Intermediates;

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

    /// The table `fusion run` makes for `graph` (planned as a build for
    /// `archs` plans it), with stand-in launchers.
    fn run_table(graph: Graph, archs: &[Arch]) -> &'static PlanTable {
        let rules = fusion_compiler::select::split_rules(archs).unwrap();
        let plan = fuse::plan_with(graph, &rules);
        let declared = Declared::of(&plan.graph);
        let kernels = plan
            .kernels
            .iter()
            .map(|kernel| stand_ins::launchers(kernel, &plan.graph))
            .collect();
        table::plan_table(&plan, declared, DType::F16, archs[archs.len() - 1], kernels)
    }

    /// The generated wrappers and `fusion run` call one executor with a
    /// table each: for the shipped graphs, the two tables fill every
    /// kernel's params to the same bytes, per call and with bound weights.
    #[test]
    fn generated_structs_and_fusion_run_fill_the_same_params() {
        let mut compared = 0;
        for (table, graph, archs) in stand_ins::generated() {
            let name = table.graph.name;
            if archs.is_empty() {
                // A build without nvcc: no variants to compare against.
                continue;
            }
            compared += 1;
            let ours = run_table(graph, archs);
            assert_eq!(ours.tensors.len(), table.tensors.len(), "{name}");
            for (a, b) in ours.tensors.iter().zip(table.tensors) {
                assert_eq!((a.name, a.shape), (b.name, b.shape), "{name}");
            }
            assert_eq!(
                (ours.inputs, ours.weights, ours.outputs, ours.temporaries),
                (table.inputs, table.weights, table.outputs, table.temporaries),
                "{name}"
            );
            assert_eq!(ours.kernels.len(), table.kernels.len(), "{name}");
            for (a, b) in ours.kernels.iter().zip(table.kernels) {
                let bind = |k: &KernelEntry| match &k.op {
                    KernelOp::Gemm(g) => Some((g.bind, g.b_layout)),
                    _ => None,
                };
                assert_eq!(
                    (a.label, a.output, bind(a)),
                    (b.label, b.output, bind(b)),
                    "{name}"
                );
            }
            for flags in [0, FUSION_GEMM_NO_STREAM_K | FUSION_GEMM_STATIC_TILES] {
                for prepared in [false, true] {
                    assert_eq!(
                        filled(ours, flags, prepared),
                        filled(table, flags, prepared),
                        "{name}: flags {flags}, prepared {prepared}"
                    );
                }
            }
        }
        assert!(compared == 8 || fusion::device::compiled().is_empty());
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

    /// A norm GEMM whose B is an input binds nothing, so `plan::bind`
    /// returns no entry at all: the kernel normalizes A per call, and the
    /// reference must round those rows as it does (it compared unrounded
    /// rows when no entry was read as "folded").
    #[test]
    fn the_reference_rounds_the_norms_no_binding_folded() {
        let source = GRAPH.replace(
            "[weights]\nnorm = \"f16[D]\"\nw_gate = \"f16[F, D]\"",
            "w_gate = \"f16[F, D]\"\n[weights]\nnorm = \"f16[D]\"",
        );
        let graph = fusion_compiler::graph_from_source(&SourceFile::new("ffn.toml", &source)).unwrap();
        let rules = fusion_compiler::select::split_rules(&[Arch::Sm90]).unwrap();
        let plan = fuse::plan_with(graph, &rules);
        let [kernel] = &plan.kernels[..] else {
            panic!("one kernel: {plan}")
        };
        assert!(matches!(&kernel.composition, Composition::Gemm(g) if g.prologue.is_some()));
        assert!(!kernel.prepares_weights(&plan.graph) && !kernel.binds_b(&plan.graph));
        assert_eq!(reference_intermediates(&plan, &[]), Intermediates::RoundedNorms);
        assert_eq!(
            reference_intermediates(&plan, &[None]),
            Intermediates::RoundedNorms
        );
        // A graph without a norm GEMM computes exactly.
        let graph = fusion_compiler::graph_from_source(&SourceFile::new(
            "gemm.toml",
            GRAPH
                .replace("norm = \"f16[D]\"\n", "")
                .replace("rmsnorm(x, norm, eps = 1e-5)", "x"),
        ))
        .unwrap();
        let plan = fuse::plan_with(graph, &rules);
        assert_eq!(reference_intermediates(&plan, &[]), Intermediates::Exact);
    }
}
