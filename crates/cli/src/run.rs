//! `zmem run`: runs an unmodified program with its heap in a zmem region (LD_PRELOAD of
//! libzmem_preload.so, configured through ZMEM_* variables). It checks what it can, then execs
//! the program in its own place, so the program has zmem's pid and its signals; the library in
//! the program prints a zramctl-like summary when it exits (zmem_runenv::report; the live
//! statistics, `zmem stat`, are in [`crate::stat`]).

use std::ffi::OsString;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use clap::{Args, ValueEnum};
use zmem_engine::Policy;
use zmem_region::{
    Budget, CleanCopies, Eviction, FaultRoute, Region, RegionConfig, MIN_BUDGET_BYTES,
};
use zmem_runenv::{OnError, RunConfig};

use crate::size::{format_size as fmt_size, format_size_approx as human, parse_size};

/// The preload library's file name.
pub const PRELOAD_LIB: &str = "libzmem_preload.so";
/// Overrides where `zmem run` finds the preload library.
pub const ENV_PRELOAD: &str = "ZMEM_PRELOAD";

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum CleanCopiesArg {
    Off,
    Ssd,
    All,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
pub enum FaultRouteArg {
    /// signal where zmem may install the syscall guard without taking set-user-ID execs away
    /// (CAP_SYS_ADMIN, i.e. root), handler elsewhere.
    Auto,
    Handler,
    Signal,
}

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
    /// memory; untouched parts cost nothing). Blocks over 32 MiB take whole 32 MiB pieces; a
    /// malloc past it returns NULL (ENOMEM) and zmem says so once.
    #[arg(long, value_parser = parse_size)]
    pub size: Option<u64>,
    /// Address space for the program's own anonymous mappings (mmap: pymalloc's arenas, a JVM's
    /// or V8's heap), tiered like the heap (default: as large as the heap).
    #[arg(long, value_parser = parse_size, conflicts_with = "heap_only")]
    pub maps: Option<u64>,
    /// Heap a process the program execs (a shell's or a build's commands) reaches before zmem
    /// starts in it; below it the process runs as it would without zmem, ~1.5 ms faster per
    /// process. 0: every process from its start (default: a quarter of --resident, at most 4M).
    #[arg(long, value_parser = parse_size)]
    pub start_at: Option<u64>,
    /// Tier the malloc heap only: the program's own mmap'd memory stays with the kernel.
    #[arg(long)]
    pub heap_only: bool,
    /// DRAM the compressed pages may use (like zram's mem_limit); default unlimited.
    #[arg(long, value_parser = parse_size)]
    pub store_limit: Option<u64>,
    /// An SSD tier below the compressed pages: a directory (the log is an unnamed file there,
    /// gone when the program exits) or a block device (used whole). Compressed pages that stay
    /// cold are written to it as the store nears --store-limit (default with --ssd: a quarter
    /// of --resident, at least 16M).
    #[arg(long, value_name = "PATH")]
    pub ssd: Option<PathBuf>,
    /// Bytes of log space on the SSD tier (default 4G; allocated when the program starts).
    #[arg(long, value_parser = parse_size, requires = "ssd")]
    pub ssd_size: Option<u64>,
    /// Do not encrypt the SSD tier (by default every object is sealed with AES-256-GCM under a
    /// key that lives only in the program's memory).
    #[arg(long, requires = "ssd")]
    pub ssd_no_encrypt: bool,
    /// Most pages one read from the SSD tier brings, the faulting page included: objects of
    /// neighbouring pages that lie near it on the log come in the same device read and wait
    /// for their own faults; the window follows how many of them are used, like the kernel's
    /// swap read-ahead. 1: no read-ahead.
    #[arg(long, requires = "ssd", default_value_t = zmem_runenv::DEFAULT_SSD_READ_AHEAD as u64,
          value_parser = clap::value_parser!(u64).range(1..=zmem_runenv::MAX_SSD_READ_AHEAD as u64))]
    pub ssd_read_ahead: u64,
    /// Compression policy: fast (lz4), balanced (zstd-1), max (zstd, blocks), auto.
    #[arg(long, default_value = "fast", value_parser = zmem_bench::POLICIES)]
    pub policy: String,
    /// Which pages leave DRAM first.
    #[arg(long, value_enum, default_value = "clock")]
    pub eviction: EvictionArg,
    /// Threads serving the program's page faults.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u8).range(1..=16))]
    pub handler_threads: u8,
    /// Never pin the thread that takes every fault, and zmem's threads, to one CPU. By default
    /// zmem does while one thread faults (on a VM a wake-up across vCPUs costs 10-20 us) and
    /// gives the thread its own affinity back when another thread faults or the faults stop.
    #[arg(long)]
    pub no_colocate: bool,
    /// Give a forked child a copy of every compressed page at the fork. By default it reads
    /// the pages evicted at the fork from the program's store, which hands a page down to it
    /// only before changing it (a fork of a 64 MB heap at 16M: ~2 ms instead of ~9).
    #[arg(long)]
    pub no_inherit_fork: bool,
    /// Let the thread that serves faults compress the pages it evicts itself. By default it
    /// only moves them out between faults and zmem's evictor thread compresses them on another
    /// CPU, so the program does not wait for the compressor.
    #[arg(long)]
    pub no_async_settle: bool,
    /// Who serves the program's page faults: handler (a zmem thread the kernel wakes) or
    /// signal (the faulting thread itself, through SIGBUS, with a seccomp filter that brings
    /// back the buffers of system calls into the heap before they run; forked children ask the
    /// program's handler thread: see README, "The signal route"). auto (the default): signal
    /// when zmem runs with CAP_SYS_ADMIN (root), where the filter needs no promise to give up
    /// set-user-ID execs; handler otherwise, and handler in a process that starts under a
    /// tracer (a debugger's `run`, strace), which would stop at the signal route's signals. A
    /// Go program linked with cgo (or any process that exports cgo's entry points) takes the
    /// handler route whatever this says: its runtime puts its signal stacks in its own heap.
    #[arg(long, value_enum, default_value = "auto")]
    pub fault_route: FaultRouteArg,
    /// Which pages faulted back keep their compressed copy, so that evicted again unchanged
    /// they are not compressed (or written to the SSD log) again: ssd (copies that cost no
    /// DRAM: pages read back from the SSD log), all (any page, while the store is under half
    /// its limit: faster for read-mostly programs, at the copies' size in DRAM), off.
    #[arg(long, value_enum, default_value = "ssd")]
    pub clean_copies: CleanCopiesArg,
    /// A diagnostic: keep a checksum of every evicted page and check each page that comes back
    /// against it; a page that differs is counted (checks in --stats and zmem stat) and raises
    /// SIGBUS instead of reaching the program. Costs 8 bytes per page evicted and ~0.1 µs per
    /// eviction and per fault.
    #[arg(long)]
    pub verify_pages: bool,
    /// A diagnostic: keep each heap page's last state changes (which line of zmem made each,
    /// on which thread, when), and if the program dies of SIGSEGV print the pages its
    /// registers point into with their histories. Costs 128 bytes per page touched.
    #[arg(long)]
    pub trace_pages: bool,
    /// Serve every heap block from mimalloc, mid-size ones (1–32 KiB) included. By default
    /// those come from an exact-fit allocator (the request plus 16 bytes, as glibc's malloc
    /// gives), where mimalloc's size classes would round them up by up to 25%: bytes a small
    /// budget would evict and fault back like data.
    #[arg(long)]
    pub no_exact_fit: bool,
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

/// The settings for the program, checked. `report_dir` is where the processes it execs leave
/// their reports; `pid` is this process's, which the program will have.
pub fn config(a: &RunArgs, report_dir: &Path, pid: u32) -> Result<RunConfig, RunError> {
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
    if let Some(path) = &a.ssd {
        check_ssd(path, a.ssd_size.unwrap_or(zmem_runenv::DEFAULT_SSD_SIZE))?;
    }
    let policy: Policy = a
        .policy
        .parse()
        .map_err(|e| RunError::Config(format!("--policy: {e}")))?;
    Ok(RunConfig {
        resident,
        size: a.size,
        maps: if a.heap_only { Some(0) } else { a.maps },
        store_limit: a.store_limit,
        policy,
        eviction: match a.eviction {
            EvictionArg::Clock => Eviction::Clock,
            EvictionArg::Fifo => Eviction::Fifo,
        },
        handler_threads: a.handler_threads as usize,
        colocate: !a.no_colocate,
        inherit_fork: !a.no_inherit_fork,
        async_settle: !a.no_async_settle,
        fault_route: match a.fault_route {
            FaultRouteArg::Auto if zmem_os::caps::effective(zmem_os::caps::SYS_ADMIN) => {
                FaultRoute::Signal
            }
            FaultRouteArg::Auto | FaultRouteArg::Handler => FaultRoute::Handler,
            FaultRouteArg::Signal => FaultRoute::Signal,
        },
        fault_route_auto: matches!(a.fault_route, FaultRouteArg::Auto),
        clean_copies: match a.clean_copies {
            CleanCopiesArg::Off => CleanCopies::Off,
            CleanCopiesArg::Ssd => CleanCopies::Ssd,
            CleanCopiesArg::All => CleanCopies::All,
        },
        verify_pages: a.verify_pages,
        trace_pages: a.trace_pages,
        exact_fit: !a.no_exact_fit,
        // Absolute, like --stats.
        ssd: a
            .ssd
            .as_ref()
            .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone())),
        ssd_size: a.ssd_size,
        ssd_encrypt: !a.ssd_no_encrypt,
        ssd_read_ahead: a.ssd_read_ahead as usize,
        start_at: a.start_at,
        report_dir: Some(report_dir.to_path_buf()),
        socket_dir: std::env::var_os(zmem_runenv::ENV_SOCKET_DIR).map(PathBuf::from),
        on_error: if a.fallback {
            OnError::Off
        } else {
            OnError::Fail
        },
        log: std::env::var(zmem_runenv::ENV_LOG).ok(),
        run_pid: Some(pid),
        summary: !a.quiet,
        // Absolute: the program may change its directory before it exits.
        stats_file: a
            .stats
            .as_ref()
            .map(|p| std::path::absolute(p).unwrap_or_else(|_| p.clone())),
    })
}

/// The smallest SSD tier (a few segments of the log).
const MIN_SSD_SIZE: u64 = 16 << 20;

/// Checks `--ssd PATH` and its size before the program starts: a directory with room for the
/// log, or a block device at least that large. A regular file is refused (it would be
/// overwritten).
fn check_ssd(path: &Path, size: u64) -> Result<(), RunError> {
    use std::os::unix::fs::FileTypeExt;
    if size < MIN_SSD_SIZE {
        return Err(RunError::Config(format!(
            "--ssd-size {} is too small: at least {}",
            fmt_size(size),
            fmt_size(MIN_SSD_SIZE)
        )));
    }
    let md = std::fs::metadata(path)
        .map_err(|e| RunError::Config(format!("--ssd {}: {e}", path.display())))?;
    if md.is_dir() {
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
            .map_err(|_| RunError::Config(format!("--ssd {}: bad path", path.display())))?;
        // SAFETY: statvfs fills `st`; c is a valid NUL-terminated path.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        if unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0 {
            let avail = st.f_bavail as u64 * st.f_frsize as u64;
            if avail < size {
                return Err(RunError::Config(format!(
                    "--ssd {}: the file system has {} free, less than --ssd-size {}",
                    path.display(),
                    human(avail),
                    fmt_size(size)
                )));
            }
        }
        Ok(())
    } else if md.file_type().is_block_device() {
        Ok(())
    } else {
        Err(RunError::Config(format!(
            "--ssd {}: not a directory or a block device (an existing file would be overwritten; \
             give the directory to put the log in)",
            path.display()
        )))
    }
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

/// The directory where the processes of run `pid` leave their exit reports: `run-<pid>` in the
/// (private) socket directory. The program removes it when it reports the run.
pub fn report_dir(socket_dir: &Path, pid: u32) -> PathBuf {
    socket_dir.join(format!("run-{pid}"))
}

/// Removes the report directories of earlier runs whose program is gone without reporting
/// (killed by a signal, or exec'd into a program without zmem).
fn remove_stale_report_dirs(socket_dir: &Path) {
    let Ok(entries) = std::fs::read_dir(socket_dir) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("run-"))
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: signal 0 only asks whether the process exists.
        let gone = unsafe { libc::kill(pid, 0) } != 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH);
        if gone {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// Runs the program in this process's place (like nice, taskset or numactl): it keeps zmem's
/// pid, gets every signal sent to it directly and cannot be orphaned. Its preload library
/// prints the summary and writes `--stats` when it exits. Returns only if it could not run.
pub fn run(a: &RunArgs) -> Result<std::convert::Infallible, RunError> {
    let pid = std::process::id();
    let socket_dir = zmem_runenv::socket_dir(
        std::env::var_os(zmem_runenv::ENV_SOCKET_DIR)
            .map(PathBuf::from)
            .as_deref(),
    );
    let reports = report_dir(&socket_dir, pid);
    let cfg = config(a, &reports, pid)?;
    let program = resolve(&a.command[0])?;
    check_preloadable(&program)?;
    let lib = find_library(a.preload.as_deref())?;
    if !a.fallback {
        // With --fallback the library itself warns and lets the program run uncompressed.
        check_userfaultfd()?;
    }
    zmem_runenv::private_dir(&socket_dir).map_err(|e| RunError::Io(e.to_string()))?;
    remove_stale_report_dirs(&socket_dir);
    std::fs::create_dir_all(&reports)
        .map_err(|e| RunError::Io(format!("{}: {e}", reports.display())))?;

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
    let e = cmd.exec();
    let _ = std::fs::remove_dir_all(&reports);
    Err(RunError::Spawn(name, e))
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
