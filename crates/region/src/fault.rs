//! Resolving a fault: a page comes back from its staging slot, from the store (with
//! fault-around for sequential faults, consecutive stored pages read at once so that a block is
//! decoded once), or as zeros; the faulting thread is woken when its page is mapped. The fault
//! path allocates nothing: its buffers belong to the handler thread.

use std::sync::atomic::Ordering::{Acquire, Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use zmem_os::Errno;

use crate::config::PAGE;
use crate::manager::{Served, Shared, Space, Step, STAGING_PAGES, STAGING_SLOTS};
use crate::state::PageState::*;
use crate::uffd;

/// Faults in a row for which the kernel refused memory (UFFDIO_COPY/ZEROPAGE: ENOMEM, e.g. a
/// memory cgroup at its limit) before the process is out of memory; each waits 2 ms after trying
/// to evict. Then zmem kills the process, as the kernel's OOM killer would a swapless one.
pub(crate) const OOM_STREAK: u64 = 500;

impl Shared {
    /// Whether the calling thread is the one forking now: until its fork is done its faults are
    /// served whatever waits (it holds the fork, and everything waits for the fork).
    pub(crate) fn is_forking_thread(&self) -> bool {
        // SAFETY: gettid has no preconditions.
        self.forking.load(Acquire) && self.forking_tid.load(Relaxed) == unsafe { libc::gettid() }
    }

    /// Makes room for `n` more resident pages in the root space (direct eviction).
    fn make_room(self: &Arc<Self>, n: usize) {
        let budget = self.budget();
        let resident = self.root.inner.lock().resident;
        if resident + n > budget {
            let want = resident + n - budget;
            let mut done = self.evict(want);
            if done == 0 {
                // Every staging slot is held: by batches queued for the evictor, which has not
                // got to them (its CPU is busy elsewhere), so one is settled here; or by the
                // batch the evictor settles, whose slots come back when it is done. Mapping
                // the page anyway let jq at `--resident 64M` reach 124 MiB resident beside a
                // parallel build.
                if !self.settle_one_queued() {
                    drop(self.settle_lock.lock());
                }
                done = self.evict(want);
            }
            self.counters
                .direct_evictions
                .fetch_add(done as u64, Relaxed);
        }
    }

    pub(crate) fn serve_fault(
        self: &Arc<Self>,
        s: &Arc<Space>,
        addr: usize,
        flags: u64,
        buf: &mut Vec<u8>,
    ) -> Served {
        let Some(idx) = s.index_of(addr) else {
            return self.serve_foreign(s, addr);
        };
        if self.range_events_deferred.load(Acquire) > 0 && !self.is_forking_thread() {
            // A range event read during a fork waits for the snapshot; the page may be one the
            // program dropped and writes again (see `range_events_deferred`).
            return Served::Retry;
        }
        if s.is_root && self.fork_snapshot_pending() {
            if !self.is_forking_thread() {
                return Served::Retry; // mapped now, the page would be missing from the child
            }
            if crate::signal::serving_a_fault() {
                // The forking thread itself, between its fork's page-table copy and the gate's
                // reopening (signal route): it cannot wait for the snapshot, which waits for
                // it. Mapped as on the handler route (`map_for_forking_thread`): the state
                // stays what it was, so the snapshot gives the child the page's content, and
                // the bookkeeping follows the snapshot (`forker_mapped`).
                if buf.len() < PAGE {
                    buf.resize(PAGE, 0);
                }
                if let Some(Stored | Absent) = self.map_for_forking_thread(s, addr, buf) {
                    let mut mapped = self.forker_mapped.lock();
                    if mapped.len() < mapped.capacity() {
                        mapped.push(idx as u32);
                    }
                }
                return Served::Done;
            }
        }
        if s.is_root {
            let t0 = Instant::now();
            self.make_room(1);
            self.counters.add_ns(&self.counters.room_ns, t0);
        } else {
            self.make_room_in_child(s);
        }
        let mut inner = s.inner.lock();
        if s.is_root && inner.resident >= self.budget() {
            self.counters.over_budget_faults.fetch_add(1, Relaxed);
        }
        let st = inner.state.get(idx);
        match st {
            // Another fault maps it, and its mapping wakes every thread waiting on the page;
            // but it may have mapped it already, the program run on, dropped the page
            // (madvise: its REMOVE leaves a Faulting page alone) and touched it again: this
            // message is then the only one, and nothing else would wake the thread (a test hung
            // so in CI). Served once that fault has recorded its outcome.
            Faulting => return Served::Retry,
            Poisoned => {
                drop(inner);
                if let Err(e) = s.uffd.poison(addr, PAGE) {
                    if e.code() == libc::EAGAIN {
                        return Served::Retry;
                    }
                    tracing::error!("poison {addr:#x}: {e}");
                }
                return Served::Done;
            }
            // A child's page being moved out (`child`): the batch wakes its waiters.
            Staged if !s.is_root => return Served::Done,
            Staged => {
                if s.is_root && self.fork_snapshot_pending() && !self.is_forking_thread() {
                    return Served::Retry; // checked again under the lock: see the top
                }
                let slot = inner.staged[&(idx as u32)];
                // The slot page is present (moved there) and stays until the state changes,
                // which needs this lock.
                match s.uffd.copy(addr, slot as *const u8, PAGE) {
                    Ok(()) => {}
                    Err(e) if e.code() == libc::EEXIST => {
                        self.counters.staged_present.fetch_add(1, Relaxed);
                        let _ = s.uffd.wake(addr, PAGE);
                    }
                    Err(e) if e.code() == libc::EAGAIN => return Served::Retry,
                    Err(e) => {
                        tracing::error!("copy staged page {idx}: {e}");
                        return Served::Done;
                    }
                }
                inner.state.set(idx, Resident);
                inner.staged.remove(&(idx as u32));
                inner.admit(idx as u32);
                self.counters.staged_faults.fetch_add(1, Relaxed);
                return Served::Done;
            }
            _ => {}
        }
        // Absent, Resident (dropped behind our back: zero, as anonymous memory reads) or Stored.
        // Fault-around follows a walk in either direction: up from the page after the last
        // run, down from the page before it, once the program has stepped that way twice in a
        // row (a walk's runs follow one another, so each is a step too). One step is not a walk:
        // every object that spans a page boundary makes one (memcached's ~4 KiB items: on the
        // signal route 31k faults mapped 27k pages more, at 0.63x the GETs/s), and
        // sqlite at 16M and perl at 64M step down once often and then go elsewhere (runs there
        // cost them 6% more faults and 10-30% more time). GNU sort fills its buffer from the
        // end: at --resident 64M 19.8k of its 22.8k first touches were each one page below the
        // one before (DESIGN-NOTES, "Fault-around").
        let (last_lo, last_hi) = inner.last_run;
        let step = if idx == last_hi.wrapping_add(1) {
            Some(Step::Up)
        } else if idx.wrapping_add(1) == last_lo {
            Some(Step::Down)
        } else {
            None
        };
        let walk = step.is_some() && step == inner.last_step;
        let down = walk && step == Some(Step::Down);
        // A fault inside the last run or on a page already mapped (a second message for a
        // page just mapped: another thread, or the same one woken early) says nothing about
        // the walk.
        let repeat = st == Resident || (last_lo..=last_hi).contains(&idx);
        if !repeat {
            inner.last_step = step;
        }
        let mut max_run = if walk { self.fault_around.max(1) } else { 1 };
        if s.is_root {
            // Fault-around never takes the region over its budget.
            max_run = max_run.min(self.budget().saturating_sub(inner.resident).max(1));
        }
        let around = |i: usize| matches!(inner.state.get(i), Absent | Stored);
        // The run is [lo, lo + run); the faulting page is at `mine` in it.
        let mut lo = idx;
        let mut run = 1;
        if down {
            while run < max_run && lo > 0 && around(lo - 1) {
                lo -= 1;
                run += 1;
            }
        } else {
            while run < max_run && idx + run < s.pages && around(idx + run) {
                run += 1;
            }
        }
        if run > 1 && !inner.runs.start(lo, run) {
            // Every run entry taken (as many fault-arounds at once): this page alone.
            lo = idx;
            run = 1;
        }
        let mine = idx - lo;
        if !repeat {
            inner.last_run = (lo, lo + run - 1);
        }
        // No allocation per fault: a run is at most 64 pages (fault_around is checked).
        let mut kinds_buf = [Absent; 64];
        for (k, kind) in kinds_buf[..run].iter_mut().enumerate() {
            *kind = inner.state.get(lo + k);
        }
        let kinds = &mut kinds_buf[..run];
        // `RegionConfig::verify_pages`: the sums the run's stored pages must come back with.
        let mut expect = [0u64; 64];
        if let Some(sums) = inner.sums.as_ref() {
            for (k, e) in expect[..run].iter_mut().enumerate() {
                if kinds[k] == Stored {
                    *e = sums.expected(lo + k).unwrap_or(0);
                }
            }
        }
        // A page mapped here that we believed resident is counted again below: take it out.
        if st == Resident {
            self.counters.on_resident.fetch_add(1, Relaxed);
            inner.uncount_resident(idx as u32);
            inner.drop_copy(&**s.store, idx as u32);
            kinds[mine] = Absent;
        }
        for k in 0..run {
            inner.state.set(lo + k, Faulting);
        }
        drop(inner);

        let write = flags & uffd::PAGEFAULT_FLAG_WRITE != 0;
        let use_zero = !write && kinds.iter().all(|&k| k != Stored);
        let t_read = Instant::now();
        if !use_zero {
            if buf.len() < run * PAGE {
                buf.resize(run * PAGE, 0);
            }
            let mut at = 0;
            while at < run {
                if kinds[at] != Stored {
                    buf[at * PAGE..(at + 1) * PAGE].fill(0);
                    at += 1;
                    continue;
                }
                // Consecutive stored pages in one read: members of one block are decoded once.
                let end = (at..run).find(|&j| kinds[j] != Stored).unwrap_or(run);
                let read = s
                    .store
                    .read_batch((lo + at) as u64, &mut buf[at * PAGE..end * PAGE]);
                let first = at;
                at = end;
                let bad = match read {
                    Err(e) => {
                        let k = match e.lost_page() {
                            Some(index) if (lo + first..lo + end).contains(&(index as usize)) => {
                                index as usize - lo
                            }
                            _ => first,
                        };
                        tracing::error!("page {} of the region cannot be read back: {e}", lo + k);
                        Some(k)
                    }
                    Ok(()) => self.check_sums(lo, &buf[..end * PAGE], &expect[first..end], first),
                };
                if let Some(k) = bad {
                    // Corrupt data must not become silently wrong memory: SIGBUS.
                    let r = s.uffd.poison(s.page_addr(lo + k), PAGE);
                    let mut inner = s.inner.lock();
                    abandon_run(&mut inner, lo, kinds);
                    if r.is_ok() {
                        inner.state.set(lo + k, Poisoned);
                        let _ = s.store.discard((lo + k) as u64);
                    }
                    drop(inner);
                    if k != mine {
                        // The faulting thread waits on its own page, not the poisoned one:
                        // let it fault again (on its page alone).
                        let _ = s.uffd.wake(addr, PAGE);
                    }
                    return match r {
                        Err(e) if e.code() == libc::EAGAIN => Served::Retry,
                        _ => Served::Done,
                    };
                }
            }
        }
        self.counters.add_ns(&self.counters.read_ns, t_read);
        let t_map = Instant::now();
        // A run is mapped under the lock, which range events are applied under, so that no page
        // the program dropped meanwhile is mapped after the kernel's zap (see `Runs`): those
        // are left out, and the run shrinks to the pages around ours that none falls between.
        let mut held = (run > 1).then(|| {
            crate::manager::test_pause(&self.run_delay_us);
            s.inner.lock()
        });
        let (first, end) = match held.as_mut() {
            Some(inner) => {
                if self.range_events_deferred.load(Acquire) > 0 && !self.is_forking_thread() {
                    // A range event read during a fork (another thread's, anywhere in the
                    // process) waits for its snapshot, unapplied (`range_events_deferred`): it
                    // may drop a page of this run, which the kernel zaps as soon as the event
                    // is read, and mapping the page now would bring its old content back for
                    // good ("page 10 after DONTNEED" in a test beside forking ones on a loaded
                    // machine). The run is given up; the fault comes again once it is applied.
                    abandon_run(inner, lo, kinds);
                    return Served::Retry;
                }
                let dropped = inner.runs.finish(lo) & !(1u64 << mine);
                let gone = |k: usize| dropped & (1u64 << k) != 0;
                for k in (0..run).filter(|&k| gone(k)) {
                    if kinds[k] == Stored {
                        let _ = s.store.discard((lo + k) as u64);
                    }
                    kinds[k] = Absent;
                }
                let first = (0..mine).rev().find(|&k| gone(k)).map_or(0, |k| k + 1);
                let end = (mine + 1..run).find(|&k| gone(k)).unwrap_or(run);
                (first, end)
            }
            None => (0, run),
        };
        // Map the run in one call. If that fails part-way, go page by page so that each page's
        // outcome is known exactly (a page marked resident must really be mapped).
        let refuse_mine = run > 1
            && self
                .own_page_refusals
                .fetch_update(Relaxed, Relaxed, |n| n.checked_sub(1))
                .is_ok();
        let map = |at: usize, pages: usize| -> Result<(), Errno> {
            if refuse_mine && (at..at + pages).contains(&(lo + mine)) {
                return Err(Errno(libc::EAGAIN)); // tests only
            }
            let r = if use_zero {
                s.uffd.zeropage(s.page_addr(at), pages * PAGE)
            } else {
                let off = (at - lo) * PAGE;
                s.uffd
                    .copy(s.page_addr(at), buf[off..].as_ptr(), pages * PAGE)
            };
            match r {
                // Already present: our own earlier partial attempt. Wake whoever still waits.
                Err(e) if e.code() == libc::EEXIST && pages == 1 => {
                    s.uffd.wake(s.page_addr(at), PAGE)
                }
                r => r,
            }
        };
        let span = end - first;
        let mut mapped: u64 = if span == 64 {
            u64::MAX
        } else {
            ((1u64 << span) - 1) << first
        };
        let mut again = false;
        let mut enomem = false;
        if let Err(e) = map(lo + first, span) {
            mapped = 0;
            let mut first_err = Some(e);
            for k in first..end {
                let r = if span == 1 {
                    match first_err.take() {
                        Some(e) if e.code() == libc::EEXIST => map(lo + first, 1),
                        Some(e) => Err(e),
                        None => unreachable!(),
                    }
                } else {
                    map(lo + k, 1)
                };
                match r {
                    Ok(()) => mapped |= 1 << k,
                    Err(e) if e.code() == libc::EAGAIN => again = true,
                    Err(e) if e.code() == libc::ENOMEM => enomem = true,
                    Err(e) => {
                        if e.code() != libc::ENOENT && e.code() != libc::ESRCH {
                            tracing::error!("resolving fault at {:#x}: {e}", s.page_addr(lo + k));
                        }
                    }
                }
            }
        }
        drop(held);
        self.counters.add_ns(&self.counters.map_ns, t_map);
        // The faulting page may have failed to map while others of its run mapped: those are
        // recorded resident below all the same. They used to go back to Stored, "to be handled
        // on their own faults", but a mapped page never faults again: it stayed marked Stored
        // while mapped, and a calloc of its block then forgot the store's copy and left the
        // page's old bytes in place (`malloc_stress`: "calloc memory is not zero", found
        // with --trace-pages).
        let mine_mapped = mapped & (1 << mine) != 0;
        if mine_mapped && self.enomem_streak.load(Relaxed) != 0 {
            self.enomem_streak.store(0, Relaxed);
        }
        // Pages read from the store keep their copy there while it has room (see `copies`):
        // hashed here, after the faulting thread was woken, from the bytes it was given.
        let mode = self.clean_copies;
        let keep =
            s.is_root && mode != crate::CleanCopies::Off && !use_zero && s.store.room_for_copies();
        let mut hashes = [0u128; 64];
        if keep {
            for (k, &kind) in kinds.iter().enumerate() {
                if kind == Stored
                    && mapped & (1 << k) != 0
                    && (mode == crate::CleanCopies::All
                        || s.store.copy_costs_no_dram((lo + k) as u64))
                {
                    hashes[k] = crate::copies::page_hash(&buf[k * PAGE..(k + 1) * PAGE]);
                }
            }
        }
        let mut over_share = false;
        crate::manager::test_pause(&self.mapped_delay_us);
        if s.is_root && crate::signal::serving_a_fault() {
            // A fork may have copied the page tables since this fault began (before the copy its
            // pages were Faulting, with their store entries): they stay so until the snapshot,
            // which gives the child their content (see `fork_snapshot_pending`).
            self.wait_for_fork_snapshot();
        }
        let mut inner = s.inner.lock();
        for (k, &kind) in kinds.iter().enumerate() {
            let i = lo + k;
            if inner.state.get(i) != Faulting {
                continue; // removed meanwhile: the kernel zaps what we mapped
            }
            if mapped & (1 << k) == 0 {
                inner.state.set(i, kind);
                continue;
            }
            inner.state.set(i, Resident);
            inner.admit(i as u32);
            if !use_zero {
                if let Some(c) = inner.child.as_mut() {
                    c.mapped(i as u32);
                    over_share |= c.holding() > self.child_share();
                }
            }
            if kind == Stored {
                match inner.copies.as_mut().filter(|_| hashes[k] != 0) {
                    Some(c) => c.keep(i as u32, hashes[k]),
                    None => {
                        let _ = s.store.discard(i as u64);
                    }
                }
            }
        }
        drop(inner);
        if over_share {
            self.kick_evictor(); // a forked child holds more than its share
        }
        if !mine_mapped {
            self.counters
                .fault_around_pages
                .fetch_add(u64::from(mapped.count_ones()), Relaxed);
            if again {
                return Served::Retry;
            }
            if enomem {
                self.out_of_memory(s, addr);
            }
            // Never leave the thread waiting: it retries (and fails properly if the memory is
            // gone).
            let _ = s.uffd.wake(addr, PAGE);
            return Served::Done;
        }
        self.count_fault(kinds[mine]);
        self.counters
            .fault_around_pages
            .fetch_add(u64::from(mapped.count_ones()) - 1, Relaxed);
        Served::Done
    }

    /// `RegionConfig::verify_pages`: checks pages `first..` of a run starting at page `lo`,
    /// read into `buf` (the run's buffer), against the sums they were stored with (`expect`,
    /// from `first`; 0: none). The first page that differs, as its place in the run.
    fn check_sums(&self, lo: usize, buf: &[u8], expect: &[u64], first: usize) -> Option<usize> {
        let mut checked = 0;
        for (j, &want) in expect.iter().enumerate().filter(|&(_, &w)| w != 0) {
            let k = first + j;
            let page = &buf[k * PAGE..(k + 1) * PAGE];
            checked += 1;
            if crate::verify::page_sum(page) != want {
                self.counters.verified.fetch_add(checked, Relaxed);
                self.counters.mismatches.fetch_add(1, Relaxed);
                let zeros = page.iter().all(|&b| b == 0);
                tracing::error!(
                    "page {} came back from the store with other content than it was stored \
                     with{} (verify_pages): poisoned",
                    lo + k,
                    if zeros { " (all zeros)" } else { "" }
                );
                return Some(k);
            }
        }
        self.counters.verified.fetch_add(checked, Relaxed);
        None
    }

    /// A fault served: a major one if its page came from the store.
    pub(crate) fn count_fault(&self, kind: crate::state::PageState) {
        if kind == Stored {
            self.counters.major_faults.fetch_add(1, Relaxed);
        } else {
            self.counters.zero_faults.fetch_add(1, Relaxed);
        }
    }

    /// The kernel refused memory for a fault (ENOMEM). Evict and let the thread retry; after
    /// [`OOM_STREAK`] refusals in a row nothing can be freed (the store is full too): the
    /// process is out of memory and is killed (SIGKILL), as a swapless one would be by the
    /// kernel, instead of spinning forever. A forked child's fault gets SIGBUS instead.
    fn out_of_memory(self: &Arc<Self>, s: &Arc<Space>, addr: usize) {
        let streak = self.enomem_streak.fetch_add(1, Relaxed) + 1;
        if streak == 1 {
            tracing::warn!("the kernel refused memory for a fault (ENOMEM); evicting and retrying");
        }
        if s.is_root {
            let resident = s.inner.lock().resident;
            self.evict(resident.min(STAGING_SLOTS));
        }
        if streak < OOM_STREAK {
            std::thread::sleep(Duration::from_millis(2));
            return;
        }
        if !s.is_root {
            if let Err(e) = s.uffd.poison(addr, PAGE) {
                tracing::error!("poison {addr:#x} after ENOMEM: {e}");
            }
            return;
        }
        let st = s.store.stats();
        tracing::error!(
            "out of memory: no memory for a fault for {} s and nothing can be evicted (resident {} \
             pages, compressed store {} of {} bytes); killing the process",
            OOM_STREAK * 2 / 1000,
            s.inner.lock().resident,
            st.mem_used_total,
            st.mem_limit
        );
        // SAFETY: ends this process, as the OOM killer would.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }

    /// A fault outside the region's range on our descriptor: memory that was mremapped away.
    /// Its evicted content cannot be found by address any more; SIGBUS beats silent zeros.
    fn serve_foreign(&self, s: &Space, addr: usize) -> Served {
        if addr >= self.staging && addr < self.staging + STAGING_PAGES * PAGE {
            tracing::error!("fault in the staging area at {addr:#x} (a zmem bug); mapping zeros");
            let _ = s.uffd.zeropage(addr, PAGE);
            return Served::Done;
        }
        match s.uffd.poison(addr, PAGE) {
            Err(e) if e.code() == libc::EAGAIN => Served::Retry,
            Err(e) => {
                tracing::error!("fault at {addr:#x} outside the region and poison failed: {e}");
                let _ = s.uffd.wake(addr, PAGE);
                Served::Done
            }
            Ok(()) => Served::Done,
        }
    }
}

/// A run that will not be mapped: its pages still Faulting go back to what they were (their
/// store entries untouched), and its record of pages dropped meanwhile is closed.
fn abandon_run(
    inner: &mut crate::manager::SpaceInner,
    lo: usize,
    kinds: &[crate::state::PageState],
) {
    let _ = inner.runs.finish(lo);
    for (j, &kind) in kinds.iter().enumerate() {
        if inner.state.get(lo + j) == Faulting {
            inner.state.set(lo + j, kind);
        }
    }
}
