//! A swap file for as long as a guard lives ([`SwapFile`]): created on the file system of a
//! directory (fallocate, or written with zeros where fallocate is refused), a swap header and
//! swapon through [`SwapOn`]; when dropped (on success, on error and after Ctrl-C alike),
//! swapoff and then the file deleted. A file that could not be swapped off stays in place (an
//! active swap file must not be unlinked: nothing could name it for swapoff again), with the
//! commands to run.

use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::OpenOptionsExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use anyhow::Context;
use zmem_runenv::size::format_size;

use super::swap::{swaps, SwapOn};

/// Name prefix of the benchmark's swap files (followed by the pid of the benchmark).
pub const SWAPFILE_PREFIX: &str = "zmem-bench-swap-";
/// Space left free on the file system beside a swap file.
pub const FREE_RESERVE: u64 = 1 << 30;

/// statfs(2) of `dir`.
fn statfs(dir: &Path) -> anyhow::Result<libc::statfs> {
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).context("path")?;
    // SAFETY: statfs is plain old data; statfs(2) fills it.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: c is a valid NUL-terminated path, &mut st a valid out-pointer.
    if unsafe { libc::statfs(c.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("statfs {}", dir.display()));
    }
    Ok(st)
}

/// The file system type of `dir` by its statfs magic ("ext4", "xfs", "tmpfs", ... or the
/// number in hex).
pub fn fs_type(dir: &Path) -> anyhow::Result<String> {
    #[allow(clippy::unnecessary_cast)]
    let magic = statfs(dir)?.f_type as u64;
    Ok(match magic {
        0xef53 => "ext4".into(),
        0x5846_5342 => "xfs".into(),
        0x9123_683e => "btrfs".into(),
        0x0102_1994 => "tmpfs".into(),
        0x8584_58f6 => "ramfs".into(),
        0x794c_7630 => "overlayfs".into(),
        0x6969 => "nfs".into(),
        0xf2f5_2010 => "f2fs".into(),
        m => format!("0x{m:x}"),
    })
}

/// Bytes free (to root) on the file system of `dir`.
pub fn fs_available(dir: &Path) -> anyhow::Result<u64> {
    let st = statfs(dir)?;
    #[allow(clippy::unnecessary_cast)]
    Ok(st.f_bfree as u64 * st.f_frsize as u64)
}

/// Prints a note for each benchmark swap file in `dir` left by a run whose process is gone.
pub fn note_leftover_swapfiles(dir: &Path) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    let active = swaps().unwrap_or_default();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(SWAPFILE_PREFIX)
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let p = e.path();
        let on = active.iter().any(|s| Path::new(&s.device) == p);
        eprintln!(
            "zmem: note: {} is left from an earlier run that did not clean up; remove it with: {}rm {}",
            p.display(),
            if on {
                format!("swapoff {} && ", p.display())
            } else {
                String::new()
            },
            p.display()
        );
    }
}

/// A swap file that is swap for as long as the guard lives; deleted when dropped.
#[derive(Debug)]
pub struct SwapFile {
    path: PathBuf,
    size: u64,
    /// "fallocate" or "written" (zeros).
    allocation: &'static str,
    swap: Option<SwapOn>,
}

impl SwapFile {
    /// Creates `dir/zmem-bench-swap-<pid>` of `size` bytes (rounded down to 4 KiB; it must not
    /// exist), allocates its blocks, and swaps on it with `priority`.
    pub fn create(dir: &Path, size: u64, priority: i32) -> anyhow::Result<SwapFile> {
        let size = size / 4096 * 4096;
        anyhow::ensure!(
            size >= 64 << 10,
            "a swap file needs at least 64k, asked for {size} bytes"
        );
        let fs = fs_type(dir)?;
        anyhow::ensure!(
            !matches!(fs.as_str(), "tmpfs" | "ramfs" | "overlayfs"),
            "{} is on {fs}, where the kernel cannot swap to a file; use a directory on a disk \
             file system (ext4, xfs)",
            dir.display()
        );
        let free = fs_available(dir)?;
        anyhow::ensure!(
            free >= size + FREE_RESERVE,
            "{} has {} free; a swap file of {} needs that and {} to spare",
            dir.display(),
            format_size(free),
            format_size(size),
            format_size(FREE_RESERVE)
        );
        let path = dir.join(format!("{SWAPFILE_PREFIX}{}", std::process::id()));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .with_context(|| format!("creating the swap file {}", path.display()))?;
        // From here on the guard deletes the file whatever happens.
        let mut guard = SwapFile {
            path,
            size,
            allocation: "fallocate",
            swap: None,
        };
        // SAFETY: fallocate on an open descriptor we own; no memory is involved.
        let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, size as libc::off_t) };
        if r != 0 {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() != Some(libc::EOPNOTSUPP) {
                return Err(err).with_context(|| format!("fallocate of {}", guard.path.display()));
            }
            // The file system cannot preallocate: write the blocks.
            guard.allocation = "written";
            let zeros = vec![0u8; 1 << 20];
            let mut left = size;
            while left > 0 {
                let n = left.min(zeros.len() as u64) as usize;
                f.write_all(&zeros[..n])
                    .with_context(|| format!("writing {}", guard.path.display()))?;
                left -= n as u64;
            }
        }
        f.sync_all()
            .with_context(|| format!("syncing {}", guard.path.display()))?;
        drop(f);
        let swap = SwapOn::enable(&guard.path, priority).with_context(|| {
            format!(
                "{} ({fs}): the kernel refused it as swap",
                guard.path.display()
            )
        })?;
        guard.swap = Some(swap);
        Ok(guard)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn size(&self) -> u64 {
        self.size
    }

    /// How its blocks were allocated: "fallocate" or "written".
    pub fn allocation(&self) -> &'static str {
        self.allocation
    }
}

impl Drop for SwapFile {
    fn drop(&mut self) {
        if let Some(swap) = self.swap.take() {
            if swap.disable().is_err() {
                eprintln!(
                    "zmem: warning: {} is still swap and was left in place; run: swapoff {} && rm {}",
                    self.path.display(),
                    self.path.display(),
                    self.path.display()
                );
                return;
            }
        }
        match std::fs::remove_file(&self.path) {
            Ok(()) => eprintln!("zmem: removed swap file {}", self.path.display()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => eprintln!(
                "zmem: warning: could not remove {}: {e}; run: rm {}",
                self.path.display(),
                self.path.display()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fs_type_and_space_of_the_temporary_directory() {
        let d = std::env::temp_dir();
        let t = fs_type(&d).unwrap();
        assert!(!t.is_empty());
        assert!(fs_available(&d).unwrap() > 0);
        assert!(fs_type(Path::new("/nonexistent/zmem")).is_err());
    }

    #[test]
    fn a_swap_file_is_removed_even_when_swapon_is_refused_or_not_tried() {
        // As a user without CAP_SYS_ADMIN swapon fails: the file must still be gone after.
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 {
            eprintln!("skipped: as root this would really swap on (the cli tests do that)");
            return;
        }
        let d = tempfile::tempdir().unwrap();
        let r = SwapFile::create(d.path(), 1 << 20, 1);
        assert!(r.is_err());
        assert_eq!(std::fs::read_dir(d.path()).unwrap().count(), 0);
    }
}
