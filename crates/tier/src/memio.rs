//! [`MemIo`]: a segment device in memory, for tests and fault injection. Not for production:
//! it holds every byte written in DRAM.
//!
//! Faults it can inject (each through a method, at any time, also while a log uses it: clones
//! share one device): an errno (EIO, ENOSPC, ...) on the Nth read or write from now; short
//! transfers (each call moves at most N bytes: the retry loop must finish them); stalled
//! transfers (a call moves 0 bytes: a `Short` error); failing trims; bit flips and arbitrary
//! bytes in what is stored; truncation (the device ends at a byte: reads beyond it end early,
//! as on a truncated file); removal (everything fails with ENODEV from then on).
//!
//! It checks what the log asks of it as a real O_DIRECT device would: offsets, lengths and
//! buffer addresses aligned, ranges inside a segment (EINVAL otherwise).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use zmem_os::sync::Mutex;
use zmem_os::Errno;

use crate::io::{transfer, SegmentIo};
use crate::TierError;

/// An in-memory segment device with injectable faults (tests only). Clones share the device.
#[derive(Clone)]
pub struct MemIo {
    inner: Arc<Inner>,
}

struct Inner {
    segments: u32,
    segment_size: usize,
    alignment: usize,
    /// Per segment; empty until first written (reads as zeros).
    data: Vec<Mutex<Vec<u8>>>,
    faults: Mutex<Faults>,
    reads: AtomicU64,
    writes: AtomicU64,
    trims: AtomicU64,
}

#[derive(Default)]
struct Faults {
    /// Errors due on the Nth read / write call from now: (remaining count, errno).
    read_errors: Vec<(u64, Errno)>,
    write_errors: Vec<(u64, Errno)>,
    max_transfer: Option<usize>,
    stall_reads: bool,
    stall_writes: bool,
    fail_trims: bool,
    /// The device ends here (bytes at and after it are gone).
    end: Option<u64>,
    removed: bool,
}

/// Counts one operation against a list of due errors; the error of one that falls due now.
fn due(list: &mut Vec<(u64, Errno)>) -> Option<Errno> {
    let mut hit = None;
    list.retain_mut(|(n, e)| {
        *n -= 1;
        if *n == 0 {
            hit = Some(*e);
            false
        } else {
            true
        }
    });
    hit
}

impl MemIo {
    /// `segments` segments of `segment_size` bytes, with 512-byte alignment.
    pub fn new(segments: u32, segment_size: usize) -> MemIo {
        MemIo::with_alignment(segments, segment_size, 512)
    }

    /// The same with another alignment (a power of two up to 4096).
    pub fn with_alignment(segments: u32, segment_size: usize, alignment: usize) -> MemIo {
        MemIo {
            inner: Arc::new(Inner {
                segments,
                segment_size,
                alignment,
                data: (0..segments).map(|_| Mutex::new(Vec::new())).collect(),
                faults: Mutex::new(Faults::default()),
                reads: AtomicU64::new(0),
                writes: AtomicU64::new(0),
                trims: AtomicU64::new(0),
            }),
        }
    }

    /// The `nth` read from now (1: the next) fails with `errno`. Each range of a gather counts.
    pub fn fail_read(&self, nth: u64, errno: i32) {
        self.inner
            .faults
            .lock()
            .read_errors
            .push((nth.max(1), Errno(errno)));
    }

    /// The `nth` segment write from now (1: the next) fails with `errno`.
    pub fn fail_write(&self, nth: u64, errno: i32) {
        self.inner
            .faults
            .lock()
            .write_errors
            .push((nth.max(1), Errno(errno)));
    }

    /// Every read and write call moves at most `max` bytes (None: no limit).
    pub fn short_transfers(&self, max: Option<usize>) {
        self.inner.faults.lock().max_transfer = max.map(|m| m.max(1));
    }

    /// Reads move nothing (a `Short` error) while on.
    pub fn stall_reads(&self, on: bool) {
        self.inner.faults.lock().stall_reads = on;
    }

    /// Writes move nothing (a `Short` error) while on.
    pub fn stall_writes(&self, on: bool) {
        self.inner.faults.lock().stall_writes = on;
    }

    /// Trims fail with EIO while on.
    pub fn fail_trims(&self, on: bool) {
        self.inner.faults.lock().fail_trims = on;
    }

    /// Flips bit `bit` (0..8) of the byte at `offset` of `segment` as stored.
    pub fn flip_bit(&self, segment: u32, offset: usize, bit: u8) {
        let mut d = self.inner.data[segment as usize].lock();
        if d.len() <= offset {
            d.resize(offset + 1, 0);
        }
        d[offset] ^= 1 << (bit & 7);
    }

    /// Overwrites stored bytes (a stale or foreign segment, a torn write).
    pub fn poke(&self, segment: u32, offset: usize, bytes: &[u8]) {
        let mut d = self.inner.data[segment as usize].lock();
        if d.len() < offset + bytes.len() {
            d.resize(offset + bytes.len(), 0);
        }
        d[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    /// The bytes stored in `segment` (as far as written).
    pub fn peek(&self, segment: u32) -> Vec<u8> {
        self.inner.data[segment as usize].lock().clone()
    }

    /// Truncates the device at byte `len` (of the whole device, segment 0 first): what was
    /// stored from there is gone; reads from there end early until a write extends it again.
    pub fn truncate(&self, len: u64) {
        let s = self.inner.segment_size as u64;
        for (i, d) in self.inner.data.iter().enumerate() {
            let base = i as u64 * s;
            let mut d = d.lock();
            if base + d.len() as u64 > len {
                d.truncate(len.saturating_sub(base) as usize);
            }
        }
        self.inner.faults.lock().end = Some(len);
    }

    /// The device is gone: every operation fails with ENODEV from now on.
    pub fn remove(&self) {
        self.inner.faults.lock().removed = true;
    }

    /// Read calls (ranges), segment writes and trims so far.
    pub fn reads(&self) -> u64 {
        self.inner.reads.load(Ordering::Relaxed)
    }
    pub fn writes(&self) -> u64 {
        self.inner.writes.load(Ordering::Relaxed)
    }
    pub fn trims(&self) -> u64 {
        self.inner.trims.load(Ordering::Relaxed)
    }

    fn check(
        &self,
        what: &'static str,
        segment: u32,
        offset: usize,
        buf: *const u8,
        len: usize,
    ) -> Result<(), TierError> {
        let i = &self.inner;
        let a = i.alignment;
        let ok = segment < i.segments
            && offset.checked_add(len).is_some_and(|e| e <= i.segment_size)
            && offset % a == 0
            && len % a == 0
            && buf as usize % a == 0;
        if ok {
            Ok(())
        } else {
            Err(TierError::Io {
                what,
                errno: Errno(libc::EINVAL),
            })
        }
    }
}

impl SegmentIo for MemIo {
    fn segments(&self) -> u32 {
        self.inner.segments
    }

    fn segment_size(&self) -> usize {
        self.inner.segment_size
    }

    fn alignment(&self) -> usize {
        self.inner.alignment
    }

    fn write_segments(&self, writes: &[(u32, &[u8])]) -> Result<(), TierError> {
        const WHAT: &str = "write of a MemIo segment";
        for (seg, bytes) in writes {
            self.check(WHAT, *seg, 0, bytes.as_ptr(), bytes.len())?;
        }
        for (seg, bytes) in writes {
            self.inner.writes.fetch_add(1, Ordering::Relaxed);
            let (err, max, stall) = {
                let mut f = self.inner.faults.lock();
                let e = if f.removed {
                    Some(Errno(libc::ENODEV))
                } else {
                    due(&mut f.write_errors)
                };
                (e, f.max_transfer, f.stall_writes)
            };
            if let Some(errno) = err {
                return Err(TierError::Io { what: WHAT, errno });
            }
            let mut d = self.inner.data[*seg as usize].lock();
            if d.len() < bytes.len() {
                d.resize(bytes.len(), 0);
            }
            transfer(WHAT, bytes.len(), |done| {
                if stall {
                    return Ok(0);
                }
                let n = (bytes.len() - done).min(max.unwrap_or(usize::MAX));
                d[done..done + n].copy_from_slice(&bytes[done..done + n]);
                Ok(n)
            })?;
            let end = u64::from(*seg) * self.inner.segment_size as u64 + bytes.len() as u64;
            let mut f = self.inner.faults.lock();
            if let Some(e) = f.end.as_mut() {
                *e = (*e).max(end);
            }
        }
        Ok(())
    }

    fn read_at(&self, segment: u32, offset: usize, buf: &mut [u8]) -> Result<(), TierError> {
        const WHAT: &str = "read of a MemIo segment";
        self.check(WHAT, segment, offset, buf.as_ptr(), buf.len())?;
        self.inner.reads.fetch_add(1, Ordering::Relaxed);
        let (err, max, stall, end) = {
            let mut f = self.inner.faults.lock();
            let e = if f.removed {
                Some(Errno(libc::ENODEV))
            } else {
                due(&mut f.read_errors)
            };
            (e, f.max_transfer, f.stall_reads, f.end)
        };
        if let Some(errno) = err {
            return Err(TierError::Io { what: WHAT, errno });
        }
        let base = u64::from(segment) * self.inner.segment_size as u64 + offset as u64;
        let d = self.inner.data[segment as usize].lock();
        let len = buf.len();
        transfer(WHAT, len, |done| {
            if stall {
                return Ok(0);
            }
            // Like pread at the end of a file: only what is there.
            let avail = end.map_or(usize::MAX, |e| {
                e.saturating_sub(base + done as u64) as usize
            });
            let n = (len - done).min(max.unwrap_or(usize::MAX)).min(avail);
            for (k, b) in buf[done..done + n].iter_mut().enumerate() {
                *b = d.get(offset + done + k).copied().unwrap_or(0);
            }
            Ok(n)
        })
    }

    fn trim(&self, segment: u32) -> Result<(), TierError> {
        const WHAT: &str = "trim of a MemIo segment";
        self.check(WHAT, segment, 0, std::ptr::null(), 0)?;
        let f = self.inner.faults.lock();
        if f.removed || f.fail_trims {
            let errno = Errno(if f.removed { libc::ENODEV } else { libc::EIO });
            return Err(TierError::Io { what: WHAT, errno });
        }
        drop(f);
        self.inner.trims.fetch_add(1, Ordering::Relaxed);
        // A discarded range reads back as zeros.
        self.inner.data[segment as usize].lock().clear();
        Ok(())
    }
}
