//! What the pool reports: a snapshot of its counters and the result of a compaction. A leaf of
//! the crate (it imports nothing from its siblings); [`Pool::stats`](crate::Pool::stats) sums
//! the per-class counters into it.

/// Result of one [`Pool::compact`](crate::Pool::compact) call.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CompactStats {
    pub objects_moved: u64,
    pub pages_freed: u64,
}

/// A snapshot of the pool's counters.
#[derive(Clone, Debug, Default)]
pub struct PoolStats {
    /// Bytes of pages currently held from the OS for spans (zram `mem_used_total`).
    pub mem_used_total: u64,
    /// High-water mark of `mem_used_total`.
    pub mem_used_max: u64,
    /// Sum of live objects' exact lengths (zram `compr_data_size`).
    pub object_bytes: u64,
    /// Live objects.
    pub objects: u64,
    /// Live spans.
    pub spans: u64,
    /// Live objects stored split (whole pages plus a tail; in `objects` too).
    pub split_objects: u64,
    /// Cumulative pages freed by [`Pool::compact`](crate::Pool::compact).
    pub pages_compacted: u64,
    /// Approximate bytes of pool bookkeeping (handle tables, span tables, reverse maps, ...).
    pub metadata_bytes: u64,
}

impl PoolStats {
    /// `1 - object_bytes / mem_used_total`, 0 when the pool holds no memory.
    pub fn fragmentation(&self) -> f64 {
        if self.mem_used_total == 0 {
            return 0.0;
        }
        (1.0 - self.object_bytes as f64 / self.mem_used_total as f64).clamp(0.0, 1.0)
    }
}
