//! The two ways `fusion_graph!` can find the build script's output wanting:
//! no generated file for the graph, or one generated from other tokens.
//! Compiled and compared with the checked-in `tests/generated/*.stderr`
//! (regenerate with `TRYBUILD=overwrite`).
//!
//! The macro reads `OUT_DIR` from the compiler's environment, which the
//! compile-fail builds inherit from this process, so this test points it at
//! a directory it fills itself. It is a test binary of its own so that no
//! other test (`tests/ui/no_build_script.rs` needs `OUT_DIR` unset) sees it.

use std::fs;
use std::path::PathBuf;

/// Stands in for the build script's `fusion_graphs/Stale.rs`: the names the
/// expansion re-exports, and a fingerprint that matches no graph's tokens.
const STALE_WRAPPERS: &str = "\
pub const FINGERPRINT: u64 = 0;
pub struct Stale;
pub struct StaleWeights;
";

#[test]
fn generated_file_missing_or_stale() {
    // Under the target directory, not a random temporary one: a fixed place
    // that cargo clean removes.
    let out_dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fusion-macros-generated-files");
    let graphs = out_dir.join("fusion_graphs");
    if graphs.exists() {
        fs::remove_dir_all(&graphs).expect("clear the generated-graphs directory of a previous run");
    }
    fs::create_dir_all(&graphs).expect("create the generated-graphs directory");
    // `Unlisted` is deliberately left without a file.
    fs::write(graphs.join("Stale.rs"), STALE_WRAPPERS).expect("write the stale wrappers");

    // SAFETY: set before any thread of this process reads the environment;
    // this binary has no other test, and trybuild's builds start after it.
    unsafe { std::env::set_var("OUT_DIR", &out_dir) };
    trybuild::TestCases::new().compile_fail("tests/generated/*.rs");
}
