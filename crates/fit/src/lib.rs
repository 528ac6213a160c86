//! Exact-fit allocation for mid-size blocks, over one span of memory that grows upward.
//!
//! Why zmem has it: mimalloc, which serves the program heap, rounds each request up to one of 4
//! size classes per power of two, so a mid-size object loses up to 25% (sqlite's 4368-byte
//! page-cache pages take 5120 bytes); under a small budget those lost bytes are evicted,
//! compressed and faulted back like data (docs/DESIGN-NOTES.md, "The heap's footprint").
//! Here a block is the request plus a 16-byte header, rounded to 16 bytes (4368 -> 4384, as in
//! glibc's malloc), and free neighbours coalesce.
//!
//! The algorithm is TLSF (two-level segregated fit: free lists by size, 16 per power of two, and
//! two bitmaps, so allocation and free are O(1)) with boundary tags. What a generic TLSF crate
//! does not give and zmem needs: after a free, [`Fit::free`] says which whole pages of the
//! coalesced free block to drop (MADV_DONTNEED): freed memory must leave the region, never be
//! evicted and faulted back as data. Each hole keeps the range of its pages that may still be
//! resident and gives it up once it spans `release_min` bytes (see `release_block`: dropping
//! every page at once made sqlite churn).
//!
//! No I/O, no lock, no allocation: the caller maps the span, serialises calls and drops pages.
//! The span is `[base, limit)`; it is used from `base` upward in steps (`grow_step`), so memory
//! never used is never touched.
//!
//! Block layout (every block starts on a 16-byte boundary):
//!
//! ```text
//! b + 0   prev_size   size of the block before, valid only when PREV_FREE is set
//! b + 8   size | PREV_FREE (bit 1) | FREE (bit 0)    size: whole block, a multiple of 16
//! b + 16  user data (used block), or next free, prev free (free block: 16 bytes of links)
//! b + 32  free block with whole pages inside: [lo, hi) of those that may still be resident
//! ```
//!
//! A header (size 0, used) after the last block ends the span; growing turns it into a free
//! block and writes a new one further up.

use thiserror::Error;

/// Blocks are multiples of this and start on it; user pointers are aligned to it.
pub const GRANULE: usize = 16;
/// Bytes of a block before the user's data.
pub const HEADER: usize = 16;
/// The smallest block: a header and two free-list links.
pub const MIN_BLOCK: usize = HEADER + 16;
/// The page size the caller drops whole pages of.
pub const PAGE: usize = 4096;
/// The largest span (the first-level bitmap covers block sizes below 2^55).
pub const MAX_SPAN: usize = 1 << 48;

const FREE: usize = 1;
const PREV_FREE: usize = 2;
const FLAGS: usize = FREE | PREV_FREE;

/// Second-level lists per power of two (classes 6.25% apart).
const SL_BITS: u32 = 4;
const SL: usize = 1 << SL_BITS;
/// Below this, one list per granule (first level 0).
const SMALL: usize = GRANULE * SL;
const SMALL_LG: u32 = SMALL.trailing_zeros();
/// First-level lists: level f >= 1 holds sizes in [2^(f+7), 2^(f+8)).
const FL: usize = 48;

const _: () = assert!(SMALL.is_power_of_two() && SMALL_LG == 8);
const _: () = assert!((MAX_SPAN.trailing_zeros() - SMALL_LG + 1) < FL as u32);
const _: () = assert!(MIN_BLOCK % GRANULE == 0 && HEADER % GRANULE == 0);

/// What a call was given that is not one of this span's live blocks.
#[derive(Error, Debug, Clone, Copy, PartialEq, Eq)]
pub enum FitError {
    #[error("{addr:#x} is not a block of the exact-fit span")]
    Foreign { addr: usize },
    #[error("{addr:#x} is freed twice (the block is already free)")]
    DoubleFree { addr: usize },
    #[error("the header of the block at {addr:#x} is corrupt (size {size:#x}): memory was written past a block's end")]
    Corrupt { addr: usize, size: usize },
    #[error("invalid span [{base:#x}, {limit:#x}): {why}")]
    Span {
        base: usize,
        limit: usize,
        why: &'static str,
    },
}

/// Counters of a span.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FitStats {
    /// Bytes of the span in use so far (blocks and the end header).
    pub span: usize,
    /// Bytes of live blocks, headers included.
    pub live: usize,
    /// Live blocks.
    pub blocks: usize,
    /// Bytes [`Fit::free`] and [`Fit::resize_in_place`] reported as whole unused pages.
    pub released: u64,
}

/// Page ranges a free leaves unused, for the caller to drop: at most three, `(start, bytes)`,
/// page aligned.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Release {
    ranges: [(usize, usize); 3],
    len: usize,
}

impl Release {
    pub const NONE: Release = Release {
        ranges: [(0, 0); 3],
        len: 0,
    };

    fn push(&mut self, (lo, hi): (usize, usize)) {
        if lo < hi {
            self.ranges[self.len] = (lo, hi - lo);
            self.len += 1;
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The ranges, `(start, bytes)`.
    pub fn ranges(&self) -> &[(usize, usize)] {
        &self.ranges[..self.len]
    }

    /// Bytes in all ranges.
    pub fn bytes(&self) -> usize {
        self.ranges().iter().map(|r| r.1).sum()
    }
}

/// What a resize in place did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Resized {
    /// The block now holds the new size; a shrink may have left whole pages unused.
    Done { release: Release },
    /// The block cannot grow where it is: allocate, copy, free.
    Move,
}

/// Holes waiting out `release_delay` before their pages are dropped, at most this many: when
/// more come, the oldest is dropped at once.
pub const AGING: usize = 16;

/// An exact-fit allocator over one span. See the crate's documentation.
pub struct Fit {
    base: usize,
    /// End of the span used so far (just past the end header).
    end: usize,
    limit: usize,
    grow_step: usize,
    /// Free blocks with fewer bytes of whole inner pages keep them (see `release_block`).
    release_min: usize,
    /// A hole's pages are dropped once it has stayed free this long (the caller's time unit).
    release_delay: u64,
    /// The caller's time, as of the last [`Fit::advance`].
    now: u64,
    /// Holes whose range is due to be dropped, `(block, since)`, oldest first. A hole leaves
    /// when it is cut up, merged or grown (`remove`), so every entry is a free block.
    aging: [(usize, u64); AGING],
    aging_len: usize,
    fl_map: u64,
    sl_map: [u32; FL],
    heads: [[usize; SL]; FL],
    stats: FitStats,
}

impl Default for Fit {
    fn default() -> Self {
        Self::new()
    }
}

// The span's words, read and written in place. The caller's contract (see `init`) makes every
// address these are called with a mapped, 8-byte aligned word of the span.
#[inline]
unsafe fn word(at: usize) -> usize {
    // SAFETY: see above.
    unsafe { *(at as *const usize) }
}

#[inline]
unsafe fn set_word(at: usize, v: usize) {
    // SAFETY: see above.
    unsafe { *(at as *mut usize) = v }
}

#[inline]
unsafe fn size_word(b: usize) -> usize {
    unsafe { word(b + 8) }
}

#[inline]
unsafe fn set_size_word(b: usize, v: usize) {
    unsafe { set_word(b + 8, v) }
}

#[inline]
unsafe fn link_next(b: usize) -> usize {
    unsafe { word(b + HEADER) }
}

#[inline]
unsafe fn link_prev(b: usize) -> usize {
    unsafe { word(b + HEADER + 8) }
}

/// The list a free block of `size` bytes is kept in.
#[inline]
fn class(size: usize) -> (usize, usize) {
    if size < SMALL {
        (0, size / GRANULE)
    } else {
        let lg = usize::BITS - 1 - size.leading_zeros();
        (
            (lg - SMALL_LG + 1) as usize,
            (size >> (lg - SL_BITS)) & (SL - 1),
        )
    }
}

/// The first list whose every block holds `size` bytes.
#[inline]
fn class_at_least(size: usize) -> (usize, usize) {
    if size < SMALL {
        return class(size);
    }
    let lg = usize::BITS - 1 - size.leading_zeros();
    class(size + (1 << (lg - SL_BITS)) - 1)
}

/// The block that serves a request of `req` bytes, None if absurdly large.
#[inline]
fn block_size(req: usize) -> Option<usize> {
    let n = req.checked_add(HEADER + GRANULE - 1)? & !(GRANULE - 1);
    (n < MAX_SPAN).then_some(n.max(MIN_BLOCK))
}

/// Bytes at a free block's start that are never dropped: header, links and the range of its
/// pages that may still be resident.
const INNER_SKIP: usize = MIN_BLOCK + 16;

/// The whole pages of a free block at `b` of `size` bytes past its header, links and range,
/// before the next block's header: what can be dropped (empty when `lo >= hi`).
#[inline]
fn inner(b: usize, size: usize) -> (usize, usize) {
    (page_up(b + INNER_SKIP), page_down(b + size))
}

/// Whether a free block has inner pages (and so a range of undropped ones).
#[inline]
fn has_inner(b: usize, size: usize) -> bool {
    let (lo, hi) = inner(b, size);
    hi > lo
}

/// The pages of a free block with inner pages that may still be resident: `[lo, hi)`, every
/// other inner page is dropped (a bound: some inside may be dropped too).
#[inline]
unsafe fn undropped(b: usize) -> (usize, usize) {
    unsafe { (word(b + MIN_BLOCK), word(b + MIN_BLOCK + 8)) }
}

#[inline]
unsafe fn set_undropped(b: usize, (lo, hi): (usize, usize)) {
    let (lo, hi) = if lo < hi { (lo, hi) } else { (0, 0) };
    unsafe {
        set_word(b + MIN_BLOCK, lo);
        set_word(b + MIN_BLOCK + 8, hi);
    }
}

/// The smallest range holding both (an empty one is `lo >= hi`).
#[inline]
fn span_of(a: (usize, usize), b: (usize, usize)) -> (usize, usize) {
    match (a.0 < a.1, b.0 < b.1) {
        (false, _) => b,
        (_, false) => a,
        _ => (a.0.min(b.0), a.1.max(b.1)),
    }
}

/// `a` cut to `b`.
#[inline]
fn clip(a: (usize, usize), b: (usize, usize)) -> (usize, usize) {
    (a.0.max(b.0), a.1.min(b.1))
}

#[inline]
fn page_down(a: usize) -> usize {
    a & !(PAGE - 1)
}

#[inline]
fn page_up(a: usize) -> usize {
    (a + PAGE - 1) & !(PAGE - 1)
}

impl Fit {
    /// An allocator with no span yet: every allocation fails until [`Fit::init`].
    pub const fn new() -> Fit {
        Fit {
            base: 0,
            end: 0,
            limit: 0,
            grow_step: 0,
            release_min: 0,
            release_delay: 0,
            now: 0,
            aging: [(0, 0); AGING],
            aging_len: 0,
            fl_map: 0,
            sl_map: [0; FL],
            heads: [[0; SL]; FL],
            stats: FitStats {
                span: 0,
                live: 0,
                blocks: 0,
                released: 0,
            },
        }
    }

    /// Takes `[base, limit)` as the span, used upward `grow_step` bytes (a multiple of
    /// [`PAGE`]) at a time. A free block's whole pages are reported for dropping once they
    /// reach `release_min` bytes (0: every whole page at once) and the block has stayed free
    /// for `release_delay` (0: at the free that makes it so; else by [`Fit::advance`]).
    ///
    /// # Safety
    /// The span is mapped, readable and writable, zero, used by nothing else, and stays so for
    /// as long as this allocator is used.
    pub unsafe fn init(
        &mut self,
        base: usize,
        limit: usize,
        grow_step: usize,
        release_min: usize,
        release_delay: u64,
    ) -> Result<(), FitError> {
        let bad = |why| FitError::Span { base, limit, why };
        if base == 0 || base % PAGE != 0 || limit % PAGE != 0 {
            return Err(bad("not page aligned"));
        }
        if limit <= base + PAGE || limit - base > MAX_SPAN {
            return Err(bad("smaller than two pages or larger than MAX_SPAN"));
        }
        if grow_step == 0 || grow_step % PAGE != 0 {
            return Err(bad("the growth step is not a whole number of pages"));
        }
        *self = Fit::new();
        self.base = base;
        self.limit = limit;
        self.grow_step = grow_step;
        self.release_min = release_min;
        self.release_delay = release_delay;
        // The end header (size 0, used) at the start: the first growth makes it a free block.
        // SAFETY: base is a word of the span (caller's contract); it is zero already.
        unsafe { set_size_word(base, 0) };
        self.end = base + HEADER;
        self.stats.span = HEADER;
        Ok(())
    }

    /// Whether `p` lies inside the span (used so far or not).
    #[inline]
    pub fn contains(&self, p: usize) -> bool {
        p >= self.base && p < self.limit
    }

    /// The span: `[base, limit)`.
    pub fn span(&self) -> (usize, usize) {
        (self.base, self.limit)
    }

    /// End of the part of the span used so far: what lies past it has never been touched.
    pub fn top(&self) -> usize {
        self.end
    }

    pub fn stats(&self) -> FitStats {
        self.stats
    }

    /// The usable size a request of `req` bytes gets.
    pub fn usable_for(req: usize) -> Option<usize> {
        block_size(req).map(|n| n - HEADER)
    }

    unsafe fn insert(&mut self, b: usize, size: usize) {
        let (f, s) = class(size);
        let head = self.heads[f][s];
        // SAFETY: b is a free block of the span with room for its links; head is one too.
        unsafe {
            set_word(b + HEADER, head);
            set_word(b + HEADER + 8, 0);
            if head != 0 {
                set_word(head + HEADER + 8, b);
            }
        }
        self.heads[f][s] = b;
        self.sl_map[f] |= 1 << s;
        self.fl_map |= 1 << f;
    }

    unsafe fn remove(&mut self, b: usize, size: usize) {
        if self.aging_len != 0 {
            self.forget_aging(b);
        }
        let (f, s) = class(size);
        // SAFETY: b is a free block in list (f, s); its neighbours in the list are too.
        unsafe {
            let (next, prev) = (link_next(b), link_prev(b));
            if prev != 0 {
                set_word(prev + HEADER, next);
            } else {
                self.heads[f][s] = next;
                if next == 0 {
                    self.sl_map[f] &= !(1 << s);
                    if self.sl_map[f] == 0 {
                        self.fl_map &= !(1 << f);
                    }
                }
            }
            if next != 0 {
                set_word(next + HEADER + 8, prev);
            }
        }
    }

    /// `b` is cut up, merged or grown: its pages are no longer due to be dropped as they were.
    fn forget_aging(&mut self, b: usize) {
        let n = self.aging_len;
        if let Some(i) = self.aging[..n].iter().position(|e| e.0 == b) {
            self.aging.copy_within(i + 1..n, i);
            self.aging_len -= 1;
        }
    }

    /// Gives up the range of the aging hole at index 0: its pages go into `out`.
    unsafe fn drop_oldest(&mut self, out: &mut Release) {
        let b = self.aging[0].0;
        self.aging.copy_within(1..self.aging_len, 0);
        self.aging_len -= 1;
        // SAFETY: an aging entry is a free block with inner pages (see `remove`).
        unsafe {
            let r = undropped(b);
            set_undropped(b, (0, 0));
            out.push(r);
            if r.0 < r.1 {
                self.stats.released += (r.1 - r.0) as u64;
            }
        }
    }

    /// Sets the time (in the unit of `release_delay`; it never goes back) and returns the
    /// pages of holes that have now stayed free long enough, for the caller to drop. At most
    /// three holes per call: call again while [`Fit::aging`] is not empty to have them all.
    ///
    /// # Safety
    /// [`Fit::init`]'s contract holds.
    pub unsafe fn advance(&mut self, now: u64) -> Release {
        self.now = self.now.max(now);
        let mut out = Release::NONE;
        while self.aging_len != 0
            && out.len < out.ranges.len()
            && self.now.saturating_sub(self.aging[0].1) >= self.release_delay
        {
            // SAFETY: caller's contract.
            unsafe { self.drop_oldest(&mut out) };
        }
        out
    }

    /// Holes whose pages wait for their delay to pass.
    pub fn aging(&self) -> usize {
        self.aging_len
    }

    /// A free block of at least `n` bytes (good fit: the first non-empty list at or above the
    /// size's class), not removed from its list.
    fn find(&self, n: usize) -> Option<usize> {
        // The first block of the size's own list, if large enough: a freed block of exactly
        // this size is reused instead of cutting a larger one.
        let (f, s) = class(n);
        let head = self.heads.get(f).map_or(0, |l| l[s]);
        // SAFETY: a listed block is a free block of the span.
        if head != 0 && unsafe { size_word(head) } & !FLAGS >= n {
            return Some(head);
        }
        let (mut f, s) = class_at_least(n);
        if f >= FL {
            return None;
        }
        let mut sl = self.sl_map[f] & (!0u32 << s);
        if sl == 0 {
            let fl = self.fl_map & (!0u64).checked_shl(f as u32 + 1).unwrap_or(0);
            if fl == 0 {
                return None;
            }
            f = fl.trailing_zeros() as usize;
            sl = self.sl_map[f];
        }
        Some(self.heads[f][sl.trailing_zeros() as usize])
    }

    /// Uses `need` more bytes of the span (at least; a whole step or more): the end header
    /// becomes a free block, merged with a free last block. False if the span is full.
    unsafe fn grow(&mut self, need: usize) -> bool {
        let at = self.end - HEADER;
        // A block found by class must be larger than `need` by up to a class's width.
        let min = need + (need >> SL_BITS) + MIN_BLOCK;
        // The new end (past the end header) on a step boundary from the base.
        let target = (at + HEADER + min - self.base).next_multiple_of(self.grow_step) + self.base;
        let new_end = target.min(self.limit);
        if new_end < at + HEADER + min {
            return false;
        }
        let step = new_end - HEADER - at;
        // SAFETY: [at, new_end) is inside the span (checked against limit).
        unsafe {
            let end_word = size_word(at);
            let (mut b, mut size) = (at, step);
            // The new memory was never touched: only the free last block's pages may be
            // resident (all of them, if it kept no range), and the page of the end header.
            let mut maybe = (page_down(at), page_up(at + HEADER));
            if end_word & PREV_FREE != 0 {
                let ps = word(at);
                b = at - ps;
                self.remove(b, ps);
                maybe = span_of(
                    maybe,
                    match has_inner(b, ps) {
                        true => span_of(undropped(b), (page_down(b), page_up(inner(b, ps).0))),
                        false => (page_down(b), page_up(at)),
                    },
                );
                size += ps;
            }
            set_size_word(b, size | FREE);
            self.insert(b, size);
            if has_inner(b, size) {
                set_undropped(b, clip(maybe, inner(b, size)));
            }
            let new_end = b + size;
            set_word(new_end, size);
            set_size_word(new_end, PREV_FREE);
            self.end = new_end + HEADER;
        }
        self.stats.span = self.end - self.base;
        true
    }

    /// A block for `req` bytes (16-byte aligned, contents undefined), or None when the span is
    /// full. A growth of the span shows in [`Fit::top`].
    ///
    /// # Safety
    /// [`Fit::init`]'s contract holds.
    pub unsafe fn alloc(&mut self, req: usize) -> Option<usize> {
        if self.base == 0 {
            return None;
        }
        let n = block_size(req)?;
        let b = match self.find(n) {
            Some(b) => b,
            // SAFETY: caller's contract.
            None if unsafe { self.grow(n) } => self.find(n)?,
            None => return None,
        };
        // SAFETY: b is a free block of the span, at least n bytes; the blocks it touches (its
        // remainder, the one after it) are inside the span.
        unsafe {
            let size = size_word(b) & !FLAGS;
            self.remove(b, size);
            if size - n >= MIN_BLOCK {
                let r = b + n;
                let rest = size - n;
                Self::split_range(b, size, n);
                set_size_word(r, rest | FREE);
                self.insert(r, rest);
                // The block after keeps PREV_FREE; its prev_size is now the remainder's.
                set_word(r + rest, rest);
                set_size_word(b, n);
                self.stats.live += n;
            } else {
                set_size_word(b, size);
                let next = b + size;
                set_size_word(next, size_word(next) & !PREV_FREE);
                self.stats.live += size;
            }
        }
        self.stats.blocks += 1;
        Some(b + HEADER)
    }

    /// The live block at user pointer `p`, and its size word.
    unsafe fn live_block(&self, p: usize) -> Result<(usize, usize), FitError> {
        if p < self.base + HEADER || p >= self.end || p % GRANULE != 0 {
            return Err(FitError::Foreign { addr: p });
        }
        let b = p - HEADER;
        // SAFETY: b is inside the used span.
        let w = unsafe { size_word(b) };
        if w & FREE != 0 {
            return Err(FitError::DoubleFree { addr: p });
        }
        let size = w & !FLAGS;
        if size < MIN_BLOCK || size % GRANULE != 0 || b + size > self.end - HEADER {
            return Err(FitError::Corrupt { addr: b, size: w });
        }
        Ok((b, w))
    }

    /// The usable bytes of the live block at `p`.
    ///
    /// # Safety
    /// [`Fit::init`]'s contract holds.
    pub unsafe fn usable_size(&self, p: usize) -> Result<usize, FitError> {
        // SAFETY: caller's contract.
        let (_, w) = unsafe { self.live_block(p)? };
        Ok((w & !FLAGS) - HEADER)
    }

    /// The usable bytes of the live block at `p`, read from its header without the
    /// allocator: for a thread that holds the caller's lock already (a signal handler that
    /// interrupted it), when no other thread can change the header.
    ///
    /// # Safety
    /// `p` is a live block of a span in use.
    pub unsafe fn usable_size_held(p: usize) -> usize {
        // SAFETY: caller's contract: the header 16 bytes before `p` is the block's.
        (unsafe { size_word(p - HEADER) } & !FLAGS) - HEADER
    }

    /// Frees the block at `p`. Returns whole pages the coalesced free block leaves unused and
    /// that are not dropped yet, `(start, bytes)`, for the caller to drop before anything else
    /// allocates (see `release_min` and `release_delay` in [`Fit::init`]: with a delay, the
    /// coalesced block's own pages come from [`Fit::advance`] later, unless it is reused).
    ///
    /// # Safety
    /// [`Fit::init`]'s contract holds. `p` was returned by this allocator; a freed block that
    /// was since handed out again cannot be told from a live one.
    pub unsafe fn free(&mut self, p: usize) -> Result<Release, FitError> {
        // SAFETY: caller's contract.
        unsafe {
            let (b, w) = self.live_block(p)?;
            let size = w & !FLAGS;
            self.stats.live -= size;
            self.stats.blocks -= 1;
            Ok(self.release_block(b, size, w & PREV_FREE != 0))
        }
    }

    /// Makes the used block `[b, b + size)` free, coalesced with free neighbours, and says
    /// which pages to drop.
    ///
    /// A free block with inner pages (whole pages past its header, links and range, before the
    /// next header) keeps the range of those that may still be resident; it is dropped, in one
    /// call, once it spans `release_min` bytes. Dropping every freed page at once cost sqlite
    /// 35k madvise calls (each a REMOVE event for the region) and as many faults, the same
    /// pages being reused at once. When the merged pieces' ranges lie far apart, the ones not
    /// kept are dropped now: one range spanning both would drop megabytes of pages already
    /// dropped again and again (a range spanning whole holes cost sqlite 39k calls, 213 GB in
    /// all), and the region's REMOVE handling costs per page.
    unsafe fn release_block(&mut self, b: usize, size: usize, prev_free: bool) -> Release {
        let (freed_start, freed_end) = (b, b + size);
        let (mut b, mut size) = (b, size);
        // The pieces that may hold resident pages, in address order: the previous free
        // block's, the freed block's (with the pages of merged neighbours' headers), the next
        // free block's.
        let mut freed = (page_down(freed_start), page_up(freed_end));
        let (mut before, mut after) = ((0, 0), (0, 0));
        // SAFETY: b's neighbours are blocks of the span (the end header bounds it).
        unsafe {
            let next = b + size;
            let nw = size_word(next);
            if nw & FREE != 0 {
                let ns = nw & !FLAGS;
                self.remove(next, ns);
                size += ns;
                freed = span_of(freed, (page_down(next), page_up(next + INNER_SKIP)));
                after = match has_inner(next, ns) {
                    true => undropped(next),
                    false => (page_down(next), page_up(next + ns)),
                };
            }
            if prev_free {
                let ps = word(b);
                b -= ps;
                self.remove(b, ps);
                size += ps;
                // (Its header is the merged block's: never an inner page.)
                before = match has_inner(b, ps) {
                    true => undropped(b),
                    false => (page_down(b), page_up(b + ps)),
                };
            }
            set_size_word(b, size | FREE);
            self.insert(b, size);
            let next = b + size;
            set_word(next, size);
            set_size_word(next, size_word(next) | PREV_FREE);
        }
        let mut out = Release::NONE;
        if !has_inner(b, size) {
            return out;
        }
        let inner = inner(b, size);
        let near = |a: (usize, usize), c: (usize, usize)| {
            a.0 >= a.1 || c.0 >= c.1 || c.0.saturating_sub(a.1) < self.release_min
        };
        // Pieces close to the freed one join it; the others are dropped now.
        let mut keep = freed;
        for piece in [before, after] {
            let piece = clip(piece, inner);
            if near(piece, keep) && near(keep, piece) {
                keep = span_of(keep, piece);
            } else {
                out.push(piece);
            }
        }
        let keep = clip(keep, inner);
        self.stats.released += out.bytes() as u64;
        if keep.0 < keep.1 && keep.1 - keep.0 >= self.release_min && self.release_delay == 0 {
            out.push(keep);
            self.stats.released += (keep.1 - keep.0) as u64;
            // SAFETY: b has inner pages, so its range words are past its links, in the block.
            unsafe { set_undropped(b, (0, 0)) };
            return out;
        }
        // SAFETY: as above.
        unsafe { set_undropped(b, keep) };
        if keep.0 < keep.1 && keep.1 - keep.0 >= self.release_min {
            // b is new to the list (its pieces left it through `remove`): not aging yet.
            if self.aging_len == AGING {
                // SAFETY: the oldest entry is a free block (see `remove`); out has room for a
                // third range (at most two pieces above).
                unsafe { self.drop_oldest(&mut out) };
            }
            self.aging[self.aging_len] = (b, self.now);
            self.aging_len += 1;
        }
        out
    }

    /// After the first `taken` bytes of the free block `b` (`size` bytes) went to a block:
    /// the free rest at `b + taken` keeps the part of the range that is still its own.
    unsafe fn split_range(b: usize, size: usize, taken: usize) {
        let (r, rest) = (b + taken, size - taken);
        if has_inner(r, rest) {
            // SAFETY: both are free blocks of the span with room for a range (checked).
            unsafe {
                let before = match has_inner(b, size) {
                    true => undropped(b),
                    false => (page_down(b), page_up(b + size)),
                };
                // The page that held b's header and range is the rest's now too.
                let before = span_of(before, (page_down(b), page_up(b + INNER_SKIP)));
                set_undropped(r, clip(before, inner(r, rest)));
            }
        }
    }

    /// Resizes the block at `p` to hold `req` bytes where it is: shrinking always works (the
    /// cut-off tail is freed), growing works when the block after it is free and large enough.
    ///
    /// # Safety
    /// As [`Fit::free`].
    pub unsafe fn resize_in_place(&mut self, p: usize, req: usize) -> Result<Resized, FitError> {
        // SAFETY: caller's contract.
        let (b, w) = unsafe { self.live_block(p)? };
        let Some(n) = block_size(req) else {
            return Ok(Resized::Move);
        };
        let size = w & !FLAGS;
        let prev_flag = w & PREV_FREE;
        if n <= size {
            if size - n < MIN_BLOCK {
                return Ok(Resized::Done {
                    release: Release::NONE,
                });
            }
            // SAFETY: the tail [b + n, b + size) becomes a used block of its own, then free.
            let release = unsafe {
                set_size_word(b, n | prev_flag);
                set_size_word(b + n, size - n);
                self.release_block(b + n, size - n, false)
            };
            self.stats.live -= size - n;
            return Ok(Resized::Done { release });
        }
        // SAFETY: the block after b is a block of the span (the end header bounds it).
        unsafe {
            let next = b + size;
            let nw = size_word(next);
            let ns = nw & !FLAGS;
            if nw & FREE == 0 || size + ns < n {
                return Ok(Resized::Move);
            }
            self.remove(next, ns);
            let total = size + ns;
            if total - n >= MIN_BLOCK {
                let r = b + n;
                let rest = total - n;
                Self::split_range(next, ns, n - size);
                set_size_word(r, rest | FREE);
                self.insert(r, rest);
                set_word(r + rest, rest);
                set_size_word(b, n | prev_flag);
                self.stats.live += n - size;
            } else {
                set_size_word(b, total | prev_flag);
                let after = b + total;
                set_size_word(after, size_word(after) & !PREV_FREE);
                self.stats.live += total - size;
            }
        }
        Ok(Resized::Done {
            release: Release::NONE,
        })
    }

    /// Walks every block and list and checks the invariants: sizes, flags, boundary tags, no
    /// two free blocks side by side, each free block in its list and the bitmaps saying so.
    /// Returns (live blocks, free blocks, free bytes). Touches the whole used span: for tests.
    ///
    /// # Safety
    /// [`Fit::init`]'s contract holds.
    pub unsafe fn check(&self) -> Result<(usize, usize, usize), String> {
        let mut at = self.base;
        let (mut live, mut free, mut free_bytes, mut live_bytes) = (0, 0, 0, 0);
        let mut prev: Option<(usize, bool)> = None;
        let end_header = self.end - HEADER;
        // SAFETY: every address read is a header inside the used span (checked as we go).
        unsafe {
            while at < end_header {
                let w = size_word(at);
                let size = w & !FLAGS;
                if size < MIN_BLOCK || size % GRANULE != 0 || at + size > end_header {
                    return Err(format!("block {at:#x}: bad size {w:#x}"));
                }
                let is_free = w & FREE != 0;
                let pf = w & PREV_FREE != 0;
                match prev {
                    None if pf => return Err(format!("block {at:#x}: PREV_FREE on the first")),
                    Some((ps, pfree)) => {
                        if pf != pfree {
                            return Err(format!(
                                "block {at:#x}: PREV_FREE {pf}, previous free {pfree}"
                            ));
                        }
                        if pf && word(at) != ps {
                            return Err(format!("block {at:#x}: prev_size {} != {ps}", word(at)));
                        }
                        if pf && is_free {
                            return Err(format!("block {at:#x}: two free blocks side by side"));
                        }
                    }
                    None => {}
                }
                if is_free {
                    free += 1;
                    free_bytes += size;
                    let (lo, hi) = inner(at, size);
                    let (ulo, uhi) = undropped(at);
                    if hi > lo && ulo < uhi && (ulo < lo || uhi > hi) {
                        return Err(format!(
                            "free block {at:#x}: range [{ulo:#x}, {uhi:#x}) outside its inner pages"
                        ));
                    }
                    let (f, s) = class(size);
                    let mut x = self.heads[f][s];
                    let mut found = false;
                    while x != 0 {
                        if x == at {
                            found = true;
                            break;
                        }
                        x = link_next(x);
                    }
                    if !found {
                        return Err(format!("free block {at:#x} ({size}) is not in its list"));
                    }
                } else {
                    live += 1;
                    live_bytes += size;
                }
                prev = Some((size, is_free));
                at += size;
            }
            if at != end_header {
                return Err(format!(
                    "blocks end at {at:#x}, the end header is at {end_header:#x}"
                ));
            }
            let ew = size_word(at);
            if ew & !PREV_FREE != 0 || (ew & PREV_FREE != 0) != prev.is_some_and(|p| p.1) {
                return Err(format!("end header {ew:#x}"));
            }
            let mut listed = 0;
            for f in 0..FL {
                for s in 0..SL {
                    let has = self.heads[f][s] != 0;
                    if has != (self.sl_map[f] & (1 << s) != 0) {
                        return Err(format!("second-level bitmap of ({f}, {s})"));
                    }
                    let mut x = self.heads[f][s];
                    let mut before = 0;
                    while x != 0 {
                        if class(size_word(x) & !FLAGS) != (f, s) || size_word(x) & FREE == 0 {
                            return Err(format!("block {x:#x} in list ({f}, {s}) does not belong"));
                        }
                        if link_prev(x) != before {
                            return Err(format!("block {x:#x}: broken back link"));
                        }
                        before = x;
                        x = link_next(x);
                        listed += 1;
                    }
                }
                if (self.sl_map[f] != 0) != (self.fl_map & (1 << f) != 0) {
                    return Err(format!("first-level bitmap of {f}"));
                }
            }
            if listed != free {
                return Err(format!("{listed} blocks listed, {free} free"));
            }
            for &(b, since) in &self.aging[..self.aging_len] {
                let w = size_word(b);
                let listed = {
                    let (f, s) = class(w & !FLAGS);
                    let mut x = self.heads[f][s];
                    while x != 0 && x != b {
                        x = link_next(x);
                    }
                    x == b
                };
                if w & FREE == 0 || !listed || !has_inner(b, w & !FLAGS) || since > self.now {
                    return Err(format!("aging entry {b:#x} is not a free block with pages"));
                }
            }
        }
        if live != self.stats.blocks || live_bytes != self.stats.live {
            return Err(format!(
                "stats say {} blocks / {} bytes, the walk {live} / {live_bytes}",
                self.stats.blocks, self.stats.live
            ));
        }
        Ok((live, free, free_bytes))
    }
}

#[cfg(test)]
mod tests;
