//! What the tests of the `zmem` binary share: running it, checking its one-line errors, the
//! corpus, scratch directories, JSON outputs, root checks, the locks that keep heavy tests apart,
//! and the preamble of the tests that run programs under `zmem run` (the preload library, the
//! userfaultfd probe, a private socket directory).
//!
//! The binary-driven tests live in this package (not in zmem-bench's) because only here does
//! `env!("CARGO_BIN_EXE_zmem")` name a `zmem` that cargo has built, fresh, for the test run.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};

use zmem_cli::run::RunError;

pub const MIB: u64 = 1 << 20;

/// The kernel-side tests share /dev/zram0: one at a time.
pub static KERNEL: Mutex<()> = Mutex::new(());

/// The machine has few cores: the tests that run programs under zmem run one at a time.
pub static HEAVY: Mutex<()> = Mutex::new(());

/// Mount point of the cgroup v1 memory controller.
pub const MEMCG: &str = "/sys/fs/cgroup/memory";

/// Holds `m` (also after another test panicked holding it).
pub fn lock(m: &'static Mutex<()>) -> MutexGuard<'static, ()> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The kernel side to this test alone ([`KERNEL`]).
pub fn kernel() -> MutexGuard<'static, ()> {
    lock(&KERNEL)
}

/// The machine to this test alone ([`HEAVY`]).
pub fn heavy() -> MutexGuard<'static, ()> {
    lock(&HEAVY)
}

/// The built `zmem`.
pub fn zmem_exe() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_zmem"))
}

/// The built `zmem` with `args`, not yet started, in a clean environment: RUST_LOG,
/// ZMEM_PRELOAD and every variable of zmem's own (`zmem_runenv::ALL_VARS`) removed.
pub fn zmem_cmd(args: &[&str]) -> Command {
    let mut c = Command::new(zmem_exe());
    c.args(args)
        .env_remove("RUST_LOG")
        .env_remove(zmem_cli::run::ENV_PRELOAD);
    for v in zmem_runenv::ALL_VARS {
        c.env_remove(v);
    }
    c
}

/// Runs the built `zmem` with `args` ([`zmem_cmd`]'s environment).
pub fn zmem(args: &[&str]) -> Output {
    zmem_cmd(args).output().expect("running zmem")
}

/// How long a program run under zmem by a test may take before the test calls it a hang.
pub const HANG: std::time::Duration = std::time::Duration::from_secs(300);

/// Runs the built `zmem` with `args` and its stats sockets in `sockets`, in a process group of
/// its own that is killed, and the test failed, if it runs past [`HANG`]: a hang of zmem (or of
/// the program under it) must fail the suite, not stall it.
pub fn zmem_in(args: &[&str], sockets: &Path) -> Output {
    use std::os::unix::process::CommandExt;
    let mut cmd = zmem_cmd(args);
    cmd.env(zmem_runenv::ENV_SOCKET_DIR, sockets)
        .process_group(0)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    let child = cmd.spawn().expect("running zmem");
    let pgid = child.id() as i32;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    match rx.recv_timeout(HANG) {
        Ok(out) => out.expect("waiting for zmem"),
        Err(_) => {
            // SAFETY: kill(2) on the process group made above; no memory is touched.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
            panic!("zmem {args:?} did not finish in {HANG:?}: killed (a hang)");
        }
    }
}

/// Fails (never skips) when the preload library has not been built next to zmem.
pub fn require_preload() {
    let lib = zmem_exe()
        .parent()
        .expect("zmem has a directory")
        .join("libzmem_preload.so");
    assert!(
        lib.is_file(),
        "{} is missing: run `cargo build --workspace` before `cargo test` (the preload library \
         is a cdylib, which `cargo test` does not build)",
        lib.display()
    );
}

/// Which failures of the userfaultfd probe skip a test.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Skip {
    /// Any: the test skips wherever zmem cannot serve a heap.
    AnyFailure,
    /// Only a missing permission to open userfaultfd; any other failure fails the test.
    PermissionOnly,
}

/// The message of `zmem_region::RegionError::Permission`, which
/// `zmem_cli::run::check_userfaultfd` passes on as the text of `RunError::Unavailable`.
const PERMISSION: &str = "cannot open /dev/userfaultfd";

/// Whether this user can make a region here (`zmem_cli::run::check_userfaultfd`, the check
/// `zmem run` makes before it starts a program); prints why not ("skipped: ...") when `skip`
/// lets the failure skip the test, and panics otherwise.
pub fn userfaultfd_available(skip: Skip) -> bool {
    match zmem_cli::run::check_userfaultfd() {
        Ok(()) => true,
        Err(e) => {
            let permission =
                matches!(&e, RunError::Unavailable(why) if why.starts_with(PERMISSION));
            if skip == Skip::PermissionOnly && !permission {
                panic!("creating a region: {e}");
            }
            eprintln!("skipped: {e}");
            false
        }
    }
}

/// The preamble of a test that runs a program under zmem: the preload library (or it fails),
/// userfaultfd (or, as `skip` says, it skips: false).
pub fn ready(skip: Skip) -> bool {
    require_preload();
    userfaultfd_available(skip)
}

/// A short directory for stats sockets (a unix socket's path has at most 107 bytes), private
/// to this user (0700) as zmem requires.
pub fn socket_dir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let d = tempfile::Builder::new()
        .prefix("zmem-sock-")
        .tempdir()
        .expect("a temporary directory");
    std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    d
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

/// The path of `bin` in PATH (or /usr/bin, /usr/sbin), if it is installed.
pub fn installed(bin: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/bin"), PathBuf::from("/usr/sbin")])
        .map(|d| d.join(bin))
        .find(|p| p.is_file())
}

/// A scratch directory under cargo's target tmpdir.
pub fn tmpdir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// The JSON file at `p`.
pub fn read_json(p: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}: {text}", p.display()))
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
