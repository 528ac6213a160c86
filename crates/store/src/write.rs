//! Writing pages. Synchronous writes (`write`, `write_group`) compress on the calling thread
//! and allocate every object before any page changes. Batch and asynchronous writes
//! (`write_batch`, `write_async`) mark the pages pending at once (reads see the new data) and
//! hand the compression to the engine's workers; a completion installs the object only where a
//! page still holds that data, and failed installs are kept for `flush` to retry and report.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use zmem_codec::{Codec, CodecId, Encoded, PAGE_SIZE};
use zmem_engine::{Completion, Job, Sink};

use zmem_pool::Handle;

use crate::entropy::ENTROPY_CODEC;
use crate::pending::{Latch, Pending};
use crate::slot::{State, BLOCK, HUGE, LATER, OBJECT, PENDING, SAME};
use crate::{Inner, StoreCore, StoreError, GROUP, MAX_BLOCK_PAGES};

impl StoreCore {
    /// Writes one page, compressing it on the calling thread. On error the page keeps its old
    /// content. A page that neither the policy's codec nor the entropy coder shrinks below the
    /// rejection ratio is stored raw.
    pub fn write(&self, index: u64, page: &[u8]) -> Result<(), StoreError> {
        self.write_page(index, page, true).map(|_| ())
    }

    /// Like [`write`](Self::write), but a page that does not compress below the rejection
    /// ratio (it would be stored raw: no memory saved) is not stored: `Ok(false)`, and page
    /// `index` keeps its old content. Same-filled pages are always stored, and so is every
    /// page of a store over an SSD tier (raw, it still leaves DRAM for the log).
    pub fn write_if_smaller(&self, index: u64, page: &[u8]) -> Result<bool, StoreError> {
        self.write_page(index, page, false)
    }

    fn write_page(&self, index: u64, page: &[u8], keep_raw: bool) -> Result<bool, StoreError> {
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
            return Ok(true);
        }
        inner.offer_sample(page, self.policy.write_codec());
        let (obj, enc, later) = self.compress_page(page)?;
        // Over an SSD tier a page that does not compress still saves DRAM: it passes through
        // the pool raw and goes on to the log. A page whose entropy try is left for later is
        // stored raw: the recent ones mostly compressed.
        if enc.codec == CodecId::Raw && !keep_raw && !later && inner.lower.is_none() {
            inner.counters.not_stored.fetch_add(1, Ordering::Relaxed);
            return Ok(false);
        }
        let handle = match inner.alloc(&obj) {
            // A full pool over an SSD tier: the oldest objects go down now, then retry once.
            Err(zmem_pool::PoolError::LimitExceeded { .. }) if inner.make_room_now(self) => {
                inner.alloc(&obj)?
            }
            r => r?,
        };
        let state = State::new(OBJECT)
            .with_object(enc.codec as u8, obj.len())
            .with_flag(HUGE, enc.codec == CodecId::Raw)
            .with_flag(LATER, later);
        inner.install_page(index, state, handle.to_raw());
        if later {
            if let Some(l) = inner.later.as_ref() {
                inner
                    .counters
                    .entropy_deferred
                    .fetch_add(1, Ordering::Relaxed);
                l.push(index, |i| inner.still_owes_entropy(i));
            }
        }
        Ok(true)
    }

    /// Copies page `index` of `from` into page `index` of this store as `from` holds it: a
    /// single-page object's compressed bytes (no decoding, no compression) or a same-filled
    /// page. For a fork's snapshot, which used to decompress and recompress every page: ~0.3 ms
    /// per MiB evicted, at every fork. `Ok(false)` when the page is held otherwise (a block
    /// member, pending, on the SSD log, never written), when the stores do not share their
    /// dictionary, or when this store's pool is full: the caller then reads and writes it. On
    /// error the page keeps its old content.
    pub fn copy_page_from(&self, from: &StoreCore, index: u64) -> Result<bool, StoreError> {
        self.check_range(index, 1)?;
        from.check_range(index, 1)?;
        let (inner, src) = (&self.inner, &from.inner);
        if Arc::ptr_eq(inner, src) {
            return Ok(false);
        }
        // An object made with a dictionary is copied only where the same one decodes it (a
        // store may learn its dictionary at any time, so this is asked of each object).
        let decodes_here = |obj: &[u8]| match zmem_codec::peek_header(obj) {
            Ok(h) => match h.dict_id {
                None => true,
                Some(id) => match (inner.dicts.by_id(id), src.dicts.by_id(id)) {
                    (Some(a), Some(b)) => Arc::ptr_eq(a, b),
                    _ => false,
                },
            },
            Err(_) => false,
        };
        let src_slot = &src.slots[index as usize];
        let (st, aux) = src_slot.lock();
        let copied = match st.kind() {
            SAME => Ok(Some((State::new(SAME), aux))),
            OBJECT => match Handle::from_raw(aux) {
                Some(h) => match src
                    .pool
                    .with_object(h, |obj| decodes_here(obj).then(|| inner.alloc(obj)))
                {
                    Ok(None) => Ok(None),
                    Ok(Some(Ok(handle))) => {
                        let state = State::new(OBJECT)
                            .with_object(st.codec(), st.len() as usize)
                            .with_flag(HUGE, st.has(HUGE));
                        Ok(Some((state, handle.to_raw())))
                    }
                    Ok(Some(Err(zmem_pool::PoolError::LimitExceeded { .. }))) => Ok(None),
                    Ok(Some(Err(e))) | Err(e) => Err(StoreError::from(e)),
                },
                None => Ok(None),
            },
            _ => Ok(None),
        };
        src_slot.unlock_keep(st, 0);
        let Some((state, new_aux)) = copied? else {
            return Ok(false);
        };
        inner.counters.writes.fetch_add(1, Ordering::Relaxed);
        inner.install_page(index, state, new_aux);
        Ok(true)
    }

    /// Compresses one page with the policy's codec; what that codec cannot shrink (lz4 finds
    /// no repeats, e.g. random printable text) is tried once more with an entropy coder
    /// (zstd-1) before it is given up as raw, now or, with `entropy_later`, by a later
    /// `entropy_pass` (the third value is then true: store it raw, owing that try).
    fn compress_page(&self, page: &[u8]) -> Result<(Vec<u8>, Encoded, bool), StoreError> {
        let inner = &self.inner;
        let codec = self.policy.write_codec();
        let first = self.engine.compress_now(codec, inner.dict(), page)?;
        if first.1.codec != CodecId::Raw || matches!(codec, Codec::Zstd { .. }) {
            return Ok((first.0, first.1, false));
        }
        if inner.defer_entropy() {
            return Ok((first.0, first.1, true));
        }
        inner.counters.entropy_tries.fetch_add(1, Ordering::Relaxed);
        let second = self
            .engine
            .compress_now(ENTROPY_CODEC, inner.dict(), page)?;
        let won = second.1.codec != CodecId::Raw;
        if let Some(l) = inner.later.as_ref() {
            l.record(won);
        }
        if !won {
            return Ok((first.0, first.1, false));
        }
        inner.counters.entropy_wins.fetch_add(1, Ordering::Relaxed);
        Ok((second.0, second.1, false))
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
                inner.offer_sample(p, self.policy.write_codec());
                members[m] = k;
                m += 1;
            }
        }
        let members = &members[..m];
        let codec = self.policy.write_codec();
        let dict = inner.dict();
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
                block = Some((inner.alloc(&obj)?, enc.codec, obj.len()));
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
                inner.install_page(indices[k], state.with_block(j, m), raw);
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
                        let h = inner.alloc(&obj)?;
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
                inner.install_page(indices[k], state, handle.to_raw());
            }
        }
        for (k, w) in same[..n].iter().enumerate() {
            if let Some(w) = *w {
                inner.install_same(indices[k], w);
            }
        }
        Ok(())
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
                for (p, w) in bytes.chunks_exact(PAGE_SIZE).zip(&same) {
                    if w.is_none() {
                        inner.offer_sample(p, self.policy.write_codec());
                    }
                }
                let input: Arc<[u8]> = Arc::from(bytes);
                inner.mark_pending(index, &input);
                jobs.push(Job {
                    tag: index,
                    input,
                    codec,
                    dict: inner.dicts.current().cloned(),
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
        let (obj, enc) =
            self.engine
                .compress_now(self.policy.write_codec(), self.inner.dict(), input)?;
        let handle = self.inner.alloc(&obj)?;
        self.inner
            .install(start, input, handle, enc.codec, obj.len());
        Ok(())
    }
}

impl Inner {
    /// Gives page `index` its new state and aux word, freeing what it held before; a new
    /// single-page object joins the SSD writeback queue.
    fn install_page(&self, index: u64, state: State, aux: u64) {
        self.note_stored(index + 1);
        let slot = &self.slots[index as usize];
        let (old, old_aux) = slot.lock();
        self.release(old, old_aux);
        self.count_new(state, 1);
        slot.unlock_with(state, aux);
        if state.kind() == OBJECT {
            self.note_object(index, aux);
        }
    }

    fn install_same(&self, index: u64, word: u64) {
        self.install_page(index, State::new(SAME), word);
    }

    fn mark_pending(&self, start: u64, input: &Arc<[u8]>) {
        let n = input.len() / PAGE_SIZE;
        self.note_stored(start + n as u64);
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

    /// A compression finished: store the object for the pages that still hold this data.
    fn complete(&self, c: Completion) {
        let start = c.job.tag;
        let result = c
            .result
            .map_err(StoreError::from)
            .and_then(|(obj, enc)| Ok((self.alloc(&obj)?, enc.codec, obj.len())));
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
            if kind == OBJECT {
                self.note_object(start + k as u64, raw);
            }
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
