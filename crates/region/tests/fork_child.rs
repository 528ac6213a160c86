//! Eviction in a forked child: a child that reads a heap much larger than the budget (redis's
//! BGSAVE) holds only its share of it in DRAM beyond what it shares with the parent, and still
//! sees every byte: the parent's data at the fork, then its own writes. Its own test binary:
//! the other region tests fork too, and every fork reaches every live region.

use zmem_region::PAGE;

mod support;
use support::*;

#[test]
fn a_child_reading_the_whole_heap_stays_within_its_share() {
    let budget = 2 * MIB;
    let Some(r) = region(32 * MIB, budget) else {
        return;
    };
    let pages = r.len() / PAGE;
    for i in 0..pages {
        fill(page_mut(&r, i), i, 7);
    }
    assert!(r.stats().evictions as usize > pages / 2);
    // SAFETY: the child only touches memory, reads a /proc file and calls _exit (no allocation,
    // no locks).
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        let code = child_reads_and_writes(&r, pages, budget as usize);
        // SAFETY: leaving the child without running the parent's destructors.
        unsafe { libc::_exit(code) };
    }
    // Parent, meanwhile: overwrite half of the pages (evicting pages shared with the child).
    for i in (0..pages).step_by(2) {
        fill(page_mut(&r, i), i, 8);
    }
    wait_for_child(pid);
    for i in 0..pages {
        check(page_mut(&r, i), i, if i % 2 == 0 { 8 } else { 7 });
    }
    let st = r.stats();
    assert!(st.forks >= 1, "{st:?}");
    // The child faulted in ~8000 pages twice with a share of 128: nearly all were recycled.
    assert!(st.child_evictions as usize > pages, "{st:?}");
}

/// In the child: read everything (the parent's data at the fork), measuring the anonymous
/// memory this costs; then write half of the pages and read all again. Exit codes name the
/// failure (no allocation here: the parent's allocator locks may be held).
fn child_reads_and_writes(r: &zmem_region::Region, pages: usize, budget: usize) -> i32 {
    let Some(before) = rss_anon() else {
        return 20;
    };
    for i in 0..pages {
        if !matches(page_mut(r, i), i, 7) {
            return 10;
        }
    }
    let Some(after) = rss_anon() else {
        return 20;
    };
    // Without eviction in the child it grows by the whole evicted heap (~30 MiB); its share is
    // a quarter of the budget, plus fault-around runs mapped at once.
    if after.saturating_sub(before) > budget {
        return 12;
    }
    for i in (1..pages).step_by(2) {
        fill(page_mut(r, i), i, 9);
    }
    for round in 0..2 {
        for i in 0..pages {
            let want = if i % 2 == 1 { 9 } else { 7 };
            if !matches(page_mut(r, i), i, want) {
                return 13 + round;
            }
        }
    }
    0
}

/// RssAnon of this process in bytes, read without allocating.
fn rss_anon() -> Option<usize> {
    let mut buf = [0u8; 4096];
    // SAFETY: a NUL-terminated path; reading into a local array; closing what we opened.
    let n = unsafe {
        let fd = libc::open(c"/proc/self/status".as_ptr(), libc::O_RDONLY);
        if fd < 0 {
            return None;
        }
        let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
        libc::close(fd);
        n
    };
    let text = buf.get(..usize::try_from(n).ok()?)?;
    let key = b"RssAnon:";
    let at = text.windows(key.len()).position(|w| w == key)? + key.len();
    let kib = text[at..]
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take_while(|b| b.is_ascii_digit())
        .fold(0usize, |n, &d| n * 10 + usize::from(d - b'0'));
    Some(kib * 1024)
}
