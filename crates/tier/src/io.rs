//! The segment I/O behind the log: a small trait ([`SegmentIo`]), aligned buffers, and the file
//! / block-device backend ([`FileIo`]: pread/pwrite, O_DIRECT where the file system takes it,
//! io_uring for the operations it measured faster, see uring.rs).
//!
//! The log only ever writes a segment from its start, in one go, and reads aligned ranges of
//! it; so the trait is about segments, not bytes.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use zmem_os::Errno;

use crate::uring::{Op, RingPool};
use crate::{IoMode, TierError};

/// How segments reach a device. Offsets, lengths and buffer addresses of reads and writes are
/// multiples of [`SegmentIo::alignment`]; a segment's bytes start at 0 within it.
pub trait SegmentIo: Send + Sync {
    /// Segments the device holds.
    fn segments(&self) -> u32;
    /// Bytes per segment.
    fn segment_size(&self) -> usize;
    /// Alignment of offsets, lengths and buffers (a power of two, at most 4096).
    fn alignment(&self) -> usize;
    /// Writes each `(segment, bytes)` at the start of its segment (`bytes` at most a segment,
    /// a multiple of the alignment). Ok once all are on the device; on an error some may have
    /// been written (the log treats all of them as not written).
    fn write_segments(&self, writes: &[(u32, &[u8])]) -> Result<(), TierError>;
    /// Reads `buf.len()` bytes at `offset` of `segment`. A read that ends early (the device is
    /// shorter than it was) is `TierError::Short`.
    fn read_at(&self, segment: u32, offset: usize, buf: &mut [u8]) -> Result<(), TierError>;
    /// Reads several ranges of one segment (the collector's gather); backends may batch them.
    fn read_ranges(
        &self,
        segment: u32,
        ranges: &mut [(usize, &mut [u8])],
    ) -> Result<(), TierError> {
        for (off, buf) in ranges.iter_mut() {
            self.read_at(segment, *off, buf)?;
        }
        Ok(())
    }
    /// Tells the device a segment's bytes are no longer needed (discard / punch a hole).
    fn trim(&self, segment: u32) -> Result<(), TierError>;
    /// True when some operations go through io_uring.
    fn is_uring(&self) -> bool {
        false
    }
    /// True when the device is opened with O_DIRECT.
    fn is_direct(&self) -> bool {
        false
    }
}

/// A zeroed heap buffer with an alignment (for O_DIRECT).
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    align: usize,
}

// SAFETY: an owned heap allocation, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}
// SAFETY: as above; shared access gives only &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// `len` zeroed bytes (at least 1 is allocated) aligned to `align` (a power of two).
    pub fn new(len: usize, align: usize) -> AlignedBuf {
        let layout = std::alloc::Layout::from_size_align(len.max(1), align.max(1))
            .expect("a buffer layout within isize");
        // SAFETY: a non-zero-sized layout.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(p).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf {
            ptr,
            len,
            align: align.max(1),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn align(&self) -> usize {
        self.align
    }

    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: len initialised (zeroed) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(self.len.max(1), self.align)
            .expect("the layout it was allocated with");
        // SAFETY: allocated in new() with this layout.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), layout) };
    }
}

/// Moves `want` bytes with `op(done)`, a pread/pwrite of the rest from `done` returning what
/// the kernel returned, retrying short transfers and EINTR. A transfer that makes no progress
/// is `Short` (end of file on a read, a full device that says 0 on a write).
pub(crate) fn transfer(
    what: &'static str,
    want: usize,
    mut op: impl FnMut(usize) -> Result<usize, Errno>,
) -> Result<(), TierError> {
    let mut done = 0usize;
    while done < want {
        match op(done) {
            Err(errno) if errno.0 == libc::EINTR || errno.0 == libc::EAGAIN => continue,
            Err(errno) => return Err(TierError::Io { what, errno }),
            Ok(0) => return Err(TierError::Short { what, done, want }),
            Ok(n) => done += n.min(want - done),
        }
    }
    Ok(())
}

/// A system call's byte count, or its errno.
pub(crate) fn counted(n: isize) -> Result<usize, Errno> {
    if n < 0 {
        Err(Errno::last())
    } else {
        Ok(n as usize)
    }
}

// Block-device ioctls libc does not name (asm-generic numbering: x86-64, arm64, riscv).
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;

fn io_err(what: &'static str) -> TierError {
    TierError::Io {
        what,
        errno: Errno::last(),
    }
}

/// Which of a [`FileIo`]'s operations go through io_uring.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UringUse {
    pub writes: bool,
    pub reads: bool,
    pub gathers: bool,
}

impl UringUse {
    /// What [`IoMode::Auto`] uses where io_uring is available, as measured on ext4 over virtio
    /// with O_DIRECT (README.md "Measured"): the collector's gathers through io_uring (16
    /// ranges in flight at once: ~6x faster than 16 preads), segment writes too (as fast as
    /// pwrite or a little faster, and the segments of one call go in parallel); a single
    /// object read through pread (the same latency within noise, one system call either way,
    /// and no ring to take).
    pub const AUTO: UringUse = UringUse {
        writes: true,
        reads: false,
        gathers: true,
    };
    pub const ALL: UringUse = UringUse {
        writes: true,
        reads: true,
        gathers: true,
    };
    pub const NONE: UringUse = UringUse {
        writes: false,
        reads: false,
        gathers: false,
    };
}

/// A log on a file (an unnamed file in a directory) or a whole block device.
pub struct FileIo {
    fd: OwnedFd,
    segments: u32,
    segment_size: usize,
    alignment: usize,
    direct: bool,
    block: bool,
    /// Segments whose space a trim gave back to the file system: reserved again before the
    /// next write, so a full file system is reported as ENOSPC before any byte is written.
    trimmed: Vec<AtomicBool>,
    rings: Option<RingPool>,
    uring: UringUse,
    trim_failures: AtomicU64,
}

impl FileIo {
    /// Opens `path` as [`crate::LogConfig`] describes (directory: an unnamed file there; block
    /// device: used whole, O_EXCL; anything else refused) for `size` bytes of `segment_size`
    /// segments, with `mode`'s use of io_uring.
    pub fn open(
        path: &Path,
        size: u64,
        segment_size: usize,
        mode: IoMode,
    ) -> Result<FileIo, TierError> {
        let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
            TierError::Config(format!("{}: a path with a NUL byte", path.display()))
        })?;
        // SAFETY: a zeroed stat is valid; stat fills it.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid C string and stat buffer.
        if unsafe { libc::stat(cpath.as_ptr(), &mut st) } != 0 {
            let errno = Errno::last();
            if errno.0 == libc::ENOENT {
                return Err(TierError::Config(format!(
                    "{}: no such directory or block device",
                    path.display()
                )));
            }
            return Err(TierError::Io {
                what: "stat of the SSD log's path",
                errno,
            });
        }
        let kind = st.st_mode & libc::S_IFMT;
        let (fd, direct, block, size) = match kind {
            libc::S_IFDIR => {
                let (fd, direct) = open_unnamed(&cpath)?;
                reserve(fd.as_raw_fd(), 0, size)?;
                (fd, direct, false, size)
            }
            libc::S_IFBLK => {
                let (fd, direct) = open_flags(&cpath, libc::O_RDWR | libc::O_EXCL, 0)?;
                let mut dev: u64 = 0;
                // SAFETY: BLKGETSIZE64 writes one u64.
                if unsafe { libc::ioctl(fd.as_raw_fd(), BLKGETSIZE64, &mut dev) } != 0 {
                    return Err(io_err("BLKGETSIZE64 on the SSD log's device"));
                }
                if size > dev {
                    return Err(TierError::Config(format!(
                        "{}: a log of {size} bytes does not fit the device's {dev}",
                        path.display()
                    )));
                }
                (fd, direct, true, size)
            }
            libc::S_IFREG => {
                return Err(TierError::Config(format!(
                    "{}: an existing regular file would be overwritten; give a directory (the \
                     log is an unnamed file there) or a block device",
                    path.display()
                )))
            }
            _ => {
                return Err(TierError::Config(format!(
                    "{}: neither a directory nor a block device",
                    path.display()
                )))
            }
        };
        let segments = u32::try_from(size / segment_size as u64)
            .map_err(|_| TierError::Config("more than 2^32 segments".into()))?;
        FileIo::build(fd, segments, segment_size, direct, block, mode)
    }

    /// A log over an already open file (tests and tools: a file the caller can also inspect or
    /// damage), `segments` segments of `segment_size` from offset 0; its space is reserved with
    /// fallocate. `direct`: the file was opened with O_DIRECT.
    pub fn from_fd(
        fd: OwnedFd,
        segments: u32,
        segment_size: usize,
        direct: bool,
        mode: IoMode,
    ) -> Result<FileIo, TierError> {
        reserve(fd.as_raw_fd(), 0, u64::from(segments) * segment_size as u64)?;
        FileIo::build(fd, segments, segment_size, direct, false, mode)
    }

    fn build(
        fd: OwnedFd,
        segments: u32,
        segment_size: usize,
        mut direct: bool,
        block: bool,
        mode: IoMode,
    ) -> Result<FileIo, TierError> {
        let mut alignment = if direct {
            dio_alignment(fd.as_raw_fd(), block)
        } else {
            512
        };
        if direct && !probe_direct(fd.as_raw_fd(), alignment) {
            // The open took O_DIRECT but I/O refuses it (some file systems): buffered.
            // SAFETY: F_GETFL/F_SETFL on our own descriptor.
            unsafe {
                let fl = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
                libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, fl & !libc::O_DIRECT);
            }
            direct = false;
            alignment = 512;
        }
        if !direct {
            tracing::info!("the SSD log's file system refuses O_DIRECT: buffered I/O");
        }
        let (rings, uring) = match mode {
            IoMode::Sync => (None, UringUse::NONE),
            IoMode::Uring => (Some(RingPool::new()?), UringUse::ALL),
            IoMode::Auto => match RingPool::new() {
                Ok(r) => (Some(r), UringUse::AUTO),
                Err(e) => {
                    if let TierError::Io { errno, .. } = e {
                        tracing::info!(
                            "io_uring refused ({}): the SSD log uses pread/pwrite",
                            errno.name()
                        );
                    }
                    (None, UringUse::NONE)
                }
            },
        };
        Ok(FileIo {
            fd,
            segments,
            segment_size,
            alignment,
            direct,
            block,
            trimmed: (0..segments).map(|_| AtomicBool::new(false)).collect(),
            rings,
            uring,
            trim_failures: AtomicU64::new(0),
        })
    }

    /// Chooses which operations go through io_uring (where a ring could be set up): for
    /// measurements, and for [`IoMode::Auto`]'s choice.
    pub fn set_uring_use(&mut self, mut uring: UringUse) {
        if self.rings.is_none() {
            uring = UringUse::NONE;
        }
        self.uring = uring;
    }

    pub fn uring_use(&self) -> UringUse {
        self.uring
    }

    pub fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Trims that failed (ignored: a trim is advice).
    pub fn trim_failures(&self) -> u64 {
        self.trim_failures.load(Ordering::Relaxed)
    }

    fn base(&self, segment: u32) -> u64 {
        u64::from(segment) * self.segment_size as u64
    }

    fn check(&self, segment: u32, offset: usize, len: usize) -> Result<(), TierError> {
        let a = self.alignment;
        if segment >= self.segments
            || offset
                .checked_add(len)
                .is_none_or(|end| end > self.segment_size)
            || offset % a != 0
            || len % a != 0
        {
            return Err(TierError::Io {
                what: "an I/O outside a segment or misaligned",
                errno: Errno(libc::EINVAL),
            });
        }
        Ok(())
    }

    fn rings(&self, wanted: bool) -> Option<&RingPool> {
        if wanted {
            self.rings.as_ref().filter(|r| r.usable())
        } else {
            None
        }
    }

    fn pread(&self, segment: u32, offset: usize, buf: &mut [u8]) -> Result<(), TierError> {
        let fd = self.fd.as_raw_fd();
        let at = self.base(segment) + offset as u64;
        let len = buf.len();
        let p = buf.as_mut_ptr();
        transfer("pread of the SSD log", len, |done| {
            // SAFETY: p[done..len] lies within buf.
            counted(unsafe {
                libc::pread(
                    fd,
                    p.add(done).cast(),
                    len - done,
                    (at + done as u64) as i64,
                )
            })
        })
    }
}

impl SegmentIo for FileIo {
    fn segments(&self) -> u32 {
        self.segments
    }

    fn segment_size(&self) -> usize {
        self.segment_size
    }

    fn alignment(&self) -> usize {
        self.alignment
    }

    fn write_segments(&self, writes: &[(u32, &[u8])]) -> Result<(), TierError> {
        for (seg, bytes) in writes {
            self.check(*seg, 0, bytes.len())?;
            if !self.block && self.trimmed[*seg as usize].load(Ordering::Relaxed) {
                reserve(
                    self.fd.as_raw_fd(),
                    self.base(*seg),
                    self.segment_size as u64,
                )?;
                self.trimmed[*seg as usize].store(false, Ordering::Relaxed);
            }
        }
        if let Some(rings) = self.rings(self.uring.writes) {
            // Each segment as several SQEs (chunks the device can work on in parallel), all
            // segments in one submit.
            const CHUNK: usize = 256 << 10;
            let mut ops = Vec::new();
            for (seg, bytes) in writes {
                for (i, c) in bytes.chunks(CHUNK).enumerate() {
                    ops.push(Op::write(c, self.base(*seg) + (i * CHUNK) as u64));
                }
            }
            return rings.run(
                self.fd.as_raw_fd(),
                &mut ops,
                "io_uring write of the SSD log",
            );
        }
        let fd = self.fd.as_raw_fd();
        for (seg, bytes) in writes {
            let at = self.base(*seg);
            let len = bytes.len();
            let p = bytes.as_ptr();
            transfer("pwrite of the SSD log", len, |done| {
                // SAFETY: p[done..len] lies within bytes.
                counted(unsafe {
                    libc::pwrite(
                        fd,
                        p.add(done).cast(),
                        len - done,
                        (at + done as u64) as i64,
                    )
                })
            })?;
        }
        Ok(())
    }

    fn read_at(&self, segment: u32, offset: usize, buf: &mut [u8]) -> Result<(), TierError> {
        self.check(segment, offset, buf.len())?;
        if let Some(rings) = self.rings(self.uring.reads) {
            let mut ops = [Op::read(buf, self.base(segment) + offset as u64)];
            return rings.run(
                self.fd.as_raw_fd(),
                &mut ops,
                "io_uring read of the SSD log",
            );
        }
        self.pread(segment, offset, buf)
    }

    fn read_ranges(
        &self,
        segment: u32,
        ranges: &mut [(usize, &mut [u8])],
    ) -> Result<(), TierError> {
        for (off, buf) in ranges.iter() {
            self.check(segment, *off, buf.len())?;
        }
        if let Some(rings) = self.rings(self.uring.gathers) {
            let base = self.base(segment);
            let mut ops: Vec<Op> = ranges
                .iter_mut()
                .map(|(off, buf)| Op::read(buf, base + *off as u64))
                .collect();
            return rings.run(
                self.fd.as_raw_fd(),
                &mut ops,
                "io_uring read of the SSD log",
            );
        }
        for (off, buf) in ranges.iter_mut() {
            self.pread(segment, *off, buf)?;
        }
        Ok(())
    }

    fn trim(&self, segment: u32) -> Result<(), TierError> {
        self.check(segment, 0, 0)?;
        let fd = self.fd.as_raw_fd();
        let (start, len) = (self.base(segment), self.segment_size as u64);
        let rc = if self.block {
            let range: [u64; 2] = [start, len];
            // SAFETY: BLKDISCARD reads two u64.
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        } else {
            // SAFETY: a punch on our own file within its size.
            let rc = unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    start as i64,
                    len as i64,
                )
            };
            if rc == 0 {
                self.trimmed[segment as usize].store(true, Ordering::Relaxed);
            }
            rc
        };
        if rc != 0 {
            self.trim_failures.fetch_add(1, Ordering::Relaxed);
            return Err(io_err("trim of an SSD log segment"));
        }
        Ok(())
    }

    fn is_uring(&self) -> bool {
        self.rings.is_some() && self.uring != UringUse::NONE
    }

    fn is_direct(&self) -> bool {
        self.direct
    }
}

/// Opens `path` with `flags` | O_CLOEXEC, with O_DIRECT if it is taken (EINVAL: without).
/// Returns the descriptor and whether O_DIRECT is on.
fn open_flags(
    path: &CString,
    flags: i32,
    mode: libc::mode_t,
) -> Result<(OwnedFd, bool), TierError> {
    for direct in [true, false] {
        let f = flags | libc::O_CLOEXEC | if direct { libc::O_DIRECT } else { 0 };
        // SAFETY: a valid C string; the result is checked.
        let fd = unsafe { libc::open(path.as_ptr(), f, mode as libc::c_uint) };
        if fd >= 0 {
            // SAFETY: a fresh descriptor we own.
            return Ok((unsafe { OwnedFd::from_raw_fd(fd) }, direct));
        }
        let errno = Errno::last();
        if !(direct && errno.0 == libc::EINVAL) {
            return Err(TierError::Io {
                what: "open of the SSD log",
                errno,
            });
        }
    }
    unreachable!("the second attempt returns")
}

/// An unnamed file in directory `dir`: O_TMPFILE, or a file created and unlinked at once where
/// O_TMPFILE is refused.
fn open_unnamed(dir: &CString) -> Result<(OwnedFd, bool), TierError> {
    match open_flags(dir, libc::O_TMPFILE | libc::O_RDWR, 0o600) {
        Ok(r) => return Ok(r),
        Err(TierError::Io { errno, .. })
            if [libc::EOPNOTSUPP, libc::EISDIR, libc::EINVAL].contains(&errno.0) => {}
        Err(e) => return Err(e),
    }
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let pid = std::process::id();
    for _ in 0..100 {
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let mut name = dir.as_bytes().to_vec();
        name.extend_from_slice(format!("/.zmem-log-{pid}-{n}").as_bytes());
        let name = CString::new(name).expect("no NUL: built from a C string and digits");
        match open_flags(&name, libc::O_RDWR | libc::O_CREAT | libc::O_EXCL, 0o600) {
            Ok(r) => {
                // SAFETY: a valid C string.
                unsafe { libc::unlink(name.as_ptr()) };
                return Ok(r);
            }
            Err(TierError::Io { errno, .. }) if errno.0 == libc::EEXIST => continue,
            Err(e) => return Err(e),
        }
    }
    Err(TierError::Io {
        what: "creating the SSD log's file",
        errno: Errno(libc::EEXIST),
    })
}

/// Reserves `len` bytes at `off` (fallocate), so a full file system is an error now rather
/// than at some later write. Where fallocate is not supported, the file is only sized.
fn reserve(fd: RawFd, off: u64, len: u64) -> Result<(), TierError> {
    if len == 0 {
        return Ok(());
    }
    loop {
        // SAFETY: fallocate on our own descriptor.
        if unsafe { libc::fallocate(fd, 0, off as i64, len as i64) } == 0 {
            return Ok(());
        }
        let errno = Errno::last();
        match errno.0 {
            libc::EINTR => continue,
            libc::EOPNOTSUPP => {
                // SAFETY: as above.
                if unsafe { libc::ftruncate(fd, (off + len) as i64) } != 0 {
                    return Err(io_err("sizing the SSD log's file"));
                }
                return Ok(());
            }
            _ => {
                return Err(TierError::Io {
                    what: "reserving the SSD log's space (fallocate)",
                    errno,
                })
            }
        }
    }
}

/// The alignment O_DIRECT needs on `fd`: statx's DIO alignment for files where the kernel
/// reports it, the logical sector size for block devices, else 4096 (always enough).
fn dio_alignment(fd: RawFd, block: bool) -> usize {
    let mut a = 4096usize;
    if block {
        let mut ssz: libc::c_int = 0;
        // SAFETY: BLKSSZGET writes one int.
        if unsafe { libc::ioctl(fd, libc::BLKSSZGET, &mut ssz) } == 0 && ssz > 0 {
            a = ssz as usize;
        }
    } else {
        // SAFETY: a zeroed statx is valid; the kernel fills it.
        let mut stx: libc::statx = unsafe { std::mem::zeroed() };
        let empty = c"";
        // SAFETY: AT_EMPTY_PATH on our descriptor with a valid buffer.
        let rc = unsafe {
            libc::statx(
                fd,
                empty.as_ptr(),
                libc::AT_EMPTY_PATH,
                libc::STATX_DIOALIGN,
                &mut stx,
            )
        };
        if rc == 0 && stx.stx_mask & libc::STATX_DIOALIGN != 0 && stx.stx_dio_offset_align > 0 {
            a = (stx.stx_dio_offset_align.max(stx.stx_dio_mem_align)) as usize;
        }
    }
    if a.is_power_of_two() && (512..=4096).contains(&a) {
        a
    } else {
        4096
    }
}

/// True if an O_DIRECT read of one aligned block at 0 works.
fn probe_direct(fd: RawFd, alignment: usize) -> bool {
    let mut b = AlignedBuf::new(alignment, alignment);
    // SAFETY: reads into our buffer.
    let n = unsafe { libc::pread(fd, b.as_mut_slice().as_mut_ptr().cast(), alignment, 0) };
    !(n < 0 && Errno::last().0 == libc::EINVAL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transfer_retries_short_transfers_and_reports_stalls() {
        let mut calls = 0;
        transfer("t", 10, |done| {
            calls += 1;
            if calls == 2 {
                return Err(Errno(libc::EINTR));
            }
            Ok((10 - done).min(3))
        })
        .unwrap();
        assert_eq!(calls, 5);
        let e = transfer("t", 10, |done| Ok(if done == 0 { 4 } else { 0 })).unwrap_err();
        assert_eq!(
            e,
            TierError::Short {
                what: "t",
                done: 4,
                want: 10
            }
        );
        let e = transfer("t", 10, |_| Err(Errno(libc::EIO))).unwrap_err();
        assert_eq!(
            e,
            TierError::Io {
                what: "t",
                errno: Errno(libc::EIO)
            }
        );
    }

    #[test]
    fn aligned_buffers_are_aligned_and_zeroed() {
        let b = AlignedBuf::new(10_000, 4096);
        assert_eq!(b.as_slice().as_ptr() as usize % 4096, 0);
        assert!(b.as_slice().iter().all(|&x| x == 0));
        assert_eq!(b.len(), 10_000);
    }
}
