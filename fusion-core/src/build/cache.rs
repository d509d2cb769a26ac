//! The content-addressed object cache that keeps unchanged kernels away from
//! nvcc.
//!
//! An object lives at `<cache dir>/<key>.o`, where the key hashes everything
//! that can change it (see `compile::unit_key`). The cache is shared by every
//! profile and crate of a workspace, and by builds running at the same time,
//! so files only ever appear by an atomic rename of a complete file written
//! next to them; a reader sees the whole object or none. An object that is
//! there but not a complete ELF file (a disk filled up, a crash before the
//! rename of a copy made by hand) is treated as missing.

use super::BuildError;
use sha2::{Digest, Sha256};
use std::fmt;
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// A SHA-256 cache key.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheKey([u8; 32]);

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CacheKey({self})")
    }
}

/// Builds a key from labelled fields. Labels and values are length-prefixed,
/// so no two different field lists hash the same bytes.
pub struct KeyHasher(Sha256);

impl KeyHasher {
    /// `domain` separates kinds of keys (objects, bindings, archives) and
    /// carries a format version to bump when what goes into a key changes.
    pub fn new(domain: &str) -> KeyHasher {
        let mut hasher = KeyHasher(Sha256::new());
        hasher.field("domain", domain.as_bytes());
        hasher
    }

    pub fn field(&mut self, label: &str, value: &[u8]) -> &mut KeyHasher {
        for part in [label.as_bytes(), value] {
            self.0.update((part.len() as u64).to_le_bytes());
            self.0.update(part);
        }
        self
    }

    pub fn finish(self) -> CacheKey {
        CacheKey(self.0.finalize().into())
    }
}

/// Every file under the include root, read once per build: their paths and
/// contents are part of every unit's key.
#[derive(Clone, Debug)]
pub struct HeaderTree {
    pub root: PathBuf,
    /// Relative paths, '/'-separated and sorted.
    pub files: Vec<String>,
    pub digest: CacheKey,
}

impl HeaderTree {
    /// Reads every file under `root`, skipping hidden files and editor
    /// backups (`.name`, `name~`), which nothing includes.
    pub fn read(root: &Path) -> Result<HeaderTree, BuildError> {
        if !root.is_dir() {
            return Err(BuildError::Config(format!(
                "the kernel include directory {} does not exist",
                root.display()
            )));
        }
        let mut files = Vec::new();
        let mut pending = vec![root.to_owned()];
        while let Some(dir) = pending.pop() {
            let entries = std::fs::read_dir(&dir).map_err(BuildError::io("cannot list", &dir))?;
            for entry in entries {
                let entry = entry.map_err(BuildError::io("cannot list", &dir))?;
                let name = entry.file_name();
                let name = name.to_string_lossy();
                if name.starts_with('.') || name.ends_with('~') {
                    continue;
                }
                let path = entry.path();
                if path.is_dir() {
                    pending.push(path);
                } else {
                    let contents = std::fs::read(&path).map_err(BuildError::io("cannot read", &path))?;
                    let relative = path.strip_prefix(root).unwrap_or(&path);
                    let relative = relative
                        .components()
                        .map(|c| c.as_os_str().to_string_lossy())
                        .collect::<Vec<_>>()
                        .join("/");
                    files.push((relative, contents));
                }
            }
        }
        files.sort();
        let mut hasher = KeyHasher::new("fusion-headers-v1");
        for (path, contents) in &files {
            hasher.field(path, contents);
        }
        Ok(HeaderTree {
            root: root.to_owned(),
            files: files.into_iter().map(|(path, _)| path).collect(),
            digest: hasher.finish(),
        })
    }
}

/// What the cache holds for a key.
#[derive(Debug, PartialEq)]
pub enum Lookup {
    Hit(PathBuf),
    Miss,
    /// There was a file, but not a usable object; it has been removed.
    Corrupt(String),
}

/// A directory of objects named by their key.
#[derive(Clone, Debug)]
pub struct ObjectCache {
    pub dir: PathBuf,
}

impl ObjectCache {
    /// Opens (creating it if needed) a cache directory, and removes what
    /// interrupted builds left there (see [`remove_abandoned_temps`]).
    pub fn open(dir: &Path) -> Result<ObjectCache, BuildError> {
        std::fs::create_dir_all(dir).map_err(BuildError::io("cannot create the cache directory", dir))?;
        remove_abandoned_temps(dir);
        Ok(ObjectCache { dir: dir.to_owned() })
    }

    pub fn object_path(&self, key: CacheKey) -> PathBuf {
        self.dir.join(format!("{key}.o"))
    }

    /// Finds a complete object for `key`. A damaged one is deleted so the
    /// caller rebuilds it.
    pub fn lookup(&self, key: CacheKey) -> Lookup {
        let path = self.object_path(key);
        if !path.exists() {
            return Lookup::Miss;
        }
        match check_object(&path) {
            Ok(()) => Lookup::Hit(path),
            Err(reason) => {
                let _ = std::fs::remove_file(&path);
                Lookup::Corrupt(format!("{}: {reason}", path.display()))
            }
        }
    }

    /// A fresh path in the cache directory for a compiler to write to;
    /// [`ObjectCache::commit`] moves it into place.
    pub fn temp_path(&self, key: CacheKey) -> PathBuf {
        temp_sibling(&self.object_path(key))
    }

    /// Checks the object written at `temp` and renames it to the key's path.
    pub fn commit(&self, temp: &Path, key: CacheKey) -> Result<PathBuf, BuildError> {
        if let Err(reason) = check_object(temp) {
            let _ = std::fs::remove_file(temp);
            return Err(BuildError::Config(format!(
                "nvcc reported success but its object is unusable ({reason})"
            )));
        }
        let path = self.object_path(key);
        std::fs::rename(temp, &path).map_err(BuildError::io("cannot move the object into", &path))?;
        Ok(path)
    }

    /// Reads a small cached file (not an object), if present and non-empty.
    pub fn read_file(&self, name: &str) -> Option<Vec<u8>> {
        std::fs::read(self.dir.join(name))
            .ok()
            .filter(|bytes| !bytes.is_empty())
    }

    /// Stores a small cached file atomically.
    pub fn write_file(&self, name: &str, contents: &[u8]) -> Result<(), BuildError> {
        write_atomically(&self.dir.join(name), contents)
    }
}

/// `dir/.<name>.<pid>.<n>.tmp`: unique per process and call, in the same
/// directory as `path` so the final rename stays on one file system.
fn temp_sibling(path: &Path) -> PathBuf {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.{n}.tmp", std::process::id()))
}

/// A temp file older than this is abandoned whoever wrote it: no nvcc run
/// takes a day.
const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 60 * 60);

/// Removes the temp files (`.<name>.<pid>.<n>.tmp`) of builds that were
/// interrupted (killed, out of disk) before their rename: those whose
/// process is gone (where `/proc` says so) or that are older than a day.
/// A running build's temp files are left alone, since another build may be
/// about to rename them. Lookups never read temp files, so this only saves
/// space. Returns how many were removed.
pub fn remove_abandoned_temps(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let proc_fs = Path::new("/proc/self").exists();
    let mut removed = 0;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else {
            continue;
        };
        // `<name>.<pid>.<n>`: the pid is the second field from the end.
        let pid = inner.rsplit('.').nth(1).and_then(|p| p.parse::<u32>().ok());
        let Some(pid) = pid else { continue };
        let writer_gone = proc_fs && !Path::new("/proc").join(pid.to_string()).exists();
        let too_old = entry
            .metadata()
            .and_then(|m| m.modified())
            .ok()
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > ABANDONED_AFTER);
        if (writer_gone || too_old) && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    removed
}

/// Writes `contents` to `path` by writing a sibling and renaming it.
pub fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), BuildError> {
    let temp = temp_sibling(path);
    std::fs::write(&temp, contents).map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        BuildError::Io {
            action: "cannot write",
            path: temp.clone(),
            source: e,
        }
    })?;
    std::fs::rename(&temp, path).map_err(|e| {
        let _ = std::fs::remove_file(&temp);
        BuildError::Io {
            action: "cannot write",
            path: path.to_owned(),
            source: e,
        }
    })
}

/// Writes `contents` unless the file already holds exactly them, so an
/// unchanged file keeps its modification time.
pub fn write_if_changed(path: &Path, contents: &[u8]) -> Result<(), BuildError> {
    if std::fs::read(path).is_ok_and(|old| old == contents) {
        return Ok(());
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).map_err(BuildError::io("cannot create", dir))?;
    }
    write_atomically(path, contents)
}

/// Whether `path` is a complete ELF relocatable: the magic number, and a
/// section header table that ends inside the file. Assemblers put that
/// table last, so a truncated object fails the second check.
pub fn check_object(path: &Path) -> Result<(), String> {
    let len = std::fs::metadata(path).map_err(|e| e.to_string())?.len();
    let mut header = [0u8; 64];
    let read = std::fs::File::open(path)
        .and_then(|mut f| {
            let mut total = 0;
            while total < header.len() {
                match f.read(&mut header[total..])? {
                    0 => break,
                    n => total += n,
                }
            }
            Ok(total)
        })
        .map_err(|e| e.to_string())?;
    check_elf_header(&header[..read], len)
}

fn check_elf_header(header: &[u8], file_len: u64) -> Result<(), String> {
    if file_len == 0 {
        return Err("the file is empty".to_owned());
    }
    if header.len() < 52 || header[..4] != *b"\x7fELF" {
        return Err("not an ELF object".to_owned());
    }
    let little = match header[5] {
        1 => true,
        2 => false,
        _ => return Err("unknown ELF byte order".to_owned()),
    };
    let u16_at = |at: usize| {
        let bytes = [header[at], header[at + 1]];
        u64::from(if little {
            u16::from_le_bytes(bytes)
        } else {
            u16::from_be_bytes(bytes)
        })
    };
    let u32_at = |at: usize| {
        let bytes: [u8; 4] = header[at..at + 4].try_into().unwrap();
        u64::from(if little {
            u32::from_le_bytes(bytes)
        } else {
            u32::from_be_bytes(bytes)
        })
    };
    let (section_table, entry_size, entries) = match header[4] {
        1 => (u32_at(0x20), u16_at(0x2e), u16_at(0x30)),
        2 if header.len() >= 64 => {
            let bytes: [u8; 8] = header[0x28..0x30].try_into().unwrap();
            let offset = if little {
                u64::from_le_bytes(bytes)
            } else {
                u64::from_be_bytes(bytes)
            };
            (offset, u16_at(0x3a), u16_at(0x3c))
        }
        _ => return Err("truncated ELF header".to_owned()),
    };
    if entries == 0 {
        return Err("the object has no sections".to_owned());
    }
    let end = section_table.saturating_add(entry_size.saturating_mul(entries));
    if end > file_len {
        return Err(format!(
            "truncated: the section table ends at byte {end} but the file has {file_len}"
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp_dir(tag: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("fusion-cache-test-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    /// A minimal but complete little-endian ELF64 file: the 64-byte header
    /// followed by `sections` 64-byte section headers.
    fn tiny_elf(sections: u16) -> Vec<u8> {
        let mut bytes = vec![0u8; 64];
        bytes[..4].copy_from_slice(b"\x7fELF");
        bytes[4] = 2; // 64-bit
        bytes[5] = 1; // little endian
        bytes[0x28..0x30].copy_from_slice(&64u64.to_le_bytes());
        bytes[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
        bytes[0x3c..0x3e].copy_from_slice(&sections.to_le_bytes());
        bytes.resize(64 + 64 * usize::from(sections), 0);
        bytes
    }

    fn key(text: &str) -> CacheKey {
        let mut h = KeyHasher::new("test");
        h.field("text", text.as_bytes());
        h.finish()
    }

    #[test]
    fn keys_are_stable_and_field_boundaries_matter() {
        assert_eq!(key("abc"), key("abc"));
        assert_ne!(key("abc"), key("abd"));
        // The key of a fixed input never changes between runs, machines or
        // releases (checked against an independent SHA-256 of the same
        // length-prefixed fields).
        assert_eq!(
            key("abc").to_string(),
            "9760d22ffe8c6c45c718f17d83feaeefaa628676b3333d78177bc5e9ab97d383"
        );
        let mut ab_c = KeyHasher::new("test");
        ab_c.field("ab", b"c");
        let mut a_bc = KeyHasher::new("test");
        a_bc.field("a", b"bc");
        assert_ne!(ab_c.finish(), a_bc.finish());
        assert_ne!(KeyHasher::new("one").finish(), KeyHasher::new("two").finish());
    }

    #[test]
    fn one_changed_header_byte_changes_the_digest() {
        let dir = temp_dir("headers");
        std::fs::create_dir_all(dir.join("fusion")).unwrap();
        std::fs::write(dir.join("fusion/epilogue.cuh"), "struct Bias {};\n").unwrap();
        std::fs::write(dir.join("fusion/mainloop.cuh"), "struct Mma {};\n").unwrap();
        let first = HeaderTree::read(&dir).unwrap();
        assert_eq!(first.files.len(), 2);
        assert_eq!(first.files, ["fusion/epilogue.cuh", "fusion/mainloop.cuh"]);
        assert_eq!(HeaderTree::read(&dir).unwrap().digest, first.digest);
        std::fs::write(dir.join("fusion/epilogue.cuh"), "struct Bias {}:\n").unwrap();
        let edited = HeaderTree::read(&dir).unwrap();
        assert_ne!(edited.digest, first.digest);
        // Editor leftovers are not headers.
        std::fs::write(dir.join("fusion/.epilogue.cuh.swp"), "junk").unwrap();
        std::fs::write(dir.join("fusion/epilogue.cuh~"), "junk").unwrap();
        assert_eq!(HeaderTree::read(&dir).unwrap().digest, edited.digest);
        // A renamed file is a different tree even with the same bytes.
        std::fs::rename(dir.join("fusion/mainloop.cuh"), dir.join("fusion/mainloop2.cuh")).unwrap();
        assert_ne!(HeaderTree::read(&dir).unwrap().digest, edited.digest);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_missing_include_dir_is_an_error() {
        let err = HeaderTree::read(Path::new("/nonexistent/fusion/include")).unwrap_err();
        assert!(err.to_string().contains("does not exist"), "{err}");
    }

    #[test]
    fn elf_check_accepts_whole_objects_and_rejects_damaged_ones() {
        let whole = tiny_elf(3);
        assert_eq!(check_elf_header(&whole, whole.len() as u64), Ok(()));
        let err = check_elf_header(&whole, whole.len() as u64 - 1).unwrap_err();
        assert!(err.starts_with("truncated"), "{err}");
        assert!(check_elf_header(&[], 0).is_err());
        assert!(
            check_elf_header(&[0u8; 64], 64)
                .unwrap_err()
                .contains("not an ELF")
        );
        assert!(check_elf_header(&tiny_elf(0), 64).is_err());
    }

    #[test]
    fn commit_is_atomic_and_corrupt_objects_are_dropped() {
        let dir = temp_dir("objects");
        let cache = ObjectCache::open(&dir).unwrap();
        let k = key("unit");
        assert_eq!(cache.lookup(k), Lookup::Miss);

        let temp = cache.temp_path(k);
        assert_eq!(temp.parent(), Some(dir.as_path()));
        assert_ne!(temp, cache.temp_path(k), "temp paths are unique per call");
        std::fs::write(&temp, tiny_elf(2)).unwrap();
        let path = cache.commit(&temp, k).unwrap();
        assert!(!temp.exists());
        assert_eq!(cache.lookup(k), Lookup::Hit(path.clone()));

        // Truncate it, as a full disk would: it is now a miss, and gone.
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        assert!(matches!(cache.lookup(k), Lookup::Corrupt(reason) if reason.contains("truncated")));
        assert!(!path.exists());
        assert_eq!(cache.lookup(k), Lookup::Miss);

        // A zero-length file (a crash at the wrong moment) likewise.
        std::fs::write(&path, b"").unwrap();
        assert!(matches!(cache.lookup(k), Lookup::Corrupt(reason) if reason.contains("empty")));

        // A broken compiler output is never committed.
        let temp = cache.temp_path(k);
        std::fs::write(&temp, b"garbage").unwrap();
        assert!(cache.commit(&temp, k).is_err());
        assert!(!temp.exists() && !path.exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_interrupted_build_leaves_a_temp_file_that_is_ignored_then_removed() {
        let dir = temp_dir("interrupted");
        let k = key("unit");
        let object = format!("{k}.o");
        // A build killed between nvcc's write and the rename: a process that
        // no longer exists (above any pid_max) left half an object.
        let abandoned = dir.join(format!(".{object}.4294967295.0.tmp"));
        std::fs::write(&abandoned, &tiny_elf(4)[..100]).unwrap();
        // A build still running (this process) has one in flight.
        let in_flight = dir.join(format!(".{object}.{}.7.tmp", std::process::id()));
        std::fs::write(&in_flight, tiny_elf(4)).unwrap();
        // Something else that looks nothing like ours.
        std::fs::write(dir.join(".notes.tmp"), b"").unwrap();

        let cache = ObjectCache::open(&dir).unwrap();
        assert_eq!(cache.lookup(k), Lookup::Miss, "temp files are never hits");
        if Path::new("/proc/self").exists() {
            assert!(!abandoned.exists(), "the dead build's temp file is removed");
        }
        assert!(in_flight.exists(), "a live build's temp file is kept");
        assert!(dir.join(".notes.tmp").exists());
        // The build that follows works as if nothing had happened.
        let temp = cache.temp_path(k);
        std::fs::write(&temp, tiny_elf(2)).unwrap();
        let path = cache.commit(&temp, k).unwrap();
        assert_eq!(cache.lookup(k), Lookup::Hit(path));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn atomic_writes_leave_no_temp_files_and_skip_unchanged_content() {
        let dir = temp_dir("atomic");
        let file = dir.join("fusion_kernels.h");
        write_if_changed(&file, b"one").unwrap();
        let modified = std::fs::metadata(&file).unwrap().modified().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        write_if_changed(&file, b"one").unwrap();
        assert_eq!(std::fs::metadata(&file).unwrap().modified().unwrap(), modified);
        write_if_changed(&file, b"two").unwrap();
        assert_eq!(std::fs::read(&file).unwrap(), b"two");
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["fusion_kernels.h"]);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn concurrent_writers_never_expose_a_partial_file() {
        let dir = temp_dir("race");
        let cache = ObjectCache::open(&dir).unwrap();
        let k = key("raced");
        let big = tiny_elf(2000);
        std::thread::scope(|scope| {
            for _ in 0..4 {
                scope.spawn(|| {
                    for _ in 0..20 {
                        let temp = cache.temp_path(k);
                        std::fs::write(&temp, &big).unwrap();
                        cache.commit(&temp, k).unwrap();
                    }
                });
            }
            scope.spawn(|| {
                for _ in 0..200 {
                    if let Ok(bytes) = std::fs::read(cache.object_path(k)) {
                        assert_eq!(bytes.len(), big.len());
                    }
                }
            });
        });
        assert!(matches!(cache.lookup(k), Lookup::Hit(_)));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
