//! What the page benchmark drives: [`PageTarget`] (zram or zmem), its memory accounting, and
//! the page-aligned buffers it hands them.

use std::alloc::{self, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

use serde::Serialize;

/// zmem policy names.
pub const POLICIES: [&str; 4] = ["fast", "balanced", "max", "auto"];

/// One thing the page benchmark can drive: the kernel's zram (a block device) or a zmem page store.
pub trait PageTarget: Send + Sync {
    /// e.g. "zram0 lz4", "zmem balanced".
    fn name(&self) -> String;
    fn size_bytes(&self) -> u64;
    /// buf.len() is the block size (a multiple of 4096), offset a multiple of it; buf is 4096-aligned.
    fn write_at(&self, offset: u64, buf: &[u8]) -> anyhow::Result<()>;
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> anyhow::Result<()>;
    /// Completes all outstanding writes (a zmem store may compress asynchronously); timed as part of a write phase.
    fn flush(&self) -> anyhow::Result<()>;
    /// Memory accounting after a phase (for zram: parsed from /sys/block/zramN/mm_stat).
    fn memory(&self) -> anyhow::Result<MemoryReport>;
    /// Extra per-target counters for the JSON (codec counters, fallbacks...), Value::Null if none.
    fn extra(&self) -> serde_json::Value {
        serde_json::Value::Null
    }
    /// Runs now what the target would do to idle data in the background (zmem `auto`: its idle
    /// recompression pass), so a run can report the settled state beside the first. Returns
    /// false for a target that has no such pass (zram here, the other zmem policies).
    fn settle(&self) -> anyhow::Result<bool> {
        Ok(false)
    }
}

/// Memory accounting of a target, zram's mm_stat fields.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct MemoryReport {
    pub orig_data_size: u64,
    pub compr_data_size: u64,
    pub mem_used_total: u64,
    pub same_pages: u64,
    pub huge_pages: u64,
}

impl MemoryReport {
    /// orig_data_size / mem_used_total: memory really used (the headline ratio).
    pub fn ratio_mem_used(&self) -> Option<f64> {
        ratio(self.orig_data_size, self.mem_used_total)
    }
    /// orig_data_size / compr_data_size.
    pub fn ratio_compr(&self) -> Option<f64> {
        ratio(self.orig_data_size, self.compr_data_size)
    }
}

pub(crate) fn ratio(a: u64, b: u64) -> Option<f64> {
    (a > 0 && b > 0).then(|| a as f64 / b as f64)
}

/// Page alignment required by O_DIRECT and promised by [`PageTarget`].
pub use zmem_os::PAGE_SIZE as PAGE;

/// A zeroed, 4096-aligned heap buffer.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared access only hands out &[u8].
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (len > 0) aligned to 4096.
    pub fn new(len: usize) -> Self {
        let len = len.max(1);
        let layout = Layout::from_size_align(len, PAGE).expect("buffer size overflows a Layout");
        // SAFETY: layout has a non-zero size.
        let raw = unsafe { alloc::alloc_zeroed(layout) };
        let Some(ptr) = NonNull::new(raw) else {
            alloc::handle_alloc_error(layout)
        };
        AlignedBuf { ptr, len }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr points to len initialised (zeroed at allocation) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref, and &mut self gives exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this very layout (checked there).
        unsafe {
            alloc::dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align_unchecked(self.len, PAGE),
            )
        }
    }
}
