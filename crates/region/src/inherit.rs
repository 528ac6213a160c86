//! A forked child's evicted pages, inherited instead of copied. The FORK event used to copy
//! every compressed page of the parent into the child's store (13.7 ms per fork of a 64 MB
//! heap at a 16M budget against 2.4 ms plain), though the child of a fork + exec (a shell's
//! `$(...)`, node's `execSync`, make's recipes) reads none of it. Now the child's store
//! ([`ChildStore`]) only marks the pages the parent's store held at the fork ([`Heir`]) and
//! reads them from the parent's store, and the parent's store ([`RootStore`]) hands a page
//! down to every child that still inherits it before it forgets or replaces its own copy.
//! So a fork costs a bit per stored page, and a page is copied only when the parent changes
//! it while a child that may still read it lives.
//!
//! The hazard is a read racing with the parent's change: the parent's store reads a page it
//! forgot as zeros. A child's read of an inherited page holds the heir's lock for reading,
//! and the hand-down takes it for writing before the parent's store changes, so the parent's
//! copy stays whole while a child reads it. Lock order: the parent space's `inner` (held by
//! most callers of the parent's store) -> an heir's lock -> the stores' own locks; nothing
//! that holds an heir's lock takes a space's `inner`.
//!
//! Only children of the region's creator inherit; a child's own children get a copy, as
//! before (its store reads through to the parent where it must).

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Weak};

use zmem_os::sync::{Mutex, RwLock};
use zmem_store::{StoreCore, StoreError, StoreStats};

use crate::backing::BackingStore;
use crate::config::PAGE;

/// The creator's store and the children that inherit from it.
pub(crate) struct Parent {
    own: Box<dyn BackingStore>,
    heirs: Mutex<Vec<Weak<Heir>>>,
    /// Heirs listed that still inherit a page: 0 keeps every change of the parent's store
    /// at one load.
    inheriting: AtomicUsize,
}

impl Parent {
    /// Before the parent's copy of page `i` changes: each live child that still inherits
    /// it gets a copy of its own.
    fn hand_down(&self, i: u64) {
        if self.inheriting.load(Relaxed) == 0 {
            return;
        }
        let mut heirs = self.heirs.lock();
        heirs.retain(|w| match w.upgrade() {
            Some(h) if h.left.load(Relaxed) > 0 => {
                if !h.dead.load(Relaxed) && h.has(i) {
                    h.adopt(i, &*self.own);
                }
                if h.left.load(Relaxed) == 0 {
                    self.inheriting.fetch_sub(1, Relaxed);
                    return false;
                }
                true
            }
            // Its child took over its last inherited page, or it was dropped: every heir
            // listed was counted once.
            Some(_) | None => {
                self.inheriting.fetch_sub(1, Relaxed);
                false
            }
        });
    }
}

/// What one child inherits: a bit per page of the region, set at the fork for the pages the
/// parent's store held, cleared when the child's own store takes the page over.
pub(crate) struct Heir {
    own: Box<dyn BackingStore>,
    bits: Box<[AtomicU64]>,
    /// Bits still set.
    left: AtomicUsize,
    /// Held for reading while a child reads an inherited page from the parent's store, for
    /// writing while one is handed down (module docs).
    lock: RwLock<()>,
    /// Pages whose hand-down failed (the child's store refused the copy): lost for the
    /// child, poisoned when it reads them, never read as zeros.
    lost: Mutex<Vec<u64>>,
    /// The child is gone (exited or exec'd): nothing is handed down to it any more.
    dead: AtomicBool,
}

impl Heir {
    fn has(&self, i: u64) -> bool {
        let (w, b) = ((i / 64) as usize, i % 64);
        self.bits
            .get(w)
            .is_some_and(|x| x.load(Relaxed) & (1 << b) != 0)
    }

    /// Clears page `i`'s bit; true if it was set. Under the lock for writing.
    fn clear(&self, i: u64) -> bool {
        let (w, b) = ((i / 64) as usize, i % 64);
        let Some(x) = self.bits.get(w) else {
            return false;
        };
        let was = x.fetch_and(!(1 << b), Relaxed) & (1 << b) != 0;
        if was {
            self.left.fetch_sub(1, Relaxed);
        }
        was
    }

    /// Copies the parent's page `i` into the child's own store and stops inheriting it.
    fn adopt(&self, i: u64, parent: &dyn BackingStore) {
        let _w = self.lock.write();
        if !self.has(i) {
            return;
        }
        let copied = match self.own.copy_page_from(parent, i) {
            Ok(true) => Ok(()),
            Ok(false) | Err(_) => {
                let mut page = vec![0u8; PAGE];
                parent
                    .read(i, &mut page)
                    .and_then(|()| self.own.write(i, &page))
            }
        };
        if let Err(e) = copied {
            tracing::error!("fork: page {i} cannot be handed to a child: {e}");
            self.lost.lock().push(i);
        }
        self.clear(i);
    }

    fn lost_error(&self, i: u64) -> Option<StoreError> {
        self.lost.lock().contains(&i).then_some(StoreError::Lost {
            index: i,
            reason: "its copy could not be made when the parent changed it",
        })
    }

    /// This heir's child is gone: the parent stops handing pages down to it.
    pub(crate) fn mark_dead(&self) {
        self.dead.store(true, Relaxed);
    }
}

/// The creator's store: every change to a page first hands it down to the children that
/// inherit it.
pub(crate) struct RootStore(Arc<Parent>);

impl RootStore {
    pub(crate) fn new(own: Box<dyn BackingStore>) -> RootStore {
        RootStore(Arc::new(Parent {
            own,
            heirs: Mutex::new(Vec::new()),
            inheriting: AtomicUsize::new(0),
        }))
    }

    pub(crate) fn parent(&self) -> &Arc<Parent> {
        &self.0
    }
}

/// Builds a child's store at a fork of the creator: `inherit` is called with each page index
/// the parent's store holds for the child.
pub(crate) struct HeirBuilder {
    parent: Arc<Parent>,
    bits: Box<[AtomicU64]>,
    left: usize,
}

impl HeirBuilder {
    pub(crate) fn new(parent: &Arc<Parent>, pages: usize) -> HeirBuilder {
        HeirBuilder {
            parent: parent.clone(),
            bits: zeroed_bits(pages.div_ceil(64)),
            left: 0,
        }
    }

    /// Page `i` is read from the parent's store until the child's store takes it over.
    pub(crate) fn inherit(&mut self, i: usize) {
        let (w, b) = (i / 64, i % 64);
        let x = self.bits[w].get_mut();
        if *x & (1 << b) == 0 {
            *x |= 1 << b;
            self.left += 1;
        }
    }

    /// The child's store: `own` for what it takes over, the parent's for the rest.
    pub(crate) fn build(self, own: Box<dyn BackingStore>) -> (ChildStore, Arc<Heir>) {
        let parent = self.parent;
        let heir = Arc::new(Heir {
            own,
            bits: self.bits,
            left: AtomicUsize::new(self.left),
            lock: RwLock::new(()),
            lost: Mutex::new(Vec::new()),
            dead: AtomicBool::new(false),
        });
        if self.left > 0 {
            let mut heirs = parent.heirs.lock();
            heirs.push(Arc::downgrade(&heir));
            parent.inheriting.fetch_add(1, Relaxed);
        }
        (
            ChildStore {
                heir: heir.clone(),
                parent,
            },
            heir,
        )
    }
}

/// `words` zeroed atomic words from zeroed memory (`vec![0; n]` allocates it zeroed), not a
/// loop of stores: a region of 94 GiB has 24.7M pages, and the untouched pages of a large
/// zeroed allocation cost nothing.
fn zeroed_bits(words: usize) -> Box<[AtomicU64]> {
    let words = vec![0u64; words].into_boxed_slice();
    // SAFETY: AtomicU64 has the size, alignment and bit validity of u64.
    unsafe { Box::from_raw(Box::into_raw(words) as *mut [AtomicU64]) }
}

/// A forked child's store: its own pages, and the pages it still inherits from the parent's.
pub(crate) struct ChildStore {
    heir: Arc<Heir>,
    parent: Arc<Parent>,
}

impl ChildStore {
    fn inheriting(&self) -> bool {
        self.heir.left.load(Relaxed) > 0
    }

    /// Page `i` changes in the child's store (written, forgotten): no longer inherited.
    fn take_over(&self, i: u64) {
        if self.inheriting() && self.heir.has(i) {
            let _w = self.heir.lock.write();
            self.heir.clear(i);
        }
    }
}

impl BackingStore for ChildStore {
    fn write(&self, index: u64, page: &[u8]) -> Result<(), StoreError> {
        self.take_over(index);
        self.heir.own.write(index, page)
    }
    fn write_if_smaller(&self, index: u64, page: &[u8]) -> Result<bool, StoreError> {
        self.take_over(index);
        self.heir.own.write_if_smaller(index, page)
    }
    fn write_group(&self, indices: &[u64], pages: &[&[u8]]) -> Result<(), StoreError> {
        for &i in indices {
            self.take_over(i);
        }
        self.heir.own.write_group(indices, pages)
    }
    fn read(&self, index: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if self.inheriting() {
            let _r = self.heir.lock.read();
            if self.heir.has(index) {
                return self.parent.own.read(index, buf);
            }
            if let Some(e) = self.heir.lost_error(index) {
                return Err(e);
            }
        }
        self.heir.own.read(index, buf)
    }
    fn read_batch(&self, start: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if !self.inheriting() {
            return self.heir.own.read_batch(start, buf);
        }
        let pages = (buf.len() / PAGE) as u64;
        let _r = self.heir.lock.read();
        let mixed =
            (start..start + pages).any(|i| self.heir.has(i)) || !self.heir.lost.lock().is_empty();
        if !mixed {
            return self.heir.own.read_batch(start, buf);
        }
        for (k, chunk) in buf.chunks_mut(PAGE).enumerate() {
            let i = start + k as u64;
            if self.heir.has(i) {
                self.parent.own.read(i, chunk)?;
            } else if let Some(e) = self.heir.lost_error(i) {
                return Err(e);
            } else {
                self.heir.own.read(i, chunk)?;
            }
        }
        Ok(())
    }
    fn discard(&self, index: u64) -> Result<(), StoreError> {
        self.take_over(index);
        self.heir.own.discard(index)
    }
    fn room_for_copies(&self) -> bool {
        self.heir.own.room_for_copies()
    }
    fn copy_costs_no_dram(&self, index: u64) -> bool {
        // An inherited page has no copy here.
        !self.heir.has(index) && self.heir.own.copy_costs_no_dram(index)
    }
    fn repack_groups(&self, max_pages: usize) -> usize {
        self.heir.own.repack_groups(max_pages)
    }
    fn entropy_pass(&self, max: usize) -> usize {
        self.heir.own.entropy_pass(max)
    }
    fn entropy_urgent(&self) -> bool {
        self.heir.own.entropy_urgent()
    }
    fn learn_pass(&self) -> bool {
        self.heir.own.learn_pass()
    }
    fn compact_if_loose(&self) -> u64 {
        self.heir.own.compact_if_loose()
    }
    fn copy_page_from(&self, from: &dyn BackingStore, index: u64) -> Result<bool, StoreError> {
        self.take_over(index);
        self.heir.own.copy_page_from(from, index)
    }
    /// The child's own store: an inherited page is not in it, so a copy from it (a
    /// grandchild's snapshot) finds nothing there and reads the page through [`read`].
    ///
    /// [`read`]: BackingStore::read
    fn as_store_core(&self) -> Option<&StoreCore> {
        self.heir.own.as_store_core()
    }
    fn rename(&self, from: u64, to: u64) -> Result<bool, StoreError> {
        if self.inheriting() && (self.heir.has(from) || self.heir.has(to)) {
            return Ok(false); // the region reads the page and writes it at its new index
        }
        self.heir.own.rename(from, to)
    }
    fn stats(&self) -> StoreStats {
        self.heir.own.stats()
    }
}

impl BackingStore for RootStore {
    fn write(&self, index: u64, page: &[u8]) -> Result<(), StoreError> {
        self.0.hand_down(index);
        self.0.own.write(index, page)
    }
    fn write_if_smaller(&self, index: u64, page: &[u8]) -> Result<bool, StoreError> {
        self.0.hand_down(index);
        self.0.own.write_if_smaller(index, page)
    }
    fn write_group(&self, indices: &[u64], pages: &[&[u8]]) -> Result<(), StoreError> {
        for &i in indices {
            self.0.hand_down(i);
        }
        self.0.own.write_group(indices, pages)
    }
    fn read(&self, index: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.0.own.read(index, buf)
    }
    fn read_batch(&self, start: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        self.0.own.read_batch(start, buf)
    }
    fn discard(&self, index: u64) -> Result<(), StoreError> {
        self.0.hand_down(index);
        self.0.own.discard(index)
    }
    fn room_for_copies(&self) -> bool {
        self.0.own.room_for_copies()
    }
    fn copy_costs_no_dram(&self, index: u64) -> bool {
        self.0.own.copy_costs_no_dram(index)
    }
    fn repack_groups(&self, max_pages: usize) -> usize {
        self.0.own.repack_groups(max_pages)
    }
    fn entropy_pass(&self, max: usize) -> usize {
        self.0.own.entropy_pass(max)
    }
    fn entropy_urgent(&self) -> bool {
        self.0.own.entropy_urgent()
    }
    fn learn_pass(&self) -> bool {
        self.0.own.learn_pass()
    }
    fn compact_if_loose(&self) -> u64 {
        self.0.own.compact_if_loose()
    }
    fn copy_page_from(&self, from: &dyn BackingStore, index: u64) -> Result<bool, StoreError> {
        self.0.hand_down(index);
        self.0.own.copy_page_from(from, index)
    }
    fn as_store_core(&self) -> Option<&StoreCore> {
        self.0.own.as_store_core()
    }
    fn rename(&self, from: u64, to: u64) -> Result<bool, StoreError> {
        self.0.hand_down(from);
        self.0.hand_down(to);
        self.0.own.rename(from, to)
    }
    fn stats(&self) -> StoreStats {
        self.0.own.stats()
    }
}
