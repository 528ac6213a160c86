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

use std::path::PathBuf;

use clap::Args;
use serde::{Deserialize, Serialize};
use zmem_region::Eviction;

use crate::target::POLICIES;
use zmem_runenv::size::{format_size, parse_size};

/// Bytes of a page: the unit of every access.
pub use zmem_os::PAGE_SIZE as PAGE;
const WORDS: usize = PAGE / 8;

/// Default seed of the access streams and of the zipf permutation: runs are reproducible.
pub const SEED: u64 = 0x7a6d_656d_5eed;

/// An access slower than this (ns) is checked for a major fault of its thread.
pub const SLOW_NS: u64 = 1000;

/// Smallest resident budget (16 pages, the region's minimum).
pub const MIN_RESIDENT: u64 = zmem_region::MIN_BUDGET_BYTES;

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
    /// zmem region: µs a handler polls without sleeping while faults come fast (0 = always
    /// sleep) [default: the region's, 50].
    #[arg(long)]
    pub handler_spin_us: Option<u32>,
    /// zmem region: never pin the faulting thread and the region's threads to one CPU
    /// (RegionConfig::colocate; on by default).
    #[arg(long)]
    pub no_colocate: bool,
    /// zmem region: handlers compress the pages they evict themselves, instead of only moving
    /// them out and leaving that to the evictor thread on another CPU
    /// (RegionConfig::async_settle; on by default).
    #[arg(long)]
    pub no_async_settle: bool,
    /// zmem region: which pages faulted back keep their compressed copy: off, ssd (the
    /// default: those read back from an SSD log, none here) or all (RegionConfig::clean_copies).
    #[arg(long, default_value = "ssd", value_parser = ["off", "ssd", "all"])]
    pub clean_copies: String,
    /// zmem region: who serves a fault: `handler` (a handler thread) or `signal` (the
    /// faulting thread, from SIGBUS: no hand-off; RegionConfig::fault_route); `auto` (the
    /// default) picks what `zmem run` picks: signal with CAP_SYS_ADMIN (root), else handler.
    #[arg(long, default_value = "auto", value_parser = crate::RUN_FAULT_ROUTES)]
    pub fault_route: String,
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
                resident: format_size(self.resident),
                size: format_size(self.size),
            });
        }
        if self.resident < MIN_RESIDENT {
            return Err(WorkloadError::ResidentTooSmall(format_size(self.resident)));
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
            format_size(self.size),
            format_size(self.resident),
            self.threads,
            if self.threads == 1 { "" } else { "s" },
            self.write_ratio * 100.0
        )
    }
}

pub mod driver;
pub mod report;
pub mod run;
pub mod side;
pub mod worker;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// The command line `--size 16M --resident 4M`.
    pub(crate) fn args() -> RegionArgs {
        use clap::Parser;
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            a: RegionArgs,
        }
        P::parse_from(["x", "--size", "16M", "--resident", "4M"]).a
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
}
