//! Several writers, readers and an explicit collector at once, next to the background
//! collector, on a log small enough that collection never stops.

mod common;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};
use zmem_tier::TierError;

fn hammer(encrypt: bool) {
    let (log, _io) = mem_log(48, encrypt);
    let clients: Vec<Arc<Client>> = (0..3).map(|_| Arc::new(Client::new(&log))).collect();
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for (k, c) in clients.iter().enumerate() {
        // A writer per owner: rewrites and discards its own pages.
        let (c, stop) = (c.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            let mut r = rand::rngs::StdRng::seed_from_u64(k as u64);
            let mut v = 0u64;
            let mut full = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let pages: Vec<(u64, Vec<u8>)> = (0..r.random_range(1..20))
                    .map(|_| r.random_range(0..200u64))
                    .collect::<std::collections::BTreeSet<_>>()
                    .into_iter()
                    .map(|i| {
                        v += 1;
                        (i, page(i, v, r.random_range(100..4000)))
                    })
                    .collect();
                match c.write(&pages) {
                    Ok(()) => {}
                    Err(TierError::Full { .. }) => full += 1,
                    Err(e) => panic!("write: {e}"),
                }
                for _ in 0..r.random_range(0..6) {
                    c.discard(r.random_range(0..200));
                }
            }
            full
        }));
    }
    for k in 0..2 {
        // Readers of every owner's pages (under that owner's lock, as a fault handler).
        let (clients, stop, reads) = (clients.clone(), stop.clone(), reads.clone());
        threads.push(std::thread::spawn(move || {
            let mut r = rand::rngs::StdRng::seed_from_u64(100 + k);
            while !stop.load(Ordering::Relaxed) {
                let c = &clients[r.random_range(0..clients.len())];
                let i = r.random_range(0..200u64);
                let m = c.model.pages.lock();
                if let Some(p) = m.get(&i) {
                    let mut out = vec![0u8; p.bytes.len()];
                    c.log
                        .read(c.id, i, p.loc, &mut out)
                        .unwrap_or_else(|e| panic!("read of page {i}: {e}"));
                    assert!(out == p.bytes, "page {i} reads back");
                    reads.fetch_add(1, Ordering::Relaxed);
                }
            }
            0
        }));
    }
    {
        let (log, stop) = (log.clone(), stop.clone());
        threads.push(std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                log.collect(3);
                std::thread::sleep(Duration::from_millis(1));
            }
            0
        }));
    }
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().expect("no thread panicked");
    }
    let st = log.stats();
    assert!(reads.load(Ordering::Relaxed) > 100, "readers ran");
    assert!(
        st.gc_moves > 0 && st.gc_segments > 0,
        "the collector ran: {st:?}"
    );
    assert_eq!(st.corrupt, 0);
    assert_eq!(st.bad_frees, 0);
    for c in &clients {
        c.check_all();
    }
    let live: usize = clients.iter().map(|c| c.model.pages.lock().len()).sum();
    assert!(st.objects >= live as u64);
    for c in &clients {
        let idx: Vec<u64> = c.model.pages.lock().keys().copied().collect();
        for i in idx {
            c.discard(i);
        }
    }
    log.collect(1000);
    let st = log.stats();
    assert_eq!((st.objects, st.segments_free), (0, st.segments), "{st:?}");
}

#[test]
fn writers_readers_and_collectors_at_once_encrypted() {
    hammer(true);
}

#[test]
fn writers_readers_and_collectors_at_once_plain() {
    hammer(false);
}
