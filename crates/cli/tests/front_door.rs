//! The front door, end to end with the built binary: the built-in `zmem demo` (a key-value
//! program inside zmem, under `zmem run`) verifies every value and prints its savings; a value
//! corrupted inside the program is caught and named; bad flags are one-line errors; `zmem
//! doctor` agrees with what this machine offers; `zmem stat --all --prometheus` sees a running
//! program.
//!
//! The preload library is a cdylib that `cargo test` does not build: the tests that run
//! programs fail (never skip) when `cargo build --workspace` has not put it next to zmem. Those
//! that need /dev/userfaultfd skip with the reason where it cannot be opened.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use support::{
    heavy, ready, require_preload, socket_dir, userfaultfd_available, zmem_cmd, zmem_in, Skip,
};

/// What a test that runs programs under zmem needs: the preload library (or it fails),
/// userfaultfd (or it skips: None), the machine to itself, a socket directory.
fn program_test() -> Option<(std::sync::MutexGuard<'static, ()>, tempfile::TempDir)> {
    if !ready(Skip::AnyFailure) {
        return None;
    }
    Some((heavy(), socket_dir()))
}

#[test]
fn builtin_demo_verifies_every_value_and_reports_its_savings() {
    let Some((_g, sockets)) = program_test() else {
        return;
    };
    let out = zmem_in(
        &["demo", "--size", "32M", "--resident", "8M"],
        sockets.path(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stdout.contains("every value correct"), "{stdout}");
    // The live statistics of the worker, and zmem run's summary at exit.
    assert!(stdout.contains("$ zmem stat "), "{stdout}");
    assert!(stdout.contains("RESIDENT"), "{stdout}");
    assert!(stderr.contains("peak heap data"), "{stderr}");
    let line = stdout
        .lines()
        .find(|l| l.starts_with("data held "))
        .unwrap_or_else(|| panic!("no savings line: {stdout}"));
    let ratio: f64 = line
        .split("ratio ")
        .nth(1)
        .and_then(|r| r.split('x').next())
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no ratio in {line:?}"));
    assert!(ratio > 1.0, "{line}");
}

#[test]
fn a_corrupted_value_is_caught_and_named() {
    let Some((_g, sockets)) = program_test() else {
        return;
    };
    let out = zmem_in(
        &[
            "demo",
            "--size",
            "4M",
            // Below the data, so the corrupted value and the map are evicted. This hung until
            // issue 10: on the error path the worker frees its map while a zmem thread, evicting,
            // ran mimalloc's arena purge over the program's heap (docs/DESIGN-NOTES.md).
            "--resident",
            "2M",
            "--corrupt-key",
            "17",
        ],
        sockets.path(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stdout}\n{stderr}");
    assert!(stderr.contains("the value of key 17 is wrong"), "{stderr}");
    assert!(stderr.contains("the demo program failed"), "{stderr}");
    assert!(!stdout.contains("every value correct"), "{stdout}");
}

#[test]
fn bad_demo_flags_are_one_line_errors() {
    let sockets = socket_dir();
    for (args, needle) in [
        (&["demo", "--size", "12q"][..], "12q"),
        (&["demo", "--size", "100k"][..], "too small"),
        (&["demo", "--policy", "best"][..], "best"),
        (&["demo", "sideways"][..], "sideways"),
        (&["demo-worker", "--size", "1k"][..], "too small"),
    ] {
        let out = zmem_in(args, sockets.path());
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?}: {stderr}");
        assert!(stderr.contains(needle), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
    }
}

#[test]
fn demo_store_names_the_corpus_it_needs() {
    let sockets = socket_dir();
    let missing = sockets.path().join("no-corpus");
    let out = zmem_in(
        &["demo", "store", "--corpus", missing.to_str().unwrap()],
        sockets.path(),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("Calgary corpus"), "{stderr}");
    assert!(stderr.contains("needs nothing installed"), "{stderr}");
}

#[test]
fn doctor_agrees_with_this_machine() {
    require_preload();
    let sockets = socket_dir();
    let out = zmem_in(&["doctor", "--json"], sockets.path());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("doctor --json");
    let ok = doc["ok"].as_bool().unwrap();
    assert_eq!(out.status.code(), Some(if ok { 0 } else { 1 }));
    // The tests' own probe: a region can be made exactly when doctor says zmem run can work
    // (the kernel and the preload library being there too).
    assert_eq!(ok, userfaultfd_available(Skip::AnyFailure), "{doc}");
    let items: Vec<&str> = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["item"].as_str().unwrap())
        .collect();
    for item in [
        "kernel",
        "userfaultfd",
        "preload library",
        "zram",
        "io_uring",
    ] {
        assert!(items.contains(&item), "{item}: {items:?}");
    }
    let text = zmem_in(&["doctor"], sockets.path());
    let table = String::from_utf8_lossy(&text.stdout);
    assert!(table.starts_with("STATUS"), "{table}");
}

#[test]
fn stat_all_and_prometheus_see_a_running_program() {
    let Some((_g, sockets)) = program_test() else {
        return;
    };
    // A shell that allocates a little (through its own malloc) and then waits.
    let mut child = zmem_cmd(&["run", "--quiet", "--resident", "16M", "--", "sleep", "30"])
        .env(zmem_runenv::ENV_SOCKET_DIR, sockets.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // A dead socket: a file nobody listens on, which --all skips.
    std::fs::write(sockets.path().join("999999999.sock"), b"").unwrap();
    let t = Instant::now();
    let mut prom = String::new();
    while t.elapsed() < Duration::from_secs(20) {
        let out = zmem_in(&["stat", "--all", "--prometheus"], sockets.path());
        assert!(out.status.success());
        prom = String::from_utf8_lossy(&out.stdout).into_owned();
        if prom.contains("zmem_budget_bytes{") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let table = zmem_in(&["stat", "--all"], sockets.path());
    // SAFETY: signalling our own child (zmem run passes SIGTERM on to the program).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    assert!(
        prom.contains("# TYPE zmem_evictions_total counter"),
        "{prom}"
    );
    let budget = prom
        .lines()
        .find(|l| l.starts_with("zmem_budget_bytes{"))
        .unwrap_or_else(|| panic!("no sample: {prom}"));
    assert!(budget.contains("comm=\"sleep\""), "{budget}");
    assert!(budget.ends_with(&format!(" {}", 16u64 << 20)), "{budget}");
    assert!(!prom.contains("999999999"), "{prom}");
    let table = String::from_utf8_lossy(&table.stdout);
    assert_eq!(table.lines().count(), 2, "{table}");
    assert!(table.contains("sleep"), "{table}");
}
