//! A block device (or a regular file) driven with O_DIRECT pread/pwrite: the kernel's zram side.

use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::kernel::zram::{parse_mm_stat, MmStat};
use crate::target::{MemoryReport, PageTarget, PAGE};

#[derive(Debug, thiserror::Error)]
pub enum BlockDevError {
    #[error("block device {0} does not exist")]
    NotFound(PathBuf),
    #[error("cannot open {path} with O_DIRECT: the file system or driver refuses direct I/O ({}: {err})", errno_name(*errno))]
    DirectIoUnsupported {
        path: PathBuf,
        errno: i32,
        err: std::io::Error,
    },
    #[error("cannot open {path} with O_DIRECT for read/write ({}: {err})", errno_name(*errno))]
    Open {
        path: PathBuf,
        errno: i32,
        err: std::io::Error,
    },
    #[error("cannot get the size of {path}: {err}")]
    Size { path: PathBuf, err: std::io::Error },
    #[error("{0} has size 0 (a zram device needs a disksize)")]
    Empty(PathBuf),
}

/// The symbolic name of common errno values (EINVAL...), "errno" otherwise.
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EINVAL => "EINVAL",
        libc::EACCES => "EACCES",
        libc::EPERM => "EPERM",
        libc::EBUSY => "EBUSY",
        libc::EROFS => "EROFS",
        libc::EISDIR => "EISDIR",
        libc::ENXIO => "ENXIO",
        libc::ENODEV => "ENODEV",
        libc::ENOENT => "ENOENT",
        libc::ENOTDIR => "ENOTDIR",
        _ => "errno",
    }
}

/// A block device opened O_RDWR | O_DIRECT.
#[derive(Debug)]
pub struct BlockDevTarget {
    path: PathBuf,
    file: File,
    size: u64,
    zram: Option<u32>,
}

impl BlockDevTarget {
    /// Opens `path` (a block device, or a regular file on a file system that allows O_DIRECT)
    /// for direct I/O. Its size is its current size.
    pub fn open(path: &Path) -> Result<Self, BlockDevError> {
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_DIRECT)
            .open(path)
            .map_err(|err| {
                let errno = err.raw_os_error().unwrap_or(0);
                match errno {
                    libc::ENOENT => BlockDevError::NotFound(path.to_path_buf()),
                    libc::EINVAL => BlockDevError::DirectIoUnsupported {
                        path: path.to_path_buf(),
                        errno,
                        err,
                    },
                    _ => BlockDevError::Open {
                        path: path.to_path_buf(),
                        errno,
                        err,
                    },
                }
            })?;
        let size = file
            .seek(SeekFrom::End(0))
            .map_err(|err| BlockDevError::Size {
                path: path.to_path_buf(),
                err,
            })?;
        if size == 0 {
            return Err(BlockDevError::Empty(path.to_path_buf()));
        }
        Ok(BlockDevTarget {
            path: path.to_path_buf(),
            file,
            size,
            zram: zram_index(path),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// N if this is /dev/zramN.
    pub fn zram_index(&self) -> Option<u32> {
        self.zram
    }

    fn sysfs(&self, attr: &str) -> Option<PathBuf> {
        self.zram
            .map(|n| PathBuf::from(format!("/sys/block/zram{n}/{attr}")))
    }

    fn check(&self, offset: u64, len: usize, addr: usize) -> anyhow::Result<()> {
        anyhow::ensure!(
            len > 0 && len % PAGE == 0 && offset % PAGE as u64 == 0 && addr % PAGE == 0,
            "{}: unaligned I/O (offset {offset}, length {len}, buffer address {addr:#x})",
            self.path.display()
        );
        anyhow::ensure!(
            offset
                .checked_add(len as u64)
                .is_some_and(|end| end <= self.size),
            "{}: I/O at offset {offset} length {len} past the end ({} bytes)",
            self.path.display(),
            self.size
        );
        Ok(())
    }
}

/// N if `path` (or what it links to) is /dev/zramN.
pub fn zram_index(path: &Path) -> Option<u32> {
    let real = std::fs::canonicalize(path).unwrap_or_else(|_| path.to_path_buf());
    if real.parent() != Some(Path::new("/dev")) {
        return None;
    }
    real.file_name()?
        .to_str()?
        .strip_prefix("zram")?
        .parse()
        .ok()
}

impl From<&MmStat> for MemoryReport {
    fn from(m: &MmStat) -> Self {
        MemoryReport {
            orig_data_size: m.orig_data_size,
            compr_data_size: m.compr_data_size,
            mem_used_total: m.mem_used_total,
            same_pages: m.same_pages,
            huge_pages: m.huge_pages,
        }
    }
}

/// The selected algorithm in a zram comp_algorithm file ("lzo [lz4] zstd" -> "lz4").
pub fn selected_algorithm(text: &str) -> Option<String> {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix('[')?.strip_suffix(']'))
        .map(str::to_string)
}

impl BlockDevTarget {
    fn mm_stat(&self) -> anyhow::Result<Option<MmStat>> {
        let Some(p) = self.sysfs("mm_stat") else {
            return Ok(None);
        };
        let text =
            std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?;
        parse_mm_stat(&text).map(Some)
    }

    fn algorithm(&self) -> Option<String> {
        let text = std::fs::read_to_string(self.sysfs("comp_algorithm")?).ok()?;
        selected_algorithm(&text)
    }
}

impl PageTarget for BlockDevTarget {
    fn name(&self) -> String {
        match (self.zram, self.algorithm()) {
            (Some(n), Some(alg)) => format!("zram{n} {alg}"),
            (Some(n), None) => format!("zram{n}"),
            _ => self.path.display().to_string(),
        }
    }

    fn size_bytes(&self) -> u64 {
        self.size
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> anyhow::Result<()> {
        self.check(offset, buf.len(), buf.as_ptr() as usize)?;
        self.file.write_all_at(buf, offset).with_context(|| {
            format!(
                "writing {} bytes at offset {offset} of {}",
                buf.len(),
                self.path.display()
            )
        })
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> anyhow::Result<()> {
        self.check(offset, buf.len(), buf.as_ptr() as usize)?;
        let len = buf.len();
        self.file.read_exact_at(buf, offset).with_context(|| {
            format!(
                "reading {len} bytes at offset {offset} of {}",
                self.path.display()
            )
        })
    }

    /// O_DIRECT writes are complete when pwrite returns (zram has no write cache); fdatasync
    /// for a regular file.
    fn flush(&self) -> anyhow::Result<()> {
        if self.zram.is_some() {
            return Ok(());
        }
        self.file
            .sync_data()
            .with_context(|| format!("fdatasync {}", self.path.display()))
    }

    fn memory(&self) -> anyhow::Result<MemoryReport> {
        Ok(self
            .mm_stat()?
            .map(|m| MemoryReport::from(&m))
            .unwrap_or_default())
    }

    fn extra(&self) -> serde_json::Value {
        let Some(n) = self.zram else {
            return serde_json::Value::Null;
        };
        let mm = self.mm_stat().ok().flatten();
        serde_json::json!({
            "device": format!("/dev/zram{n}"),
            "comp_algorithm": self.algorithm(),
            "disksize": self.size,
            "mm_stat": mm,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mm_stat_parses_kernel_line() {
        let m = parse_mm_stat(
            "  536870912 333000000 335544320        0 335544320     1024        0      7       0\n",
        )
        .unwrap();
        assert_eq!(m.orig_data_size, 536870912);
        assert_eq!(m.compr_data_size, 333000000);
        assert_eq!(m.mem_used_total, 335544320);
        assert_eq!(m.same_pages, 1024);
        assert_eq!(m.huge_pages, 7);
        let r = MemoryReport::from(&m);
        assert!((r.ratio_mem_used().unwrap() - 1.6).abs() < 1e-9);
    }

    #[test]
    fn mm_stat_rejects_garbage() {
        assert!(parse_mm_stat("1 2 3").is_err());
        assert!(parse_mm_stat("a b c d e f g h").is_err());
    }

    #[test]
    fn selected_algorithm_in_brackets() {
        assert_eq!(
            selected_algorithm("lzo-rle lzo [lz4] \n").as_deref(),
            Some("lz4")
        );
        assert_eq!(selected_algorithm("lzo lz4"), None);
    }

    #[test]
    fn zram_index_of_paths() {
        // canonicalize fails on paths that do not exist; the literal path is used then.
        assert_eq!(zram_index(Path::new("/dev/zram7")), Some(7));
        assert_eq!(zram_index(Path::new("/dev/sda")), None);
        assert_eq!(zram_index(Path::new("/tmp/zram0")), None);
    }
}
