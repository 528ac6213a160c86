//! What one side of `bench region` reports: its memory use and its [`SideResult`].

use serde::{Deserialize, Serialize};

use super::driver::{FaultCounter, Lat, RunReport};
use super::{Workload, PAGE, SLOW_NS};

/// DRAM accounting of a side after the measured phase.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct MemoryUse {
    /// Working-set pages mapped in DRAM (zmem: the region's resident bytes; kernel: the
    /// cgroup's rss + cache above the worker's baseline).
    pub resident_bytes: u64,
    /// zmem: evicted pages waiting for compression.
    pub staged_bytes: u64,
    /// Compressed pool (zram's / the store's mem_used_total).
    pub pool_bytes: u64,
    pub orig_data_size: u64,
    pub compr_data_size: u64,
    /// resident + staged + pool.
    pub dram_bytes: u64,
    /// orig_data_size / pool_bytes: the compression ratio.
    pub ratio: Option<f64>,
    /// working-set bytes / dram_bytes: data per byte of DRAM.
    pub effective_ratio: Option<f64>,
}

impl MemoryUse {
    pub fn new(size: u64, resident: u64, staged: u64, pool: u64, orig: u64, compr: u64) -> Self {
        let dram = resident + staged + pool;
        MemoryUse {
            resident_bytes: resident,
            staged_bytes: staged,
            pool_bytes: pool,
            orig_data_size: orig,
            compr_data_size: compr,
            dram_bytes: dram,
            ratio: (orig > 0 && pool > 0).then(|| orig as f64 / pool as f64),
            effective_ratio: (dram > 0).then(|| size as f64 / dram as f64),
        }
    }
}

/// A fault's time, in µs per handled fault (measured phase). `handoff_us` is what the
/// faulting thread waits beyond the handler's own work: the mean faulting access minus the
/// handler's mean, i.e. the wake-ups of the handler and of the faulting thread.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FaultBreakdown {
    pub faults: u64,
    pub handler_us: f64,
    pub evict_on_fault_us: f64,
    pub decompress_us: f64,
    pub map_us: f64,
    pub handoff_us: Option<f64>,
    /// Eviction between faults on the handler, per handled fault.
    pub idle_evict_us: f64,
    /// Eviction on any thread, per page moved out: the move (`UFFDIO_MOVE`) and the store
    /// (compression).
    #[serde(default)]
    pub evict_move_us_per_page: Option<f64>,
    #[serde(default)]
    pub evict_store_us_per_page: Option<f64>,
}

impl FaultBreakdown {
    pub fn new(
        before: &zmem_region::HandlerTime,
        after: &zmem_region::HandlerTime,
        fault_access_mean_us: Option<f64>,
    ) -> Option<FaultBreakdown> {
        let faults = after.faults.saturating_sub(before.faults);
        if faults == 0 {
            return None;
        }
        let per = |a: u64, b: u64| a.saturating_sub(b) as f64 / faults as f64 / 1000.0;
        let handler_us = per(after.total_ns, before.total_ns);
        let moved = after.evict_moved.saturating_sub(before.evict_moved);
        let per_page = |a: u64, b: u64| {
            (moved > 0).then(|| a.saturating_sub(b) as f64 / moved as f64 / 1000.0)
        };
        Some(FaultBreakdown {
            faults,
            handler_us,
            evict_on_fault_us: per(after.room_ns, before.room_ns),
            decompress_us: per(after.read_ns, before.read_ns),
            map_us: per(after.map_ns, before.map_ns),
            handoff_us: fault_access_mean_us.map(|m| (m - handler_us).max(0.0)),
            idle_evict_us: per(after.idle_evict_ns, before.idle_evict_ns),
            evict_move_us_per_page: per_page(after.evict_move_ns, before.evict_move_ns),
            evict_store_us_per_page: per_page(after.evict_store_ns, before.evict_store_ns),
        })
    }
}

/// One side of the comparison: zmem with an eviction policy, or the kernel's zram.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SideResult {
    /// "zmem-clock", "zmem-fifo", "kernel-zram".
    pub label: String,
    /// "zmem" or "kernel-zram".
    pub kind: String,
    pub workload: Workload,
    pub run: RunReport,
    /// Faults in the measured phase (zmem: the region's faults; kernel: the major faults of the
    /// access threads).
    pub faults: u64,
    pub faults_per_access: f64,
    pub faults_per_s: f64,
    /// Latency of faulting accesses (both sides, same method: see RunReport::fault_access).
    pub fault_latency: Lat,
    pub fault_latency_source: String,
    /// zmem: the handler's fault latency (read to wake-up; whole run, fill included).
    pub handler_fault_latency: Option<Lat>,
    /// zmem: where a fault's time goes, per handled fault over the measured phase.
    #[serde(default)]
    pub fault_breakdown: Option<FaultBreakdown>,
    pub memory: MemoryUse,
    /// Process CPU (user + system) over the measured phase.
    pub cpu_s: f64,
    pub kswapd_cpu_s: f64,
    /// (process + kswapd CPU) per GiB accessed.
    pub cpu_s_per_gib: f64,
    /// Side-specific settings and counters.
    pub detail: serde_json::Value,
}

impl SideResult {
    /// Builds the common derived figures.
    pub fn new(
        label: &str,
        kind: &str,
        w: &Workload,
        run: RunReport,
        faults: u64,
        memory: MemoryUse,
        detail: serde_json::Value,
    ) -> SideResult {
        let (fault_latency, source) = if run.fault_access.count > 0 || faults == 0 {
            (
                run.fault_access.clone(),
                match run.fault_counter {
                    Some(FaultCounter::Any) => "accesses during which their thread took a fault",
                    _ => "accesses during which their thread took a major fault",
                }
                .to_string(),
            )
        } else {
            (
                run.slow_access.clone(),
                format!(
                    "accesses slower than {} ns (no fault was seen per thread)",
                    SLOW_NS
                ),
            )
        };
        let cpu_s = run.cpu_user_s + run.cpu_sys_s;
        let gib = (run.accesses * PAGE as u64) as f64 / (1u64 << 30) as f64;
        SideResult {
            label: label.to_string(),
            kind: kind.to_string(),
            workload: w.clone(),
            faults,
            faults_per_access: if run.accesses > 0 {
                faults as f64 / run.accesses as f64
            } else {
                0.0
            },
            faults_per_s: if run.wall_s > 0.0 {
                faults as f64 / run.wall_s
            } else {
                0.0
            },
            fault_latency,
            fault_latency_source: source,
            handler_fault_latency: None,
            fault_breakdown: None,
            memory,
            cpu_s,
            kswapd_cpu_s: run.kswapd_cpu_s,
            cpu_s_per_gib: if gib > 0.0 {
                (cpu_s + run.kswapd_cpu_s) / gib
            } else {
                0.0
            },
            run,
            detail,
        }
    }

    /// One human line.
    pub fn summary(&self) -> String {
        let r = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.2}"));
        format!(
            "{:<12} {:>8.2} us/access (p50 {:.2} p99 {:.1} p99.9 {:.1})  faults/access {:.4}  fault p50 {:.1} p99 {:.1} us  {:.1} MiB/s  ratio {}  effective {}  cpu {:.2} s/GiB",
            self.label,
            self.run.ns_per_access / 1000.0,
            self.run.access.p50_us,
            self.run.access.p99_us,
            self.run.access.p999_us,
            self.faults_per_access,
            self.fault_latency.p50_us,
            self.fault_latency.p99_us,
            self.run.mib_s,
            r(self.memory.ratio),
            r(self.memory.effective_ratio),
            self.cpu_s_per_gib,
        )
    }
}

/// A side that did not run, and why.
#[derive(Clone, Debug, Serialize)]
pub struct Skipped {
    pub label: String,
    pub reason: String,
}

/// Faults per access of clock against fifo.
#[derive(Clone, Debug, Serialize)]
pub struct EvictionComparison {
    pub clock_faults_per_access: f64,
    pub fifo_faults_per_access: f64,
    /// (fifo - clock) / fifo in percent: how many fewer faults clock takes.
    pub reduction_pct: Option<f64>,
}

impl EvictionComparison {
    pub fn new(clock: f64, fifo: f64) -> EvictionComparison {
        EvictionComparison {
            clock_faults_per_access: clock,
            fifo_faults_per_access: fifo,
            reduction_pct: (fifo > 0.0).then(|| (fifo - clock) / fifo * 100.0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_use_and_comparison() {
        let m = MemoryUse::new(1 << 30, 256 << 20, 0, 256 << 20, 768 << 20, 250 << 20);
        assert_eq!(m.dram_bytes, 512 << 20);
        assert_eq!(m.effective_ratio, Some(2.0));
        assert_eq!(m.ratio, Some(3.0));
        let e = EvictionComparison::new(0.07, 0.1);
        assert!((e.reduction_pct.unwrap() - 30.0).abs() < 1e-9);
    }
}
