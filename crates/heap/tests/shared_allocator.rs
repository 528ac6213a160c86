//! A process whose global allocator is the mimalloc the heap is built on is refused: zmem's own
//! threads would run mimalloc there, whose collection walks (and purges) every arena, the
//! heap's included, and could wait for a fault only they can serve.

use std::alloc::{GlobalAlloc, Layout};

use zmem_heap::{Budget, Heap, HeapError, RegionConfig};

struct Mimalloc;

// SAFETY: mimalloc's aligned functions meet GlobalAlloc's contract.
unsafe impl GlobalAlloc for Mimalloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: plain call.
        unsafe { libmimalloc_sys::mi_malloc_aligned(layout.size(), layout.align()).cast() }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, _layout: Layout) {
        // SAFETY: ptr came from mi_malloc_aligned.
        unsafe { libmimalloc_sys::mi_free(ptr.cast()) }
    }
}

#[global_allocator]
static GLOBAL: Mimalloc = Mimalloc;

#[test]
fn a_process_allocating_with_the_same_mimalloc_is_refused() {
    let err = Heap::new(RegionConfig::new(64 << 20, Budget::Fixed(4 << 20)))
        .err()
        .expect("refused");
    assert!(matches!(err, HeapError::SharedAllocator), "{err}");
    assert!(err.to_string().contains("system allocator"), "{err}");
}
