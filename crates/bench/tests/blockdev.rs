//! BlockDevTarget over a regular file opened with O_DIRECT (works on ext4/xfs; where the file
//! system refuses O_DIRECT the typed error is checked instead).

mod support;

use std::os::unix::fs::FileExt;

use zmem_bench::blockdev::{BlockDevError, BlockDevTarget};
use zmem_bench::corpus::Corpus;
use zmem_bench::pages::{self, PagesError, PagesSpec, Rw};
use zmem_bench::target::PageTarget;

const SIZE: u64 = 8 << 20;

fn corpus() -> Corpus {
    support::real_or(|| (0..100_003u32).map(|i| (i ^ (i >> 5)) as u8).collect())
}

/// Opens an 8 MiB file; None (after checking the typed error) if O_DIRECT is refused.
fn open(dir: &tempfile::TempDir) -> Option<BlockDevTarget> {
    let path = dir.path().join("disk.img");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(SIZE).unwrap();
    drop(f);
    match BlockDevTarget::open(&path) {
        Ok(t) => Some(t),
        Err(e @ BlockDevError::DirectIoUnsupported { .. }) => {
            let msg = e.to_string();
            assert!(msg.contains("O_DIRECT") && msg.contains("EINVAL"), "{msg}");
            assert!(msg.contains(&path.display().to_string()), "{msg}");
            eprintln!("skipped: {msg}");
            None
        }
        Err(e) => panic!("unexpected error: {e}"),
    }
}

#[test]
fn write_then_read_with_verify_over_8mib() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let Some(t) = open(&dir) else { return };
    assert_eq!(t.size_bytes(), SIZE);
    assert_eq!(t.zram_index(), None);
    assert_eq!(t.memory().unwrap(), Default::default());
    let c = corpus();
    for (rw, bs, jobs) in [
        (Rw::Write, 4096, 1),
        (Rw::Read, 4096, 1),
        (Rw::RandWrite, 65536, 2),
        (Rw::RandRead, 65536, 2),
    ] {
        let spec = PagesSpec {
            rw,
            bs,
            jobs,
            size: SIZE,
            verify: true,
        };
        let r = pages::run(&t, &c, &spec).unwrap();
        assert_eq!(r.bytes, SIZE, "{rw}");
        assert_eq!(r.ops, SIZE / bs as u64);
        assert!(r.verified_bytes > 0);
        assert!(r.latency.p50_us > 0.0 && r.latency.p50_us <= r.latency.p999_us);
        assert_eq!(r.ratio_mem_used, None);
    }
    // The file holds exactly the corpus, cycling (read through the page cache to be independent).
    let plain = std::fs::File::open(dir.path().join("disk.img")).unwrap();
    let mut got = vec![0u8; SIZE as usize];
    plain.read_exact_at(&mut got, 0).unwrap();
    let mut want = vec![0u8; SIZE as usize];
    c.fill(0, &mut want);
    assert!(got == want, "file content differs from the corpus");
}

#[test]
fn corrupted_block_on_disk_is_reported() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let Some(t) = open(&dir) else { return };
    let c = corpus();
    let write = PagesSpec {
        rw: Rw::Write,
        bs: 4096,
        jobs: 1,
        size: SIZE,
        verify: true,
    };
    pages::run(&t, &c, &write).unwrap();
    // Corrupt block 14 (in the read-back sample) behind the target's back, then read it back.
    let mut buf = zmem_bench::target::AlignedBuf::new(4096);
    t.read_at(14 * 4096, &mut buf).unwrap();
    buf[100] ^= 0xff;
    t.write_at(14 * 4096, &buf).unwrap();
    let err = pages::verify_contents(&t, &c, &write).unwrap_err();
    match err.downcast_ref::<PagesError>() {
        Some(PagesError::Mismatch {
            target,
            offset,
            first_bad,
            ..
        }) => {
            assert!(target.ends_with("disk.img"), "{target}");
            assert_eq!(*offset, 14 * 4096);
            assert_eq!(*first_bad, 14 * 4096 + 100);
        }
        other => panic!("unexpected {other:?} / {err:#}"),
    }
    // Repaired, the whole file verifies.
    buf[100] ^= 0xff;
    t.write_at(14 * 4096, &buf).unwrap();
    assert_eq!(pages::verify_contents(&t, &c, &write).unwrap(), SIZE);
}

#[test]
fn unaligned_io_is_refused() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let Some(t) = open(&dir) else { return };
    let mut buf = zmem_bench::target::AlignedBuf::new(8192);
    assert!(t.read_at(100, &mut buf[..4096]).is_err());
    assert!(t.read_at(0, &mut buf[1..4097]).is_err());
    assert!(t.write_at(SIZE, &buf[..4096]).is_err(), "past the end");
    t.write_at(SIZE - 4096, &buf[..4096]).unwrap();
}

#[test]
fn missing_path_is_a_typed_error() {
    let err = BlockDevTarget::open(std::path::Path::new("/dev/zmem-no-such-device")).unwrap_err();
    assert!(matches!(err, BlockDevError::NotFound(_)), "{err:?}");
    assert!(err.to_string().contains("/dev/zmem-no-such-device"));
}

#[test]
fn empty_file_is_a_typed_error() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("empty.img");
    std::fs::File::create(&path).unwrap();
    match BlockDevTarget::open(&path) {
        Err(BlockDevError::Empty(p)) => assert_eq!(p, path),
        Err(BlockDevError::DirectIoUnsupported { .. }) => {}
        other => panic!("unexpected {other:?}"),
    }
}
