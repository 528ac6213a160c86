//! `RegionConfig::trace_pages`, a diagnostic: each page keeps its last [`HISTORY`] changes of
//! state (which line of zmem made it, on which thread, when), and when the program dies of
//! SIGSEGV the pages its registers point into (and their neighbours) are printed with their
//! histories, whether they are mapped and how much of them is zero, and the journal of rare
//! eviction outcomes ([`Note`], kept with or without tracing). It answers
//! "how did this page lose its content" for a crash that happens once in ten runs (perl at
//! `--resident 4M`, DESIGN-NOTES "Next steps for regions"), where a debugger cannot be
//! attached in time and a core dump shows evicted pages as missing.
//!
//! The history is written where the state is (`StateTable::set`, under the space lock), so
//! it costs a `gettid` and two stores per change; the table is allocated zeroed, so only the
//! pages ever touched cost memory (128 bytes each).

use std::panic::Location;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Once, OnceLock, Weak};
use std::time::Instant;

use zmem_os::sync::Mutex;

use crate::config::PAGE;
use crate::manager::Shared;
use crate::state::PageState;

/// Changes of state kept per page.
pub(crate) const HISTORY: usize = 8;

/// One page's history: HISTORY entries of (caller's `Location`, packed word), a ring.
type Ring = [u64; 2 * HISTORY];

pub(crate) struct History {
    rings: Vec<Ring>,
    /// Per page: how many changes were recorded (the ring's next entry is this mod HISTORY).
    counts: Vec<u32>,
}

/// The time base of histories and the journal: the first region made.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

fn now_us() -> u64 {
    epoch().elapsed().as_micros() as u64
}

impl History {
    pub fn new(pages: usize) -> History {
        History {
            rings: vec![[0; 2 * HISTORY]; pages],
            counts: vec![0; pages],
        }
    }

    /// Page `page` went from `from` to `to` at the caller's `at`.
    pub fn record(
        &mut self,
        page: usize,
        from: PageState,
        to: PageState,
        at: &'static Location<'static>,
    ) {
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u64 & 0xff_ffff;
        let us = now_us() & 0xffff_ffff;
        let word = from as u64 | (to as u64) << 4 | tid << 8 | us << 32;
        let n = self.counts[page] as usize;
        let ring = &mut self.rings[page];
        ring[2 * (n % HISTORY)] = at as *const Location<'static> as u64;
        ring[2 * (n % HISTORY) + 1] = word;
        self.counts[page] = self.counts[page].wrapping_add(1);
    }

    /// Page `page`'s recorded changes, oldest first: one line each.
    pub fn describe(&self, page: usize) -> Vec<String> {
        let n = self.counts[page] as usize;
        let ring = &self.rings[page];
        (n.saturating_sub(HISTORY)..n)
            .map(|k| {
                let at = ring[2 * (k % HISTORY)] as *const Location<'static>;
                let word = ring[2 * (k % HISTORY) + 1];
                // SAFETY: written by `record` from a `&'static Location`.
                let at = unsafe { &*at };
                format!(
                    "{:>12.6} s  tid {:<7} {:?} -> {:?}  at {}:{}",
                    (word >> 32) as f64 / 1e6,
                    (word >> 8) & 0xff_ffff,
                    PageState::from_u8((word & 0xf) as u8),
                    PageState::from_u8(((word >> 4) & 0xf) as u8),
                    at.file(),
                    at.line()
                )
            })
            .collect()
    }

    pub fn changes(&self, page: usize) -> u32 {
        self.counts[page]
    }
}

/// Rare outcomes of the eviction path, kept whether or not pages are traced (a few stores each,
/// on paths a correct run takes seldom or never) and printed in the crash report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u64)]
pub(crate) enum Note {
    /// A run of victims moved in part: `a` pages asked, `b` reported moved (the errno in its
    /// high 32 bits), `page` the first.
    RunCut = 1,
    /// A victim's staging slot was not empty (`UFFDIO_MOVE`: EEXIST): `a` the slot's address,
    /// `b` 1 if the victim was still mapped (the slot held something else: cleared) or 0 (the
    /// page had moved there already: kept).
    SlotTaken = 2,
    /// Nothing was mapped at a victim (`UFFDIO_MOVE`: ENOENT).
    NothingMapped = 3,
}

const JOURNAL: usize = 64;
static JOURNAL_AT: AtomicUsize = AtomicUsize::new(0);
static JOURNAL_ENTRIES: [[AtomicU64; 4]; JOURNAL] =
    [const { [const { AtomicU64::new(0) }; 4] }; JOURNAL];

/// Records a rare outcome (see [`Note`]) in the journal the crash report prints.
pub(crate) fn note(what: Note, page: usize, a: u64, b: u64) {
    let k = JOURNAL_AT.fetch_add(1, Relaxed) % JOURNAL;
    let e = &JOURNAL_ENTRIES[k];
    e[0].store(now_us() << 8 | what as u64, Relaxed);
    e[1].store(page as u64, Relaxed);
    e[2].store(a, Relaxed);
    e[3].store(b, Relaxed);
}

/// The journal, oldest first: one line per entry.
pub(crate) fn journal() -> Vec<String> {
    let n = JOURNAL_AT.load(Relaxed);
    (n.saturating_sub(JOURNAL)..n)
        .map(|k| {
            let e = &JOURNAL_ENTRIES[k % JOURNAL];
            let (head, page) = (e[0].load(Relaxed), e[1].load(Relaxed));
            let (a, b) = (e[2].load(Relaxed), e[3].load(Relaxed));
            let what = match head & 0xff {
                1 => format!(
                    "run of {a} from page {page} cut after {} pages (errno {})",
                    b & 0xffff_ffff,
                    b >> 32
                ),
                2 if b == 1 => format!("page {page}: slot {a:#x} held something: cleared"),
                2 => format!("page {page}: already in its slot {a:#x} (moved, not reported)"),
                3 => format!("page {page}: nothing mapped to move"),
                _ => format!("entry {head:#x} {page} {a} {b}"),
            };
            format!("{:>12.6} s  {what}", (head >> 8) as f64 / 1e6)
        })
        .collect()
}

/// Regions whose pages are traced, for the crash report.
static TRACED: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());
static INSTALL: Once = Once::new();
/// The SIGSEGV disposition found when the report's handler was installed: put back once the
/// report is written, so that the access, run again, reaches it (a program's own handler, or
/// the default action).
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Lists region `shared` for the crash report and installs the SIGSEGV handler (once).
pub(crate) fn watch(shared: &Arc<Shared>) {
    let mut t = TRACED.lock();
    t.retain(|w| w.strong_count() > 0);
    t.push(Arc::downgrade(shared));
    drop(t);
    INSTALL.call_once(|| {
        // SAFETY: zeroed sigactions are valid "no handler, empty mask" values; ours takes
        // SA_SIGINFO, and the kernel fills `old`.
        unsafe {
            let mut new: libc::sigaction = std::mem::zeroed();
            let mut old: libc::sigaction = std::mem::zeroed();
            new.sa_sigaction = on_sigsegv as *const () as usize;
            new.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            if libc::sigaction(libc::SIGSEGV, &new, &mut old) != 0 {
                tracing::warn!("trace_pages: no crash report (sigaction(SIGSEGV) failed)");
                return;
            }
            let _ = PREVIOUS.set(old);
        }
    });
}

/// The registers of a signal's context (x86_64), by name.
fn registers(ctx: *mut libc::c_void) -> Vec<(&'static str, usize)> {
    const NAMES: [(&str, libc::c_int); 17] = [
        ("r8", libc::REG_R8),
        ("r9", libc::REG_R9),
        ("r10", libc::REG_R10),
        ("r11", libc::REG_R11),
        ("r12", libc::REG_R12),
        ("r13", libc::REG_R13),
        ("r14", libc::REG_R14),
        ("r15", libc::REG_R15),
        ("rdi", libc::REG_RDI),
        ("rsi", libc::REG_RSI),
        ("rbp", libc::REG_RBP),
        ("rbx", libc::REG_RBX),
        ("rdx", libc::REG_RDX),
        ("rax", libc::REG_RAX),
        ("rcx", libc::REG_RCX),
        ("rsp", libc::REG_RSP),
        ("rip", libc::REG_RIP),
    ];
    if ctx.is_null() {
        return Vec::new();
    }
    // SAFETY: the kernel passes a valid ucontext_t to an SA_SIGINFO handler.
    let uc = unsafe { &*(ctx as *const libc::ucontext_t) };
    NAMES
        .iter()
        .map(|&(n, r)| (n, uc.uc_mcontext.gregs[r as usize] as usize))
        .collect()
}

extern "C" fn on_sigsegv(_sig: libc::c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a valid siginfo to an SA_SIGINFO handler.
    let addr = unsafe { (*info).si_addr() as usize };
    let regs = registers(ctx);
    let report =
        std::panic::catch_unwind(|| zmem_os::thread::as_zmem(|| crash_report(addr, &regs)))
            .unwrap_or_else(|_| "zmem: trace_pages: the crash report failed\n".into());
    // SAFETY: writing our own buffer to stderr; then the disposition found at installation
    // (a valid sigaction the kernel gave us, or the default one).
    unsafe {
        libc::write(2, report.as_ptr().cast(), report.len());
        let dfl: libc::sigaction = std::mem::zeroed();
        libc::sigaction(
            libc::SIGSEGV,
            PREVIOUS.get().unwrap_or(&dfl),
            std::ptr::null_mut(),
        );
    }
    // Returning runs the access again, now under that disposition.
}

/// The report for a SIGSEGV at `addr` with registers `regs`: every region page the address or
/// a register points into, with its state and history.
fn crash_report(addr: usize, regs: &[(&str, usize)]) -> String {
    let mut out = format!("zmem: SIGSEGV at {addr:#x} (trace_pages report)\n");
    let regions: Vec<Arc<Shared>> = match TRACED.try_lock() {
        Some(t) => t.iter().filter_map(Weak::upgrade).collect(),
        None => return out + "zmem: the list of traced regions is locked: no report\n",
    };
    let mut seen = Vec::new();
    // Each page pointed at, and the pages beside it (a run moved or mapped with it).
    let pointers: Vec<(String, usize)> = std::iter::once(("si_addr", addr))
        .chain(regs.iter().copied())
        .flat_map(|(name, v)| {
            [
                (name.to_string(), v),
                (format!("{name} - 1 page"), v.wrapping_sub(PAGE)),
                (format!("{name} + 1 page"), v.wrapping_add(PAGE)),
            ]
        })
        .collect();
    for (name, value) in pointers {
        for r in &regions {
            let s = &r.root;
            let Some(page) = s.index_of(value) else {
                continue;
            };
            if seen.contains(&(s.base, page)) {
                if !name.ends_with(" page") {
                    out += &format!("  {name} = {value:#x}: page {page} (above)\n");
                }
                continue;
            }
            seen.push((s.base, page));
            // The crashing thread may hold the lock (it crashed inside zmem): said, not waited.
            let Some(inner) = s.inner.try_lock_for(std::time::Duration::from_millis(200)) else {
                out += &format!(
                    "  {name} = {value:#x}: page {page} (the region's lock is held: no state)\n"
                );
                continue;
            };
            let st = inner.state.get(page);
            // Whether the page is mapped, asked of the kernel (a read of a missing page would
            // fault, and its fault needs the lock held here); if it is, how much of it is zero.
            let mapped = crate::guard::page_mapped(s.page_addr(page)) == Some(true);
            let content = if mapped {
                // SAFETY: a mapped page of the region, read only.
                let bytes =
                    unsafe { std::slice::from_raw_parts(s.page_addr(page) as *const u8, PAGE) };
                let nonzero = bytes.iter().filter(|&&b| b != 0).count();
                format!(", mapped, {nonzero} of its bytes not zero")
            } else {
                ", not mapped".to_string()
            };
            out += &format!(
                "  {name} = {value:#x}: page {page} at {:#x}, now {st:?}{content}\n",
                s.page_addr(page),
            );
            match inner.state.history() {
                Some(h) => {
                    out += &format!("    {} changes; the last ones:\n", h.changes(page));
                    for line in h.describe(page) {
                        out += &format!("    {line}\n");
                    }
                }
                None => out += "    no history (not the creator's space)\n",
            }
        }
    }
    out += "  rare outcomes of eviction, oldest first:\n";
    for line in journal() {
        out += &format!("    {line}\n");
    }
    let c = regions.first().map(|r| &r.counters);
    if let Some(c) = c {
        use std::sync::atomic::Ordering::Relaxed;
        out += &format!(
            "  checks: on_resident {} staged_present {} moved_nothing {} moved_unreported {} \
             mismatches {}\n",
            c.on_resident.load(Relaxed),
            c.staged_present.load(Relaxed),
            c.moved_nothing.load(Relaxed),
            c.moved_unreported.load(Relaxed),
            c.mismatches.load(Relaxed)
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::PageState::*;

    #[test]
    fn a_page_keeps_its_last_changes_in_order_with_their_callers() {
        let mut h = History::new(4);
        let here = Location::caller();
        h.record(2, Absent, Faulting, here);
        h.record(2, Faulting, Resident, here);
        let lines = h.describe(2);
        assert_eq!(lines.len(), 2);
        assert!(lines[0].contains("Absent -> Faulting"), "{lines:?}");
        assert!(lines[1].contains("Faulting -> Resident"), "{lines:?}");
        assert!(lines[1].contains(&format!("trace.rs:{}", here.line())));
        assert!(h.describe(1).is_empty());
        // The ring keeps the last HISTORY changes.
        for _ in 0..HISTORY {
            h.record(2, Resident, Staged, here);
        }
        let lines = h.describe(2);
        assert_eq!(lines.len(), HISTORY);
        assert!(lines.iter().all(|l| l.contains("Resident -> Staged")));
        assert_eq!(h.changes(2), HISTORY as u32 + 2);
    }

    #[test]
    fn the_journal_says_what_each_rare_outcome_was() {
        note(Note::RunCut, 4242, 16, 3 | (libc::EAGAIN as u64) << 32);
        note(Note::SlotTaken, 4243, 0x1000, 0);
        note(Note::NothingMapped, 4244, 0, 0);
        let j = journal().join("\n");
        assert!(
            j.contains("run of 16 from page 4242 cut after 3 pages (errno 11)"),
            "{j}"
        );
        assert!(j.contains("page 4243: already in its slot 0x1000"), "{j}");
        assert!(j.contains("page 4244: nothing mapped to move"), "{j}");
    }
}
