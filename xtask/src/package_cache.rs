//! Before the `cargo package` step: cargo verifies each published crate
//! against the others' packages through a local registry under
//! `target/package/tmp-registry`, and extracts those packages into
//! `$CARGO_HOME/registry/src/-<hash>/`, the hash taken from the registry's
//! path alone. An extraction stays there, and cargo reuses it whenever the
//! same path and version come back: a second checkout in the folder of an
//! earlier one (a CI clone in the same place) would verify against the
//! earlier tree's sources. This step removes our crates' extractions from
//! such local registries so that each run extracts the packages it made.
//!
//! Their builds go stale the same way: cargo builds the packages in the
//! workspace's target folder, and a package's files as extracted from the
//! local registry carry the fixed modification time cargo writes into
//! every `.crate` (2006), older than any earlier build of the same
//! version, so cargo takes that build as fresh and verifies a crate
//! against another's earlier code. The step also runs `cargo clean -p` for our crates, which drops
//! every build of them there (the workspace's own are rebuilt when next
//! needed; the shipped kernels' objects stay in nvcc's cache).

use crate::error::{Error, Result};
use crate::process;
use crate::toolchain::Toolchain;
use crate::workspace::Workspace;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The published crates, whose packages the step verifies.
const PUBLISHED: [&str; 4] = ["fusion-compiler", "fusion-macros", "fusion", "fusion-cli"];

/// Removes `<crate>-<version>` of each published crate from every local
/// registry's extractions (the folders of `registry/src` named `-<hash>`:
/// crates.io's and other named registries' keep their names), printing
/// what it removed, then every build of them in the workspace's target
/// folder.
pub fn forget_stale_extractions(workspace: &Workspace, _: &Toolchain) -> Result<()> {
    match cargo_home().map(|home| home.join("registry").join("src")) {
        Some(sources) => {
            for removed in remove_extractions(&sources, env!("CARGO_PKG_VERSION"))? {
                println!("removed {}", removed.display());
            }
        }
        None => println!("no CARGO_HOME or HOME: no extractions to forget"),
    }
    let mut clean = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    clean.current_dir(&workspace.root).arg("clean");
    for name in PUBLISHED {
        clean.args(["-p", name]);
    }
    process::run_echoing_stderr(&mut clean)
}

fn cargo_home() -> Option<PathBuf> {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))
}

/// The removal itself, below `sources` (`registry/src`); a missing folder
/// has nothing to remove.
fn remove_extractions(sources: &Path, version: &str) -> Result<Vec<PathBuf>> {
    let mut removed = Vec::new();
    let Ok(registries) = std::fs::read_dir(sources) else {
        return Ok(removed);
    };
    for registry in registries.flatten() {
        if !registry.file_name().to_string_lossy().starts_with('-') {
            continue;
        }
        for name in PUBLISHED {
            let extracted = registry.path().join(format!("{name}-{version}"));
            if extracted.is_dir() {
                std::fs::remove_dir_all(&extracted)
                    .map_err(|e| Error::new(format!("cannot remove {}: {e}", extracted.display())))?;
                removed.push(extracted);
            }
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_our_crates_in_local_registries_are_removed() {
        let root = std::env::temp_dir().join(format!("fusion-package-cache-{}", std::process::id()));
        let local = root.join("-14cd1cce6819ff87");
        let crates_io = root.join("index.crates.io-1949cf8c6b5b557f");
        for dir in [
            local.join("fusion-compiler-0.1.0/src"),
            local.join("fusion-macros-0.1.0"),
            local.join("fusion-compiler-0.0.9"),
            local.join("serde-1.0.0"),
            crates_io.join("fusion-macros-0.1.0"),
        ] {
            std::fs::create_dir_all(dir).unwrap();
        }
        let mut removed = remove_extractions(&root, "0.1.0").unwrap();
        removed.sort();
        assert_eq!(
            removed,
            [
                local.join("fusion-compiler-0.1.0"),
                local.join("fusion-macros-0.1.0")
            ]
        );
        // Another version, another crate and crates.io's copies stay.
        for kept in [
            local.join("fusion-compiler-0.0.9"),
            local.join("serde-1.0.0"),
            crates_io.join("fusion-macros-0.1.0"),
        ] {
            assert!(kept.is_dir(), "{}", kept.display());
        }
        assert_eq!(
            remove_extractions(&root.join("missing"), "0.1.0").unwrap(),
            Vec::<PathBuf>::new()
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
