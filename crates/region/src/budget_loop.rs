//! Runs the adaptive budget's [`Controller`] from the evictor thread: every interval it reads
//! PSI and MemAvailable and the region's own refault rate, and returns the budget it decides.
//!
//! It sees the region only through [`Signals`], read when a step is due: it depends on nothing
//! of the machinery that runs it (the evictor applies the budget it returns).

use std::time::{Duration, Instant};

use crate::budget::{read_machine, AdaptiveConfig, BudgetSample, Controller, Decision};
use crate::config::{MIN_BUDGET_PAGES, PAGE};

/// What a control step reads of the region.
pub(crate) struct Signals {
    /// Faults that brought back an evicted page (from the store or staging), since creation.
    pub refaults: u64,
    /// Every fault served, since creation.
    pub faults: u64,
    /// Bytes resident now.
    pub resident: u64,
    /// The budget in force, in pages.
    pub budget_pages: usize,
}

/// The adaptive budget's decisions: (seconds since the region was created, decision).
pub(crate) type History = std::sync::Arc<zmem_os::sync::Mutex<Vec<(f64, Decision)>>>;

pub(crate) struct BudgetLoop {
    controller: Controller,
    interval: Duration,
    last: Instant,
    last_major: u64,
    last_faults: u64,
    warned: bool,
    pub history: History,
    start: Instant,
}

impl BudgetLoop {
    pub fn new(cfg: AdaptiveConfig) -> BudgetLoop {
        BudgetLoop {
            interval: cfg.interval,
            controller: Controller::new(cfg),
            last: Instant::now(),
            last_major: 0,
            last_faults: 0,
            warned: false,
            history: Default::default(),
            start: Instant::now(),
        }
    }

    pub fn interval(&self) -> Duration {
        self.interval
    }

    /// One control step if an interval has passed (or `force`): the new budget in pages, or
    /// None when no step was due or the machine could not be read (the budget holds).
    pub fn tick(&mut self, signals: impl FnOnce() -> Signals, force: bool) -> Option<usize> {
        let dt = self.last.elapsed();
        if dt < self.interval && !force {
            return None;
        }
        self.last = Instant::now();
        let (avg10, total, avail) = match read_machine() {
            Ok(m) => m,
            Err(e) => {
                if !self.warned {
                    self.warned = true;
                    tracing::warn!("adaptive budget cannot read the machine ({e}); holding");
                }
                return None;
            }
        };
        let signals = signals();
        let (major, faults) = (signals.refaults, signals.faults);
        let secs = dt.as_secs_f64().max(1e-3);
        let sample = BudgetSample {
            psi_some_avg10: avg10,
            psi_some_total_us: total,
            mem_available: avail,
            refaults_per_sec: (major - self.last_major) as f64 / secs,
            faults_per_sec: (faults - self.last_faults) as f64 / secs,
            resident: signals.resident,
        };
        self.last_major = major;
        self.last_faults = faults;
        let d = self.controller.step(&sample, dt);
        let pages = (d.budget as usize / PAGE).max(MIN_BUDGET_PAGES);
        if pages != signals.budget_pages {
            tracing::debug!("adaptive budget: {d}");
        }
        self.history
            .lock()
            .push((self.start.elapsed().as_secs_f64(), d));
        Some(pages)
    }
}
