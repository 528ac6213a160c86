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
//!   DRAM is the same as zram's;
//! - `swapfile` (issue 13, asked for with `--configs`): `--limit` with a swap file of
//!   `--ssd-size` on the file system of `--ssd-dir` as the only swap the run adds (highest
//!   priority), created, swapped off and deleted by the run
//!   ([`crate::kernel::swapfile::SwapFile`]);
//! - `zmem-ssd`: the server under `zmem run --ssd DIR --ssd-size S --resident R --store-limit P`
//!   in a cgroup of `--limit` without kernel swap, R + P + `--margin` = `--limit` (P =
//!   `--ssd-store-limit`, default a quarter of `--limit`): the same DRAM as `swapfile`, the log
//!   encrypted (zmem's default) on the same file system.
//!
//! Each configuration ends when the server dies (the data size of the last step fully loaded and
//! verified is its "data at OOM"), when a connection fails, or at `--max-data`. The machine is
//! restored as found by guards, on success, on error and after Ctrl-C alike: the server is
//! stopped by the pid this process started (SIGTERM, then SIGKILL, always reaped; what is left
//! in its cgroup is killed by pid too), the cgroup removed, swap turned off, zram0 reset, the
//! swap file deleted, zmem's log directory removed.
//!
//! The protocol clients are small hand-written ones over `TcpStream` ([`super::redis`] speaks
//! RESP, [`super::memcached`] the memcached text protocol), pipelined. Submodules: `client`
//! (connections, the [`Protocol`] trait), `server` (the server process and the helpers beside
//! it), `report` (results, tables, chart).

pub mod client;
pub mod load;
pub mod plan;
pub mod report;
pub mod run;
pub mod server;
pub mod setup;
pub mod values;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use crate::target::POLICIES;
use zmem_runenv::size::parse_size;

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
/// Issue 13: memcached at 4x its DRAM limit, GET/s zmem-ssd / kernel swap file.
pub const TARGET_GET_SSD_VS_SWAPFILE: f64 = 1.5;
/// Where the SSD configurations put their swap file or log by default.
pub const DEFAULT_SSD_DIR: &str = "/var/tmp";

/// The configurations.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum KvConfig {
    /// A memory cgroup limit, no swap: the server is OOM-killed.
    Noswap,
    /// The same limit with /dev/zram0 as swap (zram's mem_limit = --compressed).
    Zram,
    /// The server under `zmem run` in a cgroup of --limit + --compressed.
    Zmem,
    /// The same limit with a swap file of --ssd-size in --ssd-dir as swap.
    Swapfile,
    /// The server under `zmem run --ssd` (its log in --ssd-dir) in a cgroup of --limit: the
    /// same DRAM as swapfile, no kernel swap.
    ZmemSsd,
}

impl KvConfig {
    pub fn as_str(self) -> &'static str {
        match self {
            KvConfig::Noswap => "noswap",
            KvConfig::Zram => "zram",
            KvConfig::Zmem => "zmem",
            KvConfig::Swapfile => "swapfile",
            KvConfig::ZmemSsd => "zmem-ssd",
        }
    }

    /// Whether the server runs under `zmem run`.
    pub fn is_zmem(self) -> bool {
        matches!(self, KvConfig::Zmem | KvConfig::ZmemSsd)
    }

    /// Whether it needs `--ssd-dir` (a swap file or zmem's log there).
    pub fn is_ssd(self) -> bool {
        matches!(self, KvConfig::Swapfile | KvConfig::ZmemSsd)
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
    /// Configurations to run, in this order, comma separated; the SSD tier's (issue 13):
    /// swapfile,zmem-ssd.
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
    /// resident budget is --limit minus this (zmem-ssd: minus --ssd-store-limit too).
    #[arg(long, value_parser = parse_size, default_value = "48M")]
    pub margin: u64,
    /// zmem: compression policy passed to `zmem run` [default: zmem run's].
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(POLICIES))]
    pub policy: Option<String>,
    /// zmem: who serves the server's page faults, passed to `zmem run` (auto, handler or
    /// signal) [default: zmem run's].
    #[arg(long, value_parser = clap::builder::PossibleValuesParser::new(crate::RUN_FAULT_ROUTES))]
    pub fault_route: Option<String>,
    /// zmem: virtual size of the heap region [default: 2 x --max-data + 256M].
    #[arg(long, value_parser = parse_size)]
    pub zmem_size: Option<u64>,
    /// swapfile, zmem-ssd: the directory of the swap file and of zmem's log (a disk file system
    /// such as ext4 or xfs; not tmpfs or btrfs).
    #[arg(long, value_name = "DIR", default_value = DEFAULT_SSD_DIR)]
    pub ssd_dir: PathBuf,
    /// swapfile, zmem-ssd: the swap file's size and zmem's --ssd-size [default: --max-data + 1G].
    #[arg(long, value_parser = parse_size)]
    pub ssd_size: Option<u64>,
    /// zmem-ssd: zmem's --store-limit, the DRAM of its compressed pool inside --limit; the
    /// resident heap gets --limit minus this minus --margin [default: --limit / 4].
    #[arg(long, value_parser = parse_size)]
    pub ssd_store_limit: Option<u64>,
    /// zmem-ssd: `zmem run --ssd-read-ahead` (most pages one log read brings; 1: none)
    /// [default: zmem run's].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=zmem_runenv::MAX_SSD_READ_AHEAD as u64))]
    pub ssd_read_ahead: Option<u64>,
    /// zmem-ssd: pass --ssd-no-encrypt to `zmem run` (the log is encrypted by default).
    #[arg(long)]
    pub ssd_no_encrypt: bool,
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
