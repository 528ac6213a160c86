//! `zmem bench ssd`: HMM_alloc's experiments (seed 003, §3) on zmem's SSD tier beside the
//! kernel's swap on the same disk, as root, in one run:
//!
//! - **random object access**: an array of `--array` bytes of objects of 256 B, 1 KiB or 4 KiB
//!   (one malloc'd allocation, so that under `zmem run` it lives in zmem's heap), filled, then
//!   random reads, writes or 80:20, each timed; every read compares the whole object with the
//!   content its (index, version) gives, so a lost or stale write is a counted failure;
//! - **bloom filter**: `--array` bytes of bits at the load of an optimally filled filter (half
//!   the bits set, so 1/256 false positives with 8 hashes), then N keys inserted, N present and N
//!   absent keys queried with 8 hash functions, each operation timed; every present key must hit,
//!   the false-positive rate must be what the load gives, and a sample of the filter's bits is
//!   checked for lost bits.
//!
//! Each workload runs in a worker process (this binary, `zmem bench ssd-worker`, [`worker`]) of
//! its own, twice or three times at the same DRAM (`--dram`, default 64M):
//!
//! - **kernel**: the worker in a cgroup v1 memory cgroup limited to `--dram` (above its own
//!   baseline, locked), with a swap file of `--disk-size` on the file system of `--dir` as the
//!   only swap the benchmark adds (highest priority); the file is created, swapped on, swapped
//!   off and deleted by the benchmark ([`crate::kernel::swapfile::SwapFile`]);
//! - **zmem**: `zmem run --resident R --store-limit P --ssd DIR --ssd-size S -- zmem bench
//!   ssd-worker ...` with R + P = `--dram` (R = `--resident`, default half), the log in a fresh
//!   directory under `--dir`, encrypted (the tier's default); with `--encrypt-cost` once more
//!   with `--ssd-no-encrypt`. The worker is in a memory cgroup without a limit there too, for
//!   the DRAM it really took (`memory.max_usage_in_bytes`).
//!
//! [`run`] drives the sides and restores the machine; [`report`] writes the table, the JSON and
//! the chart.

pub mod report;
pub mod run;
pub mod worker;

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use clap::Args;
use serde::{Deserialize, Serialize};
use zmem_runenv::size::{format_size, parse_size};

/// Default seed of the contents, the access streams and the keys.
pub const SEED: u64 = 0x5eed_55d0_0003;
/// Smallest and largest object.
pub const MIN_OBJECT: u64 = 64;
pub const MAX_OBJECT: u64 = 1 << 20;
/// Hash functions of the bloom filter.
pub const BLOOM_HASHES: u32 = 8;

/// What a worker runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadKind {
    /// Random access to fixed-size objects of an array.
    Objects,
    /// Inserts and queries of a bloom filter with 8 hash functions.
    Bloom,
}

impl WorkloadKind {
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::Objects => "objects",
            WorkloadKind::Bloom => "bloom",
        }
    }
}

/// What the objects hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Content {
    /// 8-byte tokens, 3 in 4 from the 16 most common of 256 word pairs: compresses about like
    /// text (4 KiB pages: lz4 ~1.9x, zstd-1 ~4x).
    Text,
    /// Random words: does not compress.
    Random,
}

/// Where a side runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum SideKind {
    /// A memory cgroup limited to --dram, a swap file on --dir.
    Kernel,
    /// `zmem run --resident R --store-limit P --ssd DIR`.
    Zmem,
}

/// Reads and writes of the random object access, as reads:writes ("ro" = 1:0, "wo" = 0:1,
/// "80:20").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Mix {
    pub reads: u32,
    pub writes: u32,
}

impl Mix {
    pub const RO: Mix = Mix {
        reads: 1,
        writes: 0,
    };
    pub const WO: Mix = Mix {
        reads: 0,
        writes: 1,
    };
    pub const RW80: Mix = Mix {
        reads: 80,
        writes: 20,
    };

    /// The fraction of operations that read.
    pub fn read_fraction(self) -> f64 {
        self.reads as f64 / (self.reads + self.writes) as f64
    }
}

impl fmt::Display for Mix {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match (self.reads, self.writes) {
            (_, 0) => f.write_str("ro"),
            (0, _) => f.write_str("wo"),
            (r, w) => write!(f, "{r}:{w}"),
        }
    }
}

impl FromStr for Mix {
    type Err = String;

    fn from_str(s: &str) -> Result<Mix, String> {
        let bad = || format!("{s:?} is not a mix: ro, wo, or READS:WRITES such as 80:20");
        match s.trim() {
            "ro" => return Ok(Mix::RO),
            "wo" => return Ok(Mix::WO),
            _ => {}
        }
        let (r, w) = s.trim().split_once(':').ok_or_else(bad)?;
        let reads: u32 = r.trim().parse().map_err(|_| bad())?;
        let writes: u32 = w.trim().parse().map_err(|_| bad())?;
        if reads.checked_add(writes).is_none_or(|t| t == 0) {
            return Err(bad());
        }
        Ok(Mix { reads, writes })
    }
}

impl From<Mix> for String {
    fn from(m: Mix) -> String {
        m.to_string()
    }
}

impl TryFrom<String> for Mix {
    type Error = String;
    fn try_from(s: String) -> Result<Mix, String> {
        s.parse()
    }
}

/// An object size's own error (the same rule for the driver and the worker).
pub fn check_object_size(size: u64) -> anyhow::Result<()> {
    anyhow::ensure!(
        size % MIN_OBJECT == 0 && (MIN_OBJECT..=MAX_OBJECT).contains(&size),
        "--object-size {size} is not a multiple of {MIN_OBJECT} bytes between {} and {}",
        format_size(MIN_OBJECT),
        format_size(MAX_OBJECT)
    );
    Ok(())
}

/// An array size's own error for a workload (`object_size` for objects).
pub fn check_array(kind: WorkloadKind, array: u64, object_size: u64) -> anyhow::Result<()> {
    match kind {
        WorkloadKind::Objects => anyhow::ensure!(
            array >= object_size,
            "--array {array} is smaller than one object (--object-size {})",
            format_size(object_size)
        ),
        WorkloadKind::Bloom => anyhow::ensure!(
            array >= 4096 && array % 8 == 0,
            "--array {array} is too small for a bloom filter (at least 4k, a multiple of 8)"
        ),
    }
    Ok(())
}

/// The defaults of a full run and of `--quick`.
struct Preset {
    array: u64,
    dram: u64,
    ops: u64,
    bloom_keys: u64,
    object_sizes: &'static [u64],
    mixes: &'static [Mix],
}

const FULL: Preset = Preset {
    array: 2 << 30,
    dram: 64 << 20,
    ops: 100_000,
    bloom_keys: 10_000,
    object_sizes: &[256, 1024, 4096],
    mixes: &[Mix::RO, Mix::WO, Mix::RW80],
};

const QUICK: Preset = Preset {
    array: 512 << 20,
    dram: 64 << 20,
    ops: 30_000,
    bloom_keys: 3_000,
    object_sizes: &[256, 4096],
    mixes: &[Mix::RW80],
};

/// `zmem bench ssd`.
#[derive(Debug, Clone, Args, Serialize)]
pub struct SsdArgs {
    /// Workloads (comma-separated).
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "objects,bloom"
    )]
    pub workloads: Vec<WorkloadKind>,
    /// Object sizes of the random object access (comma-separated, multiples of 64 up to 1M)
    /// [default: 256,1k,4k; --quick: 256,4k].
    #[arg(long = "object-size", value_parser = parse_size, value_delimiter = ',')]
    pub object_sizes: Vec<u64>,
    /// Reads:writes of the random object access (comma-separated: ro, wo, 80:20, ...)
    /// [default: ro,wo,80:20; --quick: 80:20].
    #[arg(long = "mix", value_delimiter = ',')]
    pub mixes: Vec<Mix>,
    /// Bytes of the object array, and of the bloom filter's bits [default: 2G; --quick: 512M].
    #[arg(long, value_parser = parse_size)]
    pub array: Option<u64>,
    /// DRAM of each side: the kernel side's cgroup limit, zmem's --resident + --store-limit
    /// [default: 64M].
    #[arg(long, value_parser = parse_size)]
    pub dram: Option<u64>,
    /// zmem's --resident out of --dram; the rest is its --store-limit [default: half].
    #[arg(long, value_parser = parse_size)]
    pub resident: Option<u64>,
    /// zmem's --store-limit [default: --dram minus --resident]. Smaller than that, it leaves
    /// room in --dram for zmem's own tables (about 45 bytes per page of the array, which
    /// --resident and --store-limit do not count), to compare at equal DRAM.
    #[arg(long, value_parser = parse_size)]
    pub store_limit: Option<u64>,
    /// Timed random operations per object run [default: 100000; --quick: 30000].
    #[arg(long)]
    pub ops: Option<u64>,
    /// Bloom filter: keys inserted, then as many present and absent keys queried
    /// [default: 10000; --quick: 3000].
    #[arg(long)]
    pub bloom_keys: Option<u64>,
    /// What the objects hold.
    #[arg(long, value_enum, default_value = "text")]
    pub content: Content,
    /// Directory on the disk under test: the kernel's swap file and zmem's log go there.
    #[arg(long, default_value = "/var/tmp")]
    pub dir: PathBuf,
    /// Disk space of each side: the swap file's size and zmem's --ssd-size
    /// [default: 1.5 x --array + 64M].
    #[arg(long, value_parser = parse_size)]
    pub disk_size: Option<u64>,
    /// Also run zmem with --ssd-no-encrypt: what encryption at rest costs.
    #[arg(long)]
    pub encrypt_cost: bool,
    /// Sides to run (comma-separated).
    #[arg(long, value_enum, value_delimiter = ',', default_value = "kernel,zmem")]
    pub sides: Vec<SideKind>,
    /// Runs of each workload per side; the table gives the median run.
    #[arg(long, default_value_t = 1)]
    pub repeat: u32,
    /// Seed of the contents, access streams and keys.
    #[arg(long, default_value_t = SEED)]
    pub seed: u64,
    /// A worker running longer than this (seconds) is killed and reported as a timeout.
    #[arg(long, default_value_t = 900.0)]
    pub timeout: f64,
    /// Smaller defaults for a run of a minute or two (512M array, 64M DRAM, 256 B and 4 KiB
    /// objects at 80:20, fewer operations); flags given explicitly still apply.
    #[arg(long)]
    pub quick: bool,
    /// Output path without extension: OUT.json, OUT.svg and OUT.txt are written.
    #[arg(long, default_value = "docs/bench/ssd")]
    pub out: PathBuf,
}

/// A worker's workload, as its command line gives it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    pub workload: WorkloadKind,
    /// Objects only.
    pub object_size: Option<u64>,
    pub mix: Option<Mix>,
}

impl Case {
    /// "objects 256B 80:20", "objects 4k ro", "bloom".
    pub fn name(&self) -> String {
        match (self.workload, self.object_size, self.mix) {
            (WorkloadKind::Objects, Some(s), Some(m)) if s % 1024 == 0 => {
                format!("objects {} {m}", format_size(s))
            }
            (WorkloadKind::Objects, Some(s), Some(m)) => format!("objects {s}B {m}"),
            (w, _, _) => w.as_str().to_string(),
        }
    }
}

/// `v` without repeats, in the order given.
fn unique<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    let mut out: Vec<T> = Vec::new();
    for x in v {
        if !out.contains(x) {
            out.push(*x);
        }
    }
    out
}

/// The command line with the preset resolved and checked.
#[derive(Clone, Debug, Serialize)]
pub struct Plan {
    pub workloads: Vec<WorkloadKind>,
    pub object_sizes: Vec<u64>,
    pub mixes: Vec<Mix>,
    pub array: u64,
    pub dram: u64,
    pub resident: u64,
    pub store_limit: u64,
    pub ops: u64,
    pub bloom_keys: u64,
    pub content: Content,
    pub dir: PathBuf,
    pub disk_size: u64,
    pub encrypt_cost: bool,
    pub sides: Vec<SideKind>,
    pub repeat: u32,
    pub seed: u64,
    pub timeout_s: f64,
    pub quick: bool,
}

impl Plan {
    /// The plan of the command line, or the first thing wrong with it.
    pub fn resolve(a: &SsdArgs) -> anyhow::Result<Plan> {
        let p = if a.quick { &QUICK } else { &FULL };
        let object_sizes = unique(if a.object_sizes.is_empty() {
            p.object_sizes
        } else {
            &a.object_sizes
        });
        let mixes = unique(if a.mixes.is_empty() {
            p.mixes
        } else {
            &a.mixes
        });
        let array = a.array.unwrap_or(p.array);
        let dram = a.dram.unwrap_or(p.dram);
        let min = zmem_region::MIN_BUDGET_BYTES;
        anyhow::ensure!(
            dram >= 2 * min,
            "--dram {} is below the smallest, {}",
            format_size(dram),
            format_size(2 * min)
        );
        let resident = a.resident.unwrap_or(dram / 2 / 4096 * 4096);
        anyhow::ensure!(
            resident >= min && resident + min <= dram,
            "--resident {} must leave at least {} of --dram {} to each of zmem's resident pages \
             and compressed pool",
            format_size(resident),
            format_size(min),
            format_size(dram)
        );
        let store_limit = a.store_limit.unwrap_or(dram - resident);
        anyhow::ensure!(
            store_limit >= min && resident + store_limit <= dram,
            "--store-limit {} must be at least {} and fit in --dram {} beside --resident {}",
            format_size(store_limit),
            format_size(min),
            format_size(dram),
            format_size(resident)
        );
        anyhow::ensure!(
            array > dram,
            "--array {} is not larger than --dram {}: nothing would leave DRAM",
            format_size(array),
            format_size(dram)
        );
        let workloads = unique(&a.workloads);
        anyhow::ensure!(!workloads.is_empty(), "--workloads needs a workload");
        if workloads.contains(&WorkloadKind::Objects) {
            for &s in &object_sizes {
                check_object_size(s)?;
                check_array(WorkloadKind::Objects, array, s)?;
            }
        }
        if workloads.contains(&WorkloadKind::Bloom) {
            check_array(WorkloadKind::Bloom, array, 0)?;
        }
        let ops = a.ops.unwrap_or(p.ops);
        anyhow::ensure!(ops >= 1, "--ops must be at least 1");
        let bloom_keys = a.bloom_keys.unwrap_or(p.bloom_keys);
        anyhow::ensure!(bloom_keys >= 1, "--bloom-keys must be at least 1");
        let disk_size = a.disk_size.unwrap_or(array + array / 2 + (64 << 20)) / 4096 * 4096;
        anyhow::ensure!(
            disk_size >= array + (16 << 20),
            "--disk-size {} cannot hold --array {} (at least the array and 16M)",
            format_size(disk_size),
            format_size(array)
        );
        let sides = unique(&a.sides);
        anyhow::ensure!(!sides.is_empty(), "--sides needs a side");
        anyhow::ensure!(a.repeat >= 1, "--repeat must be at least 1");
        anyhow::ensure!(
            a.timeout.is_finite() && a.timeout > 0.0,
            "--timeout must be a positive number of seconds, got {}",
            a.timeout
        );
        Ok(Plan {
            workloads,
            object_sizes,
            mixes,
            array,
            dram,
            resident,
            store_limit,
            ops,
            bloom_keys,
            content: a.content,
            dir: a.dir.clone(),
            disk_size,
            encrypt_cost: a.encrypt_cost,
            sides,
            repeat: a.repeat,
            seed: a.seed,
            timeout_s: a.timeout,
            quick: a.quick,
        })
    }

    /// Every workload of the run, in the report's order.
    pub fn cases(&self) -> Vec<Case> {
        let mut v = Vec::new();
        for &w in &self.workloads {
            match w {
                WorkloadKind::Objects => {
                    for &s in &self.object_sizes {
                        for &m in &self.mixes {
                            v.push(Case {
                                workload: w,
                                object_size: Some(s),
                                mix: Some(m),
                            });
                        }
                    }
                }
                WorkloadKind::Bloom => v.push(Case {
                    workload: w,
                    object_size: None,
                    mix: None,
                }),
            }
        }
        v
    }
}

/// `zmem bench ssd-worker`: one workload in this process, one JSON line on stdout.
#[derive(Debug, Clone, Args, Serialize)]
pub struct SsdWorkerArgs {
    #[arg(long, value_enum, default_value = "objects")]
    pub workload: WorkloadKind,
    /// Bytes of the object array or of the bloom filter's bits.
    #[arg(long, value_parser = parse_size, default_value = "1G")]
    pub array: u64,
    /// Bytes of an object (a multiple of 64 up to 1M).
    #[arg(long, value_parser = parse_size, default_value = "4k")]
    pub object_size: u64,
    /// Reads:writes: ro, wo, or READS:WRITES.
    #[arg(long, default_value = "80:20")]
    pub mix: Mix,
    /// Timed operations (objects), or keys (bloom: N inserts, N present and N absent queries).
    #[arg(long, default_value_t = 100_000)]
    pub ops: u64,
    #[arg(long, value_enum, default_value = "text")]
    pub content: Content,
    #[arg(long, default_value_t = SEED)]
    pub seed: u64,
    /// The side's name in the report.
    #[arg(long, default_value = "worker")]
    pub label: String,
    /// The memory cgroup this process was started in: it sets the limit to --dram above its
    /// own baseline, locked, before it allocates the workload (the kernel side).
    #[arg(long, requires = "dram")]
    pub cgroup: Option<PathBuf>,
    /// With --cgroup: the DRAM of the workload.
    #[arg(long, value_parser = parse_size)]
    pub dram: Option<u64>,
}

impl SsdWorkerArgs {
    /// The arguments' own errors.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.workload == WorkloadKind::Objects {
            check_object_size(self.object_size)?;
        }
        check_array(self.workload, self.array, self.object_size)?;
        anyhow::ensure!(self.ops >= 1, "--ops must be at least 1");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct P {
        #[command(flatten)]
        a: SsdArgs,
    }

    fn plan(args: &[&str]) -> anyhow::Result<Plan> {
        let mut v = vec!["x"];
        v.extend_from_slice(args);
        Plan::resolve(&P::try_parse_from(v).unwrap().a)
    }

    #[test]
    fn mixes_parse_and_print() {
        assert_eq!("ro".parse::<Mix>().unwrap(), Mix::RO);
        assert_eq!("wo".parse::<Mix>().unwrap(), Mix::WO);
        let m: Mix = "80:20".parse().unwrap();
        assert_eq!(m, Mix::RW80);
        assert!((m.read_fraction() - 0.8).abs() < 1e-12);
        assert_eq!(m.to_string(), "80:20");
        assert_eq!("1:0".parse::<Mix>().unwrap().to_string(), "ro");
        for bad in ["", "rw", "80", "0:0", "a:b", "-1:2", "80:20:1"] {
            assert!(bad.parse::<Mix>().is_err(), "{bad}");
        }
        let j = serde_json::to_string(&Mix::RW80).unwrap();
        assert_eq!(j, "\"80:20\"");
        assert_eq!(serde_json::from_str::<Mix>(&j).unwrap(), Mix::RW80);
    }

    #[test]
    fn presets_and_cases() {
        let p = plan(&[]).unwrap();
        assert_eq!(
            (p.array, p.dram, p.resident, p.store_limit),
            (2 << 30, 64 << 20, 32 << 20, 32 << 20)
        );
        assert_eq!(p.cases().len(), 3 * 3 + 1);
        assert_eq!(p.cases()[0].name(), "objects 256B ro");
        assert_eq!(p.cases()[9].name(), "bloom");
        assert_eq!(p.disk_size, (3 << 30) + (64 << 20));
        let q = plan(&["--quick", "--ops", "7"]).unwrap();
        assert_eq!(q.array, 512 << 20);
        assert_eq!(q.ops, 7);
        assert_eq!(q.cases().len(), 2 + 1);
        let r = plan(&["--resident", "48M", "--workloads", "bloom"]).unwrap();
        assert_eq!((r.resident, r.store_limit), (48 << 20, 16 << 20));
        assert_eq!(r.cases().len(), 1);
        // Room left in --dram for zmem's own tables.
        let e = plan(&["--resident", "16M", "--store-limit", "16M"]).unwrap();
        assert_eq!(
            (e.dram, e.resident, e.store_limit),
            (64 << 20, 16 << 20, 16 << 20)
        );
    }

    #[test]
    fn bad_plans_are_clear_errors() {
        let err = |a: &[&str]| format!("{:#}", plan(a).unwrap_err());
        assert!(err(&["--object-size", "100"]).contains("not a multiple of 64"));
        assert!(err(&["--object-size", "2M"]).contains("not a multiple of 64"));
        assert!(err(&["--array", "32M"]).contains("not larger than --dram"));
        assert!(err(&["--resident", "64M"]).contains("--resident"));
        assert!(err(&["--store-limit", "48M"]).contains("--store-limit"));
        assert!(err(&["--store-limit", "0"]).contains("--store-limit"));
        assert!(err(&["--dram", "64k"]).contains("--dram"));
        assert!(err(&["--ops", "0"]).contains("--ops"));
        assert!(err(&["--disk-size", "1G"]).contains("--disk-size"));
        assert!(err(&["--repeat", "0"]).contains("--repeat"));
        assert!(err(&["--timeout", "0"]).contains("--timeout"));
    }

    #[test]
    fn worker_checks() {
        #[derive(Parser)]
        struct W {
            #[command(flatten)]
            a: SsdWorkerArgs,
        }
        let w = |a: &[&str]| {
            let mut v = vec!["x"];
            v.extend_from_slice(a);
            W::try_parse_from(v).map(|w| w.a)
        };
        assert!(w(&["--array", "8M"]).unwrap().validate().is_ok());
        let e = w(&["--array", "100", "--object-size", "256"])
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("smaller than one object"), "{e}");
        assert!(w(&["--mix", "x"]).is_err());
        assert!(w(&["--cgroup", "/x"]).is_err(), "--cgroup needs --dram");
        assert!(w(&["--workload", "bloom", "--array", "1k"])
            .unwrap()
            .validate()
            .is_err());
    }
}
