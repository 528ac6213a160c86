//! `zmem demo store`: the page store's savings on the Calgary corpus in a few seconds (it needs
//! the corpus, which only a checkout with ../shared has). For each policy it writes
//! `--size` bytes of the corpus into a zmem page store, reads every page back and checks it,
//! and prints what the data would take in DRAM against what zmem holds.

use zmem_bench::abort::install_abort_handler;
use zmem_bench::corpus::Corpus;
use zmem_bench::pages::{self, PagesSpec, Rw};
use zmem_bench::zmem_target::{self, ZmemTargetConfig};

use crate::size::{format_mib_1 as mib, format_size as fmt_size};

/// Runs the page-store demo on `corpus`, `size` bytes per policy.
pub fn run(corpus: &Corpus, size: u64) -> anyhow::Result<()> {
    install_abort_handler();
    let spec = PagesSpec {
        rw: Rw::Write,
        bs: 64 * 1024,
        jobs: 1,
        size,
        verify: true,
    };
    spec.validate()?;
    println!(
        "zmem demo store: {} of {} ({} files) per policy, every page read back and checked\n",
        fmt_size(size),
        corpus.dir().display(),
        corpus.files().len()
    );
    println!(
        "{:<9} {:>11} {:>11} {:>11} {:>7} {:>7} {:>11}",
        "policy", "data", "compressed", "mem used", "ratio", "saved", "write MiB/s"
    );
    for policy in ["fast", "balanced", "max", "auto"] {
        let target = zmem_target::open(&ZmemTargetConfig {
            size,
            policy: policy.into(),
            block: None,
            mem_limit: None,
            backend: zmem_bench::offload::BackendKind::Cpu,
        })?;
        let r = pages::run(target.as_ref(), corpus, &spec)?;
        pages::verify_contents(target.as_ref(), corpus, &spec)?;
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
