//! `zmem bench programs`: the thrashing comparison (issue 10 item 6). Real programs (sqlite3 on
//! an in-memory database, sort, jq, xz, gcc, python3 twice, perl, node, rustc) run three ways at the
//! same DRAM: plain (no limit, the reference), under `zmem run --resident B` (their malloc heap
//! compressed in user space) and under the kernel (a cgroup v1 memory cgroup limited to B with
//! /dev/zram0 as lz4 swap). Every output must be byte-identical to the plain run's; wall time,
//! CPU and major faults are reported side by side (medians over `--repeat` runs) as a table,
//! JSON and an SVG chart.
//!
//! Why real programs: the synthetic benchmarks (`bench region`, `bench redis`) measure one access
//! pattern each; these programs bring their own allocators' habits (sort's one big buffer, xz's
//! hash chains, jq's and python's many small objects, sqlite's page cache, cc1's arenas) and say
//! whether zmem thrashes more or less than the kernel when the heap does not fit.
//!
//! Where the DRAM is counted: zmem's budget B covers the malloc heap and the program's own
//! anonymous mappings (the map space; the compressed pool, stacks and the rest of the process
//! are outside it, like zram's memory is outside the cgroup); the
//! kernel's limit B covers every page the program charges (heap, stack, other anonymous memory,
//! page cache it reads first). The inputs are written by the bench before the runs, so their page
//! cache is charged to the bench, not to the cgroup. Both sides' peak RSS is in the JSON.
//!
//! The heap's footprint both ways (issue 10 item 5): "heap plain" is the plain run's resident
//! anonymous memory at its most (sampled every 10 ms: the heap under the program's own
//! allocator, with its stacks), "heap zmem" zmem's peak heap data (resident + evicted, under
//! zmem's allocator, mimalloc). Where zmem's is larger, zmem has more to keep in the same
//! budget than the kernel has (DESIGN-NOTES, "The heap's footprint: mimalloc's size classes").
//! Both are of the process the bench started (gcc: the driver, not cc1).
//!
//! Modules: [`inputs`] (the deterministic inputs and command lines), [`run`] (one execution with
//! its output compared, the kernel side's guards, the loop), [`report`] (medians, the table, the
//! JSON, the chart).

pub mod inputs;
pub mod report;
pub mod run;

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;
use zmem_runenv::size::parse_size;

/// The programs the bench knows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Program {
    /// sqlite3 on :memory:: a table of ~1M generated rows, an index, a GROUP BY.
    Sqlite,
    /// GNU sort -n of ~1.5M numbers.
    Sort,
    /// jq group_by over a JSON array of ~120k objects.
    Jq,
    /// xz -6 -T1 of ~5.5 MB of log text.
    Xz,
    /// gcc -O2 -S of a generated C file of ~350 functions.
    Gcc,
    /// python3 building and grouping a dict of ~250k entries (its own allocator, pymalloc).
    Python,
    /// python3 appending ~12M entries to one list: its array of pointers (96 MB) grows by
    /// realloc, which glibc answers with mremap and zmem by moving the block's pages.
    Pylist,
    /// perl building, sorting and grouping a hash of ~300k records.
    Perl,
    /// node building, grouping and sorting ~400k objects (V8's heap, which node maps itself).
    Node,
    /// rustc -O of a generated library of ~300 functions, assembly to stdout (jemalloc, which
    /// rustc exports from its executable, serves it: not zmem's allocator).
    Rustc,
}

/// Every program, in the order of the report.
pub const ALL: [Program; 10] = [
    Program::Sqlite,
    Program::Sort,
    Program::Jq,
    Program::Xz,
    Program::Gcc,
    Program::Python,
    Program::Pylist,
    Program::Perl,
    Program::Node,
    Program::Rustc,
];

impl Program {
    pub fn name(self) -> &'static str {
        match self {
            Program::Sqlite => "sqlite",
            Program::Sort => "sort",
            Program::Jq => "jq",
            Program::Xz => "xz",
            Program::Gcc => "gcc",
            Program::Python => "python",
            Program::Pylist => "pylist",
            Program::Perl => "perl",
            Program::Node => "node",
            Program::Rustc => "rustc",
        }
    }

    /// The executable looked up in PATH.
    pub fn binary(self) -> &'static str {
        match self {
            Program::Sqlite => "sqlite3",
            Program::Sort => "sort",
            Program::Jq => "jq",
            Program::Xz => "xz",
            Program::Gcc => "gcc",
            Program::Python | Program::Pylist => "python3",
            Program::Perl => "perl",
            Program::Node => "node",
            Program::Rustc => "rustc",
        }
    }

    /// The Debian package that installs it.
    pub fn package(self) -> &'static str {
        match self {
            Program::Sqlite => "sqlite3",
            Program::Sort => "coreutils",
            Program::Jq => "jq",
            Program::Xz => "xz-utils",
            Program::Gcc => "gcc",
            Program::Python | Program::Pylist => "python3",
            Program::Perl => "perl",
            Program::Node => "nodejs",
            Program::Rustc => "rustc",
        }
    }
}

/// A program of the user's: `--command NAME=COMMAND`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NamedCommand {
    /// What the report calls it (letters, digits, `-`, `_`, `.`).
    pub name: String,
    /// The shell line (`sh -c`).
    pub line: String,
}

/// Parses `NAME=COMMAND`.
pub fn parse_named_command(s: &str) -> Result<NamedCommand, String> {
    let (name, line) = s
        .split_once('=')
        .ok_or_else(|| format!("expected NAME=COMMAND (e.g. 'xz6=xz -6 -c data'), got {s:?}"))?;
    let name = name.trim();
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err(format!(
            "the NAME of NAME=COMMAND must be letters, digits, '-', '_' or '.', got {name:?}"
        ));
    }
    if line.trim().is_empty() {
        return Err(format!("--command {name}= has no command"));
    }
    Ok(NamedCommand {
        name: name.to_string(),
        line: line.to_string(),
    })
}

/// Default budgets of `--resident`.
pub const DEFAULT_RESIDENT: &str = "16M,64M";

#[derive(Debug, Clone, Args, Serialize)]
pub struct ProgramsArgs {
    /// DRAM budgets, one or several (comma-separated, e.g. 16M,32M,64M): zmem's --resident and
    /// the kernel side's cgroup memory limit.
    #[arg(long, value_parser = parse_size, value_delimiter = ',', default_value = DEFAULT_RESIDENT)]
    pub resident: Vec<u64>,
    /// Runs of each program per side and budget; the report gives medians.
    #[arg(long, default_value_t = 3)]
    pub repeat: u32,
    /// The programs to run (comma-separated) [default: all].
    #[arg(long, value_enum, value_delimiter = ',')]
    pub programs: Vec<Program>,
    /// A program of your own, run the same three ways as the built-in ones (repeatable):
    /// NAME=COMMAND, the command a shell line (`sh -c`, from the current directory) whose
    /// stdout must be the same on every run, e.g. `--command 'xz6=xz -6 -T2 -c data.tar'`.
    /// Given without --programs, only these commands run. Times, faults and evictions cover
    /// every process of the line; the heap columns are the shell's (a line of one simple
    /// command is exec'd by sh: then they are that program's).
    #[arg(long = "command", value_name = "NAME=COMMAND", value_parser = parse_named_command)]
    pub commands: Vec<NamedCommand>,
    /// Run plain and zmem only (no root needed): no cgroup, no zram.
    #[arg(long)]
    pub no_kernel: bool,
    /// zram algorithm of the kernel side.
    #[arg(long, default_value = "lz4")]
    pub zram_alg: String,
    /// Who serves the zmem side's faults (`zmem run --fault-route`): auto (zmem run's default:
    /// signal as root), handler (a zmem thread) or signal (the faulting thread, with the
    /// syscall guard).
    #[arg(long, default_value = "auto", value_parser = crate::RUN_FAULT_ROUTES)]
    pub fault_route: String,
    /// The zmem side serves every heap block from mimalloc (`zmem run --no-exact-fit`), to
    /// measure what the exact-fit allocator of mid-size blocks changes.
    #[arg(long)]
    pub no_exact_fit: bool,
    /// The zmem side's `zmem run --start-at` (heap a process the command execs reaches before
    /// zmem starts in it; 0: every process at once), to measure what the late start changes.
    #[arg(long, value_name = "SIZE")]
    pub start_at: Option<String>,
    /// A run taking longer than this (seconds) is killed and reported as a timeout.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// JSON output.
    #[arg(long, default_value = "bench-out/programs.json")]
    pub json: PathBuf,
    /// SVG chart output.
    #[arg(long, default_value = "bench-out/programs.svg")]
    pub plot: PathBuf,
    /// Input size factor (tests use small inputs).
    #[arg(long, default_value_t = 1.0, hide = true)]
    pub scale: f64,
}

impl ProgramsArgs {
    /// The arguments' own errors (before anything runs).
    pub fn validate(&self) -> anyhow::Result<()> {
        anyhow::ensure!(self.repeat >= 1, "--repeat must be at least 1");
        anyhow::ensure!(!self.resident.is_empty(), "--resident needs a budget");
        for &r in &self.resident {
            anyhow::ensure!(
                r >= zmem_region::MIN_BUDGET_BYTES,
                "--resident {} is below the smallest budget, {}",
                zmem_runenv::size::format_size(r),
                zmem_runenv::size::format_size(zmem_region::MIN_BUDGET_BYTES)
            );
        }
        anyhow::ensure!(
            self.scale > 0.0 && self.scale <= 20.0,
            "--scale must be in (0, 20], got {}",
            self.scale
        );
        for (i, c) in self.commands.iter().enumerate() {
            anyhow::ensure!(
                !ALL.iter().any(|p| p.name() == c.name),
                "--command {}=...: {} is a built-in program's name (use --programs {} for it, \
                 or another name)",
                c.name,
                c.name,
                c.name
            );
            anyhow::ensure!(
                !self.commands[..i].iter().any(|o| o.name == c.name),
                "--command {}=... is given twice",
                c.name
            );
        }
        anyhow::ensure!(
            self.timeout > 0.0,
            "--timeout must be positive, got {}",
            self.timeout
        );
        Ok(())
    }

    /// The programs asked for, each once, in the report's order.
    pub fn selected(&self) -> Vec<Program> {
        if self.programs.is_empty() && !self.commands.is_empty() {
            return Vec::new();
        }
        if self.programs.is_empty() {
            return ALL.to_vec();
        }
        ALL.into_iter()
            .filter(|p| self.programs.contains(p))
            .collect()
    }

    /// The budgets, ascending, each once.
    pub fn budgets(&self) -> Vec<u64> {
        let mut v = self.resident.clone();
        v.sort_unstable();
        v.dedup();
        v
    }
}
