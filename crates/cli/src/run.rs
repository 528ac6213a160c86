//! `zmem run`: runs an unmodified program with its heap in a zmem region (LD_PRELOAD of
//! libzmem_preload.so, configured through ZMEM_* variables), then prints a summary in the manner
//! of zramctl (the live statistics, `zmem stat`, are in [`crate::stat`]).

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use serde::{Deserialize, Serialize};
use zmem_engine::Policy;
use zmem_region::{Budget, Eviction, Region, RegionConfig, MIN_BUDGET_BYTES};
use zmem_runenv::{OnError, ProcessStats, RunConfig};

use crate::size::{format_size as fmt_size, format_size_approx as human, parse_size};
use crate::stat::{query, table};

/// The preload library's file name.
pub const PRELOAD_LIB: &str = "libzmem_preload.so";
/// Overrides where `zmem run` finds the preload library.
pub const ENV_PRELOAD: &str = "ZMEM_PRELOAD";

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum EvictionArg {
    Clock,
    Fifo,
}

#[derive(Debug, Args)]
pub struct RunArgs {
    /// DRAM the program's heap may keep uncompressed, e.g. 2G (default 256M).
    #[arg(long, value_parser = parse_size, conflicts_with = "adaptive")]
    pub resident: Option<u64>,
    /// Size the resident budget from memory pressure instead (PSI, MemAvailable, refaults).
    #[arg(long)]
    pub adaptive: bool,
    /// Virtual size of the heap: the most the program can allocate (default 4x this machine's
    /// memory; untouched parts cost nothing).
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// DRAM the compressed pages may use (like zram's mem_limit); default unlimited.
    #[arg(long, value_parser = parse_size)]
    pub store_limit: Option<u64>,
    /// Compression policy: fast (lz4), balanced (zstd-1), max (zstd, blocks), auto.
    #[arg(long, default_value = "fast", value_parser = zmem_bench::POLICIES)]
    pub policy: String,
    /// Which pages leave DRAM first.
    #[arg(long, value_enum, default_value = "clock")]
    pub eviction: EvictionArg,
    /// Threads serving the program's page faults.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=16))]
    pub handler_threads: u8,
    /// Write the final statistics as JSON here.
    #[arg(long)]
    pub stats: Option<PathBuf>,
    /// No summary when the program exits.
    #[arg(long, short)]
    pub quiet: bool,
    /// Run the program uncompressed (with a warning) if zmem cannot start inside it, instead of
    /// failing.
    #[arg(long)]
    pub fallback: bool,
    /// The preload library (default: next to this executable, or $ZMEM_PRELOAD).
    #[arg(long)]
    pub preload: Option<PathBuf>,
    /// The program and its arguments (after `--`).
    #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true, num_args = 1..)]
    pub command: Vec<OsString>,
}

/// Why `zmem run` did not run the program; each has its exit status.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error("{0}: command not found")]
    NotFound(String),
    #[error("{0}: permission denied (not an executable file)")]
    NotExecutable(PathBuf),
    #[error(
        "{0} is statically linked: LD_PRELOAD cannot apply to it, so zmem cannot serve its heap"
    )]
    Static(PathBuf),
    #[error(
        "{0} is set-user-ID or set-group-ID: the loader ignores LD_PRELOAD for it, so zmem cannot serve its heap"
    )]
    Setuid(PathBuf),
    #[error("{0}")]
    Config(String),
    #[error("zmem cannot serve a heap on this machine: {0}; run `zmem doctor` for details")]
    Unavailable(String),
    #[error(
        "cannot find {PRELOAD_LIB} (looked in: {0}); build it with `cargo build --release --workspace`, install the zmem package, or pass --preload PATH; `zmem doctor` checks the setup"
    )]
    NoLibrary(String),
    #[error("cannot start {0}: {1}")]
    Spawn(String, std::io::Error),
    #[error("{0}")]
    Io(String),
}

impl RunError {
    /// The shell's conventions: 127 not found, 126 cannot execute, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        match self {
            RunError::NotFound(_) => 127,
            RunError::NotExecutable(_) | RunError::Static(_) | RunError::Setuid(_) => 126,
            _ => 1,
        }
    }
}

/// What `--stats FILE` holds.
#[derive(Debug, Serialize, Deserialize)]
pub struct RunReport {
    pub command: Vec<String>,
    /// Exit status, or 128 + signal.
    pub exit_code: i32,
    pub signal: Option<i32>,
    pub wall_s: f64,
    pub user_cpu_s: f64,
    pub system_cpu_s: f64,
    /// Peak resident set of the program (kernel's maxrss), bytes.
    pub max_rss: u64,
    /// The program's zmem statistics at exit (None: zmem never started in it).
    pub zmem: Option<ProcessStats>,
    /// Where the statistics come from: "exit report" or "last live sample".
    pub source: String,
    /// The most heap data (resident + compressed, uncompressed bytes) and the most DRAM it took
    /// (resident + compressed pool), over the live samples (every 0.5 s) and the exit report.
    pub peak_data: u64,
    pub peak_dram: u64,
    /// Whether the program was allowed to run uncompressed (--fallback).
    pub fallback: bool,
    /// Other processes under this run that used zmem (exec'd children).
    pub others: Vec<ProcessStats>,
}

/// The settings for the program, checked.
pub fn config(a: &RunArgs, report_dir: &Path) -> Result<RunConfig, RunError> {
    let mem = zmem_runenv::machine_memory().unwrap_or(u64::MAX);
    let resident = if a.adaptive {
        None
    } else {
        let r = a.resident.unwrap_or(zmem_runenv::DEFAULT_RESIDENT);
        if r > mem {
            return Err(RunError::Config(format!(
                "--resident {} is larger than this machine's memory ({})",
                fmt_size(r),
                human(mem)
            )));
        }
        // The region's own rule (the one minimum of every budget), with the flag's name.
        RegionConfig::new(r.max(MIN_BUDGET_BYTES), Budget::Fixed(r))
            .validate()
            .map_err(|e| {
                RunError::Config(format!(
                    "--resident {} is too small to start: {e}",
                    fmt_size(r)
                ))
            })?;
        Some(r)
    };
    if let Some(s) = a.size {
        if s < (1 << 20) {
            return Err(RunError::Config(format!(
                "--size {} is too small: at least 1M",
                fmt_size(s)
            )));
        }
        if let Some(r) = resident {
            if s < r {
                return Err(RunError::Config(format!(
                    "--size {} is smaller than --resident {}",
                    fmt_size(s),
                    fmt_size(r)
                )));
            }
        }
    }
    if let Some(l) = a.store_limit {
        if l < (1 << 20) {
            return Err(RunError::Config(format!(
                "--store-limit {} is too small: at least 1M",
                fmt_size(l)
            )));
        }
        if l > mem {
            return Err(RunError::Config(format!(
                "--store-limit {} is larger than this machine's memory ({})",
                fmt_size(l),
                human(mem)
            )));
        }
    }
    let policy: Policy = a
        .policy
        .parse()
        .map_err(|e| RunError::Config(format!("--policy: {e}")))?;
    Ok(RunConfig {
        resident,
        size: a.size,
        store_limit: a.store_limit,
        policy,
        eviction: match a.eviction {
            EvictionArg::Clock => Eviction::Clock,
            EvictionArg::Fifo => Eviction::Fifo,
        },
        handler_threads: a.handler_threads as usize,
        report_dir: Some(report_dir.to_path_buf()),
        socket_dir: std::env::var_os(zmem_runenv::ENV_SOCKET_DIR).map(PathBuf::from),
        on_error: if a.fallback {
            OnError::Off
        } else {
            OnError::Fail
        },
        log: std::env::var(zmem_runenv::ENV_LOG).ok(),
    })
}

/// Finds `name` as the shell would: a path if it has a slash, else along $PATH.
pub fn resolve(name: &OsString) -> Result<PathBuf, RunError> {
    let p = Path::new(name);
    let shown = p.display().to_string();
    if p.as_os_str().is_empty() {
        return Err(RunError::NotFound(shown));
    }
    let candidates: Vec<PathBuf> = if shown.contains('/') {
        vec![p.to_path_buf()]
    } else {
        std::env::var_os("PATH")
            .map(|path| std::env::split_paths(&path).map(|d| d.join(p)).collect())
            .unwrap_or_default()
    };
    let mut denied = None;
    for c in candidates {
        let Ok(md) = std::fs::metadata(&c) else {
            continue;
        };
        if md.is_file() && md.permissions().mode() & 0o111 != 0 {
            return Ok(c);
        }
        denied.get_or_insert(c);
    }
    Err(match denied {
        Some(c) => RunError::NotExecutable(c),
        None => RunError::NotFound(shown),
    })
}

/// Refuses programs LD_PRELOAD cannot apply to: static ELF executables (no interpreter) and
/// set-user-ID/set-group-ID files. Scripts (#!) run their interpreter, which is checked by the
/// loader like any program.
pub fn check_preloadable(path: &Path) -> Result<(), RunError> {
    let md =
        std::fs::metadata(path).map_err(|e| RunError::Io(format!("{}: {e}", path.display())))?;
    if md.permissions().mode() & 0o6000 != 0 {
        return Err(RunError::Setuid(path.to_path_buf()));
    }
    let mut head = Vec::new();
    std::fs::File::open(path)
        .and_then(|f| f.take(64 * 1024).read_to_end(&mut head))
        .map_err(|e| RunError::Io(format!("{}: {e}", path.display())))?;
    match elf_has_interpreter(&head) {
        Some(false) => Err(RunError::Static(path.to_path_buf())),
        _ => Ok(()),
    }
}

/// Some(true/false) for a 64-bit little-endian ELF executable with/without PT_INTERP; None if
/// the bytes are not one (or its program headers lie beyond `head`).
pub fn elf_has_interpreter(head: &[u8]) -> Option<bool> {
    if head.len() < 64 || &head[..4] != b"\x7fELF" || head[4] != 2 || head[5] != 1 {
        return None;
    }
    let u16_at = |o: usize| u16::from_le_bytes([head[o], head[o + 1]]) as usize;
    let u64_at = |o: usize| u64::from_le_bytes(head[o..o + 8].try_into().unwrap()) as usize;
    let (phoff, phentsize, phnum) = (u64_at(32), u16_at(54), u16_at(56));
    const PT_INTERP: u32 = 3;
    for i in 0..phnum {
        let o = phoff.checked_add(i.checked_mul(phentsize)?)?;
        let b = head.get(o..o + 4)?;
        let t = u32::from_le_bytes(b.try_into().unwrap());
        if t == PT_INTERP {
            return Some(true);
        }
    }
    Some(false)
}

/// Where the preload library may be, in order: --preload alone if given; else $ZMEM_PRELOAD,
/// next to the executable (a cargo build), its parent (cargo test binaries live in
/// target/<profile>/deps), and `<prefix>/lib/zmem/` of an installed `<prefix>/bin/zmem` (the
/// Debian package puts it in /usr/lib/zmem: a private plugin, not a library to link against).
pub fn library_candidates(
    explicit: Option<&Path>,
    env: Option<OsString>,
    exe: Option<&Path>,
) -> Vec<PathBuf> {
    if let Some(p) = explicit {
        return vec![p.to_path_buf()];
    }
    let mut c: Vec<PathBuf> = env.map(PathBuf::from).into_iter().collect();
    if let Some(dir) = exe.and_then(Path::parent) {
        c.push(dir.join(PRELOAD_LIB));
        c.push(dir.join("..").join(PRELOAD_LIB));
        c.push(dir.join("../lib/zmem").join(PRELOAD_LIB));
    }
    c
}

/// The preload library: the first of [`library_candidates`] that exists.
pub fn find_library(explicit: Option<&Path>) -> Result<PathBuf, RunError> {
    let exe = std::env::current_exe().ok();
    let candidates = library_candidates(explicit, std::env::var_os(ENV_PRELOAD), exe.as_deref());
    let mut tried = Vec::new();
    for c in candidates {
        if c.is_file() {
            return c
                .canonicalize()
                .map_err(|e| RunError::Io(format!("{}: {e}", c.display())));
        }
        tried.push(c.display().to_string());
    }
    Err(RunError::NoLibrary(tried.join(", ")))
}

/// Checks that a region can be made here and now (userfaultfd permission and features), so a
/// program is never started only to fail inside.
pub fn check_userfaultfd() -> Result<(), RunError> {
    let cfg = RegionConfig::new(1 << 20, Budget::Fixed(MIN_BUDGET_BYTES));
    Region::new(cfg)
        .map(drop)
        .map_err(|e| RunError::Unavailable(e.to_string()))
}

static CHILD: AtomicI32 = AtomicI32::new(0);

extern "C" fn forward(sig: libc::c_int) {
    let pid = CHILD.load(Ordering::Relaxed);
    if pid > 0 {
        // SAFETY: kill is async-signal-safe.
        unsafe { libc::kill(pid, sig) };
    }
}

/// Terminal signals reach the program (it is in our process group) and zmem stays to report;
/// termination requests sent to zmem alone are passed on.
fn handle_signals() {
    // SAFETY: installing handlers / ignoring signals in this single-purpose process.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        for s in [libc::SIGTERM, libc::SIGHUP, libc::SIGUSR1, libc::SIGUSR2] {
            libc::signal(s, forward as *const () as libc::sighandler_t);
        }
    }
}

/// Runs the program; returns its exit status (128 + signal if killed).
pub fn run(a: &RunArgs) -> Result<i32, RunError> {
    let report_dir = tempfile::Builder::new()
        .prefix("zmem-run-")
        .tempdir()
        .map_err(|e| RunError::Io(format!("cannot make a report directory: {e}")))?;
    let cfg = config(a, report_dir.path())?;
    let program = resolve(&a.command[0])?;
    check_preloadable(&program)?;
    let lib = find_library(a.preload.as_deref())?;
    if !a.fallback {
        // With --fallback the library itself warns and lets the program run uncompressed.
        check_userfaultfd()?;
    }

    let mut preload = lib.as_os_str().to_os_string();
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = Command::new(&program);
    cmd.arg0(&a.command[0]).args(&a.command[1..]);
    for v in zmem_runenv::ALL_VARS {
        cmd.env_remove(v);
    }
    cmd.envs(cfg.to_vars()).env("LD_PRELOAD", preload);
    let name = a.command[0].to_string_lossy().into_owned();
    let started = Instant::now();
    let child = cmd.spawn().map_err(|e| RunError::Spawn(name.clone(), e))?;
    let pid = child.id();
    CHILD.store(pid as i32, Ordering::Relaxed);
    handle_signals();

    let socket_dir = zmem_runenv::socket_dir(cfg.socket_dir.as_deref());
    let mut last_live: Option<ProcessStats> = None;
    let (mut peak_data, mut peak_dram) = (0u64, 0u64);
    let mut status = 0;
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let mut next_poll = Instant::now() + Duration::from_millis(200);
    loop {
        // SAFETY: waiting for our own child, filling status and ru.
        let r = unsafe { libc::wait4(pid as i32, &mut status, libc::WNOHANG, &mut ru) };
        if r == pid as i32 {
            break;
        }
        if r < 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return Err(RunError::Io(format!("waiting for {name}: {e}")));
        }
        if Instant::now() >= next_poll {
            if let Ok(s) = query(&socket_dir, pid) {
                peak_data = peak_data.max(s.data());
                peak_dram = peak_dram.max(s.resident() + s.mem_used_total());
                last_live = Some(s);
            }
            next_poll = Instant::now() + Duration::from_millis(500);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    CHILD.store(0, Ordering::Relaxed);
    let wall = started.elapsed();
    let _ = std::fs::remove_file(zmem_runenv::socket_path(&socket_dir, pid));
    let (code, signal) = if libc::WIFSIGNALED(status) {
        let s = libc::WTERMSIG(status);
        (128 + s, Some(s))
    } else {
        (libc::WEXITSTATUS(status), None)
    };

    let read_report =
        |p: &Path| -> Option<ProcessStats> { serde_json::from_slice(&std::fs::read(p).ok()?).ok() };
    let own = read_report(&zmem_runenv::report_path(report_dir.path(), pid));
    let (zmem, source) = match (own, last_live) {
        (Some(s), _) => (Some(s), "exit report"),
        (None, Some(s)) => (Some(s), "last live sample"),
        (None, None) => (None, "none"),
    };
    if let Some(s) = &zmem {
        peak_data = peak_data.max(s.data());
        peak_dram = peak_dram.max(s.resident() + s.mem_used_total());
    }
    let mut others: Vec<ProcessStats> = std::fs::read_dir(report_dir.path())
        .map(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .filter_map(|p| read_report(&p))
                .filter(|s| s.pid != pid)
                .collect()
        })
        .unwrap_or_default();
    others.sort_by_key(|s| s.pid);
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let report = RunReport {
        command: a
            .command
            .iter()
            .map(|s| s.to_string_lossy().into_owned())
            .collect(),
        exit_code: code,
        signal,
        wall_s: wall.as_secs_f64(),
        user_cpu_s: tv(ru.ru_utime),
        system_cpu_s: tv(ru.ru_stime),
        max_rss: ru.ru_maxrss as u64 * 1024,
        zmem,
        source: source.into(),
        peak_data,
        peak_dram,
        fallback: a.fallback,
        others,
    };
    if !a.quiet {
        eprint!("{}", summary(&name, pid, &report));
    }
    if let Some(path) = &a.stats {
        let body = serde_json::to_vec_pretty(&report).expect("plain data");
        std::fs::write(path, body)
            .map_err(|e| RunError::Io(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(code)
}

fn summary(name: &str, pid: u32, r: &RunReport) -> String {
    let how = match r.signal {
        Some(s) => format!("was killed by signal {s}"),
        None => format!("exited with status {}", r.exit_code),
    };
    let mut out = format!(
        "zmem: {name} (pid {pid}) {how} after {:.1} s; CPU {:.2} s user + {:.2} s system, peak RSS {}\n",
        r.wall_s,
        r.user_cpu_s,
        r.system_cpu_s,
        human(r.max_rss)
    );
    match &r.zmem {
        None if r.fallback => {
            out += "zmem: zmem did not start in the program, which ran uncompressed (--fallback; see the warning above)\n"
        }
        None => {
            out += "zmem: the program never started zmem (did LD_PRELOAD apply?); no statistics\n"
        }
        Some(s) => {
            const SHOWN: usize = 5;
            let mut rows = vec![s];
            rows.extend(r.others.iter().take(SHOWN));
            out += &table(&rows);
            if r.others.len() > SHOWN {
                out += &format!(
                    "zmem: and {} more processes this run exec'd\n",
                    r.others.len() - SHOWN
                );
            }
            out += &format!(
                "zmem: peak heap data {} in {} of DRAM ({:.2}x)\n",
                human(r.peak_data),
                human(r.peak_dram),
                r.peak_data as f64 / r.peak_dram.max(1) as f64
            );
            if r.source != "exit report" {
                out += &format!(
                    "zmem: figures are the {} (the program ended without its exit report)\n",
                    r.source
                );
            }
            if s.store_refused() > 0 {
                out += &format!(
                    "zmem: the compressed store was full {} times; those pages stayed in DRAM\n",
                    s.store_refused()
                );
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn elf_interpreter_is_found_in_real_binaries() {
        let sh = std::fs::read("/bin/sh").unwrap();
        assert_eq!(elf_has_interpreter(&sh), Some(true));
        assert_eq!(elf_has_interpreter(b"#!/bin/sh\necho hi\n"), None);
        assert_eq!(elf_has_interpreter(&[0u8; 10]), None);
        // A minimal static ELF header: no program headers at all.
        let mut h = vec![0u8; 64];
        h[..4].copy_from_slice(b"\x7fELF");
        h[4] = 2;
        h[5] = 1;
        assert_eq!(elf_has_interpreter(&h), Some(false));
    }

    #[test]
    fn the_library_is_looked_for_where_builds_and_the_package_put_it() {
        let exe = Path::new("/usr/bin/zmem");
        let c = library_candidates(None, Some("/opt/x.so".into()), Some(exe));
        assert_eq!(c[0], Path::new("/opt/x.so"));
        assert_eq!(c[1], Path::new("/usr/bin/libzmem_preload.so"));
        assert_eq!(
            c.last().unwrap(),
            Path::new("/usr/bin/../lib/zmem/libzmem_preload.so")
        );
        let only = library_candidates(Some(Path::new("/a.so")), Some("/b.so".into()), Some(exe));
        assert_eq!(only, vec![PathBuf::from("/a.so")]);
    }

    #[test]
    fn resolve_follows_path_and_names_failures() {
        assert!(resolve(&"sh".into()).unwrap().ends_with("sh"));
        assert!(matches!(
            resolve(&"zmem-no-such-program".into()),
            Err(RunError::NotFound(_))
        ));
        let t = tempfile::tempdir().unwrap();
        let plain = t.path().join("data");
        std::fs::write(&plain, b"not a program").unwrap();
        std::fs::set_permissions(&plain, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            resolve(&plain.clone().into_os_string()),
            Err(RunError::NotExecutable(p)) if p == plain
        ));
    }
}
