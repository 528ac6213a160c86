//! `zmem bench heaps`: compression ratios on real program memory, not text corpora (issue 12
//! item 6). Redis, Python, Node and a JVM are loaded with real data ([`workloads`]), their
//! anonymous pages copied out while they run ([`capture`]), and those pages are written to
//! the kernel's zram and to a zmem store with each policy (every page read back and compared),
//! beside the bare libraries (lz4, zstd, deflate) on the same pages one by one, so a choice
//! tuned on Calgary cannot hurt real heaps unseen. `auto` is reported twice: as written
//! (lz4) and settled (after its idle recompression pass).
//!
//! Captures are kept in `--dir` (one directory per program, the pages in `heap.pages`, what
//! was captured in `PROGRAM.json` beside it) and reused until `--recapture`.

pub mod capture;
pub mod workloads;

use std::path::{Path, PathBuf};

use anyhow::Context;
use clap::Args;
use plotters::prelude::*;
use serde::Serialize;
use zmem_codec::Codec;

use crate::blockdev::BlockDevTarget;
use crate::codecs::library_compress;
use crate::corpus::Corpus;
use crate::kernel::zram::ZramSession;
use crate::pages::{self, PagesResult, PagesSpec, Rw};
use crate::process::ScratchDir;
use crate::report::{
    draw_grouped_bars, finish_chart, progress_bar, slot_label, text_table, write_json, MachineInfo,
    SlotAxis,
};
use crate::target::{PAGE, POLICIES};
use crate::zmem_target::{self, ZmemTargetConfig};
use capture::CaptureStats;
use workloads::{Missing, PROGRAMS};

#[derive(Debug, Clone, Args, Serialize)]
pub struct HeapsArgs {
    /// Programs whose heaps are measured, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "redis,python,node,java",
          value_parser = clap::builder::PossibleValuesParser::new(PROGRAMS))]
    pub programs: Vec<String>,
    /// Where captured heaps are kept (and reused by later runs).
    #[arg(long, default_value = "bench-out/heaps")]
    pub dir: PathBuf,
    /// Capture again even where a capture exists.
    #[arg(long)]
    pub recapture: bool,
    /// The data the programs are loaded with [default: ../shared/corpora/silesia or
    /// /work/shared/corpora/silesia]: needs dickens, xml and samba.
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Size of the data set relative to the default (about 150-250 MiB of heap per program).
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// zmem policies, comma separated.
    #[arg(long, value_delimiter = ',', default_value = "fast,balanced,max,auto",
          value_parser = clap::builder::PossibleValuesParser::new(POLICIES))]
    pub policies: Vec<String>,
    /// zram algorithm of the kernel's column (skipped where zram cannot be used: not root, no
    /// /dev/zram0, or the device busy).
    #[arg(long, default_value = "lz4")]
    pub zram_alg: String,
    /// No kernel zram column.
    #[arg(long)]
    pub no_kernel: bool,
    #[arg(long, default_value = "bench-out/heaps.json")]
    pub json: PathBuf,
    #[arg(long, default_value = "bench-out/heaps.svg")]
    pub svg: PathBuf,
}

/// The bare library calls on every page alone (a page that does not shrink counts at 4096, as
/// any store keeps it raw), and zstd-1 on 64 KiB runs of pages for the block ratio.
const BARE: [(&str, Codec, usize); 5] = [
    ("lz4", Codec::LZ4, 1),
    ("zstd-1", Codec::Zstd { level: 1 }, 1),
    ("zstd-3", Codec::Zstd { level: 3 }, 1),
    ("deflate-1", Codec::Deflate { level: 1 }, 1),
    ("zstd-1 64k", Codec::Zstd { level: 1 }, 16),
];

/// Where a program's capture lives.
fn capture_paths(dir: &Path, program: &str) -> (PathBuf, PathBuf) {
    (dir.join(program), dir.join(format!("{program}.json")))
}

/// What a capture file says about itself.
#[derive(Clone, Debug, Serialize, serde::Deserialize)]
pub struct CaptureInfo {
    pub program: String,
    pub command: String,
    /// The program's ready line (or how it was loaded).
    pub note: String,
    pub scale: f64,
    pub stats: CaptureStats,
    pub seconds: f64,
}

/// One column of one heap's row.
#[derive(Clone, Debug, Serialize)]
pub struct Column {
    pub label: String,
    /// orig / memory used (zram's mem_used_total; bytes for the bare codecs).
    pub ratio: f64,
    /// The page run of the target (None for the bare codecs).
    pub run: Option<PagesResult>,
}

#[derive(Clone, Debug, Serialize)]
pub struct HeapResult {
    pub program: String,
    pub capture: CaptureInfo,
    pub bytes: u64,
    pub columns: Vec<Column>,
}

impl HeapResult {
    fn ratio(&self, label: &str) -> Option<f64> {
        self.columns
            .iter()
            .find(|c| c.label == label)
            .map(|c| c.ratio)
    }
}

/// The silesia corpus beside the calgary one [`crate::corpus::default_corpus`] finds.
pub fn default_data() -> PathBuf {
    ["../shared/corpora/silesia", "/work/shared/corpora/silesia"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .unwrap_or_else(|| PathBuf::from("../shared/corpora/silesia"))
}

pub fn run(args: &HeapsArgs) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.scale > 0.0 && args.scale <= 16.0,
        "--scale {} is out of range (0, 16]",
        args.scale
    );
    crate::abort::install_abort_handler();
    let data = args.data.clone().unwrap_or_else(default_data);
    for f in ["dickens", "xml", "samba"] {
        anyhow::ensure!(
            data.join(f).is_file(),
            "the programs' data {} lacks {f} (give Silesia's directory with --data)",
            data.display()
        );
    }
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;

    let mut results = Vec::new();
    let mut skipped: Vec<(String, String)> = Vec::new();
    for program in &args.programs {
        crate::abort::check_abort()?;
        let info = match obtain(args, &data, program) {
            Ok(info) => info,
            Err(e) if e.downcast_ref::<crate::abort::Interrupted>().is_some() => return Err(e),
            Err(e) => {
                // Not installed, or it failed to load its data (a JRE without the compiler
                // the single-file launcher needs, say): the other heaps are still measured.
                let why = if e.downcast_ref::<Missing>().is_some() {
                    e.to_string()
                } else {
                    format!("capturing its heap failed: {e:#}")
                };
                eprintln!("zmem: {program} skipped: {why}");
                skipped.push((program.clone(), why));
                continue;
            }
        };
        results.push(
            measure(args, program, info).with_context(|| format!("measuring {program}'s heap"))?,
        );
    }
    anyhow::ensure!(
        !results.is_empty(),
        "no heap was measured ({})",
        skipped
            .iter()
            .map(|(p, why)| format!("{p}: {why}"))
            .collect::<Vec<_>>()
            .join("; ")
    );
    let table = ratio_table(&results);
    println!("{table}");
    for (p, why) in &skipped {
        println!("{p}: skipped ({why})");
    }
    let zstd = target_line(&results);
    println!("{zstd}");

    let doc = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "args": args,
        "machine": MachineInfo::collect(),
        "results": results,
        "skipped": skipped,
        "table": table,
    });
    write_json(&args.json, &doc)?;
    eprintln!("zmem: wrote {}", args.json.display());
    plot(&results, &args.svg).with_context(|| format!("drawing {}", args.svg.display()))?;
    eprintln!("zmem: wrote {}", args.svg.display());
    Ok(())
}

/// The capture of `program`: the one kept in `--dir`, or a new one.
fn obtain(args: &HeapsArgs, data: &Path, program: &str) -> anyhow::Result<CaptureInfo> {
    let (pages_dir, meta) = capture_paths(&args.dir, program);
    let pages_file = pages_dir.join("heap.pages");
    if !args.recapture && pages_file.is_file() {
        if let Ok(info) = std::fs::read(&meta)
            .map_err(anyhow::Error::from)
            .and_then(|b| Ok(serde_json::from_slice::<CaptureInfo>(&b)?))
        {
            eprintln!(
                "zmem: {program}: the capture in {} ({} pages; --recapture to take a new one)",
                pages_dir.display(),
                info.stats.kept_pages
            );
            return Ok(info);
        }
    }
    std::fs::create_dir_all(&pages_dir)
        .with_context(|| format!("creating {}", pages_dir.display()))?;
    let scratch = ScratchDir::create(&format!("heaps-{program}"))?;
    eprintln!(
        "zmem: {program}: loading it with data from {}",
        data.display()
    );
    let t0 = std::time::Instant::now();
    let running = workloads::start(program, data, args.scale, scratch.path())?;
    let stats = capture::capture(running.pid(), &pages_file)?;
    let info = CaptureInfo {
        program: program.to_string(),
        command: running.command.clone(),
        note: running.note.clone(),
        scale: args.scale,
        stats,
        seconds: t0.elapsed().as_secs_f64(),
    };
    drop(running);
    anyhow::ensure!(
        info.stats.kept_pages > 0,
        "{program} had no non-zero anonymous page ({:?})",
        info.stats
    );
    write_json(&meta, &serde_json::to_value(&info)?)?;
    eprintln!(
        "zmem: {program}: captured {} pages ({} zero pages left out) in {:.1} s",
        info.stats.kept_pages, info.stats.zero_pages, info.seconds
    );
    Ok(info)
}

/// Every column of one heap.
fn measure(args: &HeapsArgs, program: &str, capture: CaptureInfo) -> anyhow::Result<HeapResult> {
    let (pages_dir, _) = capture_paths(&args.dir, program);
    let corpus = Corpus::load(&pages_dir)?;
    let bytes = corpus.len() / PAGE as u64 * PAGE as u64;
    anyhow::ensure!(bytes > 0, "{} holds less than a page", pages_dir.display());
    let data = &corpus.bytes()[..bytes as usize];
    let mut columns = Vec::new();
    for (label, codec, pages) in BARE {
        columns.push(Column {
            label: label.to_string(),
            ratio: bare_ratio(data, codec, pages * PAGE, &format!("{program}: {label}"))?,
            run: None,
        });
    }
    let spec = PagesSpec {
        rw: Rw::Write,
        bs: PAGE,
        jobs: 1,
        size: bytes,
        verify: true,
    };
    if !args.no_kernel {
        match ZramSession::acquire(0) {
            Ok(mut session) => {
                session.configure(&args.zram_alg, bytes)?;
                let target = BlockDevTarget::open(&session.device())?;
                let run = verified_write(&target, &corpus, &spec)?;
                columns.push(Column {
                    label: format!("zram-{}", args.zram_alg),
                    ratio: run.ratio_mem_used.unwrap_or(0.0),
                    run: Some(run),
                });
            }
            Err(e) => eprintln!("zmem: the kernel's zram column skipped: {e}"),
        }
    }
    for policy in &args.policies {
        let target = zmem_target::open(&ZmemTargetConfig {
            size: bytes,
            policy: policy.clone(),
            block: None,
            mem_limit: None,
            backend: crate::offload::BackendKind::Cpu,
        })?;
        let run = verified_write(target.as_ref(), &corpus, &spec)?;
        let settled = run.settled.as_ref().and_then(|s| s.ratio_mem_used);
        columns.push(Column {
            label: format!("zmem-{policy}"),
            ratio: run.ratio_mem_used.unwrap_or(0.0),
            run: Some(run.clone()),
        });
        if let Some(r) = settled {
            columns.push(Column {
                label: format!("zmem-{policy} settled"),
                ratio: r,
                run: None,
            });
        }
    }
    Ok(HeapResult {
        program: program.to_string(),
        capture,
        bytes,
        columns,
    })
}

/// A write run of `spec`, then every page read back and compared (the run itself samples).
fn verified_write(
    target: &dyn crate::target::PageTarget,
    corpus: &Corpus,
    spec: &PagesSpec,
) -> anyhow::Result<PagesResult> {
    let mut run = pages::run(target, corpus, spec)?;
    run.verified_bytes += pages::verify_contents(target, corpus, spec)?;
    Ok(run)
}

/// orig / compressed bytes of the bare library call on every `unit` bytes of `data` alone
/// (a unit that does not shrink counts whole).
fn bare_ratio(data: &[u8], codec: Codec, unit: usize, what: &str) -> anyhow::Result<f64> {
    let mut out = vec![0u8; zstd_safe::compress_bound(unit).max(2 * unit) + 1024];
    let pb = progress_bar(data.len() as u64, what.to_string());
    let mut stored = 0u64;
    for chunk in data.chunks(unit) {
        let n = library_compress(codec, chunk, &mut out)?;
        stored += n.min(chunk.len()) as u64;
        pb.inc(chunk.len() as u64);
    }
    pb.finish_and_clear();
    Ok(data.len() as f64 / stored.max(1) as f64)
}

/// Rows: heaps, then all heaps together (by bytes); columns: ratios.
pub fn ratio_table(results: &[HeapResult]) -> String {
    let labels: Vec<String> = results
        .first()
        .map(|r| r.columns.iter().map(|c| c.label.clone()).collect())
        .unwrap_or_default();
    let mut header = vec![
        "orig/DRAM".to_string(),
        "pages".into(),
        "zero left out".into(),
    ];
    header.extend(labels.iter().cloned());
    let mut rows: Vec<Vec<String>> = results
        .iter()
        .map(|r| {
            let mut row = vec![
                r.program.clone(),
                format!("{:.1}M", r.bytes as f64 / (1u64 << 20) as f64),
                r.capture.stats.zero_pages.to_string(),
            ];
            row.extend(
                labels
                    .iter()
                    .map(|l| r.ratio(l).map_or("-".into(), |x| format!("{x:.3}"))),
            );
            row
        })
        .collect();
    if results.len() > 1 {
        // All heaps together: total bytes over total DRAM of each column.
        let total: u64 = results.iter().map(|r| r.bytes).sum();
        let mut row = vec![
            "all".to_string(),
            format!("{:.1}M", total as f64 / (1u64 << 20) as f64),
            results
                .iter()
                .map(|r| r.capture.stats.zero_pages)
                .sum::<u64>()
                .to_string(),
        ];
        for l in &labels {
            let dram: Option<f64> = results
                .iter()
                .map(|r| r.ratio(l).map(|x| r.bytes as f64 / x))
                .sum();
            row.push(dram.map_or("-".into(), |d| format!("{:.3}", total as f64 / d)));
        }
        rows.push(row);
    }
    text_table(&header, &rows)
}

/// The target on real heaps: `auto` settled >= 1.1x bare zstd-1 per 4 KiB page.
fn target_line(results: &[HeapResult]) -> String {
    let parts: Vec<String> = results
        .iter()
        .filter_map(|r| {
            let (a, z) = (r.ratio("zmem-auto settled")?, r.ratio("zstd-1")?);
            Some(format!("{} {:.2}x", r.program, a / z))
        })
        .collect();
    if parts.is_empty() {
        "auto settled / bare zstd-1 per page: not measured (auto not among the policies)".into()
    } else {
        format!(
            "auto settled / bare zstd-1 per page (target >= 1.1x): {}",
            parts.join(", ")
        )
    }
}

/// Grouped bars: one group per heap, one bar per column.
fn plot(results: &[HeapResult], path: &Path) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let names: Vec<String> = results.iter().map(|r| r.program.clone()).collect();
    let labels: Vec<String> = results
        .first()
        .map(|r| r.columns.iter().map(|c| c.label.clone()).collect())
        .unwrap_or_default();
    let ymax = results
        .iter()
        .flat_map(|r| r.columns.iter().map(|c| c.ratio))
        .fold(1.0f64, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, (1400, 720)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            "Real heaps: bytes per byte of DRAM (bare codecs per page, zram, zmem)",
            ("sans-serif", 22),
        )
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(SlotAxis(names.len().max(1)), 0f64..ymax)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_label_formatter(&|x| slot_label(&names, *x))
        .x_desc("program")
        .y_desc("orig / DRAM")
        .draw()?;
    draw_grouped_bars(&mut chart, &labels, results.len(), |j, i| {
        results[i].ratio(&labels[j])
    })?;
    finish_chart(&root, &mut chart, SeriesLabelPosition::UpperRight)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bare_ratios_count_pages_that_do_not_shrink_whole() {
        // Half pages of one byte repeated, half pseudo-random: the random half stays at 4096.
        let mut data = vec![7u8; 4 * PAGE];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for b in &mut data[2 * PAGE..] {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            *b = x as u8;
        }
        for (_, codec, pages) in BARE {
            let r = bare_ratio(&data, codec, pages * PAGE, "test").unwrap();
            assert!(r > 1.9 && r < 2.0, "{codec:?}: {r}");
        }
    }

    fn result(program: &str, bytes: u64, ratios: &[(&str, f64)]) -> HeapResult {
        HeapResult {
            program: program.into(),
            capture: CaptureInfo {
                program: program.into(),
                command: String::new(),
                note: String::new(),
                scale: 1.0,
                stats: CaptureStats::default(),
                seconds: 0.0,
            },
            bytes,
            columns: ratios
                .iter()
                .map(|(l, r)| Column {
                    label: l.to_string(),
                    ratio: *r,
                    run: None,
                })
                .collect(),
        }
    }

    #[test]
    fn the_all_row_weighs_heaps_by_their_bytes() {
        let rs = [
            result("a", 1 << 20, &[("zstd-1", 2.0), ("zmem-auto settled", 2.5)]),
            result("b", 3 << 20, &[("zstd-1", 4.0), ("zmem-auto settled", 4.0)]),
        ];
        let t = ratio_table(&rs);
        // 4 MiB over 0.5 + 0.75 MiB = 3.2; over 0.4 + 0.75 MiB = 3.478.
        let all = t
            .lines()
            .find(|l| l.trim_start().starts_with("all"))
            .unwrap();
        assert!(all.contains("3.200") && all.contains("3.478"), "{t}");
        assert_eq!(
            target_line(&rs),
            "auto settled / bare zstd-1 per page (target >= 1.1x): a 1.25x, b 1.00x"
        );
    }
}
