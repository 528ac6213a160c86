//! Memory that tiers itself. A [`Region`] is a range of virtual memory that application threads
//! use as plain memory; at most its budget of it stays in DRAM, the coldest pages are compressed
//! into a [`zmem_store::PageStore`], and a touch brings a page back. It works from user space
//! with userfaultfd (full mode, so read(2) into an evicted page works too).
//!
//! See docs/DESIGN-NOTES.md ("Regions") for the fault path, eviction, fork and the policy.

pub mod budget;
mod budget_loop;
mod manager;
pub mod policy;
mod uffd;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hdrhistogram::Histogram;
use parking_lot::{Condvar, Mutex};
use zmem_engine::Policy;
use zmem_store::{PageStore, StoreConfig, StoreError, StoreStats};

use budget_loop::BudgetLoop;
use manager::{Counters, Shared, Space, SpaceInner, STAGING_SLOTS};
use policy::Tracker;

pub use budget::{AdaptiveConfig, BudgetSample};
pub use policy::Eviction;

/// Size of a page of a region.
pub const PAGE: usize = 4096;

/// How much of the region may stay resident (uncompressed, mapped) in DRAM.
#[derive(Clone, Debug, PartialEq)]
pub enum Budget {
    /// At most this many bytes (rounded down to pages, at least 16 pages).
    Fixed(u64),
    /// Sized at run time from memory pressure and the region's own refault rate.
    Adaptive(AdaptiveConfig),
}

/// Settings of a region.
#[derive(Clone, Debug)]
pub struct RegionConfig {
    /// Bytes of address space (rounded up to pages).
    pub size: u64,
    pub budget: Budget,
    /// Compression policy of the page store under the region.
    pub policy: Policy,
    /// Which pages leave DRAM first.
    pub eviction: Eviction,
    /// Pages mapped at once when faults run sequentially (1 = off).
    pub fault_around: usize,
    /// Threads reading the userfaultfd (each resolves the faults it reads).
    pub handler_threads: usize,
    /// Bytes of DRAM the compressed pages may use (zram's mem_limit); None = unlimited. When
    /// the store is full, pages that cannot be evicted stay resident beyond the budget.
    pub store_limit: Option<u64>,
    /// Pages compressed together as one block when they are evicted, whatever their
    /// addresses (1 = each page alone; at most [`zmem_store::MAX_BLOCK_PAGES`]). A block
    /// compresses better (zstd-3: +17% at 8 pages, +20% at 16), but a fault on one of its pages
    /// decodes the whole block, and its bytes stay until its last page is gone: the evictor
    /// repacks the survivors of half-dead blocks, which costs CPU. Worth it only where evicted
    /// pages mostly stay cold; with refaults it loses ratio and time (measurements in
    /// `zmem_engine::policy`). None = the policy's choice ([`Policy::evict_group`], 1 for all).
    pub evict_group: Option<usize>,
}

impl RegionConfig {
    pub fn new(size: u64, budget: Budget) -> RegionConfig {
        RegionConfig {
            size,
            budget,
            policy: Policy::Fast,
            eviction: Eviction::Clock,
            fault_around: 16,
            handler_threads: 1,
            store_limit: None,
            evict_group: None,
        }
    }
}

/// Errors of a region. Creating a region either succeeds whole or leaves nothing behind.
#[derive(thiserror::Error, Debug)]
pub enum RegionError {
    #[error(
        "cannot open /dev/userfaultfd: {source}. zmem needs full-mode userfaultfd: give this user \
         read-write access to /dev/userfaultfd (e.g. `setfacl -m u:$USER:rw /dev/userfaultfd`), \
         or run with CAP_SYS_PTRACE, or set vm.unprivileged_userfaultfd=1"
    )]
    Permission { source: std::io::Error },
    #[error("userfaultfd lacks {feature}: {why}")]
    Unsupported { feature: &'static str, why: String },
    #[error("{op} failed: {source}")]
    Os {
        op: &'static str,
        source: std::io::Error,
    },
    #[error("invalid region configuration: {0}")]
    Config(String),
    #[error("page store: {0}")]
    Store(#[from] StoreError),
    #[error("this process is a fork of the one that created the region; only the creator can {0}")]
    ForkedChild(&'static str),
}

/// Fault latency summary, in nanoseconds, measured by the handler from reading the fault to
/// waking the faulting thread.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Latency {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

/// Statistics of a region.
#[derive(Clone, Debug, Default)]
pub struct RegionStats {
    pub size: u64,
    /// Current budget in bytes (changes over time with an adaptive budget).
    pub budget: u64,
    /// Bytes mapped in the region now.
    pub resident: u64,
    /// Bytes of evicted pages waiting in staging for compression.
    pub staged: u64,
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
    /// Pages that were shared with a forked child and had to be unshared before moving out.
    pub unshared: u64,
    pub forks: u64,
    /// Evicted pages the store refused because it was full (they stayed resident).
    pub store_refused: u64,
    /// Fault resolution latency.
    pub fault_latency: Latency,
    /// The page store under the region (zram mm_stat meanings).
    pub store: StoreStats,
}

impl RegionStats {
    /// Every fault served by the handler.
    pub fn faults(&self) -> u64 {
        self.major_faults + self.zero_faults + self.staged_faults
    }

    /// Bytes of the region's data per byte of DRAM it uses (resident + staged + compressed
    /// pool): how much more memory the program sees than it costs.
    pub fn effective_ratio(&self) -> f64 {
        let data = self.resident + self.staged + self.store.orig_data_size;
        let dram = self.resident + self.staged + self.store.mem_used_total;
        if dram == 0 {
            return 0.0;
        }
        data as f64 / dram as f64
    }
}

/// A range of memory that tiers itself. Use [`Region::as_ptr`] ..`+len()` as plain memory from
/// any thread. Dropping it stops its threads, unmaps the range and frees every compressed page.
pub struct Region {
    shared: Option<Arc<Shared>>,
    threads: Vec<JoinHandle<()>>,
    base: usize,
    len: usize,
    staging: usize,
    interval: Option<Duration>,
    history: Option<budget_loop::History>,
}

// SAFETY: all shared state behind a Region is synchronised internally; the raw addresses are
// plain numbers.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

/// The smallest budget: below this a region would spend its time evicting.
pub const MIN_BUDGET_PAGES: usize = 16;

fn os(op: &'static str) -> RegionError {
    RegionError::Os {
        op,
        source: std::io::Error::last_os_error(),
    }
}

/// Anonymous private mapping, unmapped on drop unless disarmed.
struct Mapping {
    addr: usize,
    len: usize,
}

impl Mapping {
    fn new(len: usize) -> Result<Mapping, RegionError> {
        // SAFETY: a fresh anonymous mapping; the kernel picks the address.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(os("mmap"));
        }
        Ok(Mapping {
            addr: p as usize,
            len,
        })
    }
    fn disarm(self) -> usize {
        let a = self.addr;
        std::mem::forget(self);
        a
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: our own mapping.
        unsafe { libc::munmap(self.addr as *mut _, self.len) };
    }
}

impl Region {
    pub fn new(cfg: RegionConfig) -> Result<Region, RegionError> {
        let len = usize::try_from(cfg.size)
            .ok()
            .and_then(|s| s.checked_next_multiple_of(PAGE))
            .filter(|&l| l > 0 && l / PAGE < u32::MAX as usize)
            .ok_or_else(|| {
                RegionError::Config(format!(
                    "size {} must be between 1 byte and {} bytes",
                    cfg.size,
                    (u32::MAX as u64 - 1) * PAGE as u64
                ))
            })?;
        let pages = len / PAGE;
        if !(1..=64).contains(&cfg.fault_around) {
            return Err(RegionError::Config(format!(
                "fault_around {} must be 1..=64 pages",
                cfg.fault_around
            )));
        }
        if !(1..=16).contains(&cfg.handler_threads) {
            return Err(RegionError::Config(format!(
                "handler_threads {} must be 1..=16",
                cfg.handler_threads
            )));
        }
        let evict_group = cfg.evict_group.unwrap_or(cfg.policy.evict_group());
        if !(1..=zmem_store::MAX_BLOCK_PAGES).contains(&evict_group) {
            return Err(RegionError::Config(format!(
                "evict_group {evict_group} must be 1..={} pages",
                zmem_store::MAX_BLOCK_PAGES
            )));
        }
        let mut adaptive = None;
        let budget_bytes = match &cfg.budget {
            Budget::Fixed(b) => *b,
            Budget::Adaptive(a) => {
                a.validate().map_err(RegionError::Config)?;
                let l = BudgetLoop::new(a.clone());
                let b = l.initial();
                adaptive = Some(l);
                b
            }
        };
        let budget_pages = (budget_bytes / PAGE as u64) as usize;
        if budget_pages < MIN_BUDGET_PAGES {
            return Err(RegionError::Config(format!(
                "budget {budget_bytes} bytes is below the minimum of {MIN_BUDGET_PAGES} pages ({} bytes)",
                MIN_BUDGET_PAGES * PAGE
            )));
        }

        let features = uffd::FEATURE_EVENT_FORK
            | uffd::FEATURE_EVENT_REMAP
            | uffd::FEATURE_EVENT_REMOVE
            | uffd::FEATURE_EVENT_UNMAP
            | uffd::FEATURE_MOVE
            | uffd::FEATURE_POISON;
        let (fd, _how) = uffd::Uffd::open(features).map_err(|e| match e {
            uffd::OpenError::Permission(source) => RegionError::Permission { source },
            uffd::OpenError::Unsupported(feature, why) => RegionError::Unsupported { feature, why },
        })?;
        let region = Mapping::new(len)?;
        let staging = Mapping::new(STAGING_SLOTS * PAGE)?;
        fd.register_missing(region.addr, len)
            .map_err(|source| RegionError::Os {
                op: "UFFDIO_REGISTER (region)",
                source,
            })?;
        fd.register_missing(staging.addr, STAGING_SLOTS * PAGE)
            .map_err(|source| RegionError::Os {
                op: "UFFDIO_REGISTER (staging)",
                source,
            })?;
        let mut store_cfg = StoreConfig::new(pages as u64, cfg.policy);
        store_cfg.mem_limit = cfg.store_limit;
        if cfg.policy == Policy::Auto {
            // Evicted pages that stay cold are recompressed with zstd into blocks.
            store_cfg.recompress_interval = Some(Duration::from_secs(1));
        }
        let store = PageStore::new(store_cfg.clone())?;
        // SAFETY: plain eventfd creation.
        let stop_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if stop_fd < 0 {
            return Err(os("eventfd"));
        }
        // SAFETY: as above.
        let gate_fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if gate_fd < 0 {
            let e = os("eventfd");
            // SAFETY: closing the descriptor we just made.
            unsafe { libc::close(stop_fd) };
            return Err(e);
        }
        let root = Space {
            uffd: fd,
            base: region.addr,
            pages,
            store: std::mem::ManuallyDrop::new(store),
            inner: Mutex::new(SpaceInner::new(
                vec![manager::ABSENT; pages],
                Some(Tracker::new(pages, cfg.eviction)),
            )),
            is_root: true,
            dead: AtomicBool::new(false),
        };
        let shared = Arc::new(Shared {
            root: Arc::new(root),
            children: Mutex::new(Vec::new()),
            staging: staging.addr,
            budget_pages: AtomicUsize::new(budget_pages),
            fault_around: cfg.fault_around,
            evict_group,
            evict_lock: Mutex::new(()),
            evictor_wake: Condvar::new(),
            evictor_mutex: Mutex::new(false),
            stop: AtomicBool::new(false),
            stop_fd,
            counters: Counters::default(),
            latency: Mutex::new(
                Histogram::new_with_bounds(1, 60_000_000_000, 2).expect("static histogram bounds"),
            ),
            store_cfg,
            // SAFETY: getpid cannot fail.
            creator_pid: unsafe { libc::getpid() } as u32,
            zero_page: vec![0u8; PAGE].into_boxed_slice(),
            last_fault_at: Mutex::new(std::time::Instant::now()),
            forking: AtomicBool::new(false),
            store_full: AtomicBool::new(false),
            store_full_ms: std::sync::atomic::AtomicU64::new(0),
            enomem_streak: std::sync::atomic::AtomicU64::new(0),
            parked: AtomicUsize::new(0),
            workers: cfg.handler_threads + 1,
            gate_fd,
        });
        let interval = adaptive.as_ref().map(|a| a.interval());
        let history = adaptive.as_ref().map(|a| a.history.clone());
        let mut region_obj = Region {
            shared: Some(shared.clone()),
            threads: Vec::new(),
            base: region.disarm(),
            len,
            staging: staging.disarm(),
            interval,
            history,
        };
        if let Some(a) = adaptive.as_mut() {
            a.tick(&shared, true);
        }
        for i in 0..cfg.handler_threads {
            let s = shared.clone();
            let h = zmem_engine::thread::spawn(format!("zmem-fault-{i}"), move || s.handler_loop())
                .map_err(|source| RegionError::Os {
                    op: "spawn fault handler",
                    source,
                })?;
            region_obj.threads.push(h);
        }
        let s = shared.clone();
        let h = zmem_engine::thread::spawn("zmem-evict".into(), move || s.evictor_loop(adaptive))
            .map_err(|source| RegionError::Os {
            op: "spawn evictor",
            source,
        })?;
        region_obj.threads.push(h);
        manager::register_for_fork(&shared);
        Ok(region_obj)
    }

    /// First byte of the region.
    pub fn as_ptr(&self) -> *mut u8 {
        self.base as *mut u8
    }

    /// Bytes of the region.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn shared(&self) -> &Arc<Shared> {
        self.shared.as_ref().expect("region alive")
    }

    fn in_creator(&self) -> bool {
        // SAFETY: getpid cannot fail.
        (unsafe { libc::getpid() } as u32) == self.shared().creator_pid
    }

    pub fn stats(&self) -> RegionStats {
        let sh = self.shared();
        let c = &sh.counters;
        let resident = sh.root.inner.lock().resident as u64 * PAGE as u64;
        let fault_latency = {
            let h = sh.latency.lock();
            Latency {
                count: h.len(),
                p50: h.value_at_quantile(0.5),
                p99: h.value_at_quantile(0.99),
                p999: h.value_at_quantile(0.999),
                max: h.max(),
            }
        };
        RegionStats {
            size: self.len as u64,
            budget: sh.budget() as u64 * PAGE as u64,
            resident,
            staged: c.staged_now.load(Relaxed) as u64 * PAGE as u64,
            major_faults: c.major_faults.load(Relaxed),
            zero_faults: c.zero_faults.load(Relaxed),
            staged_faults: c.staged_faults.load(Relaxed),
            fault_around_pages: c.fault_around_pages.load(Relaxed),
            evictions: c.evictions.load(Relaxed),
            direct_evictions: c.direct_evictions.load(Relaxed),
            unshared: c.unshared.load(Relaxed),
            forks: c.forks.load(Relaxed),
            store_refused: c.store_refused.load(Relaxed),
            fault_latency,
            store: sh.root.store.stats(),
        }
    }

    /// Clears the fault latency histogram (e.g. between the fill and the measured phase).
    pub fn reset_latency(&self) {
        self.shared().latency.lock().reset();
    }

    /// Keeps the pages of `[offset, offset + len)` (bytes from the start, widened to whole
    /// pages) in DRAM once they are faulted in: they count against the budget but are never
    /// evicted. For memory that the threads serving the region may touch themselves (an
    /// allocator's metadata inside the region), which must never fault.
    pub fn pin(&self, offset: usize, len: usize) -> Result<(), RegionError> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.len)
            .ok_or_else(|| {
                RegionError::Config(format!(
                    "pin range {offset}+{len} is outside the region of {} bytes",
                    self.len
                ))
            })?;
        let (first, last) = ((offset / PAGE) as u32, end.div_ceil(PAGE) as u32);
        let sh = self.shared();
        let mut inner = sh.root.inner.lock();
        inner.pinned.push((first, last));
        inner.nursery.retain(|&p| !(first..last).contains(&p));
        if let Some(t) = inner.tracker.as_mut() {
            for p in first..last {
                t.remove(p);
            }
        }
        Ok(())
    }

    /// Current budget in bytes.
    pub fn budget(&self) -> u64 {
        self.shared().budget() as u64 * PAGE as u64
    }

    /// Change the budget (an adaptive region's controller overrides it at its next step).
    /// Shrinking evicts in the background; faults wait for room, they never fail.
    pub fn set_budget(&self, bytes: u64) -> Result<(), RegionError> {
        if !self.in_creator() {
            return Err(RegionError::ForkedChild("change the budget"));
        }
        let pages = (bytes / PAGE as u64) as usize;
        if pages < MIN_BUDGET_PAGES {
            return Err(RegionError::Config(format!(
                "budget {bytes} bytes is below the minimum of {MIN_BUDGET_PAGES} pages"
            )));
        }
        let sh = self.shared();
        sh.budget_pages.store(pages, Relaxed);
        sh.kick_evictor();
        Ok(())
    }

    /// Interval of the adaptive budget's control loop (None for a fixed budget).
    pub fn control_interval(&self) -> Option<Duration> {
        self.interval
    }

    /// The adaptive budget's decisions so far: (seconds since creation, decision).
    pub fn budget_history(&self) -> Vec<(f64, budget::Decision)> {
        self.history
            .as_ref()
            .map(|h| h.lock().clone())
            .unwrap_or_default()
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        let Some(shared) = self.shared.take() else {
            return;
        };
        // SAFETY: getpid cannot fail.
        if (unsafe { libc::getpid() } as u32) != shared.creator_pid {
            // A forked child: the threads and the store belong to the parent. Unmap our copy
            // of the range; the rest is the parent's (its memory here is a copy-on-write view).
            // SAFETY: the child's own mapping of the region.
            unsafe { libc::munmap(self.base as *mut _, self.len) };
            std::mem::forget(shared);
            return;
        }
        shared.stop.store(true, Relaxed);
        let one: u64 = 1;
        // SAFETY: writing 8 bytes to our eventfd.
        unsafe { libc::write(shared.stop_fd, (&one as *const u64).cast(), 8) };
        shared.kick_evictor();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        let unmapped = shared.root.inner.lock().unmapped.clone();
        // SAFETY: our eventfds.
        unsafe {
            libc::close(shared.stop_fd);
            libc::close(shared.gate_fd);
        }
        // Closing the descriptors (last reference) wakes any thread still blocked on a fault;
        // it then finds plain anonymous memory until the range is unmapped below.
        drop(shared);
        // SAFETY: our own mappings; parts the program already unmapped are skipped.
        unsafe {
            libc::munmap(self.staging as *mut _, STAGING_SLOTS * PAGE);
            let mut start = self.base;
            let end = self.base + self.len;
            let mut holes: Vec<(usize, usize)> = unmapped
                .into_iter()
                .map(|(a, b)| (a.max(start), b.min(end)))
                .filter(|(a, b)| a < b)
                .collect();
            holes.sort_unstable();
            for (a, b) in holes {
                if a > start {
                    libc::munmap(start as *mut _, a - start);
                }
                start = start.max(b);
            }
            if start < end {
                libc::munmap(start as *mut _, end - start);
            }
        }
    }
}

/// Eviction in groups (several evicted pages compressed as one block): the program's view
/// must stay exactly what it wrote. Each test skips where /dev/userfaultfd cannot be opened.
#[cfg(test)]
mod group_tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn region_with(cfg: RegionConfig) -> Option<Region> {
        match Region::new(cfg) {
            Ok(r) => Some(r),
            Err(e @ RegionError::Permission { .. }) => {
                eprintln!("skipped: {e}");
                None
            }
            Err(e) => panic!("creating a region: {e}"),
        }
    }

    fn grouped(size: u64, budget: u64, group: usize) -> Option<Region> {
        let mut cfg = RegionConfig::new(size, Budget::Fixed(budget));
        cfg.policy = Policy::Max;
        cfg.evict_group = Some(group);
        region_with(cfg)
    }

    fn fill(page: &mut [u8], idx: usize, version: u64) {
        let words = b"pages evicted together are compressed together, whatever their address ";
        for (i, b) in page.iter_mut().enumerate() {
            *b = words[(i + idx * 5 + version as usize) % words.len()];
        }
        page[..8].copy_from_slice(&(idx as u64).to_le_bytes());
        page[8..16].copy_from_slice(&version.to_le_bytes());
    }

    fn check(page: &[u8], idx: usize, version: u64) {
        let mut want = vec![0u8; PAGE];
        fill(&mut want, idx, version);
        if page != &want[..] {
            let got_idx = u64::from_le_bytes(page[..8].try_into().unwrap());
            let got_ver = u64::from_le_bytes(page[8..16].try_into().unwrap());
            panic!("page {idx} version {version}: found page {got_idx} version {got_ver}");
        }
    }

    // The region is shared memory by design; each test gives every page one writer at a time.
    #[allow(clippy::mut_from_ref)]
    fn page_mut(r: &Region, idx: usize) -> &mut [u8] {
        assert!((idx + 1) * PAGE <= r.len());
        // SAFETY: within the region, which lives as long as `r`; one writer per page.
        unsafe { std::slice::from_raw_parts_mut(r.as_ptr().add(idx * PAGE), PAGE) }
    }

    #[test]
    fn the_group_size_is_checked_and_defaults_by_policy() {
        for bad in [0usize, zmem_store::MAX_BLOCK_PAGES + 1] {
            let mut cfg = RegionConfig::new(MIB, Budget::Fixed(MIB));
            cfg.evict_group = Some(bad);
            match Region::new(cfg) {
                Err(RegionError::Config(msg)) => assert!(msg.contains("evict_group"), "{msg}"),
                Err(RegionError::Permission { .. }) => {}
                Err(e) => panic!("wrong error: {e}"),
                Ok(_) => panic!("accepted evict_group {bad}"),
            }
        }
        for p in Policy::ALL {
            assert!((1..=zmem_store::MAX_BLOCK_PAGES).contains(&p.evict_group()));
        }
        // Measured: groups lose ratio and time wherever evicted pages refault (policy.rs).
        for p in Policy::ALL {
            assert_eq!(p.evict_group(), 1, "{p}");
        }
    }

    #[test]
    fn random_access_round_trips_with_groups_and_repacks() {
        for group in [2usize, 8, 16] {
            let Some(r) = grouped(16 * MIB, MIB, group) else {
                return;
            };
            let pages = r.len() / PAGE;
            let mut ver = vec![0u64; pages];
            for (i, v) in ver.iter_mut().enumerate() {
                *v = 1;
                fill(page_mut(&r, i), i, 1);
            }
            let mut x = 0x5EED_u64 + group as u64;
            for _ in 0..30_000 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                let i = (x as usize) % pages;
                if x & 1 == 0 {
                    ver[i] += 1;
                    fill(page_mut(&r, i), i, ver[i]);
                } else {
                    check(page_mut(&r, i), i, ver[i]);
                }
            }
            for (i, &v) in ver.iter().enumerate() {
                check(page_mut(&r, i), i, v);
            }
            let s = r.stats();
            assert!(
                s.store.block_pages > 0,
                "group {group}: no blocks: {:?}",
                s.store
            );
            assert!(s.store.repacked_pages > 0, "group {group}: no repacks");
            assert_eq!(s.store_refused, 0);
        }
    }

    #[test]
    fn threads_and_sequential_faults_on_grouped_pages() {
        let Some(r) = grouped(32 * MIB, 2 * MIB, 8) else {
            return;
        };
        let r = Arc::new(r);
        let pages = r.len() / PAGE;
        let threads = 4;
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let r = r.clone();
                std::thread::spawn(move || {
                    let mine: Vec<usize> = (t..pages).step_by(threads).collect();
                    let mut ver = vec![0u64; mine.len()];
                    let mut x = 77 + t as u64;
                    for round in 0..3 {
                        // A sequential pass (fault-around over grouped pages), then random.
                        for (k, &i) in mine.iter().enumerate() {
                            if round == 0 {
                                ver[k] = 1;
                                fill(page_mut(&r, i), i, 1);
                            } else {
                                check(page_mut(&r, i), i, ver[k]);
                            }
                        }
                        for _ in 0..5000 {
                            x ^= x << 13;
                            x ^= x >> 7;
                            x ^= x << 17;
                            let k = (x as usize) % mine.len();
                            if x & 3 == 0 {
                                ver[k] += 1;
                                fill(page_mut(&r, mine[k]), mine[k], ver[k]);
                            } else {
                                check(page_mut(&r, mine[k]), mine[k], ver[k]);
                            }
                        }
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert!(r.stats().store.block_pages > 0);
    }

    #[test]
    fn a_full_store_keeps_grouped_pages_resident() {
        let mut cfg = RegionConfig::new(16 * MIB, Budget::Fixed(MIB));
        cfg.policy = Policy::Max;
        cfg.evict_group = Some(8);
        cfg.store_limit = Some(256 * 1024);
        let Some(r) = region_with(cfg) else {
            return;
        };
        // Half of the pages compress (they share blocks), half do not (their groups fall back
        // to pages stored one by one, raw): the limit is hit on both paths.
        let noise = |idx: usize| -> Vec<u8> {
            let mut x = (idx as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            (0..PAGE)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    x as u8
                })
                .collect()
        };
        let pages = r.len() / PAGE;
        for i in 0..pages {
            if i % 2 == 0 {
                fill(page_mut(&r, i), i, 3);
            } else {
                page_mut(&r, i).copy_from_slice(&noise(i));
            }
        }
        for i in 0..pages {
            if i % 2 == 0 {
                check(page_mut(&r, i), i, 3);
            } else {
                assert!(page_mut(&r, i) == &noise(i)[..], "page {i}");
            }
        }
        let s = r.stats();
        assert!(
            s.store_refused > 0,
            "the limit was never hit: {:?}",
            s.store
        );
        assert!(s.store.mem_used_total <= 256 * 1024);
    }

    #[test]
    fn fork_sees_grouped_pages() {
        let Some(r) = grouped(8 * MIB, MIB, 16) else {
            return;
        };
        let pages = r.len() / PAGE;
        for i in 0..pages {
            fill(page_mut(&r, i), i, 5);
        }
        assert!(r.stats().store.block_pages > 0);
        // SAFETY: the child only touches memory and calls _exit (no allocation, no locks).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0);
        if pid == 0 {
            let words = b"pages evicted together are compressed together, whatever their address ";
            let mut code = 0;
            for i in 0..pages {
                let p = page_mut(&r, i);
                if p[..8] != (i as u64).to_le_bytes()
                    || p[8..16] != 5u64.to_le_bytes()
                    || (16..PAGE).any(|k| p[k] != words[(k + i * 5 + 5) % words.len()])
                {
                    code = 10;
                    break;
                }
            }
            // SAFETY: leaving the child without running the parent's destructors.
            unsafe { libc::_exit(code) };
        }
        for i in (0..pages).step_by(3) {
            fill(page_mut(&r, i), i, 6);
        }
        let mut status = 0;
        // SAFETY: waiting for our child.
        assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
        assert!(libc::WIFEXITED(status), "child died: status {status:#x}");
        assert_eq!(libc::WEXITSTATUS(status), 0, "child saw wrong data");
        for i in 0..pages {
            check(page_mut(&r, i), i, if i % 3 == 0 { 6 } else { 5 });
        }
    }
}
