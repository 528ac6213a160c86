//! Moving a buffer's pages to another address of the region, for a program that grows a large
//! block (`realloc`) where mimalloc would copy every byte: through a small budget each page of
//! the old block would be faulted back and each page of the new one written and evicted again
//! (glibc's realloc moves such a block with `mremap` instead). Here a resident page moves with
//! `UFFDIO_MOVE` (runs of adjacent pages in one call), a stored page is renamed in the store (its
//! index changes, nothing is decoded), and an absent page stays absent; any other page (being
//! faulted in or evicted, pinned, shared with a forked child, a member of a block) is copied by
//! the calling thread, as the program would have copied it.

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::{Acquire, Relaxed};

use serde::{Deserialize, Serialize};

use crate::config::PAGE;
use crate::manager::{Shared, SpaceInner};
use crate::state::PageState::*;

/// What [`Region::move_pages`](crate::Region::move_pages) did, in pages (summed since the
/// region was created in `RegionStats::remapped`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Remapped {
    /// Resident pages moved to their new address (`UFFDIO_MOVE`).
    pub mapped: u64,
    /// Stored pages given to their new index without decoding.
    pub stored: u64,
    /// Pages that held nothing (they read as zeros at the new address too).
    pub zero: u64,
    /// Pages copied byte by byte (their state let nothing else be done).
    pub copied: u64,
}

impl Remapped {
    /// The sums kept in the region's counters (in this field order).
    pub(crate) fn load(c: &[AtomicU64; 4]) -> Remapped {
        let [mapped, stored, zero, copied] = c.each_ref().map(|a| a.load(Relaxed));
        Remapped {
            mapped,
            stored,
            zero,
            copied,
        }
    }
}

/// Pages handled per hold of the space lock: faults and eviction get their turn in between.
const CHUNK: usize = 64;

impl Shared {
    /// Moves `pages` pages from page `src` to page `dst` of the root space (ranges checked and
    /// not overlapping); see the module's comment. The caller is the creator's process and no
    /// other thread uses either range meanwhile.
    pub(crate) fn move_pages(&self, dst: usize, src: usize, pages: usize) -> Remapped {
        // On a program thread (realloc, mremap): see `AsyncSignalsBlocked`.
        // Not between a fork's page-table copy and its snapshot (`fork_snapshot_pending`).
        self.wait_for_fork_snapshot();
        let _signals = self.root.block_signals_for_lock();
        let s = &self.root;
        let mut out = Remapped::default();
        self.drop_mapped(dst, pages);
        let mut copy = Vec::with_capacity(CHUNK);
        let mut unsettled = Vec::new();
        for c in (0..pages).step_by(CHUNK) {
            let end = (c + CHUNK).min(pages);
            copy.clear();
            {
                let mut inner = s.inner.lock();
                // Range events read during a fork wait for its snapshot: copy meanwhile.
                let deferred = self.range_events_deferred.load(Acquire) > 0;
                // A victim of a batch not settled yet (at either address) has a store entry
                // that batch still writes or discards: a page renamed into one was lost that
                // way (the batch wrote the old victim's page over it, then discarded it).
                inner.unsettled_sorted(&mut unsettled);
                let free = |inner: &SpaceInner, k: usize| {
                    let (si, di) = (src + k, dst + k);
                    !deferred
                        && matches!(inner.state.get(di), Absent | Stored)
                        && !inner.is_pinned(si as u32)
                        && !inner.is_pinned(di as u32)
                        && unsettled.binary_search(&(si as u32)).is_err()
                        && unsettled.binary_search(&(di as u32)).is_err()
                };
                let mut k = c;
                while k < end {
                    let (si, di) = (src + k, dst + k);
                    if !free(&inner, k) {
                        copy.push(k);
                        k += 1;
                        continue;
                    }
                    // A stale stored copy at the new address (memory the allocator reused).
                    inner.forget(&**s.store, di, Absent);
                    match inner.state.get(si) {
                        Absent => {
                            out.zero += 1;
                            k += 1;
                        }
                        Stored => {
                            if matches!(s.store.rename(si as u64, di as u64), Ok(true)) {
                                inner.state.set(si, Absent);
                                inner.state.set(di, Faulting);
                                inner.state.set(di, Stored);
                                if let Some(sums) = inner.sums.as_mut() {
                                    if let Some(sum) = sums.expected(si) {
                                        sums.stored(di as u32, sum);
                                    }
                                }
                                out.stored += 1;
                            } else {
                                copy.push(k);
                            }
                            k += 1;
                        }
                        Resident => {
                            // A run of resident pages over absent ones moves in one call (one
                            // TLB flush).
                            let mut n = 1;
                            while k + n < end
                                && inner.state.get(si + n) == Resident
                                && inner.state.get(di + n) == Absent
                                && free(&inner, k + n)
                            {
                                n += 1;
                            }
                            // Tests only: a run moved whole, reported as cut this many
                            // pages short.
                            let short = self.unreported_moves.load(Relaxed);
                            let said =
                                match s.uffd.move_run(s.page_addr(di), s.page_addr(si), n * PAGE) {
                                    Ok(()) => n.saturating_sub(short),
                                    // Shared with a forked child (EBUSY), an event pending (EAGAIN),
                                    // a page dropped behind our back (ENOENT), a protection the
                                    // kernel does not move (EINVAL): the rest is copied.
                                    Err((_, bytes)) => (bytes / PAGE).min(n),
                                };
                            let moved = self.moved_beyond_count(s, si, di, said, n);
                            for j in 0..moved {
                                inner.uncount_resident((si + j) as u32);
                                inner.drop_copy(&**s.store, (si + j) as u32);
                                inner.state.set(si + j, Absent);
                                inner.state.set(di + j, Faulting);
                                inner.state.set(di + j, Resident);
                                inner.admit((di + j) as u32);
                            }
                            copy.extend(k + moved..k + n);
                            out.mapped += moved as u64;
                            k += n;
                        }
                        _ => {
                            copy.push(k);
                            k += 1;
                        }
                    }
                }
            }
            for &k in &copy {
                // SAFETY: whole pages of the region that no other thread uses (the caller's
                // promise); a fault on either is served as any access of the program's is.
                unsafe {
                    std::ptr::copy_nonoverlapping(
                        s.page_addr(src + k) as *const u8,
                        s.page_addr(dst + k) as *mut u8,
                        PAGE,
                    )
                };
            }
            out.copied += copy.len() as u64;
        }
        let c = &self.counters.remapped;
        for (sum, n) in c.iter().zip([out.mapped, out.stored, out.zero, out.copied]) {
            sum.fetch_add(n, Relaxed);
        }
        out
    }

    /// How many pages of a run of `n` from page `src` to page `dst` did move, when the kernel
    /// said `said`: a cut run's count can fall short of what it moved (see "A run that moved
    /// more than it said" in docs/DESIGN-NOTES.md). A page counted as not moved was copied
    /// next: from its old address, now empty (zeros, mapped as a resident page's), over its
    /// moved content at the new one, which stayed marked Absent while mapped, so that a later
    /// calloc of that block would keep its bytes (the symptom of the fault-around bug fixed in
    /// session 40, fault.rs). The kernel moves a run in order, so the pages past the count
    /// whose old address is empty and new one mapped moved. Under the space lock: nothing
    /// else maps or moves them meanwhile.
    fn moved_beyond_count(
        &self,
        s: &crate::manager::Space,
        src: usize,
        dst: usize,
        said: usize,
        n: usize,
    ) -> usize {
        let mut moved = said;
        while moved < n
            && crate::guard::page_mapped(s.page_addr(src + moved)) == Some(false)
            && crate::guard::page_mapped(s.page_addr(dst + moved)) == Some(true)
        {
            self.counters.moved_unreported.fetch_add(1, Relaxed);
            moved += 1;
        }
        moved
    }

    /// Drops the pages of `[dst, dst + pages)` that are mapped now (memory the allocator reused
    /// without purging it): a page can only be moved to an address where nothing is mapped.
    /// `MADV_DONTNEED` makes a REMOVE event, which the region applies as for any of the
    /// program's.
    fn drop_mapped(&self, dst: usize, pages: usize) {
        let s = &self.root;
        let mut runs = Vec::new();
        {
            let inner = s.inner.lock();
            let mut k = 0;
            while k < pages {
                if inner.state.get(dst + k) != Resident || inner.is_pinned((dst + k) as u32) {
                    k += 1;
                    continue;
                }
                let mut n = 1;
                while k + n < pages
                    && inner.state.get(dst + k + n) == Resident
                    && !inner.is_pinned((dst + k + n) as u32)
                {
                    n += 1;
                }
                runs.push((k, n));
                k += n;
            }
        }
        for (k, n) in runs {
            // SAFETY: whole pages of the region that no other thread uses (the caller's
            // promise); their content is garbage the allocator handed out.
            unsafe {
                libc::madvise(
                    s.page_addr(dst + k) as *mut libc::c_void,
                    n * PAGE,
                    libc::MADV_DONTNEED,
                )
            };
        }
    }
}
