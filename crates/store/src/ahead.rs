//! Read-ahead from the SSD log: when a fault reads a page's object from the log, the objects
//! of its neighbouring pages that lie near it in the same segment come along in the same
//! device read (pages evicted together were written together), and wait here, still sealed,
//! for their own faults. The kernel does the same for swap (`vm.page-cluster`, VMA-based
//! read-ahead), and memcached's ~4 KiB items, which span two pages, need it: without it the
//! second page of an item is a second device read right after the first.
//!
//! The pages stay LOWER: a page read from here keeps its log copy as its clean copy, exactly
//! as a page read with its own device read does. An entry is used only for the page and the
//! location it was read for and only if the log still holds that object from the same segment
//! write (`Log::open_fetched` checks the generation and the seal); anything else is read again.
//!
//! How much to read ahead follows the hits, as the kernel's `swapin_nr_pages` does: the window
//! grows to the next power of two above the hits since the last miss plus two, shrinks by at
//! most half per miss, and without hits reads one neighbour only where the fault is next to
//! the last one. Random access (no hits) thus reads single objects, and two-page items get
//! their second page along.
//!
//! Nothing here allocates after start-up: on the signal route a fault is served in a signal
//! handler.

use zmem_tier::Location;

/// Objects kept read ahead (per store). Each holds at most one sealed page object.
pub(crate) const AHEAD_ENTRIES: usize = 64;

/// The read-ahead window: pages a log read brings, the faulting one included.
#[derive(Debug)]
pub(crate) struct Window {
    max: usize,
    prev: usize,
    last: u64,
    hits: u64,
}

impl Window {
    /// `max` pages at most per read (1: no read-ahead).
    pub(crate) fn new(max: usize) -> Window {
        Window {
            max: max.max(1),
            prev: 1,
            last: u64::MAX,
            hits: 0,
        }
    }

    /// A read was served from what was read ahead.
    pub(crate) fn hit(&mut self) {
        self.hits += 1;
    }

    /// Pages to read for a fault on `index` that was not read ahead, and where to look for
    /// them: after it (a walk up from the last such fault), before it (a walk down), or on
    /// both sides, nearest first (no walk).
    pub(crate) fn pages(&mut self, index: u64) -> (usize, Side) {
        let hits = std::mem::take(&mut self.hits);
        let mut pages = if hits == 0 {
            if index.abs_diff(self.last) == 1 {
                2
            } else {
                1
            }
        } else {
            (hits as usize).saturating_add(2).next_power_of_two()
        };
        pages = pages.max(self.prev / 2).min(self.max);
        // A walk steps at most one window from one miss to the next.
        let near = index.abs_diff(self.last) <= 2 * self.prev as u64;
        let side = match index.cmp(&self.last) {
            std::cmp::Ordering::Greater if near => Side::After,
            std::cmp::Ordering::Less if near => Side::Before,
            _ => Side::Both,
        };
        self.prev = pages;
        self.last = index;
        (pages, side)
    }
}

/// Where the pages read along with a page are looked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Side {
    After,
    Before,
    Both,
}

/// One object read ahead. `len` 0: empty.
struct Entry {
    index: u64,
    loc: u64,
    generation: u64,
    /// Payload bytes (the sealed bytes are `sealed` of `buf`).
    len: usize,
    sealed: usize,
    buf: Box<[u8]>,
}

/// The objects read ahead, oldest replaced first.
pub(crate) struct Ahead {
    entries: Box<[Entry]>,
    next: usize,
    pub(crate) window: Window,
}

impl Ahead {
    /// Room for [`AHEAD_ENTRIES`] sealed objects of up to `max_sealed` bytes each.
    pub(crate) fn new(max_pages: usize, max_sealed: usize) -> Ahead {
        Ahead {
            entries: (0..AHEAD_ENTRIES)
                .map(|_| Entry {
                    index: 0,
                    loc: 0,
                    generation: 0,
                    len: 0,
                    sealed: 0,
                    buf: vec![0u8; max_sealed].into_boxed_slice(),
                })
                .collect(),
            next: 0,
            window: Window::new(max_pages),
        }
    }

    /// Keeps an object read ahead for page `index` (too large for an entry: not kept).
    pub(crate) fn put(
        &mut self,
        index: u64,
        loc: Location,
        generation: u64,
        len: usize,
        sealed: &[u8],
    ) {
        let e = &mut self.entries[self.next];
        if sealed.len() > e.buf.len() || len == 0 {
            return;
        }
        e.buf[..sealed.len()].copy_from_slice(sealed);
        (e.index, e.loc, e.generation, e.len, e.sealed) =
            (index, loc.0, generation, len, sealed.len());
        self.next = (self.next + 1) % self.entries.len();
    }

    /// Whether page `index`'s object at `loc` is here.
    pub(crate) fn has(&self, index: u64, loc: Location) -> bool {
        self.entries
            .iter()
            .any(|e| e.len != 0 && e.index == index && e.loc == loc.0)
    }

    /// Takes page `index`'s object at `loc` out, if it is here: its generation and payload
    /// length, its sealed bytes copied into `out` (grown if needed).
    pub(crate) fn take(
        &mut self,
        index: u64,
        loc: Location,
        out: &mut Vec<u8>,
    ) -> Option<(u64, usize)> {
        let e = self
            .entries
            .iter_mut()
            .find(|e| e.len != 0 && e.index == index && e.loc == loc.0)?;
        if out.len() < e.sealed {
            out.resize(e.sealed, 0);
        }
        out[..e.sealed].copy_from_slice(&e.buf[..e.sealed]);
        let got = (e.generation, e.len);
        e.len = 0;
        Some(got)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_faults_read_one_page_and_neighbours_grow_the_window() {
        let mut w = Window::new(8);
        // Random faults, no hits: one page each.
        for i in [100u64, 7, 5000, 42] {
            assert_eq!(w.pages(i).0, 1);
        }
        // A fault next to the last one: one neighbour along.
        assert_eq!(w.pages(43).0, 2);
        // It was used: next time 1 hit -> 4 pages; 3 hits -> 8 (the most).
        w.hit();
        assert_eq!(w.pages(900).0, 4);
        w.hit();
        w.hit();
        w.hit();
        assert_eq!(w.pages(2000).0, 8);
        // Many hits never pass the most.
        for _ in 0..100 {
            w.hit();
        }
        assert_eq!(w.pages(3000).0, 8);
        // Misses halve it, one step at a time, down to one page.
        assert_eq!(w.pages(9000).0, 4);
        assert_eq!(w.pages(19000).0, 2);
        assert_eq!(w.pages(29000).0, 1);
        assert_eq!(w.pages(39000).0, 1);
    }

    #[test]
    fn a_walk_reads_ahead_in_its_direction_and_a_jump_on_both_sides() {
        let mut w = Window::new(8);
        assert_eq!(w.pages(100), (1, Side::Both));
        assert_eq!(w.pages(101), (2, Side::After));
        w.hit();
        assert_eq!(w.pages(103), (4, Side::After));
        w.hit();
        w.hit();
        w.hit();
        assert_eq!(w.pages(107), (8, Side::After));
        w.hit();
        assert_eq!(w.pages(100), (4, Side::Before));
        assert_eq!(w.pages(5000), (2, Side::Both));
        assert_eq!(w.pages(4999), (2, Side::Before));
    }

    #[test]
    fn a_window_of_one_never_reads_ahead() {
        let mut w = Window::new(1);
        assert_eq!(w.pages(1).0, 1);
        assert_eq!(w.pages(2).0, 1);
        w.hit();
        assert_eq!(w.pages(3).0, 1);
    }

    #[test]
    fn entries_are_found_by_page_and_location_and_replaced_oldest_first() {
        let mut a = Ahead::new(8, 64);
        let mut out = Vec::new();
        a.put(1, Location(10), 7, 3, &[1, 2, 3, 9]);
        assert!(a.has(1, Location(10)));
        assert!(
            !a.has(1, Location(11)),
            "another location is another object"
        );
        assert!(a.take(1, Location(11), &mut out).is_none());
        assert_eq!(a.take(1, Location(10), &mut out), Some((7, 3)));
        assert_eq!(&out[..4], &[1, 2, 3, 9]);
        assert!(a.take(1, Location(10), &mut out).is_none(), "taken once");
        // Too large for an entry: not kept.
        a.put(2, Location(20), 7, 60, &[0u8; 65]);
        assert!(!a.has(2, Location(20)));
        // The oldest goes first once every entry is used.
        for i in 0..AHEAD_ENTRIES as u64 + 1 {
            a.put(100 + i, Location(i), 1, 1, &[i as u8, 0]);
        }
        assert!(!a.has(100, Location(0)));
        assert!(a.has(101, Location(1)));
        assert!(a.has(100 + AHEAD_ENTRIES as u64, Location(AHEAD_ENTRIES as u64)));
    }
}
