//! Compaction: class by class, while the free slots of a class add up to at least one whole
//! span, the least used span is drained into the fullest ones and released. Handles stay valid
//! because only their table entries change; the class lock is dropped between spans.

use std::sync::atomic::Ordering::Relaxed;

use crate::chunk::Run;
use crate::class::ClassInfo;
use crate::class_state::{slot_ptr, ClassState, B_FULL, B_ISOLATED, SLOT_FREE};
use crate::handle::{entry_loc, with_loc};
use crate::{CompactStats, Pool};

impl Pool {
    /// Moves objects out of sparse spans into fuller ones of the same class and gives the
    /// emptied spans' pages back to the OS.
    pub fn compact(&self) -> CompactStats {
        let mut out = CompactStats::default();
        let Some(c) = self.built() else {
            return out;
        };
        for cid in 0..c.classes.len() {
            let info = &c.infos[cid];
            let class = &c.classes[cid];
            if info.objs <= 1 {
                continue;
            }
            loop {
                // Cheap unlocked check: can at least one span be emptied?
                let slots = class.spans.load(Relaxed) * info.objs as u64;
                if slots.saturating_sub(class.objects.load(Relaxed)) < info.objs as u64 {
                    break;
                }
                let (moved, run) = {
                    let mut st = class.state.write();
                    self.compact_one(&mut st, cid)
                };
                out.objects_moved += moved;
                match run {
                    Some(run) => {
                        out.pages_freed += run.pages as u64;
                        self.release_run(run);
                    }
                    None => break,
                }
            }
        }
        self.pages_compacted.fetch_add(out.pages_freed, Relaxed);
        out
    }

    /// Drains the least used span of a class into the fullest ones, if that frees a span.
    /// Returns the objects moved and the emptied span's pages.
    fn compact_one(&self, st: &mut ClassState, cid: usize) -> (u64, Option<Run>) {
        let c = self.classes();
        let info = &c.infos[cid];
        let class = &c.classes[cid];
        let objs = info.objs as u64;
        let slots = class.spans.load(Relaxed) * objs;
        if slots.saturating_sub(class.objects.load(Relaxed)) < objs {
            return (0, None);
        }
        let Some(src) = st.emptiest() else {
            return (0, None);
        };
        st.unlink(src);
        st.spans[src as usize].bucket = B_ISOLATED;
        let mut moved = 0;
        for slot in 0..info.objs {
            if st.spans[src as usize].inuse == 0 {
                break;
            }
            if st.slot_map[src as usize * info.objs as usize + slot as usize] & SLOT_FREE != 0 {
                continue;
            }
            if !st.move_object(src, slot, info) {
                break;
            }
            moved += 1;
        }
        let s = &mut st.spans[src as usize];
        s.bucket = B_FULL;
        if s.inuse == 0 {
            class.spans.fetch_sub(1, Relaxed);
            (moved, st.remove_span(src))
        } else {
            st.rebucket(src, info.objs);
            (moved, None)
        }
    }
}

impl ClassState {
    /// Moves the object in `slot` of the isolated span `src` into the fullest span.
    /// Returns false when no other span has room.
    fn move_object(&mut self, src: u32, slot: u32, info: &ClassInfo) -> bool {
        let Some(dst) = self.fullest() else {
            return false;
        };
        let objs = info.objs as usize;
        let hidx = self.slot_map[src as usize * objs + slot as usize];
        let e = self.handles[hidx as usize];
        let len = info.size - entry_loc(e).delta;
        let (Some(sr), Some(dr)) = (
            self.spans[src as usize].run.as_ref().map(|r| r.ptr),
            self.spans[dst as usize].run.as_ref().map(|r| r.ptr),
        ) else {
            return false;
        };
        let dslot = self.take_slot(dst, info.objs);
        let from = slot_ptr(sr, slot, info.size);
        let to = slot_ptr(dr, dslot, info.size);
        // SAFETY: both slots lie inside live spans of this class (distinct spans, so the ranges
        // do not overlap), len <= slot size, and the class write lock is held, so no reader or
        // writer touches either slot.
        unsafe { std::ptr::copy_nonoverlapping(from, to, len as usize) };
        self.handles[hidx as usize] = with_loc(e, dst, dslot);
        self.slot_map[dst as usize * objs + dslot as usize] = hidx;
        self.put_slot(src, slot, info.objs);
        true
    }
}
