//! `zmem bench region`: the zmem side, the kernel side (in [`super::worker`]), the JSON.

use std::path::Path;

use anyhow::Context;
use zmem_engine::Policy;
use zmem_region::{Budget, Region, RegionConfig, RegionStats};

use super::driver::{run_workload, Driver, FaultCounter, Lat, Mem};
use super::report::{eviction_line, plot, side_table};
use super::side::{EvictionComparison, FaultBreakdown, MemoryUse, SideResult, Skipped};
use super::{EvictionArg, RegionArgs, Workload};
use crate::corpus::{default_corpus, Corpus};
use crate::report::{corpus_info, write_json, MachineInfo};
use zmem_runenv::size::format_size;

/// The zmem side: a region of `w.size` bytes with a fixed budget of `w.resident`.
pub fn run_zmem(
    args: &RegionArgs,
    w: &Workload,
    corpus: &Corpus,
    eviction: EvictionArg,
) -> anyhow::Result<SideResult> {
    let policy: Policy = args.policy.parse()?;
    let label = format!("zmem-{}", eviction.as_str());
    let mut cfg = RegionConfig::new(w.size, Budget::Fixed(w.resident));
    cfg.policy = policy;
    cfg.eviction = eviction.eviction();
    if let Some(f) = args.fault_around {
        cfg.fault_around = f;
    }
    if let Some(h) = args.handler_threads {
        cfg.handler_threads = h;
    }
    if let Some(us) = args.handler_spin_us {
        cfg.handler_spin_us = us;
    }
    cfg.colocate = !args.no_colocate;
    cfg.async_settle = !args.no_async_settle;
    cfg.clean_copies = zmem_region::CleanCopies::parse(&args.clean_copies).unwrap_or_default();
    let route = resolve_fault_route(&args.fault_route);
    cfg.fault_route = zmem_region::FaultRoute::parse(route).unwrap_or_default();
    let (fault_around, handler_threads) = (cfg.fault_around, cfg.handler_threads);
    let mut driver = Driver::new(w, corpus, &label, FaultCounter::Any);
    let region = Region::new(cfg).with_context(|| {
        format!(
            "{label}: creating a {} region with a {} budget",
            format_size(w.size),
            format_size(w.resident)
        )
    })?;
    if region.as_ptr().is_null() || (region.len() as u64) < w.size {
        anyhow::bail!(
            "{label}: the region maps {} bytes at {:p}, expected {}",
            region.len(),
            region.as_ptr(),
            w.size
        );
    }
    // SAFETY: the region maps at least w.size bytes read-write from as_ptr() (checked above),
    // page-aligned, until it is dropped at the end of this function, after the workload's
    // threads have all joined; nothing else touches it.
    let mem = unsafe { Mem::new(region.as_ptr(), w.pages()) };
    eprintln!("zmem: {label}: {}", w.describe());
    let m = run_workload(&mut driver, mem, || Ok(()), || Ok(region.stats()))?;
    let (s0, s1): (&RegionStats, &RegionStats) = (&m.before, &m.after);
    let faults = s1.faults().saturating_sub(s0.faults());
    let memory = MemoryUse::new(
        w.size,
        s1.resident,
        s1.staged,
        s1.store.mem_used_total,
        s1.store.orig_data_size,
        s1.store.compr_data_size,
    );
    let d = |a: u64, b: u64| a.saturating_sub(b);
    let detail = serde_json::json!({
        "policy": policy.to_string(),
        "eviction": eviction.as_str(),
        "fault_around": fault_around,
        "handler_threads": handler_threads,
        "handler_spin_us": args.handler_spin_us,
        "colocate": !args.no_colocate,
        "async_settle": !args.no_async_settle,
        "clean_copies": args.clean_copies,
        "fault_route": route,
        "clean_evictions": d(s1.clean_evictions, s0.clean_evictions),
        "colocations": d(s1.colocations, s0.colocations),
        "budget": s1.budget,
        "measured_phase": {
            "major_faults": d(s1.major_faults, s0.major_faults),
            "zero_faults": d(s1.zero_faults, s0.zero_faults),
            "staged_faults": d(s1.staged_faults, s0.staged_faults),
            "fault_around_pages": d(s1.fault_around_pages, s0.fault_around_pages),
            "evictions": d(s1.evictions, s0.evictions),
            "direct_evictions": d(s1.direct_evictions, s0.direct_evictions),
        },
        "region_effective_ratio": s1.effective_ratio(),
        "stats_after": s1,
    });
    let mut r = SideResult::new(&label, "zmem", w, m.report, faults, memory, detail);
    r.handler_fault_latency = Some(Lat::from_region(&s1.fault_latency));
    r.fault_breakdown =
        FaultBreakdown::new(&s0.handler_time, &s1.handler_time, r.fault_latency.mean_us);
    drop(region);
    Ok(r)
}

/// `zmem bench region`.
pub fn run(args: &RegionArgs) -> anyhow::Result<()> {
    let w = Workload::from_args(args)?;
    let corpus_dir = args.corpus.clone().unwrap_or_else(default_corpus);
    let corpus = Corpus::load(&corpus_dir)?;
    if args.kernel_zram || args.kernel_only {
        // Checked before anything runs: a typo should not cost a zmem run first.
        anyhow::ensure!(
            !args.zram_alg.trim().is_empty(),
            "--zram-alg must name an algorithm"
        );
    }
    crate::abort::install_abort_handler();

    let mut results: Vec<SideResult> = Vec::new();
    let mut skipped: Vec<Skipped> = Vec::new();
    let mut outcome = run_sides(args, &w, &corpus, &corpus_dir, &mut results, &mut skipped);
    if outcome.is_ok() && results.is_empty() {
        let why: Vec<String> = skipped
            .iter()
            .map(|s| format!("{}: {}", s.label, s.reason))
            .collect();
        outcome = Err(anyhow::anyhow!("nothing was measured ({})", why.join("; ")));
    }

    let evictions = eviction_comparison(&results);
    if !results.is_empty() {
        println!("{}", side_table(&results, &w));
        if let Some(e) = &evictions {
            println!("{}", eviction_line(e, &w));
        }
    }
    let doc = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "args": args,
        "machine": MachineInfo::collect(),
        "corpus": corpus_info(&corpus),
        "workload": w,
        "results": results,
        "skipped": skipped,
        "eviction_comparison": evictions,
        "error": outcome.as_ref().err().map(|e| format!("{e:#}")),
    });
    write_json(&args.json, &doc)?;
    eprintln!("zmem: wrote {}", args.json.display());
    if !results.is_empty() {
        plot(&results, &w, &args.plot)
            .with_context(|| format!("drawing {}", args.plot.display()))?;
        eprintln!("zmem: wrote {}", args.plot.display());
    }
    outcome
}

pub(super) fn run_sides(
    args: &RegionArgs,
    w: &Workload,
    corpus: &Corpus,
    corpus_dir: &Path,
    results: &mut Vec<SideResult>,
    skipped: &mut Vec<Skipped>,
) -> anyhow::Result<()> {
    // The kernel side first: its worker is spawned before this process has any region threads.
    if args.kernel_zram || args.kernel_only {
        match super::worker::run_kernel(args, w, corpus_dir)? {
            super::worker::KernelOutcome::Ran(r) => {
                eprintln!("  {}", r.summary());
                results.push(*r);
            }
            super::worker::KernelOutcome::Skipped(reason) => {
                if args.kernel_only {
                    eprintln!("zmem: kernel side skipped: {reason}");
                } else {
                    eprintln!("zmem: kernel side skipped: {reason}; running zmem alone");
                }
                skipped.push(Skipped {
                    label: "kernel-zram".into(),
                    reason,
                });
            }
        }
    }
    if args.kernel_only {
        return Ok(());
    }
    let evictions = if args.compare_eviction {
        vec![EvictionArg::Clock, EvictionArg::Fifo]
    } else {
        vec![args.eviction]
    };
    for ev in evictions {
        let r = run_zmem(args, w, corpus, ev)?;
        eprintln!("  {}", r.summary());
        results.push(r);
    }
    Ok(())
}

pub(super) fn eviction_comparison(results: &[SideResult]) -> Option<EvictionComparison> {
    let f = |l: &str| results.iter().find(|r| r.label == l);
    let (c, f) = (f("zmem-clock")?, f("zmem-fifo")?);
    Some(EvictionComparison::new(
        c.faults_per_access,
        f.faults_per_access,
    ))
}

/// `auto` as `zmem run` resolves it (signal with CAP_SYS_ADMIN, else handler); the others as
/// given.
pub(crate) fn resolve_fault_route(route: &str) -> &str {
    match route {
        "auto" if zmem_os::caps::effective(zmem_os::caps::SYS_ADMIN) => "signal",
        "auto" => "handler",
        r => r,
    }
}
