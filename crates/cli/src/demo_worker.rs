//! The program `zmem demo` runs under `zmem run`: zmem's own binary re-executed as a hidden
//! subcommand, so the demo needs nothing installed. It is a malloc-heavy key-value program: a
//! `HashMap` of heap-allocated values (Rust's System allocator calls malloc, which the preload
//! library serves), filled with JSON log records generated deterministically from each key, so
//! the data compresses like real application data (words, numbers, ids) rather than trivially,
//! and every value can be regenerated to check it. Phases: fill, update an eighth of the values
//! (new sizes: frees and reallocations), Zipf-skewed reads, then a check of every value.
//!
//! It talks to `zmem demo` through lines on stdout (`zmem-demo <word> ...`): phases and
//! progress, `ready PID` when all the data is in (it then waits for a line on stdin while the
//! parent reads its statistics, with `--pause-for-stat`), and `result JSON` at the end. A
//! mismatch is an error naming the key, and the exit status is 1.

use std::collections::HashMap;
use std::io::{BufRead, Write};
use std::time::Instant;

use anyhow::bail;
use clap::Args;
use serde::{Deserialize, Serialize};

use crate::size::parse_size;

/// The prefix of every protocol line.
pub const TAG: &str = "zmem-demo";

#[derive(Debug, Clone, Args)]
pub struct WorkerArgs {
    /// Bytes of values to store.
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub size: u64,
    /// After the reads, print `ready PID` and wait for a line on stdin before the check.
    #[arg(long)]
    pub pause_for_stat: bool,
    /// Flip one byte of this key's value before the check (tests that the check catches it).
    #[arg(long, hide = true)]
    pub corrupt_key: Option<u64>,
}

/// What the worker reports at the end.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WorkerResult {
    pub keys: u64,
    /// Bytes of values held at the end (after the updates).
    pub value_bytes: u64,
    pub updated: u64,
    pub reads: u64,
    pub verified: u64,
    pub fill_s: f64,
    pub update_s: f64,
    pub read_s: f64,
    pub verify_s: f64,
}

/// Words of the log messages, most frequent first (picked with a skew, as in real text).
const WORDS: [&str; 96] = [
    "the",
    "request",
    "user",
    "order",
    "session",
    "cache",
    "failed",
    "completed",
    "for",
    "with",
    "from",
    "payment",
    "item",
    "retry",
    "timeout",
    "connection",
    "database",
    "query",
    "slow",
    "accepted",
    "rejected",
    "token",
    "expired",
    "refresh",
    "account",
    "inventory",
    "shipment",
    "warehouse",
    "customer",
    "invoice",
    "discount",
    "coupon",
    "applied",
    "checkout",
    "cart",
    "added",
    "removed",
    "updated",
    "created",
    "deleted",
    "profile",
    "address",
    "email",
    "sent",
    "queued",
    "delivered",
    "bounced",
    "upstream",
    "downstream",
    "service",
    "latency",
    "exceeded",
    "threshold",
    "budget",
    "recovered",
    "healthy",
    "degraded",
    "node",
    "replica",
    "primary",
    "leader",
    "election",
    "snapshot",
    "compaction",
    "segment",
    "flushed",
    "index",
    "rebuilt",
    "search",
    "results",
    "empty",
    "page",
    "next",
    "cursor",
    "batch",
    "job",
    "scheduled",
    "started",
    "finished",
    "worker",
    "pool",
    "exhausted",
    "limit",
    "rate",
    "throttled",
    "client",
    "server",
    "handshake",
    "tls",
    "certificate",
    "renewed",
    "config",
    "reloaded",
    "feature",
    "flag",
    "audit",
];
const LEVELS: [&str; 4] = ["INFO", "INFO", "WARN", "ERROR"];
const SERVICES: [&str; 8] = [
    "checkout", "catalog", "auth", "search", "billing", "shipping", "gateway", "notify",
];
const METHODS: [&str; 4] = ["GET", "GET", "POST", "PUT"];
const STATUS: [u16; 8] = [200, 200, 200, 201, 204, 404, 429, 500];

/// splitmix64: a small, fast, deterministic generator.
struct Rng(u64);

impl Rng {
    fn new(key: u64, version: u32) -> Rng {
        Rng(key
            .wrapping_mul(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(u64::from(version) << 40 | 0x5EED))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    /// An index below `n`, small ones far more likely (about Zipf's law).
    fn skewed(&mut self, n: u64) -> u64 {
        let u = (self.next() >> 11) as f64 / (1u64 << 53) as f64;
        ((n as f64) * u * u * u) as u64 % n
    }
}

/// The value of `key` at `version` (0 at fill, 1 once updated): JSON log records, one per line,
/// 256 bytes to ~4 KiB in all.
pub fn value(key: u64, version: u32, out: &mut Vec<u8>) {
    out.clear();
    let mut r = Rng::new(key, version);
    let target = 256 + r.below(3840) as usize;
    let user = r.below(50_000);
    let service = SERVICES[r.below(8) as usize];
    let mut ts = 1_700_000_000_000 + key * 1_000 + r.below(1_000);
    while out.len() < target {
        ts += r.below(5_000);
        let level = LEVELS[r.skewed(4) as usize];
        let method = METHODS[r.below(4) as usize];
        let status = STATUS[r.skewed(8) as usize];
        let _ = write!(
            out,
            "{{\"ts\":{ts},\"level\":\"{level}\",\"service\":\"{service}\",\"host\":\"{service}-{:02}\",\
             \"trace\":\"{:016x}\",\"user\":{user},\"req\":\"{method} /api/v1/{service}/{}\",\
             \"status\":{status},\"ms\":{}.{},\"msg\":\"",
            r.below(24),
            r.next(),
            r.below(100_000),
            r.skewed(2_000),
            r.below(10),
        );
        for i in 0..4 + r.below(9) {
            if i > 0 {
                out.push(b' ');
            }
            out.extend_from_slice(WORDS[r.skewed(WORDS.len() as u64) as usize].as_bytes());
        }
        out.extend_from_slice(b"\"}\n");
    }
}

/// The version a key has after the update phase.
fn version_of(key: u64) -> u32 {
    u32::from(key % 8 == 3)
}

/// Progress lines: at most 100 per phase.
struct Phase<'a> {
    out: &'a mut dyn Write,
    total: u64,
    step: u64,
    next: u64,
}

impl<'a> Phase<'a> {
    fn start(out: &'a mut dyn Write, name: &str, total: u64) -> anyhow::Result<Phase<'a>> {
        writeln!(out, "{TAG} phase {name} {total}")?;
        out.flush()?;
        let step = (total / 100).max(1);
        Ok(Phase {
            out,
            total,
            step,
            next: step,
        })
    }
    fn at(&mut self, done: u64) -> anyhow::Result<()> {
        if done >= self.next || done == self.total {
            writeln!(self.out, "{TAG} progress {done}")?;
            self.out.flush()?;
            self.next = done + self.step;
        }
        Ok(())
    }
}

/// `zmem demo-worker`.
pub fn run(a: &WorkerArgs) -> anyhow::Result<()> {
    if a.size < (1 << 20) {
        bail!("--size {} is too small: at least 1M", a.size);
    }
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let mut map: HashMap<u64, Vec<u8>> = HashMap::new();
    let mut buf = Vec::new();

    let t = Instant::now();
    let mut held = 0u64;
    let mut keys = 0u64;
    {
        let mut p = Phase::start(&mut out, "fill", a.size)?;
        while held < a.size {
            value(keys, 0, &mut buf);
            held += buf.len() as u64;
            map.insert(keys, buf.clone());
            keys += 1;
            p.at(held.min(a.size))?;
        }
    }
    let fill_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let mut updated = 0;
    {
        let mut p = Phase::start(&mut out, "update", keys)?;
        for k in 0..keys {
            if version_of(k) == 1 {
                value(k, 1, &mut buf);
                let old = map.insert(k, buf.clone()).map_or(0, |v| v.len() as u64);
                held = held - old + buf.len() as u64;
                updated += 1;
            }
            p.at(k + 1)?;
        }
    }
    let update_s = t.elapsed().as_secs_f64();

    let t = Instant::now();
    let reads = keys / 2;
    let mut sum = 0u64;
    {
        let mut r = Rng::new(keys, 7);
        let mut p = Phase::start(&mut out, "read", reads)?;
        for i in 0..reads {
            let k = r.skewed(keys);
            let v = map.get(&k).map(Vec::as_slice).unwrap_or_default();
            sum = v.iter().fold(sum, |s, &b| s.wrapping_add(u64::from(b)));
            p.at(i + 1)?;
        }
    }
    std::hint::black_box(sum);
    let read_s = t.elapsed().as_secs_f64();

    if a.pause_for_stat {
        writeln!(out, "{TAG} ready {}", std::process::id())?;
        out.flush()?;
        let mut line = String::new();
        std::io::stdin().lock().read_line(&mut line)?;
    }
    if let Some(k) = a.corrupt_key {
        match map.get_mut(&k).and_then(|v| v.get_mut(100)) {
            Some(b) => *b ^= 0x20,
            None => bail!("--corrupt-key {k}: no such key (the demo has {keys})"),
        }
    }

    let t = Instant::now();
    {
        let mut p = Phase::start(&mut out, "verify", keys)?;
        for k in 0..keys {
            value(k, version_of(k), &mut buf);
            let Some(v) = map.get(&k) else {
                bail!("key {k} is missing from the map");
            };
            if *v != buf {
                let at = v.iter().zip(&buf).position(|(a, b)| a != b);
                bail!(
                    "the value of key {k} is wrong: {} bytes, expected {}; first difference at byte {}",
                    v.len(),
                    buf.len(),
                    at.map_or("(end)".to_string(), |i| i.to_string())
                );
            }
            p.at(k + 1)?;
        }
    }
    let verify_s = t.elapsed().as_secs_f64();
    let result = WorkerResult {
        keys,
        value_bytes: held,
        updated,
        reads,
        verified: keys,
        fill_s,
        update_s,
        read_s,
        verify_s,
    };
    writeln!(out, "{TAG} result {}", serde_json::to_string(&result)?)?;
    out.flush()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_deterministic_and_differ_by_key_and_version() {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        value(42, 0, &mut a);
        value(42, 0, &mut b);
        assert_eq!(a, b);
        value(43, 0, &mut b);
        assert_ne!(a, b);
        value(42, 1, &mut b);
        assert_ne!(a, b);
        assert!(a.len() >= 256 && a.len() < 4096 + 1024, "{}", a.len());
        let text = std::str::from_utf8(&a).unwrap();
        assert!(text.lines().all(|l| l.starts_with("{\"ts\":")), "{text}");
    }

    /// The data is there to show a real codec at work: neither incompressible nor trivial.
    #[test]
    fn values_compress_like_application_data() {
        let mut heap = Vec::new();
        let mut v = Vec::new();
        for k in 0..2000 {
            value(k, 0, &mut v);
            heap.extend_from_slice(&v);
        }
        let pages = heap.len() / 4096;
        let mut dst = vec![0u8; 8192];
        let mut compressed = 0;
        let mut cctx = zstd_safe::CCtx::create();
        for p in heap.chunks_exact(4096) {
            compressed += cctx.compress(&mut dst[..], p, 1).unwrap();
        }
        let ratio = (pages * 4096) as f64 / compressed as f64;
        eprintln!("zstd-1 on 4 KiB pages: {ratio:.2}x");
        assert!((2.0..5.0).contains(&ratio), "ratio {ratio:.2}");
    }
}
