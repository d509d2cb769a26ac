//! Where the repository is, and how to show its paths to the user.

use std::path::{Path, PathBuf};

/// The repository checkout xtask was built from.
pub struct Workspace {
    pub root: PathBuf,
}

impl Workspace {
    /// xtask always runs from the checkout it was compiled in (`cargo xtask`
    /// is `cargo run -p xtask`), so the root is the parent of its manifest.
    pub fn locate() -> Self {
        let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
        let root = manifest_dir.parent().unwrap_or(manifest_dir).to_path_buf();
        Workspace { root }
    }

    /// `target/toolchain`: everything the bootstrap installs lives here, so
    /// `cargo clean` removes it and nothing outside the checkout changes.
    pub fn toolchain_dir(&self) -> PathBuf {
        self.root.join("target").join("toolchain")
    }

    pub fn graphs_dir(&self) -> PathBuf {
        self.root.join("graphs")
    }

    /// A path relative to the root when it lies inside it, for short messages.
    pub fn display(&self, path: &Path) -> String {
        path.strip_prefix(&self.root)
            .unwrap_or(path)
            .display()
            .to_string()
    }
}
