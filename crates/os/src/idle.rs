//! Whether the machine has idle CPU: the share of CPU time idle since the last look, from the
//! first line of /proc/stat. Background work that only saves memory (the store's deferred
//! entropy tries, the cold pass) runs only when it would take no CPU from the program: a program that
//! computes on every CPU between its faults (GNU sort's threads) would otherwise lose the time.

use std::io::Read;
use std::time::{Duration, Instant};

/// Looks at /proc/stat at most this often; between looks the last share holds.
const EVERY: Duration = Duration::from_millis(100);

/// The machine's idle share of CPU time between looks.
pub struct IdleCpu {
    last: Option<(u64, u64)>,
    at: Option<Instant>,
    share: f32,
    /// Half a CPU, as a share of all of them.
    half_a_cpu: f32,
}

impl IdleCpu {
    pub fn new() -> IdleCpu {
        // SAFETY: sysconf has no preconditions. (Not this thread's affinity: colocation
        // changes the evictor's.)
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1);
        IdleCpu {
            last: None,
            at: None,
            share: 0.0,
            half_a_cpu: 0.5 / cpus as f32,
        }
    }

    /// Whether at least half a CPU was idle over the last period: background work that only
    /// saves memory may run.
    pub fn half_a_cpu_idle(&mut self) -> bool {
        self.share() >= self.half_a_cpu
    }

    /// The share (0..=1) of all CPUs' time spent idle over the last period of at least
    /// `EVERY`; 0 until two looks were made, and when /proc/stat cannot be read (then
    /// background work waits for a quiet machine it cannot see, which costs memory, never
    /// time).
    pub fn share(&mut self) -> f32 {
        if self.at.is_some_and(|t| t.elapsed() < EVERY) {
            return self.share;
        }
        self.at = Some(Instant::now());
        let now = read_cpu_line();
        if let (Some((idle0, total0)), Some((idle1, total1))) = (self.last, now) {
            self.share = idle_share(idle1.saturating_sub(idle0), total1.saturating_sub(total0));
        }
        self.last = now;
        self.share
    }
}

impl Default for IdleCpu {
    fn default() -> IdleCpu {
        IdleCpu::new()
    }
}

fn idle_share(idle: u64, total: u64) -> f32 {
    if total == 0 {
        return 0.0;
    }
    (idle as f32 / total as f32).clamp(0.0, 1.0)
}

/// (idle + iowait, all) jiffies of the machine, from /proc/stat's first line.
fn read_cpu_line() -> Option<(u64, u64)> {
    let mut buf = [0u8; 256];
    let mut f = std::fs::File::open("/proc/stat").ok()?;
    let n = f.read(&mut buf).ok()?;
    parse_cpu_line(std::str::from_utf8(&buf[..n]).ok()?)
}

/// Parses `cpu  user nice system idle iowait irq softirq steal guest guest_nice`: guest time
/// is already counted in user and nice, so the total is the first eight fields.
fn parse_cpu_line(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().next()?;
    let mut f = line.split_ascii_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = f.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 5 {
        return None;
    }
    Some((v[3] + v[4], v.iter().sum()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_line_of_proc_stat_is_parsed() {
        let text = "cpu  100 5 50 800 20 3 2 10 7 0\ncpu0 50 2 25 400 10 1 1 5 3 0\n";
        assert_eq!(parse_cpu_line(text), Some((820, 990)));
        // Older kernels have fewer fields; idle and iowait are enough.
        assert_eq!(parse_cpu_line("cpu 1 2 3 4 5\n"), Some((9, 15)));
        assert_eq!(parse_cpu_line("cpu 1 2 3\n"), None);
        assert_eq!(parse_cpu_line("cpu0 1 2 3 4 5\n"), None);
        assert_eq!(parse_cpu_line("cpu 1 x 3 4 5\n"), None);
        assert_eq!(parse_cpu_line(""), None);
    }

    #[test]
    fn the_share_is_of_the_time_between_looks() {
        assert_eq!(idle_share(0, 0), 0.0);
        assert_eq!(idle_share(50, 200), 0.25);
        assert_eq!(idle_share(300, 200), 1.0);
        // This machine's own /proc/stat parses, and two looks give a share in range.
        assert!(read_cpu_line().is_some());
        let mut c = IdleCpu::new();
        assert_eq!(c.share(), 0.0, "one look is not a period");
        std::thread::sleep(EVERY + Duration::from_millis(20));
        let s = c.share();
        assert!((0.0..=1.0).contains(&s), "{s}");
    }
}
