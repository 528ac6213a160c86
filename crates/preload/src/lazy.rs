//! Starting late in a process the run's program execs. A shell's commands, a build's compiler
//! driver and assembler are processes of a few milliseconds and a small heap, and zmem's start
//! (a region, its threads, the stats socket, the exit report: ~1.5 ms, docs/DESIGN-NOTES.md,
//! "What a process start costs") was most of what `make` or a shell script paid under zmem.
//! Such a process now runs on glibc's malloc until its heap and its own anonymous mappings
//! reach the start point (`ZMEM_START_AT`; 0: at once), then zmem starts as it would have at
//! its first allocation; blocks glibc gave before stay glibc's (free and realloc take either).
//! It also starts before the program's first thread, so that every program thread is made
//! after the start, as zmem's per-thread preparation needs. The run's own process (the one
//! `zmem run` became) always starts at once: it reports the run.

use std::sync::atomic::{AtomicIsize, AtomicUsize, Ordering::Relaxed};

/// The start point in bytes (0 before the process is lazy).
static POINT: AtomicUsize = AtomicUsize::new(0);

/// Bytes asked of malloc since the footprint was last looked at.
static ASKED: AtomicUsize = AtomicUsize::new(0);

/// Bytes of private anonymous mappings the program made itself while lazy (less those it
/// unmapped; unmapping something else can take it below zero, counted as zero).
static MAPPED: AtomicIsize = AtomicIsize::new(0);

/// How many bytes asked of malloc between two looks at the footprint (`mallinfo2` walks the
/// allocator's bins, so not on every call).
const LOOK_EVERY: usize = 256 << 10;

/// Where this process starts zmem: Some(bytes) for a process the run's program exec'd (with a
/// start point set or by default), None to start now (the run's own process, a start point of
/// 0, a program preloaded without `zmem run`, or settings that do not parse: the start then
/// says what is wrong with them). Allocates: the caller has switched to the internal heap.
pub fn start_point() -> Option<usize> {
    let config = zmem_runenv::RunConfig::from_vars(|k| std::env::var(k).ok()).ok()?;
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    match config.run_pid {
        Some(run) if run != pid => {}
        _ => return None,
    }
    let at = usize::try_from(config.start_at()).unwrap_or(usize::MAX);
    (at > 0).then_some(at)
}

/// This process is lazy until its footprint reaches `at` bytes.
pub fn set_point(at: usize) {
    POINT.store(at, Relaxed);
}

/// The program asks malloc (or realloc) for `bytes` while zmem has not started; a block that
/// would take the footprint past the start point starts zmem first, so that it is made in the
/// region.
#[inline]
pub fn asked(bytes: usize) {
    let total = ASKED.fetch_add(bytes, Relaxed).saturating_add(bytes);
    if total >= LOOK_EVERY {
        ASKED.store(0, Relaxed);
        look(bytes);
    }
}

/// The program maps (`bytes` > 0) or unmaps private anonymous memory while zmem has not
/// started; a mapping that would take the footprint past the start point starts zmem first,
/// so that it is made in the region.
pub fn mapped(bytes: isize) {
    if bytes > 0 {
        look(bytes as usize);
    }
    MAPPED.fetch_add(bytes, Relaxed);
}

/// Starts zmem if the footprint (glibc's blocks in use and the program's own mappings) with
/// `coming` more bytes reaches the start point.
fn look(coming: usize) {
    // SAFETY: mallinfo2 only reads the allocator's state (under its locks).
    let mi = unsafe { libc::mallinfo2() };
    let footprint = mi
        .uordblks
        .saturating_add(mi.hblkhd)
        .saturating_add(MAPPED.load(Relaxed).max(0) as usize)
        .saturating_add(coming);
    // Never in a vfork child: it runs in its parent's memory until it execs or exits, and a
    // region made there would be the parent's.
    // SAFETY: getpid and getppid cannot fail.
    let vfork_child =
        || unsafe { zmem_os::remote::same_address_space(libc::getpid(), libc::getppid()) };
    if footprint >= POINT.load(Relaxed) && !vfork_child() {
        crate::runtime::start();
    }
}
