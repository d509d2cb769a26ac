//! The Handlebars templates and the CUDA headers, embedded in this crate.
//!
//! They live in fusion-compiler's `kernels/` folder and are embedded so that the
//! build script of any crate has them without a path to that folder: the templates are
//! registered from these strings, and the headers are written into the build
//! script's `OUT_DIR/include` (see [`write_headers`]) and compiled from
//! there. Editing one of these files rebuilds fusion-compiler, which reruns every
//! build script that depends on it.

use handlebars::Handlebars;
use std::path::Path;

/// `(name, template)`: the name is the file's stem.
pub const TEMPLATES: [(&str, &str); 5] = [
    ("gemm.cu", include_str!("../../kernels/gemm.cu.hbs")),
    ("norm.cu", include_str!("../../kernels/norm.cu.hbs")),
    ("elementwise.cu", include_str!("../../kernels/elementwise.cu.hbs")),
    (
        "error_string.cu",
        include_str!("../../kernels/error_string.cu.hbs"),
    ),
    (
        "fusion_kernels.h",
        include_str!("../../kernels/fusion_kernels.h.hbs"),
    ),
];

/// The kernel self-test harness (`kernels/selftest/`), by file name, for
/// `fusion render`: embedded so that the folder it writes is complete
/// wherever the binary runs.
pub const SELFTEST_HARNESS: [(&str, &str); 2] = [
    ("harness.cu", include_str!("../../kernels/selftest/harness.cu")),
    ("harness.cuh", include_str!("../../kernels/selftest/harness.cuh")),
];

/// Every file of `kernels/include`, by path relative to it.
pub const HEADERS: [(&str, &str); 26] = [
    ("fusion/abi.h", include_str!("../../kernels/include/fusion/abi.h")),
    (
        "fusion/decode.cuh",
        include_str!("../../kernels/include/fusion/decode.cuh"),
    ),
    (
        "fusion/elementwise.cuh",
        include_str!("../../kernels/include/fusion/elementwise.cuh"),
    ),
    (
        "fusion/epilogue.cuh",
        include_str!("../../kernels/include/fusion/epilogue.cuh"),
    ),
    (
        "fusion/fold.cuh",
        include_str!("../../kernels/include/fusion/fold.cuh"),
    ),
    (
        "fusion/gated.cuh",
        include_str!("../../kernels/include/fusion/gated.cuh"),
    ),
    (
        "fusion/gemm.cuh",
        include_str!("../../kernels/include/fusion/gemm.cuh"),
    ),
    (
        "fusion/norm.cuh",
        include_str!("../../kernels/include/fusion/norm.cuh"),
    ),
    (
        "fusion/numeric.cuh",
        include_str!("../../kernels/include/fusion/numeric.cuh"),
    ),
    (
        "fusion/problem.cuh",
        include_str!("../../kernels/include/fusion/problem.cuh"),
    ),
    (
        "fusion/prologue.cuh",
        include_str!("../../kernels/include/fusion/prologue.cuh"),
    ),
    (
        "fusion/sm75/mainloop.cuh",
        include_str!("../../kernels/include/fusion/sm75/mainloop.cuh"),
    ),
    (
        "fusion/sm80/collective_epilogue.cuh",
        include_str!("../../kernels/include/fusion/sm80/collective_epilogue.cuh"),
    ),
    (
        "fusion/sm80/mainloop.cuh",
        include_str!("../../kernels/include/fusion/sm80/mainloop.cuh"),
    ),
    (
        "fusion/sm80/primitives.cuh",
        include_str!("../../kernels/include/fusion/sm80/primitives.cuh"),
    ),
    (
        "fusion/sm90/collective_epilogue.cuh",
        include_str!("../../kernels/include/fusion/sm90/collective_epilogue.cuh"),
    ),
    (
        "fusion/sm90/collective_mainloop.cuh",
        include_str!("../../kernels/include/fusion/sm90/collective_mainloop.cuh"),
    ),
    (
        "fusion/sm90/mainloop.cuh",
        include_str!("../../kernels/include/fusion/sm90/mainloop.cuh"),
    ),
    (
        "fusion/sm90/primitives.cuh",
        include_str!("../../kernels/include/fusion/sm90/primitives.cuh"),
    ),
    (
        "fusion/sm90/split_plan.cuh",
        include_str!("../../kernels/include/fusion/sm90/split_plan.cuh"),
    ),
    (
        "fusion/sm90/tensor_map.cuh",
        include_str!("../../kernels/include/fusion/sm90/tensor_map.cuh"),
    ),
    (
        "fusion/sm90/tile_config.cuh",
        include_str!("../../kernels/include/fusion/sm90/tile_config.cuh"),
    ),
    (
        "fusion/sm90/tile_scheduler.cuh",
        include_str!("../../kernels/include/fusion/sm90/tile_scheduler.cuh"),
    ),
    (
        "fusion/sm90/trace.cuh",
        include_str!("../../kernels/include/fusion/sm90/trace.cuh"),
    ),
    (
        "fusion/warp_tiled.cuh",
        include_str!("../../kernels/include/fusion/warp_tiled.cuh"),
    ),
    (
        "fusion/workspace.cuh",
        include_str!("../../kernels/include/fusion/workspace.cuh"),
    ),
];

/// The templates, in strict mode (a missing field is an error, not an empty
/// string) and without HTML escaping (`<` and `&` are C++).
pub fn registry() -> Handlebars<'static> {
    let mut registry = Handlebars::new();
    registry.set_strict_mode(true);
    registry.register_escape_fn(handlebars::no_escape);
    for (name, text) in TEMPLATES {
        registry
            .register_template_string(name, text)
            .unwrap_or_else(|e| panic!("embedded template {name} does not parse: {e}"));
    }
    registry
}

/// Writes [`HEADERS`] under `dir`, leaving files whose contents are already
/// right untouched (their timestamps then do not trigger rebuilds).
pub fn write_headers(dir: &Path) -> std::io::Result<()> {
    for (relative, contents) in HEADERS {
        let path = dir.join(relative);
        if std::fs::read(&path).is_ok_and(|old| old == contents.as_bytes()) {
            continue;
        }
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(&path, contents)?;
    }
    Ok(())
}
