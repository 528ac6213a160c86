//! Random operation sequences checked against a HashMap model.

mod common;

use std::collections::HashMap;

use proptest::prelude::*;
use zmem_pool::{Handle, Pool, PoolConfig, PoolError};

#[derive(Debug, Clone)]
enum Op {
    Alloc { size: usize, seed: u64 },
    Free(usize),
    Read(usize),
    FreeStale(usize),
    Garbage(u64),
    Compact,
}

fn ops(max: usize) -> impl Strategy<Value = Vec<Op>> {
    let size = prop_oneof![1..=64usize, 1..=max.min(4096), 1..=max];
    let op = prop_oneof![
        5 => (size, any::<u64>()).prop_map(|(size, seed)| Op::Alloc { size, seed }),
        3 => any::<usize>().prop_map(Op::Free),
        2 => any::<usize>().prop_map(Op::Read),
        1 => any::<usize>().prop_map(Op::FreeStale),
        1 => any::<u64>().prop_map(Op::Garbage),
        1 => Just(Op::Compact),
    ];
    proptest::collection::vec(op, 1..200)
}

fn check_model(pool: &Pool, live: &HashMap<Handle, (u64, usize)>) {
    let s = pool.stats();
    assert_eq!(s.objects, live.len() as u64);
    let bytes: u64 = live.values().map(|&(_, len)| len as u64).sum();
    assert_eq!(s.object_bytes, bytes);
    assert!(s.mem_used_total >= s.object_bytes);
    assert!(s.mem_used_max >= s.mem_used_total);
    assert_eq!(s.mem_used_total == 0, s.spans + s.split_objects == 0);
    let split = live.values().filter(|&&(_, len)| pool.splits(len)).count();
    assert_eq!(s.split_objects, split as u64);
}

fn run(config: PoolConfig, ops: Vec<Op>) {
    let max = config.max_object_size;
    let pool = Pool::new(config).unwrap();
    let mut live: HashMap<Handle, (u64, usize)> = HashMap::new();
    let mut order: Vec<Handle> = Vec::new();
    let mut stale: Vec<Handle> = Vec::new();
    for op in ops {
        match op {
            Op::Alloc { size, seed } => {
                let data = common::content(seed, size);
                let h = pool.alloc(&data).unwrap();
                assert!(size <= max);
                assert!(
                    live.insert(h, (seed, size)).is_none(),
                    "handle reused while live"
                );
                order.push(h);
            }
            Op::Free(i) if !order.is_empty() => {
                let h = order.swap_remove(i % order.len());
                live.remove(&h).unwrap();
                pool.free(h).unwrap();
                stale.push(h);
            }
            Op::Read(i) if !order.is_empty() => {
                let h = order[i % order.len()];
                let (seed, len) = live[&h];
                common::check(&pool, h, seed, len);
            }
            Op::FreeStale(i) if !stale.is_empty() => {
                let h = stale[i % stale.len()];
                let invalid = Some(PoolError::InvalidHandle(h.to_raw()));
                assert_eq!(pool.free(h).err(), invalid);
                assert_eq!(pool.object_len(h).err(), invalid);
                assert_eq!(pool.with_object(h, |b| b.len()).err(), invalid);
            }
            Op::Garbage(v) => {
                if let Some(h) = Handle::from_raw(v) {
                    if !live.contains_key(&h) {
                        let invalid = Some(PoolError::InvalidHandle(v));
                        assert_eq!(pool.free(h).err(), invalid);
                        assert_eq!(pool.object_len(h).err(), invalid);
                        assert_eq!(pool.with_object(h, |_| ()).err(), invalid);
                    }
                }
            }
            Op::Compact => {
                pool.compact();
                for (&h, &(seed, len)) in &live {
                    common::check(&pool, h, seed, len);
                }
            }
            _ => {}
        }
        check_model(&pool, &live);
    }
    for (&h, &(seed, len)) in &live {
        common::check(&pool, h, seed, len);
    }
    for h in order {
        pool.free(h).unwrap();
        assert!(pool.free(h).is_err());
    }
    let s = pool.stats();
    assert_eq!(
        (s.objects, s.object_bytes, s.spans, s.mem_used_total),
        (0, 0, 0, 0)
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn default_config_matches_model(ops in ops(PoolConfig::default().max_object_size)) {
        run(PoolConfig::default(), ops);
    }

    #[test]
    fn unsplit_large_objects_match_model(ops in ops(PoolConfig::default().max_object_size)) {
        run(PoolConfig { split_large_objects: false, ..PoolConfig::default() }, ops);
    }

    #[test]
    fn small_config_matches_model(ops in ops(3000)) {
        run(PoolConfig { max_object_size: 3000, max_span_pages: 2, ..PoolConfig::default() }, ops);
    }
}
