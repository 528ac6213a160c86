//! fork(): a forked child's region pages that were evicted at fork time are served from a
//! snapshot of the parent's store, so each process's later writes stay its own. The kernel
//! sends a FORK event that the forking thread waits for; our `pthread_atfork` hooks park every
//! region's threads first (see [`Shared::fork_mode`]), so that none of them is blocked in the
//! allocator (whose locks glibc holds across fork) when the event must be read.

use std::sync::atomic::{
    AtomicBool, AtomicU8,
    Ordering::{AcqRel, Acquire, Relaxed, Release, SeqCst},
};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::sync::Weak;
use zmem_os::sync::Mutex;
use zmem_os::SpinLock;

use crate::config::PAGE;
use crate::error::RegionError;
use crate::manager::{Shared, Space, SpaceInner, FORKER_MAPPED, POLL_GATE, POLL_SPACES};
use crate::state::PageState::*;
use crate::state::StateTable;
use crate::uffd::{self, Msg, Uffd};

/// Every live region, for the fork hooks. Its lock also keeps a region's birth and death
/// apart from fork: the kernel's fork waits until a FORK event has been read from every
/// registered userfaultfd, and glibc holds the allocator's locks meanwhile. A region registered
/// but whose handler is not running yet (or was just stopped, its descriptor still open) has
/// nobody to read that event, and the thread starting (or dropping) it blocks in malloc: both
/// wait forever (the deadlock `fork_while_threads_fault_on_two_regions` found when another
/// test created or dropped a region during a fork). So the creator holds this lock from
/// registration until its threads run and it is listed, the dropper from stopping the threads
/// until the descriptor is closed, and the forking thread from its prepare hook until after the
/// fork (a spin lock, which both processes reset, see zmem_os::spin).
pub(crate) static REGISTRY: SpinLock<Vec<Weak<Shared>>> = SpinLock::new(Vec::new());
static ATFORK: std::sync::Once = std::sync::Once::new();

/// Where each of a region's threads (handlers, then the evictor) stands with the fork gate.
/// A thread asleep in its idle wait is parked for a fork by the forking thread itself, without
/// a wake-up: waking a handler and the evictor to park them, and being woken back by the last
/// (`park_wake`), cost ~45 µs a fork on this 2-vCPU VM, and every wake of an idle thread drew
/// the copy-on-write faults of what it then wrote (a dozen a fork for the evictor alone).
pub(crate) struct Naps(Box<[AtomicU8]>);

/// Working: parked for a fork by waking it (`fork_gate_close` writes the gate).
const BUSY: u8 = 0;
/// In its idle wait, doing nothing that could block a fork (no lock, no allocation).
const NAPPING: u8 = 1;
/// Napping, and counted in `Shared::parked` by the forking thread: it stays out of the region
/// until the gate reopens (`Naps::end` says so when it wakes meanwhile).
const PARKED_NAPPING: u8 = 2;

impl Naps {
    pub(crate) fn new(threads: usize) -> Self {
        Self((0..threads).map(|_| AtomicU8::new(BUSY)).collect())
    }

    /// The forking thread: every napping thread is parked as it sleeps. Returns how many were,
    /// and whether that was all of them.
    fn park_sleepers(&self) -> (usize, bool) {
        let parked = self.swap_each(NAPPING, PARKED_NAPPING);
        (parked, parked == self.0.len())
    }

    /// The gate reopens: those that slept through it nap on, no longer parked. How many.
    fn release_sleepers(&self) -> usize {
        self.swap_each(PARKED_NAPPING, NAPPING)
    }

    /// Before region thread `w`'s idle wait (a handler's poll, the evictor's nap): from here
    /// until [`Self::end`] it does nothing that could block a fork, which may then count
    /// it as parked without waking it.
    pub(crate) fn begin(&self, w: usize) {
        self.0[w].store(NAPPING, SeqCst);
    }

    /// Right after region thread `w`'s idle wait. True: a fork counted it as parked meanwhile
    /// and the gate is not open yet: the thread is parked now (counted in `parked`, which it
    /// takes back when it leaves: `fork_mode` or `stay_parked` with `counted`).
    pub(crate) fn end(&self, w: usize) -> bool {
        let n = &self.0[w];
        loop {
            match n.compare_exchange(NAPPING, BUSY, SeqCst, SeqCst) {
                Ok(_) => return false,
                Err(PARKED_NAPPING) => {
                    if n.compare_exchange(PARKED_NAPPING, BUSY, SeqCst, SeqCst)
                        .is_ok()
                    {
                        return true;
                    }
                    // The gate reopened meanwhile and took the count back: napping again.
                }
                Err(_) => return false,
            }
        }
    }

    fn swap_each(&self, from: u8, to: u8) -> usize {
        self.0
            .iter()
            .filter(|n| n.compare_exchange(from, to, SeqCst, SeqCst).is_ok())
            .count()
    }
}

// The three hooks run on the forking thread, one of the program's: `as_zmem` keeps what they
// allocate out of the program's compressed heap (see zmem_os::thread::as_zmem). The parent
// hook allocates before it reopens the gate; on an evicted heap page it waited for handlers
// that wait for it.

extern "C" fn atfork_prepare() {
    zmem_os::thread::as_zmem(prepare);
}

extern "C" fn atfork_parent() {
    zmem_os::thread::as_zmem(parent);
}

extern "C" fn atfork_child() {
    zmem_os::thread::as_zmem(child);
}

fn prepare() {
    let registry = REGISTRY.lock();
    for s in registry.iter() {
        if let Some(s) = s.upgrade() {
            // The previous fork's link must have been taken by its FORK event before this
            // fork makes the next (see `parent`).
            s.wait_fork_served();
            s.prepare_spare_store();
            s.fork_gate_close();
            s.open_child_link();
            crate::manager::test_pause(&s.fork_hold_us);
        }
    }
    // Kept across the fork; released by atfork_parent and atfork_child.
    std::mem::forget(registry);
}

fn parent() {
    REGISTRY.reset(); // taken by atfork_prepare
    let registry = REGISTRY.lock();
    for s in registry.iter().filter_map(Weak::upgrade) {
        s.parent_side_of_link();
        crate::manager::test_pause(&s.fork_parent_hold_us);
        s.fork_gate_open();
    }
    // Returns before the handler has taken the child's snapshot: until then the program's
    // faults, frees and moves wait (`fork_snapshot_pending`), the next fork waits in its
    // prepare hook (this fork's link in `fork_link` must go to this child), and so does the
    // process's exit (`hand_off_children`). Waiting here instead cost every fork the snapshot
    // and a wake-up: fork() + _exit + waitpid at `--resident 16M`, 701-710 -> 633-665 µs.
}

fn child() {
    REGISTRY.reset();
    crate::manager::forget_dead_stores_in_child();
    // The parent's descriptors are no use here: this process's region pages are served through
    // the descriptors the parent read from its FORK events. A copy left open would keep the
    // parent's userfaultfd alive after the parent closes it, and the parent's munmap of the
    // region would then wait for an UNMAP event nobody reads, for as long as this process
    // lives (found with two tests forking and dropping regions at once).
    // Then the list is emptied: these regions have no threads here, and their numbers, closed
    // now, will be reused by the program, so a later fork in this process must neither close
    // them again nor write to them (found when a forked bash subshell forked again and lost
    // the pipe of its command substitution).
    let mut registry = REGISTRY.lock();
    for s in registry.iter() {
        if let Some(s) = s.upgrade() {
            // The parent's handler applies what it deferred; nothing waits for it here.
            s.range_events_deferred.store(0, Release);
            s.close_in_child();
            s.colocation.in_child();
            s.child_side_of_link();
        }
    }
    registry.clear();
}

/// A region being dropped, its threads gone and its ranges unregistered (so that no fork from
/// now on sends `uffd` an event): reads and drops whatever events are still in flight, a FORK
/// event's new descriptor closed. A raw fork(2) takes no fork lock (`REGISTRY`): one that
/// copied the region's mappings just before the unregister waits in the kernel until its FORK
/// event is read, and its child, whose descriptor table already holds `uffd`, keeps it open
/// past our close, so the kernel never gives up on the event. Nobody read it: the fork waited
/// forever (a test forking with the raw system call while another thread made and dropped
/// regions hung within seconds, every run). While an event is in flight the kernel refuses
/// every copy (EAGAIN, its `mmap_changing`); a copy into `probe` (a page of ours, mapped and
/// no longer registered) is that question, and fails without writing anything once none is.
pub(crate) fn drain_events_in_flight(uffd: &Uffd, probe: usize, zero: &[u8]) {
    let mut msgs = [Msg::default(); 16];
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2) {
        let n = uffd.read_msgs(&mut msgs).unwrap_or(0);
        for m in msgs[..n].iter().filter(|m| m.event == uffd::EVENT_FORK) {
            // SAFETY: the kernel installed this descriptor for us in the FORK message; the
            // child's mappings in this region then read as plain memory.
            drop(unsafe { Uffd::from_raw(m.arg0 as u32 as i32) });
        }
        if n > 0 {
            continue;
        }
        match uffd.copy(probe, zero.as_ptr(), PAGE) {
            Err(e) if e.code() == libc::EAGAIN => std::thread::sleep(Duration::from_micros(50)),
            _ => return,
        }
    }
}

/// Makes fork() park this region's threads first (see [`Shared::fork_mode`]). Called with
/// the registry locked (`registry`), before the lock is released.
pub(crate) fn register_for_fork(registry: &mut Vec<Weak<Shared>>, shared: &Arc<Shared>) {
    ATFORK.call_once(|| {
        // SAFETY: registering plain extern "C" functions with no captured state.
        unsafe {
            libc::pthread_atfork(
                Some(atfork_prepare),
                Some(atfork_parent),
                Some(atfork_child),
            )
        };
    });
    registry.retain(|w| w.strong_count() > 0);
    registry.push(Arc::downgrade(shared));
}

impl Shared {
    /// While a fork is in progress (between our `pthread_atfork` prepare and parent hooks) a
    /// handler only reads messages, so the kernel's FORK event (which the forking thread waits
    /// for) is read, and allocates nothing: glibc holds the allocator's locks across fork, and a
    /// handler blocked in malloc before reading the event would deadlock the fork. FORK events
    /// are stashed and snapshotted after the fork returns; faults and other events wait, in
    /// order, in `deferred` (reserved up front). No fault is resolved until the snapshot is
    /// taken, so the child's view is the parent's memory at the fork; only the forking thread's
    /// own faults get their page mapped meanwhile (see `map_for_forking_thread`). The thread is
    /// counted in `parked` already (`park_for_fork`, or by the forking thread while it napped);
    /// it takes the count back as it leaves.
    pub(crate) fn fork_mode(
        &self,
        spaces: &[Arc<Space>],
        fds: &mut [libc::pollfd],
        msgs: &mut [Msg],
        deferred: &mut Vec<(Arc<Space>, Msg)>,
        forks: &mut Vec<(Arc<Space>, i32)>,
        buf: &mut [u8],
    ) {
        let forker = self.forking_tid.load(Relaxed);
        // The gate's eventfd stays readable until the forking thread drains it after everyone
        // parked: polled here, it made this loop spin, and the forking thread, woken on the
        // same CPU, waited a whole time slice (4 ms per fork). The gate's reopening is told by
        // `reopen_fd` instead (drained before the gate closed), so the handler leaves as soon as
        // the parent hook opens it; the nap is only a fallback. (The handler loop rebuilds `fds`
        // at its next pass, gate included.)
        fds[POLL_GATE].fd = self.reopen_fd;
        let nap = libc::timespec {
            tv_sec: 0,
            tv_nsec: 1_000_000,
        };
        while self.forking.load(Acquire) && !self.stop.load(Relaxed) {
            for f in fds.iter_mut() {
                f.revents = 0;
            }
            // SAFETY: a valid pollfd array; no signal mask change.
            unsafe { libc::ppoll(fds.as_mut_ptr(), fds.len() as _, &nap, std::ptr::null()) };
            for (i, s) in spaces.iter().enumerate() {
                if fds[POLL_SPACES + i].revents == 0 {
                    continue;
                }
                // Pushes stay within the capacity reserved up front (one fault per blocked
                // thread: FORK_STASH is far above any thread count zmem serves).
                loop {
                    // Range events wait with the faults too: applying one may allocate (zmem's
                    // own glibc arena), and the forking thread holds glibc's malloc locks from
                    // here until the FORK event is read. Applied at once, an UNMAP deadlocked a
                    // fork in CI (run_programs' heap_grow: the handler waited for the arena lock,
                    // the fork for the handler). The program's madvise returns once its event is
                    // read, so until the event is applied (right after the snapshot) no fault
                    // is served but the forking thread's (`range_events_deferred`): a page the
                    // program wrote again and had evicted meanwhile would be forgotten.
                    // Not while a child's batch is in flight (`Space::moving`), checked without
                    // the space lock: a program thread on the signal route may hold it while it
                    // waits for glibc's malloc lock, which the forking thread holds until this
                    // loop reads its FORK event (taking the lock here hung a fork in CI).
                    if s.moving.load(Acquire) {
                        break;
                    }
                    // Counted before the read: the program's madvise returns as the kernel
                    // hands its event over, before this thread has looked at it (a fault of
                    // the writing thread served in that gap lost a page in the test).
                    self.range_events_deferred.fetch_add(1, AcqRel);
                    // And a FORK event is pending from before its read (`fork_snapshot_pending`).
                    self.fork_reading.fetch_add(1, SeqCst);
                    let n = s.uffd.read_msgs(msgs).unwrap_or(0);
                    let ranges = msgs[..n]
                        .iter()
                        .filter(|m| crate::events::is_range_event(m))
                        .count();
                    // One count per range event read, kept until it is applied.
                    if ranges == 0 {
                        self.range_events_deferred.fetch_sub(1, AcqRel);
                    } else {
                        self.range_events_deferred.fetch_add(ranges - 1, AcqRel);
                    }
                    for m in &msgs[..n] {
                        if m.event == uffd::EVENT_FORK {
                            // Counted until served (hand_off_children waits for it).
                            self.forks_unserved.fetch_add(1, AcqRel);
                            if s.is_root {
                                self.send_child_uffd_now(m.arg0 as u32 as i32);
                            }
                            forks.push((s.clone(), m.arg0 as u32 as i32));
                        } else {
                            if m.event == uffd::EVENT_PAGEFAULT
                                && s.is_root
                                && m.arg2 as u32 as i32 == forker
                            {
                                let _ = self.map_for_forking_thread(s, m.arg1 as usize, buf);
                            }
                            deferred.push((s.clone(), *m));
                        }
                    }
                    self.fork_reading.fetch_sub(1, SeqCst);
                    if n < msgs.len() {
                        break;
                    }
                }
            }
        }
        self.parked.fetch_sub(1, AcqRel);
    }

    /// The forking thread faulted while the gate is closed: glibc's fork() reads its NSS state
    /// (malloc'd, in the program heap) after the prepare hooks (__nss_database_fork_prepare_
    /// parent), and hooks registered before ours run after it. Left waiting, that thread would
    /// never fork and the handlers would wait for it forever (found in CI: bash under an 8M
    /// budget, its NSS state's page evicted). Its page is mapped with its content and nothing
    /// else changes: the message stays deferred, and after the fork the normal path finds the
    /// page present (EEXIST) and does the bookkeeping. The snapshot, taken before that, still
    /// sees the page evicted and gives the child the evicted content, which is right whether
    /// the kernel copied the page tables before we mapped the page (the child has it and never
    /// faults on it) or after (the child faults and reads what the page held at the fork).
    /// Nothing is allocated or logged here but what a store read needs; any failure is left to
    /// the normal path after the fork. Returns the page's state if it was mapped.
    pub(crate) fn map_for_forking_thread(
        &self,
        s: &Space,
        addr: usize,
        buf: &mut [u8],
    ) -> Option<crate::state::PageState> {
        let idx = s.index_of(addr)?;
        // Every other thread of the region is parked, none holding this lock; the wait only
        // guards against one that did not park in time.
        let inner = s.inner.try_lock_for(Duration::from_millis(100))?;
        let at = s.page_addr(idx);
        let st = inner.state.get(idx);
        let mapped = match st {
            Stored => match s.store.read(idx as u64, &mut buf[..PAGE]) {
                Ok(()) => s.uffd.copy(at, buf.as_ptr(), PAGE),
                Err(_) => return None,
            },
            Staged => match inner.staged.get(&(idx as u32)) {
                // The slot holds the page until the state changes, which needs this lock.
                Some(&slot) => s.uffd.copy(at, slot as *const u8, PAGE),
                None => return None,
            },
            // Never touched, or dropped behind our back: zeros, as anonymous memory reads.
            Absent | Resident => s.uffd.copy(at, self.zero_page.as_ptr(), PAGE),
            Faulting | Poisoned | Unmapped => return None,
        };
        mapped.ok().map(|()| st)
    }

    /// After a fork's snapshot: the pages its forking thread mapped for itself on the signal
    /// route (`serve_fault`) become Resident, as the fault would have made them, unless an event
    /// or a later fault changed them since.
    pub(crate) fn account_forker_mapped(&self) {
        let mut list = [0u32; FORKER_MAPPED];
        let n = {
            let mut m = self.forker_mapped.lock();
            let n = m.len().min(FORKER_MAPPED);
            list[..n].copy_from_slice(&m[..n]);
            m.clear();
            n
        };
        let s = &self.root;
        for &i in &list[..n] {
            let mut inner = s.inner.lock();
            let st = inner.state.get(i as usize);
            if matches!(st, Stored | Absent) {
                inner.state.set(i as usize, Faulting);
                inner.state.set(i as usize, Resident);
                inner.admit(i);
                if st == Stored {
                    let _ = s.store.discard(u64::from(i));
                }
            }
        }
    }

    /// The forked child's hook waits for its userfaultfd (`child_side_of_link`): sent as soon
    /// as its FORK event is read, so the child runs while the snapshot is taken instead of
    /// after (`link_child` sends the rest). Allocates nothing: a sendmsg from the stack.
    fn send_child_uffd_now(&self, fd: i32) {
        let link = self.fork_link.lock();
        if let Some(a) = link.0.as_ref() {
            if zmem_os::fds::send_fd(std::os::fd::AsRawFd::as_raw_fd(a), fd).is_ok() {
                self.child_uffd_sent.store(true, Relaxed);
            }
        }
    }

    /// A thread of the region stops for a fork: counted, and the forking thread (waiting in
    /// `fork_gate_close`) is woken. Allocates nothing.
    pub(crate) fn park_for_fork(&self) {
        self.parked.fetch_add(1, AcqRel);
        let _g = self.park_lock.lock();
        self.park_wake.notify_all();
    }

    /// pthread_atfork prepare, on the forking thread while the handlers still serve: the
    /// snapshot's store is made here, so that no handler starts its threads.
    fn prepare_spare_store(&self) {
        let mut spare = self.spare_store.lock();
        if spare.is_none() {
            match (self.store_factory)() {
                Ok(s) => *spare = Some(s),
                Err(e) => tracing::warn!("fork: no store for the child's snapshot yet: {e}"),
            }
        }
    }

    /// pthread_atfork prepare: park every handler and the evictor (bounded wait).
    pub fn fork_gate_close(&self) {
        // Readable from the last `fork_gate_open` until here: it must not wake `fork_mode`
        // during this fork.
        zmem_os::fds::eventfd_drain(self.reopen_fd);
        // SAFETY: gettid has no preconditions.
        self.forking_tid.store(unsafe { libc::gettid() }, Relaxed);
        // SeqCst with the naps: a thread that starts napping after its look below sees it.
        self.forking.store(true, SeqCst);
        let (asleep, all_asleep) = self.naps.park_sleepers();
        self.parked.fetch_add(asleep, AcqRel);
        if all_asleep {
            return;
        }
        zmem_os::fds::eventfd_signal(self.gate_fd);
        self.kick_evictor();
        // Woken by the last thread to park (a loop of sched_yield here gave the CPU away for a
        // whole time slice at a time: 4-5 ms per fork). Bounded: a thread that does not park
        // in time (busy in a long eviction) is not waited for.
        let deadline = Instant::now() + Duration::from_secs(2);
        let mut g = self.park_lock.lock();
        while self.parked.load(Acquire) < self.workers && Instant::now() < deadline {
            self.park_wake.wait_until(&mut g, deadline);
        }
        drop(g);
        zmem_os::fds::eventfd_drain(self.gate_fd);
    }

    /// The evictor, parked for a fork: waits until the gate reopens.
    /// `counted`: the forking thread counted it already (`Naps::end`).
    pub(crate) fn stay_parked(&self, counted: bool) {
        if !counted {
            self.park_for_fork();
        }
        // Woken by `fork_gate_open` (looking every 200 µs woke this thread, and with it the
        // TLB-flush IPIs of the forking thread's copy-on-write faults, several times a fork).
        let mut g = self.park_lock.lock();
        while self.forking.load(Acquire) && !self.stop.load(Relaxed) {
            self.park_wake.wait_for(&mut g, Duration::from_millis(1));
        }
        drop(g);
        self.parked.fetch_sub(1, AcqRel);
    }

    /// In a forked child: closes the descriptors inherited from the parent (its userfaultfds,
    /// its children's, the eventfds). The child never uses them (every region call that would
    /// checks `in_creator`) and never closes them again (a child's `Region::drop` forgets it).
    /// Async-signal-safe: raw close(2), past the preload library's protection of these numbers.
    fn close_in_child(&self) {
        let close = |fd: i32| {
            zmem_os::fds::unprotect(fd);
            // SAFETY: a descriptor this process inherited and never uses.
            unsafe { libc::syscall(libc::SYS_close, fd) };
        };
        close(self.root.uffd.raw());
        // A child snapshot is listed under this lock; a thread of the parent that held it at
        // the fork left it locked here, and then there is nothing more to close safely.
        if let Some(children) = self.children.try_lock() {
            for c in children.iter() {
                close(c.uffd.raw());
                if let Some((l, _)) = &c.asks {
                    close(l.raw()); // a link shared by a family is closed once, then EBADF
                }
            }
        }
        if let Some(l) = self.raw_link.get() {
            close(l.raw());
        }
        close(self.stop_fd);
        close(self.gate_fd);
        close(self.reopen_fd);
    }

    /// pthread_atfork parent: let them go.
    pub fn fork_gate_open(&self) {
        self.forking.store(false, SeqCst);
        // Those still asleep since the gate closed were never parked but by our count.
        self.parked.fetch_sub(self.naps.release_sleepers(), AcqRel);
        // Handlers in `fork_mode` leave at once.
        zmem_os::fds::eventfd_signal(self.reopen_fd);
        // The evictor waits here (and the parent hook, for its fork to be served).
        let _g = self.park_lock.lock();
        self.park_wake.notify_all();
    }

    /// snapshot of this space's store, so each process's later writes stay its own.
    pub(crate) fn on_fork(&self, parent: &Space, child_uffd: Uffd) {
        // Children that exited go first: each holds a snapshot store and a state table sized
        // for the whole region, in memory the kernel accounts for the next fork (bash running
        // `$(...)` 300 times under an 8M budget hit fork's ENOMEM, __vm_enough_memory, with
        // dozens of dead children's tables waiting for the once-a-second reap).
        self.reap_children();
        let _evicting = self.evict_lock.lock();
        let _settling = self.settle_lock.lock();
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
        let spare = self.spare_store.lock().take();
        let store = match spare {
            Some(s) => s,
            None => (self.store_factory)()?, // a raw fork: no prepare hook ran
        };
        let mut state = StateTable::new(parent.pages)?;
        let mut page = vec![0u8; PAGE];
        let mut resident = 0;
        let mut stored = 0;
        // A child of the creator inherits the pages of its store instead of a copy
        // (inherit.rs); a child's child gets a copy.
        let mut heir = parent
            .heirs_parent
            .as_ref()
            .map(|p| crate::inherit::HeirBuilder::new(p, parent.pages));
        for (i, st) in inner.state.iter_touched() {
            match st {
                // Only Stored pages: a Faulting page may have no entry (a first touch, which
                // the child must read as zeros), and the parent's later eviction of it would
                // hand down what it wrote after the fork.
                Stored if heir.is_some() => {
                    if let Some(h) = heir.as_mut() {
                        h.inherit(i);
                    }
                    state.init(i, Stored);
                    stored += 1;
                }
                // Faulting pages still have their store entry (discarded only after mapping).
                // Copied as compressed where the store can (a single-page object), else read
                // back and written again.
                Stored | Faulting
                    if matches!(store.copy_page_from(&**parent.store, i as u64), Ok(true)) =>
                {
                    state.init(i, Stored);
                    stored += 1;
                }
                Stored | Faulting => match parent.store.read(i as u64, &mut page) {
                    Ok(()) => {
                        store.write(i as u64, &page)?;
                        state.init(i, Stored);
                        stored += 1;
                    }
                    // A page whose only copy is unreadable (corrupt, a failed SSD read) is lost
                    // for the child too: SIGBUS there when touched, like in the parent, and
                    // the rest of the snapshot goes on.
                    Err(e) if e.lost_page() == Some(i as u64) => {
                        tracing::error!("fork: page {i} cannot be read back for the child: {e}");
                        state.init(i, Poisoned);
                    }
                    Err(e) => return Err(e.into()),
                },
                Staged => {
                    let slot = inner.staged[&(i as u32)];
                    // SAFETY: a Staged page's slot holds the moved page until the state
                    // changes, which needs the lock our caller holds.
                    let src = unsafe { std::slice::from_raw_parts(slot as *const u8, PAGE) };
                    store.write(i as u64, src)?;
                    state.init(i, Stored);
                    stored += 1;
                }
                // Present at fork time: the child has its own copy-on-write mapping.
                Resident => {
                    state.init(i, Resident);
                    resident += 1;
                }
                Absent => {} // already Absent: leave the child's untouched table pages alone
                other => state.init(i, other),
            }
        }
        let (store, heir): (Box<dyn crate::backing::BackingStore>, _) = match heir {
            Some(h) => {
                let (store, heir) = h.build(store);
                (Box::new(store), Some(heir))
            }
            None => (store, None),
        };
        let mut mine = SpaceInner::new(state, None);
        // The child's resident pages are those present at fork (its copy-on-write mapping).
        mine.resident = resident;
        // Linked to a thread of the child, its pages can be evicted there.
        let link = self.link_child(parent, &child_uffd, stored);
        if link.is_some() {
            mine.child = Some(crate::child::ChildPages::new());
        }
        // On the signal route the child asks for its faults over a link of its own; the
        // processes it forks ask on the same one (`forked`).
        let asks = if !self.signal_route {
            None
        } else if parent.is_root {
            match self.fault_link.lock().0.take() {
                Some(a) => Some((Arc::new(crate::forked::FaultLink::new(a)), true)),
                // A raw fork (no hooks): the child asks on the creator's link for raw forks,
                // which it inherited.
                None => self.raw_link.get().map(|l| (l.clone(), false)),
            }
        } else {
            parent.asks.as_ref().map(|(l, _)| (l.clone(), false))
        };
        Ok(Space {
            uffd: child_uffd,
            base: parent.base,
            pages: parent.pages,
            store: std::mem::ManuallyDrop::new(store),
            heirs_parent: None,
            heir,
            inner: Mutex::new(mine),
            is_root: false,
            dead: AtomicBool::new(false),
            link: Mutex::new(link),
            asks,
            moving: AtomicBool::new(false),
        })
    }

    /// Drops the spaces of children that have exited (their mm is gone: ESRCH).
    pub fn reap_children(&self) {
        let mut reaped = Vec::new();
        self.children.lock().retain(|c| {
            // A copy to a low address that is never part of a region: ESRCH when the child's
            // memory is gone; otherwise an error that changes nothing.
            let probe = c.uffd.copy(0x10000, self.zero_page.as_ptr(), PAGE);
            let gone = matches!(&probe, Err(e) if e.code() == libc::ESRCH);
            if gone {
                c.dead.store(true, Relaxed);
                if let Some(h) = &c.heir {
                    h.mark_dead();
                }
                reaped.push(c.clone());
            }
            !gone
        });
        for c in reaped {
            let link = c.link.lock().take();
            if let Some(l) = link {
                self.pass_on_link(l);
            }
        }
    }
}
