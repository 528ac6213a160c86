//! The kernel side of `zmem bench region --kernel-zram`: the same workload on plain anonymous
//! memory, in a worker process confined to a cgroup v1 memory cgroup limited to the resident
//! budget, with /dev/zram0 as its swap.
//!
//! The machine is restored as found by guards that are dropped in the reverse order of their
//! creation, on success, on error and after Ctrl-C alike:
//!
//! 1. [`ZramSession`]: takes /dev/zram0 only if it is free (disksize 0, not swap, not mounted),
//!    configures it, and resets it (disksize back to 0) when dropped;
//! 2. [`SwapOn`]: writes a swap header on the device and swaps on it with a high priority;
//!    `swapoff` when dropped;
//! 3. [`MemCgroup`]: creates `/sys/fs/cgroup/memory/zmem-bench-<pid>` with the limit; `rmdir`
//!    when dropped;
//! 4. [`Worker`]: the worker process (this binary, `zmem bench region-worker`), which puts itself
//!    into the cgroup before it allocates anything; killed (SIGTERM, then SIGKILL) and reaped
//!    when dropped if it is still running. It dies with this process (PR_SET_PDEATHSIG).

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use anyhow::Context;
use serde::{Deserialize, Serialize};

use super::driver::{run_workload, Driver, FaultCounter, Mem};
use super::side::{MemoryUse, SideResult};
use super::{FailAt, RegionArgs, RegionWorkerArgs, Workload};
use crate::abort::{aborted, Interrupted};
use crate::corpus::Corpus;
use crate::kernel::memcg::{
    cg_read_u64, cg_write, memory_stat, oom_kills, MemCgroup, CGROUP_PREFIX, MEMCG_ROOT, STAT_POLL,
};
use crate::kernel::memcg::{memcg_v1_available, note_leftover_cgroups};
use crate::kernel::swap::{other_swap_note, swaps, SwapOn, SWAP_PRIORITY};
use crate::kernel::zram::{self, parse_mm_stat, MmStat, ZramError, ZramSession, ZRAM_INDEX};
use crate::process::{self, signal_name};
use zmem_os::{Mapping, MappingFlags};
use zmem_runenv::size::format_size;

/// What the kernel side did.
#[derive(Debug)]
pub enum KernelOutcome {
    Ran(Box<SideResult>),
    /// Did not run (not root, no cgroup v1 memory controller, zram0 missing or in use): why.
    Skipped(String),
}

/// Everything the worker needs, passed as JSON on its command line.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct WorkerSpec {
    pub workload: Workload,
    pub corpus: PathBuf,
    pub cgroup: PathBuf,
    pub zram: u32,
    pub zram_alg: String,
    pub disksize: u64,
    pub parent_pid: u32,
    pub fail: Option<FailAt>,
}

/// Runs the workload on the kernel side and restores the machine. Conditions under which the
/// kernel side cannot run are a [`KernelOutcome::Skipped`]; a failure once it runs is an error
/// (returned after the machine was restored).
pub fn run_kernel(
    args: &RegionArgs,
    w: &Workload,
    corpus_dir: &Path,
) -> anyhow::Result<KernelOutcome> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        return Ok(KernelOutcome::Skipped(format!(
            "the kernel side needs root (a memory cgroup, swapon, /dev/zram0); running as uid {uid}"
        )));
    }
    if !memcg_v1_available() {
        return Ok(KernelOutcome::Skipped(format!(
            "no cgroup v1 memory controller at {MEMCG_ROOT} (cgroup v2 is not supported yet)"
        )));
    }
    note_leftover_cgroups();
    let swaps_before = swaps()?;
    let mut session = match ZramSession::acquire(ZRAM_INDEX) {
        Ok(s) => s,
        Err(e @ (ZramError::NotRoot(_) | ZramError::NoZram(_) | ZramError::InUse { .. })) => {
            return Ok(KernelOutcome::Skipped(e.to_string()));
        }
        Err(e) => return Err(e.into()),
    };
    let then = format!(
        "it is left alone and the kernel may use it beside zram0 (which gets priority \
         {SWAP_PRIORITY})"
    );
    if let Some(note) = other_swap_note(&swaps_before, &then) {
        eprintln!("{note}");
    }
    // Room for the whole working set and the worker's own pages, never the limit of the run.
    let disksize = (w.size + w.size / 4 + (64 << 20)).div_ceil(4096) * 4096;
    let cg_path = Path::new(MEMCG_ROOT).join(format!("{CGROUP_PREFIX}{}", std::process::id()));
    let attempts = 1 + args.kernel_oom_retries;
    let mut oom_killed = 0u32;
    let mut result = loop {
        match kernel_attempt(args, w, corpus_dir, &mut session, disksize, &cg_path) {
            Ok(r) => break r,
            Err(Attempt::OomKilled(e)) if oom_killed + 1 < attempts => {
                oom_killed += 1;
                eprintln!(
                    "zmem: kernel side: {e:#}; the machine was restored, running it again \
                     (attempt {} of {attempts})",
                    oom_killed + 1
                );
            }
            Err(Attempt::OomKilled(e) | Attempt::Failed(e)) => return Err(e),
        }
    };
    if oom_killed > 0 {
        eprintln!(
            "zmem: note: the kernel's memory cgroup OOM-killed the workload {oom_killed} time(s) \
             before this run completed (recorded as oom_killed_attempts)"
        );
    }

    // Restore (zram reset; swap and cgroup went with the attempt), then check that the
    // machine is as found.
    drop(session);
    let swaps_after = swaps()?;
    let zram_disksize = zram::disksize(ZRAM_INDEX).ok();
    let restored = serde_json::json!({
        "swaps_as_before": swaps_after == swaps_before,
        "cgroup_removed": !cg_path.exists(),
        "zram_disksize": zram_disksize,
    });
    if swaps_after != swaps_before || cg_path.exists() || zram_disksize != Some(0) {
        eprintln!("zmem: warning: the machine is not as it was: {restored}");
    }
    if let Some(obj) = result.detail.as_object_mut() {
        obj.insert("restored".into(), restored);
        obj.insert("oom_killed_attempts".into(), oom_killed.into());
        obj.insert(
            "other_swap".into(),
            serde_json::to_value(&swaps_before).unwrap_or_default(),
        );
    }
    Ok(KernelOutcome::Ran(Box::new(result)))
}

/// How an attempt of the kernel side failed.
enum Attempt {
    /// The memory cgroup's OOM killer ended the worker: the kernel's reclaim could not keep
    /// within the limit (seen now and then at small limits on Linux 6.18's cgroup v1).
    OomKilled(anyhow::Error),
    Failed(anyhow::Error),
}

impl<E: Into<anyhow::Error>> From<E> for Attempt {
    fn from(e: E) -> Attempt {
        Attempt::Failed(e.into())
    }
}

/// One run of the worker with zram0 configured, swap on it and a fresh cgroup, all restored
/// (swapoff, rmdir) before it returns, whatever happens.
fn kernel_attempt(
    args: &RegionArgs,
    w: &Workload,
    corpus_dir: &Path,
    session: &mut ZramSession,
    disksize: u64,
    cg_path: &Path,
) -> Result<SideResult, Attempt> {
    // Reset, so each attempt starts from an empty device.
    session.configure(&args.zram_alg, disksize)?;
    let swap = SwapOn::enable(&session.device(), SWAP_PRIORITY)?;
    // The worker sets the limit itself once its own memory is in place (see worker_main).
    let name = cg_path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let cg = MemCgroup::create(Path::new(MEMCG_ROOT), &name, None)?;
    let spec = WorkerSpec {
        workload: w.clone(),
        corpus: corpus_dir.to_path_buf(),
        cgroup: cg_path.to_path_buf(),
        zram: session.index(),
        zram_alg: args.zram_alg.clone(),
        disksize,
        parent_pid: std::process::id(),
        fail: args.worker_fail,
    };
    eprintln!("zmem: kernel-zram: {}", w.describe());
    let mut worker = Worker::spawn(&spec)?;
    let waited = worker.wait(Some(&cg_path.join("memory.stat")));
    drop(worker);
    let text = match waited {
        Ok(t) => t,
        Err(e) => {
            let ooms = oom_kills(cg_path);
            if ooms > 0 && e.downcast_ref::<Interrupted>().is_none() {
                return Err(Attempt::OomKilled(e.context(format!(
                    "the memory cgroup's OOM killer struck ({ooms}): the kernel could not \
                     reclaim enough to stay within the limit"
                ))));
            }
            return Err(Attempt::Failed(e));
        }
    };
    let result: SideResult = serde_json::from_str(text.trim())
        .with_context(|| format!("parsing the kernel-side worker's report {text:?}"))?;
    drop(cg);
    drop(swap);
    Ok(result)
}

/// The worker process of the kernel side.
pub struct Worker {
    child: Child,
    stdout: Option<std::thread::JoinHandle<std::io::Result<String>>>,
    reaped: bool,
}

impl Worker {
    /// Starts this binary as `zmem bench region-worker --spec JSON` (stdout piped for its
    /// report, stderr shared for its progress and errors).
    pub fn spawn(spec: &WorkerSpec) -> anyhow::Result<Worker> {
        let exe = process::self_exe()?;
        let json = serde_json::to_string(spec)?;
        let mut child = Command::new(&exe)
            .args(["bench", "region-worker", "--spec", &json])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting the kernel-side worker {}", exe.display()))?;
        let mut out = child.stdout.take().expect("stdout was piped");
        let stdout = std::thread::spawn(move || {
            let mut s = String::new();
            out.read_to_string(&mut s).map(|_| s)
        });
        Ok(Worker {
            child,
            stdout: Some(stdout),
            reaped: false,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Waits for the worker; its stdout on success. An interrupt stops it. Meanwhile reads
    /// `poll_stat` (a memory.stat) every [`STAT_POLL`], see there.
    pub fn wait(&mut self, poll_stat: Option<&Path>) -> anyhow::Result<String> {
        loop {
            if let Some(p) = poll_stat {
                let _ = std::fs::read(p);
            }
            if let Some(status) = self.child.try_wait().context("waiting for the worker")? {
                self.reaped = true;
                let text = match self.stdout.take().map(|h| h.join()) {
                    Some(Ok(Ok(s))) => s,
                    _ => String::new(),
                };
                if status.success() {
                    return Ok(text);
                }
                anyhow::bail!(
                    "the kernel-side worker (pid {}) {}",
                    self.pid(),
                    describe_status(status)
                );
            }
            if aborted() {
                self.terminate();
                return Err(Interrupted.into());
            }
            std::thread::sleep(STAT_POLL);
        }
    }

    /// SIGTERM, up to 3 s for it to exit, then SIGKILL; reaps it.
    fn terminate(&mut self) {
        if self.reaped {
            return;
        }
        let pid = self.child.id();
        let t = process::terminate(&mut self.child, Duration::from_secs(3));
        self.reaped = true;
        if t.killed {
            eprintln!("zmem: killed the kernel-side worker (pid {pid})");
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.terminate();
        if let Some(h) = self.stdout.take() {
            let _ = h.join();
        }
    }
}

fn describe_status(s: ExitStatus) -> String {
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c} (its message is above)"),
        (None, Some(sig)) => format!("was killed by signal {sig}{}", signal_name(sig)),
        _ => format!("ended with {s}"),
    }
}

/// The kernel-side counters around the measured phase.
struct KernelSnap {
    stat: HashMap<String, u64>,
    mm: MmStat,
}

fn kernel_snap(cg: &Path, zram: u32) -> anyhow::Result<KernelSnap> {
    let mm_path = format!("/sys/block/zram{zram}/mm_stat");
    let text = std::fs::read_to_string(&mm_path).with_context(|| format!("reading {mm_path}"))?;
    Ok(KernelSnap {
        stat: memory_stat(cg)?,
        mm: parse_mm_stat(&text)?,
    })
}

/// `zmem bench region-worker`: joins the cgroup, then allocates, fills and accesses, and prints
/// its [`SideResult`] as one JSON line on stdout.
pub fn worker_main(a: &RegionWorkerArgs) -> anyhow::Result<()> {
    let spec: WorkerSpec = serde_json::from_str(&a.spec).context("parsing --spec")?;
    // First of all: into the cgroup, so every page this process allocates is charged there.
    cg_write(
        &spec.cgroup,
        "cgroup.procs",
        &std::process::id().to_string(),
    )?;
    // Die with the parent, whatever ends it.
    // SAFETY: prctl(PR_SET_PDEATHSIG) takes a signal number; no memory is involved.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) };
    // SAFETY: getppid has no preconditions.
    let ppid = unsafe { libc::getppid() };
    anyhow::ensure!(
        ppid as u32 == spec.parent_pid,
        "the parent (pid {}) is gone",
        spec.parent_pid
    );
    crate::abort::install_abort_handler();
    if spec.fail == Some(FailAt::Start) {
        anyhow::bail!("injected failure at the start of the worker");
    }
    let w = spec.workload.clone();
    w.validate()?;
    let corpus = Corpus::load(&spec.corpus)?;
    let mut driver = Driver::new(&w, &corpus, "kernel-zram", FaultCounter::Major);
    let cg = spec.cgroup.as_path();
    // The worker's own memory stays in DRAM, as the zmem side's does (only the region tiers
    // there): otherwise the kernel would also swap the corpus copy and the histograms, and
    // their faults would count as the working set's.
    // SAFETY: mlockall takes flags only.
    let locked = unsafe { libc::mlockall(libc::MCL_CURRENT) } == 0;
    if !locked {
        let e = std::io::Error::last_os_error();
        eprintln!("zmem: worker: warning: mlockall failed ({e}); its own pages may be swapped");
    }

    // The worker's own memory (corpus copy, pattern tables, histograms) is charged to the
    // cgroup too: the limit becomes the budget plus this baseline, so the working set gets
    // `resident` bytes of DRAM, as on the zmem side.
    let base_usage = cg_read_u64(cg, "memory.usage_in_bytes")?;
    let base_stat = memory_stat(cg)?;
    let rc = |s: &HashMap<String, u64>| {
        s.get("rss").copied().unwrap_or(0) + s.get("cache").copied().unwrap_or(0)
    };
    let base_rc = rc(&base_stat);
    let limit = w.resident + base_usage;
    cg_write(cg, "memory.limit_in_bytes", &limit.to_string())?;
    eprintln!(
        "zmem: worker: cgroup limit {} = --resident {} + the worker's own {}",
        format_size(limit),
        format_size(w.resident),
        format_size(base_usage)
    );

    // 4 KiB pages like the zmem side (a huge page is swapped as one otherwise).
    let len = usize::try_from(w.size).context("size")?;
    let map = Mapping::new(len, MappingFlags::RESERVE_SMALL_PAGES)
        .with_context(|| format!("mmap of {}", format_size(len as u64)))?;
    // SAFETY: map is w.size bytes of read-write, page-aligned memory, unmapped only when map
    // is dropped after run_workload has joined all its threads; nothing else touches it.
    let mem = unsafe { Mem::new(map.as_ptr(), w.pages()) };
    let fail = spec.fail;
    let m = run_workload(
        &mut driver,
        mem,
        || inject(fail),
        || kernel_snap(cg, spec.zram),
    )?;
    let (s0, s1) = (&m.before, &m.after);
    let get = |s: &KernelSnap, k: &str| s.stat.get(k).copied().unwrap_or(0);
    let resident = rc(&s1.stat).saturating_sub(base_rc);
    let memory = MemoryUse::new(
        w.size,
        resident,
        0,
        s1.mm.mem_used_total,
        s1.mm.orig_data_size,
        s1.mm.compr_data_size,
    );
    // The access threads' own major faults: the working set's. The process count also has a
    // few hundred faults of the main thread (its stack and heap idle while it waits).
    let faults = m.report.thread_majflt;
    let keys = [
        "rss",
        "cache",
        "swap",
        "pgmajfault",
        "pgfault",
        "pgpgin",
        "pgpgout",
    ];
    let stat_after: serde_json::Map<String, serde_json::Value> = keys
        .iter()
        .filter_map(|k| Some((k.to_string(), s1.stat.get(*k)?.to_owned().into())))
        .collect();
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .ok()
    };
    let detail = serde_json::json!({
        "zram_device": format!("/dev/zram{}", spec.zram),
        "zram_alg": spec.zram_alg,
        "zram_disksize": spec.disksize,
        "swap_priority": SWAP_PRIORITY,
        "parent_reads_memory_stat_every_ms": STAT_POLL.as_millis() as u64,
        "cgroup": cg.display().to_string(),
        "limit_in_bytes": limit,
        "baseline_usage_bytes": base_usage,
        "baseline_rss_cache_bytes": base_rc,
        "cgroup_swappiness": read(&format!("{}/memory.swappiness", cg.display())),
        "vm_page_cluster": read("/proc/sys/vm/page-cluster"),
        "thp": "MADV_NOHUGEPAGE on the working set",
        "worker_memory_locked": locked,
        "measured_phase": {
            "cgroup_pgmajfault": get(s1, "pgmajfault").saturating_sub(get(s0, "pgmajfault")),
            "process_majflt": m.report.majflt,
            "access_threads_majflt": m.report.thread_majflt,
            "access_threads_minflt": m.report.thread_minflt,
            "zram_orig_data_size_delta": s1.mm.orig_data_size as i64 - s0.mm.orig_data_size as i64,
        },
        "cgroup_stat_after": stat_after,
        "mm_stat_after": s1.mm,
    });
    let result = SideResult::new(
        "kernel-zram",
        "kernel-zram",
        &w,
        m.report,
        faults,
        memory,
        detail,
    );
    drop(map);
    let line = serde_json::to_string(&result)?;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}").and_then(|()| stdout.flush())?;
    Ok(())
}

fn inject(fail: Option<FailAt>) -> anyhow::Result<()> {
    match fail {
        Some(FailAt::Fill) => anyhow::bail!("injected failure after the fill"),
        Some(FailAt::Abort) => {
            eprintln!("zmem: worker: injected abort after the fill");
            let none = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            // SAFETY: &none is a valid rlimit; no core file is left behind by the crash.
            unsafe { libc::setrlimit(libc::RLIMIT_CORE, &none) };
            std::process::abort()
        }
        Some(FailAt::Hang) => loop {
            if aborted() {
                return Err(Interrupted.into());
            }
            std::thread::sleep(Duration::from_millis(20));
        },
        Some(FailAt::Start) | None => Ok(()),
    }
}
