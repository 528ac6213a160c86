//! `zmem demo`: what zmem saves, on a machine with nothing installed. The default demo runs a
//! key-value program that ships inside the `zmem` binary (`zmem demo-worker`, see
//! [`crate::demo_worker`]) under `zmem run`, so it exercises the whole path a user's program
//! takes (LD_PRELOAD, userfaultfd, eviction, compression, faults) on data generated in place,
//! checks every value, and prints the DRAM it took against the data it held. `zmem demo redis`
//! does the same with Debian's redis-server; `zmem demo store` shows the page store alone on the
//! Calgary corpus (a checkout's ../shared).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use zmem_bench::corpus::Corpus;
use zmem_bench::default_corpus;

use crate::demo_worker::{WorkerResult, TAG};
use crate::size::{format_size_approx as human, parse_size};
use crate::stat::{query, table};

/// What the demo shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoWhat {
    /// A key-value program built into zmem, under `zmem run` (needs nothing installed).
    Kv,
    /// The page store: each policy's savings on the Calgary corpus (needs the corpus).
    Store,
    /// `zmem run` on a real program: redis-server holding several times its DRAM budget.
    Redis,
}

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// `kv` (default: built in), `store` (page store on the corpus) or `redis`.
    #[arg(value_enum, default_value = "kv")]
    pub what: DemoWhat,
    /// DRAM budget of the program's heap (`kv`, `redis`).
    #[arg(long, value_parser = parse_size, default_value = "32M")]
    pub resident: u64,
    /// Compression policy of the program's heap (`kv`, `redis`).
    #[arg(long, default_value = "balanced", value_parser = zmem_bench::POLICIES)]
    pub policy: String,
    /// Bytes of data the program stores (`kv`, `redis`), or per policy (`store`).
    #[arg(long, value_parser = parse_size, default_value = "256M")]
    pub size: u64,
    /// Corpus directory of `store` and `redis` [default: ../shared/corpora/calgary or
    /// /work/shared/corpora/calgary]
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Corrupt this key's value in the program before its final check (tests the check).
    #[arg(long, hide = true)]
    pub corrupt_key: Option<u64>,
}

pub fn run(args: &DemoArgs) -> anyhow::Result<()> {
    if args.what == DemoWhat::Kv {
        return kv(args);
    }
    let dir = args.corpus.clone().unwrap_or_else(default_corpus);
    let corpus = Corpus::load(&dir).with_context(|| {
        format!(
            "`zmem demo {}` reads the Calgary corpus of a zmem checkout (../shared/corpora/calgary); \
             pass --corpus DIR, or run `zmem demo`, which needs nothing installed",
            if args.what == DemoWhat::Store { "store" } else { "redis" }
        )
    })?;
    match args.what {
        DemoWhat::Redis => crate::demo_redis::run(&corpus, args.resident, args.size, &args.policy),
        _ => crate::demo_store::run(&corpus, args.size),
    }
}

fn bar(phase: &str, total: u64) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let bytes = phase == "fill";
    let template = if bytes {
        "{msg:>8} [{bar:40}] {bytes}/{total_bytes} {elapsed}"
    } else {
        "{msg:>8} [{bar:40}] {pos}/{len} {elapsed}"
    };
    if let Ok(style) = ProgressStyle::with_template(template) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(phase.to_string());
    pb
}

/// The built-in demo: `zmem run ... -- zmem demo-worker`, its live statistics when all the data
/// is in, and the savings.
fn kv(args: &DemoArgs) -> anyhow::Result<()> {
    if args.size < (1 << 20) {
        bail!("--size {} is too small: at least 1M", human(args.size));
    }
    let exe = std::env::current_exe().context("finding the zmem executable")?;
    let dir = tempfile::tempdir()?;
    let stats = dir.path().join("run.json");
    println!(
        "$ zmem run --resident {} --policy {} -- zmem demo-worker --size {}",
        human(args.resident),
        args.policy,
        human(args.size)
    );
    println!(
        "a key-value program built into zmem stores {} of generated JSON log records in a HashMap of \
         heap values, updates an eighth of them, reads them Zipf-skewed and checks every one",
        human(args.size)
    );
    let mut cmd = Command::new(&exe);
    cmd.args(["run", "--resident", &args.resident.to_string()])
        .args(["--policy", &args.policy, "--stats"])
        .arg(&stats)
        .arg("--")
        .arg(&exe)
        .args([
            "demo-worker",
            "--pause-for-stat",
            "--size",
            &args.size.to_string(),
        ]);
    if let Some(k) = args.corrupt_key {
        cmd.args(["--corrupt-key", &k.to_string()]);
    }
    let started = Instant::now();
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting zmem run")?;
    let mut stdin = child.stdin.take().context("worker stdin")?;
    let stdout = BufReader::new(child.stdout.take().context("worker stdout")?);
    let (mut pb, mut sample, mut result) = (None::<ProgressBar>, None, None::<WorkerResult>);
    for line in stdout.lines() {
        let line = line?;
        let Some(rest) = line.strip_prefix(TAG).map(str::trim_start) else {
            println!("{line}");
            continue;
        };
        let (word, arg) = rest.split_once(' ').unwrap_or((rest, ""));
        match word {
            "phase" => {
                if let Some(p) = pb.take() {
                    p.finish();
                }
                let mut it = arg.split_whitespace();
                let (name, total) = (it.next().unwrap_or("?"), it.next().unwrap_or("0"));
                pb = Some(bar(name, total.parse().unwrap_or(0)));
            }
            "progress" => {
                if let (Some(p), Ok(n)) = (&pb, arg.parse()) {
                    p.set_position(n);
                }
            }
            "ready" => {
                if let Some(p) = pb.take() {
                    p.finish();
                }
                let pid: u32 = arg.trim().parse().context("worker pid")?;
                match query(&zmem_runenv::socket_dir_from_env(), pid) {
                    Ok(s) => {
                        println!(
                            "\n$ zmem stat {pid}    (all values stored, before the final check)"
                        );
                        print!("{}", table(&[&s]));
                        sample = Some(s);
                    }
                    Err(e) => eprintln!("zmem: could not read the worker's statistics: {e}"),
                }
                // The worker goes on to its check.
                let _ = writeln!(stdin, "go");
            }
            "result" => result = Some(serde_json::from_str(arg).context("the worker's result")?),
            _ => println!("{line}"),
        }
    }
    if let Some(p) = pb.take() {
        p.finish();
    }
    drop(stdin);
    let status = child.wait()?;
    let wall = started.elapsed().as_secs_f64();
    if !status.success() {
        bail!(
            "the demo program failed ({status}); its error is above{}",
            if status.code() == Some(1) && result.is_none() && sample.is_none() {
                ". If zmem could not start, `zmem doctor` says what this machine lacks"
            } else {
                ""
            }
        );
    }
    let r = result.context("the demo program ended without its result")?;
    println!(
        "\nstored {} values ({}) in {:.1} s, updated {} in {:.1} s, {} Zipf-skewed reads in {:.1} s, \
         checked all {} in {:.1} s: every value correct",
        r.keys,
        human(r.value_bytes),
        r.fill_s,
        r.updated,
        r.update_s,
        r.reads,
        r.read_s,
        r.verified,
        r.verify_s
    );
    // The sample taken while all the data was in; failing that, zmem run's peak figures.
    let (dram, parts, heap) = match &sample {
        Some(s) => (
            s.resident() + s.mem_used_total(),
            format!(
                "{} resident + {} compressed pool",
                human(s.resident()),
                human(s.mem_used_total())
            ),
            s.data(),
        ),
        None => {
            let report: zmem_runenv::report::RunReport =
                serde_json::from_slice(&std::fs::read(&stats)?)
                    .context("no statistics of the running program")?;
            let parts = "peak of resident + compressed pool, from zmem run".to_string();
            (report.peak_dram, parts, report.peak_data)
        }
    };
    println!(
        "data held {}, DRAM used {} ({parts}), ratio {:.2}x, time {wall:.1} s",
        human(r.value_bytes),
        human(dram),
        r.value_bytes as f64 / dram.max(1) as f64
    );
    println!(
        "without zmem the program would need about {} of DRAM for its heap; a --resident budget \
         caps the uncompressed part, the rest is compressed ({} policy) and comes back on a touch",
        human(heap),
        args.policy
    );
    Ok(())
}
