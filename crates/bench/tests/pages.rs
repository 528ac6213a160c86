//! The page driver against an in-memory target: slicing, permutations, verification.

mod support;

use std::sync::Mutex;

use zmem_bench::corpus::Corpus;
use zmem_bench::pages::{self, PagesError, PagesSpec, Rw};
use zmem_bench::target::{MemoryReport, PageTarget};

struct MemTarget {
    data: Mutex<Vec<u8>>,
    /// (is_write, offset, len) of every operation, in order of arrival.
    log: Mutex<Vec<(bool, u64, usize)>>,
    /// Flip a bit of this byte on every read that covers it.
    corrupt: Option<u64>,
    flushes: Mutex<u32>,
}

impl MemTarget {
    fn new(size: usize, corrupt: Option<u64>) -> Self {
        MemTarget {
            data: Mutex::new(vec![0; size]),
            log: Mutex::new(Vec::new()),
            corrupt,
            flushes: Mutex::new(0),
        }
    }
}

impl PageTarget for MemTarget {
    fn name(&self) -> String {
        "mem".into()
    }
    fn size_bytes(&self) -> u64 {
        self.data.lock().unwrap().len() as u64
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> anyhow::Result<()> {
        assert_eq!(buf.as_ptr() as usize % 4096, 0, "unaligned buffer");
        assert_eq!(offset % buf.len() as u64, 0, "unaligned offset");
        self.log.lock().unwrap().push((true, offset, buf.len()));
        let o = offset as usize;
        self.data.lock().unwrap()[o..o + buf.len()].copy_from_slice(buf);
        Ok(())
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> anyhow::Result<()> {
        assert_eq!(buf.as_ptr() as usize % 4096, 0, "unaligned buffer");
        self.log.lock().unwrap().push((false, offset, buf.len()));
        let o = offset as usize;
        buf.copy_from_slice(&self.data.lock().unwrap()[o..o + buf.len()]);
        if let Some(c) = self.corrupt {
            if (offset..offset + buf.len() as u64).contains(&c) {
                buf[(c - offset) as usize] ^= 0x40;
            }
        }
        Ok(())
    }
    fn flush(&self) -> anyhow::Result<()> {
        *self.flushes.lock().unwrap() += 1;
        Ok(())
    }
    fn memory(&self) -> anyhow::Result<MemoryReport> {
        let n = self.data.lock().unwrap().len() as u64;
        Ok(MemoryReport {
            orig_data_size: n,
            compr_data_size: n / 2,
            mem_used_total: n / 4 * 3,
            same_pages: 0,
            huge_pages: 0,
        })
    }
}

fn corpus() -> Corpus {
    // A length that is not a multiple of 4096, so pages do not line up with the corpus cycle.
    support::synthetic((0..10_007u32).map(|i| (i * 7 + i / 251) as u8).collect())
}

fn spec(rw: Rw, bs: usize, jobs: usize, size: u64) -> PagesSpec {
    PagesSpec {
        rw,
        bs,
        jobs,
        size,
        verify: true,
    }
}

#[test]
fn validation_errors() {
    let e = |s: PagesSpec| s.validate().unwrap_err();
    assert!(matches!(
        e(spec(Rw::Write, 1000, 1, 1 << 20)),
        PagesError::BadBlockSize(1000)
    ));
    assert!(matches!(
        e(spec(Rw::Write, 0, 1, 1 << 20)),
        PagesError::BadBlockSize(0)
    ));
    assert!(matches!(
        e(spec(Rw::Write, 4096, 0, 1 << 20)),
        PagesError::NoJobs
    ));
    assert!(matches!(
        e(spec(Rw::Write, 8192, 1, 4096)),
        PagesError::BlockLargerThanSize { .. }
    ));
    let err = e(spec(Rw::Write, 4096, 2, 12288));
    assert!(
        matches!(err, PagesError::SizeNotMultiple { unit: 8192, .. }),
        "{err:?}"
    );
    assert_eq!(
        spec(Rw::Read, 4096, 2, 1 << 20).validate().unwrap(),
        1 << 19
    );
}

#[test]
fn write_then_sequential_read_covers_every_block_of_each_slice() {
    let size = 1 << 20;
    let t = MemTarget::new(size, None);
    let c = corpus();
    let r = pages::run(&t, &c, &spec(Rw::Write, 4096, 2, size as u64)).unwrap();
    assert_eq!(r.bytes, size as u64);
    assert_eq!(r.ops, 256);
    assert!(r.mib_s > 0.0);
    // The target holds exactly the corpus, cycling.
    let mut want = vec![0u8; size];
    c.fill(0, &mut want);
    assert!(*t.data.lock().unwrap() == want);
    // Read-back sample after the write: every 7th block of each 128-block slice.
    let log = t.log.lock().unwrap().clone();
    let reads: Vec<u64> = log.iter().filter(|e| !e.0).map(|e| e.1).collect();
    assert_eq!(reads.len(), 2 * 128usize.div_ceil(7));
    assert_eq!(r.verified_bytes, reads.len() as u64 * 4096);
    assert_eq!(*t.flushes.lock().unwrap(), 1);
    assert!((r.ratio_mem_used.unwrap() - 4.0 / 3.0).abs() < 1e-9);
    assert!((r.ratio_compr.unwrap() - 2.0).abs() < 1e-9);

    // Each job writes its own slice in order.
    let writes: Vec<u64> = log.iter().filter(|e| e.0).map(|e| e.1).collect();
    let job0: Vec<u64> = writes.iter().copied().filter(|&o| o < 1 << 19).collect();
    let job1: Vec<u64> = writes.iter().copied().filter(|&o| o >= 1 << 19).collect();
    assert_eq!(job0, (0..128).map(|i| i * 4096).collect::<Vec<_>>());
    assert_eq!(job1, (128..256).map(|i| i * 4096).collect::<Vec<_>>());
}

#[test]
fn randread_fills_first_then_visits_every_block_once_in_a_reproducible_order() {
    let size = 2 << 20;
    let c = corpus();
    let s = spec(Rw::RandRead, 16384, 2, size as u64);
    let orders: Vec<Vec<u64>> = (0..2)
        .map(|_| {
            let t = MemTarget::new(size, None);
            let r = pages::run(&t, &c, &s).unwrap();
            assert!(r.prefill_s.is_some());
            assert_eq!(r.verified_bytes, size as u64);
            let log = t.log.lock().unwrap().clone();
            // The fill (writes) comes entirely before the reads.
            let first_read = log.iter().position(|e| !e.0).unwrap();
            assert_eq!(first_read, size / 16384);
            assert!(log[first_read..].iter().all(|e| !e.0));
            log[first_read..]
                .iter()
                .map(|e| e.1)
                .filter(|&o| o < 1 << 20)
                .collect()
        })
        .collect();
    let mut sorted = orders[0].clone();
    sorted.sort();
    assert_eq!(sorted, (0..64).map(|i| i * 16384).collect::<Vec<_>>());
    assert_ne!(orders[0], sorted, "random order is not sequential");
    assert_eq!(orders[0], orders[1], "same seed, same order");
}

#[test]
fn read_mismatch_is_an_error_naming_offset_and_target() {
    let size = 1 << 20;
    let bad = 5 * 65536 + 123;
    let t = MemTarget::new(size, Some(bad));
    let err = pages::run(&t, &corpus(), &spec(Rw::Read, 65536, 1, size as u64)).unwrap_err();
    let e = err.downcast_ref::<PagesError>().expect("a PagesError");
    match e {
        PagesError::Mismatch {
            target,
            offset,
            first_bad,
            ..
        } => {
            assert_eq!(target, "mem");
            assert_eq!(*offset, 5 * 65536);
            assert_eq!(*first_bad, bad);
        }
        other => panic!("unexpected {other:?}"),
    }
    let msg = format!("{err:#}");
    assert!(
        msg.contains("mem") && msg.contains(&(5 * 65536).to_string()),
        "{msg}"
    );
}

#[test]
fn write_readback_catches_corruption_and_no_verify_does_not_read() {
    let size = 1 << 20;
    let t = MemTarget::new(size, Some(7 * 4096 + 1)); // block 7 is in the 1-in-7 sample
    let err = pages::run(&t, &corpus(), &spec(Rw::Write, 4096, 1, size as u64)).unwrap_err();
    assert!(format!("{err:#}").contains("reading back"), "{err:#}");

    let t = MemTarget::new(size, Some(7 * 4096 + 1));
    let mut s = spec(Rw::RandWrite, 4096, 1, size as u64);
    s.verify = false;
    let r = pages::run(&t, &corpus(), &s).unwrap();
    assert_eq!(r.verified_bytes, 0);
    assert!(t.log.lock().unwrap().iter().all(|e| e.0));
}

#[test]
fn size_larger_than_target_is_an_error() {
    let t = MemTarget::new(1 << 20, None);
    let err = pages::run(&t, &corpus(), &spec(Rw::Write, 4096, 1, 2 << 20)).unwrap_err();
    assert!(matches!(
        err.downcast_ref::<PagesError>(),
        Some(PagesError::LargerThanTarget { .. })
    ));
}

#[test]
fn auto_reports_its_settled_state_and_the_other_policies_do_not() {
    use zmem_bench::zmem_target::{open, ZmemTargetConfig};
    let c = corpus();
    let s = spec(Rw::Write, 4096, 1, 4 << 20);
    let run = |policy: &str| {
        let t = open(&ZmemTargetConfig {
            size: 4 << 20,
            policy: policy.into(),
            block: None,
            mem_limit: None,
            backend: zmem_bench::offload::BackendKind::Cpu,
        })
        .unwrap();
        let r = pages::run(t.as_ref(), &c, &s).unwrap();
        // Settling must leave every page readable as written.
        assert_eq!(pages::verify_contents(t.as_ref(), &c, &s).unwrap(), 4 << 20);
        r
    };
    let auto = run("auto");
    let settled = auto.settled.as_ref().expect("auto has an idle pass");
    assert_eq!(settled.memory.orig_data_size, auto.memory.orig_data_size);
    // lz4 pages recompressed as zstd-1 blocks take less memory.
    assert!(
        settled.ratio_mem_used.unwrap() > auto.ratio_mem_used.unwrap() * 1.1,
        "{auto:?}"
    );
    assert!(auto.summary().contains("settled"), "{}", auto.summary());
    let fast = run("fast");
    assert!(fast.settled.is_none());
    assert!(!fast.summary().contains("settled"));
}
