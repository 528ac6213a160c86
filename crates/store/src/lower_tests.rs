//! The SSD tier under the store: writeback, reads back, discards, the collector's
//! relocations and the background writeback, against a model of every page.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use zmem_tier::{Log, LogConfig};

use super::*;

const PS: usize = PAGE_SIZE;

/// A compressible page unique to (index, version): text with numbers in it.
fn page(index: u64, version: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(PS + 64);
    let mut k = 0u64;
    while v.len() < PS {
        v.extend_from_slice(
            format!("page {index} version {version} line {k} of the SSD tier test\n").as_bytes(),
        );
        k += 1;
    }
    v.truncate(PS);
    v
}

fn log(dir: &tempfile::TempDir, size: u64, encrypt: bool) -> Arc<Log> {
    let mut cfg = LogConfig::new(dir.path(), size);
    cfg.segment_size = 64 << 10;
    cfg.encrypt = encrypt;
    Log::open(cfg).unwrap()
}

fn store_over(log: &Arc<Log>, pages: u64, limit: u64) -> PageStore {
    let mut cfg = StoreConfig::new(pages, Policy::Fast);
    cfg.mem_limit = Some(limit);
    cfg.lower = Some(LowerConfig::new(log.clone()));
    PageStore::new(cfg).unwrap()
}

fn read(s: &PageStore, i: u64) -> Vec<u8> {
    let mut b = vec![0xAAu8; PS];
    s.read(i, &mut b).unwrap();
    b
}

#[test]
fn written_back_pages_read_back_exactly_and_leave_the_pool() {
    for encrypt in [true, false] {
        let dir = tempfile::tempdir().unwrap();
        let log = log(&dir, 32 << 20, encrypt);
        let s = store_over(&log, 2048, 256 << 20);
        for i in 0..1000 {
            s.write(i, &page(i, 0)).unwrap();
        }
        let before = s.stats();
        let w = s.writeback(u64::MAX).unwrap();
        assert_eq!(
            w.pages, 1000,
            "every object is written back (two sweeps of the clock)"
        );
        let after = s.stats();
        assert_eq!(after.lower_pages, 1000);
        assert_eq!(after.lower_bytes, w.bytes);
        assert_eq!(after.orig_data_size, before.orig_data_size);
        assert!(
            after.mem_used_total < before.mem_used_total / 4,
            "pool {} -> {}",
            before.mem_used_total,
            after.mem_used_total
        );
        assert_eq!(log.stats().objects, 1000);
        // Batches fill whole segments: one partly filled segment at most.
        let space: usize = (0..1000)
            .map(|i| log.object_space(s.inner.slots[i].peek().len() as usize))
            .sum();
        let segments = log.stats().segment_writes as usize;
        assert!(
            segments <= space.div_ceil(log.segment_space()),
            "{segments} segments for {space} bytes of objects ({} per segment)",
            log.segment_space()
        );
        for i in 0..1000 {
            assert_eq!(read(&s, i), page(i, 0), "page {i} encrypt {encrypt}");
        }
        assert_eq!(s.stats().lower_reads, 1000);
        // Nothing is written back twice.
        assert_eq!(s.writeback(u64::MAX).unwrap().pages, 0);
    }
}

#[test]
fn a_store_without_a_memory_limit_or_a_tier_refuses_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let log = log(&dir, 8 << 20, true);
    let mut cfg = StoreConfig::new(16, Policy::Fast);
    cfg.lower = Some(LowerConfig::new(log.clone()));
    let e = PageStore::new(cfg.clone()).err().unwrap();
    assert!(e.to_string().contains("memory limit"), "{e}");
    cfg.mem_limit = Some(1 << 20);
    cfg.lower.as_mut().unwrap().low_watermark = 0.95;
    let e = PageStore::new(cfg).err().unwrap();
    assert!(e.to_string().contains("watermarks"), "{e}");
    let plain = PageStore::new(StoreConfig::new(16, Policy::Fast)).unwrap();
    assert!(matches!(plain.writeback(1), Err(StoreError::Config(_))));
}

#[test]
fn overwrites_and_discards_free_the_log_copy() {
    let dir = tempfile::tempdir().unwrap();
    let log = log(&dir, 16 << 20, true);
    let s = store_over(&log, 512, 64 << 20);
    for i in 0..300 {
        s.write(i, &page(i, 0)).unwrap();
    }
    s.writeback(u64::MAX).unwrap();
    assert_eq!(log.stats().objects, 300);
    for i in 0..100 {
        s.write(i, &page(i, 1)).unwrap();
    }
    s.discard_range(100, 100).unwrap();
    assert_eq!(log.stats().objects, 100);
    let st = s.stats();
    assert_eq!(st.lower_pages, 100);
    for i in 0..100 {
        assert_eq!(read(&s, i), page(i, 1));
    }
    for i in 100..200 {
        assert_eq!(read(&s, i), vec![0u8; PS]);
    }
    for i in 200..300 {
        assert_eq!(read(&s, i), page(i, 0));
    }
    drop(s);
    assert_eq!(log.stats().objects, 0, "a dropped store frees its objects");
}

#[test]
fn the_collector_repoints_pages_it_moves() {
    let dir = tempfile::tempdir().unwrap();
    let log = log(&dir, 16 << 20, true);
    let s = store_over(&log, 4096, 256 << 20);
    for i in 0..3000 {
        s.write(i, &page(i, 0)).unwrap();
    }
    s.writeback(u64::MAX).unwrap();
    let segments_used = {
        let st = log.stats();
        st.segments - st.segments_free
    };
    // Three of every four pages die: every segment is mostly garbage.
    for i in (0..3000).filter(|i| i % 4 != 0) {
        s.discard(i).unwrap();
    }
    let reclaimed = log.collect(usize::MAX);
    let st = log.stats();
    assert!(reclaimed > 0 && st.gc_moves > 0, "{st:?}");
    assert!(
        st.segments - st.segments_free < segments_used,
        "{} segments in use after the collection, {segments_used} before",
        st.segments - st.segments_free
    );
    assert_eq!(st.objects, 750);
    for i in 0..3000 {
        let want = if i % 4 == 0 {
            page(i, 0)
        } else {
            vec![0u8; PS]
        };
        assert_eq!(read(&s, i), want, "page {i}");
    }
}

#[test]
fn the_background_writeback_makes_room_under_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    let log = log(&dir, 64 << 20, true);
    let limit = 1 << 20;
    let s = store_over(&log, 16384, limit);
    let n = 6000u64; // about 6 MiB of compressed pages: far above the limit
    let deadline = Instant::now() + Duration::from_secs(60);
    for i in 0..n {
        loop {
            match s.write(i, &page(i, 7)) {
                Ok(()) => break,
                Err(StoreError::MemoryLimit { .. }) => {
                    assert!(Instant::now() < deadline, "writeback never made room");
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(e) => panic!("{e}"),
            }
        }
    }
    let st = s.stats();
    assert!(
        st.lower_pages > n / 2,
        "{} pages on the log",
        st.lower_pages
    );
    assert!(st.mem_used_total <= limit);
    for i in 0..n {
        assert_eq!(read(&s, i), page(i, 7), "page {i}");
    }
}

#[test]
fn threads_write_read_and_discard_while_the_tier_moves_pages() {
    let dir = tempfile::tempdir().unwrap();
    let log = log(&dir, 64 << 20, true);
    let s = Arc::new(store_over(&log, 8192, 2 << 20));
    let threads: Vec<_> = (0..3u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                // Each thread owns the pages i with i % 3 == t, and keeps their model.
                let mut model: HashMap<u64, u64> = HashMap::new();
                let mut x = t + 1;
                for round in 0..6000u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let i = (x % 2700) * 3 + t;
                    match x % 5 {
                        0 => {
                            s.discard(i).unwrap();
                            model.remove(&i);
                        }
                        1 | 2 => match s.write(i, &page(i, round)) {
                            Ok(()) => {
                                model.insert(i, round);
                            }
                            Err(StoreError::MemoryLimit { .. }) => {
                                std::thread::sleep(Duration::from_millis(1))
                            }
                            Err(e) => panic!("{e}"),
                        },
                        _ => {
                            let want = model.get(&i).map_or(vec![0u8; PS], |&v| page(i, v));
                            assert_eq!(read(&s, i), want, "page {i}");
                        }
                    }
                    if round % 500 == 0 && t == 0 {
                        s.writeback(256 << 10).unwrap();
                    }
                }
                model
            })
        })
        .collect();
    let collector = {
        let log = log.clone();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        (
            stop,
            std::thread::spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    log.collect(4);
                    std::thread::sleep(Duration::from_millis(1));
                }
            }),
        )
    };
    let models: Vec<HashMap<u64, u64>> = threads.into_iter().map(|h| h.join().unwrap()).collect();
    collector.0.store(true, Ordering::Relaxed);
    collector.1.join().unwrap();
    assert!(s.stats().writeback_pages > 0);
    for m in &models {
        for (&i, &v) in m {
            assert_eq!(read(&s, i), page(i, v), "page {i}");
        }
    }
}

/// A store over an in-memory log with injectable faults.
fn faulty(segments: u32, limit: u64) -> (zmem_tier::MemIo, Arc<Log>, PageStore) {
    let seg = 64 << 10;
    let io = zmem_tier::MemIo::new(segments, seg);
    let mut cfg = LogConfig::new("/nonexistent", u64::from(segments) * seg as u64);
    cfg.segment_size = seg;
    cfg.reserve_segments = 1;
    let log = Log::with_io(cfg, Box::new(io.clone())).unwrap();
    let s = store_over(&log, 4096, limit);
    (io, log, s)
}

#[test]
fn a_corrupt_object_on_the_log_loses_only_its_page() {
    let (io, _log, s) = faulty(64, 64 << 20);
    for i in 0..400 {
        s.write(i, &page(i, 0)).unwrap();
    }
    s.writeback(u64::MAX).unwrap();
    // Flip one bit inside page 123's object, where the log keeps it.
    let loc = zmem_tier::Location(s.inner.slots[123].peek_aux());
    io.flip_bit(loc.segment(), loc.offset() as usize + 7, 3);
    let mut b = vec![0u8; PS];
    let e = s.read(123, &mut b).unwrap_err();
    assert_eq!(e.lost_page(), Some(123), "{e}");
    assert!(matches!(e, StoreError::Lower { .. }), "{e}");
    for i in (0..400).filter(|&i| i != 123) {
        assert_eq!(read(&s, i), page(i, 0), "page {i}");
    }
    assert_eq!(s.stats().lower_errors, 1);
}

#[test]
fn a_failed_log_write_keeps_the_pages_in_the_pool() {
    let (io, log, s) = faulty(64, 64 << 20);
    for i in 0..200 {
        s.write(i, &page(i, 0)).unwrap();
    }
    io.fail_write(1, libc::EIO);
    let e = s.writeback(u64::MAX).unwrap_err();
    assert!(matches!(e, StoreError::Lower { index: None, .. }), "{e}");
    assert!(e.to_string().contains("EIO"), "{e}");
    assert_eq!(s.stats().lower_pages, 0);
    assert_eq!(log.stats().objects, 0);
    for i in 0..200 {
        assert_eq!(read(&s, i), page(i, 0), "page {i}");
    }
    // The next pass writes them: nothing was lost from the queue either.
    assert_eq!(s.writeback(u64::MAX).unwrap().pages, 200);
    for i in 0..200 {
        assert_eq!(read(&s, i), page(i, 0), "page {i}");
    }
}

#[test]
fn a_full_log_leaves_the_rest_in_the_pool() {
    let (_io, log, s) = faulty(4, 64 << 20);
    for i in 0..2000 {
        s.write(i, &page(i, 0)).unwrap();
    }
    let e = s.writeback(u64::MAX).unwrap_err();
    assert!(
        matches!(
            e,
            StoreError::Lower {
                source: zmem_tier::TierError::Full { .. },
                ..
            }
        ),
        "{e}"
    );
    let st = s.stats();
    assert!(st.lower_pages > 0 && st.lower_pages < 2000, "{st:?}");
    assert_eq!(log.stats().objects, st.lower_pages);
    for i in 0..2000 {
        assert_eq!(read(&s, i), page(i, 0), "page {i}");
    }
}

#[test]
fn a_removed_device_fails_reads_of_its_pages_only() {
    let (io, _log, s) = faulty(64, 64 << 20);
    for i in 0..100 {
        s.write(i, &page(i, 0)).unwrap();
    }
    s.writeback(u64::MAX).unwrap();
    for i in 100..150 {
        s.write(i, &page(i, 0)).unwrap();
    }
    io.remove();
    for i in 0..100 {
        let mut b = vec![0u8; PS];
        let e = s.read(i, &mut b).unwrap_err();
        assert_eq!(e.lost_page(), Some(i), "{e}");
    }
    for i in 100..150 {
        assert_eq!(read(&s, i), page(i, 0), "page {i} is still in the pool");
    }
    // Writing a lost page again makes it whole (its dead log copy is freed).
    s.write(5, &page(5, 9)).unwrap();
    assert_eq!(read(&s, 5), page(5, 9));
}

#[test]
fn pages_that_do_not_compress_still_go_to_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let log = log(&dir, 16 << 20, true);
    let s = store_over(&log, 256, 64 << 20);
    let noise = |i: u64| -> Vec<u8> {
        let mut x = i.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..PS)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    for i in 0..100 {
        assert!(
            s.write_if_smaller(i, &noise(i)).unwrap(),
            "page {i} refused"
        );
    }
    assert_eq!(s.stats().huge_pages, 100);
    assert_eq!(s.writeback(u64::MAX).unwrap().pages, 100);
    let st = s.stats();
    assert_eq!((st.lower_pages, st.huge_pages), (100, 100));
    for i in 0..100 {
        assert_eq!(read(&s, i), noise(i), "page {i}");
    }
    // Without a tier the same page is not stored (it would save nothing).
    let plain = PageStore::new(StoreConfig::new(16, Policy::Fast)).unwrap();
    assert!(!plain.write_if_smaller(0, &noise(0)).unwrap());
}

fn store_with_read_ahead(log: &Arc<Log>, pages: u64, limit: u64, read_ahead: usize) -> PageStore {
    let mut cfg = StoreConfig::new(pages, Policy::Fast);
    cfg.mem_limit = Some(limit);
    let mut lower = LowerConfig::new(log.clone());
    lower.read_ahead = read_ahead;
    cfg.lower = Some(lower);
    PageStore::new(cfg).unwrap()
}

#[test]
fn pages_written_back_together_are_read_together() {
    for (read_ahead, encrypt) in [(8, true), (8, false), (1, true)] {
        let dir = tempfile::tempdir().unwrap();
        let log = log(&dir, 32 << 20, encrypt);
        let s = store_with_read_ahead(&log, 2048, 256 << 20, read_ahead);
        for i in 0..1000 {
            s.write(i, &page(i, 0)).unwrap();
        }
        assert_eq!(s.writeback(u64::MAX).unwrap().pages, 1000);
        for i in 0..1000 {
            assert_eq!(read(&s, i), page(i, 0), "page {i}");
        }
        let (st, reads) = (s.stats(), log.stats().reads);
        assert_eq!(st.lower_reads, 1000);
        if read_ahead == 1 {
            assert_eq!((st.lower_ahead_hits, reads), (0, 1000));
        } else {
            // A walk: the window opens at the second page and stays at 8.
            assert!(st.lower_ahead_hits > 800, "{st:?}");
            assert_eq!(reads, 1000 - st.lower_ahead_hits);
            assert_eq!(log.stats().read_ahead, st.lower_ahead_hits);
        }
        // Random order: nearly nothing read ahead is used, and the window closes.
        let before = s.stats().lower_ahead_hits;
        let mut r = 12345u64;
        for _ in 0..2000 {
            r = r
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let i = (r >> 33) % 1000;
            assert_eq!(read(&s, i), page(i, 0), "page {i}");
        }
        let fetched = log.stats().read_ahead;
        let used = s.stats().lower_ahead_hits - before;
        assert!(
            used < 200,
            "{used} of 2000 random reads hit what was read ahead ({fetched} fetched in all)"
        );
    }
}

#[test]
fn read_ahead_never_serves_a_page_stale_contents() {
    // Pages are rewritten, discarded, written back again and collected between reads that
    // walk (so that objects are read ahead), against a model of every page.
    let dir = tempfile::tempdir().unwrap();
    let log = log(&dir, 4 << 20, true);
    let n = 512u64;
    let s = store_with_read_ahead(&log, n, 64 << 20, 8);
    let mut model: Vec<Option<u64>> = vec![None; n as usize];
    let mut r = 99u64;
    let mut next = || {
        r = r
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        r >> 33
    };
    for round in 0..300u64 {
        // Rewrite or discard a few pages.
        for _ in 0..24 {
            let i = next() % n;
            if next() % 4 == 0 {
                s.discard(i).unwrap();
                model[i as usize] = None;
            } else {
                s.write(i, &page(i, round)).unwrap();
                model[i as usize] = Some(round);
            }
        }
        s.writeback(u64::MAX).unwrap();
        if round % 7 == 0 {
            log.collect(usize::MAX);
        }
        // A walk of a few pages from a random start (opens the window, reads ahead).
        let start = next() % n;
        for i in (start..n).take(6) {
            let want = model[i as usize].map_or(vec![0u8; PS], |v| page(i, v));
            assert_eq!(read(&s, i), want, "page {i} in round {round}");
        }
    }
    for i in 0..n {
        let want = model[i as usize].map_or(vec![0u8; PS], |v| page(i, v));
        assert_eq!(read(&s, i), want, "page {i} at the end");
    }
    let st = s.stats();
    assert!(st.lower_ahead_hits > 100, "{st:?}");
    assert_eq!(st.lower_errors, 0);
    assert_eq!(log.stats().corrupt, 0);
}

#[test]
fn read_ahead_outside_its_range_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let log = log(&dir, 8 << 20, true);
    for bad in [0, MAX_READ_AHEAD + 1] {
        let mut cfg = StoreConfig::new(16, Policy::Fast);
        cfg.mem_limit = Some(1 << 20);
        let mut lower = LowerConfig::new(log.clone());
        lower.read_ahead = bad;
        cfg.lower = Some(lower);
        let e = PageStore::new(cfg).err().unwrap();
        assert!(e.to_string().contains("read-ahead"), "{e}");
    }
}

#[test]
fn pages_stored_apart_are_written_beside_their_neighbours() {
    // Pages enter the pool in a random order (as a program's cold pages are evicted); the
    // writeback puts neighbours in memory next to each other on the log, so that a walk over
    // them is read ahead as if they had been stored in order.
    let dir = tempfile::tempdir().unwrap();
    // Segments of 1 MiB: all 1000 objects in one or two, so that only where they lie in the
    // segment decides what one read (64 KiB at most) brings along.
    let mut cfg = LogConfig::new(dir.path(), 32 << 20);
    cfg.segment_size = 1 << 20;
    let log = Log::open(cfg).unwrap();
    let s = store_with_read_ahead(&log, 2048, 256 << 20, 8);
    let mut order: Vec<u64> = (0..1000).collect();
    let mut r = 7u64;
    for k in (1..order.len()).rev() {
        r = r
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        order.swap(k, (r >> 33) as usize % (k + 1));
    }
    for &i in &order {
        s.write(i, &page(i, 0)).unwrap();
    }
    assert_eq!(s.writeback(u64::MAX).unwrap().pages, 1000, "each page once");
    assert_eq!(log.stats().objects, 1000);
    for i in 0..1000 {
        assert_eq!(read(&s, i), page(i, 0), "page {i}");
    }
    let st = s.stats();
    assert!(
        st.lower_ahead_hits > 700,
        "{} of 1000 read ahead",
        st.lower_ahead_hits
    );
}
