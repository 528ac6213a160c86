//! PageStore: zram's semantics as a library. A fixed range of page indices; each page is empty
//! (reads as zeros), same-filled (one word, no pool memory), a compressed object in the pool, a
//! member of a compressed multi-page block, or pending (written, not yet compressed: the
//! asynchronous write path of QZRAM, where the caller does not wait for compression).
//!
//! Each page's state is 16 bytes ([`slot`]), with a per-page lock bit, so pages are independent
//! and the store is safe from any number of threads. A lower tier (the SSD log) and larger
//! blocks fit in the same word without a redesign: the kind field has room, and a location fits
//! the aux word.

mod slot;

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex as StdMutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use zmem_codec::{CodecError, CodecId, Dictionary, PAGE_SIZE};
use zmem_engine::{Completion, Engine, EngineConfig, EngineError, EngineStats, Job, Policy, Sink};
use zmem_pool::{Handle, Pool, PoolConfig, PoolError, PoolStats};

use slot::{Slot, State, BLOCK, EMPTY, HUGE, IDLE, OBJECT, PENDING, SAME};

/// Largest multi-page block, in pages (64 KiB).
pub const MAX_BLOCK_PAGES: usize = 16;

/// Errors of the page store. A failed call changes nothing unless its doc says otherwise.
#[derive(thiserror::Error, Debug, Clone, PartialEq)]
pub enum StoreError {
    #[error("buffer of {len} bytes is not {what}")]
    BadLength { len: usize, what: &'static str },
    #[error("page {index} (+{count}) is out of range: the store has {pages} pages")]
    OutOfRange { index: u64, count: u64, pages: u64 },
    #[error("memory limit reached: {used} bytes used of {limit}")]
    MemoryLimit { used: u64, limit: u64 },
    #[error("page {index}: stored data is corrupt: {source}")]
    Corrupt { index: u64, source: CodecError },
    #[error("pool: {0}")]
    Pool(PoolError),
    #[error("engine: {0}")]
    Engine(#[from] EngineError),
    #[error("invalid store configuration: {0}")]
    Config(String),
    #[error("{pages} written pages are still uncompressed: {reason}")]
    WritesPending { pages: u64, reason: String },
    #[error("invalid page group: {0}")]
    BadGroup(String),
}

impl From<PoolError> for StoreError {
    fn from(e: PoolError) -> StoreError {
        match e {
            PoolError::LimitExceeded { used, limit, .. } => StoreError::MemoryLimit { used, limit },
            other => StoreError::Pool(other),
        }
    }
}

/// Store settings.
#[derive(Clone, Debug)]
pub struct StoreConfig {
    /// Capacity in pages (zram's disksize / 4096).
    pub pages: u64,
    pub policy: Policy,
    /// Bytes of pool memory the store may use (zram's mem_limit); None = unlimited.
    pub mem_limit: Option<u64>,
    /// Pages per multi-page block for aligned batch writes: 1 (off) or 2..=16.
    pub block_pages: usize,
    /// Trained zstd dictionary used by zstd-based policies.
    pub dictionary: Option<Arc<Dictionary>>,
    pub engine: EngineConfig,
    /// With `Policy::Auto`: every interval, pages idle since the last pass are recompressed
    /// with the cold codec into blocks (zram's idle recompression).
    pub recompress_interval: Option<Duration>,
}

impl StoreConfig {
    pub fn new(pages: u64, policy: Policy) -> StoreConfig {
        StoreConfig {
            pages,
            policy,
            mem_limit: None,
            block_pages: 1,
            dictionary: None,
            engine: EngineConfig::default(),
            recompress_interval: None,
        }
    }
}

/// Statistics with the meaning of zram's mm_stat, plus zmem's own counters.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct StoreStats {
    /// Bytes of pages stored (all non-empty pages, same-filled and pending included).
    pub orig_data_size: u64,
    /// Bytes of compressed objects (headers included).
    pub compr_data_size: u64,
    /// Bytes the pool holds from the OS.
    pub mem_used_total: u64,
    pub mem_limit: u64,
    pub mem_used_max: u64,
    pub same_pages: u64,
    pub pages_compacted: u64,
    /// Pages stored raw because they did not compress below the rejection threshold.
    pub huge_pages: u64,
    /// Written pages still waiting for compression.
    pub pending_pages: u64,
    pub block_pages: u64,
    /// Asynchronous writes whose install failed (memory limit); the pages stay readable.
    pub write_failures: u64,
    pub reads: u64,
    pub writes: u64,
    pub discards: u64,
    /// Nanoseconds spent decoding on reads.
    pub decompress_nanos: u64,
    pub recompressed_pages: u64,
    /// Pages moved out of sparse group blocks into new blocks ([`StoreCore::repack_groups`]).
    pub repacked_pages: u64,
    /// Not serialised (the engine's and the pool's own types have no schema).
    #[serde(skip)]
    pub engine: EngineStats,
    #[serde(skip)]
    pub pool: PoolStats,
}

/// Result of one recompression pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecompressStats {
    pub pages_recompressed: u64,
    pub blocks_built: u64,
    pub bytes_before: u64,
    pub bytes_after: u64,
}

/// Written data waiting for compression; shared by its pages' slots and the in-flight job.
struct Pending {
    input: Arc<[u8]>,
}

#[derive(Default)]
struct Counters {
    stored: AtomicU64,
    same: AtomicU64,
    huge: AtomicU64,
    pending: AtomicU64,
    block_pages: AtomicU64,
    write_failures: AtomicU64,
    reads: AtomicU64,
    writes: AtomicU64,
    discards: AtomicU64,
    decompress_nanos: AtomicU64,
    recompressed: AtomicU64,
    repacked: AtomicU64,
    /// Objects decoded (tests check that a block is decoded once per batch).
    decodes: AtomicU64,
}

/// Counts jobs in flight so flush() and drop can wait for them.
#[derive(Default)]
struct Latch {
    n: StdMutex<u64>,
    cv: Condvar,
}

impl Latch {
    fn add(&self, k: u64) {
        *self.n.lock().unwrap_or_else(|e| e.into_inner()) += k;
    }
    fn done(&self) {
        let mut n = self.n.lock().unwrap_or_else(|e| e.into_inner());
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.cv.notify_all();
        }
    }
    fn wait(&self) {
        let mut n = self.n.lock().unwrap_or_else(|e| e.into_inner());
        while *n != 0 {
            n = self.cv.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}

const BLOCK_SHARDS: usize = 64;
/// Most sparse blocks waiting for a repack.
const SPARSE_QUEUE_MAX: usize = 1 << 16;

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
    slots: Box<[Slot]>,
    pool: Pool,
    dict: Option<Arc<Dictionary>>,
    counters: Counters,
    /// Live member pages per block object, by pool handle.
    blocks: Vec<Mutex<HashMap<u64, BlockMeta>>>,
    /// Group blocks that lost at least half of their members, waiting for a repack.
    sparse: Mutex<Vec<u64>>,
    inflight: Arc<Latch>,
    /// Pending data whose install failed, retried by flush().
    retry: Mutex<Vec<(u64, Arc<[u8]>)>>,
    last_failure: Mutex<Option<String>>,
}

/// The page store. See the crate docs. Its operations are those of [`StoreCore`], which it
/// shares with its background recompressor (if any).
pub struct PageStore {
    core: Arc<StoreCore>,
    background: Option<(Arc<AtomicBool>, JoinHandle<()>)>,
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

impl PageStore {
    pub fn new(cfg: StoreConfig) -> Result<PageStore, StoreError> {
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
        let engine = Engine::new(cfg.engine.clone())?;
        // Zeroed, not written: untouched pages cost no DRAM.
        let slots = Slot::table(cfg.pages as usize);
        let inner = Arc::new(Inner {
            slots,
            pool,
            dict: cfg.dictionary.clone(),
            counters: Counters::default(),
            blocks: (0..BLOCK_SHARDS)
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            sparse: Mutex::new(Vec::new()),
            inflight: Arc::new(Latch::default()),
            retry: Mutex::new(Vec::new()),
            last_failure: Mutex::new(None),
        });
        let core = Arc::new(StoreCore {
            inner,
            engine,
            policy: cfg.policy,
            block_pages: cfg.block_pages,
        });
        let background = match (cfg.recompress_interval, cfg.policy.cold_codec()) {
            (Some(every), Some(codec)) => Some(spawn_recompressor(core.clone(), codec, every)?),
            _ => None,
        };
        Ok(PageStore { core, background })
    }
}

/// Every `every`, recompresses the pages that stayed idle since the previous pass.
fn spawn_recompressor(
    core: Arc<StoreCore>,
    codec: zmem_codec::Codec,
    every: Duration,
) -> Result<(Arc<AtomicBool>, JoinHandle<()>), StoreError> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let h = zmem_os::thread::spawn("zmem-recompress".into(), move || {
        let mut last = Instant::now();
        core.mark_idle();
        while !flag.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(20).min(every));
            if last.elapsed() >= every {
                let s = core.recompress(codec, true);
                tracing::debug!(?s, "idle recompression pass");
                core.mark_idle();
                last = Instant::now();
            }
        }
    })
    .map_err(|e| StoreError::Config(format!("cannot start the recompressor: {e}")))?;
    Ok((stop, h))
}

impl Drop for PageStore {
    fn drop(&mut self) {
        if let Some((stop, h)) = self.background.take() {
            stop.store(true, Ordering::Release);
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

    fn check_range(&self, index: u64, count: u64) -> Result<(), StoreError> {
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

    fn pages_of(len: usize, what: &'static str) -> Result<u64, StoreError> {
        if len == 0 || len % PAGE_SIZE != 0 {
            return Err(StoreError::BadLength { len, what });
        }
        Ok((len / PAGE_SIZE) as u64)
    }

    /// Writes one page, compressing it on the calling thread. On error the page keeps its old
    /// content.
    pub fn write(&self, index: u64, page: &[u8]) -> Result<(), StoreError> {
        if page.len() != PAGE_SIZE {
            return Err(StoreError::BadLength {
                len: page.len(),
                what: "one page (4096 bytes)",
            });
        }
        self.check_range(index, 1)?;
        let inner = &self.inner;
        inner.counters.writes.fetch_add(1, Ordering::Relaxed);
        if let Some(word) = zmem_codec::same_filled(page) {
            inner.install_same(index, word);
            return Ok(());
        }
        let codec = self.policy.write_codec();
        let (obj, enc) = self
            .engine
            .compress_now(codec, inner.dict.as_deref(), page)?;
        let handle = inner.pool.alloc(&obj)?;
        let state = State::new(OBJECT)
            .with_object(enc.codec as u8, obj.len())
            .with_flag(HUGE, enc.codec == CodecId::Raw);
        let slot = &inner.slots[index as usize];
        let (old, aux) = slot.lock();
        inner.release(old, aux);
        inner.count_new(state, 1);
        slot.unlock_with(state, handle.to_raw());
        Ok(())
    }

    /// Writes up to [`MAX_BLOCK_PAGES`] pages with any indices (distinct, in any order) as one
    /// group, compressing them on the calling thread: `pages[k]` becomes the content of page
    /// `indices[k]`. Same-filled pages are stored as such; the others are compressed together as
    /// one block object (better ratio than page by page: zstd has more history to match), each
    /// page a member at its position. A block that the rejection rule refuses (incompressible
    /// data) is not kept: its pages are stored one by one instead, as [`write`](Self::write)
    /// would. A single compressible page is stored alone.
    ///
    /// Members behave like those of any block: reading one decodes the block (a batch read
    /// decodes it once for all its members in the range), and overwriting or discarding one
    /// leaves the others intact; the object is freed with its last member.
    ///
    /// Every object is allocated before any page changes: on error (memory limit, bad input)
    /// no page of the group changes.
    pub fn write_group(&self, indices: &[u64], pages: &[&[u8]]) -> Result<(), StoreError> {
        let n = indices.len();
        if n == 0 || n > MAX_BLOCK_PAGES || pages.len() != n {
            return Err(StoreError::BadGroup(format!(
                "{n} indices and {} pages (need the same number, 1..={MAX_BLOCK_PAGES})",
                pages.len()
            )));
        }
        for p in pages {
            if p.len() != PAGE_SIZE {
                return Err(StoreError::BadLength {
                    len: p.len(),
                    what: "one page (4096 bytes)",
                });
            }
        }
        for (k, &i) in indices.iter().enumerate() {
            self.check_range(i, 1)?;
            if indices[..k].contains(&i) {
                return Err(StoreError::BadGroup(format!(
                    "page {i} is in the group twice"
                )));
            }
        }
        let inner = &self.inner;
        inner.counters.writes.fetch_add(n as u64, Ordering::Relaxed);
        // Which pages are same-filled, and which go into the block (by position).
        let mut same = [None::<u64>; MAX_BLOCK_PAGES];
        let mut members = [0usize; MAX_BLOCK_PAGES];
        let mut m = 0;
        for (k, p) in pages.iter().enumerate() {
            same[k] = zmem_codec::same_filled(p);
            if same[k].is_none() {
                members[m] = k;
                m += 1;
            }
        }
        let members = &members[..m];
        let codec = self.policy.write_codec();
        let dict = inner.dict.as_deref();
        // Allocate first: the pool objects for the compressible pages, as one block or one by
        // one. Nothing has changed yet if this fails.
        let mut block = None;
        if m > 1 {
            let (obj, enc) = GROUP.with(|cell| {
                let mut data = cell.borrow_mut();
                data.clear();
                for &k in members {
                    data.extend_from_slice(pages[k]);
                }
                self.engine.compress_now(codec, dict, &data)
            })?;
            if enc.codec != CodecId::Raw {
                block = Some((inner.pool.alloc(&obj)?, enc.codec, obj.len()));
            }
        }
        if let Some((handle, codec, len)) = block {
            let raw = handle.to_raw();
            let mut at = [0u64; MAX_BLOCK_PAGES];
            for (j, &k) in members.iter().enumerate() {
                at[j] = indices[k];
            }
            // Counted before any member is installed, so that a member overwritten at once
            // cannot free the block under the others.
            inner.block_register(raw, &at[..m]);
            let state = State::new(BLOCK).with_object(codec as u8, len);
            for (j, &k) in members.iter().enumerate() {
                let slot = &inner.slots[indices[k] as usize];
                let (old, aux) = slot.lock();
                inner.release(old, aux);
                let s = state.with_block(j, m);
                inner.count_new(s, 1);
                slot.unlock_with(s, raw);
            }
        } else if m > 0 {
            // One object per page (a lone page, or a group that did not compress as a block).
            let mut objects: [Option<(Handle, State)>; MAX_BLOCK_PAGES] = [None; MAX_BLOCK_PAGES];
            for (j, &k) in members.iter().enumerate() {
                let got = self
                    .engine
                    .compress_now(codec, dict, pages[k])
                    .map_err(StoreError::from)
                    .and_then(|(obj, enc)| {
                        let h = inner.pool.alloc(&obj)?;
                        let st = State::new(OBJECT)
                            .with_object(enc.codec as u8, obj.len())
                            .with_flag(HUGE, enc.codec == CodecId::Raw);
                        Ok((h, st))
                    });
                match got {
                    Ok(o) => objects[j] = Some(o),
                    Err(e) => {
                        for (h, _) in objects.iter().flatten() {
                            inner.free_handle(h.to_raw());
                        }
                        return Err(e);
                    }
                }
            }
            for (j, &k) in members.iter().enumerate() {
                let Some((handle, state)) = objects[j] else {
                    continue;
                };
                let slot = &inner.slots[indices[k] as usize];
                let (old, aux) = slot.lock();
                inner.release(old, aux);
                inner.count_new(state, 1);
                slot.unlock_with(state, handle.to_raw());
            }
        }
        for (k, w) in same[..n].iter().enumerate() {
            if let Some(w) = *w {
                inner.install_same(indices[k], w);
            }
        }
        Ok(())
    }

    /// Repacks sparse group blocks: a block from [`write_group`](Self::write_group) that has
    /// lost half of its members or more still holds all of its bytes, so its survivors are
    /// moved, together with those of other sparse blocks, into a new block of up to
    /// `max_pages` pages (1..=[`MAX_BLOCK_PAGES`]), and the old blocks are freed with their
    /// last member. Moves at most `max_pages` pages per call, compressing on the calling thread;
    /// returns how many it moved. Pages written, discarded or read meanwhile are safe: a page
    /// is moved only if it still points at the block and position its copy came from.
    pub fn repack_groups(&self, max_pages: usize) -> usize {
        let inner = &self.inner;
        let cap = max_pages.clamp(1, MAX_BLOCK_PAGES);
        // Survivors collected so far: their page, and the block and position they came from.
        let mut dest = [0u64; MAX_BLOCK_PAGES];
        let mut from = [(0u64, 0usize); MAX_BLOCK_PAGES];
        let mut k = 0;
        // Pinned source blocks (each gave at least one survivor, so at most `cap`).
        let mut pinned = [(0u64, false); MAX_BLOCK_PAGES];
        let mut npinned = 0;
        // Blocks looked at, at most (stale entries of freed blocks are skipped).
        let mut pops = 4 * cap;
        let mut members = [0u64; MAX_BLOCK_PAGES];
        GROUP.with(|group| {
            let mut group = group.borrow_mut();
            group.resize(cap * PAGE_SIZE, 0);
            SCRATCH.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                while k < cap && pops > 0 {
                    pops -= 1;
                    let Some(handle) = inner.sparse.lock().pop() else {
                        break;
                    };
                    let Some(n) = inner.block_pin_sparse(handle, &mut members) else {
                        continue;
                    };
                    // Which members still point here (checked again when they are moved).
                    let mut found = [(0u64, State(0)); MAX_BLOCK_PAGES];
                    let mut nfound = 0;
                    for (pos, &index) in members[..n].iter().enumerate() {
                        let slot = &inner.slots[index as usize];
                        let (st, aux) = slot.lock();
                        slot.unlock_keep(st, 0);
                        if st.kind() == BLOCK && aux == handle && st.pos() == pos {
                            found[nfound] = (index, st);
                            nfound += 1;
                        }
                    }
                    let take = nfound.min(cap - k);
                    // The pin keeps the object alive: decode it without holding page locks.
                    if take == 0
                        || inner
                            .decode_block(found[0].0, found[0].1, handle, &mut scratch)
                            .is_err()
                    {
                        inner.block_unpin(handle, false);
                        continue;
                    }
                    for &(index, st) in &found[..take] {
                        group[k * PAGE_SIZE..][..PAGE_SIZE]
                            .copy_from_slice(&scratch[st.pos() * PAGE_SIZE..][..PAGE_SIZE]);
                        dest[k] = index;
                        from[k] = (handle, st.pos());
                        k += 1;
                    }
                    pinned[npinned] = (handle, take < nfound);
                    npinned += 1;
                }
            });
            if k > 0 {
                self.install_repacked(&group[..k * PAGE_SIZE], &dest[..k], &from[..k]);
            }
        });
        // Unpinning frees the sources whose every member moved (or is gone); one that kept
        // survivors is still sparse and queues itself again.
        for &(h, left_some) in &pinned[..npinned] {
            inner.block_unpin(h, left_some);
        }
        inner
            .counters
            .repacked
            .fetch_add(k as u64, Ordering::Relaxed);
        k
    }

    /// Stores `data` (copies of the pages `dest`, each still a member of block `from.0` at
    /// position `from.1`) as one object and points each page at it if it is still that member.
    fn install_repacked(&self, data: &[u8], dest: &[u64], from: &[(u64, usize)]) {
        let inner = &self.inner;
        let k = dest.len();
        let Ok((obj, enc)) =
            self.engine
                .compress_now(self.policy.write_codec(), inner.dict.as_deref(), data)
        else {
            return;
        };
        if enc.codec == CodecId::Raw {
            return; // cannot happen for data that compressed before; never worth it
        }
        let Ok(handle) = inner.pool.alloc(&obj) else {
            return; // memory limit: the pages stay where they are
        };
        let raw = handle.to_raw();
        let state = if k > 1 {
            inner.block_register(raw, dest);
            State::new(BLOCK).with_object(enc.codec as u8, obj.len())
        } else {
            State::new(OBJECT).with_object(enc.codec as u8, obj.len())
        };
        let mut missed = 0;
        for (j, (&index, &(src, pos))) in dest.iter().zip(from).enumerate() {
            let slot = &inner.slots[index as usize];
            let (st, aux) = slot.lock();
            if st.kind() != BLOCK || aux != src || st.pos() != pos {
                slot.unlock_keep(st, 0); // written or dropped meanwhile
                missed += 1;
                continue;
            }
            inner.release(st, aux);
            let s = if k > 1 { state.with_block(j, k) } else { state };
            let s = s.with_flag(IDLE, st.has(IDLE));
            inner.count_new(s, 1);
            slot.unlock_with(s, raw);
        }
        if k > 1 {
            if missed > 0 && inner.block_adjust(raw, -missed) == 0 {
                inner.free_handle(raw);
            }
        } else if missed > 0 {
            inner.free_handle(raw);
        }
    }

    /// Writes consecutive pages and waits until they are compressed and stored. Aligned runs
    /// of `block_pages` are compressed together as one block. The pages are compressed in
    /// parallel by the engine's workers.
    pub fn write_batch(&self, start: u64, data: &[u8]) -> Result<(), StoreError> {
        let latch = Arc::new(Latch::default());
        self.write_pages(start, data, Some(latch.clone()))?;
        latch.wait();
        self.inner
            .take_failures(start, data.len() as u64 / PAGE_SIZE as u64)
    }

    /// Writes consecutive pages and returns before they are compressed (QZRAM's parallel
    /// write path). Reads see the new data at once. [`flush`](Self::flush) waits for the
    /// compression and reports installs that failed.
    pub fn write_async(&self, start: u64, data: &[u8]) -> Result<(), StoreError> {
        self.write_pages(start, data, None)
    }

    fn write_pages(
        &self,
        start: u64,
        data: &[u8],
        latch: Option<Arc<Latch>>,
    ) -> Result<(), StoreError> {
        let n = Self::pages_of(data.len(), "a whole number of pages")?;
        self.check_range(start, n)?;
        let inner = &self.inner;
        // Admission: refuse up front what cannot fit even if it compressed to nothing more
        // than a full pool, so a refused batch changes nothing.
        if let Some(limit) = inner.pool.mem_limit() {
            let used = inner.pool.stats().mem_used_total;
            if used + PAGE_SIZE as u64 * 16 > limit {
                return Err(StoreError::MemoryLimit { used, limit });
            }
        }
        inner.counters.writes.fetch_add(n, Ordering::Relaxed);
        let codec = self.policy.write_codec();
        let bp = self.block_pages as u64;
        let mut jobs = Vec::new();
        let mut pos = 0u64;
        while pos < n {
            let index = start + pos;
            let group = if bp > 1 && index % bp == 0 && pos + bp <= n {
                bp
            } else {
                1
            };
            let bytes = &data[(pos as usize) * PAGE_SIZE..((pos + group) as usize) * PAGE_SIZE];
            let same: Vec<Option<u64>> = bytes
                .chunks_exact(PAGE_SIZE)
                .map(zmem_codec::same_filled)
                .collect();
            if same.iter().all(Option::is_some) {
                for (k, w) in same.iter().enumerate() {
                    inner.install_same(index + k as u64, w.unwrap_or(0));
                }
            } else {
                let input: Arc<[u8]> = Arc::from(bytes);
                inner.mark_pending(index, &input);
                jobs.push(Job {
                    tag: index,
                    input,
                    codec,
                    dict: inner.dict.clone(),
                });
            }
            pos += group;
        }
        if jobs.is_empty() {
            return Ok(());
        }
        let k = jobs.len() as u64;
        inner.inflight.add(k);
        if let Some(l) = &latch {
            l.add(k);
        }
        let weak = Arc::downgrade(&self.inner);
        let global = self.inner.inflight.clone();
        let sink: Sink = Arc::new(move |c: Completion| {
            if let Some(inner) = weak.upgrade() {
                inner.complete(c);
            }
            // Count down only after the strong reference is gone: drop() waits on this.
            if let Some(l) = &latch {
                l.done();
            }
            global.done();
        });
        self.engine.submit(jobs, sink)?;
        Ok(())
    }

    /// Waits for every asynchronous write, retries installs that failed, and reports what
    /// still could not be stored compressed (those pages stay readable, uncompressed).
    pub fn flush(&self) -> Result<(), StoreError> {
        self.inner.inflight.wait();
        let retry = std::mem::take(&mut *self.inner.retry.lock());
        let mut still = Vec::new();
        for (start, input) in retry {
            if let Err(e) = self.redo(start, &input) {
                *self.inner.last_failure.lock() = Some(e.to_string());
                still.push((start, input));
            }
        }
        if still.is_empty() {
            return Ok(());
        }
        let pages = still
            .iter()
            .map(|(_, i)| (i.len() / PAGE_SIZE) as u64)
            .sum();
        self.inner.retry.lock().extend(still);
        Err(StoreError::WritesPending {
            pages,
            reason: self
                .inner
                .last_failure
                .lock()
                .clone()
                .unwrap_or_else(|| "unknown".into()),
        })
    }

    /// Compresses pending data on this thread and installs it where it is still current.
    fn redo(&self, start: u64, input: &Arc<[u8]>) -> Result<(), StoreError> {
        let (obj, enc) = self.engine.compress_now(
            self.policy.write_codec(),
            self.inner.dict.as_deref(),
            input,
        )?;
        let handle = self.inner.pool.alloc(&obj)?;
        self.inner
            .install(start, input, handle, enc.codec, obj.len());
        Ok(())
    }

    /// Reads one page into `buf` (4096 bytes). A page never written reads as zeros.
    pub fn read(&self, index: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        if buf.len() != PAGE_SIZE {
            return Err(StoreError::BadLength {
                len: buf.len(),
                what: "one page (4096 bytes)",
            });
        }
        self.read_batch(index, buf)
    }

    /// Reads consecutive pages; a block is decoded once for all of its pages in the range,
    /// wherever they are in it.
    pub fn read_batch(&self, start: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        let n = Self::pages_of(buf.len(), "a whole number of pages")?;
        self.check_range(start, n)?;
        let inner = &self.inner;
        inner.counters.reads.fetch_add(n, Ordering::Relaxed);
        SCRATCH.with(|cell| {
            let mut scratch = cell.borrow_mut();
            // The block decoded in `scratch` and the member whose lock we keep: while one member
            // is locked the block cannot be freed, so every other page that points at the same
            // handle is a member of this very block and is copied without decoding again.
            // (Locks are taken in ascending index order, as everywhere in the store.)
            let mut held: Option<(usize, State, u64)> = None;
            let mut result = Ok(());
            for i in 0..n as usize {
                let index = start + i as u64;
                let slot = &inner.slots[index as usize];
                let (st, aux) = slot.lock();
                let out = &mut buf[i * PAGE_SIZE..(i + 1) * PAGE_SIZE];
                let mut keep = false;
                let res = match st.kind() {
                    SAME => {
                        zmem_codec::fill_same(out, aux);
                        Ok(())
                    }
                    OBJECT => inner.decode_object(index, aux, out).map(|_| ()),
                    PENDING => {
                        // SAFETY: a PENDING slot owns one strong count of the Arc<Pending>
                        // whose pointer is in aux, and we hold the slot's lock.
                        let p = unsafe { &*(aux as *const Pending) };
                        out.copy_from_slice(&p.input[st.pos() * PAGE_SIZE..][..PAGE_SIZE]);
                        Ok(())
                    }
                    BLOCK => {
                        let decoded = matches!(held, Some((_, _, h)) if h == aux);
                        let r = if decoded {
                            Ok(())
                        } else {
                            inner.decode_block(index, st, aux, &mut scratch)
                        };
                        r.map(|()| {
                            out.copy_from_slice(&scratch[st.pos() * PAGE_SIZE..][..PAGE_SIZE]);
                            keep = !decoded;
                        })
                    }
                    _ => {
                        out.fill(0);
                        Ok(())
                    }
                };
                if keep {
                    if let Some((j, sj, _)) = held.replace((index as usize, st, aux)) {
                        inner.slots[j].unlock_keep(sj, IDLE);
                    }
                } else {
                    slot.unlock_keep(st, IDLE);
                }
                if res.is_err() {
                    result = res;
                    break;
                }
            }
            if let Some((j, sj, _)) = held {
                inner.slots[j].unlock_keep(sj, IDLE);
            }
            result
        })
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

    /// Moves objects out of sparse spans and gives emptied pages back to the OS.
    pub fn compact(&self) -> zmem_pool::CompactStats {
        self.inner.pool.compact()
    }

    pub fn set_mem_limit(&self, limit: Option<u64>) {
        self.inner.pool.set_mem_limit(limit);
    }

    /// Marks every stored page idle; any access clears the mark (zram's idle marking).
    pub fn mark_idle(&self) {
        for slot in self.inner.slots.iter() {
            if slot.peek().kind() == EMPTY {
                continue;
            }
            let (st, _) = slot.lock();
            slot.unlock_keep(st.with_flag(IDLE, st.kind() != EMPTY), 0);
        }
    }

    /// Recompresses stored pages with `codec` (zram's recompression): aligned runs of
    /// `MAX_BLOCK_PAGES` single-page objects become one block, other single pages are
    /// recompressed alone; a result is kept only if it is smaller. With `only_idle`, only pages
    /// marked idle and untouched since are considered.
    pub fn recompress(&self, codec: zmem_codec::Codec, only_idle: bool) -> RecompressStats {
        let mut stats = RecompressStats::default();
        let group = MAX_BLOCK_PAGES as u64;
        let mut start = 0u64;
        while start < self.pages() {
            let end = (start + group).min(self.pages());
            let eligible = |st: State| {
                st.kind() == OBJECT
                    && !st.has(HUGE)
                    && st.codec() != codec.id() as u8
                    && (!only_idle || st.has(IDLE))
            };
            let all = end - start == group
                && (start..end).all(|i| eligible(self.inner.slots[i as usize].peek()));
            if all {
                self.recompress_block(start, codec, &eligible, &mut stats);
            } else {
                for i in start..end {
                    if eligible(self.inner.slots[i as usize].peek()) {
                        self.recompress_page(i, codec, &eligible, &mut stats);
                    }
                }
            }
            start = end;
        }
        self.inner
            .counters
            .recompressed
            .fetch_add(stats.pages_recompressed, Ordering::Relaxed);
        stats
    }

    fn recompress_block(
        &self,
        start: u64,
        codec: zmem_codec::Codec,
        eligible: &dyn Fn(State) -> bool,
        stats: &mut RecompressStats,
    ) {
        let inner = &self.inner;
        let n = MAX_BLOCK_PAGES;
        // Lock the run in ascending order (every multi-page lock in the store does), decode it,
        // compress it as one block, and swap it in only if it is smaller.
        let mut held: Vec<(State, u64)> = Vec::with_capacity(n);
        for i in 0..n {
            held.push(inner.slots[start as usize + i].lock());
        }
        let unlock_all = |held: &[(State, u64)]| {
            for (i, (st, _)) in held.iter().enumerate() {
                inner.slots[start as usize + i].unlock_keep(*st, 0);
            }
        };
        if !held.iter().all(|(st, _)| eligible(*st)) {
            unlock_all(&held);
            return;
        }
        let mut data = vec![0u8; n * PAGE_SIZE];
        for (i, (_, aux)) in held.iter().enumerate() {
            if inner
                .decode_object(
                    start + i as u64,
                    *aux,
                    &mut data[i * PAGE_SIZE..][..PAGE_SIZE],
                )
                .is_err()
            {
                unlock_all(&held);
                return;
            }
        }
        let before: u64 = held.iter().map(|(st, _)| u64::from(st.len())).sum();
        let Ok((obj, enc)) = self
            .engine
            .compress_now(codec, inner.dict.as_deref(), &data)
        else {
            unlock_all(&held);
            return;
        };
        if obj.len() as u64 >= before || enc.codec == CodecId::Raw {
            unlock_all(&held);
            return;
        }
        let Ok(handle) = inner.pool.alloc(&obj) else {
            unlock_all(&held);
            return;
        };
        inner.block_adjust(handle.to_raw(), n as i64);
        let state = State::new(BLOCK).with_object(enc.codec as u8, obj.len());
        for (i, (st, aux)) in held.iter().enumerate() {
            inner.release(*st, *aux);
            let s = state.with_block(i, n).with_flag(IDLE, st.has(IDLE));
            inner.count_new(s, 1);
            inner.slots[start as usize + i].unlock_with(s, handle.to_raw());
        }
        stats.pages_recompressed += n as u64;
        stats.blocks_built += 1;
        stats.bytes_before += before;
        stats.bytes_after += obj.len() as u64;
    }

    fn recompress_page(
        &self,
        index: u64,
        codec: zmem_codec::Codec,
        eligible: &dyn Fn(State) -> bool,
        stats: &mut RecompressStats,
    ) {
        let inner = &self.inner;
        let slot = &inner.slots[index as usize];
        let (st, aux) = slot.lock();
        if !eligible(st) {
            slot.unlock_keep(st, 0);
            return;
        }
        let mut page = [0u8; PAGE_SIZE];
        let better = inner
            .decode_object(index, aux, &mut page)
            .ok()
            .and_then(|_| {
                self.engine
                    .compress_now(codec, inner.dict.as_deref(), &page)
                    .ok()
            })
            .filter(|(obj, enc)| obj.len() < st.len() as usize && enc.codec != CodecId::Raw)
            .and_then(|(obj, enc)| inner.pool.alloc(&obj).ok().map(|h| (h, obj.len(), enc)));
        match better {
            Some((handle, len, enc)) => {
                inner.release(st, aux);
                let s = State::new(OBJECT)
                    .with_object(enc.codec as u8, len)
                    .with_flag(IDLE, st.has(IDLE));
                inner.count_new(s, 1);
                slot.unlock_with(s, handle.to_raw());
                stats.pages_recompressed += 1;
                stats.bytes_before += u64::from(st.len());
                stats.bytes_after += len as u64;
            }
            None => slot.unlock_keep(st, 0),
        }
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
            decompress_nanos: c.decompress_nanos.load(Ordering::Relaxed),
            recompressed_pages: c.recompressed.load(Ordering::Relaxed),
            repacked_pages: c.repacked.load(Ordering::Relaxed),
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
        for slot in self.inner.slots.iter() {
            // Empty slots own nothing; skipping them leaves untouched table pages untouched.
            if slot.peek().kind() == EMPTY {
                continue;
            }
            let (st, aux) = slot.lock();
            self.inner.release(st, aux);
            slot.unlock_with(State::new(EMPTY), 0);
        }
    }
}

impl Inner {
    fn install_same(&self, index: u64, word: u64) {
        let slot = &self.slots[index as usize];
        let (old, aux) = slot.lock();
        self.release(old, aux);
        let st = State::new(SAME);
        self.count_new(st, 1);
        slot.unlock_with(st, word);
    }

    fn mark_pending(&self, start: u64, input: &Arc<[u8]>) {
        let n = input.len() / PAGE_SIZE;
        for k in 0..n {
            let p = Arc::into_raw(Arc::new(Pending {
                input: input.clone(),
            }));
            let slot = &self.slots[start as usize + k];
            let (old, aux) = slot.lock();
            self.release(old, aux);
            let st = State::new(PENDING).with_block(k, n);
            self.count_new(st, 1);
            slot.unlock_with(st, p as u64);
        }
    }

    /// Adds a new state's pages to the counters.
    fn count_new(&self, st: State, pages: u64) {
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
    fn release(&self, st: State, aux: u64) {
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
            _ => {}
        }
        if st.has(HUGE) {
            c.huge.fetch_sub(1, Ordering::Relaxed);
        }
        c.stored.fetch_sub(1, Ordering::Relaxed);
    }

    fn free_handle(&self, raw: u64) {
        if let Some(h) = Handle::from_raw(raw) {
            if let Err(e) = self.pool.free(h) {
                tracing::error!(%e, "pool refused to free a handle the store owned");
            }
        }
    }

    fn block_shard(&self, handle: u64) -> &Mutex<HashMap<u64, BlockMeta>> {
        &self.blocks[(handle as usize).wrapping_mul(0x9e37_79b9) % BLOCK_SHARDS]
    }

    /// Counts a new group block's members (all live), before they are installed, and
    /// remembers which pages they are.
    fn block_register(&self, handle: u64, members: &[u64]) {
        self.block_shard(handle).lock().insert(
            handle,
            BlockMeta {
                live: members.len() as u32,
                members: Some(members.into()),
                queued: false,
            },
        );
    }

    /// Changes a block's live-page count; returns what is left. A group block that is left
    /// with half of its members or fewer joins the queue of sparse blocks.
    fn block_adjust(&self, handle: u64, delta: i64) -> u32 {
        self.block_adjust_queue(handle, delta, true)
    }

    fn block_adjust_queue(&self, handle: u64, delta: i64, may_queue: bool) -> u32 {
        let mut map = self.block_shard(handle).lock();
        let e = map.entry(handle).or_insert(BlockMeta {
            live: 0,
            members: None,
            queued: false,
        });
        e.live = (i64::from(e.live) + delta).max(0) as u32;
        let left = e.live;
        if left == 0 {
            map.remove(&handle);
        } else if delta < 0 && may_queue && !e.queued {
            if let Some(m) = &e.members {
                if left as usize * 2 <= m.len() {
                    // Bounded (a store whose owner never repacks must not grow it forever;
                    // entries of blocks freed meanwhile are skipped when popped).
                    let mut q = self.sparse.lock();
                    if q.len() < SPARSE_QUEUE_MAX {
                        q.push(handle);
                        e.queued = true;
                    }
                }
            }
        }
        left
    }

    /// Takes a sparse group block out of the queue's hands: pins it (one more live count, so
    /// that it cannot be freed, nor its handle reused, while it is repacked) and copies its
    /// member list into `members`; returns how many. None if it is gone or no longer sparse.
    fn block_pin_sparse(&self, handle: u64, members: &mut [u64; MAX_BLOCK_PAGES]) -> Option<usize> {
        let mut map = self.block_shard(handle).lock();
        let e = map.get_mut(&handle)?;
        e.queued = false;
        let m = e.members.as_ref()?;
        if e.live as usize * 2 > m.len() || m.len() > MAX_BLOCK_PAGES {
            return None;
        }
        members[..m.len()].copy_from_slice(m);
        e.live += 1;
        Some(m.len())
    }

    /// Drops a repack's pin and frees the block if it was the last reference. `requeue`: the
    /// repack left survivors in it (queued again if still sparse). Otherwise it is not queued
    /// again: members only ever leave a block, so the only references left are pins of other
    /// repacks (which would find nothing, and spin if it were queued).
    fn block_unpin(&self, handle: u64, requeue: bool) {
        if self.block_adjust_queue(handle, -1, requeue) == 0 {
            self.free_handle(handle);
        }
    }

    fn decode_object(&self, index: u64, handle: u64, out: &mut [u8]) -> Result<usize, StoreError> {
        let h = Handle::from_raw(handle).ok_or(StoreError::Pool(PoolError::InvalidHandle(0)))?;
        let t = Instant::now();
        self.counters.decodes.fetch_add(1, Ordering::Relaxed);
        let r = self
            .pool
            .with_object(h, |obj| zmem_codec::decode(obj, self.dict.as_deref(), out))?
            .map_err(|source| StoreError::Corrupt { index, source });
        self.counters
            .decompress_nanos
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        r
    }

    /// Decodes the block of member `index` (state `st`, locked by the caller) into `scratch`.
    fn decode_block(
        &self,
        index: u64,
        st: State,
        handle: u64,
        scratch: &mut Vec<u8>,
    ) -> Result<(), StoreError> {
        let need = st.pages() * PAGE_SIZE;
        if st.pos() >= st.pages() {
            return Err(StoreError::Corrupt {
                index,
                source: CodecError::LengthMismatch {
                    expected: (st.pos() + 1) * PAGE_SIZE,
                    got: need,
                },
            });
        }
        if scratch.len() < need {
            scratch.resize(need, 0);
        }
        let got = self.decode_object(index, handle, &mut scratch[..need])?;
        if got != need {
            return Err(StoreError::Corrupt {
                index,
                source: CodecError::LengthMismatch {
                    expected: need,
                    got,
                },
            });
        }
        Ok(())
    }

    /// A compression finished: store the object for the pages that still hold this data.
    fn complete(&self, c: Completion) {
        let start = c.job.tag;
        let result = c
            .result
            .map_err(StoreError::from)
            .and_then(|(obj, enc)| Ok((self.pool.alloc(&obj)?, enc.codec, obj.len())));
        match result {
            Ok((handle, codec, len)) => self.install(start, &c.job.input, handle, codec, len),
            Err(e) => {
                self.counters.write_failures.fetch_add(1, Ordering::Relaxed);
                *self.last_failure.lock() = Some(e.to_string());
                self.retry.lock().push((start, c.job.input));
            }
        }
    }

    /// Installs an object for pages start.. that are still pending with `input`.
    fn install(&self, start: u64, input: &Arc<[u8]>, handle: Handle, codec: CodecId, len: usize) {
        let n = input.len() / PAGE_SIZE;
        let raw = handle.to_raw();
        if n > 1 {
            self.block_adjust(raw, n as i64);
        }
        let mut installed = 0;
        for k in 0..n {
            let slot = &self.slots[start as usize + k];
            let (st, aux) = slot.lock();
            // SAFETY: PENDING slots own a strong count of the Arc<Pending> in aux; we hold the
            // lock. `input` is kept alive by the caller, so its address cannot be reused.
            let current = st.kind() == PENDING
                && unsafe { Arc::ptr_eq(&(*(aux as *const Pending)).input, input) };
            if !current {
                slot.unlock_keep(st, 0);
                continue;
            }
            self.release(st, aux);
            let kind = if n > 1 { BLOCK } else { OBJECT };
            let new = State::new(kind)
                .with_object(codec as u8, len)
                .with_block(k, n)
                .with_flag(HUGE, codec == CodecId::Raw);
            self.count_new(new, 1);
            slot.unlock_with(new, raw);
            installed += 1;
        }
        let left = if n > 1 {
            self.block_adjust(raw, installed - n as i64)
        } else {
            installed as u32
        };
        if left == 0 {
            self.free_handle(raw);
        }
    }

    /// After a waited batch: report its failed installs (they stay queued for flush).
    fn take_failures(&self, start: u64, n: u64) -> Result<(), StoreError> {
        let retry = self.retry.lock();
        let pages: u64 = retry
            .iter()
            .filter(|(s, _)| *s >= start && *s < start + n)
            .map(|(_, i)| (i.len() / PAGE_SIZE) as u64)
            .sum();
        if pages == 0 {
            return Ok(());
        }
        Err(StoreError::WritesPending {
            pages,
            reason: self
                .last_failure
                .lock()
                .clone()
                .unwrap_or_else(|| "unknown".into()),
        })
    }
}

#[cfg(test)]
mod tests;
