//! The log on real files: an unnamed file in a directory with O_DIRECT where the file system
//! takes it, pread/pwrite and io_uring, space reserved at open, trims that punch holes, and a
//! named file damaged from outside (a flipped bit, truncation).

mod common;

use std::fs::OpenOptions;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};

use common::*;
use zmem_tier::{FileIo, IoMode, Log, LogConfig, TierError};

/// True where the directory's file system is one known to take O_DIRECT (ext4, xfs, btrfs).
fn direct_capable(dir: &std::path::Path) -> bool {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a zeroed statfs is valid; statfs fills it.
    let mut s: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and buffer.
    if unsafe { libc::statfs(c.as_ptr(), &mut s) } != 0 {
        return false;
    }
    [0xEF53, 0x5846_5342, 0x9123_683E].contains(&(s.f_type as i64))
}

fn uring_allowed() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
        .map(|s| s.trim() == "0")
        .unwrap_or(false)
}

fn round_trip(mode: IoMode, encrypt: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = LogConfig::new(dir.path(), 16 << 20);
    cfg.encrypt = encrypt;
    cfg.segment_size = 256 << 10;
    cfg.io = mode;
    let log = match Log::open(cfg) {
        Ok(l) => l,
        Err(e) if mode == IoMode::Uring && !uring_allowed() => {
            eprintln!("io_uring refused here: {e}");
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let st = log.stats();
    assert_eq!(st.segments, 64);
    if direct_capable(dir.path()) {
        assert!(st.direct, "O_DIRECT on this file system");
    }
    assert_eq!(st.uring, mode != IoMode::Sync && uring_allowed());
    // The directory shows no file: it is unnamed.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    let c = Client::new(&log);
    for round in 0..6u64 {
        let pages: Vec<(u64, Vec<u8>)> = (0..200)
            .map(|i| (i, page(i, round, 500 + (i as usize * 37) % 3500)))
            .collect();
        c.write(&pages).unwrap();
    }
    c.check_all();
    for i in (0..200).step_by(2) {
        c.discard(i);
    }
    log.collect(64);
    c.check_all();
    let st = log.stats();
    assert!(st.gc_segments > 0 && st.trims > 0, "{st:?}");
    assert_eq!(st.trim_errors, 0);
    assert_eq!(st.read_errors + st.write_errors + st.corrupt, 0);
}

#[test]
fn a_file_log_round_trips_with_pread_pwrite() {
    round_trip(IoMode::Sync, true);
    round_trip(IoMode::Sync, false);
}

#[test]
fn a_file_log_round_trips_with_io_uring() {
    round_trip(IoMode::Uring, true);
    round_trip(IoMode::Auto, true);
}

/// tmpfs takes O_DIRECT since Linux 6.6; older kernels refuse it (EINVAL) and the log falls
/// back to buffered I/O. Either way the log works there.
#[test]
fn a_log_on_tmpfs_works_with_or_without_o_direct() {
    let shm = std::path::Path::new("/dev/shm");
    if !shm.is_dir() {
        eprintln!("skipped: no /dev/shm");
        return;
    }
    let dir = tempfile::tempdir_in(shm).unwrap();
    let mut cfg = LogConfig::new(dir.path(), 8 << 20);
    cfg.segment_size = 1 << 20;
    let log = Log::open(cfg).unwrap();
    eprintln!("tmpfs: O_DIRECT {}", log.stats().direct);
    let c = Client::new(&log);
    c.write(&[(1, page(1, 0, 3000)), (2, page(2, 0, 10))])
        .unwrap();
    c.check_all();
}

#[test]
fn a_log_larger_than_the_file_system_fails_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let e = Log::open(LogConfig::new(dir.path(), 1 << 50))
        .err()
        .expect("refused");
    assert!(
        matches!(e, TierError::Io { errno, .. } if [libc::ENOSPC, libc::EFBIG].contains(&errno.0)),
        "{e}"
    );
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "nothing left behind"
    );
}

#[test]
fn reserved_space_is_allocated_and_trims_give_it_back() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(&path)
        .unwrap();
    let fd: OwnedFd = f.try_clone().unwrap().into();
    let io = FileIo::from_fd(fd, 16, SEG, false, IoMode::Sync).unwrap();
    let blocks = |p: &std::path::Path| std::fs::metadata(p).unwrap().blocks() * 512;
    assert!(blocks(&path) >= 16 * SEG as u64, "fallocated");
    let log = Log::with_io(cfg(SEG, true), Box::new(io)).unwrap();
    let c = Client::new(&log);
    c.write(&(0..30).map(|i| (i, page(i, 0, 2000))).collect::<Vec<_>>())
        .unwrap();
    for i in 0..30 {
        c.discard(i);
    }
    log.collect(4);
    assert_eq!(log.stats().trims, 1);
    assert!(
        blocks(&path) <= 15 * SEG as u64,
        "the trimmed segment's blocks are gone"
    );
    // The next write of that segment reserves it again.
    c.write(&(0..30).map(|i| (i, page(i, 1, 2000))).collect::<Vec<_>>())
        .unwrap();
    c.check_all();
    drop(f);
}

#[test]
fn damage_from_outside_is_detected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("log");
    let direct = direct_capable(dir.path());
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .custom_flags(if direct { libc::O_DIRECT } else { 0 })
        .open(&path)
        .unwrap();
    let fd: OwnedFd = f.into();
    let raw = fd.as_raw_fd();
    assert!(raw >= 0);
    let io = FileIo::from_fd(fd, 16, SEG, direct, IoMode::Sync).unwrap();
    let log = Log::with_io(cfg(SEG, true), Box::new(io)).unwrap();
    let c = Client::new(&log);
    let pages: Vec<(u64, Vec<u8>)> = (0..60).map(|i| (i, page(i, 0, 2000))).collect();
    c.write(&pages).unwrap();
    // A flipped bit through another descriptor (the page cache and O_DIRECT agree).
    let other = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let l = c.loc(5);
    let at = u64::from(l.segment()) * SEG as u64 + u64::from(l.offset()) + 100;
    let mut b = [0u8; 1];
    other.read_exact_at(&mut b, at).unwrap();
    other.write_all_at(&[b[0] ^ 0x04], at).unwrap();
    other.sync_all().unwrap();
    assert!(matches!(c.read(5), Err(TierError::Corrupt { .. })));
    assert_eq!(c.read(6).unwrap(), pages[6].1);
    // Truncated: the second segment's objects are gone, the first's still read.
    let l40 = c.loc(40);
    assert_eq!(l40.segment(), 1);
    other.set_len(SEG as u64).unwrap();
    assert!(matches!(c.read(40), Err(TierError::Corrupt { .. })));
    assert_eq!(c.read(6).unwrap(), pages[6].1);
}
