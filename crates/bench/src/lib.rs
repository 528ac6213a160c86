//! `zmem bench`: the benchmarks, each measured side by side with the kernel's zram, and what
//! they share.
//!
//! Shared modules (they import nothing from the benchmarks): [`abort`] (Ctrl-C as a flag),
//! [`target`] (what the page benchmark drives), [`corpus`], [`report`] (JSON, tables, progress),
//! [`process`] (child processes and scratch directories cleaned up on drop) and [`kernel`] (zram,
//! swap and memory cgroup guards). The zipf sampler and the seeded generators are the
//! zmem-workload crate, shared with the region's policy simulator.
//!
//! Benchmarks: [`pages`] (with its targets [`blockdev`] and [`zmem_target`]), [`compare`],
//! [`codecs`], [`heaps`], [`region`], [`adaptive`], [`kv`] (with [`redis`] and [`memcached`]), [`programs`],
//! [`ssd`].

pub mod abort;
pub mod corpus;
pub mod kernel;
pub mod process;
pub mod report;
pub mod target;

pub mod adaptive;
pub mod blockdev;
pub mod codecs;
pub mod compare;
pub mod heaps;
pub mod kv;
pub mod memcached;
pub mod offload;
pub mod pages;
pub mod programs;
pub mod redis;
pub mod region;
pub mod ssd;
pub mod zmem_target;

use clap::Subcommand;

pub use corpus::{default_corpus, DEFAULT_CORPORA};
pub use target::POLICIES;

/// `zmem run --fault-route` values, for the benchmarks that pass one through.
pub const RUN_FAULT_ROUTES: [&str; 3] = ["auto", "handler", "signal"];

/// `zmem bench ...`.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// fio-like page benchmark on one target (zmem or a block device such as /dev/zram0).
    Pages(pages::PagesArgs),
    /// The page matrix on zram (lz4, lzo-rle) and zmem (each policy), side by side.
    Compare(compare::CompareArgs),
    /// Codecs on corpus blocks.
    Codecs(codecs::CodecsArgs),
    /// A working set larger than its DRAM budget, accessed from threads: a zmem region beside
    /// the kernel (cgroup limit, zram swap) with --kernel-zram.
    Region(Box<region::RegionArgs>),
    /// The kernel side's worker process of `bench region` (internal).
    #[command(name = "region-worker", hide = true)]
    RegionWorker(region::RegionWorkerArgs),
    /// An adaptive budget at work: another process takes memory away and gives it back while
    /// a region is accessed; a timeline of the budget, resident bytes and MemAvailable.
    Adaptive(Box<adaptive::AdaptiveArgs>),
    /// The memory hog of `bench adaptive` (internal).
    #[command(hide = true)]
    Hog(adaptive::hog::HogArgs),
    /// Redis loaded with corpus values until it runs out of memory: no swap, kernel zram swap
    /// and `zmem run` under the same memory limit, side by side (QZRAM's Redis experiment).
    Redis(Box<kv::KvArgs>),
    /// The same experiment on memcached.
    Memcached(Box<kv::KvArgs>),
    /// Compression ratios on real heaps: redis, Python, Node and a JVM loaded with real data,
    /// their anonymous pages captured, written to zram and to zmem (every policy, `auto` also
    /// settled) beside the bare codecs on the same pages.
    Heaps(Box<heaps::HeapsArgs>),
    /// Real programs (sqlite3, sort, jq, xz, gcc, python3) plain, under `zmem run --resident B`
    /// and under the kernel (cgroup limit B, zram swap): outputs checked identical, times and
    /// major faults side by side.
    Programs(Box<programs::ProgramsArgs>),
    /// HMM_alloc's experiments on zmem's SSD tier beside the kernel's swap file on the same
    /// disk, at the same DRAM: random access to 256 B-4 KiB objects (read-only, write-only,
    /// 80:20) and a bloom filter, each several times larger than DRAM (root).
    Ssd(Box<ssd::SsdArgs>),
    /// The worker of `bench ssd`: one workload in this process, one JSON line (internal).
    #[command(name = "ssd-worker", hide = true)]
    SsdWorker(Box<ssd::SsdWorkerArgs>),
}

impl BenchCommand {
    /// Runs the benchmark.
    pub fn run(self) -> anyhow::Result<()> {
        match self {
            BenchCommand::Pages(a) => pages::run_command(&a),
            BenchCommand::Compare(a) => compare::run(&a),
            BenchCommand::Codecs(a) => codecs::run(&a),
            BenchCommand::Region(a) => region::run::run(&a),
            BenchCommand::RegionWorker(a) => region::worker::worker_main(&a),
            BenchCommand::Adaptive(a) => adaptive::run::run(&a),
            BenchCommand::Hog(a) => adaptive::hog::hog_main(&a),
            BenchCommand::Redis(a) => redis::run(&a),
            BenchCommand::Memcached(a) => memcached::run(&a),
            BenchCommand::Programs(a) => programs::run::run(&a),
            BenchCommand::Heaps(a) => heaps::run(&a),
            BenchCommand::Ssd(a) => ssd::run::run(&a),
            BenchCommand::SsdWorker(a) => ssd::worker::worker_main(&a),
        }
    }
}
