//! `zmem bench redis` and `zmem bench memcached`: the QZRAM paper's Redis experiment (seed 000,
//! section 5.4) beside the kernel's zram. A key-value server is loaded with SETs of ~4000-byte
//! values cut from the corpus, in steps of data size; after every step a random sample of all
//! loaded keys is read back with GETs and every value is compared with the corpus byte for byte.
//! The same load runs under three configurations with the same memory limit, one after the
//! other:
//!
//! - `noswap`: the server in a cgroup v1 memory cgroup limited to `--limit`, without swap; it is
//!   OOM-killed eventually;
//! - `zram`: the same limit, /dev/zram0 (lz4) as swap with zram's `mem_limit` set to
//!   `--compressed` (zram's memory is not charged to a v1 cgroup);
//! - `zmem`: the server under `zmem run` (its heap in a zmem region) in a cgroup of `--limit` +
//!   `--compressed` (the compressed pool lives in the process and is charged there), so the
//!   DRAM is the same as zram's.
//!
//! Each configuration ends when the server dies (the data size of the last step fully loaded and
//! verified is its "data at OOM"), when a connection fails, or at `--max-data`. The machine is
//! restored as found by guards, on success, on error and after Ctrl-C alike: the server is
//! stopped by the pid this process started (SIGTERM, then SIGKILL, always reaped; what is left
//! in its cgroup is killed by pid too), the cgroup removed, swap turned off, zram0 reset.
//!
//! The protocol clients are small hand-written ones over `TcpStream` ([`super::redis`] speaks
//! RESP, [`super::memcached`] the memcached text protocol), pipelined. Submodules: `client`
//! (connections, the [`Protocol`] trait), `server` (the server process and the helpers beside
//! it), `report` (results, tables, chart).

mod client;
mod report;
mod server;

pub use client::{read_data, read_line, Conn, KvError, Patient, Protocol, Watch};
pub use report::{
    plot, ratio_lines, ratios, step_table, summary_table, ConfigResult, Ratios, Skipped, Step, Stop,
};
pub use server::{Server, ServerSpec};

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use super::blockdev::parse_mm_stat;
use super::cgroup::{
    bench_cgroups, memory_stat, oom_kills, swaps, MemCgroup, SwapOn, CGROUP_PREFIX, MEMCG_ROOT,
    SWAP_PRIORITY, ZRAM_INDEX,
};
use super::corpus::Corpus;
use super::zram::{self, ZramSession};
use super::{aborted, fmt_size, progress_bar, Interrupted, MachineInfo};
use crate::cli::{corpus_info, default_corpus, write_json, POLICIES};
use crate::size::parse_size;
use report::{mib_str, stop_str};
use server::{describe_status, free_port, ScratchDir, StatPoller, ZramWatchdog};

const MIB: u64 = 1 << 20;

/// Shortest and longest value: about 4000 bytes, so that the values fall in one allocator size
/// class (jemalloc's 4 KiB) and do not inflate the ratio, and vary so that they are distinct.
pub const VALUE_MIN: usize = 3900;
pub const VALUE_MAX: usize = 4000;

/// Default seed of the values' corpus offsets and of the GET samples.
pub const SEED: u64 = 0x7a6d_656d_6b76;

/// How long a server may take to accept connections after it was started.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a server gets to exit after SIGTERM before SIGKILL.
pub const TERM_TIMEOUT: Duration = Duration::from_secs(10);
/// Socket timeout between two checks of the interrupt flag.
pub const POLL: Duration = Duration::from_millis(500);
/// Lines of a server's output kept: the first ones and the last ones.
pub const LOG_HEAD: usize = 100;
pub const LOG_TAIL: usize = 300;

/// The targets of the issue (data at OOM and GET throughput, zmem against the others).
pub const TARGET_DATA_VS_ZRAM: f64 = 1.66;
pub const TARGET_DATA_VS_NOSWAP: f64 = 3.0;
pub const TARGET_GET_VS_ZRAM: f64 = 1.0;

/// The three configurations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum KvConfig {
    /// A memory cgroup limit, no swap: the server is OOM-killed.
    Noswap,
    /// The same limit with /dev/zram0 as swap (zram's mem_limit = --compressed).
    Zram,
    /// The server under `zmem run` in a cgroup of --limit + --compressed.
    Zmem,
}

impl KvConfig {
    pub fn as_str(self) -> &'static str {
        match self {
            KvConfig::Noswap => "noswap",
            KvConfig::Zram => "zram",
            KvConfig::Zmem => "zmem",
        }
    }
}

/// Flags of `zmem bench redis` and `zmem bench memcached`.
#[derive(Debug, Clone, Args, Serialize)]
pub struct KvArgs {
    /// DRAM of every configuration: memory.limit_in_bytes of the server's memory cgroup (the
    /// zmem configuration gets --compressed on top, for its compressed pool).
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub limit: u64,
    /// Compressed memory on top of --limit: zram's mem_limit, zmem's --store-limit
    /// [default: --limit].
    #[arg(long, value_parser = parse_size)]
    pub compressed: Option<u64>,
    /// Value bytes loaded per step; GETs and measurements follow every step.
    #[arg(long, value_parser = parse_size, default_value = "64M")]
    pub step: u64,
    /// Stop loading at this many value bytes [default: 16 x --limit].
    #[arg(long, value_parser = parse_size)]
    pub max_data: Option<u64>,
    /// GETs after every step, of keys drawn at random from all loaded keys (each verified).
    #[arg(long, default_value_t = 20000)]
    pub gets: u64,
    /// Commands sent before their replies are read.
    #[arg(long, default_value_t = 64)]
    pub pipeline: usize,
    /// Client connections (one thread each).
    #[arg(long, default_value_t = 2)]
    pub clients: usize,
    /// Configurations to run, in this order, comma separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "noswap,zram,zmem"
    )]
    pub configs: Vec<KvConfig>,
    /// zram's compression algorithm.
    #[arg(long, default_value = "lz4")]
    pub zram_alg: String,
    /// zmem: memory of the server outside its heap (code, stacks, zmem's own tables); the heap's
    /// resident budget is --limit minus this.
    #[arg(long, value_parser = parse_size, default_value = "48M")]
    pub margin: u64,
    /// zmem: compression policy passed to `zmem run` [default: zmem run's].
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(POLICIES))]
    pub policy: Option<String>,
    /// zmem: virtual size of the heap region [default: 2 x --max-data + 256M].
    #[arg(long, value_parser = parse_size)]
    pub zmem_size: Option<u64>,
    /// The server binary [default: redis-server or memcached, from PATH].
    #[arg(long)]
    pub server: Option<PathBuf>,
    /// Corpus directory [default: ../shared/corpora/calgary or /work/shared/corpora/calgary].
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// JSON output [default: bench-out/redis.json or bench-out/memcached.json].
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// SVG chart output [default: bench-out/redis.svg or bench-out/memcached.svg].
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Seed of the values' corpus offsets and of the GET samples.
    #[arg(long, default_value_t = SEED)]
    pub seed: u64,
    /// Seconds without any reply after which a server counts as stalled (the run ends there).
    #[arg(long, default_value_t = 120)]
    pub stall_timeout: u64,
    /// zram: seconds without any reply, once zram holds its mem_limit, after which the server
    /// counts as out of memory (the kernel may reclaim in vain for minutes before its OOM killer
    /// strikes); 0 waits for the OOM killer or --stall-timeout.
    #[arg(long, default_value_t = 20)]
    pub zram_full_stall: u64,
}

/// The run's parameters after validation.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub server: String,
    pub server_bin: PathBuf,
    pub server_version: String,
    pub limit: u64,
    pub compressed: u64,
    pub step: u64,
    pub max_data: u64,
    pub gets: u64,
    pub pipeline: usize,
    pub clients: usize,
    pub configs: Vec<KvConfig>,
    pub zram_alg: String,
    pub zmem_resident: u64,
    pub zmem_size: u64,
    pub zmem_policy: Option<String>,
    pub seed: u64,
    pub value_bytes: (usize, usize),
    pub stall_timeout_s: u64,
    pub zram_full_stall_s: u64,
}

impl Plan {
    /// Checks the flags (an error names the flag), finds the server binary.
    pub fn new(args: &KvArgs, spec: &ServerSpec) -> anyhow::Result<Plan> {
        anyhow::ensure!(
            args.limit >= 16 * MIB,
            "--limit {} is too small for a server (at least 16M)",
            fmt_size(args.limit)
        );
        let compressed = args.compressed.unwrap_or(args.limit);
        anyhow::ensure!(
            compressed >= 4 * MIB,
            "--compressed {} is too small (at least 4M; zram's mem_limit 0 would mean no limit)",
            fmt_size(compressed)
        );
        anyhow::ensure!(
            args.step >= MIB,
            "--step {} is too small (at least 1M)",
            fmt_size(args.step)
        );
        let max_data = args.max_data.unwrap_or(args.limit.saturating_mul(16));
        anyhow::ensure!(
            max_data >= args.step,
            "--max-data {} is smaller than --step {}",
            fmt_size(max_data),
            fmt_size(args.step)
        );
        anyhow::ensure!(
            (1..=4096).contains(&args.pipeline),
            "--pipeline must be 1..4096, got {}",
            args.pipeline
        );
        anyhow::ensure!(
            (1..=64).contains(&args.clients),
            "--clients must be 1..64, got {}",
            args.clients
        );
        anyhow::ensure!(
            args.stall_timeout >= 1,
            "--stall-timeout must be at least 1 s"
        );
        anyhow::ensure!(!args.configs.is_empty(), "--configs names no configuration");
        for (i, c) in args.configs.iter().enumerate() {
            anyhow::ensure!(
                !args.configs[..i].contains(c),
                "--configs names {} twice",
                c.as_str()
            );
        }
        anyhow::ensure!(
            !args.zram_alg.trim().is_empty(),
            "--zram-alg must name an algorithm"
        );
        let zmem_resident = args.limit.saturating_sub(args.margin);
        if args.configs.contains(&KvConfig::Zmem) {
            anyhow::ensure!(
                zmem_resident >= 16 * MIB,
                "--limit {} minus --margin {} leaves {} for zmem's resident heap (at least 16M)",
                fmt_size(args.limit),
                fmt_size(args.margin),
                fmt_size(zmem_resident)
            );
        }
        let zmem_size = args
            .zmem_size
            .unwrap_or_else(|| (max_data.saturating_mul(2) + 256 * MIB).div_ceil(MIB) * MIB);
        anyhow::ensure!(
            zmem_size > zmem_resident,
            "--zmem-size {} must be larger than zmem's resident heap {}",
            fmt_size(zmem_size),
            fmt_size(zmem_resident)
        );
        let server_bin = find_binary(args.server.as_deref(), spec)?;
        let server_version = binary_version(&server_bin, spec.version_arg);
        Ok(Plan {
            server: spec.name.to_string(),
            server_bin,
            server_version,
            limit: args.limit,
            compressed,
            step: args.step,
            max_data,
            gets: args.gets,
            pipeline: args.pipeline,
            clients: args.clients,
            configs: args.configs.clone(),
            zram_alg: args.zram_alg.trim().to_string(),
            zmem_resident,
            zmem_size,
            zmem_policy: args.policy.clone(),
            seed: args.seed,
            value_bytes: (VALUE_MIN, VALUE_MAX),
            stall_timeout_s: args.stall_timeout,
            zram_full_stall_s: args.zram_full_stall,
        })
    }

    fn stall(&self) -> Duration {
        Duration::from_secs(self.stall_timeout_s)
    }
}

/// `--server` as given (it must exist), or the server's name looked up in PATH.
fn find_binary(given: Option<&Path>, spec: &ServerSpec) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        anyhow::ensure!(
            p.is_file(),
            "--server {} does not exist or is not a file",
            p.display()
        );
        return Ok(p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path)
        .map(|d| d.join(spec.default_bin))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            anyhow::anyhow!(
                "{} not found in PATH ({}; or pass --server PATH)",
                spec.default_bin,
                spec.install_hint
            )
        })
}

/// "7.0.15" out of "Redis server v=7.0.15 sha=...", "1.6.18" out of "memcached 1.6.18".
fn short_version(line: &str) -> String {
    let words: Vec<&str> = line.split_whitespace().collect();
    if let Some(v) = words.iter().find_map(|w| w.strip_prefix("v=")) {
        return v.to_string();
    }
    words
        .iter()
        .find(|w| w.starts_with(|c: char| c.is_ascii_digit()))
        .map_or_else(|| line.trim().to_string(), |w| w.to_string())
}

fn binary_version(bin: &Path, arg: &str) -> String {
    Command::new(bin)
        .arg(arg)
        .stdin(Stdio::null())
        .output()
        .ok()
        .map(|o| {
            let s = String::from_utf8_lossy(&o.stdout);
            short_version(s.lines().next().unwrap_or(""))
        })
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".into())
}

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The value of key i: `len(i)` corpus bytes from `offset(i)` (wrapping), both functions of i
/// and the seed, so any value can be checked without keeping it.
pub struct Values<'a> {
    corpus: &'a Corpus,
    seed: u64,
}

impl<'a> Values<'a> {
    pub fn new(corpus: &'a Corpus, seed: u64) -> Self {
        Values { corpus, seed }
    }

    pub fn len(&self, i: u64) -> usize {
        let span = (VALUE_MAX - VALUE_MIN + 1) as u64;
        VALUE_MIN + (mix(i ^ self.seed) % span) as usize
    }

    pub fn offset(&self, i: u64) -> u64 {
        mix(i.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ self.seed.rotate_left(29)) % self.corpus.len()
    }

    /// Fills `buf` with the value of key i.
    pub fn fill(&self, i: u64, buf: &mut Vec<u8>) {
        buf.resize(self.len(i), 0);
        self.corpus.fill(self.offset(i), buf);
    }

    /// Why `got` is not the value of key i, or None.
    pub fn check(&self, i: u64, got: &[u8]) -> Option<String> {
        let want = self.len(i);
        if got.len() != want {
            return Some(format!("{} bytes, expected {want}", got.len()));
        }
        self.corpus
            .first_mismatch(self.offset(i), got)
            .map(|at| format!("byte {at} of {want} differs from the corpus"))
    }

    /// First key index after `start` at which the value bytes from key 0 reach `target`, given
    /// `bytes` = the value bytes of keys 0..start.
    pub fn end_for(&self, start: u64, bytes: u64, target: u64) -> (u64, u64) {
        let (mut i, mut b) = (start, bytes);
        while b < target {
            b += self.len(i) as u64;
            i += 1;
        }
        (i, b)
    }
}

/// The key of index i.
pub fn key(i: u64, out: &mut Vec<u8>) {
    out.clear();
    let _ = write!(out, "key:{i:012}");
}

fn key_string(i: u64) -> String {
    format!("key:{i:012}")
}

/// `zmem bench redis` / `zmem bench memcached`.
pub fn run(args: &KvArgs, spec: &ServerSpec) -> anyhow::Result<()> {
    let plan = Plan::new(args, spec)?;
    let corpus_dir = args.corpus.clone().unwrap_or_else(default_corpus);
    let corpus = Corpus::load(&corpus_dir)?;
    let json_path = args
        .json
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-out/{}.json", spec.name)));
    let svg_path = args
        .svg
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-out/{}.svg", spec.name)));
    check_machine()?;
    let mut skipped = Vec::new();
    let mut runnable = Vec::new();
    for &c in &plan.configs {
        match precheck(c, &plan, spec) {
            Ok(()) => runnable.push(c),
            Err(reason) => {
                eprintln!("zmem: {} cannot run: {reason}", c.as_str());
                skipped.push(Skipped { config: c, reason });
            }
        }
    }
    let other_swap = swaps()?;
    if !other_swap.is_empty() {
        let list: Vec<String> = other_swap
            .iter()
            .map(|s| format!("{} priority {}", s.device, s.priority))
            .collect();
        eprintln!(
            "zmem: note: other swap is active ({}); zram's configuration may use it beside \
             zram0 (noswap and zmem get no swap: memory.memsw.limit_in_bytes)",
            list.join(", ")
        );
    }
    super::install_abort_handler();
    // Orphans of a server that forks (zmem run's child) become ours, so that they are reaped.
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes a flag; no memory is involved.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) };
    eprintln!(
        "zmem: bench {}: {} ({}), limit {}, compressed {}, steps of {} up to {}, {} GETs per step, \
         {} client(s), pipeline {}",
        spec.name,
        plan.server_bin.display(),
        plan.server_version,
        fmt_size(plan.limit),
        fmt_size(plan.compressed),
        fmt_size(plan.step),
        fmt_size(plan.max_data),
        plan.gets,
        plan.clients,
        plan.pipeline
    );

    let values = Values::new(&corpus, plan.seed);
    let mut results: Vec<ConfigResult> = Vec::new();
    let mut failure: Option<anyhow::Error> = None;
    for &c in &runnable {
        if aborted() {
            failure = Some(Interrupted.into());
            break;
        }
        let log_path = server_log_path(&json_path, c);
        match run_config(&plan, spec, c, &values, &log_path) {
            Ok(r) => {
                eprintln!(
                    "zmem: {}: {}: holds {} ({})",
                    spec.name,
                    c.as_str(),
                    mib_str(r.data_held),
                    stop_str(&r.stop)
                );
                results.push(r);
            }
            Err(e) if e.downcast_ref::<Interrupted>().is_some() => {
                failure = Some(e);
                break;
            }
            Err(e) if e.downcast_ref::<HardError>().is_some() => {
                failure = Some(e.context(format!("{} {}", spec.name, c.as_str())));
                break;
            }
            Err(e) => {
                let reason = format!("{e:#}");
                eprintln!("zmem: {}: {} failed: {reason}", spec.name, c.as_str());
                skipped.push(Skipped { config: c, reason });
            }
        }
    }

    let ratios = ratios(&results, plan.limit);
    let machine = MachineInfo::collect();
    if !results.is_empty() {
        println!(
            "machine: {} CPUs, {}, {}",
            machine.nproc, machine.cpu_model, machine.kernel
        );
        println!("{}", summary_table(&plan, &results, &skipped));
        println!();
        println!("{}", step_table(&results));
        println!();
        println!("{}", ratio_lines(&plan, &ratios, &results));
    }
    let crashed: Vec<String> = results
        .iter()
        .filter(|r| {
            matches!(r.stop.kind.as_str(), "server-died" | "connection-failed")
                || (r.stop.kind == "stalled" && r.config != KvConfig::Zram)
        })
        .map(|r| format!("{}: {}: {}", r.config.as_str(), r.stop.kind, r.stop.detail))
        .collect();
    if failure.is_none() && !crashed.is_empty() {
        failure = Some(anyhow::anyhow!(
            "the server did not end by running out of memory: {} (its output is in {})",
            crashed.join("; "),
            json_path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .map_or(".".into(), |d| d.display().to_string())
        ));
    }
    if failure.is_none() && !skipped.is_empty() {
        let why: Vec<String> = skipped
            .iter()
            .map(|s| format!("{}: {}", s.config.as_str(), s.reason))
            .collect();
        failure = Some(anyhow::anyhow!("not measured: {}", why.join("; ")));
    }
    let doc = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "args": args,
        "machine": machine,
        "corpus": corpus_info(&corpus),
        "plan": plan,
        "results": results,
        "skipped": skipped,
        "ratios": ratios,
        "error": failure.as_ref().map(|e| format!("{e:#}")),
    });
    write_json(&json_path, &doc)?;
    eprintln!("zmem: wrote {}", json_path.display());
    if !results.is_empty() {
        plot(&plan, &results, &svg_path)
            .with_context(|| format!("drawing {}", svg_path.display()))?;
        eprintln!("zmem: wrote {}", svg_path.display());
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Where the output of configuration `c`'s server goes: beside the JSON, e.g.
/// bench-out/redis-zmem-server.log.
fn server_log_path(json: &Path, c: KvConfig) -> PathBuf {
    let stem = json
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "kv".into());
    json.with_file_name(format!("{stem}-{}-server.log", c.as_str()))
}

/// Root and the cgroup v1 memory controller: without them nothing can run.
fn check_machine() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    anyhow::ensure!(
        uid == 0,
        "this benchmark needs root (memory cgroups, swapon, /dev/zram0); running as uid {uid}"
    );
    anyhow::ensure!(
        Path::new(MEMCG_ROOT).join("cgroup.procs").exists(),
        "no cgroup v1 memory controller at {MEMCG_ROOT} (cgroup v2 is not supported yet)"
    );
    for old in bench_cgroups() {
        let pid = old
            .file_name()
            .and_then(|n| n.to_str()?.strip_prefix(CGROUP_PREFIX)?.parse::<u32>().ok());
        if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            eprintln!(
                "zmem: note: {} is left from an earlier run that did not clean up; remove it \
                 with: rmdir {}",
                old.display(),
                old.display()
            );
        }
    }
    Ok(())
}

/// Why a configuration cannot run here (checked before anything runs).
fn precheck(c: KvConfig, plan: &Plan, spec: &ServerSpec) -> Result<(), String> {
    match c {
        KvConfig::Noswap => Ok(()),
        KvConfig::Zram => ZramSession::acquire(ZRAM_INDEX)
            .map(drop)
            .map_err(|e| e.to_string()),
        KvConfig::Zmem => zmem_run_available(plan, spec),
    }
}

/// Flags of `zmem run` this benchmark passes.
const ZMEM_RUN_FLAGS: [&str; 4] = ["--resident", "--store-limit", "--size", "--quiet"];

/// Whether this binary has `zmem run` with the flags used here, and it runs the server.
fn zmem_run_available(plan: &Plan, spec: &ServerSpec) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| format!("locating the zmem binary: {e}"))?;
    let out = Command::new(&exe)
        .args(["run", "--help"])
        .stdin(Stdio::null())
        .env_remove("RUST_LOG")
        .output()
        .map_err(|e| format!("running {} run --help: {e}", exe.display()))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let first = err.lines().next().unwrap_or("").trim();
        return Err(format!(
            "`zmem run` is not available in this build ({} run --help: {first}); \
             choose --configs noswap,zram",
            exe.display()
        ));
    }
    let help = String::from_utf8_lossy(&out.stdout);
    let missing: Vec<&str> = ZMEM_RUN_FLAGS
        .iter()
        .copied()
        .filter(|f| !help.contains(f))
        .collect();
    if !missing.is_empty() {
        return Err(format!(
            "`zmem run` lacks {} (its --help does not list them)",
            missing.join(", ")
        ));
    }
    // The whole chain once (the preload library found, the server preloadable, userfaultfd):
    // the server prints its version under `zmem run` and exits.
    let mut child = Command::new(&exe)
        .args(["run", "--quiet", "--resident", "16M", "--"])
        .arg(&plan.server_bin)
        .arg(spec.version_arg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .env_remove("RUST_LOG")
        .spawn()
        .map_err(|e| format!("running {} run: {e}", exe.display()))?;
    let t0 = Instant::now();
    let status = loop {
        match child.try_wait() {
            Ok(Some(s)) => break s,
            Ok(None) if t0.elapsed() < START_TIMEOUT => {
                std::thread::sleep(Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!(
                    "`zmem run -- {} {}` did not finish within {} s",
                    plan.server_bin.display(),
                    spec.version_arg,
                    START_TIMEOUT.as_secs()
                ));
            }
        }
    };
    if !status.success() {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        let err = err.split_whitespace().collect::<Vec<_>>().join(" ");
        return Err(format!(
            "`zmem run -- {} {}` failed ({}): {err}",
            plan.server_bin.display(),
            spec.version_arg,
            describe_status(status)
        ));
    }
    Ok(())
}

/// An error that fails the whole run (a wrong value, a protocol error): a bug, not an end.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HardError(String);

/// Guards of one configuration, dropped in reverse order: server, poller, cgroup, swap, zram.
#[derive(Default)]
struct Guards {
    zram: Option<ZramSession>,
    swap: Option<SwapOn>,
    cgroup: Option<MemCgroup>,
    poller: Option<StatPoller>,
    server: Option<Server>,
}

impl Drop for Guards {
    fn drop(&mut self) {
        drop(self.server.take());
        drop(self.poller.take());
        drop(self.cgroup.take());
        drop(self.swap.take());
        drop(self.zram.take());
    }
}

fn cg_write(cg: &Path, file: &str, value: &str) -> anyhow::Result<()> {
    let p = cg.join(file);
    std::fs::write(&p, value).with_context(|| format!("writing {value:?} to {}", p.display()))
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

/// Runs one configuration and restores the machine.
fn run_config(
    plan: &Plan,
    spec: &ServerSpec,
    c: KvConfig,
    values: &Values,
    log_path: &Path,
) -> anyhow::Result<ConfigResult> {
    let t_start = Instant::now();
    let swaps_before = swaps()?;
    let cg_name = format!("{CGROUP_PREFIX}{}", std::process::id());
    let cg_path = Path::new(MEMCG_ROOT).join(&cg_name);
    let scratch = ScratchDir::create(&format!("{}-{}", spec.name, c.as_str()))?;
    let mut g = Guards::default();
    let mut zram_json = None;
    let mut zmem_json = None;
    let cgroup_limit = match c {
        KvConfig::Zmem => plan.limit + plan.compressed,
        _ => plan.limit,
    };
    if c == KvConfig::Zram {
        let mut session = ZramSession::acquire(ZRAM_INDEX)?;
        // Room for everything the server could swap: never the limit of the run.
        let disksize = (plan.max_data + plan.max_data / 2 + 256 * MIB).div_ceil(4096) * 4096;
        session.configure(&plan.zram_alg, disksize)?;
        let idx = session.index();
        g.zram = Some(session);
        let ml = format!("/sys/block/zram{idx}/mem_limit");
        std::fs::write(&ml, plan.compressed.to_string())
            .with_context(|| format!("writing {} to {ml}", plan.compressed))?;
        g.swap = Some(SwapOn::enable(
            &PathBuf::from(format!("/dev/zram{idx}")),
            SWAP_PRIORITY,
        )?);
        zram_json = Some(serde_json::json!({
            "device": format!("/dev/zram{idx}"),
            "algorithm": plan.zram_alg,
            "disksize": disksize,
            "mem_limit": plan.compressed,
            "swap_priority": SWAP_PRIORITY,
        }));
    }
    let cg = MemCgroup::create(Path::new(MEMCG_ROOT), &cg_name, Some(cgroup_limit))?;
    g.cgroup = Some(cg);
    match c {
        KvConfig::Zram => cg_write(&cg_path, "memory.swappiness", "100")?,
        KvConfig::Noswap | KvConfig::Zmem => {
            // No kernel swap at all, even where other swap is active on the machine.
            cg_write(&cg_path, "memory.swappiness", "0")?;
            if cg_path.join("memory.memsw.limit_in_bytes").exists() {
                cg_write(
                    &cg_path,
                    "memory.memsw.limit_in_bytes",
                    &cgroup_limit.to_string(),
                )?;
            }
        }
    }
    g.poller = Some(StatPoller::start(&cg_path));

    let mut port = free_port()?;
    let mut command = server_command(plan, spec, c, port, &scratch.0);
    if c == KvConfig::Zmem {
        zmem_json = Some(serde_json::json!({
            "resident": plan.zmem_resident,
            "store_limit": plan.compressed,
            "size": plan.zmem_size,
            "policy": plan.zmem_policy.clone().unwrap_or_else(|| "zmem run's default".into()),
        }));
    }
    let description = describe_config(plan, c, cgroup_limit);
    eprintln!("zmem: {} {}: {description}", spec.name, c.as_str());
    // A port taken between free_port() and the server's bind: try another one.
    let mut tries = 0;
    let server = loop {
        match Server::start(&command, port, &cg_path, spec.protocol, plan.stall()) {
            Ok(s) => break s,
            Err(e) if tries < 2 && format!("{e:#}").contains("in use") => {
                tries += 1;
                port = free_port()?;
                command = server_command(plan, spec, c, port, &scratch.0);
            }
            Err(e) => return Err(e),
        }
    };
    g.server = Some(server);
    let oom_before = oom_kills(&cg_path);

    let outcome = load_loop(plan, spec, c, values, &mut g, &cg_path, oom_before);
    let server = g.server.as_mut().expect("server started");
    if let Ok((_, stop, _)) = &outcome {
        if matches!(stop.kind.as_str(), "zram-full" | "stalled") {
            server.kill();
        }
    }
    let oom = oom_kills(&cg_path).saturating_sub(oom_before);
    let exit = server.stop();
    let (log_tail, key_lines) = {
        let log = server.log();
        let text = log.lines().join("\n") + "\n";
        if let Err(e) = write_log(log_path, &text) {
            eprintln!("zmem: warning: {e:#}");
        }
        (log.last(20), log.key_lines())
    };
    drop(g);
    drop(scratch);
    let (steps, stop, server_pid) = outcome?;

    let swaps_after = swaps()?;
    let zram_disksize = zram::disksize(ZRAM_INDEX).ok();
    let restored = serde_json::json!({
        "swaps_as_before": swaps_after == swaps_before,
        "cgroup_removed": !cg_path.exists(),
        "zram_disksize": zram_disksize,
    });
    let zram_ok = c != KvConfig::Zram || zram_disksize == Some(0);
    if swaps_after != swaps_before || cg_path.exists() || !zram_ok {
        eprintln!("zmem: warning: the machine is not as it was: {restored}");
    }
    let data_held = steps.last().map_or(0, |s| s.data_bytes);
    let data_at_oom = (stop.kind != "max-data").then_some(data_held);
    Ok(ConfigResult {
        config: c,
        description,
        cgroup_limit,
        dram_total: match c {
            KvConfig::Zram => plan.limit + plan.compressed,
            _ => cgroup_limit,
        },
        command,
        server_pid,
        steps,
        data_held,
        data_at_oom,
        stop,
        oom_kills: oom,
        exit: exit.map(describe_status),
        server_log: log_path.display().to_string(),
        server_log_tail: log_tail,
        server_log_key_lines: key_lines,
        zram: zram_json,
        zmem: zmem_json,
        restored,
        wall_s: t_start.elapsed().as_secs_f64(),
    })
}

/// Writes a server's output beside the JSON.
fn write_log(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

fn describe_config(plan: &Plan, c: KvConfig, cgroup_limit: u64) -> String {
    match c {
        KvConfig::Noswap => format!("cgroup limit {}, no swap", fmt_size(cgroup_limit)),
        KvConfig::Zram => format!(
            "cgroup limit {}, /dev/zram{ZRAM_INDEX} {} swap with mem_limit {}",
            fmt_size(cgroup_limit),
            plan.zram_alg,
            fmt_size(plan.compressed)
        ),
        KvConfig::Zmem => format!(
            "zmem run --resident {} --store-limit {} in a cgroup of {}, no kernel swap",
            fmt_size(plan.zmem_resident),
            fmt_size(plan.compressed),
            fmt_size(cgroup_limit)
        ),
    }
}

fn server_command(
    plan: &Plan,
    spec: &ServerSpec,
    c: KvConfig,
    port: u16,
    dir: &Path,
) -> Vec<String> {
    let mut cmd = Vec::new();
    if c == KvConfig::Zmem {
        let exe = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "zmem".into());
        cmd.extend([
            exe,
            "run".into(),
            "--resident".into(),
            fmt_size(plan.zmem_resident),
            "--store-limit".into(),
            fmt_size(plan.compressed),
            "--size".into(),
            fmt_size(plan.zmem_size),
        ]);
        if let Some(p) = &plan.zmem_policy {
            cmd.extend(["--policy".into(), p.clone()]);
        }
        cmd.extend(["--quiet".into(), "--".into()]);
    }
    cmd.push(plan.server_bin.display().to_string());
    cmd.extend((spec.args)(port, dir));
    cmd
}

/// The steps of one configuration until it ends; Err for an interrupt or a hard error.
fn load_loop(
    plan: &Plan,
    spec: &ServerSpec,
    c: KvConfig,
    values: &Values,
    g: &mut Guards,
    cg: &Path,
    oom_before: u64,
) -> anyhow::Result<(Vec<Step>, Stop, Option<u32>)> {
    let proto = spec.protocol;
    let port = g.server.as_ref().expect("server").port;
    let stall = plan.stall();
    let watch = Arc::new(Watch::default());
    let mut ctl = Conn::connect(port, stall, &watch).context("connecting to the server")?;
    let stats0 = proto.stats(&mut ctl).map_err(anyhow::Error::from)?;
    let server_pid = proto.server_pid(&stats0);
    let mut conns = Vec::with_capacity(plan.clients);
    for _ in 0..plan.clients {
        conns.push(Conn::connect(port, stall, &watch).context("connecting to the server")?);
    }
    let _watchdog = (c == KvConfig::Zram && plan.zram_full_stall_s > 0).then(|| {
        ZramWatchdog::start(
            watch.clone(),
            ZRAM_INDEX,
            plan.compressed,
            Duration::from_secs(plan.zram_full_stall_s),
        )
    });
    let pb = progress_bar(plan.max_data, format!("{} {}", spec.name, c.as_str()));
    let mut steps: Vec<Step> = Vec::new();
    let (mut keys, mut bytes) = (0u64, 0u64);
    let mut n_step = 0u64;
    let end = |e: KvError, at: u64, g: &mut Guards| -> anyhow::Result<Stop> {
        let server = g.server.as_mut().expect("server");
        classify(e, at, server, cg, oom_before)
    };
    let stop = loop {
        if bytes >= plan.max_data {
            break Stop {
                kind: "max-data".into(),
                at_data: plan.max_data,
                detail: format!("--max-data {} reached", fmt_size(plan.max_data)),
            };
        }
        n_step += 1;
        let target = (n_step * plan.step).min(plan.max_data);
        let (end_key, end_bytes) = values.end_for(keys, bytes, target);
        pb.set_message(format!("{} {}: SET", spec.name, c.as_str()));
        let t0 = Instant::now();
        let r = set_phase(&mut conns, proto, values, keys..end_key, plan.pipeline, &pb);
        let set_s = t0.elapsed().as_secs_f64();
        if let Err(e) = r {
            break end(e, end_bytes, g)?;
        }
        pb.set_message(format!("{} {}: GET", spec.name, c.as_str()));
        let t1 = Instant::now();
        let seed = plan.seed ^ (n_step << 32) ^ ((c as u64) << 56);
        let r = get_phase(
            &mut conns,
            proto,
            values,
            end_key,
            plan.gets,
            plan.pipeline,
            seed,
        );
        let get_s = t1.elapsed().as_secs_f64();
        if let Err(e) = r {
            break end(e, end_bytes, g)?;
        }
        let st = match proto.stats(&mut ctl) {
            Ok(s) => s,
            Err(e) => break end(e, end_bytes, g)?,
        };
        let n = end_key - keys;
        let b = end_bytes - bytes;
        let step = measure(
            proto,
            &st,
            server_pid,
            cg,
            c == KvConfig::Zram,
            StepCounts {
                data_bytes: end_bytes,
                keys: end_key,
                set_ops: n,
                set_bytes: b,
                set_s,
                gets: plan.gets,
                get_s,
            },
        );
        pb.set_position(end_bytes.min(plan.max_data));
        if !super::progress_enabled() {
            eprintln!(
                "zmem: {} {}: {}: SET {:.0} ops/s, GET {} ops/s, cgroup {}",
                spec.name,
                c.as_str(),
                mib_str(end_bytes),
                step.set_ops_s,
                step.get_ops_s.map_or("-".into(), |v| format!("{v:.0}")),
                step.cgroup_usage.map_or("-".into(), mib_str)
            );
        }
        steps.push(step);
        keys = end_key;
        bytes = end_bytes;
    };
    pb.finish_and_clear();
    Ok((steps, stop, server_pid))
}

struct StepCounts {
    data_bytes: u64,
    keys: u64,
    set_ops: u64,
    set_bytes: u64,
    set_s: f64,
    gets: u64,
    get_s: f64,
}

fn measure(
    proto: &dyn Protocol,
    st: &BTreeMap<String, String>,
    server_pid: Option<u32>,
    cg: &Path,
    zram: bool,
    n: StepCounts,
) -> Step {
    let status = server_pid.and_then(|p| std::fs::read_to_string(format!("/proc/{p}/status")).ok());
    let kib = |name: &str| {
        status.as_ref().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
                .map(|k| k * 1024)
        })
    };
    let stat = memory_stat(cg).unwrap_or_default();
    let cgroup_stat: BTreeMap<String, u64> = ["rss", "cache", "swap", "pgmajfault"]
        .iter()
        .filter_map(|k| Some((k.to_string(), *stat.get(*k)?)))
        .collect();
    let zram = zram
        .then(|| {
            let t = std::fs::read_to_string(format!("/sys/block/zram{ZRAM_INDEX}/mm_stat")).ok()?;
            parse_mm_stat(&t).ok()
        })
        .flatten();
    let server_stats = proto
        .recorded_stats()
        .iter()
        .filter_map(|k| Some((k.to_string(), st.get(*k)?.trim().parse::<u64>().ok()?)))
        .collect();
    let per_s = |ops: u64, s: f64| if s > 0.0 { ops as f64 / s } else { 0.0 };
    let get_bytes = n.gets * ((VALUE_MIN + VALUE_MAX) / 2) as u64;
    Step {
        data_bytes: n.data_bytes,
        keys: n.keys,
        set_ops: n.set_ops,
        set_s: n.set_s,
        set_ops_s: per_s(n.set_ops, n.set_s),
        set_mb_s: per_s(n.set_bytes, n.set_s) / 1e6,
        gets: n.gets,
        get_s: n.get_s,
        get_ops_s: (n.gets > 0).then(|| per_s(n.gets, n.get_s)),
        get_mb_s: (n.gets > 0).then(|| per_s(get_bytes, n.get_s) / 1e6),
        server_rss: kib("VmRSS:"),
        server_swap: kib("VmSwap:"),
        cgroup_usage: read_u64(&cg.join("memory.usage_in_bytes")),
        cgroup_max_usage: read_u64(&cg.join("memory.max_usage_in_bytes")),
        cgroup_stat,
        cgroup_failcnt: read_u64(&cg.join("memory.failcnt")),
        zram,
        server_stats,
    }
}

/// What an error of the load means: the end of the configuration (a [`Stop`]), or an error of
/// the run ([`HardError`], [`Interrupted`]).
fn classify(
    e: KvError,
    at: u64,
    server: &mut Server,
    cg: &Path,
    oom_before: u64,
) -> anyhow::Result<Stop> {
    if aborted() || matches!(e, KvError::Interrupted) {
        return Err(Interrupted.into());
    }
    if e.is_hard() {
        return Err(HardError(e.to_string()).into());
    }
    let stop = |kind: &str, detail: String| Stop {
        kind: kind.into(),
        at_data: at,
        detail,
    };
    if let KvError::Server { reply, .. } = &e {
        let r = reply.to_ascii_lowercase();
        if r.contains("memory") || r.starts_with("-oom") {
            return Ok(stop("out-of-memory", e.to_string()));
        }
        return Err(HardError(e.to_string()).into());
    }
    // The connection failed or stalled: did the server die, and did the OOM killer do it?
    let stuck = matches!(e, KvError::GaveUp | KvError::Stalled(_));
    let status = server.wait_exit(Duration::from_secs(if stuck { 0 } else { 5 }));
    if status.is_some() {
        server.settle_output(Duration::from_secs(1));
    }
    let ooms = oom_kills(cg).saturating_sub(oom_before);
    let last = server.output();
    if ooms > 0 {
        let how = status.map_or("still running".into(), describe_status);
        return Ok(stop(
            "oom-killed",
            format!(
                "the memory cgroup's OOM killer struck {ooms} time(s); the process started {how}"
            ),
        ));
    }
    if let Some(s) = status {
        if server.log().says_out_of_memory() {
            return Ok(stop(
                "out-of-memory",
                format!("the server {}: {last}", describe_status(s)),
            ));
        }
        return Ok(stop(
            "server-died",
            format!(
                "the server {} ({e}); its last output: {last}",
                describe_status(s)
            ),
        ));
    }
    if matches!(e, KvError::GaveUp) {
        return Ok(stop(
            "zram-full",
            "zram reached its mem_limit and the server answered nothing for --zram-full-stall \
             seconds (the kernel reclaims in vain; its OOM killer had not struck yet)"
                .into(),
        ));
    }
    if matches!(e, KvError::Stalled(_)) {
        return Ok(stop("stalled", e.to_string()));
    }
    Ok(stop("connection-failed", e.to_string()))
}

/// The most severe of the errors of the client threads.
fn worst(errs: Vec<KvError>) -> Result<(), KvError> {
    match errs.into_iter().max_by_key(|e| e.rank()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// SETs of keys `range`, split in batches of `pipeline` over the connections.
fn set_phase(
    conns: &mut [Conn],
    proto: &dyn Protocol,
    values: &Values,
    range: std::ops::Range<u64>,
    pipeline: usize,
    pb: &indicatif::ProgressBar,
) -> Result<(), KvError> {
    let next = AtomicU64::new(range.start);
    let failed = AtomicBool::new(false);
    let errs: Vec<KvError> = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .iter_mut()
            .map(|c| {
                let (next, failed) = (&next, &failed);
                let end = range.end;
                s.spawn(move || -> Result<(), KvError> {
                    let (mut out, mut val, mut k, mut line) =
                        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                    loop {
                        if failed.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        if aborted() {
                            return Err(KvError::Interrupted);
                        }
                        let start = next.fetch_add(pipeline as u64, Ordering::Relaxed);
                        if start >= end {
                            return Ok(());
                        }
                        let stop = (start + pipeline as u64).min(end);
                        out.clear();
                        let mut bytes = 0;
                        for i in start..stop {
                            key(i, &mut k);
                            values.fill(i, &mut val);
                            bytes += val.len() as u64;
                            proto.encode_set(&mut out, &k, &val);
                        }
                        let r = c.send(&out).and_then(|()| {
                            for i in start..stop {
                                key(i, &mut k);
                                proto.read_set_reply(c, &k, &mut line)?;
                            }
                            Ok(())
                        });
                        if let Err(e) = r {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        pb.inc(bytes);
                    }
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| match h.join() {
                Ok(r) => r.err(),
                Err(_) => Some(KvError::Protocol {
                    key: "-".into(),
                    detail: "a client thread panicked".into(),
                }),
            })
            .collect()
    });
    worst(errs)
}

/// `gets` GETs of keys drawn uniformly from 0..keys, split over the connections, each value
/// verified.
fn get_phase(
    conns: &mut [Conn],
    proto: &dyn Protocol,
    values: &Values,
    keys: u64,
    gets: u64,
    pipeline: usize,
    seed: u64,
) -> Result<(), KvError> {
    if gets == 0 || keys == 0 {
        return Ok(());
    }
    let failed = AtomicBool::new(false);
    let n = conns.len() as u64;
    let errs: Vec<KvError> = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .iter_mut()
            .enumerate()
            .map(|(t, c)| {
                let failed = &failed;
                let mine = gets / n + u64::from((t as u64) < gets % n);
                s.spawn(move || -> Result<(), KvError> {
                    let mut rng = StdRng::seed_from_u64(mix(seed ^ t as u64));
                    let (mut out, mut buf, mut k, mut line) =
                        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
                    let mut batch: Vec<u64> = Vec::with_capacity(pipeline);
                    let mut done = 0;
                    while done < mine {
                        if failed.load(Ordering::Relaxed) {
                            return Ok(());
                        }
                        if aborted() {
                            return Err(KvError::Interrupted);
                        }
                        let m = (mine - done).min(pipeline as u64);
                        batch.clear();
                        out.clear();
                        for _ in 0..m {
                            let i = rng.random_range(0..keys);
                            batch.push(i);
                            key(i, &mut k);
                            proto.encode_get(&mut out, &k);
                        }
                        let r = c.send(&out).and_then(|()| {
                            for &i in &batch {
                                key(i, &mut k);
                                if !proto.read_get_reply(c, &k, &mut line, &mut buf)? {
                                    return Err(KvError::Missing { key: key_string(i) });
                                }
                                if let Some(detail) = values.check(i, &buf) {
                                    return Err(KvError::Mismatch {
                                        key: key_string(i),
                                        detail,
                                    });
                                }
                            }
                            Ok(())
                        });
                        if let Err(e) = r {
                            failed.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                        done += m;
                    }
                    Ok(())
                })
            })
            .collect();
        handles
            .into_iter()
            .filter_map(|h| match h.join() {
                Ok(r) => r.err(),
                Err(_) => Some(KvError::Protocol {
                    key: "-".into(),
                    detail: "a client thread panicked".into(),
                }),
            })
            .collect()
    });
    worst(errs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus() -> Corpus {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        Corpus::from_bytes("t", data).unwrap()
    }

    #[test]
    fn values_are_deterministic_and_checkable() {
        let c = corpus();
        let v = Values::new(&c, 1);
        let mut a = Vec::new();
        let mut lens = std::collections::HashSet::new();
        for i in 0..1000 {
            v.fill(i, &mut a);
            assert!((VALUE_MIN..=VALUE_MAX).contains(&a.len()));
            assert_eq!(v.check(i, &a), None);
            lens.insert(a.len());
        }
        assert!(lens.len() > 50, "lengths vary: {}", lens.len());
        v.fill(5, &mut a);
        a[17] ^= 1;
        assert!(v.check(5, &a).unwrap().contains("byte 17"));
        a.pop();
        assert!(v.check(5, &a).unwrap().contains("expected"));
        let w = Values::new(&c, 2);
        assert_ne!(v.offset(3), w.offset(3));
    }

    #[test]
    fn end_for_reaches_the_target() {
        let c = corpus();
        let v = Values::new(&c, 1);
        let (k, b) = v.end_for(0, 0, 1 << 20);
        assert!(b >= 1 << 20 && b < (1 << 20) + VALUE_MAX as u64);
        let sum: u64 = (0..k).map(|i| v.len(i) as u64).sum();
        assert_eq!(sum, b);
        let (k2, b2) = v.end_for(k, b, 2 << 20);
        assert!(k2 > k && b2 >= 2 << 20);
        assert_eq!(v.end_for(k, b, b), (k, b));
    }

    #[test]
    fn versions_are_short() {
        assert_eq!(
            short_version("Redis server v=7.0.15 sha=00000000:0 malloc=jemalloc-5.3.0 bits=64"),
            "7.0.15"
        );
        assert_eq!(short_version("memcached 1.6.18"), "1.6.18");
        assert_eq!(short_version("odd"), "odd");
    }

    #[test]
    fn keys_have_a_fixed_width() {
        let mut k = Vec::new();
        key(42, &mut k);
        assert_eq!(k, b"key:000000000042");
    }
}
