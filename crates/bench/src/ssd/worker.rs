//! `zmem bench ssd-worker`: one workload of `bench ssd` in this process, its report as one
//! JSON line on stdout ([`WorkerReport`]); a wrong read exits non-zero after the report.
//!
//! The workload's memory is allocated with the global allocator (malloc), so that under
//! `zmem run` it is zmem's heap; on the kernel side (`--cgroup`) the process first locks what
//! it has (code, histograms, buffers), then limits its cgroup to `--dram` above that baseline,
//! and only then allocates the workload, so that the workload alone competes for `--dram` on
//! both sides.
//!
//! What is timed is the access to the workload's memory: for an object, the compare of the
//! whole object with its expected content (a read) or the copy of its new content (a write); the
//! expected content is generated, and the version table read, before the clock starts. For the
//! bloom filter, the 8 bit probes of an operation.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

use anyhow::Context;
use hdrhistogram::Histogram;
use rand::{Rng, RngCore};
use serde::{Deserialize, Serialize};
use zmem_runenv::size::format_size;

use super::{Content, Mix, SsdWorkerArgs, WorkloadKind, BLOOM_HASHES};
use crate::kernel::memcg::{cg_read_u64, cg_write};
use crate::region::driver::{usage, Lat, Usage};
use crate::report::progress_bar;
use zmem_workload::small_rng;

/// Words of the bloom filter's background generated from one seed.
const CHUNK_WORDS: usize = 512;

/// Resource use of this process over a phase.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Rusage {
    pub major_faults: u64,
    pub minor_faults: u64,
    pub user_s: f64,
    pub sys_s: f64,
}

impl Rusage {
    fn since(u0: Usage) -> Rusage {
        let u1 = usage(false);
        Rusage {
            major_faults: u1.majflt.saturating_sub(u0.majflt),
            minor_faults: u1.minflt.saturating_sub(u0.minflt),
            user_s: u1.user_s - u0.user_s,
            sys_s: u1.sys_s - u0.sys_s,
        }
    }
}

/// The latency of one kind of operation.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Phase {
    /// "read", "write" (objects); "insert", "query-present", "query-absent" (bloom).
    pub name: String,
    pub latency: Lat,
}

/// What was checked and what was wrong. `failures` counts everything wrong; it must be 0.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Verify {
    /// Objects compared (objects); present queries and background words checked (bloom).
    pub checked: u64,
    pub failures: u64,
    pub first_failure: Option<String>,
    /// Bloom: present keys that did not hit (must be 0).
    pub present_misses: Option<u64>,
    /// Bloom: absent keys that hit, their rate, and the rate the filter's load gives.
    pub absent_hits: Option<u64>,
    pub false_positive_rate: Option<f64>,
    pub expected_false_positive_rate: Option<f64>,
    /// Bloom: whether the rate is within 5 standard deviations of the expected one.
    pub false_positive_rate_plausible: Option<bool>,
    /// Bloom: background bits found cleared in the sampled words (must be 0).
    pub bits_lost: Option<u64>,
}

impl Verify {
    fn fail(&mut self, what: impl FnOnce() -> String) {
        self.failures += 1;
        if self.first_failure.is_none() {
            self.first_failure = Some(what());
        }
    }
}

/// The kernel side's limit, as the worker set it.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct CgroupSetup {
    pub path: String,
    pub dram: u64,
    /// The worker's own memory when it set the limit (locked).
    pub baseline_bytes: u64,
    pub limit_bytes: u64,
    pub locked: bool,
}

/// One worker's report.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerReport {
    pub label: String,
    pub workload: WorkloadKind,
    pub array: u64,
    pub object_size: Option<u64>,
    pub objects: Option<u64>,
    pub mix: Option<Mix>,
    pub content: Content,
    pub seed: u64,
    /// Bytes of the objects' version table (one byte per object, malloc'd like the array).
    pub version_table_bytes: u64,
    /// The untimed fill (objects: every object written; bloom: the background bits).
    pub fill_s: f64,
    pub fill_usage: Rusage,
    /// Timed operations, and how many read and wrote (bloom: queries and inserts).
    pub ops: u64,
    pub reads: u64,
    pub writes: u64,
    /// Wall time of the operations, untimed parts included, and operations per second.
    pub run_s: f64,
    pub ops_per_s: f64,
    /// Every timed operation.
    pub latency: Lat,
    pub phases: Vec<Phase>,
    pub run_usage: Rusage,
    pub verify: Verify,
    pub cgroup: Option<CgroupSetup>,
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 100 s at 3 significant digits; larger values saturate.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static histogram bounds are valid")
}

/// A progress bar over `n` operations (hidden when stderr is not a terminal).
fn ops_bar(n: u64, msg: String) -> indicatif::ProgressBar {
    let pb = progress_bar(n, msg);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg:32} [{bar:30}] {pos}/{len} ops {per_sec} eta {eta}",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb
}

/// The contents of the objects: any object's words from (index, version) alone.
pub struct Contents {
    seed: u64,
    content: Content,
    tokens: [u64; 256],
}

impl Contents {
    pub fn new(seed: u64, content: Content) -> Contents {
        const WORDS: [&[u8; 4]; 16] = [
            b"the ", b"of  ", b"and ", b"page", b"data", b"mem ", b"that", b"for ", b"with",
            b"swap", b"disk", b"log ", b"to  ", b"is  ", b"in  ", b"a   ",
        ];
        let mut tokens = [0u64; 256];
        for (b, t) in tokens.iter_mut().enumerate() {
            let mut w = [0u8; 8];
            w[..4].copy_from_slice(WORDS[b >> 4]);
            w[4..].copy_from_slice(WORDS[b & 15]);
            *t = u64::from_le_bytes(w);
        }
        Contents {
            seed,
            content,
            tokens,
        }
    }

    /// The words of object `idx` at `version`.
    pub fn fill(&self, idx: u64, version: u8, out: &mut [u64]) {
        let key = self
            .seed
            .wrapping_add(idx.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            ^ u64::from(version).wrapping_mul(0xd6e8_feb8_6659_fd93);
        let mut r = small_rng(key);
        match self.content {
            Content::Random => out.iter_mut().for_each(|w| *w = r.next_u64()),
            Content::Text => {
                for chunk in out.chunks_mut(8) {
                    let x = r.next_u64();
                    for (k, w) in chunk.iter_mut().enumerate() {
                        // 3 in 4 from the 16 most common pairs, like words in text.
                        let b = (x >> (8 * k)) as u8;
                        *w = self.tokens[if b < 192 { b & 15 } else { b } as usize];
                    }
                }
            }
        }
    }
}

/// `zmem bench ssd-worker`.
pub fn worker_main(a: &SsdWorkerArgs) -> anyhow::Result<()> {
    a.validate()?;
    let report = match a.workload {
        WorkloadKind::Objects => objects(a)?,
        WorkloadKind::Bloom => bloom(a)?,
    };
    let line = serde_json::to_string(&report)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}").and_then(|()| stdout.flush())?;
    let v = &report.verify;
    if v.failures > 0 {
        anyhow::bail!(
            "{}: {} verification failure(s) in {} checks; the first: {}",
            a.label,
            v.failures,
            v.checked,
            v.first_failure.as_deref().unwrap_or("?")
        );
    }
    Ok(())
}

/// On the kernel side: lock what the process has, then limit its cgroup to `dram` above that.
fn limit_cgroup(a: &SsdWorkerArgs) -> anyhow::Result<Option<CgroupSetup>> {
    let (Some(cg), Some(dram)) = (a.cgroup.as_deref(), a.dram) else {
        return Ok(None);
    };
    // SAFETY: mlockall takes flags only.
    let locked = unsafe { libc::mlockall(libc::MCL_CURRENT) } == 0;
    if !locked {
        let e = std::io::Error::last_os_error();
        eprintln!("zmem: ssd-worker: warning: mlockall failed ({e}); its own pages may be swapped");
    }
    let baseline = cg_read_u64(cg, "memory.usage_in_bytes")?;
    let limit = dram + baseline;
    cg_write(cg, "memory.limit_in_bytes", &limit.to_string())?;
    eprintln!(
        "zmem: ssd-worker: cgroup limit {} = --dram {} + the worker's own {}",
        format_size(limit),
        format_size(dram),
        format_size(baseline)
    );
    Ok(Some(CgroupSetup {
        path: cg.display().to_string(),
        dram,
        baseline_bytes: baseline,
        limit_bytes: limit,
        locked,
    }))
}

/// 4 KiB pages for the workload on the kernel side, as zmem's heap has (a huge page would be
/// swapped as one). Only the whole pages inside the allocation.
fn no_huge_pages(words: &mut [u64], cgroup: Option<&Path>) {
    if cgroup.is_none() {
        return;
    }
    let start = (words.as_mut_ptr() as usize).next_multiple_of(4096);
    let end = (words.as_mut_ptr() as usize + std::mem::size_of_val(words)) / 4096 * 4096;
    if end > start {
        // SAFETY: [start, end) lies inside the allocation `words`; MADV_NOHUGEPAGE changes no
        // contents.
        unsafe {
            libc::madvise(
                start as *mut libc::c_void,
                end - start,
                libc::MADV_NOHUGEPAGE,
            )
        };
    }
}

/// A zeroed allocation of `bytes` (a multiple of 8) from the global allocator.
fn alloc_words(bytes: u64, what: &str) -> anyhow::Result<Vec<u64>> {
    let n = usize::try_from(bytes / 8).context("size")?;
    let mut v: Vec<u64> = Vec::new();
    v.try_reserve_exact(n)
        .with_context(|| format!("allocating the {what} ({})", format_size(bytes)))?;
    v.resize(n, 0);
    Ok(v)
}

/// Whether the object holds the words of an older version, zeros, or something else.
fn diagnose(c: &Contents, idx: u64, version: u8, obj: &[u64], scratch: &mut [u64]) -> String {
    if obj.iter().all(|&w| w == 0) {
        return format!("object {idx} (version {version}) reads as zeros");
    }
    for back in 1..=8u8 {
        let v = version.wrapping_sub(back);
        c.fill(idx, v, scratch);
        if obj == &scratch[..] {
            return format!("object {idx} holds version {v} instead of {version}: a lost write");
        }
    }
    let at = obj.iter().position(|&w| w != 0).unwrap_or(0);
    format!("object {idx} (version {version}) holds other data (word {at} differs)")
}

fn objects(a: &SsdWorkerArgs) -> anyhow::Result<WorkerReport> {
    let size = a.object_size;
    let n = a.array / size;
    let ow = (size / 8) as usize;
    let contents = Contents::new(a.seed, a.content);
    let mut scratch = vec![0u64; ow];
    let mut check = vec![0u64; ow];
    let mut reads = new_histogram();
    let mut writes = new_histogram();
    let mut all = new_histogram();
    let cgroup = limit_cgroup(a)?;

    let mut array = alloc_words(n * size, "object array")?;
    no_huge_pages(&mut array, a.cgroup.as_deref());
    let mut versions: Vec<u8> = Vec::new();
    versions
        .try_reserve_exact(n as usize)
        .context("allocating the version table")?;
    versions.resize(n as usize, 0);

    // The fill: every object at version 0, in order.
    let u0 = usage(false);
    let t0 = Instant::now();
    let pb = progress_bar(n * size, format!("{}: fill", a.label));
    for (i, obj) in array.chunks_exact_mut(ow).enumerate() {
        contents.fill(i as u64, 0, &mut scratch);
        obj.copy_from_slice(&scratch);
        if i % 4096 == 4095 {
            pb.inc(4096 * size);
        }
    }
    pb.finish_and_clear();
    let fill_s = t0.elapsed().as_secs_f64();
    let fill_usage = Rusage::since(u0);

    let mut verify = Verify::default();
    let mut rng = small_rng(a.seed ^ 0xacce_55ed);
    let read_fraction = a.mix.read_fraction();
    let (mut nr, mut nw) = (0u64, 0u64);
    let pb = ops_bar(a.ops, format!("{}: {} ops", a.label, a.mix));
    let u0 = usage(false);
    let t0 = Instant::now();
    for k in 0..a.ops {
        let idx = rng.random_range(0..n);
        let read = rng.random::<f64>() < read_fraction;
        let at = idx as usize * ow;
        let obj = &mut array[at..at + ow];
        if read {
            let v = versions[idx as usize];
            contents.fill(idx, v, &mut scratch);
            let t = Instant::now();
            let same = *obj == scratch[..];
            let ns = t.elapsed().as_nanos() as u64;
            reads.saturating_record(ns);
            all.saturating_record(ns);
            nr += 1;
            verify.checked += 1;
            if !same {
                verify.fail(|| diagnose(&contents, idx, v, obj, &mut check));
            }
        } else {
            let v = versions[idx as usize].wrapping_add(1);
            versions[idx as usize] = v;
            contents.fill(idx, v, &mut scratch);
            let t = Instant::now();
            obj.copy_from_slice(&scratch);
            let ns = t.elapsed().as_nanos() as u64;
            writes.saturating_record(ns);
            all.saturating_record(ns);
            nw += 1;
        }
        if k % 256 == 255 {
            pb.inc(256);
        }
    }
    pb.finish_and_clear();
    let run_s = t0.elapsed().as_secs_f64();
    let run_usage = Rusage::since(u0);
    let mut phases = Vec::new();
    for (name, h) in [("read", &reads), ("write", &writes)] {
        if !h.is_empty() {
            phases.push(Phase {
                name: name.into(),
                latency: Lat::from_histogram(h),
            });
        }
    }
    let version_table_bytes = versions.len() as u64;
    drop(array);
    drop(versions);
    Ok(WorkerReport {
        label: a.label.clone(),
        workload: WorkloadKind::Objects,
        array: n * size,
        object_size: Some(size),
        objects: Some(n),
        mix: Some(a.mix),
        content: a.content,
        seed: a.seed,
        version_table_bytes,
        fill_s,
        fill_usage,
        ops: nr + nw,
        reads: nr,
        writes: nw,
        run_s,
        ops_per_s: (nr + nw) as f64 / run_s.max(1e-9),
        latency: Lat::from_histogram(&all),
        phases,
        run_usage,
        verify,
        cgroup,
    })
}

/// The bloom filter: its bits, its hash functions and its background.
struct Bloom {
    words: Vec<u64>,
    bits: u64,
    seed: u64,
}

impl Bloom {
    /// The background words of chunk `c` (of [`CHUNK_WORDS`]): random, so half the bits are
    /// set, the load of an optimally filled filter with 8 hash functions.
    fn background(&self, c: usize, out: &mut [u64; CHUNK_WORDS]) {
        let mut r = small_rng(self.seed ^ (c as u64).wrapping_mul(0xa076_1d64_78bd_642f));
        out.iter_mut().for_each(|w| *w = r.next_u64());
    }

    /// The bit positions of key `k` (double hashing).
    fn positions(&self, k: u64) -> [u64; BLOOM_HASHES as usize] {
        let mut r = small_rng(k ^ self.seed.rotate_left(17));
        let h1 = r.next_u64();
        let h2 = r.next_u64() | 1;
        std::array::from_fn(|i| h1.wrapping_add((i as u64).wrapping_mul(h2)) % self.bits)
    }

    fn insert(&mut self, pos: &[u64]) {
        for &p in pos {
            self.words[(p / 64) as usize] |= 1 << (p % 64);
        }
    }

    fn contains(&self, pos: &[u64]) -> bool {
        pos.iter()
            .all(|&p| self.words[(p / 64) as usize] & (1 << (p % 64)) != 0)
    }
}

/// Key ids of the absent keys start here (the present ones at 0).
const ABSENT: u64 = 1 << 62;

fn bloom(a: &SsdWorkerArgs) -> anyhow::Result<WorkerReport> {
    let n = a.ops;
    let mut hist: Vec<Histogram<u64>> = (0..3).map(|_| new_histogram()).collect();
    let mut all = new_histogram();
    let mut chunk = [0u64; CHUNK_WORDS];
    let cgroup = limit_cgroup(a)?;
    let mut words = alloc_words(a.array, "bloom filter")?;
    no_huge_pages(&mut words, a.cgroup.as_deref());
    let mut f = Bloom {
        bits: a.array * 8,
        words,
        seed: a.seed,
    };

    let u0 = usage(false);
    let t0 = Instant::now();
    let pb = progress_bar(a.array, format!("{}: fill", a.label));
    let nchunks = f.words.len().div_ceil(CHUNK_WORDS);
    for c in 0..nchunks {
        f.background(c, &mut chunk);
        let w = &mut f.words[c * CHUNK_WORDS..((c + 1) * CHUNK_WORDS).min(f.bits as usize / 64)];
        w.copy_from_slice(&chunk[..w.len()]);
        if c % 64 == 63 {
            pb.inc(64 * 8 * CHUNK_WORDS as u64);
        }
    }
    pb.finish_and_clear();
    let fill_s = t0.elapsed().as_secs_f64();
    let fill_usage = Rusage::since(u0);

    let mut verify = Verify::default();
    let (mut misses, mut hits) = (0u64, 0u64);
    let pb = ops_bar(3 * n, format!("{}: bloom", a.label));
    let u0 = usage(false);
    let t0 = Instant::now();
    for (phase, h) in hist.iter_mut().enumerate() {
        for k in 0..n {
            let key = if phase == 2 { ABSENT + k } else { k };
            let pos = f.positions(key);
            let t = Instant::now();
            let hit = if phase == 0 {
                f.insert(&pos);
                true
            } else {
                f.contains(&pos)
            };
            let ns = t.elapsed().as_nanos() as u64;
            h.saturating_record(ns);
            all.saturating_record(ns);
            match (phase, hit) {
                (1, false) => {
                    misses += 1;
                    verify.fail(|| format!("present key {k} does not hit"));
                }
                (2, true) => hits += 1,
                _ => {}
            }
            if k % 64 == 63 {
                pb.inc(64);
            }
        }
    }
    pb.finish_and_clear();
    let run_s = t0.elapsed().as_secs_f64();
    let run_usage = Rusage::since(u0);
    verify.checked += n;

    // The false-positive rate the load gives: a bit is set with probability q.
    let set_by_inserts = 1.0 - (-(BLOOM_HASHES as f64 * n as f64) / f.bits as f64).exp();
    let q = 0.5 + 0.5 * set_by_inserts;
    let p = q.powi(BLOOM_HASHES as i32);
    let sd = (n as f64 * p * (1.0 - p)).sqrt();
    let plausible = (hits as f64 - n as f64 * p).abs() <= 5.0 * sd + 5.0;
    if !plausible {
        verify.fail(|| {
            format!(
                "{hits} of {n} absent keys hit ({:.4}), the filter's load gives {p:.4}",
                hits as f64 / n as f64
            )
        });
    }

    // A sample of the filter's words: no background bit may be lost (inserts only add bits).
    let mut rng = small_rng(a.seed ^ 0xb1_005e);
    let words = f.words.len();
    let mut lost = 0u64;
    for _ in 0..(8 * n).min(words as u64) {
        let w = rng.random_range(0..words);
        f.background(w / CHUNK_WORDS, &mut chunk);
        let bg = chunk[w % CHUNK_WORDS];
        let missing = bg & !f.words[w];
        verify.checked += 1;
        if missing != 0 {
            lost += u64::from(missing.count_ones());
            verify.fail(|| format!("word {w} of the filter lost bits {missing:#x}"));
        }
    }
    verify.present_misses = Some(misses);
    verify.absent_hits = Some(hits);
    verify.false_positive_rate = Some(hits as f64 / n as f64);
    verify.expected_false_positive_rate = Some(p);
    verify.false_positive_rate_plausible = Some(plausible);
    verify.bits_lost = Some(lost);

    let phases = ["insert", "query-present", "query-absent"]
        .iter()
        .zip(&hist)
        .map(|(name, h)| Phase {
            name: name.to_string(),
            latency: Lat::from_histogram(h),
        })
        .collect();
    Ok(WorkerReport {
        label: a.label.clone(),
        workload: WorkloadKind::Bloom,
        array: a.array,
        object_size: None,
        objects: None,
        mix: None,
        content: Content::Random,
        seed: a.seed,
        version_table_bytes: 0,
        fill_s,
        fill_usage,
        ops: 3 * n,
        reads: 2 * n,
        writes: n,
        run_s,
        ops_per_s: (3 * n) as f64 / run_s.max(1e-9),
        latency: Lat::from_histogram(&all),
        phases,
        run_usage,
        verify,
        cgroup,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contents_depend_on_index_and_version_only() {
        for content in [Content::Text, Content::Random] {
            let c = Contents::new(7, content);
            let (mut a, mut b) = (vec![0u64; 32], vec![0u64; 32]);
            c.fill(3, 1, &mut a);
            c.fill(3, 1, &mut b);
            assert_eq!(a, b);
            c.fill(3, 2, &mut b);
            assert_ne!(a, b);
            c.fill(4, 1, &mut b);
            assert_ne!(a, b);
            let mut scratch = vec![0u64; 32];
            c.fill(3, 0, &mut b);
            assert!(diagnose(&c, 3, 1, &b, &mut scratch).contains("holds version 0"));
            assert!(diagnose(&c, 3, 1, &[0; 32], &mut scratch).contains("zeros"));
        }
    }

    #[test]
    fn text_content_compresses_about_2x_with_lz4_and_random_does_not() {
        let lz4 = |content| {
            let c = Contents::new(1, content);
            let mut page = vec![0u64; 512];
            for (i, obj) in page.chunks_mut(32).enumerate() {
                c.fill(i as u64, 0, obj);
            }
            let bytes: Vec<u8> = page.iter().flat_map(|w| w.to_le_bytes()).collect();
            let mut out = vec![0u8; 8192];
            // SAFETY: both buffers are valid for the lengths given.
            let n = unsafe {
                lz4_sys::LZ4_compress_default(
                    bytes.as_ptr().cast(),
                    out.as_mut_ptr().cast(),
                    bytes.len() as i32,
                    out.len() as i32,
                )
            };
            assert!(n > 0);
            4096.0 / n as f64
        };
        let text = lz4(Content::Text);
        assert!((1.6..2.6).contains(&text), "text compresses {text:.2}x");
        assert!(lz4(Content::Random) < 1.0);
    }

    #[test]
    fn bloom_positions_are_in_range_and_inserts_hit() {
        let mut f = Bloom {
            words: vec![0; 64],
            bits: 64 * 64,
            seed: 3,
        };
        for k in 0..100 {
            let p = f.positions(k);
            assert!(p.iter().all(|&x| x < f.bits));
            f.insert(&p);
            assert!(f.contains(&p));
        }
        let mut c = [0u64; CHUNK_WORDS];
        f.background(0, &mut c);
        let ones: u32 = c.iter().map(|w| w.count_ones()).sum();
        let frac = ones as f64 / (CHUNK_WORDS * 64) as f64;
        assert!((frac - 0.5).abs() < 0.02, "{frac}");
    }
}
