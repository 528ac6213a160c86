//! zmem's own descriptors inside a program (its userfaultfds, the stats socket), kept out of the
//! program's way.
//!
//! A program may close every descriptor it did not open (daemons loop `close(3..)` or call
//! `close_range`/`closefrom`) or `dup2` onto a number it believes free (a shell's `exec 3>file`).
//! Closing a region's userfaultfd unregisters its memory: every evicted page then reads as zeros,
//! silently (measured: 25 MB of a 32 MB heap wrong). So zmem's descriptors are moved to high
//! numbers ([`move_high`]) and registered here ([`protect`]); the preload library's `close`,
//! `close_range`, `closefrom`, `dup2` and `dup3` consult [`is_protected`]. The set is a static
//! bitmap (no allocation, async-signal-safe reads), inherited by a forked child.

use std::os::fd::{FromRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Descriptors at or above this number are never protected (none of zmem's is ever there).
pub const MAX_FD: usize = 1 << 16;
static PROTECTED: [AtomicU64; MAX_FD / 64] = [const { AtomicU64::new(0) }; MAX_FD / 64];

fn slot(fd: RawFd) -> Option<(&'static AtomicU64, u64)> {
    let i = usize::try_from(fd).ok().filter(|&i| i < MAX_FD)?;
    Some((&PROTECTED[i / 64], 1u64 << (i % 64)))
}

/// Marks `fd` as zmem's: the program's close/dup2 leave it alone.
pub fn protect(fd: RawFd) {
    if let Some((w, bit)) = slot(fd) {
        w.fetch_or(bit, Relaxed);
    }
}

/// zmem is about to close `fd` itself.
pub fn unprotect(fd: RawFd) {
    if let Some((w, bit)) = slot(fd) {
        w.fetch_and(!bit, Relaxed);
    }
}

pub fn is_protected(fd: RawFd) -> bool {
    slot(fd).is_some_and(|(w, bit)| w.load(Relaxed) & bit != 0)
}

/// The protected descriptors in `[first, last]`, ascending (for splitting a `close_range`).
pub fn protected_in(first: u32, last: u32) -> impl Iterator<Item = RawFd> {
    let hi = (last as u64).min(MAX_FD as u64 - 1) as u32;
    let words = (first as usize / 64)..=(hi as usize / 64).min(MAX_FD / 64 - 1);
    words
        .filter(move |_| first <= hi)
        .flat_map(|w| {
            let bits = PROTECTED[w].load(Relaxed);
            (0..64)
                .filter(move |b| bits & (1 << b) != 0)
                .map(move |b| (w * 64 + b) as RawFd)
        })
        .filter(move |&fd| fd as u32 >= first && fd as u32 <= hi)
}

/// Where zmem's descriptors go: just below the soft descriptor limit (at most 1024), far from
/// the low numbers programs pick for themselves.
fn high_base() -> RawFd {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct.
    let limit = if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) } == 0 {
        r.rlim_cur.min(1024) as RawFd
    } else {
        1024
    };
    (limit - 64).max(3)
}

/// `fd` moved to a high number (close-on-exec) and protected; the old number is closed. If no
/// high number is free it stays where it is (still protected).
pub fn move_high(fd: OwnedFd) -> OwnedFd {
    let raw = fd.into_raw_fd();
    // SAFETY: duplicating a descriptor we own.
    let moved = unsafe { libc::fcntl(raw, libc::F_DUPFD_CLOEXEC, high_base()) };
    let keep = if moved >= 0 {
        // The old number may be protected already (moved twice): closed past the preload
        // library's close, which would keep it open (a forked child's thread left its own
        // userfaultfd open that way, and the child's faults then waited for nobody).
        unprotect(raw);
        // SAFETY: closing our own old number; the duplicate holds the file.
        unsafe { libc::syscall(libc::SYS_close, raw) };
        moved
    } else {
        raw
    };
    protect(keep);
    // SAFETY: `keep` is open and owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(keep) }
}

/// Adds one to eventfd `fd`'s count: a poll on it wakes. Allocates nothing.
pub fn eventfd_signal(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writing 8 bytes from a local to a descriptor; a bad one fails harmlessly.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Empties eventfd `fd` (non-blocking: returns at once if it is empty). Allocates nothing.
pub fn eventfd_drain(fd: RawFd) {
    let mut v = 0u64;
    // SAFETY: reading 8 bytes into a local from a descriptor; a bad one fails harmlessly.
    unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
}

/// A non-blocking, close-on-exec eventfd at a high number ([`move_high`], so protected): zmem's
/// wake-ups never take the low numbers a program expects to get from its own next `open`.
pub fn eventfd() -> std::io::Result<OwnedFd> {
    // SAFETY: plain eventfd creation.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: just made, owned by nobody else.
    Ok(move_high(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// A connected pair of datagram sockets that keep message boundaries (SOCK_SEQPACKET,
/// close-on-exec): zmem's link between a process and the child it forks.
pub fn seqpacket_pair() -> std::io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as RawFd; 2];
    // SAFETY: socketpair fills two descriptors into a valid array.
    let r = unsafe {
        libc::socketpair(
            libc::AF_UNIX,
            libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
            0,
            fds.as_mut_ptr(),
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: both descriptors are new and ours.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Sends descriptor `fd` over the socket `sock` (SCM_RIGHTS, with one byte of data).
pub fn send_fd(sock: RawFd, fd: RawFd) -> Result<(), crate::Errno> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut cmsg = [0u64; 4]; // CMSG_SPACE(sizeof(int)) = 24 bytes, 8-aligned
                              // SAFETY: a zeroed msghdr is valid; the pointers below outlive the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE is a pure size computation.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(std::mem::size_of::<RawFd>() as u32) } as usize;
    // SAFETY: the control buffer is large enough for one header with one int.
    unsafe {
        let h = libc::CMSG_FIRSTHDR(&msg);
        (*h).cmsg_level = libc::SOL_SOCKET;
        (*h).cmsg_type = libc::SCM_RIGHTS;
        (*h).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<RawFd>() as u32) as usize;
        std::ptr::write_unaligned(libc::CMSG_DATA(h).cast::<RawFd>(), fd);
    }
    // SAFETY: msg points at valid buffers.
    if unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) } == 1 {
        Ok(())
    } else {
        Err(crate::Errno::last())
    }
}

/// Receives a descriptor sent by [`send_fd`] (close-on-exec); blocks. The other end closed
/// without sending: ENOTCONN.
pub fn recv_fd(sock: RawFd) -> Result<OwnedFd, crate::Errno> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut cmsg = [0u64; 4];
    // SAFETY: as in send_fd.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = cmsg.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&cmsg);
    // SAFETY: msg points at valid buffers.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(crate::Errno::last());
    }
    // SAFETY: walking the control messages the kernel wrote into our buffer.
    unsafe {
        let h = libc::CMSG_FIRSTHDR(&msg);
        if n == 0 || h.is_null() || (*h).cmsg_type != libc::SCM_RIGHTS {
            return Err(crate::Errno(libc::ENOTCONN));
        }
        let fd = std::ptr::read_unaligned(libc::CMSG_DATA(h).cast::<RawFd>());
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protected_set_and_ranges() {
        protect(1000);
        protect(1005);
        protect(70_000); // beyond MAX_FD: ignored
        assert!(is_protected(1000) && is_protected(1005));
        assert!(!is_protected(1001) && !is_protected(-1) && !is_protected(70_000));
        assert_eq!(
            protected_in(990, 1010).collect::<Vec<_>>(),
            vec![1000, 1005]
        );
        assert_eq!(protected_in(1001, u32::MAX).collect::<Vec<_>>(), vec![1005]);
        assert_eq!(protected_in(1006, 1003).count(), 0);
        unprotect(1000);
        unprotect(1005);
        assert!(!is_protected(1000));
    }

    #[test]
    fn move_high_keeps_the_file_and_frees_the_low_number() {
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let low = std::os::fd::AsRawFd::as_raw_fd(&f);
        let moved = move_high(OwnedFd::from(f));
        let high = std::os::fd::AsRawFd::as_raw_fd(&moved);
        assert!(high >= high_base(), "{high}");
        assert!(is_protected(high) && high != low);
        // SAFETY: F_GETFD only asks about the descriptor.
        let flags = unsafe { libc::fcntl(high, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        unprotect(high);
    }

    #[test]
    fn moving_twice_closes_and_releases_the_middle_number() {
        let f = std::fs::File::open("/proc/self/stat").unwrap();
        let first = move_high(OwnedFd::from(f));
        let middle = std::os::fd::AsRawFd::as_raw_fd(&first);
        let last = move_high(first);
        let high = std::os::fd::AsRawFd::as_raw_fd(&last);
        // Left protected, the preload library's close would have kept it open.
        assert!(!is_protected(middle) && is_protected(high) && high != middle);
        // SAFETY: F_GETFD only asks about the descriptor.
        assert_eq!(unsafe { libc::fcntl(middle, libc::F_GETFD) }, -1);
        unprotect(high);
    }

    #[test]
    fn a_descriptor_crosses_a_seqpacket_pair_and_eof_is_reported() {
        use std::os::fd::AsRawFd;
        let (a, b) = seqpacket_pair().unwrap();
        let (r, w) = {
            let mut p = [0; 2];
            // SAFETY: a pipe into a valid array.
            assert_eq!(unsafe { libc::pipe(p.as_mut_ptr()) }, 0);
            // SAFETY: both ends are new and ours.
            unsafe { (OwnedFd::from_raw_fd(p[0]), OwnedFd::from_raw_fd(p[1])) }
        };
        send_fd(a.as_raw_fd(), w.as_raw_fd()).unwrap();
        drop(w);
        let got = recv_fd(b.as_raw_fd()).unwrap();
        // SAFETY: writing to the received pipe end, reading from ours.
        let mut c = [0u8; 1];
        unsafe {
            assert_eq!(libc::write(got.as_raw_fd(), b"z".as_ptr().cast(), 1), 1);
            assert_eq!(libc::read(r.as_raw_fd(), c.as_mut_ptr().cast(), 1), 1);
        }
        assert_eq!(&c, b"z");
        drop(a);
        assert_eq!(recv_fd(b.as_raw_fd()).unwrap_err().code(), libc::ENOTCONN);
    }
}
