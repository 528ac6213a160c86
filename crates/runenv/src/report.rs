//! What a `zmem run` reports when its program exits: [`RunReport`] (the `--stats FILE` JSON)
//! and its text form ([`summary`], with the zramctl-like [`table`] that `zmem stat` prints too).
//! `zmem run` execs the program in its own place, so the preload library of that process (the
//! one whose pid is `ZMEM_RUN_PID`) writes both when the program exits.

use serde::{Deserialize, Serialize};

use crate::size::format_size_approx as human;
use crate::ProcessStats;

/// What `--stats FILE` holds.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunReport {
    pub command: Vec<String>,
    /// The status the program passed to exit (a program killed by a signal writes no report).
    pub exit_code: i32,
    /// From zmem's start in the program (before `main`) to its exit.
    pub wall_s: f64,
    pub user_cpu_s: f64,
    pub system_cpu_s: f64,
    /// Peak resident set of the program (kernel's maxrss), bytes.
    pub max_rss: u64,
    /// The program's zmem statistics at exit.
    pub zmem: ProcessStats,
    /// The most heap data (resident + compressed, uncompressed bytes) and the most DRAM it took
    /// (resident + compressed pool), over samples every 0.5 s and the exit.
    pub peak_data: u64,
    pub peak_dram: u64,
    /// Other processes under this run that used zmem (exec'd children that exited before it).
    pub others: Vec<ProcessStats>,
}

/// The zramctl-like table of one or more processes.
pub fn table(rows: &[&ProcessStats]) -> String {
    let mut out = format!(
        "{:>8} {:<16} {:>7} {:>7} {:>8} {:>8} {:>8} {:>6} {:>8} {:>9} {:>9} {:>8}\n",
        "PID",
        "PROGRAM",
        "HEAP",
        "BUDGET",
        "DATA",
        "COMPR",
        "TOTAL",
        "RATIO",
        "RESIDENT",
        "FAULTS",
        "EVICTED",
        "ZMEM-CPU"
    );
    for s in rows {
        out += &format!(
            "{:>8} {:<16} {:>7} {:>7} {:>8} {:>8} {:>8} {:>6} {:>8} {:>9} {:>9} {:>7.2}s\n",
            s.pid,
            s.program.chars().take(16).collect::<String>(),
            human(s.heap_size()),
            human(s.budget()),
            human(s.data()),
            human(s.compr_data_size()),
            human(s.mem_used_total()),
            format!("{:.2}", s.ratio()),
            human(s.resident()),
            s.major_faults() + s.zero_faults(),
            s.evictions(),
            s.codec_cpu_ns as f64 / 1e9,
        );
    }
    for s in rows.iter().filter(|s| s.incompressible() > 0) {
        out += &format!(
            "zmem: pid {}: {} does not compress: kept in DRAM, outside the budget \
             (compressed it would save nothing)\n",
            s.pid,
            human(s.incompressible())
        );
    }
    for s in rows.iter().filter(|s| s.clean_evictions() > 0) {
        out += &format!(
            "zmem: pid {}: {} evictions of pages unchanged since their fault reused the \
             compressed copy (no compression); {} of resident pages have one now\n",
            s.pid,
            s.clean_evictions(),
            human(s.region.clean_copies)
        );
    }
    for s in rows {
        if let Some(line) = checks_line(s) {
            out += &line;
        }
    }
    out
}

/// The `checks` counters of a process that are not zero, in one line (None when all are): what
/// a correct run should seldom or never see (`zmem_region::Checks`).
pub fn checks_line(s: &ProcessStats) -> Option<String> {
    let c = &s.region.checks;
    let seen: Vec<String> = [
        (
            "pages came back different from what was stored",
            c.mismatches,
        ),
        ("faults on pages counted resident", c.on_resident),
        ("faults on staged pages still mapped", c.staged_present),
        ("victims with nothing mapped", c.moved_nothing),
        ("victims a cut run had moved unreported", c.moved_unreported),
    ]
    .iter()
    .filter(|&&(_, n)| n > 0)
    .map(|&(what, n)| format!("{n} {what}"))
    .collect();
    (!seen.is_empty()).then(|| {
        format!(
            "zmem: pid {}: checks: {} (rare outcomes; on a single-threaded program they point at \
             a race in zmem: please report them)\n",
            s.pid,
            seen.join(", ")
        )
    })
}

/// The cold pass of a process (policy `auto`) in one line, or None without one.
pub fn cold_line(s: &ProcessStats) -> Option<String> {
    let st = &s.region.store;
    if st.cold_after_ms == 0 {
        return None;
    }
    Some(format!(
        "zmem: cold pass: {} pages recompressed in all; its own took {} to {}; a page is cold \
         after {:.0} s stored\n",
        st.recompressed_pages,
        human(st.cold_bytes_before),
        human(st.cold_bytes_after),
        f64::from(st.cold_after_ms) / 1000.0
    ))
}

/// The zstd dictionary a process's store compresses with (learnt from its pages, or given) in
/// one line, or None without one.
pub fn dictionary_line(s: &ProcessStats) -> Option<String> {
    let st = &s.region.store;
    if st.dictionary_bytes == 0 && st.dictionaries_learnt == 1 {
        return Some(
            "zmem: the dictionary learnt from the pages written was retired for saving too \
             little; pages compressed without one now\n"
                .into(),
        );
    }
    if st.dictionary_bytes == 0 && st.dictionaries_learnt > 1 {
        return Some(format!(
            "zmem: {} dictionaries learnt from the pages written ({} retired for saving too \
             little); pages compressed without one now\n",
            st.dictionaries_learnt, st.dictionaries_retired
        ));
    }
    (st.dictionary_bytes > 0).then(|| match st.dictionaries_learnt {
        0 => format!(
            "zmem: pages compressed with the given dictionary of {}\n",
            human(st.dictionary_bytes)
        ),
        1 => format!(
            "zmem: pages compressed with a dictionary of {} learnt from the pages written\n",
            human(st.dictionary_bytes)
        ),
        n => format!(
            "zmem: pages compressed with a dictionary of {} learnt from the pages written \
             ({n} learnt in all as they changed)\n",
            human(st.dictionary_bytes)
        ),
    })
}

/// What the process's large reallocs and callocs cost (`Region::move_pages`, `zero_pages`) in
/// one line, or None where it made none.
pub fn large_blocks_line(s: &ProcessStats) -> Option<String> {
    let (m, z) = (&s.region.remapped, &s.region.zeroed);
    let moved = m.mapped + m.stored + m.zero + m.copied;
    let zeroed = z.absent + z.dropped + z.written;
    let freed = s.region.freed_stored;
    if moved + zeroed + freed == 0 {
        return None;
    }
    Some(format!(
        "zmem: large blocks: {moved} pages resized ({} moved mapped, {} moved compressed, {} \
         copied), {zeroed} pages calloc'd ({} written, {} compressed ones dropped), {freed} \
         compressed pages of freed blocks dropped\n",
        m.mapped, m.stored, m.copied, z.written, z.dropped
    ))
}

/// The SSD tier of a process in one line (zram's bd_stat and the log's own counters), or None
/// without one.
pub fn ssd_line(s: &ProcessStats) -> Option<String> {
    let l = s.ssd.as_ref()?;
    let st = &s.region.store;
    let mut how = vec![if l.encrypted {
        "encrypted"
    } else {
        "not encrypted"
    }];
    how.push(if l.uring { "io_uring" } else { "pread/pwrite" });
    if !l.direct {
        how.push("buffered (no O_DIRECT)");
    }
    Some(format!(
        "zmem: SSD {} pages ({} compressed) of {} log; written back {} pages, read back {} \
         ({} read ahead); \
         device writes {} (write amplification {:.2}), GC moved {} objects, reclaimed {} segments; \
         errors {} read, {} write, {} corrupt; {}\n",
        st.lower_pages,
        human(st.lower_bytes),
        human(l.segments * l.segment_size),
        st.writeback_pages,
        st.lower_reads,
        st.lower_ahead_hits,
        human(l.device_bytes_written),
        l.write_amplification(),
        l.gc_moves,
        l.gc_segments,
        l.read_errors,
        l.write_errors,
        l.corrupt,
        how.join(", ")
    ))
}

/// The summary printed on stderr when the program exits.
pub fn summary(name: &str, r: &RunReport) -> String {
    let s = &r.zmem;
    let mut out = format!(
        "zmem: {name} (pid {}) exited with status {} after {:.1} s; CPU {:.2} s user + {:.2} s system, peak RSS {}\n",
        s.pid,
        r.exit_code,
        r.wall_s,
        r.user_cpu_s,
        r.system_cpu_s,
        human(r.max_rss)
    );
    const SHOWN: usize = 5;
    let mut rows = vec![s];
    rows.extend(r.others.iter().take(SHOWN));
    out += &table(&rows);
    if r.others.len() > SHOWN {
        out += &format!(
            "zmem: and {} more processes this run exec'd\n",
            r.others.len() - SHOWN
        );
    }
    out += &format!(
        "zmem: peak heap data {} in {} of DRAM ({:.2}x)\n",
        human(r.peak_data),
        human(r.peak_dram),
        r.peak_data as f64 / r.peak_dram.max(1) as f64
    );
    for l in [
        cold_line(s),
        dictionary_line(s),
        large_blocks_line(s),
        ssd_line(s),
    ]
    .into_iter()
    .flatten()
    {
        out += &l;
    }
    if s.store_refused() > 0 {
        out += &format!(
            "zmem: the compressed store was full {} times; those pages stayed in DRAM\n",
            s.store_refused()
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_names_the_status_and_every_process() {
        let mut r = RunReport {
            exit_code: 3,
            wall_s: 1.25,
            peak_data: 8 << 20,
            peak_dram: 4 << 20,
            ..Default::default()
        };
        r.zmem.pid = 42;
        r.zmem.program = "prog".into();
        r.others = (0..7)
            .map(|i| ProcessStats {
                pid: 100 + i,
                program: format!("child{i}"),
                ..Default::default()
            })
            .collect();
        let s = summary("prog", &r);
        assert!(
            s.starts_with("zmem: prog (pid 42) exited with status 3 after 1.2 s"),
            "{s}"
        );
        assert!(s.contains("child4") && !s.contains("child5"), "{s}");
        assert!(s.contains("and 2 more processes"), "{s}");
        assert!(s.contains("peak heap data 8M in 4M of DRAM (2.00x)"), "{s}");
        let back: RunReport = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back.others.len(), 7);
        assert!(!s.contains("checks:"), "{s}");
    }

    #[test]
    fn checks_that_are_not_zero_are_named_in_the_table() {
        let mut p = ProcessStats {
            pid: 7,
            ..Default::default()
        };
        assert_eq!(checks_line(&p), None);
        p.region.checks.moved_nothing = 2;
        p.region.checks.moved_unreported = 1;
        let line = checks_line(&p).unwrap();
        assert!(
            line.starts_with(
                "zmem: pid 7: checks: 2 victims with nothing mapped, 1 victims a cut run had \
                 moved unreported"
            ),
            "{line}"
        );
        assert!(table(&[&p]).contains(&line));
    }

    #[test]
    fn large_blocks_have_a_line_only_where_there_were_some() {
        let mut p = ProcessStats::default();
        assert_eq!(large_blocks_line(&p), None);
        p.region.remapped.mapped = 10;
        p.region.remapped.stored = 90;
        p.region.remapped.zero = 3;
        p.region.remapped.copied = 2;
        assert_eq!(
            large_blocks_line(&p).unwrap(),
            "zmem: large blocks: 105 pages resized (10 moved mapped, 90 moved compressed, 2 \
             copied), 0 pages calloc'd (0 written, 0 compressed ones dropped), 0 compressed \
             pages of freed blocks dropped\n"
        );
        p.region.remapped = Default::default();
        p.region.zeroed.absent = 7;
        p.region.zeroed.dropped = 5;
        p.region.zeroed.written = 1;
        assert!(large_blocks_line(&p)
            .unwrap()
            .contains("13 pages calloc'd (1 written, 5 compressed ones dropped)"));
        p.region.zeroed = Default::default();
        p.region.freed_stored = 42;
        assert!(large_blocks_line(&p)
            .unwrap()
            .contains(", 42 compressed pages of freed blocks dropped"));
    }

    #[test]
    fn a_dictionary_has_a_line_only_where_there_is_one() {
        let mut p = ProcessStats::default();
        assert_eq!(dictionary_line(&p), None);
        p.region.store.dictionary_bytes = 16 << 10;
        assert_eq!(
            dictionary_line(&p).unwrap(),
            "zmem: pages compressed with the given dictionary of 16K\n"
        );
        p.region.store.dictionaries_learnt = 1;
        assert_eq!(
            dictionary_line(&p).unwrap(),
            "zmem: pages compressed with a dictionary of 16K learnt from the pages written\n"
        );
        p.region.store.dictionaries_learnt = 3;
        assert!(dictionary_line(&p)
            .unwrap()
            .ends_with("written (3 learnt in all as they changed)\n"));
        p.region.store.dictionary_bytes = 0;
        p.region.store.dictionaries_retired = 2;
        assert_eq!(
            dictionary_line(&p).unwrap(),
            "zmem: 3 dictionaries learnt from the pages written (2 retired for saving too \
             little); pages compressed without one now\n"
        );
        p.region.store.dictionaries_learnt = 1;
        p.region.store.dictionaries_retired = 1;
        assert_eq!(
            dictionary_line(&p).unwrap(),
            "zmem: the dictionary learnt from the pages written was retired for saving too \
             little; pages compressed without one now\n"
        );
    }

    #[test]
    fn the_cold_pass_has_a_line_only_where_it_runs() {
        let mut p = ProcessStats::default();
        assert_eq!(cold_line(&p), None);
        let st = &mut p.region.store;
        st.cold_after_ms = 4000;
        st.recompressed_pages = 1234;
        st.cold_bytes_before = 8 << 20;
        st.cold_bytes_after = 5 << 20;
        let line = cold_line(&p).unwrap();
        assert_eq!(
            line,
            "zmem: cold pass: 1234 pages recompressed in all; its own took 8M to 5M; a page is \
             cold after 4 s stored\n"
        );
    }
}
