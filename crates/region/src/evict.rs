//! Eviction: the coldest resident pages (the policy's choice) are moved out with UFFDIO_MOVE
//! into a staging area (`stage`), compressed into the store (alone or in groups that make one
//! block) and settled (`settle`); a page the store refuses is put back. The evictor thread runs
//! the adaptive budget and evicts when the handlers are quiet; handlers evict between faults
//! (by default only staging, the evictor settling their batches on another CPU: see
//! `evict_async`), and a fault that finds the budget exhausted evicts itself (`make_room`).

use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zmem_store::MAX_BLOCK_PAGES;

use crate::budget_loop::{BudgetLoop, Signals};
use crate::config::PAGE;
use crate::manager::{Shared, SpaceInner, STAGING_SLOTS};
use crate::slots::Slot;
use crate::state::PageState::*;
use crate::trace::{self, Note};

/// After the store refuses a page (its memory limit), eviction pauses this long: moving pages
/// out only to put them back costs CPU and, under a memory cgroup, memory it may not have.
pub(crate) const FULL_BACKOFF_MS: u64 = 50;
/// A full store is reported at most this often (milliseconds).
pub(crate) const FULL_SAID_MS: u64 = 10_000;
/// An eviction batch may grow to this many pages with the victims' unprotected neighbours.
pub(crate) const RUN_PAGES: usize = 16;
/// Monotonic milliseconds.
pub(crate) fn now_ms() -> u64 {
    zmem_os::clock_ms(libc::CLOCK_MONOTONIC)
}

impl Shared {
    /// Headroom the evictor keeps below the budget so faults rarely evict themselves.
    pub(crate) fn low_water(&self) -> usize {
        let b = self.budget();
        b.saturating_sub((b / 32).clamp(STAGING_SLOTS, 4096))
    }

    /// Between faults, a handler evicts down to the low-water mark a few pages at a time, so
    /// faults rarely find the budget exhausted and no other thread needs waking. It stops as
    /// soon as a message waits on any descriptor.
    pub(crate) fn evict_while_idle(self: &Arc<Self>, fds: &mut [libc::pollfd]) {
        for _ in 0..16 {
            if !self.evict_step_toward_low_water() {
                return;
            }
            for f in fds.iter_mut() {
                f.revents = 0;
            }
            // SAFETY: a valid pollfd array; timeout 0 never blocks.
            let ready = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, 0) };
            if ready != 0 {
                return;
            }
        }
    }

    /// The signal route's `evict_while_idle`: the thread that just served its own fault moves
    /// a few pages out toward the low-water mark, from its own CPU (no TLB-flush IPI while the
    /// evictor sleeps), and leaves their compression to the evictor. Also tells the evictor
    /// that faults are coming (it moves pages itself only when they are quiet).
    pub(crate) fn evict_after_own_fault(&self) {
        *self.last_fault_at.lock() = Instant::now();
        self.evict_step_toward_low_water();
    }

    /// One step of eviction between faults, while above the low-water mark: moves a few pages
    /// out (`evict_async`). Whether any left.
    fn evict_step_toward_low_water(&self) -> bool {
        let resident = self.root.inner.lock().resident;
        let low = self.low_water();
        if resident <= low {
            return false;
        }
        // While victims come in runs (pages faulted in one after the other), a batch of
        // RUN_PAGES at once (a little below the mark): each run moves in one call. Else a few
        // pages: a batch delays the next fault. Measured (`bench region --size 1G --resident
        // 256M --pattern rand`, victims scattered): batches of 4 give fault p50 21.9 µs, p99
        // 55.9, 18.2 µs/access; of 8: p50 8.3, p99 112, 15.9–16.2; of 16: p50 8.3, p99 193,
        // 16.05. Kept at 4 for the tail (issue 11's p99 target). With async settling
        // `evict_async` stages at least ASYNC_STEP (8) of them: a step moves 8 pages, one
        // fault in eight (DESIGN-NOTES, "The fault tail again", session 37).
        let want = if self.run_pages.load(Relaxed) >= 2 {
            RUN_PAGES
        } else {
            (resident - low).min(4)
        };
        if self.evict_async(want) == 0 {
            return false;
        }
        self.repack();
        true
    }

    // ---------------------------------------------------------------- eviction

    /// Evicts up to `want` pages (one staging batch at most); returns how many left.
    pub fn evict(&self, want: usize) -> usize {
        match self.stage(want) {
            Some(batch) => self.settle(batch),
            None => 0,
        }
    }

    /// Evicts up to `want` pages (at least `ASYNC_STEP`), their compression left to the evictor
    /// thread when the region settles asynchronously (`RegionConfig::async_settle`): the
    /// caller (a handler between faults, sharing its CPU with the program) only moves the pages
    /// out. Returns how many left the program; 0 while the evictor is settling.
    pub(crate) fn evict_async(&self, want: usize) -> usize {
        if !self.async_settle {
            return self.evict(want);
        }
        // Moves only while the evictor sleeps: a thread of the process running on another CPU
        // makes every move's TLB flush an IPI there. So batches of a few pages (the handler
        // checks for faults between them) are queued without waking it, until ASYNC_BATCH
        // pages wait or the slots run out. Not at the low-water mark: a thrashing program
        // crosses it at every fault, and waking the evictor for each step of 8 pages cost a
        // wake-up and, for the first moves after it slept again, a TLB-flush IPI to its CPU
        // (jq at --resident 64M: 57k wake-ups, 114k IPIs, move 7.9 µs per page; waking at
        // ASYNC_BATCH: 2.8 µs, the run 16.0 -> 13.1 s; DESIGN-NOTES, "Waking the evictor").
        // A queue that stays short when faults stop is settled at the evictor's next nap.
        if self.settling.load(Acquire) {
            // Demand beyond what the evictor compresses (fault-around brings pages in 16 at a
            // time): past half the margin, the handler compresses too, its moves paying the
            // IPI, rather than let faults find no room (they would evict themselves, and
            // fault-around would stop at the budget).
            let low = self.low_water();
            if self.root.inner.lock().resident > low + (self.budget() - low) / 2 {
                let done = self.evict(want);
                if done == 0 && self.settle_one_queued() {
                    return self.evict(want);
                }
                return done;
            }
            return 0;
        }
        let Some(batch) = self.stage(want.max(ASYNC_STEP)) else {
            self.start_settling();
            return 0;
        };
        let n = batch.moved();
        let waiting: usize = {
            let mut q = self.queued.lock();
            q.push_back(batch);
            q.iter().map(Batch::moved).sum()
        };
        if waiting >= ASYNC_BATCH {
            self.start_settling();
        }
        n
    }

    /// Wakes the evictor to settle the queued batches, if any.
    fn start_settling(&self) {
        if !self.queued.lock().is_empty() {
            self.settling.store(true, Release);
            self.kick_evictor();
        }
    }

    /// Settles the oldest batch queued for the evictor on this thread: whether there was one.
    /// For a fault or a handler that finds every staging slot held by queued batches: the
    /// evictor may not run for a while when its CPU is busy (a parallel build, a test suite),
    /// and faults must not wait for it or map pages over the budget meanwhile.
    pub(crate) fn settle_one_queued(&self) -> bool {
        let Some(b) = self.queued.lock().pop_front() else {
            return false;
        };
        self.settle(b);
        true
    }

    /// Settles the batches the handlers queued (the evictor's side of `evict_async`); how
    /// many pages left the budget.
    pub(crate) fn settle_queued(&self) -> usize {
        let mut n = 0;
        loop {
            let Some(b) = self.queued.lock().pop_front() else {
                self.settling.store(false, Release);
                return n;
            };
            n += self.settle(b);
        }
    }

    /// Picks up to `want` victims and moves them into staging slots (the policy's choice,
    /// with their unprotected neighbours); the batch is then `settle`d. None if nothing moved.
    fn stage(&self, want: usize) -> Option<Batch> {
        if self.store_full.load(Relaxed)
            && now_ms().saturating_sub(self.store_full_ms.load(Relaxed)) < FULL_BACKOFF_MS
        {
            return None;
        }
        let s = &self.root;
        let _g = self.evict_lock.lock();
        self.retry_put_backs();
        let n = {
            let inner = s.inner.lock();
            // With blocks of evicted pages, evict at least a block's worth (a few pages below
            // the budget), so that blocks are full even when callers want one page at a time.
            let n = want.min(STAGING_SLOTS).min(inner.resident);
            if n == 0 {
                return None;
            }
            let group = self.evict_group.min(inner.resident / 4);
            n.max(group).min(STAGING_SLOTS)
        };
        // Room for the unprotected neighbours of the victims (see below).
        let room = n.clamp(RUN_PAGES, STAGING_SLOTS);
        let mut slots = Vec::with_capacity(STAGING_SLOTS);
        self.slots
            .take_empty(room, &mut slots, |addr, len| self.clear_staging(addr, len));
        let mut victims = Vec::with_capacity(STAGING_SLOTS);
        // The hash of each victim's clean copy (0: none), see the `copies` module.
        let mut copy_hash = [0u128; STAGING_SLOTS];
        {
            let mut inner = s.inner.lock();
            let n = n.min(slots.len());
            if let Some(t) = inner.tracker.as_mut() {
                t.pick(n, &mut victims);
            }
            if victims.len() < n {
                inner.drain_nursery();
                let more = n - victims.len();
                if let Some(t) = inner.tracker.as_mut() {
                    t.pick(more, &mut victims);
                }
            }
            // A page of a batch not settled yet (faulted back from its slot, or whose move
            // failed) waits for that batch: its store entry is that batch's to write or
            // discard. Set aside, others picked instead, all given back to the policy below.
            let mut waiting = Vec::new();
            set_aside(&inner.unsettled, &mut victims, 0, &mut waiting);
            if !waiting.is_empty() {
                let at = victims.len();
                if let Some(t) = inner.tracker.as_mut() {
                    t.pick(n - at, &mut victims);
                }
                set_aside(&inner.unsettled, &mut victims, at, &mut waiting);
            }
            // Each victim takes its resident neighbours that nothing protects (never refaulted:
            // the policy would give them up next anyway), so that runs of adjacent pages move
            // in one call: one TLB flush per run instead of one per page (`Uffd::move_run`).
            let picked = victims.len();
            for k in 0..picked {
                let v = victims[k] as usize;
                for dir in [1isize, -1] {
                    let mut p = v as isize + dir;
                    while victims.len() < slots.len()
                        && p >= 0
                        && (p as usize) < s.pages
                        && inner.state.get(p as usize) == Resident
                        && inner
                            .tracker
                            .as_mut()
                            .is_some_and(|t| t.take_unprotected(p as u32))
                    {
                        victims.push(p as u32);
                        p += dir;
                    }
                }
            }
            set_aside(&inner.unsettled, &mut victims, picked, &mut waiting);
            if let Some(t) = inner.tracker.as_mut() {
                for &v in &waiting {
                    t.insert_quiet(v);
                }
            }
            // Only resident pages, each once: a page the policy still listed though it was
            // Stored or Staged (a race not found yet: `exhausted_budget_waits_never_fails`
            // tripped the assertion below in 1 run of 8, six threads on a 16-page budget) would
            // be staged again, and its empty or reused slot later mapped back as its content.
            victims.sort_unstable();
            victims.dedup();
            victims.retain(|&v| inner.state.get(v as usize) == Resident);
            // Pages a trapped system call is about to hand to the kernel (the syscall guard's
            // pins) stay: given back to the policy, others go instead next time.
            if crate::guard::any_pinned() {
                let mut kept = Vec::new();
                victims.retain(|&v| {
                    let pinned = crate::guard::is_pinned(s.page_addr(v as usize));
                    if pinned {
                        kept.push(v);
                    }
                    !pinned
                });
                if let Some(t) = inner.tracker.as_mut() {
                    for v in kept {
                        t.insert_quiet(v);
                    }
                }
            }
            inner.unsettled.extend_from_slice(&victims);
            for &slot in &slots[victims.len()..] {
                self.slots.put_empty(slot);
            }
            slots.truncate(victims.len());
            // In address order, both: pages adjacent in the program that land in adjacent
            // slots move in one call (one TLB flush, see `Uffd::move_run`).
            victims.sort_unstable();
            slots.sort_unstable();
            for &v in &victims {
                debug_assert_eq!(inner.state.get(v as usize), Resident);
                inner.state.set(v as usize, Staged);
            }
            for (k, &v) in victims.iter().enumerate() {
                inner.staged.insert(v, self.slots.addr(slots[k]));
                if let Some(c) = inner.copies.as_ref() {
                    copy_hash[k] = c.hash_of(v).unwrap_or(0);
                }
            }
            inner.resident -= victims.len();
        }
        if victims.is_empty() {
            return None;
        }
        self.counters.staged_now.store(victims.len(), Relaxed);
        crate::manager::test_pause(&self.move_delay_us);
        // Move each victim out, a run of adjacent pages at a time, under the space lock, which
        // range events are applied under: a victim the program dropped since it was picked
        // (its REMOVE applied, so no longer Staged) is left where it is, since the page now at
        // its address may be one the program wrote since, and a victim still Staged has its
        // own content there (the kernel zaps a dropped range only after a handler read its
        // event, which waits for this lock). Moved after the lock was released, a victim
        // dropped and written again meanwhile took the program's new page away while the
        // region counted it resident: the next touch read zeros (perl at `--resident 4M`,
        // `a_page_dropped_and_written_again_while_it_was_being_evicted_keeps_its_new_content`).
        // A page still shared with a forked child (EBUSY) is unshared by a locked no-op write,
        // which makes the kernel copy it for us (a write to a present page: no userfault), then
        // moved.
        let t_move = Instant::now();
        let mut outcome = [false; STAGING_SLOTS];
        let mut stale = [false; STAGING_SLOTS];
        let mut aborted = false;
        let mut calls = 0;
        let mut k = 0;
        while k < victims.len() && !aborted {
            let mut end = k + 1;
            while end < victims.len()
                && victims[end] == victims[end - 1] + 1
                && slots[end] == slots[end - 1] + 1
            {
                end += 1;
            }
            let mut inner = s.inner.lock();
            let staged =
                |inner: &SpaceInner, j: usize| inner.state.get(victims[j] as usize) == Staged;
            let mut first = k;
            if end - k > 1 && (k..end).all(|j| staged(&inner, j)) {
                let src = s.page_addr(victims[k] as usize);
                let dst = self.slots.addr(slots[k]);
                // Tests only: a run moved whole, reported as cut this many pages short.
                let short = self.unreported_moves.load(Relaxed);
                let done = match s.uffd.move_run(dst, src, (end - k) * PAGE) {
                    Ok(()) if short == 0 => end - k,
                    // The rest page by page below, each failure handled on its own.
                    r => {
                        let (done, errno) = match r {
                            Ok(()) => ((end - k).saturating_sub(short), 0),
                            Err((e, bytes)) => (bytes / PAGE, e.code()),
                        };
                        let first = victims[k] as usize;
                        let said = done as u64 | (errno as u64) << 32;
                        trace::note(Note::RunCut, first, (end - k) as u64, said);
                        done
                    }
                };
                outcome[k..k + done].fill(true);
                first = k + done;
                calls += 1;
            }
            for (slot, &v) in victims.iter().enumerate().take(end).skip(first) {
                if aborted {
                    break;
                }
                if !staged(&inner, slot) {
                    // Dropped since it was picked: `forget` let its slot and entry go.
                    continue;
                }
                calls += 1;
                let src = s.page_addr(v as usize);
                let dst = self.slots.addr(slots[slot]);
                let mut r = s.uffd.move_pages(dst, src, PAGE);
                if matches!(&r, Err(e) if e.code() == libc::EBUSY) {
                    unshare(src);
                    self.counters.unshared.fetch_add(1, Relaxed);
                    r = s.uffd.move_pages(dst, src, PAGE);
                }
                if matches!(&r, Err(e) if e.code() == libc::EEXIST) {
                    // The kernel moves only into an empty slot. If the victim is no longer
                    // mapped, what the slot holds is the victim itself: a run moved it, though
                    // the count of the cut run said otherwise. Cleared, the slot lost the page
                    // and the retry found nothing to move: perl at `--resident 4M` read zeros
                    // (DESIGN-NOTES, "A run that moved more than it said"). Otherwise something
                    // else is mapped there (a page a failed recycle left behind, or a huge page
                    // over the slot): clear the slot and try once more; the page stays
                    // resident if that fails too.
                    let victim_mapped = crate::guard::page_mapped(src).unwrap_or(true);
                    trace::note(
                        Note::SlotTaken,
                        v as usize,
                        dst as u64,
                        victim_mapped as u64,
                    );
                    if !victim_mapped && crate::guard::page_mapped(dst) == Some(true) {
                        self.counters.moved_unreported.fetch_add(1, Relaxed);
                        r = Ok(());
                    } else {
                        self.clear_staging(dst, PAGE);
                        self.counters.staging_cleared.fetch_add(1, Relaxed);
                        r = s.uffd.move_pages(dst, src, PAGE);
                        stale[slot] = matches!(&r, Err(e) if e.code() == libc::EEXIST);
                    }
                }
                match r {
                    Ok(()) => outcome[slot] = true,
                    Err(e) if e.code() == libc::ENOENT => {
                        // Nothing mapped: the program unmapped it (munmap's UNMAP event comes
                        // after the pages are gone, unlike madvise's REMOVE, which waits for
                        // this lock), or a page counted resident was not (`Checks::moved_nothing`).
                        self.counters.moved_nothing.fetch_add(1, Relaxed);
                        trace::note(Note::NothingMapped, v as usize, 0, 0);
                        inner.state.set(v as usize, Absent);
                        inner.staged.remove(&v);
                        inner.drop_copy(&**s.store, v);
                    }
                    Err(e) if e.code() == libc::EBADF => {
                        crate::manager::lost_descriptor(s.uffd.raw())
                    }
                    Err(e) if e.code() == libc::EINVAL => {
                        // The program made the page read-only, executable, inaccessible or
                        // mlocked: the kernel moves pages only between areas of the same protection
                        // and locking. It stays resident, held outside the budget, until the
                        // program makes it writable again (Region::release_held).
                        inner.state.set(v as usize, Resident);
                        inner.staged.remove(&v);
                        inner.hold(v);
                        if !self.held_warned.swap(true, Relaxed) {
                            tracing::info!(
                                "page {v} cannot be moved out (its protection or mlock differs): \
                             such pages stay in DRAM, outside the budget"
                            );
                        }
                    }
                    Err(e) => {
                        if e.code() == libc::EAGAIN {
                            aborted = true; // an event is pending (fork, remove): let it through
                        } else {
                            tracing::warn!("UFFDIO_MOVE of page {v}: {e}; keeping it resident");
                        }
                        inner.state.set(v as usize, Resident);
                        inner.staged.remove(&v);
                        inner.resident += 1;
                        if let Some(t) = inner.tracker.as_mut() {
                            t.insert_quiet(v);
                        }
                    }
                }
            }
            drop(inner);
            k = end;
        }
        if aborted {
            // Victims after the abort point were never moved: give them back.
            let mut inner = s.inner.lock();
            for (slot, &v) in victims.iter().enumerate() {
                if !outcome[slot] && inner.state.get(v as usize) == Staged {
                    inner.state.set(v as usize, Resident);
                    inner.staged.remove(&v);
                    inner.resident += 1;
                    if let Some(t) = inner.tracker.as_mut() {
                        t.insert_quiet(v);
                    }
                }
            }
        }
        self.counters.add_ns(&self.counters.evict_move_ns, t_move);
        let moved = outcome.iter().filter(|&&o| o).count();
        self.counters.evict_moved.fetch_add(moved as u64, Relaxed);
        self.counters
            .evict_move_calls
            .fetch_add(calls as u64, Relaxed);
        if let Some(run) = moved.checked_div(calls) {
            self.run_pages.store(run, Relaxed);
        }
        Some(Batch {
            victims,
            slots,
            outcome,
            stale,
            copy_hash,
        })
    }

    /// Compresses a staged batch's pages into the store (or finds them unchanged since their
    /// clean copy), then settles their states: Stored, or put back when the store refused
    /// them; hands the slots back. Returns how many left the budget. Batches are settled one at
    /// a time (`settle_lock`), on the thread that staged them or on the evictor.
    fn settle(&self, batch: Batch) -> usize {
        let Batch {
            victims,
            slots,
            outcome,
            stale,
            copy_hash,
        } = batch;
        let s = &self.root;
        let _settling = self.settle_lock.lock();
        let t_store = Instant::now();
        // Compress the moved pages into the store, then settle their states. Compressed here,
        // on this thread: on two cores a hand-off to the engine's workers costs more in
        // wake-ups and context switches than it saves.
        let mut kept = [Kept::Refused; STAGING_SLOTS];
        let page_at = |slot: usize| -> &[u8] {
            // SAFETY: the slot holds the page we moved there; nothing else writes it until this
            // batch hands the slot back (Slots::put_used).
            unsafe { std::slice::from_raw_parts(self.slots.addr(slots[slot]) as *const u8, PAGE) }
        };
        // Victims with a clean copy: out of the program's reach now, so the hash is final.
        // Unchanged, the copy is their stored content; changed, it goes.
        let mut changed = [0u32; STAGING_SLOTS];
        let mut n_changed = 0;
        for slot in 0..victims.len() {
            if outcome[slot] && copy_hash[slot] != 0 {
                if crate::copies::page_hash(page_at(slot)) == copy_hash[slot] {
                    kept[slot] = Kept::Clean;
                } else {
                    changed[n_changed] = victims[slot];
                    n_changed += 1;
                }
            }
        }
        if n_changed > 0 {
            let mut inner = s.inner.lock();
            for &v in &changed[..n_changed] {
                inner.drop_copy(&**s.store, v);
            }
            drop(inner);
            self.counters
                .copies_changed
                .fetch_add(n_changed as u64, Relaxed);
        }
        if self.evict_group > 1 {
            // Groups of `evict_group` moved pages, in victim order, each one block whatever the
            // pages' addresses (fixed arrays: no allocation per batch).
            let mut group_slots = [0usize; MAX_BLOCK_PAGES];
            let mut k = 0;
            let clean_at = kept.map(|k| k == Kept::Clean);
            for slot in (0..victims.len()).filter(|&slot| outcome[slot] && !clean_at[slot]) {
                group_slots[k] = slot;
                k += 1;
                if k == self.evict_group {
                    self.store_group(&group_slots[..k], &victims, &page_at, &mut kept);
                    k = 0;
                }
            }
            if k > 0 {
                self.store_group(&group_slots[..k], &victims, &page_at, &mut kept);
            }
        } else {
            for (slot, &v) in victims.iter().enumerate() {
                if outcome[slot] && kept[slot] != Kept::Clean {
                    kept[slot] = self.store_page(v, page_at(slot));
                }
            }
        }
        // `RegionConfig::verify_pages`: the sum of what each page was stored with.
        let mut sums = [0u64; STAGING_SLOTS];
        if self.verify_pages {
            for slot in (0..victims.len()).filter(|&k| outcome[k]) {
                sums[slot] = crate::verify::page_sum(page_at(slot));
            }
        }
        self.counters.add_ns(&self.counters.evict_store_ns, t_store);
        let mut evicted = 0;
        let mut incompressible = 0;
        let mut clean = 0;
        let mut refused = false;
        let mut withheld = [false; STAGING_SLOTS];
        {
            let mut inner = s.inner.lock();
            inner.unsettled.retain(|u| !victims.contains(u));
            for (slot, &v) in victims.iter().enumerate() {
                if !outcome[slot] {
                    continue;
                }
                let i = v as usize;
                refused |= kept[slot] == Kept::Refused;
                let stored = matches!(kept[slot], Kept::Stored | Kept::Clean);
                if inner.state.get(i) == Staged && stored {
                    inner.state.set(i, Stored);
                    inner.staged.remove(&v);
                    if let Some(sums_of) = inner.sums.as_mut() {
                        sums_of.stored(v, sums[slot]);
                    }
                    if kept[slot] == Kept::Clean {
                        // The copy is the stored page now, no longer a copy.
                        inner.copies.as_mut().map(|c| c.take(v));
                        clean += 1;
                    }
                    evicted += 1;
                } else if inner.state.get(i) == Staged {
                    // Not stored (the store is full, or the page does not compress): put the
                    // page back where it was.
                    let incompr = kept[slot] == Kept::Incompressible;
                    match self.put_back(&mut inner, v, slots[slot], incompr) {
                        PutBack::Done if incompr => incompressible += 1,
                        // An event is pending: the page waits in its slot (a fault takes it from
                        // there) and is put back after the event (`retry_put_backs`).
                        PutBack::Again => withheld[slot] = true,
                        _ => {}
                    }
                } else if kept[slot] == Kept::Stored {
                    // Faulted back from staging, or dropped by the program, meanwhile. (A clean
                    // page faulted back keeps its copy; one dropped lost it with `forget`.)
                    let _ = s.store.discard(v as u64);
                }
            }
        }
        if clean > 0 {
            self.counters.clean_evictions.fetch_add(clean, Relaxed);
        }
        if refused {
            // The store is full: copies of resident pages make room for pages that must leave.
            self.give_up_copies(4 * STAGING_SLOTS);
        } else if evicted > 0 && !s.store.room_for_copies() {
            // Past half full, copies go as fast as pages come in (twice as fast), so that they
            // never raise the store's peak: copies are a cache of the store's spare room.
            self.give_up_copies(2 * evicted);
        }
        self.counters.staged_now.store(0, Relaxed);
        // A moved page stays in its slot until slots run out (see slots.rs).
        for (k, &slot) in slots.iter().enumerate() {
            if withheld[k] {
                // Still holds a page to put back.
                let incompr = kept[k] == Kept::Incompressible;
                self.put_backs.lock().push((victims[k], slot, incompr));
                self.counters.put_backs_deferred.fetch_add(1, Relaxed);
                continue;
            }
            if outcome[k] || stale[k] {
                self.slots.put_used(slot);
            } else {
                self.slots.put_empty(slot);
            }
        }
        self.counters.evictions.fetch_add(evicted as u64, Relaxed);
        if incompressible > 0 {
            self.counters
                .incompressible_kept
                .fetch_add(incompressible, Relaxed);
            if !self.incompressible_said.swap(true, Relaxed) {
                tracing::info!(
                    "pages that do not compress stay in DRAM, outside the budget \
                     (stored they would save nothing); see incompressible in zmem stat"
                );
            }
        }
        // Pages kept back count as evicted for the caller: they left the budget.
        evicted + incompressible as usize
    }

    /// Maps a Staged page that was not stored back at its address from staging `slot`, and
    /// counts it resident again (inside the budget, or outside it when `incompressible`).
    /// EAGAIN (an event is pending: fork, remove, unmap) leaves it Staged, for the caller to try
    /// again later; a page whose memory is gone (ENOENT) becomes Absent (its event follows).
    fn put_back(
        &self,
        inner: &mut crate::manager::SpaceInner,
        v: u32,
        slot: crate::slots::Slot,
        incompressible: bool,
    ) -> PutBack {
        let s = &self.root;
        let i = v as usize;
        match s
            .uffd
            .copy(s.page_addr(i), self.slots.addr(slot) as *const u8, PAGE)
        {
            Ok(()) => {
                inner.staged.remove(&v);
                inner.state.set(i, Resident);
                if incompressible {
                    inner.keep_incompressible(v);
                } else {
                    inner.resident += 1;
                    if let Some(t) = inner.tracker.as_mut() {
                        t.insert_quiet(v);
                    }
                }
                PutBack::Done
            }
            Err(e) if e.code() == libc::EAGAIN => PutBack::Again,
            Err(e) if e.code() == libc::ENOENT || e.code() == libc::ESRCH => {
                inner.staged.remove(&v);
                inner.state.set(i, Absent);
                PutBack::Gone
            }
            Err(e) => {
                tracing::error!("page {i} could neither be stored nor put back: {e}");
                inner.staged.remove(&v);
                inner.state.set(i, Poisoned);
                PutBack::Gone
            }
        }
    }

    /// Puts back the pages an earlier batch could not (EAGAIN: an event was pending), and
    /// hands their slots back. A page that left Staged meanwhile (a fault took it from its slot,
    /// or the program dropped it) needs nothing more. Called under `evict_lock`.
    pub(crate) fn retry_put_backs(&self) {
        let mut pending = self.put_backs.lock();
        if pending.is_empty() {
            return;
        }
        let s = &self.root;
        let mut inner = s.inner.lock();
        pending.retain(|&(v, slot, incompressible)| {
            let still = inner.state.get(v as usize) == Staged
                && inner.staged.get(&v) == Some(&self.slots.addr(slot));
            if still && self.put_back(&mut inner, v, slot, incompressible) == PutBack::Again {
                return true;
            }
            self.slots.put_used(slot);
            false
        });
    }

    /// Discards up to `max` clean copies, oldest first, for room in the store; how many. The
    /// copies of Staged pages stay: a batch not settled yet may find its page unchanged and
    /// make the copy its stored content.
    fn give_up_copies(&self, max: usize) -> usize {
        let s = &self.root;
        let mut pages = Vec::new();
        {
            let mut inner = s.inner.lock();
            let SpaceInner { copies, state, .. } = &mut *inner;
            if let Some(c) = copies.as_mut() {
                c.take_oldest(max, &mut pages, |p| state.get(p as usize) == Staged);
            }
        }
        for &p in &pages {
            let _ = s.store.discard(u64::from(p));
        }
        if !pages.is_empty() {
            self.counters
                .copies_given_up
                .fetch_add(pages.len() as u64, Relaxed);
            // Room was made: the next batch need not wait out the full store's back-off.
            self.store_full.store(false, Relaxed);
        }
        pages.len()
    }

    /// Stores one evicted page. A page that does not compress is not stored (it is put back
    /// and kept resident outside the budget, see `SpaceInner::incompressible`): stored raw, it
    /// would cost as much DRAM as it does mapped, plus a fault each time it comes back.
    fn store_page(&self, v: u32, page: &[u8]) -> Kept {
        match self.root.store.write_if_smaller(v as u64, page) {
            Ok(stored) => {
                if self.store_full.load(Relaxed) {
                    self.store_full.store(false, Relaxed);
                }
                if stored {
                    Kept::Stored
                } else {
                    Kept::Incompressible
                }
            }
            Err(e) => {
                // A full store (its memory limit) is expected under pressure, and a full pool
                // takes and refuses pages in turn: say it at most once per FULL_SAID_MS.
                let now = now_ms();
                self.store_full_ms.store(now, Relaxed);
                self.store_full.store(true, Relaxed);
                let refused = self.counters.store_refused.fetch_add(1, Relaxed) + 1;
                let said = self.store_full_said_ms.load(Relaxed);
                if (said == 0 || now.saturating_sub(said) >= FULL_SAID_MS)
                    && self
                        .store_full_said_ms
                        .compare_exchange(said, now.max(1), Relaxed, Relaxed)
                        .is_ok()
                {
                    tracing::warn!(
                        "cannot store evicted pages, they stay resident: {e} \
                         ({refused} pages refused so far: store_refused in zmem stat)"
                    );
                }
                Kept::Refused
            }
        }
    }

    /// Stores the evicted pages in staging `slots` as one group (one block); if the store
    /// refuses the group, page by page, so that each page that still fails is put back alone.
    fn store_group<'a>(
        &self,
        slots: &[usize],
        victims: &[u32],
        page_at: &dyn Fn(usize) -> &'a [u8],
        kept: &mut [Kept; STAGING_SLOTS],
    ) {
        let mut indices = [0u64; MAX_BLOCK_PAGES];
        let mut pages: [&[u8]; MAX_BLOCK_PAGES] = [&[]; MAX_BLOCK_PAGES];
        for (k, &slot) in slots.iter().enumerate() {
            indices[k] = u64::from(victims[slot]);
            pages[k] = page_at(slot);
        }
        let n = slots.len();
        if self
            .root
            .store
            .write_group(&indices[..n], &pages[..n])
            .is_ok()
        {
            for &slot in slots {
                kept[slot] = Kept::Stored;
            }
            if self.store_full.load(Relaxed) {
                self.store_full.store(false, Relaxed);
            }
            return;
        }
        for &slot in slots {
            kept[slot] = self.store_page(victims[slot], page_at(slot));
        }
    }

    /// Moves the survivors of blocks that lost half of their pages to faults into new blocks,
    /// so that dead pages do not hold DRAM (a block is freed only with its last page). Called
    /// after evictions, never on a fault's own path. About one page is repacked per fault, so
    /// a call handles up to two blocks' worth.
    fn repack(&self) {
        if self.evict_group > 1 {
            let store = &self.root.store;
            if store.repack_groups(self.evict_group) == self.evict_group {
                store.repack_groups(self.evict_group);
            }
        }
    }

    /// Unmaps whatever is in `[addr, addr + len)` of the staging area (`Uffd::clear_registered`).
    /// Called with `evict_lock` held.
    pub(crate) fn clear_staging(&self, addr: usize, len: usize) {
        debug_assert!(addr >= self.staging && addr + len <= self.staging + STAGING_SLOTS * PAGE);
        self.root.uffd.clear_registered(addr, len);
    }

    /// One step of the adaptive budget (if one is due, or `force`), applied.
    pub fn adaptive_step(&self, a: &mut BudgetLoop, force: bool) {
        let signals = || {
            let c = &self.counters;
            let refaults = c.major_faults.load(Relaxed) + c.staged_faults.load(Relaxed);
            Signals {
                refaults,
                faults: refaults + c.zero_faults.load(Relaxed),
                resident: (self.root.inner.lock().resident * PAGE) as u64,
                budget_pages: self.budget(),
            }
        };
        if let Some(pages) = a.tick(signals, force) {
            self.budget_pages.store(pages, Relaxed);
        }
    }

    /// The evictor waits up to `d`, or until kicked (a fork's prepare hook kicks it, so that
    /// it parks at once instead of after its nap: a fork waited up to 5 ms for it).
    fn evictor_nap(&self, d: Duration) {
        let mut g = self.evictor_mutex.lock();
        if !*g {
            // A fork meanwhile parks this thread without waking it (`Naps`).
            let w = self.workers - 1;
            self.naps.begin(w);
            self.evictor_wake.wait_for(&mut g, d);
            if self.naps.end(w) {
                drop(g);
                self.stay_parked(true);
                return;
            }
        }
        *g = false;
    }

    pub fn evictor_loop(&self, adaptive: Option<BudgetLoop>) {
        let mut adaptive = adaptive;
        let mut last_reap = Instant::now();
        let mut last_retry = Instant::now();
        let mut last_trickle = Instant::now();
        let mut last_urgent = Instant::now();
        let mut idle_cpu = zmem_os::idle::IdleCpu::new();
        if self.async_settle {
            self.colocation.register_off();
        } else {
            self.colocation.register_ours();
        }
        while !self.stop.load(Relaxed) {
            #[cfg(test)]
            if self.evictor_paused.load(Acquire) {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            if self.forking.load(Acquire) {
                self.stay_parked(false);
                continue;
            }
            crate::manager::bury_dead_stores();
            if let Some(a) = adaptive.as_mut() {
                self.adaptive_step(a, false);
            }
            // A dictionary whose samples are all taken is trained here, holding no lock a
            // fault may wait on (~0.1 s, once per learning round; the handlers evict
            // meanwhile).
            self.root.store.learn_pass();
            // While the pool saves next to nothing and raw pages wait for their entropy try,
            // the tries are made between batches too (`BackingStore::entropy_urgent`).
            let mut urgent_tried = 0;
            if last_urgent.elapsed() >= ENTROPY_SLICE_EVERY && self.root.store.entropy_urgent() {
                last_urgent = Instant::now();
                urgent_tried = self.root.store.entropy_pass(ENTROPY_QUIET_PAGES);
            }
            if self.settle_queued() > 0 {
                continue;
            }
            let resident = self.root.inner.lock().resident;
            // Under faults the handlers evict between faults themselves; this thread takes over
            // when they are quiet (a lowered budget, an adaptive shrink) or fall behind.
            let since_fault = self.last_fault_at.lock().elapsed();
            self.colocation.check_quiet(since_fault);
            let quiet = since_fault > Duration::from_millis(20);
            let low = if quiet {
                self.low_water()
            } else {
                self.budget()
            };
            // With async settling the evictor moves pages only when the faults are quiet: a
            // move from its CPU while the program runs costs a TLB-flush IPI.
            if (quiet || !self.async_settle) && resident > low {
                // At most ASYNC_BATCH at once: if this thread is preempted while it holds its
                // batch, faults still find staging slots to evict into.
                if self.evict((resident - low).min(ASYNC_BATCH)) == 0 {
                    let full = self.store_full.load(Relaxed);
                    self.evictor_nap(Duration::from_millis(if full { 20 } else { 1 }));
                }
                self.repack();
                continue;
            }
            self.evict_children();
            // The store's entropy tries left for later: a slice while faults are quiet and
            // half a CPU is idle, else a trickle (a zstd compression each, ~15 us a page).
            let tried = if urgent_tried > 0 {
                urgent_tried
            } else if quiet && idle_cpu.half_a_cpu_idle() {
                self.root.store.entropy_pass(ENTROPY_QUIET_PAGES)
            } else if last_trickle.elapsed() >= ENTROPY_TRICKLE_EVERY {
                last_trickle = Instant::now();
                self.root.store.entropy_pass(ENTROPY_TRICKLE_PAGES)
            } else {
                0
            };
            let nap = if tried == ENTROPY_QUIET_PAGES && (quiet || urgent_tried > 0) {
                ENTROPY_SLICE_EVERY.as_millis() as u64
            } else {
                50
            };
            self.evictor_nap(Duration::from_millis(nap));
            if !self.put_backs.lock().is_empty() {
                let _g = self.evict_lock.lock();
                self.retry_put_backs();
            }
            if last_retry.elapsed() >= INCOMPRESSIBLE_RETRY {
                last_retry = Instant::now();
                let mut inner = self.root.inner.lock();
                if !inner.incompressible.is_empty() {
                    inner.retry_incompressible(INCOMPRESSIBLE_RETRY_PAGES);
                }
            }
            if last_reap.elapsed() >= Duration::from_secs(1) {
                last_reap = Instant::now();
                self.reap_children();
                // Faults free objects all over the pool (a page read back leaves its hole),
                // and nothing else gives those spans back under a policy without cold passes.
                self.root.store.compact_if_loose();
            }
        }
    }
}

/// Pages kept in DRAM because they did not compress are offered again, a few at a time, this
/// often: the program may have written compressible data into them since. At most 256 pages
/// per 10 s, i.e. one compression attempt per 40 ms: nothing beside the faults.
const INCOMPRESSIBLE_RETRY: Duration = Duration::from_secs(10);
const INCOMPRESSIBLE_RETRY_PAGES: usize = 256;

/// The store's deferred entropy tries (`BackingStore::entropy_pass`) the evictor makes per
/// idle round while faults are quiet (then it naps 2 ms, so at most ~a quarter of a CPU), and
/// while they come, per `ENTROPY_TRICKLE_EVERY` (~0.1% of a CPU).
const ENTROPY_QUIET_PAGES: usize = 32;
/// A slice of `ENTROPY_QUIET_PAGES` tries at most this often: after a full slice on idle CPU
/// (the nap), and while the tries are urgent, busy or not (~0.6 ms of zstd per 2 ms: under a
/// third of a CPU).
const ENTROPY_SLICE_EVERY: Duration = Duration::from_millis(2);
const ENTROPY_TRICKLE_PAGES: usize = 8;
const ENTROPY_TRICKLE_EVERY: Duration = Duration::from_millis(100);

/// What became of a page put back (see `Shared::put_back`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum PutBack {
    Done,
    /// An event is pending: try again after it.
    Again,
    /// Its memory is gone (Absent) or it could not be mapped (Poisoned).
    Gone,
}

/// Pages handlers move out for the evictor before it is woken to settle them (`evict_async`):
/// three quarters of the slots, the rest left for faults that must evict themselves meanwhile.
const ASYNC_BATCH: usize = STAGING_SLOTS * 3 / 4;
/// Pages a handler moves out per call (between two looks for faults).
const ASYNC_STEP: usize = 8;

/// Pages moved out into staging slots, not yet compressed and settled (`Shared::settle`).
pub(crate) struct Batch {
    victims: Vec<u32>,
    slots: Vec<Slot>,
    /// Moved (the slot holds the page).
    outcome: [bool; STAGING_SLOTS],
    /// The slot held something else (EEXIST) and stays used.
    stale: [bool; STAGING_SLOTS],
    /// The hash of each victim's clean copy (0: none), see the `copies` module.
    copy_hash: [u128; STAGING_SLOTS],
}

impl Batch {
    /// Pages moved out of the program.
    fn moved(&self) -> usize {
        self.outcome.iter().filter(|&&o| o).count()
    }
}

/// Moves the pages of `victims[from..]` that are in `unsettled` into `waiting`.
fn set_aside(unsettled: &[u32], victims: &mut Vec<u32>, from: usize, waiting: &mut Vec<u32>) {
    if unsettled.is_empty() {
        return;
    }
    let mut k = from;
    while k < victims.len() {
        if unsettled.contains(&victims[k]) {
            waiting.push(victims.swap_remove(k));
        } else {
            k += 1;
        }
    }
}

/// What became of an evicted page offered to the store.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kept {
    Stored,
    /// Unchanged since it was faulted in: its clean copy is its stored content.
    Clean,
    /// The store is full: the page goes back under the budget.
    Refused,
    /// It does not compress: the page goes back outside the budget.
    Incompressible,
}

/// Forces the kernel to give this process its own copy of a page shared after fork: a locked
/// read-modify-write that changes nothing. The page is present (we only evict resident pages),
/// so this is a copy-on-write fault the kernel handles, never a userfault.
fn unshare(addr: usize) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `addr` is a mapped, writable page of our region; `lock or` with 0 leaves its
    // value unchanged and is atomic against concurrent writers.
    unsafe {
        std::arch::asm!("lock or qword ptr [{0}], 0", in(reg) addr, options(nostack));
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: as above; a successful compare-exchange writes the value it read.
        let a = unsafe { std::sync::atomic::AtomicU64::from_ptr(addr as *mut u64) };
        let v = a.load(std::sync::atomic::Ordering::Relaxed);
        let _ = a.compare_exchange(
            v,
            v,
            std::sync::atomic::Ordering::SeqCst,
            std::sync::atomic::Ordering::Relaxed,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Budget, Region, RegionConfig, RegionError};

    /// Batches queued for the evictor hold every staging slot and the evictor does not run
    /// (its CPU busy elsewhere; paused here): faults settle a queued batch themselves and keep
    /// the budget. They used to map page after page over it until the evictor ran again.
    #[test]
    fn faults_keep_the_budget_while_queued_batches_hold_every_staging_slot() {
        let budget = 256;
        let size = 4096 * PAGE;
        let r = match Region::new(RegionConfig::new(
            size as u64,
            Budget::Fixed((budget * PAGE) as u64),
        )) {
            Ok(r) => r,
            Err(e @ RegionError::Permission { .. }) => {
                eprintln!("skipped: {e}");
                return;
            }
            Err(e) => panic!("creating a region: {e}"),
        };
        let shared = r.shared.as_ref().unwrap();
        assert!(shared.async_settle, "the default settles asynchronously");
        // SAFETY: the region is ours and `size` bytes long.
        let mem = unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), size) };
        let value = |i: usize| (i / PAGE * 7 + i % 253) as u8;
        let touch = |mem: &mut [u8], pages: std::ops::Range<usize>| {
            for p in pages {
                for i in (p * PAGE..(p + 1) * PAGE).step_by(64) {
                    mem[i] = value(i);
                }
            }
        };
        touch(mem, 0..budget);
        // Pause the evictor (and let a round it is in finish), then queue batches that take
        // every slot, as handlers do.
        shared.evictor_paused.store(true, Release);
        std::thread::sleep(Duration::from_millis(100));
        // (Handlers may have queued some already, evicting toward the low-water mark.)
        let held = || -> usize { shared.queued.lock().iter().map(|b| b.slots.len()).sum() };
        while held() < STAGING_SLOTS {
            let batch = shared.stage(STAGING_SLOTS - held()).expect("a batch");
            shared.queued.lock().push_back(batch);
        }
        touch(mem, budget..4 * budget);
        let s = r.stats();
        shared.evictor_paused.store(false, Release);
        assert!(s.resident <= s.budget, "{s:?}");
        assert!(s.over_budget_faults == 0, "{s:?}");
        for p in 0..4 * budget {
            for i in (p * PAGE..(p + 1) * PAGE).step_by(64) {
                assert_eq!(mem[i], value(i), "byte {i}");
            }
        }
    }

    /// UFFDIO_MOVE answers EEXIST when the destination slot is not empty. The evictor clears
    /// the slot and moves the page anyway: nothing is lost, nothing waits.
    #[test]
    fn occupied_staging_slots_are_cleared_and_pages_still_evicted() {
        // Far above what the test touches: the evictor thread leaves these pages alone.
        let size = 4096 * PAGE;
        let r = match Region::new(RegionConfig::new(size as u64, Budget::Fixed(size as u64))) {
            Ok(r) => r,
            Err(e @ RegionError::Permission { .. }) => {
                eprintln!("skipped: {e}");
                return;
            }
            Err(e) => panic!("creating a region: {e}"),
        };
        let pages = 8;
        // SAFETY: the region is ours and at least `pages` pages long.
        let mem = unsafe { std::slice::from_raw_parts_mut(r.as_ptr(), pages * PAGE) };
        for (i, b) in mem.iter_mut().enumerate() {
            *b = (i / PAGE * 31 + i % 251) as u8;
        }
        let shared = r.shared.as_ref().unwrap();
        // Map the zero page into every slot, as a failed recycle would leave them.
        shared
            .root
            .uffd
            .zeropage(shared.staging, STAGING_SLOTS * PAGE)
            .unwrap();
        // The handler counts a page resident just after the mapping woke this thread.
        let t0 = Instant::now();
        while r.stats().resident < (pages * PAGE) as u64 && t0.elapsed() < Duration::from_secs(5) {
            std::thread::yield_now();
        }
        let before = r.stats();
        // At least the pages asked for; unprotected neighbours (fault-around mapped some) may
        // leave with them.
        let evicted = shared.evict(pages);
        assert!(evicted >= pages, "{evicted}: {:?}", r.stats());
        let s = r.stats();
        assert_eq!(s.staging_cleared, evicted as u64, "{s:?}");
        assert_eq!(s.evictions, evicted as u64, "{s:?}");
        assert_eq!(
            s.resident,
            before.resident - (evicted * PAGE) as u64,
            "{s:?}"
        );
        for (i, b) in mem.iter().enumerate() {
            assert_eq!(*b, (i / PAGE * 31 + i % 251) as u8, "byte {i}");
        }
    }
}
