//! The SVG timeline of `bench adaptive`.

use std::path::Path;

use anyhow::Context;
use plotters::prelude::*;

use crate::report::finish_chart;

use super::{Report, MIB};
use zmem_runenv::size::{format_size, format_size_mg};

/// Budget, resident (left axis) and MemAvailable with the reserve (right axis) against time,
/// the hog's interval shaded.
pub fn plot(r: &Report, path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mib = |b: u64| b as f64 / MIB as f64;
    let tmax = r.samples.last().map_or(1.0, |s| s.t).max(r.plan.duration_s);
    let ymax = r
        .samples
        .iter()
        .map(|s| s.budget.max(s.resident))
        .max()
        .unwrap_or(r.plan.max)
        .max(r.plan.max) as f64
        / MIB as f64
        * 1.15;
    let avail = r.samples.iter().map(|s| s.mem_available);
    let amin = avail.clone().min().unwrap_or(0).min(r.plan.reserve);
    let amax = avail.max().unwrap_or(1).max(r.plan.reserve);
    let pad = ((amax - amin) as f64 * 0.1).max(64.0 * MIB as f64);
    let (alo, ahi) = (
        (mib(amin) - pad / MIB as f64).max(0.0),
        mib(amax) + pad / MIB as f64,
    );

    let root = SVGBackend::new(path, (1200, 640)).into_drawing_area();
    root.fill(&WHITE)?;
    let caption = format!(
        "zmem adaptive budget: region {}, budget {}..{}, a hog takes {} (reserve {})",
        format_size(r.plan.size),
        format_size(r.plan.min),
        format_size(r.plan.max),
        format_size(r.plan.take),
        format_size_mg(r.plan.reserve)
    );
    let mut chart = ChartBuilder::on(&root)
        .caption(caption, ("sans-serif", 20))
        .margin(20)
        .x_label_area_size(45)
        .y_label_area_size(70)
        .right_y_label_area_size(80)
        .build_cartesian_2d(0f64..tmax, 0f64..ymax)?
        .set_secondary_coord(0f64..tmax, alo..ahi);
    chart
        .configure_mesh()
        .x_desc("seconds into the access phase")
        .y_desc("budget, resident (MiB)")
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;
    chart
        .configure_secondary_axes()
        .y_desc("MemAvailable (MiB)")
        .label_style(("sans-serif", 12).into_font().color(&RGBColor(214, 39, 40)))
        .y_label_formatter(&|v| format!("{v:.0}"))
        .draw()?;

    if let Some(s) = &r.summary {
        let x0 = s.hog_start_s;
        let x1 = s.hog_exit_s.unwrap_or(tmax);
        let shade = RGBColor(255, 150, 0).mix(0.15);
        chart
            .draw_series(std::iter::once(Rectangle::new(
                [(x0, 0.0), (x1, ymax)],
                shade.filled(),
            )))?
            .label(format!("hog holds {}", format_size(r.plan.take)))
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], shade.filled()));
    }
    let blue = RGBColor(31, 119, 180);
    let green = RGBColor(44, 160, 44);
    let red = RGBColor(214, 39, 40);
    chart
        .draw_series(LineSeries::new(
            r.samples.iter().map(|s| (s.t, mib(s.budget))),
            blue.stroke_width(2),
        ))?
        .label("budget")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], blue.stroke_width(2)));
    chart
        .draw_series(LineSeries::new(
            r.samples.iter().map(|s| (s.t, mib(s.resident))),
            green.stroke_width(1),
        ))?
        .label("resident")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], green.stroke_width(1)));
    chart
        .draw_secondary_series(LineSeries::new(
            r.samples.iter().map(|s| (s.t, mib(s.mem_available))),
            red.stroke_width(1),
        ))?
        .label("MemAvailable (right axis)")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], red.stroke_width(1)));
    let reserve = mib(r.plan.reserve);
    chart
        .draw_secondary_series(DashedLineSeries::new(
            [(0.0, reserve), (tmax, reserve)],
            8,
            5,
            red.mix(0.7).stroke_width(1),
        ))?
        .label("reserve (right axis)")
        .legend(move |(x, y)| PathElement::new([(x, y), (x + 6, y)], red.mix(0.7)));
    finish_chart(&root, &mut chart, SeriesLabelPosition::MiddleRight)
}
