//! Threads zmem starts: the engine's CPU workers, a region's handlers and evictor, the store's
//! background work. An embedder that must tell zmem's own threads from the program's (the
//! preload library routes their allocations away from the program's compressed heap) installs a
//! hook that every zmem thread runs first, before it allocates anything.

use std::io;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering, Ordering::Relaxed};
use std::thread::JoinHandle;
use std::time::Duration;

static START_HOOK: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// Installs `hook`, run at the start of every thread zmem spawns from now on (one hook per
/// process; a later call replaces it).
pub fn set_start_hook(hook: fn()) {
    START_HOOK.store(hook as *mut (), Ordering::Release);
}

/// Runs the start hook, if any, on the calling thread.
pub fn run_start_hook() {
    let p = START_HOOK.load(Ordering::Acquire);
    if !p.is_null() {
        // SAFETY: only ever set from a `fn()` in set_start_hook.
        let hook: fn() = unsafe { std::mem::transmute::<*mut (), fn()>(p) };
        hook();
    }
}

static HEAP_SWITCH: AtomicPtr<()> = AtomicPtr::new(std::ptr::null_mut());

/// Installs `switch`, which makes the calling thread's allocations zmem's own (`true`) or the
/// program's (`false`) and returns the previous setting; used by [`as_zmem`].
pub fn set_heap_switch(switch: fn(bool) -> bool) {
    HEAP_SWITCH.store(switch as *mut (), Ordering::Release);
}

fn heap_switch(on: bool) -> bool {
    let p = HEAP_SWITCH.load(Ordering::Acquire);
    if p.is_null() {
        return on;
    }
    // SAFETY: only ever set from a `fn(bool) -> bool` in set_heap_switch.
    let switch: fn(bool) -> bool = unsafe { std::mem::transmute::<*mut (), fn(bool) -> bool>(p) };
    switch(on)
}

/// Runs `f`, zmem code on one of the program's threads (the fork hooks), as if on a zmem
/// thread: what it allocates (a snapshot's store, a thread's start-up data) is then read by
/// zmem's threads, and in the program's compressed heap a handler could have to fault in the
/// very page it needs itself (found as a fork that hung: the parent hook allocated on an
/// evicted heap page while the handlers were still parked for the fork).
pub fn as_zmem<T>(f: impl FnOnce() -> T) -> T {
    struct Restore(bool);
    impl Drop for Restore {
        fn drop(&mut self) {
            heap_switch(self.0);
        }
    }
    let _restore = Restore(heap_switch(true));
    f()
}

/// Stack of zmem's threads (Rust's default). Given explicitly because otherwise std reads
/// `RUST_MIN_STACK` from the environment, which a program may have moved into its heap.
pub const STACK_SIZE: usize = 2 << 20;

/// Every zmem thread's name starts with this. The start hook runs only after std's own start-up
/// of the thread, which already mallocs (a thread-local destructor's registration); the name is
/// set before that, so an embedder can tell zmem's threads by it from their first allocation on
/// ([`is_zmem_thread`]).
pub const NAME_PREFIX: &str = "zmem-";

/// Spawns a named zmem thread (`name` starts with [`NAME_PREFIX`]) that runs the start hook
/// and [`prepare_this_thread`] before `f`.
pub fn spawn<F, T>(name: String, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    spawn_named(name, true, f)
}

/// Spawns a named zmem thread in a process just forked (the fork's child hook), running the
/// start hook but not [`prepare_this_thread`] (its thread-locals are made when first used).
/// Written when zmem's locks were parking_lot's, whose table of waiting threads a fork copied
/// with whatever bucket lock a parent thread held (both `zmem-child` threads of a forked test
/// child waited in `grow_hashtable` forever); [`crate::sync`]'s locks share no table.
pub fn spawn_in_forked_child<F, T>(name: String, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    spawn_named(name, false, f)
}

fn spawn_named<F, T>(name: String, prepare: bool, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    debug_assert!(name.starts_with(NAME_PREFIX), "zmem thread named {name}");
    let builder = std::thread::Builder::new().name(name);
    // The new thread inherits the mask in force here: it starts with every asynchronous signal
    // blocked, with no window before it could block them itself.
    let _blocked = AsyncSignalsBlocked::new();
    let started =
        std::sync::Arc::new((crate::sync::Mutex::new(false), crate::sync::Condvar::new()));
    let tell = started.clone();
    let handle = builder.stack_size(STACK_SIZE).spawn(move || {
        run_start_hook();
        if prepare {
            prepare_this_thread();
        }
        *tell.0.lock() = true;
        tell.1.notify_all();
        drop(tell);
        f()
    })?;
    if prepare {
        wait_started(&started);
    }
    Ok(handle)
}

/// How long [`spawn`] waits for its thread to be through its start.
const START_WAIT: Duration = Duration::from_millis(500);

/// Waits (up to [`START_WAIT`]) until a thread [`spawn`] made is through std's start and
/// [`prepare_this_thread`]: both register thread-local destructors, which takes the dynamic
/// loader's lock. A program thread in `dlopen` holds that lock, and may wait for a fork in
/// progress (an allocation: a fork holds zmem's allocator locks); the fork waits for a fault
/// handler to read its FORK event. A handler still starting then waited for good (session 54:
/// `main_thread_exits`, the main thread's `pthread_exit` loading libgcc_s while a worker
/// forked right after zmem's lazy start, ~1 run in 200). Bounded: a thread made while the
/// caller itself holds the loader's lock (zmem started from a library's constructor) starts
/// once the caller lets it go.
fn wait_started(started: &(crate::sync::Mutex<bool>, crate::sync::Condvar)) {
    let end = std::time::Instant::now() + START_WAIT;
    let mut g = started.0.lock();
    while !*g {
        if started.1.wait_until(&mut g, end).timed_out() {
            return;
        }
    }
}

/// Functions that make a crate's per-thread state on the calling thread, run by
/// [`prepare_this_thread`]; null: free.
static PREPARERS: [AtomicPtr<()>; 16] = [const { AtomicPtr::new(std::ptr::null_mut()) }; 16];

/// Adds `f` to what [`prepare_this_thread`] runs (once; a crate calls it before it can first
/// run on a thread that needs it, e.g. when its first store or region is made).
pub fn add_thread_preparer(f: fn()) {
    let p = f as *mut ();
    for slot in &PREPARERS {
        match slot.compare_exchange(std::ptr::null_mut(), p, Ordering::AcqRel, Ordering::Acquire) {
            Ok(_) => return,
            Err(cur) if cur == p => return,
            Err(_) => {}
        }
    }
    debug_assert!(false, "more than {} thread preparers", PREPARERS.len());
}

/// Makes now, on the calling thread, every per-thread record zmem's code may need on it later:
/// each crate's thread-locals ([`add_thread_preparer`]). Making one registers a thread-local
/// destructor, for which glibc allocates with the process's `calloc`; in a program that brings
/// its own allocator (rustc exports jemalloc from its executable) that is the program's, and
/// zmem code that first made one at a bad moment (an interposed `munmap` on a program thread
/// that held the allocator's lock, a fault handler, a zmem thread while a thread waiting for
/// it held that lock) waited forever (docs/DESIGN-NOTES.md, "rustc"). Run by [`spawn`] for
/// zmem's threads and by the preload for the program's threads as they start. (zmem's locks,
/// [`crate::sync`], keep no per-thread record.)
pub fn prepare_this_thread() {
    for slot in &PREPARERS {
        let p = slot.load(Ordering::Acquire);
        if p.is_null() {
            break;
        }
        // SAFETY: only `fn()` pointers are stored (add_thread_preparer).
        let f = unsafe { std::mem::transmute::<*mut (), fn()>(p) };
        f();
    }
}

/// Every signal but the synchronous ones (a fault or a trap: SIGBUS, SIGSEGV, SIGSYS, SIGILL,
/// SIGFPE, SIGTRAP), which must stay open where they are blocked: the kernel kills instead of
/// delivering them.
pub fn asynchronous_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, filled and edited in place.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut set);
        for sync in [
            libc::SIGBUS,
            libc::SIGSYS,
            libc::SIGSEGV,
            libc::SIGILL,
            libc::SIGFPE,
            libc::SIGTRAP,
        ] {
            libc::sigdelset(&mut set, sync);
        }
        set
    }
}

/// Blocks the asynchronous signals on the calling thread until dropped (the mask before is
/// restored). zmem's threads keep them blocked for life: the kernel hands a signal sent to the
/// process (a timer's SIGALRM, SIGCHLD, a kill) to any thread that does not block it, and the
/// program's handler, run on a zmem thread, would touch the program's heap there (found: a
/// SIGALRM handler reading the evicted heap ran on the fault handler, the evictor and the
/// compressor threads, each then waiting on a lock it held itself). The synchronous signals
/// (a fault, a trap) stay open: blocked, the kernel kills instead of delivering them.
///
/// A program thread holds it while it runs zmem code that takes a lock the fault handler
/// needs: a signal delivered meanwhile writes its frame on the thread's signal stack, which
/// may be region memory (a cgo Go program's gsignal stacks are in its heap); if that page is
/// evicted, the kernel waits for the handler, and the handler for the lock (found in session
/// 44: a Go thread in `Region::populate`'s `UFFDIO_ZEROPAGE` got SIGURG; both hung for good).
pub struct AsyncSignalsBlocked(libc::sigset_t);

impl AsyncSignalsBlocked {
    pub fn new() -> AsyncSignalsBlocked {
        // SAFETY: sigset_t is plain data; the set and the old mask live on this stack, and the
        // raw rt_sigprocmask (past any interposed sigprocmask) reads and writes 8 bytes of each.
        unsafe {
            let set = asynchronous_signals();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_BLOCK,
                &set as *const libc::sigset_t,
                &mut old as *mut libc::sigset_t,
                8usize,
            );
            AsyncSignalsBlocked(old)
        }
    }
}

/// Runs the body of a thread the program's faults depend on (a fault handler, the evictor). A
/// panic there would leave every thread that faults next waiting for good (seen once: a test's
/// four threads in `handle_userfault`, the region's handler thread gone): the process is
/// stopped instead, with the reason written straight to stderr (a test harness's capture would
/// keep it from view).
pub fn or_abort<T>(what: &str, f: impl FnOnce() -> T) -> T {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(v) => v,
        Err(p) => {
            let why = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic".into());
            let msg = format!(
                "zmem: {what} failed: {why}; stopping the process (its faults would wait for \
                 good)\n"
            );
            // SAFETY: writes a buffer of this stack frame to stderr.
            unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
            std::process::abort()
        }
    }
}

/// Whether the calling thread has SIGBUS blocked: it runs inside a SIGBUS handler (the fault
/// handler of the signal route, on a program's thread). A thread made there would start with
/// SIGBUS blocked and be killed by its first fault on the heap, and `pthread_create` is not
/// async-signal-safe anyway: code that may run there leaves such work to a later caller.
pub fn sigbus_blocked() -> bool {
    // SAFETY: the raw rt_sigprocmask with no new set only reads the mask into `old`, 8 bytes.
    unsafe {
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_BLOCK,
            std::ptr::null::<libc::sigset_t>(),
            &mut old as *mut libc::sigset_t,
            8usize,
        );
        libc::sigismember(&old, libc::SIGBUS) == 1
    }
}

/// Set once a program thread of this process may take a signal frame in memory zmem must
/// fault in: an alternate signal stack in the region (a cgo Go program's gsignal stacks, a
/// Rust program's stack-overflow stacks from its mmap), seen by the preload. Sticky.
static FRAMES_MAY_FAULT: AtomicBool = AtomicBool::new(false);

/// Says that signal frames of this process may land in region memory (see
/// [`block_signals_where_frames_may_fault`]).
pub fn set_signal_frames_may_fault() {
    FRAMES_MAY_FAULT.store(true, Relaxed);
}

/// [`AsyncSignalsBlocked`] where a signal frame on the calling thread may land in `region`
/// (`[start, end)`): its stack pointer is there (a coroutine or a thread on a heap stack), or
/// the process has alternate stacks there ([`set_signal_frames_may_fault`]). Elsewhere
/// nothing: two `rt_sigprocmask` calls cost ~1.2 µs here, which a free of a large block (the
/// region's `drop_stored`) would pay four times over.
pub fn block_signals_where_frames_may_fault(
    start: usize,
    end: usize,
) -> Option<AsyncSignalsBlocked> {
    let here = 0u8;
    let sp = std::ptr::addr_of!(here) as usize;
    (FRAMES_MAY_FAULT.load(Relaxed) || (start..end).contains(&sp)).then(AsyncSignalsBlocked::new)
}

impl Default for AsyncSignalsBlocked {
    fn default() -> AsyncSignalsBlocked {
        AsyncSignalsBlocked::new()
    }
}

impl Drop for AsyncSignalsBlocked {
    fn drop(&mut self) {
        // SAFETY: as above, restoring the mask saved by `new`.
        unsafe {
            libc::syscall(
                libc::SYS_rt_sigprocmask,
                libc::SIG_SETMASK,
                &self.0 as *const libc::sigset_t,
                std::ptr::null_mut::<libc::sigset_t>(),
                8usize,
            )
        };
    }
}

/// Whether the calling thread is one zmem spawned: not the process's first thread, and named
/// with [`NAME_PREFIX`]. Two system calls, no allocation: meant to be asked once per thread.
pub fn is_zmem_thread() -> bool {
    // SAFETY: gettid and getpid have no preconditions.
    let main = unsafe { libc::gettid() == libc::getpid() };
    let mut name = [0u8; 16];
    !main && thread_name(&mut name) && name.starts_with(NAME_PREFIX.as_bytes())
}

/// Buffers for [`thread_name`] outside any thread's stack, each taken by one caller at a time.
static NAME_BUFS: [NameBuf; 16] = [const { NameBuf::new() }; 16];

struct NameBuf {
    busy: std::sync::atomic::AtomicBool,
    bytes: std::cell::UnsafeCell<[u8; 16]>,
}

// SAFETY: `bytes` is only touched by the caller that set `busy`.
unsafe impl Sync for NameBuf {}

impl NameBuf {
    const fn new() -> NameBuf {
        NameBuf {
            busy: std::sync::atomic::AtomicBool::new(false),
            bytes: std::cell::UnsafeCell::new([0; 16]),
        }
    }
}

/// The calling thread's name (PR_GET_NAME) into `out`; false if the kernel refused. The kernel
/// writes a static buffer, not the caller's stack: a thread whose stack is in a guarded region
/// (`pthread_attr_setstack` on heap memory, on the signal route) would have the call trapped by
/// the syscall guard, whose handler asks this again: trapped forever. Lock-free (a buffer is
/// claimed with a compare-exchange), so a signal handler may ask it too; with every buffer in
/// use, the stack is used.
fn thread_name(out: &mut [u8; 16]) -> bool {
    use std::sync::atomic::Ordering::{Acquire, Release};
    let slot = NAME_BUFS.iter().find(|b| {
        b.busy
            .compare_exchange(false, true, Acquire, Acquire)
            .is_ok()
    });
    let buf = match slot {
        Some(b) => b.bytes.get().cast::<u8>(),
        None => out.as_mut_ptr(),
    };
    // SAFETY: PR_GET_NAME writes at most 16 bytes (the name and its NUL) into `buf`, which is
    // this caller's alone. Through syscall(2) with every argument given: the variadic prctl(3)
    // would pass whatever its unused argument registers hold, which a seccomp filter checking
    // them (the signal route's syscall guard) may take for pointers.
    let r = unsafe {
        libc::syscall(
            libc::SYS_prctl,
            libc::PR_GET_NAME,
            buf,
            0usize,
            0usize,
            0usize,
        )
    };
    if let Some(b) = slot {
        // SAFETY: claimed above; copied out before it is released.
        *out = unsafe { *b.bytes.get() };
        b.busy.store(false, Release);
    }
    r == 0
}

/// CPUs this thread may run on (its affinity mask); 1 if the kernel will not say. No file is
/// read and nothing is allocated (unlike `std::thread::available_parallelism`), so it is safe
/// while a program's start-up is still being prepared.
pub fn cpus_available() -> usize {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the kernel fills it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is valid for its size.
    let r = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if r != 0 {
        return 1;
    }
    // SAFETY: a set the kernel filled.
    (unsafe { libc::CPU_COUNT(&set) } as usize).max(1)
}

/// The ids of the process's threads, from /proc/self/task read with `getdents64`. Not
/// `opendir`: it mallocs, and in a program that exports its own allocator (rustc exports
/// jemalloc) that is the program's malloc, whose lock a thread waiting for a fault may hold,
/// so a zmem thread calling it waited forever (docs/DESIGN-NOTES.md, "rustc").
pub fn task_ids() -> Vec<libc::pid_t> {
    // SAFETY: a constant NUL-terminated path; the descriptor is closed below.
    let fd = unsafe {
        libc::open(
            c"/proc/self/task".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Vec::new();
    }
    let mut ids = Vec::new();
    // Records are 8-byte aligned: struct linux_dirent64 { u64 ino; i64 off; u16 reclen;
    // u8 type; char name[]; }.
    let mut buf = [0u64; 512];
    loop {
        // SAFETY: the kernel writes at most the buffer's size into it.
        let n = unsafe {
            libc::syscall(
                libc::SYS_getdents64,
                fd,
                buf.as_mut_ptr(),
                std::mem::size_of_val(&buf),
            )
        };
        if n <= 0 {
            break;
        }
        // SAFETY: the kernel filled the first n bytes.
        let bytes = unsafe { std::slice::from_raw_parts(buf.as_ptr().cast::<u8>(), n as usize) };
        let mut at = 0;
        while at + 19 <= bytes.len() {
            let len = u16::from_ne_bytes([bytes[at + 16], bytes[at + 17]]) as usize;
            if len < 19 || at + len > bytes.len() {
                break;
            }
            let name = &bytes[at + 19..at + len];
            let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
            if let Some(id) = std::str::from_utf8(name).ok().and_then(|s| s.parse().ok()) {
                ids.push(id);
            }
            at += len;
        }
    }
    // SAFETY: fd was opened above and is not used after this.
    unsafe { libc::close(fd) };
    ids
}

/// The process's threads other than the caller that still run the program's code: alive (not a
/// zombie, a thread group leader that called `pthread_exit` stays one until the process ends)
/// and not zmem's (named with [`NAME_PREFIX`]). From `/proc/self/task/TID/stat`, whose second
/// field is the thread's name and third its state; a thread that ended between the listing and
/// the read is not counted.
pub fn other_program_threads() -> usize {
    // SAFETY: gettid cannot fail.
    let me = unsafe { libc::gettid() };
    task_ids()
        .into_iter()
        .filter(|&tid| tid != me && runs_program_code(tid))
        .count()
}

/// Whether thread `tid` of this process is alive and not zmem's (see [`other_program_threads`]).
fn runs_program_code(tid: libc::pid_t) -> bool {
    match task_stat(tid) {
        Some((name, state)) => {
            !matches!(state, b'Z' | b'X' | b'x') && !name.starts_with(NAME_PREFIX.as_bytes())
        }
        None => false,
    }
}

/// A thread's name and state letter, from its stat file; None if it is gone.
fn task_stat(tid: libc::pid_t) -> Option<(Vec<u8>, u8)> {
    let stat = std::fs::read(format!("/proc/self/task/{tid}/stat")).ok()?;
    // "tid (name) S ...": the name may itself hold ')' and spaces; the state follows the last ')'.
    let open = stat.iter().position(|&b| b == b'(')?;
    let close = stat.iter().rposition(|&b| b == b')')?;
    let state = *stat.get(close + 2)?;
    Some((stat.get(open + 1..close)?.to_vec(), state))
}

#[cfg(test)]
mod tests {
    /// Names of the threads the test preparer below ran on.
    static PREPARED: crate::sync::Mutex<Vec<String>> = crate::sync::Mutex::new(Vec::new());

    fn record_prepared() {
        let name = std::thread::current().name().unwrap_or("").to_string();
        // Slow on purpose: `spawn` must wait for it.
        std::thread::sleep(std::time::Duration::from_millis(20));
        PREPARED.lock().push(name);
    }

    #[test]
    fn spawn_returns_once_the_thread_is_prepared() {
        super::add_thread_preparer(record_prepared);
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let t = super::spawn("zmem-start-test".into(), move || rx.recv().is_err()).unwrap();
        assert!(
            PREPARED.lock().iter().any(|n| n == "zmem-start-test"),
            "spawn returned before the new thread ran its preparers"
        );
        drop(tx);
        assert!(t.join().unwrap());
    }

    /// Whether SIGUSR1 is blocked on the calling thread now.
    fn usr1_blocked() -> bool {
        // SAFETY: reads the calling thread's mask into a local set.
        unsafe {
            let mut now: libc::sigset_t = std::mem::zeroed();
            libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut now);
            libc::sigismember(&now, libc::SIGUSR1) == 1
        }
    }

    #[test]
    fn signals_wait_where_a_frame_could_land_in_the_range() {
        std::thread::spawn(|| {
            assert!(!usr1_blocked());
            // A range holding this thread's stack: blocked while the guard lives, then not.
            let here = 0u8;
            let sp = std::ptr::addr_of!(here) as usize;
            let g = super::block_signals_where_frames_may_fault(sp - 4096, sp + 4096);
            assert!(g.is_some() && usr1_blocked());
            // The synchronous signals stay open.
            // SAFETY: reads the calling thread's mask into a local set.
            let bus_open = unsafe {
                let mut now: libc::sigset_t = std::mem::zeroed();
                libc::pthread_sigmask(libc::SIG_BLOCK, std::ptr::null(), &mut now);
                libc::sigismember(&now, libc::SIGBUS) == 0
            };
            assert!(bus_open);
            drop(g);
            assert!(!usr1_blocked());
            // Once frames may fault anywhere in the process: any range.
            super::set_signal_frames_may_fault();
            let g = super::block_signals_where_frames_may_fault(1 << 20, 2 << 20);
            assert!(g.is_some() && usr1_blocked());
            drop(g);
            assert!(!usr1_blocked());
        })
        .join()
        .unwrap();
    }

    #[test]
    fn cpus_available_agrees_with_std() {
        let n = super::cpus_available();
        assert!(n >= 1);
        if let Ok(std_n) = std::thread::available_parallelism() {
            // std also applies cgroup quotas, which can only lower its figure.
            assert!(std_n.get() <= n, "std {std_n} > affinity {n}");
        }
    }

    use std::sync::atomic::{AtomicUsize, Ordering};

    static RAN: AtomicUsize = AtomicUsize::new(0);
    fn count() {
        RAN.fetch_add(1, Ordering::SeqCst);
    }

    #[test]
    fn zmem_threads_are_known_by_their_name() {
        assert!(!super::is_zmem_thread(), "a test thread is not zmem's");
        let t = super::spawn("zmem-test".into(), super::is_zmem_thread).unwrap();
        assert!(t.join().unwrap());
        let other = std::thread::Builder::new().name("zmemx".into());
        assert!(!other.spawn(super::is_zmem_thread).unwrap().join().unwrap());
    }

    thread_local! {
        static ZMEM_HEAP: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }
    fn switch(on: bool) -> bool {
        ZMEM_HEAP.with(|c| c.replace(on))
    }

    thread_local! {
        static PREPARED_HERE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    }
    fn mark_prepared() {
        PREPARED_HERE.with(|c| c.set(c.get() + 1));
    }

    #[test]
    fn a_preparer_is_kept_once_and_runs_on_every_zmem_thread() {
        super::add_thread_preparer(mark_prepared);
        super::add_thread_preparer(mark_prepared); // the same one again: kept once
        let kept = super::PREPARERS
            .iter()
            .filter(|s| s.load(std::sync::atomic::Ordering::Acquire) == mark_prepared as *mut ())
            .count();
        assert_eq!(kept, 1);
        let here = PREPARED_HERE.with(|c| c.get());
        super::prepare_this_thread();
        assert_eq!(PREPARED_HERE.with(|c| c.get()), here + 1);
        let there = super::spawn("zmem-test-prep".into(), || PREPARED_HERE.with(|c| c.get()))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(
            there, 1,
            "the spawned thread was not prepared (once) before its body"
        );
    }

    #[test]
    fn task_ids_lists_every_thread_of_the_process() {
        let (tx, rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let t = std::thread::spawn(move || {
            // SAFETY: gettid cannot fail.
            tx.send(unsafe { libc::gettid() }).unwrap();
            let _ = stop_rx.recv();
        });
        let other = rx.recv().unwrap();
        let ids = super::task_ids();
        // SAFETY: gettid and getpid cannot fail.
        let (me, pid) = unsafe { (libc::gettid(), libc::getpid()) };
        assert!(ids.contains(&me), "{ids:?} lacks this thread {me}");
        assert!(
            ids.contains(&other),
            "{ids:?} lacks the spawned thread {other}"
        );
        assert!(ids.contains(&pid), "{ids:?} lacks the main thread {pid}");
        let listed = std::fs::read_dir("/proc/self/task").unwrap().count();
        assert_eq!(ids.len(), listed, "{ids:?}");
        drop(stop_tx);
        t.join().unwrap();
    }

    #[test]
    fn program_threads_are_told_from_zmem_threads_and_ended_ones() {
        let tid_of = |name: Option<&str>| {
            let (tx, rx) = std::sync::mpsc::channel();
            let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
            let mut b = std::thread::Builder::new();
            if let Some(n) = name {
                b = b.name(n.into());
            }
            let t = b
                .spawn(move || {
                    // SAFETY: gettid cannot fail.
                    tx.send(unsafe { libc::gettid() }).unwrap();
                    let _ = stop_rx.recv();
                })
                .unwrap();
            (rx.recv().unwrap(), stop_tx, t)
        };
        let (program, stop_p, tp) = tid_of(Some("worker-1"));
        let (zmem, stop_z, tz) = tid_of(Some("zmem-test"));
        assert!(super::runs_program_code(program));
        assert!(!super::runs_program_code(zmem));
        // The caller is never among the others; the program thread is.
        assert!(super::other_program_threads() >= 1);
        drop((stop_p, stop_z));
        tp.join().unwrap();
        tz.join().unwrap();
        // Joined: its task is gone, once the kernel is through its exit (join returns when
        // the thread's tid word is cleared, a moment before; seen under load beside the other
        // tests' threads).
        let t0 = std::time::Instant::now();
        while super::task_stat(program).is_some() && t0.elapsed().as_secs() < 5 {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(!super::runs_program_code(program));
        assert_eq!(super::task_stat(program), None);
    }

    #[test]
    fn as_zmem_switches_the_heap_for_its_call_only() {
        super::set_heap_switch(switch);
        let inside = super::as_zmem(|| {
            let nested = super::as_zmem(|| ZMEM_HEAP.with(|c| c.get()));
            (ZMEM_HEAP.with(|c| c.get()), nested)
        });
        assert_eq!(inside, (true, true));
        assert!(!ZMEM_HEAP.with(|c| c.get()), "restored after the call");
        let unwound = std::panic::catch_unwind(|| super::as_zmem(|| panic!("in f")));
        assert!(unwound.is_err());
        assert!(!ZMEM_HEAP.with(|c| c.get()), "restored after a panic");
    }

    #[test]
    fn hook_runs_on_spawned_threads_before_the_body() {
        super::set_start_hook(count);
        let before = RAN.load(Ordering::SeqCst);
        let seen = super::spawn("zmem-test".into(), || RAN.load(Ordering::SeqCst))
            .unwrap()
            .join()
            .unwrap();
        assert!(seen > before, "the hook ran before the thread's body");
    }
}
