//! The built binary on bad input: non-zero exit, one line `zmem: error: ...` on stderr.

mod support;

use support::{corpus_args, fails_with, tmpdir, zmem};

#[test]
fn unknown_rw() {
    fails_with(
        &["bench", "pages", "--target", "zmem", "--rw", "sideways"],
        "sideways",
    );
}

#[test]
fn bs_not_multiple_of_4096() {
    fails_with(
        &["bench", "pages", "--target", "zmem", "--bs", "5000"],
        "multiple of 4096",
    );
}

#[test]
fn invalid_size_and_jobs_and_geometry() {
    fails_with(
        &["bench", "pages", "--target", "zmem", "--size", "12q"],
        "12q",
    );
    fails_with(
        &["bench", "pages", "--target", "zmem", "--jobs", "0"],
        "jobs",
    );
    fails_with(
        &[
            "bench", "pages", "--target", "zmem", "--bs", "64k", "--size", "32k",
        ],
        "larger than size",
    );
    fails_with(
        &[
            "bench", "pages", "--target", "zmem", "--jobs", "2", "--size", "12k",
        ],
        "multiple of bs*jobs",
    );
    fails_with(
        &["bench", "pages", "--target", "zmem", "--policy", "nope"],
        "nope",
    );
}

#[test]
fn missing_corpus() {
    fails_with(
        &[
            "bench",
            "pages",
            "--target",
            "zmem",
            "--corpus",
            "/nonexistent/corpus",
        ],
        "/nonexistent/corpus",
    );
}

#[test]
fn block_device_that_does_not_exist() {
    let mut args = vec![
        "bench",
        "pages",
        "--target",
        "/dev/zmem-test-missing",
        "--size",
        "1M",
    ];
    let c = corpus_args();
    if std::path::Path::new(&c[1]).exists() {
        args.extend(c.iter().map(String::as_str));
        fails_with(&args, "/dev/zmem-test-missing");
    }
}

#[test]
fn help_is_not_an_error() {
    let out = zmem(&["bench", "pages", "--help"]);
    assert_eq!(out.status.code(), Some(0));
    let s = String::from_utf8_lossy(&out.stdout);
    for opt in [
        "--target",
        "--rw",
        "--bs",
        "--jobs",
        "--size",
        "--corpus",
        "--no-verify",
        "--zram-alg",
    ] {
        assert!(s.contains(opt), "help lacks {opt}");
    }
}

#[test]
fn pages_on_a_regular_file_writes_json() {
    let c = corpus_args();
    if !std::path::Path::new(&c[1]).exists() {
        eprintln!("skipped: no corpus");
        return;
    }
    let dir = tmpdir();
    let img = dir.path().join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(4 << 20)
        .unwrap();
    let json = dir.path().join("out/r.json");
    let img_s = img.display().to_string();
    let json_s = json.display().to_string();
    let mut args = vec![
        "bench", "pages", "--target", &img_s, "--rw", "randread", "--bs", "8k", "--jobs", "2",
        "--size", "4M", "--json", &json_s,
    ];
    args.extend(c.iter().map(String::as_str));
    let out = zmem(&args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("O_DIRECT") && stderr.contains("refuses") {
        eprintln!("skipped: {stderr}");
        return;
    }
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let r = &v["result"];
    assert_eq!(r["bytes"], 4 << 20);
    assert_eq!(r["spec"]["rw"], "randread");
    assert_eq!(r["spec"]["jobs"], 2);
    assert_eq!(r["verified_bytes"], 4 << 20);
    assert!(r["mib_s"].as_f64().unwrap() > 0.0);
    assert!(v["machine"]["nproc"].as_u64().unwrap() >= 1);
    assert!(String::from_utf8_lossy(&out.stdout).contains("randread"));
}
