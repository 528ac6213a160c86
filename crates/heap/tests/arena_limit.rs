//! mimalloc 3.3 never removes an arena, and its table holds 160: a process can create only so
//! many heaps in its lifetime. When the table is full, creating a heap fails with a clear
//! error (and leaves nothing behind), never a crash. Its own test binary: it uses up the table.

mod support;

use zmem_heap::{Budget, Heap, HeapError, RegionConfig, MIMALLOC_MAX_ARENAS};

#[test]
fn heaps_past_mimallocs_arena_table_are_refused_clearly() {
    let Some(first) = support::heap(32 << 20, 1 << 20) else {
        return;
    };
    let p = first.malloc(1000).unwrap();
    let mut created = 1;
    let err = loop {
        match Heap::new(RegionConfig::new(32 << 20, Budget::Fixed(1 << 20))) {
            Ok(h) => {
                // Each one works, then is destroyed: its arena stays taken.
                let q = h.malloc(100).unwrap();
                // SAFETY: a live block of h.
                unsafe { h.free(q.as_ptr()) }.unwrap();
                created += 1;
            }
            Err(e) => break e,
        }
        assert!(created <= MIMALLOC_MAX_ARENAS, "no limit reached");
    };
    assert!(created >= 100, "only {created} heaps");
    let text = err.to_string();
    assert!(matches!(err, HeapError::Arena { .. }), "{text}");
    assert!(text.contains("never removes"), "{text}");
    eprintln!("{created} heaps, then: {text}");
    // The heap made first still works.
    // SAFETY: a live block of `first`.
    unsafe {
        support::fill(p.as_ptr(), 1000, 3);
        assert_eq!(support::first_wrong(p.as_ptr(), 1000, 3), None);
        first.free(p.as_ptr()).unwrap();
    }
}
