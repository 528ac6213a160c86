//! `zmem demo redis`: `zmem run` on a real program. Starts Debian's redis-server under
//! `zmem run --resident 32M`, stores `--data` bytes of corpus text in it, reads every value back
//! and checks it, shows the live statistics (`zmem stat`) and stops the server: the program holds
//! several times the DRAM its heap is allowed, unchanged.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use zmem_bench::corpus::Corpus;
use zmem_bench::redis::command;

use crate::size::format_size_approx as human;
use crate::stat::{query, table};

/// Values of about 4000 bytes, so jemalloc/mimalloc size classes do not inflate the ratio.
const VALUE: usize = 4000;
const PIPELINE: usize = 64;

/// The server, stopped by its PID (SIGTERM, then SIGKILL) when dropped.
struct Guard(Child);

impl Drop for Guard {
    fn drop(&mut self) {
        let pid = self.0.id() as i32;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(10) {
            if let Ok(Some(_)) = self.0.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn value(corpus: &Corpus, i: u64, buf: &mut Vec<u8>) {
    buf.resize(VALUE - (i % 97) as usize, 0);
    corpus.fill(i.wrapping_mul(7919 * 4001) % corpus.len(), buf);
}

fn read_reply(
    r: &mut BufReader<TcpStream>,
    line: &mut String,
    data: &mut Vec<u8>,
) -> anyhow::Result<()> {
    line.clear();
    r.read_line(line)?;
    match line.as_bytes().first() {
        Some(b'+') => {
            data.clear();
            Ok(())
        }
        Some(b'$') => {
            let n: usize = line[1..].trim().parse().context("bad bulk length")?;
            data.resize(n + 2, 0);
            r.read_exact(data)?;
            data.truncate(n);
            Ok(())
        }
        _ => bail!("redis answered {:?}", line.trim()),
    }
}

pub fn run(corpus: &Corpus, resident: u64, data: u64, policy: &str) -> anyhow::Result<()> {
    let server = crate::run::resolve(&"redis-server".into()).map_err(|_| {
        anyhow::anyhow!("the demo runs Debian's redis-server: apt-get install redis-server")
    })?;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let dir = tempfile::tempdir()?;
    let stats = dir.path().join("run.json");
    let exe = std::env::current_exe()?;
    println!(
        "zmem run --resident {} --policy {policy} -- redis-server (port {port}): storing {} of corpus text in ~4 KB values",
        human(resident),
        human(data)
    );
    let child = Command::new(&exe)
        .args([
            "run",
            "--quiet",
            "--resident",
            &resident.to_string(),
            "--policy",
            policy,
            "--stats",
        ])
        .arg(&stats)
        .arg("--")
        .arg(&server)
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
        ])
        .arg(dir.path())
        .stdout(Stdio::null())
        .spawn()
        .context("starting zmem run")?;
    let zmem_pid = child.id();
    let mut guard = Guard(child);
    let conn = {
        let t = Instant::now();
        loop {
            if let Ok(Some(s)) = guard.0.try_wait() {
                bail!("zmem run ended before redis answered ({s})");
            }
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(c) => break c,
                Err(_) if t.elapsed() < Duration::from_secs(20) => {
                    std::thread::sleep(Duration::from_millis(50))
                }
                Err(e) => bail!("redis did not start on port {port}: {e}"),
            }
        }
    };
    let mut r = BufReader::new(conn.try_clone()?);
    let mut w = conn;
    let n = data / VALUE as u64;
    let (mut line, mut got, mut out, mut val) = (String::new(), Vec::new(), Vec::new(), Vec::new());
    let t = Instant::now();
    for start in (0..n).step_by(PIPELINE) {
        out.clear();
        let end = (start + PIPELINE as u64).min(n);
        for i in start..end {
            value(corpus, i, &mut val);
            command(&mut out, &[b"SET", format!("k:{i}").as_bytes(), &val]);
        }
        w.write_all(&out)?;
        for _ in start..end {
            read_reply(&mut r, &mut line, &mut got)?;
        }
    }
    let set_s = t.elapsed().as_secs_f64();
    let t = Instant::now();
    for start in (0..n).step_by(PIPELINE) {
        out.clear();
        let end = (start + PIPELINE as u64).min(n);
        for i in start..end {
            command(&mut out, &[b"GET", format!("k:{i}").as_bytes()]);
        }
        w.write_all(&out)?;
        for i in start..end {
            read_reply(&mut r, &mut line, &mut got)?;
            value(corpus, i, &mut val);
            if got != val {
                bail!(
                    "value of k:{i} read back wrong ({} bytes, expected {})",
                    got.len(),
                    val.len()
                );
            }
        }
    }
    let get_s = t.elapsed().as_secs_f64();
    println!(
        "stored {n} values in {set_s:.1} s ({:.0} SET/s), read every one back and checked it in {get_s:.1} s ({:.0} GET/s)",
        n as f64 / set_s,
        n as f64 / get_s
    );
    // zmem run execs the server in its own place: same pid.
    let redis_pid = zmem_pid;
    let dir_s = zmem_runenv::socket_dir_from_env();
    let s = query(&dir_s, redis_pid).context("zmem stat")?;
    println!("\n$ zmem stat {redis_pid}\n{}", table(&[&s]));
    println!(
        "redis's heap holds {} of data in {} of DRAM ({} resident + {} compressed): {:.2}x",
        human(s.data()),
        human(s.resident() + s.mem_used_total()),
        human(s.resident()),
        human(s.mem_used_total()),
        s.data() as f64 / (s.resident() + s.mem_used_total()).max(1) as f64
    );
    drop(guard);
    Ok(())
}
