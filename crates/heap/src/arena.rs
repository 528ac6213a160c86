//! One mimalloc arena over a piece of the heap's region, and the commit callback through which
//! mimalloc tells us what it uses and what it gives back.
//!
//! mimalloc 3.3 cannot forget an arena (`mi_arena_unload` is compiled out): once handed over,
//! the arena's header is read by every later arena search and purge in the process, and a
//! thread that last allocated from the heap keeps a cached pointer to its per-thread heap
//! structure (`mi_theap_t`), which lives in the arena's data. So:
//!
//! - the arena's metadata (its header, bitmaps and page descriptors, ~2 MiB per GiB at its
//!   start) is plain anonymous memory from the start: the commit callback replaces the region's
//!   pages there (MAP_FIXED) when mimalloc commits them during `mi_manage_memory`. It never
//!   faults, is never compressed, and survives the region;
//! - when the heap is destroyed, the arena's data range is replaced by plain zero memory
//!   (MAP_FIXED, MAP_NORESERVE, never touched: address space only) before the region goes: a
//!   stale cached `mi_theap_t` then reads as zeros, which mimalloc takes as "no heap, nothing to
//!   free", instead of faulting on unmapped memory;
//! - the callback's context ([`ArenaCtl`]) is leaked: mimalloc may call it at any time later.
//!   After the heap is gone it does nothing.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, AtomicU64, AtomicUsize, Ordering::*};

use zmem_os::Errno;
use zmem_region::Region;

/// Bytes of a commit mapped ahead as zero pages: the first touches of memory mimalloc is about
/// to use become the kernel's cheap faults instead of a round trip through a handler each
/// (the preload library's figure: more fills the budget with zero pages that must be evicted).
const POPULATE_MAX: usize = 256 << 10;

/// What the commit callback of one arena needs. Leaked: mimalloc keeps the pointer forever.
pub(crate) struct ArenaCtl {
    /// The heap is alive: its region may be touched.
    alive: AtomicBool,
    /// Callbacks running now (the heap waits for them before its region goes).
    inflight: AtomicUsize,
    /// `mi_manage_memory` is running: a commit is the arena's metadata.
    setting_up: AtomicBool,
    region: AtomicPtr<Region>,
    /// The metadata range made plain memory, and the error if that failed.
    meta_start: AtomicUsize,
    meta_len: AtomicUsize,
    meta_errno: AtomicI32,
    /// Bytes mimalloc gave back (dropped from the region with their compressed copies).
    pub decommitted: AtomicU64,
}

/// A callback in progress on a live heap (see [`ArenaCtl::retire`]).
struct Entered<'a>(&'a ArenaCtl);

impl Drop for Entered<'_> {
    fn drop(&mut self) {
        self.0.inflight.fetch_sub(1, SeqCst);
    }
}

impl ArenaCtl {
    pub fn leak(region: &Region) -> &'static ArenaCtl {
        Box::leak(Box::new(ArenaCtl {
            alive: AtomicBool::new(true),
            inflight: AtomicUsize::new(0),
            setting_up: AtomicBool::new(false),
            region: AtomicPtr::new(region as *const Region as *mut Region),
            meta_start: AtomicUsize::new(0),
            meta_len: AtomicUsize::new(0),
            meta_errno: AtomicI32::new(0),
            decommitted: AtomicU64::new(0),
        }))
    }

    fn enter(&self) -> Option<Entered<'_>> {
        // SeqCst on both sides: either retire() sees this increment, or this sees alive=false.
        self.inflight.fetch_add(1, SeqCst);
        let e = Entered(self);
        self.alive.load(SeqCst).then_some(e)
    }

    /// From now on the callback touches nothing; waits for those still running.
    pub fn retire(&self) {
        self.alive.store(false, SeqCst);
        while self.inflight.load(SeqCst) != 0 {
            std::thread::yield_now();
        }
        self.region.store(null_mut(), SeqCst);
    }

    pub fn set_setting_up(&self, on: bool) {
        self.setting_up.store(on, SeqCst);
    }

    /// The metadata range made plain memory: (address, bytes), (0, 0) if none.
    pub fn meta(&self) -> (usize, usize) {
        (self.meta_start.load(Acquire), self.meta_len.load(Acquire))
    }

    /// Why the metadata could not be made plain memory, if it could not.
    pub fn meta_error(&self) -> Option<Errno> {
        match self.meta_errno.load(Acquire) {
            0 => None,
            e => Some(Errno(e)),
        }
    }

    fn region(&self) -> &Region {
        // SAFETY: only called between enter() and the guard's drop on a live heap, whose region
        // outlives every such call (the heap retires its arenas before dropping the region).
        unsafe { &*self.region.load(SeqCst) }
    }
}

/// mimalloc's commit callback for the heap's arenas. No allocation and no lock that the
/// program could hold: it runs inside mimalloc's malloc and free, on the program's threads
/// (zmem's own threads never call into mimalloc).
pub(crate) unsafe extern "C" fn commit(
    commit: bool,
    start: *mut c_void,
    size: usize,
    is_zero: *mut bool,
    arg: *mut c_void,
) -> bool {
    // SAFETY: arg is the leaked ArenaCtl this arena was created with.
    let ctl = unsafe { &*(arg as *const ArenaCtl) };
    if commit && ctl.setting_up.load(SeqCst) {
        return plain_meta(ctl, start as usize, size);
    }
    let Some(_entered) = ctl.enter() else {
        // The heap is gone: nothing of this arena is used again, and its range must not be
        // touched. Saying "decommitted" keeps mimalloc from retrying.
        return true;
    };
    let region = ctl.region();
    let off = (start as usize).wrapping_sub(region.as_ptr() as usize);
    if commit {
        if off < region.len() {
            let _ = region.populate(off, size.min(region.len() - off).min(POPULATE_MAX));
        }
        if !is_zero.is_null() {
            // Part of the range may hold data (mimalloc may commit a partly committed range);
            // mimalloc tracks never-touched memory as zero itself.
            // SAFETY: mimalloc passes a valid pointer or NULL.
            unsafe { *is_zero = false };
        }
        return true;
    }
    // Decommit: the blocks there are free. Zap the pages (the region sees a REMOVE event) and
    // drop their compressed copies now, on this thread, so that mimalloc can hand the range
    // out again at once without a fault finding an old copy.
    // SAFETY: the range is part of this arena, inside the live region.
    if unsafe { libc::madvise(start, size, libc::MADV_DONTNEED) } != 0 {
        return false;
    }
    if off < region.len() {
        let _ = region.discard(off, size.min(region.len() - off));
    }
    ctl.decommitted.fetch_add(size as u64, Relaxed);
    true
}

/// The arena's metadata (the first commit, while `mi_manage_memory` runs) becomes plain
/// anonymous memory in place of the region's pages: see the module's comment.
fn plain_meta(ctl: &ArenaCtl, start: usize, size: usize) -> bool {
    // SAFETY: the range is the start of this arena, inside the region the heap owns and nobody
    // uses yet; MAP_FIXED replaces it atomically (the region sees an UNMAP event and leaves
    // the range alone from then on, its destroy included).
    let p = unsafe {
        libc::mmap(
            start as *mut c_void,
            size,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        ctl.meta_errno.store(Errno::last().code(), Release);
        return false;
    }
    ctl.meta_start.store(start, Release);
    ctl.meta_len.store(size, Release);
    true
}

/// Replaces `[start, end)` with plain zero memory that is never unmapped (address space only):
/// what a destroyed arena's data range becomes.
pub(crate) fn leave_zeros(start: usize, end: usize) -> Result<(), Errno> {
    if start >= end {
        return Ok(());
    }
    // SAFETY: the range is this heap's, no block in it is live any more; MAP_FIXED replaces it
    // atomically, so no thread ever finds it unmapped.
    let p = unsafe {
        libc::mmap(
            start as *mut c_void,
            end - start,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(Errno::last());
    }
    Ok(())
}

/// Bytes of `[start, start + len)` resident in DRAM (mincore), 0 on error.
pub(crate) fn resident_bytes(start: usize, len: usize) -> u64 {
    let page = zmem_os::PAGE_SIZE;
    if len == 0 || start % page != 0 {
        return 0;
    }
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: the range is mapped (plain memory the heap keeps), vec has one byte per page.
    let rc = unsafe { libc::mincore(start as *mut c_void, len, vec.as_mut_ptr()) };
    if rc != 0 {
        return 0;
    }
    vec.iter().filter(|&&b| b & 1 != 0).count() as u64 * page as u64
}
