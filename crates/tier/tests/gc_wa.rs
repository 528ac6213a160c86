//! Write amplification of the collector under random overwrites at 80% live data.

mod common;

use common::*;
use rand::{Rng, SeedableRng};
use zmem_tier::{LogConfig, TierError};

struct Run {
    wa: f64,
    full: u64,
    moves: u64,
}

/// Fills the log to `live` of its capacity with objects of 1-3 KiB, then overwrites pages
/// picked by `pick` in batches of about 7/8 of a segment (as the store writes back), for
/// `rounds` times the live set. WA is measured over the overwrite phase only.
fn run(
    cfg: LogConfig,
    segments: u32,
    live: f64,
    rounds: f64,
    pick: &dyn Fn(&mut rand::rngs::StdRng, u64) -> u64,
    drive: bool,
) -> Run {
    let seg = cfg.segment_size;
    let reserve = cfg.reserve_segments;
    let (log, _io) = mem_log_cfg(cfg, segments);
    let c = Client::new(&log);
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let capacity = segments as u64 * seg as u64;
    let target = (capacity as f64 * live) as u64;
    // A batch fills one segment: payload + tag + padding + header entry per object.
    let cost = |n: usize| (n + 16).div_ceil(16) * 16 + 24;
    let room = seg - 48;
    let mut sizes: Vec<usize> = Vec::new();
    let mut total = 0u64;
    while total < target {
        let n = rng.random_range(1024..3072);
        sizes.push(n);
        total += n as u64;
    }
    let pages = sizes.len() as u64;
    let mut version = vec![0u64; pages as usize];
    let write_batch = |list: &[u64], version: &[u64]| -> Result<(), TierError> {
        let batch: Vec<(u64, Vec<u8>)> = list
            .iter()
            .map(|&i| (i, page(i, version[i as usize], sizes[i as usize])))
            .collect();
        c.write(&batch)
    };
    // Fill.
    let mut i = 0u64;
    while i < pages {
        let mut list = Vec::new();
        let mut b = 0;
        while i < pages && b + cost(sizes[i as usize]) <= room {
            list.push(i);
            b += cost(sizes[i as usize]);
            i += 1;
        }
        write_batch(&list, &version).expect("the live set fits");
    }
    let start = log.stats();
    let mut full = 0u64;
    let mut written = 0u64;
    let goal = (target as f64 * rounds) as u64;
    while written < goal {
        let mut list = Vec::new();
        let mut b = 0;
        let mut bytes = 0;
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
            bytes += sizes[p as usize];
        }
        for &p in &list {
            version[p as usize] += 1;
        }
        let low = 2 * reserve as u64 + 1;
        while log.stats().segments_free <= low {
            if !drive || log.experiment_collect(8, true) == 0 {
                break;
            }
        }
        match write_batch(&list, &version) {
            Ok(()) => written += bytes as u64,
            Err(TierError::Full { .. }) => {
                // The store keeps such pages in DRAM; here they are dropped from the log.
                full += 1;
                for &p in &list {
                    c.discard(p);
                }
                // Put them back later, once collected.
                log.collect(8);
                let back: Vec<u64> = list.clone();
                if write_batch(&back, &version).is_err() {
                    full += 1;
                }
            }
            Err(e) => panic!("{e}"),
        }
    }
    let end = log.stats();
    c.check_all();
    let user = end.bytes_written - start.bytes_written;
    let dev = end.device_bytes_written - start.device_bytes_written;
    Run {
        wa: dev as f64 / user as f64,
        full,
        moves: end.gc_moves - start.gc_moves,
    }
}

fn uniform(r: &mut rand::rngs::StdRng, n: u64) -> u64 {
    r.random_range(0..n)
}

/// 90% of overwrites go to 10% of the pages (hot data is rewritten, cold data stays).
fn hot_cold(r: &mut rand::rngs::StdRng, n: u64) -> u64 {
    let hot = (n / 10).max(1);
    if r.random_bool(0.9) {
        r.random_range(0..hot)
    } else {
        r.random_range(hot..n)
    }
}

fn cfg_wa(threshold: f64) -> LogConfig {
    let mut c = cfg(256 << 10, true);
    c.gc_threshold = threshold;
    c.reserve_segments = 4;
    c
}

#[test]
fn write_amplification_at_80_percent_live() {
    for (name, pick) in [
        ("uniform", &uniform as &dyn Fn(&mut _, u64) -> u64),
        ("hot/cold 90/10", &hot_cold),
    ] {
        for thr in [1.0] {
            for drive in [false] {
                let r = run(cfg_wa(thr), 512, 0.8, 3.0, pick, drive);
                eprintln!(
                    "{name:16} threshold {thr} test-driven {drive}: WA {:.3}, full {}, gc moves {}",
                    r.wa, r.full, r.moves
                );
            }
        }
    }
}
