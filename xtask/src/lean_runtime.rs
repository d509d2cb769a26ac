//! What a crate that depends on fusion for its kernels alone compiles into
//! its program: `fusion` with `default-features = false` and the features a
//! user of the shipped kernels names (`kernels`, `sm80`, `sm90`). The
//! command line and the compiler past the parser stay out of it; this step
//! fails, naming the crate, if one of theirs comes back.

use crate::error::{Error, Result};
use crate::process::{display_command, run_quiet};
use crate::toolchain::Toolchain;
use crate::workspace::Workspace;
use std::collections::BTreeSet;
use std::process::Command;

/// The features of the lean set, as a user crate names them.
const LEAN_FEATURES: &str = "kernels,sm80,sm90";

/// Crates only the command line (`cli`), the test helpers (`testing`) or
/// fusion-compiler's `compiler` feature bring.
const NOT_AT_RUN_TIME: [&str; 5] = ["clap", "indicatif", "rayon", "handlebars", "prettyplease"];

/// Lists the lean set's run-time dependencies (normal edges, proc macros'
/// own dependencies left out: those run in the compiler, not the program),
/// prints how many there are and refuses any of [`NOT_AT_RUN_TIME`].
pub fn check(workspace: &Workspace, toolchain: &Toolchain) -> Result<()> {
    let mut command = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    toolchain.apply_to(&mut command);
    command.current_dir(&workspace.root).args([
        "tree",
        "-p",
        "fusion",
        "-e",
        "normal,no-proc-macro",
        "--no-default-features",
        "--features",
        LEAN_FEATURES,
        "--prefix",
        "none",
    ]);
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
    println!(
        "fusion with `default-features = false, features = [{LEAN_FEATURES}]`: {} crate versions at run time, fusion included",
        crates.len()
    );
    let unwanted: Vec<&str> = NOT_AT_RUN_TIME
        .into_iter()
        .filter(|name| crates.iter().any(|(crate_name, _)| crate_name == name))
        .collect();
    if unwanted.is_empty() {
        Ok(())
    } else {
        Err(Error::new(format!(
            "the lean run time depends on {} (`{}`), which only the command line or the compiler should need",
            unwanted.join(", "),
            display_command(&command)
        )))
    }
}
