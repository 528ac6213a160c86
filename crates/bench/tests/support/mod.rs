//! What the library-level benchmark tests share: the corpus (the real one when present, else
//! synthetic bytes).

#![allow(dead_code)]

use zmem_bench::corpus::Corpus;

/// The corpus of `zmem bench` when one is at its default location, else `synthetic()` bytes.
pub fn real_or(synthetic: impl FnOnce() -> Vec<u8>) -> Corpus {
    Corpus::load(&zmem_bench::default_corpus()).unwrap_or_else(|_| self::synthetic(synthetic()))
}

/// A corpus of `data` named "synthetic".
pub fn synthetic(data: Vec<u8>) -> Corpus {
    Corpus::from_bytes("synthetic", data).unwrap()
}
