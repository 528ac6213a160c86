//! The command line (clap derive) and its dispatch.

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::{Args, Parser, Subcommand};

use crate::bench::blockdev::{zram_index, BlockDevError, BlockDevTarget};
use crate::bench::corpus::Corpus;
use crate::bench::pages::{self, PagesResult, PagesSpec, Rw};
use crate::bench::zmem_target::{self, ZmemTargetConfig};
use crate::bench::zram::ZramSession;
use crate::bench::{self, MachineInfo};
use crate::size::{parse_size, parse_size_usize};

/// zmem policy names.
pub const POLICIES: [&str; 4] = ["fast", "balanced", "max", "auto"];

/// Corpus directories tried in order when --corpus is not given.
pub const DEFAULT_CORPORA: [&str; 2] =
    ["../shared/corpora/calgary", "/work/shared/corpora/calgary"];

/// The first of [`DEFAULT_CORPORA`] that exists (the first one if none does, so the error names it).
pub fn default_corpus() -> PathBuf {
    DEFAULT_CORPORA
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from(DEFAULT_CORPORA[0]))
}

#[derive(Debug, Parser)]
#[command(
    name = "zmem",
    version,
    about = "User-space memory compression (zram as a library): benchmarks side by side with the kernel's zram"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Shows what zmem saves: a key-value program built into zmem under `zmem run` (needs
    /// nothing installed); `zmem demo redis` on redis-server, `zmem demo store` on the corpus.
    Demo(crate::demo::DemoArgs),
    /// The program of `zmem demo` (internal).
    #[command(name = "demo-worker", hide = true)]
    DemoWorker(crate::demo_worker::WorkerArgs),
    /// Checks what `zmem run` and the benchmarks need on this machine, and how to fix what is
    /// missing; exit status 1 when `zmem run` cannot work here.
    Doctor(crate::doctor::DoctorArgs),
    /// Runs an unmodified program with its heap compressed: `zmem run --resident 2G -- PROGRAM
    /// ARGS...`; prints a summary when it exits.
    Run(crate::run::RunArgs),
    /// A running program's live statistics (zmem stat PID), every zmem process of this user
    /// (--all), or Prometheus text (--prometheus).
    Stat(crate::stat::StatArgs),
    /// Benchmarks, measured side by side with the kernel's zram.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// fio-like page benchmark on one target (zmem or a block device such as /dev/zram0).
    Pages(PagesArgs),
    /// The page matrix on zram (lz4, lzo-rle) and zmem (each policy), side by side.
    Compare(CompareArgs),
    /// Codecs on corpus blocks.
    Codecs(CodecsArgs),
    /// A working set larger than its DRAM budget, accessed from threads: a zmem region beside
    /// the kernel (cgroup limit, zram swap) with --kernel-zram.
    Region(Box<crate::bench::region::RegionArgs>),
    /// The kernel side's worker process of `bench region` (internal).
    #[command(name = "region-worker", hide = true)]
    RegionWorker(crate::bench::region::RegionWorkerArgs),
    /// An adaptive budget at work: another process takes memory away and gives it back while
    /// a region is accessed; a timeline of the budget, resident bytes and MemAvailable.
    Adaptive(Box<crate::bench::adaptive::AdaptiveArgs>),
    /// The memory hog of `bench adaptive` (internal).
    #[command(hide = true)]
    Hog(crate::bench::adaptive::HogArgs),
    /// Redis loaded with corpus values until it runs out of memory: no swap, kernel zram swap
    /// and `zmem run` under the same memory limit, side by side (QZRAM's Redis experiment).
    Redis(Box<crate::bench::kv::KvArgs>),
    /// The same experiment on memcached.
    Memcached(Box<crate::bench::kv::KvArgs>),
}

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
}

#[derive(Debug, Clone, Args, serde::Serialize)]
pub struct CompareArgs {
    /// Corpus directory [default: ../shared/corpora/calgary or /work/shared/corpora/calgary].
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Bytes per run (k, m, g suffixes), a multiple of 128k.
    #[arg(long, value_parser = parse_size, default_value = "512M")]
    pub size: u64,
    /// JSON output.
    #[arg(long, default_value = "bench-out/compare.json")]
    pub json: PathBuf,
    /// SVG chart output.
    #[arg(long, default_value = "bench-out/compare.svg")]
    pub plot: PathBuf,
    /// zmem policies to run, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "fast,balanced,max,auto",
          value_parser = clap::builder::PossibleValuesParser::new(POLICIES))]
    pub policies: Vec<String>,
    /// zram algorithms to run, comma separated (the first is the reference of the ratio columns).
    #[arg(long, value_delimiter = ',', default_value = "lz4,lzo-rle")]
    pub zram_algs: Vec<String>,
    /// zmem multi-page block bytes.
    #[arg(long, value_parser = parse_size_usize)]
    pub block: Option<usize>,
    /// Do not compare reads with the corpus.
    #[arg(long)]
    pub no_verify: bool,
}

#[derive(Debug, Clone, Args)]
pub struct CodecsArgs {
    /// Corpus directory.
    #[arg(long, default_value = "../shared/corpora/calgary")]
    pub corpus: PathBuf,
    /// Block sizes, comma separated.
    #[arg(long, value_delimiter = ',', value_parser = parse_size_usize, default_value = "4k,8k,16k,32k,64k")]
    pub block: Vec<usize>,
    /// JSON output.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs a parsed command line.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Demo(a) => crate::demo::run(&a),
        Command::DemoWorker(a) => {
            if let Err(e) = crate::demo_worker::run(&a) {
                // Status 1 and the message on stderr, which `zmem demo` passes on.
                eprintln!("zmem demo-worker: error: {e:#}");
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Doctor(a) => std::process::exit(crate::doctor::run(&a)?),
        Command::Run(a) => match crate::run::run(&a) {
            Ok(code) => std::process::exit(code),
            Err(e) => {
                eprintln!("zmem: error: {e}");
                std::process::exit(e.exit_code());
            }
        },
        Command::Stat(a) => crate::stat::run(&a),
        Command::Bench(BenchCommand::Pages(a)) => bench_pages(&a),
        Command::Bench(BenchCommand::Compare(a)) => bench::compare::run(&a),
        Command::Bench(BenchCommand::Codecs(a)) => bench::codecs::run(&a),
        Command::Bench(BenchCommand::Region(a)) => bench::region::run(&a),
        Command::Bench(BenchCommand::RegionWorker(a)) => bench::cgroup::worker_main(&a),
        Command::Bench(BenchCommand::Adaptive(a)) => bench::adaptive::run(&a),
        Command::Bench(BenchCommand::Hog(a)) => bench::adaptive::hog_main(&a),
        Command::Bench(BenchCommand::Redis(a)) => bench::redis::run(&a),
        Command::Bench(BenchCommand::Memcached(a)) => bench::memcached::run(&a),
    }
}

fn bench_pages(args: &PagesArgs) -> anyhow::Result<()> {
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
    bench::install_abort_handler();

    let result = if args.target == "zmem" {
        let target = zmem_target::open(&ZmemTargetConfig {
            size: spec.size,
            policy: args.policy.clone(),
            block: args.block,
            mem_limit: args.mem_limit,
        })?;
        pages::run(target.as_ref(), &corpus, &spec)?
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
            pages::run(&target, corpus, spec)
        }
        None => {
            let target = BlockDevTarget::open(path)?;
            pages::run(&target, corpus, spec)
        }
    }
}

/// The corpus as recorded in JSON.
pub fn corpus_info(corpus: &Corpus) -> serde_json::Value {
    serde_json::json!({
        "dir": corpus.dir().display().to_string(),
        "bytes": corpus.len(),
        "files": corpus.files().len(),
    })
}

/// Writes pretty JSON to `path` (through path.json.tmp and a rename), creating parent folders.
pub fn write_json(path: &Path, value: &serde_json::Value) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let tmp = PathBuf::from(format!("{}.tmp", path.display()));
    let text = serde_json::to_string_pretty(value)?;
    std::fs::write(&tmp, text + "\n").with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    Ok(())
}
