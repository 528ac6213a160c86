//! Faults of forked children on the signal route. A forked child's userfaultfd has the
//! parent's features, SIGBUS included, so its faults are no messages for the parent's
//! handlers: they raise SIGBUS in the child, whose memory the parent's state describes (its
//! snapshot), not the child's own. So the child *asks*: the fork's prepare hook makes a socket
//! pair (besides the eviction link of `child`), the child keeps one end (listed with the
//! region in `signal`), and its SIGBUS handler sends the page's address there and waits for
//! the answer; a handler thread of the creator serves the fault in the child's space (the same
//! `serve_fault` as a message from the child's userfaultfd: `UFFDIO_COPY` works across address
//! spaces) and answers. The access then runs again.
//!
//! Every process forked from that child (a shell's subshell forking a pipeline) inherits the
//! same end and asks on it too, with its pid. The creator knows which space is the child's
//! (its hello), but not which of the spaces made by later FORK events belongs to which
//! grandchild: the FORK message carries no pid, and nothing ties a pid to a userfaultfd. So a
//! fault of a process that is not the child is served in every other space of the family:
//! each gets its own content at that address (a sibling's copy is right for the sibling,
//! merely early, like fault-around), so the asker is served whichever it is. Families are
//! small and short-lived (processes that exec leave them). And once served, the asker's
//! pagemap says which of them was its own (the page is present there after serving that space):
//! its later faults are served in that space alone (`FaultLink::bind`).
//!
//! A child of a raw fork (a `clone`/`fork` system call: no hooks, no link of its own) asks on
//! the link the creator keeps for such children in its own slot, which the child inherited;
//! that family has no owner, so its faults are served in every raw-forked space.
//!
//! Answers carry no addressee: several threads (and processes) of a family wait on the same
//! socket, and any answer means "look again". A thread woken by another's answer finds its page
//! still missing, faults again and asks again; each ask gets one answer, so every waiter gets
//! one. The child never allocates or touches its heap on this path: a stack buffer and two
//! system calls.

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, AtomicU64, Ordering::*};

use zmem_os::Errno;

/// `uffd::Msg::event` for a fault asked over a link (never a kernel event number).
pub(crate) const LINK_FAULT: u8 = 0xf0;

/// Child to creator: who is asking and, for a fault, which page.
#[repr(C)]
#[derive(Clone, Copy)]
struct Ask {
    kind: u32,
    pid: i32,
    addr: u64,
}

/// `Ask::kind`: the first message, from the child's fork hook: its pid.
const HELLO: u32 = 1;
/// `Ask::kind`: serve the page at `addr` for process `pid`.
const FAULT: u32 = 2;

/// The creator's end of a child's link, shared by the spaces of the child's family.
pub(crate) struct FaultLink {
    sock: RawFd,
    /// The child's pid, from its hello (0 until read).
    owner: AtomicI32,
    /// Every process of the family closed its end (exec'd or exited): no longer polled.
    closed: AtomicBool,
    /// Other processes of the family whose space is known (see [`FaultLink::bind`]).
    bound: zmem_os::sync::Mutex<Vec<Bound>>,
    /// The page the owner asked for last (see [`FaultLink::owner_asks_again`]).
    owner_last: AtomicU64,
}

/// A process of a family tied to its space (the space's address), and the page it asked for
/// last.
struct Bound {
    pid: i32,
    space: usize,
    last: u64,
}

impl Drop for FaultLink {
    fn drop(&mut self) {
        crate::child::close_raw(self.sock);
    }
}

impl FaultLink {
    /// Takes the creator's end (a protected descriptor, see `zmem_os::fds::move_high`).
    pub fn new(sock: std::os::fd::OwnedFd) -> FaultLink {
        FaultLink {
            sock: std::os::fd::IntoRawFd::into_raw_fd(sock),
            owner: AtomicI32::new(0),
            closed: AtomicBool::new(false),
            bound: zmem_os::sync::Mutex::new(Vec::new()),
            owner_last: AtomicU64::new(0),
        }
    }

    /// The space (its address) process `pid` was found to be, for its ask of `addr`; None if
    /// unknown, or if it asks for the page it asked for last (served there, yet still missing:
    /// the tie was wrong, or is stale after a pid was reused), which unties it.
    pub fn bound_space(&self, pid: i32, addr: u64) -> Option<usize> {
        let mut bound = self.bound.lock();
        let i = bound.iter().position(|b| b.pid == pid)?;
        if bound[i].last == addr {
            bound.swap_remove(i);
            return None;
        }
        bound[i].last = addr;
        Some(bound[i].space)
    }

    /// Process `pid` is the one in space `space` (the page it asked for, `addr`, became present
    /// in it when served there): its later faults are served there alone.
    pub fn bind(&self, pid: i32, space: usize, addr: u64) {
        let mut bound = self.bound.lock();
        bound.retain(|b| b.pid != pid && b.space != space);
        bound.push(Bound {
            pid,
            space,
            last: addr,
        });
    }

    pub fn unbind(&self, pid: i32) {
        self.bound.lock().retain(|b| b.pid != pid);
    }

    pub fn raw(&self) -> RawFd {
        self.sock
    }

    pub fn closed(&self) -> bool {
        self.closed.load(Relaxed)
    }

    /// Whether `pid` is the child the link was made for (its own space serves it).
    pub fn is_owner(&self, pid: i32) -> bool {
        pid != 0 && self.owner.load(Relaxed) == pid
    }

    /// Whether the owner asks for the page it asked for last: served in the space the link
    /// was given to, yet still missing, so that space is not its own.
    pub fn owner_asks_again(&self, addr: u64) -> bool {
        self.owner_last.swap(addr, Relaxed) == addr
    }

    /// Reads every message waiting (without blocking): a hello names the owner, a fault goes
    /// to `out` as (pid, page address). A link whose every child end is closed is marked so.
    pub fn read(&self, out: &mut Vec<(i32, u64)>) {
        loop {
            let mut ask = std::mem::MaybeUninit::<Ask>::zeroed();
            let len = std::mem::size_of::<Ask>();
            // SAFETY: the kernel writes at most `len` bytes into `ask`.
            let got =
                unsafe { libc::recv(self.sock, ask.as_mut_ptr().cast(), len, libc::MSG_DONTWAIT) };
            if got == 0 {
                self.closed.store(true, Relaxed); // end of file: no child end is left
                return;
            }
            if got != len as isize {
                let e = Errno::last();
                if got < 0 && e.code() == libc::EINTR {
                    continue;
                }
                if got < 0 && e.code() != libc::EAGAIN {
                    self.closed.store(true, Relaxed);
                }
                return;
            }
            // SAFETY: fully written; every bit pattern is a valid Ask.
            let ask = unsafe { ask.assume_init() };
            match ask.kind {
                HELLO => self.owner.store(ask.pid, Relaxed),
                FAULT => out.push((ask.pid, ask.addr)),
                _ => {}
            }
        }
    }

    /// Tells the family's waiting threads to look again.
    pub fn answer(&self, addr: u64) {
        // SAFETY: sends 8 bytes of ours; never blocks (a full queue only means that enough
        // answers are already waiting).
        unsafe {
            libc::send(
                self.sock,
                (&addr as *const u64).cast(),
                8,
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
            )
        };
    }
}

/// In the child's fork hook: says who the child is on its end of the link.
pub(crate) fn hello(sock: RawFd) {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    send_ask(
        sock,
        &Ask {
            kind: HELLO,
            pid,
            addr: 0,
        },
    );
}

fn send_ask(sock: RawFd, ask: &Ask) -> bool {
    let len = std::mem::size_of::<Ask>();
    // SAFETY: the kernel reads `len` bytes of `ask`, a plain struct on our stack.
    let sent = unsafe { libc::send(sock, (ask as *const Ask).cast(), len, libc::MSG_NOSIGNAL) };
    sent == len as isize
}

/// What became of a fault a forked process asked about.
pub(crate) enum Asked {
    /// Answered: the access may run again.
    Answered,
    /// Not linked (a raw fork of the creator) or the creator is gone for good: the fault
    /// cannot be served.
    Unserved,
}

/// Consecutive asks that found the creator gone (see [`ask`]).
static GONE: AtomicU32 = AtomicU32::new(0);
/// Asks after which a creator that does not answer is taken to be gone for good (1 ms apart).
const GONE_LIMIT: u32 = 10_000;

/// On a forked process's faulting thread (SIGBUS handler): asks the creator over `sock` to
/// serve `page` and waits for an answer. `owner` is the child the link was made for: a process
/// sharing its memory (vfork) asks in its name.
pub(crate) fn ask(sock: RawFd, owner: i32, page: usize) -> Asked {
    if sock < 0 {
        return Asked::Unserved;
    }
    // SAFETY: getpid cannot fail.
    let me = unsafe { libc::getpid() };
    let pid = if me == owner || zmem_os::remote::same_address_space(me, owner) {
        owner
    } else {
        me
    };
    let ask = Ask {
        kind: FAULT,
        pid,
        addr: page as u64,
    };
    let mut answer = 0u64;
    let answered = send_ask(sock, &ask)
        && loop {
            // SAFETY: receives at most 8 bytes into `answer`.
            let got = unsafe { libc::recv(sock, (&mut answer as *mut u64).cast(), 8, 0) };
            if got == 8 {
                break true;
            }
            if got < 0 && Errno::last().code() == libc::EINTR {
                continue;
            }
            break false;
        };
    if answered {
        GONE.store(0, Relaxed);
        return Asked::Answered;
    }
    // The creator closed the link: it is going away. Either it handed this process its pages
    // and the child's userfaultfd is being closed (the access will then find plain memory),
    // or it vanished and the child's thread is about to stop this process (`child`). Look
    // again shortly, for a bounded time.
    if GONE.fetch_add(1, Relaxed) >= GONE_LIMIT {
        return Asked::Unserved;
    }
    let ms = libc::timespec {
        tv_sec: 0,
        tv_nsec: 1_000_000,
    };
    // SAFETY: sleeps; no memory of ours is written (no remainder asked for).
    unsafe { libc::nanosleep(&ms, std::ptr::null_mut()) };
    Asked::Answered
}
