//! Memory that tiers itself. A [`Region`] is a range of virtual memory that application threads
//! use as plain memory; at most its budget of it stays in DRAM, the coldest pages are compressed
//! into a [`zmem_store::PageStore`] (or any [`BackingStore`]), and a touch brings a page back. It
//! works from user space with userfaultfd (full mode, so read(2) into an evicted page works too).
//!
//! See docs/DESIGN-NOTES.md ("Regions") for the fault path, eviction, fork and the policy.
//!
//! Modules: `config` (settings and their one check), `error`, `stats`, `backing` (the store
//! trait), `manager` (the shared state and the handler loop), with the roles `fault`, `evict`,
//! `fork` and `events` next to it, `copies` (clean copies of pages faulted back), `state`
//! (page states), `budget` and `budget_loop` (the adaptive budget), `policy` (which pages leave
//! first), `uffd` (the kernel interface).

mod backing;
pub mod budget;
mod budget_loop;
mod child;
mod colocate;
mod config;
mod copies;
mod error;
mod events;
mod evict;
mod fault;
mod fork;
mod forked;
pub mod guard;
mod inherit;
mod manager;
pub mod policy;
mod remap;
mod signal;
mod slots;
mod state;
mod stats;
mod syscalls;
mod trace;
mod uffd;
mod verify;
mod zero;

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use hdrhistogram::Histogram;
use zmem_engine::Policy;
use zmem_os::sync::{Condvar, Mutex};
use zmem_os::{Mapping, MappingFlags};
use zmem_store::{PageStore, StoreConfig};

use budget_loop::BudgetLoop;
use manager::{Counters, Shared, Space, SpaceInner, STAGING_PAGES};
use policy::Tracker;
use state::StateTable;

pub use backing::{BackingStore, StoreFactory};
pub use budget::{AdaptiveConfig, BudgetSample};
pub use config::{
    default_evict_group, default_ssd_store_limit, Budget, CleanCopies, FaultRoute, RegionConfig,
    DEFAULT_SSD_SIZE, MIN_BUDGET_BYTES, MIN_BUDGET_PAGES, MIN_SSD_STORE_LIMIT, PAGE,
};
pub use error::RegionError;
pub use signal::signal_faults_on_this_thread;
/// The SSD tier's read-ahead: its default and most pages per read (`LowerConfig::read_ahead`).
pub use zmem_store::{
    DEFAULT_READ_AHEAD as DEFAULT_SSD_READ_AHEAD, MAX_READ_AHEAD as MAX_SSD_READ_AHEAD,
};

/// Whether this machine can run regions: what `zmem doctor` asks.
pub mod userfaultfd {
    pub use crate::uffd::{probe, OpenError, Opened, Probe, NEEDED, NEEDED_FEATURES};
}
pub use policy::Eviction;
pub use remap::Remapped;
pub use stats::{Checks, HandlerTime, Latency, RegionStats};
pub use zero::Zeroed;

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
    /// Listed for the SIGBUS handler (`FaultRoute::Signal`).
    signal: Option<signal::Listed>,
}

// SAFETY: all shared state behind a Region is synchronised internally; the raw addresses are
// plain numbers.
unsafe impl Send for Region {}
unsafe impl Sync for Region {}

/// The region's range and its staging area: reserved address space (MAP_NORESERVE); a guard
/// until the Region owns them.
fn reserve(len: usize) -> Result<Mapping, RegionError> {
    let flags = MappingFlags {
        noreserve: true,
        no_huge_pages: false,
    };
    Mapping::new(len, flags).map_err(|source| RegionError::Os { op: "mmap", source })
}

impl Region {
    /// A region over a [`zmem_store::PageStore`] with the configuration's policy and limit.
    pub fn new(cfg: RegionConfig) -> Result<Region, RegionError> {
        let mut store_cfg = StoreConfig::new(cfg.check()?.pages as u64, cfg.policy);
        store_cfg.dictionary_thread = false;
        store_cfg.mem_limit = cfg.store_limit;
        store_cfg.lower = cfg.lower.clone();
        // The evictor makes the entropy coder's tries between its batches (`entropy_pass`).
        store_cfg.entropy_later = true;
        if cfg.policy == Policy::Auto {
            // Evicted pages that stay cold are recompressed with zstd into blocks.
            store_cfg.recompress_interval = Some(Duration::from_secs(1));
        }
        let factory: StoreFactory = Arc::new(move || {
            PageStore::new(store_cfg.clone()).map(|s| Box::new(s) as Box<dyn BackingStore>)
        });
        Region::with_store(cfg, factory)
    }

    /// A region whose evicted pages go to the stores `factory` makes (its own, then one per
    /// forked child); the configuration's `policy` and `store_limit` are then the factory's
    /// business.
    pub fn with_store(cfg: RegionConfig, factory: StoreFactory) -> Result<Region, RegionError> {
        zmem_os::thread::add_thread_preparer(signal::prepare_thread);
        let config::Checked {
            len,
            pages,
            budget_pages,
            evict_group,
        } = cfg.check()?;
        let mut adaptive = match &cfg.budget {
            Budget::Fixed(_) => None,
            Budget::Adaptive(a) => Some(BudgetLoop::new(a.clone())),
        };

        let features = match cfg.fault_route {
            FaultRoute::Handler => uffd::NEEDED,
            FaultRoute::Signal => uffd::NEEDED | uffd::FEATURE_SIGBUS,
        };
        let (fd, _how) = uffd::Uffd::open(features).map_err(|e| match e {
            uffd::OpenError::Permission(source) => RegionError::Permission { source },
            uffd::OpenError::Absent(e) => RegionError::Unsupported {
                feature: "userfaultfd",
                why: e.to_string(),
            },
            uffd::OpenError::Unsupported(feature, why) => RegionError::Unsupported { feature, why },
        })?;
        let region = if cfg.guard_syscalls {
            let flags = MappingFlags {
                noreserve: true,
                no_huge_pages: false,
            };
            Mapping::at(guard::GUARDED_BASE, len, flags).map_err(|e| {
                RegionError::Config(format!(
                    "the syscall guard needs the region at {:#x}, which is taken: {e}",
                    guard::GUARDED_BASE
                ))
            })?
        } else {
            reserve(len)?
        };
        // No huge page may ever cover the staging area: UFFDIO_MOVE refuses (EEXIST) to move
        // into a slot under one.
        let staging = Mapping::new(STAGING_PAGES * PAGE, MappingFlags::RESERVE_SMALL_PAGES)
            .map_err(|source| RegionError::Os { op: "mmap", source })?;
        let store = factory()?;
        // Held as raw numbers by the region's shared state, closed with `child::close_raw`
        // (past the preload library's protection) in Drop or in a forked child.
        let eventfd = || {
            zmem_os::fds::eventfd()
                .map(std::os::fd::IntoRawFd::into_raw_fd)
                .map_err(|source| RegionError::Os {
                    op: "eventfd",
                    source,
                })
        };
        let stop_fd = eventfd()?;
        let gate_fd = match eventfd() {
            Ok(fd) => fd,
            Err(e) => {
                child::close_raw(stop_fd);
                return Err(e);
            }
        };
        let reopen_fd = match eventfd() {
            Ok(fd) => fd,
            Err(e) => {
                child::close_raw(stop_fd);
                child::close_raw(gate_fd);
                return Err(e);
            }
        };
        // From registration until the threads run and the region is listed, no fork (see
        // fork::REGISTRY). Released before `region_obj` could be dropped on an error below:
        // dropping takes the lock too.
        let mut registry = fork::REGISTRY.lock();
        let registered = fd
            .register_missing(region.addr(), len)
            .map_err(|source| RegionError::Os {
                op: "UFFDIO_REGISTER (region)",
                source: source.into(),
            })
            .and_then(|()| {
                fd.register_missing(staging.addr(), STAGING_PAGES * PAGE)
                    .map_err(|source| RegionError::Os {
                        op: "UFFDIO_REGISTER (staging)",
                        source: source.into(),
                    })
            });
        if let Err(e) = registered {
            drop(registry);
            child::close_raw(stop_fd);
            child::close_raw(gate_fd);
            child::close_raw(reopen_fd);
            return Err(e);
        }
        // The creator's store hands pages down to forked children that inherit them
        // (inherit.rs).
        let (store, heirs_parent): (Box<dyn BackingStore>, _) = if cfg.inherit_on_fork {
            let store = inherit::RootStore::new(store);
            let parent = store.parent().clone();
            (Box::new(store), Some(parent))
        } else {
            (store, None)
        };
        let root = Space {
            uffd: fd,
            base: region.addr(),
            pages,
            store: std::mem::ManuallyDrop::new(store),
            heirs_parent,
            heir: None,
            inner: Mutex::new({
                let mut inner = SpaceInner::new(
                    if cfg.trace_pages {
                        StateTable::with_history(pages)?
                    } else {
                        StateTable::new(pages)?
                    },
                    Some(Tracker::new(pages, cfg.eviction)),
                );
                if cfg.clean_copies != CleanCopies::Off {
                    inner.copies = Some(copies::CleanCopies::new(pages));
                }
                if cfg.verify_pages {
                    inner.sums = Some(verify::Sums::new(pages));
                }
                inner
            }),
            is_root: true,
            dead: AtomicBool::new(false),
            link: Mutex::new(None),
            asks: None,
            moving: AtomicBool::new(false),
        };
        let shared = Arc::new(Shared {
            root: Arc::new(root),
            children: Mutex::new(Vec::new()),
            fork_link: Mutex::new((None, None)),
            child_uffd_sent: AtomicBool::new(false),
            fault_link: Mutex::new((None, None)),
            signal_route: cfg.fault_route == FaultRoute::Signal,
            raw_link: std::sync::OnceLock::new(),
            stored_at_fork: AtomicBool::new(false),
            forks_unserved: AtomicUsize::new(0),
            fork_reading: AtomicUsize::new(0),
            forker_mapped: Mutex::new(Vec::with_capacity(manager::FORKER_MAPPED)),
            spare_store: Mutex::new(None),
            staging: staging.addr(),
            slots: slots::Slots::new(staging.addr()),
            budget_pages: AtomicUsize::new(budget_pages),
            fault_around: cfg.fault_around,
            evict_group,
            clean_copies: cfg.clean_copies,
            verify_pages: cfg.verify_pages,
            put_backs: Mutex::new(Vec::new()),
            run_pages: AtomicUsize::new(0),
            evict_lock: Mutex::new(()),
            settle_lock: Mutex::new(()),
            async_settle: cfg.async_settle,
            queued: Mutex::new(Default::default()),
            settling: AtomicBool::new(false),
            #[cfg(test)]
            evictor_paused: AtomicBool::new(false),
            evictor_wake: Condvar::new(),
            evictor_mutex: Mutex::new(false),
            stop: AtomicBool::new(false),
            stop_fd,
            counters: Counters::default(),
            latency: Mutex::new(
                Histogram::new_with_bounds(1, 60_000_000_000, 2).expect("static histogram bounds"),
            ),
            store_factory: factory,
            // SAFETY: getpid cannot fail.
            creator_pid: unsafe { libc::getpid() } as u32,
            zero_page: vec![0u8; PAGE].into_boxed_slice(),
            last_fault_at: Mutex::new(std::time::Instant::now()),
            forking: AtomicBool::new(false),
            forking_tid: std::sync::atomic::AtomicI32::new(0),
            store_full: AtomicBool::new(false),
            held_warned: AtomicBool::new(false),
            range_events_deferred: AtomicUsize::new(0),
            event_delay_us: AtomicU64::new(0),
            fork_hold_us: AtomicU64::new(0),
            fork_parent_hold_us: AtomicU64::new(0),
            run_delay_us: AtomicU64::new(0),
            populate_delay_us: AtomicU64::new(0),
            mapped_delay_us: AtomicU64::new(0),
            own_page_refusals: AtomicU64::new(0),
            move_delay_us: AtomicU64::new(0),
            unreported_moves: AtomicUsize::new(0),
            incompressible_said: AtomicBool::new(false),
            store_full_ms: AtomicU64::new(0),
            store_full_said_ms: AtomicU64::new(0),
            enomem_streak: AtomicU64::new(0),
            parked: AtomicUsize::new(0),
            park_lock: Mutex::new(()),
            park_wake: zmem_os::sync::Condvar::new(),
            workers: cfg.handler_threads + 1,
            naps: crate::fork::Naps::new(cfg.handler_threads + 1),
            gate_fd,
            reopen_fd,
            spin: if zmem_os::thread::cpus_available() > 1 {
                Duration::from_micros(cfg.handler_spin_us.into())
            } else {
                Duration::ZERO
            },
            colocation: colocate::Colocation::new(
                cfg.colocate && cfg.handler_threads == 1 && zmem_os::thread::cpus_available() > 1,
            ),
        });
        if cfg.trace_pages {
            trace::watch(&shared);
        }
        let interval = adaptive.as_ref().map(|a| a.interval());
        let history = adaptive.as_ref().map(|a| a.history.clone());
        let mut region_obj = Region {
            shared: Some(shared.clone()),
            threads: Vec::new(),
            base: region.into_raw().0.as_ptr() as usize,
            len,
            staging: staging.into_raw().0.as_ptr() as usize,
            interval,
            history,
            signal: None,
        };
        if let Some(a) = adaptive.as_mut() {
            shared.adaptive_step(a, true);
        }
        let spawn = || -> Result<(), RegionError> {
            for i in 0..cfg.handler_threads {
                let s = shared.clone();
                let h = zmem_os::thread::spawn(format!("zmem-fault-{i}"), move || {
                    zmem_os::thread::or_abort("a fault handler", || s.handler_loop(i))
                })
                .map_err(|source| RegionError::Os {
                    op: "spawn fault handler",
                    source,
                })?;
                region_obj.threads.push(h);
            }
            let s = shared.clone();
            let h = zmem_os::thread::spawn("zmem-evict".into(), move || {
                zmem_os::thread::or_abort("the evictor", || s.evictor_loop(adaptive))
            })
            .map_err(|source| RegionError::Os {
                op: "spawn evictor",
                source,
            })?;
            region_obj.threads.push(h);
            Ok(())
        };
        let spawned = spawn().and_then(|()| {
            if cfg.fault_route == FaultRoute::Signal {
                let end = region_obj.base + region_obj.len;
                region_obj.signal = Some(signal::list(region_obj.base, end, &shared)?);
                // Children forked without hooks inherit this link and ask on it (`forked`).
                if let Ok((a, b)) = zmem_os::fds::seqpacket_pair() {
                    let (a, b) = (zmem_os::fds::move_high(a), zmem_os::fds::move_high(b));
                    let _ = shared.raw_link.set(Arc::new(forked::FaultLink::new(a)));
                    signal::set_link(region_obj.base, std::os::fd::IntoRawFd::into_raw_fd(b), 0);
                }
            }
            if cfg.guard_syscalls {
                guard::install(
                    region_obj.base,
                    region_obj.len,
                    budget_pages * PAGE,
                    cfg.guard_inherited,
                )?;
            }
            Ok(())
        });
        if spawned.is_ok() {
            fork::register_for_fork(&mut registry, &shared);
        }
        drop(registry);
        spawned.map(|()| region_obj)
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

    /// Before this process goes away (exit, `_exit`, exec): maps into every forked child the pages
    /// of its that only this process's store holds, so the child goes on with its data on
    /// plain memory (a daemon's parent exits right after the fork). The region keeps working.
    /// Returns the pages handed over; 0 in a forked child (its pages are its parent's to hand).
    pub fn hand_off_children(&self) -> usize {
        if !self.in_creator() {
            return 0;
        }
        // Most processes never fork a child that lives on: no thread to start for nothing
        // (~0.2 ms of every process's exit).
        let shared = self.shared();
        shared.wait_fork_served();
        if shared.children.lock().is_empty() {
            return 0;
        }
        if !zmem_store::thread_state_alive() {
            // exit() destroys the calling thread's thread-locals before its atexit handlers
            // run, and reading the store needs them (the main thread has served faults on the
            // signal route): a thread of ours reads instead.
            let shared = self.shared().clone();
            let t =
                zmem_os::thread::spawn("zmem-hand-off".into(), move || shared.hand_off_children());
            return t.ok().and_then(|t| t.join().ok()).unwrap_or(0);
        }
        self.shared().hand_off_children()
    }

    pub fn stats(&self) -> RegionStats {
        let sh = self.shared();
        let c = &sh.counters;
        let page = PAGE as u64;
        let (
            resident,
            pinned_mapped,
            pinned_ranges,
            held,
            incompressible,
            clean_copies,
            evictable,
            recency,
        ) = {
            // Also asked on a program thread (the report at exit): see `AsyncSignalsBlocked`.
            let _signals = sh.root.block_signals_for_lock();
            let inner = sh.root.inner.lock();
            let evictable = inner
                .tracker
                .as_ref()
                .map_or(0, |t| t.resident() + inner.nursery.len());
            let recency = inner.tracker.as_ref().map_or(0, |t| t.recency_windows());
            (
                inner.resident as u64 * page,
                inner.pinned_resident as u64 * page,
                inner.pinned.clone(),
                inner.held.len() as u64 * page,
                inner.incompressible.len() as u64 * page,
                inner.copies.as_ref().map_or(0, |c| c.count()) as u64 * page,
                evictable as u64 * page,
                recency,
            )
        };
        // Pinned ranges are mapped ahead with zero pages, which cost no DRAM until written:
        // count the pages that hold memory of their own (the mapped count if the kernel
        // cannot tell).
        let ranges: Vec<(*const u8, usize)> = pinned_ranges
            .iter()
            .map(|&(a, b)| {
                (
                    sh.root.page_addr(a as usize) as *const u8,
                    (b - a) as usize * PAGE,
                )
            })
            .collect();
        let pinned =
            zmem_os::mapping::written_pages(&ranges).map_or(pinned_mapped, |n| n as u64 * page);
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
            resident: resident + pinned + held + incompressible,
            pinned,
            held,
            incompressible,
            incompressible_kept: c.incompressible_kept.load(Relaxed),
            staged: c.staged_now.load(Relaxed) as u64 * PAGE as u64,
            staging_kept: sh.slots.used() as u64 * PAGE as u64,
            major_faults: c.major_faults.load(Relaxed),
            zero_faults: c.zero_faults.load(Relaxed),
            staged_faults: c.staged_faults.load(Relaxed),
            fault_around_pages: c.fault_around_pages.load(Relaxed),
            evictions: c.evictions.load(Relaxed),
            direct_evictions: c.direct_evictions.load(Relaxed),
            over_budget_faults: c.over_budget_faults.load(Relaxed),
            evictable,
            unshared: c.unshared.load(Relaxed),
            staging_cleared: c.staging_cleared.load(Relaxed),
            forks: c.forks.load(Relaxed),
            child_evictions: c.child_evictions.load(Relaxed),
            store_refused: c.store_refused.load(Relaxed),
            clean_copies,
            clean_evictions: c.clean_evictions.load(Relaxed),
            copies_changed: c.copies_changed.load(Relaxed),
            copies_given_up: c.copies_given_up.load(Relaxed),
            put_backs_deferred: c.put_backs_deferred.load(Relaxed),
            checks: Checks {
                verified: c.verified.load(Relaxed),
                mismatches: c.mismatches.load(Relaxed),
                on_resident: c.on_resident.load(Relaxed),
                staged_present: c.staged_present.load(Relaxed),
                moved_nothing: c.moved_nothing.load(Relaxed),
                moved_unreported: c.moved_unreported.load(Relaxed),
            },
            remapped: Remapped::load(&c.remapped),
            zeroed: Zeroed::load(&c.zeroed),
            freed_stored: c.freed_stored.load(Relaxed),
            colocations: sh.colocation.pins(),
            recency_windows: recency,
            fault_latency,
            handler_time: HandlerTime {
                faults: c.handled_faults.load(Relaxed),
                total_ns: c.handled_ns.load(Relaxed),
                room_ns: c.room_ns.load(Relaxed),
                read_ns: c.read_ns.load(Relaxed),
                map_ns: c.map_ns.load(Relaxed),
                idle_evict_ns: c.idle_evict_ns.load(Relaxed),
                evict_move_ns: c.evict_move_ns.load(Relaxed),
                evict_store_ns: c.evict_store_ns.load(Relaxed),
                evict_moved: c.evict_moved.load(Relaxed),
                evict_move_calls: c.evict_move_calls.load(Relaxed),
            },
            store: sh.root.store.stats(),
        }
    }

    /// Tests only: each handler waits `delay` between reading a batch of messages and applying
    /// it, as a handler preempted on a busy machine does.
    #[doc(hidden)]
    pub fn delay_events_for_tests(&self, delay: Duration) {
        self.shared()
            .event_delay_us
            .store(delay.as_micros() as u64, Relaxed);
    }

    /// Tests only: `populate` waits `delay` while it holds the space lock.
    #[doc(hidden)]
    pub fn delay_populate_for_tests(&self, delay: Duration) {
        self.shared()
            .populate_delay_us
            .store(delay.as_micros() as u64, Relaxed);
    }

    /// Tests only: page `idx`'s recorded changes of state, oldest first (empty without
    /// `RegionConfig::trace_pages`), for a test to print when a page is wrong.
    #[doc(hidden)]
    pub fn page_history_for_tests(&self, idx: usize) -> Vec<String> {
        let inner = self.shared().root.inner.lock();
        inner
            .state
            .history()
            .map(|h| h.describe(idx))
            .unwrap_or_default()
    }

    /// Tests only: the fork's prepare hook waits `delay` after parking this region's threads,
    /// as a forking thread preempted there does (other threads run meanwhile).
    #[doc(hidden)]
    pub fn hold_forks_for_tests(&self, delay: Duration) {
        self.shared()
            .fork_hold_us
            .store(delay.as_micros() as u64, Relaxed);
    }

    /// Tests only: the fork's parent hook waits `delay` before it lets this region's threads go
    /// (the child's FORK event read, its link not taken yet), as a forking thread preempted
    /// there does.
    #[doc(hidden)]
    pub fn hold_forks_after_for_tests(&self, delay: Duration) {
        self.shared()
            .fork_parent_hold_us
            .store(delay.as_micros() as u64, Relaxed);
    }

    /// Tests only: a fault that maps a run of pages (fault-around) waits `delay` between
    /// reading them and mapping them.
    #[doc(hidden)]
    pub fn delay_fault_around_for_tests(&self, delay: Duration) {
        self.shared()
            .run_delay_us
            .store(delay.as_micros() as u64, Relaxed);
    }

    /// Tests only: the next `n` faults that map a run of pages (fault-around) find the kernel
    /// refusing their own page (EAGAIN, as while a range event is pending) while the rest of
    /// the run maps; each is then retried.
    #[doc(hidden)]
    pub fn refuse_own_page_of_runs_for_tests(&self, n: u64) {
        self.shared().own_page_refusals.store(n, Relaxed);
    }

    /// Tests only: leaves the links a glibc fork's prepare hook makes for its child, the
    /// child's ends closed as after that child exited, for the next FORK event to take, as a
    /// raw fork read while a glibc fork of another thread is in progress takes them.
    #[doc(hidden)]
    pub fn leave_a_glibc_forks_links_for_tests(&self) {
        let s = self.shared();
        s.open_child_link();
        s.parent_side_of_link();
    }

    /// Tests only: a fault waits `delay` between mapping its pages (the faulting thread runs on)
    /// and recording them resident, as a handler preempted there does.
    #[doc(hidden)]
    pub fn delay_after_mapping_for_tests(&self, delay: Duration) {
        self.shared()
            .mapped_delay_us
            .store(delay.as_micros() as u64, Relaxed);
    }

    /// Tests only: an eviction batch (the creator's or a forked child's) waits `delay` between
    /// picking its victims and moving them out, as an evictor preempted on a busy machine does.
    #[doc(hidden)]
    pub fn delay_moves_for_tests(&self, delay: Duration) {
        self.shared()
            .move_delay_us
            .store(delay.as_micros() as u64, Relaxed);
    }

    /// Tests only: each eviction run that moves whole is handled as if the kernel had reported
    /// it cut `pages` pages short (the pages it did move then look unmoved to the page-by-page
    /// pass that follows a cut run).
    #[doc(hidden)]
    pub fn report_moves_short_for_tests(&self, pages: usize) {
        self.shared().unreported_moves.store(pages, Relaxed);
    }

    /// Clears the fault latency histogram (e.g. between the fill and the measured phase).
    pub fn reset_latency(&self) {
        self.shared().latency.lock().reset();
    }

    /// Keeps the pages of `[offset, offset + len)` (bytes from the start, widened to whole
    /// pages) in DRAM once they are faulted in: never evicted, and not counted against the
    /// budget (`RegionStats::pinned` shows them). For memory that the threads serving the region
    /// may touch themselves (an allocator's metadata inside the region), which must never fault.
    /// Does nothing in a forked child (its pages are the parent's to serve, and its copy of the
    /// region's state may have been taken while a parked thread held it).
    pub fn pin(&self, offset: usize, len: usize) -> Result<(), RegionError> {
        let (first, last) = self.page_range("pin", offset, len)?;
        if !self.in_creator() {
            return Ok(());
        }
        let sh = self.shared();
        // Not between a fork's page-table copy and its snapshot (`fork_snapshot_pending`).
        sh.wait_for_fork_snapshot();
        let _signals = sh.root.block_signals_for_lock();
        let mut inner = sh.root.inner.lock();
        // Pages of the range already resident leave the budget's count for the pinned one.
        for p in first..last {
            if inner.state.get(p as usize) == state::PageState::Resident && !inner.is_pinned(p) {
                inner.uncount_resident(p);
                inner.pinned_resident += 1;
            }
        }
        inner.pinned.push((first, last));
        inner.nursery.retain(|&p| !(first..last).contains(&p));
        Ok(())
    }

    /// The page range of `[offset, offset + len)` (bytes from the start, widened to whole
    /// pages), checked against the region.
    fn page_range(&self, what: &str, offset: usize, len: usize) -> Result<(u32, u32), RegionError> {
        let end = offset
            .checked_add(len)
            .filter(|&e| e <= self.len)
            .ok_or_else(|| {
                RegionError::Config(format!(
                    "{what} range {offset}+{len} is outside the region of {} bytes",
                    self.len
                ))
            })?;
        Ok(((offset / PAGE) as u32, end.div_ceil(PAGE) as u32))
    }

    /// The program dropped the whole pages inside `[offset, offset + len)` (it unmapped them, or
    /// `MADV_DONTNEED`ed them and will reuse the addresses): their compressed copies are
    /// discarded and they read as zeros from now on. The kernel's REMOVE event says the same
    /// later; doing it here, on the caller's thread, means the range can be handed out again at
    /// once without a fault finding an old copy. Call it after the pages were zapped. Does
    /// nothing in a forked child (its pages are the parent's snapshot).
    pub fn discard(&self, offset: usize, len: usize) -> Result<(), RegionError> {
        self.page_range("discard", offset, len)?;
        if !self.in_creator() {
            return Ok(());
        }
        let sh = self.shared();
        // Only whole pages: on_remove narrows a partial page at either end away.
        sh.on_remove(
            &sh.root,
            self.base + offset,
            self.base + offset + len,
            false,
        );
        Ok(())
    }

    /// Moves the content of the `len` bytes at `src_offset` to `dst_offset` (whole pages; the
    /// ranges must not overlap): afterwards `dst` holds what `src` held, and `src` reads as
    /// zeros but for the pages that were copied. Resident pages change address, stored pages
    /// change index, and only pages in another state are copied (see `remap`), so a program's
    /// large `realloc` costs neither decompression nor eviction. In a forked child every page
    /// is copied.
    ///
    /// # Safety
    /// No other thread reads or writes either range during the call.
    pub unsafe fn move_pages(
        &self,
        dst_offset: usize,
        src_offset: usize,
        len: usize,
    ) -> Result<Remapped, RegionError> {
        let aligned = [dst_offset, src_offset, len].iter().all(|x| x % PAGE == 0);
        let apart = dst_offset.abs_diff(src_offset) >= len;
        if !aligned || !apart {
            return Err(RegionError::Config(format!(
                "move_pages needs whole pages in ranges that do not overlap \
                 (dst {dst_offset:#x}, src {src_offset:#x}, {len} bytes)"
            )));
        }
        let (dst, _) = self.page_range("move_pages", dst_offset, len)?;
        let (src, _) = self.page_range("move_pages", src_offset, len)?;
        let pages = len / PAGE;
        if !self.in_creator() {
            // SAFETY: both ranges are inside the region (checked) and the caller's alone.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    self.base.wrapping_add(src_offset) as *const u8,
                    self.base.wrapping_add(dst_offset) as *mut u8,
                    len,
                )
            };
            return Ok(Remapped {
                copied: pages as u64,
                ..Remapped::default()
            });
        }
        Ok(self.shared().move_pages(dst as usize, src as usize, pages))
    }

    /// Makes the whole pages of `[offset, offset + len)` read as zeros (a program's `calloc` of
    /// a reused block): a page that holds nothing is left alone, a stored one is forgotten
    /// (nothing is read back), and only pages mapped now or in flight are written (see
    /// `zero`). In a forked child every page is written.
    ///
    /// # Safety
    /// No other thread reads or writes the range during the call.
    pub unsafe fn zero_pages(&self, offset: usize, len: usize) -> Result<Zeroed, RegionError> {
        if offset % PAGE != 0 || len % PAGE != 0 {
            return Err(RegionError::Config(format!(
                "zero_pages needs whole pages (offset {offset:#x}, {len} bytes)"
            )));
        }
        let (first, _) = self.page_range("zero_pages", offset, len)?;
        let pages = len / PAGE;
        if !self.in_creator() {
            // SAFETY: inside the region (checked) and the caller's alone.
            unsafe { std::ptr::write_bytes(self.base.wrapping_add(offset) as *mut u8, 0, len) };
            return Ok(Zeroed {
                written: pages as u64,
                ..Zeroed::default()
            });
        }
        Ok(self.shared().zero_pages(first as usize, pages))
    }

    /// The program no longer needs the content of the whole pages of `[offset, offset + len)`
    /// (it freed a large block): the stored ones are forgotten now, their compressed copies
    /// freed; mapped ones stay, for the allocator to reuse or purge. Returns how many were
    /// forgotten; 0 in a forked child.
    ///
    /// # Safety
    /// No other thread reads or writes the range during the call, and its content is not read
    /// afterwards before it is written (a stored page reads as zeros from now on).
    pub unsafe fn drop_stored(&self, offset: usize, len: usize) -> Result<u64, RegionError> {
        if offset % PAGE != 0 || len % PAGE != 0 {
            return Err(RegionError::Config(format!(
                "drop_stored needs whole pages (offset {offset:#x}, {len} bytes)"
            )));
        }
        let (first, _) = self.page_range("drop_stored", offset, len)?;
        if !self.in_creator() {
            return Ok(0);
        }
        Ok(self.shared().drop_stored(first as usize, len / PAGE))
    }

    /// Pages of `[offset, offset + len)` that the kernel refused to move out (their protection
    /// or locking differed, `RegionStats::held`) are counted and evictable again: call it when
    /// the program makes them plain writable memory again. Returns how many came back.
    pub fn release_held(&self, offset: usize, len: usize) -> Result<usize, RegionError> {
        let (first, last) = self.page_range("release", offset, len)?;
        if !self.in_creator() {
            return Ok(0);
        }
        // Not between a fork's page-table copy and its snapshot (`fork_snapshot_pending`).
        self.shared().wait_for_fork_snapshot();
        let _signals = self.shared().root.block_signals_for_lock();
        let mut inner = self.shared().root.inner.lock();
        if inner.held.is_empty() {
            return Ok(0);
        }
        let n = inner.release_held(first, last);
        drop(inner);
        if n > 0 {
            self.shared().kick_evictor();
        }
        Ok(n)
    }

    /// Maps the never-touched pages of `[offset, offset + len)` now, a run at a time, so that
    /// the program's first touches take no fault at all instead of a round trip through a
    /// handler each (an allocator committing memory it is about to use). Pinned pages always,
    /// as the shared zero page (they are written sparsely: a write is the kernel's own
    /// copy-on-write fault); others as zero-filled pages of their own, and only while the
    /// budget has room below the evictor's low-water mark, so populating never makes anything
    /// leave. Returns the pages mapped. Does nothing in a forked child.
    pub fn populate(&self, offset: usize, len: usize) -> Result<usize, RegionError> {
        let (first, last) = self.page_range("populate", offset, len)?;
        if !self.in_creator() {
            return Ok(0);
        }
        let sh = self.shared();
        let s = &sh.root;
        let low = sh.low_water();
        let mut done = 0;
        // Not between a fork's page-table copy and its snapshot (`fork_snapshot_pending`).
        sh.wait_for_fork_snapshot();
        // Called on program threads (an allocator's commit): no signal frame may fault while
        // the lock is held (`AsyncSignalsBlocked`).
        let _signals = s.block_signals_for_lock();
        let mut inner = s.inner.lock();
        let delay = sh.populate_delay_us.load(Relaxed);
        if delay > 0 {
            std::thread::sleep(Duration::from_micros(delay));
        }
        let mut i = first as usize;
        while i < last as usize {
            if inner.state.get(i) != state::PageState::Absent {
                i += 1;
                continue;
            }
            let pinned = inner.is_pinned(i as u32);
            let room = if pinned {
                usize::MAX
            } else {
                low.saturating_sub(inner.resident)
            };
            let mut j = i;
            while j < last as usize
                && j - i < room
                && inner.state.get(j) == state::PageState::Absent
                && inner.is_pinned(j as u32) == pinned
            {
                j += 1;
            }
            if j == i {
                break; // no room left
            }
            // Held under the lock: a fault on these pages waits for it and then finds them
            // resident (the kernel maps nothing twice: EEXIST stops the run instead).
            // Private zeroed pages for memory about to be written (a page of its own now
            // instead of the zero page's second fault and TLB flush at the first write); the
            // shared zero page for pinned ranges, which are written sparsely.
            let map = |at: usize, len: usize| match pinned {
                true => s.uffd.zeropage(s.page_addr(at), len),
                false => s.uffd.copy_zeros(s.page_addr(at), len),
            };
            if map(i, (j - i) * PAGE).is_err() {
                // Part of the run may be mapped: find out page by page (EEXIST: it is), then
                // leave the rest to faults (an event is pending, or a page was mapped already).
                for k in i..j {
                    match map(k, PAGE) {
                        Err(e) if e.code() != libc::EEXIST => break,
                        _ => {
                            inner.state.set(k, state::PageState::Faulting);
                            inner.state.set(k, state::PageState::Resident);
                            inner.admit(k as u32);
                            done += 1;
                        }
                    }
                }
                break;
            }
            for k in i..j {
                inner.state.set(k, state::PageState::Faulting);
                inner.state.set(k, state::PageState::Resident);
                inner.admit(k as u32);
            }
            done += j - i;
            i = j;
        }
        Ok(done)
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
        let pages = config::budget_pages(bytes)?;
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
        // No fork from here until the descriptor is closed (fork::REGISTRY).
        let registry = fork::REGISTRY.lock();
        // Children still served by this region get their pages first (while the handlers
        // run); under the lock, so that no child forked meanwhile is left without them.
        shared.hand_off_children();
        shared.stop.store(true, Relaxed);
        zmem_os::fds::eventfd_signal(shared.stop_fd);
        shared.kick_evictor();
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        // No thread touches the region any more: the SIGBUS handler lets it go.
        self.signal.take();
        shared.colocation.release();
        let unmapped = shared.root.inner.lock().unmapped.clone();
        let ours = still_mapped(self.base, self.base + self.len, unmapped);
        // Unregistered before the munmaps below: a forked child (or one being spawned) may
        // still hold a copy of the descriptor, and a registered range would then make munmap
        // wait for an UNMAP event that no thread reads any more. Unregistering also wakes any
        // thread still blocked on a fault; it then finds plain anonymous memory. An error
        // (the program mapped something else over part of it) leaves that to the close below.
        for &(a, b) in ours
            .iter()
            .chain([(self.staging, self.staging + STAGING_PAGES * PAGE)].iter())
        {
            let _ = shared.root.uffd.unregister(a, b - a);
        }
        fork::drain_events_in_flight(&shared.root.uffd, self.staging, &shared.zero_page);
        child::close_raw(shared.stop_fd);
        child::close_raw(shared.gate_fd);
        child::close_raw(shared.reopen_fd);
        // Closing the descriptors (last reference) releases what is left registered.
        drop(shared);
        drop(registry);
        // SAFETY: our own mappings; parts the program already unmapped are skipped.
        unsafe {
            libc::munmap(self.staging as *mut _, STAGING_PAGES * PAGE);
            for (a, b) in ours {
                libc::munmap(a as *mut _, b - a);
            }
        }
        // The dead children's stores this region's evictor did not get to.
        manager::bury_dead_stores();
    }
}

/// The parts of `[start, end)` outside the `holes` the program unmapped itself, ascending.
fn still_mapped(start: usize, end: usize, holes: Vec<(usize, usize)>) -> Vec<(usize, usize)> {
    let mut holes: Vec<(usize, usize)> = holes
        .into_iter()
        .map(|(a, b)| (a.max(start), b.min(end)))
        .filter(|(a, b)| a < b)
        .collect();
    holes.sort_unstable();
    let mut out = Vec::new();
    let mut at = start;
    for (a, b) in holes {
        if a > at {
            out.push((at, a));
        }
        at = at.max(b);
    }
    if at < end {
        out.push((at, end));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::still_mapped;

    #[test]
    fn still_mapped_leaves_out_overlapping_and_outside_holes() {
        assert_eq!(still_mapped(100, 200, vec![]), vec![(100, 200)]);
        assert_eq!(
            still_mapped(
                100,
                200,
                vec![(150, 160), (50, 110), (155, 170), (190, 300)]
            ),
            vec![(110, 150), (170, 190)]
        );
        assert_eq!(still_mapped(100, 200, vec![(0, 1000)]), vec![]);
    }
}
