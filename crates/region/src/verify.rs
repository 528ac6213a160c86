//! `RegionConfig::verify_pages`, a diagnostic: the checksum of every page as it was stored at
//! eviction, checked when the page is read back on a fault. It tells a wrong object (the store
//! gave back other bytes than it was given: a mismatch, counted, and the page poisoned rather
//! than mapped) from right bytes at the wrong time (no mismatch, yet the program saw wrong
//! data: a race in the region's bookkeeping). Checked only on the creator's space.
//!
//! Under the space's `inner` lock: a page's sum is set when it becomes Stored (`settle`), and
//! read when a fault takes it to Faulting; nothing changes it while it is Faulting.

/// The checksum kept per page (xxh3-64, never 0: 0 means "none").
pub(crate) fn page_sum(page: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(page) | 1
}

pub(crate) struct Sums {
    /// Per page: the sum of the content it was last stored with; 0 = never stored. Allocated
    /// zeroed, so only the parts of pages ever stored cost memory (as `StateTable`).
    sums: Vec<u64>,
}

impl Sums {
    pub fn new(pages: usize) -> Sums {
        Sums {
            sums: vec![0; pages],
        }
    }

    /// Page `page` was stored with content of sum `sum`.
    pub fn stored(&mut self, page: u32, sum: u64) {
        self.sums[page as usize] = sum;
    }

    /// The sum page `page` was last stored with, if any.
    pub fn expected(&self, page: usize) -> Option<u64> {
        Some(self.sums[page]).filter(|&s| s != 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sum_is_never_zero_and_follows_the_content() {
        let mut page = vec![0u8; 4096];
        let zero = page_sum(&page);
        assert_ne!(zero, 0);
        page[4095] = 1;
        assert_ne!(page_sum(&page), zero);
        let mut sums = Sums::new(8);
        assert_eq!(sums.expected(3), None);
        sums.stored(3, zero);
        assert_eq!(sums.expected(3), Some(zero));
        assert_eq!(sums.expected(4), None);
    }
}
