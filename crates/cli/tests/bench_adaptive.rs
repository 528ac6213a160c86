//! `zmem bench adaptive`: bad input, and a short run in which a hog process takes memory away
//! and gives it back: the adaptive budget must fall while the hog holds its memory and rise
//! again after.

mod support;

use support::{corpus, fails_with, read_json, tmpdir, zmem};

const GIB: u64 = 1 << 30;

fn mem_available() -> Option<u64> {
    zmem_region::budget::read_mem_available().ok()
}

/// Why the machine cannot run the bench, if it cannot.
fn skip_reason(take: u64) -> Option<String> {
    if let Err(e) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/userfaultfd")
    {
        return Some(format!("cannot open /dev/userfaultfd: {e}"));
    }
    if let Err(e) = zmem_region::budget::read_machine() {
        return Some(format!("no PSI or MemAvailable: {e}"));
    }
    let avail = mem_available()?;
    if avail < take + 3 * GIB {
        return Some(format!(
            "MemAvailable {} MiB is too small for --take {} MiB",
            avail >> 20,
            take >> 20
        ));
    }
    if corpus().is_none() {
        return Some("no corpus".into());
    }
    None
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    fails_with(
        &["bench", "adaptive", "--min", "64M", "--max", "32M"],
        "--min 64M is larger than --max 32M",
    );
    fails_with(
        &["bench", "adaptive", "--size", "64M", "--max", "128M"],
        "--max 128M is larger than --size 64M",
    );
    fails_with(
        &[
            "bench",
            "adaptive",
            "--at",
            "10s",
            "--hold",
            "20s",
            "--duration",
            "30s",
        ],
        "must end before --duration",
    );
    fails_with(&["bench", "adaptive", "--at", "soon"], "invalid duration");
    if let Some(why) = skip_reason(0) {
        eprintln!("skipping the --take check: {why}");
        return;
    }
    let corpus = corpus().unwrap();
    fails_with(
        &[
            "bench", "adaptive", "--size", "64M", "--min", "16M", "--max", "32M", "--take",
            "1024G", "--corpus", &corpus,
        ],
        "--take 1024G is too large",
    );
}

#[test]
fn budget_falls_under_the_hog_and_grows_back() {
    let take = 2 * GIB;
    if let Some(why) = skip_reason(take) {
        eprintln!("skipping: {why}");
        return;
    }
    let dir = tmpdir();
    let json = dir.path().join("adaptive.json");
    let svg = dir.path().join("adaptive.svg");
    let corpus = corpus().unwrap();
    // The default deficit, 1G, is more than this region can give back: the budget goes down to
    // --min. Before and after the hog MemAvailable is 1G (take - deficit) above the reserve, a
    // margin against what other processes do meanwhile. A 1 s cooldown lets the budget grow
    // within the short run.
    let out = zmem(&[
        "bench",
        "adaptive",
        "--size",
        "256M",
        "--min",
        "16M",
        "--max",
        "192M",
        "--take",
        "2G",
        "--at",
        "2s",
        "--hold",
        "5s",
        "--duration",
        "12s",
        "--cooldown",
        "1s",
        "--corpus",
        &corpus,
        "--json",
        json.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    eprintln!("{stdout}");
    assert!(stdout.contains("reserve"), "{stdout}");
    assert!(std::fs::read_to_string(&svg).unwrap().contains("<svg"));

    let doc = read_json(&json);
    let r = &doc["result"];
    assert!(doc["machine"]["nproc"].as_u64().unwrap() >= 1);
    let samples = r["samples"].as_array().unwrap();
    assert!(samples.len() >= 30, "{} samples", samples.len());
    for key in [
        "t",
        "budget",
        "resident",
        "mem_available",
        "psi_some_avg10",
        "refaults_per_s",
        "accesses_per_s",
        "hog",
    ] {
        assert!(samples[0].get(key).is_some(), "sample lacks {key}");
    }
    let s = &r["summary"];
    let before = s["budget_before"].as_u64().unwrap();
    let lowest = s["budget_lowest"].as_u64().unwrap();
    let fin = s["budget_final"].as_u64().unwrap();
    assert!(
        s["hog_exit_s"].as_f64().is_some(),
        "the hog did not exit: {s}"
    );
    assert!(
        s["phases"].as_array().unwrap().len() == 3,
        "before, hog, after: {s}"
    );
    let fell = lowest < before;
    let rose = fin > lowest;
    if !(fell && rose) {
        // What other processes do can hide the hog's effect; say so rather than fail.
        // 1. Outside memory allocations: growth needs MemAvailable > reserve + band (128M) after
        //    the hog, the margin of 1G eaten by others.
        let reserve = s["reserve"].as_u64().unwrap();
        let exit = s["hog_exit_s"].as_f64().unwrap();
        let best_after = samples
            .iter()
            .filter(|x| x["t"].as_f64().unwrap() > exit)
            .filter_map(|x| x["mem_available"].as_u64())
            .max()
            .unwrap_or(0);
        if !rose && best_after < reserve + (128 << 20) {
            eprintln!(
                "inconclusive, skipping: after the hog MemAvailable stayed at most {} MiB, below \
                 the reserve {} MiB + 128 MiB: other processes took the memory",
                best_after >> 20,
                reserve >> 20
            );
            return;
        }
        // 2. The hog could not take its memory (it stops touching at a MemAvailable floor, or
        //    ran slowly: on a fresh virtual machine first touches can run at 200 MB/s): it
        //    touched less than --take, so MemAvailable fell below the reserve for a moment at
        //    most, between two controller steps, or never; nothing asked the budget to fall.
        let touched = s["hog_touched"].as_u64().unwrap_or(0);
        let start = s["hog_start_s"].as_f64().unwrap();
        let lowest_under_hog = samples
            .iter()
            .filter(|x| (start..=exit).contains(&x["t"].as_f64().unwrap()))
            .filter_map(|x| x["mem_available"].as_u64())
            .min()
            .unwrap_or(u64::MAX);
        if !fell && (lowest_under_hog >= reserve || touched < take) {
            eprintln!(
                "inconclusive, skipping: the hog touched {} of {} MiB and MemAvailable fell to \
                 {} MiB (the reserve {} MiB)",
                touched >> 20,
                take >> 20,
                lowest_under_hog >> 20,
                reserve >> 20
            );
            return;
        }
        // 3. PSI stalls come from other processes (this run neither swaps nor reclaims): a
        //    machine under outside memory pressure cannot show the hog's effect alone.
        let outside: Vec<&serde_json::Value> = r["decisions"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| {
                matches!(
                    d["reason"].as_str(),
                    Some("ShrinkPressure" | "HoldPressure")
                )
            })
            .collect();
        if !outside.is_empty() {
            eprintln!(
                "inconclusive, skipping: memory pressure from other processes during the run \
                 ({} controller steps saw PSI stalls): before {before} lowest {lowest} final {fin}",
                outside.len()
            );
            return;
        }
    }
    assert!(
        fell,
        "budget did not fall under the hog: before {before}, lowest {lowest}\n{stdout}\n{stderr}"
    );
    assert!(
        rose,
        "budget did not grow back: lowest {lowest}, final {fin}\n{stdout}\n{stderr}"
    );
    let reasons = s["decisions"].to_string();
    assert!(reasons.contains("ShrinkMemAvailable"), "{reasons}");
    assert!(reasons.contains("Grow"), "{reasons}");
}
