//! The text table and the SVG chart of `bench region`.

use std::path::Path;

use anyhow::Context;

use super::side::{EvictionComparison, SideResult};
use super::{Pattern, Workload};
use crate::report::{finish_chart, text_table};

/// The faults per access of clock against fifo, on one line.
pub(super) fn eviction_line(e: &EvictionComparison, w: &Workload) -> String {
    let target = if w.pattern == Pattern::Zipf && (w.zipf_s - 0.99).abs() < 1e-9 {
        " (target for zipf(0.99): at least 30% fewer)"
    } else {
        ""
    };
    match e.reduction_pct {
        Some(pct) => format!(
            "eviction: faults/access clock {:.4} vs fifo {:.4}: clock takes {:.1}% {} faults than fifo{target}",
            e.clock_faults_per_access,
            e.fifo_faults_per_access,
            pct.abs(),
            if pct >= 0.0 { "fewer" } else { "more" },
        ),
        None => format!(
            "eviction: faults/access clock {:.4} vs fifo {:.4} (fifo took no faults)",
            e.clock_faults_per_access, e.fifo_faults_per_access
        ),
    }
}

/// Metric rows, one column per side, then zmem/kernel ratio columns when the kernel side ran.
pub fn side_table(results: &[SideResult], w: &Workload) -> String {
    type Metric = (&'static str, fn(&SideResult) -> Option<f64>, usize);
    let metrics: [Metric; 25] = [
        (
            "time/access us (wall x threads)",
            |r| Some(r.run.ns_per_access / 1000.0),
            3,
        ),
        ("access mean us", |r| r.run.access.mean_us, 3),
        ("access p50 us", |r| Some(r.run.access.p50_us), 3),
        ("access p99 us", |r| Some(r.run.access.p99_us), 2),
        ("access p99.9 us", |r| Some(r.run.access.p999_us), 2),
        (
            "fault p50 us",
            |r| (r.fault_latency.count > 0).then_some(r.fault_latency.p50_us),
            2,
        ),
        (
            "fault p99 us",
            |r| (r.fault_latency.count > 0).then_some(r.fault_latency.p99_us),
            2,
        ),
        (
            "fault p99.9 us",
            |r| (r.fault_latency.count > 0).then_some(r.fault_latency.p999_us),
            2,
        ),
        (
            "handler fault p50/p99 us",
            |r| {
                r.handler_fault_latency
                    .as_ref()
                    .filter(|l| l.count > 0)
                    .map(|l| l.p50_us)
            },
            2,
        ),
        (
            "handler us/fault",
            |r| r.fault_breakdown.as_ref().map(|b| b.handler_us),
            2,
        ),
        (
            "  evict on fault us",
            |r| r.fault_breakdown.as_ref().map(|b| b.evict_on_fault_us),
            2,
        ),
        (
            "  decompress us",
            |r| r.fault_breakdown.as_ref().map(|b| b.decompress_us),
            2,
        ),
        (
            "  map us",
            |r| r.fault_breakdown.as_ref().map(|b| b.map_us),
            2,
        ),
        (
            "hand-off (or signal) us/fault",
            |r| r.fault_breakdown.as_ref().and_then(|b| b.handoff_us),
            2,
        ),
        (
            "idle eviction us/fault",
            |r| r.fault_breakdown.as_ref().map(|b| b.idle_evict_us),
            2,
        ),
        (
            "evict: move us/page",
            |r| {
                r.fault_breakdown
                    .as_ref()
                    .and_then(|b| b.evict_move_us_per_page)
            },
            2,
        ),
        (
            "evict: compress+store us/page",
            |r| {
                r.fault_breakdown
                    .as_ref()
                    .and_then(|b| b.evict_store_us_per_page)
            },
            2,
        ),
        ("faults/access", |r| Some(r.faults_per_access), 4),
        ("faults/s", |r| Some(r.faults_per_s), 0),
        ("MiB/s", |r| Some(r.run.mib_s), 1),
        ("ratio (orig/pool)", |r| r.memory.ratio, 3),
        (
            "effective ratio (size/DRAM)",
            |r| r.memory.effective_ratio,
            3,
        ),
        (
            "DRAM MiB (resident+pool)",
            |r| Some(r.memory.dram_bytes as f64 / (1u64 << 20) as f64),
            1,
        ),
        ("CPU s/GiB (+kswapd)", |r| Some(r.cpu_s_per_gib), 3),
        ("kswapd CPU s", |r| Some(r.kswapd_cpu_s), 3),
    ];
    let kernel = results.iter().find(|r| r.kind == "kernel-zram");
    let zmem: Vec<&SideResult> = results.iter().filter(|r| r.kind == "zmem").collect();
    let mut header = vec![w.describe()];
    header.extend(results.iter().map(|r| r.label.clone()));
    if kernel.is_some() {
        header.extend(zmem.iter().map(|z| format!("{}/kernel", z.label)));
    }
    let rows: Vec<Vec<String>> = metrics
        .iter()
        .map(|(name, f, prec)| {
            let mut row = vec![name.to_string()];
            for r in results {
                let cell = if *name == "handler fault p50/p99 us" {
                    r.handler_fault_latency
                        .as_ref()
                        .filter(|l| l.count > 0)
                        .map_or("-".into(), |l| format!("{:.1}/{:.1}", l.p50_us, l.p99_us))
                } else {
                    f(r).map_or("-".into(), |v| format!("{v:.prec$}"))
                };
                row.push(cell);
            }
            if let Some(k) = kernel {
                for z in &zmem {
                    let cell = match (f(z), f(k)) {
                        (Some(a), Some(b)) if b > 0.0 && *name != "handler fault p50/p99 us" => {
                            format!("{:.2}x", a / b)
                        }
                        _ => "-".into(),
                    };
                    row.push(cell);
                }
            }
            row
        })
        .collect();
    text_table(&header, &rows)
}

/// Grouped bars: each metric relative to the first side (the kernel's when it ran).
pub fn plot(results: &[SideResult], w: &Workload, path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    type Metric = (&'static str, fn(&SideResult) -> f64);
    let metrics: [Metric; 6] = [
        ("time/access", |r| r.run.ns_per_access),
        ("fault p99", |r| r.fault_latency.p99_us),
        ("faults/access", |r| r.faults_per_access),
        ("CPU s/GiB", |r| r.cpu_s_per_gib),
        ("ratio", |r| r.memory.ratio.unwrap_or(0.0)),
        ("effective ratio", |r| {
            r.memory.effective_ratio.unwrap_or(0.0)
        }),
    ];
    let reference = &results[0];
    let rel = |m: &Metric, r: &SideResult| {
        let b = (m.1)(reference);
        if b > 0.0 {
            (m.1)(r) / b
        } else {
            0.0
        }
    };
    let ymax = metrics
        .iter()
        .flat_map(|m| results.iter().map(move |r| rel(m, r)))
        .filter(|v| v.is_finite())
        .fold(1.0f64, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (1200, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!(
        "zmem region vs kernel zram: {} (relative to {})",
        w.describe(),
        reference.label
    );
    let n = metrics.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..n as f64, 0f64..ymax)?;
    let names: Vec<&str> = metrics.iter().map(|m| m.0).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n * 2 + 1)
        .x_label_formatter(&|x: &f64| crate::report::slot_label(&names, *x))
        .y_desc(format!(
            "relative to {} (lower is better but for ratios)",
            reference.label
        ))
        .draw()?;
    let k = results.len();
    let bw = 0.8 / k as f64;
    for (j, r) in results.iter().enumerate() {
        let color = Palette99::pick(j).to_rgba();
        let bars: Vec<Rectangle<(f64, f64)>> = metrics
            .iter()
            .enumerate()
            .map(|(i, m)| {
                let x0 = i as f64 + 0.1 + j as f64 * bw;
                Rectangle::new([(x0, 0.0), (x0 + bw, rel(m, r))], color.filled())
            })
            .collect();
        chart
            .draw_series(bars)?
            .label(r.label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    finish_chart(&root, &mut chart, SeriesLabelPosition::UpperRight)
}
