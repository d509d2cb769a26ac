//! The macro links fusion-compiler's parser and IR, not the compiler behind
//! them: editors expand macros constantly, so the macro should build as
//! little as it can. Checked on the dependency graph cargo resolves for this
//! crate alone (`cargo tree -p fusion-macros -e normal`).

use std::process::Command;

/// Crates only the planner, renderer, reference or build driver need.
const COMPILER_ONLY: &[&str] = &[
    "handlebars",
    "rayon",
    "rand",
    "serde_json",
    "prettyplease",
    "half",
    "cc",
    "bindgen",
];

#[test]
fn macro_links_only_the_parser_and_ir() {
    let output = Command::new(env!("CARGO"))
        .args(["tree", "-p", "fusion-macros", "-e", "normal", "--prefix", "none"])
        // `{p}` is `name version (source)`, `{f}` the features enabled on it.
        .args(["--format", "{p}|{f}"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "cargo tree failed:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let packages: Vec<(&str, &str)> = stdout
        .lines()
        .filter_map(|line| {
            let (package, features) = line.split_once('|')?;
            Some((package.split_whitespace().next()?, features.trim()))
        })
        .collect();

    let core_features: Vec<&str> = packages
        .iter()
        .filter(|(name, _)| *name == "fusion-compiler")
        .map(|(_, features)| *features)
        .collect();
    assert!(
        !core_features.is_empty(),
        "fusion-compiler is not in the tree:\n{stdout}"
    );
    assert!(
        core_features.iter().all(|f| f.is_empty()),
        "fusion-macros enables fusion-compiler features {core_features:?}; it needs none \
         (`syntax`, `ir`, `diagnostic` and `generated` are always present)"
    );
    let linked: Vec<&str> = packages
        .iter()
        .map(|(name, _)| *name)
        .filter(|name| COMPILER_ONLY.contains(name))
        .collect();
    assert!(linked.is_empty(), "fusion-macros links {linked:?}:\n{stdout}");
}
