//! The lower tier: compressed objects written back from the pool to the SSD log
//! ([`zmem_tier::Log`]) when the pool nears its memory limit, and read back from there.
//!
//! A page written back is `LOWER`: its state word keeps the codec and the object's length, its
//! aux word the object's [`Location`] in the log. The order is HMM_alloc's: the object is
//! copied out of the pool, the log writes it (whole segments, in the background), and only then
//! is the page repointed and its pool copy freed — unless the page changed meanwhile (read
//! back, overwritten, discarded), in which case the log copy is freed instead. No page lock is
//! held while the log writes.
//!
//! Which objects go: the oldest first. Every single-page object installed in the pool is
//! queued as (page, handle); writeback pops from the front and skips entries whose page no
//! longer holds that handle (read back, overwritten, discarded, moved). Under a region a page
//! is read at most once before it is discarded, so the object written longest ago is the page
//! evicted longest ago: the coldest by the region's own policy. A clock over the slot table
//! was tried first and lost: the table of a `zmem run` heap has tens of millions of slots,
//! nearly all empty, and sweeping them (zero pages faulted in by the reads) could not keep up
//! with a program filling the pool. The queue holds only objects in the pool, which the pool's
//! limit bounds; stale entries are pruned when they outnumber the live ones. Multi-page blocks
//! stay in the pool (a block's members would need one location each); pending pages are not
//! objects yet.
//!
//! The store is the log's [`Owner`]: when the collector moves an object it asks the store to
//! repoint the page, under the page's lock.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zmem_os::sync::{Condvar, Mutex};
use zmem_pool::Handle;
use zmem_tier::{Location, Log, Owner, OwnerId, TierError};

use crate::ahead::{Ahead, Side};
use crate::slot::{State, HUGE, IDLE, LOWER, OBJECT};
use crate::MAX_BLOCK_PAGES;
use crate::{Inner, StoreCore, StoreError};

/// How a store uses an SSD log below its pool.
#[derive(Clone)]
pub struct LowerConfig {
    /// The log; several stores may share one.
    pub log: Arc<Log>,
    /// Writeback starts when the pool holds this fraction of its memory limit...
    pub high_watermark: f64,
    /// ...and stops when it is back under this one.
    pub low_watermark: f64,
    /// Most pages one read from the log brings, the faulting page included: its neighbours'
    /// objects near it in the same segment, kept for their own faults (see ahead.rs). 1: no
    /// read-ahead. Default 8 (the kernel's `vm.page-cluster` 3).
    pub read_ahead: usize,
}

impl LowerConfig {
    pub fn new(log: Arc<Log>) -> LowerConfig {
        LowerConfig {
            log,
            high_watermark: 0.9,
            low_watermark: 0.75,
            read_ahead: DEFAULT_READ_AHEAD,
        }
    }

    pub(crate) fn validate(&self, mem_limit: Option<u64>) -> Result<(), StoreError> {
        if mem_limit.is_none() {
            return Err(StoreError::Config(
                "an SSD tier needs a memory limit on the pool (objects are written back as \
                 the pool nears it)"
                    .into(),
            ));
        }
        if !(1..=MAX_READ_AHEAD).contains(&self.read_ahead) {
            return Err(StoreError::Config(format!(
                "SSD read-ahead must be 1..={MAX_READ_AHEAD} pages (1: none), not {}",
                self.read_ahead
            )));
        }
        let (lo, hi) = (self.low_watermark, self.high_watermark);
        if !(lo > 0.0 && lo < hi && hi <= 1.0) {
            return Err(StoreError::Config(format!(
                "SSD writeback watermarks must satisfy 0 < low ({lo}) < high ({hi}) <= 1"
            )));
        }
        Ok(())
    }
}

impl std::fmt::Debug for LowerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LowerConfig")
            .field("log", &self.log.config().path)
            .field("high_watermark", &self.high_watermark)
            .field("low_watermark", &self.low_watermark)
            .field("read_ahead", &self.read_ahead)
            .finish()
    }
}

/// Default of [`LowerConfig::read_ahead`].
pub const DEFAULT_READ_AHEAD: usize = 8;
/// Largest [`LowerConfig::read_ahead`]: the log reads at most this many objects at once.
pub const MAX_READ_AHEAD: usize = zmem_tier::MAX_NEAR + 1;
/// Bytes one read with read-ahead may span in its segment.
const READ_AHEAD_SPAN: usize = 64 << 10;

/// A store's side of its log.
pub(crate) struct Lower {
    pub(crate) log: Arc<Log>,
    pub(crate) owner: OwnerId,
    high: f64,
    low: f64,
    /// Single-page objects in the order they entered the pool: (page, pool handle).
    queue: Mutex<VecDeque<(u64, u64)>>,
    /// Queue length after the last pruning (stale entries are pruned when it doubles).
    pruned_at: std::sync::atomic::AtomicUsize,
    /// Set when a write hit the pool's limit: the writeback thread starts at once.
    kick: Mutex<bool>,
    kicked: Condvar,
    /// The log said Full: writeback pauses (and says so once) until a pass finds room.
    full: AtomicBool,
    /// One writeback pass at a time (the thread and on-demand calls).
    busy: Mutex<()>,
    /// Objects read ahead of their faults; None without read-ahead.
    ahead: Option<Mutex<Ahead>>,
    read_ahead: usize,
}

impl Lower {
    pub(crate) fn new(cfg: &LowerConfig, owner: Weak<dyn Owner>) -> Lower {
        Lower {
            owner: cfg.log.register(owner),
            log: cfg.log.clone(),
            high: cfg.high_watermark,
            low: cfg.low_watermark,
            queue: Mutex::new(VecDeque::new()),
            pruned_at: std::sync::atomic::AtomicUsize::new(0),
            kick: Mutex::new(false),
            kicked: Condvar::new(),
            full: AtomicBool::new(false),
            busy: Mutex::new(()),
            ahead: (cfg.read_ahead > 1).then(|| {
                let sealed =
                    zmem_codec::max_encoded_len(zmem_codec::PAGE_SIZE) + cfg.log.seal_overhead();
                Mutex::new(Ahead::new(cfg.read_ahead, sealed))
            }),
            read_ahead: cfg.read_ahead,
        }
    }

    /// Wakes the writeback thread (a write found the pool full).
    pub(crate) fn kick(&self) {
        *self.kick.lock() = true;
        self.kicked.notify_one();
    }
}

/// What one writeback call did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WritebackStats {
    pub pages: u64,
    /// Object bytes written to the log.
    pub bytes: u64,
    /// Pool bytes given back to the OS by the compaction after the pass.
    pub pool_bytes_freed: u64,
}

/// What picking one page for a writeback batch did.
enum Take {
    Picked,
    /// Not a single-page object in the pool (any more), or not with the handle expected.
    Skipped,
    /// The batch's segment is full.
    Full,
}

/// A writeback batch being filled: the objects' bytes, where each is, the segment space used.
struct Batch {
    data: Vec<u8>,
    picks: Vec<Pick>,
    used: usize,
}

impl Batch {
    /// Whether page `index` is in the batch already (a segment holds a few hundred pages).
    fn has(&self, index: u64) -> bool {
        self.picks.iter().any(|p| p.index == index)
    }

    /// Copies page `index`'s object into the batch if it is a single-page object in the pool
    /// (with `handle`, when given) and the segment has room for it.
    fn take(&mut self, inner: &Inner, log: &Log, index: u64, handle: Option<u64>) -> Take {
        let slot = &inner.slots[index as usize];
        let (st, aux) = slot.lock();
        if st.kind() != OBJECT
            || handle.is_some_and(|h| h != aux)
            || st.len() as usize > log.max_object()
        {
            slot.unlock_keep(st, 0);
            return Take::Skipped;
        }
        let space = log.object_space(st.len() as usize);
        if self.used + space > log.segment_space() && !self.picks.is_empty() {
            slot.unlock_keep(st, 0);
            return Take::Full;
        }
        let start = self.data.len();
        let copied = Handle::from_raw(aux).map(|h| {
            inner
                .pool
                .with_object(h, |obj| self.data.extend_from_slice(obj))
        });
        slot.unlock_keep(st, 0);
        if !matches!(copied, Some(Ok(()))) {
            self.data.truncate(start);
            return Take::Skipped;
        }
        self.used += space;
        self.picks.push(Pick {
            index,
            handle: aux,
            start,
            len: self.data.len() - start,
        });
        Take::Picked
    }
}

/// A page picked for writeback: its index, the pool handle it held, and where its bytes are in
/// the batch buffer.
struct Pick {
    index: u64,
    handle: u64,
    start: usize,
    len: usize,
}

thread_local! {
    /// An object read back from the log, before it is decoded.
    static FETCHED: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Registers this thread's fetch buffer now (see `crate::prepare_thread`).
pub(crate) fn prepare_thread() {
    FETCHED.with(|_| ());
    zmem_tier::prepare_thread();
}

impl StoreCore {
    /// Writes back up to `max_bytes` of compressed objects from the pool to the SSD log, the
    /// coldest first, and compacts the pool so their memory goes back to the OS. Returns what
    /// it moved. `StoreError::Config` if the store has no lower tier; a log error ends the
    /// pass (what was written before stays written). Runs by itself in the background when the
    /// pool nears its limit.
    pub fn writeback(&self, max_bytes: u64) -> Result<WritebackStats, StoreError> {
        let lower = self.inner.lower.as_ref().ok_or_else(|| {
            StoreError::Config("this store has no SSD tier to write back to".into())
        })?;
        let _one = lower.busy.lock();
        let mut stats = WritebackStats::default();

        let before = self.inner.pool.stats().mem_used_total;
        let mut result = Ok(());
        while stats.bytes < max_bytes {
            let want = max_bytes - stats.bytes;
            match self.writeback_batch(lower, want) {
                Ok((0, _)) => break,
                Ok((pages, bytes)) => {
                    stats.pages += pages;
                    stats.bytes += bytes;
                }
                Err(e) => {
                    result = Err(e);
                    break;
                }
            }
        }
        if stats.pages > 0 {
            self.inner.pool.compact();
            let after = self.inner.pool.stats().mem_used_total;
            stats.pool_bytes_freed = before.saturating_sub(after);
        }
        result.map(|()| stats)
    }

    /// Picks the oldest objects, as many as fill one segment of the log (or `want` bytes),
    /// writes them and repoints their pages. Returns the pages and bytes moved (0 pages: the
    /// queue is empty).
    fn writeback_batch(&self, lower: &Lower, want: u64) -> Result<(u64, u64), StoreError> {
        let inner = &self.inner;
        let mut batch = Batch {
            data: Vec::with_capacity(lower.log.segment_space()),
            picks: Vec::new(),
            used: 0,
        };
        // With read-ahead, the pages next to a picked one whose objects are in the pool too
        // go beside it: pages near each other in memory are then near each other on the log,
        // and a fault that reads one brings the others (ahead.rs). Without this the log
        // holds pages in eviction order, in which a program's neighbours rarely follow each
        // other (memcached: 11k of 37k objects read ahead were used).
        let gather = if lower.ahead.is_some() {
            lower.read_ahead as u64 - 1
        } else {
            0
        };
        'batch: while (batch.data.len() as u64) < want {
            let Some((index, handle)) = lower.queue.lock().pop_front() else {
                break;
            };
            if batch.has(index) {
                continue; // already gathered beside a neighbour
            }
            match batch.take(inner, &lower.log, index, Some(handle)) {
                Take::Skipped => continue,
                Take::Full => {
                    // The segment is full: this one leads the next batch.
                    lower.queue.lock().push_front((index, handle));
                    break;
                }
                Take::Picked => {}
            }
            for up in [true, false] {
                for d in 1..=gather {
                    let j = if up {
                        index
                            .checked_add(d)
                            .filter(|&j| j < inner.slots.len() as u64)
                    } else {
                        index.checked_sub(d)
                    };
                    let Some(j) = j else { break };
                    if batch.has(j) {
                        continue;
                    }
                    match batch.take(inner, &lower.log, j, None) {
                        Take::Picked => {}
                        Take::Skipped => break,
                        Take::Full => break 'batch,
                    }
                }
            }
        }
        let Batch { data, picks, .. } = batch;
        if picks.is_empty() {
            return Ok((0, 0));
        }
        let objects: Vec<(u64, &[u8])> = picks
            .iter()
            .map(|p| (p.index, &data[p.start..p.start + p.len]))
            .collect();
        let c = &inner.counters;
        let locations = match lower.log.write(lower.owner, &objects) {
            Ok(l) => l,
            Err(e) => {
                if matches!(e, TierError::Full { .. }) {
                    if !lower.full.swap(true, Ordering::Relaxed) {
                        tracing::warn!("{e}: cold pages stay in the pool");
                    }
                } else {
                    c.lower_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!("writing back to the SSD log failed: {e}");
                }
                // Still in the pool: back at the front of the queue, oldest first.
                let mut q = lower.queue.lock();
                for p in picks.iter().rev() {
                    q.push_front((p.index, p.handle));
                }
                return Err(StoreError::Lower {
                    index: None,
                    source: e,
                });
            }
        };
        lower.full.store(false, Ordering::Relaxed);
        let (mut moved, mut bytes) = (0u64, 0u64);
        for (p, loc) in picks.iter().zip(locations) {
            let slot = &inner.slots[p.index as usize];
            let (st, aux) = slot.lock();
            if st.kind() == OBJECT && aux == p.handle {
                inner.free_handle(aux);
                let new = State::new(LOWER)
                    .with_object(st.codec(), p.len)
                    .with_flag(HUGE, st.has(HUGE))
                    .with_flag(IDLE, st.has(IDLE));
                c.lower.fetch_add(1, Ordering::Relaxed);
                c.lower_bytes.fetch_add(p.len as u64, Ordering::Relaxed);
                slot.unlock_with(new, loc.0);
                moved += 1;
                bytes += p.len as u64;
            } else {
                // Read back, overwritten or discarded while the log wrote it.
                slot.unlock_keep(st, 0);
                lower.log.free(loc);
            }
        }
        c.writeback_pages.fetch_add(moved, Ordering::Relaxed);
        c.writeback_bytes.fetch_add(bytes, Ordering::Relaxed);
        Ok((moved, bytes))
    }

    /// The writeback thread: whenever the pool passes the high watermark of its limit (checked
    /// every 20 ms, or at once when a write finds the pool full), writes back until it is under
    /// the low one.
    pub(crate) fn spawn_writeback(
        core: Arc<StoreCore>,
        stop: Arc<AtomicBool>,
    ) -> Result<JoinHandle<()>, StoreError> {
        zmem_os::thread::spawn("zmem-writeback".into(), move || {
            let Some(lower) = core.inner.lower.as_ref() else {
                return;
            };
            // After a pass that moved nothing (the log full, nothing cold, an error), the next
            // waits a second: a scan of a large table every tick would be wasted CPU.
            let mut pause_until: Option<Instant> = None;
            while !stop.load(Ordering::Acquire) {
                {
                    let mut k = lower.kick.lock();
                    if !*k {
                        lower.kicked.wait_for(&mut k, Duration::from_millis(20));
                    }
                    *k = false;
                }
                let Some(limit) = core.inner.pool.mem_limit() else {
                    continue;
                };
                if pause_until.is_some_and(|t| Instant::now() < t) {
                    continue;
                }
                let used = core.inner.pool.stats().mem_used_total;
                if (used as f64) < lower.high * limit as f64 {
                    continue;
                }
                let target = (lower.low * limit as f64) as u64;
                // Object bytes to move: the excess, plus what fragmentation hides.
                let excess = used.saturating_sub(target).max(1);
                pause_until = match core.writeback(excess) {
                    Ok(s) if s.pages > 0 => None,
                    _ => Some(Instant::now() + Duration::from_secs(1)),
                };
            }
        })
        .map_err(|e| StoreError::Config(format!("cannot start the SSD writeback: {e}")))
    }
}

impl Inner {
    /// A single-page object was installed for page `index`: list it for the cold pass (unless
    /// it is in the cold codec already) and queue it for writeback.
    pub(crate) fn note_object(&self, index: u64, handle: u64) {
        if let Some(cold) = self.cold.as_ref() {
            if self.slots[index as usize].peek().codec() != cold.codec.id() as u8 {
                cold.push(index);
            }
        }
        let Some(lower) = self.lower.as_ref() else {
            return;
        };
        let mut q = lower.queue.lock();
        q.push_back((index, handle));
        // Entries of pages read back or rewritten since stay until popped; where they outnumber
        // the live ones (the queue doubled since the last pruning), drop them.
        let at = lower.pruned_at.load(Ordering::Relaxed);
        if q.len() > 4096 && q.len() > 2 * at {
            q.retain(|&(i, h)| {
                let s = &self.slots[i as usize];
                s.peek().kind() == OBJECT && s.peek_aux() == h
            });
            lower.pruned_at.store(q.len(), Ordering::Relaxed);
        }
    }

    /// The pool refused an object: with a lower tier, write back the oldest objects now (on
    /// the calling thread, so the caller's retry finds room). Whether anything moved.
    pub(crate) fn make_room_now(&self, core: &StoreCore) -> bool {
        if self.lower.is_none() {
            return false;
        }
        // A few objects' worth more than one page: the first retry must fit.
        let want = (MAX_BLOCK_PAGES * zmem_codec::PAGE_SIZE * 16) as u64;
        core.writeback(want).is_ok_and(|w| w.pages > 0)
    }

    /// Reads a LOWER page's object back from the log and decodes it into `out`: from what an
    /// earlier read brought along if it is there, else with a device read that brings its
    /// neighbours along (ahead.rs). Caller holds the page's lock.
    pub(crate) fn read_lower(
        &self,
        index: u64,
        st: State,
        aux: u64,
        out: &mut [u8],
    ) -> Result<(), StoreError> {
        let Some(lower) = self.lower.as_ref() else {
            return Err(StoreError::Lower {
                index: Some(index),
                source: TierError::Config("page is on an SSD tier this store does not have".into()),
            });
        };
        let c = &self.counters;
        c.lower_reads.fetch_add(1, Ordering::Relaxed);
        let (loc, len) = (Location(aux), st.len() as usize);
        let overhead = lower.log.seal_overhead();
        FETCHED.with(|cell| {
            let mut buf = cell.borrow_mut();
            if buf.len() < len + overhead {
                buf.resize(len + overhead, 0);
            }
            let mut near = [(0u64, Location(0), 0usize); zmem_tier::MAX_NEAR];
            let mut n_near = 0;
            if let Some(ahead) = lower.ahead.as_ref() {
                // Opened (decrypted) without the lock: other threads' faults need it.
                let fetched = ahead.lock().take(index, loc, &mut buf);
                if let Some((generation, l)) = fetched {
                    if l == len
                        && lower.log.open_fetched(
                            lower.owner,
                            index,
                            loc,
                            generation,
                            len,
                            &mut buf[..len + overhead],
                        )
                    {
                        ahead.lock().window.hit();
                        c.lower_ahead_hits.fetch_add(1, Ordering::Relaxed);
                        return self.decode_fetched(index, &buf[..len], out);
                    }
                }
                let mut a = ahead.lock();
                let (pages, side) = a.window.pages(index);
                n_near = self.neighbours_on_log(&a, index, loc, pages, side, &mut near);
            }
            let keep = &mut |f: zmem_tier::ReadAlong<'_>| {
                if let Some(ahead) = lower.ahead.as_ref() {
                    let len = f.sealed.len() - overhead;
                    ahead
                        .lock()
                        .put(f.index, f.loc, f.generation, len, f.sealed);
                }
            };
            if let Err(source) = lower.log.read_around(
                lower.owner,
                index,
                loc,
                &mut buf[..len],
                &near[..n_near],
                READ_AHEAD_SPAN,
                keep,
            ) {
                c.lower_errors.fetch_add(1, Ordering::Relaxed);
                return Err(StoreError::Lower {
                    index: Some(index),
                    source,
                });
            }
            self.decode_fetched(index, &buf[..len], out)
        })
    }

    /// The pages to read along with LOWER page `index` at `loc`, as many as the window says:
    /// the nearest pages on the window's side(s) that are LOWER in the same segment and not
    /// read ahead already (the log leaves out those that are not near enough). A racy look
    /// at each slot: the log checks that an object of that length lives there, and an object
    /// read ahead is used only for the page and location it was read for.
    fn neighbours_on_log(
        &self,
        a: &Ahead,
        index: u64,
        loc: Location,
        pages: usize,
        side: Side,
        near: &mut [(u64, Location, usize); zmem_tier::MAX_NEAR],
    ) -> usize {
        let want = pages.saturating_sub(1).min(near.len());
        let mut n = 0;
        let mut d = 1u64;
        while n < want && d <= 2 * zmem_tier::MAX_NEAR as u64 {
            let after = (side != Side::Before)
                .then(|| index.checked_add(d))
                .flatten();
            let before = (side != Side::After)
                .then(|| index.checked_sub(d))
                .flatten();
            for j in [after, before].into_iter().flatten() {
                let Some(slot) = self.slots.get(j as usize) else {
                    continue;
                };
                let s = slot.peek();
                let l = Location(slot.peek_aux());
                if n < want && s.kind() == LOWER && l.segment() == loc.segment() && !a.has(j, l) {
                    near[n] = (j, l, s.len() as usize);
                    n += 1;
                }
            }
            d += 1;
        }
        n
    }

    /// Decodes a page's object fetched from the log into `out`.
    fn decode_fetched(&self, index: u64, obj: &[u8], out: &mut [u8]) -> Result<(), StoreError> {
        let t = Instant::now();
        self.counters.decodes.fetch_add(1, Ordering::Relaxed);
        let r = zmem_codec::decode(obj, self.dict_of(obj), out)
            .map(|_| ())
            .map_err(|source| StoreError::Corrupt { index, source });
        self.counters
            .decompress_nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    /// Frees a LOWER page's log copy. Caller holds the page's lock.
    pub(crate) fn release_lower(&self, st: State, aux: u64) {
        if let Some(lower) = self.lower.as_ref() {
            lower.log.free(Location(aux));
        }
        let c = &self.counters;
        c.lower.fetch_sub(1, Ordering::Relaxed);
        c.lower_bytes
            .fetch_sub(u64::from(st.len()), Ordering::Relaxed);
    }
}

impl Owner for Inner {
    fn relocate(&self, index: u64, old: Location, new: Location) -> bool {
        let Some(slot) = self.slots.get(index as usize) else {
            return false;
        };
        let (st, aux) = slot.lock();
        if st.kind() == LOWER && aux == old.0 {
            slot.unlock_with(st, new.0);
            true
        } else {
            slot.unlock_keep(st, 0);
            false
        }
    }
}
