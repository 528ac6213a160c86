//! A run: each configuration in turn with its guards, the JSON and the tables.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;

use crate::abort::{aborted, Interrupted};
use crate::corpus::{default_corpus, Corpus};
use crate::kernel::memcg::{oom_kills, MemCgroup, CGROUP_PREFIX, MEMCG_ROOT};
use crate::kernel::swap::{other_swap_note, swaps, SwapOn, SWAP_PRIORITY};
use crate::kernel::swapfile::SwapFile;
use crate::kernel::zram::{self, ZramSession, ZRAM_INDEX};
use crate::process::{describe_status, ScratchDir};
use crate::report::{corpus_info, write_json, MachineInfo};
use crate::ssd::run::{find_ssd, LogDir};
use zmem_runenv::size::{format_mib, format_size, format_size_approx};

use super::load::{load_loop, Guards, HardError};
use super::plan::Plan;
use super::report::{
    fault_table, plot, ratio_lines, ratios, step_table, stop_str, summary_table, ConfigResult,
    Skipped,
};
use super::server::{free_port, Server, ServerSpec, StatPoller};
use super::setup::{check_machine, precheck};
use super::values::Values;
use super::{KvArgs, KvConfig, MIB};
use crate::kernel::memcg::cg_write;

/// `zmem bench redis` / `zmem bench memcached`.
pub fn run(args: &KvArgs, spec: &ServerSpec) -> anyhow::Result<()> {
    let plan = Plan::new(args, spec)?;
    let corpus_dir = args.corpus.clone().unwrap_or_else(default_corpus);
    let corpus = Corpus::load(&corpus_dir)?;
    let json_path = args
        .json
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-out/{}.json", spec.name)));
    let svg_path = args
        .svg
        .clone()
        .unwrap_or_else(|| PathBuf::from(format!("bench-out/{}.svg", spec.name)));
    check_machine()?;
    let mut skipped = Vec::new();
    let mut runnable = Vec::new();
    for &c in &plan.configs {
        match precheck(c, &plan, spec) {
            Ok(()) => runnable.push(c),
            Err(reason) => {
                eprintln!("zmem: {} cannot run: {reason}", c.as_str());
                skipped.push(Skipped { config: c, reason });
            }
        }
    }
    let note = other_swap_note(
        &swaps()?,
        "the zram and swapfile configurations may use it beside their own swap (noswap, zmem \
         and zmem-ssd get no swap: memory.memsw.limit_in_bytes)",
    );
    if let Some(note) = note {
        eprintln!("{note}");
    }
    if let Some(ssd) = &plan.ssd {
        eprintln!(
            "zmem: SSD configurations on {} ({}, {} free): swap file / log of {}; zmem-ssd: \
             --resident {} --store-limit {}{}",
            ssd.dir.display(),
            ssd.file_system,
            format_size_approx(ssd.free_bytes),
            format_size(ssd.size),
            format_size(ssd.resident),
            format_size(ssd.store_limit),
            if ssd.encrypt { "" } else { " --ssd-no-encrypt" }
        );
        if let Some(n) = ssd.read_ahead {
            eprintln!("zmem: zmem-ssd: --ssd-read-ahead {n}");
        }
    }
    crate::abort::install_abort_handler();
    // Orphans of a server that forks (zmem run's child) become ours, so that they are reaped.
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) takes a flag; no memory is involved.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1 as libc::c_ulong) };
    eprintln!(
        "zmem: bench {}: {} ({}), limit {}, compressed {}, steps of {} up to {}, {} GETs per step, \
         {} client(s), pipeline {}",
        spec.name,
        plan.server_bin.display(),
        plan.server_version,
        format_size(plan.limit),
        format_size(plan.compressed),
        format_size(plan.step),
        format_size(plan.max_data),
        plan.gets,
        plan.clients,
        plan.pipeline
    );

    let values = Values::new(&corpus, plan.seed);
    let mut results: Vec<ConfigResult> = Vec::new();
    let mut failure: Option<anyhow::Error> = None;
    for &c in &runnable {
        if aborted() {
            failure = Some(Interrupted.into());
            break;
        }
        let log_path = server_log_path(&json_path, c);
        match run_config(&plan, spec, c, &values, &log_path) {
            Ok(r) => {
                eprintln!(
                    "zmem: {}: {}: holds {} ({})",
                    spec.name,
                    c.as_str(),
                    format_mib(r.data_held),
                    stop_str(&r.stop)
                );
                results.push(r);
            }
            Err(e) if e.downcast_ref::<Interrupted>().is_some() => {
                failure = Some(e);
                break;
            }
            Err(e) if e.downcast_ref::<HardError>().is_some() => {
                failure = Some(e.context(format!("{} {}", spec.name, c.as_str())));
                break;
            }
            Err(e) => {
                let reason = format!("{e:#}");
                eprintln!("zmem: {}: {} failed: {reason}", spec.name, c.as_str());
                skipped.push(Skipped { config: c, reason });
            }
        }
    }

    let ratios = ratios(&results, plan.limit);
    let machine = MachineInfo::collect();
    if !results.is_empty() {
        println!(
            "machine: {} CPUs, {}, {}",
            machine.nproc, machine.cpu_model, machine.kernel
        );
        println!("{}", summary_table(&plan, &results, &skipped));
        println!();
        println!("{}", step_table(&results));
        println!();
        let faults = fault_table(&results);
        if !faults.is_empty() {
            println!("{faults}");
            println!();
        }
        println!("{}", ratio_lines(&plan, &ratios, &results));
    }
    let crashed: Vec<String> = results
        .iter()
        .filter(|r| {
            matches!(r.stop.kind.as_str(), "server-died" | "connection-failed")
                || (r.stop.kind == "stalled" && r.config != KvConfig::Zram)
        })
        .map(|r| format!("{}: {}: {}", r.config.as_str(), r.stop.kind, r.stop.detail))
        .collect();
    if failure.is_none() && !crashed.is_empty() {
        failure = Some(anyhow::anyhow!(
            "the server did not end by running out of memory: {} (its output is in {})",
            crashed.join("; "),
            json_path
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
                .map_or(".".into(), |d| d.display().to_string())
        ));
    }
    if failure.is_none() && !skipped.is_empty() {
        let why: Vec<String> = skipped
            .iter()
            .map(|s| format!("{}: {}", s.config.as_str(), s.reason))
            .collect();
        failure = Some(anyhow::anyhow!("not measured: {}", why.join("; ")));
    }
    let doc = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "args": args,
        "machine": machine,
        "corpus": corpus_info(&corpus),
        "plan": plan,
        "results": results,
        "skipped": skipped,
        "ratios": ratios,
        "error": failure.as_ref().map(|e| format!("{e:#}")),
    });
    write_json(&json_path, &doc)?;
    eprintln!("zmem: wrote {}", json_path.display());
    if !results.is_empty() {
        plot(&plan, &results, &svg_path)
            .with_context(|| format!("drawing {}", svg_path.display()))?;
        eprintln!("zmem: wrote {}", svg_path.display());
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Where the output of configuration `c`'s server goes: beside the JSON, e.g.
/// bench-out/redis-zmem-server.log.
pub(super) fn server_log_path(json: &Path, c: KvConfig) -> PathBuf {
    let stem = json
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "kv".into());
    json.with_file_name(format!("{stem}-{}-server.log", c.as_str()))
}

/// Runs one configuration and restores the machine.
pub(super) fn run_config(
    plan: &Plan,
    spec: &ServerSpec,
    c: KvConfig,
    values: &Values,
    log_path: &Path,
) -> anyhow::Result<ConfigResult> {
    let t_start = Instant::now();
    let swaps_before = swaps()?;
    let cg_name = format!("{CGROUP_PREFIX}{}", std::process::id());
    let cg_path = Path::new(MEMCG_ROOT).join(&cg_name);
    let scratch = ScratchDir::create(&format!("{}-{}", spec.name, c.as_str()))?;
    let mut g = Guards::default();
    let mut zram_json = None;
    let mut zmem_json = None;
    let mut swapfile_json = None;
    let cgroup_limit = match c {
        KvConfig::Zmem => plan.limit + plan.compressed,
        _ => plan.limit,
    };
    let ssd = plan.ssd.as_ref().filter(|_| c.is_ssd());
    if c == KvConfig::Swapfile {
        let ssd = ssd.context("no --ssd-dir was checked")?;
        let f = SwapFile::create(&ssd.dir, ssd.size, SWAP_PRIORITY)?;
        swapfile_json = Some(serde_json::json!({
            "path": f.path().display().to_string(),
            "dir": ssd.dir.display().to_string(),
            "file_system": ssd.file_system,
            "size": f.size(),
            "allocation": f.allocation(),
            "swap_priority": SWAP_PRIORITY,
            "swappiness": SWAPFILE_SWAPPINESS,
        }));
        g.swapfile = Some(f);
    }
    if c == KvConfig::ZmemSsd {
        let ssd = ssd.context("no --ssd-dir was checked")?;
        g.log_dir = Some(LogDir::create(&ssd.dir)?);
    }
    let log_dir = g.log_dir.as_ref().map(|l| l.path().to_path_buf());
    if c == KvConfig::Zram {
        let mut session = ZramSession::acquire(ZRAM_INDEX)?;
        // Room for everything the server could swap: never the limit of the run.
        let disksize = (plan.max_data + plan.max_data / 2 + 256 * MIB).div_ceil(4096) * 4096;
        session.configure(&plan.zram_alg, disksize)?;
        let idx = session.index();
        g.zram = Some(session);
        let ml = format!("/sys/block/zram{idx}/mem_limit");
        std::fs::write(&ml, plan.compressed.to_string())
            .with_context(|| format!("writing {} to {ml}", plan.compressed))?;
        g.swap = Some(SwapOn::enable(
            &PathBuf::from(format!("/dev/zram{idx}")),
            SWAP_PRIORITY,
        )?);
        zram_json = Some(serde_json::json!({
            "device": format!("/dev/zram{idx}"),
            "algorithm": plan.zram_alg,
            "disksize": disksize,
            "mem_limit": plan.compressed,
            "swap_priority": SWAP_PRIORITY,
        }));
    }
    let cg = MemCgroup::create(Path::new(MEMCG_ROOT), &cg_name, Some(cgroup_limit))?;
    g.cgroup = Some(cg);
    match c {
        KvConfig::Zram => cg_write(&cg_path, "memory.swappiness", "100")?,
        KvConfig::Swapfile => cg_write(
            &cg_path,
            "memory.swappiness",
            &SWAPFILE_SWAPPINESS.to_string(),
        )?,
        KvConfig::Noswap | KvConfig::Zmem | KvConfig::ZmemSsd => {
            // No kernel swap at all, even where other swap is active on the machine.
            cg_write(&cg_path, "memory.swappiness", "0")?;
            if cg_path.join("memory.memsw.limit_in_bytes").exists() {
                cg_write(
                    &cg_path,
                    "memory.memsw.limit_in_bytes",
                    &cgroup_limit.to_string(),
                )?;
            }
        }
    }
    g.poller = Some(StatPoller::start(&cg_path));

    let mut port = free_port()?;
    let mut command = server_command(plan, spec, c, port, scratch.path(), log_dir.as_deref());
    let stats_path = zmem_stats_path(scratch.path());
    if c.is_zmem() {
        let (resident, store_limit) = zmem_sizes(plan, c);
        let mut z = serde_json::json!({
            "resident": resident,
            "store_limit": store_limit,
            "size": plan.zmem_size,
            "policy": plan.zmem_policy.clone().unwrap_or_else(|| "zmem run's default".into()),
            "fault_route": plan.zmem_fault_route.clone().unwrap_or_else(|| "zmem run's default".into()),
        });
        if let (Some(ssd), Some(log)) = (ssd, &log_dir) {
            z["ssd"] = serde_json::json!({
                "log_dir": log.display().to_string(),
                "dir": ssd.dir.display().to_string(),
                "file_system": ssd.file_system,
                "size": ssd.size,
                "encrypt": ssd.encrypt,
                "margin": ssd.margin,
            });
        }
        zmem_json = Some(z);
    }
    let description = describe_config(plan, c, cgroup_limit);
    eprintln!("zmem: {} {}: {description}", spec.name, c.as_str());
    // A port taken between free_port() and the server's bind: try another one.
    let mut tries = 0;
    let server = loop {
        match Server::start(&command, port, &cg_path, spec.protocol, plan.stall()) {
            Ok(s) => break s,
            Err(e) if tries < 2 && format!("{e:#}").contains("in use") => {
                tries += 1;
                port = free_port()?;
                command = server_command(plan, spec, c, port, scratch.path(), log_dir.as_deref());
            }
            Err(e) => return Err(e),
        }
    };
    g.server = Some(server);
    let oom_before = oom_kills(&cg_path);

    let outcome = load_loop(plan, spec, c, values, &mut g, &cg_path, oom_before);
    let server = g.server.as_mut().expect("server started");
    if let Ok((_, stop, _)) = &outcome {
        if matches!(stop.kind.as_str(), "zram-full" | "stalled") {
            server.kill();
        }
    }
    let oom = oom_kills(&cg_path).saturating_sub(oom_before);
    let exit = server.stop();
    let (log_tail, key_lines) = {
        let log = server.log();
        let text = log.lines().join("\n") + "\n";
        if let Err(e) = write_log(log_path, &text) {
            eprintln!("zmem: warning: {e:#}");
        }
        (log.last(20), log.key_lines())
    };
    // The stats file is written when the server exits (zmem's preload library, at exit).
    if let Some(z) = zmem_json.as_mut() {
        match read_zmem_stats(&stats_path) {
            Ok(v) => z["stats"] = v,
            Err(e) => z["stats_error"] = e.into(),
        }
        if let Some(l) = &g.log_dir {
            z["log_dir_leftovers"] = l.leftovers().into();
        }
    }
    let swap_file = g.swapfile.as_ref().map(|f| f.path().to_path_buf());
    drop(g);
    drop(scratch);
    let (steps, stop, server_pid) = outcome?;

    let swaps_after = swaps()?;
    let zram_disksize = zram::disksize(ZRAM_INDEX).ok();
    let mut restored = serde_json::json!({
        "swaps_as_before": swaps_after == swaps_before,
        "cgroup_removed": !cg_path.exists(),
        "zram_disksize": zram_disksize,
    });
    let leftover = swap_file.iter().chain(log_dir.iter()).any(|p| p.exists());
    if let Some(p) = &swap_file {
        restored["swap_file_removed"] = (!p.exists()).into();
    }
    if let Some(p) = &log_dir {
        restored["log_dir_removed"] = (!p.exists()).into();
    }
    let zram_ok = c != KvConfig::Zram || zram_disksize == Some(0);
    if swaps_after != swaps_before || cg_path.exists() || !zram_ok || leftover {
        eprintln!("zmem: warning: the machine is not as it was: {restored}");
    }
    let data_held = steps.last().map_or(0, |s| s.data_bytes);
    let data_at_oom = (stop.kind != "max-data").then_some(data_held);
    Ok(ConfigResult {
        config: c,
        description,
        cgroup_limit,
        dram_total: match c {
            KvConfig::Zram => plan.limit + plan.compressed,
            _ => cgroup_limit,
        },
        command,
        server_pid,
        steps,
        data_held,
        data_at_oom,
        stop,
        oom_kills: oom,
        exit: exit.map(describe_status),
        server_log: log_path.display().to_string(),
        server_log_tail: log_tail,
        server_log_key_lines: key_lines,
        zram: zram_json,
        zmem: zmem_json,
        swapfile: swapfile_json,
        restored,
        wall_s: t_start.elapsed().as_secs_f64(),
    })
}

/// Writes a server's output beside the JSON.
pub(super) fn write_log(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

pub(super) fn describe_config(plan: &Plan, c: KvConfig, cgroup_limit: u64) -> String {
    match c {
        KvConfig::Noswap => format!("cgroup limit {}, no swap", format_size(cgroup_limit)),
        KvConfig::Zram => format!(
            "cgroup limit {}, /dev/zram{ZRAM_INDEX} {} swap with mem_limit {}",
            format_size(cgroup_limit),
            plan.zram_alg,
            format_size(plan.compressed)
        ),
        KvConfig::Zmem => format!(
            "zmem run --resident {} --store-limit {} in a cgroup of {}, no kernel swap",
            format_size(plan.zmem_resident),
            format_size(plan.compressed),
            format_size(cgroup_limit)
        ),
        KvConfig::Swapfile => match &plan.ssd {
            Some(ssd) => format!(
                "cgroup limit {}, a {} swap file on {} ({})",
                format_size(cgroup_limit),
                format_size(ssd.size),
                ssd.dir.display(),
                ssd.file_system
            ),
            None => format!("cgroup limit {}, a swap file", format_size(cgroup_limit)),
        },
        KvConfig::ZmemSsd => {
            let (resident, store_limit) = zmem_sizes(plan, c);
            let (dir, enc) = plan.ssd.as_ref().map_or((String::new(), ""), |s| {
                (
                    format!(" {} ({})", s.dir.display(), s.file_system),
                    if s.encrypt { "" } else { " --ssd-no-encrypt" },
                )
            });
            format!(
                "zmem run --resident {} --store-limit {} --ssd{dir}{enc} in a cgroup of {}, no \
                 kernel swap",
                format_size(resident),
                format_size(store_limit),
                format_size(cgroup_limit)
            )
        }
    }
}

/// The kernel's default swappiness, for the swap file's cgroup: memcached on kernel swap as a
/// machine runs it (zram's configuration uses 100, as zram is meant to be used).
pub(super) const SWAPFILE_SWAPPINESS: u32 = 60;

/// `zmem run`'s --resident and --store-limit for configuration `c` (a zmem one).
pub(super) fn zmem_sizes(plan: &Plan, c: KvConfig) -> (u64, u64) {
    match (c, &plan.ssd) {
        (KvConfig::ZmemSsd, Some(ssd)) => (ssd.resident, ssd.store_limit),
        _ => (plan.zmem_resident, plan.compressed),
    }
}

/// Where `zmem run --stats` writes, in the configuration's scratch directory.
pub(super) fn zmem_stats_path(scratch: &Path) -> PathBuf {
    scratch.join("zmem-stats.json")
}

/// The figures of zmem's statistics file worth keeping beside the steps: the DRAM it took, the
/// fault latency and where the fault handlers' time went, the SSD tier's log
/// (`zmem_runenv::ProcessStats::ssd`).
pub(super) fn read_zmem_stats(path: &Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    let u = |p: &str| v.pointer(p).cloned().unwrap_or(serde_json::Value::Null);
    Ok(serde_json::json!({
        "peak_dram": u("/peak_dram"),
        "peak_data": u("/peak_data"),
        "max_rss": u("/max_rss"),
        "major_faults": u("/zmem/region/major_faults"),
        "evictions": u("/zmem/region/evictions"),
        "incompressible_kept": u("/zmem/region/incompressible_kept"),
        "fault_latency_ns": u("/zmem/region/fault_latency"),
        "handler_time": u("/zmem/region/handler_time"),
        "ssd": find_ssd(&v).cloned(),
        // Pages read back from the log, and of them those read ahead by an earlier read.
        "ssd_page_reads": u("/zmem/region/store/lower_reads"),
        "ssd_read_ahead_hits": u("/zmem/region/store/lower_ahead_hits"),
    }))
}

pub(super) fn server_command(
    plan: &Plan,
    spec: &ServerSpec,
    c: KvConfig,
    port: u16,
    dir: &Path,
    log_dir: Option<&Path>,
) -> Vec<String> {
    let mut cmd = Vec::new();
    if c.is_zmem() {
        let exe = std::env::current_exe()
            .map(|p| p.display().to_string())
            .unwrap_or_else(|_| "zmem".into());
        let (resident, store_limit) = zmem_sizes(plan, c);
        cmd.extend([
            exe,
            "run".into(),
            "--resident".into(),
            format_size(resident),
            "--store-limit".into(),
            format_size(store_limit),
            "--size".into(),
            format_size(plan.zmem_size),
        ]);
        if let (KvConfig::ZmemSsd, Some(ssd), Some(log)) = (c, &plan.ssd, log_dir) {
            cmd.extend([
                "--ssd".into(),
                log.display().to_string(),
                "--ssd-size".into(),
                format_size(ssd.size),
            ]);
            if !ssd.encrypt {
                cmd.push("--ssd-no-encrypt".into());
            }
            if let Some(n) = ssd.read_ahead {
                cmd.extend(["--ssd-read-ahead".into(), n.to_string()]);
            }
        }
        if let Some(p) = &plan.zmem_policy {
            cmd.extend(["--policy".into(), p.clone()]);
        }
        if let Some(r) = &plan.zmem_fault_route {
            cmd.extend(["--fault-route".into(), r.clone()]);
        }
        cmd.extend([
            "--quiet".into(),
            "--stats".into(),
            zmem_stats_path(dir).display().to_string(),
            "--".into(),
        ]);
    }
    cmd.push(plan.server_bin.display().to_string());
    cmd.extend((spec.args)(port, dir));
    cmd
}
