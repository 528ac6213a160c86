//! `Log::read_around` and `Log::open_fetched`: objects written together are read together in
//! one device read, and an object read ahead is only ever opened as the object it was.

mod common;

use common::*;
use zmem_tier::Location;

/// What `read_around` handed out: (page index, location, generation, sealed bytes).
type Fetched = Vec<(u64, Location, u64, Vec<u8>)>;

/// Reads page `index` of `c` along with `near` (indices of the model) within `span` bytes.
fn read_around(c: &Client, index: u64, near: &[u64], span: usize) -> (Vec<u8>, Fetched) {
    let m = c.model.pages.lock();
    let p = &m[&index];
    let near: Vec<(u64, Location, usize)> = near
        .iter()
        .map(|i| (*i, m[i].loc, m[i].bytes.len()))
        .collect();
    let mut out = vec![0u8; p.bytes.len()];
    let mut got = Vec::new();
    let n = c
        .log
        .read_around(c.id, index, p.loc, &mut out, &near, span, &mut |f| {
            got.push((f.index, f.loc, f.generation, f.sealed.to_vec()))
        })
        .unwrap();
    assert_eq!(n, got.len());
    (out, got)
}

/// Opens what `read_around` handed out for page `f.0` as `len` payload bytes.
fn open(c: &Client, f: &(u64, Location, u64, Vec<u8>), len: usize) -> Option<Vec<u8>> {
    let mut sealed = f.3.clone();
    c.log
        .open_fetched(c.id, f.0, f.1, f.2, len, &mut sealed)
        .then(|| sealed[..len].to_vec())
}

fn both(f: impl Fn(bool)) {
    f(true);
    f(false);
}

#[test]
fn neighbours_come_in_the_same_read_and_open_as_written() {
    both(|enc| {
        let (log, io) = mem_log(8, enc);
        let c = Client::new(&log);
        let pages: Vec<(u64, Vec<u8>)> = (0..16).map(|i| (i, page(i, 0, 1500))).collect();
        c.write(&pages).unwrap();
        let reads = io.reads();
        let (out, got) = read_around(&c, 5, &[6, 4, 7, 3], 64 << 10);
        assert_eq!(out, pages[5].1);
        assert_eq!(io.reads() - reads, 1, "one device read for all of them");
        let mut idx: Vec<u64> = got.iter().map(|f| f.0).collect();
        idx.sort();
        assert_eq!(idx, [3, 4, 6, 7]);
        for f in &got {
            assert_eq!(
                open(&c, f, 1500).as_deref(),
                Some(&pages[f.0 as usize].1[..])
            );
        }
        assert_eq!(log.stats().read_ahead, 4);
        assert_eq!(log.stats().reads, 1);
    });
}

#[test]
fn the_span_limit_and_other_segments_leave_objects_out() {
    let (log, _) = mem_log(8, true);
    let c = Client::new(&log);
    let first: Vec<(u64, Vec<u8>)> = (0..8).map(|i| (i, page(i, 0, 1500))).collect();
    c.write(&first).unwrap();
    let other: Vec<(u64, Vec<u8>)> = (8..10).map(|i| (i, page(i, 0, 1500))).collect();
    c.write(&other).unwrap();
    assert_ne!(c.loc(8).segment(), c.loc(4).segment());
    // 1516 sealed bytes each, 16-byte aligned, 512-byte sectors: 4 KiB holds the page and at
    // most one neighbour on each side.
    let (_, got) = read_around(&c, 4, &[5, 3, 6, 2, 8, 9], 4096);
    assert!(!got.is_empty() && got.len() <= 2, "{got:?}");
    assert!(got.iter().all(|f| f.0 == 3 || f.0 == 5), "{got:?}");
    // Without a span nothing comes along; with one, never another segment's objects.
    assert!(read_around(&c, 4, &[5, 3], 0).1.is_empty());
    let (_, got) = read_around(&c, 4, &[8, 9, 5], 1 << 20);
    assert_eq!(got.iter().map(|f| f.0).collect::<Vec<_>>(), [5]);
}

#[test]
fn a_fetched_object_that_is_no_longer_its_page_is_refused() {
    both(|enc| {
        let (log, io) = mem_log(8, enc);
        let c = Client::new(&log);
        let pages: Vec<(u64, Vec<u8>)> = (0..8).map(|i| (i, page(i, 0, 1500))).collect();
        c.write(&pages).unwrap();
        let (_, got) = read_around(&c, 0, &[1, 2, 3, 4], 64 << 10);
        assert_eq!(got.len(), 4);
        let f = |i: u64| got.iter().find(|f| f.0 == i).unwrap().clone();
        // Freed since: refused.
        c.discard(1);
        assert_eq!(open(&c, &f(1), 1500), None);
        // Asked for as another page, or at another length: refused.
        let mut other = f(2);
        other.0 = 3;
        assert_eq!(open(&c, &other, 1500), None);
        assert_eq!(open(&c, &f(2), 1499), None);
        // Bytes altered after the read (a torn or flipped read): refused, and the page's own
        // read still works (the device is fine).
        let mut flipped = f(3);
        flipped.3[7] ^= 1;
        assert_eq!(open(&c, &flipped, 1500), None);
        assert_eq!(c.read(3).unwrap(), pages[3].1);
        // The segment collected and rewritten since: the generation no longer matches.
        let g = f(4);
        for i in [0u64, 2, 3, 5, 6, 7] {
            c.discard(i);
        }
        c.write(&[(9, page(9, 0, 1500))]).unwrap();
        assert!(log.collect(8) > 0, "the old segment is collected");
        assert_ne!(c.loc(4), g.1, "page 4 was moved");
        assert_eq!(open(&c, &g, 1500), None);
        // Page 4 written anew until it lands where it was read from (the same segment and
        // offset, a later generation): the old bytes are still authentic for their
        // generation, so only the generation tells them apart.
        let again: Vec<(u64, Vec<u8>)> = (0..8).map(|i| (i, page(i, 1, 1500))).collect();
        let mut landed = false;
        for _ in 0..64 {
            c.write(&again).unwrap();
            if c.loc(4) == g.1 {
                landed = true;
                break;
            }
        }
        assert!(landed, "the segment is reused within 64 writes");
        assert_eq!(
            open(&c, &g, 1500),
            None,
            "stale bytes of an older generation"
        );
        assert_eq!(c.read(4).unwrap(), again[4].1);
        assert_eq!(log.stats().corrupt, 0, "refusals are not corruption");
        // A flip on the device is still reported by the plain read.
        let l = c.loc(4);
        io.flip_bit(l.segment(), l.offset() as usize + 3, 0);
        assert!(c.read(4).is_err());
    });
}

#[test]
fn a_failed_read_around_hands_nothing_out() {
    let (log, io) = mem_log(8, true);
    let c = Client::new(&log);
    let pages: Vec<(u64, Vec<u8>)> = (0..8).map(|i| (i, page(i, 0, 1500))).collect();
    c.write(&pages).unwrap();
    io.fail_read(1, libc::EIO);
    let m = c.model.pages.lock();
    let near = [(1u64, m[&1].loc, 1500usize)];
    let mut out = vec![1u8; 1500];
    let mut handed = 0;
    let r = log.read_around(c.id, 0, m[&0].loc, &mut out, &near, 1 << 16, &mut |_| {
        handed += 1
    });
    assert!(r.is_err());
    assert_eq!(handed, 0);
    assert!(out.iter().all(|&b| b == 0));
}
