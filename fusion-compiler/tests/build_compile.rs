//! End to end through the real nvcc: compile a tiny generated unit for
//! sm_75, sm_80 and sm_90a, archive it, run bindgen, then build again and
//! check that nothing reached nvcc or libclang the second time, and link a
//! shared library from the same cached object.
//!
//! nvcc is required: `cargo xtask test` installs it and exports `NVCC` and
//! `LIBCLANG_PATH`; locally, set `NVCC` or run `cargo xtask toolchain`. No GPU
//! is needed. Everything runs in one test because a build may export
//! `LIBCLANG_PATH` (from the toolchain file), which is only sound while no
//! other thread reads the environment (the two builds that run at once run
//! after the first ones, when the variable is already set).

#![cfg(feature = "build")]

use fusion_compiler::build::{
    BuildError, BuildMode, CompileOptions, CompiledLibrary, CudaSources, GeneratedFile, Nvcc, SharedCompiler,
    Unit, compile,
};
use fusion_compiler::target::Arch;
use std::path::{Path, PathBuf};
use std::time::Instant;

const HEADER: &str = r#"/* Generated launchers: the C ABI between the kernels and Rust. */
#ifndef FUSION_KERNELS_H
#define FUSION_KERNELS_H
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif

typedef struct fusion_probe_params {
    int32_t* out;
    int32_t value;
    uint64_t len;
} fusion_probe_params;

/* Fills out[0..len) with value + index. Returns a cudaError_t. */
int fusion_probe(const fusion_probe_params* params, void* stream);

#ifdef __cplusplus
}
#endif
#endif
"#;

const PROBE_CUH: &str = r#"#pragma once
#include <stdint.h>
namespace fusion {
__device__ __forceinline__ int32_t probe_value(int32_t base, uint64_t i) {
    return base + static_cast<int32_t>(i);
}
}  // namespace fusion
"#;

const UNIT: &str = r#"#include "fusion_kernels.h"
#include <fusion/probe.cuh>

__global__ void fusion_probe_kernel(int32_t* out, int32_t value, uint64_t len) {
    uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x;
    if (i < len) out[i] = fusion::probe_value(value, i);
}

extern "C" int fusion_probe(const fusion_probe_params* params, void* stream) {
    if (params == nullptr) return static_cast<int>(cudaErrorInvalidValue);
    if (params->len == 0) return 0;
    unsigned blocks = static_cast<unsigned>((params->len + 255) / 256);
    fusion_probe_kernel<<<blocks, 256, 0, static_cast<cudaStream_t>(stream)>>>(
        params->out, params->value, params->len);
    return static_cast<int>(cudaGetLastError());
}
"#;

struct Workspace {
    root: PathBuf,
}

impl Workspace {
    fn new() -> Workspace {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fusion-build-compile");
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(root.join("include/fusion")).unwrap();
        std::fs::write(root.join("include/fusion/probe.cuh"), PROBE_CUH).unwrap();
        Workspace { root }
    }

    fn sources(&self, source: &str, archs: &[Arch]) -> CudaSources {
        CudaSources {
            units: vec![Unit {
                name: "probe".to_owned(),
                source: source.to_owned(),
                archs: archs.to_vec(),
                used_by: vec!["probe_graph#0".to_owned()],
                tiles: Vec::new(),
            }],
            header: GeneratedFile {
                name: "fusion_kernels.h".to_owned(),
                contents: HEADER.to_owned(),
            },
            headers_dir: self.root.join("include"),
        }
    }

    fn options(&self, out: &str) -> CompileOptions {
        let mut options = CompileOptions::new(self.root.join(out));
        // A private cache, so the first build below is always cold.
        options.cache_dir = Some(self.root.join("cache"));
        options
    }
}

fn build(sources: &CudaSources, options: &CompileOptions) -> (CompiledLibrary, f64) {
    let started = Instant::now();
    match compile(sources, options) {
        Ok(lib) => (lib, started.elapsed().as_secs_f64()),
        Err(e @ BuildError::NvccNotFound { .. }) => {
            panic!("this test compiles CUDA and needs nvcc; `cargo xtask test` provides it.\n{e}")
        }
        Err(e) => panic!("build failed: {e}"),
    }
}

#[test]
fn compiles_archives_binds_and_then_serves_everything_from_the_cache() {
    let ws = Workspace::new();
    let all = [Arch::Sm75, Arch::Sm80, Arch::Sm90];
    let sources = ws.sources(UNIT, &all);

    // Cold: one nvcc call for three architectures, bindgen once.
    let options = ws.options("out-debug");
    let (cold, cold_s) = build(&sources, &options);
    assert_eq!(cold.mode, BuildMode::Linked);
    assert_eq!((cold.units_compiled, cold.units_cached), (1, 0));
    assert!(cold.bindings_generated);
    let archive = cold.lib_dir.join("libfusion_kernels.a");
    let archive_bytes = std::fs::read(&archive).unwrap();
    assert!(
        archive_bytes.starts_with(b"!<arch>\n"),
        "{} is not an ar archive",
        archive.display()
    );
    assert!(
        names_probe(&archive_bytes),
        "the archive does not define fusion_probe"
    );
    assert_eq!(
        std::fs::read_to_string(options.out_dir.join("kernels/probe.cu")).unwrap(),
        UNIT,
        "the unit is written out so nvcc's errors point at a real file"
    );
    // The manifest next to it says what the unit is, for tools.
    let manifest = std::fs::read_to_string(options.out_dir.join("kernels/units.json")).unwrap();
    for expected in [
        r#""file": "probe.cu""#,
        r#""used_by": [
        "probe_graph#0"
      ]"#,
        r#""sass_gencode": "-gencode=arch=compute_90a,code=sm_90a""#,
    ] {
        assert!(manifest.contains(expected), "expected {expected} in {manifest}");
    }

    let ffi = std::fs::read_to_string(&cold.ffi_rs).unwrap();
    assert!(ffi.contains("pub struct fusion_probe_params"), "{ffi}");
    assert!(ffi.contains("pub fn fusion_probe("), "{ffi}");
    assert!(
        ffi.contains("Debug") && ffi.contains("Default") && ffi.contains("Copy"),
        "{ffi}"
    );
    assert!(ffi.contains("pub len: u64"), "{ffi}");
    assert!(
        !ffi.contains("fusion_probe_kernel"),
        "only the C header is bound: {ffi}"
    );

    // Warm, same OUT_DIR: no nvcc, no libclang, no re-archiving.
    let (warm, warm_s) = build(&sources, &options);
    assert_eq!((warm.units_compiled, warm.units_cached), (0, 1));
    assert!(!warm.bindings_generated);
    let log = std::fs::read_to_string(&warm.log).unwrap();
    assert!(log.contains("unit probe [sm75,sm80,sm90]: cached"), "{log}");
    assert!(log.contains("archive:") && log.contains("unchanged"), "{log}");
    assert_eq!(std::fs::read(&archive).unwrap(), archive_bytes);

    // Another profile or crate (a different OUT_DIR) shares the cache.
    let (other, _) = build(&sources, &ws.options("out-release"));
    assert_eq!((other.units_compiled, other.units_cached), (0, 1));
    assert!(!other.bindings_generated);
    eprintln!("probe for sm_75+sm_80+sm_90a: cold build {cold_s:.2}s, warm build {warm_s:.3}s");

    // A shared library (what `fusion tune` and `fusion run` load) from the
    // same unit: its object is the archive's, so nvcc only links.
    let objects = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().path().extension().is_some_and(|e| e == "o"))
            .count()
    };
    let cached_objects = objects(&ws.root.join("cache"));
    let nvcc = Nvcc::find_from_current_dir().unwrap();
    let mut shared_options = CompileOptions::new(ws.root.join("shared"));
    shared_options.cache_dir = options.cache_dir.clone();
    let compiler = SharedCompiler::new(&nvcc, &shared_options, &sources.headers_dir).unwrap();
    let library = compiler.build("probe", &sources.units).unwrap();
    assert_eq!(
        objects(&ws.root.join("cache")),
        cached_objects,
        "no unit was compiled"
    );
    let library_bytes = std::fs::read(&library.path).unwrap();
    assert!(
        library_bytes.starts_with(b"\x7fELF"),
        "{}",
        library.path.display()
    );
    assert!(
        names_probe(&library_bytes),
        "the library does not define fusion_probe"
    );

    // One changed byte in a kernel header: recompiled.
    std::fs::write(
        ws.root.join("include/fusion/probe.cuh"),
        PROBE_CUH.replace("base + ", "base +  "),
    )
    .unwrap();
    let sources = ws.sources(UNIT, &all);
    let (edited, _) = build(&sources, &options);
    assert_eq!((edited.units_compiled, edited.units_cached), (1, 0));

    // A damaged cached object is noticed and rebuilt.
    let cached: Vec<PathBuf> = std::fs::read_dir(ws.root.join("cache"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "o"))
        .collect();
    assert_eq!(cached.len(), 2, "one object per distinct key: {cached:?}");
    for object in &cached {
        let bytes = std::fs::read(object).unwrap();
        std::fs::write(object, &bytes[..bytes.len() / 3]).unwrap();
    }
    let (rebuilt, _) = build(&sources, &options);
    assert_eq!((rebuilt.units_compiled, rebuilt.units_cached), (1, 0));
    let log = std::fs::read_to_string(&rebuilt.log).unwrap();
    assert!(log.contains("damaged"), "{log}");

    // DOCS_RS / FUSION_SKIP_NVCC: no nvcc, no archive, still the bindings.
    let mut skip = ws.options("out-docs");
    skip.skip_nvcc = true;
    skip.cache_dir = Some(ws.root.join("docs-cache"));
    let (docs, _) = build(&sources, &skip);
    assert_eq!(docs.mode, BuildMode::NvccSkipped);
    assert_eq!((docs.units_compiled, docs.units_cached), (0, 0));
    assert!(docs.bindings_generated);
    assert!(!skip.out_dir.join("libfusion_kernels.a").exists());
    assert_eq!(std::fs::read_to_string(&docs.ffi_rs).unwrap(), ffi);

    two_builds_at_once_share_one_cache(&ws);

    // nvcc's errors come back with the generated file's path.
    let broken = ws.sources(&UNIT.replace("if (i < len)", "if (i < len"), &[Arch::Sm80]);
    let err = compile(&broken, &ws.options("out-broken")).unwrap_err();
    let message = err.to_string();
    let source = ws.root.join("out-broken/kernels/probe.cu");
    assert!(matches!(err, BuildError::Nvcc { .. }), "{message}");
    assert!(message.contains(&source.display().to_string()), "{message}");
    assert!(message.contains("error"), "nvcc's own message is kept: {message}");
}

/// Whether `bytes` hold the launcher's name `fusion_probe`.
fn names_probe(bytes: &[u8]) -> bool {
    bytes.windows(b"fusion_probe".len()).any(|w| w == b"fusion_probe")
}

/// Whether `bytes` are a whole ELF64 object: the section header table the
/// header points at ends inside the file (the assembler writes it last).
fn is_whole_elf64(bytes: &[u8]) -> bool {
    if bytes.len() < 64 || bytes[..4] != *b"\x7fELF" || bytes[4] != 2 || bytes[5] != 1 {
        return false;
    }
    let table = u64::from_le_bytes(bytes[0x28..0x30].try_into().unwrap());
    let entry = u64::from(u16::from_le_bytes([bytes[0x3a], bytes[0x3b]]));
    let count = u64::from(u16::from_le_bytes([bytes[0x3c], bytes[0x3d]]));
    count > 0 && table + entry * count <= bytes.len() as u64
}

/// Two crates building at once against one cold cache, each with its own
/// cache handle, with an interrupted build's leftover in it: both succeed
/// and archive a whole object, a reader watching the cache never
/// sees a partial object, and no temp or lock file is left.
fn two_builds_at_once_share_one_cache(ws: &Workspace) {
    let cache = ws.root.join("shared-cache");
    std::fs::create_dir_all(&cache).unwrap();
    // A build that no longer runs (its writer lock file is gone) left half
    // a file.
    let leftover = cache.join(format!(".{}.o.w1-2-3.0.tmp", "ab".repeat(32)));
    std::fs::write(&leftover, b"\x7fELF half").unwrap();
    let sources = ws.sources(UNIT, &[Arch::Sm80]);
    let done = std::sync::atomic::AtomicBool::new(false);
    let (results, partial_reads) = std::thread::scope(|scope| {
        let watcher = scope.spawn(|| {
            let mut partial = Vec::new();
            while !done.load(std::sync::atomic::Ordering::Relaxed) {
                for entry in std::fs::read_dir(&cache).unwrap().flatten() {
                    let path = entry.path();
                    let name = entry.file_name().to_string_lossy().into_owned();
                    if name.starts_with('.') || !name.ends_with(".o") {
                        continue;
                    }
                    if let Ok(bytes) = std::fs::read(&path)
                        && !is_whole_elf64(&bytes)
                    {
                        partial.push(format!("{name}: {} bytes", bytes.len()));
                    }
                }
                std::thread::sleep(std::time::Duration::from_millis(2));
            }
            partial
        });
        let builds: Vec<_> = (0..2)
            .map(|i| {
                let sources = &sources;
                let cache = &cache;
                scope.spawn(move || {
                    let mut options = ws.options(&format!("out-crate-{i}"));
                    options.cache_dir = Some(cache.clone());
                    options.jobs = 1;
                    compile(sources, &options)
                })
            })
            .collect();
        let results: Vec<_> = builds.into_iter().map(|b| b.join().unwrap()).collect();
        done.store(true, std::sync::atomic::Ordering::Relaxed);
        (results, watcher.join().unwrap())
    });
    let mut archives = Vec::new();
    for (i, result) in results.into_iter().enumerate() {
        let lib = result.unwrap_or_else(|e| panic!("build {i} failed: {e}"));
        assert_eq!(lib.units_compiled + lib.units_cached, 1, "build {i}");
        let archive = std::fs::read(lib.lib_dir.join("libfusion_kernels.a")).unwrap();
        assert!(archive.starts_with(b"!<arch>\n"), "build {i}");
        archives.push(archive);
    }
    assert!(
        partial_reads.is_empty(),
        "partial objects seen: {partial_reads:?}"
    );
    let names: Vec<String> = std::fs::read_dir(&cache)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!leftover.exists(), "the interrupted build's temp file is cleaned");
    assert!(
        names
            .iter()
            .all(|n| !n.ends_with(".tmp") && !n.ends_with(".lock")),
        "temp or lock files left: {names:?}"
    );
    let objects: Vec<&String> = names.iter().filter(|n| n.ends_with(".o")).collect();
    assert_eq!(objects.len(), 1, "one object for the one key: {names:?}");
    assert!(is_whole_elf64(&std::fs::read(cache.join(objects[0])).unwrap()));
    // Each build archived one whole object.
    for (i, archive) in archives.iter().enumerate() {
        let members = archive_members(archive);
        let elf: Vec<_> = members.iter().filter(|m| m.starts_with(b"\x7fELF")).collect();
        assert_eq!(elf.len(), 1, "build {i}: {} members", members.len());
        assert!(is_whole_elf64(elf[0]), "build {i} archived a partial object");
    }
}

/// The members' contents of a `!<arch>` archive: each member is a 60-byte
/// header (its size, in decimal, at bytes 48..58) then the data, padded to
/// an even length.
fn archive_members(archive: &[u8]) -> Vec<&[u8]> {
    let mut members = Vec::new();
    let mut at = 8;
    while at + 60 <= archive.len() {
        let size: usize = std::str::from_utf8(&archive[at + 48..at + 58])
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let data = at + 60;
        members.push(&archive[data..(data + size).min(archive.len())]);
        at = data + size + size % 2;
    }
    members
}
