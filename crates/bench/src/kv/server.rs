//! The server process in its memory cgroup, and the helpers that run beside it: the memory.stat
//! poller, the zram watchdog, the scratch directory.

use std::collections::VecDeque;
use std::ffi::CString;
use std::io::{BufRead, BufReader, Read};
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context;

use super::client::{Conn, KvError, Protocol, Watch};
use super::{LOG_HEAD, LOG_TAIL, START_TIMEOUT, TERM_TIMEOUT};
use crate::abort::{aborted, Interrupted};
use crate::kernel::memcg::STAT_POLL;
use crate::kernel::zram::parse_mm_stat;
use crate::process::{self, describe_status};

/// A key-value server: its binary, its command line, its protocol.
pub struct ServerSpec {
    /// "redis" or "memcached": the command's name and the default output names.
    pub name: &'static str,
    pub default_bin: &'static str,
    pub version_arg: &'static str,
    pub install_hint: &'static str,
    /// The server's arguments for a port and a scratch directory.
    pub args: fn(port: u16, dir: &Path) -> Vec<String>,
    pub protocol: &'static dyn Protocol,
}

/// A server's output (stdout and stderr, by lines): the first [`LOG_HEAD`] lines, the last
/// [`LOG_TAIL`], and how many in between were dropped.
#[derive(Debug, Default)]
pub struct ServerLog {
    head: Vec<String>,
    tail: VecDeque<String>,
    dropped: u64,
}

/// Words of the lines that tell what happened to a server (case-insensitive).
const KEY_WORDS: [&str; 7] = [
    "crashed by signal",
    "out of memory",
    "accessing address",
    "panicked",
    "assertion",
    "error",
    "killed",
];

impl ServerLog {
    fn push(&mut self, line: String) {
        if self.head.len() < LOG_HEAD {
            self.head.push(line);
            return;
        }
        if self.tail.len() == LOG_TAIL {
            self.tail.pop_front();
            self.dropped += 1;
        }
        self.tail.push_back(line);
    }

    /// All lines kept, a marker where some were dropped.
    pub fn lines(&self) -> Vec<String> {
        let mut v = self.head.clone();
        if self.dropped > 0 {
            v.push(format!("[... {} lines not kept ...]", self.dropped));
        }
        v.extend(self.tail.iter().cloned());
        v
    }

    /// The last `n` lines.
    pub fn last(&self, n: usize) -> Vec<String> {
        let all: Vec<&String> = self.head.iter().chain(self.tail.iter()).collect();
        all[all.len().saturating_sub(n)..]
            .iter()
            .map(|s| s.to_string())
            .collect()
    }

    /// Up to three lines that say what happened (a crash, an out-of-memory, an error), in order.
    pub fn key_lines(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for l in self.head.iter().chain(self.tail.iter()) {
            let low = l.to_ascii_lowercase();
            let t = l.trim().to_string();
            if KEY_WORDS.iter().any(|w| low.contains(w)) && !out.contains(&t) {
                out.push(t);
                if out.len() == 3 {
                    break;
                }
            }
        }
        out
    }

    /// Whether the server said it ran out of memory (Redis: "Out Of Memory allocating").
    pub fn says_out_of_memory(&self) -> bool {
        self.head
            .iter()
            .chain(self.tail.iter())
            .any(|l| l.to_ascii_lowercase().contains("out of memory"))
    }
}

type SharedLog = Arc<Mutex<ServerLog>>;

/// A running server (or `zmem run` with the server under it), in its memory cgroup from its
/// first instruction on. Dropping it stops it: SIGTERM to the pid started, SIGKILL after
/// [`TERM_TIMEOUT`](super::TERM_TIMEOUT), then SIGKILL to whatever is still in its cgroup, reaped.
pub struct Server {
    child: Child,
    pub port: u16,
    cgroup: PathBuf,
    log: SharedLog,
    readers: Vec<std::thread::JoinHandle<()>>,
    exit: Option<ExitStatus>,
}

impl Server {
    /// Starts `cmd` in the cgroup at `cgroup` (its own process group, so a Ctrl-C on the
    /// terminal reaches only zmem; killed if zmem dies), and waits until `port` answers.
    pub fn start(
        cmd: &[String],
        port: u16,
        cgroup: &Path,
        protocol: &dyn Protocol,
        stall: Duration,
    ) -> anyhow::Result<Server> {
        let procs = CString::new(cgroup.join("cgroup.procs").as_os_str().as_bytes())
            .context("cgroup path")?;
        let mut command = Command::new(&cmd[0]);
        command
            .args(&cmd[1..])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // SAFETY: the closure runs in the forked child before exec and only makes system calls
        // (setpgid, prctl, open, write, close) on data prepared before the fork; it allocates
        // nothing.
        unsafe {
            command.pre_exec(move || {
                if libc::setpgid(0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                crate::kernel::memcg::join_in_child(&procs)
            });
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("starting {}", cmd[0]))?;
        let log: SharedLog = Arc::default();
        let mut readers = Vec::new();
        let out: Option<Box<dyn Read + Send>> = child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>);
        let err: Option<Box<dyn Read + Send>> = child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>);
        for pipe in [out, err].into_iter().flatten() {
            let log = log.clone();
            readers.push(std::thread::spawn(move || {
                for line in BufReader::new(pipe).lines() {
                    let Ok(line) = line else { break };
                    log.lock().unwrap_or_else(|e| e.into_inner()).push(line);
                }
            }));
        }
        let mut server = Server {
            child,
            port,
            cgroup: cgroup.to_path_buf(),
            log,
            readers,
            exit: None,
        };
        server.wait_ready(protocol, stall)?;
        Ok(server)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    fn wait_ready(&mut self, protocol: &dyn Protocol, stall: Duration) -> anyhow::Result<()> {
        let t0 = Instant::now();
        loop {
            if aborted() {
                return Err(Interrupted.into());
            }
            if let Some(status) = self.try_exit() {
                // Let the pipe readers catch the last lines.
                self.settle_output(Duration::from_secs(1));
                anyhow::bail!(
                    "the server {} before it accepted connections; its last output: {}",
                    describe_status(status),
                    self.output()
                );
            }
            if let Ok(mut c) = Conn::connect(self.port, stall, &Arc::default()) {
                match protocol.ping(&mut c) {
                    Ok(()) => return Ok(()),
                    Err(KvError::Interrupted) => return Err(Interrupted.into()),
                    Err(_) => {}
                }
            }
            if t0.elapsed() > START_TIMEOUT {
                anyhow::bail!(
                    "the server did not answer on 127.0.0.1:{} within {} s; its last output: {}",
                    self.port,
                    START_TIMEOUT.as_secs(),
                    self.output()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The exit status once the process started has ended (reaped).
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            if let Ok(Some(s)) = self.child.try_wait() {
                self.exit = Some(s);
            }
        }
        self.exit
    }

    /// Waits up to `timeout` for the process started to end.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let t0 = Instant::now();
        loop {
            if let Some(s) = self.try_exit() {
                return Some(s);
            }
            if t0.elapsed() >= timeout {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// What its output says happened, on one line for a message: the key lines, else the
    /// last three lines.
    pub fn output(&self) -> String {
        let log = self.log();
        let mut lines = log.key_lines();
        if lines.is_empty() {
            lines = log.last(3);
        }
        if lines.is_empty() {
            "(no output)".into()
        } else {
            lines.join(" | ")
        }
    }

    /// Waits up to `timeout` for the output pipes to reach their end (once the process ended).
    pub fn settle_output(&self, timeout: Duration) {
        let t0 = Instant::now();
        while self.readers.iter().any(|h| !h.is_finished()) && t0.elapsed() < timeout {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Its output so far.
    pub fn log(&self) -> std::sync::MutexGuard<'_, ServerLog> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// SIGKILL at once (a server stuck in the kernel's reclaim would not act on SIGTERM), reaped.
    pub fn kill(&mut self) {
        if self.try_exit().is_none() {
            if let Some(s) = process::kill_and_reap(&mut self.child) {
                self.exit = Some(s);
            }
        }
    }

    /// Stops the server (see [`Server`]) and returns how the process started ended.
    pub fn stop(&mut self) -> Option<ExitStatus> {
        if self.try_exit().is_none() {
            let pid = self.child.id();
            let t = process::terminate(&mut self.child, TERM_TIMEOUT);
            self.exit = t.status;
            if t.killed {
                eprintln!("zmem: the server (pid {pid}) did not stop on SIGTERM: killed");
            }
        }
        kill_cgroup_tasks(&self.cgroup);
        for h in self.readers.drain(..) {
            let _ = h.join();
        }
        self.exit
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// SIGKILLs what is left in a benchmark cgroup (processes the server started; the process
/// started was reaped before), reaps those that became our children, and waits until the
/// cgroup is empty (up to 5 s).
fn kill_cgroup_tasks(cg: &Path) {
    let t0 = Instant::now();
    loop {
        let pids: Vec<libc::pid_t> = std::fs::read_to_string(cg.join("cgroup.procs"))
            .unwrap_or_default()
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .collect();
        if pids.is_empty() || t0.elapsed() > Duration::from_secs(5) {
            return;
        }
        for &p in &pids {
            // SAFETY: kill and waitpid take plain numbers. The pids were read from our own
            // benchmark cgroup, which only this run's server processes ever entered.
            unsafe {
                libc::kill(p, libc::SIGKILL);
                libc::waitpid(p, std::ptr::null_mut(), libc::WNOHANG);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A free TCP port on 127.0.0.1 (the kernel's choice; the server binds it right after).
pub(super) fn free_port() -> anyhow::Result<u16> {
    let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).context("finding a free port")?;
    Ok(l.local_addr()?.port())
}

/// Reads the cgroup's memory.stat every [`STAT_POLL`] while it lives (see there: without it the
/// kernel OOM-kills small cgroups that swap to zram although it could reclaim).
pub(crate) struct StatPoller {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl StatPoller {
    pub(crate) fn start(cg: &Path) -> StatPoller {
        let stop = Arc::new(AtomicBool::new(false));
        let file = cg.join("memory.stat");
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let _ = std::fs::read(&file);
                std::thread::sleep(STAT_POLL);
            }
        });
        StatPoller {
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for StatPoller {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Gives up on the zram configuration's server once zram is full (mem_used_total at its
/// mem_limit) and no reply came for `patience`: the kernel then reclaims in vain (every swap
/// write fails) and may take minutes before its OOM killer acts; the data the server held is
/// known by then.
pub(super) struct ZramWatchdog {
    stop: Arc<AtomicBool>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl ZramWatchdog {
    pub(super) fn start(
        watch: Arc<Watch>,
        index: u32,
        mem_limit: u64,
        patience: Duration,
    ) -> ZramWatchdog {
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let path = format!("/sys/block/zram{index}/mm_stat");
            let mut last = watch.progress.load(Ordering::Relaxed);
            let mut since = Instant::now();
            while !s.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(250));
                let p = watch.progress.load(Ordering::Relaxed);
                if p != last {
                    (last, since) = (p, Instant::now());
                    continue;
                }
                let full = std::fs::read_to_string(&path)
                    .ok()
                    .and_then(|t| parse_mm_stat(&t).ok())
                    .is_some_and(|m| m.mem_used_total + (1 << 20) >= mem_limit);
                if full && since.elapsed() >= patience {
                    watch.give_up.store(true, Ordering::Relaxed);
                    return;
                }
            }
        });
        ZramWatchdog {
            stop,
            handle: Some(handle),
        }
    }
}

impl Drop for ZramWatchdog {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}
