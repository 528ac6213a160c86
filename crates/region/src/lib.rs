//! Memory that tiers itself. A [`Region`] is a range of virtual memory that application threads
//! use as plain memory; at most its budget of it stays in DRAM, the coldest pages are compressed
//! into a [`zmem_store::PageStore`], and a touch brings a page back. It works from user space
//! with userfaultfd (full mode, so read(2) into an evicted page works too).
//!
//! See docs/DESIGN-NOTES.md ("Regions") for the fault path, eviction, fork and the policy.

pub mod budget;
pub mod policy;

use std::time::Duration;

use zmem_engine::Policy;
use zmem_store::{StoreError, StoreStats};

pub use budget::{AdaptiveConfig, BudgetSample};
pub use policy::Eviction;

/// Size of a page of a region.
pub const PAGE: usize = 4096;

/// How much of the region may stay resident (uncompressed, mapped) in DRAM.
#[derive(Clone, Debug, PartialEq)]
pub enum Budget {
    /// At most this many bytes (rounded down to pages, at least 16 pages).
    Fixed(u64),
    /// Sized at run time from memory pressure and the region's own refault rate.
    Adaptive(AdaptiveConfig),
}

/// Settings of a region.
#[derive(Clone, Debug)]
pub struct RegionConfig {
    /// Bytes of address space (rounded up to pages).
    pub size: u64,
    pub budget: Budget,
    /// Compression policy of the page store under the region.
    pub policy: Policy,
    /// Which pages leave DRAM first.
    pub eviction: Eviction,
    /// Pages mapped at once when faults run sequentially (1 = off).
    pub fault_around: usize,
    /// Threads reading the userfaultfd (each resolves the faults it reads).
    pub handler_threads: usize,
}

impl RegionConfig {
    pub fn new(size: u64, budget: Budget) -> RegionConfig {
        RegionConfig {
            size,
            budget,
            policy: Policy::Fast,
            eviction: Eviction::Clock,
            fault_around: 16,
            handler_threads: 1,
        }
    }
}

/// Errors of a region. Creating a region either succeeds whole or leaves nothing behind.
#[derive(thiserror::Error, Debug)]
pub enum RegionError {
    #[error(
        "cannot open /dev/userfaultfd: {source}. zmem needs full-mode userfaultfd: give this user \
         read-write access to /dev/userfaultfd (e.g. `setfacl -m u:$USER:rw /dev/userfaultfd`), \
         or run with CAP_SYS_PTRACE, or set vm.unprivileged_userfaultfd=1"
    )]
    Permission { source: std::io::Error },
    #[error("userfaultfd lacks {feature}: {why}")]
    Unsupported { feature: &'static str, why: String },
    #[error("{op} failed: {source}")]
    Os { op: &'static str, source: std::io::Error },
    #[error("invalid region configuration: {0}")]
    Config(String),
    #[error("page store: {0}")]
    Store(#[from] StoreError),
    #[error("this process is a fork of the one that created the region; only the creator can {0}")]
    ForkedChild(&'static str),
}

/// Fault latency summary, in nanoseconds, measured by the handler from reading the fault to
/// waking the faulting thread.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Latency {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

/// Statistics of a region.
#[derive(Clone, Debug, Default)]
pub struct RegionStats {
    pub size: u64,
    /// Current budget in bytes (changes over time with an adaptive budget).
    pub budget: u64,
    /// Bytes mapped in the region now.
    pub resident: u64,
    /// Bytes of evicted pages waiting in staging for compression.
    pub staged: u64,
    /// Faults on evicted pages (decompressed from the store).
    pub major_faults: u64,
    /// Faults on pages never touched or dropped by the program (zero-filled).
    pub zero_faults: u64,
    /// Faults on pages caught between unmapping and compression (served uncompressed).
    pub staged_faults: u64,
    /// Extra pages mapped by fault-around.
    pub fault_around_pages: u64,
    /// Pages taken out of the mapping.
    pub evictions: u64,
    /// Evictions a faulting thread had to do itself because the budget was exhausted.
    pub direct_evictions: u64,
    /// Pages that were shared with a forked child and had to be unshared before moving out.
    pub unshared: u64,
    pub forks: u64,
    /// Fault resolution latency.
    pub fault_latency: Latency,
    /// The page store under the region (zram mm_stat meanings).
    pub store: StoreStats,
}

impl RegionStats {
    /// Every fault served by the handler.
    pub fn faults(&self) -> u64 {
        self.major_faults + self.zero_faults + self.staged_faults
    }

    /// Bytes of the region's data per byte of DRAM it uses (resident + staged + compressed
    /// pool): how much more memory the program sees than it costs.
    pub fn effective_ratio(&self) -> f64 {
        let data = self.resident + self.staged + self.store.orig_data_size;
        let dram = self.resident + self.staged + self.store.mem_used_total;
        if dram == 0 {
            return 0.0;
        }
        data as f64 / dram as f64
    }
}

/// A range of memory that tiers itself. Use [`Region::as_ptr`] ..`+len()` as plain memory from
/// any thread. Dropping it stops its threads, unmaps the range and frees every compressed page.
pub struct Region {
    _private: (),
}

// SAFETY: all shared state behind a Region is synchronised internally.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

impl Region {
    pub fn new(cfg: RegionConfig) -> Result<Region, RegionError> {
        let _ = cfg;
        Err(RegionError::Unsupported {
            feature: "region",
            why: "not built yet".into(),
        })
    }

    /// First byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        std::ptr::null_mut()
    }

    /// Bytes of the region.
    pub fn len(&self) -> usize {
        0
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn stats(&self) -> RegionStats {
        RegionStats::default()
    }

    /// Current budget in bytes.
    pub fn budget(&self) -> u64 {
        0
    }

    /// Change a fixed budget (an adaptive region moves within its bounds on its own).
    pub fn set_budget(&self, bytes: u64) -> Result<(), RegionError> {
        let _ = bytes;
        Ok(())
    }

    /// Interval of the adaptive budget's control loop.
    pub fn control_interval(&self) -> Option<Duration> {
        None
    }
}
