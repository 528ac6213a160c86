//! The page benchmark (fio-like): N jobs, each owning a contiguous slice of the target, doing
//! sequential or random block writes or reads of corpus data, with verification.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use hdrhistogram::Histogram;
use rand::seq::SliceRandom;
use rand::SeedableRng;
use serde::Serialize;

use crate::abort::{aborted, Interrupted};
use crate::blockdev::{zram_index, BlockDevError, BlockDevTarget};
use crate::corpus::{default_corpus, Corpus};
use crate::kernel::zram::ZramSession;
use crate::report::{corpus_info, progress_bar, write_json, MachineInfo};
use crate::target::{ratio as ratio_of, AlignedBuf, MemoryReport, PageTarget, PAGE, POLICIES};
use crate::zmem_target::{self, ZmemTargetConfig};
use clap::Args;
use std::path::{Path, PathBuf};
use zmem_runenv::size::{format_size, parse_size, parse_size_usize};

#[derive(Debug, Clone, Args)]
pub struct PagesArgs {
    /// `zmem`, or a block device path (/dev/zramN is configured for the run and reset after).
    #[arg(long)]
    pub target: String,
    #[arg(long, value_enum, default_value = "write")]
    pub rw: Rw,
    /// Block size (multiple of 4k).
    #[arg(long, value_parser = parse_size_usize, default_value = "4k")]
    pub bs: usize,
    /// Threads, each owning a contiguous slice of size/jobs.
    #[arg(long, default_value_t = 1)]
    pub jobs: usize,
    /// Bytes covered (k, m, g suffixes), a multiple of bs*jobs.
    #[arg(long, value_parser = parse_size, default_value = "512M")]
    pub size: u64,
    /// Corpus directory [default: ../shared/corpora/calgary or /work/shared/corpora/calgary].
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// zmem policy.
    #[arg(long, default_value = "balanced", value_parser = clap::builder::PossibleValuesParser::new(POLICIES))]
    pub policy: String,
    /// zmem multi-page block bytes.
    #[arg(long, value_parser = parse_size_usize)]
    pub block: Option<usize>,
    /// zmem memory limit.
    #[arg(long, value_parser = parse_size)]
    pub mem_limit: Option<u64>,
    /// Write the result as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Do not compare reads with the corpus.
    #[arg(long)]
    pub no_verify: bool,
    /// Algorithm for a /dev/zramN target (configured for the run, reset after).
    #[arg(long, default_value = "lz4")]
    pub zram_alg: String,
    /// zmem target: an accelerator backend for the store's batched writes (`--bs` of 64k or
    /// more), the CPU taking what it hands back; `sim` is the GPU backend over a simulated
    /// device (checks the path; its speed means nothing).
    #[arg(long, value_enum, default_value = "cpu")]
    pub backend: crate::offload::BackendKind,
}

/// Seed of the random permutations (job j uses SEED + j): runs are reproducible.
pub const SEED: u64 = 0x7a6d_656d_5eed;

/// Every VERIFY_STRIDE-th block is read back after a write phase when verifying.
pub const VERIFY_STRIDE: u64 = 7;

/// The I/O pattern.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Rw {
    #[value(name = "write")]
    Write,
    #[value(name = "read")]
    Read,
    #[value(name = "randread")]
    RandRead,
    #[value(name = "randwrite")]
    RandWrite,
}

impl Rw {
    pub fn is_write(self) -> bool {
        matches!(self, Rw::Write | Rw::RandWrite)
    }
    pub fn is_random(self) -> bool {
        matches!(self, Rw::RandRead | Rw::RandWrite)
    }
    pub fn as_str(self) -> &'static str {
        match self {
            Rw::Write => "write",
            Rw::Read => "read",
            Rw::RandRead => "randread",
            Rw::RandWrite => "randwrite",
        }
    }
}

impl std::fmt::Display for Rw {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What to run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PagesSpec {
    pub rw: Rw,
    /// Block size in bytes, a multiple of 4096.
    pub bs: usize,
    /// Threads; each owns a contiguous slice of size/jobs bytes.
    pub jobs: usize,
    /// Bytes covered, a multiple of bs*jobs.
    pub size: u64,
    /// Compare every block read with the corpus (and read back a sample after writes).
    pub verify: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PagesError {
    #[error("block size {0} is not a positive multiple of 4096")]
    BadBlockSize(usize),
    #[error("jobs must be at least 1")]
    NoJobs,
    #[error("block size {bs} is larger than size {size}")]
    BlockLargerThanSize { bs: usize, size: u64 },
    #[error("size {size} is not a multiple of bs*jobs = {unit} (nearest: {below} or {above})")]
    SizeNotMultiple {
        size: u64,
        unit: u64,
        below: String,
        above: String,
    },
    #[error("size {size} is larger than target {target} ({target_size} bytes)")]
    LargerThanTarget {
        size: u64,
        target: String,
        target_size: u64,
    },
    #[error("verify failed on {target}: the {len}-byte block at offset {offset} differs from the corpus at byte {first_bad} (after {phase})")]
    Mismatch {
        target: String,
        offset: u64,
        len: usize,
        first_bad: u64,
        phase: &'static str,
    },
}

impl PagesSpec {
    /// Checks the spec on its own; returns the slice length of one job.
    pub fn validate(&self) -> Result<u64, PagesError> {
        if self.bs == 0 || self.bs % PAGE != 0 {
            return Err(PagesError::BadBlockSize(self.bs));
        }
        if self.jobs == 0 {
            return Err(PagesError::NoJobs);
        }
        if self.bs as u64 > self.size {
            return Err(PagesError::BlockLargerThanSize {
                bs: self.bs,
                size: self.size,
            });
        }
        let unit = (self.bs as u64).saturating_mul(self.jobs as u64);
        if self.size % unit != 0 {
            let below = self.size / unit * unit;
            return Err(PagesError::SizeNotMultiple {
                size: self.size,
                unit,
                below: if below == 0 {
                    "none".into()
                } else {
                    format_size(below)
                },
                above: format_size(below.saturating_add(unit)),
            });
        }
        Ok(self.size / self.jobs as u64)
    }

    /// "4k/1/write"
    pub fn cell(&self) -> String {
        format!("{}/{}/{}", format_size(self.bs as u64), self.jobs, self.rw)
    }
}

/// Latency percentiles of single operations, in microseconds.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
}

impl Latency {
    fn from_histogram(h: &Histogram<u64>) -> Self {
        let us = |ns: u64| ns as f64 / 1000.0;
        Latency {
            p50_us: us(h.value_at_quantile(0.50)),
            p99_us: us(h.value_at_quantile(0.99)),
            p999_us: us(h.value_at_quantile(0.999)),
            max_us: us(h.max()),
            mean_us: h.mean() / 1000.0,
        }
    }
}

/// One run of the page benchmark.
#[derive(Clone, Debug, Serialize)]
pub struct PagesResult {
    pub target: String,
    pub spec: PagesSpec,
    pub seed: u64,
    /// Bytes moved in the timed phase.
    pub bytes: u64,
    pub ops: u64,
    /// Wall time of the timed phase (write phases include flush()).
    pub wall_s: f64,
    pub mib_s: f64,
    /// CPU time of the whole process (getrusage RUSAGE_SELF) during the timed phase.
    pub cpu_user_s: f64,
    pub cpu_sys_s: f64,
    pub cpu_s: f64,
    pub cpu_s_per_gib: f64,
    /// cpu_s / wall_s: cores busy on average.
    pub cpu_cores: f64,
    pub latency: Latency,
    /// Memory accounting after the phase.
    pub memory: MemoryReport,
    /// orig_data_size / mem_used_total (the headline).
    pub ratio_mem_used: Option<f64>,
    /// orig_data_size / compr_data_size.
    pub ratio_compr: Option<f64>,
    /// Bytes compared with the corpus (timed reads plus the read-back after writes).
    pub verified_bytes: u64,
    /// Seconds spent filling the target before a read phase (untimed), if any.
    pub prefill_s: Option<f64>,
    /// After a write phase, the state once the target's idle pass ran (zmem `auto`); None for
    /// targets without one.
    pub settled: Option<Settled>,
    pub extra: serde_json::Value,
}

/// A target's memory after its idle pass ([`PageTarget::settle`]), untimed in the phase.
#[derive(Clone, Debug, Serialize)]
pub struct Settled {
    /// Wall and CPU seconds of the pass.
    pub seconds: f64,
    pub cpu_s: f64,
    pub memory: MemoryReport,
    pub ratio_mem_used: Option<f64>,
    pub ratio_compr: Option<f64>,
}

impl PagesResult {
    /// One human line.
    pub fn summary(&self) -> String {
        let ratio = |r: Option<f64>| r.map_or("-".into(), |r| format!("{r:.3}"));
        format!(
            "{:<16} {:>4} x{} {:<9} {:>9.1} MiB/s  cpu {:>6.3} s/GiB ({:.2} cores)  lat p50 {:.1} p99 {:.1} p99.9 {:.1} us  ratio {} (compr {})",
            self.target,
            format_size(self.spec.bs as u64),
            self.spec.jobs,
            self.spec.rw.as_str(),
            self.mib_s,
            self.cpu_s_per_gib,
            self.cpu_cores,
            self.latency.p50_us,
            self.latency.p99_us,
            self.latency.p999_us,
            ratio(self.ratio_mem_used),
            ratio(self.ratio_compr),
        ) + &self.settled.as_ref().map_or(String::new(), |st| {
            format!(
                ", settled {} after a {:.2} s idle pass",
                ratio(st.ratio_mem_used),
                st.seconds
            )
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Order {
    Sequential,
    Random,
    /// Every VERIFY_STRIDE-th block.
    Sample,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Write,
    Read,
}

struct Phase<'a> {
    target: &'a dyn PageTarget,
    corpus: &'a Corpus,
    bs: usize,
    jobs: usize,
    slice: u64,
    op: Op,
    order: Order,
    verify: bool,
    name: &'a str,
    what: &'static str,
    pb: indicatif::ProgressBar,
}

struct PhaseOut {
    hist: Histogram<u64>,
    ops: u64,
    verified: u64,
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 100 s at 3 significant digits; larger values saturate.
    Histogram::new_with_bounds(1, 100_000_000_000, 3).expect("static histogram bounds are valid")
}

fn blocks_of(job: usize, nblocks: u64, order: Order) -> Vec<u64> {
    match order {
        Order::Sequential => (0..nblocks).collect(),
        Order::Sample => (0..nblocks).step_by(VERIFY_STRIDE as usize).collect(),
        Order::Random => {
            let mut v: Vec<u64> = (0..nblocks).collect();
            let mut rng = rand::rngs::StdRng::seed_from_u64(SEED.wrapping_add(job as u64));
            v.shuffle(&mut rng);
            v
        }
    }
}

impl Phase<'_> {
    fn run(&self) -> anyhow::Result<PhaseOut> {
        let stop = AtomicBool::new(false);
        let outs: Vec<anyhow::Result<PhaseOut>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..self.jobs)
                .map(|job| {
                    let stop = &stop;
                    s.spawn(move || {
                        let r = self.job(job, stop);
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
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("a benchmark thread panicked")))
                })
                .collect()
        });
        self.pb.finish_and_clear();
        let mut total = PhaseOut {
            hist: new_histogram(),
            ops: 0,
            verified: 0,
        };
        // Report the first real error, not the "stopped" of the other jobs.
        let mut first_err = None;
        for o in outs {
            match o {
                Ok(o) => {
                    total
                        .hist
                        .add(&o.hist)
                        .context("merging latency histograms")?;
                    total.ops += o.ops;
                    total.verified += o.verified;
                }
                Err(e) => {
                    if first_err.is_none() || e.downcast_ref::<Interrupted>().is_none() {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(total),
        }
    }

    fn job(&self, job: usize, stop: &AtomicBool) -> anyhow::Result<PhaseOut> {
        let bs = self.bs as u64;
        let base = job as u64 * self.slice;
        let blocks = blocks_of(job, self.slice / bs, self.order);
        let mut buf = AlignedBuf::new(self.bs);
        let mut hist = new_histogram();
        let mut verified = 0u64;
        let mut ops = 0u64;
        let tick = (1u64 << 20).div_ceil(bs).max(1);
        let mut pending = 0u64;
        for blk in blocks {
            if aborted() {
                return Err(Interrupted.into());
            }
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let off = base + blk * bs;
            match self.op {
                Op::Write => {
                    self.corpus.fill(off, &mut buf);
                    let t0 = Instant::now();
                    self.target.write_at(off, &buf)?;
                    record(&mut hist, t0.elapsed());
                }
                Op::Read => {
                    let t0 = Instant::now();
                    self.target.read_at(off, &mut buf)?;
                    record(&mut hist, t0.elapsed());
                    if self.verify {
                        if let Some(i) = self.corpus.first_mismatch(off, &buf) {
                            return Err(PagesError::Mismatch {
                                target: self.name.to_string(),
                                offset: off,
                                len: self.bs,
                                first_bad: off + i as u64,
                                phase: self.what,
                            }
                            .into());
                        }
                        verified += bs;
                    }
                }
            }
            ops += 1;
            pending += 1;
            if pending == tick {
                self.pb.inc(pending * bs);
                pending = 0;
            }
        }
        self.pb.inc(pending * bs);
        Ok(PhaseOut {
            hist,
            ops,
            verified,
        })
    }
}

fn record(h: &mut Histogram<u64>, d: Duration) {
    h.saturating_record(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX).max(1));
}

/// CPU time of the whole process so far: (user, system) seconds.
pub fn cpu_times() -> (f64, f64) {
    // SAFETY: rusage is plain old data; getrusage fills it.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: &mut ru is a valid pointer; RUSAGE_SELF is a valid `who`.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return (0.0, 0.0);
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    (tv(ru.ru_utime), tv(ru.ru_stime))
}

/// Runs one spec against a target. For read patterns the whole range is first filled (untimed)
/// from the corpus. Every read is compared with the corpus when `spec.verify`.
pub fn run(
    target: &dyn PageTarget,
    corpus: &Corpus,
    spec: &PagesSpec,
) -> anyhow::Result<PagesResult> {
    let slice = spec.validate()?;
    let name = target.name();
    if spec.size > target.size_bytes() {
        return Err(PagesError::LargerThanTarget {
            size: spec.size,
            target: name,
            target_size: target.size_bytes(),
        }
        .into());
    }
    let phase = |op, order, verify, what, msg: String| Phase {
        target,
        corpus,
        bs: spec.bs,
        jobs: spec.jobs,
        slice,
        op,
        order,
        verify,
        name: &name,
        what,
        pb: progress_bar(spec.size, msg),
    };

    let mut prefill_s = None;
    if !spec.rw.is_write() {
        let t0 = Instant::now();
        phase(
            Op::Write,
            Order::Sequential,
            false,
            "fill",
            format!("{name}: fill"),
        )
        .run()
        .with_context(|| format!("filling {name}"))?;
        target
            .flush()
            .with_context(|| format!("flushing {name} after the fill"))?;
        prefill_s = Some(t0.elapsed().as_secs_f64());
    }

    let (op, order) = match spec.rw {
        Rw::Write => (Op::Write, Order::Sequential),
        Rw::RandWrite => (Op::Write, Order::Random),
        Rw::Read => (Op::Read, Order::Sequential),
        Rw::RandRead => (Op::Read, Order::Random),
    };
    let timed = phase(
        op,
        order,
        spec.verify,
        spec.rw.as_str(),
        format!("{name}: {}", spec.cell()),
    );
    let (u0, s0) = cpu_times();
    let t0 = Instant::now();
    let out = timed.run()?;
    if spec.rw.is_write() {
        target.flush().with_context(|| format!("flushing {name}"))?;
    }
    let wall = t0.elapsed().as_secs_f64();
    let (u1, s1) = cpu_times();
    drop(timed);

    let memory = target
        .memory()
        .with_context(|| format!("memory report of {name}"))?;

    // The settled state (zmem `auto` after its idle pass), before the read-back below so that
    // the verification covers the recompressed data.
    let mut settled = None;
    if spec.rw.is_write() {
        let (u0, s0) = cpu_times();
        let t0 = Instant::now();
        if target
            .settle()
            .with_context(|| format!("settling {name}"))?
        {
            let seconds = t0.elapsed().as_secs_f64();
            let (u1, s1) = cpu_times();
            let memory = target
                .memory()
                .with_context(|| format!("memory report of {name} after settling"))?;
            settled = Some(Settled {
                seconds,
                cpu_s: (u1 - u0) + (s1 - s0),
                ratio_mem_used: memory.ratio_mem_used(),
                ratio_compr: memory.ratio_compr(),
                memory,
            });
        }
    }
    let extra = target.extra();

    let mut verified = out.verified;
    if spec.verify && spec.rw.is_write() {
        let back = phase(
            Op::Read,
            Order::Sample,
            true,
            "write, reading back",
            format!("{name}: verify"),
        )
        .run()?;
        verified += back.verified;
    }

    let bytes = out.ops * spec.bs as u64;
    let gib = bytes as f64 / (1u64 << 30) as f64;
    let (cpu_user_s, cpu_sys_s) = (u1 - u0, s1 - s0);
    let cpu_s = cpu_user_s + cpu_sys_s;
    Ok(PagesResult {
        target: name,
        spec: spec.clone(),
        seed: SEED,
        bytes,
        ops: out.ops,
        wall_s: wall,
        mib_s: if wall > 0.0 {
            bytes as f64 / (1u64 << 20) as f64 / wall
        } else {
            0.0
        },
        cpu_user_s,
        cpu_sys_s,
        cpu_s,
        cpu_s_per_gib: if gib > 0.0 { cpu_s / gib } else { 0.0 },
        cpu_cores: if wall > 0.0 { cpu_s / wall } else { 0.0 },
        latency: Latency::from_histogram(&out.hist),
        ratio_mem_used: memory.ratio_mem_used(),
        ratio_compr: ratio_of(memory.orig_data_size, memory.compr_data_size),
        memory,
        verified_bytes: verified,
        prefill_s,
        settled,
        extra,
    })
}

/// Reads the first `spec.size` bytes of `target` (bs, jobs of `spec`; untimed) and compares
/// every block with the corpus; returns the bytes verified. A mismatch is a
/// [`PagesError::Mismatch`].
pub fn verify_contents(
    target: &dyn PageTarget,
    corpus: &Corpus,
    spec: &PagesSpec,
) -> anyhow::Result<u64> {
    let slice = spec.validate()?;
    let name = target.name();
    let out = Phase {
        target,
        corpus,
        bs: spec.bs,
        jobs: spec.jobs,
        slice,
        op: Op::Read,
        order: Order::Sequential,
        verify: true,
        name: &name,
        what: "verify",
        pb: progress_bar(spec.size, format!("{name}: verify")),
    }
    .run()?;
    Ok(out.verified)
}
/// `zmem bench pages`.
pub fn run_command(args: &PagesArgs) -> anyhow::Result<()> {
    let spec = PagesSpec {
        rw: args.rw,
        bs: args.bs,
        jobs: args.jobs,
        size: args.size,
        verify: !args.no_verify,
    };
    spec.validate()?;
    let corpus_dir = args.corpus.clone().unwrap_or_else(default_corpus);
    let corpus = Corpus::load(&corpus_dir)?;
    crate::abort::install_abort_handler();

    let result = if args.target == "zmem" {
        let target = zmem_target::open(&ZmemTargetConfig {
            size: spec.size,
            policy: args.policy.clone(),
            block: args.block,
            mem_limit: args.mem_limit,
            backend: args.backend,
        })?;
        run(target.as_ref(), &corpus, &spec)?
    } else {
        run_blockdev(Path::new(&args.target), &args.zram_alg, &corpus, &spec)?
    };
    println!("{}", result.summary());
    if let Some(path) = &args.json {
        let doc = serde_json::json!({
            "command": std::env::args().collect::<Vec<_>>(),
            "machine": MachineInfo::collect(),
            "corpus": corpus_info(&corpus),
            "result": result,
        });
        write_json(path, &doc)?;
        eprintln!("zmem: wrote {}", path.display());
    }
    Ok(())
}

/// Runs `spec` on a block device; a /dev/zramN is configured (algorithm, disksize = size)
/// through a [`ZramSession`] for the run and reset after.
pub fn run_blockdev(
    path: &Path,
    zram_alg: &str,
    corpus: &Corpus,
    spec: &PagesSpec,
) -> anyhow::Result<PagesResult> {
    if !path.exists() {
        return Err(BlockDevError::NotFound(path.to_path_buf()).into());
    }
    match zram_index(path) {
        Some(n) => {
            let mut session = ZramSession::acquire(n)?;
            session.configure(zram_alg, spec.size)?;
            // The target is dropped (closed) before the session resets the device.
            let target = BlockDevTarget::open(path)?;
            run(&target, corpus, spec)
        }
        None => {
            let target = BlockDevTarget::open(path)?;
            run(&target, corpus, spec)
        }
    }
}
