//! Errors of system calls, printed without libc.
//!
//! `std::io::Error`'s Display asks libc's `strerror_r`, which translates the message through
//! `dcgettext`: that reads the program's locale data (malloc'd by `setlocale`, so in the
//! program's heap) under a lock the program may hold. A zmem thread that serves faults must
//! never do either (it could fault on a page only it can bring back: a hang found on `xz` under
//! `zmem run`). So code on zmem's threads reports an [`Errno`], whose text comes from a static
//! table, and prints other `io::Error`s through [`display`].

use std::fmt;
use std::io;

/// An `errno` value from a failed system call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Errno(pub i32);

impl Errno {
    /// The calling thread's `errno` (right after a call failed).
    pub fn last() -> Errno {
        // SAFETY: errno is thread local and always readable.
        Errno(unsafe { *libc::__errno_location() })
    }

    /// Sets the calling thread's `errno`.
    pub fn set(code: i32) {
        // SAFETY: errno is thread local and always writable.
        unsafe { *libc::__errno_location() = code };
    }

    pub fn code(self) -> i32 {
        self.0
    }

    /// The code of an OS error (EIO for one that carries none), printable on zmem's threads.
    pub fn of(e: &io::Error) -> Errno {
        Errno(e.raw_os_error().unwrap_or(libc::EIO))
    }

    /// The symbolic name ("EEXIST"), or "E?" for a code this table does not know.
    pub fn name(self) -> &'static str {
        NAMES
            .iter()
            .find(|(c, _)| *c == self.0)
            .map_or("E?", |(_, n)| n)
    }
}

/// The calling thread's `errno`, kept across zmem's work on a program thread and put back when
/// dropped. errno is the program's: code that sets it to 0, makes a call and takes a non-zero
/// errno as that call's failure (`sort`'s strcoll check, `getpwnam`'s "not found") must not
/// see the errno of a call zmem made meanwhile, in a fault served on its thread (an EEXIST or
/// EAGAIN from the userfaultfd ioctls), a trapped system call or inside malloc.
#[must_use]
pub struct KeepErrno(i32);

impl KeepErrno {
    pub fn new() -> KeepErrno {
        KeepErrno(Errno::last().0)
    }

    /// Puts errno back now and not again when dropped: before control passes to the program's
    /// own code (a signal handler zmem forwards to), which may set it.
    pub fn restore_now(self) {
        drop(self)
    }

    /// Leaves errno as zmem's work set it: the work failed and errno says why.
    pub fn dismiss(self) {
        std::mem::forget(self)
    }
}

impl Default for KeepErrno {
    fn default() -> Self {
        KeepErrno::new()
    }
}

impl Drop for KeepErrno {
    fn drop(&mut self) {
        // SAFETY: errno is thread local and always writable.
        unsafe { *libc::__errno_location() = self.0 };
    }
}

/// The codes the kernel returns to zmem's calls (userfaultfd ioctls, madvise, mmap, poll, read,
/// io_uring, files under /proc and /sys), by name.
const NAMES: &[(i32, &str)] = &[
    (libc::EPERM, "EPERM"),
    (libc::ENOENT, "ENOENT"),
    (libc::ESRCH, "ESRCH"),
    (libc::EINTR, "EINTR"),
    (libc::EIO, "EIO"),
    (libc::ENXIO, "ENXIO"),
    (libc::E2BIG, "E2BIG"),
    (libc::EBADF, "EBADF"),
    (libc::EAGAIN, "EAGAIN"),
    (libc::ENOMEM, "ENOMEM"),
    (libc::EACCES, "EACCES"),
    (libc::EFAULT, "EFAULT"),
    (libc::EBUSY, "EBUSY"),
    (libc::EEXIST, "EEXIST"),
    (libc::ENODEV, "ENODEV"),
    (libc::ENOTDIR, "ENOTDIR"),
    (libc::EISDIR, "EISDIR"),
    (libc::EINVAL, "EINVAL"),
    (libc::ENFILE, "ENFILE"),
    (libc::EMFILE, "EMFILE"),
    (libc::ENOTTY, "ENOTTY"),
    (libc::EFBIG, "EFBIG"),
    (libc::ENOSPC, "ENOSPC"),
    (libc::ESPIPE, "ESPIPE"),
    (libc::EROFS, "EROFS"),
    (libc::EPIPE, "EPIPE"),
    (libc::ERANGE, "ERANGE"),
    (libc::ENOSYS, "ENOSYS"),
    (libc::EOVERFLOW, "EOVERFLOW"),
    (libc::EOPNOTSUPP, "EOPNOTSUPP"),
    (libc::ECONNREFUSED, "ECONNREFUSED"),
    (libc::ECONNRESET, "ECONNRESET"),
    (libc::ETIMEDOUT, "ETIMEDOUT"),
    (libc::ECANCELED, "ECANCELED"),
    (libc::EHWPOISON, "EHWPOISON"),
];

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (errno {})", self.name(), self.0)
    }
}

impl std::error::Error for Errno {}

impl From<Errno> for io::Error {
    fn from(e: Errno) -> io::Error {
        io::Error::from_raw_os_error(e.0)
    }
}

/// Prints an `io::Error` without libc: an OS error by its [`Errno`] name, any other by its own
/// (static or owned) message.
pub fn display(e: &io::Error) -> impl fmt::Display + '_ {
    struct Shown<'a>(&'a io::Error);
    impl fmt::Display for Shown<'_> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            match self.0.raw_os_error() {
                Some(code) => Errno(code).fmt(f),
                None => self.0.fmt(f),
            }
        }
    }
    Shown(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_known_codes_and_marks_unknown_ones() {
        assert_eq!(Errno(libc::EEXIST).to_string(), "EEXIST (errno 17)");
        assert_eq!(Errno(libc::EAGAIN).name(), "EAGAIN");
        assert_eq!(Errno(4000).to_string(), "E? (errno 4000)");
    }

    #[test]
    fn last_reads_the_failed_calls_errno() {
        // SAFETY: closing a descriptor that cannot be open fails with EBADF and touches nothing.
        let rc = unsafe { libc::close(-1) };
        assert_eq!(rc, -1);
        assert_eq!(Errno::last(), Errno(libc::EBADF));
    }

    #[test]
    fn kept_errno_comes_back_unless_dismissed() {
        Errno::set(libc::EDOM);
        {
            let _kept = KeepErrno::new();
            Errno::set(libc::EEXIST);
        }
        assert_eq!(Errno::last(), Errno(libc::EDOM));
        let kept = KeepErrno::new();
        Errno::set(libc::EAGAIN);
        kept.restore_now();
        assert_eq!(Errno::last(), Errno(libc::EDOM));
        let kept = KeepErrno::new();
        Errno::set(libc::ENOMEM);
        kept.dismiss();
        assert_eq!(Errno::last(), Errno(libc::ENOMEM));
    }

    #[test]
    fn display_of_io_errors_never_asks_libc() {
        let os = io::Error::from_raw_os_error(libc::ENOMEM);
        assert_eq!(display(&os).to_string(), "ENOMEM (errno 12)");
        let own = io::Error::new(io::ErrorKind::InvalidData, "bad psi line");
        assert_eq!(display(&own).to_string(), "bad psi line");
        let back: io::Error = Errno(libc::EBUSY).into();
        assert_eq!(back.raw_os_error(), Some(libc::EBUSY));
    }
}
