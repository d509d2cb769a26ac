//! What a call decides once per shape and then looks up: the tile tier
//! the model names ([`crate::tile_model`]) and the guard's verdict
//! ([`crate::route_model`]) of a GEMM whose N or K is dynamic, each kept per
//! (plan-table model, variant, M bucket, N, K) for the whole process.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

/// (the model's address in its `static` plan table, variant, M bucket, N,
/// K).
pub(crate) type ShapeKey = (usize, usize, usize, u64, u64);

/// The most values kept: past it (a process that calls ever new shapes) a
/// new one is made each call and not kept.
const MAX_KEPT: usize = 4096;

/// Values made per [`ShapeKey`], behind one lock.
pub(crate) struct ShapeMemo<V>(Mutex<BTreeMap<ShapeKey, V>>);

impl<V: Copy> ShapeMemo<V> {
    /// An empty memo, for a `static`.
    pub(crate) const fn new() -> ShapeMemo<V> {
        ShapeMemo(Mutex::new(BTreeMap::new()))
    }

    /// The value kept for `key`, else `make()`'s, kept while there is
    /// room: a call after the first of its shape allocates nothing.
    pub(crate) fn get_or_make(&self, key: ShapeKey, make: impl FnOnce() -> V) -> V {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&value) = kept.get(&key) {
            return value;
        }
        let value = make();
        if kept.len() < MAX_KEPT {
            kept.insert(key, value);
        }
        value
    }
}
