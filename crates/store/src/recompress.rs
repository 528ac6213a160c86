//! Idle recompression (zram's recompress): `mark_idle` marks every stored page, any access
//! clears the mark, and `recompress` re-encodes what stayed idle with a colder codec, building
//! blocks of aligned runs and keeping a result only if it is smaller, then compacts the pool
//! (the objects it replaced leave spans part empty). With a `recompress_interval`, a background
//! thread does a pass every interval.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use zmem_codec::{CodecId, Encoded, PAGE_SIZE};
use zmem_pool::Handle;

use crate::slot::{State, BLOCK, EMPTY, HUGE, IDLE, OBJECT, TRIED};
use crate::{RecompressStats, StoreCore, StoreError, MAX_BLOCK_PAGES};

/// Pages the cold pass looks at per slice, and the nap after a full slice: a slice of 256
/// pages takes ~6 ms here (lz4 decode and zstd-1, ~22 us a page), so at most ~75% of a CPU,
/// about the pace at which a loading program evicts on this machine.
const COLD_SLICE: usize = 256;
const COLD_NAP: Duration = Duration::from_millis(2);
/// The nap when nothing was due.
const COLD_IDLE_NAP: Duration = Duration::from_millis(250);
/// While the machine is busy, this many pages per `COLD_TRICKLE_EVERY` (~2% of a CPU).
const COLD_TRICKLE: usize = 16;
const COLD_TRICKLE_EVERY: Duration = Duration::from_millis(20);

/// How often the recompressor looks at what its recompressions became (`ColdAge`).
const COLD_LOOK_EVERY: Duration = Duration::from_millis(500);

/// A pass that recompressed pages compacts the pool when it holds this much more DRAM than
/// its objects' bytes.
const COMPACT_ABOVE: f64 = 1.05;

impl StoreCore {
    /// Every `every`, recompresses the pages that stayed idle since the previous pass (only
    /// while recompressed pages do not come back, or the pool is pressed); in between, makes
    /// the cold pass (`cold`, its age set by `ColdAge`) while the pool is half full
    /// ([`ColdPressure`](crate::ColdPressure)) or half a CPU is idle, and a trickle of it
    /// otherwise.
    pub(crate) fn spawn_recompressor(
        core: Arc<StoreCore>,
        codec: zmem_codec::Codec,
        every: Duration,
    ) -> Result<(Arc<AtomicBool>, JoinHandle<()>), StoreError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let h = zmem_os::thread::spawn("zmem-recompress".into(), move || {
            let mut last = Instant::now();
            let mut last_trickle = Instant::now();
            let mut idle_cpu = zmem_os::idle::IdleCpu::new();
            let mut age = crate::cold::ColdAge::default();
            let mut after_ms = crate::COLD_AFTER_MS;
            let mut last_look = Instant::now();
            let mut compacted_at = 0;
            core.mark_idle();
            while !flag.load(Ordering::Acquire) {
                if last_look.elapsed() >= COLD_LOOK_EVERY {
                    last_look = Instant::now();
                    after_ms = core.cold_age_look(&mut age);
                }
                let pressed = core.cold_pressure() != crate::ColdPressure::None;
                let seen = if pressed || idle_cpu.half_a_cpu_idle() {
                    core.cold_pass(COLD_SLICE)
                } else if last_trickle.elapsed() >= COLD_TRICKLE_EVERY {
                    last_trickle = Instant::now();
                    core.cold_pass(COLD_TRICKLE).min(1)
                } else {
                    1
                };
                // With nothing due it sleeps long: a thread of the program's process that
                // wakes on another CPU for nothing only costs (measured: no change in time on
                // python at 32M, where the cost was the walks below).
                let nap = match seen {
                    COLD_SLICE => COLD_NAP,
                    0 => COLD_IDLE_NAP,
                    _ => Duration::from_millis(20),
                };
                std::thread::sleep(nap.min(every));
                if last.elapsed() >= every {
                    // Pages idle for one interval are cold only while the cold age is at its
                    // shortest (`ColdAge`: recompressed pages do not come back). Both walk the
                    // page table up to the highest page stored: skipped with the pass.
                    if after_ms <= crate::COLD_AFTER_MS || pressed {
                        let s = core.recompress(codec, true);
                        tracing::debug!(?s, "idle recompression pass");
                        core.mark_idle();
                    }
                    // The cold pass's recompressions leave spans part empty, and so do the
                    // cold-codec pages that come back afterwards. Compacting moves objects
                    // under their class's lock, beside the faults: once a second only after
                    // recompressions or in a pressed pool, where the room counts (every second
                    // on `bench region --pattern rand`: ratio 1.52 against 1.47, but 13.5-13.9
                    // against 12.0-13.1 us per access and fault p99 94 against 70-87 us).
                    let done = core.inner.counters.recompressed.load(Ordering::Relaxed);
                    if done != compacted_at || pressed {
                        compacted_at = done;
                        let _ = core.compact_if_loose();
                    }
                    last = Instant::now();
                }
            }
        })
        .map_err(|e| StoreError::Config(format!("cannot start the recompressor: {e}")))?;
        Ok((stop, h))
    }

    /// Marks every stored page idle; any access clears the mark (zram's idle marking).
    pub fn mark_idle(&self) {
        let end = self.inner.stored_end() as usize;
        for slot in self.inner.slots[..end].iter() {
            if slot.peek().kind() == EMPTY {
                continue;
            }
            let (st, _) = slot.lock();
            slot.unlock_keep(st.with_flag(IDLE, st.kind() != EMPTY), 0);
        }
    }

    /// Recompresses stored pages (zram's recompression): aligned runs of `MAX_BLOCK_PAGES`
    /// single-page objects become one block with the policy's block codec
    /// (`Policy::cold_block_codec`, else `codec`), other single pages are recompressed alone
    /// with `codec`; a result is kept only if it is smaller. With `only_idle`, only pages
    /// marked idle and untouched since are considered.
    pub fn recompress(&self, codec: zmem_codec::Codec, only_idle: bool) -> RecompressStats {
        let block_codec = self.policy.cold_block_codec().unwrap_or(codec);
        self.recompress_with(codec, block_codec, only_idle)
    }

    /// [`recompress`](Self::recompress) with the blocks' codec given.
    pub(crate) fn recompress_with(
        &self,
        codec: zmem_codec::Codec,
        block_codec: zmem_codec::Codec,
        only_idle: bool,
    ) -> RecompressStats {
        let mut stats = RecompressStats::default();
        let group = MAX_BLOCK_PAGES as u64;
        let mut start = 0u64;
        let stored_end = self.inner.stored_end();
        while start < stored_end {
            let end = (start + group).min(self.pages());
            let eligible = |st: State| {
                st.kind() == OBJECT
                    && !st.has(HUGE)
                    && st.codec() != codec.id() as u8
                    && (!only_idle || st.has(IDLE))
            };
            // Pages kept raw join blocks: 64 KiB give the block codec what 4 KiB did not
            // (Calgary 512 MiB: 4081 raw pages, settled 2.69 by memory without, 2.73-2.78
            // with). Once, though: a raw page whose block did not shrink is not tried again.
            let joins_block = |st: State| {
                st.kind() == OBJECT
                    && st.codec() != codec.id() as u8
                    && !(st.has(HUGE) && st.has(TRIED))
                    && (!only_idle || st.has(IDLE))
            };
            let all = end - start == group
                && (start..end).all(|i| joins_block(self.inner.slots[i as usize].peek()));
            if all {
                self.recompress_block(start, block_codec, &joins_block, &mut stats);
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
        // Every page recompressed freed an object in a span of the old codec's size classes:
        // passes leave spans part empty, and the pool holds DRAM its objects do not need
        // (`bench region --pattern zipf --policy auto`: ratio 1.66 without this, 1.72-1.83 with).
        if stats.pages_recompressed > 0 {
            let _ = self.compact_if_loose();
        }
        stats
    }

    /// Compacts the pool if it holds [`COMPACT_ABOVE`] times its objects' bytes or more:
    /// the pool pages it gave back.
    pub fn compact_if_loose(&self) -> u64 {
        let pool = &self.inner.pool;
        if pool.mem_used() as f64 > COMPACT_ABOVE * pool.stats().object_bytes as f64 {
            pool.compact().pages_freed
        } else {
            0
        }
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
        let Ok((obj, enc)) = self.engine.compress_now(codec, inner.dict(), &data) else {
            unlock_all(&held);
            return;
        };
        if obj.len() as u64 >= before || enc.codec == CodecId::Raw {
            for (i, (st, _)) in held.iter().enumerate() {
                let st = st.with_flag(TRIED, st.has(HUGE));
                inner.slots[start as usize + i].unlock_keep(st, 0);
            }
            stats.blocks_failed += 1;
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

    /// Page `index`'s single-page object (state `st`, handle `aux`, locked by the caller)
    /// encoded again with `codec`, if that is smaller and not raw.
    pub(crate) fn smaller_encoding(
        &self,
        index: u64,
        st: State,
        aux: u64,
        codec: zmem_codec::Codec,
    ) -> Option<(Vec<u8>, Encoded)> {
        let inner = &self.inner;
        let mut page = [0u8; PAGE_SIZE];
        inner.decode_object(index, aux, &mut page).ok()?;
        self.engine
            .compress_now(codec, inner.dict(), &page)
            .ok()
            .filter(|(obj, enc)| obj.len() < st.len() as usize && enc.codec != CodecId::Raw)
    }

    /// Makes the new object `handle` (`len` bytes of `enc`) page `index`'s content in place of
    /// its old one (state `st`, handle `aux`), keeping its IDLE mark, and unlocks the page.
    pub(crate) fn install_smaller(
        &self,
        index: u64,
        st: State,
        aux: u64,
        handle: Handle,
        len: usize,
        enc: Encoded,
    ) {
        let inner = &self.inner;
        inner.release(st, aux);
        let s = State::new(OBJECT)
            .with_object(enc.codec as u8, len)
            .with_flag(IDLE, st.has(IDLE));
        inner.count_new(s, 1);
        inner.slots[index as usize].unlock_with(s, handle.to_raw());
        inner.note_object(index, handle.to_raw());
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
        let better = self
            .smaller_encoding(index, st, aux, codec)
            .and_then(|(obj, enc)| inner.pool.alloc(&obj).ok().map(|h| (h, obj.len(), enc)));
        match better {
            Some((handle, len, enc)) => {
                self.install_smaller(index, st, aux, handle, len, enc);
                stats.pages_recompressed += 1;
                stats.bytes_before += u64::from(st.len());
                stats.bytes_after += len as u64;
            }
            None => slot.unlock_keep(st, 0),
        }
    }
}
