//! Shared by the heap's integration tests.

#![allow(dead_code)]

use zmem_heap::{Budget, Heap, HeapError, RegionConfig, RegionError};

/// A heap of `size` bytes with `budget` resident, or None (with a note) where this user may not
/// use userfaultfd.
pub fn heap(size: u64, budget: u64) -> Option<Heap> {
    heap_with(RegionConfig::new(size, Budget::Fixed(budget)))
}

pub fn heap_with(cfg: RegionConfig) -> Option<Heap> {
    match Heap::new(cfg) {
        Ok(h) => Some(h),
        Err(HeapError::Region(RegionError::Permission { .. }))
        | Err(HeapError::Region(RegionError::Unsupported { .. })) => {
            eprintln!("skipped: userfaultfd is not available to this user");
            None
        }
        Err(e) => panic!("Heap::new: {e}"),
    }
}

/// The byte at offset `i` of a block with seed `seed`: data that compresses about 2:1.
pub fn byte(seed: u64, i: usize) -> u8 {
    if i % 8 < 4 {
        let x = (seed ^ (i as u64 / 8)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        (x >> 56) as u8
    } else {
        b"zmem heap "[i % 10]
    }
}

/// Fills `len` bytes at `p` with the pattern of `seed`.
///
/// # Safety
/// `p` is valid for `len` bytes of writes.
pub unsafe fn fill(p: *mut u8, len: usize, seed: u64) {
    // SAFETY: the caller's contract.
    let s = unsafe { std::slice::from_raw_parts_mut(p, len) };
    for (i, b) in s.iter_mut().enumerate() {
        *b = byte(seed, i);
    }
}

/// The first offset in `[0, len)` at `p` that differs from the pattern of `seed`.
///
/// # Safety
/// `p` is valid for `len` bytes of reads.
pub unsafe fn first_wrong(p: *const u8, len: usize, seed: u64) -> Option<usize> {
    // SAFETY: the caller's contract.
    let s = unsafe { std::slice::from_raw_parts(p, len) };
    s.iter().enumerate().position(|(i, &b)| b != byte(seed, i))
}
