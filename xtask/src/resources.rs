//! What the kernels of one graph cost in hardware resources, for a machine
//! without a GPU: each CUDA unit the release build rendered for the graph is
//! compiled again with `ptxas -v`, and its report (registers, static shared
//! memory, stack frame, spills) is printed as one table row per kernel.

use crate::error::{Error, Result};
use crate::process::{display_command, format_duration, last_line};
use crate::toolchain::Toolchain;
use crate::workspace::Workspace;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime};

/// A GPU architecture a unit is built for, read from its file name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Arch {
    Sm75,
    Sm80,
    Sm90a,
}

impl Arch {
    /// The suffix the build gives a unit's name (`..._sm90.cu`).
    fn from_unit_name(stem: &str) -> Option<Arch> {
        match stem.rsplit(['_', ' ']).next()? {
            "sm75" => Some(Arch::Sm75),
            "sm80" => Some(Arch::Sm80),
            "sm90" | "sm90a" => Some(Arch::Sm90a),
            _ => None,
        }
    }

    /// nvcc's flag for real code of this architecture only: ptxas runs once.
    fn gencode(self) -> &'static str {
        match self {
            Arch::Sm75 => "-gencode=arch=compute_75,code=sm_75",
            Arch::Sm80 => "-gencode=arch=compute_80,code=sm_80",
            Arch::Sm90a => "-gencode=arch=compute_90a,code=sm_90a",
        }
    }
}

/// One rendered CUDA unit: `OUT_DIR/kernels/<name>.cu`.
#[derive(Debug, PartialEq)]
pub struct Unit {
    pub name: String,
    pub path: PathBuf,
    pub arch: Arch,
}

/// The graphs a unit serves, from its `// Used by: swiglu_ffn#0, gpt2_mlp#1`
/// line (the number after `#` is the kernel's index in the graph's plan).
fn graphs_served(source: &str) -> Vec<&str> {
    source
        .lines()
        .find_map(|line| line.trim_start().strip_prefix("// Used by:"))
        .map(|list| {
            list.split(',')
                .map(|kernel| kernel.trim().split('#').next().unwrap_or(""))
                .filter(|graph| !graph.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// For a unit built for several architectures (its name has no arch suffix),
/// the newest of its header's "built for sm80, sm90." list.
fn newest_arch_built_for(source: &str) -> Option<Arch> {
    let line = source
        .lines()
        .find(|line| line.starts_with("//") && line.contains("built for "))?;
    let list = line.split("built for ").nth(1)?.trim_end_matches('.');
    list.split(',')
        .filter_map(|arch| Arch::from_unit_name(arch.trim()))
        .max_by_key(|arch| *arch as u8)
}

/// The units among `(path, source)` that serve `graph`, sorted by name; the
/// architecture is the name's suffix, else the newest the unit is built for.
pub fn units_serving(candidates: Vec<(PathBuf, String)>, graph: &str) -> Vec<Unit> {
    let mut units: Vec<Unit> = candidates
        .into_iter()
        .filter(|(_, source)| graphs_served(source).contains(&graph))
        .filter_map(|(path, source)| {
            let name = path.file_stem()?.to_str()?.to_string();
            let arch = Arch::from_unit_name(&name).or_else(|| newest_arch_built_for(&source))?;
            Some(Unit { name, path, arch })
        })
        .collect();
    units.sort_by(|a, b| a.name.cmp(&b.name));
    units
}

/// What ptxas says about one kernel entry function.
#[derive(Debug, Default, PartialEq)]
pub struct EntryUsage {
    /// The mangled name.
    pub name: String,
    pub registers: u64,
    pub static_smem: u64,
    pub stack_frame: u64,
    pub spill_stores: u64,
    pub spill_loads: u64,
}

/// The number before `unit` in one comma-separated item such as
/// "16 bytes smem" or "Used 168 registers".
fn quantity(report_line: &str, unit: &str) -> Option<u64> {
    report_line.split(',').find_map(|item| {
        let words: Vec<&str> = item.split_whitespace().collect();
        let tail: Vec<&str> = unit.split_whitespace().collect();
        let at = words.len().checked_sub(tail.len() + 1)?;
        (words[at + 1..] == tail[..])
            .then(|| words[at].parse().ok())
            .flatten()
    })
}

/// Parses `ptxas -v` output: one entry per "Compiling entry function"; its
/// registers and static shared memory from the "Used N registers" line that
/// follows, its stack and spills from the "Function properties for" block
/// naming it (device functions have such blocks too; they are not entries).
pub fn parse_ptxas(report: &str) -> Vec<EntryUsage> {
    let mut entries: Vec<EntryUsage> = Vec::new();
    let mut properties_of: Option<String> = None;
    for line in report.lines() {
        let text = line.split_once(':').map_or(line, |(prefix, rest)| {
            if prefix.trim_start().starts_with("ptxas") {
                rest
            } else {
                line
            }
        });
        let text = text.trim();
        if let Some(rest) = text.strip_prefix("Compiling entry function '") {
            let name = rest.split('\'').next().unwrap_or(rest).to_string();
            entries.push(EntryUsage {
                name,
                ..EntryUsage::default()
            });
            properties_of = None;
        } else if let Some(name) = text.strip_prefix("Function properties for ") {
            properties_of = Some(name.trim().to_string());
        } else if text.contains("bytes stack frame") {
            let target = properties_of.take();
            if let Some(entry) = entries
                .iter_mut()
                .rev()
                .find(|e| Some(&e.name) == target.as_ref())
            {
                entry.stack_frame = quantity(text, "bytes stack frame").unwrap_or(0);
                entry.spill_stores = quantity(text, "bytes spill stores").unwrap_or(0);
                entry.spill_loads = quantity(text, "bytes spill loads").unwrap_or(0);
            }
        } else if text.starts_with("Used ")
            && text.contains("registers")
            && let Some(entry) = entries.last_mut()
        {
            entry.registers = quantity(text, "registers").unwrap_or(0);
            entry.static_smem = quantity(text, "bytes smem").unwrap_or(0);
        }
    }
    entries
}

/// The newest `target/release/build/fusion-*/out` holding rendered units.
fn newest_release_out_dir(workspace: &Workspace) -> Result<PathBuf> {
    let build_dir = workspace.root.join("target").join("release").join("build");
    let newest = std::fs::read_dir(&build_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("fusion-"))
        .map(|entry| entry.path().join("out"))
        .filter_map(|out| {
            let kernels = out.join("kernels");
            let modified = kernels.metadata().and_then(|m| m.modified()).ok()?;
            Some((modified, out))
        })
        .max_by_key(|(modified, _): &(SystemTime, PathBuf)| *modified);
    newest.map(|(_, out)| out).ok_or_else(|| {
        Error::new(format!(
            "no rendered kernels under {}/fusion-*/out/kernels: build first with `cargo build --release -p fusion`",
            workspace.display(&build_dir)
        ))
    })
}

/// Every `*.cu` directly in `dir`, with its text.
fn read_units(dir: &Path) -> Result<Vec<(PathBuf, String)>> {
    let entries =
        std::fs::read_dir(dir).map_err(|e| Error::new(format!("could not list {}: {e}", dir.display())))?;
    let mut units = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        if path.extension().is_some_and(|ext| ext == "cu") {
            let source = std::fs::read_to_string(&path)
                .map_err(|e| Error::new(format!("could not read {}: {e}", path.display())))?;
            units.push((path, source));
        }
    }
    Ok(units)
}

/// nvcc compiling `unit` to nothing, with ptxas reporting; the flags that
/// change code generation are the build's (`fusion_core::build`).
fn ptxas_command(toolchain: &Toolchain, out_dir: &Path, unit: &Unit) -> Command {
    let mut command = Command::new(&toolchain.nvcc);
    toolchain.apply_to(&mut command);
    command
        .args(["-Xptxas", "-v", "-c", "-o", "/dev/null", unit.arch.gencode()])
        .args(["-std=c++17", "--expt-relaxed-constexpr", "-O3", "-I"])
        .arg(out_dir.join("include"))
        .arg("-I")
        .arg(out_dir)
        .arg(&unit.path);
    command
}

/// Compiles one unit and parses what ptxas said.
fn report_unit(toolchain: &Toolchain, out_dir: &Path, unit: &Unit) -> Result<Vec<EntryUsage>> {
    let mut command = ptxas_command(toolchain, out_dir, unit);
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| Error::new(format!("could not start `{}`: {e}", display_command(&command))))?;
    if !output.status.success() {
        return Err(Error::new(format!(
            "`{}` failed ({}): {}",
            display_command(&command),
            output.status,
            last_line(&output.stderr)
        )));
    }
    // ptxas writes its report to stderr; read both in case a version moves it.
    let mut report = String::from_utf8_lossy(&output.stderr).into_owned();
    report.push_str(&String::from_utf8_lossy(&output.stdout));
    let entries = parse_ptxas(&report);
    if entries.is_empty() {
        return Err(Error::new(format!(
            "ptxas reported no kernel entry function for {}",
            unit.name
        )));
    }
    Ok(entries)
}

/// Demangled names, in order, through `cu++filt` next to nvcc or `c++filt`
/// on `PATH`; the mangled names themselves when neither runs.
fn demangle(toolchain: &Toolchain, names: &[String]) -> Vec<String> {
    let beside_nvcc = toolchain.nvcc.with_file_name("cu++filt");
    let tools = [beside_nvcc, PathBuf::from("c++filt")];
    for tool in tools {
        let output = Command::new(&tool)
            .args(names)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output();
        if let Ok(output) = output
            && output.status.success()
        {
            let text = String::from_utf8_lossy(&output.stdout);
            let lines: Vec<String> = text.lines().map(str::to_string).collect();
            if lines.len() == names.len() {
                return lines;
            }
        }
    }
    names.to_vec()
}

/// A kernel's short label: its function name without namespaces, template
/// arguments or parameters, followed by the tile it uses when the name says.
fn short_name(demangled: &str) -> String {
    let without_return = demangled.strip_prefix("void ").unwrap_or(demangled);
    let head_end = without_return.find(['<', '(']).unwrap_or(without_return.len());
    let head = &without_return[..head_end];
    let function = head.rsplit("::").next().unwrap_or(head);
    match tile_of(without_return) {
        Some(tile) => format!("{function} {tile}"),
        None => function.to_string(),
    }
}

/// The block tile (M x N x K) of a kernel whose template arguments include a
/// tile type: "TileConfig<128, 256, 64, 64, 64, 3, …>" gives "128x256x64".
/// The sm90 mainloop's "sm90::TileConfig<128, 256, 4, …>" names M, N and
/// the stages; its K step is always 64.
fn tile_of(demangled: &str) -> Option<String> {
    const SM90_TILE: &str = "sm90::TileConfig<";
    let (start, given, fixed_k) = match demangled.find(SM90_TILE) {
        Some(at) => (at + SM90_TILE.len(), 2, Some("64")),
        None => {
            let start = ["TileConfig<", "Tile<"]
                .iter()
                .find_map(|opening| Some(demangled.find(opening)? + opening.len()))?;
            (start, 3, None)
        }
    };
    let mut dims: Vec<&str> = demangled[start..]
        .split([',', '>'])
        .map(str::trim)
        .take(given)
        .collect();
    let numeric = dims.len() == given
        && dims
            .iter()
            .all(|d| !d.is_empty() && d.chars().all(|c| c.is_ascii_digit()));
    dims.extend(fixed_k);
    numeric.then(|| dims.join("x"))
}

/// Compiles every unit of `graph` with ptxas reporting (several at once)
/// and prints one row per kernel entry function.
pub fn report(workspace: &Workspace, toolchain: &Toolchain, graph: &str) -> Result<()> {
    let out_dir = newest_release_out_dir(workspace)?;
    let kernels_dir = out_dir.join("kernels");
    let units = units_serving(read_units(&kernels_dir)?, graph);
    if units.is_empty() {
        return Err(Error::new(format!(
            "no unit in {} says `Used by: {graph}#…`",
            workspace.display(&kernels_dir)
        )));
    }
    println!(
        "ptxas -v on the {} units of {graph} in {}",
        units.len(),
        workspace.display(&kernels_dir)
    );
    let workers = std::thread::available_parallelism()
        .map_or(1, usize::from)
        .min(units.len());
    let next = AtomicUsize::new(0);
    let done = AtomicUsize::new(0);
    let results: Vec<Mutex<Option<Result<Vec<EntryUsage>>>>> =
        units.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(unit) = units.get(index) else { break };
                    let started = Instant::now();
                    let result = report_unit(toolchain, &out_dir, unit);
                    let finished = done.fetch_add(1, Ordering::Relaxed) + 1;
                    println!(
                        "  [{finished}/{}] {} ({})",
                        units.len(),
                        unit.name,
                        format_duration(started.elapsed())
                    );
                    *results[index].lock().unwrap_or_else(|e| e.into_inner()) = Some(result);
                }
            });
        }
    });

    let mut rows: Vec<(&Unit, EntryUsage)> = Vec::new();
    for (unit, slot) in units.iter().zip(results) {
        let result = slot
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_else(|| Err(Error::new(format!("{} was not compiled", unit.name))));
        rows.extend(result?.into_iter().map(|entry| (unit, entry)));
    }
    let names: Vec<String> = rows.iter().map(|(_, entry)| entry.name.clone()).collect();
    let labels: Vec<String> = demangle(toolchain, &names)
        .iter()
        .map(|name| short_name(name))
        .collect();
    println!("\n{}", table(&rows, &labels));
    Ok(())
}

fn table(rows: &[(&Unit, EntryUsage)], labels: &[String]) -> String {
    let unit_width = rows.iter().map(|(u, _)| u.name.len()).max().unwrap_or(0).max(4);
    let label_width = labels.iter().map(String::len).max().unwrap_or(0).max(6);
    let mut out = format!(
        "{:<unit_width$}  {:<label_width$}  {:>9}  {:>12}  {:>11}  {:>12}  {:>11}\n",
        "unit", "kernel", "registers", "static smem", "stack frame", "spill stores", "spill loads"
    );
    for ((unit, entry), label) in rows.iter().zip(labels) {
        out.push_str(&format!(
            "{:<unit_width$}  {:<label_width$}  {:>9}  {:>12}  {:>11}  {:>12}  {:>11}\n",
            unit.name,
            label,
            entry.registers,
            format!("{} B", entry.static_smem),
            format!("{} B", entry.stack_frame),
            format!("{} B", entry.spill_stores),
            format!("{} B", entry.spill_loads),
        ));
    }
    out.push_str(
        "static smem: what ptxas sees; the GEMM mainloop's tile buffers are dynamic shared memory, sized at launch\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const SM90_REPORT: &str = "\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_ZN6fusion6kernelILi1EEEvv' for 'sm_90a'
ptxas info    : Function properties for _ZN6fusion6kernelILi1EEEvv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 16 barriers, 32 bytes smem, 400 bytes cmem[0]
ptxas info    : Function properties for _ZN6fusion6helperEv
    24 bytes stack frame, 24 bytes spill stores, 24 bytes spill loads
ptxas info    : Compiling entry function '_ZN6fusion6kernelILi2EEEvv' for 'sm_90a'
ptxas info    : Function properties for _ZN6fusion6kernelILi2EEEvv
    40 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 400 bytes cmem[0]
ptxas info    : Compile time = 120.000 ms
";

    #[test]
    fn ptxas_report_gives_one_row_per_entry() {
        let entries = parse_ptxas(SM90_REPORT);
        assert_eq!(
            entries,
            vec![
                EntryUsage {
                    name: "_ZN6fusion6kernelILi1EEEvv".into(),
                    registers: 168,
                    static_smem: 32,
                    stack_frame: 0,
                    spill_stores: 0,
                    spill_loads: 0,
                },
                EntryUsage {
                    name: "_ZN6fusion6kernelILi2EEEvv".into(),
                    registers: 255,
                    static_smem: 0,
                    stack_frame: 40,
                    spill_stores: 8,
                    spill_loads: 12,
                },
            ]
        );
    }

    #[test]
    fn ptxas_report_without_entries_is_empty() {
        assert!(parse_ptxas("ptxas info    : 0 bytes gmem\n").is_empty());
        assert!(parse_ptxas("").is_empty());
    }

    #[test]
    fn quantities_are_read_by_their_unit() {
        let line = "Used 96 registers, used 1 barriers, 1024 bytes smem, 380 bytes cmem[0]";
        assert_eq!(quantity(line, "registers"), Some(96));
        assert_eq!(quantity(line, "bytes smem"), Some(1024));
        assert_eq!(quantity(line, "bytes spill loads"), None);
    }

    fn unit_file(name: &str, used_by: &str) -> (PathBuf, String) {
        (
            PathBuf::from(format!("out/kernels/{name}.cu")),
            format!(
                "// Generated by fusion: do not edit.\n//\n// Used by: {used_by}\n#include \"fusion/abi.h\"\n"
            ),
        )
    }

    #[test]
    fn units_are_picked_by_their_used_by_line() {
        let candidates = vec![
            unit_file(
                "fusion_gemm_b_sm90",
                "gemm_bias_residual#0, swiglu_ffn#2, gpt2_mlp#1",
            ),
            unit_file("fusion_gemm_a_sm80", "swiglu_ffn#0"),
            unit_file("fusion_gemm_c_sm80", "swiglu_ffn_large#0, gemm_bias#0"),
            unit_file("fusion_gemm_d_sm75", "swiglu_ffn#1"),
            (
                PathBuf::from("out/kernels/no_line_sm80.cu"),
                "// nothing here\n".into(),
            ),
            unit_file("fusion_gemm_e_unknown", "swiglu_ffn#3"),
            (
                PathBuf::from("out/kernels/fusion_rmsnorm_f16.cu"),
                "// fusion_rmsnorm_f16: rmsnorm, f16, built for sm80, sm90.\n// Used by: swiglu_ffn#4\n"
                    .into(),
            ),
        ];
        let units = units_serving(candidates, "swiglu_ffn");
        let picked: Vec<(&str, Arch)> = units.iter().map(|u| (u.name.as_str(), u.arch)).collect();
        assert_eq!(
            picked,
            vec![
                ("fusion_gemm_a_sm80", Arch::Sm80),
                ("fusion_gemm_b_sm90", Arch::Sm90a),
                ("fusion_gemm_d_sm75", Arch::Sm75),
                ("fusion_rmsnorm_f16", Arch::Sm90a),
            ]
        );
        assert_eq!(units[0].path, PathBuf::from("out/kernels/fusion_gemm_a_sm80.cu"));
    }

    #[test]
    fn archs_give_their_real_code_gencode() {
        assert_eq!(Arch::Sm90a.gencode(), "-gencode=arch=compute_90a,code=sm_90a");
        assert_eq!(Arch::Sm80.gencode(), "-gencode=arch=compute_80,code=sm_80");
        assert_eq!(Arch::Sm75.gencode(), "-gencode=arch=compute_75,code=sm_75");
    }

    #[test]
    fn kernel_labels_are_short() {
        assert_eq!(
            short_name(
                "void fusion::fused_gemm_kernel<fusion::sm80::Mainloop<__half, (fusion::LayoutB)1, \
                 fusion::sm80::TileConfig<64, 128, 32, 32, 64, 4, 3, (fusion::sm80::KLoop)1> >, \
                 fusion::NoPrologue>(fusion::GemmArgs<__half>)"
            ),
            "fused_gemm_kernel 64x128x32"
        );
        assert_eq!(
            short_name(
                "void fusion::sm90::persistent_gemm_kernel<fusion::sm90::Mainloop<__half, (fusion::LayoutB)1, \
                 fusion::sm90::TileConfig<128, 256, 4, (fusion::sm90::Schedule)0, 8> >, \
                 fusion::EpilogueChain<fusion::Bias> >(CUtensorMap_st, CUtensorMap_st, fusion::GemmArgs<__half>)"
            ),
            "persistent_gemm_kernel 128x256x64"
        );
        assert_eq!(short_name("fusion::rmsnorm_kernel(float*)"), "rmsnorm_kernel");
        assert_eq!(short_name("_Z3fooPf"), "_Z3fooPf");
    }
}
