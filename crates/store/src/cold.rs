//! Pages that stay cold, recompressed in the order they were stored (issue 12, "two
//! temperatures"). With a policy that has a cold codec (`auto`), every single-page object the
//! write codec (lz4) makes is listed in a queue in store order; [`StoreCore::cold_pass`], run
//! on idle CPU by the store's recompressor thread, takes the pages that have stayed stored
//! [`COLD_AFTER_MS`] and recompresses them with the cold codec, [`StoreConfig::cold_group`]
//! pages at a time as one group block (the pages stored together, whatever their indices), or
//! one by one where the group is 1. A page read back, rewritten or discarded meanwhile is
//! skipped; a result is kept only if it is smaller.
//!
//! Why a queue: the idle pass (`recompress`) walks the whole page table once per interval and
//! recompresses only pages marked idle at the previous pass, so under a load of a few seconds
//! it recompressed nothing (`zmem bench redis --policy auto` held what `fast` held; DESIGN-NOTES
//! "Next steps" 11). The queue reaches each page once, about a second after it was stored.
//!
//! [`StoreConfig::cold_group`]: crate::StoreConfig::cold_group

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use zmem_codec::{Codec, CodecId, PAGE_SIZE};
use zmem_os::sync::Mutex;

use crate::slot::{State, BLOCK, HUGE, LATER, OBJECT};
use crate::{StoreCore, GROUP, MAX_BLOCK_PAGES};

/// A stored page is recompressed once it has stayed stored this long at least: pages that
/// come back within a second (a working set passing through the budget) never pay for the cold
/// codec. The age grows while recompressed pages come back ([`ColdAge`]), up to the second
/// figure.
pub const COLD_AFTER_MS: u32 = 1000;
pub const COLD_AFTER_MAX_MS: u32 = 64_000;

/// The share of its memory limit a pool holds from which the cold pass runs on a busy CPU
/// too, and from which it takes pages however long they have stayed.
const PRESSED_ABOVE: f64 = 0.5;
const URGENT_ABOVE: f64 = 0.85;

/// How much the pool needs the cold pass ([`StoreCore::cold_pressure`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ColdPressure {
    /// No memory limit, or the pool below half of it: recompress on idle CPU only.
    None,
    /// At half of its limit or more: recompress due pages whatever the CPU does.
    Pressed,
    /// Near its limit: recompress the oldest pages, due or not.
    Urgent,
}

/// Pages listed at most (16 bytes each, 2 MiB, reserved up front: pages are listed on the
/// eviction path, which may run in a signal handler). Pages stored while it is full are left
/// to the idle pass.
const COLD_QUEUE_MAX: usize = 1 << 17;

/// Stored pages in store order, for the cold pass.
pub(crate) struct ColdQueue {
    queue: Mutex<VecDeque<(u64, u32)>>,
    born: Instant,
    /// The age (ms) from which a listed page is due ([`ColdAge`]).
    after_ms: AtomicU32,
    /// The codec pages are recompressed with.
    pub(crate) codec: Codec,
    /// Pages per group block (1: each page alone).
    pub(crate) group: usize,
}

impl ColdQueue {
    pub(crate) fn new(codec: Codec, group: usize) -> ColdQueue {
        ColdQueue {
            queue: Mutex::new(VecDeque::with_capacity(COLD_QUEUE_MAX)),
            born: Instant::now(),
            after_ms: AtomicU32::new(COLD_AFTER_MS),
            codec,
            group: group.clamp(1, MAX_BLOCK_PAGES),
        }
    }

    fn now_ms(&self) -> u32 {
        self.born.elapsed().as_millis().min(u128::from(u32::MAX)) as u32
    }

    /// Lists page `index`, just stored as a single-page object.
    pub(crate) fn push(&self, index: u64) {
        let now = self.now_ms();
        let mut q = self.queue.lock();
        if q.len() < COLD_QUEUE_MAX {
            q.push_back((index, now));
        }
    }

    /// The oldest listed page that has stayed stored `age_ms` or longer.
    fn pop_due(&self, age_ms: u32) -> Option<u64> {
        let now = self.now_ms();
        let mut q = self.queue.lock();
        match q.front() {
            Some(&(index, at)) if now.saturating_sub(at) >= age_ms => {
                q.pop_front();
                Some(index)
            }
            _ => None,
        }
    }

    pub(crate) fn waiting(&self) -> usize {
        self.queue.lock().len()
    }
}

/// The age from which a stored page counts as cold, set by what the pass's recompressions
/// became: reads of pages in the cold codec against pages recompressed, each halved per look.
/// Where over a quarter of what it recompressed comes back (a working set cycling through the
/// budget: `bench region --pattern rand` refaults every page about 3 s after its eviction),
/// recompressing costs a compression and a slower decode at each return and saves nothing that
/// lasts: the age doubles (up to [`COLD_AFTER_MAX_MS`], beyond any page's stay in a memoryless
/// cycle). Where under a sixteenth comes back, or nothing does, it halves (down to
/// [`COLD_AFTER_MS`]), so a workload whose cold tail stays out (zipf) finds the age that
/// separates it from its hot pages. Without I/O or clock: the caller looks.
pub(crate) struct ColdAge {
    reads: u64,
    done: u64,
    recent_reads: u64,
    recent_done: u64,
    after_ms: u32,
}

impl Default for ColdAge {
    fn default() -> ColdAge {
        ColdAge {
            reads: 0,
            done: 0,
            recent_reads: 0,
            recent_done: 0,
            after_ms: COLD_AFTER_MS,
        }
    }
}

impl ColdAge {
    /// Takes the store's reads of cold-codec pages and its recompressed pages so far; returns
    /// the age (ms) from which a page is cold now.
    pub(crate) fn look(&mut self, cold_reads: u64, recompressed: u64) -> u32 {
        let dr = cold_reads.saturating_sub(self.reads);
        let dd = recompressed.saturating_sub(self.done);
        (self.reads, self.done) = (cold_reads, recompressed);
        self.recent_reads = self.recent_reads / 2 + dr;
        self.recent_done = self.recent_done / 2 + dd;
        let (r, d) = (self.recent_reads, self.recent_done);
        if r.saturating_mul(4) > d {
            self.after_ms = self.after_ms.saturating_mul(2).min(COLD_AFTER_MAX_MS);
        } else if r.saturating_mul(16) <= d {
            self.after_ms = (self.after_ms / 2).max(COLD_AFTER_MS);
        }
        self.after_ms
    }
}

/// Whether a page in state `st` is still the write codec's single-page object the cold pass is
/// for (not stored raw, not already in the cold codec, not waiting for the entropy coder).
fn warm_object(st: State, cold: Codec) -> bool {
    st.kind() == OBJECT && !st.has(HUGE) && !st.has(LATER) && st.codec() != cold.id() as u8
}

impl StoreCore {
    /// Recompresses up to `max` pages that have stayed stored long enough (see the module docs
    /// and [`cold_pass_with`](Self::cold_pass_with)); returns how many pages it looked at (so a
    /// caller knows whether more are due). A store without a cold queue has nothing to do.
    pub fn cold_pass(&self, max: usize) -> usize {
        self.cold_pass_with(max, self.cold_pressure())
    }

    /// The cold pass at a pressure: none, pages as old as [`ColdAge`] says; pressed, pages a
    /// second old whatever comes back (DRAM is what runs out); urgent, the oldest pages
    /// however young.
    pub(crate) fn cold_pass_with(&self, max: usize, pressure: ColdPressure) -> usize {
        let Some(cold) = self.inner.cold.as_ref() else {
            return 0;
        };
        let age_ms = match pressure {
            ColdPressure::None => cold.after_ms.load(Ordering::Relaxed),
            ColdPressure::Pressed => COLD_AFTER_MS,
            ColdPressure::Urgent => 0,
        };
        let mut seen = 0;
        let mut group = [0u64; MAX_BLOCK_PAGES];
        while seen < max {
            let mut n = 0;
            while n < cold.group && seen < max {
                let Some(index) = cold.pop_due(age_ms) else {
                    break;
                };
                seen += 1;
                if warm_object(self.inner.slots[index as usize].peek(), cold.codec)
                    && !group[..n].contains(&index)
                {
                    group[n] = index;
                    n += 1;
                }
            }
            if n == 0 {
                break;
            }
            group[..n].sort_unstable();
            self.recompress_group(&group[..n], cold.codec);
        }
        if seen > 0 && cold.group > 1 {
            // Blocks whose pages came back hold their bytes until repacked.
            while self.repack_groups(cold.group) == cold.group {}
        }
        seen
    }

    /// Recompresses the pages `indices` (ascending, distinct) with `codec`: two or more as one
    /// group block, one alone. The pages stay locked from decoding to the swap (a fault on one
    /// waits: they are a second cold), and nothing changes unless the result is smaller.
    fn recompress_group(&self, indices: &[u64], codec: Codec) {
        let inner = &self.inner;
        let n = indices.len();
        let mut held = [(State(0), 0u64); MAX_BLOCK_PAGES];
        for (k, &i) in indices.iter().enumerate() {
            held[k] = inner.slots[i as usize].lock();
        }
        let held = &held[..n];
        let unlock_all = || {
            for (k, &i) in indices.iter().enumerate() {
                inner.slots[i as usize].unlock_keep(held[k].0, 0);
            }
        };
        if !held.iter().all(|&(st, _)| warm_object(st, codec)) {
            unlock_all();
            return;
        }
        let before: u64 = held.iter().map(|(st, _)| u64::from(st.len())).sum();
        let result = GROUP.with(|cell| {
            let mut data = cell.borrow_mut();
            data.resize(n * PAGE_SIZE, 0);
            for (k, &(_, aux)) in held.iter().enumerate() {
                inner
                    .decode_object(indices[k], aux, &mut data[k * PAGE_SIZE..][..PAGE_SIZE])
                    .ok()?;
            }
            self.engine
                .compress_now(codec, inner.dict(), &data[..n * PAGE_SIZE])
                .ok()
        });
        let Some((obj, enc)) =
            result.filter(|(obj, enc)| (obj.len() as u64) < before && enc.codec != CodecId::Raw)
        else {
            unlock_all();
            return;
        };
        // The memory limit holds: without room for the new object the old ones stay.
        let Ok(handle) = inner.pool.alloc(&obj) else {
            unlock_all();
            return;
        };
        let raw = handle.to_raw();
        let state = if n == 1 {
            State::new(OBJECT).with_object(enc.codec as u8, obj.len())
        } else {
            // Counted before any member is installed, as in write_group.
            inner.block_register(raw, indices);
            State::new(BLOCK).with_object(enc.codec as u8, obj.len())
        };
        for (k, &(st, aux)) in held.iter().enumerate() {
            inner.release(st, aux);
            let s = if n == 1 {
                state
            } else {
                state.with_block(k, n)
            };
            inner.count_new(s, 1);
            inner.slots[indices[k] as usize].unlock_with(s, raw);
        }
        if n == 1 {
            // A single object stays a candidate for the SSD writeback.
            inner.note_object(indices[0], raw);
        }
        let c = &inner.counters;
        c.recompressed.fetch_add(n as u64, Ordering::Relaxed);
        c.cold_bytes_before.fetch_add(before, Ordering::Relaxed);
        c.cold_bytes_after
            .fetch_add(obj.len() as u64, Ordering::Relaxed);
    }

    /// How full the pool is against its memory limit, for the cold pass's pace: from half
    /// full, recompressing is how the store keeps room (the alternative is refusing pages,
    /// which then stay in DRAM), so the pass runs whether or not the CPU is idle; near the
    /// limit it takes the oldest pages however long they have stayed.
    pub fn cold_pressure(&self) -> ColdPressure {
        let pool = &self.inner.pool;
        let Some(limit) = pool.mem_limit().filter(|&l| l > 0) else {
            return ColdPressure::None;
        };
        let used = pool.mem_used() as f64 / limit as f64;
        if used >= URGENT_ABOVE {
            ColdPressure::Urgent
        } else if used >= PRESSED_ABOVE {
            ColdPressure::Pressed
        } else {
            ColdPressure::None
        }
    }

    /// Sets the cold pass's age from what its recompressions became ([`ColdAge`]); returns it
    /// (ms).
    pub(crate) fn cold_age_look(&self, age: &mut ColdAge) -> u32 {
        let Some(cold) = self.inner.cold.as_ref() else {
            return COLD_AFTER_MS;
        };
        let c = &self.inner.counters;
        let ms = age.look(
            c.cold_reads.load(Ordering::Relaxed),
            c.recompressed.load(Ordering::Relaxed),
        );
        cold.after_ms.store(ms, Ordering::Relaxed);
        ms
    }

    /// The age (ms) from which a stored page is cold now (0 without a cold pass).
    pub fn cold_after_ms(&self) -> u32 {
        self.inner
            .cold
            .as_ref()
            .map_or(0, |c| c.after_ms.load(Ordering::Relaxed))
    }

    /// Pages listed for the cold pass (some may have been read back since).
    pub fn cold_waiting(&self) -> usize {
        self.inner.cold.as_ref().map_or(0, ColdQueue::waiting)
    }
}

#[cfg(test)]
mod tests {
    use super::{ColdAge, COLD_AFTER_MAX_MS, COLD_AFTER_MS};

    #[test]
    fn the_age_follows_what_recompressed_pages_became() {
        let mut g = ColdAge::default();
        // Nothing yet: the shortest age.
        assert_eq!(g.look(0, 0), COLD_AFTER_MS);
        // Recompressed pages stay out: it stays shortest.
        assert_eq!(g.look(10, 1000), COLD_AFTER_MS);
        assert_eq!(g.look(20, 2000), COLD_AFTER_MS);
        // Half of them come back: it doubles at each look while they do.
        assert_eq!(g.look(1500, 2500), 2 * COLD_AFTER_MS);
        assert_eq!(g.look(2500, 2500), 4 * COLD_AFTER_MS);
        // A cycle that never ends drives it to its top, and no further.
        let (mut reads, mut done) = (2500, 2500);
        for _ in 0..20 {
            reads += 500;
            done += 600;
            g.look(reads, done);
        }
        assert_eq!(g.look(reads + 500, done + 600), COLD_AFTER_MAX_MS);
        // Between a sixteenth and a quarter: it holds.
        let mut held = ColdAge::default();
        assert_eq!(held.look(500, 1000), 2 * COLD_AFTER_MS);
        for k in 1..10 {
            // A tenth of what is recompressed comes back.
            assert_eq!(held.look(500 + 100 * k, 1000 + 1000 * k), 2 * COLD_AFTER_MS);
        }
        // Once those reads die down, it comes back to the shortest age, a halving per look.
        let mut looks = 0;
        while g.look(reads + 500, done + 600) > COLD_AFTER_MS {
            looks += 1;
            assert!(looks < 40, "the age never came down");
        }
        assert!(looks >= 6, "came down after {looks} quiet looks");
    }
}
