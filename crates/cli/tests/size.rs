use zmem_cli::size::{parse_size, parse_size_usize, SizeError};

#[test]
fn plain_bytes_and_binary_suffixes() {
    assert_eq!(parse_size("0"), Ok(0));
    assert_eq!(parse_size("4096"), Ok(4096));
    assert_eq!(parse_size("4k"), Ok(4096));
    assert_eq!(parse_size("4K"), Ok(4096));
    assert_eq!(parse_size("64k"), Ok(65536));
    assert_eq!(parse_size("512m"), Ok(512 << 20));
    assert_eq!(parse_size("512M"), Ok(512 << 20));
    assert_eq!(parse_size("1g"), Ok(1 << 30));
    assert_eq!(parse_size("3G"), Ok(3 << 30));
    assert_eq!(parse_size(" 8k "), Ok(8192));
    assert_eq!(parse_size_usize("64k"), Ok(65536));
}

#[test]
fn invalid_sizes_are_errors() {
    assert_eq!(parse_size(""), Err(SizeError::Empty));
    for bad in ["k", "-4k", "4x", "1.5g", "4 k", "4kb", "0x10", "ten", "+4"] {
        assert!(
            matches!(parse_size(bad), Err(SizeError::Invalid(_))),
            "{bad:?} -> {:?}",
            parse_size(bad)
        );
    }
    assert!(matches!(
        parse_size("18446744073709551616"),
        Err(SizeError::Overflow(_))
    ));
    assert!(matches!(
        parse_size("17179869184g"),
        Err(SizeError::Overflow(_))
    ));
    assert!(parse_size("4x").unwrap_err().to_string().contains("4x"));
}
