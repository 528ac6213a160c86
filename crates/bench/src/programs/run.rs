//! One execution of a program ([`execute`]: its stdout compared byte for byte with the plain
//! run's as it streams, its CPU and faults from wait4, a timeout and Ctrl-C that kill its process
//! group), the kernel side's guards ([`KernelSide`]: zram0 as lz4 swap and one memory cgroup,
//! restored when dropped, also on error and interrupt), and the loop over programs, sides,
//! budgets and repeats ([`run`]).

use std::ffi::CString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use zmem_runenv::report::RunReport;
use zmem_runenv::size::{format_mib, format_size};

use super::inputs::{command_job, locate, prepare, Job};
use super::report::{self, KernelFigures, ProgramResult, RunRecord, Side, Skipped, ZmemFigures};
use super::ProgramsArgs;
use crate::abort::{aborted, check_abort, install_abort_handler, Interrupted};
use crate::kernel::memcg::{
    cg_read_u64, cg_write, memcg_v1_available, note_leftover_cgroups, oom_kills, MemCgroup,
    CGROUP_PREFIX, MEMCG_ROOT,
};
use crate::kernel::swap::{other_swap_note, swaps, SwapOn, SWAP_PRIORITY};
use crate::kernel::zram::{self, read_mm_stat, ZramSession, ZRAM_INDEX};
use crate::kv::server::StatPoller;
use crate::process::{self_exe, signal_name, ScratchDir};
use crate::report::{progress_enabled, write_json, MachineInfo};

/// Virtual size of zram0 on the kernel side: room for any of the programs' heaps, swapped whole.
const ZRAM_DISKSIZE: u64 = 4 << 30;
/// Lines of a program's stderr kept for messages.
const STDERR_LINES: usize = 8;

/// Where a run's stdout goes.
pub enum Sink<'a> {
    /// Saved: the plain run's first output, the reference.
    Save(&'a Path),
    /// Compared with the reference as it streams (and dropped).
    Compare(&'a Path),
}

/// How a run ended and what it cost (wait4's rusage: the program and the children it waited for).
#[derive(Clone, Debug, Default)]
pub struct Exit {
    /// The raw wait status.
    pub status: i32,
    pub wall_s: f64,
    pub user_s: f64,
    pub sys_s: f64,
    /// Peak RSS, bytes (the program or its largest waited-for child).
    pub max_rss: u64,
    /// Most resident anonymous memory of the started process (not its children), bytes,
    /// sampled every 10 ms; 0 if never read. Without a limit (the plain run) this is its heap's
    /// footprint under its own allocator.
    pub peak_anon: u64,
    pub major_faults: u64,
    pub minor_faults: u64,
    /// Killed after `--timeout`.
    pub timed_out: bool,
    /// Bytes of stdout.
    pub output_bytes: u64,
    /// Where the output first differs from the reference (None: identical, or saved).
    pub first_difference: Option<u64>,
    /// What the output held there beside what the reference holds (`Difference::describe`).
    pub difference: Option<String>,
    pub stderr_tail: Vec<String>,
}

/// Where an output first differs from its reference, with the bytes around it on both sides.
struct Difference {
    at: u64,
    got: Vec<u8>,
    want: Vec<u8>,
}

/// Bytes of each side kept around a difference (from a little before it).
const DIFFERENCE_BEFORE: usize = 16;
const DIFFERENCE_AFTER: usize = 48;

impl Difference {
    fn describe(&self) -> String {
        let show = |b: &[u8]| String::from_utf8_lossy(b).escape_debug().to_string();
        format!(
            "from byte {}: got \"{}\", the plain run wrote \"{}\"",
            self.at.saturating_sub(DIFFERENCE_BEFORE as u64),
            show(&self.got),
            show(&self.want)
        )
    }
}

impl Exit {
    pub fn success(&self) -> bool {
        libc::WIFEXITED(self.status) && libc::WEXITSTATUS(self.status) == 0
    }

    pub fn killed_by(&self) -> Option<i32> {
        libc::WIFSIGNALED(self.status).then(|| libc::WTERMSIG(self.status))
    }

    /// "exited with status 1", "was killed by signal 9 (SIGKILL: ...)".
    pub fn describe(&self) -> String {
        if self.timed_out {
            return "timed out (killed)".into();
        }
        match self.killed_by() {
            Some(sig) => format!("was killed by signal {sig}{}", signal_name(sig)),
            None => format!("exited with status {}", libc::WEXITSTATUS(self.status)),
        }
    }
}

/// Runs `argv` to its end: its own process group (killed whole on timeout or Ctrl-C), killed if
/// the bench dies, in the cgroup `cgroup` from its first instruction when given.
pub fn execute(
    argv: &[String],
    env: &[(String, String)],
    stdin: Option<&Path>,
    cgroup: Option<&Path>,
    sink: Sink<'_>,
    timeout: Duration,
) -> anyhow::Result<Exit> {
    let procs = cgroup
        .map(|c| CString::new(c.join("cgroup.procs").as_os_str().as_bytes()))
        .transpose()
        .context("cgroup path")?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .envs(env.iter().map(|(k, v)| (k, v)))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    match stdin {
        Some(f) => {
            let file =
                std::fs::File::open(f).with_context(|| format!("opening {}", f.display()))?;
            cmd.stdin(file);
        }
        None => {
            cmd.stdin(Stdio::null());
        }
    }
    // SAFETY: the closure runs in the forked child before exec and only makes system calls
    // (prctl, open, write, close) on data prepared before the fork; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(procs) = &procs {
                crate::kernel::memcg::join_in_child(procs)?;
            }
            Ok(())
        });
    }
    let t0 = Instant::now();
    let mut child = cmd
        .spawn()
        .with_context(|| format!("starting {}", argv[0]))?;
    let pid = child.id() as libc::pid_t;
    let out = child.stdout.take().context("stdout pipe")?;
    let err = child.stderr.take().context("stderr pipe")?;
    let out_reader = match sink {
        Sink::Save(p) => {
            let f =
                std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?;
            std::thread::spawn(move || save(out, f))
        }
        Sink::Compare(p) => {
            let f = std::fs::File::open(p).with_context(|| format!("opening {}", p.display()))?;
            std::thread::spawn(move || compare(out, f))
        }
    };
    let err_reader = std::thread::spawn(move || {
        let mut tail = std::collections::VecDeque::new();
        for line in BufReader::new(err).lines() {
            let Ok(line) = line else { break };
            if tail.len() == STDERR_LINES {
                tail.pop_front();
            }
            tail.push_back(line);
        }
        Vec::from(tail)
    });

    let mut status = 0;
    // SAFETY: rusage is plain old data.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let mut timed_out = false;
    let mut interrupted = false;
    let mut killed = false;
    let mut peak_anon = 0;
    let status_path = format!("/proc/{pid}/status");
    for polls in 0u64.. {
        if polls % 5 == 0 {
            peak_anon = peak_anon.max(rss_anon(&status_path).unwrap_or(0));
        }
        // SAFETY: pid is our child, not reaped yet; status and ru are valid out-pointers.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid {
            break;
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(e).context("wait4");
        }
        if !killed && (aborted() || t0.elapsed() >= timeout) {
            timed_out = !aborted();
            interrupted = aborted();
            // SAFETY: the process group of our child (its own, made at spawn), not yet reaped,
            // so the group id cannot name anything else.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            killed = true;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    let wall_s = t0.elapsed().as_secs_f64();
    // The program is reaped; what it started in its group may still hold the pipes.
    // SAFETY: kill(2) on the group our child led; empty groups give ESRCH.
    unsafe { libc::kill(-pid, libc::SIGKILL) };
    drop(child);
    let (output_bytes, difference) = out_reader
        .join()
        .map_err(|_| anyhow::anyhow!("the output reader panicked"))??;
    let first_difference = difference.as_ref().map(|d| d.at);
    let difference = difference.as_ref().map(Difference::describe);
    let stderr_tail = err_reader.join().unwrap_or_default();
    if interrupted {
        return Err(Interrupted.into());
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    Ok(Exit {
        status,
        wall_s,
        user_s: secs(ru.ru_utime),
        sys_s: secs(ru.ru_stime),
        max_rss: ru.ru_maxrss as u64 * 1024,
        peak_anon,
        major_faults: ru.ru_majflt as u64,
        minor_faults: ru.ru_minflt as u64,
        timed_out,
        output_bytes,
        first_difference,
        difference,
        stderr_tail,
    })
}

/// `RssAnon` of a /proc/PID/status file, in bytes (None: gone, or a kernel without the line).
fn rss_anon(status_path: &str) -> Option<u64> {
    let text = std::fs::read_to_string(status_path).ok()?;
    parse_rss_anon(&text)
}

fn parse_rss_anon(status: &str) -> Option<u64> {
    let line = status.lines().find(|l| l.starts_with("RssAnon:"))?;
    let kib: u64 = line["RssAnon:".len()..]
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()?;
    Some(kib * 1024)
}

/// Copies the output to `f`: (bytes, None).
fn save(mut out: impl Read, f: std::fs::File) -> anyhow::Result<(u64, Option<Difference>)> {
    let mut w = std::io::BufWriter::with_capacity(1 << 20, f);
    let n = std::io::copy(&mut out, &mut w).context("saving the output")?;
    w.flush().context("saving the output")?;
    Ok((n, None))
}

/// Reads the output to its end, comparing it with `reference`: (bytes, first differing byte).
/// The difference keeps the bytes around it: from `DIFFERENCE_BEFORE` before it, within the
/// chunk of output it was found in.
fn compare(
    mut out: impl Read,
    reference: std::fs::File,
) -> anyhow::Result<(u64, Option<Difference>)> {
    let mut reference = BufReader::with_capacity(1 << 20, reference);
    let mut buf = vec![0u8; 1 << 16];
    let mut want = vec![0u8; 1 << 16];
    let mut pos = 0u64;
    let mut diff: Option<Difference> = None;
    loop {
        let n = match out.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("reading the output"),
        };
        if diff.is_none() {
            let got =
                read_up_to(&mut reference, &mut want[..n]).context("reading the reference")?;
            let mismatch = buf[..got]
                .iter()
                .zip(&want[..got])
                .position(|(a, b)| a != b)
                .or((got < n).then_some(got));
            if let Some(i) = mismatch {
                let from = i.saturating_sub(DIFFERENCE_BEFORE);
                let cap = want.len();
                let extra = read_up_to(
                    &mut reference,
                    &mut want[got..(got + DIFFERENCE_AFTER).min(cap)],
                )
                .context("reading the reference")?;
                diff = Some(Difference {
                    at: pos + i as u64,
                    got: buf[from..(i + DIFFERENCE_AFTER).min(n)].to_vec(),
                    want: want[from..(i + DIFFERENCE_AFTER).min(got + extra)].to_vec(),
                });
            }
        }
        pos += n as u64;
    }
    // The reference goes on past the output's end: a shorter output.
    if diff.is_none() {
        let more = read_up_to(&mut reference, &mut want[..DIFFERENCE_AFTER])?;
        if more > 0 {
            diff = Some(Difference {
                at: pos,
                got: Vec::new(),
                want: want[..more].to_vec(),
            });
        }
    }
    Ok((pos, diff))
}

/// Reads until `buf` is full or the end: bytes read.
fn read_up_to(r: &mut impl Read, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match r.read(&mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// The kernel side for the whole bench: /dev/zram0 as swap (highest priority) and one memory
/// cgroup whose limit is set to each budget in turn. Dropped in field order: the cgroup is
/// removed, swap turned off, zram0 reset, as found.
pub struct KernelSide {
    cgroup: MemCgroup,
    _swap: SwapOn,
    _zram: ZramSession,
    /// The zram configuration, for the JSON.
    pub info: serde_json::Value,
}

/// Why the kernel side cannot run here (None: it can be tried).
pub fn kernel_unavailable() -> Option<String> {
    if !memcg_v1_available() {
        return Some(format!(
            "the cgroup v1 memory controller is not mounted at {MEMCG_ROOT}"
        ));
    }
    None
}

impl KernelSide {
    /// Takes zram0 (root, free: else Err with the reason), makes it lz4 swap, creates the cgroup.
    pub fn setup(alg: &str) -> anyhow::Result<Result<KernelSide, String>> {
        let mut zram = match ZramSession::acquire(ZRAM_INDEX) {
            Ok(z) => z,
            Err(e) => return Ok(Err(e.to_string())),
        };
        if let Some(why) = kernel_unavailable() {
            return Ok(Err(why));
        }
        note_leftover_cgroups();
        if let Some(note) = other_swap_note(
            &swaps()?,
            "the kernel side may swap there too, beside zram0 (which has the highest priority)",
        ) {
            eprintln!("{note}");
        }
        zram.configure(alg, ZRAM_DISKSIZE)?;
        let swap = SwapOn::enable(&zram.device(), SWAP_PRIORITY)?;
        let name = format!("{CGROUP_PREFIX}{}", std::process::id());
        let cgroup = MemCgroup::create(Path::new(MEMCG_ROOT), &name, None)?;
        cg_write(cgroup.path(), "memory.swappiness", "100")?;
        let info = serde_json::json!({
            "device": zram.device().display().to_string(),
            "algorithm": alg,
            "disksize": ZRAM_DISKSIZE,
            "swap_priority": SWAP_PRIORITY,
            "cgroup": cgroup.path().display().to_string(),
            "swappiness": 100,
        });
        Ok(Ok(KernelSide {
            cgroup,
            _swap: swap,
            _zram: zram,
            info,
        }))
    }

    /// One run in the cgroup limited to `limit`, with the memory.stat poller beside it (see
    /// [`crate::kernel::memcg::STAT_POLL`]).
    fn run(
        &self,
        job: &Job,
        limit: u64,
        reference: &Path,
        timeout: Duration,
    ) -> anyhow::Result<(Exit, KernelFigures)> {
        let cg = self.cgroup.path();
        cg_write(cg, "memory.limit_in_bytes", &limit.to_string())?;
        cg_write(cg, "memory.max_usage_in_bytes", "0")?;
        let _ = std::fs::write(format!("/sys/block/zram{ZRAM_INDEX}/mem_used_max"), "0");
        let oom_before = oom_kills(cg);
        let poller = StatPoller::start(cg);
        let exit = execute(
            &job.argv,
            &job.env,
            job.stdin.as_deref(),
            Some(cg),
            Sink::Compare(reference),
            timeout,
        );
        drop(poller);
        let exit = exit?;
        let figures = KernelFigures {
            limit,
            oom_kills: oom_kills(cg).saturating_sub(oom_before),
            max_usage: cg_read_u64(cg, "memory.max_usage_in_bytes").unwrap_or(0),
            zram_mem_used_max: read_mm_stat(ZRAM_INDEX)
                .map(|m| m.mem_used_max)
                .unwrap_or(0),
        };
        Ok((exit, figures))
    }
}

/// What a zmem run reported through --stats, summed over the processes it ran.
fn zmem_figures(stats: &Path) -> Option<ZmemFigures> {
    let text = std::fs::read_to_string(stats).ok()?;
    let r: RunReport = serde_json::from_str(&text).ok()?;
    let all: Vec<&zmem_runenv::ProcessStats> =
        std::iter::once(&r.zmem).chain(r.others.iter()).collect();
    Some(ZmemFigures {
        processes: all.len(),
        major_faults: all.iter().map(|s| s.major_faults()).sum(),
        zero_faults: all.iter().map(|s| s.zero_faults()).sum(),
        evictions: all.iter().map(|s| s.evictions()).sum(),
        peak_data: r.peak_data,
        peak_dram: r.peak_dram,
        codec_cpu_s: all.iter().map(|s| s.codec_cpu_ns).sum::<u64>() as f64 / 1e9,
    })
}

/// `zmem bench programs`.
pub fn run(args: &ProgramsArgs) -> anyhow::Result<()> {
    args.validate()?;
    let budgets = args.budgets();
    let timeout = Duration::from_secs_f64(args.timeout);
    let mut skipped = Vec::new();
    let mut present = Vec::new();
    for p in args.selected() {
        match locate(p) {
            Some(bin) => present.push(Subject::Builtin(p, bin)),
            None => {
                let reason = format!(
                    "{} is not installed (Debian package {}: apt-get install {})",
                    p.binary(),
                    p.package(),
                    p.package()
                );
                eprintln!("zmem: note: {} skipped: {reason}", p.name());
                skipped.push(Skipped {
                    program: p.name().to_string(),
                    reason,
                });
            }
        }
    }
    present.extend(args.commands.iter().map(Subject::Command));
    anyhow::ensure!(
        !present.is_empty(),
        "none of the programs asked for is installed: {}",
        skipped
            .iter()
            .map(|s| s.reason.as_str())
            .collect::<Vec<_>>()
            .join("; ")
    );
    install_abort_handler();
    let swaps_before = swaps()?;
    let zram_before = zram::disksize(ZRAM_INDEX).ok();
    let (kernel, kernel_skipped) = if args.no_kernel {
        (None, Some("--no-kernel was given".to_string()))
    } else {
        match KernelSide::setup(&args.zram_alg)? {
            Ok(k) => (Some(k), None),
            Err(why) => {
                eprintln!(
                    "zmem: note: the kernel side is skipped: {why}; running plain and zmem only \
                     (--no-kernel does so without this note)"
                );
                (None, Some(why))
            }
        }
    };
    let kernel_info = kernel.as_ref().map(|k| k.info.clone());
    let scratch = ScratchDir::create("programs")?;
    let zmem = self_exe()?;
    let per_program =
        args.repeat as u64 * (1 + budgets.len() as u64 * (1 + kernel.is_some() as u64));
    let pb = if progress_enabled() {
        let pb = indicatif::ProgressBar::new(per_program * present.len() as u64);
        if let Ok(style) = indicatif::ProgressStyle::with_template(
            "{msg:40} [{bar:30}] {pos}/{len} runs, {elapsed}",
        ) {
            pb.set_style(style.progress_chars("=> "));
        }
        pb
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut results: Vec<ProgramResult> = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    let mut failure: Option<anyhow::Error> = None;
    for subject in &present {
        if aborted() {
            failure = Some(Interrupted.into());
            break;
        }
        let ctx = Ctx {
            args,
            budgets: &budgets,
            kernel: kernel.as_ref(),
            zmem: &zmem,
            dir: scratch.path(),
            timeout,
            pb: &pb,
        };
        match run_program(&ctx, subject, &mut errors) {
            Ok(r) => results.push(r),
            Err(e) if e.downcast_ref::<Interrupted>().is_some() => {
                failure = Some(e);
                break;
            }
            Err(e) => {
                let msg = format!("{}: {e:#}", subject.name());
                eprintln!("zmem: {msg}");
                errors.push(msg);
            }
        }
    }
    pb.finish_and_clear();
    // The machine as found before anything is printed.
    drop(kernel);
    drop(scratch);
    let restored = serde_json::json!({
        "swaps_as_before": swaps()? == swaps_before,
        "zram_disksize": zram::disksize(ZRAM_INDEX).ok(),
        "zram_disksize_before": zram_before,
        "cgroup_removed": !Path::new(MEMCG_ROOT)
            .join(format!("{CGROUP_PREFIX}{}", std::process::id()))
            .exists(),
    });

    let machine = MachineInfo::collect();
    let summaries = report::summarize(&results, &budgets);
    if !results.is_empty() {
        println!(
            "machine: {} CPUs, {}, {}",
            machine.nproc, machine.cpu_model, machine.kernel
        );
        println!("{}", report::table(&summaries, kernel_info.is_some()));
        if let Some(why) = &kernel_skipped {
            println!("kernel side not run: {why}");
        }
        for s in &skipped {
            println!("{} not run: {}", s.program, s.reason);
        }
    }
    if failure.is_none() && !errors.is_empty() {
        failure = Some(anyhow::anyhow!("{}", errors.join("; ")));
    }
    let doc = serde_json::json!({
        "command": std::env::args().collect::<Vec<_>>(),
        "args": args,
        "machine": machine,
        "budgets": budgets,
        "kernel": kernel_info,
        "kernel_skipped": kernel_skipped,
        "skipped": skipped,
        "programs": results,
        "summary": summaries,
        "restored": restored,
        "errors": errors,
        "error": failure.as_ref().map(|e| format!("{e:#}")),
    });
    write_json(&args.json, &doc)?;
    eprintln!("zmem: wrote {}", args.json.display());
    if !summaries.is_empty() {
        report::plot(&summaries, kernel_info.is_some(), &args.plot)
            .with_context(|| format!("drawing {}", args.plot.display()))?;
        eprintln!("zmem: wrote {}", args.plot.display());
    }
    match failure {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// What every run of the loop needs.
struct Ctx<'a> {
    args: &'a ProgramsArgs,
    budgets: &'a [u64],
    kernel: Option<&'a KernelSide>,
    zmem: &'a Path,
    dir: &'a Path,
    timeout: Duration,
    pb: &'a indicatif::ProgressBar,
}

/// What one entry of the report runs: a built-in program (its executable found) or a
/// `--command` of the user's.
enum Subject<'a> {
    Builtin(super::Program, PathBuf),
    Command(&'a super::NamedCommand),
}

impl Subject<'_> {
    fn name(&self) -> &str {
        match self {
            Subject::Builtin(p, _) => p.name(),
            Subject::Command(c) => &c.name,
        }
    }
}

/// Every run of one program: rounds of plain, then zmem and kernel at each budget.
/// An output that differs, or a program that fails (other than by the kernel's OOM killer or
/// the timeout), is pushed to `errors` naming the program and the side.
fn run_program(
    ctx: &Ctx<'_>,
    subject: &Subject<'_>,
    errors: &mut Vec<String>,
) -> anyhow::Result<ProgramResult> {
    let name = subject.name();
    let (job, binary, package) = match subject {
        Subject::Builtin(p, bin) => {
            ctx.pb.set_message(format!("{name}: generating the input"));
            let job = prepare(*p, bin, ctx.dir, ctx.args.scale)?;
            (job, bin.display().to_string(), Some(p.package()))
        }
        Subject::Command(c) => (command_job(c), "/bin/sh".to_string(), None),
    };
    let reference = ctx.dir.join(format!("{name}.expected"));
    let stats = ctx.dir.join(format!("{name}.zmem-stats.json"));
    let mut runs: Vec<RunRecord> = Vec::new();
    // Sides that timed out are not run again.
    let mut gave_up: Vec<(Side, u64)> = Vec::new();
    for rep in 0..ctx.args.repeat {
        check_abort()?;
        ctx.pb
            .set_message(format!("{name}: plain, run {}", rep + 1));
        let sink = if rep == 0 {
            Sink::Save(&reference)
        } else {
            Sink::Compare(&reference)
        };
        let exit = execute(
            &job.argv,
            &job.env,
            job.stdin.as_deref(),
            None,
            sink,
            ctx.timeout,
        )?;
        ctx.pb.inc(1);
        if !exit.success() {
            anyhow::bail!(
                "the plain run {}; its stderr: {}",
                exit.describe(),
                stderr_line(&exit)
            );
        }
        let rec = record(Side::Plain, None, rep, &exit, None, None);
        check(&rec, name, errors);
        log_run(ctx, name, &rec);
        runs.push(rec);
        for &b in ctx.budgets {
            check_abort()?;
            if !gave_up.contains(&(Side::Zmem, b)) {
                ctx.pb.set_message(format!(
                    "{name}: zmem --resident {}, run {}",
                    format_size(b),
                    rep + 1
                ));
                let _ = std::fs::remove_file(&stats);
                let mut argv: Vec<String> = vec![
                    ctx.zmem.display().to_string(),
                    "run".into(),
                    "--resident".into(),
                    format_size(b),
                    "--quiet".into(),
                    "--fault-route".into(),
                    ctx.args.fault_route.clone(),
                    "--stats".into(),
                    stats.display().to_string(),
                ];
                if ctx.args.no_exact_fit {
                    argv.push("--no-exact-fit".into());
                }
                if let Some(at) = &ctx.args.start_at {
                    argv.extend(["--start-at".into(), at.clone()]);
                }
                argv.push("--".into());
                argv.extend(job.argv.iter().cloned());
                let exit = execute(
                    &argv,
                    &job.env,
                    job.stdin.as_deref(),
                    None,
                    Sink::Compare(&reference),
                    ctx.timeout,
                )?;
                ctx.pb.inc(1);
                let rec = record(Side::Zmem, Some(b), rep, &exit, zmem_figures(&stats), None);
                if exit.timed_out {
                    gave_up.push((Side::Zmem, b));
                }
                check(&rec, name, errors);
                log_run(ctx, name, &rec);
                runs.push(rec);
            }
            if let Some(k) = ctx.kernel {
                check_abort()?;
                if gave_up.contains(&(Side::Kernel, b)) {
                    continue;
                }
                ctx.pb.set_message(format!(
                    "{name}: kernel limit {}, run {}",
                    format_size(b),
                    rep + 1
                ));
                let (exit, figures) = k.run(&job, b, &reference, ctx.timeout)?;
                ctx.pb.inc(1);
                if exit.timed_out {
                    gave_up.push((Side::Kernel, b));
                }
                let rec = record(Side::Kernel, Some(b), rep, &exit, None, Some(figures));
                check(&rec, name, errors);
                log_run(ctx, name, &rec);
                runs.push(rec);
            }
        }
    }
    Ok(ProgramResult {
        program: name.to_string(),
        binary,
        version: job.version.clone(),
        package,
        command: job.argv.clone(),
        env: job.env.clone(),
        input_bytes: job.input_bytes,
        output_bytes: std::fs::metadata(&reference).map(|m| m.len()).unwrap_or(0),
        runs,
    })
}

fn stderr_line(e: &Exit) -> String {
    if e.stderr_tail.is_empty() {
        "(none)".into()
    } else {
        e.stderr_tail.join(" | ")
    }
}

/// A run as recorded: its outcome decided ("ok", "oom-killed", "timeout", "failed").
fn record(
    side: Side,
    resident: Option<u64>,
    rep: u32,
    exit: &Exit,
    zmem: Option<ZmemFigures>,
    kernel: Option<KernelFigures>,
) -> RunRecord {
    let oom =
        kernel.as_ref().is_some_and(|k| k.oom_kills > 0) && exit.killed_by() == Some(libc::SIGKILL);
    let outcome = if exit.timed_out {
        "timeout"
    } else if oom {
        "oom-killed"
    } else if exit.success() {
        "ok"
    } else {
        "failed"
    };
    RunRecord {
        side,
        resident,
        rep: rep + 1,
        outcome: outcome.into(),
        exit: exit.describe(),
        wall_s: exit.wall_s,
        user_s: exit.user_s,
        sys_s: exit.sys_s,
        max_rss: exit.max_rss,
        peak_anon: exit.peak_anon,
        // A userfaultfd fault counts as minor for the kernel: zmem's own count on its side.
        major_faults: match (side, &zmem) {
            (Side::Zmem, Some(z)) => z.major_faults,
            _ => exit.major_faults,
        },
        rusage_major_faults: exit.major_faults,
        rusage_minor_faults: exit.minor_faults,
        output_bytes: exit.output_bytes,
        output_matched: outcome == "ok" && exit.first_difference.is_none(),
        first_difference: exit.first_difference,
        difference: exit.difference.clone(),
        zmem,
        kernel,
        stderr_tail: exit.stderr_tail.clone(),
    }
}

/// Pushes what is wrong with a run to `errors`: an output that differs from the plain run, or a
/// failure that is not the kernel side's OOM kill or a timeout.
fn check(r: &RunRecord, program: &str, errors: &mut Vec<String>) {
    let side = r.side_label();
    let msg = match r.outcome.as_str() {
        "ok" => r.first_difference.map(|at| {
            format!(
                "{program}: {side}, run {}: the output differs from the plain run's at byte {at} \
                 ({} bytes); {}",
                r.rep,
                r.output_bytes,
                r.difference.as_deref().unwrap_or("")
            )
        }),
        "failed" => Some(format!(
            "{program}: {side}, run {}: the program {}; its stderr: {}",
            r.rep,
            r.exit,
            if r.stderr_tail.is_empty() {
                "(none)".into()
            } else {
                r.stderr_tail.join(" | ")
            }
        )),
        _ => None,
    };
    if let Some(m) = msg {
        eprintln!("zmem: error: {m}");
        errors.push(m);
    }
}

fn log_run(ctx: &Ctx<'_>, program: &str, r: &RunRecord) {
    let line = format!(
        "zmem: {program}: {}, run {}: {} in {:.2} s, CPU {:.2} s, {} major faults, peak RSS {}",
        r.side_label(),
        r.rep,
        r.outcome,
        r.wall_s,
        r.user_s + r.sys_s,
        r.major_faults,
        format_mib(r.max_rss)
    );
    if ctx.pb.is_hidden() {
        eprintln!("{line}");
    } else {
        ctx.pb.println(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Seek, Write};

    #[test]
    fn rss_anon_is_read_from_proc_status() {
        let status =
            "Name:\tjq\nVmRSS:\t  130000 kB\nRssAnon:\t  123220 kB\nRssFile:\t    4000 kB\n";
        assert_eq!(parse_rss_anon(status), Some(123_220 * 1024));
        assert_eq!(parse_rss_anon("Name:\tjq\n"), None);
        assert_eq!(parse_rss_anon("RssAnon:\t garbage kB\n"), None);
        // This process has some.
        let me = format!("/proc/{}/status", std::process::id());
        assert!(rss_anon(&me).is_some_and(|b| b > 0));
        assert_eq!(rss_anon("/proc/0/status"), None);
    }

    fn reference(bytes: &[u8]) -> std::fs::File {
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(bytes).unwrap();
        f.rewind().unwrap();
        f
    }

    #[test]
    fn compare_shows_both_sides_around_the_first_difference() {
        let want = b"300000 134999849999 1000 300000\n0 3 300009\n";
        let got = b"300400 134999849999 1000 300000\n0 3 300009\n";
        let (n, d) = compare(&got[..], reference(want)).unwrap();
        assert_eq!(n, got.len() as u64);
        let d = d.expect("a difference");
        assert_eq!(d.at, 3);
        assert_eq!(&d.got[..], &got[..]);
        assert_eq!(&d.want[..], &want[..]);
        assert!(d.describe().contains("got \"300400"), "{}", d.describe());

        let (_, same) = compare(&want[..], reference(want)).unwrap();
        assert!(same.is_none());
        // A shorter output differs where it ends, and shows what the reference goes on with.
        let (n, short) = compare(&want[..10], reference(want)).unwrap();
        assert_eq!(n, 10);
        let short = short.expect("a shorter output differs");
        assert_eq!(short.at, 10);
        assert!(short.got.is_empty());
        assert_eq!(&short.want[..], &want[10..]);
        // A longer one differs where the reference ends.
        let (_, long) = compare(&got[..], reference(&want[..5])).unwrap();
        assert_eq!(long.expect("a longer output differs").at, 3);
    }
}
