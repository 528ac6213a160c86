//! A region's statistics: one schema, serialisable, which the process statistics of the
//! preload library (`zmem stat`, exit reports) embed and the C API copies into its struct.

use serde::{Deserialize, Serialize};
use zmem_store::StoreStats;

/// Fault latency summary, in nanoseconds, measured by the handler from reading the fault to
/// waking the faulting thread.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

/// Where the handlers' time goes, in nanoseconds summed since creation (issue 11: the fault
/// path's breakdown). A fault's time on the handler is `room + read + map` plus bookkeeping;
/// what the faulting thread waits beyond that is the hand-off (its wake-up and the handler's).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HandlerTime {
    /// Handled page faults (the denominator for per-fault figures).
    pub faults: u64,
    /// Whole faults, from reading the message to the end of the bookkeeping.
    pub total_ns: u64,
    /// Evicting on the fault path because the budget was exhausted (`direct_evictions`).
    pub room_ns: u64,
    /// Reading the page back from the store (decompression).
    pub read_ns: u64,
    /// Mapping it (`UFFDIO_COPY` or `UFFDIO_ZEROPAGE`, which wakes the faulting thread).
    pub map_ns: u64,
    /// Evicting between faults on a handler (delays a fault only if one arrives meanwhile).
    pub idle_evict_ns: u64,
    /// All eviction (any thread): moving pages out (`UFFDIO_MOVE`), and storing them
    /// (compression), and how many pages were moved.
    #[serde(default)]
    pub evict_move_ns: u64,
    #[serde(default)]
    pub evict_store_ns: u64,
    #[serde(default)]
    pub evict_moved: u64,
    /// `UFFDIO_MOVE` calls that moved them: a run of adjacent pages moves in one call.
    #[serde(default)]
    pub evict_move_calls: u64,
}

/// Counts of what a correct run should rarely or never see: non-zero figures here point at a
/// race (docs/DESIGN-NOTES.md, "Wrong output at 4M: perl, once").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checks {
    /// Pages read back from the store and checked against their checksum
    /// (`RegionConfig::verify_pages`), and those that differed (poisoned, never mapped).
    pub verified: u64,
    pub mismatches: u64,
    /// Faults on a page zmem counted as resident: expected only where two threads fault on
    /// one page (the second message comes after the first was served).
    pub on_resident: u64,
    /// Faults on a staged page that found it still mapped (`UFFDIO_COPY`: EEXIST).
    pub staged_present: u64,
    /// Victims with nothing mapped when moved out (`UFFDIO_MOVE`: ENOENT): expected only when
    /// the program unmaps the page at that moment (munmap, mremap: their events come after the
    /// pages are gone).
    pub moved_nothing: u64,
    /// Victims found already in their staging slot after a run of moves was cut (the kernel
    /// moved more of the run than it reported): kept as moved.
    #[serde(default)]
    pub moved_unreported: u64,
}

/// Statistics of a region.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RegionStats {
    pub size: u64,
    /// Current budget in bytes (changes over time with an adaptive budget).
    pub budget: u64,
    /// Bytes in DRAM in the region now (`pinned`, `held` and `incompressible` included).
    pub resident: u64,
    /// Bytes of pinned pages in DRAM now (see `Region::pin`), outside the budget: pages
    /// written, not those mapped ahead as zero pages and never written.
    #[serde(default)]
    pub pinned: u64,
    /// Bytes of pages that cannot be moved out (the program made them read-only, executable,
    /// inaccessible or mlocked): in DRAM, outside the budget, until it makes them writable.
    #[serde(default)]
    pub held: u64,
    /// Bytes of pages that did not compress when evicted: in DRAM, outside the budget (stored,
    /// they would cost as much memory and a fault each time). Retried now and then.
    #[serde(default)]
    pub incompressible: u64,
    /// Times an evicted page was put back because it did not compress.
    #[serde(default)]
    pub incompressible_kept: u64,
    /// Bytes of evicted pages waiting in staging for compression.
    pub staged: u64,
    /// Bytes of compressed pages still in staging slots, freed in bulk when the slots run out
    /// (outside the budget, at most 64 pages).
    #[serde(default)]
    pub staging_kept: u64,
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
    /// Faults served while the budget was still exhausted after trying to evict (no victim
    /// could leave at once): each maps its page over the budget.
    #[serde(default)]
    pub over_budget_faults: u64,
    /// Bytes of counted resident pages the eviction policy knows (listed, or just faulted in
    /// and waiting to be listed): what eviction can choose from. Below the counted resident
    /// bytes (`resident` less pinned, held and incompressible) only while batches are staged.
    #[serde(default)]
    pub evictable: u64,
    /// Pages that were shared with a forked child and had to be unshared before moving out.
    pub unshared: u64,
    /// Staging slots found occupied (UFFDIO_MOVE: EEXIST) and cleared before moving a page in.
    pub staging_cleared: u64,
    pub forks: u64,
    /// Pages evicted in forked children (zmem recycles a child's pages beyond its share).
    #[serde(default)]
    pub child_evictions: u64,
    /// Evicted pages the store refused because it was full (they stayed resident).
    pub store_refused: u64,
    /// Bytes of resident pages whose compressed copy the store keeps (`RegionConfig::
    /// clean_copies`; counted in `store.orig_data_size` too).
    #[serde(default)]
    pub clean_copies: u64,
    /// Pages evicted unchanged since their fault-in: their copy became their stored content,
    /// without a compression.
    #[serde(default)]
    pub clean_evictions: u64,
    /// Copies discarded at eviction because the page had changed, and copies given up to make
    /// room in a full store.
    #[serde(default)]
    pub copies_changed: u64,
    #[serde(default)]
    pub copies_given_up: u64,
    /// Pages the store did not take whose way back had to wait for a pending event of the
    /// program (fork, remove, unmap): they waited in their staging slot.
    #[serde(default)]
    pub put_backs_deferred: u64,
    /// Times a thread taking every fault was pinned to one CPU with the region's threads
    /// (`RegionConfig::colocate`).
    #[serde(default)]
    pub colocations: u64,
    /// Windows of 4096 refaults the Clock policy ended in recency mode (new pages leave in the
    /// order they came, as with FIFO): more than 2 in 5 of Clock's refaults had come back soon
    /// after their eviction, as a producer's pages do before their consumer reads them, and
    /// under recency few did (docs/DESIGN-NOTES.md, "Clock turns to recency").
    #[serde(default)]
    pub recency_windows: u64,
    /// Fault resolution latency.
    pub fault_latency: Latency,
    /// Events that a correct run should (almost) never see, and the page checks of
    /// `RegionConfig::verify_pages`.
    #[serde(default)]
    pub checks: Checks,
    /// Pages of large blocks moved to a new address (`Region::move_pages`: a program's
    /// `realloc`), by what was done with each.
    #[serde(default)]
    pub remapped: crate::remap::Remapped,
    /// Pages of large blocks made to read as zeros (`Region::zero_pages`: a program's
    /// `calloc`), by what was done with each.
    #[serde(default)]
    pub zeroed: crate::zero::Zeroed,
    /// Stored pages of large blocks forgotten when the program freed them
    /// (`Region::drop_stored`).
    #[serde(default)]
    pub freed_stored: u64,
    /// The handlers' time per step of a fault.
    #[serde(default)]
    pub handler_time: HandlerTime,
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
        // A clean copy is the same data as its resident page: counted once.
        let data = (self.resident + self.staged + self.store.orig_data_size)
            .saturating_sub(self.clean_copies);
        let dram = self.resident + self.staged + self.staging_kept + self.store.mem_used_total;
        if dram == 0 {
            return 0.0;
        }
        data as f64 / dram as f64
    }
}
