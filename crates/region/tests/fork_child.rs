//! Eviction in a forked child: a child that reads a heap much larger than the budget (redis's
//! BGSAVE) holds only its share of it in DRAM beyond what it shares with the parent, and still
//! sees every byte: the parent's data at the fork, then its own writes. Its own test binary:
//! the other region tests fork too, and every fork reaches every live region.

use zmem_region::PAGE;

mod support;
use support::*;

#[test]
fn a_child_reading_the_whole_heap_stays_within_its_share() {
    let budget = 2 * MIB;
    let Some(r) = region(32 * MIB, budget) else {
        return;
    };
    let pages = r.len() / PAGE;
    fill_all(&r, 7);
    assert!(r.stats().evictions as usize > pages / 2);
    let mut present = vec![0u8; pages];
    // SAFETY: the child only touches memory and calls _exit (no allocation, no locks).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = child_reads_and_writes(&r, pages, budget as usize, &mut present);
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    // Parent, meanwhile: overwrite half of the pages (evicting pages shared with the child).
    for i in (0..pages).step_by(2) {
        fill(page_mut(&r, i), i, 8);
    }
    wait_for_child(pid);
    for i in 0..pages {
        check(page_mut(&r, i), i, if i % 2 == 0 { 8 } else { 7 });
    }
    let st = r.stats();
    assert!(st.forks >= 1, "{st:?}");
    // The child faulted in ~8000 pages twice with a share of 128: nearly all were recycled.
    assert!(st.child_evictions as usize > pages, "{st:?}");
}

/// In the child: read everything (the parent's data at the fork), measuring the region pages
/// this leaves present; then write half of the pages and read all again. Exit codes name the
/// failure (no allocation here: the parent's allocator locks may be held).
fn child_reads_and_writes(
    r: &zmem_region::Region,
    pages: usize,
    budget: usize,
    present: &mut [u8],
) -> i32 {
    let Some(before) = present_bytes(r, present) else {
        return 20;
    };
    for i in 0..pages {
        if !matches(page_mut(r, i), i, 7) {
            return 10;
        }
    }
    let Some(after) = present_bytes(r, present) else {
        return 20;
    };
    // Without eviction in the child it grows by the whole evicted heap (~30 MiB); its share is
    // a quarter of the budget, plus fault-around runs mapped at once.
    if after.saturating_sub(before) > budget {
        return 12;
    }
    for i in (1..pages).step_by(2) {
        fill(page_mut(r, i), i, 9);
    }
    for round in 0..2 {
        for i in 0..pages {
            let want = if i % 2 == 1 { 9 } else { 7 };
            if !matches(page_mut(r, i), i, want) {
                return 13 + round;
            }
        }
    }
    0
}

/// Blocks until one byte arrives on `fd` (or it closes); no allocation (used in children).
fn wait_byte(fd: i32) -> bool {
    let mut b = 0u8;
    // SAFETY: reading one byte into a local.
    unsafe { libc::read(fd, (&mut b as *mut u8).cast(), 1) == 1 }
}

#[test]
fn a_child_keeps_its_data_when_the_parent_drops_the_region() {
    // A program that daemonizes: fork, then the parent goes away (here: drops the region,
    // which exit and _exit do through the preload library's hooks). Before the hand-off the
    // child's evicted pages read as zeros once the parent's descriptors closed.
    let Some(r) = region(16 * MIB, 2 * MIB) else {
        return;
    };
    let pages = r.len() / PAGE;
    fill_all(&r, 3);
    assert!(r.stats().evictions as usize > pages / 2);
    let mut go = [0i32; 2];
    // SAFETY: a pipe into a local array.
    assert_eq!(unsafe { libc::pipe(go.as_mut_ptr()) }, 0);
    // SAFETY: the child only reads a pipe, touches memory and calls _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = if !wait_byte(go[0]) {
            20
        } else if (0..pages).all(|i| matches(page_mut(&r, i), i, 3)) {
            0
        } else {
            10
        };
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    drop(r); // hands the child its pages first
             // SAFETY: writing one byte to our pipe, closing our ends.
    unsafe {
        libc::write(go[1], b"g".as_ptr().cast(), 1);
        libc::close(go[0]);
        libc::close(go[1]);
    }
    wait_for_child(pid);
}

#[test]
fn a_child_whose_parent_vanishes_is_stopped_rather_than_shown_zeros() {
    // The parent (a process of its own here) is killed with SIGKILL while its child still
    // has pages only in the parent's store: the child's thread stops the child. It must never
    // get to report what it read (zeros where its data was).
    let mut report = [0i32; 2];
    // SAFETY: a pipe into a local array.
    assert_eq!(unsafe { libc::pipe(report.as_mut_ptr()) }, 0);
    // SAFETY: the middle process builds a region and forks; it ends by SIGKILL or _exit.
    let middle = unsafe { libc::fork() };
    assert!(middle >= 0);
    if middle == 0 {
        // SAFETY: closing our copy of the read end.
        unsafe { libc::close(report[0]) };
        let Some(r) = region(8 * MIB, MIB) else {
            // SAFETY: leaving without destructors.
            unsafe { libc::_exit(0) };
        };
        let pages = r.len() / PAGE;
        fill_all(&r, 5);
        // SAFETY: as in the other tests' children.
        let child = unsafe { libc::fork() };
        if child == 0 {
            // SAFETY: getppid cannot fail; waiting for the middle process to be gone.
            let parent = unsafe { libc::getppid() };
            while unsafe { libc::getppid() } == parent {
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            let ok = (0..pages).all(|i| matches(page_mut(&r, i), i, 5));
            // SAFETY: writing one byte to the pipe, then leaving.
            unsafe {
                libc::write(report[1], if ok { b"y" } else { b"n" }.as_ptr().cast(), 1);
                libc::_exit(0);
            }
        }
        // Once the child is linked (its thread has its userfaultfd), vanish.
        let t0 = std::time::Instant::now();
        while r.stats().forks == 0 && t0.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        // SAFETY: ending this process abruptly, as a crash would.
        unsafe { libc::kill(libc::getpid(), libc::SIGKILL) };
    }
    // SAFETY: closing our copy of the write end; then reading what the grandchild says.
    unsafe { libc::close(report[1]) };
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(middle, &mut status, 0) }, middle);
    let mut said = 0u8;
    // SAFETY: one byte into a local; EOF (0) once every writer is gone.
    let n = unsafe { libc::read(report[0], (&mut said as *mut u8).cast(), 1) };
    unsafe { libc::close(report[0]) };
    if libc::WIFEXITED(status) {
        return; // no userfaultfd here: nothing was tested
    }
    assert_eq!(
        n, 0,
        "the orphan read its memory and said {:?}",
        said as char
    );
}

/// A forked child that drops pages while the parent is evicting them from it (the batch picked,
/// its move not made yet) and writes them again keeps what it wrote: the batch must not move
/// the new pages out (they would read as zeros after). The delay stands for an evictor
/// preempted between picking and asking the child's thread.
#[test]
fn a_child_page_dropped_and_written_again_during_its_eviction_keeps_its_new_content() {
    let budget = 2 * MIB;
    let Some(r) = region(32 * MIB, budget) else {
        return;
    };
    // The child's share is a quarter of the budget (128 pages); it maps a little more than
    // that, so the evictor (not its own faults) takes batches of its oldest pages.
    let touched = 176;
    fill_all(&r, 7);
    // The parent's own eviction done first: only the child's batches wait.
    std::thread::sleep(std::time::Duration::from_millis(200));
    r.delay_moves_for_tests(std::time::Duration::from_millis(300));
    // SAFETY: the child only touches memory, calls madvise, nanosleep and _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = child_drops_and_rewrites(&r, touched);
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    wait_for_child(pid);
    r.delay_moves_for_tests(std::time::Duration::ZERO);
    let st = r.stats();
    assert!(st.forks >= 1, "{st:?}");
}

/// In the child: map `touched` pages, give the evictor time to pick a batch of them, then drop
/// them all, write them again and check them once the batch is over. Exit codes name the
/// failure.
fn child_drops_and_rewrites(r: &zmem_region::Region, touched: usize) -> i32 {
    for i in 0..touched {
        if !matches(page_mut(r, i), i, 7) {
            return 10;
        }
    }
    let nap = |ms: i64| {
        let t = libc::timespec {
            tv_sec: 0,
            tv_nsec: ms * 1_000_000,
        };
        // SAFETY: a valid timespec; no remainder wanted.
        unsafe { libc::nanosleep(&t, std::ptr::null_mut()) };
    };
    nap(100);
    // SAFETY: pages of the region in this process; their content is written again below.
    if unsafe { libc::madvise(r.as_ptr().cast(), touched * PAGE, libc::MADV_DONTNEED) } != 0 {
        return 11;
    }
    for i in 0..touched {
        fill(page_mut(r, i), i, 9);
    }
    nap(500);
    for i in 0..touched {
        if !matches(page_mut(r, i), i, 9) {
            return 12;
        }
    }
    0
}

/// The hand-off (a shell that execs while its background subshell lives on) maps pages into
/// the child while the child keeps dropping memory: each madvise of a region page leaves an
/// event on the child's userfaultfd that a handler must read before the next copy goes in.
/// The hand-off held the eviction lock for all its copies, the handler (evicting for the
/// parent's own faults) waited for that lock, and the copies waited for the handler: five
/// seconds per page, for thousands of pages (CI, session 53).
#[test]
fn a_hand_off_completes_while_the_child_drops_pages_and_the_parent_faults() {
    let Some(r) = region(16 * MIB, 2 * MIB) else {
        return;
    };
    let pages = r.len() / PAGE;
    let scratch = pages - 1; // the page the child keeps dropping; the others hold data
    fill_all(&r, 3);
    assert!(r.stats().evictions as usize > pages / 2);
    // SAFETY: the child only calls madvise, clock_gettime, touches memory and calls _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = child_drops_then_reads(&r, scratch);
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    let stop = std::sync::atomic::AtomicBool::new(false);
    let handed = std::thread::scope(|s| {
        // The parent's own faults: the handler evicts for them while the hand-off runs.
        s.spawn(|| {
            let mut i = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                check(page_mut(&r, i), i, 3);
                i = (i + 1) % scratch;
            }
        });
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (tx, rx) = std::sync::mpsc::channel();
        let region = &r;
        s.spawn(move || tx.send(region.hand_off_children()));
        let handed = rx.recv_timeout(std::time::Duration::from_secs(60));
        if handed.is_err() {
            // Ends the hand-off (its copies fail once the child is gone), so the scope can end.
            // SAFETY: killing our own child.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        handed
    });
    let handed = handed.expect("the hand-off did not end within 60 s");
    wait_for_child(pid);
    assert!(handed > pages / 2, "{handed} pages handed over");
}

/// In the child: drop page `scratch` again and again for two seconds (each drop waits for the
/// parent's handler to read its event), then check every other page. No allocation.
fn child_drops_then_reads(r: &zmem_region::Region, scratch: usize) -> i32 {
    let now = || {
        let mut t = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: writing the time into a local.
        unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
        t.tv_sec as f64 + t.tv_nsec as f64 * 1e-9
    };
    let t0 = now();
    let at = r.as_ptr() as usize + scratch * PAGE;
    while now() - t0 < 2.0 {
        // SAFETY: a page of the region in this process, holding nothing we read.
        if unsafe { libc::madvise(at as *mut libc::c_void, PAGE, libc::MADV_DONTNEED) } != 0 {
            return 11;
        }
    }
    if (0..scratch).all(|i| matches(page_mut(r, i), i, 3)) {
        0
    } else {
        10
    }
}
