//! A set of address ranges: disjoint, half-open `[start, end)`, neighbours merged. The preload
//! library keeps the free part of the region's map space in one (first fit, like the kernel's
//! own search) and the parts the program mapped over with files or shared memory in another.
//!
//! Plain bookkeeping: no system calls, and it allocates only in [`Extents::insert`] and
//! [`Extents::remove`] (a B-tree node now and then), so its caller decides which heap pays.

use std::collections::BTreeMap;

/// Disjoint, merged half-open ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Extents {
    /// start -> end; no two ranges touch or overlap.
    map: BTreeMap<usize, usize>,
    total: usize,
}

impl Extents {
    pub const fn new() -> Extents {
        Extents {
            map: BTreeMap::new(),
            total: 0,
        }
    }

    /// Bytes covered.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Number of separate ranges.
    pub fn count(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }

    /// Adds `[start, end)` (union: parts already in the set are fine).
    pub fn insert(&mut self, start: usize, end: usize) {
        if start >= end {
            return;
        }
        let (mut lo, mut hi) = (start, end);
        // Every range that overlaps or touches [start, end) is absorbed.
        let touching: Vec<(usize, usize)> = self
            .map
            .range(..=end)
            .rev()
            .take_while(|&(_, &e)| e >= start)
            .map(|(&s, &e)| (s, e))
            .collect();
        for (s, e) in touching {
            self.map.remove(&s);
            self.total -= e - s;
            lo = lo.min(s);
            hi = hi.max(e);
        }
        self.map.insert(lo, hi);
        self.total += hi - lo;
    }

    /// Removes `[start, end)` (parts not in the set are fine).
    pub fn remove(&mut self, start: usize, end: usize) {
        if start >= end {
            return;
        }
        let hit = self.overlapping(start, end);
        for (s, e) in hit {
            self.map.remove(&s);
            self.total -= e - s;
            if s < start {
                self.map.insert(s, start);
                self.total += start - s;
            }
            if e > end {
                self.map.insert(end, e);
                self.total += e - end;
            }
        }
    }

    /// The ranges of the set that overlap `[start, end)`, whole (not clipped), in order.
    pub fn overlapping(&self, start: usize, end: usize) -> Vec<(usize, usize)> {
        if start >= end {
            return Vec::new();
        }
        let mut v: Vec<(usize, usize)> = self
            .map
            .range(..end)
            .rev()
            .take_while(|&(_, &e)| e > start)
            .map(|(&s, &e)| (s, e))
            .collect();
        v.reverse();
        v
    }

    /// The parts of `[start, end)` in the set, clipped to it.
    pub fn within(&self, start: usize, end: usize) -> Vec<(usize, usize)> {
        self.overlapping(start, end)
            .into_iter()
            .map(|(s, e)| (s.max(start), e.min(end)))
            .collect()
    }

    /// The parts of `[start, end)` not in the set.
    pub fn gaps(&self, start: usize, end: usize) -> Vec<(usize, usize)> {
        let mut out = Vec::new();
        let mut at = start;
        for (s, e) in self.within(start, end) {
            if s > at {
                out.push((at, s));
            }
            at = e;
        }
        if at < end {
            out.push((at, end));
        }
        out
    }

    /// Whether all of `[start, end)` is in the set.
    pub fn covers(&self, start: usize, end: usize) -> bool {
        start >= end
            || self
                .map
                .range(..=start)
                .next_back()
                .is_some_and(|(_, &e)| e >= end)
    }

    /// Whether any of `[start, end)` is in the set.
    pub fn overlaps(&self, start: usize, end: usize) -> bool {
        start < end
            && self
                .map
                .range(..end)
                .next_back()
                .is_some_and(|(_, &e)| e > start)
    }

    /// The lowest start of `len` bytes inside one range, aligned to `align` (a power of two).
    pub fn first_fit(&self, len: usize, align: usize) -> Option<usize> {
        self.map.iter().find_map(|(&s, &e)| {
            let at = s.checked_next_multiple_of(align)?;
            (at.checked_add(len)? <= e).then_some(at)
        })
    }

    /// The ranges, in order.
    pub fn iter(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.map.iter().map(|(&s, &e)| (s, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The model: a byte per address unit.
    fn model_of(x: &Extents, n: usize) -> Vec<bool> {
        let mut m = vec![false; n];
        for (s, e) in x.iter() {
            m[s..e].iter_mut().for_each(|b| *b = true);
        }
        m
    }

    fn check_invariants(x: &Extents) {
        let mut prev_end = None;
        let mut total = 0;
        for (s, e) in x.iter() {
            assert!(s < e, "empty range {s}..{e}");
            if let Some(p) = prev_end {
                assert!(s > p, "ranges touch or overlap at {s} (previous end {p})");
            }
            prev_end = Some(e);
            total += e - s;
        }
        assert_eq!(total, x.total());
    }

    #[test]
    fn matches_a_model_under_random_inserts_and_removes() {
        const N: usize = 300;
        let mut x = Extents::new();
        let mut model = vec![false; N];
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % m as u64) as usize
        };
        for _ in 0..5000 {
            let a = next(N);
            let b = (a + next(40)).min(N);
            let insert = next(2) == 0;
            if insert {
                x.insert(a, b);
            } else {
                x.remove(a, b);
            }
            model[a..b].iter_mut().for_each(|v| *v = insert);
            check_invariants(&x);
            assert_eq!(model_of(&x, N), model);
            let (c, d) = {
                let c = next(N);
                (c, (c + next(40)).min(N))
            };
            assert_eq!(
                x.covers(c, d),
                model[c..d].iter().all(|&v| v),
                "covers {c}..{d}"
            );
            assert_eq!(
                x.overlaps(c, d),
                model[c..d].iter().any(|&v| v),
                "overlaps {c}..{d}"
            );
            let inside: usize = x.within(c, d).iter().map(|(s, e)| e - s).sum();
            let outside: usize = x.gaps(c, d).iter().map(|(s, e)| e - s).sum();
            assert_eq!(inside, model[c..d].iter().filter(|&&v| v).count());
            assert_eq!(inside + outside, d - c);
        }
    }

    #[test]
    fn first_fit_is_lowest_and_aligned() {
        let mut x = Extents::new();
        x.insert(3, 10);
        x.insert(20, 60);
        assert_eq!(x.first_fit(7, 1), Some(3));
        assert_eq!(x.first_fit(8, 1), Some(20));
        assert_eq!(x.first_fit(4, 8), Some(24)); // 8 is aligned but 8+4 > 10
        assert_eq!(x.first_fit(2, 8), Some(8));
        assert_eq!(x.first_fit(41, 1), None);
        assert_eq!(x.first_fit(0, 1), Some(3));
    }

    #[test]
    fn neighbours_merge_and_splits_keep_totals() {
        let mut x = Extents::new();
        x.insert(0, 10);
        x.insert(10, 20);
        assert_eq!(x.count(), 1);
        assert_eq!(x.total(), 20);
        x.remove(5, 15);
        assert_eq!(x.iter().collect::<Vec<_>>(), vec![(0, 5), (15, 20)]);
        assert_eq!(x.total(), 10);
        x.insert(2, 17);
        assert_eq!(x.iter().collect::<Vec<_>>(), vec![(0, 20)]);
        x.insert(5, 5); // empty: nothing
        x.remove(7, 3); // backwards: nothing
        assert_eq!(x.total(), 20);
    }
}
