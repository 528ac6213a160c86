//! The machinery behind a [`crate::Region`]: handler threads that read the userfaultfd and
//! resolve faults themselves, an evictor that keeps the resident set under the budget, and the
//! address spaces of forked children, which are served from a snapshot of the store.
//!
//! Locks, always taken in this order: `evict_lock` (one eviction batch at a time), then a
//! space's `inner` (page states, policy). Neither is held across a blocking wait on the program.
//! No thread of ours ever touches managed memory except through UFFDIO ioctls, and the one
//! locked no-op write that unshares a page after fork (a present page: no userfault).

use std::collections::HashMap;
use std::io;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize,
    Ordering::{AcqRel, Acquire, Relaxed, Release},
};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::{Condvar, Mutex};
use zmem_store::{PageStore, StoreConfig, StoreError, MAX_BLOCK_PAGES};

use crate::policy::Tracker;
use crate::uffd::{self, Msg, Uffd};
use crate::{RegionError, PAGE};

/// Page states (one byte per page).
pub(crate) const ABSENT: u8 = 0; // no content: reads as zeros
pub(crate) const RESIDENT: u8 = 1; // mapped
pub(crate) const STORED: u8 = 2; // in the page store
pub(crate) const STAGED: u8 = 3; // moved out into a staging slot, not yet queued to the store
pub(crate) const FAULTING: u8 = 4; // a handler is bringing it in
pub(crate) const POISONED: u8 = 5; // content unknown after an unsupported mremap: SIGBUS
pub(crate) const UNMAPPED: u8 = 6; // the program unmapped it: no longer part of the region

/// After the store refuses a page (its memory limit), eviction pauses this long: moving pages
/// out only to put them back costs CPU and, under a memory cgroup, memory it may not have.
pub(crate) const FULL_BACKOFF_MS: u64 = 50;
/// Faults in a row for which the kernel refused memory (UFFDIO_COPY/ZEROPAGE: ENOMEM, e.g. a
/// memory cgroup at its limit) before the process is out of memory; each waits 2 ms after trying
/// to evict. Then zmem kills the process, as the kernel's OOM killer would a swapless one.
pub(crate) const OOM_STREAK: u64 = 500;

/// Monotonic milliseconds.
pub(crate) fn now_ms() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: t is a valid timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    t.tv_sec as u64 * 1000 + t.tv_nsec as u64 / 1_000_000
}

/// Pages moved out per eviction batch (also the staging area's size).
pub(crate) const STAGING_SLOTS: usize = 64;

/// An address space with region pages in it: the creator's, or a forked child's.
pub(crate) struct Space {
    pub uffd: Uffd,
    pub base: usize,
    pub pages: usize,
    /// Dropped by `Drop for Space` (a child's on a thread of its own).
    pub store: std::mem::ManuallyDrop<PageStore>,
    pub inner: Mutex<SpaceInner>,
    /// The creator's space evicts; a child's is served from its snapshot only.
    pub is_root: bool,
    pub dead: AtomicBool,
}

pub(crate) struct SpaceInner {
    pub state: Vec<u8>,
    pub tracker: Option<Tracker>,
    pub resident: usize,
    /// Page -> staging slot, for STAGED pages.
    pub staged: HashMap<u32, usize>,
    pub last_fault: usize,
    /// Address ranges the program unmapped (never unmapped again on destroy).
    pub unmapped: Vec<(usize, usize)>,
    pub remap_warned: bool,
    /// Pages faulted in most recently, not yet handed to the policy.
    pub nursery: std::collections::VecDeque<u32>,
    /// Page ranges `[start, end)` that are never evicted once resident (see `Region::pin`).
    pub pinned: Vec<(u32, u32)>,
}

/// Pages just faulted in are held back from the policy this long (in faults): the faulting
/// thread touches its page only after the handler returns, and the handler evicts in between,
/// so a page must not be evictable before that access happens.
pub(crate) const NURSERY: usize = 256;

impl SpaceInner {
    pub fn new(state: Vec<u8>, tracker: Option<Tracker>) -> SpaceInner {
        SpaceInner {
            state,
            tracker,
            resident: 0,
            staged: HashMap::new(),
            last_fault: usize::MAX - 1,
            unmapped: Vec::new(),
            remap_warned: false,
            nursery: Default::default(),
            pinned: Vec::new(),
        }
    }

    pub fn is_pinned(&self, page: u32) -> bool {
        self.pinned.iter().any(|&(a, b)| (a..b).contains(&page))
    }

    /// A page became resident through a fault: it joins the policy after [`NURSERY`] more.
    pub fn admit(&mut self, page: u32) {
        if self.is_pinned(page) {
            return;
        }
        let Some(t) = self.tracker.as_mut() else {
            return;
        };
        self.nursery.push_back(page);
        // At most a quarter of the resident pages wait, so small budgets can still evict.
        let cap = (self.resident / 4).clamp(1, NURSERY);
        while self.nursery.len() > cap {
            let p = self.nursery.pop_front().expect("non-empty");
            if self.state[p as usize] == RESIDENT {
                t.insert(p);
            }
        }
    }

    /// The program dropped page `i` (or its content became unknown): release what it held and
    /// give it state `to`. A STAGED page's evictor sees the change and drops what it stored.
    pub fn forget(&mut self, store: &PageStore, i: usize, to: u8) {
        match self.state[i] {
            RESIDENT => {
                self.resident -= 1;
                if let Some(t) = self.tracker.as_mut() {
                    t.remove(i as u32);
                }
            }
            STORED => {
                let _ = store.discard(i as u64);
            }
            STAGED => {
                self.staged.remove(&(i as u32));
            }
            _ => {}
        }
        if self.state[i] != to {
            self.state[i] = to;
        }
    }

    /// Hands every waiting page to the policy (when nothing else is left to evict).
    pub fn drain_nursery(&mut self) {
        let Some(t) = self.tracker.as_mut() else {
            return;
        };
        for p in self.nursery.drain(..) {
            if self.state[p as usize] == RESIDENT {
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
        // A child's store stops its worker threads when dropped, and with the preload library a
        // worker may touch region memory as it exits (glibc's TLS destructor list lives in the
        // program heap), which only a handler can serve; the last reference to a dead child's
        // space is often a handler's. So it is dropped on a thread of its own; if no thread can
        // be started, it is leaked rather than risk a deadlock.
        // Passed as an address, so that a closure dropped unrun (spawn failed) leaks it.
        let raw = Box::into_raw(Box::new(store)) as usize;
        let reap = move || {
            // SAFETY: the Box leaked above, taken back once, by this closure only.
            drop(unsafe { Box::from_raw(raw as *mut PageStore) })
        };
        if let Err(e) = zmem_engine::thread::spawn("zmem-reap".into(), reap) {
            tracing::warn!("a dead child's snapshot is leaked (no thread to free it): {e}");
        }
    }
}

impl Space {
    fn page_addr(&self, idx: usize) -> usize {
        self.base + idx * PAGE
    }
    fn index_of(&self, addr: usize) -> Option<usize> {
        if addr >= self.base && addr < self.base + self.pages * PAGE {
            Some((addr - self.base) / PAGE)
        } else {
            None
        }
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
    pub unshared: AtomicU64,
    pub forks: AtomicU64,
    pub staged_now: AtomicUsize,
    /// Evicted pages the store refused (its memory limit), put back resident.
    pub store_refused: AtomicU64,
}

pub(crate) struct Shared {
    pub root: Arc<Space>,
    pub children: Mutex<Vec<Arc<Space>>>,
    pub staging: usize,
    pub budget_pages: AtomicUsize,
    pub fault_around: usize,
    /// Evicted pages compressed together as one block (1 = page by page).
    pub evict_group: usize,
    pub evict_lock: Mutex<()>,
    pub evictor_wake: Condvar,
    pub evictor_mutex: Mutex<bool>,
    pub stop: AtomicBool,
    pub stop_fd: i32,
    pub counters: Counters,
    pub latency: Mutex<Histogram<u64>>,
    pub store_cfg: StoreConfig,
    pub creator_pid: u32,
    pub zero_page: Box<[u8]>,
    pub last_fault_at: Mutex<Instant>,
    /// Set between the pthread_atfork prepare and parent hooks.
    pub forking: AtomicBool,
    /// The store refused a page since the last one it took (warned once per episode).
    pub store_full: AtomicBool,
    /// When it last refused one ([`now_ms`]): eviction pauses for [`FULL_BACKOFF_MS`] after.
    pub store_full_ms: AtomicU64,
    /// Consecutive faults the kernel refused memory for (ENOMEM); see [`OOM_STREAK`].
    pub enomem_streak: AtomicU64,
    /// Threads of this region parked for a fork; `workers` is how many there are.
    pub parked: AtomicUsize,
    pub workers: usize,
    pub gate_fd: i32,
}

/// Faults and events a handler can hold while a fork is in progress.
const FORK_STASH: usize = 4096;

/// Every live region, for the fork hooks.
static REGISTRY: Mutex<Vec<std::sync::Weak<Shared>>> = Mutex::new(Vec::new());
static ATFORK: std::sync::Once = std::sync::Once::new();

extern "C" fn atfork_prepare() {
    for s in REGISTRY.lock().iter() {
        if let Some(s) = s.upgrade() {
            s.fork_gate_close();
        }
    }
}

extern "C" fn atfork_parent() {
    for s in REGISTRY.lock().iter() {
        if let Some(s) = s.upgrade() {
            s.fork_gate_open();
        }
    }
}

/// Makes fork() park this region's threads first (see [`Shared::fork_mode`]).
pub(crate) fn register_for_fork(shared: &Arc<Shared>) {
    ATFORK.call_once(|| {
        // SAFETY: registering plain extern "C" functions with no captured state.
        unsafe { libc::pthread_atfork(Some(atfork_prepare), Some(atfork_parent), None) };
    });
    let mut r = REGISTRY.lock();
    r.retain(|w| w.strong_count() > 0);
    r.push(Arc::downgrade(shared));
}

/// Outcome of an attempt to resolve a fault.
enum Served {
    Done,
    /// The kernel said EAGAIN: an event (fork, remove, unmap, remap) must be read first.
    Retry,
}

fn errno(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

impl Shared {
    pub fn budget(&self) -> usize {
        self.budget_pages.load(Relaxed)
    }

    /// Headroom the evictor keeps below the budget so faults rarely evict themselves.
    fn low_water(&self) -> usize {
        let b = self.budget();
        b.saturating_sub((b / 32).clamp(STAGING_SLOTS, 4096))
    }

    pub fn kick_evictor(&self) {
        let mut g = self.evictor_mutex.lock();
        *g = true;
        self.evictor_wake.notify_one();
    }

    // ---------------------------------------------------------------- handler threads

    pub fn handler_loop(self: &Arc<Self>) {
        let mut buf = vec![0u8; PAGE * self.fault_around.max(1)];
        let mut msgs = [Msg::default(); 16];
        // Reserved up front: while a fork is in progress this thread must not allocate (glibc
        // holds the allocator's locks across fork; see `fork_mode`).
        let mut deferred: Vec<(Arc<Space>, Msg)> = Vec::with_capacity(FORK_STASH);
        let mut spare: Vec<(Arc<Space>, Msg)> = Vec::with_capacity(FORK_STASH);
        let mut forks: Vec<(Arc<Space>, i32)> = Vec::with_capacity(64);
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut spaces: Vec<Arc<Space>> = Vec::new();
        while !self.stop.load(Relaxed) {
            spaces.clear();
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
            for s in &spaces {
                fds.push(libc::pollfd {
                    fd: s.uffd.raw(),
                    events: libc::POLLIN,
                    revents: 0,
                });
            }
            let timeout = if deferred.is_empty() { 200 } else { 1 };
            // SAFETY: fds is a valid array of pollfd of the given length.
            let rc = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, timeout) };
            if rc < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
                tracing::error!("poll on userfaultfd: {}", io::Error::last_os_error());
                std::thread::sleep(Duration::from_millis(10));
            }
            if self.stop.load(Relaxed) {
                break;
            }
            if self.forking.load(Acquire) {
                self.fork_mode(&spaces, &mut fds, &mut msgs, &mut deferred, &mut forks);
                for (parent, fd) in forks.drain(..) {
                    // SAFETY: the kernel installed this descriptor for us in the FORK message.
                    let child = unsafe { Uffd::from_raw(fd) };
                    self.on_fork(&parent, child);
                }
                continue;
            }
            for (i, s) in spaces.iter().enumerate() {
                if fds[i + 2].revents == 0 {
                    continue;
                }
                loop {
                    let n = match s.uffd.read_msgs(&mut msgs) {
                        Ok(n) => n,
                        Err(e) => {
                            tracing::error!("read from userfaultfd: {e}");
                            0
                        }
                    };
                    for m in &msgs[..n] {
                        if let Served::Retry = self.dispatch(s, m, &mut buf) {
                            deferred.push((s.clone(), *m));
                        }
                    }
                    if n < msgs.len() {
                        break;
                    }
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
                self.evict_while_idle(&mut fds);
            }
        }
    }

    fn dispatch(self: &Arc<Self>, s: &Arc<Space>, m: &Msg, buf: &mut Vec<u8>) -> Served {
        match m.event {
            uffd::EVENT_PAGEFAULT => {
                let t0 = Instant::now();
                *self.last_fault_at.lock() = t0;
                let r = self.serve_fault(s, m.arg1 as usize & !(PAGE - 1), m.arg0, buf);
                if let Served::Done = r {
                    let ns = t0.elapsed().as_nanos() as u64;
                    let _ = self.latency.lock().record(ns.max(1));
                }
                r
            }
            uffd::EVENT_FORK => {
                // SAFETY: the kernel installed this descriptor for us in the FORK message.
                let child = unsafe { Uffd::from_raw(m.arg0 as u32 as i32) };
                self.on_fork(s, child);
                Served::Done
            }
            uffd::EVENT_REMOVE | uffd::EVENT_UNMAP => {
                self.on_remove(
                    s,
                    m.arg0 as usize,
                    m.arg1 as usize,
                    m.event == uffd::EVENT_UNMAP,
                );
                Served::Done
            }
            uffd::EVENT_REMAP => {
                self.on_remap(s, m.arg0 as usize, m.arg1 as usize, m.arg2 as usize);
                Served::Done
            }
            other => {
                tracing::warn!("unexpected userfaultfd event {other:#x}");
                Served::Done
            }
        }
    }

    /// While a fork is in progress (between our `pthread_atfork` prepare and parent hooks) a
    /// handler only reads messages, so the kernel's FORK event (which the forking thread waits
    /// for) is read, and allocates nothing: glibc holds the allocator's locks across fork, and a
    /// handler blocked in malloc before reading the event would deadlock the fork. FORK events
    /// are stashed and snapshotted after the fork returns; faults and other events wait, in
    /// order, in `deferred` (reserved up front). No fault is resolved until the snapshot is
    /// taken, so the child's view is the parent's memory at the fork.
    fn fork_mode(
        &self,
        spaces: &[Arc<Space>],
        fds: &mut [libc::pollfd],
        msgs: &mut [Msg],
        deferred: &mut Vec<(Arc<Space>, Msg)>,
        forks: &mut Vec<(Arc<Space>, i32)>,
    ) {
        self.parked.fetch_add(1, AcqRel);
        while self.forking.load(Acquire) && !self.stop.load(Relaxed) {
            for f in fds.iter_mut() {
                f.revents = 0;
            }
            // SAFETY: a valid pollfd array.
            unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as _, 5) };
            for (i, s) in spaces.iter().enumerate() {
                if fds[i + 2].revents == 0 {
                    continue;
                }
                // Pushes stay within the capacity reserved up front (one fault per blocked
                // thread: FORK_STASH is far above any thread count zmem serves).
                loop {
                    let n = s.uffd.read_msgs(msgs).unwrap_or(0);
                    for m in &msgs[..n] {
                        if m.event == uffd::EVENT_FORK {
                            forks.push((s.clone(), m.arg0 as u32 as i32));
                        } else {
                            deferred.push((s.clone(), *m));
                        }
                    }
                    if n < msgs.len() {
                        break;
                    }
                }
            }
        }
        self.parked.fetch_sub(1, AcqRel);
    }

    /// pthread_atfork prepare: park every handler and the evictor (bounded wait).
    pub fn fork_gate_close(&self) {
        self.forking.store(true, Release);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(self.gate_fd, (&one as *const u64).cast(), 8) };
        self.kick_evictor();
        let t0 = Instant::now();
        while self.parked.load(Acquire) < self.workers && t0.elapsed() < Duration::from_secs(2) {
            std::thread::yield_now();
        }
        let mut v = 0u64;
        // SAFETY: draining our eventfd (non-blocking).
        unsafe { libc::read(self.gate_fd, (&mut v as *mut u64).cast(), 8) };
    }

    /// pthread_atfork parent: let them go.
    pub fn fork_gate_open(&self) {
        self.forking.store(false, Release);
    }

    /// Makes room for `n` more resident pages in the root space (direct eviction).
    fn make_room(self: &Arc<Self>, n: usize) {
        let budget = self.budget();
        let resident = self.root.inner.lock().resident;
        if resident + n > budget {
            let done = self.evict(resident + n - budget);
            self.counters
                .direct_evictions
                .fetch_add(done as u64, Relaxed);
        }
    }

    /// Between faults, a handler evicts down to the low-water mark a few pages at a time, so
    /// faults rarely find the budget exhausted and no other thread needs waking. It stops as
    /// soon as a message waits on any descriptor.
    fn evict_while_idle(self: &Arc<Self>, fds: &mut [libc::pollfd]) {
        for _ in 0..16 {
            let resident = self.root.inner.lock().resident;
            let low = self.low_water();
            if resident <= low {
                return;
            }
            if self.evict((resident - low).min(4)) == 0 {
                return;
            }
            self.repack();
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

    fn serve_fault(
        self: &Arc<Self>,
        s: &Arc<Space>,
        addr: usize,
        flags: u64,
        buf: &mut Vec<u8>,
    ) -> Served {
        let Some(idx) = s.index_of(addr) else {
            return self.serve_foreign(s, addr);
        };
        if s.is_root {
            self.make_room(1);
        }
        let mut inner = s.inner.lock();
        let st = inner.state[idx];
        match st {
            FAULTING => return Served::Done, // another handler maps it and wakes every waiter
            POISONED => {
                drop(inner);
                if let Err(e) = s.uffd.poison(addr, PAGE) {
                    if errno(&e) == libc::EAGAIN {
                        return Served::Retry;
                    }
                    tracing::error!("poison {addr:#x}: {e}");
                }
                return Served::Done;
            }
            STAGED => {
                let slot = inner.staged[&(idx as u32)];
                // The slot page is present (moved there) and stays until the state changes,
                // which needs this lock.
                match s.uffd.copy(addr, slot as *const u8, PAGE) {
                    Ok(()) => {}
                    Err(e) if errno(&e) == libc::EEXIST => {
                        let _ = s.uffd.wake(addr, PAGE);
                    }
                    Err(e) if errno(&e) == libc::EAGAIN => return Served::Retry,
                    Err(e) => {
                        tracing::error!("copy staged page {idx}: {e}");
                        return Served::Done;
                    }
                }
                inner.state[idx] = RESIDENT;
                inner.staged.remove(&(idx as u32));
                inner.resident += 1;
                inner.admit(idx as u32);
                self.counters.staged_faults.fetch_add(1, Relaxed);
                return Served::Done;
            }
            _ => {}
        }
        // ABSENT, RESIDENT (dropped behind our back: zero, as anonymous memory reads) or STORED.
        let sequential = idx == inner.last_fault + 1;
        inner.last_fault = idx;
        let mut max_run = if sequential {
            self.fault_around.max(1)
        } else {
            1
        };
        if s.is_root {
            // Fault-around never takes the region over its budget.
            max_run = max_run.min(self.budget().saturating_sub(inner.resident).max(1));
        }
        let mut run = 1;
        while run < max_run
            && idx + run < s.pages
            && matches!(inner.state[idx + run], ABSENT | STORED)
        {
            run += 1;
        }
        // No allocation per fault: a run is at most 64 pages (fault_around is checked).
        let mut kinds_buf = [ABSENT; 64];
        kinds_buf[..run].copy_from_slice(&inner.state[idx..idx + run]);
        let kinds = &mut kinds_buf[..run];
        // A page mapped here that we believed resident is counted again below: take it out.
        if st == RESIDENT {
            inner.resident -= 1;
            if let Some(t) = inner.tracker.as_mut() {
                t.remove(idx as u32);
            }
            kinds[0] = ABSENT;
        }
        for k in 0..run {
            inner.state[idx + k] = FAULTING;
        }
        drop(inner);

        let write = flags & uffd::PAGEFAULT_FLAG_WRITE != 0;
        let use_zero = !write && kinds.iter().all(|&k| k != STORED);
        if !use_zero {
            if buf.len() < run * PAGE {
                buf.resize(run * PAGE, 0);
            }
            let mut at = 0;
            while at < run {
                if kinds[at] != STORED {
                    buf[at * PAGE..(at + 1) * PAGE].fill(0);
                    at += 1;
                    continue;
                }
                // Consecutive stored pages in one read: members of one block are decoded once.
                let end = (at..run).find(|&j| kinds[j] != STORED).unwrap_or(run);
                let read = s
                    .store
                    .read_batch((idx + at) as u64, &mut buf[at * PAGE..end * PAGE]);
                let first = at;
                at = end;
                if let Err(e) = read {
                    let k = match e {
                        StoreError::Corrupt { index, .. }
                            if (idx + first..idx + end).contains(&(index as usize)) =>
                        {
                            index as usize - idx
                        }
                        _ => first,
                    };
                    // Corrupt data must not become silently wrong memory: SIGBUS.
                    tracing::error!("page {} of the region cannot be read back: {e}", idx + k);
                    let r = s.uffd.poison(s.page_addr(idx + k), PAGE);
                    let mut inner = s.inner.lock();
                    for (j, &kind) in kinds.iter().enumerate() {
                        if inner.state[idx + j] == FAULTING {
                            inner.state[idx + j] = kind;
                        }
                    }
                    if r.is_ok() {
                        inner.state[idx + k] = POISONED;
                        let _ = s.store.discard((idx + k) as u64);
                    }
                    drop(inner);
                    if k != 0 {
                        // The faulting thread waits on the first page, not the poisoned one:
                        // let it fault again (on its page alone).
                        let _ = s.uffd.wake(addr, PAGE);
                    }
                    return match r {
                        Err(e) if errno(&e) == libc::EAGAIN => Served::Retry,
                        _ => Served::Done,
                    };
                }
            }
        }
        // Map the run in one call. If that fails part-way, go page by page so that each page's
        // outcome is known exactly (a page marked resident must really be mapped).
        let map = |at: usize, pages: usize| -> std::io::Result<()> {
            let r = if use_zero {
                s.uffd.zeropage(s.page_addr(at), pages * PAGE)
            } else {
                let off = (at - idx) * PAGE;
                s.uffd
                    .copy(s.page_addr(at), buf[off..].as_ptr(), pages * PAGE)
            };
            match r {
                // Already present: our own earlier partial attempt. Wake whoever still waits.
                Err(e) if errno(&e) == libc::EEXIST && pages == 1 => {
                    s.uffd.wake(s.page_addr(at), PAGE)
                }
                r => r,
            }
        };
        let mut mapped: u64 = if run == 64 {
            u64::MAX
        } else {
            (1u64 << run) - 1
        };
        let mut again = false;
        let mut enomem = false;
        if let Err(e) = map(idx, run) {
            mapped = 0;
            let mut first_err = Some(e);
            for k in 0..run {
                let r = if run == 1 {
                    match first_err.take() {
                        Some(e) if errno(&e) == libc::EEXIST => map(idx, 1),
                        Some(e) => Err(e),
                        None => unreachable!(),
                    }
                } else {
                    map(idx + k, 1)
                };
                match r {
                    Ok(()) => mapped |= 1 << k,
                    Err(e) if errno(&e) == libc::EAGAIN => again = true,
                    Err(e) if errno(&e) == libc::ENOMEM => enomem = true,
                    Err(e) => {
                        if errno(&e) != libc::ENOENT && errno(&e) != libc::ESRCH {
                            tracing::error!("resolving fault at {:#x}: {e}", s.page_addr(idx + k));
                        }
                    }
                }
            }
        }
        let mut inner = s.inner.lock();
        if mapped & 1 == 0 {
            for (k, &kind) in kinds.iter().enumerate() {
                if inner.state[idx + k] == FAULTING {
                    inner.state[idx + k] = kind;
                }
            }
            // Pages after the first that did map are handled on their own faults (EEXIST).
            drop(inner);
            if again {
                return Served::Retry;
            }
            if enomem {
                self.out_of_memory(s, addr);
            }
            // Never leave the thread waiting: it retries (and fails properly if the memory is gone).
            let _ = s.uffd.wake(addr, PAGE);
            return Served::Done;
        }
        if self.enomem_streak.load(Relaxed) != 0 {
            self.enomem_streak.store(0, Relaxed);
        }
        for (k, &kind) in kinds.iter().enumerate() {
            let i = idx + k;
            if inner.state[i] != FAULTING {
                continue; // removed meanwhile: the kernel zaps what we mapped
            }
            if mapped & (1 << k) == 0 {
                inner.state[i] = kind;
                continue;
            }
            inner.state[i] = RESIDENT;
            inner.resident += 1;
            inner.admit(i as u32);
            if kind == STORED {
                let _ = s.store.discard(i as u64);
            }
        }
        drop(inner);
        if kinds[0] == STORED {
            self.counters.major_faults.fetch_add(1, Relaxed);
        } else {
            self.counters.zero_faults.fetch_add(1, Relaxed);
        }
        self.counters
            .fault_around_pages
            .fetch_add(run as u64 - 1, Relaxed);
        Served::Done
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
        if addr >= self.staging && addr < self.staging + STAGING_SLOTS * PAGE {
            tracing::error!("fault in the staging area at {addr:#x} (a zmem bug); mapping zeros");
            let _ = s.uffd.zeropage(addr, PAGE);
            return Served::Done;
        }
        match s.uffd.poison(addr, PAGE) {
            Err(e) if errno(&e) == libc::EAGAIN => Served::Retry,
            Err(e) => {
                tracing::error!("fault at {addr:#x} outside the region and poison failed: {e}");
                let _ = s.uffd.wake(addr, PAGE);
                Served::Done
            }
            Ok(()) => Served::Done,
        }
    }

    fn on_remove(&self, s: &Space, start: usize, end: usize, unmap: bool) {
        let lo = start.max(s.base);
        let hi = end.min(s.base + s.pages * PAGE);
        let mut inner = s.inner.lock();
        if unmap && start < end {
            inner.unmapped.push((start, end));
        }
        if lo >= hi {
            return;
        }
        let first = (lo - s.base).div_ceil(PAGE).min(s.pages);
        let last = ((hi - s.base) / PAGE).min(s.pages);
        for i in first..last {
            if inner.state[i] == FAULTING {
                continue; // the program races its own access: the zap follows
            }
            inner.forget(&s.store, i, if unmap { UNMAPPED } else { ABSENT });
        }
    }

    fn on_remap(&self, s: &Space, from: usize, to: usize, len: usize) {
        // mremap of region memory is not supported: pages that were evicted cannot follow the
        // move. Drop what the old range held; anything the kernel cannot find at the new place
        // raises SIGBUS (fault outside the range, or POISONED inside it).
        self.on_remove(s, from, from + len, true);
        let lo = to.max(s.base);
        let hi = (to + len).min(s.base + s.pages * PAGE);
        let mut inner = s.inner.lock();
        if !inner.remap_warned {
            inner.remap_warned = true;
            tracing::warn!(
                "mremap of zmem region memory ({from:#x} -> {to:#x}, {len} bytes) is not supported: \
                 its evicted pages will raise SIGBUS at the new address"
            );
        }
        if lo < hi {
            for i in (lo - s.base) / PAGE..(hi - s.base).div_ceil(PAGE) {
                inner.forget(&s.store, i, POISONED);
            }
        }
    }

    /// A FORK event: the child's pages that were not present at fork time come from a
    /// snapshot of this space's store, so each process's later writes stay its own.
    fn on_fork(&self, parent: &Space, child_uffd: Uffd) {
        let _evicting = self.evict_lock.lock();
        let inner = parent.inner.lock();
        let child = match self.snapshot(parent, &inner, child_uffd) {
            Ok(c) => c,
            Err(e) => {
                // The child cannot be served: its faults would hang. Nothing safe remains but
                // to say so loudly; its descriptor is closed, so its faults read zeros.
                tracing::error!("fork: cannot snapshot the region for the child: {e}");
                return;
            }
        };
        drop(inner);
        self.children.lock().push(Arc::new(child));
        self.counters.forks.fetch_add(1, Relaxed);
        tracing::debug!("fork: child region space ready");
    }

    fn snapshot(
        &self,
        parent: &Space,
        inner: &SpaceInner,
        child_uffd: Uffd,
    ) -> Result<Space, RegionError> {
        let store = PageStore::new(self.store_cfg.clone())?;
        let mut state = vec![ABSENT; parent.pages];
        let mut page = vec![0u8; PAGE];
        for (i, &st) in inner.state.iter().enumerate() {
            match st {
                // FAULTING pages still have their store entry (discarded only after mapping).
                STORED | FAULTING => {
                    parent.store.read(i as u64, &mut page)?;
                    store.write(i as u64, &page)?;
                    state[i] = STORED;
                }
                STAGED => {
                    let slot = inner.staged[&(i as u32)];
                    // SAFETY: a STAGED page's slot holds the moved page until the state
                    // changes, which needs the lock our caller holds.
                    let src = unsafe { std::slice::from_raw_parts(slot as *const u8, PAGE) };
                    store.write(i as u64, src)?;
                    state[i] = STORED;
                }
                // Present at fork time: the child has its own copy-on-write mapping.
                RESIDENT => state[i] = RESIDENT,
                ABSENT => {} // already ABSENT: leave the child's untouched table pages alone
                other => state[i] = other,
            }
        }
        let mut inner = SpaceInner::new(state, None);
        // The child's resident pages are those present at fork (its copy-on-write mapping).
        inner.resident = inner.state.iter().filter(|&&st| st == RESIDENT).count();
        Ok(Space {
            uffd: child_uffd,
            base: parent.base,
            pages: parent.pages,
            store: std::mem::ManuallyDrop::new(store),
            inner: Mutex::new(inner),
            is_root: false,
            dead: AtomicBool::new(false),
        })
    }

    /// Drops the spaces of children that have exited (their mm is gone: ESRCH).
    pub fn reap_children(&self) {
        let mut children = self.children.lock();
        children.retain(|c| {
            // A copy to a low address that is never part of a region: ESRCH when the child's
            // memory is gone; otherwise an error that changes nothing.
            let probe = c.uffd.copy(0x10000, self.zero_page.as_ptr(), PAGE);
            let gone = matches!(&probe, Err(e) if errno(e) == libc::ESRCH);
            if gone {
                c.dead.store(true, Relaxed);
            }
            !gone
        });
    }

    // ---------------------------------------------------------------- eviction

    /// Evicts up to `want` pages (one staging batch at most); returns how many left.
    pub fn evict(&self, want: usize) -> usize {
        if self.store_full.load(Relaxed)
            && now_ms().saturating_sub(self.store_full_ms.load(Relaxed)) < FULL_BACKOFF_MS
        {
            return 0;
        }
        let s = &self.root;
        let _g = self.evict_lock.lock();
        let mut victims = Vec::with_capacity(STAGING_SLOTS);
        {
            let mut inner = s.inner.lock();
            // With blocks of evicted pages, evict at least a block's worth (a few pages below
            // the budget), so that blocks are full even when callers want one page at a time.
            let n = want.min(STAGING_SLOTS).min(inner.resident);
            if n == 0 {
                return 0;
            }
            let group = self.evict_group.min(inner.resident / 4);
            let n = n.max(group).min(STAGING_SLOTS);
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
            for &v in &victims {
                debug_assert_eq!(inner.state[v as usize], RESIDENT);
                inner.state[v as usize] = STAGED;
            }
            for (slot, &v) in victims.iter().enumerate() {
                inner.staged.insert(v, self.staging + slot * PAGE);
            }
            inner.resident -= victims.len();
        }
        self.counters.staged_now.store(victims.len(), Relaxed);
        // Move each victim out. A page still shared with a forked child (EBUSY) is unshared by
        // a locked no-op write, which makes the kernel copy it for us, then moved.
        let mut outcome = [false; STAGING_SLOTS];
        let mut aborted = false;
        for (slot, &v) in victims.iter().enumerate() {
            if aborted {
                break;
            }
            let src = s.page_addr(v as usize);
            let dst = self.staging + slot * PAGE;
            let mut r = s.uffd.move_pages(dst, src, PAGE);
            if matches!(&r, Err(e) if errno(e) == libc::EBUSY) {
                unshare(src);
                self.counters.unshared.fetch_add(1, Relaxed);
                r = s.uffd.move_pages(dst, src, PAGE);
            }
            match r {
                Ok(()) => outcome[slot] = true,
                Err(e) if errno(&e) == libc::ENOENT => {
                    // Nothing mapped: the program dropped it and the event is on its way.
                    let mut inner = s.inner.lock();
                    if inner.state[v as usize] == STAGED {
                        inner.state[v as usize] = ABSENT;
                        inner.staged.remove(&v);
                    }
                }
                Err(e) => {
                    if errno(&e) == libc::EAGAIN {
                        aborted = true; // an event is pending (fork, remove): let it through
                    } else {
                        tracing::warn!("UFFDIO_MOVE of page {v}: {e}; keeping it resident");
                    }
                    let mut inner = s.inner.lock();
                    if inner.state[v as usize] == STAGED {
                        inner.state[v as usize] = RESIDENT;
                        inner.staged.remove(&v);
                        inner.resident += 1;
                        if let Some(t) = inner.tracker.as_mut() {
                            t.insert_quiet(v);
                        }
                    }
                }
            }
        }
        if aborted {
            // Victims after the abort point were never moved: give them back.
            let mut inner = s.inner.lock();
            for (slot, &v) in victims.iter().enumerate() {
                if !outcome[slot] && inner.state[v as usize] == STAGED {
                    inner.state[v as usize] = RESIDENT;
                    inner.staged.remove(&v);
                    inner.resident += 1;
                    if let Some(t) = inner.tracker.as_mut() {
                        t.insert_quiet(v);
                    }
                }
            }
        }
        // Compress the moved pages into the store, then settle their states. Compressed here,
        // on this thread: on two cores a hand-off to the engine's workers costs more in
        // wake-ups and context switches than it saves.
        let mut queued = [false; STAGING_SLOTS];
        let page_at = |slot: usize| -> &[u8] {
            // SAFETY: the slot holds the page we moved there; nothing else writes it until the
            // staging area is recycled at the end of this batch.
            unsafe { std::slice::from_raw_parts((self.staging + slot * PAGE) as *const u8, PAGE) }
        };
        if self.evict_group > 1 {
            // Groups of `evict_group` moved pages, in victim order, each one block whatever the
            // pages' addresses (fixed arrays: no allocation per batch).
            let mut group_slots = [0usize; MAX_BLOCK_PAGES];
            let mut k = 0;
            for slot in (0..victims.len()).filter(|&slot| outcome[slot]) {
                group_slots[k] = slot;
                k += 1;
                if k == self.evict_group {
                    self.store_group(&group_slots[..k], &victims, &page_at, &mut queued);
                    k = 0;
                }
            }
            if k > 0 {
                self.store_group(&group_slots[..k], &victims, &page_at, &mut queued);
            }
        } else {
            for (slot, &v) in victims.iter().enumerate() {
                if outcome[slot] {
                    queued[slot] = self.store_page(v, page_at(slot));
                }
            }
        }
        let mut evicted = 0;
        {
            let mut inner = s.inner.lock();
            for (slot, &v) in victims.iter().enumerate() {
                if !outcome[slot] {
                    continue;
                }
                let i = v as usize;
                if inner.state[i] == STAGED && queued[slot] {
                    inner.state[i] = STORED;
                    inner.staged.remove(&v);
                    evicted += 1;
                } else if inner.state[i] == STAGED {
                    // Could not be stored: put the page back where it was.
                    let r = s.uffd.copy(
                        s.page_addr(i),
                        (self.staging + slot * PAGE) as *const u8,
                        PAGE,
                    );
                    inner.staged.remove(&v);
                    if r.is_ok() {
                        inner.state[i] = RESIDENT;
                        inner.resident += 1;
                        if let Some(t) = inner.tracker.as_mut() {
                            t.insert_quiet(v);
                        }
                    } else {
                        tracing::error!("page {i} could neither be stored nor put back");
                        inner.state[i] = POISONED;
                    }
                } else if queued[slot] {
                    // Faulted back from staging, or dropped by the program, meanwhile.
                    let _ = s.store.discard(v as u64);
                }
            }
        }
        self.counters.staged_now.store(0, Relaxed);
        self.recycle_staging();
        self.counters.evictions.fetch_add(evicted as u64, Relaxed);
        evicted
    }

    /// Stores one evicted page; false if the store refused it (it is then put back).
    fn store_page(&self, v: u32, page: &[u8]) -> bool {
        match self.root.store.write(v as u64, page) {
            Ok(()) => {
                if self.store_full.load(Relaxed) {
                    self.store_full.store(false, Relaxed);
                }
                true
            }
            Err(e) => {
                // A full store (its memory limit) is expected under pressure: say it once per
                // episode, not once per page.
                self.store_full_ms.store(now_ms(), Relaxed);
                if !self.store_full.swap(true, Relaxed) {
                    tracing::warn!("cannot store evicted pages, they stay resident: {e}");
                }
                self.counters.store_refused.fetch_add(1, Relaxed);
                false
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
        queued: &mut [bool; STAGING_SLOTS],
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
                queued[slot] = true;
            }
            if self.store_full.load(Relaxed) {
                self.store_full.store(false, Relaxed);
            }
            return;
        }
        for &slot in slots {
            queued[slot] = self.store_page(victims[slot], page_at(slot));
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

    /// Frees the staging pages. Unregistered first, so the madvise sends no REMOVE event
    /// (which would block until a handler read it: a handler may be the one evicting).
    fn recycle_staging(&self) {
        let len = STAGING_SLOTS * PAGE;
        let u = &self.root.uffd;
        if let Err(e) = u.unregister(self.staging, len) {
            tracing::error!("staging unregister: {e}");
        }
        // SAFETY: the staging area is our own mapping; its pages were all handed on.
        unsafe { libc::madvise(self.staging as *mut _, len, libc::MADV_DONTNEED) };
        if let Err(e) = u.register_missing(self.staging, len) {
            tracing::error!("staging register: {e}");
        }
    }

    pub fn evictor_loop(&self, adaptive: Option<crate::budget_loop::BudgetLoop>) {
        let mut adaptive = adaptive;
        let mut last_reap = Instant::now();
        while !self.stop.load(Relaxed) {
            if self.forking.load(Acquire) {
                self.parked.fetch_add(1, AcqRel);
                while self.forking.load(Acquire) && !self.stop.load(Relaxed) {
                    std::thread::sleep(Duration::from_micros(200));
                }
                self.parked.fetch_sub(1, AcqRel);
                continue;
            }
            if let Some(a) = adaptive.as_mut() {
                a.tick(self, false);
            }
            let resident = self.root.inner.lock().resident;
            // Under faults the handlers evict between faults themselves; this thread takes over
            // when they are quiet (a lowered budget, an adaptive shrink) or fall behind.
            let quiet = self.last_fault_at.lock().elapsed() > Duration::from_millis(20);
            let low = if quiet {
                self.low_water()
            } else {
                self.budget()
            };
            if resident > low {
                if self.evict(resident - low) == 0 {
                    let full = self.store_full.load(Relaxed);
                    std::thread::sleep(Duration::from_millis(if full { 20 } else { 1 }));
                }
                self.repack();
                continue;
            }
            {
                let mut g = self.evictor_mutex.lock();
                if !*g {
                    self.evictor_wake
                        .wait_for(&mut g, Duration::from_millis(50));
                }
                *g = false;
            }
            if last_reap.elapsed() >= Duration::from_secs(1) {
                last_reap = Instant::now();
                self.reap_children();
            }
        }
    }
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
