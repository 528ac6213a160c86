//! The driver of `zmem bench ssd`: the sides ([`Side`]), one run of a worker on a side with its
//! guards ([`run_one`]: a swap file and a limited memory cgroup for the kernel, `zmem run --ssd`
//! in an accounting cgroup for zmem), the loop, and the machine restored and checked.
//!
//! Guards, dropped in the reverse order of their creation (on success, on error and after
//! Ctrl-C alike): the worker is a child in a process group of its own, killed by its pid's group
//! and reaped by [`execute`] on a timeout or an interrupt, and it dies with this process
//! (PR_SET_PDEATHSIG); then the memory cgroup is removed ([`MemCgroup`]); then the swap file is
//! swapped off and deleted ([`SwapFile`]), or zmem's log directory removed ([`LogDir`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::report::{self, RunRecord};
use super::worker::WorkerReport;
use super::{Case, Plan, SideKind, SsdArgs, WorkloadKind};
use crate::abort::{check_abort, install_abort_handler, Interrupted};
use crate::kernel::memcg::{
    bench_cgroups, cg_read_u64, memcg_v1_available, memory_stat, note_leftover_cgroups, oom_kills,
    MemCgroup, CGROUP_PREFIX, MEMCG_ROOT,
};
use crate::kernel::swap::{other_swap_note, swaps, SWAP_PRIORITY};
use crate::kernel::swapfile::{fs_type, note_leftover_swapfiles, SwapFile, SWAPFILE_PREFIX};
use crate::kv::server::StatPoller;
use crate::process::{self_exe, ScratchDir};
use crate::programs::run::{execute, Exit, Sink};
use crate::report::{progress_bar, MachineInfo};

/// One configuration a workload runs on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Side {
    /// "kernel-swap", "zmem", "zmem-noenc".
    pub label: String,
    pub kind: SideKind,
    /// zmem: the log is encrypted (the default); false with --ssd-no-encrypt.
    pub encrypt: bool,
}

impl Side {
    fn kernel() -> Side {
        Side {
            label: "kernel-swap".into(),
            kind: SideKind::Kernel,
            encrypt: false,
        }
    }

    fn zmem(encrypt: bool) -> Side {
        Side {
            label: if encrypt { "zmem" } else { "zmem-noenc" }.into(),
            kind: SideKind::Zmem,
            encrypt,
        }
    }
}

/// The kernel side of one run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct KernelFigures {
    pub swap_file: String,
    pub swap_file_bytes: u64,
    /// "fallocate" or "written".
    pub allocation: String,
    pub swap_priority: i32,
    /// The worker's limit is --dram above its own baseline (in the worker's report).
    pub cgroup_max_usage_bytes: u64,
    pub oom_kills: u64,
    pub cgroup_pgmajfault: u64,
    /// Pages swapped in and out on the whole machine during the run (/proc/vmstat).
    pub pswpin: u64,
    pub pswpout: u64,
    /// Whether the swap file was swapped off and deleted, and /proc/swaps is as before.
    pub swap_file_removed: bool,
    pub swaps_as_before: bool,
}

/// The zmem side of one run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ZmemFigures {
    pub resident: u64,
    pub store_limit: u64,
    pub ssd_size: u64,
    pub encrypt: bool,
    pub log_dir: String,
    /// The worker's memory cgroup (no limit: accounting only).
    pub cgroup_max_usage_bytes: u64,
    /// From `zmem run --stats`: the most DRAM the heap took (resident + pool), the peak RSS.
    pub peak_dram: Option<u64>,
    pub peak_data: Option<u64>,
    pub max_rss: Option<u64>,
    pub major_faults: Option<u64>,
    pub evictions: Option<u64>,
    /// Pages that did not compress and were kept in DRAM outside the budget (the region's
    /// incompressible_kept): DRAM beyond --dram.
    pub incompressible_kept: Option<u64>,
    /// The `ssd` object of the stats (the log's statistics) as zmem wrote it.
    pub ssd: Option<serde_json::Value>,
    pub stats_error: Option<String>,
    /// What was left in the log's directory after the run (must be nothing).
    pub log_dir_leftovers: Vec<String>,
}

impl ZmemFigures {
    /// A counter of the log's statistics.
    pub fn ssd_u64(&self, key: &str) -> Option<u64> {
        self.ssd.as_ref()?.get(key)?.as_u64()
    }
}

/// Why `side` cannot run with this binary's `zmem run` (None: it can).
fn zmem_unavailable(exe: &Path, side: &Side) -> Option<String> {
    let out = std::process::Command::new(exe)
        .args(["run", "--help"])
        .output()
        .map_err(|e| format!("{}: {e}", exe.display()));
    let help = match out {
        Ok(o) => String::from_utf8_lossy(&o.stdout).into_owned(),
        Err(e) => return Some(e),
    };
    let missing = missing_flags(&help, side);
    (!missing.is_empty()).then(|| {
        format!(
            "this zmem's `zmem run` has no {} yet (the SSD tier's flags)",
            missing.join(", ")
        )
    })
}

/// The flags `side` needs that `help` (of `zmem run`) does not list.
fn missing_flags(help: &str, side: &Side) -> Vec<&'static str> {
    let words: Vec<&str> = help
        .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
        .collect();
    let mut needed = vec!["--ssd", "--ssd-size"];
    if !side.encrypt {
        needed.push("--ssd-no-encrypt");
    }
    needed.retain(|f| !words.contains(f));
    needed
}

/// The directory of zmem's log for one run, `DIR/zmem-bench-ssd-PID`: created empty, removed
/// when dropped.
pub struct LogDir(PathBuf);

impl LogDir {
    pub(crate) fn create(dir: &Path) -> anyhow::Result<LogDir> {
        let p = dir.join(format!("zmem-bench-ssd-{}", std::process::id()));
        std::fs::create_dir(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(LogDir(p))
    }

    pub(crate) fn path(&self) -> &Path {
        &self.0
    }

    /// The names in it (the tier's log is an unnamed file: there should be none).
    pub(crate) fn leftovers(&self) -> Vec<String> {
        std::fs::read_dir(&self.0)
            .map(|d| {
                d.flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }
}

impl Drop for LogDir {
    fn drop(&mut self) {
        if let Err(e) = std::fs::remove_dir_all(&self.0) {
            eprintln!(
                "zmem: warning: could not remove {}: {e}; run: rm -r {}",
                self.0.display(),
                self.0.display()
            );
        }
    }
}

/// pswpin and pswpout of /proc/vmstat.
fn swap_pages() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/vmstat").unwrap_or_default();
    let get = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(' ')?.trim().parse().ok())
            .unwrap_or(0)
    };
    (get("pswpin"), get("pswpout"))
}

/// The first `ssd` object anywhere in `v` (the stats file's layout may nest it).
pub(crate) fn find_ssd(v: &serde_json::Value) -> Option<&serde_json::Value> {
    match v {
        serde_json::Value::Object(m) => m
            .get("ssd")
            .filter(|s| s.is_object())
            .or_else(|| m.values().find_map(find_ssd)),
        serde_json::Value::Array(a) => a.iter().find_map(find_ssd),
        _ => None,
    }
}

/// What the run's context holds for every run.
struct Ctx<'a> {
    plan: &'a Plan,
    exe: &'a Path,
    scratch: &'a Path,
    swaps_before: &'a [crate::kernel::swap::SwapEntry],
}

/// The worker's command line for `case` (without the program).
fn worker_args(plan: &Plan, case: &Case, label: &str) -> Vec<String> {
    let mut v: Vec<String> = vec![
        "bench".into(),
        "ssd-worker".into(),
        "--workload".into(),
        case.workload.as_str().into(),
        "--array".into(),
        plan.array.to_string(),
        "--seed".into(),
        plan.seed.to_string(),
        "--label".into(),
        label.into(),
    ];
    match case.workload {
        WorkloadKind::Objects => {
            v.extend([
                "--object-size".into(),
                case.object_size.unwrap_or(4096).to_string(),
                "--mix".into(),
                case.mix.unwrap_or(super::Mix::RW80).to_string(),
                "--ops".into(),
                plan.ops.to_string(),
                "--content".into(),
                match plan.content {
                    super::Content::Text => "text".into(),
                    super::Content::Random => "random".into(),
                },
            ]);
        }
        WorkloadKind::Bloom => v.extend(["--ops".into(), plan.bloom_keys.to_string()]),
    }
    v
}

/// The worker's report from its saved stdout (None if it wrote none).
fn parse_report(out: &Path) -> Option<WorkerReport> {
    let text = std::fs::read_to_string(out).ok()?;
    text.lines()
        .rev()
        .find_map(|l| serde_json::from_str::<WorkerReport>(l.trim()).ok())
}

/// One run of `case` on `side`: its guards set up and restored whatever happens.
fn run_one(ctx: &Ctx<'_>, case: &Case, side: &Side, rep: u32) -> anyhow::Result<RunRecord> {
    let plan = ctx.plan;
    let timeout = Duration::from_secs_f64(plan.timeout_s);
    let out = ctx.scratch.join(format!("{}-{rep}.out", side.label));
    let _ = std::fs::remove_file(&out);
    let cg_name = format!("{CGROUP_PREFIX}{}", std::process::id());
    let exe = ctx.exe.display().to_string();
    let mut kernel: Option<KernelFigures> = None;
    let mut zmem: Option<ZmemFigures> = None;
    let (exit, max_usage) = match side.kind {
        SideKind::Kernel => {
            let swap = SwapFile::create(&plan.dir, plan.disk_size, SWAP_PRIORITY)?;
            let cg = MemCgroup::create(Path::new(MEMCG_ROOT), &cg_name, None)?;
            let mut argv = vec![exe.clone()];
            argv.extend(worker_args(plan, case, &side.label));
            argv.extend([
                "--cgroup".into(),
                cg.path().display().to_string(),
                "--dram".into(),
                plan.dram.to_string(),
            ]);
            let (in0, out0) = swap_pages();
            let (exit, max_usage) = execute_in(&argv, cg.path(), &out, timeout)?;
            let (in1, out1) = swap_pages();
            let stat = memory_stat(cg.path()).unwrap_or_default();
            let figures = KernelFigures {
                swap_file: swap.path().display().to_string(),
                swap_file_bytes: swap.size(),
                allocation: swap.allocation().into(),
                swap_priority: SWAP_PRIORITY,
                cgroup_max_usage_bytes: max_usage,
                oom_kills: oom_kills(cg.path()),
                cgroup_pgmajfault: stat.get("pgmajfault").copied().unwrap_or(0),
                pswpin: in1.saturating_sub(in0),
                pswpout: out1.saturating_sub(out0),
                swap_file_removed: false,
                swaps_as_before: false,
            };
            let path = swap.path().to_path_buf();
            drop(cg);
            drop(swap);
            kernel = Some(KernelFigures {
                swap_file_removed: !path.exists(),
                swaps_as_before: swaps().is_ok_and(|s| s == ctx.swaps_before),
                ..figures
            });
            (exit, max_usage)
        }
        SideKind::Zmem => {
            let log = LogDir::create(&plan.dir)?;
            let stats = ctx.scratch.join(format!("{}-{rep}.stats.json", side.label));
            let _ = std::fs::remove_file(&stats);
            let cg = MemCgroup::create(Path::new(MEMCG_ROOT), &cg_name, None)?;
            let mut argv: Vec<String> = vec![
                exe.clone(),
                "run".into(),
                "--resident".into(),
                plan.resident.to_string(),
                "--store-limit".into(),
                plan.store_limit.to_string(),
                "--ssd".into(),
                log.0.display().to_string(),
                "--ssd-size".into(),
                plan.disk_size.to_string(),
            ];
            if !side.encrypt {
                argv.push("--ssd-no-encrypt".into());
            }
            argv.extend([
                "--quiet".into(),
                "--stats".into(),
                stats.display().to_string(),
                "--".into(),
                exe.clone(),
            ]);
            argv.extend(worker_args(plan, case, &side.label));
            let (exit, max_usage) = execute_in(&argv, cg.path(), &out, timeout)?;
            drop(cg);
            let mut z = ZmemFigures {
                resident: plan.resident,
                store_limit: plan.store_limit,
                ssd_size: plan.disk_size,
                encrypt: side.encrypt,
                log_dir: log.0.display().to_string(),
                cgroup_max_usage_bytes: max_usage,
                log_dir_leftovers: log.leftovers(),
                ..Default::default()
            };
            match std::fs::read_to_string(&stats)
                .map_err(|e| e.to_string())
                .and_then(|t| {
                    serde_json::from_str::<serde_json::Value>(&t).map_err(|e| e.to_string())
                }) {
                Ok(v) => {
                    let u = |p: &str| v.pointer(p).and_then(|x| x.as_u64());
                    z.peak_dram = u("/peak_dram");
                    z.peak_data = u("/peak_data");
                    z.max_rss = u("/max_rss");
                    z.major_faults = u("/zmem/region/major_faults");
                    z.evictions = u("/zmem/region/evictions");
                    z.incompressible_kept = u("/zmem/region/incompressible_kept");
                    z.ssd = find_ssd(&v).cloned();
                }
                Err(e) => z.stats_error = Some(format!("{}: {e}", stats.display())),
            }
            drop(log);
            zmem = Some(z);
            (exit, max_usage)
        }
    };
    let report = parse_report(&out);
    Ok(RunRecord::new(
        case, side, rep, &exit, report, max_usage, kernel, zmem,
    ))
}

/// Runs `argv` in the cgroup `cg` (its memory.stat read meanwhile, see
/// [`crate::kernel::memcg::STAT_POLL`]), its stdout saved to `out`: how it ended, and the
/// cgroup's memory.max_usage_in_bytes.
fn execute_in(
    argv: &[String],
    cg: &Path,
    out: &Path,
    timeout: Duration,
) -> anyhow::Result<(Exit, u64)> {
    let poller = StatPoller::start(cg);
    let exit = execute(argv, &[], None, Some(cg), Sink::Save(out), timeout);
    drop(poller);
    let exit = exit?;
    Ok((
        exit,
        cg_read_u64(cg, "memory.max_usage_in_bytes").unwrap_or(0),
    ))
}

/// The time now as "2026-11-25 00:37 UTC".
fn utc_now() -> String {
    // SAFETY: tm is plain old data.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    // SAFETY: time(NULL) has no preconditions.
    let t = unsafe { libc::time(std::ptr::null_mut()) };
    // SAFETY: &t and &mut tm are valid pointers.
    if unsafe { libc::gmtime_r(&t, &mut tm) }.is_null() {
        return "unknown".into();
    }
    format!(
        "{}-{:02}-{:02} {:02}:{:02} UTC",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min
    )
}

/// Why this process may not change the machine (None: it may).
fn not_root() -> Option<String> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    (uid != 0).then(|| {
        format!(
            "zmem bench ssd needs root: it creates a swap file and swaps on it, and confines its \
             workers to memory cgroups (running as uid {uid}); nothing was changed"
        )
    })
}

/// `zmem bench ssd`.
pub fn run(args: &SsdArgs) -> anyhow::Result<()> {
    let plan = Plan::resolve(args)?;
    if let Some(why) = not_root() {
        anyhow::bail!("{why}");
    }
    anyhow::ensure!(
        memcg_v1_available(),
        "no cgroup v1 memory controller at {MEMCG_ROOT}: both sides need one (cgroup v2 is not \
         supported yet)"
    );
    anyhow::ensure!(
        plan.dir.is_dir(),
        "--dir {} is not a directory",
        plan.dir.display()
    );
    let fs = fs_type(&plan.dir)?;
    install_abort_handler();
    let started = utc_now();
    note_leftover_cgroups();
    note_leftover_swapfiles(&plan.dir);
    let swaps_before = swaps()?;
    if let Some(note) = other_swap_note(
        &swaps_before,
        &format!(
            "the kernel side may swap there too, beside its swap file (priority {SWAP_PRIORITY}); \
             it is left alone"
        ),
    ) {
        eprintln!("{note}");
    }
    let cgroups_before = bench_cgroups();
    // The real path: the name `zmem run` resolves and the worker's /proc/self/comm.
    let exe = self_exe()?;
    let exe = std::fs::canonicalize(&exe)
        .ok()
        .filter(|p| p.is_file())
        .unwrap_or(exe);

    let mut sides: Vec<Side> = Vec::new();
    let mut skipped: Vec<report::Skipped> = Vec::new();
    for kind in &plan.sides {
        match kind {
            SideKind::Kernel => sides.push(Side::kernel()),
            SideKind::Zmem => {
                let mut z = vec![Side::zmem(true)];
                if plan.encrypt_cost {
                    z.push(Side::zmem(false));
                }
                for side in z {
                    match zmem_unavailable(&exe, &side) {
                        None => sides.push(side),
                        Some(why) => {
                            eprintln!("zmem: note: {} is skipped: {why}", side.label);
                            skipped.push(report::Skipped {
                                side: side.label,
                                reason: why,
                            });
                        }
                    }
                }
            }
        }
    }
    anyhow::ensure!(
        !sides.is_empty(),
        "no side can run: {}",
        skipped
            .iter()
            .map(|s| format!("{}: {}", s.side, s.reason))
            .collect::<Vec<_>>()
            .join("; ")
    );

    let cases = plan.cases();
    let scratch = ScratchDir::create("ssd")?;
    let ctx = Ctx {
        plan: &plan,
        exe: &exe,
        scratch: scratch.path(),
        swaps_before: &swaps_before,
    };
    let total = cases.len() as u64 * plan.repeat as u64 * sides.len() as u64;
    let pb = progress_bar(total, "ssd".into());
    if let Ok(style) =
        indicatif::ProgressStyle::with_template("{msg:48} [{bar:30}] {pos}/{len} runs, {elapsed}")
    {
        pb.set_style(style.progress_chars("=> "));
    }
    let mut records: Vec<RunRecord> = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    let mut failure: Option<anyhow::Error> = None;
    let mut n = 0u64;
    'outer: for case in &cases {
        for rep in 1..=plan.repeat {
            for side in &sides {
                if let Err(e) = check_abort() {
                    failure = Some(e.into());
                    break 'outer;
                }
                n += 1;
                pb.set_message(format!("{} on {}, run {rep}", case.name(), side.label));
                let log = |line: String| {
                    if pb.is_hidden() {
                        eprintln!("{line}");
                    } else {
                        pb.println(line);
                    }
                };
                log(format!(
                    "zmem: [{n}/{total}] {} on {} (run {rep})",
                    case.name(),
                    side.label
                ));
                match run_one(&ctx, case, side, rep) {
                    Ok(r) => {
                        log(format!("zmem:   {}", r.summary()));
                        if let Some(e) = r.problem() {
                            log(format!("zmem: error: {e}"));
                            errors.push(e);
                        }
                        records.push(r);
                    }
                    Err(e) if e.downcast_ref::<Interrupted>().is_some() => {
                        failure = Some(e);
                        break 'outer;
                    }
                    Err(e) => {
                        // A guard that could not be set up (disk full, a leftover cgroup): the
                        // next runs would fail the same way.
                        failure = Some(e.context(format!("{} on {}", case.name(), side.label)));
                        break 'outer;
                    }
                }
                pb.inc(1);
            }
        }
    }
    pb.finish_and_clear();
    drop(scratch);

    // The machine as found?
    let swaps_after = swaps()?;
    let cgroups_after = bench_cgroups();
    let own_swapfile = plan
        .dir
        .join(format!("{SWAPFILE_PREFIX}{}", std::process::id()));
    let restored = serde_json::json!({
        "swaps_as_before": swaps_after == swaps_before,
        "cgroups_as_before": cgroups_after == cgroups_before,
        "swap_file_removed": !own_swapfile.exists(),
    });
    if swaps_after != swaps_before || cgroups_after != cgroups_before || own_swapfile.exists() {
        eprintln!("zmem: warning: the machine is not as it was: {restored}");
    }
    if failure.is_none() && !errors.is_empty() {
        failure = Some(anyhow::anyhow!("{}", errors.join("; ")));
    }
    let machine = MachineInfo::collect();
    let summaries = report::summarize(&cases, &sides, &records);
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .ok()
    };
    let setup = serde_json::json!({
        "started_utc": started,
        "dir": plan.dir.display().to_string(),
        "file_system": fs,
        "disk_size": plan.disk_size,
        "dram": plan.dram,
        "zmem_resident": plan.resident,
        "zmem_store_limit": plan.store_limit,
        "kernel_swap_priority": SWAP_PRIORITY,
        "vm_page_cluster": read("/proc/sys/vm/page-cluster"),
        "vm_swappiness": read("/proc/sys/vm/swappiness"),
        "thp": read("/sys/kernel/mm/transparent_hugepage/enabled"),
        "other_swap": swaps_before,
        "zmem": exe.display().to_string(),
    });
    let text = format!(
        "# started {started}, zmem {}\n{}",
        env!("CARGO_PKG_VERSION"),
        report::text(&plan, &machine, &summaries, &sides, &skipped, &fs)
    );
    if !records.is_empty() {
        println!("{text}");
    }
    let doc = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "args": args,
        "plan": plan,
        "machine": machine,
        "setup": setup,
        "sides": sides,
        "skipped": skipped,
        "runs": records,
        "summary": summaries,
        "restored": restored,
        "errors": errors,
        "error": failure.as_ref().map(|e| format!("{e:#}")),
    });
    if records.is_empty() {
        eprintln!(
            "zmem: nothing was measured; {} and the others were left as they were",
            args.out.with_extension("json").display()
        );
    } else {
        report::write_outputs(&args.out, &doc, &text, &summaries, &sides, &plan)?;
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ssd_object_is_found_where_it_is() {
        let v = serde_json::json!({"peak_dram": 1, "zmem": {"region": {"ssd": {"reads": 3}}}});
        assert_eq!(find_ssd(&v).unwrap()["reads"], 3);
        let v = serde_json::json!({"ssd": {"reads": 4}, "zmem": {"ssd": {"reads": 5}}});
        assert_eq!(find_ssd(&v).unwrap()["reads"], 4);
        assert!(find_ssd(&serde_json::json!({"ssd": null})).is_none());
    }

    #[test]
    fn worker_command_lines() {
        use clap::Parser;
        #[derive(Parser)]
        struct P {
            #[command(flatten)]
            a: SsdArgs,
        }
        let plan = Plan::resolve(&P::parse_from(["x", "--quick"]).a).unwrap();
        let cases = plan.cases();
        let a = worker_args(&plan, &cases[0], "zmem");
        let s = a.join(" ");
        assert!(s.starts_with("bench ssd-worker --workload objects"), "{s}");
        assert!(s.contains("--object-size 256 --mix 80:20"), "{s}");
        let b = worker_args(&plan, cases.last().unwrap(), "k").join(" ");
        assert!(
            b.contains("--workload bloom") && b.contains("--ops 3000"),
            "{b}"
        );
        // The worker parses what the driver writes.
        #[derive(Parser)]
        struct W {
            #[command(flatten)]
            a: super::super::SsdWorkerArgs,
        }
        let mut argv = vec!["x".to_string()];
        argv.extend(a.into_iter().skip(2));
        let w = W::try_parse_from(argv).unwrap().a;
        w.validate().unwrap();
        assert_eq!(w.object_size, 256);
    }

    #[test]
    fn the_ssd_flags_are_found_in_the_help() {
        let help =
            "  --ssd <PATH>\n          An SSD tier\n  --ssd-size <SSD_SIZE>\n  --ssd-no-encrypt\n";
        assert!(missing_flags(help, &Side::zmem(true)).is_empty());
        assert!(missing_flags(help, &Side::zmem(false)).is_empty());
        let old = "  --store-limit <STORE_LIMIT>\n  --ssd-sizes\n";
        assert_eq!(
            missing_flags(old, &Side::zmem(true)),
            ["--ssd", "--ssd-size"]
        );
        let no_enc = "  --ssd <PATH>\n  --ssd-size <S>\n";
        assert!(missing_flags(no_enc, &Side::zmem(true)).is_empty());
        assert_eq!(
            missing_flags(no_enc, &Side::zmem(false)),
            ["--ssd-no-encrypt"]
        );
    }

    #[test]
    fn the_date_is_a_date() {
        let d = utc_now();
        assert!(
            d.len() == 20 && d.starts_with("20") && d.ends_with(" UTC"),
            "{d}"
        );
    }

    #[test]
    fn vmstat_has_swap_counters() {
        let (i, o) = swap_pages();
        let _ = (i, o);
        assert!(std::fs::read_to_string("/proc/vmstat")
            .unwrap()
            .contains("pswpout"));
    }
}
