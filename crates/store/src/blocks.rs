//! Multi-page blocks: one pool object holding several pages, each page a member at its
//! position. The store counts each block's live members (in sharded maps keyed by handle) and
//! frees the object with its last member. A group block (`write_group`) also remembers its
//! member pages, so that once it has lost half of them it joins a bounded queue of sparse
//! blocks, and `repack_groups` moves the survivors of several sparse blocks into a new one.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use zmem_codec::{CodecId, PAGE_SIZE};
use zmem_os::sync::Mutex;

use crate::slot::{State, BLOCK, IDLE, OBJECT};
use crate::{BlockMeta, Inner, StoreCore, BLOCK_SHARDS, GROUP, MAX_BLOCK_PAGES, SCRATCH};

/// Most sparse blocks waiting for a repack.
const SPARSE_QUEUE_MAX: usize = 1 << 16;

impl StoreCore {
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
                .compress_now(self.policy.write_codec(), inner.dict(), data)
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
            if k == 1 {
                inner.note_object(index, raw);
            }
        }
        if k > 1 {
            if missed > 0 && inner.block_adjust(raw, -missed) == 0 {
                inner.free_handle(raw);
            }
        } else if missed > 0 {
            inner.free_handle(raw);
        }
    }
}

impl Inner {
    fn block_shard(&self, handle: u64) -> &Mutex<HashMap<u64, BlockMeta>> {
        &self.blocks[(handle as usize).wrapping_mul(0x9e37_79b9) % BLOCK_SHARDS]
    }

    /// Counts a new group block's members (all live), before they are installed, and
    /// remembers which pages they are.
    pub(crate) fn block_register(&self, handle: u64, members: &[u64]) {
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
    pub(crate) fn block_adjust(&self, handle: u64, delta: i64) -> u32 {
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
}
