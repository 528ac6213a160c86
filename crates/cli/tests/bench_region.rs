//! `zmem bench region`: bad input, a tiny zmem run, and the kernel side's guards (as root):
//! after a run, a failing worker or an interrupt, the machine is as it was (swap devices, no
//! benchmark cgroup, zram0 reset).

mod support;

use support::{
    corpus, fails_with, kernel, machine_state, read_json, tmpdir, zmem, zmem_cmd, MachineState,
    MEMCG,
};

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn bad_input_is_one_line_and_exit_2() {
    fails_with(
        &["bench", "region", "--size", "16M", "--resident", "32M"],
        "--resident 32M is larger than --size 16M",
    );
    fails_with(
        &[
            "bench",
            "region",
            "--size",
            "16M",
            "--resident",
            "4M",
            "--threads",
            "0",
        ],
        "--threads must be at least 1",
    );
    fails_with(&["bench", "region", "--pattern", "sideways"], "sideways");
    fails_with(
        &[
            "bench",
            "region",
            "--size",
            "16M",
            "--resident",
            "4M",
            "--corpus",
            "/nonexistent/corpus",
        ],
        "/nonexistent/corpus",
    );
    fails_with(
        &["bench", "region", "--size", "5000", "--resident", "4M"],
        "multiple of 4k",
    );
    fails_with(
        &[
            "bench",
            "region",
            "--size",
            "16M",
            "--resident",
            "4M",
            "--write-ratio",
            "2",
        ],
        "--write-ratio",
    );
    fails_with(&["bench", "region", "--eviction", "lru"], "lru");
}

#[test]
fn help_lists_the_flags_and_hides_the_worker() {
    let out = zmem(&["bench", "region", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let s = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--size",
        "--resident",
        "--pattern",
        "--threads",
        "--corpus",
        "--json",
        "--kernel-zram",
        "--accesses",
        "--duration",
        "--write-ratio",
        "--policy",
        "--eviction",
        "--compare-eviction",
        "--zipf-s",
        "--seed",
    ] {
        assert!(s.contains(opt), "help lacks {opt}");
    }
    assert!(!s.contains("worker-fail"));
    let out = zmem(&["bench", "--help"]);
    let s = String::from_utf8_lossy(&out.stdout);
    assert!(s.contains("region"));
    assert!(!s.contains("region-worker"), "{s}");
}

fn check_side(r: &serde_json::Value, accesses: u64) {
    let label = r["label"].as_str().unwrap();
    assert_eq!(r["run"]["accesses"], accesses, "{label}");
    let reads = r["run"]["reads"].as_u64().unwrap();
    let writes = r["run"]["writes"].as_u64().unwrap();
    assert_eq!(reads + writes, accesses, "{label}");
    assert!(
        reads > accesses / 4 && writes > accesses / 4,
        "{label}: {reads}/{writes}"
    );
    for k in ["p50_us", "p99_us", "p999_us"] {
        assert!(r["run"]["access"][k].as_f64().unwrap() > 0.0, "{label} {k}");
        assert!(r["fault_latency"][k].as_f64().is_some(), "{label} {k}");
    }
    assert!(r["run"]["ns_per_access"].as_f64().unwrap() > 0.0);
    assert!(r["run"]["mib_s"].as_f64().unwrap() > 0.0);
    assert!(r["faults_per_s"].as_f64().is_some());
    assert!(r["cpu_s_per_gib"].as_f64().unwrap() > 0.0, "{label}");
    assert!(r["kswapd_cpu_s"].as_f64().is_some());
    let m = &r["memory"];
    assert!(m["ratio"].as_f64().unwrap() > 1.0, "{label}: {m}");
    assert!(m["effective_ratio"].as_f64().unwrap() > 1.0, "{label}: {m}");
    assert!(m["dram_bytes"].as_u64().unwrap() > 0);
    assert!(m["pool_bytes"].as_u64().unwrap() > 0);
}

#[test]
fn tiny_zmem_run_writes_json() {
    let Some(c) = corpus() else {
        eprintln!("skipped: no corpus");
        return;
    };
    let dir = tmpdir();
    let json = dir.path().join("r.json");
    let plot = dir.path().join("r.svg");
    let (js, ps) = (json.display().to_string(), plot.display().to_string());
    let out = zmem(&[
        "bench",
        "region",
        "--size",
        "16M",
        "--resident",
        "4M",
        "--pattern",
        "rand",
        "--accesses",
        "20000",
        "--corpus",
        &c,
        "--json",
        &js,
        "--plot",
        &ps,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("faults/access"), "{stdout}");
    let doc = read_json(&json);
    for k in [
        "command", "args", "machine", "corpus", "workload", "results", "skipped",
    ] {
        assert!(!doc[k].is_null(), "JSON lacks {k}");
    }
    assert!(doc["error"].is_null());
    assert_eq!(doc["workload"]["pattern"], "rand");
    let r = &doc["results"][0];
    assert_eq!(r["label"], "zmem-clock");
    assert_eq!(r["kind"], "zmem");
    check_side(r, 20000);
    // Uniform over 16M with 4M resident: about 3 of 4 accesses miss.
    let fpa = r["faults_per_access"].as_f64().unwrap();
    assert!((0.3..1.2).contains(&fpa), "faults/access {fpa}");
    assert!(r["faults"].as_u64().unwrap() > 0);
    assert!(r["handler_fault_latency"]["count"].as_u64().unwrap() > 0);
    assert!(r["fault_latency"]["count"].as_u64().unwrap() > 0);
    assert!(plot.exists());
}

#[test]
fn tiny_eviction_comparison() {
    let Some(c) = corpus() else {
        eprintln!("skipped: no corpus");
        return;
    };
    let dir = tmpdir();
    let json = dir.path().join("r.json");
    let plot = dir.path().join("r.svg");
    let (js, ps) = (json.display().to_string(), plot.display().to_string());
    let out = zmem(&[
        "bench",
        "region",
        "--size",
        "16M",
        "--resident",
        "4M",
        "--pattern",
        "zipf",
        "--accesses",
        "20000",
        "--compare-eviction",
        "--corpus",
        &c,
        "--json",
        &js,
        "--plot",
        &ps,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.contains("clock") && stdout.contains("fifo"),
        "{stdout}"
    );
    let doc = read_json(&json);
    let labels: Vec<&str> = doc["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["label"].as_str().unwrap())
        .collect();
    assert_eq!(labels, ["zmem-clock", "zmem-fifo"]);
    let e = &doc["eviction_comparison"];
    assert!(e["clock_faults_per_access"].as_f64().unwrap() > 0.0, "{e}");
    assert!(e["fifo_faults_per_access"].as_f64().unwrap() > 0.0, "{e}");
    assert!(e["reduction_pct"].as_f64().is_some(), "{e}");
}

/// None (with the reason printed) when the kernel side cannot run here.
fn kernel_side_possible() -> Option<MachineState> {
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    if uid != 0 {
        eprintln!("skipped: the kernel side needs root (uid {uid})");
        return None;
    }
    if !Path::new(MEMCG).join("cgroup.procs").exists() {
        eprintln!("skipped: no cgroup v1 memory controller at {MEMCG}");
        return None;
    }
    let s = machine_state();
    if s.zram0_disksize != "0" || s.swaps.iter().any(|(d, _)| d == "/dev/zram0") {
        eprintln!("skipped: /dev/zram0 is missing or in use ({s:?})");
        return None;
    }
    Some(s)
}

/// True when the run skipped the kernel side because zram0 got busy meanwhile (another user).
fn raced(doc: &serde_json::Value) -> bool {
    doc["skipped"]
        .as_array()
        .is_some_and(|v| v.iter().any(|s| s["label"] == "kernel-zram"))
}

#[test]
fn kernel_zram_run_restores_the_machine() {
    let _g = kernel();
    let Some(c) = corpus() else {
        eprintln!("skipped: no corpus");
        return;
    };
    let Some(before) = kernel_side_possible() else {
        return;
    };
    let dir = tmpdir();
    let json = dir.path().join("k.json");
    let plot = dir.path().join("k.svg");
    let (js, ps) = (json.display().to_string(), plot.display().to_string());
    let out = zmem(&[
        "bench",
        "region",
        "--kernel-zram",
        "--size",
        "64M",
        "--resident",
        "32M",
        "--pattern",
        "rand",
        "--accesses",
        "20000",
        "--corpus",
        &c,
        "--json",
        &js,
        "--plot",
        &ps,
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(machine_state(), before, "machine not restored; {stderr}");
    let doc = read_json(&json);
    if raced(&doc) {
        eprintln!("skipped: {}", doc["skipped"]);
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let results = doc["results"].as_array().unwrap();
    let k = results
        .iter()
        .find(|r| r["label"] == "kernel-zram")
        .expect("a kernel-zram result");
    check_side(k, 20000);
    let fpa = k["faults_per_access"].as_f64().unwrap();
    assert!((0.2..1.2).contains(&fpa), "kernel faults/access {fpa}");
    let restored = &k["detail"]["restored"];
    assert_eq!(restored["swaps_as_before"], true, "{restored}");
    assert_eq!(restored["cgroup_removed"], true, "{restored}");
    assert_eq!(restored["zram_disksize"], 0, "{restored}");
    assert!(results.iter().any(|r| r["label"] == "zmem-clock"));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("zmem-clock/kernel"), "{stdout}");
}

#[test]
fn failing_worker_still_restores_the_machine() {
    let _g = kernel();
    let Some(c) = corpus() else {
        eprintln!("skipped: no corpus");
        return;
    };
    let Some(before) = kernel_side_possible() else {
        return;
    };
    let dir = tmpdir();
    let json = dir.path().join("k.json");
    let plot = dir.path().join("k.svg");
    let (js, ps) = (json.display().to_string(), plot.display().to_string());
    for (fail, msg) in [
        ("start", "exited with status 2"),
        ("fill", "exited with status 2"),
        ("abort", "signal 6"),
    ] {
        let out = zmem(&[
            "bench",
            "region",
            "--kernel-zram",
            "--size",
            "32M",
            "--resident",
            "16M",
            "--accesses",
            "1000",
            "--corpus",
            &c,
            "--json",
            &js,
            "--plot",
            &ps,
            "--worker-fail",
            fail,
        ]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(
            machine_state(),
            before,
            "{fail}: machine not restored; {stderr}"
        );
        if raced(&read_json(&json)) {
            eprintln!("skipped: zram0 got busy");
            return;
        }
        assert_eq!(out.status.code(), Some(2), "{fail}: {stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        assert!(last.starts_with("zmem: error: "), "{fail}: {stderr}");
        assert!(last.contains(msg), "{fail}: {stderr}");
        for step in [
            "swapoff /dev/zram0",
            "removed cgroup",
            "restored /dev/zram0",
        ] {
            assert!(stderr.contains(step), "{fail}: {step:?} missing: {stderr}");
        }
        let doc = read_json(&json);
        assert!(
            doc["error"].as_str().unwrap().contains(msg),
            "{}",
            doc["error"]
        );
    }
}

#[test]
fn interrupt_during_the_kernel_side_restores_the_machine() {
    let _g = kernel();
    let Some(c) = corpus() else {
        eprintln!("skipped: no corpus");
        return;
    };
    let Some(before) = kernel_side_possible() else {
        return;
    };
    let dir = tmpdir();
    let json = dir.path().join("k.json");
    let plot = dir.path().join("k.svg");
    let (js, ps) = (json.display().to_string(), plot.display().to_string());
    let mut child = zmem_cmd(&[
        "bench",
        "region",
        "--kernel-zram",
        "--size",
        "32M",
        "--resident",
        "16M",
        "--accesses",
        "1000",
        "--corpus",
        &c,
        "--json",
        &js,
        "--plot",
        &ps,
        "--worker-fail",
        "hang",
    ])
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // The worker hangs after its fill: wait until its cgroup has it and a limit.
    let cg = PathBuf::from(format!("{MEMCG}/zmem-bench-{}", child.id()));
    let t0 = Instant::now();
    let mut ready = false;
    while t0.elapsed() < Duration::from_secs(30) {
        let procs = std::fs::read_to_string(cg.join("cgroup.procs")).unwrap_or_default();
        let limit = std::fs::read_to_string(cg.join("memory.limit_in_bytes")).unwrap_or_default();
        let limited = limit.trim().parse::<u64>().is_ok_and(|l| l < 1 << 40);
        if !procs.trim().is_empty() && limited {
            ready = true;
            break;
        }
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    if !ready {
        let out = child.wait_with_output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if stderr.contains("in use") {
            eprintln!("skipped: {stderr}");
            return;
        }
        panic!("the worker never started: {stderr}");
    }
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: kill with our own child's pid.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) };
    let t0 = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if t0.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("zmem did not stop after SIGINT");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.trim_end().ends_with("zmem: error: interrupted"),
        "{stderr}"
    );
    assert_eq!(machine_state(), before, "machine not restored; {stderr}");
}
