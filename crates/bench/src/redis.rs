//! `zmem bench redis`: the driver of [`super::kv`] with a minimal RESP client (SET, GET, PING,
//! INFO) and Debian's redis-server with persistence off.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use crate::kv::client::{read_data, read_line, Conn, KvError, Protocol};
use crate::kv::server::ServerSpec;
use crate::kv::{self, KvArgs};

/// Redis's wire protocol (RESP 2).
pub struct Resp;

fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    let _ = write!(out, "${}\r\n", b.len());
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

/// Appends a command as an array of bulk strings.
pub fn command(out: &mut Vec<u8>, parts: &[&[u8]]) {
    let _ = write!(out, "*{}\r\n", parts.len());
    for p in parts {
        bulk(out, p);
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn protocol(key: &[u8], detail: String) -> KvError {
    KvError::Protocol {
        key: text(key),
        detail,
    }
}

/// Reads a bulk string reply: Ok(false) for the nil reply.
fn read_bulk(
    c: &mut Conn,
    key: &[u8],
    line: &mut Vec<u8>,
    buf: &mut Vec<u8>,
) -> Result<bool, KvError> {
    read_line(&mut c.reader, line)?;
    match line.first() {
        Some(b'$') => {
            let n: i64 = std::str::from_utf8(&line[1..])
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or_else(|| protocol(key, format!("bad bulk length {:?}", text(line))))?;
            if n < 0 {
                return Ok(false);
            }
            read_data(&mut c.reader, n as usize, buf, key)?;
            Ok(true)
        }
        Some(b'-') => Err(KvError::Server {
            key: text(key),
            reply: text(line),
        }),
        _ => Err(protocol(key, format!("unexpected reply {:?}", text(line)))),
    }
}

impl Protocol for Resp {
    fn encode_set(&self, out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
        command(out, &[b"SET", key, value]);
    }

    fn read_set_reply(&self, c: &mut Conn, key: &[u8], line: &mut Vec<u8>) -> Result<(), KvError> {
        read_line(&mut c.reader, line)?;
        match line.first() {
            Some(b'+') if &line[..] == b"+OK" => Ok(()),
            Some(b'-') => Err(KvError::Server {
                key: text(key),
                reply: text(line),
            }),
            _ => Err(protocol(key, format!("SET replied {:?}", text(line)))),
        }
    }

    fn encode_get(&self, out: &mut Vec<u8>, key: &[u8]) {
        command(out, &[b"GET", key]);
    }

    fn read_get_reply(
        &self,
        c: &mut Conn,
        key: &[u8],
        line: &mut Vec<u8>,
        buf: &mut Vec<u8>,
    ) -> Result<bool, KvError> {
        read_bulk(c, key, line, buf)
    }

    fn ping(&self, c: &mut Conn) -> Result<(), KvError> {
        let mut out = Vec::new();
        command(&mut out, &[b"PING"]);
        c.send(&out)?;
        let mut line = Vec::new();
        read_line(&mut c.reader, &mut line)?;
        if line == b"+PONG" {
            Ok(())
        } else {
            Err(protocol(b"PING", format!("replied {:?}", text(&line))))
        }
    }

    fn stats(&self, c: &mut Conn) -> Result<BTreeMap<String, String>, KvError> {
        let mut out = Vec::new();
        command(&mut out, &[b"INFO"]);
        c.send(&out)?;
        let (mut line, mut buf) = (Vec::new(), Vec::new());
        if !read_bulk(c, b"INFO", &mut line, &mut buf)? {
            return Err(protocol(b"INFO", "nil reply".into()));
        }
        Ok(parse_info(&text(&buf)))
    }

    fn server_pid(&self, stats: &BTreeMap<String, String>) -> Option<u32> {
        stats.get("process_id")?.parse().ok()
    }

    fn recorded_stats(&self) -> &'static [&'static str] {
        &[
            "used_memory",
            "used_memory_rss",
            "used_memory_peak",
            "allocator_allocated",
            "allocator_resident",
            "evicted_keys",
            "total_forks",
        ]
    }
}

/// INFO's "name:value" lines (sections and comments skipped).
pub fn parse_info(s: &str) -> BTreeMap<String, String> {
    s.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            Some((k.trim().to_string(), v.trim().to_string()))
        })
        .collect()
}

/// redis-server's command line: 127.0.0.1 only, no persistence, no memory limit of its own.
fn args(port: u16, dir: &Path) -> Vec<String> {
    [
        "--port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--protected-mode",
        "yes",
        "--save",
        "",
        "--appendonly",
        "no",
        "--maxmemory",
        "0",
        "--daemonize",
        "no",
        "--loglevel",
        "warning",
        "--dir",
        &dir.display().to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

pub static SPEC: ServerSpec = ServerSpec {
    name: "redis",
    default_bin: "redis-server",
    version_arg: "--version",
    install_hint: "apt-get install redis-server",
    args,
    protocol: &Resp,
};

/// `zmem bench redis`.
pub fn run(a: &KvArgs) -> anyhow::Result<()> {
    kv::run::run(a, &SPEC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resp_encoding() {
        let mut out = Vec::new();
        Resp.encode_set(&mut out, b"k1", b"hello");
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$2\r\nk1\r\n$5\r\nhello\r\n");
        out.clear();
        Resp.encode_get(&mut out, b"k1");
        assert_eq!(out, b"*2\r\n$3\r\nGET\r\n$2\r\nk1\r\n");
    }

    #[test]
    fn info_parse() {
        let m = parse_info("# Server\r\nredis_version:7.0.15\r\nprocess_id:42\r\n\r\n# Memory\r\nused_memory:1000\r\n");
        assert_eq!(m["process_id"], "42");
        assert_eq!(m["used_memory"], "1000");
        assert_eq!(Resp.server_pid(&m), Some(42));
    }
}
