//! C API of zmem: `include/zmem.h` (generated from this file by cbindgen, see `build.rs`).
//!
//! A `zmem_region` is a range of memory that tiers itself: the program uses
//! `zmem_region_base() .. + zmem_region_size()` as plain memory from any thread, at most its
//! resident budget stays in DRAM, and the colder pages are compressed. A `zmem_heap` is such a
//! region managed by an allocator (`zmem_malloc`, `zmem_calloc`, `zmem_realloc`, `zmem_free`;
//! the `zmem-heap` crate): a program puts the data it chooses in tiered memory. The C names are spelled
//! in C style here too (`zmem_status::ZMEM_OK`), so that the header and the Rust source read the
//! same.
//!
//! Rules every exported function keeps:
//! - pointer arguments are checked for NULL (a NULL gives `ZMEM_INVALID_ARGUMENT`, never a
//!   crash);
//! - no panic crosses the C ABI: a panic becomes `ZMEM_PANIC` (or NULL / 0 for the accessors)
//!   with its message in `zmem_last_error()`;
//! - a failing call leaves a message for `zmem_last_error()` on the calling thread; a successful
//!   call leaves the last message alone (like `errno`).

use std::any::Any;
use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::os::unix::ffi::OsStrExt;
use std::panic::{catch_unwind, AssertUnwindSafe};

use ::zmem_heap::{Heap, HeapError, HeapStats};
use ::zmem_region::{
    AdaptiveConfig, Budget, Eviction, Region, RegionConfig, RegionError, RegionStats,
    MIN_BUDGET_BYTES, MIN_BUDGET_PAGES, PAGE,
};
use zmem_engine::Policy;

/// Status of a zmem call: `ZMEM_OK` (0) or a negative error code. The message of the last
/// error on the calling thread is `zmem_last_error()`.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum zmem_status {
    /// Success.
    ZMEM_OK = 0,
    /// A NULL pointer, an out-of-range value or an inconsistent set of options.
    ZMEM_INVALID_ARGUMENT = -1,
    /// /dev/userfaultfd cannot be opened by this user (the message says how to allow it).
    ZMEM_PERMISSION = -2,
    /// The kernel's userfaultfd lacks a feature zmem needs.
    ZMEM_UNSUPPORTED = -3,
    /// A system call failed (mmap, ioctl, thread creation, ...).
    ZMEM_OS = -4,
    /// The compressed page store under the region failed (e.g. its memory limit).
    ZMEM_STORE = -5,
    /// This process is a fork of the one that created the region; only the creator may do this.
    ZMEM_FORKED_CHILD = -6,
    /// A bug inside zmem: a Rust panic was caught at the API boundary.
    ZMEM_PANIC = -7,
    /// Out of memory: a heap has no room for a block, or the process has used up mimalloc's
    /// arenas (a process can create about 150 heaps in its lifetime).
    ZMEM_NO_MEMORY = -8,
}

/// Compression policy of a region's page store (the `policy` field of `zmem_options`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum zmem_policy {
    /// lz4: the cheapest CPU per byte (the default).
    ZMEM_POLICY_FAST = 0,
    /// zstd-1: most of zstd's ratio at the best speed it has.
    ZMEM_POLICY_BALANCED = 1,
    /// zstd-3: more ratio where CPU is cheap and memory is not.
    ZMEM_POLICY_MAX = 2,
    /// lz4 on the eviction path; pages that stay cold are recompressed with zstd in the
    /// background.
    ZMEM_POLICY_AUTO = 3,
}

/// Which pages leave DRAM first (the `eviction` field of `zmem_options`).
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum zmem_eviction {
    /// zmem's policy: CLOCK with fault history (the default).
    ZMEM_EVICTION_CLOCK = 0,
    /// First in, first out (umap's policy), the baseline.
    ZMEM_EVICTION_FIFO = 1,
}

/// Settings of a region. Fill with `zmem_options_init()`, then change what you need.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct zmem_options {
    /// Bytes of address space (rounded up to 4 KiB pages). Default 1 GiB. Must not be 0.
    pub size: u64,
    /// Fixed budget: bytes of the region that may stay resident (uncompressed) in DRAM,
    /// rounded down to pages. Default 256 MiB. Must be at most `size` and at least 16 pages
    /// (64 KiB). Ignored when `adaptive` is set.
    pub resident: u64,
    /// Size the budget at run time from memory pressure and the region's refault rate, between
    /// `adaptive_min` and `adaptive_max`. Default false.
    pub adaptive: bool,
    /// Lower bound of an adaptive budget in bytes; 0 means the region's minimum (16 pages).
    /// Default 0.
    pub adaptive_min: u64,
    /// Upper bound of an adaptive budget in bytes; 0 means the whole region. Default 0.
    /// Must be >= adaptive_min and <= size.
    pub adaptive_max: u64,
    /// A `zmem_policy` value. Default `ZMEM_POLICY_FAST`.
    pub policy: i32,
    /// A `zmem_eviction` value. Default `ZMEM_EVICTION_CLOCK`.
    pub eviction: i32,
    /// Pages mapped at once when faults run sequentially, 1..=64; 1 turns fault-around off.
    /// Default 16.
    pub fault_around: u32,
    /// Threads that resolve the region's faults, 1..=16. Default 1.
    pub handler_threads: u32,
    /// Bytes of DRAM the compressed pages may use (zram's mem_limit); 0 = unlimited, or with
    /// an SSD tier a quarter of `resident` (at least 16 MiB). Default 0.
    pub store_limit: u64,
    /// An SSD tier below the compressed pages: a directory (the log is an unnamed file there)
    /// or a block device, as a NUL-terminated path read only during `zmem_region_create()`;
    /// NULL = none. Cold compressed pages are written to it as the store nears `store_limit`.
    /// Default NULL.
    pub ssd_path: *const c_char,
    /// Bytes of log space on the SSD tier; 0 = 4 GiB. Default 0.
    pub ssd_size: u64,
    /// Do not encrypt the SSD tier (by default AES-256-GCM under a key that lives only in this
    /// process). Default false.
    pub ssd_no_encrypt: bool,
}

/// Statistics of a region (`zmem_region_stats()`). Sizes in bytes, latencies in nanoseconds.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct zmem_stats {
    /// Bytes of address space.
    pub size: u64,
    /// Current resident budget (changes over time with an adaptive budget).
    pub budget: u64,
    /// Bytes mapped in the region now.
    pub resident: u64,
    /// Bytes of evicted pages waiting for compression.
    pub staged: u64,
    /// Every fault served: major + zero + staged.
    pub faults: u64,
    /// Faults on evicted pages (decompressed from the store).
    pub major_faults: u64,
    /// Faults on pages never touched or dropped by the program (zero-filled).
    pub zero_faults: u64,
    /// Faults on pages caught between unmapping and compression (served uncompressed).
    pub staged_faults: u64,
    /// Extra pages mapped by fault-around.
    pub fault_around_pages: u64,
    /// Pages taken out of the mapping.
    pub evictions: u64,
    /// Evictions a faulting thread had to do itself because the budget was exhausted.
    pub direct_evictions: u64,
    /// Faults whose latency was measured.
    pub fault_latency_count: u64,
    /// Median fault resolution latency (ns).
    pub fault_latency_p50_ns: u64,
    /// 99th percentile fault resolution latency (ns).
    pub fault_latency_p99_ns: u64,
    /// 99.9th percentile fault resolution latency (ns).
    pub fault_latency_p999_ns: u64,
    /// Largest fault resolution latency (ns).
    pub fault_latency_max_ns: u64,
    /// Store: bytes of pages stored (zram's orig_data_size).
    pub orig_data_size: u64,
    /// Store: bytes of compressed objects (zram's compr_data_size).
    pub compr_data_size: u64,
    /// Store: bytes the compressed pool holds from the OS (zram's mem_used_total).
    pub mem_used_total: u64,
    /// Store: pages stored as a repeated word (no compression needed).
    pub same_pages: u64,
    /// Store: pages stored raw because they did not compress.
    pub huge_pages: u64,
    /// Store: written pages still waiting for compression.
    pub pending_pages: u64,
    /// Bytes of the region's data per byte of DRAM it uses (resident + staged + compressed
    /// pool); 0 while the region holds no data.
    pub effective_ratio: f64,
    /// Store: orig_data_size / mem_used_total; 0 while the store is empty.
    pub compression_ratio: f64,
    /// SSD tier: pages on the log now, and their compressed bytes there.
    pub ssd_pages: u64,
    pub ssd_bytes: u64,
    /// SSD tier: pages written back from the compressed pool, and pages read back.
    pub ssd_writeback_pages: u64,
    pub ssd_reads: u64,
    /// SSD tier: failed reads or writes (a page whose only copy is unreadable is poisoned).
    pub ssd_errors: u64,
}

/// A region: opaque handle from `zmem_region_create()`, freed by `zmem_region_destroy()`.
#[allow(non_camel_case_types)]
pub struct zmem_region {
    region: Region,
}

/// Default size of `zmem_options_init()`: 1 GiB.
const DEFAULT_SIZE: u64 = 1 << 30;
/// Default fixed budget of `zmem_options_init()`: 256 MiB.
const DEFAULT_RESIDENT: u64 = 256 << 20;

/// A failed call: the status it returns and the message `zmem_last_error()` gives.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Failure {
    status: zmem_status,
    message: String,
}

impl Failure {
    fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            status: zmem_status::ZMEM_INVALID_ARGUMENT,
            message: message.into(),
        }
    }
}

impl From<RegionError> for Failure {
    fn from(e: RegionError) -> Failure {
        Failure {
            status: status_of(&e),
            message: e.to_string(),
        }
    }
}

/// The status code of a region error.
fn status_of(e: &RegionError) -> zmem_status {
    match e {
        RegionError::Permission { .. } => zmem_status::ZMEM_PERMISSION,
        RegionError::Unsupported { .. } => zmem_status::ZMEM_UNSUPPORTED,
        RegionError::Os { .. } => zmem_status::ZMEM_OS,
        RegionError::Config(_) => zmem_status::ZMEM_INVALID_ARGUMENT,
        RegionError::Store(_) => zmem_status::ZMEM_STORE,
        RegionError::ForkedChild(_) => zmem_status::ZMEM_FORKED_CHILD,
    }
}

thread_local! {
    /// Message of the last failing call on this thread.
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    // A message with a NUL inside would be cut short in C; show it escaped instead.
    let message = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    // try_with: during thread teardown the slot may be gone; the status still reports the error.
    let _ = LAST_ERROR.try_with(|slot| *slot.borrow_mut() = message);
}

fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&'static str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "(no message)"
    }
}

/// Runs the body of an exported function: catches panics, records the message of a failure for
/// `zmem_last_error()` and turns the outcome into a status. `func` names the C function in the
/// message.
fn call(func: &str, body: impl FnOnce() -> Result<(), Failure>) -> zmem_status {
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(Ok(())) => zmem_status::ZMEM_OK,
        Ok(Err(failure)) => {
            set_last_error(&format!("{func}: {}", failure.message));
            failure.status
        }
        Err(payload) => {
            set_last_error(&format!(
                "{func}: panic inside zmem (a bug, please report it): {}",
                panic_message(payload.as_ref())
            ));
            zmem_status::ZMEM_PANIC
        }
    }
}

/// Like [`call`] for the accessors that return a value: `fallback` on failure or panic.
fn call_value<T>(func: &str, fallback: T, body: impl FnOnce() -> Result<T, Failure>) -> T {
    let mut value = None;
    let status = call(func, || {
        value = Some(body()?);
        Ok(())
    });
    match status {
        zmem_status::ZMEM_OK => value.unwrap_or(fallback),
        _ => fallback,
    }
}

fn policy_from(value: i32) -> Result<Policy, Failure> {
    Ok(match value {
        x if x == zmem_policy::ZMEM_POLICY_FAST as i32 => Policy::Fast,
        x if x == zmem_policy::ZMEM_POLICY_BALANCED as i32 => Policy::Balanced,
        x if x == zmem_policy::ZMEM_POLICY_MAX as i32 => Policy::Max,
        x if x == zmem_policy::ZMEM_POLICY_AUTO as i32 => Policy::Auto,
        other => {
            return Err(Failure::invalid(format!(
                "policy {other} is not a zmem_policy (ZMEM_POLICY_FAST..ZMEM_POLICY_AUTO, 0..3)"
            )))
        }
    })
}

fn eviction_from(value: i32) -> Result<Eviction, Failure> {
    Ok(match value {
        x if x == zmem_eviction::ZMEM_EVICTION_CLOCK as i32 => Eviction::Clock,
        x if x == zmem_eviction::ZMEM_EVICTION_FIFO as i32 => Eviction::Fifo,
        other => {
            return Err(Failure::invalid(format!(
                "eviction {other} is not a zmem_eviction (ZMEM_EVICTION_CLOCK or \
                 ZMEM_EVICTION_FIFO, 0..1)"
            )))
        }
    })
}

/// The defaults `zmem_options_init()` writes.
fn default_options() -> zmem_options {
    let base = RegionConfig::new(DEFAULT_SIZE, Budget::Fixed(DEFAULT_RESIDENT));
    zmem_options {
        size: DEFAULT_SIZE,
        resident: DEFAULT_RESIDENT,
        adaptive: false,
        adaptive_min: 0,
        adaptive_max: 0,
        policy: match base.policy {
            Policy::Fast => zmem_policy::ZMEM_POLICY_FAST,
            Policy::Balanced => zmem_policy::ZMEM_POLICY_BALANCED,
            Policy::Max => zmem_policy::ZMEM_POLICY_MAX,
            Policy::Auto => zmem_policy::ZMEM_POLICY_AUTO,
        } as i32,
        eviction: match base.eviction {
            Eviction::Clock => zmem_eviction::ZMEM_EVICTION_CLOCK,
            Eviction::Fifo => zmem_eviction::ZMEM_EVICTION_FIFO,
        } as i32,
        fault_around: u32::try_from(base.fault_around).unwrap_or(u32::MAX),
        handler_threads: u32::try_from(base.handler_threads).unwrap_or(u32::MAX),
        store_limit: 0,
        ssd_path: std::ptr::null(),
        ssd_size: 0,
        ssd_no_encrypt: false,
    }
}

/// Checks C options and turns them into a region configuration. The checks here are those of
/// the C options themselves (which budget a 0 means, a budget larger than the region); the
/// configuration is then checked by [`RegionConfig::validate`], the one check of a region's
/// settings, whose `Config` errors come back as `ZMEM_INVALID_ARGUMENT`.
fn config_from(o: &zmem_options) -> Result<RegionConfig, Failure> {
    let size = o.size;
    if size == 0 {
        return Err(Failure::invalid("size is 0"));
    }
    if size > isize::MAX as u64 - PAGE as u64 {
        return Err(Failure::invalid(format!(
            "size {size} is larger than an address space"
        )));
    }
    let budget = if o.adaptive {
        let max = if o.adaptive_max == 0 {
            size
        } else {
            o.adaptive_max
        };
        let min = if o.adaptive_min == 0 {
            min_budget().min(max)
        } else {
            o.adaptive_min
        };
        if min > max {
            return Err(Failure::invalid(format!(
                "adaptive_min {min} is larger than adaptive_max {max}"
            )));
        }
        if max > size {
            return Err(Failure::invalid(format!(
                "adaptive_max {max} is larger than the region ({size} bytes)"
            )));
        }
        Budget::Adaptive(adaptive_config(min, max))
    } else {
        let resident = o.resident;
        if resident == 0 {
            return Err(Failure::invalid(format!(
                "resident is 0 (the minimum is {MIN_BUDGET_PAGES} pages, {} bytes)",
                min_budget()
            )));
        }
        if resident > size {
            return Err(Failure::invalid(format!(
                "resident {resident} is larger than the region ({size} bytes)"
            )));
        }
        Budget::Fixed(resident)
    };
    let mut cfg = RegionConfig::new(size, budget);
    cfg.policy = policy_from(o.policy)?;
    cfg.eviction = eviction_from(o.eviction)?;
    cfg.fault_around = o.fault_around as usize;
    cfg.handler_threads = o.handler_threads as usize;
    cfg.store_limit = (o.store_limit != 0).then_some(o.store_limit);
    if !o.ssd_path.is_null() {
        // SAFETY: the caller of zmem_region_create guarantees a non-NULL ssd_path points to a
        // NUL-terminated string that stays valid during the call.
        let path = unsafe { CStr::from_ptr(o.ssd_path) };
        let path = std::path::PathBuf::from(std::ffi::OsStr::from_bytes(path.to_bytes()));
        if cfg.store_limit.is_none() {
            let fixed = (!o.adaptive).then_some(o.resident);
            cfg.store_limit = Some(::zmem_region::default_ssd_store_limit(fixed));
        }
        let size = if o.ssd_size == 0 {
            ::zmem_region::DEFAULT_SSD_SIZE
        } else {
            o.ssd_size
        };
        let mut lc = zmem_tier::LogConfig::new(path.clone(), size);
        lc.encrypt = !o.ssd_no_encrypt;
        let log = zmem_tier::Log::open(lc).map_err(|e| Failure {
            status: match e {
                zmem_tier::TierError::Config(_) => zmem_status::ZMEM_INVALID_ARGUMENT,
                _ => zmem_status::ZMEM_OS,
            },
            message: format!("SSD tier at {}: {e}", path.display()),
        })?;
        cfg.lower = Some(zmem_store::LowerConfig::new(log));
    }
    cfg.validate()?;
    Ok(cfg)
}

/// The smallest budget a region accepts, in bytes.
fn min_budget() -> u64 {
    MIN_BUDGET_BYTES
}

/// An adaptive budget between `min` and `max` bytes with the region's default tuning.
fn adaptive_config(min: u64, max: u64) -> AdaptiveConfig {
    AdaptiveConfig::new(min, max)
}

impl From<&RegionStats> for zmem_stats {
    fn from(s: &RegionStats) -> zmem_stats {
        let compression_ratio = if s.store.mem_used_total == 0 {
            0.0
        } else {
            s.store.orig_data_size as f64 / s.store.mem_used_total as f64
        };
        zmem_stats {
            size: s.size,
            budget: s.budget,
            resident: s.resident,
            staged: s.staged,
            faults: s.faults(),
            major_faults: s.major_faults,
            zero_faults: s.zero_faults,
            staged_faults: s.staged_faults,
            fault_around_pages: s.fault_around_pages,
            evictions: s.evictions,
            direct_evictions: s.direct_evictions,
            fault_latency_count: s.fault_latency.count,
            fault_latency_p50_ns: s.fault_latency.p50,
            fault_latency_p99_ns: s.fault_latency.p99,
            fault_latency_p999_ns: s.fault_latency.p999,
            fault_latency_max_ns: s.fault_latency.max,
            orig_data_size: s.store.orig_data_size,
            compr_data_size: s.store.compr_data_size,
            mem_used_total: s.store.mem_used_total,
            same_pages: s.store.same_pages,
            huge_pages: s.store.huge_pages,
            pending_pages: s.store.pending_pages,
            effective_ratio: s.effective_ratio(),
            compression_ratio,
            ssd_pages: s.store.lower_pages,
            ssd_bytes: s.store.lower_bytes,
            ssd_writeback_pages: s.store.writeback_pages,
            ssd_reads: s.store.lower_reads,
            ssd_errors: s.store.lower_errors,
        }
    }
}

/// The region behind a handle, or the failure for a NULL handle.
///
/// # Safety
/// `region` is NULL or a live handle from `zmem_region_create()`.
unsafe fn region_ref<'a>(region: *const zmem_region) -> Result<&'a Region, Failure> {
    // SAFETY: the caller guarantees that a non-NULL `region` came from zmem_region_create() and
    // has not been destroyed; as_ref() turns NULL into None.
    match unsafe { region.as_ref() } {
        Some(handle) => Ok(&handle.region),
        None => Err(Failure::invalid("region is NULL")),
    }
}

/// Fills `*options` with the defaults: 1 GiB of address space, a fixed budget of 256 MiB,
/// `ZMEM_POLICY_FAST`, `ZMEM_EVICTION_CLOCK`, fault-around of 16 pages, one handler thread.
///
/// Returns `ZMEM_INVALID_ARGUMENT` when `options` is NULL.
///
/// # Safety
/// `options` is NULL or points to writable memory for one `zmem_options`.
#[no_mangle]
pub unsafe extern "C" fn zmem_options_init(options: *mut zmem_options) -> zmem_status {
    call("zmem_options_init", || {
        if options.is_null() {
            return Err(Failure::invalid("options is NULL"));
        }
        let defaults = default_options();
        // SAFETY: options is not NULL, and the caller guarantees it points to writable memory
        // for a zmem_options; write() does not read or drop the old (maybe uninitialised) value.
        unsafe { options.write(defaults) };
        Ok(())
    })
}

/// Creates a region as `*options` says and stores its handle in `*out`.
///
/// On failure `*out` is set to NULL (when `out` is not NULL) and nothing is left behind.
/// Errors: `ZMEM_INVALID_ARGUMENT` (NULL pointer, size 0, resident 0 or above size,
/// adaptive_min above adaptive_max, an unknown policy or eviction, ...), `ZMEM_PERMISSION`
/// (userfaultfd not allowed for this user), `ZMEM_UNSUPPORTED`, `ZMEM_OS`, `ZMEM_STORE`.
///
/// # Safety
/// `options` is NULL or points to an initialised `zmem_options` (use `zmem_options_init()`);
/// `out` is NULL or points to writable memory for one pointer.
#[no_mangle]
pub unsafe extern "C" fn zmem_region_create(
    options: *const zmem_options,
    out: *mut *mut zmem_region,
) -> zmem_status {
    call("zmem_region_create", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        // SAFETY: out is not NULL and the caller guarantees it is writable for one pointer.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: the caller guarantees a non-NULL options points to an initialised
        // zmem_options; as_ref() turns NULL into None.
        let Some(options) = (unsafe { options.as_ref() }) else {
            return Err(Failure::invalid("options is NULL"));
        };
        let cfg = config_from(options)?;
        let region = Region::new(cfg)?;
        let handle = Box::into_raw(Box::new(zmem_region { region }));
        // SAFETY: as above, out is not NULL and writable.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Destroys a region: stops its threads, unmaps its memory and frees every compressed page.
/// Pointers into the region are invalid afterwards. A NULL `region` is a no-op.
///
/// # Safety
/// `region` is NULL or a handle from `zmem_region_create()` that has not been destroyed; no
/// other thread uses the handle or the region's memory during or after the call.
#[no_mangle]
pub unsafe extern "C" fn zmem_region_destroy(region: *mut zmem_region) {
    if region.is_null() {
        return;
    }
    call("zmem_region_destroy", || {
        // SAFETY: region is not NULL, came from Box::into_raw in zmem_region_create() and the
        // caller guarantees it is destroyed once and no longer used.
        drop(unsafe { Box::from_raw(region) });
        Ok(())
    });
}

/// First byte of the region's memory, or NULL when `region` is NULL.
///
/// # Safety
/// `region` is NULL or a live handle from `zmem_region_create()`.
#[no_mangle]
pub unsafe extern "C" fn zmem_region_base(region: *const zmem_region) -> *mut c_void {
    call_value("zmem_region_base", std::ptr::null_mut(), || {
        // SAFETY: forwarded from this function's contract.
        let r = unsafe { region_ref(region) }?;
        Ok(r.as_ptr().cast::<c_void>())
    })
}

/// Bytes of the region's memory (the size asked for, rounded up to 4 KiB pages), or 0 when
/// `region` is NULL.
///
/// # Safety
/// `region` is NULL or a live handle from `zmem_region_create()`.
#[no_mangle]
pub unsafe extern "C" fn zmem_region_size(region: *const zmem_region) -> usize {
    call_value("zmem_region_size", 0, || {
        // SAFETY: forwarded from this function's contract.
        let r = unsafe { region_ref(region) }?;
        Ok(r.len())
    })
}

/// Writes the region's statistics to `*out`.
///
/// # Safety
/// `region` is NULL or a live handle from `zmem_region_create()`; `out` is NULL or points to
/// writable memory for one `zmem_stats`.
#[no_mangle]
pub unsafe extern "C" fn zmem_region_stats(
    region: *const zmem_region,
    out: *mut zmem_stats,
) -> zmem_status {
    call("zmem_region_stats", || {
        // SAFETY: forwarded from this function's contract.
        let r = unsafe { region_ref(region) }?;
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let stats = zmem_stats::from(&r.stats());
        // SAFETY: out is not NULL and the caller guarantees it is writable for one zmem_stats.
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Sets the resident budget of the region to `bytes` (rounded down to pages). Shrinking evicts
/// in the background; faults wait for room, they never fail. An adaptive region's controller
/// overrides the value at its next step.
///
/// Errors: `ZMEM_INVALID_ARGUMENT` (NULL region, below 16 pages, more than the region's size),
/// `ZMEM_FORKED_CHILD`.
///
/// # Safety
/// `region` is NULL or a live handle from `zmem_region_create()`.
#[no_mangle]
pub unsafe extern "C" fn zmem_region_set_resident(
    region: *mut zmem_region,
    bytes: u64,
) -> zmem_status {
    call("zmem_region_set_resident", || {
        // SAFETY: forwarded from this function's contract.
        let r = unsafe { region_ref(region) }?;
        if bytes == 0 {
            return Err(Failure::invalid("resident is 0"));
        }
        if bytes > r.len() as u64 {
            return Err(Failure::invalid(format!(
                "resident {bytes} is larger than the region ({} bytes)",
                r.len()
            )));
        }
        r.set_budget(bytes)?;
        Ok(())
    })
}

/// A heap in tiered memory: opaque handle from `zmem_heap_create()`, freed by
/// `zmem_heap_destroy()`.
#[allow(non_camel_case_types)]
pub struct zmem_heap {
    heap: Heap,
}

/// Statistics of a heap (`zmem_heap_stats()`). Sizes in bytes.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct zmem_heap_statistics {
    /// The region under the heap: resident bytes, faults, evictions, compressed and SSD tiers.
    pub region: zmem_stats,
    /// Usable bytes of the live blocks (`zmem_usable_size()` of each, summed).
    pub allocated: u64,
    /// Blocks allocated and not freed.
    pub live_blocks: u64,
    /// Bytes of the heap's arenas (the size asked for, rounded up to 32 MiB).
    pub capacity: u64,
    /// mimalloc arenas of the heap (one per 8 GiB).
    pub arenas: u64,
    /// Bytes of arena metadata, kept in plain memory outside the region (address space).
    pub metadata: u64,
    /// Of which resident in DRAM now.
    pub metadata_resident: u64,
    /// Bytes of free pages the heap gave back (dropped with their compressed copies).
    pub decommitted: u64,
}

impl From<&HeapStats> for zmem_heap_statistics {
    fn from(s: &HeapStats) -> zmem_heap_statistics {
        zmem_heap_statistics {
            region: zmem_stats::from(&s.region),
            allocated: s.allocated,
            live_blocks: s.live_blocks,
            capacity: s.capacity,
            arenas: s.arenas as u64,
            metadata: s.metadata,
            metadata_resident: s.metadata_resident,
            decommitted: s.decommitted,
        }
    }
}

impl From<HeapError> for Failure {
    fn from(e: HeapError) -> Failure {
        let status = match &e {
            HeapError::Region(r) => status_of(r),
            HeapError::Config(_) | HeapError::Foreign { .. } => zmem_status::ZMEM_INVALID_ARGUMENT,
            HeapError::SharedAllocator => zmem_status::ZMEM_UNSUPPORTED,
            HeapError::Arena { .. }
            | HeapError::OutOfMemory { .. }
            | HeapError::Overflow { .. } => zmem_status::ZMEM_NO_MEMORY,
            HeapError::Os { .. } => zmem_status::ZMEM_OS,
        };
        Failure {
            status,
            message: e.to_string(),
        }
    }
}

/// The heap behind a handle, or the failure for a NULL handle.
///
/// # Safety
/// `heap` is NULL or a live handle from `zmem_heap_create()`.
unsafe fn heap_ref<'a>(heap: *const zmem_heap) -> Result<&'a Heap, Failure> {
    // SAFETY: the caller guarantees that a non-NULL `heap` came from zmem_heap_create() and has
    // not been destroyed; as_ref() turns NULL into None.
    match unsafe { heap.as_ref() } {
        Some(handle) => Ok(&handle.heap),
        None => Err(Failure::invalid("heap is NULL")),
    }
}

/// Runs an allocating function's body like [`call_value`]; a failure returns NULL with
/// `errno` set as malloc does: `ENOMEM` when there is no room, `EINVAL` for a bad argument.
fn call_alloc(func: &str, body: impl FnOnce() -> Result<*mut u8, Failure>) -> *mut c_void {
    let mut out = std::ptr::null_mut();
    let status = call(func, || {
        out = body()?;
        Ok(())
    });
    if status != zmem_status::ZMEM_OK {
        let code = match status {
            zmem_status::ZMEM_INVALID_ARGUMENT => libc::EINVAL,
            _ => libc::ENOMEM,
        };
        // SAFETY: errno is thread local and always writable.
        unsafe { *libc::__errno_location() = code };
        return std::ptr::null_mut();
    }
    out.cast::<c_void>()
}

/// Creates a heap as `*options` says and stores its handle in `*out`: `size` bytes of address
/// space (at least 32 MiB, rounded up to 32 MiB) of which at most `resident` stay in DRAM, with
/// the options' policy, store limit and SSD tier. Blocks come from mimalloc 3, confined to the
/// heap's region; any thread may allocate and free.
///
/// On failure `*out` is set to NULL (when `out` is not NULL) and nothing is left behind.
/// Errors: those of `zmem_region_create()`, `ZMEM_INVALID_ARGUMENT` for a size under 32 MiB,
/// `ZMEM_NO_MEMORY` when the process has used up mimalloc's arenas (mimalloc 3 never frees
/// one: about 150 heaps of up to 8 GiB per process lifetime), `ZMEM_UNSUPPORTED` when the
/// process's own malloc is the same mimalloc.
///
/// # Safety
/// `options` is NULL or points to an initialised `zmem_options` (use `zmem_options_init()`);
/// `out` is NULL or points to writable memory for one pointer.
#[no_mangle]
pub unsafe extern "C" fn zmem_heap_create(
    options: *const zmem_options,
    out: *mut *mut zmem_heap,
) -> zmem_status {
    call("zmem_heap_create", || {
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        // SAFETY: out is not NULL and the caller guarantees it is writable for one pointer.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: the caller guarantees a non-NULL options points to an initialised
        // zmem_options; as_ref() turns NULL into None.
        let Some(options) = (unsafe { options.as_ref() }) else {
            return Err(Failure::invalid("options is NULL"));
        };
        let heap = Heap::new(config_from(options)?)?;
        let handle = Box::into_raw(Box::new(zmem_heap { heap }));
        // SAFETY: as above, out is not NULL and writable.
        unsafe { out.write(handle) };
        Ok(())
    })
}

/// Destroys a heap: frees every block still live, stops the region's threads and frees its
/// compressed pages. Pointers into the heap are invalid afterwards. A NULL `heap` is a no-op.
///
/// # Safety
/// `heap` is NULL or a handle from `zmem_heap_create()` that has not been destroyed; no other
/// thread uses the handle or the heap's blocks during or after the call.
#[no_mangle]
pub unsafe extern "C" fn zmem_heap_destroy(heap: *mut zmem_heap) {
    if heap.is_null() {
        return;
    }
    call("zmem_heap_destroy", || {
        // SAFETY: heap is not NULL, came from Box::into_raw in zmem_heap_create() and the
        // caller guarantees it is destroyed once and no longer used.
        drop(unsafe { Box::from_raw(heap) });
        Ok(())
    });
}

/// A block of at least `size` bytes from the heap (uninitialised; `size` 0 gives a unique
/// block), aligned to 16 bytes from 16 bytes up. NULL on failure, with `zmem_last_error()` set
/// and `errno` = `ENOMEM` (no room) or `EINVAL` (NULL heap).
///
/// # Safety
/// `heap` is NULL or a live handle from `zmem_heap_create()`.
#[no_mangle]
pub unsafe extern "C" fn zmem_malloc(heap: *mut zmem_heap, size: usize) -> *mut c_void {
    call_alloc("zmem_malloc", || {
        // SAFETY: forwarded from this function's contract.
        let h = unsafe { heap_ref(heap) }?;
        Ok(h.malloc(size)?.as_ptr())
    })
}

/// A zeroed block for `count` elements of `size` bytes. NULL on failure (`errno` = `ENOMEM`
/// also when `count * size` overflows).
///
/// # Safety
/// `heap` is NULL or a live handle from `zmem_heap_create()`.
#[no_mangle]
pub unsafe extern "C" fn zmem_calloc(
    heap: *mut zmem_heap,
    count: usize,
    size: usize,
) -> *mut c_void {
    call_alloc("zmem_calloc", || {
        // SAFETY: forwarded from this function's contract.
        let h = unsafe { heap_ref(heap) }?;
        Ok(h.calloc(count, size)?.as_ptr())
    })
}

/// Resizes a block of the heap, moving it if needed (contents kept up to the smaller size).
/// `ptr` NULL allocates; `size` 0 gives a block of no usable bytes (the old one is freed). On
/// failure returns NULL and leaves the old block as it was: `errno` = `ENOMEM` (no room) or
/// `EINVAL` (NULL heap, or `ptr` is not a block of this heap).
///
/// # Safety
/// `heap` is NULL or a live handle; `ptr` is NULL, a live block of this heap, or any pointer
/// outside the heap (refused). Freed or interior pointers of the heap are undefined behaviour,
/// as with realloc.
#[no_mangle]
pub unsafe extern "C" fn zmem_realloc(
    heap: *mut zmem_heap,
    ptr: *mut c_void,
    size: usize,
) -> *mut c_void {
    call_alloc("zmem_realloc", || {
        // SAFETY: forwarded from this function's contract.
        let h = unsafe { heap_ref(heap) }?;
        // SAFETY: as above.
        Ok(unsafe { h.realloc(ptr.cast::<u8>(), size) }?.as_ptr())
    })
}

/// Frees a block of the heap. A NULL `ptr` is a no-op. A pointer that is not a block of this
/// heap (outside its memory, another heap's, in its metadata) is refused with
/// `ZMEM_INVALID_ARGUMENT` and left alone.
///
/// # Safety
/// As `zmem_realloc()`.
#[no_mangle]
pub unsafe extern "C" fn zmem_free(heap: *mut zmem_heap, ptr: *mut c_void) -> zmem_status {
    call("zmem_free", || {
        // SAFETY: forwarded from this function's contract.
        let h = unsafe { heap_ref(heap) }?;
        // SAFETY: as above.
        unsafe { h.free(ptr.cast::<u8>()) }?;
        Ok(())
    })
}

/// Usable bytes of a block of the heap (at least what was asked for), or 0 when `heap` is NULL
/// or `ptr` is not a block of it.
///
/// # Safety
/// As `zmem_realloc()`.
#[no_mangle]
pub unsafe extern "C" fn zmem_usable_size(heap: *const zmem_heap, ptr: *const c_void) -> usize {
    call_value("zmem_usable_size", 0, || {
        // SAFETY: forwarded from this function's contract.
        let h = unsafe { heap_ref(heap) }?;
        // SAFETY: as above.
        Ok(unsafe { h.usable_size(ptr.cast::<u8>()) }?)
    })
}

/// Writes the heap's statistics to `*out`.
///
/// # Safety
/// `heap` is NULL or a live handle from `zmem_heap_create()`; `out` is NULL or points to
/// writable memory for one `zmem_heap_statistics`.
#[no_mangle]
pub unsafe extern "C" fn zmem_heap_stats(
    heap: *const zmem_heap,
    out: *mut zmem_heap_statistics,
) -> zmem_status {
    call("zmem_heap_stats", || {
        // SAFETY: forwarded from this function's contract.
        let h = unsafe { heap_ref(heap) }?;
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let stats = zmem_heap_statistics::from(&h.stats());
        // SAFETY: out is not NULL and the caller guarantees it is writable for one
        // zmem_heap_statistics.
        unsafe { out.write(stats) };
        Ok(())
    })
}

/// Message of the last failing zmem call on this thread, or "" when none failed yet. The
/// string stays valid until the next failing zmem call on this thread or the thread's end.
/// Never NULL.
#[no_mangle]
pub extern "C" fn zmem_last_error() -> *const c_char {
    catch_unwind(|| {
        LAST_ERROR
            .try_with(|slot| slot.borrow().as_ptr())
            .unwrap_or(c"".as_ptr())
    })
    .unwrap_or(c"".as_ptr())
}

/// Name of a status code ("ZMEM_OK", "ZMEM_INVALID_ARGUMENT", ...), or "ZMEM_UNKNOWN" for a
/// value that is not a `zmem_status`. Static storage; never NULL.
#[no_mangle]
pub extern "C" fn zmem_status_str(status: i32) -> *const c_char {
    use zmem_status::*;
    let all = [
        (ZMEM_OK, c"ZMEM_OK"),
        (ZMEM_INVALID_ARGUMENT, c"ZMEM_INVALID_ARGUMENT"),
        (ZMEM_PERMISSION, c"ZMEM_PERMISSION"),
        (ZMEM_UNSUPPORTED, c"ZMEM_UNSUPPORTED"),
        (ZMEM_OS, c"ZMEM_OS"),
        (ZMEM_STORE, c"ZMEM_STORE"),
        (ZMEM_FORKED_CHILD, c"ZMEM_FORKED_CHILD"),
        (ZMEM_PANIC, c"ZMEM_PANIC"),
        (ZMEM_NO_MEMORY, c"ZMEM_NO_MEMORY"),
    ];
    all.iter()
        .find(|(s, _)| *s as i32 == status)
        .map_or(c"ZMEM_UNKNOWN", |(_, name)| name)
        .as_ptr()
}

/// Version of the zmem library ("0.1.0"). Static storage; never NULL.
#[no_mangle]
pub extern "C" fn zmem_version() -> *const c_char {
    const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    VERSION.as_ptr().cast::<c_char>()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ::zmem_region::RegionError;
    use std::ffi::CStr;
    use std::io;
    use zmem_store::StoreError;

    fn last_error() -> String {
        // SAFETY: zmem_last_error() returns a NUL-terminated string, valid until the next
        // failing call on this thread.
        unsafe { CStr::from_ptr(zmem_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn every_region_error_maps_to_its_status() {
        let cases: Vec<(RegionError, zmem_status)> = vec![
            (
                RegionError::Permission {
                    source: io::Error::from(io::ErrorKind::PermissionDenied),
                },
                zmem_status::ZMEM_PERMISSION,
            ),
            (
                RegionError::Unsupported {
                    feature: "UFFD_FEATURE_MISSING_SHMEM",
                    why: "old kernel".into(),
                },
                zmem_status::ZMEM_UNSUPPORTED,
            ),
            (
                RegionError::Os {
                    op: "mmap",
                    source: io::Error::other("no memory"),
                },
                zmem_status::ZMEM_OS,
            ),
            (
                RegionError::Config("bad".into()),
                zmem_status::ZMEM_INVALID_ARGUMENT,
            ),
            (
                RegionError::Store(StoreError::Config("bad store".into())),
                zmem_status::ZMEM_STORE,
            ),
            (
                RegionError::ForkedChild("set_budget"),
                zmem_status::ZMEM_FORKED_CHILD,
            ),
        ];
        for (err, want) in cases {
            let text = err.to_string();
            let failure = Failure::from(err);
            assert_eq!(failure.status, want, "{text}");
            assert_eq!(failure.message, text);
            // Through the boundary: the status comes back and the message is recorded.
            let got = call("zmem_test", || Err(failure.clone()));
            assert_eq!(got, want);
            assert_eq!(last_error(), format!("zmem_test: {text}"));
        }
    }

    #[test]
    fn status_values_are_the_documented_ones() {
        use zmem_status::*;
        let values = [
            (ZMEM_OK, 0),
            (ZMEM_INVALID_ARGUMENT, -1),
            (ZMEM_PERMISSION, -2),
            (ZMEM_UNSUPPORTED, -3),
            (ZMEM_OS, -4),
            (ZMEM_STORE, -5),
            (ZMEM_FORKED_CHILD, -6),
            (ZMEM_PANIC, -7),
            (ZMEM_NO_MEMORY, -8),
        ];
        for (status, value) in values {
            assert_eq!(status as i32, value);
            // SAFETY: zmem_status_str returns a static NUL-terminated string.
            let name = unsafe { CStr::from_ptr(zmem_status_str(value)) };
            assert_eq!(name.to_str().unwrap(), format!("{status:?}"));
        }
        // SAFETY: as above.
        let unknown = unsafe { CStr::from_ptr(zmem_status_str(42)) };
        assert_eq!(unknown.to_str().unwrap(), "ZMEM_UNKNOWN");
    }

    #[test]
    fn a_panic_becomes_the_panic_status_with_its_message() {
        let status = call("zmem_test", || panic!("boom {}", 7));
        assert_eq!(status, zmem_status::ZMEM_PANIC);
        let msg = last_error();
        assert!(msg.starts_with("zmem_test: panic inside zmem"), "{msg}");
        assert!(msg.ends_with("boom 7"), "{msg}");
        let value = call_value("zmem_test", 5usize, || panic!("static"));
        assert_eq!(value, 5);
        assert!(last_error().ends_with("static"));
    }

    #[test]
    fn last_error_is_per_thread_and_survives_success() {
        let _ = call("zmem_test", || Err(Failure::invalid("here")));
        assert_eq!(call("zmem_test", || Ok(())), zmem_status::ZMEM_OK);
        assert_eq!(last_error(), "zmem_test: here");
        std::thread::spawn(|| {
            assert_eq!(last_error(), "");
            let _ = call("zmem_test", || Err(Failure::invalid("there\0nul")));
            assert_eq!(last_error(), "zmem_test: there\\0nul");
        })
        .join()
        .unwrap();
        assert_eq!(last_error(), "zmem_test: here");
    }

    #[test]
    fn null_pointers_are_invalid_arguments() {
        use std::ptr::{null, null_mut};
        use zmem_status::ZMEM_INVALID_ARGUMENT;
        // SAFETY: every pointer is NULL or points to a live local of the right type.
        unsafe {
            assert_eq!(zmem_options_init(null_mut()), ZMEM_INVALID_ARGUMENT);
            assert_eq!(last_error(), "zmem_options_init: options is NULL");
            let mut out = std::ptr::dangling_mut::<zmem_region>();
            assert_eq!(zmem_region_create(null(), &mut out), ZMEM_INVALID_ARGUMENT);
            assert!(out.is_null(), "*out is cleared on failure");
            assert_eq!(last_error(), "zmem_region_create: options is NULL");
            let o = default_options();
            assert_eq!(zmem_region_create(&o, null_mut()), ZMEM_INVALID_ARGUMENT);
            let mut stats = zmem_stats::default();
            assert_eq!(zmem_region_stats(null(), &mut stats), ZMEM_INVALID_ARGUMENT);
            assert_eq!(last_error(), "zmem_region_stats: region is NULL");
            assert_eq!(
                zmem_region_set_resident(null_mut(), 1 << 20),
                ZMEM_INVALID_ARGUMENT
            );
            assert!(zmem_region_base(null()).is_null());
            assert_eq!(zmem_region_size(null()), 0);
            assert_eq!(last_error(), "zmem_region_size: region is NULL");
            zmem_region_destroy(null_mut());
        }
        // SAFETY: static NUL-terminated string.
        let version = unsafe { CStr::from_ptr(zmem_version()) };
        assert_eq!(version.to_str().unwrap(), env!("CARGO_PKG_VERSION"));
    }

    #[test]
    fn invalid_options_fail_before_any_system_call() {
        let mut o = default_options();
        o.size = 64 << 20;
        o.resident = (64 << 20) + 1;
        let mut out = std::ptr::null_mut();
        // SAFETY: both pointers point to live locals.
        let status = unsafe { zmem_region_create(&o, &mut out) };
        assert_eq!(status, zmem_status::ZMEM_INVALID_ARGUMENT);
        assert!(out.is_null());
        assert!(last_error().contains("larger than the region"));
    }

    #[test]
    fn defaults_are_valid_and_follow_the_region_defaults() {
        let o = default_options();
        let cfg = config_from(&o).expect("defaults are valid");
        let base = RegionConfig::new(DEFAULT_SIZE, Budget::Fixed(DEFAULT_RESIDENT));
        assert_eq!(cfg.size, base.size);
        assert_eq!(cfg.budget, base.budget);
        assert_eq!(cfg.policy, base.policy);
        assert_eq!(cfg.eviction, base.eviction);
        assert_eq!(cfg.fault_around, base.fault_around);
        assert_eq!(cfg.handler_threads, base.handler_threads);
    }

    #[test]
    fn options_map_to_the_config() {
        let mut o = default_options();
        o.size = 64 << 20;
        o.adaptive = true;
        o.adaptive_min = 4 << 20;
        o.policy = zmem_policy::ZMEM_POLICY_AUTO as i32;
        o.eviction = zmem_eviction::ZMEM_EVICTION_FIFO as i32;
        o.fault_around = 1;
        o.handler_threads = 2;
        let cfg = config_from(&o).unwrap();
        assert_eq!(
            cfg.budget,
            Budget::Adaptive(adaptive_config(4 << 20, 64 << 20))
        );
        // 0 bounds mean the region's minimum and the whole region.
        o.adaptive_min = 0;
        assert_eq!(
            config_from(&o).unwrap().budget,
            Budget::Adaptive(adaptive_config(min_budget(), 64 << 20))
        );
        assert_eq!(cfg.policy, Policy::Auto);
        assert_eq!(cfg.eviction, Eviction::Fifo);
        assert_eq!((cfg.fault_around, cfg.handler_threads), (1, 2));
        for (value, policy) in [
            (0, Policy::Fast),
            (1, Policy::Balanced),
            (2, Policy::Max),
            (3, Policy::Auto),
        ] {
            assert_eq!(policy_from(value).unwrap(), policy);
        }
    }

    #[test]
    fn invalid_options_are_refused_with_a_message() {
        let base = {
            let mut o = default_options();
            o.size = 64 << 20;
            o.resident = 8 << 20;
            o
        };
        type Change = fn(&mut zmem_options);
        let cases: Vec<(&str, Change)> = vec![
            ("size is 0", |o| o.size = 0),
            ("larger than an address space", |o| o.size = u64::MAX),
            ("resident is 0", |o| o.resident = 0),
            ("larger than the region", |o| o.resident = (64 << 20) + 1),
            ("adaptive_min 9 is larger than adaptive_max 8", |o| {
                o.adaptive = true;
                o.adaptive_min = 9;
                o.adaptive_max = 8;
            }),
            ("adaptive_max", |o| {
                o.adaptive = true;
                o.adaptive_max = 128 << 20;
            }),
            ("policy 4", |o| o.policy = 4),
            ("policy -1", |o| o.policy = -1),
            ("eviction 2", |o| o.eviction = 2),
            ("fault_around 0 must be 1..=64", |o| o.fault_around = 0),
            ("handler_threads 0 must be 1..=16", |o| {
                o.handler_threads = 0
            }),
        ];
        for (want, change) in cases {
            let mut o = base;
            change(&mut o);
            let failure = config_from(&o).expect_err(want);
            assert_eq!(failure.status, zmem_status::ZMEM_INVALID_ARGUMENT);
            assert!(
                failure.message.contains(want),
                "{want}: {}",
                failure.message
            );
        }
        // resident == size is fine, and an adaptive region ignores resident.
        let mut o = base;
        o.resident = o.size;
        assert!(config_from(&o).is_ok());
        o.resident = 0;
        o.adaptive = true;
        assert!(config_from(&o).is_ok());
    }

    #[test]
    fn a_region_with_an_ssd_tier_round_trips_and_reports_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = CString::new(dir.path().to_str().unwrap()).unwrap();
        let mut o = default_options();
        o.size = 32 << 20;
        o.resident = 1 << 20;
        o.store_limit = 1 << 20;
        o.ssd_path = path.as_ptr();
        o.ssd_size = 64 << 20;
        let mut r: *mut zmem_region = std::ptr::null_mut();
        // SAFETY: valid options and out pointer.
        let st = unsafe { zmem_region_create(&o, &mut r) };
        if st == zmem_status::ZMEM_PERMISSION || st == zmem_status::ZMEM_UNSUPPORTED {
            eprintln!("skipped: no userfaultfd here: {}", last_error());
            return;
        }
        assert_eq!(st, zmem_status::ZMEM_OK, "{}", last_error());
        // SAFETY: r is a live region of o.size bytes.
        let mem =
            unsafe { std::slice::from_raw_parts_mut(zmem_region_base(r) as *mut u8, 32 << 20) };
        // Half random bytes, half text: about 2:1, so the compressed pages overflow the
        // store limit many times over.
        let byte = |i: usize, k: usize| -> u8 {
            if k < 2048 {
                let x = ((i * 4096 + k) as u64 | 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                (x >> 56) as u8
            } else {
                b"page of a region with an SSD tier; "[k % 35] ^ (i as u8)
            }
        };
        for (i, chunk) in mem.chunks_mut(4096).enumerate() {
            for (k, b) in chunk.iter_mut().enumerate() {
                *b = byte(i, k);
            }
        }
        // The writeback runs in the background: wait for it (up to 10 s on a loaded machine).
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let mut s = zmem_stats::default();
            // SAFETY: r is live, s writable.
            assert_eq!(
                unsafe { zmem_region_stats(r, &mut s) },
                zmem_status::ZMEM_OK
            );
            if s.ssd_writeback_pages > 0 || std::time::Instant::now() > deadline {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        for (i, chunk) in mem.chunks(4096).enumerate().rev() {
            assert!(
                chunk.iter().enumerate().all(|(k, &b)| b == byte(i, k)),
                "page {i}"
            );
        }
        let mut stats = zmem_stats::default();
        // SAFETY: r is live, stats writable.
        assert_eq!(
            unsafe { zmem_region_stats(r, &mut stats) },
            zmem_status::ZMEM_OK
        );
        assert!(
            stats.ssd_writeback_pages > 0 && stats.ssd_reads > 0,
            "{stats:?}"
        );
        assert_eq!(stats.ssd_errors, 0);
        // SAFETY: r is live and not used after.
        unsafe { zmem_region_destroy(r) };

        // A regular file is refused, and left as it was.
        let file = dir.path().join("data");
        std::fs::write(&file, b"keep").unwrap();
        let fpath = CString::new(file.to_str().unwrap()).unwrap();
        o.ssd_path = fpath.as_ptr();
        // SAFETY: valid options and out pointer.
        let st = unsafe { zmem_region_create(&o, &mut r) };
        assert_eq!(st, zmem_status::ZMEM_INVALID_ARGUMENT, "{}", last_error());
        assert!(r.is_null());
        assert!(last_error().contains("SSD tier"), "{}", last_error());
        assert_eq!(std::fs::read(&file).unwrap(), b"keep");
    }

    #[test]
    fn every_heap_error_maps_to_its_status() {
        use zmem_status::*;
        let cases: Vec<(HeapError, zmem_status)> = vec![
            (
                HeapError::Region(RegionError::Config("bad".into())),
                ZMEM_INVALID_ARGUMENT,
            ),
            (
                HeapError::Region(RegionError::Permission {
                    source: io::Error::from(io::ErrorKind::PermissionDenied),
                }),
                ZMEM_PERMISSION,
            ),
            (HeapError::Config("small".into()), ZMEM_INVALID_ARGUMENT),
            (HeapError::Foreign { addr: 8 }, ZMEM_INVALID_ARGUMENT),
            (HeapError::SharedAllocator, ZMEM_UNSUPPORTED),
            (
                HeapError::Arena {
                    at: 0,
                    size: 1,
                    taken: 159,
                },
                ZMEM_NO_MEMORY,
            ),
            (
                HeapError::OutOfMemory {
                    size: 1,
                    capacity: 1,
                },
                ZMEM_NO_MEMORY,
            ),
            (HeapError::Overflow { count: 2, size: 3 }, ZMEM_NO_MEMORY),
            (
                HeapError::Os {
                    op: "mmap",
                    errno: zmem_os_errno(),
                },
                ZMEM_OS,
            ),
        ];
        for (err, want) in cases {
            let text = err.to_string();
            let failure = Failure::from(err);
            assert_eq!(failure.status, want, "{text}");
            assert_eq!(failure.message, text);
        }
    }

    fn zmem_os_errno() -> ::zmem_heap::Errno {
        ::zmem_heap::Errno(12)
    }

    #[test]
    fn heap_functions_refuse_null_and_set_errno() {
        use std::ptr::{null, null_mut};
        use zmem_status::ZMEM_INVALID_ARGUMENT;
        let errno = || std::io::Error::last_os_error().raw_os_error();
        // SAFETY: every pointer is NULL or points to a live local of the right type.
        unsafe {
            let mut out = std::ptr::dangling_mut::<zmem_heap>();
            assert_eq!(zmem_heap_create(null(), &mut out), ZMEM_INVALID_ARGUMENT);
            assert!(out.is_null(), "*out is cleared on failure");
            assert_eq!(last_error(), "zmem_heap_create: options is NULL");
            let o = default_options();
            assert_eq!(zmem_heap_create(&o, null_mut()), ZMEM_INVALID_ARGUMENT);
            assert_eq!(last_error(), "zmem_heap_create: out is NULL");
            let mut small = o;
            small.size = 1 << 20;
            small.resident = 1 << 20;
            assert_eq!(zmem_heap_create(&small, &mut out), ZMEM_INVALID_ARGUMENT);
            assert!(
                last_error().contains("below the smallest heap"),
                "{}",
                last_error()
            );

            assert!(zmem_malloc(null_mut(), 8).is_null());
            assert_eq!(errno(), Some(libc::EINVAL));
            assert_eq!(last_error(), "zmem_malloc: heap is NULL");
            assert!(zmem_calloc(null_mut(), 1, 8).is_null());
            assert_eq!(last_error(), "zmem_calloc: heap is NULL");
            assert!(zmem_realloc(null_mut(), null_mut(), 8).is_null());
            assert_eq!(errno(), Some(libc::EINVAL));
            assert_eq!(zmem_free(null_mut(), null_mut()), ZMEM_INVALID_ARGUMENT);
            assert_eq!(last_error(), "zmem_free: heap is NULL");
            assert_eq!(zmem_usable_size(null(), null()), 0);
            let mut stats = zmem_heap_statistics::default();
            assert_eq!(zmem_heap_stats(null(), &mut stats), ZMEM_INVALID_ARGUMENT);
            assert_eq!(last_error(), "zmem_heap_stats: heap is NULL");
            zmem_heap_destroy(null_mut());
        }
    }

    #[test]
    fn a_heap_through_the_c_api() {
        let mut o = default_options();
        o.size = 64 << 20;
        o.resident = 2 << 20;
        let mut h: *mut zmem_heap = std::ptr::null_mut();
        // SAFETY: valid options and out pointer.
        let st = unsafe { zmem_heap_create(&o, &mut h) };
        if st == zmem_status::ZMEM_PERMISSION || st == zmem_status::ZMEM_UNSUPPORTED {
            eprintln!("skipped: no userfaultfd here: {}", last_error());
            return;
        }
        assert_eq!(st, zmem_status::ZMEM_OK, "{}", last_error());
        let errno = || std::io::Error::last_os_error().raw_os_error();
        // SAFETY: h is a live heap; every pointer passed is NULL, one of its blocks, or foreign
        // (refused before use).
        unsafe {
            let mut blocks = Vec::new();
            for i in 0..4000usize {
                let p = zmem_malloc(h, 2000).cast::<u8>();
                assert!(!p.is_null());
                std::ptr::write_bytes(p, i as u8, 2000);
                blocks.push(p);
            }
            for (i, &p) in blocks.iter().enumerate() {
                let s = std::slice::from_raw_parts(p, 2000);
                assert!(s.iter().all(|&b| b == i as u8), "block {i}");
                assert!(zmem_usable_size(h, p.cast()) >= 2000);
            }
            let z = zmem_calloc(h, 100, 10).cast::<u8>();
            assert!(std::slice::from_raw_parts(z, 1000).iter().all(|&b| b == 0));
            let r = zmem_realloc(h, blocks[0].cast(), 5000).cast::<u8>();
            assert!(std::slice::from_raw_parts(r, 2000).iter().all(|&b| b == 0));
            blocks[0] = r;

            assert!(zmem_malloc(h, 1 << 30).is_null());
            assert_eq!(errno(), Some(libc::ENOMEM));
            assert!(
                last_error().starts_with("zmem_malloc: out of memory"),
                "{}",
                last_error()
            );
            assert!(zmem_calloc(h, usize::MAX, 2).is_null());
            assert_eq!(errno(), Some(libc::ENOMEM));
            assert!(last_error().contains("overflows"), "{}", last_error());
            let mut local = 0u64;
            let foreign = (&mut local as *mut u64).cast::<c_void>();
            assert_eq!(zmem_free(h, foreign), zmem_status::ZMEM_INVALID_ARGUMENT);
            assert!(
                last_error().contains("is not a block of this heap"),
                "{}",
                last_error()
            );
            assert!(zmem_realloc(h, foreign, 10).is_null());
            assert_eq!(errno(), Some(libc::EINVAL));
            assert_eq!(zmem_usable_size(h, foreign), 0);
            assert_eq!(zmem_free(h, std::ptr::null_mut()), zmem_status::ZMEM_OK);

            let mut stats = zmem_heap_statistics::default();
            assert_eq!(zmem_heap_stats(h, &mut stats), zmem_status::ZMEM_OK);
            assert_eq!(stats.live_blocks, 4001);
            assert!(stats.allocated >= 4000 * 2000);
            assert_eq!(stats.capacity, 64 << 20);
            assert_eq!(stats.arenas, 1);
            assert!(stats.region.evictions > 0, "{stats:?}");
            assert_eq!(
                zmem_heap_stats(h, std::ptr::null_mut()),
                zmem_status::ZMEM_INVALID_ARGUMENT
            );
            for p in blocks.drain(..100) {
                assert_eq!(zmem_free(h, p.cast()), zmem_status::ZMEM_OK);
            }
            // Destroyed with 3901 blocks live.
            zmem_heap_destroy(h);
        }
    }
}
