//! The memory limit is exact, failed allocations change nothing, raising it allows more.

mod common;

use std::sync::Arc;

use common::Rng;
use zmem_pool::{Pool, PoolConfig, PoolError};

fn fill_until_limit(
    pool: &Pool,
    rng: &mut Rng,
    objs: &mut Vec<(zmem_pool::Handle, u64, usize)>,
) -> usize {
    let limit = pool.mem_limit().unwrap();
    let mut failures = 0;
    for i in 0..100_000u64 {
        let len = rng.range(100, 6000);
        let seed = rng.next_u64();
        let before = pool.stats();
        match pool.alloc(&common::content(seed, len)) {
            Ok(h) => objs.push((h, seed, len)),
            Err(PoolError::LimitExceeded {
                used,
                limit: l,
                needed,
            }) => {
                assert_eq!(l, limit);
                assert!(used + needed > limit);
                let after = pool.stats();
                assert_eq!(
                    after.objects, before.objects,
                    "failed alloc changed objects"
                );
                assert_eq!(after.mem_used_total, before.mem_used_total);
                assert_eq!(after.spans, before.spans);
                failures += 1;
                // Keep trying other sizes for a while: some still fit in partial spans.
                if failures >= 50 {
                    return i as usize;
                }
            }
            Err(e) => panic!("unexpected error {e}"),
        }
        assert!(pool.stats().mem_used_total <= limit);
    }
    panic!("limit never reached");
}

#[test]
fn limit_is_enforced_and_can_be_raised() {
    let limit = 1 << 20;
    let pool = Pool::new(PoolConfig {
        mem_limit: Some(limit),
        ..PoolConfig::default()
    })
    .unwrap();
    assert_eq!(pool.mem_limit(), Some(limit));
    let mut rng = Rng::new(1);
    let mut objs = Vec::new();
    fill_until_limit(&pool, &mut rng, &mut objs);
    let s = pool.stats();
    assert!(s.mem_used_total <= limit && s.mem_used_max <= limit);
    assert!(
        s.mem_used_total > limit / 2,
        "limit reached far too early: {s:?}"
    );
    let n1 = objs.len();
    for &(h, seed, len) in &objs {
        common::check(&pool, h, seed, len);
    }

    pool.set_mem_limit(Some(2 * limit));
    assert_eq!(pool.mem_limit(), Some(2 * limit));
    fill_until_limit(&pool, &mut rng, &mut objs);
    assert!(objs.len() > n1, "raising the limit allowed nothing");
    let s = pool.stats();
    assert!(s.mem_used_total <= 2 * limit && s.mem_used_max <= 2 * limit);
    for &(h, seed, len) in &objs {
        common::check(&pool, h, seed, len);
    }

    // Lowering below the current use frees nothing, but new spans are refused.
    pool.set_mem_limit(Some(0));
    assert!(matches!(
        pool.alloc(&[1u8; 60_000]),
        Err(PoolError::LimitExceeded { .. })
    ));
    for &(h, seed, len) in &objs {
        common::check(&pool, h, seed, len);
    }
    // Frees still work and release memory.
    for &(h, _, _) in &objs {
        pool.free(h).unwrap();
    }
    assert_eq!(pool.stats().mem_used_total, 0);

    pool.set_mem_limit(None);
    assert_eq!(pool.mem_limit(), None);
    let h = pool.alloc(&[9u8; 60_000]).unwrap();
    assert_eq!(pool.object_len(h), Ok(60_000));
}

#[test]
fn concurrent_allocations_never_exceed_limit() {
    let limit = 4 << 20;
    let pool = Arc::new(
        Pool::new(PoolConfig {
            mem_limit: Some(limit),
            ..PoolConfig::default()
        })
        .unwrap(),
    );
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let pool = Arc::clone(&pool);
            std::thread::spawn(move || {
                let mut rng = Rng::new(100 + t);
                let mut objs = Vec::new();
                let mut refused = 0;
                while refused < 200 {
                    let len = rng.range(1, 20_000);
                    let seed = rng.next_u64();
                    match pool.alloc(&common::content(seed, len)) {
                        Ok(h) => objs.push((h, seed, len)),
                        Err(PoolError::LimitExceeded { .. }) => {
                            refused += 1;
                            // Free a little now and then so spans come and go.
                            if refused % 20 == 0 && !objs.is_empty() {
                                let i = rng.range(0, objs.len() - 1);
                                let (h, _, _) = objs.swap_remove(i);
                                pool.free(h).unwrap();
                            }
                        }
                        Err(e) => panic!("unexpected error {e}"),
                    }
                    assert!(pool.stats().mem_used_total <= limit);
                }
                for &(h, seed, len) in &objs {
                    common::check(&pool, h, seed, len);
                }
                objs.len()
            })
        })
        .collect();
    let total: usize = threads.into_iter().map(|t| t.join().unwrap()).sum();
    let s = pool.stats();
    assert_eq!(s.objects, total as u64);
    assert!(s.mem_used_max <= limit, "{s:?}");
}
