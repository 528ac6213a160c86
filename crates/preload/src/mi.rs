//! The parts of mimalloc 3's C API zmem uses (mimalloc is built and linked by libmimalloc-sys,
//! whose default is version 3; the declarations follow its include/mimalloc.h).

#![allow(non_camel_case_types)]

use std::ffi::{c_int, c_long, c_void};

use libmimalloc_sys as _;

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
/// mi_option_arena_max_object_size (KiB): larger objects would bypass the arenas.
pub const OPTION_ARENA_MAX_OBJECT_SIZE: c_int = 45;
/// _mi_option_last: the number of options.
pub const OPTION_COUNT: c_int = 47;

extern "C" {
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
}
