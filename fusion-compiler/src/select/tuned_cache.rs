//! The tuned cache: a user's JSON file of tile configs measured on their own
//! GPU for their kernels' shapes, which a build uses in place of the shipped
//! table's (`Builder::tuned`, `FUSION_TUNED`).
//!
//! ```json
//! { "version": 1,
//!   "entries": {
//!     "gemm_bias_gelu.f16.nk.n3000.k1000.sm90.m<=512": {
//!       "tile": { "bm": 128, "bn": 128, "bk": 64, "stages": 6 },
//!       "time_us": 41.2, "default_time_us": 47.9, "cublaslt_time_us": 42.0,
//!       "gpu": "NVIDIA H200", "driver": "580.65", "nvcc": "13.0.48", "date": "2026-12-01" } } }
//! ```
//!
//! A key is `<composition>.<dtype>.<layout>.n<N>.k<K>.<arch>.<M bucket>`: the
//! composed name ([`crate::fuse::pattern::composed_name`]), `nk` or `kn`,
//! the GEMM's static N and K, and one of [`MBucket`]'s names. `tile` is a
//! tile config as the shipped tables write one, checked by the same code
//! ([`TileConfig::check`], [`super::check_config`]).
//!
//! Reading never fails a build: a file that cannot be read or parsed, and
//! an entry whose key or tile is not valid for this version (an unknown
//! composition, a tile its arch's mainloop does not take), is a warning
//! naming the file (and the key), and the kernels it would have served get
//! the shipped table's config. Writing merges with the entries already in
//! the file and replaces it by renaming a finished temporary file, so an
//! interrupted tuning run keeps every shape it finished.
//!
//! Not here: measuring (the tuner), and the tiers a kernel's buckets become
//! ([`TunedCache::config_for`] maps them; codegen renders them).

use super::{Arch, ConfigSource, KernelConfig, KernelKind, TileConfig};
use crate::fuse::pattern::parse_composed_name;
use crate::gemm_model::FEW_M_MAX_ROWS;
use crate::ir::{DType, WeightLayout};
use indexmap::IndexMap;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::Path;

/// The environment variable that points a build at a tuned cache, when the
/// build script does not call `Builder::tuned`.
pub const TUNED_ENV: &str = "FUSION_TUNED";

/// The environment variable that chooses how a build selects the sm90
/// tiles of a GEMM: `model` by the fitted model of the kernel's time
/// ([`super::model`]), one tile per M bucket where N and K are static, per
/// call where N or K is dynamic; unset or `tables`, the shipped tables'
/// tiers, chosen among at launch.
pub const SELECT_ENV: &str = "FUSION_SELECT";

/// The file format's version; a file of another is ignored with a warning.
const VERSION: u32 = 1;

pub use crate::gemm_model::{M_BUCKET_BOUNDS, MBucket};

/// What one cache entry was measured for.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// The composed name (`rmsnorm_gemm_silu_glu`): prologue, mainloop,
    /// epilogue chain.
    pub composition: String,
    /// The element type.
    pub dtype: DType,
    /// How B is stored.
    pub layout: WeightLayout,
    /// The GEMM's static N.
    pub n: u64,
    /// The GEMM's static K.
    pub k: u64,
    /// The arch.
    pub arch: Arch,
    /// The M bucket.
    pub bucket: MBucket,
}

fn layout_word(layout: WeightLayout) -> &'static str {
    match layout {
        WeightLayout::NK => "nk",
        WeightLayout::KN => "kn",
    }
}

impl CacheKey {
    /// Everything but the bucket, `gemm_bias.f16.nk.n3000.k1000.sm90`: the
    /// key of the kernel the entry serves.
    pub fn kernel(&self) -> String {
        kernel_key(
            &self.composition,
            self.dtype,
            self.layout,
            self.n,
            self.k,
            self.arch,
        )
    }

    /// The key written `gemm_bias.f16.nk.n3000.k1000.sm90.m<=128`; the error
    /// says which part is wrong.
    pub fn parse(key: &str) -> Result<CacheKey, String> {
        let parts: Vec<&str> = key.split('.').collect();
        let [composition, dtype, layout, n, k, arch, bucket] = parts[..] else {
            return Err("a key is `<composition>.<dtype>.<nk|kn>.n<N>.k<K>.<arch>.<M bucket>`".to_owned());
        };
        let dim = |text: &str, prefix: char| {
            text.strip_prefix(prefix)
                .and_then(|size| size.parse::<u64>().ok())
                .filter(|&size| size > 0)
                .ok_or_else(|| format!("`{text}` is not `{prefix}` and a positive size"))
        };
        Ok(CacheKey {
            composition: composition.to_owned(),
            dtype: dtype.parse().map_err(|_| format!("unknown dtype `{dtype}`"))?,
            layout: match layout {
                "nk" => WeightLayout::NK,
                "kn" => WeightLayout::KN,
                _ => return Err(format!("unknown weight layout `{layout}`: expected nk or kn")),
            },
            n: dim(n, 'n')?,
            k: dim(k, 'k')?,
            arch: Arch::parse(arch)
                .ok_or_else(|| format!("unknown arch `{arch}`: expected {}", Arch::names_listed()))?,
            bucket: MBucket::parse(bucket).ok_or_else(|| {
                let names: Vec<String> = MBucket::all().map(|b| b.to_string()).collect();
                format!(
                    "unknown M bucket `{bucket}`: expected one of {}",
                    names.join(", ")
                )
            })?,
        })
    }

    /// The kernel it describes, as config selection sees one; `None` when no
    /// composition has its name.
    fn kernel_kind(&self) -> Option<KernelKind> {
        let (prologue, gate, steps) = parse_composed_name(&self.composition)?;
        Some(KernelKind {
            name: self.composition.clone(),
            dtype: self.dtype,
            layout: self.layout,
            prologue: prologue.is_some(),
            source_tile: gate.is_none() && steps.iter().filter(|s| s.reads_tile()).count() == 1,
            gated: gate.is_some(),
        })
    }
}

impl fmt::Display for CacheKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}", self.kernel(), self.bucket)
    }
}

fn kernel_key(composition: &str, dtype: DType, layout: WeightLayout, n: u64, k: u64, arch: Arch) -> String {
    format!("{composition}.{dtype}.{}.n{n}.k{k}.{arch}", layout_word(layout))
}

/// What the tuner measured for one key. Times are microseconds per launch,
/// by the bench's method.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct CacheEntry {
    /// The fastest tile config.
    pub tile: TileConfig,
    /// Its time.
    pub time_us: f64,
    /// The shipped table's config at the same shape.
    pub default_time_us: f64,
    /// cuBLASLt with the matching epilogue at the same shape.
    pub cublaslt_time_us: f64,
    /// Where and when: the device's name, the driver's and nvcc's versions,
    /// and the date (`2026-12-01`).
    pub gpu: String,
    /// The driver's version.
    pub driver: String,
    /// nvcc's version.
    pub nvcc: String,
    /// The day it was measured.
    pub date: String,
}

impl CacheEntry {
    /// Whether the entry is one this version can use for `key`: a known
    /// composition, a dtype the arch takes, a tile the arch's mainloop
    /// takes, measured times. The error is a sentence.
    fn check(&self, key: &CacheKey) -> Result<(), String> {
        let kind = key.kernel_kind().ok_or_else(|| {
            format!(
                "unknown composition `{}`: no kernel of this version has that name",
                key.composition
            )
        })?;
        if !key.arch.supports(key.dtype) {
            return Err(format!("{} has no {} kernels", key.arch, key.dtype));
        }
        self.tile
            .check(key.arch, kind.gated)
            .map_err(|reason| format!("its tile does not fit {}: {reason}", key.arch))?;
        let times = [self.time_us, self.default_time_us, self.cublaslt_time_us];
        if !times.iter().all(|t| t.is_finite() && *t > 0.0) {
            return Err("its times must be positive numbers of microseconds".to_owned());
        }
        Ok(())
    }
}

/// The file as written: entries kept as JSON, so that a merge keeps the
/// ones this version cannot read.
#[derive(serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
struct CacheFile {
    version: u32,
    entries: BTreeMap<String, serde_json::Value>,
}

/// A tuned cache as a build reads it: its usable entries, and what was wrong
/// with the rest.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TunedCache {
    /// The path it was read from, for messages.
    pub file: String,
    /// Its usable entries, in file order.
    pub entries: IndexMap<CacheKey, CacheEntry>,
    /// The kernels ([`CacheKey::kernel`]) with an entry that could not be
    /// used: they keep the shipped table's config, every bucket of them.
    rejected: BTreeSet<String>,
    /// One sentence per problem, naming the file (and the key).
    pub warnings: Vec<String>,
    /// The model that chooses a tile per M bucket for the sm90 kernels whose
    /// N and K are static and which the entries do not cover, and whose
    /// costs the plan tables carry for those whose N or K is dynamic
    /// ([`super::model`]); `None`: the shipped table's tiers serve them.
    /// A build sets it for `FUSION_SELECT=model` ([`SELECT_ENV`]).
    pub model: Option<super::model::Calibration>,
    /// The guard's models ([`super::guard`]): where set, the M buckets of
    /// a GEMM predicted (or, by an entry here, measured) to lose to the
    /// unfused vendor path run that path. A build sets it for
    /// `FUSION_GUARD=on` ([`super::guard::GUARD_ENV`]).
    pub guard: Option<super::guard::Guard>,
    /// Whether FP8 graphs get kernels (sm90's FP8 GEMM) instead of
    /// `CodegenError::Fp8NotGenerated`. A build sets it for
    /// `FUSION_FP8=experimental` (`crate::codegen::FP8_ENV`).
    pub fp8: bool,
}

impl TunedCache {
    /// Reads `path`. Never fails: what is wrong is in
    /// [`TunedCache::warnings`], and an unreadable file is an empty cache.
    pub fn read(path: &Path) -> TunedCache {
        let file = path.display().to_string();
        let mut cache = TunedCache {
            file: file.clone(),
            ..TunedCache::default()
        };
        let fallback = "the shipped tuned tables serve every kernel";
        let parsed = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read the tuned cache {file} ({e}); {fallback}"))
            .and_then(|text| {
                serde_json::from_str::<CacheFile>(&text)
                    .map_err(|e| format!("{file} is not a tuned cache ({e}); {fallback}"))
            })
            .and_then(|parsed| match parsed.version {
                VERSION => Ok(parsed),
                other => Err(format!(
                    "{file} is a tuned cache of version {other}, this fusion reads version {VERSION}; {fallback}"
                )),
            });
        let parsed = match parsed {
            Ok(parsed) => parsed,
            Err(warning) => {
                cache.warnings.push(warning);
                return cache;
            }
        };
        for (text, value) in parsed.entries {
            let key = match CacheKey::parse(&text) {
                Ok(key) => key,
                Err(reason) => {
                    cache
                        .warnings
                        .push(format!("{file}, entry `{text}`: {reason}; ignored"));
                    continue;
                }
            };
            let entry = TileConfig::read_for(key.arch, || serde_json::from_value::<CacheEntry>(value))
                .map_err(|e| e.to_string())
                .and_then(|entry| entry.check(&key).map(|()| entry));
            match entry {
                Ok(entry) => {
                    cache.entries.insert(key, entry);
                }
                Err(reason) => {
                    cache.warnings.push(format!(
                        "{file}, entry `{text}`: {reason}; ignored, kernel `{}` keeps the shipped tuned table's config",
                        key.kernel()
                    ));
                    cache.rejected.insert(key.kernel());
                }
            }
        }
        cache
    }

    /// Writes `entries` into the cache at `path`, keeping the entries
    /// already there (a new entry replaces one of the same key): the merged
    /// file goes to a temporary file in the same directory, which is then
    /// renamed over `path`, so that `path` is always a whole file. A file
    /// at `path` that is not a tuned cache is left alone and is an error.
    /// Writers serialize on an exclusive lock of `.<file>.lock` beside it
    /// (left there), held from the read to the rename, so that two tuning
    /// runs sharing one cache keep each other's entries.
    pub fn write(path: &Path, entries: &IndexMap<CacheKey, CacheEntry>) -> std::io::Result<()> {
        let invalid = |reason: String| std::io::Error::new(std::io::ErrorKind::InvalidData, reason);
        let name = path
            .file_name()
            .ok_or_else(|| invalid(format!("{} names no file", path.display())))?;
        let lock = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(path.with_file_name(format!(".{}.lock", name.to_string_lossy())))?;
        // Released when `lock` is dropped, at the end.
        lock.lock()?;
        let mut merged = match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str::<CacheFile>(&text)
                .ok()
                .filter(|file| file.version == VERSION)
                .ok_or_else(|| {
                    invalid(format!(
                        "{} is not a tuned cache of version {VERSION}: not overwriting it",
                        path.display()
                    ))
                })?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => CacheFile {
                version: VERSION,
                entries: BTreeMap::new(),
            },
            Err(e) => return Err(e),
        };
        for (key, entry) in entries {
            let value = serde_json::to_value(entry).map_err(|e| invalid(e.to_string()))?;
            merged.entries.insert(key.to_string(), value);
        }
        let mut text = serde_json::to_string_pretty(&merged).map_err(|e| invalid(e.to_string()))?;
        text.push('\n');
        let temporary =
            path.with_file_name(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
        let written = std::fs::write(&temporary, text)
            .and_then(|()| std::fs::File::open(&temporary)?.sync_all())
            .and_then(|()| std::fs::rename(&temporary, path));
        if written.is_err() {
            let _ = std::fs::remove_file(&temporary);
        }
        written
    }

    /// The config the cache gives `kernel` at static `n` and `k` on `arch`,
    /// and where it came from; `None` when it has no usable entry for it.
    /// Its buckets become the unit's tiers: the largest bucket's tile is
    /// `large`; the buckets up to the largest whose tile differs from that
    /// are the small-M tier, `small_m_max` their largest M, served by the
    /// tile most of them chose (`small_m`) and the next with another row
    /// count (`small_m_alt`; the one with more rows takes that place), which
    /// the unit picks between by waves at run time. `decode_max_m` stays
    /// `shipped`'s; `shipped.large_alt` does not (every tile a bucket runs
    /// is one the tuner measured there).
    ///
    /// Ms no bucket measured keep `shipped`'s tiers where the three tiles
    /// can say so: above the largest bucket, when that one is bounded,
    /// `shipped.large` is `large` (and a small tier of the buckets reaches
    /// at least `shipped`'s); below the smallest bucket, when no bucket
    /// holds an M of `shipped`'s small tier and the buckets chose one tile,
    /// that small tier stays. Elsewhere the nearest measured bucket's tile
    /// serves. `shipped.few_m` stays where no bucket holds an M it can run
    /// (two rows of its tiles: up to 128).
    pub fn config_for(
        &self,
        arch: Arch,
        kernel: &KernelKind,
        n: u64,
        k: u64,
        shipped: &KernelConfig,
    ) -> Option<(KernelConfig, ConfigSource)> {
        let wanted = kernel_key(&kernel.name, kernel.dtype, kernel.layout, n, k, arch);
        if self.rejected.contains(&wanted) {
            return None;
        }
        let mut buckets: Vec<(MBucket, TileConfig)> = self
            .entries
            .iter()
            .filter(|(key, _)| key.kernel() == wanted)
            .map(|(key, entry)| (key.bucket, entry.tile))
            .collect();
        buckets.sort_by_key(|&(bucket, _)| bucket);
        let &(top, top_tile) = buckets.last()?;
        // Above a bounded top bucket nothing was measured: the shipped tile.
        let large = if top.max_m().is_some() {
            shipped.large
        } else {
            top_tile
        };
        let names: Vec<String> = buckets.iter().map(|(bucket, _)| bucket.to_string()).collect();
        let source = ConfigSource {
            file: self.file.clone(),
            entry: format!("{wanted}.{{{}}}", names.join(",")),
        };
        let mut config = KernelConfig {
            large,
            small_m: None,
            small_m_max: None,
            small_m_alt: None,
            large_alt: None,
            decode_max_m: shipped.decode_max_m,
            by_m: None,
            few_m: shipped
                .few_m
                .filter(|few| u64::from(buckets[0].0.min_m()) > FEW_M_MAX_ROWS * u64::from(few.bm)),
        };
        if let Some(last_small) = buckets.iter().rposition(|(_, tile)| *tile != large) {
            let small = &buckets[..=last_small];
            // Most buckets first, then the larger bucket.
            let mut tiles: Vec<(usize, MBucket, TileConfig)> = Vec::new();
            for &(bucket, tile) in small {
                match tiles.iter_mut().find(|(_, _, t)| *t == tile) {
                    Some((count, largest, _)) => (*count, *largest) = (*count + 1, bucket),
                    None => tiles.push((1, bucket, tile)),
                }
            }
            tiles.sort_by_key(|&(count, bucket, _)| std::cmp::Reverse((count, bucket)));
            let first = tiles[0].2;
            let alt = tiles.iter().map(|t| t.2).find(|t| t.bm != first.bm);
            let (small_m, small_m_alt) = match alt {
                Some(alt) if alt.bm < first.bm => (alt, Some(first)),
                other => (first, other),
            };
            config.small_m = Some(small_m);
            config.small_m_alt = small_m_alt;
            config.small_m_max = small[last_small].0.max_m();
            if last_small == buckets.len() - 1 {
                // The small tier ends at the top bucket, below the shipped
                // large tile: it also serves the rest of the shipped small tier.
                config.small_m_max = config.small_m_max.max(shipped.small_m_max);
            }
        } else if shipped.small_m_max.is_some_and(|max| buckets[0].0.min_m() > max) {
            // One tile measured, and only above the shipped small tier.
            config.small_m = shipped.small_m;
            config.small_m_alt = shipped.small_m_alt;
            config.small_m_max = shipped.small_m_max;
        }
        Some((config, source))
    }
}

#[cfg(test)]
mod tests;
