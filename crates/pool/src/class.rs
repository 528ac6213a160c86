//! Size classes: which slot size and how many pages per span each object size gets.

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

/// Chooses pages per span for slot size `size`: the page count minimising the tail-waste
/// fraction, except that the smallest count whose waste is within max(best, 1/64) wins.
pub(crate) fn choose_pages(size: usize, max_span_pages: usize) -> (usize, usize) {
    let min_pages = size.div_ceil(PAGE_SIZE).max(1);
    let max_pages = if size <= PAGE_SIZE {
        max_span_pages
    } else {
        max_span_pages
            .max((4 * min_pages).min(MAX_LARGE_SPAN_PAGES))
            .max(min_pages)
    };
    // Best waste fraction (num/den) over the range; compare fractions by cross-multiplying.
    let mut best = (usize::MAX, 1usize);
    for p in min_pages..=max_pages {
        let (w, span, objs) = waste(size, p);
        if objs == 0 || objs > MAX_SLOTS_PER_SPAN {
            continue;
        }
        if best.0 == usize::MAX || w * best.1 < best.0 * span {
            best = (w, span);
        }
    }
    for p in min_pages..=max_pages {
        let (w, span, objs) = waste(size, p);
        if objs == 0 || objs > MAX_SLOTS_PER_SPAN {
            continue;
        }
        let good = w * GOOD_WASTE_DIV <= span;
        let as_good_as_best = w * best.1 <= best.0 * span;
        if good || as_good_as_best {
            return (p, objs);
        }
    }
    // Unreachable for valid configurations (min_pages always holds one object), but stay total.
    (min_pages, 1)
}

impl ClassTable {
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
