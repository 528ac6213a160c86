//! zstd dictionaries learnt from the store's own pages, and learnt again as they drift (issue 12
//! item 3). A store whose policy writes pages with zstd and that was given no dictionary runs
//! *rounds*: it keeps a copy of some pages written (1 MiB of samples, then 512 KiB of later
//! check pages), trains a dictionary from the samples (`Learner::start_training` says on which
//! thread), and writes with it from then on if it shrinks the check pages by `MIN_GAIN` against
//! both no dictionary and the one in use. So a store whose first pages were a program's start-up
//! (python's, whose dictionary is refused on its later pages) learns from later ones, and one
//! whose data changed replaces a dictionary that no longer fits. Rounds come after
//! `FIRST_GAP` pages written, then twice as many each time (up to `MAX_GAP`): a few per GiB at
//! first, one per 4 GiB later.
//!
//! Every object names its dictionary in its header, and a replaced dictionary is kept (its
//! compression tables freed) while the store lives, so every page decodes; `GENERATIONS` bounds
//! them (ids `FIRST_ID`..), after which the last one stays. Why the held-out check: on text of
//! a few words in random order a trained dictionary made zstd-1 pages 37% larger, and one
//! checked on its own samples only made node's and a JVM's heaps 3-4% larger (`zmem bench
//! heaps --policies balanced`). A round that does not pay, and training that fails, leave the
//! store as it was, with the reason in the log.
//!
//! Calgary at `balanced` (`zmem bench compare --policies balanced`): see docs/DESIGN-NOTES.md,
//! "Session 51" and "Session 52".

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use zmem_codec::{Dictionary, PAGE_SIZE};
use zmem_os::sync::Mutex;

/// Pages a round learns from (1 MiB): every `SAMPLE_EVERY`th of its first pages written.
const SAMPLE_PAGES: u64 = 256;
const SAMPLE_EVERY: u64 = 4;
/// Pages a new dictionary is tried on before it is used: every `CHECK_EVERY`th from `CHECK_FROM`
/// pages into the round, so pages written later, as a heap's later pages differ from its first.
const CHECK_PAGES: u64 = 128;
const CHECK_EVERY: u64 = 16;
const CHECK_FROM: u64 = 2 * SAMPLE_PAGES * SAMPLE_EVERY;
/// Pages a round looks at.
const ROUND_OFFERS: u64 = CHECK_FROM + CHECK_PAGES * CHECK_EVERY;
/// Pages written between the end of the first round and the start of the second (32 MiB);
/// doubled after each round, up to `MAX_GAP` (4 GiB).
const FIRST_GAP: u64 = 8192;
const MAX_GAP: u64 = 1 << 20;
/// The dictionary's size. zstd's trainer: 16 KiB from 1 MiB of samples.
const DICT_BYTES: usize = 16 * 1024;
/// Dictionaries a store may learn in its life, with the ids `FIRST_ID..FIRST_ID + GENERATIONS`
/// (a configured one has its own id, and then none is learnt).
const GENERATIONS: usize = 8;
const FIRST_ID: u8 = 1;
/// A new dictionary is used only if the check pages come out at most this fraction of their size
/// without it and with the one in use.
const MIN_GAIN: f64 = 0.97;
/// The dictionary in use is watched on every `WATCH_EVERY`th page written (coded with it and
/// without: two more encodings per 128 pages, ~1.5% of the writes' CPU); over `WATCH_PAGES`
/// of them (32 MiB written) it must save `KEEP_GAIN`, else it is retired: new pages are written
/// without it, and a round is due soon. Found on a python heap of five Silesia files loaded one
/// after the other: a dictionary learnt (and checked) on one file made the next ones' pages 4%
/// larger than without.
const WATCH_EVERY: u64 = 128;
const WATCH_PAGES: u32 = 64;
const KEEP_GAIN: f64 = 0.99;

/// The dictionaries a store's objects may name: the configured one, or those learnt. Readers
/// never wait: each learnt one is set once, then named as the one to write with.
pub(crate) struct Dicts {
    configured: Option<Arc<Dictionary>>,
    learnt: [OnceLock<Arc<Dictionary>>; GENERATIONS],
    /// The generation new objects are made with, plus one (0: none yet, or it was retired).
    current: AtomicUsize,
    /// Dictionaries retired for saving too little on the pages written lately.
    retired: AtomicUsize,
}

impl Dicts {
    pub(crate) fn new(configured: Option<Arc<Dictionary>>) -> Dicts {
        Dicts {
            configured,
            learnt: Default::default(),
            current: AtomicUsize::new(0),
            retired: AtomicUsize::new(0),
        }
    }

    /// The generation of the learnt dictionary new objects are made with, if any.
    fn current_learnt(&self) -> Option<(usize, &Arc<Dictionary>)> {
        match self.current.load(Ordering::Acquire) {
            0 => None,
            g => Some((g - 1, self.learnt[g - 1].get()?)),
        }
    }

    /// Dictionaries retired so far.
    pub(crate) fn retired(&self) -> usize {
        self.retired.load(Ordering::Relaxed)
    }

    /// New objects are made without generation `g` (still the current one) from now on.
    fn retire(&self, g: usize) {
        if self
            .current
            .compare_exchange(g + 1, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            self.retired.fetch_add(1, Ordering::Relaxed);
            if let Some(d) = self.learnt[g].get() {
                d.drop_encoders();
            }
        }
    }

    /// The dictionary new objects are made with, if any.
    pub(crate) fn current(&self) -> Option<&Arc<Dictionary>> {
        if let Some(d) = &self.configured {
            return Some(d);
        }
        match self.current.load(Ordering::Acquire) {
            0 => None,
            g => self.learnt[g - 1].get(),
        }
    }

    /// The dictionary with `id`, if this store has it.
    pub(crate) fn by_id(&self, id: u8) -> Option<&Arc<Dictionary>> {
        if let Some(d) = &self.configured {
            return (d.id() == id).then_some(d);
        }
        let g = id.checked_sub(FIRST_ID)? as usize;
        self.learnt.get(g)?.get()
    }

    /// The dictionary the object `obj` was made with (None for one made without, or one this
    /// store does not have: decoding it then fails with the id it needs).
    pub(crate) fn of_object(&self, obj: &[u8]) -> Option<&Dictionary> {
        let id = zmem_codec::peek_header(obj).ok()?.dict_id?;
        self.by_id(id).map(|d| &**d)
    }

    /// Dictionaries learnt so far.
    pub(crate) fn learnt(&self) -> usize {
        self.learnt.iter().filter(|d| d.get().is_some()).count()
    }

    /// The generation the next learnt dictionary takes, if one is left.
    fn next_generation(&self) -> Option<usize> {
        self.learnt.iter().position(|d| d.get().is_none())
    }

    /// Makes `dict` (of generation `g`) the one new objects are made with.
    fn install(&self, g: usize, dict: Dictionary) {
        if self.learnt[g].set(Arc::new(dict)).is_err() {
            return;
        }
        let old = self.current();
        self.current.store(g + 1, Ordering::Release);
        if let Some(old) = old {
            old.drop_encoders();
        }
    }
}

/// What a learner keeps behind its lock.
#[derive(Default)]
struct Taken {
    /// This round's samples and check pages, each page after page.
    samples: Vec<u8>,
    checks: Vec<u8>,
    /// One page's encoding, for the watch.
    scratch: Vec<u8>,
    /// Of the current dictionary's generation `watched`: bytes of the pages watched coded
    /// with it and without, and how many.
    watched: Option<usize>,
    with: u64,
    without: u64,
    seen: u32,
}

/// The sampling and training state of a store that learns its dictionaries.
pub(crate) struct Learner {
    /// Pages offered so far.
    offered: AtomicU64,
    /// The offer at which the current round starts; `u64::MAX` while none is due (a round's
    /// pages wait for training, or every generation is used).
    round: AtomicU64,
    /// Rounds finished (trained, or given up).
    rounds: AtomicU32,
    /// This round's pages and the watch of the dictionary in use.
    pages: Mutex<Taken>,
    /// The round's pages are taken and wait for a write outside a SIGBUS handler to train.
    ready: AtomicBool,
    /// Training may start where a round completes (`StoreConfig::dictionary_thread`); else
    /// only in `learn_pass`.
    own_thread: bool,
}

impl Learner {
    pub(crate) fn new(own_thread: bool) -> Learner {
        Learner {
            offered: AtomicU64::new(0),
            round: AtomicU64::new(0),
            rounds: AtomicU32::new(0),
            pages: Mutex::new(Taken::default()),
            ready: AtomicBool::new(false),
            own_thread,
        }
    }

    /// Rounds finished.
    pub(crate) fn rounds(&self) -> u64 {
        u64::from(self.rounds.load(Ordering::Relaxed))
    }

    /// Offers a page being written with `codec` (not same-filled). When a round's last check
    /// page is taken, starts its training.
    pub(crate) fn offer(
        self: &Arc<Self>,
        page: &[u8],
        dicts: &Arc<Dicts>,
        codec: zmem_codec::Codec,
    ) {
        if page.len() != PAGE_SIZE {
            return;
        }
        if self.ready.load(Ordering::Relaxed) {
            self.start_training(dicts, codec);
            return;
        }
        let n = self.offered.fetch_add(1, Ordering::Relaxed);
        if n % WATCH_EVERY == 0 {
            self.watch(page, dicts, codec, n);
        }
        let Some(k) = n.checked_sub(self.round.load(Ordering::Relaxed)) else {
            return;
        };
        let sample = k < SAMPLE_PAGES * SAMPLE_EVERY && k % SAMPLE_EVERY == 0;
        let check = (CHECK_FROM..ROUND_OFFERS).contains(&k) && k % CHECK_EVERY == 0;
        if !sample && !check && k < ROUND_OFFERS {
            return;
        }
        // Never waits: a writer that finds another one here skips its page (and a fork that
        // copies the lock held leaves the child without a dictionary, not stuck).
        let Some(mut g) = self.pages.try_lock() else {
            return;
        };
        let Taken {
            samples, checks, ..
        } = &mut *g;
        if k >= ROUND_OFFERS {
            // Pages skipped for the lock left the round short: train on what there is if it
            // is most of it, else start again from here.
            if self.round.load(Ordering::Relaxed) == u64::MAX {
                return;
            }
            if samples.len() * 2 >= SAMPLE_PAGES as usize * PAGE_SIZE
                && checks.len() * 2 >= CHECK_PAGES as usize * PAGE_SIZE
            {
                self.round.store(u64::MAX, Ordering::Relaxed);
                self.ready.store(true, Ordering::Relaxed);
            } else {
                samples.clear();
                checks.clear();
                self.round.store(n + 1, Ordering::Relaxed);
            }
            return;
        }
        if sample {
            // One allocation for all of them (this may run inside the signal route's handler).
            samples
                .reserve_exact((SAMPLE_PAGES as usize * PAGE_SIZE).saturating_sub(samples.len()));
            samples.extend_from_slice(page);
            return;
        }
        checks.reserve_exact((CHECK_PAGES as usize * PAGE_SIZE).saturating_sub(checks.len()));
        checks.extend_from_slice(page);
        if checks.len() < (CHECK_PAGES as usize) * PAGE_SIZE {
            return;
        }
        drop(g);
        self.round.store(u64::MAX, Ordering::Relaxed);
        self.ready.store(true, Ordering::Relaxed);
        self.start_training(dicts, codec);
    }

    /// Trains when a round's pages are taken, where it is safe to. With `own_thread` off (a
    /// region's store) never here: the owner calls [`learn_pass`](Self::learn_pass) from a
    /// thread of its own that holds no lock (a region's evictor): there the page that completes
    /// a round may be written by the program's thread settling an eviction with the region's
    /// locks held, and a new thread's start-up touches the program's heap (python hung so under
    /// `zmem run`: the preload's `pthread_create` faulted on a page only that settle could
    /// serve; and before, a new thread died of SIGBUS in glibc's `__ctype_init`, reading locale
    /// data the program allocated in its heap). With it on (a program using the store
    /// directly): never inside a SIGBUS handler (the signal route writes pages there: the next
    /// page written elsewhere trains instead), on a zmem thread inline, elsewhere on a thread
    /// of its own.
    fn start_training(self: &Arc<Self>, dicts: &Arc<Dicts>, codec: zmem_codec::Codec) {
        if !self.own_thread || zmem_os::thread::sigbus_blocked() {
            return;
        }
        let Some((samples, checks)) = self.take_round() else {
            return;
        };
        if zmem_os::thread::is_zmem_thread() {
            self.finish_round(&samples, &checks, dicts, codec);
            return;
        }
        let (me, all) = (Arc::clone(self), Arc::clone(dicts));
        let learn = move || me.finish_round(&samples, &checks, &all, codec);
        if let Err(e) = zmem_os::thread::spawn("zmem-dict".into(), learn) {
            tracing::warn!("no dictionary learnt: cannot start its trainer: {e}");
            self.next_round(dicts);
        }
    }

    /// Trains on the calling thread if a round's pages wait (~0.1 s): true if it did. Never
    /// inside a SIGBUS handler.
    pub(crate) fn learn_pass(&self, dicts: &Dicts, codec: zmem_codec::Codec) -> bool {
        if zmem_os::thread::sigbus_blocked() || !self.ready.load(Ordering::Relaxed) {
            return false;
        }
        let Some((samples, checks)) = self.take_round() else {
            return false;
        };
        self.finish_round(&samples, &checks, dicts, codec);
        true
    }

    /// The pages of a round ready to train on, taken by one caller.
    fn take_round(&self) -> Option<(Vec<u8>, Vec<u8>)> {
        let mut g = self.pages.try_lock()?;
        if !self.ready.swap(false, Ordering::Relaxed) {
            return None;
        }
        Some((
            std::mem::take(&mut g.samples),
            std::mem::take(&mut g.checks),
        ))
    }

    /// Codes `page` (offer `n`) with the learnt dictionary in use and without, and retires the
    /// dictionary when over the last `WATCH_PAGES` such pages it saved less than `KEEP_GAIN`.
    fn watch(&self, page: &[u8], dicts: &Dicts, codec: zmem_codec::Codec, n: u64) {
        let Some((gen, dict)) = dicts.current_learnt() else {
            return;
        };
        let Some(mut g) = self.pages.try_lock() else {
            return;
        };
        if g.watched != Some(gen) {
            (g.watched, g.with, g.without, g.seen) = (Some(gen), 0, 0, 0);
        }
        let need = zmem_codec::max_encoded_len(PAGE_SIZE);
        if g.scratch.len() < need {
            // Once (this may run inside the signal route's handler).
            g.scratch.resize(need, 0);
        }
        let mut len = |d: Option<&Dictionary>| {
            zmem_codec::encode(codec, d, page, &mut g.scratch, 1.0).map(|e| e.len as u64)
        };
        let (Ok(with), Ok(without)) = (len(Some(dict)), len(None)) else {
            return;
        };
        g.with += with;
        g.without += without;
        g.seen += 1;
        if g.seen < WATCH_PAGES {
            return;
        }
        let (with, without) = (g.with, g.without);
        (g.with, g.without, g.seen) = (0, 0, 0);
        drop(g);
        if with as f64 <= KEEP_GAIN * without as f64 {
            return;
        }
        dicts.retire(gen);
        tracing::info!(
            "zstd dictionary {} retired: the last {WATCH_PAGES} pages watched came to {with} \
             bytes with it, {without} without",
            dict.id()
        );
        // The next round soon, unless one is under way or none is left.
        let due = n + FIRST_GAP;
        let _ = self
            .round
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |r| {
                (r != u64::MAX && r > due).then_some(due)
            });
    }

    fn finish_round(&self, samples: &[u8], checks: &[u8], dicts: &Dicts, codec: zmem_codec::Codec) {
        self.learn(samples, checks, dicts, codec);
        self.next_round(dicts);
    }

    /// Trains a dictionary of the next generation and installs it if it pays.
    fn learn(&self, samples: &[u8], checks: &[u8], dicts: &Dicts, codec: zmem_codec::Codec) {
        let Some(g) = dicts.next_generation() else {
            return;
        };
        let id = FIRST_ID + g as u8;
        let current = dicts.current().map(|d| &**d);
        match train(samples, checks, codec, id, current) {
            Ok(d) => {
                tracing::info!(
                    "learnt zstd dictionary {id} ({} bytes) from 1 MiB of pages written",
                    d.bytes().len()
                );
                dicts.install(g, d);
            }
            Err(e) => tracing::info!("no dictionary {id} learnt: {e}"),
        }
    }

    /// Schedules the next round, if a generation is left for it.
    fn next_round(&self, dicts: &Dicts) {
        let done = self.rounds.fetch_add(1, Ordering::Relaxed);
        if dicts.next_generation().is_none() {
            return;
        }
        let gap = FIRST_GAP.saturating_mul(1u64 << done.min(20)).min(MAX_GAP);
        let start = self.offered.load(Ordering::Relaxed) + gap;
        self.round.store(start, Ordering::Relaxed);
    }
}

/// Trains a dictionary with `id` from `samples` (pages side by side) and keeps it if `codec`
/// shrinks the `checks` pages by `MIN_GAIN` more with it than without and than with `current`.
pub(crate) fn train(
    samples: &[u8],
    checks: &[u8],
    codec: zmem_codec::Codec,
    id: u8,
    current: Option<&Dictionary>,
) -> Result<Dictionary, String> {
    let pages: Vec<&[u8]> = samples.chunks(PAGE_SIZE).collect();
    let bytes = zmem_codec::train_dictionary(&pages, DICT_BYTES).map_err(|e| e.to_string())?;
    let dict = Dictionary::new(id, bytes).map_err(|e| e.to_string())?;
    let checks: Vec<&[u8]> = checks.chunks(PAGE_SIZE).collect();
    let with = encoded_bytes(&checks, codec, Some(&dict))?;
    let without = encoded_bytes(&checks, codec, None)?;
    let (best, against) = match current {
        Some(c) => {
            let old = encoded_bytes(&checks, codec, Some(c))?;
            if old < without {
                (old, format!("with dictionary {}", c.id()))
            } else {
                (without, "without".to_string())
            }
        }
        None => (without, "without".to_string()),
    };
    if with as f64 > MIN_GAIN * best as f64 {
        return Err(format!(
            "it does not pay: {with} bytes of later pages with it, {best} {against}"
        ));
    }
    Ok(dict)
}

/// What `pages` come to encoded one by one.
fn encoded_bytes(
    pages: &[&[u8]],
    codec: zmem_codec::Codec,
    dict: Option<&Dictionary>,
) -> Result<usize, String> {
    let mut out = vec![0u8; zmem_codec::max_encoded_len(PAGE_SIZE)];
    let mut total = 0;
    for p in pages {
        total += zmem_codec::encode(codec, dict, p, &mut out, 1.0)
            .map_err(|e| e.to_string())?
            .len;
    }
    Ok(total)
}
