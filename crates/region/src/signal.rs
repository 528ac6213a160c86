//! The signal route for faults (`FaultRoute::Signal`, opt-in): the userfaultfd is opened with
//! `UFFD_FEATURE_SIGBUS`, so a user-mode access to a missing page of the region raises SIGBUS
//! in the faulting thread, and this module's handler serves the fault right there
//! (`Shared::serve_fault`: decompress, `UFFDIO_COPY`), then returns and the access runs again.
//! No message, no handler thread, no wake-up across CPUs: the hand-off that costs the handler
//! route about half of its fault time on a VM (docs/DESIGN-NOTES.md, "The signal route").
//!
//! What the route cannot do, and why it is not the default:
//! - a *kernel-mode* access to a missing page (read(2) into an evicted buffer, a futex word,
//!   epoll_wait's array) does not wait for anyone: the system call fails with EFAULT;
//! - a thread that blocks SIGBUS is killed by the kernel on such a fault (a synchronous signal
//!   cannot be held);
//! - a forked child's faults (a raw fork's too) are served by the creator over a link, a round
//!   trip per fault (`forked`);
//! - a thread whose stack is in the region dies with SIGSEGV when a page of its stack is
//!   missing (the kernel cannot write the signal frame there), unless it has zmem's alternate
//!   signal stack: the syscall guard gives one to every thread `pthread_create` makes
//!   (`guard::give_thread_signal_stack`); a thread made with a stack of the program's in the
//!   region (`pthread_attr_setstack`) keeps its thread block there, which the kernel and the
//!   handler use: not supported;
//! - a program that replaces the SIGBUS handler afterwards takes the faults away from it.
//!
//! The handler route keeps serving everything else: the region's events (remove, unmap,
//! remap, fork) still go to its handler thread, and eviction is unchanged.

use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicUsize, Ordering::*};
use std::sync::{Arc, Once, OnceLock};
use std::time::Instant;

use crate::config::PAGE;
use crate::error::RegionError;
use crate::manager::{Served, Shared};
use crate::uffd;

/// Regions served by signal at once (a process makes few: the preload makes one).
const SLOTS: usize = 16;

/// One region the handler serves: its range and its `Shared` (a leaked `Box<Arc<Shared>>`
/// while listed). `shared` is published last and cleared first, so the handler never sees a
/// range without its region.
struct Slot {
    start: AtomicUsize,
    end: AtomicUsize,
    shared: AtomicPtr<Arc<Shared>>,
    /// The end of a link this process asks the creator on (`forked`): in a forked child, its
    /// own link's; in the creator, the link for raw forks (whose children inherit it; the
    /// creator never asks); -1 without one. And the pid of the child the link was made for (0
    /// for the raw forks' link).
    link: AtomicI32,
    link_owner: AtomicI32,
}

#[allow(clippy::declare_interior_mutable_const)] // only to build the array below
const EMPTY: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    shared: AtomicPtr::new(std::ptr::null_mut()),
    link: AtomicI32::new(-1),
    link_owner: AtomicI32::new(0),
};
static SLOTS_IN_USE: [Slot; SLOTS] = [EMPTY; SLOTS];

/// The SIGBUS disposition found when ours was installed: faults that are not a region's go
/// there.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();
static INSTALL: Once = Once::new();

thread_local! {
    /// Each thread's buffer for the pages it decompresses (a fault-around run is at most 64
    /// pages), made at its first fault.
    static BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Faults this thread served (the kernel counts a fault that ends in SIGBUS in no usage).
    static SERVED: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
    /// Whether this thread is serving a fault now (see `serving_a_fault`).
    static SERVING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Registers this thread's decompression buffer now (it is still made at its first fault);
/// see `zmem_os::thread::prepare_this_thread`.
pub(crate) fn prepare_thread() {
    BUF.with(|_| ());
}

/// Whether the calling thread is serving a fault of a region's signal route: the system calls
/// it makes meanwhile are zmem's (a lock's futex), which the syscall guard must pass as they
/// are.
pub(crate) fn serving_a_fault() -> bool {
    SERVING.try_with(|s| s.get()).unwrap_or(false)
}

/// Faults the calling thread served itself on a region's signal route, since it started.
pub fn signal_faults_on_this_thread() -> u64 {
    SERVED.with(|c| c.get())
}

/// A region listed for the handler; unlisted when dropped.
pub(crate) struct Listed(usize);

/// Installs the handler (once per process) and lists the region `[start, end)`.
pub(crate) fn list(start: usize, end: usize, shared: &Arc<Shared>) -> Result<Listed, RegionError> {
    install()?;
    for (i, slot) in SLOTS_IN_USE.iter().enumerate() {
        // Claim a free slot by its start (0 = free), then publish the region.
        if slot
            .start
            .compare_exchange(0, start, AcqRel, Acquire)
            .is_ok()
        {
            slot.end.store(end, Release);
            let boxed = Box::into_raw(Box::new(shared.clone()));
            slot.shared.store(boxed, Release);
            return Ok(Listed(i));
        }
    }
    Err(RegionError::Config(format!(
        "fault_route signal: at most {SLOTS} regions of a process may use it at once"
    )))
}

impl Drop for Listed {
    fn drop(&mut self) {
        let slot = &SLOTS_IN_USE[self.0];
        let p = slot.shared.swap(std::ptr::null_mut(), AcqRel);
        let link = slot.link.swap(-1, AcqRel);
        if link >= 0 {
            crate::child::close_raw(link);
        }
        slot.end.store(0, Release);
        slot.start.store(0, Release);
        if !p.is_null() {
            // SAFETY: made by Box::into_raw in `list`, unlisted above (the region is being
            // dropped: no thread may touch its memory any more, so no handler is using it).
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

fn install() -> Result<(), RegionError> {
    let mut failed = None;
    INSTALL.call_once(|| {
        // SAFETY: a zeroed sigaction is a valid "no handler, empty mask" value; the kernel
        // fills `old`, and `new` names our handler with SA_SIGINFO.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            let mut old: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigbus as *const () as usize;
            // SA_NODEFER: a fault inside the handler (another page of a region) is served too,
            // where a blocked synchronous SIGBUS would kill the process. No SA_ONSTACK here:
            // serving may compress (eviction), more stack than a program's alternate stack
            // usually has; the syscall guard adds it with stacks of zmem's own
            // (`handle_on_alternate_stacks`).
            new.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
            // Every asynchronous signal waits while a fault is served: a program's handler
            // (bash's SIGCHLD) that ran in the middle of it and touched an evicted page would
            // serve a second fault on this thread while the first holds its locks and buffer
            // (found as a panic, "already borrowed", in bash forking pipelines). The
            // synchronous ones stay open: blocked, the kernel would kill rather than deliver.
            new.sa_mask = zmem_os::thread::asynchronous_signals();
            if libc::sigaction(libc::SIGBUS, &new, &mut old) != 0 {
                failed = Some(std::io::Error::last_os_error());
                return;
            }
            let _ = PREVIOUS.set(old);
        }
    });
    match failed {
        Some(source) => Err(RegionError::Os {
            op: "sigaction(SIGBUS)",
            source,
        }),
        None if PREVIOUS.get().is_some() => Ok(()),
        None => Err(RegionError::Config(
            "fault_route signal: the SIGBUS handler could not be installed earlier".into(),
        )),
    }
}

/// The link this process asks the creator on for the region at `start` (`forked`), for the
/// child `owner` (0: no owner, the creator's link for raw forks). Set in the creator (that link
/// is inherited by a child forked without hooks) and in a forked child's hook (its own link);
/// the descriptor it replaces is closed.
pub(crate) fn set_link(start: usize, sock: i32, owner: i32) {
    if let Some(slot) = SLOTS_IN_USE
        .iter()
        .find(|s| s.start.load(Acquire) == start && !s.shared.load(Acquire).is_null())
    {
        slot.link_owner.store(owner, Relaxed);
        let old = slot.link.swap(sock, AcqRel);
        if old >= 0 && old != sock {
            crate::child::close_raw(old);
        }
    }
}

/// Returns once no eviction batch of the region holding `addr` is picking or moving pages: a
/// batch that starts later sees the pins published before the call (see `guard::keep_in_memory`).
/// Nothing to wait for in a forked process: no batch of the creator's runs there, and its copy
/// of the lock stays locked if a thread of the creator held it at the fork (a program thread
/// evicting after its own fault is not parked by the fork hooks): a forked child's exec would
/// wait for it forever.
pub(crate) fn wait_for_eviction_batches(addr: usize) {
    if let Some((_, shared)) = find(addr) {
        if in_creators_memory(shared.creator_pid) {
            drop(shared.evict_lock.lock());
        }
    }
}

/// The region whose range holds `addr`, if any, and its slot.
fn find(addr: usize) -> Option<(&'static Slot, &'static Arc<Shared>)> {
    SLOTS_IN_USE.iter().find_map(|slot| {
        let p = slot.shared.load(Acquire);
        if p.is_null() {
            return None;
        }
        let (start, end) = (slot.start.load(Acquire), slot.end.load(Acquire));
        // SAFETY: listed, hence alive until `Listed::drop`, which runs only once no thread
        // may touch the region.
        (addr >= start && addr < end).then(|| (slot, unsafe { &*p }))
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // The interrupted code's errno comes back as it was, whatever the calls below fail with.
    let errno = zmem_os::errno::KeepErrno::new();
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // A missing page of a region is BUS_ADRERR; a poisoned page (corrupt data) is not ours to
    // serve.
    let Some((slot, shared)) = (code == libc::BUS_ADRERR).then(|| find(addr)).flatten() else {
        errno.restore_now();
        forward(sig, info, ctx);
        return;
    };
    if !in_creators_memory(shared.creator_pid) {
        // A forked process: its memory is described by the creator's snapshot of it, so the
        // creator serves the fault (`forked`). Nothing here touches a thread-local or the heap.
        let (link, owner) = (slot.link.load(Acquire), slot.link_owner.load(Relaxed));
        match crate::forked::ask(link, owner, addr & !(PAGE - 1)) {
            crate::forked::Asked::Answered => {}
            crate::forked::Asked::Unserved => {
                say_forked_child();
                errno.restore_now();
                forward(sig, info, ctx);
            }
        }
        return;
    }
    // Nothing below may use a thread-local before this: glibc finds every thread-local through
    // the thread's DTV, an array it allocates with malloc, i.e. in the program's heap, where it
    // can be evicted. A fault on it is served by a handler thread.
    if in_this_threads_dtv(addr) {
        serve_by_handler(shared, addr & !(PAGE - 1));
        return;
    }
    // An unwinding panic must not leave a signal handler: abort instead.
    // zmem code on the program's thread: what it allocates (the eviction it does after the
    // fault) must come from zmem's own heap, never the program's (whose pages it could then
    // fault on itself).
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        zmem_os::thread::as_zmem(|| serve(shared, addr & !(PAGE - 1)))
    }));
    if served.is_err() {
        std::process::abort();
    }
}

/// Whether this process runs in the region creator's memory: the creator itself, or a child
/// that shares its address space (vfork, posix_spawn, clone with CLONE_VM), whose faults are
/// the creator's to serve. A forked child has memory of its own, whose pages the parent's
/// userfaultfd cannot map.
fn in_creators_memory(creator: u32) -> bool {
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    me as u32 == creator || zmem_os::remote::same_address_space(me, creator as libc::pid_t)
}

/// Whether `addr` is in the calling thread's dynamic thread vector (glibc x86_64: the TCB's
/// second word points at entry 0, entry -1 holds the number of entries, 16 bytes each).
fn in_this_threads_dtv(addr: usize) -> bool {
    let dtv: usize;
    // SAFETY: reads the TCB's `dtv` word through %fs, which glibc sets for every thread.
    unsafe { std::arch::asm!("mov {}, fs:[8]", out(reg) dtv, options(nostack, readonly)) };
    if dtv < 16 {
        return false;
    }
    let start = dtv - 16;
    if addr >= start && addr < start + PAGE {
        return true; // the header itself: its length cannot be read yet
    }
    // SAFETY: entry -1 of the DTV (its page is resident, or the fault would be on it).
    let len = unsafe { std::ptr::read_volatile(start as *const usize) };
    addr >= start && addr < dtv + 16 * (len.min(1 << 20) + 1)
}

/// A forked process touched a heap page that was not in memory at the fork (evicted, or never
/// touched before) and nobody can serve it: the process it was forked from has been gone for
/// seconds, or no link could be made at the fork. Said once, then the fault takes its default
/// course (the process ends with SIGBUS).
fn say_forked_child() {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Relaxed) {
        let msg = b"zmem: a forked process touched a heap page that was not in memory when it \
was forked, and nobody can serve it (the process it was forked from is gone, or no link to it \
could be made); run without --fault-route signal\n";
        // SAFETY: writing a static buffer to stderr.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    }
}

fn serve(shared: &Arc<Shared>, page: usize) {
    // At the thread's exit its thread-locals (this module's buffer, the store's and the
    // codecs' contexts) may already be destroyed while the program's own destructors still
    // touch the heap: a handler thread serves such a fault instead.
    if BUF.try_with(|_| ()).is_err() || !zmem_store::thread_state_alive() {
        serve_by_handler(shared, page);
        return;
    }
    let _ = SERVED.try_with(|c| c.set(c.get() + 1));
    struct Serving(bool);
    impl Drop for Serving {
        fn drop(&mut self) {
            let _ = SERVING.try_with(|s| s.set(self.0));
        }
    }
    let _serving = Serving(SERVING.try_with(|s| s.replace(true)).unwrap_or(false));
    BUF.with(|buf| {
        // Taken only if a fault is served on this thread inside another (never expected: the
        // asynchronous signals are blocked meanwhile); a handler thread serves that one.
        let Ok(mut buf) = buf.try_borrow_mut() else {
            serve_by_handler(shared, page);
            return;
        };
        loop {
            let t0 = Instant::now();
            // Served as a write: SIGBUS does not say, and a read would map the zero page,
            // which the next write faults again.
            match shared.serve_fault(&shared.root, page, uffd::PAGEFAULT_FLAG_WRITE, &mut buf) {
                Served::Done => {
                    shared.count_served(t0);
                    let t1 = Instant::now();
                    shared.evict_after_own_fault();
                    shared.counters.add_ns(&shared.counters.idle_evict_ns, t1);
                    return;
                }
                // An event must be read first (the handler thread does): let it.
                // SAFETY: sched_yield has no preconditions.
                Served::Retry => unsafe {
                    libc::sched_yield();
                },
            }
        }
    });
}

/// Hands a SIGBUS that is not a region's to the disposition found at installation.
fn forward(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    if crate::guard::active() {
        // The guard keeps the program's latest SIGBUS handler (it traps rt_sigaction).
        crate::guard::forward_bus(sig, info, ctx);
        return;
    }
    let Some(prev) = PREVIOUS.get() else {
        return;
    };
    match prev.sa_sigaction {
        libc::SIG_DFL | libc::SIG_IGN => {
            // The default action (a synchronous SIGBUS cannot be ignored): restore it and
            // return; the access faults again and the kernel ends the process as it would have.
            // SAFETY: a zeroed sigaction with SIG_DFL (0) is the default disposition.
            unsafe {
                let mut dfl: libc::sigaction = std::mem::zeroed();
                dfl.sa_sigaction = libc::SIG_DFL;
                libc::sigaction(libc::SIGBUS, &dfl, std::ptr::null_mut());
            }
        }
        h => call_handler(h, prev.sa_flags & libc::SA_SIGINFO != 0, sig, info, ctx),
    }
}

/// Runs a program's signal handler `h` as the kernel would have: with siginfo and context if
/// it was installed with SA_SIGINFO.
pub(crate) fn call_handler(
    h: usize,
    siginfo: bool,
    sig: libc::c_int,
    info: *mut libc::siginfo_t,
    ctx: *mut libc::c_void,
) {
    if siginfo {
        // SAFETY: the program installed this as an SA_SIGINFO handler.
        let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program installed this as a plain handler.
        let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

/// Moves the SIGBUS handler onto the threads' alternate stacks (SA_ONSTACK): the syscall guard
/// gives each program thread one of zmem's (`guard::give_thread_signal_stack`). Not done
/// without the guard: a program's own alternate stack may be too small to serve a fault on.
pub(crate) fn handle_on_alternate_stacks() -> Result<(), RegionError> {
    if PREVIOUS.get().is_none() {
        return Err(RegionError::Config(
            "the syscall guard needs the signal route's SIGBUS handler first".into(),
        ));
    }
    // SAFETY: reads the current disposition and installs the same one with SA_ONSTACK.
    unsafe {
        let mut cur: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut cur) != 0 {
            return Err(crate::error::os("sigaction(SIGBUS)"));
        }
        if cur.sa_sigaction != on_sigbus as *const () as usize {
            return Err(RegionError::Config(
                "the signal route's SIGBUS handler was replaced before the guard".into(),
            ));
        }
        cur.sa_flags |= libc::SA_ONSTACK;
        if libc::sigaction(libc::SIGBUS, &cur, std::ptr::null_mut()) != 0 {
            return Err(crate::error::os("sigaction(SIGBUS, SA_ONSTACK)"));
        }
    }
    Ok(())
}

/// The SIGBUS disposition found when the handler was installed (the guard starts its record of
/// the program's handler from it).
pub(crate) fn previous_bus() -> Option<libc::sigaction> {
    PREVIOUS.get().copied()
}

// ---------------------------------------------------------------- faults served by a handler

/// Pages whose faults wait for a handler thread (0: free), see `serve_by_handler`.
static ASSIST: [AtomicUsize; 16] = [const { AtomicUsize::new(0) }; 16];
/// Entries of `ASSIST` in use.
pub(crate) static ASSIST_PENDING: AtomicUsize = AtomicUsize::new(0);

/// Serves `page` through the region's handler thread and waits for it.
fn serve_by_handler(shared: &Arc<Shared>, page: usize) {
    let slot = loop {
        if let Some(s) = ASSIST
            .iter()
            .find(|s| s.compare_exchange(0, page, AcqRel, Relaxed).is_ok())
        {
            break s;
        }
        // SAFETY: sched_yield has no preconditions.
        unsafe { libc::sched_yield() };
    };
    ASSIST_PENDING.fetch_add(1, SeqCst);
    zmem_os::fds::eventfd_signal(shared.stop_fd);
    while slot.load(Acquire) == page {
        // SAFETY: as above.
        unsafe { libc::sched_yield() };
    }
}

/// On a handler thread: serves the pages waiting in `ASSIST` that are this region's.
pub(crate) fn serve_assists(shared: &Arc<Shared>, buf: &mut Vec<u8>) {
    if ASSIST_PENDING.load(SeqCst) == 0 {
        return;
    }
    for slot in &ASSIST {
        let page = slot.load(Acquire);
        if page == 0 || shared.root.index_of(page).is_none() {
            continue;
        }
        let t0 = Instant::now();
        if let Served::Done =
            shared.serve_fault(&shared.root, page, uffd::PAGEFAULT_FLAG_WRITE, buf)
        {
            shared.count_served(t0);
            ASSIST_PENDING.fetch_sub(1, SeqCst);
            slot.store(0, Release);
        }
    }
}
