//! What can go wrong between zmem and a GPU, each with the reason a user can act on.

use std::path::PathBuf;

/// Why the GPU backend is unavailable, or why a batch failed on it.
#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
pub enum GpuError {
    /// A shared library was not found anywhere zmem looked.
    #[error("{what} not found (tried {}); {hint}", tried.join(", "))]
    LibraryNotFound {
        what: &'static str,
        tried: Vec<String>,
        hint: &'static str,
    },
    /// A library was found but could not be loaded (wrong architecture, missing dependency).
    #[error("{path}: cannot load: {reason}", path = path.display())]
    LibraryLoad { path: PathBuf, reason: String },
    /// A library lacks a function zmem calls: not the library or not the version zmem speaks.
    #[error("{path}: has no {symbol} (not {what}, or a version zmem does not speak)", path = path.display())]
    MissingSymbol {
        what: &'static str,
        path: PathBuf,
        symbol: String,
    },
    /// nvCOMP is there, but of a major version whose batched API differs from 6.x.
    #[error("nvCOMP {found} at {path} is not supported: zmem speaks nvCOMP 6.x (pip install nvidia-libnvcomp-cu13 or -cu12)", path = path.display())]
    UnsupportedVersion { path: PathBuf, found: String },
    /// The driver loaded but sees no device (or not the one asked for).
    #[error("no CUDA device {ordinal} (the driver sees {count})")]
    NoDevice { ordinal: usize, count: usize },
    /// A CUDA driver call failed.
    #[error("{call}: CUDA error {code} ({name})")]
    Cuda {
        call: &'static str,
        code: i32,
        name: String,
    },
    /// An nvCOMP call failed as a whole (per-page failures are `Chunk`).
    #[error("{call}: nvCOMP status {status} ({})", status_name(*status))]
    Nvcomp { call: &'static str, status: i32 },
    /// One page of a batch failed on the device; the rest of the batch may be fine.
    #[error("page {index} of the batch: nvCOMP status {status} ({})", status_name(*status))]
    Chunk { index: usize, status: i32 },
    /// The device reported an output size it cannot have produced for this page.
    #[error("page {index} of the batch: the device reported {size} bytes of output")]
    BadOutput { index: usize, size: usize },
    /// Options that cannot work (a batch or page size the device cannot take).
    #[error("invalid GPU configuration: {0}")]
    Config(String),
    /// A simulated failure (the test device).
    #[error("{0}")]
    Injected(String),
}

impl GpuError {
    /// Whether the device must be set up again before it is used (a lost or poisoned
    /// context), as opposed to a failure of this batch alone.
    pub fn loses_context(&self) -> bool {
        match self {
            // Sticky errors: the context is unusable after them (illegal address, launch
            // failure, ECC, hardware stop, unknown), and a context that vanished.
            GpuError::Cuda { code, .. } => {
                matches!(*code, 201 | 214 | 700..=720 | 999)
            }
            GpuError::Nvcomp { status, .. } => *status == NVCOMP_ERROR_CUDA,
            _ => false,
        }
    }
}

pub(crate) const NVCOMP_ERROR_CUDA: i32 = 1000;

/// nvCOMP's status names (nvcomp/shared_types.h).
pub fn status_name(status: i32) -> &'static str {
    match status {
        0 => "success",
        10 => "invalid value",
        11 => "not supported",
        12 => "cannot decompress",
        13 => "bad checksum",
        14 => "cannot verify checksums",
        15 => "output buffer too small",
        16 => "wrong header length",
        17 => "alignment",
        18 => "chunk size too large",
        19 => "cannot compress",
        20 => "wrong input length",
        21 => "batch size too large",
        22 => "sub-chunk count too large",
        23 => "sub-chunk count too small",
        24 => "output buffer alignment too small",
        NVCOMP_ERROR_CUDA => "CUDA error",
        10000 => "internal error",
        _ => "unknown status",
    }
}
