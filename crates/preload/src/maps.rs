//! The program's own anonymous memory. `mmap`, `munmap`, `mremap`, `madvise` and `mprotect`
//! are interposed so that the private anonymous mappings a program makes itself (pymalloc's
//! arenas, a JVM's heap, V8's pages, gcc's GC pages) are tiered like its malloc heap: they are
//! served from the **map space**, the part of the region after the heap, which is registered
//! with the region's userfaultfd once, at start-up. No per-mapping registration, no second
//! page table: the region's fault path, eviction, fork and events work on it unchanged.
//!
//! The rules (docs/DESIGN-NOTES.md, "The program's own mappings"):
//! - Free parts of the map space are `PROT_NONE` and hold no pages. `mmap` takes the lowest
//!   free range that fits (a hint is honoured when that range is free, otherwise ignored: the
//!   kernel treats a hint the same way) and gives it the requested protection. `munmap` zaps
//!   the pages (`MADV_DONTNEED`), discards their compressed copies at once, and makes the range
//!   `PROT_NONE` and free again, so a use after munmap still faults (SIGSEGV).
//! - `MAP_FIXED` anonymous private memory over the map space (a JVM committing or uncommitting
//!   part of its reserved heap) renews the range in place: zeros, with the new protection.
//! - Left to the kernel: shared and file mappings, stacks (`MAP_STACK`, `MAP_GROWSDOWN`),
//!   `MAP_32BIT`, locked and huge-page mappings, `MAP_FIXED` outside the map space, and anything
//!   when the map space is full. A file or shared mapping placed *over* the map space
//!   (`MAP_FIXED`) takes that range from zmem for good (`foreign`): the kernel's UNMAP event
//!   tells the region, and the range is never handed out again.
//! - `mremap` of map-space memory is done here: shrink in place, grow in place when the next
//!   range is free, else move the pages with the region (`Region::move_pages`; the kernel's
//!   mremap would take them out of the region, which cannot follow them). The result is
//!   read-write.
//! - `MADV_FREE` becomes `MADV_DONTNEED` (lazily freed pages that may come back would be
//!   invisible to the region's accounting).
//! - `mprotect` back to writable releases pages the region had to hold in DRAM because the
//!   kernel does not move read-only or executable pages out (`RegionStats::held`).
//!
//! zmem's own threads, and the code here (it marks its thread internal while it runs), reach
//! the kernel directly: every call below goes through `sys`, never back through these symbols.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

use libc::off_t;
use zmem_os::{Extents, SpinLock, PAGE_SIZE as PAGE};
use zmem_runenv::MapStats;

use crate::heap;
use crate::runtime::as_zmem;

/// The map space `[START, END)`; END is 0 until it is ready (and stays 0 with `--heap-only`).
static START: AtomicUsize = AtomicUsize::new(0);
static END: AtomicUsize = AtomicUsize::new(0);

struct Space {
    /// Free ranges: `PROT_NONE`, no pages, no compressed copies.
    free: Extents,
    /// Ranges the kernel holds (files or shared memory mapped over the map space, and the
    /// holes they leave): never handed out.
    foreign: Extents,
}

/// The map space's lock: a spin flag fork can hold across and reset (see zmem_os::spin; a
/// parking lock hung bash's atfork handler). Critical sections here are a few B-tree operations.
static SPACE: SpinLock<Space> = SpinLock::new(Space {
    free: Extents::new(),
    foreign: Extents::new(),
});

static SERVED: AtomicU64 = AtomicU64::new(0);
static PASSED: AtomicU64 = AtomicU64::new(0);
static MREMAP_WARNED: AtomicBool = AtomicBool::new(false);

/// The kernel's calls, past every interposer (this library's included).
mod sys {
    use super::*;

    pub unsafe fn mmap(
        addr: usize,
        len: usize,
        prot: c_int,
        flags: c_int,
        fd: c_int,
        off: off_t,
    ) -> *mut c_void {
        libc::syscall(libc::SYS_mmap, addr, len, prot, flags, fd, off) as *mut c_void
    }

    pub unsafe fn munmap(addr: usize, len: usize) -> c_int {
        libc::syscall(libc::SYS_munmap, addr, len) as c_int
    }

    pub unsafe fn mremap(
        old: usize,
        old_len: usize,
        new_len: usize,
        flags: c_int,
        new_addr: usize,
    ) -> *mut c_void {
        libc::syscall(libc::SYS_mremap, old, old_len, new_len, flags, new_addr) as *mut c_void
    }

    pub unsafe fn madvise(addr: usize, len: usize, advice: c_int) -> c_int {
        libc::syscall(libc::SYS_madvise, addr, len, advice) as c_int
    }

    pub unsafe fn mprotect(addr: usize, len: usize, prot: c_int) -> c_int {
        libc::syscall(libc::SYS_mprotect, addr, len, prot) as c_int
    }
}

fn errno() -> c_int {
    zmem_os::Errno::last().code()
}

fn fail<T>(e: c_int, value: T) -> T {
    crate::set_errno(e);
    value
}

/// The map space, if this call is one zmem serves (not on zmem's own threads, nor mimalloc's
/// own memory: see [`heap::in_mimalloc`]).
#[inline]
fn space() -> Option<(usize, usize)> {
    let end = END.load(Acquire);
    if end == 0 || heap::is_internal() || heap::in_mimalloc() {
        return None;
    }
    Some((START.load(Acquire), end))
}

fn round_up(len: usize) -> Option<usize> {
    len.checked_next_multiple_of(PAGE)
}

/// Sets the map space up: `[start, end)` of the region (already registered with its
/// userfaultfd) becomes `PROT_NONE` and free. Called once, by the thread that starts zmem.
pub fn init(start: usize, end: usize) -> Result<(), String> {
    if start >= end {
        return Ok(());
    }
    // SAFETY: the region's own range, which the program has not seen yet.
    if unsafe { sys::mprotect(start, end - start, libc::PROT_NONE) } != 0 {
        return Err(format!(
            "cannot set the map space aside: mprotect: {}",
            zmem_os::errno::display(&std::io::Error::last_os_error())
        ));
    }
    SPACE.lock().free.insert(start, end);
    // SAFETY: plain extern "C" functions with no arguments.
    let r = unsafe { libc::pthread_atfork(Some(fork_prepare), Some(fork_after), Some(fork_after)) };
    if r != 0 {
        return Err(format!("pthread_atfork: error {r}"));
    }
    START.store(start, Release);
    END.store(end, Release);
    Ok(())
}

// fork while another thread changes the map space would copy a half-made change into the
// child: the forking thread holds the lock across fork, and both sides release it.
extern "C" fn fork_prepare() {
    SPACE.hold();
}

extern "C" fn fork_after() {
    SPACE.reset();
}

/// The map space's figures for `zmem stat`.
pub fn stats() -> MapStats {
    let (start, end) = (START.load(Acquire), END.load(Acquire));
    if end == 0 {
        return MapStats::default();
    }
    let (free, foreign) = {
        let s = SPACE.lock();
        (s.free.total(), s.foreign.total())
    };
    let space = end - start;
    MapStats {
        space: space as u64,
        mapped: space.saturating_sub(free + foreign) as u64,
        served: SERVED.load(Relaxed),
        passed: PASSED.load(Relaxed),
        foreign: foreign as u64,
    }
}

/// Private, anonymous, and nothing the region cannot serve.
fn tierable(prot: c_int, flags: c_int) -> bool {
    let refused = libc::MAP_STACK
        | libc::MAP_GROWSDOWN
        | libc::MAP_HUGETLB
        | libc::MAP_LOCKED
        | libc::MAP_32BIT;
    flags & libc::MAP_ANONYMOUS != 0
        && flags & 0x0f == libc::MAP_PRIVATE
        && flags & refused == 0
        && prot & !(libc::PROT_READ | libc::PROT_WRITE | libc::PROT_EXEC) == 0
}

fn anonymous_private(flags: c_int) -> bool {
    flags & libc::MAP_ANONYMOUS != 0 && flags & 0x0f == libc::MAP_PRIVATE
}

/// Pages of `[addr, addr + len)` (map space) drop their content: zapped, and their compressed
/// copies discarded at once, so the range can be handed out again as zeros.
unsafe fn zap(addr: usize, len: usize) {
    sys::madvise(addr, len, libc::MADV_DONTNEED);
    if let Some(rt) = crate::runtime::runtime() {
        let _ = rt.region.discard(addr - rt.region.as_ptr() as usize, len);
    }
}

/// Gives `[addr, addr + len)` of the map space back: no pages, `PROT_NONE`, free.
unsafe fn release(addr: usize, len: usize) {
    zap(addr, len);
    sys::mprotect(addr, len, libc::PROT_NONE);
    SPACE.lock().free.insert(addr, addr + len);
}

/// Marks the parts of `[a, b)` inside the map space as the kernel's.
fn give_to_kernel(a: usize, b: usize, start: usize, end: usize) {
    let (lo, hi) = (a.max(start), b.min(end));
    if lo < hi {
        let mut s = SPACE.lock();
        s.free.remove(lo, hi);
        s.foreign.insert(lo, hi);
    }
}

/// Takes `len` bytes of free map space: at `hint` if that range is free, else the lowest fit.
fn take(hint: usize, len: usize) -> Option<usize> {
    let mut s = SPACE.lock();
    let at =
        if hint % PAGE == 0 && hint.checked_add(len).is_some() && s.free.covers(hint, hint + len) {
            hint
        } else {
            s.free.first_fit(len, PAGE)?
        };
    s.free.remove(at, at + len);
    Some(at)
}

/// A new mapping in the map space with protection `prot`, or None (full, or the kernel refused
/// the protection change: too many areas).
unsafe fn map_new(hint: usize, len: usize, prot: c_int) -> Option<usize> {
    let at = take(hint, len)?;
    if prot != libc::PROT_NONE && sys::mprotect(at, len, prot) != 0 {
        SPACE.lock().free.insert(at, at + len);
        return None;
    }
    SERVED.fetch_add(1, Relaxed);
    populate(at, len, prot);
    Some(at)
}

/// The start of new writable memory is mapped at once where the budget has room, so that the
/// program's first touches take no fault (see `Region::populate`).
unsafe fn populate(at: usize, len: usize, prot: c_int) {
    if prot & libc::PROT_WRITE == 0 {
        return;
    }
    if let Some(rt) = crate::runtime::runtime() {
        let _ = rt.region.populate(
            at - rt.region.as_ptr() as usize,
            len.min(heap::POPULATE_MAX),
        );
    }
}

/// `mmap`, `mmap64`.
pub unsafe fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
) -> *mut c_void {
    let a = addr as usize;
    let kernel = || sys::mmap(a, len, prot, flags, fd, off);
    let anonymous = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS;
    // Writable: reservations (PROT_NONE, as mimalloc's own page map, made as the library
    // loads) hold no data yet.
    if crate::runtime::lazy()
        && !crate::heap::is_internal()
        && prot & libc::PROT_WRITE != 0
        && flags & anonymous == anonymous
        && flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) == 0
    {
        // Counts toward the start point; past it zmem starts, and the mapping is made in the
        // region below.
        crate::lazy::mapped(len.min(isize::MAX as usize) as isize);
    }
    let Some((start, end)) = space() else {
        return kernel();
    };
    let Some(len_r) = round_up(len).filter(|&l| l > 0) else {
        return kernel();
    };
    if flags & (libc::MAP_FIXED | libc::MAP_FIXED_NOREPLACE) != 0 {
        let Some(e) = a.checked_add(len_r) else {
            return kernel();
        };
        if e <= start || a >= end {
            return kernel();
        }
        return as_zmem(|| fixed(a, len_r, prot, flags, fd, off, start, end), kernel);
    }
    if !tierable(prot, flags) {
        if anonymous_private(flags) {
            PASSED.fetch_add(1, Relaxed);
        }
        return kernel();
    }
    as_zmem(
        || match map_new(a, len_r, prot) {
            Some(at) => at as *mut c_void,
            None => {
                PASSED.fetch_add(1, Relaxed);
                kernel()
            }
        },
        kernel,
    )
}

/// `MAP_FIXED` or `MAP_FIXED_NOREPLACE` touching the map space.
#[allow(clippy::too_many_arguments)]
unsafe fn fixed(
    a: usize,
    len: usize,
    prot: c_int,
    flags: c_int,
    fd: c_int,
    off: off_t,
    start: usize,
    end: usize,
) -> *mut c_void {
    let e = a + len;
    let noreplace = flags & libc::MAP_FIXED_NOREPLACE != 0;
    let ours =
        a >= start && e <= end && tierable(prot, flags) && !SPACE.lock().foreign.overlaps(a, e);
    if !ours {
        // The kernel places it (over the region's memory, which it unmaps: the region hears of
        // it through the UNMAP event); that range is the kernel's from now on.
        let r = sys::mmap(a, len, prot, flags, fd, off);
        if r != libc::MAP_FAILED {
            give_to_kernel(a, e, start, end);
        }
        return r;
    }
    if noreplace {
        {
            let mut s = SPACE.lock();
            if !s.free.covers(a, e) {
                return fail(libc::EEXIST, libc::MAP_FAILED);
            }
            s.free.remove(a, e);
        }
        if prot != libc::PROT_NONE && sys::mprotect(a, len, prot) != 0 {
            let err = errno();
            SPACE.lock().free.insert(a, e);
            return fail(err, libc::MAP_FAILED);
        }
        SERVED.fetch_add(1, Relaxed);
        return a as *mut c_void;
    }
    // A fresh mapping over whatever was there: zeros with the new protection.
    SPACE.lock().free.remove(a, e);
    zap(a, len);
    if sys::mprotect(a, len, prot) != 0 {
        // Too many areas for another protection change: the kernel maps it instead.
        let r = sys::mmap(a, len, prot, flags, fd, off);
        if r != libc::MAP_FAILED {
            give_to_kernel(a, e, start, end);
        }
        return r;
    }
    SERVED.fetch_add(1, Relaxed);
    populate(a, len, prot);
    a as *mut c_void
}

/// `munmap`.
pub unsafe fn munmap(addr: *mut c_void, len: usize) -> c_int {
    let a = addr as usize;
    let kernel = || sys::munmap(a, len);
    let Some((start, end)) = space() else {
        if crate::runtime::lazy() && !crate::heap::is_internal() {
            crate::lazy::mapped(-(len.min(isize::MAX as usize) as isize));
        }
        return kernel();
    };
    let Some(e) = round_up(len)
        .filter(|&l| l > 0 && a % PAGE == 0)
        .and_then(|l| a.checked_add(l))
    else {
        return kernel(); // the kernel's EINVAL
    };
    if e <= start || a >= end {
        return kernel();
    }
    as_zmem(|| unmap(a, e, start, end), kernel)
}

unsafe fn unmap(a: usize, e: usize, start: usize, end: usize) -> c_int {
    if a < start {
        sys::munmap(a, start - a);
    }
    if e > end {
        sys::munmap(end, e - end);
    }
    let (lo, hi) = (a.max(start), e.min(end));
    // Ours: neither free already nor the kernel's.
    let (kernels, ours) = {
        let s = SPACE.lock();
        let kernels = s.foreign.within(lo, hi);
        let ours: Vec<(usize, usize)> = s
            .free
            .gaps(lo, hi)
            .into_iter()
            .flat_map(|(g, h)| s.foreign.gaps(g, h))
            .collect();
        (kernels, ours)
    };
    for (s, e) in kernels {
        sys::munmap(s, e - s);
    }
    for (s, e) in ours {
        release(s, e - s);
    }
    0
}

/// `mremap` (its fifth argument is read only with `MREMAP_FIXED`, as the kernel does).
pub unsafe fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    new_addr: *mut c_void,
) -> *mut c_void {
    let (a, n) = (old as usize, new_addr as usize);
    let kernel = || sys::mremap(a, old_len, new_len, flags, n);
    let Some((start, end)) = space() else {
        return kernel();
    };
    let in_space = |x: usize, l: usize| x < end && x.saturating_add(l.max(1)) > start;
    let fixed = flags & libc::MREMAP_FIXED != 0;
    if !in_space(a, old_len) {
        if fixed && in_space(n, new_len) {
            return as_zmem(
                || {
                    let r = kernel();
                    if r != libc::MAP_FAILED {
                        give_to_kernel(n, n.saturating_add(new_len), start, end);
                    }
                    r
                },
                kernel,
            );
        }
        return kernel();
    }
    as_zmem(
        || remap(a, old_len, new_len, flags, n, start, end),
        || fail(libc::EINVAL, libc::MAP_FAILED),
    )
}

#[allow(clippy::too_many_arguments)]
unsafe fn remap(
    a: usize,
    old_len: usize,
    new_len: usize,
    flags: c_int,
    n: usize,
    start: usize,
    end: usize,
) -> *mut c_void {
    let (Some(old_r), Some(new_r)) = (round_up(old_len), round_up(new_len)) else {
        return fail(libc::EINVAL, libc::MAP_FAILED);
    };
    if a % PAGE != 0 || old_r == 0 || new_r == 0 || a + old_r > end || a < start {
        return fail(libc::EINVAL, libc::MAP_FAILED);
    }
    let old_end = a + old_r;
    {
        let s = SPACE.lock();
        if s.foreign.covers(a, old_end) {
            drop(s);
            // Memory the kernel holds, moved by the kernel.
            let fixed = flags & libc::MREMAP_FIXED != 0;
            let r = sys::mremap(a, old_len, new_len, flags, n);
            if r != libc::MAP_FAILED && fixed {
                give_to_kernel(n, n.saturating_add(new_r), start, end);
            }
            return r;
        }
        if s.foreign.overlaps(a, old_end) || s.free.overlaps(a, old_end) {
            drop(s);
            if !MREMAP_WARNED.swap(true, Relaxed) {
                tracing::warn!("mremap over a range that is only partly mapped: EFAULT");
            }
            return fail(libc::EFAULT, libc::MAP_FAILED);
        }
    }
    let dontunmap = flags & libc::MREMAP_DONTUNMAP != 0;
    let may_move = flags & libc::MREMAP_MAYMOVE != 0;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let dest = if flags & libc::MREMAP_FIXED != 0 {
        if !may_move || n % PAGE != 0 || (n < old_end && n + new_r > a) {
            return fail(libc::EINVAL, libc::MAP_FAILED);
        }
        let r = mmap_fixed_rw(n, new_r);
        if r == libc::MAP_FAILED {
            return r;
        }
        n
    } else {
        if !dontunmap {
            if new_r <= old_r {
                if new_r < old_r {
                    release(a + new_r, old_r - new_r);
                }
                return a as *mut c_void;
            }
            let grown = {
                let mut s = SPACE.lock();
                let ok = s.free.covers(old_end, a + new_r);
                if ok {
                    s.free.remove(old_end, a + new_r);
                }
                ok
            };
            if grown {
                if sys::mprotect(old_end, new_r - old_r, rw) == 0 {
                    return a as *mut c_void;
                }
                SPACE.lock().free.insert(old_end, a + new_r);
            }
        }
        if !may_move {
            return fail(libc::ENOMEM, libc::MAP_FAILED);
        }
        match map_new(0, new_r, rw) {
            Some(at) => at,
            None => {
                let r = sys::mmap(0, new_r, rw, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS, -1, 0);
                if r == libc::MAP_FAILED {
                    return r;
                }
                r as usize
            }
        }
    };
    // Readable whatever its protection was, then moved by the region (resident pages to the
    // new address, compressed ones to their new index; `Region::move_pages`) where the new
    // range is the region's too, else copied: the region cannot follow the kernel's page moves.
    sys::mprotect(a, old_r, rw);
    let keep = old_r.min(new_r);
    let moved = dest >= start
        && dest + keep <= end
        && crate::runtime::runtime().is_some_and(|rt| {
            let base = rt.region.as_ptr() as usize;
            // SAFETY: both ranges are the program's mapping being remapped, which no other
            // thread may use meanwhile (as with the kernel's mremap); they do not overlap.
            unsafe { rt.region.move_pages(dest - base, a - base, keep) }.is_ok()
        });
    if !moved {
        std::ptr::copy_nonoverlapping(a as *const u8, dest as *mut u8, keep);
    }
    if dontunmap {
        zap(a, old_r);
    } else {
        release(a, old_r);
    }
    dest as *mut c_void
}

/// A read-write anonymous mapping exactly at `[at, at + len)`: renewed map space, or the
/// kernel's elsewhere.
unsafe fn mmap_fixed_rw(at: usize, len: usize) -> *mut c_void {
    let flags = libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED;
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    let (start, end) = (START.load(Acquire), END.load(Acquire));
    if at + len <= start || at >= end {
        return sys::mmap(at, len, rw, flags, -1, 0);
    }
    fixed(at, len, rw, flags, -1, 0, start, end)
}

/// `madvise`: `MADV_FREE` over the map space becomes `MADV_DONTNEED`; pages dropped there lose
/// their compressed copies at once.
pub unsafe fn madvise(addr: *mut c_void, len: usize, advice: c_int) -> c_int {
    let a = addr as usize;
    let Some((start, end)) = space() else {
        return sys::madvise(a, len, advice);
    };
    let e = a.saturating_add(len);
    let drops = advice == libc::MADV_DONTNEED || advice == libc::MADV_FREE;
    if !drops || e <= start || a >= end {
        return sys::madvise(a, len, advice);
    }
    let r = sys::madvise(a, len, libc::MADV_DONTNEED);
    if r == 0 {
        let (lo, hi) = (a.max(start), e.min(end));
        as_zmem(
            || {
                if let Some(rt) = crate::runtime::runtime() {
                    let _ = rt.region.discard(lo - rt.region.as_ptr() as usize, hi - lo);
                }
            },
            || (),
        );
    }
    r
}

/// `mprotect`: region pages made writable again may leave DRAM again.
pub unsafe fn mprotect(addr: *mut c_void, len: usize, prot: c_int) -> c_int {
    let a = addr as usize;
    let r = sys::mprotect(a, len, prot);
    // Only plain read-write pages can be moved out (the staging area's protection).
    let rw = libc::PROT_READ | libc::PROT_WRITE;
    if r != 0 || prot != rw || END.load(Relaxed) == 0 || heap::is_internal() {
        return r;
    }
    let Some(rt) = crate::runtime::runtime() else {
        return r;
    };
    let (base, rlen) = (rt.region.as_ptr() as usize, rt.region.len());
    let (lo, hi) = (a.max(base), a.saturating_add(len).min(base + rlen));
    if lo < hi {
        as_zmem(
            || rt.region.release_held(lo - base, hi - lo).map(|_| ()),
            || Ok(()),
        )
        .ok();
    }
    r
}
