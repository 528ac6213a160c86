//! A guard over a kernel zram device that is free: it configures it for a benchmark and resets
//! it when dropped (also on error and on Ctrl-C), so the device is left as found (disksize 0).

use std::path::PathBuf;

use anyhow::Context;

/// The zram device the benchmarks use (as swap, or as a block device).
pub const ZRAM_INDEX: u32 = 0;

#[derive(Debug, thiserror::Error)]
pub enum ZramError {
    #[error("zram needs root (running as uid {0})")]
    NotRoot(u32),
    #[error("no zram device /dev/zram{0} (is the zram module loaded? `modprobe zram`)")]
    NoZram(u32),
    #[error("/dev/zram{index} is in use ({why}); zmem does not touch it. If it is a leftover of yours: echo 1 > /sys/block/zram{index}/reset")]
    InUse { index: u32, why: String },
    #[error("zram{index} has no algorithm {alg:?}; available: {available}")]
    UnknownAlgorithm {
        index: u32,
        alg: String,
        available: String,
    },
    #[error("zram{index}: writing {value:?} to {attr}: {err}")]
    Sysfs {
        index: u32,
        attr: String,
        value: String,
        err: std::io::Error,
    },
    #[error("zram{index}: reading {attr}: {err}")]
    Read {
        index: u32,
        attr: String,
        err: std::io::Error,
    },
}

/// Holds a free zram device for a benchmark; resets it on drop.
#[derive(Debug)]
pub struct ZramSession {
    index: u32,
    configured: Option<(String, u64)>,
}

impl ZramSession {
    /// Takes /dev/zram{index}: requires root, the device, and that it is free (disksize 0, not
    /// swap, not mounted, no holder).
    pub fn acquire(index: u32) -> Result<Self, ZramError> {
        // SAFETY: geteuid has no preconditions and cannot fail.
        let uid = unsafe { libc::geteuid() };
        if uid != 0 {
            return Err(ZramError::NotRoot(uid));
        }
        let dev = PathBuf::from(format!("/dev/zram{index}"));
        let sys = PathBuf::from(format!("/sys/block/zram{index}"));
        if !dev.exists() || !sys.join("disksize").exists() {
            return Err(ZramError::NoZram(index));
        }
        let in_use = |why: String| ZramError::InUse { index, why };
        let disksize = read_attr(index, "disksize")?;
        if disksize.trim() != "0" {
            return Err(in_use(format!("disksize is {}", disksize.trim())));
        }
        let name = format!("/dev/zram{index}");
        if let Ok(swaps) = std::fs::read_to_string("/proc/swaps") {
            if swaps
                .lines()
                .skip(1)
                .any(|l| l.split_whitespace().next() == Some(name.as_str()))
            {
                return Err(in_use("listed in /proc/swaps".into()));
            }
        }
        if let Ok(mounts) = std::fs::read_to_string("/proc/mounts") {
            if let Some(l) = mounts
                .lines()
                .find(|l| l.split_whitespace().next() == Some(name.as_str()))
            {
                let at = l.split_whitespace().nth(1).unwrap_or("?");
                return Err(in_use(format!("mounted at {at}")));
            }
        }
        if let Ok(mut holders) = std::fs::read_dir(sys.join("holders")) {
            if holders.next().is_some() {
                return Err(in_use("it has holders (dm, md...)".into()));
            }
        }
        Ok(ZramSession {
            index,
            configured: None,
        })
    }

    pub fn index(&self) -> u32 {
        self.index
    }

    pub fn device(&self) -> PathBuf {
        PathBuf::from(format!("/dev/zram{}", self.index))
    }

    /// Algorithms the device offers (comp_algorithm).
    pub fn algorithms(&self) -> Result<Vec<String>, ZramError> {
        let text = read_attr(self.index, "comp_algorithm")?;
        Ok(text
            .split_whitespace()
            .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
            .collect())
    }

    /// Resets the device (so it is empty), then sets comp_algorithm and disksize. Every open
    /// handle on the device must be closed first (the kernel refuses to reset an open device).
    pub fn configure(&mut self, algorithm: &str, disksize: u64) -> Result<(), ZramError> {
        let available = self.algorithms()?;
        if !available.iter().any(|a| a == algorithm) {
            return Err(ZramError::UnknownAlgorithm {
                index: self.index,
                alg: algorithm.to_string(),
                available: available.join(", "),
            });
        }
        self.reset()?;
        self.configured = Some((algorithm.to_string(), disksize));
        write_attr(self.index, "comp_algorithm", algorithm)?;
        write_attr(self.index, "disksize", &disksize.to_string())?;
        eprintln!(
            "zmem: configured /dev/zram{}: comp_algorithm {algorithm}, disksize {disksize}",
            self.index
        );
        Ok(())
    }

    /// (algorithm, disksize) last configured.
    pub fn configured(&self) -> Option<(&str, u64)> {
        self.configured.as_ref().map(|(a, s)| (a.as_str(), *s))
    }

    fn reset(&self) -> Result<(), ZramError> {
        write_attr(self.index, "reset", "1")
    }

    /// The device's current disksize.
    pub fn disksize(&self) -> Result<u64, ZramError> {
        disksize(self.index)
    }
}

/// The current disksize of /dev/zram{index}.
pub fn disksize(index: u32) -> Result<u64, ZramError> {
    let text = read_attr(index, "disksize")?;
    text.trim().parse().map_err(|e| ZramError::Read {
        index,
        attr: "disksize".into(),
        err: std::io::Error::new(std::io::ErrorKind::InvalidData, e),
    })
}

impl Drop for ZramSession {
    fn drop(&mut self) {
        if self.configured.is_none() {
            return;
        }
        match self.reset() {
            Ok(()) => {
                let size = disksize(self.index)
                    .map(|s| s.to_string())
                    .unwrap_or_else(|e| e.to_string());
                eprintln!(
                    "zmem: restored /dev/zram{} (reset, disksize {size})",
                    self.index
                );
            }
            Err(e) => eprintln!(
                "zmem: warning: could not reset /dev/zram{}: {e}; run: echo 1 > /sys/block/zram{}/reset",
                self.index, self.index
            ),
        }
    }
}

fn read_attr(index: u32, attr: &str) -> Result<String, ZramError> {
    std::fs::read_to_string(format!("/sys/block/zram{index}/{attr}")).map_err(|err| {
        ZramError::Read {
            index,
            attr: attr.into(),
            err,
        }
    })
}

fn write_attr(index: u32, attr: &str, value: &str) -> Result<(), ZramError> {
    std::fs::write(format!("/sys/block/zram{index}/{attr}"), value).map_err(|err| {
        ZramError::Sysfs {
            index,
            attr: attr.into(),
            value: value.into(),
            err,
        }
    })
}

/// Parses /sys/block/zramN/mm_stat: orig_data_size compr_data_size mem_used_total mem_limit
/// mem_used_max same_pages pages_compacted huge_pages [huge_pages_since].
pub fn parse_mm_stat(text: &str) -> anyhow::Result<MmStat> {
    let v: Vec<u64> = text
        .split_whitespace()
        .map(|f| f.parse::<u64>())
        .collect::<Result<_, _>>()
        .with_context(|| format!("mm_stat is not a list of numbers: {text:?}"))?;
    anyhow::ensure!(
        v.len() >= 8,
        "mm_stat has {} fields, expected at least 8: {text:?}",
        v.len()
    );
    Ok(MmStat {
        orig_data_size: v[0],
        compr_data_size: v[1],
        mem_used_total: v[2],
        mem_limit: v[3],
        mem_used_max: v[4],
        same_pages: v[5],
        pages_compacted: v[6],
        huge_pages: v[7],
    })
}

/// All fields of zram's mm_stat.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct MmStat {
    pub orig_data_size: u64,
    pub compr_data_size: u64,
    pub mem_used_total: u64,
    pub mem_limit: u64,
    pub mem_used_max: u64,
    pub same_pages: u64,
    pub pages_compacted: u64,
    pub huge_pages: u64,
}

/// The mm_stat of /dev/zram`index`.
pub fn read_mm_stat(index: u32) -> anyhow::Result<MmStat> {
    let path = format!("/sys/block/zram{index}/mm_stat");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    parse_mm_stat(&text)
}
