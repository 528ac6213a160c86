//! A heap in tiered memory: HMM_alloc's `nv_malloc` for zmem. A [`Heap`] is a zmem
//! [`Region`] (budget, compression policy, store limit, SSD tier) managed by mimalloc 3 as
//! exclusive arenas, so that a program puts the data it chooses in memory that compresses
//! itself, without LD_PRELOAD: `malloc`, `calloc`, `realloc`, `free`, `usable_size`, `stats`.
//! The same allocator as `zmem run` (mimalloc 3 over a region), but a heap of its own, next to
//! the program's ordinary malloc.
//!
//! **Threads.** mimalloc 3 heaps are first-class: any thread may allocate from a heap and free
//! any of its blocks (checked by the tests `blocks_move_between_threads` and
//! `threads_allocate_and_free_across_threads`). Internally each thread that allocates gets its
//! own per-thread heap (`mi_theap_t`, 8 KiB in a 64 KiB slice of the arena); a block freed by
//! another thread goes on its page's atomic cross-thread free list and is reclaimed by the owner
//! (or by whoever takes the page over when the owner exits). So one `Heap` is `Send + Sync`
//! with no lock of its own.
//!
//! **zmem's threads never run mimalloc.** The region's handler and evictor allocate with the
//! process's ordinary allocator; mimalloc runs only on the threads that call the heap. A
//! process whose global allocator is this same mimalloc (the `mimalloc` crate) is refused
//! ([`HeapError::SharedAllocator`]): there, zmem's threads would run mimalloc code that purges
//! every arena, this heap's included, and could wait for a fault only they can serve.
//!
//! **Size.** mimalloc arenas are whole multiples of 32 MiB, and one arena cannot exceed about
//! 15 GiB (its metadata must stay under 32 MiB), so the region is cut into arenas of 8 GiB
//! ([`ARENA_CHUNK`]), each with a mimalloc heap of its own; an allocation tries them in turn.
//! A single block cannot be larger than one arena.
//!
//! **Metadata.** An arena's bookkeeping (header, bitmaps, one 136-byte page descriptor per
//! 64 KiB) sits at its start and is touched by every allocation and free. It is kept as plain
//! memory, outside the region, for a lifetime reason (below), which also gives it what
//! `Region::pin` gives the preload library's arenas: it never faults and does not count
//! against the budget. Measured (examples/objects.rs, 64 MiB of small objects, 16 MiB budget,
//! random free+malloc): 164 KiB of it resident; left in the region unpinned it added 0.3% to
//! the faults (1.205 against 1.201 per operation; pinned: 1.202), so pinning would not be
//! needed for speed: it is touched often enough to stay resident. Each thread that allocates
//! also takes a 64 KiB slice of the arena for its per-thread heap while it lives.
//!
//! **Limits of mimalloc 3.3** (see the `arena` module): an arena can never be removed, so a
//! destroyed heap leaves its address range behind (plain zero memory, never touched: address
//! space, not DRAM) plus 64 KiB of arena header per arena, and a process can create at most
//! about 150 arenas in its lifetime (mimalloc's table has 160 slots). A pointer given to
//! `free`, `realloc` or `usable_size` is checked against the heap's arenas, their metadata and
//! mimalloc's page map ([`HeapError::Foreign`]); a block freed twice or a pointer into the
//! middle of a block (8-byte aligned) cannot be told from a live block and is undefined
//! behaviour, as with `free`.

mod arena;
pub mod mi;

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::*};
use std::sync::Once;

pub use zmem_region::{Budget, Region, RegionConfig, RegionError, RegionStats};

use arena::ArenaCtl;
pub use zmem_os::Errno;

/// Arena size the region is cut into (mimalloc refuses arenas of 16 GiB and more).
pub const ARENA_CHUNK: usize = 8 << 30;
/// mimalloc arenas are whole multiples of this (`MI_ARENA_MIN_SIZE`), which is also the
/// smallest heap.
pub const ARENA_UNIT: usize = 32 << 20;
/// mimalloc arenas start on this boundary (`MI_ARENA_SLICE_SIZE`).
pub const ARENA_ALIGN: usize = 64 << 10;
/// mimalloc's table of arenas (`MI_MAX_ARENAS`); slots are never freed.
pub const MIMALLOC_MAX_ARENAS: usize = 160;
/// The smallest heap: one arena.
pub const MIN_HEAP_SIZE: u64 = ARENA_UNIT as u64;
/// Bytes of a destroyed arena's metadata kept (its header and first bitmaps, which mimalloc
/// reads forever); the rest is given back.
const META_KEEP: usize = 64 << 10;

/// Errors of a heap.
#[derive(thiserror::Error, Debug)]
pub enum HeapError {
    #[error("heap region: {0}")]
    Region(#[from] RegionError),
    #[error("invalid heap configuration: {0}")]
    Config(String),
    #[error(
        "this process allocates with the mimalloc the heap is built on (the `mimalloc` crate as \
         global allocator?): zmem's own threads would then run mimalloc code that walks the \
         heap's memory and can wait for a fault only they serve; use the system allocator"
    )]
    SharedAllocator,
    #[error(
        "mimalloc refused {size} bytes at {at:#x} as an arena: a process holds at most \
         {MIMALLOC_MAX_ARENAS} arenas and mimalloc 3 never removes one (heaps have taken \
         {taken} so far, one per {} GiB)",
        ARENA_CHUNK >> 30
    )]
    Arena {
        at: usize,
        size: usize,
        taken: usize,
    },
    #[error("{op} failed: {errno}")]
    Os { op: &'static str, errno: Errno },
    #[error("out of memory: {size} bytes do not fit in the heap ({capacity} bytes)")]
    OutOfMemory { size: usize, capacity: u64 },
    #[error("calloc of {count} x {size} bytes overflows")]
    Overflow { count: usize, size: usize },
    #[error("{addr:#x} is not a block of this heap")]
    Foreign { addr: usize },
}

/// Statistics of a heap.
#[derive(Clone, Debug)]
pub struct HeapStats {
    /// The region under the heap (resident, faults, evictions, compressed and SSD tiers).
    pub region: RegionStats,
    /// Usable bytes of the live blocks (what `usable_size` says of each, summed).
    pub allocated: u64,
    /// Blocks allocated and not freed.
    pub live_blocks: u64,
    /// Bytes handed to mimalloc as arenas (metadata included).
    pub capacity: u64,
    /// Arenas (one mimalloc heap each).
    pub arenas: usize,
    /// Bytes of arena metadata, kept as plain memory outside the region (address space).
    pub metadata: u64,
    /// Of which resident in DRAM now.
    pub metadata_resident: u64,
    /// Bytes mimalloc gave back (free pages dropped with their compressed copies).
    pub decommitted: u64,
}

/// One arena: a piece of the region, its mimalloc heap and the callback's context.
struct Arena {
    start: usize,
    end: usize,
    heap: *mut mi::mi_heap_t,
    ctl: &'static ArenaCtl,
    /// mimalloc accepted it (it is in mimalloc's table for good).
    registered: bool,
}

impl Arena {
    /// Where blocks can be: after the metadata.
    fn data_start(&self) -> usize {
        let (m, len) = self.ctl.meta();
        if m == self.start {
            m + len
        } else {
            self.start
        }
    }
}

/// A heap whose memory tiers itself. See the crate's documentation.
pub struct Heap {
    arenas: Vec<Arena>,
    /// The arena to try first (the last one that had room).
    next: AtomicUsize,
    /// [first arena's start, last arena's end).
    span: (usize, usize),
    allocated: AtomicU64,
    live: AtomicU64,
    /// Last field: dropped after `Drop::drop` has retired the arenas.
    region: Box<Region>,
}

// SAFETY: mimalloc 3 heaps may be used and freed into from any thread (first-class heaps with
// per-thread state inside); the rest is atomics and the region, which is Send + Sync.
unsafe impl Send for Heap {}
// SAFETY: as above.
unsafe impl Sync for Heap {}

/// Arenas heaps of this process have taken from mimalloc's table.
static ARENAS_TAKEN: AtomicUsize = AtomicUsize::new(0);

/// Process-wide mimalloc settings, once: freed memory leaves the region at once (mimalloc waits
/// 100 ms by default; a page freed is better dropped than evicted, compressed and faulted back
/// as data: the preload library measured 13% fewer evictions), unless MIMALLOC_PURGE_DELAY
/// says otherwise; and blocks up to an arena's size stay in the arena (larger ones would go
/// to the OS, which a heap bound to an arena refuses).
fn configure_mimalloc() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: plain calls into mimalloc with valid option numbers.
        unsafe {
            if std::env::var_os("MIMALLOC_PURGE_DELAY").is_none() {
                mi::mi_option_set(mi::OPTION_PURGE_DELAY, 0);
            }
            let kib = (ARENA_CHUNK >> 10) as std::ffi::c_long;
            if mi::mi_option_get(mi::OPTION_ARENA_MAX_OBJECT_SIZE) < kib {
                mi::mi_option_set(mi::OPTION_ARENA_MAX_OBJECT_SIZE, kib);
            }
        }
    });
}

/// Whether the process's own allocations come from this mimalloc.
fn global_allocator_is_mimalloc() -> bool {
    let probe = Box::new(0u64);
    // SAFETY: a query on a live pointer; mimalloc only looks it up in its page map.
    unsafe { mi::mi_is_in_heap_region((&*probe as *const u64).cast()) }
}

/// The pieces `[start, end)` is cut into: [`ARENA_CHUNK`] each, a last piece under 1 GiB joined
/// to the one before (both stay whole multiples of [`ARENA_UNIT`]).
fn pieces(start: usize, end: usize) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut at = start;
    while at < end {
        let mut n = ARENA_CHUNK.min(end - at);
        if end - (at + n) < ARENA_CHUNK / 8 {
            n = end - at;
        }
        out.push((at, at + n));
        at += n;
    }
    out
}

impl Heap {
    /// A heap of `cfg.size` bytes (rounded up to 32 MiB; the arenas' metadata, about 0.2%,
    /// comes out of it) over a new region with `cfg`'s budget, policy, store limit and SSD
    /// tier.
    pub fn new(cfg: RegionConfig) -> Result<Heap, HeapError> {
        if cfg.size < MIN_HEAP_SIZE {
            return Err(HeapError::Config(format!(
                "size {} is below the smallest heap, {MIN_HEAP_SIZE} bytes (one mimalloc arena)",
                cfg.size
            )));
        }
        let total = usize::try_from(cfg.size)
            .ok()
            .and_then(|s| s.checked_next_multiple_of(ARENA_UNIT))
            .filter(|&t| t <= isize::MAX as usize / 2)
            .ok_or_else(|| {
                HeapError::Config(format!("size {} is larger than an address space", cfg.size))
            })?;
        if total.div_ceil(ARENA_CHUNK) > MIMALLOC_MAX_ARENAS - 8 {
            return Err(HeapError::Config(format!(
                "size {} needs more than {} arenas of {} GiB",
                cfg.size,
                MIMALLOC_MAX_ARENAS - 8,
                ARENA_CHUNK >> 30
            )));
        }
        mi::process_start();
        if global_allocator_is_mimalloc() {
            return Err(HeapError::SharedAllocator);
        }
        configure_mimalloc();
        let mut cfg = cfg;
        // Room to start the first arena on its 64 KiB boundary.
        cfg.size = (total + ARENA_ALIGN) as u64;
        let region = Box::new(Region::new(cfg)?);
        let start = (region.as_ptr() as usize).next_multiple_of(ARENA_ALIGN);
        let mut heap = Heap {
            arenas: Vec::new(),
            next: AtomicUsize::new(0),
            span: (start, start + total),
            allocated: AtomicU64::new(0),
            live: AtomicU64::new(0),
            region,
        };
        for (a, b) in pieces(start, start + total) {
            heap.add_arena(a, b)?;
        }
        Ok(heap)
    }

    /// Hands `[start, end)` to mimalloc as an exclusive arena with a heap of its own. On error
    /// what was made is in `self.arenas`, for `Drop` to undo.
    fn add_arena(&mut self, start: usize, end: usize) -> Result<(), HeapError> {
        let ctl = ArenaCtl::leak(&self.region);
        self.arenas.push(Arena {
            start,
            end,
            heap: std::ptr::null_mut(),
            ctl,
            registered: false,
        });
        let mut id: mi::mi_arena_id_t = std::ptr::null_mut();
        ctl.set_setting_up(true);
        // SAFETY: [start, end) is 64 KiB aligned, a multiple of 32 MiB, inside our region and
        // used by nothing else; ctl lives forever.
        let ok = unsafe {
            mi::mi_manage_memory(
                start as *mut c_void,
                end - start,
                false, // not committed: mimalloc asks before it uses a range
                false, // not pinned: it may give back (purge) what is freed
                true,  // zero
                -1,
                true, // exclusive: only this arena's heap allocates here
                Some(arena::commit),
                ctl as *const ArenaCtl as *mut c_void,
                &mut id,
            )
        };
        ctl.set_setting_up(false);
        if !ok || id.is_null() {
            if let Some(errno) = ctl.meta_error() {
                return Err(HeapError::Os {
                    op: "mmap of the arena's metadata",
                    errno,
                });
            }
            return Err(HeapError::Arena {
                at: start,
                size: end - start,
                taken: ARENAS_TAKEN.load(Relaxed),
            });
        }
        ARENAS_TAKEN.fetch_add(1, Relaxed);
        let last = self.arenas.len() - 1;
        self.arenas[last].registered = true;
        // SAFETY: id is the arena just created.
        let heap = unsafe { mi::mi_heap_new_in_arena(id) };
        if heap.is_null() {
            return Err(HeapError::Os {
                op: "mi_heap_new_in_arena",
                errno: Errno::last(),
            });
        }
        self.arenas[last].heap = heap;
        Ok(())
    }

    /// The region under the heap (its budget can be changed there).
    pub fn region(&self) -> &Region {
        &self.region
    }

    /// Bytes handed to mimalloc as arenas.
    pub fn capacity(&self) -> u64 {
        (self.span.1 - self.span.0) as u64
    }

    /// Whether `p` is inside one of the heap's arenas (not necessarily a live block).
    pub fn contains(&self, p: *const u8) -> bool {
        let a = p as usize;
        a >= self.span.0 && a < self.span.1
    }

    fn oom(&self, size: usize) -> HeapError {
        HeapError::OutOfMemory {
            size,
            capacity: self.capacity(),
        }
    }

    /// Tries each arena's heap in turn, starting with the last that had room.
    fn alloc_with(
        &self,
        size: usize,
        f: impl Fn(*mut mi::mi_heap_t) -> *mut c_void,
    ) -> Result<NonNull<u8>, HeapError> {
        if size > ARENA_CHUNK * 2 {
            return Err(self.oom(size));
        }
        let n = self.arenas.len();
        let first = self.next.load(Relaxed) % n;
        for k in 0..n {
            let i = (first + k) % n;
            if let Some(p) = NonNull::new(f(self.arenas[i].heap).cast::<u8>()) {
                if k > 0 {
                    self.next.store(i, Relaxed);
                }
                // SAFETY: p is a live block of ours.
                let usable = unsafe { mi::mi_usable_size(p.as_ptr().cast()) };
                self.allocated.fetch_add(usable as u64, Relaxed);
                self.live.fetch_add(1, Relaxed);
                return Ok(p);
            }
        }
        Err(self.oom(size))
    }

    /// A block of at least `size` bytes (uninitialised; `size` 0 gives a unique block), aligned
    /// to 16 bytes from 16 bytes up (8 below).
    pub fn malloc(&self, size: usize) -> Result<NonNull<u8>, HeapError> {
        // SAFETY: h is one of our live mimalloc heaps.
        self.alloc_with(size, |h| unsafe { mi::mi_heap_malloc(h, size) })
    }

    /// A zeroed block for `count` elements of `size` bytes.
    pub fn calloc(&self, count: usize, size: usize) -> Result<NonNull<u8>, HeapError> {
        let total = count
            .checked_mul(size)
            .ok_or(HeapError::Overflow { count, size })?;
        // SAFETY: h is one of our live mimalloc heaps.
        self.alloc_with(total, |h| unsafe { mi::mi_heap_zalloc(h, total) })
    }

    /// The arena holding the live block `p`, or the error for a pointer that is not one: outside
    /// the arenas, in their metadata, misaligned, or not in a page of this heap.
    fn owner(&self, p: *const u8) -> Result<&Arena, HeapError> {
        let a = p as usize;
        let foreign = HeapError::Foreign { addr: a };
        if !self.contains(p) || a % 8 != 0 {
            return Err(foreign);
        }
        let arena = self
            .arenas
            .iter()
            .find(|x| a >= x.start && a < x.end)
            .ok_or(HeapError::Foreign { addr: a })?;
        if a < arena.data_start() {
            return Err(foreign);
        }
        // SAFETY: a query: mimalloc looks the address up in its page map (NULL where no page
        // of any heap is).
        if unsafe { mi::mi_heap_of(p.cast()) } != arena.heap {
            return Err(foreign);
        }
        Ok(arena)
    }

    /// Frees a block. NULL is a no-op; a pointer that is not in a page of this heap is refused
    /// with [`HeapError::Foreign`] and left alone.
    ///
    /// # Safety
    /// `p` is NULL, a live block of this heap, or any pointer outside it. A block freed twice,
    /// or a pointer into the middle of a block, is undefined behaviour (as with `free`).
    pub unsafe fn free(&self, p: *mut u8) -> Result<(), HeapError> {
        if p.is_null() {
            return Ok(());
        }
        self.owner(p)?;
        // SAFETY: p is a block of this heap (caller's contract for what owner() cannot check).
        unsafe {
            let usable = mi::mi_usable_size(p.cast());
            self.allocated.fetch_sub(usable as u64, Relaxed);
            self.live.fetch_sub(1, Relaxed);
            mi::mi_free(p.cast());
        }
        Ok(())
    }

    /// Resizes a block, moving it if needed (contents kept up to the smaller size). NULL
    /// allocates; `size` 0 gives a minimal block (mimalloc's realloc: the old one is freed, not
    /// returned as NULL); on failure the old block is left as it was.
    ///
    /// # Safety
    /// As [`Heap::free`].
    pub unsafe fn realloc(&self, p: *mut u8, size: usize) -> Result<NonNull<u8>, HeapError> {
        if p.is_null() {
            return self.malloc(size);
        }
        let arena = self.owner(p)?;
        // SAFETY: p is a live block of arena.heap (caller's contract beyond owner()'s checks).
        let old = unsafe { mi::mi_usable_size(p.cast()) };
        if size <= ARENA_CHUNK * 2 {
            // SAFETY: as above.
            let q = unsafe { mi::mi_heap_realloc(arena.heap, p.cast(), size) };
            if let Some(q) = NonNull::new(q.cast::<u8>()) {
                // SAFETY: q is the live block just returned.
                let new = unsafe { mi::mi_usable_size(q.as_ptr().cast()) };
                self.allocated.fetch_add(new as u64, Relaxed);
                self.allocated.fetch_sub(old as u64, Relaxed);
                return Ok(q);
            }
        }
        if self.arenas.len() == 1 {
            return Err(self.oom(size));
        }
        // Its arena is full: move it to another one.
        let q = self.malloc(size)?;
        // SAFETY: both blocks are live and distinct, each at least as large as what is copied.
        unsafe {
            std::ptr::copy_nonoverlapping(p, q.as_ptr(), old.min(size));
            self.free(p)?;
        }
        Ok(q)
    }

    /// Usable bytes of a live block (at least what was asked for).
    ///
    /// # Safety
    /// As [`Heap::free`].
    pub unsafe fn usable_size(&self, p: *const u8) -> Result<usize, HeapError> {
        self.owner(p)?;
        // SAFETY: p is a live block of this heap (caller's contract beyond owner()'s checks).
        Ok(unsafe { mi::mi_usable_size(p.cast()) })
    }

    pub fn stats(&self) -> HeapStats {
        let (mut metadata, mut metadata_resident, mut decommitted) = (0, 0, 0);
        for a in &self.arenas {
            let (m, len) = a.ctl.meta();
            metadata += len as u64;
            metadata_resident += arena::resident_bytes(m, len);
            decommitted += a.ctl.decommitted.load(Relaxed);
        }
        HeapStats {
            region: self.region.stats(),
            allocated: self.allocated.load(Relaxed),
            live_blocks: self.live.load(Relaxed),
            capacity: self.capacity(),
            arenas: self.arenas.len(),
            metadata,
            metadata_resident,
            decommitted,
        }
    }
}

impl Drop for Heap {
    fn drop(&mut self) {
        for a in &self.arenas {
            if !a.heap.is_null() {
                // SAFETY: our heap; no other thread uses it any more (&mut self). Frees every
                // block and every thread's per-thread heap in it.
                unsafe { mi::mi_heap_destroy(a.heap) };
            }
        }
        for a in &self.arenas {
            a.ctl.retire();
        }
        for a in &self.arenas {
            let (m, len) = a.ctl.meta();
            if a.registered {
                // mimalloc reads this arena forever: its data becomes zeros that stay mapped,
                // its metadata stays but for the part past the header, given back.
                if let Err(e) = arena::leave_zeros(a.data_start(), a.end) {
                    // Cannot happen short of the kernel refusing a mapping; the region's drop
                    // would then unmap memory mimalloc may still read.
                    eprintln!(
                        "zmem heap: cannot keep a destroyed arena's range mapped ({e}); \
                         aborting rather than leave mimalloc a dangling arena"
                    );
                    std::process::abort();
                }
                if len > META_KEEP {
                    // SAFETY: plain memory of ours; mimalloc reads it as empty bitmaps.
                    unsafe {
                        libc::madvise(
                            (m + META_KEEP) as *mut c_void,
                            len - META_KEEP,
                            libc::MADV_DONTNEED,
                        )
                    };
                }
            } else if len > 0 {
                // Refused by mimalloc: nobody knows this metadata.
                // SAFETY: our own plain mapping, referenced by nothing.
                unsafe { libc::munmap(m as *mut c_void, len) };
            }
        }
        // The region drops now (last field): it unmaps what is still its own.
    }
}
