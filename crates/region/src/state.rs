//! The state of each page of a space, and the transitions between states.
//!
//! One byte per page, in a table allocated zeroed: the kernel maps its pages lazily, so a huge
//! region costs nothing until its pages are touched (tests/lazy_metadata.rs), which is why the
//! table stores bytes rather than [`PageState`] values (a `Vec` of an enum is written out in
//! full when created) and why zero means [`PageState::Absent`]. Every change of state goes
//! through [`StateTable::set`], which checks (in debug builds) that it is one of the transitions
//! listed in [`PageState::can_become`]; the table is only read or written under the space's
//! `inner` lock.

/// What a page of a space is now.
#[repr(u8)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum PageState {
    /// No content: reads as zeros (never touched, or dropped by the program).
    Absent = 0,
    /// Mapped in the space.
    Resident = 1,
    /// In the backing store.
    Stored = 2,
    /// Moved out into a staging slot, not yet stored.
    Staged = 3,
    /// A handler is bringing it in.
    Faulting = 4,
    /// Content unknown (an unsupported mremap, a corrupt stored page): SIGBUS on access.
    Poisoned = 5,
    /// The program unmapped it: no longer part of the region.
    Unmapped = 6,
}

use PageState::*;

impl PageState {
    pub(crate) fn from_u8(b: u8) -> PageState {
        match b {
            0 => Absent,
            1 => Resident,
            2 => Stored,
            3 => Staged,
            4 => Faulting,
            5 => Poisoned,
            6 => Unmapped,
            _ => unreachable!("page state byte {b}"),
        }
    }

    /// The legal transitions:
    /// - a fault takes Absent, Stored, Unmapped (memory mapped again at the address) or a
    ///   Resident page the program dropped behind our back to Faulting, then to Resident, or
    ///   back to what it was if the kernel refused the mapping, or to Poisoned if the store
    ///   cannot give the page back;
    /// - eviction takes Resident to Staged, then Staged to Stored, or back to Resident (the
    ///   store refused it, or a fault took it from its staging slot), or to Absent (the program
    ///   dropped it meanwhile) or Poisoned (it could neither be stored nor put back);
    /// - the program's remove, unmap and mremap events take any page that is not Faulting to
    ///   Absent, Unmapped or Poisoned.
    pub fn can_become(self, to: PageState) -> bool {
        match (self, to) {
            (Faulting, Faulting) => false,
            (_, Faulting) => matches!(self, Absent | Stored | Unmapped | Resident),
            (Faulting, _) => true,
            (_, Absent | Unmapped | Poisoned) => true,
            (Resident, Staged) => true,
            (Staged, Resident | Stored) => true,
            _ => false,
        }
    }
}

/// Pages per bit of the touched map: 2 MiB.
const CHUNK: usize = 512;

/// The states of every page of a space, and which 2 MiB chunks ever held a page that was not
/// Absent: a region is mostly untouched address space (a heap of 4x the machine's memory and
/// as much again for the program's mappings), and a fork walks only the touched chunks.
pub(crate) struct StateTable {
    /// One byte per page (`PageState`), mapped apart (`ZeroedTable`): a forked child's snapshot
    /// holds one sized for the whole region.
    states: zmem_os::ZeroedTable<u8>,
    touched: Vec<u64>,
    /// `RegionConfig::trace_pages`: each page's last changes (see `trace`).
    history: Option<Box<crate::trace::History>>,
}

impl StateTable {
    /// `pages` pages, all Absent; the memory is touched only when a page's state is set.
    pub fn new(pages: usize) -> Result<StateTable, crate::RegionError> {
        const { assert!(Absent as u8 == 0) };
        // SAFETY: u8 has no invalid bit pattern; zero is Absent (checked above).
        let states = unsafe { zmem_os::ZeroedTable::new(pages) }.map_err(|source| {
            crate::RegionError::Os {
                op: "map the table of page states",
                source,
            }
        })?;
        Ok(StateTable {
            states,
            touched: vec![0; pages.div_ceil(CHUNK).div_ceil(64)],
            history: None,
        })
    }

    /// As [`StateTable::new`], recording each page's last changes (`RegionConfig::trace_pages`).
    pub fn with_history(pages: usize) -> Result<StateTable, crate::RegionError> {
        Ok(StateTable {
            history: Some(Box::new(crate::trace::History::new(pages))),
            ..StateTable::new(pages)?
        })
    }

    pub fn history(&self) -> Option<&crate::trace::History> {
        self.history.as_deref()
    }

    pub fn get(&self, page: usize) -> PageState {
        PageState::from_u8(self.states[page])
    }

    #[inline]
    fn mark(&mut self, page: usize, st: PageState) {
        if st != Absent {
            let c = page / CHUNK;
            self.touched[c / 64] |= 1 << (c % 64);
        }
    }

    /// Changes a page's state (a legal transition, see [`PageState::can_become`]).
    #[track_caller]
    pub fn set(&mut self, page: usize, to: PageState) {
        debug_assert!(
            self.get(page).can_become(to),
            "page {page}: {:?} cannot become {to:?}",
            self.get(page)
        );
        let from = self.get(page);
        if let Some(h) = self.history.as_mut() {
            h.record(page, from, to, std::panic::Location::caller());
        }
        self.states[page] = to as u8;
        self.mark(page, to);
    }

    /// A forked child's table starts as a copy (see `Shared::snapshot`), not by transitions.
    pub fn init(&mut self, page: usize, st: PageState) {
        self.states[page] = st as u8;
        self.mark(page, st);
    }

    /// Every page that may not be Absent (all pages of the chunks ever touched), with its state.
    pub fn iter_touched(&self) -> impl Iterator<Item = (usize, PageState)> + '_ {
        let pages = self.states.len();
        self.touched
            .iter()
            .enumerate()
            .filter(|&(_, &bits)| bits != 0)
            .flat_map(|(w, &bits)| set_bits(bits).map(move |b| w * 64 + b))
            .flat_map(move |c| c * CHUNK..((c + 1) * CHUNK).min(pages))
            .map(|i| (i, self.get(i)))
    }
}

/// The positions of the bits set in `bits`, lowest first. A region's touched map is mostly zero
/// words (1,500 of them for a heap of 94 GiB and its map space): testing each of their 64 bits
/// one by one took ~100 µs of every fork's snapshot.
fn set_bits(mut bits: u64) -> impl Iterator<Item = usize> {
    std::iter::from_fn(move || {
        (bits != 0).then(|| {
            let b = bits.trailing_zeros() as usize;
            bits &= bits - 1;
            b
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn touched_chunks_cover_every_page_that_is_not_absent() {
        let pages = 100 * CHUNK + 7;
        let mut t = StateTable::new(pages).unwrap();
        assert_eq!(t.iter_touched().count(), 0);
        for p in [0, 5, CHUNK * 3 + 1, CHUNK * 64 + 2, pages - 1] {
            t.set(p, Faulting);
            t.set(p, Resident);
        }
        let seen: Vec<usize> = t
            .iter_touched()
            .filter(|&(_, s)| s != Absent)
            .map(|(i, _)| i)
            .collect();
        assert_eq!(seen, vec![0, 5, CHUNK * 3 + 1, CHUNK * 64 + 2, pages - 1]);
        // Whole chunks are walked, the last one only up to the end.
        assert_eq!(t.iter_touched().count(), 3 * CHUNK + 7);
        t.set(5, Absent); // a page going back to Absent keeps its chunk walked: harmless
        assert_eq!(t.iter_touched().count(), 3 * CHUNK + 7);
    }

    #[test]
    fn set_bits_lists_each_bit_once_lowest_first() {
        assert_eq!(set_bits(0).count(), 0);
        assert_eq!(set_bits(1 << 63).collect::<Vec<_>>(), vec![63]);
        assert_eq!(set_bits(0b1010_0001).collect::<Vec<_>>(), vec![0, 5, 7]);
        assert_eq!(
            set_bits(u64::MAX).collect::<Vec<_>>(),
            (0..64).collect::<Vec<_>>()
        );
    }
}
