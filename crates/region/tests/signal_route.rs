//! `FaultRoute::Signal`: faulting threads serve their own faults from a SIGBUS handler. Round
//! trips against a model from several threads, the documented EFAULT of a system call into an
//! evicted page, a SIGBUS that is not a region's (or a forked child's) reaching the program's
//! own handler.
//! One process: the program's handler is installed before any region's (as a program's would
//! be before zmem's library made its first region), once for every test here.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::Once;

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

/// A forked child's faults are not served on this route (the parent's store holds its pages):
/// the child's SIGBUS goes to the disposition found before, here the program's handler (which
/// maps a zero page); with none, the default action ends the child. Never the parent's handler
/// serving the child's address space from the parent's state.
#[test]
fn a_forked_childs_fault_goes_to_the_programs_own_handler() {
    let Some(r) = signal_region(32 * MIB, 2 * MIB) else {
        return;
    };
    fill_all(&r, 1);
    let last = r.len() / PAGE - 1;
    // SAFETY: fork in a test; the child only reads region memory and calls _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        let before = PROGRAM_SIGBUS.load(SeqCst);
        // The last page was written last (resident, copied by fork); page 0 was evicted.
        let ok_last = matches(page_mut(&r, last), last, 1);
        let zero_first = page_mut(&r, 0).iter().all(|&b| b == 0);
        let forwarded = PROGRAM_SIGBUS.load(SeqCst) == before + 1;
        let code = if !ok_last {
            3
        } else if !forwarded {
            4
        } else if !zero_first {
            5
        } else {
            0
        };
        // SAFETY: ends the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let mut status = 0;
    // SAFETY: waiting for our child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "child status {status:#x} (exit 3: a resident page was wrong; 4: the fault did not reach \
         the program's handler; 5: the program's page was not what its handler mapped)"
    );
    // The parent still has every page.
    for idx in 0..r.len() / PAGE {
        check(page_mut(&r, idx), idx, 1);
    }
}
