//! Colocation: the thread that takes the faults and the region's own threads on one CPU.
//!
//! Measured on this 2-vCPU VM (docs/DESIGN-NOTES.md, "Colocation"): a fault served by a
//! handler on the other vCPU costs two cross-vCPU wake-ups, and every `UFFDIO_MOVE` made while
//! the program runs on the other vCPU costs a TLB-flush IPI (10–20 µs each; 0.9 µs when no
//! other vCPU runs the process). A C loop with its handler on one CPU ran at 4.3 µs per access
//! against 42 µs across two, and `bench region` (1G, 256M, rand) at 15.7 against 24.1. The
//! scheduler does not place them together by itself: the served thread is woken on whichever
//! vCPU is idle, i.e. away from the handler. The kernel's own swap-in never has the problem,
//! since it runs in the faulting thread.
//!
//! So while one thread of the program takes every fault, that thread and the region's threads
//! are pinned to the CPU the handler runs on; they get their own affinity back as soon as
//! another thread faults (that thread too, if it inherited the pin), the faults stop for
//! [`QUIET`], the region is dropped, or (in a forked child, for the forking thread) at fork.
//! Only with one handler thread, on a process allowed more than one CPU.
//!
//! Several threads faulting in turn at a high rate (a fault storm: [`STREAK`] faults within
//! [`STORM`], from 2 to [`MAX_GROUP`] threads, e.g. memcached's workers) are pinned together
//! with the region's threads: one handler serves every fault one after the other anyway, so
//! the threads mostly wait for it, and on one CPU its moves need no TLB-flush IPI and its
//! wake-ups no cross-vCPU wake. memcached under `zmem run --resident 40M --store-limit 64M`,
//! 64 MiB of values, 20000 random GETs from 2 clients: 20.8k GET/s spread, 30.9k all on one
//! CPU (`taskset -c 0`; the move cost per fault fell from 4.8 to 0.9 µs). A thread that joins
//! the storm joins the group; the group is released when the rate falls below a quarter of a
//! storm's (the threads compute more than they fault: give them their CPUs back) or the faults
//! stop for [`QUIET`].

use std::time::{Duration, Instant};

use zmem_os::sync::Mutex;

/// Consecutive faults from one thread before it is pinned.
const STREAK: u32 = 256;
/// A pinned thread that has not faulted for this long gets its own affinity back.
pub(crate) const QUIET: Duration = Duration::from_millis(500);
/// A fault storm: [`STREAK`] faults (from any threads) within this long.
const STORM: Duration = Duration::from_millis(10);
/// Most threads pinned together; a storm from more threads is left alone.
const MAX_GROUP: usize = 8;
/// After an unpin, no new pin for this long (a program whose threads take turns must not make
/// every fault a pair of system calls).
const BACKOFF: Duration = Duration::from_secs(1);

/// An affinity mask.
#[derive(Clone, Copy)]
struct CpuSet(libc::cpu_set_t);

impl CpuSet {
    /// `tid`'s mask (0: the calling thread).
    fn of(tid: libc::pid_t) -> Option<CpuSet> {
        // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        // SAFETY: `set` is valid for its size.
        let r = unsafe { libc::sched_getaffinity(tid, std::mem::size_of_val(&set), &mut set) };
        (r == 0).then_some(CpuSet(set))
    }

    fn only(cpu: usize) -> CpuSet {
        // SAFETY: as above.
        let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
        if cpu < libc::CPU_SETSIZE as usize {
            // SAFETY: `cpu` is within the set.
            unsafe { libc::CPU_SET(cpu, &mut set) };
        }
        CpuSet(set)
    }

    fn has(&self, cpu: usize) -> bool {
        // SAFETY: `cpu` is checked against the set's size first.
        cpu < libc::CPU_SETSIZE as usize && unsafe { libc::CPU_ISSET(cpu, &self.0) }
    }

    fn first(&self) -> Option<usize> {
        (0..libc::CPU_SETSIZE as usize).find(|&c| self.has(c))
    }

    fn is_only(&self, cpu: usize) -> bool {
        // SAFETY: a set we hold.
        self.has(cpu) && unsafe { libc::CPU_COUNT(&self.0) } == 1
    }

    /// This mask without `cpu`; None if nothing would be left.
    fn without(&self, cpu: usize) -> Option<CpuSet> {
        let mut m = *self;
        if cpu < libc::CPU_SETSIZE as usize {
            // SAFETY: `cpu` is within the set.
            unsafe { libc::CPU_CLR(cpu, &mut m.0) };
        }
        // SAFETY: a set we hold.
        (unsafe { libc::CPU_COUNT(&m.0) } > 0).then_some(m)
    }

    /// Applies the mask to `tid` (0: the calling thread). A thread that has exited is no error.
    fn apply(&self, tid: libc::pid_t) -> bool {
        // SAFETY: a valid set of its size.
        unsafe { libc::sched_setaffinity(tid, std::mem::size_of_val(&self.0), &self.0) == 0 }
    }
}

struct Pinned {
    /// The pinned threads of the program and their masks before the pin, given back at the
    /// unpin (one thread, or a storm's group).
    members: Vec<(libc::pid_t, CpuSet)>,
    group: bool,
    cpu: usize,
    /// Threads that already had exactly this CPU before the pin (the program's own choice),
    /// left alone at the unpin; any other thread found with exactly this CPU then inherited
    /// the pin (created by the pinned thread meanwhile) and gets `own`.
    already: Vec<libc::pid_t>,
}

struct State {
    /// The region's handler and evictor, and their mask before any pin.
    ours: Vec<(libc::pid_t, CpuSet)>,
    /// The region's threads kept off the pinned CPU while a pin lasts (the evictor when it
    /// compresses what the handler moved out), and their mask before.
    off: Vec<(libc::pid_t, CpuSet)>,
    candidate: libc::pid_t,
    streak: u32,
    /// The current window of faults from any thread (storm detection, and a group's rate).
    window_start: Instant,
    window_faults: u32,
    window_threads: Vec<libc::pid_t>,
    pinned: Option<Pinned>,
    not_before: Instant,
    pins: u64,
}

impl State {
    /// Counts a fault from `tid` in the window. At the window's end (every [`STREAK`] faults):
    /// `Some(true)` if it was a storm, `Some(false)` if the rate was below a quarter of one.
    fn count(&mut self, tid: libc::pid_t) -> Option<bool> {
        if self.window_faults == 0 {
            self.window_start = Instant::now();
            self.window_threads.clear();
        }
        self.window_faults += 1;
        if !self.window_threads.contains(&tid) && self.window_threads.len() <= MAX_GROUP {
            self.window_threads.push(tid);
        }
        if self.window_faults < STREAK {
            return None;
        }
        self.window_faults = 0;
        let took = self.window_start.elapsed();
        if took <= STORM {
            Some(true)
        } else if took > 4 * STORM {
            Some(false)
        } else {
            None
        }
    }
}

pub(crate) struct Colocation {
    enabled: bool,
    state: Mutex<State>,
    /// Mirrors `state.pinned.is_some()` for the handler's spin (no lock on that path).
    pinned_now: std::sync::atomic::AtomicBool,
}

/// Threads pinned now by any region's colocation (the faulting thread and the region's own
/// threads): an unpin's scan for threads that inherited its pin leaves them alone.
static PINNED_BY_ANY: Mutex<Vec<libc::pid_t>> = Mutex::new(Vec::new());

/// The process's threads whose mask is exactly `cpu` (read from /proc/self/task; only at a pin
/// or an unpin, on the region's own threads).
fn threads_on_only(cpu: usize) -> Vec<libc::pid_t> {
    let mut ids = zmem_os::thread::task_ids();
    ids.retain(|&t| CpuSet::of(t).is_some_and(|m| m.is_only(cpu)));
    ids
}

fn gettid() -> libc::pid_t {
    // SAFETY: gettid cannot fail.
    unsafe { libc::gettid() }
}

impl Colocation {
    pub fn new(enabled: bool) -> Colocation {
        Colocation {
            enabled,
            state: Mutex::new(State {
                ours: Vec::with_capacity(4),
                off: Vec::new(),
                candidate: 0,
                streak: 0,
                window_start: Instant::now(),
                window_faults: 0,
                window_threads: Vec::with_capacity(MAX_GROUP + 1),
                pinned: None,
                not_before: Instant::now(),
                pins: 0,
            }),
            pinned_now: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether a thread is pinned with the region's threads now (a handler must not spin then:
    /// it would hold the very CPU the thread it serves needs).
    pub fn pinned(&self) -> bool {
        self.pinned_now.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// How many times a faulting thread was pinned.
    pub fn pins(&self) -> u64 {
        self.state.lock().pins
    }

    /// Called first on each of the region's own threads.
    pub fn register_ours(&self) {
        if !self.enabled {
            return;
        }
        let tid = gettid();
        if let Some(mask) = CpuSet::of(0) {
            self.state.lock().ours.push((tid, mask));
        }
    }

    /// Called first on a region thread that must keep off the pinned CPU while a pin lasts
    /// (the evictor settling the handlers' batches: its compression would take the program's
    /// CPU time).
    pub fn register_off(&self) {
        if !self.enabled {
            return;
        }
        if let Some(mask) = CpuSet::of(0) {
            self.state.lock().off.push((gettid(), mask));
        }
    }

    /// A fault from thread `tid` (0: unknown), on the handler's thread.
    pub fn on_fault(&self, tid: libc::pid_t) {
        if !self.enabled || tid <= 0 {
            return;
        }
        let mut st = self.state.lock();
        let window_full = st.count(tid);
        if let Some(p) = st.pinned.as_ref() {
            if p.members.iter().any(|&(t, _)| t == tid) {
                if p.group && window_full == Some(false) {
                    // The storm is over: the threads compute more than they fault.
                    self.unpin(&mut st);
                }
                return;
            }
            if p.group && p.members.len() < MAX_GROUP {
                self.join(&mut st, tid);
                return;
            }
            // Another thread faults: colocation with one of them would starve the other.
            self.unpin(&mut st);
            return;
        }
        if window_full == Some(true)
            && st.window_threads.len() >= 2
            && st.window_threads.len() <= MAX_GROUP
            && Instant::now() >= st.not_before
        {
            // Taken out while `pin` borrows the state; the next window clears it.
            let group = std::mem::take(&mut st.window_threads);
            self.pin(&mut st, &group, true);
            st.window_threads = group;
            return;
        }
        if st.candidate == tid {
            st.streak += 1;
        } else {
            st.candidate = tid;
            st.streak = 1;
        }
        if st.streak < STREAK || Instant::now() < st.not_before {
            return;
        }
        st.streak = 0;
        self.pin(&mut st, &[tid], false);
    }

    /// Pins `tids` (the program's threads) and the region's threads to the CPU the handler
    /// runs on.
    fn pin(&self, st: &mut State, tids: &[libc::pid_t], group: bool) {
        {
            let all = PINNED_BY_ANY.lock();
            if tids.iter().any(|t| all.contains(t)) {
                // Another region's colocation holds a thread (it faults on both): leave it.
                st.not_before = Instant::now() + BACKOFF;
                return;
            }
        }
        // SAFETY: sched_getcpu has no preconditions.
        let here = unsafe { libc::sched_getcpu() };
        let Some(first_own) = CpuSet::of(tids[0]) else {
            return;
        };
        let cpu = if here >= 0 && first_own.has(here as usize) {
            here as usize
        } else {
            match first_own.first() {
                Some(c) => c,
                None => return,
            }
        };
        let only = CpuSet::only(cpu);
        let already = threads_on_only(cpu);
        let mut members = Vec::with_capacity(tids.len());
        for &t in tids {
            // A thread not allowed on that CPU, or gone, stays out.
            if let Some(own) = CpuSet::of(t) {
                if own.has(cpu) && only.apply(t) {
                    members.push((t, own));
                }
            }
        }
        if members.is_empty() {
            st.not_before = Instant::now() + BACKOFF;
            return;
        }
        for &(t, _) in &st.ours {
            only.apply(t);
        }
        for &(t, own) in &st.off {
            if let Some(rest) = own.without(cpu) {
                rest.apply(t);
            }
        }
        {
            let mut all = PINNED_BY_ANY.lock();
            all.extend(members.iter().map(|&(t, _)| t));
            all.extend(st.ours.iter().map(|&(t, _)| t));
        }
        st.pinned = Some(Pinned {
            members,
            group,
            cpu,
            already,
        });
        st.pins += 1;
        self.pinned_now
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Thread `tid` joins a storm's group.
    fn join(&self, st: &mut State, tid: libc::pid_t) {
        let Some(p) = st.pinned.as_mut() else {
            return;
        };
        let mut all = PINNED_BY_ANY.lock();
        if all.contains(&tid) {
            return;
        }
        if let Some(own) = CpuSet::of(tid) {
            if own.has(p.cpu) && CpuSet::only(p.cpu).apply(tid) {
                p.members.push((tid, own));
                all.push(tid);
            }
        }
    }

    /// The evictor's periodic check: unpin when the faults have stopped.
    pub fn check_quiet(&self, since_last_fault: Duration) {
        if self.enabled && self.pinned() && since_last_fault >= QUIET {
            let mut st = self.state.lock();
            self.unpin(&mut st);
        }
    }

    /// Gives every pinned thread its own mask back (the region is going away).
    pub fn release(&self) {
        if self.enabled {
            let mut st = self.state.lock();
            self.unpin(&mut st);
        }
    }

    fn unpin(&self, st: &mut State) {
        let Some(p) = st.pinned.take() else {
            return;
        };
        let mut all = PINNED_BY_ANY.lock();
        for &(t, mask) in &st.off {
            mask.apply(t);
        }
        for &(t, mask) in st.ours.iter().chain(&p.members) {
            mask.apply(t);
            if let Some(i) = all.iter().position(|&x| x == t) {
                all.swap_remove(i);
            }
        }
        let own = p.members[0].1;
        for t in threads_on_only(p.cpu) {
            if !p.already.contains(&t) && !all.contains(&t) {
                own.apply(t);
            }
        }
        drop(all);
        st.not_before = Instant::now() + BACKOFF;
        st.candidate = 0;
        st.streak = 0;
        st.window_faults = 0;
        self.pinned_now
            .store(false, std::sync::atomic::Ordering::Relaxed);
    }

    /// In a forked child (atfork): the forking thread, if it carries the pin, gets the pinned
    /// thread's own mask back, so a child (a BGSAVE) does not share the parent's CPU. Takes no
    /// lock that a parent thread could have held at the fork.
    pub fn in_child(&self) {
        if !self.enabled || !self.pinned() {
            return;
        }
        let Some(st) = self.state.try_lock() else {
            return;
        };
        if let Some(p) = st.pinned.as_ref() {
            if CpuSet::of(0).is_some_and(|m| m.is_only(p.cpu)) {
                p.members[0].1.apply(0);
            }
        }
    }
}
