//! `zmem bench heaps`: bad flags (one-line errors, exit 2), the help, and a small real run on
//! redis's and Python's heaps (captured, written to zmem, every page read back; `auto` settled
//! better than written), whose second run reuses the captures. Data shrunk with --scale.

mod support;

use support::{fails_with, heavy, installed, read_json, tmpdir, zmem, zmem_cmd};

#[test]
fn bad_flags_are_one_line_and_exit_2() {
    fails_with(
        &["bench", "heaps", "--scale", "0"],
        "--scale 0 is out of range",
    );
    fails_with(
        &["bench", "heaps", "--programs", "emacs"],
        "invalid value 'emacs'",
    );
    fails_with(
        &["bench", "heaps", "--policies", "fastest"],
        "invalid value 'fastest'",
    );
    let dir = tmpdir();
    fails_with(
        &["bench", "heaps", "--data", dir.path().to_str().unwrap()],
        "lacks dickens",
    );
}

#[test]
fn help_lists_the_flags() {
    let out = zmem(&["bench", "heaps", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let s = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--programs",
        "--dir",
        "--recapture",
        "--data",
        "--scale",
        "--policies",
        "--no-kernel",
        "--json",
        "--svg",
        "java",
    ] {
        assert!(s.contains(opt), "help lacks {opt}: {s}");
    }
    let s = String::from_utf8_lossy(&zmem(&["bench", "--help"]).stdout).into_owned();
    assert!(s.contains("heaps"), "{s}");
}

#[test]
fn redis_and_python_heaps_are_captured_measured_and_reused() {
    let data = zmem_bench::heaps::default_data();
    if !data.join("dickens").exists() {
        eprintln!("skipped: the Silesia corpus is not at {}", data.display());
        return;
    }
    if installed("redis-server").is_none() || installed("python3").is_none() {
        eprintln!("skipped: redis-server or python3 is not installed");
        return;
    }
    let _g = heavy();
    let dir = tmpdir();
    let captures = dir.path().join("captures");
    let json = dir.path().join("h.json");
    let run = || {
        let out = zmem_cmd(&[
            "bench",
            "heaps",
            "--programs",
            "redis,python",
            "--scale",
            "0.05",
            "--no-kernel",
            "--policies",
            "fast,auto",
            "--dir",
            captures.to_str().unwrap(),
            "--json",
            json.to_str().unwrap(),
            "--svg",
            dir.path().join("h.svg").to_str().unwrap(),
        ])
        .output()
        .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{stdout}\n{stderr}");
        (stdout, stderr)
    };
    let (stdout, stderr) = run();
    assert!(stderr.contains("redis: captured"), "{stderr}");
    assert!(stderr.contains("python: captured"), "{stderr}");
    assert!(stdout.contains("zmem-auto settled"), "{stdout}");
    assert!(stdout.contains("auto settled / bare zstd-1"), "{stdout}");
    let doc = read_json(&json);
    let results = doc["results"].as_array().unwrap();
    assert_eq!(results.len(), 2);
    for r in results {
        let name = r["program"].as_str().unwrap();
        let pages = r["capture"]["stats"]["kept_pages"].as_u64().unwrap();
        // The loaded data alone is several MiB even at this scale.
        assert!(pages > 1000, "{name}: {pages} pages");
        assert_eq!(r["bytes"].as_u64().unwrap(), pages * 4096, "{name}");
        let file = captures.join(name).join("heap.pages");
        assert_eq!(std::fs::metadata(&file).unwrap().len(), pages * 4096);
        let ratio = |label: &str| {
            r["columns"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["label"] == label)
                .unwrap_or_else(|| panic!("{name}: no {label} column"))["ratio"]
                .as_f64()
                .unwrap()
        };
        for label in ["lz4", "zstd-1", "zmem-fast", "zmem-auto"] {
            assert!(ratio(label) > 1.2, "{name} {label}: {}", ratio(label));
        }
        // Settled (zstd-1 blocks) holds the same data in fewer compressed bytes and less
        // DRAM than written (lz4). (By DRAM the gain is small at this scale: a pool of a few
        // MiB is mostly part-used spans.)
        let auto = r["columns"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["label"] == "zmem-auto")
            .unwrap()["run"]
            .clone();
        let settled = &auto["settled"];
        assert!(
            settled["ratio_compr"].as_f64().unwrap() > auto["ratio_compr"].as_f64().unwrap() * 1.2,
            "{name}: {auto}"
        );
        assert!(
            settled["memory"]["mem_used_total"].as_u64().unwrap()
                < auto["memory"]["mem_used_total"].as_u64().unwrap(),
            "{name}: {auto}"
        );
        assert!(ratio("zmem-auto settled") > ratio("zmem-auto"), "{name}");
        // Every page was read back and compared.
        for c in r["columns"].as_array().unwrap() {
            if let Some(run) = c["run"].as_object() {
                assert!(
                    run["verified_bytes"].as_u64().unwrap() >= pages * 4096,
                    "{name} {}: {run:?}",
                    c["label"]
                );
            }
        }
    }
    // A second run measures the same captures again.
    let (_, stderr) = run();
    assert!(
        stderr.contains("redis: the capture in") && !stderr.contains("captured"),
        "{stderr}"
    );
}

#[test]
fn a_program_that_fails_to_load_is_skipped_and_the_others_are_measured() {
    let data = zmem_bench::heaps::default_data();
    if !data.join("dickens").exists()
        || installed("redis-server").is_none()
        || installed("python3").is_none()
    {
        eprintln!("skipped: needs the Silesia corpus, redis-server and python3");
        return;
    }
    let _g = heavy();
    let dir = tmpdir();
    // Python's workload opens `xml` as a tar of documents: this one is not.
    let bad = dir.path().join("data");
    std::fs::create_dir(&bad).unwrap();
    std::fs::copy(data.join("dickens"), bad.join("dickens")).unwrap();
    let samba = std::fs::read(data.join("samba")).unwrap();
    std::fs::write(bad.join("samba"), &samba[..200_000]).unwrap();
    std::fs::write(bad.join("xml"), "not a tar").unwrap();
    let run = |programs: &str| {
        zmem_cmd(&[
            "bench",
            "heaps",
            "--programs",
            programs,
            "--data",
            bad.to_str().unwrap(),
            "--scale",
            "0.02",
            "--no-kernel",
            "--policies",
            "fast",
            "--dir",
            dir.path().join("captures").to_str().unwrap(),
            "--json",
            dir.path().join("h.json").to_str().unwrap(),
            "--svg",
            dir.path().join("h.svg").to_str().unwrap(),
        ])
        .output()
        .unwrap()
    };
    let out = run("python,redis");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(
        stdout.contains("python: skipped (capturing its heap failed")
            && stdout.contains("ended before it was ready"),
        "{stdout}"
    );
    assert!(stdout.lines().any(|l| l.starts_with("redis ")), "{stdout}");
    let doc = read_json(&dir.path().join("h.json"));
    assert_eq!(doc["results"].as_array().unwrap().len(), 1);
    assert_eq!(doc["skipped"][0][0], "python");
    // Nothing measured at all: one line, exit 2.
    let out = run("python");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    assert!(
        last.starts_with("zmem: error: no heap was measured (python: "),
        "{stderr}"
    );
}
