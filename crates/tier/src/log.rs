//! The log: segments, their liveness, and the owners' write / read / free.
//!
//! Space is handed out a segment at a time: a write packs its objects into as many new segments
//! as they need and writes each from its start in one go (segments are never updated in
//! place). What the log keeps in DRAM per segment: its state, its generation (the log's write
//! counter when it was last written: part of every seal, so an older write of the same segment
//! is detected), and per object its offset and length and a live bit (about 8 bytes per
//! object; the owner and page index are in the segment's header on the device, read only by
//! the collector).
//!
//! Locks: each segment's metadata has its own short lock, never held across I/O or an owner's
//! callback; reads and frees take only that one (so a page-fault handler never waits for the
//! collector's I/O). The free list and the list of emptied segments have their own. One
//! collection runs at a time (gc.rs).

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use zmem_os::sync::{Mutex, RwLock};

use crate::gc::GcShared;
use crate::io::{AlignedBuf, SegmentIo};
use crate::seal::{Binding, Sealer};
use crate::segment::{self, align_up, extent, header_len, Entry, Fixed, ENTRY, FIXED, HEADER_SEAL};
use crate::{IoMode, Location, LogConfig, LogStats, Owner, OwnerId, TierError};

/// A segment's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum State {
    /// On the free list (trimmed, or never written).
    Free = 0,
    /// Taken by a writer or the collector; being filled and written.
    Open = 1,
    /// Written: its live objects can be read and freed.
    Sealed = 2,
    /// Sealed, and the collector is moving its live objects out.
    Collecting = 3,
    /// Sealed with no live object left: waiting to be trimmed and freed.
    Empty = 4,
}

/// The metadata of one segment.
pub(crate) struct Meta {
    pub(crate) state: State,
    pub(crate) generation: u64,
    /// Per object, in offset order: offset, payload length, live bit.
    pub(crate) offsets: Box<[u32]>,
    pub(crate) lens: Box<[u32]>,
    pub(crate) live: Box<[u64]>,
    pub(crate) live_count: u32,
    /// Bytes the live objects take (sealed, padded).
    pub(crate) live_space: u32,
}

impl Meta {
    fn empty() -> Meta {
        Meta {
            state: State::Free,
            generation: 0,
            offsets: Box::new([]),
            lens: Box::new([]),
            live: Box::new([]),
            live_count: 0,
            live_space: 0,
        }
    }

    pub(crate) fn is_live(&self, entry: usize) -> bool {
        self.live[entry / 64] & (1 << (entry % 64)) != 0
    }

    fn clear(&mut self) {
        self.offsets = Box::new([]);
        self.lens = Box::new([]);
        self.live = Box::new([]);
        self.live_count = 0;
        self.live_space = 0;
    }
}

/// One segment: its metadata under a lock, and lock-free copies of what the collector's choice
/// of victims reads.
pub(crate) struct Seg {
    pub(crate) meta: Mutex<Meta>,
    pub(crate) state: AtomicU8,
    pub(crate) live_space: AtomicU32,
    pub(crate) live_count: AtomicU32,
    /// The generation it was last written with.
    pub(crate) generation: AtomicU64,
    /// The collector found an object here it cannot move (corrupt, or of an owner that is
    /// gone): not picked again until the segment empties.
    pub(crate) stuck: AtomicBool,
}

/// The log's counters.
#[derive(Default)]
pub(crate) struct Counters {
    pub(crate) objects: AtomicU64,
    pub(crate) live_bytes: AtomicU64,
    pub(crate) objects_written: AtomicU64,
    pub(crate) bytes_written: AtomicU64,
    pub(crate) device_bytes_written: AtomicU64,
    pub(crate) segment_writes: AtomicU64,
    pub(crate) reads: AtomicU64,
    /// Objects read along with another by `read_around`.
    pub(crate) read_ahead: AtomicU64,
    pub(crate) device_bytes_read: AtomicU64,
    pub(crate) gc_moves: AtomicU64,
    pub(crate) gc_segments: AtomicU64,
    pub(crate) trims: AtomicU64,
    pub(crate) trim_errors: AtomicU64,
    pub(crate) read_errors: AtomicU64,
    pub(crate) write_errors: AtomicU64,
    pub(crate) corrupt: AtomicU64,
    pub(crate) bad_frees: AtomicU64,
}

fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// An object to place in a segment: owner, page index, payload.
pub(crate) type Obj<'a> = (OwnerId, u64, &'a [u8]);

/// Why a read returned no data.
enum Fail {
    Corrupt(&'static str),
    Io(TierError),
}

/// Segment-sized write buffers kept for reuse.
const KEEP_BUFFERS: usize = 4;
/// Segments one write call writes (and holds buffers for) at once.
const WRITE_BATCH: usize = 8;
/// Segments a write that finds only the reserve left asks the collector to reclaim.
const COLLECT_ON_WRITE: usize = 4;
/// Collections a write runs, at most, before it gives up with `Full` (a round may gain no
/// segment yet and leave a cheap victim for the next, see `gc::pick_victims`).
const WRITER_ROUNDS: usize = 4;

/// The SSD log. Shared through `Arc`; every method takes `&self`.
pub struct Log {
    pub(crate) cfg: LogConfig,
    pub(crate) io: Box<dyn SegmentIo>,
    pub(crate) sealer: Sealer,
    pub(crate) seg_size: usize,
    pub(crate) nsegs: u32,
    pub(crate) align: usize,
    pub(crate) segs: Box<[Seg]>,
    free: Mutex<Vec<u32>>,
    free_count: AtomicU32,
    pub(crate) empties: Mutex<Vec<u32>>,
    generation: AtomicU64,
    owners: RwLock<Vec<Option<Weak<dyn Owner>>>>,
    pub(crate) gc_lock: Mutex<()>,
    buffers: Mutex<Vec<AlignedBuf>>,
    pub(crate) counters: Counters,
    pub(crate) gc: Arc<GcShared>,
    gc_thread: Mutex<Option<JoinHandle<()>>>,
}

thread_local! {
    /// A reader's buffer for the sectors of one object (grows to the largest read).
    static READ_BUF: RefCell<Option<AlignedBuf>> = const { RefCell::new(None) };
}

/// Registers this thread's log read buffer now (it is still made at first use); see
/// `zmem_store::prepare_thread`.
pub fn prepare_thread() {
    READ_BUF.with(|_| ());
}

/// An object [`Log::read_around`] read along with the one asked for, as it was read (still
/// sealed): open it with [`Log::open_fetched`] when its page is read.
pub struct ReadAlong<'a> {
    pub index: u64,
    pub loc: Location,
    /// The generation of its segment when it was read.
    pub generation: u64,
    pub sealed: &'a [u8],
}

/// Most objects one `read_around` reads along with its own.
pub const MAX_NEAR: usize = 16;

/// Alignment of every buffer handed to a backend (enough for any O_DIRECT device).
pub(crate) const BUF_ALIGN: usize = 4096;

impl Log {
    /// Opens (creates) the log at `cfg.path` (see [`LogConfig`]): a directory gets an unnamed
    /// file there (O_TMPFILE, or created and unlinked at once where that is refused), a block
    /// device is used whole (O_EXCL); an existing regular file is refused. The space is
    /// reserved now (fallocate), so a full file system is reported here. O_DIRECT where the
    /// file system takes it (else buffered, said once in the log); io_uring as `cfg.io` says.
    /// Starts the background collector ("zmem-log-gc").
    pub fn open(cfg: LogConfig) -> Result<Arc<Log>, TierError> {
        validate(&cfg)?;
        let segments = cfg.size / cfg.segment_size as u64;
        check_segments(&cfg, segments)?;
        let io = crate::io::FileIo::open(
            &cfg.path,
            segments * cfg.segment_size as u64,
            cfg.segment_size,
            cfg.io,
        )?;
        Log::with_io(cfg, Box::new(io))
    }

    /// The same over a given segment backend (tests, other devices): the backend's segment
    /// count is the log's size (`cfg.path` and `cfg.size` are not used; `cfg.segment_size`
    /// must be the backend's).
    pub fn with_io(cfg: LogConfig, io: Box<dyn SegmentIo>) -> Result<Arc<Log>, TierError> {
        validate(&cfg)?;
        if io.segment_size() != cfg.segment_size {
            return Err(TierError::Config(format!(
                "the backend's segments are {} bytes, the configuration's {}",
                io.segment_size(),
                cfg.segment_size
            )));
        }
        let align = io.alignment();
        if !align.is_power_of_two() || align > BUF_ALIGN {
            return Err(TierError::Config(format!(
                "a backend alignment of {align} (a power of two up to {BUF_ALIGN} is needed)"
            )));
        }
        let nsegs = io.segments();
        check_segments(&cfg, u64::from(nsegs))?;
        if cfg.io == IoMode::Uring && !io.is_uring() {
            return Err(TierError::Config(
                "io_uring was asked for; this backend does not use it".into(),
            ));
        }
        let sealer = Sealer::new(cfg.encrypt)?;
        let segs: Box<[Seg]> = (0..nsegs)
            .map(|_| Seg {
                meta: Mutex::new(Meta::empty()),
                state: AtomicU8::new(State::Free as u8),
                live_space: AtomicU32::new(0),
                live_count: AtomicU32::new(0),
                generation: AtomicU64::new(0),
                stuck: AtomicBool::new(false),
            })
            .collect();
        // Lowest segment numbers first (popped from the end).
        let free: Vec<u32> = (0..nsegs).rev().collect();
        let log = Arc::new(Log {
            seg_size: cfg.segment_size,
            cfg,
            io,
            sealer,
            nsegs,
            align,
            segs,
            free_count: AtomicU32::new(nsegs),
            free: Mutex::new(free),
            empties: Mutex::new(Vec::new()),
            generation: AtomicU64::new(1),
            owners: RwLock::new(Vec::new()),
            gc_lock: Mutex::new(()),
            buffers: Mutex::new(Vec::new()),
            counters: Counters::default(),
            gc: Arc::new(GcShared::default()),
            gc_thread: Mutex::new(None),
        });
        let handle = crate::gc::spawn(&log)?;
        *log.gc_thread.lock() = Some(handle);
        Ok(log)
    }

    /// Registers an owner of objects; its id goes with every object it writes.
    pub fn register(&self, owner: Weak<dyn Owner>) -> OwnerId {
        let mut o = self.owners.write();
        o.push(Some(owner));
        (o.len() - 1) as OwnerId
    }

    /// The owner is going away: the collector no longer calls it. It frees its own objects
    /// (before or after; objects of an owner that is gone are left where they are).
    pub fn unregister(&self, id: OwnerId) {
        if let Some(slot) = self.owners.write().get_mut(id as usize) {
            *slot = None;
        }
    }

    pub(crate) fn owner(&self, id: OwnerId) -> Option<Arc<dyn Owner>> {
        let w = self.owners.read().get(id as usize).cloned().flatten();
        w.and_then(|w| w.upgrade())
    }

    fn registered(&self, id: OwnerId) -> bool {
        matches!(self.owners.read().get(id as usize), Some(Some(_)))
    }

    /// Largest payload one object may have in this log's segments.
    pub fn max_object(&self) -> usize {
        self.seg_size - header_len(1) - self.sealer.overhead()
    }

    /// Bytes a sealed object has beyond its payload (the AES-GCM tag, or the crc32).
    pub fn seal_overhead(&self) -> usize {
        self.sealer.overhead()
    }

    /// Bytes of live objects in the log now (`LogStats::live_bytes`, without the rest).
    pub fn live_bytes(&self) -> u64 {
        self.counters.live_bytes.load(Ordering::Relaxed)
    }

    pub fn config(&self) -> &LogConfig {
        &self.cfg
    }

    /// Bytes of one segment that objects may fill, counting each as [`object_space`]: a
    /// writer that batches objects up to this fills whole segments (a partly filled segment
    /// is written whole all the same, and its empty tail is garbage from the start).
    ///
    /// [`object_space`]: Log::object_space
    pub fn segment_space(&self) -> usize {
        // The header grows by ENTRY per object (counted in object_space) and is padded to
        // OBJECT_ALIGN: at most OBJECT_ALIGN - 1 more than header_len(0) + n * ENTRY.
        self.seg_size - header_len(0) - (segment::OBJECT_ALIGN - 1)
    }

    /// Bytes an object of `len` payload bytes takes in a segment: its sealed bytes, padding
    /// and header entry.
    pub fn object_space(&self, len: usize) -> usize {
        extent(len + self.sealer.overhead()) + ENTRY
    }

    /// Writes objects `(page index, bytes)` of one owner, packed into new segments (several
    /// if needed, written in one batch); returns their locations in order once the segments
    /// are on the device. On an error nothing is written. Empty input: Ok(empty).
    ///
    /// Takes free segments beyond the collector's reserve; when only the reserve is left it
    /// runs a collection first, on this thread (so [`Owner::relocate`] may be called here:
    /// hold no lock that relocate takes), then `TierError::Full` if still none is free.
    pub fn write(
        &self,
        owner: OwnerId,
        objects: &[(u64, &[u8])],
    ) -> Result<Vec<Location>, TierError> {
        if objects.is_empty() {
            return Ok(Vec::new());
        }
        if !self.registered(owner) {
            return Err(TierError::Config(format!(
                "owner {owner} is not registered with this log"
            )));
        }
        let max = self.max_object();
        if let Some((_, b)) = objects.iter().find(|(_, b)| b.len() > max) {
            return Err(TierError::TooLarge {
                len: b.len(),
                segment_size: self.seg_size,
            });
        }
        let ovh = self.sealer.overhead();
        // Group the objects by segment.
        let mut groups: Vec<(usize, Vec<u32>)> = Vec::new();
        let mut i = 0;
        while i < objects.len() {
            let l = segment::layout(
                objects[i..].iter().map(|(_, b)| b.len() + ovh),
                self.seg_size,
            );
            debug_assert!(!l.offsets.is_empty(), "every object fits an empty segment");
            let n = l.offsets.len().max(1);
            groups.push((i, l.offsets));
            i += n;
        }
        // At most WRITE_BATCH segments (and their buffers) at a time; on an error, what this
        // call wrote before is freed again.
        let mut locs = Vec::with_capacity(objects.len());
        for chunk in groups.chunks(WRITE_BATCH) {
            match self.write_segments(owner, objects, chunk) {
                Ok(l) => locs.extend(l),
                Err(e) => {
                    for l in locs {
                        self.free(l);
                    }
                    return Err(e);
                }
            }
        }
        let c = &self.counters;
        add(&c.objects_written, objects.len() as u64);
        add(
            &c.bytes_written,
            objects.iter().map(|(_, b)| b.len() as u64).sum(),
        );
        if self.free_segments() <= 2 * self.cfg.reserve_segments {
            self.kick();
        }
        Ok(locs)
    }

    /// Writes the segments laid out in `groups` (first object, offsets) in one batch and
    /// publishes them; on an error nothing of them is published.
    fn write_segments(
        &self,
        owner: OwnerId,
        objects: &[(u64, &[u8])],
        groups: &[(usize, Vec<u32>)],
    ) -> Result<Vec<Location>, TierError> {
        let mut segs = Vec::with_capacity(groups.len());
        for _ in groups {
            match self.take_for_write() {
                Some(s) => segs.push(s),
                None => {
                    for s in segs {
                        self.release_open(s);
                    }
                    self.kick();
                    return Err(TierError::Full {
                        segments: self.nsegs,
                        segment_size: self.seg_size,
                    });
                }
            }
        }
        let mut bufs: Vec<AlignedBuf> = groups.iter().map(|_| self.buffer()).collect();
        let mut placed: Vec<(u32, u64, usize)> = Vec::with_capacity(groups.len());
        for (((start, offsets), &seg), buf) in groups.iter().zip(&segs).zip(bufs.iter_mut()) {
            let objs: Vec<Obj> = objects[*start..*start + offsets.len()]
                .iter()
                .map(|(index, b)| (owner, *index, *b))
                .collect();
            let generation = self.next_generation();
            let len = self.fill(buf.as_mut_slice(), seg, generation, &objs, offsets);
            placed.push((seg, generation, len));
        }
        let batch: Vec<(u32, &[u8])> = placed
            .iter()
            .zip(&bufs)
            .map(|(&(seg, _, len), b)| (seg, &b.as_slice()[..len]))
            .collect();
        let r = self.io.write_segments(&batch);
        drop(batch);
        self.put_buffers(bufs);
        if let Err(e) = r {
            add(&self.counters.write_errors, 1);
            for s in segs {
                self.release_open(s);
            }
            return Err(e);
        }
        let mut locs = Vec::new();
        let c = &self.counters;
        for ((start, offsets), &(seg, generation, len)) in groups.iter().zip(&placed) {
            let lens: Vec<u32> = objects[*start..*start + offsets.len()]
                .iter()
                .map(|(_, b)| b.len() as u32)
                .collect();
            locs.extend(offsets.iter().map(|&o| Location::new(seg, o)));
            self.install(seg, generation, offsets.clone(), lens);
            add(&c.device_bytes_written, len as u64);
            add(&c.segment_writes, 1);
        }
        Ok(locs)
    }

    /// Reads the object at `loc` (its payload is `out.len()` bytes, as written) into `out`,
    /// reading only the device sectors that hold it, and checks its seal. A location that is
    /// not a live object of that length, or an object that fails its seal (a flipped bit, a
    /// truncated device, a stale segment, another owner's or page's object) is
    /// `TierError::Corrupt`, and `out` is zeroed. Takes only the segment's metadata lock for a
    /// moment: never waits for the collector.
    pub fn read(
        &self,
        owner: OwnerId,
        index: u64,
        loc: Location,
        out: &mut [u8],
    ) -> Result<(), TierError> {
        self.read_around(owner, index, loc, out, &[], 0, &mut |_| {})
            .map(|_| ())
    }

    /// Reads the object at `loc` like [`Log::read`] and, in the same device read, the objects
    /// of `near` (page index, location, payload length) that are live objects of the same
    /// segment, as far as the read stays within `max_span` bytes; each of those is handed to
    /// `keep` as it was read, still sealed, to be opened by [`Log::open_fetched`] if its page
    /// is read later. Objects of `near` past the first [`MAX_NEAR`], in another segment, not
    /// live or of another length are left out. Returns how many went to `keep`. This is the
    /// kernel's swap read-ahead for the log: objects written together are read together, for
    /// about the cost of one read.
    #[allow(clippy::too_many_arguments)]
    pub fn read_around(
        &self,
        owner: OwnerId,
        index: u64,
        loc: Location,
        out: &mut [u8],
        near: &[(u64, Location, usize)],
        max_span: usize,
        keep: &mut dyn FnMut(ReadAlong<'_>),
    ) -> Result<usize, TierError> {
        match self.read_object_around(owner, index, loc, out, near, max_span, keep) {
            Ok(n) => Ok(n),
            Err(fail) => {
                out.fill(0);
                Err(self.failed(loc, fail))
            }
        }
    }

    /// Opens, in place, an object handed out by [`Log::read_around`]: `sealed` as it was read,
    /// `len` its payload length. True: `sealed[..len]` is now the object of page `index` at
    /// `loc`. False: it is not that object any more, or never was (freed, its segment
    /// collected or rewritten since it was read, a torn read, a flipped bit); `sealed` is
    /// garbage. Read it with [`Log::read`] then, which reports a real corruption.
    pub fn open_fetched(
        &self,
        owner: OwnerId,
        index: u64,
        loc: Location,
        generation: u64,
        len: usize,
        sealed: &mut [u8],
    ) -> bool {
        let (seg, off) = (loc.segment(), loc.offset());
        sealed.len() == len + self.sealer.overhead()
            && self.segs.get(seg as usize).is_some_and(|s| {
                let entry = {
                    let m = s.meta.lock();
                    match Self::live_entry(&m, off, len) {
                        Ok(e) if m.generation == generation => e,
                        _ => return false,
                    }
                };
                let b = Binding {
                    owner,
                    segment: seg,
                    index,
                    generation,
                    offset: off,
                    len: len as u32,
                };
                self.sealer.open_object(&b, entry as u32, sealed)
            })
    }

    /// The error a failed read reports (and counts).
    fn failed(&self, loc: Location, fail: Fail) -> TierError {
        match fail {
            Fail::Corrupt(why) => {
                add(&self.counters.corrupt, 1);
                TierError::Corrupt {
                    segment: loc.segment(),
                    offset: loc.offset(),
                    why,
                }
            }
            Fail::Io(e) => {
                add(&self.counters.read_errors, 1);
                e
            }
        }
    }

    /// The entry of the live object of `len` payload bytes at `off` of a readable segment.
    fn live_entry(m: &Meta, off: u32, len: usize) -> Result<usize, Fail> {
        if !matches!(m.state, State::Sealed | State::Collecting) {
            return Err(Fail::Corrupt(
                "not a live object (its segment was reclaimed)",
            ));
        }
        let e = m
            .offsets
            .binary_search(&off)
            .map_err(|_| Fail::Corrupt("no object starts at this offset"))?;
        if !m.is_live(e) {
            return Err(Fail::Corrupt("the object was freed"));
        }
        if m.lens[e] as usize != len {
            return Err(Fail::Corrupt(
                "the object's length differs from the one asked for",
            ));
        }
        Ok(e)
    }

    #[allow(clippy::too_many_arguments)]
    fn read_object_around(
        &self,
        owner: OwnerId,
        index: u64,
        loc: Location,
        out: &mut [u8],
        near: &[(u64, Location, usize)],
        max_span: usize,
        keep: &mut dyn FnMut(ReadAlong<'_>),
    ) -> Result<usize, Fail> {
        let (seg, off) = (loc.segment(), loc.offset());
        let s = self
            .segs
            .get(seg as usize)
            .ok_or(Fail::Corrupt("no such segment"))?;
        let overhead = self.sealer.overhead();
        let sealed = out.len() + overhead;
        let mut start = off as usize & !(self.align - 1);
        let mut end = align_up(off as usize + sealed, self.align);
        // The objects read along: (index in `near`), without allocating (this runs in fault
        // handlers, on the signal route in a signal handler).
        let mut along = [0usize; MAX_NEAR];
        let mut n_along = 0;
        let (entry, generation) = {
            let m = s.meta.lock();
            let e = Self::live_entry(&m, off, out.len())?;
            for (k, &(_, l, len)) in near.iter().enumerate().take(MAX_NEAR) {
                if l.segment() != seg || l == loc || Self::live_entry(&m, l.offset(), len).is_err()
                {
                    continue;
                }
                let lo = start.min(l.offset() as usize & !(self.align - 1));
                let hi = end.max(align_up(l.offset() as usize + len + overhead, self.align));
                if hi - lo <= max_span {
                    (start, end) = (lo, hi);
                    along[n_along] = k;
                    n_along += 1;
                }
            }
            (e, m.generation)
        };
        let at = off as usize - start;
        add(&self.counters.reads, 1);
        add(&self.counters.device_bytes_read, (end - start) as u64);
        add(&self.counters.read_ahead, n_along as u64);
        READ_BUF.with(|cell| {
            let mut slot = cell.borrow_mut();
            if slot.as_ref().is_none_or(|b| b.len() < end - start) {
                *slot = Some(AlignedBuf::new(
                    (end - start).next_power_of_two(),
                    BUF_ALIGN,
                ));
            }
            let buf = &mut slot.as_mut().expect("just set").as_mut_slice()[..end - start];
            match self.io.read_at(seg, start, buf) {
                Ok(()) => {}
                Err(TierError::Short { .. }) => {
                    return Err(Fail::Corrupt(
                        "the device ends before the object (truncated)",
                    ));
                }
                Err(e) => return Err(Fail::Io(e)),
            }
            let b = Binding {
                owner,
                segment: seg,
                index,
                generation,
                offset: off,
                len: out.len() as u32,
            };
            let obj = &mut buf[at..at + sealed];
            if !self.sealer.open_object(&b, entry as u32, obj) {
                return Err(Fail::Corrupt(if self.sealer.encrypted() {
                    "authentication failed (altered, stale, or another page's object)"
                } else {
                    "checksum mismatch (altered, stale, or another page's object)"
                }));
            }
            out.copy_from_slice(&obj[..out.len()]);
            for &k in &along[..n_along] {
                let (i, l, len) = near[k];
                let from = l.offset() as usize - start;
                keep(ReadAlong {
                    index: i,
                    loc: l,
                    generation,
                    sealed: &buf[from..from + len + overhead],
                });
            }
            Ok(n_along)
        })
    }

    /// The object at `loc` is dead. Takes only the segment's metadata lock for a moment (never
    /// anything the collector holds while it calls an owner). A location that is not a live
    /// object (freed twice, never written) is ignored and counted in `LogStats::bad_frees`.
    pub fn free(&self, loc: Location) {
        let (seg, off) = (loc.segment(), loc.offset());
        let Some(s) = self.segs.get(seg as usize) else {
            add(&self.counters.bad_frees, 1);
            return;
        };
        let ovh = self.sealer.overhead();
        let (emptied, crossed) = {
            let mut m = s.meta.lock();
            if !matches!(m.state, State::Sealed | State::Collecting) {
                drop(m);
                add(&self.counters.bad_frees, 1);
                return;
            }
            let e = match m.offsets.binary_search(&off) {
                Ok(e) if m.is_live(e) => e,
                _ => {
                    drop(m);
                    add(&self.counters.bad_frees, 1);
                    return;
                }
            };
            m.live[e / 64] &= !(1 << (e % 64));
            let len = m.lens[e];
            let before = m.live_space;
            m.live_count -= 1;
            m.live_space -= extent(len as usize + ovh) as u32;
            s.live_space.store(m.live_space, Ordering::Relaxed);
            s.live_count.store(m.live_count, Ordering::Relaxed);
            self.counters.objects.fetch_sub(1, Ordering::Relaxed);
            self.counters
                .live_bytes
                .fetch_sub(u64::from(len), Ordering::Relaxed);
            let thr = self.threshold_space();
            let crossed = before >= thr && m.live_space < thr;
            let emptied = m.live_count == 0 && m.state == State::Sealed;
            if emptied {
                m.state = State::Empty;
                s.state.store(State::Empty as u8, Ordering::Relaxed);
            }
            (emptied, crossed)
        };
        if emptied {
            self.empties.lock().push(seg);
            self.kick();
        } else if crossed && self.free_segments() <= 2 * self.cfg.reserve_segments {
            self.kick();
        }
    }

    /// The log's counters now.
    pub fn stats(&self) -> LogStats {
        let c = &self.counters;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        LogStats {
            segment_size: self.seg_size as u64,
            segments: u64::from(self.nsegs),
            segments_free: u64::from(self.free_segments()),
            objects: g(&c.objects),
            live_bytes: g(&c.live_bytes),
            objects_written: g(&c.objects_written),
            bytes_written: g(&c.bytes_written),
            device_bytes_written: g(&c.device_bytes_written),
            segment_writes: g(&c.segment_writes),
            reads: g(&c.reads),
            read_ahead: g(&c.read_ahead),
            device_bytes_read: g(&c.device_bytes_read),
            gc_moves: g(&c.gc_moves),
            gc_segments: g(&c.gc_segments),
            trims: g(&c.trims),
            trim_errors: g(&c.trim_errors),
            read_errors: g(&c.read_errors),
            write_errors: g(&c.write_errors),
            corrupt: g(&c.corrupt),
            bad_frees: g(&c.bad_frees),
            encrypted: self.sealer.encrypted(),
            uring: self.io.is_uring(),
            direct: self.io.is_direct(),
        }
    }

    // ---- shared with the collector ----

    pub(crate) fn free_segments(&self) -> u32 {
        self.free_count.load(Ordering::Relaxed)
    }

    /// Live bytes under which a segment may be collected.
    pub(crate) fn threshold_space(&self) -> u32 {
        (self.cfg.gc_threshold * self.seg_size as f64) as u32
    }

    /// The generation the next segment write will get.
    pub(crate) fn generation_now(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    pub(crate) fn next_generation(&self) -> u64 {
        self.generation.fetch_add(1, Ordering::Relaxed)
    }

    /// A free segment beyond the reserve, running collections if only the reserve is left
    /// (until one is free, a collection reclaims nothing, or `WRITER_ROUNDS`).
    fn take_for_write(&self) -> Option<u32> {
        for _ in 0..WRITER_ROUNDS {
            if let Some(s) = self.take_free(false) {
                return Some(s);
            }
            if self.collect_by(COLLECT_ON_WRITE, crate::gc::Mode::Now) == 0 {
                break;
            }
        }
        self.take_free(false)
    }

    /// Takes a free segment (the collector may take the reserve too) and marks it open.
    pub(crate) fn take_free(&self, for_collector: bool) -> Option<u32> {
        let seg = {
            let mut f = self.free.lock();
            if !for_collector && f.len() as u32 <= self.cfg.reserve_segments {
                return None;
            }
            let s = f.pop()?;
            self.free_count.store(f.len() as u32, Ordering::Relaxed);
            s
        };
        let s = &self.segs[seg as usize];
        let mut m = s.meta.lock();
        debug_assert_eq!(m.state, State::Free);
        m.state = State::Open;
        m.clear();
        s.state.store(State::Open as u8, Ordering::Relaxed);
        Some(seg)
    }

    /// Puts a segment that was taken but not written (or whose write failed) back.
    pub(crate) fn release_open(&self, seg: u32) {
        self.set_free(seg);
    }

    /// Marks `seg` free and puts it on the free list.
    pub(crate) fn set_free(&self, seg: u32) {
        let s = &self.segs[seg as usize];
        {
            let mut m = s.meta.lock();
            m.state = State::Free;
            m.clear();
            s.state.store(State::Free as u8, Ordering::Relaxed);
            s.live_space.store(0, Ordering::Relaxed);
            s.live_count.store(0, Ordering::Relaxed);
            s.stuck.store(false, Ordering::Relaxed);
        }
        let mut f = self.free.lock();
        f.push(seg);
        self.free_count.store(f.len() as u32, Ordering::Relaxed);
    }

    /// Publishes a written segment: all its objects live.
    pub(crate) fn install(&self, seg: u32, generation: u64, offsets: Vec<u32>, lens: Vec<u32>) {
        let ovh = self.sealer.overhead();
        let n = offsets.len();
        let space: usize = lens.iter().map(|&l| extent(l as usize + ovh)).sum();
        let bytes: u64 = lens.iter().map(|&l| u64::from(l)).sum();
        let mut live = vec![0u64; n.div_ceil(64)].into_boxed_slice();
        for (i, w) in live.iter_mut().enumerate() {
            let bits = (n - i * 64).min(64);
            *w = if bits == 64 {
                u64::MAX
            } else {
                (1u64 << bits) - 1
            };
        }
        let s = &self.segs[seg as usize];
        let mut m = s.meta.lock();
        m.generation = generation;
        m.offsets = offsets.into_boxed_slice();
        m.lens = lens.into_boxed_slice();
        m.live = live;
        m.live_count = n as u32;
        m.live_space = space as u32;
        s.live_space.store(space as u32, Ordering::Relaxed);
        s.live_count.store(n as u32, Ordering::Relaxed);
        s.generation.store(generation, Ordering::Relaxed);
        s.stuck.store(false, Ordering::Relaxed);
        add(&self.counters.objects, n as u64);
        add(&self.counters.live_bytes, bytes);
        // Published last: readers and frees check the state first.
        m.state = State::Sealed;
        s.state.store(State::Sealed as u8, Ordering::Relaxed);
    }

    /// Lays out segment `seg` of generation `generation` in `buf`: header, then each object
    /// sealed at its offset. Returns the bytes to write (up to the last object, aligned).
    pub(crate) fn fill(
        &self,
        buf: &mut [u8],
        seg: u32,
        generation: u64,
        objs: &[Obj],
        offsets: &[u32],
    ) -> usize {
        let n = objs.len();
        let ovh = self.sealer.overhead();
        let used = match (objs.last(), offsets.last()) {
            (Some((_, _, b)), Some(&o)) => o as usize + extent(b.len() + ovh),
            _ => header_len(0),
        };
        let len = align_up(used, self.align).min(self.seg_size);
        buf[..len].fill(0);
        for (e, (&(owner, index, payload), &off)) in objs.iter().zip(offsets).enumerate() {
            let o = off as usize;
            let sealed = payload.len() + ovh;
            buf[o..o + payload.len()].copy_from_slice(payload);
            let b = Binding {
                owner,
                segment: seg,
                index,
                generation,
                offset: off,
                len: payload.len() as u32,
            };
            self.sealer
                .seal_object(&b, e as u32, &mut buf[o..o + sealed]);
            Entry {
                owner,
                offset: off,
                index,
                len: payload.len() as u32,
                sealed: sealed as u32,
            }
            .encode(&mut buf[FIXED + ENTRY * e..FIXED + ENTRY * (e + 1)]);
        }
        let fixed = Fixed {
            encrypted: self.sealer.encrypted(),
            segment: seg,
            count: n as u32,
            generation,
        }
        .encode();
        buf[..FIXED].copy_from_slice(&fixed);
        let (head, rest) = buf.split_at_mut(FIXED);
        let (entries, seal) = rest.split_at_mut(ENTRY * n);
        self.sealer
            .seal_header(generation, head, entries, &mut seal[..HEADER_SEAL]);
        len
    }

    /// A segment-sized aligned buffer.
    pub(crate) fn buffer(&self) -> AlignedBuf {
        self.buffers
            .lock()
            .pop()
            .unwrap_or_else(|| AlignedBuf::new(self.seg_size, BUF_ALIGN))
    }

    pub(crate) fn put_buffers(&self, bufs: Vec<AlignedBuf>) {
        let mut b = self.buffers.lock();
        for x in bufs {
            if b.len() < KEEP_BUFFERS {
                b.push(x);
            }
        }
    }

    /// Wakes the background collector.
    pub(crate) fn kick(&self) {
        self.gc.kick();
    }
}

impl Drop for Log {
    fn drop(&mut self) {
        self.gc.stop();
        if let Some(h) = self.gc_thread.lock().take() {
            // The collector may itself hold the last reference (it upgrades its Weak for a
            // pass): it must not join itself; it ends on its own once the Weak is dead.
            if h.thread().id() != std::thread::current().id() {
                let _ = h.join();
            }
        }
    }
}

fn validate(cfg: &LogConfig) -> Result<(), TierError> {
    let s = cfg.segment_size;
    if !s.is_power_of_two() || !(segment::MIN_SEGMENT..=segment::MAX_SEGMENT).contains(&s) {
        return Err(TierError::Config(format!(
            "segment size {s}: a power of two from {} KiB to {} MiB is needed",
            segment::MIN_SEGMENT >> 10,
            segment::MAX_SEGMENT >> 20
        )));
    }
    if !(cfg.gc_threshold > 0.0 && cfg.gc_threshold <= 1.0) {
        return Err(TierError::Config(format!(
            "gc_threshold {}: a fraction in (0, 1] is needed",
            cfg.gc_threshold
        )));
    }
    if cfg.reserve_segments == 0 {
        return Err(TierError::Config(
            "reserve_segments 0: the collector needs at least one free segment to copy into".into(),
        ));
    }
    Ok(())
}

/// The log needs its reserve plus room for writes.
fn check_segments(cfg: &LogConfig, segments: u64) -> Result<(), TierError> {
    let min = u64::from(cfg.reserve_segments) + 2;
    if segments < min {
        return Err(TierError::Config(format!(
            "a log of {segments} segments of {} bytes: at least {min} are needed ({} in reserve \
             for the collector)",
            cfg.segment_size, cfg.reserve_segments
        )));
    }
    if segments > u64::from(u32::MAX) {
        return Err(TierError::Config(format!(
            "{segments} segments: at most 2^32 - 1"
        )));
    }
    Ok(())
}
