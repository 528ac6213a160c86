//! `zmem bench memcached`: the driver of [`super::kv`] with a minimal client of memcached's text
//! protocol (set, get, version, stats) and Debian's memcached (glibc malloc), with a memory
//! limit of its own so large that it never evicts.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use crate::kv::client::{read_data, read_line, Conn, KvError, Protocol};
use crate::kv::server::ServerSpec;
use crate::kv::{self, KvArgs};

/// memcached's `-m`: 64 GiB, in MiB (memcached must never evict: a lost key is an error).
pub const ITEM_MEMORY_MIB: u64 = 64 << 10;

/// memcached's text protocol.
pub struct Text;

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn protocol(key: &[u8], detail: String) -> KvError {
    KvError::Protocol {
        key: text(key),
        detail,
    }
}

/// SERVER_ERROR, CLIENT_ERROR and ERROR replies.
fn error_reply(key: &[u8], line: &[u8]) -> Option<KvError> {
    (line.starts_with(b"SERVER_ERROR") || line.starts_with(b"CLIENT_ERROR") || line == b"ERROR")
        .then(|| KvError::Server {
            key: text(key),
            reply: text(line),
        })
}

impl Protocol for Text {
    fn encode_set(&self, out: &mut Vec<u8>, key: &[u8], value: &[u8]) {
        out.extend_from_slice(b"set ");
        out.extend_from_slice(key);
        let _ = write!(out, " 0 0 {}\r\n", value.len());
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }

    fn read_set_reply(&self, c: &mut Conn, key: &[u8], line: &mut Vec<u8>) -> Result<(), KvError> {
        read_line(&mut c.reader, line)?;
        if line == b"STORED" {
            return Ok(());
        }
        Err(error_reply(key, line)
            .unwrap_or_else(|| protocol(key, format!("set replied {:?}", text(line)))))
    }

    fn encode_get(&self, out: &mut Vec<u8>, key: &[u8]) {
        out.extend_from_slice(b"get ");
        out.extend_from_slice(key);
        out.extend_from_slice(b"\r\n");
    }

    fn read_get_reply(
        &self,
        c: &mut Conn,
        key: &[u8],
        line: &mut Vec<u8>,
        buf: &mut Vec<u8>,
    ) -> Result<bool, KvError> {
        read_line(&mut c.reader, line)?;
        if line == b"END" {
            return Ok(false);
        }
        if let Some(e) = error_reply(key, line) {
            return Err(e);
        }
        // VALUE <key> <flags> <bytes>
        let head = text(line);
        let f: Vec<&str> = head.split(' ').collect();
        if f.len() < 4 || f[0] != "VALUE" || f[1].as_bytes() != key {
            return Err(protocol(key, format!("get replied {head:?}")));
        }
        let n: usize = f[3]
            .parse()
            .map_err(|_| protocol(key, format!("bad length in {head:?}")))?;
        read_data(&mut c.reader, n, buf, key)?;
        read_line(&mut c.reader, line)?;
        if line != b"END" {
            return Err(protocol(
                key,
                format!("a value is followed by {:?}, not END", text(line)),
            ));
        }
        Ok(true)
    }

    fn ping(&self, c: &mut Conn) -> Result<(), KvError> {
        c.send(b"version\r\n")?;
        let mut line = Vec::new();
        read_line(&mut c.reader, &mut line)?;
        if line.starts_with(b"VERSION ") {
            Ok(())
        } else {
            Err(protocol(b"version", format!("replied {:?}", text(&line))))
        }
    }

    fn stats(&self, c: &mut Conn) -> Result<BTreeMap<String, String>, KvError> {
        c.send(b"stats\r\n")?;
        let mut line = Vec::new();
        let mut m = BTreeMap::new();
        loop {
            read_line(&mut c.reader, &mut line)?;
            if line == b"END" {
                return Ok(m);
            }
            let l = text(&line);
            let mut f = l.splitn(3, ' ');
            match (f.next(), f.next(), f.next()) {
                (Some("STAT"), Some(k), Some(v)) => {
                    m.insert(k.to_string(), v.to_string());
                }
                _ => return Err(protocol(b"stats", format!("unexpected line {l:?}"))),
            }
        }
    }

    fn server_pid(&self, stats: &BTreeMap<String, String>) -> Option<u32> {
        stats.get("pid")?.parse().ok()
    }

    fn recorded_stats(&self) -> &'static [&'static str] {
        &[
            "bytes",
            "curr_items",
            "total_items",
            "evictions",
            "limit_maxbytes",
            "total_malloced",
        ]
    }
}

/// memcached's command line: 127.0.0.1 only, no UDP, a memory limit it never reaches.
fn args(port: u16, _dir: &Path) -> Vec<String> {
    let mut a: Vec<String> = [
        "-l",
        "127.0.0.1",
        "-p",
        &port.to_string(),
        "-U",
        "0",
        "-m",
        &ITEM_MEMORY_MIB.to_string(),
        "-c",
        "1024",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // memcached refuses to run as root without -u.
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        a.extend(["-u".into(), "root".into()]);
    }
    a
}

pub static SPEC: ServerSpec = ServerSpec {
    name: "memcached",
    default_bin: "memcached",
    version_arg: "--version",
    install_hint: "apt-get install memcached",
    args,
    protocol: &Text,
};

/// `zmem bench memcached`.
pub fn run(a: &KvArgs) -> anyhow::Result<()> {
    kv::run::run(a, &SPEC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_encoding() {
        let mut out = Vec::new();
        Text.encode_set(&mut out, b"k1", b"hello");
        assert_eq!(out, b"set k1 0 0 5\r\nhello\r\n");
        out.clear();
        Text.encode_get(&mut out, b"k1");
        assert_eq!(out, b"get k1\r\n");
        assert!(error_reply(b"k", b"SERVER_ERROR out of memory storing object").is_some());
        assert!(error_reply(b"k", b"STORED").is_none());
    }
}
