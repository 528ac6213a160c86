//! The collector: reclaims segments whose objects are mostly dead.
//!
//! A pass takes the segments with the least live data below `gc_threshold` (most garbage
//! first), reads only their header and live objects (one batched read each), checks and
//! re-seals those objects into new segments, writes those, and only then asks each owner to
//! repoint its page ([`crate::Owner::relocate`], no log lock held). A relocated object's old
//! copy is freed by the log; one the owner declined (its page changed meanwhile) keeps its old
//! copy, which the owner frees, and the new copy is freed instead. A segment left with no live
//! object is trimmed and goes back to the free list.
//!
//! New segments are filled completely where possible: objects that would only half fill a last
//! new segment stay where they are (their segment is a cheap victim next time), so collected
//! data is not spread over half-empty segments that would at once be collected again.
//!
//! The background thread ("zmem-log-gc") holds only a `Weak<Log>`. It is woken when free
//! segments fall to twice the reserve, when a segment empties, and when a free makes a segment
//! collectible while space is low; it reclaims emptied segments (a trim, no copying) at once
//! and collects until free segments are above twice the reserve, yielding between passes so
//! that page faults come first.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use zmem_os::sync::{Condvar, Mutex};

use crate::log::{Log, Obj, State};
use crate::seal::Binding;
use crate::segment::{self, align_up, extent, header_len, Entry, Fixed, ENTRY, FIXED, HEADER_SEAL};
use crate::{Location, OwnerId, TierError};

/// What a collection is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// Ahead of need (the background thread): victims ranked by LFS's cost-benefit,
    /// (1 - u) * age / (1 + u), so old (cold) segments are taken at a higher live fraction
    /// than young ones whose objects are still dying; and only groups whose live objects fill
    /// whole new segments (a half-filled one would soon be collected again).
    Ahead,
    /// Space is needed now (a writer found only the reserve, or an explicit collect): the
    /// least live first (the most space per byte copied), and a last new segment may be
    /// partly filled.
    Now,
}

/// Victims read and re-packed in one group.
const GROUP: usize = 8;
/// New segments one group may fill.
const MAX_DEST: usize = 4;
/// Ranges of a victim closer than this are read as one.
const MERGE_GAP: usize = 16 << 10;

/// The background collector's wake-ups.
#[derive(Default)]
pub(crate) struct GcShared {
    ctl: Mutex<Ctl>,
    cv: Condvar,
}

#[derive(Default)]
struct Ctl {
    kicks: u64,
    stop: bool,
}

impl GcShared {
    pub(crate) fn kick(&self) {
        let mut c = self.ctl.lock();
        c.kicks += 1;
        self.cv.notify_one();
    }

    pub(crate) fn stop(&self) {
        let mut c = self.ctl.lock();
        c.stop = true;
        self.cv.notify_one();
    }
}

pub(crate) fn spawn(log: &Arc<Log>) -> Result<JoinHandle<()>, TierError> {
    let weak = Arc::downgrade(log);
    let shared = log.gc.clone();
    zmem_os::thread::spawn("zmem-log-gc".into(), move || run(weak, shared)).map_err(|e| {
        TierError::Io {
            what: "starting the SSD log's collector thread",
            errno: zmem_os::Errno(e.raw_os_error().unwrap_or(libc::EAGAIN)),
        }
    })
}

fn run(weak: Weak<Log>, shared: Arc<GcShared>) {
    let mut seen = 0u64;
    loop {
        {
            let mut c = shared.ctl.lock();
            if c.kicks == seen && !c.stop {
                // A periodic look too, in case a wake-up raced with the last pass.
                shared.cv.wait_for(&mut c, Duration::from_secs(1));
            }
            if c.stop {
                return;
            }
            seen = c.kicks;
        }
        let Some(log) = weak.upgrade() else {
            return;
        };
        log.background_pass();
    }
}

/// A live object read from a victim, to be moved.
struct Moved {
    owner: OwnerId,
    index: u64,
    old: Location,
    /// Where its payload is staged in its destination's buffer.
    start: usize,
    len: usize,
}

/// A new segment being assembled.
#[derive(Default)]
struct Dest {
    staged: Vec<u8>,
    objects: Vec<usize>,
    /// Bytes of objects (padded) so far.
    data: usize,
}

impl Log {
    /// One background round: reclaim emptied segments, then collect while space is low.
    fn background_pass(&self) {
        let low = 2 * self.cfg.reserve_segments;
        if !self.empties.lock().is_empty() {
            let _g = self.gc_lock.lock();
            self.reclaim_empties();
        }
        while self.free_segments() <= low {
            if self.collect_by(GROUP, Mode::Ahead) == 0 {
                break;
            }
            // Faults and writes first.
            std::thread::yield_now();
        }
    }

    /// One collection: reclaims emptied segments, then up to `max_segments` segments whose
    /// live fraction is below `gc_threshold`, most garbage first, moving their live objects
    /// to new segments. Returns the segments reclaimed (given back to the free list). Runs on
    /// the calling thread and calls [`crate::Owner::relocate`] there; one collection at a
    /// time.
    pub fn collect(&self, max_segments: usize) -> usize {
        self.collect_by(max_segments, Mode::Now)
    }

    pub(crate) fn collect_by(&self, max_segments: usize, mode: Mode) -> usize {
        let _g = self.gc_lock.lock();
        // What this collection writes is not collected again by it.
        let first_new = self.generation_now();
        let mut reclaimed = self.reclaim_empties();
        while reclaimed < max_segments {
            let max = (max_segments - reclaimed).min(GROUP);
            let mut victims = self.pick_victims(max, first_new, mode);
            // Oldest first: objects of a similar age end up together.
            victims.sort_by_key(|&v| self.segs[v as usize].generation.load(Ordering::Relaxed));
            if victims.is_empty() {
                break;
            }
            let n = self.collect_group(&victims, mode);
            reclaimed += n;
            if n == 0 {
                break;
            }
            std::thread::yield_now();
        }
        reclaimed
    }

    /// Trims the segments frees emptied and gives them back. Caller holds gc_lock.
    fn reclaim_empties(&self) -> usize {
        let list = std::mem::take(&mut *self.empties.lock());
        let mut n = 0;
        for seg in list {
            let s = &self.segs[seg as usize];
            if s.meta.lock().state != State::Empty {
                continue;
            }
            self.trim_and_free(seg);
            n += 1;
        }
        n
    }

    fn trim_and_free(&self, seg: u32) {
        match self.io.trim(seg) {
            Ok(()) => self.counters.trims.fetch_add(1, Ordering::Relaxed),
            Err(_) => self.counters.trim_errors.fetch_add(1, Ordering::Relaxed),
        };
        self.counters.gc_segments.fetch_add(1, Ordering::Relaxed);
        self.set_free(seg);
    }

    /// The best victims: sealed, below the threshold, most garbage first, as many as fit the
    /// free segments the collector may fill; none unless they free more segments than their
    /// live objects fill (moving one half-full segment into another gains nothing), or, when
    /// a writer waits, leave a last new segment at most half full for the next round.
    fn pick_victims(&self, max: usize, first_new: u64, mode: Mode) -> Vec<u32> {
        let thr = self.threshold_space();
        let size = self.seg_size as f64;
        let mut cands: Vec<(f64, u32, u32, u32)> = self
            .segs
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.state.load(Ordering::Relaxed) == State::Sealed as u8
                    && !s.stuck.load(Ordering::Relaxed)
                    && s.live_space.load(Ordering::Relaxed) < thr
                    && s.generation.load(Ordering::Relaxed) < first_new
            })
            .map(|(i, s)| {
                let live = s.live_space.load(Ordering::Relaxed);
                let score = if mode == Mode::Ahead {
                    let age = (first_new - s.generation.load(Ordering::Relaxed)) as f64;
                    let u = f64::from(live) / size;
                    -((1.0 - u) * age / (1.0 + u))
                } else {
                    f64::from(live)
                };
                (score, live, s.live_count.load(Ordering::Relaxed), i as u32)
            })
            .collect();
        cands.sort_unstable_by(|a, b| a.0.total_cmp(&b.0));
        let room = (self.free_segments() as usize).min(MAX_DEST) * self.seg_size;
        let mut need = 0usize;
        let mut out = Vec::new();
        for (_, space, count, seg) in cands {
            if out.len() == max {
                break;
            }
            let more = space as usize + count as usize * ENTRY;
            // Empty victims cost nothing; others need room in new segments (a first one is
            // taken even if it does not fit whole: what fits moves).
            if more > 0 && need + more > room && !out.is_empty() {
                break;
            }
            if more > 0 && room == 0 {
                continue;
            }
            need += more;
            out.push(seg);
        }
        // New segments the live objects fill: a header's fixed part each, and the end of each
        // but the last left empty by an object that does not fit there (two average objects
        // of slack).
        let objects: u32 = out
            .iter()
            .map(|&v| self.segs[v as usize].live_count.load(Ordering::Relaxed))
            .sum();
        let slack = 2 * need / (objects as usize).max(1);
        let usable = self.seg_size - header_len(0) - slack.min(self.seg_size / 4);
        let dests = need.div_ceil(usable);
        // When a writer waits and the least-live victims are more than (R - 1) / R live (R
        // new segments allowed), no group gains a segment at once; one whose last new segment
        // is at most half full is taken all the same: that segment is the cheapest victim of
        // the next round, which then gains. Ahead of need, such a group waits.
        let feeds_next = mode == Mode::Now
            && out.len() > 1
            && dests == out.len()
            && need - (dests - 1) * usable <= usable / 2;
        if (dests >= out.len() && !feeds_next) || (mode == Mode::Ahead && need < usable) {
            return Vec::new();
        }
        out
    }

    /// Collects `victims`; returns how many were reclaimed. Caller holds gc_lock.
    fn collect_group(&self, victims: &[u32], mode: Mode) -> usize {
        let ovh = self.sealer.overhead();
        let mut moved: Vec<Moved> = Vec::new();
        let mut dests: Vec<Dest> = vec![Dest::default()];
        let mut taken: Vec<u32> = Vec::new();
        let mut vbuf = self.buffer();
        for &v in victims {
            let s = &self.segs[v as usize];
            let snap = {
                let mut m = s.meta.lock();
                if m.state != State::Sealed {
                    continue;
                }
                m.state = State::Collecting;
                s.state.store(State::Collecting as u8, Ordering::Relaxed);
                (
                    m.generation,
                    m.offsets.clone(),
                    m.lens.clone(),
                    m.live.clone(),
                )
            };
            taken.push(v);
            let (generation, offsets, lens, live) = snap;
            let is_live = |e: usize| live[e / 64] & (1 << (e % 64)) != 0;
            let n = offsets.len();
            let live_entries: Vec<usize> = (0..n).filter(|&e| is_live(e)).collect();
            if live_entries.is_empty() {
                continue;
            }
            // Gather the header and the live objects in one batched read.
            let mut ranges: Vec<(usize, usize)> = vec![(0, align_up(header_len(n), self.align))];
            for &e in &live_entries {
                let o = offsets[e] as usize;
                let r = (
                    o & !(self.align - 1),
                    align_up(o + lens[e] as usize + ovh, self.align).min(self.seg_size),
                );
                let last = ranges.last_mut().expect("the header's range");
                if r.0 <= last.1 + MERGE_GAP {
                    last.1 = last.1.max(r.1);
                } else {
                    ranges.push(r);
                }
            }
            if self.read_ranges(v, vbuf.as_mut_slice(), &ranges).is_err() {
                // Not retried pass after pass: left alone until its objects are freed.
                self.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                s.stuck.store(true, Ordering::Relaxed);
                continue;
            }
            let buf = vbuf.as_mut_slice();
            let Some(entries) = self.open_header(v, generation, n, buf, &offsets, &lens) else {
                self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                s.stuck.store(true, Ordering::Relaxed);
                continue;
            };
            for &e in &live_entries {
                let ent = entries[e];
                if self.owner(ent.owner).is_none() {
                    // Its owner is gone or going: it frees its own objects.
                    s.stuck.store(true, Ordering::Relaxed);
                    continue;
                }
                let o = ent.offset as usize;
                let b = Binding {
                    owner: ent.owner,
                    segment: v,
                    index: ent.index,
                    generation,
                    offset: ent.offset,
                    len: ent.len,
                };
                let obj = &mut buf[o..o + ent.len as usize + ovh];
                if !self.sealer.open_object(&b, e as u32, obj) {
                    self.counters.corrupt.fetch_add(1, Ordering::Relaxed);
                    s.stuck.store(true, Ordering::Relaxed);
                    continue;
                }
                let len = ent.len as usize;
                let ext = extent(len + ovh);
                let mut d = dests.last_mut().expect("one destination at least");
                if header_len(d.objects.len() + 1) + d.data + ext > self.seg_size {
                    if dests.len() == MAX_DEST {
                        // No more room this round: stays where it is.
                        continue;
                    }
                    dests.push(Dest::default());
                    d = dests.last_mut().expect("just pushed");
                }
                let start = d.staged.len();
                d.staged.extend_from_slice(&obj[..len]);
                d.data += ext;
                d.objects.push(moved.len());
                moved.push(Moved {
                    owner: ent.owner,
                    index: ent.index,
                    old: Location::new(v, ent.offset),
                    start,
                    len,
                });
            }
        }
        // A last destination that is not full is not written ahead of need, nor when less
        // than half full after full ones: its objects stay in their victims for next time.
        let last = dests.last().expect("one destination at least");
        let fill = header_len(last.objects.len()) + last.data;
        let full = fill + self.seg_size / 16 >= self.seg_size;
        if (mode == Mode::Ahead && !full) || (dests.len() > 1 && fill < self.seg_size / 2) {
            dests.pop();
        }
        dests.retain(|d| !d.objects.is_empty());
        self.put_buffers(vec![vbuf]);
        let relocated = self.write_dests(&dests, &moved);
        let mut reclaimed = 0;
        for &(i, new) in &relocated {
            let m = &moved[i];
            // With no lock of ours held.
            let yes = self
                .owner(m.owner)
                .is_some_and(|o| o.relocate(m.index, m.old, new));
            if yes {
                self.counters.gc_moves.fetch_add(1, Ordering::Relaxed);
                self.free(m.old);
            } else {
                self.free(new);
            }
        }
        for v in taken {
            let s = &self.segs[v as usize];
            let empty = {
                let mut m = s.meta.lock();
                if m.live_count == 0 {
                    m.state = State::Empty;
                    s.state.store(State::Empty as u8, Ordering::Relaxed);
                    true
                } else {
                    m.state = State::Sealed;
                    s.state.store(State::Sealed as u8, Ordering::Relaxed);
                    false
                }
            };
            if empty {
                self.trim_and_free(v);
                reclaimed += 1;
            }
        }
        reclaimed
    }

    /// Writes the assembled destinations; returns (moved object, new location) for each object
    /// written (none if the write failed or no free segment was left).
    fn write_dests(&self, dests: &[Dest], moved: &[Moved]) -> Vec<(usize, Location)> {
        let mut bufs = Vec::new();
        let mut segs = Vec::new();
        for _ in dests {
            match self.take_free(true) {
                Some(s) => segs.push(s),
                None => break,
            }
        }
        let ovh = self.sealer.overhead();
        let mut placed = Vec::new();
        for (d, &seg) in dests.iter().zip(&segs) {
            let objs: Vec<Obj> = d
                .objects
                .iter()
                .map(|&i| {
                    let m = &moved[i];
                    (m.owner, m.index, &d.staged[m.start..m.start + m.len])
                })
                .collect();
            let l = segment::layout(objs.iter().map(|(_, _, b)| b.len() + ovh), self.seg_size);
            debug_assert_eq!(
                l.offsets.len(),
                objs.len(),
                "a destination is filled to fit"
            );
            let generation = self.next_generation();
            let mut buf = self.buffer();
            // (The layout takes them all: destinations were filled by the same arithmetic.
            // Were it otherwise, the ones left out would simply not move.)
            let objs = &objs[..l.offsets.len()];
            let len = self.fill(buf.as_mut_slice(), seg, generation, objs, &l.offsets);
            placed.push((seg, generation, len, l.offsets));
            bufs.push(buf);
        }
        let batch: Vec<(u32, &[u8])> = placed
            .iter()
            .zip(&bufs)
            .map(|(p, b)| (p.0, &b.as_slice()[..p.2]))
            .collect();
        let ok = batch.is_empty() || self.io.write_segments(&batch).is_ok();
        drop(batch);
        self.put_buffers(bufs);
        if !ok {
            self.counters.write_errors.fetch_add(1, Ordering::Relaxed);
            for s in segs {
                self.release_open(s);
            }
            return Vec::new();
        }
        // Destinations beyond the free segments found are not written.
        let mut out = Vec::new();
        for (d, (seg, generation, len, offsets)) in dests.iter().zip(placed) {
            let lens = d
                .objects
                .iter()
                .take(offsets.len())
                .map(|&i| moved[i].len as u32)
                .collect();
            for (&i, &o) in d.objects.iter().zip(&offsets) {
                out.push((i, Location::new(seg, o)));
            }
            self.install(seg, generation, offsets, lens);
            self.counters
                .device_bytes_written
                .fetch_add(len as u64, Ordering::Relaxed);
            self.counters.segment_writes.fetch_add(1, Ordering::Relaxed);
        }
        out
    }

    /// Reads `ranges` of segment `seg` into the same offsets of `buf`.
    fn read_ranges(
        &self,
        seg: u32,
        buf: &mut [u8],
        ranges: &[(usize, usize)],
    ) -> Result<(), TierError> {
        let mut parts: Vec<(usize, &mut [u8])> = Vec::with_capacity(ranges.len());
        let mut rest = buf;
        let mut at = 0;
        for &(s, e) in ranges {
            let (_, tail) = rest.split_at_mut(s - at);
            let (part, tail) = tail.split_at_mut(e - s);
            parts.push((s, part));
            rest = tail;
            at = e;
        }
        let bytes: usize = ranges.iter().map(|(s, e)| e - s).sum();
        self.counters
            .device_bytes_read
            .fetch_add(bytes as u64, Ordering::Relaxed);
        self.io.read_ranges(seg, &mut parts)
    }

    /// Checks a victim's header against what the log knows of it and returns its entries.
    fn open_header(
        &self,
        seg: u32,
        generation: u64,
        n: usize,
        buf: &mut [u8],
        offsets: &[u32],
        lens: &[u32],
    ) -> Option<Vec<Entry>> {
        let f = Fixed::decode(&buf[..FIXED]).ok()?;
        if f.segment != seg
            || f.count as usize != n
            || f.generation != generation
            || f.encrypted != self.sealer.encrypted()
        {
            return None;
        }
        let (head, rest) = buf.split_at_mut(FIXED);
        let (entries, seal) = rest.split_at_mut(ENTRY * n);
        if !self
            .sealer
            .open_header(generation, head, entries, &seal[..HEADER_SEAL])
        {
            return None;
        }
        let ovh = self.sealer.overhead() as u32;
        let list: Vec<Entry> = entries.chunks_exact(ENTRY).map(Entry::decode).collect();
        let consistent = list
            .iter()
            .zip(offsets.iter().zip(lens))
            .all(|(e, (&o, &l))| e.offset == o && e.len == l && e.sealed == l + ovh);
        consistent.then_some(list)
    }
}
