//! Helpers shared by the integration tests: a seeded generator and object contents.
#![allow(dead_code)]

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng as _, RngCore, SeedableRng};
use zmem_pool::{Handle, Pool};

/// A seeded generator (rand's StdRng) with the few draws the tests use.
pub struct Rng(StdRng);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(StdRng::seed_from_u64(seed))
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0.next_u64()
    }

    /// Uniform in lo..=hi.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        self.0.random_range(lo..=hi)
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        v.shuffle(&mut self.0);
    }
}

/// Deterministic contents of `len` bytes for `seed`.
pub fn content(seed: u64, len: usize) -> Vec<u8> {
    let mut r = Rng::new(seed);
    let mut v = Vec::with_capacity(len + 8);
    while v.len() < len {
        v.extend_from_slice(&r.next_u64().to_le_bytes());
    }
    v.truncate(len);
    v
}

/// Asserts the object behind `h` is exactly `content(seed, len)`.
pub fn check(pool: &Pool, h: Handle, seed: u64, len: usize) {
    let want = content(seed, len);
    let same = pool
        .with_object(h, |b| b == want.as_slice())
        .expect("live handle must resolve");
    assert!(same, "object {h:?} (len {len}, seed {seed}) corrupted");
    assert_eq!(pool.object_len(h), Ok(len));
}
