//! What every benchmark reports through: the JSON file (with the machine and the corpus), text
//! tables, progress bars, the charts' common legend. Imports nothing from the benchmarks.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use anyhow::Context;
use plotters::coord::CoordTranslate;
use plotters::prelude::*;
use serde::Serialize;

use crate::corpus::Corpus;

/// Machine facts recorded in every JSON.
#[derive(Clone, Debug, Serialize)]
pub struct MachineInfo {
    pub nproc: usize,
    pub cpu_model: String,
    pub kernel: String,
}

impl MachineInfo {
    pub fn collect() -> Self {
        let nproc = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        MachineInfo {
            nproc,
            cpu_model,
            kernel: kernel_release(),
        }
    }
}

fn kernel_release() -> String {
    // SAFETY: utsname is plain old data; uname fills it and returns 0 on success.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: &mut uts is a valid pointer to a utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return "unknown".into();
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    format!(
        "{} {} {}",
        field(&uts.sysname),
        field(&uts.release),
        field(&uts.machine)
    )
}

/// Whether progress bars should be drawn (stderr is a terminal).
pub fn progress_enabled() -> bool {
    std::io::stderr().is_terminal()
}

/// A progress bar over `total` bytes on a terminal; hidden otherwise.
pub fn progress_bar(total: u64, msg: String) -> indicatif::ProgressBar {
    if !progress_enabled() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg:32} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(msg);
    pb
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

/// Plain text table: first column left-aligned, the others right-aligned.
pub fn text_table(header: &[String], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if i < w.len() {
                w[i] = w[i].max(c.chars().count());
            }
        }
    }
    let line = |r: &[String]| {
        r.iter()
            .enumerate()
            .map(|(i, c)| {
                let width = w.get(i).copied().unwrap_or(0);
                if i == 0 {
                    format!("{c:<width$}")
                } else {
                    format!("{c:>width$}")
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
    };
    let mut out = line(header);
    out.push('\n');
    out.push_str(&"-".repeat(out.chars().count().saturating_sub(1)));
    for r in rows {
        out.push('\n');
        out.push_str(&line(r));
    }
    out
}

/// The x-axis label of a grouped bar chart with one unit-wide slot per category: the
/// category's name at the slot's centre (x = i + 0.5), nothing at the other ticks.
pub fn slot_label<S: AsRef<str>>(names: &[S], x: f64) -> String {
    if (x.fract() - 0.5).abs() < 1e-6 {
        names
            .get(x.floor().max(0.0) as usize)
            .map(|s| s.as_ref().to_string())
            .unwrap_or_default()
    } else {
        String::new()
    }
}

/// Every chart's legend: a white box with a black border, at `pos`.
pub fn legend<'a, CT: CoordTranslate>(
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    pos: SeriesLabelPosition,
) -> anyhow::Result<()> {
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(pos)
        .draw()?;
    Ok(())
}

/// The legend of a one-chart SVG, then the file is written out.
pub fn finish_chart<'a, CT: CoordTranslate>(
    root: &DrawingArea<SVGBackend<'a>, plotters::coord::Shift>,
    chart: &mut ChartContext<'a, SVGBackend<'a>, CT>,
    pos: SeriesLabelPosition,
) -> anyhow::Result<()> {
    legend(chart, pos)?;
    root.present()?;
    Ok(())
}

/// One bar per series in each of `groups` unit-wide slots of a [`SlotAxis`] chart: series `j`
/// has the label `series[j]` and, in slot `i`, the height `value(j, i)` (None: no bar).
pub fn draw_grouped_bars<'a>(
    chart: &mut ChartContext<
        'a,
        SVGBackend<'a>,
        Cartesian2d<SlotAxis, plotters::coord::types::RangedCoordf64>,
    >,
    series: &[String],
    groups: usize,
    value: impl Fn(usize, usize) -> Option<f64>,
) -> anyhow::Result<()> {
    let w = 0.8 / series.len().max(1) as f64;
    for (j, label) in series.iter().enumerate() {
        let color = Palette99::pick(j).to_rgba();
        let bars: Vec<Rectangle<(f64, f64)>> = (0..groups)
            .filter_map(|i| {
                let x0 = i as f64 + 0.1 + j as f64 * w;
                Some(Rectangle::new(
                    [(x0, 0.0), (x0 + w, value(j, i)?)],
                    color.filled(),
                ))
            })
            .collect();
        chart
            .draw_series(bars)?
            .label(label.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    Ok(())
}

/// The x axis of a grouped bar chart: one unit-wide slot per category, a tick (and label, see
/// [`slot_label`]) at the centre of each.
pub struct SlotAxis(pub usize);

impl plotters::coord::ranged1d::Ranged for SlotAxis {
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let span = f64::from(limit.1 - limit.0);
        limit.0 + (span * value / self.0 as f64).round() as i32
    }

    fn key_points<H: plotters::coord::ranged1d::KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            return Vec::new();
        }
        (0..self.0).map(|i| i as f64 + 0.5).collect()
    }

    fn range(&self) -> std::ops::Range<f64> {
        0.0..self.0 as f64
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn slot_labels_name_each_category_at_its_centre_only() {
        let names = ["a", "b"];
        assert_eq!(super::slot_label(&names, 0.5), "a");
        assert_eq!(super::slot_label(&names, 1.5), "b");
        assert_eq!(super::slot_label(&names, 1.0), "");
        assert_eq!(super::slot_label(&names, 2.5), "");
    }
}
