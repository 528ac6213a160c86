//! Redis 7.0.15's own test suite (../shared/peer/redis-7.0.15, tcl) against Debian's
//! redis-server running under `zmem run` with a budget small enough that its pages leave DRAM
//! and come back while the tests run (issue 10: a test that passes on the plain server and fails
//! under zmem is a zmem bug). The suite starts `src/redis-server` of its own folder, so a copy of
//! the folder gets a wrapper there that execs `zmem run -- /usr/bin/redis-server "$@"`; since
//! `zmem run` execs, the suite tracks the real server by its pid, as it must.
//!
//! Each unit runs on the plain server first; a unit that fails there too is skipped, with its
//! output. Skipped as a whole (with the reason) where the suite, tclsh (Debian package `tcl`) or
//! redis-server is missing; `.ci/run` installs both packages.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::*;

/// Units run, chosen to cover strings, counters, lists, hashes, sets, sorted sets, expiry,
/// keyspace commands and MULTI (about 65 s on the plain server here, as long again under zmem).
const UNITS: &[&str] = &[
    "unit/type/string",
    "unit/type/incr",
    "unit/type/list",
    "unit/type/hash",
    "unit/type/set",
    "unit/expire",
    "unit/keyspace",
    "unit/multi",
];

/// A budget below what the servers of these units touch (the string unit's server holds about
/// 40 MiB of data at its peak).
const BUDGET: &str = "8M";

/// The longest a unit may take (a hang under zmem fails the test instead of stalling it).
const UNIT_LIMIT: Duration = Duration::from_secs(600);

fn suite_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("ZMEM_PEER_DIR") {
        return Some(PathBuf::from(d).join("redis-7.0.15"));
    }
    let d = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/peer/redis-7.0.15");
    d.join("runtest").is_file().then_some(d)
}

fn on_path(bin: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {bin}")])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// What one run of one unit left.
struct UnitRun {
    passed: bool,
    output: String,
}

/// Runs `unit` of the suite copy at `dir`, in a process group killed after [`UNIT_LIMIT`].
fn run_unit(dir: &Path, unit: &str, sockets: &Path) -> UnitRun {
    let log = dir.join("unit.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut cmd = Command::new("./runtest");
    cmd.current_dir(dir)
        .args(["--clients", "1", "--single", unit])
        .env(zmem_runenv::ENV_SOCKET_DIR, sockets)
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .process_group(0);
    for v in zmem_runenv::ALL_VARS {
        cmd.env_remove(v);
    }
    let mut child = cmd.spawn().expect("running the redis suite's runtest");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if t0.elapsed() > UNIT_LIMIT {
            // SAFETY: kill(2) on the process group made above.
            unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let output = std::fs::read_to_string(&log).unwrap_or_default();
    let passed =
        status.is_some_and(|s| s.success()) && output.contains("All tests passed without errors");
    let output = match status {
        None => format!("{output}\n(killed after {UNIT_LIMIT:?}: a hang)"),
        Some(_) => output,
    };
    UnitRun { passed, output }
}

fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Points `src/redis-server` of the copy at the plain server or at the zmem wrapper.
fn use_server(dir: &Path, wrapper: Option<&str>) {
    let server = dir.join("src/redis-server");
    let _ = std::fs::remove_file(&server);
    match wrapper {
        None => std::os::unix::fs::symlink("/usr/bin/redis-server", &server).unwrap(),
        Some(text) => {
            std::fs::write(&server, text).unwrap();
            std::fs::set_permissions(&server, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
    }
}

#[test]
fn redis_own_tests_pass_under_zmem() {
    let Some(suite) = suite_dir() else {
        eprintln!(
            "skipped: redis's test suite is not at ../shared/peer/redis-7.0.15 (set ZMEM_PEER_DIR)"
        );
        return;
    };
    for bin in ["tclsh", "redis-server", "redis-cli"] {
        if !on_path(bin) {
            eprintln!(
                "skipped: {bin} is not installed (Debian packages tcl, redis-server, redis-tools)"
            );
            return;
        }
    }
    if !ready(Skip::AnyFailure) {
        return;
    }
    let _g = heavy();
    let work = tmpdir();
    let dir = work.path().join("redis");
    let cp = Command::new("cp")
        .arg("-r")
        .arg(&suite)
        .arg(&dir)
        .status()
        .unwrap();
    assert!(cp.success(), "copying {}", suite.display());
    std::fs::create_dir_all(dir.join("src")).unwrap();
    for tool in ["redis-cli", "redis-benchmark", "redis-check-aof"] {
        let _ = std::os::unix::fs::symlink(format!("/usr/bin/{tool}"), dir.join("src").join(tool));
    }
    let stats = work.path().join("stats");
    std::fs::create_dir_all(&stats).unwrap();
    let sockets = socket_dir();
    // $$ is the wrapper's pid, which zmem run and then redis-server keep (each execs).
    let wrapper = format!(
        "#!/bin/sh\nexec '{}' run --quiet --resident {BUDGET} --stats '{}'/$$.json -- /usr/bin/redis-server \"$@\"\n",
        zmem_exe().display(),
        stats.display()
    );

    let mut ran = Vec::new();
    for unit in UNITS {
        use_server(&dir, None);
        let plain = run_unit(&dir, unit, sockets.path());
        if !plain.passed {
            eprintln!(
                "skipped {unit}: it fails on the plain server too:\n{}",
                tail(&plain.output, 20)
            );
            continue;
        }
        use_server(&dir, Some(&wrapper));
        let zmem = run_unit(&dir, unit, sockets.path());
        assert!(
            zmem.passed,
            "{unit} passes on the plain server but not under zmem run --resident {BUDGET}:\n{}",
            tail(&zmem.output, 60)
        );
        ran.push(*unit);
    }
    assert!(
        !ran.is_empty(),
        "no unit passes even on the plain server: the suite cannot run here"
    );
    // The servers really ran under zmem, and pages left DRAM and came back during the tests.
    let (mut servers, mut evictions, mut faults) = (0, 0, 0);
    for e in std::fs::read_dir(&stats).unwrap().flatten() {
        let r = read_json(&e.path());
        servers += 1;
        evictions += r["zmem"]["region"]["evictions"].as_u64().unwrap();
        faults += r["zmem"]["region"]["major_faults"].as_u64().unwrap();
    }
    assert!(servers >= ran.len(), "{servers} server reports for {ran:?}");
    assert!(
        evictions > 0 && faults > 0,
        "nothing was evicted: {evictions} evictions, {faults} faults"
    );
    eprintln!(
        "redis suite under zmem --resident {BUDGET}: {} units passed ({ran:?}), {servers} servers, {evictions} evictions, {faults} major faults",
        ran.len()
    );
}
