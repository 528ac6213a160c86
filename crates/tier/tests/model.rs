//! Random writes, discards, reads and collections against a model (the test owner's map of
//! page -> location and bytes, kept up to date by the collector's relocations): every live
//! page reads back exactly, the log's books match the model, and once everything is freed all
//! space comes back. Reads with read-ahead keep what they bring along, and opening one of those
//! later succeeds only while it is still the page's object at that place, with its bytes.

mod common;

use std::time::{Duration, Instant};

use common::*;
use proptest::prelude::*;
use zmem_tier::TierError;

#[derive(Clone, Debug)]
enum Op {
    /// Pages (index, length) written in one call.
    Write(Vec<(u64, usize)>),
    Discard(u64),
    Read(u64),
    /// A read of the page with every other page of the model offered along, within a span.
    ReadAround(u64, usize),
    /// Opens an object kept from read-aheads (mostly one of the latest 8, by n).
    OpenFetched(usize),
    Collect(usize),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => prop::collection::vec((0u64..48, 0usize..6000), 1..24).prop_map(Op::Write),
        3 => (0u64..48).prop_map(Op::Discard),
        3 => (0u64..48).prop_map(Op::Read),
        2 => (0u64..48, 0usize..(96 << 10)).prop_map(|(i, s)| Op::ReadAround(i, s)),
        2 => (0usize..1000).prop_map(Op::OpenFetched),
        1 => (1usize..6).prop_map(Op::Collect),
    ]
}

fn check(ops: Vec<Op>, encrypt: bool) -> u64 {
    let (log, _io) = mem_log(24, encrypt);
    let c = Client::new(&log);
    let mut version = 0u64;
    // Objects read along: (page, location, generation, sealed bytes, payload length).
    let mut fetched: Vec<(u64, zmem_tier::Location, u64, Vec<u8>, usize)> = Vec::new();
    for op in ops {
        match op {
            Op::Write(list) => {
                // One call writes a page once.
                let mut seen = std::collections::HashSet::new();
                let pages: Vec<(u64, Vec<u8>)> = list
                    .into_iter()
                    .filter(|(i, _)| seen.insert(*i))
                    .map(|(i, n)| {
                        version += 1;
                        (i, page(i, version, n))
                    })
                    .collect();
                match c.write(&pages) {
                    Ok(()) | Err(TierError::Full { .. }) => {}
                    Err(e) => panic!("write: {e}"),
                }
            }
            Op::Discard(i) => {
                c.discard(i);
            }
            Op::Read(i) => {
                let want = c.model.pages.lock().get(&i).map(|p| p.bytes.clone());
                if let Some(want) = want {
                    assert_eq!(c.read(i).unwrap(), want, "page {i}");
                }
            }
            Op::ReadAround(i, span) => {
                let m = c.model.pages.lock();
                if let Some(p) = m.get(&i) {
                    let near: Vec<_> = m
                        .iter()
                        .filter(|(j, _)| **j != i)
                        .map(|(j, q)| (*j, q.loc, q.bytes.len()))
                        .collect();
                    let mut out = vec![0u8; p.bytes.len()];
                    let n = log
                        .read_around(c.id, i, p.loc, &mut out, &near, span, &mut |f| {
                            let len = f.sealed.len() - log.seal_overhead();
                            fetched.push((f.index, f.loc, f.generation, f.sealed.to_vec(), len));
                        })
                        .unwrap();
                    assert_eq!(out, p.bytes, "page {i}");
                    assert!(n <= zmem_tier::MAX_NEAR);
                }
            }
            Op::OpenFetched(k) => {
                if !fetched.is_empty() {
                    // Mostly one of the latest: older ones are mostly stale by now.
                    let recent = fetched.len().min(if k % 4 == 0 { usize::MAX } else { 8 });
                    let at = fetched.len() - 1 - k % recent;
                    let (i, loc, generation, mut sealed, len) = fetched.swap_remove(at);
                    let m = c.model.pages.lock();
                    if log.open_fetched(c.id, i, loc, generation, len, &mut sealed) {
                        let p = m.get(&i).expect("opened: the page is live");
                        assert_eq!(p.loc, loc, "opened: page {i} is still there");
                        assert_eq!(&sealed[..len], &p.bytes[..], "opened: page {i}'s bytes");
                    }
                }
            }
            Op::Collect(n) => {
                log.collect(n);
            }
        }
        let st = log.stats();
        // A collection in flight holds both copies of what it moves for a moment.
        assert!(st.objects >= c.model.pages.lock().len() as u64);
    }
    c.check_all();
    let moved = log.stats().gc_moves;
    let indices: Vec<u64> = c.model.pages.lock().keys().copied().collect();
    for i in indices {
        c.discard(i);
    }
    // Everything freed: all space comes back (the background collector may be mid-pass).
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        log.collect(64);
        let st = log.stats();
        if st.segments_free == st.segments && st.objects == 0 && st.live_bytes == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "space not reclaimed: {st:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(log.stats().bad_frees, 0, "no double free by the log");
    moved
}

#[test]
fn a_long_random_run_collects_and_matches_the_model() {
    use rand::{Rng, SeedableRng};
    let mut r = rand::rngs::StdRng::seed_from_u64(11);
    let ops: Vec<Op> = (0..3000)
        .map(|_| match r.random_range(0..11) {
            0..=3 => Op::Write(
                (0..r.random_range(1..24))
                    .map(|_| (r.random_range(0..48), r.random_range(0..6000)))
                    .collect(),
            ),
            4..=6 => Op::Discard(r.random_range(0..48)),
            7..=8 => Op::Read(r.random_range(0..48)),
            9 => match r.random_range(0..2) {
                0 => Op::ReadAround(r.random_range(0..48), r.random_range(0..96 << 10)),
                _ => Op::OpenFetched(r.random_range(0..1000)),
            },
            _ => Op::Collect(r.random_range(1..6)),
        })
        .collect();
    let moved = check(ops, true);
    assert!(moved > 100, "the collector moved objects: {moved}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn random_operations_match_the_model_encrypted(ops in prop::collection::vec(op(), 1..120)) {
        check(ops, true);
    }

    #[test]
    fn random_operations_match_the_model_plain(ops in prop::collection::vec(op(), 1..120)) {
        check(ops, false);
    }
}
