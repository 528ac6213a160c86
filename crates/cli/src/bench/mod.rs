//! `zmem bench`: the page benchmark (fio-like) and its targets, the kernel's zram and zmem.

pub mod adaptive;
pub mod blockdev;
pub mod cgroup;
pub mod codecs;
pub mod compare;
pub mod corpus;
pub mod kv;
pub mod memcached;
pub mod pages;
pub mod redis;
pub mod region;
pub mod zmem_target;
pub mod zram;

use std::alloc::{self, Layout};
use std::io::IsTerminal;
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Once;

use serde::Serialize;

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

fn ratio(a: u64, b: u64) -> Option<f64> {
    (a > 0 && b > 0).then(|| a as f64 / b as f64)
}

/// Returned by benchmark loops when SIGINT/SIGTERM arrived, so that guards (zram reset) run.
#[derive(Debug, thiserror::Error)]
#[error("interrupted")]
pub struct Interrupted;

static ABORT: AtomicBool = AtomicBool::new(false);
static SIGNALS: AtomicUsize = AtomicUsize::new(0);
static HANDLER: Once = Once::new();

/// Turns SIGINT/SIGTERM into the global abort flag (checked by the bench loops). A second
/// signal exits at once (status 130) in case a loop is stuck in a system call.
pub fn install_abort_handler() {
    HANDLER.call_once(|| {
        let res = ctrlc::set_handler(|| {
            ABORT.store(true, Ordering::SeqCst);
            if SIGNALS.fetch_add(1, Ordering::SeqCst) >= 1 {
                eprintln!("zmem: second interrupt, exiting without cleanup");
                std::process::exit(130);
            }
            eprintln!("zmem: interrupted, stopping and cleaning up (again to exit at once)");
        });
        if let Err(e) = res {
            tracing::warn!("cannot install the SIGINT/SIGTERM handler: {e}");
        }
    });
}

/// Whether an abort was requested.
pub fn aborted() -> bool {
    ABORT.load(Ordering::Relaxed)
}

/// Err(Interrupted) once an abort was requested.
pub fn check_abort() -> Result<(), Interrupted> {
    if aborted() {
        Err(Interrupted)
    } else {
        Ok(())
    }
}

/// Requests an abort as a signal would (used by tests and by fatal errors in worker threads).
pub fn request_abort() {
    ABORT.store(true, Ordering::SeqCst);
}

/// Whether progress bars should be drawn (stderr is a terminal).
pub fn progress_enabled() -> bool {
    std::io::stderr().is_terminal()
}

/// A progress bar over `total` bytes on a terminal; hidden otherwise.
pub fn progress_bar(total: u64, msg: String) -> indicatif::ProgressBar {
    if !progress_enabled() {
        return indicatif::ProgressBar::hidden();
    }
    let pb = indicatif::ProgressBar::new(total);
    if let Ok(style) = indicatif::ProgressStyle::with_template(
        "{msg:32} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
    ) {
        pb.set_style(style.progress_chars("=> "));
    }
    pb.set_message(msg);
    pb
}

/// Page alignment required by O_DIRECT and promised by [`PageTarget`].
pub const PAGE: usize = 4096;

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

/// Machine facts recorded in every JSON.
#[derive(Clone, Debug, Serialize)]
pub struct MachineInfo {
    pub nproc: usize,
    pub cpu_model: String,
    pub kernel: String,
}

impl MachineInfo {
    pub fn collect() -> Self {
        let nproc = std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1);
        let cpu_model = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|s| {
                s.lines()
                    .find(|l| l.starts_with("model name"))
                    .and_then(|l| l.split_once(':'))
                    .map(|(_, v)| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        MachineInfo {
            nproc,
            cpu_model,
            kernel: kernel_release(),
        }
    }
}

fn kernel_release() -> String {
    // SAFETY: utsname is plain old data; uname fills it and returns 0 on success.
    let mut uts: libc::utsname = unsafe { std::mem::zeroed() };
    // SAFETY: &mut uts is a valid pointer to a utsname.
    if unsafe { libc::uname(&mut uts) } != 0 {
        return "unknown".into();
    }
    let field = |f: &[libc::c_char]| {
        let bytes: Vec<u8> = f
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c as u8)
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    };
    format!(
        "{} {} {}",
        field(&uts.sysname),
        field(&uts.release),
        field(&uts.machine)
    )
}

/// Formats a byte count with a binary suffix (e.g. 512M, 4k), as sizes are given on the command line.
pub fn fmt_size(n: u64) -> String {
    const UNITS: [(u64, &str); 3] = [(1 << 30, "G"), (1 << 20, "M"), (1 << 10, "k")];
    for (unit, s) in UNITS {
        if n >= unit && n % unit == 0 {
            return format!("{}{}", n / unit, s);
        }
    }
    n.to_string()
}
