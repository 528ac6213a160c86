//! A region costs DRAM only for the pages the program touches: creating a huge one must not
//! touch its per-page metadata (the policy's links, the page states, the store's slots), which
//! therefore has to be allocated zeroed (lazily, by the kernel) and mean "nothing" when zero.
//! Skips (with the reason) where /dev/userfaultfd cannot be opened.

use zmem_region::{Budget, Region, RegionConfig, RegionError, PAGE};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// A field of /proc/self/status in bytes (`VmRSS`, `VmHWM`).
fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("read /proc/self/status");
    let line = status
        .lines()
        .find(|l| l.starts_with(field) && l[field.len()..].starts_with(':'))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    let kib: u64 = line[field.len() + 1..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .unwrap_or_else(|e| panic!("{line:?}: {e}"));
    kib * 1024
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

#[test]
fn huge_region_costs_only_what_is_touched() {
    let before = status_bytes("VmRSS");
    let r = match Region::new(RegionConfig::new(64 * GIB, Budget::Fixed(MIB))) {
        Ok(r) => r,
        Err(e @ RegionError::Permission { .. }) => {
            eprintln!("skipped: {e}");
            return;
        }
        Err(e) => panic!("creating a region: {e}"),
    };
    let after = status_bytes("VmRSS");
    let growth = after.saturating_sub(before);
    eprintln!(
        "64 GiB region, 1 MiB budget: VmRSS {:.1} MiB before, {:.1} MiB after creation (+{:.1} MiB)",
        mib(before),
        mib(after),
        mib(growth)
    );
    assert!(
        growth < 8 * MIB,
        "creating a 64 GiB region grew RSS by {:.1} MiB",
        mib(growth)
    );

    // 1000 pages spread over the whole region, far more than the budget holds: each is
    // written, most are evicted, and all read back.
    let pages = r.len() / PAGE;
    let stride = pages / 1000;
    let base = r.as_ptr();
    for k in 0..1000usize {
        let i = k * stride;
        // SAFETY: inside the region, which outlives this loop; one thread.
        unsafe {
            base.add(i * PAGE + (k % PAGE))
                .write_volatile(k as u8 ^ 0x5a)
        };
    }
    for k in 0..1000usize {
        let i = k * stride;
        // SAFETY: as above.
        let v = unsafe { base.add(i * PAGE + (k % PAGE)).read_volatile() };
        assert_eq!(v, k as u8 ^ 0x5a, "page {i}");
    }
    let s = r.stats();
    assert!(s.evictions > 0, "{s:?}");
    assert!(s.major_faults > 0, "{s:?}");
    let touched = status_bytes("VmRSS");
    eprintln!(
        "after touching 1000 pages: VmRSS {:.1} MiB (+{:.1} MiB over creation); {} evictions, {} major faults",
        mib(touched),
        mib(touched.saturating_sub(after)),
        s.evictions,
        s.major_faults
    );
    drop(r);
    eprintln!(
        "after drop: VmRSS {:.1} MiB, peak (VmHWM) {:.1} MiB",
        mib(status_bytes("VmRSS")),
        mib(status_bytes("VmHWM"))
    );
}
