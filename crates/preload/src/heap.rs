//! Two heaps, one allocator (mimalloc 3):
//!
//! - the **program heap** is mimalloc's main heap, the one `mi_malloc` uses, confined to the
//!   zmem region: the region is handed to mimalloc as arenas ([`add_region`]) and mimalloc may
//!   not take memory of its own from the OS after that, so everything the program mallocs lives
//!   in memory that compresses itself;
//! - the **internal heap** is a mimalloc heap in an exclusive arena of plain OS memory
//!   ([`setup_internal`]), for zmem itself: this library's Rust allocations, any malloc made on
//!   a zmem thread, and every malloc while zmem starts.
//!
//! zmem's own threads must never touch region memory they might have to serve themselves, so
//! they are marked ([`mark_internal`], run by zmem_engine's thread start hook). mimalloc reads an
//! arena's bookkeeping (at the start of the memory it manages) from any thread, so those pages
//! are pinned in DRAM ([`pins`]).
//!
//! Why the region is split into arenas of [`REGION_CHUNK`]: mimalloc 3 keeps ~2 MiB of page
//! metadata per GiB at an arena's start and refuses arenas whose metadata exceeds 32 MiB, so one
//! arena cannot exceed about 15 GiB (measured: 16 GiB is refused).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

use crate::mi;

thread_local! {
    /// True on zmem's threads and on a thread while it starts zmem.
    static INTERNAL: Cell<bool> = const { Cell::new(false) };
}

/// Marks the calling thread as zmem's own: its mallocs use the internal heap from now on.
pub fn mark_internal() {
    INTERNAL.with(|c| c.set(true));
}

pub fn set_internal(on: bool) -> bool {
    INTERNAL.with(|c| c.replace(on))
}

pub fn is_internal() -> bool {
    INTERNAL.with(|c| c.get())
}

/// Virtual size of the internal heap's arena: committed only as used. zmem's per-page tables
/// take about 30 bytes per 4 KiB page of the region, so this serves regions up to ~1 TiB.
pub const INTERNAL_RESERVE: usize = 8 << 30;
/// Arena size the region is cut into.
pub const REGION_CHUNK: usize = 8 << 30;
/// mimalloc arenas start on 64 KiB boundaries.
pub const SLICE: usize = 64 << 10;

static INTERNAL_HEAP: AtomicPtr<mi::mi_heap_t> = AtomicPtr::new(null_mut());

/// Creates the internal heap. Called first thing when zmem starts, before anything else
/// allocates, so nothing of zmem's ends up in mimalloc's main heap.
pub fn setup_internal() -> Result<(), String> {
    let mut id: mi::mi_arena_id_t = null_mut();
    // SAFETY: plain calls into mimalloc.
    unsafe {
        // mimalloc reads each option from the environment the first time it is used. A program
        // may have moved its environment into the heap (redis's setproctitle does), where a
        // zmem thread reading it later (mimalloc purging inside an internal allocation) would
        // fault on memory only it can serve: a deadlock, found by `zmem demo redis`. So every
        // option is read now, before the program runs.
        for option in 0..mi::OPTION_COUNT {
            mi::mi_option_get(option);
        }
        mi::mi_option_set(mi::OPTION_SHOW_ERRORS, 1);
        let err = mi::mi_reserve_os_memory_ex(INTERNAL_RESERVE, false, false, true, &mut id);
        if err != 0 || id.is_null() {
            return Err(format!(
                "cannot reserve {} GiB of address space for zmem's own heap (error {err})",
                INTERNAL_RESERVE >> 30
            ));
        }
        let h = mi::mi_heap_new_in_arena(id);
        if h.is_null() {
            return Err("mimalloc could not make zmem's own heap".into());
        }
        INTERNAL_HEAP.store(h, Release);
    }
    Ok(())
}

fn internal_heap() -> *mut mi::mi_heap_t {
    INTERNAL_HEAP.load(Acquire)
}

// mimalloc's blocks are aligned to 16 bytes from 16 bytes up, to 8 below.
fn natural(align: usize, size: usize) -> bool {
    align <= 8 || (align <= 16 && size >= 16)
}

/// Allocation on the internal heap (mimalloc's main heap before it exists).
pub unsafe fn internal_alloc(size: usize, align: usize, zero: bool) -> *mut c_void {
    let h = internal_heap();
    match (h.is_null(), natural(align, size), zero) {
        (false, true, false) => mi::mi_heap_malloc(h, size),
        (false, true, true) => mi::mi_heap_zalloc(h, size),
        (false, false, false) => mi::mi_heap_malloc_aligned(h, size, align),
        (false, false, true) => mi::mi_heap_zalloc_aligned(h, size, align),
        (true, true, false) => mi::mi_malloc(size),
        (true, true, true) => mi::mi_zalloc(size),
        (true, false, false) => mi::mi_malloc_aligned(size, align),
        (true, false, true) => mi::mi_zalloc_aligned(size, align),
    }
}

pub unsafe fn internal_realloc(p: *mut c_void, size: usize, align: usize) -> *mut c_void {
    let h = internal_heap();
    match (h.is_null(), natural(align, size)) {
        (false, true) => mi::mi_heap_realloc(h, p, size),
        (false, false) => mi::mi_heap_realloc_aligned(h, p, size, align),
        (true, true) => mi::mi_realloc(p, size),
        (true, false) => mi::mi_realloc_aligned(p, size, align),
    }
}

/// The Rust global allocator of the library: always the internal heap.
pub struct InternalAlloc;

// SAFETY: mimalloc's functions meet GlobalAlloc's contract for the layouts routed to them.
unsafe impl GlobalAlloc for InternalAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        internal_alloc(layout.size(), layout.align(), false) as *mut u8
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        internal_alloc(layout.size(), layout.align(), true) as *mut u8
    }
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi::mi_free(ptr as *mut c_void)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        internal_realloc(ptr as *mut c_void, new_size, layout.align()) as *mut u8
    }
}

/// Ranges mimalloc committed while it set up the region's arenas: their metadata, to pin.
const MAX_PINS: usize = 256;
static PINS: [(AtomicUsize, AtomicUsize); MAX_PINS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_PINS];
static PIN_COUNT: AtomicUsize = AtomicUsize::new(0);
static SETTING_UP: AtomicBool = AtomicBool::new(false);

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
    if commit {
        if SETTING_UP.load(Acquire) {
            // An arena's metadata, committed while mi_manage_memory runs.
            let i = PIN_COUNT.fetch_add(1, AcqRel);
            if i < MAX_PINS {
                PINS[i].0.store(start as usize, Release);
                PINS[i].1.store(size, Release);
            }
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

/// Hands `[base, base + len)` (mapped, zero) to mimalloc as the program heap's arenas, then
/// forbids mimalloc any other memory for it. Returns the 64 KiB aligned span used.
///
/// # Safety
/// The range must be a live mapping owned by the caller for the rest of the process; called
/// once.
pub unsafe fn add_region(base: usize, len: usize) -> Result<(usize, usize), String> {
    let start = base.next_multiple_of(SLICE);
    let end = (base + len) / SLICE * SLICE;
    if end <= start + 2 * SLICE * 512 {
        return Err(format!("the region ({len} bytes) is too small for a heap"));
    }
    SETTING_UP.store(true, Release);
    let mut at = start;
    let mut result = Ok((start, end - start));
    while at < end {
        // The last piece joins the one before if it would be small.
        let mut n = REGION_CHUNK.min(end - at);
        if end - (at + n) < REGION_CHUNK / 8 {
            n = end - at;
        }
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
        if !ok {
            result = Err(format!(
                "mimalloc refused {n} bytes of the region at {at:#x} as an arena"
            ));
            break;
        }
        at += n;
    }
    SETTING_UP.store(false, Release);
    let span = result?;
    mi::mi_option_set(mi::OPTION_DISALLOW_OS_ALLOC, 1);
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
