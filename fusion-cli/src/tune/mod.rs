//! `fusion tune`: tile configs measured on this GPU for graphs' GEMM
//! kernels at the user's shapes, written into a tuned cache
//! ([`fusion_compiler::select::TunedCache`]) that builds then read
//! (`Builder::tuned`, `FUSION_TUNED`).
//!
//! Per GEMM kernel of a graph's plan, alone ([`Plan::kernel_graph`]), and
//! arch: the arch's search space, pruned before any compile
//! ([`fusion_compiler::tune`]);
//! every candidate, and the shipped table's config, rendered as a
//! one-kernel library and built by nvcc into a shared library, several at
//! once (`compile`); each loaded (`library`) as a table of the kernel's
//! plan alone ([`Plan::kernel_plan`], [`crate::table`]) that the run
//! time's one executor runs, and what it asks for per block held against
//! the device. Then at each M: the kernel's inputs drawn at random, its
//! weights bound as a graph struct binds them ([`fusion::plan::bind`]: a
//! norm folded, a gated pair interleaved, rows padded) and the CPU
//! reference computed on sampled rows; each candidate called through the
//! executor ([`fusion::plan::run`]: its params, workspace and launch),
//! checked against the reference (a wrong one is rejected, never timed)
//! and timed call by call against cuBLASLt (`measure`); the fastest, the
//! shipped config and cuBLASLt timed once more side by side, and that
//! entry written to the cache at once, so a stopped run keeps every M it
//! finished and a second run skips them.

pub(crate) mod compile;
pub(crate) mod library;
mod measure;

use crate::bench::timing::TimingPlan;
use crate::table::Declared;
use compile::{Built, Job};
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, ValidAsZeroBits};
use fusion::Workspace;
use fusion::testing::HostElement;
use fusion_compiler::build::Nvcc;
use fusion_compiler::codegen::candidates::{self, KernelChoice};
use fusion_compiler::fuse::{self, Composition, FusedKernel, GemmComposition, Plan};
use fusion_compiler::ir::{DType, Extent, Graph};
use fusion_compiler::select::{Arch, KernelConfig, KernelKind, TileConfig, TunedTable};
use fusion_compiler::select::{CacheEntry, CacheKey, MBucket, TunedCache};
use fusion_compiler::tune::{self as space, DeviceLimits, PruneReason, TileResources};
use indexmap::IndexMap;
use library::LoadedUnit;
use measure::{Baseline, Case};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// What a tuning run is asked to do.
#[derive(Clone, Debug)]
pub struct Settings {
    /// Row counts to measure at.
    pub ms: Vec<usize>,
    /// Sizes of the graph's other dynamic dims, by name.
    pub dims: Vec<(String, usize)>,
    /// The arch to tune for; default: the one this device runs best.
    pub arch: Option<Arch>,
    /// Every tensor of the graphs in this dtype; default: as declared.
    pub dtype: Option<DType>,
    /// The tuned cache file the fastest configs are merged into.
    pub cache: PathBuf,
    /// Where the units, libraries and nvcc logs go.
    pub work: PathBuf,
    /// nvcc processes at once.
    pub jobs: usize,
    /// Only the first this many candidates of the space.
    pub limit: Option<usize>,
    /// Untimed and timed calls of each candidate; the fastest and the
    /// shipped config are then timed again with twice the timed calls.
    pub timing: TimingPlan,
    /// Measure an M whose bucket the cache already holds for this GPU.
    pub force: bool,
}

/// The machine a run measures on, as cache entries record it.
struct Machine {
    stream: Arc<CudaStream>,
    arch: Arch,
    limits: DeviceLimits,
    gpu: String,
    driver: String,
    nvcc: Nvcc,
    date: String,
}

/// Tunes each graph in turn; progress on standard error, results on `out`.
pub fn tune(graphs: &[PathBuf], settings: &Settings, out: &mut dyn Write) -> Result<(), String> {
    let started = Instant::now();
    // A file that is not a tuned cache is refused now, not after the first
    // M was measured; a new one is created (and the folder found writable).
    TunedCache::write(&settings.cache, &IndexMap::new())
        .map_err(|e| format!("cannot use the tuned cache {}: {e}", settings.cache.display()))?;
    let machine = open_machine(settings)?;
    say(
        out,
        format!(
            "{} (fusion variant {}), {}, driver {}; cache {}",
            machine.gpu,
            machine.arch,
            machine.nvcc.release(),
            machine.driver,
            settings.cache.display()
        ),
    )?;
    for path in graphs {
        let graph = match settings.dtype {
            Some(dtype) => fusion::testing::load_graph_as(path, dtype),
            None => fusion_compiler::load_toml_graph(path),
        }
        .map_err(|e| format!("{}: {e}", path.display()))?;
        if let Some(refusal) = graph.fp8_refusal() {
            return Err(format!("{}: {refusal}", path.display()));
        }
        let rules = fusion_compiler::select::split_rules(&[machine.arch]).map_err(|e| e.to_string())?;
        let plan = fuse::plan_with(graph, &rules);
        let gemms = gemm_kernels(&plan);
        if gemms.is_empty() {
            say(
                out,
                format!(
                    "graph `{}`: skipped: its plan has no GEMM kernel",
                    plan.graph.name
                ),
            )?;
        }
        for (index, gemm) in gemms {
            tune_kernel(&machine, settings, &plan, index, gemm, out)?;
        }
    }
    say(out, format!("done in {:.0} s", started.elapsed().as_secs_f64()))
}

fn say(out: &mut dyn Write, line: String) -> Result<(), String> {
    writeln!(out, "{line}").map_err(|e| format!("cannot write to standard output: {e}"))
}

fn open_machine(settings: &Settings) -> Result<Machine, String> {
    let ctx = fusion::testing::open_gpu(0)?;
    let gpu_error = |e: cudarc::driver::DriverError| e.to_string();
    let stream = ctx.new_stream().map_err(gpu_error)?;
    let (major, minor) = ctx.compute_capability().map_err(gpu_error)?;
    let arch = match settings.arch {
        Some(arch) if arch.runs_on(major, minor) => arch,
        Some(arch) => {
            return Err(format!(
                "{arch} code does not run on this GPU (compute capability {major}.{minor})"
            ));
        }
        None => Arch::best_for(major, minor, &Arch::ALL)
            .ok_or_else(|| format!("no fusion variant runs on compute capability {major}.{minor}"))?,
    };
    let limits = device_limits(&ctx).map_err(gpu_error)?;
    let nvcc = compile::find_nvcc()?;
    let bus_id = crate::bench::smi::pci_bus_id(&ctx);
    let driver = bus_id
        .as_deref()
        .and_then(crate::bench::smi::driver_version)
        .unwrap_or_else(|| "unknown".into());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    Ok(Machine {
        stream,
        arch,
        limits,
        gpu: ctx.name().unwrap_or_else(|_| "unknown GPU".into()),
        driver,
        nvcc,
        date: crate::bench::report::utc_date(now)
            .split('T')
            .next()
            .unwrap_or_default()
            .to_owned(),
    })
}

fn device_limits(ctx: &CudaContext) -> Result<DeviceLimits, cudarc::driver::DriverError> {
    use CUdevice_attribute::*;
    let get = |attribute| ctx.attribute(attribute).map(|v| v.max(0) as u32);
    Ok(DeviceLimits {
        smem_optin_per_block: get(CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
        max_threads_per_block: get(CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
        registers_per_block: get(CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK)?,
        max_blocks_per_sm: get(CU_DEVICE_ATTRIBUTE_MAX_BLOCKS_PER_MULTIPROCESSOR)?,
    })
}

/// The plan's GEMM kernels, by index: each is tuned alone.
fn gemm_kernels(plan: &Plan) -> Vec<(usize, &GemmComposition)> {
    plan.kernels
        .iter()
        .enumerate()
        .filter_map(|(index, kernel)| match &kernel.composition {
            Composition::Gemm(gemm) => Some((index, gemm)),
            _ => None,
        })
        .collect()
}

/// A graph's dynamic dims: the row dim's name, and every other one's size.
struct BoundDims {
    rows: String,
    others: Vec<(String, usize)>,
}

/// The size of every dynamic dim but the rows, from `given`.
fn bind_dims(graph: &Graph, kernel: &FusedKernel, given: &[(String, usize)]) -> Result<BoundDims, String> {
    let output = graph.tensor(kernel.output);
    let Some(&Extent::Dynamic(rows)) = output.shape.first() else {
        return Err(format!(
            "its output `{}` has a static row count; `fusion tune` varies a dynamic M",
            output.name
        ));
    };
    let row_name = graph.dims[rows.0].name.clone();
    let mut bound = Vec::new();
    let mut missing = Vec::new();
    for dim in graph
        .dims
        .iter()
        .filter(|d| d.size.is_none() && d.name != row_name)
    {
        match given.iter().find(|(name, _)| *name == dim.name) {
            Some(&(_, size)) if size > 0 => bound.push((dim.name.clone(), size)),
            _ => missing.push(format!("--dim {}=SIZE", dim.name)),
        }
    }
    if !missing.is_empty() {
        return Err(format!(
            "its dims other than {row_name} are dynamic: give their sizes ({})",
            missing.join(" ")
        ));
    }
    Ok(BoundDims {
        rows: row_name,
        others: bound,
    })
}

/// A tensor's last extent under `dims`.
fn last_size(
    graph: &Graph,
    tensor: fusion_compiler::ir::TensorId,
    dims: &[(String, usize)],
) -> Option<usize> {
    match *graph.tensor(tensor).shape.last()? {
        Extent::Static(size) => usize::try_from(size).ok(),
        Extent::Dynamic(d) => {
            let name = &graph.dims[d.0].name;
            dims.iter().find(|(n, _)| n == name).map(|&(_, size)| size)
        }
    }
}

/// One candidate: its config, what became of its build, its unit.
struct Candidate {
    /// `None` for the shipped table's config.
    tile: Option<TileConfig>,
    label: String,
    unit: Option<LoadedUnit>,
}

fn tune_kernel(
    machine: &Machine,
    settings: &Settings,
    plan: &Plan,
    index: usize,
    gemm: &GemmComposition,
    out: &mut dyn Write,
) -> Result<(), String> {
    let kernel = &plan.kernels[index];
    // The kernel alone, for its dims, the reference and the table its
    // candidates run through: in a block, what it reads from another
    // kernel is an input here.
    let alone = plan.kernel_plan(index);
    let graph = &alone.graph;
    let skip = |out: &mut dyn Write, reason: String| {
        say(
            out,
            format!("graph `{}`, kernel #{index}: skipped: {reason}", plan.graph.name),
        )
    };
    let BoundDims {
        rows: row_name,
        others: dims,
    } = match bind_dims(graph, kernel, &settings.dims) {
        Ok(bound) => bound,
        Err(reason) => return skip(out, reason),
    };
    let a = kernel.operand(fuse::Role::A).expect("a GEMM reads A");
    let (Some(n), Some(k)) = (last_size(graph, kernel.output, &dims), last_size(graph, a, &dims)) else {
        return skip(out, "its N or K is not known".into());
    };
    let dtype = graph.tensor(kernel.output).dtype;
    let arch = machine.arch;
    if !arch.supports(dtype) {
        return skip(out, format!("{arch} has no {dtype} kernels"));
    }
    let kind = KernelKind::of(gemm, dtype);
    let shipped_table = TunedTable::shipped(arch).map_err(|e| e.to_string())?;
    // What a build with no cache gives this kernel at this N: the table's
    // tiles, its small-M alternative fitted to N where that applies
    // (`fusion_compiler::select::fitted_width`) and its few-M tile, which
    // are then candidates too (below).
    let shipped = fusion_compiler::select::select_tuned(
        &shipped_table,
        &fusion_compiler::select::TunedCache::default(),
        arch,
        &kind,
        u64::try_from(n).ok(),
        u64::try_from(k).ok(),
    )
    .map_err(|e| e.to_string())?
    .config;
    let mut search = space::search_space(arch, &kind, Some(&machine.limits));
    if let Some(limit) = settings.limit {
        search.candidates.truncate(limit);
    }
    // The shipped config's own tiles are candidates too, so that the best
    // single tile is never worse than the tile the shipped config runs.
    for tile in [
        Some(shipped.large),
        shipped.large_alt,
        shipped.small_m,
        shipped.small_m_alt,
        shipped.few_m,
    ]
    .into_iter()
    .flatten()
    {
        if !search.candidates.contains(&tile) {
            search.candidates.push(tile);
        }
    }
    say(
        out,
        format!(
            "graph `{}`, kernel #{index} `{}` at N = {n}, K = {k} ({}); {search}",
            plan.graph.name,
            kind.name,
            dtype,
            search = SpaceLine(&search)
        ),
    )?;

    let mut pruned: BTreeMap<PruneReason, usize> = search.pruned.clone();
    let mut candidates = build_candidates(
        machine,
        settings,
        (plan, index, &alone),
        gemm,
        &kind,
        &search.candidates,
        &mut pruned,
        out,
    )?;
    let survivors = candidates
        .iter()
        .filter(|c| c.unit.is_some() && c.tile.is_some())
        .count();
    say(
        out,
        format!("  {survivors} candidates loaded; pruned: {}", reasons(&pruned)),
    )?;
    if candidates.first().is_none_or(|c| c.unit.is_none()) {
        return Err(format!(
            "the shipped config of `{}` did not build; see the logs under {}",
            kind.name,
            settings.work.join("log").display()
        ));
    }

    let baseline = Baseline::of(gemm);
    let cache = TunedCache::read(&settings.cache);
    for warning in &cache.warnings {
        eprintln!("warning: {warning}");
    }
    let mut head = machine
        .stream
        .alloc_zeros::<u8>(crate::bench::HEAD_START_BYTES)
        .map_err(|e| e.to_string())?;
    let kernel_at = KernelAt {
        machine,
        settings,
        alone: &alone,
        gemm,
        baseline,
    };
    for m in one_per_bucket(&settings.ms, out)? {
        let key = CacheKey {
            composition: kind.name.clone(),
            dtype,
            layout: gemm.b_layout,
            n: n as u64,
            k: k as u64,
            arch,
            bucket: MBucket::of(u32::try_from(m).unwrap_or(u32::MAX)),
        };
        let decode_max_m = shipped.decode_for(gemm.b_layout);
        if let Some(reason) = not_measured(m, &key, &cache, &machine.gpu, settings.force, decode_max_m) {
            say(out, format!("  M = {m}: {reason}"))?;
            continue;
        }
        let mut all_dims: Vec<(&str, usize)> =
            dims.iter().map(|(name, size)| (name.as_str(), *size)).collect();
        all_dims.push((row_name.as_str(), m));
        let seed = (m as u64) << 32 ^ (n as u64) << 16 ^ k as u64;
        let shape = (m, n, k);
        let at = At {
            dims: &all_dims,
            shape,
            seed,
        };
        let result = match dtype {
            DType::BF16 => measure_m::<half::bf16>(&kernel_at, at, &mut candidates, &mut head),
            DType::F16 => measure_m::<half::f16>(&kernel_at, at, &mut candidates, &mut head),
            DType::F32 | DType::F8E4M3 => unreachable!("no arch supports {dtype} kernels; checked above"),
        }?;
        let MResult {
            best,
            timed,
            rejected,
            best_us,
            shipped_us,
            cublaslt_us,
        } = result;
        say(
            out,
            format!(
                "  M = {m} ({}): {timed} timed, {} rejected; best {} {best_us:.1} µs, shipped {shipped_us:.1} µs ({:.3}x), {} {cublaslt_us:.1} µs ({:.3}x)",
                key.bucket,
                rejected.len(),
                best.summary(),
                shipped_us / best_us,
                baseline.describe(),
                cublaslt_us / best_us,
            ),
        )?;
        if shipped_us < best_us {
            say(
                out,
                format!(
                    "    the shipped config was {:.1}% faster here (it picks between tiles by waves at run time, which one tuned tile cannot); the entry keeps the best single tile",
                    100.0 * (best_us / shipped_us - 1.0)
                ),
            )?;
        }
        for (label, reason) in &rejected {
            say(out, format!("    rejected {label}: {reason}"))?;
        }
        let entry = CacheEntry {
            tile: best,
            time_us: best_us,
            default_time_us: shipped_us,
            cublaslt_time_us: cublaslt_us,
            gpu: machine.gpu.clone(),
            driver: machine.driver.clone(),
            nvcc: machine.nvcc.release().to_owned(),
            date: machine.date.clone(),
        };
        TunedCache::write(&settings.cache, &IndexMap::from([(key, entry)]))
            .map_err(|e| format!("cannot write the tuned cache {}: {e}", settings.cache.display()))?;
    }
    Ok(())
}

/// `ms` with the later of two Ms in one bucket left out (each bucket has
/// one entry, so the second would replace the first), saying so.
fn one_per_bucket(ms: &[usize], out: &mut dyn Write) -> Result<Vec<usize>, String> {
    let mut kept: Vec<usize> = Vec::new();
    for &m in ms {
        let bucket = MBucket::of(u32::try_from(m).unwrap_or(u32::MAX));
        match kept
            .iter()
            .find(|&&k| MBucket::of(u32::try_from(k).unwrap_or(u32::MAX)) == bucket)
        {
            Some(first) => say(
                out,
                format!("  M = {m}: left out, its bucket {bucket} is measured at M = {first}"),
            )?,
            None => kept.push(m),
        }
    }
    Ok(kept)
}

/// Why a run does not measure M (its cache key `key`), if it does not: the
/// cache holds the key for this GPU (a run that stopped resumes after what
/// it finished) unless `force`, or the decode kernel, which runs ahead of
/// every tile up to `decode_max_m` rows, serves it.
fn not_measured(
    m: usize,
    key: &CacheKey,
    cache: &TunedCache,
    gpu: &str,
    force: bool,
    decode_max_m: Option<u32>,
) -> Option<String> {
    if let Some(max) = decode_max_m.filter(|&max| m <= max as usize) {
        return Some(format!(
            "the decode kernel serves m <= {max} ahead of every tile; not tuned"
        ));
    }
    if !force && cache.entries.get(key).is_some_and(|e| e.gpu == gpu) {
        return Some(format!(
            "{key} is in the cache already (--force measures it again)"
        ));
    }
    None
}

/// A search space's summary line without the per-reason detail printed
/// again later.
struct SpaceLine<'a>(&'a space::SearchSpace);

impl std::fmt::Display for SpaceLine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} configs in {}'s space, {} to compile",
            self.0.total(),
            self.0.arch,
            self.0.candidates.len()
        )
    }
}

fn reasons(pruned: &BTreeMap<PruneReason, usize>) -> String {
    if pruned.is_empty() {
        return "none".into();
    }
    pruned
        .iter()
        .map(|(reason, count)| format!("{reason} {count}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Renders, builds and loads the shipped config (first) and every tile of
/// kernel `index` of `plan` (`alone`: the kernel as a plan of its own,
/// which each candidate's table is made from); counts what the build and
/// the device's limits prune.
#[allow(clippy::too_many_arguments, reason = "one call site, each a different fact")]
fn build_candidates(
    machine: &Machine,
    settings: &Settings,
    (plan, index, alone): (&Plan, usize, &Plan),
    gemm: &GemmComposition,
    kind: &KernelKind,
    tiles: &[TileConfig],
    pruned: &mut BTreeMap<PruneReason, usize>,
    out: &mut dyn Write,
) -> Result<Vec<Candidate>, String> {
    let arch = machine.arch;
    // Library names unique per kernel of every graph of a run.
    let prefix = format!("{}_k{index}", plan.graph.name);
    let choice = KernelChoice {
        plan,
        kernel_index: index,
        composition: gemm,
        dtype: kind.dtype,
        arch,
    };
    let configs: Vec<Option<TileConfig>> = std::iter::once(None)
        .chain(tiles.iter().copied().map(Some))
        .collect();
    let mut jobs = Vec::new();
    let mut lib_names = Vec::new();
    for (candidate, tile) in configs.iter().enumerate() {
        let lib_name = match tile {
            None => format!("{prefix}_shipped"),
            Some(_) => format!("{prefix}_c{candidate}"),
        };
        let config = tile.map(|large| KernelConfig {
            large,
            small_m: None,
            small_m_max: None,
            small_m_alt: None,
            large_alt: None,
            decode_max_m: None,
            by_m: None,
            few_m: None,
        });
        let table = format!("fusion tune, candidate {candidate}");
        let units =
            candidates::render_kernel(&lib_name, &table, choice, config).map_err(|e| e.to_string())?;
        jobs.push(Job {
            symbol: units.unit.symbol.clone(),
            sources: vec![(units.unit.symbol.clone(), units.unit.source), units.error_unit],
            arch,
        });
        lib_names.push(lib_name);
    }
    let started = Instant::now();
    let built = compile::build_all_with_progress(&machine.nvcc, &settings.work, &jobs, settings.jobs)?;
    say(
        out,
        format!(
            "  built {} libraries with {} nvcc processes in {:.0} s (units, libraries, logs: {})",
            jobs.len(),
            settings.jobs,
            started.elapsed().as_secs_f64(),
            settings.work.display()
        ),
    )?;
    let declared = Declared::of(&alone.graph);
    let mut candidates = Vec::new();
    // Why configs did not build, each reason once: (reason, how many, one log).
    let mut failures: Vec<(String, usize, PathBuf)> = Vec::new();
    for (((tile, job), built), lib_name) in configs.iter().zip(&jobs).zip(built).zip(&lib_names) {
        let label = tile.map_or_else(|| "the shipped config".to_owned(), |t| t.summary());
        let mut candidate = Candidate {
            tile: *tile,
            label,
            unit: None,
        };
        match built {
            Built::Failed { log, message } => {
                if tile.is_none() {
                    say(
                        out,
                        format!(
                            "  the shipped config did not build: {message} ({})",
                            log.display()
                        ),
                    )?;
                } else {
                    *pruned.entry(PruneReason::Compile).or_default() += 1;
                }
                let reason = compile_reason(&message);
                match failures.iter_mut().find(|(r, _, _)| *r == reason) {
                    Some((_, count, _)) => *count += 1,
                    None => failures.push((reason, 1, log)),
                }
            }
            Built::Library { path, registers } => {
                // SAFETY: built just now (or earlier, from the same key) by
                // `compile` from units fusion rendered.
                let loaded = unsafe {
                    LoadedUnit::load(
                        &path,
                        (&job.symbol, lib_name),
                        alone,
                        declared,
                        (kind.dtype, arch),
                    )
                };
                let unit = match loaded {
                    Ok(unit) => unit,
                    Err(message) => {
                        say(out, format!("  {} does not load: {message}", candidate.label))?;
                        if tile.is_some() {
                            *pruned.entry(PruneReason::Compile).or_default() += 1;
                        }
                        candidates.push(candidate);
                        continue;
                    }
                };
                let fits = unit.resources().iter().try_for_each(|ask| {
                    space::check_resources(
                        &TileResources {
                            smem_bytes: ask.smem_bytes,
                            threads: ask.threads,
                            registers_per_thread: registers,
                        },
                        &machine.limits,
                    )
                });
                match fits {
                    Err(reason) if tile.is_some() => *pruned.entry(reason).or_default() += 1,
                    _ => candidate.unit = Some(unit),
                }
            }
        }
        candidates.push(candidate);
    }
    for (reason, count, log) in failures {
        say(
            out,
            format!("  {count} did not build: {reason} (e.g. {})", log.display()),
        )?;
    }
    Ok(candidates)
}

/// What nvcc's first error says: the static assertion's message, where it
/// is one (the rule of the mainloop a config breaks), else the whole line.
fn compile_reason(message: &str) -> String {
    match message.split_once("static assertion failed with ") {
        Some((_, assertion)) => assertion.trim().trim_matches('"').to_owned(),
        None => message.to_owned(),
    }
}

/// Where one M is measured: every dynamic dim's size, (M, N, K) and the
/// inputs' seed.
struct At<'a> {
    dims: &'a [(&'a str, usize)],
    shape: (usize, usize, usize),
    seed: u64,
}

/// What one M measured.
struct MResult {
    best: TileConfig,
    timed: usize,
    /// Candidates whose output was wrong (or whose launch failed): label
    /// and reason.
    rejected: Vec<(String, String)>,
    best_us: f64,
    shipped_us: f64,
    cublaslt_us: f64,
}

/// What measuring one kernel reads at every M.
struct KernelAt<'a> {
    machine: &'a Machine,
    settings: &'a Settings,
    /// The kernel alone ([`Plan::kernel_plan`]).
    alone: &'a Plan,
    gemm: &'a GemmComposition,
    baseline: Baseline,
}

/// Checks and times every loaded candidate at one M, then the fastest, the
/// shipped config and cuBLASLt side by side.
fn measure_m<T: HostElement + ValidAsZeroBits>(
    kernel_at: &KernelAt<'_>,
    At { dims, shape, seed }: At<'_>,
    candidates: &mut [Candidate],
    head: &mut CudaSlice<u8>,
) -> Result<MResult, String> {
    let &KernelAt {
        machine,
        settings,
        alone,
        gemm,
        baseline,
    } = kernel_at;
    // Timed as a struct runs it: the weights bound once (the shipped
    // config's table binds them for every candidate).
    let shipped = candidates[0].unit.as_ref().expect("the shipped config is loaded");
    let mut case = Case::<T>::new(&machine.stream, (alone, gemm), shipped, dims, shape, seed)?;
    let mut lt = case.plan_baseline(gemm, baseline).map_err(|e| e.to_string())?;
    let loaded: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i].unit.is_some())
        .collect();
    let bar = indicatif::ProgressBar::new(loaded.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("  M = {prefix} {bar:30} {pos}/{len} {msg}")
            .expect("a valid template"),
    );
    bar.set_prefix(shape.0.to_string());
    let mut rejected = Vec::new();
    // (candidate index, its time over cuBLASLt's in the same timing)
    let mut timed: Vec<(usize, f64)> = Vec::new();
    let mut workspaces: Vec<Option<Workspace>> = (0..candidates.len()).map(|_| None).collect();
    for &i in &loaded {
        let unit = candidates[i].unit.as_ref().expect("loaded");
        let outcome = case.workspace_for(unit).and_then(|mut workspace| {
            case.check(unit, &mut workspace)?;
            let timings = case.time(
                &mut [(unit, &mut workspace)],
                &mut lt,
                baseline,
                settings.timing,
                head,
            )?;
            Ok((workspace, timings[0].median_us / timings[1].median_us))
        });
        match outcome {
            Ok((workspace, share)) => {
                workspaces[i] = Some(workspace);
                timed.push((i, share));
            }
            Err(reason) => {
                // A kernel that faulted leaves the context unusable: every
                // later candidate would be "rejected" for it.
                if let Err(e) = machine.stream.synchronize() {
                    return Err(format!(
                        "{} at M = {} left the GPU unusable ({e}; its check said: {reason}); the run stops here, the cache keeps what finished",
                        candidates[i].label, shape.0
                    ));
                }
                if i == 0 {
                    return Err(format!("the shipped config fails at M = {}: {reason}", shape.0));
                }
                rejected.push((candidates[i].label.clone(), reason));
            }
        }
        bar.inc(1);
        if let Some(&(best, share)) = timed
            .iter()
            .filter(|(i, _)| *i != 0)
            .min_by(|a, b| a.1.total_cmp(&b.1))
        {
            bar.set_message(format!(
                "{} rejected; best {:.3}x cuBLASLt: {}",
                rejected.len(),
                1.0 / share,
                candidates[best].label
            ));
        }
    }
    bar.finish_and_clear();
    let Some(&(best, _)) = timed
        .iter()
        .filter(|(i, _)| *i != 0)
        .min_by(|a, b| a.1.total_cmp(&b.1))
    else {
        return Err(format!("no candidate passed its check at M = {}", shape.0));
    };
    let mut best_workspace = workspaces[best].take().expect("timed");
    let mut shipped_workspace = workspaces[0].take().expect("timed");
    let mut units = [
        (
            candidates[best].unit.as_ref().expect("timed"),
            &mut best_workspace,
        ),
        (
            candidates[0].unit.as_ref().expect("timed"),
            &mut shipped_workspace,
        ),
    ];
    let final_plan = TimingPlan {
        warmup: settings.timing.warmup,
        runs: settings.timing.runs * 2,
    };
    let timings = case.time(&mut units, &mut lt, baseline, final_plan, head)?;
    Ok(MResult {
        best: candidates[best].tile.expect("a tile candidate"),
        timed: timed.len() - 1,
        rejected,
        best_us: timings[0].median_us,
        shipped_us: timings[1].median_us,
        cublaslt_us: timings[2].median_us,
    })
}

/// `fusion tune --report`: per entry of the cache at `path`, the tuned
/// tile and its time against the shipped config's and cuBLASLt's.
pub fn report(path: &Path, out: &mut dyn Write) -> Result<(), String> {
    if !path.is_file() {
        return Err(format!("no tuned cache at {}", path.display()));
    }
    let cache = TunedCache::read(path);
    if cache.entries.is_empty() && !cache.warnings.is_empty() {
        return Err(cache.warnings.join("; "));
    }
    for warning in &cache.warnings {
        say(out, format!("warning: {warning}"))?;
    }
    say(
        out,
        format!(
            "{:<52} {:>10} {:>10} {:>10} {:>8} {:>8}  tile",
            "kernel and M bucket", "tuned µs", "shipped µs", "cuBLASLt", "/shipped", "/cuBLASLt"
        ),
    )?;
    for (key, entry) in &cache.entries {
        say(
            out,
            format!(
                "{:<52} {:>10.1} {:>10.1} {:>10.1} {:>8.3} {:>8.3}  {}",
                key.to_string(),
                entry.time_us,
                entry.default_time_us,
                entry.cublaslt_time_us,
                entry.default_time_us / entry.time_us,
                entry.cublaslt_time_us / entry.time_us,
                entry.tile.summary(),
            ),
        )?;
    }
    say(
        out,
        format!(
            "{} entries; /shipped and /cuBLASLt: their time over the tuned one (above 1: tuned is faster)",
            cache.entries.len()
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan_of(name: &str) -> Plan {
        let path = fusion::testing::graphs_dir().join(format!("{name}.toml"));
        fuse::plan(fusion_compiler::load_toml_graph(&path).unwrap())
    }

    #[test]
    fn every_gemm_kernel_of_a_plan_is_tuned() {
        let indices =
            |name: &str| -> Vec<usize> { gemm_kernels(&plan_of(name)).iter().map(|&(i, _)| i).collect() };
        assert_eq!(indices("gemm_bias_gelu"), [0]);
        assert_eq!(indices("swiglu_ffn"), [0, 1]);
        assert_eq!(indices("ffn_sublayer").len(), 2);
        assert_eq!(indices("layernorm"), Vec::<usize>::new());
    }

    /// A candidate is checked and timed through the executor with the
    /// table of its kernel alone (`LoadedUnit::load`): for every GEMM
    /// kernel of the shipped graphs, that table binds the weights as the
    /// generated struct's table binds them, asks the unit for the same
    /// folded and fold launchers, and fills the kernel's params to the
    /// same bytes, per call and with bound weights.
    #[test]
    fn a_candidates_table_fills_the_params_the_generated_structs_table_fills() {
        use crate::table::{plan_table, stand_ins};
        use fusion::abi::{FUSION_GEMM_NO_STREAM_K, FUSION_GEMM_STATIC_TILES};
        use fusion::plan::{KernelOp, Launchers};
        let mut compared = Vec::new();
        for (generated, graph, archs) in stand_ins::generated() {
            let Some(&arch) = archs.last() else {
                // A build without nvcc: no table to compare against.
                continue;
            };
            let name = generated.graph.name;
            // Planned as the generated struct's build planned it.
            let rules = fusion_compiler::select::split_rules(archs).unwrap();
            let plan = fuse::plan_with(graph, &rules);
            for (index, _) in gemm_kernels(&plan) {
                let alone = plan.kernel_plan(index);
                let unit = stand_ins::launchers(&alone.kernels[0], &alone.graph);
                let table = plan_table(&alone, Declared::of(&alone.graph), DType::F16, arch, vec![unit]);
                let (ours, theirs) = (&table.kernels[0], &generated.kernels[index]);
                assert_eq!(ours.output, theirs.output, "{name} #{index}");
                let (KernelOp::Gemm(a), KernelOp::Gemm(b)) = (&ours.op, &theirs.op) else {
                    panic!("{name} #{index}: a GEMM in both tables")
                };
                assert_eq!(
                    (a.bind, a.b_layout, a.eps),
                    (b.bind, b.b_layout, b.eps),
                    "{name} #{index}"
                );
                let (
                    Launchers::Gemm {
                        folded: a_folded,
                        fold: a_fold,
                        ..
                    },
                    Launchers::Gemm {
                        folded: b_folded,
                        fold: b_fold,
                        ..
                    },
                ) = (ours.launchers, theirs.launchers)
                else {
                    panic!("{name} #{index}: GEMM launchers in both tables")
                };
                assert_eq!(
                    (a_folded.is_empty(), a_fold.is_empty()),
                    (b_folded.is_empty(), b_fold.is_empty()),
                    "{name} #{index}"
                );
                for flags in [0, FUSION_GEMM_NO_STREAM_K | FUSION_GEMM_STATIC_TILES] {
                    for prepared in [false, true] {
                        let [(_, ours)] = &stand_ins::filled(table, flags, prepared)[..] else {
                            panic!("{name} #{index}: one kernel")
                        };
                        let theirs = &stand_ins::filled(generated, flags, prepared)[index].1;
                        assert_eq!(
                            ours, theirs,
                            "{name} #{index}: flags {flags}, prepared {prepared}"
                        );
                    }
                }
                compared.push(format!("{name}#{index}"));
            }
        }
        assert!(
            compared.len() == 9 || fusion::device::compiled().is_empty(),
            "{compared:?}"
        );
    }

    #[test]
    fn each_bucket_is_measured_once() {
        let mut said = Vec::new();
        assert_eq!(
            one_per_bucket(&[1, 16, 100, 128, 8192, 9000], &mut said).unwrap(),
            [1, 100, 8192]
        );
        let said = String::from_utf8(said).unwrap();
        assert!(
            said.contains("M = 16: left out, its bucket m<=16 is measured at M = 1"),
            "{said}"
        );
        assert!(
            said.contains("M = 9000: left out, its bucket m>4096 is measured at M = 8192"),
            "{said}"
        );
    }

    #[test]
    fn a_failed_compile_is_counted_under_the_rule_it_broke() {
        let message = "include/fusion/sm90/tile_config.cuh(60): error: static assertion failed with \"a consumer thread holds at most 128 accumulators\"";
        assert_eq!(
            compile_reason(message),
            "a consumer thread holds at most 128 accumulators"
        );
        assert_eq!(
            compile_reason("ld: cannot find -lcudart"),
            "ld: cannot find -lcudart"
        );
    }

    #[test]
    fn every_dynamic_dim_but_the_rows_needs_a_size() {
        let plan = plan_of("gemm_bias_gelu");
        let kernel = &plan.kernels[0];
        let graph = plan.kernel_graph(0);
        let missing = bind_dims(&graph, kernel, &[("N".into(), 3000)]).err().unwrap();
        assert_eq!(
            missing,
            "its dims other than M are dynamic: give their sizes (--dim K=SIZE)"
        );
        let given = [("K".into(), 1000), ("N".into(), 3000), ("X".into(), 1)];
        let bound = bind_dims(&graph, kernel, &given).ok().unwrap();
        assert_eq!(bound.rows, "M");
        let mut others = bound.others.clone();
        others.sort();
        assert_eq!(others, [("K".to_owned(), 1000), ("N".to_owned(), 3000)]);
        let a = kernel.operand(fuse::Role::A).unwrap();
        assert_eq!(last_size(&graph, a, &bound.others), Some(1000));
        assert_eq!(last_size(&graph, kernel.output, &bound.others), Some(3000));
    }

    #[test]
    fn a_run_resumes_after_the_buckets_the_cache_holds_for_this_gpu() {
        let key = |m: u32| CacheKey {
            composition: "gemm_bias_gelu".into(),
            dtype: fusion_compiler::ir::DType::F16,
            layout: fusion_compiler::ir::WeightLayout::NK,
            n: 3000,
            k: 1000,
            arch: Arch::Sm90,
            bucket: MBucket::of(m),
        };
        let dir = std::env::temp_dir().join(format!("fusion-tune-resume-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("tuned.json");
        let entry = CacheEntry {
            tile: TileConfig::sm90(128, 128, 6, None),
            time_us: 40.0,
            default_time_us: 48.0,
            cublaslt_time_us: 42.0,
            gpu: "NVIDIA H200".into(),
            driver: "580".into(),
            nvcc: "13.0".into(),
            date: "2026-12-02".into(),
        };
        // What a run that stopped after M = 128 had written.
        TunedCache::write(&path, &IndexMap::from([(key(128), entry)])).unwrap();
        let cache = TunedCache::read(&path);
        assert!(cache.warnings.is_empty(), "{:?}", cache.warnings);
        let skipped = not_measured(128, &key(128), &cache, "NVIDIA H200", false, None).unwrap();
        assert!(skipped.contains("m<=128 is in the cache already"), "{skipped}");
        // The next bucket, another GPU, or --force: measured.
        assert_eq!(
            not_measured(1024, &key(1024), &cache, "NVIDIA H200", false, None),
            None
        );
        assert_eq!(
            not_measured(128, &key(128), &cache, "NVIDIA H100", false, None),
            None
        );
        assert_eq!(
            not_measured(128, &key(128), &cache, "NVIDIA H200", true, None),
            None
        );
        // Rows the decode kernel serves are not tuned.
        let decode = not_measured(16, &key(16), &cache, "NVIDIA H200", true, Some(16)).unwrap();
        assert!(decode.starts_with("the decode kernel serves m <= 16"), "{decode}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
