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

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use serde::Serialize;
use zmem_engine::Policy;
use zmem_store::{PageStore, StoreConfig};

use crate::corpus::Corpus;
use crate::target::PAGE;
use zmem_runenv::size::{format_size, format_size_mg, parse_size};

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

pub mod hog;
pub mod plot;
pub mod run;

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
            format_size(a.take),
            format_size_mg(mem_available),
            format_size_mg(footprint),
            format_size_mg(KEEP_FREE),
            format_size_mg(
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
                    format_size(d),
                    format_size(a.take)
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
    let min_budget = zmem_region::MIN_BUDGET_BYTES;
    if a.size < min_budget || a.size % PAGE as u64 != 0 {
        bail!(
            "--size {} must be a multiple of 4k and at least {}",
            format_size(a.size),
            format_size(min_budget)
        );
    }
    if a.min > a.max {
        bail!(
            "--min {} is larger than --max {}",
            format_size(a.min),
            format_size(a.max)
        );
    }
    if a.min < min_budget {
        bail!(
            "--min {} is below the smallest budget, {}",
            format_size(a.min),
            format_size(min_budget)
        );
    }
    if a.max > a.size {
        bail!(
            "--max {} is larger than --size {}",
            format_size(a.max),
            format_size(a.size)
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
