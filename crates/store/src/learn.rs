//! A zstd dictionary learnt from the store's own pages (issue 12 item 3). A store whose policy
//! writes pages with zstd and that was given no dictionary keeps a copy of some of the first
//! pages written (1 MiB) and of some written later (512 KiB), trains a dictionary from the
//! first (`Learner::start_training` says on which thread), and from then on compresses with
//! it if it pays on the later ones. Pages written before stay as they were: every object
//! names its dictionary in its header, so both kinds decode. One
//! dictionary per store, never replaced (a replaced one would have to live on as long as one
//! page uses it). The dictionary is kept only if it shrinks the later pages by `MIN_GAIN` at
//! the store's codec: on text of a few words in random order a trained dictionary made zstd-1
//! pages 37% larger, and one checked on its own samples only made node's and a JVM's heaps 3-4%
//! larger (`zmem bench heaps --policies balanced`). One that does not pay, and training that
//! fails, leave the store on the plain codec, with the reason in the log.
//!
//! Calgary at `balanced` (`zmem bench compare --policies balanced`): see docs/DESIGN-NOTES.md,
//! "Session 51"; on real heaps a dictionary trained on a sample gained 0.99-1.06x.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use zmem_codec::{Dictionary, PAGE_SIZE};

/// Pages the dictionary learns from (1 MiB): every `SAMPLE_EVERY`th of the first pages written.
const SAMPLE_PAGES: u64 = 256;
const SAMPLE_EVERY: u64 = 4;
/// Pages it is tried on before it is used: every `CHECK_EVERY`th from `CHECK_FROM` pages
/// written on, so pages written later, as a heap's later pages differ from its first.
const CHECK_PAGES: u64 = 128;
const CHECK_EVERY: u64 = 16;
const CHECK_FROM: u64 = 2 * SAMPLE_PAGES * SAMPLE_EVERY;
/// Offers past this are not looked at.
const OFFERS: u64 = CHECK_FROM + CHECK_PAGES * CHECK_EVERY;
/// The dictionary's size. zstd's trainer: 16 KiB from 1 MiB of samples.
const DICT_BYTES: usize = 16 * 1024;
/// The id a learnt dictionary's objects carry (a configured one has its own).
pub(crate) const LEARNT_DICT_ID: u8 = 1;
/// A dictionary is used only if the check pages come out at most this fraction of their size
/// without it.
const MIN_GAIN: f64 = 0.97;

/// The store's dictionary: given at creation, or learnt later and then set once.
pub(crate) type DictCell = Arc<OnceLock<Arc<Dictionary>>>;

/// The sampling and training state of a store that learns its dictionary.
pub(crate) struct Learner {
    /// Pages offered so far; past `OFFERS`, never looked at again beyond one load.
    offered: AtomicU64,
    /// (samples, check pages), each page after page.
    pages: Mutex<(Vec<u8>, Vec<u8>)>,
    /// The pages are all taken and wait for a write outside a SIGBUS handler to train.
    ready: AtomicBool,
}

impl Learner {
    pub(crate) fn new() -> Learner {
        Learner {
            offered: AtomicU64::new(0),
            pages: Mutex::new((Vec::new(), Vec::new())),
            ready: AtomicBool::new(false),
        }
    }

    /// Offers a page being written with `codec` (not same-filled). When the last check page
    /// is taken, starts the training.
    pub(crate) fn offer(&self, page: &[u8], dict: &DictCell, codec: zmem_codec::Codec) {
        if self.offered.load(Relaxed) >= OFFERS || page.len() != PAGE_SIZE {
            if self.ready.load(Relaxed) {
                self.start_training(dict, codec);
            }
            return;
        }
        let n = self.offered.fetch_add(1, Relaxed);
        let sample = n < SAMPLE_PAGES * SAMPLE_EVERY && n % SAMPLE_EVERY == 0;
        let check = (CHECK_FROM..OFFERS).contains(&n) && n % CHECK_EVERY == 0;
        if !sample && !check {
            return;
        }
        // Never waits: a writer that finds another one here skips its page (and a fork that
        // copies the lock held leaves the child without a dictionary, not stuck).
        let Some(mut g) = self.pages.try_lock() else {
            return;
        };
        let (samples, checks) = &mut *g;
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
        self.offered.store(OFFERS, Relaxed);
        self.ready.store(true, Relaxed);
        self.start_training(dict, codec);
    }

    /// Trains, where it is safe to: never inside a SIGBUS handler (the signal route serves a
    /// fault on the program's thread, and writes pages there: no thread may be made there, and
    /// the next page written elsewhere trains instead); on a zmem thread (the evictor, a fault
    /// handler) inline, once, ~0.1 s; elsewhere (a program using the store directly) on a
    /// thread of its own. Not a new thread under `zmem run`: a thread's start in glibc reads the
    /// locale data, which the program allocated in its heap; evicted, the new thread died of
    /// SIGBUS in `__ctype_init` (python under `balanced`).
    fn start_training(&self, dict: &DictCell, codec: zmem_codec::Codec) {
        if zmem_os::thread::sigbus_blocked() {
            return;
        }
        let Some(mut g) = self.pages.try_lock() else {
            return;
        };
        if !self.ready.swap(false, Relaxed) {
            return;
        }
        let (samples, checks) = (std::mem::take(&mut g.0), std::mem::take(&mut g.1));
        drop(g);
        let cell = Arc::clone(dict);
        let learn = move || match train(&samples, &checks, codec) {
            Ok(d) => {
                let _ = cell.set(Arc::new(d));
            }
            Err(e) => tracing::info!("no dictionary learnt: {e}"),
        };
        if zmem_os::thread::is_zmem_thread() {
            learn();
        } else if let Err(e) = zmem_os::thread::spawn("zmem-dict".into(), learn) {
            tracing::warn!("no dictionary learnt: cannot start its trainer: {e}");
        }
    }
}

/// Trains a dictionary from `samples` (pages side by side) and keeps it if `codec` shrinks the
/// `checks` pages by `MIN_GAIN` more with it than without.
pub(crate) fn train(
    samples: &[u8],
    checks: &[u8],
    codec: zmem_codec::Codec,
) -> Result<Dictionary, String> {
    let pages: Vec<&[u8]> = samples.chunks(PAGE_SIZE).collect();
    let bytes = zmem_codec::train_dictionary(&pages, DICT_BYTES).map_err(|e| e.to_string())?;
    let dict = Dictionary::new(LEARNT_DICT_ID, bytes).map_err(|e| e.to_string())?;
    let checks: Vec<&[u8]> = checks.chunks(PAGE_SIZE).collect();
    let with = encoded_bytes(&checks, codec, Some(&dict))?;
    let without = encoded_bytes(&checks, codec, None)?;
    if with as f64 > MIN_GAIN * without as f64 {
        return Err(format!(
            "it does not pay: {with} bytes of later pages with it, {without} without"
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
