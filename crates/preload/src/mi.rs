//! mimalloc 3's C API as zmem declares it, once, in zmem-heap (the preload library's main heap
//! and `zmem_heap` use the same mimalloc).

pub use zmem_heap::mi::*;
