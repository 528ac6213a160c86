//! What the programs bench reports: every run as recorded ([`RunRecord`]), the medians per
//! program and budget side by side ([`Summary`], [`summarize`]), the text [`table`] and the SVG
//! bar chart ([`plot`]: each side's time relative to the plain run, log scale, so that a 2x and a
//! 50x slowdown both read).

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;
use serde::Serialize;
use zmem_runenv::size::{format_mib, format_size};

use crate::report::{finish_chart, text_table};

/// The three ways a program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Side {
    /// No limit: the reference output and times.
    Plain,
    /// `zmem run --resident B`.
    Zmem,
    /// A memory cgroup limited to B, zram swap.
    Kernel,
}

/// zmem's figures of a run (its --stats, summed over the processes it ran: gcc's cc1 too).
#[derive(Clone, Debug, Default, Serialize)]
pub struct ZmemFigures {
    pub processes: usize,
    pub major_faults: u64,
    pub zero_faults: u64,
    pub evictions: u64,
    /// Most heap data (resident + compressed, uncompressed bytes) and most DRAM (resident +
    /// pool) of the program zmem started.
    pub peak_data: u64,
    pub peak_dram: u64,
    pub codec_cpu_s: f64,
}

/// The kernel side's figures of a run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct KernelFigures {
    /// memory.limit_in_bytes.
    pub limit: u64,
    /// OOM kills in the cgroup during the run.
    pub oom_kills: u64,
    /// memory.max_usage_in_bytes (everything charged: anon and page cache).
    pub max_usage: u64,
    /// zram0's mm_stat mem_used_max during the run: the compressed pages' DRAM.
    pub zram_mem_used_max: u64,
}

/// One run.
#[derive(Clone, Debug, Serialize)]
pub struct RunRecord {
    pub side: Side,
    pub resident: Option<u64>,
    /// 1-based.
    pub rep: u32,
    /// "ok", "oom-killed" (kernel side), "timeout", "failed".
    pub outcome: String,
    pub exit: String,
    pub wall_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    /// Peak RSS (wait4), bytes.
    pub max_rss: u64,
    /// Most resident anonymous memory of the started process, sampled every 10 ms, bytes.
    pub peak_anon: u64,
    /// zmem side: zmem's major faults (decompressions); else the kernel's (wait4).
    pub major_faults: u64,
    pub rusage_major_faults: u64,
    pub rusage_minor_faults: u64,
    pub output_bytes: u64,
    /// Ran to success and its stdout is byte-identical to the plain run's.
    pub output_matched: bool,
    pub first_difference: Option<u64>,
    /// The bytes around the first difference, both sides.
    pub difference: Option<String>,
    pub zmem: Option<ZmemFigures>,
    pub kernel: Option<KernelFigures>,
    pub stderr_tail: Vec<String>,
}

impl RunRecord {
    /// "plain", "zmem --resident 16M", "kernel limit 16M".
    pub fn side_label(&self) -> String {
        let b = self.resident.map(format_size).unwrap_or_default();
        match self.side {
            Side::Plain => "plain".into(),
            Side::Zmem => format!("zmem --resident {b}"),
            Side::Kernel => format!("kernel limit {b} + zram"),
        }
    }
}

/// A program not run.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    pub program: String,
    pub reason: String,
}

/// One program's runs.
#[derive(Clone, Debug, Serialize)]
pub struct ProgramResult {
    /// The built-in program's name, or the NAME of a `--command NAME=COMMAND`.
    pub program: String,
    pub binary: String,
    pub version: String,
    /// The Debian package of a built-in program (none for a `--command`).
    pub package: Option<&'static str>,
    pub command: Vec<String>,
    pub env: Vec<(String, String)>,
    pub input_bytes: u64,
    pub output_bytes: u64,
    pub runs: Vec<RunRecord>,
}

/// Medians of one side's successful runs.
#[derive(Clone, Debug, Default, Serialize)]
pub struct SideSummary {
    pub runs: usize,
    pub ok: usize,
    pub oom_killed: usize,
    pub timeouts: usize,
    pub failed: usize,
    pub wall_s: Option<f64>,
    pub cpu_s: Option<f64>,
    pub major_faults: Option<u64>,
    pub max_rss: Option<u64>,
    /// Resident anonymous memory at its most (sampled): on the plain side, the heap's footprint
    /// under the program's own allocator.
    pub peak_anon: Option<u64>,
    /// zmem side: evictions (median).
    pub evictions: Option<u64>,
    /// zmem side: its peak heap data (resident + evicted, uncompressed), the heap's footprint
    /// under zmem's allocator (issue 10 item 5: no larger than `peak_anon` of the plain run).
    pub peak_data: Option<u64>,
}

/// One program at one budget, side by side.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub program: String,
    pub resident: u64,
    pub plain: SideSummary,
    pub zmem: SideSummary,
    pub kernel: Option<SideSummary>,
    /// Median wall time of zmem over the kernel's.
    pub zmem_over_kernel: Option<f64>,
    pub zmem_over_plain: Option<f64>,
    pub kernel_over_plain: Option<f64>,
}

fn median_f(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

fn median_u(v: Vec<u64>) -> Option<u64> {
    median_f(v.into_iter().map(|x| x as f64).collect()).map(|m| m.round() as u64)
}

fn side_summary<'a>(runs: impl Iterator<Item = &'a RunRecord>) -> SideSummary {
    let runs: Vec<&RunRecord> = runs.collect();
    let count = |o: &str| runs.iter().filter(|r| r.outcome == o).count();
    let ok: Vec<&&RunRecord> = runs.iter().filter(|r| r.outcome == "ok").collect();
    SideSummary {
        runs: runs.len(),
        ok: ok.len(),
        oom_killed: count("oom-killed"),
        timeouts: count("timeout"),
        failed: count("failed"),
        wall_s: median_f(ok.iter().map(|r| r.wall_s).collect()),
        cpu_s: median_f(ok.iter().map(|r| r.user_s + r.sys_s).collect()),
        major_faults: median_u(ok.iter().map(|r| r.major_faults).collect()),
        max_rss: median_u(ok.iter().map(|r| r.max_rss).collect()),
        peak_anon: median_u(ok.iter().map(|r| r.peak_anon).filter(|&a| a > 0).collect()),
        evictions: median_u(
            ok.iter()
                .filter_map(|r| r.zmem.as_ref().map(|z| z.evictions))
                .collect(),
        ),
        peak_data: median_u(
            ok.iter()
                .filter_map(|r| r.zmem.as_ref().map(|z| z.peak_data))
                .collect(),
        ),
    }
}

/// The medians of every program at every budget.
pub fn summarize(results: &[ProgramResult], budgets: &[u64]) -> Vec<Summary> {
    let mut out = Vec::new();
    for r in results {
        let plain = side_summary(r.runs.iter().filter(|x| x.side == Side::Plain));
        let has_kernel = r.runs.iter().any(|x| x.side == Side::Kernel);
        for &b in budgets {
            let at = |s: Side| {
                side_summary(
                    r.runs
                        .iter()
                        .filter(move |x| x.side == s && x.resident == Some(b)),
                )
            };
            let zmem = at(Side::Zmem);
            let kernel = has_kernel.then(|| at(Side::Kernel));
            let ratio = |a: Option<f64>, b: Option<f64>| Some(a? / b?);
            out.push(Summary {
                program: r.program.clone(),
                resident: b,
                zmem_over_kernel: ratio(zmem.wall_s, kernel.as_ref().and_then(|k| k.wall_s)),
                zmem_over_plain: ratio(zmem.wall_s, plain.wall_s),
                kernel_over_plain: ratio(kernel.as_ref().and_then(|k| k.wall_s), plain.wall_s),
                plain: plain.clone(),
                zmem,
                kernel,
            });
        }
    }
    out
}

/// A side's median (with `f`), or what ended its runs: "OOM 3/3", "timeout", "failed".
fn cell(s: &SideSummary, f: impl Fn(&SideSummary) -> Option<String>) -> String {
    let lost = |what: &str, n: usize| format!("{what} {n}/{}", s.runs);
    let note = if s.oom_killed > 0 {
        Some(lost("OOM", s.oom_killed))
    } else if s.timeouts > 0 {
        Some(lost("timeout", s.timeouts))
    } else if s.failed > 0 {
        Some(lost("failed", s.failed))
    } else {
        None
    };
    match (f(s), note) {
        (Some(v), None) => v,
        (Some(v), Some(n)) => format!("{v} ({n})"),
        (None, Some(n)) => n,
        (None, None) => "-".into(),
    }
}

fn secs(s: &SideSummary) -> Option<String> {
    s.wall_s.map(|t| format!("{t:.2}"))
}

fn cpu(s: &SideSummary) -> Option<String> {
    s.cpu_s.map(|t| format!("{t:.2}"))
}

fn faults(s: &SideSummary) -> Option<String> {
    s.major_faults.map(|f| f.to_string())
}

/// The table: one row per program and budget; times in seconds (medians), major faults (zmem:
/// its decompressions; kernel: swap-ins and other major faults).
pub fn table(rows: &[Summary], kernel: bool) -> String {
    let mut header: Vec<String> = [
        "program",
        "peak RSS",
        "heap plain",
        "heap zmem",
        "budget",
        "plain s",
        "zmem s",
        "kernel s",
        "zmem/kernel",
        "CPU plain",
        "CPU zmem",
        "CPU kernel",
        "majflt zmem",
        "majflt kernel",
    ]
    .map(String::from)
    .to_vec();
    if !kernel {
        header.retain(|h| !h.contains("kernel"));
    }
    let mut out = Vec::new();
    for s in rows {
        let k = s.kernel.clone().unwrap_or_default();
        let mut r = vec![
            s.program.clone(),
            s.plain
                .max_rss
                .map(format_mib)
                .unwrap_or_else(|| "-".into()),
            s.plain
                .peak_anon
                .map(format_mib)
                .unwrap_or_else(|| "-".into()),
            s.zmem
                .peak_data
                .map(format_mib)
                .unwrap_or_else(|| "-".into()),
            format_size(s.resident),
            cell(&s.plain, secs),
            cell(&s.zmem, secs),
            cell(&k, secs),
            s.zmem_over_kernel
                .map(|r| format!("{r:.2}"))
                .unwrap_or_else(|| "-".into()),
            cell(&s.plain, cpu),
            cell(&s.zmem, cpu),
            cell(&k, cpu),
            cell(&s.zmem, faults),
            cell(&k, faults),
        ];
        if !kernel {
            r = r
                .into_iter()
                .enumerate()
                .filter(|(i, _)| ![7, 8, 11, 13].contains(i))
                .map(|(_, c)| c)
                .collect();
        }
        out.push(r);
    }
    text_table(&header, &out)
}

/// Bars of each side's median time over the plain run's, per program and budget (log scale);
/// a side with no successful run is marked under its place ("OOM", "timeout", "failed").
pub fn plot(rows: &[Summary], kernel: bool, path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let zmem_c = RGBColor(214, 39, 40);
    let kernel_c = RGBColor(31, 119, 180);
    let n = rows.len();
    let ymax = rows
        .iter()
        .flat_map(|s| [s.zmem_over_plain, s.kernel_over_plain])
        .flatten()
        .fold(2.0f64, f64::max)
        * 1.6;
    let ymin = 0.5f64;
    let labels: Vec<String> = rows
        .iter()
        .map(|s| format!("{} {}", s.program, format_size(s.resident)))
        .collect();
    let width = (160 + 110 * n as u32).max(700);
    let root = SVGBackend::new(path, (width, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "time relative to the plain run (median): zmem run --resident B vs kernel cgroup limit B + zram swap",
            ("sans-serif", 18),
        )
        .margin(15)
        .x_label_area_size(60)
        .y_label_area_size(60)
        .build_cartesian_2d(-0.5f64..(n as f64 - 0.5), (ymin..ymax).log_scale())?;
    let label_of = |x: &f64| {
        let i = x.round();
        if (x - i).abs() < 0.01 && i >= 0.0 && (i as usize) < labels.len() {
            labels[i as usize].clone()
        } else {
            String::new()
        }
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n.max(1) * 2 + 1)
        .x_label_formatter(&label_of)
        .y_desc("wall time / plain wall time (log)")
        .draw()?;
    let sides: Vec<(&str, RGBColor, f64)> = if kernel {
        vec![("zmem", zmem_c, -0.2), ("kernel (zram)", kernel_c, 0.2)]
    } else {
        vec![("zmem", zmem_c, 0.0)]
    };
    for (name, color, off) in sides {
        let is_zmem = name == "zmem";
        let bars: Vec<(f64, f64)> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let v = if is_zmem {
                    s.zmem_over_plain
                } else {
                    s.kernel_over_plain
                }?;
                Some((i as f64 + off, v))
            })
            .collect();
        chart
            .draw_series(bars.iter().map(|&(x, v)| {
                Rectangle::new([(x - 0.17, ymin), (x + 0.17, v.max(ymin))], color.filled())
            }))?
            .label(name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        chart.draw_series(bars.iter().map(|&(x, v)| {
            Text::new(
                format!("{v:.1}x"),
                (x - 0.15, v.max(ymin) * 1.08),
                ("sans-serif", 12).into_font(),
            )
        }))?;
        let lost: Vec<(f64, String)> = rows
            .iter()
            .enumerate()
            .filter_map(|(i, s)| {
                let side = if is_zmem {
                    Some(&s.zmem)
                } else {
                    s.kernel.as_ref()
                }?;
                if side.wall_s.is_some() {
                    return None;
                }
                let what = if side.oom_killed > 0 {
                    "OOM"
                } else if side.timeouts > 0 {
                    "timeout"
                } else {
                    "failed"
                };
                Some((i as f64 + off, what.to_string()))
            })
            .collect();
        chart.draw_series(lost.into_iter().map(|(x, what)| {
            Text::new(
                what,
                (x - 0.15, ymin * 1.15),
                ("sans-serif", 12).into_font().color(&color),
            )
        }))?;
    }
    chart.draw_series(std::iter::once(PathElement::new(
        [(-0.5, 1.0), (n as f64 - 0.5, 1.0)],
        BLACK.stroke_width(1),
    )))?;
    finish_chart(&root, &mut chart, SeriesLabelPosition::UpperRight)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(side: Side, outcome: &str, wall: f64) -> RunRecord {
        RunRecord {
            side,
            resident: (side != Side::Plain).then_some(16 << 20),
            rep: 1,
            outcome: outcome.into(),
            exit: String::new(),
            wall_s: wall,
            user_s: wall / 2.0,
            sys_s: 0.0,
            max_rss: 100 << 20,
            peak_anon: 90 << 20,
            major_faults: 10,
            rusage_major_faults: 0,
            rusage_minor_faults: 0,
            output_bytes: 0,
            output_matched: outcome == "ok",
            first_difference: None,
            difference: None,
            zmem: None,
            kernel: None,
            stderr_tail: Vec::new(),
        }
    }

    #[test]
    fn medians_ratios_and_lost_runs() {
        let mut r = ProgramResult {
            program: "sort".into(),
            binary: "sort".into(),
            version: String::new(),
            package: Some("coreutils"),
            command: Vec::new(),
            env: Vec::new(),
            input_bytes: 0,
            output_bytes: 0,
            runs: vec![
                rec(Side::Plain, "ok", 1.0),
                rec(Side::Plain, "ok", 3.0),
                rec(Side::Plain, "ok", 2.0),
                rec(Side::Zmem, "ok", 4.0),
                rec(Side::Zmem, "ok", 6.0),
                rec(Side::Kernel, "oom-killed", 9.0),
                rec(Side::Kernel, "ok", 10.0),
            ],
        };
        for (i, run) in r
            .runs
            .iter_mut()
            .filter(|x| x.side == Side::Zmem)
            .enumerate()
        {
            run.zmem = Some(ZmemFigures {
                peak_data: (110 + 20 * i as u64) << 20,
                ..ZmemFigures::default()
            });
        }
        let s = summarize(&[r], &[16 << 20]);
        assert_eq!(s.len(), 1);
        // The heap's footprint both ways: the plain run's resident anonymous memory beside
        // zmem's peak heap data (median of 110 and 130 MiB).
        assert_eq!(s[0].plain.peak_anon, Some(90 << 20));
        assert_eq!(s[0].zmem.peak_data, Some(120 << 20));
        assert_eq!(s[0].plain.wall_s, Some(2.0));
        assert_eq!(s[0].zmem.wall_s, Some(5.0));
        let k = s[0].kernel.as_ref().unwrap();
        assert_eq!((k.ok, k.oom_killed, k.wall_s), (1, 1, Some(10.0)));
        assert_eq!(s[0].zmem_over_kernel, Some(0.5));
        let t = table(&s, true);
        assert!(t.contains("10.00 (OOM 1/2)"), "{t}");
        assert!(t.contains("0.50"), "{t}");
        assert!(t.contains("90 MiB") && t.contains("120 MiB"), "{t}");
        let t = table(&s, false);
        assert!(!t.contains("kernel"), "{t}");
        assert!(t.contains("heap plain") && t.contains("120 MiB"), "{t}");
    }
}
