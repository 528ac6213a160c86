use std::fs;

use zmem_bench::corpus::{Corpus, CorpusError};

fn tmp() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

#[test]
fn missing_directory_is_a_typed_error() {
    let d = tmp();
    let p = d.path().join("nope");
    let err = Corpus::load(&p).unwrap_err();
    assert!(
        matches!(err, CorpusError::Missing(ref q) if *q == p),
        "{err:?}"
    );
    assert!(err.to_string().contains("does not exist"));
}

#[test]
fn empty_directory_is_a_typed_error() {
    let d = tmp();
    let err = Corpus::load(d.path()).unwrap_err();
    assert!(matches!(err, CorpusError::Empty(_)), "{err:?}");
    // Only empty files and checksum files: still no data.
    fs::write(d.path().join("empty"), b"").unwrap();
    fs::write(d.path().join("SHA256SUMS"), b"abc  file\n").unwrap();
    fs::create_dir(d.path().join("sub")).unwrap();
    fs::write(d.path().join("sub/inner"), b"not read: not recursive").unwrap();
    let err = Corpus::load(d.path()).unwrap_err();
    assert!(matches!(err, CorpusError::Empty(_)), "{err:?}");
}

#[test]
fn file_instead_of_directory_is_a_typed_error() {
    let d = tmp();
    let f = d.path().join("file");
    fs::write(&f, b"data").unwrap();
    let err = Corpus::load(&f).unwrap_err();
    assert!(matches!(err, CorpusError::NotADirectory(_)), "{err:?}");
}

#[test]
fn files_sorted_by_name_concatenated_checksums_skipped() {
    let d = tmp();
    fs::write(d.path().join("b"), b"BBB").unwrap();
    fs::write(d.path().join("a"), b"AA").unwrap();
    fs::write(d.path().join("c"), b"C").unwrap();
    for skip in ["SHA256SUMS", "SHA1SUM.upstream", "MD5SUM.reference"] {
        fs::write(d.path().join(skip), b"xxxxxxxx").unwrap();
    }
    let c = Corpus::load(d.path()).unwrap();
    assert_eq!(c.bytes(), b"AABBBC");
    assert_eq!(c.len(), 6);
    let names: Vec<&str> = c.files().iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["a", "b", "c"]);
}

#[test]
fn fill_wraps_and_is_a_pure_function_of_the_offset() {
    let c = Corpus::from_bytes("t", b"0123456789".to_vec()).unwrap();
    let mut buf = [0u8; 25];
    c.fill(7, &mut buf);
    assert_eq!(&buf, b"7890123456789012345678901");
    let mut again = [0u8; 25];
    c.fill(17, &mut again); // 17 mod 10 == 7
    assert_eq!(buf, again);
    assert_eq!(c.first_mismatch(7, &buf), None);
    buf[13] ^= 1;
    assert_eq!(c.first_mismatch(7, &buf), Some(13));
    assert_eq!(c.first_mismatch(8, &again), Some(0));
    assert!(Corpus::from_bytes("e", Vec::new()).is_none());
}

#[test]
fn real_corpus_loads_when_present() {
    let dir = zmem_bench::default_corpus();
    if !dir.exists() {
        eprintln!("skipped: no corpus at {}", dir.display());
        return;
    }
    let c = Corpus::load(&dir).unwrap();
    let sum: u64 = c.files().iter().map(|(_, n)| n).sum();
    assert_eq!(sum, c.len());
    assert!(c.files().iter().all(|(n, _)| n != "SHA1SUM.upstream"));
}
