//! The client side: a socket that waits patiently (and stops on Ctrl-C or when told to), one
//! connection with its buffered reader, and the [`Protocol`] trait the servers' clients implement.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::POLL;
use crate::abort::{aborted, Interrupted};

/// Errors of a client; which ones end a configuration and which ones fail the run is decided by
/// `classify` in the driver.
#[derive(Debug, thiserror::Error)]
pub enum KvError {
    #[error("connection failed: {0}")]
    Io(std::io::Error),
    #[error("the server answered nothing for {0} s")]
    Stalled(u64),
    #[error("interrupted")]
    Interrupted,
    #[error("zram is full and the server stopped answering")]
    GaveUp,
    #[error("the server refused {key}: {reply}")]
    Server { key: String, reply: String },
    #[error("protocol error ({key}): {detail}")]
    Protocol { key: String, detail: String },
    #[error("the value of {key} read back is wrong: {detail}")]
    Mismatch { key: String, detail: String },
    #[error("{key} is missing: the server lost a value it had stored")]
    Missing { key: String },
}

impl KvError {
    /// Errors that are bugs of the server or of zmem, never a way to end a run.
    pub(super) fn is_hard(&self) -> bool {
        matches!(
            self,
            KvError::Protocol { .. } | KvError::Mismatch { .. } | KvError::Missing { .. }
        )
    }
    pub(super) fn rank(&self) -> u8 {
        match self {
            e if e.is_hard() => 3,
            KvError::Interrupted => 2,
            KvError::Server { .. } => 1,
            _ => 0,
        }
    }
}

/// Marker inside an io::Error: the socket waited past the stall timeout.
#[derive(Debug)]
struct StallMarker(u64);
impl std::fmt::Display for StallMarker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "no reply for {} s", self.0)
    }
}
impl std::error::Error for StallMarker {}

impl From<std::io::Error> for KvError {
    fn from(e: std::io::Error) -> KvError {
        if let Some(inner) = e.get_ref() {
            if inner.is::<Interrupted>() {
                return KvError::Interrupted;
            }
            if let Some(s) = inner.downcast_ref::<StallMarker>() {
                return KvError::Stalled(s.0);
            }
            if inner.is::<GiveUpMarker>() {
                return KvError::GaveUp;
            }
        }
        KvError::Io(e)
    }
}

/// A socket that waits in slices of [`POLL`](super::POLL), checking the interrupt flag between them, and
/// gives up after `stall` without progress.
pub struct Patient {
    s: TcpStream,
    stall: Duration,
    watch: Arc<Watch>,
}

/// Shared by the connections of a configuration: replies seen (progress) and a request to stop
/// waiting (from the zram watchdog).
#[derive(Debug, Default)]
pub struct Watch {
    pub(super) progress: AtomicU64,
    pub(super) give_up: AtomicBool,
}

/// Marker inside an io::Error: the watchdog gave up on the server.
#[derive(Debug)]
struct GiveUpMarker;
impl std::fmt::Display for GiveUpMarker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "given up on the server")
    }
}
impl std::error::Error for GiveUpMarker {}

impl Patient {
    fn waited(&self, t0: Instant) -> Option<std::io::Error> {
        if aborted() {
            return Some(std::io::Error::other(Interrupted));
        }
        if self.watch.give_up.load(Ordering::Relaxed) {
            return Some(std::io::Error::other(GiveUpMarker));
        }
        (t0.elapsed() >= self.stall).then(|| {
            std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                StallMarker(self.stall.as_secs()),
            )
        })
    }
}

fn would_block(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

impl Read for Patient {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let t0 = Instant::now();
        loop {
            match self.s.read(buf) {
                Err(e) if would_block(&e) => {
                    if let Some(e) = self.waited(t0) {
                        return Err(e);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Ok(n) => {
                    self.watch.progress.fetch_add(1, Ordering::Relaxed);
                    return Ok(n);
                }
                r => return r,
            }
        }
    }
}

impl Write for Patient {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let t0 = Instant::now();
        loop {
            match self.s.write(buf) {
                Err(e) if would_block(&e) => {
                    if let Some(e) = self.waited(t0) {
                        return Err(e);
                    }
                }
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                r => return r,
            }
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.s.flush()
    }
}

/// One client connection: a buffered reader and the writing half.
pub struct Conn {
    pub reader: BufReader<Patient>,
    writer: Patient,
}

impl Conn {
    pub fn connect(port: u16, stall: Duration, watch: &Arc<Watch>) -> std::io::Result<Conn> {
        let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(POLL))?;
        s.set_write_timeout(Some(POLL))?;
        let r = s.try_clone()?;
        Ok(Conn {
            reader: BufReader::with_capacity(
                1 << 18,
                Patient {
                    s: r,
                    stall: stall.max(POLL),
                    watch: watch.clone(),
                },
            ),
            writer: Patient {
                s,
                stall: stall.max(POLL),
                watch: watch.clone(),
            },
        })
    }

    /// Sends `buf` whole.
    pub fn send(&mut self, buf: &[u8]) -> Result<(), KvError> {
        self.writer.write_all(buf).map_err(KvError::from)
    }
}

/// Reads one line ending in "\r\n" into `line` (without it). EOF is an error.
pub fn read_line(r: &mut BufReader<Patient>, line: &mut Vec<u8>) -> Result<(), KvError> {
    line.clear();
    let n = r.read_until(b'\n', line)?;
    if n == 0 || !line.ends_with(b"\r\n") {
        return Err(KvError::Io(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "the server closed the connection",
        )));
    }
    line.truncate(line.len() - 2);
    Ok(())
}

/// Reads exactly `n` bytes into `buf` followed by "\r\n".
pub fn read_data(
    r: &mut BufReader<Patient>,
    n: usize,
    buf: &mut Vec<u8>,
    key: &[u8],
) -> Result<(), KvError> {
    buf.resize(n + 2, 0);
    r.read_exact(buf).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            KvError::Io(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "the server closed the connection",
            ))
        } else {
            KvError::from(e)
        }
    })?;
    if &buf[n..] != b"\r\n" {
        return Err(KvError::Protocol {
            key: String::from_utf8_lossy(key).into_owned(),
            detail: "a value is not followed by CRLF".into(),
        });
    }
    buf.truncate(n);
    Ok(())
}

/// A key-value protocol: how SETs, GETs and the statistics request look on the wire.
pub trait Protocol: Sync {
    /// Appends a SET of `value` under `key`.
    fn encode_set(&self, out: &mut Vec<u8>, key: &[u8], value: &[u8]);
    /// Reads the reply to a SET.
    fn read_set_reply(&self, c: &mut Conn, key: &[u8], line: &mut Vec<u8>) -> Result<(), KvError>;
    /// Appends a GET of `key`.
    fn encode_get(&self, out: &mut Vec<u8>, key: &[u8]);
    /// Reads the reply to a GET into `buf`: Ok(false) when the key does not exist.
    fn read_get_reply(
        &self,
        c: &mut Conn,
        key: &[u8],
        line: &mut Vec<u8>,
        buf: &mut Vec<u8>,
    ) -> Result<bool, KvError>;
    /// Whether the server answers (PING, version).
    fn ping(&self, c: &mut Conn) -> Result<(), KvError>;
    /// The server's statistics as name -> value (INFO, stats).
    fn stats(&self, c: &mut Conn) -> Result<BTreeMap<String, String>, KvError>;
    /// The server process's pid in those statistics.
    fn server_pid(&self, stats: &BTreeMap<String, String>) -> Option<u32>;
    /// Statistics recorded in every step (numbers).
    fn recorded_stats(&self) -> &'static [&'static str];
}
