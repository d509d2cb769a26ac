//! `FUSION_SELECT=model` has a build choose one sm90 tile per M bucket for
//! GEMMs whose N and K are static, by the model of the kernel's time
//! (`fusion_compiler::select::model`), and the unit it renders compiles
//! with nvcc. One test in its own binary: it sets the environment variable.
//!
//! nvcc is required: `cargo xtask test` installs it and exports `NVCC`;
//! locally, set `NVCC` or run `cargo xtask toolchain`. No GPU is needed.

#![cfg(feature = "build")]

use fusion_compiler::build::{BuildError, Builder, CompileOptions};
use fusion_compiler::select::{Arch, SELECT_ENV};
use std::path::Path;

const GRAPH: &str = "[graph]\nname = \"proj\"\n[dims]\nM = \"dyn\"\nK = 1000\nN = 3000\n\
[inputs]\nx = \"f16[M, K]\"\n[weights]\nw = \"f16[N, K]\"\nb = \"f16[N]\"\n[outputs]\ny = \"gelu(x @ w^T + b)\"\n";

/// The dispatch lines of the library's one unit.
fn dispatch(builder: &Builder) -> Result<Vec<String>, BuildError> {
    let library = builder.render()?;
    assert_eq!(library.units.len(), 1);
    Ok(library.units[0]
        .source
        .lines()
        .filter(|l| {
            let l = l.trim_start();
            l.starts_with("if (p->m <= ") || l.starts_with("return f(K<") || l.starts_with("lightest.offer<")
        })
        .map(|l| l.trim().to_owned())
        .collect())
}

#[test]
fn fusion_select_model_gives_a_tile_per_m_bucket_that_nvcc_compiles() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fusion-build-select");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let graph = dir.join("proj.toml");
    std::fs::write(&graph, GRAPH).unwrap();
    let builder = || {
        Builder::new()
            .graph_file(&graph)
            .archs(&[Arch::Sm90])
            .lib_name("k")
    };

    let shipped = dispatch(&builder()).unwrap();
    assert!(
        shipped.iter().any(|l| l.starts_with("lightest.offer<")),
        "{shipped:#?}"
    );
    // SAFETY: this binary's only test; nothing else reads the environment.
    unsafe { std::env::set_var(SELECT_ENV, "tables") };
    assert_eq!(dispatch(&builder()).unwrap(), shipped);

    unsafe { std::env::set_var(SELECT_ENV, "model") };
    let modelled = dispatch(&builder()).unwrap();
    assert!(
        !modelled.iter().any(|l| l.starts_with("lightest.offer<")),
        "{modelled:#?}"
    );
    assert!(
        modelled
            .iter()
            .filter(|l| l.starts_with("if (p->m <= ") && l.ends_with(';'))
            .count()
            >= 2,
        "{modelled:#?}"
    );
    assert_eq!(modelled.last().unwrap(), "return f(K<LargeTile>{});");
    // The unit nvcc compiles is the one rendered.
    let mut options = CompileOptions::new(dir.join("out"));
    options.cache_dir = Some(dir.join("cache"));
    options.cargo_metadata = false;
    if let Err(error) = builder().build_with(options) {
        panic!("the model's unit did not build (nvcc is needed: `cargo xtask toolchain`): {error}");
    }

    unsafe { std::env::set_var(SELECT_ENV, "fastest") };
    let error = dispatch(&builder()).unwrap_err().to_string();
    assert!(
        error.contains("FUSION_SELECT=\"fastest\"") && error.contains("`model`"),
        "{error}"
    );
    unsafe { std::env::remove_var(SELECT_ENV) };
    let _ = std::fs::remove_dir_all(&dir);
}
