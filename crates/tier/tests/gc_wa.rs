//! Write amplification of the collector under random overwrites at 80% live data: the log is
//! filled to 80% of its capacity with objects of 1-3 KiB (compressed pages), then pages are
//! rewritten (the old copy freed, the new one written) in batches that fill a segment, as a
//! store writes back. WA = device bytes / owner bytes over the rewrite phase (LogStats). The
//! collector is the log's own (the background thread, and writers collecting when only the
//! reserve is left).
//!
//! A write the log refuses (`Full`) drops its pages from the log, as a store keeps them in
//! DRAM; they come back the next time they are rewritten.

mod common;

use common::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zmem_tier::{LogConfig, TierError};

struct Run {
    wa: f64,
    batches: u64,
    refused: u64,
}

fn run(threshold: f64, pick: &dyn Fn(&mut StdRng, u64) -> u64) -> Run {
    const SEGMENTS: u32 = 512;
    let mut cfg: LogConfig = cfg(256 << 10, true);
    cfg.gc_threshold = threshold;
    cfg.reserve_segments = 4;
    let seg = cfg.segment_size;
    let (log, _io) = mem_log_cfg(cfg, SEGMENTS);
    let c = Client::new(&log);
    let mut rng = StdRng::seed_from_u64(7);
    let target = (u64::from(SEGMENTS) * seg as u64) * 8 / 10;
    let mut sizes: Vec<usize> = Vec::new();
    let mut total = 0u64;
    while total < target {
        let n = rng.random_range(1024..3072);
        sizes.push(n);
        total += n as u64;
    }
    let pages = sizes.len() as u64;
    let mut version = vec![0u64; pages as usize];
    // What one object costs in a segment: payload + tag, padded, + its header entry.
    let cost = |n: usize| (n + 16).div_ceil(16) * 16 + 24;
    let room = seg - 48;
    let write = |list: &[u64], version: &[u64]| -> Result<(), TierError> {
        let batch: Vec<(u64, Vec<u8>)> = list
            .iter()
            .map(|&i| (i, page(i, version[i as usize], sizes[i as usize])))
            .collect();
        c.write(&batch)
    };
    let mut next = 0u64;
    while next < pages {
        let mut list = Vec::new();
        let mut b = 0;
        while next < pages && b + cost(sizes[next as usize]) <= room {
            list.push(next);
            b += cost(sizes[next as usize]);
            next += 1;
        }
        write(&list, &version).expect("the live set fits");
    }
    let start = log.stats();
    let (mut written, mut batches, mut refused) = (0u64, 0u64, 0u64);
    while written < 2 * target {
        let (mut list, mut b, mut bytes) = (Vec::new(), 0, 0);
        loop {
            let p = pick(&mut rng, pages);
            if list.contains(&p) {
                continue;
            }
            if b + cost(sizes[p as usize]) > room {
                break;
            }
            list.push(p);
            b += cost(sizes[p as usize]);
            bytes += sizes[p as usize] as u64;
        }
        for &p in &list {
            version[p as usize] += 1;
        }
        batches += 1;
        match write(&list, &version) {
            Ok(()) => written += bytes,
            Err(TierError::Full { .. }) => {
                refused += 1;
                for &p in &list {
                    c.discard(p);
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
    let end = log.stats();
    c.check_all();
    Run {
        wa: (end.device_bytes_written - start.device_bytes_written) as f64
            / (end.bytes_written - start.bytes_written) as f64,
        batches,
        refused,
    }
}

fn uniform(r: &mut StdRng, n: u64) -> u64 {
    r.random_range(0..n)
}

/// 90% of the rewrites go to 10% of the pages.
fn hot_cold(r: &mut StdRng, n: u64) -> u64 {
    let hot = (n / 10).max(1);
    if r.random_bool(0.9) {
        r.random_range(0..hot)
    } else {
        r.random_range(hot..n)
    }
}

fn report(name: &str, threshold: f64, r: &Run) {
    eprintln!(
        "{name}, gc_threshold {threshold}: WA {:.3}, {} of {} batches refused (Full)",
        r.wa, r.refused, r.batches
    );
}

#[test]
fn skewed_rewrites_at_80_percent_live_stay_under_2() {
    // The collector free to take any segment: cost-benefit keeps hot and cold apart.
    let r = run(1.0, &hot_cold);
    report("hot/cold 90/10", 1.0, &r);
    assert!(r.wa <= 2.0, "WA {:.3}", r.wa);
    assert!(r.refused * 100 <= r.batches, "at most 1% refused");
    // The default threshold bounds WA by construction (victims at most half live), at the
    // price of refusing writes when no segment is that empty.
    let r = run(0.5, &hot_cold);
    report("hot/cold 90/10", 0.5, &r);
    assert!(r.wa <= 2.0, "WA {:.3}", r.wa);
}

#[test]
fn uniform_rewrites_at_80_percent_live() {
    // Uniform random rewrites at 80% live have no cold data to leave alone: any cleaner's
    // victims sit near the mean live fraction (an LFS/greedy model gives about 0.7 at this
    // occupancy, with the log's per-object overhead and reserve: WA = 1 / (1 - 0.7) ~ 3.3).
    let r = run(1.0, &uniform);
    report("uniform", 1.0, &r);
    assert!(r.wa <= 3.6, "WA {:.3}", r.wa);
    assert!(r.refused * 50 <= r.batches, "at most 2% refused");
    // With the default threshold WA stays near 2 (victims under half live; tags, headers and
    // padding add ~2-4%) and the log refuses what it cannot place that cheaply.
    let r = run(0.5, &uniform);
    report("uniform", 0.5, &r);
    assert!(r.wa <= 2.1, "WA {:.3}", r.wa);
}
