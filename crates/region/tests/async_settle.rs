//! Handlers that leave compression to the evictor (`RegionConfig::async_settle`, the default)
//! against handlers that compress themselves: the budget holds and every page reads back as
//! last written, from one thread and from several, while batches wait to be settled (pages
//! faulted back from their staging slot, written again, evicted again).

use std::sync::Arc;

use zmem_region::{Budget, Region, RegionConfig, PAGE};

mod support;
use support::*;

fn region_settling(size: u64, budget: u64, async_settle: bool) -> Option<Region> {
    let mut cfg = RegionConfig::new(size, Budget::Fixed(budget));
    cfg.async_settle = async_settle;
    region_with(cfg)
}

/// Random reads and writes over pages `[from, to)`, checked against the versions written.
fn random_phase(r: &Region, from: usize, to: usize, seed: u64, steps: u64) {
    let mut version = vec![1u64; to - from];
    for (k, i) in (from..to).enumerate() {
        fill(page_mut(r, i), i, version[k]);
    }
    let mut x = seed;
    for step in 0..steps {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let k = (x >> 33) as usize % (to - from);
        if step % 2 == 0 {
            version[k] += 1;
            fill(page_mut(r, from + k), from + k, version[k]);
        } else {
            check(page_mut(r, from + k), from + k, version[k]);
        }
    }
    for (k, v) in version.iter().enumerate() {
        check(page_mut(r, from + k), from + k, *v);
    }
}

#[test]
fn a_fill_keeps_the_budget_and_reads_back() {
    for async_settle in [true, false] {
        let Some(r) = region_settling(64 * MIB, 4 * MIB, async_settle) else {
            return;
        };
        let pages = r.len() / PAGE;
        fill_and_check_all(&r, 1);
        let s = r.stats();
        assert!(s.evictions as usize >= pages - 1024, "{s:?}");
        assert!(s.resident <= s.budget, "async {async_settle}: {s:?}");
        fill_and_check_all(&r, 2);
    }
}

#[test]
fn random_writes_and_reads_keep_the_budget_and_every_byte() {
    for async_settle in [true, false] {
        let Some(r) = region_settling(64 * MIB, 16 * MIB, async_settle) else {
            return;
        };
        random_phase(&r, 0, r.len() / PAGE, 12345, 200_000);
        let s = r.stats();
        assert!(s.major_faults > 50_000, "async {async_settle}: {s:?}");
        assert!(
            s.resident <= s.budget,
            "async {async_settle}: resident {} budget {}",
            s.resident,
            s.budget
        );
    }
}

#[test]
fn threads_faulting_together_keep_every_byte() {
    let Some(r) = region_settling(64 * MIB, 8 * MIB, true) else {
        return;
    };
    let r = Arc::new(r);
    let pages = r.len() / PAGE;
    let threads: Vec<_> = (0..4)
        .map(|t| {
            let r = r.clone();
            std::thread::spawn(move || {
                let per = pages / 4;
                random_phase(&r, t * per, (t + 1) * per, 99 + t as u64, 40_000);
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = r.stats();
    assert!(s.evictions > 10_000, "{s:?}");
}
