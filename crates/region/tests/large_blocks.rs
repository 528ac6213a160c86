//! Large blocks. `Region::move_pages`: a buffer given to another address (a program's
//! `realloc`) keeps every byte, whatever state each page was in, moves resident and stored
//! pages instead of copying them, and leaves the old range reading as zeros. `zero_pages`
//! (`calloc`): a reused block reads as zeros, its stored pages dropped unread. Each test skips
//! (with the reason) where /dev/userfaultfd cannot be opened.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use zmem_region::{Budget, Region, RegionConfig, RegionError, RegionStats, PAGE};

mod support;
use support::*;

/// What page `k` of the buffer holds: absent (never written), incompressible, or text.
#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Absent,
    Random,
    Text,
}

fn kind(k: usize) -> Kind {
    if k % 97 == 5 {
        Kind::Absent
    } else if k % 101 == 7 {
        Kind::Random
    } else {
        Kind::Text
    }
}

fn write_page(r: &Region, at: usize, k: usize, version: u64) {
    match kind(k) {
        Kind::Absent => {}
        Kind::Random => fill_random(page_mut(r, at), k, version),
        Kind::Text => fill(page_mut(r, at), k, version),
    }
}

fn check_page(r: &Region, at: usize, k: usize, version: u64) {
    let page = page_mut(r, at);
    match kind(k) {
        Kind::Absent => assert!(page.iter().all(|&b| b == 0), "page {k}: not zero"),
        Kind::Random => {
            let mut want = vec![0u8; PAGE];
            fill_random(&mut want, k, version);
            assert!(page == &want[..], "page {k}: wrong random content");
        }
        Kind::Text => check(page, k, version),
    }
}

/// A block of `n` pages with old data in it at `version`, as a reused or freed one holds:
/// mostly evicted, its last `tail` pages read back (resident), some pages never written.
fn old_block(r: &Region, n: usize, version: u64, tail: usize) {
    for k in 0..n {
        write_page(r, k, k, version);
    }
    for k in n - tail..n {
        check_page(r, k, k, version);
    }
}

/// The store let at least half of `dropped` pages' worth of data go between the two stats.
fn store_let_go(before: &RegionStats, after: &RegionStats, dropped: u64) {
    assert!(
        after.store.orig_data_size + dropped * PAGE as u64 / 2 <= before.store.orig_data_size,
        "{:?} -> {:?}",
        before.store,
        after.store
    );
}

fn small_region(verify: bool) -> Option<Region> {
    let mut cfg = RegionConfig::new(64 * MIB, Budget::Fixed(2 * MIB));
    cfg.verify_pages = verify;
    region_with(cfg)
}

#[test]
fn a_moved_buffer_keeps_every_byte_and_costs_no_copies() {
    let Some(r) = small_region(true) else {
        return;
    };
    let (src, dst, n) = (0usize, 4096usize, 2048usize);
    for k in 0..n {
        write_page(&r, src + k, k, 1);
    }
    // The allocator's new block held garbage (a block freed and reused): written, partly
    // evicted since.
    for k in (0..n).step_by(3) {
        fill(page_mut(&r, dst + k), dst + k, 99);
    }
    // The end of the buffer resident, the rest mostly stored.
    for k in n - 200..n {
        check_page(&r, src + k, k, 1);
    }
    let before = r.stats();
    // SAFETY: this thread alone uses both ranges.
    let m = unsafe { r.move_pages(dst * PAGE, src * PAGE, n * PAGE) }.unwrap();
    let after = r.stats();
    let absent = (0..n).filter(|&k| kind(k) == Kind::Absent).count() as u64;
    assert_eq!(m.mapped + m.stored + m.zero + m.copied, n as u64, "{m:?}");
    // Pages never written were mapped as zero pages by fault-around (the fill is a walk) and
    // may have been stored since, so not all of them are still absent.
    assert!(m.zero <= absent, "{m:?}");
    assert!(m.stored > 1000, "most pages were stored: {m:?}");
    assert!(m.mapped > 50, "the resident end moves: {m:?}");
    assert!(m.copied < 200, "{m:?}");
    assert_eq!(after.remapped, m);
    assert_eq!(after.store.renamed - before.store.renamed, m.stored);
    // Nothing was read back to move them: the store read only for the pages copied (each
    // fault with at most 64 pages of fault-around).
    let reads = after.store.reads - before.store.reads;
    assert!(reads <= 64 * m.copied, "{reads} pages read back: {m:?}");
    for k in 0..n {
        check_page(&r, dst + k, k, 1);
    }
    // The old range reads as zeros but for the pages that were copied.
    let kept = (0..n)
        .filter(|&k| page_mut(&r, src + k).iter().any(|&b| b != 0))
        .count();
    assert!(
        kept as u64 <= m.copied,
        "{kept} old pages still hold data: {m:?}"
    );
    // The moved pages are pages like any other: evicted, faulted back, rewritten.
    for k in 0..n {
        write_page(&r, src + k, k, 2);
    }
    for k in 0..n {
        check_page(&r, dst + k, k, 1);
        check_page(&r, src + k, k, 2);
    }
    let s = r.stats();
    assert_eq!(s.checks.mismatches, 0, "{:?}", s.checks);
    assert!(s.resident <= s.budget + 2 * MIB, "{s:?}");
}

/// A run of resident pages moved with one `UFFDIO_MOVE` whose count falls short of what the
/// kernel moved (`report_moves_short_for_tests`: each whole run reported two pages short):
/// the pages past the count are found moved, not copied from their emptied old address over
/// their new one. Before, the last two pages of each run read as zeros at the new address
/// and stayed marked absent while mapped (a later calloc of them kept the stale bytes).
#[test]
fn a_run_moved_further_than_its_count_keeps_every_byte() {
    let Some(r) = small_region(true) else {
        return;
    };
    r.report_moves_short_for_tests(2);
    let (src, dst, n) = (0usize, 1024usize, 256usize);
    for k in 0..n {
        fill(page_mut(&r, src + k), k, 1);
    }
    // SAFETY: this thread alone uses both ranges.
    let m = unsafe { r.move_pages(dst * PAGE, src * PAGE, n * PAGE) }.unwrap();
    assert!(m.mapped >= 64, "the pages were resident and move: {m:?}");
    let s = r.stats();
    assert!(s.checks.moved_unreported >= 2, "{:?}", s.checks);
    for k in 0..n {
        check(page_mut(&r, dst + k), k, 1);
    }
    // The old range reads as zeros, but for pages copied.
    let kept = (0..n)
        .filter(|&k| page_mut(&r, src + k).iter().any(|&b| b != 0))
        .count();
    assert!(kept as u64 <= m.copied, "{kept} old pages hold data: {m:?}");
    // Every moved page is the region's like any other: zeroed as a reused block's, it reads
    // zeros (a page left marked absent while mapped kept its bytes).
    // SAFETY: this thread alone uses the range.
    unsafe { r.zero_pages(dst * PAGE, n * PAGE) }.unwrap();
    for k in 0..n {
        assert!(
            page_mut(&r, dst + k).iter().all(|&b| b == 0),
            "page {k} not zeroed"
        );
    }
}

#[test]
fn pages_in_flight_are_copied_while_other_threads_fault() {
    // Eviction batches staged and settling, faults on the rest of the region from three other
    // threads: every page of the moved buffer still comes out right, whichever way it went.
    let Some(r) = small_region(false) else {
        return;
    };
    let r = Arc::new(r);
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..3)
        .map(|t| {
            let (r, stop) = (r.clone(), stop.clone());
            std::thread::spawn(move || {
                let base = 8192 + t * 1024;
                let mut v = 0;
                while !stop.load(Ordering::Relaxed) {
                    v += 1;
                    for i in base..base + 1024 {
                        fill(page_mut(&r, i), i, v);
                    }
                    for i in base..base + 1024 {
                        check(page_mut(&r, i), i, v);
                    }
                }
            })
        })
        .collect();
    let n = 1024;
    for round in 0..6u64 {
        let (src, dst) = if round % 2 == 0 { (0, 2048) } else { (2048, 0) };
        for k in 0..n {
            write_page(&r, src + k, k, round);
        }
        // SAFETY: this thread alone uses both ranges.
        let m = unsafe { r.move_pages(dst * PAGE, src * PAGE, n * PAGE) }.unwrap();
        assert_eq!(m.mapped + m.stored + m.zero + m.copied, n as u64);
        for k in 0..n {
            check_page(&r, dst + k, k, round);
        }
        let kept = (0..n)
            .filter(|&k| page_mut(&r, src + k).iter().any(|&b| b != 0))
            .count();
        assert!(
            kept as u64 <= m.copied,
            "{kept} old pages still hold data: {m:?}"
        );
    }
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        w.join().unwrap();
    }
    let s = r.stats();
    assert!(
        s.remapped.stored + s.remapped.mapped > 0,
        "{:?}",
        s.remapped
    );
}

#[test]
fn a_forked_child_copies_and_the_parent_keeps_its_pages() {
    let Some(r) = small_region(false) else {
        return;
    };
    let n = 512;
    for k in 0..n {
        write_page(&r, k, k, 3);
    }
    // SAFETY: the child only touches memory and calls _exit (move_pages allocates nothing in a
    // child: it copies).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: the child's own copy of both ranges; one thread.
        let m = unsafe { r.move_pages(4096 * PAGE, 0, n * PAGE) };
        let ok = m.is_ok_and(|m| m.copied == n as u64)
            && (0..n).all(|k| {
                let page = page_mut(&r, 4096 + k);
                match kind(k) {
                    Kind::Text => matches(page, k, 3),
                    Kind::Absent => page.iter().all(|&b| b == 0),
                    Kind::Random => true,
                }
            });
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(if ok { 0 } else { 12 }) };
    }
    wait_for_child(pid);
    for k in 0..n {
        check_page(&r, k, k, 3);
        assert!(page_mut(&r, 4096 + k).iter().all(|&b| b == 0));
    }
}

#[test]
fn bad_ranges_are_refused_and_change_nothing() {
    let Some(r) = small_region(false) else {
        return;
    };
    fill(page_mut(&r, 0), 0, 1);
    let bad = |dst: usize, src: usize, len: usize| {
        // SAFETY: nothing is moved (refused); this thread alone uses the region.
        let e = unsafe { r.move_pages(dst, src, len) }.unwrap_err();
        assert!(matches!(e, RegionError::Config(_)), "{e}");
    };
    bad(PAGE, 0, 2 * PAGE); // overlapping
    bad(8 * PAGE + 1, 0, PAGE); // not page aligned
    bad(8 * PAGE, 0, PAGE + 5);
    bad(r.len() - PAGE, 0, 2 * PAGE); // outside the region
    bad(8 * PAGE, usize::MAX - PAGE + 1, PAGE);
    check(page_mut(&r, 0), 0, 1);
    assert_eq!(r.stats().remapped, Default::default());
}

#[test]
fn zeroed_pages_read_zero_and_stored_ones_are_dropped_unread() {
    let Some(r) = small_region(true) else {
        return;
    };
    let n = 2048;
    old_block(&r, n, 5, 200);
    let before = r.stats();
    // SAFETY: this thread alone uses the range.
    let z = unsafe { r.zero_pages(0, n * PAGE) }.unwrap();
    let after = r.stats();
    assert_eq!(z.absent + z.dropped + z.written, n as u64, "{z:?}");
    assert!(z.dropped > 1000, "most pages were stored: {z:?}");
    assert!(z.written >= 100 && z.written < 600, "{z:?}");
    assert_eq!(after.zeroed, z);
    // Nothing was read back, and the store let the dropped pages go.
    let reads = after.store.reads - before.store.reads;
    assert!(reads <= 64 * z.written, "{reads} pages read back: {z:?}");
    store_let_go(&before, &after, z.dropped);
    for k in 0..n {
        assert!(page_mut(&r, k).iter().all(|&b| b == 0), "page {k} not zero");
    }
    // The pages are used again like any other.
    for k in 0..n {
        write_page(&r, k, k, 6);
    }
    for k in 0..n {
        check_page(&r, k, k, 6);
    }
    assert_eq!(r.stats().checks.mismatches, 0);
    // Bad input: not whole pages, outside the region.
    // SAFETY: refused before anything is written.
    unsafe {
        assert!(matches!(r.zero_pages(1, PAGE), Err(RegionError::Config(_))));
        assert!(matches!(
            r.zero_pages(0, PAGE + 1),
            Err(RegionError::Config(_))
        ));
        assert!(r.zero_pages(r.len() - PAGE, 2 * PAGE).is_err());
    }
    check_page(&r, 0, 0, 6);
}

#[test]
fn a_freed_blocks_stored_pages_are_forgotten_and_its_mapped_ones_kept() {
    let Some(r) = small_region(false) else {
        return;
    };
    let n = 2048;
    old_block(&r, n, 8, 100);
    let before = r.stats();
    // SAFETY: this thread alone uses the range, and reads none of it afterwards unwritten.
    let dropped = unsafe { r.drop_stored(0, n * PAGE) }.unwrap();
    let after = r.stats();
    assert!(dropped > 1000, "{dropped}");
    assert_eq!(after.freed_stored - before.freed_stored, dropped);
    store_let_go(&before, &after, dropped);
    // Mapped pages keep their content (the allocator may hand the block out again as it is);
    // forgotten ones read as zeros, without a read from the store.
    let mut kept = 0;
    for k in n - 100..n {
        let page = page_mut(&r, k);
        if page.iter().any(|&b| b != 0) {
            check_page(&r, k, k, 8);
            kept += 1;
        }
    }
    assert!(kept > 0, "the resident end was dropped too");
    assert_eq!(r.stats().store.reads, after.store.reads);
    for k in 0..n {
        write_page(&r, k, k, 9);
    }
    for k in 0..n {
        check_page(&r, k, k, 9);
    }
    // SAFETY: refused before anything is dropped.
    unsafe {
        assert!(matches!(
            r.drop_stored(3, PAGE),
            Err(RegionError::Config(_))
        ));
        assert!(r.drop_stored(r.len(), PAGE).is_err());
    }
}
