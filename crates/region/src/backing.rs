//! What a region needs of the store its evicted pages go to. [`zmem_store::PageStore`] (DRAM,
//! compressed) is the one zmem uses; the trait lets a test store, or a tier on another medium,
//! sit under a region instead. Calls go through `dyn BackingStore`: one indirect call per store
//! operation, no allocation on the fault path.
//!
//! Indices are page numbers within the region. A page is written once per eviction; when it is
//! mapped again the region discards it, or keeps it as a clean copy where the store has room
//! (`room_for_copies`). A store need not keep anything it was told to discard.

use std::sync::Arc;

use zmem_store::{PageStore, StoreCore, StoreError, StoreStats, MAX_BLOCK_PAGES};

/// A store of evicted pages, shared by the threads of a region.
pub trait BackingStore: Send + Sync {
    /// Stores page `index` (one page of bytes). An error (e.g. a full store) leaves the page
    /// with the region, which keeps it resident.
    fn write(&self, index: u64, page: &[u8]) -> Result<(), StoreError>;

    /// Stores page `index` only if that saves memory: `Ok(false)` (nothing stored, the page keeps
    /// its old content) when it does not compress. Stores that do not compress store it.
    fn write_if_smaller(&self, index: u64, page: &[u8]) -> Result<bool, StoreError> {
        self.write(index, page).map(|()| true)
    }

    /// Stores pages evicted together (at most [`MAX_BLOCK_PAGES`], any indices), ideally as one
    /// unit. On an error none of them is stored; the region retries them one by one.
    fn write_group(&self, indices: &[u64], pages: &[&[u8]]) -> Result<(), StoreError> {
        debug_assert!(indices.len() <= MAX_BLOCK_PAGES);
        for (k, (&i, &p)) in indices.iter().zip(pages).enumerate() {
            if let Err(e) = self.write(i, p) {
                for &done in &indices[..k] {
                    let _ = self.discard(done);
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// Reads page `index` into `buf` (one page).
    fn read(&self, index: u64, buf: &mut [u8]) -> Result<(), StoreError>;

    /// Reads consecutive stored pages from `start` into `buf` (whole pages). A store that keeps
    /// pages in blocks decodes each block once here.
    fn read_batch(&self, start: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let page = crate::config::PAGE;
        for (k, chunk) in buf.chunks_mut(page).enumerate() {
            self.read(start + k as u64, chunk)?;
        }
        Ok(())
    }

    /// Forgets page `index` (mapped again, or dropped by the program).
    fn discard(&self, index: u64) -> Result<(), StoreError>;

    /// Whether the store has room to keep a copy of pages faulted back (see the `copies`
    /// module): such a copy is discarded later, or becomes the page's stored content when the
    /// page is evicted unchanged. Stores that cannot spare the room say no.
    fn room_for_copies(&self) -> bool {
        false
    }

    /// Whether keeping page `index`'s copy costs no DRAM (it lies on a lower tier, or takes
    /// no object at all): `CleanCopies::Ssd` keeps only those.
    fn copy_costs_no_dram(&self, _index: u64) -> bool {
        false
    }

    /// Moves the survivors of half-dead groups into new ones (see [`StoreCore::repack_groups`]):
    /// how many pages it moved, at most `max_pages`. Stores without groups have nothing to do.
    fn repack_groups(&self, _max_pages: usize) -> usize {
        0
    }

    /// Makes up to `max` of the tries a store left for later (see
    /// [`StoreCore::entropy_pass`]): how many it made. Called on idle CPU; stores that defer
    /// nothing have nothing to do.
    fn entropy_pass(&self, _max: usize) -> usize {
        0
    }

    /// Trains a dictionary whose learning round is complete (see [`StoreCore::learn_pass`]),
    /// on the calling thread: true if it did. Stores that learn nothing have nothing to do.
    fn learn_pass(&self) -> bool {
        false
    }

    /// Whether those tries are urgent (see [`StoreCore::entropy_urgent`]): then the evictor
    /// makes them between its batches too, not only on idle CPU.
    fn entropy_urgent(&self) -> bool {
        false
    }

    /// Compacts the store's memory if objects freed since left much of it unused (see
    /// [`StoreCore::compact_if_loose`]): the pages it gave back. Stores without a pool have
    /// nothing to do.
    fn compact_if_loose(&self) -> u64 {
        0
    }

    /// Copies page `index` of `from` into this store as `from` holds it, without decoding
    /// (a fork's snapshot): `Ok(false)` when it cannot (then read it and write it). Only
    /// stores of the same kind can; others never do.
    fn copy_page_from(&self, _from: &dyn BackingStore, _index: u64) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// The compressed store behind this one, if it is one (for [`copy_page_from`]).
    ///
    /// [`copy_page_from`]: BackingStore::copy_page_from
    fn as_store_core(&self) -> Option<&StoreCore> {
        None
    }

    /// Gives page `from`'s stored content to page `to` (which holds nothing) without decoding
    /// it: `Ok(false)` when this store cannot (the region then copies the page). See
    /// [`StoreCore::rename`].
    fn rename(&self, _from: u64, _to: u64) -> Result<bool, StoreError> {
        Ok(false)
    }

    /// The store's statistics (zram mm_stat meanings).
    fn stats(&self) -> StoreStats;
}

/// Makes an empty store like the region's own: the region's first store, then one per forked
/// child (the snapshot of the pages evicted at fork time goes into it).
pub type StoreFactory = Arc<dyn Fn() -> Result<Box<dyn BackingStore>, StoreError> + Send + Sync>;

// PageStore's operations are StoreCore's (through Deref), named so that they do not resolve
// to this trait's.
impl BackingStore for PageStore {
    fn write(&self, index: u64, page: &[u8]) -> Result<(), StoreError> {
        StoreCore::write(self, index, page)
    }
    fn write_if_smaller(&self, index: u64, page: &[u8]) -> Result<bool, StoreError> {
        StoreCore::write_if_smaller(self, index, page)
    }
    fn write_group(&self, indices: &[u64], pages: &[&[u8]]) -> Result<(), StoreError> {
        StoreCore::write_group(self, indices, pages)
    }
    fn read(&self, index: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        StoreCore::read(self, index, buf)
    }
    fn read_batch(&self, start: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        StoreCore::read_batch(self, start, buf)
    }
    fn discard(&self, index: u64) -> Result<(), StoreError> {
        StoreCore::discard(self, index)
    }
    fn room_for_copies(&self) -> bool {
        StoreCore::room_for_copies(self)
    }
    fn copy_costs_no_dram(&self, index: u64) -> bool {
        StoreCore::copy_costs_no_dram(self, index)
    }
    fn repack_groups(&self, max_pages: usize) -> usize {
        StoreCore::repack_groups(self, max_pages)
    }
    fn entropy_pass(&self, max: usize) -> usize {
        StoreCore::entropy_pass(self, max)
    }
    fn entropy_urgent(&self) -> bool {
        StoreCore::entropy_urgent(self)
    }
    fn learn_pass(&self) -> bool {
        StoreCore::learn_pass(self)
    }
    fn compact_if_loose(&self) -> u64 {
        StoreCore::compact_if_loose(self)
    }
    fn copy_page_from(&self, from: &dyn BackingStore, index: u64) -> Result<bool, StoreError> {
        match from.as_store_core() {
            Some(src) => StoreCore::copy_page_from(self, src, index),
            None => Ok(false),
        }
    }
    fn as_store_core(&self) -> Option<&StoreCore> {
        Some(self)
    }
    fn rename(&self, from: u64, to: u64) -> Result<bool, StoreError> {
        StoreCore::rename(self, from, to)
    }
    fn stats(&self) -> StoreStats {
        StoreCore::stats(self)
    }
}
