//! Sizes on the command line and in ZMEM_* settings: plain bytes or a binary suffix k/K, m/M,
//! g/G.

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("empty size")]
    Empty,
    #[error("invalid size {0:?} (expected bytes or a number with k, m or g, e.g. 4k, 512M, 1g)")]
    Invalid(String),
    #[error("size {0:?} overflows 64 bits")]
    Overflow(String),
}

/// Parses "4096", "4k", "4K", "512m", "1G" (binary multiples).
pub fn parse_size(s: &str) -> Result<u64, SizeError> {
    let t = s.trim();
    if t.is_empty() {
        return Err(SizeError::Empty);
    }
    let (digits, mult) = match t.as_bytes()[t.len() - 1] {
        b'k' | b'K' => (&t[..t.len() - 1], 1u64 << 10),
        b'm' | b'M' => (&t[..t.len() - 1], 1u64 << 20),
        b'g' | b'G' => (&t[..t.len() - 1], 1u64 << 30),
        _ => (t, 1),
    };
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(SizeError::Invalid(s.to_string()));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| SizeError::Overflow(s.to_string()))?;
    n.checked_mul(mult)
        .ok_or_else(|| SizeError::Overflow(s.to_string()))
}

/// parse_size for clap's value_parser (usize values).
pub fn parse_size_usize(s: &str) -> Result<usize, SizeError> {
    let n = parse_size(s)?;
    usize::try_from(n).map_err(|_| SizeError::Overflow(s.to_string()))
}
