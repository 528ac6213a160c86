//! Eviction in groups (several evicted pages compressed as one block): the program's view
//! must stay exactly what it wrote. Each test skips where /dev/userfaultfd cannot be opened.

use std::sync::Arc;

use zmem_engine::Policy;
use zmem_region::{default_evict_group, Budget, Region, RegionConfig, RegionError, PAGE};

mod support;
use support::*;

fn grouped(size: u64, budget: u64, group: usize) -> Option<Region> {
    let mut cfg = RegionConfig::new(size, Budget::Fixed(budget));
    cfg.policy = Policy::Max;
    cfg.evict_group = Some(group);
    region_with(cfg)
}

#[test]
fn the_group_size_is_checked_and_defaults_by_policy() {
    for bad in [0usize, zmem_store::MAX_BLOCK_PAGES + 1] {
        let mut cfg = RegionConfig::new(MIB, Budget::Fixed(MIB));
        cfg.evict_group = Some(bad);
        match cfg.validate() {
            Err(RegionError::Config(msg)) => assert!(msg.contains("evict_group"), "{msg}"),
            Err(e) => panic!("wrong error: {e}"),
            Ok(()) => panic!("accepted evict_group {bad}"),
        }
    }
    for p in Policy::ALL {
        assert!((1..=zmem_store::MAX_BLOCK_PAGES).contains(&default_evict_group(p)));
    }
    // Measured: groups lose ratio and time wherever evicted pages refault (policy.rs).
    for p in Policy::ALL {
        assert_eq!(default_evict_group(p), 1, "{p}");
    }
}

#[test]
fn random_access_round_trips_with_groups_and_repacks() {
    for group in [2usize, 8, 16] {
        let Some(r) = grouped(16 * MIB, MIB, group) else {
            return;
        };
        let pages = r.len() / PAGE;
        let mut ver = vec![0u64; pages];
        for (i, v) in ver.iter_mut().enumerate() {
            *v = 1;
            fill(page_mut(&r, i), i, 1);
        }
        let mut x = 0x5EED_u64 + group as u64;
        for _ in 0..30_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let i = (x as usize) % pages;
            if x & 1 == 0 {
                ver[i] += 1;
                fill(page_mut(&r, i), i, ver[i]);
            } else {
                check(page_mut(&r, i), i, ver[i]);
            }
        }
        for (i, &v) in ver.iter().enumerate() {
            check(page_mut(&r, i), i, v);
        }
        let s = r.stats();
        assert!(
            s.store.block_pages > 0,
            "group {group}: no blocks: {:?}",
            s.store
        );
        assert!(s.store.repacked_pages > 0, "group {group}: no repacks");
        assert_eq!(s.store_refused, 0);
    }
}

#[test]
fn threads_and_sequential_faults_on_grouped_pages() {
    let Some(r) = grouped(32 * MIB, 2 * MIB, 8) else {
        return;
    };
    let r = Arc::new(r);
    let pages = r.len() / PAGE;
    let threads = 4;
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            let r = r.clone();
            std::thread::spawn(move || {
                let mine: Vec<usize> = (t..pages).step_by(threads).collect();
                let mut ver = vec![0u64; mine.len()];
                let mut x = 77 + t as u64;
                for round in 0..3 {
                    // A sequential pass (fault-around over grouped pages), then random.
                    for (k, &i) in mine.iter().enumerate() {
                        if round == 0 {
                            ver[k] = 1;
                            fill(page_mut(&r, i), i, 1);
                        } else {
                            check(page_mut(&r, i), i, ver[k]);
                        }
                    }
                    for _ in 0..5000 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let k = (x as usize) % mine.len();
                        if x & 3 == 0 {
                            ver[k] += 1;
                            fill(page_mut(&r, mine[k]), mine[k], ver[k]);
                        } else {
                            check(page_mut(&r, mine[k]), mine[k], ver[k]);
                        }
                    }
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert!(r.stats().store.block_pages > 0);
}

#[test]
fn a_full_store_keeps_grouped_pages_resident() {
    let mut cfg = RegionConfig::new(16 * MIB, Budget::Fixed(MIB));
    cfg.policy = Policy::Max;
    cfg.evict_group = Some(8);
    cfg.store_limit = Some(256 * 1024);
    let Some(r) = region_with(cfg) else {
        return;
    };
    // Half of the pages compress (they share blocks), half do not (their groups fall back
    // to pages stored one by one, raw): the limit is hit on both paths.
    let noise = |idx: usize| -> Vec<u8> {
        let mut x = (idx as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..PAGE)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x as u8
            })
            .collect()
    };
    let pages = r.len() / PAGE;
    for i in 0..pages {
        if i % 2 == 0 {
            fill(page_mut(&r, i), i, 3);
        } else {
            page_mut(&r, i).copy_from_slice(&noise(i));
        }
    }
    for i in 0..pages {
        if i % 2 == 0 {
            check(page_mut(&r, i), i, 3);
        } else {
            assert!(page_mut(&r, i) == &noise(i)[..], "page {i}");
        }
    }
    let s = r.stats();
    assert!(
        s.store_refused > 0,
        "the limit was never hit: {:?}",
        s.store
    );
    assert!(s.store.mem_used_total <= 256 * 1024);
}

#[test]
fn fork_sees_grouped_pages() {
    let Some(r) = grouped(8 * MIB, MIB, 16) else {
        return;
    };
    let pages = r.len() / PAGE;
    for i in 0..pages {
        fill(page_mut(&r, i), i, 5);
    }
    assert!(r.stats().store.block_pages > 0);
    // SAFETY: the child only touches memory and calls _exit (no allocation, no locks).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let mut code = 0;
        for i in 0..pages {
            if !matches(page_mut(&r, i), i, 5) {
                code = 10;
                break;
            }
        }
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    for i in (0..pages).step_by(3) {
        fill(page_mut(&r, i), i, 6);
    }
    wait_for_child(pid);
    for i in 0..pages {
        check(page_mut(&r, i), i, if i % 3 == 0 { 6 } else { 5 });
    }
}
