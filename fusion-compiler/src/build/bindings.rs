//! Rust declarations for the generated C header, by bindgen, cached by the
//! header's content so an unchanged header never loads libclang.
//!
//! The header declares launchers (`fusion_*` functions taking a params
//! struct and a `void*` stream) and their params structs; bindgen is limited
//! to those names. libclang may be PyPI's wheel, which has no clang builtin
//! headers: the generated header must include nothing but `<stdint.h>`.

use super::cache::{HeaderTree, KeyHasher, ObjectCache, write_if_changed};
use super::{BuildError, GeneratedFile};
use std::path::Path;

/// What to translate and where the result goes.
pub struct BindingsRequest<'a> {
    /// The header as written into `OUT_DIR`.
    pub header_path: &'a Path,
    pub header: &'a GeneratedFile,
    /// The include root, on bindgen's include path.
    pub headers: &'a HeaderTree,
    pub cache: &'a ObjectCache,
    /// Where libclang is, when the environment or the toolchain file says.
    pub libclang_dir: Option<&'a Path>,
    /// Whether `libclang_dir` came from `LIBCLANG_PATH` itself.
    pub libclang_from_env: bool,
    pub target: &'a str,
    /// The library's name, the prefix of its launcher symbols.
    pub lib_name: &'a str,
    pub output: &'a Path,
}

/// Bumped whenever the bindgen options below change, so cached bindings made
/// with other options are not reused.
const BINDGEN_OPTIONS_VERSION: &str = "bindgen 0.72; fusion options v3";

/// Writes the bindings to `request.output`. Returns whether bindgen ran
/// (false: they came from the cache).
pub fn write_bindings(request: &BindingsRequest<'_>) -> Result<bool, BuildError> {
    let mut hasher = KeyHasher::new("fusion-bindings-v1");
    hasher.field("options", BINDGEN_OPTIONS_VERSION.as_bytes());
    hasher.field("target", request.target.as_bytes());
    hasher.field("lib name", request.lib_name.as_bytes());
    hasher.field("header", request.header.contents.as_bytes());
    hasher.field("include tree", request.headers.digest.to_string().as_bytes());
    let cached_name = format!("bindings-{}.rs", hasher.finish());
    if let Some(text) = request.cache.read_file(&cached_name) {
        write_if_changed(request.output, &text)?;
        return Ok(false);
    }

    load_libclang(request)?;
    let header = request.header_path.to_str().ok_or_else(|| {
        BuildError::Config(format!(
            "the generated header's path {} is not UTF-8, which bindgen needs",
            request.header_path.display()
        ))
    })?;
    let bindings = bindgen::Builder::default()
        .header(header)
        .clang_arg(format!("-I{}", request.headers.root.display()))
        // The shared ABI types are `fusion_*`; the launchers carry the
        // library's name, which a user crate picks.
        .allowlist_function(format!("fusion_.*|{}_.*", request.lib_name))
        .allowlist_type("fusion_.*")
        .allowlist_var("(fusion|FUSION)_.*")
        // The ABI's structs are the run time's (`fusion::abi`), which the
        // generated `ffi` module imports: one declaration of each layout.
        .blocklist_type("fusion_(gemm|fold|norm|elementwise)_params|fusion_tile_resources")
        .derive_debug(true)
        .derive_default(true)
        .derive_copy(true)
        .size_t_is_usize(true)
        .layout_tests(false)
        .generate_comments(true)
        .formatter(bindgen::Formatter::Prettyplease)
        .generate()
        .map_err(|e| BuildError::Bindgen {
            header: request.header_path.to_owned(),
            reason: e.to_string(),
        })?;
    let text = bindings.to_string();
    request.cache.write_file(&cached_name, text.as_bytes())?;
    write_if_changed(request.output, text.as_bytes())?;
    Ok(true)
}

/// Loads libclang for this thread, so bindgen (which would panic when it is
/// missing) finds it loaded, and a missing one becomes an error that says
/// what to do.
fn load_libclang(request: &BindingsRequest<'_>) -> Result<(), BuildError> {
    if clang_sys::is_loaded() {
        return Ok(());
    }
    if let (Some(dir), false) = (request.libclang_dir, request.libclang_from_env) {
        // clang-sys reads the location from this variable and nowhere else.
        // SAFETY: `compile` documents that it runs on a build script's main
        // thread, and the nvcc worker threads have all been joined by now, so
        // nothing reads the environment concurrently.
        unsafe { std::env::set_var("LIBCLANG_PATH", dir) };
    }
    clang_sys::load().map_err(|reason| BuildError::LibclangNotFound {
        header: request.header_path.to_owned(),
        reason: reason.trim_end_matches('.').to_owned(),
    })
}
