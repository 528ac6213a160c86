//! `libzmem_preload.so`: with `LD_PRELOAD`, an unmodified program's heap lives in a zmem
//! region. It exports the C allocator (malloc, free, calloc, realloc, posix_memalign,
//! aligned_alloc, memalign, valloc, pvalloc, malloc_usable_size, reallocarray) and jemalloc's
//! extended API (mallocx & co., nallocx, mallctl, malloc_stats_print), all served by mimalloc 3
//! from an arena over the region, so the program's cold pages are compressed and a touch brings
//! them back. Configuration: the `ZMEM_*` variables (zmem_runenv), normally set by `zmem run`.
//!
//! Why interposition and not jemalloc's extent hooks: one allocator serves every program the
//! same way (glibc-malloc programs such as memcached and jemalloc programs such as Debian's
//! redis-server), the heap's layout is mimalloc's (size-segregated pages, so an object's cold
//! neighbours compress together), and nothing depends on which jemalloc a program was built
//! with. jemalloc's own API is answered consistently from the same heap (docs/DESIGN-NOTES.md,
//! "The preload library").
//!
//! Rules that keep it safe: nothing here panics across the C boundary (every entry point is
//! either panic-free or catches); zmem's own threads and the thread that starts zmem allocate
//! from an internal heap that is not in the region, so they never fault on memory they serve;
//! fork is handled by the region (pthread_atfork + the userfaultfd FORK event).

mod ends;
mod fds;
mod guarded;
mod heap;
mod jemalloc;
mod lazy;
mod logging;
mod maps;
mod mi;
mod runtime;
mod server;
mod threads;

use std::ffi::c_void;

#[global_allocator]
static GLOBAL: heap::InternalAlloc = heap::InternalAlloc;

/// Starts zmem when the library is loaded, before the program's main (unless a malloc came
/// first, which starts it then), or makes the process lazy (lazy.rs).
#[used]
#[link_section = ".init_array"]
static START: extern "C" fn() = {
    extern "C" fn start() {
        runtime::begin();
    }
    start
};

/// Before any constructor of the library without a priority (zmem-heap's among them):
/// mimalloc's process start waits for zmem's own start in this process (runtime::start),
/// which a process the run execs may never reach (lazy.rs).
#[used]
#[link_section = ".init_array.00100"]
static DEFER_MIMALLOC_START: extern "C" fn() = {
    extern "C" fn defer() {
        mi::defer_process_start();
    }
    defer
};

use zmem_os::PAGE_SIZE as PAGE;

#[inline]
unsafe fn alloc(size: usize) -> *mut c_void {
    heap::alloc(size, 8, false, runtime::use_program_heap_for(size))
}

#[inline]
unsafe fn alloc_zeroed(size: usize) -> *mut c_void {
    heap::alloc(size, 8, true, runtime::use_program_heap_for(size))
}

#[inline]
unsafe fn alloc_aligned(size: usize, align: usize, zero: bool) -> *mut c_void {
    heap::alloc(size, align, zero, runtime::use_program_heap_for(size))
}

#[inline]
unsafe fn resize(p: *mut c_void, size: usize) -> *mut c_void {
    runtime::count_if_lazy(size);
    heap::realloc(p, size, 8)
}

#[inline]
unsafe fn resize_aligned(p: *mut c_void, size: usize, align: usize) -> *mut c_void {
    runtime::count_if_lazy(size);
    heap::realloc(p, size, align)
}

/// Sets the calling thread's errno (the interposed calls report errors as the C library does).
pub(crate) fn set_errno(e: i32) {
    zmem_os::Errno::set(e)
}

/// # Safety
/// C's malloc.
#[no_mangle]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    alloc(size)
}

/// # Safety
/// C's calloc.
#[no_mangle]
pub unsafe extern "C" fn calloc(count: usize, size: usize) -> *mut c_void {
    match count.checked_mul(size) {
        Some(n) => alloc_zeroed(n),
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// C's realloc (glibc's behaviour: size 0 frees and returns NULL).
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    if p.is_null() {
        return alloc(size);
    }
    if size == 0 {
        heap::free(p);
        return std::ptr::null_mut();
    }
    resize(p, size)
}

/// # Safety
/// glibc's reallocarray.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, count: usize, size: usize) -> *mut c_void {
    match count.checked_mul(size) {
        Some(n) => realloc(p, n),
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// C's free.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    heap::free(p)
}

/// # Safety
/// The old name of free.
#[no_mangle]
pub unsafe extern "C" fn cfree(p: *mut c_void) {
    heap::free(p)
}

/// # Safety
/// POSIX posix_memalign.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> i32 {
    if out.is_null() {
        return libc::EINVAL;
    }
    if !align.is_power_of_two() || align % std::mem::size_of::<*mut c_void>() != 0 {
        return libc::EINVAL;
    }
    let p = alloc_aligned(size, align, false);
    if p.is_null() {
        return libc::ENOMEM;
    }
    *out = p;
    0
}

/// # Safety
/// C11 aligned_alloc.
#[no_mangle]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    if !align.is_power_of_two() {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    alloc_aligned(size, align, false)
}

/// # Safety
/// memalign (glibc: the alignment is rounded up to a power of two).
#[no_mangle]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    let Some(a) = align.max(1).checked_next_power_of_two() else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    alloc_aligned(size, a, false)
}

/// # Safety
/// valloc: page aligned.
#[no_mangle]
pub unsafe extern "C" fn valloc(size: usize) -> *mut c_void {
    alloc_aligned(size, PAGE, false)
}

/// # Safety
/// pvalloc: page aligned, size rounded up to pages.
#[no_mangle]
pub unsafe extern "C" fn pvalloc(size: usize) -> *mut c_void {
    match size.max(1).checked_next_multiple_of(PAGE) {
        Some(n) => alloc_aligned(n, PAGE, false),
        None => {
            set_errno(libc::ENOMEM);
            std::ptr::null_mut()
        }
    }
}

/// # Safety
/// malloc_usable_size.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    heap::usable_size(p)
}

/// # Safety
/// glibc's malloc_trim: gives freed memory back (to the region, which drops it).
#[no_mangle]
pub unsafe extern "C" fn malloc_trim(_pad: usize) -> i32 {
    if runtime::use_program_heap() {
        mi::mi_collect(true);
    }
    1
}

// The program's own mappings (maps.rs): private anonymous ones are served from the region's
// map space; everything else goes to the kernel as before.

/// Runs `call`, one of the program's mapping calls, leaving errno as the program had it unless
/// the call returns `failed` (the region's own calls on the way may fail and be handled).
fn keep_errno_unless<T: PartialEq>(failed: T, call: impl FnOnce() -> T) -> T {
    let errno = zmem_os::errno::KeepErrno::new();
    let r = call();
    if r == failed {
        errno.dismiss();
    }
    r
}

/// # Safety
/// C's mmap.
#[no_mangle]
pub unsafe extern "C" fn mmap(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: libc::off_t,
) -> *mut c_void {
    keep_errno_unless(libc::MAP_FAILED, || {
        maps::mmap(addr, len, prot, flags, fd, off)
    })
}

/// # Safety
/// glibc's mmap64 (the same call on 64-bit systems).
#[no_mangle]
pub unsafe extern "C" fn mmap64(
    addr: *mut c_void,
    len: usize,
    prot: i32,
    flags: i32,
    fd: i32,
    off: libc::off_t,
) -> *mut c_void {
    mmap(addr, len, prot, flags, fd, off)
}

/// # Safety
/// C's munmap.
#[no_mangle]
pub unsafe extern "C" fn munmap(addr: *mut c_void, len: usize) -> i32 {
    keep_errno_unless(-1, || maps::munmap(addr, len))
}

/// # Safety
/// Linux's mremap. It is variadic in C (`new_address` only with `MREMAP_FIXED`); on the 64-bit
/// ABIs Linux runs on, a fifth integer argument travels in the same register either way, and
/// it is read only when the flag says it was passed.
#[no_mangle]
pub unsafe extern "C" fn mremap(
    old: *mut c_void,
    old_len: usize,
    new_len: usize,
    flags: i32,
    new_addr: *mut c_void,
) -> *mut c_void {
    let new_addr = if flags & libc::MREMAP_FIXED != 0 {
        new_addr
    } else {
        std::ptr::null_mut()
    };
    keep_errno_unless(libc::MAP_FAILED, || {
        maps::mremap(old, old_len, new_len, flags, new_addr)
    })
}

/// # Safety
/// C's madvise.
#[no_mangle]
pub unsafe extern "C" fn madvise(addr: *mut c_void, len: usize, advice: i32) -> i32 {
    keep_errno_unless(-1, || maps::madvise(addr, len, advice))
}

/// # Safety
/// C's mprotect.
#[no_mangle]
pub unsafe extern "C" fn mprotect(addr: *mut c_void, len: usize, prot: i32) -> i32 {
    keep_errno_unless(-1, || maps::mprotect(addr, len, prot))
}
