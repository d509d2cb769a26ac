//! Bakes in the commit being built, for `fusion bench`'s report.

use std::path::Path;
use std::process::Command;

fn main() {
    println!("cargo:rustc-env=FUSION_GIT_COMMIT={}", git_commit());
}

/// `git rev-parse --short HEAD` of the checkout being built, or
/// `FUSION_GIT_COMMIT` from the environment when set (a build of an exported
/// tree); "unknown" outside a git checkout. The lines it prints make cargo
/// run this script again when HEAD moves, a commit or a checkout, and not
/// otherwise.
fn git_commit() -> String {
    println!("cargo:rerun-if-env-changed=FUSION_GIT_COMMIT");
    if let Ok(commit) = std::env::var("FUSION_GIT_COMMIT") {
        return commit;
    }
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        let text = String::from_utf8(out.stdout).ok()?;
        out.status.success().then(|| text.trim().to_string())
    };
    let Some(commit) = git(&["rev-parse", "--short", "HEAD"]) else {
        return "unknown".to_string();
    };
    // HEAD names the branch; the branch's ref, loose or packed, the commit.
    let branch = git(&["rev-parse", "--symbolic-full-name", "HEAD"]).filter(|r| r.starts_with("refs/"));
    for name in ["HEAD", "packed-refs"].into_iter().chain(branch.as_deref()) {
        // A path cargo cannot find would make it rerun this every build.
        if let Some(path) = git(&["rev-parse", "--git-path", name]).filter(|p| Path::new(p).exists()) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    commit
}
