//! Build failures that need neither nvcc nor libclang: an output or cache
//! directory that cannot be created or written. Each is one `BuildError` naming the
//! path and the reason, before any compiler runs.

#![cfg(feature = "build")]

use fusion_compiler::build::{BuildError, CompileOptions, CudaSources, GeneratedFile, compile};
use std::path::{Path, PathBuf};

fn root(tag: &str) -> PathBuf {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fusion-build-errors-{tag}"));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("include")).unwrap();
    root
}

fn sources(root: &Path) -> CudaSources {
    CudaSources {
        units: Vec::new(),
        header: GeneratedFile {
            name: "fusion_kernels.h".to_owned(),
            contents: "#include <stdint.h>\n".to_owned(),
        },
        headers_dir: root.join("include"),
    }
}

fn options(root: &Path, out_dir: PathBuf) -> CompileOptions {
    let mut options = CompileOptions::new(out_dir);
    options.cache_dir = Some(root.join("cache"));
    options.skip_nvcc = true;
    options
}

#[test]
fn an_out_dir_that_cannot_be_created_is_one_clear_error() {
    let root = root("create");
    // A regular file where a directory should be.
    std::fs::write(root.join("not-a-dir"), b"").unwrap();
    let out_dir = root.join("not-a-dir/out");
    let err = compile(&sources(&root), &options(&root, out_dir.clone())).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, BuildError::Io { .. }), "{message}");
    assert!(message.starts_with("cannot create "), "{message}");
    assert!(message.contains(&out_dir.display().to_string()), "{message}");
}

#[test]
fn an_output_path_taken_by_a_directory_is_one_clear_error() {
    // Binds every user, root too: the generated header's name is a
    // non-empty directory, so the header cannot be put in its place.
    let root = root("taken");
    let out_dir = root.join("out");
    std::fs::create_dir_all(out_dir.join("fusion_kernels.h/inside")).unwrap();
    let err = compile(&sources(&root), &options(&root, out_dir.clone())).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, BuildError::Io { .. }), "{message}");
    assert!(message.starts_with("cannot write "), "{message}");
    assert!(
        message.contains(&out_dir.join("fusion_kernels.h").display().to_string()),
        "{message}"
    );
}

/// An existing directory this process cannot create files in: a read-only
/// directory where file permissions bind this user; for root, which they do
/// not bind, sysfs's top directory, where the kernel refuses new files to
/// every user. `None` where neither exists.
fn unwritable_dir(root: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let read_only = root.join("read-only");
    std::fs::create_dir_all(&read_only).unwrap();
    std::fs::set_permissions(&read_only, std::fs::Permissions::from_mode(0o555)).unwrap();
    if std::fs::write(read_only.join("probe"), b"").is_err() {
        return Some(read_only);
    }
    let sys = PathBuf::from("/sys");
    (sys.is_dir() && std::fs::write(sys.join("fusion-probe"), b"").is_err()).then_some(sys)
}

#[test]
fn an_out_dir_that_cannot_be_written_is_one_clear_error() {
    let root = root("write");
    let out_dir =
        unwritable_dir(&root).expect("a directory this user cannot write (a read-only one, or /sys)");
    let err = compile(&sources(&root), &options(&root, out_dir.clone())).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, BuildError::Io { .. }), "{message}");
    assert!(message.starts_with("cannot write "), "{message}");
    assert!(message.contains(&out_dir.display().to_string()), "{message}");
    // sysfs mounted read-only says so instead.
    assert!(
        message.contains("ermission denied") || message.contains("ead-only file system"),
        "{message}"
    );
}

#[test]
fn a_cache_dir_that_cannot_be_created_is_one_clear_error() {
    let root = root("cache");
    std::fs::write(root.join("file"), b"").unwrap();
    let mut options = options(&root, root.join("out"));
    options.cache_dir = Some(root.join("file/cache"));
    let message = compile(&sources(&root), &options).unwrap_err().to_string();
    assert!(
        message.starts_with("cannot create the cache directory "),
        "{message}"
    );
}

/// A cache directory that exists but cannot be written is refused even
/// when every object is already in it: each build takes a writer lock
/// file there (see `build::cache`), so the error names that file.
#[test]
fn a_read_only_cache_dir_is_one_clear_error() {
    let root = root("cache-read-only");
    let cache_dir =
        unwritable_dir(&root).expect("a directory this user cannot write (a read-only one, or /sys)");
    let mut options = options(&root, root.join("out"));
    options.cache_dir = Some(cache_dir.clone());
    let err = compile(&sources(&root), &options).unwrap_err();
    let message = err.to_string();
    assert!(matches!(err, BuildError::Io { .. }), "{message}");
    assert!(
        message.starts_with(&format!(
            "cannot create the lock file {}/.writer-",
            cache_dir.display()
        )),
        "{message}"
    );
    assert!(
        message.contains("ermission denied") || message.contains("ead-only file system"),
        "{message}"
    );
}
