//! Objects larger than a page, stored split: their whole pages as a run of their own (no
//! rounding, no slot left empty) and the bytes past the last whole page (the tail) as an
//! ordinary object of the page classes, which are dense. Size classes above a page round an
//! object up by up to a sixteenth and leave many partly used spans of few objects each; a
//! model of the idle pass's blocks (~24 KiB each) put that at 3.5% of the pool, split at 1.0%
//! (docs/DESIGN-NOTES.md, "Session 50"). The price is a copy on read: the two parts are not
//! contiguous, so [`Pool::with_object`](crate::Pool::with_object) assembles them in a
//! per-thread buffer.
//!
//! A split object's handle carries the class id [`SPLIT_CLASS`], which no size class has, and
//! an index into this table with the same 12 generation bits as the classes' handles. Lock
//! order: this table's lock, then a class lock (a read assembles the tail under both, and
//! releases both before it hands the bytes on); the tail's handle stays valid when compaction
//! moves the tail.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use zmem_os::sync::RwLock;

use crate::chunk::Run;
use crate::class_state::NIL;
use crate::handle::next_gen;
use crate::{Handle, PoolError, PAGE_SIZE};

/// Objects from this length on are split: from one byte over a page. A page the store keeps raw
/// is a 4100-byte object; its class fits 15 in a 16-page span (6% lost), split it costs a page
/// and a 16-byte slot (0.4%) for a 4 KiB copy per read. Measured (`zmem bench heaps --policies
/// auto`): splitting only from two pages gave 1-2% less on every heap.
pub(crate) const SPLIT_FROM: usize = PAGE_SIZE + 1;

/// The class id of split objects' handles (above every real class id: a pool has far fewer
/// classes, checked when they are built).
pub(crate) const SPLIT_CLASS: usize = 0xffff;

/// One split object: its whole pages, its tail (none when the length is a multiple of a page)
/// and its exact length.
pub(crate) struct SplitObject {
    pub(crate) run: Run,
    pub(crate) tail: Option<Handle>,
    pub(crate) len: u32,
}

enum Entry {
    Live {
        gen: u64,
        obj: SplitObject,
    },
    /// A free entry: the generation its next object gets, and the next free entry.
    Free {
        gen: u64,
        next: u32,
    },
}

#[derive(Default)]
pub(crate) struct SplitState {
    entries: Vec<Entry>,
    free: u32,
}

/// The split objects of a pool and their counters.
pub(crate) struct SplitTable {
    pub(crate) state: RwLock<SplitState>,
    /// Live split objects.
    pub(crate) objects: AtomicU64,
    /// Those with a tail (the tails are counted as objects of their classes too).
    pub(crate) tails: AtomicU64,
    /// Bytes in the split objects' whole pages (their tails' bytes are in their classes).
    pub(crate) page_bytes: AtomicU64,
}

impl SplitTable {
    pub(crate) fn new() -> SplitTable {
        SplitTable {
            state: RwLock::new(SplitState {
                entries: Vec::new(),
                free: NIL,
            }),
            objects: AtomicU64::new(0),
            tails: AtomicU64::new(0),
            page_bytes: AtomicU64::new(0),
        }
    }

    /// Bytes of bookkeeping.
    pub(crate) fn meta_bytes(&self) -> u64 {
        (self.state.read().entries.capacity() * std::mem::size_of::<Entry>()) as u64
    }

    /// Records a new split object; returns its (index, generation), or gives the object back
    /// with the error when the table cannot grow.
    pub(crate) fn insert(&self, obj: SplitObject) -> Result<(u32, u64), (SplitObject, PoolError)> {
        let mut st = self.state.write();
        let (idx, gen) = if st.free != NIL {
            let idx = st.free;
            let Entry::Free { gen, next } = st.entries[idx as usize] else {
                unreachable!("the free list holds a live split object");
            };
            st.free = next;
            (idx, gen)
        } else {
            if st.entries.len() >= NIL as usize {
                return Err((obj, PoolError::OutOfMemory("too many split objects".into())));
            }
            if let Err(e) = st.entries.try_reserve(1) {
                return Err((obj, PoolError::OutOfMemory(e.to_string())));
            }
            st.entries.push(Entry::Free { gen: 1, next: NIL });
            ((st.entries.len() - 1) as u32, 1)
        };
        self.objects.fetch_add(1, Relaxed);
        self.tails.fetch_add(obj.tail.is_some() as u64, Relaxed);
        self.page_bytes
            .fetch_add(obj.run.pages as u64 * PAGE_SIZE as u64, Relaxed);
        st.entries[idx as usize] = Entry::Live { gen, obj };
        Ok((idx, gen))
    }

    /// Takes a live split object out of the table (`None` for a stale or forged handle).
    pub(crate) fn remove(&self, idx: u32, gen: u64) -> Option<SplitObject> {
        let mut st = self.state.write();
        let free = st.free;
        let e = st.entries.get_mut(idx as usize)?;
        match e {
            Entry::Live { gen: g, .. } if *g == gen => {}
            _ => return None,
        }
        let Entry::Live { obj, .. } = std::mem::replace(
            e,
            Entry::Free {
                gen: next_gen(gen),
                next: free,
            },
        ) else {
            unreachable!("checked live above");
        };
        st.free = idx;
        self.objects.fetch_sub(1, Relaxed);
        self.tails.fetch_sub(obj.tail.is_some() as u64, Relaxed);
        self.page_bytes
            .fetch_sub(obj.run.pages as u64 * PAGE_SIZE as u64, Relaxed);
        Some(obj)
    }
}

impl SplitState {
    /// The live split object of a handle's index and generation.
    pub(crate) fn get(&self, idx: u32, gen: u64) -> Option<&SplitObject> {
        match self.entries.get(idx as usize)? {
            Entry::Live { gen: g, obj } if *g == gen => Some(obj),
            _ => None,
        }
    }
}

thread_local! {
    /// Where a read assembles a split object (kept between reads: one allocation per thread).
    static ASSEMBLY: std::cell::Cell<Vec<u8>> = const { std::cell::Cell::new(Vec::new()) };
}

/// Runs `f` with an empty buffer of this thread's. The buffer is taken out for the call, so an
/// `f` that reads another pool's split object gets a buffer of its own.
/// During the thread's exit (its thread-locals destroyed: a program's destructors may still
/// fault on the heap) a buffer of the call's own is used.
pub(crate) fn with_assembly<R>(f: impl FnOnce(&mut Vec<u8>) -> R) -> R {
    let mut buf = ASSEMBLY.try_with(|b| b.take()).unwrap_or_default();
    buf.clear();
    let r = f(&mut buf);
    let _ = ASSEMBLY.try_with(|b| b.set(buf));
    r
}
