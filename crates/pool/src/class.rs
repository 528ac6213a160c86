//! Size classes: which slot size and how many pages per span each object size gets.

use std::sync::atomic::{AtomicPtr, Ordering::*};

use crate::PAGE_SIZE;

/// Distance between consecutive size classes (and the smallest class).
pub(crate) const CLASS_STEP: usize = 16;
/// Largest `max_object_size` a pool accepts (keeps class ids in 16 bits and spans inside a chunk).
pub(crate) const MAX_OBJECT_SIZE_LIMIT: usize = 1 << 20;
/// Largest accepted `max_span_pages` (keeps slot indices in 13 bits: 32 pages of 16-byte slots).
pub(crate) const MAX_SPAN_PAGES_LIMIT: usize = 32;
/// Most slots a span may have (slot indices are stored in 13 bits).
pub(crate) const MAX_SLOTS_PER_SPAN: usize = 1 << 13;
/// Most pages a span for objects larger than a page may have unless one object needs more.
const MAX_LARGE_SPAN_PAGES: usize = 128;
/// Merged classes may span at most this many bytes so `slot size - length` fits in 12 bits.
const MAX_MERGE_RANGE: usize = 4096 - CLASS_STEP;
/// A tail waste of at most 1/64 of the span is good enough: prefer the smallest such span
/// (fewer bytes stranded in the one partially used span each class keeps after compaction).
const GOOD_WASTE_DIV: usize = 64;

/// Geometry of one size class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct ClassInfo {
    /// Slot size in bytes (a multiple of 16).
    pub size: u32,
    /// Pages per span.
    pub pages: u32,
    /// Slots per span (>= 1).
    pub objs: u32,
}

/// All classes of a pool plus the map from rounded object size to class id.
#[derive(Clone)]
pub(crate) struct ClassTable {
    pub infos: Vec<ClassInfo>,
    /// `size_to_class[(len - 1) / 16]` is the class id for an object of `len` bytes.
    pub size_to_class: Vec<u16>,
}

/// Waste of `objs` slots of `size` bytes in `pages` pages, as the fraction num/den.
fn waste(size: usize, pages: usize) -> (usize, usize, usize) {
    let span = pages * PAGE_SIZE;
    let objs = span / size;
    (span - objs * size, span, objs)
}

/// The page counts a span for slot size `size` may have: from what one slot needs up to
/// `max_span_pages` (objects up to a page) or up to four slots' worth, at most
/// `MAX_LARGE_SPAN_PAGES` unless one slot needs more (larger objects).
fn span_pages_range(size: usize, max_span_pages: usize) -> (usize, usize) {
    let min_pages = size.div_ceil(PAGE_SIZE).max(1);
    let max_pages = if size <= PAGE_SIZE {
        max_span_pages
    } else {
        max_span_pages
            .max((4 * min_pages).min(MAX_LARGE_SPAN_PAGES))
            .max(min_pages)
    };
    (min_pages, max_pages)
}

/// Chooses pages per span for slot size `size`: the page count minimising the tail-waste
/// fraction, except that the smallest count whose waste is within max(best, 1/64) wins. In one
/// pass: if any count is within 1/64 the first such count wins (as good as the best or not), and
/// otherwise the first count with the least waste.
pub(crate) fn choose_pages(size: usize, max_span_pages: usize) -> (usize, usize) {
    let (min_pages, max_pages) = span_pages_range(size, max_span_pages);
    // Best waste fraction (num/den) so far; compare fractions by cross-multiplying.
    let mut best: Option<(usize, usize, usize, usize)> = None; // (waste, span, pages, objs)
    for p in min_pages..=max_pages {
        let (w, span, objs) = waste(size, p);
        if objs == 0 || objs > MAX_SLOTS_PER_SPAN {
            continue;
        }
        if w * GOOD_WASTE_DIV <= span {
            return (p, objs);
        }
        if best.is_none_or(|(bw, bspan, _, _)| w * bspan < bw * span) {
            best = Some((w, span, p, objs));
        }
    }
    // (min_pages, 1) is unreachable for valid configurations (min_pages always holds one
    // object), but stay total.
    best.map_or((min_pages, 1), |(_, _, p, objs)| (p, objs))
}

/// The table built last, kept for the next pool of the same geometry: building it is ~0.5 ms
/// of CPU (every object size tries every span length), and a process under zmem makes pools at
/// start-up and at every fork. A pointer swapped in once and never freed, not a lock: a fork in
/// the middle of a build must not leave the child waiting for it.
struct Cached {
    max_object_size: usize,
    max_span_pages: usize,
    table: ClassTable,
}
static CACHED: AtomicPtr<Cached> = AtomicPtr::new(std::ptr::null_mut());

impl ClassTable {
    /// The classes for `max_object_size` and `max_span_pages` (see [`ClassTable::build`]),
    /// copied from the cached table when the geometry is the same.
    pub(crate) fn for_config(max_object_size: usize, max_span_pages: usize) -> ClassTable {
        // SAFETY: a published `Cached` is never freed or changed.
        if let Some(c) = unsafe { CACHED.load(Acquire).as_ref() } {
            if c.max_object_size == max_object_size && c.max_span_pages == max_span_pages {
                return c.table.clone();
            }
            return ClassTable::build(max_object_size, max_span_pages);
        }
        let table = ClassTable::build(max_object_size, max_span_pages);
        let c = Box::into_raw(Box::new(Cached {
            max_object_size,
            max_span_pages,
            table: table.clone(),
        }));
        if CACHED
            .compare_exchange(std::ptr::null_mut(), c, AcqRel, Acquire)
            .is_err()
        {
            // SAFETY: `c` was never published.
            drop(unsafe { Box::from_raw(c) });
        }
        table
    }

    /// Builds the classes for objects of 1..=max_object_size bytes. Adjacent 16-byte classes
    /// with the same pages per span and slots per span are merged into the largest of them
    /// (as zsmalloc does): they waste the same memory per object, and fewer classes mean fewer
    /// partially used spans.
    pub(crate) fn build(max_object_size: usize, max_span_pages: usize) -> ClassTable {
        let nsizes = max_object_size.div_ceil(CLASS_STEP);
        let geo: Vec<(usize, usize)> = (1..=nsizes)
            .map(|k| choose_pages(k * CLASS_STEP, max_span_pages))
            .collect();
        // rep[k] = index (0-based) of the size that size index k is merged into.
        let mut rep = vec![0usize; nsizes];
        let mut cur: Option<usize> = None;
        for k in (0..nsizes).rev() {
            match cur {
                Some(r) if geo[r] == geo[k] && (r - k) * CLASS_STEP <= MAX_MERGE_RANGE => {
                    rep[k] = r;
                }
                _ => {
                    cur = Some(k);
                    rep[k] = k;
                }
            }
        }
        let mut id_of = vec![0u16; nsizes];
        let mut infos = Vec::new();
        for k in 0..nsizes {
            if rep[k] == k {
                id_of[k] = infos.len() as u16;
                let (pages, objs) = geo[k];
                infos.push(ClassInfo {
                    size: ((k + 1) * CLASS_STEP) as u32,
                    pages: pages as u32,
                    objs: objs as u32,
                });
            }
        }
        let size_to_class = (0..nsizes).map(|k| id_of[rep[k]]).collect();
        ClassTable {
            infos,
            size_to_class,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_fits_its_class() {
        for &(max, spp) in &[(64 * 1024 + 64, 16), (4096, 1), (MAX_OBJECT_SIZE_LIMIT, 32)] {
            let t = ClassTable::build(max, spp);
            assert!(t.infos.len() <= u16::MAX as usize + 1);
            for len in 1..=max {
                let c = t.infos[t.size_to_class[(len - 1) / CLASS_STEP] as usize];
                let size = c.size as usize;
                assert!(size >= len, "len {len} class {c:?}");
                assert!(size - len < 4096, "delta too large for {len}: {c:?}");
                assert!(c.objs >= 1 && c.objs as usize <= MAX_SLOTS_PER_SPAN);
                assert!(c.objs as usize * size <= c.pages as usize * PAGE_SIZE);
                assert!(c.pages as usize <= crate::chunk::CHUNK_PAGES);
                if len <= PAGE_SIZE {
                    assert!(c.pages as usize <= spp);
                }
            }
            // Class sizes strictly increase with ids.
            for w in t.infos.windows(2) {
                assert!(w[0].size < w[1].size);
            }
        }
    }

    /// The two-pass definition `choose_pages` implements in one pass.
    fn choose_pages_model(size: usize, max_span_pages: usize) -> (usize, usize) {
        let (min_pages, max_pages) = span_pages_range(size, max_span_pages);
        let ok = |p: &usize| {
            let (_, _, objs) = waste(size, *p);
            objs > 0 && objs <= MAX_SLOTS_PER_SPAN
        };
        let ratio = |p: usize| {
            let (w, span, _) = waste(size, p);
            w as f64 / span as f64
        };
        let Some(best) = (min_pages..=max_pages)
            .filter(ok)
            .map(ratio)
            .min_by(|a, b| a.total_cmp(b))
        else {
            return (min_pages, 1);
        };
        let p = (min_pages..=max_pages)
            .filter(ok)
            .find(|&p| ratio(p) * GOOD_WASTE_DIV as f64 <= 1.0 || ratio(p) <= best)
            .unwrap();
        (p, waste(size, p).2)
    }

    #[test]
    fn choose_pages_matches_its_two_pass_definition() {
        for spp in [1, 4, 16, 32] {
            for k in 1..=MAX_OBJECT_SIZE_LIMIT / CLASS_STEP {
                let size = k * CLASS_STEP;
                assert_eq!(
                    choose_pages(size, spp),
                    choose_pages_model(size, spp),
                    "{size} {spp}"
                );
            }
        }
    }

    #[test]
    fn a_cached_table_is_the_table_of_its_own_geometry() {
        // Whichever geometry was cached first (other tests make pools too), every call must
        // give what a fresh build gives for the geometry asked for.
        for &(max, spp) in &[(8192, 4), (4096, 1), (8192, 4), (4096, 1), (8192, 8)] {
            let t = ClassTable::for_config(max, spp);
            let b = ClassTable::build(max, spp);
            assert_eq!(t.infos, b.infos, "{max} {spp}");
            assert_eq!(t.size_to_class, b.size_to_class, "{max} {spp}");
        }
    }

    #[test]
    fn small_classes_have_little_tail_waste() {
        let t = ClassTable::build(64 * 1024 + 64, 16);
        let (mut obj, mut mem) = (0f64, 0f64);
        for len in 500..=4096usize {
            let c = t.infos[t.size_to_class[(len - 1) / CLASS_STEP] as usize];
            obj += len as f64;
            mem += (c.pages as f64 * PAGE_SIZE as f64) / c.objs as f64;
        }
        let overhead = mem / obj;
        assert!(overhead < 1.02, "overhead {overhead}");
        // 16-byte objects pack a page exactly.
        let c = t.infos[t.size_to_class[0] as usize];
        assert_eq!((c.size, c.pages, c.objs), (16, 1, 256));
        // Page-sized objects take exactly a page each.
        let c = t.infos[t.size_to_class[(4096 - 1) / CLASS_STEP] as usize];
        assert_eq!((c.size, c.pages, c.objs), (4096, 1, 1));
    }
}
