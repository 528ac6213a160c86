//! Zeroing a large block's pages for a program's `calloc`: mimalloc writes zeros over every
//! page of a reused block, so through a small budget each page was faulted in (or mapped as a
//! new zero page) and then evicted again, where glibc's calloc of a large block gets fresh zero
//! pages from `mmap` for nothing. The region knows better: a page that holds nothing reads as
//! zeros already, a stored page's content is simply forgotten (its compressed copy freed), and
//! only pages mapped now (or in flight) are written with zeros, by the calling thread. A large
//! block the program frees has its stored pages forgotten the same way (`drop_stored`): their
//! compressed copies are garbage, and a reuse of the block before the allocator purges it would
//! otherwise decode them.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;

use serde::{Deserialize, Serialize};

use crate::config::PAGE;
use crate::manager::Shared;
use crate::state::PageState::*;

/// What [`Region::zero_pages`](crate::Region::zero_pages) did, in pages (summed since the
/// region was created in `RegionStats::zeroed`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Zeroed {
    /// Pages that held nothing: left alone.
    pub absent: u64,
    /// Stored pages forgotten (their compressed copies freed, nothing read back).
    pub dropped: u64,
    /// Pages written with zeros (mapped, or being faulted in or evicted).
    pub written: u64,
}

impl Zeroed {
    /// The sums kept in the region's counters (in this field order).
    pub(crate) fn load(c: &[AtomicU64; 3]) -> Zeroed {
        let [absent, dropped, written] = c.each_ref().map(|a| a.load(Relaxed));
        Zeroed {
            absent,
            dropped,
            written,
        }
    }
}

/// Pages handled per hold of the space lock: faults and eviction get their turn in between.
const CHUNK: usize = 256;

impl Shared {
    /// Makes `pages` pages from page `first` of the root space read as zeros; see the module's
    /// comment. The caller is the creator's process and no other thread uses the range.
    pub(crate) fn zero_pages(&self, first: usize, pages: usize) -> Zeroed {
        let out = self.clear_pages(first, pages, true);
        let sums = &self.counters.zeroed;
        for (sum, n) in sums.iter().zip([out.absent, out.dropped, out.written]) {
            sum.fetch_add(n, Relaxed);
        }
        out
    }

    /// Forgets the stored pages of `pages` pages from page `first` (a large block the program
    /// freed: its compressed copies are garbage); mapped pages stay as they are, for the
    /// allocator to reuse or purge. How many were forgotten.
    pub(crate) fn drop_stored(&self, first: usize, pages: usize) -> u64 {
        let dropped = self.clear_pages(first, pages, false).dropped;
        self.counters.freed_stored.fetch_add(dropped, Relaxed);
        dropped
    }

    /// The pages of the range: Absent ones left alone, Stored ones forgotten, and the others
    /// written with zeros if `write_others` (else left alone too).
    fn clear_pages(&self, first: usize, pages: usize, write_others: bool) -> Zeroed {
        // On a program thread (free, calloc): see `AsyncSignalsBlocked`.
        // Not between a fork's page-table copy and its snapshot (`fork_snapshot_pending`).
        self.wait_for_fork_snapshot();
        let _signals = self.root.block_signals_for_lock();
        let s = &self.root;
        let mut out = Zeroed::default();
        let mut write = Vec::with_capacity(CHUNK);
        let mut unsettled = Vec::new();
        for c in (0..pages).step_by(CHUNK) {
            let end = (c + CHUNK).min(pages);
            write.clear();
            {
                let mut inner = s.inner.lock();
                // A victim of a batch not settled yet has a store entry that batch still
                // writes or discards (see `remap`): written with zeros like a mapped page.
                inner.unsettled_sorted(&mut unsettled);
                for k in c..end {
                    let i = first + k;
                    let settled = unsettled.binary_search(&(i as u32)).is_err();
                    match inner.state.get(i) {
                        Absent => out.absent += 1,
                        Stored if settled => {
                            inner.forget(&**s.store, i, Absent);
                            out.dropped += 1;
                        }
                        _ if write_others => write.push(k),
                        _ => {}
                    }
                }
            }
            for &k in &write {
                // SAFETY: a whole page of the region that no other thread uses (the caller's
                // promise); a fault on it is served as any access of the program's is.
                unsafe { std::ptr::write_bytes(s.page_addr(first + k) as *mut u8, 0, PAGE) };
            }
            out.written += write.len() as u64;
        }
        out
    }
}
