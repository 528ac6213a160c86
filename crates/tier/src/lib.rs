//! The SSD tier: a log-structured store of compressed objects below the compressed DRAM pool
//! (HMM_alloc's log, seed 003). Objects (a page's compressed bytes, or a block's) are packed
//! into large segments written whole and sequentially; each segment carries a header of
//! reverse pointers (owner, page index, length, checksum) so the collector can find who points
//! at an object; a read fetches only the sectors that hold its object. Every object is sealed
//! with an AEAD under a key that lives only in this process (on by default), so a flipped bit,
//! a truncated file or a stale segment is detected, never returned as data.
//!
//! The caller (a page store) owns the mapping from its pages to [`Location`]s; the log owns
//! the space. Liveness is per object: [`Log::free`] marks an object dead, and the collector
//! copies the live objects of mostly dead segments into new ones, asking each owner to repoint
//! its page ([`Owner::relocate`]) before the old copy is forgotten.
//!
//! Everything here may run on zmem's own threads (fault handlers, the writeback, the collector):
//! errors carry [`Errno`]s, never `std::io::Error` text (see zmem_os::errno).
//!
//! Modules: `log` (the log: segments' liveness, write / read / free), `gc` (the collector and
//! its thread), `segment` (the on-disk format), `seal` (AES-256-GCM or crc32, the key), `io`
//! (the [`SegmentIo`] trait, the file / block-device backend), `uring` (io_uring batches),
//! `memio` ([`MemIo`], an in-memory device with injectable faults, for tests). The format and
//! the measurements behind the choices are in the crate's README.md.

mod gc;
mod io;
mod log;
mod memio;
mod seal;
mod segment;
mod uring;

use std::path::PathBuf;

pub use zmem_os::Errno;

pub use crate::io::{AlignedBuf, FileIo, SegmentIo, UringUse};
pub use crate::log::{prepare_thread, Log, ReadAlong, MAX_NEAR};
pub use crate::memio::MemIo;

/// Where an object lives in the log: segment number (high 32 bits) and byte offset of the
/// object within its segment (low 32 bits). Fits a store slot's aux word.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Location(pub u64);

impl Location {
    pub fn new(segment: u32, offset: u32) -> Location {
        Location((u64::from(segment) << 32) | u64::from(offset))
    }
    pub fn segment(self) -> u32 {
        (self.0 >> 32) as u32
    }
    pub fn offset(self) -> u32 {
        self.0 as u32
    }
}

/// Names one registered owner (a store) in the log's reverse pointers.
pub type OwnerId = u32;

/// What the collector needs of an object's owner.
pub trait Owner: Send + Sync {
    /// The collector has copied page `index`'s object from `old` to `new` (already written).
    /// Repoint the page if it still points at `old` and return true; return false if the page
    /// no longer points at `old` (it was read back, overwritten or discarded meanwhile: the
    /// owner has freed or will free `old` itself). Called on the collector's thread (or on a
    /// writer's, when a write finds only the reserve left and collects first, or on whoever
    /// calls [`Log::collect`]), with no lock of the log held; must not call back into the
    /// log's write or collect path ([`Log::free`] and [`Log::read`] are fine).
    fn relocate(&self, index: u64, old: Location, new: Location) -> bool;
}

/// How segments reach the device.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub enum IoMode {
    /// io_uring where the kernel allows it, else pread/pwrite.
    #[default]
    Auto,
    /// io_uring only: opening fails where it is refused.
    Uring,
    /// pread/pwrite only.
    Sync,
}

/// The log's settings.
#[derive(Clone, Debug)]
pub struct LogConfig {
    /// A directory (the log is an unnamed O_TMPFILE there, or a file created and unlinked at
    /// once where O_TMPFILE is refused) or a block device (used whole, opened O_EXCL). An
    /// existing regular file is refused: it would be overwritten.
    pub path: PathBuf,
    /// Bytes of log space (rounded down to whole segments); for a block device at most its size.
    pub size: u64,
    /// Bytes per segment: a power of two from 64 KiB to 64 MiB. Default 1 MiB.
    pub segment_size: usize,
    /// Seal every object with AES-256-GCM under a per-process random key (default true).
    pub encrypt: bool,
    /// The collector takes only segments whose live bytes are below this fraction of the
    /// segment (default 0.5), when free segments run low: a hard limit on the copying (write
    /// amplification stays near 1 / (1 - threshold)), at the price of `TierError::Full` when no
    /// segment is that empty. Ahead of need it ranks them by cost-benefit, for a waiting
    /// writer least live first (see gc.rs).
    pub gc_threshold: f64,
    /// Free segments the collector keeps in reserve (default 4); a write that would use the
    /// last of them runs a collection first.
    pub reserve_segments: u32,
    pub io: IoMode,
}

impl LogConfig {
    pub fn new(path: impl Into<PathBuf>, size: u64) -> LogConfig {
        LogConfig {
            path: path.into(),
            size,
            segment_size: 1 << 20,
            encrypt: true,
            gc_threshold: 0.5,
            reserve_segments: 4,
            io: IoMode::Auto,
        }
    }
}

/// Errors of the log. A failed call changes nothing unless its doc says otherwise.
#[derive(thiserror::Error, Debug, Clone, PartialEq)]
pub enum TierError {
    #[error("invalid SSD tier configuration: {0}")]
    Config(String),
    /// A system call failed; `what` says which and on what, `errno` why.
    #[error("{what}: {}", errno.name())]
    Io { what: &'static str, errno: Errno },
    /// A short read or write that retrying did not complete.
    #[error("{what}: {done} of {want} bytes")]
    Short {
        what: &'static str,
        done: usize,
        want: usize,
    },
    /// No free segment, and the collector found nothing to reclaim.
    #[error("the SSD log is full ({segments} segments of {segment_size} bytes)")]
    Full { segments: u32, segment_size: usize },
    /// An object larger than a segment can hold.
    #[error("an object of {len} bytes does not fit a segment of {segment_size}")]
    TooLarge { len: usize, segment_size: usize },
    /// The object read back failed its authentication tag or checksum (a flipped bit, a
    /// truncated file, a stale segment), or its location is not a live object of that owner.
    #[error("object at segment {segment} offset {offset} is corrupt or stale: {why}")]
    Corrupt {
        segment: u32,
        offset: u32,
        why: &'static str,
    },
}

/// The log's counters (zram's bd_stat and more).
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct LogStats {
    pub segment_size: u64,
    pub segments: u64,
    pub segments_free: u64,
    /// Live objects and their stored bytes (payload, without seals or headers).
    pub objects: u64,
    pub live_bytes: u64,
    /// Objects the owners wrote (`Log::write`) and their bytes: the user side of write
    /// amplification.
    pub objects_written: u64,
    pub bytes_written: u64,
    /// Bytes written to the device: whole segments, headers and padding included, collector
    /// copies included.
    pub device_bytes_written: u64,
    pub segment_writes: u64,
    pub reads: u64,
    /// Objects read along with another (`Log::read_around`): no read of their own.
    pub read_ahead: u64,
    pub device_bytes_read: u64,
    /// Objects the collector moved, segments it reclaimed, segments trimmed.
    pub gc_moves: u64,
    pub gc_segments: u64,
    pub trims: u64,
    /// Trims the device refused (ignored: a trim is advice).
    pub trim_errors: u64,
    pub read_errors: u64,
    pub write_errors: u64,
    /// Objects that failed authentication or checksum on read.
    pub corrupt: u64,
    /// Frees of a location that was not a live object (freed twice, never written): ignored.
    pub bad_frees: u64,
    pub encrypted: bool,
    /// True when the device is driven through io_uring.
    pub uring: bool,
    /// True when the file is opened with O_DIRECT.
    pub direct: bool,
}

impl LogStats {
    /// Device bytes written per byte the owners wrote (1.0 when nothing was written).
    pub fn write_amplification(&self) -> f64 {
        if self.bytes_written == 0 {
            1.0
        } else {
            self.device_bytes_written as f64 / self.bytes_written as f64
        }
    }
}
