//! The contract between `zmem run` and `libzmem_preload.so`:
//!
//! - [`RunConfig`]: the `ZMEM_*` environment variables that configure the preload library
//!   (`zmem run` writes them, the library reads them at start-up; a user may also set them by
//!   hand with `LD_PRELOAD`);
//! - [`ProcessStats`]: a process's live statistics, as JSON over its stats socket and in the
//!   report it writes when it exits;
//! - where the sockets and reports live ([`socket_dir`], [`socket_path`], [`reports_file`]);
//! - what a run reports when its program exits ([`report::RunReport`], [`report::summary`]).

pub mod report;
pub mod size;

use std::path::{Path, PathBuf};
use std::str::FromStr;

use serde::{Deserialize, Serialize};
use zmem_engine::Policy;
use zmem_region::{CleanCopies, Eviction, FaultRoute, RegionStats};

pub use size::{parse_size, SizeError};

/// Resident budget in bytes (`--resident`); ignored when `ZMEM_ADAPTIVE=1`.
pub const ENV_RESIDENT: &str = "ZMEM_RESIDENT";
/// `1`: the budget follows memory pressure (`--adaptive`).
pub const ENV_ADAPTIVE: &str = "ZMEM_ADAPTIVE";
/// Virtual size of the compressed heap (`--size`): the most the program can allocate.
pub const ENV_SIZE: &str = "ZMEM_SIZE";
/// Address space for the program's own anonymous mappings (mmap), tiered like the heap
/// (`--maps`); `0` keeps them out of zmem (`--heap-only`). Unset: the heap's size.
pub const ENV_MAPS: &str = "ZMEM_MAPS";
/// DRAM for compressed pages (`--store-limit`, zram's mem_limit); unset = unlimited.
pub const ENV_STORE_LIMIT: &str = "ZMEM_STORE_LIMIT";
/// Compression policy: fast, balanced, max or auto (`--policy`).
pub const ENV_POLICY: &str = "ZMEM_POLICY";
/// Which pages leave DRAM first: clock or fifo (`--eviction`).
pub const ENV_EVICTION: &str = "ZMEM_EVICTION";
/// Threads serving faults (`--handler-threads`).
pub const ENV_HANDLER_THREADS: &str = "ZMEM_HANDLER_THREADS";
/// `0`: never pin the thread taking every fault and zmem's threads to one CPU
/// (`--no-colocate`); unset or `1`: do (see zmem_region's `RegionConfig::colocate`).
pub const ENV_COLOCATE: &str = "ZMEM_COLOCATE";
/// `0`: a forked child gets a copy of every page evicted at the fork (`--no-inherit-fork`);
/// unset or `1`: it reads them from the parent's store, which hands a page down before
/// changing it (see zmem_region's `RegionConfig::inherit_on_fork`).
pub const ENV_INHERIT_FORK: &str = "ZMEM_INHERIT_FORK";
/// `0`: handlers compress the pages they evict themselves (`--no-async-settle`); unset or `1`:
/// they leave it to the evictor thread (see zmem_region's `RegionConfig::async_settle`).
pub const ENV_ASYNC_SETTLE: &str = "ZMEM_ASYNC_SETTLE";
/// Who serves the program's faults (`--fault-route`): `handler` (the default: a zmem thread,
/// woken by the kernel) or `signal` (the faulting thread itself, with the syscall guard; see
/// zmem_region's `FaultRoute` and `RegionConfig::guard_syscalls`).
pub const ENV_FAULT_ROUTE: &str = "ZMEM_FAULT_ROUTE";
/// `1`: the route in [`ENV_FAULT_ROUTE`] is zmem's choice (`--fault-route auto`), not the
/// user's: a process that starts under a tracer (a debugger's `run`, `strace`) takes the
/// handler route instead of the signal route, whose faults and traps are signals the tracer
/// would stop at.
pub const ENV_FAULT_ROUTE_AUTO: &str = "ZMEM_FAULT_ROUTE_AUTO";
/// Which pages faulted back keep their compressed copy (`--clean-copies`): `off`, `ssd` (the
/// default: those read back from the SSD log) or `all` (see zmem_region's `CleanCopies`).
pub const ENV_CLEAN_COPIES: &str = "ZMEM_CLEAN_COPIES";
/// `1`: keep a checksum of every evicted page and check it when the page comes back
/// (`--verify-pages`, a diagnostic; see zmem_region's `RegionConfig::verify_pages`).
pub const ENV_VERIFY_PAGES: &str = "ZMEM_VERIFY_PAGES";
/// `1`: keep each page's last state changes and print them for the pages a crashing program
/// used (`--trace-pages`, a diagnostic; see zmem_region's `RegionConfig::trace_pages`).
pub const ENV_TRACE_PAGES: &str = "ZMEM_TRACE_PAGES";
/// `0`: every block of the program heap comes from mimalloc (`--no-exact-fit`); unset or `1`:
/// mid-size blocks (1–32 KiB) come from an exact-fit allocator that rounds them to 16 bytes,
/// not to mimalloc's size classes (see zmem_preload's `heap` module).
pub const ENV_EXACT_FIT: &str = "ZMEM_EXACT_FIT";
/// Where the SSD tier's log lives (`--ssd`): a directory (an unnamed file there, gone when the
/// process exits) or a block device; unset: no SSD tier.
pub const ENV_SSD: &str = "ZMEM_SSD";
/// Bytes of log space on it (`--ssd-size`); unset: [`DEFAULT_SSD_SIZE`].
pub const ENV_SSD_SIZE: &str = "ZMEM_SSD_SIZE";
/// `0`: the log is not encrypted (`--ssd-no-encrypt`); unset or `1`: AES-256-GCM under a key
/// that lives only in the process.
pub const ENV_SSD_ENCRYPT: &str = "ZMEM_SSD_ENCRYPT";
/// Most pages one read from the SSD tier brings, the faulting page included (its neighbours'
/// objects near it on the log, kept for their own faults); `1`: none (`--ssd-read-ahead`);
/// unset: [`DEFAULT_SSD_READ_AHEAD`].
pub const ENV_SSD_READ_AHEAD: &str = "ZMEM_SSD_READ_AHEAD";
/// Heap bytes at which zmem starts in a process the run's program execs (a shell's commands,
/// a build's compiler and assembler): until its heap and mappings reach this much, such a
/// process runs on glibc's malloc with no region, no threads and no report, so a short
/// command costs what it costs without zmem (~1.5 ms less per process; docs/DESIGN-NOTES.md,
/// "What a process start costs"). `0`: from its first allocation, as the run's own process
/// always does. Unset: [`RunConfig::start_at`]'s default.
pub const ENV_START_AT: &str = "ZMEM_START_AT";
/// Directory where each process appends its exit report, one JSON line, to [`reports_file`]
/// when it exits (set by `zmem run`).
pub const ENV_REPORT_DIR: &str = "ZMEM_REPORT_DIR";
/// Directory of the stats sockets (default [`default_socket_dir`]).
pub const ENV_SOCKET_DIR: &str = "ZMEM_SOCKET_DIR";
/// What to do when zmem cannot start in a process: `fail` (default: a message and exit
/// status 127 before the program runs) or `off` (a warning, and the program runs on an
/// uncompressed heap).
pub const ENV_ON_ERROR: &str = "ZMEM_ON_ERROR";
/// tracing filter of the library's messages on stderr (default `warn`).
pub const ENV_LOG: &str = "ZMEM_LOG";
/// The pid `zmem run` execs its program in: the process with this pid (and no other) writes
/// the run's summary and `--stats` report when it exits.
pub const ENV_RUN_PID: &str = "ZMEM_RUN_PID";
/// `1`: that process prints the summary on stderr (`zmem run` without `--quiet`).
pub const ENV_SUMMARY: &str = "ZMEM_SUMMARY";
/// Where that process writes the run's report as JSON (`--stats FILE`).
pub const ENV_STATS_FILE: &str = "ZMEM_STATS_FILE";

/// Set by the library in a process whose system calls are guarded (the signal route): the id
/// of the guard's seccomp filter (hex). A program it execs inherits that filter, and when its
/// own would be the same (and a probe shows it in force) does not install a second copy.
/// Process-tree state, not configuration: `zmem run` clears it.
pub const ENV_GUARD_FILTER: &str = "ZMEM_GUARD_FILTER";

/// Every variable the library reads (for documentation and for clearing a test environment).
pub const ALL_VARS: [&str; 30] = [
    ENV_RESIDENT,
    ENV_ADAPTIVE,
    ENV_SIZE,
    ENV_MAPS,
    ENV_STORE_LIMIT,
    ENV_POLICY,
    ENV_EVICTION,
    ENV_HANDLER_THREADS,
    ENV_COLOCATE,
    ENV_ASYNC_SETTLE,
    ENV_FAULT_ROUTE,
    ENV_FAULT_ROUTE_AUTO,
    ENV_CLEAN_COPIES,
    ENV_VERIFY_PAGES,
    ENV_TRACE_PAGES,
    ENV_EXACT_FIT,
    ENV_SSD,
    ENV_SSD_SIZE,
    ENV_SSD_ENCRYPT,
    ENV_SSD_READ_AHEAD,
    ENV_START_AT,
    ENV_INHERIT_FORK,
    ENV_REPORT_DIR,
    ENV_SOCKET_DIR,
    ENV_ON_ERROR,
    ENV_LOG,
    ENV_RUN_PID,
    ENV_SUMMARY,
    ENV_STATS_FILE,
    ENV_GUARD_FILTER,
];

/// The most [`RunConfig::start_at`] is by default.
pub const MAX_DEFAULT_START_AT: u64 = 4 << 20;

/// The default resident budget when neither `ZMEM_RESIDENT` nor `ZMEM_ADAPTIVE` is set.
pub const DEFAULT_RESIDENT: u64 = 256 << 20;
pub use zmem_region::{
    DEFAULT_SSD_READ_AHEAD, DEFAULT_SSD_SIZE, MAX_SSD_READ_AHEAD, MIN_SSD_STORE_LIMIT,
};
/// The heap's default virtual size is this many times the machine's memory (untouched pages
/// cost nothing but address space).
pub const DEFAULT_SIZE_PER_RAM: u64 = 4;

/// A bad `ZMEM_*` setting.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ConfigError {
    #[error("{var}={value:?}: {why}")]
    Invalid {
        var: &'static str,
        value: String,
        why: String,
    },
}

fn invalid(var: &'static str, value: &str, why: impl ToString) -> ConfigError {
    ConfigError::Invalid {
        var,
        value: value.to_string(),
        why: why.to_string(),
    }
}

/// What to do when zmem cannot start in a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum OnError {
    Fail,
    Off,
}

/// The preload library's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct RunConfig {
    /// None: adaptive.
    pub resident: Option<u64>,
    /// None: [`DEFAULT_SIZE_PER_RAM`] times the machine's memory.
    pub size: Option<u64>,
    /// None: as large as the heap; 0: the program's own mappings are left to the kernel.
    pub maps: Option<u64>,
    pub store_limit: Option<u64>,
    pub policy: Policy,
    pub eviction: Eviction,
    pub handler_threads: usize,
    pub colocate: bool,
    pub inherit_fork: bool,
    pub async_settle: bool,
    pub fault_route: FaultRoute,
    /// See [`ENV_FAULT_ROUTE_AUTO`].
    pub fault_route_auto: bool,
    pub clean_copies: CleanCopies,
    /// See [`ENV_VERIFY_PAGES`].
    pub verify_pages: bool,
    /// See [`ENV_TRACE_PAGES`].
    pub trace_pages: bool,
    /// See [`ENV_EXACT_FIT`].
    pub exact_fit: bool,
    /// The SSD tier's log (see [`ENV_SSD`]), its size and whether it is encrypted.
    pub ssd: Option<PathBuf>,
    pub ssd_size: Option<u64>,
    pub ssd_encrypt: bool,
    /// See [`ENV_SSD_READ_AHEAD`].
    pub ssd_read_ahead: usize,
    /// See [`ENV_START_AT`]; None: the default ([`RunConfig::start_at`]).
    pub start_at: Option<u64>,
    pub report_dir: Option<PathBuf>,
    pub socket_dir: Option<PathBuf>,
    pub on_error: OnError,
    pub log: Option<String>,
    /// The process that reports the run (see [`ENV_RUN_PID`]).
    pub run_pid: Option<u32>,
    pub summary: bool,
    pub stats_file: Option<PathBuf>,
}

impl Default for RunConfig {
    fn default() -> Self {
        RunConfig {
            resident: Some(DEFAULT_RESIDENT),
            size: None,
            maps: None,
            store_limit: None,
            policy: Policy::Fast,
            eviction: Eviction::Clock,
            handler_threads: 1,
            colocate: true,
            inherit_fork: true,
            async_settle: true,
            fault_route: FaultRoute::Handler,
            fault_route_auto: false,
            clean_copies: CleanCopies::Ssd,
            verify_pages: false,
            trace_pages: false,
            exact_fit: true,
            ssd: None,
            ssd_size: None,
            ssd_encrypt: true,
            ssd_read_ahead: DEFAULT_SSD_READ_AHEAD,
            start_at: None,
            report_dir: None,
            socket_dir: None,
            on_error: OnError::Fail,
            log: None,
            run_pid: None,
            summary: false,
            stats_file: None,
        }
    }
}

fn eviction_name(e: Eviction) -> &'static str {
    match e {
        Eviction::Clock => "clock",
        Eviction::Fifo => "fifo",
    }
}

impl RunConfig {
    /// The store limit in force: the one set, or with an SSD tier (which needs one) a quarter
    /// of the resident budget, at least [`MIN_SSD_STORE_LIMIT`] (adaptive budgets: 4x that).
    pub fn effective_store_limit(&self) -> Option<u64> {
        match (self.store_limit, &self.ssd) {
            (Some(l), _) => Some(l),
            (None, None) => None,
            (None, Some(_)) => Some(zmem_region::default_ssd_store_limit(self.resident)),
        }
    }

    /// Heap bytes at which zmem starts in a process the run's program execs (see
    /// [`ENV_START_AT`]): the one set, else a quarter of the resident budget, at most
    /// [`MAX_DEFAULT_START_AT`] (adaptive budgets: that). A quarter, so that what such a
    /// process holds outside the budget stays a small part of it.
    pub fn start_at(&self) -> u64 {
        self.start_at.unwrap_or(match self.resident {
            Some(r) => (r / 4).min(MAX_DEFAULT_START_AT),
            None => MAX_DEFAULT_START_AT,
        })
    }

    /// Reads the settings through `get` (e.g. `|k| std::env::var(k).ok()`). Unset variables take
    /// their defaults; a set but bad one is an error naming it.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<RunConfig, ConfigError> {
        let mut c = RunConfig::default();
        let size = |var: &'static str| -> Result<Option<u64>, ConfigError> {
            match get(var) {
                None => Ok(None),
                Some(v) => parse_size(&v).map(Some).map_err(|e| invalid(var, &v, e)),
            }
        };
        // A 0/1 switch: unset or empty is `default`.
        let flag = |var: &'static str, default: bool| -> Result<bool, ConfigError> {
            match get(var).as_deref() {
                None | Some("") => Ok(default),
                Some("0") => Ok(false),
                Some("1") => Ok(true),
                Some(v) => Err(invalid(var, v, "expected 0 or 1")),
            }
        };
        if let Some(r) = size(ENV_RESIDENT)? {
            c.resident = Some(r);
        }
        if flag(ENV_ADAPTIVE, false)? {
            c.resident = None;
        }
        c.size = size(ENV_SIZE)?;
        c.maps = size(ENV_MAPS)?;
        c.start_at = size(ENV_START_AT)?;
        c.store_limit = size(ENV_STORE_LIMIT)?;
        if let Some(v) = get(ENV_POLICY) {
            c.policy = Policy::from_str(&v).map_err(|e| invalid(ENV_POLICY, &v, e))?;
        }
        if let Some(v) = get(ENV_EVICTION) {
            c.eviction = match v.as_str() {
                "clock" => Eviction::Clock,
                "fifo" => Eviction::Fifo,
                _ => return Err(invalid(ENV_EVICTION, &v, "expected clock or fifo")),
            };
        }
        if let Some(v) = get(ENV_HANDLER_THREADS) {
            c.handler_threads = v
                .parse()
                .ok()
                .filter(|n| (1..=16).contains(n))
                .ok_or_else(|| invalid(ENV_HANDLER_THREADS, &v, "expected 1..=16"))?;
        }
        c.colocate = flag(ENV_COLOCATE, true)?;
        c.inherit_fork = flag(ENV_INHERIT_FORK, true)?;
        c.async_settle = flag(ENV_ASYNC_SETTLE, true)?;
        c.fault_route = match get(ENV_FAULT_ROUTE).filter(|v| !v.is_empty()) {
            None => FaultRoute::Handler,
            Some(v) => FaultRoute::parse(&v)
                .ok_or_else(|| invalid(ENV_FAULT_ROUTE, &v, "expected handler or signal"))?,
        };
        c.fault_route_auto = flag(ENV_FAULT_ROUTE_AUTO, false)?;
        c.clean_copies = match get(ENV_CLEAN_COPIES).filter(|v| !v.is_empty()) {
            None => CleanCopies::default(),
            Some(v) => CleanCopies::parse(&v)
                .ok_or_else(|| invalid(ENV_CLEAN_COPIES, &v, "expected off, ssd or all"))?,
        };
        c.verify_pages = flag(ENV_VERIFY_PAGES, false)?;
        c.exact_fit = flag(ENV_EXACT_FIT, true)?;
        c.trace_pages = flag(ENV_TRACE_PAGES, false)?;
        c.ssd = get(ENV_SSD).filter(|s| !s.is_empty()).map(PathBuf::from);
        c.ssd_size = size(ENV_SSD_SIZE)?;
        c.ssd_encrypt = flag(ENV_SSD_ENCRYPT, true)?;
        if let Some(v) = get(ENV_SSD_READ_AHEAD).filter(|v| !v.is_empty()) {
            c.ssd_read_ahead = v
                .parse()
                .ok()
                .filter(|n| (1..=MAX_SSD_READ_AHEAD).contains(n))
                .ok_or_else(|| {
                    invalid(
                        ENV_SSD_READ_AHEAD,
                        &v,
                        format!("expected 1..={MAX_SSD_READ_AHEAD} pages (1: no read-ahead)"),
                    )
                })?;
        }
        c.report_dir = get(ENV_REPORT_DIR)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        c.socket_dir = get(ENV_SOCKET_DIR)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        if let Some(v) = get(ENV_ON_ERROR) {
            c.on_error = match v.as_str() {
                "fail" => OnError::Fail,
                "off" => OnError::Off,
                _ => return Err(invalid(ENV_ON_ERROR, &v, "expected fail or off")),
            };
        }
        c.log = get(ENV_LOG).filter(|s| !s.is_empty());
        if let Some(v) = get(ENV_RUN_PID) {
            c.run_pid = Some(
                v.parse()
                    .ok()
                    .filter(|&p: &u32| p > 0)
                    .ok_or_else(|| invalid(ENV_RUN_PID, &v, "expected a process id"))?,
            );
        }
        c.summary = flag(ENV_SUMMARY, false)?;
        c.stats_file = get(ENV_STATS_FILE)
            .filter(|s| !s.is_empty())
            .map(PathBuf::from);
        Ok(c)
    }

    /// The variables that configure a process like this (what `zmem run` sets).
    pub fn to_vars(&self) -> Vec<(&'static str, String)> {
        let mut v = Vec::new();
        match self.resident {
            Some(r) => v.push((ENV_RESIDENT, r.to_string())),
            None => v.push((ENV_ADAPTIVE, "1".into())),
        }
        if let Some(s) = self.size {
            v.push((ENV_SIZE, s.to_string()));
        }
        if let Some(s) = self.maps {
            v.push((ENV_MAPS, s.to_string()));
        }
        if let Some(s) = self.store_limit {
            v.push((ENV_STORE_LIMIT, s.to_string()));
        }
        if let Some(s) = self.start_at {
            v.push((ENV_START_AT, s.to_string()));
        }
        v.push((ENV_POLICY, self.policy.name().into()));
        v.push((ENV_EVICTION, eviction_name(self.eviction).into()));
        v.push((ENV_HANDLER_THREADS, self.handler_threads.to_string()));
        if !self.colocate {
            v.push((ENV_COLOCATE, "0".into()));
        }
        if !self.inherit_fork {
            v.push((ENV_INHERIT_FORK, "0".into()));
        }
        if !self.async_settle {
            v.push((ENV_ASYNC_SETTLE, "0".into()));
        }
        if self.fault_route != FaultRoute::Handler {
            v.push((ENV_FAULT_ROUTE, self.fault_route.name().into()));
        }
        if self.fault_route_auto {
            v.push((ENV_FAULT_ROUTE_AUTO, "1".into()));
        }
        if self.clean_copies != CleanCopies::default() {
            v.push((ENV_CLEAN_COPIES, self.clean_copies.name().into()));
        }
        if self.verify_pages {
            v.push((ENV_VERIFY_PAGES, "1".into()));
        }
        if self.trace_pages {
            v.push((ENV_TRACE_PAGES, "1".into()));
        }
        if !self.exact_fit {
            v.push((ENV_EXACT_FIT, "0".into()));
        }
        if let Some(d) = &self.ssd {
            v.push((ENV_SSD, d.display().to_string()));
        }
        if let Some(s) = self.ssd_size {
            v.push((ENV_SSD_SIZE, s.to_string()));
        }
        if !self.ssd_encrypt {
            v.push((ENV_SSD_ENCRYPT, "0".into()));
        }
        if self.ssd_read_ahead != DEFAULT_SSD_READ_AHEAD {
            v.push((ENV_SSD_READ_AHEAD, self.ssd_read_ahead.to_string()));
        }
        if let Some(d) = &self.report_dir {
            v.push((ENV_REPORT_DIR, d.display().to_string()));
        }
        if let Some(d) = &self.socket_dir {
            v.push((ENV_SOCKET_DIR, d.display().to_string()));
        }
        v.push((
            ENV_ON_ERROR,
            match self.on_error {
                OnError::Fail => "fail",
                OnError::Off => "off",
            }
            .into(),
        ));
        if let Some(l) = &self.log {
            v.push((ENV_LOG, l.clone()));
        }
        if let Some(p) = self.run_pid {
            v.push((ENV_RUN_PID, p.to_string()));
        }
        if self.summary {
            v.push((ENV_SUMMARY, "1".into()));
        }
        if let Some(f) = &self.stats_file {
            v.push((ENV_STATS_FILE, f.display().to_string()));
        }
        v
    }
}

/// A process's statistics: the reply of its stats socket and its exit report. The heap's
/// region statistics are embedded as they are ([`RegionStats`], one schema); the accessors give
/// the figures `zmem stat` shows.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ProcessStats {
    pub pid: u32,
    /// The program (argv[0] as the kernel saw it, /proc/self/comm).
    pub program: String,
    pub zmem_version: String,
    /// Seconds since zmem started in the process.
    pub uptime_s: f64,
    /// Whether the heap is compressed (false: zmem failed to start and ZMEM_ON_ERROR=off).
    pub active: bool,
    /// The policy and eviction in use.
    pub policy: String,
    pub eviction: String,
    pub adaptive: bool,
    /// The heap's region (the program's own mappings included: they are part of it).
    pub region: RegionStats,
    /// The program's own anonymous mappings served from the region.
    #[serde(default)]
    pub maps: MapStats,
    /// The SSD tier's log, if any (zram's bd_stat and more).
    #[serde(default)]
    pub ssd: Option<zmem_tier::LogStats>,
    /// The signal route's syscall guard: calls trapped, and calls the C library's wrappers
    /// made without a trap.
    #[serde(default)]
    pub guard: zmem_region::guard::GuardStats,
    /// CPU time spent compressing and decompressing (ns).
    pub codec_cpu_ns: u64,
    /// CPU time of the whole process so far (user + system, ns).
    pub process_cpu_ns: u64,
}

/// The program's own anonymous mappings (mmap) that zmem tiers: they live in a part of the
/// region set aside for them (the map space), beside the heap.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct MapStats {
    /// Bytes of address space set aside for them (0: heap only).
    pub space: u64,
    /// Bytes the program has mapped there now.
    pub mapped: u64,
    /// Mappings served from the map space so far.
    pub served: u64,
    /// Anonymous private mappings left to the kernel (not tiered): stacks, MAP_32BIT, locked
    /// or huge-page mappings, or the map space was full.
    pub passed: u64,
    /// Bytes of the map space the program mapped files or shared memory over (left to the
    /// kernel, and not reused once unmapped).
    pub foreign: u64,
}

impl ProcessStats {
    /// The statistics of an active process from its heap's region: the one conversion.
    /// `codec_cpu_ns` is taken from the store's engine counters, which are not serialised.
    pub fn of_region(region: RegionStats) -> ProcessStats {
        let codec_cpu_ns = region
            .store
            .engine
            .per_codec
            .iter()
            .map(|c| c.nanos)
            .sum::<u64>()
            + region.store.decompress_nanos;
        ProcessStats {
            active: true,
            region,
            codec_cpu_ns,
            ..Default::default()
        }
    }

    /// Heap data per byte of DRAM it occupies.
    pub fn ratio(&self) -> f64 {
        let dram = self.resident() + self.mem_used_total();
        if dram == 0 {
            return 0.0;
        }
        self.data() as f64 / dram as f64
    }

    /// Bytes of the heap the program touched: in DRAM or compressed.
    pub fn data(&self) -> u64 {
        self.resident() + self.orig_data_size()
    }

    /// Virtual size of the heap (the region without the map space).
    pub fn heap_size(&self) -> u64 {
        self.region.size.saturating_sub(self.maps.space)
    }

    /// Current resident budget.
    pub fn budget(&self) -> u64 {
        self.region.budget
    }

    /// Heap bytes in DRAM now, uncompressed (mapped, or evicted and waiting for compression).
    pub fn resident(&self) -> u64 {
        self.region.resident + self.region.staged
    }

    /// Heap bytes held compressed (uncompressed size; zram's orig_data_size), without the
    /// clean copies of resident pages (counted once, as resident).
    pub fn orig_data_size(&self) -> u64 {
        self.region
            .store
            .orig_data_size
            .saturating_sub(self.region.clean_copies)
    }

    /// Their compressed size (zram's compr_data_size).
    pub fn compr_data_size(&self) -> u64 {
        self.region.store.compr_data_size
    }

    /// DRAM the compressed pages take, allocator overhead included (zram's mem_used_total).
    pub fn mem_used_total(&self) -> u64 {
        self.region.store.mem_used_total
    }

    /// The store's memory limit (0 = none).
    pub fn mem_limit(&self) -> u64 {
        self.region.store.mem_limit
    }

    pub fn same_pages(&self) -> u64 {
        self.region.store.same_pages
    }

    /// Faults on compressed pages.
    pub fn major_faults(&self) -> u64 {
        self.region.major_faults
    }

    /// Faults on never-touched pages.
    pub fn zero_faults(&self) -> u64 {
        self.region.zero_faults
    }

    pub fn evictions(&self) -> u64 {
        self.region.evictions
    }

    /// Heap bytes in DRAM, outside the budget, because they did not compress when evicted.
    pub fn incompressible(&self) -> u64 {
        self.region.incompressible
    }

    /// Evictions of pages unchanged since their fault-in, which reused their compressed copy.
    pub fn clean_evictions(&self) -> u64 {
        self.region.clean_evictions
    }

    /// Evictions the store refused because it was full (pages stayed in DRAM).
    pub fn store_refused(&self) -> u64 {
        self.region.store_refused
    }

    pub fn forks(&self) -> u64 {
        self.region.forks
    }

    /// Median fault latency (ns).
    pub fn fault_p50_ns(&self) -> u64 {
        self.region.fault_latency.p50
    }

    /// 99th percentile fault latency (ns).
    pub fn fault_p99_ns(&self) -> u64 {
        self.region.fault_latency.p99
    }
}

/// The machine's memory (MemTotal), or None if the kernel will not say.
pub fn machine_memory() -> Option<u64> {
    // sysinfo's totalram is /proc/meminfo's MemTotal, without the file (a procfs path walk
    // and the whole text made, in every process zmem starts in).
    // SAFETY: an all-zero sysinfo is a valid buffer for the kernel to fill.
    let mut si: libc::sysinfo = unsafe { std::mem::zeroed() };
    // SAFETY: `si` is a valid, writable sysinfo.
    if unsafe { libc::sysinfo(&mut si) } != 0 {
        return None;
    }
    (si.totalram as u64).checked_mul(u64::from(si.mem_unit.max(1)))
}

/// The socket directory named by `ZMEM_SOCKET_DIR` in this process's environment, or the
/// default one.
pub fn socket_dir_from_env() -> PathBuf {
    socket_dir(
        std::env::var_os(ENV_SOCKET_DIR)
            .map(PathBuf::from)
            .as_deref(),
    )
}

/// The default socket directory of user `uid`: /tmp/zmem-<uid>.
pub fn default_socket_dir(uid: u32) -> PathBuf {
    PathBuf::from(format!("/tmp/zmem-{uid}"))
}

/// The socket directory of this user: `ZMEM_SOCKET_DIR` or [`default_socket_dir`].
pub fn socket_dir(configured: Option<&Path>) -> PathBuf {
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    configured
        .map(Path::to_path_buf)
        .unwrap_or_else(|| default_socket_dir(uid))
}

/// The stats socket of process `pid`.
pub fn socket_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.sock"))
}

/// Reads one live process's statistics from its stats socket in `dir` (what `zmem stat PID`
/// prints; a benchmark samples a server with it).
pub fn query_stats(dir: &Path, pid: u32) -> std::io::Result<ProcessStats> {
    use std::io::{BufRead, BufReader};
    let s = std::os::unix::net::UnixStream::connect(socket_path(dir, pid))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(5)))?;
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line)?;
    serde_json::from_str(&line).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// The file in report directory `dir` to which each process appends its exit report (one
/// [`ProcessStats`] as a JSON line, in one `write` with `O_APPEND`, so that the lines of
/// processes that end together never mix). One file, not one per process: creating a file was
/// 0.1–0.2 ms of every process's end (docs/DESIGN-NOTES.md, "What a process start costs").
pub fn reports_file(dir: &Path) -> PathBuf {
    dir.join("reports.jsonl")
}

/// One process's exit report as it is appended to [`reports_file`]: its JSON between two
/// newlines, so that a line another process left cut (killed while writing) stays a line of
/// its own, which [`read_reports`] skips, instead of swallowing the next one.
pub fn report_line(stats: &ProcessStats) -> serde_json::Result<Vec<u8>> {
    let mut line = vec![b'\n'];
    serde_json::to_writer(&mut line, stats)?;
    line.push(b'\n');
    Ok(line)
}

/// The exit reports in `reports` (the contents of a [`reports_file`]), skipping empty and cut
/// lines.
pub fn read_reports(reports: &[u8]) -> Vec<ProcessStats> {
    reports
        .split(|&b| b == b'\n')
        .filter(|l| !l.is_empty())
        .filter_map(|l| serde_json::from_slice(l).ok())
        .collect()
}

/// Why a directory cannot hold stats sockets.
#[derive(Debug, thiserror::Error)]
pub enum DirError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} belongs to uid {owner}, not to this user (uid {me}); refusing to use it")]
    NotOwner { path: PathBuf, owner: u32, me: u32 },
    #[error("{path} has mode {mode:o}; it must not be accessible to other users (0700)")]
    Open { path: PathBuf, mode: u32 },
}

/// Creates `dir` (mode 0700) if needed and checks that only this user can use it, so a socket
/// in it can only be opened by the same user.
pub fn private_dir(dir: &Path) -> Result<(), DirError> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt};
    let io = |source| DirError::Io {
        path: dir.to_path_buf(),
        source,
    };
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(io(e)),
    }
    let md = std::fs::symlink_metadata(dir).map_err(io)?;
    // SAFETY: getuid cannot fail.
    let me = unsafe { libc::getuid() };
    if !md.is_dir() {
        return Err(io(std::io::Error::other("not a directory")));
    }
    if md.uid() != me {
        return Err(DirError::NotOwner {
            path: dir.to_path_buf(),
            owner: md.uid(),
            me,
        });
    }
    if md.mode() & 0o077 != 0 {
        return Err(DirError::Open {
            path: dir.to_path_buf(),
            mode: md.mode() & 0o7777,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn machine_memory_is_meminfos_memtotal() {
        let text = std::fs::read_to_string("/proc/meminfo").unwrap();
        let kib: u64 = text
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap();
        assert_eq!(machine_memory(), Some(kib * 1024));
    }

    fn vars(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let m: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn an_ssd_tier_gets_a_store_limit() {
        let mut c = RunConfig {
            resident: Some(256 << 20),
            ..RunConfig::default()
        };
        assert_eq!(c.effective_store_limit(), None);
        c.ssd = Some("/var/tmp".into());
        assert_eq!(c.effective_store_limit(), Some(64 << 20));
        c.resident = Some(32 << 20);
        assert_eq!(c.effective_store_limit(), Some(MIN_SSD_STORE_LIMIT));
        c.store_limit = Some(5 << 20);
        assert_eq!(c.effective_store_limit(), Some(5 << 20));
        let bad = RunConfig::from_vars(vars(&[(ENV_SSD_ENCRYPT, "yes")]));
        assert!(matches!(bad, Err(ConfigError::Invalid { var, .. }) if var == ENV_SSD_ENCRYPT));
        for v in ["0", "18", "eight"] {
            let bad = RunConfig::from_vars(vars(&[(ENV_SSD_READ_AHEAD, v)]));
            assert!(
                matches!(bad, Err(ConfigError::Invalid { var, .. }) if var == ENV_SSD_READ_AHEAD),
                "{v}"
            );
        }
        let one = RunConfig::from_vars(vars(&[(ENV_SSD_READ_AHEAD, "1")])).unwrap();
        assert_eq!(one.ssd_read_ahead, 1);
    }

    #[test]
    fn the_start_point_is_a_quarter_of_the_budget_at_most_4m_unless_set() {
        let at = |vs: &[(&str, &str)]| RunConfig::from_vars(vars(vs)).unwrap().start_at();
        assert_eq!(at(&[(ENV_RESIDENT, "4M")]), 1 << 20);
        assert_eq!(at(&[(ENV_RESIDENT, "1G")]), MAX_DEFAULT_START_AT);
        assert_eq!(at(&[(ENV_ADAPTIVE, "1")]), MAX_DEFAULT_START_AT);
        assert_eq!(at(&[(ENV_RESIDENT, "1G"), (ENV_START_AT, "0")]), 0);
        assert_eq!(at(&[(ENV_RESIDENT, "4M"), (ENV_START_AT, "64M")]), 64 << 20);
    }

    #[test]
    fn reports_are_read_back_past_a_cut_line() {
        let report = |pid: u32| ProcessStats {
            pid,
            program: format!("p{pid}"),
            ..Default::default()
        };
        let mut file = report_line(&report(1)).unwrap();
        // A process killed in the middle of its write.
        let cut = report_line(&report(2)).unwrap();
        file.extend_from_slice(&cut[..cut.len() / 2]);
        file.extend(report_line(&report(3)).unwrap());
        let read: Vec<u32> = read_reports(&file).iter().map(|s| s.pid).collect();
        assert_eq!(read, [1, 3]);
        assert!(read_reports(b"").is_empty());
        assert!(read_reports(b"not json\n\n").is_empty());
    }

    #[test]
    fn defaults_when_nothing_is_set() {
        assert_eq!(
            RunConfig::from_vars(vars(&[])).unwrap(),
            RunConfig::default()
        );
    }

    #[test]
    fn round_trip_through_the_environment() {
        let c = RunConfig {
            resident: Some(64 << 20),
            size: Some(8 << 30),
            maps: Some(0),
            store_limit: Some(100 << 20),
            policy: Policy::Balanced,
            eviction: Eviction::Fifo,
            handler_threads: 2,
            colocate: false,
            inherit_fork: false,
            async_settle: false,
            fault_route: FaultRoute::Signal,
            fault_route_auto: true,
            clean_copies: CleanCopies::All,
            verify_pages: true,
            trace_pages: true,
            exact_fit: false,
            ssd: Some("/var/tmp".into()),
            ssd_size: Some(2 << 30),
            ssd_encrypt: false,
            ssd_read_ahead: 3,
            start_at: Some(1 << 20),
            report_dir: Some("/tmp/r".into()),
            socket_dir: Some("/tmp/s".into()),
            on_error: OnError::Off,
            log: Some("debug".into()),
            run_pid: Some(4242),
            summary: true,
            stats_file: Some("/tmp/run.json".into()),
        };
        let v = c.to_vars();
        let m: HashMap<String, String> =
            v.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
        assert_eq!(RunConfig::from_vars(|k| m.get(k).cloned()).unwrap(), c);
        let adaptive = RunConfig {
            resident: None,
            ..RunConfig::default()
        };
        let m: HashMap<String, String> = adaptive
            .to_vars()
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        assert_eq!(
            RunConfig::from_vars(|k| m.get(k).cloned()).unwrap(),
            adaptive
        );
    }

    #[test]
    fn suffixes_are_accepted_by_hand() {
        let c = RunConfig::from_vars(vars(&[(ENV_RESIDENT, "2G"), (ENV_SIZE, "64g")])).unwrap();
        assert_eq!(c.resident, Some(2 << 30));
        assert_eq!(c.size, Some(64 << 30));
    }

    #[test]
    fn bad_settings_name_the_variable() {
        for (k, v) in [
            (ENV_RESIDENT, "lots"),
            (ENV_ADAPTIVE, "yes"),
            (ENV_SIZE, "-1"),
            (ENV_MAPS, "some"),
            (ENV_STORE_LIMIT, "1x"),
            (ENV_POLICY, "turbo"),
            (ENV_EVICTION, "lru"),
            (ENV_HANDLER_THREADS, "0"),
            (ENV_HANDLER_THREADS, "99"),
            (ENV_COLOCATE, "yes"),
            (ENV_FAULT_ROUTE, "sigbus"),
            (ENV_ASYNC_SETTLE, "on"),
            (ENV_CLEAN_COPIES, "0"),
            (ENV_VERIFY_PAGES, "yes"),
            (ENV_EXACT_FIT, "on"),
            (ENV_ON_ERROR, "ignore"),
            (ENV_RUN_PID, "0"),
            (ENV_RUN_PID, "me"),
            (ENV_SUMMARY, "yes"),
            (ENV_START_AT, "soon"),
        ] {
            let e = RunConfig::from_vars(vars(&[(k, v)])).unwrap_err();
            let msg = e.to_string();
            assert!(msg.starts_with(&format!("{k}=")), "{msg}");
        }
    }

    #[test]
    fn private_dir_is_created_0700_and_open_dirs_are_refused() {
        use std::os::unix::fs::PermissionsExt;
        let t = tempfile::tempdir().unwrap();
        let d = t.path().join("socks");
        private_dir(&d).unwrap();
        let mode = std::fs::metadata(&d).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700);
        private_dir(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        assert!(matches!(private_dir(&d), Err(DirError::Open { .. })));
        let f = t.path().join("file");
        std::fs::write(&f, b"x").unwrap();
        assert!(matches!(private_dir(&f), Err(DirError::Io { .. })));
    }

    #[test]
    fn ratio_counts_dram_only() {
        let mut s = ProcessStats::default();
        s.region.resident = 60;
        s.region.staged = 40;
        s.region.store.orig_data_size = 300;
        s.region.store.mem_used_total = 100;
        assert_eq!(s.data(), 400);
        assert!((s.ratio() - 2.0).abs() < 1e-9);
        assert_eq!(ProcessStats::default().ratio(), 0.0);
    }
}
