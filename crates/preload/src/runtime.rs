//! zmem inside a program: started by the library's constructor (or by the first malloc, if that
//! comes earlier), configured from `ZMEM_*` (see zmem_runenv), it creates the region, hands it to
//! mimalloc as the program heap, serves live statistics on a unix socket and writes a report
//! when the process exits.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering::*};
use std::sync::OnceLock;
use std::time::Instant;

use zmem_region::{Budget, Region, RegionConfig};
use zmem_runenv::report::RunReport;
use zmem_runenv::{OnError, ProcessStats, RunConfig};

use crate::heap;

const UNINIT: u8 = 0;
const STARTING: u8 = 1;
const READY: u8 = 2;
/// zmem could not start and ZMEM_ON_ERROR=off: the program runs on glibc's malloc.
const OFF: u8 = 3;
/// A process the run's program exec'd, below its start point: the program runs on glibc's
/// malloc until zmem starts (lazy.rs).
const LAZY: u8 = 4;

static STATE: AtomicU8 = AtomicU8::new(UNINIT);

/// Everything zmem holds in this process (set once, in READY).
pub struct Runtime {
    pub region: Region,
    /// The SSD tier's log under the region's store (for its statistics).
    pub ssd: Option<std::sync::Arc<zmem_tier::Log>>,
    pub config: RunConfig,
    pub started: Instant,
    pub pid: u32,
    pub socket: Option<PathBuf>,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();

pub fn runtime() -> Option<&'static Runtime> {
    RUNTIME.get()
}

/// Whether zmem has started and is on in this process.
pub fn ready() -> bool {
    STATE.load(Acquire) == READY
}

/// Whether the calling thread's allocations go to the program heap (mimalloc's main heap, in
/// the region) now; if not, to the internal heap, glibc's malloc (zmem's own threads, everyone
/// while zmem starts, and everyone when zmem is off).
#[inline]
pub fn use_program_heap() -> bool {
    if heap::is_internal() {
        return false;
    }
    match STATE.load(Acquire) {
        READY => true,
        STARTING | OFF | LAZY => false,
        _ => {
            begin();
            STATE.load(Acquire) == READY
        }
    }
}

/// [`use_program_heap`] for an allocation of `bytes`, which counts toward a lazy process's
/// start point.
#[inline]
pub fn use_program_heap_for(bytes: usize) -> bool {
    count_if_lazy(bytes);
    use_program_heap()
}

/// The program asks for `bytes` (an allocation or a resize): counted toward the start point
/// if this process is lazy.
#[inline]
pub fn count_if_lazy(bytes: usize) {
    if STATE.load(Relaxed) == LAZY && !heap::is_internal() {
        crate::lazy::asked(bytes);
    }
}

/// Whether zmem waits for this process's start point (lazy.rs).
#[inline]
pub fn lazy() -> bool {
    STATE.load(Relaxed) == LAZY
}

/// The library is loaded (or a malloc came first): zmem starts now, or, in a process the
/// run's program exec'd, once the program's heap reaches its start point (lazy.rs).
pub fn begin() {
    if STATE.load(Acquire) != UNINIT {
        return;
    }
    let was = heap::set_internal(true);
    let point = crate::lazy::start_point();
    #[cfg(mimalloc_constructor)]
    if point.is_some() {
        // mimalloc built with its load-time constructor (build.rs warned), which may come
        // after this one: its mappings are zmem's, not the program's (they would count toward
        // the start point).
        crate::mi::process_start();
    }
    heap::set_internal(was);
    match point {
        Some(at) => {
            crate::lazy::set_point(at);
            let _ = STATE.compare_exchange(UNINIT, LAZY, AcqRel, Acquire);
        }
        None => start(),
    }
}

/// Starts zmem once. While it starts, every thread allocates from the internal heap (threads
/// zmem creates allocate before they can be marked, and must not wait for the start they are
/// part of); free() takes pointers of either heap.
pub fn start() {
    let from = STATE.load(Acquire);
    if !matches!(from, UNINIT | LAZY)
        || STATE
            .compare_exchange(from, STARTING, AcqRel, Acquire)
            .is_err()
    {
        return;
    }
    let was = heap::set_internal(true);
    crate::mi::process_start();
    heap::pin_options();
    if !heap::tune_internal_heap() {
        tracing::debug!("glibc refused the internal heap's malloc settings");
    }
    let outcome = std::panic::catch_unwind(init)
        .unwrap_or_else(|_| Err(("zmem panicked while starting".into(), OnError::Fail)));
    match outcome {
        Ok(()) => {
            // The thread that starts zmem (the main thread, from the constructor) is the
            // program's; the threads it makes are prepared as they start (guarded.rs).
            zmem_os::thread::prepare_this_thread();
            crate::threads::prepare();
            STATE.store(READY, Release)
        }
        Err((msg, on_error)) => {
            let prog = program_name();
            // SAFETY: getpid cannot fail.
            let pid = unsafe { libc::getpid() };
            if on_error == OnError::Off {
                heap::untune_internal_heap();
                eprintln!("zmem: warning: not compressing {prog} (pid {pid}): {msg}");
                STATE.store(OFF, Release);
            } else {
                eprintln!(
                    "zmem: cannot start in {prog} (pid {pid}): {msg}\nzmem: set ZMEM_ON_ERROR=off to run the program uncompressed instead"
                );
                // SAFETY: ends the process without running the program any further.
                unsafe { libc::_exit(127) };
            }
        }
    }
    heap::set_internal(was);
}

type InitError = (String, OnError);

pub fn program_name() -> String {
    std::fs::read_to_string("/proc/self/comm")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

/// The smallest heap (mimalloc needs room for its arena metadata and some pages).
const MIN_SIZE: u64 = 128 << 20;

fn init() -> Result<(), InitError> {
    let config = RunConfig::from_vars(|k| std::env::var(k).ok())
        .map_err(|e| (e.to_string(), OnError::Fail))?;
    let on_error = config.on_error;
    let fail = |m: String| (m, on_error);
    crate::logging::init(config.log.as_deref());

    let machine_memory = zmem_runenv::machine_memory().unwrap_or(8 << 30);
    let size = config
        .size
        .unwrap_or_else(|| zmem_runenv::DEFAULT_SIZE_PER_RAM * machine_memory);
    if size < MIN_SIZE {
        return Err(fail(format!(
            "heap size {size} bytes is too small (at least {MIN_SIZE} bytes)"
        )));
    }
    // Room to align the arenas to mimalloc's 64 KiB slices.
    let heap_part = (size + heap::SLICE as u64).next_multiple_of(zmem_os::PAGE_SIZE as u64);
    // The program's own anonymous mappings get a space as large as the heap after it, in the
    // same region (maps.rs), unless --heap-only (0).
    let maps_len = config
        .maps
        .unwrap_or(size)
        .next_multiple_of(zmem_os::PAGE_SIZE as u64);
    let size = heap_part + maps_len;
    let budget = match config.resident {
        Some(r) => Budget::Fixed(r),
        // Between 16 MiB and all of the machine's memory, as pressure allows.
        None => Budget::Adaptive(zmem_region::AdaptiveConfig::new(
            16 << 20,
            machine_memory.min(size),
        )),
    };
    crate::guarded::resolve_libc();
    let mut rc = RegionConfig::new(size, budget);
    rc.policy = config.policy;
    rc.eviction = config.eviction;
    rc.handler_threads = config.handler_threads;
    rc.colocate = config.colocate;
    rc.inherit_on_fork = config.inherit_fork;
    rc.async_settle = config.async_settle;
    rc.clean_copies = config.clean_copies;
    rc.verify_pages = config.verify_pages;
    rc.trace_pages = config.trace_pages;
    rc.store_limit = config.effective_store_limit();
    rc.guard_inherited = std::env::var(zmem_runenv::ENV_GUARD_FILTER)
        .ok()
        .and_then(|v| u64::from_str_radix(&v, 16).ok());
    rc.fault_route = config.fault_route;
    if is_go_with_cgo() {
        // Its signal stacks are in its heap: zmem code that holds a lock the handler needs
        // blocks signals meanwhile (zmem_os::thread::block_signals_where_frames_may_fault).
        zmem_os::thread::set_signal_frames_may_fault();
        if rc.fault_route == zmem_region::FaultRoute::Signal {
            tracing::debug!(
                "a Go program (cgo): its signal stacks are in its heap, so the handler route"
            );
            rc.fault_route = zmem_region::FaultRoute::Handler;
        }
    }
    if rc.fault_route == zmem_region::FaultRoute::Signal {
        let tracer = tracer_of("self");
        if tracer != 0 && config.fault_route_auto {
            tracing::debug!("started under a tracer (pid {tracer}): the handler route");
            rc.fault_route = zmem_region::FaultRoute::Handler;
        } else if tracer != 0 {
            // Said before the guard is installed: its first trap would stop the program for
            // the tracer before anything could explain it (gdb's `run` stopped at a SIGSYS).
            say_traced(tracer);
        }
    }
    // A whole program on the signal route needs its system calls guarded (see zmem_region's
    // `guard` module).
    rc.guard_syscalls = rc.fault_route == zmem_region::FaultRoute::Signal;
    zmem_os::thread::set_start_hook(heap::mark_internal);
    // zmem code on a program thread (the fork hooks) allocates from the internal heap too.
    zmem_os::thread::set_heap_switch(heap::set_internal);
    // After the start hook: the log's collector is one of zmem's threads.
    let ssd = match &config.ssd {
        Some(path) => {
            let mut lc = zmem_tier::LogConfig::new(
                path.clone(),
                config.ssd_size.unwrap_or(zmem_runenv::DEFAULT_SSD_SIZE),
            );
            lc.encrypt = config.ssd_encrypt;
            let log = zmem_tier::Log::open(lc)
                .map_err(|e| fail(format!("SSD tier at {}: {e}", path.display())))?;
            let mut lower = zmem_store::LowerConfig::new(log.clone());
            lower.read_ahead = config.ssd_read_ahead;
            rc.lower = Some(lower);
            Some(log)
        }
        None => None,
    };
    let region = Region::new(rc).map_err(|e| fail(e.to_string()))?;
    if let Some(id) = zmem_region::guard::active_filter_id() {
        // For the programs this one execs (they inherit the filter). On the program's main
        // thread, at its start, before any other of its threads can read the environment.
        std::env::set_var(zmem_runenv::ENV_GUARD_FILTER, format!("{id:x}"));
    }
    // SAFETY: the region's memory lives as long as the process (RUNTIME is never dropped).
    let (heap_start, heap_len) =
        match unsafe { heap::add_region(&region, heap_part as usize, config.exact_fit) } {
            Ok(x) => x,
            Err(e) => {
                // Arenas already handed to mimalloc must stay mapped and served.
                std::mem::forget(region);
                return Err(fail(e));
            }
        };
    // SAFETY: a probe allocation on the main heap, freed at once.
    let in_region = unsafe {
        let p = crate::mi::mi_malloc(64) as usize;
        crate::mi::mi_free(p as *mut _);
        (heap_start..heap_start + heap_len).contains(&p)
    };
    if !in_region {
        std::mem::forget(region);
        return Err(fail(
            "mimalloc's main heap does not allocate from the region".into(),
        ));
    }
    let base = region.as_ptr() as usize;
    tracing::debug!(pins = ?heap::pins(), heap_start, heap_len, "program heap ready");
    // SAFETY: getpid cannot fail.
    let pid = unsafe { libc::getpid() } as u32;
    let socket = crate::server::start(config.socket_dir.as_deref(), pid, served_stats, sample_peak);
    let rt = Runtime {
        region,
        ssd,
        config,
        started: Instant::now(),
        pid,
        socket,
    };
    if RUNTIME.set(rt).is_err() {
        return Err(fail("zmem started twice".into()));
    }
    // After the heap's part (mimalloc's arenas end inside it).
    let maps_start = base + heap_part as usize;
    crate::maps::init(maps_start, maps_start + maps_len as usize).map_err(fail)?;
    // SAFETY: registering a plain extern "C" function; glibc's on_exit (unlike atexit) passes
    // the exit status, which the run's report needs.
    unsafe { on_exit(at_exit, std::ptr::null_mut()) };
    Ok(())
}

/// Whether the program is a Go program linked dynamically (cgo: its executable exports cgo's
/// entry points). Go's runtime gives every thread an alternate signal stack of its own heap
/// (the gsignal stacks) with the raw sigaltstack call, which neither the preload's wrapper
/// nor the guard's filter sees (its struct is on the system stack); cgo maps Go's heap through
/// the C library, so those stacks are in the map space and get evicted. On the signal route a
/// fault's SIGBUS frame then goes to an evicted stack, which the kernel cannot write: the
/// program is killed (session 44: a cgo program with four goroutines at `--resident 8M`, 5 of
/// 10 runs; tests/c/go_like.c). Such a program gets the handler route, where the kernel waits
/// for the page. A guard filter inherited from a parent on the signal route stays in force but
/// traps nothing of it: the handler route's region is not at the guarded base. A static Go
/// binary is refused by `zmem run`.
///
/// No `dlerror()` after the failed lookups: it formats its message through gettext, which takes
/// the locale lock, and zmem may start inside the program's `newlocale` (CI: the locale test
/// hung so). zmem's later lookups at start reset the thread's error state.
fn is_go_with_cgo() -> bool {
    [c"_cgo_topofstack", c"x_cgo_init"].iter().any(|name| {
        // SAFETY: a lookup by name in the global scope; nothing is called.
        !unsafe { libc::dlsym(libc::RTLD_DEFAULT, name.as_ptr()) }.is_null()
    })
}

/// The pid tracing process `pid` ("self" or a number), from its status; 0: none (or unknown).
fn tracer_of(pid: &str) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("TracerPid:"))
                .and_then(|v| v.trim().parse::<u32>().ok())
        })
        .unwrap_or(0)
}

/// One line on stderr for a process started under a tracer (pid `tracer`: a debugger's `run`,
/// `strace`) on the signal route by the user's choice (`--fault-route signal`; zmem's own
/// choice takes the handler route there): its faults and the guard's traps are signals, at
/// each of which the tracer stops it (gdb by default stops and reports SIGBUS or SIGSYS, where
/// the program itself saw nothing).
/// Said once per tracer: not again by a process whose parent has the same tracer (`strace -f`
/// of a shell loop printed it for every process).
fn say_traced(tracer: u32) {
    // SAFETY: getppid cannot fail.
    let parent = unsafe { libc::getppid() };
    if tracer_of(&parent.to_string()) != tracer {
        eprintln!(
            "zmem: {} (pid {}) runs under a tracer (pid {tracer}) on the signal route: zmem \
             serves its evicted pages with SIGBUS and its system calls into them with SIGSYS, \
             which the tracer sees; in gdb: handle SIGBUS SIGSYS nostop noprint pass (or run \
             with --fault-route auto or handler)",
            program_name(),
            // SAFETY: getpid cannot fail.
            unsafe { libc::getpid() }
        );
    }
}

/// zmem's region (the program heap and the map space) as `[start, end)`; None before zmem
/// starts.
pub fn region_span() -> Option<(usize, usize)> {
    runtime().map(|rt| {
        let base = rt.region.as_ptr() as usize;
        (base, base + rt.region.len())
    })
}

/// Whether `addr` is in zmem's region ([`region_span`]).
pub fn in_region(addr: usize) -> bool {
    region_span().is_some_and(|(start, end)| (start..end).contains(&addr))
}

/// This process's statistics.
pub fn stats() -> ProcessStats {
    let Some(rt) = runtime() else {
        return ProcessStats {
            // SAFETY: getpid cannot fail.
            pid: unsafe { libc::getpid() } as u32,
            program: program_name(),
            zmem_version: env!("CARGO_PKG_VERSION").into(),
            ..Default::default()
        };
    };
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is a valid rusage to fill.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let tv = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    ProcessStats {
        pid: rt.pid,
        program: program_name(),
        zmem_version: env!("CARGO_PKG_VERSION").into(),
        uptime_s: rt.started.elapsed().as_secs_f64(),
        policy: rt.config.policy.name().into(),
        eviction: format!("{:?}", rt.config.eviction).to_lowercase(),
        adaptive: rt.config.resident.is_none(),
        process_cpu_ns: tv(ru.ru_utime) + tv(ru.ru_stime),
        maps: crate::maps::stats(),
        guard: zmem_region::guard::stats(),
        ssd: rt.ssd.as_ref().map(|l| l.stats()),
        ..ProcessStats::of_region(rt.region.stats())
    }
}

/// The statistics the stats socket serves: this process's, or None in a forked child (it
/// inherited the socket but has no thread to serve it).
fn served_stats() -> Option<ProcessStats> {
    in_creator().then(stats)
}

/// Whether this process is the one zmem started in (not a forked child).
pub fn in_creator() -> bool {
    // SAFETY: getpid cannot fail.
    runtime().is_some_and(|rt| rt.pid == unsafe { libc::getpid() } as u32)
}

extern "C" {
    fn on_exit(
        f: extern "C" fn(libc::c_int, *mut libc::c_void),
        arg: *mut libc::c_void,
    ) -> libc::c_int;
}

/// The most heap data and DRAM seen (sampled every 0.5 s by the stats thread, and at exit).
static PEAK_DATA: AtomicU64 = AtomicU64::new(0);
static PEAK_DRAM: AtomicU64 = AtomicU64::new(0);

/// Runs `f`, zmem's code on a program thread (the map space's calls, the heap's calls into the
/// region), as zmem's own code: its allocations go to the internal heap and its memory calls
/// straight to the kernel. A panic (a zmem bug) must not cross into the program: `fallback`
/// then does what the kernel alone would.
///
/// The asynchronous signals wait meanwhile (`zmem_os::thread::AsyncSignalsBlocked`, two
/// `rt_sigprocmask` calls, ~1.2 µs, beside calls that map, clear or move 64 KiB or more). The
/// program's handler must not run inside this code: its malloc would go to the internal heap,
/// glibc's, whose arena lock the interrupted code may hold (CI, session 54: a SIGALRM handler's
/// malloc inside `Region::populate`'s growth of a queue, the thread waiting on itself for
/// good), and its touch of an evicted page would wait for a handler that needs the region's
/// lock this code holds (a signal frame alone does where signal stacks are in the region: a
/// cgo Go program's). Not for code that starts a thread or a process: they would inherit the
/// mask.
pub(crate) fn as_zmem<T>(f: impl FnOnce() -> T, fallback: impl FnOnce() -> T) -> T {
    let _signals = zmem_os::thread::AsyncSignalsBlocked::new();
    let was = heap::set_internal(true);
    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f));
    heap::set_internal(was);
    r.unwrap_or_else(|_| fallback())
}

fn sample_peak() {
    if let Some(rt) = runtime() {
        let s = ProcessStats::of_region(rt.region.stats());
        PEAK_DATA.fetch_max(s.data(), Relaxed);
        PEAK_DRAM.fetch_max(s.resident() + s.mem_used_total(), Relaxed);
    }
}

/// This process is ending: its forked children that still live get the pages of theirs that
/// only this process's region holds, or they would read zeros there once it is gone (a program
/// that daemonizes: fork, then the parent exits). Nothing to do in a forked child or a vfork
/// child (not the creator).
pub fn hand_off() {
    let was = heap::set_internal(true);
    let _ = std::panic::catch_unwind(|| {
        if let Some(rt) = runtime().filter(|_| in_creator()) {
            let n = rt.region.hand_off_children();
            if n > 0 {
                tracing::debug!(pages = n, "pages handed to forked children");
            }
        }
    });
    heap::set_internal(was);
}

extern "C" fn at_exit(status: libc::c_int, _arg: *mut libc::c_void) {
    end(status);
}

/// Whether [`end`] has run.
static ENDED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// This process ends with `status`: its forked children get their pages ([`hand_off`]), then,
/// in the process zmem started in, the run's report (the process `zmem run` became) or this
/// process's exit report (one it exec'd). Once, from `exit`'s on_exit hook or from `_exit`:
/// dash ends every shell with `_exit`, so `zmem run -- sh -c ...` printed no summary and wrote
/// no `--stats` before `_exit` reported too.
pub fn end(status: libc::c_int) {
    hand_off();
    // Not in a forked or vfork child: a vfork child shares this static with its parent.
    if !in_creator() || ENDED.swap(true, Relaxed) {
        return;
    }
    let was = heap::set_internal(true);
    let _ = std::panic::catch_unwind(|| {
        let rt = runtime().expect("in creator");
        if let Some(sock) = &rt.socket {
            let _ = std::fs::remove_file(sock);
        }
        if rt.config.run_pid == Some(rt.pid) {
            report_run(rt, status);
        } else if let Some(dir) = &rt.config.report_dir {
            write_report(dir);
        }
    });
    heap::set_internal(was);
}

/// The run's report, by the process `zmem run` became: its own figures, those of the processes
/// it exec'd that exited before it (from the report directory, removed afterwards), the summary
/// on stderr and the `--stats` file.
fn report_run(rt: &Runtime, status: i32) {
    sample_peak();
    let zmem = stats();
    let mut others = Vec::new();
    if let Some(dir) = &rt.config.report_dir {
        if let Ok(reports) = std::fs::read(zmem_runenv::reports_file(dir)) {
            others.extend(
                zmem_runenv::read_reports(&reports)
                    .into_iter()
                    .filter(|s| s.pid != rt.pid),
            );
        }
        let _ = std::fs::remove_dir_all(dir);
    }
    others.sort_by_key(|s| s.pid);
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: ru is a valid rusage to fill.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) };
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let command: Vec<String> = std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect()
        })
        .unwrap_or_default();
    let name = command.first().cloned().unwrap_or_else(program_name);
    let report = RunReport {
        command,
        exit_code: status,
        wall_s: rt.started.elapsed().as_secs_f64(),
        user_cpu_s: secs(ru.ru_utime),
        system_cpu_s: secs(ru.ru_stime),
        max_rss: ru.ru_maxrss as u64 * 1024,
        peak_data: PEAK_DATA.load(Relaxed).max(zmem.data()),
        peak_dram: PEAK_DRAM
            .load(Relaxed)
            .max(zmem.resident() + zmem.mem_used_total()),
        zmem,
        others,
    };
    if rt.config.summary {
        eprint!("{}", zmem_runenv::report::summary(&name, &report));
    }
    if let Some(path) = &rt.config.stats_file {
        let written = serde_json::to_vec_pretty(&report)
            .map_err(std::io::Error::other)
            .and_then(|body| std::fs::write(path, body));
        if let Err(e) = written {
            eprintln!(
                "zmem: cannot write the run's statistics to {}: {e}",
                path.display()
            );
        }
    }
}
/// Appends this process's exit report to the run's reports file (see `zmem_runenv::reports_file`).
fn write_report(dir: &std::path::Path) {
    use std::os::unix::fs::OpenOptionsExt;
    let path = zmem_runenv::reports_file(dir);
    let Ok(line) = zmem_runenv::report_line(&stats()) else {
        return;
    };
    let written = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o600)
        .open(&path)
        .and_then(|mut f| f.write(&line));
    match written {
        Ok(n) if n == line.len() => {}
        Ok(n) => tracing::warn!(
            "the exit report in {} was cut after {n} of {} bytes",
            path.display(),
            line.len()
        ),
        Err(e) => tracing::warn!("cannot write the exit report to {}: {e}", path.display()),
    }
}
