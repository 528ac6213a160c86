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

/// Formats a byte count as sizes are given on the command line, the inverse of [`parse_size`]:
/// the largest binary suffix that divides it exactly (512M, 4k, 1G), plain bytes otherwise.
pub fn format_size(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "k")];
    for (unit, s) in UNITS {
        if n >= unit && n % unit == 0 {
            return format!("{}{}", n / unit, s);
        }
    }
    n.to_string()
}

/// A rounded byte count for people (T, G, M, K, B): "300M", "1.5G", "4K", "0B"; one decimal
/// below 100 units unless it is within 0.05 of a whole number.
pub fn format_size_approx(n: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1 << 40, "T"),
        (1 << 30, "G"),
        (1 << 20, "M"),
        (1 << 10, "K"),
    ];
    for (unit, s) in UNITS {
        if n >= unit {
            let v = n as f64 / unit as f64;
            return if v >= 100.0 || (v - v.round()).abs() < 0.05 {
                format!("{:.0}{s}", v)
            } else {
                format!("{v:.1}{s}")
            };
        }
    }
    format!("{n}B")
}

/// Whole MiB ("300M", rounded to nearest) below 10 GiB, GiB with one decimal ("12.5G") from there.
pub fn format_size_mg(n: u64) -> String {
    const MIB: u64 = 1 << 20;
    const GIB: u64 = 1 << 30;
    if n >= 10 * GIB {
        format!("{:.1}G", n as f64 / GIB as f64)
    } else {
        format!("{}M", (n + MIB / 2) / MIB)
    }
}

/// MiB for table columns: "12 MiB", or "12.5 MiB" unless within 0.05 of a whole number.
pub fn format_mib(n: u64) -> String {
    let m = n as f64 / (1u64 << 20) as f64;
    if (m - m.round()).abs() < 0.05 {
        format!("{m:.0} MiB")
    } else {
        format!("{m:.1} MiB")
    }
}

/// MiB with always one decimal: "12.0 MiB".
pub fn format_mib_1(n: u64) -> String {
    format!("{:.1} MiB", n as f64 / (1024.0 * 1024.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn format_size_is_the_inverse_of_parse_size() {
        for s in ["4k", "512M", "1G", "4097", "0", "3k"] {
            assert_eq!(format_size(parse_size(s).unwrap()), s);
        }
        assert_eq!(format_size(1536 << 20), "1536M");
    }

    #[test]
    fn approximate_sizes() {
        assert_eq!(format_size_approx(0), "0B");
        assert_eq!(format_size_approx(4096), "4K");
        assert_eq!(format_size_approx(1536 << 20), "1.5G");
        assert_eq!(format_size_approx(300 << 20), "300M");
    }

    #[test]
    fn mib_and_gib_columns() {
        assert_eq!(format_size_mg(300 << 20), "300M");
        assert_eq!(format_size_mg(20 << 30), "20.0G");
        assert_eq!(format_mib(3 << 20), "3 MiB");
        assert_eq!(format_mib(3 << 19), "1.5 MiB");
        assert_eq!(format_mib_1(3 << 20), "3.0 MiB");
    }
}
