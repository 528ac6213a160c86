use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::*;

/// Anonymous memory for a span, unmapped on drop.
struct Mem {
    base: usize,
    len: usize,
}

impl Mem {
    fn new(len: usize) -> Mem {
        // SAFETY: a fresh private anonymous mapping.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        assert_ne!(p, libc::MAP_FAILED);
        Mem {
            base: p as usize,
            len,
        }
    }

    fn fit(&self, step: usize) -> Fit {
        self.fit_releasing(step, 0)
    }

    fn fit_releasing(&self, step: usize, release_min: usize) -> Fit {
        self.fit_aging(step, release_min, 0)
    }

    fn fit_aging(&self, step: usize, release_min: usize, delay: u64) -> Fit {
        let mut f = Fit::new();
        // SAFETY: the mapping is ours, zero, and outlives the allocator in every test.
        unsafe {
            f.init(self.base, self.base + self.len, step, release_min, delay)
                .unwrap()
        };
        f
    }

    /// Drops pages as the preload library does.
    fn drop_pages(&self, release: Release) {
        for &(at, len) in release.ranges() {
            assert!(at >= self.base && at + len <= self.base + self.len);
            assert_eq!(at % PAGE, 0);
            assert!(len > 0 && len % PAGE == 0);
            // SAFETY: inside our mapping.
            let rc = unsafe { libc::madvise(at as *mut _, len, libc::MADV_DONTNEED) };
            assert_eq!(rc, 0);
        }
    }

    fn resident_pages(&self) -> usize {
        let mut v = vec![0u8; self.len / PAGE];
        // SAFETY: our mapping, one byte per page.
        assert_eq!(
            unsafe { libc::mincore(self.base as *mut _, self.len, v.as_mut_ptr()) },
            0
        );
        v.iter().filter(|&&b| b & 1 != 0).count()
    }
}

impl Drop for Mem {
    fn drop(&mut self) {
        // SAFETY: our mapping.
        unsafe { libc::munmap(self.base as *mut _, self.len) };
    }
}

fn fill(p: usize, len: usize, tag: u8) {
    // SAFETY: a live block of at least len bytes.
    unsafe { std::ptr::write_bytes(p as *mut u8, tag, len) };
}

/// `n` blocks of `size` bytes, each filled with `tag`.
fn alloc_filled(fit: &mut Fit, n: usize, size: usize, tag: u8) -> Vec<usize> {
    (0..n)
        .map(|_| {
            // SAFETY: every test's span is valid (Mem).
            let p = unsafe { fit.alloc(size) }.unwrap();
            fill(p, size, tag);
            p
        })
        .collect()
}

fn holds(p: usize, len: usize, tag: u8) -> bool {
    // SAFETY: a live block of at least len bytes.
    let s = unsafe { std::slice::from_raw_parts(p as *const u8, len) };
    s.iter().all(|&b| b == tag)
}

/// The smallest size list (f, s) holds.
fn class_min(f: usize, s: usize) -> usize {
    if f == 0 {
        s * GRANULE
    } else {
        let lg = f as u32 + SMALL_LG - 1;
        (1 << lg) + (s << (lg - SL_BITS))
    }
}

#[test]
fn classes_hold_what_the_search_promises() {
    for size in (MIN_BLOCK..4 << 20).step_by(GRANULE) {
        let (f, s) = class(size);
        assert!(class_min(f, s) <= size, "{size} in ({f},{s})");
        assert!(class(size + GRANULE) >= (f, s), "classes grow with size");
        let (f2, s2) = class_at_least(size);
        assert!(
            class_min(f2, s2) >= size,
            "every block of the searched list holds {size}"
        );
        // At most one class above the one the size itself is in.
        assert!((f2, s2) >= (f, s));
    }
    assert_eq!(block_size(4368), Some(4384));
    assert_eq!(block_size(4369), Some(4400));
    assert_eq!(block_size(1), Some(MIN_BLOCK));
    assert_eq!(block_size(usize::MAX - 8), None);
    assert_eq!(Fit::usable_for(4368), Some(4368));
}

#[test]
fn blocks_are_exact_fit_and_the_span_grows_by_steps() {
    let mem = Mem::new(64 << 20);
    let mut fit = mem.fit(1 << 20);
    let mut ptrs = Vec::new();
    for i in 0..1000 {
        // SAFETY: the span is valid (Mem).
        let p = unsafe { fit.alloc(4368) }.unwrap();
        assert_eq!(p % GRANULE, 0);
        assert_eq!(unsafe { fit.usable_size(p) }, Ok(4368));
        assert_eq!(unsafe { Fit::usable_size_held(p) }, 4368);
        fill(p, 4368, i as u8);
        ptrs.push(p);
    }
    // Side by side, 4384 bytes apart: what glibc's best fit would take, not mimalloc's 5120.
    for w in ptrs.windows(2) {
        assert_eq!(w[1] - w[0], 4384);
    }
    let st = fit.stats();
    assert_eq!(st.live, 1000 * 4384);
    assert_eq!(st.blocks, 1000);
    assert_eq!(
        st.span,
        5 << 20,
        "five steps of 1 MiB hold 4.2 MiB of blocks"
    );
    assert_eq!(fit.top(), mem.base + st.span);
    for (i, &p) in ptrs.iter().enumerate() {
        assert!(holds(p, 4368, i as u8));
    }
    unsafe { fit.check() }.unwrap();
}

#[test]
fn bad_pointers_get_typed_errors_and_change_nothing() {
    let mem = Mem::new(4 << 20);
    let mut fit = mem.fit(1 << 20);
    // SAFETY: the span is valid (Mem); the bad pointers are refused before any write.
    unsafe {
        let p = fit.alloc(3000).unwrap();
        let q = fit.alloc(3000).unwrap();
        assert_eq!(fit.free(p + 8), Err(FitError::Foreign { addr: p + 8 }));
        assert_eq!(
            fit.free(mem.base + mem.len + 16),
            Err(FitError::Foreign {
                addr: mem.base + mem.len + 16
            })
        );
        assert_eq!(fit.free(8), Err(FitError::Foreign { addr: 8 }));
        assert_eq!(fit.free(p), Ok(Release::NONE));
        assert_eq!(fit.free(p), Err(FitError::DoubleFree { addr: p }));
        assert_eq!(fit.usable_size(p), Err(FitError::DoubleFree { addr: p }));
        // A write past the end of p's neighbour destroys q's header.
        *((q - 8) as *mut usize) = 0x7;
        assert!(matches!(fit.free(q), Err(FitError::DoubleFree { .. })));
        *((q - 8) as *mut usize) = 0x10_0000_0000;
        assert!(matches!(fit.free(q), Err(FitError::Corrupt { .. })));
        *((q - 8) as *mut usize) = (3008 + HEADER) | 2;
        assert!(fit.free(q).is_ok());
        fit.check().unwrap();
    }
    let mut f = Fit::new();
    // SAFETY: refused before anything is written.
    unsafe {
        assert!(f.alloc(10).is_none(), "no span yet");
        assert!(matches!(
            f.init(mem.base + 8, mem.base + mem.len, PAGE, 0, 0),
            Err(FitError::Span { .. })
        ));
        assert!(matches!(
            f.init(mem.base, mem.base + PAGE, PAGE, 0, 0),
            Err(FitError::Span { .. })
        ));
        assert!(matches!(
            f.init(mem.base, mem.base + mem.len, 100, 0, 0),
            Err(FitError::Span { .. })
        ));
        assert!(matches!(
            f.init(0, 1 << 20, PAGE, 0, 0),
            Err(FitError::Span { .. })
        ));
    }
}

#[test]
fn a_full_span_refuses_then_serves_again_after_frees() {
    let mem = Mem::new(1 << 20);
    let mut fit = mem.fit(64 << 10);
    let mut ptrs = Vec::new();
    // SAFETY: the span is valid (Mem).
    unsafe {
        while let Some(p) = fit.alloc(10_000) {
            ptrs.push(p);
        }
        assert!(ptrs.len() >= 100, "{} blocks of 10 KB in 1 MiB", ptrs.len());
        assert!(fit.alloc(10_000).is_none());
        assert!(fit.alloc(2 << 20).is_none(), "larger than the span");
        fit.free(ptrs[3]).unwrap();
        let p = fit.alloc(10_000).unwrap();
        assert_eq!(p, ptrs[3], "the freed block serves the same size again");
        for &q in ptrs.iter() {
            fit.free(q).unwrap();
        }
        let (live, free, bytes) = fit.check().unwrap();
        assert_eq!((live, free), (0, 1), "everything coalesced into one block");
        assert_eq!(bytes + HEADER, fit.stats().span);
    }
}

#[test]
fn resizes_in_place_keep_contents() {
    let mem = Mem::new(4 << 20);
    let mut fit = mem.fit(1 << 20);
    // SAFETY: the span is valid (Mem).
    unsafe {
        let a = fit.alloc(2000).unwrap();
        let b = fit.alloc(2000).unwrap();
        let c = fit.alloc(2000).unwrap();
        fill(a, 2000, 1);
        fill(c, 2000, 3);
        fit.free(b).unwrap();
        // a grows into b's space.
        assert_eq!(
            fit.resize_in_place(a, 3500),
            Ok(Resized::Done {
                release: Release::NONE
            })
        );
        assert_eq!(fit.usable_size(a), Ok(3504));
        assert!(holds(a, 2000, 1));
        fill(a, 3500, 1);
        // No room for more: c is in the way.
        assert_eq!(fit.resize_in_place(a, 8000), Ok(Resized::Move));
        // Shrinks free the tail.
        assert!(matches!(
            fit.resize_in_place(a, 100),
            Ok(Resized::Done { .. })
        ));
        assert_eq!(fit.usable_size(a), Ok(112));
        assert!(holds(a, 100, 1));
        assert!(holds(c, 2000, 3));
        fit.check().unwrap();
        // The last block grows into the free rest of the span.
        assert!(matches!(
            fit.resize_in_place(c, 60_000),
            Ok(Resized::Done { .. })
        ));
        assert!(holds(c, 2000, 3));
        assert_eq!(
            fit.resize_in_place(c + 8, 10),
            Err(FitError::Foreign { addr: c + 8 })
        );
        fit.check().unwrap();
    }
}

/// Freed pages are reported once the blocks around them are free, never a page a live block
/// uses: checked by really dropping them (a live block there would read back zeros).
#[test]
fn released_pages_are_never_live_and_all_come_back() {
    for release_min in [0, PAGE, 32 << 10] {
        released_pages_come_back(release_min);
    }
}

fn released_pages_come_back(release_min: usize) {
    let mem = Mem::new(32 << 20);
    let mut fit = mem.fit_releasing(256 << 10, release_min);
    let mut rng = StdRng::seed_from_u64(7);
    let mut ptrs = Vec::new();
    // SAFETY: the span is valid (Mem).
    unsafe {
        for i in 0..3000u32 {
            let n = rng.random_range(1000..20_000);
            let p = fit.alloc(n).unwrap();
            fill(p, n, i as u8);
            ptrs.push((p, n, i as u8));
        }
        let before = mem.resident_pages();
        // Free in random order; drop every released range.
        while !ptrs.is_empty() {
            let k = rng.random_range(0..ptrs.len());
            let (p, _, _) = ptrs.swap_remove(k);
            mem.drop_pages(fit.free(p).unwrap());
            if ptrs.len() % 500 == 0 {
                for &(q, n, t) in &ptrs {
                    assert!(holds(q, n, t), "a live block lost its contents");
                }
            }
        }
        let after = mem.resident_pages();
        assert!(before > 2000, "{before} pages were used");
        // One free block: its first page (header and links) and the last (the end header)
        // stay, and under `release_min` bytes of pages it has not given back yet.
        assert!(
            after <= 2 + release_min / PAGE,
            "{after} of {before} pages still resident after every free"
        );
        assert_eq!(fit.check().unwrap().1, 1);
    }
}

/// Random allocation, free and resize against a model: blocks never overlap, contents stay,
/// released pages never hold a live block, and the structure checks out throughout.
#[test]
fn random_operations_match_a_model() {
    for (seed, release_min, delay) in [(42, 0, 0), (43, 32 << 10, 0), (44, 32 << 10, 20)] {
        random_operations(seed, release_min, delay);
    }
}

fn random_operations(seed: u64, release_min: usize, delay: u64) {
    let mem = Mem::new(128 << 20);
    let mut fit = mem.fit_aging(1 << 20, release_min, delay);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut now = 0;
    let mut freed = 0;
    // user pointer -> (requested bytes, tag)
    let mut live: BTreeMap<usize, (usize, u8)> = BTreeMap::new();
    let size = |rng: &mut StdRng| match rng.random_range(0..10) {
        0..=5 => rng.random_range(1025..8192),
        6..=8 => rng.random_range(1..1025),
        _ => rng.random_range(8192..40_000),
    };
    for step in 0..60_000u32 {
        let tag = (step % 251) as u8;
        // SAFETY: the span is valid (Mem); pointers come from the model.
        unsafe {
            // Time passes (a unit in ten steps, on average): aged holes are dropped.
            now += rng.random_range(0..10) / 9;
            let aged = fit.advance(now);
            assert_no_live_in(&live, aged);
            mem.drop_pages(aged);
            match rng.random_range(0..10) {
                0..=4 => {
                    let n = size(&mut rng);
                    let p = fit.alloc(n).expect("128 MiB holds the model's blocks");
                    assert!(fit.usable_size(p).unwrap() >= n);
                    let (lo, hi) = (p - HEADER, p + fit.usable_size(p).unwrap());
                    if let Some((&q, &(qn, _))) = live.range(..p).next_back() {
                        assert!(q + qn <= lo, "overlaps the block before");
                    }
                    if let Some((&q, _)) = live.range(p..).next() {
                        assert!(q - HEADER >= hi, "overlaps the block after");
                    }
                    fill(p, n, tag);
                    live.insert(p, (n, tag));
                }
                5..=7 if !live.is_empty() => {
                    let k = *live.keys().nth(rng.random_range(0..live.len())).unwrap();
                    let (n, t) = live.remove(&k).unwrap();
                    assert!(holds(k, n, t), "block {k:#x} lost its contents");
                    let usable = fit.usable_size(k).unwrap();
                    let r = fit.free(k).unwrap();
                    freed += usable + HEADER;
                    assert_no_live_in(&live, r);
                    mem.drop_pages(r);
                }
                8..=9 if !live.is_empty() => {
                    let k = *live.keys().nth(rng.random_range(0..live.len())).unwrap();
                    let (n, t) = live[&k];
                    let m = size(&mut rng);
                    match fit.resize_in_place(k, m).unwrap() {
                        Resized::Done { release } => {
                            assert!(fit.usable_size(k).unwrap() >= m);
                            assert!(holds(k, n.min(m), t));
                            live.insert(k, (m, tag));
                            assert_no_live_in(&live, release);
                            mem.drop_pages(release);
                            fill(k, m, tag);
                        }
                        Resized::Move => assert!(m > n, "a shrink is always done in place"),
                    }
                }
                _ => {}
            }
        }
        if step % 5000 == 0 {
            // SAFETY: as above.
            let (blocks, _, _) = unsafe { fit.check() }.unwrap();
            assert_eq!(blocks, live.len());
            for (&p, &(n, t)) in &live {
                assert!(holds(p, n, t));
            }
        }
    }
    // Every aging hole is dropped once its time has come.
    now += delay;
    while fit.aging() != 0 {
        // SAFETY: as above.
        let aged = unsafe { fit.advance(now) };
        assert!(!aged.is_empty(), "aged holes are given up");
        assert_no_live_in(&live, aged);
        mem.drop_pages(aged);
    }
    for (&p, &(n, t)) in &live {
        assert!(holds(p, n, t));
    }
    // Pages are dropped about once per free that leaves them: not again and again as part of
    // ranges spanning large holes.
    let released = fit.stats().released as usize;
    eprintln!(
        "release_min {release_min}, delay {delay}: {released} bytes dropped for {freed} freed"
    );
    assert!(
        released <= 2 * freed,
        "{released} bytes dropped for {freed} freed"
    );
}

#[test]
fn small_holes_stay_until_they_grow_large() {
    let mem = Mem::new(8 << 20);
    let mut fit = mem.fit_releasing(1 << 20, 32 << 10);
    // SAFETY: the span is valid (Mem).
    unsafe {
        let ptrs = alloc_filled(&mut fit, 64, 4000, 9);
        // Every other block: holes of 4 KB between live blocks keep their pages.
        for &p in ptrs.iter().step_by(2) {
            assert_eq!(fit.free(p), Ok(Release::NONE));
        }
        // Freeing the rest joins them: one hole of 250 KB, dropped as it forms (every 32 KiB).
        let mut dropped = 0;
        for &p in ptrs.iter().skip(1).step_by(2) {
            let r = fit.free(p).unwrap();
            mem.drop_pages(r);
            dropped += r.bytes();
        }
        assert!(dropped >= 60 * 4000 - (32 << 10), "{dropped} bytes dropped");
        fit.check().unwrap();
        // What stays: the hole's first and last pages, and under 32 KiB not given back yet.
        let left = mem.resident_pages();
        assert!(
            left <= 2 + 8,
            "{left} pages resident, {dropped} bytes dropped"
        );
    }
}

/// Frees in a row (a program tearing down a structure) drop each page about once, not the
/// whole growing hole again at every free.
#[test]
fn frees_in_a_row_drop_each_page_about_once() {
    let mem = Mem::new(16 << 20);
    let mut fit = mem.fit_releasing(1 << 20, 32 << 10);
    // SAFETY: the span is valid (Mem).
    unsafe {
        let ptrs = alloc_filled(&mut fit, 2000, 4368, 5);
        let mut dropped = 0;
        for (i, &p) in ptrs.iter().enumerate() {
            let r = fit.free(p).unwrap();
            assert!(
                r.bytes() <= 64 << 10,
                "free {i} dropped {} bytes",
                r.bytes()
            );
            dropped += r.bytes();
            mem.drop_pages(r);
        }
        let freed = 2000 * 4384;
        assert!(
            dropped <= freed + (1 << 20),
            "{dropped} bytes dropped for {freed} freed"
        );
        assert!(mem.resident_pages() <= 2 + 8);
        // Backwards too.
        let ptrs = alloc_filled(&mut fit, 2000, 4368, 6);
        for &p in ptrs.iter().rev() {
            let r = fit.free(p).unwrap();
            assert!(r.bytes() <= 64 << 10);
            mem.drop_pages(r);
        }
        assert!(mem.resident_pages() <= 2 + 8);
    }
}

/// With a delay, a hole keeps its pages until it has stayed free that long; a hole cut up
/// again before then is not dropped at all (gcc's cc1 refilled its holes every 7 ms).
#[test]
fn holes_are_dropped_only_after_their_delay_and_not_when_reused() {
    let mem = Mem::new(8 << 20);
    let mut fit = mem.fit_aging(1 << 20, 32 << 10, 10);
    // SAFETY: the span is valid (Mem).
    unsafe {
        let ptrs = alloc_filled(&mut fit, 64, 4368, 3);
        let resident = mem.resident_pages();
        // Ten blocks in a row: a hole of ~43 KiB, nothing dropped yet.
        for &p in &ptrs[10..20] {
            assert_eq!(fit.free(p), Ok(Release::NONE));
        }
        assert_eq!(fit.aging(), 1);
        assert_eq!(fit.advance(9), Release::NONE);
        // Refilled before its time: the hole's pages stay, and nothing is dropped later.
        let again = alloc_filled(&mut fit, 10, 4368, 4);
        assert_eq!(fit.aging(), 0);
        assert_eq!(fit.advance(100), Release::NONE);
        assert_eq!(mem.resident_pages(), resident);
        // Freed again at 100: dropped at 110, not before.
        for &p in &again {
            assert_eq!(fit.free(p), Ok(Release::NONE));
        }
        assert_eq!(fit.advance(109), Release::NONE);
        let r = fit.advance(110);
        assert!(r.bytes() >= 32 << 10, "{r:?}");
        mem.drop_pages(r);
        assert!(mem.resident_pages() <= resident - 8);
        assert_eq!(fit.aging(), 0);
        for &p in ptrs[..10].iter().chain(&ptrs[20..]) {
            assert!(holds(p, 4368, 3));
        }
        fit.check().unwrap();
    }
}

/// More aging holes than the queue holds: the oldest is dropped at once, so no hole waits
/// unseen.
#[test]
fn a_full_aging_queue_drops_its_oldest_hole() {
    let mem = Mem::new(16 << 20);
    let mut fit = mem.fit_aging(1 << 20, 32 << 10, 1000);
    // SAFETY: the span is valid (Mem).
    unsafe {
        // Runs of 9 blocks (~39 KiB) with a live block between them.
        let ptrs = alloc_filled(&mut fit, 10 * (AGING + 1), 4368, 1);
        let runs: Vec<&[usize]> = ptrs.chunks(10).map(|c| &c[..9]).collect();
        for (i, run) in runs.iter().enumerate() {
            let mut out = Release::NONE;
            for &p in *run {
                let r = fit.free(p).unwrap();
                if !r.is_empty() {
                    out = r;
                }
            }
            if i < AGING {
                assert!(out.is_empty(), "hole {i} dropped early");
            } else {
                // The first hole's pages come out.
                assert!(out.ranges()[0].0 >= runs[0][0] && out.ranges()[0].0 < runs[1][0]);
                mem.drop_pages(out);
            }
        }
        assert_eq!(fit.aging(), AGING);
        fit.check().unwrap();
        for c in ptrs.chunks(10) {
            assert!(holds(c[9], 4368, 1));
        }
    }
}

fn assert_no_live_in(live: &BTreeMap<usize, (usize, u8)>, release: Release) {
    for &(at, len) in release.ranges() {
        // Blocks are under 64 KiB: any that reaches into the range starts after at - 64 KiB.
        for (&p, &(n, _)) in live.range(at.saturating_sub(64 << 10)..at + len + HEADER) {
            assert!(
                p + n <= at || p - HEADER >= at + len,
                "released [{at:#x}, +{len}) holds block {p:#x}+{n}"
            );
        }
    }
}
