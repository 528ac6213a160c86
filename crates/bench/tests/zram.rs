//! ZramSession against the real /dev/zram0, only when root and the device is free.

mod support;

use zmem_bench::blockdev::BlockDevTarget;
use zmem_bench::kernel::zram::{self, ZramError, ZramSession};
use zmem_bench::pages::{self, PagesSpec, Rw};
use zmem_bench::target::PageTarget;

#[test]
fn configure_run_and_restore_zram0() {
    let mut session = match ZramSession::acquire(0) {
        Ok(s) => s,
        Err(e @ (ZramError::NotRoot(_) | ZramError::NoZram(_) | ZramError::InUse { .. })) => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("unexpected error: {e}"),
    };
    let corpus = support::real_or(|| (0..50_000u32).map(|i| (i % 61) as u8).collect());
    let size = 64u64 << 20;
    assert!(matches!(
        session.configure("no-such-alg", size),
        Err(ZramError::UnknownAlgorithm { .. })
    ));
    session.configure("lz4", size).unwrap();
    assert_eq!(session.disksize().unwrap(), size);
    assert_eq!(session.configured(), Some(("lz4", size)));
    {
        let target = BlockDevTarget::open(&session.device()).unwrap();
        assert_eq!(target.name(), "zram0 lz4");
        assert_eq!(target.size_bytes(), size);
        for rw in [Rw::Write, Rw::Read] {
            let spec = PagesSpec {
                rw,
                bs: 4096,
                jobs: 1,
                size: 16 << 20,
                verify: true,
            };
            let r = pages::run(&target, &corpus, &spec).unwrap();
            assert_eq!(r.bytes, 16 << 20);
            assert!(r.memory.orig_data_size > 0, "{:?}", r.memory);
            assert!(r.memory.mem_used_total > 0);
            assert!(r.ratio_mem_used.unwrap() > 1.0, "{:?}", r.ratio_mem_used);
        }
        let m = target.memory().unwrap();
        assert!(
            m.orig_data_size > 0 && m.orig_data_size <= 16 << 20,
            "{m:?}"
        );
    }
    // A second session refuses the device while it is configured.
    assert!(matches!(
        ZramSession::acquire(0),
        Err(ZramError::InUse { .. })
    ));
    drop(session);
    assert_eq!(zram::disksize(0).unwrap(), 0, "zram0 not reset");
}
