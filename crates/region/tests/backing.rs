//! A region runs over any [`BackingStore`]: here a HashMap of pages, with no compression. Skips
//! (with the reason) where /dev/userfaultfd cannot be opened.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use parking_lot::Mutex;
use zmem_region::{BackingStore, Budget, Region, RegionConfig, StoreFactory, PAGE};
use zmem_store::{StoreError, StoreStats};

mod support;
use support::*;

/// Pages kept as they are, by index.
#[derive(Default)]
struct MapStore {
    pages: Mutex<HashMap<u64, Box<[u8]>>>,
    writes: Arc<AtomicU64>,
}

impl BackingStore for MapStore {
    fn write(&self, index: u64, page: &[u8]) -> Result<(), StoreError> {
        self.writes.fetch_add(1, Relaxed);
        self.pages.lock().insert(index, page.into());
        Ok(())
    }
    fn read(&self, index: u64, buf: &mut [u8]) -> Result<(), StoreError> {
        match self.pages.lock().get(&index) {
            Some(p) => buf.copy_from_slice(p),
            None => buf.fill(0),
        }
        Ok(())
    }
    fn discard(&self, index: u64) -> Result<(), StoreError> {
        self.pages.lock().remove(&index);
        Ok(())
    }
    fn stats(&self) -> StoreStats {
        let n = self.pages.lock().len() as u64 * PAGE as u64;
        StoreStats {
            orig_data_size: n,
            compr_data_size: n,
            mem_used_total: n,
            ..Default::default()
        }
    }
}

#[test]
fn a_region_round_trips_through_a_test_store() {
    let writes = Arc::new(AtomicU64::new(0));
    let w = writes.clone();
    let factory: StoreFactory = Arc::new(move || {
        Ok(Box::new(MapStore {
            writes: w.clone(),
            ..Default::default()
        }) as Box<dyn BackingStore>)
    });
    let cfg = RegionConfig::new(8 * MIB, Budget::Fixed(MIB));
    let Some(r) = skip_without_uffd(Region::with_store(cfg, factory)) else {
        return;
    };
    fill_and_check_all(&r, 1);
    let s = r.stats();
    assert!(s.evictions > 0 && s.major_faults > 0, "{s:?}");
    assert!(writes.load(Relaxed) >= s.evictions);
    assert!(s.resident <= MIB);
    // What is not resident (or staged) is in the test store, as whole pages.
    assert!(s.store.orig_data_size >= (8 * MIB - MIB - s.staged) / 2);
}
