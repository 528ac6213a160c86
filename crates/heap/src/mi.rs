//! The parts of mimalloc 3's C API zmem uses, declared once: the heap's and the preload
//! library's (which re-exports this module). mimalloc is built and linked by
//! libmimalloc-sys (its default version, 3.3); the declarations follow its v3
//! include/mimalloc.h. The crate's own `arena` bindings have `mi_heap_new_in_arena` but not
//! `mi_manage_memory` (arenas with a commit callback), and some of its `extended` bindings name
//! v2 functions that v3 no longer has, so the few functions needed are declared here.

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_long, c_void};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use libmimalloc_sys as _;

/// An opaque mimalloc 3 heap (first-class: any thread may allocate from it).
#[repr(C)]
pub struct mi_heap_t {
    _private: [u8; 0],
}

pub type mi_arena_id_t = *mut c_void;

/// `bool commit_fun(bool commit, void* start, size_t size, bool* is_zero, void* arg)`.
pub type mi_commit_fun_t = unsafe extern "C" fn(
    commit: bool,
    start: *mut c_void,
    size: usize,
    is_zero: *mut bool,
    arg: *mut c_void,
) -> bool;

/// mi_option_show_errors: print error messages.
pub const OPTION_SHOW_ERRORS: c_int = 0;
/// mi_option_purge_delay (ms): how long freed memory waits before it is purged (decommitted).
pub const OPTION_PURGE_DELAY: c_int = 15;
/// mi_option_disallow_os_alloc: only arenas given to mimalloc, no memory of its own from the OS.
pub const OPTION_DISALLOW_OS_ALLOC: c_int = 17;
/// mi_option_arena_max_object_size (KiB): larger objects bypass the arenas (and so fail in a
/// heap bound to one).
pub const OPTION_ARENA_MAX_OBJECT_SIZE: c_int = 45;
/// _mi_option_last: the number of options.
pub const OPTION_COUNT: c_int = 47;

extern "C" {
    pub fn mi_heap_new_in_arena(arena_id: mi_arena_id_t) -> *mut mi_heap_t;
    pub fn mi_heap_destroy(heap: *mut mi_heap_t);
    pub fn mi_heap_malloc(heap: *mut mi_heap_t, size: usize) -> *mut c_void;
    pub fn mi_heap_zalloc(heap: *mut mi_heap_t, size: usize) -> *mut c_void;
    pub fn mi_heap_realloc(heap: *mut mi_heap_t, p: *mut c_void, newsize: usize) -> *mut c_void;
    pub fn mi_heap_of(p: *const c_void) -> *mut mi_heap_t;
    pub fn mi_malloc(size: usize) -> *mut c_void;
    pub fn mi_zalloc(size: usize) -> *mut c_void;
    pub fn mi_realloc(p: *mut c_void, newsize: usize) -> *mut c_void;
    pub fn mi_free(p: *mut c_void);
    pub fn mi_malloc_aligned(size: usize, alignment: usize) -> *mut c_void;
    pub fn mi_zalloc_aligned(size: usize, alignment: usize) -> *mut c_void;
    pub fn mi_realloc_aligned(p: *mut c_void, newsize: usize, alignment: usize) -> *mut c_void;
    pub fn mi_usable_size(p: *const c_void) -> usize;
    pub fn mi_good_size(size: usize) -> usize;
    pub fn mi_collect(force: bool);
    pub fn mi_is_in_heap_region(p: *const c_void) -> bool;

    pub fn mi_manage_memory(
        start: *mut c_void,
        size: usize,
        is_committed: bool,
        is_pinned: bool,
        is_zero: bool,
        numa_node: c_int,
        exclusive: bool,
        commit_fun: Option<mi_commit_fun_t>,
        commit_fun_arg: *mut c_void,
        arena_id: *mut mi_arena_id_t,
    ) -> bool;
    pub fn mi_option_set(option: c_int, value: c_long);
    pub fn mi_option_get(option: c_int) -> c_long;
    pub fn mi_version() -> c_int;
    /// Initialises mimalloc for the process (its page map among others); once, later calls
    /// return at once.
    pub fn mi_process_init();
}

/// The address span one submap of mimalloc 3's two-level page map covers: 2^13 entries of
/// 64 KiB slices (`MI_PAGE_MAP_SUB_SHIFT` + `MI_ARENA_SLICE_SHIFT` in mimalloc's headers).
pub const PAGE_MAP_SUBMAP_SPAN: usize = 512 << 20;
/// The mimalloc version whose page map [`PAGE_MAP_SUBMAP_SPAN`] and
/// [`_mi_page_map_unregister_range`] describe (`MI_MALLOC_VERSION`).
pub const PAGE_MAP_VERSION: c_int = 30302;

extern "C" {
    /// mimalloc-internal (declared in its mimalloc/internal.h; linked from the same static
    /// library): clears the page map entries of `[start, start + size)`, first making every
    /// submap of the range, each under mimalloc's `mi_page_map_lock`. Only for memory no arena
    /// owns yet: it would unregister live pages.
    pub fn _mi_page_map_unregister_range(start: *mut c_void, size: usize);
}

extern "C" {
    /// mimalloc-internal (init.c): true until mimalloc's process start has run. While it is
    /// true mimalloc never purges and refuses arena memory.
    fn _mi_preloading() -> bool;
    /// mimalloc-internal (init.c): mimalloc's process start (options, page map, the key that
    /// ends a thread's heap, random seed), which its load-time constructor calls.
    fn _mi_auto_process_init();
}

/// Runs mimalloc's process start once. zmem builds mimalloc without its load-time
/// constructor (`MI_PRIM_HAS_PROCESS_ATTACH`, .cargo/config.toml) so that the preload library
/// can start it only when zmem starts in a process: a process the run execs that never starts
/// zmem then pays nothing for mimalloc (it opened a /proc and a /sys file, mapped its page
/// map and read ~40 variables in every such process; docs/DESIGN-NOTES.md, "What a process
/// pays before zmem starts"), and an ending process no longer frees its whole heap page by
/// page. Elsewhere this crate's own constructor ([`START_AT_LOAD`]) runs it as mimalloc's
/// did: on the main thread, which mimalloc takes for the one that never ends first (started
/// on a thread that then ended, the next thread's allocation crashed). Built with mimalloc's
/// constructor, the start has already run and this does nothing.
pub fn process_start() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: both are plain functions of the linked mimalloc; the start runs once (the
        // constructor, if built in, has already cleared `_mi_preloading`).
        unsafe {
            if _mi_preloading() {
                _mi_auto_process_init();
            }
        }
    });
}

/// Set by the preload library before the constructors run: mimalloc's start waits for
/// zmem's.
static START_DEFERRED: AtomicBool = AtomicBool::new(false);

/// mimalloc's process start is left to an explicit [`process_start`] (the preload library,
/// from a constructor that runs before this crate's).
pub fn defer_process_start() {
    START_DEFERRED.store(true, Relaxed);
}

/// mimalloc's process start at load time, on the main thread, unless deferred.
#[used]
#[link_section = ".init_array"]
static START_AT_LOAD: extern "C" fn() = {
    extern "C" fn at_load() {
        if !START_DEFERRED.load(Relaxed) {
            process_start();
        }
    }
    at_load
};
