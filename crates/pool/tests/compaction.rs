//! Fill, free a random 60%, compact: contents intact, memory back near the object bytes.

mod common;

use common::Rng;
use zmem_pool::{Pool, PoolConfig};

#[test]
fn compaction_restores_density() {
    let pool = Pool::new(PoolConfig::default()).unwrap();
    let mut rng = Rng::new(42);
    const N: usize = 100_000;
    let mut objs = Vec::with_capacity(N);
    for i in 0..N {
        let len = rng.range(500, 4096);
        let seed = i as u64;
        let h = pool.alloc(&common::content(seed, len)).unwrap();
        objs.push((h, seed, len));
    }
    let full = pool.stats();
    assert!(
        full.mem_used_total as f64 / full.object_bytes as f64 <= 1.05,
        "dense fill already wasteful: {full:?}"
    );
    // Chunks, not one mapping per span.
    assert!(pool.mapped_chunks() <= full.mem_used_total / (2 << 20) + 2);

    rng.shuffle(&mut objs);
    let keep = objs.split_off(N * 6 / 10);
    for &(h, _, _) in &objs {
        pool.free(h).unwrap();
    }
    let before = pool.stats();
    assert_eq!(before.objects, keep.len() as u64);
    let ratio_before = before.mem_used_total as f64 / before.object_bytes as f64;

    let cs = pool.compact();
    let after = pool.stats();
    for &(h, seed, len) in &keep {
        common::check(&pool, h, seed, len);
    }
    let ratio = after.mem_used_total as f64 / after.object_bytes as f64;
    eprintln!(
        "before: ratio {ratio_before:.3}, {} spans; compact: {cs:?}; after: ratio {ratio:.4}, \
         {} spans, fragmentation {:.4}, metadata {} B",
        before.spans,
        after.spans,
        after.fragmentation(),
        after.metadata_bytes
    );
    assert!(cs.pages_freed > 0);
    assert!(cs.objects_moved > 0);
    assert_eq!(after.pages_compacted, cs.pages_freed);
    assert_eq!(
        before.mem_used_total - after.mem_used_total,
        cs.pages_freed * 4096
    );
    assert_eq!(after.object_bytes, before.object_bytes);
    assert!(ratio <= 1.05, "mem_used_total/object_bytes = {ratio}");
    assert!(after.fragmentation() < 0.05);
    assert!(after.mem_used_max >= full.mem_used_total);

    // Nothing left to do.
    assert_eq!(pool.compact().pages_freed, 0);

    for &(h, _, _) in &keep {
        pool.free(h).unwrap();
    }
    let s = pool.stats();
    assert_eq!(
        (s.objects, s.object_bytes, s.spans, s.mem_used_total),
        (0, 0, 0, 0)
    );
    assert_eq!(s.fragmentation(), 0.0);
    assert!(pool.mapped_chunks() <= 1);
}

#[test]
fn compaction_of_small_and_large_objects() {
    let pool = Pool::new(PoolConfig::default()).unwrap();
    let mut rng = Rng::new(7);
    let mut objs = Vec::new();
    for i in 0..20_000u64 {
        let len = if i % 10 == 0 {
            rng.range(4097, pool.max_object_size())
        } else {
            rng.range(1, 400)
        };
        let h = pool.alloc(&common::content(i, len)).unwrap();
        objs.push((h, i, len));
    }
    rng.shuffle(&mut objs);
    let keep = objs.split_off(objs.len() * 7 / 10);
    for &(h, _, _) in &objs {
        pool.free(h).unwrap();
    }
    let cs = pool.compact();
    assert!(cs.pages_freed > 0);
    for &(h, seed, len) in &keep {
        common::check(&pool, h, seed, len);
    }
    // New allocations after compaction coexist with moved objects.
    let extra: Vec<_> = (0..2000u64)
        .map(|i| {
            let len = rng.range(1, 3000);
            (
                pool.alloc(&common::content(1 << 40 | i, len)).unwrap(),
                1 << 40 | i,
                len,
            )
        })
        .collect();
    for &(h, seed, len) in keep.iter().chain(&extra) {
        common::check(&pool, h, seed, len);
    }
}
