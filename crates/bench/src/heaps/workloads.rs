//! The programs whose heaps `bench heaps` captures, each holding real data built from a corpus
//! (Silesia: Dickens's text, a tar of XML documents, the Samba source tree): redis loaded
//! through its socket, and Python, Node and a JVM running a workload script shipped in this
//! crate. Each is started, loaded until it says it is ready, and stopped by the PID started.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::prelude::IndexedRandom;
use rand::{Rng, SeedableRng};

use crate::process::kill_and_reap;

/// The programs, in the order they run.
pub const PROGRAMS: [&str; 4] = ["redis", "python", "node", "java"];

/// How long a program may take to load its data.
const READY_TIMEOUT: Duration = Duration::from_secs(300);

/// The line a workload script prints once its data is built.
const READY: &str = "zmem-heap-ready";

const PYTHON: &str = include_str!("workload.py");
const NODE: &str = include_str!("workload.js");
const JAVA: &str = include_str!("HeapWorkload.java");

/// A started program, killed (by the PID started) and reaped on drop.
pub struct Running {
    child: Child,
    /// What it printed when ready, or how it was loaded.
    pub note: String,
    /// The command line, for the report.
    pub command: String,
}

impl Running {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        kill_and_reap(&mut self.child);
    }
}

/// Starts `program` with data built from `corpus` (scaled by `scale`) and returns once it holds
/// it. Work files go to `scratch`. A program that is not installed is [`Missing`].
pub fn start(program: &str, corpus: &Path, scale: f64, scratch: &Path) -> anyhow::Result<Running> {
    // The interpreter, and the workload script it runs (written into `scratch`). Java's
    // single-file source launcher compiles in memory: the JVM runs in the process started.
    let (exe, name, text) = match program {
        "python" => ("python3", "workload.py", PYTHON),
        "node" => ("node", "workload.js", NODE),
        "java" => ("java", "HeapWorkload.java", JAVA),
        "redis" => return redis(corpus, scale, scratch),
        other => anyhow::bail!("unknown program {other:?} (known: {})", PROGRAMS.join(", ")),
    };
    let script = scratch.join(name);
    std::fs::write(&script, text).with_context(|| format!("writing {}", script.display()))?;
    let args = [
        script.display().to_string(),
        corpus.display().to_string(),
        format!("{scale}"),
    ];
    scripted(exe, &args, scratch)
}

/// A program that is not installed: the benchmark skips it with this reason.
#[derive(Debug, thiserror::Error)]
#[error("{0} is not installed (not found on PATH)")]
pub struct Missing(pub String);

fn spawn(cmd: &mut Command, exe: &str, scratch: &Path) -> anyhow::Result<Child> {
    let log = scratch.join(format!("{exe}.stderr"));
    let err = std::fs::File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    match cmd.stderr(err).spawn() {
        Ok(c) => Ok(c),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(Missing(exe.into()).into()),
        Err(e) => Err(e).with_context(|| format!("starting {exe}")),
    }
}

/// The last lines of what `exe` wrote to its stderr file, on one line for an error message.
fn stderr_tail(exe: &str, scratch: &Path) -> String {
    let text = std::fs::read_to_string(scratch.join(format!("{exe}.stderr"))).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    match &lines[lines.len().saturating_sub(4)..] {
        [] => "nothing on stderr".into(),
        tail => format!("stderr: {}", tail.join(" | ")),
    }
}

/// Runs a workload script and waits for its ready line (stdin stays open: closing it ends it).
fn scripted(exe: &str, args: &[String], scratch: &Path) -> anyhow::Result<Running> {
    let mut cmd = Command::new(exe);
    cmd.args(args).stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = spawn(&mut cmd, exe, scratch)?;
    let stdout = child.stdout.take().context("the child's stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let command = format!("{exe} {}", args.join(" "));
    let t0 = Instant::now();
    loop {
        crate::abort::check_abort()?;
        match rx.recv_timeout(Duration::from_millis(200)) {
            Ok(line) if line.starts_with(READY) => {
                return Ok(Running {
                    child,
                    note: line,
                    command,
                });
            }
            Ok(_) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().ok();
                anyhow::bail!(
                    "{command} ended before it was ready ({}; {})",
                    status.map_or("no status".into(), crate::process::describe_status),
                    stderr_tail(exe, scratch)
                );
            }
            Err(mpsc::RecvTimeoutError::Timeout) if t0.elapsed() > READY_TIMEOUT => {
                kill_and_reap(&mut child);
                anyhow::bail!("{command} was not ready within {READY_TIMEOUT:?}");
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
    }
}

/// redis-server on a Unix socket in `scratch` (no TCP port, no persistence), loaded with
/// hashes, strings, lists, a sorted set and sets built from the corpus.
fn redis(corpus: &Path, scale: f64, scratch: &Path) -> anyhow::Result<Running> {
    let sock = scratch.join("redis.sock");
    let args = [
        "--port".to_string(),
        "0".into(),
        "--unixsocket".into(),
        sock.display().to_string(),
        "--save".into(),
        String::new(),
        "--appendonly".into(),
        "no".into(),
    ];
    let mut cmd = Command::new("redis-server");
    cmd.args(&args).stdin(Stdio::null()).stdout(Stdio::null());
    let child = spawn(&mut cmd, "redis-server", scratch)?;
    let mut running = Running {
        child,
        note: String::new(),
        command: format!("redis-server {}", args.join(" ")),
    };
    let t0 = Instant::now();
    let stream = loop {
        match UnixStream::connect(&sock) {
            Ok(s) => break s,
            Err(_) if t0.elapsed() < Duration::from_secs(20) => {
                if let Ok(Some(st)) = running.child.try_wait() {
                    anyhow::bail!(
                        "redis-server {} ({})",
                        crate::process::describe_status(st),
                        stderr_tail("redis-server", scratch)
                    );
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => {
                return Err(e).with_context(|| format!("connecting to {}", sock.display()));
            }
        }
    };
    let commands = redis_load(corpus, scale, stream)?;
    running.note = format!("{commands} commands");
    Ok(running)
}

/// Reads a corpus file whole.
fn read(corpus: &Path, name: &str) -> anyhow::Result<Vec<u8>> {
    let p = corpus.join(name);
    std::fs::read(&p).with_context(|| format!("reading {}", p.display()))
}

/// Sends the data set to redis, pipelined; the number of commands. Every reply is checked.
fn redis_load(corpus: &Path, scale: f64, stream: UnixStream) -> anyhow::Result<u64> {
    let text = String::from_utf8_lossy(&read(corpus, "dickens")?).into_owned();
    let words: Vec<&str> = text
        .split(|c: char| !c.is_ascii_alphabetic() && c != '\'')
        .filter(|w| !w.is_empty())
        .collect();
    let mut vocabulary: Vec<String> = words.iter().map(|w| w.to_lowercase()).collect();
    vocabulary.sort_unstable();
    vocabulary.dedup();
    let sentences: Vec<&str> = text
        .split_inclusive(['.', '!', '?'])
        .map(str::trim)
        .filter(|s| s.len() > 20)
        .collect();
    let samba = read(corpus, "samba")?;
    anyhow::ensure!(
        !vocabulary.is_empty() && !sentences.is_empty() && samba.len() > 4096,
        "corpus {} lacks text to load redis with (dickens, samba)",
        corpus.display()
    );
    let n = |base: f64| ((base * scale) as u64).max(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0x7a6d_656d);
    let mut out = RespWriter::new(stream)?;
    for i in 0..n(150_000.0) {
        let bio = sentences.choose(&mut rng).expect("sentences");
        out.command(&[
            b"HSET",
            format!("user:{i}").as_bytes(),
            b"name",
            vocabulary.choose(&mut rng).expect("words").as_bytes(),
            b"email",
            format!(
                "{}{i}@example.org",
                vocabulary.choose(&mut rng).expect("words")
            )
            .as_bytes(),
            b"score",
            format!("{:.3}", rng.random::<f64>() * 100.0).as_bytes(),
            b"visits",
            rng.random_range(1..10_000u32).to_string().as_bytes(),
            b"bio",
            &bio.as_bytes()[..bio.len().min(160)],
        ])?;
    }
    for i in 0..n(25_000.0) {
        let len = rng.random_range(512..4096usize);
        let at = rng.random_range(0..samba.len() - len);
        out.command(&[b"SET", format!("file:{i}").as_bytes(), &samba[at..at + len]])?;
    }
    for i in 0..n(5_000.0) {
        let mut cmd: Vec<Vec<u8>> = vec![b"RPUSH".to_vec(), format!("log:{i}").into_bytes()];
        for _ in 0..20 {
            let s = sentences.choose(&mut rng).expect("sentences");
            cmd.push(s.as_bytes()[..s.len().min(200)].to_vec());
        }
        let refs: Vec<&[u8]> = cmd.iter().map(Vec::as_slice).collect();
        out.command(&refs)?;
    }
    for i in 0..n(100_000.0) {
        out.command(&[
            b"ZADD",
            b"rank",
            rng.random_range(0..1_000_000u32).to_string().as_bytes(),
            format!("{}:{i}", vocabulary.choose(&mut rng).expect("words")).as_bytes(),
        ])?;
    }
    for i in 0..n(200_000.0) {
        let tag = &vocabulary[rng.random_range(0..vocabulary.len().min(2000))];
        out.command(&[
            b"SADD",
            format!("tag:{tag}").as_bytes(),
            format!("user:{i}").as_bytes(),
        ])?;
    }
    out.finish()
}

/// Pipelined RESP commands over a socket: sent in batches, every reply read and checked.
struct RespWriter {
    w: std::io::BufWriter<UnixStream>,
    r: BufReader<UnixStream>,
    in_flight: u64,
    sent: u64,
}

const BATCH: u64 = 512;

impl RespWriter {
    fn new(s: UnixStream) -> anyhow::Result<RespWriter> {
        s.set_read_timeout(Some(Duration::from_secs(60)))?;
        Ok(RespWriter {
            r: BufReader::new(s.try_clone().context("cloning the redis socket")?),
            w: std::io::BufWriter::with_capacity(1 << 16, s),
            in_flight: 0,
            sent: 0,
        })
    }

    fn command(&mut self, args: &[&[u8]]) -> anyhow::Result<()> {
        write!(self.w, "*{}\r\n", args.len())?;
        for a in args {
            write!(self.w, "${}\r\n", a.len())?;
            self.w.write_all(a)?;
            self.w.write_all(b"\r\n")?;
        }
        self.in_flight += 1;
        self.sent += 1;
        if self.in_flight >= BATCH {
            self.drain()?;
        }
        Ok(())
    }

    /// Reads the replies of every command sent: each one line, '+' or ':' (an error fails).
    fn drain(&mut self) -> anyhow::Result<()> {
        self.w.flush().context("sending to redis")?;
        let mut line = Vec::new();
        while self.in_flight > 0 {
            line.clear();
            let n = self
                .r
                .by_ref()
                .take(1 << 16)
                .read_until(b'\n', &mut line)
                .context("reading redis's reply")?;
            anyhow::ensure!(n > 0, "redis closed the connection");
            match line.first() {
                Some(b'+') | Some(b':') => {}
                _ => anyhow::bail!(
                    "redis answered {:?}",
                    String::from_utf8_lossy(&line).trim_end()
                ),
            }
            self.in_flight -= 1;
        }
        Ok(())
    }

    fn finish(mut self) -> anyhow::Result<u64> {
        self.drain()?;
        Ok(self.sent)
    }
}
