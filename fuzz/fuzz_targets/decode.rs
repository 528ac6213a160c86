//! Arbitrary bytes as a compressed object: decode must return an error or exactly the length
//! its header claims, never crash or write past the output.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut out = vec![0u8; 64 * 1024 + 16];
    if let Ok(n) = zmem_codec::decode(data, None, &mut out) {
        let h = zmem_codec::peek_header(data).expect("decoded objects have a header");
        assert_eq!(n, h.orig_len);
    }
});
