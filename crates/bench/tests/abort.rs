//! The abort flag (set by SIGINT/SIGTERM) stops a run with `Interrupted` so guards run. Its own
//! test binary: the flag is process-wide and stays set.

use std::sync::Mutex;

use zmem_bench::abort::{self as b, Interrupted};
use zmem_bench::corpus::Corpus;
use zmem_bench::kernel::zram::{self, ZramSession};
use zmem_bench::pages::{self, PagesSpec, Rw};
use zmem_bench::target::{MemoryReport, PageTarget};

struct Sink(Mutex<u64>);

impl PageTarget for Sink {
    fn name(&self) -> String {
        "sink".into()
    }
    fn size_bytes(&self) -> u64 {
        1 << 30
    }
    fn write_at(&self, _offset: u64, _buf: &[u8]) -> anyhow::Result<()> {
        *self.0.lock().unwrap() += 1;
        Ok(())
    }
    fn read_at(&self, _offset: u64, _buf: &mut [u8]) -> anyhow::Result<()> {
        *self.0.lock().unwrap() += 1;
        Ok(())
    }
    fn flush(&self) -> anyhow::Result<()> {
        Ok(())
    }
    fn memory(&self) -> anyhow::Result<MemoryReport> {
        Ok(MemoryReport::default())
    }
}

#[test]
fn abort_flag_interrupts_runs_and_the_zram_guard_still_restores() {
    let corpus = Corpus::from_bytes("t", vec![7u8; 10_000]).unwrap();
    let spec = PagesSpec {
        rw: Rw::Read,
        bs: 4096,
        jobs: 2,
        size: 1 << 30,
        verify: true,
    };
    let zram = ZramSession::acquire(0);

    b::request_abort();
    assert!(b::aborted());
    assert!(b::check_abort().is_err());

    let sink = Sink(Mutex::new(0));
    let err = pages::run(&sink, &corpus, &spec).unwrap_err();
    assert!(
        err.root_cause().downcast_ref::<Interrupted>().is_some(),
        "{err:#}"
    );
    assert!(format!("{err:#}").ends_with("interrupted"), "{err:#}");
    assert_eq!(*sink.0.lock().unwrap(), 0, "no I/O after an abort");

    match zram {
        Ok(mut session) => {
            session.configure("lz4", 32 << 20).unwrap();
            let t = zmem_bench::blockdev::BlockDevTarget::open(&session.device()).unwrap();
            let spec = PagesSpec {
                size: 32 << 20,
                ..spec
            };
            let err = pages::run(&t, &corpus, &spec).unwrap_err();
            assert!(err.root_cause().downcast_ref::<Interrupted>().is_some());
            drop(t);
            drop(session);
            assert_eq!(zram::disksize(0).unwrap(), 0);
        }
        Err(e) => eprintln!("zram part skipped: {e}"),
    }
}
