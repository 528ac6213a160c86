//! Page runs for spans, carved out of large anonymous mappings ("chunks").
//!
//! Mapping every span separately would hit the kernel's `vm.max_map_count` (65530) long before
//! a large pool is full, so the pool maps 2 MiB chunks and hands out runs of contiguous pages
//! inside them, tracked by one bitmap per chunk. A freed run's pages go back to the OS at once
//! with `madvise(MADV_DONTNEED)`; a chunk whose pages are all free is unmapped, except that one
//! empty chunk is kept mapped (it holds no memory) so a pool oscillating around a chunk boundary
//! does not map and unmap on every span.

use std::ptr::NonNull;

use zmem_os::sync::Mutex;

use crate::{PoolError, PAGE_SIZE};

/// Pages per chunk.
pub(crate) const CHUNK_PAGES: usize = 512;
/// Bytes per chunk (2 MiB).
pub(crate) const CHUNK_BYTES: usize = CHUNK_PAGES * PAGE_SIZE;
const WORDS: usize = CHUNK_PAGES / 64;
const SUMMARY_WORDS: usize = CHUNK_PAGES / 64 + 1;

/// A pointer into pool memory that may be shared between threads.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RawPtr(pub(crate) NonNull<u8>);

// SAFETY: RawPtr is only an address of pool-owned mmap'd memory; every access through it is
// synchronised by the pool (class locks for object bytes, the chunk mutex for mapping changes).
unsafe impl Send for RawPtr {}
// SAFETY: as above; sharing the address itself is harmless.
unsafe impl Sync for RawPtr {}

/// A run of contiguous pages inside one chunk, owned by one span.
#[derive(Debug)]
pub(crate) struct Run {
    pub ptr: RawPtr,
    pub chunk: u32,
    pub page: u32,
    pub pages: u32,
}

struct Chunk {
    base: RawPtr,
    /// Bit i set = page i in use.
    used: [u64; WORDS],
    used_pages: u32,
    /// Longest free run (exact); the chunk is listed in `Inner::by_longest[longest]`.
    longest: u32,
    /// Position in that list.
    pos: u32,
}

struct Inner {
    chunks: Vec<Option<Chunk>>,
    free_ids: Vec<u32>,
    /// by_longest[n] = ids of chunks whose longest free run is n pages (n >= 1).
    by_longest: Vec<Vec<u32>>,
    /// Bit n set = by_longest[n] is non-empty.
    summary: [u64; SUMMARY_WORDS],
    /// Mapped chunks with no page in use.
    empty: u32,
    mapped: u32,
}

/// The page-run allocator shared by all classes of a pool.
pub(crate) struct ChunkAlloc {
    inner: Mutex<Inner>,
}

/// First page index >= `from` whose used bit equals `set`.
fn next_with(used: &[u64; WORDS], from: usize, set: bool) -> Option<usize> {
    let mut w = from / 64;
    if w >= WORDS {
        return None;
    }
    let pick = |x: u64| if set { x } else { !x };
    let mut word = pick(used[w]) & (!0u64 << (from % 64));
    loop {
        if word != 0 {
            return Some(w * 64 + word.trailing_zeros() as usize);
        }
        w += 1;
        if w == WORDS {
            return None;
        }
        word = pick(used[w]);
    }
}

/// The free runs of a chunk as (start, length), in address order.
fn free_runs(used: &[u64; WORDS]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut pos = 0;
    std::iter::from_fn(move || {
        let start = next_with(used, pos, false)?;
        let end = next_with(used, start, true).unwrap_or(CHUNK_PAGES);
        pos = end;
        Some((start, end - start))
    })
}

/// Best fit: the start of the smallest free run of at least `need` pages.
fn best_run(used: &[u64; WORDS], need: usize) -> Option<usize> {
    let mut best: Option<(usize, usize)> = None;
    for (start, len) in free_runs(used) {
        if len >= need && best.is_none_or(|(_, l)| len < l) {
            best = Some((start, len));
            if len == need {
                break;
            }
        }
    }
    best.map(|(start, _)| start)
}

/// Length of the longest free run.
fn longest_run(used: &[u64; WORDS]) -> usize {
    free_runs(used).map(|(_, len)| len).max().unwrap_or(0)
}

fn mark(used: &mut [u64; WORDS], start: usize, len: usize, on: bool) {
    for i in start..start + len {
        if on {
            used[i / 64] |= 1u64 << (i % 64);
        } else {
            used[i / 64] &= !(1u64 << (i % 64));
        }
    }
}

/// Maps one chunk of anonymous memory, in 4 KiB pages: a huge page would make the resident size
/// exceed the pages counted in live spans. The chunk table owns it from here (unmap_chunk).
fn map_chunk() -> Result<RawPtr, PoolError> {
    let m = zmem_os::Mapping::new(CHUNK_BYTES, zmem_os::MappingFlags::RESERVE_SMALL_PAGES)
        .map_err(|e| PoolError::OutOfMemory(format!("mmap of a {CHUNK_BYTES}-byte chunk: {e}")))?;
    Ok(RawPtr(m.into_raw().0))
}

/// madvise on pool memory; errors are ignored (the advice is an optimisation or a release of
/// memory that nobody references any more).
fn advise(ptr: *mut u8, len: usize, advice: libc::c_int) {
    // SAFETY: callers pass a page-aligned range inside a live chunk mapping that no span or
    // object references (DONTNEED) or the whole fresh chunk (NOHUGEPAGE); madvise does not
    // create Rust references.
    unsafe {
        libc::madvise(ptr.cast(), len, advice);
    }
}

/// Unmaps a chunk that no span uses any more.
fn unmap_chunk(base: RawPtr) {
    // SAFETY: the chunk was mapped by map_chunk with CHUNK_BYTES and no run in it is in use,
    // so no pointer into it will be dereferenced again.
    unsafe {
        libc::munmap(base.0.as_ptr().cast(), CHUNK_BYTES);
    }
}

impl Inner {
    /// Moves chunk `id` to the list for its current longest free run.
    fn relist(&mut self, id: usize, longest: u32) {
        let Some(c) = self.chunks[id].as_mut() else {
            return;
        };
        let (old, pos) = (c.longest, c.pos);
        c.longest = longest;
        if old == longest {
            return;
        }
        if old > 0 {
            let list = &mut self.by_longest[old as usize];
            list.swap_remove(pos as usize);
            if let Some(&moved) = list.get(pos as usize) {
                if let Some(m) = self.chunks[moved as usize].as_mut() {
                    m.pos = pos;
                }
            }
            if list.is_empty() {
                self.summary[old as usize / 64] &= !(1u64 << (old % 64));
            }
        }
        if longest > 0 {
            let list = &mut self.by_longest[longest as usize];
            let pos = list.len() as u32;
            list.push(id as u32);
            self.summary[longest as usize / 64] |= 1u64 << (longest % 64);
            if let Some(c) = self.chunks[id].as_mut() {
                c.pos = pos;
            }
        }
    }

    /// The smallest n >= need with chunks whose longest free run is n.
    fn smallest_fit(&self, need: usize) -> Option<usize> {
        let mut w = need / 64;
        if w >= SUMMARY_WORDS {
            return None;
        }
        let mut word = self.summary[w] & (!0u64 << (need % 64));
        loop {
            if word != 0 {
                return Some(w * 64 + word.trailing_zeros() as usize);
            }
            w += 1;
            if w == SUMMARY_WORDS {
                return None;
            }
            word = self.summary[w];
        }
    }
}

impl ChunkAlloc {
    pub(crate) fn new() -> ChunkAlloc {
        ChunkAlloc {
            inner: Mutex::new(Inner {
                chunks: Vec::new(),
                free_ids: Vec::new(),
                by_longest: (0..=CHUNK_PAGES).map(|_| Vec::new()).collect(),
                summary: [0; SUMMARY_WORDS],
                empty: 0,
                mapped: 0,
            }),
        }
    }

    /// Takes `pages` contiguous pages (1..=CHUNK_PAGES), mapping a new chunk if none has room.
    /// Best fit: the chunk whose longest free run is the shortest that fits (so partly used
    /// chunks fill up before empty ones), and in it the shortest free run that fits.
    pub(crate) fn alloc(&self, pages: usize) -> Result<Run, PoolError> {
        if pages == 0 || pages > CHUNK_PAGES {
            return Err(PoolError::OutOfMemory(format!(
                "span of {pages} pages does not fit a chunk"
            )));
        }
        let mut g = self.inner.lock();
        let inner = &mut *g;
        if let Some(n) = inner.smallest_fit(pages) {
            if let Some(&id) = inner.by_longest[n].last() {
                return Ok(Self::take(inner, id as usize, pages));
            }
        }
        // No room: map a new chunk.
        if inner.free_ids.is_empty() && inner.chunks.len() >= u32::MAX as usize {
            return Err(PoolError::OutOfMemory("too many chunks".into()));
        }
        inner
            .chunks
            .try_reserve(1)
            .map_err(|e| PoolError::OutOfMemory(e.to_string()))?;
        inner.by_longest[CHUNK_PAGES]
            .try_reserve(1)
            .map_err(|e| PoolError::OutOfMemory(e.to_string()))?;
        let base = map_chunk()?;
        let chunk = Chunk {
            base,
            used: [0; WORDS],
            used_pages: 0,
            longest: 0,
            pos: 0,
        };
        let id = match inner.free_ids.pop() {
            Some(id) => {
                inner.chunks[id as usize] = Some(chunk);
                id as usize
            }
            None => {
                inner.chunks.push(Some(chunk));
                inner.chunks.len() - 1
            }
        };
        inner.mapped += 1;
        inner.empty += 1;
        inner.relist(id, CHUNK_PAGES as u32);
        Ok(Self::take(inner, id, pages))
    }

    /// Takes `pages` pages from chunk `id`, whose longest free run is at least that long.
    fn take(inner: &mut Inner, id: usize, pages: usize) -> Run {
        let Some(c) = inner.chunks[id].as_mut() else {
            unreachable!("take from a missing chunk");
        };
        let start = best_run(&c.used, pages).unwrap_or(0);
        mark(&mut c.used, start, pages, true);
        if c.used_pages == 0 {
            inner.empty -= 1;
        }
        c.used_pages += pages as u32;
        // SAFETY: start + pages <= CHUNK_PAGES, so the offset stays inside the chunk mapping.
        let ptr = unsafe { c.base.0.add(start * PAGE_SIZE) };
        let longest = longest_run(&c.used) as u32;
        inner.relist(id, longest);
        Run {
            ptr: RawPtr(ptr),
            chunk: id as u32,
            page: start as u32,
            pages: pages as u32,
        }
    }

    /// Gives a run's pages back to the OS and makes them available for new spans.
    /// The caller guarantees nothing references the run any more.
    pub(crate) fn free(&self, run: Run) {
        advise(
            run.ptr.0.as_ptr(),
            run.pages as usize * PAGE_SIZE,
            libc::MADV_DONTNEED,
        );
        let mut unmap = None;
        {
            let mut g = self.inner.lock();
            let inner = &mut *g;
            let id = run.chunk as usize;
            let Some(Some(c)) = inner.chunks.get_mut(id) else {
                debug_assert!(false, "free of a run in a missing chunk");
                return;
            };
            mark(&mut c.used, run.page as usize, run.pages as usize, false);
            c.used_pages -= run.pages;
            let now_empty = c.used_pages == 0;
            let base = c.base;
            let longest = longest_run(&c.used) as u32;
            if now_empty && inner.empty >= 1 {
                inner.relist(id, 0);
                inner.chunks[id] = None;
                inner.free_ids.push(id as u32);
                inner.mapped -= 1;
                unmap = Some(base);
            } else {
                if now_empty {
                    inner.empty += 1;
                }
                inner.relist(id, longest);
            }
        }
        if let Some(base) = unmap {
            unmap_chunk(base);
        }
    }

    /// Number of chunks currently mapped.
    pub(crate) fn mapped_chunks(&self) -> u64 {
        self.inner.lock().mapped as u64
    }

    /// Approximate bytes of bookkeeping.
    pub(crate) fn metadata_bytes(&self) -> u64 {
        let g = self.inner.lock();
        (g.chunks.capacity() * std::mem::size_of::<Option<Chunk>>()
            + g.free_ids.capacity() * 4
            + g.by_longest.iter().map(|l| l.capacity() * 4).sum::<usize>()) as u64
    }
}

impl Drop for ChunkAlloc {
    fn drop(&mut self) {
        let inner = self.inner.get_mut();
        for c in inner.chunks.drain(..).flatten() {
            unmap_chunk(c.base);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_search() {
        let mut used = [0u64; WORDS];
        assert_eq!(best_run(&used, 512), Some(0));
        assert_eq!(longest_run(&used), 512);
        mark(&mut used, 0, 3, true);
        mark(&mut used, 10, 100, true);
        assert_eq!(best_run(&used, 7), Some(3));
        assert_eq!(
            best_run(&used, 3),
            Some(3),
            "best fit picks the shorter run"
        );
        assert_eq!(best_run(&used, 8), Some(110));
        assert_eq!(longest_run(&used), 402);
        mark(&mut used, 110, 402, true);
        assert_eq!(best_run(&used, 8), None);
        assert_eq!(longest_run(&used), 7);
        mark(&mut used, 3, 7, true);
        assert_eq!(longest_run(&used), 0);
        assert_eq!(best_run(&used, 1), None);
        mark(&mut used, 3, 7, false);
        assert_eq!(next_with(&used, 0, false), Some(3));
        assert_eq!(next_with(&used, 110, false), None);
    }

    #[test]
    fn alloc_free_reuse_and_unmap() {
        let a = ChunkAlloc::new();
        let r1 = a.alloc(16).unwrap();
        let r2 = a.alloc(400).unwrap();
        assert_eq!(r1.chunk, r2.chunk);
        let r3 = a.alloc(100).unwrap();
        assert_ne!(r3.chunk, r1.chunk);
        assert_eq!(a.mapped_chunks(), 2);
        // Write to every page to prove the memory is usable.
        for r in [&r1, &r2, &r3] {
            // SAFETY: the run is ours and mapped read-write.
            unsafe { std::ptr::write_bytes(r.ptr.0.as_ptr(), 0xab, r.pages as usize * PAGE_SIZE) };
        }
        a.free(r3);
        assert_eq!(a.mapped_chunks(), 2, "one empty chunk is kept");
        a.free(r1);
        a.free(r2);
        assert_eq!(a.mapped_chunks(), 1);
        let r4 = a.alloc(512).unwrap();
        // SAFETY: freshly taken run; DONTNEED'ed pages read back as zero.
        let first = unsafe { *r4.ptr.0.as_ptr() };
        assert_eq!(first, 0);
        a.free(r4);
        assert!(a.alloc(0).is_err());
        assert!(a.alloc(513).is_err());
    }
}
