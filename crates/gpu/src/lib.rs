//! zmem's accelerator backend: batches of pages compressed on an NVIDIA GPU with nvCOMP
//! (QZRAM's offload, with a GPU where the seeds had Intel QAT), the CPU taking over whenever
//! the device is missing, busy or failing.
//!
//! Nothing here links CUDA: the driver (`libcuda.so.1`) and nvCOMP (`libnvcomp.so.6`, from
//! `pip install nvidia-libnvcomp-cu13`) are opened at run time, so zmem builds and tests on
//! machines without either, and [`probe`] says in one line why the GPU is not used.
//!
//! The output formats are the ones the CPU decodes: raw deflate (libdeflate) and LZ4 blocks
//! (liblz4), wrapped in zmem's object header ([`zmem_codec::wrap_payload`]); faults are served
//! on the CPU. The engine verifies an accelerator's output before it accepts it.
//!
//! Layers: `loader` (finding and opening libraries), `cuda` (the driver calls), `nvcomp`
//! (the batched API), `device` (what the backend needs of a device), `cuda_device` (the real
//! one), `sim` (a CPU stand-in that fails on demand), `backend` (the engine's `Backend`).

mod backend;
mod cuda;
mod cuda_device;
mod device;
mod error;
mod loader;
mod nvcomp;
pub mod sim;

pub use backend::{GpuBackend, GpuStats};
pub use cuda::DeviceInfo;
pub use cuda_device::CudaDevice;
pub use device::{batch_bytes, Device, Transfer, ALIGN};
pub use error::{status_name, GpuError};
pub use nvcomp::GpuCodec;

/// Settings of the GPU backend.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuConfig {
    /// CUDA device ordinal.
    pub device: usize,
    /// Pages (jobs) per device call: nvCOMP's batch. Larger batches amortise the launch and
    /// the copies; the staging buffers are this many times `max_chunk_bytes`.
    pub max_chunks: usize,
    /// The largest input (a page, or a multi-page block) the device takes; larger jobs stay
    /// on the CPU. nvCOMP recommends chunks of at most 64 KiB.
    pub max_chunk_bytes: usize,
    /// Input bytes per device call: the size of the staging buffers (page-locked on the host,
    /// and on the device; the output side is sized for the worst case of 4 KiB pages, about
    /// 2.3x for deflate).
    pub staging_bytes: usize,
    /// Batches accepted and waiting before a new one is handed back (`Saturated`).
    pub queue_batches: usize,
    /// Batches in flight at once: one backend thread per stream, each with its own stream and
    /// staging buffers on the same device, so that one packs and unpacks on the host (and the
    /// engine verifies) while another's batch is on the device.
    pub streams: usize,
    /// The rejection rule applied to the device's output, as on the CPU.
    pub reject_ratio: f32,
}

impl Default for GpuConfig {
    fn default() -> Self {
        GpuConfig {
            device: 0,
            max_chunks: 1024,
            max_chunk_bytes: 64 * 1024,
            staging_bytes: 8 << 20,
            queue_batches: 4,
            streams: 2,
            reject_ratio: zmem_codec::DEFAULT_REJECT_RATIO,
        }
    }
}

impl GpuConfig {
    pub fn validate(&self) -> Result<(), GpuError> {
        let bad = |m: String| Err(GpuError::Config(m));
        if !(1..=65536).contains(&self.max_chunks) {
            return bad(format!("max_chunks {} (1..=65536)", self.max_chunks));
        }
        if !(512..=(1 << 24)).contains(&self.max_chunk_bytes) || self.max_chunk_bytes % 8 != 0 {
            return bad(format!(
                "max_chunk_bytes {} (a multiple of 8 in 512..=16 MiB)",
                self.max_chunk_bytes
            ));
        }
        if self.staging_bytes < self.max_chunk_bytes || self.staging_bytes > (1 << 30) {
            return bad(format!(
                "staging_bytes {} (from max_chunk_bytes to 1 GiB)",
                self.staging_bytes
            ));
        }
        if !(1..=16).contains(&self.streams) {
            return bad(format!("streams {} (1..=16)", self.streams));
        }
        if self.queue_batches == 0 {
            return bad("queue_batches 0 (at least 1)".into());
        }
        if !(self.reject_ratio > 0.0 && self.reject_ratio <= 1.0) {
            return bad(format!("reject_ratio {} (in (0, 1])", self.reject_ratio));
        }
        Ok(())
    }
}

/// Whether this machine can compress on a GPU: the device and libraries found, or the one
/// reason it cannot (no driver, no device, no nvCOMP, a version zmem does not speak).
pub fn probe(cfg: &GpuConfig) -> Result<String, GpuError> {
    CudaDevice::open(cfg.clone()).map(|d| d.describe())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_settings_are_refused_with_the_allowed_range() {
        assert!(GpuConfig::default().validate().is_ok());
        for (cfg, word) in [
            (
                GpuConfig {
                    max_chunks: 0,
                    ..GpuConfig::default()
                },
                "max_chunks 0",
            ),
            (
                GpuConfig {
                    max_chunk_bytes: 100,
                    ..GpuConfig::default()
                },
                "max_chunk_bytes 100",
            ),
            (
                GpuConfig {
                    queue_batches: 0,
                    ..GpuConfig::default()
                },
                "queue_batches 0",
            ),
            (
                GpuConfig {
                    reject_ratio: 1.5,
                    ..GpuConfig::default()
                },
                "reject_ratio 1.5",
            ),
        ] {
            let e = cfg.validate().unwrap_err().to_string();
            assert!(e.contains(word), "{e}");
        }
    }

    /// Without the driver (CI, this project's machine) the probe names what is missing and
    /// how to get it; with one (a lent GPU machine) it describes the device.
    #[test]
    fn the_probe_says_why_there_is_no_gpu_or_which_one_there_is() {
        match probe(&GpuConfig::default()) {
            Ok(desc) => assert!(desc.contains("nvCOMP 6."), "{desc}"),
            Err(e) => {
                let msg = e.to_string();
                assert!(!msg.is_empty());
                if let GpuError::LibraryNotFound { what, .. } = &e {
                    assert!(what.contains("driver") || what.contains("nvCOMP"), "{msg}");
                }
            }
        }
    }
}
