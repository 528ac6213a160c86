//! Two heaps, one allocator (mimalloc 3):
//!
//! - the **program heap**: a mimalloc heap confined to an exclusive arena over the zmem region,
//!   so everything the program mallocs lives in memory that compresses itself;
//! - the **internal heap**: mimalloc's ordinary heap on plain OS memory, for zmem itself (the
//!   Rust global allocator of this library, and any malloc made on a zmem thread).
//!
//! zmem's own threads must never touch region memory they might have to serve themselves, so
//! they are marked ([`mark_internal`], run by zmem_engine's thread start hook) and their
//! mallocs go to the internal heap. The arena's own bookkeeping sits at the start of the memory
//! it manages and mimalloc reads it from every thread; those pages are pinned in DRAM
//! ([`Arena::pins`]).

use std::alloc::{GlobalAlloc, Layout};
use std::cell::Cell;
use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::*};

use crate::mi;

thread_local! {
    /// True on zmem's threads and on a thread while it initialises zmem.
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

/// The Rust global allocator of the library: always the internal heap.
pub struct InternalAlloc;

// mimalloc's blocks are aligned to 16 bytes from 16 bytes up, to 8 below.
fn natural(layout: &Layout) -> bool {
    layout.align() <= 8 || (layout.align() <= 16 && layout.size() >= 16)
}

// SAFETY: mimalloc's functions meet GlobalAlloc's contract for the layouts routed to them.
unsafe impl GlobalAlloc for InternalAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if natural(&layout) {
            mi::mi_malloc(layout.size()) as *mut u8
        } else {
            mi::mi_malloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if natural(&layout) {
            mi::mi_zalloc(layout.size()) as *mut u8
        } else {
            mi::mi_zalloc_aligned(layout.size(), layout.align()) as *mut u8
        }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        mi::mi_free(ptr as *mut c_void)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let l = Layout::from_size_align_unchecked(new_size, layout.align());
        if natural(&l) {
            mi::mi_realloc(ptr as *mut c_void, new_size) as *mut u8
        } else {
            mi::mi_realloc_aligned(ptr as *mut c_void, new_size, layout.align()) as *mut u8
        }
    }
}

/// Ranges mimalloc committed while it set up the arena: its metadata, to be pinned.
const MAX_PINS: usize = 64;
static PINS: [(AtomicUsize, AtomicUsize); MAX_PINS] =
    [const { (AtomicUsize::new(0), AtomicUsize::new(0)) }; MAX_PINS];
static PIN_COUNT: AtomicUsize = AtomicUsize::new(0);
static SETTING_UP: AtomicBool = AtomicBool::new(false);

/// What mimalloc's commit callback saw: bytes decommitted (given back to zmem, which drops
/// their pages and compressed copies) and calls refused on zmem's own threads.
pub static DECOMMITTED: AtomicU64 = AtomicU64::new(0);
pub static DECOMMIT_REFUSED: AtomicU64 = AtomicU64::new(0);

/// mimalloc asks for memory of the arena to be committed (made usable) or decommitted (its
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
            // The arena's metadata, committed while mi_manage_memory runs.
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

/// The program heap's arena.
pub struct Arena {
    pub heap: *mut mi::mi_heap_t,
    pub id: mi::mi_arena_id_t,
}

impl Arena {
    /// Hands `[base, base + len)` (mapped, zero, 64 KiB aligned) to mimalloc as an exclusive
    /// arena and makes a heap in it. One per process.
    ///
    /// # Safety
    /// The range must be a live mapping owned by the caller for the rest of the process.
    pub unsafe fn new(base: *mut u8, len: usize) -> Result<Arena, String> {
        mi::mi_option_set(mi::OPTION_SHOW_ERRORS, 1);
        let mut id: mi::mi_arena_id_t = null_mut();
        SETTING_UP.store(true, Release);
        let ok = mi::mi_manage_memory(
            base as *mut c_void,
            len,
            false, // not committed: mimalloc asks (commit) before using a range
            false, // not pinned: it may decommit (purge) what the program frees
            true,  // zero
            -1,
            true, // exclusive: only the program heap allocates here
            Some(commit),
            null_mut(),
            &mut id,
        );
        SETTING_UP.store(false, Release);
        if !ok || id.is_null() {
            return Err(format!(
                "mimalloc refused the region ({len} bytes at {base:p}) as an arena"
            ));
        }
        let heap = mi::mi_heap_new_in_arena(id);
        if heap.is_null() {
            return Err("mimalloc could not make a heap in the region's arena".into());
        }
        Ok(Arena { heap, id })
    }

    /// The arena metadata ranges to pin: (address, bytes).
    pub fn pins() -> Vec<(usize, usize)> {
        let n = PIN_COUNT.load(Acquire).min(MAX_PINS);
        (0..n)
            .map(|i| (PINS[i].0.load(Acquire), PINS[i].1.load(Acquire)))
            .collect()
    }
}
