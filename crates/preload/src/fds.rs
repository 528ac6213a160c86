//! The program's `close`, `close_range`, `closefrom`, `dup2` and `dup3`, which leave zmem's own
//! descriptors alone (zmem_os::fds says why: closing a region's userfaultfd silently turns every
//! evicted page into zeros). A close of one of them reports success and closes nothing; a dup2
//! onto one fails with EBUSY (which Linux's dup2 may return anyway) and one message on stderr.
//! Everything else goes to the C library's own functions.

use std::ffi::{c_int, c_uint, c_void, CStr};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, Ordering::*};

use zmem_os::fds::{is_protected, protected_in};

/// The next definition of `name` after this library's (glibc's), looked up once.
pub(crate) fn next(cache: &AtomicPtr<c_void>, name: &CStr) -> *mut c_void {
    let mut f = cache.load(Acquire);
    if f.is_null() {
        // SAFETY: a lookup by a static name.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) };
        cache.store(f, Release);
    }
    f
}

unsafe fn real_close(fd: c_int) -> c_int {
    static F: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let f = next(&F, c"close");
    if f.is_null() {
        return libc::syscall(libc::SYS_close, fd) as c_int;
    }
    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int) -> c_int>(f)(fd)
}

unsafe fn real_close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    libc::syscall(libc::SYS_close_range, first, last, flags) as c_int
}

/// # Safety
/// C's close.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    if is_protected(fd) {
        return 0;
    }
    real_close(fd)
}

/// # Safety
/// Linux's close_range: the range is closed around zmem's descriptors.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: c_uint, last: c_uint, flags: c_int) -> c_int {
    const CLOSE_RANGE_CLOEXEC: c_int = 1 << 2;
    if flags & CLOSE_RANGE_CLOEXEC != 0 || first > last {
        // Marking close-on-exec harms nothing (zmem's descriptors are already).
        return real_close_range(first, last, flags);
    }
    let mut from = first;
    for fd in protected_in(first, last) {
        let fd = fd as c_uint;
        if fd > from && real_close_range(from, fd - 1, flags) != 0 {
            return -1;
        }
        from = fd + 1;
    }
    if from <= last {
        return real_close_range(from, last, flags);
    }
    0
}

/// # Safety
/// glibc's closefrom.
#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    let first = lowfd.max(0) as c_uint;
    if close_range(first, c_uint::MAX, 0) != 0 {
        // No close_range (Linux < 5.9): one by one, up to the descriptor limit.
        let max = libc::sysconf(libc::_SC_OPEN_MAX).max(1024) as c_int;
        for fd in lowfd.max(0)..max {
            close(fd);
        }
    }
}

fn refuse_dup_onto(newfd: c_int) -> c_int {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Relaxed) {
        let msg = format!(
            "zmem: refusing dup2 onto descriptor {newfd}: it is zmem's (the heap's userfaultfd or stats socket) (EBUSY)\n"
        );
        // SAFETY: writing our own buffer to stderr.
        unsafe { libc::write(2, msg.as_ptr().cast(), msg.len()) };
    }
    crate::set_errno(libc::EBUSY);
    -1
}

/// # Safety
/// C's dup2.
#[no_mangle]
pub unsafe extern "C" fn dup2(oldfd: c_int, newfd: c_int) -> c_int {
    if oldfd != newfd && is_protected(newfd) {
        return refuse_dup_onto(newfd);
    }
    static F: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let f = next(&F, c"dup2");
    if f.is_null() {
        return libc::syscall(libc::SYS_dup3, oldfd, newfd, 0) as c_int;
    }
    std::mem::transmute::<*mut c_void, unsafe extern "C" fn(c_int, c_int) -> c_int>(f)(oldfd, newfd)
}

/// # Safety
/// Linux's dup3.
#[no_mangle]
pub unsafe extern "C" fn dup3(oldfd: c_int, newfd: c_int, flags: c_int) -> c_int {
    if oldfd != newfd && is_protected(newfd) {
        return refuse_dup_onto(newfd);
    }
    libc::syscall(libc::SYS_dup3, oldfd, newfd, flags) as c_int
}
