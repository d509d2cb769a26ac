//! The content-addressed object cache that keeps unchanged kernels away from
//! nvcc.
//!
//! An object lives at `<cache dir>/<key>.o`, where the key hashes everything
//! that can change it (see `compile::unit_key`). The cache is shared by every
//! profile and crate of a workspace, and by builds running at the same time
//! (threads or processes, in any PID namespace), so files only ever appear by
//! an atomic rename of a complete, fsynced file written next to them under a
//! name unique to its writer; a reader sees the whole object or none. An
//! object that is there but not a complete ELF file (a disk filled up, a
//! crash before the rename of a copy made by hand) is treated as missing.
//!
//! No lock serializes builds: two builds that miss the same key both compile
//! it and the second rename replaces the first with identical bytes. The one
//! lock is each cache handle's advisory lock on its own `.writer-<id>.lock`
//! file, held for the handle's life: a temp file whose writer's lock can be
//! taken belongs to a build that is gone, whatever its pid was.

use super::BuildError;
use sha2::{Digest, Sha256};
use std::fmt;
use std::fs::{File, TryLockError};
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

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
    /// This handle's lock, which marks its temp files as in use.
    writer: Arc<WriterLock>,
}

impl ObjectCache {
    /// Opens (creating it if needed) a cache directory, takes this handle's
    /// writer lock, and removes what interrupted builds left there (see
    /// [`remove_abandoned_temps`]).
    pub fn open(dir: &Path) -> Result<ObjectCache, BuildError> {
        std::fs::create_dir_all(dir).map_err(BuildError::io("cannot create the cache directory", dir))?;
        let writer = Arc::new(WriterLock::take(dir)?);
        remove_abandoned_temps(dir);
        Ok(ObjectCache {
            dir: dir.to_owned(),
            writer,
        })
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

    /// A fresh path in the cache directory for a compiler to write to,
    /// `.<key>.o.<writer id>.<n>.tmp`; [`ObjectCache::commit`] moves it into
    /// place. It is kept from other builds' clean-up while this handle lives.
    pub fn temp_path(&self, key: CacheKey) -> PathBuf {
        self.temp_for(&format!("{key}.o"))
    }

    /// `.<name>.<writer id>.<n>.tmp` in the cache directory.
    fn temp_for(&self, name: &str) -> PathBuf {
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        self.dir.join(format!(".{name}.{}.{n}.tmp", self.writer.id))
    }

    /// Checks the object written at `temp`, flushes it to disk and renames
    /// it to the key's path.
    pub fn commit(&self, temp: &Path, key: CacheKey) -> Result<PathBuf, BuildError> {
        if let Err(reason) = check_object(temp) {
            let _ = std::fs::remove_file(temp);
            return Err(BuildError::Config(format!(
                "nvcc reported success but its object is unusable ({reason})"
            )));
        }
        // Durable before it is visible: after a crash the name holds the
        // whole object or is absent, on file systems that may reorder a
        // rename before the data it names.
        File::open(temp)
            .and_then(|f| f.sync_all())
            .map_err(BuildError::io("cannot flush", temp))?;
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
        write_through(&self.temp_for(name), &self.dir.join(name), contents)
    }
}

/// Numbers temp files, unique within the process.
static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

/// Unique to this process among every process that may share a directory,
/// in any PID namespace: the pid alone repeats across namespaces (and
/// after reuse), the pid with the time of the first call does not.
fn process_token() -> &'static str {
    static TOKEN: OnceLock<String> = OnceLock::new();
    TOKEN.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        format!("{:x}-{nanos:x}", std::process::id())
    })
}

/// A cache handle's `<dir>/.writer-<id>.lock`, exclusively locked for as
/// long as the handle (and its clones) live; removed when dropped.
#[derive(Debug)]
struct WriterLock {
    /// `w<process token>-<n>`: no dots, so it can sit inside a temp name.
    id: String,
    path: PathBuf,
    _file: File,
}

impl WriterLock {
    fn take(dir: &Path) -> Result<WriterLock, BuildError> {
        loop {
            let id = format!(
                "w{}-{}",
                process_token(),
                TEMP_COUNTER.fetch_add(1, Ordering::Relaxed)
            );
            let path = writer_lock_path(dir, &id);
            let file =
                File::create_new(&path).map_err(BuildError::io("cannot create the lock file", &path))?;
            file.lock().map_err(BuildError::io("cannot lock", &path))?;
            // Another build's clean-up may have found the file between its
            // creation and the lock, taken it for a dead writer's and
            // removed it; then this lock guards nothing: take another.
            if same_file(&file, &path) {
                return Ok(WriterLock {
                    id,
                    path,
                    _file: file,
                });
            }
        }
    }
}

impl Drop for WriterLock {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

fn writer_lock_path(dir: &Path, id: &str) -> PathBuf {
    dir.join(format!(".writer-{id}.lock"))
}

/// Whether `path` still names the file open as `file`.
#[cfg(unix)]
fn same_file(file: &File, path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    match (file.metadata(), std::fs::metadata(path)) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// Elsewhere an open file cannot be removed, so the path is still it.
#[cfg(not(unix))]
fn same_file(_: &File, path: &Path) -> bool {
    path.exists()
}

/// Whether the writer `id` of a cache directory is alive: its lock file
/// exists and is locked. `None` when that cannot be told (the file system
/// has no advisory locks).
fn writer_alive(dir: &Path, id: &str) -> Option<bool> {
    let Ok(file) = File::open(writer_lock_path(dir, id)) else {
        return Some(false);
    };
    match file.try_lock() {
        Ok(()) => Some(false),
        Err(TryLockError::WouldBlock) => Some(true),
        Err(TryLockError::Error(_)) => None,
    }
}

/// A temp file older than this is abandoned whoever wrote it: no nvcc run
/// takes a day. Only used where a writer's lock cannot tell.
const ABANDONED_AFTER: std::time::Duration = std::time::Duration::from_secs(24 * 60 * 60);

/// Removes the temp files (`.<name>.<writer id>.<n>.tmp`) of builds that
/// were interrupted (killed, out of disk) before their rename, and their
/// writer lock files: a temp file is abandoned when its writer's lock file
/// is gone or not locked, which holds across PID namespaces and pid reuse.
/// A temp file whose writer cannot be told (no advisory locks, or a name
/// from another scheme) is removed once older than a day. Lookups never
/// read temp files, so this only saves space. Returns how many temp files
/// were removed.
pub fn remove_abandoned_temps(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut removed = 0;
    let mut dead_writers = Vec::new();
    for entry in entries.flatten() {
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if let Some(id) = name
            .strip_prefix(".writer-")
            .and_then(|n| n.strip_suffix(".lock"))
        {
            if writer_alive(dir, id) == Some(false) {
                dead_writers.push(entry.path());
            }
            continue;
        }
        let Some(inner) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".tmp")) else {
            continue;
        };
        // `<name>.<writer id>.<n>`: the writer is the second field from the end.
        let alive = inner
            .rsplit('.')
            .nth(1)
            .filter(|id| id.starts_with('w'))
            .and_then(|id| writer_alive(dir, id));
        let abandoned = match alive {
            Some(alive) => !alive,
            None => entry
                .metadata()
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age > ABANDONED_AFTER),
        };
        if abandoned && std::fs::remove_file(entry.path()).is_ok() {
            removed += 1;
        }
    }
    for lock in dead_writers {
        let _ = std::fs::remove_file(lock);
    }
    removed
}

/// `dir/.<name>.<process token>.<n>.tmp`: unique per process and call, in
/// the same directory as `path` so the final rename stays on one file
/// system.
fn temp_sibling(path: &Path) -> PathBuf {
    let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{}.{n}.tmp", process_token()))
}

/// Writes `contents` to `path` by writing a sibling, flushing it to disk
/// and renaming it.
pub fn write_atomically(path: &Path, contents: &[u8]) -> Result<(), BuildError> {
    write_through(&temp_sibling(path), path, contents)
}

/// Writes `contents` to `temp`, flushes it to disk and renames it to `path`.
fn write_through(temp: &Path, path: &Path, contents: &[u8]) -> Result<(), BuildError> {
    File::create(temp)
        .and_then(|mut f| {
            f.write_all(contents)?;
            f.sync_all()
        })
        .map_err(|e| {
            let _ = std::fs::remove_file(temp);
            BuildError::Io {
                action: "cannot write",
                path: temp.to_owned(),
                source: e,
            }
        })?;
    std::fs::rename(temp, path).map_err(|e| {
        let _ = std::fs::remove_file(temp);
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
/// table last, so a truncated object fails the second check. The length
/// and the header come from one open file, so a rename over `path` between
/// the two cannot pair one file's header with another's length.
pub fn check_object(path: &Path) -> Result<(), String> {
    let mut file = File::open(path).map_err(|e| e.to_string())?;
    let len = file.metadata().map_err(|e| e.to_string())?.len();
    let mut header = [0u8; 64];
    let mut read = 0;
    while read < header.len() {
        match file.read(&mut header[read..]).map_err(|e| e.to_string())? {
            0 => break,
            n => read += n,
        }
    }
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

    /// The names in `dir`, sorted.
    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn an_interrupted_build_leaves_a_temp_file_that_is_ignored_then_removed() {
        let dir = temp_dir("interrupted");
        let k = key("unit");
        let object = format!("{k}.o");
        // A build killed between nvcc's write and the rename left half an
        // object, and its lock file, no longer locked by anyone.
        let dead = "w1-2-3";
        let abandoned = dir.join(format!(".{object}.{dead}.0.tmp"));
        std::fs::write(&abandoned, &tiny_elf(4)[..100]).unwrap();
        std::fs::write(dir.join(format!(".writer-{dead}.lock")), b"").unwrap();
        // One killed so early it left no lock file at all.
        let unlocked = dir.join(format!(".{object}.w4-5-6.0.tmp"));
        std::fs::write(&unlocked, b"\x7fELF").unwrap();
        // A build still running (another handle, maybe another process or
        // PID namespace) has one in flight.
        let running = ObjectCache::open(&dir).unwrap();
        let in_flight = running.temp_path(k);
        std::fs::write(&in_flight, tiny_elf(4)).unwrap();
        // A temp file of another naming scheme, and something else that
        // looks nothing like ours: left alone (the first until a day old).
        std::fs::write(dir.join(format!(".{object}.4242.0.tmp")), b"").unwrap();
        std::fs::write(dir.join(".notes.tmp"), b"").unwrap();

        let cache = ObjectCache::open(&dir).unwrap();
        assert_eq!(cache.lookup(k), Lookup::Miss, "temp files are never hits");
        assert!(!abandoned.exists(), "the dead build's temp file is removed");
        assert!(
            !dir.join(format!(".writer-{dead}.lock")).exists(),
            "and its lock file"
        );
        assert!(!unlocked.exists(), "a temp file with no writer lock is removed");
        assert!(in_flight.exists(), "a live build's temp file is kept");
        assert!(dir.join(format!(".{object}.4242.0.tmp")).exists());
        assert!(dir.join(".notes.tmp").exists());
        // The running build finishes as if nothing had happened.
        let path = running.commit(&in_flight, k).unwrap();
        assert_eq!(cache.lookup(k), Lookup::Hit(path));
        // Dropping the handles removes their lock files.
        drop((running, cache));
        assert!(
            names(&dir).iter().all(|n| !n.starts_with(".writer-")),
            "{:?}",
            names(&dir)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_writer_lock_is_held_while_any_clone_of_its_handle_lives() {
        let dir = temp_dir("writer-lock");
        let cache = ObjectCache::open(&dir).unwrap();
        let id = cache.writer.id.clone();
        assert_eq!(writer_alive(&dir, &id), Some(true));
        let clone = cache.clone();
        drop(cache);
        assert_eq!(writer_alive(&dir, &id), Some(true));
        drop(clone);
        assert_eq!(writer_alive(&dir, &id), Some(false));
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

    /// An object whose padding is all `tag`, so that a file mixing two
    /// writers' bytes is told from either writer's whole file.
    fn tagged_elf(sections: u16, tag: u8) -> Vec<u8> {
        let mut bytes = tiny_elf(sections);
        bytes[64..].fill(tag);
        bytes
    }

    /// Whether `bytes` are one writer's whole [`tagged_elf`].
    fn is_one_whole_object(bytes: &[u8], sections: u16) -> bool {
        bytes.len() == 64 + 64 * usize::from(sections)
            && bytes[..64] == tiny_elf(sections)[..64]
            && bytes[64..].iter().all(|&b| b == bytes[64])
    }

    #[test]
    fn concurrent_writers_never_expose_a_partial_file() {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        /// Tells the writers to stop when the reader returns or panics.
        struct Stop<'a>(&'a AtomicBool);
        impl Drop for Stop<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Relaxed);
            }
        }
        let dir = temp_dir("race");
        let cache = ObjectCache::open(&dir).unwrap();
        let k = key("raced");
        const SECTIONS: u16 = 2000;
        // Writers keep committing until the reader has read this many
        // committed objects, so reads happen while renames do.
        const READS: usize = 50;
        let whole_reads = AtomicUsize::new(0);
        let reader_done = AtomicBool::new(false);
        std::thread::scope(|scope| {
            for thread in 0..4u8 {
                let (cache, reader_done) = (&cache, &reader_done);
                scope.spawn(move || {
                    let mut round = 0u8;
                    while round < 20 || !reader_done.load(Ordering::Relaxed) {
                        let temp = cache.temp_path(k);
                        std::fs::write(&temp, tagged_elf(SECTIONS, thread * 64 + round % 64)).unwrap();
                        cache.commit(&temp, k).unwrap();
                        round = round.wrapping_add(1);
                    }
                });
            }
            scope.spawn(|| {
                let _stop = Stop(&reader_done);
                let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
                while whole_reads.load(Ordering::Relaxed) < READS {
                    assert!(
                        std::time::Instant::now() < deadline,
                        "no committed object appeared"
                    );
                    // Missing before the first commit; never partial after.
                    if let Ok(bytes) = std::fs::read(cache.object_path(k)) {
                        assert!(
                            is_one_whole_object(&bytes, SECTIONS),
                            "a partial or mixed object: {} bytes",
                            bytes.len()
                        );
                        whole_reads.fetch_add(1, Ordering::Relaxed);
                    }
                }
            });
        });
        assert!(whole_reads.load(Ordering::Relaxed) >= READS);
        assert!(matches!(cache.lookup(k), Lookup::Hit(_)));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn two_builds_with_their_own_handles_share_a_directory_and_get_correct_objects() {
        // Each thread is one build: its own handle (as each build process
        // opens its own), the same units, compiled on a miss and committed.
        let dir = temp_dir("two-builds");
        let units: Vec<(CacheKey, Vec<u8>)> = (0..16u8)
            .map(|i| (key(&format!("unit {i}")), tagged_elf(50 + u16::from(i), i)))
            .collect();
        let build = |units: &[(CacheKey, Vec<u8>)]| -> Vec<(CacheKey, PathBuf, bool)> {
            let cache = ObjectCache::open(&dir).unwrap();
            units
                .iter()
                .map(|(k, bytes)| match cache.lookup(*k) {
                    Lookup::Hit(path) => (*k, path, false),
                    Lookup::Miss | Lookup::Corrupt(_) => {
                        let temp = cache.temp_path(*k);
                        std::fs::write(&temp, bytes).unwrap();
                        (*k, cache.commit(&temp, *k).unwrap(), true)
                    }
                })
                .collect()
        };
        let (first, second) = std::thread::scope(|scope| {
            let first = scope.spawn(|| build(&units));
            let second = scope.spawn(|| build(&units));
            (first.join().unwrap(), second.join().unwrap())
        });
        for (build, objects) in [("first", &first), ("second", &second)] {
            assert_eq!(objects.len(), units.len(), "{build}");
            for ((k, path, _), (want_key, want)) in objects.iter().zip(&units) {
                assert_eq!(k, want_key);
                assert_eq!(&std::fs::read(path).unwrap(), want, "{build} build: object {k}");
            }
        }
        let compiled = first.iter().chain(&second).filter(|o| o.2).count();
        assert!(
            compiled >= units.len(),
            "every unit compiled at least once: {compiled}"
        );
        // Nothing is left behind: no temp files, no lock files.
        let left = names(&dir);
        assert_eq!(left.len(), units.len(), "{left:?}");
        assert!(
            left.iter().all(|n| n.ends_with(".o") && !n.starts_with('.')),
            "{left:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
