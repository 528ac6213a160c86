//! The live state of one size class: its spans (runs of pages cut into equal slots) with their
//! free-slot lists, the fullness buckets that let allocation pick the fullest span and
//! compaction the emptiest, the slot map (free-list link or reverse map to the handle table),
//! and the handle table itself. Everything here runs under the class's lock, held by the
//! caller.

use std::sync::atomic::AtomicU64;

use zmem_os::sync::RwLock;

use crate::chunk::{RawPtr, Run};
use crate::handle::{entry_gen, entry_loc, free_entry, next_gen, Loc, E_LIVE, E_SPAN_BITS};
use crate::PoolError;

pub(crate) const NIL: u32 = u32::MAX;
/// Most spans (slab entries) per class.
pub(crate) const MAX_SPANS: usize = 1 << E_SPAN_BITS;
/// Most handle-table entries per class (indices must stay below SLOT_FREE).
const MAX_HANDLES: usize = 1 << 31;

/// Span slot-array value: free flag plus next free slot, or the handle index of the object.
pub(crate) const SLOT_FREE: u32 = 1 << 31;
pub(crate) const SLOT_END: u32 = SLOT_FREE - 1;

/// Fullness buckets per class; a span with `inuse` of `objs` slots used is in bucket
/// `inuse * NB / objs`, full spans are in none.
const NB: usize = 16;
pub(crate) const B_FULL: u8 = NB as u8;
/// A span being drained by compaction: in no bucket, never chosen for allocation.
pub(crate) const B_ISOLATED: u8 = NB as u8 + 1;

/// Address of slot `slot` of a span starting at `base` with slots of `size` bytes.
pub(crate) fn slot_ptr(base: RawPtr, slot: u32, size: u32) -> *mut u8 {
    // SAFETY: callers pass slot < objs of the span's class, and objs * size <= span bytes, so
    // the offset stays inside the span's mapped run.
    unsafe { base.0.as_ptr().add(slot as usize * size as usize) }
}

pub(crate) struct Span {
    /// The span's pages; `None` for an unused slab entry.
    pub(crate) run: Option<Run>,
    pub(crate) inuse: u32,
    /// First free slot, SLOT_END when full.
    pub(crate) free_slot: u32,
    pub(crate) bucket: u8,
    pub(crate) prev: u32,
    /// Next span in the bucket list, or next free slab entry when `run` is None.
    pub(crate) next: u32,
}

pub(crate) struct ClassState {
    pub(crate) handles: Vec<u64>,
    pub(crate) free_handle: u32,
    pub(crate) spans: Vec<Span>,
    /// Per slot of every span (span `sid` owns `sid * objs .. (sid + 1) * objs`):
    /// SLOT_FREE | next free slot, or the handle index of the object in it.
    pub(crate) slot_map: Vec<u32>,
    pub(crate) free_span: u32,
    pub(crate) heads: [u32; NB],
    /// Bit b set = bucket b non-empty.
    pub(crate) mask: u32,
}

#[repr(align(64))]
pub(crate) struct Class {
    pub(crate) state: RwLock<ClassState>,
    pub(crate) objects: AtomicU64,
    pub(crate) bytes: AtomicU64,
    pub(crate) spans: AtomicU64,
    pub(crate) meta: AtomicU64,
}

impl ClassState {
    pub(crate) fn new() -> ClassState {
        ClassState {
            handles: Vec::new(),
            free_handle: NIL,
            spans: Vec::new(),
            slot_map: Vec::new(),
            free_span: NIL,
            heads: [NIL; NB],
            mask: 0,
        }
    }

    pub(crate) fn meta_bytes(&self) -> u64 {
        (self.handles.capacity() * 8
            + self.spans.capacity() * std::mem::size_of::<Span>()
            + self.slot_map.capacity() * 4) as u64
    }

    /// Resolves a handle's table index and generation to a live object.
    pub(crate) fn resolve(&self, idx: u32, gen: u64) -> Option<Loc> {
        let e = *self.handles.get(idx as usize)?;
        if e & E_LIVE == 0 || entry_gen(e) != gen {
            return None;
        }
        Some(entry_loc(e))
    }

    pub(crate) fn link(&mut self, sid: u32, bucket: u8) {
        let b = bucket as usize;
        let head = self.heads[b];
        {
            let s = &mut self.spans[sid as usize];
            s.bucket = bucket;
            s.prev = NIL;
            s.next = head;
        }
        if head != NIL {
            self.spans[head as usize].prev = sid;
        }
        self.heads[b] = sid;
        self.mask |= 1 << b;
    }

    pub(crate) fn unlink(&mut self, sid: u32) {
        let (b, prev, next) = {
            let s = &self.spans[sid as usize];
            (s.bucket, s.prev, s.next)
        };
        if b as usize >= NB {
            return;
        }
        if prev != NIL {
            self.spans[prev as usize].next = next;
        } else {
            self.heads[b as usize] = next;
            if next == NIL {
                self.mask &= !(1 << b);
            }
        }
        if next != NIL {
            self.spans[next as usize].prev = prev;
        }
        let s = &mut self.spans[sid as usize];
        s.bucket = B_FULL;
        s.prev = NIL;
        s.next = NIL;
    }

    fn bucket_of(inuse: u32, objs: u32) -> u8 {
        if inuse >= objs {
            B_FULL
        } else {
            (inuse as u64 * NB as u64 / objs as u64) as u8
        }
    }

    /// Puts a span in the bucket matching its fullness (unless isolated).
    pub(crate) fn rebucket(&mut self, sid: u32, objs: u32) {
        let s = &self.spans[sid as usize];
        if s.bucket == B_ISOLATED {
            return;
        }
        let want = Self::bucket_of(s.inuse, objs);
        if want != s.bucket {
            self.unlink(sid);
            if want != B_FULL {
                self.link(sid, want);
            }
        }
    }

    /// The fullest non-full span.
    pub(crate) fn fullest(&self) -> Option<u32> {
        if self.mask == 0 {
            return None;
        }
        Some(self.heads[31 - self.mask.leading_zeros() as usize])
    }

    /// The least used span.
    pub(crate) fn emptiest(&self) -> Option<u32> {
        if self.mask == 0 {
            return None;
        }
        Some(self.heads[self.mask.trailing_zeros() as usize])
    }

    /// Takes a free slot of a non-full span.
    pub(crate) fn take_slot(&mut self, sid: u32, objs: u32) -> u32 {
        let s = &mut self.spans[sid as usize];
        let slot = s.free_slot;
        s.free_slot = self.slot_map[sid as usize * objs as usize + slot as usize] & SLOT_END;
        s.inuse += 1;
        self.rebucket(sid, objs);
        slot
    }

    /// Frees a slot; returns true when the span became empty.
    pub(crate) fn put_slot(&mut self, sid: u32, slot: u32, objs: u32) -> bool {
        let s = &mut self.spans[sid as usize];
        self.slot_map[sid as usize * objs as usize + slot as usize] = SLOT_FREE | s.free_slot;
        s.free_slot = slot;
        s.inuse -= 1;
        let empty = s.inuse == 0;
        self.rebucket(sid, objs);
        empty
    }

    /// Removes an (empty) span and returns its pages.
    pub(crate) fn remove_span(&mut self, sid: u32) -> Option<Run> {
        self.unlink(sid);
        let free_span = self.free_span;
        let s = &mut self.spans[sid as usize];
        let run = s.run.take();
        s.next = free_span;
        s.bucket = B_FULL;
        self.free_span = sid;
        run
    }

    /// Makes sure a handle entry can be taken without allocating.
    pub(crate) fn reserve_handle(&mut self) -> Result<(), PoolError> {
        if self.free_handle != NIL {
            return Ok(());
        }
        if self.handles.len() >= MAX_HANDLES {
            return Err(PoolError::OutOfMemory("handle table full".into()));
        }
        self.handles
            .try_reserve(1)
            .map_err(|e| PoolError::OutOfMemory(e.to_string()))
    }

    /// Takes a handle entry (after reserve_handle); returns index and generation.
    pub(crate) fn take_handle(&mut self) -> (u32, u64) {
        if self.free_handle != NIL {
            let idx = self.free_handle;
            let e = self.handles[idx as usize];
            self.free_handle = e as u32;
            (idx, entry_gen(e))
        } else {
            self.handles.push(0);
            ((self.handles.len() - 1) as u32, 1)
        }
    }

    pub(crate) fn release_handle(&mut self, idx: u32, gen: u64) {
        self.handles[idx as usize] = free_entry(next_gen(gen), self.free_handle);
        self.free_handle = idx;
    }
}
