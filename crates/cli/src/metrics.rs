//! Prometheus text exposition (format 0.0.4, which OpenMetrics parsers read too) of zmem
//! processes' statistics, for `zmem stat --prometheus`. One family per statistic with its `# HELP`
//! (zram's mm_stat meaning where there is one) and `# TYPE`, one sample per process labelled
//! `pid` and `comm`. It is kept apart from the table so the metric names, which dashboards
//! depend on, change only on purpose.
//!
//! node_exporter's textfile collector reads `*.prom` files from a directory; write the file
//! atomically (a temporary file, then a rename) so it never sees half of one, e.g. from cron:
//! `* * * * * zmem stat --all --prometheus > /var/lib/node_exporter/zmem.prom.$$ && mv
//! /var/lib/node_exporter/zmem.prom.$$ /var/lib/node_exporter/zmem.prom`.

use std::fmt::Write;

use zmem_runenv::ProcessStats;

/// A metric family: name, type, help, and how to read it from one process's statistics.
struct Family {
    name: &'static str,
    kind: &'static str,
    help: &'static str,
    value: fn(&ProcessStats) -> f64,
}

const fn gauge(name: &'static str, help: &'static str, value: fn(&ProcessStats) -> f64) -> Family {
    Family {
        name,
        kind: "gauge",
        help,
        value,
    }
}

const fn counter(
    name: &'static str,
    help: &'static str,
    value: fn(&ProcessStats) -> f64,
) -> Family {
    Family {
        name,
        kind: "counter",
        help,
        value,
    }
}

/// Every family, in output order. The only place that reads `ProcessStats` fields.
const FAMILIES: &[Family] = &[
    gauge(
        "zmem_orig_data_bytes",
        "Heap bytes held compressed, at their uncompressed size (zram mm_stat orig_data_size).",
        |s| s.orig_data_size() as f64,
    ),
    gauge(
        "zmem_compr_data_bytes",
        "Compressed size of those bytes (zram mm_stat compr_data_size).",
        |s| s.compr_data_size() as f64,
    ),
    gauge(
        "zmem_mem_used_total_bytes",
        "DRAM the compressed pages take, allocator overhead included (zram mm_stat mem_used_total).",
        |s| s.mem_used_total() as f64,
    ),
    gauge(
        "zmem_mem_limit_bytes",
        "Most DRAM the compressed pages may take, 0 for no limit (zram mm_stat mem_limit).",
        |s| s.mem_limit() as f64,
    ),
    gauge(
        "zmem_same_pages",
        "Compressed-out pages filled with one repeated word, stored without data (zram mm_stat same_pages).",
        |s| s.same_pages() as f64,
    ),
    gauge(
        "zmem_resident_bytes",
        "Heap bytes in DRAM now, uncompressed.",
        |s| s.resident() as f64,
    ),
    gauge(
        "zmem_data_bytes",
        "Heap bytes the program touched: resident plus held compressed (uncompressed size).",
        |s| s.data() as f64,
    ),
    gauge(
        "zmem_ratio",
        "Heap data per byte of DRAM it takes: data / (resident + mem_used_total).",
        |s| s.ratio(),
    ),
    gauge(
        "zmem_budget_bytes",
        "Current resident budget: heap bytes allowed in DRAM uncompressed.",
        |s| s.budget() as f64,
    ),
    gauge(
        "zmem_heap_size_bytes",
        "Virtual size of the compressed heap.",
        |s| s.heap_size() as f64,
    ),
    gauge(
        "zmem_dictionary_bytes",
        "Bytes of the zstd dictionary new compressed pages are made with (learnt from the pages written, or given), 0 for none.",
        |s| s.region.store.dictionary_bytes as f64,
    ),
    counter(
        "zmem_dictionaries_learnt_total",
        "zstd dictionaries learnt from the pages written (a later one replaces one that fits the pages less).",
        |s| s.region.store.dictionaries_learnt as f64,
    ),
    counter(
        "zmem_dictionaries_retired_total",
        "Learnt dictionaries retired for saving too little on the pages written lately.",
        |s| s.region.store.dictionaries_retired as f64,
    ),
    counter(
        "zmem_major_faults_total",
        "Faults on compressed pages (each decompressed a page back into DRAM).",
        |s| s.major_faults() as f64,
    ),
    counter(
        "zmem_zero_faults_total",
        "Faults on heap pages never touched before (served with a zero page).",
        |s| s.zero_faults() as f64,
    ),
    counter(
        "zmem_evictions_total",
        "Pages moved out of DRAM into the compressed store.",
        |s| s.evictions() as f64,
    ),
    counter(
        "zmem_store_refused_total",
        "Evictions the store refused because it was full (zram mem_limit); those pages stayed in DRAM.",
        |s| s.store_refused() as f64,
    ),
    counter(
        "zmem_forks_total",
        "fork() calls of the process (each child gets a copy of the compressed heap).",
        |s| s.forks() as f64,
    ),
    gauge(
        "zmem_fault_latency_p50_seconds",
        "Median latency of a fault served by zmem.",
        |s| s.fault_p50_ns() as f64 / 1e9,
    ),
    gauge(
        "zmem_fault_latency_p99_seconds",
        "99th percentile latency of a fault served by zmem.",
        |s| s.fault_p99_ns() as f64 / 1e9,
    ),
    counter(
        "zmem_codec_cpu_seconds_total",
        "CPU time spent compressing and decompressing.",
        |s| s.codec_cpu_ns as f64 / 1e9,
    ),
    counter(
        "zmem_process_cpu_seconds_total",
        "CPU time of the whole process (user + system).",
        |s| s.process_cpu_ns as f64 / 1e9,
    ),
    gauge(
        "zmem_uptime_seconds",
        "Seconds since zmem started in the process.",
        |s| s.uptime_s,
    ),
    gauge(
        "zmem_active",
        "1 if the heap is compressed, 0 if zmem failed to start and the program runs uncompressed.",
        |s| f64::from(u8::from(s.active)),
    ),
];

/// A label value with `\`, `"` and newlines escaped.
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn labels(s: &ProcessStats) -> String {
    format!("pid=\"{}\",comm=\"{}\"", s.pid, escape(&s.program))
}

/// The exposition of `rows`: every family's HELP and TYPE (also with no process, so a scrape
/// of an idle machine is valid and empty), then a sample per process.
pub fn exposition(rows: &[&ProcessStats]) -> String {
    let mut out = String::new();
    out += "# HELP zmem_info The zmem process: version, policy and eviction as labels; value 1.\n";
    out += "# TYPE zmem_info gauge\n";
    for s in rows {
        let _ = writeln!(
            out,
            "zmem_info{{{},version=\"{}\",policy=\"{}\",eviction=\"{}\"}} 1",
            labels(s),
            escape(&s.zmem_version),
            escape(&s.policy),
            escape(&s.eviction)
        );
    }
    for f in FAMILIES {
        let _ = writeln!(out, "# HELP {} {}", f.name, f.help);
        let _ = writeln!(out, "# TYPE {} {}", f.name, f.kind);
        for s in rows {
            let _ = writeln!(out, "{}{{{}}} {}", f.name, labels(s), (f.value)(s));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn stats(pid: u32, program: &str) -> ProcessStats {
        let mut s = ProcessStats {
            pid,
            program: program.into(),
            codec_cpu_ns: 1_500_000_000,
            ..Default::default()
        };
        s.region.resident = 30 << 20;
        s.region.evictions = 60000;
        s.region.store.orig_data_size = 200 << 20;
        s.region.store.mem_used_total = 72 << 20;
        s.region.store.same_pages = 12;
        s.region.store.dictionary_bytes = 16 << 10;
        s.region.store.dictionaries_learnt = 2;
        s
    }

    /// A small parser of the text format: families with HELP and TYPE before their samples,
    /// samples `name{labels} value`.
    fn parse(text: &str) -> HashMap<(String, String), f64> {
        let mut typed = HashMap::new();
        let mut samples = HashMap::new();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP name text");
                assert!(!help.is_empty(), "{line}");
                typed.insert(name.to_string(), None);
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE name kind");
                assert!(["gauge", "counter"].contains(&kind), "{line}");
                assert!(typed.contains_key(name), "TYPE before HELP: {line}");
                if kind == "counter" {
                    assert!(name.ends_with("_total"), "{line}");
                }
                typed.insert(name.to_string(), Some(kind.to_string()));
            } else {
                let (name, rest) = line.split_once('{').expect("labels");
                let (labels, value) = rest.rsplit_once("} ").expect("value");
                assert!(
                    name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "{line}"
                );
                assert!(matches!(typed.get(name), Some(Some(_))), "untyped: {line}");
                let value: f64 = value.parse().unwrap_or_else(|_| panic!("{line}"));
                assert!(value.is_finite(), "{line}");
                assert!(labels.starts_with("pid=\""), "{line}");
                samples.insert((name.to_string(), labels.to_string()), value);
            }
        }
        samples
    }

    #[test]
    fn exposition_parses_and_carries_the_statistics() {
        let a = stats(10, "redis-server");
        let b = stats(11, "we\"ird\\name\n");
        let text = exposition(&[&a, &b]);
        let m = parse(&text);
        let get = |name: &str, pid: u32, comm: &str| {
            m[&(name.to_string(), format!("pid=\"{pid}\",comm=\"{comm}\""))]
        };
        assert_eq!(
            get("zmem_orig_data_bytes", 10, "redis-server"),
            (200u64 << 20) as f64
        );
        assert_eq!(
            get("zmem_mem_used_total_bytes", 10, "redis-server"),
            (72u64 << 20) as f64
        );
        assert_eq!(get("zmem_evictions_total", 10, "redis-server"), 60000.0);
        assert_eq!(get("zmem_codec_cpu_seconds_total", 10, "redis-server"), 1.5);
        assert_eq!(get("zmem_same_pages", 11, "we\\\"ird\\\\name\\n"), 12.0);
        assert_eq!(get("zmem_dictionary_bytes", 10, "redis-server"), 16384.0);
        assert_eq!(
            get("zmem_dictionaries_learnt_total", 10, "redis-server"),
            2.0
        );
        assert_eq!(m.len(), 2 * (FAMILIES.len() + 1));
        for f in FAMILIES {
            assert!(text.contains(&format!("# TYPE {} {}\n", f.name, f.kind)));
        }
    }

    #[test]
    fn exposition_without_processes_is_valid_and_has_no_samples() {
        let text = exposition(&[]);
        assert!(parse(&text).is_empty());
        assert!(text.contains("# TYPE zmem_budget_bytes gauge"));
    }
}
