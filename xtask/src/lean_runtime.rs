//! What a crate that depends on fusion compiles: `fusion` with its default
//! features (the run time alone: no shipped kernels, no command line), and
//! what its program links with the features a user of the shipped kernels
//! names (`kernels`, `sm80`, `sm90`). The command line and the compiler
//! past the parser stay out of both; this step fails, naming the crate, if
//! one of theirs comes back.

use crate::error::{Error, Result};
use crate::process::{display_command, run_quiet};
use crate::toolchain::Toolchain;
use crate::workspace::Workspace;
use std::collections::BTreeSet;
use std::process::Command;

/// The features of the kernels set, as a user crate names them.
const KERNELS_FEATURES: &str = "kernels,sm80,sm90";

/// Crates only the command line (fusion-cli), the test helpers (`testing`)
/// or fusion-compiler's `compiler` feature bring.
const NOT_AT_RUN_TIME: [&str; 5] = ["clap", "indicatif", "rayon", "handlebars", "prettyplease"];

/// Crates only the build of the shipped kernels (fusion-compiler's `build`
/// feature, in fusion's build script) brings besides those.
const NOT_IN_DEFAULT_BUILD: [&str; 2] = ["bindgen", "cc"];

/// Checks both sets: with the default features, every crate the build
/// compiles (build scripts' dependencies included, proc macros' left out);
/// with the kernels, the run-time dependencies (normal edges, proc macros'
/// own dependencies left out: those run in the compiler, not the program).
/// Prints how many crates each has and refuses any of the lists above.
pub fn check(workspace: &Workspace, toolchain: &Toolchain) -> Result<()> {
    let every_edge_of_the_default = ["-e", "normal,build,no-proc-macro"];
    let not_in_default: Vec<&str> = NOT_AT_RUN_TIME.into_iter().chain(NOT_IN_DEFAULT_BUILD).collect();
    check_set(
        workspace,
        toolchain,
        "fusion with its default features, build scripts' dependencies included",
        &every_edge_of_the_default,
        &not_in_default,
    )?;
    let kernels = [
        "-e",
        "normal,no-proc-macro",
        "--no-default-features",
        "--features",
        KERNELS_FEATURES,
    ];
    check_set(
        workspace,
        toolchain,
        &format!("fusion with `default-features = false, features = [{KERNELS_FEATURES}]`, at run time"),
        &kernels,
        &NOT_AT_RUN_TIME,
    )
}

/// `cargo tree -p fusion` with `args`: prints the number of crate versions
/// and refuses any of `unwanted`.
fn check_set(
    workspace: &Workspace,
    toolchain: &Toolchain,
    what: &str,
    args: &[&str],
    unwanted: &[&str],
) -> Result<()> {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    toolchain.apply_to(&mut command);
    command
        .current_dir(&workspace.root)
        .args(["tree", "-p", "fusion", "--prefix", "none"])
        .args(args);
    let output = run_quiet(&mut command)?;
    // `name vX.Y.Z`, each version of a crate once (a line repeated under
    // another dependent ends in `(*)`).
    let crates: BTreeSet<(&str, &str)> = std::str::from_utf8(&output.stdout)
        .map_err(|e| Error::new(format!("`{}` printed no UTF-8: {e}", display_command(&command))))?
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            Some((words.next()?, words.next().unwrap_or("")))
        })
        .collect();
    println!("{what}: {} crate versions, fusion included", crates.len());
    let found: Vec<&str> = unwanted
        .iter()
        .copied()
        .filter(|name| crates.iter().any(|(crate_name, _)| crate_name == name))
        .collect();
    if found.is_empty() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "{what} depends on {}, which only the command line or the compiler should need (`{}`)",
            found.join(", "),
            display_command(&command)
        )))
    }
}
