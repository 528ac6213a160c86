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
//! - a forked child's faults are not served: its SIGBUS goes to the disposition found before
//!   (by default it ends the child), never served from the parent's state;
//! - a program that replaces the SIGBUS handler afterwards takes the faults away from it.
//!
//! The handler route keeps serving everything else: the region's events (remove, unmap,
//! remap, fork) still go to its handler thread, and eviction is unchanged.

use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering::*};
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
}

#[allow(clippy::declare_interior_mutable_const)] // only to build the array below
const EMPTY: Slot = Slot {
    start: AtomicUsize::new(0),
    end: AtomicUsize::new(0),
    shared: AtomicPtr::new(std::ptr::null_mut()),
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
            // where a blocked synchronous SIGBUS would kill the process. No SA_ONSTACK: serving
            // may compress (eviction), more stack than an alternate stack usually has.
            new.sa_flags = libc::SA_SIGINFO | libc::SA_NODEFER | libc::SA_RESTART;
            libc::sigemptyset(&mut new.sa_mask);
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

/// The region whose range holds `addr`, if any.
fn find(addr: usize) -> Option<&'static Arc<Shared>> {
    SLOTS_IN_USE.iter().find_map(|slot| {
        let p = slot.shared.load(Acquire);
        if p.is_null() {
            return None;
        }
        let (start, end) = (slot.start.load(Acquire), slot.end.load(Acquire));
        // SAFETY: listed, hence alive until `Listed::drop`, which runs only once no thread
        // may touch the region.
        (addr >= start && addr < end).then(|| unsafe { &*p })
    })
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let (code, addr) = unsafe { ((*info).si_code, (*info).si_addr() as usize) };
    // A missing page of a region is BUS_ADRERR; a poisoned page (corrupt data) is not ours to
    // serve, nor is a fault in a forked child (the parent's store has its pages).
    let ours = (code == libc::BUS_ADRERR)
        .then(|| find(addr))
        .flatten()
        // SAFETY: getpid cannot fail.
        .filter(|s| s.creator_pid == unsafe { libc::getpid() } as u32);
    let Some(shared) = ours else {
        forward(sig, info, ctx);
        return;
    };
    // An unwinding panic must not leave a signal handler: abort instead.
    let served = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        serve(shared, addr & !(PAGE - 1))
    }));
    if served.is_err() {
        std::process::abort();
    }
}

fn serve(shared: &Arc<Shared>, page: usize) {
    SERVED.with(|c| c.set(c.get() + 1));
    BUF.with(|buf| {
        let mut buf = buf.borrow_mut();
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
        h if prev.sa_flags & libc::SA_SIGINFO != 0 => {
            // SAFETY: the program installed this as an SA_SIGINFO handler.
            let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                unsafe { std::mem::transmute(h) };
            f(sig, info, ctx);
        }
        h => {
            // SAFETY: the program installed this as a plain handler.
            let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(h) };
            f(sig);
        }
    }
}
