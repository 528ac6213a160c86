//! The machinery behind a [`crate::Region`]: handler threads that read the userfaultfd and
//! resolve faults themselves, an evictor that keeps the resident set under the budget, and the
//! address spaces of forked children, which are served from a snapshot of the store (and
//! evicted, past their share, through a thread of the child: `child`).
//!
//! This module holds the shared state and the handler loop that dispatches what it reads; the
//! roles live next to it: `fault` (resolving a fault), `evict` (the evictor and eviction
//! batches), `fork` (the fork hooks and the children's snapshots), `child` (eviction in a
//! forked child), `events` (the program's remove, unmap and mremap), `state` (the page states
//! and their transitions).
//!
//! Locks, always taken in this order: `evict_lock` (one eviction batch at a time), then a
//! space's `inner` (page states, policy). Neither is held across a blocking wait on the program,
//! except that a forked child's batch holds `evict_lock` until the child's thread answers.
//! No thread of ours ever touches managed memory except through UFFDIO ioctls, and the one
//! locked no-op write that unshares a page after fork (a present page: no userfault).

use std::collections::HashMap;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{Acquire, Relaxed, SeqCst},
};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use zmem_os::sync::{Condvar, Mutex};

use crate::backing::{BackingStore, StoreFactory};
use crate::config::PAGE;
use crate::policy::Tracker;
use crate::state::{PageState, StateTable};
use crate::uffd::{self, Msg, Uffd};

/// Pages moved out per eviction batch (also the number of the staging area's slots).
pub(crate) const STAGING_SLOTS: usize = 64;
/// The staging area's pages: the slots, then pages the creator never uses, so that they are
/// empty in every forked child (eviction there, see `child`).
pub(crate) const STAGING_PAGES: usize = STAGING_SLOTS + crate::child::CHILD_SLOTS;

/// Faults and events a handler can hold while a fork is in progress (see `Shared::fork_mode`).
const FORK_STASH: usize = 4096;

/// An address space with region pages in it: the creator's, or a forked child's.
pub(crate) struct Space {
    pub uffd: Uffd,
    pub base: usize,
    pub pages: usize,
    /// Dropped by `Drop for Space` (a child's on a thread of its own).
    pub store: std::mem::ManuallyDrop<Box<dyn BackingStore>>,
    /// The creator's: its store, from which forked children inherit pages (inherit.rs).
    pub heirs_parent: Option<Arc<crate::inherit::Parent>>,
    /// A child of the creator: what it inherits, marked dead when the child is gone.
    pub heir: Option<Arc<crate::inherit::Heir>>,
    pub inner: Mutex<SpaceInner>,
    /// The creator's space evicts; a child's is served from its snapshot only.
    pub is_root: bool,
    pub dead: AtomicBool,
    /// A forked child's link to its own thread, which moves its pages out (`child`).
    pub link: Mutex<Option<crate::child::ChildLink>>,
    /// On the signal route, a forked process's family link, on which it asks for its faults
    /// (`forked`), and whether this space is the child the link was made for.
    pub asks: Option<(Arc<crate::forked::FaultLink>, bool)>,
    /// A forked child's eviction batch is in flight (`Shared::evict_child_batch`): its
    /// thread may still move any of the batch's pages, so the child's events wait unread until
    /// it is done (a page dropped and written again meanwhile would be moved out). Set under
    /// `inner` with the batch's Staged marks and checked under it (`read_and_apply`); cleared
    /// once the batch is settled; read without the lock to leave the descriptor out of a poll
    /// and in `fork_mode`.
    pub moving: AtomicBool,
}

/// A fault's step from the run before it (fault-around follows two in a row).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Step {
    Up,
    Down,
}

/// Runs of pages being faulted in together (fault-around) and, for each, which of its pages
/// the program dropped meanwhile. The fault path reads the pages without the lock; a REMOVE
/// applied then leaves them alone (they are Faulting) and marks them here, and the fault path,
/// which maps a run under the lock, leaves the marked pages out: mapped after the kernel's
/// zap, their old content would show where the program expects zeros (jemalloc, for one,
/// takes pages it purged with MADV_DONTNEED as zeroed). A fixed array: the fault path
/// allocates nothing; with every entry taken, a fault maps its own page alone.
#[derive(Default)]
pub(crate) struct Runs {
    /// (first page, pages, dropped pages: bit k for page first + k).
    at: [(usize, usize, u64); 8],
    len: usize,
}

impl Runs {
    /// Starts tracking run `[lo, lo + pages)`: false when every entry is taken.
    pub fn start(&mut self, lo: usize, pages: usize) -> bool {
        if self.len == self.at.len() {
            return false;
        }
        self.at[self.len] = (lo, pages, 0);
        self.len += 1;
        true
    }

    /// Page `i` was dropped: marked in the run that holds it, if any.
    pub fn dropped(&mut self, i: usize) {
        for r in &mut self.at[..self.len] {
            if (r.0..r.0 + r.1).contains(&i) {
                r.2 |= 1 << (i - r.0);
            }
        }
    }

    /// Stops tracking the run starting at `lo`: its dropped pages (0 if it was not tracked).
    pub fn finish(&mut self, lo: usize) -> u64 {
        match self.at[..self.len].iter().position(|r| r.0 == lo) {
            Some(k) => {
                let dropped = self.at[k].2;
                self.len -= 1;
                self.at[k] = self.at[self.len];
                dropped
            }
            None => 0,
        }
    }
}

pub(crate) struct SpaceInner {
    pub state: StateTable,
    pub tracker: Option<Tracker>,
    pub resident: usize,
    /// Page -> staging slot, for Staged pages.
    pub staged: HashMap<u32, usize>,
    /// First and last page of the last fault's run (fault-around follows a walk up or down).
    pub last_run: (usize, usize),
    /// Whether the last fault was one page above or below the run before it.
    pub last_step: Option<Step>,
    /// Fault-around runs between being marked Faulting and being mapped, each with the pages
    /// of it that a REMOVE or UNMAP hit meanwhile (see `Runs`).
    pub runs: Runs,
    /// Address ranges the program unmapped (never unmapped again on destroy).
    pub unmapped: Vec<(usize, usize)>,
    pub remap_warned: bool,
    /// Pages faulted in most recently, not yet handed to the policy.
    pub nursery: std::collections::VecDeque<u32>,
    /// Page ranges `[start, end)` that are never evicted once resident (see `Region::pin`).
    pub pinned: Vec<(u32, u32)>,
    /// Resident pages inside `pinned` ranges. They are not in `resident` and not under the
    /// budget: pinned pages are bookkeeping (mimalloc's arena metadata), like zmem's own tables;
    /// counted against the budget they left a small budget no room for data (at 4M and the
    /// default 94G heap the program thrashed at millions of faults).
    pub pinned_resident: usize,
    /// Resident pages the kernel refuses to move out (UFFDIO_MOVE: EINVAL, because the program
    /// changed their protection or locked them). Outside `resident` and the policy, like pinned
    /// pages, until `Region::release_held` (the program made them writable again) or a discard.
    pub held: std::collections::HashSet<u32>,
    /// Resident pages that did not compress when evicted (stored, they would cost as much
    /// DRAM as mapped): outside `resident` and the policy, like held pages, until
    /// `retry_incompressible` gives them another chance or the program drops them.
    pub incompressible: std::collections::HashSet<u32>,
    /// Resident pages whose compressed copy the store keeps (the creator's space only, where
    /// `RegionConfig::clean_copies` is not `Off`).
    pub copies: Option<crate::copies::CleanCopies>,
    /// Victims of eviction batches staged and not settled yet (at most a few batches' worth):
    /// not picked again until their batch is settled (`Shared::stage`).
    pub unsettled: Vec<u32>,
    /// A forked child's space: the pages zmem mapped into it, for eviction there (`child`).
    pub child: Option<crate::child::ChildPages>,
    /// `RegionConfig::verify_pages` (the creator's space only): per page, the checksum of the
    /// content it was last stored with (see `verify`).
    pub sums: Option<crate::verify::Sums>,
}

/// Pages just faulted in are held back from the policy this long (in faults): the faulting
/// thread touches its page only after the handler returns, and the handler evicts in between,
/// so a page must not be evictable before that access happens.
pub(crate) const NURSERY: usize = 256;

impl SpaceInner {
    pub fn new(state: StateTable, tracker: Option<Tracker>) -> SpaceInner {
        SpaceInner {
            state,
            tracker,
            resident: 0,
            staged: HashMap::new(),
            last_run: (usize::MAX - 1, usize::MAX - 1),
            last_step: None,
            runs: Runs::default(),
            unmapped: Vec::new(),
            remap_warned: false,
            nursery: Default::default(),
            pinned: Vec::new(),
            pinned_resident: 0,
            held: Default::default(),
            incompressible: Default::default(),
            copies: None,
            unsettled: Vec::new(),
            child: None,
            sums: None,
        }
    }

    /// The victims of eviction batches not settled yet, sorted into `out` (for binary search
    /// while the lock is held): a page among them has a store entry its batch still writes or
    /// discards, so bulk operations (`remap`, `zero`) leave its store entry alone.
    pub fn unsettled_sorted(&self, out: &mut Vec<u32>) {
        out.clear();
        out.extend_from_slice(&self.unsettled);
        out.sort_unstable();
    }

    pub fn is_pinned(&self, page: u32) -> bool {
        self.pinned.iter().any(|&(a, b)| (a..b).contains(&page))
    }

    /// A page became resident through a fault: it is counted, and it joins the policy after
    /// [`NURSERY`] more (a pinned page never does).
    pub fn admit(&mut self, page: u32) {
        if self.is_pinned(page) {
            self.pinned_resident += 1;
            return;
        }
        self.resident += 1;
        let Some(t) = self.tracker.as_mut() else {
            return;
        };
        self.nursery.push_back(page);
        // At most a quarter of the resident pages wait, so small budgets can still evict.
        let cap = (self.resident / 4).clamp(1, NURSERY);
        while self.nursery.len() > cap {
            let p = self.nursery.pop_front().expect("non-empty");
            if self.state.get(p as usize) == PageState::Resident {
                t.insert(p);
            }
        }
    }

    /// A resident page stops being counted as one (it is leaving DRAM or being re-mapped).
    pub fn uncount_resident(&mut self, page: u32) {
        if self.is_pinned(page) {
            self.pinned_resident -= 1;
            return;
        }
        if !self.held.is_empty() && self.held.remove(&page) {
            return;
        }
        if !self.incompressible.is_empty() && self.incompressible.remove(&page) {
            return;
        }
        self.resident -= 1;
        if let Some(t) = self.tracker.as_mut() {
            t.remove(page);
        }
    }

    /// The program dropped page `i` (or its content became unknown): release what it held and
    /// give it state `to`. A Staged page's evictor sees the change and drops what it stored.
    #[track_caller]
    pub fn forget(&mut self, store: &dyn BackingStore, i: usize, to: PageState) {
        match self.state.get(i) {
            PageState::Resident => {
                self.uncount_resident(i as u32);
                self.drop_copy(store, i as u32);
            }
            PageState::Stored => {
                let _ = store.discard(i as u64);
            }
            PageState::Staged => {
                self.staged.remove(&(i as u32));
                self.drop_copy(store, i as u32);
            }
            _ => {}
        }
        if self.state.get(i) != to {
            self.state.set(i, to);
        }
    }

    /// Page `page`'s clean copy (if it has one) is discarded: its content changed or is gone.
    pub fn drop_copy(&mut self, store: &dyn BackingStore, page: u32) {
        if self.copies.as_mut().is_some_and(|c| c.take(page)) {
            let _ = store.discard(u64::from(page));
        }
    }

    /// A page the kernel would not move out stays resident outside the budget (see `held`).
    pub fn hold(&mut self, page: u32) {
        self.held.insert(page);
    }

    /// A resident page that did not compress stays in DRAM outside the budget.
    pub fn keep_incompressible(&mut self, page: u32) {
        self.incompressible.insert(page);
    }

    /// Up to `max` pages kept back as incompressible are counted and evictable again (their
    /// content may have changed since): how many.
    pub fn retry_incompressible(&mut self, max: usize) -> usize {
        let back: Vec<u32> = self.incompressible.iter().copied().take(max).collect();
        for &p in &back {
            self.incompressible.remove(&p);
            self.count_again(p);
        }
        back.len()
    }

    /// A resident page kept outside the budget is counted and evictable again.
    fn count_again(&mut self, page: u32) {
        self.resident += 1;
        if let Some(t) = self.tracker.as_mut() {
            t.insert_quiet(page);
        }
    }

    /// Held pages in `[first, last)` are counted and evictable again.
    pub fn release_held(&mut self, first: u32, last: u32) -> usize {
        let back: Vec<u32> = self
            .held
            .iter()
            .copied()
            .filter(|p| (first..last).contains(p))
            .collect();
        for &p in &back {
            self.held.remove(&p);
            self.count_again(p);
        }
        back.len()
    }

    /// Hands every waiting page to the policy (when nothing else is left to evict).
    pub fn drain_nursery(&mut self) {
        let Some(t) = self.tracker.as_mut() else {
            return;
        };
        for p in self.nursery.drain(..) {
            if self.state.get(p as usize) == PageState::Resident {
                t.insert(p);
            }
        }
    }
}

impl Drop for Space {
    fn drop(&mut self) {
        // SAFETY: taken exactly once, here.
        let store = unsafe { std::mem::ManuallyDrop::take(&mut self.store) };
        if self.is_root {
            return drop(store);
        }
        // A child's store stops its worker threads when dropped, which a handler must not wait
        // for (an exiting thread may touch program memory that only a handler brings back), and
        // the last reference to a dead child's space is often a handler's. So it goes to the
        // graveyard, which the evictor (or the region's drop) empties, holding no lock.
        GRAVEYARD.lock().push(store);
        BURIALS_DUE.store(true, Relaxed);
    }
}

/// The graveyard holds a store: a handler wakes the evictor to drop it (`bury_dead_stores`).
/// Each holds its pool and tables until then, which later forks copy and their children tear
/// down; the evictor, left asleep through forks (`fork::Naps`), would otherwise drop them only
/// at its next nap's end (child exit -> reaped 255 -> 400 µs with 300 forks in a row).
static BURIALS_DUE: AtomicBool = AtomicBool::new(false);

pub(crate) fn burials_due() -> bool {
    BURIALS_DUE.load(Relaxed)
}

/// Stores of dead children, waiting to be dropped off the handlers ([`bury_dead_stores`]).
/// A flag lock: a forked child releases it whoever held it (`SpinLock::reset`).
static GRAVEYARD: zmem_os::spin::SpinLock<Vec<Box<dyn BackingStore>>> =
    zmem_os::spin::SpinLock::new(Vec::new());

/// In a forked child: the parent's dead stores are not ours to drop (their threads are not
/// here; joining them would wait forever if this process later made a region of its own). A
/// lock left held by a thread of the parent has no owner here.
pub(crate) fn forget_dead_stores_in_child() {
    GRAVEYARD.reset();
    let mut g = GRAVEYARD.lock();
    std::mem::forget(std::mem::take(&mut *g));
}

/// Drops the stores of dead children (never on a handler).
pub(crate) fn bury_dead_stores() {
    let dead = {
        let mut g = GRAVEYARD.lock();
        BURIALS_DUE.store(false, Relaxed);
        std::mem::take(&mut *g)
    };
    drop(dead);
}

impl Space {
    pub fn page_addr(&self, idx: usize) -> usize {
        self.base + idx * PAGE
    }

    /// For zmem code on a program thread about to take this space's lock: the asynchronous
    /// signals blocked where a signal frame could land in this space, which the handler (who
    /// needs the lock) would have to serve (`zmem_os::thread::AsyncSignalsBlocked`).
    pub fn block_signals_for_lock(&self) -> Option<zmem_os::thread::AsyncSignalsBlocked> {
        zmem_os::thread::block_signals_where_frames_may_fault(
            self.base,
            self.base + self.pages * PAGE,
        )
    }

    pub fn index_of(&self, addr: usize) -> Option<usize> {
        if addr >= self.base && addr < self.base + self.pages * PAGE {
            Some((addr - self.base) / PAGE)
        } else {
            None
        }
    }
}

impl Counters {
    /// Adds the time since `t0` to `sum`.
    pub fn add_ns(&self, sum: &AtomicU64, t0: Instant) {
        sum.fetch_add(t0.elapsed().as_nanos() as u64, Relaxed);
    }
}

/// Counters shared by all threads of a region.
#[derive(Default)]
pub(crate) struct Counters {
    pub major_faults: AtomicU64,
    pub zero_faults: AtomicU64,
    pub staged_faults: AtomicU64,
    pub fault_around_pages: AtomicU64,
    pub evictions: AtomicU64,
    pub direct_evictions: AtomicU64,
    pub over_budget_faults: AtomicU64,
    pub unshared: AtomicU64,
    pub staging_cleared: AtomicU64,
    pub forks: AtomicU64,
    pub child_evictions: AtomicU64,
    /// HandlerTime's sums.
    pub handled_faults: AtomicU64,
    pub handled_ns: AtomicU64,
    pub room_ns: AtomicU64,
    pub read_ns: AtomicU64,
    pub map_ns: AtomicU64,
    pub idle_evict_ns: AtomicU64,
    pub evict_move_ns: AtomicU64,
    pub evict_store_ns: AtomicU64,
    pub evict_moved: AtomicU64,
    pub evict_move_calls: AtomicU64,
    pub staged_now: AtomicUsize,
    /// Evicted pages the store refused (its memory limit), put back resident.
    pub store_refused: AtomicU64,
    /// Evicted pages that did not compress, put back outside the budget (each time).
    pub incompressible_kept: AtomicU64,
    /// Evicted pages found unchanged since their fault-in: their clean copy became their stored
    /// content (no compression); copies found changed; copies given up for room.
    pub clean_evictions: AtomicU64,
    pub copies_changed: AtomicU64,
    pub copies_given_up: AtomicU64,
    /// Pages not stored whose put-back had to wait for a pending event (EAGAIN).
    pub put_backs_deferred: AtomicU64,
    /// `RegionStats::checks`.
    pub verified: AtomicU64,
    pub mismatches: AtomicU64,
    pub on_resident: AtomicU64,
    pub staged_present: AtomicU64,
    pub moved_nothing: AtomicU64,
    pub moved_unreported: AtomicU64,
    /// `Remapped`'s fields, summed (`Region::move_pages`).
    pub remapped: [AtomicU64; 4],
    /// `Zeroed`'s fields, summed (`Region::zero_pages`).
    pub zeroed: [AtomicU64; 3],
    /// Stored pages of large blocks forgotten when the program freed them (`Region::drop_stored`).
    pub freed_stored: AtomicU64,
}

pub(crate) struct Shared {
    pub root: Arc<Space>,
    pub children: Mutex<Vec<Arc<Space>>>,
    /// Made by the fork prepare hook: the parent's and the child's ends of the link to the
    /// forked child's thread (`child`).
    pub fork_link: Mutex<(Option<std::os::fd::OwnedFd>, Option<std::os::fd::OwnedFd>)>,
    /// The forked child's userfaultfd went over `fork_link` as its FORK event was read (see
    /// `fork_mode`), so `link_child` does not send it again.
    pub child_uffd_sent: AtomicBool,
    /// The same for the link a child asks for its faults on (signal route only, `forked`).
    pub fault_link: Mutex<(Option<std::os::fd::OwnedFd>, Option<std::os::fd::OwnedFd>)>,
    /// `FaultRoute::Signal`: a forked child's faults come as asks over a link, not messages.
    pub signal_route: bool,
    /// The creator's end of the link that children forked without hooks (a raw clone) ask on;
    /// the other end is listed with the region in this process, and inherited (`forked`).
    pub raw_link: std::sync::OnceLock<Arc<crate::forked::FaultLink>>,
    /// Whether the store held pages when the last fork was prepared: a child whose parent
    /// vanishes before linking it may have lost pages (`child`).
    pub stored_at_fork: AtomicBool,
    /// FORK events read but not yet served (snapshot and link): a parent that exits right
    /// after forking waits for them before handing its children their pages.
    pub forks_unserved: AtomicUsize,
    /// Reads of a userfaultfd in `fork_mode` not yet accounted: counted before each read, so
    /// that a FORK event is pending (`fork_snapshot_pending`) from before the kernel lets
    /// mappings through again until its snapshot is taken.
    pub fork_reading: AtomicUsize,
    /// Pages the forking thread mapped for itself between its fork's page-table copy and the
    /// snapshot (signal route, see `serve_fault`), their bookkeeping left for after the
    /// snapshot. Reserved up front: pushed to in a signal handler.
    pub forker_mapped: Mutex<Vec<u32>>,
    /// A store for the next fork's snapshot, made by the prepare hook: making one starts its
    /// engine's threads, and a handler must never create a thread (glibc may reuse a cached
    /// stack whose TLS array a program thread allocated in the program heap: found with python
    /// multiprocessing, a handler waiting on its own fault inside pthread_create).
    pub spare_store: Mutex<Option<Box<dyn BackingStore>>>,
    pub staging: usize,
    /// The staging area's slots: empty, or holding a page already compressed.
    pub slots: crate::slots::Slots,
    pub budget_pages: AtomicUsize,
    pub fault_around: usize,
    /// Evicted pages compressed together as one block (1 = page by page).
    pub evict_group: usize,
    /// `RegionConfig::clean_copies`.
    pub clean_copies: crate::CleanCopies,
    /// `RegionConfig::verify_pages` (the root space then keeps `SpaceInner::sums`).
    pub verify_pages: bool,
    /// Pages an eviction batch could not put back (EAGAIN), with their staging slot and whether
    /// they go back as incompressible: retried by the next batch (`Shared::retry_put_backs`).
    pub put_backs: Mutex<Vec<(u32, crate::slots::Slot, bool)>>,
    /// Pages per `UFFDIO_MOVE` in the last eviction batch (see `Shared::evict_while_idle`).
    pub run_pages: AtomicUsize,
    /// Held while victims are picked and moved out (`Shared::stage`).
    pub evict_lock: Mutex<()>,
    /// Held while a staged batch is compressed and settled (`Shared::settle`); taken after
    /// `evict_lock` where both are held.
    pub settle_lock: Mutex<()>,
    /// `RegionConfig::async_settle`: handlers queue their batches for the evictor.
    pub async_settle: bool,
    /// Batches handlers staged for the evictor to settle (`Shared::evict_async`).
    pub queued: Mutex<std::collections::VecDeque<crate::evict::Batch>>,
    /// The evictor is settling queued batches (handlers do not move pages meanwhile).
    pub settling: AtomicBool,
    /// Tests: the evictor does nothing (as when its CPU is busy elsewhere).
    #[cfg(test)]
    pub evictor_paused: AtomicBool,
    pub evictor_wake: Condvar,
    pub evictor_mutex: Mutex<bool>,
    pub stop: AtomicBool,
    pub stop_fd: i32,
    pub counters: Counters,
    pub latency: Mutex<Histogram<u64>>,
    /// Makes the empty store a forked child's snapshot goes into.
    pub store_factory: StoreFactory,
    pub creator_pid: u32,
    pub zero_page: Box<[u8]>,
    pub last_fault_at: Mutex<Instant>,
    /// Set between the pthread_atfork prepare and parent hooks.
    pub forking: AtomicBool,
    /// The thread that forks (set before `forking`): its own faults are mapped while the
    /// handlers are parked (see `map_for_forking_thread`).
    pub forking_tid: std::sync::atomic::AtomicI32,
    /// The store refused a page since the last one it took (warned once per episode).
    pub store_full: AtomicBool,
    /// Whether the first page held back (UFFDIO_MOVE: EINVAL) was logged.
    pub held_warned: AtomicBool,
    /// Range events (REMOVE/UNMAP/REMAP) read during a fork and not applied yet (`fork_mode`
    /// defers them; `apply_deferred_range_events` applies them right after the child's
    /// snapshot). While any wait, no fault is served but the forking thread's (`serve_fault`):
    /// the program may already have written the dropped range again, and a page served and
    /// evicted before the event is applied would lose that content to it.
    pub range_events_deferred: AtomicUsize,
    /// Tests only (`Region::delay_events_for_tests`): microseconds a handler waits between
    /// reading a batch of messages and applying its events (and between a fork's snapshot and
    /// the events read during the fork), to widen the window that a handler preempted on a
    /// busy machine leaves.
    pub event_delay_us: AtomicU64,
    /// Tests only (`Region::hold_forks_for_tests`): microseconds the fork's prepare hook waits
    /// after parking the region's threads, as a forking thread preempted there does.
    pub fork_hold_us: AtomicU64,
    /// Tests only (`Region::hold_forks_after_for_tests`): microseconds the fork's parent hook
    /// waits before letting the region's threads go (the FORK event read, the link not taken).
    pub fork_parent_hold_us: AtomicU64,
    /// Tests only (`Region::delay_fault_around_for_tests`): microseconds a fault waits between
    /// reading a run of pages and mapping it.
    pub run_delay_us: AtomicU64,
    /// Tests only (`Region::delay_populate_for_tests`): microseconds `populate` waits with the
    /// space lock held, as a program thread preempted there does.
    pub populate_delay_us: AtomicU64,
    /// Tests only (`Region::delay_after_mapping_for_tests`): microseconds a fault waits between
    /// mapping its pages (which wakes the faulting thread) and recording them resident.
    pub mapped_delay_us: AtomicU64,
    /// Tests only (`Region::refuse_own_page_of_runs_for_tests`): runs whose own page the
    /// kernel is made to refuse.
    pub own_page_refusals: AtomicU64,
    /// Tests only (`Region::delay_moves_for_tests`): microseconds an eviction batch waits
    /// between picking its victims and moving them out.
    pub move_delay_us: AtomicU64,
    /// Tests only (`Region::report_moves_short_for_tests`): an eviction run moved whole is
    /// handled as if the kernel had said it was cut this many pages short.
    pub unreported_moves: AtomicUsize,
    /// Whether the first page kept back as incompressible was logged.
    pub incompressible_said: AtomicBool,
    /// When it last refused one (`evict::now_ms`): eviction pauses for
    /// `evict::FULL_BACKOFF_MS` after.
    pub store_full_ms: AtomicU64,
    /// When a full store was last reported (`evict::now_ms`; 0: never).
    pub store_full_said_ms: AtomicU64,
    /// Consecutive faults the kernel refused memory for (ENOMEM); see `fault::OOM_STREAK`.
    pub enomem_streak: AtomicU64,
    /// Threads of this region parked for a fork; `workers` is how many there are. The last to
    /// park wakes the forking thread through `park_wake` (see `Shared::park_for_fork`).
    pub parked: AtomicUsize,
    pub park_lock: Mutex<()>,
    pub park_wake: zmem_os::sync::Condvar,
    pub workers: usize,
    /// Which of them sleep in their idle wait (handlers by number, then the evictor): a fork
    /// parks those without waking them.
    pub(crate) naps: crate::fork::Naps,
    pub gate_fd: i32,
    /// Readable once the fork gate reopens (written by `fork_gate_open`, drained when the gate
    /// next closes): a handler in `fork_mode` polls it to leave at once.
    pub reopen_fd: i32,
    /// How long a handler polls without sleeping while faults come fast (see
    /// `RegionConfig::handler_spin_us`); zero where the process has one CPU.
    pub spin: Duration,
    /// The faulting thread and this region's threads on one CPU (see `colocate`).
    pub colocation: crate::colocate::Colocation,
}

/// A handler's poll array: the stop eventfd, the fork gate's eventfd, then one userfaultfd per
/// space (the creator's first, then its children's), in `spaces` order.
pub(crate) const POLL_GATE: usize = 1;
/// Pages the forking thread may map for itself during a fork (`Shared::forker_mapped`).
pub(crate) const FORKER_MAPPED: usize = 64;
pub(crate) const POLL_SPACES: usize = 2;

/// Outcome of an attempt to resolve a fault.
pub(crate) enum Served {
    Done,
    /// The kernel said EAGAIN: an event (fork, remove, unmap, remap) must be read first.
    Retry,
}

impl Shared {
    /// A fork's page tables are copied and its snapshot not taken yet: a page mapped in the
    /// root space now is missing from the child while the snapshot would say the child has
    /// it (a copy-on-write mapping from the fork), and the child then read zeros where its data
    /// was (`tests/c/fork_race.c`: 36 children of 40 saw wrong pages, on the signal route,
    /// with two threads faulting and one freeing beside the forking one).
    pub(crate) fn fork_snapshot_pending(&self) -> bool {
        self.fork_reading.load(SeqCst) > 0 || self.forks_unserved.load(SeqCst) > 0
    }

    /// On a program thread about to change the root space's pages (free, realloc, mremap, a
    /// fault it served itself): waits while a fork's snapshot is pending (see
    /// `fork_snapshot_pending`; under a millisecond). The forking thread never waits for its
    /// own fork.
    pub(crate) fn wait_for_fork_snapshot(&self) {
        while self.fork_snapshot_pending() && !self.stop.load(Relaxed) && !self.is_forking_thread()
        {
            std::thread::yield_now();
        }
    }

    pub fn budget(&self) -> usize {
        self.budget_pages.load(Relaxed)
    }

    pub fn kick_evictor(&self) {
        let mut g = self.evictor_mutex.lock();
        *g = true;
        self.evictor_wake.notify_one();
    }

    // ---------------------------------------------------------------- handler threads

    /// `w`: this handler's number (its entry in `naps`).
    pub fn handler_loop(self: &Arc<Self>, w: usize) {
        self.colocation.register_ours();
        // This thread may serve a fault for a thread that is exiting (see
        // `signal::serve_by_handler`): its thread-locals must exist before then, which
        // `zmem_os::thread::spawn` saw to (`prepare_this_thread`).
        let mut buf = vec![0u8; PAGE * self.fault_around.max(1)];
        let mut msgs = [Msg::default(); 16];
        // Reserved up front: while a fork is in progress this thread must not allocate (glibc
        // holds the allocator's locks across fork; see `fork_mode`).
        let mut deferred: Vec<(Arc<Space>, Msg)> = Vec::with_capacity(FORK_STASH);
        let mut spare: Vec<(Arc<Space>, Msg)> = Vec::with_capacity(FORK_STASH);
        let mut forks: Vec<(Arc<Space>, i32)> = Vec::with_capacity(64);
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut spaces: Vec<Arc<Space>> = Vec::new();
        // Forked processes' links (signal route, `forked`), polled after the spaces.
        let mut links: Vec<Arc<crate::forked::FaultLink>> = Vec::new();
        let mut asked: Vec<(i32, u64)> = Vec::new();
        let mut last_arrival = Instant::now();
        let mut fast_faults = false;
        while !self.stop.load(Relaxed) {
            spaces.clear();
            if burials_due() {
                self.kick_evictor();
            }
            spaces.push(self.root.clone());
            spaces.extend(
                self.children
                    .lock()
                    .iter()
                    .filter(|c| !c.dead.load(Relaxed))
                    .cloned(),
            );
            fds.clear();
            for fd in [self.stop_fd, self.gate_fd] {
                fds.push(libc::pollfd {
                    fd,
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            // A child whose eviction batch is in flight is not read until it is done (see
            // `Space::moving`): left out of the poll, looked at again within a millisecond.
            let mut moving = false;
            for s in &spaces {
                let wait = s.moving.load(Relaxed);
                moving |= wait;
                fds.push(libc::pollfd {
                    fd: s.uffd.raw(),
                    events: if wait { 0 } else { libc::POLLIN },
                    revents: 0,
                });
            }
            let first_link = fds.len();
            links.clear();
            // The raw forks' link always: a raw child's space may have been given another
            // link (see `serve_asked`).
            let raw = self.raw_link.get();
            for l in spaces
                .iter()
                .filter_map(|s| s.asks.as_ref().map(|(l, _)| l))
                .chain(raw)
            {
                if !l.closed() && !links.iter().any(|x| Arc::ptr_eq(x, l)) {
                    links.push(l.clone());
                    fds.push(libc::pollfd {
                        fd: l.raw(),
                        events: libc::POLLIN,
                        revents: 0,
                    });
                }
            }
            let assisting = crate::signal::ASSIST_PENDING.load(Relaxed) != 0;
            let timeout = if deferred.is_empty() && !assisting && !moving {
                200
            } else {
                1
            };
            let mut rc = 0;
            if fast_faults && deferred.is_empty() && !self.colocation.pinned() {
                // Faults come faster than the spin: stay awake for the next one (a sleeping
                // handler costs the faulting thread a cross-CPU wake-up), yielding to any
                // thread that wants this CPU.
                let t = Instant::now();
                while t.elapsed() < self.spin {
                    // SAFETY: as below; timeout 0 never blocks.
                    rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, 0) };
                    if rc != 0 {
                        break;
                    }
                    std::thread::yield_now();
                }
            }
            let mut parked_asleep = false;
            if rc == 0 {
                // A fork meanwhile parks this thread without waking it (`Naps`).
                self.naps.begin(w);
                // SAFETY: fds is a valid array of pollfd of the given length.
                rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, timeout) };
                parked_asleep = self.naps.end(w);
            }
            if rc > 0 && fds[POLL_SPACES..].iter().any(|f| f.revents != 0) {
                let now = Instant::now();
                fast_faults = now.duration_since(last_arrival) < self.spin;
                last_arrival = now;
            }
            let failed = (rc < 0).then(zmem_os::Errno::last);
            if let Some(e) = failed.filter(|e| e.code() != libc::EINTR) {
                tracing::error!("poll on userfaultfd: {e}");
                std::thread::sleep(Duration::from_millis(10));
            }
            if self.stop.load(Relaxed) {
                break;
            }
            // Parked while asleep: nothing else until the gate reopens (an assist waits).
            if !parked_asleep && fds[0].revents & libc::POLLIN != 0 {
                // Not a stop: a fault that a program thread could not serve itself (signal
                // route, see `signal::serve_by_handler`) woke us. Drain the count; should the
                // stop have come meanwhile, leave it for the other handlers.
                zmem_os::fds::eventfd_drain(self.stop_fd);
                if self.stop.load(Relaxed) {
                    zmem_os::fds::eventfd_signal(self.stop_fd);
                    break;
                }
            }
            if !parked_asleep {
                crate::signal::serve_assists(self, &mut buf);
            }
            if fds[POLL_SPACES].revents & libc::POLLNVAL != 0 {
                lost_descriptor(self.root.uffd.raw());
            }
            if parked_asleep || self.forking.load(Acquire) {
                if !parked_asleep {
                    self.park_for_fork(); // counted here, taken back as `fork_mode` ends
                }
                // Asks wait for the fork (like faults); their links must not wake the poll.
                for f in &mut fds[first_link..] {
                    f.fd = -1;
                }
                self.fork_mode(
                    &spaces,
                    &mut fds,
                    &mut msgs,
                    &mut deferred,
                    &mut forks,
                    &mut buf,
                );
                for (parent, fd) in forks.drain(..) {
                    // SAFETY: the kernel installed this descriptor for us in the FORK message.
                    let child = unsafe { Uffd::from_raw(fd) };
                    self.on_fork(&parent, child);
                    self.forks_unserved
                        .fetch_sub(1, std::sync::atomic::Ordering::Release);
                }
                if !self.fork_snapshot_pending() {
                    self.account_forker_mapped();
                }
                // The parent hook waits for its fork to be served (`wait_fork_served`).
                drop(self.park_lock.lock());
                self.park_wake.notify_all();
                // After the snapshots (the child's copy was taken before the program's
                // madvise could zap it) and before any fault is served.
                self.apply_deferred_range_events(&mut deferred);
                continue;
            }
            for (i, s) in spaces.iter().enumerate() {
                if fds[POLL_SPACES + i].revents == 0 {
                    continue;
                }
                loop {
                    // Range events are applied inside, before the lock is let go.
                    let n = match self.read_and_apply(s, &mut msgs) {
                        Ok(n) => n,
                        Err(e) if e.code() == libc::EBADF && i == 0 => {
                            lost_descriptor(s.uffd.raw())
                        }
                        Err(e) => {
                            tracing::error!("read from userfaultfd: {e}");
                            0
                        }
                    };
                    for m in msgs[..n]
                        .iter()
                        .filter(|m| !crate::events::is_range_event(m))
                    {
                        if let Served::Retry = self.dispatch(s, m, &mut buf) {
                            deferred.push((s.clone(), *m));
                        }
                    }
                    if n < msgs.len() {
                        break;
                    }
                }
            }
            for (k, l) in links.iter().enumerate() {
                if fds[first_link + k].revents == 0 {
                    continue;
                }
                asked.clear();
                l.read(&mut asked);
                for &(pid, addr) in &asked {
                    self.serve_asked(&spaces, l, pid, addr, &mut deferred, &mut buf);
                }
            }
            if !deferred.is_empty() {
                // Swap with a spare so that both keep their reserved capacity (see fork_mode).
                std::mem::swap(&mut deferred, &mut spare);
                for (s, m) in spare.drain(..) {
                    if let Served::Retry = self.dispatch(&s, &m, &mut buf) {
                        deferred.push((s, m));
                    }
                }
            }
            if deferred.is_empty() {
                let t0 = Instant::now();
                self.evict_while_idle(&mut fds);
                self.counters.add_ns(&self.counters.idle_evict_ns, t0);
            }
        }
    }

    /// A fault a forked process asked about over link `l` (`forked`): served in its own space
    /// when it is the child the link was made for, or a process whose space was found before
    /// (answered once done); else in the other spaces of the family one by one, until the
    /// asker's pagemap shows the page (that space is its own from then on), and answered (a
    /// page not served yet is asked for again).
    fn serve_asked(
        self: &Arc<Self>,
        spaces: &[Arc<Space>],
        l: &Arc<crate::forked::FaultLink>,
        pid: i32,
        addr: u64,
        deferred: &mut Vec<(Arc<Space>, Msg)>,
        buf: &mut Vec<u8>,
    ) {
        // Served in space `s`; with `answer`, answered once done if the space's link is `l`
        // (`dispatch` answers on the space's own link), else at once here.
        let mut serve_in = |s: &Arc<Space>, answer: bool, buf: &mut Vec<u8>| {
            let own_link = matches!(&s.asks, Some((x, _)) if Arc::ptr_eq(x, l));
            let m = Msg::asked(addr, answer && own_link);
            if let Served::Retry = self.dispatch(s, &m, buf) {
                deferred.push((s.clone(), m));
            }
            if answer && !own_link {
                l.answer(addr);
            }
        };
        let family = |own: bool| {
            spaces
                .iter()
                .filter(move |s| matches!(&s.asks, Some((x, o)) if Arc::ptr_eq(x, l) && *o == own))
        };
        // Found by its pagemap before (below): served in that space alone.
        if let Some(space) = l.bound_space(pid, addr) {
            if let Some(s) = spaces.iter().find(|s| Arc::as_ptr(s) as usize == space) {
                serve_in(s, true, buf);
                return;
            }
            l.unbind(pid);
        }
        // The link's own child, served in its space; asking again for the same page means
        // that space was not its own (below).
        if l.is_owner(pid) && !l.owner_asks_again(addr) {
            if let Some(s) = family(true).next() {
                serve_in(s, true, buf);
                return;
            }
        }
        // Any other process of the family, or a child whose space is not the one its link
        // was given to: a raw fork's FORK event read while a glibc fork was in progress (the
        // two are told apart by nothing) took that fork's link, and each child asked where its
        // space was not (found hung in a test run beside a test that forked with glibc). The
        // family's spaces are tried first, then every other child's; serving a page in a
        // space that is not the asker's maps that process's own content there, merely early.
        if zmem_os::remote::page_present(pid, addr as usize) != Some(true) {
            let others = spaces
                .iter()
                .filter(|s| !s.is_root && !matches!(&s.asks, Some((x, _)) if Arc::ptr_eq(x, l)));
            for s in family(false).chain(family(true)).chain(others) {
                serve_in(s, false, buf);
                if zmem_os::remote::page_present(pid, addr as usize) == Some(true) {
                    l.bind(pid, Arc::as_ptr(s) as usize, addr);
                    tracing::debug!(pid, "forked: a process's space found by its pagemap");
                    break;
                }
            }
        }
        l.answer(addr);
    }

    /// A fault served since `t0`: its time goes to the latency histogram and the counters
    /// (either route: a handler thread's, or the faulting thread's on the signal route).
    pub(crate) fn count_served(&self, t0: Instant) {
        let ns = t0.elapsed().as_nanos() as u64;
        let _ = self.latency.lock().record(ns.max(1));
        self.counters.handled_faults.fetch_add(1, Relaxed);
        self.counters.handled_ns.fetch_add(ns, Relaxed);
    }

    pub(crate) fn dispatch(self: &Arc<Self>, s: &Arc<Space>, m: &Msg, buf: &mut Vec<u8>) -> Served {
        match m.event {
            uffd::EVENT_PAGEFAULT => {
                // The faulting thread's id (UFFD_FEATURE_THREAD_ID), a root-space tid.
                let tid = m.arg2 as u32 as libc::pid_t;
                if s.is_root {
                    self.colocation.on_fault(tid);
                }
                let t0 = Instant::now();
                *self.last_fault_at.lock() = t0;
                let r = self.serve_fault(s, m.arg1 as usize & !(PAGE - 1), m.arg0, buf);
                if let Served::Done = r {
                    self.count_served(t0);
                }
                r
            }
            crate::forked::LINK_FAULT => {
                let t0 = Instant::now();
                let r = self.serve_fault(s, m.arg1 as usize & !(PAGE - 1), m.arg0, buf);
                if let Served::Done = r {
                    self.count_served(t0);
                    if m.arg2 != 0 {
                        if let Some((l, _)) = &s.asks {
                            l.answer(m.arg1);
                        }
                    }
                }
                r
            }
            uffd::EVENT_FORK => {
                // SAFETY: the kernel installed this descriptor for us in the FORK message.
                let child = unsafe { Uffd::from_raw(m.arg0 as u32 as i32) };
                self.on_fork(s, child);
                Served::Done
            }
            // Applied where they are read (`Shared::read_and_apply`), except those read during
            // a fork, which `fork_mode` defers with the faults.
            uffd::EVENT_REMOVE | uffd::EVENT_UNMAP | uffd::EVENT_REMAP => {
                self.apply_range_event(s, &mut s.inner.lock(), m);
                Served::Done
            }
            other => {
                tracing::warn!("unexpected userfaultfd event {other:#x}");
                Served::Done
            }
        }
    }
}

/// The region's userfaultfd was closed behind zmem's back (a raw close or close_range system
/// call, which the preload library's wrappers cannot see): its memory is unregistered, so every
/// evicted page would now read as zeros. Stop the process with a message rather than let it run
/// on wrong data.
pub(crate) fn lost_descriptor(fd: i32) -> ! {
    let msg = format!(
        "zmem: descriptor {fd}, the userfaultfd of zmem's heap, was closed by a raw system call; \
         the compressed pages cannot be brought back: aborting rather than running on zeros\n"
    );
    // SAFETY: writing our own buffer to stderr, then ending the process.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::abort()
    }
}

/// Tests only: waits the microseconds in `delay` (one of `Shared`'s `*_delay_us` hooks, or
/// `fork_hold_us`), standing for a thread preempted at that point; nothing when it is 0.
pub(crate) fn test_pause(delay: &AtomicU64) {
    let us = delay.load(Relaxed);
    if us > 0 {
        std::thread::sleep(Duration::from_micros(us));
    }
}

#[cfg(test)]
mod tests {
    use super::Runs;

    #[test]
    fn runs_mark_only_their_own_pages_and_refuse_when_full() {
        let mut runs = Runs::default();
        assert!(runs.start(10, 16));
        assert!(runs.start(40, 4));
        runs.dropped(12);
        runs.dropped(30); // in neither run
        runs.dropped(43);
        assert_eq!(runs.finish(10), 1 << 2);
        assert_eq!(runs.finish(10), 0, "finished runs are forgotten");
        assert_eq!(runs.finish(40), 1 << 3);
        for k in 0..8 {
            assert!(runs.start(100 * k, 2), "entry {k}");
        }
        assert!(!runs.start(1000, 2), "a ninth run is refused");
        runs.dropped(301);
        assert_eq!(runs.finish(300), 1 << 1);
        assert!(runs.start(1000, 2), "a finished entry is free again");
    }
}
