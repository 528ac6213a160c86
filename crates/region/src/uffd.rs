//! The userfaultfd calls zmem uses, declared here because the libc crate does not carry the
//! newer ones (UFFDIO_MOVE, UFFDIO_POISON). Every function is a thin, checked wrapper.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use zmem_os::Errno;

const UFFDIO: u64 = 0xAA;
const UFFD_API: u64 = 0xAA;

const fn iowr(nr: u64, size: usize) -> u64 {
    (3 << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}
const fn ior(nr: u64, size: usize) -> u64 {
    (2 << 30) | ((size as u64) << 16) | (UFFDIO << 8) | nr
}

const USERFAULTFD_IOC_NEW: u64 = UFFDIO << 8;
const UFFDIO_API: u64 = iowr(0x3F, 24);
const UFFDIO_REGISTER: u64 = iowr(0x00, 32);
const UFFDIO_UNREGISTER: u64 = ior(0x01, 16);
const UFFDIO_WAKE: u64 = ior(0x02, 16);
const UFFDIO_COPY: u64 = iowr(0x03, 40);
const UFFDIO_ZEROPAGE: u64 = iowr(0x04, 32);
const UFFDIO_MOVE: u64 = iowr(0x05, 40);
const UFFDIO_POISON: u64 = iowr(0x08, 32);

pub const FEATURE_EVENT_FORK: u64 = 1 << 1;
pub const FEATURE_EVENT_REMAP: u64 = 1 << 2;
pub const FEATURE_EVENT_REMOVE: u64 = 1 << 3;
pub const FEATURE_EVENT_UNMAP: u64 = 1 << 6;
/// A user-mode fault raises SIGBUS instead of a message (`FaultRoute::Signal`).
pub const FEATURE_SIGBUS: u64 = 1 << 7;
pub const FEATURE_THREAD_ID: u64 = 1 << 8;
pub const FEATURE_POISON: u64 = 1 << 14;
pub const FEATURE_MOVE: u64 = 1 << 16;

pub const EVENT_PAGEFAULT: u8 = 0x12;
pub const EVENT_FORK: u8 = 0x13;
pub const EVENT_REMAP: u8 = 0x14;
pub const EVENT_REMOVE: u8 = 0x15;
pub const EVENT_UNMAP: u8 = 0x16;

pub const PAGEFAULT_FLAG_WRITE: u64 = 1;

/// The source of `Uffd::copy_zeros`: never written, so reading it costs no memory of ours;
/// page aligned, so the kernel copies whole pages.
static ZEROS: Zeros = Zeros([0; 64 * 1024]);

#[repr(C, align(4096))]
struct Zeros([u8; 64 * 1024]);

const REGISTER_MODE_MISSING: u64 = 1;

#[repr(C)]
#[derive(Default)]
struct Api {
    api: u64,
    features: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Range {
    start: u64,
    len: u64,
}

#[repr(C)]
#[derive(Default)]
struct Register {
    range: Range,
    mode: u64,
    ioctls: u64,
}

#[repr(C)]
#[derive(Default)]
struct Copy {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    copy: i64,
}

#[repr(C)]
#[derive(Default)]
struct Zeropage {
    range: Range,
    mode: u64,
    zeropage: i64,
}

#[repr(C)]
#[derive(Default)]
struct Move {
    dst: u64,
    src: u64,
    len: u64,
    mode: u64,
    moved: i64,
}

#[repr(C)]
#[derive(Default)]
struct Poison {
    range: Range,
    mode: u64,
    updated: i64,
}

/// One message read from a userfaultfd (struct uffd_msg, 32 bytes).
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct Msg {
    pub event: u8,
    _reserved1: u8,
    _reserved2: u16,
    _reserved3: u32,
    /// pagefault: flags; fork: ufd (low 32 bits); remap: from; remove/unmap: start.
    pub arg0: u64,
    /// pagefault: address; remap: to; remove/unmap: end.
    pub arg1: u64,
    /// remap: len.
    pub arg2: u64,
}

const _: () = assert!(std::mem::size_of::<Msg>() == 32);

impl Msg {
    /// A fault a forked process asked about over its link (`forked`), served as a write;
    /// `answer`: the asker waits for the answer (the fault is its own space's).
    pub fn asked(addr: u64, answer: bool) -> Msg {
        Msg {
            event: crate::forked::LINK_FAULT,
            arg0: PAGEFAULT_FLAG_WRITE,
            arg1: addr,
            arg2: answer as u64,
            ..Msg::default()
        }
    }
}

/// How the descriptor was obtained (full mode either way: user-mode-only is never accepted).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    Device,
    Syscall,
}

impl Opened {
    pub fn describe(self) -> &'static str {
        match self {
            Opened::Device => "/dev/userfaultfd",
            Opened::Syscall => "the userfaultfd system call",
        }
    }
}

/// An initialised userfaultfd (non-blocking, close-on-exec).
#[derive(Debug)]
pub struct Uffd {
    fd: OwnedFd,
}

/// The ioctls answer an [`Errno`], not an `io::Error`: they run on zmem's threads, which must
/// not print errors through libc (zmem_os::errno says why).
fn ioctl<T>(fd: RawFd, req: u64, arg: &mut T) -> Result<(), Errno> {
    // SAFETY: `arg` is the struct the request expects, valid for reads and writes.
    let rc = unsafe { libc::ioctl(fd, req as _, arg as *mut T) };
    if rc < 0 {
        Err(Errno::last())
    } else {
        Ok(())
    }
}

/// Why a userfaultfd could not be had.
#[derive(Debug)]
pub enum OpenError {
    /// The kernel has userfaultfd, but this user may not open it in full mode.
    Permission(io::Error),
    /// The kernel has no userfaultfd (ENOSYS), or its API handshake failed.
    Absent(io::Error),
    /// A feature zmem needs is missing (its name, the details).
    Unsupported(&'static str, String),
}

impl Drop for Uffd {
    fn drop(&mut self) {
        // zmem closes it itself (the field's drop, next): no longer the program's to spare.
        zmem_os::fds::unprotect(self.raw());
    }
}

impl Uffd {
    /// Opens a full-mode userfaultfd with `features`, which must all be available.
    pub fn open(features: u64) -> Result<(Uffd, Opened), OpenError> {
        let (uffd, how) = Uffd::open_any()?;
        let mut api = Api {
            api: UFFD_API,
            features,
            ..Default::default()
        };
        if let Err(e) = ioctl(uffd.raw(), UFFDIO_API, &mut api) {
            // Ask what exists, to name what is missing.
            let probe = probe().ok().map(|p| p.features);
            let missing = probe.map(|have| features & !have).unwrap_or(features);
            return Err(OpenError::Unsupported(
                feature_name(missing),
                format!(
                    "UFFDIO_API refused features {features:#x} ({e}); this kernel offers {}",
                    probe.map_or("unknown".to_string(), |p| format!("{p:#x}"))
                ),
            ));
        }
        Ok((uffd, how))
    }

    /// A full-mode descriptor before the API handshake: through /dev/userfaultfd, else the
    /// system call (which without UFFD_USER_MODE_ONLY needs CAP_SYS_PTRACE or the sysctl).
    fn open_any() -> Result<(Uffd, Opened), OpenError> {
        let flags = libc::O_CLOEXEC | libc::O_NONBLOCK;
        let (fd, how) = match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/userfaultfd")
        {
            Ok(dev) => {
                // SAFETY: USERFAULTFD_IOC_NEW takes the flags as its integer argument.
                let fd = unsafe { libc::ioctl(dev.as_raw_fd(), USERFAULTFD_IOC_NEW as _, flags) };
                if fd < 0 {
                    return Err(OpenError::Permission(io::Error::last_os_error()));
                }
                (fd, Opened::Device)
            }
            Err(dev_err) => {
                // SAFETY: plain syscall with integer flags.
                let fd = unsafe { libc::syscall(libc::SYS_userfaultfd, flags) } as i32;
                if fd < 0 {
                    let e = io::Error::last_os_error();
                    if e.raw_os_error() == Some(libc::ENOSYS) {
                        return Err(OpenError::Absent(e));
                    }
                    return Err(OpenError::Permission(io::Error::new(
                        dev_err.kind(),
                        format!("/dev/userfaultfd: {dev_err}; userfaultfd(2): {e}"),
                    )));
                }
                (fd, Opened::Syscall)
            }
        };
        // SAFETY: fd was just returned to us and is owned by nobody else.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // Out of the program's way: a program that closes it would silently lose every evicted
        // page (zmem_os::fds).
        let uffd = Uffd {
            fd: zmem_os::fds::move_high(owned),
        };
        Ok((uffd, how))
    }

    /// Adopts the descriptor of a forked child's userfaultfd (from a FORK event).
    ///
    /// # Safety
    /// `fd` must be an open userfaultfd owned by nobody else.
    pub unsafe fn from_raw(fd: RawFd) -> Uffd {
        // SAFETY: the caller's contract.
        let owned = unsafe { OwnedFd::from_raw_fd(fd) };
        // Fork events hand the descriptor over blocking; every reader here polls first.
        // SAFETY: fcntl on an owned descriptor.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK);
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
        }
        Uffd {
            fd: zmem_os::fds::move_high(owned),
        }
    }

    pub fn raw(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    pub fn register_missing(&self, start: usize, len: usize) -> Result<(), Errno> {
        let mut r = Register {
            range: Range {
                start: start as u64,
                len: len as u64,
            },
            mode: REGISTER_MODE_MISSING,
            ioctls: 0,
        };
        ioctl(self.raw(), UFFDIO_REGISTER, &mut r)
    }

    pub fn unregister(&self, start: usize, len: usize) -> Result<(), Errno> {
        let mut r = Range {
            start: start as u64,
            len: len as u64,
        };
        ioctl(self.raw(), UFFDIO_UNREGISTER, &mut r)
    }

    /// Empties `[start, start + len)`, registered memory of the calling process that nothing
    /// needs any more: unregistered first, so that MADV_DONTNEED sends no REMOVE event (which
    /// would block until a handler read it, and the caller may be that handler), then
    /// registered again. Errors are logged (static text and errno only).
    pub fn clear_registered(&self, start: usize, len: usize) {
        if let Err(e) = self.unregister(start, len) {
            tracing::error!("staging unregister: {e}");
        }
        // SAFETY: the caller's own mapping, whose pages nobody needs.
        unsafe { libc::madvise(start as *mut _, len, libc::MADV_DONTNEED) };
        if let Err(e) = self.register_missing(start, len) {
            tracing::error!("staging register: {e}");
        }
    }

    pub fn wake(&self, start: usize, len: usize) -> Result<(), Errno> {
        let mut r = Range {
            start: start as u64,
            len: len as u64,
        };
        ioctl(self.raw(), UFFDIO_WAKE, &mut r)
    }

    /// Copies `len` bytes from `src` (our memory) into the missing pages at `dst` and wakes
    /// the threads waiting on them. EEXIST: a page of the range is already mapped (the pages
    /// before it were copied).
    pub fn copy(&self, dst: usize, src: *const u8, len: usize) -> Result<(), Errno> {
        let mut c = Copy {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            ..Default::default()
        };
        ioctl(self.raw(), UFFDIO_COPY, &mut c)
    }

    /// Maps private zero-filled pages at the missing `dst` range (copies of `ZEROS`, a chunk at
    /// a time) and wakes the waiters: for memory about to be written. The shared zero page
    /// (`zeropage`) costs a second fault at the first write, and that fault's copy-on-write
    /// flushes the TLB of every CPU the process runs on: an IPI while a zmem thread runs.
    /// EEXIST: a page of the range is already mapped (the pages before it were filled).
    pub fn copy_zeros(&self, dst: usize, len: usize) -> Result<(), Errno> {
        let mut at = 0;
        while at < len {
            let n = (len - at).min(ZEROS.0.len());
            self.copy(dst + at, ZEROS.0.as_ptr(), n)?;
            at += n;
        }
        Ok(())
    }

    /// Maps the shared zero page at the missing `dst` range and wakes the waiters.
    pub fn zeropage(&self, dst: usize, len: usize) -> Result<(), Errno> {
        let mut z = Zeropage {
            range: Range {
                start: dst as u64,
                len: len as u64,
            },
            ..Default::default()
        };
        ioctl(self.raw(), UFFDIO_ZEROPAGE, &mut z)
    }

    /// Moves the pages at `src` to the empty `dst` (both registered with this descriptor).
    pub fn move_pages(&self, dst: usize, src: usize, len: usize) -> Result<(), Errno> {
        let mut m = Move {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            ..Default::default()
        };
        ioctl(self.raw(), UFFDIO_MOVE, &mut m)
    }

    /// Whether this descriptor serves the calling process's memory. The kernel refuses a move
    /// across address spaces (EINVAL) before it looks at the pages; in our own space a move
    /// from `free` (a registered page of ours, empty) to the page after it fails with ENOENT,
    /// or moves whatever was there (so `free` must be a page nobody relies on).
    pub fn serves_this_process(&self, free: usize) -> bool {
        for _ in 0..1000 {
            match self.move_pages(free + crate::config::PAGE, free, crate::config::PAGE) {
                Err(e) if e.code() == libc::EINVAL => return false,
                // A fork or range event in flight (mmap_changing): ask again.
                Err(e) if e.code() == libc::EAGAIN => {
                    std::thread::sleep(std::time::Duration::from_micros(100))
                }
                _ => return true,
            }
        }
        true
    }

    /// Moves the run of pages at `src` to `dst` in one call. The kernel (6.18 and later) then
    /// flushes the TLB once per run of present pages instead of once per page: with another
    /// CPU running the process, 15.6 µs per page moved alone against 1.1 at 16 pages and 0.27
    /// at 64 (measured here, docs/DESIGN-NOTES.md "Eviction in runs"). On a failure part-way,
    /// `Err((errno, bytes))` says how many bytes did move (0: none).
    pub fn move_run(&self, dst: usize, src: usize, len: usize) -> Result<(), (Errno, usize)> {
        let mut m = Move {
            dst: dst as u64,
            src: src as u64,
            len: len as u64,
            ..Default::default()
        };
        ioctl(self.raw(), UFFDIO_MOVE, &mut m).map_err(|e| (e, m.moved.max(0) as usize))
    }

    /// Makes an access to the missing pages at `dst` raise SIGBUS (for what cannot be served).
    pub fn poison(&self, dst: usize, len: usize) -> Result<(), Errno> {
        let mut p = Poison {
            range: Range {
                start: dst as u64,
                len: len as u64,
            },
            ..Default::default()
        };
        ioctl(self.raw(), UFFDIO_POISON, &mut p)
    }

    /// Reads messages without blocking; returns how many were read (0: none pending).
    pub fn read_msgs(&self, out: &mut [Msg]) -> Result<usize, Errno> {
        let size = std::mem::size_of_val(out);
        // SAFETY: `out` is valid for `size` bytes and Msg is plain old data.
        let n = unsafe { libc::read(self.raw(), out.as_mut_ptr().cast(), size) };
        if n < 0 {
            let e = Errno::last();
            if e.code() == libc::EAGAIN {
                return Ok(0);
            }
            return Err(e);
        }
        Ok(n as usize / std::mem::size_of::<Msg>())
    }
}

/// What this user and kernel offer: a full-mode userfaultfd could be opened (how), and the
/// features its API handshake reports. `zmem doctor` shows it against [`NEEDED_FEATURES`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Probe {
    pub features: u64,
    pub via: Opened,
}

/// Opens a full-mode userfaultfd as a region does and asks the kernel which features it offers.
pub fn probe() -> Result<Probe, OpenError> {
    let (uffd, via) = Uffd::open_any()?;
    let mut api = Api {
        api: UFFD_API,
        ..Default::default()
    };
    ioctl(uffd.raw(), UFFDIO_API, &mut api).map_err(|e| OpenError::Absent(e.into()))?;
    Ok(Probe {
        features: api.features,
        via,
    })
}

/// The features every region asks for, with their names (linux/userfaultfd.h).
pub const NEEDED_FEATURES: [(u64, &str); 7] = [
    (FEATURE_EVENT_FORK, "EVENT_FORK"),
    (FEATURE_EVENT_REMAP, "EVENT_REMAP"),
    (FEATURE_EVENT_REMOVE, "EVENT_REMOVE"),
    (FEATURE_EVENT_UNMAP, "EVENT_UNMAP"),
    (FEATURE_MOVE, "MOVE"),
    (FEATURE_POISON, "POISON"),
    (FEATURE_THREAD_ID, "THREAD_ID"),
];

/// [`NEEDED_FEATURES`] as one mask.
pub const NEEDED: u64 = {
    let mut m = 0;
    let mut i = 0;
    while i < NEEDED_FEATURES.len() {
        m |= NEEDED_FEATURES[i].0;
        i += 1;
    }
    m
};

fn feature_name(bits: u64) -> &'static str {
    if bits & FEATURE_MOVE != 0 {
        "UFFDIO_MOVE (Linux 6.8 or later)"
    } else if bits & FEATURE_EVENT_FORK != 0 {
        "UFFD_FEATURE_EVENT_FORK"
    } else if bits & (FEATURE_EVENT_REMOVE | FEATURE_EVENT_UNMAP | FEATURE_EVENT_REMAP) != 0 {
        "the REMOVE/UNMAP/REMAP events"
    } else if bits & FEATURE_SIGBUS != 0 {
        "UFFD_FEATURE_SIGBUS"
    } else if bits & FEATURE_POISON != 0 {
        "UFFDIO_POISON (Linux 6.6 or later)"
    } else {
        "a required feature"
    }
}
