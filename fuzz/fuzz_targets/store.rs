//! Arbitrary operation sequences against a PageStore and a model: every read matches.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::collections::HashMap;
use zmem_engine::Policy;
use zmem_store::{PageStore, StoreConfig};

const PS: usize = 4096;
const PAGES: u64 = 32;

fn page(kind: u8, seed: u8) -> Vec<u8> {
    match kind % 3 {
        0 => vec![seed; PS],
        1 => (0..PS).map(|i| (i as u8).wrapping_mul(seed | 1)).collect(),
        _ => format!("{seed} text {kind} ").repeat(PS).into_bytes()[..PS].to_vec(),
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&first, ops)) = data.split_first() else { return };
    let mut cfg = StoreConfig::new(PAGES, Policy::ALL[first as usize % 4]);
    cfg.block_pages = [1, 4, 16][(first as usize / 4) % 3];
    cfg.engine.cpu_workers = 1;
    let store = PageStore::new(cfg).unwrap();
    let mut model: HashMap<u64, Vec<u8>> = HashMap::new();
    for op in ops.chunks_exact(4) {
        let i = u64::from(op[1]) % PAGES;
        match op[0] % 5 {
            0 => {
                let p = page(op[2], op[3]);
                store.write(i, &p).unwrap();
                model.insert(i, p);
            }
            1 => {
                let n = (u64::from(op[2]) % 16 + 1).min(PAGES - i);
                let pages: Vec<Vec<u8>> = (0..n).map(|k| page(op[3], k as u8)).collect();
                store.write_async(i, &pages.concat()).unwrap();
                for (k, p) in pages.into_iter().enumerate() {
                    model.insert(i + k as u64, p);
                }
            }
            2 => {
                store.discard(i).unwrap();
                model.remove(&i);
            }
            3 => {
                let mut b = vec![0u8; PS];
                store.read(i, &mut b).unwrap();
                assert_eq!(b, model.get(&i).cloned().unwrap_or(vec![0; PS]));
            }
            _ => {
                store.compact();
            }
        }
    }
    store.flush().unwrap();
});
