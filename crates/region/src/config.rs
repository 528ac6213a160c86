//! A region's settings, and the one place they are checked ([`RegionConfig::validate`]): the
//! library, the C API and the command line all refuse a configuration for the same reasons,
//! with the same messages.

use zmem_engine::Policy;
use zmem_store::MAX_BLOCK_PAGES;

use crate::budget::{AdaptiveConfig, Controller};
use crate::error::RegionError;
use crate::policy::Eviction;

/// Size of a page of a region (zmem-os defines it once for every layer).
pub use zmem_os::PAGE_SIZE as PAGE;

/// The smallest budget: below this a region would spend its time evicting.
pub const MIN_BUDGET_PAGES: usize = 16;
/// [`MIN_BUDGET_PAGES`] in bytes: the one minimum of every budget (`zmem run --resident`, the C
/// API, the benchmarks).
pub const MIN_BUDGET_BYTES: u64 = (MIN_BUDGET_PAGES * PAGE) as u64;

/// How much of the region may stay resident (uncompressed, mapped) in DRAM.
#[derive(Clone, Debug, PartialEq)]
pub enum Budget {
    /// At most this many bytes (rounded down to pages, at least 16 pages).
    Fixed(u64),
    /// Sized at run time from memory pressure and the region's own refault rate.
    Adaptive(AdaptiveConfig),
}

/// Which pages faulted back keep their compressed copy in the store (the `copies` module): a
/// page evicted again unchanged then costs a move and a hash instead of a compression (and, on
/// the SSD tier, no write). Measured (`bench region --size 1G --resident 256M --pattern rand`,
/// 47% of the evictions unchanged): `All` 16.0 µs per access against 17.4, for 19% more DRAM
/// (effective ratio 1.14 against 1.38); the kernel's zram frees a page's slot on swap-in, so
/// beside it `All` buys time with memory. Hence the default, `Ssd`: copies that cost no DRAM.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CleanCopies {
    /// Never: a page faulted back is discarded from the store.
    Off,
    /// Only copies that cost no DRAM: pages read back from the SSD log (and same-filled pages),
    /// while the log is under half full.
    #[default]
    Ssd,
    /// Every page read back, while the store is under half its memory limit (or its log's):
    /// costs the copies' compressed size in DRAM.
    All,
}

impl CleanCopies {
    pub fn name(self) -> &'static str {
        match self {
            CleanCopies::Off => "off",
            CleanCopies::Ssd => "ssd",
            CleanCopies::All => "all",
        }
    }

    pub fn parse(s: &str) -> Option<CleanCopies> {
        [CleanCopies::Off, CleanCopies::Ssd, CleanCopies::All]
            .into_iter()
            .find(|c| c.name() == s)
    }
}

/// Who serves a fault on an evicted page (see the `signal` module).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum FaultRoute {
    /// The kernel queues the fault on the userfaultfd and a handler thread serves it, then
    /// wakes the faulting thread. Serves every access, system calls included.
    #[default]
    Handler,
    /// The faulting thread gets SIGBUS and serves the fault itself (no hand-off). Alone, a
    /// system call that touches an evicted page fails with EFAULT instead of waiting and a
    /// thread that blocks SIGBUS is killed: for code that touches the region from user mode
    /// only. With [`RegionConfig::guard_syscalls`] (what `zmem run --fault-route signal` uses)
    /// system calls into the region work too. A forked child's faults are not served.
    Signal,
}

impl FaultRoute {
    pub fn name(self) -> &'static str {
        match self {
            FaultRoute::Handler => "handler",
            FaultRoute::Signal => "signal",
        }
    }

    pub fn parse(s: &str) -> Option<FaultRoute> {
        [FaultRoute::Handler, FaultRoute::Signal]
            .into_iter()
            .find(|r| r.name() == s)
    }
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
    /// Microseconds a handler keeps polling without sleeping while faults come faster than
    /// this (0 = always sleep in poll). On a VM whose idle vCPUs halt at once, waking a
    /// sleeping handler costs an inter-processor interrupt and a VM entry: measured in `bench
    /// region` (1G, 256M, rand), 50 µs took an access from 30.3 to 23.3 µs and CPU per GiB
    /// from 8.7 to 7.6 s (fewer halts and wake-ups). Never spins where the process may run on
    /// one CPU only (the spin would delay the thread it serves). At most 10000.
    pub handler_spin_us: u32,
    /// While one thread of the program takes every fault, pin it and the region's threads to
    /// one CPU (see the `colocate` module): on a VM, wake-ups and TLB-flush IPIs across vCPUs
    /// cost 10–20 µs each. Only with one handler thread, where the process may use more than
    /// one CPU; the thread's own affinity comes back when another thread faults, the faults
    /// stop (0.5 s), or the region is dropped.
    pub colocate: bool,
    /// A forked child of the creator reads the pages evicted at the fork from the creator's
    /// store, which hands a page down to every child still reading it before changing its own
    /// copy (see the `inherit` module), instead of a copy of every compressed page made at the
    /// fork event (a fork of a 64 MB heap at a 16M budget: ~2 ms instead of ~9).
    pub inherit_on_fork: bool,
    /// Handlers only move pages out between faults and leave their compression to the
    /// evictor thread, which colocation keeps off the program's CPU: the program's CPU does
    /// not wait for the compressor (see `Shared::evict_async`). A fault that finds the budget
    /// exhausted still evicts and compresses itself.
    pub async_settle: bool,
    /// Which pages faulted back keep their compressed copy (see [`CleanCopies`]).
    pub clean_copies: CleanCopies,
    /// Bytes of DRAM the compressed pages may use (zram's mem_limit); None = unlimited. When
    /// the store is full, pages that cannot be evicted stay resident beyond the budget.
    pub store_limit: Option<u64>,
    /// Pages compressed together as one block when they are evicted, whatever their
    /// addresses (1 = each page alone; at most [`zmem_store::MAX_BLOCK_PAGES`]). A block
    /// compresses better (zstd-3: +17% at 8 pages, +20% at 16), but a fault on one of its pages
    /// decodes the whole block, and its bytes stay until its last page is gone: the evictor
    /// repacks the survivors of half-dead blocks, which costs CPU. Worth it only where evicted
    /// pages mostly stay cold; with refaults it loses ratio and time (measurements at
    /// [`default_evict_group`]). None = the policy's default ([`default_evict_group`], 1 for
    /// all).
    pub evict_group: Option<usize>,
    /// An SSD log below the store (needs `store_limit`): compressed pages that stay cold are
    /// written back to it as the store nears its limit, and read back from it on a fault.
    pub lower: Option<zmem_store::LowerConfig>,
    /// Who serves faults (see [`FaultRoute`]; the handler thread by default).
    pub fault_route: FaultRoute,
    /// With [`FaultRoute::Signal`]: make system calls into the region safe for a whole
    /// program (the syscall guard, `crate::guard`): the region is placed at
    /// [`crate::guard::GUARDED_BASE`] and a seccomp filter traps every call whose arguments
    /// point into it, whose buffers are then brought back before the call runs. Once per
    /// process, and for the process's life (the filter cannot be removed); what it costs
    /// and what stays unsupported: docs/DESIGN-NOTES.md, "The syscall guard".
    pub guard_syscalls: bool,
    /// With [`RegionConfig::guard_syscalls`]: the id ([`crate::guard::filter_id`]) of the
    /// guard filter this process's parent says it inherited (a program exec'd by a guarded
    /// one). When it is this region's filter and a probe call shows the filter in force, no
    /// second copy is installed (~0.4 ms of every exec, and a filter less for every system
    /// call); otherwise the filter is installed as usual.
    pub guard_inherited: Option<u64>,
    /// A diagnostic: keep a checksum of every page stored at eviction and check each page read
    /// back against it (8 bytes per page touched, ~0.1 µs per eviction and per fault). A page
    /// that comes back different is poisoned (SIGBUS) and counted in `RegionStats::checks`,
    /// never handed to the program. For finding zmem bugs (`zmem run --verify-pages`).
    pub verify_pages: bool,
    /// A diagnostic: keep each page's last state changes (which line of zmem, which thread,
    /// when; 128 bytes per page touched, a `gettid` per change), and when the program dies of
    /// SIGSEGV print the pages its registers point into with their histories (stderr). For
    /// finding how a page lost its content (`zmem run --trace-pages`).
    pub trace_pages: bool,
}

/// The default of [`RegionConfig::evict_group`] for a policy: 1 (each page alone) for every
/// policy, `max` included, because groups lose wherever evicted pages come back.
///
/// zstd-3 gains only 6% / 12% / 17% / 20% on 8 / 16 / 32 / 64 KiB blocks (2.50 / 2.62 / 2.74 /
/// 2.82 against 2.34), while a block keeps all its bytes until its last page faults back in.
/// With random refaults a block of G pages lives H(G) times as long as a page does (H(8) =
/// 2.7). Repacking the survivors of half-dead blocks (`PageStore::repack_groups`) bounds that,
/// at about twice the compression CPU. `zmem bench region --size 512M --resident 128M
/// --accesses 500000 --policy max` (2 vCPUs, load < 1.5; effective ratio = data / DRAM incl.
/// resident pages):
///
/// | pattern | group | µs/access | fault p50 / p99 µs | ratio | effective | CPU s/GiB |
/// |---|---|---|---|---|---|---|
/// | rand | 1 | 42.0–43.1 | 53 / 95–98 | 2.22 | 1.71 | 12.8–13.4 |
/// | rand | 2 | 91.6 | 117 / 243 | 2.16 | 1.69 | 23.8 |
/// | rand | 4 | 94.8 | 73 / 423 | 1.89 | 1.55 | 23.5 |
/// | rand | 8 | 95.7–111.2 | 82–91 / 666–711 | 1.74 | 1.48 | 23.3–27.2 |
/// | rand | 16 | 123.3–129.5 | 99–117 / 1208–1274 | 1.70 | 1.45 | 27.4–31.4 |
/// | zipf 0.99 | 1 / 2 / 8 | 10.9 / 21.7 / 26.6 | 52 / 95, 109 / 233, 89 / 691 | 2.22 / 2.04 / 1.73 | 1.71 / 1.63 / 1.47 | 3.6 / 5.8 / 6.6 |
/// | zipf 1.2 | 1 / 8 | 3.6 / 7.7 | 50 / 90, 91 / 539 | 2.24 / 2.00 | 1.72 / 1.61 | 1.2 / 1.9 |
///
/// Without the repack, group 8 fell to ratio 0.83 (rand) and 1.16 (zipf). Groups win only for
/// data that stays cold: right after the fill (2000 accesses), group 8 / 16 gave ratio 2.57 /
/// 2.68 against 2.27 (effective 1.86 / 1.90 against 1.73). Regions whose evicted data is
/// mostly never touched again can ask for them (`RegionConfig::evict_group`).
pub fn default_evict_group(policy: Policy) -> usize {
    match policy {
        Policy::Fast | Policy::Balanced | Policy::Auto | Policy::Max => 1,
    }
}

/// The SSD log's default size (`zmem run --ssd-size`, the C API's `ssd_size` 0).
pub const DEFAULT_SSD_SIZE: u64 = 4 << 30;
/// The least store limit an SSD tier gets by default.
pub const MIN_SSD_STORE_LIMIT: u64 = 16 << 20;

/// The store limit of a region with an SSD tier when none is set (the tier writes back as the
/// store nears it): a quarter of a fixed budget, at least [`MIN_SSD_STORE_LIMIT`]; 4x that
/// under an adaptive budget (`None`). The one rule of `zmem run` and the C API.
pub fn default_ssd_store_limit(fixed_budget: Option<u64>) -> u64 {
    match fixed_budget {
        Some(r) => (r / 4).max(MIN_SSD_STORE_LIMIT),
        None => 4 * MIN_SSD_STORE_LIMIT,
    }
}

/// A configuration that passed [`RegionConfig::validate`], in the units a region works in.
pub(crate) struct Checked {
    /// Bytes of address space (whole pages).
    pub len: usize,
    pub pages: usize,
    pub budget_pages: usize,
    pub evict_group: usize,
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
            handler_spin_us: 50,
            colocate: true,
            inherit_on_fork: true,
            async_settle: true,
            clean_copies: CleanCopies::Ssd,
            store_limit: None,
            evict_group: None,
            lower: None,
            fault_route: FaultRoute::Handler,
            guard_syscalls: false,
            guard_inherited: None,
            verify_pages: false,
            trace_pages: false,
        }
    }

    /// Checks the configuration as [`crate::Region::new`] does, without creating anything:
    /// every [`RegionError::Config`] a region can refuse a configuration with comes from here.
    pub fn validate(&self) -> Result<(), RegionError> {
        self.check().map(|_| ())
    }

    /// The evict group in force: the setting, or the policy's default.
    pub fn evict_group(&self) -> usize {
        self.evict_group
            .unwrap_or_else(|| default_evict_group(self.policy))
    }

    pub(crate) fn check(&self) -> Result<Checked, RegionError> {
        let len = usize::try_from(self.size)
            .ok()
            .and_then(|s| s.checked_next_multiple_of(PAGE))
            .filter(|&l| l > 0 && l / PAGE < u32::MAX as usize)
            .ok_or_else(|| {
                RegionError::Config(format!(
                    "size {} must be between 1 byte and {} bytes",
                    self.size,
                    (u32::MAX as u64 - 1) * PAGE as u64
                ))
            })?;
        if !(1..=64).contains(&self.fault_around) {
            return Err(RegionError::Config(format!(
                "fault_around {} must be 1..=64 pages",
                self.fault_around
            )));
        }
        if !(1..=16).contains(&self.handler_threads) {
            return Err(RegionError::Config(format!(
                "handler_threads {} must be 1..=16",
                self.handler_threads
            )));
        }
        if self.handler_spin_us > 10_000 {
            return Err(RegionError::Config(format!(
                "handler_spin_us {} must be at most 10000",
                self.handler_spin_us
            )));
        }
        let evict_group = self.evict_group();
        if !(1..=MAX_BLOCK_PAGES).contains(&evict_group) {
            return Err(RegionError::Config(format!(
                "evict_group {evict_group} must be 1..={MAX_BLOCK_PAGES} pages"
            )));
        }
        if self.lower.is_some() && self.store_limit.is_none() {
            return Err(RegionError::Config(
                "an SSD tier needs a store limit: compressed pages are written to it as the \
                 store nears that limit"
                    .into(),
            ));
        }
        if self.guard_syscalls && self.fault_route != FaultRoute::Signal {
            return Err(RegionError::Config(
                "guard_syscalls belongs to the signal fault route (fault_route = signal)".into(),
            ));
        }
        let budget_bytes = match &self.budget {
            Budget::Fixed(b) => *b,
            Budget::Adaptive(a) => {
                a.validate().map_err(RegionError::Config)?;
                Controller::new(a.clone()).budget()
            }
        };
        let budget_pages = budget_pages(budget_bytes)?;
        Ok(Checked {
            len,
            pages: len / PAGE,
            budget_pages,
            evict_group,
        })
    }
}

/// A budget in whole pages, or the error for one below [`MIN_BUDGET_PAGES`].
pub(crate) fn budget_pages(bytes: u64) -> Result<usize, RegionError> {
    let pages = (bytes / PAGE as u64) as usize;
    if pages < MIN_BUDGET_PAGES {
        return Err(RegionError::Config(format!(
            "budget {bytes} bytes is below the minimum of {MIN_BUDGET_PAGES} pages ({} bytes)",
            MIN_BUDGET_PAGES * PAGE
        )));
    }
    Ok(pages)
}
