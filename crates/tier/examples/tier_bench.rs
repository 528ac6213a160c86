//! Measures the SSD log's backends and its sealing on this machine:
//!
//! - segment writes (1 MiB segments, 4 per call) through pread/pwrite and io_uring;
//! - 4 KiB random reads (one at a time, as a fault handler reads) through both;
//! - the collector's gathers (16 ranges of 8 KiB of one segment per call) through both;
//! - the log's write + read throughput with encryption on and off (over the file, and over
//!   MemIo for the CPU cost alone).
//!
//! `cargo run --release -p zmem-tier --example tier_bench [DIR] [MiB]` (DIR: where the file
//! goes, default the current directory; MiB: file size, default 512).

use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::time::Instant;

use rand::{Rng, SeedableRng};
use zmem_tier::{
    AlignedBuf, FileIo, IoMode, Location, Log, LogConfig, MemIo, Owner, SegmentIo, UringUse,
};

const SEG: usize = 1 << 20;

fn file_io(dir: &std::path::Path, segments: u32, uring: UringUse) -> FileIo {
    use std::os::unix::fs::OpenOptionsExt;
    let f = tempfile::Builder::new()
        .prefix("tier-bench")
        .tempfile_in(dir)
        .expect("a file in DIR");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(f.path())
        .expect("O_DIRECT open");
    drop(f); // unlinked; the descriptor keeps it
    let fd: OwnedFd = file.into();
    let mode = if uring == UringUse::NONE {
        IoMode::Sync
    } else {
        IoMode::Uring
    };
    let mut io = FileIo::from_fd(fd, segments, SEG, true, mode).expect("FileIo");
    io.set_uring_use(uring);
    io
}

fn mbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / (1 << 20) as f64
}

fn bench_io(dir: &std::path::Path, segments: u32) {
    for (name, uring) in [
        ("pread/pwrite", UringUse::NONE),
        ("io_uring", UringUse::ALL),
    ] {
        let io = file_io(dir, segments, uring);
        let mut bufs: Vec<AlignedBuf> = (0..4).map(|_| AlignedBuf::new(SEG, 4096)).collect();
        for (i, b) in bufs.iter_mut().enumerate() {
            b.as_mut_slice().fill(i as u8 + 1);
        }
        // Segment writes: the whole file twice, 4 segments a call.
        let t = Instant::now();
        let mut bytes = 0u64;
        for _round in 0..2 {
            for s in (0..segments).step_by(4) {
                let batch: Vec<(u32, &[u8])> = (0..4u32)
                    .filter(|k| s + k < segments)
                    .map(|k| (s + k, bufs[k as usize].as_slice()))
                    .collect();
                io.write_segments(&batch).expect("write");
                bytes += (batch.len() * SEG) as u64;
            }
        }
        let w = mbps(bytes, t.elapsed().as_secs_f64());
        // 4 KiB random reads, one at a time.
        let mut r = rand::rngs::StdRng::seed_from_u64(1);
        let mut buf = AlignedBuf::new(4096, 4096);
        let n = 20_000;
        let t = Instant::now();
        for _ in 0..n {
            let seg = r.random_range(0..segments);
            let off = r.random_range(0..SEG / 4096) * 4096;
            io.read_at(seg, off, buf.as_mut_slice()).expect("read");
        }
        let rd = t.elapsed().as_secs_f64();
        // Gathers: 16 ranges of 8 KiB spread over one segment.
        let mut big = AlignedBuf::new(SEG, 4096);
        let g = 2_000;
        let t = Instant::now();
        for _ in 0..g {
            let seg = r.random_range(0..segments);
            let mut parts: Vec<(usize, &mut [u8])> = big
                .as_mut_slice()
                .chunks_mut(SEG / 16)
                .enumerate()
                .map(|(k, c)| (k * (SEG / 16), &mut c[..8192]))
                .collect();
            io.read_ranges(seg, &mut parts).expect("gather");
        }
        let gt = t.elapsed().as_secs_f64();
        println!(
            "{name:13} segment writes {w:7.0} MiB/s | 4 KiB reads {:6.1} us ({:6.0} IOPS) | gathers of 16x8 KiB {:6.1} us",
            rd / n as f64 * 1e6,
            n as f64 / rd,
            gt / g as f64 * 1e6
        );
    }
}

struct Sink;
impl Owner for Sink {
    fn relocate(&self, _: u64, _: Location, _: Location) -> bool {
        false
    }
}

/// Writes `total` bytes of 2 KiB objects through the log (500 a call: one segment), reads them
/// all back, frees them; returns (write MiB/s, read MiB/s).
fn bench_log(log: &Arc<Log>, total: usize) -> (f64, f64) {
    let owner: Arc<dyn Owner> = Arc::new(Sink);
    let id = log.register(Arc::downgrade(&owner));
    let mut r = rand::rngs::StdRng::seed_from_u64(2);
    let obj: Vec<u8> = (0..2048).map(|_| r.random::<u8>() & 0x3f).collect();
    let per_batch = 500;
    let batches = total / (per_batch * obj.len());
    let mut locs = Vec::new();
    let t = Instant::now();
    for b in 0..batches {
        let objs: Vec<(u64, &[u8])> = (0..per_batch)
            .map(|i| ((b * per_batch + i) as u64, &obj[..]))
            .collect();
        locs.extend(log.write(id, &objs).expect("write"));
    }
    let w = mbps(
        (batches * per_batch * obj.len()) as u64,
        t.elapsed().as_secs_f64(),
    );
    let mut out = vec![0u8; obj.len()];
    let t = Instant::now();
    for (i, l) in locs.iter().enumerate() {
        log.read(id, i as u64, *l, &mut out).expect("read");
    }
    let rd = mbps((locs.len() * obj.len()) as u64, t.elapsed().as_secs_f64());
    for l in locs {
        log.free(l);
    }
    log.unregister(id);
    (w, rd)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let dir = std::path::PathBuf::from(args.get(1).map_or(".", |s| s.as_str()));
    let mib: u32 = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(512);
    println!("device I/O, {mib} MiB file in {}, O_DIRECT", dir.display());
    bench_io(&dir, mib);
    println!("log write+read of 2 KiB objects ({} MiB)", mib / 2);
    for encrypt in [true, false] {
        let mut cfg = LogConfig::new(&dir, u64::from(mib) << 20);
        cfg.encrypt = encrypt;
        let log = Log::open(cfg).expect("open");
        let (w, r) = bench_log(&log, (mib as usize / 2) << 20);
        let mut mcfg = LogConfig::new("/", 0);
        mcfg.encrypt = encrypt;
        let mem = Log::with_io(mcfg, Box::new(MemIo::new(mib, SEG))).expect("MemIo log");
        let (mw, mr) = bench_log(&mem, (mib as usize / 2) << 20);
        println!(
            "encrypt {encrypt:5}: file write {w:6.0} MiB/s, read {r:6.0} MiB/s | MemIo (CPU only) write {mw:6.0} MiB/s, read {mr:6.0} MiB/s"
        );
    }
}
