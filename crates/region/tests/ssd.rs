//! A region over a store with an SSD tier: pages go from DRAM to the pool to the log and come
//! back exact; the budget and the store limit hold; a forked child reads its snapshot through
//! the log too. Skips (with the reason) where /dev/userfaultfd cannot be opened.

use std::sync::Arc;

use zmem_region::{Budget, CleanCopies, RegionConfig, PAGE};
use zmem_store::LowerConfig;
use zmem_tier::{Log, LogConfig};

mod support;
use support::*;

fn log(dir: &tempfile::TempDir, size: u64) -> Arc<Log> {
    let mut cfg = LogConfig::new(dir.path(), size);
    cfg.segment_size = 256 << 10;
    Log::open(cfg).unwrap()
}

fn ssd_region(log: &Arc<Log>, size: u64, budget: u64, store_limit: u64) -> RegionConfig {
    let mut cfg = RegionConfig::new(size, Budget::Fixed(budget));
    cfg.store_limit = Some(store_limit);
    cfg.lower = Some(LowerConfig::new(log.clone()));
    cfg
}

#[test]
fn pages_round_trip_through_the_ssd_tier() {
    let dir = tempfile::tempdir().unwrap();
    let log = log(&dir, 128 << 20);
    let Some(r) = region_with(ssd_region(&log, 48 * MIB, 2 * MIB, MIB)) else {
        return;
    };
    let pages = r.len() / PAGE;
    for version in 1..=2 {
        for i in 0..pages {
            fill(page_mut(&r, i), i, version);
        }
        // Give the writeback a moment to move the pool's overflow to the log.
        std::thread::sleep(std::time::Duration::from_millis(100));
        for i in (0..pages).rev() {
            check(page_mut(&r, i), i, version);
        }
    }
    let s = r.stats();
    assert!(s.store.writeback_pages > 0, "{:?}", s.store);
    assert!(s.store.lower_reads > 0, "{:?}", s.store);
    assert!(s.store.mem_used_total <= MIB, "{:?}", s.store);
    assert_eq!(s.store.lower_errors, 0);
    let l = log.stats();
    assert_eq!(l.corrupt + l.read_errors + l.write_errors, 0, "{l:?}");
    drop(r);
    assert_eq!(
        log.stats().objects,
        0,
        "a dropped region frees its log objects"
    );
}

#[test]
fn an_ssd_tier_needs_a_store_limit() {
    let dir = tempfile::tempdir().unwrap();
    let log = log(&dir, 16 << 20);
    let mut cfg = ssd_region(&log, 8 * MIB, MIB, MIB);
    cfg.store_limit = None;
    let e = cfg.validate().unwrap_err();
    assert!(e.to_string().contains("store limit"), "{e}");
}

#[test]
fn a_forked_child_reads_pages_from_the_ssd_tier() {
    let dir = tempfile::tempdir().unwrap();
    let log = log(&dir, 64 << 20);
    let Some(r) = region_with(ssd_region(&log, 24 * MIB, MIB, MIB / 2)) else {
        return;
    };
    let pages = r.len() / PAGE;
    for i in 0..pages {
        fill(page_mut(&r, i), i, 3);
    }
    // The writeback runs in the background: wait for it (up to 10 s on a loaded machine).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while r.stats().store.lower_pages == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(r.stats().store.lower_pages > 0, "{:?}", r.stats().store);
    // SAFETY: the child only reads the region and exits with _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        let ok = (0..pages).all(|i| matches(page_mut(&r, i), i, 3));
        // SAFETY: leaving the child at once.
        unsafe { libc::_exit(if ok { 0 } else { 1 }) };
    }
    wait_for_child(pid);
    for i in 0..pages {
        check(page_mut(&r, i), i, 3);
    }
}

/// Pages read back from the log keep their copy there (it costs no DRAM): evicted again
/// unchanged, they are neither compressed nor written to the log again. Same work with copies
/// off writes every page again. Contents are checked after every pass, and after a write pass
/// (changed pages must not come back with their old content).
#[test]
fn pages_read_back_from_the_log_keep_their_copy_there() {
    let mut written = Vec::new();
    for mode in [CleanCopies::Off, CleanCopies::Ssd] {
        let dir = tempfile::tempdir().unwrap();
        let log = log(&dir, 128 << 20);
        let mut cfg = ssd_region(&log, 32 * MIB, 2 * MIB, MIB);
        cfg.clean_copies = mode;
        let Some(r) = region_with(cfg) else {
            return;
        };
        let pages = r.len() / PAGE;
        // Half random: ~2 KiB stored per page, so nearly all of them go on to the log.
        let half_random = |page: &mut [u8], i: usize, v: u64| {
            fill_random(page, i, v);
            page[2048..].fill(i as u8);
        };
        let mut model = vec![0u8; PAGE];
        for i in 0..pages {
            half_random(page_mut(&r, i), i, 1);
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
        let s0 = r.stats();
        for _ in 0..2 {
            for i in 0..pages {
                half_random(&mut model, i, 1);
                assert!(page_mut(&r, i) == &model[..], "page {i}");
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let s1 = r.stats();
        assert!(
            s1.store.lower_reads > s0.store.lower_reads,
            "{:?}",
            s1.store
        );
        written.push(s1.store.writeback_pages - s0.store.writeback_pages);
        if mode == CleanCopies::Ssd {
            assert!(s1.clean_evictions as usize > pages / 2, "{s1:?}");
        } else {
            assert_eq!(s1.clean_evictions, 0, "{s1:?}");
        }
        for i in 0..pages {
            fill(page_mut(&r, i), i, 2);
        }
        for i in (0..pages).rev() {
            check(page_mut(&r, i), i, 2);
        }
        let l = log.stats();
        assert_eq!(l.corrupt + l.read_errors + l.write_errors, 0, "{l:?}");
    }
    assert!(
        written[1] * 4 < written[0],
        "pages written back to the log while only reading: copies off {}, on {}",
        written[0],
        written[1]
    );
}
