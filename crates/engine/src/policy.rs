//! Policies: which codec a request gets. Measured on this machine (Calgary, 4 KiB pages, one
//! core; `zmem bench codecs`): lz4 1.60 at ~500 MB/s, zstd-1 2.32 at ~290 MB/s, zstd-3 2.34,
//! deflate-1 2.37 at ~180 MB/s, deflate-6 2.43 at ~100 MB/s. On 64 KiB blocks zstd-1 reaches
//! 2.68 and runs faster than on pages.
//!
//! Evict groups ([`Policy::evict_group`]: pages a region compresses together as one block
//! when it evicts them, whatever their addresses) are off (1) for every policy, `max`
//! included, because they lose wherever evicted pages come back. zstd-3 gains only 6% / 12% /
//! 17% / 20% on 8 / 16 / 32 / 64 KiB blocks (2.50 / 2.62 / 2.74 / 2.82 against 2.34), while a
//! block keeps all its bytes until its last page faults back in. With random refaults a block
//! of G pages lives H(G) times as long as a page does (H(8) = 2.7). Repacking the survivors of
//! half-dead blocks (`PageStore::repack_groups`) bounds that, at about twice the compression
//! CPU. `zmem bench region --size 512M --resident 128M --accesses 500000 --policy max`
//! (2 vCPUs, load < 1.5; effective ratio = data / DRAM incl. resident pages):
//!
//! | pattern | group | µs/access | fault p50 / p99 µs | ratio | effective | CPU s/GiB |
//! |---|---|---|---|---|---|---|
//! | rand | 1 | 42.0–43.1 | 53 / 95–98 | 2.22 | 1.71 | 12.8–13.4 |
//! | rand | 2 | 91.6 | 117 / 243 | 2.16 | 1.69 | 23.8 |
//! | rand | 4 | 94.8 | 73 / 423 | 1.89 | 1.55 | 23.5 |
//! | rand | 8 | 95.7–111.2 | 82–91 / 666–711 | 1.74 | 1.48 | 23.3–27.2 |
//! | rand | 16 | 123.3–129.5 | 99–117 / 1208–1274 | 1.70 | 1.45 | 27.4–31.4 |
//! | zipf 0.99 | 1 / 2 / 8 | 10.9 / 21.7 / 26.6 | 52 / 95, 109 / 233, 89 / 691 | 2.22 / 2.04 / 1.73 | 1.71 / 1.63 / 1.47 | 3.6 / 5.8 / 6.6 |
//! | zipf 1.2 | 1 / 8 | 3.6 / 7.7 | 50 / 90, 91 / 539 | 2.24 / 2.00 | 1.72 / 1.61 | 1.2 / 1.9 |
//!
//! Without the repack, group 8 fell to ratio 0.83 (rand) and 1.16 (zipf). Groups win only for
//! data that stays cold: right after the fill (2000 accesses), group 8 / 16 gave ratio 2.57 /
//! 2.68 against 2.27 (effective 1.86 / 1.90 against 1.73). Regions whose evicted data is
//! mostly never touched again can ask for them (`RegionConfig::evict_group`).

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

    /// Pages compressed together as one block when a region evicts them (1: each page alone).
    /// 1 for every policy: see the module doc for the measurements behind the choice.
    pub fn evict_group(self) -> usize {
        match self {
            Policy::Fast | Policy::Balanced | Policy::Auto | Policy::Max => 1,
        }
    }

    /// The codec for recompressing cold data, where the policy does that.
    pub fn cold_codec(self) -> Option<Codec> {
        match self {
            Policy::Auto => Some(Codec::Zstd { level: 1 }),
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
