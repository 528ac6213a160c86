//! The experiment behind the heap's thread model: may one mimalloc 3 heap be used from several
//! threads at once, and may a block be freed by a thread other than the one that allocated it?
//! (mimalloc 3's header says heaps are first-class, usable and freed into from any thread; v2's
//! were thread-local.) Yes to both: these tests allocate from one `Heap` (one mimalloc heap,
//! one arena) on 4 threads at once, hand the blocks to other threads, which check their
//! contents and free them, many times the budget so that pages are evicted and faulted back.

mod support;

use std::sync::mpsc;
use std::sync::Arc;

use support::{fill, first_wrong, heap};

#[test]
fn blocks_move_between_threads() {
    let Some(h) = heap(64 << 20, 4 << 20) else {
        return;
    };
    let h = Arc::new(h);
    const THREADS: usize = 4;
    const BLOCKS: usize = 3000;
    // Each thread allocates, fills and sends its blocks to the next thread, which checks and
    // frees them: every free is a cross-thread free.
    let (senders, receivers): (Vec<_>, Vec<_>) = (0..THREADS)
        .map(|_| mpsc::channel::<(usize, usize, u64)>())
        .unzip();
    let mut handles = Vec::new();
    for (t, rx) in receivers.into_iter().enumerate() {
        let h = h.clone();
        let tx = senders[(t + 1) % THREADS].clone();
        handles.push(std::thread::spawn(move || {
            for i in 0..BLOCKS {
                let size = 16 + (i * 37 + t * 101) % 3000;
                let seed = (t * BLOCKS + i) as u64;
                let p = h.malloc(size).expect("malloc");
                // SAFETY: p is a fresh block of at least size bytes.
                unsafe { fill(p.as_ptr(), size, seed) };
                tx.send((p.as_ptr() as usize, size, seed)).unwrap();
            }
            drop(tx);
            let mut freed = 0;
            for (addr, size, seed) in rx {
                let p = addr as *mut u8;
                // SAFETY: a live block of h that another thread filled and handed over.
                unsafe {
                    assert_eq!(first_wrong(p, size, seed), None, "block {seed}");
                    h.free(p).expect("cross-thread free");
                }
                freed += 1;
            }
            freed
        }));
    }
    drop(senders);
    let freed: usize = handles.into_iter().map(|j| j.join().unwrap()).sum();
    assert_eq!(freed, THREADS * BLOCKS);
    let s = h.stats();
    assert_eq!(s.live_blocks, 0, "{s:?}");
    assert_eq!(s.allocated, 0);
    assert!(
        s.region.evictions > 0,
        "the test must evict: {:?}",
        s.region
    );
}

#[test]
fn threads_allocate_and_free_across_threads() {
    let Some(h) = heap(64 << 20, 2 << 20) else {
        return;
    };
    let h = Arc::new(h);
    // Threads allocate into a shared table and free whatever they find in it, with their own
    // and others' blocks mixed; a thread that exits leaves its pages for the others.
    let slots: Arc<Vec<parking_slot::Slot>> =
        Arc::new((0..4096).map(|_| parking_slot::Slot::default()).collect());
    let mut handles = Vec::new();
    for t in 0..4u64 {
        let (h, slots) = (h.clone(), slots.clone());
        handles.push(std::thread::spawn(move || {
            let mut x = t.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
            for round in 0..40_000u64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let slot = &slots[(x % 4096) as usize];
                let size = 8 + (x >> 20) as usize % 700;
                let seed = t << 32 | round;
                let new = h.malloc(size).expect("malloc");
                // SAFETY: fresh block of size bytes.
                unsafe { fill(new.as_ptr(), size, seed) };
                if let Some((addr, size, seed)) =
                    slot.swap(Some((new.as_ptr() as usize, size, seed)))
                {
                    // SAFETY: the slot owned this live block of h until the swap.
                    unsafe {
                        assert_eq!(first_wrong(addr as *const u8, size, seed), None);
                        h.free(addr as *mut u8).unwrap();
                    }
                }
            }
        }));
    }
    for j in handles {
        j.join().unwrap();
    }
    let live = slots.iter().filter_map(|s| s.swap(None)).count() as u64;
    assert_eq!(h.stats().live_blocks, live);
    // The heap drops with these blocks still live (destroy frees them).
}

/// A slot holding one block, swapped under a mutex.
mod parking_slot {
    use std::sync::Mutex;

    #[derive(Default)]
    pub struct Slot(Mutex<Option<(usize, usize, u64)>>);

    impl Slot {
        pub fn swap(&self, v: Option<(usize, usize, u64)>) -> Option<(usize, usize, u64)> {
            std::mem::replace(&mut *self.0.lock().unwrap(), v)
        }
    }
}

#[test]
fn a_thread_that_used_a_destroyed_heap_allocates_from_another() {
    // The thread's mimalloc state caches the per-thread heap it used last, which lives in the
    // destroyed heap's arena: that range must stay readable (as zeros) after the region goes.
    let Some(a) = heap(64 << 20, 4 << 20) else {
        return;
    };
    let p = a.malloc(100).unwrap();
    // SAFETY: fresh block.
    unsafe { fill(p.as_ptr(), 100, 1) };
    drop(a);
    let b = heap(64 << 20, 4 << 20).unwrap();
    let q = b.malloc(100).unwrap();
    // SAFETY: fresh block.
    unsafe {
        fill(q.as_ptr(), 100, 2);
        assert_eq!(first_wrong(q.as_ptr(), 100, 2), None);
        b.free(q.as_ptr()).unwrap();
    }
    // And a thread that used both exits cleanly.
    std::thread::spawn(move || {
        let r = b.malloc(10).unwrap();
        // SAFETY: live block of b.
        unsafe { b.free(r.as_ptr()).unwrap() };
        drop(b);
    })
    .join()
    .unwrap();
}
