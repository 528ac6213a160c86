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
    fn from_u8(b: u8) -> PageState {
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

/// The states of every page of a space.
pub(crate) struct StateTable(Vec<u8>);

impl StateTable {
    /// `pages` pages, all Absent; the memory is touched only when a page's state is set.
    pub fn new(pages: usize) -> StateTable {
        StateTable(vec![Absent as u8; pages])
    }

    pub fn get(&self, page: usize) -> PageState {
        PageState::from_u8(self.0[page])
    }

    /// Changes a page's state (a legal transition, see [`PageState::can_become`]).
    pub fn set(&mut self, page: usize, to: PageState) {
        debug_assert!(
            self.get(page).can_become(to),
            "page {page}: {:?} cannot become {to:?}",
            self.get(page)
        );
        self.0[page] = to as u8;
    }

    /// A forked child's table starts as a copy (see `Shared::snapshot`), not by transitions.
    pub fn init(&mut self, page: usize, st: PageState) {
        self.0[page] = st as u8;
    }

    pub fn iter(&self) -> impl Iterator<Item = PageState> + '_ {
        self.0.iter().map(|&b| PageState::from_u8(b))
    }

    pub fn count(&self, st: PageState) -> usize {
        self.0.iter().filter(|&&b| b == st as u8).count()
    }
}
