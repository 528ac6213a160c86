//! `zmem bench adaptive`: the run, its samples and their summary.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use anyhow::{bail, Context};
use zmem_engine::Policy;
use zmem_region::budget::read_machine;
use zmem_region::{AdaptiveConfig, Budget, Region, RegionConfig, RegionStats};

use super::hog::HogGuard;
use super::plot::plot;
use super::{
    check_args, plan, AdaptiveArgs, DecisionOut, HogState, PhaseOut, Plan, Report, Sample, Summary,
    REGROWN, SAMPLE,
};
use crate::abort::{aborted, Interrupted};
use crate::corpus::{default_corpus, Corpus};
use crate::report::{corpus_info, write_json, MachineInfo};
use crate::target::PAGE;
use rand::Rng;
use zmem_runenv::size::{format_size, format_size_mg};
use zmem_workload::{small_rng, Zipf};

pub(super) fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// Maps ranks to pages with `rank · mult mod pages` (a bijection), so hot pages are scattered.
pub(super) fn page_multiplier(pages: u64) -> u64 {
    const PRIME: u64 = 2_654_435_761;
    if gcd(PRIME, pages) == 1 {
        PRIME
    } else {
        1
    }
}

/// Writes every page of the region from the corpus.
pub(super) fn fill(region: &Region, corpus: &Corpus) -> anyhow::Result<f64> {
    let len = region.len() as u64;
    let pb = crate::report::progress_bar(len, format!("adaptive: fill {}", format_size(len)));
    let base = region.as_ptr() as usize;
    let mut buf = vec![0u8; PAGE];
    let t = Instant::now();
    for p in 0..len / PAGE as u64 {
        if p % 1024 == 0 {
            if aborted() {
                return Err(Interrupted.into());
            }
            pb.set_position(p * PAGE as u64);
        }
        corpus.fill(p * PAGE as u64, &mut buf);
        // SAFETY: the page is inside the region, which stays mapped while `region` lives; only
        // this thread touches the region during the fill.
        unsafe {
            std::ptr::copy_nonoverlapping(buf.as_ptr(), (base + p as usize * PAGE) as *mut u8, PAGE)
        };
    }
    pb.finish_and_clear();
    Ok(t.elapsed().as_secs_f64())
}

/// The access thread: zipf-like pages, `write_ratio` of them rewritten from the corpus, the
/// others read (one word per cache line). Counts accesses into `count` until `stop`.
pub(super) fn access_loop(
    region: &Region,
    corpus: &Corpus,
    zipf_s: f64,
    write_ratio: f64,
    stop: &AtomicBool,
    count: &AtomicU64,
) {
    let base = region.as_ptr() as usize;
    let pages = region.len() as u64 / PAGE as u64;
    let zipf = Zipf::continuous(pages, zipf_s);
    let mult = page_multiplier(pages);
    let mut rng = small_rng(0x7a6d_656d_ada9);
    let mut buf = vec![0u8; PAGE];
    let clen = corpus.len();
    let mut sink = 0u64;
    while !stop.load(Ordering::Relaxed) && !aborted() {
        for _ in 0..256 {
            let rank = zipf.sample(&mut rng) as u64;
            let p = ((u128::from(rank) * u128::from(mult)) % u128::from(pages)) as usize;
            let addr = base + p * PAGE;
            if rng.random::<f64>() < write_ratio {
                corpus.fill(rng.random::<u64>() % clen, &mut buf);
                // SAFETY: the page is inside the region, mapped while `region` lives; only this
                // thread accesses the region's memory during the access phase.
                unsafe { std::ptr::copy_nonoverlapping(buf.as_ptr(), addr as *mut u8, PAGE) };
            } else {
                for off in (0..PAGE).step_by(64) {
                    // SAFETY: as above; aligned u64 reads inside the page.
                    sink = sink.wrapping_add(unsafe {
                        std::ptr::read_volatile((addr + off) as *const u64)
                    });
                }
            }
        }
        count.fetch_add(256, Ordering::Relaxed);
    }
    std::hint::black_box(sink);
}

pub(super) fn refaults(s: &RegionStats) -> u64 {
    s.major_faults + s.staged_faults
}

pub fn run(a: &AdaptiveArgs) -> anyhow::Result<()> {
    check_args(a)?;
    let (_, _, avail) = read_machine()
        .map_err(|e| anyhow::anyhow!("bench adaptive needs PSI and MemAvailable: {e}"))?;
    let corpus_dir = a.corpus.clone().unwrap_or_else(default_corpus);
    let corpus = Corpus::load(&corpus_dir)?;
    let plan = plan(a, &corpus, avail)?;
    crate::abort::install_abort_handler();
    println!("{}", plan_line(&plan));

    let report = run_plan(a, &plan, &corpus)?;
    if let Some(s) = &report.summary {
        println!("{}", summary_text(&plan, s));
    }
    let doc = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "machine": MachineInfo::collect(),
        "corpus": corpus_info(&corpus),
        "result": report,
    });
    write_json(&a.json, &doc)?;
    eprintln!("zmem: wrote {}", a.json.display());
    plot(&report, &a.svg).with_context(|| format!("drawing {}", a.svg.display()))?;
    eprintln!("zmem: wrote {}", a.svg.display());
    if report.summary.is_none() {
        bail!("the hog never ran: no summary");
    }
    Ok(())
}

pub(super) fn plan_line(p: &Plan) -> String {
    let how = if p.reserve_from == "default" {
        format!(
            " = MemAvailable {} - region ~{} (lz4 ratio {:.2}) - take {} + deficit {}",
            format_size_mg(p.mem_available_start),
            format_size_mg(p.footprint_estimate),
            p.ratio_estimate,
            format_size(p.take),
            format_size_mg(p.deficit.max(0) as u64)
        )
    } else if p.deficit > 0 {
        format!(
            " (--reserve): the hog should push MemAvailable ~{} below it",
            format_size_mg(p.deficit as u64)
        )
    } else {
        format!(
            " (--reserve): the hog should leave MemAvailable ~{} above it",
            format_size_mg(p.deficit.unsigned_abs())
        )
    };
    format!(
        "adaptive: region {} budget {}..{} (fast); hog takes {} at {}s for {}s; run {}s; \
         reserve {}{}; the region can give back ~{}{}",
        format_size(p.size),
        format_size(p.min),
        format_size(p.max),
        format_size(p.take),
        p.at_s,
        p.hold_s,
        p.duration_s,
        format_size_mg(p.reserve),
        how,
        format_size_mg(p.freeable_estimate),
        if p.deficit > p.freeable_estimate as i64 {
            " (less than the deficit: expect the budget to reach --min)"
        } else {
            ""
        }
    )
}

pub(super) fn run_plan(a: &AdaptiveArgs, plan: &Plan, corpus: &Corpus) -> anyhow::Result<Report> {
    let mut cfg = AdaptiveConfig::new(plan.min, plan.max);
    cfg.reserve = plan.reserve;
    cfg.interval = a.interval;
    cfg.grow_cooldown = a.cooldown;
    let mut rcfg = RegionConfig::new(plan.size, Budget::Adaptive(cfg));
    rcfg.policy = Policy::Fast;
    let created = Instant::now();
    let region = Region::new(rcfg)?;
    let fill_s = fill(&region, corpus)?;

    let stop = AtomicBool::new(false);
    let count = AtomicU64::new(0);
    let t0 = Instant::now();
    let offset = t0.duration_since(created).as_secs_f64();
    let mut samples: Vec<Sample> = Vec::new();
    let mut hog: Option<HogGuard> = None;
    let outcome = std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("zmem-adaptive-access".into())
            .spawn_scoped(s, || {
                access_loop(&region, corpus, a.zipf_s, a.write_ratio, &stop, &count)
            });
        let res = match worker {
            Ok(_) => sample_loop(a, &region, &count, t0, &mut samples, &mut hog),
            Err(e) => Err(anyhow::Error::from(e).context("starting the access thread")),
        };
        stop.store(true, Ordering::Relaxed);
        res
    });
    outcome?;
    let decisions: Vec<DecisionOut> = region
        .budget_history()
        .into_iter()
        .map(|(t, d)| DecisionOut {
            t: t - offset,
            budget: d.budget,
            reason: format!("{:?}", d.reason),
            text: d.to_string(),
            pressure: d.pressure,
        })
        .collect();
    let summary = hog.as_ref().map(|h| {
        let e = h.events();
        summarize(
            plan, &samples, &decisions, h.start, e.ready, e.exit, e.touched,
        )
    });
    drop(hog);
    let st = region.stats();
    // The region's own statistics (one schema, serde), plus the figure the summary reads.
    let region_json = serde_json::json!({
        "stats": st,
        "effective_ratio": st.effective_ratio(),
    });
    Ok(Report {
        plan: plan.clone(),
        fill_s,
        samples,
        decisions,
        summary,
        region: region_json,
    })
}

pub(super) fn sample_loop(
    a: &AdaptiveArgs,
    region: &Region,
    count: &AtomicU64,
    t0: Instant,
    samples: &mut Vec<Sample>,
    hog: &mut Option<HogGuard>,
) -> anyhow::Result<()> {
    let base_refaults = refaults(&region.stats());
    let mut prev = (0.0f64, 0u64, 0u64);
    let mut next = t0;
    let mut printed = 0usize;
    eprintln!(
        "{:>6} {:>7} {:>8} {:>7} {:>6} {:>9} {:>9} {:>10}  decision",
        "t", "budget", "resident", "avail", "psi%", "refault/s", "access/s", "hog"
    );
    loop {
        next += SAMPLE;
        if let Some(d) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(d);
        }
        if aborted() {
            return Err(Interrupted.into());
        }
        let t = t0.elapsed();
        if hog.is_none() && t >= a.at {
            *hog = Some(HogGuard::spawn(a.take, a.hold, t0)?);
        }
        if let Some(h) = hog.as_mut() {
            h.poll()?;
        }
        let (avg10, _, avail) = read_machine()?;
        let st = region.stats();
        let ts = t.as_secs_f64();
        let acc = count.load(Ordering::Relaxed);
        let rf = refaults(&st) - base_refaults;
        let dt = (ts - prev.0).max(1e-3);
        let reason = region
            .budget_history()
            .last()
            .map(|(_, d)| format!("{:?}", d.reason));
        let sample = Sample {
            t: ts,
            budget: st.budget,
            resident: st.resident,
            staged: st.staged,
            pool: st.store.mem_used_total,
            mem_available: avail,
            psi_some_avg10: avg10,
            refaults_per_s: (rf - prev.2) as f64 / dt,
            accesses_per_s: (acc - prev.1) as f64 / dt,
            refaults: rf,
            accesses: acc,
            hog: hog.as_ref().map_or(HogState::None, HogGuard::state),
            reason,
        };
        prev = (ts, acc, rf);
        samples.push(sample);
        // One line per second: the last four samples' rates averaged.
        if samples.len() >= printed + 4 {
            let w = &samples[printed..];
            let n = w.len() as f64;
            let last = w.last().expect("non-empty");
            let hist = region.budget_history();
            let text = hist
                .last()
                .map(|(_, d)| d.reason.to_string())
                .unwrap_or_default();
            eprintln!(
                "{:>5.1}s {:>7} {:>8} {:>7} {:>6.2} {:>9.0} {:>9.0} {:>10}  {}",
                last.t,
                format_size_mg(last.budget),
                format_size_mg(last.resident),
                format_size_mg(last.mem_available),
                last.psi_some_avg10,
                w.iter().map(|s| s.refaults_per_s).sum::<f64>() / n,
                w.iter().map(|s| s.accesses_per_s).sum::<f64>() / n,
                format!("{:?}", last.hog).to_lowercase(),
                text
            );
            printed = samples.len();
        }
        if t >= a.duration {
            return Ok(());
        }
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) fn summarize(
    plan: &Plan,
    samples: &[Sample],
    decisions: &[DecisionOut],
    start: f64,
    ready: Option<f64>,
    exit: Option<f64>,
    touched: Option<u64>,
) -> Summary {
    let end = samples.last().map_or(0.0, |s| s.t);
    let hog_end = exit.unwrap_or(f64::INFINITY);
    let budget_before = samples
        .iter()
        .rev()
        .find(|s| s.t < start)
        .or(samples.first())
        .map_or(0, |s| s.budget);
    let during: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.t >= start && s.t <= hog_end)
        .collect();
    let lowest = during
        .iter()
        .map(|s| s.budget)
        .min()
        .unwrap_or(budget_before);
    let time_to_lowest = during
        .iter()
        .find(|s| s.budget == lowest)
        .map_or(0.0, |s| s.t - start);
    let below_reserve = during
        .iter()
        .find(|s| s.mem_available < plan.reserve)
        .map(|s| s.t);
    let at_exit = exit.and_then(|x| samples.iter().find(|s| s.t >= x).map(|s| s.budget));
    let target = (budget_before as f64 * REGROWN) as u64;
    let regrow = exit.and_then(|x| {
        samples
            .iter()
            .find(|s| s.t >= x && s.budget >= target)
            .map(|s| s.t - x)
    });
    let phase = |name: &'static str, from: f64, to: f64| -> Option<PhaseOut> {
        // Cumulative counters at the sample closest before each bound.
        let at = |t: f64| {
            samples
                .iter()
                .rev()
                .find(|s| s.t <= t)
                .map_or((0.0, 0, 0), |s| (s.t, s.accesses, s.refaults))
        };
        let inside: Vec<&Sample> = samples.iter().filter(|s| s.t > from && s.t <= to).collect();
        if inside.is_empty() {
            return None;
        }
        let (t1, a1, r1) = at(to);
        let (t0, a0, r0) = if from <= 0.0 { (0.0, 0, 0) } else { at(from) };
        let secs = (t1 - t0).max(1e-3);
        let n = inside.len() as u64;
        Some(PhaseOut {
            name,
            from_s: from,
            to_s: to,
            refaults_per_s: (r1 - r0) as f64 / secs,
            accesses_per_s: (a1 - a0) as f64 / secs,
            mean_budget: inside.iter().map(|s| s.budget).sum::<u64>() / n,
            mean_resident: inside.iter().map(|s| s.resident).sum::<u64>() / n,
            min_mem_available: inside.iter().map(|s| s.mem_available).min().unwrap_or(0),
            mean_psi_some_avg10: inside.iter().map(|s| s.psi_some_avg10).sum::<f64>() / n as f64,
        })
    };
    let phases: Vec<PhaseOut> = [
        phase("before", 0.0, start),
        phase("hog", start, hog_end.min(end)),
        exit.and_then(|x| phase("after", x, end)),
    ]
    .into_iter()
    .flatten()
    .collect();
    let mut counts: Vec<(String, usize)> = Vec::new();
    for d in decisions.iter().filter(|d| d.t >= 0.0) {
        match counts.iter_mut().find(|(r, _)| *r == d.reason) {
            Some((_, n)) => *n += 1,
            None => counts.push((d.reason.clone(), 1)),
        }
    }
    Summary {
        reserve: plan.reserve,
        hog_start_s: start,
        hog_ready_s: ready,
        hog_exit_s: exit,
        hog_touched: touched,
        budget_before,
        budget_lowest: lowest,
        time_to_lowest_s: time_to_lowest,
        below_reserve_s: below_reserve,
        budget_at_hog_exit: at_exit,
        budget_final: samples.last().map_or(0, |s| s.budget),
        regrow_s: regrow,
        min_mem_available_during_hog: during.iter().map(|s| s.mem_available).min().unwrap_or(0),
        phases,
        decisions: counts,
    }
}

pub(super) fn summary_text(plan: &Plan, s: &Summary) -> String {
    let secs = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.1}s"));
    let mut out = String::new();
    out.push_str(&format!(
        "hog: started {:.1}s, touched {} by {}, freed at {}; reserve {}, MemAvailable during the \
         hog down to {}\n",
        s.hog_start_s,
        s.hog_touched.map_or("-".into(), format_size_mg),
        secs(s.hog_ready_s),
        secs(s.hog_exit_s),
        format_size_mg(plan.reserve),
        format_size_mg(s.min_mem_available_during_hog),
    ));
    let crossed = match s.below_reserve_s {
        Some(b) => format!(
            ", {:.1}s after MemAvailable fell below the reserve",
            (s.hog_start_s + s.time_to_lowest_s - b).max(0.0)
        ),
        None => ", MemAvailable stayed above the reserve".into(),
    };
    out.push_str(&format!(
        "budget: {} before the hog -> lowest {} ({:.1}s after the hog started{crossed}) -> {} \
         when the hog left -> {} at the end ({})\n",
        format_size_mg(s.budget_before),
        format_size_mg(s.budget_lowest),
        s.time_to_lowest_s,
        s.budget_at_hog_exit.map_or("-".into(), format_size_mg),
        format_size_mg(s.budget_final),
        match s.regrow_s {
            Some(r) => format!(
                "back at {:.0}% of before {:.1}s after the hog left",
                REGROWN * 100.0,
                r
            ),
            None => format!("not back at {:.0}% of before by the end", REGROWN * 100.0),
        }
    ));
    out.push_str(&format!(
        "{:<7} {:>13} {:>10} {:>10} {:>10} {:>12}\n",
        "phase", "seconds", "refault/s", "access/s", "budget", "min avail"
    ));
    for p in &s.phases {
        out.push_str(&format!(
            "{:<7} {:>13} {:>10.0} {:>10.0} {:>10} {:>12}\n",
            p.name,
            format!("{:.1}-{:.1}", p.from_s, p.to_s),
            p.refaults_per_s,
            p.accesses_per_s,
            format_size_mg(p.mean_budget),
            format_size_mg(p.min_mem_available)
        ));
    }
    let reasons: Vec<String> = s
        .decisions
        .iter()
        .map(|(r, n)| format!("{r} {n}"))
        .collect();
    out.push_str(&format!("controller steps: {}", reasons.join(", ")));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adaptive::{GIB, MIB};
    use std::path::PathBuf;
    use std::time::Duration;

    #[test]
    fn multiplier_is_a_bijection() {
        for pages in [1u64, 7, 4096, 65_536, 100_000] {
            let m = page_multiplier(pages);
            let mut seen = vec![false; pages as usize];
            for r in 0..pages {
                let p = ((u128::from(r) * u128::from(m)) % u128::from(pages)) as usize;
                assert!(!seen[p]);
                seen[p] = true;
            }
        }
    }

    fn sample(t: f64, budget: u64, acc: u64) -> Sample {
        Sample {
            t,
            budget,
            resident: budget,
            staged: 0,
            pool: 0,
            mem_available: 10 * GIB,
            psi_some_avg10: 0.0,
            refaults_per_s: 0.0,
            accesses_per_s: 0.0,
            refaults: acc / 10,
            accesses: acc,
            hog: HogState::None,
            reason: None,
        }
    }

    #[test]
    fn summary_finds_the_dip_and_the_regrowth() {
        let budgets = [100, 100, 100, 80, 40, 30, 30, 30, 50, 70, 96, 100];
        let samples: Vec<Sample> = budgets
            .iter()
            .enumerate()
            .map(|(i, &b)| sample(i as f64, b * MIB, i as u64 * 1000))
            .collect();
        let args = AdaptiveArgs {
            size: 256 * MIB,
            min: 16 * MIB,
            max: 192 * MIB,
            take: GIB,
            at: Duration::from_secs(2),
            hold: Duration::from_secs(4),
            duration: Duration::from_secs(10),
            reserve: Some(GIB),
            deficit: None,
            interval: Duration::from_secs(1),
            cooldown: Duration::from_secs(5),
            write_ratio: 0.1,
            zipf_s: 0.99,
            corpus: None,
            json: PathBuf::new(),
            svg: PathBuf::new(),
        };
        let corpus = Corpus::from_bytes("t", b"hello world, some text ".repeat(200)).unwrap();
        let plan = plan(&args, &corpus, 20 * GIB).unwrap();
        let s = summarize(&plan, &samples, &[], 2.5, Some(3.0), Some(7.5), Some(GIB));
        assert_eq!(s.budget_before, 100 * MIB);
        assert_eq!(s.budget_lowest, 30 * MIB);
        assert!((s.time_to_lowest_s - 2.5).abs() < 1e-9);
        assert_eq!(s.budget_final, 100 * MIB);
        assert!((s.regrow_s.unwrap() - 2.5).abs() < 1e-9);
        assert_eq!(s.phases.len(), 3);
        assert!((s.phases[0].accesses_per_s - 1000.0).abs() < 1e-6);
    }
}
