//! `zmem bench ssd` and its worker: the worker's workloads verify their data and report one JSON
//! line (small arrays, no root); bad parameters are one-line errors (exit 2); the driver refuses
//! to run without root and changes nothing; as root, the kernel side of a small run (a swap
//! file, a memory cgroup) runs and leaves /proc/swaps, the benchmark cgroups and the directory as
//! they were, also when a worker is killed on a timeout or the driver is interrupted; the zmem
//! side runs once `zmem run` has the SSD tier's flags (else the test says why it skipped).
//! Behaviour is asserted, never timings.

mod support;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use support::{
    fails_with, heavy, is_root, kernel, machine_state, read_json, ready, tmpdir, zmem, zmem_cmd,
    Skip,
};

/// The worker's JSON line.
fn worker(args: &[&str]) -> serde_json::Value {
    let mut v = vec!["bench", "ssd-worker"];
    v.extend_from_slice(args);
    let out = zmem(&v);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{v:?}: {stdout}\n{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 1, "not one line: {stdout}");
    serde_json::from_str(lines[0]).unwrap_or_else(|e| panic!("{e}: {stdout}"))
}

fn u(v: &serde_json::Value) -> u64 {
    v.as_u64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// The names of a worker report's phases.
fn phases(r: &serde_json::Value) -> Vec<&str> {
    r["phases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect()
}

#[test]
fn the_object_worker_verifies_every_read_and_reports_json() {
    for (size, mix) in [("256", "80:20"), ("1k", "ro"), ("4k", "wo")] {
        let r = worker(&[
            "--array",
            "8M",
            "--object-size",
            size,
            "--mix",
            mix,
            "--ops",
            "20000",
            "--label",
            "t",
        ]);
        assert_eq!(r["label"], "t");
        assert_eq!(r["workload"], "objects");
        assert_eq!(r["mix"], mix);
        let object = u(&r["object_size"]);
        assert_eq!(u(&r["objects"]) * object, 8 << 20);
        assert_eq!(u(&r["version_table_bytes"]), u(&r["objects"]));
        assert_eq!(u(&r["ops"]), 20000);
        assert_eq!(u(&r["reads"]) + u(&r["writes"]), 20000);
        match mix {
            "ro" => assert_eq!(u(&r["writes"]), 0),
            "wo" => assert_eq!(u(&r["reads"]), 0),
            _ => {
                // 80:20 of 20000 draws: far from either end.
                let reads = u(&r["reads"]);
                assert!((15000..17000).contains(&reads), "{reads}");
            }
        }
        assert_eq!(u(&r["latency"]["count"]), 20000);
        let v = &r["verify"];
        assert_eq!(u(&v["failures"]), 0, "{r}");
        assert_eq!(u(&v["checked"]), u(&r["reads"]));
        assert!(r["fill_s"].as_f64().unwrap() > 0.0);
        let phases = phases(&r);
        match mix {
            "ro" => assert_eq!(phases, ["read"]),
            "wo" => assert_eq!(phases, ["write"]),
            _ => assert_eq!(phases, ["read", "write"]),
        }
        assert!(r["cgroup"].is_null());
    }
}

#[test]
fn the_bloom_worker_finds_every_present_key_and_a_plausible_false_positive_rate() {
    let r = worker(&["--workload", "bloom", "--array", "8M", "--ops", "3000"]);
    assert_eq!(r["workload"], "bloom");
    assert_eq!(u(&r["ops"]), 9000);
    let v = &r["verify"];
    assert_eq!(u(&v["failures"]), 0, "{r}");
    assert_eq!(u(&v["present_misses"]), 0);
    assert_eq!(u(&v["bits_lost"]), 0);
    assert_eq!(v["false_positive_rate_plausible"], true);
    let p = v["expected_false_positive_rate"].as_f64().unwrap();
    assert!(
        (0.0039..0.0041).contains(&p),
        "half the bits set, 8 hashes: {p}"
    );
    assert_eq!(phases(&r), ["insert", "query-present", "query-absent"]);
}

#[test]
fn bad_worker_parameters_are_one_line_errors() {
    let w = |a: &[&str], needle: &str| {
        let mut v = vec!["bench", "ssd-worker"];
        v.extend_from_slice(a);
        fails_with(&v, needle);
    };
    w(
        &["--array", "8M", "--object-size", "100"],
        "--object-size 100 is not a multiple of 64",
    );
    w(
        &["--array", "8M", "--object-size", "0"],
        "--object-size 0 is not a multiple of 64",
    );
    w(
        &["--array", "100", "--object-size", "256"],
        "--array 100 is smaller than one object",
    );
    w(&["--array", "8M", "--mix", "90:x"], "is not a mix");
    w(&["--array", "8M", "--mix", "0:0"], "is not a mix");
    w(&["--array", "8M", "--ops", "0"], "--ops must be at least 1");
    w(
        &["--workload", "bloom", "--array", "1k"],
        "too small for a bloom filter",
    );
    w(&["--array", "lots"], "lots");
}

#[test]
fn bad_driver_flags_are_one_line_errors() {
    let d = |a: &[&str], needle: &str| {
        let mut v = vec!["bench", "ssd"];
        v.extend_from_slice(a);
        fails_with(&v, needle);
    };
    d(&["--array", "32M"], "not larger than --dram 64M");
    d(&["--object-size", "256,100"], "--object-size 100");
    d(&["--mix", "ro,x"], "is not a mix");
    d(&["--resident", "64M"], "--resident 64M must leave");
    d(&["--repeat", "0"], "--repeat must be at least 1");
    d(&["--sides", "disk"], "invalid value 'disk'");
    d(&["--disk-size", "1G"], "--disk-size 1G cannot hold");
    d(&["--timeout", "0"], "--timeout");
}

#[test]
fn help_lists_the_flags_and_hides_the_worker() {
    let out = zmem(&["bench", "ssd", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let s = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--workloads",
        "--object-size",
        "--mix",
        "--array",
        "--dram",
        "--resident",
        "--dir",
        "--disk-size",
        "--encrypt-cost",
        "--sides",
        "--quick",
        "--out",
    ] {
        assert!(s.contains(opt), "help lacks {opt}: {s}");
    }
    let s = String::from_utf8_lossy(&zmem(&["bench", "--help"]).stdout).into_owned();
    assert!(s.contains("ssd"), "{s}");
    assert!(!s.contains("ssd-worker"), "{s}");
}

/// The path of setpriv (util-linux), to run the driver as another user.
fn setpriv() -> Option<std::path::PathBuf> {
    ["/usr/bin/setpriv", "/bin/setpriv"]
        .iter()
        .map(std::path::PathBuf::from)
        .find(|p| p.is_file())
}

#[test]
fn without_root_the_driver_says_why_and_changes_nothing() {
    let dir = tmpdir();
    let out_prefix = dir.path().join("ssd");
    let mut cmd = if is_root() {
        let Some(sp) = setpriv() else {
            eprintln!("skipped: running as root and setpriv (util-linux) is not installed");
            return;
        };
        let mut c = std::process::Command::new(sp);
        c.args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            support::zmem_exe().to_str().unwrap(),
        ]);
        c
    } else {
        std::process::Command::new(support::zmem_exe())
    };
    // The other root tests change the machine meanwhile: not while this one compares.
    let _k = kernel();
    let before = machine_state();
    let out = cmd
        .args([
            "bench",
            "ssd",
            "--quick",
            "--dir",
            "/var/tmp",
            "--out",
            out_prefix.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if is_root() && stderr.contains("Permission denied") && !stderr.contains("needs root") {
        eprintln!(
            "skipped: nobody cannot run {}",
            support::zmem_exe().display()
        );
        return;
    }
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("needs root") && stderr.contains("nothing was changed"),
        "{stderr}"
    );
    assert!(!out_prefix.with_extension("json").exists());
    assert_eq!(machine_state(), before);
}

/// Whether the kernel side can run here (root, cgroup v1); prints why not.
fn kernel_side_possible() -> bool {
    if !is_root() {
        eprintln!("skipped: the kernel side needs root");
        return false;
    }
    if !Path::new(support::MEMCG).join("cgroup.procs").exists() {
        eprintln!(
            "skipped: no cgroup v1 memory controller at {}",
            support::MEMCG
        );
        return false;
    }
    true
}

/// A small run: the quick preset, shrunk further.
const SMALL: &[&str] = &[
    "--quick",
    "--array",
    "128M",
    "--dram",
    "32M",
    "--ops",
    "3000",
    "--bloom-keys",
    "500",
];

/// A kernel-side run that does not end by itself.
const ENDLESS: &[&str] = &[
    "--sides",
    "kernel",
    "--workloads",
    "objects",
    "--object-size",
    "4k",
    "--mix",
    "ro",
    "--array",
    "256M",
    "--dram",
    "16M",
    "--ops",
    "100000000",
];

/// A root test's setting: the kernel side to itself, the machine's state before, a directory on
/// a disk file system (the test target's, where swap files work) and one for the outputs.
struct Scene {
    _kernel: std::sync::MutexGuard<'static, ()>,
    _heavy: std::sync::MutexGuard<'static, ()>,
    before: support::MachineState,
    disk: tempfile::TempDir,
    out: tempfile::TempDir,
}

impl Scene {
    /// None (and why, printed) where the kernel side cannot run.
    fn new() -> Option<Scene> {
        if !kernel_side_possible() {
            return None;
        }
        let _kernel = kernel();
        let _heavy = heavy();
        Some(Scene {
            _kernel,
            _heavy,
            before: machine_state(),
            disk: tmpdir(),
            out: tmpdir(),
        })
    }

    /// OUT without extension.
    fn prefix(&self) -> std::path::PathBuf {
        self.out.path().join("ssd")
    }

    /// `zmem bench ssd --dir DISK --out PREFIX` and `extra`.
    fn args(&self, extra: &[&[&str]]) -> Vec<String> {
        let mut v: Vec<String> = ["bench", "ssd", "--dir"].map(String::from).to_vec();
        v.push(self.disk.path().display().to_string());
        v.push("--out".into());
        v.push(self.prefix().display().to_string());
        v.extend(extra.iter().flat_map(|a| a.iter().map(|s| s.to_string())));
        v
    }

    fn run(&self, extra: &[&[&str]]) -> std::process::Output {
        let args = self.args(extra);
        zmem(&args.iter().map(String::as_str).collect::<Vec<_>>())
    }

    /// Swap, the benchmark cgroups and zram0 as before; no swap file or log directory left.
    fn assert_restored(&self, stderr: &str) {
        assert_eq!(machine_state(), self.before, "{stderr}");
        let left: Vec<String> = std::fs::read_dir(self.disk.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        assert!(left.is_empty(), "left in the directory: {left:?}\n{stderr}");
    }

    fn json(&self) -> serde_json::Value {
        read_json(&self.prefix().with_extension("json"))
    }

    /// A [`SMALL`] run of `side` (and `extra` flags) that succeeds, leaves the machine as found,
    /// and runs `runs` workloads, each verified: (the JSON, stdout, stderr).
    fn small_run(
        &self,
        side: &str,
        extra: &[&str],
        runs: usize,
    ) -> (serde_json::Value, String, String) {
        let run = self.run(&[SMALL, &["--sides", side], extra]);
        let stdout = String::from_utf8_lossy(&run.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&run.stderr).into_owned();
        assert!(run.status.success(), "{stdout}\n{stderr}");
        self.assert_restored(&stderr);
        let doc = self.json();
        let list = doc["runs"].as_array().unwrap();
        assert_eq!(list.len(), runs, "{doc}");
        for r in list {
            assert_eq!(r["outcome"], "ok", "{r}");
            assert_eq!(r["verified"], true, "{r}");
            assert_eq!(u(&r["report"]["verify"]["failures"]), 0);
        }
        (doc, stdout, stderr)
    }
}

#[test]
fn the_quick_kernel_side_runs_and_restores_swap_and_cgroups() {
    let Some(sc) = Scene::new() else {
        return;
    };
    // --quick: 256 B and 4 KiB objects at 80:20, and the bloom filter.
    let (doc, stdout, stderr) = sc.small_run("kernel", &[], 3);
    assert!(
        stderr.contains("swapon ") && stderr.contains("removed swap file"),
        "{stderr}"
    );
    assert!(stdout.contains("kernel-swap mean"), "{stdout}");
    assert_eq!(doc["restored"]["swaps_as_before"], true);
    assert_eq!(doc["restored"]["cgroups_as_before"], true);
    assert_eq!(doc["restored"]["swap_file_removed"], true);
    assert!(doc["machine"]["nproc"].as_u64().unwrap() >= 1);
    assert_eq!(doc["setup"]["dram"], 32 << 20);
    for r in doc["runs"].as_array().unwrap() {
        assert_eq!(r["side"], "kernel-swap");
        let k = &r["kernel"];
        assert!(u(&k["pswpout"]) > 0, "nothing swapped: {r}");
        assert_eq!(k["swap_file_removed"], true);
        assert_eq!(k["swaps_as_before"], true);
        let cg = &r["report"]["cgroup"];
        assert_eq!(u(&cg["dram"]), 32 << 20);
        assert_eq!(
            u(&cg["limit_bytes"]),
            u(&cg["dram"]) + u(&cg["baseline_bytes"])
        );
        assert!(
            u(&r["cgroup_max_usage_bytes"]) <= u(&cg["limit_bytes"]),
            "{r}"
        );
    }
    let summary = doc["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 3);
    for s in summary {
        assert!(s["sides"][0]["mean_us"].as_f64().unwrap() > 0.0, "{s}");
        assert_eq!(s["sides"][0]["verified"], true);
    }
    let txt = std::fs::read_to_string(sc.prefix().with_extension("txt")).unwrap();
    assert!(txt.starts_with("$ ") && txt.contains("bloom"), "{txt}");
    let svg = std::fs::read_to_string(sc.prefix().with_extension("svg")).unwrap();
    assert!(
        svg.contains("kernel-swap") && svg.contains("objects 256B 80:20"),
        "{svg}"
    );
}

#[test]
fn a_worker_killed_on_timeout_still_leaves_the_machine_as_found() {
    let Some(sc) = Scene::new() else {
        return;
    };
    let run = sc.run(&[ENDLESS, &["--timeout", "3"]]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("timed out"), "{stderr}");
    sc.assert_restored(&stderr);
    let doc = sc.json();
    let r = &doc["runs"][0];
    assert_eq!(r["outcome"], "timeout", "{r}");
    assert_eq!(r["verified"], false);
    assert_eq!(r["kernel"]["swap_file_removed"], true);
    assert_eq!(doc["restored"]["swaps_as_before"], true);
}

#[test]
fn an_interrupted_driver_stops_its_worker_and_restores_the_machine() {
    let Some(sc) = Scene::new() else {
        return;
    };
    let args = sc.args(&[ENDLESS]);
    let mut child = zmem_cmd(&args.iter().map(String::as_str).collect::<Vec<_>>())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until its swap file is swap and its worker runs, then interrupt it.
    let swapfile = sc
        .disk
        .path()
        .join(format!("zmem-bench-swap-{}", child.id()));
    let t0 = Instant::now();
    while !std::fs::read_to_string("/proc/swaps")
        .unwrap()
        .contains(swapfile.to_str().unwrap())
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60) && child.try_wait().unwrap().is_none(),
            "the swap file never became swap"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: kill(2) on the pid of our child, not yet reaped.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("interrupted"), "{stderr}");
    assert!(stderr.contains("removed swap file"), "{stderr}");
    sc.assert_restored(&stderr);
    // Nothing measured: no outputs written over older ones.
    assert!(!sc.prefix().with_extension("json").exists());
}

/// Whether `zmem run` has the SSD tier's flags and can run programs here; prints why not.
fn zmem_side_possible() -> bool {
    let help = String::from_utf8_lossy(&zmem(&["run", "--help"]).stdout).into_owned();
    if !help.contains("--ssd ") || !help.contains("--ssd-size") {
        eprintln!("skipped: `zmem run` has no --ssd/--ssd-size yet (the SSD tier's flags)");
        return false;
    }
    ready(Skip::PermissionOnly)
}

#[test]
fn the_zmem_side_runs_the_objects_on_the_ssd_tier_encrypted_and_not() {
    if !zmem_side_possible() {
        return;
    }
    let Some(sc) = Scene::new() else {
        return;
    };
    let (doc, stdout, _) = sc.small_run("zmem", &["--workloads", "objects", "--encrypt-cost"], 4);
    assert!(stdout.contains("enc cost"), "{stdout}");
    for r in doc["runs"].as_array().unwrap() {
        let encrypt = r["side"] == "zmem";
        assert!(encrypt || r["side"] == "zmem-noenc", "{r}");
        let z = &r["zmem"];
        assert_eq!(u(&z["resident"]) + u(&z["store_limit"]), 32 << 20);
        assert_eq!(z["encrypt"], encrypt);
        assert_eq!(z["ssd"]["encrypted"], encrypt, "{r}");
        assert!(z["log_dir_leftovers"].as_array().unwrap().is_empty());
        assert!(z["ssd"].is_object(), "no ssd statistics: {r}");
        assert!(u(&z["ssd"]["device_bytes_written"]) > 0, "{r}");
    }
}

#[test]
fn a_zmem_run_that_keeps_its_pages_in_dram_is_no_result() {
    if !zmem_side_possible() {
        return;
    }
    let Some(sc) = Scene::new() else {
        return;
    };
    // A bloom filter's bits do not compress: zmem either writes them to the log (a result) or
    // keeps them in DRAM beyond --dram, which the bench must refuse to count.
    let run = sc.run(&[SMALL, &["--sides", "zmem", "--workloads", "bloom"]]);
    let stderr = String::from_utf8_lossy(&run.stderr);
    sc.assert_restored(&stderr);
    let doc = sc.json();
    let r = &doc["runs"][0];
    assert_eq!(u(&r["report"]["verify"]["failures"]), 0, "{r}");
    if run.status.success() {
        assert_eq!(r["verified"], true, "{r}");
        assert!(u(&r["zmem"]["ssd"]["device_bytes_written"]) > 0, "{r}");
    } else {
        assert_eq!(r["verified"], false, "{r}");
        let problems = r["problems"].to_string();
        assert!(problems.contains("the run measured DRAM"), "{r}");
        assert!(stderr.contains("the run measured DRAM"), "{stderr}");
        assert_eq!(doc["summary"][0]["sides"][0]["verified"], false);
    }
}
