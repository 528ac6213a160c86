//! Several threads allocate, verify and free while another compacts in a loop.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use common::Rng;
use zmem_pool::{Handle, Pool, PoolConfig};

#[test]
fn threads_and_compactor() {
    let pool = Arc::new(Pool::new(PoolConfig::default()).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    // Objects published for other threads to read (and eventually free).
    let shared: Arc<Mutex<Vec<(Handle, u64, usize)>>> = Arc::new(Mutex::new(Vec::new()));

    let compactor = {
        let (pool, stop) = (Arc::clone(&pool), Arc::clone(&stop));
        std::thread::spawn(move || {
            let (mut rounds, mut moved, mut freed) = (0u64, 0u64, 0u64);
            while !stop.load(Ordering::Relaxed) {
                let cs = pool.compact();
                moved += cs.objects_moved;
                freed += cs.pages_freed;
                rounds += 1;
                let _ = pool.stats();
            }
            (rounds, moved, freed)
        })
    };

    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let (pool, shared) = (Arc::clone(&pool), Arc::clone(&shared));
            std::thread::spawn(move || {
                let mut rng = Rng::new(t);
                let mut mine: Vec<(Handle, u64, usize)> = Vec::new();
                let mut next_seed = t << 48;
                for round in 0..6 {
                    // Fill.
                    for _ in 0..4000 {
                        let len = if rng.range(0, 9) == 0 {
                            rng.range(1, 70_000.min(pool.max_object_size()))
                        } else {
                            rng.range(200, 4096)
                        };
                        next_seed += 1;
                        let h = pool.alloc(&common::content(next_seed, len)).unwrap();
                        mine.push((h, next_seed, len));
                    }
                    // Verify everything, free a random 60% (sparse spans for the compactor).
                    rng.shuffle(&mut mine);
                    for &(h, seed, len) in &mine {
                        common::check(&pool, h, seed, len);
                    }
                    let keep = mine.split_off(mine.len() * 6 / 10);
                    for &(h, _, _) in &mine {
                        pool.free(h).unwrap();
                        assert!(pool.free(h).is_err());
                    }
                    mine = keep;
                    // Exchange some objects with other threads.
                    let mut sh = shared.lock().unwrap();
                    if round % 2 == 0 {
                        sh.extend(mine.drain(..100));
                    } else {
                        let n = sh.len().min(100);
                        let start = sh.len() - n;
                        mine.extend(sh.drain(start..));
                    }
                    drop(sh);
                    for &(h, seed, len) in &mine {
                        common::check(&pool, h, seed, len);
                    }
                }
                mine
            })
        })
        .collect();

    let mut all: Vec<(Handle, u64, usize)> = Vec::new();
    for w in workers {
        all.extend(w.join().unwrap());
    }
    stop.store(true, Ordering::Relaxed);
    let (rounds, moved, freed) = compactor.join().unwrap();
    all.extend(shared.lock().unwrap().drain(..));
    eprintln!("compactor: {rounds} rounds, {moved} objects moved, {freed} pages freed");
    assert!(rounds > 0);

    let s = pool.stats();
    assert_eq!(s.objects, all.len() as u64);
    assert_eq!(
        s.object_bytes,
        all.iter().map(|&(_, _, l)| l as u64).sum::<u64>()
    );
    for &(h, seed, len) in &all {
        common::check(&pool, h, seed, len);
    }
    let cs = pool.compact();
    for &(h, seed, len) in &all {
        common::check(&pool, h, seed, len);
    }
    assert!(
        moved + cs.objects_moved > 0,
        "compaction never moved anything"
    );
    for &(h, _, _) in &all {
        pool.free(h).unwrap();
    }
    let s = pool.stats();
    assert_eq!(
        (s.objects, s.object_bytes, s.spans, s.mem_used_total),
        (0, 0, 0, 0)
    );
}

#[test]
fn concurrent_readers_share_a_class() {
    let pool = Arc::new(Pool::new(PoolConfig::default()).unwrap());
    let objs: Vec<(Handle, u64, usize)> = (0..2000u64)
        .map(|i| (pool.alloc(&common::content(i, 1000)).unwrap(), i, 1000))
        .collect();
    let objs = Arc::new(objs);
    let readers: Vec<_> = (0..4)
        .map(|_| {
            let (pool, objs) = (Arc::clone(&pool), Arc::clone(&objs));
            std::thread::spawn(move || {
                for _ in 0..5 {
                    for &(h, seed, len) in objs.iter() {
                        common::check(&pool, h, seed, len);
                    }
                }
            })
        })
        .collect();
    // Churn the same class meanwhile.
    for i in 0..20_000u64 {
        let h = pool.alloc(&common::content(i, 1000)).unwrap();
        pool.free(h).unwrap();
    }
    for r in readers {
        r.join().unwrap();
    }
}
