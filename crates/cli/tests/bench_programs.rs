//! `zmem bench programs`: bad flags (one-line errors, exit 2), the help, a small real run of sort
//! and sqlite3 plain and under zmem (outputs identical, pages evicted), and as root with zram0
//! free one kernel-side run after which zram0, swap and the memory cgroups are as they were.
//! Inputs are shrunk with the hidden --scale so that the whole file runs in seconds.

mod support;

use support::{
    fails_with, heavy, installed, is_root, kernel, machine_state, read_json, ready, tmpdir, zmem,
    zmem_cmd, Skip,
};

#[test]
fn bad_flags_are_one_line_and_exit_2() {
    fails_with(
        &["bench", "programs", "--repeat", "0"],
        "--repeat must be at least 1",
    );
    fails_with(
        &["bench", "programs", "--programs", "emacs"],
        "invalid value 'emacs'",
    );
    fails_with(&["bench", "programs", "--resident", "lots"], "lots");
    fails_with(
        &["bench", "programs", "--resident", "16M,4k"],
        "--resident 4k is below the smallest budget",
    );
    fails_with(
        &["bench", "programs", "--command", "no equals sign"],
        "expected NAME=COMMAND",
    );
    fails_with(
        &["bench", "programs", "--command", "a b=true"],
        "the NAME of NAME=COMMAND must be",
    );
    fails_with(&["bench", "programs", "--command", "x= "], "has no command");
    fails_with(
        &["bench", "programs", "--command", "sort=sort -r f"],
        "sort is a built-in program's name",
    );
    fails_with(
        &[
            "bench",
            "programs",
            "--command",
            "a=true",
            "--command",
            "a=false",
        ],
        "--command a=... is given twice",
    );
    fails_with(&["bench", "programs", "--scale", "0"], "--scale");
    fails_with(&["bench", "programs", "--timeout", "0"], "--timeout");
}

#[test]
fn help_lists_the_flags() {
    let out = zmem(&["bench", "programs", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let s = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--resident",
        "--repeat",
        "--programs",
        "--no-kernel",
        "--json",
        "--plot",
        "--zram-alg",
        "--timeout",
        "--command",
        "sqlite",
        "python",
        "pylist",
    ] {
        assert!(s.contains(opt), "help lacks {opt}: {s}");
    }
    assert!(!s.contains("--scale"), "{s}");
    let s = String::from_utf8_lossy(&zmem(&["bench", "--help"]).stdout).into_owned();
    assert!(s.contains("programs"), "{s}");
}

/// The runs of `side` ("plain", "zmem", "kernel") of the program `name` in the JSON.
fn runs<'a>(doc: &'a serde_json::Value, name: &str, side: &str) -> Vec<&'a serde_json::Value> {
    let p = doc["programs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["program"] == name)
        .unwrap_or_else(|| panic!("no {name} in {doc}"));
    p["runs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["side"] == side)
        .collect()
}

#[test]
fn sort_and_sqlite_under_zmem_match_the_plain_run() {
    if installed("sort").is_none() || installed("sqlite3").is_none() {
        eprintln!("skipped: sort or sqlite3 is not installed (coreutils, sqlite3)");
        return;
    }
    if !ready(Skip::PermissionOnly) {
        return;
    }
    let _g = heavy();
    let dir = tmpdir();
    let json = dir.path().join("p.json");
    let svg = dir.path().join("p.svg");
    let out = zmem_cmd(&[
        "bench",
        "programs",
        "--programs",
        "sort,sqlite",
        "--resident",
        "6M",
        "--repeat",
        "1",
        "--no-kernel",
        "--scale",
        "0.12",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        svg.to_str().unwrap(),
    ])
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("zmem s") && !stdout.contains("majflt kernel"),
        "{stdout}"
    );
    assert!(stdout.contains("--no-kernel"), "{stdout}");
    let doc = read_json(&json);
    assert_eq!(doc["kernel"], serde_json::Value::Null);
    assert!(doc["errors"].as_array().unwrap().is_empty(), "{doc}");
    for name in ["sort", "sqlite"] {
        let plain = runs(&doc, name, "plain");
        assert_eq!(plain.len(), 1, "{name}");
        assert!(plain[0]["output_bytes"].as_u64().unwrap() > 100, "{name}");
        let z = runs(&doc, name, "zmem");
        assert_eq!(z.len(), 1, "{name}");
        let z = z[0];
        assert_eq!(z["outcome"], "ok", "{name}: {z}");
        assert_eq!(z["output_matched"], true, "{name}: {z}");
        assert_eq!(z["output_bytes"], plain[0]["output_bytes"], "{name}");
        assert_eq!(z["resident"], 6 << 20);
        assert!(
            z["zmem"]["evictions"].as_u64().unwrap() > 0,
            "{name}: nothing evicted at 6M: {z}"
        );
        assert!(z["major_faults"].as_u64().unwrap() > 0, "{name}: {z}");
        assert!(z["wall_s"].as_f64().unwrap() > 0.0);
    }
    let summary = doc["summary"].as_array().unwrap();
    assert_eq!(summary.len(), 2);
    assert!(summary
        .iter()
        .all(|s| s["zmem_over_plain"].as_f64().is_some()));
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(
        svg.contains("sort 6M") && svg.contains("sqlite 6M"),
        "{svg}"
    );
}

#[test]
fn kernel_side_restores_zram_swap_and_cgroups() {
    if !is_root() {
        eprintln!("skipped: the kernel side needs root");
        return;
    }
    if installed("sort").is_none() {
        eprintln!("skipped: sort is not installed (coreutils)");
        return;
    }
    if !ready(Skip::PermissionOnly) {
        return;
    }
    let _k = kernel();
    let _g = heavy();
    let before = machine_state();
    if before.zram0_disksize != "0" || !std::path::Path::new(support::MEMCG).exists() {
        eprintln!("skipped: /dev/zram0 is in use or there is no cgroup v1 memory controller");
        return;
    }
    let dir = tmpdir();
    let json = dir.path().join("k.json");
    let out = zmem_cmd(&[
        "bench",
        "programs",
        "--programs",
        "sort",
        "--resident",
        "8M",
        "--repeat",
        "1",
        "--scale",
        "0.2",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        dir.path().join("k.svg").to_str().unwrap(),
    ])
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert_eq!(machine_state(), before, "{stderr}");
    assert!(stderr.contains("restored /dev/zram0"), "{stderr}");
    assert!(stdout.contains("kernel s"), "{stdout}");
    let doc = read_json(&json);
    assert_eq!(doc["kernel"]["algorithm"], "lz4");
    assert_eq!(doc["restored"]["zram_disksize"], 0);
    assert_eq!(doc["restored"]["cgroup_removed"], true);
    assert_eq!(doc["restored"]["swaps_as_before"], true);
    let k = runs(&doc, "sort", "kernel");
    assert_eq!(k.len(), 1);
    let k = k[0];
    // The OOM killer may end a run at a limit this small: a result, not an error.
    assert!(k["outcome"] == "ok" || k["outcome"] == "oom-killed", "{k}");
    if k["outcome"] == "ok" {
        assert_eq!(k["output_matched"], true, "{k}");
        assert!(
            k["major_faults"].as_u64().unwrap() > 0,
            "swapped nothing: {k}"
        );
        assert!(
            k["kernel"]["zram_mem_used_max"].as_u64().unwrap() > 0,
            "{k}"
        );
    }
    assert_eq!(k["kernel"]["limit"], 8 << 20);
}

/// `--command NAME=COMMAND`: a shell line of the user's runs the same ways as a built-in
/// program, from the current directory; its output is compared (a line whose output changes
/// from run to run is an error naming it) and its processes' evictions are summed (the shell's
/// and its commands').
#[test]
fn a_command_of_the_users_runs_beside_the_programs() {
    if installed("sort").is_none() || installed("seq").is_none() {
        eprintln!("skipped: sort or seq is not installed (coreutils)");
        return;
    }
    if !ready(Skip::PermissionOnly) {
        return;
    }
    let _g = heavy();
    let dir = tmpdir();
    std::fs::write(dir.path().join("words"), "pear\napple\nfig\n").unwrap();
    let json = dir.path().join("c.json");
    let out = zmem_cmd(&[
        "bench",
        "programs",
        "--command",
        "revsort=seq 1 300000 | sort -r | md5sum; sort words",
        "--command",
        "noisy=head -c 16 /dev/urandom | od -x",
        "--resident",
        "6M",
        "--repeat",
        "1",
        "--no-kernel",
        "--json",
        json.to_str().unwrap(),
        "--plot",
        dir.path().join("c.svg").to_str().unwrap(),
    ])
    .current_dir(dir.path())
    .output()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "the noisy line must fail the bench: {stdout}\n{stderr}"
    );
    let doc = read_json(&json);
    let errors = doc["errors"].as_array().unwrap();
    assert!(
        errors.len() == 1 && errors[0].as_str().unwrap().contains("noisy"),
        "{doc}"
    );
    let plain = runs(&doc, "revsort", "plain");
    assert_eq!(plain.len(), 1);
    let z = runs(&doc, "revsort", "zmem")[0];
    assert_eq!(z["outcome"], "ok", "{z}");
    assert_eq!(z["output_matched"], true, "{z}");
    assert_eq!(z["output_bytes"], plain[0]["output_bytes"]);
    // The shell and the big sort reported (seq, md5sum and the small sort stay below the start
    // point, a quarter of 6M: no zmem in them); sort's buffer did not fit in 6M.
    assert!(z["zmem"]["processes"].as_u64().unwrap() >= 2, "{z}");
    assert!(z["zmem"]["evictions"].as_u64().unwrap() > 0, "{z}");
    let p = doc["programs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["program"] == "revsort")
        .unwrap();
    assert_eq!(p["package"], serde_json::Value::Null, "{p}");
    assert_eq!(p["command"][0], "/bin/sh", "{p}");
    assert!(stdout.contains("revsort"), "{stdout}");
}
