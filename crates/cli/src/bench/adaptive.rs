//! `zmem bench adaptive`: an adaptive region under a memory hog. A region with an adaptive budget
//! (`Budget::Adaptive`, policy fast) is filled with corpus pages and read and written by one
//! thread with a zipf-like pattern; `--at` seconds in, another process (this binary, `zmem bench
//! hog`) allocates and touches `--take` bytes, holds them for `--hold`, frees them and exits. A
//! sample every 250 ms records the budget, the resident bytes, MemAvailable, PSI, the region's
//! refaults and the controller's last decision; the run ends with a summary, a JSON file and an
//! SVG timeline.
//!
//! The controller (crates/region/src/budget.rs documents the control law) gives memory back when
//! MemAvailable falls below its `reserve`. A machine with far more free memory than `--take`
//! would not notice the hog with the default reserve, so the bench chooses the reserve from the
//! machine: `reserve = MemAvailable before the run − the region's expected footprint − take +
//! deficit`, so that the hog, if the region did nothing, would push MemAvailable `deficit` below
//! the reserve. The default deficit is 1 GiB (at most half of `--take`): MemAvailable moves by
//! a few hundred MiB on its own (other processes; on Linux ≥ 6.7 pages freed in bulk also wait
//! on per-CPU lists, uncounted, for a while), so a deficit much smaller than that may not show.
//! The region's footprint is estimated as `min(size, max)` resident plus the rest compressed at
//! the lz4 ratio of the corpus, measured before the run. A region can give back only
//! `(max − min)·(1 − 1/ratio)` (an evicted page still costs its compressed copy); with a larger
//! deficit, the default's case, the budget goes down to `min` and stays there while the hog holds.
//!
//! The hog dies with this process (PR_SET_PDEATHSIG), is killed by its PID if the bench fails or
//! is interrupted, stops touching memory if MemAvailable falls below 1 GiB, and `--take` is
//! refused unless 2 GiB stay available beside it and the region. `--hold` counts from the hog's
//! start, touching included (touching 4 GiB takes from under 1 s to over 10 s on a busy VM), so
//! the hog's interval is `--at .. --at + --hold` whatever its speed.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use clap::Args;
use plotters::prelude::*;
use serde::Serialize;
use zmem_engine::Policy;
use zmem_region::budget::{read_machine, read_mem_available};
use zmem_region::{AdaptiveConfig, Budget, Region, RegionConfig, RegionStats};
use zmem_store::{PageStore, StoreConfig};

use super::corpus::Corpus;
use super::{aborted, fmt_size, Interrupted, MachineInfo, PAGE};
use crate::cli::{corpus_info, default_corpus, write_json};
use crate::size::parse_size;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Sampling period of the timeline.
pub const SAMPLE: Duration = Duration::from_millis(250);

/// MemAvailable that must stay beside the hog and the region (`--take` is refused otherwise).
pub const KEEP_FREE: u64 = 2 * GIB;

/// The default deficit (at most half of --take).
pub const DEFICIT: u64 = GIB;

/// The hog stops touching memory when MemAvailable falls below this.
pub const HOG_FLOOR: u64 = GIB;

/// A budget counts as grown back at this fraction of the budget before the hog.
pub const REGROWN: f64 = 0.95;

/// Parses "10s", "250ms", "1.5s", "2m" or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1e-3)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60.0)
    } else {
        (t, 1.0)
    };
    match num.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 && v * mult < 1e9 => {
            Ok(Duration::from_secs_f64(v * mult))
        }
        _ => Err(format!(
            "invalid duration {s:?} (expected e.g. 10s, 250ms, 2m)"
        )),
    }
}

#[derive(Debug, Clone, Args)]
#[command(after_help = "\
The reserve: the controller gives memory back when MemAvailable < reserve. By default the bench \
sets reserve = MemAvailable before the run - the region's expected footprint (max resident + the \
rest compressed at the corpus ratio) - take + deficit, so that the hog, if the region did \
nothing, would push MemAvailable `deficit` below the reserve; the default deficit is 1G (at most \
half of --take). The region can give back only (max - min) * (1 - 1/ratio), since an evicted page \
still costs its compressed copy; with a deficit beyond that the budget goes down to --min. The \
reserve used is printed and recorded in the JSON. --take is \
refused unless MemAvailable keeps 2G beside the hog and the region.")]
pub struct AdaptiveArgs {
    /// Bytes of the region (filled with corpus pages).
    #[arg(long, value_parser = parse_size, default_value = "2G")]
    pub size: u64,
    /// Smallest budget.
    #[arg(long, value_parser = parse_size, default_value = "64M")]
    pub min: u64,
    /// Largest budget (also the starting budget).
    #[arg(long, value_parser = parse_size, default_value = "1536M")]
    pub max: u64,
    /// Bytes the hog process allocates and touches.
    #[arg(long, value_parser = parse_size, default_value = "4G")]
    pub take: u64,
    /// When the hog starts, counted from the start of the access phase.
    #[arg(long, value_parser = parse_duration, default_value = "10s")]
    pub at: Duration,
    /// How long the hog keeps its memory, from its start (touching included) to its exit.
    #[arg(long, value_parser = parse_duration, default_value = "20s")]
    pub hold: Duration,
    /// Length of the access phase.
    #[arg(long, value_parser = parse_duration, default_value = "45s")]
    pub duration: Duration,
    /// MemAvailable the controller keeps free [default: see below].
    #[arg(long, value_parser = parse_size)]
    pub reserve: Option<u64>,
    /// How far the hog should push MemAvailable below the default reserve (less than --take)
    /// [default: 1G, at most half of --take]. Ignored with --reserve.
    #[arg(long, value_parser = parse_size)]
    pub deficit: Option<u64>,
    /// Control interval of the adaptive budget.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub interval: Duration,
    /// No growth for this long after a shrink (the controller's grow_cooldown).
    #[arg(long, value_parser = parse_duration, default_value = "5s")]
    pub cooldown: Duration,
    /// Fraction of the accesses that rewrite their page from the corpus; the others read it.
    #[arg(long, default_value_t = 0.1)]
    pub write_ratio: f64,
    /// Exponent of the zipf-like access pattern.
    #[arg(long, default_value_t = 0.99)]
    pub zipf_s: f64,
    /// Corpus directory [default: ../shared/corpora/calgary or /work/shared/corpora/calgary].
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// JSON output (all samples, the controller's decisions, the summary).
    #[arg(long, default_value = "bench-out/adaptive.json")]
    pub json: PathBuf,
    /// SVG timeline output.
    #[arg(long, default_value = "bench-out/adaptive.svg")]
    pub svg: PathBuf,
}

/// `zmem bench hog`: the memory hog of `bench adaptive` (internal).
#[derive(Debug, Clone, Args)]
pub struct HogArgs {
    /// Bytes to allocate and touch.
    #[arg(long, value_parser = parse_size)]
    pub size: u64,
    /// When to free them and exit, from the start (touching stops there if not done).
    #[arg(long, value_parser = parse_duration)]
    pub hold: Duration,
    /// Exit at once unless this is the parent's PID; the hog also dies with its parent.
    #[arg(long)]
    pub parent: Option<u32>,
}

/// The checked settings of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub size: u64,
    pub min: u64,
    pub max: u64,
    pub take: u64,
    pub at_s: f64,
    pub hold_s: f64,
    pub duration_s: f64,
    pub interval_s: f64,
    pub cooldown_s: f64,
    pub write_ratio: f64,
    pub zipf_s: f64,
    pub policy: &'static str,
    /// MemAvailable before the region was created.
    pub mem_available_start: u64,
    /// lz4 ratio (original / compressed bytes) of the first corpus pages, measured before the run.
    pub ratio_estimate: f64,
    /// Expected DRAM of the filled region: min(size, max) + the rest / ratio.
    pub footprint_estimate: u64,
    /// What shrinking from max to min can free: (max − min)·(1 − 1/ratio).
    pub freeable_estimate: u64,
    /// MemAvailable the hog would leave below the reserve if the region did nothing (negative:
    /// it stays above).
    pub deficit: i64,
    pub reserve: u64,
    /// "default" or "--reserve".
    pub reserve_from: &'static str,
}

/// Validates the arguments and the machine, measures the ratio and chooses the reserve.
pub fn plan(a: &AdaptiveArgs, corpus: &Corpus, mem_available: u64) -> anyhow::Result<Plan> {
    check_args(a)?;
    let ratio = probe_ratio(corpus, a.size)?;
    let kept = a.size.min(a.max);
    let footprint = kept + ((a.size - kept) as f64 / ratio) as u64;
    let freeable = ((kept.saturating_sub(a.min)) as f64 * (1.0 - 1.0 / ratio)).max(0.0) as u64;
    let left = mem_available
        .checked_sub(footprint)
        .and_then(|l| l.checked_sub(a.take));
    let left = match left {
        Some(l) if l >= KEEP_FREE => l,
        _ => bail!(
            "--take {} is too large: MemAvailable is {}, the region needs about {} and {} must \
             stay available (at most --take {})",
            fmt_size(a.take),
            human(mem_available),
            human(footprint),
            human(KEEP_FREE),
            human(
                mem_available
                    .saturating_sub(footprint)
                    .saturating_sub(KEEP_FREE)
            )
        ),
    };
    let (reserve, deficit, from) = match a.reserve {
        Some(r) => (r, r as i64 - left as i64, "--reserve"),
        None => {
            let d = a.deficit.unwrap_or(DEFICIT.min(a.take / 2));
            if d >= a.take {
                bail!(
                    "--deficit {} must be smaller than --take {}: MemAvailable would be below \
                     the reserve before the hog starts",
                    fmt_size(d),
                    fmt_size(a.take)
                );
            }
            (left + d, d as i64, "default")
        }
    };
    Ok(Plan {
        size: a.size,
        min: a.min,
        max: a.max,
        take: a.take,
        at_s: a.at.as_secs_f64(),
        hold_s: a.hold.as_secs_f64(),
        duration_s: a.duration.as_secs_f64(),
        interval_s: a.interval.as_secs_f64(),
        cooldown_s: a.cooldown.as_secs_f64(),
        write_ratio: a.write_ratio,
        zipf_s: a.zipf_s,
        policy: "fast",
        mem_available_start: mem_available,
        ratio_estimate: ratio,
        footprint_estimate: footprint,
        freeable_estimate: freeable,
        deficit,
        reserve,
        reserve_from: from,
    })
}

/// Checks the arguments alone (no machine, no corpus).
pub fn check_args(a: &AdaptiveArgs) -> anyhow::Result<()> {
    let min_budget = (zmem_region::MIN_BUDGET_PAGES * PAGE) as u64;
    if a.size < min_budget || a.size % PAGE as u64 != 0 {
        bail!(
            "--size {} must be a multiple of 4k and at least {}",
            fmt_size(a.size),
            fmt_size(min_budget)
        );
    }
    if a.min > a.max {
        bail!(
            "--min {} is larger than --max {}",
            fmt_size(a.min),
            fmt_size(a.max)
        );
    }
    if a.min < min_budget {
        bail!(
            "--min {} is below the smallest budget, {}",
            fmt_size(a.min),
            fmt_size(min_budget)
        );
    }
    if a.max > a.size {
        bail!(
            "--max {} is larger than --size {}",
            fmt_size(a.max),
            fmt_size(a.size)
        );
    }
    if a.take == 0 {
        bail!("--take must be more than 0");
    }
    if a.at.is_zero() || a.hold.is_zero() || a.interval.is_zero() {
        bail!("--at, --hold and --interval must be more than 0");
    }
    if a.at + a.hold >= a.duration {
        bail!(
            "--at {:?} + --hold {:?} must end before --duration {:?}",
            a.at,
            a.hold,
            a.duration
        );
    }
    if !(0.0..=1.0).contains(&a.write_ratio) {
        bail!("--write-ratio {} must be within 0..=1", a.write_ratio);
    }
    if !(a.zipf_s.is_finite() && a.zipf_s > 0.0) {
        bail!("--zipf-s {} must be a positive number", a.zipf_s);
    }
    Ok(())
}

/// Original / compressed bytes of the region's first pages (up to 32 MiB) under policy fast.
fn probe_ratio(corpus: &Corpus, size: u64) -> anyhow::Result<f64> {
    let pages = (size / PAGE as u64).min(8192);
    let store = PageStore::new(StoreConfig::new(pages, Policy::Fast))?;
    let mut buf = vec![0u8; PAGE];
    for p in 0..pages {
        corpus.fill(p * PAGE as u64, &mut buf);
        store.write(p, &buf)?;
    }
    let s = store.stats();
    // 16 bytes of page state per page: same-filled pages cost that and nothing more.
    let cost = s.compr_data_size + 16 * pages;
    Ok((s.orig_data_size as f64 / cost as f64).max(1.0))
}

/// "812M" below 10 GiB, "18.2G" above.
pub fn human(b: u64) -> String {
    if b >= 10 * GIB {
        format!("{:.1}G", b as f64 / GIB as f64)
    } else {
        format!("{}M", (b + MIB / 2) / MIB)
    }
}

/// Where the hog is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum HogState {
    /// Not started yet.
    None,
    /// Started, touching its memory.
    Allocating,
    /// All touched, holding.
    Holding,
    /// Freed its memory.
    Gone,
}

/// One point of the timeline.
#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Seconds since the start of the access phase.
    pub t: f64,
    pub budget: u64,
    pub resident: u64,
    /// Evicted pages waiting for compression.
    pub staged: u64,
    /// The compressed pool.
    pub pool: u64,
    pub mem_available: u64,
    pub psi_some_avg10: f64,
    /// Region faults on evicted pages (major + staged) per second since the previous sample.
    pub refaults_per_s: f64,
    pub accesses_per_s: f64,
    /// Cumulative since the start of the access phase.
    pub refaults: u64,
    pub accesses: u64,
    pub hog: HogState,
    /// The controller's latest decision at the time (`Reason` name).
    pub reason: Option<String>,
}

/// One step of the controller, as recorded by the region.
#[derive(Clone, Debug, Serialize)]
pub struct DecisionOut {
    /// Seconds since the start of the access phase (negative: during the fill).
    pub t: f64,
    pub budget: u64,
    pub reason: String,
    pub text: String,
    /// PSI some stall fraction over the step, 0..=1.
    pub pressure: f64,
}

/// Averages over one phase of the run.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseOut {
    pub name: &'static str,
    pub from_s: f64,
    pub to_s: f64,
    pub refaults_per_s: f64,
    pub accesses_per_s: f64,
    pub mean_budget: u64,
    pub mean_resident: u64,
    pub min_mem_available: u64,
    pub mean_psi_some_avg10: f64,
}

/// The figures of a run.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub reserve: u64,
    pub hog_start_s: f64,
    /// When the hog had touched all its memory.
    pub hog_ready_s: Option<f64>,
    /// When the hog had freed its memory.
    pub hog_exit_s: Option<f64>,
    /// Bytes the hog touched (less than --take if it stopped at the MemAvailable floor or at
    /// the end of --hold).
    pub hog_touched: Option<u64>,
    /// Budget at the last sample before the hog started.
    pub budget_before: u64,
    /// Lowest budget while the hog held memory (start to exit).
    pub budget_lowest: u64,
    /// Seconds from the hog's start to the first sample at the lowest budget.
    pub time_to_lowest_s: f64,
    /// When MemAvailable first fell below the reserve after the hog started.
    pub below_reserve_s: Option<f64>,
    /// Budget at the first sample after the hog freed its memory.
    pub budget_at_hog_exit: Option<u64>,
    /// Budget at the end of the run.
    pub budget_final: u64,
    /// Seconds from the hog's exit until the budget was back at 95% of budget_before (None: not
    /// within the run).
    pub regrow_s: Option<f64>,
    pub min_mem_available_during_hog: u64,
    pub phases: Vec<PhaseOut>,
    /// Controller steps by reason over the access phase.
    pub decisions: Vec<(String, usize)>,
}

/// Shared between the sampling loop and the hog's stdout reader.
#[derive(Default, Debug)]
struct HogEvents {
    ready: Option<f64>,
    exit: Option<f64>,
    touched: Option<u64>,
    note: Option<String>,
}

/// The hog process; killed (by its PID, SIGKILL) and reaped on drop if still running.
struct HogGuard {
    child: Option<Child>,
    events: Arc<Mutex<HogEvents>>,
    start: f64,
}

impl HogGuard {
    fn spawn(take: u64, hold: Duration, t0: Instant) -> anyhow::Result<HogGuard> {
        // /proc/self/exe runs this very binary even if its file was replaced since it started.
        let exe = match Path::new("/proc/self/exe") {
            p if p.exists() => p.to_path_buf(),
            _ => std::env::current_exe().context("finding this executable for the hog")?,
        };
        let mut child = Command::new(exe)
            .args([
                "bench",
                "hog",
                "--size",
                &take.to_string(),
                "--hold",
                &format!("{}ms", hold.as_millis()),
                "--parent",
                &std::process::id().to_string(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .context("starting the memory hog")?;
        let start = t0.elapsed().as_secs_f64();
        let events = Arc::new(Mutex::new(HogEvents::default()));
        let stdout = child.stdout.take().expect("piped stdout");
        let ev = events.clone();
        std::thread::Builder::new()
            .name("zmem-hog-reader".into())
            .spawn(move || {
                for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                    let now = t0.elapsed().as_secs_f64();
                    let mut e = ev.lock().unwrap_or_else(|p| p.into_inner());
                    let mut words = line.split_whitespace();
                    match words.next() {
                        Some("touched") => {
                            e.ready = Some(now);
                            e.touched = words.next().and_then(|w| w.parse().ok());
                        }
                        Some("freed") => e.exit = Some(now),
                        _ => e.note = Some(line.clone()),
                    }
                }
            })
            .context("starting the hog's reader thread")?;
        Ok(HogGuard {
            child: Some(child),
            events,
            start,
        })
    }

    fn events(&self) -> std::sync::MutexGuard<'_, HogEvents> {
        self.events.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Reaps the hog if it has exited; an exit before it freed its memory is an error.
    fn poll(&mut self) -> anyhow::Result<()> {
        let Some(child) = self.child.as_mut() else {
            return Ok(());
        };
        if let Some(status) = child.try_wait().context("waiting for the hog")? {
            self.child = None;
            // The reader may see "freed" a moment after the exit: give it that moment.
            for _ in 0..50 {
                if self.events().exit.is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            let e = self.events();
            if !status.success() || e.exit.is_none() {
                bail!(
                    "the memory hog failed ({status}){}",
                    e.note
                        .as_deref()
                        .map(|n| format!(": {n}"))
                        .unwrap_or_default()
                );
            }
        }
        Ok(())
    }

    fn state(&self) -> HogState {
        let e = self.events();
        if e.exit.is_some() {
            HogState::Gone
        } else if e.ready.is_some() {
            HogState::Holding
        } else {
            HogState::Allocating
        }
    }
}

impl Drop for HogGuard {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            if !matches!(child.try_wait(), Ok(Some(_))) {
                // Child::kill signals exactly the PID we started.
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}

/// `zmem bench hog`: allocate and touch `size` bytes, hold them until `hold` after the start,
/// free them, exit. Prints
/// `touched BYTES SECONDS` once all is touched and `freed` after unmapping.
pub fn hog_main(a: &HogArgs) -> anyhow::Result<()> {
    if let Some(parent) = a.parent {
        // SAFETY: prctl with PR_SET_PDEATHSIG and a signal number has no memory effects.
        unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
        // SAFETY: getppid cannot fail.
        if unsafe { libc::getppid() } as u32 != parent {
            bail!("hog: parent {parent} is gone");
        }
    }
    let len = usize::try_from(a.size)
        .ok()
        .filter(|&l| l > 0)
        .context("hog: bad size")?;
    let t = Instant::now();
    let deadline = t + a.hold;
    // SAFETY: a fresh private anonymous mapping; the kernel picks the address.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        bail!("hog: mmap {len} bytes: {}", std::io::Error::last_os_error());
    }
    let base = p as usize;
    let mut touched = 0usize;
    const STEP: usize = 64 << 20;
    while touched < len && Instant::now() < deadline {
        if read_mem_available().unwrap_or(u64::MAX) < HOG_FLOOR {
            eprintln!(
                "zmem bench hog: MemAvailable below {}: holding {} instead of {}",
                human(HOG_FLOOR),
                human(touched as u64),
                human(len as u64)
            );
            break;
        }
        let end = (touched + STEP).min(len);
        let mut off = touched;
        while off < end {
            // SAFETY: inside our own mapping.
            unsafe { std::ptr::write_volatile((base + off) as *mut u8, 1) };
            off += PAGE;
        }
        touched = end;
    }
    let mut out = std::io::stdout().lock();
    writeln!(out, "touched {touched} {:.3}", t.elapsed().as_secs_f64())?;
    out.flush()?;
    if let Some(d) = deadline.checked_duration_since(Instant::now()) {
        std::thread::sleep(d);
    }
    // SAFETY: our own mapping, unmapped once.
    unsafe { libc::munmap(p, len) };
    writeln!(out, "freed")?;
    out.flush()?;
    Ok(())
}

/// A zipf-like rank generator without tables: the continuous power law x^-s on [1, n+1),
/// sampled by inversion, floored to a rank in 0..n.
#[derive(Clone, Copy, Debug)]
pub struct ZipfLike {
    n: u64,
    s: f64,
    a: f64,
}

impl ZipfLike {
    pub fn new(n: u64, s: f64) -> ZipfLike {
        let n1 = (n + 1) as f64;
        let a = if (1.0 - s).abs() < 1e-9 {
            n1.ln()
        } else {
            n1.powf(1.0 - s) - 1.0
        };
        ZipfLike { n, s, a }
    }

    /// The rank for a uniform `u` in [0, 1).
    pub fn rank(&self, u: f64) -> u64 {
        let x = if (1.0 - self.s).abs() < 1e-9 {
            (u * self.a).exp()
        } else {
            (1.0 + u * self.a).powf(1.0 / (1.0 - self.s))
        };
        (x as u64).saturating_sub(1).min(self.n - 1)
    }
}

/// splitmix64: a small, fast generator for the access stream.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Maps ranks to pages with `rank · mult mod pages` (a bijection), so hot pages are scattered.
fn page_multiplier(pages: u64) -> u64 {
    const PRIME: u64 = 2_654_435_761;
    if gcd(PRIME, pages) == 1 {
        PRIME
    } else {
        1
    }
}

/// Writes every page of the region from the corpus.
fn fill(region: &Region, corpus: &Corpus) -> anyhow::Result<f64> {
    let len = region.len() as u64;
    let pb = super::progress_bar(len, format!("adaptive: fill {}", fmt_size(len)));
    let base = region.as_ptr() as usize;
    let mut buf = vec![0u8; PAGE];
    let t = Instant::now();
    for p in 0..len / PAGE as u64 {
        if p % 1024 == 0 {
            if aborted() {
                return Err(Interrupted.into());
            }
            pb.set_position(p * PAGE as u64);
        }
        corpus.fill(p * PAGE as u64, &mut buf);
        // SAFETY: the page is inside the region, which stays mapped while `region` lives; only
        // this thread touches the region during the fill.
        unsafe {
            std::ptr::copy_nonoverlapping(buf.as_ptr(), (base + p as usize * PAGE) as *mut u8, PAGE)
        };
    }
    pb.finish_and_clear();
    Ok(t.elapsed().as_secs_f64())
}

/// The access thread: zipf-like pages, `write_ratio` of them rewritten from the corpus, the
/// others read (one word per cache line). Counts accesses into `count` until `stop`.
fn access_loop(
    region: &Region,
    corpus: &Corpus,
    zipf_s: f64,
    write_ratio: f64,
    stop: &AtomicBool,
    count: &AtomicU64,
) {
    let base = region.as_ptr() as usize;
    let pages = region.len() as u64 / PAGE as u64;
    let zipf = ZipfLike::new(pages, zipf_s);
    let mult = page_multiplier(pages);
    let mut rng = Rng(0x7a6d_656d_ada9);
    let mut buf = vec![0u8; PAGE];
    let clen = corpus.len();
    let mut sink = 0u64;
    while !stop.load(Ordering::Relaxed) && !aborted() {
        for _ in 0..256 {
            let rank = zipf.rank(rng.next_f64());
            let p = ((u128::from(rank) * u128::from(mult)) % u128::from(pages)) as usize;
            let addr = base + p * PAGE;
            if rng.next_f64() < write_ratio {
                corpus.fill(rng.next_u64() % clen, &mut buf);
                // SAFETY: the page is inside the region, mapped while `region` lives; only this
                // thread accesses the region's memory during the access phase.
                unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), addr as *mut u8, PAGE) };
            } else {
                for off in (0..PAGE).step_by(64) {
                    // SAFETY: as above; aligned u64 reads inside the page.
                    sink = sink.wrapping_add(unsafe {
                        std::ptr::read_volatile((addr + off) as *const u64)
                    });
                }
            }
        }
        count.fetch_add(256, Ordering::Relaxed);
    }
    std::hint::black_box(sink);
}

fn refaults(s: &RegionStats) -> u64 {
    s.major_faults + s.staged_faults
}

/// The result of a run, as written to JSON.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub plan: Plan,
    pub fill_s: f64,
    pub samples: Vec<Sample>,
    pub decisions: Vec<DecisionOut>,
    pub summary: Option<Summary>,
    /// Region counters at the end.
    pub region: serde_json::Value,
}

pub fn run(a: &AdaptiveArgs) -> anyhow::Result<()> {
    check_args(a)?;
    let (_, _, avail) = read_machine()
        .map_err(|e| anyhow::anyhow!("bench adaptive needs PSI and MemAvailable: {e}"))?;
    let corpus_dir = a.corpus.clone().unwrap_or_else(default_corpus);
    let corpus = Corpus::load(&corpus_dir)?;
    let plan = plan(a, &corpus, avail)?;
    super::install_abort_handler();
    println!("{}", plan_line(&plan));

    let report = run_plan(a, &plan, &corpus)?;
    if let Some(s) = &report.summary {
        println!("{}", summary_text(&plan, s));
    }
    let doc = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "machine": MachineInfo::collect(),
        "corpus": corpus_info(&corpus),
        "result": report,
    });
    write_json(&a.json, &doc)?;
    eprintln!("zmem: wrote {}", a.json.display());
    plot(&report, &a.svg).with_context(|| format!("drawing {}", a.svg.display()))?;
    eprintln!("zmem: wrote {}", a.svg.display());
    if report.summary.is_none() {
        bail!("the hog never ran: no summary");
    }
    Ok(())
}

fn plan_line(p: &Plan) -> String {
    let how = if p.reserve_from == "default" {
        format!(
            " = MemAvailable {} - region ~{} (lz4 ratio {:.2}) - take {} + deficit {}",
            human(p.mem_available_start),
            human(p.footprint_estimate),
            p.ratio_estimate,
            fmt_size(p.take),
            human(p.deficit.max(0) as u64)
        )
    } else if p.deficit > 0 {
        format!(
            " (--reserve): the hog should push MemAvailable ~{} below it",
            human(p.deficit as u64)
        )
    } else {
        format!(
            " (--reserve): the hog should leave MemAvailable ~{} above it",
            human(p.deficit.unsigned_abs())
        )
    };
    format!(
        "adaptive: region {} budget {}..{} (fast); hog takes {} at {}s for {}s; run {}s; \
         reserve {}{}; the region can give back ~{}{}",
        fmt_size(p.size),
        fmt_size(p.min),
        fmt_size(p.max),
        fmt_size(p.take),
        p.at_s,
        p.hold_s,
        p.duration_s,
        human(p.reserve),
        how,
        human(p.freeable_estimate),
        if p.deficit > p.freeable_estimate as i64 {
            " (less than the deficit: expect the budget to reach --min)"
        } else {
            ""
        }
    )
}

fn run_plan(a: &AdaptiveArgs, plan: &Plan, corpus: &Corpus) -> anyhow::Result<Report> {
    let mut cfg = AdaptiveConfig::new(plan.min, plan.max);
    cfg.reserve = plan.reserve;
    cfg.interval = a.interval;
    cfg.grow_cooldown = a.cooldown;
    let mut rcfg = RegionConfig::new(plan.size, Budget::Adaptive(cfg));
    rcfg.policy = Policy::Fast;
    let created = Instant::now();
    let region = Region::new(rcfg)?;
    let fill_s = fill(&region, corpus)?;

    let stop = AtomicBool::new(false);
    let count = AtomicU64::new(0);
    let t0 = Instant::now();
    let offset = t0.duration_since(created).as_secs_f64();
    let mut samples: Vec<Sample> = Vec::new();
    let mut hog: Option<HogGuard> = None;
    let outcome = std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("zmem-adaptive-access".into())
            .spawn_scoped(s, || {
                access_loop(&region, corpus, a.zipf_s, a.write_ratio, &stop, &count)
            });
        let res = match worker {
            Ok(_) => sample_loop(a, &region, &count, t0, &mut samples, &mut hog),
            Err(e) => Err(anyhow::Error::from(e).context("starting the access thread")),
        };
        stop.store(true, Ordering::Relaxed);
        res
    });
    outcome?;
    let decisions: Vec<DecisionOut> = region
        .budget_history()
        .into_iter()
        .map(|(t, d)| DecisionOut {
            t: t - offset,
            budget: d.budget,
            reason: format!("{:?}", d.reason),
            text: d.to_string(),
            pressure: d.pressure,
        })
        .collect();
    let summary = hog.as_ref().map(|h| {
        let e = h.events();
        summarize(
            plan, &samples, &decisions, h.start, e.ready, e.exit, e.touched,
        )
    });
    drop(hog);
    let st = region.stats();
    let region_json = serde_json::json!({
        "major_faults": st.major_faults,
        "zero_faults": st.zero_faults,
        "staged_faults": st.staged_faults,
        "evictions": st.evictions,
        "direct_evictions": st.direct_evictions,
        "fault_latency_ns": {
            "p50": st.fault_latency.p50, "p99": st.fault_latency.p99,
            "p999": st.fault_latency.p999, "max": st.fault_latency.max,
        },
        "store_orig_data_size": st.store.orig_data_size,
        "store_compr_data_size": st.store.compr_data_size,
        "store_mem_used_total": st.store.mem_used_total,
        "effective_ratio": st.effective_ratio(),
    });
    Ok(Report {
        plan: plan.clone(),
        fill_s,
        samples,
        decisions,
        summary,
        region: region_json,
    })
}

fn sample_loop(
    a: &AdaptiveArgs,
    region: &Region,
    count: &AtomicU64,
    t0: Instant,
    samples: &mut Vec<Sample>,
    hog: &mut Option<HogGuard>,
) -> anyhow::Result<()> {
    let base_refaults = refaults(&region.stats());
    let mut prev = (0.0f64, 0u64, 0u64);
    let mut next = t0;
    let mut printed = 0usize;
    eprintln!(
        "{:>6} {:>7} {:>8} {:>7} {:>6} {:>9} {:>9} {:>10}  decision",
        "t", "budget", "resident", "avail", "psi%", "refault/s", "access/s", "hog"
    );
    loop {
        next += SAMPLE;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        if aborted() {
            return Err(Interrupted.into());
        }
        let t = t0.elapsed();
        if hog.is_none() && t >= a.at {
            *hog = Some(HogGuard::spawn(a.take, a.hold, t0)?);
        }
        if let Some(h) = hog.as_mut() {
            h.poll()?;
        }
        let (avg10, _, avail) = read_machine()?;
        let st = region.stats();
        let ts = t.as_secs_f64();
        let acc = count.load(Ordering::Relaxed);
        let rf = refaults(&st) - base_refaults;
        let dt = (ts - prev.0).max(1e-3);
        let reason = region
            .budget_history()
            .last()
            .map(|(_, d)| format!("{:?}", d.reason));
        let sample = Sample {
            t: ts,
            budget: st.budget,
            resident: st.resident,
            staged: st.staged,
            pool: st.store.mem_used_total,
            mem_available: avail,
            psi_some_avg10: avg10,
            refaults_per_s: (rf - prev.2) as f64 / dt,
            accesses_per_s: (acc - prev.1) as f64 / dt,
            refaults: rf,
            accesses: acc,
            hog: hog.as_ref().map_or(HogState::None, HogGuard::state),
            reason,
        };
        prev = (ts, acc, rf);
        samples.push(sample);
        // One line per second: the last four samples' rates averaged.
        if samples.len() >= printed + 4 {
            let w = &samples[printed..];
            let n = w.len() as f64;
            let last = w.last().expect("non-empty");
            let hist = region.budget_history();
            let text = hist
                .last()
                .map(|(_, d)| d.reason.to_string())
                .unwrap_or_default();
            eprintln!(
                "{:>5.1}s {:>7} {:>8} {:>7} {:>6.2} {:>9.0} {:>9.0} {:>10}  {}",
                last.t,
                human(last.budget),
                human(last.resident),
                human(last.mem_available),
                last.psi_some_avg10,
                w.iter().map(|s| s.refaults_per_s).sum::<f64>() / n,
                w.iter().map(|s| s.accesses_per_s).sum::<f64>() / n,
                format!("{:?}", last.hog).to_lowercase(),
                text
            );
            printed = samples.len();
        }
        if t >= a.duration {
            return Ok(());
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    plan: &Plan,
    samples: &[Sample],
    decisions: &[DecisionOut],
    start: f64,
    ready: Option<f64>,
    exit: Option<f64>,
    touched: Option<u64>,
) -> Summary {
    let end = samples.last().map_or(0.0, |s| s.t);
    let hog_end = exit.unwrap_or(f64::INFINITY);
    let budget_before = samples
        .iter()
        .rev()
        .find(|s| s.t < start)
        .or(samples.first())
        .map_or(0, |s| s.budget);
    let during: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.t >= start && s.t <= hog_end)
        .collect();
    let lowest = during
        .iter()
        .map(|s| s.budget)
        .min()
        .unwrap_or(budget_before);
    let time_to_lowest = during
        .iter()
        .find(|s| s.budget == lowest)
        .map_or(0.0, |s| s.t - start);
    let below_reserve = during
        .iter()
        .find(|s| s.mem_available < plan.reserve)
        .map(|s| s.t);
    let at_exit = exit.and_then(|x| samples.iter().find(|s| s.t >= x).map(|s| s.budget));
    let target = (budget_before as f64 * REGROWN) as u64;
    let regrow = exit.and_then(|x| {
        samples
            .iter()
            .find(|s| s.t >= x && s.budget >= target)
            .map(|s| s.t - x)
    });
    let phase = |name: &'static str, from: f64, to: f64| -> Option<PhaseOut> {
        // Cumulative counters at the sample closest before each bound.
        let at = |t: f64| {
            samples
                .iter()
                .rev()
                .find(|s| s.t <= t)
                .map_or((0.0, 0, 0), |s| (s.t, s.accesses, s.refaults))
        };
        let inside: Vec<&Sample> = samples.iter().filter(|s| s.t > from && s.t <= to).collect();
        if inside.is_empty() {
            return None;
        }
        let (t1, a1, r1) = at(to);
        let (t0, a0, r0) = if from <= 0.0 { (0.0, 0, 0) } else { at(from) };
        let secs = (t1 - t0).max(1e-3);
        let n = inside.len() as u64;
        Some(PhaseOut {
            name,
            from_s: from,
            to_s: to,
            refaults_per_s: (r1 - r0) as f64 / secs,
            accesses_per_s: (a1 - a0) as f64 / secs,
            mean_budget: inside.iter().map(|s| s.budget).sum::<u64>() / n,
            mean_resident: inside.iter().map(|s| s.resident).sum::<u64>() / n,
            min_mem_available: inside.iter().map(|s| s.mem_available).min().unwrap_or(0),
            mean_psi_some_avg10: inside.iter().map(|s| s.psi_some_avg10).sum::<f64>() / n as f64,
        })
    };
    let phases: Vec<PhaseOut> = [
        phase("before", 0.0, start),
        phase("hog", start, hog_end.min(end)),
        exit.and_then(|x| phase("after", x, end)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut counts: Vec<(String, usize)> = Vec::new();
    for d in decisions.iter().filter(|d| d.t >= 0.0) {
        match counts.iter_mut().find(|(r, _)| *r == d.reason) {
            Some((_, n)) => *n += 1,
            None => counts.push((d.reason.clone(), 1)),
        }
    }
    Summary {
        reserve: plan.reserve,
        hog_start_s: start,
        hog_ready_s: ready,
        hog_exit_s: exit,
        hog_touched: touched,
        budget_before,
        budget_lowest: lowest,
        time_to_lowest_s: time_to_lowest,
        below_reserve_s: below_reserve,
        budget_at_hog_exit: at_exit,
        budget_final: samples.last().map_or(0, |s| s.budget),
        regrow_s: regrow,
        min_mem_available_during_hog: during.iter().map(|s| s.mem_available).min().unwrap_or(0),
        phases,
        decisions: counts,
    }
}

fn summary_text(plan: &Plan, s: &Summary) -> String {
    let secs = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}s"));
    let mut out = String::new();
    out.push_str(&format!(
        "hog: started {:.1}s, touched {} by {}, freed at {}; reserve {}, MemAvailable during the \
         hog down to {}\n",
        s.hog_start_s,
        s.hog_touched.map_or("-".into(), human),
        secs(s.hog_ready_s),
        secs(s.hog_exit_s),
        human(plan.reserve),
        human(s.min_mem_available_during_hog),
    ));
    let crossed = match s.below_reserve_s {
        Some(b) => format!(
            ", {:.1}s after MemAvailable fell below the reserve",
            (s.hog_start_s + s.time_to_lowest_s - b).max(0.0)
        ),
        None => ", MemAvailable stayed above the reserve".into(),
    };
    out.push_str(&format!(
        "budget: {} before the hog -> lowest {} ({:.1}s after the hog started{crossed}) -> {} \
         when the hog left -> {} at the end ({})\n",
        human(s.budget_before),
        human(s.budget_lowest),
        s.time_to_lowest_s,
        s.budget_at_hog_exit.map_or("-".into(), human),
        human(s.budget_final),
        match s.regrow_s {
            Some(r) => format!(
                "back at {:.0}% of before {:.1}s after the hog left",
                REGROWN * 100.0,
                r
            ),
            None => format!("not back at {:.0}% of before by the end", REGROWN * 100.0),
        }
    ));
    out.push_str(&format!(
        "{:<7} {:>13} {:>10} {:>10} {:>10} {:>12}\n",
        "phase", "seconds", "refault/s", "access/s", "budget", "min avail"
    ));
    for p in &s.phases {
        out.push_str(&format!(
            "{:<7} {:>13} {:>10.0} {:>10.0} {:>10} {:>12}\n",
            p.name,
            format!("{:.1}-{:.1}", p.from_s, p.to_s),
            p.refaults_per_s,
            p.accesses_per_s,
            human(p.mean_budget),
            human(p.min_mem_available)
        ));
    }
    let reasons: Vec<String> = s
        .decisions
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    out.push_str(&format!("controller steps: {}", reasons.join(", ")));
    out
}

/// Budget, resident (left axis) and MemAvailable with the reserve (right axis) against time,
/// the hog's interval shaded.
pub fn plot(r: &Report, path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mib = |b: u64| b as f64 / MIB as f64;
    let tmax = r.samples.last().map_or(1.0, |s| s.t).max(r.plan.duration_s);
    let ymax = r
        .samples
        .iter()
        .map(|s| s.budget.max(s.resident))
        .max()
        .unwrap_or(r.plan.max)
        .max(r.plan.max) as f64
        / MIB as f64
        * 1.15;
    let avail = r.samples.iter().map(|s| s.mem_available);
    let amin = avail.clone().min().unwrap_or(0).min(r.plan.reserve);
    let amax = avail.max().unwrap_or(1).max(r.plan.reserve);
    let pad = ((amax - amin) as f64 * 0.1).max(64.0 * MIB as f64);
    let (alo, ahi) = (
        (mib(amin) - pad / MIB as f64).max(0.0),
        mib(amax) + pad / MIB as f64,
    );

    let root = SVGBackend::new(path, (1200, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!(
        "zmem adaptive budget: region {}, budget {}..{}, a hog takes {} (reserve {})",
        fmt_size(r.plan.size),
        fmt_size(r.plan.min),
        fmt_size(r.plan.max),
        fmt_size(r.plan.take),
        human(r.plan.reserve)
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .right_y_label_area_size(80)
        .build_cartesian_2d(0f64..tmax, 0f64..ymax)?
        .set_secondary_coord(0f64..tmax, alo..ahi);
    chart
        .configure_mesh()
        .x_desc("seconds into the access phase")
        .y_desc("budget, resident (MiB)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc("MemAvailable (MiB)")
        .label_style(("sans-serif", 12).into_font().color(&RGBColor(214, 39, 40)))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;

    if let Some(s) = &r.summary {
        let x0 = s.hog_start_s;
        let x1 = s.hog_exit_s.unwrap_or(tmax);
        let shade = RGBColor(255, 150, 0).mix(0.15);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x0, 0.0), (x1, ymax)],
                shade.filled(),
            )))?
            .label(format!("hog holds {}", fmt_size(r.plan.take)))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], shade.filled()));
    }
    let blue = RGBColor(31, 119, 180);
    let green = RGBColor(44, 160, 44);
    let red = RGBColor(214, 39, 40);
    chart
        .draw_series(LineSeries::new(
            r.samples.iter().map(|s| (s.t, mib(s.budget))),
            blue.stroke_width(2),
        ))?
        .label("budget")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], blue.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            r.samples.iter().map(|s| (s.t, mib(s.resident))),
            green.stroke_width(1),
        ))?
        .label("resident")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], green.stroke_width(1)));
    chart
        .draw_secondary_series(LineSeries::new(
            r.samples.iter().map(|s| (s.t, mib(s.mem_available))),
            red.stroke_width(1),
        ))?
        .label("MemAvailable (right axis)")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], red.stroke_width(1)));
    let reserve = mib(r.plan.reserve);
    chart
        .draw_secondary_series(DashedLineSeries::new(
            [(0.0, reserve), (tmax, reserve)],
            8,
            5,
            red.mix(0.7).stroke_width(1),
        ))?
        .label("reserve (right axis)")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 6, y)], red.mix(0.7)));
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::MiddleRight)
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_parse() {
        assert_eq!(parse_duration("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert!(parse_duration("soon").is_err());
        assert!(parse_duration("-1s").is_err());
    }

    #[test]
    fn zipf_like_is_skewed_and_in_range() {
        let z = ZipfLike::new(1000, 0.99);
        let mut rng = Rng(1);
        let mut hist = vec![0u32; 1000];
        for _ in 0..100_000 {
            hist[z.rank(rng.next_f64()) as usize] += 1;
        }
        assert!(hist[0] > hist[10] && hist[10] > hist[500]);
        let top10: u32 = hist[..10].iter().sum();
        assert!(top10 > 20_000, "top 10 ranks got {top10}");
        assert_eq!(z.rank(0.0), 0);
        assert_eq!(z.rank(0.999_999_999), 999);
        let one = ZipfLike::new(10, 1.0);
        assert!(one.rank(0.5) < 10);
    }

    #[test]
    fn multiplier_is_a_bijection() {
        for pages in [1u64, 7, 4096, 65_536, 100_000] {
            let m = page_multiplier(pages);
            let mut seen = vec![false; pages as usize];
            for r in 0..pages {
                let p = ((u128::from(r) * u128::from(m)) % u128::from(pages)) as usize;
                assert!(!seen[p]);
                seen[p] = true;
            }
        }
    }

    fn sample(t: f64, budget: u64, acc: u64) -> Sample {
        Sample {
            t,
            budget,
            resident: budget,
            staged: 0,
            pool: 0,
            mem_available: 10 * GIB,
            psi_some_avg10: 0.0,
            refaults_per_s: 0.0,
            accesses_per_s: 0.0,
            refaults: acc / 10,
            accesses: acc,
            hog: HogState::None,
            reason: None,
        }
    }

    #[test]
    fn summary_finds_the_dip_and_the_regrowth() {
        let budgets = [100, 100, 100, 80, 40, 30, 30, 30, 50, 70, 96, 100];
        let samples: Vec<Sample> = budgets
            .iter()
            .enumerate()
            .map(|(i, &b)| sample(i as f64, b * MIB, i as u64 * 1000))
            .collect();
        let args = AdaptiveArgs {
            size: 256 * MIB,
            min: 16 * MIB,
            max: 192 * MIB,
            take: GIB,
            at: Duration::from_secs(2),
            hold: Duration::from_secs(4),
            duration: Duration::from_secs(10),
            reserve: Some(GIB),
            deficit: None,
            interval: Duration::from_secs(1),
            cooldown: Duration::from_secs(5),
            write_ratio: 0.1,
            zipf_s: 0.99,
            corpus: None,
            json: PathBuf::new(),
            svg: PathBuf::new(),
        };
        let corpus = Corpus::from_bytes("t", b"hello world, some text ".repeat(200)).unwrap();
        let plan = plan(&args, &corpus, 20 * GIB).unwrap();
        let s = summarize(&plan, &samples, &[], 2.5, Some(3.0), Some(7.5), Some(GIB));
        assert_eq!(s.budget_before, 100 * MIB);
        assert_eq!(s.budget_lowest, 30 * MIB);
        assert!((s.time_to_lowest_s - 2.5).abs() < 1e-9);
        assert_eq!(s.budget_final, 100 * MIB);
        assert!((s.regrow_s.unwrap() - 2.5).abs() < 1e-9);
        assert_eq!(s.phases.len(), 3);
        assert!((s.phases[0].accesses_per_s - 1000.0).abs() < 1e-6);
    }

    #[test]
    fn take_must_leave_room() {
        let corpus = Corpus::from_bytes("t", b"some text, some more text ".repeat(400)).unwrap();
        let mut args = AdaptiveArgs {
            size: 64 * MIB,
            min: 16 * MIB,
            max: 32 * MIB,
            take: 8 * GIB,
            at: Duration::from_secs(1),
            hold: Duration::from_secs(1),
            duration: Duration::from_secs(3),
            reserve: None,
            deficit: None,
            interval: Duration::from_secs(1),
            cooldown: Duration::from_secs(5),
            write_ratio: 0.1,
            zipf_s: 0.99,
            corpus: None,
            json: PathBuf::new(),
            svg: PathBuf::new(),
        };
        let e = plan(&args, &corpus, 10 * GIB).unwrap_err().to_string();
        assert!(e.contains("--take 8G is too large"), "{e}");
        args.take = GIB;
        let p = plan(&args, &corpus, 10 * GIB).unwrap();
        // The hog would leave MemAvailable `deficit` below the reserve.
        let left = 10 * GIB - p.footprint_estimate - GIB;
        assert_eq!(p.reserve, left + p.deficit as u64);
        assert_eq!(p.deficit as u64, GIB / 2, "at most half of --take");
        args.take = 4 * GIB;
        let p = plan(&args, &corpus, 20 * GIB).unwrap();
        assert_eq!(p.deficit as u64, DEFICIT);
        assert!(p.freeable_estimate < 16 * MIB);
        args.deficit = Some(4 * GIB);
        let e = plan(&args, &corpus, 20 * GIB).unwrap_err().to_string();
        assert!(e.contains("must be smaller than --take"), "{e}");
    }
}
