//! Swap on a block device or a swap file for as long as a guard lives ([`SwapOn`]), and
//! /proc/swaps.

use std::ffi::CString;
use std::io::{Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;
use zmem_runenv::size::format_size;

/// Swap priority of zram0 during the run (the highest there is).
pub const SWAP_PRIORITY: i32 = 32767;
const SWAP_FLAG_PREFER: libc::c_int = 0x8000;
const SWAP_FLAG_PRIO_MASK: libc::c_int = 0x7fff;
/// One line of /proc/swaps.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct SwapEntry {
    pub device: String,
    pub kind: String,
    pub size_kib: u64,
    pub used_kib: u64,
    pub priority: i64,
}

/// Parses /proc/swaps.
pub fn parse_swaps(text: &str) -> Vec<SwapEntry> {
    text.lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() >= 5).then(|| SwapEntry {
                device: f[0].to_string(),
                kind: f[1].to_string(),
                size_kib: f[2].parse().unwrap_or(0),
                used_kib: f[3].parse().unwrap_or(0),
                priority: f[4].parse().unwrap_or(0),
            })
        })
        .collect()
}

/// The active swap devices.
pub fn swaps() -> anyhow::Result<Vec<SwapEntry>> {
    let text = std::fs::read_to_string("/proc/swaps").context("reading /proc/swaps")?;
    Ok(parse_swaps(&text))
}

/// A note for the other active swap devices the kernel may use beside zram0 (None if there are
/// none); `then` says what that means for the benchmark at hand.
pub fn other_swap_note(active: &[SwapEntry], then: &str) -> Option<String> {
    if active.is_empty() {
        return None;
    }
    let list: Vec<String> = active
        .iter()
        .map(|s| format!("{} priority {}", s.device, s.priority))
        .collect();
    Some(format!(
        "zmem: note: other swap is active ({}); {then}",
        list.join(", ")
    ))
}

/// The swap header of a device of `pages` 4 KiB pages (what mkswap writes: version 1,
/// last_page, no bad pages, the "SWAPSPACE2" signature at the end of the first page).
pub fn swap_header(pages: u64, label: &str) -> anyhow::Result<Vec<u8>> {
    anyhow::ensure!(
        pages >= 10,
        "a swap device needs at least 10 pages, got {pages}"
    );
    let last = u32::try_from(pages - 1).context("swap device too large for a v1 header")?;
    let mut h = vec![0u8; 4096];
    h[1024..1028].copy_from_slice(&1u32.to_ne_bytes());
    h[1028..1032].copy_from_slice(&last.to_ne_bytes());
    // nr_badpages = 0 (1032..1036), uuid zero (1036..1052), then the volume label.
    let l = label.as_bytes();
    let n = l.len().min(15);
    h[1052..1052 + n].copy_from_slice(&l[..n]);
    h[4096 - 10..].copy_from_slice(b"SWAPSPACE2");
    Ok(h)
}

/// Swap on a block device (or a swap file, see [`super::swapfile`]) for as long as the guard
/// lives.
#[derive(Debug)]
pub struct SwapOn {
    dev: PathBuf,
    /// Whether swapoff is still to be done.
    active: bool,
}

impl SwapOn {
    /// Writes a swap header on `dev` (its whole size: a block device, or a regular file with
    /// all its blocks allocated) and swaps on it with `priority`.
    pub fn enable(dev: &Path, priority: i32) -> anyhow::Result<SwapOn> {
        let mut f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(dev)
            .with_context(|| format!("opening {}", dev.display()))?;
        let size = f
            .seek(SeekFrom::End(0))
            .with_context(|| format!("size of {}", dev.display()))?;
        let header = swap_header(size / 4096, "zmem-bench")?;
        f.seek(SeekFrom::Start(0))?;
        f.write_all(&header)
            .and_then(|()| f.sync_all())
            .with_context(|| format!("writing a swap header on {}", dev.display()))?;
        drop(f);
        let c = CString::new(dev.as_os_str().as_bytes()).context("device path")?;
        let flags = SWAP_FLAG_PREFER | (priority & SWAP_FLAG_PRIO_MASK);
        // SAFETY: c is a valid NUL-terminated path; swapon has no memory preconditions.
        if unsafe { libc::swapon(c.as_ptr(), flags) } != 0 {
            let err = std::io::Error::last_os_error();
            return Err(err).with_context(|| format!("swapon {}", dev.display()));
        }
        eprintln!(
            "zmem: swapon {} ({}, priority {priority})",
            dev.display(),
            format_size(size)
        );
        Ok(SwapOn {
            dev: dev.to_path_buf(),
            active: true,
        })
    }

    /// The device or file swapped on.
    pub fn path(&self) -> &Path {
        &self.dev
    }

    /// swapoff now; whether it worked (a file must stay in place while it is still swap).
    /// Dropping the guard afterwards does nothing more.
    pub fn disable(mut self) -> std::io::Result<()> {
        self.off()
    }

    fn off(&mut self) -> std::io::Result<()> {
        if !std::mem::replace(&mut self.active, false) {
            return Ok(());
        }
        let c = CString::new(self.dev.as_os_str().as_bytes())
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        // SAFETY: c is a valid NUL-terminated path.
        if unsafe { libc::swapoff(c.as_ptr()) } == 0 {
            eprintln!("zmem: swapoff {}", self.dev.display());
            Ok(())
        } else {
            let err = std::io::Error::last_os_error();
            eprintln!(
                "zmem: warning: swapoff {} failed: {err}; run: swapoff {}",
                self.dev.display(),
                self.dev.display()
            );
            Err(err)
        }
    }
}

impl Drop for SwapOn {
    fn drop(&mut self) {
        let _ = self.off();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn swaps_parse() {
        let t = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/dev/zram0                              partition\t1048572\t\t0\t\t32767\n";
        let s = parse_swaps(t);
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].device, "/dev/zram0");
        assert_eq!(s[0].priority, 32767);
        assert!(parse_swaps("Filename Type Size Used Priority\n").is_empty());
    }

    #[test]
    fn swap_header_layout() {
        let h = swap_header(1000, "zmem-bench").unwrap();
        assert_eq!(h.len(), 4096);
        assert_eq!(&h[4086..], b"SWAPSPACE2");
        assert_eq!(u32::from_ne_bytes(h[1024..1028].try_into().unwrap()), 1);
        assert_eq!(u32::from_ne_bytes(h[1028..1032].try_into().unwrap()), 999);
        assert_eq!(&h[1052..1062], b"zmem-bench");
        assert!(swap_header(5, "x").is_err());
    }
}
