//! The workload driver, the same code on both sides: the page picker, the shared memory view,
//! the threads' fill, warm-up and measured phases, their latency and fault counts.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use super::{stamp, Pattern, Workload, PAGE, SLOW_NS, WORDS};
use crate::abort::{aborted, Interrupted};
use crate::corpus::Corpus;
use crate::report::progress_enabled;
use zmem_runenv::size::format_size;
use zmem_workload::Zipf;

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
pub(super) enum Gen<'a> {
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

pub(super) fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 100 s at 3 significant digits; larger values saturate.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static histogram bounds are valid")
}

/// Per-thread buffers, allocated once before memory is measured.
pub(super) struct ThreadState {
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

/// The summary of a histogram of nanoseconds (all zero, no mean, when it is empty).
impl Lat {
    pub fn from_histogram(h: &Histogram<u64>) -> Lat {
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
    /// Faults served by this thread's SIGBUS handler (`FaultRoute::Signal`; thread usage only).
    pub signal_faults: u64,
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
        signal_faults: if thread {
            zmem_region::signal_faults_on_this_thread()
        } else {
            0
        },
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
    /// from the per-VMA-lock path without marking the retry, so it is not "major"); and the
    /// faults the thread served itself on a region's signal route (the kernel counts a fault
    /// that ends in SIGBUS as neither).
    Any,
}

impl FaultCounter {
    fn of(self, u: &Usage) -> u64 {
        match self {
            FaultCounter::Major => u.majflt,
            FaultCounter::Any => u.majflt + u.minflt + u.signal_faults,
        }
    }
}

/// Which phase of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    Warmup,
    Measure,
}

/// Counts of one access phase.
pub(super) struct PhaseOut {
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

pub(super) struct ThreadOut {
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
            format!("{}: fill {}", self.label, format_size(self.w.size)),
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
pub(super) fn access_thread(
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
pub(super) fn bar(total: Option<u64>, msg: String) -> indicatif::ProgressBar {
    match total {
        Some(t) => crate::report::progress_bar(t, msg),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::region::tests::args;

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
            let mut buf = crate::target::AlignedBuf::new(w.size as usize);
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
}
