//! What the tests of the `zmem` binary share: running it, checking its one-line errors, the
//! corpus, scratch directories, JSON outputs, root checks.
//!
//! The binary-driven tests live in this package (not in zmem-bench's) because only here does
//! `env!("CARGO_BIN_EXE_zmem")` name a `zmem` that cargo has built, fresh, for the test run.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;

/// The kernel-side tests share /dev/zram0: one at a time.
pub static KERNEL: Mutex<()> = Mutex::new(());

/// Mount point of the cgroup v1 memory controller.
pub const MEMCG: &str = "/sys/fs/cgroup/memory";

/// Runs the built `zmem` with `args` (RUST_LOG removed).
pub fn zmem(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_zmem"))
        .args(args)
        .env_remove("RUST_LOG")
        .output()
        .expect("running zmem")
}

/// Asserts a failure with exit status 2 and exactly one stderr line `zmem: error: ...`
/// containing `needle`, and no panic; returns stderr.
pub fn fails_with(args: &[&str], needle: &str) -> String {
    let out = zmem(args);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "{args:?}: not one line: {stderr:?}");
    assert!(lines[0].starts_with("zmem: error: "), "{stderr:?}");
    assert!(
        lines[0].contains(needle),
        "{args:?}: {stderr:?} lacks {needle:?}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    stderr
}

/// The benchmarks' corpus directory, if it is there.
pub fn corpus() -> Option<String> {
    let c = zmem_bench::default_corpus();
    c.exists().then(|| c.display().to_string())
}

/// `--corpus DIR` with the default corpus directory (whether it exists or not).
pub fn corpus_args() -> Vec<String> {
    vec![
        "--corpus".into(),
        zmem_bench::default_corpus().display().to_string(),
    ]
}

/// A scratch directory under cargo's target tmpdir.
pub fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// The JSON file at `p`.
pub fn read_json(p: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap()
}

/// Whether the tests run as root.
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// What a benchmark's kernel side may change (swap devices, benchmark cgroups, zram0), captured before and compared after.
#[derive(Debug, PartialEq)]
pub struct MachineState {
    /// (device, priority) of every swap device.
    pub swaps: Vec<(String, String)>,
    pub cgroups: Vec<PathBuf>,
    pub zram0_disksize: String,
}

pub fn machine_state() -> MachineState {
    let swaps = std::fs::read_to_string("/proc/swaps")
        .unwrap()
        .lines()
        .skip(1)
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f[0].to_string(), f.get(4).unwrap_or(&"").to_string())
        })
        .collect();
    let mut cgroups: Vec<PathBuf> = std::fs::read_dir(MEMCG)
        .map(|d| {
            d.flatten()
                .filter(|e| e.file_name().to_string_lossy().starts_with("zmem-bench-"))
                .map(|e| e.path())
                .collect()
        })
        .unwrap_or_default();
    cgroups.sort();
    let zram0_disksize = std::fs::read_to_string("/sys/block/zram0/disksize")
        .unwrap_or_default()
        .trim()
        .to_string();
    MachineState {
        swaps,
        cgroups,
        zram0_disksize,
    }
}
