//! jemalloc's extended API, answered from the same heap as malloc, so a program linked with
//! jemalloc (Debian's redis-server calls mallctl, nallocx and malloc_stats_print) sees one
//! consistent allocator. mallctl knows the names such programs ask for (below); any other name
//! is ENOENT, which callers handle as "not available".

use std::ffi::{c_char, c_void, CStr, CString};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use crate::{alloc, alloc_aligned, alloc_zeroed, heap, mi, resize, resize_aligned, runtime};

const MALLOCX_ZERO: i32 = 0x40;
/// mallctl's MALLCTL_ARENAS_ALL: "arena.4096.purge" means every arena.
const VERSION: &CStr = c"5.3.0-0-zmem (mimalloc 3 on a zmem region)";

fn align_of_flags(flags: i32) -> usize {
    match flags & 0x3f {
        0 => 0,
        lg => 1usize << lg,
    }
}

/// # Safety
/// jemalloc's mallocx.
#[no_mangle]
pub unsafe extern "C" fn mallocx(size: usize, flags: i32) -> *mut c_void {
    let zero = flags & MALLOCX_ZERO != 0;
    match align_of_flags(flags) {
        0 if zero => alloc_zeroed(size),
        0 => alloc(size),
        a => alloc_aligned(size, a, zero),
    }
}

/// # Safety
/// jemalloc's rallocx.
#[no_mangle]
pub unsafe extern "C" fn rallocx(p: *mut c_void, size: usize, flags: i32) -> *mut c_void {
    let old = heap::usable_size(p);
    let q = match align_of_flags(flags) {
        0 => resize(p, size),
        a => resize_aligned(p, size, a),
    };
    if !q.is_null() && flags & MALLOCX_ZERO != 0 {
        let now = heap::usable_size(q);
        if now > old {
            std::ptr::write_bytes((q as *mut u8).add(old), 0, now - old);
        }
    }
    q
}

/// # Safety
/// jemalloc's xallocx: resizing in place is not offered; the size stays what it is.
#[no_mangle]
pub unsafe extern "C" fn xallocx(
    p: *mut c_void,
    _size: usize,
    _extra: usize,
    _flags: i32,
) -> usize {
    heap::usable_size(p)
}

/// # Safety
/// jemalloc's sallocx.
#[no_mangle]
pub unsafe extern "C" fn sallocx(p: *const c_void, _flags: i32) -> usize {
    heap::usable_size(p as *mut c_void)
}

/// # Safety
/// jemalloc's dallocx.
#[no_mangle]
pub unsafe extern "C" fn dallocx(p: *mut c_void, _flags: i32) {
    heap::free(p)
}

/// # Safety
/// jemalloc's sdallocx.
#[no_mangle]
pub unsafe extern "C" fn sdallocx(p: *mut c_void, _size: usize, _flags: i32) {
    heap::free(p)
}

/// # Safety
/// jemalloc's nallocx: the usable size mallocx would give (0 on overflow).
#[no_mangle]
pub unsafe extern "C" fn nallocx(size: usize, flags: i32) -> usize {
    let a = align_of_flags(flags).max(1);
    match size.max(1).checked_next_multiple_of(a) {
        Some(n) => heap::good_size(n),
        None => 0,
    }
}

static EPOCH: AtomicU64 = AtomicU64::new(1);

enum Value {
    U64(u64),
    Usize(usize),
    Unsigned(u32),
    Bool(bool),
    Str(*const c_char),
    /// A name that only acts (e.g. a purge) and has nothing to read.
    Action,
}

/// Bytes of the heap the program touched (in DRAM or compressed) and DRAM they take.
fn heap_bytes() -> (usize, usize) {
    let s = runtime::stats();
    (
        s.data() as usize,
        (s.resident() + s.mem_used_total()) as usize,
    )
}

fn lookup(name: &str) -> Option<Value> {
    Some(match name {
        "version" => Value::Str(VERSION.as_ptr()),
        "epoch" => Value::U64(EPOCH.fetch_add(1, Relaxed)),
        "stats.allocated" | "stats.active" | "stats.mapped" => Value::Usize(heap_bytes().0),
        "stats.resident" => Value::Usize(heap_bytes().1),
        "stats.metadata" | "stats.retained" => Value::Usize(0),
        "background_thread" | "opt.background_thread" | "config.debug" => Value::Bool(false),
        "arenas.narenas" | "opt.narenas" => Value::Unsigned(1),
        "thread.tcache.flush" => Value::Action,
        n if n.starts_with("arena.") && (n.ends_with(".purge") || n.ends_with(".decay")) => {
            if runtime::use_program_heap() {
                // SAFETY: collecting is always allowed on a program thread.
                unsafe { mi::mi_collect(true) }
            }
            Value::Action
        }
        _ => return None,
    })
}

unsafe fn read_out<T: Copy>(oldp: *mut c_void, oldlenp: *mut usize, v: T) -> i32 {
    if oldp.is_null() || oldlenp.is_null() {
        return 0;
    }
    if *oldlenp != std::mem::size_of::<T>() {
        return libc::EINVAL;
    }
    (oldp as *mut T).write_unaligned(v);
    0
}

/// # Safety
/// jemalloc's mallctl.
#[no_mangle]
pub unsafe extern "C" fn mallctl(
    name: *const c_char,
    oldp: *mut c_void,
    oldlenp: *mut usize,
    _newp: *mut c_void,
    _newlen: usize,
) -> i32 {
    if name.is_null() {
        return libc::EINVAL;
    }
    let Ok(name) = CStr::from_ptr(name).to_str() else {
        return libc::ENOENT;
    };
    let found = std::panic::catch_unwind(|| lookup(name)).unwrap_or(None);
    let Some(v) = found else {
        tracing::debug!("mallctl({name}): not provided");
        return libc::ENOENT;
    };
    // Writes (epoch refresh, background_thread on/off) are accepted and change nothing.
    match v {
        Value::U64(x) => read_out(oldp, oldlenp, x),
        Value::Usize(x) => read_out(oldp, oldlenp, x),
        Value::Unsigned(x) => read_out(oldp, oldlenp, x),
        Value::Bool(x) => read_out(oldp, oldlenp, x),
        Value::Str(x) => read_out(oldp, oldlenp, x),
        Value::Action => 0,
    }
}

/// # Safety
/// jemalloc's mallctlnametomib: MIBs are not offered.
#[no_mangle]
pub unsafe extern "C" fn mallctlnametomib(
    _name: *const c_char,
    _mibp: *mut usize,
    _miblenp: *mut usize,
) -> i32 {
    libc::ENOENT
}

/// # Safety
/// jemalloc's mallctlbymib: MIBs are not offered.
#[no_mangle]
pub unsafe extern "C" fn mallctlbymib(
    _mib: *const usize,
    _miblen: usize,
    _oldp: *mut c_void,
    _oldlenp: *mut usize,
    _newp: *mut c_void,
    _newlen: usize,
) -> i32 {
    libc::ENOENT
}

type WriteCb = unsafe extern "C" fn(*mut c_void, *const c_char);

/// # Safety
/// jemalloc's malloc_stats_print: zmem's statistics, through `write_cb` (stderr if NULL).
#[no_mangle]
pub unsafe extern "C" fn malloc_stats_print(
    write_cb: Option<WriteCb>,
    cbopaque: *mut c_void,
    _opts: *const c_char,
) {
    let text = std::panic::catch_unwind(|| {
        let s = runtime::stats();
        format!(
            "___ Begin zmem statistics ___\nallocator: mimalloc {} on a zmem region (policy {})\n\
             heap: {} bytes virtual, budget {}, resident {}\ncompressed: {} bytes of data in {} \
             bytes ({} with overhead), ratio {:.2}\nfaults: {} major, {} zero; evictions {}\n\
             ___ End zmem statistics ___\n",
            // SAFETY: plain query.
            unsafe { mi::mi_version() },
            s.policy,
            s.heap_size(),
            s.budget(),
            s.resident(),
            s.orig_data_size(),
            s.compr_data_size(),
            s.mem_used_total(),
            s.ratio(),
            s.major_faults(),
            s.zero_faults(),
            s.evictions()
        )
    })
    .unwrap_or_default();
    let Ok(c) = CString::new(text) else { return };
    match write_cb {
        Some(cb) => cb(cbopaque, c.as_ptr()),
        None => {
            let b = c.as_bytes();
            libc::write(2, b.as_ptr() as *const c_void, b.len());
        }
    }
}
