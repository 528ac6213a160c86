//! The log's behaviour over MemIo: round trips, every error path, corruption detection.

mod common;

use std::sync::Arc;

use common::*;
use zmem_tier::{Location, Log, LogConfig, MemIo, SegmentIo, TierError};

fn both(f: impl Fn(bool)) {
    f(true);
    f(false);
}

#[test]
fn objects_round_trip_encrypted_and_plain() {
    both(|enc| {
        let (log, _io) = mem_log(16, enc);
        let c = Client::new(&log);
        let max = log.max_object();
        let sizes = [0usize, 1, 15, 16, 17, 511, 512, 513, 2000, 4096, 9000, max];
        let pages: Vec<(u64, Vec<u8>)> = sizes
            .iter()
            .enumerate()
            .map(|(i, &n)| (i as u64 * 7, page(i as u64, 0, n)))
            .collect();
        c.write(&pages).unwrap();
        c.check_all();
        let st = log.stats();
        assert_eq!(st.encrypted, enc);
        assert_eq!(st.objects, sizes.len() as u64);
        assert_eq!(st.live_bytes, sizes.iter().sum::<usize>() as u64);
        assert_eq!(st.objects_written, sizes.len() as u64);
        assert!(
            st.segment_writes >= 2,
            "the largest object needs a segment of its own"
        );
        assert!(st.write_amplification() >= 1.0 && st.write_amplification() < 1.2);
        // Nothing of the payload is visible on the device when encrypting.
        if enc {
            let needle = &pages[8].1[..64];
            for s in 0..16 {
                let b = _io.peek(s);
                assert!(
                    !b.windows(64).any(|w| w == needle),
                    "plaintext on segment {s}"
                );
            }
        }
    });
}

#[test]
fn an_empty_write_writes_nothing() {
    let (log, _) = mem_log(8, true);
    let c = Client::new(&log);
    assert!(log.write(c.id, &[]).unwrap().is_empty());
    assert_eq!(log.stats().segment_writes, 0);
}

#[test]
fn a_read_fetches_only_the_sectors_of_its_object() {
    let (log, io) = mem_log(8, true);
    let c = Client::new(&log);
    let pages: Vec<(u64, Vec<u8>)> = (0..20).map(|i| (i, page(i, 0, 1500))).collect();
    c.write(&pages).unwrap();
    let before = log.stats().device_bytes_read;
    let reads = io.reads();
    c.read(10).unwrap();
    let got = log.stats().device_bytes_read - before;
    assert_eq!(io.reads() - reads, 1);
    // 1500 + 16 bytes of tag span at most 4 sectors of 512.
    assert!(got <= 4 * 512, "{got} bytes read for a 1500-byte object");
}

#[test]
fn too_large_objects_are_refused_and_nothing_is_written() {
    let (log, _) = mem_log(8, true);
    let c = Client::new(&log);
    let max = log.max_object();
    let big = vec![1u8; max + 1];
    let small = [2u8; 10];
    let e = log
        .write(c.id, &[(1, &small[..]), (2, &big[..])])
        .unwrap_err();
    assert_eq!(
        e,
        TierError::TooLarge {
            len: max + 1,
            segment_size: SEG
        }
    );
    assert_eq!(log.stats().segment_writes, 0);
    assert_eq!(log.stats().objects, 0);
    // Plain mode has a smaller seal, so a larger largest object.
    let (plain, _) = mem_log(8, false);
    assert_eq!(plain.max_object(), max + 12);
}

#[test]
fn writes_of_unregistered_owners_are_refused() {
    let (log, _) = mem_log(8, true);
    let b = [1u8; 10];
    assert!(matches!(
        log.write(3, &[(0, &b[..])]),
        Err(TierError::Config(_))
    ));
    let c = Client::new(&log);
    log.unregister(c.id);
    assert!(matches!(
        log.write(c.id, &[(0, &b[..])]),
        Err(TierError::Config(_))
    ));
}

#[test]
fn bad_configurations_are_config_errors() {
    let io = || Box::new(MemIo::new(16, SEG)) as Box<dyn SegmentIo>;
    let bad = |f: &dyn Fn(&mut LogConfig)| {
        let mut c = cfg(SEG, true);
        f(&mut c);
        c
    };
    for c in [
        bad(&|c| c.gc_threshold = 0.0),
        bad(&|c| c.gc_threshold = 1.5),
        bad(&|c| c.gc_threshold = f64::NAN),
        bad(&|c| c.reserve_segments = 0),
        bad(&|c| c.reserve_segments = 15),
        bad(&|c| c.segment_size = 128 << 10),
    ] {
        let e = Log::with_io(c.clone(), io()).err().expect("refused");
        assert!(matches!(e, TierError::Config(_)), "{c:?}: {e}");
    }
    // Segment sizes for a file: not a power of two, too small, too large.
    let dir = tempfile::tempdir().unwrap();
    for s in [100_000usize, 32 << 10, 128 << 20] {
        let mut c = LogConfig::new(dir.path(), 64 << 20);
        c.segment_size = s;
        assert!(matches!(Log::open(c), Err(TierError::Config(_))), "{s}");
    }
    // Smaller than the reserve plus two segments.
    let mut c = LogConfig::new(dir.path(), 5 << 20);
    c.segment_size = 1 << 20;
    assert!(matches!(Log::open(c), Err(TierError::Config(_))));
    // An existing regular file, a missing path.
    let f = dir.path().join("file");
    std::fs::write(&f, b"data").unwrap();
    let e = Log::open(LogConfig::new(&f, 64 << 20)).err().unwrap();
    assert!(
        matches!(&e, TierError::Config(m) if m.contains("regular file")),
        "{e}"
    );
    assert_eq!(std::fs::read(&f).unwrap(), b"data", "left alone");
    let e = Log::open(LogConfig::new(dir.path().join("missing"), 64 << 20))
        .err()
        .unwrap();
    assert!(matches!(e, TierError::Config(_)), "{e}");
}

#[test]
fn wrong_owner_index_length_or_location_is_corrupt_and_returns_no_data() {
    both(|enc| {
        let (log, _) = mem_log(8, enc);
        let a = Client::new(&log);
        let b = Client::new(&log);
        a.write(&[(1, page(1, 0, 3000)), (2, page(2, 0, 3000))])
            .unwrap();
        let loc = a.loc(1);
        let mut out = vec![0xaau8; 3000];
        let corrupt = |r: Result<(), TierError>| matches!(r, Err(TierError::Corrupt { .. }));
        // Another owner, another page index: the seal binds them.
        assert!(corrupt(log.read(b.id, 1, loc, &mut out)));
        assert!(out.iter().all(|&x| x == 0), "nothing returned as data");
        assert!(corrupt(log.read(a.id, 2, loc, &mut out)));
        // Another length, a location inside an object, past the segments, in a free segment.
        assert!(corrupt(log.read(a.id, 1, loc, &mut out[..2999])));
        assert!(corrupt(log.read(a.id, 1, Location(loc.0 + 16), &mut out)));
        assert!(corrupt(log.read(a.id, 1, Location::new(99, 80), &mut out)));
        assert!(corrupt(log.read(a.id, 1, Location::new(5, 80), &mut out)));
        assert_eq!(log.stats().corrupt, 6);
        // The right one still reads.
        assert_eq!(a.read(1).unwrap(), page(1, 0, 3000));
    });
}

#[test]
fn bad_frees_are_ignored_and_counted() {
    let (log, _) = mem_log(8, true);
    let c = Client::new(&log);
    c.write(&[(1, page(1, 0, 100)), (2, page(2, 0, 100))])
        .unwrap();
    let loc = c.loc(1);
    c.discard(1);
    log.free(loc);
    log.free(Location(loc.0 + 1));
    log.free(Location::new(1000, 0));
    log.free(Location::new(6, 80));
    let st = log.stats();
    assert_eq!(st.bad_frees, 4);
    assert_eq!(st.objects, 1);
    assert_eq!(c.read(2).unwrap(), page(2, 0, 100));
    let mut out = vec![0u8; 100];
    assert!(matches!(
        log.read(c.id, 1, loc, &mut out),
        Err(TierError::Corrupt { .. })
    ));
}

#[test]
fn a_flipped_bit_fails_only_its_object() {
    both(|enc| {
        let (log, io) = mem_log(8, enc);
        let c = Client::new(&log);
        let pages: Vec<(u64, Vec<u8>)> = (0..10).map(|i| (i, page(i, 0, 1000))).collect();
        c.write(&pages).unwrap();
        let loc = c.loc(4);
        io.flip_bit(loc.segment(), loc.offset() as usize + 500, 3);
        assert!(matches!(c.read(4), Err(TierError::Corrupt { .. })));
        // In its tag / checksum too.
        let loc5 = c.loc(5);
        io.flip_bit(loc5.segment(), loc5.offset() as usize + 1000 + 1, 0);
        assert!(matches!(c.read(5), Err(TierError::Corrupt { .. })));
        for i in (0..10).filter(|i| ![4, 5].contains(i)) {
            assert_eq!(c.read(i).unwrap(), pages[i as usize].1);
        }
        assert_eq!(log.stats().corrupt, 2);
    });
}

#[test]
fn a_truncated_device_fails_the_objects_beyond_its_end() {
    let (log, io) = mem_log(8, true);
    let c = Client::new(&log);
    let pages: Vec<(u64, Vec<u8>)> = (0..20).map(|i| (i, page(i, 0, 2000))).collect();
    c.write(&pages).unwrap();
    let cut = c.loc(10);
    // At the first sector boundary after object 10 starts: 0..=9 end before it.
    let at = (cut.offset() as u64).div_ceil(512) * 512;
    io.truncate(u64::from(cut.segment()) * SEG as u64 + at);
    for i in 0..20u64 {
        let r = c.read(i);
        if i < 10 {
            assert_eq!(r.unwrap(), pages[i as usize].1);
        } else {
            assert!(
                matches!(r, Err(TierError::Corrupt { why, .. }) if why.contains("truncated") || why.contains("authentication")),
                "page {i}"
            );
        }
    }
    // A device cut and grown back with zeros (a hole) fails authentication.
    let (log, io) = mem_log(8, false);
    let c = Client::new(&log);
    c.write(&pages).unwrap();
    let l = c.loc(3);
    io.poke(l.segment(), l.offset() as usize, &[0u8; 2004]);
    assert!(matches!(c.read(3), Err(TierError::Corrupt { .. })));
}

#[test]
fn a_stale_segment_is_detected() {
    both(|enc| {
        let (log, io) = mem_log(8, enc);
        let c = Client::new(&log);
        c.write(&[(1, page(1, 0, 1000)), (2, page(2, 0, 1000))])
            .unwrap();
        let old = c.loc(1);
        let image = io.peek(old.segment());
        c.discard(1);
        c.discard(2);
        // The emptied segment is reclaimed (here, or before by the background collector the
        // discards woke: a count returned here would race with it) and the next writes reuse
        // segments.
        log.collect(8);
        let mut reused = false;
        for v in 1..8 {
            c.write(&[(1, page(1, v, 1000)), (2, page(2, v, 1000))])
                .unwrap();
            if c.loc(1).segment() == old.segment() {
                reused = true;
                break;
            }
        }
        assert!(reused, "the segment came back");
        // The old location now holds the new object of the same page: it reads the new one...
        let new_loc = c.loc(1);
        assert_eq!(c.read(1).unwrap(), c.model.pages.lock()[&1].bytes);
        // ...and putting the old segment image back (a lost write, a replayed disk) is caught:
        // same page, same place, older generation.
        io.poke(old.segment(), 0, &image);
        if new_loc == old {
            assert!(matches!(c.read(1), Err(TierError::Corrupt { .. })));
        }
        let mut out = vec![0u8; 1000];
        assert!(matches!(
            log.read(c.id, 2, c.loc(2), &mut out),
            Err(TierError::Corrupt { .. })
        ));
    });
}

#[test]
fn io_errors_fail_only_the_affected_operation() {
    let (log, io) = mem_log(16, true);
    let c = Client::new(&log);
    let pages: Vec<(u64, Vec<u8>)> = (0..10).map(|i| (i, page(i, 0, 1000))).collect();
    c.write(&pages).unwrap();
    // EIO on the second read from now.
    io.fail_read(2, libc::EIO);
    assert!(c.read(0).is_ok());
    let e = c.read(1).unwrap_err();
    assert_eq!(
        e,
        TierError::Io {
            what: "read of a MemIo segment",
            errno: zmem_tier::Errno(libc::EIO)
        }
    );
    assert_eq!(e.to_string(), "read of a MemIo segment: EIO");
    assert!(c.read(1).is_ok(), "the next read of it works");
    assert_eq!(log.stats().read_errors, 1);
    // EIO and ENOSPC on a write: an error, nothing written, space back.
    for errno in [libc::EIO, libc::ENOSPC] {
        let before = log.stats();
        io.fail_write(1, errno);
        let more: Vec<(u64, Vec<u8>)> = (100..110).map(|i| (i, page(i, 0, 1000))).collect();
        let e = c.write(&more).unwrap_err();
        assert!(matches!(e, TierError::Io { errno: zmem_tier::Errno(x), .. } if x == errno));
        let after = log.stats();
        assert_eq!(after.objects, before.objects);
        assert_eq!(after.segments_free, before.segments_free);
        assert_eq!(after.segment_writes, before.segment_writes);
        assert_eq!(after.write_errors, before.write_errors + 1);
    }
    c.check_all();
    let more: Vec<(u64, Vec<u8>)> = (100..110).map(|i| (i, page(i, 0, 1000))).collect();
    c.write(&more).unwrap();
    c.check_all();
}

#[test]
fn a_failure_in_a_multi_segment_write_writes_nothing() {
    let (log, io) = mem_log(16, true);
    let c = Client::new(&log);
    // ~5 segments' worth in one call; the third segment write fails.
    let pages: Vec<(u64, Vec<u8>)> = (0..150).map(|i| (i, page(i, 0, 2000))).collect();
    io.fail_write(3, libc::EIO);
    assert!(c.write(&pages).is_err());
    let st = log.stats();
    assert_eq!(st.objects, 0);
    assert_eq!(st.segments_free, 16);
    c.write(&pages).unwrap();
    assert!(log.stats().segment_writes >= 5);
    c.check_all();
    // A call larger than one batch of segments (8): the second batch fails, the first one's
    // objects are freed again.
    let (log, io) = mem_log(32, true);
    let c = Client::new(&log);
    let pages: Vec<(u64, Vec<u8>)> = (0..330).map(|i| (i, page(i, 0, 2000))).collect();
    io.fail_write(10, libc::EIO);
    assert!(c.write(&pages).is_err());
    log.collect(100);
    let st = log.stats();
    assert_eq!((st.objects, st.live_bytes, st.segments_free), (0, 0, 32));
    assert!(
        st.segment_writes >= 8,
        "the first batch was written: {st:?}"
    );
    c.write(&pages).unwrap();
    c.check_all();
}

#[test]
fn short_transfers_are_retried_and_stalls_are_errors() {
    let (log, io) = mem_log(16, true);
    let c = Client::new(&log);
    io.short_transfers(Some(100));
    let pages: Vec<(u64, Vec<u8>)> = (0..30).map(|i| (i, page(i, 0, 1500))).collect();
    c.write(&pages).unwrap();
    c.check_all();
    io.short_transfers(None);
    io.stall_writes(true);
    let e = c.write(&[(99, page(99, 0, 10))]).unwrap_err();
    assert!(matches!(e, TierError::Short { .. }), "{e}");
    io.stall_writes(false);
    io.stall_reads(true);
    assert!(matches!(c.read(3), Err(TierError::Corrupt { .. })));
    io.stall_reads(false);
    c.check_all();
}

#[test]
fn a_removed_device_fails_everything_cleanly() {
    let (log, io) = mem_log(16, true);
    let c = Client::new(&log);
    let pages: Vec<(u64, Vec<u8>)> = (0..96).map(|i| (i, page(i, 0, 2000))).collect();
    c.write(&pages).unwrap();
    // Segments of 32: the first empties, the other two become victims.
    for i in (0..96).filter(|i| *i < 32 || i % 4 != 0) {
        c.discard(i);
    }
    log.collect(0);
    io.remove();
    let enodev = |e: TierError| matches!(e, TierError::Io { errno, .. } if errno.0 == libc::ENODEV);
    assert!(enodev(c.read(40).unwrap_err()));
    assert!(enodev(c.write(&[(1, page(1, 1, 10))]).unwrap_err()));
    // The collector reads nothing; nothing is lost from the log's books.
    assert_eq!(log.collect(16), 0);
    let st = log.stats();
    assert_eq!(st.objects, 16);
    assert!(st.read_errors >= 2, "the victims' gathers failed too");
    for i in 32..96 {
        c.discard(i);
    }
    assert_eq!(log.stats().objects, 0);
}

#[test]
fn failed_trims_are_counted_and_the_segment_is_reused() {
    let (log, io) = mem_log(8, true);
    let c = Client::new(&log);
    io.fail_trims(true);
    c.write(&[(1, page(1, 0, 100))]).unwrap();
    c.discard(1);
    log.collect(4);
    let st = log.stats();
    assert_eq!((st.trim_errors, st.trims, st.segments_free), (1, 0, 8));
    io.fail_trims(false);
    c.write(&[(1, page(1, 0, 100))]).unwrap();
    c.discard(1);
    log.collect(4);
    assert_eq!(log.stats().trims, 1);
    assert_eq!(io.trims(), 1);
}

#[test]
fn a_full_log_says_full_and_recovers_after_frees() {
    let (log, _) = mem_log(8, true);
    let c = Client::new(&log);
    // 60 KiB objects: one per segment; 6 segments beyond the reserve of 2.
    let mut n = 0u64;
    let e = loop {
        match c.write(&[(n, page(n, 0, 60_000))]) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 20);
    };
    assert_eq!(
        e,
        TierError::Full {
            segments: 8,
            segment_size: SEG
        }
    );
    assert_eq!(n, 6);
    assert_eq!(log.stats().objects, 6);
    c.check_all();
    c.discard(2);
    c.write(&[(100, page(100, 0, 60_000))]).unwrap();
    c.check_all();
}

#[test]
fn collection_moves_live_objects_and_reclaims_segments() {
    both(|enc| {
        let (log, io) = mem_log(32, enc);
        let c = Client::new(&log);
        // 10 segments of 30 objects of 2000 bytes.
        for s in 0..10u64 {
            let pages: Vec<(u64, Vec<u8>)> = (0..30)
                .map(|i| (s * 30 + i, page(s * 30 + i, 0, 2000)))
                .collect();
            c.write(&pages).unwrap();
        }
        // Keep one object in three.
        for i in 0..300u64 {
            if i % 3 != 0 {
                c.discard(i);
            }
        }
        let before = log.stats();
        let reclaimed = log.collect(100);
        let after = log.stats();
        // 32 objects fill a new segment; a last new segment that would be less than half full
        // is not written (its objects stay for next time): 96 of the 100 move, 9 of the 10
        // victims are reclaimed, into 3 full segments.
        assert_eq!(reclaimed, 9);
        assert_eq!(after.gc_segments, 9);
        assert_eq!(after.segment_writes - before.segment_writes, 3);
        assert_eq!(after.gc_moves, 96);
        let per_segment = (after.device_bytes_written - before.device_bytes_written) / 3;
        assert!(per_segment > 60_000, "new segments are full: {per_segment}");
        assert_eq!(after.objects, 100);
        assert_eq!(after.segments_free, before.segments_free + 9 - 3);
        assert_eq!(io.trims(), after.trims);
        let rel = c.model.relocations.lock().clone();
        assert_eq!(rel.len(), 96);
        assert!(rel.iter().all(|r| r.3));
        c.check_all();
    });
}

#[test]
fn a_declined_relocation_keeps_the_old_copy_and_frees_the_new() {
    struct Declines;
    impl zmem_tier::Owner for Declines {
        fn relocate(&self, _: u64, _: Location, _: Location) -> bool {
            false
        }
    }
    let (log, _) = mem_log(8, true);
    let owner: Arc<dyn zmem_tier::Owner> = Arc::new(Declines);
    let id = log.register(Arc::downgrade(&owner));
    let data: Vec<Vec<u8>> = (0..10).map(|i| page(i, 0, 1000)).collect();
    let objs: Vec<(u64, &[u8])> = data
        .iter()
        .enumerate()
        .map(|(i, d)| (i as u64, &d[..]))
        .collect();
    let locs = log.write(id, &objs).unwrap();
    for l in &locs[1..] {
        log.free(*l);
    }
    // One victim of 1 live object gains nothing: a second joins it.
    let more: Vec<(u64, &[u8])> = data
        .iter()
        .enumerate()
        .map(|(i, d)| (10 + i as u64, &d[..]))
        .collect();
    let locs2 = log.write(id, &more).unwrap();
    for l in &locs2 {
        log.free(*l);
    }
    log.collect(4);
    let st = log.stats();
    assert_eq!(st.objects, 1, "the new copy was freed");
    assert_eq!(st.gc_moves, 0);
    assert_eq!(st.segments_free, 7, "the victim keeps its declined object");
    let mut out = vec![0u8; 1000];
    log.read(id, 0, locs[0], &mut out).unwrap();
    assert_eq!(out, data[0]);
    // The owner frees it itself: the segment empties and comes back.
    log.free(locs[0]);
    log.collect(4);
    assert_eq!(log.stats().objects, 0);
    assert_eq!(log.stats().segments_free, 8);
}

#[test]
fn objects_of_an_unregistered_owner_stay_until_it_frees_them() {
    let (log, _) = mem_log(8, true);
    let c = Client::new(&log);
    let pages: Vec<(u64, Vec<u8>)> = (0..10).map(|i| (i, page(i, 0, 1000))).collect();
    c.write(&pages).unwrap();
    for i in 1..10 {
        c.discard(i);
    }
    // And a second, emptied segment.
    let more: Vec<(u64, Vec<u8>)> = (10..20).map(|i| (i, page(i, 0, 1000))).collect();
    c.write(&more).unwrap();
    for i in 10..20 {
        c.discard(i);
    }
    log.unregister(c.id);
    log.collect(4);
    assert!(
        c.model.relocations.lock().is_empty(),
        "not called after unregister"
    );
    assert_eq!(log.stats().objects, 1);
    assert_eq!(log.stats().segments_free, 7);
    c.discard(0);
    log.collect(4);
    assert_eq!(log.stats().segments_free, 8);
}

#[test]
fn a_corrupt_object_is_not_moved_and_its_segment_is_kept() {
    let (log, io) = mem_log(16, true);
    let c = Client::new(&log);
    let pages: Vec<(u64, Vec<u8>)> = (0..30).map(|i| (i, page(i, 0, 2000))).collect();
    c.write(&pages).unwrap();
    for i in 2..30 {
        c.discard(i);
    }
    // Another mostly empty segment, so that collecting gains a segment.
    let other: Vec<(u64, Vec<u8>)> = (200..230).map(|i| (i, page(i, 0, 2000))).collect();
    c.write(&other).unwrap();
    for i in 201..230 {
        c.discard(i);
    }
    let bad = c.loc(0);
    io.flip_bit(bad.segment(), bad.offset() as usize + 7, 1);
    log.collect(4);
    assert!(log.stats().corrupt >= 1);
    assert!(matches!(c.read(0), Err(TierError::Corrupt { .. })));
    assert_eq!(
        c.read(1).unwrap(),
        pages[1].1,
        "the good one moved and reads"
    );
    assert_ne!(c.loc(1).segment(), bad.segment());
    // A corrupt header: nothing of that segment is moved, its objects still read.
    let pages: Vec<(u64, Vec<u8>)> = (100..130).map(|i| (i, page(i, 0, 2000))).collect();
    c.write(&pages).unwrap();
    for i in 101..130 {
        c.discard(i);
    }
    let other: Vec<(u64, Vec<u8>)> = (300..330).map(|i| (i, page(i, 0, 2000))).collect();
    c.write(&other).unwrap();
    for i in 301..330 {
        c.discard(i);
    }
    let at = c.loc(100);
    io.flip_bit(at.segment(), 40, 0);
    let corrupt = log.stats().corrupt;
    log.collect(4);
    assert_eq!(c.loc(100), at, "not moved");
    assert!(log.stats().corrupt > corrupt);
    assert_eq!(c.read(100).unwrap(), pages[0].1);
}

#[test]
fn dropping_the_log_stops_its_collector() {
    let (log, _) = mem_log(16, true);
    let c = Client::new(&log);
    c.write(&(0..50).map(|i| (i, page(i, 0, 2000))).collect::<Vec<_>>())
        .unwrap();
    let weak = Arc::downgrade(&log);
    drop(c);
    drop(log);
    assert!(weak.upgrade().is_none());
}
