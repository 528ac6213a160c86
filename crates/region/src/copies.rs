//! Clean copies: a page faulted back from the store keeps its compressed copy there (while the
//! store has room, see `BackingStore::room_for_copies`), with a hash of the content it was
//! mapped with. When the page is evicted again, the page just moved out is hashed: unchanged,
//! it becomes Stored again without compressing or writing anything (the kernel keeps the swap
//! slot of a swapped-in page the same way); changed, the copy is discarded and the page is
//! stored anew. Read-mostly programs (a cache serving GETs) then evict at the cost of a move.
//!
//! Why a hash and not write protection: userfaultfd's WP_ASYNC with PAGEMAP_SCAN tells whether
//! a page was written, but not atomically with the `UFFDIO_MOVE` that takes it out (a write
//! between the scan and the move would be lost, and the move drops the uffd-wp bit). The hash
//! is taken of the page after it left the program's mapping, where nothing can write it any
//! more: race-free by construction. xxh3-128 costs ~0.1 µs per page (compressing one costs
//! 7–15 µs); a changed page passes for unchanged with probability 2^-128.
//!
//! Invariant (under the space's `inner` lock): a page has a hash here if and only if it is
//! Resident or Staged and the store holds a copy of exactly that content under its index.
//! Whoever takes the hash discards the store's copy (or makes it the page's Stored content).

use std::collections::VecDeque;

/// The hash a clean copy is checked against.
pub(crate) fn page_hash(page: &[u8]) -> u128 {
    xxhash_rust::xxh3::xxh3_128(page)
}

pub(crate) struct CleanCopies {
    /// Per page: the hash of the content its copy holds; 0 = no copy. Allocated zeroed, so
    /// only the parts of pages ever kept cost memory (as `StateTable`).
    hashes: Vec<u128>,
    /// Pages in the order their copies were kept, for giving copies up under pressure
    /// oldest first. Entries go stale (the copy was taken meanwhile) and are skipped.
    order: VecDeque<u32>,
    count: usize,
}

impl CleanCopies {
    pub fn new(pages: usize) -> CleanCopies {
        CleanCopies {
            hashes: vec![0; pages],
            order: VecDeque::new(),
            count: 0,
        }
    }

    /// Pages with a copy now.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Page `page` (without a copy) keeps the copy the store holds of content `hash`.
    pub fn keep(&mut self, page: u32, hash: u128) {
        let h = &mut self.hashes[page as usize];
        debug_assert_eq!(*h, 0, "page {page} already has a copy");
        if hash == 0 || *h != 0 {
            return; // 0 means none: such a page is simply stored again when evicted
        }
        *h = hash;
        self.count += 1;
        self.order.push_back(page);
        // Stale entries (copy taken, or taken and kept again: the page is listed twice) are
        // dropped once they outnumber live ones, keeping each page's newest place.
        if self.order.len() > 2 * self.count + 1024 {
            let mut seen = std::collections::HashSet::with_capacity(self.count);
            let hashes = &self.hashes;
            let mut newest: VecDeque<u32> = self
                .order
                .iter()
                .rev()
                .filter(|&&p| hashes[p as usize] != 0 && seen.insert(p))
                .copied()
                .collect();
            newest.make_contiguous().reverse();
            self.order = newest;
        }
    }

    /// The hash of page `page`'s copy, if it has one.
    pub fn hash_of(&self, page: u32) -> Option<u128> {
        Some(self.hashes[page as usize]).filter(|&h| h != 0)
    }

    /// Takes page `page`'s copy away: whether it had one (the caller discards or reuses it).
    pub fn take(&mut self, page: u32) -> bool {
        let h = &mut self.hashes[page as usize];
        if *h == 0 {
            return false;
        }
        *h = 0;
        self.count -= 1;
        true
    }

    /// Takes up to `max` copies away, oldest first, into `out` (the caller discards them). A
    /// page kept again may leave from its older place in the order: oldest first is a rule of
    /// thumb here, not a promise.
    pub fn take_oldest(&mut self, max: usize, out: &mut Vec<u32>, spare: impl Fn(u32) -> bool) {
        // Copies `spare` keeps go back to the front, in order; a bounded look, so a table of
        // spared copies does not make each call walk all of them.
        let mut spared = Vec::new();
        let mut looked = 0;
        while out.len() < max && looked < 4 * max + 64 {
            let Some(p) = self.order.pop_front() else {
                break;
            };
            looked += 1;
            if self.hash_of(p).is_some() && spare(p) {
                spared.push(p);
            } else if self.take(p) {
                out.push(p);
            }
        }
        for p in spared.into_iter().rev() {
            self.order.push_front(p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copies_are_kept_taken_and_given_up_oldest_first() {
        let mut c = CleanCopies::new(100);
        assert_eq!(c.hash_of(3), None);
        c.keep(3, 33);
        c.keep(7, 77);
        c.keep(9, 99);
        assert_eq!(c.count(), 3);
        assert_eq!(c.hash_of(7), Some(77));
        assert!(c.take(7));
        assert!(!c.take(7), "a copy is taken once");
        assert_eq!(c.hash_of(7), None);
        c.keep(7, 78); // kept again: listed twice now
        let mut out = Vec::new();
        c.take_oldest(2, &mut out, |_| false);
        assert_eq!(out, vec![3, 7], "7 leaves from its older place");
        assert_eq!(c.count(), 1);
        out.clear();
        c.take_oldest(10, &mut out, |_| false);
        assert_eq!(out, vec![9], "7's second entry is stale");
        assert_eq!(c.count(), 0);
        assert!(c.order.is_empty());
    }

    #[test]
    fn spared_copies_stay_and_keep_their_place() {
        let mut c = CleanCopies::new(10);
        for p in 0..5 {
            c.keep(p, u128::from(p) + 1);
        }
        let mut out = Vec::new();
        // Pages 0 and 2 are being evicted (their batch may still use the copy).
        c.take_oldest(2, &mut out, |p| p == 0 || p == 2);
        assert_eq!(out, vec![1, 3]);
        assert_eq!(c.hash_of(0), Some(1));
        assert_eq!(c.hash_of(2), Some(3));
        // Spared, they are still the oldest once no longer spared.
        out.clear();
        c.take_oldest(10, &mut out, |_| false);
        assert_eq!(out, vec![0, 2, 4]);
        assert_eq!(c.count(), 0);
        // Everything spared: the call looks a bounded way and takes nothing.
        for p in 0..10 {
            c.keep(p, 9);
        }
        out.clear();
        c.take_oldest(3, &mut out, |_| true);
        assert!(out.is_empty());
        assert_eq!(c.count(), 10);
    }

    #[test]
    fn stale_entries_do_not_pile_up() {
        let mut c = CleanCopies::new(10);
        for round in 0..10_000u32 {
            let p = round % 10;
            c.take(p);
            c.keep(p, u128::from(round) + 1);
        }
        assert_eq!(c.count(), 10);
        assert!(c.order.len() <= 2 * 10 + 1025, "{}", c.order.len());
        // The newest place of each page survives a compaction: the last ten kept, in order.
        let mut out = Vec::new();
        c.take_oldest(10, &mut out, |_| false);
        assert_eq!(out.len(), 10);
        assert_eq!(c.count(), 0);
    }

    #[test]
    fn the_hash_tells_one_changed_byte() {
        let mut page = vec![7u8; 4096];
        let h = page_hash(&page);
        assert_ne!(h, 0);
        page[4095] = 8;
        assert_ne!(page_hash(&page), h);
        page[4095] = 7;
        assert_eq!(page_hash(&page), h);
    }
}
