//! Helpers shared by the integration tests: a tiny deterministic PRNG and object contents.
#![allow(dead_code)]

use zmem_pool::{Handle, Pool};

/// splitmix64: small, fast, good enough for test data.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in lo..=hi.
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next_u64() % (hi - lo + 1) as u64) as usize
    }

    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.range(0, i);
            v.swap(i, j);
        }
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
