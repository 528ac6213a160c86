//! `zmem bench region`: a working set of corpus pages, larger than its DRAM budget, read and
//! written from N threads with a sequential, uniform random or zipf pattern, on a zmem
//! [`Region`] and (with `--kernel-zram`, as root) on plain anonymous memory in a memory cgroup
//! limited to the same budget with the kernel's zram as swap: the same workload code on both
//! sides, side by side in one run.
//!
//! Each access touches one 4 KiB page: a read loads one word of every cache line (and checks the
//! page's stamp), a write rewrites the page from the corpus. Every access is timed; an access
//! slower than [`SLOW_NS`] asks the kernel whether its thread took a fault meanwhile
//! (`getrusage(RUSAGE_THREAD)`: major faults on the kernel side, where a swap-in from zram is
//! major; major + minor on the zmem side, where Linux counts a userfaultfd fault as minor),
//! which gives the latency of faulting accesses on both sides by the same method.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use zmem_engine::Policy;
use zmem_region::{Budget, Eviction, Region, RegionConfig, RegionStats};

use super::corpus::Corpus;
use super::{aborted, fmt_size, progress_enabled, Interrupted, MachineInfo};
use crate::cli::{corpus_info, default_corpus, write_json, POLICIES};
use crate::size::parse_size;

/// Bytes of a page: the unit of every access.
pub const PAGE: usize = 4096;
const WORDS: usize = PAGE / 8;

/// Default seed of the access streams and of the zipf permutation: runs are reproducible.
pub const SEED: u64 = 0x7a6d_656d_5eed;

/// An access slower than this (ns) is checked for a major fault of its thread.
pub const SLOW_NS: u64 = 1000;

/// Smallest resident budget (16 pages, the region's minimum).
pub const MIN_RESIDENT: u64 = 16 * PAGE as u64;

/// High bits of the stamp in the first word of every page (page index in the low 32 bits).
const STAMP: u64 = 0x7a6d_656d_0000_0000;

/// The word page `p` carries at its start; a read that finds anything else is a lost page.
pub fn stamp(p: u64) -> u64 {
    STAMP | (p & 0xffff_ffff)
}

/// Which pages the accesses touch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Pattern {
    /// Each thread walks the pages in order from its own starting point, wrapping.
    Seq,
    /// Uniform over all pages.
    Rand,
    /// Zipf(s) over ranks, ranks mapped to pages by a seeded random permutation.
    Zipf,
}

impl Pattern {
    pub fn as_str(self) -> &'static str {
        match self {
            Pattern::Seq => "seq",
            Pattern::Rand => "rand",
            Pattern::Zipf => "zipf",
        }
    }
}

/// zmem's eviction policy on the command line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum EvictionArg {
    /// zmem's fault-history CLOCK.
    Clock,
    /// First in, first out (umap's policy), the baseline.
    Fifo,
}

impl EvictionArg {
    pub fn as_str(self) -> &'static str {
        match self {
            EvictionArg::Clock => "clock",
            EvictionArg::Fifo => "fifo",
        }
    }
    pub fn eviction(self) -> Eviction {
        match self {
            EvictionArg::Clock => Eviction::Clock,
            EvictionArg::Fifo => Eviction::Fifo,
        }
    }
}

/// Where the hidden worker fails on purpose (tests of the kernel side's restoration).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum FailAt {
    /// Right after joining the cgroup.
    Start,
    /// After the fill (its pages are in zram swap): returns an error.
    Fill,
    /// After the fill: abort() (a crash, SIGABRT).
    Abort,
    /// After the fill: waits until killed or interrupted.
    Hang,
}

#[derive(Debug, Clone, Args, Serialize)]
pub struct RegionArgs {
    /// Working-set bytes (k, m, g suffixes), a multiple of 4k.
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    pub size: u64,
    /// DRAM for the working set: the zmem region's resident budget; on the kernel side the
    /// cgroup's memory limit (above the worker's own baseline memory).
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub resident: u64,
    /// Access pattern.
    #[arg(long, value_enum, default_value = "zipf")]
    pub pattern: Pattern,
    /// Threads accessing the region (all of it, each its own random stream).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Corpus directory [default: ../shared/corpora/calgary or /work/shared/corpora/calgary].
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Measured accesses in total, split over the threads [default: 4 per page of --size].
    #[arg(long, conflicts_with = "duration")]
    pub accesses: Option<u64>,
    /// Run the measured phase for this many seconds instead of a number of accesses.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Untimed accesses (same pattern) between the fill and the measured phase
    /// [default: 1 per page of --size].
    #[arg(long)]
    pub warmup: Option<u64>,
    /// Fraction of the accesses that rewrite their page from the corpus; the others read it.
    #[arg(long, default_value_t = 0.5)]
    pub write_ratio: f64,
    /// Exponent of the zipf pattern.
    #[arg(long, default_value_t = 0.99)]
    pub zipf_s: f64,
    /// Seed of the access streams and the zipf permutation.
    #[arg(long, default_value_t = SEED)]
    pub seed: u64,
    /// zmem compression policy.
    #[arg(long, default_value = "fast", value_parser = clap::builder::PossibleValuesParser::new(POLICIES))]
    pub policy: String,
    /// zmem eviction policy.
    #[arg(long, value_enum, default_value = "clock")]
    pub eviction: EvictionArg,
    /// Run zmem with clock and with fifo, and print the faults per access side by side.
    #[arg(long)]
    pub compare_eviction: bool,
    /// Also run the workload on the kernel: anonymous memory in a cgroup v1 memory cgroup
    /// limited to --resident, /dev/zram0 as swap (root; the machine is restored after).
    #[arg(long)]
    pub kernel_zram: bool,
    /// Run only the kernel side (implies --kernel-zram).
    #[arg(long)]
    pub kernel_only: bool,
    /// Runs of the kernel side again when the memory cgroup's OOM killer ends it (recorded).
    #[arg(long, default_value_t = 2)]
    pub kernel_oom_retries: u32,
    /// zram algorithm of the kernel side.
    #[arg(long, default_value = "lz4")]
    pub zram_alg: String,
    /// zmem region: pages mapped at once on sequential faults [default: the region's].
    #[arg(long)]
    pub fault_around: Option<usize>,
    /// zmem region: fault handler threads [default: the region's].
    #[arg(long)]
    pub handler_threads: Option<usize>,
    /// JSON output.
    #[arg(long, default_value = "bench-out/region.json")]
    pub json: PathBuf,
    /// SVG chart output.
    #[arg(long, default_value = "bench-out/region.svg")]
    pub plot: PathBuf,
    /// Make the kernel side's worker fail at this point (tests).
    #[arg(long, value_enum, hide = true)]
    pub worker_fail: Option<FailAt>,
}

/// Arguments of the hidden worker (`zmem bench region-worker`): the whole spec as JSON.
#[derive(Debug, Clone, Args)]
pub struct RegionWorkerArgs {
    #[arg(long)]
    pub spec: String,
}

/// What every side runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Workload {
    pub size: u64,
    pub resident: u64,
    pub pattern: Pattern,
    pub threads: usize,
    /// Measured accesses (total) when not run for a duration.
    pub accesses: u64,
    pub duration_s: Option<f64>,
    pub warmup: u64,
    pub write_ratio: f64,
    pub zipf_s: f64,
    pub seed: u64,
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum WorkloadError {
    #[error("--size {0} is not a positive multiple of 4k")]
    Size(u64),
    #[error("--size {0} has more than 2^32 pages")]
    TooLarge(u64),
    #[error("--resident {resident} is larger than --size {size}")]
    ResidentAboveSize { resident: String, size: String },
    #[error("--resident {0} is below the minimum of 64k (16 pages)")]
    ResidentTooSmall(String),
    #[error("--threads must be at least 1")]
    NoThreads,
    #[error("--write-ratio {0} is not between 0 and 1")]
    WriteRatio(f64),
    #[error("--zipf-s {0} is not a positive number")]
    ZipfS(f64),
    #[error("--accesses must be at least 1")]
    NoAccesses,
    #[error("--duration {0} is not a positive number of seconds")]
    Duration(f64),
}

impl Workload {
    /// The workload of the command line, with the defaults resolved, validated.
    pub fn from_args(a: &RegionArgs) -> Result<Workload, WorkloadError> {
        if a.size == 0 || a.size % PAGE as u64 != 0 {
            return Err(WorkloadError::Size(a.size));
        }
        let pages = a.size / PAGE as u64;
        let accesses = match a.accesses {
            Some(0) => return Err(WorkloadError::NoAccesses),
            Some(n) => n,
            None => 4 * pages,
        };
        let w = Workload {
            size: a.size,
            resident: a.resident / PAGE as u64 * PAGE as u64,
            pattern: a.pattern,
            threads: a.threads,
            accesses,
            duration_s: a.duration,
            warmup: a.warmup.unwrap_or(pages.min(accesses)),
            write_ratio: a.write_ratio,
            zipf_s: a.zipf_s,
            seed: a.seed,
        };
        w.validate()?;
        Ok(w)
    }

    pub fn validate(&self) -> Result<(), WorkloadError> {
        if self.size == 0 || self.size % PAGE as u64 != 0 {
            return Err(WorkloadError::Size(self.size));
        }
        if self.pages() > 1 << 32 {
            return Err(WorkloadError::TooLarge(self.size));
        }
        if self.resident > self.size {
            return Err(WorkloadError::ResidentAboveSize {
                resident: fmt_size(self.resident),
                size: fmt_size(self.size),
            });
        }
        if self.resident < MIN_RESIDENT {
            return Err(WorkloadError::ResidentTooSmall(fmt_size(self.resident)));
        }
        if self.threads == 0 {
            return Err(WorkloadError::NoThreads);
        }
        if !(0.0..=1.0).contains(&self.write_ratio) {
            return Err(WorkloadError::WriteRatio(self.write_ratio));
        }
        if !(self.zipf_s.is_finite() && self.zipf_s > 0.0) {
            return Err(WorkloadError::ZipfS(self.zipf_s));
        }
        if self.accesses == 0 {
            return Err(WorkloadError::NoAccesses);
        }
        if let Some(d) = self.duration_s {
            if !(d.is_finite() && d > 0.0) {
                return Err(WorkloadError::Duration(d));
            }
        }
        Ok(())
    }

    pub fn pages(&self) -> u64 {
        self.size / PAGE as u64
    }

    /// "zipf(0.99) 1G/256M x2 w0.5"
    pub fn describe(&self) -> String {
        let pat = match self.pattern {
            Pattern::Zipf => format!("zipf({})", self.zipf_s),
            p => p.as_str().to_string(),
        };
        format!(
            "{pat} over {}, {} resident, {} thread{}, {:.0}% writes",
            fmt_size(self.size),
            fmt_size(self.resident),
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            self.write_ratio * 100.0
        )
    }
}

/// Zipf distribution over ranks 0..n (rank k has weight 1/(k+1)^s): a precomputed CDF and a
/// binary search per sample.
#[derive(Clone, Debug)]
pub struct Zipf {
    cdf: Vec<f64>,
}

impl Zipf {
    /// n >= 1, s > 0.
    pub fn new(n: usize, s: f64) -> Zipf {
        let n = n.max(1);
        let mut cdf = Vec::with_capacity(n);
        let mut acc = 0.0f64;
        for k in 1..=n {
            acc += (k as f64).powf(-s);
            cdf.push(acc);
        }
        for c in &mut cdf {
            *c /= acc;
        }
        Zipf { cdf }
    }

    pub fn len(&self) -> usize {
        self.cdf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.cdf.is_empty()
    }

    /// The rank for a uniform `u` in [0, 1).
    pub fn rank(&self, u: f64) -> usize {
        self.cdf
            .partition_point(|&c| c <= u)
            .min(self.cdf.len() - 1)
    }

    pub fn sample<R: Rng>(&self, rng: &mut R) -> usize {
        self.rank(rng.random::<f64>())
    }

    /// Probability of rank k.
    pub fn pmf(&self, k: usize) -> f64 {
        match k {
            0 => self.cdf[0],
            _ => self.cdf[k] - self.cdf[k - 1],
        }
    }
}

/// Precomputed tables of a pattern (built once, before the memory is measured).
pub struct Tables {
    zipf: Option<Zipf>,
    perm: Vec<u32>,
}

impl Tables {
    pub fn new(w: &Workload) -> Tables {
        match w.pattern {
            Pattern::Zipf => {
                let n = w.pages() as usize;
                let mut perm: Vec<u32> = (0..n as u64).map(|p| p as u32).collect();
                perm.shuffle(&mut StdRng::seed_from_u64(w.seed));
                Tables {
                    zipf: Some(Zipf::new(n, w.zipf_s)),
                    perm,
                }
            }
            _ => Tables {
                zipf: None,
                perm: Vec::new(),
            },
        }
    }
}

/// Page picker of one thread.
enum Gen<'a> {
    Seq { next: u64, pages: u64 },
    Rand { pages: u64 },
    Zipf { zipf: &'a Zipf, perm: &'a [u32] },
}

impl Gen<'_> {
    fn next(&mut self, rng: &mut StdRng) -> u64 {
        match self {
            Gen::Seq { next, pages } => {
                let p = *next;
                *next = if p + 1 == *pages { 0 } else { p + 1 };
                p
            }
            Gen::Rand { pages } => rng.random_range(0..*pages),
            Gen::Zipf { zipf, perm } => u64::from(perm[zipf.sample(rng)]),
        }
    }
}

/// The working set as seen by the threads: `pages` pages from `base`, accessed only through
/// atomic word loads and stores (threads may touch the same page at once, as programs do).
#[derive(Clone, Copy, Debug)]
pub struct Mem {
    base: usize,
    pages: u64,
}

impl Mem {
    /// # Safety
    /// `base..base + pages * 4096` must be mapped read-write, 4096-aligned, stay mapped while
    /// this `Mem` (or a copy) is used, and be accessed by nothing else than `Mem`s.
    pub unsafe fn new(base: *mut u8, pages: u64) -> Mem {
        Mem {
            base: base as usize,
            pages,
        }
    }

    fn page(&self, p: u64) -> &[AtomicU64; WORDS] {
        assert!(p < self.pages, "page {p} out of range");
        // SAFETY: p is in range; by new()'s contract the page is mapped, aligned (4096 >= the
        // alignment of AtomicU64) and only accessed atomically, so a shared reference to it as
        // atomics is valid for as long as self is used.
        unsafe { &*((self.base + p as usize * PAGE) as *const [AtomicU64; WORDS]) }
    }

    /// Rewrites page `p`: its stamp, then `src[1..]`.
    fn write(&self, p: u64, src: &[u64; WORDS]) {
        let w = self.page(p);
        w[0].store(stamp(p), Ordering::Relaxed);
        for (d, s) in w[1..].iter().zip(&src[1..]) {
            d.store(*s, Ordering::Relaxed);
        }
    }

    /// (first word, sum of one word per cache line).
    fn read(&self, p: u64) -> (u64, u64) {
        let w = self.page(p);
        let first = w[0].load(Ordering::Relaxed);
        let mut sum = first;
        for x in w.iter().step_by(8).skip(1) {
            sum = sum.wrapping_add(x.load(Ordering::Relaxed));
        }
        (first, sum)
    }
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 100 s at 3 significant digits; larger values saturate.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static histogram bounds are valid")
}

/// Per-thread buffers, allocated once before memory is measured.
struct ThreadState {
    all: Histogram<u64>,
    slow: Histogram<u64>,
    fault: Histogram<u64>,
    bytes: Vec<u8>,
    words: Box<[u64; WORDS]>,
}

impl ThreadState {
    fn new() -> ThreadState {
        ThreadState {
            all: new_histogram(),
            slow: new_histogram(),
            fault: new_histogram(),
            bytes: vec![0u8; PAGE],
            words: Box::new([0u64; WORDS]),
        }
    }

    /// Loads the source page from the corpus at `offset`.
    fn load(&mut self, corpus: &Corpus, offset: u64) {
        corpus.fill(offset, &mut self.bytes);
        for (w, b) in self.words.iter_mut().zip(self.bytes.chunks_exact(8)) {
            let mut a = [0u8; 8];
            a.copy_from_slice(b);
            *w = u64::from_ne_bytes(a);
        }
    }
}

/// Latency summary in microseconds.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Lat {
    pub count: u64,
    pub mean_us: Option<f64>,
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Lat {
    fn from_histogram(h: &Histogram<u64>) -> Lat {
        if h.is_empty() {
            return Lat::default();
        }
        let us = |ns: u64| ns as f64 / 1000.0;
        Lat {
            count: h.len(),
            mean_us: Some(h.mean() / 1000.0),
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
        }
    }

    /// From the region's fault latency (nanoseconds).
    pub fn from_region(l: &zmem_region::Latency) -> Lat {
        let us = |ns: u64| ns as f64 / 1000.0;
        Lat {
            count: l.count,
            mean_us: None,
            p50_us: us(l.p50),
            p99_us: us(l.p99),
            p999_us: us(l.p999),
            max_us: us(l.max),
        }
    }
}

/// Resource usage of this process or thread.
#[derive(Clone, Copy, Debug, Default)]
pub struct Usage {
    pub user_s: f64,
    pub sys_s: f64,
    pub majflt: u64,
    pub minflt: u64,
}

/// getrusage(RUSAGE_SELF) (`thread == false`) or getrusage(RUSAGE_THREAD).
pub fn usage(thread: bool) -> Usage {
    let who = if thread {
        libc::RUSAGE_THREAD
    } else {
        libc::RUSAGE_SELF
    };
    // SAFETY: rusage is plain old data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: &mut ru is a valid pointer and `who` a valid selector.
    if unsafe { libc::getrusage(who, &mut ru) } != 0 {
        return Usage::default();
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Usage {
        user_s: tv(ru.ru_utime),
        sys_s: tv(ru.ru_stime),
        majflt: ru.ru_majflt as u64,
        minflt: ru.ru_minflt as u64,
    }
}

/// CPU seconds of all kswapd threads so far (0 if none is visible).
pub fn kswapd_cpu_s() -> f64 {
    // SAFETY: sysconf has no preconditions.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let tck = if tck > 0 { tck as f64 } else { 100.0 };
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    let mut ticks = 0u64;
    for e in dir.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .filter(|s| s.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        if !comm.starts_with("kswapd") {
            continue;
        }
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            ticks += stat_cpu_ticks(&stat).unwrap_or(0);
        }
    }
    ticks as f64 / tck
}

/// utime + stime (fields 14 and 15) of a /proc/PID/stat line.
pub fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest starts at field 3 (state): utime is field 14, stime 15.
    let ut: u64 = f.get(11)?.parse().ok()?;
    let st: u64 = f.get(12)?.parse().ok()?;
    Some(ut + st)
}

/// Which of a thread's fault counters (getrusage(RUSAGE_THREAD)) tells that an access faulted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultCounter {
    /// Major faults: on the kernel side, a swap-in from zram.
    Major,
    /// Major and minor faults: a userfaultfd fault is counted as minor (Linux 6.x retries it
    /// from the per-VMA-lock path without marking the retry, so it is not "major").
    Any,
}

impl FaultCounter {
    fn of(self, u: &Usage) -> u64 {
        match self {
            FaultCounter::Major => u.majflt,
            FaultCounter::Any => u.majflt + u.minflt,
        }
    }
}

/// Which phase of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Warmup,
    Measure,
}

/// Counts of one access phase.
struct PhaseOut {
    accesses: u64,
    reads: u64,
    writes: u64,
    wall_s: f64,
    all: Histogram<u64>,
    slow: Histogram<u64>,
    fault: Histogram<u64>,
    thread_majflt: u64,
    thread_minflt: u64,
    checksum: u64,
}

struct ThreadOut {
    accesses: u64,
    reads: u64,
    writes: u64,
    thread_majflt: u64,
    thread_minflt: u64,
    checksum: u64,
}

#[derive(Debug, thiserror::Error)]
#[error(
    "page {page} lost its contents: its first word reads {found:#018x}, expected {expected:#018x}"
)]
pub struct LostPage {
    pub page: u64,
    pub found: u64,
    pub expected: u64,
}

/// Drives the workload on one piece of memory: fill, warm-up, measured phase.
pub struct Driver<'a> {
    w: &'a Workload,
    corpus: &'a Corpus,
    tables: Tables,
    states: Vec<ThreadState>,
    label: String,
    counter: FaultCounter,
}

impl<'a> Driver<'a> {
    /// Allocates everything the phases need (call before measuring the baseline memory).
    /// `counter` tells faulting accesses on this side.
    pub fn new(
        w: &'a Workload,
        corpus: &'a Corpus,
        label: &str,
        counter: FaultCounter,
    ) -> Driver<'a> {
        Driver {
            w,
            corpus,
            tables: Tables::new(w),
            states: (0..w.threads).map(|_| ThreadState::new()).collect(),
            label: label.to_string(),
            counter,
        }
    }

    /// Writes every page once (threads take contiguous slices); returns the seconds.
    pub fn fill(&mut self, mem: Mem) -> anyhow::Result<f64> {
        let pages = self.w.pages();
        let n = self.states.len() as u64;
        let pb = bar(
            Some(self.w.size),
            format!("{}: fill {}", self.label, fmt_size(self.w.size)),
        );
        let corpus = self.corpus;
        let t0 = Instant::now();
        let res: Vec<anyhow::Result<()>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .states
                .iter_mut()
                .enumerate()
                .map(|(t, st)| {
                    let pb = &pb;
                    let (lo, hi) = (pages * t as u64 / n, pages * (t as u64 + 1) / n);
                    s.spawn(move || -> anyhow::Result<()> {
                        for p in lo..hi {
                            if (p - lo) % 256 == 0 {
                                if aborted() {
                                    return Err(Interrupted.into());
                                }
                                if p > lo {
                                    pb.inc(256 * PAGE as u64);
                                }
                            }
                            st.load(corpus, p * PAGE as u64);
                            mem.write(p, &st.words);
                        }
                        Ok(())
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a fill thread panicked")))
                })
                .collect()
        });
        pb.finish_and_clear();
        for r in res {
            r?;
        }
        Ok(t0.elapsed().as_secs_f64())
    }

    fn access(&mut self, mem: Mem, phase: Phase) -> anyhow::Result<PhaseOut> {
        let w = self.w;
        let threads = self.states.len() as u64;
        let (total, deadline) = match phase {
            Phase::Warmup => (w.warmup, None),
            Phase::Measure => match w.duration_s {
                Some(d) => (u64::MAX, Some(Duration::from_secs_f64(d))),
                None => (w.accesses, None),
            },
        };
        let mut out = PhaseOut {
            accesses: 0,
            reads: 0,
            writes: 0,
            wall_s: 0.0,
            all: new_histogram(),
            slow: new_histogram(),
            fault: new_histogram(),
            thread_majflt: 0,
            thread_minflt: 0,
            checksum: 0,
        };
        if total == 0 {
            return Ok(out);
        }
        let what = match phase {
            Phase::Warmup => "warm-up",
            Phase::Measure => "measure",
        };
        let pb = match deadline {
            Some(d) => bar(
                None,
                format!("{}: {what} {:.0}s", self.label, d.as_secs_f64()),
            ),
            None => bar(
                Some(total.saturating_mul(PAGE as u64)),
                format!("{}: {what}", self.label),
            ),
        };
        let stop = AtomicBool::new(false);
        let (corpus, tables, counter) = (self.corpus, &self.tables, self.counter);
        let t0 = Instant::now();
        let res: Vec<anyhow::Result<ThreadOut>> = std::thread::scope(|s| {
            let handles: Vec<_> = self
                .states
                .iter_mut()
                .enumerate()
                .map(|(t, st)| {
                    let (pb, stop) = (&pb, &stop);
                    let t64 = t as u64;
                    let n = if total == u64::MAX {
                        u64::MAX
                    } else {
                        total / threads + u64::from(t64 < total % threads)
                    };
                    let pages = w.pages();
                    // Sequential streams start spread over the region; the measured phase goes
                    // on where the warm-up stopped.
                    let start = pages * t64 / threads
                        + match phase {
                            Phase::Warmup => 0,
                            Phase::Measure => w.warmup / threads,
                        };
                    let gen = match w.pattern {
                        Pattern::Seq => Gen::Seq {
                            next: start % pages,
                            pages,
                        },
                        Pattern::Rand => Gen::Rand { pages },
                        Pattern::Zipf => Gen::Zipf {
                            zipf: tables.zipf.as_ref().expect("zipf tables are built"),
                            perm: &tables.perm,
                        },
                    };
                    let seed = w
                        .seed
                        .wrapping_add((t64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15))
                        .wrapping_add(if phase == Phase::Warmup { 0x5eed } else { 0 });
                    s.spawn(move || {
                        let r = access_thread(
                            mem,
                            st,
                            corpus,
                            gen,
                            seed,
                            n,
                            deadline.map(|d| t0 + d),
                            w.write_ratio,
                            counter,
                            pb,
                            stop,
                        );
                        if r.is_err() {
                            stop.store(true, Ordering::Relaxed);
                        }
                        r
                    })
                })
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("an access thread panicked")))
                })
                .collect()
        });
        out.wall_s = t0.elapsed().as_secs_f64();
        pb.finish_and_clear();
        let mut first_err: Option<anyhow::Error> = None;
        for r in res {
            match r {
                Ok(o) => {
                    out.accesses += o.accesses;
                    out.reads += o.reads;
                    out.writes += o.writes;
                    out.thread_majflt += o.thread_majflt;
                    out.thread_minflt += o.thread_minflt;
                    out.checksum = out.checksum.wrapping_add(o.checksum);
                }
                Err(e) => {
                    if first_err.is_none() || e.downcast_ref::<Interrupted>().is_none() {
                        first_err = Some(e);
                    }
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        for st in &self.states {
            out.all.add(&st.all).context("merging histograms")?;
            out.slow.add(&st.slow).context("merging histograms")?;
            out.fault.add(&st.fault).context("merging histograms")?;
        }
        Ok(out)
    }
}

#[allow(clippy::too_many_arguments)]
fn access_thread(
    mem: Mem,
    st: &mut ThreadState,
    corpus: &Corpus,
    mut gen: Gen<'_>,
    seed: u64,
    n: u64,
    deadline: Option<Instant>,
    write_ratio: f64,
    counter: FaultCounter,
    pb: &indicatif::ProgressBar,
    stop: &AtomicBool,
) -> anyhow::Result<ThreadOut> {
    st.all.reset();
    st.slow.reset();
    st.fault.reset();
    let mut rng = StdRng::seed_from_u64(seed);
    let clen = corpus.len();
    let mut out = ThreadOut {
        accesses: 0,
        reads: 0,
        writes: 0,
        thread_majflt: 0,
        thread_minflt: 0,
        checksum: 0,
    };
    let u0 = usage(true);
    let mut faults = counter.of(&u0);
    let mut i = 0u64;
    while i < n {
        if i % 256 == 0 {
            if aborted() {
                return Err(Interrupted.into());
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            if i > 0 {
                pb.inc(256 * PAGE as u64);
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break;
            }
        }
        let p = gen.next(&mut rng);
        let write = write_ratio > 0.0 && rng.random::<f64>() < write_ratio;
        if write {
            st.load(corpus, rng.random_range(0..clen));
        }
        let t0 = Instant::now();
        let read = if write {
            mem.write(p, &st.words);
            None
        } else {
            Some(mem.read(p))
        };
        let ns = u64::try_from(t0.elapsed().as_nanos())
            .unwrap_or(u64::MAX)
            .max(1);
        st.all.saturating_record(ns);
        if ns > SLOW_NS {
            st.slow.saturating_record(ns);
            let f = counter.of(&usage(true));
            if f > faults {
                st.fault.saturating_record(ns);
                faults = f;
            }
        }
        match read {
            Some((first, sum)) => {
                if first != stamp(p) {
                    return Err(LostPage {
                        page: p,
                        found: first,
                        expected: stamp(p),
                    }
                    .into());
                }
                out.checksum = out.checksum.wrapping_add(sum);
                out.reads += 1;
            }
            None => out.writes += 1,
        }
        i += 1;
    }
    pb.inc((i % 256) * PAGE as u64);
    out.accesses = i;
    let u1 = usage(true);
    out.thread_majflt = u1.majflt.saturating_sub(u0.majflt);
    out.thread_minflt = u1.minflt.saturating_sub(u0.minflt);
    Ok(out)
}

/// A progress bar over `total` bytes (None: a spinner), hidden when stderr is not a terminal.
fn bar(total: Option<u64>, msg: String) -> indicatif::ProgressBar {
    match total {
        Some(t) => super::progress_bar(t, msg),
        None => {
            if !progress_enabled() {
                return indicatif::ProgressBar::hidden();
            }
            let pb = indicatif::ProgressBar::new_spinner();
            if let Ok(style) = indicatif::ProgressStyle::with_template(
                "{msg:32} {spinner} {elapsed} {bytes} {bytes_per_sec}",
            ) {
                pb.set_style(style);
            }
            pb.set_message(msg);
            pb.enable_steady_tick(Duration::from_millis(200));
            pb
        }
    }
}

/// The measured phase of one side, as both sides report it.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunReport {
    pub fill_s: f64,
    pub warmup_accesses: u64,
    pub warmup_s: f64,
    pub accesses: u64,
    pub reads: u64,
    pub writes: u64,
    pub wall_s: f64,
    /// wall_s * threads / accesses: what one access costs a thread, page picking included.
    pub ns_per_access: f64,
    /// Accessed bytes (4 KiB per access) per second.
    pub mib_s: f64,
    /// Latency of every access.
    pub access: Lat,
    /// Accesses during which their thread took a fault (fault_counter of
    /// getrusage(RUSAGE_THREAD), asked after every access slower than slow_threshold_ns).
    pub fault_access: Lat,
    pub fault_counter: Option<FaultCounter>,
    /// Accesses slower than slow_threshold_ns (faulting or not).
    pub slow_access: Lat,
    pub slow_threshold_ns: u64,
    /// Major and minor faults of the access threads (sums of RUSAGE_THREAD deltas).
    pub thread_majflt: u64,
    pub thread_minflt: u64,
    /// Process deltas over the measured phase (getrusage RUSAGE_SELF: every thread).
    pub majflt: u64,
    pub minflt: u64,
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    /// CPU of the machine's kswapd threads over the measured phase.
    pub kswapd_cpu_s: f64,
    /// Sum of the words read (keeps the reads honest).
    pub checksum: u64,
}

/// A run of the three phases with `snap` taken just before and just after the measured phase.
pub struct Measured<S> {
    pub report: RunReport,
    pub before: S,
    pub after: S,
}

/// Fill, `after_fill`, warm-up, measured phase on `mem`.
pub fn run_workload<S>(
    driver: &mut Driver<'_>,
    mem: Mem,
    after_fill: impl FnOnce() -> anyhow::Result<()>,
    mut snap: impl FnMut() -> anyhow::Result<S>,
) -> anyhow::Result<Measured<S>> {
    let fill_s = driver.fill(mem).context("fill")?;
    after_fill()?;
    let t0 = Instant::now();
    let warm = driver.access(mem, Phase::Warmup).context("warm-up")?;
    let warmup_s = t0.elapsed().as_secs_f64();
    let before = snap()?;
    let (u0, k0) = (usage(false), kswapd_cpu_s());
    let out = driver
        .access(mem, Phase::Measure)
        .context("measured phase")?;
    let (u1, k1) = (usage(false), kswapd_cpu_s());
    let after = snap()?;
    let w = driver.w;
    let per = |x: f64| {
        if out.accesses > 0 {
            x / out.accesses as f64
        } else {
            0.0
        }
    };
    let report = RunReport {
        fill_s,
        warmup_accesses: warm.accesses,
        warmup_s,
        accesses: out.accesses,
        reads: out.reads,
        writes: out.writes,
        wall_s: out.wall_s,
        ns_per_access: per(out.wall_s * 1e9 * w.threads as f64),
        mib_s: if out.wall_s > 0.0 {
            (out.accesses * PAGE as u64) as f64 / (1u64 << 20) as f64 / out.wall_s
        } else {
            0.0
        },
        access: Lat::from_histogram(&out.all),
        fault_access: Lat::from_histogram(&out.fault),
        fault_counter: Some(driver.counter),
        slow_access: Lat::from_histogram(&out.slow),
        slow_threshold_ns: SLOW_NS,
        thread_majflt: out.thread_majflt,
        thread_minflt: out.thread_minflt,
        majflt: u1.majflt.saturating_sub(u0.majflt),
        minflt: u1.minflt.saturating_sub(u0.minflt),
        cpu_user_s: (u1.user_s - u0.user_s).max(0.0),
        cpu_sys_s: (u1.sys_s - u0.sys_s).max(0.0),
        kswapd_cpu_s: (k1 - k0).max(0.0),
        checksum: out.checksum,
    };
    Ok(Measured {
        report,
        before,
        after,
    })
}

/// DRAM accounting of a side after the measured phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MemoryUse {
    /// Working-set pages mapped in DRAM (zmem: the region's resident bytes; kernel: the
    /// cgroup's rss + cache above the worker's baseline).
    pub resident_bytes: u64,
    /// zmem: evicted pages waiting for compression.
    pub staged_bytes: u64,
    /// Compressed pool (zram's / the store's mem_used_total).
    pub pool_bytes: u64,
    pub orig_data_size: u64,
    pub compr_data_size: u64,
    /// resident + staged + pool.
    pub dram_bytes: u64,
    /// orig_data_size / pool_bytes: the compression ratio.
    pub ratio: Option<f64>,
    /// working-set bytes / dram_bytes: data per byte of DRAM.
    pub effective_ratio: Option<f64>,
}

impl MemoryUse {
    pub fn new(size: u64, resident: u64, staged: u64, pool: u64, orig: u64, compr: u64) -> Self {
        let dram = resident + staged + pool;
        MemoryUse {
            resident_bytes: resident,
            staged_bytes: staged,
            pool_bytes: pool,
            orig_data_size: orig,
            compr_data_size: compr,
            dram_bytes: dram,
            ratio: (orig > 0 && pool > 0).then(|| orig as f64 / pool as f64),
            effective_ratio: (dram > 0).then(|| size as f64 / dram as f64),
        }
    }
}

/// One side of the comparison: zmem with an eviction policy, or the kernel's zram.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SideResult {
    /// "zmem-clock", "zmem-fifo", "kernel-zram".
    pub label: String,
    /// "zmem" or "kernel-zram".
    pub kind: String,
    pub workload: Workload,
    pub run: RunReport,
    /// Faults in the measured phase (zmem: the region's faults; kernel: the major faults of the
    /// access threads).
    pub faults: u64,
    pub faults_per_access: f64,
    pub faults_per_s: f64,
    /// Latency of faulting accesses (both sides, same method: see RunReport::fault_access).
    pub fault_latency: Lat,
    pub fault_latency_source: String,
    /// zmem: the handler's fault latency (read to wake-up; whole run, fill included).
    pub handler_fault_latency: Option<Lat>,
    pub memory: MemoryUse,
    /// Process CPU (user + system) over the measured phase.
    pub cpu_s: f64,
    pub kswapd_cpu_s: f64,
    /// (process + kswapd CPU) per GiB accessed.
    pub cpu_s_per_gib: f64,
    /// Side-specific settings and counters.
    pub detail: serde_json::Value,
}

impl SideResult {
    /// Builds the common derived figures.
    pub fn new(
        label: &str,
        kind: &str,
        w: &Workload,
        run: RunReport,
        faults: u64,
        memory: MemoryUse,
        detail: serde_json::Value,
    ) -> SideResult {
        let (fault_latency, source) = if run.fault_access.count > 0 || faults == 0 {
            (
                run.fault_access.clone(),
                match run.fault_counter {
                    Some(FaultCounter::Any) => "accesses during which their thread took a fault",
                    _ => "accesses during which their thread took a major fault",
                }
                .to_string(),
            )
        } else {
            (
                run.slow_access.clone(),
                format!(
                    "accesses slower than {} ns (no fault was seen per thread)",
                    SLOW_NS
                ),
            )
        };
        let cpu_s = run.cpu_user_s + run.cpu_sys_s;
        let gib = (run.accesses * PAGE as u64) as f64 / (1u64 << 30) as f64;
        SideResult {
            label: label.to_string(),
            kind: kind.to_string(),
            workload: w.clone(),
            faults,
            faults_per_access: if run.accesses > 0 {
                faults as f64 / run.accesses as f64
            } else {
                0.0
            },
            faults_per_s: if run.wall_s > 0.0 {
                faults as f64 / run.wall_s
            } else {
                0.0
            },
            fault_latency,
            fault_latency_source: source,
            handler_fault_latency: None,
            memory,
            cpu_s,
            kswapd_cpu_s: run.kswapd_cpu_s,
            cpu_s_per_gib: if gib > 0.0 {
                (cpu_s + run.kswapd_cpu_s) / gib
            } else {
                0.0
            },
            run,
            detail,
        }
    }

    /// One human line.
    pub fn summary(&self) -> String {
        let r = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
        format!(
            "{:<12} {:>8.2} us/access (p50 {:.2} p99 {:.1} p99.9 {:.1})  faults/access {:.4}  fault p50 {:.1} p99 {:.1} us  {:.1} MiB/s  ratio {}  effective {}  cpu {:.2} s/GiB",
            self.label,
            self.run.ns_per_access / 1000.0,
            self.run.access.p50_us,
            self.run.access.p99_us,
            self.run.access.p999_us,
            self.faults_per_access,
            self.fault_latency.p50_us,
            self.fault_latency.p99_us,
            self.run.mib_s,
            r(self.memory.ratio),
            r(self.memory.effective_ratio),
            self.cpu_s_per_gib,
        )
    }
}

/// A side that did not run, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    pub label: String,
    pub reason: String,
}

/// Faults per access of clock against fifo.
#[derive(Clone, Debug, Serialize)]
pub struct EvictionComparison {
    pub clock_faults_per_access: f64,
    pub fifo_faults_per_access: f64,
    /// (fifo - clock) / fifo in percent: how many fewer faults clock takes.
    pub reduction_pct: Option<f64>,
}

impl EvictionComparison {
    pub fn new(clock: f64, fifo: f64) -> EvictionComparison {
        EvictionComparison {
            clock_faults_per_access: clock,
            fifo_faults_per_access: fifo,
            reduction_pct: (fifo > 0.0).then(|| (fifo - clock) / fifo * 100.0),
        }
    }
}

/// The zmem side: a region of `w.size` bytes with a fixed budget of `w.resident`.
pub fn run_zmem(
    args: &RegionArgs,
    w: &Workload,
    corpus: &Corpus,
    eviction: EvictionArg,
) -> anyhow::Result<SideResult> {
    let policy: Policy = args.policy.parse()?;
    let label = format!("zmem-{}", eviction.as_str());
    let mut cfg = RegionConfig::new(w.size, Budget::Fixed(w.resident));
    cfg.policy = policy;
    cfg.eviction = eviction.eviction();
    if let Some(f) = args.fault_around {
        cfg.fault_around = f;
    }
    if let Some(h) = args.handler_threads {
        cfg.handler_threads = h;
    }
    let (fault_around, handler_threads) = (cfg.fault_around, cfg.handler_threads);
    let mut driver = Driver::new(w, corpus, &label, FaultCounter::Any);
    let region = Region::new(cfg).with_context(|| {
        format!(
            "{label}: creating a {} region with a {} budget",
            fmt_size(w.size),
            fmt_size(w.resident)
        )
    })?;
    if region.as_ptr().is_null() || (region.len() as u64) < w.size {
        anyhow::bail!(
            "{label}: the region maps {} bytes at {:p}, expected {}",
            region.len(),
            region.as_ptr(),
            w.size
        );
    }
    // SAFETY: the region maps at least w.size bytes read-write from as_ptr() (checked above),
    // page-aligned, until it is dropped at the end of this function, after the workload's
    // threads have all joined; nothing else touches it.
    let mem = unsafe { Mem::new(region.as_ptr(), w.pages()) };
    eprintln!("zmem: {label}: {}", w.describe());
    let m = run_workload(&mut driver, mem, || Ok(()), || Ok(region.stats()))?;
    let (s0, s1): (&RegionStats, &RegionStats) = (&m.before, &m.after);
    let faults = s1.faults().saturating_sub(s0.faults());
    let memory = MemoryUse::new(
        w.size,
        s1.resident,
        s1.staged,
        s1.store.mem_used_total,
        s1.store.orig_data_size,
        s1.store.compr_data_size,
    );
    let d = |a: u64, b: u64| a.saturating_sub(b);
    let detail = serde_json::json!({
        "policy": policy.to_string(),
        "eviction": eviction.as_str(),
        "fault_around": fault_around,
        "handler_threads": handler_threads,
        "budget": s1.budget,
        "measured_phase": {
            "major_faults": d(s1.major_faults, s0.major_faults),
            "zero_faults": d(s1.zero_faults, s0.zero_faults),
            "staged_faults": d(s1.staged_faults, s0.staged_faults),
            "fault_around_pages": d(s1.fault_around_pages, s0.fault_around_pages),
            "evictions": d(s1.evictions, s0.evictions),
            "direct_evictions": d(s1.direct_evictions, s0.direct_evictions),
        },
        "region_effective_ratio": s1.effective_ratio(),
        "stats_after": region_stats_json(s1),
    });
    let mut r = SideResult::new(&label, "zmem", w, m.report, faults, memory, detail);
    r.handler_fault_latency = Some(Lat::from_region(&s1.fault_latency));
    drop(region);
    Ok(r)
}

fn region_stats_json(s: &RegionStats) -> serde_json::Value {
    serde_json::json!({
        "size": s.size,
        "budget": s.budget,
        "resident": s.resident,
        "staged": s.staged,
        "major_faults": s.major_faults,
        "zero_faults": s.zero_faults,
        "staged_faults": s.staged_faults,
        "fault_around_pages": s.fault_around_pages,
        "evictions": s.evictions,
        "direct_evictions": s.direct_evictions,
        "unshared": s.unshared,
        "forks": s.forks,
        "fault_latency_ns": {
            "count": s.fault_latency.count,
            "p50": s.fault_latency.p50,
            "p99": s.fault_latency.p99,
            "p999": s.fault_latency.p999,
            "max": s.fault_latency.max,
        },
        "store": {
            "orig_data_size": s.store.orig_data_size,
            "compr_data_size": s.store.compr_data_size,
            "mem_used_total": s.store.mem_used_total,
            "same_pages": s.store.same_pages,
            "huge_pages": s.store.huge_pages,
            "pending_pages": s.store.pending_pages,
            "reads": s.store.reads,
            "writes": s.store.writes,
            "decompress_nanos": s.store.decompress_nanos,
        },
    })
}

/// `zmem bench region`.
pub fn run(args: &RegionArgs) -> anyhow::Result<()> {
    let w = Workload::from_args(args)?;
    let corpus_dir = args.corpus.clone().unwrap_or_else(default_corpus);
    let corpus = Corpus::load(&corpus_dir)?;
    if args.kernel_zram || args.kernel_only {
        // Checked before anything runs: a typo should not cost a zmem run first.
        anyhow::ensure!(
            !args.zram_alg.trim().is_empty(),
            "--zram-alg must name an algorithm"
        );
    }
    super::install_abort_handler();

    let mut results: Vec<SideResult> = Vec::new();
    let mut skipped: Vec<Skipped> = Vec::new();
    let mut outcome = run_sides(args, &w, &corpus, &corpus_dir, &mut results, &mut skipped);
    if outcome.is_ok() && results.is_empty() {
        let why: Vec<String> = skipped
            .iter()
            .map(|s| format!("{}: {}", s.label, s.reason))
            .collect();
        outcome = Err(anyhow::anyhow!("nothing was measured ({})", why.join("; ")));
    }

    let evictions = eviction_comparison(&results);
    if !results.is_empty() {
        println!("{}", side_table(&results, &w));
        if let Some(e) = &evictions {
            println!("{}", eviction_line(e, &w));
        }
    }
    let doc = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "args": args,
        "machine": MachineInfo::collect(),
        "corpus": corpus_info(&corpus),
        "workload": w,
        "results": results,
        "skipped": skipped,
        "eviction_comparison": evictions,
        "error": outcome.as_ref().err().map(|e| format!("{e:#}")),
    });
    write_json(&args.json, &doc)?;
    eprintln!("zmem: wrote {}", args.json.display());
    if !results.is_empty() {
        plot(&results, &w, &args.plot)
            .with_context(|| format!("drawing {}", args.plot.display()))?;
        eprintln!("zmem: wrote {}", args.plot.display());
    }
    outcome
}

fn run_sides(
    args: &RegionArgs,
    w: &Workload,
    corpus: &Corpus,
    corpus_dir: &Path,
    results: &mut Vec<SideResult>,
    skipped: &mut Vec<Skipped>,
) -> anyhow::Result<()> {
    // The kernel side first: its worker is spawned before this process has any region threads.
    if args.kernel_zram || args.kernel_only {
        match super::cgroup::run_kernel(args, w, corpus_dir)? {
            super::cgroup::KernelOutcome::Ran(r) => {
                eprintln!("  {}", r.summary());
                results.push(*r);
            }
            super::cgroup::KernelOutcome::Skipped(reason) => {
                if args.kernel_only {
                    eprintln!("zmem: kernel side skipped: {reason}");
                } else {
                    eprintln!("zmem: kernel side skipped: {reason}; running zmem alone");
                }
                skipped.push(Skipped {
                    label: "kernel-zram".into(),
                    reason,
                });
            }
        }
    }
    if args.kernel_only {
        return Ok(());
    }
    let evictions = if args.compare_eviction {
        vec![EvictionArg::Clock, EvictionArg::Fifo]
    } else {
        vec![args.eviction]
    };
    for ev in evictions {
        let r = run_zmem(args, w, corpus, ev)?;
        eprintln!("  {}", r.summary());
        results.push(r);
    }
    Ok(())
}

fn eviction_comparison(results: &[SideResult]) -> Option<EvictionComparison> {
    let f = |l: &str| results.iter().find(|r| r.label == l);
    let (c, f) = (f("zmem-clock")?, f("zmem-fifo")?);
    Some(EvictionComparison::new(
        c.faults_per_access,
        f.faults_per_access,
    ))
}

fn eviction_line(e: &EvictionComparison, w: &Workload) -> String {
    let target = if w.pattern == Pattern::Zipf && (w.zipf_s - 0.99).abs() < 1e-9 {
        " (target for zipf(0.99): at least 30% fewer)"
    } else {
        ""
    };
    match e.reduction_pct {
        Some(pct) => format!(
            "eviction: faults/access clock {:.4} vs fifo {:.4}: clock takes {:.1}% {} faults than fifo{target}",
            e.clock_faults_per_access,
            e.fifo_faults_per_access,
            pct.abs(),
            if pct >= 0.0 { "fewer" } else { "more" },
        ),
        None => format!(
            "eviction: faults/access clock {:.4} vs fifo {:.4} (fifo took no faults)",
            e.clock_faults_per_access, e.fifo_faults_per_access
        ),
    }
}

/// Plain text table: first column left-aligned, the others right-aligned.
pub fn text_table(header: &[String], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < w.len() {
                w[i] = w[i].max(c.chars().count());
            }
        }
    }
    let line = |r: &[String]| {
        r.iter()
            .enumerate()
            .map(|(i, c)| {
                let width = w.get(i).copied().unwrap_or(0);
                if i == 0 {
                    format!("{c:<width$}")
                } else {
                    format!("{c:>width$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = line(header);
    out.push('\n');
    out.push_str(&"-".repeat(out.chars().count().saturating_sub(1)));
    for r in rows {
        out.push('\n');
        out.push_str(&line(r));
    }
    out
}

/// Metric rows, one column per side, then zmem/kernel ratio columns when the kernel side ran.
pub fn side_table(results: &[SideResult], w: &Workload) -> String {
    type Metric = (&'static str, fn(&SideResult) -> Option<f64>, usize);
    let metrics: [Metric; 17] = [
        (
            "time/access us (wall x threads)",
            |r| Some(r.run.ns_per_access / 1000.0),
            3,
        ),
        ("access mean us", |r| r.run.access.mean_us, 3),
        ("access p50 us", |r| Some(r.run.access.p50_us), 3),
        ("access p99 us", |r| Some(r.run.access.p99_us), 2),
        ("access p99.9 us", |r| Some(r.run.access.p999_us), 2),
        (
            "fault p50 us",
            |r| (r.fault_latency.count > 0).then_some(r.fault_latency.p50_us),
            2,
        ),
        (
            "fault p99 us",
            |r| (r.fault_latency.count > 0).then_some(r.fault_latency.p99_us),
            2,
        ),
        (
            "fault p99.9 us",
            |r| (r.fault_latency.count > 0).then_some(r.fault_latency.p999_us),
            2,
        ),
        (
            "handler fault p50/p99 us",
            |r| {
                r.handler_fault_latency
                    .as_ref()
                    .filter(|l| l.count > 0)
                    .map(|l| l.p50_us)
            },
            2,
        ),
        ("faults/access", |r| Some(r.faults_per_access), 4),
        ("faults/s", |r| Some(r.faults_per_s), 0),
        ("MiB/s", |r| Some(r.run.mib_s), 1),
        ("ratio (orig/pool)", |r| r.memory.ratio, 3),
        (
            "effective ratio (size/DRAM)",
            |r| r.memory.effective_ratio,
            3,
        ),
        (
            "DRAM MiB (resident+pool)",
            |r| Some(r.memory.dram_bytes as f64 / (1u64 << 20) as f64),
            1,
        ),
        ("CPU s/GiB (+kswapd)", |r| Some(r.cpu_s_per_gib), 3),
        ("kswapd CPU s", |r| Some(r.kswapd_cpu_s), 3),
    ];
    let kernel = results.iter().find(|r| r.kind == "kernel-zram");
    let zmem: Vec<&SideResult> = results.iter().filter(|r| r.kind == "zmem").collect();
    let mut header = vec![w.describe()];
    header.extend(results.iter().map(|r| r.label.clone()));
    if kernel.is_some() {
        header.extend(zmem.iter().map(|z| format!("{}/kernel", z.label)));
    }
    let rows: Vec<Vec<String>> = metrics
        .iter()
        .map(|(name, f, prec)| {
            let mut row = vec![name.to_string()];
            for r in results {
                let cell = if *name == "handler fault p50/p99 us" {
                    r.handler_fault_latency
                        .as_ref()
                        .filter(|l| l.count > 0)
                        .map_or("-".into(), |l| format!("{:.1}/{:.1}", l.p50_us, l.p99_us))
                } else {
                    f(r).map_or("-".into(), |v| format!("{v:.prec$}"))
                };
                row.push(cell);
            }
            if let Some(k) = kernel {
                for z in &zmem {
                    let cell = match (f(z), f(k)) {
                        (Some(a), Some(b)) if b > 0.0 && *name != "handler fault p50/p99 us" => {
                            format!("{:.2}x", a / b)
                        }
                        _ => "-".into(),
                    };
                    row.push(cell);
                }
            }
            row
        })
        .collect();
    text_table(&header, &rows)
}

/// Grouped bars: each metric relative to the first side (the kernel's when it ran).
pub fn plot(results: &[SideResult], w: &Workload, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    type Metric = (&'static str, fn(&SideResult) -> f64);
    let metrics: [Metric; 6] = [
        ("time/access", |r| r.run.ns_per_access),
        ("fault p99", |r| r.fault_latency.p99_us),
        ("faults/access", |r| r.faults_per_access),
        ("CPU s/GiB", |r| r.cpu_s_per_gib),
        ("ratio", |r| r.memory.ratio.unwrap_or(0.0)),
        ("effective ratio", |r| {
            r.memory.effective_ratio.unwrap_or(0.0)
        }),
    ];
    let reference = &results[0];
    let rel = |m: &Metric, r: &SideResult| {
        let b = (m.1)(reference);
        if b > 0.0 {
            (m.1)(r) / b
        } else {
            0.0
        }
    };
    let ymax = metrics
        .iter()
        .flat_map(|m| results.iter().map(move |r| rel(m, r)))
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (1200, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!(
        "zmem region vs kernel zram: {} (relative to {})",
        w.describe(),
        reference.label
    );
    let n = metrics.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..n as f64, 0f64..ymax)?;
    let names: Vec<&str> = metrics.iter().map(|m| m.0).collect();
    let label_of = |x: &f64| {
        let i = x.floor().max(0.0) as usize;
        names.get(i).map(|s| s.to_string()).unwrap_or_default()
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x: &f64| {
            if (x.fract() - 0.5).abs() < 1e-6 {
                label_of(x)
            } else {
                String::new()
            }
        })
        .y_desc(format!(
            "relative to {} (lower is better but for ratios)",
            reference.label
        ))
        .draw()?;
    let k = results.len();
    let bw = 0.8 / k as f64;
    for (j, r) in results.iter().enumerate() {
        let color = Palette99::pick(j).to_rgba();
        let bars: Vec<Rectangle<(f64, f64)>> = metrics
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let x0 = i as f64 + 0.1 + j as f64 * bw;
                Rectangle::new([(x0, 0.0), (x0 + bw, rel(m, r))], color.filled())
            })
            .collect();
        chart
            .draw_series(bars)?
            .label(r.label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> RegionArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            a: RegionArgs,
        }
        P::parse_from(["x", "--size", "16M", "--resident", "4M"]).a
    }

    #[test]
    fn zipf_pmf_and_sampling() {
        let z = Zipf::new(1000, 0.99);
        let h: f64 = (1..=1000).map(|k| (k as f64).powf(-0.99)).sum();
        assert!((z.pmf(0) - 1.0 / h).abs() < 1e-12);
        assert!((z.pmf(9) - 10f64.powf(-0.99) / h).abs() < 1e-12);
        assert_eq!(z.rank(0.0), 0);
        assert_eq!(z.rank(0.999_999_999_999), 999);
        let mut rng = StdRng::seed_from_u64(1);
        let n = 200_000;
        let mut c0 = 0;
        let mut c9 = 0;
        for _ in 0..n {
            match z.sample(&mut rng) {
                0 => c0 += 1,
                9 => c9 += 1,
                _ => {}
            }
        }
        let f0 = c0 as f64 / n as f64;
        let f9 = c9 as f64 / n as f64;
        assert!((f0 - z.pmf(0)).abs() < 0.01, "{f0} vs {}", z.pmf(0));
        assert!((f9 - z.pmf(9)).abs() < 0.005, "{f9} vs {}", z.pmf(9));
    }

    #[test]
    fn zipf_permutation_is_seeded() {
        let mut a = args();
        a.pattern = Pattern::Zipf;
        let w = Workload::from_args(&a).unwrap();
        let t1 = Tables::new(&w);
        let t2 = Tables::new(&w);
        assert_eq!(t1.perm, t2.perm);
        let mut sorted = t1.perm.clone();
        sorted.sort_unstable();
        assert_eq!(sorted, (0..4096u32).collect::<Vec<_>>());
        assert_ne!(t1.perm[..16], sorted[..16]);
    }

    #[test]
    fn workload_defaults_and_errors() {
        let a = args();
        let w = Workload::from_args(&a).unwrap();
        assert_eq!(w.pages(), 4096);
        assert_eq!(w.accesses, 4 * 4096);
        assert_eq!(w.warmup, 4096);
        let bad = |f: &dyn Fn(&mut RegionArgs)| {
            let mut a = args();
            f(&mut a);
            Workload::from_args(&a).unwrap_err()
        };
        assert!(matches!(
            bad(&|a| a.resident = 32 << 20),
            WorkloadError::ResidentAboveSize { .. }
        ));
        assert_eq!(bad(&|a| a.threads = 0), WorkloadError::NoThreads);
        assert_eq!(bad(&|a| a.size = 5000), WorkloadError::Size(5000));
        assert!(matches!(
            bad(&|a| a.resident = 4096),
            WorkloadError::ResidentTooSmall(_)
        ));
        assert!(matches!(
            bad(&|a| a.write_ratio = 1.5),
            WorkloadError::WriteRatio(_)
        ));
        assert!(matches!(bad(&|a| a.zipf_s = 0.0), WorkloadError::ZipfS(_)));
        assert_eq!(bad(&|a| a.accesses = Some(0)), WorkloadError::NoAccesses);
        assert!(matches!(
            bad(&|a| a.duration = Some(-1.0)),
            WorkloadError::Duration(_)
        ));
    }

    /// The whole workload on ordinary heap memory (no tiering): every page keeps its stamp,
    /// counts add up, and a cleared page is caught.
    #[test]
    fn workload_on_plain_memory() {
        let corpus =
            Corpus::from_bytes("t", (0..10_000u32).map(|i| (i % 251) as u8).collect()).unwrap();
        for pattern in [Pattern::Seq, Pattern::Rand, Pattern::Zipf] {
            let mut a = args();
            a.size = 1 << 20;
            a.resident = 256 << 10;
            a.pattern = pattern;
            a.threads = 2;
            a.accesses = Some(3001);
            let w = Workload::from_args(&a).unwrap();
            let mut buf = super::super::AlignedBuf::new(w.size as usize);
            // SAFETY: buf is 4096-aligned, w.size bytes, outlives the run, and is only
            // accessed through the Mem.
            let mem = unsafe { Mem::new(buf.as_mut_ptr(), w.pages()) };
            let mut d = Driver::new(&w, &corpus, "test", FaultCounter::Major);
            let m = run_workload(&mut d, mem, || Ok(()), || Ok(())).unwrap();
            assert_eq!(m.report.accesses, 3001, "{pattern:?}");
            assert_eq!(m.report.reads + m.report.writes, 3001);
            assert!(m.report.writes > 1000 && m.report.reads > 1000);
            assert_eq!(m.report.warmup_accesses, 256);
            assert_eq!(m.report.access.count, 3001);
            for p in 0..w.pages() {
                assert_eq!(mem.read(p).0, stamp(p));
            }
            // A lost page is an error.
            mem.page(3)[0].store(0, Ordering::Relaxed);
            let mut a2 = a.clone();
            a2.write_ratio = 0.0;
            a2.pattern = Pattern::Seq;
            a2.threads = 1;
            a2.warmup = Some(0);
            let w2 = Workload::from_args(&a2).unwrap();
            let mut d2 = Driver::new(&w2, &corpus, "test", FaultCounter::Major);
            let err = d2.access(mem, Phase::Measure).err().unwrap();
            assert!(err.downcast_ref::<LostPage>().is_some(), "{err:#}");
            drop(buf);
        }
    }

    #[test]
    fn proc_stat_cpu_fields() {
        let line = "45 (kswapd0) S 2 0 0 0 -1 10750016 0 0 0 0 17 5 0 0 20 0 1 0 100 0 0";
        assert_eq!(stat_cpu_ticks(line), Some(22));
        assert_eq!(stat_cpu_ticks("garbage"), None);
    }

    #[test]
    fn memory_use_and_comparison() {
        let m = MemoryUse::new(1 << 30, 256 << 20, 0, 256 << 20, 768 << 20, 250 << 20);
        assert_eq!(m.dram_bytes, 512 << 20);
        assert_eq!(m.effective_ratio, Some(2.0));
        assert_eq!(m.ratio, Some(3.0));
        let e = EvictionComparison::new(0.07, 0.1);
        assert!((e.reduction_pct.unwrap() - 30.0).abs() < 1e-9);
    }
}
