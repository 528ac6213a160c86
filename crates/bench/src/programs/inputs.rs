//! Each program's input, generated deterministically (fixed seeds, no corpus) into the scratch
//! directory, and its command line. Why generated: the outputs of the three sides must be
//! byte-identical, and a run must be reproducible on any machine with the same package versions.
//! Sizes at scale 1 put the plain run's peak RSS at roughly 60-150 MiB and its time at 0.3-3 s on
//! a 2-core VM, several times the smallest default budget (16M).

use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::Context;
use rand::Rng;
use serde::Serialize;

use super::Program;

/// Seed of every generated input.
pub const SEED: u64 = 0x7072_6f67_7261_6d73;

/// How one program runs: its command line, its environment (on top of the bench's), its stdin.
#[derive(Clone, Debug, Serialize)]
pub struct Job {
    /// The built-in program's name, or the NAME of a `--command NAME=COMMAND`.
    pub program: String,
    /// The program's own command line (the zmem side puts `zmem run ... --` in front).
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    /// A file on stdin (else /dev/null).
    pub stdin: Option<PathBuf>,
    /// Bytes of generated input.
    pub input_bytes: u64,
    /// The first line of `--version`.
    pub version: String,
}

/// The program's executable: PATH searched; for python3 the interpreter itself
/// (`sys.executable`), not a wrapper such as pyenv's shim script, which would be measured too.
pub fn locate(p: Program) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    let found = std::env::split_paths(&path)
        .map(|d| d.join(p.binary()))
        .find(|f| is_executable(f))?;
    if !matches!(p, Program::Python | Program::Pylist) {
        return Some(found);
    }
    let out = Command::new(&found)
        .args(["-c", "import sys; print(sys.executable)"])
        .output()
        .ok()?;
    let exe = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    (out.status.success() && is_executable(&exe)).then_some(exe)
}

fn is_executable(f: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(f).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

fn version(bin: &Path) -> String {
    Command::new(bin)
        .arg("--version")
        .output()
        .ok()
        .map(|o| {
            let text = if o.stdout.is_empty() {
                o.stderr
            } else {
                o.stdout
            };
            // The first line that says something (perl's starts with an empty one).
            String::from_utf8_lossy(&text)
                .lines()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("")
                .trim()
                .to_string()
        })
        .unwrap_or_default()
}

fn scaled(n: f64, scale: f64) -> u64 {
    ((n * scale).round() as u64).max(1)
}

/// Writes `p`'s input into `dir` (scaled by `scale`) and returns how to run it.
pub fn prepare(p: Program, bin: &Path, dir: &Path, scale: f64) -> anyhow::Result<Job> {
    let bin_s = bin.display().to_string();
    let file = |name: &str| dir.join(format!("{}-{name}", p.name()));
    let mut env = vec![("LC_ALL".to_string(), "C".to_string())];
    let mut stdin = None;
    let (argv, input): (Vec<String>, PathBuf) = match p {
        Program::Sqlite => {
            let f = file("script.sql");
            write_sqlite(&f, scaled(1_000_000.0, scale))?;
            stdin = Some(f.clone());
            (vec![bin_s, "-batch".into(), ":memory:".into()], f)
        }
        Program::Sort => {
            let f = file("numbers.txt");
            write_numbers(&f, scaled(1_500_000.0, scale))?;
            env.push(("TMPDIR".into(), dir.display().to_string()));
            (vec![bin_s, "-n".into(), f.display().to_string()], f.clone())
        }
        Program::Jq => {
            let f = file("records.json");
            write_json_array(&f, scaled(120_000.0, scale))?;
            (
                vec![
                    bin_s,
                    "-c".into(),
                    "group_by(.k) | map({k: .[0].k, n: length, s: (map(.v) | add), \
                     t: (map(.tags[0]) | unique)})"
                        .into(),
                    f.display().to_string(),
                ],
                f.clone(),
            )
        }
        Program::Xz => {
            let f = file("log.txt");
            write_log(&f, scaled(5_500_000.0, scale))?;
            (
                vec![
                    bin_s,
                    "-6".into(),
                    "-T1".into(),
                    "-c".into(),
                    f.display().to_string(),
                ],
                f.clone(),
            )
        }
        Program::Gcc => {
            let f = file("unit.c");
            write_c(&f, scaled(350.0, scale))?;
            (
                vec![
                    bin_s,
                    "-O2".into(),
                    "-S".into(),
                    "-pipe".into(),
                    "-o".into(),
                    "-".into(),
                    f.display().to_string(),
                ],
                f.clone(),
            )
        }
        Program::Python => {
            // python's own allocator (pymalloc): its arenas are mmap'd, which zmem serves from
            // the map space like the heap.
            env.push(("PYTHONHASHSEED".into(), "0".into()));
            env.push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
            script(
                bin_s,
                &file("dicts.py"),
                PYTHON_SCRIPT,
                scaled(250_000.0, scale),
            )?
        }
        Program::Pylist => {
            env.push(("PYTHONDONTWRITEBYTECODE".into(), "1".into()));
            script(
                bin_s,
                &file("list.py"),
                PYLIST_SCRIPT,
                scaled(12_000_000.0, scale),
            )?
        }
        Program::Perl => {
            // A fixed hash order, so that every run prints the same.
            env.push(("PERL_HASH_SEED".into(), "0".into()));
            env.push(("PERL_PERTURB_KEYS".into(), "0".into()));
            script(
                bin_s,
                &file("hashes.pl"),
                PERL_SCRIPT,
                scaled(300_000.0, scale),
            )?
        }
        Program::Node => script(
            bin_s,
            &file("objects.js"),
            NODE_SCRIPT,
            scaled(400_000.0, scale),
        )?,
        Program::Rustc => {
            let f = file("unit.rs");
            write_rust(&f, scaled(300.0, scale))?;
            // rustc's temporary directories go with the inputs.
            env.push(("TMPDIR".into(), dir.display().to_string()));
            (
                vec![
                    bin_s,
                    "-O".into(),
                    "--crate-type=lib".into(),
                    "--emit=asm=-".into(),
                    f.display().to_string(),
                ],
                f.clone(),
            )
        }
    };
    let input_bytes = std::fs::metadata(&input).map(|m| m.len()).unwrap_or(0);
    Ok(Job {
        program: p.name().to_string(),
        argv,
        env,
        stdin,
        input_bytes,
        version: version(bin),
    })
}

/// How a `--command NAME=COMMAND` runs: `sh -c COMMAND` in the directory the bench was
/// started from (its paths are the user's), in the user's environment (locale included: a
/// `sort` in a UTF-8 locale takes another path than under LC_ALL=C, and that path found a bug
/// the C locale hid), with nothing on stdin. No version is asked for: the user's program is
/// never run with arguments it was not given.
pub fn command_job(c: &super::NamedCommand) -> Job {
    Job {
        program: c.name.clone(),
        argv: vec!["/bin/sh".into(), "-c".into(), c.line.clone()],
        env: Vec::new(),
        stdin: None,
        input_bytes: 0,
        version: String::new(),
    }
}

/// Writes `text` into `f` and runs it as `bin f n`: the argv and the input file.
fn script(bin: String, f: &Path, text: &str, n: u64) -> anyhow::Result<(Vec<String>, PathBuf)> {
    std::fs::write(f, text).with_context(|| format!("writing {}", f.display()))?;
    Ok((
        vec![bin, f.display().to_string(), n.to_string()],
        f.to_path_buf(),
    ))
}

fn create(f: &Path) -> anyhow::Result<BufWriter<std::fs::File>> {
    let file = std::fs::File::create(f).with_context(|| format!("creating {}", f.display()))?;
    Ok(BufWriter::with_capacity(1 << 20, file))
}

fn finish(mut w: BufWriter<std::fs::File>, f: &Path) -> anyhow::Result<()> {
    w.flush()
        .with_context(|| format!("writing {}", f.display()))
}

/// A table of `rows` generated rows in the database, an index, a GROUP BY and a range count.
fn write_sqlite(f: &Path, rows: u64) -> anyhow::Result<()> {
    let script = format!(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, k INTEGER, name TEXT, v REAL);\n\
         WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < {rows})\n\
         INSERT INTO t SELECT x, (x * 7919) % 5000, printf('n%08x-%04d', (x * 2654435761) % 4294967296, x % 9973), (x % 977) * 1.5 FROM c;\n\
         CREATE INDEX t_k ON t(k, name);\n\
         SELECT k, count(*), sum(v), min(name), max(name) FROM t GROUP BY k ORDER BY k;\n\
         SELECT count(*), sum(length(name)) FROM t WHERE name > 'n8';\n"
    );
    std::fs::write(f, script).with_context(|| format!("writing {}", f.display()))
}

/// `n` lines of random numbers below 10^12.
fn write_numbers(f: &Path, n: u64) -> anyhow::Result<()> {
    let mut rng = zmem_workload::std_rng(SEED);
    let mut w = create(f)?;
    for _ in 0..n {
        writeln!(w, "{}", rng.random_range(0..1_000_000_000_000u64))?;
    }
    finish(w, f)
}

/// A JSON array of `n` small objects.
fn write_json_array(f: &Path, n: u64) -> anyhow::Result<()> {
    let mut rng = zmem_workload::std_rng(SEED + 1);
    let mut w = create(f)?;
    w.write_all(b"[")?;
    for i in 0..n {
        if i > 0 {
            w.write_all(b",")?;
        }
        write!(
            w,
            "{{\"id\":{i},\"k\":\"key{}\",\"v\":{},\"tags\":[\"t{}\",\"u{}\"],\"ok\":{}}}",
            (i * 7919) % 1000,
            rng.random_range(0..1_000_000u32),
            i % 7,
            i % 13,
            rng.random_bool(0.9)
        )?;
    }
    w.write_all(b"]\n")?;
    finish(w, f)
}

/// `bytes` of log lines (compressible like real logs).
fn write_log(f: &Path, bytes: u64) -> anyhow::Result<()> {
    const LEVELS: [&str; 4] = ["INFO", "WARN", "DEBUG", "ERROR"];
    const SERVICES: [&str; 5] = ["auth", "db", "cache", "web", "queue"];
    let mut rng = zmem_workload::std_rng(SEED + 2);
    let mut w = create(f)?;
    let (mut n, mut i) = (0u64, 0u64);
    while n < bytes {
        let line = format!(
            "2024-01-{:02} 12:{:02}:{:02} {} [{}] request id={i} user=u{} took {} ms status={}\n",
            i / 100_000 % 28 + 1,
            i / 1000 % 60,
            i % 60,
            LEVELS[rng.random_range(0..4)],
            SERVICES[rng.random_range(0..5)],
            rng.random_range(0..5000u32),
            rng.random_range(0..1000u32),
            if rng.random_bool(0.9) { 200 } else { 500 }
        );
        w.write_all(line.as_bytes())?;
        n += line.len() as u64;
        i += 1;
    }
    finish(w, f)
}

/// A C file of `n` functions with loops, switches, tables and inlinable helpers.
fn write_c(f: &Path, n: u64) -> anyhow::Result<()> {
    let mut w = create(f)?;
    for i in 0..n {
        writeln!(
            w,
            "static inline int h{i}(int a, int b) {{ return (a >> {}) + b * {}; }}",
            i % 5,
            i % 11 + 1
        )?;
    }
    for i in 0..n {
        let tab: Vec<String> = (0..64)
            .map(|j| ((i * j * 7919) % 1000).to_string())
            .collect();
        let prev = i.saturating_sub(1);
        writeln!(
            w,
            "static int tab{i}[64] = {{ {} }};\n\
             int f{i}(int *a, int n, int s) {{\n\
             \x20   int acc = {i};\n\
             \x20   for (int j = 0; j < n; j++) {{\n\
             \x20       acc += a[j] * tab{i}[(j + s) & 63];\n\
             \x20       if (acc > {}) acc ^= a[(j * 3) % n] + h{prev}(acc, j);\n\
             \x20       switch ((acc + j) & 7) {{\n\
             \x20       case 0: acc += 3; break;\n\
             \x20       case 1: acc -= s; break;\n\
             \x20       case 2: acc *= 5; break;\n\
             \x20       case 3: acc ^= j; break;\n\
             \x20       default: acc += tab{i}[j & 63];\n\
             \x20       }}\n\
             \x20   }}\n\
             \x20   return acc;\n\
             }}",
            tab.join(", "),
            i * 100 + 7
        )?;
    }
    finish(w, f)
}

/// A Rust library of `n` public functions over a map of vectors (generics, formatting, iterators:
/// rustc's type checking and LLVM's optimisation both have work).
fn write_rust(f: &Path, n: u64) -> anyhow::Result<()> {
    let mut w = create(f)?;
    writeln!(w, "use std::collections::HashMap;")?;
    for i in 0..n {
        writeln!(
            w,
            "pub fn f{i}(m: &mut HashMap<String, Vec<u64>>, x: u64) -> u64 {{\n\
             \x20   let k = format!(\"k{i}-{{}}\", x % 17);\n\
             \x20   let v = m.entry(k).or_default();\n\
             \x20   v.push(x.wrapping_mul({}));\n\
             \x20   match x % 5 {{\n\
             \x20       0 => v.iter().sum(),\n\
             \x20       1 => v.len() as u64 + {i},\n\
             \x20       2 => v.iter().max().copied().unwrap_or({i}),\n\
             \x20       3 => x ^ {i},\n\
             \x20       _ => v.first().copied().unwrap_or(0),\n\
             \x20   }}\n\
             }}",
            i + 3
        )?;
    }
    finish(w, f)
}

/// Builds a dict of N entries (tuples, strings, lists), walks it, groups it, prints a digest.
const PYTHON_SCRIPT: &str = r#"import sys
n = int(sys.argv[1])
d = {}
for i in range(n):
    d['key%d' % i] = (i, str(i * 7919 % 100003), [i % 7, i % 13])
tot = 0
for k, v in d.items():
    tot += v[0] * v[2][0]
groups = {}
for k, v in d.items():
    groups.setdefault(v[1][:3], []).append(v[0])
print(len(d), tot, len(groups), sum(len(g) for g in groups.values()))
for g in sorted(groups):
    print(g, len(groups[g]), sum(groups[g]) % 1000003)
"#;

/// Perl: a hash of `n` records (strings and array refs), walked twice, then grouped.
const PERL_SCRIPT: &str = r#"use strict; use warnings;
my $n = shift;
my %h;
for my $i (0 .. $n - 1) {
    $h{"key$i"} = [$i, "" . ($i * 7919 % 100003), "v" x ($i % 40), [$i % 7, $i % 13]];
}
my $tot = 0;
for my $k (sort keys %h) { $tot += $h{$k}[0] * $h{$k}[3][0]; }
my %g;
for my $k (keys %h) { push @{ $g{substr($h{$k}[1], 0, 3)} }, $h{$k}[0]; }
my $m = 0; $m += scalar @{ $g{$_} } for keys %g;
print scalar(keys %h), " $tot ", scalar(keys %g), " $m\n";
for my $k (sort keys %g) { my $s = 0; $s += $_ for @{ $g{$k} }; print "$k ", scalar @{ $g{$k} }, " ", $s % 1000003, "\n"; }
"#;

/// node: `n` objects in a Map and an array (V8's heap: node maps it itself), walked, grouped
/// and sorted.
/// Small ints are shared objects: only the list's array of pointers grows (by realloc).
const PYLIST_SCRIPT: &str = r#"import sys
n = int(sys.argv[1])
l = []
for i in range(n):
    l.append(i & 255)
print(len(l), sum(l), l[n // 3], l[-1])
"#;

const NODE_SCRIPT: &str = r#"const n = parseInt(process.argv[2], 10);
const m = new Map();
const all = [];
for (let i = 0; i < n; i++) {
  const o = { id: i, name: 'n' + ((i * 2654435761) % 4294967296).toString(16), tags: [i % 7, i % 13], pad: 'x'.repeat(i % 50) };
  m.set('key' + i, o);
  all.push(o);
}
let tot = 0;
for (const [k, o] of m) tot += o.id * o.tags[0];
const groups = new Map();
for (const o of all) {
  const g = o.name.slice(0, 3);
  if (!groups.has(g)) groups.set(g, []);
  groups.get(g).push(o.id);
}
all.sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : a.id - b.id));
console.log(m.size, tot, groups.size, all[0].id, all[n - 1].id);
for (const g of [...groups.keys()].sort()) {
  const ids = groups.get(g);
  console.log(g, ids.length, ids.reduce((s, x) => (s + x) % 1000003, 0));
}
"#;
