//! `zmem stat`: the live statistics of programs running under zmem, read from their stats
//! sockets (one per process, `<socket dir>/<pid>.sock`, see `zmem_runenv`): one process as a
//! zramctl-like table or JSON, every process of this user (`--all`, dead sockets skipped), or
//! Prometheus text ([`crate::metrics`]) for node_exporter's textfile collector.

use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use clap::Args;
use zmem_runenv::ProcessStats;

pub use zmem_runenv::query_stats as query;

pub use zmem_runenv::report::table;

#[derive(Debug, Args)]
pub struct StatArgs {
    /// Process id of a program running under zmem.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub pid: Option<u32>,
    /// Every zmem process of this user (every live socket of the socket directory).
    #[arg(long)]
    pub all: bool,
    /// Print the statistics as JSON (an array with --all).
    #[arg(long, conflicts_with = "prometheus")]
    pub json: bool,
    /// Print Prometheus/OpenMetrics text exposition (for node_exporter's textfile collector).
    #[arg(long)]
    pub prometheus: bool,
    /// Print again every SECONDS until the program exits (--all: until interrupted).
    #[arg(long, value_name = "SECONDS", conflicts_with = "prometheus")]
    pub watch: Option<f64>,
}

/// The live statistics of every process with a socket in `dir`, by pid; sockets nobody answers
/// on (a process that died without removing its socket) are skipped.
pub fn query_all(dir: &Path) -> Vec<ProcessStats> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut pids: Vec<u32> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            name.strip_suffix(".sock")?.parse().ok()
        })
        .collect();
    pids.sort_unstable();
    pids.into_iter()
        .filter_map(|pid| query(dir, pid).ok())
        .collect()
}

/// Why one process has no statistics, said so the user knows what to do.
fn no_stats(dir: &Path, pid: u32, e: &std::io::Error) -> anyhow::Error {
    let path = zmem_runenv::socket_path(dir, pid);
    // SAFETY: kill with signal 0 only checks existence.
    let alive = unsafe { libc::kill(pid as i32, 0) } == 0;
    anyhow::anyhow!(
        "no zmem statistics for pid {pid}: {} ({}: {e}){}",
        if alive {
            "the process is not running under zmem, or belongs to another user"
        } else {
            "no such process"
        },
        path.display(),
        if path.exists() && !alive {
            "; the socket is stale"
        } else {
            ""
        }
    )
}

/// `zmem stat`.
pub fn run(a: &StatArgs) -> anyhow::Result<()> {
    let dir = zmem_runenv::socket_dir_from_env();
    if let Some(secs) = a.watch {
        if secs <= 0.0 || !secs.is_finite() {
            bail!("--watch needs a positive number of seconds");
        }
    }
    let mut first = true;
    loop {
        let rows = match a.pid {
            Some(pid) => match query(&dir, pid) {
                Ok(s) => vec![s],
                Err(e) if !first => {
                    eprintln!("zmem: pid {pid} is gone ({e})");
                    return Ok(());
                }
                Err(e) => return Err(no_stats(&dir, pid, &e)),
            },
            None => query_all(&dir),
        };
        if first && a.all && rows.is_empty() {
            eprintln!(
                "zmem: no process of this user runs under zmem (no live socket in {})",
                dir.display()
            );
        }
        let refs: Vec<&ProcessStats> = rows.iter().collect();
        if a.prometheus {
            print!("{}", crate::metrics::exposition(&refs));
        } else if a.json && a.all {
            println!("{}", serde_json::to_string(&rows)?);
        } else if a.json {
            println!("{}", serde_json::to_string(&rows[0])?);
        } else if first || a.all {
            print!("{}", table(&refs));
            for s in &refs {
                let lines = [
                    zmem_runenv::report::cold_line(s),
                    zmem_runenv::report::dictionary_line(s),
                    zmem_runenv::report::large_blocks_line(s),
                    zmem_runenv::report::ssd_line(s),
                ];
                for l in lines.into_iter().flatten() {
                    print!("{l}");
                }
            }
        } else {
            let t = table(&refs);
            println!("{}", t.lines().nth(1).unwrap_or(""));
        }
        first = false;
        match a.watch {
            Some(secs) => std::thread::sleep(Duration::from_secs_f64(secs)),
            None => return Ok(()),
        }
    }
}
