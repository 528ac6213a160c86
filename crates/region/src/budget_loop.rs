//! Runs the adaptive budget's [`Controller`] from the evictor thread: every interval it reads
//! PSI and MemAvailable and the region's own refault rate, and applies the budget it decides.

use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use crate::budget::{read_machine, AdaptiveConfig, BudgetSample, Controller, Decision};
use crate::manager::Shared;
use crate::PAGE;

/// The adaptive budget's decisions: (seconds since the region was created, decision).
pub(crate) type History = std::sync::Arc<parking_lot::Mutex<Vec<(f64, Decision)>>>;

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

    /// The budget to start with, before the first step.
    pub fn initial(&self) -> u64 {
        self.controller.budget()
    }

    /// One control step if an interval has passed (or `force`).
    pub fn tick(&mut self, shared: &Shared, force: bool) {
        let dt = self.last.elapsed();
        if dt < self.interval && !force {
            return;
        }
        self.last = Instant::now();
        let (avg10, total, avail) = match read_machine() {
            Ok(m) => m,
            Err(e) => {
                if !self.warned {
                    self.warned = true;
                    tracing::warn!("adaptive budget cannot read the machine ({e}); holding");
                }
                return;
            }
        };
        let c = &shared.counters;
        let major = c.major_faults.load(Relaxed) + c.staged_faults.load(Relaxed);
        let faults = major + c.zero_faults.load(Relaxed);
        let secs = dt.as_secs_f64().max(1e-3);
        let sample = BudgetSample {
            psi_some_avg10: avg10,
            psi_some_total_us: total,
            mem_available: avail,
            refaults_per_sec: (major - self.last_major) as f64 / secs,
            faults_per_sec: (faults - self.last_faults) as f64 / secs,
            resident: (shared.root.inner.lock().resident * PAGE) as u64,
        };
        self.last_major = major;
        self.last_faults = faults;
        let d = self.controller.step(&sample, dt);
        let pages = (d.budget as usize / PAGE).max(crate::MIN_BUDGET_PAGES);
        if pages != shared.budget() {
            tracing::debug!("adaptive budget: {d}");
        }
        shared.budget_pages.store(pages, Relaxed);
        self.history
            .lock()
            .push((self.start.elapsed().as_secs_f64(), d));
    }
}
