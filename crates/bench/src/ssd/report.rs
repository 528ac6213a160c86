//! What `bench ssd` reports: a run as recorded and checked ([`RunRecord`]), the median run per
//! workload and side with the kernel/zmem ratios ([`CaseSummary`]), the text table, the JSON
//! and the chart (mean latency per workload, zmem beside the kernel, log scale).

use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use zmem_runenv::size::{format_mib, format_size};

use super::run::{KernelFigures, Side, ZmemFigures};
use super::worker::WorkerReport;
use super::{Case, Plan, SideKind};
use crate::programs::run::Exit;
use crate::report::{finish_chart, text_table, write_json, MachineInfo};

/// A side that did not run, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    pub side: String,
    pub reason: String,
}

/// One run of a worker on a side, as recorded.
#[derive(Clone, Debug, Serialize)]
pub struct RunRecord {
    pub case: Case,
    pub case_name: String,
    pub side: String,
    pub kind: SideKind,
    pub rep: u32,
    /// "ok", "verify-failed", "oom-killed", "timeout", "failed".
    pub outcome: String,
    pub exit: String,
    pub wall_s: f64,
    pub max_rss: u64,
    /// The worker's memory cgroup's memory.max_usage_in_bytes: the DRAM it really took (the
    /// kernel side's limit is --dram above the worker's baseline; zmem's cgroup has no limit).
    pub cgroup_max_usage_bytes: u64,
    pub report: Option<WorkerReport>,
    pub kernel: Option<KernelFigures>,
    pub zmem: Option<ZmemFigures>,
    /// What is wrong with the run (empty: verified).
    pub problems: Vec<String>,
    /// What is worth knowing but not wrong.
    pub notes: Vec<String>,
    pub verified: bool,
    pub stderr_tail: Vec<String>,
}

impl RunRecord {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        case: &Case,
        side: &Side,
        rep: u32,
        exit: &Exit,
        report: Option<WorkerReport>,
        max_usage: u64,
        kernel: Option<KernelFigures>,
        zmem: Option<ZmemFigures>,
    ) -> RunRecord {
        let oom = kernel.as_ref().is_some_and(|k| k.oom_kills > 0)
            && exit.killed_by() == Some(libc::SIGKILL);
        let failures = report.as_ref().map_or(0, |r| r.verify.failures);
        let outcome = if exit.timed_out {
            "timeout"
        } else if failures > 0 {
            "verify-failed"
        } else if oom {
            "oom-killed"
        } else if exit.success() && report.is_some() {
            "ok"
        } else {
            "failed"
        };
        let mut problems = Vec::new();
        let mut notes = Vec::new();
        match outcome {
            "ok" => {}
            "verify-failed" => problems.push(format!(
                "{failures} verification failure(s); the first: {}",
                report
                    .as_ref()
                    .and_then(|r| r.verify.first_failure.as_deref())
                    .unwrap_or("?")
            )),
            _ => problems.push(format!(
                "the worker {}{}; its stderr: {}",
                exit.describe(),
                if exit.success() {
                    " without a report"
                } else {
                    ""
                },
                if exit.stderr_tail.is_empty() {
                    "(none)".into()
                } else {
                    exit.stderr_tail.join(" | ")
                }
            )),
        }
        if let Some(k) = &kernel {
            let majflt = report.as_ref().map_or(0, |r| r.run_usage.major_faults);
            if outcome == "ok" && k.pswpout == 0 && majflt == 0 {
                problems.push(
                    "nothing was swapped: the cgroup limit did not bite, the run measured DRAM"
                        .into(),
                );
            }
            if !k.swap_file_removed {
                problems.push(format!("the swap file {} is still there", k.swap_file));
            }
            if !k.swaps_as_before {
                problems.push("/proc/swaps is not as before the run".into());
            }
        }
        if let Some(z) = &zmem {
            let kept = z.incompressible_kept.unwrap_or(0) * 4096;
            if kept > 0 {
                let msg = format!(
                    "{} of pages that did not compress stayed in DRAM outside zmem's budget",
                    format_mib(kept)
                );
                // More than an eighth of --dram beside it: not the same DRAM any more.
                if kept > (z.resident + z.store_limit) / 8 {
                    problems.push(format!("{msg}: the run measured DRAM"));
                } else {
                    notes.push(msg);
                }
            }
            if !z.log_dir_leftovers.is_empty() {
                problems.push(format!(
                    "the log's directory {} held {:?} after the run (the log must be unnamed)",
                    z.log_dir, z.log_dir_leftovers
                ));
            }
            match (&z.ssd, &z.stats_error) {
                (Some(ssd), _) => {
                    if outcome == "ok" && z.ssd_u64("device_bytes_written") == Some(0) {
                        problems.push(
                            "nothing was written to the SSD log: the run measured DRAM".into(),
                        );
                    }
                    if ssd.get("direct").and_then(|v| v.as_bool()) == Some(false) {
                        notes.push(
                            "the log was not opened with O_DIRECT: its reads may come from the \
                             page cache"
                                .into(),
                        );
                    }
                }
                (None, Some(e)) => notes.push(format!("no zmem statistics: {e}")),
                (None, None) => notes.push("zmem's --stats has no `ssd` object".into()),
            }
        }
        let verified = problems.is_empty();
        RunRecord {
            case: case.clone(),
            case_name: case.name(),
            side: side.label.clone(),
            kind: side.kind,
            rep,
            outcome: outcome.into(),
            exit: exit.describe(),
            wall_s: exit.wall_s,
            max_rss: exit.max_rss,
            cgroup_max_usage_bytes: max_usage,
            report,
            kernel,
            zmem,
            problems,
            notes,
            verified,
            stderr_tail: exit.stderr_tail.clone(),
        }
    }

    /// What is wrong, on one line (None: verified).
    pub fn problem(&self) -> Option<String> {
        (!self.problems.is_empty()).then(|| {
            format!(
                "{} on {}, run {}: {}",
                self.case_name,
                self.side,
                self.rep,
                self.problems.join("; ")
            )
        })
    }

    /// Bytes written to the disk: the kernel's swap-outs (the whole machine's pswpout), zmem's
    /// log writes (whole segments, the collector's included).
    pub fn disk_written(&self) -> Option<u64> {
        match (&self.kernel, &self.zmem) {
            (Some(k), _) => Some(k.pswpout * 4096),
            (_, Some(z)) => z.ssd_u64("device_bytes_written"),
            _ => None,
        }
    }

    /// Bytes read from the disk: swap-ins, or the log's reads.
    pub fn disk_read(&self) -> Option<u64> {
        match (&self.kernel, &self.zmem) {
            (Some(k), _) => Some(k.pswpin * 4096),
            (_, Some(z)) => z.ssd_u64("device_bytes_read"),
            _ => None,
        }
    }

    /// zmem's log: bytes written to the device per byte of objects written.
    pub fn write_amplification(&self) -> Option<f64> {
        let z = self.zmem.as_ref()?;
        let user = z.ssd_u64("bytes_written").filter(|&b| b > 0)?;
        Some(z.ssd_u64("device_bytes_written")? as f64 / user as f64)
    }

    /// One human line.
    pub fn summary(&self) -> String {
        let Some(r) = &self.report else {
            return format!("{}: {} ({})", self.side, self.outcome, self.exit);
        };
        let mut s = format!(
            "{}: {} mean {:.1} us, p50 {:.1}, p99 {:.1}; {:.0} ops/s; fill {:.2} s; DRAM max {}; \
             {} checks, {} failures",
            self.side,
            self.outcome,
            r.latency.mean_us.unwrap_or(0.0),
            r.latency.p50_us,
            r.latency.p99_us,
            r.ops_per_s,
            r.fill_s,
            format_mib(self.cgroup_max_usage_bytes),
            r.verify.checked,
            r.verify.failures
        );
        if let (Some(w), Some(rd)) = (self.disk_written(), self.disk_read()) {
            s += &format!("; disk written {}, read {}", format_mib(w), format_mib(rd));
        }
        if self.kernel.is_some() {
            s += &format!("; {} major faults", r.run_usage.major_faults);
        }
        if let Some(z) = &self.zmem {
            s += &format!(
                "; zmem faults {}, SSD reads {}",
                z.major_faults.map_or("-".into(), |f| f.to_string()),
                z.ssd_u64("reads").map_or("-".into(), |f| f.to_string())
            );
        }
        if let (Some(hits), Some(p)) = (r.verify.absent_hits, r.verify.expected_false_positive_rate)
        {
            s += &format!(
                "; false positives {hits} (expected {:.1})",
                p * r.ops as f64 / 3.0
            );
        }
        s
    }
}

/// The median run of a workload on a side.
#[derive(Clone, Debug, Serialize)]
pub struct SideSummary {
    pub side: String,
    pub runs: usize,
    pub ok_runs: usize,
    /// Whether every run of it was verified.
    pub verified: bool,
    /// The run whose mean latency is the median of the ok runs.
    pub median_rep: Option<u32>,
    pub mean_us: Option<f64>,
    pub p50_us: Option<f64>,
    pub p99_us: Option<f64>,
    pub ops_per_s: Option<f64>,
    pub fill_s: Option<f64>,
    pub cgroup_max_usage_bytes: Option<u64>,
    pub disk_written_bytes: Option<u64>,
    pub disk_read_bytes: Option<u64>,
    pub write_amplification: Option<f64>,
}

/// A workload's sides and ratios.
#[derive(Clone, Debug, Serialize)]
pub struct CaseSummary {
    pub case: Case,
    pub name: String,
    pub sides: Vec<SideSummary>,
    /// Kernel mean latency / zmem mean latency (above 1: zmem is faster); verified sides only.
    pub kernel_over_zmem: Option<f64>,
    pub kernel_over_zmem_noenc: Option<f64>,
    /// How much longer an operation takes with the log encrypted, in percent.
    pub encryption_cost_pct: Option<f64>,
}

impl CaseSummary {
    fn side(&self, label: &str) -> Option<&SideSummary> {
        self.sides.iter().find(|s| s.side == label)
    }
}

/// The median runs and ratios of every workload.
pub fn summarize(cases: &[Case], sides: &[Side], records: &[RunRecord]) -> Vec<CaseSummary> {
    cases
        .iter()
        .map(|case| {
            let sides: Vec<SideSummary> = sides
                .iter()
                .map(|side| {
                    let runs: Vec<&RunRecord> = records
                        .iter()
                        .filter(|r| &r.case == case && r.side == side.label)
                        .collect();
                    let mut ok: Vec<&RunRecord> =
                        runs.iter().copied().filter(|r| r.outcome == "ok").collect();
                    let mean = |r: &RunRecord| {
                        r.report
                            .as_ref()
                            .and_then(|x| x.latency.mean_us)
                            .unwrap_or(f64::INFINITY)
                    };
                    ok.sort_by(|a, b| mean(a).total_cmp(&mean(b)));
                    let med = ok.get(ok.len().saturating_sub(1) / 2).copied();
                    let rep = med.and_then(|r| r.report.as_ref());
                    SideSummary {
                        side: side.label.clone(),
                        runs: runs.len(),
                        ok_runs: ok.len(),
                        verified: !runs.is_empty() && runs.iter().all(|r| r.verified),
                        median_rep: med.map(|r| r.rep),
                        mean_us: rep.and_then(|r| r.latency.mean_us),
                        p50_us: rep.map(|r| r.latency.p50_us),
                        p99_us: rep.map(|r| r.latency.p99_us),
                        ops_per_s: rep.map(|r| r.ops_per_s),
                        fill_s: rep.map(|r| r.fill_s),
                        cgroup_max_usage_bytes: med.map(|r| r.cgroup_max_usage_bytes),
                        disk_written_bytes: med.and_then(|r| r.disk_written()),
                        disk_read_bytes: med.and_then(|r| r.disk_read()),
                        write_amplification: med.and_then(|r| r.write_amplification()),
                    }
                })
                .collect();
            let mut s = CaseSummary {
                case: case.clone(),
                name: case.name(),
                sides,
                kernel_over_zmem: None,
                kernel_over_zmem_noenc: None,
                encryption_cost_pct: None,
            };
            // Ratios of verified sides only: a side that measured DRAM is no comparison.
            let ratio = |c: &CaseSummary, a: &str, b: &str| {
                let m = |l: &str| c.side(l).filter(|x| x.verified).and_then(|x| x.mean_us);
                match (m(a), m(b)) {
                    (Some(a), Some(b)) if b > 0.0 => Some(a / b),
                    _ => None,
                }
            };
            s.kernel_over_zmem = ratio(&s, "kernel-swap", "zmem");
            s.kernel_over_zmem_noenc = ratio(&s, "kernel-swap", "zmem-noenc");
            s.encryption_cost_pct = ratio(&s, "zmem", "zmem-noenc").map(|r| (r - 1.0) * 100.0);
            s
        })
        .collect()
}

/// The text report: the setup, then one row per workload.
pub fn text(
    plan: &Plan,
    machine: &MachineInfo,
    summaries: &[CaseSummary],
    sides: &[Side],
    skipped: &[Skipped],
    fs: &str,
) -> String {
    let mut out = format!(
        "machine: {} CPUs, {}, {}\n\
         DRAM {} per side (kernel: cgroup v1 limit above the worker's locked baseline, swap file \
         on {} ({fs}); zmem: --resident {} --store-limit {}, log on {}); array {}, disk {} per \
         side; {} ops per object run, {} bloom keys; latency in us, median of {} run(s)\n",
        machine.nproc,
        machine.cpu_model,
        machine.kernel,
        format_size(plan.dram),
        plan.dir.display(),
        format_size(plan.resident),
        format_size(plan.store_limit),
        plan.dir.display(),
        format_size(plan.array),
        format_size(plan.disk_size),
        plan.ops,
        plan.bloom_keys,
        plan.repeat,
    );
    let mut header = vec!["workload".to_string()];
    for s in sides {
        header.push(format!("{} mean", s.label));
        header.push("p50".into());
        header.push("p99".into());
    }
    let has = |l: &str| sides.iter().any(|s| s.label == l);
    let kernel = has("kernel-swap");
    if kernel && has("zmem") {
        header.push("kernel/zmem".into());
    }
    if kernel && has("zmem-noenc") {
        header.push("kernel/noenc".into());
    }
    if has("zmem") && has("zmem-noenc") {
        header.push("enc cost".into());
    }
    for s in sides {
        header.push(format!("fill s {}", s.label));
    }
    header.push("verified".into());
    let f = |x: Option<f64>, p: usize| x.map_or("-".into(), |v| format!("{v:.p$}"));
    let latency = per_side_rows(summaries, sides, |_, x| {
        vec![
            f(x.and_then(|x| x.mean_us), 1),
            f(x.and_then(|x| x.p50_us), 1),
            f(x.and_then(|x| x.p99_us), 1),
        ]
    });
    let rows: Vec<Vec<String>> = summaries
        .iter()
        .zip(latency)
        .map(|(c, mut row)| {
            if kernel && has("zmem") {
                row.push(
                    c.kernel_over_zmem
                        .map_or("-".into(), |r| format!("{r:.2}x")),
                );
            }
            if kernel && has("zmem-noenc") {
                row.push(
                    c.kernel_over_zmem_noenc
                        .map_or("-".into(), |r| format!("{r:.2}x")),
                );
            }
            if has("zmem") && has("zmem-noenc") {
                row.push(
                    c.encryption_cost_pct
                        .map_or("-".into(), |p| format!("{p:+.1}%")),
                );
            }
            for s in sides {
                row.push(f(c.side(&s.label).and_then(|x| x.fill_s), 2));
            }
            let all = c.sides.iter().all(|s| s.verified);
            row.push(if all { "yes" } else { "NO" }.into());
            row
        })
        .collect();
    out += &text_table(&header, &rows);
    out += "\n\n";
    out += &traffic_table(summaries, sides);
    for s in skipped {
        out += &format!("\n{} not run: {}", s.side, s.reason);
    }
    out
}

/// The DRAM each side really took (its cgroup's max usage) and its disk traffic, MiB, and zmem's
/// write amplification, per workload (the median runs).
fn traffic_table(summaries: &[CaseSummary], sides: &[Side]) -> String {
    let mut header = vec!["DRAM max, disk MiB".to_string()];
    for s in sides {
        header.push(format!("{} DRAM", s.label));
        header.push("written".into());
        header.push("read".into());
        if s.kind == SideKind::Zmem {
            header.push("WA".into());
        }
    }
    let mib = |x: Option<u64>| x.map_or("-".into(), |b| format!("{:.1}", b as f64 / 1048576.0));
    let rows = per_side_rows(summaries, sides, |s, x| {
        let mut v = vec![
            mib(x.and_then(|x| x.cgroup_max_usage_bytes)),
            mib(x.and_then(|x| x.disk_written_bytes)),
            mib(x.and_then(|x| x.disk_read_bytes)),
        ];
        if s.kind == SideKind::Zmem {
            v.push(
                x.and_then(|x| x.write_amplification)
                    .map_or("-".into(), |w| format!("{w:.2}")),
            );
        }
        v
    });
    text_table(&header, &rows)
}

/// One row per workload: its name, then `cells` of each side in turn.
fn per_side_rows(
    summaries: &[CaseSummary],
    sides: &[Side],
    cells: impl Fn(&Side, Option<&SideSummary>) -> Vec<String>,
) -> Vec<Vec<String>> {
    summaries
        .iter()
        .map(|c| {
            let mut row = vec![c.name.clone()];
            for s in sides {
                row.extend(cells(s, c.side(&s.label)));
            }
            row
        })
        .collect()
}

/// Writes OUT.json, OUT.txt (the command line, then `text`) and OUT.svg.
pub fn write_outputs(
    out: &Path,
    doc: &serde_json::Value,
    text: &str,
    summaries: &[CaseSummary],
    sides: &[Side],
    plan: &Plan,
) -> anyhow::Result<()> {
    let json = out.with_extension("json");
    write_json(&json, doc)?;
    eprintln!("zmem: wrote {}", json.display());
    let txt = out.with_extension("txt");
    let command = std::env::args().collect::<Vec<_>>().join(" ");
    std::fs::write(&txt, format!("$ {command}\n{text}\n"))
        .with_context(|| format!("writing {}", txt.display()))?;
    eprintln!("zmem: wrote {}", txt.display());
    if summaries
        .iter()
        .any(|c| c.sides.iter().any(|s| s.mean_us.is_some()))
    {
        let svg = out.with_extension("svg");
        plot(summaries, sides, plan, &svg).with_context(|| format!("drawing {}", svg.display()))?;
        eprintln!("zmem: wrote {}", svg.display());
    }
    Ok(())
}

/// Grouped bars: the mean latency of every workload on every side, log scale.
fn plot(summaries: &[CaseSummary], sides: &[Side], plan: &Plan, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    use plotters::style::text_anchor::{HPos, Pos, VPos};
    let values: Vec<f64> = summaries
        .iter()
        .flat_map(|c| c.sides.iter().filter_map(|s| s.mean_us))
        .filter(|v| *v > 0.0)
        .collect();
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min) / 2.0;
    let hi = values.iter().copied().fold(0.0f64, f64::max) * 3.0;
    let n = summaries.len();
    let root = SVGBackend::new(path, (1200, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!(
        "zmem SSD tier vs kernel swap on the same disk: {} array, {} DRAM (mean latency)",
        format_size(plan.array),
        format_size(plan.dram)
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(0f64..n as f64, (lo..hi).log_scale())?;
    let names: Vec<String> = summaries.iter().map(|c| c.name.clone()).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x: &f64| crate::report::slot_label(&names, *x))
        .y_desc("mean latency per operation, us (log scale; lower is better)")
        .x_desc("* pale: not verified (the run did not measure the disk, see the JSON)")
        .draw()?;
    let bw = 0.8 / sides.len() as f64;
    for (j, side) in sides.iter().enumerate() {
        let color = Palette99::pick(j).to_rgba();
        // (left edge, mean, verified) of each bar.
        let bars: Vec<(f64, f64, bool)> = summaries
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let x = c.side(&side.label)?;
                Some((i as f64 + 0.1 + j as f64 * bw, x.mean_us?, x.verified))
            })
            .collect();
        let style = TextStyle::from(("sans-serif", 11).into_font())
            .pos(Pos::new(HPos::Center, VPos::Bottom));
        chart.draw_series(bars.iter().map(|&(x0, v, ok)| {
            let value = if v >= 10.0 {
                format!("{v:.0}")
            } else {
                format!("{v:.1}")
            };
            let label = if ok { value } else { format!("{value}*") };
            Text::new(label, (x0 + bw / 2.0, v * 1.05), style.clone())
        }))?;
        chart
            .draw_series(bars.iter().map(|&(x0, v, ok)| {
                // An unverified bar is pale: what it measured is not the SSD tier.
                let fill = if ok { color } else { color.mix(0.3) };
                Rectangle::new([(x0, lo), (x0 + bw, v)], fill.filled())
            }))?
            .label(side.label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    finish_chart(&root, &mut chart, SeriesLabelPosition::UpperLeft)
}
