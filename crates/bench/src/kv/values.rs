//! The keys and the values loaded: corpus bytes, deterministic, checkable on GET.

use std::io::Write;

use super::{VALUE_MAX, VALUE_MIN};
use crate::corpus::Corpus;

pub(super) fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser.
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// The value of key i: `len(i)` corpus bytes from `offset(i)` (wrapping), both functions of i
/// and the seed, so any value can be checked without keeping it.
pub struct Values<'a> {
    corpus: &'a Corpus,
    seed: u64,
}

impl<'a> Values<'a> {
    pub fn new(corpus: &'a Corpus, seed: u64) -> Self {
        Values { corpus, seed }
    }

    pub fn len(&self, i: u64) -> usize {
        let span = (VALUE_MAX - VALUE_MIN + 1) as u64;
        VALUE_MIN + (mix(i ^ self.seed) % span) as usize
    }

    pub fn offset(&self, i: u64) -> u64 {
        mix(i.wrapping_mul(0x2545_f491_4f6c_dd1d) ^ self.seed.rotate_left(29)) % self.corpus.len()
    }

    /// Fills `buf` with the value of key i.
    pub fn fill(&self, i: u64, buf: &mut Vec<u8>) {
        buf.resize(self.len(i), 0);
        self.corpus.fill(self.offset(i), buf);
    }

    /// Why `got` is not the value of key i, or None.
    pub fn check(&self, i: u64, got: &[u8]) -> Option<String> {
        let want = self.len(i);
        if got.len() != want {
            return Some(format!("{} bytes, expected {want}", got.len()));
        }
        self.corpus
            .first_mismatch(self.offset(i), got)
            .map(|at| format!("byte {at} of {want} differs from the corpus"))
    }

    /// First key index after `start` at which the value bytes from key 0 reach `target`, given
    /// `bytes` = the value bytes of keys 0..start.
    pub fn end_for(&self, start: u64, bytes: u64, target: u64) -> (u64, u64) {
        let (mut i, mut b) = (start, bytes);
        while b < target {
            b += self.len(i) as u64;
            i += 1;
        }
        (i, b)
    }
}

/// The key of index i.
pub fn key(i: u64, out: &mut Vec<u8>) {
    out.clear();
    let _ = write!(out, "key:{i:012}");
}

pub(super) fn key_string(i: u64) -> String {
    format!("key:{i:012}")
}

#[cfg(test)]
mod tests {
    use super::*;
    fn corpus() -> Corpus {
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        Corpus::from_bytes("t", data).unwrap()
    }

    #[test]
    fn values_are_deterministic_and_checkable() {
        let c = corpus();
        let v = Values::new(&c, 1);
        let mut a = Vec::new();
        let mut lens = std::collections::HashSet::new();
        for i in 0..1000 {
            v.fill(i, &mut a);
            assert!((VALUE_MIN..=VALUE_MAX).contains(&a.len()));
            assert_eq!(v.check(i, &a), None);
            lens.insert(a.len());
        }
        assert!(lens.len() > 50, "lengths vary: {}", lens.len());
        v.fill(5, &mut a);
        a[17] ^= 1;
        assert!(v.check(5, &a).unwrap().contains("byte 17"));
        a.pop();
        assert!(v.check(5, &a).unwrap().contains("expected"));
        let w = Values::new(&c, 2);
        assert_ne!(v.offset(3), w.offset(3));
    }

    #[test]
    fn keys_have_a_fixed_width() {
        let mut k = Vec::new();
        key(42, &mut k);
        assert_eq!(k, b"key:000000000042");
    }

    #[test]
    fn end_for_reaches_the_target() {
        let c = corpus();
        let v = Values::new(&c, 1);
        let (k, b) = v.end_for(0, 0, 1 << 20);
        assert!(b >= 1 << 20 && b < (1 << 20) + VALUE_MAX as u64);
        let sum: u64 = (0..k).map(|i| v.len(i) as u64).sum();
        assert_eq!(sum, b);
        let (k2, b2) = v.end_for(k, b, 2 << 20);
        assert!(k2 > k && b2 >= 2 << 20);
        assert_eq!(v.end_for(k, b, b), (k, b));
    }
}
