//! zmem-pool: a zsmalloc-like allocator for compressed objects.
//!
//! # Design
//!
//! * **Size classes.** Objects are rounded up to a multiple of 16 bytes; each rounded size has a
//!   class. Per class the pool picks how many pages a *span* has (1..=`max_span_pages` for
//!   objects up to a page; for larger objects enough pages for at least one object and up to a
//!   few times that) so that the tail of the span left over after its slots is small (the page
//!   count with the least tail waste, or the smallest one within 1/64 of the span). Adjacent
//!   classes that end up with the same pages and slots per span are merged into the largest of
//!   them, like zsmalloc: they cost the same memory per object, and fewer classes mean fewer
//!   partially used spans.
//! * **Spans** are runs of contiguous pages cut into equal slots. Each class keeps, out of line,
//!   a 4-byte word per slot that is either a link in the span's free-slot list or the reverse
//!   map (slot -> handle-table index) used by compaction; the object bytes carry no header. Spans of a class are kept in
//!   16 fullness buckets; allocation takes a slot from the fullest non-full span, and a span
//!   whose last object is freed is released at once.
//! * **Split objects.** An object larger than a page is stored as a run of its whole pages plus
//!   its tail as an object of the page classes (module `split`): no rounding and no partly used
//!   spans of large classes, for a copy on read. [`PoolConfig::split_large_objects`] turns it
//!   off; the large classes are then used as above.
//! * **Chunks.** Span pages come from 2 MiB anonymous mappings (`MAP_NORESERVE`, no huge pages)
//!   carved into page runs by a per-chunk bitmap, so the number of mappings stays small (the
//!   kernel allows 65530 per process). Chunks are indexed by their longest free run; a new span
//!   takes the best fit (the chunk with the shortest sufficient run, then the shortest run in
//!   it), so partly used chunks fill up before empty ones. A released span's pages are returned
//!   with `madvise(MADV_DONTNEED)` at once; a wholly free chunk is unmapped (one empty chunk is
//!   kept mapped, holding no memory, so a pool hovering at a chunk boundary does not thrash).
//! * **Handles** are one indirection: a handle encodes class id, index in that class's handle
//!   table, and 12 generation bits. The 8-byte table entry holds span id, slot, the difference
//!   between slot size and exact length, and the same generation, so a stale, double-freed or
//!   forged handle is detected and answered with [`PoolError::InvalidHandle`]. Everything about
//!   an object lives under its class's lock (a `zmem_os::sync::RwLock`; readers share it), so
//!   different classes never contend. Per object the pool keeps 12 bytes of metadata (8-byte
//!   handle entry + 4-byte reverse-map entry).
//! * **Compaction** ([`Pool::compact`]) works class by class: while the free slots of the class's
//!   spans add up to at least one whole span, it takes the least used span and moves its objects
//!   into the fullest ones, then releases it. Handles stay valid because only the table entry
//!   changes. The class lock is dropped between spans.
//! * **Accounting.** [`PoolStats::mem_used_total`] is the pages of live spans times 4096, i.e. the
//!   memory really held from the OS for objects (zram's `mem_used_total`); chunk address space
//!   that holds no span is not counted. The memory limit is enforced with an atomic reservation
//!   when a span is created, so concurrent allocations can never push `mem_used_total` above
//!   it, and a failed allocation changes nothing.
//!
//! The closure given to [`Pool::with_object`] runs under the class's read lock: it must not call
//! back into the same pool (that may deadlock).
//!
//! Modules: `config` (settings, errors), `stats`, `handle` (handle and table-entry encoding),
//! `class` (the size-class table), `class_state` (one class's spans, buckets and handle table),
//! `chunk` (the page-run allocator), `compact` (compaction) and `split` (objects larger than a
//! page); this file is the pool itself.

mod chunk;
mod class;
mod class_state;
mod compact;
mod config;
mod handle;
mod split;
mod stats;

use std::num::NonZeroU64;
use std::sync::atomic::{
    AtomicPtr, AtomicU64,
    Ordering::{AcqRel, Acquire, Relaxed},
};

use zmem_os::sync::RwLock;

use chunk::{ChunkAlloc, Run};
use class::{ClassInfo, ClassTable, CLASS_STEP, MAX_OBJECT_SIZE_LIMIT, MAX_SPAN_PAGES_LIMIT};
use class_state::{slot_ptr, Class, ClassState, Span, B_FULL, MAX_SPANS, NIL, SLOT_END, SLOT_FREE};
use handle::{live_entry, GEN_MASK, H_CLASS_SHIFT, H_GEN_SHIFT, H_RESERVED_SHIFT};
use split::{with_assembly, SplitObject, SplitTable, SPLIT_CLASS, SPLIT_FROM};

pub use config::{PoolConfig, PoolError};
pub use handle::Handle;
pub use stats::{CompactStats, PoolStats};

/// Page size the pool works in (defined once, in zmem-os).
pub use zmem_os::PAGE_SIZE;

/// A compressed-object allocator. `Send + Sync`; all methods take `&self`.
pub struct Pool {
    max_object_size: usize,
    max_span_pages: usize,
    /// Objects larger than a page are stored split (`split`).
    split_large: bool,
    /// The size classes ([`Classes`]), built when first needed: building them is ~0.4 ms of
    /// CPU, which every process under zmem paid at start and at each fork though most never
    /// store a page. A pointer swapped in once (freed with the pool), not a lock: a fork in
    /// the middle of a build must not leave the child waiting for it.
    lazy: AtomicPtr<Classes>,
    chunks: ChunkAlloc,
    /// Pages in live spans (or reserved for spans being created).
    pages_used: AtomicU64,
    pages_max: AtomicU64,
    /// Limit in bytes; u64::MAX = none.
    limit: AtomicU64,
    pages_compacted: AtomicU64,
    split: SplitTable,
}

/// The size classes of a pool: what each object size gets, and each class's spans.
pub(crate) struct Classes {
    pub(crate) infos: Box<[ClassInfo]>,
    pub(crate) size_to_class: Box<[u16]>,
    pub(crate) classes: Box<[Class]>,
}

impl Classes {
    fn build(max_object_size: usize, max_span_pages: usize) -> Classes {
        let table = ClassTable::for_config(max_object_size, max_span_pages);
        assert!(
            table.infos.len() < SPLIT_CLASS,
            "class ids reach the split class"
        );
        let classes = (0..table.infos.len())
            .map(|_| Class {
                state: RwLock::new(ClassState::new()),
                objects: AtomicU64::new(0),
                bytes: AtomicU64::new(0),
                spans: AtomicU64::new(0),
                meta: AtomicU64::new(0),
            })
            .collect();
        Classes {
            infos: table.infos.into_boxed_slice(),
            size_to_class: table.size_to_class.into_boxed_slice(),
            classes,
        }
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let p = *self.lazy.get_mut();
        if !p.is_null() {
            // SAFETY: published once by `classes()` from a Box, never freed elsewhere.
            drop(unsafe { Box::from_raw(p) });
        }
    }
}

impl std::fmt::Debug for Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool")
            .field("max_object_size", &self.max_object_size)
            .field("classes", &self.built().map_or(0, |c| c.infos.len()))
            .field("stats", &self.stats())
            .finish()
    }
}

impl Pool {
    /// Creates an empty pool (no memory is mapped until the first allocation).
    pub fn new(config: PoolConfig) -> Result<Pool, PoolError> {
        if config.max_object_size == 0 || config.max_object_size > MAX_OBJECT_SIZE_LIMIT {
            return Err(PoolError::InvalidConfig(format!(
                "max_object_size {} not in 1..={MAX_OBJECT_SIZE_LIMIT}",
                config.max_object_size
            )));
        }
        if config.max_span_pages == 0 || config.max_span_pages > MAX_SPAN_PAGES_LIMIT {
            return Err(PoolError::InvalidConfig(format!(
                "max_span_pages {} not in 1..={MAX_SPAN_PAGES_LIMIT}",
                config.max_span_pages
            )));
        }
        Ok(Pool {
            max_object_size: config.max_object_size,
            max_span_pages: config.max_span_pages,
            split_large: config.split_large_objects,
            lazy: AtomicPtr::new(std::ptr::null_mut()),
            chunks: ChunkAlloc::new(),
            pages_used: AtomicU64::new(0),
            pages_max: AtomicU64::new(0),
            limit: AtomicU64::new(config.mem_limit.unwrap_or(u64::MAX)),
            pages_compacted: AtomicU64::new(0),
            split: SplitTable::new(),
        })
    }

    /// The size classes, built by the first caller that needs them.
    pub(crate) fn classes(&self) -> &Classes {
        if let Some(c) = self.built() {
            return c;
        }
        let new = Box::into_raw(Box::new(Classes::build(
            self.max_object_size,
            self.max_span_pages,
        )));
        match self
            .lazy
            .compare_exchange(std::ptr::null_mut(), new, AcqRel, Acquire)
        {
            // SAFETY: published now; freed only when the pool is dropped.
            Ok(_) => unsafe { &*new },
            Err(current) => {
                // SAFETY: `new` was never published; `current` was, and lives as long.
                unsafe {
                    drop(Box::from_raw(new));
                    &*current
                }
            }
        }
    }

    /// The size classes if they were built (not before the first object).
    pub(crate) fn built(&self) -> Option<&Classes> {
        // SAFETY: a published `Classes` lives until the pool is dropped.
        unsafe { self.lazy.load(Acquire).as_ref() }
    }

    /// Largest object the pool stores.
    pub fn max_object_size(&self) -> usize {
        self.max_object_size
    }

    /// Slot size an object of `len` bytes would occupy (`None` if it cannot be stored).
    pub fn slot_size(&self, len: usize) -> Option<usize> {
        if len == 0 || len > self.max_object_size {
            return None;
        }
        if self.splits(len) {
            let whole = len / PAGE_SIZE * PAGE_SIZE;
            let tail = self.class_slot_size(len - whole).unwrap_or(0);
            return Some(whole + tail);
        }
        self.class_slot_size(len)
    }

    /// Whether an object of `len` bytes is stored split: its whole pages apart from its tail
    /// ([`PoolConfig::split_large_objects`]).
    pub fn splits(&self, len: usize) -> bool {
        self.split_large && len >= SPLIT_FROM
    }

    /// The slot size of `len`'s class (None for 0).
    fn class_slot_size(&self, len: usize) -> Option<usize> {
        if len == 0 {
            return None;
        }
        let c = self.classes();
        let cid = *c.size_to_class.get((len - 1) / CLASS_STEP)? as usize;
        Some(c.infos.get(cid)?.size as usize)
    }

    /// Number of (merged) size classes.
    pub fn num_classes(&self) -> usize {
        self.classes().infos.len()
    }

    /// Sets the memory limit (bytes of span memory). Lowering it below the current use frees
    /// nothing; later allocations that need a new span fail until use drops.
    pub fn set_mem_limit(&self, limit: Option<u64>) {
        self.limit.store(limit.unwrap_or(u64::MAX), Relaxed);
    }

    /// The memory limit (`Some(u64::MAX)` reads back as `None`).
    pub fn mem_limit(&self) -> Option<u64> {
        match self.limit.load(Relaxed) {
            u64::MAX => None,
            l => Some(l),
        }
    }

    fn decode(&self, h: Handle) -> Result<(usize, u32, u64), PoolError> {
        let raw = h.to_raw();
        let gen = (raw >> H_GEN_SHIFT) & GEN_MASK;
        let cid = ((raw >> H_CLASS_SHIFT) & 0xffff) as usize;
        let known = self
            .built()
            .is_some_and(|c| cid < c.classes.len() || cid == SPLIT_CLASS);
        if raw >> H_RESERVED_SHIFT != 0 || gen == 0 || !known {
            return Err(PoolError::InvalidHandle(raw));
        }
        Ok((cid, raw as u32, gen))
    }

    fn encode(cid: usize, idx: u32, gen: u64) -> Handle {
        let raw = (gen << H_GEN_SHIFT) | ((cid as u64) << H_CLASS_SHIFT) | idx as u64;
        // gen is never 0, so raw is never 0.
        Handle(NonZeroU64::new(raw).unwrap_or(NonZeroU64::MIN))
    }

    /// Reserves `pages` pages against the limit.
    fn reserve_pages(&self, pages: u64) -> Result<(), PoolError> {
        let limit = self.limit.load(Relaxed);
        let need = pages * PAGE_SIZE as u64;
        let mut cur = self.pages_used.load(Relaxed);
        loop {
            let used = cur * PAGE_SIZE as u64;
            if used.saturating_add(need) > limit {
                return Err(PoolError::LimitExceeded {
                    used,
                    limit,
                    needed: need,
                });
            }
            match self
                .pages_used
                .compare_exchange_weak(cur, cur + pages, Relaxed, Relaxed)
            {
                Ok(_) => break,
                Err(now) => cur = now,
            }
        }
        self.pages_max.fetch_max(cur + pages, Relaxed);
        Ok(())
    }

    /// Returns a released span's pages to the OS, then un-counts them (so `mem_used_total`
    /// never undercounts what is resident, and the limit holds for resident memory).
    fn release_run(&self, run: Run) {
        let pages = run.pages as u64;
        self.chunks.free(run);
        self.pages_used.fetch_sub(pages, Relaxed);
    }

    /// Creates a span for class `cid` (in bucket 0, empty). On error nothing changed.
    fn new_span(&self, st: &mut ClassState, cid: usize) -> Result<u32, PoolError> {
        let info = &self.classes().infos[cid];
        if st.free_span == NIL {
            if st.spans.len() >= MAX_SPANS {
                return Err(PoolError::OutOfMemory("too many spans in one class".into()));
            }
            st.spans
                .try_reserve(1)
                .map_err(|e| PoolError::OutOfMemory(e.to_string()))?;
        }
        let objs = info.objs as usize;
        if st.free_span == NIL {
            st.slot_map
                .try_reserve(objs)
                .map_err(|e| PoolError::OutOfMemory(e.to_string()))?;
        }
        self.reserve_pages(info.pages as u64)?;
        let run = match self.chunks.alloc(info.pages as usize) {
            Ok(r) => r,
            Err(e) => {
                self.pages_used.fetch_sub(info.pages as u64, Relaxed);
                return Err(e);
            }
        };
        let sid = if st.free_span == NIL {
            st.spans.push(Span {
                run: None,
                inuse: 0,
                free_slot: SLOT_END,
                bucket: B_FULL,
                prev: NIL,
                next: NIL,
            });
            let len = st.slot_map.len();
            st.slot_map.resize(len + objs, 0);
            (st.spans.len() - 1) as u32
        } else {
            let sid = st.free_span;
            st.free_span = st.spans[sid as usize].next;
            sid
        };
        {
            let s = &mut st.spans[sid as usize];
            s.run = Some(run);
            s.inuse = 0;
            s.free_slot = 0;
            let base = sid as usize * objs;
            for (i, v) in st.slot_map[base..base + objs].iter_mut().enumerate() {
                let next = i + 1;
                *v = SLOT_FREE | if next < objs { next as u32 } else { SLOT_END };
            }
        }
        st.link(sid, 0);
        let class = &self.classes().classes[cid];
        class.spans.fetch_add(1, Relaxed);
        class.meta.store(st.meta_bytes(), Relaxed);
        Ok(sid)
    }

    /// Allocates an object of `data.len()` bytes and copies `data` in. On error nothing was
    /// allocated.
    pub fn alloc(&self, data: &[u8]) -> Result<Handle, PoolError> {
        let len = data.len();
        if len == 0 {
            return Err(PoolError::Empty);
        }
        if len > self.max_object_size {
            return Err(PoolError::TooLarge {
                size: len,
                max: self.max_object_size,
            });
        }
        if self.splits(len) {
            return self.alloc_split(data);
        }
        self.alloc_in_class(data)
    }

    /// Stores `data` (1..=max_object_size bytes) in its size class.
    fn alloc_in_class(&self, data: &[u8]) -> Result<Handle, PoolError> {
        let len = data.len();
        let c = self.classes();
        let cid = c.size_to_class[(len - 1) / CLASS_STEP] as usize;
        let info = &c.infos[cid];
        let class = &c.classes[cid];
        let mut st = class.state.write();
        let grew = st.free_handle == NIL && st.handles.len() == st.handles.capacity();
        st.reserve_handle()?;
        let sid = match st.fullest() {
            Some(sid) => sid,
            None => self.new_span(&mut st, cid)?,
        };
        let slot = st.take_slot(sid, info.objs);
        let (idx, gen) = st.take_handle();
        let delta = (info.size as usize - len) as u64;
        st.handles[idx as usize] = live_entry(gen, delta, sid, slot);
        st.slot_map[sid as usize * info.objs as usize + slot as usize] = idx;
        if let Some(run) = st.spans[sid as usize].run.as_ref() {
            let dst = slot_ptr(run.ptr, slot, info.size);
            // SAFETY: dst is a free slot of `size >= len` bytes inside a live span of this class;
            // the class write lock is held so nobody else accesses it, and `data` cannot overlap
            // it (the slot was free, so no reference to its bytes exists).
            unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), dst, len) };
        }
        if grew {
            class.meta.store(st.meta_bytes(), Relaxed);
        }
        class.objects.fetch_add(1, Relaxed);
        class.bytes.fetch_add(len as u64, Relaxed);
        Ok(Self::encode(cid, idx, gen))
    }

    /// Stores `data` (more than a page) split: its whole pages in a run of their own, the rest
    /// in its size class. On error nothing was allocated.
    fn alloc_split(&self, data: &[u8]) -> Result<Handle, PoolError> {
        let pages = data.len() / PAGE_SIZE;
        let whole = pages * PAGE_SIZE;
        // Handles are checked against the built classes, split ones too.
        self.classes();
        self.reserve_pages(pages as u64)?;
        let run = match self.chunks.alloc(pages) {
            Ok(r) => r,
            Err(e) => {
                self.pages_used.fetch_sub(pages as u64, Relaxed);
                return Err(e);
            }
        };
        // SAFETY: the run is `pages` fresh pages owned by nobody else yet; `data` is caller
        // memory, so the two cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), run.ptr.0.as_ptr(), whole) };
        let tail = if whole < data.len() {
            match self.alloc_in_class(&data[whole..]) {
                Ok(h) => Some(h),
                Err(e) => {
                    self.release_run(run);
                    return Err(e);
                }
            }
        } else {
            None
        };
        let obj = SplitObject {
            run,
            tail,
            len: data.len() as u32,
        };
        match self.split.insert(obj) {
            Ok((idx, gen)) => Ok(Self::encode(SPLIT_CLASS, idx, gen)),
            Err((obj, e)) => {
                self.drop_split(obj);
                Err(e)
            }
        }
    }

    /// Frees the parts of a split object taken out of the table.
    fn drop_split(&self, obj: SplitObject) {
        if let Some(t) = obj.tail {
            // The tail's handle was made by this pool and is owned by this object alone.
            let freed = self.free(t);
            debug_assert!(freed.is_ok(), "a split object's tail was already freed");
        }
        self.release_run(obj.run);
    }

    /// Frees an object. A stale, invalid or double-freed handle returns
    /// [`PoolError::InvalidHandle`].
    pub fn free(&self, h: Handle) -> Result<(), PoolError> {
        let (cid, idx, gen) = self.decode(h)?;
        if cid == SPLIT_CLASS {
            let obj = self
                .split
                .remove(idx, gen)
                .ok_or(PoolError::InvalidHandle(h.to_raw()))?;
            self.drop_split(obj);
            return Ok(());
        }
        let c = self.classes();
        let info = &c.infos[cid];
        let class = &c.classes[cid];
        let released = {
            let mut st = class.state.write();
            let loc = st
                .resolve(idx, gen)
                .ok_or(PoolError::InvalidHandle(h.to_raw()))?;
            st.release_handle(idx, gen);
            class.objects.fetch_sub(1, Relaxed);
            class
                .bytes
                .fetch_sub((info.size - loc.delta) as u64, Relaxed);
            if st.put_slot(loc.span, loc.slot, info.objs) {
                class.spans.fetch_sub(1, Relaxed);
                st.remove_span(loc.span)
            } else {
                None
            }
        };
        if let Some(run) = released {
            self.release_run(run);
        }
        Ok(())
    }

    /// Runs `f` on the object's bytes (exactly as long as allocated) while the object can
    /// neither move nor be freed. `f` must not call into this pool.
    pub fn with_object<R>(&self, h: Handle, f: impl FnOnce(&[u8]) -> R) -> Result<R, PoolError> {
        let (cid, idx, gen) = self.decode(h)?;
        if cid == SPLIT_CLASS {
            return self.with_split(h, idx, gen, f);
        }
        self.with_class_object(h, cid, idx, gen, f)
    }

    /// [`Pool::with_object`] for a split object: its two parts copied into one buffer of this
    /// thread's, and `f` called on that after the pool's locks are released (so an `f` that
    /// stores into another pool never holds one pool's lock while it waits for another's).
    fn with_split<R>(
        &self,
        h: Handle,
        idx: u32,
        gen: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, PoolError> {
        with_assembly(|buf| {
            {
                let st = self.split.state.read();
                let obj = st
                    .get(idx, gen)
                    .ok_or(PoolError::InvalidHandle(h.to_raw()))?;
                let whole = obj.run.pages as usize * PAGE_SIZE;
                // SAFETY: the run holds `whole` initialised bytes written at allocation; it is
                // freed only after the object leaves the table, which needs the write lock this
                // read lock excludes.
                buf.extend_from_slice(unsafe {
                    std::slice::from_raw_parts(obj.run.ptr.0.as_ptr(), whole)
                });
                if let Some(t) = obj.tail {
                    // A tail is always a class object (never split itself).
                    let (cid, tidx, tgen) = self.decode(t)?;
                    self.with_class_object(t, cid, tidx, tgen, |b| buf.extend_from_slice(b))?;
                }
                debug_assert_eq!(buf.len(), obj.len as usize);
            }
            Ok(f(buf))
        })
    }

    /// [`Pool::with_object`] for an object of a size class.
    fn with_class_object<R>(
        &self,
        h: Handle,
        cid: usize,
        idx: u32,
        gen: u64,
        f: impl FnOnce(&[u8]) -> R,
    ) -> Result<R, PoolError> {
        let c = self.classes();
        let (Some(info), Some(class)) = (c.infos.get(cid), c.classes.get(cid)) else {
            return Err(PoolError::InvalidHandle(h.to_raw()));
        };
        let st = class.state.read();
        let loc = st
            .resolve(idx, gen)
            .ok_or(PoolError::InvalidHandle(h.to_raw()))?;
        let run = st.spans[loc.span as usize]
            .run
            .as_ref()
            .ok_or(PoolError::InvalidHandle(h.to_raw()))?;
        let ptr = slot_ptr(run.ptr, loc.slot, info.size);
        let len = (info.size - loc.delta) as usize;
        // SAFETY: the slot holds a live object of `len` initialised bytes inside a mapped span;
        // the class read lock is held for the whole borrow, and all writes to the slot (alloc,
        // compaction, span release) need the write lock.
        let bytes = unsafe { std::slice::from_raw_parts(ptr, len) };
        Ok(f(bytes))
    }

    /// Exact length of an object.
    pub fn object_len(&self, h: Handle) -> Result<usize, PoolError> {
        self.with_object(h, <[u8]>::len)
    }

    /// Bytes the pool holds from the OS now (`PoolStats::mem_used_total`, without the rest).
    pub fn mem_used(&self) -> u64 {
        self.pages_used.load(Relaxed) * PAGE_SIZE as u64
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> PoolStats {
        let mut s = PoolStats {
            mem_used_total: self.pages_used.load(Relaxed) * PAGE_SIZE as u64,
            mem_used_max: self.pages_max.load(Relaxed) * PAGE_SIZE as u64,
            pages_compacted: self.pages_compacted.load(Relaxed),
            metadata_bytes: self.built().map_or(0, |c| {
                (std::mem::size_of_val::<[Class]>(&c.classes)
                    + std::mem::size_of_val::<[ClassInfo]>(&c.infos)
                    + std::mem::size_of_val::<[u16]>(&c.size_to_class)) as u64
            }) + self.chunks.metadata_bytes()
                + self.split.meta_bytes(),
            split_objects: self.split.objects.load(Relaxed),
            ..PoolStats::default()
        };
        for c in self.built().map_or(&[][..], |c| &c.classes[..]) {
            s.objects += c.objects.load(Relaxed);
            s.object_bytes += c.bytes.load(Relaxed);
            s.spans += c.spans.load(Relaxed);
            s.metadata_bytes += c.meta.load(Relaxed);
        }
        // A split object's tail is an object of its class too: count the split object once.
        s.objects = (s.objects + s.split_objects).saturating_sub(self.split.tails.load(Relaxed));
        s.object_bytes += self.split.page_bytes.load(Relaxed);
        s
    }

    /// Number of 2 MiB chunks currently mapped (for diagnostics).
    pub fn mapped_chunks(&self) -> u64 {
        self.chunks.mapped_chunks()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pool_is_send_sync() {
        fn check<T: Send + Sync>() {}
        check::<Pool>();
    }

    #[test]
    fn generation_wraps_and_stays_detectable() {
        let pool = Pool::new(PoolConfig::default()).unwrap();
        let keep = pool.alloc(&[1; 100]).unwrap();
        let first = pool.alloc(&[2; 100]).unwrap();
        pool.free(first).unwrap();
        // The freed table entry is reused LIFO; each reuse gets the next generation, and the
        // old handle stays invalid until the 12-bit generation wraps (4095 reuses).
        for _ in 1..GEN_MASK {
            let h = pool.alloc(&[3; 100]).unwrap();
            assert_ne!(h, first);
            assert_eq!(
                pool.free(first),
                Err(PoolError::InvalidHandle(first.to_raw()))
            );
            assert!(pool.object_len(first).is_err());
            pool.free(h).unwrap();
        }
        let h = pool.alloc(&[4; 100]).unwrap();
        assert_eq!(h, first, "generation wrapped");
        pool.free(h).unwrap();
        pool.free(keep).unwrap();
    }

    /// A pool builds its classes with the first object, not when it is made (most processes
    /// under zmem never store one); until then it reports nothing, compacts nothing and knows
    /// no handle. Threads racing to build them all get the one table that was published.
    #[test]
    fn classes_are_built_with_the_first_object() {
        let pool = Pool::new(PoolConfig::default()).unwrap();
        assert!(pool.built().is_none());
        let s = pool.stats();
        assert_eq!((s.objects, s.spans, s.mem_used_total), (0, 0, 0));
        assert_eq!(pool.compact(), CompactStats::default());
        let bogus = Handle::from_raw(1 << H_GEN_SHIFT).unwrap();
        assert_eq!(
            pool.free(bogus),
            Err(PoolError::InvalidHandle(bogus.to_raw()))
        );
        assert!(pool.built().is_none(), "a bad handle built the classes");
        let tables: Vec<usize> = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..4)
                .map(|_| sc.spawn(|| pool.classes() as *const Classes as usize))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(tables.windows(2).all(|w| w[0] == w[1]), "{tables:?}");
        let h = pool.alloc(&[9; 300]).unwrap();
        assert!(pool.stats().metadata_bytes > 0);
        pool.free(h).unwrap();
    }

    #[test]
    fn alloc_prefers_fullest_span() {
        let pool = Pool::new(PoolConfig::default()).unwrap();
        let cid = pool.classes().size_to_class[(1000 - 1) / CLASS_STEP] as usize;
        let n = pool.classes().infos[cid].objs as usize;
        assert!(n >= 4);
        let span_of = |h: Handle| {
            let (c, idx, gen) = pool.decode(h).unwrap();
            assert_eq!(c, cid);
            pool.classes().classes[cid]
                .state
                .read()
                .resolve(idx, gen)
                .unwrap()
                .span
        };
        let hs: Vec<Handle> = (0..2 * n)
            .map(|_| pool.alloc(&[5; 1000]).unwrap())
            .collect();
        let (a, b) = (span_of(hs[0]), span_of(hs[n]));
        assert_ne!(a, b);
        // Span a keeps one object, span b all but one.
        for &h in &hs[1..n] {
            pool.free(h).unwrap();
        }
        pool.free(hs[n]).unwrap();
        assert_eq!(span_of(pool.alloc(&[6; 1000]).unwrap()), b);
        // Now b is full: the next one goes to a, no new span.
        assert_eq!(span_of(pool.alloc(&[7; 1000]).unwrap()), a);
        assert_eq!(pool.stats().spans, 2);
    }

    #[test]
    fn span_released_when_empty() {
        let pool = Pool::new(PoolConfig::default()).unwrap();
        let h = pool.alloc(&[7; 3000]).unwrap();
        let s = pool.stats();
        assert!(s.mem_used_total > 0);
        assert_eq!(s.spans, 1);
        pool.free(h).unwrap();
        let s = pool.stats();
        assert_eq!(
            (s.mem_used_total, s.spans, s.objects, s.object_bytes),
            (0, 0, 0, 0)
        );
        assert!(s.mem_used_max > 0);
    }
}
