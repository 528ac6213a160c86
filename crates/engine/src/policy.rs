//! Policies: which codec a request gets. Measured on this machine (Calgary, 4 KiB pages, one
//! core; `zmem bench codecs`): lz4 1.60 at ~500 MB/s, zstd-1 2.32 at ~290 MB/s, zstd-3 2.34,
//! deflate-1 2.37 at ~180 MB/s, deflate-6 2.43 at ~100 MB/s. On 64 KiB blocks zstd-1 reaches
//! 2.68 and runs faster than on pages.

//!
//! Whether a region compresses evicted pages alone or in groups is the region's setting
//! (`zmem_region::default_evict_group`, with the measurements behind its default).

use std::fmt;
use std::str::FromStr;

use zmem_codec::Codec;

#[derive(thiserror::Error, Debug, Clone, PartialEq, Eq)]
#[error("unknown policy {0:?} (expected fast, balanced, max or auto)")]
pub struct PolicyError(pub String);

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Policy {
    /// lz4: the cheapest CPU per byte.
    Fast,
    /// zstd-1: most of zstd's ratio at the best speed it has.
    Balanced,
    /// zstd-3: more ratio where CPU is cheap and memory is not.
    Max,
    /// lz4 on the write path, so writes are as fast as `fast`; cold data is recompressed in the
    /// background with zstd into multi-page blocks (zram's recompression, plus blocks), so it
    /// ends near `balanced`'s block ratio.
    Auto,
}

impl Policy {
    pub const ALL: [Policy; 4] = [Policy::Fast, Policy::Balanced, Policy::Max, Policy::Auto];

    /// The codec for data being written now.
    pub fn write_codec(self) -> Codec {
        match self {
            Policy::Fast | Policy::Auto => Codec::LZ4,
            Policy::Balanced => Codec::Zstd { level: 1 },
            Policy::Max => Codec::Zstd { level: 3 },
        }
    }

    /// The codec for recompressing cold data, where the policy does that.
    pub fn cold_codec(self) -> Option<Codec> {
        match self {
            Policy::Auto => Some(Codec::Zstd { level: 1 }),
            _ => None,
        }
    }

    /// The codec for an aligned run of idle pages recompressed as one block: denser than the
    /// single pages' (a block is decoded only when one of its pages comes back, and its
    /// compression runs on idle CPU). zstd-3 on Calgary's 64 KiB blocks: settled 2.58-2.63 by
    /// memory used against 2.49-2.52 with zstd-1, for ~25% more CPU in the idle pass.
    pub fn cold_block_codec(self) -> Option<Codec> {
        match self {
            Policy::Auto => Some(Codec::Zstd { level: 3 }),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Policy::Fast => "fast",
            Policy::Balanced => "balanced",
            Policy::Max => "max",
            Policy::Auto => "auto",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Policy {
    type Err = PolicyError;
    fn from_str(s: &str) -> Result<Policy, PolicyError> {
        Policy::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| PolicyError(s.to_string()))
    }
}
