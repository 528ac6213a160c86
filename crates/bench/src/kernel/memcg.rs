//! cgroup v1 memory cgroups: [`MemCgroup`] exists for as long as the guard lives; reading
//! memory.stat and the OOM-kill count.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context;
use zmem_runenv::size::format_size;

/// Mount point of the cgroup v1 memory controller.
pub const MEMCG_ROOT: &str = "/sys/fs/cgroup/memory";
/// Name prefix of the benchmark's cgroups (followed by the pid of `zmem bench region`).
pub const CGROUP_PREFIX: &str = "zmem-bench-";
/// How often the parent reads the benchmark cgroup's memory.stat while the worker runs.
/// Reading it flushes the memory cgroup's statistics; without that, Linux 6.18 (cgroup v1,
/// no MGLRU) OOM-kills small cgroups (tens of MiB) that swap to zram: its reclaim decides
/// from stale counters, stops deactivating anon pages, and finds nothing to reclaim
/// (measured: a 32M set at an 8M limit was OOM-killed in 6 of 6 runs without the poll, in 0 of
/// 6 with it). A monitoring agent does the same on a real machine.
pub const STAT_POLL: Duration = Duration::from_millis(10);

/// Benchmark cgroups that exist under the memory controller (leftovers, or a run in progress).
pub fn bench_cgroups() -> Vec<PathBuf> {
    let Ok(dir) = std::fs::read_dir(MEMCG_ROOT) else {
        return Vec::new();
    };
    dir.flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(CGROUP_PREFIX))
        .map(|e| e.path())
        .collect()
}

/// Whether the cgroup v1 memory controller is mounted at [`MEMCG_ROOT`].
pub fn memcg_v1_available() -> bool {
    Path::new(MEMCG_ROOT).join("cgroup.procs").exists()
}

/// Prints a note for each benchmark cgroup left by a run whose process is gone.
pub fn note_leftover_cgroups() {
    for old in bench_cgroups() {
        let pid = old
            .file_name()
            .and_then(|n| n.to_str()?.strip_prefix(CGROUP_PREFIX)?.parse::<u32>().ok());
        if pid.is_some_and(|p| !Path::new(&format!("/proc/{p}")).exists()) {
            eprintln!(
                "zmem: note: {} is left from an earlier run that did not clean up; remove it \
                 with: rmdir {}",
                old.display(),
                old.display()
            );
        }
    }
}

/// A cgroup v1 memory cgroup that exists for as long as the guard lives.
#[derive(Debug)]
pub struct MemCgroup {
    path: PathBuf,
}

impl MemCgroup {
    /// Creates `root/name` (it must not exist), with memory.limit_in_bytes = `limit` if given.
    pub fn create(root: &Path, name: &str, limit: Option<u64>) -> anyhow::Result<MemCgroup> {
        let path = root.join(name);
        if let Err(e) = std::fs::create_dir(&path) {
            if e.kind() == std::io::ErrorKind::AlreadyExists {
                anyhow::bail!(
                    "cgroup {} exists already (a leftover? `rmdir {}` once it has no tasks)",
                    path.display(),
                    path.display()
                );
            }
            return Err(e).with_context(|| format!("creating cgroup {}", path.display()));
        }
        let cg = MemCgroup { path };
        if let Some(limit) = limit {
            cg.write("memory.limit_in_bytes", &limit.to_string())?;
        }
        eprintln!(
            "zmem: created memory cgroup {} (limit {})",
            cg.path.display(),
            limit.map_or("none yet".into(), format_size)
        );
        Ok(cg)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&self, file: &str, value: &str) -> anyhow::Result<()> {
        cg_write(&self.path, file, value)
    }
}

impl Drop for MemCgroup {
    fn drop(&mut self) {
        // The worker was reaped before; the kernel may still need a moment to let go.
        let t0 = Instant::now();
        loop {
            match std::fs::remove_dir(&self.path) {
                Ok(()) => {
                    eprintln!("zmem: removed cgroup {}", self.path.display());
                    return;
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
                Err(e)
                    if e.raw_os_error() == Some(libc::EBUSY)
                        && t0.elapsed() < Duration::from_secs(5) =>
                {
                    std::thread::sleep(Duration::from_millis(20));
                }
                Err(e) => {
                    let tasks = std::fs::read_to_string(self.path.join("cgroup.procs"))
                        .unwrap_or_default()
                        .split_whitespace()
                        .collect::<Vec<_>>()
                        .join(" ");
                    eprintln!(
                        "zmem: warning: could not remove cgroup {}: {e} (tasks: [{tasks}]); run: rmdir {}",
                        self.path.display(),
                        self.path.display()
                    );
                    return;
                }
            }
        }
    }
}

/// The oom_kill count of a v1 memory cgroup's memory.oom_control (0 if unknown).
pub fn oom_kills(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("memory.oom_control"))
        .ok()
        .and_then(|t| parse_memory_stat(&t).get("oom_kill").copied())
        .unwrap_or(0)
}

/// Writes `value` to the cgroup file `dir/file`.
pub fn cg_write(dir: &Path, file: &str, value: &str) -> anyhow::Result<()> {
    let p = dir.join(file);
    std::fs::write(&p, value).with_context(|| format!("writing {value:?} to {}", p.display()))
}

/// A cgroup file `dir/file` holding one number.
pub fn cg_read_u64(dir: &Path, file: &str) -> anyhow::Result<u64> {
    let p = dir.join(file);
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    text.trim()
        .parse()
        .with_context(|| format!("{} is not a number: {text:?}", p.display()))
}

/// memory.stat of a v1 memory cgroup as key -> value.
pub fn memory_stat(dir: &Path) -> anyhow::Result<HashMap<String, u64>> {
    let p = dir.join("memory.stat");
    let text = std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
    Ok(parse_memory_stat(&text))
}

pub fn parse_memory_stat(text: &str) -> HashMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(' ')?;
            Some((k.to_string(), v.trim().parse().ok()?))
        })
        .collect()
}

/// Moves the calling process into the cgroup whose `cgroup.procs` path is `procs` (written
/// "0": the writer itself). For `Command::pre_exec`: only system calls on data prepared before
/// the fork, no allocation.
pub fn join_in_child(procs: &std::ffi::CStr) -> std::io::Result<()> {
    // SAFETY: open/write/close on a valid C string and a static buffer.
    unsafe {
        let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let n = libc::write(fd, b"0".as_ptr().cast(), 1);
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if n != 1 {
            return Err(err);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_stat_parse() {
        let m = parse_memory_stat("cache 4096\nrss 8192\npgmajfault 3\n");
        assert_eq!(m["rss"], 8192);
        assert_eq!(m["pgmajfault"], 3);
    }
}
