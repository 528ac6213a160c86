//! Another process's memory, read and written by address (process_vm_readv/writev): how the
//! region serves a forked child, whose pages live in the child's address space, not ours.
//! Neither call allocates or goes through libc's error strings, so both are safe on zmem's
//! own threads.

use crate::Errno;

/// Whether processes `a` and `b` share one address space (kcmp(2) KCMP_VM): a vfork or
/// posix_spawn child and its parent do, a forked child and its parent do not. False when
/// either is gone or kcmp is refused.
pub fn same_address_space(a: libc::pid_t, b: libc::pid_t) -> bool {
    /// kcmp(2)'s type for "same address space" (linux/kcmp.h).
    const KCMP_VM: libc::c_int = 1;
    // SAFETY: kcmp compares two processes' address spaces and reads no memory of ours.
    a > 0 && b > 0 && unsafe { libc::syscall(libc::SYS_kcmp, a, b, KCMP_VM, 0, 0) } == 0
}

/// Copies `buf.len()` bytes at `addr` in process (or thread) `pid` into `buf`. A short copy
/// (part of the range is not mapped there) is EFAULT.
pub fn read(pid: libc::pid_t, addr: usize, buf: &mut [u8]) -> Result<(), Errno> {
    transfer(pid, addr, buf.as_mut_ptr(), buf.len(), false)
}

/// Copies `buf` to `addr` in process (or thread) `pid`. A short copy is EFAULT.
pub fn write(pid: libc::pid_t, addr: usize, buf: &[u8]) -> Result<(), Errno> {
    transfer(pid, addr, buf.as_ptr() as *mut u8, buf.len(), true)
}

/// One process_vm_readv (`to_remote` false: `local` is written) or process_vm_writev (`local`
/// is only read) of `len` bytes.
fn transfer(
    pid: libc::pid_t,
    addr: usize,
    local: *mut u8,
    len: usize,
    to_remote: bool,
) -> Result<(), Errno> {
    let local = libc::iovec {
        iov_base: local.cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: `local` covers a buffer of the caller's that is valid for `len` bytes (writable
    // for a read); the other process's memory is checked by the kernel.
    let n = unsafe {
        if to_remote {
            libc::process_vm_writev(pid, &local, 1, &remote, 1, 0)
        } else {
            libc::process_vm_readv(pid, &local, 1, &remote, 1, 0)
        }
    };
    finish(n, len)
}

fn finish(n: isize, len: usize) -> Result<(), Errno> {
    if n < 0 {
        Err(Errno::last())
    } else if n as usize != len {
        Err(Errno(libc::EFAULT))
    } else {
        Ok(())
    }
}

/// Whether the page at `addr` is present in process `pid`'s memory (its /proc pagemap entry's
/// bit 63, readable for a process of the same user); None if the entry cannot be read. Opens,
/// reads and closes the file each time, allocating nothing. (How a forked child's link learns
/// which space a grandchild's pid is: `region::forked`.)
pub fn page_present(pid: libc::pid_t, addr: usize) -> Option<bool> {
    let mut path = [0u8; 32];
    let mut n = 0;
    for b in b"/proc/" {
        path[n] = *b;
        n += 1;
    }
    let mut digits = [0u8; 10];
    let (mut v, mut k) = (pid.max(0) as u32, digits.len());
    loop {
        k -= 1;
        digits[k] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for &b in &digits[k..] {
        path[n] = b;
        n += 1;
    }
    for b in b"/pagemap\0" {
        path[n] = *b;
        n += 1;
    }
    let mut entry = 0u64;
    // SAFETY: a NUL-terminated path in a local buffer; 8 bytes read into a local; the
    // descriptor opened here is closed here.
    let got = unsafe {
        let fd = libc::open(path.as_ptr().cast(), libc::O_RDONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return None;
        }
        let off = (addr / 4096 * 8) as libc::off_t;
        let got = libc::pread(fd, (&mut entry as *mut u64).cast(), 8, off);
        libc::close(fd);
        got
    };
    (got == 8).then_some(entry >> 63 == 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_and_writes_a_child_and_reports_errors() {
        let mut page = vec![7u8; 4096];
        let addr = page.as_mut_ptr() as usize;
        let mut ready = [0i32; 2];
        // SAFETY: a pipe into a valid array of two ints.
        assert_eq!(unsafe { libc::pipe(ready.as_mut_ptr()) }, 0);
        // SAFETY: the child only sleeps in read(2) and exits.
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let mut b = 0u8;
            // SAFETY: reading one byte into a local; then leaving without destructors.
            unsafe {
                libc::read(ready[0], (&mut b as *mut u8).cast(), 1);
                libc::_exit(i32::from(page[100]));
            }
        }
        let mut got = vec![0u8; 4096];
        read(pid, addr, &mut got).expect("read the child's page");
        assert!(got.iter().all(|&b| b == 7));
        write(pid, addr + 100, &[42]).expect("write into the child");
        let mut one = [0u8; 1];
        read(pid, addr + 100, &mut one).unwrap();
        assert_eq!(one[0], 42);
        // Our own copy is untouched: the child's page is its own after the write.
        assert_eq!(page[100], 7);
        // Nothing mapped at address 0 in the child.
        assert_eq!(read(pid, 0, &mut one).unwrap_err().code(), libc::EFAULT);
        // SAFETY: one byte to the pipe, then reaping our own child.
        let status = unsafe {
            libc::write(ready[1], b"x".as_ptr().cast(), 1);
            let mut st = 0;
            libc::waitpid(pid, &mut st, 0);
            st
        };
        assert_eq!(libc::WEXITSTATUS(status), 42, "the child saw our write");
        assert_eq!(read(pid, addr, &mut one).unwrap_err().code(), libc::ESRCH);
    }

    #[test]
    fn page_present_tells_a_written_page_from_an_untouched_one() {
        // SAFETY: a private anonymous mapping of two pages, ours alone, unmapped at the end.
        unsafe {
            let p = libc::mmap(
                std::ptr::null_mut(),
                8192,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            ) as *mut u8;
            assert_ne!(p as *mut libc::c_void, libc::MAP_FAILED);
            p.write_volatile(1);
            let me = libc::getpid();
            assert_eq!(super::page_present(me, p as usize), Some(true));
            assert_eq!(super::page_present(me, p as usize + 4096), Some(false));
            assert_eq!(super::page_present(-1, p as usize), None);
            libc::munmap(p.cast(), 8192);
        }
    }
}
