//! Child processes stopped and reaped when the benchmark is done with them (also on error and
//! Ctrl-C), and scratch directories removed when dropped. Imports nothing from the benchmarks.

use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

use anyhow::Context;

/// This very binary, for re-executing it as a hidden worker (`zmem bench region-worker`,
/// `zmem bench hog`): /proc/self/exe runs it even if its file was replaced since it started.
pub fn self_exe() -> anyhow::Result<PathBuf> {
    match Path::new("/proc/self/exe") {
        p if p.exists() => Ok(p.to_path_buf()),
        _ => std::env::current_exe().context("locating the zmem binary"),
    }
}

/// How [`terminate`] ended a child.
#[derive(Clone, Copy, Debug)]
pub struct Terminated {
    /// Its exit status, if it could be reaped.
    pub status: Option<ExitStatus>,
    /// Whether it had to be killed (it did not exit within the grace period of SIGTERM).
    pub killed: bool,
}

/// SIGTERM to `child` (which must not have been reaped), up to `grace` for it to exit (polled
/// every 20 ms), then SIGKILL; reaped in every case.
pub fn terminate(child: &mut Child, grace: Duration) -> Terminated {
    let pid = child.id() as libc::pid_t;
    // SAFETY: pid is our child, not yet reaped, so the pid cannot have been reused.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let t0 = Instant::now();
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Terminated {
                status: Some(status),
                killed: false,
            };
        }
        if t0.elapsed() >= grace {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Child::kill signals exactly the pid we started (SIGKILL).
    let _ = child.kill();
    Terminated {
        status: child.wait().ok(),
        killed: true,
    }
}

/// SIGKILL to `child` unless it has exited already; reaped. Its exit status.
pub fn kill_and_reap(child: &mut Child) -> Option<ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    // Child::kill signals exactly the pid we started.
    let _ = child.kill();
    child.wait().ok()
}

/// How a process ended, for a message: "exited with status 1", "was killed by SIGKILL",
/// "was killed by signal 11".
pub fn describe_status(s: ExitStatus) -> String {
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exited with status {c}"),
        (None, Some(libc::SIGKILL)) => "was killed by SIGKILL".into(),
        (None, Some(sig)) => format!("was killed by signal {sig}"),
        _ => format!("ended with {s}"),
    }
}

/// What a signal that ended a process usually means, for a message (" (SIGABRT)"; empty if
/// nothing useful).
pub fn signal_name(sig: i32) -> &'static str {
    match sig {
        libc::SIGKILL => " (SIGKILL: the OOM killer, or a kill)",
        libc::SIGABRT => " (SIGABRT)",
        libc::SIGSEGV => " (SIGSEGV)",
        libc::SIGTERM => " (SIGTERM)",
        libc::SIGINT => " (SIGINT)",
        _ => "",
    }
}

/// A scratch directory `zmem-bench-NAME-PID` in the temporary directory, removed when dropped.
#[derive(Debug)]
pub struct ScratchDir(PathBuf);

impl ScratchDir {
    pub fn create(name: &str) -> anyhow::Result<ScratchDir> {
        let p = std::env::temp_dir().join(format!("zmem-bench-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(ScratchDir(p))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
