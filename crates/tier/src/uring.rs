//! io_uring for the file backend: a pool of rings, and one routine that runs a batch of reads or
//! writes through a ring (all submitted at once, short transfers resubmitted for the rest, every
//! submitted operation waited for before it returns, error or not: the kernel owns the buffers
//! until then).
//!
//! A ring is used by one thread at a time (taken from the pool, put back after), so concurrent
//! callers never wait for each other's I/O. Rings are not used in a forked child (the memory of
//! a ring is shared with the parent's): the backend falls back to pread/pwrite there.

use std::collections::VecDeque;
use std::os::fd::RawFd;

use io_uring::{opcode, types, IoUring};
use zmem_os::sync::Mutex;
use zmem_os::Errno;

use crate::io::{counted, transfer};
use crate::TierError;

/// Submission queue entries per ring (a batch larger than this is submitted in waves).
const ENTRIES: u32 = 64;
/// Idle rings kept for reuse.
const KEEP: usize = 8;

/// One read or write of a batch.
pub(crate) struct Op {
    ptr: *mut u8,
    len: usize,
    off: u64,
    done: usize,
    write: bool,
}

impl Op {
    /// A write of `buf` at file offset `off`; `buf` must outlive the `run` it is given to.
    pub(crate) fn write(buf: &[u8], off: u64) -> Op {
        Op {
            ptr: buf.as_ptr().cast_mut(),
            len: buf.len(),
            off,
            done: 0,
            write: true,
        }
    }

    /// A read into `buf` at file offset `off`.
    pub(crate) fn read(buf: &mut [u8], off: u64) -> Op {
        Op {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
            off,
            done: 0,
            write: false,
        }
    }

    fn entry(&self, fd: RawFd, user: u64) -> io_uring::squeue::Entry {
        let rest = (self.len - self.done).min(u32::MAX as usize) as u32;
        let off = self.off + self.done as u64;
        // SAFETY: done < len, so ptr + done is within the operation's buffer.
        let p = unsafe { self.ptr.add(self.done) };
        if self.write {
            opcode::Write::new(types::Fd(fd), p, rest)
                .offset(off)
                .build()
                .user_data(user)
        } else {
            opcode::Read::new(types::Fd(fd), p, rest)
                .offset(off)
                .build()
                .user_data(user)
        }
    }

    /// The same operation through pread/pwrite.
    fn run_sync(&mut self, fd: RawFd, what: &'static str) -> Result<(), TierError> {
        let (p, len, off, write) = (self.ptr, self.len, self.off, self.write);
        transfer(what, len, |done| {
            // SAFETY: p[done..len] lies within the operation's buffer.
            counted(unsafe {
                if write {
                    libc::pwrite(
                        fd,
                        p.add(done).cast(),
                        len - done,
                        (off + done as u64) as i64,
                    )
                } else {
                    libc::pread(
                        fd,
                        p.add(done).cast(),
                        len - done,
                        (off + done as u64) as i64,
                    )
                }
            })
        })
    }
}

/// Rings for one backend.
pub(crate) struct RingPool {
    pid: u32,
    idle: Mutex<Vec<IoUring>>,
}

impl RingPool {
    /// Sets up a first ring: the error is why io_uring cannot be used here (ENOSYS: not built
    /// in; EPERM: kernel.io_uring_disabled or a seccomp filter).
    pub(crate) fn new() -> Result<RingPool, TierError> {
        let ring = IoUring::new(ENTRIES).map_err(|e| TierError::Io {
            what: "io_uring setup",
            errno: Errno(e.raw_os_error().unwrap_or(libc::ENOSYS)),
        })?;
        Ok(RingPool {
            pid: std::process::id(),
            idle: Mutex::new(vec![ring]),
        })
    }

    /// False in a forked child: its rings' memory is shared with the parent's.
    pub(crate) fn usable(&self) -> bool {
        // SAFETY: getpid has no preconditions.
        (unsafe { libc::getpid() }) as u32 == self.pid
    }

    /// Runs `ops` on `fd`: all of them complete (or fail) before it returns. The first error is
    /// returned (the other operations still run to completion).
    pub(crate) fn run(
        &self,
        fd: RawFd,
        ops: &mut [Op],
        what: &'static str,
    ) -> Result<(), TierError> {
        let ring = self.idle.lock().pop();
        let mut ring = match ring {
            Some(r) => r,
            None => match IoUring::new(ENTRIES) {
                Ok(r) => r,
                // No memory for another ring right now: the same operations, one by one.
                Err(_) => {
                    for op in ops.iter_mut() {
                        op.run_sync(fd, what)?;
                    }
                    return Ok(());
                }
            },
        };
        let r = drive(&mut ring, fd, ops, what);
        let mut idle = self.idle.lock();
        if idle.len() < KEEP {
            idle.push(ring);
        }
        r
    }
}

impl Drop for RingPool {
    fn drop(&mut self) {
        if !self.usable() {
            // A forked child: unmapping "its" rings would unmap whatever the child mapped there
            // since, if anything; their descriptors close at exit.
            std::mem::forget(std::mem::take(&mut *self.idle.lock()));
        }
    }
}

fn drive(
    ring: &mut IoUring,
    fd: RawFd,
    ops: &mut [Op],
    what: &'static str,
) -> Result<(), TierError> {
    let mut pending: VecDeque<usize> = (0..ops.len()).filter(|&i| ops[i].len > 0).collect();
    let mut inflight = 0usize;
    let mut first_err: Option<TierError> = None;
    let mut stuck = 0u32;
    loop {
        {
            let mut sq = ring.submission();
            while let Some(&i) = pending.front() {
                let e = ops[i].entry(fd, i as u64);
                // SAFETY: the buffer of ops[i] stays valid and untouched until its completion is
                // reaped below: this function does not return while anything is in flight.
                if unsafe { sq.push(&e) }.is_err() {
                    break;
                }
                pending.pop_front();
                inflight += 1;
            }
        }
        if inflight == 0 {
            break;
        }
        if let Err(e) = ring.submit_and_wait(1) {
            let code = e.raw_os_error().unwrap_or(0);
            if ![libc::EINTR, libc::EAGAIN, libc::EBUSY].contains(&code) {
                // io_uring_enter refusing a valid ring is not expected; but buffers the kernel
                // may still write must not be handed back, so keep trying, then give up loudly.
                stuck += 1;
                if stuck > 1000 {
                    tracing::error!(
                        "io_uring_enter keeps failing ({}) with I/O in flight: aborting",
                        Errno(code).name()
                    );
                    std::process::abort();
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
        }
        for cqe in ring.completion() {
            inflight -= 1;
            let i = cqe.user_data() as usize;
            let res = cqe.result();
            let op = &mut ops[i];
            if res < 0 {
                if res == -libc::EINTR || res == -libc::EAGAIN {
                    pending.push_back(i);
                } else if first_err.is_none() {
                    first_err = Some(TierError::Io {
                        what,
                        errno: Errno(-res),
                    });
                }
            } else if res == 0 {
                if first_err.is_none() {
                    first_err = Some(TierError::Short {
                        what,
                        done: op.done,
                        want: op.len,
                    });
                }
            } else {
                op.done += res as usize;
                if op.done < op.len {
                    pending.push_back(i);
                }
            }
        }
        if first_err.is_some() {
            // Issue nothing more; what is in flight is still waited for.
            pending.clear();
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(()),
    }
}
