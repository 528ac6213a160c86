//! Cold-page policy: which resident pages leave DRAM first.
//!
//! Signal: faults only. A resident page read a thousand times says nothing (there are no
//! accessed bits), and the written-page hint from `PAGEMAP_SCAN` may never come. So
//! [`Eviction::Clock`] learns from refaults. Its clock ticks once per refault. When a page
//! refaults, the ticks since its eviction are one sample of how long it stays away, which is
//! exponential in its access rate. Per page it keeps up to 4 samples (then an exponential
//! average) and estimates refaults per budget B as `(k - 0.99) / (k * mean_gap / B + 0.25)`,
//! with gaps capped at 4 B. That is the posterior mean under a zipf-like prior: most pages
//! are cold, so one short gap is mostly luck, and two or more are evidence.
//! Structure: the rate (capped at 1) gives a deadline `now + 48 B rate`, and the earliest
//! deadline goes first. A wheel of 1024 slots of intrusive lists, plus one list of expired
//! pages, makes every operation O(1), in 12 bytes per page.
//! Aging: a page without new evidence falls behind the pages refaulting now, so a moved hot
//! set takes over. A written hint restarts a page's protection (at least 2 B).
//! Never-refaulted pages have no protection and leave first, so a fill or a scan does not
//! flush the hot set. Where the deadlines misjudge (a producer's pages, read soon after by a
//! consumer, see `Recency`), Clock tries recency for a while and keeps it if it pays. [`Eviction::Fifo`] (umap's policy) evicts in insertion order. For both
//! policies, an aborted eviction ([`Tracker::insert_quiet`]) goes back to the head of the queue.
//!
//! Measured (the simulator in the tests): N pages, B = N/4, a sequential fill, then zipf(0.99)
//! over a random permutation; faults per access over the second half. N = 262144, 4M
//! accesses: FIFO 0.189, Clock 0.130 (-31%). A perfect LFU that sees every hit gets 0.123
//! (-35%). With 8M accesses Clock gets 0.125 (-34%). N = 65536: FIFO 0.209, Clock 0.136 (-35%).
//! Hot set moved halfway: last quarter 0.149 (+10% over stationary; FIFO 0.210).

/// Which pages leave DRAM first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Eviction {
    /// zmem's policy (fault-history CLOCK).
    #[default]
    Clock,
    /// First in, first out (umap's policy), the baseline.
    Fifo,
}

/// End of a list / no page. Inside the tracker a page is known by its id, `page + 1`, so
/// that NIL is 0 and an all-zero tracker (`prev`, `next`, `meta`, `lists`) is an empty one: a
/// zeroed allocation that large comes untouched from the kernel, so a tracker for a huge region
/// costs DRAM only for the pages that are ever used. Index 0 of the per-page vectors is NIL's
/// and never written.
const NIL: u32 = 0;

// Per-page state word (`meta`).
const RESIDENT: u32 = 1 << 31;
/// The page was evicted since it was last forgotten: `prev` holds its eviction tick.
const EVICTED: u32 = 1 << 30;
const K_SHIFT: u32 = 27;
const K_MASK: u32 = 0b111 << K_SHIFT;
const LIST_SHIFT: u32 = 16;
const LIST_MASK: u32 = 0x7ff << LIST_SHIFT;
const GAP_MASK: u32 = 0xffff;

/// Slots of the deadline wheel (list ids 1..=SLOTS; list 0 is the expired list).
const SLOTS: usize = 1024;
const WORDS: usize = SLOTS / 64;
/// The list of pages whose deadline has passed (and, for FIFO, the only list).
const EXPIRED: u32 = 0;
/// The pages placed while in recency mode, in the order they came (see [`Recency`]).
const RECENT: u32 = SLOTS as u32 + 1;

/// Gap samples kept by the estimator: the mean is exact up to this many, then an
/// exponential average with weight 1/K_MAX.
const K_MAX: u32 = 4;
/// Weight of a page's first gap sample: one refault is weak evidence (most pages of a
/// skewed workload are cold, so one short gap is more often luck than heat).
const FIRST_WEIGHT: f32 = 0.01;
/// Prior exposure, in units of the budget: bounds the rate estimate of a page whose gaps
/// were all tiny.
const PRIOR_EXPOSURE: f32 = 0.25;
/// Gaps are capped at this many budgets (a very cold page is simply cold; an old, long gap
/// must not outweigh the recent evidence of a page that turned hot).
const GAP_CAP: f32 = 4.0;
/// Protection of a page, in ticks, per unit of estimated rate (refaults per budget), times
/// the budget. The rate is capped at 1, so no page is protected longer than this many
/// budgets of ticks.
const TTL_SCALE: f32 = 48.0;
/// Protection (in budgets) of a resident page known to have been written since the last
/// scan.
const WRITTEN_TTL: f32 = 2.0;

/// A refault this soon after its eviction (in ticks, times the budget) is a quick one.
const QUICK: f32 = 0.5;
/// Refaults per decision.
const RECENCY_WINDOW: u32 = 4096;

/// Whether Clock places new pages by recency alone: on a list of their own ([`RECENT`]),
/// which leaves after the wheel, in the order the pages came (FIFO). Clock's deadlines come
/// from each page's past gaps; a page written by a producer and read
/// soon after by its consumer alternates a long gap and a short one, so its deadline after
/// the write (a long gap just sampled) is the early one, and Clock evicts it just before the
/// read while keeping the copies its reads faulted in (`zstd -T2` at `--resident 8M`: twice
/// FIFO's faults, half of them on pages still staged). A quick refault (back within
/// [`QUICK`] budgets of ticks) is the symptom; see [`RECENCY_ON`].
#[derive(Default)]
struct Recency {
    on: bool,
    refaults: u32,
    quick: u32,
    /// Windows that ended with recency on.
    windows_on: u64,
    /// The quick share of the last window under Clock.
    clock_share: f32,
    /// Windows to wait before recency is tried again, and the next such wait (doubled each
    /// time a try does not pay, up to [`RECENCY_BACKOFF_MAX`]).
    wait: u32,
    backoff: u32,
    /// Windows since recency went on.
    tried: u32,
}

/// The longest wait, in windows, between two tries of recency that did not pay.
const RECENCY_BACKOFF_MAX: u32 = 64;

/// Recency is tried when more than the first share of a window's refaults under Clock are
/// quick, and kept while at most the second share are under recency, and less than half of
/// Clock's: a try that does not pay waits out a backoff (sort's quick share under Clock is
/// high too, and FIFO took 9% more faults there). Simulated shares (tests below): zipf(0.99)
/// under Clock 0.20, under FIFO 0.32; a producer-consumer ring under Clock 0.47, under FIFO
/// 0.14.
const RECENCY_ON: f32 = 0.4;
const RECENCY_OFF: f32 = 0.25;

impl Recency {
    /// Counts a refault (`quick` or not); true when this ends a try of recency.
    fn refault(&mut self, quick: bool) -> bool {
        let was_on = self.on;
        self.refaults += 1;
        self.quick += u32::from(quick);
        if self.refaults >= RECENCY_WINDOW {
            let share = self.quick as f32 / self.refaults as f32;
            if self.on {
                // Kept while FIFO's own evictions rarely come back soon: it keeps what is
                // needed where Clock did not. A try's first window is the change-over, not
                // judged.
                self.tried += 1;
                if self.tried < 2 {
                    // Judged at the next window.
                } else if share <= RECENCY_OFF && share < 0.5 * self.clock_share {
                    self.backoff = 1;
                } else {
                    self.on = false;
                    self.wait = self.backoff.max(1);
                    self.backoff = (self.wait * 2).min(RECENCY_BACKOFF_MAX);
                }
            } else {
                self.clock_share = share;
                if self.wait > 0 {
                    self.wait -= 1;
                } else if share > RECENCY_ON {
                    // Clock gives up pages still in use: try recency.
                    self.on = true;
                    self.tried = 0;
                }
            }
            self.windows_on += u64::from(self.on);
            self.refaults = 0;
            self.quick = 0;
        }
        was_on && !self.on
    }
}

/// Which resident pages to evict, from fault history alone.
pub struct Tracker {
    kind: Eviction,
    pages: u32,
    resident: usize,
    /// List links (page ids) of resident pages; for an evicted page `prev` holds its eviction
    /// tick. Indexed by page id (`page + 1`), like `meta`; all three are 0 for a page never
    /// used or forgotten.
    prev: Vec<u32>,
    next: Vec<u32>,
    meta: Vec<u32>,
    /// (head, tail) page ids of the expired list (0) and of the wheel's slots (1..=SLOTS).
    lists: Vec<(u32, u32)>,
    /// Non-empty wheel slots (bit i: list id i + 1).
    bits: [u64; WORDS],
    /// The clock: refaults so far.
    tick: u64,
    /// Absolute wheel slot of `tick` (`tick / width`).
    cur: u64,
    /// Ticks per wheel slot.
    width: u64,
    /// The budget (resident pages when eviction was last asked for).
    scale: f32,
    /// Scratch for re-slotting the wheel when the budget changes (no allocation then).
    scratch: Vec<(u32, u32)>,
    /// Recency mode (see [`Recency`]).
    recency: Recency,
}

impl Tracker {
    /// A tracker for `pages` pages, none resident.
    pub fn new(pages: usize, kind: Eviction) -> Tracker {
        let pages = pages.min(u32::MAX as usize) as u32;
        let n = pages as usize;
        Tracker {
            kind,
            pages,
            resident: 0,
            // All zero: allocated lazily by the kernel, nothing touched here.
            prev: vec![NIL; n + 1],
            next: vec![NIL; n + 1],
            meta: vec![0; n + 1],
            lists: vec![(NIL, NIL); SLOTS + 2],
            bits: [0; WORDS],
            tick: 0,
            cur: 0,
            width: 1,
            // No budget is known before the first pick, which sets it. Until then the wheel
            // stays at its smallest (one page, slots one tick wide): a new page's minimum
            // protection is two slots, and slots sized for the whole region (94 GiB of heap:
            // 24M pages) kept every page touched before the first eviction to the end of the run.
            scale: 1.0,
            scratch: vec![(NIL, NIL); SLOTS],
            recency: Recency::default(),
        }
    }

    /// The policy.
    pub fn kind(&self) -> Eviction {
        self.kind
    }

    /// Resident pages.
    pub fn resident(&self) -> usize {
        self.resident
    }

    /// Windows of refaults that ended in recency mode (see [`RegionStats::recency_windows`]).
    ///
    /// [`RegionStats::recency_windows`]: crate::RegionStats::recency_windows
    pub fn recency_windows(&self) -> u64 {
        self.recency.windows_on
    }

    /// Whether `page` is resident.
    pub fn is_resident(&self, page: u32) -> bool {
        page < self.pages && self.meta[page as usize + 1] & RESIDENT != 0
    }

    /// `page` became resident through a fault (an access). On a resident page: an access
    /// hint, like [`written`](Self::written).
    pub fn insert(&mut self, page: u32) {
        if page >= self.pages {
            return;
        }
        let id = page + 1;
        let i = id as usize;
        let m = self.meta[i];
        if m & RESIDENT != 0 {
            self.written(page);
            return;
        }
        self.resident += 1;
        if self.kind == Eviction::Fifo {
            self.meta[i] = RESIDENT;
            self.push_tail(EXPIRED, id);
            return;
        }
        let mut k = (m & K_MASK) >> K_SHIFT;
        let mut gap = gap_decode(m & GAP_MASK);
        if m & EVICTED != 0 {
            // A refault: one more sample of the time this page stays away once evicted.
            let d = (self.tick as u32).wrapping_sub(self.prev[i]) as f32;
            if self.recency.refault(d < QUICK * self.scale) {
                // Back to Clock: the pages placed meanwhile have no deadline; they leave
                // first, in the order they came, as never-refaulted pages would.
                self.splice(RECENT, EXPIRED);
            }
            let d = d.min(GAP_CAP * self.scale);
            k = (k + 1).min(K_MAX);
            gap += (d - gap) / k as f32;
            self.advance();
        }
        self.meta[i] = RESIDENT | (k << K_SHIFT) | gap_encode(gap);
        if self.recency.on {
            self.push_tail(RECENT, id);
            return;
        }
        // A page just faulted in is not yet accessed: the faulting thread runs only after the
        // handler returns, and the handler evicts in between. Two wheel slots of protection
        // keep it from being evicted before the access it was faulted in for.
        let ttl = self.ttl(k, gap).max(2.0 * self.width as f32);
        self.place(id, ttl);
    }

    /// `page` is resident again because its eviction was aborted: no access, no history;
    /// it goes back to the head of the queue it was picked from (next to be picked).
    pub fn insert_quiet(&mut self, page: u32) {
        if page >= self.pages || self.meta[page as usize + 1] & RESIDENT != 0 {
            return;
        }
        let id = page + 1;
        self.resident += 1;
        self.meta[id as usize] |= RESIDENT;
        self.push_head(EXPIRED, id);
    }

    /// The program dropped `page`: not resident, history forgotten.
    pub fn remove(&mut self, page: u32) {
        if page >= self.pages {
            return;
        }
        let id = page + 1;
        let i = id as usize;
        if self.meta[i] == 0 {
            // Nothing to forget, and no write: removing a range of pages never used (a pin)
            // leaves their memory untouched.
            debug_assert!(self.prev[i] == NIL && self.next[i] == NIL);
            return;
        }
        if self.meta[i] & RESIDENT != 0 {
            self.unlink(id);
            self.resident -= 1;
        }
        self.meta[i] = 0;
        self.prev[i] = NIL;
        self.next[i] = NIL;
    }

    /// Hint: resident `page` was written since the last scan. Its protection restarts, at
    /// least [`WRITTEN_TTL`] budgets.
    pub fn written(&mut self, page: u32) {
        if self.kind == Eviction::Fifo || !self.is_resident(page) {
            return;
        }
        let id = page + 1;
        let m = self.meta[id as usize];
        self.unlink(id);
        if self.recency.on {
            self.push_tail(RECENT, id);
            return;
        }
        let ttl = self
            .ttl((m & K_MASK) >> K_SHIFT, gap_decode(m & GAP_MASK))
            .max(WRITTEN_TTL * self.scale);
        self.place(id, ttl);
    }

    /// Choose up to `n` resident pages to evict; they leave the resident set (with their
    /// eviction recorded) and are pushed to `out`.
    pub fn pick(&mut self, n: usize, out: &mut Vec<u32>) {
        if n == 0 || self.resident == 0 {
            return;
        }
        if self.kind == Eviction::Clock {
            self.set_scale(self.resident);
        }
        for _ in 0..n {
            // The pages placed in recency mode go last: while it lasts, the pages Clock
            // protected before leave first, in deadline order, then these, in the order they
            // came (FIFO).
            let list = if self.lists[EXPIRED as usize].0 != NIL {
                EXPIRED
            } else if let Some(l) = self.first_slot() {
                l
            } else if self.lists[RECENT as usize].0 != NIL {
                RECENT
            } else {
                break;
            };
            let id = self.lists[list as usize].0;
            self.take(id);
            out.push(id - 1);
        }
    }

    /// Takes resident `page` for eviction if nothing protects it: under [`Eviction::Clock`], a
    /// page never refaulted since it was last forgotten (no gap sample), which the policy gives
    /// up first anyway. Eviction takes such pages beside its victims so that runs of adjacent
    /// pages leave in one move. FIFO keeps its plain insertion order: never.
    pub fn take_unprotected(&mut self, page: u32) -> bool {
        if self.kind != Eviction::Clock || !self.is_resident(page) {
            return false;
        }
        let id = page + 1;
        if self.meta[id as usize] & K_MASK != 0 {
            return false;
        }
        self.take(id);
        true
    }

    /// Resident page `id` leaves: unlinked, its eviction recorded.
    fn take(&mut self, id: u32) {
        self.unlink(id);
        self.resident -= 1;
        let i = id as usize;
        self.meta[i] = (self.meta[i] & !(RESIDENT | LIST_MASK)) | EVICTED;
        self.prev[i] = self.tick as u32;
        self.next[i] = NIL;
    }

    /// Protection in ticks for a page with `k` gap samples of mean `gap`.
    fn ttl(&self, k: u32, gap: f32) -> f32 {
        if k == 0 {
            return 0.0;
        }
        let b = self.scale;
        let evidence = (k - 1) as f32 + FIRST_WEIGHT;
        let rate = evidence / (k as f32 * gap / b + PRIOR_EXPOSURE);
        TTL_SCALE * b * rate.min(1.0)
    }

    /// Link resident page `id` into the wheel by its deadline `tick + ttl`.
    fn place(&mut self, id: u32, ttl: f32) {
        let slot = (self.tick + ttl as u64) / self.width;
        if slot <= self.cur {
            self.push_tail(EXPIRED, id);
        } else {
            let slot = slot.min(self.cur + SLOTS as u64 - 1);
            self.push_tail(slot_list(slot), id);
        }
    }

    /// One more refault: the clock moves; a slot whose time has come joins the expired list.
    fn advance(&mut self) {
        self.tick += 1;
        let now = self.tick / self.width;
        while self.cur < now {
            self.cur += 1;
            let l = slot_list(self.cur);
            self.splice(l, EXPIRED);
        }
    }

    /// Budget `b`: slot width so that the wheel spans the longest protection. Re-slots the
    /// wheel (O(SLOTS), no per-page work) when the width would change by 2x or more.
    fn set_scale(&mut self, b: usize) {
        self.scale = b.max(1) as f32;
        let horizon = (TTL_SCALE as f64 * b.max(1) as f64) as u64;
        let want = horizon.div_ceil(SLOTS as u64 - 2).max(1);
        if want < self.width * 2 && want * 2 > self.width {
            return;
        }
        let old_width = self.width;
        let old_cur = self.cur;
        for s in 0..SLOTS {
            self.scratch[s] = self.lists[s + 1];
            self.lists[s + 1] = (NIL, NIL);
        }
        self.bits = [0; WORDS];
        self.width = want;
        self.cur = self.tick / want;
        for a in old_cur + 1..old_cur + SLOTS as u64 {
            let (h, t) = self.scratch[(a % SLOTS as u64) as usize];
            if h == NIL {
                continue;
            }
            let slot = a * old_width / want;
            let to = if slot <= self.cur {
                EXPIRED
            } else {
                slot_list(slot.min(self.cur + SLOTS as u64 - 1))
            };
            self.append(to, h, t);
        }
    }

    /// The first non-empty wheel slot after `cur`, in deadline order.
    fn first_slot(&self) -> Option<u32> {
        let start = ((self.cur + 1) % SLOTS as u64) as usize;
        for step in 0..=WORDS {
            let w = (start / 64 + step) % WORDS;
            let mut bits = self.bits[w];
            if step == 0 {
                bits &= !0u64 << (start % 64);
            } else if step == WORDS {
                bits &= !(!0u64 << (start % 64));
            }
            if bits != 0 {
                return Some((w * 64 + bits.trailing_zeros() as usize) as u32 + 1);
            }
        }
        None
    }

    fn set_list(&mut self, id: u32, list: u32) {
        let m = &mut self.meta[id as usize];
        *m = (*m & !LIST_MASK) | (list << LIST_SHIFT);
    }

    fn mark(&mut self, list: u32, nonempty: bool) {
        if list != EXPIRED && list != RECENT {
            let b = (list - 1) as usize;
            if nonempty {
                self.bits[b / 64] |= 1 << (b % 64);
            } else {
                self.bits[b / 64] &= !(1 << (b % 64));
            }
        }
    }

    fn push_tail(&mut self, list: u32, id: u32) {
        self.append(list, id, id);
    }

    fn push_head(&mut self, list: u32, id: u32) {
        let (h, t) = self.lists[list as usize];
        self.prev[id as usize] = NIL;
        self.next[id as usize] = h;
        if h == NIL {
            self.lists[list as usize] = (id, id);
        } else {
            self.prev[h as usize] = id;
            self.lists[list as usize] = (id, t);
        }
        self.set_list(id, list);
        self.mark(list, true);
    }

    /// Append the chain `h..=t` (linked through `next`, `prev[h]` ignored) to `list`.
    /// Only the ends of a list carry its id: interior ids may be stale.
    fn append(&mut self, list: u32, h: u32, t: u32) {
        let (lh, lt) = self.lists[list as usize];
        if h == t {
            self.next[h as usize] = NIL;
        }
        if lt == NIL {
            self.prev[h as usize] = NIL;
            self.lists[list as usize] = (h, t);
            self.set_list(h, list);
        } else {
            self.next[lt as usize] = h;
            self.prev[h as usize] = lt;
            self.lists[list as usize] = (lh, t);
        }
        self.set_list(t, list);
        self.mark(list, true);
    }

    /// Move all of `from` to the tail of `to`.
    fn splice(&mut self, from: u32, to: u32) {
        let (h, t) = self.lists[from as usize];
        if h == NIL {
            return;
        }
        self.lists[from as usize] = (NIL, NIL);
        self.mark(from, false);
        self.append(to, h, t);
    }

    fn unlink(&mut self, id: u32) {
        let i = id as usize;
        let (p, q) = (self.prev[i], self.next[i]);
        let list = (self.meta[i] & LIST_MASK) >> LIST_SHIFT;
        if p == NIL {
            self.lists[list as usize].0 = q;
            if q != NIL {
                self.prev[q as usize] = NIL;
                self.set_list(q, list);
            }
        } else {
            self.next[p as usize] = q;
        }
        if q == NIL {
            self.lists[list as usize].1 = p;
            if p != NIL {
                self.set_list(p, list);
            }
        } else {
            self.prev[q as usize] = p;
        }
        if p == NIL && q == NIL {
            self.mark(list, false);
        }
        self.prev[i] = NIL;
        self.next[i] = NIL;
    }
}

/// List id of absolute wheel slot `slot`.
fn slot_list(slot: u64) -> u32 {
    (slot % SLOTS as u64) as u32 + 1
}

/// A mean gap, as the top half of an f32 (bfloat16: 8 bits of precision, plenty here).
fn gap_encode(gap: f32) -> u32 {
    (gap.max(0.0).to_bits().wrapping_add(0x8000) >> 16) & GAP_MASK
}

fn gap_decode(bits: u32) -> f32 {
    f32::from_bits(bits << 16)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::SmallRng;
    use rand::Rng as _;
    use std::collections::HashSet;
    use zmem_workload::{small_rng, Zipf};

    /// The simulator's draws, on zmem-workload's seeded generator.
    struct Rng(SmallRng);

    impl Rng {
        fn new(seed: u64) -> Rng {
            Rng(small_rng(seed))
        }

        fn below(&mut self, n: u64) -> u64 {
            self.0.random_range(0..n)
        }

        fn unit(&mut self) -> f64 {
            self.0.random::<f64>()
        }
    }

    fn permutation(n: usize, rng: &mut Rng) -> Vec<u32> {
        let mut p: Vec<u32> = (0..n as u32).collect();
        for i in (1..n).rev() {
            p.swap(i, rng.below(i as u64 + 1) as usize);
        }
        p
    }

    /// A workload for [`simulate`].
    #[derive(Clone)]
    struct Scenario {
        pages: usize,
        budget: usize,
        /// Zipf accesses after the sequential fill.
        accesses: usize,
        seed: u64,
        /// Pages evicted per pick when the budget is full.
        batch: usize,
        /// A new random permutation of the ranks after half the accesses.
        shift: bool,
        /// Whole sequential passes over the region between the fill and the zipf accesses.
        scans_before: usize,
        /// A whole sequential pass every this many zipf accesses (its faults not counted).
        scan_every: Option<usize>,
        /// (fraction of accesses that write, accesses between two PAGEMAP_SCANs).
        writes: Option<(f64, usize)>,
    }

    impl Scenario {
        fn zipf(pages: usize, accesses: usize) -> Scenario {
            Scenario {
                pages,
                budget: pages / 4,
                accesses,
                seed: 1,
                batch: 1,
                shift: false,
                scans_before: 0,
                scan_every: None,
                writes: None,
            }
        }
    }

    /// Faults per zipf access: over the second half, and over the last quarter.
    #[derive(Debug, Clone, Copy)]
    struct Outcome {
        half: f64,
        last_quarter: f64,
    }

    /// The region as the policy sees it: an access to a page that is not resident faults;
    /// at the budget, the tracker picks `batch` victims first. Checks the tracker against its
    /// own resident set as it goes.
    struct Sim {
        t: Tracker,
        res: Vec<bool>,
        resident: usize,
        budget: usize,
        batch: usize,
        out: Vec<u32>,
    }

    impl Sim {
        fn new(kind: Eviction, pages: usize, budget: usize, batch: usize) -> Sim {
            Sim {
                t: Tracker::new(pages, kind),
                res: vec![false; pages],
                resident: 0,
                budget,
                batch,
                out: Vec::with_capacity(batch),
            }
        }

        /// An access to `page`: whether it faulted.
        fn access(&mut self, page: u32) -> bool {
            let p = page as usize;
            if self.res[p] {
                return false;
            }
            if self.resident >= self.budget {
                self.out.clear();
                self.t.pick(self.batch, &mut self.out);
                assert!(!self.out.is_empty());
                for &v in &self.out {
                    assert!(self.res[v as usize], "picked a page that is not resident");
                    self.res[v as usize] = false;
                    self.resident -= 1;
                }
            }
            self.t.insert(page);
            self.res[p] = true;
            self.resident += 1;
            true
        }
    }

    /// Faults per access of a [`Scenario`], on a [`Sim`].
    fn simulate(kind: Eviction, sc: &Scenario) -> Outcome {
        let n = sc.pages;
        let mut rng = Rng::new(sc.seed);
        let zipf = Zipf::new(n, 0.99);
        let first = permutation(n, &mut rng);
        let second = permutation(n, &mut rng);
        let mut sim = Sim::new(kind, n, sc.budget, sc.batch);
        let mut dirty = vec![false; n];
        let mut dirty_list = Vec::new();
        for p in 0..n as u32 {
            sim.access(p);
        }
        for _ in 0..sc.scans_before {
            for p in 0..n as u32 {
                sim.access(p);
            }
        }
        let (mut half, mut quarter) = (0u64, 0u64);
        let mut dirty_scan = Vec::new();
        for a in 0..sc.accesses {
            if let Some(every) = sc.scan_every {
                if a % every == every - 1 {
                    for p in 0..n as u32 {
                        sim.access(p);
                    }
                }
            }
            let rank = zipf.sample(&mut rng.0);
            let page = if sc.shift && a >= sc.accesses / 2 {
                second[rank]
            } else {
                first[rank]
            };
            if sc.writes.is_some_and(|(f, _)| rng.unit() < f) && !dirty[page as usize] {
                dirty[page as usize] = true;
                dirty_list.push(page);
            }
            if sim.access(page) && a >= sc.accesses / 2 {
                half += 1;
                if a >= sc.accesses * 3 / 4 {
                    quarter += 1;
                }
            }
            if let Some((_, every)) = sc.writes {
                if a % every == every - 1 {
                    // PAGEMAP_SCAN: written and still resident since the last scan.
                    std::mem::swap(&mut dirty_scan, &mut dirty_list);
                    for &p in &dirty_scan {
                        dirty[p as usize] = false;
                        if sim.t.is_resident(p) {
                            sim.t.written(p);
                        }
                    }
                    dirty_scan.clear();
                }
            }
        }
        assert_eq!(sim.t.resident(), sim.res.iter().filter(|&&r| r).count());
        Outcome {
            half: half as f64 / (sc.accesses - sc.accesses / 2) as f64,
            last_quarter: quarter as f64 / (sc.accesses - sc.accesses * 3 / 4) as f64,
        }
    }

    /// Walks every list: links, list ids of the ends, bitmap, resident count.
    fn check(t: &Tracker) {
        let mut seen = 0usize;
        for (l, &(h, tail)) in t.lists.iter().enumerate() {
            if l > 0 && l <= SLOTS {
                let b = l - 1;
                assert_eq!(
                    t.bits[b / 64] >> (b % 64) & 1 == 1,
                    h != NIL,
                    "bitmap of {l}"
                );
            }
            if h == NIL {
                assert_eq!(tail, NIL);
                continue;
            }
            assert_eq!(t.prev[h as usize], NIL);
            assert_eq!((t.meta[h as usize] & LIST_MASK) >> LIST_SHIFT, l as u32);
            assert_eq!((t.meta[tail as usize] & LIST_MASK) >> LIST_SHIFT, l as u32);
            let (mut p, mut last) = (h, NIL);
            while p != NIL {
                assert!(t.meta[p as usize] & RESIDENT != 0);
                assert_eq!(t.prev[p as usize], last);
                seen += 1;
                assert!(seen <= t.resident, "cycle or stray page");
                last = p;
                p = t.next[p as usize];
            }
            assert_eq!(last, tail);
        }
        assert_eq!(seen, t.resident);
    }

    #[test]
    fn model_random_operations() {
        for kind in [Eviction::Clock, Eviction::Fifo] {
            for (pages, seed) in [(1usize, 1u64), (7, 2), (300, 3), (5000, 4)] {
                let mut rng = Rng::new(seed);
                let mut t = Tracker::new(pages, kind);
                assert_eq!(t.kind(), kind);
                let mut model = HashSet::new();
                let mut out = Vec::new();
                let span = pages as u64 + 3; // some pages out of range
                for step in 0..200_000 {
                    let page = rng.below(span) as u32;
                    match rng.below(16) {
                        0..=6 => {
                            t.insert(page);
                            if (page as usize) < pages {
                                model.insert(page);
                            }
                        }
                        7 => {
                            t.insert_quiet(page);
                            if (page as usize) < pages {
                                model.insert(page);
                            }
                        }
                        8 => {
                            t.remove(page);
                            model.remove(&page);
                        }
                        9 => t.written(page),
                        10 => {
                            if t.take_unprotected(page) {
                                assert_eq!(kind, Eviction::Clock);
                                assert!(model.remove(&page), "took {page}: not resident");
                            }
                        }
                        _ => {
                            let n = rng.below(8) as usize;
                            out.clear();
                            out.push(u32::MAX); // pick appends
                            t.pick(n, &mut out);
                            assert_eq!(out[0], u32::MAX);
                            assert_eq!(out.len() - 1, n.min(model.len()));
                            let mut got = HashSet::new();
                            for &v in &out[1..] {
                                assert!(model.remove(&v), "picked {v}: not resident");
                                assert!(got.insert(v), "picked {v} twice");
                            }
                            // An aborted eviction now and then.
                            if let Some(&v) = out[1..].first() {
                                if rng.below(4) == 0 {
                                    t.insert_quiet(v);
                                    model.insert(v);
                                }
                            }
                        }
                    }
                    assert_eq!(t.resident(), model.len());
                    if step % 997 == 0 || pages < 10 {
                        check(&t);
                        for p in 0..span as u32 {
                            assert_eq!(t.is_resident(p), model.contains(&p), "page {p}");
                        }
                    }
                }
                check(&t);
            }
        }
    }

    #[test]
    fn only_never_refaulted_pages_are_taken_unprotected() {
        let mut t = Tracker::new(64, Eviction::Clock);
        for p in 0..8 {
            t.insert(p);
        }
        // All are evicted; page 3 refaults (a gap sample: protected), the others are forgotten
        // and faulted in afresh (no sample).
        let mut out = Vec::new();
        t.pick(8, &mut out);
        assert_eq!(out.len(), 8);
        t.insert(3);
        for p in (0..8).filter(|&p| p != 3) {
            t.remove(p);
            t.insert(p);
        }
        assert!(t.is_resident(3));
        assert!(!t.take_unprotected(3), "a refaulted page has protection");
        assert!(!t.take_unprotected(20), "not resident");
        assert!(!t.take_unprotected(u32::MAX), "out of range");
        let before = t.resident();
        assert!(t.take_unprotected(5));
        assert!(!t.is_resident(5));
        assert_eq!(t.resident(), before - 1);
        assert!(!t.take_unprotected(5), "taken once");
        // Taken pages are never picked again, and the rest still are.
        out.clear();
        t.pick(100, &mut out);
        assert!(!out.contains(&5));
        assert_eq!(out.len(), before - 1);

        let mut f = Tracker::new(8, Eviction::Fifo);
        f.insert(1);
        assert!(!f.take_unprotected(1), "FIFO keeps its order");
    }

    #[test]
    fn ends_and_odd_inputs() {
        let mut t = Tracker::new(0, Eviction::Clock);
        t.insert(0);
        t.insert_quiet(5);
        t.written(u32::MAX);
        t.remove(3);
        let mut out = Vec::new();
        t.pick(10, &mut out);
        assert!(out.is_empty());
        assert_eq!(t.resident(), 0);
        assert!(!t.is_resident(0));

        let mut t = Tracker::new(16, Eviction::Clock);
        for p in 0..16 {
            t.insert(p);
            t.insert(p); // again: a hint, not a duplicate
        }
        assert_eq!(t.resident(), 16);
        t.pick(0, &mut out);
        assert!(out.is_empty());
        t.pick(100, &mut out);
        out.sort_unstable();
        assert_eq!(out, (0..16).collect::<Vec<_>>());
        assert_eq!(t.resident(), 0);
        check(&t);
    }

    #[test]
    fn unused_pages_are_all_zero_bits() {
        // A zeroed allocation is a valid empty tracker (so the kernel can hand it out lazily),
        // and forgetting a page returns its metadata to zero.
        let zero = |t: &Tracker| {
            t.prev.iter().all(|&v| v == 0)
                && t.next.iter().all(|&v| v == 0)
                && t.meta.iter().all(|&v| v == 0)
                && t.lists.iter().all(|&l| l == (0, 0))
        };
        for kind in [Eviction::Clock, Eviction::Fifo] {
            let mut t = Tracker::new(1000, kind);
            assert!(zero(&t));
            let mut rng = Rng::new(5);
            let mut out = Vec::new();
            for _ in 0..20_000 {
                let p = rng.below(1000) as u32;
                t.insert(p);
                if t.resident() > 300 {
                    out.clear();
                    t.pick(16, &mut out);
                    if let Some(&v) = out.first() {
                        t.insert_quiet(v);
                    }
                }
            }
            assert!(!zero(&t));
            for p in 0..1000 {
                t.remove(p);
            }
            assert_eq!(t.resident(), 0);
            assert!(zero(&t), "{kind:?}");
            check(&t);
            // And it works as new.
            for p in 0..10 {
                t.insert(p);
            }
            out.clear();
            t.pick(10, &mut out);
            out.sort_unstable();
            assert_eq!(out, (0..10).collect::<Vec<_>>());
        }
    }

    #[test]
    fn aborted_eviction_is_picked_first_again() {
        for kind in [Eviction::Clock, Eviction::Fifo] {
            let mut t = Tracker::new(100, kind);
            for p in 0..100 {
                t.insert(p);
            }
            let mut out = Vec::new();
            t.pick(3, &mut out);
            let again = out.clone();
            for &v in out.iter().rev() {
                t.insert_quiet(v);
            }
            out.clear();
            t.pick(3, &mut out);
            assert_eq!(out, again, "{kind:?}");
            check(&t);
        }
    }

    #[test]
    fn fifo_is_insertion_order() {
        let mut t = Tracker::new(10, Eviction::Fifo);
        for p in [3, 1, 4, 5, 9, 2, 6] {
            t.insert(p);
        }
        t.remove(4);
        t.insert(1); // already resident: no effect on the order
        t.written(3);
        let mut out = Vec::new();
        t.pick(10, &mut out);
        assert_eq!(out, [3, 1, 5, 9, 2, 6]);
    }

    #[test]
    fn refaulted_pages_outlive_first_touches() {
        // A hot page that refaulted twice quickly survives a stream of new pages.
        let mut t = Tracker::new(1000, Eviction::Clock);
        let mut out = Vec::new();
        for p in 0..10 {
            t.insert(p);
        }
        for _ in 0..2 {
            for _ in 0..10 {
                out.clear();
                t.pick(1, &mut out);
                t.insert(out[0]);
            }
        }
        for p in 10..1000 {
            out.clear();
            t.pick(1, &mut out);
            t.insert(p);
            assert!(
                out[0] >= 10 || p < 20,
                "hot page {} evicted by new page {p}",
                out[0]
            );
        }
        check(&t);
    }

    /// Picks of a fill of `budget` pages, then a stream of `budget` new pages, each after one
    /// pick, on a tracker for `pages` pages.
    fn fill_then_stream(pages: usize, budget: u32) -> Vec<u32> {
        let mut t = Tracker::new(pages, Eviction::Clock);
        let mut out = Vec::new();
        for p in 0..budget {
            t.insert(p);
        }
        for p in budget..2 * budget {
            t.pick(1, &mut out);
            t.insert(p);
        }
        check(&t);
        out
    }

    #[test]
    fn pages_touched_before_the_first_eviction_are_not_protected() {
        // Never-refaulted pages leave in the order they came, whether they came before the
        // first eviction or after, and however large the region. (Before, the minimum
        // protection of a new page was two wheel slots of a wheel sized for the whole region
        // until the first pick: on a 94 GiB heap, every page touched before the first
        // eviction was kept to the end, and GNU sort at a 64M budget took 37-49k major faults
        // where FIFO took 27-33k.)
        let budget = 4096;
        let small = fill_then_stream(2 * budget as usize, budget);
        let large = fill_then_stream(1 << 24, budget);
        assert_eq!(small, large, "the picks depend on the region's size");
        let fifo: Vec<u32> = (0..budget).collect();
        assert_eq!(
            small, fifo,
            "first touches do not leave in the order they came"
        );
    }

    #[test]
    fn budget_changes_keep_order_and_lists() {
        // The wheel is re-slotted when the budget moves by 2x; nothing is lost.
        let mut rng = Rng::new(9);
        let mut t = Tracker::new(20_000, Eviction::Clock);
        let mut out = Vec::new();
        let mut res = vec![false; 20_000];
        for budget in [10_000usize, 200, 5000, 40, 15_000, 1000] {
            for _ in 0..50_000 {
                let p = rng.below(20_000) as usize;
                if res[p] {
                    continue;
                }
                while t.resident() >= budget {
                    out.clear();
                    t.pick(1 + rng.below(64) as usize, &mut out);
                    for &v in &out {
                        assert!(res[v as usize]);
                        res[v as usize] = false;
                    }
                }
                t.insert(p as u32);
                res[p] = true;
            }
            check(&t);
        }
    }

    const TEST_PAGES: usize = 65_536;
    const TEST_ACCESSES: usize = 4_000_000;

    #[test]
    fn clock_beats_fifo_on_zipf() {
        let sc = Scenario::zipf(TEST_PAGES, TEST_ACCESSES);
        let fifo = simulate(Eviction::Fifo, &sc);
        let clock = simulate(Eviction::Clock, &sc);
        let ratio = clock.half / fifo.half;
        eprintln!(
            "zipf(0.99) N={} B=N/4: faults/access FIFO {:.4}, Clock {:.4} ({:+.1}%)",
            sc.pages,
            fifo.half,
            clock.half,
            (ratio - 1.0) * 100.0
        );
        assert!(ratio <= 0.70, "Clock {clock:?} vs FIFO {fifo:?}");
        // Evicting in batches, as the region does, changes little.
        let batched = simulate(
            Eviction::Clock,
            &Scenario {
                batch: 64,
                ..sc.clone()
            },
        );
        eprintln!("  Clock picking 64 at a time: {:.4}", batched.half);
        assert!(batched.half <= clock.half * 1.03, "{batched:?}");
    }

    #[test]
    fn clock_recovers_when_the_hot_set_moves() {
        let sc = Scenario::zipf(TEST_PAGES, TEST_ACCESSES);
        let steady = simulate(Eviction::Clock, &sc);
        let shift = Scenario { shift: true, ..sc };
        let clock = simulate(Eviction::Clock, &shift);
        let fifo = simulate(Eviction::Fifo, &shift);
        eprintln!(
            "hot set moved at half time; last quarter: Clock {:.4} (stationary {:.4}, {:+.1}%), FIFO {:.4}",
            clock.last_quarter,
            steady.last_quarter,
            (clock.last_quarter / steady.last_quarter - 1.0) * 100.0,
            fifo.last_quarter
        );
        assert!(clock.last_quarter < fifo.last_quarter * 0.8);
        assert!(clock.last_quarter <= steady.last_quarter * 1.15);
    }

    #[test]
    fn sequential_scans_are_not_pathological() {
        // Whole passes over the region first, then zipf.
        let sc = Scenario {
            scans_before: 3,
            ..Scenario::zipf(TEST_PAGES, TEST_ACCESSES / 2)
        };
        let fifo = simulate(Eviction::Fifo, &sc);
        let clock = simulate(Eviction::Clock, &sc);
        eprintln!(
            "3 scans then zipf: FIFO {:.4}, Clock {:.4}",
            fifo.half, clock.half
        );
        assert!(clock.half <= fifo.half * 0.8, "{clock:?} vs {fifo:?}");
        // A whole pass every 200k accesses, in the middle of zipf: the hot set survives.
        let sc = Scenario {
            scan_every: Some(200_000),
            ..Scenario::zipf(TEST_PAGES, TEST_ACCESSES / 2)
        };
        let fifo = simulate(Eviction::Fifo, &sc);
        let clock = simulate(Eviction::Clock, &sc);
        eprintln!(
            "zipf with a scan every 200k accesses: FIFO {:.4}, Clock {:.4}",
            fifo.half, clock.half
        );
        assert!(clock.half <= fifo.half * 0.8, "{clock:?} vs {fifo:?}");
    }

    #[test]
    fn written_hints_help_or_do_no_harm() {
        let sc = Scenario::zipf(TEST_PAGES, TEST_ACCESSES / 2);
        let plain = simulate(Eviction::Clock, &sc);
        let hinted = simulate(
            Eviction::Clock,
            &Scenario {
                writes: Some((0.3, 20_000)),
                ..sc.clone()
            },
        );
        let fifo = simulate(Eviction::Fifo, &sc);
        eprintln!(
            "30% writes, a scan every 20k accesses: Clock {:.4} with hints, {:.4} without; FIFO {:.4}",
            hinted.half, plain.half, fifo.half
        );
        assert!(hinted.half <= plain.half * 1.02, "{hinted:?} vs {plain:?}");
    }

    /// The benchmark's scale; `cargo test -p zmem-region --lib policy -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn full_scale_figures() {
        for accesses in [4_000_000, 8_000_000] {
            let sc = Scenario::zipf(262_144, accesses);
            let fifo = simulate(Eviction::Fifo, &sc);
            let clock = simulate(Eviction::Clock, &sc);
            let shift = Scenario {
                shift: true,
                ..sc.clone()
            };
            let fifo_shift = simulate(Eviction::Fifo, &shift);
            let clock_shift = simulate(Eviction::Clock, &shift);
            eprintln!(
                "N=262144 {accesses} accesses: FIFO {:.4}, Clock {:.4} ({:+.1}%); moved hot set, last quarter: \
                 FIFO {:.4}, Clock {:.4} (stationary {:.4})",
                fifo.half,
                clock.half,
                (clock.half / fifo.half - 1.0) * 100.0,
                fifo_shift.last_quarter,
                clock_shift.last_quarter,
                clock.last_quarter
            );
            assert!(clock.half <= fifo.half * 0.70);
        }
    }

    /// Runs `steps` accesses of `next` over `n` pages with `budget` resident; returns the
    /// faults per access over the second half and the tracker.
    fn run(
        kind: Eviction,
        n: usize,
        budget: usize,
        steps: usize,
        mut next: impl FnMut(usize) -> usize,
    ) -> (f64, Tracker) {
        let mut sim = Sim::new(kind, n, budget, 1);
        let mut faults = 0u64;
        for i in 0..steps {
            if sim.access(next(i) as u32) && i >= steps / 2 {
                faults += 1;
            }
        }
        (faults as f64 / (steps - steps / 2) as f64, sim.t)
    }

    /// A producer writes page i of a ring 4x the budget while its consumer reads page
    /// i - lag, beside a small hot set (zstd -T2's job buffers and hash tables).
    fn ring(kind: Eviction, lag: usize) -> (f64, Tracker) {
        let (r, hot, budget) = (8000usize, 300usize, 2048usize);
        run(kind, r + hot, budget, 1_200_000, |i| {
            let step = i / 3;
            match i % 3 {
                0 => step % r,
                1 => (step + r - lag) % r,
                _ => r + step % hot,
            }
        })
    }

    #[test]
    fn clock_turns_to_recency_where_pages_come_back_soon() {
        for lag in [500, 1500] {
            let (fifo, _) = ring(Eviction::Fifo, lag);
            let (clock, t) = ring(Eviction::Clock, lag);
            eprintln!("ring, lag {lag}: faults/access FIFO {fifo:.4}, Clock {clock:.4}");
            // Before recency mode, Clock took 0.67 (lag 500) against FIFO's 0.39.
            assert!(
                clock <= fifo * 1.05,
                "lag {lag}: Clock {clock} vs FIFO {fifo}"
            );
            assert!(t.recency_windows() > 0);
        }
        // Where Clock's deadlines work, recency is off.
        let n = 65536;
        let zipf = Zipf::new(n, 0.99);
        let mut rng = small_rng(1);
        let (_, t) = run(Eviction::Clock, n, n / 4, 2_000_000, |_| {
            zipf.sample(&mut rng)
        });
        // (A few windows of the warm-up, 5 of ~70, go to recency: the first gaps are short.)
        eprintln!("zipf: {} windows in recency", t.recency_windows());
        assert!(!t.recency.on && t.recency_windows() <= 8);
    }
}
