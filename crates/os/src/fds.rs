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
        // SAFETY: closing our own old number; the duplicate holds the file.
        unsafe { libc::close(raw) };
        moved
    } else {
        raw
    };
    protect(keep);
    // SAFETY: `keep` is open and owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(keep) }
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
}
