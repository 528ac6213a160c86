//! Helpers shared by the region tests: regions that skip where userfaultfd cannot be opened,
//! and page contents that name their page and version, so a wrong page says which one it is.

#![allow(dead_code)] // each test binary uses its own subset

use zmem_region::{Budget, Region, RegionConfig, RegionError, PAGE};

pub const MIB: u64 = 1 << 20;

/// A region with a fixed budget, or None (with the reason) without userfaultfd.
pub fn region(size: u64, budget: u64) -> Option<Region> {
    region_with(RegionConfig::new(size, Budget::Fixed(budget)))
}

/// Skips (None, with the reason) where /dev/userfaultfd cannot be opened; any other failure
/// fails the test.
pub fn skip_without_uffd(r: Result<Region, RegionError>) -> Option<Region> {
    match r {
        Ok(r) => Some(r),
        Err(e @ RegionError::Permission { .. }) => {
            eprintln!("skipped: {e}");
            None
        }
        Err(e) => panic!("creating a region: {e}"),
    }
}

pub fn region_with(cfg: RegionConfig) -> Option<Region> {
    skip_without_uffd(Region::new(cfg))
}

const WORDS: &[u8] = b"the quick brown fox jumps over the lazy dog while zmem compresses ";

/// Byte `i` of page `idx` at `version` (compressible, different for each page and version).
fn byte(i: usize, idx: usize, version: u64) -> u8 {
    WORDS[(i + idx * 7 + version as usize) % WORDS.len()]
}

/// Fills page `idx` with compressible content that depends on (idx, version).
pub fn fill(page: &mut [u8], idx: usize, version: u64) {
    for (i, b) in page.iter_mut().enumerate() {
        *b = byte(i, idx, version);
    }
    page[..8].copy_from_slice(&(idx as u64).to_le_bytes());
    page[8..16].copy_from_slice(&version.to_le_bytes());
}

/// Whether `page` holds what [`fill`] wrote; allocates nothing (usable in a forked child).
pub fn matches(page: &[u8], idx: usize, version: u64) -> bool {
    page[..8] == (idx as u64).to_le_bytes()
        && page[8..16] == version.to_le_bytes()
        && (16..PAGE).all(|k| page[k] == byte(k, idx, version))
}

/// Panics, naming what was found instead, unless `page` holds what [`fill`] wrote.
pub fn check(page: &[u8], idx: usize, version: u64) {
    if !matches(page, idx, version) {
        let got_idx = u64::from_le_bytes(page[..8].try_into().unwrap());
        let got_ver = u64::from_le_bytes(page[8..16].try_into().unwrap());
        panic!("page {idx} version {version}: found page {got_idx} version {got_ver}");
    }
}

/// Fills `page` with random bytes (no codec shrinks them), seeded by (idx, version).
pub fn fill_random(page: &mut [u8], idx: usize, version: u64) {
    let mut x = (idx as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ version | 1;
    for chunk in page.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes());
    }
}

/// Fills `page` with random decimal numbers, one per line (like `sort -n`'s input): lz4 finds
/// no repeats worth keeping in them, an entropy coder halves them. Seeded by (idx, version).
pub fn fill_digits(page: &mut [u8], idx: usize, version: u64) {
    let mut x = (idx as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ version | 1;
    for (k, b) in page.iter_mut().enumerate() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = if k % 8 == 7 {
            b'\n'
        } else {
            b'0' + (x % 10) as u8
        };
    }
}

/// Page `idx` of the region as bytes.
// The region is shared memory by design; each test gives every page one writer at a time.
#[allow(clippy::mut_from_ref)]
pub fn page_mut(r: &Region, idx: usize) -> &mut [u8] {
    assert!((idx + 1) * PAGE <= r.len());
    // SAFETY: within the region, which lives as long as `r`; tests give each page one writer.
    unsafe { std::slice::from_raw_parts_mut(r.as_ptr().add(idx * PAGE), PAGE) }
}

/// Writes every page of the region at `version`.
pub fn fill_all(r: &Region, version: u64) {
    for i in 0..r.len() / PAGE {
        fill(page_mut(r, i), i, version);
    }
}

/// Writes every page of the region at `version`, then reads them all back in reverse order
/// (which faults the evicted ones in).
pub fn fill_and_check_all(r: &Region, version: u64) {
    let pages = r.len() / PAGE;
    fill_all(r, version);
    for i in (0..pages).rev() {
        check(page_mut(r, i), i, version);
    }
}

/// Waits for forked child `pid` and asserts that it exited with status 0.
pub fn wait_for_child(pid: libc::pid_t) {
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
    assert_eq!(libc::WEXITSTATUS(status), 0, "child saw wrong data");
}

/// Bytes of region `r` present in this process's memory (mincore into `present`, one byte per
/// page, made by the caller: a forked child allocates nothing). Not RssAnon: another test of
/// the same binary that drops its region hands each forked child every page of its own that
/// only it held, which RssAnon would count.
pub fn present_bytes(r: &Region, present: &mut [u8]) -> Option<usize> {
    let pages = r.len() / PAGE;
    let present = present.get_mut(..pages)?;
    // SAFETY: the region's range, and one byte per page of it in `present`.
    let rc = unsafe { libc::mincore(r.as_ptr().cast(), pages * PAGE, present.as_mut_ptr()) };
    (rc == 0).then(|| present.iter().filter(|&&b| b & 1 != 0).count() * PAGE)
}
