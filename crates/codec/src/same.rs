//! Same-filled pages: one 8-byte word repeated over the whole page (zero pages included).
//! They are found before any codec runs and stored as the word alone.

/// Returns the repeated word if `buf` is one 8-byte word repeated (buf.len() a non-zero multiple of 8).
pub fn same_filled(buf: &[u8]) -> Option<u64> {
    if buf.is_empty() || buf.len() % 8 != 0 {
        return None;
    }
    let first = u64::from_ne_bytes(buf[..8].try_into().ok()?);
    // Compare in 64-byte strides first: the common non-same page fails within the first stride.
    let mut chunks = buf.chunks_exact(64);
    for chunk in &mut chunks {
        let mut diff = 0u64;
        for w in chunk.chunks_exact(8) {
            diff |= u64::from_ne_bytes(w.try_into().ok()?) ^ first;
        }
        if diff != 0 {
            return None;
        }
    }
    for w in chunks.remainder().chunks_exact(8) {
        if u64::from_ne_bytes(w.try_into().ok()?) != first {
            return None;
        }
    }
    Some(first)
}

/// Fills `buf` with `word` repeated (the inverse of [`same_filled`]); a tail shorter than a word
/// gets the word's leading bytes.
pub fn fill_same(buf: &mut [u8], word: u64) {
    let bytes = word.to_ne_bytes();
    let mut chunks = buf.chunks_exact_mut(8);
    for c in &mut chunks {
        c.copy_from_slice(&bytes);
    }
    let rem = chunks.into_remainder();
    let n = rem.len();
    rem.copy_from_slice(&bytes[..n]);
}
