//! PageStore: zram's semantics as a library. A fixed range of page indices; each page is empty
//! (reads as zeros), same-filled (one word, no pool memory), a compressed object in the pool, a
//! member of a compressed multi-page block, or pending (written, not yet compressed: the
//! asynchronous write path of QZRAM, where the caller does not wait for compression).
//!
//! Each page's state is 16 bytes ([`slot`]), with a per-page lock bit, so pages are independent
//! and the store is safe from any number of threads. A lower tier (the SSD log) and larger
//! blocks fit in the same word without a redesign: the kind field has room, and a location fits
//! the aux word.
//!
//! The crate root holds the types every part shares (the page table, the store's inner state,
//! construction and teardown) and the small operations; each role has its own module:
//! `config` (settings, errors), `stats` (counters), `pending` (asynchronous-write
//! machinery), `write`, `read`, `blocks` (multi-page blocks and their repacking),
//! `recompress` (idle recompression), `entropy` (a second try for pages the codec could not
//! shrink), `lower` (the SSD log below the pool: writeback, reads back) and `ahead` (objects
//! read from the log ahead of their faults).

mod ahead;
mod blocks;
mod cold;
mod config;
mod entropy;
mod learn;
mod lower;
mod pending;
mod read;
mod recompress;
mod slot;
mod stats;
mod write;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use zmem_codec::{Dictionary, PAGE_SIZE};
use zmem_engine::{Engine, Policy};
use zmem_os::sync::Mutex;
use zmem_pool::{Handle, Pool, PoolConfig};

pub use cold::{ColdPressure, COLD_AFTER_MAX_MS, COLD_AFTER_MS};
pub use config::{StoreConfig, StoreError, DEFAULT_COLD_GROUP};
pub use entropy::LATER_AFTER_MS;
pub use lower::{LowerConfig, WritebackStats, DEFAULT_READ_AHEAD, MAX_READ_AHEAD};
pub use stats::{RecompressStats, StoreStats};

use lower::Lower;
use pending::{Latch, Pending};
use slot::{Slot, State, BLOCK, EMPTY, HUGE, LOWER, OBJECT, PENDING, SAME};
use stats::Counters;

/// Largest multi-page block, in pages (64 KiB).
pub const MAX_BLOCK_PAGES: usize = 16;

const BLOCK_SHARDS: usize = 64;

/// What the store knows about a block object besides its bytes.
struct BlockMeta {
    /// Member pages still pointing at it (plus any temporary pins of a repack).
    live: u32,
    /// For a group block (`write_group`): the page index at each position, so that the
    /// survivors of a sparse block can be found and repacked. None for aligned blocks.
    members: Option<Box<[u64]>>,
    /// In the queue of sparse blocks.
    queued: bool,
}

/// What completion sinks need; the engine lives outside it so a worker thread never drops it.
struct Inner {
    slots: zmem_os::ZeroedTable<Slot>,
    pool: Pool,
    /// The dictionaries of the zstd codecs: the configured one, or those learnt (`learn`).
    dicts: Arc<learn::Dicts>,
    learner: Option<Arc<learn::Learner>>,
    counters: Counters,
    /// Live member pages per block object, by pool handle.
    blocks: Vec<Mutex<HashMap<u64, BlockMeta>>>,
    /// Group blocks that lost at least half of their members, waiting for a repack.
    sparse: Mutex<Vec<u64>>,
    inflight: Arc<Latch>,
    /// Pending data whose install failed, retried by flush().
    retry: Mutex<Vec<(u64, Arc<[u8]>)>>,
    last_failure: Mutex<Option<String>>,
    /// The SSD log below the pool, if any.
    lower: Option<Lower>,
    /// Pages stored raw whose entropy-coder try is left for later (`entropy_later`).
    later: Option<entropy::Later>,
    /// Single-page objects in store order, for the cold codec (`cold`).
    cold: Option<cold::ColdQueue>,
    /// One past the highest page index ever stored: the passes that walk the page table
    /// (`mark_idle`, `recompress`) stop there. A heap's table is sized for the whole region
    /// (25M pages by default, 400 MB of mostly untouched zeros), and walking all of it once a
    /// second took 85% of the page faults of a python run under `auto` (7.7M of 9.1M).
    high: std::sync::atomic::AtomicU64,
}

/// The page store. See the crate docs. Its operations are those of [`StoreCore`], which it
/// shares with its background recompressor (if any).
pub struct PageStore {
    core: Arc<StoreCore>,
    /// Background threads (recompressor, SSD writeback) and their stop flags.
    background: Vec<(Arc<AtomicBool>, JoinHandle<()>)>,
}

/// The store's operations.
pub struct StoreCore {
    inner: Arc<Inner>,
    engine: Engine,
    policy: Policy,
    block_pages: usize,
}

impl std::ops::Deref for PageStore {
    type Target = StoreCore;
    fn deref(&self) -> &StoreCore {
        &self.core
    }
}

thread_local! {
    /// A decoded block (reads).
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
    /// A group's pages side by side, the input of its block (write_group).
    static GROUP: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Whether this thread's store state (and its codecs') can still be used: not while the
/// thread's thread-locals are being destroyed at its exit, when a fault on the signal route
/// must be served by another thread.
pub fn thread_state_alive() -> bool {
    SCRATCH.try_with(|_| ()).is_ok()
        && GROUP.try_with(|_| ()).is_ok()
        && zmem_codec::thread_state_alive()
}

/// Makes this thread's store and codec state now (a thread that may have to serve another
/// thread's fault during that thread's exit must not register its thread-local destructors
/// then: glibc takes its loader lock for that, which the exiting thread may hold). Run on
/// every zmem thread and program thread as it starts (`zmem_os::thread::prepare_this_thread`).
pub fn prepare_thread() {
    SCRATCH.with(|_| ());
    GROUP.with(|_| ());
    lower::prepare_thread();
    zmem_codec::prepare_thread();
}

impl PageStore {
    pub fn new(cfg: StoreConfig) -> Result<PageStore, StoreError> {
        zmem_os::thread::add_thread_preparer(prepare_thread);
        if cfg.pages == 0 {
            return Err(StoreError::Config(
                "the store needs at least one page".into(),
            ));
        }
        if cfg.pages > (1 << 40) {
            return Err(StoreError::Config(format!(
                "{} pages is more than the 4 EiB a store can address",
                cfg.pages
            )));
        }
        if !(1..=MAX_BLOCK_PAGES).contains(&cfg.block_pages) {
            return Err(StoreError::Config(format!(
                "block_pages {} is not in 1..={MAX_BLOCK_PAGES}",
                cfg.block_pages
            )));
        }
        let pool = Pool::new(PoolConfig {
            max_object_size: zmem_codec::max_encoded_len(MAX_BLOCK_PAGES * PAGE_SIZE),
            mem_limit: cfg.mem_limit,
            ..PoolConfig::default()
        })?;
        if let Some(l) = &cfg.lower {
            l.validate(cfg.mem_limit)?;
        }
        let engine = match &cfg.accelerator {
            Some(a) => Engine::with_accelerator(cfg.engine.clone(), a.0.clone())?,
            None => Engine::new(cfg.engine.clone())?,
        };
        // Zeroed, not written: untouched pages cost no DRAM.
        let slots = Slot::table(cfg.pages as usize).map_err(|e| StoreError::SlotTable {
            pages: cfg.pages,
            source: zmem_os::Errno::of(&e),
        })?;
        let cold = cold_queue(&cfg)?;
        // The log's collector reaches the store through a weak reference (it repoints pages).
        let inner = Arc::new_cyclic(|me: &std::sync::Weak<Inner>| Inner {
            slots,
            pool,
            dicts: Arc::new(learn::Dicts::new(cfg.dictionary.clone())),
            learner: (cfg.dictionary.is_none() && cfg.learn_dictionary)
                .then(|| Arc::new(learn::Learner::new(cfg.dictionary_thread))),
            counters: Counters::default(),
            blocks: (0..BLOCK_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            sparse: Mutex::new(Vec::new()),
            inflight: Arc::new(Latch::default()),
            retry: Mutex::new(Vec::new()),
            last_failure: Mutex::new(None),
            lower: cfg
                .lower
                .as_ref()
                .map(|l| Lower::new(l, me.clone() as std::sync::Weak<dyn zmem_tier::Owner>)),
            later: (cfg.entropy_later
                && !matches!(cfg.policy.write_codec(), zmem_codec::Codec::Zstd { .. }))
            .then(entropy::Later::new),
            cold,
            high: std::sync::atomic::AtomicU64::new(0),
        });
        let core = Arc::new(StoreCore {
            inner,
            engine,
            policy: cfg.policy,
            block_pages: cfg.block_pages,
        });
        let mut store = PageStore {
            core,
            background: Vec::new(),
        };
        if let (Some(every), Some(codec)) = (cfg.recompress_interval, cfg.policy.cold_codec()) {
            let b = StoreCore::spawn_recompressor(store.core.clone(), codec, every)?;
            store.background.push(b);
        }
        if cfg.lower.is_some() {
            let stop = Arc::new(AtomicBool::new(false));
            let h = StoreCore::spawn_writeback(store.core.clone(), stop.clone())?;
            store.background.push((stop, h));
        }
        Ok(store)
    }
}

/// The cold pass's queue, where the policy has a cold codec and the store recompresses
/// (`recompress_interval`). Over an SSD tier pages are recompressed one by one: the writeback
/// takes single objects only.
fn cold_queue(cfg: &StoreConfig) -> Result<Option<cold::ColdQueue>, StoreError> {
    if !(1..=MAX_BLOCK_PAGES).contains(&cfg.cold_group) {
        return Err(StoreError::Config(format!(
            "cold_group {} is not in 1..={MAX_BLOCK_PAGES}",
            cfg.cold_group
        )));
    }
    let (Some(_), Some(codec)) = (cfg.recompress_interval, cfg.policy.cold_codec()) else {
        return Ok(None);
    };
    let group = if cfg.lower.is_some() {
        1
    } else {
        cfg.cold_group
    };
    Ok(Some(cold::ColdQueue::new(codec, group)))
}

impl Drop for PageStore {
    fn drop(&mut self) {
        for (stop, _) in &self.background {
            stop.store(true, Ordering::Release);
        }
        if let Some(l) = self.core.inner.lower.as_ref() {
            l.kick();
        }
        for (_, h) in self.background.drain(..) {
            let _ = h.join();
        }
    }
}

impl StoreCore {
    pub fn pages(&self) -> u64 {
        self.inner.slots.len() as u64
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    pub(crate) fn check_range(&self, index: u64, count: u64) -> Result<(), StoreError> {
        let pages = self.pages();
        if count == 0 || index >= pages || count > pages - index {
            return Err(StoreError::OutOfRange {
                index,
                count,
                pages,
            });
        }
        Ok(())
    }

    pub(crate) fn pages_of(len: usize, what: &'static str) -> Result<u64, StoreError> {
        if len == 0 || len % PAGE_SIZE != 0 {
            return Err(StoreError::BadLength { len, what });
        }
        Ok((len / PAGE_SIZE) as u64)
    }

    /// Forgets a page; it reads as zeros afterwards. Its neighbours in a block keep their data.
    pub fn discard(&self, index: u64) -> Result<(), StoreError> {
        self.discard_range(index, 1)
    }

    pub fn discard_range(&self, start: u64, count: u64) -> Result<(), StoreError> {
        self.check_range(start, count)?;
        let inner = &self.inner;
        inner.counters.discards.fetch_add(count, Ordering::Relaxed);
        for index in start..start + count {
            let slot = &inner.slots[index as usize];
            let (st, aux) = slot.lock();
            inner.release(st, aux);
            slot.unlock_with(State::new(EMPTY), 0);
        }
        Ok(())
    }

    /// Gives page `from`'s content to page `to`, which must be empty, without decoding it (a
    /// program's buffer moved to another address: `realloc`, `mremap`): `from` reads as zeros
    /// afterwards. Only a page that is one object of its own or same-filled moves; `Ok(false)`
    /// changes nothing (the page is a member of a block, pending, on the SSD log, or `to` is
    /// not empty), and the caller copies it instead.
    pub fn rename(&self, from: u64, to: u64) -> Result<bool, StoreError> {
        self.check_range(from, 1)?;
        self.check_range(to, 1)?;
        if from == to {
            return Ok(false);
        }
        let inner = &self.inner;
        // Locks in ascending index order, as everywhere in the store.
        let (lo, hi) = (from.min(to) as usize, from.max(to) as usize);
        let (st_lo, aux_lo) = inner.slots[lo].lock();
        let (st_hi, aux_hi) = inner.slots[hi].lock();
        let ((st, aux), dst) = if from < to {
            ((st_lo, aux_lo), st_hi)
        } else {
            ((st_hi, aux_hi), st_lo)
        };
        let moves = dst.kind() == EMPTY && matches!(st.kind(), OBJECT | SAME);
        if moves {
            inner.slots[to as usize].unlock_with(st, aux);
            inner.slots[from as usize].unlock_with(State::new(EMPTY), 0);
            inner.note_stored(to + 1);
            inner.counters.renamed.fetch_add(1, Ordering::Relaxed);
            if st.kind() == OBJECT {
                // Listed for the cold pass and the writeback under its new index.
                inner.note_object(to, aux);
            }
        } else {
            inner.slots[hi].unlock_keep(st_hi, 0);
            inner.slots[lo].unlock_keep(st_lo, 0);
        }
        Ok(moves)
    }

    /// Moves objects out of sparse spans and gives emptied pages back to the OS.
    pub fn compact(&self) -> zmem_pool::CompactStats {
        self.inner.pool.compact()
    }

    /// Whether the store has room to keep the copies of pages faulted back (the region's
    /// clean copies): below half its memory limit, or of its SSD log where it has one (the
    /// kernel keeps a swapped-in page's swap slot on the same terms: `vm_swap_full`).
    pub fn room_for_copies(&self) -> bool {
        let inner = &self.inner;
        if let Some(l) = inner.lower.as_ref() {
            return l.log.live_bytes() < l.log.config().size / 2;
        }
        inner
            .pool
            .mem_limit()
            .is_none_or(|limit| inner.pool.mem_used() < limit / 2)
    }

    /// Whether page `index` is held where a copy of it costs no DRAM: on the SSD log, or as
    /// a same-filled page (no object at all).
    pub fn copy_costs_no_dram(&self, index: u64) -> bool {
        self.inner
            .slots
            .get(index as usize)
            .is_some_and(|s| matches!(s.peek().kind(), LOWER | SAME))
    }

    pub fn set_mem_limit(&self, limit: Option<u64>) {
        self.inner.pool.set_mem_limit(limit);
    }

    pub fn stats(&self) -> StoreStats {
        let inner = &self.inner;
        let c = &inner.counters;
        let pool = inner.pool.stats();
        StoreStats {
            orig_data_size: c.stored.load(Ordering::Relaxed) * PAGE_SIZE as u64,
            compr_data_size: pool.object_bytes,
            mem_used_total: pool.mem_used_total,
            mem_limit: inner.pool.mem_limit().unwrap_or(0),
            mem_used_max: pool.mem_used_max,
            same_pages: c.same.load(Ordering::Relaxed),
            pages_compacted: pool.pages_compacted,
            huge_pages: c.huge.load(Ordering::Relaxed),
            pending_pages: c.pending.load(Ordering::Relaxed),
            block_pages: c.block_pages.load(Ordering::Relaxed),
            write_failures: c.write_failures.load(Ordering::Relaxed),
            reads: c.reads.load(Ordering::Relaxed),
            writes: c.writes.load(Ordering::Relaxed),
            discards: c.discards.load(Ordering::Relaxed),
            renamed: c.renamed.load(Ordering::Relaxed),
            decompress_nanos: c.decompress_nanos.load(Ordering::Relaxed),
            recompressed_pages: c.recompressed.load(Ordering::Relaxed),
            cold_after_ms: self.cold_after_ms(),
            cold_bytes_before: c.cold_bytes_before.load(Ordering::Relaxed),
            cold_bytes_after: c.cold_bytes_after.load(Ordering::Relaxed),
            repacked_pages: c.repacked.load(Ordering::Relaxed),
            entropy_tries: c.entropy_tries.load(Ordering::Relaxed),
            entropy_wins: c.entropy_wins.load(Ordering::Relaxed),
            entropy_deferred: c.entropy_deferred.load(Ordering::Relaxed),
            entropy_wait_ms: self.inner.later.as_ref().map_or(0, |l| l.wait_ms().into()),
            not_stored: c.not_stored.load(Ordering::Relaxed),
            dictionary_bytes: inner.dict().map_or(0, |d| d.bytes().len() as u64),
            dictionaries_learnt: inner.dicts.learnt() as u64,
            dictionaries_retired: inner.dicts.retired() as u64,
            dictionary_rounds: inner.learner.as_ref().map_or(0, |l| l.rounds()),
            lower_pages: c.lower.load(Ordering::Relaxed),
            lower_bytes: c.lower_bytes.load(Ordering::Relaxed),
            lower_reads: c.lower_reads.load(Ordering::Relaxed),
            lower_ahead_hits: c.lower_ahead_hits.load(Ordering::Relaxed),
            lower_errors: c.lower_errors.load(Ordering::Relaxed),
            writeback_pages: c.writeback_pages.load(Ordering::Relaxed),
            writeback_bytes: c.writeback_bytes.load(Ordering::Relaxed),
            engine: self.engine.stats(),
            pool,
        }
    }
}

impl Drop for StoreCore {
    fn drop(&mut self) {
        // In-flight jobs hold only weak references; wait for them so their memory is freed
        // with the store, then free every page's resources.
        self.inner.inflight.wait();
        // Only the table's pages ever touched can hold a slot that owns something: a store for
        // a large region (a forked child's snapshot of a 94 GiB heap: 24.7M slots) would read,
        // and so map, ~100k untouched pages one fault at a time (150 ms per dropped snapshot).
        // Walking only those pages matters: a snapshot's table has ~50M slots in ~190k pages,
        // and a check per page cost 0.5-1.7 ms per dropped snapshot, on the evictor (found
        // delaying forks that waited for it to park).
        // And only below the highest page ever stored: a store that never held a page (most
        // processes', and most forked children's, which exec at once) has nothing to walk.
        let stored = (self.inner.stored_end() as usize).min(self.inner.slots.len());
        let slots = &self.inner.slots[..stored];
        let size = std::mem::size_of::<Slot>();
        let base = slots.as_ptr() as usize;
        let first_page = base / zmem_os::PAGE_SIZE;
        let table_pages =
            (base + std::mem::size_of_val(slots)).div_ceil(zmem_os::PAGE_SIZE) - first_page;
        let in_core = match stored {
            0 => Vec::new(),
            _ => {
                zmem_os::mapping::pages_in_core(slots.as_ptr().cast(), std::mem::size_of_val(slots))
                    .unwrap_or_else(|| (0..table_pages).collect())
            }
        };
        for p in in_core {
            // The slots that start in table page p.
            let page_start = (first_page + p) * zmem_os::PAGE_SIZE;
            let from = page_start.saturating_sub(base).div_ceil(size);
            let to = (page_start + zmem_os::PAGE_SIZE - base)
                .div_ceil(size)
                .min(slots.len());
            for slot in &slots[from.min(to)..to] {
                // Empty slots own nothing.
                if slot.peek().kind() == EMPTY {
                    continue;
                }
                let (st, aux) = slot.lock();
                match st.kind() {
                    // Pool memory: the pool, dropped with the store, unmaps its chunks whole.
                    // Freed object by object, every emptied run was an madvise, and each a
                    // TLB-flush IPI to the program's CPU: a forked child's snapshot of 48 MB
                    // cost the evictor ~7 ms to drop, which the next fork waited for
                    // (docs/DESIGN-NOTES.md, "What a process pays before zmem starts").
                    OBJECT | BLOCK => {}
                    _ => self.inner.release(st, aux),
                }
                slot.unlock_with(State::new(EMPTY), 0);
            }
        }
        if let Some(l) = self.inner.lower.as_ref() {
            l.log.unregister(l.owner);
        }
    }
}

impl Inner {
    /// The dictionary new objects of the zstd codecs are made with, if there is one yet.
    pub(crate) fn dict(&self) -> Option<&Dictionary> {
        self.dicts.current().map(|d| &**d)
    }

    /// The dictionary the object `obj` was made with, if it names one this store has.
    pub(crate) fn dict_of(&self, obj: &[u8]) -> Option<&Dictionary> {
        self.dicts.of_object(obj)
    }

    /// Lets the dictionary learner see a page being written with `codec` (not same-filled).
    pub(crate) fn offer_sample(&self, page: &[u8], codec: zmem_codec::Codec) {
        if let Some(l) = &self.learner {
            l.offer(page, &self.dicts, codec);
        }
    }

    /// Pages below `end` may be stored now.
    pub(crate) fn note_stored(&self, end: u64) {
        // A load first: the line stays shared while the heap does not grow.
        if end > self.high.load(Ordering::Relaxed) {
            self.high.fetch_max(end, Ordering::Relaxed);
        }
    }

    /// One past the highest page index ever stored.
    pub(crate) fn stored_end(&self) -> u64 {
        self.high.load(Ordering::Relaxed)
    }

    /// Adds a new state's pages to the counters.
    pub(crate) fn count_new(&self, st: State, pages: u64) {
        let c = &self.counters;
        c.stored.fetch_add(pages, Ordering::Relaxed);
        match st.kind() {
            SAME => {
                c.same.fetch_add(pages, Ordering::Relaxed);
            }
            PENDING => {
                c.pending.fetch_add(pages, Ordering::Relaxed);
            }
            BLOCK => {
                c.block_pages.fetch_add(pages, Ordering::Relaxed);
            }
            _ => {}
        }
        if st.has(HUGE) {
            c.huge.fetch_add(pages, Ordering::Relaxed);
        }
    }

    /// Frees what a page's old state held. Caller holds the page's lock.
    pub(crate) fn release(&self, st: State, aux: u64) {
        let c = &self.counters;
        match st.kind() {
            EMPTY => return,
            SAME => {
                c.same.fetch_sub(1, Ordering::Relaxed);
            }
            OBJECT => self.free_handle(aux),
            BLOCK => {
                c.block_pages.fetch_sub(1, Ordering::Relaxed);
                if self.block_adjust(aux, -1) == 0 {
                    self.free_handle(aux);
                }
            }
            PENDING => {
                c.pending.fetch_sub(1, Ordering::Relaxed);
                // SAFETY: the slot owned this strong count (see mark_pending).
                drop(unsafe { Arc::from_raw(aux as *const Pending) });
            }
            LOWER => self.release_lower(st, aux),
            _ => {}
        }
        if st.has(HUGE) {
            c.huge.fetch_sub(1, Ordering::Relaxed);
        }
        c.stored.fetch_sub(1, Ordering::Relaxed);
    }

    /// Allocates an object in the pool; a full pool wakes the SSD writeback, if any, so the
    /// next write finds room.
    pub(crate) fn alloc(&self, obj: &[u8]) -> Result<Handle, zmem_pool::PoolError> {
        let r = self.pool.alloc(obj);
        if let (Err(zmem_pool::PoolError::LimitExceeded { .. }), Some(l)) = (&r, &self.lower) {
            l.kick();
        }
        r
    }

    pub(crate) fn free_handle(&self, raw: u64) {
        if let Some(h) = Handle::from_raw(raw) {
            if let Err(e) = self.pool.free(h) {
                tracing::error!(%e, "pool refused to free a handle the store owned");
            }
        }
    }
}

#[cfg(test)]
mod cold_tests;
#[cfg(test)]
mod lower_tests;
#[cfg(test)]
mod tests;
