//! Eviction in a forked child: the pages zmem maps into a child (its faults on pages that were
//! evicted at the fork, e.g. redis's BGSAVE reading the whole heap) are bounded, so a child
//! that reads a heap larger than the budget does not grow to the whole heap.
//!
//! The parent cannot free a page of the child: `UFFDIO_MOVE` refuses to work across address
//! spaces (EINVAL) and process_madvise refuses MADV_DONTNEED (docs/DESIGN-NOTES.md). So the
//! child gets a small thread of its own, started by the fork hook, linked to the parent by a
//! socket pair made in the prepare hook. The parent sends it the child's userfaultfd (read
//! from the FORK event); then, when the child holds more than its share of pages zmem mapped
//! into it, the parent's evictor picks the oldest, marks them Staged and asks the child's
//! thread to move them into its own staging pages (a part of the staging area the creator
//! never uses, so it is empty in every child). The parent reads them there
//! (process_vm_readv), stores them in the child's store, and wakes any thread of the child
//! that faulted on them meanwhile. The child's thread empties its staging pages before each
//! batch. It never touches the program's memory and exits when the link closes.
//!
//! Only pages zmem mapped are victims: a page present at the fork is shared copy-on-write with
//! the parent and costs nothing extra. A raw fork(2) (no hooks) gets no link: its pages are
//! served as before, never evicted.
//!
//! The link also outlives the parent's interest in eviction, for one more duty: a parent that
//! goes away (exit, `_exit`, the region dropped) first hands each child every page only its
//! store holds (`UFFDIO_COPY` works across address spaces) and says so; the child then runs on
//! plain memory. A parent that vanishes without that (SIGKILL, a crash) takes such pages with
//! it: the child's thread then stops the child with a message rather than let it read zeros
//! where its data was.

use std::collections::VecDeque;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::AtomicBool;
use std::sync::atomic::Ordering::{Acquire, Relaxed, Release};
use std::sync::Arc;
use std::time::Duration;

use zmem_os::{fds, remote, Errno};

use crate::config::PAGE;
use crate::manager::{Shared, Space, STAGING_SLOTS};
use crate::state::PageState::{self, *};
use crate::uffd::Uffd;

/// Pages a child's thread moves per request; its staging pages.
pub(crate) const CHILD_SLOTS: usize = 32;

/// A child's share: pages zmem may map into it beyond those present at the fork, as a fraction
/// of the parent's budget (at least [`CHILD_MIN`]); past twice that, its faults wait for an
/// eviction.
const CHILD_SHARE: usize = 4;
const CHILD_MIN: usize = 64;

/// Read by the permission check: a byte of our own image, present in the child too and never
/// part of a region (reading it can never wait for a handler).
static PROBE: u8 = 0x5a;

/// How long the parent waits for one reply before checking whether the region is going away.
const REPLY_POLL: Duration = Duration::from_millis(100);

/// Parent to child: move these pages (addresses) into staging pages 0..n; or, with `n` one of
/// the values below, a word about the child's pages.
#[repr(C)]
#[derive(Clone, Copy)]
struct Request {
    n: u64,
    pages: [u64; CHILD_SLOTS],
}

/// `Request::n`: `pages[0]` is how many of the child's pages only the parent's store held when
/// the link was made (the first message after the child's userfaultfd).
const HOLDS: u64 = u64::MAX - 1;
/// `Request::n`: every page only the parent held is in the child now; the parent closes the
/// link next, and that is no loss.
const HANDED_OFF: u64 = u64::MAX;
/// `Request::n`: this link is not the one of the space that serves the child's pages (a raw
/// fork's FORK event took the link a glibc fork's hook made); they are served there, only not
/// evicted from the child, and the link's closing is no loss either.
const LET_GO: u64 = u64::MAX - 2;

impl Request {
    /// A word about the child's pages (`HOLDS`, `HANDED_OFF`, `LET_GO`).
    fn word(n: u64, value: u64) -> Request {
        let mut r = Request {
            n,
            pages: [0; CHILD_SLOTS],
        };
        r.pages[0] = value;
        r
    }
}

/// Child to parent: the child's pid (for process_vm_readv), and per page 0 (moved) or errno.
/// The thread's first message, before any request, carries the pid only.
#[repr(C)]
#[derive(Clone, Copy)]
struct Reply {
    pid: i32,
    moved: [i32; CHILD_SLOTS],
}

impl Reply {
    /// From `pid`, every page answered `each`.
    fn new(pid: libc::pid_t, each: i32) -> Reply {
        Reply {
            pid,
            moved: [each; CHILD_SLOTS],
        }
    }
}

/// What a child's space knows about the pages zmem mapped into it.
pub(crate) struct ChildPages {
    /// Pages mapped into the child by its faults (copies, not zero pages), oldest first. An
    /// entry may be stale (the page was dropped since); victims are checked when taken.
    mapped: VecDeque<u32>,
}

impl ChildPages {
    pub fn new() -> ChildPages {
        ChildPages {
            mapped: VecDeque::new(),
        }
    }

    /// A page was mapped into the child with its own content (not the zero page).
    pub fn mapped(&mut self, page: u32) {
        self.mapped.push_back(page);
    }

    pub fn holding(&self) -> usize {
        self.mapped.len()
    }
}

/// The parent's end of the link to a child's thread, used by one batch at a time.
pub(crate) struct ChildLink {
    sock: RawFd,
    /// The child's pid, from its thread's first message; 0 until then.
    pid: libc::pid_t,
    /// False once eviction there failed (no reply, reading refused). The link stays open even
    /// then: its closing without a hand-off tells the child's thread that pages were lost.
    evicts: bool,
}

impl Drop for ChildLink {
    fn drop(&mut self) {
        // Unread messages (the hello, when no batch ever ran) would make the close reset the
        // link: the child's thread would get ECONNRESET instead of what we sent last.
        let mut sink = [0u8; std::mem::size_of::<Reply>()];
        // SAFETY: receiving into our own buffer, without waiting.
        while unsafe {
            libc::recv(
                self.sock,
                sink.as_mut_ptr().cast(),
                sink.len(),
                libc::MSG_DONTWAIT,
            )
        } > 0
        {}
        close_raw(self.sock); // the child's thread sees the link close and ends
    }
}

impl Shared {
    /// Pages a forked child may hold beyond those present at the fork.
    pub(crate) fn child_share(&self) -> usize {
        (self.budget() / CHILD_SHARE).max(CHILD_MIN)
    }

    /// Prepare hook (every thread of the region parked): a link for the child this fork makes.
    pub(crate) fn open_child_link(&self) {
        let stored = self.root.store.stats().orig_data_size > 0;
        self.stored_at_fork.store(stored, Relaxed);
        self.child_uffd_sent.store(false, Relaxed);
        new_pair(&self.fork_link);
        if self.signal_route {
            new_pair(&self.fault_link);
        }
    }

    /// Parent hook: the child's end is the child's.
    pub(crate) fn parent_side_of_link(&self) {
        for pair in [&self.fork_link, &self.fault_link] {
            if let Some(b) = pair.lock().1.take() {
                close_protected(b);
            }
        }
    }

    /// Child hook: the parent's end is the parent's; this process's region pages get a thread
    /// that moves them out when the parent asks.
    pub(crate) fn child_side_of_link(&self) {
        let (fa, fb) = std::mem::take(&mut *self.fault_link.lock());
        if let Some(a) = fa {
            close_protected(a);
        }
        if let Some(b) = fb {
            // Faults here (and in processes forked from here) are asked over it (`forked`).
            let raw = std::os::fd::IntoRawFd::into_raw_fd(b);
            crate::forked::hello(raw);
            // SAFETY: getpid has no preconditions.
            crate::signal::set_link(self.root.base, raw, unsafe { libc::getpid() });
        }
        let (a, b) = std::mem::take(&mut *self.fork_link.lock());
        if let Some(a) = a {
            close_protected(a);
        }
        let Some(b) = b else {
            return;
        };
        let slots = self.staging + STAGING_SLOTS * PAGE;
        let owed = self.stored_at_fork.load(Relaxed);
        let raw = std::os::fd::IntoRawFd::into_raw_fd(b);
        // Received here, before fork() returns in the child, not on the thread: SCM_RIGHTS
        // puts the descriptor at the lowest free number until it is moved high, and the
        // program, already running beside that thread, saw a userfaultfd at its descriptor 3
        // (tests/c/low_fds.c, 2 of 12 runs once the start had grown a little slower). The
        // parent sends it while it serves the FORK event, which its own fork() waits for.
        let received = fds::recv_fd(raw).map(fds::move_high);
        let spawned = zmem_os::thread::spawn_in_forked_child("zmem-child".into(), move || {
            child_thread(raw, received, slots, owed)
        });
        if spawned.is_err() {
            // The parent's requests then find the link closed: no eviction here.
            close_raw(raw);
        }
    }

    /// After a FORK event: hands the child's userfaultfd to the child's thread, tells it how
    /// many of its pages only our store holds (`stored`), and returns the link for the child's
    /// space (None: a raw fork, or the child is gone).
    pub(crate) fn link_child(
        &self,
        parent: &Space,
        child_uffd: &Uffd,
        stored: usize,
    ) -> Option<ChildLink> {
        if !parent.is_root {
            return None; // a grandchild's fork ran in its parent, which has no hooks
        }
        let a = self.fork_link.lock().0.take()?;
        let holds = Request::word(HOLDS, stored as u64);
        let sent = self.child_uffd_sent.swap(false, Relaxed);
        if (!sent && fds::send_fd(a.as_raw_fd(), child_uffd.raw()).is_err())
            || !send_msg(a.as_raw_fd(), &holds)
        {
            close_protected(a);
            return None;
        }
        let tv = libc::timeval {
            tv_sec: 0,
            tv_usec: REPLY_POLL.as_micros() as libc::suseconds_t,
        };
        // SAFETY: setting a receive timeout on our own socket.
        unsafe {
            libc::setsockopt(
                a.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        Some(ChildLink {
            sock: std::os::fd::IntoRawFd::into_raw_fd(a),
            pid: 0,
            evicts: true,
        })
    }

    /// A fault of child `s`, which holds twice its share (the evictor fell behind a child that
    /// reads fast): batches leave first, on the handler, until it is back under that. One batch
    /// (32 pages) was not enough: a sequential reader maps up to 64 pages per fault
    /// (fault-around), so with the evictor starved of CPU (CI under load) the child still grew
    /// by 32 pages per fault.
    pub(crate) fn make_room_in_child(&self, s: &Space) {
        let share = self.child_share();
        let holding = || s.inner.lock().child.as_ref().map_or(0, ChildPages::holding);
        while holding() > 2 * share {
            if self.evict_child_batch(s, CHILD_SLOTS) == 0 {
                break;
            }
        }
    }

    /// The evictor: every child holding more than its share gives its oldest pages back.
    pub(crate) fn evict_children(&self) {
        let children: Vec<Arc<Space>> = self.children.lock().clone();
        let share = self.child_share();
        for c in children {
            while !self.stop.load(Relaxed) && !self.forking.load(Relaxed) {
                let over = c
                    .inner
                    .lock()
                    .child
                    .as_ref()
                    .map_or(0, |p| p.holding().saturating_sub(share));
                if over == 0 || self.evict_child_batch(&c, over.min(CHILD_SLOTS)) == 0 {
                    break;
                }
            }
        }
    }

    /// One round trip with child `s`'s thread: up to `want` of its oldest mapped pages leave
    /// it. Returns how many were stored.
    fn evict_child_batch(&self, s: &Space, want: usize) -> usize {
        // Held for the round trip: a grandchild's snapshot (on_fork takes it) never sees a
        // page Staged by a child batch.
        let _evicting = self.evict_lock.lock();
        let mut link = s.link.lock();
        let Some(l) = link.as_mut().filter(|l| l.evicts) else {
            return 0;
        };
        if l.pid == 0 {
            // The child's thread says who it is; reading its memory must be allowed (a child
            // that is not dumpable, or a ptrace policy, refuses), else nothing is moved there.
            let mut one = [0u8; 1];
            match self.receive_reply(l.sock) {
                Some(hello)
                    if remote::read(hello.pid, &PROBE as *const u8 as usize, &mut one).is_ok() =>
                {
                    l.pid = hello.pid
                }
                _ => {
                    l.evicts = false;
                    return 0;
                }
            }
            if !self.space_serves(s, l.pid) {
                // Another child's thread: a batch would move that child's pages out and store
                // them as this one's. The link goes where it belongs.
                let l = link.take().expect("checked above");
                drop(link);
                s.inner.lock().child = None;
                self.rehome_link(l);
                return 0;
            }
        }
        let mut req = Request {
            n: 0,
            pages: [0; CHILD_SLOTS],
        };
        let mut victims = [0u32; CHILD_SLOTS];
        let mut n = 0;
        {
            let mut g = s.inner.lock();
            let inner = &mut *g;
            let Some(c) = inner.child.as_mut() else {
                return 0;
            };
            while n < want {
                let Some(p) = c.mapped.pop_front() else {
                    break;
                };
                if inner.state.get(p as usize) == Resident {
                    // Staged in a child: a fault on it waits for this batch's wake-up, and a
                    // program's madvise/munmap waits for the batch too: its event is not read
                    // while the batch is in flight (`Space::moving`), so the kernel cannot zap
                    // the page and hand the child a new one that the batch would move out.
                    inner.state.set(p as usize, Staged);
                    victims[n] = p;
                    req.pages[n] = s.page_addr(p as usize) as u64;
                    n += 1;
                }
            }
            if n > 0 {
                s.moving.store(true, Release);
            }
        }
        if n == 0 {
            return 0;
        }
        /// Lets the child's events be read again once the batch is settled (however it ends).
        struct Moving<'a>(&'a AtomicBool);
        impl Drop for Moving<'_> {
            fn drop(&mut self) {
                self.0.store(false, Release);
            }
        }
        let _moving = Moving(&s.moving);
        crate::manager::test_pause(&self.move_delay_us);
        req.n = n as u64;
        let reply = self.ask_child(l, &req);
        let pid = l.pid;
        if reply.is_none() {
            l.evicts = false; // the child is gone, or its thread is: no more eviction there
        }
        let mut page = [0u8; PAGE];
        let mut stored = 0;
        for (k, &v) in victims[..n].iter().enumerate() {
            let addr = s.page_addr(v as usize);
            let moved = reply.filter(|r| r.moved[k] == 0);
            // The page sits in the child's staging page k: read it, store it.
            let got = moved.map(|_| {
                remote::read(pid, self.staging + (STAGING_SLOTS + k) * PAGE, &mut page)
                    .map_err(|e| e.code())
                    .and_then(|()| s.store.write(v as u64, &page).map_err(|_| libc::ENOSPC))
            });
            let mut inner = s.inner.lock();
            let still = inner.state.get(v as usize) == Staged;
            match got {
                // Not moved (shared with a grandchild, or an event pending): still in place.
                None => {
                    if still {
                        inner.state.set(v as usize, Resident);
                    }
                }
                Some(Ok(())) if still => {
                    inner.uncount_resident(v);
                    inner.state.set(v as usize, Stored);
                    stored += 1;
                }
                // Dropped by the program meanwhile: what we stored is stale.
                Some(Ok(())) => {
                    let _ = s.store.discard(v as u64);
                }
                // The child is gone: nothing to keep.
                Some(Err(libc::ESRCH)) => {
                    if still {
                        inner.uncount_resident(v);
                        inner.state.set(v as usize, Absent);
                    }
                }
                // Moved, but unreadable or not storable: map it back from what we have, or
                // poison it (never silent zeros).
                Some(Err(e)) => {
                    if still {
                        let back = if e == libc::ENOSPC {
                            s.uffd.copy(addr, page.as_ptr(), PAGE)
                        } else {
                            Err(Errno(e))
                        };
                        if back.is_ok() {
                            inner.state.set(v as usize, Resident);
                        } else {
                            tracing::error!(
                                "forked child: page {v} left its place and could not be kept \
                                 ({}); it is poisoned",
                                Errno(e)
                            );
                            inner.uncount_resident(v);
                            inner.state.set(v as usize, Poisoned);
                            let _ = s.uffd.poison(addr, PAGE);
                        }
                    }
                }
            }
            drop(inner);
            // A thread of the child that faulted on it meanwhile faults again and is served.
            let _ = s.uffd.wake(addr, PAGE);
        }
        self.counters
            .child_evictions
            .fetch_add(stored as u64, Relaxed);
        stored
    }

    /// This process is going away (exit, `_exit`) or dropping the region: every forked child
    /// gets the pages only our store holds for it, mapped in place, and its thread is told, so
    /// the child goes on with plain memory instead of reading zeros where its data was (a
    /// program that daemonizes: fork, and the parent exits). Returns the pages handed over.
    pub fn hand_off_children(&self) -> usize {
        // The fork hooks wait for each fork to be served; a raw fork may still be unserved.
        self.wait_fork_served();
        self.reap_children();
        let children: Vec<Arc<Space>> = self.children.lock().clone();
        children.iter().map(|c| self.hand_off(c)).sum()
    }

    /// Waits (at most 10 s) until no fork is left unserved ([`Self::fork_pending`]): the kernel
    /// may hand the FORK event to a handler after fork() returned in the parent (measured: a
    /// parent calling _exit right after fork beat its handler to it in 4 runs of 6).
    pub(crate) fn wait_fork_served(&self) {
        let t0 = std::time::Instant::now();
        // The handler wakes us once it has served the fork (a sleep of 100 µs between looks
        // took 0.2-0.8 ms here on this VM); the timeout covers a child that died before its FORK
        // event was served, which nobody announces.
        let mut g = self.park_lock.lock();
        while self.fork_pending()
            && !self.stop.load(Relaxed)
            && t0.elapsed() < Duration::from_secs(10)
        {
            self.park_wake.wait_for(&mut g, Duration::from_millis(1));
        }
    }

    /// Whether a fork is not served yet: its FORK event is being served, or its link is still
    /// waiting for the event while the child holds the other end (a fork that failed, or a
    /// child that exec'd or died, closed that end: nothing to wait for).
    fn fork_pending(&self) -> bool {
        if self.forks_unserved.load(Acquire) > 0 {
            return true;
        }
        let link = self.fork_link.lock();
        link.0.as_ref().is_some_and(|a| !peer_closed(a.as_raw_fd()))
    }

    fn hand_off(&self, s: &Space) -> usize {
        // A child batch in flight holds `evict_lock`: once we have it, none is (no page of this
        // child is Staged), and with the link taken no batch starts again. It is not held for
        // the copies below: they wait (EAGAIN) for the child's pending events, which a handler
        // reads, and a handler between faults waits for `evict_lock` to evict. A shell that
        // exec'd while its background subshell was in madvise hung there (CI, session 53).
        let (link, pages) = {
            let _evicting = self.evict_lock.lock();
            let link = s.link.lock().take();
            let pages: Vec<(u32, PageState)> = s
                .inner
                .lock()
                .state
                .iter_touched()
                .filter(|(_, st)| matches!(st, Stored | Poisoned))
                .map(|(i, st)| (i as u32, st))
                .collect();
            (link, pages)
        };
        let mut page = [0u8; PAGE];
        let mut handed = 0;
        for (i, was) in pages {
            let addr = s.page_addr(i as usize);
            if was == Poisoned {
                // Poisoned when touched: the marker makes that hold without us.
                let _ = retry_busy(|| s.uffd.poison(addr, PAGE));
                continue;
            }
            {
                let mut inner = s.inner.lock();
                if inner.state.get(i as usize) != Stored {
                    continue; // faulted in (or dropped) meanwhile
                }
                inner.state.set(i as usize, Faulting);
            }
            let mapped = match s.store.read(i as u64, &mut page) {
                Ok(()) => retry_busy(|| s.uffd.copy(addr, page.as_ptr(), PAGE)),
                Err(e) => {
                    tracing::error!("forked child: page {i} cannot be read back: {e}");
                    Err(Errno(libc::EIO))
                }
            };
            let mut inner = s.inner.lock();
            let now = match mapped {
                Ok(()) => Resident,
                Err(e) if e.code() == libc::ESRCH => Stored, // the child is gone
                Err(_) if retry_busy(|| s.uffd.poison(addr, PAGE)).is_ok() => Poisoned,
                Err(_) => Stored,
            };
            if inner.state.get(i as usize) == Faulting {
                inner.state.set(i as usize, now);
            }
            drop(inner);
            if now == Resident {
                let _ = s.store.discard(i as u64);
                handed += 1;
            }
            let _ = s.uffd.wake(addr, PAGE);
            if mapped.is_err_and(|e| e.code() == libc::ESRCH) {
                // The child is gone. Its link may be another live process's (see
                // `pass_on_link`): it goes back for the reaper to place.
                if let Some(l) = link {
                    let mut home = s.link.lock();
                    if home.is_none() {
                        *home = Some(l);
                    } else {
                        drop(home);
                        self.pass_on_link(l);
                    }
                }
                return handed;
            }
        }
        if let Some(l) = link {
            send_msg(l.sock, &Request::word(HANDED_OFF, 0));
        }
        handed
    }

    /// The link of a child space whose process is gone. Its thread's end closed with it; still
    /// open, it is another live process's (a raw fork's FORK event took the link a glibc fork's
    /// hook made, so the raw child's space held the glibc child's link), which must not read
    /// the close as its parent's death: it moves to that process's space, or its thread is told
    /// to end without that verdict. (A glibc child was killed as orphaned when a raw child
    /// beside it exited: this test file's fork tests, run in parallel on a loaded machine.)
    pub(crate) fn pass_on_link(&self, mut l: ChildLink) {
        if peer_closed(l.sock) {
            return;
        }
        if l.pid == 0 {
            // Its hello comes as soon as its thread runs; a thread that does not say who it is
            // within this cannot be placed.
            match self.receive_reply_within(l.sock, Duration::from_secs(2)) {
                Some(hello) => l.pid = hello.pid,
                None => {
                    send_msg(l.sock, &Request::word(LET_GO, 0));
                    return;
                }
            }
        }
        let _evicting = self.evict_lock.lock();
        self.rehome_link(l);
    }

    /// Link `l`, whose thread runs in process `l.pid`, sits in no space of that process: it
    /// moves to the child space (one without a link) whose userfaultfd serves `l.pid`, and the
    /// thread hears what that space holds; with none found, the thread is told to let go.
    /// `evict_lock` is held.
    fn rehome_link(&self, mut l: ChildLink) {
        let children: Vec<Arc<Space>> = self.children.lock().clone();
        for c in children {
            if c.dead.load(Relaxed) {
                continue;
            }
            let mut link = c.link.lock();
            if link.is_some() || !self.space_serves(&c, l.pid) {
                continue;
            }
            let mut inner = c.inner.lock();
            let stored = inner
                .state
                .iter_touched()
                .filter(|&(_, st)| st == Stored)
                .count();
            if send_msg(l.sock, &Request::word(HOLDS, stored as u64)) {
                tracing::debug!("child {}: its eviction link found its own space", l.pid);
                l.evicts = true;
                inner.child = Some(ChildPages::new());
                *link = Some(l);
            }
            return;
        }
        send_msg(l.sock, &Request::word(LET_GO, 0));
    }

    /// Whether child space `c`'s userfaultfd serves process `pid`: a page mapped through it
    /// into one of the child's empty staging pages is then present in `pid`'s memory (the
    /// FORK message says nothing of the child it is for). `evict_lock` is held: no child batch
    /// fills or empties staging pages meanwhile. The last pages are used (the first two are
    /// the thread's own check, `Uffd::serves_this_process`); a page mapped into another
    /// process stays there until its thread empties its staging pages, and the next look
    /// takes the page before it.
    fn space_serves(&self, c: &Space, pid: libc::pid_t) -> bool {
        let slots = self.staging + STAGING_SLOTS * PAGE;
        for k in (2..CHILD_SLOTS).rev() {
            let slot = slots + k * PAGE;
            match remote::page_present(pid, slot) {
                Some(false) => {}
                Some(true) => continue,
                None => return false,
            }
            match retry_busy(|| c.uffd.copy(slot, self.zero_page.as_ptr(), PAGE)) {
                Ok(()) => return remote::page_present(pid, slot) == Some(true),
                Err(e) if e.code() == libc::EEXIST => continue,
                Err(_) => return false,
            }
        }
        false
    }

    /// Sends `req` and waits for the reply; None when the link is broken (or the region is
    /// being dropped).
    fn ask_child(&self, l: &ChildLink, req: &Request) -> Option<Reply> {
        send_msg(l.sock, req).then(|| self.receive_reply(l.sock))?
    }

    /// The child thread's next message; None when the link is broken (or the region is being
    /// dropped).
    fn receive_reply(&self, fd: RawFd) -> Option<Reply> {
        // A child that is stopped (SIGSTOP) answers when it continues.
        self.receive_reply_within(fd, Duration::MAX)
    }

    /// The child thread's next message within `limit`; None when the link is broken, the
    /// region is being dropped or the time is up.
    fn receive_reply_within(&self, fd: RawFd, limit: Duration) -> Option<Reply> {
        let t0 = std::time::Instant::now();
        loop {
            match recv_msg::<Reply>(fd) {
                Ok(reply) => return Some(reply),
                // A receive timeout (`REPLY_POLL`): look whether to go on waiting.
                Err(e) if e.code() == libc::EAGAIN && !self.stop.load(Relaxed) => {
                    if t0.elapsed() >= limit {
                        return None;
                    }
                }
                Err(_) => return None,
            }
        }
    }
}

/// Runs `op` again while the kernel answers EAGAIN (an event of the child's, which a handler
/// reads, is pending), for at most a few seconds.
fn retry_busy(op: impl Fn() -> Result<(), Errno>) -> Result<(), Errno> {
    let t0 = std::time::Instant::now();
    loop {
        match op() {
            Err(e) if e.code() == libc::EAGAIN && t0.elapsed() < Duration::from_secs(5) => {
                std::thread::sleep(Duration::from_micros(200))
            }
            r => return r,
        }
    }
}

/// The thread a forked child runs for its parent's region: takes the child's userfaultfd (as
/// received by the fork's child hook), then moves pages into its staging pages on request.
/// Touches no program memory; ends when the parent closes the link (the parent handed
/// everything over, or the child was not linked), or stops the child when the parent vanished
/// holding some of its pages.
/// `owed`: the parent's store held pages when it forked (some may be ours).
fn child_thread(
    fd: RawFd,
    received: Result<std::os::fd::OwnedFd, Errno>,
    slots: usize,
    owed: bool,
) {
    let Ok(uffd) = received else {
        // The parent vanished before serving this fork.
        close_raw(fd);
        if owed {
            // SAFETY: getpid has no preconditions.
            orphaned(
                unsafe { libc::getpid() },
                "no descriptor came over its link",
            );
        }
        return;
    };
    let mut uffd = received_uffd(uffd);
    // The link carries the descriptor of every fork whose FORK event the parent read while it
    // was open: a raw fork by another thread of the parent meanwhile sends its child's too,
    // before ours or after it. Ours is the one that serves this process.
    while !uffd.serves_this_process(slots) {
        drop(uffd);
        match next_descriptor(fd) {
            Some(next) => uffd = next,
            None => {
                // Ours never came: our pages are still served (the parent holds our
                // descriptor in another space), only not evicted from here. Not an orphan:
                // ending the link says so. (A test forking both ways at once had its glibc
                // child killed here as orphaned when the raw child exited.)
                close_raw(fd);
                return;
            }
        }
    }
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if !send_msg(fd, &Reply::new(pid, 0)) {
        drop(uffd);
        close_raw(fd);
        return;
    }
    // Whether the parent's store holds pages of ours: from the start (known exactly once the
    // parent says, below), or moved out since.
    let mut owed = owed;
    let mut handed_off = false;
    // Until the link closes: the parent is gone or done with this child.
    while let Ok(req) = recv_msg::<Request>(fd) {
        match req.n {
            HOLDS => {
                owed = req.pages[0] > 0;
                continue;
            }
            HANDED_OFF | LET_GO => {
                handed_off = true;
                break;
            }
            _ => {}
        }
        // The previous batch was read by the parent: empty the staging pages.
        uffd.clear_registered(slots, CHILD_SLOTS * PAGE);
        let mut reply = Reply::new(pid, libc::EINVAL);
        let n = (req.n as usize).min(CHILD_SLOTS);
        for k in 0..n {
            let r = uffd.move_pages(slots + k * PAGE, req.pages[k] as usize, PAGE);
            reply.moved[k] = r.map_or_else(|e| e.code(), |()| 0);
            owed |= reply.moved[k] == 0;
        }
        if !send_msg(fd, &reply) {
            break;
        }
    }
    if owed && !handed_off {
        // Before the descriptor is dropped: until then the child's faults on lost pages wait
        // (for nobody), after it they would read zeros.
        orphaned(pid, "its link closed without a hand-off");
    }
    drop(uffd);
    close_raw(fd);
}

/// The parent ended without handing this process its pages (killed, or crashed): they are
/// gone, and the program would read zeros where its data was. It is stopped instead, with one
/// line on stderr (formatted on this zmem thread, written with write(2)).
fn orphaned(pid: libc::pid_t, how: &str) {
    let msg = format!(
        "zmem: process {pid} stopped: the process it was forked from ended (killed?) while \
         holding some of its memory compressed; those pages are lost ({how})\n"
    );
    // SAFETY: writing our own buffer to stderr, then ending this process.
    unsafe {
        libc::write(2, msg.as_ptr().cast(), msg.len());
        libc::kill(pid, libc::SIGKILL);
    }
}

/// The next descriptor on the link, if its next message is one (waits for that message).
fn next_descriptor(fd: RawFd) -> Option<Uffd> {
    let mut byte = 0u8;
    // SAFETY: a one-byte peek into our own buffer; MSG_TRUNC makes it return the message's
    // whole length (a descriptor travels with one byte, every request is longer).
    let len = unsafe {
        libc::recv(
            fd,
            (&mut byte as *mut u8).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_TRUNC,
        )
    };
    if len != 1 {
        return None;
    }
    fds::recv_fd(fd).map(fds::move_high).ok().map(received_uffd)
}

/// A userfaultfd received over the link, moved high and protected like every zmem descriptor
/// (the program cannot close it under us).
fn received_uffd(fd: OwnedFd) -> Uffd {
    // SAFETY: the descriptor is ours alone.
    unsafe { Uffd::from_raw(std::os::fd::IntoRawFd::into_raw_fd(fd)) }
}

/// Sends one message (a plain-old-data struct) on the link.
fn send_msg<T: Copy>(fd: RawFd, msg: &T) -> bool {
    let len = std::mem::size_of::<T>();
    // SAFETY: the kernel reads `len` bytes of `msg`, a plain-old-data struct of ours.
    let sent = unsafe { libc::send(fd, (msg as *const T).cast(), len, libc::MSG_NOSIGNAL) };
    sent == len as isize
}

/// Receives one whole message of type `T`, retrying on EINTR. A closed link (or a message of
/// another size) is ENOTCONN; a receive timeout is EAGAIN.
fn recv_msg<T: Copy>(fd: RawFd) -> Result<T, Errno> {
    let len = std::mem::size_of::<T>();
    let mut msg = std::mem::MaybeUninit::<T>::zeroed();
    loop {
        // SAFETY: the kernel writes at most `len` bytes into `msg`, which has room for them.
        let got = unsafe { libc::recv(fd, msg.as_mut_ptr().cast(), len, 0) };
        if got == len as isize {
            // SAFETY: fully written, and every bit pattern is a valid Request or Reply.
            return Ok(unsafe { msg.assume_init() });
        }
        // One byte: a descriptor the parent sent for another fork (a raw fork's, read while
        // this link was open); its SCM_RIGHTS went nowhere (no room given), so the kernel
        // closed it. Read as a short message, it ended the link: a glibc child of a test
        // beside a raw-forking one was killed as orphaned.
        if got == 1 && len != 1 {
            continue;
        }
        let e = Errno::last();
        // ECONNRESET: the peer closed with a message of ours unread; it is reported once,
        // before what the peer sent last, which is still there to read.
        if got < 0 && (e.code() == libc::EINTR || e.code() == libc::ECONNRESET) {
            continue;
        }
        return Err(if got < 0 { e } else { Errno(libc::ENOTCONN) });
    }
}

/// Makes a new socket pair in `pair` (both ends moved high and protected), closing any left
/// from a fork that did not happen.
fn new_pair(pair: &zmem_os::sync::Mutex<(Option<OwnedFd>, Option<OwnedFd>)>) {
    let made = fds::seqpacket_pair().ok();
    let mut link = pair.lock();
    for old in [link.0.take(), link.1.take()].into_iter().flatten() {
        close_protected(old);
    }
    if let Some((a, b)) = made {
        *link = (Some(fds::move_high(a)), Some(fds::move_high(b)));
    }
}

/// Closes one of zmem's protected descriptors (raw close(2), past the preload library).
fn close_protected(fd: OwnedFd) {
    close_raw(std::os::fd::IntoRawFd::into_raw_fd(fd));
}

/// Whether the other end of socket `fd` is closed (every process holding it closed it or
/// ended). Never blocks.
fn peer_closed(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: 0,
        revents: 0,
    };
    // SAFETY: one valid pollfd; timeout 0 never blocks.
    unsafe { libc::poll(&mut p, 1, 0) };
    p.revents & (libc::POLLHUP | libc::POLLERR) != 0
}

pub(crate) fn close_raw(fd: RawFd) {
    fds::unprotect(fd);
    // SAFETY: a descriptor we own, closed once.
    unsafe { libc::syscall(libc::SYS_close, fd) };
}
