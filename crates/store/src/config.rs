//! The store's settings and errors: what a caller passes to [`PageStore::new`] and what any
//! operation may answer. A leaf of the crate (it imports nothing from its siblings), so every
//! module can name these types without an import circle.
//!
//! [`PageStore::new`]: crate::PageStore::new

use std::sync::Arc;
use std::time::Duration;

use zmem_codec::{CodecError, Dictionary};
use zmem_engine::{EngineConfig, EngineError, Policy, SharedBackend};
use zmem_pool::PoolError;

/// Errors of the page store. A failed call changes nothing unless its doc says otherwise.
#[derive(thiserror::Error, Debug, Clone, PartialEq)]
pub enum StoreError {
    #[error("buffer of {len} bytes is not {what}")]
    BadLength { len: usize, what: &'static str },
    #[error("page {index} (+{count}) is out of range: the store has {pages} pages")]
    OutOfRange { index: u64, count: u64, pages: u64 },
    #[error("memory limit reached: {used} bytes used of {limit}")]
    MemoryLimit { used: u64, limit: u64 },
    #[error("page {index}: stored data is corrupt: {source}")]
    Corrupt { index: u64, source: CodecError },
    #[error("pool: {0}")]
    Pool(PoolError),
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("invalid store configuration: {0}")]
    Config(String),
    #[error("{pages} written pages are still uncompressed: {reason}")]
    WritesPending { pages: u64, reason: String },
    #[error("invalid page group: {0}")]
    BadGroup(String),
    /// The SSD log failed: reading page `index` back (its data is not returned), or a writeback
    /// (no index; the pages stay in the pool).
    #[error("{}SSD tier: {source}", index.map(|i| format!("page {i}: ")).unwrap_or_default())]
    Lower {
        index: Option<u64>,
        source: zmem_tier::TierError,
    },
    /// Page `index` is lost for this store's owner (a forked child whose copy of a page
    /// its parent changed could not be made): poisoned, never read as zeros.
    #[error("page {index} is lost: {reason}")]
    Lost { index: u64, reason: &'static str },
    /// The table of a store's pages could not be mapped (the address space or the
    /// kernel's map count is exhausted).
    #[error("cannot map the table of {pages} pages: {source}")]
    SlotTable { pages: u64, source: zmem_os::Errno },
}

impl StoreError {
    /// The page a read failed on, where the error names one whose data is lost (corrupt, or
    /// unreadable on the SSD tier): the caller poisons that page alone.
    pub fn lost_page(&self) -> Option<u64> {
        match self {
            StoreError::Corrupt { index, .. } => Some(*index),
            StoreError::Lower { index, .. } => *index,
            StoreError::Lost { index, .. } => Some(*index),
            _ => None,
        }
    }
}

impl From<PoolError> for StoreError {
    fn from(e: PoolError) -> StoreError {
        match e {
            PoolError::LimitExceeded { used, limit, .. } => StoreError::MemoryLimit { used, limit },
            other => StoreError::Pool(other),
        }
    }
}

/// Store settings.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Capacity in pages (zram's disksize / 4096).
    pub pages: u64,
    pub policy: Policy,
    /// Bytes of pool memory the store may use (zram's mem_limit); None = unlimited.
    pub mem_limit: Option<u64>,
    /// Pages per multi-page block for aligned batch writes: 1 (off) or 2..=16.
    pub block_pages: usize,
    /// Trained zstd dictionary used by zstd-based policies.
    pub dictionary: Option<Arc<Dictionary>>,
    /// Without a `dictionary`: learn one from the first pages written and use it if it shrinks
    /// later pages too (the `learn` module). On by default where the policy writes pages with
    /// zstd (`balanced`, `max`).
    pub learn_dictionary: bool,
    /// Learning trains where the page that completes a round is written (inline on a zmem
    /// thread, else on a thread of its own). Off, it trains only when the owner calls
    /// [`StoreCore::learn_pass`](crate::StoreCore::learn_pass): a region sets it off and its
    /// evictor calls that between batches, since a page may be written by the program's
    /// thread settling an eviction with the region's locks held, and a new thread's start-up
    /// touches the program's heap (under `zmem run` python hung that way, faulting on a page
    /// only that settle could serve).
    pub dictionary_thread: bool,
    pub engine: EngineConfig,
    /// An accelerator (the GPU backend) that takes the batches of asynchronous writes of at
    /// least `engine.offload_min_bytes`; the CPU takes everything else and whatever it hands
    /// back or fails.
    pub accelerator: Option<SharedBackend>,
    /// With `Policy::Auto`: every interval, pages idle since the last pass are recompressed
    /// with the cold codec into blocks (zram's idle recompression).
    pub recompress_interval: Option<Duration>,
    /// An SSD log below the pool (needs `mem_limit`): cold objects are written back to it as
    /// the pool nears its limit.
    pub lower: Option<crate::LowerConfig>,
    /// A page the policy's codec cannot shrink is stored raw at once, while such pages mostly
    /// shrank with the entropy coder lately, and tried with it by
    /// [`entropy_pass`](crate::StoreCore::entropy_pass) once it has stayed stored a while
    /// (the `entropy` module). The owner must call that pass on idle CPU. Off: the try is made
    /// at once, on the writing thread.
    pub entropy_later: bool,
    /// With a cold codec and `recompress_interval`: pages recompressed together as one group
    /// block by the cold pass (`StoreCore::cold_pass`), 1..=16; 1 recompresses each page alone.
    pub cold_group: usize,
}

/// Pages per group block of the cold pass (see `StoreConfig::cold_group`).
pub const DEFAULT_COLD_GROUP: usize = 1;

impl StoreConfig {
    pub fn new(pages: u64, policy: Policy) -> StoreConfig {
        StoreConfig {
            pages,
            policy,
            mem_limit: None,
            block_pages: 1,
            dictionary: None,
            learn_dictionary: matches!(policy.write_codec(), zmem_codec::Codec::Zstd { .. }),
            dictionary_thread: true,
            engine: EngineConfig::default(),
            accelerator: None,
            recompress_interval: None,
            lower: None,
            entropy_later: false,
            cold_group: DEFAULT_COLD_GROUP,
        }
    }
}
