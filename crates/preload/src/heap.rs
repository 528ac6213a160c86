//! Two heaps, two allocators:
//!
//! - the **program heap** is mimalloc 3's main heap (`mi_malloc`), confined to the zmem region:
//!   the region is handed to mimalloc as arenas ([`add_region`]) and mimalloc may not take
//!   memory of its own from the OS after that, so everything the program mallocs lives in memory
//!   that compresses itself;
//! - the **internal heap** is the C library's own malloc (`__libc_malloc`, plain OS memory), for
//!   zmem itself: this library's Rust allocations, any malloc made on a zmem thread, and every
//!   malloc made while zmem starts (or by everyone, when zmem is off).
//!
//! Why glibc's allocator and not a second mimalloc heap: a zmem thread must never run code that
//! walks the program's memory, since it may have to serve the fault itself. mimalloc's
//! allocation path does exactly that now and then (a generic collect purges *every* arena of the
//! process, the program's included, and reads options from `environ`, which a program may have
//! moved into its heap). glibc's malloc on zmem's threads only ever touches glibc's own arenas.
//! `free` and friends route a pointer by address: inside the program heap's span it is
//! mimalloc's, anywhere else glibc's (including what was allocated before zmem started).
//!
//! Mid-size blocks of the program heap ([`MID_MIN`]..=[`MID_MAX`] bytes, 16-byte aligned) come
//! from an exact-fit allocator (zmem_fit) over the last eighth of the heap's span instead of
//! mimalloc, whose 4 classes per power of two round such blocks up by up to 25%: under a small
//! budget those bytes are evicted and faulted back like data (sqlite's 4368-byte page-cache
//! pages took 5120 bytes each). Smaller blocks stay with mimalloc, whose per-thread fast path
//! is what keeps malloc-heavy programs at plain speed; larger ones lose little to its classes.
//! `ZMEM_EXACT_FIT=0` (`--no-exact-fit`) leaves every block to mimalloc.
//!
//! zmem's own threads are marked ([`mark_internal`], run by zmem_os's thread start hook).
//! mimalloc reads an arena's bookkeeping (at the start of the memory it manages) from any
//! thread, so those pages are pinned in DRAM ([`pins`]).
//!
//! Why the region is split into arenas of [`REGION_CHUNK`]: mimalloc 3 keeps ~2 MiB of page
//! metadata per GiB at an arena's start and refuses arenas whose metadata exceeds 32 MiB, so one
//! arena cannot exceed about 15 GiB (measured: 16 GiB is refused). As few arenas as that allows:
//! setting one up writes the header of each of its ~80 bitmaps, a page each (a copy of the zero
//! page and a TLB shootdown per page), which made most of a process start under zmem (the
//! default 94 GiB heap in 8 GiB arenas: 12 arenas, ~1000 such faults, ~3.5 ms of 7.4 ms). So
//! the arenas are added one at a time as the heap fills ([`grow`]), each as large as allowed
//! after a small first one ([`FIRST_ARENA`]).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

use zmem_os::errno::KeepErrno;

use crate::mi;
use crate::runtime::as_zmem;

/// Whether a thread is internal: not asked yet, the program's, zmem's (or starting zmem).
const UNKNOWN: u8 = 0;
const PROGRAM: u8 = 1;
const ZMEM: u8 = 2;

thread_local! {
    /// ZMEM on zmem's threads and on a thread while it starts zmem.
    static INTERNAL: Cell<u8> = const { Cell::new(UNKNOWN) };
}

thread_local! {
    /// Set while the thread runs mimalloc for the program heap (see [`in_mimalloc`]).
    static IN_MIMALLOC: Cell<bool> = const { Cell::new(false) };
}

/// Whether the calling thread is inside mimalloc, serving the program heap. mimalloc's own
/// memory (its page map's 64 KiB submaps, mapped as the heap reaches each new 512 MiB) is then
/// mapped straight by the kernel, not in the map space: mimalloc fills a submap holding its
/// page-map lock, and a fault there while a fork parks zmem's handlers let fork copy the lock
/// held into the child, which then hung at its next allocation in a new range (found with
/// tests/c/heap_grow.c: 2 hangs in 4 runs).
#[inline]
pub fn in_mimalloc() -> bool {
    IN_MIMALLOC.with(|c| c.get())
}

/// Runs `f` (a call into mimalloc for the program heap) with [`in_mimalloc`] set.
#[inline]
fn inside_mimalloc<T>(f: impl FnOnce() -> T) -> T {
    let was = IN_MIMALLOC.with(|c| c.replace(true));
    let r = f();
    IN_MIMALLOC.with(|c| c.set(was));
    r
}

/// Marks the calling thread as zmem's own: its mallocs use the internal heap from now on.
pub fn mark_internal() {
    INTERNAL.with(|c| c.set(ZMEM));
}

pub fn set_internal(on: bool) -> bool {
    let was = is_internal();
    INTERNAL.with(|c| c.set(if on { ZMEM } else { PROGRAM }));
    was
}

/// Asked on every allocation. A thread's first answer comes from its name: std mallocs on a new
/// thread before the start hook marks it, and that first block landed in the program heap
/// (found with a forked child whose parent had exited: its `zmem-child` thread waited forever
/// on a program page only the parent could bring back).
pub fn is_internal() -> bool {
    INTERNAL.with(|c| match c.get() {
        UNKNOWN => {
            let zmem = zmem_os::thread::is_zmem_thread();
            c.set(if zmem { ZMEM } else { PROGRAM });
            zmem
        }
        v => v == ZMEM,
    })
}

/// Arena size the region is cut into (a last piece under 1/16 of it joins the one before, so
/// no arena exceeds 14.9 GiB).
pub const REGION_CHUNK: usize = 14 << 30;
/// The first arena: small, so that setting it up costs a process little (most programs under
/// `zmem run` are short-lived and small): ~0.2 ms against ~0.8 ms for a 14 GiB one (session
/// 38, a `posix_spawn` loop of /bin/true). The next ones, [`REGION_CHUNK`] each, are added as
/// the heap fills, and before the first block of a quarter of this size ([`grow_before_large`]).
pub const FIRST_ARENA: usize = 256 << 20;
static PROGRAM_FIRST: AtomicUsize = AtomicUsize::new(0);
/// Where the first arena ends (0 until it is added).
static FIRST_ARENA_END: AtomicUsize = AtomicUsize::new(0);
/// mimalloc arenas start on 64 KiB boundaries.
pub const SLICE: usize = 64 << 10;

// glibc's allocator under its own names (exported by libc.so.6 since 2.2.5), so calls reach it
// past this library's interposed malloc.
extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(count: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    fn __libc_free(p: *mut c_void);
}

/// The program heap's span [start, end): set once, before any program allocation.
static PROGRAM_START: AtomicUsize = AtomicUsize::new(0);
static PROGRAM_END: AtomicUsize = AtomicUsize::new(0);

/// Whether `p` is a block of the program heap (mimalloc's); otherwise it is glibc's.
#[inline]
pub fn in_program_heap(p: *const c_void) -> bool {
    let p = p as usize;
    p >= PROGRAM_START.load(Relaxed) && p < PROGRAM_END.load(Relaxed)
}

/// The exact-fit span's bounds (0, 0 while it is off) and its allocator. Its lock is a flag
/// that fork takes and resets ([`zmem_os::spin::SpinLock`]): a holder may wait for a fault.
static MID_START: AtomicUsize = AtomicUsize::new(0);
static MID_END: AtomicUsize = AtomicUsize::new(0);
static MID: zmem_os::spin::SpinLock<zmem_fit::Fit> =
    zmem_os::spin::SpinLock::new(zmem_fit::Fit::new());
/// Requests of this many bytes and up, to [`MID_MAX`], are exact-fit blocks.
pub const MID_MIN: usize = 1025;
pub const MID_MAX: usize = 32 << 10;
/// The exact-fit span is used this much at a time.
const MID_STEP: usize = 1 << 20;
/// A free hole of the exact-fit span gives its pages back once it spans this much (zmem_fit's
/// `release_min`): dropping every freed page made sqlite 25% slower (35k madvise calls, each a
/// REMOVE event, and as many faults when the holes were reused).
const MID_RELEASE_MIN: usize = 32 << 10;
/// ... and once it has stayed free this long (zmem_fit's `release_delay`; mimalloc's
/// `purge_delay` is the same): gcc's cc1 freed and refilled the same 32–48 KiB holes every
/// ~7 ms, and dropping them at once cost 1,000 madvise calls (each a REMOVE event) and 8,000
/// faults per compile, 0.2–0.3 s of 2.6; its 4 KB obstack chunks, in mimalloc, as many again.
const FREED_DROP_DELAY_MS: u64 = 50;
/// Frees of exact-fit blocks that are not live (double frees, pointers into a block), said
/// once on stderr.
pub static MID_BAD_FREES: AtomicU64 = AtomicU64::new(0);

/// Whether `p` is an exact-fit block.
#[inline]
fn in_mid(p: *const c_void) -> bool {
    let p = p as usize;
    p >= MID_START.load(Relaxed) && p < MID_END.load(Relaxed)
}

/// Whether a request goes to the exact-fit allocator: it is on, the size is one of its, and
/// not nearly whole pages.
#[inline]
fn for_mid(size: usize, align: usize) -> bool {
    (MID_MIN..=MID_MAX).contains(&size)
        && align <= 16
        && MID_START.load(Relaxed) != 0
        && !nearly_whole_pages(size)
}

/// Whether `size` is within a sixteenth under a whole number of pages (3840–4096 bytes, 7680–
/// 8192, ...). Such a block goes to mimalloc, whose class for it is those pages, page aligned
/// (as jemalloc's), so that reading it faults once per page of it. An exact-fit block of 4000
/// bytes straddles two pages nearly always: redis's 4 KB values then took two faults per
/// cold GET, where they take one under jemalloc and under mimalloc. It costs at most a
/// sixteenth of the block.
#[inline]
fn nearly_whole_pages(size: usize) -> bool {
    let pages = size.next_multiple_of(zmem_os::PAGE_SIZE);
    pages - size <= pages / 16
}

thread_local! {
    /// Set while the thread takes or holds the exact-fit lock, which is not reentrant: a
    /// program's signal handler that allocates or frees on this thread meanwhile (undefined
    /// in C, done in practice) is served without it (see [`with_mid`]) instead of spinning on
    /// a lock its own thread holds.
    static IN_MID: Cell<bool> = const { Cell::new(false) };
}

/// Exact-fit blocks freed while their thread held the lock (by a signal handler), freed by the
/// lock's next holder: a stack linked through the blocks' first words.
static PENDING_FREES: AtomicUsize = AtomicUsize::new(0);

/// Runs `f` on the exact-fit allocator under its lock, after the frees left pending; None if
/// this thread is already inside (a signal handler interrupted it there).
#[inline]
fn with_mid<T>(f: impl FnOnce(&mut zmem_fit::Fit) -> T) -> Option<T> {
    if IN_MID.with(|c| c.replace(true)) {
        return None;
    }
    let mut fit = MID.lock();
    // The time, for the holes freed now and those whose delay has passed.
    // SAFETY: the span is the region's, mapped for the life of the process.
    // (The clock tick's few ms of resolution are enough to age holes.)
    let aged = unsafe { fit.advance(zmem_os::clock_ms(libc::CLOCK_MONOTONIC_COARSE)) };
    mid_drop(aged);
    let pending = PENDING_FREES.swap(0, Acquire);
    if pending != 0 {
        free_pending(&mut fit, pending);
    }
    let r = f(&mut fit);
    drop(fit);
    IN_MID.with(|c| c.set(false));
    Some(r)
}

#[cold]
fn free_pending(fit: &mut zmem_fit::Fit, mut p: usize) {
    while p != 0 {
        // SAFETY: a block pushed by `defer_free`, its first word the next one's address.
        let next = unsafe { *(p as *const usize) };
        // SAFETY: the span is the region's; `p` is checked by the allocator.
        match unsafe { fit.free(p) } {
            Ok(release) => mid_drop(release),
            Err(_) => bad_free(),
        }
        p = next;
    }
}

/// A free that cannot take the lock now: left for its next holder.
#[cold]
unsafe fn defer_free(p: *mut c_void) {
    let mut head = PENDING_FREES.load(Relaxed);
    loop {
        // SAFETY: `p` is a live exact-fit block (the caller's contract): its data is ours now.
        unsafe { *(p as *mut usize) = head };
        match PENDING_FREES.compare_exchange_weak(head, p as usize, Release, Relaxed) {
            Ok(_) => return,
            Err(h) => head = h,
        }
    }
}

/// An exact-fit block, or null when its span is full or its lock taken by this thread (the
/// caller asks mimalloc).
#[inline]
unsafe fn mid_alloc(size: usize, zero: bool) -> *mut c_void {
    let got = with_mid(|fit| {
        let top = fit.top();
        // SAFETY: the span is part of the region, mapped for the life of the process.
        unsafe { fit.alloc(size) }.map(|p| (p, (top, fit.top())))
    });
    let Some(Some((p, grown))) = got else {
        return null_mut();
    };
    if grown.1 > grown.0 {
        populate(grown.0, grown.1 - grown.0);
    }
    if zero {
        // SAFETY: a live block of at least `size` bytes.
        unsafe { std::ptr::write_bytes(p as *mut u8, 0, size) };
    }
    p as *mut c_void
}

/// Maps the start of memory the program is about to use for the first time (a mimalloc commit,
/// a growth of the exact-fit span): its first touches become the kernel's cheap faults instead
/// of a round trip through zmem, as far as the budget has room.
fn populate(start: usize, len: usize) {
    let Some(rt) = crate::runtime::runtime() else {
        return;
    };
    let page = zmem_os::PAGE_SIZE;
    let from = start.next_multiple_of(page);
    let to = (start + len.min(POPULATE_MAX)) / page * page;
    let off = from.wrapping_sub(rt.region.as_ptr() as usize);
    if to > from && off < rt.region.len() {
        let len = (to - from).min(rt.region.len() - off);
        as_zmem(|| drop(rt.region.populate(off, len)), || ());
    }
}

/// Drops pages a free left unused: a REMOVE event for the region, which forgets them and their
/// compressed copies. Called with the exact-fit lock held, so nothing is allocated there first.
fn mid_drop(release: zmem_fit::Release) {
    // A zmem thread must not wait for its own REMOVE event (it never frees program blocks;
    // this only keeps a mistake from hanging): the pages then stay, unused.
    if release.is_empty() || is_internal() {
        return;
    }
    for &(at, len) in release.ranges() {
        // SAFETY: whole pages inside a free block of the span; nothing else lives there.
        unsafe { libc::madvise(at as *mut c_void, len, libc::MADV_DONTNEED) };
    }
}

/// Frees an exact-fit block.
unsafe fn mid_free(p: *mut c_void) {
    // SAFETY: the span is the region's; `p` is checked by the allocator.
    let done = with_mid(|fit| match unsafe { fit.free(p as usize) } {
        Ok(release) => mid_drop(release),
        Err(_) => bad_free(),
    });
    if done.is_none() {
        defer_free(p);
    }
}

/// The usable size of an exact-fit block.
unsafe fn mid_usable_size(p: *mut c_void) -> Option<usize> {
    // SAFETY: the span is the region's; `p` is checked by the allocator.
    match with_mid(|fit| unsafe { fit.usable_size(p as usize) }.ok()) {
        Some(n) => n,
        // This thread holds the lock (a signal handler): the block's own header, which no
        // other thread can change meanwhile.
        None => Some(zmem_fit::Fit::usable_size_held(p as usize)),
    }
}

/// A free of something that is not a live block: ignored (nothing is corrupted further), and
/// said once on stderr without formatting (this may run with the heap in any state).
#[cold]
fn bad_free() {
    if MID_BAD_FREES.fetch_add(1, Relaxed) == 0 {
        const MSG: &[u8] = b"zmem: free() or realloc() of a pointer that is not a live \
            block (a double free?): ignored (said once)\n";
        // SAFETY: a write of a static buffer to stderr.
        unsafe { libc::write(2, MSG.as_ptr().cast(), MSG.len()) };
    }
}

/// What an allocation of `size` bytes gets (jemalloc's nallocx).
pub fn good_size(size: usize) -> usize {
    if for_mid(size, 16) {
        if let Some(n) = zmem_fit::Fit::usable_for(size) {
            return n;
        }
    }
    // SAFETY: a pure computation in mimalloc.
    unsafe { mi::mi_good_size(size) }.max(size)
}

// glibc's blocks are aligned to 16 bytes; mimalloc's to 16 bytes from 16 bytes up, to 8 below.
fn natural(align: usize, size: usize) -> bool {
    align <= 8 || (align <= 16 && size >= 16)
}

/// A new block: from the program heap if `program`, else from the internal heap.
///
/// # Safety
/// `align` is a power of two.
#[inline]
pub unsafe fn alloc(size: usize, align: usize, zero: bool, program: bool) -> *mut c_void {
    if program {
        if size < MID_MIN && natural(align, size) {
            // The hot path (mimalloc's small blocks): zmem's code runs under it only in
            // mimalloc's commit callback and in `grow`, which keep errno themselves (a guard
            // here cost 3–4 ns per malloc and free, ~10%).
            return program_heap_alloc(size, align, zero);
        }
        // zmem's calls on the way (populating, moving or zeroing pages, adding an arena)
        // leave errno as the program had it unless the allocation fails.
        let errno = KeepErrno::new();
        let p = program_heap_alloc(size, align, zero);
        if p.is_null() {
            errno.dismiss();
        }
        return p;
    }
    match (natural(align, size), zero) {
        (true, false) => __libc_malloc(size),
        (true, true) => __libc_calloc(1, size),
        (false, zero) => {
            let p = __libc_memalign(align.max(16), size);
            if zero && !p.is_null() {
                std::ptr::write_bytes(p as *mut u8, 0, size);
            }
            p
        }
    }
}

/// A new block of the program heap: exact-fit or mimalloc's, with the heap grown if it is full.
///
/// # Safety
/// `align` is a power of two.
#[inline]
unsafe fn program_heap_alloc(size: usize, align: usize, zero: bool) -> *mut c_void {
    if for_mid(size, align) {
        let p = mid_alloc(size, zero);
        if !p.is_null() {
            return p;
        }
    }
    let p = program_alloc(size, align, zero);
    if p.is_null() || GROW_WANTED.load(Relaxed) {
        // SAFETY: as this function's.
        return grow_then_retry(p, size, || unsafe { program_alloc(size, align, zero) });
    }
    p
}

/// A new block of mimalloc's main heap.
///
/// # Safety
/// `align` is a power of two.
#[inline]
unsafe fn program_alloc(size: usize, align: usize, zero: bool) -> *mut c_void {
    if size >= FIRST_ARENA / 4 {
        grow_before_large();
    }
    if zero && size >= LARGE_MIN {
        let p = program_alloc(size, align, false);
        if !p.is_null() {
            zero_large(p);
        }
        return p;
    }
    inside_mimalloc(|| match (natural(align, size), zero) {
        (true, false) => mi::mi_malloc(size),
        (true, true) => mi::mi_zalloc(size),
        (false, false) => mi::mi_malloc_aligned(size, align),
        (false, true) => mi::mi_zalloc_aligned(size, align),
    })
}

/// After a program allocation (or resize) of `size` bytes that failed (`p` null) or found the
/// heap asking for its next arena: adds arenas, and calls `retry` once per arena added while
/// it fails.
#[cold]
fn grow_then_retry(
    mut p: *mut c_void,
    size: usize,
    mut retry: impl FnMut() -> *mut c_void,
) -> *mut c_void {
    if !p.is_null() {
        grow(false);
        return p;
    }
    if size > REGION_CHUNK {
        // Larger than any arena (mimalloc's largest object is set to one).
        say_heap_refused(
            size,
            "larger than the heap's largest block (an arena of 14 GiB)",
        );
        return p;
    }
    // One more try when no arena could be added: another thread may have added the last
    // ones since this allocation failed (four threads asking for 512 MiB blocks at once from a
    // small first arena: the last one found every arena added and gave up with ENOMEM).
    let mut tried_without_growth = false;
    while p.is_null() {
        if !grow(true) {
            if tried_without_growth {
                break;
            }
            tried_without_growth = true;
        }
        p = retry();
    }
    if p.is_null() {
        say_heap_refused(size, "no room left in the heap's region");
    }
    p
}

/// Set once the program was told that its heap refused a block.
static REFUSAL_SAID: AtomicBool = AtomicBool::new(false);

/// Says once per process why a program allocation of `size` bytes returns NULL although the
/// machine may have the memory: the heap is a region of fixed address space (`--size`), and a
/// large block takes whole 32 MiB pieces of it (mimalloc places blocks over 32 MiB on chunk
/// boundaries: a 512 MiB block uses 544 MiB). Found through tests/c/fork_grow.c at `--size 64G`:
/// 100 blocks of 512 MiB and one more in a forked child left the last arena no room in 9 of
/// 200 runs (never at 128G), a NULL no message explained.
#[cold]
fn say_heap_refused(size: usize, why: &str) {
    if REFUSAL_SAID.swap(true, Relaxed) {
        return;
    }
    let _errno = KeepErrno::new();
    let was = set_internal(true);
    let span = PROGRAM_END.load(Relaxed) - PROGRAM_START.load(Relaxed);
    tracing::warn!(
        "a heap block of {size} bytes is refused (NULL, ENOMEM): {why}; the heap spans {} MiB \
         of address space: a larger --size (ZMEM_SIZE) gives it more at no cost in memory",
        span >> 20
    );
    set_internal(was);
}

/// Frees a block of either heap.
///
/// # Safety
/// `p` is null or a live block of this library's allocator.
#[inline]
pub unsafe fn free(p: *mut c_void) {
    if in_mid(p) {
        let _errno = KeepErrno::new(); // free never changes errno (POSIX.1-2024)
        mid_free(p)
    } else if in_program_heap(p) {
        // mimalloc's large blocks are page aligned: the one test on every free. Freeing any
        // other block runs zmem's code only in mimalloc's commit callback (a decommit), which
        // keeps errno itself.
        if p as usize % zmem_os::PAGE_SIZE == 0 {
            let _errno = KeepErrno::new();
            forget_freed_stored(p);
        }
        inside_mimalloc(|| mi::mi_free(p))
    } else if !p.is_null() {
        __libc_free(p)
    }
}

/// glibc's `malloc_usable_size`, found past this library's (which shadows it).
fn libc_usable_size(p: *mut c_void) -> usize {
    type UsableSize = unsafe extern "C" fn(*mut c_void) -> usize;
    static FOUND: AtomicPtr<c_void> = AtomicPtr::new(null_mut());
    let mut f = FOUND.load(Acquire);
    if f.is_null() {
        // SAFETY: a lookup by a static name.
        f = unsafe { libc::dlsym(libc::RTLD_NEXT, c"malloc_usable_size".as_ptr()) };
        if f.is_null() {
            return 0;
        }
        FOUND.store(f, Release);
    }
    // SAFETY: the symbol is glibc's malloc_usable_size.
    unsafe { std::mem::transmute::<*mut c_void, UsableSize>(f)(p) }
}

/// The usable size of a block of either heap (0 for null).
///
/// # Safety
/// `p` is null or a live block of this library's allocator.
pub unsafe fn usable_size(p: *mut c_void) -> usize {
    if in_mid(p) {
        return mid_usable_size(p).unwrap_or(0);
    }
    if in_program_heap(p) {
        mi::mi_usable_size(p)
    } else if p.is_null() {
        0
    } else {
        libc_usable_size(p)
    }
}

/// Resizes a live block. A block stays in the heap it is in: a glibc block allocated before
/// zmem started is resized by glibc.
///
/// # Safety
/// `p` is a live block of this library's allocator, `size` > 0, `align` a power of two.
pub unsafe fn realloc(p: *mut c_void, size: usize, align: usize) -> *mut c_void {
    // As in `alloc`: errno changes only if the resize fails.
    let errno = KeepErrno::new();
    let q = resize_block(p, size, align);
    if q.is_null() {
        errno.dismiss();
    }
    q
}

/// `realloc`'s work.
///
/// # Safety
/// As `realloc`'s.
unsafe fn resize_block(p: *mut c_void, size: usize, align: usize) -> *mut c_void {
    if in_mid(p) {
        return mid_realloc(p, size, align);
    }
    if for_mid(size, align) && in_program_heap(p) {
        // A mimalloc block grown into the exact-fit sizes moves there (mimalloc would move it
        // anyway, to a rounded-up class).
        let keep = mi::mi_usable_size(p);
        let q = match size > keep {
            true => mid_alloc(size, false),
            false => null_mut(),
        };
        if !q.is_null() {
            std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, keep);
            inside_mimalloc(|| mi::mi_free(p));
            return q;
        }
    }
    if size >= LARGE_MIN && natural(align, size) && in_program_heap(p) {
        if let Some(q) = resize_by_moving(p, size) {
            return q;
        }
    }
    match (in_program_heap(p), natural(align, size)) {
        (true, natural) => {
            let resize = |p, size| {
                inside_mimalloc(|| match natural {
                    true => mi::mi_realloc(p, size),
                    false => mi::mi_realloc_aligned(p, size, align),
                })
            };
            let q = resize(p, size);
            if q.is_null() || GROW_WANTED.load(Relaxed) {
                // As in `alloc`; on failure `p` is still the program's, unchanged.
                return grow_then_retry(q, size, || resize(p, size));
            }
            q
        }
        (false, true) => __libc_realloc(p, size),
        (false, false) => {
            let q = __libc_memalign(align.max(16), size);
            if !q.is_null() {
                let keep = libc_usable_size(p).min(size);
                std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, keep);
                __libc_free(p);
            }
            q
        }
    }
}

/// Blocks from this size on are resized by moving their pages ([`resize_by_moving`]) and are zeroed
/// page by page as the region sees fit ([`zero_large`]): below it a copy or a memset costs
/// less than the region's bookkeeping.
pub const LARGE_MIN: usize = 64 << 10;

/// Zeroes a new program-heap block of at least [`LARGE_MIN`] bytes (all of its usable size)
/// for calloc. mimalloc writes zeros over every page of a block it reuses; through a small
/// budget each page was then faulted in and evicted again (4 callocs of 512 MiB at
/// `--resident 16M`: 2.0 s, 390k evictions, where glibc's calloc gets fresh zero pages from
/// mmap). The region leaves alone the pages that hold nothing and forgets the stored ones
/// (`Region::zero_pages`); only the mapped ones, and the bytes before and after the whole
/// pages, are written.
unsafe fn zero_large(p: *mut c_void) {
    let len = mi::mi_usable_size(p);
    let page = zmem_os::PAGE_SIZE;
    let at = p as usize;
    let head = ((page - at % page) % page).min(len);
    let whole = (len - head) / page * page;
    std::ptr::write_bytes(p as *mut u8, 0, head);
    let done = whole > 0
        && crate::runtime::runtime().is_some_and(|rt| {
            let off = at + head - rt.region.as_ptr() as usize;
            // SAFETY: whole pages of a block not handed out yet, inside the region.
            as_zmem(
                || unsafe { rt.region.zero_pages(off, whole) }.is_ok(),
                || false,
            )
        });
    let from = if done { head + whole } else { head };
    std::ptr::write_bytes((at + from) as *mut u8, 0, len - from);
}

/// Before a page-aligned program-heap block of at least [`LARGE_MIN`] bytes is freed: its
/// stored pages are forgotten at once (`Region::drop_stored`), their compressed copies freed.
/// mimalloc purges a freed block only after 50 ms; a reuse of it before then (a buffer
/// allocated, filled and freed in a loop) faulted back and decoded every stored page of old
/// data only to write over it (64 MiB twenty times at `--resident 16M`: 47k major faults).
/// Resident pages stay for mimalloc to reuse or purge.
unsafe fn forget_freed_stored(p: *mut c_void) {
    let len = mi::mi_usable_size(p);
    if len < LARGE_MIN || is_internal() {
        return;
    }
    if let Some(rt) = crate::runtime::runtime() {
        let off = p as usize - rt.region.as_ptr() as usize;
        let whole = len / zmem_os::PAGE_SIZE * zmem_os::PAGE_SIZE;
        // SAFETY: the program frees the block: nobody uses its content any more.
        as_zmem(|| drop(unsafe { rt.region.drop_stored(off, whole) }), || ());
    }
}

/// Resizes a program-heap block by moving its pages into a new block where mimalloc would copy
/// it: a block that grows, or shrinks below half its size, keeping at least [`LARGE_MIN`]
/// bytes (`Region::move_pages`: a resident page changes address, a compressed one changes
/// index). Through a small budget mimalloc's copy faulted back each page of the old block and
/// wrote and later evicted each page of the new one (a Python list growing to 12M entries at
/// `--resident 32M`: 2.7 s against 0.7 s plain, whose glibc moves such a block with mremap).
/// None where mimalloc resizes the block in place, or no new block could be had (mimalloc's
/// path then tries, growing the heap).
unsafe fn resize_by_moving(p: *mut c_void, size: usize) -> Option<*mut c_void> {
    let old = mi::mi_usable_size(p);
    let keep = if size > old {
        old
    } else if size < old / 2 {
        size
    } else {
        return None;
    };
    if keep < LARGE_MIN {
        return None;
    }
    let rt = crate::runtime::runtime()?;
    let q = program_alloc(size, 16, false);
    if q.is_null() {
        return None;
    }
    if GROW_WANTED.load(Relaxed) {
        grow(false);
    }
    let page = zmem_os::PAGE_SIZE;
    let (from, to) = (p as usize, q as usize);
    // Whole pages move only between blocks at the same offset in their pages (mimalloc's
    // large blocks are page aligned); the bytes before and after them are copied.
    let head = if from % page == to % page {
        ((page - from % page) % page).min(keep)
    } else {
        keep
    };
    let whole = (keep - head) / page * page;
    let base = rt.region.as_ptr() as usize;
    std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, head);
    // SAFETY: both blocks are whole pages of the region held by this call alone (the program
    // gave `p` to realloc; `q` is not handed out yet).
    let moved = whole > 0
        && as_zmem(
            || {
                unsafe {
                    rt.region
                        .move_pages(to + head - base, from + head - base, whole)
                }
                .is_ok()
            },
            || false,
        );
    let done = if moved { head + whole } else { head };
    std::ptr::copy_nonoverlapping(
        (from + done) as *const u8,
        (to + done) as *mut u8,
        keep - done,
    );
    inside_mimalloc(|| mi::mi_free(p));
    Some(q)
}

/// Resizes an exact-fit block: in place when it shrinks or the block after it is free, else
/// into a new block (exact-fit or mimalloc's, by the new size).
unsafe fn mid_realloc(p: *mut c_void, size: usize, align: usize) -> *mut c_void {
    let in_place = align <= 16 && size <= MID_MAX;
    let resized = with_mid(|fit| {
        // SAFETY: the span is the region's; `p` is checked by the allocator.
        let old = unsafe { fit.usable_size(p as usize) }.ok()?;
        if in_place {
            // SAFETY: as above.
            if let Ok(zmem_fit::Resized::Done { release }) =
                unsafe { fit.resize_in_place(p as usize, size) }
            {
                mid_drop(release);
                return Some(None);
            }
        }
        Some(Some(old))
    });
    let old = match resized {
        Some(Some(Some(old))) => old,
        Some(Some(None)) => return p,
        Some(None) => {
            bad_free();
            return null_mut();
        }
        // This thread holds the lock (a signal handler): move the block.
        None => zmem_fit::Fit::usable_size_held(p as usize),
    };
    let q = alloc(size, align, false, true);
    if !q.is_null() {
        std::ptr::copy_nonoverlapping(p as *const u8, q as *mut u8, old.min(size));
        mid_free(p);
    }
    q
}

/// Keeps the internal heap (glibc's malloc, zmem's own memory) small: one arena, and blocks of
/// 128 KiB or more mapped and unmapped with each allocation. By default glibc gives every
/// thread that allocates an arena of its own, which keeps what it once held, and raises its
/// mmap threshold after each large free, so large buffers freed stay in the arenas too. On the
/// signal route every program thread that serves a fault allocates zmem's per-thread state, so
/// memcached under `zmem run` held 5–6 MiB more outside the budget after 128 MiB of data
/// (docs/DESIGN-NOTES.md, "zmem's own memory"). The program's mallocs go to mimalloc, so
/// only zmem's own allocations see this. Returns whether glibc took both settings.
pub fn tune_internal_heap() -> bool {
    // SAFETY: mallopt has no preconditions; it only changes glibc's malloc parameters.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1) == 1
            && libc::mallopt(libc::M_MMAP_THRESHOLD, INTERNAL_MMAP_THRESHOLD) == 1
    }
}

/// Undoes [`tune_internal_heap`]'s arena limit when zmem does not start and glibc's malloc
/// serves the whole program (the fixed mmap threshold stays: glibc has no way back to its
/// dynamic one, and a fixed one is what MALLOC_MMAP_THRESHOLD_ gives).
pub fn untune_internal_heap() {
    // SAFETY: as above; 0 is glibc's "as many arenas as the CPUs call for".
    unsafe { libc::mallopt(libc::M_ARENA_MAX, 0) };
}

/// glibc's own default mmap threshold, kept fixed (see [`tune_internal_heap`]).
const INTERNAL_MMAP_THRESHOLD: i32 = 128 * 1024;

/// Reads every mimalloc option once and pins it at that value, so mimalloc never reads the
/// environment again. It would otherwise, on whichever thread uses an option first: mimalloc 3
/// marks an option absent from the environment as read only once it is past "preloading", and a
/// program may have moved `environ` into its heap (redis's setproctitle and any setenv do), where
/// a zmem thread reading it would fault on memory only it can serve.
pub fn pin_options() {
    for option in 0..mi::OPTION_COUNT {
        // SAFETY: plain calls into mimalloc with a valid option number.
        unsafe { mi::mi_option_set(option, mi::mi_option_get(option)) };
    }
    // mimalloc's error messages (off by default, MIMALLOC_SHOW_ERRORS=1 shows them) stay as
    // the environment says: a program's failing malloc prints nothing, as with glibc's.
}

/// The Rust global allocator of the library: always the internal heap (glibc's malloc).
pub struct InternalAlloc;

// SAFETY: glibc's functions meet GlobalAlloc's contract for the layouts routed to them.
unsafe impl GlobalAlloc for InternalAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        alloc(layout.size(), layout.align(), false, false) as *mut u8
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        alloc(layout.size(), layout.align(), true, false) as *mut u8
    }
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        __libc_free(ptr as *mut c_void)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if natural(layout.align(), new_size) {
            __libc_realloc(ptr as *mut c_void, new_size) as *mut u8
        } else {
            let q = alloc(new_size, layout.align(), false, false) as *mut u8;
            if !q.is_null() {
                std::ptr::copy_nonoverlapping(ptr, q, layout.size().min(new_size));
                __libc_free(ptr as *mut c_void);
            }
            q
        }
    }
}

/// Ranges mimalloc committed while it set up the region's arenas: their metadata, to pin.
const MAX_PINS: usize = 256;
static PINS: [(AtomicUsize, AtomicUsize); MAX_PINS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_PINS];
static PIN_COUNT: AtomicUsize = AtomicUsize::new(0);
/// The base of the arena `mi_manage_memory` is setting up now (0: none). Its metadata is the
/// one range mimalloc commits at exactly that address.
static SETUP_BASE: AtomicUsize = AtomicUsize::new(0);

/// What mimalloc's commit callback saw: bytes decommitted (given back to zmem, which drops
/// their pages and compressed copies) and decommits refused on zmem's own threads.
pub static DECOMMITTED: AtomicU64 = AtomicU64::new(0);
pub static DECOMMIT_REFUSED: AtomicU64 = AtomicU64::new(0);

/// mimalloc asks for memory of an arena to be committed (made usable) or decommitted (its
/// contents no longer needed). The region's memory is always mapped, so a commit has nothing to
/// do; a decommit drops the pages (MADV_DONTNEED, which the region sees as a REMOVE event: it
/// forgets the pages and their compressed copies). No allocation here: mimalloc calls this
/// from inside malloc and free.
unsafe extern "C" fn commit(
    commit: bool,
    start: *mut c_void,
    size: usize,
    is_zero: *mut bool,
    _arg: *mut c_void,
) -> bool {
    // Called inside the program's malloc and free: errno stays the program's (a populate's
    // EEXIST, a failed madvise).
    let _errno = KeepErrno::new();
    if commit {
        if start as usize == SETUP_BASE.load(Acquire) {
            // An arena's metadata, committed while mi_manage_memory runs: pinned before it is
            // touched, and mapped in one go (a fault per page cost ~50 ms per process start).
            let i = PIN_COUNT.fetch_add(1, AcqRel);
            if i < MAX_PINS {
                PINS[i].0.store(start as usize, Release);
                PINS[i].1.store(size, Release);
            }
            let region = SETUP_REGION.load(Acquire);
            let region = match region.is_null() {
                false => Some(&*region),
                true => crate::runtime::runtime().map(|rt| &rt.region),
            };
            if let Some(r) = region {
                let off = start as usize - r.as_ptr() as usize;
                // Only the start of each range is used at once (the rest as the arena fills):
                // mapping all 28 MiB of each would make hundreds of page-table pages.
                as_zmem(
                    || {
                        if r.pin(off, size).is_ok() {
                            let _ = r.populate(off, size.min(POPULATE_PINNED));
                        }
                    },
                    || (),
                );
            }
        } else {
            populate(start as usize, size);
        }
        if start as usize + size > GROW_AT.load(Relaxed) {
            // The newest arena is half used: the next program allocation adds another.
            GROW_WANTED.store(true, Relaxed);
        }
        if !is_zero.is_null() {
            // Parts of the range may hold data (mimalloc may commit a partly committed range);
            // mimalloc tracks never-touched memory as zero itself.
            *is_zero = false;
        }
        return true;
    }
    // A zmem thread must not wait for its own REMOVE event: keep the memory committed (mimalloc
    // then simply reuses it) and let a program thread purge it later.
    if is_internal() {
        DECOMMIT_REFUSED.fetch_add(1, Relaxed);
        return false;
    }
    if libc::madvise(start, size, libc::MADV_DONTNEED) != 0 {
        return false;
    }
    DECOMMITTED.fetch_add(size as u64, Relaxed);
    true
}

/// Bytes of each pinned metadata range mapped (as zero pages) at start-up: what a process
/// touches first. Measured, /bin/true under zmem with 8 GiB arenas: ~1000 faults (about 50 ms)
/// mapping nothing ahead; 569 with 512 KiB; 179 with 1 MiB; 2 with 1.5 MiB (the ~80 bitmap
/// headers of an arena, 16 KiB apart, end near 1.3 MiB; 28 KiB apart and near 2.2 MiB with
/// 14 GiB arenas). pyenv's python3 shim (about 20 processes): 2.0 s -> 0.7 s with 1 MiB. The
/// zero pages cost no DRAM until written, and the region's stats count only written pinned
/// pages.
const POPULATE_PINNED: usize = 5 << 19;
/// At most this much of a commit or a new mapping is mapped ahead of the first touches (as
/// zeroed pages of the program's own, real memory at once): more fills the budget with pages
/// nobody wrote that must then be evicted (a JVM committing 400 MB at 1G: 44,520 evictions of
/// zero pages, 1.4 s instead of 0.2 s).
pub const POPULATE_MAX: usize = 256 << 10;

/// The region being handed to mimalloc (set only while `add_region` runs).
static SETUP_REGION: AtomicPtr<zmem_region::Region> = AtomicPtr::new(null_mut());

/// Where the arenas not handed to mimalloc yet start, and where the heap's span ends.
static NEXT_ARENA: AtomicUsize = AtomicUsize::new(0);
static ARENAS_END: AtomicUsize = AtomicUsize::new(0);
/// A commit reaching past this address (half of the newest arena) asks for the next arena.
static GROW_AT: AtomicUsize = AtomicUsize::new(usize::MAX);
/// Set by the commit callback (inside mimalloc, where no arena can be added); the next program
/// allocation adds the arena after mimalloc returns.
static GROW_WANTED: AtomicBool = AtomicBool::new(false);
/// Serialises adding arenas. The forking thread holds it across fork, so a child never
/// inherits a half-added arena or a lock held by a thread it does not have.
static GROWING: zmem_os::spin::SpinLock<()> = zmem_os::spin::SpinLock::new(());

/// Hands `len` bytes of `region` (mapped, zero) to mimalloc as the program heap, then forbids
/// mimalloc any other memory for it. Only the first arena is added now: setting one up costs
/// ~1 ms and ~320 KiB of DRAM (its bitmaps' headers), so the others are added as the heap
/// grows ([`grow`]). Their metadata is pinned in DRAM. Returns the 64 KiB aligned span.
///
/// # Safety
/// The region must live for the rest of the process; called once.
pub unsafe fn add_region(
    region: &zmem_region::Region,
    len: usize,
    exact_fit: bool,
) -> Result<(usize, usize), String> {
    SETUP_REGION.store(region as *const _ as *mut _, Release);
    let r = add_region_arenas(region.as_ptr() as usize, len, exact_fit);
    SETUP_REGION.store(null_mut(), Release);
    r
}

/// The length of the arena that starts at `at`: [`REGION_CHUNK`], or what is left if the
/// piece after it would be small (it joins this one).
fn arena_len(at: usize, end: usize) -> usize {
    let chunk = if at == PROGRAM_FIRST.load(Relaxed) {
        FIRST_ARENA
    } else {
        REGION_CHUNK
    };
    let n = chunk.min(end - at);
    if end - (at + n) < REGION_CHUNK / 16 {
        end - at
    } else {
        n
    }
}

/// Hands the next arena to mimalloc. Ok(false) when every arena is added already. The caller
/// holds [`GROWING`] (or is the only thread that can allocate in the program heap).
unsafe fn add_next_arena() -> Result<bool, String> {
    let (at, end) = (NEXT_ARENA.load(Acquire), ARENAS_END.load(Acquire));
    if at >= end {
        GROW_AT.store(usize::MAX, Relaxed);
        return Ok(false);
    }
    let n = arena_len(at, end);
    make_page_map_submaps(at, n);
    SETUP_BASE.store(at, Release);
    let mut id: mi::mi_arena_id_t = null_mut();
    let ok = mi::mi_manage_memory(
        at as *mut c_void,
        n,
        false, // not committed: mimalloc asks (commit) before using a range
        false, // not pinned: it may decommit (purge) what the program frees
        true,  // zero
        -1,
        false, // not exclusive: the main heap (malloc) allocates here
        Some(commit),
        null_mut(),
        &mut id,
    );
    SETUP_BASE.store(0, Release);
    if !ok {
        // Never asked again: the heap keeps the arenas it has.
        NEXT_ARENA.store(end, Release);
        GROW_AT.store(usize::MAX, Relaxed);
        return Err(format!(
            "mimalloc refused {n} bytes of the region at {at:#x} as an arena"
        ));
    }
    NEXT_ARENA.store(at + n, Release);
    let next_at = if at + n < end { at + n / 2 } else { usize::MAX };
    GROW_AT.store(next_at, Relaxed);
    Ok(true)
}

/// Makes mimalloc's page-map submaps for the arena `[at, at + len)` before mimalloc owns it, so
/// that no allocation in it ever takes `mi_page_map_lock`, which no fork hook takes: a thread
/// that took it to map a new submap while another thread forked (its `mmap` waits while fork
/// holds the address space) left it held in the child, which hung at its first allocation in a
/// new 512 MiB range (CI, tests/c/heap_grow.c; tests/c/fork_grow.c hung 4 of 30 runs with two
/// busy CPUs). Here
/// the lock is taken under [`GROWING`], which the forking thread holds. Costs one 64 KiB
/// kernel mapping and one written 4 KiB page per 512 MiB of arena (28 for a 14 GiB arena).
/// Skipped, with a debug line, under a mimalloc whose page map may differ.
fn make_page_map_submaps(at: usize, len: usize) {
    // SAFETY: reads a constant.
    let version = unsafe { mi::mi_version() };
    if version != mi::PAGE_MAP_VERSION {
        tracing::debug!(
            version,
            "mimalloc's page map is not known: its submaps come lazily"
        );
        return;
    }
    // The page map is made at mimalloc's process start, which may not have run yet when the
    // first arena is added (the signal route's region is set up before any program heap
    // allocation): without it the call below returns having made nothing.
    // SAFETY: no preconditions; idempotent.
    unsafe { mi::mi_process_init() };
    let span = mi::PAGE_MAP_SUBMAP_SPAN;
    let mut p = at;
    while p < at + len {
        // The submap's memory comes from the kernel, as in any call into mimalloc.
        // SAFETY: no arena owns [p, p + SLICE) yet; clearing its entries is a no-op but for
        // making the submap that covers it.
        inside_mimalloc(|| unsafe { mi::_mi_page_map_unregister_range(p as *mut c_void, SLICE) });
        p = (p / span + 1) * span;
    }
}

/// Before a block of a quarter of the first arena or more while the heap has only that
/// arena: the next one is added first, since the first could not hold many such blocks and a
/// failed try shows as an error under MIMALLOC_SHOW_ERRORS.
#[cold]
fn grow_before_large() {
    if NEXT_ARENA.load(Acquire) == FIRST_ARENA_END.load(Relaxed) {
        GROW_WANTED.store(true, Relaxed);
        grow(false);
    }
}

/// Adds the next arena if the heap asked for one (its newest arena is half used) or if
/// `failed` (an allocation just returned NULL). True if an arena was added. Runs on a program
/// thread after mimalloc returned, as zmem (what it allocates goes to the internal heap).
#[cold]
fn grow(failed: bool) -> bool {
    if crate::runtime::runtime().is_none() {
        return false; // still starting: the region is not published yet
    }
    // On the program's malloc path: its errno stays as it was.
    let _errno = KeepErrno::new();
    let was = set_internal(true);
    let added = {
        let _g = GROWING.lock();
        let wanted = GROW_WANTED.swap(false, Relaxed);
        if wanted || failed {
            // SAFETY: under GROWING; the region lives as long as the process.
            match unsafe { add_next_arena() } {
                Ok(added) => {
                    if added {
                        tracing::debug!(
                            arenas = PIN_COUNT.load(Relaxed),
                            next = NEXT_ARENA.load(Relaxed),
                            failed,
                            "program heap: arena added"
                        );
                    }
                    added
                }
                Err(e) => {
                    tracing::warn!("the program heap cannot grow: {e}");
                    false
                }
            }
        } else {
            false
        }
    };
    set_internal(was);
    added
}

extern "C" fn grow_fork_prepare() {
    GROWING.hold();
    MID.hold();
}

extern "C" fn grow_fork_after() {
    MID.reset();
    GROWING.reset();
}

unsafe fn add_region_arenas(
    base: usize,
    len: usize,
    exact_fit: bool,
) -> Result<(usize, usize), String> {
    let start = base.next_multiple_of(SLICE);
    let end = (base + len) / SLICE * SLICE;
    if end <= start + 2 * SLICE * 512 {
        return Err(format!("the region ({len} bytes) is too small for a heap"));
    }
    // The exact-fit span: the last eighth (its blocks fall back to mimalloc when it is full).
    let mid_start = match exact_fit {
        true => end - (end - start) / 8 / SLICE * SLICE,
        false => end,
    };
    if mid_start < end {
        // SAFETY: the span is the region's (mapped, zero, for the life of the process) and
        // nothing else uses it.
        unsafe {
            MID.lock().init(
                mid_start,
                end,
                MID_STEP,
                MID_RELEASE_MIN,
                FREED_DROP_DELAY_MS,
            )
        }
        .map_err(|e| format!("exact-fit span: {e}"))?;
    }
    PROGRAM_FIRST.store(start, Relaxed);
    NEXT_ARENA.store(start, Release);
    ARENAS_END.store(mid_start, Release);
    add_next_arena()?;
    FIRST_ARENA_END.store(NEXT_ARENA.load(Acquire), Relaxed);
    // Registered after the region's hooks, so it runs before them at a fork (prepare hooks
    // run in reverse order): an arena being added may still fault on the region's pages.
    let r = libc::pthread_atfork(
        Some(grow_fork_prepare),
        Some(grow_fork_after),
        Some(grow_fork_after),
    );
    if r != 0 {
        return Err(format!("pthread_atfork: error {r}"));
    }
    let span = (start, end - start);
    PROGRAM_START.store(start, Relaxed);
    PROGRAM_END.store(end, Relaxed);
    if mid_start < end {
        MID_END.store(end, Relaxed);
        MID_START.store(mid_start, Release);
    }
    mi::mi_option_set(mi::OPTION_DISALLOW_OS_ALLOC, 1);
    if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
        // Freed memory leaves the region soon (mimalloc waits 1 s by default): pages the
        // program freed are then dropped instead of being evicted, compressed and faulted back
        // as if they were data. Measured with 0 against 1 s (zmem run --resident 16M --size
        // 2G, tests/c/malloc_stress.c 4 3000 700 1): evictions 355,841 -> 309,660, major
        // faults 191,920 -> 172,786, peak heap data 231M -> 201M. Not at once: gcc's cc1 frees
        // and refills its 4 KB obstack chunks within milliseconds, and a purge at once cost it
        // 1,500 madvise calls (REMOVE events) and 6% of its time (session 34).
        mi::mi_option_set(mi::OPTION_PURGE_DELAY, FREED_DROP_DELAY_MS as _);
    }
    mi::mi_option_set(mi::OPTION_ARENA_MAX_OBJECT_SIZE, (REGION_CHUNK >> 10) as _);
    Ok(span)
}

/// The arena metadata ranges to pin: (address, bytes).
pub fn pins() -> Vec<(usize, usize)> {
    let n = PIN_COUNT.load(Acquire).min(MAX_PINS);
    (0..n)
        .map(|i| (PINS[i].0.load(Acquire), PINS[i].1.load(Acquire)))
        .collect()
}
