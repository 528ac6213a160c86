//! The entropy coder's try, left for later. lz4 (the `fast` and `auto` policies' codec) finds
//! no repeats in some data that an entropy coder still shrinks (decimal digits, base64, random
//! printable text): a page lz4 cannot shrink is tried with zstd-1 before it is given up as raw.
//! That try costs several times the lz4 attempt, and every read of the page then pays a zstd
//! decode instead of a copy. `sort -n` of 1.5M numbers at `zmem run --resident 16M` tried it
//! on 306k of its 439k evictions, which took 13 s of codec CPU in an 18 s run: pages that came
//! back a second later paid for a ratio nobody kept.
//!
//! With [`StoreConfig::entropy_later`](crate::StoreConfig::entropy_later), while the recent
//! tries mostly won ([`Gate`]), such a page is stored raw at once (flag `LATER`) and joins a
//! queue; [`StoreCore::entropy_pass`], called on idle CPU (the region's evictor between its
//! batches), makes the try for the pages that stayed stored [`LATER_AFTER_MS`]. A page read back
//! before then never pays for it. One page in [`SAMPLE`] is still tried at once, so that the
//! gate follows the data: when the tries stop winning (data that nothing shrinks), pages are
//! tried at once again and a caller of `write_if_smaller` learns at once that they do not
//! compress.
//!
//! The wait adapts ([`next_wait`]): a program that scans a set larger than its budget brings
//! every page back within seconds, so each try is paid again at every pass, and every fault
//! then decodes zstd. A JVM summing 200 MB of int arrays at `--resident 32M` (lz4 cannot shrink
//! them, zstd-1 halves them) made 118k tries, all wins, 2.6 s of codec CPU, and ran 6.8 s
//! against 4.5–6.3 s with the pages left raw. While most of the coded pages come back the wait
//! doubles (up to [`WAIT_MAX_MS`]); while few do it halves (down to [`LATER_AFTER_MS`]). Past
//! the shortest wait a page refused while the queue is full is stored raw without a try: the
//! pages queued first are the ones closest to their try.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Instant;

use zmem_codec::{Codec, PAGE_SIZE};
use zmem_os::sync::Mutex;

use crate::slot::{HUGE, LATER, OBJECT};
use crate::StoreCore;

/// The entropy coder tried on what the policy's codec cannot shrink.
pub(crate) const ENTROPY_CODEC: Codec = Codec::Zstd { level: 1 };

/// A deferred page is tried once it has stayed stored this long (the `auto` policy's idle
/// interval): the shortest wait.
pub const LATER_AFTER_MS: u32 = 1000;

/// The wait while the tries are urgent ([`StoreCore::entropy_urgent`]), if shorter: pages
/// that come back this soon are still spared the try.
pub const URGENT_AFTER_MS: u32 = 250;

/// The longest wait.
pub const WAIT_MAX_MS: u32 = 32_000;

/// The wait is reconsidered after this many tries won.
const WAIT_WINDOW: u32 = 256;

/// The wait after a window in which `coded` pages were shrunk by the entropy coder and `back`
/// pages it had shrunk were read back: doubled if at least half came back (the coded pages
/// are not cold), halved if at most one in eight did.
pub(crate) fn next_wait(wait_ms: u32, coded: u32, back: u32) -> u32 {
    if back.saturating_mul(2) >= coded {
        wait_ms.saturating_mul(2).min(WAIT_MAX_MS)
    } else if back.saturating_mul(8) <= coded {
        (wait_ms / 2).max(LATER_AFTER_MS)
    } else {
        wait_ms
    }
}

/// Tries are deferred while at least this many of the last 32 won.
const DEFER_WINS: u32 = 24;

/// One page lz4 refused in this many is tried at once even while tries are deferred.
const SAMPLE: u32 = 16;

/// The tries are urgent while the pool saves less than this share of the bytes it holds (an
/// eighth): the raw pages waiting for theirs then keep the program's DRAM where it would be
/// without zmem (see [`StoreCore::entropy_urgent`]).
const URGENT_SAVING_DIV: u64 = 8;

/// Pages waiting for their try, at most (16 bytes each: 1 MiB). A page refused while the queue
/// is full is tried at once.
const MAX_LATER: usize = 1 << 16;

/// Whether the next page lz4 refused may be stored raw with its try left for later: the
/// outcomes of the last 32 tries (bit set: the entropy coder won) and how many refused pages
/// came before this one.
pub(crate) fn defer(outcomes: u32, seen: u32) -> bool {
    outcomes.count_ones() >= DEFER_WINS && seen % SAMPLE != 0
}

/// The recent outcomes of the entropy coder's tries, and the pages waiting for theirs.
pub(crate) struct Later {
    outcomes: AtomicU32,
    seen: AtomicU32,
    /// How long a page waits for its try now ([`next_wait`]), and the window's counts: pages
    /// the coder shrank, and pages it had shrunk read back.
    wait_ms: AtomicU32,
    coded: AtomicU32,
    back: AtomicU32,
    /// Page index and the store's clock (ms) when it was stored raw, oldest first. A page
    /// read back, rewritten or discarded since stays listed: the pass skips it (its state no
    /// longer has `LATER`).
    queue: Mutex<Queue>,
    born: Instant,
}

struct Queue {
    pages: VecDeque<(u64, u32)>,
    /// Pages listed since the last compaction.
    pushed: usize,
}

impl Queue {
    /// Drops the listed pages that no longer owe their try (read back, rewritten or discarded
    /// since) from a full queue; at most once per quarter of it pushed since the last time, so
    /// that a queue of pages that really wait costs no scan per page.
    fn compact_if_full(&mut self, still_owes: impl Fn(u64) -> bool) {
        if self.pages.len() >= MAX_LATER && self.pushed >= MAX_LATER / 4 {
            self.pages.retain(|&(index, _)| still_owes(index));
            self.pushed = 0;
        }
    }
}

impl Later {
    pub(crate) fn new() -> Later {
        Later {
            outcomes: AtomicU32::new(0),
            seen: AtomicU32::new(0),
            wait_ms: AtomicU32::new(LATER_AFTER_MS),
            coded: AtomicU32::new(0),
            back: AtomicU32::new(0),
            queue: Mutex::new(Queue {
                pages: VecDeque::new(),
                pushed: 0,
            }),
            born: Instant::now(),
        }
    }

    fn now_ms(&self) -> u32 {
        self.born.elapsed().as_millis().min(u128::from(u32::MAX)) as u32
    }

    /// Whether the gate lets the page lz4 just refused be stored raw now and tried later.
    fn gate_open(&self) -> bool {
        let seen = self.seen.fetch_add(1, Ordering::Relaxed);
        defer(self.outcomes.load(Ordering::Relaxed), seen)
    }

    pub(crate) fn record(&self, won: bool) {
        let _ = self
            .outcomes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |h| {
                Some(h << 1 | u32::from(won))
            });
        if won {
            self.coded.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// A page the entropy coder shrank was read back.
    pub(crate) fn came_back(&self) {
        self.back.fetch_add(1, Ordering::Relaxed);
    }

    /// The wait now.
    pub(crate) fn wait_ms(&self) -> u32 {
        self.wait_ms.load(Ordering::Relaxed)
    }

    /// Reconsiders the wait once a window of tries won is complete (on the pass's thread).
    fn adjust_wait(&self) {
        let coded = self.coded.load(Ordering::Relaxed);
        if coded < WAIT_WINDOW {
            return;
        }
        let back = self.back.swap(0, Ordering::Relaxed);
        self.coded.fetch_sub(coded, Ordering::Relaxed);
        let wait = next_wait(self.wait_ms(), coded, back);
        self.wait_ms.store(wait, Ordering::Relaxed);
    }

    /// Lists page `index`, just stored raw with `LATER`, if the queue has room (after dropping
    /// the listed pages that no longer owe their try, `still_owes` false).
    pub(crate) fn push(&self, index: u64, still_owes: impl Fn(u64) -> bool) {
        let now = self.now_ms();
        let mut q = self.queue.lock();
        if q.pages.capacity() == 0 {
            // Once, up front: no reallocation while pages are evicted.
            q.pages.reserve_exact(MAX_LATER);
        }
        q.compact_if_full(still_owes);
        if q.pages.len() < MAX_LATER {
            q.pages.push_back((index, now));
            q.pushed += 1;
        }
    }

    /// The oldest listed page that has waited long enough: the wait now, or no more than
    /// [`URGENT_AFTER_MS`] while the tries are `urgent`.
    fn pop_due(&self, urgent: bool) -> Option<u64> {
        let wait = if urgent {
            self.wait_ms().min(URGENT_AFTER_MS)
        } else {
            self.wait_ms()
        };
        let now = self.now_ms();
        let mut q = self.queue.lock();
        match q.pages.front() {
            Some(&(index, at)) if now.saturating_sub(at) >= wait => {
                q.pages.pop_front();
                Some(index)
            }
            _ => None,
        }
    }

    pub(crate) fn waiting(&self) -> usize {
        self.queue.lock().pages.len()
    }
}

/// Whether a pool of `used` bytes holding pages of `stored` bytes saves less than
/// 1/[`URGENT_SAVING_DIV`] of them.
pub(crate) fn saves_little(used: u64, stored: u64) -> bool {
    used.saturating_mul(URGENT_SAVING_DIV) > stored.saturating_mul(URGENT_SAVING_DIV - 1)
}

impl crate::Inner {
    /// Whether the page the policy's codec just refused is stored raw now and tried later: the
    /// gate is open and the queue has room. A full queue first drops the pages read back,
    /// rewritten or discarded since they were listed (a program that thrashes lists the same
    /// pages again and again, and the pass runs only between its faults). Past the shortest
    /// wait, a page refused while the queue is still full is stored raw too, without a try
    /// (`push` leaves it out): coded pages have been coming back.
    pub(crate) fn defer_entropy(&self) -> bool {
        let Some(later) = self.later.as_ref() else {
            return false;
        };
        if !later.gate_open() || self.saves_little() {
            return false;
        }
        if later.wait_ms() > LATER_AFTER_MS {
            return true;
        }
        let mut q = later.queue.lock();
        q.compact_if_full(|index| self.still_owes_entropy(index));
        q.pages.len() < MAX_LATER
    }

    /// Whether the pool saves under 1/[`URGENT_SAVING_DIV`] of the bytes it holds: then no
    /// try is left for later (see [`StoreCore::entropy_urgent`]).
    pub(crate) fn saves_little(&self) -> bool {
        let stored = self.counters.stored.load(Ordering::Relaxed) * PAGE_SIZE as u64;
        saves_little(self.pool.mem_used(), stored)
    }

    /// Whether page `index` is still stored raw owing its entropy try.
    pub(crate) fn still_owes_entropy(&self, index: u64) -> bool {
        self.slots[index as usize].peek().has(LATER)
    }
}

impl StoreCore {
    /// Trains the dictionary of a learning round whose pages are all taken, on the calling
    /// thread (~0.1 s of zstd's trainer and three encodings of 512 KiB): true if it did. For a
    /// store made with `dictionary_thread` off, whose owner calls it on a thread of its own,
    /// holding no lock the program's faults may wait on.
    pub fn learn_pass(&self) -> bool {
        match self.inner.learner.as_ref() {
            Some(l) => l.learn_pass(&self.inner.dicts, self.policy.write_codec()),
            None => false,
        }
    }

    /// Makes the entropy coder's try for up to `max` pages stored raw with the try left for
    /// later (see the module docs) that have stayed stored [`LATER_AFTER_MS`]; returns how many
    /// it tried. A page the coder shrinks is stored compressed; the others stay raw, for good.
    /// A store without `entropy_later` has nothing to do. Meant for idle CPU: each try is a
    /// zstd-1 compression of one page under that page's lock.
    pub fn entropy_pass(&self, max: usize) -> usize {
        let Some(later) = self.inner.later.as_ref() else {
            return 0;
        };
        later.adjust_wait();
        // (An empty queue has nothing due either way: no need for `entropy_urgent`'s look.)
        let urgent = self.inner.saves_little();
        let mut tried = 0;
        while tried < max {
            let Some(index) = later.pop_due(urgent) else {
                break;
            };
            if self.try_entropy(later, index) {
                tried += 1;
            }
        }
        tried
    }

    /// Whether the tries left for later are urgent: pages wait for theirs while the pool saves
    /// under an eighth of the bytes it holds. Deferring the try spares the CPU for pages that
    /// come back soon; but when most of what the pool holds is raw pages waiting (a program
    /// that writes values lz4 cannot shrink, such as redis-benchmark's random printable ones,
    /// while its reads bring the coded ones back, which stretches the wait to
    /// [`WAIT_MAX_MS`]), the program's DRAM under zmem is what it would be without it, and the
    /// tries are worth their CPU at once. While urgent, a page waits no longer than
    /// [`URGENT_AFTER_MS`], and the region's evictor makes tries between its batches too.
    pub fn entropy_urgent(&self) -> bool {
        let Some(later) = self.inner.later.as_ref() else {
            return false;
        };
        self.inner.saves_little() && later.waiting() > 0
    }

    /// Pages stored raw whose try is still to come (some may have been read back since).
    pub fn entropy_waiting(&self) -> usize {
        self.inner.later.as_ref().map_or(0, Later::waiting)
    }

    /// The deferred try for page `index`, if it still owes one.
    fn try_entropy(&self, later: &Later, index: u64) -> bool {
        let inner = &self.inner;
        let slot = &inner.slots[index as usize];
        if !slot.peek().has(LATER) {
            return false;
        }
        let (st, aux) = slot.lock();
        if st.kind() != OBJECT || !st.has(LATER) {
            slot.unlock_keep(st, 0);
            return false;
        }
        inner.counters.entropy_tries.fetch_add(1, Ordering::Relaxed);
        let smaller = self.smaller_encoding(index, st, aux, ENTROPY_CODEC);
        later.record(smaller.is_some());
        // A full pool keeps the raw object (and the page owes nothing more either).
        let better =
            smaller.and_then(|(obj, enc)| inner.alloc(&obj).ok().map(|h| (h, obj.len(), enc)));
        match better {
            Some((handle, len, enc)) => {
                inner.counters.entropy_wins.fetch_add(1, Ordering::Relaxed);
                self.install_smaller(index, st, aux, handle, len, enc);
            }
            // Raw it stays; it owes nothing more.
            None => slot.unlock_keep(st.with_flag(HUGE, true), LATER),
        }
        true
    }
}
