//! What the store reports: [`StoreStats`] (zram's mm_stat plus zmem's own counters), the
//! result of a recompression pass, and the relaxed atomic counters behind them. A leaf of the
//! crate (it imports nothing from its siblings); [`StoreCore::stats`] assembles the snapshot.
//!
//! [`StoreCore::stats`]: crate::StoreCore::stats

use std::sync::atomic::AtomicU64;

use zmem_engine::EngineStats;
use zmem_pool::PoolStats;

/// Statistics with the meaning of zram's mm_stat, plus zmem's own counters.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct StoreStats {
    /// Bytes of pages stored (all non-empty pages, same-filled and pending included).
    pub orig_data_size: u64,
    /// Bytes of compressed objects (headers included).
    pub compr_data_size: u64,
    /// Bytes the pool holds from the OS.
    pub mem_used_total: u64,
    pub mem_limit: u64,
    pub mem_used_max: u64,
    pub same_pages: u64,
    pub pages_compacted: u64,
    /// Pages stored raw because they did not compress below the rejection threshold.
    pub huge_pages: u64,
    /// Written pages still waiting for compression.
    pub pending_pages: u64,
    pub block_pages: u64,
    /// Asynchronous writes whose install failed (memory limit); the pages stay readable.
    pub write_failures: u64,
    pub reads: u64,
    pub writes: u64,
    pub discards: u64,
    /// Pages given to another index without decoding ([`StoreCore::rename`](crate::StoreCore::rename)).
    #[serde(default)]
    pub renamed: u64,
    /// Nanoseconds spent decoding on reads.
    pub decompress_nanos: u64,
    pub recompressed_pages: u64,
    /// The age from which the cold pass takes a stored page now (ms; 0: no cold pass).
    #[serde(default)]
    pub cold_after_ms: u32,
    /// Of the pages the cold pass recompressed, their compressed bytes before and after.
    #[serde(default)]
    pub cold_bytes_before: u64,
    #[serde(default)]
    pub cold_bytes_after: u64,
    /// Pages moved out of sparse group blocks into new blocks
    /// ([`StoreCore::repack_groups`](crate::StoreCore::repack_groups)).
    pub repacked_pages: u64,
    /// Pages the policy's codec could not shrink that were tried with the entropy coder, and
    /// how many of those it shrank (stored compressed instead of raw).
    #[serde(default)]
    pub entropy_tries: u64,
    #[serde(default)]
    pub entropy_wins: u64,
    /// Pages stored raw with that try left for later (`StoreConfig::entropy_later`); the
    /// later tries count in `entropy_tries` and `entropy_wins` too.
    #[serde(default)]
    pub entropy_deferred: u64,
    /// How long a page stored raw waits for its deferred try now, in ms (it grows while the
    /// pages the coder shrank come back soon; 0 without `entropy_later`).
    #[serde(default)]
    pub entropy_wait_ms: u64,
    /// Pages offered with `write_if_smaller` that would not have saved memory (not stored).
    #[serde(default)]
    pub not_stored: u64,
    /// Bytes of the zstd dictionary new pages are written with (configured or learnt from the
    /// pages written), 0 for none (yet).
    #[serde(default)]
    pub dictionary_bytes: u64,
    /// Dictionaries learnt from the pages written (a later one replaces an earlier one that
    /// fits the pages less; the earlier ones are kept for the pages they coded).
    #[serde(default)]
    pub dictionaries_learnt: u64,
    /// Learnt dictionaries retired for saving too little on the pages written lately (new
    /// pages are written without them; those written with them still read).
    #[serde(default)]
    pub dictionaries_retired: u64,
    /// Rounds of learning finished (a dictionary trained and checked on later pages, kept or
    /// not).
    #[serde(default)]
    pub dictionary_rounds: u64,
    /// Pages on the SSD tier and their compressed bytes there.
    #[serde(default)]
    pub lower_pages: u64,
    #[serde(default)]
    pub lower_bytes: u64,
    /// Pages read back from the SSD tier, and its read or write failures.
    #[serde(default)]
    pub lower_reads: u64,
    /// Of `lower_reads`, those served from objects an earlier read brought along (no device
    /// read of their own; `LowerConfig::read_ahead`).
    #[serde(default)]
    pub lower_ahead_hits: u64,
    #[serde(default)]
    pub lower_errors: u64,
    /// Pages (and their compressed bytes) written back from the pool to the SSD tier.
    #[serde(default)]
    pub writeback_pages: u64,
    #[serde(default)]
    pub writeback_bytes: u64,
    /// Not serialised (the engine's and the pool's own types have no schema).
    #[serde(skip)]
    pub engine: EngineStats,
    #[serde(skip)]
    pub pool: PoolStats,
}

/// Result of one recompression pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecompressStats {
    pub pages_recompressed: u64,
    pub blocks_built: u64,
    /// Runs compressed as a block that did not come out smaller (left as they were).
    pub blocks_failed: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) stored: AtomicU64,
    pub(crate) same: AtomicU64,
    pub(crate) huge: AtomicU64,
    pub(crate) pending: AtomicU64,
    pub(crate) block_pages: AtomicU64,
    pub(crate) write_failures: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) writes: AtomicU64,
    pub(crate) discards: AtomicU64,
    pub(crate) renamed: AtomicU64,
    pub(crate) decompress_nanos: AtomicU64,
    pub(crate) recompressed: AtomicU64,
    /// Reads of pages stored in the cold codec (`cold::ColdAge`).
    pub(crate) cold_reads: AtomicU64,
    pub(crate) cold_bytes_before: AtomicU64,
    pub(crate) cold_bytes_after: AtomicU64,
    pub(crate) repacked: AtomicU64,
    pub(crate) entropy_tries: AtomicU64,
    pub(crate) entropy_wins: AtomicU64,
    pub(crate) entropy_deferred: AtomicU64,
    pub(crate) not_stored: AtomicU64,
    pub(crate) lower: AtomicU64,
    pub(crate) lower_bytes: AtomicU64,
    pub(crate) lower_reads: AtomicU64,
    pub(crate) lower_ahead_hits: AtomicU64,
    pub(crate) lower_errors: AtomicU64,
    pub(crate) writeback_pages: AtomicU64,
    pub(crate) writeback_bytes: AtomicU64,
    /// Objects decoded (tests check that a block is decoded once per batch).
    pub(crate) decodes: AtomicU64,
}
