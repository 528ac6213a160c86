//! The heap against a model: blocks allocated, resized and freed at random with their contents
//! checked, through many times the budget so that pages are evicted and faulted back; calloc,
//! foreign pointers, destroy with live blocks, an SSD tier under the heap, several arenas.

mod support;

use std::collections::HashMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use zmem_heap::{Budget, Heap, HeapError, RegionConfig, ARENA_CHUNK};

use support::{fill, first_wrong, heap, heap_with};

/// A live block of the model: address, size asked for, pattern seed.
#[derive(Clone, Copy)]
struct Block {
    addr: usize,
    size: usize,
    seed: u64,
}

/// Random sizes: mostly small objects, some pages, a few large blocks.
fn size_of(rng: &mut StdRng) -> usize {
    match rng.random_range(0..100) {
        0..=69 => rng.random_range(0..=512),
        70..=94 => rng.random_range(512..=16 << 10),
        _ => rng.random_range(16 << 10..=512 << 10),
    }
}

#[test]
fn random_operations_match_the_model_through_eviction() {
    // 20 MiB live on average through a 4 MiB budget; 200,000 operations.
    let Some(h) = heap(256 << 20, 4 << 20) else {
        return;
    };
    let mut rng = StdRng::seed_from_u64(0x5eed);
    let mut live: Vec<Block> = Vec::new();
    let mut seed = 0u64;
    let mut bytes = 0usize;
    for op in 0..200_000u32 {
        let roll = rng.random_range(0..100);
        if live.is_empty() || (roll < 45 && bytes < 24 << 20) {
            let size = size_of(&mut rng);
            seed += 1;
            let p = if roll % 3 == 0 {
                let q = h.calloc(1, size).unwrap();
                // SAFETY: a fresh zeroed block of size bytes.
                let s = unsafe { std::slice::from_raw_parts(q.as_ptr(), size) };
                assert!(s.iter().all(|&b| b == 0), "calloc at op {op}");
                q
            } else {
                h.malloc(size).unwrap()
            };
            // SAFETY: fresh block of at least size bytes.
            unsafe {
                assert!(h.usable_size(p.as_ptr()).unwrap() >= size);
                fill(p.as_ptr(), size, seed);
            }
            live.push(Block {
                addr: p.as_ptr() as usize,
                size,
                seed,
            });
            bytes += size;
            continue;
        }
        let i = rng.random_range(0..live.len());
        let b = live[i];
        // SAFETY: b is a live block of h whose first b.size bytes hold its pattern.
        unsafe {
            assert_eq!(
                first_wrong(b.addr as *const u8, b.size, b.seed),
                None,
                "op {op}: block of {} bytes",
                b.size
            );
        }
        if roll < 75 {
            // Resize: the common prefix survives, the rest gets the new pattern.
            let size = size_of(&mut rng);
            // SAFETY: b is live; on success it is replaced by the returned block.
            let q = unsafe { h.realloc(b.addr as *mut u8, size) }.unwrap();
            // SAFETY: q holds at least size bytes, the first min(old, new) copied.
            unsafe {
                let keep = b.size.min(size);
                assert_eq!(first_wrong(q.as_ptr(), keep, b.seed), None, "realloc");
                seed += 1;
                fill(q.as_ptr(), size, seed);
            }
            bytes = bytes - b.size + size;
            live[i] = Block {
                addr: q.as_ptr() as usize,
                size,
                seed,
            };
        } else {
            // SAFETY: b is live and leaves the model.
            unsafe { h.free(b.addr as *mut u8) }.unwrap();
            bytes -= b.size;
            live.swap_remove(i);
        }
    }
    // Everything still there, in a different order than written.
    for b in live.iter().rev() {
        // SAFETY: live blocks of h.
        unsafe { assert_eq!(first_wrong(b.addr as *const u8, b.size, b.seed), None) };
    }
    let s = h.stats();
    assert_eq!(s.live_blocks, live.len() as u64);
    assert!(s.allocated >= bytes as u64, "{} < {bytes}", s.allocated);
    assert!(s.region.evictions > 10_000, "{:?}", s.region);
    assert!(s.region.major_faults > 10_000, "{:?}", s.region);
    assert!(s.metadata > 0 && s.metadata_resident <= s.metadata);
    // No two live blocks overlap.
    let mut spans: Vec<(usize, usize)> = live.iter().map(|b| (b.addr, b.addr + b.size)).collect();
    spans.sort_unstable();
    assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
    eprintln!(
        "model: {} live blocks, {} MiB allocated, {} evictions, {} major faults, {} MiB \
         decommitted, metadata {} KiB resident of {} KiB",
        s.live_blocks,
        s.allocated >> 20,
        s.region.evictions,
        s.region.major_faults,
        s.decommitted >> 20,
        s.metadata_resident >> 10,
        s.metadata >> 10
    );
}

#[test]
fn calloc_zeroes_reused_memory_and_refuses_overflow() {
    let Some(h) = heap(64 << 20, 1 << 20) else {
        return;
    };
    // Dirty blocks of every small size class, freed, then calloc'd again.
    let dirty: Vec<_> = (1..2000)
        .map(|i| {
            let p = h.malloc(i).unwrap();
            // SAFETY: fresh block of i bytes.
            unsafe { std::ptr::write_bytes(p.as_ptr(), 0xa5, i) };
            p
        })
        .collect();
    for p in dirty {
        // SAFETY: live blocks.
        unsafe { h.free(p.as_ptr()) }.unwrap();
    }
    for i in 1..2000 {
        let p = h.calloc(i, 3).unwrap();
        // SAFETY: a block of 3 * i bytes.
        let s = unsafe { std::slice::from_raw_parts(p.as_ptr(), 3 * i) };
        assert!(s.iter().all(|&b| b == 0), "calloc({i}, 3)");
    }
    assert!(matches!(
        h.calloc(usize::MAX / 2, 3),
        Err(HeapError::Overflow { count, size: 3 }) if count == usize::MAX / 2
    ));
    let e = h.calloc(1 << 40, 1 << 40).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!("calloc of {} x {} bytes overflows", 1u64 << 40, 1u64 << 40)
    );
    // Zero elements is a valid (unique) block.
    let z = h.calloc(0, 8).unwrap();
    // SAFETY: a live block.
    unsafe { h.free(z.as_ptr()) }.unwrap();
}

#[test]
fn foreign_pointers_are_refused_and_left_alone() {
    let Some(h) = heap(64 << 20, 4 << 20) else {
        return;
    };
    let Some(other) = heap(64 << 20, 4 << 20) else {
        return;
    };
    let mine = h.malloc(64).unwrap().as_ptr();
    let theirs = other.malloc(64).unwrap().as_ptr();
    let mut on_stack = [0u64; 4];
    let boxed = Box::new([7u8; 32]);
    let base = h.region().as_ptr();
    let candidates: Vec<(&str, *mut u8)> = vec![
        ("another heap's block", theirs),
        ("the stack", on_stack.as_mut_ptr().cast()),
        ("the process heap", boxed.as_ptr() as *mut u8),
        ("the region's first byte (arena metadata)", base),
        // SAFETY (for the pointer arithmetic): inside our region.
        ("the middle of a block, misaligned", unsafe { mine.add(3) }),
        ("unused arena space", unsafe { base.add(48 << 20) }),
        ("just past the heap", unsafe {
            base.add(h.capacity() as usize + (64 << 10))
        }),
        ("address 8", 8usize as *mut u8),
    ];
    for (what, p) in candidates {
        // SAFETY: free, realloc and usable_size refuse pointers that are not blocks of h
        // before touching them.
        unsafe {
            match h.free(p) {
                Err(HeapError::Foreign { addr }) => assert_eq!(addr, p as usize, "{what}"),
                other => panic!("{what}: free gave {other:?}"),
            }
            assert!(
                matches!(h.realloc(p, 100), Err(HeapError::Foreign { .. })),
                "{what}"
            );
            assert!(
                matches!(h.usable_size(p), Err(HeapError::Foreign { .. })),
                "{what}"
            );
        }
    }
    let e = HeapError::Foreign { addr: 0x1000 };
    assert_eq!(e.to_string(), "0x1000 is not a block of this heap");
    // Nothing was disturbed: both blocks are still theirs, the stats unchanged.
    assert_eq!(h.stats().live_blocks, 1);
    assert_eq!(other.stats().live_blocks, 1);
    assert_eq!(boxed[31], 7);
    // SAFETY: live blocks of each heap, NULL a no-op.
    unsafe {
        h.free(std::ptr::null_mut()).unwrap();
        h.free(mine).unwrap();
        other.free(theirs).unwrap();
    }
}

#[test]
fn destroy_with_live_blocks_then_heaps_keep_working() {
    for round in 0..3u64 {
        let Some(h) = heap(128 << 20, 2 << 20) else {
            return;
        };
        // 32 MiB of live blocks through a 2 MiB budget, left live.
        let mut blocks = Vec::new();
        for i in 0..4096u64 {
            let size = 8 << 10;
            let p = h.malloc(size).unwrap();
            // SAFETY: fresh block.
            unsafe { fill(p.as_ptr(), size, round << 32 | i) };
            blocks.push(p);
        }
        let s = h.stats();
        assert_eq!(s.live_blocks, 4096);
        assert!(s.region.evictions > 0);
        // SAFETY: a live block (checks one came back from the compressed tier).
        unsafe { assert_eq!(first_wrong(blocks[0].as_ptr(), 8 << 10, round << 32), None) };
        drop(h);
    }
}

#[test]
fn a_block_larger_than_the_heap_is_out_of_memory() {
    let Some(h) = heap(64 << 20, 4 << 20) else {
        return;
    };
    match h.malloc(100 << 20) {
        Err(HeapError::OutOfMemory { size, capacity }) => {
            assert_eq!(size, 100 << 20);
            assert_eq!(capacity, 64 << 20);
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        h.malloc(usize::MAX),
        Err(HeapError::OutOfMemory { .. })
    ));
    // Filling the heap ends in OutOfMemory too, and it recovers after frees.
    let mut blocks = Vec::new();
    let err = loop {
        match h.malloc(1 << 20) {
            Ok(p) => blocks.push(p),
            Err(e) => break e,
        }
    };
    assert!(matches!(err, HeapError::OutOfMemory { .. }), "{err}");
    assert!(blocks.len() >= 50, "{} MiB fit in 64", blocks.len());
    for p in blocks.drain(..) {
        // SAFETY: live blocks.
        unsafe { h.free(p.as_ptr()) }.unwrap();
    }
    h.malloc(1 << 20).unwrap();
    // SAFETY: a live block; realloc beyond the heap fails and leaves it alone.
    unsafe {
        let p = h.malloc(100).unwrap();
        fill(p.as_ptr(), 100, 9);
        assert!(matches!(
            h.realloc(p.as_ptr(), 1 << 30),
            Err(HeapError::OutOfMemory { .. })
        ));
        assert_eq!(first_wrong(p.as_ptr(), 100, 9), None);
    }
}

#[test]
fn configurations_a_heap_refuses() {
    let e = Heap::new(RegionConfig::new(1 << 20, Budget::Fixed(1 << 20)))
        .err()
        .unwrap();
    assert!(e.to_string().contains("below the smallest heap"), "{e}");
    let e = Heap::new(RegionConfig::new(u64::MAX, Budget::Fixed(1 << 20)))
        .err()
        .unwrap();
    assert!(matches!(e, HeapError::Config(_)), "{e}");
    // The region's own checks come through as region errors.
    let e = Heap::new(RegionConfig::new(64 << 20, Budget::Fixed(4096)))
        .err()
        .unwrap();
    assert!(matches!(e, HeapError::Region(_)), "{e}");
}

#[test]
fn an_ssd_tier_under_the_heap() {
    let dir = tempfile::tempdir().unwrap();
    let log = zmem_tier::Log::open(zmem_tier::LogConfig::new(dir.path(), 128 << 20))
        .expect("open the SSD log");
    let mut cfg = RegionConfig::new(64 << 20, Budget::Fixed(1 << 20));
    cfg.store_limit = Some(1 << 20);
    cfg.lower = Some(zmem_store::LowerConfig::new(log));
    let Some(h) = heap_with(cfg) else {
        return;
    };
    // 24 MiB of 2:1 data through 1 MiB of DRAM and 1 MiB of compressed pool: most of it goes to
    // the log.
    let blocks: Vec<_> = (0..6000u64)
        .map(|i| {
            let size = 4000;
            let p = h.malloc(size).unwrap();
            // SAFETY: fresh block.
            unsafe { fill(p.as_ptr(), size, i) };
            p
        })
        .collect();
    // The writeback thread moves the pool's oldest pages to the log in the background: wait
    // for it (a loaded machine may take more than a moment).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while h.stats().region.store.writeback_pages == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    for (i, p) in blocks.iter().enumerate().rev() {
        // SAFETY: live blocks.
        unsafe { assert_eq!(first_wrong(p.as_ptr(), 4000, i as u64), None, "block {i}") };
    }
    let s = h.stats();
    let st = &s.region.store;
    assert!(
        st.writeback_pages > 0 && st.lower_reads > 0,
        "the SSD tier was not used: {st:?}"
    );
    assert_eq!(st.lower_errors, 0);
    eprintln!(
        "ssd: {} pages written back, {} read back, {} on the log now",
        st.writeback_pages, st.lower_reads, st.lower_pages
    );
}

#[test]
fn a_heap_of_several_arenas_spills_into_the_next() {
    // 17 GiB of address space: arenas of 8, 8 and 1 GiB.
    let Some(h) = heap(17 << 30, 8 << 20) else {
        return;
    };
    let s = h.stats();
    assert_eq!(s.arenas, 3);
    assert_eq!(s.capacity, 17 << 30);
    let big = 6usize << 30;
    let start = h.region().as_ptr() as usize;
    let arena = |p: *mut u8| (p as usize - start) / ARENA_CHUNK;
    let a = h.malloc(big).unwrap();
    // Allocated while the first arena is still the one tried first.
    let s = h.malloc(4096).unwrap();
    assert_eq!(arena(s.as_ptr()), arena(a.as_ptr()));
    let b = h.malloc(big).unwrap();
    assert_ne!(
        arena(a.as_ptr()),
        arena(b.as_ptr()),
        "two 6 GiB blocks, one per arena"
    );
    // Small blocks still work, in whichever arena has room.
    let mut small = HashMap::new();
    for i in 0..1000u64 {
        let p = h.malloc(100).unwrap();
        // SAFETY: fresh block.
        unsafe { fill(p.as_ptr(), 100, i) };
        small.insert(i, p);
    }
    // A resize that does not fit its arena moves to another one (b's, once b is gone). The
    // 6 GiB blocks are never touched (address space only).
    // SAFETY: live blocks; the first arena cannot hold 3 GiB more.
    unsafe {
        h.free(b.as_ptr()).unwrap();
        fill(s.as_ptr(), 4096, 77);
        let c = h.realloc(s.as_ptr(), 3 << 30).unwrap();
        assert_ne!(arena(c.as_ptr()), arena(a.as_ptr()));
        assert_eq!(first_wrong(c.as_ptr(), 4096, 77), None);
        for (i, p) in &small {
            assert_eq!(first_wrong(p.as_ptr(), 100, *i), None);
            h.free(p.as_ptr()).unwrap();
        }
        h.free(a.as_ptr()).unwrap();
        h.free(c.as_ptr()).unwrap();
    }
    assert_eq!(h.stats().live_blocks, 0);
}

#[test]
fn realloc_of_null_allocates_and_to_zero_keeps_a_minimal_block() {
    let Some(h) = heap(32 << 20, 1 << 20) else {
        return;
    };
    // SAFETY: every pointer passed is NULL or a live block of h.
    unsafe {
        let p = h.realloc(std::ptr::null_mut(), 100).unwrap();
        fill(p.as_ptr(), 100, 5);
        let q = h.realloc(p.as_ptr(), 0).unwrap();
        assert!(h.usable_size(q.as_ptr()).is_ok());
        assert_eq!(h.stats().live_blocks, 1);
        h.free(q.as_ptr()).unwrap();
        let s = h.stats();
        assert_eq!((s.live_blocks, s.allocated), (0, 0));
    }
}
