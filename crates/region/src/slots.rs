//! The staging area's slots: which are empty (ready for `UFFDIO_MOVE`, which needs an empty
//! destination) and which still hold a page already compressed.
//!
//! Emptying a slot costs three system calls that take the address space's write lock
//! (unregister, MADV_DONTNEED, register: a DONTNEED on registered memory would block until a
//! handler read the REMOVE event). Doing that after every batch of 4 pages cost 35 µs per fault
//! of handler time in `bench region` (1G, 256M, rand). So a compressed page stays in its slot,
//! and slots are emptied in bulk, all at once, when eviction finds too few empty ones: once
//! per 64 evictions, in runs of adjacent slots.
//!
//! Tried and dropped: serving faults by decompressing into a kept page and moving it into the
//! program (no page allocated by the kernel). `UFFDIO_MOVE` out of the staging area flushes
//! the TLB of every CPU running the process (an IPI, a VM exit here): 27 µs per fault against
//! 12 µs for `UFFDIO_COPY` into a new page.

use zmem_os::sync::Mutex;

use crate::config::PAGE;
use crate::manager::STAGING_SLOTS;

/// A slot's number, 0..STAGING_SLOTS.
pub(crate) type Slot = u16;

struct Lists {
    empty: Vec<Slot>,
    /// Holding a page nobody needs any more (or, after EEXIST, something unknown).
    used: Vec<Slot>,
}

pub(crate) struct Slots {
    base: usize,
    lists: Mutex<Lists>,
}

impl Slots {
    /// Every slot of the staging area at `base` empty.
    pub fn new(base: usize) -> Slots {
        let lists = Lists {
            empty: (0..STAGING_SLOTS as Slot).rev().collect(),
            used: Vec::with_capacity(STAGING_SLOTS),
        };
        Slots {
            base,
            lists: Mutex::new(lists),
        }
    }

    pub fn addr(&self, slot: Slot) -> usize {
        self.base + slot as usize * PAGE
    }

    /// Up to `n` empty slots into `out` (cleared first). When there are fewer, every used slot
    /// is emptied with `clear(addr, len)` (runs of adjacent slots in one call). Only eviction
    /// calls this, under its lock; a used slot is no longer read by anyone, and slots handed
    /// back while the list is cleared (a batch settled on another thread) are kept.
    pub fn take_empty(&self, n: usize, out: &mut Vec<Slot>, clear: impl Fn(usize, usize)) {
        out.clear();
        let mut l = self.lists.lock();
        if l.empty.len() < n && !l.used.is_empty() {
            let mut taken = std::mem::take(&mut l.used);
            drop(l);
            taken.sort_unstable();
            let mut i = 0;
            while i < taken.len() {
                let mut j = i + 1;
                while j < taken.len() && taken[j] == taken[j - 1] + 1 {
                    j += 1;
                }
                clear(self.addr(taken[i]), (j - i) * PAGE);
                i = j;
            }
            l = self.lists.lock();
            l.empty.append(&mut taken);
            // Slots a settling batch handed back meanwhile stay listed (evictor, see
            // `Shared::settle`); else the list keeps its capacity.
            if l.used.is_empty() {
                l.used = taken;
            }
        }
        let k = n.min(l.empty.len());
        let at = l.empty.len() - k;
        out.extend(l.empty.drain(at..));
    }

    pub fn put_empty(&self, slot: Slot) {
        self.lists.lock().empty.push(slot);
    }

    pub fn put_used(&self, slot: Slot) {
        self.lists.lock().used.push(slot);
    }

    /// Used slots now (their pages are in DRAM, outside the budget: at most STAGING_SLOTS).
    pub fn used(&self) -> usize {
        self.lists.lock().used.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    #[test]
    fn used_slots_are_emptied_in_runs_only_when_too_few_are_empty() {
        let s = Slots::new(0x10000);
        let cleared = RefCell::new(Vec::new());
        let clear = |a: usize, l: usize| cleared.borrow_mut().push((a, l));
        let mut out = Vec::new();
        s.take_empty(STAGING_SLOTS, &mut out, clear);
        assert_eq!(out.len(), STAGING_SLOTS);
        assert!(cleared.borrow().is_empty());
        // All evicted: every slot holds a compressed page, except one move that failed.
        let failed = out[10];
        for &slot in out.iter().filter(|&&x| x != failed) {
            s.put_used(slot);
        }
        s.put_empty(failed);
        // One wanted, one empty: nothing is cleared.
        s.take_empty(1, &mut out, clear);
        assert_eq!(out, vec![failed]);
        assert!(cleared.borrow().is_empty());
        s.put_used(failed);
        // Two wanted, none empty: all 64 are emptied, in one run.
        s.take_empty(2, &mut out, clear);
        assert_eq!(out.len(), 2);
        assert_eq!(*cleared.borrow(), vec![(0x10000, STAGING_SLOTS * PAGE)]);
        assert_eq!(s.used(), 0);
        // 64 slots in all, each once.
        let mut all = out.clone();
        s.take_empty(STAGING_SLOTS, &mut out, clear);
        all.extend(&out);
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), STAGING_SLOTS);
    }
}
