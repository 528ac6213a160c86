//! The log on a whole block device: a loop device over a file (only as root with losetup; the
//! test says why when it skips). The loop device is detached again in Drop, whatever happens.
//!
//! A dm-error device (every I/O failing, for a real "device removed") would need the
//! device-mapper driver; where `dmsetup` cannot reach it the test says so and MemIo's
//! removal fault covers that path (tests/log.rs).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::*;
use zmem_tier::{Log, LogConfig, TierError};

/// A loop device over a file, detached on drop.
struct Loop {
    dev: PathBuf,
    _dir: tempfile::TempDir,
}

impl Loop {
    fn new(bytes: u64) -> Result<Loop, String> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("not root".into());
        }
        let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let file = dir.path().join("backing");
        std::fs::File::create(&file)
            .and_then(|f| f.set_len(bytes))
            .map_err(|e| e.to_string())?;
        let out = Command::new("losetup")
            .args(["--find", "--show"])
            .arg(&file)
            .output()
            .map_err(|e| format!("losetup: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "losetup: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim().to_string());
        Ok(Loop { dev, _dir: dir })
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

#[test]
fn a_log_on_a_loop_device() {
    let lo = match Loop::new(32 << 20) {
        Ok(l) => l,
        Err(why) => {
            eprintln!("skipped: {why}");
            return;
        }
    };
    let mut cfg = LogConfig::new(&lo.dev, 16 << 20);
    cfg.segment_size = 256 << 10;
    // Larger than the device: refused.
    let mut big = cfg.clone();
    big.size = 64 << 20;
    assert!(matches!(Log::open(big), Err(TierError::Config(_))));
    let log = Log::open(cfg.clone()).unwrap();
    assert!(log.stats().direct);
    // Opened exclusively: a second log on it is refused.
    let e = Log::open(cfg).err().expect("busy");
    assert!(
        matches!(e, TierError::Io { errno, .. } if errno.0 == libc::EBUSY),
        "{e}"
    );
    let c = Client::new(&log);
    for round in 0..4 {
        let pages: Vec<(u64, Vec<u8>)> = (0..300).map(|i| (i, page(i, round, 1800))).collect();
        c.write(&pages).unwrap();
    }
    c.check_all();
    for i in 0..300 {
        if i % 4 != 0 {
            c.discard(i);
        }
    }
    log.collect(64);
    c.check_all();
    let st = log.stats();
    assert!(st.trims > 0 && st.trim_errors == 0, "BLKDISCARD: {st:?}");
}

#[test]
fn a_failing_device_through_dm_error() {
    let ok = Command::new("dmsetup")
        .arg("version")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("skipped: dmsetup cannot reach a device-mapper driver in this kernel");
        return;
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: not root");
        return;
    }
    let name = format!("zmem-tier-test-{}", std::process::id());
    struct Dm(String);
    impl Drop for Dm {
        fn drop(&mut self) {
            let _ = Command::new("dmsetup").args(["remove", &self.0]).status();
        }
    }
    // 32 MiB of sectors that fail every I/O.
    let st = Command::new("dmsetup")
        .args(["create", &name, "--table", "0 65536 error"])
        .status()
        .unwrap();
    if !st.success() {
        eprintln!("skipped: dmsetup create failed");
        return;
    }
    let _dm = Dm(name.clone());
    let mut cfg = LogConfig::new(format!("/dev/mapper/{name}"), 16 << 20);
    cfg.segment_size = 256 << 10;
    match Log::open(cfg) {
        // The direct-I/O probe at open may already fail.
        Err(e) => assert!(matches!(e, TierError::Io { .. }), "{e}"),
        Ok(log) => {
            let c = Client::new(&log);
            let e = c.write(&[(1, page(1, 0, 100))]).unwrap_err();
            assert!(
                matches!(e, TierError::Io { errno, .. } if errno.0 == libc::EIO),
                "{e}"
            );
            assert_eq!(log.stats().objects, 0);
        }
    }
}
