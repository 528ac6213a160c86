//! A page store whose asynchronous writes go to the GPU backend (here over the simulated
//! device): what it reads back is what was written, whether the device works, fails or
//! garbles, and the objects the device made are in the pool.

use std::sync::atomic::Ordering::SeqCst;
use std::sync::Arc;

use zmem_engine::{Policy, SharedBackend};
use zmem_gpu::sim::SimDevice;
use zmem_gpu::{GpuBackend, GpuConfig};
use zmem_store::{PageStore, StoreConfig};

const PAGE: usize = 4096;

fn data(pages: usize, seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(pages * PAGE);
    let mut x = seed | 1;
    while v.len() < pages * PAGE {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let w = ["heap ", "object ", "pointer ", "key\n"][(x % 4) as usize];
        v.extend_from_slice(w.as_bytes());
        v.push((x >> 32) as u8);
    }
    v.truncate(pages * PAGE);
    v
}

#[test]
fn a_store_writes_through_the_gpu_backend_and_reads_back_every_page() {
    let cfg = GpuConfig {
        max_chunks: 64,
        max_chunk_bytes: 64 * 1024,
        queue_batches: 64,
        ..GpuConfig::default()
    };
    let (device, faults) = SimDevice::new(&cfg);
    let backend = Arc::new(GpuBackend::with_device(device, cfg).unwrap());
    // `fast` writes lz4, a format the device shares with the CPU (`balanced` writes zstd,
    // which stays on the CPU).
    let mut sc = StoreConfig::new(4096, Policy::Fast);
    sc.accelerator = Some(SharedBackend(backend.clone()));
    // A device taken out of service is probed again soon (each round below waits past it).
    sc.engine.retry_after = std::time::Duration::from_millis(5);
    let store = PageStore::new(sc).unwrap();
    // 1 MiB writes: 256 pages a batch, over the engine's 64 KiB offload size.
    let mut model = vec![0u8; 4096 * PAGE];
    for (round, start) in [0usize, 256, 512, 1024, 2048, 256].into_iter().enumerate() {
        if round == 2 {
            faults.lose_context.store(1, SeqCst);
        }
        if round == 3 {
            faults.corrupt_every.store(3, SeqCst);
        }
        if round == 4 {
            faults.corrupt_every.store(0, SeqCst);
            faults.refuse_every.store(5, SeqCst);
        }
        let d = data(256, round as u64 + 7);
        store.write_async(start as u64, &d).unwrap();
        model[start * PAGE..(start + 256) * PAGE].copy_from_slice(&d);
        // The round's batch completes under the round's faults (write_async returns before
        // compression), and a device rested by a failed round is probed by the next one.
        store.flush().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let mut back = vec![0u8; 4096 * PAGE];
    store.read_batch(0, &mut back).unwrap();
    assert!(
        back == model,
        "the store read back other bytes than were written"
    );
    let e = store.stats().engine;
    assert!(e.jobs_offloaded >= 256, "{e:?}");
    assert!(e.fallbacks > 0 && e.bad_outputs > 0, "{e:?}");
    let g = backend.stats();
    assert!(
        g.pages >= 256 && g.batch_failures >= 1 && g.page_failures > 0,
        "{g:?}"
    );
}
