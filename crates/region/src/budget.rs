//! Adaptive budget (placeholder being written: see the helper's spec).

use std::time::Duration;

/// Bounds and tuning of an adaptive budget.
#[derive(Clone, Debug, PartialEq)]
pub struct AdaptiveConfig {
    pub min: u64,
    pub max: u64,
    pub interval: Duration,
}

/// One reading of the machine and the region, taken every control interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct BudgetSample {
    pub psi_some_avg10: f64,
    pub mem_available: u64,
    pub refaults_per_sec: f64,
    pub resident: u64,
}
