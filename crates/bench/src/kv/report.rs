//! What a run produces: the per-step measurements and per-configuration results, the ratios of
//! the targets, the tables and the chart.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::plan::Plan;
use super::{
    KvConfig, MIB, TARGET_DATA_VS_NOSWAP, TARGET_DATA_VS_ZRAM, TARGET_GET_SSD_VS_SWAPFILE,
    TARGET_GET_VS_ZRAM,
};
use crate::kernel::zram::MmStat;
use crate::region::side::FaultBreakdown;
use crate::report::{legend, text_table};
use zmem_region::RegionStats;
use zmem_runenv::size::{format_mib, format_size};

/// Measurements after one step.
#[derive(Clone, Debug, Serialize)]
pub struct Step {
    /// Value bytes loaded so far (all verified by GETs of a sample).
    pub data_bytes: u64,
    pub keys: u64,
    pub set_ops: u64,
    pub set_s: f64,
    pub set_ops_s: f64,
    pub set_mb_s: f64,
    pub gets: u64,
    pub get_s: f64,
    pub get_ops_s: Option<f64>,
    pub get_mb_s: Option<f64>,
    /// The server process's VmRSS and VmSwap.
    pub server_rss: Option<u64>,
    pub server_swap: Option<u64>,
    pub cgroup_usage: Option<u64>,
    pub cgroup_max_usage: Option<u64>,
    /// memory.stat: rss, cache, swap (bytes), pgmajfault.
    pub cgroup_stat: BTreeMap<String, u64>,
    pub cgroup_failcnt: Option<u64>,
    pub zram: Option<MmStat>,
    /// The server's own statistics (used_memory, bytes, curr_items...).
    pub server_stats: BTreeMap<String, u64>,
    /// zmem configurations: zmem's fault path during the step's GET phase.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub zmem_get: Option<GetFaults>,
}

/// zmem's fault path during one step's GET phase: the server's statistics read from its stats
/// socket (what `zmem stat PID` prints) before and after the phase (issue 11 item 5).
#[derive(Clone, Debug, Serialize)]
pub struct GetFaults {
    pub major_faults: u64,
    pub evictions: u64,
    /// Evictions of pages unchanged since their fault (their clean copy reused).
    pub clean_evictions: u64,
    /// Pages mapped beside the faulting one (fault-around), and faults on pages caught in
    /// staging (moved out, not yet compressed): what a fault brings in besides its page.
    pub fault_around_pages: u64,
    pub staged_faults: u64,
    /// Per handled fault, and eviction per page (see `bench region`).
    pub breakdown: Option<FaultBreakdown>,
    /// After the phase: the bytes of pages in zmem's store, of their compressed objects, the
    /// DRAM its pool holds, and the
    /// pages recompressed so far (policy `auto`): what the density comes from.
    pub stored_bytes: u64,
    pub compressed_bytes: u64,
    pub pool_bytes: u64,
    pub recompressed_pages: u64,
}

impl GetFaults {
    pub fn between(a: &RegionStats, b: &RegionStats) -> GetFaults {
        GetFaults {
            major_faults: b.major_faults.saturating_sub(a.major_faults),
            evictions: b.evictions.saturating_sub(a.evictions),
            clean_evictions: b.clean_evictions.saturating_sub(a.clean_evictions),
            fault_around_pages: b.fault_around_pages.saturating_sub(a.fault_around_pages),
            staged_faults: b.staged_faults.saturating_sub(a.staged_faults),
            breakdown: FaultBreakdown::new(&a.handler_time, &b.handler_time, None),
            stored_bytes: b.store.orig_data_size,
            compressed_bytes: b.store.compr_data_size,
            pool_bytes: b.store.mem_used_total,
            recompressed_pages: b.store.recompressed_pages,
        }
    }
}

/// Per zmem configuration and step, the fault path under the GETs: faults, and the handler's
/// µs per fault (decompress, map, evicting between faults), eviction's µs per page (move,
/// compress+store); empty when no step recorded one.
pub fn fault_table(results: &[ConfigResult]) -> String {
    let header: Vec<String> = [
        "GET phase",
        "major faults",
        "handler us/fault",
        "decompress",
        "map",
        "evict between",
        "move us/page",
        "store us/page",
        "evictions",
        "clean",
        "around",
        "staged",
        "stored MiB",
        "compressed",
        "pool MiB",
        "recompressed",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let us = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1}"));
    let rows: Vec<Vec<String>> = results
        .iter()
        .flat_map(|r| r.steps.iter().map(move |s| (r.config, s)))
        .filter_map(|(c, s)| {
            let g = s.zmem_get.as_ref()?;
            let b = g.breakdown.as_ref();
            Some(vec![
                format!("{} {}", c.as_str(), format_mib(s.data_bytes)),
                g.major_faults.to_string(),
                us(b.map(|b| b.handler_us)),
                us(b.map(|b| b.decompress_us)),
                us(b.map(|b| b.map_us)),
                us(b.map(|b| b.idle_evict_us)),
                us(b.and_then(|b| b.evict_move_us_per_page)),
                us(b.and_then(|b| b.evict_store_us_per_page)),
                g.evictions.to_string(),
                g.clean_evictions.to_string(),
                g.fault_around_pages.to_string(),
                g.staged_faults.to_string(),
                format_mib(g.stored_bytes),
                format_mib(g.compressed_bytes),
                format_mib(g.pool_bytes),
                g.recompressed_pages.to_string(),
            ])
        })
        .collect();
    if rows.is_empty() {
        return String::new();
    }
    text_table(&header, &rows)
}

/// How a configuration ended.
#[derive(Clone, Debug, Serialize)]
pub struct Stop {
    /// "oom-killed", "out-of-memory" (the server refused a SET for lack of memory),
    /// "zram-full" (zram at its mem_limit and the server stuck, see --zram-full-stall),
    /// "server-died", "connection-failed", "stalled" or "max-data".
    pub kind: String,
    /// Value bytes the failed step was loading up to (--max-data for "max-data").
    pub at_data: u64,
    pub detail: String,
}

/// One configuration's run.
#[derive(Clone, Debug, Serialize)]
pub struct ConfigResult {
    pub config: KvConfig,
    pub description: String,
    pub cgroup_limit: u64,
    /// DRAM it may use in all: the cgroup limit, plus zram's mem_limit for zram.
    pub dram_total: u64,
    pub command: Vec<String>,
    pub server_pid: Option<u32>,
    pub steps: Vec<Step>,
    /// Value bytes of the last step fully loaded and verified.
    pub data_held: u64,
    /// data_held when the server ran out of memory; None when --max-data was reached first.
    pub data_at_oom: Option<u64>,
    pub stop: Stop,
    pub oom_kills: u64,
    pub exit: Option<String>,
    /// Where the server's output was written.
    pub server_log: String,
    /// Its last lines, and the lines that tell what happened (a crash, an out-of-memory).
    pub server_log_tail: Vec<String>,
    pub server_log_key_lines: Vec<String>,
    pub zram: Option<serde_json::Value>,
    /// zmem and zmem-ssd: `zmem run`'s settings, its statistics at exit (`stats`: the DRAM it
    /// took, the SSD tier's log).
    pub zmem: Option<serde_json::Value>,
    /// swapfile: the swap file (path, size, file system, allocation, priority).
    pub swapfile: Option<serde_json::Value>,
    pub restored: serde_json::Value,
    pub wall_s: f64,
}

impl ConfigResult {
    /// The step that holds exactly `data` value bytes or the first above.
    pub fn step_at(&self, data: u64) -> Option<&Step> {
        self.steps.iter().find(|s| s.data_bytes >= data)
    }
}

/// A configuration that could not run, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    pub config: KvConfig,
    pub reason: String,
}

/// zmem against the others, with the targets.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Ratios {
    /// Data at OOM, zmem / zram (a lower bound when zmem reached --max-data).
    pub data_zmem_over_zram: Option<f64>,
    pub data_zmem_over_noswap: Option<f64>,
    pub data_zram_over_noswap: Option<f64>,
    /// True when zmem never ran out of memory (the ratios are lower bounds).
    pub zmem_reached_max_data: bool,
    /// GET ops/s zmem / zram at the first step of at least twice --limit.
    pub get_at_twice_limit_zmem_over_zram: Option<f64>,
    pub get_at_twice_limit_data: u64,
    /// Issue 13: GET ops/s of the SSD configurations at the first step of at least 4x --limit,
    /// and zmem-ssd / swapfile.
    pub get_at_4x_limit_data: u64,
    pub get_at_4x_limit_swapfile: Option<f64>,
    pub get_at_4x_limit_zmem_ssd: Option<f64>,
    pub get_at_4x_limit_zmem_ssd_over_swapfile: Option<f64>,
    pub targets: serde_json::Value,
}

pub fn ratios(results: &[ConfigResult], limit: u64) -> Ratios {
    let find = |c: KvConfig| results.iter().find(|r| r.config == c);
    let (n, z, m) = (
        find(KvConfig::Noswap),
        find(KvConfig::Zram),
        find(KvConfig::Zmem),
    );
    let div = |a: u64, b: u64| (b > 0).then(|| a as f64 / b as f64);
    let twice = 2 * limit;
    let get_at = |r: &ConfigResult| r.step_at(twice).and_then(|s| s.get_ops_s);
    let four = 4 * limit;
    let get_at_4x = |c: KvConfig| find(c)?.step_at(four)?.get_ops_s;
    let (sf, zs) = (get_at_4x(KvConfig::Swapfile), get_at_4x(KvConfig::ZmemSsd));
    Ratios {
        data_zmem_over_zram: m.zip(z).and_then(|(m, z)| div(m.data_held, z.data_held)),
        data_zmem_over_noswap: m.zip(n).and_then(|(m, n)| div(m.data_held, n.data_held)),
        data_zram_over_noswap: z.zip(n).and_then(|(z, n)| div(z.data_held, n.data_held)),
        zmem_reached_max_data: m.is_some_and(|m| m.data_at_oom.is_none()),
        get_at_twice_limit_zmem_over_zram: m
            .zip(z)
            .and_then(|(m, z)| Some(get_at(m)? / get_at(z)?).filter(|v| v.is_finite())),
        get_at_twice_limit_data: twice,
        get_at_4x_limit_data: four,
        get_at_4x_limit_swapfile: sf,
        get_at_4x_limit_zmem_ssd: zs,
        get_at_4x_limit_zmem_ssd_over_swapfile: zs
            .zip(sf)
            .map(|(z, s)| z / s)
            .filter(|v| v.is_finite()),
        targets: serde_json::json!({
            "data_zmem_over_zram": TARGET_DATA_VS_ZRAM,
            "data_zmem_over_noswap": TARGET_DATA_VS_NOSWAP,
            "get_at_twice_limit_zmem_over_zram": TARGET_GET_VS_ZRAM,
            "get_at_4x_limit_zmem_ssd_over_swapfile": TARGET_GET_SSD_VS_SWAPFILE,
        }),
    }
}

pub(super) fn stop_str(s: &Stop) -> String {
    match s.kind.as_str() {
        "max-data" => "no OOM up to --max-data".into(),
        k => format!("{k} while loading up to {}", format_mib(s.at_data)),
    }
}

fn kops(v: f64) -> String {
    if v >= 10_000.0 {
        format!("{:.0}k", v / 1000.0)
    } else {
        format!("{v:.0}")
    }
}

/// Per configuration: what it is, the data it held, how it ended.
pub fn summary_table(plan: &Plan, results: &[ConfigResult], skipped: &[Skipped]) -> String {
    let header: Vec<String> = [
        &format!("{} {}", plan.server, plan.server_version),
        "DRAM",
        "data at OOM",
        "stop",
        "peak cgroup MiB",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let peak = r
                .steps
                .iter()
                .filter_map(|s| s.cgroup_max_usage)
                .max()
                .map_or("-".into(), |v| format!("{:.0}", v as f64 / MIB as f64));
            vec![
                format!("{}: {}", r.config.as_str(), r.description),
                format_size(r.dram_total),
                match r.data_at_oom {
                    Some(d) => format_mib(d),
                    None => format!(">= {}", format_mib(r.data_held)),
                },
                stop_str(&r.stop),
                peak,
            ]
        })
        .collect();
    for s in skipped {
        rows.push(vec![
            s.config.as_str().to_string(),
            "-".into(),
            "-".into(),
            format!("not run: {}", one_line(&s.reason, 70)),
            "-".into(),
        ]);
    }
    text_table(&header, &rows)
}

fn one_line(s: &str, max: usize) -> String {
    let s = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if s.chars().count() > max {
        let t: String = s.chars().take(max).collect();
        format!("{t}...")
    } else {
        s
    }
}

/// Rows of data size, per configuration SET ops/s, GET ops/s and cgroup MiB; "OOM" at the step
/// a configuration did not finish.
pub fn step_table(results: &[ConfigResult]) -> String {
    let mut sizes: Vec<u64> = results
        .iter()
        .flat_map(|r| {
            r.steps
                .iter()
                .map(|s| s.data_bytes)
                .chain((r.stop.kind != "max-data").then_some(r.stop.at_data))
        })
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let mut header = vec!["data MiB".to_string()];
    for r in results {
        let c = r.config.as_str();
        header.extend([
            format!("{c} SET/s"),
            format!("{c} GET/s"),
            format!("{c} MiB"),
        ]);
    }
    let rows = sizes
        .iter()
        .map(|&d| {
            let mut row = vec![format!("{:.0}", d as f64 / MIB as f64)];
            for r in results {
                if let Some(s) = r.steps.iter().find(|s| s.data_bytes == d) {
                    row.push(kops(s.set_ops_s));
                    row.push(s.get_ops_s.map_or("-".into(), kops));
                    row.push(
                        s.cgroup_usage
                            .map_or("-".into(), |u| format!("{:.0}", u as f64 / MIB as f64)),
                    );
                } else if r.stop.kind != "max-data" && r.stop.at_data == d {
                    let tag = match r.stop.kind.as_str() {
                        "oom-killed" | "out-of-memory" | "zram-full" => "OOM",
                        "stalled" => "stall",
                        _ => "died",
                    };
                    row.extend([tag.to_string(), tag.to_string(), "-".into()]);
                } else {
                    row.extend(["".into(), "".into(), "".into()]);
                }
            }
            row
        })
        .collect::<Vec<_>>();
    text_table(&header, &rows)
}

/// The issues' targets of the configurations asked for: data at OOM zmem/zram and zmem/noswap,
/// GET ops/s at twice the limit (issue 10's zram configurations), GET ops/s at 4x the limit
/// zmem-ssd/swapfile (issue 13).
pub fn ratio_lines(plan: &Plan, r: &Ratios, results: &[ConfigResult]) -> String {
    let has = |c: KvConfig| results.iter().any(|x| x.config == c);
    let bound = if r.zmem_reached_max_data { ">= " } else { "" };
    // Why a ratio of `a` over `b` is missing.
    let why = |a: KvConfig, b: KvConfig| {
        let missing: Vec<&str> = [a, b]
            .iter()
            .filter(|c| !has(**c))
            .map(|c| c.as_str())
            .collect();
        if missing.is_empty() {
            "one of them did not reach that size".to_string()
        } else {
            format!("{} did not run", missing.join(" and "))
        }
    };
    let asked = |cs: &[KvConfig]| plan.configs.iter().any(|c| cs.contains(c));
    let mut lines = Vec::new();
    if asked(&[KvConfig::Noswap, KvConfig::Zram, KvConfig::Zmem]) {
        let held = |a, b| {
            let w = why(a, b);
            if w.ends_with("did not run") {
                w
            } else {
                "a configuration held nothing".into()
            }
        };
        lines.extend([
            format!(
                "data at OOM, zmem / zram:   {}",
                against_target(
                    r.data_zmem_over_zram,
                    TARGET_DATA_VS_ZRAM,
                    bound,
                    &held(KvConfig::Zmem, KvConfig::Zram)
                )
            ),
            format!(
                "data at OOM, zmem / noswap: {}",
                against_target(
                    r.data_zmem_over_noswap,
                    TARGET_DATA_VS_NOSWAP,
                    bound,
                    &held(KvConfig::Zmem, KvConfig::Noswap)
                )
            ),
            format!(
                "GET ops/s at {} (2x --limit), zmem / zram: {}",
                format_mib(2 * plan.limit),
                against_target(
                    r.get_at_twice_limit_zmem_over_zram,
                    TARGET_GET_VS_ZRAM,
                    "",
                    &why(KvConfig::Zmem, KvConfig::Zram)
                )
            ),
        ]);
        if let Some(v) = r.data_zram_over_noswap {
            lines.push(format!("data at OOM, zram / noswap: {v:.2}x"));
        }
    }
    if asked(&[KvConfig::Swapfile, KvConfig::ZmemSsd]) {
        let per = |c: KvConfig, v: Option<f64>| {
            let v = v.map_or("-".into(), |v| format!("{v:.0}"));
            format!("{} {v}", c.as_str())
        };
        lines.push(format!(
            "GET ops/s at {} (4x --limit): {}, {}; zmem-ssd / swapfile: {}",
            format_mib(r.get_at_4x_limit_data),
            per(KvConfig::Swapfile, r.get_at_4x_limit_swapfile),
            per(KvConfig::ZmemSsd, r.get_at_4x_limit_zmem_ssd),
            against_target(
                r.get_at_4x_limit_zmem_ssd_over_swapfile,
                TARGET_GET_SSD_VS_SWAPFILE,
                "",
                &why(KvConfig::ZmemSsd, KvConfig::Swapfile)
            )
        ));
    }
    lines.join("\n")
}

/// A ratio against its target ("1.23x (target >= 1.5: not met)"); `pre` is ">= " for a lower
/// bound; `missing` says why there is no ratio.
fn against_target(v: Option<f64>, target: f64, pre: &str, missing: &str) -> String {
    match v {
        Some(v) => format!(
            "{pre}{}x (target >= {target}: {})",
            // Two decimals, unless they round a miss up to the target (2.99997 is not 3).
            if v < target && (v * 100.0).round() / 100.0 >= target {
                format!("{v:.5}")
            } else {
                format!("{v:.2}")
            },
            if v >= target {
                "met"
            } else if pre.is_empty() {
                "not met"
            } else {
                "not met so far"
            }
        ),
        None => format!("n/a ({missing})"),
    }
}

/// SET and GET throughput against data size, one line per configuration, the OOM points marked.
pub fn plot(plan: &Plan, results: &[ConfigResult], path: &Path) -> anyhow::Result<()> {
    use plotters::prelude::*;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let colors = |c: KvConfig| match c {
        KvConfig::Noswap => RGBColor(127, 127, 127),
        KvConfig::Zram => RGBColor(31, 119, 180),
        KvConfig::Zmem => RGBColor(214, 39, 40),
        KvConfig::Swapfile => RGBColor(44, 160, 44),
        KvConfig::ZmemSsd => RGBColor(148, 103, 189),
    };
    let mib = |b: u64| b as f64 / MIB as f64;
    let xmax = results
        .iter()
        .flat_map(|r| {
            r.steps
                .iter()
                .map(|s| s.data_bytes)
                .chain(std::iter::once(r.stop.at_data))
        })
        .max()
        .unwrap_or(plan.step)
        .max(plan.step) as f64
        / MIB as f64
        * 1.3;
    let root = SVGBackend::new(path, (1200, 900)).into_drawing_area();
    root.fill(&WHITE)?;
    let (title, body) = root.split_vertically(40);
    let mut parts = Vec::new();
    if results.iter().any(|r| !r.config.is_ssd()) {
        parts.push(format!(
            "compressed {} (zram {} mem_limit / zmem store limit)",
            format_size(plan.compressed),
            plan.zram_alg
        ));
    }
    if let Some(ssd) = plan
        .ssd
        .as_ref()
        .filter(|_| results.iter().any(|r| r.config.is_ssd()))
    {
        parts.push(format!(
            "swap file / zmem log of {} on {} ({}), zmem-ssd store limit {}",
            format_size(ssd.size),
            ssd.dir.display(),
            ssd.file_system,
            format_size(ssd.store_limit)
        ));
    }
    title.titled(
        &format!(
            "{} {}: limit {}, {}",
            plan.server,
            plan.server_version,
            format_size(plan.limit),
            parts.join("; ")
        ),
        ("sans-serif", 20),
    )?;
    let panels = body.split_evenly((2, 1));
    type Getter = fn(&Step) -> Option<f64>;
    let kinds: [(&str, Getter); 2] = [
        ("SET", |s: &Step| Some(s.set_ops_s)),
        ("GET", |s: &Step| s.get_ops_s),
    ];
    for (panel, (name, get)) in panels.iter().zip(kinds) {
        let ymax = results
            .iter()
            .flat_map(|r| r.steps.iter().filter_map(get))
            .fold(1.0f64, f64::max)
            * 1.15
            / 1000.0;
        let mut chart = ChartBuilder::on(panel)
            .caption(
                format!("{name} throughput vs data loaded"),
                ("sans-serif", 16),
            )
            .margin(15)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0f64..xmax, 0f64..ymax)?;
        chart
            .configure_mesh()
            .x_desc("data loaded (MiB of values)")
            .y_desc(format!("{name} kops/s"))
            .draw()?;
        for r in results {
            let color = colors(r.config);
            let pts: Vec<(f64, f64)> = r
                .steps
                .iter()
                .filter_map(|s| Some((mib(s.data_bytes), get(s)? / 1000.0)))
                .collect();
            chart
                .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
                .label(r.config.as_str())
                .legend(move |(x, y)| {
                    PathElement::new([(x, y), (x + 16, y)], color.stroke_width(2))
                });
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
            if r.stop.kind != "max-data" {
                let x = mib(r.stop.at_data);
                let y = pts.last().map_or(0.0, |p| p.1);
                let label = format!(
                    "{} {} loading to {:.0} MiB (held {:.0})",
                    r.config.as_str(),
                    stop_tag(&r.stop),
                    x,
                    mib(r.data_held)
                );
                let style = ("sans-serif", 13).into_font().color(&color);
                chart.draw_series(std::iter::once(
                    EmptyElement::at((x, y))
                        + Cross::new((0, 0), 7, color.stroke_width(3))
                        + Text::new(label, (-110, -24), style),
                ))?;
            }
        }
        legend(&mut chart, SeriesLabelPosition::UpperRight)?;
    }
    root.present()?;
    Ok(())
}

fn stop_tag(s: &Stop) -> &'static str {
    match s.kind.as_str() {
        "oom-killed" | "out-of-memory" | "zram-full" => "OOM",
        "stalled" => "stalled",
        _ => "died",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_miss_is_never_printed_as_the_target() {
        assert_eq!(
            against_target(Some(2.999_969), 3.0, "", "-"),
            "2.99997x (target >= 3: not met)"
        );
        assert_eq!(
            against_target(Some(3.0), 3.0, "", "-"),
            "3.00x (target >= 3: met)"
        );
        assert_eq!(
            against_target(Some(1.2354), 1.0, "", "-"),
            "1.24x (target >= 1: met)"
        );
        assert_eq!(
            against_target(Some(0.5), 1.0, ">= ", "-"),
            ">= 0.50x (target >= 1: not met so far)"
        );
        assert_eq!(
            against_target(None, 1.0, "", "zram did not run"),
            "n/a (zram did not run)"
        );
    }

    fn result(c: KvConfig, held: u64, oom: bool, gets: &[(u64, f64)]) -> ConfigResult {
        ConfigResult {
            config: c,
            description: String::new(),
            cgroup_limit: 0,
            dram_total: 0,
            command: vec![],
            server_pid: None,
            steps: gets
                .iter()
                .map(|&(d, g)| Step {
                    data_bytes: d,
                    keys: 0,
                    set_ops: 0,
                    set_s: 1.0,
                    set_ops_s: 1.0,
                    set_mb_s: 1.0,
                    gets: 1,
                    get_s: 1.0,
                    get_ops_s: Some(g),
                    get_mb_s: None,
                    server_rss: None,
                    server_swap: None,
                    cgroup_usage: None,
                    cgroup_max_usage: None,
                    cgroup_stat: BTreeMap::new(),
                    cgroup_failcnt: None,
                    zram: None,
                    server_stats: BTreeMap::new(),
                    zmem_get: None,
                })
                .collect(),
            data_held: held,
            data_at_oom: oom.then_some(held),
            stop: Stop {
                kind: if oom { "oom-killed" } else { "max-data" }.into(),
                at_data: held + 1,
                detail: String::new(),
            },
            oom_kills: 0,
            exit: None,
            server_log: String::new(),
            server_log_tail: vec![],
            server_log_key_lines: vec![],
            zram: None,
            zmem: None,
            swapfile: None,
            restored: serde_json::Value::Null,
            wall_s: 0.0,
        }
    }

    #[test]
    fn ratios_of_the_targets() {
        let rs = vec![
            result(KvConfig::Noswap, 200, true, &[(100, 10.0), (200, 10.0)]),
            result(KvConfig::Zram, 400, true, &[(256, 4.0), (512, 2.0)]),
            result(KvConfig::Zmem, 800, false, &[(256, 5.0), (512, 3.0)]),
        ];
        let r = ratios(&rs, 256);
        assert_eq!(r.data_zmem_over_zram, Some(2.0));
        assert_eq!(r.data_zmem_over_noswap, Some(4.0));
        assert_eq!(r.data_zram_over_noswap, Some(2.0));
        assert!(r.zmem_reached_max_data);
        assert_eq!(r.get_at_twice_limit_zmem_over_zram, Some(1.5));
        let only = ratios(&rs[..2], 256);
        assert_eq!(only.data_zmem_over_zram, None);
        assert_eq!(only.get_at_twice_limit_zmem_over_zram, None);
        assert_eq!(r.get_at_4x_limit_zmem_ssd_over_swapfile, None);
    }

    #[test]
    fn ssd_ratio_at_four_times_the_limit() {
        let rs = vec![
            result(
                KvConfig::Swapfile,
                1024,
                false,
                &[(512, 90.0), (1024, 20.0), (1100, 10.0)],
            ),
            result(
                KvConfig::ZmemSsd,
                1100,
                false,
                &[(512, 80.0), (1030, 40.0), (1100, 30.0)],
            ),
        ];
        let r = ratios(&rs, 256);
        assert_eq!(r.get_at_4x_limit_data, 1024);
        assert_eq!(r.get_at_4x_limit_swapfile, Some(20.0));
        assert_eq!(r.get_at_4x_limit_zmem_ssd, Some(40.0));
        assert_eq!(r.get_at_4x_limit_zmem_ssd_over_swapfile, Some(2.0));
        // A configuration that stopped below 4x the limit has no figure there.
        let short = ratios(&rs[..1], 512);
        assert_eq!(short.get_at_4x_limit_swapfile, None);
        assert_eq!(short.get_at_4x_limit_zmem_ssd_over_swapfile, None);
    }
}
