//! `zmem demo`: the savings on the Calgary corpus in a few seconds. For each policy it writes
//! `--size` bytes of the corpus into a zmem page store, reads every page back and checks it,
//! and prints what the data would take in DRAM against what zmem holds.

use std::path::PathBuf;

use clap::Args;

use zmem_bench::abort::install_abort_handler;
use zmem_bench::corpus::Corpus;
use zmem_bench::default_corpus;
use zmem_bench::pages::{self, PagesSpec, Rw};
use zmem_bench::zmem_target::{self, ZmemTargetConfig};

use crate::size::{format_mib_1 as mib, format_size as fmt_size, parse_size};

/// What the demo shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoWhat {
    /// The page store: each policy's savings on the corpus.
    Store,
    /// `zmem run` on a real program: redis-server holding several times its DRAM budget.
    Redis,
}

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// `store` (default) or `redis`.
    #[arg(value_enum, default_value = "store")]
    pub what: DemoWhat,
    /// DRAM budget of redis's heap in `zmem demo redis`.
    #[arg(long, value_parser = parse_size, default_value = "32M")]
    pub resident: u64,
    /// Compression policy of redis's heap in `zmem demo redis`.
    #[arg(long, default_value = "balanced", value_parser = zmem_bench::POLICIES)]
    pub policy: String,
    /// Bytes of corpus data to store per policy, or in redis (k, m, g suffixes).
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub size: u64,
    /// Corpus directory [default: ../shared/corpora/calgary or /work/shared/corpora/calgary]
    #[arg(long)]
    pub corpus: Option<PathBuf>,
}

pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    let corpus = Corpus::load(&args.corpus.clone().unwrap_or_else(default_corpus))?;
    if args.what == DemoWhat::Redis {
        return crate::demo_redis::run(&corpus, args.resident, args.size, &args.policy);
    }
    install_abort_handler();
    let spec = PagesSpec {
        rw: Rw::Write,
        bs: 64 * 1024,
        jobs: 1,
        size: args.size,
        verify: true,
    };
    spec.validate()?;
    println!(
        "zmem demo: {} of {} ({} files) per policy, every page read back and checked\n",
        fmt_size(args.size),
        corpus.dir().display(),
        corpus.files().len()
    );
    println!(
        "{:<9} {:>11} {:>11} {:>11} {:>7} {:>7} {:>11}",
        "policy", "data", "compressed", "mem used", "ratio", "saved", "write MiB/s"
    );
    for policy in ["fast", "balanced", "max", "auto"] {
        let target = zmem_target::open(&ZmemTargetConfig {
            size: args.size,
            policy: policy.into(),
            block: None,
            mem_limit: None,
        })?;
        let r = pages::run(target.as_ref(), &corpus, &spec)?;
        pages::verify_contents(target.as_ref(), &corpus, &spec)?;
        let m = target.memory()?;
        println!(
            "{:<9} {:>11} {:>11} {:>11} {:>7.2} {:>6.1}% {:>11.0}",
            policy,
            mib(m.orig_data_size),
            mib(m.compr_data_size),
            mib(m.mem_used_total),
            m.orig_data_size as f64 / m.mem_used_total.max(1) as f64,
            100.0 * (1.0 - m.mem_used_total as f64 / m.orig_data_size.max(1) as f64),
            r.mib_s
        );
    }
    println!(
        "\n`auto` writes with lz4 and recompresses pages idle for a second in the background;\n\
         the kernel's zram side by side: `zmem bench compare` (as root)."
    );
    Ok(())
}
