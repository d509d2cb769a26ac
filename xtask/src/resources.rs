//! What the kernels of one graph cost in hardware resources, for a machine
//! without a GPU: each CUDA unit the release build rendered for the graph is
//! compiled again with `ptxas -v`, and its report (registers, static shared
//! memory, stack frame, spills) is printed as one table row per kernel.
//!
//! Which units serve the graph, which generation each is built for, its
//! nvcc flag and its tiles come from the build's manifest,
//! `OUT_DIR/kernels/units.json` (written by `fusion_compiler::build`), not from
//! the generated sources.

use crate::error::{Error, Result};
use crate::process::{display_command, format_duration, last_line};
use crate::toolchain::Toolchain;
use crate::workspace::Workspace;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Instant, SystemTime};

/// The manifest's name, next to the units.
const MANIFEST: &str = "units.json";

/// One rendered CUDA unit to report on, as the manifest describes it.
#[derive(Debug, PartialEq)]
pub struct Unit {
    pub name: String,
    pub path: PathBuf,
    /// The newest generation it is built for (`sm90`): the one reported.
    pub target: String,
    /// nvcc's flag for that generation's machine code alone: ptxas runs once.
    pub sass_gencode: String,
    /// Its tile configs (`large: 128x256x64 (...)`); none for a unit
    /// without a GEMM.
    pub tiles: Vec<String>,
}

/// The units of `manifest` (the text of `kernels_dir/units.json`) that
/// serve `graph`, sorted by name.
pub fn units_serving(manifest: &str, kernels_dir: &Path, graph: &str) -> Result<Vec<Unit>> {
    let bad = |what: &str| Error::new(format!("{}: {what}", kernels_dir.join(MANIFEST).display()));
    let manifest: Value = serde_json::from_str(manifest).map_err(|e| bad(&e.to_string()))?;
    let entries = manifest["units"]
        .as_array()
        .ok_or_else(|| bad("no `units` list"))?;
    let strings = |value: &Value| -> Vec<String> {
        value
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|item| item.as_str().map(str::to_string))
            .collect()
    };
    let mut units = Vec::new();
    for entry in entries {
        // `graph#index`: a graph's kernel and its index in the plan.
        let serves = strings(&entry["used_by"])
            .iter()
            .any(|kernel| kernel.split('#').next() == Some(graph));
        if !serves {
            continue;
        }
        let field = |value: &Value, name: &str| {
            value[name]
                .as_str()
                .map(str::to_string)
                .ok_or_else(|| bad(&format!("a unit without `{name}`: {entry}")))
        };
        // Targets are listed oldest first.
        let newest = entry["targets"]
            .as_array()
            .and_then(|targets| targets.last())
            .ok_or_else(|| bad(&format!("a unit without targets: {entry}")))?;
        units.push(Unit {
            name: field(entry, "name")?,
            path: kernels_dir.join(field(entry, "file")?),
            target: field(newest, "name")?,
            sass_gencode: field(newest, "sass_gencode")?,
            tiles: strings(&entry["tiles"]),
        });
    }
    units.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(units)
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

/// The newest `target/release/build/fusion-*/out` holding rendered units
/// and their manifest.
fn newest_release_out_dir(workspace: &Workspace) -> Result<PathBuf> {
    let build_dir = workspace.root.join("target").join("release").join("build");
    let newest = std::fs::read_dir(&build_dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|entry| entry.file_name().to_string_lossy().starts_with("fusion-"))
        .map(|entry| entry.path().join("out"))
        .filter_map(|out| {
            let manifest = out.join("kernels").join(MANIFEST);
            let modified = manifest.metadata().and_then(|m| m.modified()).ok()?;
            Some((modified, out))
        })
        .max_by_key(|(modified, _): &(SystemTime, PathBuf)| *modified);
    newest.map(|(_, out)| out).ok_or_else(|| {
        Error::new(format!(
            "no rendered kernels under {}/fusion-*/out/kernels ({MANIFEST}): build first with `cargo build --release -p fusion-cli`",
            workspace.display(&build_dir)
        ))
    })
}

/// nvcc compiling `unit` to nothing, with ptxas reporting; the flags that
/// change code generation are the build's (`fusion_compiler::build`).
fn ptxas_command(toolchain: &Toolchain, out_dir: &Path, unit: &Unit) -> Command {
    let mut command = Command::new(&toolchain.nvcc);
    toolchain.apply_to(&mut command);
    command
        .args(["-Xptxas", "-v", "-c", "-o", "/dev/null", &unit.sass_gencode])
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
/// arguments or parameters (its unit's tiles are listed under the table).
fn short_name(demangled: &str) -> String {
    let without_return = demangled.strip_prefix("void ").unwrap_or(demangled);
    let head_end = without_return.find(['<', '(']).unwrap_or(without_return.len());
    let head = &without_return[..head_end];
    head.rsplit("::").next().unwrap_or(head).to_string()
}

/// Compiles every unit of `graph` with ptxas reporting (several at once)
/// and prints one row per kernel entry function.
pub fn report(workspace: &Workspace, toolchain: &Toolchain, graph: &str) -> Result<()> {
    let out_dir = newest_release_out_dir(workspace)?;
    let kernels_dir = out_dir.join("kernels");
    let manifest_path = kernels_dir.join(MANIFEST);
    let manifest = std::fs::read_to_string(&manifest_path)
        .map_err(|e| Error::new(format!("could not read {}: {e}", manifest_path.display())))?;
    let units = units_serving(&manifest, &kernels_dir, graph)?;
    if units.is_empty() {
        return Err(Error::new(format!(
            "no unit in {} serves {graph}",
            workspace.display(&manifest_path)
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
    let mut listed: Vec<&str> = Vec::new();
    for (unit, _) in rows {
        if unit.tiles.is_empty() || listed.contains(&unit.name.as_str()) {
            continue;
        }
        listed.push(&unit.name);
        if listed.len() == 1 {
            out.push_str("\ntiles (one kernel each):\n");
        }
        out.push_str(&format!(
            "{}, {}: {}\n",
            unit.name,
            unit.target,
            unit.tiles.join("; ")
        ));
    }
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

    const MANIFEST_TEXT: &str = r#"{ "units": [
      { "name": "lib_gemm_b_sm90", "file": "lib_gemm_b_sm90.cu",
        "targets": [ { "name": "sm90", "gencode": "-gencode=arch=compute_90a,code=sm_90a",
                       "sass_gencode": "-gencode=arch=compute_90a,code=sm_90a" } ],
        "used_by": [ "gemm_bias_residual#0", "swiglu_ffn#2" ],
        "tiles": [ "large: 128x256x64 (4 stages, cooperative, persistent)" ] },
      { "name": "lib_gemm_a_sm80", "file": "lib_gemm_a_sm80.cu",
        "targets": [ { "name": "sm80", "gencode": "-gencode=arch=compute_80,code=[sm_80,compute_80]",
                       "sass_gencode": "-gencode=arch=compute_80,code=sm_80" } ],
        "used_by": [ "swiglu_ffn#0" ], "tiles": [] },
      { "name": "lib_gemm_c_sm80", "file": "lib_gemm_c_sm80.cu",
        "targets": [ { "name": "sm80", "gencode": "", "sass_gencode": "-gencode=arch=compute_80,code=sm_80" } ],
        "used_by": [ "swiglu_ffn_large#0" ], "tiles": [] },
      { "name": "lib_rmsnorm_f16", "file": "lib_rmsnorm_f16.cu",
        "targets": [ { "name": "sm80", "gencode": "", "sass_gencode": "-gencode=arch=compute_80,code=sm_80" },
                     { "name": "sm90", "gencode": "", "sass_gencode": "-gencode=arch=compute_90a,code=sm_90a" } ],
        "used_by": [ "swiglu_ffn#4" ] },
      { "name": "lib_error_string", "file": "lib_error_string.cu",
        "targets": [ { "name": "sm80", "gencode": "", "sass_gencode": "" } ], "used_by": [] }
    ] }"#;

    #[test]
    fn units_are_picked_from_the_manifest() {
        let units = units_serving(MANIFEST_TEXT, Path::new("out/kernels"), "swiglu_ffn").unwrap();
        let picked: Vec<(&str, &str, &str)> = units
            .iter()
            .map(|u| (u.name.as_str(), u.target.as_str(), u.sass_gencode.as_str()))
            .collect();
        assert_eq!(
            picked,
            vec![
                ("lib_gemm_a_sm80", "sm80", "-gencode=arch=compute_80,code=sm_80"),
                ("lib_gemm_b_sm90", "sm90", "-gencode=arch=compute_90a,code=sm_90a"),
                // Built for two generations: the newest is reported.
                ("lib_rmsnorm_f16", "sm90", "-gencode=arch=compute_90a,code=sm_90a"),
            ]
        );
        assert_eq!(units[0].path, PathBuf::from("out/kernels/lib_gemm_a_sm80.cu"));
        assert_eq!(
            units[1].tiles,
            ["large: 128x256x64 (4 stages, cooperative, persistent)"]
        );
        assert!(units[2].tiles.is_empty());
    }

    #[test]
    fn a_broken_manifest_is_an_error_naming_it() {
        let err = units_serving("{", Path::new("out/kernels"), "g").unwrap_err();
        assert!(format!("{err:?}").contains("units.json"), "{err:?}");
        let no_targets = r#"{ "units": [ { "name": "u", "file": "u.cu", "used_by": ["g#0"] } ] }"#;
        let err = units_serving(no_targets, Path::new("out/kernels"), "g").unwrap_err();
        assert!(format!("{err:?}").contains("without targets"), "{err:?}");
    }

    #[test]
    fn kernel_labels_are_short() {
        assert_eq!(
            short_name(
                "void fusion::fused_gemm_kernel<fusion::sm80::Mainloop<__half, (fusion::LayoutB)1, \
                 fusion::sm80::TileConfig<64, 128, 32, 32, 64, 4, 3, (fusion::sm80::KLoop)1> >, \
                 fusion::NoPrologue>(fusion::GemmArgs<__half>)"
            ),
            "fused_gemm_kernel"
        );
        assert_eq!(
            short_name(
                "void fusion::sm90::persistent_gemm_kernel<fusion::sm90::Mainloop<__half, (fusion::LayoutB)1, \
                 fusion::sm90::TileConfig<128, 256, 4, (fusion::sm90::Schedule)0, 8> >, \
                 fusion::EpilogueChain<fusion::Bias> >(CUtensorMap_st, CUtensorMap_st, fusion::GemmArgs<__half>)"
            ),
            "persistent_gemm_kernel"
        );
        assert_eq!(short_name("fusion::rmsnorm_kernel(float*)"), "rmsnorm_kernel");
        assert_eq!(short_name("_Z3fooPf"), "_Z3fooPf");
    }
}
