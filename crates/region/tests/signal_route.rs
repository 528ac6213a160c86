//! `FaultRoute::Signal`: faulting threads serve their own faults from a SIGBUS handler. Round
//! trips against a model from several threads, the documented EFAULT of a system call into an
//! evicted page, a SIGBUS that is not a region's reaching the program's own handler, forked
//! children and grandchildren (and a raw-forked child) served by the creator.
//! One process: the program's handler is installed before any region's (as a program's would
//! be before zmem's library made its first region), once for every test here.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Once;
use std::time::Duration;

use support::*;
use zmem_region::{Budget, FaultRoute, Region, RegionConfig, PAGE};

/// Faults the program's own handler saw, and the address it mapped a page at.
static PROGRAM_SIGBUS: AtomicUsize = AtomicUsize::new(0);
static PROGRAM_HANDLER: Once = Once::new();

/// The program's SIGBUS handler: maps a zero page where the access failed (a file read past
/// its end), so that the access succeeds when it runs again.
extern "C" fn program_handler(_: libc::c_int, info: *mut libc::siginfo_t, _: *mut libc::c_void) {
    PROGRAM_SIGBUS.fetch_add(1, SeqCst);
    // SAFETY: the kernel's siginfo; mapping one anonymous page over the file page.
    unsafe {
        let page = (*info).si_addr() as usize & !(PAGE - 1);
        libc::mmap(
            page as *mut _,
            PAGE,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        );
    }
}

fn signal_region(size: u64, budget: u64) -> Option<Region> {
    PROGRAM_HANDLER.call_once(|| {
        // SAFETY: installing a plain SA_SIGINFO handler.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = program_handler as *const () as usize;
            sa.sa_flags = libc::SA_SIGINFO;
            assert_eq!(libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()), 0);
        }
    });
    let mut cfg = RegionConfig::new(size, Budget::Fixed(budget));
    cfg.fault_route = FaultRoute::Signal;
    region_with(cfg)
}

#[test]
fn threads_serve_their_own_faults_and_every_page_comes_back() {
    let Some(r) = signal_region(64 * MIB, 4 * MIB) else {
        return;
    };
    let pages = r.len() / PAGE;
    fill_all(&r, 1);
    // Four threads, each rewriting and checking its own quarter in a scattered order, twice.
    let base = r.as_ptr() as usize;
    let served: Vec<u64> = std::thread::scope(|s| {
        let threads: Vec<_> = (0..4)
            .map(|t| {
                s.spawn(move || {
                    let quarter = pages / 4;
                    for version in [2u64, 3] {
                        for k in 0..quarter {
                            let idx = t * quarter + (k * 7919) % quarter;
                            // SAFETY: page idx of the live region; this thread alone writes it.
                            let page = unsafe {
                                std::slice::from_raw_parts_mut((base + idx * PAGE) as *mut u8, PAGE)
                            };
                            check(page, idx, version - 1);
                            fill(page, idx, version);
                        }
                    }
                    zmem_region::signal_faults_on_this_thread()
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    assert!(
        served.iter().all(|&n| n > 0),
        "each thread served faults: {served:?}"
    );
    for idx in 0..pages {
        check(page_mut(&r, idx), idx, 3);
    }
    let st = r.stats();
    assert!(st.major_faults > pages as u64, "faults were served: {st:?}");
    // Four threads make room and map at once: each may add a fault-around run (16 pages).
    let slack = 4 * 16 * PAGE as u64;
    assert!(
        st.resident <= st.budget + slack,
        "within the budget: {st:?}"
    );
}

#[test]
fn a_system_call_into_an_evicted_page_fails_with_efault() {
    let Some(r) = signal_region(32 * MIB, 2 * MIB) else {
        return;
    };
    fill_all(&r, 1);
    // Page 0 was evicted long ago (2 MiB resident after writing 32). The kernel's own access
    // to it cannot raise SIGBUS in user mode: write(2) fails, as the route documents.
    let mut fds = [0; 2];
    // SAFETY: a pipe for this test.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    let (rd, wr) = (fds[0], fds[1]);
    // SAFETY: the region's first page, valid (if not present) while `r` lives.
    let n = unsafe { libc::write(wr, r.as_ptr().cast(), 64) };
    let err = std::io::Error::last_os_error();
    assert_eq!(n, -1, "a write from an evicted page of a signal region");
    assert_eq!(err.raw_os_error(), Some(libc::EFAULT), "{err}");
    // A user-mode touch brings it back; then the same write works.
    check(page_mut(&r, 0), 0, 1);
    // SAFETY: as above, the page is present now.
    assert_eq!(unsafe { libc::write(wr, r.as_ptr().cast(), 64) }, 64);
    // SAFETY: closing the pipe.
    unsafe {
        libc::close(rd);
        libc::close(wr);
    }
}

#[test]
fn a_sigbus_that_is_not_a_regions_reaches_the_programs_handler() {
    let Some(r) = signal_region(16 * MIB, 2 * MIB) else {
        return;
    };
    fill_all(&r, 1);
    // A file mapping read past the file's end: SIGBUS (BUS_ADRERR) outside every region.
    let file = std::env::temp_dir().join(format!("zmem-sigbus-{}", std::process::id()));
    std::fs::write(&file, b"").unwrap();
    let f = std::fs::File::open(&file).unwrap();
    // SAFETY: a shared read mapping of an empty file; touching it faults.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            PAGE,
            libc::PROT_READ,
            libc::MAP_PRIVATE,
            std::os::fd::AsRawFd::as_raw_fd(&f),
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    let before = PROGRAM_SIGBUS.load(SeqCst);
    // SAFETY: the mapping above; the program's handler maps a page there.
    let v = unsafe { std::ptr::read_volatile(p as *const u8) };
    assert_eq!(v, 0);
    assert_eq!(
        PROGRAM_SIGBUS.load(SeqCst),
        before + 1,
        "the program's handler ran"
    );
    // The region's own faults still never reach it.
    for idx in 0..r.len() / PAGE {
        check(page_mut(&r, idx), idx, 1);
    }
    assert_eq!(PROGRAM_SIGBUS.load(SeqCst), before + 1);
    // SAFETY: our mapping.
    unsafe { libc::munmap(p, PAGE) };
    let _ = std::fs::remove_file(&file);
}

/// A forked child's faults raise SIGBUS in the child, whose memory the creator's snapshot
/// describes: the child asks the creator over its link and is served (`forked`). The child
/// reads the whole heap (evicted at the fork) within its share of DRAM, writes its own
/// version, forks a grandchild through glibc (which asks on the same link) that sees the
/// child's data and writes its own; each process keeps its own bytes, and no fault reaches the
/// program's handler. Exit codes name the failure; nothing in a child allocates.
#[test]
fn forked_children_and_grandchildren_are_served_by_the_creator() {
    let budget = 2 * MIB;
    let Some(r) = signal_region(32 * MIB, budget) else {
        return;
    };
    let pages = r.len() / PAGE;
    fill_all(&r, 1);
    // The child counts its present region pages into this (made here: it allocates nothing).
    let mut present = vec![0u8; pages];
    // SAFETY: fork in a test; the child touches memory, forks and calls _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let code = child_and_grandchild(&r, pages, budget as usize, &mut present);
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    // The parent, meanwhile: every even page gets a version of its own.
    for idx in (0..pages).step_by(2) {
        fill(page_mut(&r, idx), idx, 8);
    }
    let status = wait_or_kill(pid, Duration::from_secs(120));
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x} (exit 10/11: the child read wrong data before/after its \
         writes; 12: it grew past its share; 13: a fault reached the program's handler; 20/21: \
         the grandchild read wrong data before/after its writes; 22: the grandchild died; 23: \
         the grandchild's writes showed in the child)"
    );
    for idx in 0..pages {
        check(page_mut(&r, idx), idx, if idx % 2 == 0 { 8 } else { 1 });
    }
    let st = r.stats();
    assert!(st.forks >= 2, "the child's fork was not served: {st:?}");
    assert!(
        st.child_evictions > 0,
        "the child was never evicted: {st:?}"
    );
}

fn child_and_grandchild(r: &Region, pages: usize, budget: usize, present: &mut [u8]) -> i32 {
    let before = PROGRAM_SIGBUS.load(SeqCst);
    let Some(rss0) = present_bytes(r, present) else {
        return 30;
    };
    for idx in 0..pages {
        if !matches(page_mut(r, idx), idx, 1) {
            return 10;
        }
    }
    let Some(rss1) = present_bytes(r, present) else {
        return 30;
    };
    // Past its share, the child's pages leave it (through its own thread): it does not grow
    // by the ~30 MiB it read.
    if rss1.saturating_sub(rss0) > budget {
        return 12;
    }
    for idx in (1..pages).step_by(2) {
        fill(page_mut(r, idx), idx, 9);
    }
    for idx in 0..pages {
        if !matches(page_mut(r, idx), idx, if idx % 2 == 1 { 9 } else { 1 }) {
            return 11;
        }
    }
    // SAFETY: glibc's fork (the hooks run); the grandchild only touches memory and exits.
    let g = unsafe { libc::fork() };
    if g == 0 {
        let mut code = 0;
        for idx in 0..pages {
            if !matches(page_mut(r, idx), idx, if idx % 2 == 1 { 9 } else { 1 }) {
                code = 20;
                break;
            }
        }
        for idx in (0..pages).step_by(3) {
            fill(page_mut(r, idx), idx, 11);
        }
        for idx in (0..pages).step_by(3) {
            if code == 0 && !matches(page_mut(r, idx), idx, 11) {
                code = 21;
            }
        }
        // SAFETY: ends the grandchild.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    if g < 0 || unsafe { libc::waitpid(g, &mut status, 0) } != g || !libc::WIFEXITED(status) {
        return 22;
    }
    if libc::WEXITSTATUS(status) != 0 {
        return libc::WEXITSTATUS(status);
    }
    for idx in 0..pages {
        if !matches(page_mut(r, idx), idx, if idx % 2 == 1 { 9 } else { 1 }) {
            return 23;
        }
    }
    if PROGRAM_SIGBUS.load(SeqCst) != before {
        return 13;
    }
    0
}

/// A process forked by a raw system call (no fork hooks) asks on the link the creator keeps
/// for such children, which it inherited: served like a hooked child, never from another
/// process's state, and its fault never reaches the program's handler.
#[test]
fn a_raw_forked_child_is_served_through_the_creators_link() {
    let Some(r) = signal_region(32 * MIB, 2 * MIB) else {
        return;
    };
    fill_all(&r, 1);
    raw_fork_reads_and_writes(&r);
}

/// A raw fork whose FORK event takes the links a glibc fork's hook made (a glibc fork in
/// another thread at the same moment): its space then has a link whose other end is gone,
/// while the child asks on the creator's link for raw forks. Nobody read that link: the child
/// waited for an answer forever (found beside `forked_children_and_grandchildren...`).
#[test]
fn a_raw_fork_that_takes_a_glibc_forks_links_is_still_served() {
    let Some(r) = signal_region(32 * MIB, 2 * MIB) else {
        return;
    };
    fill_all(&r, 1);
    r.leave_a_glibc_forks_links_for_tests();
    raw_fork_reads_and_writes(&r);
}

/// Forks with the raw system call (no hooks); the child checks every fifth page and the last
/// (page 0 was evicted at the fork, the last resident), writes its own version over them and
/// exits; then the parent checks that it kept every page.
fn raw_fork_reads_and_writes(r: &Region) {
    let pages = r.len() / PAGE;
    // SAFETY: a raw fork in a test; the child only touches region memory and calls _exit.
    let pid = unsafe { libc::syscall(libc::SYS_fork) } as libc::pid_t;
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let before = PROGRAM_SIGBUS.load(SeqCst);
        let mut code = 0;
        for idx in (0..pages).step_by(5).chain([pages - 1]) {
            if !matches(page_mut(r, idx), idx, 1) {
                code = 3;
                break;
            }
            fill(page_mut(r, idx), idx, 2);
        }
        if code == 0 && PROGRAM_SIGBUS.load(SeqCst) != before {
            code = 4;
        }
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let status = wait_or_kill(pid, Duration::from_secs(60));
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x} (exit 3: the child read wrong data; 4: its fault reached the \
         program's handler; SIGKILL: it hung and was killed)"
    );
    // The parent still has every page (the child's writes were its own).
    for idx in 0..pages {
        check(page_mut(r, idx), idx, 1);
    }
}

/// The child's wait status; a child still running after `limit` is killed (its status then
/// says SIGKILL), so that a hang fails the test instead of stopping the run.
fn wait_or_kill(pid: libc::pid_t, limit: Duration) -> i32 {
    let start = std::time::Instant::now();
    let mut status = 0;
    loop {
        // SAFETY: waiting for our child without blocking.
        let got = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if got == pid {
            return status;
        }
        assert_eq!(got, 0, "waitpid: {}", std::io::Error::last_os_error());
        if start.elapsed() > limit {
            // SAFETY: our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
