//! `zmem bench compare`: the page matrix on the kernel's zram and on zmem, side by side, in one
//! run: a table, a JSON file and an SVG chart.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use serde::Serialize;

use crate::blockdev::BlockDevTarget;
use crate::corpus::{default_corpus, Corpus};
use crate::kernel::zram::ZramSession;
use crate::pages::{self, PagesResult, PagesSpec, Rw};
use crate::report::{
    corpus_info, draw_grouped_bars, finish_chart, text_table, write_json, MachineInfo, SlotAxis,
};
use crate::target::POLICIES;
use crate::zmem_target::{self, ZmemTargetConfig};
use clap::Args;
use std::path::PathBuf;
use zmem_runenv::size::{format_size, parse_size, parse_size_usize};

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

/// Block sizes, jobs and patterns of the matrix, in row order.
pub const MATRIX_BS: [usize; 2] = [4096, 65536];
pub const MATRIX_JOBS: [usize; 2] = [1, 2];
pub const MATRIX_RW: [Rw; 3] = [Rw::Write, Rw::Read, Rw::RandRead];

/// The matrix bs x jobs x rw for `size` bytes, in row order.
pub fn matrix(size: u64, verify: bool) -> Vec<PagesSpec> {
    let mut v = Vec::new();
    for bs in MATRIX_BS {
        for jobs in MATRIX_JOBS {
            for rw in MATRIX_RW {
                v.push(PagesSpec {
                    rw,
                    bs,
                    jobs,
                    size,
                    verify,
                });
            }
        }
    }
    v
}

/// One measured cell of one target.
#[derive(Clone, Debug, Serialize)]
pub struct Entry {
    /// Column label: "zram-lz4", "zmem-balanced".
    pub label: String,
    /// "zram" or "zmem".
    pub kind: &'static str,
    /// zram algorithm or zmem policy.
    pub variant: String,
    pub cell: String,
    pub result: PagesResult,
}

/// A target that was not run, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    pub label: String,
    pub reason: String,
}

#[derive(Debug, Default, Serialize)]
pub struct Comparison {
    pub labels: Vec<String>,
    pub entries: Vec<Entry>,
    pub skipped: Vec<Skipped>,
}

impl Comparison {
    fn get(&self, label: &str, cell: &str) -> Option<&PagesResult> {
        self.entries
            .iter()
            .find(|e| e.label == label && e.cell == cell)
            .map(|e| &e.result)
    }

    fn push(&mut self, e: Entry) {
        if !self.labels.contains(&e.label) {
            self.labels.push(e.label.clone());
        }
        eprintln!("  {}", e.result.summary());
        self.entries.push(e);
    }
}

pub fn run(args: &CompareArgs) -> anyhow::Result<()> {
    let specs = matrix(args.size, !args.no_verify);
    for s in &specs {
        s.validate()
            .with_context(|| format!("--size {} for cell {}", args.size, s.cell()))?;
    }
    let corpus_dir = args.corpus.clone().unwrap_or_else(default_corpus);
    let corpus = Corpus::load(&corpus_dir)?;
    crate::abort::install_abort_handler();

    let mut cmp = Comparison::default();
    let mut outcome = run_all(args, &corpus, &specs, &mut cmp);
    if outcome.is_ok() && cmp.entries.is_empty() {
        let why: Vec<String> = cmp
            .skipped
            .iter()
            .map(|s| format!("{}: {}", s.label, s.reason))
            .collect();
        outcome = Err(anyhow::anyhow!("nothing was measured ({})", why.join("; ")));
    }

    if !cmp.entries.is_empty() {
        println!("{}", throughput_table(&cmp, &specs, args));
        println!("{}", memory_table(&cmp, &specs));
    }
    let doc = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "args": args,
        "machine": MachineInfo::collect(),
        "corpus": corpus_info(&corpus),
        "labels": cmp.labels,
        "results": cmp.entries,
        "skipped": cmp.skipped,
        "error": outcome.as_ref().err().map(|e| format!("{e:#}")),
    });
    write_json(&args.json, &doc)?;
    eprintln!("zmem: wrote {}", args.json.display());
    if !cmp.entries.is_empty() {
        plot(&cmp, &specs, &args.plot)
            .with_context(|| format!("drawing {}", args.plot.display()))?;
        eprintln!("zmem: wrote {}", args.plot.display());
    }
    outcome
}

fn run_all(
    args: &CompareArgs,
    corpus: &Corpus,
    specs: &[PagesSpec],
    cmp: &mut Comparison,
) -> anyhow::Result<()> {
    match ZramSession::acquire(0) {
        Ok(mut session) => {
            for alg in &args.zram_algs {
                let label = format!("zram-{alg}");
                eprintln!("zmem: {label}");
                for spec in specs {
                    // Reset, so each run starts empty (read patterns fill first).
                    session.configure(alg, spec.size)?;
                    let target = BlockDevTarget::open(&session.device())?;
                    let result = pages::run(&target, corpus, spec)?;
                    drop(target);
                    cmp.push(Entry {
                        label: label.clone(),
                        kind: "zram",
                        variant: alg.clone(),
                        cell: spec.cell(),
                        result,
                    });
                }
            }
        }
        Err(e) => {
            eprintln!("zmem: zram skipped: {e}; running zmem alone");
            cmp.skipped.push(Skipped {
                label: "zram".into(),
                reason: e.to_string(),
            });
        }
    }
    for policy in &args.policies {
        let label = format!("zmem-{policy}");
        eprintln!("zmem: {label}");
        for spec in specs {
            let cfg = ZmemTargetConfig {
                size: spec.size,
                policy: policy.clone(),
                block: args.block,
                mem_limit: None,
                backend: crate::offload::BackendKind::Cpu,
            };
            let target = match zmem_target::open(&cfg) {
                Ok(t) => t,
                Err(e) => {
                    eprintln!("zmem: {label} skipped: {e:#}");
                    cmp.skipped.push(Skipped {
                        label: label.clone(),
                        reason: format!("{e:#}"),
                    });
                    break;
                }
            };
            let result = pages::run(target.as_ref(), corpus, spec)?;
            drop(target);
            cmp.push(Entry {
                label: label.clone(),
                kind: "zmem",
                variant: policy.clone(),
                cell: spec.cell(),
                result,
            });
        }
    }
    Ok(())
}

/// Rows bs/jobs/rw; MiB/s per target; then zmem/zram-reference per zmem policy.
pub fn throughput_table(cmp: &Comparison, specs: &[PagesSpec], args: &CompareArgs) -> String {
    let reference = args.zram_algs.first().map(|a| format!("zram-{a}"));
    let zmem: Vec<&String> = cmp
        .labels
        .iter()
        .filter(|l| l.starts_with("zmem-"))
        .collect();
    let mut header = vec!["MiB/s bs/jobs/rw".to_string()];
    header.extend(cmp.labels.iter().cloned());
    if let Some(r) = &reference {
        for z in &zmem {
            header.push(format!("{}/{}", z, r.trim_start_matches("zram-")));
        }
    }
    let rows: Vec<Vec<String>> = specs
        .iter()
        .map(|s| {
            let cell = s.cell();
            let mut row = vec![cell.clone()];
            for l in &cmp.labels {
                row.push(
                    cmp.get(l, &cell)
                        .map_or("-".into(), |r| format!("{:.1}", r.mib_s)),
                );
            }
            if let Some(r) = &reference {
                for z in &zmem {
                    let v = match (cmp.get(z, &cell), cmp.get(r, &cell)) {
                        (Some(a), Some(b)) if b.mib_s > 0.0 => format!("{:.2}x", a.mib_s / b.mib_s),
                        _ => "-".into(),
                    };
                    row.push(v);
                }
            }
            row
        })
        .collect();
    text_table(&header, &rows)
}

/// Write rows: ratio (orig / mem_used_total) and CPU s/GiB per target.
pub fn memory_table(cmp: &Comparison, specs: &[PagesSpec]) -> String {
    let mut header = vec!["memory (writes)".to_string()];
    // Targets with an idle pass (zmem `auto`) get a column for the ratio once it ran.
    let settles = |l: &String| {
        cmp.entries
            .iter()
            .any(|e| &e.label == l && e.result.settled.is_some())
    };
    for l in &cmp.labels {
        header.push(format!("{l} ratio"));
        if settles(l) {
            header.push(format!("{l} settled"));
        }
        header.push(format!("{l} cpu s/GiB"));
    }
    let rows: Vec<Vec<String>> = specs
        .iter()
        .filter(|s| s.rw.is_write())
        .map(|s| {
            let cell = s.cell();
            let mut row = vec![cell.clone()];
            for l in &cmp.labels {
                let r = cmp.get(l, &cell);
                let ratio = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.3}"));
                row.push(ratio(r.and_then(|r| r.ratio_mem_used)));
                if settles(l) {
                    row.push(ratio(
                        r.and_then(|r| r.settled.as_ref())
                            .and_then(|s| s.ratio_mem_used),
                    ));
                }
                row.push(r.map_or("-".into(), |r| format!("{:.3}", r.cpu_s_per_gib)));
            }
            row
        })
        .collect();
    text_table(&header, &rows)
}

/// Grouped bars: MiB/s per cell, one bar per target.
pub fn plot(cmp: &Comparison, specs: &[PagesSpec], path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let cells: Vec<String> = specs.iter().map(|s| s.cell()).collect();
    let n = cells.len().max(1);
    let ymax = cmp
        .entries
        .iter()
        .map(|e| e.result.mib_s)
        .fold(1.0f64, f64::max)
        * 1.15;
    let size = specs.first().map_or(0, |s| s.size);
    let root = SVGBackend::new(path, (1400, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!(
        "zmem vs kernel zram: MiB/s ({} per run, O_DIRECT pages of the corpus)",
        format_size(size)
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 22))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(SlotAxis(n), 0f64..ymax)?;
    let label_of = |x: &f64| {
        let i = x.floor().max(0.0) as usize;
        cells.get(i).cloned().unwrap_or_default()
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&label_of)
        .x_desc("bs / jobs / rw")
        .y_desc("MiB/s")
        .draw()?;
    draw_grouped_bars(&mut chart, &cmp.labels, n, |j, i| {
        cmp.get(&cmp.labels[j], cells.get(i)?).map(|r| r.mib_s)
    })?;
    finish_chart(&root, &mut chart, SeriesLabelPosition::UpperRight)
}
